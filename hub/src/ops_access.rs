//! Who may read the session listing (`/v1/sessions`) on the ops endpoint. It names every
//! member, its address and versions, so it is not served to whoever reaches the ops port
//! (which also serves `/metrics` to Prometheus): with `--ops-token-file` every request must
//! carry that bearer token; without one only peers at exactly 127.0.0.1 or ::1 get it —
//! processes in the hub's pod and `kubectl port-forward`, which connects from 127.0.0.1
//! inside the pod. The rest of 127.0.0.0/8 is refused: proxies in a pod forward outside
//! traffic from such addresses (Istio's sidecar from 127.0.0.6), and a peer behind one is
//! not local. A proxy that forwards from 127.0.0.1 itself makes every peer local: a pod with
//! one needs the token.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kedge_net::telemetry::AUDIT;

use crate::{Error, Result};

/// Shortest token accepted from `--ops-token-file`: shorter ones can be guessed.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Who may read the session listing.
#[derive(Clone)]
pub struct SessionsAccess {
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for SessionsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionsAccess")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No token is configured and the peer is not at 127.0.0.1 or ::1.
    #[error(
        "the session listing is served to 127.0.0.1 and ::1 only; use kubectl port-forward, or start the hub with --ops-token-file and pass --token-file"
    )]
    NotLoopback,
    /// A token is configured and the request carries none.
    #[error("the session listing needs the hub's ops token: pass --token-file")]
    MissingToken,
    /// The request carries a token that is not the hub's.
    #[error("the ops token does not match the hub's --ops-token-file")]
    WrongToken,
}

impl Denied {
    /// A short stable label for audit lines.
    pub fn label(self) -> &'static str {
        match self {
            Self::NotLoopback => "not_loopback",
            Self::MissingToken => "missing_token",
            Self::WrongToken => "wrong_token",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Self::NotLoopback => StatusCode::FORBIDDEN,
            Self::MissingToken | Self::WrongToken => StatusCode::UNAUTHORIZED,
        }
    }
}

/// Compares without an early exit, so the time taken does not tell how much matched.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl SessionsAccess {
    /// Peers at 127.0.0.1 or ::1 only.
    pub fn loopback_only() -> Self {
        Self { token: None }
    }

    /// Anyone with `token` (surrounding whitespace ignored); `None` when it is shorter than
    /// [`MIN_TOKEN_BYTES`].
    pub fn with_token(token: &str) -> Option<Self> {
        let token = token.trim();
        (token.len() >= MIN_TOKEN_BYTES).then(|| Self {
            token: Some(token.into()),
        })
    }

    /// From `--ops-token-file`: the token in that file, or loopback only when unset.
    pub fn from_file(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self::loopback_only());
        };
        let fail = |reason: String| Error::OpsToken {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Self::with_token(&text).ok_or_else(|| {
            fail(format!(
                "the token must be at least {MIN_TOKEN_BYTES} bytes; generate one with `head -c 32 /dev/urandom | base64`"
            ))
        })
    }

    /// Whether a request from `peer` with this `Authorization` header may read the listing.
    pub fn check(&self, peer: IpAddr, authorization: Option<&[u8]>) -> Result<(), Denied> {
        let Some(token) = &self.token else {
            // An IPv4 peer of a dual-stack listener arrives as IPv4-mapped IPv6.
            let local = match peer.to_canonical() {
                IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
                IpAddr::V6(v6) => v6 == std::net::Ipv6Addr::LOCALHOST,
            };
            return if local {
                Ok(())
            } else {
                Err(Denied::NotLoopback)
            };
        };
        let presented = authorization
            .and_then(|value| value.strip_prefix(b"Bearer "))
            .ok_or(Denied::MissingToken)?;
        if same_secret(presented.trim_ascii(), token.as_bytes()) {
            Ok(())
        } else {
            Err(Denied::WrongToken)
        }
    }
}

