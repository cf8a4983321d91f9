//! The DSO planner: (settings, total, member observations) → desired replicas per member.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::distribute::{Slot, distribute, distribute_change, rebalance_step};
use crate::crd::conditions::MemberPhase;
use crate::validate::{DsoMemberSettings, DsoSettings, Pause};

/// What the hub knows about one registered member for one DSO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberObservation {
    /// Member name.
    pub name: String,
    /// Its state: anything but Ready is treated as unreachable (for `unreachable_for`).
    pub state: MemberPhase,
    /// How long the member has been unreachable (ignored when Ready).
    pub unreachable_for: Duration,
    /// Replicas the member last reported for the workload.
    pub current_replicas: u32,
    /// Of those, replicas whose pods are unschedulable.
    pub unschedulable_replicas: u32,
    /// How long some replicas have been unschedulable.
    pub unschedulable_for: Duration,
    /// Replicas of this workload the member can run in total (its current replicas plus
    /// the free room it reports); `None` when unknown (unbounded).
    pub capacity_replicas: Option<u32>,
}

impl MemberObservation {
    /// A Ready member running `current_replicas`, with nothing else known.
    pub fn ready(name: impl Into<String>, current_replicas: u32) -> Self {
        Self {
            name: name.into(),
            state: MemberPhase::Ready,
            unreachable_for: Duration::ZERO,
            current_replicas,
            unschedulable_replicas: 0,
            unschedulable_for: Duration::ZERO,
            capacity_replicas: None,
        }
    }
}

/// Everything [`plan`] decides from.
#[derive(Clone, Copy, Debug)]
pub struct DsoPlanInput<'a> {
    /// The validated spec and annotations.
    pub settings: &'a DsoSettings,
    /// `spec.totalTargetReplicas` as written by KEDA's HPA or `kubectl scale`.
    pub total_target_replicas: u32,
    /// Every registered member the hub knows, with its latest observation.
    pub members: &'a [MemberObservation],
}

/// Why a member gets its count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Reason {
    /// Its share by weight.
    Weighted,
    /// Its share by weight, in a tier above 0 because lower tiers are full.
    SpillOver,
    /// Moving gradually towards its share (avoidDisruption or maxRebalancePercentage).
    Rebalancing,
    /// Raised to `minReplicas`.
    AtMinimum,
    /// Capped by `maxReplicas`.
    AtMaximum,
    /// Capped by the capacity the member reports.
    AtCapacity,
    /// Capped at its scheduled replicas: the rest were unschedulable too long.
    UnschedulableMigrated,
    /// Paused by annotation: left as it is.
    Paused,
    /// Unreachable within the grace period: kept at its current count.
    UnreachableInGracePeriod,
    /// Unreachable longer than the grace period: its share moved to others.
    Unreachable,
    /// Listed in the spec but not registered or never connected.
    NotConnected,
}

impl Reason {
    /// A short sentence for events, status and the simulate table.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Weighted => "share by weight",
            Reason::SpillOver => "share by weight (lower tiers full)",
            Reason::Rebalancing => "moving gradually towards its share",
            Reason::AtMinimum => "raised to minReplicas",
            Reason::AtMaximum => "capped by maxReplicas",
            Reason::AtCapacity => "capped by reported capacity",
            Reason::UnschedulableMigrated => "unschedulable replicas moved elsewhere",
            Reason::Paused => "paused",
            Reason::UnreachableInGracePeriod => "unreachable, within gracePeriod",
            Reason::Unreachable => "unreachable longer than gracePeriod",
            Reason::NotConnected => "not connected",
        }
    }
}

/// The decision for one member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberDecision {
    /// Member name.
    pub name: String,
    /// Its tier.
    pub tier: u32,
    /// Replicas it reported.
    pub current: u32,
    /// Replicas it should run.
    pub desired: u32,
    /// Its share if nothing had to move gradually.
    pub ideal: u32,
    /// Why.
    pub reason: Reason,
}

/// The result of [`plan`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DsoPlan {
    /// Fleet-wide total that was distributed (after pause and min/max).
    pub total: u32,
    /// Whether a pause annotation applied.
    pub paused: bool,
    /// One decision per member used, in spec order (or by name when the spec lists none).
    pub members: Vec<MemberDecision>,
    /// Replicas no member can take because every limit is reached.
    pub shortfall: u32,
    /// Replicas moved between members by this rebalancing step.
    pub moved: u32,
}

