//! How long from a queue-length change to the Jobs it asks for running in the member
//! clusters, end to end: a `kubernetes-resource` trigger on a ConfigMap read by kedge-sim's
//! KEDA emulation, the real kedge-hub (DSJ controller) reading it from the external metrics
//! API, the real kedge-agents creating the Jobs over QUIC on loopback, kedge-sim's scheduler
//! and Job controller starting their pods. `pollingInterval: 1`, so up to a second of each
//! sample is the wait for the next poll (KEDA's and the hub's), as in a real cluster.
//!
//! `cargo bench -p kedge-e2e --bench dsj_latency` (build the binaries first:
//! `cargo build --release --workspace --bins`). `DSJ_BENCH_ROUNDS` (default 10) sets the
//! number of queue changes measured. Prints a Markdown table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kedge_sim::SimConfig;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const DSJ: &str = r#"
apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledJob
metadata: {name: bench, namespace: default}
spec:
  memberClusters: [{name: member-1}, {name: member-2}, {name: member-3}]
  scaledJobSpec:
    pollingInterval: 1
    maxReplicaCount: 1000
    jobTargetRef:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: worker, image: busybox}]
    triggers:
    - type: kubernetes-resource
      name: queue
      metadata: {resourceKind: ConfigMap, resourceName: queue, key: length, targetValue: "1"}
"#;

/// Jobs of the bench DSJ with a pod running (`status.active`), over every member.
async fn running(members: &[Api<Job>]) -> usize {
    let mut n = 0;
    for api in members {
        if let Ok(list) = api
            .list(&ListParams::default().labels("kedge.dev/distributedscaledjob=bench"))
            .await
        {
            n += list
                .items
                .iter()
                .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0)
                .count();
        }
    }
    n
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rounds: usize = std::env::var("DSJ_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(3, dir.path().to_owned()).unwrap();
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    // Pods start 100 ms after binding; Jobs run far longer than the bench.
    config.sim = SimConfig {
        pod_start_delay: Duration::from_millis(100),
        job_duration: Duration::from_secs(3600),
        ..config.sim
    };
    let fleet = Fleet::up(config).await.expect("fleet up");
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(hub.clone(), "default");
    let set = |length: usize| {
        let config_maps = config_maps.clone();
        async move {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "queue", "namespace": "default"},
                "data": {"length": length.to_string()}});
            config_maps
                .patch(
                    "queue",
                    &PatchParams::apply("bench").force(),
                    &Patch::Apply(&cm),
                )
                .await
                .unwrap();
        }
    };
    set(0).await;
    let dsj: kedge_core::crd::DistributedScaledJob = serde_yaml::from_str(DSJ).unwrap();
    Api::<kedge_core::crd::DistributedScaledJob>::namespaced(hub, "default")
        .create(&PostParams::default(), &dsj)
        .await
        .unwrap();
    let members: Vec<Api<Job>> = fleet
        .members()
        .iter()
        .map(|m| Api::namespaced(fleet.sim.cluster(m).unwrap().client().unwrap(), "default"))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut samples = Vec::with_capacity(rounds);
    let mut timeouts = 0;
    for round in 1..=rounds {
        // Each round adds 3 to the queue: 3 more Jobs must run.
        let want = round * 3;
        let start = Instant::now();
        set(want).await;
        let deadline = start + Duration::from_secs(30);
        loop {
            if running(&members).await >= want {
                samples.push(start.elapsed());
                break;
            }
            if Instant::now() > deadline {
                timeouts += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    fleet.shutdown().await;

    samples.sort();
    let pct = |p: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("| queue +3 → 3 more Jobs running in the members (pollingInterval 1s) | value |");
    println!("|---|---|");
    println!(
        "| rounds measured (timeouts) | {} ({timeouts}) |",
        samples.len()
    );
    println!("| p50 | {} |", ms(pct(0.5)));
    println!("| p95 | {} |", ms(pct(0.95)));
    println!("| max | {} |", ms(pct(1.0)));
    println!(
        "| machine | {} cores, {} |",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::env::consts::ARCH
    );
    assert_eq!(timeouts, 0, "some queue changes never became running Jobs");
}
