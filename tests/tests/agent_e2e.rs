//! The real `kedge-agent` against a scripted hub peer (real QUIC, real mTLS) and a simulated
//! member cluster: it applies replicas through `/scale`, refuses namespaces it does not
//! manage, reports a missing workload instead of creating it, restores a replica count
//! changed by hand, reports capacity, and keeps everything when the hub goes away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kedge_protocol::*;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::hub_peer::{HubPeer, Session, next, next_within};
use support::*;

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
        }
    }))
    .unwrap()
}

fn workload(namespace: &str, name: &str) -> WorkloadRef {
    WorkloadRef::deployment(namespace, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_applies_refuses_reports_and_restores() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge"]).await;
    let clusters = start_clusters(dir.path(), &["edge"]).await;
    let client = clusters.cluster("edge").unwrap().client().unwrap();
    create_namespace(&client, "apps").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "apps");
    deployments
        .create(&PostParams::default(), &deployment("web", 1))
        .await
        .unwrap();

    // A scripted hub: the real server TLS configuration, our own session logic.
    let hub = HubPeer::start(&pki);
    let mut agent = start_agent_with(
        &pki,
        "edge",
        hub.ports(),
        dir.path().join("agent.log"),
        &["--namespaces", "apps", "--report-interval", "300ms"],
    );
    let Session {
        connection,
        mut control,
        hello,
    } = hub.accept("edge").await;
    assert!(hello.kubernetes_version.starts_with('v'), "{hello:?}");
    assert_eq!(hello.namespaces, vec!["apps".to_string()]);

    // A full report arrives first, with the cluster's capacity (3 nodes x 8 CPUs).
    let capacity = next(&mut control, "a full report", |m| match m {
        AgentMessage::Report(r) if r.full => Some(r.capacity),
        _ => None,
    })
    .await
    .expect("capacity in the full report");
    assert_eq!(
        (capacity.ready_nodes, capacity.allocatable_cpu_millis),
        (3, 24_000)
    );

    let owner = "apps/web-dso".to_string();
    let desired = DesiredState {
        revision: 1,
        workloads: vec![
            WorkloadReplicas {
                workload: workload("apps", "web"),
                replicas: Some(3),
                owner: owner.clone(),
            },
            WorkloadReplicas {
                workload: workload("apps", "ghost"),
                replicas: Some(2),
                owner: owner.clone(),
            },
            WorkloadReplicas {
                workload: workload("kube-system", "coredns"),
                replicas: Some(0),
                owner: owner.clone(),
            },
        ],
        ..Default::default()
    };
    control
        .send(&HubMessage::DesiredState(desired))
        .await
        .unwrap();
    let ack = next(&mut control, "the ack of revision 1", |m| match m {
        AgentMessage::Ack(a) if a.revision == 1 => Some(a),
        _ => None,
    })
    .await;
    let failure_of = |name: &str| {
        ack.results
            .iter()
            .find(|r| matches!(&r.target, CommandTarget::Workload(w) if w.name == name))
            .unwrap_or_else(|| panic!("no result for {name}: {ack:?}"))
            .failure
            .clone()
    };
    assert_eq!(failure_of("web"), None);
    let ghost = failure_of("ghost").expect("a missing workload fails");
    assert_eq!(
        (ghost.retry, ghost.code),
        (Retry::Permanent, FailureCode::NotFound)
    );
    let refused = failure_of("coredns").expect("kube-system is refused");
    assert_eq!(
        (refused.retry, refused.code),
        (Retry::Permanent, FailureCode::NamespaceNotAllowed)
    );
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(3)
    );
    assert!(
        deployments.get_opt("ghost").await.unwrap().is_none(),
        "a missing workload was created"
    );

    // Reports (incremental: each says what changed): web exists with 3 replicas and its
    // pods' requests, ghost is reported missing, coredns carries the reason the agent cannot
    // read it.
    let mut reported = std::collections::BTreeMap::new();
    next(
        &mut control,
        "reports of web (3), ghost (missing) and coredns (refused)",
        |m| match m {
            AgentMessage::Report(r) => {
                for w in r.workloads {
                    reported.insert(w.workload.name.clone(), w);
                }
                let find = |n: &str| reported.get(n);
                let web = find("web");
                let ghost = find("ghost");
                let coredns = find("coredns");
                (web.is_some_and(|w| {
                    w.exists
                        && w.spec_replicas == 3
                        && w.pod_cpu_millis == 100
                        && w.failure.is_none()
                }) && ghost.is_some_and(|g| !g.exists && g.failure.is_none())
                    && coredns.is_some_and(|c| {
                        c.failure
                            .as_ref()
                            .is_some_and(|f| f.code == FailureCode::NamespaceNotAllowed)
                    }))
                .then_some(())
            }
            _ => None,
        },
    )
    .await;

    // Someone scales by hand: the agent puts it back.
    let patch = json!({"spec": {"replicas": 7}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let restored = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if deployments.get("web").await.unwrap().spec.unwrap().replicas == Some(3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        restored.is_ok(),
        "replicas changed by hand were not restored:\n{}",
        agent.log_text()
    );

    // Held (no count): a hand edit stays; the agent keeps reporting the workload.
    let hold = |revision: u64, replicas: Option<i32>| DesiredState {
        revision,
        workloads: vec![WorkloadReplicas {
            workload: workload("apps", "web"),
            replicas,
            owner: owner.clone(),
        }],
        ..Default::default()
    };
    control
        .send(&HubMessage::DesiredState(hold(2, None)))
        .await
        .unwrap();
    next(&mut control, "the ack of revision 2", |m| match m {
        AgentMessage::Ack(a) if a.revision == 2 => Some(()),
        _ => None,
    })
    .await;
    let scale_to = |n: i32| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch_scale(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap();
        }
    };
    scale_to(5).await;
    next(&mut control, "a report of web at 5", |m| match m {
        AgentMessage::Report(r) => r
            .workloads
            .iter()
            .any(|w| w.workload.name == "web" && w.spec_replicas == 5)
            .then_some(()),
        _ => None,
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(5),
        "a held workload was changed"
    );

    // Counted again: restored; edited again and again: a conflict, and no more restores.
    control
        .send(&HubMessage::DesiredState(hold(3, Some(3))))
        .await
        .unwrap();
    let replicas_become = |n: i32| {
        let deployments = deployments.clone();
        let agent = &agent;
        async move {
            tokio::time::timeout(Duration::from_secs(15), async {
                while deployments.get("web").await.unwrap().spec.unwrap().replicas != Some(n) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("web never reached {n}:\n{}", agent.log_text()));
        }
    };
    // The hand edit above was the first within the minute: two more make three.
    replicas_become(3).await;
    scale_to(6).await;
    replicas_become(3).await;
    scale_to(8).await;
    let conflict = next(&mut control, "a reported conflict", |m| match m {
        AgentMessage::Report(r) => r
            .workloads
            .iter()
            .find(|w| w.workload.name == "web")
            .and_then(|w| w.conflict.clone()),
        _ => None,
    })
    .await;
    assert!(
        conflict.contains("changed the replicas 3 times"),
        "{conflict}"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(8),
        "the agent kept fighting"
    );

    // A local HorizontalPodAutoscaler targeting a workload is reported by name.
    deployments
        .create(&PostParams::default(), &deployment("api", 2))
        .await
        .unwrap();
    let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> =
        Api::namespaced(client.clone(), "apps");
    hpas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "api", "namespace": "apps"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
                "maxReplicas": 5}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    // The hub holds a workload in conflict (web) while it counts api.
    let mut with_api = hold(4, None);
    with_api.workloads.push(WorkloadReplicas {
        workload: workload("apps", "api"),
        replicas: Some(4),
        owner: owner.clone(),
    });
    control
        .send(&HubMessage::DesiredState(with_api))
        .await
        .unwrap();
    let conflict = next(&mut control, "the HPA reported", |m| match m {
        AgentMessage::Report(r) => r
            .workloads
            .iter()
            .find(|w| w.workload.name == "api")
            .and_then(|w| w.conflict.clone()),
        _ => None,
    })
    .await;
    assert_eq!(conflict, "HorizontalPodAutoscaler apps/api");

    // The hub goes away: nothing changes in the member cluster.
    connection.close(0u32.into(), b"hub gone");
    hub.endpoint.close(0u32.into(), b"hub gone");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(8)
    );
    assert!(
        agent.is_running(),
        "the agent must keep running without its hub"
    );
    let _keep = Arc::new(clusters);
}

