//! One hub, many members, measured at the hub: the real release `kedge-hub` (file-mode
//! certificates, its controllers on a simulated hub cluster, `kedge-sim serve` in a process
//! of its own) and N *virtual agents* in this
//! process. Each virtual agent is a real session: its own QUIC connection on loopback with
//! mutual TLS and its own client certificate from the bench's CA, the real protocol (Hello,
//! heartbeats, a full report of one Deployment and the cluster's capacity, an Ack and a
//! report for every desired state). They keep replica counts in memory instead of a member
//! cluster, so that thousands fit on one machine and the figures are the hub's, not the
//! scheduling of thousands of agent processes.
//!
//! For each member count of `FLEET_BENCH_MEMBERS` (default `100,1000`):
//! - time until every virtual agent has been welcomed;
//! - the hub's RSS before any member and with every member connected (bytes per member);
//! - fan-out: one DistributedScaledObject over every member (weight 1; listed up to 1,000
//!   members, an empty `memberClusters` beyond); `FLEET_BENCH_ROUNDS`
//!   (default 10) changes of its `/scale` between N and 2N replicas, each once the hub has
//!   settled (no DSO reconciliation for 1.2 s); for each change, the
//!   time from the `/scale` write on the hub until each virtual agent holds its new count
//!   (1 or 2): p50 / p95 / p99 / max over every (round, member); and where the time went:
//!   the CPU time the hub, the simulated hub cluster and this process (the virtual agents)
//!   used from each write until every member held the count, against the wall time;
//!   and what crossed the connections per member and round: datagrams each way, the STREAM,
//!   ACK and PING frames in them, the agents' packets declared lost, and the datagrams the
//!   kernel dropped at full receive buffers (all sockets, and the hub's);
//! - the hub's RSS and CPU with the DSO at rest;
//! - a flap: the sessions of half the members cut at once while the hub and the other half
//!   run on; the time until each is back and re-synced, how many re-syncs needed nothing
//!   (the agent held its state) or sent it again, and how many sessions of the other half
//!   were lost (the bench fails unless none);
//! - a reconnect storm: the hub is stopped with SIGTERM (as a rollout stops it) and a new
//!   one started on the same address; the time until every virtual agent has a new session
//!   and has been sent its desired state again, the new hub's peak RSS and CPU meanwhile, and
//!   how many replica counts changed (the bench fails unless none);
//! - the push-style baseline at the same member count (see `push`): a controller process with
//!   a Kubernetes client per member patches each member's `/scale`; its memory, CPU, first
//!   fan-out and the same `/scale` → member latency percentiles.
//!
//! With `FLEET_BENCH_REPLICAS` > 1 it measures sharded hub replicas instead (see `shards`).
//! `FLEET_BENCH_CONNECTING` sets how many handshakes the virtual agents have in flight at
//! once (64 by default).
//!
//! `cargo bench -p kedge-e2e --bench fleet_scale` (build the binaries first: `cargo build
//! --release --workspace --bins`), or `make bench-fleet`. Linux only (`/proc`). Prints a
//! Markdown table. A release `kedge-hub` or `kedge-sim` older than its sources stops the
//! bench (`FLEET_BENCH_STALE_OK=1` runs it anyway), unless `KEDGE_HUB_BIN` or
//! `KEDGE_SIM_BIN` names another build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "fleet_scale/dials.rs"]
mod dials;
#[path = "fleet_scale/push.rs"]
mod push;
#[path = "fleet_scale/shards.rs"]
mod shards;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{cpu_time, env_or, machine, memory, millicores};
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_core::crd::{DistributedScaledObject, MemberCluster};
use kedge_net::pki::{CertificateAuthority, Validity};
use kedge_net::tls::{TlsMaterial, TransportTuning, client_config};
use kedge_protocol::*;
use kedge_sim::fleet::{HUB_CLUSTER, HUB_NAMESPACE, install_crds};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

const NS: &str = "default";
const WORKLOAD: &str = "app";
/// Heartbeat the hub asks for: the chart's default.
const HEARTBEAT: &str = "5s";
/// Longest any one step may take before the bench fails.
const STEP_LIMIT: Duration = Duration::from_secs(300);
/// Handshakes in flight at once, unless `FLEET_BENCH_CONNECTING` says (the hub's budgets are
/// raised to twice as many: all virtual agents share one source address, where a real
/// fleet's agents each have their own).
const CONNECTING: usize = 64;

fn connecting() -> usize {
    std::env::var("FLEET_BENCH_CONNECTING")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(CONNECTING)
}
/// Virtual agents sharing one UDP socket.
const AGENTS_PER_SOCKET: usize = 8;
/// The agent's reconnect backoff (`--reconnect-initial`, `--reconnect-max` defaults).
const RECONNECT_INITIAL: Duration = Duration::from_millis(500);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// After a hub closed the sessions because it is shutting down, how long the agent redials
/// after short pauses (`rotation::RESTART_WINDOW`) before it backs off as usual.
/// `FLEET_BENCH_RECONNECT=backoff` measures the agent before it had this window (every
/// failed dial backs off), for comparison.
const RESTART_WINDOW: Duration = Duration::from_secs(30);
/// The agent's TLS handshake timeouts with a single hub address: by dials failed in a row.
const HANDSHAKE_TIMEOUTS: [Duration; 3] = [
    Duration::from_secs(3),
    Duration::from_secs(6),
    Duration::from_secs(10),
];

/// A count a virtual agent was told while the bench held the total still.
struct CountChange {
    agent: usize,
    held: i32,
    told: i32,
    at: Instant,
    /// Which of the agent's sessions it came in.
    session: usize,
}

/// What every virtual agent has been told, shared with the bench.
#[derive(Default)]
struct Fleet {
    welcomed: AtomicUsize,
    /// Per member: the replica count it holds, and when it was told.
    held: Vec<Mutex<(i32, Option<Instant>)>>,
    /// Per member: sessions established, and the last session in which the hub sent a
    /// desired state (re-synced).
    sessions: Vec<AtomicUsize>,
    synced: Vec<AtomicUsize>,
    /// Sessions that ended (the hub closed them): 0 until the bench restarts the hub.
    ended: AtomicUsize,
    /// Handshakes or sessions that failed and were retried.
    retries: AtomicUsize,
    /// While set, a desired state with another count than the member holds is an error.
    frozen: AtomicBool,
    /// Desired states that changed a count while frozen.
    wrong: AtomicUsize,
    /// Each of those.
    changes: Mutex<Vec<CountChange>>,
    /// Bumped to make every even-numbered virtual agent close its session and reconnect
    /// (half the fleet's connections cut at once, the hub and the other half running on).
    flap: tokio::sync::watch::Sender<u64>,
    /// Per member: the index of the address its current session is on (sharded replicas).
    on: Vec<AtomicUsize>,
    /// Per member: its current connection, whose counters say what crossed it.
    links: Vec<Mutex<Option<quinn::Connection>>>,
    /// Every dial of every agent and how it ended.
    dials: dials::DialLog,
    /// The agents back off after every failed dial, even while a hub restarts (the agent's
    /// policy before its restart window; `FLEET_BENCH_RECONNECT=backoff`).
    backoff_only: bool,
}

fn workload() -> WorkloadRef {
    WorkloadRef::deployment(NS, WORKLOAD)
}

fn status(replicas: i32) -> WorkloadStatus {
    WorkloadStatus {
        exists: true,
        spec_replicas: replicas,
        ready_replicas: replicas,
        available_replicas: replicas,
        pod_cpu_millis: 10,
        pod_memory_bytes: 16 << 20,
        ..WorkloadStatus::absent(workload())
    }
}

/// Room for far more than the bench asks of a member.
fn capacity() -> ClusterCapacity {
    ClusterCapacity {
        nodes: 3,
        ready_nodes: 3,
        allocatable_cpu_millis: 24_000,
        allocatable_memory_bytes: 96 << 30,
        requested_cpu_millis: 0,
        requested_memory_bytes: 0,
    }
}

