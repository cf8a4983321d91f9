//! DistributedScaledJobs end to end with the real binaries on kedge-sim: a queue length
//! read through the shadow KEDA ScaledObject turns into Jobs split by weight over the
//! members, an unreadable metric creates nothing and says why, and a hub restart creates no
//! Job twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::dso::*;
use support::*;

const TWO: [&str; 2] = ["member-1", "member-2"];

/// The tests share two cores; run them one at a time so grace periods mean what they say.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Jobs of DSJ `work` in each member.
async fn jobs(fleet: &Fleet) -> Vec<Vec<Job>> {
    jobs_of(fleet, "work").await
}

/// Jobs of DSJ `name` in each member.
async fn jobs_of(fleet: &Fleet, name: &str) -> Vec<Vec<Job>> {
    let mut out = Vec::new();
    for member in TWO {
        let client = fleet.sim.cluster(member).unwrap().client().unwrap();
        let list = Api::<Job>::namespaced(client, "default")
            .list(&ListParams::default().labels(&format!("kedge.dev/distributedscaledjob={name}")))
            .await
            .unwrap();
        out.push(list.items);
    }
    out
}

/// How many Jobs of DSJ `name` each member has.
async fn counts(fleet: &Fleet, name: &str) -> Vec<usize> {
    jobs_of(fleet, name).await.iter().map(Vec::len).collect()
}

/// Job names of DSJ `name`, all members.
async fn names(fleet: &Fleet, name: &str) -> std::collections::BTreeSet<String> {
    jobs_of(fleet, name)
        .await
        .iter()
        .flatten()
        .filter_map(|j| j.metadata.name.clone())
        .collect()
}

/// Waits until DSJ `name` shows `members` Ready.
async fn ready_for(fleet: &Fleet, name: &str, members: &[&str]) {
    wait_for(LIMIT, &format!("{members:?} Ready for {name}"), || async {
        let s = dsj_named(fleet, name)["status"]["memberClusterStatuses"].clone();
        members
            .iter()
            .all(|m| s[*m]["state"] == "Ready")
            .then_some(())
    })
    .await;
}

