//! kube-rs clients, reflectors and controllers against kedge-sim.

mod sim_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kedge_sim::{Faults, Sim};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use serde_json::json;
use sim_support::{eventually, fast};

async fn sim(name: &str) -> Sim {
    Sim::start(&[name.to_string()], fast(), None)
        .await
        .expect("start sim")
}

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.kedge.dev", "v1alpha1", "Widget"),
        "widgets",
    )
}

async fn install_crd(client: &kube::Client, path: &str) {
    let text = std::fs::read_to_string(path).expect("crd file");
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml::from_str(&text).expect("crd yaml");
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.create(&PostParams::default(), &crd)
        .await
        .expect("create crd");
    let cond = kube::runtime::conditions::is_crd_established();
    tokio::time::timeout(
        Duration::from_secs(10),
        kube::runtime::wait::await_condition(api, &name, cond),
    )
    .await
    .expect("crd established in time")
    .expect("await crd");
}

/// Delete preconditions, as used to spend a bootstrap token exactly once: a wrong uid or
/// resourceVersion is a 409 and leaves the object; a second delete is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_preconditions_on_uid_and_resource_version() {
    use kube::api::{DeleteParams, Preconditions};
    let sim = sim("pre").await;
    let client = sim.clusters()[0].client().expect("client");
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "token"}})).unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let with = |uid: Option<&str>, rv: Option<&str>| DeleteParams {
        preconditions: Some(Preconditions {
            uid: uid.map(str::to_owned),
            resource_version: rv.map(str::to_owned),
        }),
        ..DeleteParams::default()
    };
    let code = |e: kube::Error| match e {
        kube::Error::Api(status) => status.code,
        other => panic!("{other}"),
    };
    let uid = created.metadata.uid.clone().unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let err = api
        .delete("token", &with(Some("other"), None))
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
    let err = api
        .delete("token", &with(Some(&uid), Some("1")))
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
    assert!(api.get_opt("token").await.unwrap().is_some());
    api.delete("token", &with(Some(&uid), Some(&rv)))
        .await
        .unwrap();
    let err = api
        .delete("token", &with(Some(&uid), Some(&rv)))
        .await
        .unwrap_err();
    assert_eq!(code(err), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_follows_configmaps() {
    let sim = sim("r1").await;
    let client = sim.clusters()[0].client().expect("client");
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for i in 0..3 {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}"), "labels": {"set": "a"}}, "data": {"i": i.to_string()}})).expect("cm");
        api.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    for streaming in [false, true] {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let mut cfg = watcher::Config::default().labels("set=a").page_size(2);
        if streaming {
            cfg = cfg.streaming_lists();
        }
        // With backoff, as every controller runs it: without, a watch error (the simulator
        // going away) is retried at once, and against a closed loopback port that fails at
        // once too, so the task spins without yielding and neither `abort` nor the runtime's
        // shutdown can stop it (the test hung on a loaded machine).
        let stream =
            reflector(writer, watcher(api.clone(), cfg).default_backoff()).applied_objects();
        let task = tokio::spawn(stream.for_each(|_| async {}));
        tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
            .await
            .expect("ready in time")
            .expect("ready");
        assert_eq!(reader.state().len(), 3, "streaming={streaming}");
        api.delete("cm-1", &Default::default())
            .await
            .expect("delete");
        let extra: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("late-{streaming}"), "labels": {"set": "a"}}}),
        )
        .expect("cm");
        api.create(&PostParams::default(), &extra)
            .await
            .expect("create");
        eventually(10, || {
            let n = reader.state().len();
            let has_late = reader
                .state()
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(&format!("late-{streaming}")));
            async move { (n == 3 && has_late).then_some(()) }
        })
        .await;
        // Re-create cm-1 for the next round.
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "cm-1", "labels": {"set": "a"}}}))
                .expect("cm");
        api.create(&PostParams::default(), &cm)
            .await
            .expect("recreate");
        api.delete(&format!("late-{streaming}"), &Default::default())
            .await
            .expect("delete late");
        task.abort();
    }
    sim.shutdown().await;
}

