//! The DistributedScaledObject controller: owns the child KEDA ScaledObject whose target is the
//! DSO's own `/scale`, splits `.spec.totalTargetReplicas` over the members with
//! `kedge_core::dso::plan`, hands each Ready member its replicas through the [`Fleet`], and
//! writes status and Events from what the agents report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kedge_core::crd::conditions::{
    ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, CONDITION_DEGRADED, CONDITION_PAUSED,
    CONDITION_READY, LABEL_DSO, REASON_INSUFFICIENT_CAPACITY, REASON_MEMBER_UNREACHABLE,
    REASON_PAUSED_AT_REPLICAS, REASON_PAUSED_BY_ANNOTATION, REASON_RECONCILED,
    REASON_VALIDATION_FAILED, STATE_READY, STATE_UNREACHABLE,
};
use kedge_core::crd::dso::{DistributedScaledObjectStatus, DsoMemberClusterStatus};
use kedge_core::crd::{DistributedScaledObject, GROUP, MemberCluster, VERSION};
use kedge_core::dso::{DsoPlan, DsoPlanInput, Reason};
use kedge_core::validate::{self, DsoSettings, Pause};
use kedge_protocol::WorkloadReplicas;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::Context;
use super::observe::{self, MemberView, STATE_REFUSED, STATE_WORKLOAD_MISSING};
use crate::{Error, Result};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "distributedscaledobject";
/// Finalizer that clears a deleted DSO's desired state from every member.
pub const FINALIZER: &str = "kedge.dev/distributedscaledobject";

/// Event reason: the split over members changed.
pub const EVENT_REBALANCED: &str = "Rebalanced";
/// Event reason: the total changed and was split over the members.
pub const EVENT_SCALED: &str = "Scaled";
/// Event reason: a member stopped being usable for this DSO.
pub const EVENT_MEMBER_LOST: &str = "MemberLost";
/// Event reason: a member is usable again.
pub const EVENT_MEMBER_RETURNED: &str = "MemberReturned";
/// Event reason: an agent refused a command.
pub const EVENT_COMMAND_REFUSED: &str = "CommandRefused";
/// Event reason: the workload does not exist in a member.
pub const EVENT_WORKLOAD_MISSING: &str = "WorkloadMissing";
/// Event reason: the spec or annotations are invalid.
pub const EVENT_INVALID_SPEC: &str = "InvalidSpec";

/// Condition reason and Event reason: the child ScaledObject cannot be created.
pub const REASON_KEDA_UNAVAILABLE: &str = "KedaUnavailable";

/// Longest wait between two reconciliations of one DSO.
const RESYNC: Duration = Duration::from_secs(30);

fn ns_name(dso: &DistributedScaledObject) -> Result<(String, String)> {
    let namespace = dso.namespace().ok_or(Error::MissingField {
        kind: "DistributedScaledObject",
        field: "metadata.namespace",
    })?;
    Ok((namespace, dso.name_any()))
}

/// The fleet owner key of a DSO.
pub fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one DSO.
#[instrument(skip(ctx, obj), fields(dso = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DistributedScaledObject>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let (namespace, _) = ns_name(&obj)?;
    let api: Api<DistributedScaledObject> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(dso) => apply(&dso, &ctx).await,
            Finalizer::Cleanup(dso) => cleanup(&dso, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Requeues a failed reconciliation and counts the failure.
pub fn error_policy(obj: Arc<DistributedScaledObject>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(dso = %obj.name_any(), %error, "reconcile failed");
    ctx.metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    Action::requeue(Duration::from_secs(5))
}

async fn cleanup(dso: &DistributedScaledObject, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(dso)?;
    ctx.fleet.clear_owner(&owner_key(&namespace, &name));
    ctx.forget(&owner_key(&namespace, &name));
    // The child ScaledObject goes with the DSO through its ownerReference.
    Ok(Action::await_change())
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: super::time(SystemTime::now()),
    }
}

