//! Hostile input and lifecycle events, end to end with the real binaries on kedge-sim:
//! nothing a tenant writes may stall, mislead or block the fleet. Each test names the fault
//! it guards against (docs/security.md, "Hostile input and lifecycle events", lists them).
//!
//! Objects the API server would refuse today are stored the way they get into a real
//! cluster: written while the CRD's schema did not say so (an older CRD), then the CRD is
//! upgraded. A real API server does not validate stored objects again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as PropConfig, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use support::dso::*;
use support::*;

/// The tests share two cores; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const ONE: [&str; 1] = ["member-1"];
const CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");

/// Longest a stopping hub may take (Kubernetes' grace period is 30 s; the hub promises 10).
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// Replaces the CRD of `plural` with one whose spec schema accepts anything: an older CRD
/// that did not carry today's bounds. `restore_crds` puts the real ones back.
async fn relax_crd(fleet: &Fleet, plural: &str) {
    let path = format!("{CRD_DIR}/{plural}.kedge.dev.yaml");
    let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for version in crd["spec"]["versions"].as_array_mut().unwrap() {
        version["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        if let Some(required) = version["schema"]["openAPIV3Schema"]["required"].as_array_mut() {
            required.retain(|r| r != "spec");
        }
    }
    let file = fleet.dir.join(format!("relaxed-{plural}.json"));
    std::fs::write(&file, serde_json::to_vec(&crd).unwrap()).unwrap();
    fleet
        .kubectl(&["apply", "-f", file.to_str().unwrap()])
        .await;
}

async fn restore_crds(fleet: &Fleet) {
    fleet.kubectl(&["apply", "-f", CRD_DIR]).await;
}

/// Creates `object` in the hub cluster with the kube client; the API server's refusal, if
/// any, as its message.
async fn create(fleet: &Fleet, object: &Value) -> Result<(), String> {
    let client = fleet.sim.cluster("hub").unwrap().client().unwrap();
    let kind = object["kind"].as_str().unwrap();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kedge.dev", "v1alpha1", kind),
        &format!("{}s", kind.to_lowercase()),
    );
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, "default", &resource);
    let object: kube::api::DynamicObject = serde_json::from_value(object.clone()).unwrap();
    api.create(&kube::api::PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn valid_dso(name: &str) -> Value {
    json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "memberClusters": [{"name": "member-1"}],
            "rebalancingPolicy": {"gracePeriod": "3s"},
            "scaledObjectSpec": {
                "scaleTargetRef": {"kind": "Deployment", "name": name},
                "minReplicaCount": 1, "maxReplicaCount": 20, "pollingInterval": 1,
                "triggers": [{"type": "kubernetes-resource", "metadata": {
                    "resourceKind": "ConfigMap", "resourceName": "absent", "key": "v",
                    "targetValue": "5"}}]
            }
        }
    })
}

fn valid_dsj(name: &str) -> Value {
    json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "memberClusters": [{"name": "member-1"}],
            "scaledJobSpec": {
                "pollingInterval": 1, "maxReplicaCount": 10,
                "jobTargetRef": {"template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "worker", "image": "busybox"}]}}},
                "triggers": [{"type": "kubernetes-resource", "name": "queue", "metadata": {
                    "resourceKind": "ConfigMap", "resourceName": "queue", "key": "length",
                    "targetValue": "1"}}]
            }
        }
    })
}

/// Sets the JSON pointer `path` of `object` (creating objects on the way).
fn set(object: &mut Value, path: &str, value: Value) {
    let mut at = object;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        at = match at {
            Value::Array(items) => {
                let index: usize = part.parse().unwrap();
                &mut items[index]
            }
            _ => {
                if !at.is_object() {
                    *at = json!({});
                }
                let map = at.as_object_mut().unwrap();
                if last {
                    map.insert((*part).to_owned(), value);
                    return;
                }
                map.entry((*part).to_owned()).or_insert_with(|| json!({}))
            }
        };
        if last {
            *at = value;
            return;
        }
    }
}