/// `kedge_net::kube_client::list_paged` reads a selection in pages through the continue
/// tokens, each object once, as the hub lists its ClusterProfiles and the CLI the members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_read_in_pages_has_every_object_once() {
    let sim = sim("paged").await;
    let client = sim.clusters()[0].client().expect("client");
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for (i, set) in ["a", "a", "b", "a", "a", "a", "b", "a"].iter().enumerate() {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("cm-{i}"), "labels": {"set": set}}}),
        )
        .expect("cm");
        api.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    let selected = ListParams::default().labels("set=a");
    // A page smaller than the selection comes with a continue token.
    let first = api.list(&selected.clone().limit(4)).await.expect("list");
    assert_eq!(first.items.len(), 4);
    assert!(first.metadata.continue_.is_some_and(|t| !t.is_empty()));
    for page in [1, 2, 4, 6, 500] {
        let names = kedge_net::kube_client::list_paged(&api, &selected, page, |cm| {
            cm.metadata.name.expect("name")
        })
        .await
        .expect("list");
        assert_eq!(
            names,
            ["cm-0", "cm-1", "cm-3", "cm-4", "cm-5", "cm-7"],
            "page {page}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_writes_status_of_custom_resources() {
    let sim = sim("c1").await;
    let client = sim.clusters()[0].client().expect("client");
    install_crd(&client, &sim_support::fixture("widget-crd.yaml")).await;
    let ar = widget_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);

    struct Ctx {
        api: Api<DynamicObject>,
    }
    async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let generation = obj.metadata.generation.unwrap_or(0);
        let replicas = obj.data["spec"]["replicas"].as_i64().unwrap_or(0);
        let patch = json!({"status": {"observedGeneration": generation, "replicas": replicas, "selector": "app=none"}});
        ctx.api
            .patch_status(
                obj.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<DynamicObject>, _: &kube::Error, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_millis(200))
    }
    let ctrl = Controller::new_with(api.clone(), watcher::Config::default(), ar.clone())
        .run(reconcile, error_policy, Arc::new(Ctx { api: api.clone() }))
        .for_each(|_| async {});
    let task = tokio::spawn(ctrl);

    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.kedge.dev/v1alpha1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"replicas": 2}, "status": {"replicas": 99},
    }))
    .expect("widget");
    let created = api
        .create(&PostParams::default(), &w)
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is ignored on create"
    );

    eventually(10, || {
        let api = api.clone();
        async move {
            let o = api.get("w1").await.ok()?;
            (o.data["status"]["observedGeneration"] == 1 && o.data["status"]["replicas"] == 2)
                .then_some(())
        }
    })
    .await;

    // Scale subresource: changes spec, bumps generation; the controller follows.
    let scale = api.get_scale("w1").await.expect("get scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2));
    assert_eq!(
        scale.status.and_then(|s| s.selector).as_deref(),
        Some("app=none")
    );
    api.patch_scale(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 7}})),
    )
    .await
    .expect("patch scale");
    eventually(10, || {
        let api = api.clone();
        async move {
            let o = api.get("w1").await.ok()?;
            (o.metadata.generation == Some(2)
                && o.data["status"]["observedGeneration"] == 2
                && o.data["status"]["replicas"] == 7)
                .then_some(())
        }
    })
    .await;

    // A status write does not bump generation; a metadata change neither.
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .expect("label");
    let o = api.get("w1").await.expect("get");
    assert_eq!(o.metadata.generation, Some(2));

    // Server-side apply through kube-rs.
    let applied = json!({"apiVersion": "example.kedge.dev/v1alpha1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"replicas": 1}});
    let o = api
        .patch(
            "w2",
            &PatchParams::apply("kedge-test"),
            &Patch::Apply(&applied),
        )
        .await
        .expect("apply creates");
    assert_eq!(o.data["spec"]["replicas"], 1);
    task.abort();
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_get_pods_and_status() {
    let sim = sim("d1").await;
    let client = sim.clusters()[0].client().expect("client");
    let deploys: Api<Deployment> = Api::default_namespaced(client.clone());
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": "1"}}}]}}},
    }))
    .expect("deployment");
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    let st = eventually(10, || {
        let deploys = deploys.clone();
        async move {
            let d = deploys.get("app").await.ok()?;
            let s = d.status?;
            (s.ready_replicas == Some(3)
                && s.available_replicas == Some(3)
                && s.observed_generation == Some(1))
            .then_some(s)
        }
    })
    .await;
    assert_eq!(st.replicas, Some(3));

    // 3 nodes x 8 CPU: 30 pods of 1 CPU cannot all fit.
    deploys
        .patch_scale(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 30}})),
        )
        .await
        .expect("scale up");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pending = eventually(10, || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=a"))
                .await
                .ok()?;
            let pending: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.status == "False"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .collect();
            (pending.len() == 6).then_some(pending)
        }
    })
    .await;
    let msg = pending[0]
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c[0].message.clone())
        .unwrap_or_default();
    assert!(msg.contains("Insufficient cpu"), "{msg}");
    // The scheduler also records a FailedScheduling Event, found by field selector like kubectl describe does.
    let pod_name = pending[0].metadata.name.clone().unwrap_or_default();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(client.clone());
    let evs = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={pod_name},involvedObject.kind=Pod"
        )))
        .await
        .expect("events");
    assert!(
        evs.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedScheduling")
                && e.type_.as_deref() == Some("Warning")),
        "{evs:?}"
    );
    let d = eventually(10, || {
        let deploys = deploys.clone();
        async move {
            let d = deploys.get("app").await.ok()?;
            (d.status.as_ref()?.ready_replicas == Some(24)).then_some(d)
        }
    })
    .await;
    assert_eq!(d.metadata.generation, Some(2));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_scales_targets_and_serves_external_metrics() {
    let sim = sim("keda").await;
    let cluster = &sim.clusters()[0];
    let client = cluster.client().expect("client");
    install_crd(
        &client,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../sim/assets/scaledobject-crd.yaml"
        ),
    )
    .await;
    let deploys: Api<Deployment> = Api::default_namespaced(client.clone());
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "nginx"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "n"}},
            "template": {"metadata": {"labels": {"app": "n"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }))
    .expect("deployment");
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create deploy");
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "mock-metric"}, "data": {"metric-value": "23"}}),
    )
    .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create cm");

    let so_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    );
    let sos: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &so_res);
    let so: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "nginx"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "nginx"}, "minReplicaCount": 1, "maxReplicaCount": 10, "pollingInterval": 1,
            "triggers": [{"type": "kubernetes-resource", "metadata": {"resourceKind": "ConfigMap", "resourceName": "mock-metric", "key": "metric-value", "targetValue": "5"}}]},
    }))
    .expect("so");
    sos.create(&PostParams::default(), &so)
        .await
        .expect("create so");
    let replicas = |want: i32| {
        let deploys = deploys.clone();
        async move {
            eventually(10, || {
                let deploys = deploys.clone();
                async move {
                    (deploys.get("nginx").await.ok()?.spec?.replicas == Some(want)).then_some(())
                }
            })
            .await
        }
    };
    // ceil(23 / 5) = 5
    replicas(5).await;
    cms.patch(
        "mock-metric",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"metric-value": "200"}})),
    )
    .await
    .expect("patch cm");
    replicas(10).await; // capped at maxReplicaCount

    // A value set through the Rust API overrides the ConfigMap.
    cluster.set_metric("default", "nginx", "0", 12.0);
    replicas(3).await;

    let so = sos.get("nginx").await.expect("get so");
    let metric = so.data["status"]["externalMetricNames"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(metric, "s0-kubernetes-resource-mock-metric");
    let req = axum::http::Request::get(format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/{metric}?labelSelector=scaledobject.keda.sh%2Fname%3Dnginx"
    ))
    .body(Vec::new())
    .expect("request");
    let text = client.request_text(req).await.expect("external metric");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["kind"], "ExternalMetricValueList");
    assert_eq!(v["items"][0]["value"], "12");
    assert_eq!(v["items"][0]["metricName"], metric.as_str());
    sim.shutdown().await;
}

