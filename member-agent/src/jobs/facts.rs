//! What the agent keeps of each managed Job and pod, and how a Job's status follows from
//! them. Objects are decoded into small shapes that name only the fields the report needs
//! (a pod's spec never is), then reduced to compact facts; nothing else is kept.

use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kedge_core::crd::conditions::{ANNOTATION_OWNER, ANNOTATION_REPLACES, ANNOTATION_TEMPLATE};
use kedge_protocol::{
    JobPhase, JobRef, JobStatus, MAX_POD_CONDITION_SETS, MAX_POD_CONDITION_TYPES, PodConditionSet,
    bounded_text,
};
use serde::Deserialize;

use crate::lite::lite_resource;

/// A `status.conditions[]` entry of a Job or pod.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// When the status last changed.
    #[serde(default)]
    pub last_transition_time: Option<Time>,
}

/// A `batch/v1` Job, decoded with only what the report needs.
#[derive(Debug, Clone, Deserialize)]
pub struct JobLite {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<JobLiteStatus>,
}

/// The part of a Job's status the report needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobLiteStatus {
    /// `Complete`, `Failed`, ….
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
    /// When the Job completed.
    #[serde(default)]
    pub completion_time: Option<Time>,
}

/// A `v1` Pod, decoded with only what the report needs.
#[derive(Debug, Clone, Deserialize)]
pub struct PodLite {
    /// Standard metadata (without annotations and managed fields: [`crate::lite::slim_meta`]).
    #[serde(deserialize_with = "crate::lite::slim_meta")]
    pub metadata: ObjectMeta,
    /// The status, if any.
    #[serde(default)]
    pub status: Option<PodLiteStatus>,
}

/// The part of a pod's status the report needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodLiteStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// Pod conditions.
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
    /// Init container states.
    #[serde(default)]
    pub init_container_statuses: Option<Vec<ContainerLite>>,
    /// Container states.
    #[serde(default)]
    pub container_statuses: Option<Vec<ContainerLite>>,
}

/// A container status, reduced to why it waits.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerLite {
    /// The container's state.
    #[serde(default)]
    pub state: Option<ContainerStateLite>,
}

/// A container state, reduced to `waiting`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerStateLite {
    /// Set while the container waits to start.
    #[serde(default)]
    pub waiting: Option<ContainerWaiting>,
}

/// Why a container waits.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerWaiting {
    /// E.g. `ContainerCreating`, `ImagePullBackOff`, `CrashLoopBackOff`.
    #[serde(default)]
    pub reason: Option<String>,
}

lite_resource!(
    JobLite,
    "batch",
    "v1",
    "Job",
    "jobs",
    NamespaceResourceScope
);
lite_resource!(PodLite, "", "v1", "Pod", "pods", NamespaceResourceScope);

fn unix_ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

fn true_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// How a Job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `Complete` is `True`.
    Succeeded,
    /// `Failed` is `True`, with the condition's reason.
    Failed(Option<String>),
}

/// What the agent keeps of one managed Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFacts {
    /// The Job's uid, to tell its pods from those of an older Job of the same name.
    pub uid: String,
    /// Its `kedge.dev/owner` annotation (empty when missing).
    pub owner: String,
    /// `creationTimestamp`, Unix ms (0 when missing).
    pub created_unix_ms: i64,
    /// How and when it finished, if it did.
    pub finished: Option<(Outcome, Option<i64>)>,
    /// Its `kedge.dev/replaces` annotation: the stuck Job a failover Job replaces.
    pub replaces: Option<String>,
    /// Its `kedge.dev/template` annotation: the hash of the spec it was made from.
    pub template: Option<String>,
}

impl JobFacts {
    /// The Job's key and facts, or `None` for an object without a namespace or name.
    pub fn of(job: &JobLite) -> Option<(JobRef, JobFacts)> {
        let meta = &job.metadata;
        let key = JobRef {
            namespace: bounded_text(meta.namespace.as_deref()?),
            name: bounded_text(meta.name.as_deref()?),
        };
        let conditions = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        // A Job never has both; Failed wins if a broken controller set both.
        let finished = if let Some(failed) = true_condition(conditions, "Failed") {
            Some((
                Outcome::Failed(failed.reason.as_deref().map(bounded_text)),
                failed.last_transition_time.as_ref().map(unix_ms),
            ))
        } else {
            true_condition(conditions, "Complete").map(|complete| {
                let at = job
                    .status
                    .as_ref()
                    .and_then(|s| s.completion_time.as_ref())
                    .or(complete.last_transition_time.as_ref())
                    .map(unix_ms);
                (Outcome::Succeeded, at)
            })
        };
        let annotation = |key: &str| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(String::as_str)
                .map(bounded_text)
        };
        let facts = JobFacts {
            uid: meta.uid.clone().unwrap_or_default(),
            owner: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_OWNER))
                .map(String::as_str)
                .map(bounded_text)
                .unwrap_or_default(),
            created_unix_ms: meta.creation_timestamp.as_ref().map_or(0, unix_ms),
            finished,
            replaces: annotation(ANNOTATION_REPLACES),
            template: annotation(ANNOTATION_TEMPLATE),
        };
        Some((key, facts))
    }
}

