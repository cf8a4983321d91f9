//! Handshake and session budgets.
//!
//! Who may take the hub's time: a budget of handshakes in progress (TLS, then `Hello` or the
//! enrollment request), overall and per source address, separate from the budget of
//! established sessions. Three rules keep it fair:
//!
//! - **Per source**: one address (an IPv4 address or an IPv6 /64) holds at most
//!   `--max-handshakes-per-source` handshakes.
//! - **A reserve for known sources**: `--handshake-reserve` of the permits are only for
//!   sources that held an authenticated session in the last [`KNOWN_FOR`]; strangers share the
//!   rest. Sources are admitted only after QUIC address validation (a Retry), so a source
//!   cannot be spoofed into the reserve.
//! - **Stale handshakes make room**: a handshake that has not proven a member identity (TLS
//!   not finished, or an enrollment connection) and is older than [`EVICT_AFTER`] is closed
//!   when a newer attempt needs its permit. Peers that stall therefore hold nothing a newcomer
//!   needs: an agent's handshake finishes in a few round trips, long before it could be
//!   evicted, and once its certificate is verified it is never evicted.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a connection or session was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// `--max-handshakes` handshakes are in progress.
    #[error("{limit} handshakes are in progress (--max-handshakes)")]
    Handshakes {
        /// The limit.
        limit: usize,
    },
    /// `--max-handshakes-per-source` handshakes from this address are in progress.
    #[error("{limit} handshakes from this address are in progress (--max-handshakes-per-source)")]
    SourceHandshakes {
        /// The limit.
        limit: usize,
    },
    /// The handshakes strangers may hold are in progress: the rest is reserved for sources
    /// that held a session lately.
    #[error(
        "{limit} handshakes from sources without a recent session are in progress (--max-handshakes minus the {reserved} of --handshake-reserve)"
    )]
    StrangerHandshakes {
        /// The limit.
        limit: usize,
        /// The reserve.
        reserved: usize,
    },
    /// Enrollment connections waiting for their request: their budget is spent.
    #[error("{limit} enrollment connections are waiting for their request; retry later")]
    Enrollments {
        /// The limit.
        limit: usize,
    },
    /// Enrollment connections from this address waiting for their request: their budget is
    /// spent.
    #[error("{limit} enrollment connections from this address are waiting for their request")]
    SourceEnrollments {
        /// The limit.
        limit: usize,
    },
    /// `--max-connections` sessions are established.
    #[error("the hub serves its maximum of {limit} sessions (--max-connections); retry later")]
    Sessions {
        /// The limit.
        limit: usize,
    },
}

impl Refused {
    /// A short stable label for metrics and audit lines.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Handshakes { .. } => "handshake_limit",
            Self::SourceHandshakes { .. } => "source_handshake_limit",
            Self::StrangerHandshakes { .. } => "stranger_handshake_limit",
            Self::Enrollments { .. } => "enrollment_limit",
            Self::SourceEnrollments { .. } => "source_enrollment_limit",
            Self::Sessions { .. } => "session_limit",
        }
    }
}

/// At most one log line per interval for a flood of the same event: a peer hammering a full
/// budget must not turn each refused attempt into a line on disk (the metrics count all).
#[derive(Debug)]
pub struct LogThrottle {
    interval: std::time::Duration,
    state: Mutex<HashMap<&'static str, (Option<tokio::time::Instant>, u64)>>,
}

impl LogThrottle {
    /// One line per `interval` per reason.
    pub fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            state: Mutex::new(HashMap::new()),
        }
    }

    /// Whether to log an event of `reason` at `now`: `Some(n)` with the `n` events not
    /// logged since the last line, `None` to stay silent.
    pub fn admit(&self, reason: &'static str, now: tokio::time::Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (last, suppressed) = state.entry(reason).or_insert((None, 0));
        match last {
            Some(at) if now.saturating_duration_since(*at) < self.interval => {
                *suppressed += 1;
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(suppressed))
            }
        }
    }
}

/// How long a source counts as known after its last authenticated session.
pub const KNOWN_FOR: Duration = Duration::from_secs(24 * 3600);

