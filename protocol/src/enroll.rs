//! Enrollment and certificate renewal: the agent proves a one-time bootstrap token and sends
//! a PKCS#10 certificate signing request; the hub answers with a client certificate or a
//! refusal. Enrollment runs on its own connection (ALPN [`crate::ENROLL_ALPN`], no client
//! certificate); renewal reuses the same answer on the live session's control stream.

use serde::{Deserialize, Serialize};

/// The one message an agent sends on an enrollment connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollRequest {
    /// Protocol version the agent speaks.
    pub protocol_version: u16,
    /// The bootstrap token, `<member>.<secret>`.
    pub token: String,
    /// DER-encoded PKCS#10 request whose Common Name is the member name.
    pub csr_der: Vec<u8>,
}

/// Asks for a fresh certificate over a live mTLS session (control stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    /// DER-encoded PKCS#10 request for a new key pair; Common Name = the session's member.
    pub csr_der: Vec<u8>,
}

/// The hub's answer to an [`EnrollRequest`] or a [`RenewRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnrollResponse {
    /// The certificate was issued.
    Issued(IssuedCertificate),
    /// The request was refused; nothing was issued.
    Refused(EnrollRefusal),
}

/// A client certificate issued by the hub CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedCertificate {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The hub CA certificate, PEM (what the agent verifies the hub against).
    pub ca_pem: String,
    /// End of validity, Unix milliseconds.
    pub not_after_unix_ms: i64,
}

/// Why an enrollment or renewal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnrollRefusalCode {
    /// The token is not of the form `<member>.<secret>`.
    MalformedToken,
    /// No token exists for that member: never created, or already used.
    TokenNotFound,
    /// A token exists for that member but this is not it.
    WrongToken,
    /// The token expired.
    TokenExpired,
    /// The token was consumed by a concurrent enrollment.
    TokenAlreadyUsed,
    /// No `MemberCluster` of that name exists on the hub.
    UnknownMember,
    /// The CSR is not a valid, self-signed PKCS#10 request.
    BadCsr,
    /// The CSR names another member than the token or the session.
    NameMismatch,
    /// The bootstrap token (enrollment) or the session's certificate (renewal) belongs to an
    /// earlier enrollment (the `MemberCluster` was deleted and created again) or to none.
    Superseded,
    /// The agent speaks a protocol version the hub does not support.
    UnsupportedVersion,
    /// The hub cannot serve the request now (its API, its CA); retry later.
    Unavailable,
}

impl EnrollRefusalCode {
    /// A short stable label, for metrics and audit logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MalformedToken => "malformed_token",
            Self::TokenNotFound => "token_not_found",
            Self::WrongToken => "wrong_token",
            Self::TokenExpired => "token_expired",
            Self::TokenAlreadyUsed => "token_already_used",
            Self::UnknownMember => "unknown_member",
            Self::BadCsr => "bad_csr",
            Self::NameMismatch => "name_mismatch",
            Self::Superseded => "superseded",
            Self::UnsupportedVersion => "unsupported_version",
            Self::Unavailable => "unavailable",
        }
    }

    /// Whether retrying the same request later may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Unavailable)
    }
}

/// A refusal with a reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollRefusal {
    /// Machine-readable reason.
    pub code: EnrollRefusalCode,
    /// Human-readable explanation, including what to do about it.
    pub message: String,
}