/// A watch of `cms` opened before `faults` are set on `cluster`.
async fn watch_before(
    cms: &Api<ConfigMap>,
    cluster: &kedge_sim::Cluster,
    faults: Faults,
) -> futures::stream::BoxStream<'static, kube::Result<kube::api::WatchEvent<ConfigMap>>> {
    let stream = cms
        .watch(&Default::default(), "0")
        .await
        .expect("watch")
        .boxed();
    cluster.set_faults(faults);
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults() {
    let sim = sim("f1").await;
    let cluster = &sim.clusters()[0];
    let mut config = cluster.kube_config().expect("config");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.list(&ListParams::default())
        .await
        .expect("healthy list");

    // An open watch ends when the API becomes unavailable.
    let mut stream = watch_before(
        &cms,
        cluster,
        Faults {
            unavailable: true,
            ..Faults::default()
        },
    )
    .await;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(ev) = stream.next().await {
            if ev.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "watch must end on unavailability");
    match cms.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 503),
        other => panic!("expected 503, got {other:?}"),
    }

    cluster.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    match cms.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 500),
        other => panic!("expected 500, got {other:?}"),
    }

    cluster.set_faults(Faults {
        latency: Duration::from_millis(300),
        ..Faults::default()
    });
    let start = std::time::Instant::now();
    cms.list(&ListParams::default()).await.expect("slow list");
    assert!(start.elapsed() >= Duration::from_millis(300));

    // A lagging watch: a read sees a change at once, an open watch only after the lag.
    cluster.set_faults(Faults::default());
    let mut stream = watch_before(
        &cms,
        cluster,
        Faults {
            watch_lag: Duration::from_millis(700),
            ..Faults::default()
        },
    )
    .await;
    let start = std::time::Instant::now();
    let lagging = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("lagging".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &lagging)
        .await
        .expect("create");
    assert!(cms.get_opt("lagging").await.expect("get").is_some());
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(event) = stream.next().await {
            if let Ok(kube::api::WatchEvent::Added(cm)) = event
                && cm.metadata.name.as_deref() == Some("lagging")
            {
                return start.elapsed();
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the change reaches the watch");
    assert!(seen >= Duration::from_millis(700), "{seen:?}");

    cluster.set_faults(Faults::default());
    cms.list(&ListParams::default())
        .await
        .expect("healthy again");
    sim.shutdown().await;
}

/// Metadata-only requests (kube's `*_metadata` calls, a `PartialObjectMeta` watcher) get
/// `PartialObjectMetadata`, as from kube-apiserver: the metadata and nothing of the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_only_requests_get_partial_object_metadata() {
    let sim = sim("m1").await;
    let client = sim.clusters()[0].client().expect("client");
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_owned(), "web".to_owned())].into()),
            ..Default::default()
        },
        data: Some([("big".to_owned(), "x".repeat(4096))].into()),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm("a"))
        .await
        .expect("create");
    let kind = |types: &Option<kube::core::TypeMeta>| {
        types
            .as_ref()
            .map(|t| (t.api_version.clone(), t.kind.clone()))
    };
    let partial = Some((
        "meta.k8s.io/v1".to_owned(),
        "PartialObjectMetadata".to_owned(),
    ));

    let got = cms.get_metadata("a").await.expect("get");
    assert_eq!(kind(&got.types), partial);
    assert_eq!(got.metadata.labels.unwrap()["app"], "web");

    let list = cms
        .list_metadata(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(list.types.kind, "PartialObjectMetadataList");
    assert_eq!(list.items.len(), 1);
    assert_eq!(kind(&list.items[0].types), partial);
    assert!(list.metadata.resource_version.is_some());

    let mut events = cms
        .watch_metadata(&Default::default(), "0")
        .await
        .expect("watch")
        .boxed();
    cms.create(&PostParams::default(), &cm("b"))
        .await
        .expect("create");
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            if let kube::api::WatchEvent::Added(o) = event.expect("event") {
                assert_eq!(kind(&o.types), partial);
                seen.push(o.metadata.name.unwrap());
                if seen.len() == 2 {
                    return seen;
                }
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("both objects");
    assert_eq!(seen, ["a", "b"]);

    // The body of a metadata list holds no data at all.
    let body = client
        .request_text(
            axum::http::Request::get("/api/v1/namespaces/default/configmaps")
                .header(
                    "Accept",
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                )
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .expect("raw list");
    assert!(!body.contains("xxxx"), "{body}");
    sim.shutdown().await;
}

/// Deleting a CRD ends the watches of its resource (kube-apiserver tears its storage
/// down), after the DELETED events of its objects; a list then answers 404. The hub's
/// `/readyz` relies on this to notice a watch that cannot list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_crd_ends_the_watches_of_its_resource() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let sim = sim("c1").await;
    let client = sim.clusters()[0].client().expect("client");
    install_crd(&client, &sim_support::fixture("widget-crd.yaml")).await;
    let ar = widget_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.kedge.dev/v1alpha1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"replicas": 2},
    }))
    .expect("widget");
    let created = api
        .create(&PostParams::default(), &w)
        .await
        .expect("create");
    let rv = created.metadata.resource_version.clone().expect("rv");
    let mut events = api
        .watch(&kube::api::WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.example.kedge.dev", &Default::default())
        .await
        .expect("delete crd");
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(event) = events.next().await {
            seen.push(format!("{event:?}").chars().take(20).collect::<String>());
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch did not end; events: {seen:?}");
    assert!(seen.iter().any(|e| e.contains("Deleted")), "{seen:?}");
    let listed = api.list(&ListParams::default()).await;
    assert!(
        matches!(listed, Err(kube::Error::Api(ref e)) if e.code == 404),
        "{listed:?}"
    );
}

fn crd_file(name: &str) -> String {
    format!("{}/../deploy/crds/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn dso_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kedge.dev", "v1alpha1", "DistributedScaledObject"),
        "distributedscaledobjects",
    )
}

