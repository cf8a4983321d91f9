use kedge_protocol::RefusalCode;

/// Errors of the agent. Everything but configuration errors is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// TLS material or ops endpoint set-up failed.
    #[error(transparent)]
    Net(#[from] kedge_net::Error),
    /// The member has no usable identity and cannot get one on its own.
    #[error("{0}")]
    ReEnroll(String),
    /// Enrollment did not complete (hub unreachable or busy); retried.
    #[error("enrollment: {0}")]
    Enroll(String),
    /// The identity Secret could not be read or written.
    #[error("{0}")]
    IdentityStore(String),
    /// An essential task (the apply or report loop) ended while the agent was meant to run.
    #[error("{0}; the agent exits so that it is restarted")]
    TaskEnded(String),
    /// `--hub` lists no address.
    #[error("--hub lists no hub address")]
    NoHub,
    /// The member cluster's API could not be configured.
    #[error("cannot configure access to the member cluster: {0}")]
    Kube(String),
    /// The local UDP socket could not be bound.
    #[error("cannot open a UDP socket: {0}")]
    Endpoint(#[source] std::io::Error),
    /// The hub address did not resolve.
    #[error("cannot resolve hub address {hub}: {reason}")]
    Resolve {
        /// The configured address.
        hub: String,
        /// Why.
        reason: String,
    },
    /// The connection could not be started (bad server name, endpoint closed).
    #[error("cannot connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The QUIC connection failed or was closed.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// A stream could not be used.
    #[error("stream: {0}")]
    Stream(String),
    /// The hub sent bytes that are not a valid message.
    #[error("protocol: {0}")]
    Protocol(#[from] kedge_protocol::Error),
    /// The hub refused the session.
    #[error("hub refused the session ({code:?}): {message}")]
    Refused {
        /// Why, machine-readable.
        code: RefusalCode,
        /// Why, for people.
        message: String,
    },
    /// The hub did not answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The hub sent a message that does not belong at that point.
    #[error("unexpected message from hub: {0}")]
    Unexpected(&'static str),
}

/// Result with the agent [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
