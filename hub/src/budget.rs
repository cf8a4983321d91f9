//! Handshake and session budgets.
//!
//! Who may take the hub's time: a budget of handshakes in progress (TLS and `Hello`), overall
//! and per source address, separate from the budget of established sessions. A peer that
//! starts handshakes and never finishes them uses up handshake permits only, for at most the
//! handshake and `Hello` timeouts, so it can neither fill the session budget nor, from one
//! address, keep agents at other addresses out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// The hub's handshake and session budgets.
#[derive(Debug)]
pub struct Budget {
    handshakes: Arc<Semaphore>,
    max_handshakes: usize,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max_per_source: usize,
    sessions: Arc<Semaphore>,
    max_sessions: usize,
}

impl Budget {
    /// Budgets of `max_handshakes` handshakes in progress, `max_per_source` of them from one
    /// address, and `max_sessions` established sessions.
    pub fn new(max_handshakes: usize, max_per_source: usize, max_sessions: usize) -> Self {
        Self {
            handshakes: Arc::new(Semaphore::new(max_handshakes)),
            max_handshakes,
            per_source: Arc::new(Mutex::new(HashMap::new())),
            max_per_source,
            sessions: Arc::new(Semaphore::new(max_sessions)),
            max_sessions,
        }
    }

    /// A handshake permit for a connection from `source`, released when dropped.
    pub fn handshake(&self, source: IpAddr) -> Result<HandshakePermit, Refused> {
        let source = source_of(source);
        let mut per_source = lock(&self.per_source);
        let count = per_source.entry(source).or_insert(0);
        if *count >= self.max_per_source {
            return Err(Refused::SourceHandshakes {
                limit: self.max_per_source,
            });
        }
        let Ok(permit) = self.handshakes.clone().try_acquire_owned() else {
            if *count == 0 {
                per_source.remove(&source);
            }
            return Err(Refused::Handshakes {
                limit: self.max_handshakes,
            });
        };
        *count += 1;
        Ok(HandshakePermit {
            _permit: permit,
            source,
            per_source: self.per_source.clone(),
        })
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
    pub async fn session_within(
        &self,
        limit: std::time::Duration,
    ) -> Result<OwnedSemaphorePermit, Refused> {
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

    /// Handshakes in progress from `source`.
    pub fn handshakes_from(&self, source: IpAddr) -> usize {
        lock(&self.per_source)
            .get(&source_of(source))
            .copied()
            .unwrap_or(0)
    }
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

fn lock(
    per_source: &Mutex<HashMap<IpAddr, usize>>,
) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
    // Every update is one counter store; a poisoned lock holds no torn state.
    per_source
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A handshake in progress; dropping it returns its share of both handshake budgets.
#[derive(Debug)]
pub struct HandshakePermit {
    _permit: OwnedSemaphorePermit,
    source: IpAddr,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        let mut per_source = lock(&self.per_source);
        if let Some(count) = per_source.get_mut(&self.source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                // Forget idle sources, so the map holds at most one entry per handshake.
                per_source.remove(&self.source);
            }
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
    fn one_source_cannot_take_the_whole_handshake_budget() {
        let budget = Budget::new(4, 2, 10);
        let a1 = budget.handshake(ip("10.0.0.1")).unwrap();
        let _a2 = budget.handshake(ip("10.0.0.1")).unwrap();
        assert_eq!(
            budget.handshake(ip("10.0.0.1")).unwrap_err(),
            Refused::SourceHandshakes { limit: 2 }
        );
        // The same address written as IPv4-mapped IPv6 is the same source.
        assert!(budget.handshake(ip("::ffff:10.0.0.1")).is_err());
        let _b1 = budget.handshake(ip("10.0.0.2")).unwrap();
        let _b2 = budget.handshake(ip("10.0.0.2")).unwrap();
        // The overall budget is spent: a third source is refused, and not remembered.
        assert_eq!(
            budget.handshake(ip("10.0.0.3")).unwrap_err(),
            Refused::Handshakes { limit: 4 }
        );
        assert_eq!(budget.handshakes_from(ip("10.0.0.3")), 0);
        // A finished handshake frees both budgets.
        drop(a1);
        assert_eq!(budget.handshakes_from(ip("10.0.0.1")), 1);
        let _c = budget.handshake(ip("10.0.0.3")).unwrap();
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
        let budget = Budget::new(10, 2, 10);
        let _a = budget.handshake(ip("2001:db8:1:2::1")).unwrap();
        let _b = budget.handshake(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(
            budget.handshake(ip("2001:db8:1:2:abcd::7")).unwrap_err(),
            Refused::SourceHandshakes { limit: 2 }
        );
        assert!(budget.handshake(ip("2001:db8:1:3::1")).is_ok());
        assert_eq!(source_of(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(source_of(ip("2001:db8::1:2:3:4")), ip("2001:db8::"));
    }

    #[test]
    fn handshakes_do_not_count_against_sessions() {
        let budget = Budget::new(2, 2, 1);
        let _h1 = budget.handshake(ip("127.0.0.2")).unwrap();
        let _h2 = budget.handshake(ip("127.0.0.2")).unwrap();
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
        let budget = Arc::new(Budget::new(1, 1, 1));
        let held = budget.session().unwrap();
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move {
                budget
                    .session_within(std::time::Duration::from_secs(5))
                    .await
            })
        };
        tokio::task::yield_now().await;
        drop(held);
        assert!(waiting.await.unwrap().is_ok());
        let _again = budget.session().unwrap();
        assert!(
            budget
                .session_within(std::time::Duration::from_millis(10))
                .await
                .is_err()
        );
    }
}
