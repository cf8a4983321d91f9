//! `LinkSpec`: what a link does to the datagrams crossing it, parsed from
//! `rtt=600ms,jitter=50ms,loss=5,rate=64kbit,blackout=30s/120s,rebind=20s,seed=7`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The keys a SPEC may hold, in the order [`LinkSpec`]'s `Display` writes them.
pub const KEYS: [&str; 7] = [
    "rtt", "jitter", "loss", "rate", "blackout", "rebind", "seed",
];

/// The shortest `rebind` interval: rebinding is a socket bind, not free.
pub const MIN_REBIND: Duration = Duration::from_millis(10);

/// What a link does to traffic; `Default` is a perfect link (forwards everything at once).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LinkSpec {
    /// Round-trip delay; each direction adds half.
    pub rtt: Duration,
    /// Spread of each one-way delay: uniformly within `rtt/2 ± jitter/2` (never below zero),
    /// drawn per datagram, so a round trip lies within `rtt ± jitter`.
    pub jitter: Duration,
    /// Percent (`0.0..=100.0`) of datagrams lost, independently per datagram and direction.
    pub loss: f64,
    /// Bits per second in each direction (`None`: unlimited).
    pub rate: Option<u64>,
    /// Periodic outage: the link is up for `period - down`, then down for `down`, repeating.
    pub blackout: Option<Blackout>,
    /// Every interval the source address the hub sees changes, as after a NAT rebinding.
    pub rebind: Option<Duration>,
    /// Seed of the loss and jitter draws (`None`: one derived from the clock).
    pub seed: Option<u64>,
}

/// `blackout=DOWN/PERIOD`: down for `down` of every `period` (`0 < down < period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blackout {
    /// How long each outage lasts.
    pub down: Duration,
    /// How often an outage starts.
    pub period: Duration,
}

impl Blackout {
    /// Whether the link is down `since` the phase's anchor (up first, then down).
    pub fn is_down(&self, since: Duration) -> bool {
        let period = self.period.as_nanos();
        let phase = since.as_nanos() % period.max(1);
        phase >= period.saturating_sub(self.down.as_nanos())
    }
}

/// Why a SPEC does not parse; the message names the key and what it allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(String);

impl FromStr for LinkSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let err = |m: String| Err(SpecError(m));
        if text.trim().is_empty() {
            return err(format!(
                "empty link SPEC: give comma-separated KEY=VALUE pairs, keys {}",
                KEYS.join(", ")
            ));
        }
        let mut spec = LinkSpec::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split(',') {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return err(format!(
                    "{item:?}: missing '=' (write KEY=VALUE, keys {})",
                    KEYS.join(", ")
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            let Some(known) = KEYS.iter().find(|k| **k == key) else {
                return err(format!(
                    "unknown key {key:?}: the keys are {}",
                    KEYS.join(", ")
                ));
            };
            if seen.contains(known) {
                return err(format!("{key} given twice"));
            }
            seen.push(known);
            let bad = |what: &str| SpecError(format!("{key}={value}: {what}"));
            match key {
                "rtt" => spec.rtt = duration(value).map_err(|e| bad(&e))?,
                "jitter" => spec.jitter = duration(value).map_err(|e| bad(&e))?,
                "loss" => spec.loss = loss(value).map_err(|e| bad(&e))?,
                "rate" => spec.rate = Some(rate(value).map_err(|e| bad(&e))?),
                "blackout" => spec.blackout = Some(blackout(value).map_err(|e| bad(&e))?),
                "rebind" => {
                    let every = duration(value).map_err(|e| bad(&e))?;
                    if every < MIN_REBIND {
                        return Err(bad(&format!(
                            "the interval must be at least {}",
                            format_duration(MIN_REBIND)
                        )));
                    }
                    spec.rebind = Some(every);
                }
                _ => {
                    spec.seed = Some(value.parse().map_err(|_| {
                        bad("the seed must be a whole number from 0 to 18446744073709551615")
                    })?);
                }
            }
        }
        Ok(spec)
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("not a duration ({e}); write e.g. 600ms, 30s or 2m"))
}

fn loss(text: &str) -> Result<f64, String> {
    let allowed = "the loss is a percent from 0 to 100, e.g. 5 or 0.5";
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(allowed.to_owned()),
    }
}

