//! The DistributedScaledJob controller: I/O around `kedge_core::dsj::step`. Each polling
//! interval it reads the triggers through the shadow KEDA ScaledObject (whose target is the
//! DSJ's own `/scale`; the hub never runs a ScaledJob, which would create Jobs in the hub
//! cluster), the Jobs every member reports, and the state the previous poll left in status;
//! calls `step`, `cleanup` and `outcome` (the same functions `kubectl kedge simulate` runs);
//! and writes what they decided: Job creates and deletes into the
//! [`Fleet`](crate::fleet::Fleet), Events, status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kedge_core::crd::conditions::MemberPhase;
use kedge_core::crd::conditions::{
    ANNOTATION_REPLACES, ANNOTATION_TEMPLATE, EVENT_INVALID_SPEC, EVENT_JOB_DELETE_FAILED,
    EVENT_UNKNOWN_CONTAINER, REASON_VALIDATION_FAILED,
};
use kedge_core::crd::keda::trigger_key;
use kedge_core::crd::{DistributedScaledJob, DistributedScaledJobStatus};
use kedge_core::dsj::duplication::JobPhase as Phase;
use kedge_core::dsj::metrics::{Reading, usable};
use kedge_core::dsj::outcome::{
    OutcomeInput, create_failed_event, deletion_event, failover_event, next_wake, outcome,
};
use kedge_core::dsj::pending::is_pending;
use kedge_core::dsj::persist::saved_taints;
use kedge_core::dsj::render::{JobOf, job, job_name, template_hash};
use kedge_core::dsj::step::{
    Cleanup, Deletion, DsjMember, DsjState, JobView, Remembered, StepInput, StepOutput, cleanup,
    create_failed, rollout, step, taint_level,
};
use kedge_core::dsj::taint::{Taint, TaintLevel, TaintPolicy, TaintScope};
use kedge_core::dso::outcome::refused_conditions;
use kedge_core::events::Event;
use kedge_core::time::from_unix_ms;
use kedge_core::validate;
use kedge_protocol::{JobCreate, JobDelete, JobPhase, JobStatus, Propagation};
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::finalizer::Event as Finalizer;
use kube::{Resource, ResourceExt};
use serde_json::Value;
use tracing::{debug, instrument, warn};

use super::external_metrics::{Source, read};
use super::runner::Action;
use crate::fleet::{JobCommands, MemberJobs};
use crate::registry::SessionState;
use crate::{Error, Result};

mod context;

pub use context::DsjContext;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "distributedscaledjob";

/// The shadow KEDA ScaledObject of a DSJ, from the one builder
/// ([`kedge_core::keda_object::shadow_of_dsj`]): the DSJ's triggers, targeting the DSJ's own
/// `/scale`, so KEDA's metrics server exposes the trigger values.
pub fn shadow_scaled_object(
    dsj: &DistributedScaledJob,
    namespace: &str,
    name: &str,
) -> Result<Value> {
    let owner = dsj.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "DistributedScaledJob",
        field: "metadata.uid",
    })?;
    let object = kedge_core::keda_object::shadow_of_dsj(dsj, namespace, name, owner);
    serde_json::to_value(object).map_err(|source| Error::Serialize {
        what: "scaledJobSpec.triggers",
        source,
    })
}

/// Finalizer that has the Jobs of a deleted DSJ deleted in every member.
pub const FINALIZER: &str = "kedge.dev/distributedscaledjob";

/// What the hub does for a DSJ it cannot decode.
pub const HOOKS: super::decode::KindHooks<DsjContext> = super::decode::KindHooks {
    finalizer: FINALIZER,
    release,
};

fn ns_name(dsj: &DistributedScaledJob) -> Result<(String, String)> {
    super::ns_name(dsj, "DistributedScaledJob")
}

/// Reconciles one DSJ.
#[instrument(skip(ctx, obj), fields(dsj = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DistributedScaledJob>, ctx: Arc<DsjContext>) -> Result<Action> {
    let _timer = ctx.shared.metrics.reconcile_timer(CONTROLLER);
    let (namespace, _) = ns_name(&obj)?;
    let api: Api<DistributedScaledJob> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    super::with_finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(dsj) => apply(dsj, &ctx).await,
            Finalizer::Cleanup(dsj) => delete_jobs_of(&dsj, &ctx),
        }
    })
    .await
}

