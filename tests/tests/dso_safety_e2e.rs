//! DSO safety under faults, end to end with the real binaries on kedge-sim: kedge never
//! scales a workload down because of what it does not know. Each test names the fault; each
//! fails on a hub that plans from nothing or tells a member it cannot plan for "0".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::dso::*;
use support::*;

/// The tests share two cores; run them one at a time so grace periods mean what they say.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TWO: [&str; 2] = ["member-1", "member-2"];

/// Polls every 50 ms until `done` returns `Some`, asserting on every poll that each listed
/// member runs at least its floor of `name`. Panics after `limit`.
async fn holding<T>(
    fleet: &Fleet,
    name: &str,
    floors: &[(&str, i64)],
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        for (member, floor) in floors {
            let now = fleet.replicas(member, name);
            assert!(
                now.is_some_and(|n| n >= *floor),
                "{member} {name} dropped to {now:?} (floor {floor}) while waiting for {what}"
            );
        }
        if let Some(v) = done() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn member_state(fleet: &Fleet, dso: &str, member: &str) -> Value {
    fleet.dso(dso)["status"]["memberClusterStatuses"][member]["state"].clone()
}

/// A fleet of member-1 and member-2, each running Deployment `web` with `replicas`.
async fn two_running_web(replicas: i32) -> (tempfile::TempDir, Fleet) {
    let (dir, fleet) = start(&TWO).await;
    for member in TWO {
        deployment(&fleet.sim, member, "web", replicas).await;
    }
    (dir, fleet)
}

/// The hub (log `hub-1.log`) and both members' agents, connected.
async fn hub_and_agents(fleet: &Fleet) -> (Proc, Proc, Proc) {
    let hub = fleet.start_hub("hub-1.log");
    let a1 = fleet.start_agent("member-1", None, "member-1.log");
    let a2 = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;
    (hub, a1, a2)
}

fn two_members(w1: u32, w2: u32) -> String {
    format!(
        "  memberClusters:\n  - {{name: member-1, weight: {w1}}}\n  - {{name: member-2, weight: {w2}}}"
    )
}

const AGENT_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: kedge-agent, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: kedge-agent, namespace: default}
rules:
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kedge-agent-discovery}
rules:
- nonResourceURLs: ["/api", "/api/*", "/apis", "/apis/*", "/version"]
  verbs: [get]
- apiGroups: [""]
  resources: [nodes, pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kedge-agent-discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kedge-agent-discovery}
subjects:
- {kind: ServiceAccount, name: kedge-agent, namespace: default}
"#;

const AGENT_BINDING: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kedge-agent, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: kedge-agent}
subjects:
- {kind: ServiceAccount, name: kedge-agent, namespace: default}
"#;

