//! The DSJ planner: (settings, metrics, member job counts, taints) → Jobs to create where.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

use super::scaling::{JobCounts, TriggerMetric, combine, jobs_to_create};
use super::schedule::{WrrState, highest_priority};
use super::taint::{TaintBook, TaintLevel};
use crate::crd::conditions::MemberPhase;
use crate::validate::{ClusterStrategy, DsjMemberSettings, DsjSettings, ScalingStrategyKind};

/// What the hub knows about one registered member for one DSJ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsjMemberObservation {
    /// Member name.
    pub name: String,
    /// Health.
    pub state: MemberPhase,
    /// Non-terminal Jobs of this DSJ there (includes pending).
    pub running_jobs: u32,
    /// Of those, Jobs whose pods are not running yet.
    pub pending_jobs: u32,
    /// Of the pending, Jobs pending longer than `failoverPolicy.gracePeriod` that have no
    /// replacement yet.
    pub stuck_jobs: u32,
}

/// Everything [`plan`] decides from.
#[derive(Clone, Copy, Debug)]
pub struct DsjPlanInput<'a> {
    /// The validated spec and annotations.
    pub settings: &'a DsjSettings,
    /// Trigger readings by trigger key (name, else type); a missing trigger is inactive.
    pub metrics: &'a BTreeMap<String, TriggerMetric>,
    /// Every registered member the hub knows.
    pub members: &'a [DsjMemberObservation],
    /// Current taints of this DSJ.
    pub taints: &'a TaintBook,
    /// Round-robin state from the previous plan.
    pub wrr: &'a WrrState,
    /// Only failover Jobs for stuck ones are created (a timer's tick between two polls,
    /// with the last poll's metrics).
    pub failover_only: bool,
    /// The time taints are evaluated at.
    pub now: SystemTime,
}

/// Why a member can or cannot receive Jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Eligibility {
    /// Receives Jobs.
    Eligible,
    /// Soft-tainted, still receives Jobs.
    SoftTainted,
    /// Hard-tainted for this workload: excluded.
    HardTainted,
    /// Unreachable: excluded.
    Unreachable,
    /// Listed but not registered/connected: excluded.
    NotConnected,
}

/// Jobs to create in one member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberJobs {
    /// Member name.
    pub name: String,
    /// Jobs to create there now.
    pub create: u32,
    /// Of `create`, replacements for stuck Jobs in other members.
    pub replacements: u32,
    /// Whether it can receive Jobs.
    pub eligibility: Eligibility,
}

/// A stuck Job in `from` replaced by a new one in `to`; the hub links them for the
/// duplication policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Replacement {
    /// Member of the stuck source Job.
    pub from: String,
    /// Member of the failover Job.
    pub to: String,
}

/// The result of [`plan`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DsjPlan {
    /// Desired Jobs from the metrics and min/max.
    pub desired_jobs: u32,
    /// Non-terminal Jobs fleet-wide.
    pub running_jobs: u32,
    /// Pending Jobs fleet-wide.
    pub pending_jobs: u32,
    /// Jobs the scaling strategy asks to create.
    pub to_create: u32,
    /// Paused by annotation (nothing is created).
    pub paused: bool,
    /// Per member, in spec order (or by name when the spec lists none).
    pub members: Vec<MemberJobs>,
    /// Stuck Jobs replaced this poll.
    pub replacements: Vec<Replacement>,
    /// Jobs the strategy wanted but no eligible member could take.
    pub unplaced: u32,
    /// Round-robin state to pass to the next plan.
    #[serde(skip)]
    pub wrr: WrrState,
}

impl DsjPlan {
    /// Jobs to create by member name (members with 0 included).
    pub fn create(&self) -> BTreeMap<String, u32> {
        self.members
            .iter()
            .map(|m| (m.name.clone(), m.create))
            .collect()
    }
}

