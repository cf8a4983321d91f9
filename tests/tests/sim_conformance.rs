//! Response conformance with the Kubernetes API conventions: status codes,
//! `Status` reasons, watch event sequences, 409 and 410 cases.

mod sim_support;

use std::time::Duration;

use axum::http::{Method, Request};
use kedge_sim::{Sim, SimConfig};
use serde_json::{Value, json};
use sim_support::{eventually, fast};

struct Raw {
    client: kube::Client,
}

impl Raw {
    async fn call(&self, method: Method, path: &str, ct: &str, body: Value) -> (u16, Value) {
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&body).expect("json")
        };
        self.bytes(method, path, ct, bytes).await
    }

    async fn bytes(&self, method: Method, path: &str, ct: &str, body: Vec<u8>) -> (u16, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(kube::client::Body::from(body))
            .expect("request");
        let resp = self.client.send(req).await.expect("send");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect_bytes().await.expect("body");
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(Method::GET, path, "application/json", Value::Null)
            .await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, "application/json", body)
            .await
    }

    /// A watch that ends after `timeoutSeconds`; returns the events.
    async fn watch(&self, path: &str) -> Vec<Value> {
        let req = Request::get(path)
            .body(kube::client::Body::from(Vec::new()))
            .expect("request");
        let resp = self.client.send(req).await.expect("send");
        assert_eq!(resp.status().as_u16(), 200);
        let bytes = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect_bytes())
            .await
            .expect("watch ended in time")
            .expect("body");
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| serde_json::from_str(l).expect("event json"))
            .collect()
    }
}