/// Keeps `lastTransitionTime` of conditions whose status did not change.
fn keep_transition_times(new: &mut [Condition], old: &[Condition]) {
    for c in new {
        if let Some(o) = old.iter().find(|o| o.type_ == c.type_)
            && o.status == c.status
        {
            c.last_transition_time = o.last_transition_time.clone();
        }
    }
}

async fn apply(dso: &DistributedScaledObject, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(dso)?;
    let owner = owner_key(&namespace, &name);
    let generation = dso.metadata.generation;
    let observed = dso.status.clone().unwrap_or_default();
    // What this process wrote last is newer than a cached object that has not caught up
    // with the write yet; comparing with it keeps Events from repeating.
    let previous = ctx.written(&owner).unwrap_or_else(|| observed.clone());
    let annotations = dso.annotations().clone();
    let selector = format!("{LABEL_DSO}={name}");

    let settings = match validate::dso(&dso.spec, &annotations) {
        Ok(s) => s,
        Err(e) => {
            // Invalid: say so, change nothing in any member.
            let message = e.to_string();
            let ready_before = previous
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_READY);
            if ready_before.is_none_or(|c| c.message != message) {
                ctx.publish(
                    dso,
                    EventType::Warning,
                    EVENT_INVALID_SPEC,
                    "Validate",
                    message.clone(),
                )
                .await;
            }
            let mut status = previous.clone();
            status.selector = Some(selector);
            let mut conditions = vec![condition(
                CONDITION_READY,
                false,
                REASON_VALIDATION_FAILED,
                message,
                generation,
            )];
            conditions.extend(
                previous
                    .conditions
                    .iter()
                    .filter(|c| c.type_ != CONDITION_READY)
                    .cloned(),
            );
            keep_transition_times(&mut conditions, &previous.conditions);
            status.conditions = conditions;
            if status != observed {
                write_status(ctx, &namespace, &name, &status).await?;
            }
            ctx.remember(&owner, status);
            return Ok(Action::requeue(RESYNC));
        }
    };

    // Without KEDA's CRD the split still follows `/scale` (kubectl scale); say so.
    let keda_missing = match apply_scaled_object(dso, ctx, &namespace, &name).await {
        Ok(()) => None,
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Some(format!(
            "cannot create the ScaledObject: {} (is KEDA installed in the hub cluster?); \
             the total changes only through /scale",
            e.message
        )),
        Err(e) => return Err(e),
    };
    if let Some(message) = &keda_missing
        && !previous
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_DEGRADED && c.reason == REASON_KEDA_UNAVAILABLE)
    {
        ctx.publish(
            dso,
            EventType::Warning,
            REASON_KEDA_UNAVAILABLE,
            "ApplyScaledObject",
            message.clone(),
        )
        .await;
    }

    // Every member the DSO may use: those listed, else every registered or connected one.
    let snapshots: BTreeMap<String, crate::fleet::MemberSnapshot> = ctx
        .fleet
        .members()
        .into_iter()
        .map(|m| (m.name.clone(), m))
        .collect();
    let names: BTreeSet<String> = if dso.spec.member_clusters.is_empty() {
        let registered = super::bounded(
            "list MemberClusters",
            Api::<MemberCluster>::all(ctx.client.clone()).list_metadata(&ListParams::default()),
        )
        .await?;
        registered
            .items
            .iter()
            .filter_map(|m| m.metadata.name.clone())
            .chain(snapshots.keys().cloned())
            .collect()
    } else {
        dso.spec
            .member_clusters
            .iter()
            .map(|m| m.name.clone())
            .collect()
    };

    let now = SystemTime::now();
    let mut views: Vec<(MemberView, SystemTime)> = Vec::new();
    for member in &names {
        let workload = observe::target(dso, &namespace, member);
        let prev = previous.member_cluster_statuses.get(member);
        let view = observe::view(
            member,
            snapshots.get(member),
            &workload,
            prev,
            ctx.starting(),
        );
        let since = ctx.track(&owner, member, view.state, prev, now);
        views.push((view, since));
    }
    let observations: Vec<_> = views
        .iter()
        .filter_map(|(v, since)| v.observation(now.duration_since(*since).unwrap_or_default()))
        .collect();
    let plan = kedge_core::dso::plan(&DsoPlanInput {
        settings: &settings,
        total_target_replicas: u32::try_from(dso.spec.total_target_replicas).unwrap_or(0),
        members: &observations,
    });
    debug!(?plan, "planned");

    push(
        ctx, dso, &namespace, &owner, &settings, &plan, &views, &snapshots,
    );

    // Status.
    let mut members = BTreeMap::new();
    for (view, since) in &views {
        let desired = plan
            .members
            .iter()
            .find(|d| d.name == view.name)
            .map_or(0, |d| d.desired);
        members.insert(
            view.name.clone(),
            DsoMemberClusterStatus {
                current_replicas: view.ready_replicas,
                desired_replicas: i32::try_from(desired).unwrap_or(i32::MAX),
                description: Some(view.description.clone()),
                id: view.id.clone(),
                last_status_change_time: Some(super::time(*since)),
                state: Some(view.state.to_owned()),
            },
        );
    }
    events(ctx, dso, &previous, &members, &plan).await;

    let healthy = views.iter().filter(|(v, _)| v.is_ready()).count();
    let not_ready: Vec<&str> = views
        .iter()
        .filter(|(v, _)| !v.is_ready())
        .map(|(v, _)| v.name.as_str())
        .collect();
    let mut conditions = vec![condition(
        CONDITION_READY,
        true,
        REASON_RECONCILED,
        format!(
            "{} replicas over {} of {} members",
            plan.total,
            healthy,
            views.len()
        ),
        generation,
    )];
    conditions.push(match settings.pause {
        Pause::No => condition(
            CONDITION_PAUSED,
            false,
            "NotPaused",
            "scaling is not paused".into(),
            generation,
        ),
        Pause::Paused => condition(
            CONDITION_PAUSED,
            true,
            REASON_PAUSED_BY_ANNOTATION,
            format!("{ANNOTATION_PAUSED} is set: no member is changed"),
            generation,
        ),
        Pause::AtReplicas(n) => condition(
            CONDITION_PAUSED,
            true,
            REASON_PAUSED_AT_REPLICAS,
            format!("{ANNOTATION_PAUSED_REPLICAS} is set: the total is fixed at {n}"),
            generation,
        ),
    });
    conditions.push(if let Some(message) = keda_missing {
        condition(
            CONDITION_DEGRADED,
            true,
            REASON_KEDA_UNAVAILABLE,
            message,
            generation,
        )
    } else if plan.shortfall > 0 {
        condition(
            CONDITION_DEGRADED,
            true,
            REASON_INSUFFICIENT_CAPACITY,
            format!("{} replicas fit in no member", plan.shortfall),
            generation,
        )
    } else if !not_ready.is_empty() {
        condition(
            CONDITION_DEGRADED,
            true,
            REASON_MEMBER_UNREACHABLE,
            format!("members not usable: {}", not_ready.join(", ")),
            generation,
        )
    } else {
        condition(
            CONDITION_DEGRADED,
            false,
            REASON_RECONCILED,
            "every member is usable".into(),
            generation,
        )
    });
    keep_transition_times(&mut conditions, &previous.conditions);
    let status = DistributedScaledObjectStatus {
        total_current_replicas: members.values().map(|m| m.current_replicas.max(0)).sum(),
        member_cluster_statuses: members,
        members_healthy_count: i32::try_from(healthy).unwrap_or(i32::MAX),
        members_total_count: i32::try_from(views.len()).unwrap_or(i32::MAX),
        selector: Some(selector),
        conditions,
    };
    if status != observed {
        write_status(ctx, &namespace, &name, &status).await?;
    }
    ctx.remember(&owner, status);

    // Wake up when the first grace period of a member out of use runs out.
    let next = views
        .iter()
        .filter(|(v, _)| !v.is_ready() && v.known)
        .filter_map(|(_, since)| {
            let elapsed = now.duration_since(*since).unwrap_or_default();
            settings.grace_period.checked_sub(elapsed)
        })
        .min()
        .map_or(RESYNC, |left| {
            (left + Duration::from_millis(50)).min(RESYNC)
        });
    Ok(Action::requeue(next))
}

