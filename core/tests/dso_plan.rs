//! DSO planner: the numbers of the reference documents as table tests, and the invariants
//! as properties.

use std::collections::BTreeMap;
use std::time::Duration;

use kedge_core::crd::conditions::MemberPhase;
use kedge_core::dso::{DsoPlan, DsoPlanInput, MemberObservation, Reason, plan};
use kedge_core::validate::{DsoMemberSettings, DsoSettings, Pause};
use proptest::prelude::*;

fn settings(members: &[(&str, u32)]) -> DsoSettings {
    DsoSettings {
        members: (!members.is_empty()).then(|| {
            members
                .iter()
                .map(|(name, weight)| DsoMemberSettings {
                    name: (*name).to_owned(),
                    weight: *weight,
                    tier: 0,
                    min_replicas: 0,
                    max_replicas: None,
                })
                .collect()
        }),
        grace_period: Duration::from_secs(60),
        max_rebalance_percentage: 50,
        avoid_disruption: true,
        migrate_unschedulable_after: None,
        dynamic_weights: false,
        min_total: 0,
        max_total: 1000,
        pause: Pause::No,
    }
}

fn ready(list: &[(&str, u32)]) -> Vec<MemberObservation> {
    list.iter()
        .map(|(name, current)| MemberObservation::ready(*name, *current))
        .collect()
}

fn run(s: &DsoSettings, total: u32, members: &[MemberObservation]) -> DsoPlan {
    plan(&DsoPlanInput {
        settings: s,
        total_target_replicas: total,
        members,
    })
}

fn desired(p: &DsoPlan) -> Vec<u32> {
    p.members.iter().map(|m| m.desired).collect()
}

#[test]
fn reference_weights_four_and_six() {
    // multicluster-dso-dsj.md: weights 4 and 6, status shows 2 and 3 for 5 replicas.
    let s = settings(&[("member-cluster-1", 4), ("member-cluster-2", 6)]);
    let p = run(
        &s,
        5,
        &ready(&[("member-cluster-1", 0), ("member-cluster-2", 0)]),
    );
    assert_eq!(desired(&p), vec![2, 3]);
    assert_eq!(p.shortfall, 0);
    assert!(p.members.iter().all(|m| m.reason == Reason::Weighted));
}

#[test]
fn omitted_member_list_uses_every_registered_member_equally() {
    let s = settings(&[]);
    let p = run(&s, 7, &ready(&[("c", 0), ("a", 0), ("b", 0)]));
    assert_eq!(
        p.desired(),
        BTreeMap::from([("a".into(), 3), ("b".into(), 2), ("c".into(), 2)])
    );
}

#[test]
fn listed_but_unregistered_member_gets_nothing() {
    let s = settings(&[("a", 1), ("ghost", 1)]);
    let p = run(&s, 4, &ready(&[("a", 0)]));
    assert_eq!(desired(&p), vec![4, 0]);
    assert_eq!(p.members[1].reason, Reason::NotConnected);
}

#[test]
fn grace_period_then_failover_then_fail_back() {
    let s = settings(&[("a", 1), ("b", 1), ("c", 1)]);
    let mut members = ready(&[("a", 4), ("b", 4), ("c", 4)]);
    // Within the grace period nothing moves.
    members[1].state = MemberPhase::Unreachable;
    members[1].unreachable_for = Duration::from_secs(30);
    let p = run(&s, 12, &members);
    assert_eq!(desired(&p), vec![4, 4, 4]);
    assert_eq!(p.members[1].reason, Reason::UnreachableInGracePeriod);
    // After it, b's share moves to a and c.
    members[1].unreachable_for = Duration::from_secs(61);
    let p = run(&s, 12, &members);
    assert_eq!(desired(&p), vec![6, 0, 6]);
    assert_eq!(p.members[1].reason, Reason::Unreachable);
    // b comes back empty: at most 50% of 12 moves per step, here all 4 at once.
    let members = ready(&[("a", 6), ("b", 0), ("c", 6)]);
    let p = run(&s, 12, &members);
    assert_eq!(desired(&p), vec![4, 4, 4]);
    assert_eq!(p.moved, 4);
    // With 10% only one replica moves per step.
    let slow = DsoSettings {
        max_rebalance_percentage: 10,
        ..s.clone()
    };
    let p = run(&slow, 12, &members);
    assert_eq!(desired(&p), vec![6, 1, 5]);
    assert_eq!(p.members[1].reason, Reason::Rebalancing);
    // A member back with its pods still running (fail-static) keeps them: others shrink.
    let p = run(&s, 12, &ready(&[("a", 6), ("b", 4), ("c", 6)]));
    assert_eq!(desired(&p), vec![4, 4, 4]);
}