/// Case 1: an agent whose RBAC is revoked past the grace period, and a Deployment deleted
/// and re-created (a GitOps replace) past the grace period: the member is held, never told
/// 0; what runs there never drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_or_replaced_workloads_are_never_scaled_down() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = two_running_web(1).await;
    // member-1's agent acts through a ServiceAccount whose RoleBinding the test revokes.
    let m1 = fleet.kubeconfig("member-1");
    let rbac = fleet.dir.join("agent-rbac.yaml");
    let binding = fleet.dir.join("agent-binding.yaml");
    std::fs::write(&rbac, AGENT_RBAC).unwrap();
    std::fs::write(&binding, AGENT_BINDING).unwrap();
    kubectl(&m1, &["apply", "-f", rbac.to_str().unwrap()]).await;
    kubectl(&m1, &["apply", "-f", binding.to_str().unwrap()]).await;
    let token = fleet
        .sim
        .cluster("member-1")
        .unwrap()
        .service_account_token("default", "kedge-agent");
    let sa_kubeconfig = fleet.dir.join("member-1-agent.kubeconfig");
    let text = fleet
        .sim
        .cluster("member-1")
        .unwrap()
        .kubeconfig_with_token(&token);
    std::fs::write(&sa_kubeconfig, text).unwrap();

    let _hub = fleet.start_hub("hub.log");
    let _a1 = fleet.start_agent_as("member-1", &sa_kubeconfig, None, "member-1.log");
    let _a2 = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;
    apply(
        &fleet,
        &dso_yaml("web", &two_members(1, 1), "absent"),
        "web.yaml",
    )
    .await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    fleet.wait_split("web", &TWO, &[3, 3], "3:3 of 6").await;

    // --- RBAC revoked: Refused, held; after the grace period its share moves, it keeps 3.
    kubectl(
        &m1,
        &["delete", "rolebinding", "kedge-agent", "-n", "default"],
    )
    .await;
    let refused_at = holding(
        &fleet,
        "web",
        &[("member-1", 3)],
        LIMIT,
        "member-1 Refused",
        || (member_state(&fleet, "web", "member-1") == "Refused").then(Instant::now),
    )
    .await;
    let description =
        fleet.dso("web")["status"]["memberClusterStatuses"]["member-1"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    assert!(description.contains("Forbidden"), "{description}");
    holding(
        &fleet,
        "web",
        &[("member-1", 3)],
        LIMIT,
        "member-2 to take the share",
        || (fleet.replicas("member-2", "web") == Some(6)).then_some(()),
    )
    .await;
    assert!(refused_at.elapsed() >= GRACE - Duration::from_millis(500));
    // Well past the grace period: still 3.
    let until = Instant::now() + Duration::from_secs(2);
    holding(&fleet, "web", &[("member-1", 3)], LIMIT, "2 s more", || {
        (Instant::now() >= until).then_some(())
    })
    .await;
    fleet.wait_event("web", "CommandRefused", "member-1").await;

    // --- RBAC restored: Ready again, nothing ever dropped; back to 3:3.
    kubectl(&m1, &["apply", "-f", binding.to_str().unwrap()]).await;
    holding(
        &fleet,
        "web",
        &[("member-1", 3)],
        LIMIT,
        "3:3 again",
        || {
            (fleet.split("web", &TWO) == [Some(3), Some(3)]
                && member_state(&fleet, "web", "member-1") == "Ready")
                .then_some(())
        },
    )
    .await;

    // --- member-2's Deployment is replaced: deleted, past the grace period re-created with
    // 2 replicas. It must not be scaled to a stale 0.
    let m2: Api<Deployment> = Api::namespaced(
        fleet.sim.cluster("member-2").unwrap().client().unwrap(),
        "default",
    );
    m2.delete("web", &Default::default()).await.unwrap();
    holding(
        &fleet,
        "web",
        &[("member-1", 3)],
        LIMIT,
        "member-1 to take the share",
        || (fleet.replicas("member-1", "web") == Some(6)).then_some(()),
    )
    .await;
    assert_eq!(member_state(&fleet, "web", "member-2"), "WorkloadMissing");
    deployment(&fleet.sim, "member-2", "web", 2).await;
    holding(
        &fleet,
        "web",
        &[("member-1", 3), ("member-2", 2)],
        LIMIT,
        "member-2 Ready with its share back",
        || {
            (member_state(&fleet, "web", "member-2") == "Ready"
                && fleet.split("web", &TWO) == [Some(3), Some(3)])
            .then_some(())
        },
    )
    .await;
}

/// Case 2: weights 9:1, total 10; the hub restarts and member-1's agent comes back only after
/// its grace period. member-1 never drops below 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restart_with_a_late_member_never_scales_it_down() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = two_running_web(1).await;
    let (hub, mut a1, _a2) = hub_and_agents(&fleet).await;
    apply(
        &fleet,
        &dso_yaml("web", &two_members(9, 1), "absent"),
        "web.yaml",
    )
    .await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=10"]).await;
    fleet.wait_split("web", &TWO, &[9, 1], "9:1 of 10").await;
    wait_for(LIMIT, "status settled", || async {
        let s = fleet.dso("web")["status"].clone();
        (s["membersHealthyCount"] == 2 && s["totalCurrentReplicas"] == 10).then_some(())
    })
    .await;

    // The hub and member-1's agent go away; a new hub starts without member-1.
    drop(hub);
    a1.signal("KILL");
    let _ = a1.child.wait().await;
    let _hub = fleet.start_hub("hub-2.log");
    wait_for_states(fleet.ports, &["member-2"], "Connected", LIMIT).await;
    // Past member-1's grace period its share moves to member-2; member-1 keeps its 9.
    holding(
        &fleet,
        "web",
        &[("member-1", 9)],
        LIMIT,
        "member-2 to take the share",
        || (fleet.replicas("member-2", "web") == Some(10)).then_some(()),
    )
    .await;
    let until = Instant::now() + Duration::from_secs(1);
    holding(&fleet, "web", &[("member-1", 9)], LIMIT, "1 s more", || {
        (Instant::now() >= until).then_some(())
    })
    .await;

    // member-1's agent returns late: it is planned only from its own report, and keeps 9.
    let _a1 = fleet.start_agent("member-1", None, "member-1-again.log");
    holding(
        &fleet,
        "web",
        &[("member-1", 9)],
        LIMIT,
        "9:1 again",
        || (fleet.split("web", &TWO) == [Some(9), Some(1)]).then_some(()),
    )
    .await;
    let until = Instant::now() + Duration::from_secs(1);
    holding(&fleet, "web", &[("member-1", 9)], LIMIT, "1 s more", || {
        (Instant::now() >= until).then_some(())
    })
    .await;
}

