//! The hub's memory of the address tokens agents have used (each token is good for one
//! connection, RFC 9000 §8.1.3).
//!
//! quinn's `BloomTokenLog` starts its first period at the expiry of the first token it sees
//! and rejects every token that expires before that as "too far in past": a hub that has just
//! started, whose agents present tokens issued over the last day in whatever order they
//! reconnect, sent a Retry to a quarter of a 10,000-member fleet it should have admitted at
//! once (docs/scale.md). This log takes tokens in any order: it keeps the nonces used in the
//! current lifetime and in the one before, and forgets a generation once a whole lifetime has
//! passed since it was replaced, by which time every token in it has expired.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Tokens remembered per generation, at most: about 16 bytes each. Past it, a token is taken
/// for used, which costs its agent one Retry.
pub const MAX_PER_GENERATION: usize = 200_000;

/// Nonces of the address tokens used lately.
#[derive(Debug)]
pub struct UsedTokens {
    state: Mutex<Generations>,
    capacity: usize,
}

#[derive(Debug)]
struct Generations {
    /// When `current` was started.
    since: Instant,
    /// How long a generation lasts: the tokens' lifetime.
    lifetime: Option<Duration>,
    current: HashSet<u128>,
    previous: HashSet<u128>,
}

impl Default for UsedTokens {
    fn default() -> Self {
        Self::with_capacity(MAX_PER_GENERATION)
    }
}

impl UsedTokens {
    /// A log remembering at most `capacity` tokens per generation.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            state: Mutex::new(Generations {
                since: Instant::now(),
                lifetime: None,
                current: HashSet::new(),
                previous: HashSet::new(),
            }),
            capacity,
        }
    }

    /// Records `nonce` as used at `now`; `false` if it was used before (or the log is full).
    pub fn first_use(&self, nonce: u128, lifetime: Duration, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let lifetime = *state.lifetime.get_or_insert(lifetime);
        if now.saturating_duration_since(state.since) >= lifetime {
            // Every nonce in `previous` was used more than a lifetime ago: expired.
            state.previous = std::mem::take(&mut state.current);
            state.since = now;
        }
        if state.previous.contains(&nonce) || state.current.len() >= self.capacity {
            return false;
        }
        state.current.insert(nonce)
    }
}

impl quinn::TokenLog for UsedTokens {
    fn check_and_insert(
        &self,
        nonce: u128,
        issued: SystemTime,
        lifetime: Duration,
    ) -> Result<(), quinn::TokenReuseError> {
        // quinn has checked that the token has not expired; a token from the future is not one
        // this hub (or one sharing its key) issued in good faith.
        if issued > SystemTime::now() + Duration::from_secs(60) {
            return Err(quinn::TokenReuseError);
        }
        if self.first_use(nonce, lifetime, Instant::now()) {
            Ok(())
        } else {
            Err(quinn::TokenReuseError)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn a_token_is_good_once_in_whatever_order_tokens_come() {
        let log = UsedTokens::default();
        let now = Instant::now();
        // Newer first, then older: both are first uses.
        assert!(log.first_use(2, DAY, now));
        assert!(log.first_use(1, DAY, now));
        assert!(!log.first_use(2, DAY, now), "a token used twice");
        assert!(!log.first_use(1, DAY, now + DAY / 2));
    }

    #[test]
    fn a_used_token_is_remembered_for_a_whole_lifetime_then_forgotten() {
        let log = UsedTokens::default();
        let start = Instant::now();
        assert!(log.first_use(7, DAY, start + DAY / 2));
        // The generation turns over after a lifetime: 7 moves to the previous one.
        assert!(log.first_use(8, DAY, start + DAY));
        assert!(!log.first_use(7, DAY, start + DAY + DAY / 2));
        // Another turn: 7 was used more than a lifetime ago; its token has expired.
        assert!(log.first_use(9, DAY, start + 2 * DAY));
        assert!(log.first_use(7, DAY, start + 2 * DAY));
    }

    #[test]
    fn a_full_log_takes_no_more_tokens() {
        let log = UsedTokens::with_capacity(2);
        let now = Instant::now();
        assert!(log.first_use(1, DAY, now));
        assert!(log.first_use(2, DAY, now));
        assert!(
            !log.first_use(3, DAY, now),
            "past its capacity a token costs a Retry"
        );
    }

    #[test]
    fn a_token_issued_in_the_future_is_refused() {
        use quinn::TokenLog;
        let log = UsedTokens::default();
        let later = SystemTime::now() + DAY;
        assert!(log.check_and_insert(1, later, DAY).is_err());
        assert!(log.check_and_insert(2, SystemTime::now(), DAY).is_ok());
    }
}