/// The hub changing its mind quickly (a DSO re-planned while members report) is not
/// "something else scaling the workload": the agent's own applies, however they interleave
/// with its look at the workloads, never count as edits, so no conflict is reported and
/// every workload ends at the last count the hub asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_changes_from_the_hub_are_not_taken_for_edits_in_the_member() {
    const WORKLOADS: usize = 8;
    const REVISIONS: u64 = 100;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge"]).await;
    let clusters = start_clusters(dir.path(), &["edge"]).await;
    let client = clusters.cluster("edge").unwrap().client().unwrap();
    create_namespace(&client, "apps").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "apps");
    let names: Vec<String> = (0..WORKLOADS).map(|i| format!("w{i:02}")).collect();
    for name in &names {
        deployments
            .create(&PostParams::default(), &deployment(name, 1))
            .await
            .unwrap();
    }
    let hub = HubPeer::start(&pki);
    // Looks at the workloads every 50 ms: many looks fall while an apply is under way.
    let agent = start_agent_with(
        &pki,
        "edge",
        hub.ports(),
        dir.path().join("agent.log"),
        &["--namespaces", "apps", "--report-interval", "50ms"],
    );
    let Session { mut control, .. } = hub.accept("edge").await;
    let state = |revision: u64| {
        let replicas = if revision % 2 == 1 { 2 } else { 1 };
        DesiredState {
            revision,
            workloads: names
                .iter()
                .map(|n| WorkloadReplicas {
                    workload: workload("apps", n),
                    replicas: Some(replicas),
                    owner: "apps/many".into(),
                })
                .collect(),
            ..Default::default()
        }
    };
    // The hub sends a new state every 50 ms without waiting for acks, faster than the agent
    // applies; every report is read meanwhile, until 1.5 s after the ack of the last state.
    let mut conflicts = Vec::new();
    let mut last_ack = 0;
    let mut sent = 0;
    let mut send_tick = tokio::time::interval(Duration::from_millis(50));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut quiet_until = None;
    loop {
        tokio::select! {
            message = control.recv() => match message.unwrap().expect("agent closed the control stream") {
                AgentMessage::Ack(a) => {
                    last_ack = last_ack.max(a.revision);
                    if last_ack == REVISIONS && quiet_until.is_none() {
                        quiet_until = Some(tokio::time::Instant::now() + Duration::from_millis(1500));
                    }
                }
                AgentMessage::Report(r) => conflicts.extend(r.workloads.iter().filter_map(|w| {
                    w.conflict.clone().map(|c| (w.workload.name.clone(), c))
                })),
                _ => {}
            },
            _ = send_tick.tick(), if sent < REVISIONS => {
                sent += 1;
                control.send(&HubMessage::DesiredState(state(sent))).await.unwrap();
            }
            _ = tokio::time::sleep_until(quiet_until.unwrap_or(deadline)) => break,
        }
    }
    assert_eq!(last_ack, REVISIONS, "{}", agent.log_text());
    assert!(
        conflicts.is_empty(),
        "the agent took its own applies for edits: {conflicts:?}\n{}",
        agent.log_text()
    );
    let want = if REVISIONS % 2 == 1 { 2 } else { 1 };
    for name in &names {
        let d = deployments.get(name).await.unwrap();
        assert_eq!(d.spec.unwrap().replicas, Some(want), "{name}");
    }
}

