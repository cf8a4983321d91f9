//! Simulated time: `Sim::advance` and `Sim::set_speed` drive the controllers.

mod sim_support;

use std::time::Duration;

use kedge_sim::{Sim, SimConfig};
use serde_json::json;
use sim_support::eventually;

fn job_phase(sim: &Sim) -> Option<String> {
    let job = sim.clusters()[0].object("batch/v1", "Job", "default", "long")?;
    let conds = job["status"]["conditions"].as_array()?.clone();
    conds
        .iter()
        .find(|c| c["status"] == "True" && (c["type"] == "Complete" || c["type"] == "Failed"))
        .and_then(|c| c["type"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_completes_long_jobs_and_polls_keda() {
    let config = SimConfig {
        pod_start_delay: Duration::from_secs(30),
        ..SimConfig::default()
    };
    let sim = Sim::start(&["t".to_string()], config, None)
        .await
        .expect("start");
    let c = &sim.clusters()[0];
    c.put_object(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "long", "namespace": "default", "annotations": {"sim.kedge.dev/run-seconds": "3600"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}))
        .expect("job");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(job_phase(&sim), None, "nothing finishes in real time");
    let active = c
        .object("batch/v1", "Job", "default", "long")
        .map(|j| j["status"]["active"].clone());
    assert_eq!(active, Some(json!(1)));

    // 30 s start-up delay, then one hour of running.
    sim.advance(Duration::from_secs(31));
    eventually(5, || async {
        let job = c.object("batch/v1", "Job", "default", "long")?;
        (job["status"]["ready"] == 1).then_some(())
    })
    .await;
    sim.advance(Duration::from_secs(3600));
    let phase = eventually(5, || async { job_phase(&sim) }).await;
    assert_eq!(phase, "Complete");

    // KEDA polls every pollingInterval of simulated time.
    c.put_object(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "scaledobjects.keda.sh"},
        "spec": {"group": "keda.sh", "scope": "Namespaced",
            "names": {"plural": "scaledobjects", "singular": "scaledobject", "kind": "ScaledObject", "shortNames": ["so"]},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
        .expect("crd");
    c.put_object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "namespace": "default"}, "data": {"v": "10"}}))
        .expect("cm");
    c.put_object(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .expect("deploy");
    c.put_object(json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "so", "namespace": "default"},
        "spec": {"scaleTargetRef": {"name": "d"}, "pollingInterval": 60, "maxReplicaCount": 50,
            "triggers": [{"type": "kubernetes-resource", "metadata": {"resourceKind": "ConfigMap", "resourceName": "m", "key": "v", "targetValue": "2"}}]}}))
        .expect("so");
    let replicas = || {
        c.object("apps/v1", "Deployment", "default", "d")
            .and_then(|d| d["spec"]["replicas"].as_i64())
    };
    eventually(5, || async { (replicas() == Some(5)).then_some(()) }).await;
    c.put_object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "namespace": "default"}, "data": {"v": "20"}}))
        .expect("cm");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(replicas(), Some(5), "no poll before the interval");
    sim.advance(Duration::from_secs(61));
    eventually(5, || async { (replicas() == Some(10)).then_some(()) }).await;

    // Speeding up time: the next poll happens within real milliseconds.
    c.put_object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "namespace": "default"}, "data": {"v": "40"}}))
        .expect("cm");
    sim.set_speed(600.0);
    eventually(5, || async { (replicas() == Some(20)).then_some(()) }).await;
    sim.shutdown().await;
}
