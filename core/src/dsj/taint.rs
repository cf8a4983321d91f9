//! The soft/hard taint state machine of DSJ failover, and the book of taints per member and
//! workload affinity.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::validate::{ClusterStrategy, FailoverTiming};

/// Taint level of a member at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TaintLevel {
    /// Not tainted.
    None,
    /// Soft: still eligible; another failure within `softTaintDuration` makes it hard.
    Soft,
    /// Hard: excluded until `hardTaintDuration` has passed.
    Hard,
}

/// Something that went wrong placing Jobs in a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEvent {
    /// A Job stayed pending longer than `failoverPolicy.gracePeriod`.
    JobStuck,
    /// The member refused or failed a Job create call. Transient under
    /// `priorityFailover`: it does not taint there.
    CreateFailed,
}

/// One taint's state: a value, advanced by [`Taint::observe`] with the time passed in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// End of the soft-taint window, if one is open.
    pub soft_until: Option<SystemTime>,
    /// End of the hard taint, if any.
    pub hard_until: Option<SystemTime>,
}

fn after(now: SystemTime, d: Duration) -> SystemTime {
    now.checked_add(d).unwrap_or(now)
}

impl Taint {
    /// The level at `now`; taints expire by themselves.
    pub fn level(&self, now: SystemTime) -> TaintLevel {
        if self.hard_until.is_some_and(|t| now < t) {
            TaintLevel::Hard
        } else if self.soft_until.is_some_and(|t| now < t) {
            TaintLevel::Soft
        } else {
            TaintLevel::None
        }
    }

    /// Records a failure at `now`: a first failure soft-taints (or hard-taints at once when
    /// `softTaintDuration` is 0s), a failure within the soft window hard-taints for
    /// `hardTaintDuration`, and a failure while hard-tainted extends the hard taint.
    pub fn observe(&mut self, now: SystemTime, timing: &FailoverTiming) -> TaintLevel {
        match self.level(now) {
            TaintLevel::Hard | TaintLevel::Soft => self.harden(now, timing),
            TaintLevel::None if timing.soft_taint_duration.is_zero() => self.harden(now, timing),
            TaintLevel::None => {
                self.soft_until = Some(after(now, timing.soft_taint_duration));
                TaintLevel::Soft
            }
        }
    }

    fn harden(&mut self, now: SystemTime, timing: &FailoverTiming) -> TaintLevel {
        self.soft_until = None;
        self.hard_until = Some(after(now, timing.hard_taint_duration));
        if timing.hard_taint_duration.is_zero() {
            TaintLevel::None
        } else {
            TaintLevel::Hard
        }
    }
}

/// What a taint applies to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TaintScope {
    /// Every workload (weightedRoundRobin).
    Cluster,
    /// Workloads of `class` with size >= `size` on a member of `priority`
    /// (priorityFailover).
    Workload {
        /// Workload class.
        class: String,
        /// Size the failure happened at.
        size: u32,
        /// Priority of the member at the time.
        priority: i32,
    },
}

/// All taints of one DSJ, keyed by member and scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaintBook {
    /// Taints by (member, scope).
    pub taints: BTreeMap<(String, TaintScope), Taint>,
}

impl TaintBook {
    /// Records `event` for `member` at `now`. Under priorityFailover the taint is scoped to
    /// the workload affinity and the member's priority, and create failures are transient
    /// and ignored. Returns the resulting level (`None` when ignored).
    pub fn observe(
        &mut self,
        member: &str,
        member_priority: Option<i32>,
        event: TaintEvent,
        strategy: &ClusterStrategy,
        timing: &FailoverTiming,
        now: SystemTime,
    ) -> TaintLevel {
        let scope = match strategy {
            ClusterStrategy::WeightedRoundRobin => TaintScope::Cluster,
            ClusterStrategy::PriorityFailover { class, size } => {
                if event == TaintEvent::CreateFailed {
                    return TaintLevel::None;
                }
                TaintScope::Workload {
                    class: class.clone(),
                    size: *size,
                    priority: member_priority.unwrap_or(0),
                }
            }
        };
        self.taints
            .entry((member.to_owned(), scope))
            .or_default()
            .observe(now, timing)
    }