/// `64kbit`, `1.5Mbit`, `500000bps`: bits per second with an optional `k`, `M` or `G`,
/// read exactly (no float rounding).
fn rate(text: &str) -> Result<u64, String> {
    let allowed = || {
        "a rate is a whole number of bits per second like 64kbit, 1.5Mbit, 1Gbit or \
         500000bps (suffixes k, M, G; unit bit or bps), from 1bit to 1000Gbit"
            .to_owned()
    };
    let number = text
        .strip_suffix("bit")
        .or_else(|| text.strip_suffix("bps"))
        .ok_or_else(allowed)?;
    let (number, scale): (&str, u64) = if let Some(n) = number.strip_suffix('k') {
        (n, 1_000)
    } else if let Some(n) = number.strip_suffix('M') {
        (n, 1_000_000)
    } else if let Some(n) = number.strip_suffix('G') {
        (n, 1_000_000_000)
    } else {
        (number, 1)
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 9 {
        return Err(allowed());
    }
    let whole: u64 = whole.parse().map_err(|_| allowed())?;
    let mut bits = whole.checked_mul(scale).ok_or_else(allowed)?;
    let mut place = scale;
    for digit in fraction.chars().filter_map(|c| c.to_digit(10)) {
        if !(u64::from(digit) * place).is_multiple_of(10) {
            return Err(allowed());
        }
        place /= 10;
        bits += u64::from(digit) * place;
    }
    if !(1..=1_000_000_000_000).contains(&bits) {
        return Err(allowed());
    }
    Ok(bits)
}

fn blackout(text: &str) -> Result<Blackout, String> {
    let (down, period) = text
        .split_once('/')
        .ok_or_else(|| "write DOWN/PERIOD, e.g. 30s/120s (down 30 s of every 120 s)".to_owned())?;
    let (down, period) = (duration(down.trim())?, duration(period.trim())?);
    if down.is_zero() || down >= period {
        return Err("DOWN must be more than 0 and less than PERIOD".to_owned());
    }
    Ok(Blackout { down, period })
}

/// A duration in one unit, exactly (`600ms`, `30s`, `1500us`), which humantime reads back.
fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        "0s".to_owned()
    } else if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

fn format_rate(bits: u64) -> String {
    match bits {
        b if b.is_multiple_of(1_000_000_000) => format!("{}Gbit", b / 1_000_000_000),
        b if b.is_multiple_of(1_000_000) => format!("{}Mbit", b / 1_000_000),
        b if b.is_multiple_of(1_000) => format!("{}kbit", b / 1_000),
        b => format!("{b}bit"),
    }
}

