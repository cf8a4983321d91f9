//! The live demo of `kedge-sim up` (without `--headless`): the example DSO and DSJ on a
//! three-member fleet, a scripted metric and queue, one member cut off and returning, and a
//! terminal view of how replicas and Jobs move. Its inference scene: simulated vLLM engines
//! ([`crate::engines`]) share a scripted queue of waiting requests, and the DSO `vllm`
//! scales them on what they say (a `kedge-pod-metrics` trigger).

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::engines::Demand;
use crate::fleet::{Fleet, HUB_CLUSTER};
use crate::{Error, Result};
use tokio_util::sync::CancellationToken;

const DSO_YAML: &str = include_str!("../../deploy/examples/fleet/dso-nginx.yaml");
const DSJ_YAML: &str = include_str!("../../deploy/examples/fleet/dsj-queue.yaml");
const DEPLOYMENT_YAML: &str = include_str!("../../deploy/examples/fleet/nginx-deployment.yaml");
const VLLM_DSO_YAML: &str = include_str!("../../deploy/examples/fleet/dso-vllm.yaml");
const VLLM_DEPLOYMENT_YAML: &str = include_str!("../../deploy/examples/fleet/vllm-deployment.yaml");
/// Name of the inference example's DSO (`dso-vllm.yaml`).
pub const INFERENCE_DSO_NAME: &str = "vllm";
const FIELD_MANAGER: &str = "kedge-demo";
/// Name of the example DSO (`dso-nginx.yaml`).
pub const DSO_NAME: &str = "nginx";
/// Name of the example DSJ (`dsj-queue.yaml`).
pub const DSJ_NAME: &str = "queue-worker";
const METRIC_CONFIGMAP: (&str, &str) = ("mock-metric", "metric-value");
const QUEUE_CONFIGMAP: (&str, &str) = ("work-queue", "length");

fn documents(yaml: &str) -> Result<Vec<Value>> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).map_err(|e| Error::Fleet(format!("example YAML: {e}"))))
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Installs the example: the Deployments (`nginx`, `vllm`) in every member; the DSOs, the
/// DSJ and the ConfigMaps they read on the hub.
pub async fn install_example(fleet: &Fleet) -> Result<()> {
    for member in fleet.members() {
        let client = cluster_client(fleet, &member)?;
        let deployments: Api<Deployment> = Api::namespaced(client, "default");
        for doc in documents(DEPLOYMENT_YAML)?
            .into_iter()
            .chain(documents(VLLM_DEPLOYMENT_YAML)?)
        {
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            deployments
                .patch(&name, &apply_params(), &Patch::Apply(&doc))
                .await?;
        }
    }
    let hub = cluster_client(fleet, HUB_CLUSTER)?;
    for doc in documents(DSO_YAML)?
        .into_iter()
        .chain(documents(DSJ_YAML)?)
        .chain(documents(VLLM_DSO_YAML)?)
    {
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

/// Sets `key` of ConfigMap `name` on the hub, the value a `kubernetes-resource` trigger
/// reads.
async fn set_value(hub: &kube::Client, (name, key): (&str, &str), value: u32) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(hub.clone(), "default");
    let patch = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {key: value.to_string()}});
    api.patch(name, &apply_params(), &Patch::Apply(&patch))
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