/// Waits until DSJ `name` has `want` Jobs per member, then checks that they stay so for
/// three more polls.
async fn settles(fleet: &Fleet, name: &str, want: &[usize], what: &str) {
    wait_for(LIMIT, what, || async {
        (counts(fleet, name).await == want).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(counts(fleet, name).await, want, "{what}: did not stay");
}

/// Waits until the DSJ's status shows both members Ready: connected, with their Jobs
/// reported. Before, a member receives no Job (every Job would go to the other one).
async fn members_ready(fleet: &Fleet) {
    wait_for(LIMIT, "both members Ready for the DSJ", || async {
        let s = dsj(fleet)["status"]["memberClusterStatuses"].clone();
        TWO.iter().all(|m| s[*m]["state"] == "Ready").then_some(())
    })
    .await;
}

/// A running fleet for the DSJ tests: the simulator (Jobs running for `job_duration`), a hub
/// with the DSJ controller and both agents connected. Keep the returned values alive.
async fn dsj_fleet(job_duration: Duration) -> (tempfile::TempDir, Fleet, Proc, [Proc; 2]) {
    let (dir, fleet) = start_with(&TWO, |c| c.job_duration = job_duration).await;
    let hub = fleet.start_hub_with("hub.log", &["--dsj-enabled", "true"]);
    let agents = TWO.map(|m| fleet.start_agent(m, None, &format!("{m}.log")));
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;
    (dir, fleet, hub, agents)
}

fn dsj(fleet: &Fleet) -> Value {
    dsj_named(fleet, "work")
}

fn dsj_named(fleet: &Fleet, name: &str) -> Value {
    fleet
        .hub_object("kedge.dev/v1alpha1", "DistributedScaledJob", name)
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_length_becomes_jobs_split_by_weight() {
    let _serial = SERIAL.lock().await;
    // Jobs run long enough that the split is counted before any finishes.
    let (_dir, fleet, hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;

    // An unreadable metric (the ConfigMap does not exist): nothing is created, and the
    // status says why.
    apply(&fleet, &dsj_yaml("queue"), "work.yaml").await;
    let status = wait_for(LIMIT, "the queue trigger in Error", || async {
        let s = dsj(&fleet)["status"].clone();
        let t = &s["triggerMetricsStatus"][0];
        (t["name"] == "queue" && t["state"] == "Error").then_some(s)
    })
    .await;
    let degraded = condition(&status, "Degraded").unwrap();
    assert_eq!(degraded["reason"], "MetricUnavailable", "{status}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        jobs(&fleet).await.iter().all(Vec::is_empty),
        "Jobs created from an unreadable metric"
    );
    fleet.wait_event("work", "MetricUnavailable", "queue").await;

    // 10 in the queue, target 1 per Job: 10 Jobs, 4 and 6 by weight 2:3.
    members_ready(&fleet).await;
    set_queue(&fleet, 10).await;
    let split = wait_for(LIMIT, "10 Jobs split 4:6", || async {
        let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
        (counts.iter().sum::<usize>() >= 10).then_some(counts)
    })
    .await;
    assert_eq!(split, [4, 6], "split by weight 2:3");
    // The Jobs carry the DSJ's labels, the member and the owner.
    let job = &jobs(&fleet).await[1][0];
    let labels = job.metadata.labels.clone().unwrap();
    assert_eq!(labels["team"], "a");
    assert_eq!(labels["kedge.dev/member"], "member-2");
    assert_eq!(
        job.metadata.annotations.clone().unwrap()["kedge.dev/owner"],
        "default/work"
    );
    let status = wait_for(LIMIT, "status to count 10 Jobs", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["runningJobs"] == 10 && s["desiredJobs"] == 10).then_some(s)
    })
    .await;
    assert_eq!(
        status["memberClusterStatuses"]["member-1"]["runningJobs"], 4,
        "{status}"
    );
    assert_eq!(status["triggerMetricsStatus"][0]["state"], "Active");
    assert!(
        status["memberClusterStatuses"]["member-2"]["id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "the member's session id: {status}"
    );
    assert_eq!(status["scalersTargetAverageValue"]["queue"], "1");

    // More polls with the same queue create nothing more (pendingAware counts what runs).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
    assert_eq!(counts, [4, 6], "Jobs created twice");

    // The hub restarts: the new one reads the Jobs the agents report and creates none twice.
    let next_index = dsj(&fleet)["status"]["scheduling"]["nextJobIndex"].clone();
    assert_eq!(next_index, 10, "{}", dsj(&fleet));
    drop(hub);
    let hub = fleet.start_hub_with("hub-2.log", &["--dsj-enabled", "true"]);
    // The killed hub's Lease expires first (2 s), then the agents' backoff runs out.
    wait_for_states(fleet.ports, &TWO, "Connected", 2 * LIMIT).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
    assert_eq!(counts, [4, 6], "a restarted hub created Jobs twice");

    // Paused: a longer queue creates nothing and the status says so; unpaused, it does.
    fleet
        .kubectl(&["annotate", "dsj/work", "autoscaling.keda.sh/paused=true"])
        .await;
    wait_for(LIMIT, "Paused=True", || async {
        let s = dsj(&fleet)["status"].clone();
        condition(&s, "Paused")
            .is_some_and(|c| c["status"] == "True")
            .then_some(())
    })
    .await;
    set_queue(&fleet, 15).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
    assert_eq!(counts, [4, 6], "a paused DSJ created Jobs");
    fleet
        .kubectl(&["annotate", "dsj/work", "autoscaling.keda.sh/paused-"])
        .await;
    wait_for(LIMIT, "15 Jobs", || async {
        let total: usize = jobs(&fleet).await.iter().map(Vec::len).sum();
        (total >= 15).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
    assert_eq!(
        counts,
        [6, 9],
        "the 5 new Jobs continue the 2:3 round robin"
    );

    // Deleting the DSJ deletes its Jobs in the members, and its shadow ScaledObject.
    fleet.kubectl(&["delete", "dsj/work", "--wait=true"]).await;
    wait_for(LIMIT, "the DSJ's Jobs deleted", || async {
        jobs(&fleet).await.iter().all(Vec::is_empty).then_some(())
    })
    .await;
    wait_for(LIMIT, "the shadow ScaledObject gone", || async {
        fleet
            .hub_object("keda.sh/v1alpha1", "ScaledObject", "work")
            .is_none()
            .then_some(())
    })
    .await;
    drop(hub);
}

/// A member whose pods never start: its Jobs get stuck after the grace period, the member is
/// soft- then hard-tainted (the second failure within `softTaintDuration`), its stuck Jobs
/// are re-created in the other member, and `preferFailover` deletes each source once its
/// failover Job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_jobs_taint_their_member_and_fail_over() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    // member-1's Jobs ask for a node label no node has: their pods stay Pending.
    let yaml = dsj_yaml("queue")
        .replace(
            "  - {name: member-1, weight: 2}",
            "  - name: member-1\n    weight: 1\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}",
        )
        .replace("  - {name: member-2, weight: 3}", "  - {name: member-2, weight: 1}")
        .replace(
            "  scaledJobSpec:\n",
            "  clusterScheduling:\n    failoverPolicy: {gracePeriod: 2s, softTaintDuration: 1m, \
             hardTaintDuration: 5m, duplicationPolicy: preferFailover}\n  scaledJobSpec:\n",
        );
    apply(&fleet, &yaml, "work.yaml").await;
    members_ready(&fleet).await;
    set_queue(&fleet, 2).await;
    // One Job each; member-1's never starts.
    wait_for(LIMIT, "one Job in each member", || async {
        let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
        (counts == [1, 1]).then_some(())
    })
    .await;
    fleet
        .wait_event("work", "JobStuck", "pending longer than the grace period")
        .await;
    fleet.wait_event("work", "Failover", "member-2").await;
    let status = wait_for(LIMIT, "member-1 soft-tainted", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["softTainted"] == true).then_some(s)
    })
    .await;
    assert_eq!(
        status["memberClusterStatuses"]["member-2"]["softTainted"],
        false
    );
    // preferFailover: once the failover Job runs in member-2, the stuck source goes.
    wait_for(LIMIT, "the stuck source deleted", || async {
        let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
        (counts == [0, 2]).then_some(())
    })
    .await;
    fleet.wait_event("work", "JobCleanedUp", "member-1").await;

    // A second Job sent to member-1 gets stuck too: a second failure within
    // softTaintDuration makes the taint hard, and member-1 receives nothing more.
    set_queue(&fleet, 4).await;
    let status = wait_for(Duration::from_secs(30), "member-1 hard-tainted", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["hardTainted"] == true).then_some(s)
    })
    .await;
    let m1 = &status["memberClusterStatuses"]["member-1"];
    assert_eq!(m1["excluded"], true, "{status}");
    assert_eq!(m1["hardTaintScopes"][0], "cluster", "{status}");
    assert!(
        status["scheduling"]["taints"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["member"] == "member-1" && t["hardUntil"].is_string())),
        "{status}"
    );
    // Everything ends up running in member-2.
    wait_for(LIMIT, "4 Jobs running in member-2", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["memberClusterStatuses"]["member-2"]["runningJobs"] == 4
            && s["memberClusterStatuses"]["member-1"]["runningJobs"] == 0)
            .then_some(())
    })
    .await;
}

