//! How many Jobs to create: KEDA's ScaledJob metric math and the five scaling strategies.

use serde::{Deserialize, Serialize};

/// ScaledJob scaling strategy (`scalingStrategy.strategy`).
#[derive(Clone, Debug, PartialEq)]
pub enum ScalingStrategyKind {
    /// `basic` / `default`: desired - running.
    Basic,
    /// `pendingAware` (DSJ default): re-create pending Jobs elsewhere within capacity.
    PendingAware,
    /// `custom`: desired - deduction - running * percentage, capped at max.
    Custom {
        /// `customScalingQueueLengthDeduction`.
        deduction: i64,
        /// `customScalingRunningJobPercentage`.
        running_percentage: f64,
    },
    /// `accurate`: subtract pending unless over max.
    Accurate,
    /// `eager`: fill capacity up to desired.
    Eager,
}

/// `scalingStrategy.multipleScalersCalculation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultipleScalers {
    /// Largest trigger (default).
    Max,
    /// Smallest trigger.
    Min,
    /// Mean over active triggers.
    Avg,
    /// Sum over active triggers.
    Sum,
}

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

/// The triggers combined as KEDA combines a ScaledJob's scalers
/// (`pkg/scaling/scaledjob/metrics.go`, `IsScaledJobActive`): each trigger gives its queue
/// length `q` (the value) and `maxValue = min(q / target, maxReplicaCount)`, unrounded; `max`
/// and `min` take both from the active trigger with the largest (smallest) `q`, `avg` and
/// `sum` average (add) each over the active triggers. Then `maxValue` is bounded by
/// `maxReplicaCount` once more and both are rounded up, in that order. A trigger is active
/// when its value is above 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Combined {
    /// `ceil(queueLength)`: KEDA's `scaleTo`, a bound on the Jobs one poll creates.
    pub queue: u64,
    /// `ceil(min(maxValue, maxReplicaCount))`: KEDA's `maxScale`, the Jobs the triggers ask for.
    pub max_scale: u64,
    /// Whether any trigger is active.
    pub active: bool,
}

fn ceil_u64(x: f64) -> u64 {
    let c = x.ceil();
    if c.is_nan() || c <= 0.0 {
        0
    } else if c >= u64::MAX as f64 {
        u64::MAX
    } else {
        c as u64
    }
}

/// Combines the triggers' readings with `multipleScalersCalculation` under KEDA's
/// `maxReplicaCount` (`max_jobs`, see [`JobCounts::max`]).
pub fn combine(how: MultipleScalers, metrics: &[TriggerMetric], max_jobs: u32) -> Combined {
    let max = f64::from(max_jobs);
    // NaN or infinite values are never active (a reading is sanitized before, this is
    // defence in depth).
    let active: Vec<(f64, f64)> = metrics
        .iter()
        .filter(|m| m.value.is_finite() && m.value > 0.0)
        .map(|m| {
            let max_value = if m.target.is_finite() && m.target > 0.0 {
                (m.value / m.target).min(max)
            } else {
                0.0
            };
            (m.value, max_value)
        })
        .collect();
    let (queue, max_value) = match how {
        MultipleScalers::Max => active
            .iter()
            .copied()
            .fold((0.0, 0.0), |best, m| if m.0 > best.0 { m } else { best }),
        MultipleScalers::Min => active.iter().copied().fold((0.0, 0.0), |best, m| {
            // KEDA's `queueLength == 0 || q < queueLength`.
            if best.0 == 0.0 || m.0 < best.0 {
                m
            } else {
                best
            }
        }),
        MultipleScalers::Sum | MultipleScalers::Avg => {
            let (q, v) = active
                .iter()
                .fold((0.0, 0.0), |(q, v), m| (q + m.0, v + m.1));
            if how == MultipleScalers::Avg && !active.is_empty() {
                #[allow(clippy::cast_precision_loss)]
                let n = active.len() as f64;
                (q / n, v / n)
            } else {
                (q, v)
            }
        }
    };
    Combined {
        queue: ceil_u64(queue),
        max_scale: ceil_u64(max_value.min(max)),
        active: !active.is_empty(),
    }
}

