//! At most one active hub: leader election over a `coordination.k8s.io/v1` Lease in the hub
//! cluster.
//!
//! kube-rs has no elector, so this is a small one in the manner of client-go's
//! `leaderelection`: every candidate reads the Lease each retry period; the holder renews it,
//! the others take it over once `renewTime + leaseDurationSeconds` lies in the past. Every
//! write carries the `resourceVersion` that was read, so of two candidates writing at once
//! the API server lets one win and answers the other 409.
//!
//! The decisions ([`verdict`], [`claim`], [`Role::refusal`]) are pure functions of the Lease,
//! the candidate and the time; [`Elector`] only reads, writes and sleeps.
//!
//! Expiry compares the holder's `renewTime` with the reader's clock, so hub replicas must
//! agree on the time to well within the lease duration (NTP-synchronised nodes do).

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::{Error, Result};

/// Which Lease and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Name of the Lease.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// `leaseDurationSeconds`: how long a holder that stopped renewing keeps the lease. Whole
    /// seconds, at least one.
    pub duration: Duration,
    /// This candidate's `holderIdentity`.
    pub identity: String,
    /// Where the other replicas relay their agents' sessions while this candidate holds the
    /// Lease (`--sharding`): published in the annotation [`RELAY_ADDRESS_ANNOTATION`].
    pub relay_address: Option<SocketAddr>,
}

/// Annotation of the Lease naming where the holder takes relayed sessions (`--sharding`).
pub const RELAY_ADDRESS_ANNOTATION: &str = "kedge.dev/relay-address";

/// Longest wait for each of the two calls that release the Lease on shutdown.
const STEP_DOWN_CALL: Duration = Duration::from_millis(1500);

impl LeaseConfig {
    /// How often the Lease is read (by a standby) and renewed (by the holder): a third of the
    /// duration, so a holder has two more chances before its lease runs out.
    pub fn retry_period(&self) -> Duration {
        self.duration / 3
    }

    /// How long the holder keeps acting without a successful renewal: two thirds of the
    /// duration. It gives up a third of the duration before a standby may take over, so the
    /// two never act at once even when the holder cannot reach the API server.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// A `holderIdentity` unique to this process: `base` (the pod name or host name) plus the pid
/// and random bits, so two hubs on one host, or a restarted hub, never pass for each other.
pub fn identity(base: Option<String>) -> String {
    let base = base
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "kedge-hub".to_owned());
    // A std hasher seeded per process: random bits without a dependency on `rand`.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{base}_{}-{:06x}", std::process::id(), random & 0xff_ffff)
}

/// What this hub does, as published by the [`Elector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Another hub holds the lease (or nobody could be asked yet): no controllers, no sessions.
    Standby {
        /// The current holder, when known.
        holder: Option<String>,
        /// Where the holder takes relayed sessions, when it publishes that (`--sharding`).
        relay: Option<SocketAddr>,
    },
    /// This hub holds the lease: it runs the controllers and accepts sessions, until `until`
    /// (its renewal deadline; `None` without a lease). Past it the hub no longer counts as the
    /// leader even before its elector gets to say so: a starved elector task must not let two
    /// hubs act at once.
    Leader {
        /// The renewal deadline of the last successful renewal.
        until: Option<Instant>,
    },
    /// This hub held the lease and lost it: it must stop acting at once.
    Lost {
        /// Why.
        reason: String,
    },
}

impl Role {
    /// The leader of a hub without a lease: it leads for as long as it runs.
    pub const ALONE: Role = Role::Leader { until: None };

    /// Whether this hub may act now.
    pub fn is_leader(&self) -> bool {
        self.is_leader_at(Instant::now())
    }

    /// Whether this hub may act at `now`.
    pub fn is_leader_at(&self, now: Instant) -> bool {
        matches!(self, Role::Leader { until } if until.is_none_or(|until| now < until))
    }

    /// A standby that knows where the active hub takes relayed sessions: that address.
    pub fn relay(&self) -> Option<SocketAddr> {
        match self {
            Role::Standby { relay, .. } => *relay,
            _ => None,
        }
    }

    /// A standby that knows no active hub yet.
    pub const WAITING: Role = Role::Standby {
        holder: None,
        relay: None,
    };