#[test]
fn pause_and_paused_replicas() {
    let mut s = settings(&[("a", 1), ("b", 1)]);
    s.pause = Pause::Paused;
    let p = run(&s, 10, &ready(&[("a", 3), ("b", 1)]));
    assert!(p.paused);
    assert_eq!(desired(&p), vec![3, 1]);
    assert!(p.members.iter().all(|m| m.reason == Reason::Paused));
    // paused-replicas fixes the total, ignoring the scale target and maxReplicaCount.
    s.pause = Pause::AtReplicas(6);
    s.max_total = 4;
    let p = run(&s, 10, &ready(&[("a", 0), ("b", 0)]));
    assert!(p.paused);
    assert_eq!((p.total, desired(&p)), (6, vec![3, 3]));
}

#[test]
fn total_is_clamped_to_min_and_max_replica_count() {
    let mut s = settings(&[("a", 1)]);
    s.min_total = 2;
    s.max_total = 5;
    assert_eq!(run(&s, 0, &ready(&[("a", 0)])).total, 2);
    assert_eq!(run(&s, 9, &ready(&[("a", 0)])).total, 5);
}

#[test]
fn kubeadmiral_avoid_disruption_example() {
    let s = settings(&[("a", 1), ("b", 1), ("c", 1)]);
    let p = run(&s, 9, &ready(&[("a", 15), ("b", 15), ("c", 0)]));
    assert_eq!(desired(&p), vec![5, 4, 0]);
    assert_eq!(
        p.members.iter().map(|m| m.ideal).collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
    // Without avoidDisruption the total is re-distributed (KubeFed with rebalance).
    let s = DsoSettings {
        avoid_disruption: false,
        ..s
    };
    let p = run(&s, 9, &ready(&[("a", 15), ("b", 15), ("c", 0)]));
    assert_eq!(desired(&p), vec![3, 3, 3]);
}

#[test]
fn kubeadmiral_unschedulable_migration_example() {
    let mut s = settings(&[("a", 1), ("b", 1), ("c", 1)]);
    let mut members = ready(&[("a", 2), ("b", 2), ("c", 2)]);
    members[2].unschedulable_replicas = 2;
    members[2].unschedulable_for = Duration::from_secs(300);
    // Off by default.
    assert_eq!(desired(&run(&s, 6, &members)), vec![2, 2, 2]);
    s.migrate_unschedulable_after = Some(Duration::from_secs(600));
    assert_eq!(
        desired(&run(&s, 6, &members)),
        vec![2, 2, 2],
        "not long enough yet"
    );
    s.migrate_unschedulable_after = Some(Duration::from_secs(60));
    let p = run(&s, 6, &members);
    assert_eq!(desired(&p), vec![3, 3, 0]);
    assert_eq!(p.members[2].reason, Reason::UnschedulableMigrated);
}

#[test]
fn dynamic_weights_follow_reported_capacity() {
    let mut s = settings(&[("a", 1), ("b", 1)]);
    s.dynamic_weights = true;
    let mut members = ready(&[("a", 0), ("b", 0)]);
    members[0].capacity_replicas = Some(10);
    members[1].capacity_replicas = Some(30);
    assert_eq!(desired(&run(&s, 8, &members)), vec![2, 6]);
    // Without a report from every member the static weights apply.
    members[1].capacity_replicas = None;
    assert_eq!(desired(&run(&s, 8, &members)), vec![4, 4]);
}

#[test]
fn per_member_bounds_and_shortfall() {
    let mut s = settings(&[("a", 1), ("b", 1), ("c", 1)]);
    if let Some(m) = s.members.as_mut() {
        m[0].max_replicas = Some(2);
        m[2].min_replicas = 5;
    }
    let p = run(&s, 9, &ready(&[("a", 0), ("b", 0), ("c", 0)]));
    assert_eq!(desired(&p), vec![2, 2, 5]);
    assert_eq!(p.members[0].reason, Reason::AtMaximum);
    assert_eq!(p.members[2].reason, Reason::AtMinimum);
    let mut members = ready(&[("a", 0), ("b", 0), ("c", 0)]);
    members[1].capacity_replicas = Some(3);
    members[2].capacity_replicas = Some(6);
    let p = run(&s, 20, &members);
    assert_eq!(desired(&p), vec![2, 3, 6]);
    assert_eq!(p.shortfall, 9);
    assert_eq!(p.members[1].reason, Reason::AtCapacity);
}

fn tiered() -> DsoSettings {
    let mut s = settings(&[("idc-1", 1), ("idc-2", 1), ("cloud", 1)]);
    if let Some(m) = s.members.as_mut() {
        m[0].max_replicas = Some(4);
        m[1].max_replicas = Some(2);
        m[2].tier = 1;
    }
    s
}

#[test]
fn tiers_fill_in_order_and_drain_in_reverse() {
    let s = tiered();
    let p = run(&s, 5, &ready(&[("idc-1", 0), ("idc-2", 0), ("cloud", 0)]));
    assert_eq!(desired(&p), vec![3, 2, 0]);
    let p = run(&s, 10, &ready(&[("idc-1", 3), ("idc-2", 2), ("cloud", 0)]));
    assert_eq!(desired(&p), vec![4, 2, 4]);
    assert_eq!(p.members[2].reason, Reason::SpillOver);
    let p = run(&s, 7, &ready(&[("idc-1", 4), ("idc-2", 2), ("cloud", 4)]));
    assert_eq!(
        desired(&p),
        vec![4, 2, 1],
        "scale-in drains the cloud tier first"
    );
    let p = run(&s, 4, &ready(&[("idc-1", 4), ("idc-2", 2), ("cloud", 1)]));
    assert_eq!(
        desired(&p),
        vec![2, 2, 0],
        "only members above their share shrink"
    );
}

// ---- properties ----

#[derive(Clone, Debug)]
struct Member {
    weight: u32,
    tier: u32,
    min: u32,
    max: Option<u32>,
    capacity: Option<u32>,
    current: u32,
}

fn member() -> impl Strategy<Value = Member> {
    (
        0u32..5,
        0u32..3,
        0u32..4,
        prop::option::of(0u32..15),
        prop::option::of(0u32..15),
        0u32..20,
    )
        .prop_map(|(weight, tier, min, max, capacity, current)| Member {
            weight,
            tier,
            min: max.map_or(min, |m| min.min(m)),
            max,
            capacity,
            current,
        })
}

fn build(members: &[Member], avoid_disruption: bool) -> (DsoSettings, Vec<MemberObservation>) {
    let names: Vec<String> = (0..members.len()).map(|i| format!("m{i}")).collect();
    let mut s = settings(&[]);
    s.avoid_disruption = avoid_disruption;
    s.members = Some(
        members
            .iter()
            .zip(&names)
            .map(|(m, name)| DsoMemberSettings {
                name: name.clone(),
                weight: m.weight,
                tier: m.tier,
                min_replicas: m.min,
                max_replicas: m.max,
            })
            .collect(),
    );
    if members.iter().all(|m| m.weight == 0)
        && let Some(first) = s.members.as_mut().and_then(|m| m.first_mut())
    {
        first.weight = 1;
    }
    let obs = members
        .iter()
        .zip(&names)
        .map(|(m, name)| MemberObservation {
            capacity_replicas: m.capacity,
            ..MemberObservation::ready(name.clone(), m.current)
        })
        .collect();
    (s, obs)
}

fn limit(m: &Member) -> Option<u32> {
    match (m.max, m.capacity) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn tier_sums(members: &[Member], p: &DsoPlan) -> BTreeMap<u32, (u32, Option<u32>)> {
    let mut sums: BTreeMap<u32, (u32, Option<u32>)> = BTreeMap::new();
    for (m, d) in members.iter().zip(&p.members) {
        let e = sums.entry(m.tier).or_insert((0, Some(0)));
        e.0 += d.desired;
        e.1 = e.1.zip(limit(m)).map(|(a, b)| a + b);
    }
    sums
}

proptest! {
    #[test]
    fn sum_is_target_or_shortfall_is_reported(
        members in prop::collection::vec(member(), 1..6),
        total in 0u32..60,
        avoid in any::<bool>(),
    ) {
        let (s, obs) = build(&members, avoid);
        let p = run(&s, total, &obs);
        let placed: u32 = p.members.iter().map(|m| m.desired).sum();
        prop_assert_eq!(placed + p.shortfall, total);
        let room: Option<u32> = members.iter().map(limit).sum();
        if p.shortfall > 0 {
            prop_assert_eq!(Some(placed), room, "shortfall only when every limit is reached");
        }
    }

    #[test]
    fn bounds_are_respected(
        members in prop::collection::vec(member(), 1..6),
        total in 0u32..60,
        avoid in any::<bool>(),
    ) {
        let (s, obs) = build(&members, avoid);
        let p = run(&s, total, &obs);
        let floors: u32 = members.iter().map(|m| limit(m).map_or(m.min, |l| m.min.min(l))).sum();
        for (m, d) in members.iter().zip(&p.members) {
            if let Some(l) = limit(m) {
                prop_assert!(d.desired <= l, "{} > limit {}", d.desired, l);
            }
            if total >= floors {
                prop_assert!(d.desired >= m.min.min(limit(m).unwrap_or(u32::MAX)));
            }
        }
    }

    #[test]
    fn same_input_same_output(
        members in prop::collection::vec(member(), 1..6),
        total in 0u32..60,
        avoid in any::<bool>(),
    ) {
        let (s, obs) = build(&members, avoid);
        prop_assert_eq!(run(&s, total, &obs), run(&s, total, &obs));
    }

    #[test]
    fn tiers_fill_in_order(
        members in prop::collection::vec(member(), 1..6),
        total in 0u32..60,
    ) {
        let members: Vec<Member> = members.into_iter().map(|m| Member { min: 0, ..m }).collect();
        let (s, obs) = build(&members, true);
        let p = run(&s, total, &obs);
        let sums: Vec<(u32, Option<u32>)> = tier_sums(&members, &p).into_values().collect();
        for t in 1..sums.len() {
            if sums[t].0 > 0 {
                for lower in &sums[..t] {
                    prop_assert_eq!(Some(lower.0), lower.1, "a higher tier is used only when lower tiers are full");
                }
            }
        }
    }

    #[test]
    fn scale_in_drains_highest_tier_first(
        members in prop::collection::vec(member(), 1..6),
        high in 0u32..60,
        drop in 0u32..60,
    ) {
        let members: Vec<Member> = members.into_iter().map(|m| Member { min: 0, current: 0, ..m }).collect();
        let (s, obs) = build(&members, true);
        let before = run(&s, high, &obs);
        let after_obs: Vec<MemberObservation> = obs
            .iter()
            .zip(&before.members)
            .map(|(o, d)| MemberObservation { current_replicas: d.desired, ..o.clone() })
            .collect();
        let after = run(&s, high.saturating_sub(drop), &after_obs);
        let b: Vec<u32> = tier_sums(&members, &before).into_values().map(|v| v.0).collect();
        let a: Vec<u32> = tier_sums(&members, &after).into_values().map(|v| v.0).collect();
        for t in 0..a.len() {
            prop_assert!(a[t] <= b[t]);
            if a[t] < b[t] {
                prop_assert!(a[t + 1..].iter().all(|&x| x == 0), "tier {} shrank before higher tiers emptied: {:?} -> {:?}", t, b, a);
            }
        }
    }

    #[test]
    fn rescaling_moves_only_what_must_move(
        members in prop::collection::vec(member(), 1..6),
        total in 0u32..60,
    ) {
        // One tier, currents within bounds.
        let members: Vec<Member> = members
            .into_iter()
            .map(|m| {
                let l = limit(&m).unwrap_or(u32::MAX);
                Member { tier: 0, current: m.current.clamp(m.min.min(l), l), ..m }
            })
            .collect();
        let (s, obs) = build(&members, true);
        let p = run(&s, total, &obs);
        let now: u32 = members.iter().map(|m| m.current).sum();
        if p.shortfall == 0 && now != total {
            let mut moved = 0;
            for (m, d) in members.iter().zip(&p.members) {
                if total > now {
                    prop_assert!(d.desired >= m.current, "scale-out shrank a member");
                } else {
                    prop_assert!(d.desired <= m.current, "scale-in grew a member");
                }
                moved += d.desired.abs_diff(m.current);
            }
            prop_assert_eq!(moved, total.abs_diff(now));
        }
    }
}

#[test]
fn zero_rebalance_percentage_never_moves_at_a_constant_total() {
    let mut s = settings(&[("a", 1), ("b", 1)]);
    s.max_rebalance_percentage = 0;
    let p = run(&s, 8, &ready(&[("a", 8), ("b", 0)]));
    assert_eq!((desired(&p), p.moved), (vec![8, 0], 0));
    assert!(p.members.iter().all(|m| m.reason == Reason::Rebalancing));
}

mod primitives {
    use kedge_core::dso::distribute::{Slot, distribute, distribute_change, rebalance_step};
    use proptest::prelude::*;

    fn slots() -> impl Strategy<Value = Vec<Slot>> {
        prop::collection::vec(
            (0u64..6, 0u64..5, prop::option::of(0u64..12)).prop_map(|(weight, min, max)| Slot {
                weight,
                min: max.map_or(min, |m| min.min(m)),
                max,
            }),
            1..6,
        )
    }

    proptest! {
        #[test]
        fn distribute_places_everything_within_bounds(slots in slots(), total in 0u64..80) {
            let d = distribute(total, &slots);
            let placed: u64 = d.replicas.iter().sum();
            prop_assert_eq!(placed + d.shortfall, total);
            let floors: u64 = slots.iter().map(|s| s.min).sum();
            let ceilings: Option<u64> = slots.iter().map(|s| s.max).sum();
            prop_assert_eq!(d.shortfall, ceilings.map_or(0, |c| total.saturating_sub(c)));
            for (s, r) in slots.iter().zip(&d.replicas) {
                prop_assert!(s.max.is_none_or(|m| *r <= m));
                if total >= floors {
                    prop_assert!(*r >= s.min);
                }
            }
        }

        #[test]
        fn unbounded_shares_are_within_one_of_exact(weights in prop::collection::vec(1u64..9, 1..6), total in 0u64..100) {
            let slots: Vec<Slot> = weights.iter().map(|&weight| Slot { weight, min: 0, max: None }).collect();
            let d = distribute(total, &slots);
            let sum: u64 = weights.iter().sum();
            for (w, r) in weights.iter().zip(&d.replicas) {
                let exact = total * w;
                prop_assert!(r * sum <= exact + sum && exact <= r * sum + sum, "{} for weight {}", r, w);
            }
        }

        #[test]
        fn change_and_rebalance_move_towards_the_ideal(
            pairs in prop::collection::vec((0u64..15, 0u64..15), 1..6),
            total in 0u64..60,
            budget in 0u64..10,
        ) {
            let current: Vec<u64> = pairs.iter().map(|p| p.0).collect();
            // Scale the ideal to `total` so the change is well defined.
            let ideal = distribute(total, &pairs.iter().map(|p| Slot { weight: p.1 + 1, min: 0, max: None }).collect::<Vec<_>>()).replicas;
            let next = distribute_change(&current, &ideal, total);
            prop_assert_eq!(next.iter().sum::<u64>(), total);
            for ((c, i), n) in current.iter().zip(&ideal).zip(&next) {
                prop_assert!(n.abs_diff(*i) <= c.abs_diff(*i), "overshoot: {} -> {} (ideal {})", c, n, i);
            }
            let (step, moved) = rebalance_step(&next, &ideal, budget);
            prop_assert!(moved <= budget);
            prop_assert_eq!(step.iter().sum::<u64>(), total);
            let moved_total: u64 = step.iter().zip(&next).map(|(a, b)| a.abs_diff(*b)).sum();
            prop_assert_eq!(moved_total, 2 * moved);
            for ((c, i), n) in next.iter().zip(&ideal).zip(&step) {
                prop_assert!(n.abs_diff(*i) <= c.abs_diff(*i));
            }
        }
    }
}
