//! The kedge hub: QUIC server for member agents, session registry, and (in later modules)
//! the controllers that turn DistributedScaledObjects and DistributedScaledJobs into
//! per-member desired state.

pub mod admission;
pub mod budget;
pub mod ca;
pub mod cli;
pub mod config;
pub mod controller;
pub mod enroll;
mod error;
pub mod fleet;
pub mod install;
pub mod lease;
pub mod link;
pub mod metrics;
pub mod ops_access;
pub mod podmetrics;
pub mod registry;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use kedge_net::ops::{self, Readiness};
use kedge_net::tls::{self, TlsMaterial};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use error::{Error, Result};

use crate::admission::{Admission, Departure, Enrolled};
use crate::config::HubArgs;
use crate::fleet::Fleet;
use crate::lease::Role;
use crate::metrics::HubMetrics;
use crate::ops_access::SessionsAccess;
use crate::registry::SessionRegistry;
use crate::server::ServerContext;
use kedge_net::supervise::{Essential, Supervisor};

/// What `/v1/sessions` reads: the registry, and the role, for a sharded replica that relays
/// its sessions and so holds none of them itself.
#[derive(Clone)]
struct SessionsView {
    registry: Arc<SessionRegistry>,
    role: watch::Receiver<Role>,
    sharding: bool,
}

impl SessionsView {
    /// A 421 naming the replica to ask, when this one relays (an empty list would say that
    /// no member is connected).
    fn relaying(&self) -> Option<axum::response::Response> {
        let role = self.role.borrow();
        let (true, Role::Standby { holder, .. }) = (self.sharding, &*role) else {
            return None;
        };
        let active = holder.as_deref().map_or("none yet", |h| {
            // A holderIdentity is the pod name, then `_` and the process.
            h.rsplit_once('_').map_or(h, |(pod, _)| pod)
        });
        Some(
            (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "this hub replica relays its agents' sessions to the active replica ({active}), \
                     which lists every member: port-forward to it, e.g. \
                     kubectl -n NAMESPACE port-forward pod/{active} 8080\n"
                ),
            )
                .into_response(),
        )
    }
}

async fn list_sessions(State(view): State<SessionsView>) -> axum::response::Response {
    if let Some(relaying) = view.relaying() {
        return relaying;
    }
    Json(view.registry.snapshot()).into_response()
}

async fn get_session(
    State(view): State<SessionsView>,
    Path(member): Path<String>,
) -> axum::response::Response {
    if let Some(relaying) = view.relaying() {
        return relaying;
    }
    match view.registry.get(&member) {
        Some(session) => Json(session).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("member {member:?} never connected\n"),
        )
            .into_response(),
    }
}

fn session_routes(view: SessionsView, access: SessionsAccess) -> Router {
    Router::new()
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{member}", get(get_session))
        .with_state(view)
        .layer(axum::middleware::from_fn_with_state(
            access,
            ops_access::guard,
        ))
}

/// The QUIC endpoint on `addr`, its UDP socket with the largest buffers the kernel grants
/// (see [`kedge_net::udp`]).
fn quic_endpoint(server_config: quinn::ServerConfig, addr: SocketAddr) -> Result<quinn::Endpoint> {
    let listen = |source| Error::Listen { addr, source };
    let bound = kedge_net::udp::bind(addr, kedge_net::udp::SOCKET_BUFFER).map_err(listen)?;
    if bound.receive_buffer < kedge_net::udp::LOW_RECEIVE_BUFFER {
        warn!(
            receive_buffer = bound.receive_buffer,
            "the QUIC socket's receive buffer is small: bursts of agents (reconnects after a \
             restart, acknowledgements of a fan-out) will be dropped by the kernel and retried \
             late; raise net.core.rmem_max on the hub's node to at least 4 MiB"
        );
    } else {
        info!(
            receive_buffer = bound.receive_buffer,
            send_buffer = bound.send_buffer,
            "QUIC socket buffers"
        );
    }
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(server_config),
        bound.socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(listen)
}

