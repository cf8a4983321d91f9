//! The one home of time conversions between Rust clocks and Kubernetes status times. Pure:
//! callers read the clock and pass the instant in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A status time: whole seconds, as the API server stores it. Instants before 1970 become
/// the epoch; instants past what a Kubernetes time can hold become the latest it can.
pub fn to_time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Time(
        Timestamp::from_second(secs)
            .or_else(|_| Timestamp::from_second(Timestamp::MAX.as_second()))
            .unwrap_or(Timestamp::UNIX_EPOCH),
    )
}

/// The instant of a status time (never before the epoch).
pub fn from_time(t: &Time) -> SystemTime {
    let secs = u64::try_from(t.0.as_second()).unwrap_or(0);
    saturating_add(UNIX_EPOCH, Duration::from_secs(secs))
}

/// A status time from Unix milliseconds as they travel on the wire.
pub fn from_unix_ms(ms: i64) -> Time {
    let after_epoch = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    to_time(saturating_add(UNIX_EPOCH, after_epoch))
}

/// How long from `earlier` to `later`; zero when `later` is not after it (clocks step back).
pub fn elapsed(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// `t + d`, or the latest instant a `SystemTime` can hold when that overflows: a deadline
/// too far away to represent is "never", not "now" (`SystemTime + Duration` panics).
pub fn saturating_add(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d)
        .unwrap_or_else(|| furthest(t, SystemTime::checked_add))
}

/// `t - d`, or the earliest instant a `SystemTime` can hold when that overflows.
pub fn saturating_sub(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_sub(d)
        .unwrap_or_else(|| furthest(t, SystemTime::checked_sub))
}

/// The last instant reachable from `from` by `step`. The range of `SystemTime` differs by
/// platform and std exposes no bounds, so they are found by halving the stride: at most a
/// few hundred checked steps, and only when a deadline overflows.
fn furthest(from: SystemTime, step: fn(&SystemTime, Duration) -> Option<SystemTime>) -> SystemTime {
    let mut at = from;
    let mut stride = Duration::MAX;
    while !stride.is_zero() {
        match step(&at, stride) {
            Some(next) => at = next,
            None => stride /= 2,
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_times_round_to_seconds_and_saturate() {
        let t = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(to_time(t).0.as_second(), 1);
        assert_eq!(from_time(&to_time(t)), UNIX_EPOCH + Duration::from_secs(1));
        assert_eq!(to_time(UNIX_EPOCH).0, Timestamp::UNIX_EPOCH);
        // Far future instants do not panic.
        let far = UNIX_EPOCH + Duration::from_secs(u64::MAX / 4);
        assert_eq!(to_time(far).0.as_second(), Timestamp::MAX.as_second());
        assert_eq!(from_unix_ms(-5).0, Timestamp::UNIX_EPOCH);
        assert_eq!(from_unix_ms(2_000).0.as_second(), 2);
    }

    #[test]
    fn extreme_inputs_saturate() {
        let latest = saturating_add(UNIX_EPOCH, Duration::MAX);
        assert_eq!(
            latest.checked_add(Duration::from_nanos(1)),
            None,
            "{latest:?}"
        );
        assert_eq!(saturating_add(latest, Duration::MAX), latest);
        let now = UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        assert_eq!(saturating_add(now, Duration::MAX), latest);
        assert_eq!(
            saturating_add(now, Duration::from_secs(60)),
            now + Duration::from_secs(60)
        );
        let earliest = saturating_sub(now, Duration::MAX);
        assert_eq!(
            earliest.checked_sub(Duration::from_nanos(1)),
            None,
            "{earliest:?}"
        );
        assert_eq!(saturating_sub(earliest, Duration::MAX), earliest);
        assert_eq!(
            saturating_sub(now, Duration::from_secs(60)),
            now - Duration::from_secs(60)
        );
        assert_eq!(to_time(latest).0.as_second(), Timestamp::MAX.as_second());
        assert_eq!(to_time(earliest).0, Timestamp::UNIX_EPOCH);
        assert_eq!(
            from_unix_ms(i64::MAX).0.as_second(),
            Timestamp::MAX.as_second()
        );
        assert_eq!(from_unix_ms(i64::MIN).0, Timestamp::UNIX_EPOCH);
        let max = Time(Timestamp::MAX);
        assert_eq!(
            to_time(from_time(&max)).0.as_second(),
            Timestamp::MAX.as_second()
        );
        assert!(elapsed(earliest, latest) > elapsed(UNIX_EPOCH, now));
        assert_eq!(elapsed(latest, earliest), Duration::ZERO);
    }

    #[test]
    fn elapsed_never_goes_negative() {
        let a = UNIX_EPOCH + Duration::from_secs(10);
        let b = UNIX_EPOCH + Duration::from_secs(4);
        assert_eq!(elapsed(a, b), Duration::ZERO);
        assert_eq!(elapsed(b, a), Duration::from_secs(6));
    }
}