/// Finished Jobs beyond `successfulJobsHistoryLimit` are deleted, most recent kept; a
/// finished Job no longer counts as running, so the queue keeps getting Jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_limits_delete_old_finished_jobs() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_millis(500)).await;
    let yaml = dsj_yaml("queue").replace(
        "    maxReplicaCount: 50\n",
        "    maxReplicaCount: 50\n    successfulJobsHistoryLimit: 1\n",
    );
    apply(&fleet, &yaml, "work.yaml").await;
    members_ready(&fleet).await;
    set_queue(&fleet, 2).await;
    // Jobs finish in half a second and the queue stays at 2: new Jobs keep coming (one per
    // member and poll). Each member keeps its most recent finished Job, plus those that
    // finished since the last poll (one, two when a loaded machine delays a poll) and one
    // being deleted; without the limit, ten finished Jobs would pile up in each member by
    // the time twenty were created.
    fleet
        .wait_event("work", "JobCleanedUp", "history limit")
        .await;
    let succeeded = |list: &[Job]| {
        list.iter()
            .filter(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.succeeded)
                    .is_some_and(|n| n > 0)
            })
            .count()
    };
    wait_for(Duration::from_secs(45), "20 Jobs created", || async {
        let all = jobs(&fleet).await;
        for (member, list) in TWO.iter().zip(&all) {
            assert!(
                succeeded(list) <= 4,
                "{member} keeps {} finished Jobs with successfulJobsHistoryLimit 1",
                succeeded(list)
            );
        }
        let created = dsj(&fleet)["status"]["scheduling"]["nextJobIndex"]
            .as_i64()
            .unwrap_or(0);
        (created >= 20).then_some(())
    })
    .await;
}

