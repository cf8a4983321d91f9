//! The agent's own identity when it enrolls (no `--tls-cert`): a key pair it generates
//! itself, a short-lived client certificate from the hub, both kept in a Secret of its own
//! namespace so that a restart reuses them, renewed over the live session.
//!
//! The Secret also records the hash of the bootstrap token the identity was enrolled with.
//! A token file holding another token means the member was set up again (`kubectl kedge mc
//! setup-member` mints a token per `MemberCluster`): the agent enrolls with it instead of
//! presenting an identity the hub no longer admits. Only the hub decides whether a token is
//! good; the agent merely never sits on an unused one while the hub refuses it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kedge_net::enroll::BootstrapToken;
use kedge_net::identity::PeerIdentity;
use kedge_net::pki::{Validity, cert_validity, member_csr};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kedge_protocol::{
    EnrollRefusal, EnrollRequest, EnrollResponse, IssuedCertificate, RefusalCode,
};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;
use tracing::{info, warn};

use crate::{Error, Result};

/// Data key of the certificate in the identity Secret.
pub(crate) const CERT_KEY: &str = "tls.crt";
/// Data key of the private key in the identity Secret.
pub(crate) const KEY_KEY: &str = "tls.key";
/// Data key of the hub CA bundle in the identity Secret.
pub(crate) const CA_KEY: &str = "ca.crt";
/// Data key of the hash (lowercase hex SHA-256) of the bootstrap token the identity was
/// enrolled with; kept through renewals.
pub(crate) const TOKEN_HASH_KEY: &str = "bootstrap-token-sha256";
/// Label naming the member on the identity Secret.
pub(crate) const MEMBER_LABEL: &str = "kedge.dev/member";

/// A certificate and its key, as issued to this member.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) member: String,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) validity: Validity,
    /// Hash of the bootstrap token this identity descends from; `None` when stored by an
    /// agent that did not record it.
    pub(crate) enrolled_with: Option<String>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("member", &self.member)
            .field("not_after", &self.validity.not_after)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads the member name and validity of `cert_pem`.
    pub(crate) fn new(cert_pem: String, key_pem: String) -> Result<Self> {
        let member = PeerIdentity::from_pem(&cert_pem)?.member;
        let validity = cert_validity(&cert_pem)?;
        Ok(Self {
            member,
            cert_pem,
            key_pem,
            validity,
            enrolled_with: None,
        })
    }

    /// The identity of `issued` with `key_pem`, descending from the token hashed `enrolled_with`.
    fn from_issued(
        issued: IssuedCertificate,
        key_pem: String,
        enrolled_with: Option<String>,
    ) -> Result<Self> {
        Ok(Self {
            enrolled_with,
            ..Self::new(issued.cert_pem, key_pem)?
        })
    }
}

/// The bootstrap token file, next to the stored identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token {
    /// No token file, or none readable.
    Absent,
    /// The token the stored identity was enrolled with: spent.
    Spent,
    /// A token the stored identity was not enrolled with (the member was set up again), or a
    /// token and no stored identity.
    New,
    /// A token next to an identity that does not record its own (stored by an older agent).
    Unknown,
}

/// What the token hashed `token` is to a stored identity enrolled with `stored` (`None`: no
/// stored identity; `Some(None)`: one that does not record its token).
pub(crate) fn token_state(token: Option<&str>, stored: Option<Option<&str>>) -> Token {
    match (token, stored) {
        (None, _) => Token::Absent,
        (Some(_), None) => Token::New,
        (Some(_), Some(None)) => Token::Unknown,
        (Some(token), Some(Some(enrolled_with))) if token == enrolled_with => Token::Spent,
        (Some(_), Some(Some(_))) => Token::New,
    }
}

/// What to do at startup with what the identity Secret holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Connect with the stored certificate (renewed over the session when due).
    UseStored,
    /// Enroll with the bootstrap token (the stored certificate, if any, is the fallback).
    Enroll,
    /// Nothing usable and no token: the member must be enrolled again.
    ReEnroll,
}