/// The agent, its cluster with Deployment `web` (1 replica) in `apps`, and a session whose
/// first full report has arrived.
async fn agent_with_web(
    dir: &std::path::Path,
    extra: &[&str],
) -> (kedge_sim::Sim, Api<Deployment>, Proc, HubPeer, Session) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::create(dir, &["edge"]).await;
    let clusters = start_clusters(dir, &["edge"]).await;
    let client = clusters.cluster("edge").unwrap().client().unwrap();
    create_namespace(&client, "apps").await;
    let deployments: Api<Deployment> = Api::namespaced(client, "apps");
    deployments
        .create(&PostParams::default(), &deployment("web", 1))
        .await
        .unwrap();
    let hub = HubPeer::start(&pki);
    let mut args = vec!["--namespaces", "apps"];
    args.extend(extra);
    let agent = start_agent_with(&pki, "edge", hub.ports(), dir.join("agent.log"), &args);
    let mut session = hub.accept("edge").await;
    next(&mut session.control, "a full report", |m| match m {
        AgentMessage::Report(r) if r.full => Some(()),
        _ => None,
    })
    .await;
    (clusters, deployments, agent, hub, session)
}

fn web_at(replicas: i32) -> HubMessage {
    HubMessage::DesiredState(DesiredState {
        revision: 1,
        workloads: vec![WorkloadReplicas {
            workload: workload("apps", "web"),
            replicas: Some(replicas),
            owner: "apps/web-dso".into(),
        }],
        ..Default::default()
    })
}

