//! DistributedScaledObjects end to end with the real binaries on kedge-sim: one simulated hub
//! cluster (kedge and KEDA CRDs, KEDA emulated) and three member clusters, the real
//! `kedge-hub`, three real `kedge-agent`s and the real `kubectl`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kedge_sim::{Sim, SimConfig};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::*;

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const HEARTBEAT: &str = "200ms";
/// Heartbeat interval × tolerance (3): how long until a silent agent is Unreachable.
const DETECTION: Duration = Duration::from_millis(600);
const GRACE: Duration = Duration::from_secs(3);
const LIMIT: Duration = Duration::from_secs(15);

struct Fleet {
    dir: PathBuf,
    pki: Pki,
    sim: Sim,
    ports: HubPorts,
}

impl Fleet {
    fn kubeconfig(&self, cluster: &str) -> PathBuf {
        self.dir.join(format!("{cluster}.kubeconfig"))
    }

    fn start_hub(&self, log: &str) -> Proc {
        let hub = self.kubeconfig("hub").display().to_string();
        start_hub_with(
            &self.pki,
            self.ports,
            HEARTBEAT,
            self.dir.join(log),
            &["--kubeconfig", &hub],
        )
    }

    fn start_agent(&self, member: &str, namespaces: Option<&str>, log: &str) -> Proc {
        let p = &self.pki;
        let mut args = vec![
            "--kubeconfig".into(),
            self.kubeconfig(member).display().to_string(),
            "--hub".into(),
            format!("127.0.0.1:{}", self.ports.quic),
            "--hub-server-name".into(),
            "localhost".into(),
            "--tls-cert".into(),
            p.path(&format!("member-{member}.pem")),
            "--tls-key".into(),
            p.path(&format!("member-{member}-key.pem")),
            "--tls-ca".into(),
            p.path("ca.pem"),
            "--ops-listen".into(),
            "127.0.0.1:0".into(),
            "--reconnect-initial".into(),
            "100ms".into(),
            "--reconnect-max".into(),
            "500ms".into(),
            "--report-interval".into(),
            "100ms".into(),
            "--capacity-interval".into(),
            "1s".into(),
        ];
        if let Some(ns) = namespaces {
            args.push("--namespaces".into());
            args.push(ns.into());
        }
        Proc::spawn(&bin("kedge-agent"), &args, self.dir.join(log))
    }

    /// `.spec.replicas` of a Deployment in a member, `None` when it does not exist.
    fn replicas(&self, member: &str, name: &str) -> Option<i64> {
        self.sim
            .cluster(member)?
            .object("apps/v1", "Deployment", "default", name)?
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
    }

    fn split(&self, name: &str, members: &[&str]) -> Vec<Option<i64>> {
        members.iter().map(|m| self.replicas(m, name)).collect()
    }

    fn hub_object(&self, api_version: &str, kind: &str, name: &str) -> Option<Value> {
        self.sim
            .cluster("hub")?
            .object(api_version, kind, "default", name)
    }

    fn dso(&self, name: &str) -> Value {
        self.hub_object("kedge.dev/v1alpha1", "DistributedScaledObject", name)
            .unwrap_or(Value::Null)
    }

