//! Enrollment without shared secrets: one-time, expiring bootstrap tokens, and the hub's
//! side of enrollment (token + CSR → client certificate) and renewal (CSR over the live
//! session → new client certificate).
//!
//! Contract (shared with `kubectl kedge mc setup-member` and the install manifests): a token
//! is `<member>.<secret>` ([`kedge_net::enroll::BootstrapToken`] writes and reads it), the
//! secret 32 random bytes in base64url without padding. The hub
//! stores only the lowercase hex SHA-256 of the whole token string, in the Secret
//! `kedge-bootstrap-<member>` of the hub namespace (`type: kedge.dev/bootstrap-token`, label
//! `kedge.dev/member: <member>`, data `token-hash`, `expires-at` (RFC 3339) and `member-uid`).
//! A token is bound to the `MemberCluster` it was minted for: its uid is stored with it (and
//! the Secret is owned by that `MemberCluster`, so deleting the member deletes the token, with
//! or without the CLI), and enrollment refuses it for any other `MemberCluster` of that name.
//! A token is consumed (its Secret deleted, with preconditions) before a certificate is
//! issued, so it works once even when two enrollments race.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kedge_core::crd::MemberCluster;
pub use kedge_net::enroll::token_hash;
use kedge_net::enroll::{BootstrapToken, TokenError};
use kedge_net::identity::is_valid_member_name;
use kedge_net::pki::{CertificateAuthority, Csr, CsrError, Validity, cert_validity};
use kedge_protocol::{
    EnrollRefusal, EnrollRefusalCode, EnrollRequest, EnrollResponse, FramedStream,
    IssuedCertificate, is_supported_version,
};
use kube::api::{DeleteParams, ObjectMeta, Preconditions};
use kube::{Api, Client, Resource};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use ring::rand::{SecureRandom, SystemRandom};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::time::{timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admission::Enrollment;
use crate::{Error, Result};

/// `type` of a bootstrap token Secret.
pub const BOOTSTRAP_SECRET_TYPE: &str = "kedge.dev/bootstrap-token";
/// Label naming the member a bootstrap token Secret is for.
pub const MEMBER_LABEL: &str = "kedge.dev/member";
/// Data key of the token's hash (lowercase hex SHA-256 of the whole token string).
pub const TOKEN_HASH_KEY: &str = "token-hash";
/// Data key of the token's expiry (RFC 3339).
pub const EXPIRES_AT_KEY: &str = "expires-at";
/// Data key of the `metadata.uid` of the `MemberCluster` the token was minted for.
pub const MEMBER_UID_KEY: &str = "member-uid";
/// Default lifetime of a member's client certificate.
pub const DEFAULT_MEMBER_CERT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Bounds of `--member-cert-lifetime`: shorter leaves no room to renew at two thirds of it
/// over a slow link, longer defeats short-lived certificates.
pub const MEMBER_CERT_LIFETIME: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(90 * 24 * 3600));

/// Name of the bootstrap token Secret of `member`.
pub fn bootstrap_secret_name(member: &str) -> String {
    format!("kedge-bootstrap-{member}")
}

/// A freshly minted bootstrap token; [`MintedToken::secret`] binds it to a
/// `MemberCluster` and stores its hash.
#[derive(Debug, Clone)]
pub struct MintedToken {
    /// The token to hand to the agent; shown once, never stored.
    pub token: BootstrapToken,
    /// When the token stops working.
    pub expires_at: OffsetDateTime,
}

impl MintedToken {
    /// The Secret to create in the hub `namespace`: the token's hash, bound to (and owned
    /// by) the `MemberCluster` of uid `member_uid`.
    pub fn secret(&self, member_uid: &str, namespace: &str) -> Result<Secret> {
        bootstrap_secret(
            self.token.member(),
            member_uid,
            namespace,
            self.token.as_str(),
            self.expires_at,
        )
    }
}