    /// Why an agent session is refused in this role (retryable: the agent moves on to its
    /// next hub address); `None` for the leader.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Role::Leader { .. } if self.is_leader() => None,
            Role::Leader { .. } => {
                Some("this hub's lease renewal is overdue; it is stepping down; retry".to_owned())
            }
            Role::Standby {
                holder: Some(holder),
                ..
            } => Some(format!(
                "this hub is a standby; the active hub is {holder}; retry"
            )),
            Role::Standby { holder: None, .. } => {
                Some("this hub is a standby; no hub is active yet; retry".to_owned())
            }
            Role::Lost { .. } => Some("this hub lost its lease and is stopping; retry".to_owned()),
        }
    }
}

/// What a Lease means to one candidate at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The candidate holds it: renew.
    Mine,
    /// Another candidate holds it and renewed it recently enough: stand by.
    Held {
        /// The holder.
        holder: String,
    },
    /// Nobody holds it, or its holder let it expire: take it over.
    Free {
        /// The holder that let it expire.
        previous: Option<String>,
    },
}

/// Who may hold the Lease with `spec` at `now`, as seen by candidate `me`.
///
/// A lease without `renewTime` or with a duration below one second counts as expired: a
/// holder that writes neither cannot be waited for.
pub fn verdict(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Verdict {
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Verdict::Free { previous: None };
    };
    // Our own lease, even an expired one: nobody took it over, so renewing is safe and no
    // transition happened.
    if holder == me {
        return Verdict::Mine;
    }
    let expires = spec.and_then(|s| {
        let renewed = s.renew_time.as_ref()?.0;
        let seconds = s.lease_duration_seconds.filter(|d| *d > 0)?;
        renewed
            .checked_add(SignedDuration::from_secs(i64::from(seconds)))
            .ok()
    });
    match expires {
        Some(expires) if expires >= now => Verdict::Held {
            holder: holder.to_owned(),
        },
        _ => Verdict::Free {
            previous: Some(holder.to_owned()),
        },
    }
}

/// The spec `me` writes to renew (`verdict` [`Verdict::Mine`]) or take over
/// ([`Verdict::Free`]) the Lease whose spec is `current`, at `now`. A takeover from another
/// holder counts one more `leaseTransitions`.
pub fn claim(
    current: Option<&LeaseSpec>,
    me: &str,
    duration_seconds: i32,
    now: Timestamp,
) -> LeaseSpec {
    let current = current.cloned().unwrap_or_default();
    let renewing = current.holder_identity.as_deref() == Some(me);
    let transitions = current.lease_transitions.unwrap_or(0);
    let taken_from_another = current
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty() && h != me);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: if renewing {
            current.acquire_time.or(Some(MicroTime(now)))
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if taken_from_another {
            transitions.saturating_add(1)
        } else {
            transitions
        }),
        ..current
    }
}

/// The spec a holder writes when it steps down: no holder, so a standby takes over at its next
/// read instead of waiting for the lease to expire.
pub fn release(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..current.clone()
    }
}

/// The outcome of one read-and-write round.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Round {
    /// The lease is ours (acquired or renewed).
    Held,
    /// Another candidate holds it, or won the race to write it.
    Other {
        holder: Option<String>,
        relay: Option<SocketAddr>,
    },
}

/// The relay address the holder of a Lease with `metadata` publishes, if it is one.
pub fn relay_address(metadata: &ObjectMeta) -> Option<SocketAddr> {
    metadata
        .annotations
        .as_ref()?
        .get(RELAY_ADDRESS_ANNOTATION)?
        .parse()
        .ok()
}