/// Runs the hub until `shutdown` is cancelled.
pub async fn run(args: HubArgs, shutdown: CancellationToken) -> Result<()> {
    let metrics = HubMetrics::default();
    let mut prometheus = Registry::default();
    metrics.register(&mut prometheus);
    let registry = Arc::new(SessionRegistry::new(args.liveness(), metrics.clone()));

    let limits = args.limits().map_err(Error::Limits)?;
    let relay_address = args
        .relay_address(std::env::var("POD_IP").ok().as_deref())
        .map_err(Error::Limits)?;
    let access = SessionsAccess::from_file(args.ops_token_file.as_deref())?;
    let (server_config, tokens, hub_ca) = tls_setup(&args).await?;
    prometheus.sub_registry_with_prefix("kedge_hub").register(
        "tls_resumptions",
        "TLS handshakes that resumed an agent's session with a ticket (no certificate signed or verified)",
        tokens.tickets().opened_counter(),
    );
    let endpoint = quic_endpoint(server_config, args.listen)?;
    let quic_addr = endpoint.local_addr().map_err(|source| Error::Listen {
        addr: args.listen,
        source,
    })?;

    // Everything this process does stops on `stop`: on a signal, when the lease is lost, or
    // when a controller, the sweeper or leader election ends on its own.
    let stop = shutdown.child_token();
    let supervisor = Supervisor::new(stop.clone());
    let pod_name = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok();
    let lease = args
        .lease(
            std::env::var("POD_NAMESPACE").ok(),
            lease::identity(pod_name),
        )
        .map(|lease| lease::LeaseConfig {
            relay_address,
            ..lease
        });
    let replica = lease
        .as_ref()
        .map(|l| l.identity.clone())
        .unwrap_or_default();
    let (role_tx, role) = watch::channel(match lease {
        Some(_) => Role::WAITING,
        None => Role::ALONE,
    });
    let readiness = Readiness::default();
    let view = SessionsView {
        registry: registry.clone(),
        role: role.clone(),
        sharding: relay_address.is_some(),
    };
    let ops = ops::serve(
        args.ops_listen,
        Arc::new(prometheus),
        readiness.clone(),
        session_routes(view, access),
        stop.clone(),
    )
    .await?;

    let fleet = Arc::new(Fleet::new(registry.clone()));
    if let Some(scaler) = args.scaler().map_err(Error::Scaler)? {
        serve_scaler(scaler, &args, &fleet, &metrics, &supervisor).await?;
    }
    // With a hub cluster, only members with a MemberCluster get a session.
    let admission = Arc::new(Admission::new(if args.controllers().is_some() {
        Enrolled::NotRead
    } else {
        Enrolled::Anyone
    }));
    let sweeper = supervisor.spawn(
        "the heartbeat sweeper",
        sweep(
            fleet.clone(),
            admission.subscribe(),
            args.forget_departed_after,
            stop.clone(),
        ),
    );
    let leadership = match (args.controllers(), lease) {
        (Some(config), Some(lease)) => Some(tokio::spawn(lead(
            Leading {
                health: watch_health(&config, &readiness),
                config,
                lease,
                fleet: fleet.clone(),
                metrics: metrics.clone(),
                readiness: readiness.clone(),
                admission: admission.clone(),
            },
            role_tx,
            supervisor.clone(),
        ))),
        _ => {
            metrics.set_leader(true);
            readiness.set(true);
            None
        }
    };
    let mut ctx = ServerContext::new(fleet, metrics, limits)
        .with_role(role)
        .with_admission(admission);
    if let (Some(hub_ca), Some(address)) = (&hub_ca, relay_address) {
        let server_name = hub_ca.server.names.first().cloned().unwrap_or_default();
        info!(relay = %address, "sharding: agents' sessions are relayed to the active replica");
        ctx = ctx.with_relay(Arc::new(server::RelayClient::new(
            endpoint.clone(),
            hub_ca.ca.clone(),
            server_name,
            replica,
        )));
    }
    if let Some(hub_ca) = hub_ca {
        tokio::spawn(ca::renew_server_cert(
            endpoint.clone(),
            hub_ca.ca,
            hub_ca.server,
            hub_ca.tokens,
            hub_ca.validity,
            stop.clone(),
        ));
        ctx = ctx.with_enroller(hub_ca.enroller);
    }
    let ctx = Arc::new(ctx);
    info!(quic = %quic_addr, ops = %ops.local_addr, version = env!("CARGO_PKG_VERSION"), "kedge-hub ready");
    server::serve(endpoint, ctx, stop.clone()).await;
    readiness.set(false);
    sweeper.join().await;
    let led = match leadership {
        Some(task) => task
            .await
            .unwrap_or_else(|e| Err(Error::TaskEnded(format!("leadership ended: {e}")))),
        None => Ok(()),
    };
    let outcome = led.and(match supervisor.failure() {
        Some(why) => Err(Error::TaskEnded(why)),
        None => Ok(()),
    });
    let _ = ops.task.await;
    match &outcome {
        Ok(()) => info!("kedge-hub stopped"),
        Err(error) => error!(%error, "kedge-hub stopped"),
    }
    outcome
}