/// Hands each connected member its replicas. Unreachable members keep what they were last
/// told: they are fail-static and get the new split when they are back. Connected members
/// whose workload is missing or refused are told too (0 once their grace period is over), so
/// that their agent keeps reporting on the workload and notices when it appears.
#[allow(clippy::too_many_arguments)]
fn push(
    ctx: &Context,
    dso: &DistributedScaledObject,
    namespace: &str,
    owner: &str,
    settings: &DsoSettings,
    plan: &DsoPlan,
    views: &[(MemberView, SystemTime)],
    snapshots: &BTreeMap<String, crate::fleet::MemberSnapshot>,
) {
    if settings.pause == Pause::Paused {
        return;
    }
    for decision in &plan.members {
        let connected = views
            .iter()
            .any(|(v, _)| v.name == decision.name && v.connected);
        if !connected || decision.reason == Reason::NotConnected {
            continue;
        }
        let workload = observe::target(dso, namespace, &decision.name);
        ctx.fleet.set_workloads(
            &decision.name,
            owner,
            vec![WorkloadReplicas {
                workload,
                replicas: i32::try_from(decision.desired).unwrap_or(i32::MAX),
                owner: owner.to_owned(),
            }],
        );
    }
    // Members no longer used by this DSO stop managing its workload.
    for member in snapshots.keys() {
        if !plan.members.iter().any(|d| &d.name == member) {
            ctx.fleet.set_workloads(member, owner, Vec::new());
        }
    }
}

