//! The whole path at fleet scale, through kedge-sim: `KEDGE_E2E_MEMBERS` member clusters
//! (20 by default, so that the suite stays short; `make e2e-fleet` runs 1,000), each enrolled
//! with the real `kubectl kedge mc setup-member` and served by its own real `kedge-agent`
//! process, one real `kedge-hub`. One DistributedScaledObject spreads a Deployment over every
//! member; a fleet-wide total written with the real `kubectl scale` must reach every member's
//! Deployment (and its pods become ready), up and down, and every session must stay up.
//!
//! The test asserts only that each step happens (within generous bounds); it prints how long
//! each took, which is what `make e2e-fleet` reports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::dso::{deployment, kubectl};

/// The Deployment (and DSO) name.
const APP: &str = "app";

/// Members' Deployments: `(spec.replicas, status.readyReplicas)` of each.
async fn counts(apis: &[Api<Deployment>]) -> Vec<(i32, i32)> {
    let mut out = Vec::with_capacity(apis.len());
    for api in apis {
        let d = api.get(APP).await.unwrap();
        let spec = d.spec.and_then(|s| s.replicas).unwrap_or(0);
        let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        out.push((spec, ready));
    }
    out
}

/// Waits until every member's Deployment wants and has `each` ready replicas; returns when
/// every spec had it and when every pod was ready.
async fn wait_every(apis: &[Api<Deployment>], each: i32, limit: Duration) -> (Duration, Duration) {
    let start = Instant::now();
    let mut specs_done = None;
    loop {
        let now = counts(apis).await;
        if specs_done.is_none() && now.iter().all(|(spec, _)| *spec == each) {
            specs_done = Some(start.elapsed());
        }
        if now.iter().all(|c| *c == (each, each)) {
            return (
                specs_done.unwrap_or_else(|| start.elapsed()),
                start.elapsed(),
            );
        }
        let behind = now.iter().filter(|c| **c != (each, each)).count();
        assert!(
            start.elapsed() < limit,
            "{behind} of {} members' Deployments are not at {each} ready replicas after {limit:?}: {now:?}",
            apis.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_reaches_every_members_deployment() {
    let members: usize = std::env::var("KEDGE_E2E_MEMBERS")
        .ok()
        .map(|v| v.parse().expect("KEDGE_E2E_MEMBERS: a count"))
        .unwrap_or(20);
    // Bounds for the slowest machine at this count, not speed targets.
    let limit = Duration::from_secs(60) + Duration::from_millis(100) * members as u32;
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(members, dir.path().to_path_buf()).unwrap();
    config.bin_dir = support::bin("kedge-hub").parent().unwrap().to_path_buf();
    let started = Instant::now();
    let fleet = Fleet::up(config).await.expect("the fleet comes up");
    let up = started.elapsed();
    let names = fleet.members();
    assert_eq!(names.len(), members);
    let session_ids = |sessions: &[serde_json::Value]| {
        let mut ids: Vec<String> = sessions
            .iter()
            .filter(|s| s["state"] == "Connected")
            .map(|s| s["sessionId"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let first_sessions = session_ids(&fleet.sessions().await.unwrap());
    assert_eq!(first_sessions.len(), members);

    let mut apis = Vec::with_capacity(members);
    for member in &names {
        deployment(&fleet.sim, member, APP, 1).await;
        let client = fleet.sim.cluster(member).unwrap().client().unwrap();
        apis.push(Api::<Deployment>::namespaced(client, "default"));
    }
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let metric: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "queue", "namespace": "default"}, "data": {"value": "5"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(hub, "default")
        .create(&PostParams::default(), &metric)
        .await
        .unwrap();
    // No memberClusters: every registered member, weight 1 each. KEDA polls once an hour, so
    // the totals below are the test's.
    let dso = format!(
        r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata:
  name: {APP}
  namespace: default
spec:
  scaledObjectSpec:
    scaleTargetRef:
      kind: Deployment
      name: {APP}
    minReplicaCount: 1
    maxReplicaCount: 100000
    pollingInterval: 3600
    triggers:
    - type: kubernetes-resource
      metadata:
        resourceKind: ConfigMap
        resourceName: queue
        key: value
        targetValue: "5"
"#
    );
    let path = dir.path().join("dso.yaml");
    std::fs::write(&path, dso).unwrap();
    let hub_kc = fleet.kubeconfig(HUB_CLUSTER);
    kubectl(&hub_kc, &["apply", "-f", path.to_str().unwrap()]).await;

    let mut steps = Vec::new();
    for each in [3, 2] {
        let total = (each as usize * members).to_string();
        let written = Instant::now();
        kubectl(
            &hub_kc,
            &["scale", "dso", APP, "-n", "default", "--replicas", &total],
        )
        .await;
        let wrote = written.elapsed();
        let (specs, ready) = wait_every(&apis, each, limit).await;
        steps.push((each, wrote, specs, ready));
    }
    // Every agent kept its first session throughout.
    let sessions = fleet.sessions().await.unwrap();
    assert_eq!(
        session_ids(&sessions),
        first_sessions,
        "sessions: {sessions:#?}"
    );
    // The DSO's status adds up what every member reported.
    let want = (2 * members).to_string();
    let start = Instant::now();
    loop {
        let current = kubectl(
            &hub_kc,
            &[
                "get",
                "dso",
                APP,
                "-n",
                "default",
                "-o",
                "jsonpath={.status.totalCurrentReplicas}",
            ],
        )
        .await;
        if current == want {
            break;
        }
        assert!(
            start.elapsed() < limit,
            "the DSO's totalCurrentReplicas is {current:?}, not {want}, after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status_took = start.elapsed();
    eprintln!("{members} members: fleet up (setup-member and agent each) in {up:.1?}");
    for (each, wrote, specs, ready) in &steps {
        eprintln!(
            "{members} members: `kubectl scale` (its own run {wrote:.1?}) returned → every member's Deployment at {each}: spec in {specs:.1?}, pods ready in {ready:.1?}"
        );
    }
    eprintln!(
        "{members} members: the DSO's totalCurrentReplicas at {want} {status_took:.1?} after that"
    );
    fleet.shutdown().await;
}
