//! The soft/hard taint state machine of DSJ failover, and the book of taints per member and
//! workload affinity.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::time::saturating_add;
use crate::validate::{ClusterStrategy, DsjSettings, FailoverTiming};

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

/// The timing and rules a taint follows, from a DSJ's `failoverPolicy` and strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaintPolicy {
    /// Escalation window (`softTaintDuration`); zero makes the first failure hard.
    pub soft_taint_duration: Duration,
    /// Hard taint length (`hardTaintDuration`).
    pub hard_taint_duration: Duration,
    /// Whether a failed Job create is a failure: yes under weightedRoundRobin, no (transient)
    /// under priorityFailover.
    pub create_failures_taint: bool,
}

impl TaintPolicy {
    /// The policy of a validated DSJ.
    pub fn new(settings: &DsjSettings) -> Self {
        Self::from_parts(&settings.timing, &settings.cluster_strategy)
    }

    fn from_parts(timing: &FailoverTiming, strategy: &ClusterStrategy) -> Self {
        Self {
            soft_taint_duration: timing.soft_taint_duration,
            hard_taint_duration: timing.hard_taint_duration,
            create_failures_taint: *strategy == ClusterStrategy::WeightedRoundRobin,
        }
    }
}

impl Default for TaintPolicy {
    fn default() -> Self {
        Self::from_parts(
            &FailoverTiming::default(),
            &ClusterStrategy::WeightedRoundRobin,
        )
    }
}

/// One taint: a value type advanced by [`Taint::observe`] with the time passed in.
///
/// States: clean → (failure) → soft for `softTaintDuration` → (failure inside the window)
/// → hard for `hardTaintDuration` → clean. With `softTaintDuration: 0s` the first failure
/// is hard. A failure while hard extends the hard taint. Taints expire by themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// The rules.
    pub policy: TaintPolicy,
    /// End of the soft-taint window, if one is open.
    pub soft_until: Option<SystemTime>,
    /// End of the hard taint, if any.
    pub hard_until: Option<SystemTime>,
}

impl Taint {
    /// A clean taint following `policy`.
    pub fn new(policy: TaintPolicy) -> Self {
        Self {
            policy,
            soft_until: None,
            hard_until: None,
        }
    }

    /// The level at `now`.
    pub fn level(&self, now: SystemTime) -> TaintLevel {
        if self.hard_until.is_some_and(|t| now < t) {
            TaintLevel::Hard
        } else if self.soft_until.is_some_and(|t| now < t) {
            TaintLevel::Soft
        } else {
            TaintLevel::None
        }
    }

    /// Records `event` at `now` and returns the new level. A create failure is ignored
    /// when the policy treats it as transient.
    pub fn observe(&mut self, event: TaintEvent, now: SystemTime) -> TaintLevel {
        if event == TaintEvent::CreateFailed && !self.policy.create_failures_taint {
            return self.level(now);
        }
        match self.level(now) {
            TaintLevel::Hard | TaintLevel::Soft => self.harden(now),
            TaintLevel::None if self.policy.soft_taint_duration.is_zero() => self.harden(now),
            TaintLevel::None => {
                self.soft_until = Some(saturating_add(now, self.policy.soft_taint_duration));
                TaintLevel::Soft
            }
        }
    }

    fn harden(&mut self, now: SystemTime) -> TaintLevel {
        self.soft_until = None;
        self.hard_until = Some(saturating_add(now, self.policy.hard_taint_duration));
        self.level(now)
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

/// All taints of one DSJ, keyed by member and scope. Create it with [`TaintBook::new`] and
/// call [`TaintBook::reconfigure`] when the spec changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaintBook {
    strategy: ClusterStrategy,
    policy: TaintPolicy,
    /// Taints by (member, scope).
    pub taints: BTreeMap<(String, TaintScope), Taint>,
    /// Taints other DSJs recorded (set with [`TaintBook::share`]): they exclude members from
    /// this DSJ like its own, by the same scope rules, but this DSJ neither escalates nor
    /// keeps them.
    pub shared: BTreeMap<(String, TaintScope), Taint>,
}

impl TaintBook {
    /// An empty book for a validated DSJ.
    pub fn new(settings: &DsjSettings) -> Self {
        Self {
            strategy: settings.cluster_strategy.clone(),
            policy: TaintPolicy::new(settings),
            taints: BTreeMap::new(),
            shared: BTreeMap::new(),
        }
    }

    /// Replaces the taints shared by other DSJs (of the same namespace, in the hub). Where
    /// several record the same (member, scope), the one ending last counts.
    pub fn share(&mut self, others: impl IntoIterator<Item = ((String, TaintScope), Taint)>) {
        self.shared.clear();
        for (key, taint) in others {
            let end = |t: &Taint| (t.hard_until, t.soft_until);
            match self.shared.get(&key) {
                Some(had) if end(had) >= end(&taint) => {}
                _ => {
                    self.shared.insert(key, taint);
                }
            }
        }
    }

