//! The live demo of `kedge-sim up` (without `--headless`): the example DSO on a three-member
//! fleet, a scripted metric, one member cut off and returning, and a terminal view of how
//! replicas move.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::fleet::{Fleet, HUB_CLUSTER};
use crate::{Error, Result};

const DSO_YAML: &str = include_str!("../../deploy/examples/fleet/dso-nginx.yaml");
const DSJ_YAML: &str = include_str!("../../deploy/examples/fleet/dsj-queue.yaml");
const DEPLOYMENT_YAML: &str = include_str!("../../deploy/examples/fleet/nginx-deployment.yaml");
const FIELD_MANAGER: &str = "kedge-demo";
/// Name of the example DSJ (`dsj-queue.yaml`).
pub const DSJ_NAME: &str = "queue-worker";

fn documents(yaml: &str) -> Result<Vec<Value>> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).map_err(|e| Error::Fleet(format!("example YAML: {e}"))))
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Installs the example: the Deployment in every member; the DSO, the DSJ and the
/// ConfigMaps they read on the hub.
pub async fn install_example(fleet: &Fleet) -> Result<()> {
    for member in fleet.members() {
        let client = cluster_client(fleet, &member)?;
        let deployments: Api<Deployment> = Api::namespaced(client, "default");
        for doc in documents(DEPLOYMENT_YAML)? {
            deployments
                .patch("nginx", &apply_params(), &Patch::Apply(&doc))
                .await?;
        }
    }
    let hub = cluster_client(fleet, HUB_CLUSTER)?;
    for doc in documents(DSO_YAML)?.into_iter().chain(documents(DSJ_YAML)?) {
        apply_on_hub(&hub, &doc).await?;
    }
    Ok(())
}

async fn apply_on_hub(hub: &kube::Client, doc: &Value) -> Result<()> {
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let patch = Patch::Apply(doc);
    match doc["kind"].as_str() {
        Some("ConfigMap") => {
            let api: Api<ConfigMap> = Api::namespaced(hub.clone(), "default");
            api.patch(name, &apply_params(), &patch).await?;
        }
        Some("DistributedScaledObject") => {
            let api: Api<DistributedScaledObject> = Api::namespaced(hub.clone(), "default");
            api.patch(name, &apply_params(), &patch).await?;
        }
        Some("DistributedScaledJob") => {
            let api: Api<DistributedScaledJob> = Api::namespaced(hub.clone(), "default");
            api.patch(name, &apply_params(), &patch).await?;
        }
        other => {
            return Err(Error::Fleet(format!(
                "unexpected kind {other:?} in the example"
            )));
        }
    }
    Ok(())
}

fn cluster_client(fleet: &Fleet, name: &str) -> Result<kube::Client> {
    fleet
        .sim
        .cluster(name)
        .ok_or_else(|| Error::Fleet(format!("no cluster {name}")))?
        .client()
}

async fn set_metric(hub: &kube::Client, value: u32) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(hub.clone(), "default");
    let patch = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"metric-value": value.to_string()}});
    api.patch("mock-metric", &apply_params(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

async fn signal(pid: Option<u32>, signal: &str) {
    if let Some(pid) = pid {
        let _ = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .await;
    }
}

/// One step of the script: at `at` seconds, do `action`.
#[derive(Debug, Clone, Copy)]
enum Action {
    Metric(u32),
    CutOff,
    Reconnect,
}

const SCRIPT: [(u64, Action, &str); 6] = [
    (
        0,
        Action::Metric(5),
        "metric 5: one replica per 5 → 1 replica",
    ),
    (
        12,
        Action::Metric(20),
        "metric 20 → 4 replicas, split 2:3:5",
    ),
    (24, Action::Metric(45), "metric 45 → 9 replicas"),
    (
        40,
        Action::CutOff,
        "member-3 cut off (agent frozen): Unreachable in 3 s, share moves after 20 s grace; pods keep running",
    ),
    (
        75,
        Action::Reconnect,
        "member-3's agent is back: replicas rebalance by weight",
    ),
    (95, Action::Metric(10), "metric 10 → 2 replicas"),
];
const SCRIPT_LENGTH: u64 = 115;

/// Runs the script and redraws the view every second until `stop` resolves.
pub async fn live_view(fleet: &Fleet, stop: impl std::future::Future<Output = ()>) -> Result<()> {
    let hub = cluster_client(fleet, HUB_CLUSTER)?;
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub.clone(), "default");
    let start = Instant::now();
    let mut done = 0usize;
    let mut cycle_start = 0u64;
    let mut log: Vec<String> = Vec::new();
    tokio::pin!(stop);
    loop {
        let t = start.elapsed().as_secs();
        if t >= cycle_start + SCRIPT_LENGTH {
            cycle_start = t;
            done = 0;
        }
        while let Some((at, action, text)) = SCRIPT.get(done).copied() {
            if t < cycle_start + at {
                break;
            }
            match action {
                Action::Metric(v) => set_metric(&hub, v).await?,
                Action::CutOff => signal(fleet.agent_pid("member-3"), "STOP").await,
                Action::Reconnect => signal(fleet.agent_pid("member-3"), "CONT").await,
            }
            log.push(format!("[{t:>3}s] {text}"));
            if log.len() > 6 {
                log.remove(0);
            }
            done += 1;
        }
        let dso = dsos.get_opt("nginx").await.ok().flatten();
        let view = render(dso.as_ref(), &log, t);
        print!("\x1b[2J\x1b[H{view}");
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    // Never leave an agent frozen behind.
    signal(fleet.agent_pid("member-3"), "CONT").await;
    Ok(())
}

/// Renders the DSO's state as the view's text.
pub fn render(dso: Option<&DistributedScaledObject>, log: &[String], t: u64) -> String {
    let mut out = format!("kedge fleet demo  t={t}s  (Ctrl-C to stop)\n\n");
    let Some(dso) = dso else {
        out.push_str("waiting for DistributedScaledObject default/nginx...\n");
        return out;
    };
    let status = dso.status.clone().unwrap_or_default();
    out.push_str(&format!(
        "dso/nginx  desired total {}   current total {}   healthy members {}/{}\n\n",
        dso.spec
            .total_target_replicas
            .map_or_else(|| "(not set yet)".to_owned(), |t| t.to_string()),
        status.total_current_replicas,
        status.members_healthy_count,
        status.members_total_count
    ));
    out.push_str(&format!(
        "{:<10} {:<12} {:>7} {:>7}  {}\n",
        "MEMBER", "STATE", "DESIRED", "CURRENT", "REPLICAS"
    ));
    for (member, s) in &status.member_cluster_statuses {
        let bar = "█".repeat(s.current_replicas.clamp(0, 40) as usize);
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7}  {}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.desired_replicas,
            s.current_replicas,
            bar
        ));
    }
    out.push_str("\nwhat happened:\n");
    for line in log {
        out.push_str(line);
        out.push('\n');
    }
    out
}
