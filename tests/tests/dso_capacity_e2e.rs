//! `placement.dynamicWeights` end to end: agents report how many more replicas of the
//! workload fit in their cluster, and the hub splits the total in proportion to it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kedge_core::crd::DistributedScaledObject;
use kedge_sim::SimConfig;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

fn deployment(name: &str, replicas: i32, cpu: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_weights_follow_reported_room() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(2, dir.path().to_owned()).unwrap();
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    config.heartbeat = "300ms".into();
    // One node of 2 CPUs per member; capacity is re-read often so the test is quick.
    config.sim = SimConfig {
        nodes: 1,
        node_cpu: "2".into(),
        node_memory: "16Gi".into(),
        pod_start_delay: Duration::from_millis(100),
        ..SimConfig::default()
    };
    config.agent_args = ["--report-interval", "200ms", "--capacity-interval", "300ms"]
        .map(String::from)
        .to_vec();
    let fleet = Fleet::up(config).await.expect("fleet up");
    let client = |name: &str| fleet.sim.cluster(name).unwrap().client().unwrap();

    // member-2 is mostly taken by other work: 1500m of its 2000m.
    let m2: Api<Deployment> = Api::namespaced(client("member-2"), "default");
    m2.create(&PostParams::default(), &deployment("ballast", 1, "1500m"))
        .await
        .unwrap();
    for member in ["member-1", "member-2"] {
        let api: Api<Deployment> = Api::namespaced(client(member), "default");
        api.create(&PostParams::default(), &deployment("web", 0, "100m"))
            .await
            .unwrap();
    }

    let dso: DistributedScaledObject = serde_json::from_value(json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "memberClusters": [{"name": "member-1"}, {"name": "member-2"}],
            "placement": {"dynamicWeights": true},
            "scaledObjectSpec": {
                "scaleTargetRef": {"name": "web"},
                "minReplicaCount": 1, "maxReplicaCount": 30,
                // KEDA cannot read this trigger, so only this test sets the total.
                "triggers": [{"type": "kubernetes-resource", "metadata": {
                    "resourceKind": "ConfigMap", "resourceName": "absent",
                    "key": "v", "targetValue": "5"}}]
            }
        }
    }))
    .unwrap();
    let dsos: Api<DistributedScaledObject> = Api::namespaced(client(HUB_CLUSTER), "default");
    dsos.create(&PostParams::default(), &dso).await.unwrap();
    dsos.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 10}})),
    )
    .await
    .unwrap();

    // Room for 100m pods: member-1 20 (2000m free), member-2 5 (500m free) → 10 splits 8:2.
    let replicas = |api: Api<Deployment>| async move {
        api.get("web")
            .await
            .ok()
            .and_then(|d| d.spec)
            .and_then(|s| s.replicas)
    };
    let start = Instant::now();
    let split = loop {
        let split = (
            replicas(Api::namespaced(client("member-1"), "default")).await,
            replicas(Api::namespaced(client("member-2"), "default")).await,
        );
        if split == (Some(8), Some(2)) || start.elapsed() > Duration::from_secs(30) {
            break split;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let status = dsos.get("web").await.unwrap().status;
    fleet.shutdown().await;
    assert_eq!(
        split,
        (Some(8), Some(2)),
        "split by reported room; status: {status:#?}"
    );
}