/// `priorityFailover`: every Job goes to the highest-priority member; when its Jobs get stuck
/// it is tainted (scoped to the workload's class, size and the member's priority) and the Jobs
/// go to the next member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_failover_prefers_the_high_priority_member_until_it_fails() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    let yaml = dsj_yaml("queue")
        .replace(
            "  - {name: member-1, weight: 2}",
            "  - name: member-1\n    scheduling: {priority: 2}\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}",
        )
        .replace(
            "  - {name: member-2, weight: 3}",
            "  - {name: member-2, scheduling: {priority: 1}}",
        )
        .replace(
            "  scaledJobSpec:\n",
            "  clusterScheduling:\n    strategy: priorityFailover\n    workloadAffinity: {class: gpu, size: 2}\n    \
             failoverPolicy: {gracePeriod: 2s, softTaintDuration: 0s, hardTaintDuration: 5m}\n  scaledJobSpec:\n",
        );
    apply(&fleet, &yaml, "work.yaml").await;
    members_ready(&fleet).await;
    set_queue(&fleet, 3).await;
    wait_for(
        LIMIT,
        "3 Jobs in member-1, the preferred member",
        || async {
            let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
            (counts == [3, 0]).then_some(())
        },
    )
    .await;
    // softTaintDuration 0s: the first stuck poll makes the taint hard, scoped to the workload.
    let status = wait_for(LIMIT, "member-1 hard-tainted for gpu>=2", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["hardTainted"] == true).then_some(s)
    })
    .await;
    assert_eq!(
        status["memberClusterStatuses"]["member-1"]["hardTaintScopes"][0], "gpu>=2@2",
        "{status}"
    );
    // The stuck Jobs are re-created in member-2 (keepAll keeps the sources).
    wait_for(LIMIT, "3 failover Jobs in member-2", || async {
        let counts: Vec<usize> = jobs(&fleet).await.iter().map(Vec::len).collect();
        (counts == [3, 3]).then_some(())
    })
    .await;
    wait_for(LIMIT, "status: 3 Jobs running in member-2", || async {
        let s = dsj(&fleet)["status"].clone();
        (s["memberClusterStatuses"]["member-2"]["runningJobs"] == 3).then_some(())
    })
    .await;
}

/// A DSJ `name` whose Jobs go to member-1, where their pods never start (they stay pending:
/// a node label no node has), with `strategy` (a `scalingStrategy` flow mapping body).
fn pending_dsj(name: &str, strategy: &str) -> String {
    dsj_yaml("queue")
        .replace("name: work,", &format!("name: {name},"))
        .replace(
            "  - {name: member-1, weight: 2}\n  - {name: member-2, weight: 3}\n",
            "  - name: member-1\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}\n  \
             clusterScheduling:\n    failoverPolicy: {gracePeriod: 1h}\n",
        )
        .replace(
            "    maxReplicaCount: 50\n",
            &format!("    maxReplicaCount: 6\n    scalingStrategy: {{{strategy}}}\n"),
        )
}

