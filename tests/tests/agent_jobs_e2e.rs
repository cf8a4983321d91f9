//! The real `kedge-agent` running Jobs for DistributedScaledJobs, against a scripted hub
//! (real QUIC, real mTLS) and a simulated member cluster whose Job controller runs them:
//! Jobs are created with kedge's ownership label and annotation, reported Pending, Running
//! and Succeeded as their watches see them, a Job whose pods cannot be scheduled is reported
//! Pending with the reason, Jobs kedge did not create are never deleted, and a reconnect
//! gives one full report naming every managed Job once, with no Job created twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kedge_core::crd::conditions::{ANNOTATION_OWNER, LABEL_DSJ};
use kedge_protocol::*;
use kedge_sim::{Sim, SimConfig};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use support::hub_peer::{HubPeer, HubSide, JobBook, Session, next};
use support::*;

const OWNER: &str = "apps/work";

fn manifest(name: &str, run_seconds: &str, node_selector: Option<Value>) -> Vec<u8> {
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": {"sim.kedge.dev/run-seconds": run_seconds}},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}
    });
    if let Some(selector) = node_selector {
        job["spec"]["template"]["spec"]["nodeSelector"] = selector;
    }
    serde_json::to_vec(&job).unwrap()
}

fn create(namespace: &str, name: &str, owner: &str, manifest_json: Vec<u8>) -> JobCreate {
    JobCreate {
        namespace: namespace.into(),
        name: name.into(),
        owner: owner.into(),
        manifest_json,
    }
}

fn delete(name: &str, owner: &str) -> JobDelete {
    JobDelete {
        namespace: "apps".into(),
        name: name.into(),
        owner: owner.into(),
        propagation: Propagation::Background,
    }
}

/// Reads the agent's messages into `book` until `done` holds for it; returns the acks read
/// on the way.
async fn read_until(
    control: &mut HubSide,
    book: &mut JobBook,
    what: &str,
    done: impl Fn(&JobBook) -> bool,
) -> Vec<Ack> {
    let mut acks = Vec::new();
    if done(book) {
        return acks;
    }
    next(control, what, |m| {
        match m {
            AgentMessage::Report(r) => book.record(&r),
            AgentMessage::Ack(a) => acks.push(a),
            _ => {}
        }
        done(book).then_some(())
    })
    .await;
    acks
}

/// The outcome of every command of revision `revision`, by target.
async fn ack_of(control: &mut HubSide, book: &mut JobBook, revision: u64) -> Vec<CommandResult> {
    let mut found = None;
    next(control, &format!("the ack of revision {revision}"), |m| {
        match m {
            AgentMessage::Report(r) => book.record(&r),
            AgentMessage::Ack(a) if a.revision == revision => found = Some(a.results),
            _ => {}
        }
        found.take()
    })
    .await
}

fn failure_of(results: &[CommandResult], name: &str) -> Option<Failure> {
    results
        .iter()
        .find(|r| matches!(&r.target, CommandTarget::Job(j) if j.ends_with(&format!("/{name}"))))
        .unwrap_or_else(|| panic!("no result for {name}: {results:?}"))
        .failure
        .clone()
}

fn status<'a>(book: &'a JobBook, name: &str) -> Option<&'a JobStatus> {
    book.jobs.values().find(|s| s.name == name)
}