fn remove(object: &mut Value, path: &str) {
    let (parent, key) = path.rsplit_once('/').unwrap();
    if let Some(Value::Object(map)) = object.pointer_mut(parent) {
        map.remove(key);
    }
}

fn status_of(fleet: &Fleet, kind: &str, name: &str) -> Value {
    fleet
        .hub_object("kedge.dev/v1alpha1", kind, name)
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
}

/// Waits until `name`'s Ready condition has `reason` and returns its message.
async fn wait_ready_reason(fleet: &Fleet, kind: &str, name: &str, reason: &str) -> String {
    wait_for(
        LIMIT,
        &format!("{kind} {name} Ready reason {reason}"),
        || async {
            let status = status_of(fleet, kind, name);
            let ready = condition(&status, "Ready")?;
            (ready["reason"] == reason).then(|| ready["message"].as_str().unwrap_or("").to_owned())
        },
    )
    .await
}

/// Scales DSO `name` to `total` and waits until member-1 runs it.
async fn scale_and_converge(fleet: &Fleet, name: &str, total: i64) {
    fleet
        .kubectl(&["scale", "dso", name, &format!("--replicas={total}")])
        .await;
    fleet
        .wait_split(name, &ONE, &[total], &format!("{name} scaled to {total}"))
        .await;
}

/// SIGTERM: the hub must be gone within [`STOP_LIMIT`]; returns how long it took.
async fn stop_hub(hub: &mut Proc) -> Duration {
    let start = Instant::now();
    hub.signal("TERM");
    while hub.is_running() {
        assert!(
            start.elapsed() < STOP_LIMIT,
            "the hub did not exit within {STOP_LIMIT:?} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// The holder of the hub's Lease, if any.
fn lease_holder(fleet: &Fleet) -> Option<String> {
    let lease = fleet.sim.cluster("hub")?.object(
        "coordination.k8s.io/v1",
        "Lease",
        "kedge-system",
        "kedge-hub",
    )?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

/// Fault: one DSO the hub cannot decode (a number past int32, stored before the CRD said
/// so) and one DSJ with a total past int32. Before, after a hub restart the typed list
/// failed and the controllers reconciled nothing at all. Now each bad object says why on its
/// own status and in an Event, every other object keeps converging across a restart, and a
/// bad object that is deleted goes (its finalizer is removed).
#[tokio::test]
async fn one_undecodable_object_stops_no_other_even_after_a_restart() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&ONE).await;
    for name in ["good", "turns-bad"] {
        deployment(&fleet.sim, "member-1", name, 1).await;
    }
    set_queue(&fleet, 0).await;
    let mut hub = fleet.start_hub_with("hub-1.log", &["--dsj-enabled", "true"]);
    let _agent = fleet.start_agent("member-1", None, "member-1.log");
    wait_for_states(fleet.ports, &ONE, "Connected", LIMIT).await;

    create(&fleet, &valid_dso("good")).await.unwrap();
    create(&fleet, &valid_dso("turns-bad")).await.unwrap();
    scale_and_converge(&fleet, "good", 3).await;
    scale_and_converge(&fleet, "turns-bad", 2).await;

    // Objects the CRD of the time let through.
    relax_crd(&fleet, "distributedscaledobjects").await;
    relax_crd(&fleet, "distributedscaledjobs").await;
    let mut bad_number = valid_dso("bad-number");
    set(
        &mut bad_number,
        "/spec/scaledObjectSpec/advanced/horizontalPodAutoscalerConfig/behavior/scaleUp/policies",
        json!([{"type": "Pods", "value": 3_000_000_000_u64, "periodSeconds": 15}]),
    );
    create(&fleet, &bad_number).await.unwrap();
    let mut no_target = valid_dso("no-target");
    remove(&mut no_target, "/spec/scaledObjectSpec/scaleTargetRef");
    create(&fleet, &no_target).await.unwrap();
    let mut bad_total = valid_dsj("bad-total");
    set(
        &mut bad_total,
        "/spec/scaledJobSpec/maxReplicaCount",
        json!(5_000_000_000_u64),
    );
    create(&fleet, &bad_total).await.unwrap();
    // A DSO the hub acts on, made undecodable by an update.
    fleet
        .kubectl(&[
            "patch",
            "dso",
            "turns-bad",
            "--type=merge",
            "-p",
            r#"{"spec":{"scaledObjectSpec":{"pollingInterval":9999999999}}}"#,
        ])
        .await;
    restore_crds(&fleet).await;

    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "bad-number",
        "ValidationFailed",
    )
    .await;
    assert!(
        message.contains("spec.scaledObjectSpec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.policies[0].value"),
        "{message}"
    );
    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "no-target",
        "ValidationFailed",
    )
    .await;
    assert!(message.contains("scaleTargetRef"), "{message}");
    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledJob",
        "bad-total",
        "ValidationFailed",
    )
    .await;
    assert!(
        message.contains("spec.scaledJobSpec.maxReplicaCount"),
        "{message}"
    );
    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "turns-bad",
        "ValidationFailed",
    )
    .await;
    assert!(
        message.contains("spec.scaledObjectSpec.pollingInterval"),
        "{message}"
    );
    fleet
        .wait_event("bad-number", "InvalidSpec", "policies[0].value")
        .await;
    // The workload of the DSO that turned bad keeps its replicas.
    assert_eq!(fleet.replicas("member-1", "turns-bad"), Some(2));
    scale_and_converge(&fleet, "good", 4).await;

    // A restart: the controllers list everything again, and still act on the good one.
    let took = stop_hub(&mut hub).await;
    eprintln!("hub stopped {took:?} after SIGTERM");
    let _hub = fleet.start_hub_with("hub-2.log", &["--dsj-enabled", "true"]);
    scale_and_converge(&fleet, "good", 5).await;
    assert_eq!(fleet.replicas("member-1", "turns-bad"), Some(2));
    assert_eq!(
        condition(
            &status_of(&fleet, "DistributedScaledObject", "good"),
            "Ready"
        )
        .unwrap()["status"],
        "True"
    );
    // The hub is ready: no watch is failing.
    assert_eq!(ready(fleet.ports).await, Some(true));

    // A bad object that carries the hub's finalizer is deleted all the same.
    fleet
        .kubectl(&["delete", "dso", "turns-bad", "--wait=false"])
        .await;
    wait_for(LIMIT, "the undecodable DSO to be deleted", || async {
        fleet.dso("turns-bad").is_null().then_some(())
    })
    .await;
    assert!(hub_log_has_no_panic(&fleet));
}