/// A deleted DSJ: every member whose agent has reported its Jobs is told to delete this
/// DSJ's Jobs (and to create none); the hub keeps sending those deletes until each member
/// reports them gone, after the DSJ itself is gone. A member not connected now keeps its
/// Jobs (they run to completion).
fn delete_jobs_of(dsj: &DistributedScaledJob, ctx: &DsjContext) -> Result<Action> {
    let (namespace, name) = ns_name(dsj)?;
    let owner = format!("{namespace}/{name}");
    send_to_connected(ctx, &owner, |jobs| JobCommands {
        creates: Vec::new(),
        deletes: jobs
            .jobs
            .iter()
            .map(|j| JobDelete {
                namespace: j.namespace.clone(),
                name: j.name.clone(),
                owner: owner.clone(),
                propagation: Propagation::Background,
            })
            .collect(),
    });
    ctx.forget(&owner);
    // The shadow ScaledObject goes with the DSJ through its ownerReference.
    Ok(Action::await_change())
}

/// Releases what the hub holds for DSJ `namespace/name`: no Job is created or deleted for
/// it any more (its Jobs run on), and what was tracked is forgotten.
pub fn release(ctx: &DsjContext, namespace: &str, name: &str) {
    let owner = format!("{namespace}/{name}");
    send_to_connected(ctx, &owner, |_| JobCommands::default());
    ctx.forget(&owner);
}

/// Sets `owner`'s Job commands in every connected member, from its Jobs there.
fn send_to_connected(ctx: &DsjContext, owner: &str, commands: impl Fn(&MemberJobs) -> JobCommands) {
    for member in ctx.shared.fleet.members() {
        let Some(session) = member
            .session
            .as_ref()
            .filter(|s| s.state == SessionState::Connected)
        else {
            continue;
        };
        let jobs = ctx.shared.fleet.jobs_of(&member.name, owner);
        let commands = commands(&jobs);
        // Nothing held and nothing to send: the member is left alone (a `set_jobs` would also
        // release its desired state, which waits for its planning after a restart).
        if commands == JobCommands::default() && jobs.commands == JobCommands::default() {
            continue;
        }
        ctx.shared
            .fleet
            .set_jobs(&member.name, &session.session_id, owner, commands);
    }
}

