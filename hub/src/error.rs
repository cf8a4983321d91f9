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
}

/// Result with the hub [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
