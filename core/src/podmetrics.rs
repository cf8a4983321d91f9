//! Scaling on what the pods say: the `kedge-pod-metrics` trigger of a DSO, in the vocabulary
//! of Kaito's KEDA external scaler (`kaito-keda-scaler.md`).
//!
//! - [`PodMetricsTrigger::parse`] reads a trigger's `metadata` with Kaito's defaults and
//!   refuses what cannot be scraped (an unknown key, such as the reference's own
//!   `metricPorotocol` typo, is an error naming the key it resembles).
//! - [`metric_sum`] reads one metric out of a pod's Prometheus text exposition (what an
//!   agent scrapes).
//! - [`fleet_average`] combines the members' samples the way Kaito's scaler combines its
//!   pods, including its rule for pods without a value.

use std::time::Duration;

use crate::duration::parse_duration;
use crate::{Error, Result};

/// The trigger `type` a DSO names to scale on its pods' metrics.
pub const TRIGGER_TYPE: &str = "kedge-pod-metrics";
/// The metadata key of the child ScaledObject's `external` trigger naming the index of the
/// DSO's `kedge-pod-metrics` trigger it stands for.
pub const TRIGGER_INDEX_KEY: &str = "kedgeTrigger";
/// Kaito's default metric: requests waiting for a vLLM engine.
pub const DEFAULT_METRIC_NAME: &str = "vllm:num_requests_waiting";
/// Kaito's default target average per pod.
pub const DEFAULT_THRESHOLD: f64 = 10.0;
/// Kaito's default port (vLLM's metrics port in Kaito's images).
pub const DEFAULT_METRIC_PORT: u16 = 5000;
/// Kaito's default path.
pub const DEFAULT_METRIC_PATH: &str = "/metrics";
/// Kaito's default scrape timeout.
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest scrape timeout accepted: a scrape must end well within KEDA's polling.
pub const MAX_SCRAPE_TIMEOUT: Duration = Duration::from_secs(60);
/// How a missing pod counts when the pods that answered average at most the threshold
/// (Kaito: 1.5 × threshold, so scale-down is not premature).
pub const MISSING_LOW_LOAD_FACTOR: f64 = 1.5;
/// Longest `metricPath`.
pub const MAX_METRIC_PATH: usize = 256;

const KEYS: [&str; 6] = [
    "metricName",
    "threshold",
    "metricPort",
    "metricPath",
    "metricProtocol",
    "scrapeTimeout",
];

/// How the agent reaches a pod's metrics port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Plain HTTP.
    Http,
    /// HTTPS (Kaito's default). The pod's certificate is not verified: it is the pod's own,
    /// reached at its IP from inside its cluster, as Kaito's scaler reaches it.
    Https,
}

impl Protocol {
    /// The URL scheme.
    pub fn scheme(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Https => "https",
        }
    }
}

/// The port a pod serves its metrics on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricPort {
    /// A port number.
    Number(u16),
    /// A container port's name, looked up in the pod's spec.
    Name(String),
}

/// The settings of one `kedge-pod-metrics` trigger.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMetricsTrigger {
    /// The metric to read; every series of it in a pod's exposition is summed.
    pub metric_name: String,
    /// The target average per pod.
    pub threshold: f64,
    /// Where the pods serve their metrics.
    pub metric_port: MetricPort,
    /// The path of the metrics endpoint.
    pub metric_path: String,
    /// `http` or `https`.
    pub metric_protocol: Protocol,
    /// How long one pod's scrape may take.
    pub scrape_timeout: Duration,
}

