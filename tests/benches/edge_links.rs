//! What kedge costs and how it behaves on edge links: the real kedge-hub and kedge-agents on
//! the local fleet, each agent behind kedge-sim's link emulator with one link profile
//! (perfect, LTE, satellite, a bad cellular modem, periodic blackouts, NAT rebinding). For
//! each heartbeat interval it measures, per profile:
//! - idle traffic: bytes a second both ways while nothing changes (UDP payload as the
//!   emulator forwards it, and on the wire with IPv4 and UDP headers);
//! - scale commands: from a DSO's `/scale` change to the member's Deployment, p50 and p99,
//!   and how much later than the first perfect-link member;
//! - false `Unreachable`: times the hub took a member on a live link for gone, and the
//!   sessions it had to establish, over the whole run (at least `EDGE_BENCH_SOAK`);
//! - reconnects after blackouts: handshake bytes, datagrams sent into the outage, and the time
//!   from the link's return to a connected session.
//!
//! `cargo bench -p kedge-e2e --bench edge_links` (build the binaries first:
//! `cargo build --release --workspace --bins`; the bench uses the binaries of its own
//! profile). Settings: `EDGE_BENCH_HEARTBEATS` (default `10s,5s`), `EDGE_BENCH_IDLE` (seconds,
//! default 60), `EDGE_BENCH_ROUNDS` (scale commands, default 100), `EDGE_BENCH_SOAK` (seconds
//! each fleet runs at least, default 600). Prints the machine and a Markdown table per
//! heartbeat interval; exits non-zero when a target of issue 32 is missed (idle ≤ 50 B/s at a
//! 10 s heartbeat, commands on the bad link ≤ 3 s behind a perfect one at p99, no false
//! Unreachable, one handshake per rebinding member).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kedge_core::crd::DistributedScaledObject;
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kedge_sim::link::{LinkSpec, LinkStats};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// A link profile: its name and emulator spec.
struct Profile {
    name: &'static str,
    spec: &'static str,
    /// Whether the DSO places replicas there (the blackout member only measures reconnects).
    in_dso: bool,
}

const PROFILES: [Profile; 6] = [
    Profile {
        name: "perfect (loopback)",
        spec: "seed=1",
        in_dso: true,
    },
    Profile {
        name: "LTE",
        spec: "rtt=60ms,jitter=10ms,loss=1,rate=10Mbit,seed=2",
        in_dso: true,
    },
    Profile {
        name: "satellite (GEO)",
        spec: "rtt=600ms,jitter=20ms,loss=1,rate=2Mbit,seed=3",
        in_dso: true,
    },
    Profile {
        name: "bad cellular",
        spec: "rtt=600ms,jitter=50ms,loss=5,rate=64kbit,seed=4",
        in_dso: true,
    },
    Profile {
        name: "blackout 30s/120s",
        spec: "blackout=30s/120s,seed=5",
        in_dso: false,
    },
    Profile {
        name: "NAT rebind 20s",
        spec: "rebind=20s,seed=6",
        in_dso: true,
    },
];

/// IPv4 (20 bytes) and UDP (8 bytes) headers: what each datagram adds on the wire.
const HEADERS: u64 = 28;
/// The emulated blackout: down for the last 30 s of every 120 s.
const BLACKOUT: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(120));
/// Member running on a perfect link: the reference for command lags.
const PERFECT: usize = 0;
/// The bad link of the issue.
const BAD: usize = 3;
/// The member with blackouts.
const DARK: usize = 4;
/// The member whose NAT rebinds.
const REBINDING: usize = 5;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn member(i: usize) -> String {
    format!("member-{}", i + 1)
}

/// What one run measured for one profile.
#[derive(Debug, Default, Clone)]
struct Row {
    idle_payload: f64,
    idle_wire: f64,
    latencies: Vec<Duration>,
    lags: Vec<Duration>,
    false_unreachable: u64,
    sessions: u64,
    migrations: u64,
    reconnects: Vec<Reconnect>,
}

/// One return after a blackout.
#[derive(Debug, Clone, Copy)]
struct Reconnect {
    handshake_bytes: u64,
    took: Duration,
}

/// What the session poller saw of each member.
#[derive(Debug, Default)]
struct Seen {
    /// Polls that found the member Unreachable while its link was up.
    false_unreachable: BTreeMap<String, u64>,
    /// The last state seen, to count transitions.
    last: BTreeMap<String, String>,
    /// For the blackout member: each new session's handshake bytes and when it was first seen.
    reconnects: Vec<(u64, Instant, u64)>,
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{}", d.as_millis())
}

