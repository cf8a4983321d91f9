//! The live demo of `kedge-sim up` (without `--headless`): the example DSO and DSJ on a
//! three-member fleet, a scripted metric and queue, one member cut off and returning, and a
//! terminal view of how replicas and Jobs move. member-3 reaches the hub through a link
//! emulator ([`with_demo_link`]) that the bad-link scene degrades. Its inference scene:
//! simulated vLLM engines ([`crate::engines`]) share a scripted queue of waiting requests,
//! and the DSO `vllm` scales them on what they say (a `kedge-pod-metrics` trigger). The
//! script is in [`tour`], what the view draws in [`view`]; this module does the I/O.

mod tour;
mod view;

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::process::Command;
use tokio::signal::unix::SignalKind;
use tokio_util::sync::CancellationToken;

use self::tour::{Action, TOUR_LENGTH};
pub use self::view::{
    LinkSample, Screen, Snapshot, engines, link_samples, next_commands, render, render_dsj,
    render_dso, render_header, render_inference, render_links, render_short_header,
};
use crate::engines::Demand;
use crate::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use crate::link::LinkSpec;
use crate::{Error, Result};

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
/// The member whose link the bad-link scene degrades (the one the cut-off scene freezes).
pub const LINKED_MEMBER: &str = "member-3";
const METRIC_CONFIGMAP: (&str, &str) = ("mock-metric", "metric-value");
const QUEUE_CONFIGMAP: (&str, &str) = ("work-queue", "length");

/// The demo's fleet: [`LINKED_MEMBER`], if the fleet has it, reaches the hub through a link
/// emulator, a perfect one unless `--link` gave it a spec, so a scene can degrade it.
pub fn with_demo_link(mut config: FleetConfig) -> FleetConfig {
    if (1..=config.members).any(|i| format!("member-{i}") == LINKED_MEMBER) {
        config.links.entry(LINKED_MEMBER.to_owned()).or_default();
    }
    config
}

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

/// Sets [`LINKED_MEMBER`]'s link emulator, if it has one, to `spec`.
fn set_link(fleet: &Fleet, spec: LinkSpec) {
    if let Some(link) = fleet.link(LINKED_MEMBER) {
        link.set_spec(spec);
    }
}

/// What the script changes, and the link spec [`Action::GoodLink`] restores.
struct Stage<'a> {
    fleet: &'a Fleet,
    hub: kube::Client,
    demand: &'a Demand,
    good_link: LinkSpec,
}

async fn run(stage: &Stage<'_>, action: Action) -> Result<()> {
    let (fleet, hub) = (stage.fleet, &stage.hub);
    match action {
        Action::Metric(v) => set_value(hub, METRIC_CONFIGMAP, v).await?,
        Action::Queue(v) => set_value(hub, QUEUE_CONFIGMAP, v).await?,
        Action::Member2Full(full) => set_full(fleet, "member-2", full).await?,
        Action::CutOff => signal(fleet.agent_pid(LINKED_MEMBER), "STOP").await,
        Action::Reconnect => signal(fleet.agent_pid(LINKED_MEMBER), "CONT").await,
        Action::Demand(v) => stage.demand.set(v),
        Action::BadLink => set_link(fleet, tour::bad_link()),
        Action::GoodLink => set_link(fleet, stage.good_link.clone()),
        Action::Note(_) => {}
    }
    Ok(())
}

/// Reads what one frame shows, once; `links` holds the latest reads of the hub's sessions,
/// oldest first.
async fn snapshot(stage: &Stage<'_>, links: &VecDeque<Vec<LinkSample>>) -> Snapshot {
    let (hub, demand) = (&stage.hub, stage.demand);
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub.clone(), "default");
    let dsjs: Api<DistributedScaledJob> = Api::namespaced(hub.clone(), "default");
    Snapshot {
        dso: dsos.get_opt(DSO_NAME).await.ok().flatten(),
        dsj: dsjs.get_opt(DSJ_NAME).await.ok().flatten(),
        inference: dsos.get_opt(INFERENCE_DSO_NAME).await.ok().flatten(),
        demand: demand.get(),
        links: links.back().cloned().unwrap_or_default(),
        links_before: links.front().cloned().unwrap_or_default(),
        emulated: emulated(stage.fleet),
    }
}

