//! The DistributedScaledJob controller: I/O around `kedge_core::dsj::step`. Each polling
//! interval it reads the triggers through the shadow KEDA ScaledObject (whose target is the
//! DSJ's own `/scale`; the hub never runs a ScaledJob, which would create Jobs in the hub
//! cluster), the Jobs every member reports, and the state the previous poll left in status;
//! calls `step` and `cleanup` (the same functions `kubectl kedge simulate` runs); and writes
//! what they decided: Job creates and deletes into the [`Fleet`](crate::fleet::Fleet),
//! Events, status.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kedge_core::crd::conditions::{ANNOTATION_REPLACES, ANNOTATION_TEMPLATE};
use kedge_core::crd::conditions::{
    CONDITION_DEGRADED, CONDITION_PAUSED, CONDITION_READY, LABEL_DSJ, REASON_PAUSED_BY_ANNOTATION,
    REASON_RECONCILED, condition,
};
use kedge_core::crd::dsj::{DsjMemberClusterStatus, TriggerMetricStatus};
use kedge_core::crd::keda::trigger_key;
use kedge_core::crd::{
    DistributedScaledJob, DistributedScaledJobStatus, GROUP, VERSION, bound_member_statuses,
};
use kedge_core::dsj::duplication::JobPhase as Phase;
use kedge_core::dsj::metrics::{Reading, TriggerState, usable};
use kedge_core::dsj::pending::is_pending;
use kedge_core::dsj::persist::saved_taints;
use kedge_core::dsj::render::{JobOf, job, job_name, template_hash};
use kedge_core::dsj::step::{
    Cleanup, DsjMember, DsjState, JobView, StepInput, cleanup, create_failed, rollout, step,
    taint_level,
};
use kedge_core::dsj::taint::{Taint, TaintLevel, TaintPolicy, TaintScope};
use kedge_core::dso::MemberState;
use kedge_core::time::{from_unix_ms, to_time};
use kedge_core::validate;
use kedge_protocol::{JobCreate, JobDelete, JobPhase, JobStatus, Propagation};
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::Context;
use super::external_metrics::{Source, read};
use crate::fleet::JobCommands;
use crate::registry::SessionState;
use crate::{Error, Result};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "distributedscaledjob";

/// What the DSJ controller remembers in this process: when each Job create was first sent
/// (a Job no member has reported yet counts as pending since then, so it can become stuck
/// like any other), and when each DSJ was last polled with which spec and annotations (a
/// status write or a shadow ScaledObject update does not make an extra poll).
#[derive(Debug, Default)]
pub struct Sent {
    sent: Mutex<HashMap<String, SystemTime>>,
    polls: Mutex<HashMap<String, (SystemTime, u64)>>,
    /// The status this process wrote last, by owner: the next poll starts from it rather
    /// than from a watch cache that may not have seen the write yet (which would reuse Job
    /// indexes and forget taints).
    written: Mutex<HashMap<String, DistributedScaledJobStatus>>,
}

impl Sent {
    fn written(&self, owner: &str) -> Option<DistributedScaledJobStatus> {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
            .cloned()
    }

    fn remember(&self, owner: &str, status: &DistributedScaledJobStatus) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.to_owned(), status.clone());
    }

    fn since(&self, name: &str, now: SystemTime) -> SystemTime {
        *self
            .sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_owned())
            .or_insert(now)
    }

    /// Forgets when `owner` was last polled, so that its next reconcile polls.
    fn not_polled(&self, owner: &str) {
        self.polls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner);
    }

    fn forget_except(&self, keep: &BTreeSet<String>) {
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|name, _| keep.contains(name));
    }

    /// `None` when `owner` is due for a poll (recorded as polled now), else how long until
    /// it is. A changed `version` (generation and annotations) is always due.
    fn due(
        &self,
        owner: &str,
        version: u64,
        interval: Duration,
        now: SystemTime,
    ) -> Option<Duration> {
        let mut polls = self.polls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, seen)) = polls.get(owner)
            && *seen == version
        {
            let next = kedge_core::time::saturating_add(*at, interval);
            if let Ok(wait) = next.duration_since(now)
                && !wait.is_zero()
            {
                return Some(wait);
            }
        }
        polls.insert(owner.to_owned(), (now, version));
        None
    }
}