async fn apply(obj: Arc<DistributedScaledJob>, ctx: &DsjContext) -> Result<Action> {
    let (namespace, name) = ns_name(&obj)?;
    let owner = format!("{namespace}/{name}");
    let observed = obj.status.clone().unwrap_or_default();
    let previous = ctx.written(&owner).unwrap_or_else(|| observed.clone());
    let now = SystemTime::now();
    let generation = obj.metadata.generation;
    let settings = match validate::dsj(&obj.spec, obj.annotations()) {
        Ok(s) => s,
        Err(e) => return refuse(&obj, ctx, &previous, &e.to_string(), now).await,
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
    // Due: a poll reads the triggers. Woken before (a grace period or taint ended, a
    // failover pair changed phase, the object changed): a tick on the last poll's readings,
    // which creates failover Jobs only, never new work.
    let (readings, failover_only, until_poll) = match ctx.due(&owner, version, polling, now) {
        None => (
            read_triggers(&obj, ctx, &namespace, &name, &settings).await,
            false,
            polling,
        ),
        Some(wait) => match ctx.readings(&owner) {
            Some(readings) => (readings, true, wait),
            None => return Ok(Action::requeue(wait)),
        },
    };
    let world = gather(ctx, &obj, &owner, &settings, &previous, now).await?;
    let decided = decide(
        &obj,
        &settings,
        &previous,
        world,
        &readings,
        failover_only,
        polling,
        now,
    )?;

    // Write ahead: the status that counts this poll's creates is stored before any of them
    // is sent, so a hub that restarts at any point counts every Job it may have created.
    if decided.status != observed {
        write_status(ctx, &namespace, &name, &decided.status).await?;
    }
    ctx.remember(&owner, &decided.status);
    if !failover_only {
        ctx.keep_readings(&owner, readings);
    }
    ctx.forget_except(&owner, &decided.sent_names);
    for (member, (session, held)) in decided.commands {
        ctx.shared.fleet.set_jobs(&member, &session, &owner, held);
    }
    let events = kedge_core::events::fold_alike(
        decided.events,
        |e| e.reason,
        |e| &e.note,
        |e, note| Event { note, ..e },
    );
    futures::future::join_all(
        events
            .into_iter()
            .map(|e| ctx.shared.publish_event(&*obj, e)),
    )
    .await;
    let until_wake = decided
        .wake
        .and_then(|w| w.duration_since(now).ok())
        .unwrap_or(Duration::MAX);
    Ok(Action::requeue(until_poll.min(until_wake)))
}

/// An invalid spec: `Ready=False` with every bad field, one Warning Event per change; the
/// DSJ's Jobs are left as they are.
async fn refuse(
    obj: &DistributedScaledJob,
    ctx: &DsjContext,
    previous: &DistributedScaledJobStatus,
    message: &str,
    now: SystemTime,
) -> Result<Action> {
    let (namespace, name) = ns_name(obj)?;
    let mut status = previous.clone();
    status.conditions = refused_conditions(
        &previous.conditions,
        REASON_VALIDATION_FAILED,
        message,
        obj.metadata.generation,
        now,
    );
    if status != *previous {
        ctx.shared
            .publish_event(
                obj,
                Event {
                    action: "Validate",
                    ..Event::warning(EVENT_INVALID_SPEC, message.to_owned())
                },
            )
            .await;
        write_status(ctx, &namespace, &name, &status).await?;
    }
    Ok(Action::await_change())
}

/// The triggers, through the shadow ScaledObject.
async fn read_triggers(
    obj: &DistributedScaledJob,
    ctx: &DsjContext,
    namespace: &str,
    name: &str,
    settings: &validate::DsjSettings,
) -> BTreeMap<String, Reading> {
    let so = match shadow_scaled_object(obj, namespace, name) {
        Ok(so) => so,
        Err(e) => return failed(settings, &e.to_string()),
    };
    let sos: Api<DynamicObject> = Api::namespaced_with(
        ctx.shared.client.clone(),
        namespace,
        &super::scaled_object_resource(),
    );
    let applied = super::bounded(
        "apply shadow ScaledObject",
        sos.patch(
            name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&so),
        ),
    )
    .await;
    let applied = match applied {
        Ok(applied) => applied,
        Err(e) => {
            return failed(
                settings,
                &format!("applying the shadow KEDA ScaledObject: {e}"),
            );
        }
    };
    let names: Vec<String> = applied.data["status"]["externalMetricNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let triggers = &obj.spec.scaled_job_spec.triggers;
    let keys: Vec<String> = triggers.iter().map(|t| trigger_key(t).to_owned()).collect();
    let source = Source {
        namespace,
        scaled_object: name,
        metric_names: &names,
    };
    read(&ctx.shared.client, &source, triggers, &keys).await
}

/// Every trigger of `settings` failed for `why`.
fn failed(settings: &validate::DsjSettings, why: &str) -> BTreeMap<String, Reading> {
    settings
        .triggers
        .iter()
        .map(|key| (key.clone(), Reading::Failed(why.to_owned())))
        .collect()
}

/// What the hub sees of the DSJ's members.
struct World {
    /// Member names: those listed, else every registered MemberCluster.
    names: Vec<String>,
    members: Vec<DsjMember>,
    /// Jobs reported, and creates sent and not reported yet.
    views: Vec<JobView>,
    /// Jobs of members not reported since the hub started, as the last status recorded.
    remembered: Vec<Remembered>,
    /// Commands held per connected member with a complete report (session id, commands).
    commands: BTreeMap<String, (String, JobCommands)>,
    /// Session id of each connected member.
    ids: BTreeMap<String, String>,
    /// Members whose creates failed in their latest acknowledged revision, with why.
    create_failures: Vec<(String, String)>,
    /// Refused deletes, said once per poll.
    delete_failures: Vec<String>,
    /// Taints the other DSJs of the namespace keep.
    shared: Vec<((String, TaintScope), Taint)>,
}

/// The DSJ's members: listed ones, else every registered MemberCluster (whether or not
/// this hub has heard from it yet: a member that has not reported keeps its last recorded
/// Jobs counted, so the hub never plans as if they did not exist).
async fn member_names(ctx: &DsjContext, settings: &validate::DsjSettings) -> Result<Vec<String>> {
    if let Some(listed) = &settings.members {
        return Ok(listed.iter().map(|m| m.name.clone()).collect());
    }
    let registered: BTreeSet<String> = ctx
        .shared
        .member_clusters()
        .await?
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && super::joined(m))
        .map(|m| m.name_any())
        .collect();
    Ok(registered.into_iter().collect())
}