/// Each member behind a link emulator, with the spec in force.
fn emulated(fleet: &Fleet) -> BTreeMap<String, String> {
    let members = fleet.members().into_iter();
    members
        .filter_map(|m| Some((m.clone(), fleet.link(&m)?.spec().to_string())))
        .collect()
}

/// Adds the hub's latest report of the links to the last [`view::TRAFFIC_WINDOW`] reads.
async fn sample_links(fleet: &Fleet, links: &mut VecDeque<Vec<LinkSample>>) {
    // No answer this second: the view keeps the last one.
    if let Ok(sessions) = fleet.sessions().await {
        links.push_back(link_samples(&sessions));
        if links.len() > view::TRAFFIC_WINDOW + 1 {
            links.pop_front();
        }
    }
}

/// The size of the terminal stdout is, if it is one (`stty size` reads it).
async fn terminal() -> Option<Screen> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let out = Command::new("stty")
        .arg("size")
        .stdin(std::fs::File::open("/dev/tty").ok()?)
        .output()
        .await
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut size = text.split_whitespace().map(str::parse::<usize>);
    match (size.next(), size.next()) {
        (Some(Ok(rows)), Some(Ok(cols))) if rows > 0 && cols > 0 => Some(Screen { rows, cols }),
        _ => None,
    }
}

fn push_log(log: &mut VecDeque<String>, line: String) {
    log.push_back(line);
    if log.len() > LOG_LINES {
        log.pop_front();
    }
}

async fn script(
    fleet: &Fleet,
    demand: &Demand,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let stage = Stage {
        fleet,
        hub: cluster_client(fleet, HUB_CLUSTER)?,
        demand,
        good_link: fleet
            .link(LINKED_MEMBER)
            .map(|l| l.spec())
            .unwrap_or_default(),
    };
    let mut links = VecDeque::new();
    let cwd = std::env::current_dir()?;
    let facts = fleet.facts().relative_to(&cwd);
    let start = Instant::now();
    let mut done = 0usize;
    let mut round_start = 0u64;
    let mut log = VecDeque::new();
    let mut screen = terminal().await;
    let mut resized = tokio::signal::unix::signal(SignalKind::window_change())?;
    tokio::pin!(stop);
    loop {
        let t = start.elapsed().as_secs();
        if t >= round_start + TOUR_LENGTH {
            round_start = t;
            done = 0;
            push_log(&mut log, tour::restart_line(t));
        }
        let due = tour::due(done, t - round_start);
        for step in due {
            run(&stage, step.action).await?;
        }
        done += due.len();
        sample_links(fleet, &mut links).await;
        // One read after the steps: their log lines and the view show the same counts.
        let snapshot = snapshot(&stage, &links).await;
        for step in due {
            push_log(&mut log, tour::log_line(t, step, snapshot.engines()));
        }
        let times = (t, t - round_start);
        let view = render(&facts, &snapshot, log.make_contiguous(), times, screen);
        print!("\x1b[2J\x1b[H{view}");
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            // Redrawn at once, to the new size.
            _ = resized.recv() => screen = terminal().await,
        }
    }
    // Never leave an agent frozen, a link bad or a member full behind.
    signal(fleet.agent_pid(LINKED_MEMBER), "CONT").await;
    set_link(fleet, stage.good_link);
    set_full(fleet, "member-2", false).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_puts_member_3_behind_a_link_it_keeps_a_given_spec_of() {
        let config = |members| FleetConfig::new(members, "/tmp/fleet".into()).unwrap();
        let links = |c: FleetConfig| with_demo_link(c).links;
        assert_eq!(
            links(config(3)),
            BTreeMap::from([(LINKED_MEMBER.to_owned(), LinkSpec::default())])
        );
        assert!(links(config(2)).is_empty(), "no member-3, no link");
        let mut given = config(4);
        let slow = tour::bad_link();
        given.links.insert("member-3".into(), slow.clone());
        given.links.insert("member-1".into(), slow.clone());
        let given = links(given);
        assert_eq!(given.len(), 2);
        assert_eq!(given["member-3"], slow, "--link member-3 wins");
    }
}