async fn events(
    ctx: &Context,
    dso: &DistributedScaledObject,
    previous: &DistributedScaledObjectStatus,
    members: &BTreeMap<String, DsoMemberClusterStatus>,
    plan: &DsoPlan,
) {
    for (member, now) in members {
        let before = previous.member_cluster_statuses.get(member);
        let state = now.state.as_deref().unwrap_or_default();
        let was = before.and_then(|b| b.state.as_deref());
        if was == Some(state) {
            continue;
        }
        let description = now.description.clone().unwrap_or_default();
        let (type_, reason) = match state {
            STATE_READY if was.is_some() => (EventType::Normal, EVENT_MEMBER_RETURNED),
            STATE_UNREACHABLE => (EventType::Warning, EVENT_MEMBER_LOST),
            STATE_WORKLOAD_MISSING => (EventType::Warning, EVENT_WORKLOAD_MISSING),
            STATE_REFUSED => (EventType::Warning, EVENT_COMMAND_REFUSED),
            _ => continue,
        };
        ctx.publish(
            dso,
            type_,
            reason,
            "Observe",
            format!("{member}: {description}"),
        )
        .await;
    }
    let desired_before: BTreeMap<&String, i32> = previous
        .member_cluster_statuses
        .iter()
        .map(|(m, s)| (m, s.desired_replicas))
        .collect();
    let desired_now: BTreeMap<&String, i32> = members
        .iter()
        .map(|(m, s)| (m, s.desired_replicas))
        .collect();
    if desired_before != desired_now {
        let split = |d: &BTreeMap<&String, i32>| {
            d.iter()
                .map(|(m, r)| format!("{m}={r}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let total_before: i32 = desired_before.values().sum();
        let reason = if i64::from(total_before) == i64::from(plan.total) {
            EVENT_REBALANCED
        } else {
            EVENT_SCALED
        };
        ctx.publish(
            dso,
            EventType::Normal,
            reason,
            "Distribute",
            format!(
                "total {}: {} (was {})",
                plan.total,
                split(&desired_now),
                split(&desired_before)
            ),
        )
        .await;
    }
}

async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &DistributedScaledObjectStatus,
) -> Result<()> {
    let api: Api<DistributedScaledObject> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "DistributedScaledObject",
        "status": status,
    });
    super::bounded(
        "apply DistributedScaledObject status",
        api.patch_status(
            name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        ),
    )
    .await?;
    ctx.metrics.status_written(CONTROLLER);
    Ok(())
}