    /// The strongest taint on `member` that applies to a workload of this strategy: a
    /// cluster-wide taint always, a workload taint when class and priority match and the
    /// taint's size is <= the workload's size.
    pub fn level(
        &self,
        member: &str,
        member_priority: Option<i32>,
        strategy: &ClusterStrategy,
        now: SystemTime,
    ) -> TaintLevel {
        self.taints
            .iter()
            .filter(|((m, scope), _)| {
                m == member
                    && match (scope, strategy) {
                        (TaintScope::Cluster, _) => true,
                        (
                            TaintScope::Workload {
                                class,
                                size,
                                priority,
                            },
                            ClusterStrategy::PriorityFailover {
                                class: wanted,
                                size: wanted_size,
                            },
                        ) => {
                            class == wanted
                                && size <= wanted_size
                                && Some(*priority) == member_priority
                        }
                        (TaintScope::Workload { .. }, ClusterStrategy::WeightedRoundRobin) => false,
                    }
            })
            .map(|(_, t)| t.level(now))
            .max()
            .unwrap_or(TaintLevel::None)
    }

    /// Forgets taints that have fully expired, so the book does not grow forever.
    pub fn expire(&mut self, now: SystemTime) {
        self.taints.retain(|_, t| t.level(now) != TaintLevel::None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn timing(soft: u64, hard: u64) -> FailoverTiming {
        FailoverTiming {
            grace_period: Duration::from_secs(60),
            soft_taint_duration: Duration::from_secs(soft),
            hard_taint_duration: Duration::from_secs(hard),
        }
    }

    #[test]
    fn soft_then_hard_then_expiry() {
        let t = timing(180, 300);
        let mut taint = Taint::default();
        assert_eq!(taint.level(at(0)), TaintLevel::None);
        assert_eq!(taint.observe(at(0), &t), TaintLevel::Soft);
        assert_eq!(taint.level(at(179)), TaintLevel::Soft);
        // Second failure inside the soft window escalates.
        assert_eq!(taint.observe(at(100), &t), TaintLevel::Hard);
        assert_eq!(taint.level(at(399)), TaintLevel::Hard);
        assert_eq!(taint.level(at(400)), TaintLevel::None);
    }

    #[test]
    fn failure_after_soft_window_is_soft_again() {
        let t = timing(180, 300);
        let mut taint = Taint::default();
        taint.observe(at(0), &t);
        assert_eq!(taint.level(at(180)), TaintLevel::None);
        assert_eq!(taint.observe(at(200), &t), TaintLevel::Soft);
    }

    #[test]
    fn zero_soft_duration_is_immediately_hard() {
        let mut taint = Taint::default();
        assert_eq!(taint.observe(at(0), &timing(0, 300)), TaintLevel::Hard);
    }

    #[test]
    fn priority_failover_scopes_by_size_and_ignores_create_failures() {
        let strategy = |size| ClusterStrategy::PriorityFailover {
            class: "team-a".into(),
            size,
        };
        let t = timing(0, 300);
        let mut book = TaintBook::default();
        let level = book.observe(
            "primary",
            Some(100),
            TaintEvent::CreateFailed,
            &strategy(4),
            &t,
            at(0),
        );
        assert_eq!(level, TaintLevel::None, "create failures are transient");
        book.observe(
            "primary",
            Some(100),
            TaintEvent::JobStuck,
            &strategy(4),
            &t,
            at(0),
        );
        assert_eq!(
            book.level("primary", Some(100), &strategy(4), at(1)),
            TaintLevel::Hard
        );
        assert_eq!(
            book.level("primary", Some(100), &strategy(8), at(1)),
            TaintLevel::Hard,
            "bigger sizes too"
        );
        assert_eq!(
            book.level("primary", Some(100), &strategy(3), at(1)),
            TaintLevel::None,
            "smaller sizes still fit"
        );
        assert_eq!(
            book.level("primary", Some(50), &strategy(4), at(1)),
            TaintLevel::None,
            "other priority"
        );
        let other_class = ClusterStrategy::PriorityFailover {
            class: "team-b".into(),
            size: 4,
        };
        assert_eq!(
            book.level("primary", Some(100), &other_class, at(1)),
            TaintLevel::None
        );
        // Under weightedRoundRobin a create failure taints the whole cluster.
        let wrr = ClusterStrategy::WeightedRoundRobin;
        book.observe("b", None, TaintEvent::CreateFailed, &wrr, &t, at(0));
        assert_eq!(book.level("b", None, &wrr, at(1)), TaintLevel::Hard);
        book.expire(at(301));
        assert!(book.taints.is_empty());
    }
}