/// Reads the members, their Jobs and the commands held for them.
async fn gather(
    ctx: &DsjContext,
    obj: &DistributedScaledJob,
    owner: &str,
    settings: &validate::DsjSettings,
    previous: &DistributedScaledJobStatus,
    now: SystemTime,
) -> Result<World> {
    let names = member_names(ctx, settings).await?;
    let pending_conditions = obj
        .spec
        .scaled_job_spec
        .scaling_strategy
        .as_ref()
        .and_then(|s| s.pending_pod_conditions.clone())
        .unwrap_or_default();
    let recorded = previous.scheduling.as_ref().map(|s| &s.member_jobs);
    let mut world = World {
        names: names.clone(),
        members: Vec::new(),
        views: Vec::new(),
        remembered: Vec::new(),
        commands: BTreeMap::new(),
        ids: BTreeMap::new(),
        create_failures: Vec::new(),
        delete_failures: Vec::new(),
        shared: shared_taints(ctx, &obj.namespace().unwrap_or_default(), &obj.name_any()),
    };
    for member in &names {
        let session = ctx
            .shared
            .fleet
            .member(member)
            .and_then(|s| s.session)
            .filter(|s| s.state == SessionState::Connected);
        let jobs = ctx.shared.fleet.jobs_of(member, owner);
        if let Some(session) = &session {
            world.ids.insert(member.clone(), session.session_id.clone());
        }
        let ready = session.is_some() && jobs.complete;
        world.members.push(DsjMember {
            name: member.clone(),
            state: if ready {
                MemberPhase::Ready
            } else {
                MemberPhase::Unreachable
            },
        });
        if !jobs.known {
            if let Some(r) = recorded.and_then(|r| r.get(member)) {
                let n = |x: i32| u32::try_from(x).unwrap_or(0);
                world.remembered.push(Remembered {
                    member: member.clone(),
                    running: n(r.running),
                    pending: n(r.pending).min(n(r.running)),
                });
            }
            continue;
        }
        for j in &jobs.jobs {
            world.views.push(view(member, j, &pending_conditions));
        }
        let held = held_commands(&mut world, member, &jobs);
        for c in &held.creates {
            world.views.push(JobView {
                name: c.name.clone(),
                member: member.clone(),
                phase: Phase::Pending,
                pending_since: ctx.since(owner, &c.name, now),
                finished_at: None,
                replaces: annotation_of(c, ANNOTATION_REPLACES),
                template: annotation_of(c, ANNOTATION_TEMPLATE),
            });
        }
        if let Some(session) = session
            && jobs.complete
        {
            world
                .commands
                .insert(member.clone(), (session.session_id.clone(), held));
        }
    }
    world
        .views
        .sort_by(|a, b| (a.pending_since, &a.name).cmp(&(b.pending_since, &b.name)));
    Ok(world)
}

/// The commands held for `member` that still stand: creates sent and not reported yet count
/// as pending Jobs, failed ones are dropped (and the member's create failure noted in
/// `world`); a refused delete (the Job lost kedge's label, say) is kept, retried, and said.
fn held_commands(world: &mut World, member: &str, jobs: &MemberJobs) -> JobCommands {
    let mut held = jobs.commands.clone();
    let failed: BTreeSet<&str> = jobs.failures.iter().map(|(n, _)| n.as_str()).collect();
    let before = held.creates.len();
    held.creates
        .retain(|c| !failed.contains(format!("{}/{}", c.namespace, c.name).as_str()));
    if held.creates.len() < before {
        let why = jobs
            .failures
            .first()
            .map(|(_, f)| f.message.clone())
            .unwrap_or_default();
        world.create_failures.push((member.to_owned(), why));
    }
    if let Some((name, f)) = jobs.failures.iter().find(|(n, _)| {
        held.deletes
            .iter()
            .any(|d| format!("{}/{}", d.namespace, d.name) == *n)
    }) {
        world.delete_failures.push(format!(
            "deleting Job {name} in {member} failed ({:?}: {})",
            f.code, f.message
        ));
    }
    held
}