fn hub_log_has_no_panic(fleet: &Fleet) -> bool {
    ["hub-1.log", "hub-2.log"].iter().all(|log| {
        std::fs::read_to_string(fleet.dir.join(log))
            .map(|text| !text.contains("panicked"))
            .unwrap_or(true)
    })
}

/// Fault: a controller's watch cannot list (here: the DSJ CRD is gone). `/readyz` turns
/// unready past `--watch-failure-tolerance`, naming the watch, and ready again when it
/// recovers; SIGTERM then ends the hub within 10 s and releases the Lease.
#[tokio::test]
async fn a_failing_watch_is_unready_and_sigterm_still_releases_the_lease() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&ONE).await;
    let mut hub = fleet.start_hub_with(
        "hub-1.log",
        &["--dsj-enabled", "true", "--watch-failure-tolerance", "2s"],
    );
    wait_for(LIMIT, "the hub to lead and be ready", || async {
        (ready(fleet.ports).await == Some(true) && lease_holder(&fleet).is_some()).then_some(())
    })
    .await;
    fleet
        .kubectl(&["delete", "crd", "distributedscaledjobs.kedge.dev"])
        .await;
    let why = wait_for(LIMIT, "/readyz to turn 503", || async {
        match ready(fleet.ports).await {
            Some(false) => ops_request(fleet.ports, "/readyz")
                .await
                .map(|(_, body)| body),
            _ => None,
        }
    })
    .await;
    assert!(why.contains("DistributedScaledJobs"), "{why}");
    restore_crds(&fleet).await;
    // A failing watch retries at least every half tolerance (1 s here).
    wait_for(LIMIT, "/readyz to recover", || async {
        (ready(fleet.ports).await == Some(true)).then_some(())
    })
    .await;
    // Broken again, then stopped while broken.
    fleet
        .kubectl(&["delete", "crd", "distributedscaledjobs.kedge.dev"])
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let took = stop_hub(&mut hub).await;
    eprintln!("hub stopped {took:?} after SIGTERM");
    assert_eq!(lease_holder(&fleet), None, "the Lease was not released");
}