/// Case 2: the hub stops before it writes its last decision, so the status it finds on restart
/// is older than what the members run (here: member-1 1 and member-2 3, while both run 2).
/// member-2 comes back first; the new hub moves it neither up nor down on that stale count
/// and waits for member-1's report, then plans from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_hub_moves_no_member_on_a_stale_status() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = two_running_web(1).await;
    let (hub, mut a1, _a2) = hub_and_agents(&fleet).await;
    // A grace period far longer than the test, so only the hold can explain what it sees.
    let yaml =
        dso_yaml("web", &two_members(1, 1), "absent").replace("gracePeriod: 3s", "gracePeriod: 5m");
    apply(&fleet, &yaml, "web.yaml").await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=4"]).await;
    fleet.wait_split("web", &TWO, &[2, 2], "2:2 of 4").await;

    drop(hub);
    a1.signal("KILL");
    let _ = a1.child.wait().await;
    let stale = json!({"status": {"memberClusterStatuses": {
        "member-1": {"currentReplicas": 1, "desiredReplicas": 1},
        "member-2": {"currentReplicas": 3, "desiredReplicas": 3},
    }}});
    fleet
        .kubectl(&[
            "patch",
            "dso/web",
            "--subresource=status",
            "--type=merge",
            "-p",
            &stale.to_string(),
        ])
        .await;
    let _hub = fleet.start_hub("hub-2.log");
    wait_for_states(fleet.ports, &["member-2"], "Connected", LIMIT).await;
    // The new hub has member-2's report and decides (its status names the member it waits
    // for); member-2 stays at 2 all the while.
    let exact = |fleet: &Fleet| {
        assert_eq!(
            fleet.split("web", &TWO),
            [Some(2), Some(2)],
            "a member moved on the stale status"
        );
    };
    wait_for(LIMIT, "the hub to say it waits for member-1", || async {
        exact(&fleet);
        let s = fleet.dso("web")["status"].clone();
        let ready = s["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .unwrap_or_default();
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("until member-1 report"))
            .then_some(())
    })
    .await;
    let until = Instant::now() + Duration::from_secs(2);
    wait_for(LIMIT, "2 s more", || async {
        exact(&fleet);
        (Instant::now() >= until).then_some(())
    })
    .await;

    // member-1 returns: planned from both reports, nothing moves; then /scale is followed.
    let _a1 = fleet.start_agent("member-1", None, "member-1-again.log");
    wait_for(LIMIT, "member-1 Ready", || async {
        exact(&fleet);
        (member_state(&fleet, "web", "member-1") == "Ready").then_some(())
    })
    .await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    fleet.wait_split("web", &TWO, &[3, 3], "3:3 of 6").await;
}

/// Case 3: a DSO applied over running Deployments with KEDA not reading its metric yet: no
/// member drops below what it runs until `/scale` is first written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_dso_holds_running_workloads_until_its_total_is_set() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = two_running_web(3).await;
    let _hub = fleet.start_hub("hub.log");
    let _a1 = fleet.start_agent("member-1", None, "member-1.log");
    let _a2 = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;
    apply(
        &fleet,
        &dso_yaml("web", &two_members(1, 1), "web-metric"),
        "web.yaml",
    )
    .await;
    let floors = [("member-1", 3), ("member-2", 3)];
    let status = holding(&fleet, "web", &floors, LIMIT, "TotalSet=False", || {
        let s = fleet.dso("web")["status"].clone();
        let waiting = condition(&s, "TotalSet").is_some_and(|c| c["reason"] == "AwaitingTotal");
        (waiting && s["membersHealthyCount"] == 2).then_some(s)
    })
    .await;
    let message = condition(&status, "TotalSet").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("keep the 6 replicas"), "{message}");
    assert_eq!(
        status["memberClusterStatuses"]["member-1"]["desiredReplicas"],
        3
    );
    let until = Instant::now() + GRACE;
    holding(
        &fleet,
        "web",
        &floors,
        LIMIT,
        "a while without a total",
        || (Instant::now() >= until).then_some(()),
    )
    .await;
    let described = fleet.kubectl(&["describe", "dso", "web"]).await;
    assert!(described.contains("AwaitingTotal"), "{described}");

    // KEDA reads the metric: ceil(20 / 5) = 4, split 2:2. Now scaling down is what was asked.
    fleet
        .sim
        .cluster("hub")
        .unwrap()
        .set_metric("default", "web", "0", 20.0);
    fleet.wait_split("web", &TWO, &[2, 2], "2:2 of 4").await;
    wait_for(LIMIT, "TotalSet=True", || async {
        let s = fleet.dso("web")["status"].clone();
        condition(&s, "TotalSet")
            .is_some_and(|c| c["status"] == "True")
            .then_some(())
    })
    .await;
}