/// Middleware in front of the session routes: answers 403 or 401 (with the reason) to a
/// request [`SessionsAccess::check`] turns away, and writes an audit line.
pub async fn guard(
    State(access): State<SessionsAccess>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match access.check(peer.ip(), authorization) {
        Ok(()) => next.run(request).await,
        Err(denied) => {
            tracing::warn!(target: AUDIT, %peer, reason = denied.label(), path = %request.uri().path(),
                "ops request refused");
            let mut response = (denied.status(), format!("{denied}\n")).into_response();
            if denied.status() == StatusCode::UNAUTHORIZED {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn without_a_token_only_loopback_peers_are_served() {
        let access = SessionsAccess::loopback_only();
        for peer in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(access.check(ip(peer), None), Ok(()), "{peer}");
        }
        for peer in [
            // Where in-pod proxies forward outside traffic from.
            "127.0.0.6",
            "127.0.0.2",
            "::ffff:127.0.0.6",
            "10.0.0.7",
            "192.168.1.2",
            "::ffff:10.0.0.7",
            "fd00::1",
            "0.0.0.0",
        ] {
            assert_eq!(
                access.check(ip(peer), Some(b"Bearer anything-at-all")),
                Err(Denied::NotLoopback),
                "{peer}"
            );
        }
    }

    #[test]
    fn with_a_token_every_peer_needs_it() {
        let access = SessionsAccess::with_token("  s3cret-token-of-32-bytes-length\n").unwrap();
        let good: &[u8] = b"Bearer s3cret-token-of-32-bytes-length";
        for peer in ["127.0.0.1", "10.0.0.7"] {
            assert_eq!(access.check(ip(peer), Some(good)), Ok(()));
            assert_eq!(access.check(ip(peer), None), Err(Denied::MissingToken));
            assert_eq!(
                access.check(ip(peer), Some(b"Basic czNjcmV0")),
                Err(Denied::MissingToken)
            );
            assert_eq!(
                access.check(ip(peer), Some(b"Bearer s3cret-token-of-32-bytes-lengtX")),
                Err(Denied::WrongToken)
            );
            assert_eq!(
                access.check(ip(peer), Some(b"Bearer s3cret")),
                Err(Denied::WrongToken)
            );
        }
        assert!(SessionsAccess::with_token("short").is_none());
        assert!(SessionsAccess::with_token(" \n").is_none());
    }

    /// The guard in front of a route, served over real TCP as a peer at `peer`; the status
    /// and body of a `GET /v1/sessions` with `headers`.
    async fn get_as(peer: &str, access: SessionsAccess, headers: &str) -> (u16, String) {
        use axum::extract::connect_info::MockConnectInfo;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let app = axum::Router::new()
            .route("/v1/sessions", axum::routing::get(|| async { "[]" }))
            .layer(axum::middleware::from_fn_with_state(access, guard))
            .layer(MockConnectInfo(SocketAddr::new(ip(peer), 40_000)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request =
            format!("GET /v1/sessions HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n{headers}\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        server.abort();
        let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, response)
    }

    #[tokio::test]
    async fn the_guard_answers_403_off_loopback_and_401_without_the_token() {
        let (status, body) = get_as("10.0.0.7", SessionsAccess::loopback_only(), "").await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("--ops-token-file"), "{body}");
        let (status, body) = get_as("127.0.0.1", SessionsAccess::loopback_only(), "").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("[]"), "{body}");
        let access = SessionsAccess::with_token("0123456789abcdef-token").unwrap();
        let (status, body) = get_as("10.0.0.7", access.clone(), "").await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("www-authenticate: Bearer"), "{body}");
        let auth = "Authorization: Bearer 0123456789abcdef-token\r\n";
        assert_eq!(get_as("10.0.0.7", access, auth).await.0, 200);
    }

    #[test]
    fn a_token_file_is_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("kedge-ops-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "tiny\n").unwrap();
        let error = SessionsAccess::from_file(Some(&path))
            .unwrap_err()
            .to_string();
        assert!(error.contains("at least 16 bytes"), "{error}");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        let access = SessionsAccess::from_file(Some(&path)).unwrap();
        assert_eq!(
            access.check(ip("10.1.1.1"), Some(b"Bearer 0123456789abcdef0123")),
            Ok(())
        );
        let missing = SessionsAccess::from_file(Some(&dir.join("absent"))).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
        assert!(
            SessionsAccess::from_file(None)
                .unwrap()
                .check(ip("127.0.0.1"), None)
                .is_ok()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
