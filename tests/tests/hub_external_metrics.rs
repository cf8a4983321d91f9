//! The hub reads DSJ trigger values from the external metrics API the way the HPA does,
//! against kedge-sim's emulation of KEDA's metrics server over real HTTP: a value that
//! changes, a target from the scaler's own metadata key, and every way a trigger cannot be
//! read reported as such, never as a zero.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kedge_core::crd::keda::ScaleTriggers;
use kedge_core::dsj::metrics::{Reading, TriggerState};
use kedge_hub::controller::external_metrics::{Source, read};
use kedge_sim::{Sim, SimConfig};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

const CRD: &str = include_str!("../../sim/assets/scaledobject-crd.yaml");

fn triggers() -> Vec<ScaleTriggers> {
    serde_json::from_value(json!([
        {"type": "kubernetes-resource", "name": "queue",
         "metadata": {"resourceKind": "ConfigMap", "resourceName": "queue", "key": "length", "targetValue": "5"}},
        {"type": "kafka", "name": "lag", "metadata": {"topic": "t"}},
        {"type": "kubernetes-resource", "name": "missing",
         "metadata": {"resourceKind": "ConfigMap", "resourceName": "absent", "key": "length", "targetValue": "1"}},
    ]))
    .unwrap()
}

async fn metric_names(api: &Api<DynamicObject>) -> Vec<String> {
    let start = Instant::now();
    loop {
        let so = api.get("jobs").await.unwrap();
        if let Some(names) = so.data["status"]["externalMetricNames"].as_array() {
            return names
                .iter()
                .map(|n| n.as_str().unwrap().to_owned())
                .collect();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "KEDA published no metric names"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn set_length(value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "queue", "namespace": "default"},
        "data": {"length": value},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_values_come_from_the_external_metrics_api() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = Sim::start(&["hub".to_owned()], SimConfig::default(), None)
        .await
        .unwrap();
    let client: Client = sim.cluster("hub").unwrap().client().unwrap();
    let crd: CustomResourceDefinition = serde_yaml::from_str(CRD).unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    config_maps
        .create(&PostParams::default(), &set_length("12"))
        .await
        .unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    let sos: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let so: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "jobs", "namespace": "default"},
        "spec": {"scaleTargetRef": {"name": "nothing"}, "pollingInterval": 1, "triggers": triggers()},
    }))
    .unwrap();
    sos.create(&PostParams::default(), &so).await.unwrap();
    let names = metric_names(&sos).await;
    let keys: Vec<String> = ["queue", "lag", "missing"].map(String::from).to_vec();
    let source = Source {
        namespace: "default",
        scaled_object: "jobs",
        metric_names: &names,
    };

    let readings = read(&client, &source, &triggers(), &keys).await;
    match &readings["queue"] {
        Reading::Read(m) => assert_eq!((m.value, m.target), (12.0, 5.0)),
        other => panic!("queue: {other:?}"),
    }
    assert_eq!(readings["queue"].state(), TriggerState::Active);
    let lag = readings["lag"].info();
    assert!(lag.contains("a kafka trigger sets lagThreshold"), "{lag}");
    let missing = readings["missing"].info();
    assert!(
        missing.contains("reading metric s2-kubernetes-resource-absent"),
        "{missing}"
    );
    assert_eq!(readings["missing"].state(), TriggerState::Error);

    // The value follows the queue; an empty queue is Inactive, not an error.
    config_maps
        .patch(
            "queue",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"length": "0"}})),
        )
        .await
        .unwrap();
    let readings = read(&client, &source, &triggers(), &keys).await;
    assert_eq!(readings["queue"].state(), TriggerState::Inactive);

    // A trigger KEDA has not published a name for yet, and a ScaledObject that is gone.
    let short = Source {
        metric_names: &names[..1],
        ..source
    };
    let readings = read(&client, &short, &triggers(), &keys).await;
    assert!(
        readings["missing"]
            .info()
            .contains("has not published a metric")
    );
    let gone = Source {
        scaled_object: "deleted",
        ..source
    };
    let readings = read(&client, &gone, &triggers(), &keys).await;
    assert_eq!(
        readings["queue"].state(),
        TriggerState::Error,
        "{:?}",
        readings["queue"]
    );
}
