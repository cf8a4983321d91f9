//! Re-sync after a reconnect is incremental: an agent whose session with the same hub broke
//! (the network between them cut, both processes running) says in its `Hello` which revision
//! it holds; when that is the member's current, acknowledged desired state, the hub sends
//! nothing again, and later changes still reach it. The real hub and agent on kedge-sim, the
//! session through kedge-sim's link emulator, which the test partitions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use kedge_sim::link::{LinkEmulator, LinkSpec};
use support::dso::*;
use support::*;

/// `kedge_hub_resyncs_total{kind}` from the hub's metrics.
async fn resyncs(ports: HubPorts, kind: &str) -> u64 {
    let metrics = ops_get(ports, "/metrics").await.expect("/metrics");
    let prefix = format!(r#"kedge_hub_resyncs_total{{kind="{kind}"}} "#);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_back_on_the_same_hub_is_not_sent_what_it_holds() {
    let (_dir, fleet) = start(&["member-1"]).await;
    deployment(&fleet.sim, "member-1", "nginx", 1).await;
    let _hub = fleet.start_hub("hub.log");
    let link = LinkEmulator::start(LinkSpec::default(), fleet.ports.quic_addr())
        .await
        .unwrap();
    let through_link = HubPorts {
        quic: link.local_addr().port(),
        ops: fleet.ports.ops,
    };
    let agent = fleet.start_agent_to("member-1", &[through_link], "member-1.log");
    let connected = wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;
    let first = state_of(&connected, "member-1").unwrap()["sessionId"].clone();

    // ceil(50 / 5) = 10 replicas, all in member-1.
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "nginx", "0", 50.0);
    apply(
        &fleet,
        &dso_yaml(
            "nginx",
            "  memberClusters:\n  - {name: member-1, weight: 1}",
            "nginx-metric",
        ),
        "nginx.yaml",
    )
    .await;
    fleet
        .wait_split("nginx", &["member-1"], &[10], "10 in member-1")
        .await;
    // Applied; its acknowledgement follows at once.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let sent = resyncs(fleet.ports, "sent").await;
    assert_eq!(sent, 1, "the first session was sent its state");
    assert_eq!(resyncs(fleet.ports, "in_sync").await, 0);

    // Cut the network until the agent gives its session up, then mend it.
    link.set_partitioned(true);
    wait_for(LIMIT, "the agent to drop its session", || async {
        agent
            .log_text()
            .contains("session with the hub lost")
            .then_some(())
    })
    .await;
    link.set_partitioned(false);
    let second = wait_for(LIMIT, "a new session", || async {
        let sessions = sessions(fleet.ports).await?;
        let s = state_of(&sessions, "member-1")?;
        (s["state"] == "Connected" && s["sessionId"] != first).then(|| s["sessionId"].clone())
    })
    .await;
    // Its first full report planned the same state: nothing was sent again.
    wait_for(LIMIT, "the re-sync counted as in sync", || async {
        (resyncs(fleet.ports, "in_sync").await == 1).then_some(())
    })
    .await;
    assert_eq!(resyncs(fleet.ports, "sent").await, sent);
    assert_eq!(fleet.replicas("member-1", "nginx"), Some(10));

    // A change afterwards reaches the agent in that session: ceil(30 / 5) = 6.
    hub.set_metric("default", "nginx", "0", 30.0);
    fleet
        .wait_split("nginx", &["member-1"], &[6], "6 in member-1")
        .await;
    let now = sessions(fleet.ports).await.unwrap();
    assert_eq!(
        state_of(&now, "member-1").unwrap()["sessionId"],
        second,
        "the same session"
    );
}
