//! Pod IPs are loopback addresses unique across every cluster of the process, so a test can
//! serve on a pod's IP.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use kedge_sim::{Cluster, Sim, SimConfig};
use serde_json::json;

fn deployment(replicas: i64) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
}

/// (pod name, IP) of the cluster's Running pods once there are `n`.
async fn running_pods(c: &Cluster, n: usize) -> Vec<(String, Ipv4Addr)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pods: Vec<(String, Ipv4Addr)> = c
            .shared()
            .store()
            .list("/pods", Some("default"))
            .filter(|p| p["status"]["phase"] == "Running")
            .map(|p| {
                let ip = p["status"]["podIP"].as_str().expect("podIP");
                assert_eq!(p["status"]["podIPs"], json!([{"ip": ip}]));
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                (name.to_string(), ip.parse().expect("an IPv4 address"))
            })
            .collect();
        if pods.len() == n {
            return pods;
        }
        assert!(
            Instant::now() < deadline,
            "{n} running pods in {}",
            c.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_different_clusters_never_share_a_loopback_ip() {
    let config = SimConfig {
        pod_start_delay: Duration::from_millis(10),
        ..SimConfig::default()
    };
    let names = ["a".to_string(), "b".to_string()];
    let sim = Sim::start(&names, config, None).await.expect("sim");
    for c in sim.clusters() {
        c.put_object(deployment(20)).expect("deployment");
    }
    let mut seen = HashSet::new();
    for c in sim.clusters() {
        for (name, ip) in running_pods(c, 20).await {
            assert!(ip.is_loopback(), "{name}: {ip} in 127/8");
            assert!(ip.octets()[3] != 0 && ip.octets()[3] != 255, "{ip}");
            assert!(seen.insert(ip), "{ip} handed out twice");
        }
    }

    // A pod's IP is reachable: a server bound there answers.
    let ip = *seen.iter().next().expect("a pod IP");
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind the pod's IP");
    let addr = listener.local_addr().expect("address");
    let (connected, accepted) =
        tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
    connected.expect("connect");
    accepted.expect("accept");

    // Replaced pods get new addresses: a deleted pod's comes back only after a wrap-around.
    let a = &sim.clusters()[0];
    a.put_object(deployment(0)).expect("scale to 0");
    running_pods(a, 0).await;
    a.put_object(deployment(5)).expect("scale to 5");
    for (name, ip) in running_pods(a, 5).await {
        assert!(seen.insert(ip), "{name} got {ip}, which an earlier pod had");
    }
    sim.shutdown().await;
}