/// Age from which an unauthenticated handshake may be closed to admit a newer attempt: an
/// agent's TLS handshake takes a few round trips after address validation (well under a
/// second on any usable link), so only a stalled or hopelessly slow one is this old.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// Limits of the handshake budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Handshakes in progress overall (`--max-handshakes`).
    pub max: usize,
    /// Handshakes in progress from one source (`--max-handshakes-per-source`).
    pub per_source: usize,
    /// Of `max`, the permits only known sources may take (`--handshake-reserve`).
    pub reserved: usize,
    /// Age from which an unauthenticated handshake may be evicted.
    pub evict_after: Duration,
}

impl HandshakeLimits {
    /// Limits with the default reserve (a quarter of `max`) and [`EVICT_AFTER`].
    pub fn new(max: usize, per_source: usize) -> Self {
        Self {
            max,
            per_source,
            reserved: default_reserve(max),
            evict_after: EVICT_AFTER,
        }
    }

    fn for_strangers(&self) -> usize {
        self.max.saturating_sub(self.reserved)
    }
}

/// The default `--handshake-reserve`: a quarter of `--max-handshakes`.
pub fn default_reserve(max: usize) -> usize {
    max / 4
}

/// Which class of the budget a permit was taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Stranger,
    Known,
}

#[derive(Debug)]
struct Live {
    source: IpAddr,
    started: Instant,
    class: Class,
    /// Still evictable: the peer has not proven a member identity.
    unproven: bool,
    evict: CancellationToken,
}

type Queue = BTreeSet<(Instant, u64)>;

/// Handshakes in progress. Every map is bounded by the handshakes in progress, except
/// `known`, bounded by its capacity.
#[derive(Debug, Default)]
struct Handshakes {
    next_id: u64,
    live: HashMap<u64, Live>,
    per_source: HashMap<IpAddr, usize>,
    strangers: usize,
    /// Unproven handshakes, oldest first: of strangers, of known sources, and per source.
    unproven_strangers: Queue,
    unproven_known: Queue,
    unproven_by_source: HashMap<IpAddr, Queue>,
    known: KnownSources,
}

impl Handshakes {
    fn queue(&mut self, class: Class) -> &mut Queue {
        match class {
            Class::Stranger => &mut self.unproven_strangers,
            Class::Known => &mut self.unproven_known,
        }
    }

    /// Takes `id` out of the eviction queues; it still counts against the budget.
    fn prove(&mut self, id: u64) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if !std::mem::take(&mut live.unproven) {
            return;
        }
        let (key, class, source) = ((live.started, id), live.class, live.source);
        self.queue(class).remove(&key);
        if let Some(queue) = self.unproven_by_source.get_mut(&source) {
            queue.remove(&key);
            if queue.is_empty() {
                self.unproven_by_source.remove(&source);
            }
        }
    }

    /// Forgets `id`; its holder, if evicted, is told through its token.
    fn remove(&mut self, id: u64) -> Option<Live> {
        self.prove(id);
        let live = self.live.remove(&id)?;
        if let Some(count) = self.per_source.get_mut(&live.source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                // Forget idle sources, so the map holds at most one entry per handshake.
                self.per_source.remove(&live.source);
            }
        }
        if live.class == Class::Stranger {
            self.strangers = self.strangers.saturating_sub(1);
        }
        Some(live)
    }

    fn count_from(&self, source: IpAddr) -> usize {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// The limit a new handshake from `source` of `class` would exceed, if any.
    fn exceeded(&self, limits: &HandshakeLimits, source: IpAddr, class: Class) -> Option<Refused> {
        if self.count_from(source) >= limits.per_source {
            return Some(Refused::SourceHandshakes {
                limit: limits.per_source,
            });
        }
        if self.live.len() >= limits.max {
            return Some(Refused::Handshakes { limit: limits.max });
        }
        if class == Class::Stranger && self.strangers >= limits.for_strangers() {
            return Some(Refused::StrangerHandshakes {
                limit: limits.for_strangers(),
                reserved: limits.reserved,
            });
        }
        None
    }

    /// The handshake to evict to get under `limit` for `source` of `class`, if any: always an
    /// unproven one at least `evict_after` old. For the per-source limit, the oldest of that
    /// source. For the overall limits, the oldest of the source holding the most handshakes,
    /// and only if it holds more than the newcomer's source would (or is that source): the
    /// heaviest source pays, and a crowd of agents each holding one handshake (a fleet
    /// reconnecting to a loaded hub) is refused as before rather than thrashed. A stranger
    /// only evicts strangers.
    fn victim(
        &self,
        limits: &HandshakeLimits,
        limit: Refused,
        source: IpAddr,
        class: Class,
        now: Instant,
    ) -> Option<u64> {
        let stale = |started: Instant| now.saturating_duration_since(started) >= limits.evict_after;
        let may_evict = |id: &u64| {
            class == Class::Known
                || self
                    .live
                    .get(id)
                    .is_some_and(|live| live.class == Class::Stranger)
        };
        // The oldest stale handshake of `queue` this newcomer may evict.
        let oldest = |queue: &Queue| {
            queue
                .iter()
                .take_while(|(started, _)| stale(*started))
                .find(|(_, id)| may_evict(id))
                .copied()
        };
        match limit {
            Refused::SourceHandshakes { .. } => self
                .unproven_by_source
                .get(&source)
                .and_then(oldest)
                .map(|(_, id)| id),
            Refused::Handshakes { .. } | Refused::StrangerHandshakes { .. } => {
                let mine = self.count_from(source);
                self.unproven_by_source
                    .iter()
                    .filter(|(other, _)| **other == source || self.count_from(**other) > mine + 1)
                    .filter_map(|(other, queue)| {
                        let (started, id) = oldest(queue)?;
                        Some((self.count_from(*other), std::cmp::Reverse(started), id))
                    })
                    .max()
                    .map(|(_, _, id)| id)
            }
            Refused::Enrollments { .. }
            | Refused::SourceEnrollments { .. }
            | Refused::Sessions { .. } => None,
        }
    }
}