/// How close to its expiry a stored certificate is still worth using: a tenth of its
/// lifetime, at most 30 s.
pub(crate) fn margin(validity: Validity) -> time::Duration {
    let lifetime: time::Duration = validity.not_after - validity.not_before;
    (lifetime / 10_i32).min(time::Duration::seconds(30))
}

/// The startup decision at `now`. A new token wins: the member was set up again, and the
/// stored certificate is of an enrollment the hub no longer admits. Otherwise a stored
/// certificate still valid beyond the margin wins (a token file stays mounted long after it
/// was spent); one inside the margin is still used when the token is known to be spent.
pub(crate) fn start(stored: Option<Validity>, token: Token, now: OffsetDateTime) -> Start {
    match (stored, token) {
        (_, Token::New) => Start::Enroll,
        (Some(v), _) if v.not_after - now > margin(v) => Start::UseStored,
        (_, Token::Unknown) => Start::Enroll,
        (Some(v), _) if v.not_after > now => Start::UseStored,
        _ => Start::ReEnroll,
    }
}

/// Whether to enroll with the token file after the hub refused the session with `code`: only
/// when the hub revoked the identity (its member deleted, or set up again) and the token is
/// one the identity was not enrolled with and the hub has not refused before. A revoked
/// member that holds only its spent token stays out: the hub refuses spent tokens.
pub(crate) fn enroll_after_refusal(code: RefusalCode, token: Token, refused_before: bool) -> bool {
    code == RefusalCode::Revoked && matches!(token, Token::New | Token::Unknown) && !refused_before
}

/// How long to wait before asking again after a failed renewal at `now`: a quarter of the
/// time left, between 1 s and 30 s.
pub(crate) fn renewal_retry(validity: Validity, now: OffsetDateTime) -> Duration {
    let left = Duration::try_from(validity.not_after - now).unwrap_or(Duration::ZERO);
    (left / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// The error when the member cannot get a usable identity on its own.
pub(crate) fn re_enroll(member: &str, why: &str) -> Error {
    let name = if member.is_empty() { "NAME" } else { member };
    Error::ReEnroll(format!(
        "{why}; the member must be re-enrolled: run `kubectl kedge mc delete-member {name}` (if it \
         still exists) and `kubectl kedge mc setup-member {name}` on the hub and apply its install \
         to this cluster; the agent enrolls with the new token and replaces its identity Secret \
         by itself"
    ))
}

/// Reads the bootstrap token of the token file's text.
pub(crate) fn parse_token(token: &str) -> Result<BootstrapToken> {
    BootstrapToken::parse(token)
        .map_err(|error| Error::ReEnroll(format!("the bootstrap token file: {error}")))
}

/// Reads a bootstrap token file (surrounding whitespace ignored).
pub(crate) fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::ReEnroll(format!(
            "cannot read the bootstrap token file {}: {e}",
            path.display()
        ))
    })?;
    Ok(text.trim().to_owned())
}

/// The identity Secret in the agent's namespace.
#[derive(Clone)]
pub(crate) struct IdentityStore {
    secrets: Api<Secret>,
    name: String,
    namespace: String,
}

impl std::fmt::Debug for IdentityStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdentityStore({}/{})", self.namespace, self.name)
    }
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

impl IdentityStore {
    pub(crate) fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    /// The stored identity; a Secret without a readable certificate and key counts as none.
    pub(crate) async fn load(&self) -> Result<Option<Identity>> {
        let secret = self
            .secrets
            .get_opt(&self.name)
            .await
            .map_err(|e| self.failed("read", e))?;
        let Some(secret) = secret else {
            return Ok(None);
        };
        let (Some(cert), Some(key)) = (text(&secret, CERT_KEY), text(&secret, KEY_KEY)) else {
            warn!(secret = %self.name, "the identity Secret holds no certificate and key; ignoring it");
            return Ok(None);
        };
        match Identity::new(cert, key) {
            Ok(identity) => Ok(Some(Identity {
                enrolled_with: text(&secret, TOKEN_HASH_KEY),
                ..identity
            })),
            Err(error) => {
                warn!(secret = %self.name, %error, "the identity Secret holds no usable certificate; ignoring it");
                Ok(None)
            }
        }
    }

