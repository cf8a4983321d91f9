//! Simulated inference engines for the demo's inference scene: every ready pod labelled
//! `app=vllm` in a member serves `vllm:num_requests_waiting` on its own loopback address
//! (simulated pods get one, see [`crate::pod_ips`]) and port [`METRICS_PORT`], as a vLLM
//! engine serves it. The fleet's waiting requests ([`Demand`]) are shared evenly by the
//! ready engines, so more engines mean shorter queues: the feedback loop a real inference
//! fleet has.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Sim;

/// The label value of engine pods (`app=vllm`).
pub const ENGINE_APP: &str = "vllm";
/// The port engines serve their metrics on (the example's container port `metrics`).
pub const METRICS_PORT: u16 = 8000;
/// How often the engines are matched with the pods.
const RESCAN: Duration = Duration::from_millis(200);
/// Longest request an engine reads.
const MAX_REQUEST: usize = 8 * 1024;

/// The requests waiting across the fleet.
#[derive(Debug, Clone, Default)]
pub struct Demand(Arc<AtomicU32>);

impl Demand {
    /// Sets the requests waiting across the fleet.
    pub fn set(&self, waiting: u32) {
        self.0.store(waiting, Ordering::Relaxed);
    }

    /// The requests waiting across the fleet.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What one engine answers when `ready` engines share `demand` waiting requests.
pub fn exposition(demand: u32, ready: usize) -> String {
    let per_engine = f64::from(demand) / ready.max(1) as f64;
    format!(
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"llama-3.1-8b\"}} {per_engine:.6}\n\
         # HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"llama-3.1-8b\"}} 8\n"
    )
}

/// The ready engine pods of one cluster's store: name → address.
fn ready_engines(pods: impl Iterator<Item = Value>) -> HashMap<String, IpAddr> {
    pods.filter(|p| p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some(ENGINE_APP))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| {
            p.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
        .filter_map(|p| {
            let name = p.pointer("/metadata/name")?.as_str()?.to_owned();
            let ip = p.pointer("/status/podIP")?.as_str()?.parse().ok()?;
            Some((name, ip))
        })
        .collect()
}

async fn answer(mut stream: tokio::net::TcpStream, demand: Demand, ready: Arc<AtomicUsize>) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(n) if n > 0 && request.len() + n <= MAX_REQUEST => {
                request.extend_from_slice(&buf[..n])
            }
            _ => return,
        }
    }
    let body = exposition(demand.get(), ready.load(Ordering::Relaxed));
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn engine(listener: tokio::net::TcpListener, demand: Demand, ready: Arc<AtomicUsize>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(answer(stream, demand.clone(), ready.clone()));
    }
}

/// Runs an engine on every ready `app=vllm` pod of `members` until `stop`.
pub async fn serve(sim: &Sim, members: &[String], demand: Demand, stop: CancellationToken) {
    let ready = Arc::new(AtomicUsize::new(0));
    let mut running: HashMap<(String, String), (IpAddr, JoinHandle<()>)> = HashMap::new();
    loop {
        let mut current: HashMap<(String, String), IpAddr> = HashMap::new();
        for member in members {
            let Some(cluster) = sim.cluster(member) else {
                continue;
            };
            let pods: Vec<Value> = {
                let store = cluster.shared().store();
                store
                    .list("/pods", Some("default"))
                    .map(|p| (**p).clone())
                    .collect()
            };
            for (pod, ip) in ready_engines(pods.into_iter()) {
                current.insert((member.clone(), pod), ip);
            }
        }
        ready.store(current.len(), Ordering::Relaxed);
        running.retain(|key, (ip, task)| {
            let keep = current.get(key) == Some(ip);
            if !keep {
                task.abort();
            }
            keep
        });
        for (key, ip) in current {
            if running.contains_key(&key) {
                continue;
            }
            // A pod whose address cannot be bound stays without an engine (and counts as
            // missing) until the next scan.
            if let Ok(listener) = tokio::net::TcpListener::bind((ip, METRICS_PORT)).await {
                let task = tokio::spawn(engine(listener, demand.clone(), ready.clone()));
                running.insert(key, (ip, task));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(RESCAN) => {}
        }
    }
    for (_, task) in running.into_values() {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn engines_share_the_demand() {
        assert!(
            exposition(60, 4)
                .contains("vllm:num_requests_waiting{model_name=\"llama-3.1-8b\"} 15.000000\n")
        );
        // No engine ready yet: the whole queue is on the first.
        assert!(exposition(7, 0).contains("} 7.000000\n"));
        let sum =
            kedge_core::podmetrics::metric_sum(&exposition(10, 3), "vllm:num_requests_waiting")
                .unwrap();
        assert_eq!(sum, Some(3.333333));
    }

    #[test]
    fn only_ready_engine_pods_with_an_address_serve() {
        let pod = |name: &str, app: &str, ready: &str, ip: Option<&str>, deleting: bool| {
            let mut p = json!({
                "metadata": {"name": name, "labels": {"app": app}},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            });
            if let Some(ip) = ip {
                p["status"]["podIP"] = json!(ip);
            }
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            p
        };
        let engines = ready_engines(
            vec![
                pod("a", "vllm", "True", Some("127.1.0.1"), false),
                pod("b", "vllm", "False", Some("127.1.0.2"), false),
                pod("c", "vllm", "True", None, false),
                pod("d", "vllm", "True", Some("127.1.0.4"), true),
                pod("e", "nginx", "True", Some("127.1.0.5"), false),
            ]
            .into_iter(),
        );
        assert_eq!(engines.keys().collect::<Vec<_>>(), ["a"]);
    }
}
