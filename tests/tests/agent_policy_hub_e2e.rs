//! The hub surfaces the agent's refusals, with the real binaries on kedge-sim: a DSO
//! targeting a kind outside the agent's `--kinds` shows its member `Refused` with the agent's
//! reason (and the workload is never touched), and a DSJ whose Job name collides with a Job
//! kedge did not create gets a `JobCreateFailed` Event naming the refusal while that Job is
//! left exactly as it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_core::crd::conditions::LABEL_DSJ;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::dso::*;
use support::*;

const MEMBER: &str = "member-1";

const DSJ: &str = r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledJob
metadata: {name: work, namespace: default}
spec:
  memberClusters:
  - {name: member-1}
  scaledJobSpec:
    pollingInterval: 1
    maxReplicaCount: 5
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_surfaces_what_the_agent_refuses() {
    let (_dir, fleet) = start(&[MEMBER]).await;
    let member = fleet.sim.cluster(MEMBER).unwrap().client().unwrap();
    let db: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "postgres"}]}}},
    }))
    .unwrap();
    let statefulsets: Api<StatefulSet> = Api::namespaced(member.clone(), "default");
    statefulsets
        .create(&PostParams::default(), &db)
        .await
        .unwrap();

    let _hub = fleet.start_hub_with("hub.log", &["--dsj-enabled", "true"]);
    let _agent = fleet.start_agent_flags(
        MEMBER,
        Some("default"),
        &["--kinds", "apps/v1/Deployment"],
        "member-1.log",
    );
    wait_for_states(fleet.ports, &[MEMBER], "Connected", LIMIT).await;

    // A DSO for a StatefulSet, which this agent does not scale.
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "db", "0", 25.0);
    let dso = dso_yaml("db", "  memberClusters:\n  - {name: member-1}", "db-metric").replace(
        "      kind: Deployment\n",
        "      apiVersion: apps/v1\n      kind: StatefulSet\n",
    );
    assert!(dso.contains("kind: StatefulSet"), "{dso}");
    apply(&fleet, &dso, "db.yaml").await;
    let status = wait_for(LIMIT, "member-1 Refused", || async {
        let m = fleet.dso("db")["status"]["memberClusterStatuses"][MEMBER].clone();
        (m["state"] == "Refused").then_some(m)
    })
    .await;
    let description = status["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("KindNotAllowed")
            && description.contains("kind apps/v1/StatefulSet is not managed by this agent")
            && description.contains("--kinds"),
        "{status}"
    );
    assert_eq!(
        statefulsets.get("db").await.unwrap().spec.unwrap().replicas,
        Some(1),
        "never touched"
    );

    // A DSJ whose first Job name is already taken by a Job kedge did not create.
    let client = hub.client().unwrap();
    let queue = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "queue", "namespace": "default"}, "data": {"length": "0"}});
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
    let set_queue = |length: &str| {
        let mut cm = queue.clone();
        cm["data"]["length"] = json!(length);
        cm
    };
    configmaps
        .patch(
            "queue",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&set_queue("0")),
        )
        .await
        .unwrap();
    apply(&fleet, DSJ, "work.yaml").await;
    let uid = wait_for(LIMIT, "the DSJ's uid", || async {
        hub.object(
            "kedge.dev/v1alpha1",
            "DistributedScaledJob",
            "default",
            "work",
        )
        .and_then(|d| d["metadata"]["uid"].as_str().map(str::to_owned))
    })
    .await;
    let taken = kedge_core::dsj::render::job_name("work", &uid, 0);
    let foreign: Job = serde_json::from_value(json!({
        "metadata": {"name": taken, "namespace": "default", "labels": {"team": "data"},
            "annotations": {"sim.kedge.dev/run-seconds": "3600"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .unwrap();
    let jobs: Api<Job> = Api::namespaced(member.clone(), "default");
    jobs.create(&PostParams::default(), &foreign).await.unwrap();
    configmaps
        .patch(
            "queue",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&set_queue("1")),
        )
        .await
        .unwrap();
    fleet
        .wait_event(
            "work",
            "JobCreateFailed",
            &format!("has no {LABEL_DSJ} label: kedge did not create it"),
        )
        .await;
    let after = jobs.get(&taken).await.unwrap();
    let labels = after.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("data"));
    assert!(!labels.contains_key(LABEL_DSJ), "adopted: {labels:?}");
    assert!(after.metadata.deletion_timestamp.is_none());
}
