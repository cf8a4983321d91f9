//! The agent's side of enrollment, shared with the end-to-end tests: one connection with
//! ALPN `kedge-enroll/1`, one request, one answer.

use std::net::SocketAddr;
use std::time::Duration;

use kedge_protocol::{EnrollRequest, EnrollResponse, FramedStream};
use quinn::{RecvStream, SendStream, VarInt};

/// Why an enrollment exchange failed before the hub answered.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The connection could not be started.
    #[error("cannot connect to the hub for enrollment: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The TLS handshake or the connection failed.
    #[error("enrollment connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// A frame could not be sent or read.
    #[error("enrollment exchange: {0}")]
    Protocol(#[from] kedge_protocol::Error),
    /// The hub closed the stream without answering.
    #[error("the hub closed the enrollment stream without answering")]
    NoAnswer,
    /// The hub did not answer in time.
    #[error("the hub did not answer the enrollment request within {0:?}")]
    Timeout(Duration),
}

type Stream = FramedStream<RecvStream, SendStream, EnrollResponse, EnrollRequest>;

/// Sends `request` to the hub at `addr` (verified as `server_name`) over `endpoint` with
/// `config` (from [`crate::tls::enroll_client_config`]) and returns its answer.
pub async fn enroll(
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    request: &EnrollRequest,
    limit: Duration,
) -> Result<EnrollResponse, EnrollError> {
    let exchange = async {
        let connection = endpoint.connect_with(config, addr, server_name)?.await?;
        let (send, recv) = connection.open_bi().await?;
        let mut stream = Stream::new(recv, send);
        stream.send(request).await?;
        let answer = stream.recv().await?;
        connection.close(VarInt::from_u32(0), b"enrollment done");
        answer.ok_or(EnrollError::NoAnswer)
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| EnrollError::Timeout(limit))?
}
