//! What one DSO reconciliation's decision costs at fleet sizes: `dso::outcome` over N
//! connected, reported members (equal weights, every member of the fleet), with the
//! previous status as the hub keeps it (at most 1,000 members listed), for a change of the
//! total. Prints a table of the median and the fastest of the runs.
//!
//! `cargo bench -p kedge-core --bench dso_outcome` (`DSO_OUTCOME_MEMBERS=1000,10000`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kedge_core::crd::dso::{DistributedScaledObjectStatus, DsoMemberClusterStatus};
use kedge_core::dso::member::{MemberFacts, MemberPhase, Session};
use kedge_core::dso::outcome::{DsoInput, outcome};
use kedge_core::validate::{DsoSettings, Pause};
use kedge_protocol::{ClusterCapacity, WorkloadRef, WorkloadStatus};

const RUNS: usize = 15;

fn workload() -> WorkloadRef {
    WorkloadRef::deployment("default", "web")
}

fn member(index: usize, replicas: i32) -> MemberFacts {
    MemberFacts {
        session: Session::Connected {
            id: format!("s-{index}"),
            reported: true,
        },
        report: Some(WorkloadStatus {
            spec_replicas: replicas,
            ready_replicas: replicas,
            available_replicas: replicas,
            exists: true,
            ..WorkloadStatus::absent(workload())
        }),
        capacity: Some(ClusterCapacity {
            nodes: 3,
            ready_nodes: 3,
            allocatable_cpu_millis: 24_000,
            allocatable_memory_bytes: 64 << 30,
            requested_cpu_millis: 4_000,
            requested_memory_bytes: 8 << 30,
        }),
        tracked: Some((MemberPhase::Ready, UNIX_EPOCH)),
        ..MemberFacts::new(format!("member-{index:05}"), workload())
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("DSO_OUTCOME_MEMBERS")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("DSO_OUTCOME_MEMBERS: numbers"))
        .collect();
    let settings = DsoSettings {
        members: None,
        grace_period: Duration::from_secs(60),
        max_rebalance_percentage: 50,
        avoid_disruption: true,
        migrate_unschedulable_after: None,
        dynamic_weights: false,
        min_total: 1,
        max_total: u32::MAX,
        pause: Pause::No,
    };
    println!("| members | dso::outcome, median | fastest |");
    println!("|---|---|---|");
    for n in sizes {
        let members: Vec<MemberFacts> = (0..n).map(|i| member(i, 1)).collect();
        let previous = DistributedScaledObjectStatus {
            member_cluster_statuses: members
                .iter()
                .take(1_000)
                .map(|m| {
                    let status = DsoMemberClusterStatus {
                        current_replicas: 1,
                        desired_replicas: 1,
                        state: Some(MemberPhase::Ready.as_str().to_owned()),
                        ..Default::default()
                    };
                    (m.name.clone(), status)
                })
                .collect(),
            ..Default::default()
        };
        let total = i32::try_from(2 * n).unwrap_or(i32::MAX);
        let mut times: Vec<Duration> = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                let decided = outcome(&DsoInput {
                    generation: Some(1),
                    selector: "kedge.dev/distributedscaledobject=web",
                    settings: Ok(&settings),
                    not_allowed: &BTreeMap::new(),
                    total: Some(total),
                    keda_unavailable: None,
                    errors: &[],
                    previous: &previous,
                    members: &members,
                    elsewhere: &[],
                    now: SystemTime::now(),
                });
                let took = start.elapsed();
                assert_eq!(decided.commands.len(), n, "every member is told");
                took
            })
            .collect();
        times.sort();
        println!(
            "| {n} | {:.2} ms | {:.2} ms |",
            times[RUNS / 2].as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3
        );
    }
}
