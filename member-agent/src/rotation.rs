//! Which hub address the agent dials next, and how long it waits first.
//!
//! With several hubs (one active, the others standbys that refuse sessions) the agent walks
//! the list round robin. Every attempt that ends moves it on: a standby's refusal means
//! another hub is active, a failed dial or a lost session suggests this one is gone. Within a
//! round it pauses only briefly; a whole round without a session, like a lost session, waits
//! the usual exponential backoff, so an agent whose hubs are all down or all standing by does
//! not hammer them. With one address this is the plain reconnect loop.
//!
//! A hub that closes its sessions because it is shutting down (a rollout, a restart) is
//! going away, not failing: its successor is expected within seconds. For
//! [`RESTART_WINDOW`] after that close every pause is short, whatever the dials meet
//! meanwhile (no answer while no hub is bound, a stopping hub's refusals, a new hub that
//! does not lead yet), so that the fleet is back as soon as the new hub is. Exponential
//! backoff would have grown to seconds by then, and the last agents would come back tens
//! of seconds after the hub. Past the window the agent backs off as usual, from the start.

use std::time::{Duration, Instant};

/// How long after a hub went away the agent keeps redialing after short pauses: a hub's
/// rollout, from the old process's exit to the new one accepting sessions.
pub(crate) const RESTART_WINDOW: Duration = Duration::from_secs(30);

/// How the last attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// A session was established and has ended.
    SessionEnded,
    /// A session was established and the hub closed it because it is shutting down.
    GoingAway,
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
    /// Until when pauses stay short after a hub went away.
    restarting_until: Option<Instant>,
    /// A session was established since the last backoff: the next one starts over.
    reset: bool,
}

impl Rotation {
    /// A rotation over `len` addresses (at least one), starting with the first.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            len: len.max(1),
            current: 0,
            misses: 0,
            restarting_until: None,
            reset: false,
        }
    }

    /// Whether a hub went away less than [`RESTART_WINDOW`] before `now`.
    pub(crate) fn restarting(&self, now: Instant) -> bool {
        self.restarting_until.is_some_and(|until| now < until)
    }

    /// Index of the address to dial.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// Moves on after `attempt` at `now`; returns how long to wait before dialing
    /// [`Self::current`].
    pub(crate) fn after(&mut self, attempt: Attempt, now: Instant) -> Pause {
        self.current = (self.current + 1) % self.len;
        let round_over = match attempt {
            Attempt::SessionEnded | Attempt::GoingAway => {
                self.misses = 0;
                self.reset = true;
                self.restarting_until =
                    (attempt == Attempt::GoingAway).then(|| now + RESTART_WINDOW);
                attempt == Attempt::SessionEnded
            }
            Attempt::Unavailable | Attempt::Failed => {
                self.misses += 1;
                self.misses.is_multiple_of(self.len)
            }
        };
        if !round_over || self.restarting(now) {
            return Pause::Short;
        }
        self.restarting_until = None;
        Pause::Backoff {
            reset: std::mem::take(&mut self.reset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Attempt::{Failed, GoingAway, SessionEnded, Unavailable};

    const SHORT: Pause = Pause::Short;
    const BACKOFF: Pause = Pause::Backoff { reset: false };
    const RESET: Pause = Pause::Backoff { reset: true };

    /// Feeds `attempts` to a rotation over `len` addresses; returns (address dialed, pause
    /// after it) per attempt.
    fn walk(len: usize, attempts: &[Attempt]) -> Vec<(usize, Pause)> {
        let now = Instant::now();
        let mut rotation = Rotation::new(len);
        attempts
            .iter()
            .map(|a| {
                let dialed = rotation.current();
                (dialed, rotation.after(*a, now))
            })
            .collect()
    }

    /// Feeds `attempts` at their seconds after the start to a rotation over one address;
    /// returns the pause after each.
    fn timed(attempts: &[(u64, Attempt)]) -> Vec<Pause> {
        let start = Instant::now();
        let mut rotation = Rotation::new(1);
        attempts
            .iter()
            .map(|(s, a)| rotation.after(*a, start + Duration::from_secs(*s)))
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
        rotation.after(Unavailable, Instant::now());
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
    fn a_hub_going_away_is_redialed_briefly_until_its_successor_answers() {
        // The hub stops: no answer while nothing is bound, refusals from a successor that
        // does not lead yet, all within the window: short pauses, no backoff growing.
        assert_eq!(
            timed(&[
                (0, GoingAway),
                (3, Failed),
                (4, Failed),
                (5, Unavailable),
                (6, Unavailable),
                (29, Failed),
            ]),
            [SHORT; 6]
        );
    }

    #[test]
    fn past_the_window_the_agent_backs_off_from_the_start() {
        assert_eq!(
            timed(&[(0, GoingAway), (10, Failed), (31, Failed), (40, Failed)]),
            [SHORT, SHORT, RESET, BACKOFF]
        );
    }

    #[test]
    fn a_session_ends_the_window_and_a_lost_session_backs_off() {
        // Back with the new hub, whose session is then lost: the usual backoff.
        assert_eq!(
            timed(&[(0, GoingAway), (2, Failed), (3, SessionEnded), (4, Failed)]),
            [SHORT, SHORT, RESET, BACKOFF]
        );
    }

    #[test]
    fn with_several_hubs_a_going_away_keeps_every_round_short() {
        let now = Instant::now();
        let mut rotation = Rotation::new(2);
        assert_eq!(rotation.after(GoingAway, now), SHORT);
        assert_eq!(rotation.current(), 1);
        assert_eq!(rotation.after(Unavailable, now), SHORT);
        assert_eq!(rotation.after(Failed, now), SHORT);
        let later = now + RESTART_WINDOW;
        assert_eq!(rotation.after(Unavailable, later), SHORT);
        assert_eq!(rotation.after(Failed, later), RESET);
    }

    #[test]
    fn zero_addresses_count_as_one() {
        assert_eq!(walk(0, &[Failed, Failed]), [(0, BACKOFF), (0, BACKOFF)]);
    }
}
