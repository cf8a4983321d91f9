//! Scaling on what the pods say, across the fleet, with the real binaries: simulated vLLM
//! pods in two members serve `vllm:num_requests_waiting` on their own (loopback) addresses;
//! the real agents scrape them and send aggregates over their QUIC sessions; the real hub
//! combines them and answers kedge-sim's KEDA over gRPC with mutual TLS; KEDA's HPA writes
//! the DSO's `/scale`; the hub splits the total across the members.
//!
//! pods → agent → QUIC → hub → gRPC → KEDA → HPA → `/scale` → split → agents.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kedge_sim::Sim;
use serde_json::Value;
use support::dso::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MEMBERS: [&str; 2] = ["member-1", "member-2"];
/// The port the simulated vLLM pods serve their metrics on.
const METRICS_PORT: u16 = 8000;
/// How long one scaling step may take: a scrape (1 s), KEDA's poll (1 s), the split.
const STEP: Duration = Duration::from_secs(30);

/// What the simulated pods answer: waiting requests by member, pods that lack the metric.
#[derive(Default)]
struct Pods {
    waiting: Mutex<HashMap<String, f64>>,
    without_metric: Mutex<BTreeSet<String>>,
    /// Pods served, by name: (member, IP).
    served: Mutex<BTreeMap<String, (String, IpAddr)>>,
    scrapes: Mutex<HashMap<String, u64>>,
}

impl Pods {
    fn set(&self, member: &str, waiting: f64) {
        self.waiting
            .lock()
            .unwrap()
            .insert(member.to_owned(), waiting);
    }

    fn body(&self, member: &str, pod: &str) -> String {
        *self
            .scrapes
            .lock()
            .unwrap()
            .entry(pod.to_owned())
            .or_default() += 1;
        let other = "# HELP vllm:num_requests_running Requests running.\n\
                     # TYPE vllm:num_requests_running gauge\n\
                     vllm:num_requests_running{model_name=\"llama\"} 3\n";
        if self.without_metric.lock().unwrap().contains(pod) {
            return other.to_owned();
        }
        let waiting = self
            .waiting
            .lock()
            .unwrap()
            .get(member)
            .copied()
            .unwrap_or(0.0);
        // Two models on one engine: the agent sums the series.
        format!(
            "{other}# HELP vllm:num_requests_waiting Requests waiting.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"llama\"}} {}\n\
             vllm:num_requests_waiting{{model_name=\"llama-lora\"}} {}\n",
            waiting - 1.0,
            1.0
        )
    }
}