async fn start(config: SimConfig) -> (Sim, Raw) {
    let sim = Sim::start(&["conf".to_string()], config, None)
        .await
        .expect("start");
    let mut cfg = sim.clusters()[0].kube_config().expect("config");
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).expect("client");
    (sim, Raw { client })
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn cm(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

fn assert_status(v: &Value, code: u16, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_codes_and_reasons() {
    let (sim, raw) = start(fast()).await;
    let (code, v) = raw.get(&format!("{CMS}/missing")).await;
    assert_eq!(code, 404);
    assert_status(&v, 404, "NotFound");
    assert_eq!(v["message"], "configmaps \"missing\" not found");

    let (code, _) = raw.post(CMS, cm("a", json!({}))).await;
    assert_eq!(code, 201);
    let (code, v) = raw.post(CMS, cm("a", json!({}))).await;
    assert_eq!(code, 409);
    assert_status(&v, 409, "AlreadyExists");

    // Stale resourceVersion on update.
    let (_, current) = raw.get(&format!("{CMS}/a")).await;
    let mut stale = current.clone();
    stale["data"]["k"] = json!("v2");
    let (code, _) = raw
        .call(
            Method::PUT,
            &format!("{CMS}/a"),
            "application/json",
            stale.clone(),
        )
        .await;
    assert_eq!(code, 200);
    let (code, v) = raw
        .call(Method::PUT, &format!("{CMS}/a"), "application/json", stale)
        .await;
    assert_eq!(code, 409);
    assert_status(&v, 409, "Conflict");

    // Malformed input is a 400, never a crash.
    let (code, v) = raw
        .bytes(Method::POST, CMS, "application/json", b"{not json".to_vec())
        .await;
    assert_eq!(code, 400);
    assert_status(&v, 400, "BadRequest");
    let (code, v) = raw
        .get(&format!("{CMS}?labelSelector=a%3D%3D%3Db%2C%40"))
        .await;
    assert_eq!(code, 400, "{v}");
    let (code, _) = raw.get(&format!("{CMS}?limit=abc")).await;
    assert_eq!(code, 400);
    let (code, _) = raw
        .get(&format!("{CMS}?watch=true&resourceVersion=xyz"))
        .await;
    assert_eq!(code, 400);

    // Invalid names and missing names are 422.
    let (code, v) = raw.post(CMS, cm("Not_Valid", json!({}))).await;
    assert_eq!(code, 422);
    assert_status(&v, 422, "Invalid");
    let (code, v) = raw.post(CMS, json!({"metadata": {}})).await;
    assert_eq!(code, 422, "{v}");

    // generateName.
    let (code, v) = raw
        .post(CMS, json!({"metadata": {"generateName": "gen-"}}))
        .await;
    assert_eq!(code, 201);
    let name = v["metadata"]["name"].as_str().unwrap_or_default();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Patches.
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/a"),
            "application/json-patch+json",
            json!([{"op": "test", "path": "/data/k", "value": "nope"}]),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    let (code, v) = raw
        .call(Method::PATCH, &format!("{CMS}/a"), "text/plain", json!({}))
        .await;
    assert_eq!(code, 415);
    assert_status(&v, 415, "UnsupportedMediaType");
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/a"),
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/data/k", "value": "v3"}]),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["data"]["k"], "v3");
    let (code, _) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/missing"),
            "application/merge-patch+json",
            json!({}),
        )
        .await;
    assert_eq!(code, 404);
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/a"),
            "application/apply-patch+yaml",
            cm("a", json!({})),
        )
        .await;
    assert_eq!(code, 400, "apply without fieldManager: {v}");

    // Namespaces must exist; unknown resources and verbs.
    let (code, v) = raw
        .post("/api/v1/namespaces/nope/configmaps", cm("x", json!({})))
        .await;
    assert_eq!(code, 404);
    assert_eq!(v["message"], "namespaces \"nope\" not found");
    let (code, _) = raw.get("/apis/example.com/v1/things").await;
    assert_eq!(code, 404);
    let (code, v) = raw
        .call(
            Method::POST,
            &format!("{CMS}/a"),
            "application/json",
            cm("a", json!({})),
        )
        .await;
    assert_eq!(code, 405);
    assert_status(&v, 405, "MethodNotAllowed");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pagination_and_selectors() {
    let (sim, raw) = start(fast()).await;
    for i in 0..5 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        raw.post(CMS, cm(&format!("cm-{i}"), json!({"tier": tier})))
            .await;
    }
    let (_, page1) = raw.get(&format!("{CMS}?limit=2")).await;
    assert_eq!(page1["kind"], "ConfigMapList");
    assert_eq!(page1["items"].as_array().map(Vec::len), Some(2));
    let cont = page1["metadata"]["continue"]
        .as_str()
        .expect("continue token")
        .to_string();
    let (_, page2) = raw.get(&format!("{CMS}?limit=2&continue={cont}")).await;
    assert_eq!(page2["items"][0]["metadata"]["name"], "cm-2");
    assert_eq!(
        page2["metadata"]["resourceVersion"],
        page1["metadata"]["resourceVersion"]
    );
    let cont = page2["metadata"]["continue"]
        .as_str()
        .expect("continue token")
        .to_string();
    let (_, page3) = raw.get(&format!("{CMS}?limit=2&continue={cont}")).await;
    assert_eq!(page3["items"].as_array().map(Vec::len), Some(1));
    assert!(page3["metadata"].get("continue").is_none());
    let (code, _) = raw.get(&format!("{CMS}?continue=zz")).await;
    assert_eq!(code, 400);

    let (_, v) = raw.get(&format!("{CMS}?labelSelector=tier%3Deven")).await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(3));
    let (_, v) = raw
        .get(&format!("{CMS}?labelSelector=tier%20notin%20(even)"))
        .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2));
    let (_, v) = raw
        .get(&format!("{CMS}?fieldSelector=metadata.name%3Dcm-3"))
        .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
    let (_, v) = raw
        .get("/api/v1/configmaps?fieldSelector=metadata.namespace%21%3Ddefault")
        .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(0));

    let (code, v) = raw
        .call(
            Method::DELETE,
            &format!("{CMS}?labelSelector=tier%3Dodd"),
            "application/json",
            Value::Null,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2));
    let (_, v) = raw.get(CMS).await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(3));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sequences_bookmarks_and_gone() {
    let (sim, raw) = start(SimConfig {
        history: 8,
        ..fast()
    })
    .await;
    let (_, list) = raw.get(CMS).await;
    let rv0 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (_, a) = raw.post(CMS, cm("a", json!({"w": "yes"}))).await;
    raw.call(
        Method::PATCH,
        &format!("{CMS}/a"),
        "application/merge-patch+json",
        json!({"data": {"k": "2"}}),
    )
    .await;
    // Leaving the selector is a DELETED event for a selector watch.
    raw.call(
        Method::PATCH,
        &format!("{CMS}/a"),
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"w": "no"}}}),
    )
    .await;
    raw.call(
        Method::DELETE,
        &format!("{CMS}/a"),
        "application/json",
        Value::Null,
    )
    .await;

    let events = raw
        .watch(&format!(
            "{CMS}?watch=true&resourceVersion={rv0}&timeoutSeconds=1"
        ))
        .await;
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]);
    assert_eq!(events[0]["object"]["metadata"]["uid"], a["metadata"]["uid"]);
    let rvs: Vec<u64> = events
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    assert!(
        rvs.windows(2).all(|w| w[0] < w[1]),
        "resourceVersions increase: {rvs:?}"
    );

    let events = raw
        .watch(&format!(
            "{CMS}?watch=true&resourceVersion={rv0}&timeoutSeconds=1&labelSelector=w%3Dyes"
        ))
        .await;
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);

    // Bookmarks carry the current resourceVersion and nothing else.
    let events = raw
        .watch(&format!(
            "{CMS}?watch=true&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion={}",
            rvs[3]
        ))
        .await;
    let bm = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(bm["object"]["kind"], "ConfigMap");
    assert!(
        bm["object"]["metadata"]["resourceVersion"]
            .as_str()
            .is_some()
    );

    // Streaming list: initial ADDED events, then the initial-events-end bookmark.
    raw.post(CMS, cm("b", json!({}))).await;
    let events = raw
        .watch(&format!("{CMS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"))
        .await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "b");
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(
        events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let (code, v) = raw
        .get(&format!("{CMS}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(code, 422, "{v}");

    // Push the history window past rv0: the watch gets a 410 ERROR event.
    for i in 0..10 {
        raw.post(CMS, cm(&format!("fill-{i}"), json!({}))).await;
    }
    let events = raw
        .watch(&format!("{CMS}?watch=true&resourceVersion={rv0}"))
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_status(&events[0]["object"], 410, "Expired");
    let (code, v) = raw
        .get(&format!(
            "{CMS}?resourceVersion={rv0}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(code, 410);
    assert_status(&v, 410, "Expired");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_status_separation_and_deletion() {
    let (sim, raw) = start(fast()).await;
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "finalizers": ["kedge.dev/hold"]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
        "status": {"replicas": 42}});
    let (code, v) = raw.post(deps, d).await;
    assert_eq!(code, 201);
    assert_eq!(v["metadata"]["generation"], 1);
    assert!(v.get("status").is_none(), "status is reset on create: {v}");

    // Status writes through the main resource are ignored, spec writes through /status too.
    let (_, v) = raw
        .call(
            Method::PATCH,
            &format!("{deps}/d"),
            "application/merge-patch+json",
            json!({"status": {"replicas": 9}, "metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(v["metadata"]["generation"], 1);
    assert_ne!(v["status"]["replicas"], 9, "{v}");
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{deps}/d/status"),
            "application/merge-patch+json",
            json!({"status": {"replicas": 9}, "spec": {"replicas": 5}}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["status"]["replicas"], 9);
    assert_eq!(v["spec"]["replicas"], 0);
    assert_eq!(v["metadata"]["generation"], 1);
    let (_, v) = raw
        .call(
            Method::PATCH,
            &format!("{deps}/d"),
            "application/merge-patch+json",
            json!({"spec": {"replicas": 1}}),
        )
        .await;
    assert_eq!(v["metadata"]["generation"], 2);

    // Scale subresource.
    let (code, v) = raw.get(&format!("{deps}/d/scale")).await;
    assert_eq!(code, 200);
    assert_eq!(v["kind"], "Scale");
    assert_eq!(v["apiVersion"], "autoscaling/v1");
    assert_eq!(v["spec"]["replicas"], 1);
    assert_eq!(v["status"]["selector"], "a=b");
    let (code, v) = raw
        .call(Method::PUT, &format!("{deps}/d/scale"), "application/json", json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "d", "resourceVersion": "1"}, "spec": {"replicas": 3}}))
        .await;
    assert_eq!(code, 409, "stale scale update: {v}");
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{deps}/d/scale"),
            "application/merge-patch+json",
            json!({"spec": {"replicas": -1}}),
        )
        .await;
    assert_eq!(code, 422, "{v}");

    // Finalizers: delete only marks, removing the last finalizer deletes.
    let (code, v) = raw
        .call(
            Method::DELETE,
            &format!("{deps}/d"),
            "application/json",
            Value::Null,
        )
        .await;
    assert_eq!(code, 202);
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    let (code, _) = raw.get(&format!("{deps}/d")).await;
    assert_eq!(code, 200);
    let (code, _) = raw
        .call(
            Method::PATCH,
            &format!("{deps}/d"),
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(code, 200);
    let (code, _) = raw.get(&format!("{deps}/d")).await;
    assert_eq!(code, 404);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_references_and_propagation() {
    let (sim, raw) = start(fast()).await;
    let raw = &raw;
    let owner = |name: &'static str| async move {
        let (_, v) = raw.post(CMS, cm(name, json!({}))).await;
        v
    };
    let child = |name: String, owner: Value| json!({"metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "blockOwnerDeletion": true}]}});
    let exists = |name: String| async move { raw.get(&format!("{CMS}/{name}")).await.0 == 200 };

    // Background: dependents go after the owner.
    let o = owner("bg").await;
    raw.post(CMS, child("bg-child".into(), o)).await;
    raw.call(
        Method::DELETE,
        &format!("{CMS}/bg"),
        "application/json",
        json!({"propagationPolicy": "Background"}),
    )
    .await;
    eventually(10, || async {
        (!exists("bg-child".into()).await).then_some(())
    })
    .await;

    // Orphan: dependents stay and lose the reference.
    let o = owner("orph").await;
    raw.post(CMS, child("orph-child".into(), o)).await;
    raw.call(
        Method::DELETE,
        &format!("{CMS}/orph"),
        "application/json",
        json!({"propagationPolicy": "Orphan"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, v) = raw.get(&format!("{CMS}/orph-child")).await;
    assert_eq!(code, 200);
    assert!(
        v["metadata"]["ownerReferences"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{v}"
    );

    // Foreground: the owner stays (with foregroundDeletion) until dependents are gone.
    let o = owner("fg").await;
    raw.post(CMS, child("fg-child".into(), o)).await;
    let (code, v) = raw
        .call(
            Method::DELETE,
            &format!("{CMS}/fg?propagationPolicy=Foreground"),
            "application/json",
            Value::Null,
        )
        .await;
    assert_eq!(code, 202);
    assert_eq!(v["metadata"]["finalizers"][0], "foregroundDeletion");
    eventually(10, || async {
        (!exists("fg".into()).await && !exists("fg-child".into()).await).then_some(())
    })
    .await;

    let (code, v) = raw
        .call(
            Method::DELETE,
            &format!("{CMS}/x?propagationPolicy=Sideways"),
            "application/json",
            Value::Null,
        )
        .await;
    assert_eq!(code, 422, "{v}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulsets_and_failing_jobs() {
    let (sim, raw) = start(fast()).await;
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let (code, _) = raw
        .post("/apis/apps/v1/namespaces/default/statefulsets", sts)
        .await;
    assert_eq!(code, 201);
    eventually(15, || async {
        let (_, v) = raw
            .get("/apis/apps/v1/namespaces/default/statefulsets/db")
            .await;
        (v["status"]["readyReplicas"] == 3 && v["status"]["observedGeneration"] == 1).then_some(())
    })
    .await;
    let (_, pods) = raw
        .get("/api/v1/namespaces/default/pods?labelSelector=app%3Ddb")
        .await;
    let mut names: Vec<&str> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["db-0", "db-1", "db-2"]);

    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bad", "annotations": {"sim.kedge.dev/outcome": "fail", "sim.kedge.dev/run-seconds": "0.2"}},
        "spec": {"backoffLimit": 1, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}});
    let (code, v) = raw
        .post("/apis/batch/v1/namespaces/default/jobs", job)
        .await;
    assert_eq!(code, 201);
    assert!(
        v["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"].is_string(),
        "{v}"
    );
    let status = eventually(15, || async {
        let (_, v) = raw.get("/apis/batch/v1/namespaces/default/jobs/bad").await;
        let failed = v["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Failed" && c["status"] == "True");
        failed.then_some(v["status"].clone())
    })
    .await;
    assert_eq!(status["failed"], 2);
    assert!(status["startTime"].is_string());
    let cond = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .unwrap_or_default();
    assert_eq!(cond["reason"], "BackoffLimitExceeded");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_documents() {
    let (sim, raw) = start(fast()).await;
    let (_, v) = raw.get("/api").await;
    assert_eq!(v["kind"], "APIVersions");
    let (_, v) = raw.get("/apis").await;
    let groups: Vec<&str> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in [
        "apps",
        "batch",
        "coordination.k8s.io",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
        "events.k8s.io",
        "external.metrics.k8s.io",
    ] {
        assert!(groups.contains(&g), "{g} missing from {groups:?}");
    }
    let (_, v) = raw.get("/apis/apps/v1").await;
    let res = v["resources"].as_array().cloned().unwrap_or_default();
    let deploy = res
        .iter()
        .find(|r| r["name"] == "deployments")
        .expect("deployments");
    assert_eq!(deploy["shortNames"][0], "deploy");
    assert_eq!(deploy["namespaced"], true);
    let scale = res
        .iter()
        .find(|r| r["name"] == "deployments/scale")
        .expect("scale subresource");
    assert_eq!(scale["group"], "autoscaling");
    assert!(res.iter().any(|r| r["name"] == "deployments/status"));
    // Pods' log subresource, as kube-apiserver lists it: `get` only.
    let (_, v) = raw.get("/api/v1").await;
    let res = v["resources"].as_array().cloned().unwrap_or_default();
    let log = res
        .iter()
        .find(|r| r["name"] == "pods/log")
        .expect("pods/log subresource");
    assert_eq!(log["kind"], "Pod");
    assert_eq!(log["verbs"], json!(["get"]));
    assert!(!res.iter().any(|r| r["name"] == "configmaps/log"));
    let (_, v) = raw.get("/version").await;
    assert_eq!(v["major"], "1");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_rejected_without_harm() {
    let (sim, raw) = start(fast()).await;
    raw.post(CMS, cm("a", json!({}))).await;
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    let bodies: [&[u8]; 8] = [
        b"",
        b"null",
        b"[1,2,3]",
        b"\"string\"",
        b"{\"metadata\": 7}",
        b"\xff\xfe\x00garbage",
        b"k8s\x00\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"{\"metadata\":{\"name\":\"x\"},\"spec\":{\"replicas\":\"many\"}}",
    ];
    let cts = [
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ];
    for body in bodies {
        for ct in cts {
            for (method, path) in [
                (Method::POST, CMS.to_string()),
                (Method::PUT, format!("{CMS}/a")),
                (Method::PATCH, format!("{CMS}/a?fieldManager=t")),
                (Method::PATCH, format!("{deps}/missing/scale")),
                (Method::DELETE, format!("{CMS}/nothere")),
            ] {
                let (code, v) = raw.bytes(method.clone(), &path, ct, body.to_vec()).await;
                assert!(code < 500, "{method} {path} {ct} {body:?}: {code} {v}");
            }
        }
    }
    for q in [
        "watch=true&timeoutSeconds=999999999999999999999999",
        "watch=true&allowWatchBookmarks=maybe",
        "watch=true&resourceVersion=-1",
        "limit=-5",
        "labelSelector=%28%28%28",
        "fieldSelector=%3D%3D%3D",
        "continue=%ff%fe",
        "propagationPolicy=%00",
    ] {
        let req = Request::get(format!("{CMS}?timeoutSeconds=1&{q}"))
            .body(kube::client::Body::from(Vec::new()))
            .expect("request");
        let resp = raw.client.send(req).await.expect("send");
        assert!(resp.status().as_u16() < 500, "{q}: {}", resp.status());
        let _ = resp.into_body().collect_bytes().await;
    }
    let (code, v) = raw.get(&format!("{CMS}/a")).await;
    assert_eq!(code, 200, "still serving: {v}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_are_not_persisted() {
    let (sim, raw) = start(fast()).await;
    let (code, v) = raw
        .post(&format!("{CMS}?dryRun=All"), cm("dry", json!({})))
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["metadata"]["name"], "dry");
    let (code, _) = raw.get(&format!("{CMS}/dry")).await;
    assert_eq!(code, 404);

    raw.post(CMS, cm("real", json!({}))).await;
    let (_, before) = raw.get(&format!("{CMS}/real")).await;
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/real?dryRun=All"),
            "application/merge-patch+json",
            json!({"data": {"k": "changed"}}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["data"]["k"], "changed");
    let (code, _) = raw
        .call(
            Method::DELETE,
            &format!("{CMS}/real?dryRun=All"),
            "application/json",
            Value::Null,
        )
        .await;
    assert_eq!(code, 200);
    let (_, after) = raw.get(&format!("{CMS}/real")).await;
    assert_eq!(
        before, after,
        "dry-run patch and delete left the object alone"
    );
    let (code, _) = raw
        .post(&format!("{CMS}?dryRun=Some"), cm("x", json!({})))
        .await;
    assert_eq!(code, 400);
    sim.shutdown().await;
}

/// Sizes a real control plane refuses: a write body beyond kube-apiserver's 3 MiB is a 413,
/// an object beyond etcd's 1.5 MiB a 500 "etcdserver: request is too large"; both leave the
/// stored object as it was. A controller that lets a status grow with its fleet meets these
/// in production long before anyone reads its code, so the simulator refuses them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_bodies_beyond_the_control_planes_limits_are_refused() {
    let (sim, raw) = start(fast()).await;
    let (code, _) = raw.post(CMS, cm("big", json!({}))).await;
    assert_eq!(code, 201);
    let sized = |bytes: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
            "data": {"k": "x".repeat(bytes)}})
    };
    // Just under etcd's limit is stored.
    let (code, v) = raw
        .call(
            Method::PUT,
            &format!("{CMS}/big"),
            "application/json",
            sized(1_500_000),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    // Over it: refused, and the object stays as it was.
    let (code, v) = raw
        .call(
            Method::PATCH,
            &format!("{CMS}/big"),
            "application/merge-patch+json",
            json!({"data": {"more": "y".repeat(200_000)}}),
        )
        .await;
    assert_eq!(code, 500, "{v}");
    assert_status(&v, 500, "InternalError");
    assert_eq!(v["message"], "etcdserver: request is too large");
    let (_, stored) = raw.get(&format!("{CMS}/big")).await;
    assert!(stored["data"].get("more").is_none());
    let (code, v) = raw
        .post(
            CMS,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bigger"}, "data": {"k": "x".repeat(2_000_000)}}),
        )
        .await;
    assert_eq!(code, 500, "{v}");
    let (code, _) = raw.get(&format!("{CMS}/bigger")).await;
    assert_eq!(code, 404);
    // A body over 3 MiB is not even read.
    let (code, v) = raw
        .call(
            Method::PUT,
            &format!("{CMS}/big"),
            "application/json",
            sized(3 * 1024 * 1024),
        )
        .await;
    assert_eq!(code, 413, "{v}");
    assert_status(&v, 413, "RequestEntityTooLarge");
    assert_eq!(v["message"], "Request entity too large: limit is 3145728");
    sim.shutdown().await;
}

/// `fieldValidation` on the wire, as kube-apiserver answers it: `Strict` refuses unknown
/// and duplicate fields with 400 in kube-apiserver's words, `Warn` (the default) stores the
/// object without them and says so in `Warning: 299` headers, `Ignore` says nothing, and an
/// unknown directive is a 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_validation_directives() {
    let (sim, raw) = start(fast()).await;
    let crd_path = format!(
        "{}/../deploy/crds/distributedscaledobjects.kedge.dev.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let crd: Value =
        serde_yaml::from_str(&std::fs::read_to_string(crd_path).expect("crd")).expect("yaml");
    let (code, _) = raw
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        )
        .await;
    assert_eq!(code, 201);
    let dsos = "/apis/kedge.dev/v1alpha1/namespaces/default/distributedscaledobjects";
    // A JSON body with a typo'd field and a field named twice.
    let body = |name: &str| {
        format!(
            r#"{{"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
                "metadata": {{"name": "{name}"}},
                "spec": {{"memberCluster": [{{"name": "a"}}],
                         "scaledObjectSpec": {{"scaleTargetRef": {{"name": "x"}}}},
                         "scaledObjectSpec": {{"scaleTargetRef": {{"name": "web"}}}}}}}}"#
        )
        .into_bytes()
    };
    let send = |query: &'static str, name: &'static str| {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{dsos}{query}"))
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body(name)))
            .expect("request");
        let client = raw.client.clone();
        async move {
            let resp = client.send(req).await.expect("send");
            let code = resp.status().as_u16();
            let warnings: Vec<String> = resp
                .headers()
                .get_all("warning")
                .iter()
                .map(|v| v.to_str().unwrap_or_default().to_string())
                .collect();
            let bytes = resp.into_body().collect_bytes().await.expect("body");
            (
                code,
                warnings,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };

    let (code, _, status) = send("?fieldValidation=Strict", "strict").await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (400, Some("BadRequest")),
        "{status}"
    );
    assert_eq!(
        status["message"],
        "DistributedScaledObject in version \"v1alpha1\" cannot be handled as a DistributedScaledObject: strict decoding error: unknown field \"spec.memberCluster\", duplicate field \"spec.scaledObjectSpec\""
    );

    let (code, warnings, obj) = send("", "warned").await;
    assert_eq!(code, 201, "{obj}");
    assert_eq!(
        warnings,
        vec![
            r#"299 - "unknown field \"spec.memberCluster\"""#,
            r#"299 - "duplicate field \"spec.scaledObjectSpec\"""#,
        ]
    );
    assert!(obj["spec"].get("memberCluster").is_none(), "{obj}");
    assert_eq!(
        obj["spec"]["scaledObjectSpec"]["scaleTargetRef"]["name"], "web",
        "the last one wins"
    );

    let (code, warnings, _) = send("?fieldValidation=Ignore", "ignored").await;
    assert_eq!((code, warnings.len()), (201, 0));

    let (code, _, status) = send("?fieldValidation=Loud", "loud").await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Loud\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );
    sim.shutdown().await;
}