fn dso(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("dso")
}

/// The error of a refused write, with its code, reason and message.
fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Issue 26: kedge-sim validates custom resources against the CRD schema as kube-apiserver
/// does, so a typed client sees the same refusals a real cluster gives: an int32 beyond its
/// bound, a missing `scaleTargetRef`, a 5,000-character member name, a DSJ total of 5e9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_validated_against_their_schema() {
    let sim = sim("schema").await;
    let client = sim.clusters()[0].client().expect("client");
    install_crd(
        &client,
        &crd_file("distributedscaledobjects.kedge.dev.yaml"),
    )
    .await;
    install_crd(&client, &crd_file("distributedscaledjobs.kedge.dev.yaml")).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &dso_resource());
    let pp = PostParams::default();

    let behavior = json!({"scaleUp": {"policies": [{"type": "Pods", "value": 3_000_000_000_i64, "periodSeconds": 60}]}});
    let bad = dso(
        "web",
        json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}}}}),
    );
    let s = api_error(api.create(&pp, &bad).await);
    let field = "spec.scaledObjectSpec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.policies[0].value";
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert!(
        s.message.starts_with("DistributedScaledObject.kedge.dev \"web\" is invalid: ")
            && s.message.contains(&format!(
                "{field}: Invalid value: 3000000000: {field} in body should be less than or equal to 2147483647"
            )),
        "{}",
        s.message
    );
    let causes = s.details.expect("details").causes;
    assert!(
        causes
            .iter()
            .any(|c| c.field == field && c.reason == "FieldValueInvalid"),
        "{causes:?}"
    );

    let s = api_error(
        api.create(
            &pp,
            &dso("web", json!({"scaledObjectSpec": {"triggers": []}})),
        )
        .await,
    );
    assert_eq!(
        s.message,
        "DistributedScaledObject.kedge.dev \"web\" is invalid: spec.scaledObjectSpec.scaleTargetRef: Required value"
    );

    let long = "m".repeat(5_000);
    let s = api_error(
        api.create(
            &pp,
            &dso(
                "web",
                json!({"memberClusters": [{"name": long}], "scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}}),
            ),
        )
        .await,
    );
    assert_eq!(
        s.message,
        "DistributedScaledObject.kedge.dev \"web\" is invalid: spec.memberClusters[0].name: Too long: may not be more than 63 bytes"
    );

    let dsj: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kedge.dev", "v1alpha1", "DistributedScaledJob"),
            "distributedscaledjobs",
        ),
    );
    let job: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledJob",
        "metadata": {"name": "batch"},
        "spec": {"totalTargetReplicas": 5e9, "scaledJobSpec": {"jobTargetRef": {"template": {}}}},
    }))
    .expect("dsj");
    let s = api_error(dsj.create(&pp, &job).await);
    assert!(
        s.message.contains("spec.totalTargetReplicas: Invalid value: 5e+09: spec.totalTargetReplicas in body should be less than or equal to 1e+06"),
        "{}",
        s.message
    );

    // A valid one is stored; /scale beyond the bound is refused as the schema says.
    api.create(
        &pp,
        &dso(
            "web",
            json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}}),
        ),
    )
    .await
    .expect("a valid DSO is stored");
    let s = api_error(
        api.patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2_000_000}})),
        )
        .await,
    );
    assert!(
        s.message.contains("spec.totalTargetReplicas: Invalid value: 2000000: spec.totalTargetReplicas in body should be less than or equal to 1000000"),
        "{}",
        s.message
    );
    // The status subresource is validated too: a count beyond int32 is refused.
    let s = api_error(
        api.patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"membersTotalCount": 3_000_000_000_i64}})),
        )
        .await,
    );
    assert!(
        // The status is validated on its own, as kube-apiserver's ValidateStatusUpdate does:
        // the path is in the field, not in the message.
        s.message.contains("status.membersTotalCount: Invalid value: 3000000000: membersTotalCount in body should be less than or equal to 2147483647"),
        "{}",
        s.message
    );
    api.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"membersTotalCount": 3}})),
    )
    .await
    .expect("a status within bounds is written");
    sim.shutdown().await;
}