/// The SPEC syntax, with only what differs from a perfect link; a perfect link is `rtt=0s`.
impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.rtt.is_zero() {
            parts.push(format!("rtt={}", format_duration(self.rtt)));
        }
        if !self.jitter.is_zero() {
            parts.push(format!("jitter={}", format_duration(self.jitter)));
        }
        if self.loss != 0.0 {
            parts.push(format!("loss={}", self.loss));
        }
        if let Some(rate) = self.rate {
            parts.push(format!("rate={}", format_rate(rate)));
        }
        if let Some(b) = self.blackout {
            parts.push(format!(
                "blackout={}/{}",
                format_duration(b.down),
                format_duration(b.period)
            ));
        }
        if let Some(every) = self.rebind {
            parts.push(format!("rebind={}", format_duration(every)));
        }
        if let Some(seed) = self.seed {
            parts.push(format!("seed={seed}"));
        }
        if parts.is_empty() {
            parts.push("rtt=0s".to_owned());
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(text: &str) -> Result<LinkSpec, String> {
        text.parse::<LinkSpec>().map_err(|e| e.to_string())
    }

    #[test]
    fn the_issue_example_parses() {
        let spec = parse("rtt=600ms,jitter=50ms,loss=5,rate=64kbit,blackout=30s/120s,rebind=20s")
            .expect("valid");
        assert_eq!(
            spec,
            LinkSpec {
                rtt: Duration::from_millis(600),
                jitter: Duration::from_millis(50),
                loss: 5.0,
                rate: Some(64_000),
                blackout: Some(Blackout {
                    down: Duration::from_secs(30),
                    period: Duration::from_secs(120),
                }),
                rebind: Some(Duration::from_secs(20)),
                seed: None,
            }
        );
    }

    #[test]
    fn values_in_every_allowed_spelling() {
        let cases: [(&str, LinkSpec); 9] = [
            (
                "loss=0.5",
                LinkSpec {
                    loss: 0.5,
                    ..LinkSpec::default()
                },
            ),
            (
                "loss=100",
                LinkSpec {
                    loss: 100.0,
                    ..LinkSpec::default()
                },
            ),
            (
                "rate=1.5Mbit",
                LinkSpec {
                    rate: Some(1_500_000),
                    ..LinkSpec::default()
                },
            ),
            (
                "rate=500000bps",
                LinkSpec {
                    rate: Some(500_000),
                    ..LinkSpec::default()
                },
            ),
            (
                "rate=2Gbps",
                LinkSpec {
                    rate: Some(2_000_000_000),
                    ..LinkSpec::default()
                },
            ),
            (
                "rate=1bit",
                LinkSpec {
                    rate: Some(1),
                    ..LinkSpec::default()
                },
            ),
            (
                "rtt=1m 30s",
                LinkSpec {
                    rtt: Duration::from_secs(90),
                    ..LinkSpec::default()
                },
            ),
            (
                " seed = 7 , rtt=0s",
                LinkSpec {
                    seed: Some(7),
                    ..LinkSpec::default()
                },
            ),
            (
                "rebind=10ms",
                LinkSpec {
                    rebind: Some(MIN_REBIND),
                    ..LinkSpec::default()
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn every_bad_spec_names_the_key_and_what_is_allowed() {
        let cases = [
            ("", "empty link SPEC"),
            ("rtt", "\"rtt\": missing '='"),
            (
                "latency=5ms",
                "unknown key \"latency\": the keys are rtt, jitter, loss",
            ),
            ("rtt=5ms,rtt=6ms", "rtt given twice"),
            ("rtt=-5ms", "rtt=-5ms: not a duration"),
            ("jitter=fast", "jitter=fast: not a duration"),
            ("loss=-1", "loss=-1: the loss is a percent from 0 to 100"),
            ("loss=NaN", "loss=NaN: the loss is a percent"),
            ("loss=101", "loss=101: the loss is a percent"),
            ("loss=5%", "loss=5%: the loss is a percent"),
            (
                "rate=0kbit",
                "rate=0kbit: a rate is a whole number of bits per second",
            ),
            ("rate=64k", "rate=64k: a rate is a whole number"),
            ("rate=-64kbit", "rate=-64kbit: a rate"),
            ("rate=0.5bit", "rate=0.5bit: a rate"),
            ("blackout=30s", "blackout=30s: write DOWN/PERIOD"),
            (
                "blackout=120s/30s",
                "blackout=120s/30s: DOWN must be more than 0 and less than PERIOD",
            ),
            (
                "blackout=30s/30s",
                "DOWN must be more than 0 and less than PERIOD",
            ),
            ("blackout=0s/30s", "DOWN must be more than 0"),
            (
                "rebind=1ms",
                "rebind=1ms: the interval must be at least 10ms",
            ),
            ("seed=-1", "seed=-1: the seed must be a whole number"),
        ];
        for (text, want) in cases {
            let got = parse(text).expect_err(text);
            assert!(got.contains(want), "{text:?}: {got:?} lacks {want:?}");
        }
    }

    #[test]
    fn display_writes_what_differs_from_a_perfect_link() {
        assert_eq!(LinkSpec::default().to_string(), "rtt=0s");
        assert_eq!(parse("rtt=0s"), Ok(LinkSpec::default()));
        let text = "rtt=600ms,jitter=50ms,loss=5,rate=64kbit,blackout=30s/2m,rebind=20s,seed=9";
        assert_eq!(
            parse(text).expect("valid").to_string(),
            "rtt=600ms,jitter=50ms,loss=5,rate=64kbit,blackout=30s/120s,rebind=20s,seed=9"
        );
        assert_eq!(
            parse("rate=1500kbit,rtt=1500us")
                .expect("valid")
                .to_string(),
            "rtt=1500us,rate=1500kbit"
        );
    }

    #[test]
    fn blackout_is_up_first_then_down() {
        let b = Blackout {
            down: Duration::from_secs(30),
            period: Duration::from_secs(120),
        };
        let down = |s: u64| b.is_down(Duration::from_secs(s));
        assert!(!down(0) && !down(89) && down(90) && down(119) && !down(120) && down(210));
    }

    fn duration_strategy() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            (0u64..10_000_000_000_000).prop_map(Duration::from_nanos),
            (0u64..100_000).prop_map(Duration::from_millis),
        ]
    }

    fn spec_strategy() -> impl Strategy<Value = LinkSpec> {
        (
            duration_strategy(),
            duration_strategy(),
            prop_oneof![
                Just(0.0),
                0.0f64..=100.0,
                (0u32..=1000).prop_map(|p| f64::from(p) / 10.0)
            ],
            proptest::option::of(1u64..=1_000_000_000_000),
            proptest::option::of((1u64..1_000_000, 1u64..1_000_000).prop_map(|(d, extra)| {
                Blackout {
                    down: Duration::from_millis(d),
                    period: Duration::from_millis(d + extra),
                }
            })),
            proptest::option::of((10u64..10_000_000).prop_map(Duration::from_millis)),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                |(rtt, jitter, loss, rate, blackout, rebind, seed)| LinkSpec {
                    rtt,
                    jitter,
                    loss,
                    rate,
                    blackout,
                    rebind,
                    seed,
                },
            )
    }

    proptest! {
        #[test]
        fn display_round_trips(spec in spec_strategy()) {
            let text = spec.to_string();
            prop_assert_eq!(parse(&text), Ok(spec), "{}", text);
        }

        #[test]
        fn parsing_any_text_never_panics(text in ".{0,60}") {
            let _ = text.parse::<LinkSpec>();
        }
    }
}