/// Fault: a DSO refused by namespace policy (older, in another tenant's namespace, placing
/// into `default` without a grant) claimed the workload, and the allowed DSO got
/// `ClaimedByAnotherDSO`. A refused object holds no claim.
#[tokio::test]
async fn a_refused_tenant_blocks_no_other() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&ONE).await;
    deployment(&fleet.sim, "member-1", "web", 1).await;
    fleet.kubectl(&["create", "namespace", "team-b"]).await;
    let _hub = fleet.start_hub("hub-1.log");
    let _agent = fleet.start_agent("member-1", None, "member-1.log");
    wait_for_states(fleet.ports, &ONE, "Connected", LIMIT).await;
    let mut refused = valid_dso("web");
    refused["metadata"]["namespace"] = json!("team-b");
    refused["spec"]["memberClusters"] = json!([{"name": "member-1", "targetNamespace": "default"}]);
    let client = fleet.sim.cluster("hub").unwrap().client().unwrap();
    let api: kube::Api<kedge_core::crd::DistributedScaledObject> =
        kube::Api::namespaced(client, "team-b");
    api.create(
        &kube::api::PostParams::default(),
        &serde_json::from_value(refused).unwrap(),
    )
    .await
    .unwrap();
    wait_for(LIMIT, "the team-b DSO to be refused", || async {
        let dso = fleet.sim.cluster("hub")?.object(
            "kedge.dev/v1alpha1",
            "DistributedScaledObject",
            "team-b",
            "web",
        )?;
        (condition(&dso["status"], "Ready")?["reason"] == "NamespaceNotAllowed").then_some(())
    })
    .await;
    // Created later in the workload's own namespace: it wins, with no conflict.
    create(&fleet, &valid_dso("web")).await.unwrap();
    scale_and_converge(&fleet, "web", 4).await;
    let status = status_of(&fleet, "DistributedScaledObject", "web");
    assert_eq!(
        condition(&status, "Conflict").unwrap()["status"],
        "False",
        "{status:#}"
    );
    assert_eq!(condition(&status, "Ready").unwrap()["status"], "True");
}

