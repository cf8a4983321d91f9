//! Go-style durations (`1m`, `90s`, `1h30m`, `500ms`, `0s`) as Kubernetes and KEDA users
//! write them in specs.

use std::time::Duration;

/// The CRD schema's `pattern` for a duration field: the syntax [`parse_duration`] accepts,
/// so that the API server refuses a typo before kedge sees it (Go's RE2 reads it as Rust's
/// `regex` does).
pub const PATTERN: &str = r"^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// The CRD schema's `maxLength` for a duration field: `167h59m59.999999999s` is 20
/// characters, so 32 leave room for any sane spelling and bound what the parser reads.
pub const MAX_LENGTH: u32 = 32;

/// Parses a Go `time.ParseDuration`-style string without sign: one or more `<number><unit>`
/// pairs, units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`; decimals allowed (`1.5h`). A bare `0`
/// is accepted as zero, as Go does.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut total_nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            _ => return None,
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let int_value: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().ok()?
        };
        let mut nanos = int_value.checked_mul(unit_nanos)?;
        // Fractions are exact up to the unit's nanosecond resolution, like Go.
        let mut scale = unit_nanos;
        for digit in frac_part.chars() {
            scale /= 10;
            let d = u128::from(digit.to_digit(10)?);
            nanos = nanos.checked_add(d * scale)?;
        }
        total_nanos = total_nanos.checked_add(nanos)?;
        rest = next;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(total_nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// Formats a duration the short way users write it (`1m30s`, `0s`), for reports.
pub fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let millis = duration.subsec_millis();
    if secs == 0 && millis == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || millis > 0 {
        if millis > 0 {
            out.push_str(&format!("{s}.{millis:03}s"));
        } else {
            out.push_str(&format!("{s}s"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("0", Some(0u64)),
            ("0s", Some(0)),
            ("1m", Some(60_000)),
            ("90s", Some(90_000)),
            ("1h30m", Some(5_400_000)),
            ("1.5h", Some(5_400_000)),
            ("500ms", Some(500)),
            ("2m0.5s", Some(120_500)),
            ("", None),
            ("1", None),
            ("m", None),
            ("1d", None),
            ("-1m", None),
            ("1..5s", None),
            ("abc", None),
        ];
        for (text, millis) in cases {
            assert_eq!(
                parse_duration(text).map(|d| d.as_millis()),
                millis.map(u128::from),
                "{text}"
            );
        }
    }

    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("μs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];

    fn from_nanos(nanos: u128) -> Option<Duration> {
        let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
        Some(Duration::new(
            secs,
            u32::try_from(nanos % 1_000_000_000).ok()?,
        ))
    }

    #[test]
    fn overflow_is_none_not_a_panic() {
        // 5124095576030431h is just below u64::MAX seconds: it parses, and validation
        // refuses it by its size; one hour more does not fit a Duration.
        assert_eq!(
            parse_duration("5124095576030431h"),
            from_nanos(5_124_095_576_030_431 * 3_600_000_000_000)
        );
        for text in [
            "5124095576030432h",
            "18446744073709551616s",
            "340282366920938463463374607431768211456ns",
            "99999999999999999999999999999999999999999h",
            "5124095576030431h5124095576030431h",
        ] {
            assert_eq!(parse_duration(text), None, "{text}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_duration(&text);
        }

        #[test]
        fn never_panics_on_near_misses(text in "[0-9.]{0,45}(ns|us|µs|ms|s|m|h|d|)([0-9.]{0,45}(ns|us|ms|s|m|h))*") {
            let _ = parse_duration(&text);
        }

        /// `<n><unit>` pairs add up to exactly their arithmetic value, or to `None` when
        /// that does not fit a `Duration`.
        #[test]
        fn pairs_are_their_value(
            pairs in prop::collection::vec((any::<u64>(), prop::sample::select(&UNITS[..])), 1..4),
        ) {
            let text: String = pairs.iter().map(|(n, (unit, _))| format!("{n}{unit}")).collect();
            let nanos = pairs
                .iter()
                .try_fold(0u128, |sum, (n, (_, scale))| sum.checked_add(u128::from(*n) * scale));
            prop_assert_eq!(parse_duration(&text), nanos.and_then(from_nanos), "{}", text);
        }

        /// What `format_duration` writes (millisecond resolution) parses back to the same
        /// duration.
        #[test]
        fn format_round_trips(millis in 0u64..=u64::MAX / 1_000) {
            let d = Duration::from_millis(millis);
            prop_assert_eq!(parse_duration(&format_duration(d)), Some(d));
        }

        /// Everything the CRD schema's pattern lets through parses; only values beyond
        /// u64 seconds (at least 17 characters, such as 5124095576030432h) may not.
        #[test]
        fn the_schema_pattern_accepts_only_durations(
            text in prop::string::string_regex(PATTERN.trim_start_matches('^').trim_end_matches('$'))
                .expect("PATTERN is a regex"),
        ) {
            prop_assert!(
                parse_duration(&text).is_some() || text.chars().count() >= 17,
                "{:?}",
                text
            );
        }
    }

    #[test]
    fn formats_short() {
        assert_eq!(format_duration(Duration::from_secs(0)), "0s");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.500s");
    }
}
