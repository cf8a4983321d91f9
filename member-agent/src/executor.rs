//! Applies the hub's desired state through the member's own API server: replica counts via
//! the `/scale` subresource of the allowed kinds, Jobs by deterministic name. Refuses
//! anything outside the namespaces and kinds the agent was configured with ([`Policy`]), any
//! Job kedge did not create and any Job manifest that is not a `batch/v1` Job, so that a
//! compromised hub cannot take over a member.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::batch::v1::Job;
use kedge_protocol::{
    Ack, CommandResult, CommandTarget, DesiredState, Failure, FailureCode, JobCreate, JobDelete,
    Propagation, Retry, WorkloadRef, WorkloadReplicas,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::core::GroupVersionKind;
use kube::{Client, discovery};
use serde_json::json;
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::jobs::JobOwner;
use crate::policy::Policy;

/// Field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "kedge-agent";

/// Classifies a Kubernetes API error as transient or permanent.
pub fn classify(error: &kube::Error, what: &str) -> Failure {
    let (retry, code) = match error {
        kube::Error::Api(status) => match status.code {
            404 => (Retry::Permanent, FailureCode::NotFound),
            401 | 403 => (Retry::Permanent, FailureCode::Forbidden),
            409 => (Retry::Transient, FailureCode::Conflict),
            400 | 422 => (Retry::Permanent, FailureCode::Invalid),
            408 | 429 | 500..=599 => (Retry::Transient, FailureCode::ApiUnavailable),
            _ => (Retry::Transient, FailureCode::Other),
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            (Retry::Transient, FailureCode::ApiUnavailable)
        }
        _ => (Retry::Transient, FailureCode::Other),
    };
    let detail = match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    };
    Failure {
        retry,
        code,
        message: format!("{what}: {detail}"),
    }
}

fn invalid(message: String) -> Failure {
    Failure {
        retry: Retry::Permanent,
        code: FailureCode::Invalid,
        message,
    }
}

/// Whether a failure is the agent's own refusal (policy or ownership), not an API error.
fn refused(failure: &Failure) -> bool {
    matches!(
        failure.code,
        FailureCode::NamespaceNotAllowed | FailureCode::KindNotAllowed | FailureCode::NotOwned
    )
}