    /// Stores `identity` (and the hub CA), creating or replacing the Secret.
    pub(crate) async fn save(&self, identity: &Identity, ca_pem: &str) -> Result<()> {
        let mut data = BTreeMap::from([
            (
                CERT_KEY.to_owned(),
                ByteString(identity.cert_pem.clone().into_bytes()),
            ),
            (
                KEY_KEY.to_owned(),
                ByteString(identity.key_pem.clone().into_bytes()),
            ),
            (CA_KEY.to_owned(), ByteString(ca_pem.as_bytes().to_vec())),
        ]);
        if let Some(hash) = &identity.enrolled_with {
            data.insert(
                TOKEN_HASH_KEY.to_owned(),
                ByteString(hash.clone().into_bytes()),
            );
        }
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MEMBER_LABEL.to_owned(),
                    identity.member.clone(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(data),
            ..Secret::default()
        };
        let existing = self
            .secrets
            .get_opt(&self.name)
            .await
            .map_err(|e| self.failed("read", e))?;
        match existing {
            Some(current) => {
                secret.metadata.resource_version = current.metadata.resource_version;
                self.secrets
                    .replace(&self.name, &PostParams::default(), &secret)
                    .await
                    .map_err(|e| self.failed("update", e))?;
            }
            None => {
                self.secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|e| self.failed("create", e))?;
            }
        }
        Ok(())
    }

    fn failed(&self, verb: &str, error: kube::Error) -> Error {
        Error::IdentityStore(format!(
            "cannot {verb} the identity Secret {}/{}: {error}",
            self.namespace, self.name
        ))
    }
}

/// The identity the agent connects with, replaced when renewed.
#[derive(Debug)]
pub(crate) struct ManagedIdentity {
    current: Mutex<Identity>,
    ca_pem: String,
    store: IdentityStore,
    /// The client configuration of the current certificate (keyed by its PEM), kept across
    /// dials: its TLS session store lets a reconnect resume the last session instead of a
    /// full handshake. A new certificate gets a new configuration, so a session resumed
    /// never presents a certificate the agent no longer holds.
    config: Mutex<Option<(String, quinn::ClientConfig)>>,
}

impl ManagedIdentity {
    pub(crate) fn new(identity: Identity, ca_pem: String, store: IdentityStore) -> Arc<Self> {
        Arc::new(Self {
            current: Mutex::new(identity),
            ca_pem,
            store,
            config: Mutex::new(None),
        })
    }

    // The identity is replaced whole under the lock; a panic elsewhere cannot leave it half
    // written, so a poisoned lock is safe to use.
    fn lock(&self) -> MutexGuard<'_, Identity> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The identity to connect with now.
    pub(crate) fn current(&self) -> Identity {
        self.lock().clone()
    }

