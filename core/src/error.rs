//! The one error type of `kedge-core`.

/// Everything that can go wrong in `kedge-core`. Every message names the offending field
/// with its path (`spec.memberClusters[2].weight`, `steps[1].metrics`) so that a user can fix
/// it without reading code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A field of a resource spec or annotation has a value kedge refuses.
    #[error("{field}: {message}")]
    Invalid {
        /// Path of the field, e.g. `spec.memberClusters[2].weight`.
        field: String,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// Several fields are invalid at once; validation reports them all together.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Many(Vec<Error>),
    /// A simulation scenario could not be parsed as YAML/JSON.
    #[error("scenario: {0}")]
    ScenarioSyntax(String),
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Folds a list of errors into one: `Ok` when empty, the error itself when single.
    pub fn collect(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
