//! DistributedScaledObjects end to end with the real binaries on kedge-sim: one simulated hub
//! cluster (kedge and KEDA CRDs, KEDA emulated) and three member clusters, the real
//! `kedge-hub`, three real `kedge-agent`s and the real `kubectl`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;
use support::dso::*;
use support::*;

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];

/// Weight split, `/scale` following, `kubectl scale`, pause, failover and return, a missing
/// workload, a refused namespace, a hub restart and deletion: one fleet, one scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_scaled_objects_end_to_end() {
    let (_dir, fleet) = start(&MEMBERS).await;
    for member in MEMBERS {
        deployment(&fleet.sim, member, "nginx", 1).await;
    }
    // `web` exists in member-1 and member-2 only.
    deployment(&fleet.sim, "member-1", "web", 1).await;
    deployment(&fleet.sim, "member-2", "web", 1).await;

    let _hub = fleet.start_hub("hub-1.log");
    let mut agents: Vec<Proc> = vec![
        fleet.start_agent("member-1", None, "member-1.log"),
        fleet.start_agent("member-2", None, "member-2.log"),
        // member-3 may only act in `default`.
        fleet.start_agent("member-3", Some("default"), "member-3.log"),
    ];
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;

    // --- Weight split 4:6 of the total KEDA computes: ceil(50 / 5) = 10.
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "nginx", "0", 50.0);
    apply(
        &fleet,
        &dso_yaml(
            "nginx",
            "  memberClusters:\n  - {name: member-1, weight: 4}\n  - {name: member-2, weight: 6}",
            "nginx-metric",
        ),
        "nginx.yaml",
    )
    .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "4:6 of 10")
        .await;
    assert_eq!(fleet.replicas("member-3", "nginx"), Some(1), "not listed");
    // Every reconciliation is timed (kedge_hub_reconcile_duration_seconds).
    let metrics = ops_get(fleet.ports, "/metrics").await.expect("/metrics");
    let count = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"kedge_hub_reconcile_duration_seconds_count{controller="distributedscaledobject"} "#,
            )
        })
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no DSO reconcile durations in:\n{metrics}"));
    assert!(count >= 1, "{count}");

    // The child ScaledObject targets the DSO itself and is owned by it.
    let so = fleet
        .hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")
        .expect("child ScaledObject");
    assert_eq!(
        so["spec"]["scaleTargetRef"],
        json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject", "name": "nginx"})
    );
    assert_eq!(so["spec"]["maxReplicaCount"], 20);
    assert_eq!(
        so["metadata"]["ownerReferences"][0]["kind"],
        "DistributedScaledObject"
    );
    // The hub applies the child only when it differs from the plan (it reads it from a
    // cache), yet a child deleted or edited by someone else is put back.
    fleet
        .kubectl(&[
            "patch",
            "scaledobject.keda.sh/nginx",
            "--type=merge",
            "-p",
            r#"{"spec":{"maxReplicaCount":3}}"#,
        ])
        .await;
    wait_for(LIMIT, "the edited child ScaledObject restored", || async {
        let so = fleet.hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")?;
        (so["spec"]["maxReplicaCount"] == 20).then_some(())
    })
    .await;
    // The hub caches only the ScaledObjects that carry its label: one whose label is
    // removed is put back with it.
    fleet
        .kubectl(&[
            "label",
            "scaledobject.keda.sh/nginx",
            "kedge.dev/distributedscaledobject-",
        ])
        .await;
    wait_for(LIMIT, "the child ScaledObject's label restored", || async {
        let so = fleet.hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")?;
        (so["metadata"]["labels"]["kedge.dev/distributedscaledobject"] == "nginx").then_some(())
    })
    .await;
    let uid = so["metadata"]["uid"].clone();
    fleet
        .kubectl(&["delete", "scaledobject.keda.sh/nginx"])
        .await;
    wait_for(
        LIMIT,
        "the deleted child ScaledObject created again",
        || async {
            let so = fleet.hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")?;
            (so["metadata"]["uid"] != uid && so["spec"]["maxReplicaCount"] == 20).then_some(())
        },
    )
    .await;

    // Status as in the reference, once pods are ready.
    // Settled: 10 in total and every member at what it is asked for (a member whose first
    // report came late is planned a moment after the other, which then runs more for a while).
    let status = wait_for(LIMIT, "status with 10 current replicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        let settled = s["memberClusterStatuses"].as_object().is_some_and(|m| {
            m.values()
                .all(|m| m["currentReplicas"] == m["desiredReplicas"])
        });
        (s["totalCurrentReplicas"] == 10 && settled).then_some(s)
    })
    .await;
    assert_eq!(status["membersHealthyCount"], 2, "{status:#}");
    assert_eq!(status["membersTotalCount"], 2);
    assert_eq!(
        status["selector"],
        "kedge.dev/distributedscaledobject=nginx"
    );
    let m1 = &status["memberClusterStatuses"]["member-1"];
    assert_eq!(m1["desiredReplicas"], 4, "{status:#}");
    assert_eq!(m1["currentReplicas"], 4);
    assert_eq!(m1["state"], "Ready");
    assert_eq!(m1["description"], "Cluster is healthy");
    assert!(
        m1["id"]
            .as_str()
            .unwrap()
            .starts_with("kedge-agent@member-1/")
    );
    assert!(m1["lastStatusChangeTime"].is_string());
    // `Scaled`, or `Rebalanced` when member-2 reported after the first plan had put the
    // whole total on member-1 (the total did not change then, only the split).
    wait_for(LIMIT, "an Event announcing the 4:6 split", || async {
        fleet
            .events("nginx")
            .iter()
            .any(|(reason, note)| {
                (reason == "Scaled" || reason == "Rebalanced")
                    && note.contains("member-1=4, member-2=6")
            })
            .then_some(())
    })
    .await;

    // `kubectl get dso` shows the printer columns.
    let table = fleet.kubectl(&["get", "dso", "nginx"]).await;
    assert!(table.contains("nginx") && table.contains("10"), "{table}");

    // --- Follows /scale changes: ceil(25 / 5) = 5 → 2:3.
    let changed = Instant::now();
    hub.set_metric("default", "nginx", "0", 25.0);
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[2, 3], "2:3 of 5")
        .await;
    eprintln!(
        "scale change to replicas in all members: {:?}",
        changed.elapsed()
    );

    // --- kubectl scale on a DSO whose trigger KEDA cannot read (so KEDA leaves /scale alone).
    // `web` lists no members: every registered member takes part; member-3 has no `web`.
    apply(&fleet, &dso_yaml("web", "", "absent"), "web.yaml").await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    let web = wait_for(LIMIT, "web: member-3 reported missing", || async {
        let s = fleet.dso("web")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "WorkloadMissing").then_some(s)
    })
    .await;
    let m3 = &web["memberClusterStatuses"]["member-3"];
    assert!(
        m3["description"]
            .as_str()
            .unwrap()
            .contains("Deployment default/web not found"),
        "{web:#}"
    );
    fleet.wait_event("web", "WorkloadMissing", "member-3").await;
    // `kubectl describe` reads Events through core/v1: the hub's events.k8s.io/v1 Event shows.
    let described = fleet.kubectl(&["describe", "dso/web"]).await;
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("WorkloadMissing") && events.contains("member-3"),
        "{described}"
    );
    // After gracePeriod member-3's share moves to the others; nothing is created there.
    fleet
        .wait_split("web", &["member-1", "member-2"], &[3, 3], "web 3:3")
        .await;
    assert_eq!(fleet.replicas("member-3", "web"), None, "never created");
    fleet.kubectl(&["scale", "dso/web", "--replicas=4"]).await;
    fleet
        .wait_split("web", &["member-1", "member-2"], &[2, 2], "web 2:2")
        .await;

    // --- An agent refusing a namespace shows in status. The hub lets `default` target
    // `restricted` in member-3 (the grant); member-3's agent may act only in `default`.
    fleet
        .kubectl(&[
            "patch",
            "mc",
            "member-3",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"namespaceMappings":[{"hubNamespace":"default","memberNamespaces":["restricted"]}]}}"#,
        ])
        .await;
    apply(
        &fleet,
        &dso_yaml(
            "guarded",
            "  memberClusters:\n  - {name: member-3, targetNamespace: restricted}",
            "absent",
        ),
        "guarded.yaml",
    )
    .await;
    let guarded = wait_for(LIMIT, "guarded: refused by member-3", || async {
        let s = fleet.dso("guarded")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "Refused").then_some(s)
    })
    .await;
    let description = guarded["memberClusterStatuses"]["member-3"]["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(description.contains("NamespaceNotAllowed"), "{guarded:#}");
    assert_eq!(guarded["membersHealthyCount"], 0);
    fleet
        .wait_event("guarded", "CommandRefused", "NamespaceNotAllowed")
        .await;

    // --- A `Value` metric is refused with a clear message; nothing is sent to members.
    let valued = dso_yaml(
        "valued",
        "  memberClusters:\n  - {name: member-1}",
        "absent",
    )
    .replace(
        "        targetValue: \"5\"\n",
        "        targetValue: \"5\"\n      metricType: Value\n",
    );
    assert!(valued.contains("metricType: Value"), "{valued}");
    apply(&fleet, &valued, "valued.yaml").await;
    let message = wait_for(LIMIT, "valued: Ready=False", || async {
        let s = fleet.dso("valued")["status"].clone();
        condition(&s, "Ready")
            .filter(|c| c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(
        message.contains("spec.scaledObjectSpec.triggers[0].metricType")
            && message.contains("AverageValue"),
        "{message}"
    );
    fleet
        .wait_event("valued", "InvalidSpec", "metricType")
        .await;
    assert!(
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "valued")
            .is_none(),
        "no child ScaledObject for an invalid DSO"
    );

    // --- Pause: nothing changes in members while the total moves.
    fleet
        .kubectl(&["annotate", "dso/nginx", "autoscaling.keda.sh/paused=true"])
        .await;
    wait_for(LIMIT, "Paused condition", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["status"] == "True")
            .then_some(())
    })
    .await;
    hub.set_metric("default", "nginx", "0", 40.0);
    wait_for(LIMIT, "KEDA to set the total to 8", || async {
        (fleet.dso("nginx")["spec"]["totalTargetReplicas"] == 8).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        fleet.split("nginx", &["member-1", "member-2"]),
        [Some(2), Some(3)],
        "paused"
    );

    // An invalid paused-replicas: clear error in status and an Event, nothing changed.
    fleet
        .kubectl(&[
            "annotate",
            "dso/nginx",
            "autoscaling.keda.sh/paused-replicas=three",
        ])
        .await;
    let invalid = wait_for(LIMIT, "Ready=False for paused-replicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Ready")
            .filter(|c| c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(
        invalid.contains("autoscaling.keda.sh/paused-replicas")
            && invalid.contains("non-negative integer"),
        "{invalid}"
    );
    fleet
        .wait_event("nginx", "InvalidSpec", "paused-replicas")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.split("nginx", &["member-1", "member-2"]),
        [Some(2), Some(3)]
    );

    // paused-replicas wins over paused and fixes the total; it is copied to the child.
    fleet
        .kubectl(&[
            "annotate",
            "--overwrite",
            "dso/nginx",
            "autoscaling.keda.sh/paused-replicas=10",
        ])
        .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "paused at 10")
        .await;
    let so = fleet
        .hub_object("keda.sh/v1alpha1", "ScaledObject", "nginx")
        .unwrap();
    assert_eq!(
        so["metadata"]["annotations"]["autoscaling.keda.sh/paused-replicas"],
        "10"
    );
    wait_for(LIMIT, "Paused reason PausedAtReplicas", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["reason"] == "PausedAtReplicas")
            .then_some(())
    })
    .await;

    // Resume: the metric says 10 again.
    hub.set_metric("default", "nginx", "0", 50.0);
    fleet
        .kubectl(&[
            "annotate",
            "dso/nginx",
            "autoscaling.keda.sh/paused-",
            "autoscaling.keda.sh/paused-replicas-",
        ])
        .await;
    wait_for(LIMIT, "Paused=False", || async {
        let s = fleet.dso("nginx")["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["status"] == "False")
            .then_some(())
    })
    .await;
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "resumed")
        .await;

    // --- member-1's agent is cut off: fail-static, its share moves after gracePeriod.
    agents[0].signal("KILL");
    let _ = agents[0].child.wait().await;
    let killed = Instant::now();
    wait_for_states(fleet.ports, &["member-1"], "Unreachable", LIMIT).await;
    let moved = wait_for(LIMIT, "member-2 to take the whole total", || async {
        (fleet.replicas("member-2", "nginx") == Some(10)).then(Instant::now)
    })
    .await;
    let after = moved.duration_since(killed);
    assert!(
        after >= GRACE,
        "share moved {after:?} after the cut, before the grace period"
    );
    assert!(
        after <= DETECTION + GRACE + Duration::from_secs(3),
        "{after:?}"
    );
    assert_eq!(
        fleet.replicas("member-1", "nginx"),
        Some(4),
        "fail-static: the cut-off member keeps its pods"
    );
    // Replica counts alone reach the status at the next status write, a second later at most
    // (docs/dso.md): the status may still show member-1's share when member-2 holds it all.
    let s = wait_for(LIMIT, "member-1's share moved in status", || async {
        let s = fleet.dso("nginx")["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["desiredReplicas"] == 0).then_some(s)
    })
    .await;
    assert_eq!(
        s["memberClusterStatuses"]["member-1"]["state"],
        "Unreachable"
    );
    assert_eq!(s["membersHealthyCount"], 1);
    fleet.wait_event("nginx", "MemberLost", "member-1").await;

    // It returns: replicas go back by weight.
    agents[0] = fleet.start_agent("member-1", None, "member-1-again.log");
    fleet
        .wait_split("nginx", &["member-1", "member-2"], &[4, 6], "back to 4:6")
        .await;
    fleet
        .wait_event("nginx", "MemberReturned", "member-1")
        .await;

    // --- Restarting the hub changes nothing that was correct.
    wait_for(LIMIT, "status settled before the restart", || async {
        let s = fleet.dso("nginx")["status"].clone();
        let w = fleet.dso("web")["status"].clone();
        let web_back = ["member-1", "member-2"]
            .iter()
            .all(|m| w["memberClusterStatuses"][m]["state"] == "Ready")
            && w["totalCurrentReplicas"] == 4;
        (s["membersHealthyCount"] == 2 && s["totalCurrentReplicas"] == 10 && web_back).then_some(())
    })
    .await;
    let before: Vec<Vec<Option<i64>>> = ["nginx", "web"]
        .iter()
        .map(|n| fleet.split(n, &MEMBERS))
        .collect();
    drop(_hub);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _hub = fleet.start_hub("hub-2.log");
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(4) {
        let now: Vec<Vec<Option<i64>>> = ["nginx", "web"]
            .iter()
            .map(|n| fleet.split(n, &MEMBERS))
            .collect();
        assert_eq!(now, before, "a hub restart changed replicas");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;
    // The new hub still follows /scale.
    hub.set_metric("default", "nginx", "0", 25.0);
    fleet
        .wait_split(
            "nginx",
            &["member-1", "member-2"],
            &[2, 3],
            "2:3 after restart",
        )
        .await;

    // --- MemberCluster objects show the sessions.
    let mc = wait_for(LIMIT, "MemberCluster member-2 status", || async {
        let m = hub.object("kedge.dev/v1alpha1", "MemberCluster", "", "member-2")?;
        (m["status"]["state"] == "Ready" && m["status"]["capacity"].is_object()).then_some(m)
    })
    .await;
    assert_eq!(mc["status"]["agentVersion"], env!("CARGO_PKG_VERSION"));
    assert!(
        mc["status"]["kubernetesVersion"]
            .as_str()
            .unwrap()
            .starts_with('v')
    );
    assert!(mc["status"]["lastHeartbeatTime"].is_string());
    assert!(mc["status"]["certificateExpiry"].is_string());
    let table = fleet.kubectl(&["get", "mc"]).await;
    assert!(
        table.contains("member-3") && table.contains("Ready"),
        "{table}"
    );

    // --- The missing Deployment appears in member-3: it is Ready again and takes its share.
    deployment(&fleet.sim, "member-3", "web", 1).await;
    let web = wait_for(LIMIT, "web rebalanced onto member-3", || async {
        let split = fleet.split("web", &MEMBERS);
        let s = fleet.dso("web")["status"].clone();
        let ready = s["memberClusterStatuses"]["member-3"]["state"] == "Ready";
        let total: i64 = split.iter().flatten().sum();
        (ready && total == 4 && split.iter().all(|r| r.is_some_and(|r| r >= 1))).then_some(split)
    })
    .await;
    fleet.wait_event("web", "MemberReturned", "member-3").await;

    // --- It is deleted again: the others hold their replicas for the grace period, then
    // take member-3's share.
    let others = |split: &[Option<i64>]| split[..2].to_vec();
    let held = others(&web);
    Api::<Deployment>::namespaced(
        fleet.sim.cluster("member-3").unwrap().client().unwrap(),
        "default",
    )
    .delete("web", &Default::default())
    .await
    .unwrap();
    wait_for(LIMIT, "web: member-3 missing again", || async {
        let s = fleet.dso("web")["status"].clone();
        (s["memberClusterStatuses"]["member-3"]["state"] == "WorkloadMissing").then_some(())
    })
    .await;
    let missing_since = Instant::now();
    let moved = wait_for(LIMIT, "web: member-3's share moved", || async {
        let split = fleet.split("web", &MEMBERS);
        let total: i64 = split[..2].iter().flatten().sum();
        if total != 4 {
            if missing_since.elapsed() < GRACE - Duration::from_millis(500) {
                assert_eq!(others(&split), held, "moved before the grace period");
            }
            return None;
        }
        Some(missing_since.elapsed())
    })
    .await;
    assert!(
        moved >= GRACE - Duration::from_millis(500),
        "share moved {moved:?} after the workload was reported missing"
    );
    let web = fleet.split("web", &MEMBERS);

    // --- Deleting a DSO deletes its child ScaledObject and leaves the members' pods.
    fleet.kubectl(&["delete", "dso/web", "--wait=true"]).await;
    wait_for(LIMIT, "child ScaledObject web to go", || async {
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "web")
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fleet.split("web", &MEMBERS),
        web,
        "members keep their replicas"
    );

    // One member was lost once; the hub restart added no lost member to status or Events.
    let lost: Vec<_> = fleet
        .events("nginx")
        .into_iter()
        .filter(|(reason, _)| reason == "MemberLost")
        .collect();
    assert_eq!(lost.len(), 1, "{lost:#?}");
}
