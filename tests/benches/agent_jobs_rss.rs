//! The resident memory of the real `kedge-agent` managing 1,000 Jobs: a scripted hub (real
//! QUIC, real mTLS, `tests/tests/support/hub_peer.rs`) tells the agent to create them in a
//! simulated member cluster whose Job controller runs one long-running pod for each; the
//! bench waits until the agent has reported every Job Running, lets it settle and reads
//! `VmRSS` and `VmHWM` from `/proc/PID/status`, then drops the session and reads them again
//! after the agent's full report of every Job to the new one. Exits non-zero when the RSS
//! with the Jobs reaches 20 MiB.
//!
//! `cargo bench -p kedge-e2e --bench agent_jobs_rss` (build the binaries first:
//! `cargo build --release --workspace --bins`; the bench uses the binaries of its own
//! profile, and the agent at `KEDGE_AGENT_BIN` when set: `make footprint` measures the
//! shipped `agent` profile). `AGENT_RSS_JOBS` (default 1000) sets the number of Jobs,
//! `AGENT_RSS_SETTLE_SECONDS` (default 15) the settle time before each reading,
//! `AGENT_RSS_AGENT_ARGS` adds flags to the agent's, `AGENT_RSS_KEEP` keeps the agent's log
//! and the certificates. Prints a Markdown table. Linux only (`/proc`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{env_or, machine, memory, mib, rss};
use kedge_protocol::{AgentMessage, DesiredState, HubMessage, JobCreate, JobPhase};
use kedge_sim::{Sim, SimConfig};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::hub_peer::{HubPeer, JobBook, Session};
use support::{Pki, start_agent_with};
use tokio::sync::mpsc;

/// What the agent must stay under with the Jobs (issue 9).
const LIMIT_KIB: u64 = 20 * 1024;
/// The DistributedScaledJob the Jobs belong to.
const OWNER: &str = "apps/work";
/// Heartbeat interval the scripted hub asks for: the hub's default (`--heartbeat-interval`).
const HEARTBEAT_MS: u64 = 5000;
/// Longest wait for any one step.
const STEP_LIMIT: Duration = Duration::from_secs(180);

/// A long-running Job: its pod runs for the whole bench.
fn create(name: &str) -> JobCreate {
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": {"sim.kedge.dev/run-seconds": "36000"}},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "worker", "image": "busybox"}]}}}
    });
    JobCreate {
        namespace: "apps".into(),
        name: name.into(),
        owner: OWNER.into(),
        manifest_json: serde_json::to_vec(&job).unwrap(),
    }
}

/// What the scripted hub learnt from one session.
#[derive(Default)]
struct Learnt {
    book: JobBook,
    acked: Vec<u64>,
    /// Commands the agent reported failed.
    failed: Vec<String>,
    /// Why the session ended, once it has.
    ended: Option<String>,
}

/// One session, driven in the background: every message of the agent is read (as a hub
/// does, so that the agent never waits for the hub), and desired state is sent on demand.
struct Driver {
    send: mpsc::Sender<HubMessage>,
    learnt: Arc<Mutex<Learnt>>,
    connection: quinn::Connection,
    /// The agent's log, shown when a step fails.
    log: std::path::PathBuf,
}