    async fn kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.kubeconfig("hub"), args).await
    }

    /// Waits until the members' `.spec.replicas` of `name` are `want`.
    async fn wait_split(&self, name: &str, members: &[&str], want: &[i64], what: &str) {
        let want: Vec<Option<i64>> = want.iter().map(|w| Some(*w)).collect();
        wait_for(LIMIT, what, || async {
            (self.split(name, members) == want).then_some(())
        })
        .await;
    }

    /// Event reasons recorded for `name` in the hub.
    fn events(&self, name: &str) -> Vec<(String, String)> {
        let Some(hub) = self.sim.cluster("hub") else {
            return vec![];
        };
        let store = hub.shared().store();
        store
            .list("events.k8s.io/events", Some("default"))
            .filter(|e| e.pointer("/regarding/name").and_then(Value::as_str) == Some(name))
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    async fn wait_event(&self, name: &str, reason: &str, note_contains: &str) {
        let start = Instant::now();
        loop {
            let events = self.events(name);
            if events
                .iter()
                .any(|(r, n)| r == reason && n.contains(note_contains))
            {
                return;
            }
            assert!(
                start.elapsed() < LIMIT,
                "no event {reason} ({note_contains}) on {name}; events: {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn kubectl(kc: &Path, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(kc)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl finished in time")
    .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn deployment(sim: &Sim, member: &str, name: &str, replicas: i32) {
    let client = sim.cluster(member).unwrap().client().unwrap();
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client, "default")
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
}

fn dso_yaml(name: &str, members: &str, trigger_resource: &str) -> String {
    format!(
        r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata:
  name: {name}
  namespace: default
spec:
{members}
  rebalancingPolicy:
    gracePeriod: 3s
  scaledObjectSpec:
    scaleTargetRef:
      kind: Deployment
      name: {name}
    minReplicaCount: 1
    maxReplicaCount: 20
    pollingInterval: 1
    triggers:
    - type: kubernetes-resource
      metadata:
        resourceKind: ConfigMap
        resourceName: {trigger_resource}
        key: metric-value
        targetValue: "5"
"#
    )
}

async fn apply(fleet: &Fleet, yaml: &str, file: &str) {
    let path = fleet.dir.join(file);
    std::fs::write(&path, yaml).unwrap();
    fleet
        .kubectl(&["apply", "-f", path.to_str().unwrap()])
        .await;
}

async fn start() -> (tempfile::TempDir, Fleet) {
    let mut dir = tempfile::tempdir().unwrap();
    // Logs of the hub and agents stay for a look after a failure.
    if std::env::var_os("KEDGE_E2E_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("logs in {}", dir.path().display());
    }
    let pki = Pki::create(dir.path(), &MEMBERS).await;
    let mut names = vec!["hub".to_owned()];
    names.extend(MEMBERS.iter().map(|m| m.to_string()));
    let config = SimConfig {
        pod_start_delay: Duration::from_millis(100),
        bookmark_interval: Duration::from_millis(500),
        ..SimConfig::default()
    };
    let sim = Sim::start(&names, config, Some(dir.path())).await.unwrap();
    let fleet = Fleet {
        dir: dir.path().to_owned(),
        pki,
        sim,
        ports: HubPorts::new(),
    };
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    fleet.kubectl(&["apply", "-f", crds]).await;
    let keda = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/scaledobject-crd.yaml"
    );
    fleet.kubectl(&["apply", "-f", keda]).await;
    (dir, fleet)
}

/// Weight split, `/scale` following, `kubectl scale`, pause, failover and return, a missing
/// workload, a refused namespace, a hub restart and deletion: one fleet, one scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_scaled_objects_end_to_end() {
    let (_dir, fleet) = start().await;
    for member in MEMBERS {
        deployment(&fleet.sim, member, "nginx", 1).await;
    }
    // `web` exists in member-1 and member-2 only.
    deployment(&fleet.sim, "member-1", "web", 1).await;
    deployment(&fleet.sim, "member-2", "web", 1).await;

    let _hub = fleet.start_hub("hub-1.log");
    let mut agents: Vec<Proc> = vec![
        fleet.start_agent("member-1", None, "member-1.log"),
        fleet.start_agent("member-2", None, "member-2.log"),
        // member-3 may only act in `default`.
        fleet.start_agent("member-3", Some("default"), "member-3.log"),
    ];
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;

    // --- Weight split 4:6 of the total KEDA computes: ceil(50 / 5) = 10.
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "nginx", "0", 50.0);
    apply(
        &fleet,
        &dso_yaml(
            "nginx",
            "  memberClusters:\n  - {name: member-1, weight: 4}\n  - {name: member-2, weight: 6}",
            "nginx-metric",
        ),
        "nginx.yaml",
    )
    .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "4:6 of 10")
        .await;
    assert_eq!(fleet.replicas("member-3", "nginx"), Some(1), "not listed");

    // The child ScaledObject targets the DSO itself and is owned by it.
    let so = fleet
        .hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")
        .expect("child ScaledObject");
    assert_eq!(
        so["spec"]["scaleTargetRef"],
        json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject", "name": "nginx"})
    );
    assert_eq!(so["spec"]["maxReplicaCount"], 20);
    assert_eq!(
        so["metadata"]["ownerReferences"][0]["kind"],
        "DistributedScaledObject"
    );

    // Status as in the reference, once pods are ready.
    let status = wait_for(LIMIT, "status with 10 current replicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        (s["totalCurrentReplicas"] == 10).then_some(s)
    })
    .await;
    assert_eq!(status["membersHealthyCount"], 2, "{status:#}");
    assert_eq!(status["membersTotalCount"], 2);
    assert_eq!(
        status["selector"],
        "kedge.dev/distributedscaledobject=nginx"
    );
    let m1 = &status["memberClusterStatuses"]["member-1"];
    assert_eq!(m1["desiredReplicas"], 4, "{status:#}");
    assert_eq!(m1["currentReplicas"], 4);
    assert_eq!(m1["state"], "Ready");
    assert_eq!(m1["description"], "Cluster is healthy");
    assert!(
        m1["id"]
            .as_str()
            .unwrap()
            .starts_with("kedge-agent@member-1/")
    );
    assert!(m1["lastStatusChangeTime"].is_string());
    fleet
        .wait_event("nginx", "Scaled", "member-1=4, member-2=6")
        .await;

    // `kubectl get dso` shows the printer columns.
    let table = fleet.kubectl(&["get", "dso", "nginx"]).await;
    assert!(table.contains("nginx") && table.contains("10"), "{table}");

    // --- Follows /scale changes: ceil(25 / 5) = 5 → 2:3.
    let changed = Instant::now();
    hub.set_metric("default", "nginx", "0", 25.0);
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[2, 3], "2:3 of 5")
        .await;
    eprintln!(
        "scale change to replicas in all members: {:?}",
        changed.elapsed()
    );

    // --- kubectl scale on a DSO whose trigger KEDA cannot read (so KEDA leaves /scale alone).
    // `web` lists no members: every registered member takes part; member-3 has no `web`.
    apply(&fleet, &dso_yaml("web", "", "absent"), "web.yaml").await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    let web = wait_for(LIMIT, "web: member-3 reported missing", || async {
        let s = fleet.dso("web")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "WorkloadMissing").then_some(s)
    })
    .await;
    let m3 = &web["memberClusterStatuses"]["member-3"];
    assert!(
        m3["description"]
            .as_str()
            .unwrap()
            .contains("Deployment default/web not found"),
        "{web:#}"
    );
    fleet.wait_event("web", "WorkloadMissing", "member-3").await;
    // After gracePeriod member-3's share moves to the others; nothing is created there.
    fleet
        .wait_split("web", &["member-1", "member-2"], &[3, 3], "web 3:3")
        .await;
    assert_eq!(fleet.replicas("member-3", "web"), None, "never created");
    fleet.kubectl(&["scale", "dso/web", "--replicas=4"]).await;
    fleet
        .wait_split("web", &["member-1", "member-2"], &[2, 2], "web 2:2")
        .await;

    // --- An agent refusing a namespace shows in status.
    apply(
        &fleet,
        &dso_yaml(
            "guarded",
            "  memberClusters:\n  - {name: member-3, targetNamespace: restricted}",
            "absent",
        ),
        "guarded.yaml",
    )
    .await;
    let guarded = wait_for(LIMIT, "guarded: refused by member-3", || async {
        let s = fleet.dso("guarded")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "Refused").then_some(s)
    })
    .await;
    let description = guarded["memberClusterStatuses"]["member-3"]["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(description.contains("NamespaceNotAllowed"), "{guarded:#}");
    assert_eq!(guarded["membersHealthyCount"], 0);
    fleet
        .wait_event("guarded", "CommandRefused", "NamespaceNotAllowed")
        .await;

    // --- A `Value` metric is refused with a clear message; nothing is sent to members.
    let valued = dso_yaml(
        "valued",
        "  memberClusters:\n  - {name: member-1}",
        "absent",
    )
    .replace(
        "        targetValue: \"5\"\n",
        "        targetValue: \"5\"\n      metricType: Value\n",
    );
    assert!(valued.contains("metricType: Value"), "{valued}");
    apply(&fleet, &valued, "valued.yaml").await;
    let message = wait_for(LIMIT, "valued: Ready=False", || async {
        let s = fleet.dso("valued")["status"].clone();
        condition(&s, "Ready")
            .filter(|c| c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(
        message.contains("spec.scaledObjectSpec.triggers[0].metricType")
            && message.contains("AverageValue"),
        "{message}"
    );
    fleet
        .wait_event("valued", "InvalidSpec", "metricType")
        .await;
    assert!(
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "valued")
            .is_none(),
        "no child ScaledObject for an invalid DSO"
    );

    // --- Pause: nothing changes in members while the total moves.
    fleet
        .kubectl(&["annotate", "dso/nginx", "autoscaling.keda.sh/paused=true"])
        .await;
    wait_for(LIMIT, "Paused condition", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["status"] == "True")
            .then_some(())
    })
    .await;
    hub.set_metric("default", "nginx", "0", 40.0);
    wait_for(LIMIT, "KEDA to set the total to 8", || async {
        (fleet.dso("nginx")["spec"]["totalTargetReplicas"] == 8).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        fleet.split("nginx", &["member-1", "member-2"]),
        [Some(2), Some(3)],
        "paused"
    );

    // An invalid paused-replicas: clear error in status and an Event, nothing changed.
    fleet
        .kubectl(&[
            "annotate",
            "dso/nginx",
            "autoscaling.keda.sh/paused-replicas=three",
        ])
        .await;
    let invalid = wait_for(LIMIT, "Ready=False for paused-replicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Ready")
            .filter(|c| c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(
        invalid.contains("autoscaling.keda.sh/paused-replicas")
            && invalid.contains("non-negative integer"),
        "{invalid}"
    );
    fleet
        .wait_event("nginx", "InvalidSpec", "paused-replicas")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.split("nginx", &["member-1", "member-2"]),
        [Some(2), Some(3)]
    );

    // paused-replicas wins over paused and fixes the total; it is copied to the child.
    fleet
        .kubectl(&[
            "annotate",
            "--overwrite",
            "dso/nginx",
            "autoscaling.keda.sh/paused-replicas=10",
        ])
        .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "paused at 10")
        .await;
    let so = fleet
        .hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")
        .unwrap();
    assert_eq!(
        so["metadata"]["annotations"]["autoscaling.keda.sh/paused-replicas"],
        "10"
    );
    wait_for(LIMIT, "Paused reason PausedAtReplicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["reason"] == "PausedAtReplicas")
            .then_some(())
    })
    .await;

    // Resume: the metric says 10 again.
    hub.set_metric("default", "nginx", "0", 50.0);
    fleet
        .kubectl(&[
            "annotate",
            "dso/nginx",
            "autoscaling.keda.sh/paused-",
            "autoscaling.keda.sh/paused-replicas-",
        ])
        .await;
    wait_for(LIMIT, "Paused=False", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["status"] == "False")
            .then_some(())
    })
    .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "resumed")
        .await;

    // --- member-1's agent is cut off: fail-static, its share moves after gracePeriod.
    agents[0].signal("KILL");
    let _ = agents[0].child.wait().await;
    let killed = Instant::now();
    wait_for_states(fleet.ports, &["member-1"], "Unreachable", LIMIT).await;
    let moved = wait_for(LIMIT, "member-2 to take the whole total", || async {
        (fleet.replicas("member-2", "nginx") == Some(10)).then(Instant::now)
    })
    .await;
    let after = moved.duration_since(killed);
    assert!(
        after >= GRACE,
        "share moved {after:?} after the cut, before the grace period"
    );
    assert!(
        after <= DETECTION + GRACE + Duration::from_secs(3),
        "{after:?}"
    );
    assert_eq!(
        fleet.replicas("member-1", "nginx"),
        Some(4),
        "fail-static: the cut-off member keeps its pods"
    );
    let s = fleet.dso("nginx")["status"].clone();
    assert_eq!(
        s["memberClusterStatuses"]["member-1"]["state"],
        "Unreachable"
    );
    assert_eq!(s["memberClusterStatuses"]["member-1"]["desiredReplicas"], 0);
    assert_eq!(s["membersHealthyCount"], 1);
    fleet.wait_event("nginx", "MemberLost", "member-1").await;

    // It returns: replicas go back by weight.
    agents[0] = fleet.start_agent("member-1", None, "member-1-again.log");
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "back to 4:6")
        .await;
    fleet
        .wait_event("nginx", "MemberReturned", "member-1")
        .await;

    // --- Restarting the hub changes nothing that was correct.
    wait_for(LIMIT, "status settled before the restart", || async {
        let s = fleet.dso("nginx")["status"].clone();
        let w = fleet.dso("web")["status"].clone();
        let web_back = ["member-1", "member-2"]
            .iter()
            .all(|m| w["memberClusterStatuses"][m]["state"] == "Ready")
            && w["totalCurrentReplicas"] == 4;
        (s["membersHealthyCount"] == 2 && s["totalCurrentReplicas"] == 10 && web_back).then_some(())
    })
    .await;
    let before: Vec<Vec<Option<i64>>> = ["nginx", "web"]
        .iter()
        .map(|n| fleet.split(n, &MEMBERS))
        .collect();
    drop(_hub);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _hub = fleet.start_hub("hub-2.log");
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(4) {
        let now: Vec<Vec<Option<i64>>> = ["nginx", "web"]
            .iter()
            .map(|n| fleet.split(n, &MEMBERS))
            .collect();
        assert_eq!(now, before, "a hub restart changed replicas");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;
    // The new hub still follows /scale.
    hub.set_metric("default", "nginx", "0", 25.0);
    fleet
        .wait_split(
            "nginx",
            &["member-1", "member-2"],
            &[2, 3],
            "2:3 after restart",
        )
        .await;

    // --- MemberCluster objects show the sessions.
    let mc = wait_for(LIMIT, "MemberCluster member-2 status", || async {
        let m = hub.object("kedge.dev/v1alpha1", "MemberCluster", "", "member-2")?;
        (m["status"]["state"] == "Ready" && m["status"]["capacity"].is_object()).then_some(m)
    })
    .await;
    assert_eq!(mc["status"]["agentVersion"], env!("CARGO_PKG_VERSION"));
    assert!(
        mc["status"]["kubernetesVersion"]
            .as_str()
            .unwrap()
            .starts_with('v')
    );
    assert!(mc["status"]["lastHeartbeatTime"].is_string());
    assert!(mc["status"]["certificateExpiry"].is_string());
    let table = fleet.kubectl(&["get", "mc"]).await;
    assert!(
        table.contains("member-3") && table.contains("Ready"),
        "{table}"
    );

    // --- The missing Deployment appears in member-3: it is Ready again and takes its share.
    deployment(&fleet.sim, "member-3", "web", 1).await;
    let web = wait_for(LIMIT, "web rebalanced onto member-3", || async {
        let split = fleet.split("web", &MEMBERS);
        let s = fleet.dso("web")["status"].clone();
        let ready = s["memberClusterStatuses"]["member-3"]["state"] == "Ready";
        let total: i64 = split.iter().flatten().sum();
        (ready && total == 4 && split.iter().all(|r| r.is_some_and(|r| r >= 1))).then_some(split)
    })
    .await;
    fleet.wait_event("web", "MemberReturned", "member-3").await;

    // --- It is deleted again: the others hold their replicas for the grace period, then
    // take member-3's share.
    let others = |split: &[Option<i64>]| split[..2].to_vec();
    let held = others(&web);
    Api::<Deployment>::namespaced(
        fleet.sim.cluster("member-3").unwrap().client().unwrap(),
        "default",
    )
    .delete("web", &Default::default())
    .await
    .unwrap();
    wait_for(LIMIT, "web: member-3 missing again", || async {
        let s = fleet.dso("web")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "WorkloadMissing").then_some(())
    })
    .await;
    let missing_since = Instant::now();
    let moved = wait_for(LIMIT, "web: member-3's share moved", || async {
        let split = fleet.split("web", &MEMBERS);
        let total: i64 = split[..2].iter().flatten().sum();
        if total != 4 {
            if missing_since.elapsed() < GRACE - Duration::from_millis(500) {
                assert_eq!(others(&split), held, "moved before the grace period");
            }
            return None;
        }
        Some(missing_since.elapsed())
    })
    .await;
    assert!(
        moved >= GRACE - Duration::from_millis(500),
        "share moved {moved:?} after the workload was reported missing"
    );
    let web = fleet.split("web", &MEMBERS);

    // --- Deleting a DSO deletes its child ScaledObject and leaves the members' pods.
    fleet.kubectl(&["delete", "dso/web", "--wait=true"]).await;
    wait_for(LIMIT, "child ScaledObject web to go", || async {
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "web")
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.split("web", &MEMBERS),
        web,
        "members keep their replicas"
    );

    // One member was lost once; the hub restart added no lost member to status or Events.
    let lost: Vec<_> = fleet
        .events("nginx")
        .into_iter()
        .filter(|(reason, _)| reason == "MemberLost")
        .collect();
    assert_eq!(lost.len(), 1, "{lost:#?}");
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