/// Cases 5 and 6: a workload claimed by two DSOs is scaled by the older one only, with a
/// Conflict condition on both; a local HorizontalPodAutoscaler makes the agent stop fighting
/// and the DSO say so, until it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_are_reported_not_fought() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start(&TWO).await;
    deployment(&fleet.sim, "member-1", "web", 1).await;
    deployment(&fleet.sim, "member-2", "api", 1).await;
    let _hub = fleet.start_hub("hub.log");
    let _a1 = fleet.start_agent("member-1", None, "member-1.log");
    let _a2 = fleet.start_agent("member-2", None, "member-2.log");
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;

    let only = |m: &str| format!("  memberClusters:\n  - {{name: {m}}}");
    apply(
        &fleet,
        &dso_yaml("first", &only("member-1"), "absent")
            .replace("      name: first\n", "      name: web\n"),
        "first.yaml",
    )
    .await;
    fleet.kubectl(&["scale", "dso/first", "--replicas=4"]).await;
    fleet
        .wait_split("web", &["member-1"], &[4], "first scales web to 4")
        .await;
    // Make sure `second` is created after `first` (creation times have 1 s resolution).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    apply(
        &fleet,
        &dso_yaml("second", &only("member-1"), "absent")
            .replace("      name: second\n", "      name: web\n"),
        "second.yaml",
    )
    .await;
    fleet
        .kubectl(&["scale", "dso/second", "--replicas=7"])
        .await;
    let second = wait_for(LIMIT, "second: Conflict", || async {
        let s = fleet.dso("second")["status"].clone();
        (condition(&s, "Conflict").is_some_and(|c| c["status"] == "True")
            && s["memberClusterStatuses"]["member-1"]["state"] == "Conflict")
            .then_some(s)
    })
    .await;
    let message = condition(&second, "Conflict").unwrap()["message"].clone();
    assert!(
        message.as_str().unwrap().contains("default/first"),
        "{message}"
    );
    wait_for(LIMIT, "first: Conflict", || async {
        let s = fleet.dso("first")["status"].clone();
        condition(&s, "Conflict")
            .is_some_and(|c| {
                c["status"] == "True"
                    && c["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("default/second")
            })
            .then_some(())
    })
    .await;
    fleet.wait_event("second", "Conflict", "member-1").await;
    // No flapping: web stays at first's 4.
    let until = Instant::now() + Duration::from_secs(2);
    holding(&fleet, "web", &[("member-1", 4)], LIMIT, "2 s", || {
        assert_eq!(
            fleet.replicas("member-1", "web"),
            Some(4),
            "the loser scaled web"
        );
        (Instant::now() >= until).then_some(())
    })
    .await;

    // --- A local HPA in member-2 targets `api`.
    apply(
        &fleet,
        &dso_yaml("api", &only("member-2"), "absent"),
        "api.yaml",
    )
    .await;
    fleet.kubectl(&["scale", "dso/api", "--replicas=3"]).await;
    fleet
        .wait_split("api", &["member-2"], &[3], "api at 3")
        .await;
    let m2 = fleet.sim.cluster("member-2").unwrap().client().unwrap();
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "api-hpa", "namespace": "default"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
            "minReplicas": 1, "maxReplicas": 10}
    }))
    .unwrap();
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(m2.clone(), "default");
    hpas.create(&PostParams::default(), &hpa).await.unwrap();
    let api = wait_for(LIMIT, "api: Conflict from the local HPA", || async {
        let s = fleet.dso("api")["status"].clone();
        condition(&s, "Conflict")
            .is_some_and(|c| c["reason"] == "ScaledInMember")
            .then_some(s)
    })
    .await;
    let message = condition(&api, "Conflict").unwrap()["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("member-2: HorizontalPodAutoscaler default/api-hpa"),
        "{message}"
    );
    fleet
        .wait_event("api", "Conflict", "HorizontalPodAutoscaler default/api-hpa")
        .await;
    let described = fleet.kubectl(&["describe", "dso", "api"]).await;
    assert!(described.contains("ScaledInMember"), "{described}");
    // The HPA (here: a hand edit standing in for it) sets 9: the agent does not fight.
    let deployments: Api<Deployment> = Api::namespaced(m2, "default");
    deployments
        .patch_scale(
            "api",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 9}})),
        )
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    wait_for(LIMIT, "2 s without a restore", || async {
        assert_eq!(
            fleet.replicas("member-2", "api"),
            Some(9),
            "the agent fought the HPA"
        );
        (Instant::now() >= until).then_some(())
    })
    .await;
    // The HPA goes: kedge takes the workload back.
    hpas.delete("api-hpa", &Default::default()).await.unwrap();
    fleet
        .wait_split("api", &["member-2"], &[3], "api back at 3")
        .await;
    wait_for(LIMIT, "api: no Conflict", || async {
        let s = fleet.dso("api")["status"].clone();
        condition(&s, "Conflict")
            .is_some_and(|c| c["status"] == "False")
            .then_some(())
    })
    .await;
}

