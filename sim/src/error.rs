//! The crate's one error type. API errors carry what a `metav1.Status` needs.

use serde_json::{Value, json};

/// Everything that can go wrong in kedge-sim.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 404: the object or resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409 AlreadyExists: create of a name that is taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// 409 Conflict: stale resourceVersion or server-side apply conflict.
    #[error("{0}")]
    Conflict(String),
    /// 400: malformed request (bad JSON, bad query parameter, bad selector).
    #[error("{0}")]
    BadRequest(String),
    /// 422: the object is syntactically fine but semantically invalid.
    #[error("{0}")]
    Invalid(String),
    /// 422 Invalid with one cause per field, as `errors.NewInvalid` builds it (schema
    /// validation of a custom resource, a refused patch under strict field validation).
    #[error("{}", .0.message)]
    InvalidFields(Box<InvalidFields>),
    /// 401: the bearer token is unknown.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: refused (terminating namespace, RBAC).
    #[error("{0}")]
    Forbidden(String),
    /// 405: the verb is not allowed on this resource.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 415: unsupported patch or body content type.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 413: a write whose body is larger than kube-apiserver decodes (3 MiB).
    #[error("{0}")]
    RequestEntityTooLarge(String),
    /// 410: the requested resourceVersion is older than the retained history.
    #[error("{0}")]
    Gone(String),
    /// 500: injected failure or internal inconsistency.
    #[error("{0}")]
    Internal(String),
    /// 503: injected unavailability.
    #[error("{0}")]
    Unavailable(String),
    /// 409 Conflict from server-side apply, with one cause per conflicting field.
    #[error("{0}")]
    ApplyConflict(crate::patch::apply::ApplyConflict),
    /// Starting a cluster or writing its kubeconfig failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Building a kube client failed.
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    /// A process of the local fleet (`kedge-sim up`) could not be started or did not
    /// become ready.
    #[error("fleet: {0}")]
    Fleet(String),
}

/// What an `Invalid` Status with causes carries.
#[derive(Debug)]
pub struct InvalidFields {
    /// `Kind.group "name" is invalid: …`.
    pub message: String,
    /// `details.group`.
    pub group: String,
    /// `details.kind`.
    pub kind: String,
    /// `details.name`.
    pub name: String,
    /// One per field error.
    pub causes: Vec<crate::schema::FieldError>,
}

impl Error {
    /// 422 Invalid for the field errors of an object of `group`/`kind` named `name`, worded
    /// as `errors.NewInvalid` words it.
    pub fn invalid_fields(
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<crate::schema::FieldError>,
    ) -> Error {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        Error::InvalidFields(Box::new(InvalidFields {
            message: crate::schema::invalid_message(&qualified, name, &causes),
            group: group.into(),
            kind: kind.into(),
            name: name.into(),
            causes,
        }))
    }
}

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// HTTP status code of this error.
    pub fn code(&self) -> u16 {
        match self {
            Error::NotFound(_) => 404,
            Error::AlreadyExists(_) | Error::Conflict(_) | Error::ApplyConflict(_) => 409,
            Error::BadRequest(_) => 400,
            Error::Invalid(_) | Error::InvalidFields(_) => 422,
            Error::Unauthorized(_) => 401,
            Error::Forbidden(_) => 403,
            Error::MethodNotAllowed(_) => 405,
            Error::UnsupportedMediaType(_) => 415,
            Error::RequestEntityTooLarge(_) => 413,
            Error::Gone(_) => 410,
            Error::Unavailable(_) => 503,
            Error::Internal(_) | Error::Io(_) | Error::Kube(_) | Error::Fleet(_) => 500,
        }
    }

    /// The `reason` field of the `Status` object.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotFound(_) => "NotFound",
            Error::AlreadyExists(_) => "AlreadyExists",
            Error::Conflict(_) | Error::ApplyConflict(_) => "Conflict",
            Error::BadRequest(_) => "BadRequest",
            Error::Invalid(_) | Error::InvalidFields(_) => "Invalid",
            Error::Unauthorized(_) => "Unauthorized",
            Error::Forbidden(_) => "Forbidden",
            Error::MethodNotAllowed(_) => "MethodNotAllowed",
            Error::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Error::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            Error::Gone(_) => "Expired",
            Error::Unavailable(_) => "ServiceUnavailable",
            Error::Internal(_) | Error::Io(_) | Error::Kube(_) | Error::Fleet(_) => "InternalError",
        }
    }

    /// A `metav1.Status` object describing this error.
    pub fn status(&self) -> Value {
        if let Error::ApplyConflict(c) = self {
            let causes: Vec<Value> = c
                .causes
                .iter()
                .map(|k| json!({"reason": "FieldManagerConflict", "message": k.message, "field": k.field}))
                .collect();
            return json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": c.message, "reason": "Conflict", "code": 409,
                "details": {"causes": causes},
            });
        }
        if let Error::InvalidFields(f) = self {
            let causes: Vec<Value> = f
                .causes
                .iter()
                .map(|e| json!({"reason": e.cause.reason(), "message": e.body(), "field": e.field}))
                .collect();
            let mut details = json!({"name": f.name, "kind": f.kind, "causes": causes});
            if !f.group.is_empty() {
                details["group"] = json!(f.group);
            }
            return json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": f.message, "reason": "Invalid", "code": 422, "details": details,
            });
        }
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        })
    }

    /// 404 for an object, worded like the real API server.
    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Error {
        Error::NotFound(format!("{} \"{name}\" not found", qualified(group, plural)))
    }

    /// 409 for a name that is taken.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Error {
        Error::AlreadyExists(format!(
            "{} \"{name}\" already exists",
            qualified(group, plural)
        ))
    }

    /// 409 for a stale resourceVersion.
    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> Error {
        Error::Conflict(format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(group, plural)
        ))
    }
}

impl From<crate::selector::SelectorError> for Error {
    fn from(e: crate::selector::SelectorError) -> Self {
        Error::BadRequest(e.to_string())
    }
}

impl From<crate::patch::PatchError> for Error {
    fn from(e: crate::patch::PatchError) -> Self {
        use crate::patch::PatchError as P;
        match e {
            P::BadRequest(m) => Error::BadRequest(m),
            P::Invalid(m) => Error::Invalid(m),
            P::UnsupportedMediaType(m) => Error::UnsupportedMediaType(m),
        }
    }
}

impl From<crate::patch::apply::ApplyError> for Error {
    fn from(e: crate::patch::apply::ApplyError) -> Self {
        use crate::patch::apply::ApplyError as A;
        match e {
            A::Conflict(c) => Error::ApplyConflict(c),
            A::BadRequest(m) => Error::BadRequest(m),
        }
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}