/// `fieldValidation`: a typo'd field (`memberCluster:`) is refused under Strict, pruned with
/// a warning under Warn, and refused by server-side apply, whose typed merge knows no such
/// field; it is never stored, so it can never be read back as "all members".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_under_field_validation() {
    use kube::api::ValidationDirective;
    let sim = sim("fields").await;
    let client = sim.clusters()[0].client().expect("client");
    install_crd(
        &client,
        &crd_file("distributedscaledobjects.kedge.dev.yaml"),
    )
    .await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &dso_resource());
    let spec = json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}});
    api.create(&PostParams::default(), &dso("web", spec))
        .await
        .expect("create");
    let typo = Patch::Merge(json!({"spec": {"memberCluster": [{"name": "a"}]}}));

    let strict = PatchParams::default().validation(ValidationDirective::Strict);
    let s = api_error(api.patch("web", &strict, &typo).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert!(
        s.message
            .starts_with(" \"\" is invalid: patch: Invalid value: ")
            && s.message
                .ends_with(": strict decoding error: unknown field \"spec.memberCluster\""),
        "{}",
        s.message
    );

    let warn = PatchParams::default().validation(ValidationDirective::Warn);
    let out = api
        .patch("web", &warn, &typo)
        .await
        .expect("accepted under Warn");
    assert!(
        out.data["spec"].get("memberCluster").is_none(),
        "{:?}",
        out.data
    );

    let apply = PatchParams::apply("kedge-test");
    let mut applied = dso(
        "web",
        json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}, "memberCluster": []}),
    );
    applied.metadata.namespace = Some("default".into());
    let s = api_error(api.patch("web", &apply, &Patch::Apply(&applied)).await);
    assert_eq!(s.code, 500, "{s:?}");
    assert!(
        s.message
            .ends_with(".spec.memberCluster: field not declared in schema"),
        "{}",
        s.message
    );
    let stored = api.get("web").await.expect("get");
    assert!(
        stored.data["spec"].get("memberCluster").is_none(),
        "{:?}",
        stored.data
    );
    sim.shutdown().await;
}

