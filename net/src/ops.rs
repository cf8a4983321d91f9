//! The ops HTTP endpoint: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`, plus any
//! routes the binary adds (the hub's session listing). Requests carry the peer's address as
//! `ConnectInfo<SocketAddr>` for routes that serve some peers only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

/// A check `/readyz` runs on each request: `Some(why)` makes it answer 503 with `why`.
pub type ReadinessCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Whether the process is ready to serve; `/readyz` answers 503 until it is, and while any
/// of its checks names a problem.
#[derive(Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    checks: Arc<std::sync::RwLock<Vec<ReadinessCheck>>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Readiness {
    /// Marks the process ready or not ready.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether the process is marked ready (its checks aside).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Adds a check run by every `/readyz` request.
    pub fn add_check(&self, check: ReadinessCheck) {
        self.checks
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(check);
    }

    /// The first problem a check names; `None`: every check passes.
    pub fn problem(&self) -> Option<String> {
        self.checks
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find_map(|check| check())
    }
}

#[derive(Clone)]
struct OpsState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

async fn metrics(State(state): State<OpsState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if !state.readiness.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned());
    }
    match state.readiness.problem() {
        None => (StatusCode::OK, "ready\n".to_owned()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// A running ops endpoint.
#[derive(Debug)]
pub struct OpsServer {
    /// The bound address (useful when binding port 0).
    pub local_addr: SocketAddr,
    /// The serving task; ends after `shutdown` is cancelled.
    pub task: JoinHandle<()>,
}

/// Binds `addr` and serves the ops routes plus `extra` until `shutdown` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    extra: Router,
    shutdown: CancellationToken,
) -> Result<OpsServer> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(OpsState {
            registry,
            readiness,
        })
        .merge(extra);
    let task = tokio::spawn(async move {
        // Routes may check who is asking (the hub's session listing answers 127.0.0.1 and ::1).
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "ops endpoint stopped");
        }
    });
    Ok(OpsServer { local_addr, task })
}
