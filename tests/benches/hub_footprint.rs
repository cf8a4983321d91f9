//! What the hub needs to run: resident memory and CPU of the real release `kedge-hub` (CA in
//! a Secret, both controllers, the production heartbeat of 5 s) with real `kedge-agent`s
//! enrolled by `kubectl kedge mc setup-member` on loopback (`kedge-sim up`'s fleet), for each
//! member count of `HUB_BENCH_MEMBERS` (default `0,100`):
//!
//! 1. the fleet comes up; after a settle window, the hub's RSS and CPU with every agent
//!    connected and nothing to scale;
//! 2. `HUB_BENCH_DSOS` (default 10) DistributedScaledObjects, each over every member, with
//!    their Deployment in every member; `HUB_BENCH_ROUNDS` (default 10) rounds in which every
//!    DSO's `/scale` changes at once (N, then 2N replicas) and the bench waits until every
//!    member has its share: the hub's average CPU over the rounds and its peak memory;
//! 3. after a settle window, RSS and CPU at rest with the DSOs.
//!
//! These figures size the chart's `resources` (deploy/charts/kedge-hub/values.yaml) and
//! docs/performance.md "Sizing the hub". `cargo bench -p kedge-e2e --bench hub_footprint`
//! (build the binaries first: `cargo build --release --workspace --bins`), or
//! `make footprint`.
//! `HUB_BENCH_WINDOW_SECONDS` (default 10) sets each settle and CPU window. Prints a
//! Markdown table. Linux only (`/proc`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{env_or, machine, memory, millicores};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_core::crd::DistributedScaledObject;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "default";
/// Longest a scaling round may take before the bench fails.
const ROUND_LIMIT: Duration = Duration::from_secs(120);

/// What one member count measured.
struct Row {
    members: usize,
    dsos: usize,
    up: Duration,
    /// Every agent connected, nothing to scale.
    connected: (common::Memory, u64),
    /// During the scaling rounds: average millicores, and the slowest round.
    storm: Option<(u64, Duration)>,
    /// At rest with the DSOs, after the rounds.
    rest: Option<(common::Memory, u64)>,
}

fn dso(name: &str, members: &[String]) -> DistributedScaledObject {
    let member_clusters: Vec<_> = members
        .iter()
        .map(|m| json!({"name": m, "weight": 1}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "kedge.dev/v1alpha1",
        "kind": "DistributedScaledObject",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "memberClusters": member_clusters,
            "scaledObjectSpec": {
                "scaleTargetRef": {"kind": "Deployment", "name": name},
                // KEDA polls once; the bench sets every later total through /scale.
                "pollingInterval": 3600,
                "minReplicaCount": 1,
                "maxReplicaCount": 100000,
                "triggers": [{"type": "kubernetes-resource", "metadata": {
                    "resourceKind": "ConfigMap", "resourceName": "bench-metric",
                    "key": "value", "targetValue": "5"}}]
            }
        }
    }))
    .unwrap()
}

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}
    }))
    .unwrap()
}

/// Replicas of every DSO's Deployment summed over the members.
async fn totals(members: &[Api<Deployment>]) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for api in members {
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for d in list.items {
            let name = d.metadata.name.unwrap_or_default();
            *out.entry(name).or_insert(0) += d.spec.and_then(|s| s.replicas).unwrap_or(0);
        }
    }
    out
}