/// Makes a member's nodes unschedulable (`full`) or schedulable again, like `kubectl
/// cordon`: new pods there stay Pending, running ones go on.
async fn set_full(fleet: &Fleet, member: &str, full: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster_client(fleet, member)?);
    let patch = json!({"spec": {"unschedulable": full}});
    for node in nodes.list(&ListParams::default()).await? {
        let name = node.metadata.name.unwrap_or_default();
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// One step of the script: at `at` seconds, do `action`.
#[derive(Debug, Clone, Copy)]
enum Action {
    /// The DSO's metric.
    Metric(u32),
    /// The DSJ's queue length.
    Queue(u32),
    /// member-2's nodes cordoned (`true`) or uncordoned.
    Member2Full(bool),
    /// member-3's agent frozen.
    CutOff,
    /// member-3's agent running again.
    Reconnect,
    /// Requests waiting across the inference fleet.
    Demand(u32),
    /// Nothing to do: the text says what the view shows by now.
    Note,
}

/// The DSO and DSJ steps on one timeline; each text says what was seen to happen on the
/// local fleet. The DSJ's Jobs run 15 s each, so every queue of 10 is back to 0 before its
/// Jobs finish (a queue that stays at 10 would get 10 new Jobs each time they do).
const SCRIPT: [(u64, Action, &str); 19] = [
    (
        0,
        Action::Metric(5),
        "metric 5: one replica per 5 → 1 replica",
    ),
    (
        1,
        Action::Demand(30),
        "inference: 30 requests waiting on 1 engine → 3 engines, 10 each",
    ),
    (3, Action::Queue(10), "queue 10 → 10 Jobs, split 2:3:5"),
    (
        12,
        Action::Metric(20),
        "metric 20 → 4 replicas, split 2:3:5",
    ),
    (
        13,
        Action::Queue(0),
        "queue 0: no new Jobs; each member keeps its last 2 finished Jobs",
    ),
    (
        20,
        Action::Demand(80),
        "inference: 80 waiting → 8 engines (only above 11 per engine does it scale up)",
    ),
    (24, Action::Metric(45), "metric 45 → 9 replicas"),
    (
        40,
        Action::CutOff,
        "member-3 cut off (agent frozen): Unreachable in 3 s, share moves after 20 s grace; pods keep running",
    ),
    (
        46,
        Action::Queue(10),
        "queue 10, member-3 unreachable → 10 Jobs, split 2:3 over member-1 and member-2",
    ),
    (56, Action::Queue(0), "queue 0"),
    (
        58,
        Action::Note,
        "inference: member-3's engines count as missing, never as idle: no scale-down",
    ),
    (
        75,
        Action::Reconnect,
        "member-3's agent is back: replicas rebalance by weight",
    ),
    (
        78,
        Action::Member2Full(true),
        "member-2 full (nodes cordoned): new pods there stay Pending",
    ),
    (
        80,
        Action::Queue(10),
        "queue 10 → 2:3:5, but member-2's 3 Jobs stay Pending",
    ),
    (
        89,
        Action::Note,
        "stuck after 5 s: member-2 soft-tainted; its Jobs re-created in member-1/3, the stuck ones deleted",
    ),
    (90, Action::Queue(0), "queue 0"),
    (95, Action::Metric(10), "metric 10 → 2 replicas"),
    (
        96,
        Action::Demand(10),
        "inference: 10 waiting → down to 1 engine (only below 5 per engine does it scale down)",
    ),
    (
        100,
        Action::Member2Full(false),
        "member-2 has room again (its soft taint lasts 1 min)",
    ),
];
const SCRIPT_LENGTH: u64 = 115;
/// Lines of the script's log the view keeps.
const LOG_LINES: usize = 8;

/// Runs the script and redraws the view every second until `stop` resolves.
pub async fn live_view(fleet: &Fleet, stop: impl std::future::Future<Output = ()>) -> Result<()> {
    let demand = Demand::default();
    let engines_stop = CancellationToken::new();
    let members = fleet.members();
    let engines = crate::engines::serve(&fleet.sim, &members, demand.clone(), engines_stop.clone());
    let script = async {
        let outcome = script(fleet, &demand, stop).await;
        engines_stop.cancel();
        outcome
    };
    let ((), outcome) = tokio::join!(engines, script);
    outcome
}

async fn script(
    fleet: &Fleet,
    demand: &Demand,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let hub = cluster_client(fleet, HUB_CLUSTER)?;
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub.clone(), "default");
    let dsjs: Api<DistributedScaledJob> = Api::namespaced(hub.clone(), "default");
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
                Action::Metric(v) => set_value(&hub, METRIC_CONFIGMAP, v).await?,
                Action::Queue(v) => set_value(&hub, QUEUE_CONFIGMAP, v).await?,
                Action::Member2Full(full) => set_full(fleet, "member-2", full).await?,
                Action::CutOff => signal(fleet.agent_pid("member-3"), "STOP").await,
                Action::Reconnect => signal(fleet.agent_pid("member-3"), "CONT").await,
                Action::Demand(v) => demand.set(v),
                Action::Note => {}
            }
            log.push(format!("[{t:>3}s] {text}"));
            if log.len() > LOG_LINES {
                log.remove(0);
            }
            done += 1;
        }
        let dso = dsos.get_opt(DSO_NAME).await.ok().flatten();
        let dsj = dsjs.get_opt(DSJ_NAME).await.ok().flatten();
        let inference = dsos.get_opt(INFERENCE_DSO_NAME).await.ok().flatten();
        let mut view = render(dso.as_ref(), dsj.as_ref(), &log, t);
        if let Some(at) = view.find("\nwhat happened:") {
            view.insert_str(
                at,
                &format!("\n{}", render_inference(inference.as_ref(), demand.get())),
            );
        }
        print!("\x1b[2J\x1b[H{view}");
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    // Never leave an agent frozen or a member full behind.
    signal(fleet.agent_pid("member-3"), "CONT").await;
    set_full(fleet, "member-2", false).await?;
    Ok(())
}

