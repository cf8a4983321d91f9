//! What kedge-sim's record of a write in `managedFields` costs on a large object: a
//! DistributedScaledObject whose status lists N members, written by the hub's status writes.
//! Measures a `/scale` write (one number in `spec`) and a status write that changes one
//! member, median of several, at each N.
//!
//! `cargo bench -p kedge-sim --bench managed_fields` (`MANAGED_FIELDS_MEMBERS=1000,10000`).
//! Prints a Markdown table.

use std::time::{Duration, Instant};

use kedge_sim::patch::apply::record_update;
use serde_json::{Value, json};

const T0: &str = "2026-11-28T00:00:00Z";
const T1: &str = "2026-11-28T00:01:00Z";

/// The DSO as the hub's status writes leave it, `members` members in its status.
fn dso(members: usize) -> Value {
    let statuses: serde_json::Map<String, Value> = (0..members)
        .map(|i| {
            (
                format!("member-{i:05}"),
                json!({
                    "currentReplicas": 3, "desiredReplicas": 3, "id": format!("member-{i:05}"),
                    "state": "Ready", "description": "3 of 3 replicas ready",
                    "lastStatusChangeTime": T0, "excluded": false,
                }),
            )
        })
        .collect();
    let spec = json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
        "metadata": {"name": "web", "namespace": "team"},
        "spec": {"replicas": 3 * members, "scaleTargetRef": {"name": "web"}},
    });
    let created = record_update(&Value::Null, &spec, "kubectl", "Update", None, T0);
    let mut with_status = created.clone();
    with_status["status"] = json!({
        "memberClusterStatuses": statuses, "membersHealthyCount": members,
        "membersTotalCount": members, "totalCurrentReplicas": 3 * members,
    });
    record_update(
        &created,
        &with_status,
        "kedge-hub",
        "Update",
        Some("status"),
        T0,
    )
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(rounds: usize, mut write: impl FnMut(usize) -> Value) -> Duration {
    let samples = (0..rounds)
        .map(|i| {
            let started = Instant::now();
            std::hint::black_box(write(i));
            started.elapsed()
        })
        .collect();
    median(samples)
}

fn main() {
    let sizes: Vec<usize> = std::env::var("MANAGED_FIELDS_MEMBERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 1_000, 10_000]);
    println!(
        "| members in the status | object (JSON) | `/scale` write: record_update, median of 20 | status write changing one member, median of 10 |"
    );
    println!("|---|---|---|---|");
    for members in sizes {
        let live = dso(members);
        let bytes = serde_json::to_vec(&live).map_or(0, |v| v.len());
        let scale = time(20, |i| {
            let mut scaled = live.clone();
            scaled["spec"]["replicas"] = json!(3 * members + 1 + i);
            record_update(&live, &scaled, "kubectl", "Update", Some("scale"), T1)
        });
        let status = time(10, |i| {
            let mut changed = live.clone();
            changed["status"]["memberClusterStatuses"]["member-00000"]["currentReplicas"] =
                json!(4 + i);
            record_update(&live, &changed, "kedge-hub", "Update", Some("status"), T1)
        });
        println!(
            "| {members} | {:.0} KB | {:.2} ms | {:.2} ms |",
            bytes as f64 / 1000.0,
            scale.as_secs_f64() * 1e3,
            status.as_secs_f64() * 1e3,
        );
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_default();
    println!(
        "\nMachine: {cpu}, {} cores; the clones of the object each write makes are included.",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
}
