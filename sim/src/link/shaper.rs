//! What happens to one datagram in one direction: pure, with time as a parameter (the
//! time since the spec's anchor) and every random draw from one seeded generator, so the
//! same seed and the same sequence of datagrams give the same decisions.

use std::time::Duration;

use super::spec::LinkSpec;

/// Most bytes waiting to be serialized at a `rate` per direction; a datagram that would
/// overflow it is dropped (drop-tail, as a router's buffer).
pub const QUEUE_BYTES: u64 = 64 * 1024;

/// What becomes of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Deliver it this long from now.
    Deliver(Duration),
    /// Lost to `loss`.
    Lost,
    /// Dropped by a blackout's down phase.
    BlackedOut,
    /// The rate queue is full.
    QueueFull,
}

/// One direction's shaping state: its generator and the rate queue's tail.
#[derive(Debug, Clone)]
pub(crate) struct Shaper {
    rng: SplitMix64,
    /// When (since the anchor) the last queued datagram finishes serializing.
    busy_until: Duration,
}

impl Shaper {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64(seed),
            busy_until: Duration::ZERO,
        }
    }

    /// Decides the fate of a datagram of `size` bytes arriving `now` (since the anchor).
    /// Each datagram not blacked out takes exactly two draws (loss, jitter).
    pub(crate) fn admit(&mut self, spec: &LinkSpec, now: Duration, size: usize) -> Verdict {
        if spec.blackout.is_some_and(|b| b.is_down(now)) {
            return Verdict::BlackedOut;
        }
        let (loss_draw, jitter_draw) = (self.rng.unit(), self.rng.unit());
        if loss_draw * 100.0 < spec.loss {
            return Verdict::Lost;
        }
        let departs = match spec.rate {
            Some(rate) => {
                let waiting = self.busy_until.saturating_sub(now);
                let queued_bytes = waiting.as_nanos() * u128::from(rate) / 8 / 1_000_000_000;
                let size = size as u128;
                if queued_bytes + size > u128::from(QUEUE_BYTES) {
                    return Verdict::QueueFull;
                }
                let nanos = size * 8 * 1_000_000_000 / u128::from(rate);
                let serialize = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
                self.busy_until = now.max(self.busy_until).saturating_add(serialize);
                self.busy_until - now
            }
            None => Duration::ZERO,
        };
        Verdict::Deliver(departs.saturating_add(one_way_delay(spec, jitter_draw)))
    }
}

/// `rtt/2` moved by up to `jitter/2` either way by `draw` (in `0..1`), never below zero.
fn one_way_delay(spec: &LinkSpec, draw: f64) -> Duration {
    let half = spec.rtt / 2;
    let offset = spec.jitter.mul_f64(draw);
    half.saturating_add(offset).saturating_sub(spec.jitter / 2)
}