/// Fault: statuses that looked healthier than the truth. A DSO naming a member that does
/// not exist said Ready=True; a DSO whose only member refuses its namespace said Ready=True
/// with "InsufficientCapacity"; an empty `memberClusters` selected a member whose agent
/// never enrolled; a 5,000-character member name made the child apply retry forever.
#[tokio::test]
async fn status_never_looks_healthier_than_the_truth() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&ONE).await;
    deployment(&fleet.sim, "member-1", "web", 1).await;
    // Enrolled on paper only: its agent never came.
    fleet.register("member-never").await;
    let _hub = fleet.start_hub("hub-1.log");
    // The agent serves namespace `shop` only: it refuses `default`.
    let _agent = fleet.start_agent("member-1", Some("shop"), "member-1.log");
    wait_for_states(fleet.ports, &ONE, "Connected", LIMIT).await;

    let mut ghost = valid_dso("ghost");
    ghost["spec"]["memberClusters"] = json!([{"name": "edge-9"}]);
    create(&fleet, &ghost).await.unwrap();
    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "ghost",
        "NoMemberAvailable",
    )
    .await;
    assert!(
        message.contains("kubectl kedge mc setup-member edge-9"),
        "{message}"
    );

    create(&fleet, &valid_dso("web")).await.unwrap();
    fleet
        .kubectl(&["scale", "dso", "web", "--replicas=8"])
        .await;
    let message = wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "web",
        "NoMemberAvailable",
    )
    .await;
    assert!(message.contains("member-1"), "{message}");
    let status = status_of(&fleet, "DistributedScaledObject", "web");
    assert_eq!(
        condition(&status, "Degraded").unwrap()["reason"],
        "NoMemberAvailable",
        "{status:#}"
    );
    // What kubectl shows agrees.
    let table = fleet.kubectl(&["get", "dso", "web"]).await;
    assert!(table.contains("False"), "{table}");

    let mut everywhere = valid_dso("everywhere");
    everywhere["spec"]["memberClusters"] = json!([]);
    create(&fleet, &everywhere).await.unwrap();
    wait_ready_reason(
        &fleet,
        "DistributedScaledObject",
        "everywhere",
        "NoMemberAvailable",
    )
    .await;
    let status = status_of(&fleet, "DistributedScaledObject", "everywhere");
    assert!(
        status["memberClusterStatuses"]
            .get("member-never")
            .is_none(),
        "a member whose agent never enrolled was selected: {status:#}"
    );

    let mut huge = valid_dso("huge");
    huge["spec"]["memberClusters"] = json!([{"name": "m".repeat(5000)}]);
    match create(&fleet, &huge).await {
        // Refused by the API server's schema: the message names the field.
        Err(e) => assert!(e.contains("memberClusters"), "{e}"),
        Ok(()) => {
            let message = wait_ready_reason(
                &fleet,
                "DistributedScaledObject",
                "huge",
                "ValidationFailed",
            )
            .await;
            assert!(
                message.contains("RFC 1123") && message.len() < 1000,
                "{message}"
            );
        }
    }
}