impl PodMetricsTrigger {
    /// Reads a trigger's `metadata`; `at` is the trigger's field path for errors. Every
    /// problem is reported, not only the first.
    pub fn parse<'a>(
        at: &str,
        metadata: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Self> {
        let mut problems = Vec::new();
        let mut trigger = PodMetricsTrigger {
            metric_name: DEFAULT_METRIC_NAME.to_owned(),
            threshold: DEFAULT_THRESHOLD,
            metric_port: MetricPort::Number(DEFAULT_METRIC_PORT),
            metric_path: DEFAULT_METRIC_PATH.to_owned(),
            metric_protocol: Protocol::Https,
            scrape_timeout: DEFAULT_SCRAPE_TIMEOUT,
        };
        for (key, value) in metadata {
            let field = format!("{at}.metadata.{key}");
            let value = value.trim();
            let parsed = match key.as_str() {
                "metricName" => metric_name(value).map(|v| trigger.metric_name = v),
                "threshold" => threshold(value).map(|v| trigger.threshold = v),
                "metricPort" => metric_port(value).map(|v| trigger.metric_port = v),
                "metricPath" => metric_path(value).map(|v| trigger.metric_path = v),
                "metricProtocol" => protocol(value).map(|v| trigger.metric_protocol = v),
                "scrapeTimeout" => scrape_timeout(value).map(|v| trigger.scrape_timeout = v),
                other => Err(unknown_key(other)),
            };
            if let Err(message) = parsed {
                problems.push(Error::invalid(field, message));
            }
        }
        Error::collect(problems).map(|()| trigger)
    }
}

fn unknown_key(key: &str) -> String {
    let lowercase = key.to_ascii_lowercase();
    let near = KEYS
        .iter()
        .map(|k| (edit_distance(&k.to_ascii_lowercase(), &lowercase), k))
        .min_by_key(|(distance, _)| *distance)
        .filter(|(distance, _)| *distance <= 3);
    match near {
        Some((_, k)) => format!("unknown key {key:?}; did you mean {k:?}?"),
        None => format!("unknown key {key:?}; the keys are {}", KEYS.join(", ")),
    }
}

/// Levenshtein distance over bytes (keys are ASCII and short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

fn metric_name(value: &str) -> Result<String, String> {
    if value.len() <= 200 && is_metric_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, at most 200 \
             characters), e.g. {DEFAULT_METRIC_NAME}"
        ))
    }
}

fn threshold(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{value:?} is not a positive number (the target average per pod, e.g. \"10\")"
        )),
    }
}

fn metric_port(value: &str) -> Result<MetricPort, String> {
    if let Ok(n) = value.parse::<u32>() {
        return match u16::try_from(n) {
            Ok(port) if port > 0 => Ok(MetricPort::Number(port)),
            _ => Err(format!("port {n} is outside 1-65535")),
        };
    }
    // A container port name (IANA_SVC_NAME): at most 15 lowercase letters, digits and
    // hyphens, with a letter, neither starting nor ending with a hyphen, no "--".
    let valid = !value.is_empty()
        && value.len() <= 15
        && value
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && value.bytes().any(|c| c.is_ascii_lowercase())
        && !value.starts_with('-')
        && !value.ends_with('-')
        && !value.contains("--");
    if valid {
        Ok(MetricPort::Name(value.to_owned()))
    } else {
        Err(format!(
            "{value:?} is neither a port number (1-65535) nor a container port name (at most \
             15 lowercase letters, digits and '-')"
        ))
    }
}

fn metric_path(value: &str) -> Result<String, String> {
    let valid = value.starts_with('/')
        && value.len() <= MAX_METRIC_PATH
        && value.bytes().all(|c| c.is_ascii_graphic())
        && !value.contains(['?', '#']);
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a path: it starts with '/', has no spaces, query or fragment, and \
             at most {MAX_METRIC_PATH} characters (e.g. {DEFAULT_METRIC_PATH})"
        ))
    }
}

fn protocol(value: &str) -> Result<Protocol, String> {
    match value {
        "http" => Ok(Protocol::Http),
        "https" => Ok(Protocol::Https),
        other => Err(format!("{other:?} is not http or https")),
    }
}

