//! How many Jobs to create: KEDA's ScaledJob metric math and the five scaling strategies.

use serde::{Deserialize, Serialize};

use crate::validate::{MultipleScalers, ScalingStrategyKind};

/// One trigger's reading as KEDA reports it: the current value (e.g. queue length) and the
/// target average value per Job.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerMetric {
    /// Current metric value.
    pub value: f64,
    /// Target average value per Job.
    pub target: f64,
}

impl TriggerMetric {
    /// Jobs this trigger asks for: `ceil(value / target)`, 0 for non-positive values or a
    /// non-positive target (KEDA treats such a scaler as inactive).
    pub fn jobs(self) -> u64 {
        // NaN compares false either way, so it counts as inactive too.
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.value) || !positive(self.target) {
            return 0;
        }
        let jobs = (self.value / self.target).ceil();
        if jobs >= u64::MAX as f64 {
            u64::MAX
        } else {
            jobs as u64
        }
    }
}

/// Combines the triggers' job counts with `multipleScalersCalculation`. `avg` and `sum` run
/// over active triggers (value > 0), `avg` rounding up; `max`/`min` over all triggers.
pub fn combine(how: MultipleScalers, metrics: &[TriggerMetric]) -> u64 {
    let jobs: Vec<u64> = metrics.iter().map(|m| m.jobs()).collect();
    let active: Vec<u64> = metrics
        .iter()
        .filter(|m| m.value > 0.0)
        .map(|m| m.jobs())
        .collect();
    match how {
        MultipleScalers::Max => jobs.iter().copied().max().unwrap_or(0),
        MultipleScalers::Min => jobs.iter().copied().min().unwrap_or(0),
        MultipleScalers::Sum => active.iter().fold(0u64, |a, &b| a.saturating_add(b)),
        MultipleScalers::Avg => {
            let n = active.len() as u64;
            if n == 0 {
                0
            } else {
                active
                    .iter()
                    .fold(0u64, |a, &b| a.saturating_add(b))
                    .div_ceil(n)
            }
        }
    }
}

/// The desired Job count: the combined metric bounded by `minReplicaCount` and
/// `maxReplicaCount` (KEDA's `targetMetric`).
pub fn desired_jobs(how: MultipleScalers, metrics: &[TriggerMetric], min: u32, max: u32) -> u32 {
    let combined = u32::try_from(combine(how, metrics)).unwrap_or(u32::MAX);
    combined.clamp(min.min(max), max)
}

/// Inputs of a scaling strategy, fleet-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobCounts {
    /// Desired Jobs ([`desired_jobs`]).
    pub desired: u32,
    /// Non-terminal Jobs (includes pending).
    pub running: u32,
    /// Jobs not yet running.
    pub pending: u32,
    /// Pending Jobs stuck beyond the grace period and not yet replaced; what `pendingAware`
    /// re-creates elsewhere.
    pub stuck: u32,
    /// `maxReplicaCount`.
    pub max: u32,
}