/// KEDA's `MaxReplicaCount()` of a ScaledJob (`apis/keda/v1alpha1/scaledjob_types.go`):
/// `maxReplicaCount − minReplicaCount` when the spec sets `maxReplicaCount`, the default
/// 100 when it does not, and `maxReplicaCount` itself when min exceeds it.
pub fn keda_max(spec_max: Option<u32>, spec_min: u32) -> u32 {
    match spec_max {
        Some(max) if spec_min > max => max,
        Some(max) => max - spec_min,
        None => crate::crd::keda::DEFAULT_MAX_REPLICA_COUNT.unsigned_abs(),
    }
}

/// Inputs of a scaling strategy, fleet-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobCounts {
    /// The triggers, combined ([`combine`]).
    pub metric: Combined,
    /// Non-terminal Jobs (includes pending).
    pub running: u32,
    /// Jobs not yet running.
    pub pending: u32,
    /// Pending Jobs stuck beyond the grace period and not yet replaced; what `pendingAware`
    /// re-creates elsewhere.
    pub stuck: u32,
    /// KEDA's `MinReplicaCount()`: Jobs kept running whatever the triggers say.
    pub min: u32,
    /// KEDA's `MaxReplicaCount()` ([`keda_max`]).
    pub max: u32,
}

impl JobCounts {
    /// The Jobs wanted in all: `minReplicaCount` and, on top of it, what the triggers ask
    /// for (KEDA counts the running Jobs beyond the minimum against the triggers).
    pub fn desired(&self) -> u64 {
        u64::from(self.min).saturating_add(self.metric.max_scale)
    }
}