/// One virtual agent: as the agent does, connects (a failed handshake or a lost session is
/// retried after a jittered backoff, counted), says Hello, reports everything, and follows
/// desired state; again after the hub goes away. As the agent's `rotation` does with one hub
/// address: a session the hub closed because it is shutting down starts a restart window
/// in which every pause is the initial one (jittered) and a silent dial does not lengthen
/// the next handshake timeout; after it, the backoff starts over.
///
/// With several addresses (sharded replicas, see `shards`) it dials the first, moves on to
/// the next after a failed dial or a lost session, and redials the same one at once when the
/// hub closed with `RECONNECT`, as the agent's rotation does.
async fn virtual_agent(
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    hubs: Arc<[SocketAddr]>,
    index: usize,
    fleet: Arc<Fleet>,
    connecting: Arc<Semaphore>,
) {
    let mut current = 0;
    let mut backoff = RECONNECT_INITIAL;
    let mut last_applied = 0;
    let mut failed = 0;
    let mut restarting_until: Option<Instant> = None;
    loop {
        let permit = connecting.clone().acquire_owned().await.unwrap();
        let restarting = restarting_until.is_some_and(|until| Instant::now() < until);
        let failed_before = if restarting { 0 } else { failed };
        let patience = HANDSHAKE_TIMEOUTS[failed_before.min(HANDSHAKE_TIMEOUTS.len() - 1)];
        let started = Instant::now();
        let hub = hubs[current % hubs.len()];
        let dialed = session(&endpoint, &config, hub, last_applied, patience).await;
        drop(permit);
        let mut dial = dials::Dial {
            agent: index,
            started,
            ended: Instant::now(),
            outcome: dials::Outcome::Welcomed,
            then_waited: Duration::ZERO,
        };
        let (connection, control, welcome) = match dialed {
            Ok(established) => established,
            Err(failure) => {
                let why = failure.why;
                failed = if failure.answered { 0 } else { failed + 1 };
                fleet.retries.fetch_add(1, Ordering::AcqRel);
                if fleet.retries.load(Ordering::Acquire) <= 5
                    || matches!(failure.outcome, dials::Outcome::Silent(_))
                {
                    let port = endpoint.local_addr().map_or(0, |a| a.port());
                    eprintln!("member {index} (from port {port}): {why}; retrying");
                }
                dial.outcome = failure.outcome;
                current += 1;
                let restarting = restarting_until.is_some_and(|until| Instant::now() < until);
                dial.then_waited = if restarting {
                    short_pause(index)
                } else {
                    if restarting_until.take().is_some() {
                        backoff = RECONNECT_INITIAL;
                    }
                    let pause = backoff + rand_jitter(index, backoff);
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    pause
                };
                tokio::time::sleep(dial.then_waited).await;
                fleet.dials.record(dial);
                continue;
            }
        };
        fleet.dials.record(dial);
        backoff = RECONNECT_INITIAL;
        restarting_until = None;
        failed = 0;
        let number = fleet.sessions[index].fetch_add(1, Ordering::AcqRel) + 1;
        if number == 1 {
            fleet.welcomed.fetch_add(1, Ordering::AcqRel);
        }
        fleet.on[index].store(current % hubs.len(), Ordering::Release);
        *fleet.links[index].lock().unwrap() = Some(connection.clone());
        let closed;
        (last_applied, closed) = follow(connection, control, welcome, index, number, &fleet).await;
        fleet.ended.fetch_add(1, Ordering::AcqRel);
        if closed == Some(close_code::RECONNECT) {
            // The replica is alive and serves the new session: the same address, at once.
            continue;
        }
        current += 1;
        if closed == Some(close_code::SHUTDOWN) && !fleet.backoff_only {
            restarting_until = Some(Instant::now() + RESTART_WINDOW);
        }
        tokio::time::sleep(rand_jitter(index, RECONNECT_INITIAL)).await;
    }
}

/// The agent's short pause: the initial reconnect delay ±50%.
fn short_pause(index: usize) -> Duration {
    RECONNECT_INITIAL / 2 + rand_jitter(index, RECONNECT_INITIAL) * 2
}

/// One session: heartbeats, a full report, then acks and reports for every desired state;
/// returns the last revision applied when the session ends, and the code the hub closed it
/// with, if it did.
async fn follow(
    connection: quinn::Connection,
    mut control: Control,
    welcome: Welcome,
    index: usize,
    session: usize,
    fleet: &Fleet,
) -> (u64, Option<u32>) {
    let mut applied = 0;
    // Heartbeats on their own stream; no answer for three intervals ends the session.
    let Ok((send, recv)) = connection.open_bi().await else {
        return (applied, None);
    };
    let interval = Duration::from_millis(welcome.heartbeat_interval_ms);
    let beating = connection.clone();
    let heartbeats = tokio::spawn(async move {
        let mut beats: FramedStream<
            quinn::RecvStream,
            quinn::SendStream,
            HubMessage,
            AgentMessage,
        > = FramedStream::new(recv, send);
        let mut tick = tokio::time::interval(interval);
        for seq in 1.. {
            tick.tick().await;
            let beat = Heartbeat {
                seq,
                sent_unix_ms: unix_ms(std::time::SystemTime::now()),
            };
            if beats.send(&AgentMessage::Heartbeat(beat)).await.is_err() {
                break;
            }
            match tokio::time::timeout(interval * 3, beats.recv()).await {
                Ok(Ok(Some(HubMessage::HeartbeatAck(_)))) => {}
                // As the agent: the stream ended with the connection, whose close says why.
                Ok(_) => return,
                Err(_) => break,
            }
        }
        beating.close(0u32.into(), b"no heartbeat answer");
    });
    let mut flap = fleet.flap.subscribe();
    flap.mark_unchanged();
    let flapping = index.is_multiple_of(2);
    let held = fleet.held[index].lock().unwrap().0;
    let full = StatusReport {
        full: true,
        workloads: vec![status(held)],
        capacity: Some(capacity()),
        ..Default::default()
    };
    if control.send(&AgentMessage::Report(full)).await.is_ok() {
        loop {
            let message = tokio::select! {
                message = control.recv() => message,
                _ = flap.changed(), if flapping => break,
            };
            let Ok(Some(HubMessage::DesiredState(state))) = message else {
                if matches!(message, Ok(Some(_))) {
                    continue;
                }
                break;
            };
            fleet.synced[index].store(session, Ordering::Release);
            let replicas = state
                .workloads
                .iter()
                .find(|w| w.workload.name == WORKLOAD)
                .and_then(|w| w.replicas);
            if let Some(replicas) = replicas {
                let mut held = fleet.held[index].lock().unwrap();
                if held.0 != replicas {
                    if fleet.frozen.load(Ordering::Acquire) {
                        fleet.wrong.fetch_add(1, Ordering::AcqRel);
                        fleet.changes.lock().unwrap().push(CountChange {
                            agent: index,
                            held: held.0,
                            told: replicas,
                            at: Instant::now(),
                            session,
                        });
                    }
                    *held = (replicas, Some(Instant::now()));
                }
            }
            applied = state.revision;
            let ack = Ack {
                revision: state.revision,
                results: Vec::new(),
            };
            if control.send(&AgentMessage::Ack(ack)).await.is_err() {
                break;
            }
            if let Some(replicas) = replicas {
                let report = StatusReport {
                    workloads: vec![status(replicas)],
                    ..Default::default()
                };
                if control.send(&AgentMessage::Report(report)).await.is_err() {
                    break;
                }
            }
        }
    }
    heartbeats.abort();
    // As the agent: a close that follows the end of a stream is waited for briefly.
    let closed =
        match kedge_net::tls::close_reason_within(&connection, kedge_net::tls::CLOSE_GRACE).await {
            Some(quinn::ConnectionError::ApplicationClosed(c)) => {
                u32::try_from(c.error_code.into_inner()).ok()
            }
            _ => None,
        };
    connection.close(0u32.into(), b"session over");
    (applied, closed)
}