/// Jobs to create this poll under `strategy` (never negative), with the formulas of the
/// reference.
pub fn jobs_to_create(strategy: &ScalingStrategyKind, c: JobCounts) -> u32 {
    let (desired, running, pending, stuck, max) = (
        i64::from(c.desired),
        i64::from(c.running),
        i64::from(c.pending),
        i64::from(c.stuck),
        i64::from(c.max),
    );
    let n = match strategy {
        ScalingStrategyKind::Basic => desired - running,
        ScalingStrategyKind::PendingAware => {
            let needed = (desired - running + stuck).max(0);
            let capacity = (max - running).max(0);
            needed.min(capacity)
        }
        ScalingStrategyKind::Custom {
            deduction,
            running_percentage,
        } => {
            let raw = desired as f64 - *deduction as f64 - running as f64 * running_percentage;
            // KEDA truncates the float towards zero.
            (raw.trunc() as i64).min(max)
        }
        ScalingStrategyKind::Accurate => {
            if desired + running > max {
                max - running
            } else {
                desired - pending
            }
        }
        ScalingStrategyKind::Eager => (max - running - pending).min(desired),
    };
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(value: f64, target: f64) -> TriggerMetric {
        TriggerMetric { value, target }
    }

    #[test]
    fn keda_max_replica_count_table() {
        // keda-scaledjob-spec.md: queue length, max replica count, target average value,
        // running job count -> number of the scale (default strategy).
        let table = [
            (10.0, 3, 1.0, 0, 3),
            (10.0, 3, 2.0, 0, 3),
            (10.0, 3, 1.0, 1, 2),
            (10.0, 100, 1.0, 0, 10),
            (4.0, 3, 5.0, 0, 1),
        ];
        for (queue, max, target, running, expected) in table {
            let desired = desired_jobs(MultipleScalers::Max, &[m(queue, target)], 0, max);
            let counts = JobCounts {
                desired,
                running,
                pending: 0,
                stuck: 0,
                max,
            };
            assert_eq!(
                jobs_to_create(&ScalingStrategyKind::Basic, counts),
                expected,
                "{queue} {max} {target} {running}"
            );
            assert_eq!(
                jobs_to_create(&ScalingStrategyKind::PendingAware, counts),
                expected
            );
        }
    }

    #[test]
    fn strategy_formulas() {
        let c = |desired, running, pending, stuck, max| JobCounts {
            desired,
            running,
            pending,
            stuck,
            max,
        };
        // basic: desired - running, never negative.
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Basic, c(6, 3, 0, 0, 10)),
            3
        );
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Basic, c(2, 3, 0, 0, 10)),
            0
        );
        // pendingAware: min(desired - running + stuck, max - running).
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::PendingAware, c(5, 5, 2, 2, 10)),
            2
        );
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::PendingAware, c(10, 8, 2, 2, 10)),
            2
        );
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::PendingAware, c(10, 9, 2, 2, 10)),
            1
        );
        // custom: min(desired - deduction - running * pct, max).
        let custom = ScalingStrategyKind::Custom {
            deduction: 1,
            running_percentage: 0.5,
        };
        assert_eq!(jobs_to_create(&custom, c(10, 4, 0, 0, 20)), 7);
        assert_eq!(
            jobs_to_create(&custom, c(10, 3, 0, 0, 20)),
            7,
            "7.5 truncates"
        );
        assert_eq!(jobs_to_create(&custom, c(30, 0, 0, 0, 20)), 20);
        // accurate: over max -> max - running, else desired - pending.
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Accurate, c(8, 4, 1, 0, 10)),
            6
        );
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Accurate, c(5, 4, 1, 0, 10)),
            4
        );
        // eager: min(max - running - pending, desired).
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Eager, c(3, 2, 1, 0, 10)),
            3
        );
        assert_eq!(
            jobs_to_create(&ScalingStrategyKind::Eager, c(9, 2, 1, 0, 10)),
            7
        );
    }

    #[test]
    fn multiple_scalers() {
        let metrics = [m(10.0, 2.0), m(3.0, 1.0), m(0.0, 1.0)];
        assert_eq!(combine(MultipleScalers::Max, &metrics), 5);
        assert_eq!(combine(MultipleScalers::Min, &metrics), 0);
        assert_eq!(combine(MultipleScalers::Sum, &metrics), 8);
        assert_eq!(
            combine(MultipleScalers::Avg, &metrics),
            4,
            "(5+3)/2 over active triggers"
        );
        assert_eq!(
            combine(MultipleScalers::Avg, &[m(5.0, 1.0), m(2.0, 1.0)]),
            4,
            "3.5 rounds up"
        );
        assert_eq!(combine(MultipleScalers::Max, &[]), 0);
    }

    #[test]
    fn min_and_max_bound_the_desired_count() {
        assert_eq!(desired_jobs(MultipleScalers::Max, &[m(0.0, 1.0)], 2, 10), 2);
        assert_eq!(
            desired_jobs(MultipleScalers::Max, &[m(50.0, 1.0)], 2, 10),
            10
        );
        assert_eq!(
            desired_jobs(MultipleScalers::Max, &[m(1.0, 0.0)], 0, 10),
            0,
            "target 0 is inactive"
        );
        assert_eq!(
            desired_jobs(MultipleScalers::Max, &[m(0.0, 1.0)], 20, 10),
            10,
            "min lowered to max"
        );
    }
}