/// Jobs to create this poll under `strategy` (never negative): KEDA's executor
/// (`pkg/scaling/executor/scale_jobs.go`) to the integer. Fewer running Jobs than
/// `minReplicaCount` create the difference whatever the triggers say; otherwise the strategy
/// runs on the running Jobs beyond the minimum (`running − min`) and its effective maximum
/// bounds `ceil(queueLength)` (eager: `maxReplicaCount`). Nothing is created while no
/// trigger is active and the minimum is 0. `pendingAware` (the reference's, not KEDA's) is
/// `min(max(0, maxScale − running + stuck), max(0, maxReplicaCount − running))`.
pub fn jobs_to_create(strategy: &ScalingStrategyKind, c: JobCounts) -> u32 {
    let (running, pending, stuck, min, max) = (
        i64::from(c.running),
        i64::from(c.pending),
        i64::from(c.stuck),
        i64::from(c.min),
        i64::from(c.max),
    );
    let to_i64 = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    let (max_scale, queue) = (to_i64(c.metric.max_scale), to_i64(c.metric.queue));
    if running < min {
        return u32::try_from(min - running).unwrap_or(u32::MAX);
    }
    if !c.metric.active && min == 0 {
        return 0;
    }
    let beyond = running - min;
    let (effective, scale_to) = match strategy {
        ScalingStrategyKind::Basic => (max_scale - beyond, queue),
        ScalingStrategyKind::PendingAware => {
            let needed = (max_scale - beyond + stuck).max(0);
            let capacity = (max - beyond).max(0);
            (needed.min(capacity), queue)
        }
        ScalingStrategyKind::Custom {
            deduction,
            running_percentage,
        } => {
            // KEDA: `int64(float64(runningJobCount) * percentage)` truncates on its own,
            // before the subtraction.
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let share = (beyond as f64 * running_percentage).trunc() as i64;
            (
                max_scale
                    .saturating_sub(*deduction)
                    .saturating_sub(share)
                    .min(max),
                queue,
            )
        }
        ScalingStrategyKind::Accurate => {
            if max_scale + beyond - pending > max {
                (max - beyond, queue)
            } else {
                (max_scale - pending, queue)
            }
        }
        ScalingStrategyKind::Eager => ((max - beyond - pending).min(max_scale), max),
    };
    let n = scale_to.min(effective.max(0));
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(value: f64, target: f64) -> TriggerMetric {
        TriggerMetric { value, target }
    }

    /// A strategy's input as KEDA's tests give it to `GetEffectiveMaxScale` (maxScale,
    /// running, pending, maxReplicaCount, scaleTo), with no minimum.
    fn keda(max_scale: u64, running: u32, pending: u32, max: u32, scale_to: u64) -> JobCounts {
        JobCounts {
            metric: Combined {
                queue: scale_to,
                max_scale,
                active: true,
            },
            running,
            pending,
            stuck: 0,
            min: 0,
            max,
        }
    }

    /// KEDA's `TestDefaultScalingStrategy`, `TestCustomScalingStrategy`,
    /// `TestCustomScalingStrategyNilQueueLengthDeduction`, `TestAccurateScalingStrategy` and
    /// `TestEagerScalingStrategy` (`pkg/scaling/executor/scale_jobs_test.go`): their effective
    /// maximum, bounded by `scaleTo` (eager: by maxReplicaCount) as `createJobs` bounds it.
    /// The tests pass scaleTo 1; the tables here use a large scaleTo so that the effective
    /// maximum shows, and a second column with KEDA's scaleTo 1.
    #[test]
    fn keda_strategy_tables() {
        let custom = |deduction, running_percentage| ScalingStrategyKind::Custom {
            deduction,
            running_percentage,
        };
        // strategy, (maxScale, running, pending, maxReplicaCount), KEDA's effective max.
        type Row = (ScalingStrategyKind, (u64, u32, u32, u32), i64);
        let table: &[Row] = &[
            (ScalingStrategyKind::Basic, (3, 2, 0, 5), 1),
            (ScalingStrategyKind::Basic, (2, 0, 0, 5), 2),
            (custom(1, 0.5), (3, 2, 0, 5), 1),
            (custom(1, 0.5), (10, 0, 0, 10), 9),
            (custom(2, 0.0), (3, 2, 0, 5), 1),
            (custom(-2, 0.0), (3, 2, 0, 4), 4),
            (custom(0, 0.5), (10, 2, 0, 100), 9),
            (custom(0, 0.5), (10, 0, 0, 100), 10),
            (ScalingStrategyKind::Accurate, (3, 2, 0, 5), 3),
            (ScalingStrategyKind::Accurate, (5, 2, 0, 5), 3),
            (ScalingStrategyKind::Accurate, (3, 4, 2, 10), 1),
            (ScalingStrategyKind::Accurate, (5, 4, 2, 5), 1),
            (ScalingStrategyKind::Accurate, (3, 3, 3, 5), 0),
            (ScalingStrategyKind::Accurate, (15, 15, 15, 20), 0),
            (ScalingStrategyKind::Accurate, (10, 10, 10, 15), 0),
            (ScalingStrategyKind::Accurate, (20, 15, 10, 20), 5),
            (ScalingStrategyKind::Eager, (4, 3, 0, 10), 4),
            (ScalingStrategyKind::Eager, (4, 0, 3, 10), 4),
            (ScalingStrategyKind::Eager, (4, 7, 0, 10), 3),
            (ScalingStrategyKind::Eager, (4, 1, 6, 10), 3),
            (ScalingStrategyKind::Eager, (15, 0, 0, 10), 10),
        ];
        for (strategy, (max_scale, running, pending, max), effective) in table {
            let want = u32::try_from((*effective).max(0)).unwrap();
            let c = keda(*max_scale, *running, *pending, *max, u64::MAX);
            assert_eq!(jobs_to_create(strategy, c), want, "{strategy:?} {c:?}");
            // KEDA's own scaleTo of 1 bounds every strategy but eager.
            let c = keda(*max_scale, *running, *pending, *max, 1);
            let bounded = if *strategy == ScalingStrategyKind::Eager {
                want
            } else {
                want.min(1)
            };
            assert_eq!(jobs_to_create(strategy, c), bounded, "{strategy:?} {c:?}");
        }
    }

    /// Where truncating `running × percentage` on its own differs from truncating the whole
    /// expression (issue: queue 10, running 3, deduction 1, "0.5": KEDA creates 8).
    #[test]
    fn custom_truncates_the_running_share_on_its_own() {
        let custom = ScalingStrategyKind::Custom {
            deduction: 1,
            running_percentage: 0.5,
        };
        // 10 - 1 - trunc(1.5) = 8; truncating 10 - 1 - 1.5 = 7.5 would give 7.
        assert_eq!(jobs_to_create(&custom, keda(10, 3, 0, 20, 10)), 8);
        // 10 - 1 - trunc(0.5) = 9, not 8.
        assert_eq!(jobs_to_create(&custom, keda(10, 1, 0, 20, 10)), 9);
        let third = ScalingStrategyKind::Custom {
            deduction: 0,
            running_percentage: 0.333,
        };
        // 5 - trunc(2.997) = 3.
        assert_eq!(jobs_to_create(&third, keda(5, 9, 0, 20, 5)), 3);
    }

    /// KEDA's `getScalingDecision` tests: fewer running Jobs than the minimum create the
    /// difference; at or above it the strategy runs on the Jobs beyond the minimum.
    #[test]
    fn keda_minimum_replica_count() {
        let with_min = |min, running, max_scale, queue| JobCounts {
            metric: Combined {
                queue,
                max_scale,
                active: true,
            },
            running,
            pending: 0,
            stuck: 0,
            min,
            max: keda_max(Some(100), min),
        };
        let basic = ScalingStrategyKind::Basic;
        assert_eq!(jobs_to_create(&basic, with_min(2, 0, 0, 0)), 2);
        assert_eq!(jobs_to_create(&basic, with_min(2, 1, 0, 0)), 1);
        assert_eq!(jobs_to_create(&basic, with_min(1, 1, 2, 2)), 2);
        // The reference's example: min 2 running, 3 messages at target 1: 3 more Jobs.
        assert_eq!(jobs_to_create(&basic, with_min(2, 2, 3, 3)), 3);
        // An inactive trigger creates nothing without a minimum.
        let idle = JobCounts {
            metric: Combined {
                queue: 0,
                max_scale: 0,
                active: false,
            },
            ..with_min(0, 0, 0, 0)
        };
        assert_eq!(jobs_to_create(&ScalingStrategyKind::Eager, idle), 0);
    }

    #[test]
    fn keda_max_replica_count() {
        assert_eq!(keda_max(Some(10), 2), 8);
        assert_eq!(keda_max(Some(10), 0), 10);
        assert_eq!(keda_max(Some(3), 5), 3, "min above max: max");
        assert_eq!(keda_max(None, 5), 100, "default, min not subtracted");
    }

    /// KEDA's `TestGetScaledJobState` (`pkg/scaling/scale_handler_test.go`): four scalers
    /// (q 20 / target 1, q 10 / target 2, q 5 / target 3 active; q 7 / target 4 inactive).
    #[test]
    fn keda_multiple_scalers_table() {
        // KEDA marks the fourth inactive; here a trigger is active when its value is > 0.
        let metrics = [m(20.0, 1.0), m(10.0, 2.0), m(5.0, 3.0), m(0.0, 4.0)];
        let table = [
            (MultipleScalers::Max, 100, 20, 20),
            (MultipleScalers::Min, 100, 5, 2),
            (MultipleScalers::Avg, 100, 12, 9),
            (MultipleScalers::Sum, 100, 35, 27),
            (MultipleScalers::Sum, 25, 35, 25),
        ];
        for (how, max, queue, max_scale) in table {
            let c = combine(how, &metrics, max);
            assert_eq!(
                (c.queue, c.max_scale, c.active),
                (queue, max_scale, true),
                "{how:?} max {max}"
            );
        }
        // Single trigger: q 20, target 2, KEDA's MaxReplicaCount 99 (max 100, min 1).
        let c = combine(
            MultipleScalers::Max,
            &[m(20.0, 2.0)],
            keda_max(Some(100), 1),
        );
        assert_eq!((c.queue, c.max_scale), (20, 10));
        // Queue empty: inactive, nothing asked.
        let c = combine(MultipleScalers::Max, &[m(0.0, 1.0)], 100);
        assert_eq!((c.queue, c.max_scale, c.active), (0, 0, false));
    }

    /// Where rounding each trigger first would differ from KEDA, which rounds once at the
    /// end: two triggers at 1.5 Jobs each sum to 3, not 4; avg of 1.2 and 1.2 is 2, not 2.
    #[test]
    fn triggers_round_once_after_combining() {
        let halves = [m(3.0, 2.0), m(3.0, 2.0)];
        assert_eq!(combine(MultipleScalers::Sum, &halves, 100).max_scale, 3);
        assert_eq!(combine(MultipleScalers::Avg, &halves, 100).max_scale, 2);
        let small = [m(1.0, 4.0), m(1.0, 4.0), m(1.0, 4.0)];
        // 3 × 0.25 = 0.75 → 1 Job; rounding each first would give 3.
        assert_eq!(combine(MultipleScalers::Sum, &small, 100).max_scale, 1);
        // NaN and infinite values are inactive.
        let bad = [m(f64::NAN, 1.0), m(f64::INFINITY, 1.0)];
        assert!(!combine(MultipleScalers::Max, &bad, 100).active);
    }
}