/// Decides how many Jobs to create and in which members.
///
/// The desired count comes from the triggers (`ceil(value / target)` each, combined by
/// `multipleScalersCalculation`, bounded by min/max); the scaling strategy turns it into a
/// number of new Jobs; `pendingAware` re-creates stuck Jobs, and those replacements go to a
/// member other than the stuck one. Members that are unreachable or hard-tainted for this
/// workload receive nothing; soft-tainted members stay eligible. `weightedRoundRobin` spreads
/// Jobs by weight with persistent smooth round robin; `priorityFailover` sends them to the
/// highest-priority eligible member.
pub fn plan(input: &DsjPlanInput<'_>) -> DsjPlan {
    let s = input.settings;
    let listed: Vec<DsjMemberSettings> = match &s.members {
        Some(members) => members.clone(),
        None => {
            let mut names: Vec<&str> = input.members.iter().map(|m| m.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
                .into_iter()
                .map(|name| DsjMemberSettings {
                    name: name.to_owned(),
                    weight: 1,
                    priority: None,
                })
                .collect()
        }
    };
    let observation = |name: &str| input.members.iter().find(|m| m.name == name);
    let metrics: Vec<TriggerMetric> = s
        .triggers
        .iter()
        .map(|key| {
            input.metrics.get(key).copied().unwrap_or(TriggerMetric {
                value: 0.0,
                target: 1.0,
            })
        })
        .collect();
    let metric = combine(s.multiple_scalers, &metrics, s.strategy_max);
    let mut running = 0u32;
    let mut pending = 0u32;
    let mut stuck = 0u32;
    for m in &listed {
        if let Some(o) = observation(&m.name) {
            running = running.saturating_add(o.running_jobs);
            pending = pending.saturating_add(o.pending_jobs);
            stuck = stuck.saturating_add(o.stuck_jobs);
        }
    }
    let counts = JobCounts {
        metric,
        running,
        pending,
        stuck,
        min: s.min_jobs,
        max: s.strategy_max,
    };
    let desired = u32::try_from(counts.desired())
        .unwrap_or(u32::MAX)
        .min(s.max_jobs);
    let to_create = if s.paused {
        0
    } else {
        jobs_to_create(&s.scaling, counts)
    };

    let mut members: Vec<MemberJobs> = listed
        .iter()
        .map(|m| {
            let (name, priority) = (&m.name, m.priority);
            let eligibility = match observation(name) {
                None => Eligibility::NotConnected,
                Some(o) if !o.state.is_ready() => Eligibility::Unreachable,
                Some(_) => {
                    match input
                        .taints
                        .level_under(name, priority, &s.cluster_strategy, input.now)
                    {
                        TaintLevel::Hard => Eligibility::HardTainted,
                        TaintLevel::Soft => Eligibility::SoftTainted,
                        TaintLevel::None => Eligibility::Eligible,
                    }
                }
            };
            MemberJobs {
                name: name.clone(),
                create: 0,
                replacements: 0,
                eligibility,
            }
        })
        .collect();
    let eligible: Vec<bool> = members
        .iter()
        .map(|m| {
            matches!(
                m.eligibility,
                Eligibility::Eligible | Eligibility::SoftTainted
            )
        })
        .collect();

    let mut wrr = input.wrr.clone();
    let names: Vec<&str> = listed.iter().map(|m| m.name.as_str()).collect();
    wrr.retain(&names);
    let pick = |exclude: Option<usize>, wrr: &mut WrrState| -> Option<usize> {
        let candidates = (0..listed.len()).filter(|&i| eligible[i] && Some(i) != exclude);
        match &s.cluster_strategy {
            ClusterStrategy::WeightedRoundRobin => {
                let c: Vec<(&str, u32)> =
                    candidates.map(|i| (names[i], listed[i].weight)).collect();
                wrr.pick(&c)
                    .and_then(|name| names.iter().position(|n| *n == name))
            }
            ClusterStrategy::PriorityFailover { .. } => {
                let c: Vec<(&str, i32)> = candidates
                    .map(|i| (names[i], listed[i].priority.unwrap_or(0)))
                    .collect();
                highest_priority(&c).and_then(|name| names.iter().position(|n| *n == name))
            }
        }
    };

    // Replacements first (only pendingAware counts stuck Jobs), each away from its source.
    let mut left = to_create;
    let mut replacements = Vec::new();
    let mut unplaced = 0u32;
    if s.scaling == ScalingStrategyKind::PendingAware {
        for (i, name) in names.iter().enumerate() {
            let stuck_here = observation(name).map_or(0, |o| o.stuck_jobs);
            for _ in 0..stuck_here {
                if left == 0 {
                    break;
                }
                left -= 1;
                match pick(Some(i), &mut wrr) {
                    Some(to) => {
                        members[to].create += 1;
                        members[to].replacements += 1;
                        replacements.push(Replacement {
                            from: (*name).to_owned(),
                            to: names[to].to_owned(),
                        });
                    }
                    None => unplaced += 1,
                }
            }
        }
    }
    // The rest at once: arithmetic, not one pick per Job, since maxReplicaCount is user
    // input and may be huge.
    let candidates: Vec<usize> = (0..listed.len()).filter(|&i| eligible[i]).collect();
    if input.failover_only {
        // A tick creates no new work; what no member could take is still unplaced.
        if candidates.is_empty() {
            unplaced = unplaced.saturating_add(left);
        }
        left = 0;
    }
    match &s.cluster_strategy {
        ClusterStrategy::WeightedRoundRobin => {
            let c: Vec<(&str, u32)> = candidates
                .iter()
                .map(|&i| (names[i], listed[i].weight))
                .collect();
            let counts = wrr.assign(&c, u64::from(left));
            let mut placed = 0u32;
            for (&i, count) in candidates.iter().zip(counts) {
                let count = u32::try_from(count).unwrap_or(u32::MAX);
                members[i].create = members[i].create.saturating_add(count);
                placed = placed.saturating_add(count);
            }
            unplaced += left - placed.min(left);
        }
        ClusterStrategy::PriorityFailover { .. } => match pick(None, &mut wrr) {
            Some(to) => members[to].create += left,
            None => unplaced += left,
        },
    }

    DsjPlan {
        desired_jobs: desired,
        running_jobs: running,
        pending_jobs: pending,
        to_create,
        paused: s.paused,
        members,
        replacements,
        unplaced,
        wrr,
    }
}