/// Whether the blackout schedule anchored at `anchor` has the link down at `at`.
fn dark_at(anchor: Instant, at: Instant) -> bool {
    let (down, period) = BLACKOUT;
    let into = at.saturating_duration_since(anchor).as_millis() % period.as_millis();
    into >= (period - down).as_millis()
}

/// When the link of the blackout schedule anchored at `anchor` last came back before `at`.
fn last_return(anchor: Instant, at: Instant) -> Instant {
    let period = BLACKOUT.1.as_millis();
    let cycles = at.saturating_duration_since(anchor).as_millis() / period;
    anchor + Duration::from_millis((cycles * period) as u64)
}

async fn deployments(fleet: &Fleet) -> Vec<Api<Deployment>> {
    (0..PROFILES.len())
        .map(|i| {
            let client = fleet.sim.cluster(&member(i)).unwrap().client().unwrap();
            Api::namespaced(client, "default")
        })
        .collect()
}

/// The example Deployment in every member, and a DSO spreading it evenly over the members
/// in the DSO, its total set through `/scale` only.
async fn install(fleet: &Fleet) {
    let yaml = include_str!("../../deploy/examples/fleet/nginx-deployment.yaml");
    let deployment: Value = serde_yaml::from_str(yaml).unwrap();
    let apply = PatchParams::apply("edge-bench").force();
    for api in deployments(fleet).await {
        api.patch("nginx", &apply, &Patch::Apply(&deployment))
            .await
            .unwrap();
    }
    let members: Vec<Value> = PROFILES
        .iter()
        .enumerate()
        .filter(|(_, p)| p.in_dso)
        .map(|(i, _)| json!({"name": member(i), "weight": 1}))
        .collect();
    let dso = json!({
        "apiVersion": "kedge.dev/v1alpha1",
        "kind": "DistributedScaledObject",
        "metadata": {"name": "nginx", "namespace": "default"},
        "spec": {
            "memberClusters": members,
            "scaledObjectSpec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "nginx"},
                "pollingInterval": 3600,
                "minReplicaCount": 1,
                "maxReplicaCount": 100,
                "triggers": [{"type": "kubernetes-resource", "metadata": {
                    "resourceKind": "ConfigMap", "resourceName": METRIC, "key": "total",
                    "targetValue": "1"}}],
            },
        },
    });
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let metric = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": METRIC, "namespace": "default"}, "data": {"total": "1"}});
    let maps: Api<ConfigMap> = Api::namespaced(hub.clone(), "default");
    maps.patch(METRIC, &apply, &Patch::Apply(&metric))
        .await
        .unwrap();
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub, "default");
    dsos.patch("nginx", &apply, &Patch::Apply(&dso))
        .await
        .unwrap();
}

/// The ConfigMap whose `total` the DSO's trigger reads: kept equal to the total set through
/// `/scale`, so that KEDA's HPA, whenever it looks, agrees with it.
const METRIC: &str = "edge-bench";

