//! SIG-Multicluster ClusterProfiles, with the real parts: a simulated hub cluster with the
//! CRD from deploy/crds, the real `kedge-hub` and agents, and the real `kubectl` reading
//! what a cluster-inventory consumer reads. One profile per member with its health and
//! Kubernetes version; a lost agent turns ControlPlaneHealthy False; a deleted
//! MemberCluster takes its profile along. Without the CRD (at start or gone later) the hub
//! warns and serves on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::Value;
use support::dso::*;
use support::*;

/// Longest wait for a profile to follow a change: the member's status first (heartbeat
/// deadline, then the MemberCluster status writer), then the publisher's next pass.
const FOLLOW: Duration = Duration::from_secs(30);

/// The ClusterProfiles in the hub's namespace, as `kubectl get -o json` lists them, by name.
async fn profiles(fleet: &Fleet) -> Vec<(String, Value)> {
    let out = fleet
        .kubectl(&["get", "clusterprofiles", "-n", "kedge-system", "-o", "json"])
        .await;
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p.clone(),
            )
        })
        .collect()
}

fn healthy(p: &Value) -> Option<&str> {
    condition(&p["status"], "ControlPlaneHealthy").and_then(|c| c["status"].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_has_a_profile_that_follows_its_agent_and_goes_with_it() {
    let (_dir, fleet) = start(&["member-1", "member-2"]).await;
    let hub = fleet.start_hub("hub.log");
    let agent1 = fleet.start_agent("member-1", Some("default"), "member-1.log");
    let agent2 = fleet.start_agent("member-2", Some("default"), "member-2.log");

    let both = wait_for(FOLLOW, "a healthy profile per member", || async {
        let all = profiles(&fleet).await;
        (all.len() == 2 && all.iter().all(|(_, p)| healthy(p) == Some("True"))).then_some(all)
    })
    .await;
    for (name, p) in &both {
        assert_eq!(
            p["metadata"]["labels"]["x-k8s.io/cluster-manager"], "kedge",
            "{p}"
        );
        assert_eq!(p["spec"]["clusterManager"]["name"], "kedge", "{p}");
        assert_eq!(p["spec"]["displayName"], name.as_str(), "{p}");
        let version = p["status"]["version"]["kubernetes"]
            .as_str()
            .unwrap_or_default();
        assert!(version.starts_with('v'), "{p}");
        assert_eq!(
            condition(&p["status"], "Joined").map(|c| &c["status"]),
            Some(&Value::from("True")),
            "{p}"
        );
        let properties = p["status"]["properties"].as_array().unwrap();
        let value = |name: &str| {
            properties
                .iter()
                .find(|x| x["name"] == name)
                .map(|x| x["value"].clone())
        };
        assert_eq!(
            value("kedge.dev/cluster-manager"),
            Some("kedge".into()),
            "{p}"
        );
        assert!(value("kedge.dev/agent-version").is_some(), "{p}");
        // kedge never exposes a member's API server, nor its agent's address.
        assert!(p["status"].get("accessProviders").is_none(), "{p}");
        assert!(!p.to_string().contains("127.0.0.1"), "{p}");
    }

    // The agent of member-2 goes: its control plane is no longer known healthy.
    drop(agent2);
    wait_for(FOLLOW, "member-2 not healthy", || async {
        let all = profiles(&fleet).await;
        let of = |name: &str| {
            all.iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, p)| healthy(p))
        };
        (of("member-2") == Some("False") && of("member-1") == Some("True")).then_some(())
    })
    .await;

    // Its MemberCluster is deleted: the profile goes too.
    fleet
        .kubectl(&["delete", "membercluster", "member-2"])
        .await;
    wait_for(FOLLOW, "member-2's profile gone", || async {
        let names: Vec<String> = profiles(&fleet).await.into_iter().map(|(n, _)| n).collect();
        (names == ["member-1"]).then_some(())
    })
    .await;

    // The CRD goes while the hub runs: the next write fails, the hub looks and warns once.
    fleet
        .kubectl(&["delete", "crd", "clusterprofiles.multicluster.x-k8s.io"])
        .await;
    drop(agent1);
    wait_for(FOLLOW, "the missing-CRD warning", || async {
        hub.log_text()
            .contains("no ClusterProfile CRD")
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_the_hub_warns_and_serves_on() {
    let (_dir, fleet) = start(&["member-1"]).await;
    fleet
        .kubectl(&["delete", "crd", "clusterprofiles.multicluster.x-k8s.io"])
        .await;
    deployment(&fleet.sim, "member-1", "web", 1).await;
    let hub = fleet.start_hub("hub.log");
    let _agent = fleet.start_agent("member-1", Some("default"), "member-1.log");
    wait_for_states(fleet.ports, &["member-1"], "Connected", LIMIT).await;

    fleet
        .sim
        .cluster("hub")
        .unwrap()
        .set_metric("default", "web", "0", 15.0);
    apply(
        &fleet,
        &dso_yaml(
            "web",
            "  memberClusters:\n  - {name: member-1}",
            "web-metric",
        ),
        "web.yaml",
    )
    .await;
    // ceil(15 / 5) = 3 replicas: the DSO controller is not held up by the publisher.
    fleet
        .wait_split("web", &["member-1"], &[3], "3 in member-1")
        .await;
    let warning = wait_for(LIMIT, "the missing-CRD warning", || async {
        let log = hub.log_text();
        log.lines()
            .find(|l| l.contains("no ClusterProfile CRD"))
            .map(str::to_owned)
    })
    .await;
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("kubectl create -f") && warning.contains("--cluster-profiles=false"),
        "the warning says how to install the CRD or turn publishing off: {warning}"
    );
    assert_eq!(
        hub.log_text().matches("no ClusterProfile CRD").count(),
        1,
        "warned once"
    );
}