/// Server-side apply of a status through `/status` keeps its field manager's record, so the
/// next apply prunes what it no longer sets: a DSO status that lists another set of members
/// (of a fleet larger than the listing bound) holds the new set only, as kube-apiserver
/// keeps it. kedge-sim dropped the record of status writes, and the union of every listing
/// grew until it failed validation ("Too many: 1063").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_applied_anew_prunes_what_it_no_longer_sets() {
    let sim = sim("ssa-status").await;
    let client = sim.clusters()[0].client().expect("client");
    install_crd(
        &client,
        &crd_file("distributedscaledobjects.kedge.dev.yaml"),
    )
    .await;
    let api: Api<DynamicObject> = Api::default_namespaced_with(client, &dso_resource());
    let spec = json!({"scaledObjectSpec": {"scaleTargetRef": {"name": "web"},
        "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}});
    api.create(&PostParams::default(), &dso("web", spec))
        .await
        .expect("create");
    let status = |keys: std::ops::Range<usize>| {
        let members: serde_json::Map<String, serde_json::Value> = keys
            .map(|i| {
                (
                    format!("member-{i}"),
                    json!({"state": "Ready", "currentReplicas": 1}),
                )
            })
            .collect();
        json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "status": {"memberClusterStatuses": members}})
    };
    let params = PatchParams::apply("kedge-hub").force();
    for keys in [0..1000, 63..1063, 500..1500] {
        let start = keys.start;
        let written = api
            .patch_status("web", &params, &Patch::Apply(&status(keys)))
            .await
            .expect("a status of 1,000 members is valid");
        let listed = written.data["status"]["memberClusterStatuses"]
            .as_object()
            .expect("listed")
            .clone();
        assert_eq!(listed.len(), 1000, "from member-{start}");
        assert!(listed.contains_key(&format!("member-{start}")));
        assert!(!listed.contains_key(&format!("member-{}", start.saturating_sub(1))) || start == 0);
        let managers: Vec<_> = written
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|e| e.manager.as_deref() == Some("kedge-hub"))
            .map(|e| (e.operation.clone(), e.subresource.clone()))
            .collect();
        assert_eq!(
            managers,
            [(Some("Apply".to_owned()), Some("status".to_owned()))]
        );
    }
}