/// Decodes a JobCreate's manifest, refusing anything but a `batch/v1` Job: an `apiVersion`
/// or `kind` other than those (when given) is `KindNotAllowed`, so a compromised hub cannot
/// smuggle another kind through the Job path; JSON that does not decode as a Job is
/// `Invalid`.
fn job_manifest(name: &str, manifest_json: &[u8]) -> Result<Job, Failure> {
    let value: serde_json::Value = serde_json::from_slice(manifest_json)
        .map_err(|e| invalid(format!("Job {name} manifest is not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(invalid(format!("Job {name} manifest is not a JSON object")));
    };
    let field = |key: &str| {
        object
            .get(key)
            .map(|v| v.as_str().unwrap_or("(not a string)"))
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version.is_some_and(|v| v != "batch/v1") || kind.is_some_and(|k| k != "Job") {
        return Err(Failure {
            retry: Retry::Permanent,
            code: FailureCode::KindNotAllowed,
            message: format!(
                "Job {name} manifest is a {}/{}, not a batch/v1 Job; the agent creates only Jobs",
                api_version.unwrap_or("batch/v1"),
                kind.unwrap_or("Job")
            ),
        });
    }
    serde_json::from_value(value)
        .map_err(|e| invalid(format!("Job {name} manifest is not a batch/v1 Job: {e}")))
}

/// Splits `group/version` (or `version` for the core group).
fn group_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// Applies desired state in one member cluster.
pub struct Executor {
    client: Client,
    policy: Policy,
    kinds: Mutex<HashMap<(String, String), ApiResource>>,
    last_applied: AtomicU64,
    /// The replica command of each workload as last applied. Its lock makes one writer of
    /// replica counts: an apply holds it while it scales, a restore while it looks and
    /// scales, so a restore never takes the agent's own apply for an edit nor writes a
    /// count the hub has replaced.
    replicas: Mutex<BTreeMap<WorkloadRef, WorkloadReplicas>>,
}

/// The replica commands as last applied, held by the one writer of replica counts.
pub(crate) type AppliedReplicas<'a> =
    tokio::sync::MutexGuard<'a, BTreeMap<WorkloadRef, WorkloadReplicas>>;

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor acting through `client` within `policy`.
    pub fn new(client: Client, policy: Policy) -> Self {
        Self {
            client,
            policy,
            kinds: Mutex::new(HashMap::new()),
            last_applied: AtomicU64::new(0),
            replicas: Mutex::new(BTreeMap::new()),
        }
    }

    /// The highest revision applied so far (0 before the first).
    pub fn last_applied_revision(&self) -> u64 {
        self.last_applied.load(Ordering::Acquire)
    }

    /// What the agent may touch.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The replica commands as last applied, once no one else writes replica counts; the
    /// holder is the one writer until it drops the guard (see [`Executor::scale`]).
    pub(crate) async fn applied_replicas(&self) -> AppliedReplicas<'_> {
        self.replicas.lock().await
    }

    /// Applies every command of `state` and reports each outcome.
    pub async fn apply(&self, state: &DesiredState) -> Ack {
        let mut results = Vec::new();
        {
            let mut applied = self.applied_replicas().await;
            for workload in &state.workloads {
                let failure = self.scale(&applied, workload).await.err();
                results.push(CommandResult {
                    target: CommandTarget::Workload(workload.workload.clone()),
                    failure,
                });
            }
            *applied = state
                .workloads
                .iter()
                .map(|w| (w.workload.clone(), w.clone()))
                .collect();
        }
        for job in &state.create_jobs {
            let failure = self.create_job(job).await.err();
            results.push(CommandResult {
                target: CommandTarget::Job(format!("{}/{}", job.namespace, job.name)),
                failure,
            });
        }
        for job in &state.delete_jobs {
            let failure = self.delete_job(job).await.err();
            results.push(CommandResult {
                target: CommandTarget::Job(format!("{}/{}", job.namespace, job.name)),
                failure,
            });
        }
        for result in &results {
            match &result.failure {
                Some(failure) if refused(failure) => {
                    warn!(target = ?result.target, code = ?failure.code,
                        reason = %failure.message, "command refused by the agent's policy");
                }
                Some(failure) => {
                    warn!(target = ?result.target, code = ?failure.code, retry = ?failure.retry,
                        message = %failure.message, "command failed");
                }
                None => {}
            }
        }
        self.last_applied
            .fetch_max(state.revision, Ordering::AcqRel);
        Ack {
            revision: state.revision,
            results,
        }
    }

    /// The resource of a workload's kind, after checking the policy allows the workload's
    /// namespace and kind, and that the kind has a `/scale` subresource (discovery, once per
    /// kind).
    pub async fn workload_resource(&self, workload: &WorkloadRef) -> Result<ApiResource, Failure> {
        self.policy
            .check_workload(&workload.namespace, &workload.api_version, &workload.kind)?;
        let key = (workload.api_version.clone(), workload.kind.clone());
        let mut kinds = self.kinds.lock().await;
        if let Some(resource) = kinds.get(&key) {
            return Ok(resource.clone());
        }
        let (group, version) = group_version(&workload.api_version);
        let gvk = GroupVersionKind::gvk(group, version, &workload.kind);
        let what = format!("resolving {}/{}", workload.api_version, workload.kind);
        let (resource, caps) = discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                // Discovery reports an unknown kind as its own error, not a 404.
                match e {
                    kube::Error::Discovery(_) => Failure {
                        retry: Retry::Permanent,
                        code: FailureCode::NotFound,
                        message: format!("{what}: the member cluster does not serve this kind"),
                    },
                    other => classify(&other, &what),
                }
            })?;
        if !caps
            .subresources
            .iter()
            .any(|(sub, _)| sub.plural == "scale")
        {
            return Err(invalid(format!(
                "{}/{} has no /scale subresource; kedge can only scale kinds that do",
                workload.api_version, workload.kind
            )));
        }
        kinds.insert(key, resource.clone());
        Ok(resource)
    }

    /// The dynamic API of a workload's kind (see [`Executor::workload_resource`]).
    pub async fn workload_api(
        &self,
        workload: &WorkloadRef,
    ) -> Result<Api<DynamicObject>, Failure> {
        let resource = self.workload_resource(workload).await?;
        Ok(Api::namespaced_with(
            self.client.clone(),
            &workload.namespace,
            &resource,
        ))
    }

    /// A workload's replicas as its `/scale` says now; `None` when it does not exist. For
    /// the one writer, which must not compare a command with a count a watch has not caught
    /// up with yet.
    pub(crate) async fn current_replicas(
        &self,
        _writer: &AppliedReplicas<'_>,
        w: &WorkloadRef,
    ) -> Result<Option<i32>, Failure> {
        let api = self.workload_api(w).await?;
        let what = format!("reading the scale of {} {}/{}", w.kind, w.namespace, w.name);
        match api.get_scale(&w.name).await {
            Ok(scale) => Ok(Some(scale.spec.and_then(|s| s.replicas).unwrap_or(0))),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(classify(&e, &what)),
        }
    }

    /// Sets a workload's replicas through `/scale`, unless it already has them. A command
    /// without a count holds the workload: only the namespace policy and the kind are
    /// checked, nothing is written.
    /// Only the holder of [`Executor::applied_replicas`] scales (one writer).
    pub(crate) async fn scale(
        &self,
        _writer: &AppliedReplicas<'_>,
        command: &WorkloadReplicas,
    ) -> Result<bool, Failure> {
        let w = &command.workload;
        let Some(replicas) = command.replicas else {
            self.workload_api(w).await?;
            return Ok(false);
        };
        if replicas < 0 {
            return Err(invalid(format!(
                "negative replica count {replicas} for {}",
                w.name
            )));
        }
        let api = self.workload_api(w).await?;
        let what = format!("{} {}/{}", w.kind, w.namespace, w.name);
        let scale = api
            .get_scale(&w.name)
            .await
            .map_err(|e| classify(&e, &what))?;
        if scale.spec.as_ref().and_then(|s| s.replicas) == Some(replicas) {
            return Ok(false);
        }
        let patch = Patch::Merge(json!({ "spec": { "replicas": replicas } }));
        api.patch_scale(
            &w.name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &patch,
        )
        .await
        .map_err(|e| classify(&e, &what))?;
        info!(workload = %what, replicas, owner = %command.owner, "scaled");
        Ok(true)
    }

    /// Creates a Job stamped with kedge's ownership label and annotation. A Job of that name
    /// that already exists is fine when it is this owner's (a re-sent create), and refused
    /// as `NotOwned` otherwise: it is neither adopted nor changed.
    async fn create_job(&self, command: &JobCreate) -> Result<(), Failure> {
        self.policy.namespaces.check(&command.namespace)?;
        let owner = JobOwner::parse(&command.owner)?;
        let mut job = job_manifest(&command.name, &command.manifest_json)?;
        if job
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n != command.name)
        {
            return Err(invalid(format!(
                "Job manifest names {:?}, command names {:?}",
                job.metadata.name, command.name
            )));
        }
        if job
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|n| n != command.namespace)
        {
            return Err(invalid(format!(
                "Job manifest is for namespace {:?}, command for {:?}",
                job.metadata.namespace, command.namespace
            )));
        }
        job.metadata.name = Some(command.name.clone());
        job.metadata.namespace = Some(command.namespace.clone());
        owner.stamp(&mut job);
        let api: Api<Job> = Api::namespaced(self.client.clone(), &command.namespace);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let what = format!("creating Job {}/{}", command.namespace, command.name);
        match api.create(&params, &job).await {
            Ok(_) => {
                info!(job = %command.name, namespace = %command.namespace, owner = %owner, "Job created");
                Ok(())
            }
            // Deterministic names make a re-sent create harmless, if the Job is ours.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match api
                    .get_opt(&command.name)
                    .await
                    .map_err(|e| classify(&e, &what))?
                {
                    Some(existing) => owner.check(&existing.metadata),
                    // Deleted in between: the next desired state creates it again.
                    None => Err(Failure {
                        retry: Retry::Transient,
                        code: FailureCode::Conflict,
                        message: format!("{what}: it existed, then was deleted"),
                    }),
                }
            }
            Err(e) => Err(classify(&e, &what)),
        }
    }

    /// Deletes a Job, only if kedge created it for this owner: a missing Job is already
    /// deleted, a Job without the ownership label or with another owner is refused as
    /// `NotOwned` and left alone.
    async fn delete_job(&self, command: &JobDelete) -> Result<(), Failure> {
        self.policy.namespaces.check(&command.namespace)?;
        let owner = JobOwner::parse(&command.owner)?;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &command.namespace);
        let what = format!("deleting Job {}/{}", command.namespace, command.name);
        let Some(job) = api
            .get_opt(&command.name)
            .await
            .map_err(|e| classify(&e, &what))?
        else {
            return Ok(());
        };
        owner.check(&job.metadata)?;
        // Only the Job checked: one replaced in between is checked again on the next try.
        let params = DeleteParams {
            propagation_policy: Some(match command.propagation {
                Propagation::Background => PropagationPolicy::Background,
                Propagation::Foreground => PropagationPolicy::Foreground,
            }),
            preconditions: Some(Preconditions {
                uid: job.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&command.name, &params).await {
            Ok(_) => {
                info!(job = %command.name, namespace = %command.namespace, owner = %owner, "Job deleted");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(classify(&e, &what)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_manifests_must_be_batch_v1_jobs() {
        let manifest = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();
        let spec = json!({"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}});
        for ok in [
            json!({"spec": spec}),
            json!({"apiVersion": "batch/v1", "kind": "Job", "spec": spec}),
        ] {
            assert!(job_manifest("j", &manifest(ok.clone())).is_ok(), "{ok}");
        }
        for (bad, code, says) in [
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": spec}),
                FailureCode::KindNotAllowed,
                "is a apps/v1/Deployment, not a batch/v1 Job",
            ),
            (
                json!({"kind": "Pod", "spec": spec}),
                FailureCode::KindNotAllowed,
                "is a batch/v1/Pod",
            ),
            (
                json!({"apiVersion": "batch/v2", "kind": "Job"}),
                FailureCode::KindNotAllowed,
                "not a batch/v1 Job",
            ),
            (
                json!({"apiVersion": 1, "kind": "Job"}),
                FailureCode::KindNotAllowed,
                "(not a string)",
            ),
            (json!([1, 2]), FailureCode::Invalid, "not a JSON object"),
            (
                json!({"spec": {"template": 3}}),
                FailureCode::Invalid,
                "not a batch/v1 Job",
            ),
        ] {
            let failure = job_manifest("j", &manifest(bad.clone())).unwrap_err();
            assert_eq!(
                (failure.retry, failure.code),
                (Retry::Permanent, code),
                "{bad}"
            );
            assert!(failure.message.contains(says), "{bad}: {}", failure.message);
        }
        let failure = job_manifest("j", b"{not json").unwrap_err();
        assert_eq!(failure.code, FailureCode::Invalid);
    }

    #[test]
    fn api_errors_are_classified() {
        let api = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "m".into(),
                ..kube::core::Status::default()
            }))
        };
        let cases = [
            (404, Retry::Permanent, FailureCode::NotFound),
            (403, Retry::Permanent, FailureCode::Forbidden),
            (409, Retry::Transient, FailureCode::Conflict),
            (422, Retry::Permanent, FailureCode::Invalid),
            (503, Retry::Transient, FailureCode::ApiUnavailable),
            (429, Retry::Transient, FailureCode::ApiUnavailable),
        ];
        for (code, retry, class) in cases {
            let f = classify(&api(code), "scaling x");
            assert_eq!((f.retry, f.code), (retry, class), "{code}");
            assert_eq!(f.message, "scaling x: m");
        }
    }

    #[test]
    fn api_versions_split_into_group_and_version() {
        assert_eq!(group_version("apps/v1"), ("apps", "v1"));
        assert_eq!(group_version("v1"), ("", "v1"));
        assert_eq!(group_version("keda.sh/v1alpha1"), ("keda.sh", "v1alpha1"));
    }
}