/// The five scaling strategies through the real binaries, side by side on one queue of 4
/// (target 1 per Job, `maxReplicaCount` 6), every Job pending in member-1 (so running =
/// pending = the Jobs there), polled every second. By KEDA's formulas, from 0 Jobs:
/// - default: maxScale − running = 4 − R: 4 Jobs.
/// - custom (deduction 1, running 0.5): 4 − 1 − trunc(0.5·R), KEDA truncating the running
///   share on its own: 3, then 2 at R=3, 1 at R=5, 0 at R=6: 6 Jobs (truncating the whole
///   expression, as kedge once did, gives 5).
/// - accurate (KEDA ≥ 2.19): 4 − pending while 4 + R − pending ≤ 6, else 6 − R: 4, then 0
///   (every Job pending): 4 Jobs.
/// - eager: min(6 − R − pending, 4) = min(6 − 2R, 4): 4, then 0: 4 Jobs.
/// - pendingAware: 4 − R + stuck: 4 Jobs.
///
/// Then member-2 joins every DSJ and the grace period drops to 2 s, so the pending Jobs
/// become stuck: only pendingAware re-creates them, min(4 − R + stuck, 6 − R) = min(4, 2):
/// 2 failover Jobs in member-2, as many as `maxReplicaCount` leaves room for; the others
/// count the stuck Jobs as running and create nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_five_scaling_strategies_create_what_the_formulas_give() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    let strategies = [
        ("s-default", "strategy: default", 4),
        (
            "s-custom",
            "strategy: custom, customScalingQueueLengthDeduction: 1, \
             customScalingRunningJobPercentage: \"0.5\"",
            6,
        ),
        ("s-accurate", "strategy: accurate", 4),
        ("s-eager", "strategy: eager", 4),
        ("s-pending-aware", "strategy: pendingAware", 4),
    ];
    for (name, strategy, _) in &strategies {
        apply(
            &fleet,
            &pending_dsj(name, strategy),
            &format!("{name}.yaml"),
        )
        .await;
    }
    for (name, _, _) in &strategies {
        ready_for(&fleet, name, &["member-1"]).await;
    }
    set_queue(&fleet, 4).await;
    for (name, _, want) in &strategies {
        settles(&fleet, name, &[*want, 0], &format!("{name}: {want} Jobs")).await;
    }
    let status = dsj_named(&fleet, "s-accurate")["status"].clone();
    assert_eq!(status["pendingJobs"], 4, "{status}");
    assert_eq!(status["desiredJobs"], 4, "{status}");

    // Stuck: only pendingAware re-creates the stuck Jobs, away from member-1.
    let patch = json!({"spec": {
        "memberClusters": [
            {"name": "member-1", "podOverrides": {"nodeSelector": {"kedge.dev/none": "true"}}},
            {"name": "member-2"}],
        "clusterScheduling": {"failoverPolicy": {"gracePeriod": "2s"}}}})
    .to_string();
    for (name, _, _) in &strategies {
        fleet
            .kubectl(&[
                "patch",
                &format!("dsj/{name}"),
                "--type",
                "merge",
                "-p",
                &patch,
            ])
            .await;
    }
    wait_for(LIMIT, "the Jobs of s-default counted stuck", || async {
        let s = dsj_named(&fleet, "s-default")["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["stuckJobs"] == 4).then_some(())
    })
    .await;
    settles(
        &fleet,
        "s-pending-aware",
        &[4, 2],
        "2 failover Jobs in member-2",
    )
    .await;
    for (name, _, want) in &strategies[..4] {
        assert_eq!(
            counts(&fleet, name).await,
            [*want, 0],
            "{name} re-created stuck Jobs"
        );
    }
}

/// The image of each Job of DSJ `work`.
async fn images(fleet: &Fleet) -> Vec<String> {
    jobs(fleet)
        .await
        .iter()
        .flatten()
        .map(|j| {
            j.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .clone()
                .unwrap_or_default()
        })
        .collect()
}

async fn patch_work(fleet: &Fleet, patch: &Value) {
    fleet
        .kubectl(&[
            "patch",
            "dsj/work",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ])
        .await;
}

fn image_patch(image: &str) -> Value {
    json!({"spec": {"scaledJobSpec": {"jobTargetRef": {"template": {"spec": {
        "containers": [{"name": "worker", "image": image}]}}}}}})
}