    /// Applies a changed spec: future failures follow the new rules and scopes; existing
    /// taints keep their deadlines.
    pub fn reconfigure(&mut self, settings: &DsjSettings) {
        self.strategy = settings.cluster_strategy.clone();
        self.policy = TaintPolicy::new(settings);
        for taint in self.taints.values_mut() {
            taint.policy = self.policy;
        }
    }

    /// Records `event` for `member` (with its `scheduling.priority`) at `now`. Under
    /// priorityFailover the taint is scoped to the workload affinity and the member's
    /// priority. Returns the resulting level.
    pub fn observe(
        &mut self,
        member: &str,
        member_priority: Option<i32>,
        event: TaintEvent,
        now: SystemTime,
    ) -> TaintLevel {
        let scope = match &self.strategy {
            ClusterStrategy::WeightedRoundRobin => TaintScope::Cluster,
            ClusterStrategy::PriorityFailover { class, size } => TaintScope::Workload {
                class: class.clone(),
                size: *size,
                priority: member_priority.unwrap_or(0),
            },
        };
        let policy = self.policy;
        self.taints
            .entry((member.to_owned(), scope))
            .or_insert_with(|| Taint::new(policy))
            .observe(event, now)
    }

    /// The strongest taint on `member` that applies to this DSJ's workload: a cluster-wide
    /// taint always; a workload taint when class and priority match and the taint's size is
    /// <= the workload's size.
    pub fn level(&self, member: &str, member_priority: Option<i32>, now: SystemTime) -> TaintLevel {
        self.level_under(member, member_priority, &self.strategy, now)
    }

    /// [`TaintBook::level`] for an explicitly given strategy.
    pub fn level_under(
        &self,
        member: &str,
        member_priority: Option<i32>,
        strategy: &ClusterStrategy,
        now: SystemTime,
    ) -> TaintLevel {
        self.applying(member, member_priority, strategy)
            .map(|(_, t)| t.level(now))
            .max()
            .unwrap_or(TaintLevel::None)
    }

