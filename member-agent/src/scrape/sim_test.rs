//! The whole scraper against the API simulator (kedge-sim), with pods' metrics servers on
//! loopback addresses of their own.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kedge_protocol::{AgentMessage, ScrapePort, ScrapeTarget, ScrapeTargets, WorkloadRef};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::http::tests::{Canned, self_signed, serve};
use super::scrape_loop;
use super::target::Scraper;
use crate::executor::Executor;
use crate::metrics::AgentMetrics;
use crate::policy::{KindPolicy, NamespacePolicy, Policy};
use tokio_rustls::TlsAcceptor;

fn pod(name: &str, labels: Value, ip: &str, port: Option<u16>, ready: bool) -> Value {
    let ports = port.map_or(
        json!([]),
        |p| json!([{"name": "metrics", "containerPort": p}]),
    );
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps", "labels": labels},
        "spec": {"nodeName": "node-0", "containers": [{"name": "vllm", "image": "vllm", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }},
        ]},
    })
}

fn deployment(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}},
    })
}

fn target(owner: &str, namespace: &str, name: &str) -> ScrapeTarget {
    ScrapeTarget {
        owner: owner.into(),
        trigger: 0,
        workload: WorkloadRef::deployment(namespace, name),
        metric_name: "vllm:num_requests_waiting".into(),
        port: ScrapePort::Name("metrics".into()),
        path: "/metrics".into(),
        https: false,
        interval_ms: 1_000,
        timeout_ms: 2_000,
    }
}

/// A pod's metrics server on a loopback address of its own.
async fn pod_server(ip: &str, canned: Canned) -> u16 {
    tls_pod_server(ip, canned, None).await
}

async fn tls_pod_server(ip: &str, canned: Canned, tls: Option<TlsAcceptor>) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(serve(listener, canned, tls));
    port
}

/// The whole scraper against the API simulator: each workload's selector from its `/scale`,
/// its pods listed by it, ready pods only, a named port and a port number, HTTP and HTTPS
/// with a self-signed certificate, a refused and a missing workload, one report for the
/// targets due together, and nothing after an empty set.
#[tokio::test]
async fn the_scrape_loop_reports_the_ready_pods_of_each_target() {
    let sim = kedge_sim::Sim::start_n(1, kedge_sim::SimConfig::default())
        .await
        .unwrap();
    let cluster = &sim.clusters()[0];
    for ns in ["apps", "other"] {
        cluster
            .put_object(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
        cluster.put_object(deployment(ns, "web")).unwrap();
    }
    cluster.put_object(deployment("apps", "secure")).unwrap();
    let web = json!({"app": "web"});
    let exposition = "# TYPE vllm:num_requests_waiting gauge\n\
        vllm:num_requests_waiting{model=\"a\"} 2\n\
        vllm:num_requests_waiting{model=\"b\"} 3\n";
    let a = pod_server("127.77.0.2", Canned::ok(exposition)).await;
    let mut failing = Canned::ok(exposition);
    failing.status = 500;
    let b = pod_server("127.77.0.3", failing).await;
    let never = pod_server("127.77.0.4", Canned::ok("vllm:num_requests_waiting 100\n")).await;
    let secure = tls_pod_server("127.77.0.6", Canned::ok(exposition), Some(self_signed())).await;
    for p in [
        pod("web-a", web.clone(), "127.77.0.2", Some(a), true),
        pod("web-b", web.clone(), "127.77.0.3", Some(b), true),
        // Not ready, and another workload's pod: never asked.
        pod("web-c", web.clone(), "127.77.0.4", Some(never), false),
        pod(
            "api-0",
            json!({"app": "api"}),
            "127.77.0.4",
            Some(never),
            true,
        ),
        // Ready without the named port: missing.
        pod("web-d", web.clone(), "127.77.0.5", None, true),
        // HTTPS with a self-signed certificate, on a port number.
        pod(
            "secure-0",
            json!({"app": "secure"}),
            "127.77.0.6",
            Some(secure),
            true,
        ),
    ] {
        cluster.put_object(p).unwrap();
    }

    let policy = Policy {
        namespaces: NamespacePolicy::Only(vec!["apps".into()]),
        kinds: KindPolicy::default(),
    };
    let executor = Arc::new(Executor::new(cluster.client().unwrap(), policy));
    let metrics = AgentMetrics::default();
    let scraper = Arc::new(Scraper::new(executor, metrics.clone()));
    let (targets_tx, targets_rx) = watch::channel(Arc::<ScrapeTargets>::default());
    let (outbox_tx, mut outbox) = mpsc::channel(16);
    let online = Arc::new(AtomicBool::new(true));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(scrape_loop(
        scraper,
        targets_rx,
        outbox_tx,
        online,
        shutdown.clone(),
    ));
    targets_tx.send_replace(Arc::new(ScrapeTargets {
        targets: vec![
            target("apps/dso", "apps", "web"),
            target("other/dso", "other", "web"),
            target("apps/gone", "apps", "gone"),
            ScrapeTarget {
                https: true,
                port: ScrapePort::Number(secure),
                ..target("apps/secure", "apps", "secure")
            },
        ],
    }));

    let message = tokio::time::timeout(Duration::from_secs(20), outbox.recv())
        .await
        .expect("a report")
        .unwrap();
    let AgentMessage::PodMetrics(report) = message else {
        panic!("expected pod metrics, got {message:?}");
    };
    assert_eq!(report.samples.len(), 4, "{report:?}");
    let by_owner = |owner: &str| {
        report
            .samples
            .iter()
            .find(|s| s.owner == owner)
            .unwrap_or_else(|| panic!("no sample of {owner}: {report:?}"))
    };
    let web = by_owner("apps/dso");
    assert_eq!((web.sum, web.counted, web.missing), (5.0, 1, 2), "{web:?}");
    assert_eq!(
        web.error.as_deref(),
        Some(format!("pod web-b (127.77.0.3:{b}): HTTP status 500").as_str())
    );
    assert!(web.scraped_unix_ms > 0);
    let refused = by_owner("other/dso");
    assert_eq!((refused.counted, refused.missing), (0, 0));
    let why = refused.error.as_deref().unwrap();
    assert!(
        why.contains("\"other\" is not managed by this agent"),
        "{why}"
    );
    let tls = by_owner("apps/secure");
    assert_eq!((tls.sum, tls.counted, tls.missing), (5.0, 1, 0), "{tls:?}");
    assert_eq!(tls.error, None);
    let gone = by_owner("apps/gone");
    assert_eq!((gone.counted, gone.missing), (0, 0));
    assert!(
        gone.error.as_deref().unwrap().contains("reading the scale"),
        "{gone:?}"
    );

    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "kedge_agent_pod_scrapes_total{outcome=\"counted\"} 2",
        "kedge_agent_pod_scrapes_total{outcome=\"http_status\"} 1",
        "kedge_agent_pod_scrapes_total{outcome=\"no_port\"} 1",
        "kedge_agent_pod_scrapes_total{outcome=\"refused\"} 1",
        "kedge_agent_pod_scrapes_total{outcome=\"unreadable\"} 1",
        "kedge_agent_pod_scrape_seconds_count 3",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }

    // An empty set stops every scrape.
    targets_tx.send_replace(Arc::default());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    while let Ok(late) = outbox.try_recv() {
        // At most the second round, if it started before the empty set arrived.
        assert!(matches!(late, AgentMessage::PodMetrics(_)));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(outbox.try_recv().is_err(), "scrapes after an empty set");
    shutdown.cancel();
    task.await.unwrap();
}
