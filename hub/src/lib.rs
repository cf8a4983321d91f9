//! The kedge hub: QUIC server for member agents, session registry, and (in later modules)
//! the controllers that turn DistributedScaledObjects and DistributedScaledJobs into
//! per-member desired state.

pub mod cli;
pub mod config;
pub mod controller;
mod error;
pub mod fleet;
pub mod metrics;
pub mod registry;
pub mod server;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use kedge_net::ops::{self, Readiness};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use error::{Error, Result};

use crate::config::HubArgs;
use crate::fleet::Fleet;
use crate::metrics::HubMetrics;
use crate::registry::SessionRegistry;
use crate::server::ServerContext;

async fn list_sessions(State(registry): State<Arc<SessionRegistry>>) -> impl IntoResponse {
    Json(registry.snapshot())
}

async fn get_session(
    State(registry): State<Arc<SessionRegistry>>,
    Path(member): Path<String>,
) -> impl IntoResponse {
    match registry.get(&member) {
        Some(session) => Json(session).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("member {member:?} never connected\n"),
        )
            .into_response(),
    }
}

fn session_routes(registry: Arc<SessionRegistry>) -> Router {
    Router::new()
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{member}", get(get_session))
        .with_state(registry)
}

/// Runs the hub until `shutdown` is cancelled.
pub async fn run(args: HubArgs, shutdown: CancellationToken) -> Result<()> {
    let metrics = HubMetrics::default();
    let mut prometheus = Registry::default();
    metrics.register(&mut prometheus);
    let registry = Arc::new(SessionRegistry::new(args.liveness(), metrics.clone()));

    let material = TlsMaterial::from_files(&args.tls_cert, &args.tls_key, &args.tls_ca)?;
    let tuning = TransportTuning::default();
    let server_config = tls::server_config(material, tuning)?;
    let endpoint =
        quinn::Endpoint::server(server_config, args.listen).map_err(|source| Error::Listen {
            addr: args.listen,
            source,
        })?;
    let quic_addr = endpoint.local_addr().map_err(|source| Error::Listen {
        addr: args.listen,
        source,
    })?;

    let readiness = Readiness::default();
    let ops = ops::serve(
        args.ops_listen,
        Arc::new(prometheus),
        readiness.clone(),
        session_routes(registry.clone()),
        shutdown.clone(),
    )
    .await?;

    let fleet = Arc::new(Fleet::new(registry.clone()));
    let sweeper = tokio::spawn(sweep(fleet.clone(), shutdown.clone()));
    let controllers = match args.controllers() {
        Some(config) => {
            if args.dsj_enabled {
                warn!(
                    "DSJ_ENABLED is set, but this hub has no DistributedScaledJob controller yet"
                );
            }
            Some(tokio::spawn(controller::run(
                config,
                fleet.clone(),
                metrics.clone(),
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let ctx = Arc::new(ServerContext::new(fleet, metrics, args.limits()));
    readiness.set(true);
    info!(quic = %quic_addr, ops = %ops.local_addr, version = env!("CARGO_PKG_VERSION"), "kedge-hub ready");
    server::serve(endpoint, ctx, shutdown).await;
    readiness.set(false);
    let _ = sweeper.await;
    if let Some(controllers) = controllers {
        let _ = controllers.await;
    }
    let _ = ops.task.await;
    info!("kedge-hub stopped");
    Ok(())
}

/// Marks members whose heartbeats are overdue, at twice the heartbeat rate.
async fn sweep(fleet: Arc<Fleet>, shutdown: CancellationToken) {
    let registry = fleet.registry();
    let mut tick = tokio::time::interval(registry.liveness().interval / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                let unreachable = registry.sweep(tokio::time::Instant::now());
                for member in &unreachable {
                    let reason = registry.get(member).map(|s| s.reason).unwrap_or_default();
                    warn!(%member, %reason, "member unreachable");
                }
                if !unreachable.is_empty() {
                    fleet.notify();
                }
            }
        }
    }
}