type Control = FramedStream<quinn::RecvStream, quinn::SendStream, HubMessage, AgentMessage>;

/// Why a dial failed, and whether the hub answered it: as the agent counts them, only
/// silence makes the next handshake wait longer.
struct DialFailure {
    why: String,
    answered: bool,
    outcome: dials::Outcome,
}

impl DialFailure {
    fn silent(why: String) -> Self {
        DialFailure {
            outcome: dials::Outcome::Other(why.clone()),
            why,
            answered: false,
        }
    }
}

/// A handshake, Hello and Welcome (each bounded as the agent bounds them).
async fn session(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    hub: SocketAddr,
    last_applied_revision: u64,
    patience: Duration,
) -> Result<(quinn::Connection, Control, Welcome), DialFailure> {
    let connecting = endpoint
        .connect_with(config.clone(), hub, "localhost")
        .map_err(|e| DialFailure::silent(format!("connect: {e}")))?;
    let connection = tokio::time::timeout(patience, connecting)
        .await
        .map_err(|_| DialFailure {
            outcome: dials::Outcome::Silent(patience),
            ..DialFailure::silent(format!("handshake: no answer in {patience:?}"))
        })?
        .map_err(|e| {
            let answered = matches!(
                e,
                quinn::ConnectionError::ConnectionClosed(_)
                    | quinn::ConnectionError::ApplicationClosed(_)
                    | quinn::ConnectionError::Reset
            );
            DialFailure {
                answered,
                outcome: if answered {
                    dials::Outcome::Closed
                } else {
                    dials::Outcome::Other(e.to_string())
                },
                why: format!("handshake: {e}"),
            }
        })?;
    let (send, recv) = connection
        .open_bi()
        .await
        .map_err(|e| DialFailure::silent(format!("control stream: {e}")))?;
    let mut control: Control = FramedStream::new(recv, send);
    control
        .send(&AgentMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: "virtual".into(),
            kubernetes_version: "v1.33.0-virtual".into(),
            last_applied_revision,
            namespaces: vec![NS.into()],
        }))
        .await
        .map_err(|e| DialFailure::silent(format!("Hello: {e}")))?;
    let longest = HANDSHAKE_TIMEOUTS[HANDSHAKE_TIMEOUTS.len() - 1];
    match tokio::time::timeout(longest, control.recv()).await {
        Ok(Ok(Some(HubMessage::Welcome(w)))) => Ok((connection, control, w)),
        Ok(Ok(Some(HubMessage::Refused(r)))) => Err(DialFailure {
            why: format!("refused: {}", r.message),
            answered: true,
            outcome: dials::Outcome::Refused(r.message),
        }),
        Err(_) => Err(DialFailure::silent(format!("no Welcome in {longest:?}"))),
        other => Err(DialFailure::silent(format!(
            "expected Welcome, got {other:?}"
        ))),
    }
}

/// Up to half of `backoff`, spread over members (no two retry in step).
fn rand_jitter(index: usize, backoff: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let spread = (index as u64)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(nanos);
    backoff.mul_f64((spread % 1000) as f64 / 2000.0)
}

fn free_port_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_port_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn bin_dir() -> std::path::PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop();
    // Benches run from target/<profile>/deps; the binaries are one level up.
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Starts the release hub in file-certificate mode, able to hold `members` sessions.
fn start_hub(dir: &Path, log: &str, members: usize, quic: u16, ops: u16) -> tokio::process::Child {
    let mut command = hub_command(dir, log, members, quic, ops);
    command
        .arg("--tls-cert")
        .arg(dir.join("hub.pem"))
        .arg("--tls-key")
        .arg(dir.join("hub-key.pem"))
        .arg("--tls-ca")
        .arg(dir.join("ca.pem"));
    command
        .spawn()
        .expect("cannot start kedge-hub: build the release binaries first")
}