/// Mints a one-time bootstrap token for `member`, valid from `now` for `ttl`.
pub fn mint_bootstrap_token(
    member: &str,
    now: OffsetDateTime,
    ttl: Duration,
) -> Result<MintedToken> {
    if !is_valid_member_name(member) {
        return Err(Error::Token(format!(
            "{member:?} is not a valid member name (lowercase RFC 1123 label)"
        )));
    }
    let ttl = time::Duration::try_from(ttl)
        .ok()
        .filter(|t| t.is_positive())
        .ok_or_else(|| Error::Token("the token lifetime must be positive".into()))?;
    let mut secret = [0u8; 32];
    SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| Error::Token("the system random number generator failed".into()))?;
    let token = BootstrapToken::new(member, &URL_SAFE_NO_PAD.encode(secret))
        .map_err(|e| Error::Token(e.to_string()))?;
    Ok(MintedToken {
        token,
        expires_at: now + ttl,
    })
}

/// The Secret storing the hash of `token` for `member` (`MemberCluster` uid `member_uid`) in
/// `namespace`, owned by that `MemberCluster`.
pub fn bootstrap_secret(
    member: &str,
    member_uid: &str,
    namespace: &str,
    token: &str,
    expires_at: OffsetDateTime,
) -> Result<Secret> {
    let expires = expires_at
        .format(&Rfc3339)
        .map_err(|e| Error::Token(format!("cannot format the expiry: {e}")))?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(bootstrap_secret_name(member)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                MEMBER_LABEL.to_owned(),
                member.to_owned(),
            )])),
            // The garbage collector deletes the token with its MemberCluster.
            owner_references: Some(vec![OwnerReference {
                api_version: MemberCluster::api_version(&()).into_owned(),
                kind: MemberCluster::kind(&()).into_owned(),
                name: member.to_owned(),
                uid: member_uid.to_owned(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        type_: Some(BOOTSTRAP_SECRET_TYPE.to_owned()),
        data: Some(BTreeMap::from([
            (
                TOKEN_HASH_KEY.to_owned(),
                ByteString(token_hash(token).into_bytes()),
            ),
            (EXPIRES_AT_KEY.to_owned(), ByteString(expires.into_bytes())),
            (
                MEMBER_UID_KEY.to_owned(),
                ByteString(member_uid.as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    })
}

fn refusal(code: EnrollRefusalCode, message: impl Into<String>) -> EnrollRefusal {
    EnrollRefusal {
        code,
        message: message.into(),
    }
}

/// The token of an enrollment request, refused as malformed when it is not one.
pub fn parse_token(token: &str) -> Result<BootstrapToken, EnrollRefusal> {
    BootstrapToken::parse(token).map_err(|error: TokenError| {
        refusal(
            EnrollRefusalCode::MalformedToken,
            format!("{error}; copy it again from `kubectl kedge mc setup-member`"),
        )
    })
}

/// Equal in time independent of where `a` and `b` differ (lengths are not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What to do when a member's token is unusable and a new one is needed: `setup-member`
/// refuses a member that exists, so the member is deleted and set up again.
fn mint_again(member: &str) -> String {
    format!(
        "run `kubectl kedge mc delete-member {member}` and `kubectl kedge mc setup-member {member}` \
         on the hub and apply the new install to the member cluster"
    )
}

/// The text under `key` in a bootstrap token Secret of `member`.
fn stored_field<'a>(secret: &'a Secret, member: &str, key: &str) -> Result<&'a str, EnrollRefusal> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            refusal(
                EnrollRefusalCode::TokenNotFound,
                format!(
                    "the bootstrap token Secret of {member:?} has no usable {key:?}; {}",
                    mint_again(member)
                ),
            )
        })
}

/// Checks `token` against its stored Secret at `now`: the hash must match (compared in
/// constant time) and the token must not have expired.
pub fn check_token(
    token: &BootstrapToken,
    secret: &Secret,
    now: OffsetDateTime,
) -> Result<(), EnrollRefusal> {
    let member = token.member();
    let field = |key: &str| stored_field(secret, member, key);
    let stored = field(TOKEN_HASH_KEY)?;
    if !constant_time_eq(token.hash().as_bytes(), stored.as_bytes()) {
        return Err(refusal(
            EnrollRefusalCode::WrongToken,
            format!("wrong bootstrap token for member {member:?}"),
        ));
    }
    let expires_at = OffsetDateTime::parse(field(EXPIRES_AT_KEY)?, &Rfc3339).map_err(|_| {
        refusal(
            EnrollRefusalCode::TokenNotFound,
            format!(
                "the bootstrap token Secret of {member:?} has an unreadable {EXPIRES_AT_KEY:?}"
            ),
        )
    })?;
    if now >= expires_at {
        return Err(refusal(
            EnrollRefusalCode::TokenExpired,
            format!(
                "the bootstrap token for member {member:?} expired at {}; {}",
                expires_at.format(&Rfc3339).unwrap_or_default(),
                mint_again(member)
            ),
        ));
    }
    Ok(())
}

/// Checks that the bootstrap token Secret of `member` was minted for `current`, the
/// `MemberCluster` of that name now: a token outlives neither the deletion of its member nor
/// a `MemberCluster` created again under the same name (a token without a recorded uid, from
/// an older `kubectl kedge`, is bound to nothing and refused).
pub fn check_binding(
    member: &str,
    secret: &Secret,
    current: &Enrollment,
) -> Result<(), EnrollRefusal> {
    if current.deleting {
        return Err(refusal(
            EnrollRefusalCode::UnknownMember,
            format!(
                "MemberCluster {member:?} is being deleted: the member is revoked; once it is gone, enroll it again with `kubectl kedge mc setup-member {member}`"
            ),
        ));
    }
    let minted_for = stored_field(secret, member, MEMBER_UID_KEY)?;
    if minted_for != current.uid {
        return Err(refusal(
            EnrollRefusalCode::Superseded,
            format!(
                "the bootstrap token of {member:?} was minted for an earlier MemberCluster \
                 {member:?} (uid {minted_for}), which was deleted; the current one (uid {}) \
                 has its own token: apply the install printed by the `kubectl kedge mc \
                 setup-member {member}` that created it, or {}",
                current.uid,
                mint_again(member)
            ),
        ));
    }
    Ok(())
}

/// Issues member certificates: enrollment with a bootstrap token, renewal over a session.
pub struct Enroller {
    client: Client,
    namespace: String,
    ca: Arc<CertificateAuthority>,
    lifetime: Duration,
}

impl std::fmt::Debug for Enroller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enroller")
            .field("namespace", &self.namespace)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl Enroller {
    /// An enroller reading tokens and `MemberCluster`s through `client`, tokens in the hub
    /// `namespace`, issuing certificates of `lifetime` from `ca`.
    pub fn new(
        client: Client,
        namespace: String,
        ca: Arc<CertificateAuthority>,
        lifetime: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            ca,
            lifetime,
        }
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Answers an enrollment request from `remote`, with an audit line either way.
    pub async fn enroll(&self, request: &EnrollRequest, remote: SocketAddr) -> EnrollResponse {
        let token = BootstrapToken::parse(&request.token).ok();
        let claimed = token.as_ref().map_or("<malformed>", BootstrapToken::member);
        match self.try_enroll(request).await {
            Ok(issued) => {
                info!(target: "kedge::audit", member = claimed, %remote,
                    not_after_unix_ms = issued.not_after_unix_ms, "enrollment: certificate issued");
                EnrollResponse::Issued(issued)
            }
            Err(refused) => {
                warn!(target: "kedge::audit", member = claimed, %remote, reason = refused.code.as_str(),
                    message = %refused.message, "enrollment refused");
                EnrollResponse::Refused(refused)
            }
        }
    }

    async fn try_enroll(
        &self,
        request: &EnrollRequest,
    ) -> Result<IssuedCertificate, EnrollRefusal> {
        if !is_supported_version(request.protocol_version) {
            return Err(refusal(
                EnrollRefusalCode::UnsupportedVersion,
                format!(
                    "the agent speaks protocol version {}; install an agent release that matches the hub",
                    request.protocol_version
                ),
            ));
        }
        let token = parse_token(&request.token)?;
        let member = token.member();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = bootstrap_secret_name(member);
        let secret = secrets
            .get_opt(&name)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                refusal(
                    EnrollRefusalCode::TokenNotFound,
                    format!(
                        "no bootstrap token for member {member:?}: it was already used, never created, or deleted with its MemberCluster; {}",
                        mint_again(member)
                    ),
                )
            })?;
        if secret.type_.as_deref() != Some(BOOTSTRAP_SECRET_TYPE) {
            return Err(refusal(
                EnrollRefusalCode::TokenNotFound,
                format!("{}/{name} is not a bootstrap token Secret", self.namespace),
            ));
        }
        check_token(&token, &secret, OffsetDateTime::now_utc())?;
        let current = self.member_enrollment(member).await?;
        check_binding(member, &secret, &current)?;
        // Check the request before spending the token, so that a broken agent can retry.
        let csr = Csr::parse(&request.csr_der).map_err(csr_refusal)?;
        csr.check_member(member).map_err(csr_refusal)?;
        // Spend the token: of two concurrent enrollments, one deletes the Secret and the
        // other gets NotFound or Conflict.
        let preconditions = Preconditions {
            uid: secret.metadata.uid.clone(),
            resource_version: secret.metadata.resource_version.clone(),
        };
        let params = DeleteParams {
            preconditions: Some(preconditions),
            ..DeleteParams::default()
        };
        match secrets.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                return Err(refusal(
                    EnrollRefusalCode::TokenAlreadyUsed,
                    format!(
                        "the bootstrap token for member {member:?} was used by another enrollment at the same time"
                    ),
                ));
            }
            Err(e) => return Err(unavailable(e)),
        }
        self.issue(member, &current.uid, &csr)
    }

    /// Answers a renewal request of the session of `member`, whose certificate carries the
    /// enrollment `session_uid` (from its URI SAN), with an audit line either way. Only a
    /// certificate of the current enrollment is renewed: after the `MemberCluster` was deleted
    /// and created again, an old session cannot obtain a certificate of the new one.
    pub async fn renew(
        &self,
        member: &str,
        session_uid: Option<&str>,
        csr_der: &[u8],
    ) -> EnrollResponse {
        let outcome = async {
            let uid = self.member_enrollment(member).await?.uid;
            if session_uid != Some(uid.as_str()) {
                return Err(refusal(
                    EnrollRefusalCode::Superseded,
                    format!(
                        "this session's certificate is not of the current enrollment of {member:?}: apply the install printed by the `kubectl kedge mc setup-member {member}` that created the current MemberCluster (the agent enrolls again with its token by itself), or {}",
                        mint_again(member)
                    ),
                ));
            }
            let csr = Csr::parse(csr_der).map_err(csr_refusal)?;
            self.issue(member, &uid, &csr)
        }
        .await;
        match outcome {
            Ok(issued) => {
                info!(target: "kedge::audit", %member, not_after_unix_ms = issued.not_after_unix_ms,
                    "renewal: certificate issued");
                EnrollResponse::Issued(issued)
            }
            Err(refused) => {
                warn!(target: "kedge::audit", %member, reason = refused.code.as_str(),
                    message = %refused.message, "renewal refused");
                EnrollResponse::Refused(refused)
            }
        }
    }

    /// The `MemberCluster` of `member` as admission sees it.
    async fn member_enrollment(&self, member: &str) -> Result<Enrollment, EnrollRefusal> {
        let members: Api<MemberCluster> = Api::all(self.client.clone());
        members
            .get_opt(member)
            .await
            .map_err(unavailable)?
            .and_then(|mc| {
                Some(Enrollment {
                    uid: mc.metadata.uid?,
                    deleting: mc.metadata.deletion_timestamp.is_some(),
                })
            })
            .ok_or_else(|| {
                refusal(
                    EnrollRefusalCode::UnknownMember,
                    format!(
                        "no MemberCluster {member:?} exists on the hub; create it with `kubectl kedge mc setup-member {member}`"
                    ),
                )
            })
    }

    fn issue(
        &self,
        member: &str,
        uid: &str,
        csr: &Csr,
    ) -> Result<IssuedCertificate, EnrollRefusal> {
        let lifetime = time::Duration::try_from(self.lifetime).unwrap_or(time::Duration::DAY);
        let validity = Validity::issued(OffsetDateTime::now_utc(), lifetime);
        let cert_pem = self
            .ca
            .issue_member_csr(csr, member, uid, validity)
            .map_err(csr_refusal)?;
        let not_after = cert_validity(&cert_pem)
            .map(|v| v.not_after)
            .unwrap_or(validity.not_after);
        Ok(IssuedCertificate {
            cert_pem,
            ca_pem: self.ca.cert_pem().to_owned(),
            not_after_unix_ms: i64::try_from(not_after.unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MAX),
        })
    }
}

