//! The patch types the API server accepts: strategic merge ([`strategic`]), JSON merge
//! (RFC 7386), JSON patch (RFC 6902) and server-side apply ([`apply`]).

pub mod apply;
pub mod strategic;

pub use strategic::{strategic_merge, supports_strategic};

use serde_json::Value;

/// Why a patch could not be applied, with the HTTP status the real server answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// 400 BadRequest: the patch document is malformed (not JSON of the right shape, an
    /// unknown `$patch` directive, a list element without its merge key).
    #[error("{0}")]
    BadRequest(String),
    /// 422 Invalid (UnprocessableEntity): the patch is well-formed but cannot be applied
    /// to this object (a failed JSON-patch `test`, a missing path, content outside
    /// `$retainKeys`).
    #[error("{0}")]
    Invalid(String),
    /// 415 UnsupportedMediaType: strategic merge patch on a kind without a Go struct
    /// schema (custom resources).
    #[error("{0}")]
    UnsupportedMediaType(String),
}

impl PatchError {
    /// The HTTP status code of the `Status` the server returns.
    pub fn status_code(&self) -> u16 {
        match self {
            PatchError::BadRequest(_) => 400,
            PatchError::Invalid(_) => 422,
            PatchError::UnsupportedMediaType(_) => 415,
        }
    }

    /// The `Status.reason` the server returns.
    pub fn reason(&self) -> &'static str {
        match self {
            PatchError::BadRequest(_) => "BadRequest",
            PatchError::Invalid(_) => "Invalid",
            PatchError::UnsupportedMediaType(_) => "UnsupportedMediaType",
        }
    }
}

/// Result alias for this module.
pub type Result<T, E = PatchError> = std::result::Result<T, E>;

/// Applies an RFC 7386 JSON merge patch (`application/merge-patch+json`): objects merge
/// recursively, `null` deletes, anything else (lists included) replaces.
pub fn json_merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies an RFC 6902 JSON patch (`application/json-patch+json`). A document that is not a
/// list of operations is 400; an operation that fails (a `test` that does not hold, a path
/// that does not exist) is 422 and leaves `target` unchanged. As in the apiserver's
/// json-patch library, a `test` for `null` holds when the path does not exist (kube's
/// finalizer helper relies on it to add the first finalizer).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<()> {
    let p: json_patch::Patch = serde_json::from_value(ops.clone())
        .map_err(|e| PatchError::BadRequest(format!("invalid JSON patch: {e}")))?;
    let mut doc = target.clone();
    for (i, op) in p.0.iter().enumerate() {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
        {
            match doc.pointer(t.path.as_str()) {
                None | Some(Value::Null) => continue,
                Some(_) => {
                    return Err(PatchError::Invalid(format!(
                        "operation '/{i}' failed at path '{}': value is not null",
                        t.path.as_str()
                    )));
                }
            }
        }
        json_patch::patch(&mut doc, std::slice::from_ref(op))
            .map_err(|e| PatchError::Invalid(format!("operation '/{i}': {e}")))?;
    }
    *target = doc;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2], "k": "x"});
        json_merge(
            &mut v,
            &json!({"a": {"b": null, "d": 3}, "l": [3], "n": {"x": null}}),
        );
        assert_eq!(
            v,
            json!({"a": {"c": 2, "d": 3}, "l": [3], "k": "x", "n": {}})
        );
        json_merge(&mut v, &json!("scalar"));
        assert_eq!(v, json!("scalar"));
    }

    #[test]
    fn json_patch_ops_and_errors() {
        let mut v = json!({"spec": {"replicas": 1}, "metadata": {"labels": {"a": "b"}}});
        let ops = json!([
            {"op": "test", "path": "/spec/replicas", "value": 1},
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "add", "path": "/metadata/labels/c", "value": "d"},
            {"op": "remove", "path": "/metadata/labels/a"}
        ]);
        assert_eq!(json_patch(&mut v, &ops), Ok(()));
        assert_eq!(
            v,
            json!({"spec": {"replicas": 3}, "metadata": {"labels": {"c": "d"}}})
        );

        let before = v.clone();
        let failing = json!([
            {"op": "replace", "path": "/spec/replicas", "value": 5},
            {"op": "test", "path": "/spec/replicas", "value": 1}
        ]);
        let err = json_patch(&mut v, &failing);
        assert!(matches!(err, Err(PatchError::Invalid(_))), "{err:?}");
        assert_eq!(v, before, "a failed patch leaves the object unchanged");
        // Testing for null holds on an absent path (kube's finalizer helper), not on a value.
        let add_first = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}
        ]);
        assert_eq!(json_patch(&mut v, &add_first), Ok(()));
        assert_eq!(v["metadata"]["finalizers"], json!(["f"]));
        let err = json_patch(&mut v, &add_first);
        assert!(matches!(err, Err(PatchError::Invalid(_))), "{err:?}");
        v["metadata"].as_object_mut().unwrap().remove("finalizers");
        let missing = json!([{"op": "remove", "path": "/nope"}]);
        assert_eq!(
            json_patch(&mut v, &missing).map_err(|e| e.status_code()),
            Err(422)
        );

        for bad in [
            json!({"op": "add"}),
            json!([{"op": "frobnicate", "path": "/a"}]),
        ] {
            let err = json_patch(&mut v, &bad);
            assert!(matches!(err, Err(PatchError::BadRequest(_))), "{err:?}");
            assert_eq!(err.map_err(|e| e.reason()), Err("BadRequest"));
        }
    }
}