/// What one poll decided: the status to write first, then the commands and Events.
struct Decided {
    status: DistributedScaledJobStatus,
    commands: BTreeMap<String, (String, JobCommands)>,
    events: Vec<Event>,
    /// Names of the creates held after this poll (when each was first sent is kept).
    sent_names: BTreeSet<String>,
    wake: Option<SystemTime>,
}

/// Runs `kedge_core`'s step, cleanup and outcome on the world, and renders the Jobs they
/// create into the held commands.
#[allow(clippy::too_many_arguments)]
fn decide(
    obj: &DistributedScaledJob,
    settings: &validate::DsjSettings,
    previous: &DistributedScaledJobStatus,
    world: World,
    readings: &BTreeMap<String, Reading>,
    failover_only: bool,
    polling: Duration,
    now: SystemTime,
) -> Result<Decided> {
    let (namespace, name) = ns_name(obj)?;
    let owner = format!("{namespace}/{name}");
    let World {
        names,
        members,
        mut views,
        remembered,
        mut commands,
        ids,
        create_failures,
        delete_failures,
        shared,
    } = world;
    let mut events: Vec<Event> = Vec::new();
    let state = DsjState::from_status(settings, &previous.scheduling.clone().unwrap_or_default());
    let mut state = with_failures(settings, state, shared, &create_failures, now, &mut events);
    let levels_before: BTreeMap<String, TaintLevel> = names
        .iter()
        .map(|m| (m.clone(), taint_level(settings, &state, m, now)))
        .collect();
    for note in delete_failures {
        events.push(Event::warning(EVENT_JOB_DELETE_FAILED, note));
    }
    let metrics = usable(readings);
    let mut next_index = previous
        .scheduling
        .as_ref()
        .map_or(0, |s| s.next_job_index)
        .max(0);
    let rolled_out = roll_out(obj, settings, &names, &mut views, &mut commands);
    let out = step(
        &StepInput {
            settings,
            metrics: &metrics,
            members: &members,
            jobs: &views,
            remembered: &remembered,
            failover_only,
            now,
        },
        &mut state,
    );
    let mut deletions = rolled_out;
    deletions.extend(cleanup(settings, &views));
    debug!(plan = ?out.plan, creates = ?out.creates, deletions = ?deletions, "decided");
    render_creates(obj, &out, &mut commands, &mut next_index, &mut events)?;
    for d in &deletions {
        delete(
            settings,
            &mut commands,
            &views,
            d,
            &namespace,
            &owner,
            &mut events,
        );
    }
    let decided = outcome(&OutcomeInput {
        previous,
        generation: obj.metadata.generation,
        name: &name,
        settings,
        polling,
        members: &members,
        ids: &ids,
        jobs: &views,
        remembered: &remembered,
        readings,
        out: &out,
        state: &state,
        levels_before: &levels_before,
        create_failures: &create_failures,
        next_index,
        now,
    });
    events.extend(decided.events);
    let sent_names = commands
        .values()
        .flat_map(|(_, held)| held.creates.iter().map(|c| c.name.clone()))
        .collect();
    Ok(Decided {
        status: decided.status,
        commands,
        events,
        sent_names,
        wake: next_wake(settings, &state, &views, now),
    })
}

/// The taint state of the poll: the DSJ's own (from its status), the taints the other DSJs
/// of the namespace keep (`shared`), and the create failures reported since the last poll,
/// each said in an Event with the taint it gives.
fn with_failures(
    settings: &validate::DsjSettings,
    mut state: DsjState,
    shared: Vec<((String, TaintScope), Taint)>,
    create_failures: &[(String, String)],
    now: SystemTime,
    events: &mut Vec<Event>,
) -> DsjState {
    state.taints.share(shared);
    for (member, why) in create_failures {
        let level = create_failed(settings, &mut state, member, now);
        events.push(create_failed_event(member, why, level));
    }
    state
}