/// The release hub's command line but for its certificates, able to hold `members` sessions.
fn hub_command(
    dir: &Path,
    log: &str,
    members: usize,
    quic: u16,
    ops: u16,
) -> tokio::process::Command {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    let limit = (members + 64).to_string();
    // KEDGE_HUB_BIN: another build of the hub (`--profile profiling` keeps symbols for perf).
    let bin =
        std::env::var_os("KEDGE_HUB_BIN").map_or_else(|| bin_dir().join("kedge-hub"), Into::into);
    let mut command = tokio::process::Command::new(bin);
    command
        .args(["--listen", &format!("127.0.0.1:{quic}")])
        .args(["--ops-listen", &format!("127.0.0.1:{ops}")])
        .args(["--namespace", HUB_NAMESPACE])
        .args(["--heartbeat-interval", HEARTBEAT])
        .args(["--max-connections", &limit])
        .args(["--max-handshakes", &(connecting() * 2).to_string()])
        .args([
            "--max-handshakes-per-source",
            &(connecting() * 2).to_string(),
        ])
        .arg("--kubeconfig")
        .arg(dir.join(format!("{HUB_CLUSTER}.kubeconfig")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    command
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < STEP_LIMIT,
            "{what}: not after {STEP_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// What one member count measured.
struct Row {
    members: usize,
    connected: Duration,
    rss_empty: u64,
    rss_connected: u64,
    rss_rest: u64,
    cpu_rest: u64,
    samples: Vec<Duration>,
    ended: usize,
    retries: usize,
    /// DSO reconciliations over the run: how many, mean duration.
    reconciles: (u64, Duration),
    /// CPU time of the hub, of the simulated hub cluster and of this process (the virtual
    /// agents), and wall time, summed over the rounds from the `/scale` write until every
    /// member held the new count.
    fanout_cpu: [Duration; 4],
    /// What crossed the agents' connections over the rounds, the settling after each
    /// included.
    fanout_traffic: Traffic,
    storm: Storm,
    flap: Flap,
    push: Push,
}

/// Half the fleet's sessions cut and back, the hub running on.
struct Flap {
    cut: usize,
    /// Cut until every cut agent had a new session.
    reconnected: Duration,
    /// Cut until the hub re-synced each of them (its first full report planned).
    resynced: Duration,
    /// Of those re-syncs: nothing needed (the agent held its state), or the state sent.
    in_sync: u64,
    sent: u64,
    /// Of the reconnects, those that resumed their TLS session.
    resumed: u64,
    /// Agents of the other half whose session ended meanwhile (must be 0).
    lost: usize,
}

/// The push-style baseline at the same member count.
struct Push {
    /// The push controller's RSS before any member client, and with a connection to each.
    rss_empty: u64,
    rss_connected: u64,
    cpu_rest: u64,
    /// The first fan-out, which connects to every member.
    first: Duration,
    samples: Vec<Duration>,
}

/// The hub restarted under every member.
struct Storm {
    /// SIGTERM until the old hub exited.
    stop: Duration,
    /// New hub started until every agent has a new session, and its desired state.
    reconnected: Duration,
    resynced: Duration,
    /// Connection attempts that failed meanwhile (and were retried after a backoff).
    retries: usize,
    /// Sessions the new hub resumed from a ticket of the old one.
    resumed: u64,
    /// The new hub's peak RSS and CPU time until then.
    peak_rss: u64,
    cpu: Duration,
    /// Desired states that changed a replica count meanwhile (must be 0).
    wrong: usize,
}

/// The simulated hub cluster in a process of its own (`kedge-sim serve`): the OS shares the
/// cores between it, the hub and the virtual agents (in one runtime with thousands of
/// agents it waited behind them), and its CPU time is its own.
struct HubCluster {
    child: tokio::process::Child,
    pid: u32,
    url: String,
    client: kube::Client,
}

impl HubCluster {
    async fn start(dir: &Path) -> Self {
        // KEDGE_SIM_BIN: another build (`--profile profiling` keeps symbols for perf).
        let bin = std::env::var_os("KEDGE_SIM_BIN")
            .map_or_else(|| bin_dir().join("kedge-sim"), Into::into);
        let mut child = tokio::process::Command::new(bin)
            .args(["serve", "--clusters", HUB_CLUSTER, "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("sim.log")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("cannot start kedge-sim: build the release binaries first");
        let pid = child.id().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut cluster = None;
        let read = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.starts_with("kedge-sim ready") {
                    // Whatever it prints later is read, so that it never blocks on a pipe.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return;
                }
                let fields: Vec<&str> = line.split_whitespace().collect();
                if let ["cluster", name, url, kubeconfig] = fields[..]
                    && name == HUB_CLUSTER
                {
                    cluster = Some((url.to_owned(), kubeconfig.to_owned()));
                }
            }
            panic!("kedge-sim exited before it was ready (see sim.log)");
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("kedge-sim ready within 30 s");
        let (url, kubeconfig) = cluster.expect("kedge-sim named the hub cluster");
        let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        Self {
            child,
            pid,
            url,
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// What every run sets up before any hub: the simulated hub cluster with kedge's CRDs, the
/// bench's CA with the hub's certificate (files in `dir`), one client certificate and one
/// MemberCluster per member.
struct Prepared {
    dir: tempfile::TempDir,
    sim: HubCluster,
    ca: CertificateAuthority,
    server: kedge_net::pki::IssuedCert,
    names: Vec<String>,
    configs: Vec<quinn::ClientConfig>,
}

async fn prepare(members: usize) -> Prepared {
    let dir = tempfile::tempdir().unwrap();
    let sim = HubCluster::start(dir.path()).await;
    let hub_client = sim.client.clone();
    install_crds(hub_client.clone()).await.unwrap();

    // The bench's CA, the hub's certificate and one client certificate per member.
    let validity = Validity::issued(time::OffsetDateTime::now_utc(), time::Duration::days(1));
    let ca = CertificateAuthority::generate("kedge fleet bench CA", validity).unwrap();
    let server = ca.issue_server(&["localhost".into()], validity).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
    std::fs::write(dir.path().join("hub.pem"), &server.cert_pem).unwrap();
    std::fs::write(dir.path().join("hub-key.pem"), &server.key_pem).unwrap();
    let setup = Instant::now();
    let names: Vec<String> = (1..=members).map(|i| format!("member-{i}")).collect();
    let mut configs = Vec::with_capacity(members);
    for name in &names {
        let cert = ca.issue_member(name, validity).unwrap();
        let material = TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, ca.cert_pem()).unwrap();
        configs.push(client_config(material, TransportTuning::default(), ALPN).unwrap());
    }
    eprintln!("{members} members: certificates in {:.1?}", setup.elapsed());
    // Only members with a MemberCluster get a session.
    let member_clusters: Api<MemberCluster> = Api::all(hub_client.clone());
    for name in &names {
        let mc: MemberCluster = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": name}, "spec": {}
        }))
        .unwrap();
        member_clusters
            .create(&PostParams::default(), &mc)
            .await
            .unwrap();
    }
    eprintln!(
        "{members} members: MemberClusters in {:.1?}",
        setup.elapsed()
    );
    Prepared {
        dir,
        sim,
        ca,
        server,
        names,
        configs,
    }
}

/// What the virtual agents share with the bench, for `members` of them.
fn new_fleet(members: usize) -> Arc<Fleet> {
    Arc::new(Fleet {
        held: (0..members).map(|_| Mutex::new((0, None))).collect(),
        sessions: (0..members).map(|_| AtomicUsize::new(0)).collect(),
        synced: (0..members).map(|_| AtomicUsize::new(0)).collect(),
        on: (0..members).map(|_| AtomicUsize::new(0)).collect(),
        links: (0..members).map(|_| Mutex::new(None)).collect(),
        backoff_only: std::env::var("FLEET_BENCH_RECONNECT").is_ok_and(|v| v == "backoff"),
        ..Fleet::default()
    })
}

/// Starts one virtual agent per client configuration, agent i dialing `hubs(i)`; returns
/// their tasks and their UDP endpoints.
fn spawn_agents(
    configs: Vec<quinn::ClientConfig>,
    fleet: &Arc<Fleet>,
    hubs: impl Fn(usize) -> Arc<[SocketAddr]>,
) -> (Vec<tokio::task::JoinHandle<()>>, Vec<quinn::Endpoint>) {
    // A UDP socket per few agents (a real agent has its own): a thousand sessions closed or
    // answered at once would overflow one socket's receive buffer, and the lost packets
    // would be the bench's, not the hub's.
    // Each gets the buffers the hub asks for: eight agents' traffic through the kernel's
    // default 208 KiB dropped datagrams in a restart's bursts (net.core.rmem_max permitting),
    // where each real agent has a socket of its own.
    let endpoints: Vec<quinn::Endpoint> = (0..configs.len().div_ceil(AGENTS_PER_SOCKET))
        .map(|_| {
            let bound = kedge_net::udp::bind(
                "127.0.0.1:0".parse().unwrap(),
                kedge_net::udp::SOCKET_BUFFER,
            )
            .unwrap();
            quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                None,
                bound.socket,
                Arc::new(quinn::TokioRuntime),
            )
            .unwrap()
        })
        .collect();
    let connecting = Arc::new(Semaphore::new(connecting()));
    let agents = configs
        .into_iter()
        .enumerate()
        .map(|(index, config)| {
            tokio::spawn(virtual_agent(
                endpoints[index / AGENTS_PER_SOCKET].clone(),
                config,
                hubs(index),
                index,
                fleet.clone(),
                connecting.clone(),
            ))
        })
        .collect();
    (agents, endpoints)
}

/// One DSO over every member (weight 1); waits until KEDA's first total (1) is held.
async fn create_dso(
    hub_client: kube::Client,
    names: &[String],
    fleet: &Fleet,
) -> Api<DistributedScaledObject> {
    let members = names.len();
    // One DSO over every member; KEDA polls once (total 1), the bench sets the rest.
    let metric: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "bench-metric", "namespace": NS}, "data": {"value": "5"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(hub_client.clone(), NS)
        .create(&PostParams::default(), &metric)
        .await
        .unwrap();
    // A DSO lists at most 1,000 members; beyond that it names none, which means every
    // registered member (weight 1 each either way).
    let member_list: Vec<_> = if members <= kedge_core::validate::MAX_MEMBERS {
        names
            .iter()
            .map(|m| json!({"name": m, "weight": 1}))
            .collect()
    } else {
        Vec::new()
    };
    let dso: DistributedScaledObject = serde_json::from_value(json!({
        "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
        "metadata": {"name": WORKLOAD, "namespace": NS},
        "spec": {"memberClusters": member_list, "scaledObjectSpec": {
            "scaleTargetRef": {"kind": "Deployment", "name": WORKLOAD},
            "pollingInterval": 3600, "minReplicaCount": 1, "maxReplicaCount": 100000,
            "triggers": [{"type": "kubernetes-resource", "metadata": {
                "resourceKind": "ConfigMap", "resourceName": "bench-metric",
                "key": "value", "targetValue": "5"}}]}}
    }))
    .unwrap();
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub_client, NS);
    dsos.create(&PostParams::default(), &dso).await.unwrap();
    let total = |f: &Fleet| -> i32 { f.held.iter().map(|h| h.lock().unwrap().0).sum() };
    wait_until("KEDA's first total (1) held by the members", || {
        total(fleet) == 1
    })
    .await;
    dsos
}

/// `rounds` changes of the DSO's `/scale` between N and 2N, each from a settled hub (the one
/// at `ops` decides); returns each member's time from the write until it held its count, and
/// the CPU time of the hub (`pids[0]`), the simulated hub cluster (`pids[1]`) and this
/// process, and the wall time, summed over the rounds.
async fn fanout(
    fleet: &Fleet,
    dsos: &Api<DistributedScaledObject>,
    ops: u16,
    [pid, sim_pid]: [u32; 2],
    rounds: usize,
) -> (Vec<Duration>, [Duration; 4], Traffic) {
    let members = fleet.held.len();
    let mut samples = Vec::with_capacity(rounds * members);
    let mut fanout_cpu = [Duration::ZERO; 4];
    let _profile = Profile::start("fanout", [pid, sim_pid, std::process::id()]);
    let mut traffic = Traffic::default();
    for round in 0..rounds {
        // Each change starts from a settled hub, as KEDA's changes do (it polls every 30 s
        // by default): not while the last change's reports are still being planned.
        settle(ops).await;
        let counted = Traffic::of(fleet, pid);
        let per_member = 1 + (round % 2) as i32;
        let target = per_member * members as i32;
        let cpu = |pids: [u32; 3]| pids.map(cpu_time);
        let pids = [pid, sim_pid, std::process::id()];
        let before = cpu(pids);
        let written = Instant::now();
        set_total(dsos, target).await;
        wait_until(
            &format!("round {round}: every member holds {per_member}"),
            || fleet.held.iter().all(|h| h.lock().unwrap().0 == per_member),
        )
        .await;
        for (i, after) in cpu(pids).into_iter().enumerate() {
            fanout_cpu[i] += after.saturating_sub(before[i]);
        }
        fanout_cpu[3] += written.elapsed();
        settle(ops).await;
        traffic.add(Traffic::of(fleet, pid).since(&counted));
        for h in &fleet.held {
            let told = h.lock().unwrap().1.expect("told");
            // A member already at the new count (before the first round) was not told.
            if told >= written {
                samples.push(told - written);
            }
        }
    }
    (samples, fanout_cpu, traffic)
}

/// quinn's counters of the agents' connections, summed: datagrams each way, and of the
/// frames in them, acknowledgements, stream data and PINGs (a probe with nothing to resend);
/// the agents' packets quinn declared lost; and the datagrams the kernel dropped because a
/// socket's receive buffer was full (every UDP socket of the machine: on loopback that is
/// where a datagram is lost).
#[derive(Default, Clone, Copy)]
struct Traffic {
    to_hub: u64,
    to_hub_acks: u64,
    to_hub_streams: u64,
    to_hub_pings: u64,
    to_hub_lost: u64,
    from_hub: u64,
    from_hub_acks: u64,
    from_hub_streams: u64,
    from_hub_pings: u64,
    udp_drops: u64,
    hub_socket_drops: u64,
}

impl Traffic {
    fn of(fleet: &Fleet, hub: u32) -> Self {
        let mut t = Self {
            udp_drops: udp_receive_buffer_errors(),
            hub_socket_drops: socket_drops(hub),
            ..Self::default()
        };
        for link in &fleet.links {
            let Some(connection) = link.lock().unwrap().clone() else {
                continue;
            };
            let s = connection.stats();
            t.add(Self {
                to_hub: s.udp_tx.datagrams,
                to_hub_acks: s.frame_tx.acks,
                to_hub_streams: s.frame_tx.stream,
                to_hub_pings: s.frame_tx.ping,
                to_hub_lost: s.path.lost_packets,
                from_hub: s.udp_rx.datagrams,
                from_hub_acks: s.frame_rx.acks,
                from_hub_streams: s.frame_rx.stream,
                from_hub_pings: s.frame_rx.ping,
                udp_drops: 0,
                hub_socket_drops: 0,
            });
        }
        t
    }

    fn add(&mut self, o: Self) {
        self.to_hub += o.to_hub;
        self.to_hub_acks += o.to_hub_acks;
        self.to_hub_streams += o.to_hub_streams;
        self.to_hub_pings += o.to_hub_pings;
        self.to_hub_lost += o.to_hub_lost;
        self.from_hub += o.from_hub;
        self.from_hub_acks += o.from_hub_acks;
        self.from_hub_streams += o.from_hub_streams;
        self.from_hub_pings += o.from_hub_pings;
        self.udp_drops += o.udp_drops;
        self.hub_socket_drops += o.hub_socket_drops;
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            to_hub: self.to_hub.saturating_sub(before.to_hub),
            to_hub_acks: self.to_hub_acks.saturating_sub(before.to_hub_acks),
            to_hub_streams: self.to_hub_streams.saturating_sub(before.to_hub_streams),
            to_hub_pings: self.to_hub_pings.saturating_sub(before.to_hub_pings),
            to_hub_lost: self.to_hub_lost.saturating_sub(before.to_hub_lost),
            from_hub_pings: self.from_hub_pings.saturating_sub(before.from_hub_pings),
            udp_drops: self.udp_drops.saturating_sub(before.udp_drops),
            hub_socket_drops: self
                .hub_socket_drops
                .saturating_sub(before.hub_socket_drops),
            from_hub: self.from_hub.saturating_sub(before.from_hub),
            from_hub_acks: self.from_hub_acks.saturating_sub(before.from_hub_acks),
            from_hub_streams: self
                .from_hub_streams
                .saturating_sub(before.from_hub_streams),
        }
    }
}