/// Starts the external scaler: its listener now (a port in use stops the hub at start),
/// its certificates and its gRPC server under `supervisor`. Every hub replica serves it;
/// only the active one has samples to answer from (a standby answers NOT_FOUND).
async fn serve_scaler(
    settings: config::ScalerSettings,
    args: &HubArgs,
    fleet: &Arc<Fleet>,
    metrics: &HubMetrics,
    supervisor: &Supervisor,
) -> Result<()> {
    use podmetrics::{certs, scaler};
    let listener = scaler::bind(settings.listen)
        .await
        .map_err(|e| Error::Scaler(format!("cannot listen on TCP {}: {e}", settings.listen)))?;
    let client = kedge_net::kube_client::client(args.kubeconfig.as_deref())
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    let cache = Arc::new(certs::ScalerCerts::default());
    info!(address = %settings.address, keda_namespace = %settings.certs.keda_namespace,
        "external scaler: KEDA dials it through ClusterTriggerAuthentication kedge-scaler");
    let stop = supervisor.stop().clone();
    supervisor.spawn(
        "the external scaler's certificates",
        certs::maintain(client, settings.certs, cache.clone(), stop.clone()),
    );
    supervisor.spawn(
        "the external scaler",
        scaler::serve(
            listener,
            cache,
            scaler::Scaler::new(fleet.pod_metrics().clone(), metrics.clone()),
            stop,
        ),
    );
    Ok(())
}

/// The hub CA and what hangs off it (CA-Secret mode).
struct HubCa {
    ca: Arc<kedge_net::pki::CertificateAuthority>,
    server: ca::ServerCertConfig,
    /// The address tokens' key and log, for the renewals too.
    tokens: tls::AddressTokens,
    validity: kedge_net::pki::Validity,
    enroller: Arc<enroll::Enroller>,
}

/// The QUIC server configuration: from files, or issued from the hub CA in its Secret
/// (created on first start), with enrollment.
async fn tls_setup(
    args: &HubArgs,
) -> Result<(quinn::ServerConfig, tls::AddressTokens, Option<HubCa>)> {
    let tuning = args.transport();
    match args.tls_source()? {
        config::TlsSource::Files { cert, key, ca } => {
            let material = TlsMaterial::from_files(&cert, &key, &ca)?;
            let tokens = tls::AddressTokens::of(&material);
            let config = tls::server_config_with(material, tuning, &tokens)?;
            Ok((config, tokens, None))
        }
        config::TlsSource::CaSecret => {
            let client = kedge_net::kube_client::client(args.kubeconfig.as_deref())
                .await
                .map_err(|e| Error::KubeConfig(e.to_string()))?;
            let now = time::OffsetDateTime::now_utc();
            let ca = Arc::new(ca::load_or_create_ca(client.clone(), &args.namespace, now).await?);
            let server = args.server_cert();
            let (material, validity) = ca::server_material(&ca, &server, now)?;
            info!(names = ?server.names, not_after = %validity.not_after,
                "issued the hub server certificate from the hub CA");
            let enroller = Arc::new(enroll::Enroller::new(
                client,
                args.namespace.clone(),
                ca.clone(),
                args.member_cert_lifetime,
            ));
            let tokens = ca::address_tokens(&ca);
            let config = tls::enrolling_server_config(material, tuning, &tokens)?;
            Ok((
                config,
                tokens.clone(),
                Some(HubCa {
                    ca,
                    server,
                    tokens,
                    validity,
                    enroller,
                }),
            ))
        }
    }
}

/// The health of the controllers' watches, which `/readyz` reports.
fn watch_health(
    config: &controller::ControllerConfig,
    readiness: &Readiness,
) -> Arc<controller::decode::WatchHealth> {
    let health = Arc::new(controller::decode::WatchHealth::new(
        config.watch_failure_tolerance,
    ));
    let check = health.clone();
    readiness.add_check(Arc::new(move || check.problem()));
    health
}

/// Once told to stop, the hub process exits by this deadline even if some task hangs
/// (`kedge-hub`'s `main` enforces it); the orderly path (controllers, then the Lease) takes
/// at most `CONTROLLERS_STOP` and two bounded Lease calls.
pub const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(9);

/// How long a stopping hub waits for its controllers before it aborts them and releases
/// the Lease: with the Lease's own bounded write, a SIGTERM ends the process well within
/// Kubernetes' grace period, and a standby takes over at its next read.
const CONTROLLERS_STOP: std::time::Duration = std::time::Duration::from_secs(4);

/// What the active hub runs.
struct Leading {
    health: Arc<controller::decode::WatchHealth>,
    config: controller::ControllerConfig,
    lease: lease::LeaseConfig,
    fleet: Arc<Fleet>,
    metrics: HubMetrics,
    readiness: Readiness,
    admission: Arc<Admission>,
}