    /// The taints, own and shared, on `member` that apply to a workload under `strategy`.
    pub fn applying<'a>(
        &'a self,
        member: &'a str,
        member_priority: Option<i32>,
        strategy: &'a ClusterStrategy,
    ) -> impl Iterator<Item = (&'a TaintScope, &'a Taint)> + 'a {
        self.taints
            .iter()
            .chain(&self.shared)
            .filter(move |((m, scope), _)| {
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
            .map(|((_, scope), t)| (scope, t))
    }

    /// Forgets taints that have fully expired, so the book does not grow forever.
    pub fn expire(&mut self, now: SystemTime) {
        self.taints.retain(|_, t| t.level(now) != TaintLevel::None);
        self.shared.retain(|_, t| t.level(now) != TaintLevel::None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn policy(soft: u64, hard: u64, create_failures_taint: bool) -> TaintPolicy {
        TaintPolicy {
            soft_taint_duration: Duration::from_secs(soft),
            hard_taint_duration: Duration::from_secs(hard),
            create_failures_taint,
        }
    }

    #[test]
    fn soft_then_hard_then_expiry() {
        let mut taint = Taint::new(policy(180, 300, true));
        assert_eq!(taint.level(at(0)), TaintLevel::None);
        assert_eq!(taint.observe(TaintEvent::JobStuck, at(0)), TaintLevel::Soft);
        assert_eq!(taint.level(at(179)), TaintLevel::Soft);
        // Second failure inside the soft window escalates.
        assert_eq!(
            taint.observe(TaintEvent::CreateFailed, at(100)),
            TaintLevel::Hard
        );
        assert_eq!(taint.level(at(399)), TaintLevel::Hard);
        assert_eq!(taint.level(at(400)), TaintLevel::None);
    }

    #[test]
    fn failure_while_hard_extends_it() {
        let mut taint = Taint::new(policy(0, 300, true));
        taint.observe(TaintEvent::JobStuck, at(0));
        taint.observe(TaintEvent::JobStuck, at(200));
        assert_eq!(taint.level(at(450)), TaintLevel::Hard);
        assert_eq!(taint.level(at(500)), TaintLevel::None);
    }

    #[test]
    fn failure_after_soft_window_is_soft_again() {
        let mut taint = Taint::new(policy(180, 300, true));
        taint.observe(TaintEvent::JobStuck, at(0));
        assert_eq!(taint.level(at(180)), TaintLevel::None);
        assert_eq!(
            taint.observe(TaintEvent::JobStuck, at(200)),
            TaintLevel::Soft
        );
    }

    #[test]
    fn zero_soft_duration_is_immediately_hard() {
        let mut taint = Taint::new(policy(0, 300, true));
        assert_eq!(taint.observe(TaintEvent::JobStuck, at(0)), TaintLevel::Hard);
    }

    proptest::proptest! {
        /// Whatever the failures, a taint is hard only after a failure in the soft window
        /// (or with a zero window), never outlives hardTaintDuration after the last failure,
        /// and is clean once both windows have passed.
        #[test]
        fn taint_invariants(
            gaps in proptest::collection::vec(0u64..400, 1..8),
            soft in 0u64..200,
            hard in 1u64..400,
        ) {
            let mut taint = Taint::new(policy(soft, hard, true));
            let mut now = 0;
            for gap in gaps {
                now += gap;
                let before = taint.level(at(now));
                let level = taint.observe(TaintEvent::JobStuck, at(now));
                let expected = if before == TaintLevel::None && soft > 0 {
                    TaintLevel::Soft
                } else {
                    TaintLevel::Hard
                };
                proptest::prop_assert_eq!(level, expected, "before {:?}", before);
                proptest::prop_assert_eq!(taint.level(at(now + hard.max(soft))), TaintLevel::None);
            }
        }
    }

    #[test]
    fn taints_past_the_end_of_time_never_expire() {
        let latest = saturating_add(at(0), Duration::MAX);
        // At the end of time a new window is empty; observing there must not panic.
        let mut taint = Taint::new(policy(u64::MAX, u64::MAX, true));
        taint.observe(TaintEvent::JobStuck, latest);
        assert_eq!(taint.soft_until, Some(latest));
        let mut taint = Taint::new(TaintPolicy {
            soft_taint_duration: Duration::MAX,
            hard_taint_duration: Duration::MAX,
            create_failures_taint: true,
        });
        assert_eq!(
            taint.observe(TaintEvent::JobStuck, at(10)),
            TaintLevel::Soft
        );
        assert_eq!(
            taint.observe(TaintEvent::JobStuck, at(20)),
            TaintLevel::Hard
        );
        assert_eq!(
            taint.level(saturating_add(at(20), Duration::from_secs(u64::MAX / 4))),
            TaintLevel::Hard
        );
        assert_eq!(taint.soft_until, None);
        assert_eq!(taint.hard_until, Some(latest));
    }

    #[test]
    fn transient_create_failures_do_not_taint() {
        let mut taint = Taint::new(policy(0, 300, false));
        assert_eq!(
            taint.observe(TaintEvent::CreateFailed, at(0)),
            TaintLevel::None
        );
        assert_eq!(taint.observe(TaintEvent::JobStuck, at(0)), TaintLevel::Hard);
    }

    fn settings(strategy: ClusterStrategy) -> DsjSettings {
        DsjSettings {
            members: None,
            cluster_strategy: strategy,
            scaling: crate::validate::ScalingStrategyKind::PendingAware,
            multiple_scalers: crate::validate::MultipleScalers::Max,
            min_jobs: 0,
            max_jobs: 100,
            strategy_max: 100,
            timing: FailoverTiming {
                soft_taint_duration: Duration::ZERO,
                ..FailoverTiming::default()
            },
            duplication: crate::validate::DuplicationPolicy::KeepAll,
            successful_jobs_history_limit: 100,
            failed_jobs_history_limit: 100,
            rollout: crate::validate::Rollout::Replace,
            propagation: crate::validate::Propagation::Background,
            triggers: Vec::new(),
            paused: false,
        }
    }

    #[test]
    fn priority_failover_scopes_by_size_and_ignores_create_failures() {
        let strategy = |size| ClusterStrategy::PriorityFailover {
            class: "team-a".into(),
            size,
        };
        let mut book = TaintBook::new(&settings(strategy(4)));
        let level = book.observe("primary", Some(100), TaintEvent::CreateFailed, at(0));
        assert_eq!(level, TaintLevel::None, "create failures are transient");
        book.observe("primary", Some(100), TaintEvent::JobStuck, at(0));
        assert_eq!(book.level("primary", Some(100), at(1)), TaintLevel::Hard);
        let level = |book: &TaintBook, priority, size| {
            book.level_under("primary", Some(priority), &strategy(size), at(1))
        };
        assert_eq!(level(&book, 100, 8), TaintLevel::Hard, "bigger sizes too");
        assert_eq!(
            level(&book, 100, 3),
            TaintLevel::None,
            "smaller sizes still fit"
        );
        assert_eq!(level(&book, 50, 4), TaintLevel::None, "other priority");
        let other_class = ClusterStrategy::PriorityFailover {
            class: "team-b".into(),
            size: 4,
        };
        assert_eq!(
            book.level_under("primary", Some(100), &other_class, at(1)),
            TaintLevel::None
        );
        // Another DSJ of the class at a smaller size still fits; a shared taint excludes
        // the bigger one, which neither keeps nor escalates it.
        let mut small = TaintBook::new(&settings(strategy(2)));
        small.share(book.taints.clone());
        assert_eq!(small.level("primary", Some(100), at(1)), TaintLevel::None);
        let mut big = TaintBook::new(&settings(strategy(6)));
        big.share(book.taints.clone());
        assert_eq!(big.level("primary", Some(100), at(1)), TaintLevel::Hard);
        assert!(
            big.taints.is_empty(),
            "a shared taint is not this DSJ's own"
        );
        big.expire(at(301));
        assert!(big.shared.is_empty());
        // Under weightedRoundRobin a create failure taints the whole cluster.
        let mut wrr = TaintBook::new(&settings(ClusterStrategy::WeightedRoundRobin));
        wrr.observe("b", None, TaintEvent::CreateFailed, at(0));
        assert_eq!(wrr.level("b", None, at(1)), TaintLevel::Hard);
        wrr.expire(at(301));
        assert!(wrr.taints.is_empty());
    }
}