fn is_conflict(error: &kube::Error) -> bool {
    // 409 is both AlreadyExists (a create lost) and Conflict (a stale resourceVersion).
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Runs the election for one candidate.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// A candidate for the Lease `config` names in the cluster of `client`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// Starts electing and publishes the role on `role`. The task runs until the role is
    /// [`Role::Lost`] or `release` is cancelled, and then steps down if it holds the lease.
    pub fn start(self, role: watch::Sender<Role>, release: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(self.run(role, release))
    }

    async fn run(self, tx: watch::Sender<Role>, release: CancellationToken) {
        let period = self.config.retry_period();
        let deadline_after = self.config.renew_deadline();
        info!(lease = %self.config.name, namespace = %self.config.namespace,
            identity = %self.config.identity, duration = ?self.config.duration, "leader election started");
        // While leading: the latest time this hub may still act without a renewal.
        let mut acting_until: Option<Instant> = None;
        loop {
            let started = Instant::now();
            let round = tokio::select! {
                round = self.round() => round,
                _ = sleep_until(acting_until.unwrap_or(started)), if acting_until.is_some() => {
                    Err(Error::Timeout { what: "Lease renewal" })
                }
            };
            match round {
                Ok(Round::Held) => {
                    // Counted from before the write: the API server's renewTime is no earlier.
                    let until = started + deadline_after;
                    acting_until = Some(until);
                    if !matches!(*tx.borrow(), Role::Leader { .. }) {
                        info!(identity = %self.config.identity, "acquired the lease; this hub is active");
                    }
                    // Every renewal moves the deadline the role carries.
                    tx.send_replace(Role::Leader { until: Some(until) });
                }
                Ok(Round::Other { holder, relay }) => {
                    if acting_until.is_some() {
                        let reason = format!(
                            "the lease is held by {}",
                            holder.as_deref().unwrap_or("another hub")
                        );
                        return self.lose(&tx, reason);
                    }
                    let role = Role::Standby { holder, relay };
                    if *tx.borrow() != role {
                        info!(holder = ?role, "standing by");
                        tx.send_replace(role);
                    }
                }
                Err(e) => match acting_until {
                    Some(until) if Instant::now() >= until => {
                        let reason =
                            format!("cannot renew the lease within {deadline_after:?}: {e}");
                        return self.lose(&tx, reason);
                    }
                    Some(_) => warn!(error = %e, "cannot renew the lease; retrying"),
                    None => warn!(error = %e, lease = %self.config.name,
                        namespace = %self.config.namespace,
                        "cannot read or claim the lease; retrying (does the namespace exist, and may the hub's service account get, create and update leases there? --lease-namespace picks another)"),
                },
            }
            // The next round after one period, but never past the deadline of the holder.
            let next = started + period;
            let wake = acting_until.map_or(next, |until| next.min(until));
            tokio::select! {
                _ = release.cancelled() => {
                    if acting_until.is_some() {
                        // No longer the leader before a standby can take the lease.
                        tx.send_replace(Role::WAITING);
                        self.step_down().await;
                    }
                    return;
                }
                _ = sleep_until(wake) => {}
            }
        }
    }

    fn lose(&self, tx: &watch::Sender<Role>, reason: String) {
        error!(%reason, identity = %self.config.identity, "lost the lease; this hub stops acting");
        tx.send_replace(Role::Lost { reason });
    }

    /// Reads the Lease and creates, renews or takes it over, or learns who holds it.
    async fn round(&self) -> Result<Round> {
        let limit = self.config.retry_period();
        let bounded = |what: &'static str| move |_| Error::Timeout { what };
        let me = &self.config.identity;
        let current = timeout(limit, self.api.get_opt(&self.config.name))
            .await
            .map_err(bounded("read Lease"))??;
        let now = Timestamp::now();
        let seconds = self.config.duration_seconds();
        let Some(lease) = current else {
            let lease = Lease {
                metadata: self.annotated(ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                }),
                spec: Some(claim(None, me, seconds, now)),
            };
            return match timeout(limit, self.api.create(&PostParams::default(), &lease))
                .await
                .map_err(bounded("create Lease"))?
            {
                Ok(_) => Ok(Round::Held),
                Err(e) if is_conflict(&e) => Ok(Round::Other {
                    holder: None,
                    relay: None,
                }),
                Err(e) => Err(e.into()),
            };
        };
        match verdict(lease.spec.as_ref(), me, now) {
            Verdict::Held { holder } => Ok(Round::Other {
                holder: Some(holder),
                relay: relay_address(&lease.metadata),
            }),
            verdict @ (Verdict::Mine | Verdict::Free { .. }) => {
                if let Verdict::Free { previous } = verdict {
                    debug!(?previous, "the lease is free; taking it over");
                }
                let updated = Lease {
                    spec: Some(claim(lease.spec.as_ref(), me, seconds, now)),
                    // Keeps the resourceVersion that was read: a concurrent writer makes this 409.
                    metadata: self.annotated(lease.metadata),
                };
                match timeout(
                    limit,
                    self.api
                        .replace(&self.config.name, &PostParams::default(), &updated),
                )
                .await
                .map_err(bounded("update Lease"))?
                {
                    Ok(_) => Ok(Round::Held),
                    Err(e) if is_conflict(&e) => Ok(Round::Other {
                        holder: None,
                        relay: None,
                    }),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// `metadata` with this candidate's relay address as the holder's, or none.
    fn annotated(&self, mut metadata: ObjectMeta) -> ObjectMeta {
        let annotations = metadata.annotations.get_or_insert_with(Default::default);
        match self.config.relay_address {
            Some(address) => {
                annotations.insert(RELAY_ADDRESS_ANNOTATION.to_owned(), address.to_string());
            }
            None => {
                annotations.remove(RELAY_ADDRESS_ANNOTATION);
            }
        }
        metadata
    }

    /// Gives the lease up so a standby need not wait for it to expire. Best effort: if the
    /// write fails the lease simply expires.
    async fn step_down(&self) {
        // Both calls within a bound a SIGTERM's grace period holds, whatever the duration.
        let limit = self.config.retry_period().min(STEP_DOWN_CALL);
        let Ok(Ok(Some(lease))) = timeout(limit, self.api.get_opt(&self.config.name)).await else {
            return;
        };
        let Some(spec) = lease.spec.as_ref() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let released = Lease {
            spec: Some(release(spec, Timestamp::now())),
            metadata: lease.metadata.clone(),
        };
        match timeout(
            limit,
            self.api
                .replace(&self.config.name, &PostParams::default(), &released),
        )
        .await
        {
            Ok(Ok(_)) => info!("released the lease"),
            Ok(Err(e)) => warn!(error = %e, "cannot release the lease; it expires instead"),
            Err(_) => warn!("releasing the lease timed out; it expires instead"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn spec(holder: Option<&str>, renewed: Option<i64>, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|s| MicroTime(at(s))),
            acquire_time: renewed.map(|s| MicroTime(at(s))),
            lease_duration_seconds: duration,
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    #[test]
    fn verdicts() {
        let free = |previous: Option<&str>| Verdict::Free {
            previous: previous.map(str::to_owned),
        };
        let held = |holder: &str| Verdict::Held {
            holder: holder.to_owned(),
        };
        let cases: Vec<(&str, Option<LeaseSpec>, i64, Verdict)> = vec![
            ("no spec", None, 100, free(None)),
            (
                "no holder",
                Some(spec(None, Some(100), Some(15))),
                100,
                free(None),
            ),
            (
                "empty holder",
                Some(spec(Some(""), Some(100), Some(15))),
                100,
                free(None),
            ),
            (
                "mine",
                Some(spec(Some("me"), Some(100), Some(15))),
                105,
                Verdict::Mine,
            ),
            (
                "mine, expired",
                Some(spec(Some("me"), Some(100), Some(15))),
                200,
                Verdict::Mine,
            ),
            (
                "other, fresh",
                Some(spec(Some("b"), Some(100), Some(15))),
                110,
                held("b"),
            ),
            (
                "other, at expiry",
                Some(spec(Some("b"), Some(100), Some(15))),
                115,
                held("b"),
            ),
            (
                "other, expired",
                Some(spec(Some("b"), Some(100), Some(15))),
                116,
                free(Some("b")),
            ),
            (
                "other, no renewTime",
                Some(spec(Some("b"), None, Some(15))),
                100,
                free(Some("b")),
            ),
            (
                "other, no duration",
                Some(spec(Some("b"), Some(100), None)),
                100,
                free(Some("b")),
            ),
            (
                "other, zero duration",
                Some(spec(Some("b"), Some(100), Some(0))),
                100,
                free(Some("b")),
            ),
            (
                "clock behind renewTime",
                Some(spec(Some("b"), Some(100), Some(2))),
                90,
                held("b"),
            ),
        ];
        for (name, spec, now, want) in cases {
            assert_eq!(verdict(spec.as_ref(), "me", at(now)), want, "{name}");
        }
    }

    #[test]
    fn claims() {
        // (case, current, now, holder, acquireTime, renewTime, transitions)
        let cases: Vec<(&str, Option<LeaseSpec>, i64, i64, i32)> = vec![
            ("create", None, 50, 50, 0),
            (
                "renew keeps acquireTime",
                Some(spec(Some("me"), Some(40), Some(15))),
                50,
                40,
                3,
            ),
            (
                "take over from another",
                Some(spec(Some("b"), Some(10), Some(15))),
                50,
                50,
                4,
            ),
            (
                "take over a released lease",
                Some(spec(None, Some(10), Some(1))),
                50,
                50,
                3,
            ),
        ];
        for (name, current, now, acquired, transitions) in cases {
            let got = claim(current.as_ref(), "me", 7, at(now));
            assert_eq!(got.holder_identity.as_deref(), Some("me"), "{name}");
            assert_eq!(got.lease_duration_seconds, Some(7), "{name}");
            assert_eq!(got.renew_time, Some(MicroTime(at(now))), "{name}");
            assert_eq!(got.acquire_time, Some(MicroTime(at(acquired))), "{name}");
            assert_eq!(got.lease_transitions, Some(transitions), "{name}");
            // What was claimed is ours until it expires, and nobody else's.
            assert_eq!(
                verdict(Some(&got), "me", at(now + 7)),
                Verdict::Mine,
                "{name}"
            );
            assert_eq!(
                verdict(Some(&got), "other", at(now + 7)),
                Verdict::Held {
                    holder: "me".into()
                },
                "{name}"
            );
            assert!(
                matches!(
                    verdict(Some(&got), "other", at(now + 8)),
                    Verdict::Free { .. }
                ),
                "{name}"
            );
        }
    }

    #[test]
    fn a_released_lease_is_free_at_once_and_keeps_its_history() {
        let held = claim(Some(&spec(Some("b"), Some(10), Some(15))), "me", 15, at(50));
        let released = release(&held, at(60));
        assert_eq!(
            verdict(Some(&released), "other", at(60)),
            Verdict::Free { previous: None }
        );
        assert_eq!(released.lease_transitions, Some(4));
        assert_eq!(released.acquire_time, held.acquire_time);
    }

    #[test]
    fn refusals_name_the_holder() {
        assert_eq!(Role::ALONE.refusal(), None);
        let now = Instant::now();
        let leading = Role::Leader {
            until: Some(now + Duration::from_secs(1)),
        };
        assert!(leading.is_leader_at(now));
        assert!(!leading.is_leader_at(now + Duration::from_secs(1)));
        assert!(Role::ALONE.is_leader_at(now + Duration::from_secs(3600)));
        let overdue = Role::Leader {
            until: Some(now - Duration::from_millis(1)),
        };
        assert!(overdue.refusal().unwrap().contains("overdue"));
        let standby = Role::Standby {
            holder: Some("hub-a_12-abcdef".into()),
            relay: None,
        };
        assert_eq!(
            standby.refusal().unwrap(),
            "this hub is a standby; the active hub is hub-a_12-abcdef; retry"
        );
        assert!(
            Role::WAITING
                .refusal()
                .unwrap()
                .contains("no hub is active yet")
        );
        assert!(Role::Lost { reason: "x".into() }.refusal().is_some());
    }

    #[test]
    fn a_standby_learns_the_relay_address_from_the_lease() {
        let mut metadata = ObjectMeta::default();
        assert_eq!(relay_address(&metadata), None);
        metadata.annotations = Some(
            [(
                RELAY_ADDRESS_ANNOTATION.to_owned(),
                "10.0.0.7:7443".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            relay_address(&metadata),
            Some("10.0.0.7:7443".parse().unwrap())
        );
        // Anything else is no address: the standby refuses instead of relaying.
        for bad in ["", "hub:7443", "10.0.0.7", "[::1]:99999"] {
            metadata.annotations =
                Some([(RELAY_ADDRESS_ANNOTATION.to_owned(), bad.to_owned())].into());
            assert_eq!(relay_address(&metadata), None, "{bad}");
        }
        let standby = Role::Standby {
            holder: Some("a".into()),
            relay: Some("10.0.0.7:7443".parse().unwrap()),
        };
        assert_eq!(standby.relay(), Some("10.0.0.7:7443".parse().unwrap()));
        assert_eq!(Role::ALONE.relay(), None);
    }

    #[test]
    fn periods_leave_the_holder_time_to_stop_before_a_takeover() {
        let config = LeaseConfig {
            name: "kedge-hub".into(),
            namespace: "kedge-system".into(),
            duration: Duration::from_secs(15),
            identity: "me".into(),
            relay_address: None,
        };
        assert_eq!(config.retry_period(), Duration::from_secs(5));
        assert_eq!(config.renew_deadline(), Duration::from_secs(10));
        assert_eq!(config.duration_seconds(), 15);
    }

    #[test]
    fn identities_differ_per_process_and_call() {
        let a = identity(Some("hub-0".into()));
        let b = identity(Some("hub-0".into()));
        assert!(
            a.starts_with(&format!("hub-0_{}-", std::process::id())),
            "{a}"
        );
        assert_ne!(a, b);
        assert!(identity(None).starts_with("kedge-hub_"));
        assert!(identity(Some(String::new())).starts_with("kedge-hub_"));
    }
}
