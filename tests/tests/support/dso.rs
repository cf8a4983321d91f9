//! The DSO end-to-end harness: a simulated hub cluster (kedge and KEDA CRDs, KEDA emulated)
//! and member clusters in-process, the real `kedge-hub` and `kedge-agent` binaries and the
//! real `kubectl`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kedge_sim::{Sim, SimConfig};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use super::*;

/// Heartbeat interval of the hub in these tests.
pub const HEARTBEAT: &str = "200ms";
/// Heartbeat interval × tolerance (3): how long until a silent agent is Unreachable.
pub const DETECTION: Duration = Duration::from_millis(600);
/// `gracePeriod` of the DSOs `dso_yaml` writes.
pub const GRACE: Duration = Duration::from_secs(3);
/// Longest wait for any one step.
pub const LIMIT: Duration = Duration::from_secs(15);

pub struct Fleet {
    pub members: Vec<String>,
    pub dir: PathBuf,
    pub pki: Pki,
    pub sim: Sim,
    pub ports: HubPorts,
}

impl Fleet {
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        self.dir.join(format!("{cluster}.kubeconfig"))
    }

    /// Creates the `MemberCluster` of `member` in the hub cluster.
    pub async fn register(&self, member: &str) {
        let path = self.dir.join(format!("mc-{member}.yaml"));
        std::fs::write(&path, member_cluster_yaml(member)).unwrap();
        self.kubectl(&["apply", "-f", path.to_str().unwrap()]).await;
    }

    pub fn start_hub(&self, log: &str) -> Proc {
        self.start_hub_at(self.ports, log)
    }

    /// A hub with extra flags.
    pub fn start_hub_with(&self, log: &str, extra: &[&str]) -> Proc {
        let hub = self.kubeconfig("hub").display().to_string();
        let mut flags = vec!["--kubeconfig", &hub, "--lease-namespace", "kedge-system"];
        flags.extend_from_slice(extra);
        start_hub_with(&self.pki, self.ports, HEARTBEAT, self.dir.join(log), &flags)
    }

    /// A hub (one of several competing for the Lease) listening on `ports`.
    pub fn start_hub_at(&self, ports: HubPorts, log: &str) -> Proc {
        let hub = self.kubeconfig("hub").display().to_string();
        // The Lease lives where the chart would put it.
        let flags = ["--kubeconfig", &hub, "--lease-namespace", "kedge-system"];
        start_hub_with(&self.pki, ports, HEARTBEAT, self.dir.join(log), &flags)
    }

    /// An agent for `member` acting in `namespaces` (comma-separated), or in every
    /// namespace (`--all-namespaces`) when `None`.
    pub fn start_agent(&self, member: &str, namespaces: Option<&str>, log: &str) -> Proc {
        self.start_agent_as(member, &self.kubeconfig(member), namespaces, log)
    }

    /// An agent for `member` that knows several hubs (`--hub A,B`).
    pub fn start_agent_to(&self, member: &str, hubs: &[HubPorts], log: &str) -> Proc {
        self.agent(member, &self.kubeconfig(member), hubs, None, log)
    }

    /// An agent for `member` acting through the kubeconfig at `kubeconfig`.
    pub fn start_agent_as(
        &self,
        member: &str,
        kubeconfig: &Path,
        namespaces: Option<&str>,
        log: &str,
    ) -> Proc {
        self.agent(member, kubeconfig, &[self.ports], namespaces, log)
    }

    /// [`Fleet::start_agent`] with extra agent flags (e.g. `--kinds`).
    pub fn start_agent_flags(
        &self,
        member: &str,
        namespaces: Option<&str>,
        extra: &[&str],
        log: &str,
    ) -> Proc {
        let kubeconfig = self.kubeconfig(member);
        self.agent_with(member, &kubeconfig, &[self.ports], namespaces, extra, log)
    }

    fn agent(
        &self,
        member: &str,
        kubeconfig: &Path,
        hubs: &[HubPorts],
        namespaces: Option<&str>,
        log: &str,
    ) -> Proc {
        self.agent_with(member, kubeconfig, hubs, namespaces, &[], log)
    }

    fn agent_with(
        &self,
        member: &str,
        kubeconfig: &Path,
        hubs: &[HubPorts],
        namespaces: Option<&str>,
        extra: &[&str],
        log: &str,
    ) -> Proc {
        let p = &self.pki;
        let hubs: Vec<String> = hubs.iter().map(|h| h.quic_addr().to_string()).collect();
        let mut args = vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--hub".into(),
            hubs.join(","),
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
            // A revoked RoleBinding is noticed when a watch is renewed.
            "--watch-timeout".into(),
            "1s".into(),
        ];
        match namespaces {
            Some(ns) => args.extend(["--namespaces".into(), ns.into()]),
            None => args.push("--all-namespaces".into()),
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        Proc::spawn(&bin("kedge-agent"), &args, self.dir.join(log))
    }

    /// `.spec.replicas` of a Deployment in a member, `None` when it does not exist.
    pub fn replicas(&self, member: &str, name: &str) -> Option<i64> {
        self.sim
            .cluster(member)?
            .object("apps/v1", "Deployment", "default", name)?
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
    }

    pub fn split(&self, name: &str, members: &[&str]) -> Vec<Option<i64>> {
        members.iter().map(|m| self.replicas(m, name)).collect()
    }

    pub fn hub_object(&self, api_version: &str, kind: &str, name: &str) -> Option<Value> {
        self.sim
            .cluster("hub")?
            .object(api_version, kind, "default", name)
    }

    pub fn dso(&self, name: &str) -> Value {
        self.hub_object("kedge.dev/v1alpha1", "DistributedScaledObject", name)
            .unwrap_or(Value::Null)
    }

    pub async fn kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.kubeconfig("hub"), args).await
    }

    /// Waits until the members' `.spec.replicas` of `name` are `want`.
    pub async fn wait_split(&self, name: &str, members: &[&str], want: &[i64], what: &str) {
        let want: Vec<Option<i64>> = want.iter().map(|w| Some(*w)).collect();
        wait_for(LIMIT, what, || async {
            (self.split(name, members) == want).then_some(())
        })
        .await;
    }

    /// Event reasons recorded for `name` in the hub.
    pub fn events(&self, name: &str) -> Vec<(String, String)> {
        let Some(hub) = self.sim.cluster("hub") else {
            return vec![];
        };
        let store = hub.shared().store();
        store
            .list(kedge_sim::events::KEY, Some("default"))
            .map(|e| kedge_sim::events::convert(e, kedge_sim::events::EVENTS_V1))
            .filter(|e| e.pointer("/regarding/name").and_then(Value::as_str) == Some(name))
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    pub async fn wait_event(&self, name: &str, reason: &str, note_contains: &str) {
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

pub async fn kubectl(kc: &Path, args: &[&str]) -> String {
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

pub async fn deployment(sim: &Sim, member: &str, name: &str, replicas: i32) {
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

pub fn dso_yaml(name: &str, members: &str, trigger_resource: &str) -> String {
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

pub async fn apply(fleet: &Fleet, yaml: &str, file: &str) {
    let path = fleet.dir.join(file);
    std::fs::write(&path, yaml).unwrap();
    fleet
        .kubectl(&["apply", "-f", path.to_str().unwrap()])
        .await;
}

pub async fn start(members: &[&str]) -> (tempfile::TempDir, Fleet) {
    start_with(members, |_| {}).await
}

/// [`start`] with the simulator's settings adjusted by `tune`.
pub async fn start_with(
    members: &[&str],
    tune: impl FnOnce(&mut SimConfig),
) -> (tempfile::TempDir, Fleet) {
    let mut dir = tempfile::tempdir().unwrap();
    // Logs of the hub and agents stay for a look after a failure.
    if std::env::var_os("KEDGE_E2E_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("logs in {}", dir.path().display());
    }
    let pki = Pki::create(dir.path(), members).await;
    let mut names = vec!["hub".to_owned()];
    names.extend(members.iter().map(|m| m.to_string()));
    let mut config = SimConfig {
        pod_start_delay: Duration::from_millis(100),
        bookmark_interval: Duration::from_millis(500),
        ..SimConfig::default()
    };
    tune(&mut config);
    let sim = Sim::start(&names, config, Some(dir.path())).await.unwrap();
    let fleet = Fleet {
        members: members.iter().map(|m| m.to_string()).collect(),
        dir: dir.path().to_owned(),
        pki,
        sim,
        ports: HubPorts::new(),
    };
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    fleet.kubectl(&["apply", "-f", crds]).await;
    let keda = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sim/assets/scaledobject-crd.yaml"
    );
    fleet.kubectl(&["apply", "-f", keda]).await;
    // The hub's namespace, where its Lease lives (the Helm chart creates it).
    fleet
        .kubectl(&["create", "namespace", "kedge-system"])
        .await;
    // Only members with a MemberCluster get a session.
    for member in members {
        fleet.register(member).await;
    }
    (dir, fleet)
}

/// DSJ `default/work` over member-1 and member-2 (weights 2:3): one Job per item of the
/// queue in ConfigMap `queue_resource` (key `length`, see [`set_queue`]).
pub fn dsj_yaml(queue_resource: &str) -> String {
    format!(
        r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledJob
metadata: {{name: work, namespace: default, labels: {{team: a}}}}
spec:
  memberClusters:
  - {{name: member-1, weight: 2}}
  - {{name: member-2, weight: 3}}
  scaledJobSpec:
    pollingInterval: 1
    maxReplicaCount: 50
    jobTargetRef:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: worker, image: busybox}}]
    triggers:
    - type: kubernetes-resource
      name: queue
      metadata: {{resourceKind: ConfigMap, resourceName: {queue_resource}, key: length, targetValue: "1"}}
"#
    )
}

/// Sets the length of the queue the DSJ tests scale on: the key `length` of the ConfigMap
/// `default/queue` in the hub cluster, which their `kubernetes-resource` trigger reads.
pub async fn set_queue(fleet: &Fleet, length: u64) {
    let client = fleet.sim.cluster("hub").unwrap().client().unwrap();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "queue", "namespace": "default"},
        "data": {"length": length.to_string()}});
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, "default")
        .patch(
            "queue",
            &kube::api::PatchParams::apply("test").force(),
            &kube::api::Patch::Apply(&cm),
        )
        .await
        .unwrap();
}

/// A `MemberCluster` named `member`, as enrollment creates it.
pub fn member_cluster_yaml(member: &str) -> String {
    format!(
        "apiVersion: kedge.dev/v1alpha1\nkind: MemberCluster\nmetadata:\n  name: {member}\nspec: {{}}\n"
    )
}

/// The condition `type_` of a status.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