/// Competes for the lease and runs the controllers while holding it.
///
/// A hub that loses the lease stops acting at once, as controller-runtime does: it aborts its
/// controllers, cancels `stop` (which closes every agent session with the retryable
/// `SHUTDOWN` code, so agents move on to the new active hub) and returns
/// [`Error::LeaseLost`], so the process exits non-zero and Kubernetes restarts it as a
/// standby. Resuming in place would need every controller and the fleet state to be reset;
/// a restart does that for free and cannot forget anything.
///
/// On a normal shutdown it stops the controllers first and then releases the lease, so a
/// standby takes over at its next read instead of after the lease duration.
async fn lead(
    leading: Leading,
    role_tx: watch::Sender<Role>,
    supervisor: Supervisor,
) -> Result<()> {
    let stop = supervisor.stop().clone();
    let Leading {
        health,
        config,
        lease,
        fleet,
        metrics,
        readiness,
        admission,
    } = leading;
    // A sharded replica that relays serves agents too: ready while it knows where to relay.
    let sharding = lease.relay_address.is_some();
    let Some(client) = controller::connect(&config, &stop).await else {
        return Ok(());
    };
    admission.read_from(kube::Api::all(client.clone()));
    supervisor.spawn(
        "the MemberCluster watch",
        admission::watch_members(
            kube::Api::all(client.clone()),
            admission.clone(),
            stop.clone(),
        ),
    );
    supervisor.spawn(
        "the revocation of live sessions",
        admission::revoke_live(admission, fleet.registry().clone(), stop.clone()),
    );
    let mut role = role_tx.subscribe();
    let release = CancellationToken::new();
    let elector = lease::Elector::new(client.clone(), lease).start(role_tx, release.clone());
    let controllers_stop = stop.child_token();
    let mut controllers: Option<Essential> = None;
    let mut leading = false;
    let outcome = loop {
        tokio::select! {
            _ = stop.cancelled() => break Ok(()),
            changed = role.changed() => {
                if changed.is_err() {
                    // The elector is gone without a word: nobody renews the lease any more.
                    break if stop.is_cancelled() {
                        Ok(())
                    } else {
                        stop.cancel();
                        Err(Error::TaskEnded("leader election stopped".to_owned()))
                    };
                }
                let current = role.borrow_and_update().clone();
                match current {
                    Role::Leader { .. } => {
                        if !leading {
                            // Revisions of an earlier term name nothing agents can trust now.
                            fleet.new_term();
                            leading = true;
                        }
                        readiness.set(true);
                        metrics.set_leader(true);
                        controllers.get_or_insert_with(|| {
                            supervisor.spawn("the controllers", controller::run(
                                config.clone(),
                                client.clone(),
                                fleet.clone(),
                                metrics.clone(),
                                health.clone(),
                                controllers_stop.clone(),
                            ))
                        });
                    }
                    Role::Standby { relay, .. } => {
                        leading = false;
                        readiness.set(sharding && relay.is_some());
                        metrics.set_leader(false);
                    }
                    Role::Lost { reason } => {
                        readiness.set(false);
                        metrics.set_leader(false);
                        stop.cancel();
                        if let Some(task) = controllers.take() {
                            task.abort();
                        }
                        break Err(Error::LeaseLost(reason));
                    }
                }
            }
        }
    };
    if let Some(mut task) = controllers {
        controllers_stop.cancel();
        if tokio::time::timeout(CONTROLLERS_STOP, task.wait())
            .await
            .is_err()
        {
            warn!(after = ?CONTROLLERS_STOP, "the controllers did not stop in time; aborted");
            task.abort();
        }
    }
    release.cancel();
    let _ = elector.await;
    outcome
}

/// Marks members whose heartbeats are overdue, at twice the heartbeat rate, and forgets
/// members deleted `forget_after` ago ([`registry::SessionRegistry::forget_departed`]).
async fn sweep(
    fleet: Arc<Fleet>,
    enrolled: watch::Receiver<Enrolled>,
    forget_after: std::time::Duration,
    shutdown: CancellationToken,
) {
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
                    fleet.notify(member);
                }
                let forgotten = {
                    let enrolled = enrolled.borrow();
                    // A deleted member is listed (revoked) for a while; the record of one
                    // whose MemberCluster was created anew goes at once: the name is the
                    // new member's, which would show the old one's state and certificate.
                    registry.forget_departed(tokio::time::Instant::now(), |m, uid| {
                        match enrolled.departure(m, uid) {
                            Departure::Enrolled => None,
                            Departure::Gone => Some(forget_after),
                            Departure::Replaced => Some(std::time::Duration::ZERO),
                        }
                    })
                };
                for (member, session) in &forgotten {
                    fleet.forget(member, session);
                    info!(%member, %session, "departed member forgotten");
                }
            }
        }
    }
}