fn scrape_timeout(value: &str) -> Result<Duration, String> {
    // Kaito writes seconds ("5"); a duration ("500ms", "5s") reads too.
    let parsed = value
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
        .or_else(|| parse_duration(value));
    match parsed {
        Some(d) if !d.is_zero() && d <= MAX_SCRAPE_TIMEOUT => Ok(d),
        _ => Err(format!(
            "{value:?} is not a timeout between 1ms and {}s (seconds, e.g. \"5\", or a \
             duration, e.g. \"500ms\")",
            MAX_SCRAPE_TIMEOUT.as_secs()
        )),
    }
}

/// Why a pod's exposition could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpositionError {
    /// A sample line of the metric does not parse.
    #[error("line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The sum of every series of `name` in a Prometheus text exposition (a vLLM engine serving
/// several models exposes one series per model). `Ok(None)`: the metric is not there (the
/// pod counts as missing). A value that is not a finite number is an error, as is a sample
/// line of the metric that does not parse; lines of other metrics are not looked at beyond
/// their name.
pub fn metric_sum(text: &str, name: &str) -> Result<Option<f64>, ExpositionError> {
    let mut sum: Option<f64> = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_ascii_whitespace())
            .unwrap_or(line.len());
        if &line[..end] != name {
            continue;
        }
        let malformed = |reason: &str| ExpositionError::Malformed {
            line: i + 1,
            reason: reason.to_owned(),
        };
        let mut rest = &line[end..];
        if rest.starts_with('{') {
            let close = label_set_end(rest).ok_or_else(|| malformed("unterminated label set"))?;
            rest = &rest[close + 1..];
        }
        let value = rest
            .split_ascii_whitespace()
            .next()
            .ok_or_else(|| malformed("no value"))?;
        let value = parse_value(value).ok_or_else(|| malformed("value is not a number"))?;
        if !value.is_finite() {
            return Err(malformed("value is not finite"));
        }
        let total = sum.unwrap_or(0.0) + value;
        if !total.is_finite() {
            return Err(malformed("the sum is not finite"));
        }
        sum = Some(total);
    }
    Ok(sum)
}

/// The index of the `}` closing the label set `s` starts with, minding quoted values and
/// their escapes.
fn label_set_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => quoted = false,
            (false, _, '"') => quoted = true,
            (false, _, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// What one member's agent read of a DSO's pods in one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemberSample {
    /// The sum of the values of the pods that had one.
    pub sum: f64,
    /// Pods that had a value.
    pub counted: u32,
    /// Pods that had none: not ready, not answering, or without the metric. The pods of a
    /// member that cannot be reached count here too.
    pub missing: u32,
}

/// The fleet-wide value of a pod-metrics trigger.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FleetValue {
    /// The per-pod average KEDA is given, missing pods counted by Kaito's rule.
    pub average: f64,
    /// The average over the pods that had a value.
    pub measured_average: f64,
    /// Pods that had a value.
    pub counted: u64,
    /// Pods that had none.
    pub missing: u64,
    /// What each missing pod counted as.
    pub missing_counted_as: f64,
}