/// The whole view: a header, the DSO, the DSJ and the script's log.
pub fn render(
    dso: Option<&DistributedScaledObject>,
    dsj: Option<&DistributedScaledJob>,
    log: &[String],
    t: u64,
) -> String {
    let mut out = format!("kedge fleet demo  t={t}s  (Ctrl-C to stop)\n\n");
    out.push_str(&render_dso(dso));
    out.push('\n');
    out.push_str(&render_dsj(dsj));
    out.push_str("\nwhat happened:\n");
    for line in log {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A bar of `n` blocks, at most 40.
fn bar(block: &str, n: i32) -> String {
    block.repeat(n.clamp(0, 40) as usize)
}

/// The DSO's section: totals, then desired and current replicas per member.
pub fn render_dso(dso: Option<&DistributedScaledObject>) -> String {
    let Some(dso) = dso else {
        return format!("waiting for DistributedScaledObject default/{DSO_NAME}...\n");
    };
    let status = dso.status.clone().unwrap_or_default();
    let mut out = format!(
        "dso/{}  desired total {}   current total {}   healthy members {}/{}\n\n",
        dso.name_any(),
        dso.spec
            .total_target_replicas
            .map_or_else(|| "(not set yet)".to_owned(), |t| t.to_string()),
        status.total_current_replicas,
        status.members_healthy_count,
        status.members_total_count
    );
    out.push_str(&format!(
        "{:<10} {:<12} {:>7} {:>7}  {}\n",
        "MEMBER", "STATE", "DESIRED", "CURRENT", "REPLICAS"
    ));
    for (member, s) in &status.member_cluster_statuses {
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7}  {}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.desired_replicas,
            s.current_replicas,
            bar("█", s.current_replicas)
        ));
    }
    out
}

/// The inference scene's section: the queue, the fleet's per-engine average the hub serves
/// KEDA, and the engines per member with the pods each counted or missed.
pub fn render_inference(dso: Option<&DistributedScaledObject>, demand: u32) -> String {
    let Some(dso) = dso else {
        return format!("waiting for DistributedScaledObject default/{INFERENCE_DSO_NAME}...\n");
    };
    let status = dso.status.clone().unwrap_or_default();
    let reading = status.pod_metrics.first();
    let mut out = format!(
        "dso/{} (kedge-pod-metrics)  {} requests waiting   average {} per engine (target {})   engines {}\n\n",
        dso.name_any(),
        demand,
        reading
            .and_then(|r| r.average.clone())
            .unwrap_or_else(|| "-".into()),
        reading.map_or("-", |r| r.threshold.as_str()),
        status.total_current_replicas,
    );
    out.push_str(&format!(
        "{:<10} {:<12} {:>7} {:>7} {:>7}  {}\n",
        "MEMBER", "STATE", "ENGINES", "COUNTED", "MISSING", "ENGINES"
    ));
    for (member, s) in &status.member_cluster_statuses {
        let part = reading.and_then(|r| r.members.get(member));
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7} {:>7}  {}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.current_replicas,
            part.map_or(0, |p| p.pods_counted),
            part.map_or(0, |p| p.pods_missing),
            bar("▓", s.current_replicas)
        ));
    }
    out
}