fn csr_refusal(error: CsrError) -> EnrollRefusal {
    match error {
        CsrError::NameMismatch { .. } => refusal(
            EnrollRefusalCode::NameMismatch,
            format!("{error}: an agent may only request a certificate for its own member name"),
        ),
        CsrError::Invalid(_) => refusal(EnrollRefusalCode::BadCsr, error.to_string()),
    }
}

fn unavailable(error: kube::Error) -> EnrollRefusal {
    warn!(%error, "enrollment: hub cluster API call failed");
    refusal(
        EnrollRefusalCode::Unavailable,
        "the hub cannot read its cluster right now; retry later",
    )
}

type EnrollStream = FramedStream<RecvStream, SendStream, EnrollRequest, EnrollResponse>;

/// Serves one enrollment connection: one request on the first stream, one answer, then the
/// connection closes. Bounded by `deadlines` so that a silent client cannot hold it, and
/// closed at once when `evicted` is cancelled. `Err` with the reason when the peer never
/// sent a request in time (the caller counts and logs these: a peer can open them at will).
pub async fn serve_enrollment(
    connection: Connection,
    enroller: &Enroller,
    remote: SocketAddr,
    deadlines: EnrollDeadlines,
    evicted: CancellationToken,
) -> Result<(), Unanswered> {
    /// How the exchange ended.
    enum Exchange {
        Answered,
        BadFrame,
        Gone,
        NoRequest,
    }
    let exchange = async {
        let request = async {
            let (send, recv) = connection.accept_bi().await.ok()?;
            let mut stream = EnrollStream::new(recv, send);
            Some((stream.recv().await, stream))
        };
        let (request, mut stream) = match timeout_at(deadlines.request, request).await {
            Err(_) => return Exchange::NoRequest,
            Ok(None) => return Exchange::Gone,
            Ok(Some(read)) => read,
        };
        let request = match request {
            Ok(Some(request)) => request,
            Ok(None) => return Exchange::Gone,
            Err(error) => {
                warn!(target: "kedge::audit", %remote, reason = "bad_frame", %error, "enrollment refused");
                return Exchange::BadFrame;
            }
        };
        let answer = enroller.enroll(&request, remote).await;
        if stream.send(&answer).await.is_err() || stream.finish().await.is_err() {
            return Exchange::Gone;
        }
        // Let the agent read the answer and close first.
        let _ = timeout(Duration::from_secs(2), connection.closed()).await;
        Exchange::Answered
    };
    let exchange = async {
        tokio::select! {
            _ = evicted.cancelled() => None,
            done = timeout(deadlines.exchange, exchange) => Some(done.unwrap_or(Exchange::NoRequest)),
        }
    };
    match exchange.await {
        Some(Exchange::BadFrame) => {
            connection.close(
                VarInt::from_u32(kedge_protocol::close_code::PROTOCOL_ERROR),
                b"bad enrollment frame",
            );
            Ok(())
        }
        Some(Exchange::Answered | Exchange::Gone) => {
            connection.close(
                VarInt::from_u32(kedge_protocol::close_code::SHUTDOWN),
                b"enrollment done",
            );
            Ok(())
        }
        Some(Exchange::NoRequest) => {
            connection.close(
                VarInt::from_u32(kedge_protocol::close_code::PROTOCOL_ERROR),
                b"no enrollment request in time",
            );
            Err(Unanswered::TimedOut)
        }
        None => {
            connection.close(
                VarInt::from_u32(kedge_protocol::close_code::PROTOCOL_ERROR),
                b"closed for a newer connection: no enrollment request yet",
            );
            Err(Unanswered::Evicted)
        }
    }
}

