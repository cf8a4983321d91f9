/// Errors of the hub.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// TLS material, PKI or ops endpoint set-up failed.
    #[error(transparent)]
    Net(#[from] kedge_net::Error),
    /// The QUIC endpoint could not be bound.
    #[error("cannot listen on UDP {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No client for the hub cluster could be configured (kubeconfig or in-cluster).
    #[error("hub cluster configuration: {0}")]
    KubeConfig(String),
    /// A call to the hub cluster's API failed.
    #[error("hub cluster API: {0}")]
    Kube(#[from] kube::Error),
    /// A call to the hub cluster's API did not answer in time.
    #[error("hub cluster API: {what} timed out")]
    Timeout {
        /// The call.
        what: &'static str,
    },
    /// Adding or removing the finalizer, or the cleanup behind it, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object from the API server lacks a field the controller needs.
    #[error("{kind} without {field}")]
    MissingField {
        /// Kind of the object.
        kind: &'static str,
        /// The missing field, e.g. `metadata.namespace`.
        field: &'static str,
    },
    /// An object could not be serialized for a patch.
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        /// What was being serialized.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The `--ops-token-file` could not be read or holds no usable token.
    #[error("--ops-token-file {path}: {reason}")]
    OpsToken {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The hub CA Secret exists but cannot be used; it is never regenerated while present.
    #[error(
        "the hub CA Secret {namespace}/kedge-hub-ca is malformed: {reason}; fix or delete it (deleting it invalidates every member certificate)"
    )]
    CaSecret {
        /// Hub namespace.
        namespace: String,
        /// What is wrong.
        reason: String,
    },
    /// A bootstrap token could not be minted.
    #[error("cannot mint a bootstrap token: {0}")]
    Token(String),
    /// `--tls-cert`, `--tls-key` and `--tls-ca` must be given together or not at all.
    #[error(
        "--tls-cert, --tls-key and --tls-ca go together: give all three (certificates from files) or none (the hub CA from the Secret kedge-hub-ca)"
    )]
    TlsFlags,
    /// This hub held the lease and lost it; it stops so that it restarts as a standby.
    #[error("lost the hub lease: {0}")]
    LeaseLost(String),
    /// An essential task (a controller, the sweeper, leader election) ended while the hub
    /// was meant to run; it exits so that it is restarted instead of reconciling nothing.
    #[error("{0}; the hub exits so that it is restarted")]
    TaskEnded(String),
    /// An agent or hub install was asked for with input that would render invalid or useless
    /// objects; every problem is listed.
    #[error("invalid install: {}", .0.join("; "))]
    InvalidInstall(Vec<String>),
    /// The external scaler cannot be configured or bound.
    #[error("external scaler: {0}")]
    Scaler(String),
    /// The QUIC server's limits contradict each other.
    #[error("{0}")]
    Limits(String),
}

impl Error {
    /// A short stable label for the `error` label of failure metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Net(_) => "net",
            Error::Listen { .. } => "listen",
            Error::KubeConfig(_) => "kubeconfig",
            Error::Kube(_) => "kube_api",
            Error::Timeout { .. } => "timeout",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.metric_label(),
                _ => "finalizer",
            },
            Error::MissingField { .. } => "missing_field",
            Error::Serialize { .. } => "serialize",
            Error::OpsToken { .. } => "ops_token",
            Error::CaSecret { .. } => "ca_secret",
            Error::TlsFlags => "tls_flags",
            Error::Token(_) => "token",
            Error::LeaseLost(_) => "lease_lost",
            Error::TaskEnded(_) => "task_ended",
            Error::InvalidInstall(_) => "invalid_install",
            Error::Scaler(_) => "scaler",
            Error::Limits(_) => "limits",
        }
    }
}

/// Result with the hub [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