/// Sources that held an authenticated session lately, at most `capacity` of them.
#[derive(Debug, Default)]
struct KnownSources {
    seen: HashMap<IpAddr, Instant>,
    capacity: usize,
}

impl KnownSources {
    fn contains(&self, source: IpAddr, now: Instant) -> bool {
        self.seen
            .get(&source)
            .is_some_and(|at| now.saturating_duration_since(*at) < KNOWN_FOR)
    }

    fn remember(&mut self, source: IpAddr, now: Instant) {
        if self.seen.len() >= self.capacity && !self.seen.contains_key(&source) {
            self.seen
                .retain(|_, at| now.saturating_duration_since(*at) < KNOWN_FOR);
            if self.seen.len() >= self.capacity {
                // Full of recent sources: the one seen longest ago makes room.
                let oldest = self.seen.iter().min_by_key(|(_, at)| **at).map(|(s, _)| *s);
                if let Some(oldest) = oldest {
                    self.seen.remove(&oldest);
                }
            }
        }
        if self.capacity > 0 {
            self.seen.insert(source, now);
        }
    }
}

/// A handshake admitted by [`Budget::handshake`].
#[derive(Debug)]
pub struct Admitted {
    /// Its permit.
    pub permit: HandshakePermit,
    /// Sources of the stale handshakes closed to make room for it.
    pub evicted: Vec<IpAddr>,
}

/// Enrollment connections (TLS done, no identity, request not yet read) the hub holds per
/// handshake permit: they cost memory only, the TLS work is done, so there is room for many
/// more than handshakes, and peers that stall after TLS do not take the handshakes agents
/// need (nor, by being closed early, make their owners open new handshakes at once).
pub const ENROLLMENTS_PER_HANDSHAKE: usize = 4;

/// The hub's handshake and session budgets.
#[derive(Debug)]
pub struct Budget {
    limits: HandshakeLimits,
    handshakes: Arc<Mutex<Handshakes>>,
    enrollment_limits: HandshakeLimits,
    enrollments: Arc<Mutex<Handshakes>>,
    sessions: Arc<Semaphore>,
    max_sessions: usize,
}

impl Budget {
    /// Budgets of handshakes within `limits` and of `max_sessions` established sessions; up to
    /// twice `max_sessions` (at least 1024) known sources are remembered.
    pub fn new(limits: HandshakeLimits, max_sessions: usize) -> Self {
        let handshakes = Handshakes {
            known: KnownSources {
                seen: HashMap::new(),
                capacity: max_sessions.saturating_mul(2).max(1024),
            },
            ..Handshakes::default()
        };
        let enrollment_limits = HandshakeLimits {
            max: limits.max.saturating_mul(ENROLLMENTS_PER_HANDSHAKE),
            per_source: limits.per_source.saturating_mul(ENROLLMENTS_PER_HANDSHAKE),
            reserved: 0,
            evict_after: limits.evict_after,
        };
        Self {
            limits,
            handshakes: Arc::new(Mutex::new(handshakes)),
            enrollment_limits,
            enrollments: Arc::new(Mutex::new(Handshakes::default())),
            sessions: Arc::new(Semaphore::new(max_sessions)),
            max_sessions,
        }
    }