    /// A client configuration presenting the current certificate: the same one (and TLS
    /// session store) for as long as the certificate stays.
    pub(crate) fn client_config(&self) -> Result<quinn::ClientConfig> {
        let identity = self.current();
        let mut cached = self.config.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cert, config)) = cached.as_ref()
            && *cert == identity.cert_pem
        {
            return Ok(config.clone());
        }
        let material = TlsMaterial::from_pem(&identity.cert_pem, &identity.key_pem, &self.ca_pem)?;
        let config = tls::client_config(material, TransportTuning::agent(), kedge_protocol::ALPN)?;
        *cached = Some((identity.cert_pem, config.clone()));
        Ok(config)
    }

    /// A new key pair and its CSR for renewal: (key PEM, CSR DER).
    pub(crate) fn renewal_csr(&self) -> Result<(String, Vec<u8>)> {
        Ok(member_csr(&self.current().member)?)
    }

    /// Installs a renewed certificate: stored first, then used for the next connection.
    pub(crate) async fn renewed(
        &self,
        issued: IssuedCertificate,
        key_pem: String,
    ) -> Result<Identity> {
        let current = self.current();
        let identity = Identity::from_issued(issued, key_pem, current.enrolled_with)?;
        if identity.member != current.member {
            return Err(Error::IdentityStore(format!(
                "the hub issued a certificate for {:?}, not {:?}",
                identity.member, current.member
            )));
        }
        self.store.save(&identity, &self.ca_pem).await?;
        *self.lock() = identity.clone();
        Ok(identity)
    }

    /// What the token hashed `token` is to the current identity.
    pub(crate) fn token_state(&self, token: &str) -> Token {
        token_state(Some(token), Some(self.lock().enrolled_with.as_deref()))
    }

    /// Enrolls again with `token` at the hub at `addr` (see [`enroll_once`]); a new identity
    /// replaces the current one for the next connection.
    pub(crate) async fn enroll_again(
        &self,
        token: &str,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<Enrolled> {
        let enrolled = enroll_once(token, addr, server_name, &self.ca_pem, &self.store).await?;
        if let Enrolled::Done(identity) = &enrolled {
            *self.lock() = identity.clone();
        }
        Ok(enrolled)
    }
}

/// How one enrollment attempt ended.
#[derive(Debug)]
pub(crate) enum Enrolled {
    /// A certificate was issued and stored.
    Done(Identity),
    /// The hub refused for good (token spent, expired, wrong, unknown member...).
    Refused(EnrollRefusal),
}

