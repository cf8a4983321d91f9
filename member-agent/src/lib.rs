//! The kedge member agent: keeps one authenticated QUIC session with the hub alive, forever,
//! applies the hub's desired state in the member cluster (replicas, Jobs), reports what
//! it manages there, and scrapes the metrics of the pods the hub names.
//!
//! The agent is fail-static: losing the hub changes nothing in the member cluster; it only
//! reconnects, with jittered exponential backoff.

pub mod config;
mod error;
pub mod executor;
mod identity;
pub mod jobs;
mod link;
pub mod lite;
pub mod metrics;
pub mod observe;
pub mod policy;
pub mod report;
mod rotation;
mod scrape;
mod session;
pub mod workloads;

use std::sync::Arc;

use axum::Router;
use backoff::backoff::Backoff;
use kedge_net::ops::{self, Readiness};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use error::{Error, Result};

use crate::config::AgentArgs;
use crate::executor::Executor;
use crate::metrics::AgentMetrics;
use crate::policy::NamespacePolicy;
use crate::rotation::{Attempt, Pause, Rotation};
use crate::session::{Dial, SessionEnd, SessionParams};
use kedge_net::supervise::Supervisor;
use kedge_protocol::RefusalCode;

/// The bootstrap token in `--bootstrap-token-file`, if one is configured and readable.
fn bootstrap_token(args: &AgentArgs) -> Option<String> {
    let file = args.bootstrap_token_file.as_deref()?;
    identity::read_token(file)
        .inspect_err(|error| warn!(%error, "ignoring the bootstrap token file"))
        .ok()
        .filter(|token| !token.is_empty())
}

/// The identity the agent starts with, and the hash of a bootstrap token the hub refused on
/// the way (never sent again).
type Obtained = (Arc<identity::ManagedIdentity>, Option<String>);