    /// A permit for an enrollment connection from `address` that finished TLS at `now` and
    /// waits for its request; the caller then drops its handshake permit. Like
    /// [`Budget::handshake`], the oldest stale one of the source (or overall) makes room.
    pub fn enrollment(&self, address: IpAddr, now: Instant) -> Result<Admitted, Refused> {
        admit(
            &self.enrollments,
            &self.enrollment_limits,
            source_of(address),
            Class::Stranger,
            now,
        )
        .map_err(|refused| match refused {
            Refused::SourceHandshakes { limit } => Refused::SourceEnrollments { limit },
            _ => Refused::Enrollments {
                limit: self.enrollment_limits.max,
            },
        })
    }

    /// A handshake permit for a connection from `address` at `now`, released when dropped.
    /// When a limit is reached, stale unproven handshakes are evicted to make room (their
    /// holders see [`HandshakePermit::evicted`]); without one, the attempt is refused.
    pub fn handshake(&self, address: IpAddr, now: Instant) -> Result<Admitted, Refused> {
        let source = source_of(address);
        let class = if lock(&self.handshakes).known.contains(source, now) {
            Class::Known
        } else {
            Class::Stranger
        };
        admit(&self.handshakes, &self.limits, source, class, now)
    }

    /// Remembers that `address` held an authenticated session at `now`: for [`KNOWN_FOR`] its
    /// handshakes may take the reserve.
    pub fn remember(&self, address: IpAddr, now: Instant) {
        lock(&self.handshakes)
            .known
            .remember(source_of(address), now);
    }

    /// Whether `address` counts as known at `now`.
    pub fn is_known(&self, address: IpAddr, now: Instant) -> bool {
        lock(&self.handshakes)
            .known
            .contains(source_of(address), now)
    }

    /// A session permit, released when dropped.
    pub fn session(&self) -> Result<OwnedSemaphorePermit, Refused> {
        self.sessions
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.sessions_full())
    }

    /// A session permit, waiting for one to be released (a session being replaced) at most
    /// `limit`.
    pub async fn session_within(&self, limit: Duration) -> Result<OwnedSemaphorePermit, Refused> {
        match tokio::time::timeout(limit, self.sessions.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(self.sessions_full()),
        }
    }

    fn sessions_full(&self) -> Refused {
        Refused::Sessions {
            limit: self.max_sessions,
        }
    }

    /// Handshakes in progress from `address`'s source.
    pub fn handshakes_from(&self, address: IpAddr) -> usize {
        lock(&self.handshakes).count_from(source_of(address))
    }
}

/// Admits a handshake from `source` of `class` into `pool` within `limits`, evicting stale
/// unproven ones as needed.
fn admit(
    pool: &Arc<Mutex<Handshakes>>,
    limits: &HandshakeLimits,
    source: IpAddr,
    class: Class,
    now: Instant,
) -> Result<Admitted, Refused> {
    let mut state = lock(pool);
    let mut evicted = Vec::new();
    // Each round evicts one handshake or ends: at most one round per limit and a spare.
    for _ in 0..4 {
        let Some(limit) = state.exceeded(limits, source, class) else {
            break;
        };
        let victim = state.victim(limits, limit, source, class, now);
        let Some(live) = victim.and_then(|id| state.remove(id)) else {
            return Err(limit);
        };
        live.evict.cancel();
        evicted.push(live.source);
    }
    if let Some(limit) = state.exceeded(limits, source, class) {
        return Err(limit);
    }
    state.next_id += 1;
    let id = state.next_id;
    let evict = CancellationToken::new();
    let key = (now, id);
    state.queue(class).insert(key);
    state
        .unproven_by_source
        .entry(source)
        .or_default()
        .insert(key);
    *state.per_source.entry(source).or_insert(0) += 1;
    if class == Class::Stranger {
        state.strangers += 1;
    }
    state.live.insert(
        id,
        Live {
            source,
            started: now,
            class,
            unproven: true,
            evict: evict.clone(),
        },
    );
    Ok(Admitted {
        permit: HandshakePermit {
            id,
            evict,
            handshakes: pool.clone(),
        },
        evicted,
    })
}

