//! The dashboard's HTTP side: the page (embedded, no build step), a JSON snapshot, and a
//! server-sent event stream that pushes what changed.
//!
//! Read-only: every route is GET. Loopback only, and only for a `Host` naming loopback,
//! so that a web page elsewhere cannot reach it through DNS rebinding. Every response
//! carries a Content-Security-Policy that allows nothing but this origin's own script and
//! style.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::Stream;
use tokio::sync::broadcast;

use super::watch::{Shared, now_ms};

/// The page's Content-Security-Policy: this origin's script, style and stream, nothing
/// inline, no frames, no forms.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// How long the pusher gathers changes before it sends them (one message per burst).
pub const COALESCE: Duration = Duration::from_millis(100);

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    shared: Arc<Shared>,
    pushes: broadcast::Sender<Arc<str>>,
}

impl AppState {
    /// The state, with the pusher that turns model changes into messages started.
    pub fn start(shared: Arc<Shared>) -> Self {
        // A page that falls this far behind gets a fresh snapshot instead.
        let (pushes, _) = broadcast::channel(256);
        tokio::spawn(push(Arc::clone(&shared), pushes.clone()));
        Self { shared, pushes }
    }
}

/// Sends each burst of changes, as one JSON message, to every open page.
async fn push(shared: Arc<Shared>, pushes: broadcast::Sender<Arc<str>>) {
    loop {
        shared.changed.notified().await;
        tokio::time::sleep(COALESCE).await;
        let delta = shared.update_quietly(|m| m.take_delta(now_ms()));
        if delta.is_empty() {
            continue;
        }
        match serde_json::to_string(&delta) {
            // No page open is not an error.
            Ok(json) => drop(pushes.send(Arc::from(json))),
            Err(error) => tracing::error!(%error, "cannot encode the dashboard's changes"),
        }
    }
}

/// The dashboard's routes, for the given port (the `Host` check needs it).
pub fn router(state: AppState, port: u16) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/api/snapshot", get(snapshot))
        .route("/api/stream", get(stream))
        .with_state(state)
        .layer(middleware::from_fn(move |req, next| guard(req, next, port)))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Refuses a request whose `Host` is not this loopback server (DNS rebinding) and adds
/// the security headers to every answer.
async fn guard(request: Request, next: Next, port: u16) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let mut response = if host_allowed(host, port) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            format!(
                "kubectl kedge dashboard answers only to http://127.0.0.1:{port}/ or http://localhost:{port}/ (Host {host:?} refused)\n"
            ),
        )
            .into_response()
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Whether `host` (a `Host` header) names this server on a loopback name.
pub fn host_allowed(host: &str, port: u16) -> bool {
    let Some((name, host_port)) = host.rsplit_once(':') else {
        return false;
    };
    host_port.parse::<u16>().ok() == Some(port)
        && (matches!(name, "localhost" | "[::1]")
            || name
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback()))
}

async fn snapshot(State(state): State<AppState>) -> Response {
    match state
        .shared
        .read(|m| serde_json::to_string(&m.snapshot(now_ms())))
    {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// The event stream: a `snapshot`, then one `delta` per burst of changes; a page that
/// fell behind gets a new `snapshot`.
async fn stream(
    State(state): State<AppState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let receiver = state.pushes.subscribe();
    let first = snapshot_event(&state);
    let events = futures::stream::unfold(
        (state, receiver, Some(first)),
        |(state, mut receiver, first)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (state, receiver, None)));
            }
            let event = match receiver.recv().await {
                Ok(json) => SseEvent::default().event("delta").data(json.as_ref()),
                Err(broadcast::error::RecvError::Lagged(_)) => snapshot_event(&state),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(event), (state, receiver, None)))
        },
    );
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn snapshot_event(state: &AppState) -> SseEvent {
    let json = state
        .shared
        .read(|m| serde_json::to_string(&m.snapshot(now_ms())))
        .unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()));
    SseEvent::default().event("snapshot").data(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_on_our_port_are_served() {
        for ok in [
            "127.0.0.1:8000",
            "localhost:8000",
            "[::1]:8000",
            "127.1.2.3:8000",
        ] {
            assert!(host_allowed(ok, 8000), "{ok}");
        }
        for refused in [
            "evil.example:8000",
            "127.0.0.1:8001",
            "127.0.0.1",
            "",
            "10.0.0.1:8000",
            "localhost.evil.example:8000",
            "[::2]:8000",
        ] {
            assert!(!host_allowed(refused, 8000), "{refused}");
        }
    }
}
