//! Bounded command-line values. A flag outside its range is refused at startup with a
//! message that names the flag (clap adds it) and the range, instead of a hub that divides by
//! a zero interval or an agent that overflows a timer.

use std::time::Duration;

/// A clap value parser for a humantime duration (`500ms`, `5s`, `1m`, `30days`) within
/// `min..=max`.
pub fn duration_within(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let value = humantime::parse_duration(text.trim())
            .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 500ms, 5s or 1m"))?;
        within(value, min, max)
    }
}

/// `value` when it lies within `min..=max`, else an error giving the range.
pub fn within(value: Duration, min: Duration, max: Duration) -> Result<Duration, String> {
    if value < min || value > max {
        return Err(format!(
            "must be between {} and {}, got {}",
            show(min),
            show(max),
            show(value)
        ));
    }
    Ok(value)
}

/// A duration the way it would be written on the command line: whole days as `Ndays` (so
/// a bound reads `3650days`, not `9years 11months …`), else humantime's form.
fn show(duration: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    let secs = duration.as_secs();
    if duration.subsec_nanos() == 0 && secs >= DAY && secs.is_multiple_of(DAY) {
        format!("{}days", secs / DAY)
    } else {
        humantime::format_duration(duration).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_range_parse_and_others_say_the_range() {
        let parse = duration_within(Duration::from_millis(100), Duration::from_secs(600));
        assert_eq!(parse("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse(" 10m "), Ok(Duration::from_secs(600)));
        for (bad, expected) in [
            ("0s", "must be between 100ms and 10m, got 0s"),
            ("99ms", "got 99ms"),
            ("10m 1s", "got 10m 1s"),
            ("2days", "got 2days"),
            ("5124095576030431h", "must be between 100ms and 10m"),
            ("99999999999999999999999h", "is not a duration"),
            ("soon", "is not a duration"),
            ("", "is not a duration"),
            ("-1s", "is not a duration"),
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }
}