/// Enrolls once with the hub at `addr`: new key pair, CSR, token; stores what is issued.
pub(crate) async fn enroll_once(
    token: &str,
    addr: SocketAddr,
    server_name: &str,
    ca_pem: &str,
    store: &IdentityStore,
) -> Result<Enrolled> {
    let token = parse_token(token)?;
    let (key_pem, csr_der) = member_csr(token.member())?;
    let trusted = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::IdentityStore(format!("the hub CA bundle is not PEM: {e}")))?;
    let config = tls::enroll_client_config(&trusted, TransportTuning::default())?;
    let bind: SocketAddr = if addr.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let endpoint = quinn::Endpoint::client(bind).map_err(Error::Endpoint)?;
    let request = EnrollRequest {
        protocol_version: kedge_protocol::PROTOCOL_VERSION,
        token: token.as_str().to_owned(),
        csr_der,
    };
    let answer = kedge_net::enroll::enroll(
        &endpoint,
        config,
        addr,
        server_name,
        &request,
        Duration::from_secs(15),
    )
    .await;
    endpoint.close(quinn::VarInt::from_u32(0), b"enrollment done");
    match answer.map_err(|e| Error::Enroll(e.to_string()))? {
        EnrollResponse::Issued(issued) => {
            let identity = Identity::from_issued(issued, key_pem, Some(token.hash()))?;
            store.save(&identity, ca_pem).await?;
            info!(member = %identity.member, not_after = %identity.validity.not_after,
                "enrolled: certificate issued and stored");
            Ok(Enrolled::Done(identity))
        }
        EnrollResponse::Refused(refusal) if refusal.code.is_retryable() => {
            Err(Error::Enroll(refusal.message))
        }
        EnrollResponse::Refused(refusal) => Ok(Enrolled::Refused(refusal)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(unix).unwrap()
    }

    fn valid(from: i64, to: i64) -> Option<Validity> {
        Some(Validity {
            not_before: at(from),
            not_after: at(to),
        })
    }

    #[test]
    fn a_token_is_new_unless_the_stored_identity_was_enrolled_with_it() {
        use Token::*;
        assert_eq!(token_state(None, None), Absent);
        assert_eq!(token_state(None, Some(Some("h1"))), Absent);
        assert_eq!(token_state(Some("h1"), None), New);
        assert_eq!(token_state(Some("h1"), Some(Some("h1"))), Spent);
        assert_eq!(token_state(Some("h2"), Some(Some("h1"))), New);
        assert_eq!(token_state(Some("h1"), Some(None)), Unknown);
    }

    #[test]
    fn a_stored_certificate_beats_a_spent_token_and_a_new_token_beats_it() {
        use Start::*;
        // 1000 s lifetime: margin 30 s (a tenth would be 100 s).
        for token in [Token::Spent, Token::Unknown, Token::Absent] {
            assert_eq!(
                start(valid(0, 1000), token, at(900)),
                UseStored,
                "{token:?}"
            );
        }
        // The member was set up again: enroll, even with a stored certificate far from expiry.
        assert_eq!(start(valid(0, 1000), Token::New, at(0)), Enroll);
        assert_eq!(start(None, Token::New, at(0)), Enroll);
        // Nearly expired: a token that may still work is tried; a spent one is not.
        assert_eq!(start(valid(0, 1000), Token::Unknown, at(980)), Enroll);
        assert_eq!(start(valid(0, 1000), Token::Spent, at(980)), UseStored);
        assert_eq!(start(valid(0, 1000), Token::Absent, at(980)), UseStored);
        // Expired, or nothing stored, and no token that may work.
        assert_eq!(start(valid(0, 1000), Token::Spent, at(1000)), ReEnroll);
        assert_eq!(start(valid(0, 1000), Token::Absent, at(1000)), ReEnroll);
        assert_eq!(start(valid(0, 1000), Token::Unknown, at(1000)), Enroll);
        assert_eq!(start(None, Token::Absent, at(0)), ReEnroll);
        // 20 s lifetime: margin 2 s.
        assert_eq!(start(valid(0, 20), Token::Unknown, at(17)), UseStored);
        assert_eq!(start(valid(0, 20), Token::Unknown, at(19)), Enroll);
    }

    #[test]
    fn only_a_revoked_identity_with_an_unspent_unrefused_token_enrolls_again() {
        use RefusalCode::*;
        for token in [Token::New, Token::Unknown] {
            assert!(enroll_after_refusal(Revoked, token, false), "{token:?}");
            // The hub refused that token once: never again with it.
            assert!(!enroll_after_refusal(Revoked, token, true), "{token:?}");
        }
        // A revoked member with only its spent token, or none, stays out.
        for token in [Token::Spent, Token::Absent] {
            assert!(!enroll_after_refusal(Revoked, token, false), "{token:?}");
        }
        // Other refusals say nothing about the identity.
        for code in [Unavailable, UnsupportedVersion, UnexpectedMessage] {
            assert!(!enroll_after_refusal(code, Token::New, false), "{code:?}");
        }
    }

    #[test]
    fn a_refused_renewal_is_retried_within_the_time_left() {
        let v = valid(0, 1000).unwrap();
        assert_eq!(renewal_retry(v, at(700)), Duration::from_secs(30));
        assert_eq!(renewal_retry(v, at(980)), Duration::from_secs(5));
        assert_eq!(renewal_retry(v, at(999)), Duration::from_secs(1));
        assert_eq!(renewal_retry(v, at(2000)), Duration::from_secs(1));
    }

    #[test]
    fn tokens_name_their_member() {
        assert_eq!(parse_token("edge-1.abc").unwrap().member(), "edge-1");
        for bad in ["", "edge-1", "Edge.abc", ".abc"] {
            let error = parse_token(bad).unwrap_err().to_string();
            assert!(
                error.contains("the bootstrap token file"),
                "{bad:?}: {error}"
            );
        }
        let err = re_enroll("edge-1", "the certificate expired").to_string();
        for part in [
            "kubectl kedge mc delete-member edge-1",
            "kubectl kedge mc setup-member edge-1",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
    }
}