/// The child KEDA ScaledObject of a DSO: its target is the DSO's own `/scale`.
pub fn scaled_object(dso: &DistributedScaledObject, namespace: &str, name: &str) -> Result<Value> {
    let mut spec =
        serde_json::to_value(&dso.spec.scaled_object_spec).map_err(|source| Error::Serialize {
            what: "scaledObjectSpec",
            source,
        })?;
    spec["scaleTargetRef"] = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "DistributedScaledObject",
        "name": name,
    });
    let annotations: BTreeMap<&String, &String> = dso
        .annotations()
        .iter()
        .filter(|(k, _)| *k == ANNOTATION_PAUSED || *k == ANNOTATION_PAUSED_REPLICAS)
        .collect();
    let owner = dso.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "DistributedScaledObject",
        field: "metadata.uid",
    })?;
    Ok(json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_DSO: name},
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": spec,
    }))
}

async fn apply_scaled_object(
    dso: &DistributedScaledObject,
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let object = scaled_object(dso, namespace, name)?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &ctx.scaled_objects);
    super::bounded(
        "apply ScaledObject",
        api.patch(
            name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        ),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    #[test]
    fn child_scaled_object_targets_the_dso_and_carries_pause_annotations() {
        let dso: DistributedScaledObject = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "nginx", "namespace": "default", "uid": "u-1",
                "annotations": {"autoscaling.keda.sh/paused-replicas": "3", "other": "x"}},
            "spec": {"scaledObjectSpec": {
                "scaleTargetRef": {"name": "nginx"},
                "minReplicaCount": 1, "maxReplicaCount": 10, "pollingInterval": 5,
                "fallback": {"failureThreshold": 3, "replicas": 2},
                "triggers": [{"type": "kubernetes-resource", "metadata": {"targetValue": "5"}}]
            }}
        }))
        .unwrap();
        let so = scaled_object(&dso, "default", "nginx").unwrap();
        assert_eq!(
            so["spec"]["scaleTargetRef"],
            json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject", "name": "nginx"})
        );
        assert_eq!(so["spec"]["minReplicaCount"], 1);
        assert_eq!(so["spec"]["maxReplicaCount"], 10);
        assert_eq!(so["spec"]["pollingInterval"], 5);
        assert_eq!(so["spec"]["fallback"]["replicas"], 2);
        assert_eq!(so["spec"]["triggers"][0]["type"], "kubernetes-resource");
        assert_eq!(
            so["metadata"]["annotations"],
            json!({"autoscaling.keda.sh/paused-replicas": "3"})
        );
        assert_eq!(so["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(so["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(so["metadata"]["labels"][LABEL_DSO], "nginx");
    }

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let old = condition("Ready", true, "R", "a".into(), Some(1));
        let mut old_time = old.clone();
        old_time.last_transition_time = Time(Timestamp::from_second(1000).unwrap());
        let mut new = vec![
            condition("Ready", true, "R", "b".into(), Some(2)),
            condition("Paused", true, "P", "c".into(), Some(2)),
        ];
        keep_transition_times(&mut new, &[old_time.clone()]);
        assert_eq!(new[0].last_transition_time, old_time.last_transition_time);
        assert_ne!(new[1].last_transition_time, old_time.last_transition_time);
    }
}