/// Why an enrollment connection was closed without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    /// No request (or no whole exchange) within its deadline.
    #[error("no enrollment request in time")]
    TimedOut,
    /// Closed to admit a newer attempt before its request came.
    #[error("closed for a newer attempt before its request came")]
    Evicted,
}

impl Unanswered {
    /// A short stable label for metrics and audit lines.
    pub fn label(self) -> &'static str {
        match self {
            Self::TimedOut => "enroll_timed_out",
            Self::Evicted => "enroll_evicted",
        }
    }
}

/// Deadlines of an enrollment connection.
#[derive(Debug, Clone, Copy)]
pub struct EnrollDeadlines {
    /// By when the request must have arrived (the unauthenticated handshake's deadline).
    pub request: tokio::time::Instant,
    /// How long the whole exchange, the hub's answer included, may take.
    pub exchange: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(unix).unwrap()
    }

    #[test]
    fn a_minted_token_follows_the_contract() {
        let minted = mint_bootstrap_token("edge-1", at(1_000), Duration::from_secs(3600)).unwrap();
        let (member, secret) = minted.token.as_str().split_once('.').unwrap();
        assert_eq!(member, "edge-1");
        assert_eq!(minted.token.member(), "edge-1");
        assert_eq!(URL_SAFE_NO_PAD.decode(secret).unwrap().len(), 32);
        assert!(!secret.contains('='));
        let s = &minted.secret("uid-1", "kedge-system").unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("kedge-bootstrap-edge-1"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("kedge-system"));
        assert_eq!(s.type_.as_deref(), Some("kedge.dev/bootstrap-token"));
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()["kedge.dev/member"],
            "edge-1"
        );
        // Owned by its MemberCluster: deleting the member deletes the token.
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("kedge.dev/v1alpha1", "MemberCluster", "edge-1", "uid-1")
        );
        let data = s.data.as_ref().unwrap();
        assert_eq!(data.len(), 3);
        assert_eq!(data["member-uid"].0, b"uid-1");
        let hash = std::str::from_utf8(&data["token-hash"].0).unwrap();
        assert_eq!(hash.len(), 64);
        assert!(
            hash.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(hash, token_hash(minted.token.as_str()));
        assert_eq!(
            std::str::from_utf8(&data["expires-at"].0).unwrap(),
            "1970-01-01T01:16:40Z"
        );
        assert!(!format!("{minted:?}").contains(secret));
        // Two tokens never repeat.
        let again = mint_bootstrap_token("edge-1", at(1_000), Duration::from_secs(3600)).unwrap();
        assert_ne!(again.token, minted.token);
    }

    #[test]
    fn minting_refuses_bad_names_and_lifetimes() {
        assert!(mint_bootstrap_token("Bad_Name", at(0), Duration::from_secs(1)).is_err());
        assert!(mint_bootstrap_token("ok", at(0), Duration::ZERO).is_err());
    }

    #[test]
    fn tokens_are_checked_for_form_hash_and_expiry() {
        let minted = mint_bootstrap_token("edge-1", at(1_000), Duration::from_secs(60)).unwrap();
        let stored = minted.secret("uid", "ns").unwrap();
        let code = |token: &str, now: i64| {
            parse_token(token)
                .and_then(|token| check_token(&token, &stored, at(now)))
                .err()
                .map(|r| r.code)
        };
        let token = minted.token.as_str();
        assert_eq!(code(token, 1_000), None);
        assert_eq!(code(token, 1_059), None);
        assert_eq!(code(token, 1_060), Some(EnrollRefusalCode::TokenExpired));
        let wrong = format!("edge-1.{}", URL_SAFE_NO_PAD.encode([7u8; 32]));
        assert_eq!(code(&wrong, 1_000), Some(EnrollRefusalCode::WrongToken));
        for malformed in ["", "edge-1", "edge-1.", ".secret", "Edge.x", "a_b.x"] {
            assert_eq!(
                code(malformed, 1_000),
                Some(EnrollRefusalCode::MalformedToken),
                "{malformed:?}"
            );
        }
        let refused = parse_token("edge-1").unwrap_err();
        assert!(
            refused
                .message
                .contains("not of the form <member>.<secret>")
                && refused.message.contains("kubectl kedge mc setup-member"),
            "{}",
            refused.message
        );
        let mut broken = stored.clone();
        broken.data.as_mut().unwrap().remove(EXPIRES_AT_KEY);
        let err = check_token(&minted.token, &broken, at(1_000)).unwrap_err();
        assert!(err.message.contains("expires-at"), "{}", err.message);
    }

    #[test]
    fn a_token_works_only_for_the_membercluster_it_was_minted_for() {
        let minted = mint_bootstrap_token("edge-1", at(0), Duration::from_secs(60)).unwrap();
        let stored = minted.secret("uid-1", "ns").unwrap();
        let current = |uid: &str, deleting| Enrollment {
            uid: uid.into(),
            deleting,
        };
        let check = |secret: &Secret, mc: &Enrollment| check_binding("edge-1", secret, mc);
        assert_eq!(check(&stored, &current("uid-1", false)), Ok(()));
        // Deleted and created again under the same name: refused, saying what to do.
        let refused = check(&stored, &current("uid-2", false)).unwrap_err();
        assert_eq!(refused.code, EnrollRefusalCode::Superseded);
        for part in [
            "earlier MemberCluster",
            "uid-1",
            "uid-2",
            "kubectl kedge mc delete-member edge-1",
            "kubectl kedge mc setup-member edge-1",
        ] {
            assert!(
                refused.message.contains(part),
                "{part}: {}",
                refused.message
            );
        }
        // Being deleted: the member is revoked, its token with it.
        let refused = check(&stored, &current("uid-1", true)).unwrap_err();
        assert_eq!(refused.code, EnrollRefusalCode::UnknownMember);
        assert!(
            refused.message.contains("being deleted"),
            "{}",
            refused.message
        );
        // A token bound to nothing (an older kubectl kedge) or to an empty uid: refused.
        for uid in [None, Some("")] {
            let mut unbound = stored.clone();
            let data = unbound.data.as_mut().unwrap();
            data.remove(MEMBER_UID_KEY);
            if let Some(uid) = uid {
                data.insert(MEMBER_UID_KEY.into(), ByteString(uid.into()));
            }
            let refused = check(&unbound, &current("", false)).unwrap_err();
            assert_eq!(refused.code, EnrollRefusalCode::TokenNotFound);
            assert!(
                refused.message.contains("member-uid"),
                "{}",
                refused.message
            );
        }
    }

    #[test]
    fn equal_means_equal_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
