//! The agent's side of enrollment, shared with the end-to-end tests: one connection with
//! ALPN `kedge-enroll/1`, one request, one answer; and the bootstrap token's form, which hub
//! and agent both read.

use std::net::SocketAddr;
use std::time::Duration;

use kedge_protocol::{EnrollRequest, EnrollResponse, FramedStream};
use quinn::{RecvStream, SendStream, VarInt};

/// Longest secret part of a bootstrap token. Minted secrets are 43 characters (32 bytes in
/// base64url); the bound keeps what a peer can make the hub hash and log small.
pub const MAX_TOKEN_SECRET: usize = 128;

/// A bootstrap token `<member>.<secret>`: the member a non-empty secret of at most
/// [`MAX_TOKEN_SECRET`] bytes is for. The hub mints it, stores only its [`token_hash`] and
/// reads it back from an enrollment request; the agent reads it from its token file. Its
/// `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    text: String,
    member_len: usize,
}

/// Why a text is not a bootstrap token. The messages never repeat the text: it holds a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `.` between member and secret.
    #[error("the bootstrap token is not of the form <member>.<secret>")]
    NoSeparator,
    /// The part before the first `.` is not a member name.
    #[error(
        "the member part of the bootstrap token is not a member name (a lowercase RFC 1123 label)"
    )]
    BadMember,
    /// Nothing after the `.`.
    #[error("the bootstrap token has an empty secret")]
    EmptySecret,
    /// The secret is longer than [`MAX_TOKEN_SECRET`].
    #[error("the secret of the bootstrap token is {0} bytes long, more than {MAX_TOKEN_SECRET}")]
    SecretTooLong(usize),
}

impl BootstrapToken {
    /// Reads `text` (exactly: surrounding whitespace is the caller's to trim) as
    /// `<member>.<secret>`.
    pub fn parse(text: &str) -> Result<Self, TokenError> {
        let (member, secret) = text.split_once('.').ok_or(TokenError::NoSeparator)?;
        Self::check(member, secret)?;
        Ok(Self {
            text: text.to_owned(),
            member_len: member.len(),
        })
    }

    /// The token of `member` with `secret` (which must not be empty or too long).
    pub fn new(member: &str, secret: &str) -> Result<Self, TokenError> {
        Self::check(member, secret)?;
        Ok(Self {
            text: format!("{member}.{secret}"),
            member_len: member.len(),
        })
    }

    fn check(member: &str, secret: &str) -> Result<(), TokenError> {
        if !crate::identity::is_valid_member_name(member) {
            return Err(TokenError::BadMember);
        }
        match secret.len() {
            0 => Err(TokenError::EmptySecret),
            len if len > MAX_TOKEN_SECRET => Err(TokenError::SecretTooLong(len)),
            _ => Ok(()),
        }
    }

    /// The member the token is for.
    pub fn member(&self) -> &str {
        &self.text[..self.member_len]
    }

    /// The whole token, as handed to the agent and sent in an enrollment request.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// What the hub stores of the token: [`token_hash`] of the whole of it.
    pub fn hash(&self) -> String {
        token_hash(&self.text)
    }
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("member", &self.member())
            .finish_non_exhaustive()
    }
}

/// Lowercase hex SHA-256 of `token`: what the hub stores of a bootstrap token, and what the
/// agent records of the token its identity was enrolled with. It takes any text, so that a
/// token file that holds no well-formed token still has a hash to compare.
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
        let token = BootstrapToken::parse("edge-1.abc").unwrap();
        assert_eq!((token.member(), token.as_str()), ("edge-1", "edge-1.abc"));
        assert_eq!(token.hash(), token_hash("edge-1.abc"));
        // The secret may hold dots: only the first one separates.
        assert_eq!(BootstrapToken::parse("a.b.c").unwrap().member(), "a");
        assert_eq!(BootstrapToken::new("edge-1", "abc").unwrap(), token);
        let longest = format!("edge-1.{}", "a".repeat(MAX_TOKEN_SECRET));
        assert!(BootstrapToken::parse(&longest).is_ok());
    }

    #[test]
    fn malformed_and_hostile_tokens_are_clear_errors() {
        use TokenError::*;
        let long_secret = format!("edge-1.{}", "a".repeat(MAX_TOKEN_SECRET + 1));
        let long_member = format!("{}.abc", "a".repeat(64));
        let huge = "x".repeat(1 << 20);
        for (bad, expected) in [
            ("", NoSeparator),
            ("edge-1", NoSeparator),
            (huge.as_str(), NoSeparator),
            ("edge-1.", EmptySecret),
            (".abc", BadMember),
            ("Edge.abc", BadMember),
            ("a_b.x", BadMember),
            ("-a.x", BadMember),
            (" edge-1.abc", BadMember),
            ("édge.abc", BadMember),
            (long_member.as_str(), BadMember),
            (long_secret.as_str(), SecretTooLong(MAX_TOKEN_SECRET + 1)),
        ] {
            let error = BootstrapToken::parse(bad).unwrap_err();
            assert_eq!(error, expected, "{bad:?}");
            // The message never repeats the token.
            assert!(bad.len() < 4 || !error.to_string().contains(bad), "{error}");
        }
        assert_eq!(BootstrapToken::new("edge-1", ""), Err(EmptySecret));
        assert_eq!(BootstrapToken::new("Edge", "abc"), Err(BadMember));
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let token = BootstrapToken::parse("edge-1.s3cret").unwrap();
        let shown = format!("{token:?}");
        assert!(
            shown.contains("edge-1") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn the_hash_is_sha256_of_the_whole_token() {
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