/// The shadow KEDA ScaledObject of a DSJ: the DSJ's triggers, targeting the DSJ's own
/// `/scale`, so KEDA's metrics server exposes the trigger values.
pub fn shadow_scaled_object(
    dsj: &DistributedScaledJob,
    namespace: &str,
    name: &str,
) -> Result<Value> {
    let sj = &dsj.spec.scaled_job_spec;
    let owner = dsj.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "DistributedScaledJob",
        field: "metadata.uid",
    })?;
    let triggers = serde_json::to_value(&sj.triggers).map_err(|source| Error::Serialize {
        what: "scaledJobSpec.triggers",
        source,
    })?;
    Ok(json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_DSJ: name},
            "ownerReferences": [owner],
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "kind": "DistributedScaledJob",
                "name": name,
            },
            "pollingInterval": sj.polling_interval.unwrap_or(30),
            "minReplicaCount": 0,
            "maxReplicaCount": sj.max_replicas().max(1),
            "triggers": triggers,
        },
    }))
}

/// Finalizer that has the Jobs of a deleted DSJ deleted in every member.
pub const FINALIZER: &str = "kedge.dev/distributedscaledjob";

fn ns_name(dsj: &DistributedScaledJob) -> Result<(String, String)> {
    super::ns_name(dsj, "DistributedScaledJob")
}

/// Reconciles one DSJ.
#[instrument(skip(ctx, obj), fields(dsj = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DistributedScaledJob>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    let (namespace, _) = ns_name(&obj)?;
    let api: Api<DistributedScaledJob> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(dsj) => apply(dsj, &ctx).await,
            Finalizer::Cleanup(dsj) => delete_jobs_of(&dsj, &ctx),
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// A deleted DSJ: every member whose agent has reported its Jobs is told to delete this
/// DSJ's Jobs (and to create none); the hub keeps sending those deletes until each member
/// reports them gone, after the DSJ itself is gone. A member not connected now keeps its
/// Jobs (they run to completion).
fn delete_jobs_of(dsj: &DistributedScaledJob, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(dsj)?;
    let owner = format!("{namespace}/{name}");
    for member in ctx.fleet.members() {
        let Some(session) = member
            .session
            .as_ref()
            .filter(|s| s.state == SessionState::Connected)
        else {
            continue;
        };
        let jobs = ctx.fleet.jobs_of(&member.name, &owner);
        let deletes = jobs
            .jobs
            .iter()
            .map(|j| JobDelete {
                namespace: j.namespace.clone(),
                name: j.name.clone(),
                owner: owner.clone(),
                propagation: Propagation::Background,
            })
            .collect();
        ctx.fleet.set_jobs(
            &member.name,
            &session.session_id,
            &owner,
            JobCommands {
                creates: Vec::new(),
                deletes,
            },
        );
    }
    // The shadow ScaledObject goes with the DSJ through its ownerReference.
    Ok(Action::await_change())
}