/// Waits until the hub on `ports` is the active one: ready, with every member connected.
async fn active(fleet: &Fleet, ports: HubPorts, what: &str, floors: &[(&str, i64)]) {
    let start = Instant::now();
    loop {
        // Polled between the floor checks so a drop during the switch is caught.
        let hub_ready = ready(ports).await == Some(true);
        let connected = sessions(ports).await.is_some_and(|s| {
            TWO.iter()
                .all(|m| state_of(&s, m).is_some_and(|x| x["state"] == "Connected"))
        });
        if hub_ready && connected {
            eprintln!("{what}: active after {:?}", start.elapsed());
            return;
        }
        holding(fleet, "web", floors, LIMIT, what, || Some(())).await;
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Case 8: two hubs against one hub cluster. Only the Lease holder is ready and serves
/// agents; the standby refuses them, so they move on. When the holder is killed (its lease
/// expires), stops gracefully (it releases the lease) or has its lease taken (it exits
/// non-zero), the agents end up on the other hub and no member drops below its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_active_hub_and_agents_follow_it_when_it_goes() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = two_running_web(1).await;
    let (a_ports, b_ports) = (fleet.ports, HubPorts::new());
    let mut a = fleet.start_hub_at(a_ports, "hub-a.log");
    wait_for(LIMIT, "hub A to be active", || async {
        (ready(a_ports).await == Some(true)).then_some(())
    })
    .await;
    let mut b = fleet.start_hub_at(b_ports, "hub-b.log");
    // The standby is listed first: the agents must move on from its refusal.
    let _agents: Vec<Proc> = TWO
        .iter()
        .map(|m| fleet.start_agent_to(m, &[b_ports, a_ports], &format!("{m}.log")))
        .collect();
    wait_for_states(a_ports, &TWO, "Connected", LIMIT).await;
    wait_for(LIMIT, "hub B to answer as a standby", || async {
        (ready(b_ports).await == Some(false)).then_some(())
    })
    .await;
    let on_b = sessions(b_ports).await.unwrap_or_default();
    assert!(
        TWO.iter()
            .all(|m| state_of(&on_b, m).is_none_or(|s| s["state"] != "Connected")),
        "the standby accepted an agent: {on_b:?}"
    );
    apply(
        &fleet,
        &dso_yaml("web", &two_members(9, 1), "absent"),
        "web.yaml",
    )
    .await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=10"]).await;
    fleet.wait_split("web", &TWO, &[9, 1], "9:1 of 10").await;

    // A is killed: B takes over once A's lease expires; nothing drops meanwhile.
    a.signal("KILL");
    let _ = a.child.wait().await;
    let floors = [("member-1", 9), ("member-2", 1)];
    active(&fleet, b_ports, "B after A was killed", &floors).await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=20"]).await;
    fleet
        .wait_split("web", &TWO, &[18, 2], "B scaling to 18:2")
        .await;

    // A comes back as the standby; B stops gracefully, releases the lease and exits 0.
    let mut a = fleet.start_hub_at(a_ports, "hub-a-again.log");
    wait_for(LIMIT, "hub A to answer as a standby", || async {
        (ready(a_ports).await == Some(false)).then_some(())
    })
    .await;
    b.signal("TERM");
    let floors = [("member-1", 18), ("member-2", 2)];
    active(&fleet, a_ports, "A after B stopped", &floors).await;
    let status = b.child.wait().await.unwrap();
    assert!(
        status.success(),
        "a hub stopped by SIGTERM exited with {status}"
    );
    assert!(
        b.log_text().contains("released the lease"),
        "B did not release its lease:\n{}",
        b.log_text()
    );

    // Someone else takes A's lease: A stops acting and exits non-zero; members keep theirs.
    let lease = fleet
        .kubectl(&[
            "get",
            "lease",
            "kedge-hub",
            "-n",
            "kedge-system",
            "-o",
            "json",
        ])
        .await;
    let lease: Value = serde_json::from_str(&lease).unwrap();
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{lease}"
    );
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let taken = json!({"spec": {"holderIdentity": "intruder", "renewTime": now, "leaseDurationSeconds": 60}});
    fleet
        .kubectl(&[
            "patch",
            "lease",
            "kedge-hub",
            "-n",
            "kedge-system",
            "--type",
            "merge",
            "-p",
            &taken.to_string(),
        ])
        .await;
    let exited = holding(&fleet, "web", &floors, LIMIT, "A to exit", || {
        a.child.try_wait().unwrap()
    })
    .await;
    assert!(!exited.success(), "a hub that lost its lease exited 0");
    assert!(a.log_text().contains("lost the lease"), "{}", a.log_text());
    let until = Instant::now() + Duration::from_secs(1);
    holding(&fleet, "web", &floors, LIMIT, "1 s without a hub", || {
        (Instant::now() >= until).then_some(())
    })
    .await;
}

