//! The real `kedge-agent` scraping a simulated pod for a scripted hub (real QUIC, real mTLS):
//! a version 5 hub's targets are scraped and reported; when the agent's next hub is an
//! older one (version 4), the old targets stop and nothing is sent that it could not
//! decode; and a `Scrape` on such a session is a protocol error that closes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kedge_protocol::*;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::hub_peer::{HubPeer, Session, next};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 8000;

fn workload() -> WorkloadRef {
    WorkloadRef::deployment("apps", "llm")
}

fn targets() -> ScrapeTargets {
    ScrapeTargets {
        targets: vec![ScrapeTarget {
            owner: "apps/llm".into(),
            trigger: 0,
            workload: workload(),
            metric_name: "vllm:num_requests_waiting".into(),
            port: ScrapePort::Number(PORT),
            path: "/metrics".into(),
            https: false,
            interval_ms: 1_000,
            timeout_ms: 1_000,
        }],
    }
}

/// Serves `vllm:num_requests_waiting 7` on `ip:PORT`, counting the requests.
async fn serve(ip: IpAddr, served: Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind((ip, PORT)).await.unwrap();
    while let Ok((mut stream, _)) = listener.accept().await {
        served.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = stream.read(&mut buf).await;
            let body = "vllm:num_requests_waiting{model_name=\"m\"} 7\n";
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_targets_follow_the_hubs_protocol_version() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut dir = tempfile::tempdir().unwrap();
    // The agent's log stays for a look after a failure.
    if std::env::var_os("KEDGE_E2E_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("logs in {}", dir.path().display());
    }
    let pki = Pki::create(dir.path(), &["edge"]).await;
    let clusters = start_clusters(dir.path(), &["edge"]).await;
    let cluster = clusters.cluster("edge").unwrap();
    let client = cluster.client().unwrap();
    create_namespace(&client, "apps").await;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "llm", "namespace": "apps"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
            "template": {"metadata": {"labels": {"app": "llm"}},
                "spec": {"containers": [{"name": "c", "image": "vllm"}]}}},
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client, "apps")
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let ip: IpAddr = wait_for(Duration::from_secs(20), "the pod's address", || async {
        let store = cluster.shared().store();
        let pod = store
            .list("/pods", Some("apps"))
            .find(|p| {
                p.pointer("/status/conditions")
                    .is_some_and(|c| c.to_string().contains("\"Ready\""))
            })?
            .clone();
        pod.pointer("/status/podIP")
            .and_then(Value::as_str)?
            .parse()
            .ok()
    })
    .await;
    let served = Arc::new(AtomicU64::new(0));
    let server = tokio::spawn(serve(ip, served.clone()));

    let hub = HubPeer::start(&pki);
    let _agent = start_agent_with(
        &pki,
        "edge",
        hub.ports(),
        dir.path().join("agent.log"),
        &["--namespaces", "apps"],
    );

    // A version 5 hub: the agent scrapes the pod and reports it.
    let Session {
        connection,
        mut control,
        ..
    } = hub.accept("edge").await;
    control.send(&HubMessage::Scrape(targets())).await.unwrap();
    let sample = next(&mut control, "a pod-metrics sample", |m| match m {
        AgentMessage::PodMetrics(r) => r.samples.into_iter().next(),
        _ => None,
    })
    .await;
    assert_eq!((sample.owner.as_str(), sample.trigger), ("apps/llm", 0));
    assert_eq!((sample.sum, sample.counted, sample.missing), (7.0, 1, 0));
    assert!(served.load(Ordering::Relaxed) >= 1);
    connection.close(VarInt::from_u32(close_code::SHUTDOWN), b"hub restarting");

    // The next hub is an older one: the targets of the last hub stop, and nothing it could
    // not decode is sent.
    let Session {
        connection,
        mut control,
        ..
    } = hub
        .accept_speaking("edge", 200, PODMETRICS_PROTOCOL_VERSION - 1)
        .await;
    // A scrape already under way may still land on the pod; none starts after that.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = served.load(Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(message) = tokio::time::timeout_at(deadline, control.recv()).await {
        let message = message.unwrap().expect("the session goes on");
        assert!(
            !matches!(message, AgentMessage::PodMetrics(_)),
            "pod metrics sent to a version 4 hub: {message:?}"
        );
    }
    assert_eq!(
        served.load(Ordering::Relaxed),
        before,
        "the old hub's targets are still scraped"
    );

    // A `Scrape` on that session is a protocol error: the agent closes it.
    control.send(&HubMessage::Scrape(targets())).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .expect("the agent closes the session");
    match closed {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(
                close.error_code,
                VarInt::from_u32(close_code::PROTOCOL_ERROR)
            );
        }
        other => panic!("expected a protocol-error close, got {other}"),
    }
    server.abort();
}

use quinn::VarInt;