/// A pod's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// Not running yet (or unknown).
    Pending,
    /// Running.
    Running,
    /// Ended successfully.
    Succeeded,
    /// Ended in failure.
    Failed,
}

/// What the agent keeps of one pod of a managed Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// The uid of the Job that controls the pod.
    pub job_uid: String,
    /// Its phase.
    pub phase: PodPhase,
    /// Its condition types that are `True`, sorted, at most [`MAX_POD_CONDITION_TYPES`].
    pub true_conditions: Vec<String>,
    /// Why it does not run: the scheduler's reason when `PodScheduled` is `False`, else the
    /// first waiting container's reason.
    pub waiting_reason: Option<String>,
}

impl PodFacts {
    /// The controlling Job's key, the pod's name and its facts; `None` for a pod that no
    /// Job controls.
    pub fn of(pod: &PodLite) -> Option<(JobRef, String, PodFacts)> {
        let meta = &pod.metadata;
        let owner = meta.owner_references.as_ref()?.iter().find(|o| {
            o.kind == "Job" && o.api_version.starts_with("batch/") && o.controller == Some(true)
        })?;
        let job = JobRef {
            namespace: bounded_text(meta.namespace.as_deref()?),
            name: bounded_text(&owner.name),
        };
        let status = pod.status.clone().unwrap_or_default();
        let phase = match status.phase.as_deref() {
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            _ => PodPhase::Pending,
        };
        let conditions = status.conditions.unwrap_or_default();
        let mut true_conditions: Vec<String> = conditions
            .iter()
            .filter(|c| c.status == "True")
            .map(|c| bounded_text(&c.type_))
            .collect();
        true_conditions.sort();
        true_conditions.truncate(MAX_POD_CONDITION_TYPES);
        let unscheduled = conditions
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| c.reason.as_deref().unwrap_or("NotScheduled"));
        let waiting = status
            .init_container_statuses
            .iter()
            .chain(status.container_statuses.iter())
            .flatten()
            .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref());
        let facts = PodFacts {
            job_uid: owner.uid.clone(),
            phase,
            true_conditions,
            waiting_reason: unscheduled.or(waiting).map(bounded_text),
        };
        Some((job, bounded_text(meta.name.as_deref()?), facts))
    }
}