/// splitmix64: small, fast and well distributed; not for cryptography.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..1`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The seeds of the two directions' generators, distinct streams from one seed.
pub(crate) fn direction_seeds(seed: u64) -> (u64, u64) {
    let mut g = SplitMix64(seed);
    (g.next(), g.next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::spec::Blackout;

    fn spec(text: &str) -> LinkSpec {
        text.parse().expect("valid spec")
    }

    fn run(spec: &LinkSpec, seed: u64, n: usize) -> Vec<Verdict> {
        let mut s = Shaper::new(seed);
        (0..n)
            .map(|i| s.admit(spec, Duration::from_millis(i as u64), 1200))
            .collect()
    }

    #[test]
    fn a_perfect_link_delivers_at_once() {
        assert!(
            run(&LinkSpec::default(), 1, 100)
                .iter()
                .all(|v| *v == Verdict::Deliver(Duration::ZERO))
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_decisions() {
        let s = spec("loss=30,jitter=40ms,rtt=100ms");
        assert_eq!(run(&s, 42, 2000), run(&s, 42, 2000));
        assert_ne!(run(&s, 42, 2000), run(&s, 43, 2000));
    }

    #[test]
    fn loss_is_about_the_percent() {
        let lost = run(&spec("loss=5"), 7, 20_000)
            .iter()
            .filter(|v| **v == Verdict::Lost)
            .count();
        assert!((800..=1200).contains(&lost), "{lost} of 20000");
        assert!(
            run(&spec("loss=100"), 7, 100)
                .iter()
                .all(|v| *v == Verdict::Lost)
        );
    }

    #[test]
    fn jitter_spreads_each_delay_around_half_the_rtt() {
        let delays: Vec<Duration> = run(&spec("rtt=200ms,jitter=50ms"), 3, 2000)
            .into_iter()
            .map(|v| match v {
                Verdict::Deliver(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        let (lo, hi) = (Duration::from_millis(75), Duration::from_millis(125));
        assert!(delays.iter().all(|d| (lo..=hi).contains(d)));
        assert!(delays.iter().any(|d| *d < Duration::from_millis(80)));
        assert!(delays.iter().any(|d| *d > Duration::from_millis(120)));
        // More jitter than delay: clamped at zero, never negative.
        let mut s = Shaper::new(5);
        let wild = spec("rtt=10ms,jitter=1s");
        assert!(
            (0..100).any(|_| s.admit(&wild, Duration::ZERO, 1) == Verdict::Deliver(Duration::ZERO))
        );
    }

    #[test]
    fn rate_serializes_datagrams_one_behind_the_other() {
        // 8 kbit/s: 1000 bytes take one second each.
        let s = spec("rate=8kbit,rtt=100ms");
        let mut shaper = Shaper::new(1);
        let at = |ms| Duration::from_millis(ms);
        assert_eq!(shaper.admit(&s, at(0), 1000), Verdict::Deliver(at(1050)));
        assert_eq!(shaper.admit(&s, at(0), 1000), Verdict::Deliver(at(2050)));
        assert_eq!(shaper.admit(&s, at(500), 1000), Verdict::Deliver(at(2550)));
        // After the queue drained, a datagram waits only for itself.
        assert_eq!(
            shaper.admit(&s, at(10_000), 1000),
            Verdict::Deliver(at(1050))
        );
    }

    #[test]
    fn a_full_rate_queue_drops_the_tail() {
        let s = spec("rate=1kbit");
        let mut shaper = Shaper::new(1);
        let verdicts: Vec<Verdict> = (0..100)
            .map(|_| shaper.admit(&s, Duration::ZERO, 1200))
            .collect();
        let full = verdicts
            .iter()
            .filter(|v| **v == Verdict::QueueFull)
            .count();
        // 54 datagrams of 1200 bytes fit in 64 KiB.
        assert_eq!(full, 100 - 54);
        assert!(
            verdicts
                .iter()
                .take(54)
                .all(|v| matches!(v, Verdict::Deliver(_)))
        );
    }

    #[test]
    fn a_blackout_drops_in_its_down_phase_without_drawing() {
        let s = LinkSpec {
            blackout: Some(Blackout {
                down: Duration::from_secs(1),
                period: Duration::from_secs(3),
            }),
            loss: 50.0,
            ..LinkSpec::default()
        };
        let mut a = Shaper::new(9);
        let mut b = Shaper::new(9);
        assert_eq!(
            a.admit(&s, Duration::from_millis(2500), 10),
            Verdict::BlackedOut
        );
        let up = Duration::from_millis(3100);
        for _ in 0..50 {
            assert_eq!(a.admit(&s, up, 10), b.admit(&s, up, 10));
        }
    }

    #[test]
    fn absurd_specs_built_in_code_do_not_panic() {
        let s = LinkSpec {
            rtt: Duration::MAX,
            jitter: Duration::MAX,
            rate: Some(1),
            blackout: Some(Blackout {
                down: Duration::from_secs(5),
                period: Duration::ZERO,
            }),
            ..LinkSpec::default()
        };
        let mut shaper = Shaper::new(1);
        assert_eq!(shaper.admit(&s, Duration::MAX, 1), Verdict::BlackedOut);
        let s = LinkSpec {
            blackout: None,
            ..s
        };
        for now in [Duration::ZERO, Duration::MAX] {
            assert_eq!(shaper.admit(&s, now, usize::MAX), Verdict::QueueFull);
            assert!(matches!(shaper.admit(&s, now, 1), Verdict::Deliver(_)));
        }
    }

    #[test]
    fn the_directions_get_distinct_streams() {
        let (a, b) = direction_seeds(1);
        assert_ne!(a, b);
        assert_eq!(direction_seeds(1), (a, b));
    }
}