/// Managed workloads are watched: with a report interval far longer than the test, the
/// agent reports a workload as its readiness changes and restores a hand edit at once (the
/// report tick, 60 s, would come much later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_workload_is_reported_and_restored_before_the_report_tick() {
    let dir = tempfile::tempdir().unwrap();
    let (_clusters, deployments, agent, _hub, mut session) =
        agent_with_web(dir.path(), &["--report-interval", "60s"]).await;
    let control = &mut session.control;
    control.send(&web_at(3)).await.unwrap();
    // Ready replicas change as the simulated pods start: each change is reported.
    next_within(
        control,
        Duration::from_secs(15),
        "a report of web with 3 ready replicas",
        |m| match m {
            AgentMessage::Report(r) => r
                .workloads
                .iter()
                .any(|w| w.workload.name == "web" && w.spec_replicas == 3 && w.ready_replicas == 3)
                .then_some(()),
            _ => None,
        },
    )
    .await;
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    let restored = tokio::time::timeout(Duration::from_secs(15), async {
        while deployments.get("web").await.unwrap().spec.unwrap().replicas != Some(3) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        restored.is_ok(),
        "a hand edit was not restored before the report tick:\n{}",
        agent.log_text()
    );
}

/// An idle agent reads no workload: with a report tick every 100 ms, nothing it manages is
/// fetched, listed or read through `/scale` while nothing changes (its watches stay open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_reads_no_workload() {
    let dir = tempfile::tempdir().unwrap();
    let (clusters, _deployments, agent, _hub, mut session) = agent_with_web(
        dir.path(),
        &["--report-interval", "100ms", "--capacity-interval", "1h"],
    )
    .await;
    let control = &mut session.control;
    control.send(&web_at(2)).await.unwrap();
    next(
        control,
        "a report of web with 2 ready replicas",
        |m| match m {
            AgentMessage::Report(r) => r
                .workloads
                .iter()
                .any(|w| w.workload.name == "web" && w.ready_replicas == 2)
                .then_some(()),
            _ => None,
        },
    )
    .await;
    let cluster = clusters.cluster("edge").unwrap();
    let reads = [
        "get deployments",
        "get deployments/scale",
        "list deployments",
        "list pods",
        "list horizontalpodautoscalers",
        "list scaledobjects",
    ];
    let count = || reads.map(|what| (what, cluster.requests(what)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = count();
    // Twenty report ticks.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(),
        before,
        "an idle agent read its workloads:\n{}",
        agent.log_text()
    );
    assert!(
        cluster.requests("watch deployments") > 0 && cluster.requests("watch pods") > 0,
        "the agent does not watch its workload: {before:?}"
    );
}
