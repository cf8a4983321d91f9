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

/// Whether the process is ready to serve; `/readyz` answers 503 until it is.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready or not ready.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
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
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
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
