//! How long from a `/scale` change of a DistributedScaledObject on the hub to the replicas
//! being set in every member cluster, end to end: the real kedge-hub and kedge-agents over
//! QUIC on loopback, simulated clusters.
//!
//! `cargo bench -p kedge-e2e --bench scale_latency` (build the binaries first:
//! `cargo build --release --workspace --bins`; the bench uses the binaries of its own
//! profile). `SCALE_BENCH_ROUNDS` (default 30) sets the number of changes measured.
//! Prints a Markdown table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kedge_core::crd::DistributedScaledObject;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

async fn members_total(apis: &[Api<Deployment>]) -> i32 {
    let mut total = 0;
    for api in apis {
        if let Ok(d) = api.get("nginx").await {
            total += d.spec.and_then(|s| s.replicas).unwrap_or(0);
        }
    }
    total
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rounds: usize = std::env::var("SCALE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(3, dir.path().to_owned()).unwrap();
    // Benches run from target/<profile>/deps; the binaries are one level up.
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    let fleet = Fleet::up(config).await.expect("fleet up");
    kedge_sim::demo::install_example(&fleet)
        .await
        .expect("example installed");
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub, "default");
    // Keep KEDA from polling during the bench, so that only the bench sets the total.
    let quiet = json!({"spec": {"scaledObjectSpec": {"pollingInterval": 3600}}});
    dsos.patch("nginx", &PatchParams::default(), &Patch::Merge(&quiet))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let members: Vec<Api<Deployment>> = fleet
        .members()
        .iter()
        .map(|m| Api::namespaced(fleet.sim.cluster(m).unwrap().client().unwrap(), "default"))
        .collect();

    let mut samples = Vec::with_capacity(rounds);
    let mut timeouts = 0;
    for round in 0..rounds {
        let target = 4 + (round as i32 % 2) * 6; // 4, 10, 4, 10, ...
        let patch = json!({"spec": {"replicas": target}});
        let start = Instant::now();
        dsos.patch_scale("nginx", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let deadline = start + Duration::from_secs(30);
        loop {
            if members_total(&members).await == target {
                samples.push(start.elapsed());
                break;
            }
            if Instant::now() > deadline {
                timeouts += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
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
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!("| /scale change → replicas set in all 3 members | value |");
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
    assert_eq!(timeouts, 0, "some /scale changes never reached the members");
}