/// Sets the total and measures each DSO member's time to its share (`per` replicas each).
async fn command(fleet: &Fleet, apis: &[Api<Deployment>], per: i32) -> Vec<Option<Duration>> {
    let hub = fleet.sim.cluster(HUB_CLUSTER).unwrap().client().unwrap();
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub.clone(), "default");
    let in_dso: Vec<usize> = (0..PROFILES.len())
        .filter(|&i| PROFILES[i].in_dso)
        .collect();
    let total = per * in_dso.len() as i32;
    let maps: Api<ConfigMap> = Api::namespaced(hub.clone(), "default");
    let metric = json!({"data": {"total": total.to_string()}});
    maps.patch(METRIC, &PatchParams::default(), &Patch::Merge(&metric))
        .await
        .unwrap();
    let patch = json!({"spec": {"replicas": total}});
    let start = Instant::now();
    dsos.patch_scale("nginx", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let mut reached: Vec<Option<Duration>> = vec![None; PROFILES.len()];
    let deadline = start + Duration::from_secs(30);
    while Instant::now() < deadline && in_dso.iter().any(|&i| reached[i].is_none()) {
        for &i in &in_dso {
            if reached[i].is_none()
                && let Ok(d) = apis[i].get("nginx").await
                && d.spec.and_then(|s| s.replicas) == Some(per)
            {
                reached[i] = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reached
}

fn link_bytes(stats: &LinkStats) -> (u64, u64) {
    (
        stats.to_hub.bytes + stats.to_agent.bytes,
        stats.to_hub.packets + stats.to_agent.packets,
    )
}

/// Polls `/v1/sessions` every 500 ms until `stop`, counting what [`Seen`] keeps.
fn poll_sessions(
    fleet: &Fleet,
    anchor: Instant,
    stop: tokio_util::sync::CancellationToken,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    let ops = fleet.ops_url();
    let task = tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
        let uri: hyper::Uri = format!("{ops}/v1/sessions").parse().unwrap();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            let Ok(Ok(response)) =
                tokio::time::timeout(Duration::from_secs(5), client.get(uri.clone())).await
            else {
                continue;
            };
            use http_body_util::BodyExt;
            let Ok(body) = response.into_body().collect().await else {
                continue;
            };
            let Ok(sessions) = serde_json::from_slice::<Vec<Value>>(&body.to_bytes()) else {
                continue;
            };
            let now = Instant::now();
            let mut seen = record.lock().unwrap();
            for s in &sessions {
                let name = s["member"].as_str().unwrap_or_default().to_owned();
                let state = s["state"].as_str().unwrap_or_default().to_owned();
                let dark = name == member(DARK);
                let previous = seen.last.insert(name.clone(), state.clone());
                if state == "Unreachable"
                    && previous.as_deref() == Some("Connected")
                    && !(dark && dark_at(anchor, now - Duration::from_secs(10)))
                {
                    *seen.false_unreachable.entry(name.clone()).or_default() += 1;
                }
                let sessions = s["sessions"].as_u64().unwrap_or_default();
                if dark
                    && state == "Connected"
                    && seen.reconnects.last().is_none_or(|r| r.2 < sessions)
                {
                    let bytes = s["link"]["handshakeBytes"].as_u64().unwrap_or_default();
                    seen.reconnects.push((bytes, now, sessions));
                }
            }
        }
    });
    (seen, task)
}

