//! The pod-metrics part of the protocol against the real hub, with scripted agents: a
//! version 5 session gets its scrape targets, a version 4 session never does (an older agent
//! could not decode them) and its pods count as missing; samples the member was not asked
//! for are dropped, and a sum that is not a number counts as missing pods.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kedge_net::tls::TlsMaterial;
use kedge_protocol::{
    AgentMessage, HubMessage, PodMetricsReport, PodMetricsSample, StatusReport, WorkloadRef,
    WorkloadStatus,
};
use serde_json::Value;
use support::dso::*;
use support::enroll::AgentSide;
use support::*;

const MEMBERS: [&str; 2] = ["member-1", "member-2"];

fn workload() -> WorkloadRef {
    WorkloadRef::deployment("default", "vllm")
}

/// A session of `member` speaking `version`, with heartbeats, that has sent its full report
/// (one ready pod of `vllm`).
async fn scripted(fleet: &Fleet, member: &str, version: u16) -> (quinn::Connection, AgentSide) {
    let dir = &fleet.pki.dir;
    let read = |file: String| std::fs::read_to_string(dir.join(file)).unwrap();
    let material = TlsMaterial::from_pem(
        &read(format!("member-{member}.pem")),
        &read(format!("member-{member}-key.pem")),
        &read("ca.pem".into()),
    )
    .unwrap();
    let (connection, mut control, welcome) =
        support::enroll::scripted_agent(fleet.ports.quic_addr(), material, version).await;
    assert_eq!(welcome.protocol_version, version);
    let mut status = WorkloadStatus::absent(workload());
    status.exists = true;
    status.spec_replicas = 1;
    status.ready_replicas = 1;
    status.available_replicas = 1;
    control
        .send(&AgentMessage::Report(StatusReport {
            full: true,
            workloads: vec![status],
            ..StatusReport::default()
        }))
        .await
        .unwrap();
    (connection, control)
}

/// Reads hub messages for `within`; returns the scrape target sets received and whether a
/// desired state came.
async fn drain(control: &mut AgentSide, within: Duration) -> (Vec<usize>, bool) {
    let mut scrapes = Vec::new();
    let mut desired = false;
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(message) = tokio::time::timeout_at(deadline, control.recv()).await {
        match message.unwrap() {
            Some(HubMessage::Scrape(set)) => scrapes.push(set.targets.len()),
            Some(HubMessage::DesiredState(_)) => desired = true,
            Some(_) => {}
            None => break,
        }
    }
    (scrapes, desired)
}

fn sample(owner: &str, sum: f64) -> PodMetricsSample {
    PodMetricsSample {
        owner: owner.into(),
        trigger: 0,
        sum,
        counted: 1,
        missing: 0,
        scraped_unix_ms: kedge_protocol::unix_ms(std::time::SystemTime::now()),
        error: None,
    }
}

fn member_status(fleet: &Fleet, member: &str) -> Value {
    fleet.dso("vllm")["status"]["podMetrics"][0]["members"][member].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_targets_go_only_to_sessions_that_speak_them_and_samples_are_checked() {
    let (_dir, fleet) = start(&MEMBERS).await;
    let _hub = fleet.start_hub_with(
        "hub.log",
        // No KEDA calls it here: the scaler only has to be configured.
        &[
            "--scaler-listen",
            "127.0.0.1:0",
            "--scaler-address",
            "127.0.0.1:9",
        ],
    );
    let (_old, mut old) = scripted(&fleet, "member-1", 4).await;
    let (_new, mut new) = scripted(&fleet, "member-2", kedge_protocol::PROTOCOL_VERSION).await;
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;
    let dso = r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata:
  name: vllm
  namespace: default
spec:
  memberClusters: [{name: member-1}, {name: member-2}]
  scaledObjectSpec:
    scaleTargetRef: {name: vllm}
    pollingInterval: 1
    triggers:
    - type: kedge-pod-metrics
      metadata: {metricProtocol: http}
"#;
    apply(&fleet, dso, "vllm.yaml").await;

    // The version 5 session gets its target; the version 4 one only its desired state.
    let (scrapes, desired) = drain(&mut new, Duration::from_secs(5)).await;
    assert!(desired, "the v5 session got its desired state");
    assert_eq!(
        scrapes.last(),
        Some(&1),
        "the v5 session got one target: {scrapes:?}"
    );
    let (scrapes, desired) = drain(&mut old, Duration::from_secs(3)).await;
    assert!(desired, "the v4 session got its desired state");
    assert!(
        scrapes.is_empty(),
        "a v4 session was sent scrape targets: {scrapes:?}"
    );

    // A sample for a trigger member-2 was not given is dropped; its own is kept.
    new.send(&AgentMessage::PodMetrics(PodMetricsReport {
        samples: vec![sample("default/vllm", 30.0), sample("default/other", 1e9)],
    }))
    .await
    .unwrap();
    let status = wait_for(LIMIT, "member-2's sample in the status", || async {
        let s = member_status(&fleet, "member-2");
        (s["podsCounted"] == 1).then_some(s)
    })
    .await;
    assert_eq!(status["sum"], "30");
    let dropped = wait_for(LIMIT, "the unsolicited sample counted", || async {
        let metrics = ops_get(fleet.ports, "/metrics").await?;
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(r#"kedge_hub_pod_metric_samples_total{reason="unsolicited"} "#)
            })
            .map(str::to_owned)
    })
    .await;
    assert_eq!(dropped.trim(), "1");
    // The old agent's pod has no value: missing (its reported ready pod), never zero.
    let old_status = member_status(&fleet, "member-1");
    assert_eq!(old_status["podsMissing"], 1, "{old_status}");
    assert_eq!(old_status["stale"], true);
    let trigger = &fleet.dso("vllm")["status"]["podMetrics"][0];
    // 30 is over the threshold of 10: the missing pod counts as 0.
    assert_eq!(trigger["average"], "15", "{trigger}");

    // A sum that is not a number makes member-2's pod missing, with the reason.
    new.send(&AgentMessage::PodMetrics(PodMetricsReport {
        samples: vec![sample("default/vllm", f64::NAN)],
    }))
    .await
    .unwrap();
    let status = wait_for(LIMIT, "the NaN sample counted as missing", || async {
        let s = member_status(&fleet, "member-2");
        (s["podsMissing"] == 1).then_some(s)
    })
    .await;
    assert_eq!(status["podsCounted"], 0);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("not a finite number"),
        "{status}"
    );
    // No pod has a value now: no average to serve.
    let trigger = &fleet.dso("vllm")["status"]["podMetrics"][0];
    assert!(trigger.get("average").is_none(), "{trigger}");
}