/// MemberClusters of a hub cluster whose statuses the hub has written.
fn statuses_written(fleet: &Fleet, names: &[String]) -> usize {
    let hub = fleet.sim.cluster("hub").unwrap();
    names
        .iter()
        .filter(|name| {
            hub.object("kedge.dev/v1alpha1", "MemberCluster", "", name)
                .is_some_and(|mc| mc.get("status").is_some())
        })
        .count()
}

/// A hub stopped (SIGTERM) while it has thousands of MemberCluster statuses to write, as after
/// a reconnect storm at fleet scale, exits and releases its Lease at once: the next active
/// hub writes every status anew. Here 400 registered members that never connected each get
/// a `Pending` status while every request to the hub cluster takes 250 ms. A hub that writes
/// its backlog before it stops (as it once did, one write after the other: the fleet bench's
/// 10,000-member hub took 196 s to exit) writes all 400 first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_hub_does_not_finish_its_backlog_of_member_statuses_first() {
    let _serial = SERIAL.lock().await;
    // One member with credentials (none of them connects).
    let (_dir, fleet) = start(&TWO[..1]).await;
    let names: Vec<String> = (1..=400).map(|i| format!("edge-{i:03}")).collect();
    let hub = fleet.sim.cluster("hub").unwrap();
    for name in &names {
        hub.put_object(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": name}, "spec": {}
        }))
        .unwrap();
    }
    hub.set_faults(kedge_sim::Faults {
        latency: Duration::from_millis(250),
        ..Default::default()
    });
    // A Lease long enough that 250 ms per request does not cost it.
    let mut proc = fleet.start_hub_with("hub.log", &["--lease-duration", "15s"]);
    wait_for(
        Duration::from_secs(60),
        "the first member status",
        || async { (statuses_written(&fleet, &names) > 0).then_some(()) },
    )
    .await;
    proc.signal("TERM");
    let status = tokio::time::timeout(Duration::from_secs(120), proc.child.wait())
        .await
        .expect("the hub did not exit within 120 s of SIGTERM")
        .unwrap();
    let written = statuses_written(&fleet, &names);
    let log = proc.log_text();
    assert!(status.success(), "exit status {status}\n{log}");
    assert!(log.contains("released the lease"), "{log}");
    assert!(
        written < names.len(),
        "the hub wrote all {written} statuses before it stopped"
    );
    eprintln!(
        "{written} of {} statuses written before the hub stopped",
        names.len()
    );
}