/// Combines the members' samples as Kaito's scaler combines its pods: the average over every
/// pod, where a pod without a value counts as 0 when the pods that have one average above
/// `threshold` (scale-up is not exaggerated) and as 1.5 × `threshold` otherwise (scale-down
/// is not premature).
///
/// `None` when no pod at all had a value: then there is nothing to scale on, and the scaler
/// says so (KEDA keeps the replicas, or applies the ScaledObject's `fallback`). Kaito's rule
/// would give 1.5 × `threshold` there, which makes the HPA scale up again at every poll for
/// as long as the metric stays unreadable.
pub fn fleet_average(
    threshold: f64,
    samples: impl IntoIterator<Item = MemberSample>,
) -> Option<FleetValue> {
    let (mut sum, mut counted, mut missing) = (0.0, 0u64, 0u64);
    for s in samples {
        sum += s.sum;
        counted += u64::from(s.counted);
        missing += u64::from(s.missing);
    }
    if counted == 0 || !sum.is_finite() {
        return None;
    }
    let measured_average = sum / counted as f64;
    let missing_counted_as = if measured_average > threshold {
        0.0
    } else {
        MISSING_LOW_LOAD_FACTOR * threshold
    };
    let average = (sum + missing_counted_as * missing as f64) / (counted + missing) as f64;
    Some(FleetValue {
        average,
        measured_average,
        counted,
        missing,
        missing_counted_as,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<PodMetricsTrigger> {
        let metadata: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        PodMetricsTrigger::parse("spec.scaledObjectSpec.triggers[0]", &metadata)
    }

    #[test]
    fn kaitos_defaults_apply_to_what_is_not_written() {
        let t = parse(&[]).unwrap();
        assert_eq!(t.metric_name, "vllm:num_requests_waiting");
        assert_eq!(t.threshold, 10.0);
        assert_eq!(t.metric_port, MetricPort::Number(5000));
        assert_eq!(t.metric_path, "/metrics");
        assert_eq!(t.metric_protocol, Protocol::Https);
        assert_eq!(t.scrape_timeout, Duration::from_secs(5));

        let t = parse(&[
            ("metricName", "queue_depth"),
            ("threshold", "2.5"),
            ("metricPort", "metrics"),
            ("metricPath", "/stats/prometheus"),
            ("metricProtocol", "http"),
            ("scrapeTimeout", "750ms"),
        ])
        .unwrap();
        assert_eq!(t.metric_name, "queue_depth");
        assert_eq!(t.threshold, 2.5);
        assert_eq!(t.metric_port, MetricPort::Name("metrics".into()));
        assert_eq!(t.metric_path, "/stats/prometheus");
        assert_eq!(t.metric_protocol, Protocol::Http);
        assert_eq!(t.scrape_timeout, Duration::from_millis(750));
        assert_eq!(
            parse(&[("scrapeTimeout", "3")]).unwrap().scrape_timeout,
            Duration::from_secs(3)
        );
    }

    #[test]
    fn every_bad_value_is_named_with_what_is_accepted() {
        let err = parse(&[
            ("metricName", "vllm num requests"),
            ("threshold", "0"),
            ("metricPort", "70000"),
            ("metricPath", "metrics"),
            ("metricProtocol", "grpc"),
            ("scrapeTimeout", "5m"),
            ("metricPorotocol", "https"),
            ("color", "blue"),
        ])
        .unwrap_err()
        .to_string();
        for expected in [
            "triggers[0].metadata.metricName: \"vllm num requests\" is not a Prometheus metric name",
            "triggers[0].metadata.threshold: \"0\" is not a positive number",
            "triggers[0].metadata.metricPort: port 70000 is outside 1-65535",
            "triggers[0].metadata.metricPath: \"metrics\" is not a path",
            "triggers[0].metadata.metricProtocol: \"grpc\" is not http or https",
            "triggers[0].metadata.scrapeTimeout: \"5m\" is not a timeout",
            "metricPorotocol: unknown key \"metricPorotocol\"; did you mean \"metricProtocol\"?",
            "color: unknown key \"color\"; the keys are metricName, threshold",
        ] {
            assert!(err.contains(expected), "{expected:?} not in {err}");
        }
        for bad in ["NaN", "inf", "-1", "ten"] {
            assert!(parse(&[("threshold", bad)]).is_err(), "{bad}");
        }
        for bad in [
            "0",
            "-metrics",
            "Metrics",
            "a--b",
            "sixteen-letters-",
            "123456",
        ] {
            assert!(parse(&[("metricPort", bad)]).is_err(), "{bad}");
        }
        for bad in ["/a b", "/m?x=1", "/m#f", ""] {
            assert!(parse(&[("metricPath", bad)]).is_err(), "{bad:?}");
        }
    }

    const VLLM: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="phi-3"} 7.0
vllm:num_requests_waiting{engine="1",model_name="odd \"}\" name"} 3 1712345678000
vllm:num_requests_waiting_total 100
vllm:num_requests_running{model_name="phi-3"} 2.0
"#;

    #[test]
    fn the_series_of_the_metric_are_summed_and_nothing_else() {
        assert_eq!(
            metric_sum(VLLM, "vllm:num_requests_waiting"),
            Ok(Some(10.0))
        );
        assert_eq!(metric_sum(VLLM, "vllm:num_requests_running"), Ok(Some(2.0)));
        assert_eq!(metric_sum(VLLM, "vllm:gpu_cache_usage_perc"), Ok(None));
        assert_eq!(metric_sum("queue 4\n", "queue"), Ok(Some(4.0)));
    }

    #[test]
    fn a_sample_of_the_metric_that_does_not_read_is_an_error() {
        for bad in [
            "m{a=\"1\" 3\n",
            "m{a=\"1\"}\n",
            "m{a=\"1\"} many\n",
            "m NaN\n",
            "m +Inf\n",
            "m 1e308\nm 1e308\n",
        ] {
            assert!(metric_sum(bad, "m").is_err(), "{bad:?}");
        }
        // Other metrics' lines are not read beyond their name.
        assert_eq!(metric_sum("other{ garbage\nm 1\n", "m"), Ok(Some(1.0)));
    }

    fn sample(sum: f64, counted: u32, missing: u32) -> MemberSample {
        MemberSample {
            sum,
            counted,
            missing,
        }
    }

    #[test]
    fn missing_pods_count_by_kaitos_rule() {
        // Every pod answered: the plain average.
        let v = fleet_average(10.0, [sample(30.0, 2, 0), sample(6.0, 2, 0)]).unwrap();
        assert_eq!(v.average, 9.0);
        assert_eq!((v.counted, v.missing), (4, 0));

        // Load above the threshold: a missing pod counts as 0, not exaggerating scale-up.
        let v = fleet_average(10.0, [sample(40.0, 2, 0), sample(0.0, 0, 2)]).unwrap();
        assert_eq!(v.missing_counted_as, 0.0);
        assert_eq!(v.average, 10.0);
        assert_eq!(v.measured_average, 20.0);

        // Load at or below it: a missing pod counts as 1.5 x threshold, so a member cut off
        // does not make the fleet look idle.
        let v = fleet_average(10.0, [sample(8.0, 2, 0), sample(0.0, 0, 2)]).unwrap();
        assert_eq!(v.missing_counted_as, 15.0);
        assert_eq!(v.average, (8.0 + 30.0) / 4.0);

        // Nothing to scale on.
        assert_eq!(fleet_average(10.0, [sample(0.0, 0, 3)]), None);
        assert_eq!(fleet_average(10.0, []), None);
    }

    proptest! {
        #[test]
        fn the_average_stays_between_its_bounds(
            samples in proptest::collection::vec((0.0f64..1e6, 0u32..50, 0u32..50), 0..20),
            threshold in 0.1f64..1e3,
        ) {
            let samples: Vec<_> = samples.into_iter().map(|(s, c, m)| sample(s * f64::from(c), c, m)).collect();
            match fleet_average(threshold, samples.iter().copied()) {
                None => prop_assert!(samples.iter().all(|s| s.counted == 0)),
                Some(v) => {
                    prop_assert!(v.average.is_finite() && v.average >= 0.0);
                    if v.missing == 0 {
                        prop_assert!((v.average - v.measured_average).abs() <= 1e-9 * v.average.max(1.0));
                    } else if v.measured_average > threshold {
                        // Missing pods count as 0: they only pull a high average down.
                        prop_assert!(v.average <= v.measured_average + 1e-9);
                    } else {
                        // ... and a low one up, to at most 1.5 x threshold.
                        prop_assert!(v.average >= v.measured_average - 1e-9);
                        prop_assert!(v.average <= 1.5 * threshold + 1e-9);
                    }
                }
            }
        }

        #[test]
        fn any_exposition_reads_without_panicking(text in "\\PC{0,400}") {
            let _ = metric_sum(&text, "m");
        }
    }
}