async fn measure(members: usize, dsos: usize, rounds: usize, window: Duration) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(members, dir.path().to_owned()).unwrap();
    // Benches run from target/<profile>/deps; the binaries are one level up.
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    // The chart's default heartbeat, not the demo's 1 s.
    config.heartbeat = "5s".into();
    let started = Instant::now();
    let fleet = Fleet::up(config).await.expect("fleet up");
    let up = started.elapsed();
    let pid = fleet.hub_pid().expect("the hub runs");
    tokio::time::sleep(window).await;
    let connected = (memory(pid), millicores(pid, window).await);
    let mut row = Row {
        members,
        dsos,
        up,
        connected,
        storm: None,
        rest: None,
    };
    if members == 0 || dsos == 0 {
        fleet.shutdown().await;
        return row;
    }

    let names: Vec<String> = (0..dsos).map(|i| format!("app-{i}")).collect();
    let member_apis: Vec<Api<Deployment>> = fleet
        .members()
        .iter()
        .map(|m| Api::namespaced(fleet.sim.cluster(m).unwrap().client().unwrap(), NS))
        .collect();
    for api in &member_apis {
        for name in &names {
            api.create(&PostParams::default(), &deployment(name))
                .await
                .unwrap();
        }
    }
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let metric: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "bench-metric", "namespace": NS}, "data": {"value": "5"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(hub.clone(), NS)
        .create(&PostParams::default(), &metric)
        .await
        .unwrap();
    let dso_api: Api<DistributedScaledObject> = Api::namespaced(hub, NS);
    for name in &names {
        dso_api
            .create(&PostParams::default(), &dso(name, &fleet.members()))
            .await
            .unwrap();
    }

    // KEDA's one poll sets each total to 1 (metric 5, target 5); the rounds start after it,
    // so that it does not overwrite the first round's totals.
    let start = Instant::now();
    loop {
        let now = totals(&member_apis).await;
        if names.iter().all(|n| now.get(n) == Some(&1)) {
            break;
        }
        assert!(
            start.elapsed() < ROUND_LIMIT,
            "KEDA's first totals did not reach the members after {ROUND_LIMIT:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let cpu_before = common::cpu_time(pid);
    let storm_started = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        // N, 2N, N, …: every member gets 1 or 2 replicas of every DSO.
        let target = (members * (1 + round % 2)) as i32;
        let start = Instant::now();
        for name in &names {
            dso_api
                .patch_scale(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"replicas": target}})),
                )
                .await
                .unwrap();
        }
        loop {
            let now = totals(&member_apis).await;
            if names.iter().all(|n| now.get(n) == Some(&target)) {
                break;
            }
            assert!(
                start.elapsed() < ROUND_LIMIT,
                "round {round}: not every member had its share of {target} after {ROUND_LIMIT:?}: {now:?}"
            );
            // Each look lists every member's Deployments: not too often, the simulated
            // clusters run in this process.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        slowest = slowest.max(start.elapsed());
    }
    let storm_cpu = common::cpu_time(pid).saturating_sub(cpu_before);
    let storm_millicores =
        (storm_cpu.as_secs_f64() / storm_started.elapsed().as_secs_f64() * 1000.0).round() as u64;
    row.storm = Some((storm_millicores, slowest));
    tokio::time::sleep(window).await;
    row.rest = Some((memory(pid), millicores(pid, window).await));
    fleet.shutdown().await;
    row
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let counts = common::counts("HUB_BENCH_MEMBERS", "0,100");
    let dsos: usize = env_or("HUB_BENCH_DSOS", 10);
    let rounds: usize = env_or("HUB_BENCH_ROUNDS", 10);
    let window = Duration::from_secs(env_or("HUB_BENCH_WINDOW_SECONDS", 10));
    let mut rows = Vec::new();
    for &members in &counts {
        rows.push(measure(members, dsos, rounds, window).await);
    }

    let kib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
    println!(
        "| members | DSOs | fleet up | hub RSS connected, idle | CPU idle | CPU while every DSO rescales (slowest round) | RSS at rest with the DSOs | CPU at rest | peak RSS (VmHWM) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let (storm, rest, rest_cpu, peak) = match (r.storm, r.rest) {
            (Some((cpu, slowest)), Some((m, rest_cpu))) => (
                format!("{cpu}m ({:.0} ms)", slowest.as_secs_f64() * 1000.0),
                kib(m.rss),
                format!("{rest_cpu}m"),
                kib(m.peak),
            ),
            _ => ("-".into(), "-".into(), "-".into(), kib(r.connected.0.peak)),
        };
        println!(
            "| {} | {} | {:.0} s | {} | {}m | {storm} | {rest} | {rest_cpu} | {peak} |",
            r.members,
            if r.storm.is_some() { r.dsos } else { 0 },
            r.up.as_secs_f64(),
            kib(r.connected.0.rss),
            r.connected.1,
        );
    }
    if let (Some(base), Some(top)) = (rows.iter().find(|r| r.members == 0), rows.last())
        && top.members > 0
    {
        let grown = top
            .rest
            .map_or(top.connected.0.rss, |(m, _)| m.rss)
            .saturating_sub(base.connected.0.rss);
        println!();
        println!(
            "Per member ({} members, {} DSOs over every member): {:.1} KiB of hub RSS.",
            top.members,
            top.dsos,
            grown as f64 / top.members as f64
        );
    }
    println!();
    println!(
        "Machine: {}; {dsos} DSOs, {rounds} rounds, {} s windows; heartbeat 5 s.",
        machine(),
        window.as_secs()
    );
}
