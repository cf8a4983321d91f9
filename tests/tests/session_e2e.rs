//! The hub and several agents as real processes on loopback: connect, survive a hub restart,
//! turn Unreachable when an agent stops.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use support::*;

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const HEARTBEAT_MS: u64 = 200;
const TOLERANCE: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_connect_reconnect_after_hub_restart_and_turn_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &MEMBERS).await;
    let _clusters = start_clusters(dir.path(), &MEMBERS).await;
    let ports = HubPorts::new();
    let heartbeat = format!("{HEARTBEAT_MS}ms");
    let mut hub = start_hub(&pki, ports, &heartbeat, dir.path().join("hub-1.log"));
    let mut agents: Vec<Proc> = MEMBERS
        .iter()
        .map(|m| start_agent(&pki, m, ports, dir.path().join(format!("{m}.log"))))
        .collect();

    // Each agent is listed under the identity of its certificate.
    let sessions = wait_for_states(ports, &MEMBERS, "Connected", Duration::from_secs(20)).await;
    assert_eq!(sessions.len(), 3, "{sessions:#?}");
    for member in MEMBERS {
        let s = state_of(&sessions, member).unwrap();
        assert_eq!(s["agentVersion"], env!("CARGO_PKG_VERSION"));
        assert_eq!(s["protocolVersion"], kedge_protocol::PROTOCOL_VERSION);
        assert!(
            s["kubernetesVersion"].as_str().unwrap().starts_with('v'),
            "{s}"
        );
        assert!(s["certNotAfterUnix"].as_i64().unwrap() > 0);
        assert!(s["remoteAddr"].as_str().unwrap().starts_with("127.0.0.1:"));
    }
    let first_ids: Vec<String> = MEMBERS
        .iter()
        .map(|m| state_of(&sessions, m).unwrap()["sessionId"].to_string())
        .collect();

    // Kill the hub outright and start a new one on the same ports: every agent comes back
    // on its own.
    hub.signal("KILL");
    let _ = hub.child.wait().await;
    let _hub = start_hub(&pki, ports, &heartbeat, dir.path().join("hub-2.log"));
    let sessions = wait_for_states(ports, &MEMBERS, "Connected", Duration::from_secs(20)).await;
    for (member, old_id) in MEMBERS.iter().zip(&first_ids) {
        let s = state_of(&sessions, member).unwrap();
        assert_ne!(
            &s["sessionId"].to_string(),
            old_id,
            "{member} kept a session across the restart"
        );
    }
    // Each agent resumed its TLS session with the new hub process: the ticket the first hub
    // sealed opens with the key the second derives from the same secret.
    let metrics = ops_get(ports, "/metrics").await.unwrap();
    let resumed: f64 = metrics
        .lines()
        .find(|l| l.starts_with("kedge_hub_tls_resumptions_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no resumption counter:\n{metrics}"));
    assert!(resumed >= 3.0, "{resumed} of 3 agents resumed");
    for agent in &mut agents {
        assert!(
            agent.is_running(),
            "an agent exited instead of reconnecting:\n{}",
            agent.log_text()
        );
    }
    let agent_log = agents[0].log_text();
    assert!(
        agent_log.contains("session with the hub lost"),
        "{agent_log}"
    );

    // A crashed agent (no goodbye) turns Unreachable once the tolerance has passed.
    let killed_at = Instant::now();
    agents[2].signal("KILL");
    let sessions =
        wait_for_states(ports, &["member-3"], "Unreachable", Duration::from_secs(10)).await;
    let took = killed_at.elapsed();
    let tolerance = Duration::from_millis(HEARTBEAT_MS * TOLERANCE);
    // The sweep runs every half interval and one sessions poll adds a little on top.
    assert!(
        took <= tolerance + Duration::from_millis(HEARTBEAT_MS) + Duration::from_secs(1),
        "took {took:?}"
    );
    let reason = state_of(&sessions, "member-3").unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("no heartbeat"), "{reason}");

    // A stopped agent says goodbye: Unreachable at once, and it exits cleanly.
    agents[1].signal("TERM");
    let status = tokio::time::timeout(Duration::from_secs(10), agents[1].child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "agent exit status {status:?}");
    let sessions =
        wait_for_states(ports, &["member-2"], "Unreachable", Duration::from_secs(5)).await;
    let reason = state_of(&sessions, "member-2").unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("agent shutting down"), "{reason}");

    // The others are unaffected.
    assert_eq!(
        state_of(&sessions, "member-1").unwrap()["state"],
        "Connected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_stops_cleanly_on_sigterm_and_agents_keep_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge-a"]).await;
    let _clusters = start_clusters(dir.path(), &["edge-a"]).await;
    let ports = HubPorts::new();
    let mut hub = start_hub(&pki, ports, "200ms", dir.path().join("hub.log"));
    let mut agent = start_agent(&pki, "edge-a", ports, dir.path().join("agent.log"));
    wait_for_states(ports, &["edge-a"], "Connected", Duration::from_secs(20)).await;

    hub.signal("TERM");
    let status = tokio::time::timeout(Duration::from_secs(10), hub.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "hub exit status {status:?}\n{}",
        hub.log_text()
    );
    // The agent learns of the close at once (no heartbeat timeout) and keeps retrying.
    wait_for(
        Duration::from_secs(5),
        "the agent to notice the hub's shutdown",
        || async { agent.log_text().contains("hub shutting down").then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(agent.is_running());
}