/// The DSJ's section: the trigger, Job totals, then per member the Jobs running (█) and
/// pending (░), stuck Jobs and the member's taint.
pub fn render_dsj(dsj: Option<&DistributedScaledJob>) -> String {
    let Some(dsj) = dsj else {
        return format!("waiting for DistributedScaledJob default/{DSJ_NAME}...\n");
    };
    let status = dsj.status.clone().unwrap_or_default();
    let mut out = format!(
        "dsj/{}  desired {}   running {}   pending {}\n",
        dsj.name_any(),
        status.desired_jobs,
        status.running_jobs,
        status.pending_jobs
    );
    for trigger in &status.trigger_metrics_status {
        out.push_str(&format!(
            "trigger {}: {} ({})\n",
            trigger.name,
            trigger.state,
            trigger.info.as_deref().unwrap_or("-")
        ));
    }
    out.push_str(&format!(
        "\n{:<10} {:<12} {:>7} {:>7} {:>5} {:<5}  {}\n",
        "MEMBER", "STATE", "RUNNING", "PENDING", "STUCK", "TAINT", "JOBS (█ running, ░ pending)"
    ));
    for (member, s) in &status.member_cluster_statuses {
        let taint = if s.hard_tainted {
            "hard"
        } else if s.soft_tainted {
            "soft"
        } else {
            "-"
        };
        // runningJobs counts every non-terminal Job, pending ones included.
        let started = s.running_jobs - s.pending_jobs;
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7} {:>5} {:<5}  {}{}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.running_jobs,
            s.pending_jobs,
            s.stuck_jobs,
            taint,
            bar("█", started),
            bar("░", s.pending_jobs)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kedge_core::crd::dsj::{DsjMemberClusterStatus, TriggerMetricStatus};
    use kedge_core::crd::{DistributedScaledJobSpec, DistributedScaledJobStatus};

    use super::*;

    fn member(state: &str, running: i32, pending: i32, stuck: i32) -> DsjMemberClusterStatus {
        DsjMemberClusterStatus {
            state: Some(state.to_owned()),
            running_jobs: running,
            pending_jobs: pending,
            stuck_jobs: stuck,
            ..DsjMemberClusterStatus::default()
        }
    }

    /// The example DSJ as the hub reports it while member-2's Jobs are stuck.
    fn dsj() -> DistributedScaledJob {
        let mut dsj = DistributedScaledJob::new(DSJ_NAME, DistributedScaledJobSpec::default());
        let soft = DsjMemberClusterStatus {
            soft_tainted: true,
            ..member("Ready", 3, 3, 3)
        };
        let hard = DsjMemberClusterStatus {
            hard_tainted: true,
            excluded: true,
            ..member("Unreachable", 7, 1, 0)
        };
        dsj.status = Some(DistributedScaledJobStatus {
            desired_jobs: 10,
            running_jobs: 12,
            pending_jobs: 4,
            member_cluster_statuses: BTreeMap::from([
                ("member-1".to_owned(), member("Ready", 2, 0, 0)),
                ("member-2".to_owned(), soft),
                ("member-3".to_owned(), hard),
            ]),
            trigger_metrics_status: vec![TriggerMetricStatus {
                name: "queue".into(),
                state: "Active".into(),
                info: Some("value 10 / target 1".into()),
                last_change_time: None,
            }],
            ..DistributedScaledJobStatus::default()
        });
        dsj
    }

    fn line_of<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in\n{text}"))
    }

    #[test]
    fn dsj_section_shows_totals_trigger_and_each_member() {
        let text = render_dsj(Some(&dsj()));
        assert_eq!(
            line_of(&text, "dsj/"),
            "dsj/queue-worker  desired 10   running 12   pending 4"
        );
        assert_eq!(
            line_of(&text, "trigger"),
            "trigger queue: Active (value 10 / target 1)"
        );
        let columns = |member: &str| -> Vec<String> {
            line_of(&text, member)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        // MEMBER STATE RUNNING PENDING STUCK TAINT BAR; running counts pending Jobs too, so
        // the bar has one block per Job: █ started, ░ pending.
        assert_eq!(
            columns("member-1"),
            ["member-1", "Ready", "2", "0", "0", "-", "██"]
        );
        assert_eq!(
            columns("member-2"),
            ["member-2", "Ready", "3", "3", "3", "soft", "░░░"]
        );
        assert_eq!(
            columns("member-3"),
            ["member-3", "Unreachable", "7", "1", "0", "hard", "██████░"]
        );
    }

    #[test]
    fn dsj_section_without_status_or_object() {
        let fresh = DistributedScaledJob::new(DSJ_NAME, DistributedScaledJobSpec::default());
        let text = render_dsj(Some(&fresh));
        assert!(text.starts_with("dsj/queue-worker  desired 0   running 0   pending 0\n"));
        assert!(!text.contains("member-"), "{text}");
        assert_eq!(
            render_dsj(None),
            "waiting for DistributedScaledJob default/queue-worker...\n"
        );
    }

    #[test]
    fn view_puts_the_dsj_below_the_dso_and_the_log_last() {
        let log = vec!["[  3s] queue 10".to_owned()];
        let text = render(None, Some(&dsj()), &log, 7);
        assert!(text.starts_with("kedge fleet demo  t=7s"), "{text}");
        let dso = text.find("DistributedScaledObject").unwrap_or(usize::MAX);
        let dsj = text.find("dsj/queue-worker").unwrap_or(usize::MAX);
        let log = text.find("[  3s] queue 10").unwrap_or(usize::MAX);
        assert!(dso < dsj && dsj < log, "{text}");
    }

    #[test]
    fn the_inference_section_shows_the_queue_the_average_and_each_members_engines() {
        use kedge_core::crd::dso::{
            DistributedScaledObjectStatus, DsoMemberClusterStatus, PodMetricsMemberStatus,
            PodMetricsStatus,
        };
        let mut dso: DistributedScaledObject = serde_yaml::from_str(VLLM_DSO_YAML).unwrap();
        let member = |state: &str, current: i32| DsoMemberClusterStatus {
            state: Some(state.into()),
            current_replicas: current,
            ..DsoMemberClusterStatus::default()
        };
        let part = |counted: i64, missing: i64| PodMetricsMemberStatus {
            pods_counted: counted,
            pods_missing: missing,
            ..PodMetricsMemberStatus::default()
        };
        dso.status = Some(DistributedScaledObjectStatus {
            total_current_replicas: 5,
            member_cluster_statuses: BTreeMap::from([
                ("member-1".to_owned(), member("Ready", 3)),
                ("member-3".to_owned(), member("Unreachable", 2)),
            ]),
            pod_metrics: vec![PodMetricsStatus {
                threshold: "10".into(),
                average: Some("11.2".into()),
                members: BTreeMap::from([
                    ("member-1".to_owned(), part(3, 0)),
                    ("member-3".to_owned(), part(0, 2)),
                ]),
                ..PodMetricsStatus::default()
            }],
            ..DistributedScaledObjectStatus::default()
        });
        let text = render_inference(Some(&dso), 40);
        assert_eq!(
            line_of(&text, "dso/"),
            "dso/vllm (kedge-pod-metrics)  40 requests waiting   average 11.2 per engine (target 10)   engines 5"
        );
        let columns = |m: &str| {
            line_of(&text, m)
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            columns("member-1"),
            ["member-1", "Ready", "3", "3", "0", "▓▓▓"]
        );
        assert_eq!(
            columns("member-3"),
            ["member-3", "Unreachable", "2", "0", "2", "▓▓"]
        );
        assert_eq!(
            render_inference(None, 0),
            "waiting for DistributedScaledObject default/vllm...\n"
        );
    }

    #[test]
    fn bars_are_capped() {
        assert_eq!(bar("█", -1), "");
        assert_eq!(bar("░", 100).chars().count(), 40);
    }
}