impl Driver {
    fn start(session: Session, log: std::path::PathBuf) -> Driver {
        let Session {
            connection,
            mut control,
            ..
        } = session;
        let (send, mut outgoing) = mpsc::channel::<HubMessage>(4);
        let learnt = Arc::new(Mutex::new(Learnt::default()));
        let shared = learnt.clone();
        tokio::spawn(async move {
            let ended = loop {
                tokio::select! {
                    message = control.recv() => match message {
                        Ok(Some(AgentMessage::Report(report))) => {
                            shared.lock().unwrap().book.record(&report);
                        }
                        Ok(Some(AgentMessage::Ack(ack))) => {
                            let mut learnt = shared.lock().unwrap();
                            learnt.failed.extend(ack.results.iter()
                                .filter_map(|r| Some(format!("{:?}: {:?}", r.target, r.failure.as_ref()?))));
                            learnt.acked.push(ack.revision);
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break "the agent finished the control stream".to_owned(),
                        Err(e) => break format!("reading from the agent: {e}"),
                    },
                    Some(message) = outgoing.recv() => {
                        if let Err(e) = control.send(&message).await {
                            break format!("sending to the agent: {e}");
                        }
                    }
                }
            };
            shared.lock().unwrap().ended = Some(ended);
        });
        Driver {
            send,
            learnt,
            connection,
            log,
        }
    }

    /// Waits until `done` holds for what the hub learnt.
    async fn until(&self, what: &str, done: impl Fn(&Learnt) -> bool) {
        let start = Instant::now();
        loop {
            {
                let learnt = self.learnt.lock().unwrap();
                if done(&learnt) {
                    return;
                }
                let failed = match (&learnt.ended, learnt.failed.first()) {
                    (Some(why), _) => Some(format!("the session ended: {why}")),
                    (None, Some(first)) => Some(format!("a command failed: {first}")),
                    (None, None) => None,
                };
                let failed = failed.or_else(|| {
                    (start.elapsed() > STEP_LIMIT)
                        .then(|| format!("timed out after {STEP_LIMIT:?}"))
                });
                if let Some(failed) = failed {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    panic!(
                        "waiting for {what}: {failed}; the agent's log ends:\n{}",
                        tail.join("\n")
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether a full set of reports has arrived naming `jobs` of the owner's Jobs, all Running.
fn all_running(learnt: &Learnt, jobs: usize) -> bool {
    learnt.book.complete
        && learnt
            .book
            .jobs
            .values()
            .filter(|s| s.owner == OWNER && s.phase == JobPhase::Running)
            .count()
            == jobs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let jobs: usize = env_or("AGENT_RSS_JOBS", 1000);
    let settle = Duration::from_secs(env_or("AGENT_RSS_SETTLE_SECONDS", 15));
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge"]).await;
    // Room for every pod (10 nodes × 110 pods); pods run 100 ms after binding.
    let config = SimConfig {
        nodes: 10,
        pod_start_delay: Duration::from_millis(100),
        ..SimConfig::default()
    };
    let sim = Sim::start(&["edge".into()], config, Some(dir.path()))
        .await
        .unwrap();
    let client = sim.cluster("edge").unwrap().client().unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap(),
        )
        .await
        .unwrap();

    let hub = HubPeer::start(&pki);
    let log = dir.path().join("agent.log");
    // The agent's defaults, limited to the namespace of the Jobs.
    let extra = std::env::var("AGENT_RSS_AGENT_ARGS").unwrap_or_default();
    let mut flags = vec!["--namespaces", "apps"];
    flags.extend(extra.split_whitespace());
    let agent = start_agent_with(&pki, "edge", hub.ports(), log.clone(), &flags);
    let pid = agent.pid() as u32;
    let first = Driver::start(
        hub.accept_with_heartbeat("edge", HEARTBEAT_MS).await,
        log.clone(),
    );
    first
        .until("the first full report", |l| l.book.complete)
        .await;
    tokio::time::sleep(settle).await;
    let idle = memory(pid);

    let created = Instant::now();
    let names: Vec<String> = (0..jobs).map(|i| format!("work-{i:04}")).collect();
    let desired = DesiredState {
        revision: 1,
        create_jobs: names.iter().map(|n| create(n)).collect(),
        ..Default::default()
    };
    first
        .send
        .send(HubMessage::DesiredState(desired))
        .await
        .unwrap();
    first
        .until("the ack of the creates", |l| l.acked.contains(&1))
        .await;
    let acked = created.elapsed();
    first
        .until(&format!("{jobs} Jobs reported Running"), |l| {
            all_running(l, jobs)
        })
        .await;
    let reported = created.elapsed();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "apps")
        .list(&ListParams::default().labels("kedge.dev/distributedscaledjob=work"))
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(pods, jobs, "one pod per Job");
    tokio::time::sleep(settle).await;
    let loaded = memory(pid);

    // The hub goes away: the next session gets one full report naming every Job.
    first.connection.close(0u32.into(), b"hub restarts");
    let second = Driver::start(hub.accept_with_heartbeat("edge", HEARTBEAT_MS).await, log);
    second
        .until(&format!("a full report of {jobs} Running Jobs"), |l| {
            all_running(l, jobs)
        })
        .await;
    tokio::time::sleep(settle).await;
    let reconnected = memory(pid);
    let total = started.elapsed();
    drop(second);
    drop(agent);
    drop(sim);
    if std::env::var_os("AGENT_RSS_KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
    }

    let secs = settle.as_secs();
    // Which build: the shipped `agent` profile (`make footprint`) or the bench's own.
    let binary = support::agent_bin();
    let profile = binary
        .parent()
        .and_then(|d| d.file_name())
        .map_or_else(String::new, |d| d.to_string_lossy().into_owned());
    println!("| kedge-agent resident memory (`{profile}` build) | value |");
    println!("|---|---|");
    println!(
        "| idle, connected, no Job ({secs} s settled) | {} |",
        rss(idle)
    );
    println!(
        "| {jobs} Jobs + {pods} pods Running, all reported ({secs} s settled) | {} |",
        rss(loaded)
    );
    println!("| peak (VmHWM) until then | {} |", mib(loaded.peak));
    println!(
        "| after a reconnect and a full report of {jobs} Jobs ({secs} s settled) | {} |",
        rss(reconnected)
    );
    println!(
        "| peak (VmHWM) over the whole run | {} |",
        mib(reconnected.peak)
    );
    println!(
        "| {jobs} creates sent → acked → all reported Running | {:.1} s → {:.1} s |",
        acked.as_secs_f64(),
        reported.as_secs_f64()
    );
    println!("| bench run time | {:.0} s |", total.as_secs_f64());
    println!("| machine | {} |", machine());
    let worst = loaded.rss.max(reconnected.rss);
    if worst >= LIMIT_KIB {
        eprintln!(
            "FAIL: the agent's RSS with {jobs} Jobs is {} (limit {})",
            mib(worst),
            mib(LIMIT_KIB)
        );
        std::process::exit(1);
    }
}
