//! Rate limits of what an agent sends over its session.

use std::time::Duration;

use tokio::time::Instant;

/// Reports a session may send in a burst before it is slowed down.
const REPORT_BURST: u32 = 20;
/// Reports per second a session may send on average (agents send at most one per report
/// interval, plus one per desired-state change).
const REPORT_RATE: u32 = 10;

/// Renewals a session may ask for in a burst, and per second after it (an agent renews once
/// per two thirds of a certificate lifetime; retries after a refusal are spaced out).
const RENEW_BURST: u32 = 3;
/// See [`RENEW_BURST`].
const RENEW_RATE: u32 = 1;

/// A token bucket: `take` returns how long to wait when the bucket is empty.
#[derive(Debug)]
pub(super) struct RateLimit {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Instant,
}

impl RateLimit {
    /// The limit of a session's reports (status and pod metrics).
    pub(super) fn reports() -> Self {
        Self::new(REPORT_BURST, REPORT_RATE)
    }

    /// The limit of a session's certificate renewals.
    pub(super) fn renewals() -> Self {
        Self::new(RENEW_BURST, RENEW_RATE)
    }

    fn new(burst: u32, per_second: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_second: f64::from(per_second.max(1)),
            last: Instant::now(),
        }
    }

    pub(super) fn take(&mut self, now: Instant) -> Option<Duration> {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.per_second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_rate_limit_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut limit = RateLimit::new(3, 10);
        for _ in 0..3 {
            assert_eq!(limit.take(start), None);
        }
        let wait = limit.take(start).expect("over the burst");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // After waiting, the next one is due again at the rate.
        let later = start + Duration::from_millis(200);
        assert_eq!(limit.take(later), None);
    }
}