impl DsoPlan {
    /// Desired replicas by member name.
    pub fn desired(&self) -> BTreeMap<String, u32> {
        self.members
            .iter()
            .map(|m| (m.name.clone(), m.desired))
            .collect()
    }
}

/// What limits a member, for the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    Max,
    Capacity,
    Unschedulable,
}

#[derive(Clone, Debug)]
struct Active {
    index: usize,
    weight: u64,
    tier: u32,
    floor: u64,
    limit: Option<(u64, Limit)>,
    current: u64,
}

fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The members a DSO uses: those listed in the spec, or every observed (registered)
/// member by name with the defaults.
fn listed_members(s: &DsoSettings, observed: &[MemberObservation]) -> Vec<DsoMemberSettings> {
    if let Some(members) = &s.members {
        return members.clone();
    }
    let mut names: Vec<&str> = observed.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| DsoMemberSettings {
            name: name.to_owned(),
            weight: 1,
            tier: 0,
            min_replicas: 0,
            max_replicas: None,
        })
        .collect()
}

/// Splits `to_place` over tiers in order: every tier's floor first (lowest tier first when
/// even the floors do not fit), then each tier up to its cap (`None` = unbounded) before the
/// next. Returns the per-tier totals and what fits nowhere.
fn fill_tiers(to_place: u64, floors: &[u64], caps: &[Option<u64>]) -> (Vec<u64>, u64) {
    let mut totals = vec![0u64; floors.len()];
    let floor_sum: u64 = floors.iter().sum();
    if to_place <= floor_sum {
        let mut left = to_place;
        for (total, floor) in totals.iter_mut().zip(floors) {
            *total = left.min(*floor);
            left -= *total;
        }
        return (totals, 0);
    }
    let mut left = to_place - floor_sum;
    for ((total, floor), cap) in totals.iter_mut().zip(floors).zip(caps) {
        let room = cap.map_or(u64::MAX, |c| c.saturating_sub(*floor));
        let add = left.min(room);
        *total = floor + add;
        left -= add;
    }
    (totals, left)
}