async fn run(heartbeat: &str, idle: Duration, rounds: usize, soak: Duration) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(PROFILES.len(), dir.path().to_owned()).unwrap();
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    config.heartbeat = heartbeat.to_owned();
    for (i, p) in PROFILES.iter().enumerate() {
        config.links.insert(member(i), p.spec.parse().unwrap());
    }
    let started = Instant::now();
    let fleet = Fleet::up(config).await.expect("fleet up");
    // The blackout schedule starts now, where the bench can tell outages from false alarms.
    let dark_spec: LinkSpec = PROFILES[DARK].spec.parse().unwrap();
    fleet.link(&member(DARK)).unwrap().set_spec(dark_spec);
    let anchor = Instant::now();
    let stop = tokio_util::sync::CancellationToken::new();
    let (seen, poller) = poll_sessions(&fleet, anchor, stop.clone());
    let mut rows = vec![Row::default(); PROFILES.len()];

    // Idle: nothing placed anywhere yet.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: Vec<(u64, u64)> = (0..PROFILES.len())
        .map(|i| link_bytes(&fleet.link(&member(i)).unwrap().stats()))
        .collect();
    let t0 = Instant::now();
    tokio::time::sleep(idle).await;
    let secs = t0.elapsed().as_secs_f64();
    for (i, row) in rows.iter_mut().enumerate() {
        let (bytes, packets) = link_bytes(&fleet.link(&member(i)).unwrap().stats());
        let (bytes, packets) = (bytes - before[i].0, packets - before[i].1);
        row.idle_payload = bytes as f64 / secs;
        row.idle_wire = (bytes + HEADERS * packets) as f64 / secs;
    }
    eprintln!("[{heartbeat}] idle measured over {secs:.0} s");

    // Scale commands.
    install(&fleet).await;
    let apis = deployments(&fleet).await;
    command(&fleet, &apis, 1).await;
    for round in 0..rounds {
        let per = if round % 2 == 0 { 2 } else { 1 };
        let reached = command(&fleet, &apis, per).await;
        let Some(perfect) = reached[PERFECT] else {
            continue;
        };
        for (i, r) in reached.iter().enumerate() {
            if let Some(took) = r {
                rows[i].latencies.push(*took);
                rows[i].lags.push(took.saturating_sub(perfect));
            }
        }
    }
    eprintln!("[{heartbeat}] {rounds} scale commands measured");

    // The rest of the soak.
    let left = soak.saturating_sub(started.elapsed());
    eprintln!("[{heartbeat}] soaking {} s more", left.as_secs());
    tokio::time::sleep(left).await;
    stop.cancel();
    let _ = poller.await;
    let sessions = fleet.sessions().await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for (i, row) in rows.iter_mut().enumerate() {
        let name = member(i);
        row.false_unreachable = seen.false_unreachable.get(&name).copied().unwrap_or(0);
        if let Some(s) = sessions.iter().find(|s| s["member"] == name.as_str()) {
            row.sessions = s["sessions"].as_u64().unwrap_or_default();
            row.migrations = s["link"]["migrations"].as_u64().unwrap_or_default();
        }
    }
    rows[DARK].reconnects = seen
        .reconnects
        .iter()
        .skip(1)
        .map(|&(handshake_bytes, at, _)| Reconnect {
            handshake_bytes,
            took: at.saturating_duration_since(last_return(anchor, at)),
        })
        .collect();
    let dropped = fleet
        .link(&member(DARK))
        .unwrap()
        .stats()
        .to_hub
        .blacked_out;
    eprintln!("[{heartbeat}] datagrams the blackout member sent into outages: {dropped}");
    fleet.shutdown().await;
    rows
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .nth(1)
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024 / 1024);
    format!("{model}, {cores} cores, {memory} GiB")
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let heartbeats: String = env_or("EDGE_BENCH_HEARTBEATS", "10s,5s".to_owned());
    let idle = Duration::from_secs(env_or("EDGE_BENCH_IDLE", 60));
    let rounds: usize = env_or("EDGE_BENCH_ROUNDS", 100);
    let soak = Duration::from_secs(env_or("EDGE_BENCH_SOAK", 600));
    println!("edge links bench on {}", machine());
    println!(
        "idle {} s, {rounds} scale commands, each fleet up for at least {} s",
        idle.as_secs(),
        soak.as_secs()
    );
    let mut missed = Vec::new();
    for heartbeat in heartbeats.split(',') {
        let rows = run(heartbeat, idle, rounds, soak).await;
        println!("\n### Heartbeat {heartbeat}\n");
        println!(
            "| link | spec | idle B/s (UDP payload) | idle B/s (on the wire) | command p50 ms | command p99 ms | behind perfect p99 ms | behind perfect max ms | false Unreachable | sessions | migrations |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (i, (p, row)) in PROFILES.iter().zip(&rows).enumerate() {
            let commands = if p.in_dso {
                (
                    ms(percentile(&row.latencies, 50.0)),
                    ms(percentile(&row.latencies, 99.0)),
                    ms(percentile(&row.lags, 99.0)),
                    ms(percentile(&row.lags, 100.0)),
                )
            } else {
                ("-".into(), "-".into(), "-".into(), "-".into())
            };
            println!(
                "| {} | `{}` | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
                p.name,
                p.spec,
                row.idle_payload,
                row.idle_wire,
                commands.0,
                commands.1,
                commands.2,
                commands.3,
                row.false_unreachable,
                row.sessions,
                row.migrations
            );
            if i != DARK && row.false_unreachable > 0 {
                missed.push(format!("{heartbeat}: {} went Unreachable", p.name));
            }
            if i != DARK && row.sessions != 1 {
                missed.push(format!(
                    "{heartbeat}: {} had {} sessions",
                    p.name, row.sessions
                ));
            }
        }
        let reconnects = &rows[DARK].reconnects;
        println!(
            "\nBlackout member: {} reconnects; handshake bytes {:?}; link back to session \
             connected in {:?} ms",
            reconnects.len(),
            reconnects
                .iter()
                .map(|r| r.handshake_bytes)
                .collect::<Vec<_>>(),
            reconnects
                .iter()
                .map(|r| r.took.as_millis())
                .collect::<Vec<_>>()
        );
        if heartbeat == "10s" && rows[PERFECT].idle_wire > 50.0 {
            missed.push(format!(
                "idle at 10s: {:.1} B/s on the wire > 50",
                rows[PERFECT].idle_wire
            ));
        }
        let bad_lag = percentile(&rows[BAD].lags, 99.0);
        if bad_lag > Duration::from_secs(3) {
            missed.push(format!("{heartbeat}: bad link p99 lag {bad_lag:?} > 3 s"));
        }
        if rows[REBINDING].migrations == 0 {
            missed.push(format!("{heartbeat}: no migration counted"));
        }
    }
    if !missed.is_empty() {
        eprintln!("targets missed: {missed:#?}");
        std::process::exit(1);
    }
}
