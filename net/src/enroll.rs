//! The agent's side of enrollment, shared with the end-to-end tests: one connection with
//! ALPN `kedge-enroll/1`, one request, one answer; and the bootstrap token's form, which hub
//! and agent both read.

use std::net::SocketAddr;
use std::time::Duration;

use kedge_protocol::{EnrollRequest, EnrollResponse, FramedStream};
use quinn::{RecvStream, SendStream, VarInt};

/// The member a bootstrap token `<member>.<secret>` is for; `None` when it is not of that form
/// (the secret non-empty and at most 128 characters).
pub fn token_member(token: &str) -> Option<&str> {
    let (member, secret) = token.split_once('.')?;
    (crate::identity::is_valid_member_name(member) && !secret.is_empty() && secret.len() <= 128)
        .then_some(member)
}

/// Lowercase hex SHA-256 of `token`: what the hub stores of a bootstrap token, and what the
/// agent records of the token its identity was enrolled with.
pub fn token_hash(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_member() {
        assert_eq!(token_member("edge-1.abc"), Some("edge-1"));
        let long = format!("edge-1.{}", "a".repeat(129));
        for bad in [
            "",
            "edge-1",
            "edge-1.",
            ".abc",
            "Edge.abc",
            "a_b.x",
            long.as_str(),
        ] {
            assert_eq!(token_member(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_hash_is_sha256_of_the_whole_token() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