/// The source an address counts against: an IPv4 address (also when it arrives as
/// IPv4-mapped IPv6), or an IPv6 /64 — one site's subnet, from which a single host can
/// draw any number of addresses.
pub fn source_of(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

fn lock(handshakes: &Mutex<Handshakes>) -> std::sync::MutexGuard<'_, Handshakes> {
    // Every update completes under the lock without panicking paths between its stores; a
    // poisoned lock holds no torn state.
    handshakes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A handshake in progress; dropping it returns its share of the handshake budget.
#[derive(Debug)]
pub struct HandshakePermit {
    id: u64,
    evict: CancellationToken,
    handshakes: Arc<Mutex<Handshakes>>,
}

impl HandshakePermit {
    /// Cancelled when the budget evicted this handshake for a newer attempt: its connection
    /// must be closed.
    pub fn evicted(&self) -> CancellationToken {
        self.evict.clone()
    }

    /// The peer proved a member identity (a verified client certificate): the handshake still
    /// counts until its `Hello`, but is no longer evicted.
    pub fn proven(&self) {
        lock(&self.handshakes).prove(self.id);
    }
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        lock(&self.handshakes).remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Limits without a reserve and without eviction (as before either existed).
    fn plain(max: usize, per_source: usize) -> HandshakeLimits {
        HandshakeLimits {
            max,
            per_source,
            reserved: 0,
            evict_after: Duration::from_secs(3600),
        }
    }

    fn admit(budget: &Budget, address: &str, now: Instant) -> Result<HandshakePermit, Refused> {
        budget.handshake(ip(address), now).map(|a| a.permit)
    }

    #[test]
    fn one_source_cannot_take_the_whole_handshake_budget() {
        let now = Instant::now();
        let budget = Budget::new(plain(4, 2), 10);
        let a1 = admit(&budget, "10.0.0.1", now).unwrap();
        let _a2 = admit(&budget, "10.0.0.1", now).unwrap();
        assert_eq!(
            admit(&budget, "10.0.0.1", now).unwrap_err(),
            Refused::SourceHandshakes { limit: 2 }
        );
        // The same address written as IPv4-mapped IPv6 is the same source.
        assert!(admit(&budget, "::ffff:10.0.0.1", now).is_err());
        let _b1 = admit(&budget, "10.0.0.2", now).unwrap();
        let _b2 = admit(&budget, "10.0.0.2", now).unwrap();
        // The overall budget is spent: a third source is refused, and not remembered.
        assert_eq!(
            admit(&budget, "10.0.0.3", now).unwrap_err(),
            Refused::Handshakes { limit: 4 }
        );
        assert_eq!(budget.handshakes_from(ip("10.0.0.3")), 0);
        // A finished handshake frees both budgets.
        drop(a1);
        assert_eq!(budget.handshakes_from(ip("10.0.0.1")), 1);
        let _c = admit(&budget, "10.0.0.3", now).unwrap();
    }

    #[test]
    fn a_stale_unproven_handshake_makes_room_a_fresh_or_proven_one_does_not() {
        let t0 = Instant::now();
        let limits = HandshakeLimits {
            evict_after: Duration::from_secs(1),
            ..plain(3, 2)
        };
        let budget = Budget::new(limits, 10);
        let old = admit(&budget, "10.0.0.1", t0).unwrap();
        let proven = admit(&budget, "10.0.0.1", t0).unwrap();
        proven.proven();
        // Per source: the fresh attempt of the same source waits for the stalled one to age.
        let half = t0 + Duration::from_millis(500);
        assert_eq!(
            admit(&budget, "10.0.0.1", half).unwrap_err(),
            Refused::SourceHandshakes { limit: 2 }
        );
        assert!(!old.evicted().is_cancelled());
        let t1 = t0 + Duration::from_secs(1);
        let admitted = budget.handshake(ip("10.0.0.1"), t1).unwrap();
        assert_eq!(admitted.evicted, [ip("10.0.0.1")]);
        assert!(
            old.evicted().is_cancelled(),
            "the stale one is told to close"
        );
        assert!(
            !proven.evicted().is_cancelled(),
            "a proven one is never evicted"
        );
        assert_eq!(budget.handshakes_from(ip("10.0.0.1")), 2);
        // Its holder dropping the evicted permit changes nothing more.
        drop(old);
        assert_eq!(budget.handshakes_from(ip("10.0.0.1")), 2);
        // Overall: 3 in progress, a new source evicts the oldest unproven one (the newcomer of
        // t1 is the only one, and still fresh: refused).
        let _b = admit(&budget, "10.0.0.2", t1);
        assert_eq!(
            admit(&budget, "10.0.0.3", t1).unwrap_err(),
            Refused::Handshakes { limit: 3 }
        );
        let t2 = t1 + Duration::from_secs(2);
        let admitted = budget.handshake(ip("10.0.0.3"), t2).unwrap();
        assert_eq!(
            admitted.evicted,
            [ip("10.0.0.1")],
            "the oldest unproven one"
        );
        assert!(!admitted.permit.evicted().is_cancelled());
    }

    #[test]
    fn strangers_cannot_take_the_reserve_known_sources_can() {
        let t0 = Instant::now();
        let limits = HandshakeLimits {
            max: 4,
            per_source: 4,
            reserved: 2,
            evict_after: Duration::from_secs(1),
        };
        let budget = Budget::new(limits, 10);
        budget.remember(ip("10.0.0.9"), t0);
        budget.remember(ip("10.0.0.8"), t0);
        assert!(budget.is_known(ip("10.0.0.9"), t0));
        let s1 = admit(&budget, "10.0.0.1", t0).unwrap();
        let _s2 = admit(&budget, "10.0.0.1", t0).unwrap();
        assert_eq!(
            admit(&budget, "10.0.0.3", t0).unwrap_err(),
            Refused::StrangerHandshakes {
                limit: 2,
                reserved: 2
            }
        );
        let k1 = admit(&budget, "10.0.0.9", t0).unwrap();
        let _k2 = admit(&budget, "10.0.0.9", t0).unwrap();
        assert_eq!(
            admit(&budget, "10.0.0.8", t0).unwrap_err(),
            Refused::Handshakes { limit: 4 }
        );
        // Later, a stranger evicts the heaviest stranger source's stale handshake, never a
        // known source's, though that one is as heavy.
        let t1 = t0 + Duration::from_secs(5);
        let admitted = budget.handshake(ip("10.0.0.3"), t1).unwrap();
        assert_eq!(admitted.evicted, [ip("10.0.0.1")]);
        assert!(s1.evicted().is_cancelled());
        assert!(!k1.evicted().is_cancelled());
        // A known source with none in progress evicts from the heaviest source, known or not.
        let t2 = t1 + Duration::from_secs(5);
        let admitted = budget.handshake(ip("10.0.0.8"), t2).unwrap();
        assert_eq!(admitted.evicted, [ip("10.0.0.9")]);
        assert!(k1.evicted().is_cancelled());
        // A known source stops being known after KNOWN_FOR.
        assert!(!budget.is_known(ip("10.0.0.9"), t0 + KNOWN_FOR));
    }

    #[test]
    fn a_crowd_holding_one_handshake_each_is_not_thrashed() {
        let t0 = Instant::now();
        let limits = HandshakeLimits {
            evict_after: Duration::from_secs(1),
            ..plain(3, 4)
        };
        let budget = Budget::new(limits, 10);
        let crowd: Vec<_> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|a| admit(&budget, a, t0).unwrap())
            .collect();
        // Each holds one, however old: a fourth agent is refused, nobody is evicted.
        let late = t0 + Duration::from_secs(30);
        assert_eq!(
            admit(&budget, "10.0.0.4", late).unwrap_err(),
            Refused::Handshakes { limit: 3 }
        );
        assert!(crowd.iter().all(|p| !p.evicted().is_cancelled()));
    }

    #[test]
    fn enrollments_waiting_for_a_request_do_not_take_handshakes() {
        let t0 = Instant::now();
        let limits = HandshakeLimits {
            evict_after: Duration::from_secs(1),
            ..plain(2, 1)
        };
        let budget = Budget::new(limits, 10);
        // 4 enrollments per handshake permit, per source too.
        let held: Vec<_> = (0..ENROLLMENTS_PER_HANDSHAKE)
            .map(|_| budget.enrollment(ip("10.0.0.1"), t0).unwrap().permit)
            .collect();
        assert_eq!(
            budget.enrollment(ip("10.0.0.1"), t0).unwrap_err(),
            Refused::SourceEnrollments { limit: 4 }
        );
        // The source's handshake budget is untouched.
        assert_eq!(budget.handshakes_from(ip("10.0.0.1")), 0);
        let _h = admit(&budget, "10.0.0.1", t0).unwrap();
        // A stale one makes room for a newer one.
        let t1 = t0 + Duration::from_secs(1);
        let admitted = budget.enrollment(ip("10.0.0.1"), t1).unwrap();
        assert_eq!(admitted.evicted, [ip("10.0.0.1")]);
        assert!(held[0].evicted().is_cancelled());
        assert_eq!(
            Refused::Enrollments { limit: 8 }.label(),
            "enrollment_limit"
        );
    }

    #[test]
    fn known_sources_are_bounded() {
        let t0 = Instant::now();
        let mut known = KnownSources {
            seen: HashMap::new(),
            capacity: 2,
        };
        known.remember(ip("10.0.0.1"), t0);
        known.remember(ip("10.0.0.2"), t0 + Duration::from_secs(1));
        known.remember(ip("10.0.0.3"), t0 + Duration::from_secs(2));
        assert_eq!(known.seen.len(), 2);
        assert!(!known.contains(ip("10.0.0.1"), t0 + Duration::from_secs(2)));
        assert!(known.contains(ip("10.0.0.3"), t0 + Duration::from_secs(2)));
    }

    #[test]
    fn a_flood_is_logged_once_per_interval_with_the_count_left_out() {
        let throttle = LogThrottle::new(std::time::Duration::from_secs(1));
        let t0 = tokio::time::Instant::now();
        assert_eq!(throttle.admit("a", t0), Some(0));
        assert_eq!(throttle.admit("a", t0), None);
        assert_eq!(
            throttle.admit("a", t0 + std::time::Duration::from_millis(500)),
            None
        );
        // Another reason has its own line.
        assert_eq!(throttle.admit("b", t0), Some(0));
        assert_eq!(
            throttle.admit("a", t0 + std::time::Duration::from_secs(1)),
            Some(2)
        );
        assert_eq!(
            throttle.admit("a", t0 + std::time::Duration::from_secs(3)),
            Some(0)
        );
    }

    #[test]
    fn an_ipv6_subnet_is_one_source() {
        let now = Instant::now();
        let budget = Budget::new(plain(10, 2), 10);
        let _a = admit(&budget, "2001:db8:1:2::1", now).unwrap();
        let _b = admit(&budget, "2001:db8:1:2:ffff::9", now).unwrap();
        assert_eq!(
            admit(&budget, "2001:db8:1:2:abcd::7", now).unwrap_err(),
            Refused::SourceHandshakes { limit: 2 }
        );
        assert!(admit(&budget, "2001:db8:1:3::1", now).is_ok());
        assert_eq!(source_of(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(source_of(ip("2001:db8::1:2:3:4")), ip("2001:db8::"));
    }

    #[test]
    fn handshakes_do_not_count_against_sessions() {
        let now = Instant::now();
        let budget = Budget::new(plain(2, 2), 1);
        let _h1 = admit(&budget, "127.0.0.2", now).unwrap();
        let _h2 = admit(&budget, "127.0.0.2", now).unwrap();
        let session = budget.session().unwrap();
        assert_eq!(
            budget.session().unwrap_err(),
            Refused::Sessions { limit: 1 }
        );
        drop(session);
        assert!(budget.session().is_ok());
    }

    #[tokio::test]
    async fn a_released_session_permit_is_waited_for() {
        let budget = Arc::new(Budget::new(plain(1, 1), 1));
        let held = budget.session().unwrap();
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.session_within(Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        drop(held);
        assert!(waiting.await.unwrap().is_ok());
        let _again = budget.session().unwrap();
        assert!(
            budget
                .session_within(Duration::from_millis(10))
                .await
                .is_err()
        );
    }
}