fn names(book: &JobBook) -> BTreeSet<&str> {
    book.jobs.values().map(|s| s.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_reports_and_guards_jobs() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge"]).await;
    // Pods start 1.5 s after they are bound, so that a Job is seen Pending before it runs.
    let config = SimConfig {
        pod_start_delay: Duration::from_millis(1500),
        ..SimConfig::default()
    };
    let sim = Sim::start(&["edge".into()], config, Some(dir.path()))
        .await
        .unwrap();
    let client = sim.cluster("edge").unwrap().client().unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap(),
        )
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "apps");
    // Two Jobs kedge did not create for this owner: one unlabelled, one of another DSJ.
    for (name, labels, annotations) in [
        ("foreign", json!({}), json!({})),
        (
            "other",
            json!({LABEL_DSJ: "other"}),
            json!({ANNOTATION_OWNER: "apps/other", "sim.kedge.dev/run-seconds": "3600"}),
        ),
    ] {
        let job = json!({
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"template": {"metadata": {"labels": labels}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
        });
        jobs.create(
            &PostParams::default(),
            &serde_json::from_value(job).unwrap(),
        )
        .await
        .unwrap();
    }

    let hub = HubPeer::start(&pki);
    let agent = start_agent_with(
        &pki,
        "edge",
        hub.ports(),
        dir.path().join("agent.log"),
        &["--namespaces", "apps", "--report-interval", "300ms"],
    );
    let Session {
        connection,
        mut control,
        ..
    } = hub.accept("edge").await;

    // The first full report names the one labelled Job already there.
    let mut book = JobBook::default();
    read_until(&mut control, &mut book, "the first full report", |b| {
        b.complete
    })
    .await;
    assert_eq!(names(&book), BTreeSet::from(["other"]), "{book:?}");
    assert_eq!(status(&book, "other").unwrap().owner, "apps/other");

    let stuck = manifest("stuck", "1", Some(json!({"disk": "none"})));
    let desired = DesiredState {
        revision: 1,
        create_jobs: vec![
            create("apps", "work-1", OWNER, manifest("work-1", "2", None)),
            create("apps", "stuck", OWNER, stuck.clone()),
            create(
                "apps",
                "bad-owner",
                "not-an-owner",
                manifest("bad-owner", "1", None),
            ),
            create(
                "kube-system",
                "elsewhere",
                OWNER,
                manifest("elsewhere", "1", None),
            ),
        ],
        delete_jobs: vec![delete("foreign", OWNER), delete("other", OWNER)],
        ..Default::default()
    };
    control
        .send(&HubMessage::DesiredState(desired))
        .await
        .unwrap();
    let results = ack_of(&mut control, &mut book, 1).await;
    assert_eq!(failure_of(&results, "work-1"), None);
    assert_eq!(failure_of(&results, "stuck"), None);
    let code = |name: &str| {
        let f = failure_of(&results, name).unwrap_or_else(|| panic!("{name} succeeded"));
        assert_eq!(f.retry, Retry::Permanent, "{name}: {f:?}");
        f.code
    };
    assert_eq!(code("bad-owner"), FailureCode::Invalid);
    assert_eq!(code("elsewhere"), FailureCode::NamespaceNotAllowed);
    assert_eq!(code("foreign"), FailureCode::NotOwned);
    assert_eq!(code("other"), FailureCode::NotOwned);
    for name in ["foreign", "other"] {
        assert!(
            jobs.get_opt(name).await.unwrap().is_some(),
            "{name} was deleted:\n{}",
            agent.log_text()
        );
    }
    assert!(jobs.get_opt("bad-owner").await.unwrap().is_none());
    let work = jobs.get("work-1").await.unwrap();
    let template = work.spec.unwrap().template.metadata.unwrap();
    for (what, labels, annotations) in [
        ("Job", work.metadata.labels, work.metadata.annotations),
        ("pod template", template.labels, template.annotations),
    ] {
        assert_eq!(
            labels.unwrap().get(LABEL_DSJ).map(String::as_str),
            Some("work"),
            "{what}"
        );
        assert_eq!(
            annotations
                .unwrap()
                .get(ANNOTATION_OWNER)
                .map(String::as_str),
            Some(OWNER),
            "{what}"
        );
    }

    // work-1 runs to the end; stuck never schedules and says why.
    let mut ready_while_running = false;
    let limit = std::time::Instant::now() + Duration::from_secs(30);
    while !(status(&book, "work-1").is_some_and(|s| s.phase == JobPhase::Succeeded)
        && status(&book, "stuck").is_some_and(|s| s.pending_reason.is_some()))
    {
        assert!(
            std::time::Instant::now() < limit,
            "work-1 never succeeded or stuck never got a reason: {book:?}\n{}",
            agent.log_text()
        );
        let report = next(&mut control, "a report", |m| match m {
            AgentMessage::Report(r) => Some(r),
            _ => None,
        })
        .await;
        book.record(&report);
        ready_while_running |= report.jobs.iter().any(|s| {
            s.name == "work-1"
                && s.phase == JobPhase::Running
                && s.any_pod_running_or_completed
                && s.true_pod_conditions
                    .iter()
                    .any(|set| set.pods == 1 && set.true_conditions.iter().any(|c| c == "Ready"))
        });
    }
    assert_eq!(
        book.phases("work-1"),
        [JobPhase::Pending, JobPhase::Running, JobPhase::Succeeded],
        "{book:?}"
    );
    assert!(ready_while_running, "{book:?}");
    let work = status(&book, "work-1").unwrap();
    assert_eq!(work.owner, OWNER);
    assert!(work.finished_unix_ms.unwrap() >= work.created_unix_ms);
    assert!(work.created_unix_ms > 1_700_000_000_000, "{work:?}");
    let stuck_status = status(&book, "stuck").unwrap();
    assert_eq!(stuck_status.phase, JobPhase::Pending);
    assert_eq!(
        stuck_status.pending_reason.as_deref(),
        Some("Unschedulable")
    );
    assert!(!stuck_status.any_pod_running_or_completed);
    assert_eq!(book.phases("stuck"), [JobPhase::Pending]);

    // Its own finished Job is deleted when the hub says so, and reported gone.
    let second = DesiredState {
        revision: 2,
        create_jobs: vec![create("apps", "stuck", OWNER, stuck.clone())],
        delete_jobs: vec![delete("work-1", OWNER)],
        ..Default::default()
    };
    control
        .send(&HubMessage::DesiredState(second))
        .await
        .unwrap();
    let results = ack_of(&mut control, &mut book, 2).await;
    assert!(results.iter().all(|r| r.failure.is_none()), "{results:?}");
    read_until(&mut control, &mut book, "work-1 reported gone", |b| {
        status(b, "work-1").is_none()
    })
    .await;
    assert!(jobs.get_opt("work-1").await.unwrap().is_none());

    // The hub drops the connection: the agent comes back with one full report naming every
    // managed Job once.
    connection.close(0u32.into(), b"hub restarts");
    let Session {
        mut control,
        connection: _again,
        ..
    } = hub.accept("edge").await;
    let mut after = JobBook::default();
    read_until(
        &mut control,
        &mut after,
        "the full report after reconnecting",
        |b| b.complete,
    )
    .await;
    assert_eq!(
        names(&after),
        BTreeSet::from(["other", "stuck"]),
        "{after:?}"
    );
    assert_eq!(after.duplicates, 0, "{after:?}");
    assert_eq!(
        status(&after, "stuck").unwrap().pending_reason.as_deref(),
        Some("Unschedulable")
    );

    // The hub re-sends its desired state: nothing is created twice.
    let third = DesiredState {
        revision: 3,
        create_jobs: vec![create("apps", "stuck", OWNER, stuck)],
        ..Default::default()
    };
    control
        .send(&HubMessage::DesiredState(third))
        .await
        .unwrap();
    let results = ack_of(&mut control, &mut after, 3).await;
    assert_eq!(failure_of(&results, "stuck"), None);
    let labelled = jobs
        .list(&ListParams::default().labels(LABEL_DSJ))
        .await
        .unwrap();
    let mut in_sim: Vec<String> = labelled
        .items
        .iter()
        .filter_map(|j| j.metadata.name.clone())
        .collect();
    in_sim.sort();
    assert_eq!(in_sim, ["other", "stuck"]);
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );
    let _keep = sim;
}