/// Decides the desired replicas of every member of one DSO.
///
/// Order of rules: pause annotations (`paused-replicas` wins and fixes the total; `paused`
/// leaves every member as it is); the total is clamped to `minReplicaCount..=maxReplicaCount`;
/// members unreachable longer than `gracePeriod` get nothing, members unreachable within it
/// keep what they run; the rest fill tiers in order (each member limited by `maxReplicas`,
/// its reported capacity and, after `migrateUnschedulableAfter`, its scheduled replicas),
/// sharing each tier by weight (static, or reported capacity with `dynamicWeights`) with
/// `minReplicas` floors. A changed total moves only the change when `avoidDisruption`; an
/// unchanged total converges to the shares by at most `maxRebalancePercentage` of the total
/// per step.
pub fn plan(input: &DsoPlanInput<'_>) -> DsoPlan {
    let s = input.settings;
    let listed = listed_members(s, input.members);
    // Indexed once: a plan over thousands of members looks each one up several times.
    let observations: std::collections::BTreeMap<&str, _> = input
        .members
        .iter()
        .rev()
        .map(|m| (m.name.as_str(), m))
        .collect();
    let observation = |name: &str| observations.get(name).copied();
    let mut decisions: Vec<MemberDecision> = listed
        .iter()
        .map(|m| {
            let current = observation(&m.name).map_or(0, |o| o.current_replicas);
            MemberDecision {
                name: m.name.clone(),
                tier: m.tier,
                current,
                desired: current,
                ideal: current,
                reason: Reason::Paused,
            }
        })
        .collect();
    let (total, paused) = match s.pause {
        Pause::Paused => {
            return DsoPlan {
                total: decisions.iter().map(|d| d.current).sum(),
                paused: true,
                members: decisions,
                shortfall: 0,
                moved: 0,
            };
        }
        Pause::AtReplicas(n) => (n, true),
        Pause::No => (
            input
                .total_target_replicas
                .clamp(s.min_total, s.max_total.max(s.min_total)),
            false,
        ),
    };

    let mut active: Vec<Active> = Vec::new();
    let mut pinned: u64 = 0;
    for (index, m) in listed.iter().enumerate() {
        let decision = &mut decisions[index];
        let Some(o) = observation(&m.name) else {
            (decision.desired, decision.ideal, decision.reason) = (0, 0, Reason::NotConnected);
            continue;
        };
        if !o.state.is_ready() {
            if o.unreachable_for > s.grace_period {
                (decision.desired, decision.ideal, decision.reason) = (0, 0, Reason::Unreachable);
            } else {
                // It cannot be told anything; others plan around what it runs.
                decision.reason = Reason::UnreachableInGracePeriod;
                pinned += u64::from(o.current_replicas);
            }
            continue;
        }
        let mut limit: Option<(u64, Limit)> = m.max_replicas.map(|v| (u64::from(v), Limit::Max));
        let mut tighten = |value: u64, why: Limit| {
            if limit.is_none_or(|(l, _)| value < l) {
                limit = Some((value, why));
            }
        };
        if let Some(capacity) = o.capacity_replicas {
            tighten(u64::from(capacity), Limit::Capacity);
        }
        if let Some(after) = s.migrate_unschedulable_after
            && o.unschedulable_replicas > 0
            && o.unschedulable_for >= after
        {
            let scheduled = o.current_replicas.saturating_sub(o.unschedulable_replicas);
            tighten(u64::from(scheduled), Limit::Unschedulable);
        }
        let cap = limit.map(|(l, _)| l);
        let min = u64::from(m.min_replicas);
        let floor = cap.map_or(min, |c| min.min(c));
        let current = cap.map_or(u64::from(o.current_replicas), |c| {
            u64::from(o.current_replicas).min(c)
        });
        active.push(Active {
            index,
            weight: u64::from(m.weight),
            tier: m.tier,
            floor,
            limit,
            current: current.max(floor),
        });
    }
    if s.dynamic_weights
        && !active.is_empty()
        && active.iter().all(|a| {
            observation(&listed[a.index].name).is_some_and(|o| o.capacity_replicas.is_some())
        })
    {
        for a in &mut active {
            a.weight = observation(&listed[a.index].name)
                .and_then(|o| o.capacity_replicas)
                .map_or(0, u64::from);
        }
    }

    // Fill tiers in order: floors first (lowest tier first), then capacity.
    let mut tiers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (k, a) in active.iter().enumerate() {
        tiers.entry(a.tier).or_default().push(k);
    }
    let to_place = u64::from(total).saturating_sub(pinned);
    let floors: Vec<u64> = tiers
        .values()
        .map(|ks| ks.iter().map(|&k| active[k].floor).sum())
        .collect();
    let caps: Vec<Option<u64>> = tiers
        .values()
        .map(|ks| ks.iter().map(|&k| active[k].limit.map(|(l, _)| l)).sum())
        .collect();
    let (tier_totals, left) = fill_tiers(to_place, &floors, &caps);
    let mut shortfall = left;

    let pct = u64::from(s.max_rebalance_percentage);
    let mut budget = if pct == 0 {
        0
    } else {
        (u64::from(total) * pct / 100).max(1)
    };
    let mut moved: u64 = 0;
    for (t, ks) in tiers.values().enumerate() {
        let slots: Vec<Slot> = ks
            .iter()
            .map(|&k| Slot {
                weight: active[k].weight,
                min: active[k].floor,
                max: active[k].limit.map(|(l, _)| l),
            })
            .collect();
        let tier_ideal = distribute(tier_totals[t], &slots);
        // Tier totals never exceed the tier's room, so this is zero; kept for safety.
        shortfall += tier_ideal.shortfall;
        let ideal = tier_ideal.replicas;
        let current: Vec<u64> = ks.iter().map(|&k| active[k].current).collect();
        let now: u64 = current.iter().sum();
        let desired = if now == tier_totals[t] {
            let (next, step) = rebalance_step(&current, &ideal, budget);
            budget -= step;
            moved += step;
            next
        } else if s.avoid_disruption {
            distribute_change(&current, &ideal, tier_totals[t])
        } else {
            ideal.clone()
        };
        for (j, &k) in ks.iter().enumerate() {
            let a = &active[k];
            let d = &mut decisions[a.index];
            d.desired = to_u32(desired[j]);
            d.ideal = to_u32(ideal[j]);
            d.reason = match a.limit {
                _ if desired[j] != ideal[j] => Reason::Rebalancing,
                Some((l, why)) if desired[j] == l => match why {
                    Limit::Max => Reason::AtMaximum,
                    Limit::Capacity => Reason::AtCapacity,
                    Limit::Unschedulable => Reason::UnschedulableMigrated,
                },
                _ if a.floor > 0 && desired[j] == a.floor => Reason::AtMinimum,
                _ if t > 0 && desired[j] > 0 => Reason::SpillOver,
                _ => Reason::Weighted,
            };
        }
    }

    DsoPlan {
        total,
        paused,
        members: decisions,
        shortfall: to_u32(shortfall),
        moved: to_u32(moved),
    }
}