/// The reported status of Job `key` from its facts and the facts of its pods (pods of an
/// older Job of the same name are ignored).
pub fn status_of<'a>(
    key: &JobRef,
    job: &JobFacts,
    pods: impl IntoIterator<Item = &'a PodFacts>,
) -> JobStatus {
    let pods: Vec<&PodFacts> = pods.into_iter().filter(|p| p.job_uid == job.uid).collect();
    let any_pod_running_or_completed = pods
        .iter()
        .any(|p| matches!(p.phase, PodPhase::Running | PodPhase::Succeeded));
    let (phase, failure_reason, finished_unix_ms) = match &job.finished {
        Some((Outcome::Succeeded, at)) => (JobPhase::Succeeded, None, *at),
        Some((Outcome::Failed(reason), at)) => (JobPhase::Failed, reason.clone(), *at),
        None if any_pod_running_or_completed => (JobPhase::Running, None, None),
        None => (JobPhase::Pending, None, None),
    };
    let pending_reason = if phase == JobPhase::Pending {
        pods.iter()
            .filter(|p| p.phase == PodPhase::Pending)
            .find_map(|p| p.waiting_reason.clone())
    } else {
        None
    };
    let mut sets: BTreeMap<&[String], u32> = BTreeMap::new();
    for pod in &pods {
        *sets.entry(pod.true_conditions.as_slice()).or_default() += 1;
    }
    let mut true_pod_conditions: Vec<PodConditionSet> = sets
        .into_iter()
        .map(|(conditions, pods)| PodConditionSet {
            true_conditions: conditions.to_vec(),
            pods,
        })
        .collect();
    if true_pod_conditions.len() > MAX_POD_CONDITION_SETS {
        // Keep the sets with the most conditions: those decide whether a pod has them all.
        true_pod_conditions.sort_by(|a, b| {
            b.true_conditions
                .len()
                .cmp(&a.true_conditions.len())
                .then_with(|| a.cmp(b))
        });
        true_pod_conditions.truncate(MAX_POD_CONDITION_SETS);
        true_pod_conditions.sort();
    }
    JobStatus {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        owner: job.owner.clone(),
        phase,
        created_unix_ms: job.created_unix_ms,
        any_pod_running_or_completed,
        true_pod_conditions,
        pending_reason,
        failure_reason,
        finished_unix_ms,
        replaces: job.replaces.clone(),
        template: job.template.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const UID: &str = "job-uid";

    fn job(status: Value) -> (JobRef, JobFacts) {
        let job: JobLite = serde_json::from_value(json!({
            "metadata": {"name": "work-1", "namespace": "apps", "uid": UID,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"kedge.dev/owner": "apps/work", "kedge.dev/replaces": "work-0",
                    "kedge.dev/template": "0123456789abcdef"}},
            "status": status,
        }))
        .unwrap();
        JobFacts::of(&job).unwrap()
    }

    fn pod(name: &str, uid: &str, status: Value) -> PodFacts {
        let pod: PodLite = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "apps", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "work-1", "uid": uid,
                 "controller": true}]},
            "status": status,
        }))
        .unwrap();
        let (key, pod_name, facts) = PodFacts::of(&pod).unwrap();
        assert_eq!((key.name.as_str(), pod_name.as_str()), ("work-1", name));
        facts
    }

    fn cond(t: &str, status: &str, reason: Option<&str>) -> Value {
        json!({"type": t, "status": status, "reason": reason,
            "lastTransitionTime": "2026-01-01T00:01:00Z"})
    }

    fn waiting(reason: &str) -> Value {
        json!([{"name": "c", "state": {"waiting": {"reason": reason}}}])
    }

    /// A pod by name, owning Job uid and status.
    type Pod = (&'static str, &'static str, Value);
    /// Phase, a pod running or done, pending reason, failure reason, finished.
    type Expected = (
        JobPhase,
        bool,
        Option<&'static str>,
        Option<&'static str>,
        Option<i64>,
    );

    const T0: i64 = 1_767_225_600_000;
    const T1: i64 = T0 + 60_000;

    /// KEDA's default pending rule over pod phases, the Job's own end conditions, and the
    /// reason a pending Job's pods do not run.
    #[test]
    fn phases_follow_the_job_conditions_and_its_pods() {
        use JobPhase::*;
        let unschedulable = json!({"phase": "Pending", "conditions": [
            cond("PodScheduled", "False", Some("Unschedulable"))]});
        let image = json!({"phase": "Pending", "conditions": [cond("PodScheduled", "True", None)],
            "containerStatuses": waiting("ImagePullBackOff")});
        let init = json!({"phase": "Pending", "conditions": [cond("PodScheduled", "True", None)],
            "initContainerStatuses": waiting("PodInitializing"),
            "containerStatuses": waiting("ContainerCreating")});
        let running = json!({"phase": "Running", "conditions": [cond("Ready", "True", None)]});
        let succeeded = json!({"phase": "Succeeded"});
        let failed = json!({"phase": "Failed"});
        let unknown = json!({"phase": "Unknown"});
        let complete = json!({"conditions": [cond("Complete", "True", Some("CompletionsReached"))],
            "completionTime": "2026-01-01T00:02:00Z"});
        let complete_without_time =
            json!({"conditions": [cond("Complete", "True", Some("CompletionsReached"))]});
        let job_failed = json!({"conditions": [
            cond("FailureTarget", "True", Some("BackoffLimitExceeded")),
            cond("Failed", "True", Some("BackoffLimitExceeded"))]});
        let not_complete = json!({"conditions": [cond("Complete", "False", None)]});
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Vec<Pod>, Expected)> = vec![
            ("no pod yet", json!({}), vec![], (Pending, false, None, None, None)),
            ("unschedulable pod", json!({}), vec![("p", UID, unschedulable.clone())], (Pending, false, Some("Unschedulable"), None, None)),
            ("image pull back-off", json!({}), vec![("p", UID, image)], (Pending, false, Some("ImagePullBackOff"), None, None)),
            ("init containers first", json!({}), vec![("p", UID, init)], (Pending, false, Some("PodInitializing"), None, None)),
            ("running pod", json!({}), vec![("p", UID, running.clone())], (Running, true, None, None, None)),
            ("succeeded pod, Job not complete yet", json!({}), vec![("p", UID, succeeded.clone())], (Running, true, None, None, None)),
            ("failed pod", json!({}), vec![("p", UID, failed.clone())], (Pending, false, None, None, None)),
            ("unknown pod", json!({}), vec![("p", UID, unknown)], (Pending, false, None, None, None)),
            ("failed pod and a retry not scheduled", json!({}), vec![("a", UID, failed), ("b", UID, unschedulable.clone())], (Pending, false, Some("Unschedulable"), None, None)),
            ("one of two pods running", json!({}), vec![("a", UID, unschedulable.clone()), ("b", UID, running.clone())], (Running, true, None, None, None)),
            ("pods of an older Job of the same name", json!({}), vec![("p", "old-uid", running)], (Pending, false, None, None, None)),
            ("complete", complete, vec![("p", UID, succeeded.clone())], (Succeeded, true, None, None, Some(T1 + 60_000))),
            ("complete without completionTime", complete_without_time, vec![], (Succeeded, false, None, None, Some(T1))),
            ("failed", job_failed, vec![("p", UID, unschedulable)], (Failed, false, None, Some("BackoffLimitExceeded"), Some(T1))),
            ("a False Complete condition", not_complete, vec![("p", UID, succeeded)], (Running, true, None, None, None)),
        ];
        for (what, status, pods, (phase, running, pending, failure, finished)) in cases {
            let (key, facts) = job(status);
            let pods: Vec<PodFacts> = pods.into_iter().map(|(n, u, s)| pod(n, u, s)).collect();
            let status = status_of(&key, &facts, &pods);
            assert_eq!(status.phase, phase, "{what}");
            assert_eq!(status.any_pod_running_or_completed, running, "{what}");
            assert_eq!(status.pending_reason.as_deref(), pending, "{what}");
            assert_eq!(status.failure_reason.as_deref(), failure, "{what}");
            assert_eq!(status.finished_unix_ms, finished, "{what}");
            assert_eq!(
                (status.created_unix_ms, status.owner.as_str()),
                (T0, "apps/work"),
                "{what}"
            );
        }
    }

    #[test]
    fn a_failover_job_reports_what_it_replaces() {
        let (key, facts) = job(json!({}));
        let status = status_of(&key, &facts, []);
        assert_eq!(status.replaces.as_deref(), Some("work-0"));
        assert_eq!(status.template.as_deref(), Some("0123456789abcdef"));
        assert_eq!(status.owner, "apps/work");
    }

    #[test]
    fn pods_are_grouped_by_their_true_conditions() {
        let (key, facts) = job(json!({}));
        let ready = json!({"phase": "Running", "conditions": [
            cond("Ready", "True", None), cond("PodScheduled", "True", None),
            cond("Initialized", "True", None), cond("ContainersReady", "False", None)]});
        let scheduled = json!({"phase": "Pending", "conditions": [
            cond("PodScheduled", "True", None), cond("Ready", "False", None)]});
        let pods = [
            pod("a", UID, ready.clone()),
            pod("b", UID, scheduled),
            pod("c", UID, ready),
        ];
        let status = status_of(&key, &facts, &pods);
        let sets: Vec<(Vec<&str>, u32)> = status
            .true_pod_conditions
            .iter()
            .map(|s| {
                (
                    s.true_conditions.iter().map(String::as_str).collect(),
                    s.pods,
                )
            })
            .collect();
        assert_eq!(
            sets,
            vec![
                (vec!["Initialized", "PodScheduled", "Ready"], 2),
                (vec!["PodScheduled"], 1),
            ]
        );
    }

    #[test]
    fn strings_from_the_cluster_are_bounded() {
        let long = "R".repeat(10_000);
        let (key, facts) = job(json!({"conditions": [cond("Failed", "True", Some(&long))]}));
        let many: Vec<Value> = (0..100)
            .map(|i| cond(&format!("{i:03}{long}"), "True", None))
            .collect();
        let mut pods: Vec<PodFacts> = (0..40)
            .map(|i| {
                let mut conditions = many.clone();
                conditions.truncate(i + 1);
                pod(
                    &format!("p{i}"),
                    UID,
                    json!({"phase": "Pending", "conditions": conditions}),
                )
            })
            .collect();
        pods.push(pod(
            "w",
            UID,
            json!({"phase": "Pending", "containerStatuses": waiting(&long)}),
        ));
        let status = status_of(&key, &facts, &pods);
        assert!(status.failure_reason.as_ref().unwrap().len() <= kedge_protocol::MAX_TEXT_BYTES);
        assert_eq!(status.true_pod_conditions.len(), MAX_POD_CONDITION_SETS);
        for set in &status.true_pod_conditions {
            assert!(set.true_conditions.len() <= MAX_POD_CONDITION_TYPES);
            assert!(
                set.true_conditions
                    .iter()
                    .all(|c| c.len() <= kedge_protocol::MAX_TEXT_BYTES)
            );
        }
        let encoded = kedge_protocol::encode(&status).unwrap();
        assert!(encoded.len() < 128 * 1024, "{}", encoded.len());
    }
}