/// `rollout.strategy`: by default a changed Job template replaces the running Jobs (deleted
/// with the configured propagation, re-created from the new spec in the same poll); a change
/// that leaves the Jobs' spec alone (here `maxReplicaCount`) deletes nothing; `gradual` lets
/// running Jobs finish and uses the new spec only for new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_replaces_jobs_of_a_changed_template_unless_gradual() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    apply(&fleet, &dsj_yaml("queue"), "work.yaml").await;
    members_ready(&fleet).await;
    set_queue(&fleet, 5).await;
    settles(&fleet, "work", &[2, 3], "5 Jobs split 2:3").await;
    let first = names(&fleet, "work").await;

    // A new image: the 5 Jobs are replaced by 5 made from the new template.
    patch_work(&fleet, &image_patch("busybox:2")).await;
    wait_for(LIMIT, "5 Jobs of busybox:2 only", || async {
        let images = images(&fleet).await;
        (images.len() == 5 && images.iter().all(|i| i == "busybox:2")).then_some(())
    })
    .await;
    let second = names(&fleet, "work").await;
    assert!(first.is_disjoint(&second), "{first:?} {second:?}");
    fleet
        .wait_event("work", "JobRolledOut", "made from an earlier spec")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        counts(&fleet, "work").await.iter().sum::<usize>(),
        5,
        "a rollout changes which Jobs run, not how many"
    );

    // maxReplicaCount does not change the Jobs: none is replaced.
    patch_work(
        &fleet,
        &json!({"spec": {"scaledJobSpec": {"maxReplicaCount": 40}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        names(&fleet, "work").await,
        second,
        "Jobs replaced without a new template"
    );

    // gradual: the running Jobs stay as they are.
    patch_work(
        &fleet,
        &json!({"spec": {"scaledJobSpec": {"rollout": {"strategy": "gradual"},
            "jobTargetRef": {"template": {"spec": {
                "containers": [{"name": "worker", "image": "busybox:3"}]}}}}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(names(&fleet, "work").await, second, "gradual replaced Jobs");
    // New Jobs use the new template.
    set_queue(&fleet, 6).await;
    wait_for(LIMIT, "a 6th Job, of busybox:3", || async {
        let images = images(&fleet).await;
        (images.len() == 6).then_some(images)
    })
    .await;
    let seen = images(&fleet).await;
    assert_eq!(
        seen.iter().filter(|i| *i == "busybox:3").count(),
        1,
        "{seen:?}"
    );

    // Foreground propagation: still replaced, the Jobs go once their pods are gone.
    patch_work(
        &fleet,
        &json!({"spec": {"scaledJobSpec": {
            "rollout": {"strategy": "default", "propagationPolicy": "foreground"},
            "jobTargetRef": {"template": {"spec": {
                "containers": [{"name": "worker", "image": "busybox:4"}]}}}}}}),
    )
    .await;
    wait_for(LIMIT, "6 Jobs of busybox:4 only", || async {
        let images = images(&fleet).await;
        (images.len() == 6 && images.iter().all(|i| i == "busybox:4")).then_some(())
    })
    .await;
}

/// `immediateSourceCleanup` deletes a stuck Job as soon as its failover Job is scheduled;
/// `preferSource` keeps both while the source is stuck and deletes the failover Job once the
/// source runs after all (here: member-1 gets the node label its pods were waiting for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplication_policies_resolve_source_and_failover_jobs() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    let policies = ["immediateSourceCleanup", "preferSource"];
    let name = |policy: &str| policy.to_lowercase();
    for policy in policies {
        let yaml = dsj_yaml("queue")
            .replace("name: work,", &format!("name: {},", name(policy)))
            .replace(
                "  - {name: member-1, weight: 2}",
                "  - name: member-1\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}",
            )
            .replace("  - {name: member-2, weight: 3}", "  - {name: member-2}")
            .replace(
                "  scaledJobSpec:\n",
                &format!(
                    "  clusterScheduling:\n    failoverPolicy: {{gracePeriod: 2s, \
                     duplicationPolicy: {policy}}}\n  scaledJobSpec:\n"
                ),
            );
        apply(&fleet, &yaml, &format!("{policy}.yaml")).await;
    }
    for policy in policies {
        ready_for(&fleet, &name(policy), &TWO).await;
    }
    set_queue(&fleet, 2).await;
    // One Job each; member-1's is stuck after 2 s and re-created in member-2.
    settles(
        &fleet,
        "immediatesourcecleanup",
        &[0, 2],
        "the stuck source deleted at once",
    )
    .await;
    fleet
        .wait_event(
            "immediatesourcecleanup",
            "JobCleanedUp",
            "duplicationPolicy",
        )
        .await;
    settles(
        &fleet,
        "prefersource",
        &[1, 2],
        "source and failover both kept",
    )
    .await;

    // The source's pods can start now: preferSource deletes the failover Job.
    let client = fleet.sim.cluster("member-1").unwrap().client().unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    for node in nodes.list(&ListParams::default()).await.unwrap().items {
        let patch = json!({"metadata": {"labels": {"kedge.dev/none": "true"}}});
        nodes
            .patch(
                &node.metadata.name.unwrap(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    settles(&fleet, "prefersource", &[1, 1], "the failover Job deleted").await;
    fleet
        .wait_event("prefersource", "JobCleanedUp", "member-2")
        .await;
}

/// A priorityFailover DSJ of class `gpu` and `size` (member-1 preferred, priority 2), its
/// Jobs pending forever in member-1 when `stuck`.
fn gpu_dsj(name: &str, size: u32, stuck: bool) -> String {
    let overrides = if stuck {
        "\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}"
    } else {
        ""
    };
    dsj_yaml("queue")
        .replace("name: work,", &format!("name: {name},"))
        .replace(
            "  - {name: member-1, weight: 2}",
            &format!("  - name: member-1\n    scheduling: {{priority: 2}}{overrides}"),
        )
        .replace(
            "  - {name: member-2, weight: 3}",
            "  - {name: member-2, scheduling: {priority: 1}}",
        )
        .replace(
            "  scaledJobSpec:\n",
            &format!(
                "  clusterScheduling:\n    strategy: priorityFailover\n    workloadAffinity: \
                 {{class: gpu, size: {size}}}\n    failoverPolicy: {{gracePeriod: 2s, \
                 softTaintDuration: 0s, hardTaintDuration: 5m}}\n  scaledJobSpec:\n"
            ),
        )
}

/// Taints by (class, size, priority) are shared by the DSJs of a namespace: when the size-4
/// DSJ's Jobs get stuck on member-1, member-1 is excluded for a size-8 DSJ of the class too,
/// while a size-2 one still runs there. A hub restart keeps all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_taint_excludes_only_equal_or_larger_sizes_across_dsjs() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    apply(&fleet, &gpu_dsj("big", 4, true), "big.yaml").await;
    ready_for(&fleet, "big", &TWO).await;
    set_queue(&fleet, 1).await;
    let status = wait_for(LIMIT, "member-1 hard-tainted for gpu>=4", || async {
        let s = dsj_named(&fleet, "big")["status"].clone();
        (s["memberClusterStatuses"]["member-1"]["hardTainted"] == true).then_some(s)
    })
    .await;
    assert_eq!(
        status["memberClusterStatuses"]["member-1"]["hardTaintScopes"][0], "gpu>=4@2",
        "{status}"
    );
    settles(
        &fleet,
        "big",
        &[1, 1],
        "big's stuck Job re-created in member-2",
    )
    .await;

    for (name, size) in [("small", 2), ("bigger", 8)] {
        apply(&fleet, &gpu_dsj(name, size, false), &format!("{name}.yaml")).await;
        ready_for(&fleet, name, &TWO).await;
    }
    settles(&fleet, "small", &[1, 0], "size 2 still placed on member-1").await;
    settles(&fleet, "bigger", &[0, 1], "size 8 kept off member-1").await;
    let bigger = dsj_named(&fleet, "bigger")["status"].clone();
    let m1 = &bigger["memberClusterStatuses"]["member-1"];
    assert_eq!(m1["hardTainted"], true, "{bigger}");
    assert_eq!(m1["hardTaintScopes"][0], "gpu>=4@2", "{bigger}");
    assert!(
        bigger["scheduling"]["taints"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "a shared taint is not kept by the DSJ it only excludes: {bigger}"
    );
    let small = dsj_named(&fleet, "small")["status"].clone();
    assert_eq!(
        small["memberClusterStatuses"]["member-1"]["hardTainted"],
        false
    );

    // A hub restart loses no taint: the next Jobs go where they went before.
    drop(hub);
    let _hub = fleet.start_hub_with("hub-2.log", &["--dsj-enabled", "true"]);
    wait_for_states(fleet.ports, &TWO, "Connected", 2 * LIMIT).await;
    // The restarted hub counts every member's Jobs before it creates any: none twice.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (name, want) in [("big", [1, 1]), ("small", [1, 0]), ("bigger", [0, 1])] {
        assert_eq!(counts(&fleet, name).await, want, "{name} after the restart");
    }
    set_queue(&fleet, 3).await;
    settles(
        &fleet,
        "small",
        &[3, 0],
        "size 2 on member-1 after the restart",
    )
    .await;
    settles(
        &fleet,
        "bigger",
        &[0, 3],
        "size 8 off member-1 after the restart",
    )
    .await;
    let big = dsj_named(&fleet, "big")["status"].clone();
    assert_eq!(
        big["memberClusterStatuses"]["member-1"]["hardTainted"], true,
        "{big}"
    );
    // big: the stuck source (still counted: it is pending), its failover, and the new Job,
    // which avoids member-1.
    settles(&fleet, "big", &[1, 2], "big's new Job in member-2").await;
}

/// Timings act at their own time, not at the next poll: with `pollingInterval: 12` and
/// `gracePeriod: 2s`, a Job stuck in member-1 is replaced in member-2 about 2 s after it was
/// created (a poll would take 12), and `immediateSourceCleanup` deletes the source as soon
/// as member-2 reports the failover Job, not a poll later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_periods_and_cleanup_act_between_polls() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet, _hub, _agents) = dsj_fleet(Duration::from_secs(600)).await;
    set_queue(&fleet, 0).await;
    let yaml = dsj_yaml("queue")
        .replace(
            "  - {name: member-1, weight: 2}\n  - {name: member-2, weight: 3}\n",
            "  - name: member-1\n    weight: 1\n    podOverrides: {nodeSelector: {kedge.dev/none: \"true\"}}\n  \
             - {name: member-2, weight: 1}\n",
        )
        .replace(
            "  scaledJobSpec:\n",
            "  clusterScheduling:\n    failoverPolicy: {gracePeriod: 2s, duplicationPolicy: \
             immediateSourceCleanup}\n  scaledJobSpec:\n",
        )
        .replace("    pollingInterval: 1\n", "    pollingInterval: 12\n");
    apply(&fleet, &yaml, "work.yaml").await;
    // Until both members have reported their Jobs, the one Job would go to whichever did.
    members_ready(&fleet).await;
    set_queue(&fleet, 1).await;
    // The first Job goes to member-1 (first on a tie); its pod never starts.
    let source = wait_for(Duration::from_secs(40), "a Job in member-1", || async {
        jobs(&fleet).await[0].first().cloned()
    })
    .await;
    let created = |j: &Job| j.metadata.creation_timestamp.clone().unwrap().0;
    let failover = wait_for(
        Duration::from_secs(20),
        "its failover Job in member-2",
        || async { jobs(&fleet).await[1].first().cloned() },
    )
    .await;
    let after = created(&failover)
        .duration_since(created(&source))
        .as_secs_f64();
    assert!(
        after < 7.0,
        "failover {after:.1} s after the source; the next poll was 12 s away"
    );
    // The source goes as soon as the failover Job is reported.
    let gone_by = wait_for(Duration::from_secs(20), "the source deleted", || async {
        jobs(&fleet).await[0]
            .is_empty()
            .then(k8s_openapi::jiff::Timestamp::now)
    })
    .await;
    let cleanup = gone_by.duration_since(created(&failover)).as_secs_f64();
    assert!(
        cleanup < 7.0,
        "source deleted {cleanup:.1} s after its failover Job was created"
    );
}

/// A DSJ no member can serve (no agent acts in its namespace) does not look healthy: the
/// creates are refused, the members are tainted until none is eligible, and the status says
/// `Ready=False` with the Jobs it cannot place, `Degraded` agreeing, `runningJobs` 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dsj_no_member_serves_is_not_ready_and_says_why() {
    let _serial = SERIAL.lock().await;
    let (_dir, fleet) = start_with(&TWO, |c| c.job_duration = Duration::from_secs(600)).await;
    let _hub = fleet.start_hub_with("hub.log", &["--dsj-enabled", "true"]);
    // Both agents act only in namespace `shop`; the DSJ lives in `default`.
    let _agents = TWO.map(|m| fleet.start_agent(m, Some("shop"), &format!("{m}.log")));
    wait_for_states(fleet.ports, &TWO, "Connected", LIMIT).await;
    set_queue(&fleet, 3).await;
    apply(&fleet, &dsj_yaml("queue"), "work.yaml").await;
    let status = wait_for(
        Duration::from_secs(40),
        "Ready=False: no member can take Jobs",
        || async {
            let s = dsj(&fleet)["status"].clone();
            // Both members tried and tainted (right after the start, not reported yet).
            condition(&s, "Ready")
                .is_some_and(|c| {
                    c["status"] == "False"
                        && c["reason"] == "NoEligibleMember"
                        && c["message"].as_str().is_some_and(|m| {
                            m.contains("member-1 hard-tainted")
                                && m.contains("member-2 hard-tainted")
                        })
                })
                .then_some(s)
        },
    )
    .await;
    let ready = condition(&status, "Ready").unwrap();
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("3 Jobs cannot be placed")),
        "{status}"
    );
    let degraded = condition(&status, "Degraded").unwrap();
    assert_eq!(degraded["status"], "True", "{status}");
    assert_eq!(degraded["reason"], "NoEligibleMember", "{status}");
    assert_eq!(status["desiredJobs"], 3, "{status}");
    assert_eq!(status["runningJobs"], 0, "{status}");
    assert!(jobs(&fleet).await.iter().all(Vec::is_empty));
    fleet.wait_event("work", "JobCreateFailed", "member-").await;
}