/// Jobs made from an earlier spec go (rollout.strategy default) and are left out of the
/// plan, so their replacements are created in this same poll. A create still in flight is
/// withdrawn, and deleted in case the agent made it already.
fn roll_out(
    obj: &DistributedScaledJob,
    settings: &validate::DsjSettings,
    names: &[String],
    views: &mut Vec<JobView>,
    commands: &mut BTreeMap<String, (String, JobCommands)>,
) -> Vec<Deletion> {
    let current: BTreeMap<String, String> = names
        .iter()
        .map(|m| (m.clone(), template_hash(&obj.spec, m)))
        .collect();
    let rolled_out = rollout(settings, views, &current);
    for d in &rolled_out {
        if let Some((_, held)) = commands.get_mut(&d.member) {
            held.creates.retain(|c| c.name != d.name);
        }
    }
    views.retain(|v| !rolled_out.iter().any(|d| d.name == v.name));
    rolled_out
}

/// Renders the Jobs `out` creates into the held commands of their members, named from
/// `next_index` on, with their Events (a failover, a container override naming no
/// container).
fn render_creates(
    obj: &DistributedScaledJob,
    out: &StepOutput,
    commands: &mut BTreeMap<String, (String, JobCommands)>,
    next_index: &mut i64,
    events: &mut Vec<Event>,
) -> Result<()> {
    let (namespace, name) = ns_name(obj)?;
    let owner = format!("{namespace}/{name}");
    let uid = obj.uid().unwrap_or_default();
    let labels = obj.labels().clone();
    let annotations = obj.annotations().clone();
    for creates in &out.creates {
        let Some((_, held)) = commands.get_mut(&creates.member) else {
            continue;
        };
        let plain = (0..creates.new).map(|_| None);
        for replaces in creates.failovers.iter().map(Some).chain(plain) {
            let job_name = job_name(&name, &uid, u64::try_from(*next_index).unwrap_or(0));
            *next_index = next_index.saturating_add(1);
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
                events.push(Event::warning(EVENT_UNKNOWN_CONTAINER, w));
            }
            if let Some(source) = replaces {
                events.push(failover_event(source, &job_name, &creates.member));
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
    Ok(())
}

/// Adds the delete of `d` to its member's commands, once, with its Event.
fn delete(
    settings: &validate::DsjSettings,
    commands: &mut BTreeMap<String, (String, JobCommands)>,
    views: &[JobView],
    d: &Deletion,
    namespace: &str,
    owner: &str,
    events: &mut Vec<Event>,
) {
    let Some((_, held)) = commands.get_mut(&d.member) else {
        return;
    };
    let reported = views
        .iter()
        .any(|v| v.name == d.name && v.member == d.member);
    if held.deletes.iter().any(|x| x.name == d.name) || (d.why != Cleanup::Rollout && !reported) {
        return;
    }
    let propagation = match (d.why, settings.propagation) {
        (Cleanup::Rollout, validate::Propagation::Foreground) => Propagation::Foreground,
        _ => Propagation::Background,
    };
    held.deletes.push(JobDelete {
        namespace: namespace.to_owned(),
        name: d.name.clone(),
        owner: owner.to_owned(),
        propagation,
    });
    events.push(deletion_event(d));
}

/// The taints the other DSJs of `namespace` keep (the status this process wrote last for
/// each, else the one the cache shows). The DSJs of a namespace share taints: a member
/// hard-tainted by one is excluded for the others (a workload-scoped taint only for DSJs of
/// that class at that size or larger). Namespaces are the tenancy boundary: a DSJ in one
/// cannot exclude members for another.
fn shared_taints(
    ctx: &DsjContext,
    namespace: &str,
    name: &str,
) -> Vec<((String, TaintScope), Taint)> {
    ctx.dsjs()
        .iter()
        .filter(|d| d.namespace().as_deref() == Some(namespace) && d.name_any() != name)
        .flat_map(|d| {
            let owner = format!("{namespace}/{}", d.name_any());
            let scheduling = ctx
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

async fn write_status(
    ctx: &DsjContext,
    namespace: &str,
    name: &str,
    status: &DistributedScaledJobStatus,
) -> Result<()> {
    super::write_status::<DistributedScaledJob>(&ctx.shared, CONTROLLER, namespace, name, status)
        .await
}

/// Requeues a failed reconcile after a short pause.
pub fn error_policy(obj: Arc<DistributedScaledJob>, error: &Error, ctx: Arc<DsjContext>) -> Action {
    warn!(dsj = %obj.name_any(), %error, "reconcile failed");
    ctx.shared
        .metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    Action::requeue(Duration::from_secs(5))
}