async fn apply(obj: Arc<DistributedScaledJob>, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(&obj)?;
    let owner = format!("{namespace}/{name}");
    let observed = obj.status.clone().unwrap_or_default();
    let previous = ctx
        .dsj_sent
        .written(&owner)
        .unwrap_or_else(|| observed.clone());
    let now = SystemTime::now();
    let generation = obj.metadata.generation;
    let settings = match validate::dsj(&obj.spec, obj.annotations()) {
        Ok(s) => s,
        Err(e) => {
            let message = e.to_string();
            let mut status = previous.clone();
            status.conditions = vec![condition(
                &previous.conditions,
                CONDITION_READY,
                false,
                "InvalidSpec",
                message.clone(),
                generation,
                now,
            )];
            if status != previous {
                ctx.publish(
                    &*obj,
                    EventType::Warning,
                    "InvalidSpec",
                    "Validate",
                    message,
                )
                .await;
                write_status(ctx, &namespace, &name, &status).await?;
            }
            return Ok(Action::await_change());
        }
    };
    let polling = Duration::from_secs(
        u64::try_from(obj.spec.scaled_job_spec.polling_interval.unwrap_or(30)).unwrap_or(30),
    );
    let version = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (generation, obj.annotations()).hash(&mut h);
        h.finish()
    };
    if let Some(wait) = ctx.dsj_sent.due(&owner, version, polling, now) {
        return Ok(Action::requeue(wait));
    }

    // The triggers, through the shadow ScaledObject.
    let so = shadow_scaled_object(&obj, &namespace, &name)?;
    let sos: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.scaled_objects);
    let mut readings: BTreeMap<String, Reading> = BTreeMap::new();
    match super::bounded(
        "apply shadow ScaledObject",
        sos.patch(
            &name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&so),
        ),
    )
    .await
    {
        Ok(applied) => {
            let names: Vec<String> = applied.data["status"]["externalMetricNames"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let keys: Vec<String> = obj
                .spec
                .scaled_job_spec
                .triggers
                .iter()
                .map(|t| trigger_key(t).to_owned())
                .collect();
            let source = Source {
                namespace: &namespace,
                scaled_object: &name,
                metric_names: &names,
            };
            readings = read(
                &ctx.client,
                &source,
                &obj.spec.scaled_job_spec.triggers,
                &keys,
            )
            .await;
        }
        Err(e) => {
            for key in &settings.triggers {
                readings.insert(
                    key.clone(),
                    Reading::Failed(format!("applying the shadow KEDA ScaledObject: {e}")),
                );
            }
        }
    }
    let metrics = usable(&readings);

    // Members and their Jobs.
    let snapshots: BTreeMap<String, crate::fleet::MemberSnapshot> = ctx
        .fleet
        .members()
        .into_iter()
        .map(|m| (m.name.clone(), m))
        .collect();
    let names: Vec<String> = match &settings.members {
        Some(listed) => listed.iter().map(|m| m.name.clone()).collect(),
        None => snapshots.keys().cloned().collect(),
    };
    let conditions = obj
        .spec
        .scaled_job_spec
        .scaling_strategy
        .as_ref()
        .and_then(|s| s.pending_pod_conditions.clone())
        .unwrap_or_default();
    let mut members = Vec::new();
    let mut views: Vec<JobView> = Vec::new();
    let mut commands: BTreeMap<String, (String, JobCommands)> = BTreeMap::new();
    let mut state =
        DsjState::from_status(&settings, &previous.scheduling.clone().unwrap_or_default());
    state.taints.share(shared_taints(ctx, &namespace, &name));
    let mut next_index = previous
        .scheduling
        .as_ref()
        .map_or(0, |s| s.next_job_index)
        .max(0);
    let mut events: Vec<(EventType, &str, String)> = Vec::new();
    let mut sent_names = BTreeSet::new();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for member in &names {
        let snapshot = snapshots.get(member);
        let session = snapshot
            .and_then(|s| s.session.as_ref())
            .filter(|s| s.state == SessionState::Connected);
        let jobs = ctx.fleet.jobs_of(member, &owner);
        let ready = session.is_some() && jobs.complete;
        if let Some(session) = session {
            ids.insert(member.clone(), session.session_id.clone());
        }
        members.push(DsjMember {
            name: member.clone(),
            state: if ready {
                MemberState::Ready
            } else {
                MemberState::Unreachable
            },
        });
        for j in &jobs.jobs {
            views.push(view(member, j, &conditions));
        }
        // Creates sent and not reported yet count as pending Jobs; failed ones are dropped
        // (and taint the member once per poll, under weightedRoundRobin).
        let mut held = jobs.commands.clone();
        let failed: BTreeSet<&str> = jobs.failures.iter().map(|(n, _)| n.as_str()).collect();
        let before = held.creates.len();
        held.creates
            .retain(|c| !failed.contains(format!("{}/{}", c.namespace, c.name).as_str()));
        if held.creates.len() < before {
            let level = create_failed(&settings, &mut state, member, now);
            let why = jobs
                .failures
                .first()
                .map(|(_, f)| f.message.clone())
                .unwrap_or_default();
            events.push((
                EventType::Warning,
                "JobCreateFailed",
                format!("creating Jobs in {member} failed ({why}); taint now {level:?}"),
            ));
        }
        // A refused delete (the Job lost kedge's label, say) is retried, and said.
        if let Some((name, f)) = jobs.failures.iter().find(|(n, _)| {
            held.deletes
                .iter()
                .any(|d| format!("{}/{}", d.namespace, d.name) == *n)
        }) {
            events.push((
                EventType::Warning,
                "JobDeleteFailed",
                format!(
                    "deleting Job {name} in {member} failed ({:?}: {})",
                    f.code, f.message
                ),
            ));
        }
        for c in &held.creates {
            sent_names.insert(c.name.clone());
            views.push(JobView {
                name: c.name.clone(),
                member: member.clone(),
                phase: Phase::Pending,
                pending_since: ctx.dsj_sent.since(&c.name, now),
                finished_at: None,
                replaces: annotation_of(c, ANNOTATION_REPLACES),
                template: annotation_of(c, ANNOTATION_TEMPLATE),
            });
        }
        if let Some(session) = session
            && jobs.complete
        {
            commands.insert(member.clone(), (session.session_id.clone(), held));
        }
    }
    // Right after a hub start, a member whose agent has not reported yet hides its Jobs: the
    // poll would count too few and create Jobs a second time elsewhere. Wait for every listed
    // member (or for the startup grace to end: an agent that does not come back in it is
    // unreachable, and its Jobs cannot be counted).
    let unreported: Vec<&str> = members
        .iter()
        .filter(|m| m.state != MemberState::Ready)
        .map(|m| m.name.as_str())
        .collect();
    if ctx.starting() && !unreported.is_empty() {
        debug!(
            ?unreported,
            "hub starting: waiting for every member's Jobs before polling"
        );
        ctx.dsj_sent.not_polled(&owner);
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    ctx.dsj_sent.forget_except(&sent_names);
    views.sort_by(|a, b| (a.pending_since, &a.name).cmp(&(b.pending_since, &b.name)));

    // Jobs made from an earlier spec go (rollout.strategy default) and are left out of the
    // plan, so their replacements are created in this same poll. A create still in flight is
    // withdrawn, and deleted in case the agent made it already.
    let current: BTreeMap<String, String> = names
        .iter()
        .map(|m| (m.clone(), template_hash(&obj.spec, m)))
        .collect();
    let rolled_out = rollout(&settings, &views, &current);
    for d in &rolled_out {
        if let Some((_, held)) = commands.get_mut(&d.member) {
            held.creates.retain(|c| c.name != d.name);
        }
    }
    views.retain(|v| !rolled_out.iter().any(|d| d.name == v.name));

    let levels_before: BTreeMap<&str, TaintLevel> = names
        .iter()
        .map(|m| (m.as_str(), taint_level(&settings, &state, m, now)))
        .collect();
    let out = step(
        &StepInput {
            settings: &settings,
            metrics: &metrics,
            members: &members,
            jobs: &views,
            now,
        },
        &mut state,
    );
    let mut deletions = rolled_out;
    deletions.extend(cleanup(&settings, &views));
    debug!(plan = ?out.plan, creates = ?out.creates, deletions = ?deletions, "decided");

    // New Jobs, rendered; deletes of reported Jobs.
    let uid = obj.uid().unwrap_or_default();
    let labels = obj.labels().clone();
    let annotations = obj.annotations().clone();
    for creates in &out.creates {
        let Some((_, held)) = commands.get_mut(&creates.member) else {
            continue;
        };
        let plain = (0..creates.new).map(|_| None);
        for replaces in creates.failovers.iter().map(Some).chain(plain) {
            let job_name = job_name(&name, &uid, u64::try_from(next_index).unwrap_or(0));
            next_index = next_index.saturating_add(1);
            let (manifest, warnings) = job(
                &obj.spec,
                &JobOf {
                    namespace: &namespace,
                    dsj: &name,
                    labels: &labels,
                    annotations: &annotations,
                    member: &creates.member,
                    name: &job_name,
                    replaces: replaces.map(String::as_str),
                },
            );
            for w in warnings {
                events.push((EventType::Warning, "UnknownContainer", w));
            }
            if let Some(source) = replaces {
                events.push((
                    EventType::Normal,
                    "Failover",
                    format!(
                        "Job {source} is stuck; {job_name} replaces it in {}",
                        creates.member
                    ),
                ));
            }
            let manifest_json =
                serde_json::to_vec(&manifest).map_err(|source| Error::Serialize {
                    what: "Job",
                    source,
                })?;
            held.creates.push(JobCreate {
                namespace: namespace.clone(),
                name: job_name,
                owner: owner.clone(),
                manifest_json,
            });
        }
    }
    for d in &deletions {
        if let Some((_, held)) = commands.get_mut(&d.member)
            && !held.deletes.iter().any(|x| x.name == d.name)
            && (d.why == Cleanup::Rollout
                || views
                    .iter()
                    .any(|v| v.name == d.name && v.member == d.member))
        {
            let (propagation, why) = match d.why {
                Cleanup::Rollout => (
                    match settings.propagation {
                        validate::Propagation::Background => Propagation::Background,
                        validate::Propagation::Foreground => Propagation::Foreground,
                    },
                    "made from an earlier spec; rollout.strategy default",
                ),
                Cleanup::Duplicate => (Propagation::Background, "duplicationPolicy"),
                Cleanup::History => (Propagation::Background, "beyond the history limit"),
            };
            held.deletes.push(JobDelete {
                namespace: namespace.clone(),
                name: d.name.clone(),
                owner: owner.clone(),
                propagation,
            });
            events.push((
                EventType::Normal,
                if d.why == Cleanup::Rollout {
                    "JobRolledOut"
                } else {
                    "JobCleanedUp"
                },
                format!("deleting Job {} in {} ({why})", d.name, d.member),
            ));
        }
    }
    for (member, (session, held)) in commands {
        ctx.fleet.set_jobs(&member, &session, &owner, held);
    }
    for name in &out.newly_stuck {
        events.push((
            EventType::Warning,
            "JobStuck",
            format!("Job {name} has been pending longer than the grace period"),
        ));
    }
    for member in &names {
        let after = taint_level(&settings, &state, member, now);
        if levels_before.get(member.as_str()) != Some(&after) {
            events.push((
                if after == TaintLevel::None {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                "TaintChanged",
                format!("{member}: taint {after:?}"),
            ));
        }
    }

    // Status.
    let status = status_of(&StatusInput {
        previous: &previous,
        generation,
        name: &name,
        names: &names,
        members: &members,
        ids: &ids,
        views: &views,
        readings: &readings,
        out: &out,
        state: &state,
        settings: &settings,
        paused: settings.paused,
        next_index,
        now,
    });
    for t in &status.trigger_metrics_status {
        let before = previous
            .trigger_metrics_status
            .iter()
            .find(|p| p.name == t.name);
        if t.state == "Error" && before.is_none_or(|b| b.state != "Error") {
            events.push((
                EventType::Warning,
                "MetricUnavailable",
                format!(
                    "trigger {} cannot be read, no Job is created: {}",
                    t.name,
                    t.info.clone().unwrap_or_default()
                ),
            ));
        }
    }
    // Stuck Jobs and taints alike share one Event past a handful; written together.
    let events = kedge_core::events::fold_alike(
        events,
        |e| e.1,
        |e| &e.2,
        |(kind, reason, _), note| (kind, reason, note),
    );
    futures::future::join_all(
        events
            .into_iter()
            .map(|(kind, reason, note)| ctx.publish(&*obj, kind, reason, "Reconcile", note)),
    )
    .await;
    if status != observed {
        write_status(ctx, &namespace, &name, &status).await?;
    }
    ctx.dsj_sent.remember(&owner, &status);
    Ok(Action::requeue(polling))
}

/// The taints the other DSJs of `namespace` keep (the status this process wrote last for
/// each, else the one the cache shows). The DSJs of a namespace share taints: a member
/// hard-tainted by one is excluded for the others (a workload-scoped taint only for DSJs of
/// that class at that size or larger). Namespaces are the tenancy boundary: a DSJ in one
/// cannot exclude members for another.
fn shared_taints(ctx: &Context, namespace: &str, name: &str) -> Vec<((String, TaintScope), Taint)> {
    ctx.dsjs()
        .iter()
        .filter(|d| d.namespace().as_deref() == Some(namespace) && d.name_any() != name)
        .flat_map(|d| {
            let owner = format!("{namespace}/{}", d.name_any());
            let scheduling = ctx
                .dsj_sent
                .written(&owner)
                .or_else(|| d.status.clone())
                .and_then(|s| s.scheduling)
                .unwrap_or_default();
            saved_taints(&scheduling, TaintPolicy::default()).collect::<Vec<_>>()
        })
        .collect()
}

/// An annotation of the Job a create command carries.
fn annotation_of(create: &JobCreate, key: &str) -> Option<String> {
    let manifest: Value = serde_json::from_slice(&create.manifest_json).ok()?;
    manifest["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

/// A reported Job as the planner sees it: pending by KEDA's rule.
fn view(member: &str, j: &JobStatus, conditions: &[String]) -> JobView {
    let phase = match j.phase {
        JobPhase::Succeeded => Phase::Succeeded,
        JobPhase::Failed => Phase::Failed,
        _ if is_pending(j, conditions) => Phase::Pending,
        _ => Phase::Running,
    };
    JobView {
        name: j.name.clone(),
        member: member.to_owned(),
        phase,
        pending_since: kedge_core::time::from_time(&from_unix_ms(j.created_unix_ms)),
        finished_at: j
            .finished_unix_ms
            .map(|ms| kedge_core::time::from_time(&from_unix_ms(ms))),
        replaces: j.replaces.clone(),
        template: j.template.clone(),
    }
}

struct StatusInput<'a> {
    previous: &'a DistributedScaledJobStatus,
    generation: Option<i64>,
    name: &'a str,
    names: &'a [String],
    members: &'a [DsjMember],
    /// Session id of each connected member.
    ids: &'a BTreeMap<String, String>,
    views: &'a [JobView],
    readings: &'a BTreeMap<String, Reading>,
    out: &'a kedge_core::dsj::step::StepOutput,
    state: &'a DsjState,
    settings: &'a validate::DsjSettings,
    paused: bool,
    next_index: i64,
    now: SystemTime,
}

fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The DSJ's status after a poll.
fn status_of(i: &StatusInput<'_>) -> DistributedScaledJobStatus {
    let p = i.previous;
    let mut member_statuses = BTreeMap::new();
    let observations: BTreeMap<&str, _> = i
        .out
        .observations
        .iter()
        .rev()
        .map(|o| (o.name.as_str(), o))
        .collect();
    for m in i.members {
        let o = observations.get(m.name.as_str()).copied();
        let level = taint_level(i.settings, i.state, &m.name, i.now);
        let state = match m.state {
            MemberState::Ready => "Ready",
            MemberState::Unreachable => "Unreachable",
        };
        let before = p.member_cluster_statuses.get(&m.name);
        let description = match (m.state, level) {
            (MemberState::Unreachable, _) => "agent not connected, or its Jobs not reported yet",
            (_, TaintLevel::Hard) => "hard-tainted: receives no Jobs until the taint expires",
            (_, TaintLevel::Soft) => {
                "soft-tainted: a second failure within softTaintDuration excludes it"
            }
            _ => "Cluster is healthy",
        };
        member_statuses.insert(
            m.name.clone(),
            DsjMemberClusterStatus {
                description: Some(description.to_owned()),
                id: i
                    .ids
                    .get(&m.name)
                    .cloned()
                    .or_else(|| before.and_then(|b| b.id.clone())),
                running_jobs: o.map_or(0, |o| count(o.running_jobs)),
                pending_jobs: o.map_or(0, |o| count(o.pending_jobs)),
                stuck_jobs: o.map_or(0, |o| count(o.stuck_jobs)),
                soft_tainted: level == TaintLevel::Soft,
                hard_tainted: level == TaintLevel::Hard,
                hard_taint_scopes: i.state.hard_taint_scopes(i.settings, &m.name, i.now),
                excluded: level == TaintLevel::Hard || m.state == MemberState::Unreachable,
                last_status_change_time: match before {
                    Some(b) if b.state.as_deref() == Some(state) => {
                        b.last_status_change_time.clone()
                    }
                    _ => Some(to_time(i.now)),
                },
                state: Some(state.to_owned()),
            },
        );
    }
    bound_member_statuses(&mut member_statuses, |m| {
        m.state.as_deref() == Some("Ready") && !m.soft_tainted && !m.hard_tainted
    });
    let trigger_metrics_status = i
        .readings
        .iter()
        .map(|(name, r)| {
            let state = match r.state() {
                TriggerState::Active => "Active",
                TriggerState::Inactive => "Inactive",
                TriggerState::Error => "Error",
            };
            let before = p.trigger_metrics_status.iter().find(|t| &t.name == name);
            TriggerMetricStatus {
                name: name.clone(),
                state: state.to_owned(),
                info: Some(r.info()),
                last_change_time: match before {
                    Some(b) if b.state == state => b.last_change_time.clone(),
                    _ => Some(to_time(i.now)),
                },
            }
        })
        .collect();
    let scalers_target_average_value = i
        .readings
        .iter()
        .filter_map(|(name, r)| match r {
            Reading::Read(m) => Some((name.clone(), format!("{}", m.target))),
            Reading::Failed(_) => None,
        })
        .collect();
    let unreadable = &i.out.unreadable;
    let mut conditions = vec![
        condition(
            &p.conditions,
            CONDITION_READY,
            true,
            REASON_RECONCILED,
            "Jobs are planned every pollingInterval".to_owned(),
            i.generation,
            i.now,
        ),
        condition(
            &p.conditions,
            CONDITION_PAUSED,
            i.paused,
            if i.paused {
                REASON_PAUSED_BY_ANNOTATION
            } else {
                "NotPaused"
            },
            if i.paused {
                "autoscaling.keda.sh/paused: no new Jobs are created"
            } else {
                "Jobs are created as the triggers ask"
            }
            .to_owned(),
            i.generation,
            i.now,
        ),
    ];
    let degraded = if unreadable.is_empty() {
        (
            false,
            "NoFailures",
            String::from("every trigger can be read"),
        )
    } else {
        (
            true,
            "MetricUnavailable",
            format!(
                "no Job is created while these triggers cannot be read: {}",
                unreadable.join(", ")
            ),
        )
    };
    conditions.push(condition(
        &p.conditions,
        CONDITION_DEGRADED,
        degraded.0,
        degraded.1,
        degraded.2,
        i.generation,
        i.now,
    ));
    let _ = i.names;
    let _ = i.views;
    DistributedScaledJobStatus {
        desired_jobs: count(i.out.plan.desired_jobs),
        running_jobs: count(i.out.plan.running_jobs),
        pending_jobs: count(i.out.plan.pending_jobs),
        member_cluster_statuses: member_statuses,
        selector: Some(format!("{LABEL_DSJ}={}", i.name)),
        scalers_target_average_value,
        trigger_metrics_status,
        scheduling: Some(i.state.to_status(i.next_index)),
        conditions,
    }
}

async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &DistributedScaledJobStatus,
) -> Result<()> {
    super::write_status::<DistributedScaledJob>(ctx, CONTROLLER, namespace, name, status).await
}

/// Requeues a failed reconcile after a short pause.
pub fn error_policy(obj: Arc<DistributedScaledJob>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(dsj = %obj.name_any(), %error, "reconcile failed");
    ctx.metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    Action::requeue(Duration::from_secs(5))
}