/// The machine's UDP `RcvbufErrors` (`/proc/net/snmp`): datagrams dropped because the
/// receiving socket's buffer was full.
fn udp_receive_buffer_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find_map(|(name, value)| (name == "RcvbufErrors").then(|| value.parse().ok()))
        .flatten()
        .unwrap_or(0)
}

/// The datagrams the kernel dropped at process `pid`'s UDP sockets (`drops` in
/// `/proc/net/udp` of the sockets among its file descriptors).
fn socket_drops(pid: u32) -> u64 {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            // ... inode (9), ref, pointer, drops (12)
            let (inode, drops) = (columns.get(9)?, columns.get(12)?);
            inodes.contains(*inode).then(|| drops.parse::<u64>().ok())?
        })
        .sum()
}

/// `perf record` of the hub, the simulated hub cluster and the virtual agents over one
/// phase, when `FLEET_BENCH_PERF` names the file to write (`perf report -i FILE --sort
/// pid,dso,sym` reads it): the fan-out rounds, or with `FLEET_BENCH_PERF_PHASE=restart` the
/// new hub's start until every agent is re-synced. perf's sampling costs CPU, so the
/// profiled phase's figures are not comparable with other runs'.
struct Profile(Option<std::process::Child>);

impl Profile {
    fn start(phase: &str, pids: [u32; 3]) -> Self {
        let Some(file) = std::env::var_os("FLEET_BENCH_PERF") else {
            return Self(None);
        };
        let profiled = std::env::var("FLEET_BENCH_PERF_PHASE");
        if profiled.as_deref().unwrap_or("fanout") != phase {
            return Self(None);
        }
        let pids = pids.map(|p| p.to_string()).join(",");
        let child = std::process::Command::new("perf")
            .args([
                "record",
                "-F",
                "499",
                "--call-graph",
                "dwarf",
                "-p",
                &pids,
                "-o",
            ])
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("FLEET_BENCH_PERF is set but perf did not start: {e}"));
        eprintln!(
            "perf record of processes {pids} into {}",
            file.to_string_lossy()
        );
        Self(Some(child))
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // perf writes its file when interrupted.
            let _ = std::process::Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

async fn measure(members: usize, rounds: usize) -> Row {
    let Prepared {
        dir,
        sim,
        ca,
        server,
        names,
        configs,
    } = prepare(members).await;
    let hub_client = sim.client.clone();
    let (quic, ops) = (free_port_udp(), free_port_tcp());
    let hub = start_hub(dir.path(), "hub.log", members, quic, ops);
    let hub_started = Instant::now();
    let pid = hub.id().unwrap();
    // Ready once its controllers have synced (it then holds its Lease).
    let ready = format!("http://127.0.0.1:{ops}/readyz");
    wait_until_ready(&ready).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_empty = memory(pid).rss;

    let fleet = new_fleet(members);
    let hub_addr: Arc<[SocketAddr]> = Arc::new([format!("127.0.0.1:{quic}").parse().unwrap()]);
    let started = Instant::now();
    let (agents, endpoints) = spawn_agents(configs, &fleet, |_| hub_addr.clone());
    wait_until("every virtual agent welcomed", || {
        fleet.welcomed.load(Ordering::Acquire) == members
    })
    .await;
    let connected = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_connected = memory(pid).rss;

    let dsos = create_dso(hub_client, &names, &fleet).await;
    profiles_published(ops, members).await;
    let (samples, fanout_cpu, fanout_traffic) =
        fanout(&fleet, &dsos, ops, [pid, sim.pid], rounds).await;
    // The DSO's status follows the members' reports: it counts every member, and lists at
    // most `MAX_LISTED_MEMBERS` of them (a status with an entry per member of a large fleet
    // is more than etcd stores, and its writes would fail).
    let last = (1 + ((rounds - 1) % 2) as i32) * members as i32;
    let counted = status_counts(&dsos, last).await;
    eprintln!(
        "{members} members: the DSO status counted the last total {counted:.1?} after the round"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_rest = memory(pid).rss;
    let cpu_rest = millicores(pid, Duration::from_secs(10)).await;
    soak(pid, hub_started, members, rss_empty).await;
    let reconciles = dso_reconciles(ops).await;
    let ended = fleet.ended.load(Ordering::Acquire);
    let retries = fleet.retries.load(Ordering::Acquire);

    // From here on no replica count may change.
    fleet.frozen.store(true, Ordering::Release);

    // Half the fleet's connections cut at once while the hub and the other half run on: the
    // half reconnects, the hub accepts them (handshakes bounded by --max-handshakes) without
    // losing an established session, and each reconnected agent already holds its state.
    let retries_sent = |metrics: Option<String>| {
        metrics
            .as_deref()
            .and_then(|m| m.lines().find(|l| l.starts_with("kedge_hub_retries_total")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_default()
    };
    let metrics_url = format!("http://127.0.0.1:{ops}/metrics");
    let retries_before_flap = retries_sent(http_get(&metrics_url).await);
    let flap = flap(&fleet, ops, members).await;
    // Reconnecting agents prove their address with the token the hub gave them: no Retry.
    eprintln!(
        "{members} members: flap: {} QUIC Retries sent for {} reconnects",
        retries_sent(http_get(&metrics_url).await) - retries_before_flap,
        members / 2
    );

    // Reconnect storm: the hub is stopped as a rollout stops it (SIGTERM) and a new one
    // starts on the same address; every agent reconnects and must be sent its state again
    // with no replica count changed.
    let before: Vec<usize> = fleet
        .sessions
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .collect();
    let stopped = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let mut hub = hub;
    tokio::time::timeout(STEP_LIMIT, hub.wait())
        .await
        .expect("the hub did not stop on SIGTERM")
        .unwrap();
    let stop_took = stopped.elapsed();
    let exited = Instant::now();
    let started_again = Instant::now();
    let hub = start_hub(dir.path(), "hub-restarted.log", members, quic, ops);
    let new_pid = hub.id().unwrap();
    let profile = Profile::start("restart", [new_pid, sim.pid, std::process::id()]);
    let mut peak_rss = 0;
    let retries_before = fleet.retries.load(Ordering::Acquire);
    let mut reconnected = None;
    let mut ready_at = None;
    let resynced = |f: &Fleet| {
        (0..members).all(|i| {
            let sessions = f.sessions[i].load(Ordering::Acquire);
            sessions > before[i] && f.synced[i].load(Ordering::Acquire) == sessions
        })
    };
    while !resynced(&fleet) {
        assert!(
            started_again.elapsed() < STEP_LIMIT,
            "reconnect storm: not every agent re-synced after {STEP_LIMIT:?}"
        );
        peak_rss = peak_rss.max(memory(new_pid).rss);
        if ready_at.is_none() && http_get(&ready).await.is_some() {
            ready_at = Some(started_again.elapsed());
        }
        if reconnected.is_none()
            && (0..members).all(|i| fleet.sessions[i].load(Ordering::Acquire) > before[i])
        {
            reconnected = Some(started_again.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(profile);
    eprintln!(
        "{members} members: restart: SIGTERM → exited {stop_took:.2?}; new hub ready (leading) after {:.2?}",
        ready_at.unwrap_or_default()
    );
    eprint!(
        "{members} members: {}",
        dials::restart(&fleet.dials, stopped, exited, started_again)
    );
    // What the new hub counted of the attempts it turned away or lost, by reason, and its DSO
    // reconciliations.
    if let Some(metrics) = http_get(&format!("http://127.0.0.1:{ops}/metrics")).await {
        for line in metrics.lines().filter(|l| {
            !l.starts_with('#')
                && (l.contains("handshake_failures")
                    || l.contains("sessions_refused")
                    || l.contains("kedge_hub_retries")
                    || (l.contains("controller=\"distributedscaledobject\"")
                        && (l.contains("reconciles_total")
                            || l.contains("reconcile_duration_seconds_sum"))))
        }) {
            eprintln!("{members} members: restarted hub: {line}");
        }
    }
    let storm = Storm {
        stop: stop_took,
        resynced: started_again.elapsed(),
        reconnected: reconnected.unwrap_or_else(|| started_again.elapsed()),
        retries: fleet.retries.load(Ordering::Acquire) - retries_before,
        peak_rss: peak_rss.max(memory(new_pid).rss),
        cpu: common::cpu_time(new_pid),
        resumed: resumptions(ops).await,
        wrong: fleet.wrong.load(Ordering::Acquire),
    };

    drop(hub);
    for agent in agents {
        agent.abort();
    }
    for endpoint in &endpoints {
        endpoint.close(0u32.into(), b"bench done");
    }
    // Their sockets are file descriptors the push baseline's stand-ins need.
    drop(endpoints);
    // The hub's figures so far, in case the baseline below does not finish.
    eprintln!(
        "{members} members: welcomed in {:.1} s; hub RSS {} → {}; rounds written → all held: {} samples, max {}; flap re-synced in {:.2} s ({} lost); restart re-synced in {:.2} s ({} counts changed)",
        connected.as_secs_f64(),
        mib(rss_empty),
        mib(rss_connected),
        samples.len(),
        ms(samples.iter().max().copied().unwrap_or_default()),
        flap.resynced.as_secs_f64(),
        flap.lost,
        storm.resynced.as_secs_f64(),
        storm.wrong,
    );
    let push = push_baseline(
        &dsos,
        dir.path(),
        sim.url.clone(),
        (&ca, &server),
        members,
        rounds,
    )
    .await;
    sim.stop().await;
    if std::env::var_os("FLEET_BENCH_KEEP").is_some() {
        eprintln!(
            "{members} members: hub logs kept in {}",
            dir.keep().display()
        );
    }
    Row {
        members,
        connected,
        rss_empty,
        rss_connected,
        rss_rest,
        cpu_rest,
        samples,
        ended,
        retries,
        reconciles,
        fanout_cpu,
        fanout_traffic,
        storm,
        flap,
        push,
    }
}

/// `kedge_hub_resyncs_total{kind}` of the hub at `ops`.
/// With `FLEET_BENCH_SOAK_SECS=N` (at most an hour): the hub at rest until it has run N
/// seconds, its RSS read every 30 s. What a hub holds after its periodic work (the
/// ClusterProfile relist every 5 minutes, the MemberCluster status refreshes) that the
/// rounds, all in its first minutes, do not show.
async fn soak(pid: u32, hub_started: Instant, members: usize, rss_empty: u64) {
    let Some(secs) = std::env::var("FLEET_BENCH_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let until = hub_started + Duration::from_secs(secs.min(3600));
    let mut samples = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(30).min(until - Instant::now())).await;
        samples.push((hub_started.elapsed().as_secs(), memory(pid).rss));
    }
    let shown: Vec<String> = samples
        .iter()
        .map(|(at, rss)| format!("{at} s: {}", mib(*rss)))
        .collect();
    eprintln!(
        "{members} members: hub RSS at rest since its start: {}",
        shown.join(", ")
    );
    if let Some((at, rss)) = samples.last() {
        eprintln!(
            "{members} members: after {at} s, {:.1} KiB per member over the empty hub",
            rss.saturating_sub(rss_empty) as f64 / members as f64
        );
    }
}

async fn resyncs(ops: u16, kind: &str) -> u64 {
    let metrics = hub_metrics(ops).await;
    sample(
        &metrics,
        &format!(r#"kedge_hub_resyncs_total{{kind="{kind}"}}"#),
    ) as u64
}

/// TLS sessions the hub resumed from a ticket.
async fn resumptions(ops: u16) -> u64 {
    sample(&hub_metrics(ops).await, "kedge_hub_tls_resumptions_total") as u64
}

/// The hub's `/metrics` page.
async fn hub_metrics(ops: u16) -> String {
    http_get(&format!("http://127.0.0.1:{ops}/metrics"))
        .await
        .expect("the hub's /metrics")
}

/// The value of the sample `series` (name and labels) on a metrics page; 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Cuts the sessions of every even-numbered virtual agent at once (see [`Fleet::flap`]) and
/// waits until each has a new session that the hub re-synced.
async fn flap(fleet: &Fleet, ops: u16, members: usize) -> Flap {
    let before: Vec<usize> = fleet
        .sessions
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .collect();
    let (in_sync, sent) = (resyncs(ops, "in_sync").await, resyncs(ops, "sent").await);
    let resumed = resumptions(ops).await;
    let cut = members.div_ceil(2) as u64;
    let started = Instant::now();
    fleet.flap.send_modify(|n| *n += 1);
    let back = |f: &Fleet| {
        (0..members)
            .step_by(2)
            .all(|i| f.sessions[i].load(Ordering::Acquire) > before[i])
    };
    wait_until("half the fleet reconnected", || back(fleet)).await;
    let reconnected = started.elapsed();
    loop {
        let done = resyncs(ops, "in_sync").await + resyncs(ops, "sent").await - in_sync - sent;
        if done >= cut {
            break;
        }
        assert!(
            started.elapsed() < STEP_LIMIT,
            "flap: {done} of {cut} reconnected sessions re-synced after {STEP_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resynced = started.elapsed();
    // The other half kept its sessions.
    let lost = (1..members)
        .step_by(2)
        .filter(|&i| fleet.sessions[i].load(Ordering::Acquire) != before[i])
        .count();
    Flap {
        cut: cut as usize,
        reconnected,
        resynced,
        in_sync: resyncs(ops, "in_sync").await - in_sync,
        sent: resyncs(ops, "sent").await - sent,
        resumed: resumptions(ops).await - resumed,
        lost,
    }
}

/// The same fan-out done push-style (see [`push`]): the push controller's memory and CPU,
/// the first fan-out (which opens every member's connection), then `rounds` changes timed
/// from the `/scale` write on the hub to each member's API server holding the new count.
async fn push_baseline(
    dsos: &Api<DistributedScaledObject>,
    dir: &Path,
    hub_url: String,
    (ca, server): (&CertificateAuthority, &kedge_net::pki::IssuedCert),
    members: usize,
    rounds: usize,
) -> Push {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let held: push::Held = Arc::new((0..members).map(|_| Mutex::new((0, None))).collect());
    let urls = push::start_members(members, Arc::new(tls), held.clone()).await;
    let config = push::PushConfig {
        hub_url,
        members: urls,
        ca_pem: ca.cert_pem().to_owned(),
    };
    let mut pusher = push::start_pusher(dir, &config);
    let pid = pusher.id().unwrap();
    let mut lines = push::lines(&mut pusher);
    push::expect_line(&mut lines, "started").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_empty = memory(pid).rss;
    {
        use tokio::io::AsyncWriteExt;
        let mut go = pusher.stdin.take().unwrap();
        go.write_all(b"go\n").await.unwrap();
        go.flush().await.unwrap();
    }
    push::expect_line(&mut lines, "clients").await;
    let every = |n: i32| {
        let held = held.clone();
        move || held.iter().all(|h| h.lock().unwrap().0 == n)
    };
    // The first fan-out opens a connection (TCP and TLS) to every member.
    let written = Instant::now();
    set_total(dsos, 3 * members as i32).await;
    wait_until("push: every member holds 3", every(3)).await;
    let first = written.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_connected = memory(pid).rss;
    let mut samples = Vec::with_capacity(rounds * members);
    for round in 0..rounds {
        tokio::time::sleep(QUIET).await;
        let per_member = 1 + (round % 2) as i32;
        let written = Instant::now();
        set_total(dsos, per_member * members as i32).await;
        wait_until(
            &format!("push round {round}: every member holds {per_member}"),
            every(per_member),
        )
        .await;
        for h in held.iter() {
            let told = h.lock().unwrap().1.expect("told");
            samples.push(told.saturating_duration_since(written));
        }
    }
    let cpu_rest = millicores(pid, Duration::from_secs(10)).await;
    drop(pusher);
    Push {
        rss_empty,
        rss_connected,
        cpu_rest,
        first,
        samples,
    }
}

/// Writes the DSO's fleet-wide total through `/scale`, as KEDA's HPA or `kubectl scale` do.
/// Waits until the DSO's status counts `total` replicas over every member; checks that it
/// lists no more members than it may.
async fn status_counts(dsos: &Api<DistributedScaledObject>, total: i32) -> Duration {
    let start = Instant::now();
    loop {
        let status = dsos
            .get_status(WORKLOAD)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        assert!(
            status.member_cluster_statuses.len() <= kedge_core::crd::MAX_LISTED_MEMBERS,
            "the status lists {} members",
            status.member_cluster_statuses.len()
        );
        if status.total_current_replicas == total {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < STEP_LIMIT,
            "the DSO status counts {} replicas, not {total}, after {STEP_LIMIT:?}",
            status.total_current_replicas
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn set_total(dsos: &Api<DistributedScaledObject>, total: i32) {
    dsos.patch_scale(
        WORKLOAD,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": total}})),
    )
    .await
    .unwrap();
}

/// The body of a GET that answered 2xx.
async fn http_get(url: &str) -> Option<String> {
    use http_body_util::BodyExt;
    let uri: hyper::Uri = url.parse().ok()?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
    let response = tokio::time::timeout(Duration::from_secs(5), client.get(uri))
        .await
        .ok()?
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

async fn wait_until_ready(url: &str) {
    let start = Instant::now();
    while http_get(url).await.is_none() {
        assert!(start.elapsed() < STEP_LIMIT, "the hub never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long the hub's DSO reconciliations must stay still for the hub to count as settled.
const QUIET: Duration = Duration::from_millis(1200);

/// Waits until the hub has made no DSO reconciliation for [`QUIET`] (a deferred status
/// write comes within a second).
async fn settle(ops: u16) {
    let start = Instant::now();
    let mut count = dso_reconciles(ops).await.0;
    loop {
        tokio::time::sleep(QUIET).await;
        let now = dso_reconciles(ops).await.0;
        if now == count {
            return;
        }
        assert!(start.elapsed() < STEP_LIMIT, "the hub never settled");
        count = now;
    }
}

/// Waits until the hub has published a ClusterProfile for each of `members` (256 every 2 s:
/// 80 s at 10,000), so that the rounds measure a hub at rest, as KEDA's changes meet it,
/// not one still writing its first profiles.
async fn profiles_published(ops: u16, members: usize) {
    let start = Instant::now();
    // Twice the publisher's pace, and never less than a step.
    let limit = STEP_LIMIT.max(Duration::from_millis(16 * members as u64));
    let series = r#"kedge_hub_status_writes_total{controller="clusterprofile"}"#;
    while (sample(&hub_metrics(ops).await, series) as usize) < members {
        assert!(
            start.elapsed() < limit,
            "the hub did not publish {members} ClusterProfiles in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "{members} members: ClusterProfiles published after {:.1?}",
        start.elapsed()
    );
}

/// The hub's DSO reconciliations so far: how many, and their mean duration.
async fn dso_reconciles(ops: u16) -> (u64, Duration) {
    let metrics = hub_metrics(ops).await;
    let value = |suffix: &str| {
        sample(
            &metrics,
            &format!(
                r#"kedge_hub_reconcile_duration_seconds_{suffix}{{controller="distributedscaledobject"}}"#
            ),
        )
    };
    let (count, sum) = (value("count"), value("sum"));
    let mean = if count > 0.0 { sum / count } else { 0.0 };
    (count as u64, Duration::from_secs_f64(mean))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(config) = std::env::var_os(push::PUSHER_ENV) {
        push::run_pusher(&config.to_string_lossy()).await;
        return;
    }
    // The hub and kedge-sim it starts are release binaries it does not build (unless
    // KEDGE_HUB_BIN or KEDGE_SIM_BIN name others): a stale one stops it, unless
    // FLEET_BENCH_STALE_OK=1 says that is meant.
    let crates = ["core", "net", "protocol", "scaler-api"];
    for (binary, overridden, own) in [
        ("kedge-hub", "KEDGE_HUB_BIN", "hub"),
        ("kedge-sim", "KEDGE_SIM_BIN", "sim"),
    ] {
        if std::env::var_os(overridden).is_some() {
            continue;
        }
        let own_crates: Vec<&str> = crates.iter().copied().chain([own]).collect();
        if let Some(why) = common::stale(&bin_dir().join(binary), &own_crates) {
            assert!(
                std::env::var_os("FLEET_BENCH_STALE_OK").is_some(),
                "{why} (or set FLEET_BENCH_STALE_OK=1)"
            );
            eprintln!("warning: {why}");
        }
    }
    let counts = common::counts("FLEET_BENCH_MEMBERS", "100,1000");
    let rounds: usize = env_or("FLEET_BENCH_ROUNDS", 10);
    // FLEET_BENCH_REPLICAS > 1: the sharded replicas instead of one hub (see `shards`).
    let replicas: usize = env_or("FLEET_BENCH_REPLICAS", 1);
    if replicas > 1 {
        let mut rows = Vec::new();
        for &members in &counts {
            rows.push(shards::measure_sharded(members, replicas, rounds).await);
        }
        shards::print(&mut rows);
        println!();
        println!(
            "Machine: {}; {rounds} rounds; heartbeat {HEARTBEAT}; virtual agents in the bench's process, each replica and the simulated hub cluster in their own.",
            machine()
        );
        for r in &rows {
            assert_eq!(
                r.wrong, 0,
                "{} members: a failover changed replica counts",
                r.members
            );
        }
        return;
    }
    println!(
        "| members | all welcomed (retries) | hub RSS empty → connected (per member) | with the DSO at rest | CPU at rest | /scale → every member told: first | p50 | p95 | p99 | max | DSO reconciles (mean) | sessions lost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &members in &counts {
        let mut r = measure(members, rounds).await;
        print_row(&mut r);
        rows.push(r);
    }
    println!();
    println!(
        "| members | a /scale round (written → every member holds it), mean: wall | hub CPU | simulated hub cluster CPU | virtual agents CPU | cores busy |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        let [hub, sim, agents, wall] = r.fanout_cpu;
        let per_round = |d: Duration| ms(d / rounds.max(1) as u32);
        println!(
            "| {} | {} | {} | {} | {} | {:.2} |",
            r.members,
            per_round(wall),
            per_round(hub),
            per_round(sim),
            per_round(agents),
            (hub + sim + agents).as_secs_f64() / wall.as_secs_f64().max(0.001),
        );
    }
    println!();
    println!(
        "| members | per member and round, the settling after it included: datagrams hub → agent | STREAM frames in them | ACK frames | PING frames | datagrams agent → hub | STREAM frames | ACK frames | PING frames | agent packets declared lost | datagrams dropped by full receive buffers: all sockets | the hub's |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let t = r.fanout_traffic;
        let per = |n: u64| n as f64 / (r.members * rounds.max(1)) as f64;
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.members,
            per(t.from_hub),
            per(t.from_hub_streams),
            per(t.from_hub_acks),
            per(t.from_hub_pings),
            per(t.to_hub),
            per(t.to_hub_streams),
            per(t.to_hub_acks),
            per(t.to_hub_pings),
            per(t.to_hub_lost),
            per(t.udp_drops),
            per(t.hub_socket_drops),
        );
    }
    println!();
    println!(
        "| members | hub restart: SIGTERM → exited | new hub → every agent reconnected (failed attempts) | TLS sessions resumed | → every agent re-synced | peak RSS | CPU (mean) | replica counts changed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let s = &r.storm;
        println!(
            "| {} | {:.2} s | {:.2} s ({}) | {} | {:.2} s | {:.1} MiB | {:.2} s ({}m) | {} |",
            r.members,
            s.stop.as_secs_f64(),
            s.reconnected.as_secs_f64(),
            s.retries,
            s.resumed,
            s.resynced.as_secs_f64(),
            s.peak_rss as f64 / 1024.0,
            s.cpu.as_secs_f64(),
            (s.cpu.as_secs_f64() * 1000.0 / s.resynced.as_secs_f64().max(0.001)) as u64,
            s.wrong,
        );
    }
    println!();
    println!(
        "| members | half the connections cut at once | → all reconnected (TLS sessions resumed) | → all re-synced (in sync / sent again) | other half's sessions lost |"
    );
    println!("|---|---|---|---|---|");
    for r in &rows {
        let f = &r.flap;
        println!(
            "| {} | {} | {:.2} s ({}) | {:.2} s ({} / {}) | {} |",
            r.members,
            f.cut,
            f.reconnected.as_secs_f64(),
            f.resumed,
            f.resynced.as_secs_f64(),
            f.in_sync,
            f.sent,
            f.lost,
        );
    }
    println!();
    println!(
        "| members | push-style baseline: controller RSS empty → a client per member (per member) | CPU at rest | first fan-out (connects) | /scale → every member's API server: first | p50 | p95 | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &mut rows {
        let p = &mut r.push;
        p.samples.sort();
        println!(
            "| {} | {} → {} ({:.1} KiB) | {}m | {} | {} | {} | {} | {} | {} |",
            r.members,
            mib(p.rss_empty),
            mib(p.rss_connected),
            p.rss_connected.saturating_sub(p.rss_empty) as f64 / r.members as f64,
            p.cpu_rest,
            ms(p.first),
            ms(percentile(&p.samples, 0.0)),
            ms(percentile(&p.samples, 0.5)),
            ms(percentile(&p.samples, 0.95)),
            ms(percentile(&p.samples, 0.99)),
            ms(percentile(&p.samples, 1.0)),
        );
    }
    println!();
    println!(
        "Machine: {}; {rounds} rounds; heartbeat {HEARTBEAT}; virtual agents in the bench's process, the simulated hub cluster in its own.",
        machine()
    );
    for r in &rows {
        assert_eq!(r.ended, 0, "{} members: the hub closed sessions", r.members);
        assert_eq!(
            r.flap.lost, 0,
            "{} members: agents lost their sessions while others reconnected",
            r.members
        );
        assert_eq!(
            r.storm.wrong, 0,
            "{} members: a hub restart changed replica counts",
            r.members
        );
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The `p` quantile of sorted `samples` (nearest rank).
fn percentile(samples: &[Duration], p: f64) -> Duration {
    samples
        .get(((samples.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn print_row(r: &mut Row) {
    r.samples.sort();
    let pct = |p: f64| percentile(&r.samples, p);
    println!(
        "| {} | {:.1} s ({}) | {} → {} ({:.1} KiB) | {} | {}m | {} | {} | {} | {} | {} | {} ({}) | {} |",
        r.members,
        r.connected.as_secs_f64(),
        r.retries,
        mib(r.rss_empty),
        mib(r.rss_connected),
        r.rss_connected.saturating_sub(r.rss_empty) as f64 / r.members as f64,
        mib(r.rss_rest),
        r.cpu_rest,
        ms(pct(0.0)),
        ms(pct(0.5)),
        ms(pct(0.95)),
        ms(pct(0.99)),
        ms(pct(1.0)),
        r.reconciles.0,
        ms(r.reconciles.1),
        r.ended,
    );
}