/// The enrolled identity: the one in the identity Secret while usable and no newer token is
/// at hand, else a new one from the bootstrap token. `None` when `shutdown` came first.
async fn obtain_identity(
    args: &AgentArgs,
    client: kube::Client,
    hubs: &[String],
    shutdown: &CancellationToken,
) -> Result<Option<Obtained>> {
    use identity::{Enrolled, IdentityStore, ManagedIdentity, Start, Token};
    let ca_pem =
        std::fs::read_to_string(&args.tls_ca).map_err(|source| kedge_net::Error::ReadFile {
            path: args.tls_ca.clone(),
            source,
        })?;
    let store = IdentityStore::new(client, &args.agent_namespace, &args.identity_secret);
    let stored = store.load().await?;
    let now = time::OffsetDateTime::now_utc();
    let token = bootstrap_token(args);
    let state = identity::token_state(
        token
            .as_deref()
            .map(kedge_net::enroll::token_hash)
            .as_deref(),
        stored.as_ref().map(|s| s.enrolled_with.as_deref()),
    );
    let decision = identity::start(stored.as_ref().map(|i| i.validity), state, now);
    let token = match (decision, token, stored.clone()) {
        (Start::UseStored, _, Some(stored)) => {
            info!(member = %stored.member, not_after = %stored.validity.not_after,
                "using the identity from the identity Secret");
            return Ok(Some((ManagedIdentity::new(stored, ca_pem, store), None)));
        }
        (Start::Enroll, Some(token), _) => token,
        (_, _, stored) => {
            let member = stored.map(|s| s.member).unwrap_or_default();
            let token = match state {
                Token::Spent => "only the spent bootstrap token it was enrolled with",
                _ => "no usable --bootstrap-token-file",
            };
            return Err(identity::re_enroll(
                &member,
                &format!(
                    "the identity Secret {}/{} holds no valid certificate and there is {token}",
                    args.agent_namespace, args.identity_secret
                ),
            ));
        }
    };
    if state == Token::New
        && let Some(stored) = &stored
    {
        info!(member = %stored.member,
            "the bootstrap token is not the one the stored identity was enrolled with: the member was set up again; enrolling");
    }
    let member = identity::parse_token(&token)?.member().to_owned();
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(args.reconnect_initial)
        .with_max_interval(args.reconnect_max)
        .with_max_elapsed_time(None)
        .build();
    let mut rotation = Rotation::new(hubs.len());
    loop {
        let hub = &hubs[rotation.current()];
        let attempt = async {
            let addr = session::resolve(hub).await?;
            identity::enroll_once(&token, addr, &args.server_name(hub), &ca_pem, &store).await
        };
        let failure = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            outcome = attempt => match outcome {
                Ok(Enrolled::Done(identity)) => {
                    return Ok(Some((ManagedIdentity::new(identity, ca_pem, store), None)));
                }
                Ok(Enrolled::Refused(refusal)) => {
                    // A certificate about to expire still beats none: renewal may save it.
                    if let Some(stored) = stored.filter(|s| s.validity.not_after > time::OffsetDateTime::now_utc()) {
                        warn!(reason = refusal.code.as_str(), message = %refusal.message,
                            "the hub refused the bootstrap token; using the stored certificate until it expires");
                        let refused = kedge_net::enroll::token_hash(&token);
                        return Ok(Some((ManagedIdentity::new(stored, ca_pem, store), Some(refused))));
                    }
                    return Err(identity::re_enroll(
                        &member,
                        &format!("the hub refused the bootstrap token ({}): {}", refusal.code.as_str(), refusal.message),
                    ));
                }
                Err(e @ (Error::ReEnroll(_) | Error::IdentityStore(_))) => return Err(e),
                Err(e) => e,
            },
        };
        rotation.after(Attempt::Failed, std::time::Instant::now());
        let delay = backoff.next_backoff().unwrap_or(args.reconnect_max);
        warn!(%hub, error = %failure, ?delay, "enrollment did not complete; retrying");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// After the hub refused the session with `code`: enrolls again with the token file when
/// [`identity::enroll_after_refusal`] says so, and installs the new identity. `refused` holds
/// the hash of the last token the hub refused, so that one is never sent twice. Returns
/// whether there is a new identity to connect with.
async fn enroll_again(
    args: &AgentArgs,
    identity: &identity::ManagedIdentity,
    code: RefusalCode,
    hub: &str,
    refused: &mut Option<String>,
) -> bool {
    use identity::Enrolled;
    let Some(token) = bootstrap_token(args) else {
        return false;
    };
    let hash = kedge_net::enroll::token_hash(&token);
    let state = identity.token_state(&hash);
    if !identity::enroll_after_refusal(code, state, refused.as_deref() == Some(hash.as_str())) {
        return false;
    }
    let old = identity.current().member;
    info!(member = %old, token = ?state,
        "the hub no longer admits this identity and the bootstrap token file holds a token it was not enrolled with; enrolling again");
    let attempt = async {
        let addr = session::resolve(hub).await?;
        identity
            .enroll_again(&token, addr, &args.server_name(hub))
            .await
    };
    match attempt.await {
        Ok(Enrolled::Done(new)) => {
            info!(member = %new.member, not_after = %new.validity.not_after,
                "enrolled again: the new identity replaced the one in the identity Secret");
            true
        }
        Ok(Enrolled::Refused(refusal)) => {
            warn!(reason = refusal.code.as_str(), message = %refusal.message,
                "the hub refused the bootstrap token too; not trying it again. {}",
                identity::re_enroll(&old, "the hub admits neither the identity nor the token"));
            *refused = Some(hash);
            false
        }
        Err(error) => {
            warn!(%error, "enrolling again did not complete; retrying after the next refusal");
            false
        }
    }
}

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(args: AgentArgs, shutdown: CancellationToken) -> Result<()> {
    // The apply and report loops are essential: if one ends, the agent stops (and is
    // restarted) instead of heartbeating while it applies or reports nothing.
    let supervisor = Supervisor::new(shutdown.child_token());
    let shutdown = supervisor.stop().clone();
    let metrics = AgentMetrics::default();
    let mut prometheus = Registry::default();
    metrics.register(&mut prometheus);
    let readiness = Readiness::default();
    let ops = ops::serve(
        args.ops_listen,
        Arc::new(prometheus),
        readiness.clone(),
        Router::new(),
        shutdown.clone(),
    )
    .await?;

    let client = kedge_net::kube_client::client(args.kubeconfig.as_deref())
        .await
        .map_err(|e| Error::Kube(e.to_string()))?;
    let policy = args.policy();
    if policy.namespaces == NamespacePolicy::All {
        warn!(
            "--all-namespaces: this agent acts in every namespace the hub names; \
            prefer --namespaces with RBAC limited to them"
        );
    }
    let kinds: Vec<String> = policy
        .kinds
        .kinds()
        .iter()
        .map(ToString::to_string)
        .collect();
    let namespaces = policy
        .namespaces
        .namespaces()
        .map_or_else(|| "all".to_owned(), |n| n.join(","));
    info!(%namespaces, kinds = %kinds.join(","),
        "policy: commands outside these namespaces and kinds are refused");
    let executor = Arc::new(Executor::new(client, policy.clone()));
    let mut link = link::start(
        executor.clone(),
        (args.report_interval, args.capacity_interval),
        args.watch_timeout,
        metrics.clone(),
        &supervisor,
    );

    let hubs = args.hubs();
    if hubs.is_empty() {
        return Err(Error::NoHub);
    }
    // With an enrolled identity: the last bootstrap token (its hash) the hub refused.
    let (files_config, managed, mut refused_token) = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let material = TlsMaterial::from_files(cert, key, &args.tls_ca)?;
            let config =
                tls::client_config(material, TransportTuning::agent(), kedge_protocol::ALPN)?;
            (Some(config), None, None)
        }
        _ => match obtain_identity(&args, executor.client().clone(), &hubs, &shutdown).await? {
            Some((identity, refused)) => (None, Some(identity), refused),
            None => return Ok(()),
        },
    };
    let params = SessionParams {
        // The hub reads an empty list as every namespace.
        namespaces: policy
            .namespaces
            .namespaces()
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
        heartbeat_tolerance: args.heartbeat_tolerance,
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        executor,
        identity: managed.clone(),
    };
    info!(hubs = ?hubs, ops = %ops.local_addr, version = env!("CARGO_PKG_VERSION"),
        "kedge-agent starting");

    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(args.reconnect_initial)
        .with_max_interval(args.reconnect_max)
        .with_multiplier(2.0)
        .with_randomization_factor(0.5)
        .with_max_elapsed_time(None)
        .build();
    // The short pause between hubs: the initial reconnect delay, jittered, never growing.
    let mut short = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(args.reconnect_initial)
        .with_max_interval(args.reconnect_initial)
        .with_multiplier(1.0)
        .with_randomization_factor(0.5)
        .with_max_elapsed_time(None)
        .build();
    let mut rotation = Rotation::new(hubs.len());
    let mut endpoint: Option<quinn::Endpoint> = None;
    // Dials that failed in a row: the handshake timeout grows with them.
    let mut failed_dials: u32 = 0;
    loop {
        let hub = &hubs[rotation.current()];
        let client_config = match (&files_config, &managed) {
            (Some(config), _) => config.clone(),
            (None, Some(identity)) => {
                if identity.current().validity.not_after <= time::OffsetDateTime::now_utc() {
                    let member = identity.current().member;
                    return Err(identity::re_enroll(
                        &member,
                        "the client certificate expired without renewal",
                    ));
                }
                identity.client_config()?
            }
            (None, None) => return Err(Error::NoHub),
        };
        let dial = Dial {
            hub: hub.clone(),
            server_name: args.server_name(hub),
            alternatives: hubs.len() > 1,
            // While a hub restarts, a dial nobody answers found no hub bound yet, not a
            // slow link: the next one keeps the short handshake timeout.
            failed_before: if rotation.restarting(std::time::Instant::now()) {
                0
            } else {
                failed_dials
            },
        };
        let attempt = session::connect_and_serve(
            &dial,
            &client_config,
            &params,
            &mut link,
            &mut endpoint,
            &shutdown,
        )
        .await;
        link.session_ended();
        readiness.set(false);
        metrics.connected.set(0);
        let ended = match attempt {
            Ok(SessionEnd::Shutdown) => break,
            Ok(SessionEnd::Lost {
                reason,
                established,
                going_away,
            }) => {
                warn!(%hub, %reason, "session with the hub lost; reconnecting");
                if established {
                    failed_dials = 0;
                    if going_away {
                        Attempt::GoingAway
                    } else {
                        Attempt::SessionEnded
                    }
                } else {
                    failed_dials = failed_dials.saturating_add(1);
                    Attempt::Failed
                }
            }
            Err(Error::Refused {
                code: RefusalCode::Unavailable,
                message,
            }) => {
                info!(%hub, %message, "hub unavailable; trying the next address");
                // It answered: the handshake timeout is not what failed.
                failed_dials = 0;
                Attempt::Unavailable
            }
            Err(e @ Error::Refused { code, .. }) => {
                warn!(%hub, error = %e, "hub refused the session; will retry");
                failed_dials = 0;
                if let Some(identity) = &managed {
                    let again = tokio::select! {
                        _ = shutdown.cancelled() => break,
                        again = enroll_again(&args, identity, code, hub, &mut refused_token) => again,
                    };
                    if again {
                        // The same hub issued the new identity: dial it at once.
                        backoff.reset();
                        continue;
                    }
                }
                Attempt::Failed
            }
            Err(e) => {
                warn!(%hub, error = %e, "cannot reach the hub; will retry");
                // A hub that closed the attempt (a stopping hub refuses connections) answered:
                // only silence makes the next handshake wait longer.
                failed_dials = if hub_answered(&e) {
                    0
                } else {
                    failed_dials.saturating_add(1)
                };
                Attempt::Failed
            }
        };
        let delay = match rotation.after(ended, std::time::Instant::now()) {
            Pause::Short => short.next_backoff(),
            Pause::Backoff { reset } => {
                if reset {
                    backoff.reset();
                }
                backoff.next_backoff()
            }
        }
        .unwrap_or(args.reconnect_max);
        info!(next = %hubs[rotation.current()],
            delay = %humantime::format_duration(std::time::Duration::from_millis(delay.as_millis() as u64)),
            "reconnecting after a pause");
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    if let Some(endpoint) = endpoint {
        endpoint.close(
            quinn::VarInt::from_u32(kedge_protocol::close_code::SHUTDOWN),
            b"agent shutting down",
        );
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), endpoint.wait_idle()).await;
    }
    let _ = ops.task.await;
    if let Some(why) = supervisor.failure() {
        return Err(Error::TaskEnded(why));
    }
    info!("kedge-agent stopped");
    Ok(())
}

/// Whether a failed dial was answered by the hub (it closed or reset the connection) rather
/// than left without an answer.
fn hub_answered(error: &Error) -> bool {
    matches!(
        error,
        Error::Connection(
            quinn::ConnectionError::ConnectionClosed(_)
                | quinn::ConnectionError::ApplicationClosed(_)
                | quinn::ConnectionError::Reset
        )
    )
}

#[cfg(test)]
mod dial_tests {
    use super::*;

    #[test]
    fn a_refusal_is_an_answer_and_silence_is_not() {
        let refused = quinn::ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::CONNECTION_REFUSED,
            frame_type: None,
            reason: Default::default(),
        });
        assert!(hub_answered(&Error::Connection(refused)));
        assert!(hub_answered(&Error::Connection(
            quinn::ConnectionError::Reset
        )));
        assert!(!hub_answered(&Error::Connection(
            quinn::ConnectionError::TimedOut
        )));
        assert!(!hub_answered(&Error::Timeout("the TLS handshake")));
    }
}