/// One hostile change to a valid DSO or DSJ.
#[derive(Debug, Clone)]
enum Hostile {
    /// A number past int32 (or negative where counts are meant) at a path.
    Number(&'static str, i64),
    /// A huge string at a path.
    Huge(&'static str, usize),
    /// A required field taken away.
    Missing(&'static str),
    /// A field the API does not have.
    Unknown(&'static str),
}

const DSO_NUMBERS: [&str; 5] = [
    "/spec/scaledObjectSpec/pollingInterval",
    "/spec/scaledObjectSpec/maxReplicaCount",
    "/spec/scaledObjectSpec/minReplicaCount",
    "/spec/memberClusters/0/weight",
    "/spec/rebalancingPolicy/maxRebalancePercentage",
];
const DSJ_NUMBERS: [&str; 4] = [
    "/spec/scaledJobSpec/pollingInterval",
    "/spec/scaledJobSpec/maxReplicaCount",
    "/spec/scaledJobSpec/successfulJobsHistoryLimit",
    "/spec/memberClusters/0/weight",
];
const STRINGS: [&str; 2] = ["/spec/memberClusters/0/name", "/metadata/annotations/note"];

fn hostile(
    numbers: &'static [&'static str],
    required: &'static str,
) -> impl Strategy<Value = Hostile> {
    prop_oneof![
        (
            proptest::sample::select(numbers),
            prop_oneof![
                (i64::from(i32::MAX) + 1)..=i64::from(u32::MAX) * 4,
                i64::MIN / 4..=-1_i64,
            ]
        )
            .prop_map(|(p, n)| Hostile::Number(p, n)),
        (proptest::sample::select(&STRINGS[..]), 300_usize..20_000)
            .prop_map(|(p, n)| Hostile::Huge(p, n)),
        Just(Hostile::Missing(required)),
        Just(Hostile::Unknown("/spec/memberCluster")),
    ]
}

fn apply_hostile(object: &mut Value, change: &Hostile) {
    match change {
        Hostile::Number(path, n) => set(object, path, json!(n)),
        Hostile::Huge(path, n) => set(object, path, json!("z".repeat(*n))),
        Hostile::Missing(path) => remove(object, path),
        Hostile::Unknown(path) => set(object, path, json!([{"name": "member-1"}])),
    }
}

/// Property: DSOs and DSJs with out-of-range numbers, huge strings, unknown fields and
/// missing required fields (generated; a fixed seed, so a failure reproduces), written next
/// to valid ones, some through the API server's validation and some stored past it (an older
/// CRD), with one hub restart. No panic; every bad object was refused by the API server
/// with a message naming its field, or has a status that says why; the valid ones keep
/// converging.
#[tokio::test]
async fn hostile_objects_next_to_valid_ones_property() {
    let _serial = SERIAL.lock().await;
    let mut runner = TestRunner::new_with_rng(
        PropConfig::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let cases: usize = std::env::var("KEDGE_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let dso_changes = hostile(&DSO_NUMBERS, "/spec/scaledObjectSpec/scaleTargetRef");
    let dsj_changes = hostile(&DSJ_NUMBERS, "/spec/scaledJobSpec/jobTargetRef");
    let mut objects = Vec::new();
    for i in 0..cases {
        let (mut object, change) = if i % 2 == 0 {
            let change = dso_changes.new_tree(&mut runner).unwrap().current();
            (valid_dso(&format!("bad-{i}")), change)
        } else {
            let change = dsj_changes.new_tree(&mut runner).unwrap().current();
            (valid_dsj(&format!("bad-{i}")), change)
        };
        apply_hostile(&mut object, &change);
        objects.push((object, change));
    }

    let (_dir, fleet) = start(&ONE).await;
    deployment(&fleet.sim, "member-1", "steady", 1).await;
    set_queue(&fleet, 0).await;
    let mut hub = fleet.start_hub_with("hub-1.log", &["--dsj-enabled", "true"]);
    let _agent = fleet.start_agent("member-1", None, "member-1.log");
    wait_for_states(fleet.ports, &ONE, "Connected", LIMIT).await;
    create(&fleet, &valid_dso("steady")).await.unwrap();
    create(&fleet, &valid_dsj("steady-jobs")).await.unwrap();
    scale_and_converge(&fleet, "steady", 2).await;

    // Half through the API server as it is, half stored past an older CRD.
    let (through, past) = objects.split_at(objects.len() / 2);
    let mut accepted = Vec::new();
    for (object, change) in through {
        match create(&fleet, object).await {
            Ok(()) => accepted.push((object.clone(), change.clone())),
            Err(message) => {
                let field = match change {
                    Hostile::Number(p, _)
                    | Hostile::Huge(p, _)
                    | Hostile::Missing(p)
                    | Hostile::Unknown(p) => p.rsplit('/').next().unwrap(),
                };
                assert!(
                    message.contains(field) && message.len() < 4000,
                    "refusal of {change:?} does not name {field:?} (or is huge): {message}"
                );
            }
        }
    }
    relax_crd(&fleet, "distributedscaledobjects").await;
    relax_crd(&fleet, "distributedscaledjobs").await;
    for (object, change) in past {
        create(&fleet, object).await.unwrap();
        accepted.push((object.clone(), change.clone()));
    }
    restore_crds(&fleet).await;

    let check = |fleet: &Fleet, accepted: &[(Value, Hostile)]| {
        accepted
            .iter()
            .filter_map(|(object, change)| {
                let name = object["metadata"]["name"].as_str().unwrap();
                let kind = object["kind"].as_str().unwrap();
                let status = status_of(fleet, kind, name);
                match condition(&status, "Ready") {
                    Some(ready) if ready["message"].as_str().is_some_and(|m| !m.is_empty()) => None,
                    _ => Some(format!(
                        "{kind} {name} ({change:?}): no Ready condition: {status}"
                    )),
                }
            })
            .collect::<Vec<_>>()
    };
    for round in 0..2 {
        wait_for(
            LIMIT * 2,
            "every stored object to have a status",
            || async { check(&fleet, &accepted).is_empty().then_some(()) },
        )
        .await;
        scale_and_converge(&fleet, "steady", 3 + round).await;
        if round == 0 {
            stop_hub(&mut hub).await;
            hub = fleet.start_hub_with("hub-2.log", &["--dsj-enabled", "true"]);
        }
    }
    assert!(hub_log_has_no_panic(&fleet));
    drop(hub);
}
