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
    UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .unwrap_or(UNIX_EPOCH)
}

/// A status time from Unix milliseconds as they travel on the wire.
pub fn from_unix_ms(ms: i64) -> Time {
    let after_epoch = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    to_time(UNIX_EPOCH.checked_add(after_epoch).unwrap_or(UNIX_EPOCH))
}

/// How long from `earlier` to `later`; zero when `later` is not after it (clocks step back).
pub fn elapsed(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
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
    fn elapsed_never_goes_negative() {
        let a = UNIX_EPOCH + Duration::from_secs(10);
        let b = UNIX_EPOCH + Duration::from_secs(4);
        assert_eq!(elapsed(a, b), Duration::ZERO);
        assert_eq!(elapsed(b, a), Duration::from_secs(6));
    }
}
