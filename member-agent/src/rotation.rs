//! Which hub address the agent dials next, and how long it waits first.
//!
//! With several hubs (one active, the others standbys that refuse sessions) the agent walks
//! the list round robin. Every attempt that ends moves it on: a standby's refusal means
//! another hub is active, a failed dial or a lost session suggests this one is gone. Within a
//! round it pauses only briefly; a whole round without a session, like a lost session, waits
//! the usual exponential backoff, so an agent whose hubs are all down or all standing by does
//! not hammer them. With one address this is the plain reconnect loop.

/// How the last attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// A session was established and has ended.
    SessionEnded,
    /// The hub refused with `Unavailable`: a standby, or a hub shutting down.
    Unavailable,
    /// No session: resolving, connecting or the handshake failed, or another refusal.
    Failed,
}

/// How long to wait before the next dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// A short jittered delay: another address is worth a try now.
    Short,
    /// The usual exponential backoff, first `reset` to its initial delay.
    Backoff {
        /// Whether a session was established since the last backoff.
        reset: bool,
    },
}

/// The position in the hub list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rotation {
    len: usize,
    current: usize,
    /// Attempts since the last established session.
    misses: usize,
}

impl Rotation {
    /// A rotation over `len` addresses (at least one), starting with the first.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            len: len.max(1),
            current: 0,
            misses: 0,
        }
    }

    /// Index of the address to dial.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// Moves on after `attempt`; returns how long to wait before dialing [`Self::current`].
    pub(crate) fn after(&mut self, attempt: Attempt) -> Pause {
        self.current = (self.current + 1) % self.len;
        match attempt {
            Attempt::SessionEnded => {
                self.misses = 0;
                Pause::Backoff { reset: true }
            }
            Attempt::Unavailable | Attempt::Failed => {
                self.misses += 1;
                if self.misses.is_multiple_of(self.len) {
                    Pause::Backoff { reset: false }
                } else {
                    Pause::Short
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Attempt::{Failed, SessionEnded, Unavailable};

    const SHORT: Pause = Pause::Short;
    const BACKOFF: Pause = Pause::Backoff { reset: false };
    const RESET: Pause = Pause::Backoff { reset: true };

    /// Feeds `attempts` to a rotation over `len` addresses; returns (address dialed, pause
    /// after it) per attempt.
    fn walk(len: usize, attempts: &[Attempt]) -> Vec<(usize, Pause)> {
        let mut rotation = Rotation::new(len);
        attempts
            .iter()
            .map(|a| {
                let dialed = rotation.current();
                (dialed, rotation.after(*a))
            })
            .collect()
    }

    #[test]
    fn one_address_is_the_plain_reconnect_loop() {
        assert_eq!(
            walk(1, &[Failed, Unavailable, SessionEnded, Failed]),
            [(0, BACKOFF), (0, BACKOFF), (0, RESET), (0, BACKOFF)]
        );
    }

    #[test]
    fn a_standby_sends_the_agent_on_at_once() {
        // hub 0 is a standby, hub 1 active.
        assert_eq!(walk(2, &[Unavailable]), [(0, SHORT)]);
        let mut rotation = Rotation::new(2);
        rotation.after(Unavailable);
        assert_eq!(rotation.current(), 1);
    }

    #[test]
    fn failover_walks_round_robin_and_backs_off_per_round() {
        // The active hub 0 dies: its session ends; hub 1 still stands by for a while, hub 0
        // does not answer; then hub 1 takes over.
        assert_eq!(
            walk(
                2,
                &[
                    SessionEnded,
                    Unavailable,
                    Failed,
                    Unavailable,
                    Failed,
                    SessionEnded
                ]
            ),
            [
                (0, RESET),
                (1, SHORT),
                (0, BACKOFF),
                (1, SHORT),
                (0, BACKOFF),
                (1, RESET),
            ]
        );
    }

    #[test]
    fn three_hubs_pause_briefly_within_a_round() {
        assert_eq!(
            walk(3, &[Failed, Unavailable, Unavailable, Failed]),
            [(0, SHORT), (1, SHORT), (2, BACKOFF), (0, SHORT)]
        );
    }

    #[test]
    fn a_session_starts_a_new_round() {
        assert_eq!(
            walk(3, &[Failed, SessionEnded, Failed, Failed, Failed]),
            [(0, SHORT), (1, RESET), (2, SHORT), (0, SHORT), (1, BACKOFF)]
        );
    }

    #[test]
    fn zero_addresses_count_as_one() {
        assert_eq!(walk(0, &[Failed, Failed]), [(0, BACKOFF), (0, BACKOFF)]);
    }
}