/// Serves one pod's metrics on `ip:METRICS_PORT` (HTTP/1.1, one request per connection).
async fn serve_pod(
    pods: Arc<Pods>,
    member: String,
    pod: String,
    listener: tokio::net::TcpListener,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let pods = pods.clone();
        let (member, pod) = (member.clone(), pod.clone());
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = pods.body(&member, &pod);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Starts a metrics server for every pod of `vllm` that has an address, as pods come.
async fn run_pods(
    pods: Arc<Pods>,
    sim_clusters: Vec<(String, Arc<kedge_sim::cluster::ClusterShared>)>,
) {
    loop {
        for (member, cluster) in &sim_clusters {
            let listed: Vec<(String, IpAddr)> = {
                let store = cluster.store();
                store
                    .list("/pods", Some("default"))
                    .filter(|p| {
                        p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some("vllm")
                    })
                    .filter_map(|p| {
                        let name = p.pointer("/metadata/name")?.as_str()?.to_owned();
                        let ip = p.pointer("/status/podIP")?.as_str()?.parse().ok()?;
                        Some((name, ip))
                    })
                    .collect()
            };
            for (name, ip) in listed {
                if pods.served.lock().unwrap().contains_key(&name) {
                    continue;
                }
                if let Ok(listener) = tokio::net::TcpListener::bind((ip, METRICS_PORT)).await {
                    pods.served
                        .lock()
                        .unwrap()
                        .insert(name.clone(), (member.clone(), ip));
                    tokio::spawn(serve_pod(pods.clone(), member.clone(), name, listener));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The remote addresses of the TCP connections process `pid` holds (from /proc).
fn tcp_peers(pid: i32) -> Vec<SocketAddr> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state (0A = LISTEN), …, inode at 9.
            if f.len() < 10 || f[3] == "0A" || !inodes.contains(f[9]) {
                return None;
            }
            let (ip, port) = f[2].split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(SocketAddr::from((
                std::net::Ipv4Addr::from(ip.swap_bytes()),
                port,
            )))
        })
        .collect()
}

/// Names of the live (not terminating) `vllm` pods of `member` that have an address.
fn live_pods(fleet: &Fleet, member: &str) -> Vec<String> {
    let cluster = fleet.sim.cluster(member).unwrap();
    let store = cluster.shared().store();
    store
        .list("/pods", Some("default"))
        .filter(|p| p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some("vllm"))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| p.pointer("/status/podIP").is_some())
        .filter_map(|p| Some(p.pointer("/metadata/name")?.as_str()?.to_owned()))
        .collect()
}

fn api_port(sim: &Sim, cluster: &str) -> u16 {
    let url = sim.cluster(cluster).unwrap().url();
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

fn pod_metrics(fleet: &Fleet) -> Value {
    fleet.dso("vllm")["status"]["podMetrics"][0].clone()
}

fn total(fleet: &Fleet) -> i64 {
    fleet
        .split("vllm", &MEMBERS)
        .iter()
        .map(|r| r.unwrap_or(0))
        .sum()
}

async fn scaler_calls(fleet: &Fleet, method: &str) -> u64 {
    let metrics = ops_get(fleet.ports, "/metrics").await.unwrap_or_default();
    let prefix = format!("kedge_hub_scaler_requests_total{{method=\"{method}\",code=\"ok\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The whole path on two members, in one fleet: the total follows the fleet's per-pod
/// average, the dead zone holds, a pod without the metric and a member cut off count as
/// missing (not as zeros), the scaler's certificate rotates while KEDA keeps calling, and
/// the hub never connects to a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_scales_on_what_its_pods_say() {
    let (_dir, fleet) = start(&MEMBERS).await;
    for asset in [
        "clustertriggerauthentication-crd.yaml",
        "triggerauthentication-crd.yaml",
    ] {
        let path = format!("{}/../sim/assets/{asset}", env!("CARGO_MANIFEST_DIR"));
        fleet.kubectl(&["apply", "-f", &path]).await;
    }
    fleet.kubectl(&["create", "namespace", "keda"]).await;
    for member in MEMBERS {
        deployment(&fleet.sim, member, "vllm", 1).await;
    }
    let pods = Arc::new(Pods::default());
    pods.set("member-1", 30.0);
    pods.set("member-2", 30.0);
    let clusters = MEMBERS
        .iter()
        .map(|m| {
            (
                m.to_string(),
                fleet.sim.cluster(m).unwrap().shared().clone(),
            )
        })
        .collect();
    let pod_servers = tokio::spawn(run_pods(pods.clone(), clusters));

    let scaler_port = free_tcp_port();
    let scaler_addr = format!("127.0.0.1:{scaler_port}");
    let hub = fleet.start_hub_with(
        "hub.log",
        &[
            "--scaler-listen",
            &scaler_addr,
            "--scaler-address",
            &scaler_addr,
            // Rotated every ~10 s: several times during the test.
            "--scaler-cert-lifetime",
            "15s",
        ],
    );
    let hub_pid = hub.pid();
    let agents: Vec<Proc> = MEMBERS
        .iter()
        .map(|m| fleet.start_agent(m, None, &format!("{m}.log")))
        .collect();
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;

    // Nothing from the hub to a member, at any time: no TCP connection of the hub's goes to
    // a member's API server or to a pod.
    let member_apis: BTreeSet<u16> = MEMBERS.iter().map(|m| api_port(&fleet.sim, m)).collect();
    let watch_pods = pods.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watching = done.clone();
    let hub_peers = tokio::spawn(async move {
        let mut seen = BTreeSet::new();
        // Bounded: 10 minutes at most.
        for _ in 0..12_000 {
            if watching.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let pod_ips: BTreeSet<IpAddr> = watch_pods
                .served
                .lock()
                .unwrap()
                .values()
                .map(|(_, ip)| *ip)
                .collect();
            for peer in tcp_peers(hub_pid) {
                assert!(
                    !member_apis.contains(&peer.port()) && !pod_ips.contains(&peer.ip()),
                    "the hub connected to a member: {peer}"
                );
                seen.insert(peer);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    });

    let dso = r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata:
  name: vllm
  namespace: default
spec:
  memberClusters:
  - {name: member-1, weight: 1}
  - {name: member-2, weight: 1}
  rebalancingPolicy:
    gracePeriod: 10m
  scaledObjectSpec:
    scaleTargetRef: {kind: Deployment, name: vllm}
    minReplicaCount: 2
    maxReplicaCount: 12
    pollingInterval: 1
    triggers:
    - type: kedge-pod-metrics
      name: queue
      metadata:
        threshold: "10"
        metricProtocol: http
        metricPort: "8000"
        scrapeTimeout: 2s
"#;
    apply(&fleet, dso, "vllm.yaml").await;

    // The child ScaledObject calls the hub through the ClusterTriggerAuthentication it keeps.
    let so = wait_for(STEP, "the child ScaledObject", || async {
        fleet.hub_object("keda.sh/v1alpha1", "ScaledObject", "vllm")
    })
    .await;
    let trigger = &so["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "external");
    assert_eq!(trigger["metadata"]["scalerAddress"], scaler_addr);
    assert_eq!(
        trigger["authenticationRef"]["kind"],
        "ClusterTriggerAuthentication"
    );
    let hub_cluster = fleet.sim.cluster("hub").unwrap();
    wait_for(STEP, "KEDA's client Secret", || async {
        hub_cluster.object("v1", "Secret", "keda", "kedge-scaler-client")
    })
    .await;

    // --- 2 pods waiting 30 each: ceil(2 × 30 / 10) = 6, split 3:3.
    wait_for(STEP, "6 replicas for an average of 30", || async {
        (fleet.split("vllm", &MEMBERS) == [Some(3), Some(3)]).then_some(())
    })
    .await;
    // Once the six pods report: the average is still 30, so 6 × 30 / 10 = 18, capped at 12.
    wait_for(STEP, "12 replicas (the maximum)", || async {
        (total(&fleet) == 12).then_some(())
    })
    .await;
    let status = wait_for(STEP, "the status to show 12 pods at 30", || async {
        let s = pod_metrics(&fleet);
        (s["podsCounted"] == 12 && s["average"] == "30").then_some(s)
    })
    .await;
    assert_eq!(status["trigger"], "queue");
    assert_eq!(status["metricName"], "vllm:num_requests_waiting");
    assert_eq!(status["threshold"], "10");
    assert_eq!(status["members"]["member-1"]["podsCounted"], 6);
    assert_eq!(status["members"]["member-1"]["sum"], "180");

    // --- The total follows the average: 5 per pod → ratio 0.5, inside the dead zone
    // (scale down only below 10 × (1 − 0.5)): nothing changes.
    pods.set("member-1", 5.0);
    pods.set("member-2", 5.0);
    wait_for(STEP, "the average to read 5", || async {
        (pod_metrics(&fleet)["average"] == "5").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(total(&fleet), 12, "5 per pod is inside the dead zone");
    // 2 and 4 per pod (average 3, ratio 0.3): down to ceil(12 × 3 / 10) = 4, then
    // ceil(4 × 3 / 10) = 2, the minimum: one pod per member, at 2 and 4.
    pods.set("member-1", 2.0);
    pods.set("member-2", 4.0);
    wait_for(
        STEP,
        "the minimum of 2 replicas for an average of 3",
        || async { (fleet.split("vllm", &MEMBERS) == [Some(1), Some(1)]).then_some(()) },
    )
    .await;
    wait_for(STEP, "the status of 2 pods at 3", || async {
        let s = pod_metrics(&fleet);
        (s["podsCounted"] == 2 && s["average"] == "3").then_some(())
    })
    .await;
    // 10.5 per pod: ratio 1.05, inside the scale-up tolerance of 0.1.
    pods.set("member-1", 10.5);
    pods.set("member-2", 10.5);
    wait_for(STEP, "the average to read 10.5", || async {
        (pod_metrics(&fleet)["average"] == "10.5").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(total(&fleet), 2, "10.5 per pod is inside the dead zone");

    // --- A pod without the metric counts as missing: member-1's pod at 6, member-2's
    // without the metric → the measured average 6 is under the threshold, so the missing
    // pod counts as 15: (6 + 15) / 2 = 10.5, inside the dead zone.
    pods.set("member-1", 6.0);
    let one_pod = live_pods(&fleet, "member-2")
        .pop()
        .expect("a pod in member-2");
    pods.without_metric.lock().unwrap().insert(one_pod);
    let status = wait_for(STEP, "one pod missing its metric", || async {
        let s = pod_metrics(&fleet);
        (s["podsMissing"] == 1 && s["podsCounted"] == 1).then_some(s)
    })
    .await;
    assert_eq!(status["average"], "10.5");
    assert_eq!(status["measuredAverage"], "6");
    assert_eq!(status["missingCountedAs"], "15");
    assert_eq!(status["members"]["member-2"]["podsMissing"], 1);
    assert_eq!(total(&fleet), 2);
    pods.without_metric.lock().unwrap().clear();

    // --- A member cut off: its pods count as missing, not as zeros. member-1's pods are at
    // 4 (under the threshold): member-2's count as 15 each.
    pods.set("member-1", 4.0);
    let ready = |m: &str| fleet.replicas(m, "vllm").unwrap();
    let (one, two) = (ready("member-1"), ready("member-2"));
    let mut agents = agents;
    drop(agents.remove(1));
    let status = wait_for(STEP, "member-2's pods counted as missing", || async {
        let s = pod_metrics(&fleet);
        (s["members"]["member-2"]["stale"] == true).then_some(s)
    })
    .await;
    let expected = (4.0 * one as f64 + 15.0 * two as f64) / (one + two) as f64;
    assert_eq!(status["members"]["member-2"]["podsMissing"], two);
    assert_eq!(status["podsMissing"], two);
    assert_eq!(
        status["average"].as_str().unwrap().parse::<f64>().unwrap(),
        (expected * 1000.0).round() / 1000.0,
        "{status:#}"
    );

    // --- The certificate rotated while KEDA kept calling.
    let secret = |key: &str| {
        hub_cluster
            .object("v1", "Secret", "kedge-system", "kedge-scaler-tls")
            .and_then(|s| s["data"][key].as_str().map(str::to_owned))
    };
    let first = secret("server.crt").unwrap();
    let calls_before = scaler_calls(&fleet, "GetMetrics").await;
    wait_for(STEP, "the scaler's certificate to rotate", || async {
        (secret("server.crt").unwrap() != first).then_some(())
    })
    .await;
    let rotated = secret("server.crt").unwrap();
    wait_for(STEP, "KEDA to call again after the rotation", || async {
        (scaler_calls(&fleet, "GetMetrics").await > calls_before + 3).then_some(())
    })
    .await;
    wait_for(STEP, "KEDA's copy to follow", || async {
        let client = hub_cluster.object("v1", "Secret", "keda", "kedge-scaler-client")?;
        let same = |key: &str| client["data"][key].as_str().map(str::to_owned) == secret(key);
        (same("tls.crt") && same("tls.key") && same("ca.crt")).then_some(())
    })
    .await;
    assert_ne!(rotated, first);
    // KEDA's copy holds no key but its own.
    let client = hub_cluster
        .object("v1", "Secret", "keda", "kedge-scaler-client")
        .unwrap();
    let keys: Vec<&String> = client["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);

    // --- Nothing ever connected from the hub to a member.
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = hub_peers.await.unwrap();
    assert!(
        !seen.is_empty(),
        "the hub's own connections were seen (its hub cluster)"
    );
    assert!(pods.scrapes.lock().unwrap().values().sum::<u64>() > 0);
    pod_servers.abort();
}
