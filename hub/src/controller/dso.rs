//! The DistributedScaledObject controller: I/O only. It reads the DSO, the fleet and the
//! other DSOs, applies the child KEDA ScaledObject (whose target is the DSO's own `/scale`),
//! hands everything to `kedge_core::dso::outcome` — the one place DSO rules live — and
//! writes what it decided: commands into the [`Fleet`](crate::fleet::Fleet), Events, status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use kedge_core::crd::conditions::{ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, LABEL_DSO};
use kedge_core::crd::dso::DistributedScaledObjectStatus;
use kedge_core::crd::member::NamespaceMapping;
use kedge_core::crd::{DistributedScaledObject, GROUP, VERSION};
use kedge_core::dso::member::{Claim, Targets, members_of};
use kedge_core::dso::outcome::{Command, DsoInput, EventKind, outcome};
use kedge_core::{tenancy, validate};
use kedge_protocol::WorkloadReplicas;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::Context;
use super::observe;
use crate::{Error, Result};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "distributedscaledobject";
/// Finalizer that clears a deleted DSO's desired state from every member.
pub const FINALIZER: &str = "kedge.dev/distributedscaledobject";

fn ns_name(dso: &DistributedScaledObject) -> Result<(String, String)> {
    super::ns_name(dso, "DistributedScaledObject")
}

/// The fleet owner key of a DSO.
pub fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one DSO.
#[instrument(skip(ctx, obj), fields(dso = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DistributedScaledObject>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
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

/// Requeues a failed reconciliation, counts the failure and keeps its message for the
/// DSO's `Degraded` condition at the next reconciliation.
pub fn error_policy(obj: Arc<DistributedScaledObject>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(dso = %obj.name_any(), %error, "reconcile failed");
    ctx.metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    let owner = owner_key(&obj.namespace().unwrap_or_default(), &obj.name_any());
    ctx.record_error(&owner, error.to_string());
    Action::requeue(kedge_core::dso::outcome::RETRY)
}

async fn cleanup(dso: &DistributedScaledObject, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(dso)?;
    ctx.fleet.clear_owner(&owner_key(&namespace, &name));
    ctx.forget(&owner_key(&namespace, &name));
    // The child ScaledObject goes with the DSO through its ownerReference.
    Ok(Action::await_change())
}

/// Names of the registered members; on failure, the error and the members the DSO's
/// status already lists (so a hub-cluster hiccup never drops a member from the plan). A
/// status cut to its listing bound does not name every member: then the reconciliation
/// fails and changes nothing.
async fn registered(
    ctx: &Context,
    previous: &DistributedScaledObjectStatus,
) -> Result<(BTreeSet<String>, Option<String>)> {
    match ctx.member_clusters().await {
        Ok(list) => Ok((
            list.iter()
                .filter_map(|m| m.metadata.name.clone())
                .collect(),
            None,
        )),
        Err(e) if previous.is_cut() => Err(e),
        Err(e) => Ok((
            previous.member_cluster_statuses.keys().cloned().collect(),
            Some(format!("listing MemberClusters: {e}")),
        )),
    }
}

/// The members whose target namespace this DSO's namespace was not granted (tenancy,
/// [`kedge_core::tenancy`]). MemberClusters are read only when a member is targeted outside
/// the DSO's own namespace; when they cannot be read the reconcile fails and changes nothing.
async fn namespace_refusals(
    ctx: &Context,
    targets: &Targets<'_>,
    namespace: &str,
    members: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>> {
    let placements: Vec<(String, String)> = members
        .iter()
        .map(|m| (m.clone(), targets.of(m).namespace))
        .filter(|(_, target)| target != namespace)
        .collect();
    if placements.is_empty() {
        return Ok(BTreeMap::new());
    }
    let grants: BTreeMap<String, Vec<NamespaceMapping>> = ctx
        .member_clusters()
        .await?
        .iter()
        .filter_map(|m| Some((m.metadata.name.clone()?, m.spec.namespace_mappings.clone())))
        .collect();
    Ok(tenancy::refusals(
        namespace,
        placements.iter().map(|(m, n)| (m.as_str(), n.as_str())),
        &grants,
    ))
}

async fn apply(dso: &DistributedScaledObject, ctx: &Context) -> Result<Action> {
    let (namespace, name) = ns_name(dso)?;
    let owner = owner_key(&namespace, &name);
    let observed = dso.status.clone().unwrap_or_default();
    // What this process wrote last is newer than a cached object that has not caught up
    // with the write yet; comparing with it keeps Events from repeating.
    let previous = ctx.written(&owner).unwrap_or_else(|| observed.clone());
    let mut errors = ctx.take_errors(&owner);
    let validated = validate::dso(&dso.spec, dso.annotations()).map_err(|e| e.to_string());

    // Without KEDA's CRD the split still follows `/scale` (kubectl scale); say so.
    let mut keda_unavailable = None;
    if validated.is_ok() {
        match apply_scaled_object(dso, ctx, &namespace, &name).await {
            Ok(()) => {}
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {
                keda_unavailable = Some(format!(
                    "cannot create the ScaledObject: {} (is KEDA installed in the hub cluster?); \
                     the total changes only through /scale",
                    e.message
                ));
            }
            Err(e) => errors.push(format!("applying the child ScaledObject: {e}")),
        }
    }

    let (registered, listing_failed) = if dso.spec.member_clusters.is_empty() {
        registered(ctx, &previous).await?
    } else {
        (BTreeSet::new(), None)
    };
    errors.extend(listing_failed);
    let connected = ctx.fleet.registry().names();
    let names = members_of(&dso.spec, &registered, &connected);
    let elsewhere: Vec<String> = ctx
        .fleet
        .holders(&owner)
        .into_iter()
        .filter(|m| !names.contains(m))
        .collect();
    // Only this DSO's members (and those still holding its commands) are copied.
    let snapshots = ctx.fleet.members_named(names.iter().chain(&elsewhere));
    let targets = Targets::new(&dso.spec, &namespace);
    let not_allowed = namespace_refusals(ctx, &targets, &namespace, &names).await?;
    let claims = observe::claims(dso, &names, &registered, &connected, &ctx.dsos());
    let facts: Vec<_> = names
        .iter()
        .map(|member| {
            observe::facts(
                member,
                targets.of(member),
                snapshots.get(member),
                claims.get(member).cloned().unwrap_or(Claim::Sole),
                ctx.tracked(&owner, member),
            )
        })
        .collect();
    let selector = format!("{LABEL_DSO}={name}");
    let mut decided = outcome(&DsoInput {
        generation: dso.metadata.generation,
        selector: &selector,
        settings: validated.as_ref().map_err(String::as_str),
        not_allowed: &not_allowed,
        total: dso.spec.total_target_replicas,
        keda_unavailable: keda_unavailable.as_deref(),
        errors: &errors,
        previous: &previous,
        members: &facts,
        elsewhere: &elsewhere,
        now: SystemTime::now(),
    });
    debug!(plan = ?decided.plan, commands = ?decided.commands, "decided");

    for (member, command) in &decided.commands {
        let workload = targets.of(member);
        let replicas = match command {
            Command::Clear => {
                ctx.fleet.clear_workloads(member, &owner);
                continue;
            }
            Command::Hold => None,
            Command::Replicas(n) => Some(i32::try_from(*n).unwrap_or(i32::MAX)),
        };
        let Some(session) = snapshots
            .get(member)
            .and_then(|s| s.session.as_ref())
            .map(|s| s.session_id.clone())
        else {
            continue;
        };
        ctx.fleet.set_workloads(
            member,
            &session,
            &owner,
            vec![WorkloadReplicas {
                workload,
                replicas,
                owner: owner.clone(),
            }],
        );
    }
    ctx.track(&owner, std::mem::take(&mut decided.tracked));
    // A handful at most (members that changed alike share one): written together.
    futures::future::join_all(decided.events.into_iter().map(|event| {
        let kind = match event.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        };
        ctx.publish(dso, kind, event.reason, event.action, event.note)
    }))
    .await;
    let mut requeue = decided.requeue;
    if decided.status != observed {
        // A state or condition that changed is written at once; replica counts alone that
        // moved again within the second wait for its end. Compared with the status decided
        // last (written, or due with counts only), not with the cached object, which may
        // not show this process's last write yet: against that older status every
        // reconciliation after a rescale looked like a change of conditions.
        let wait = if counts_only(&previous, &decided.status) {
            ctx.status_wait(&owner)
        } else {
            None
        };
        match wait {
            // Written at the next reconciliation, which comes by then.
            Some(wait) => requeue = requeue.min(wait),
            None => {
                if let Err(e) = write_status(ctx, &namespace, &name, &decided.status).await {
                    // Shown in `Degraded` once a write goes through again.
                    ctx.record_error(&owner, format!("writing status: {e}"));
                    return Err(e);
                }
                ctx.status_written(&owner);
            }
        }
    }
    ctx.remember(&owner, decided.status);
    Ok(Action::requeue(requeue))
}

/// Whether `a` and `b` differ at most in replica counts (and the time of the last scaling
/// progress, which moves with them).
fn counts_only(a: &DistributedScaledObjectStatus, b: &DistributedScaledObjectStatus) -> bool {
    let without_counts = |s: &DistributedScaledObjectStatus| {
        let mut s = s.clone();
        s.total_current_replicas = 0;
        for m in s.member_cluster_statuses.values_mut() {
            m.current_replicas = 0;
            m.desired_replicas = 0;
            m.last_scaling_progress_time = None;
        }
        s
    };
    without_counts(a) == without_counts(b)
}

async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &DistributedScaledObjectStatus,
) -> Result<()> {
    super::write_status::<DistributedScaledObject>(ctx, CONTROLLER, namespace, name, status).await
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

/// Whether the ScaledObject `current` already is what `wanted` (from [`scaled_object`]) asks:
/// the same spec, label, pause annotations and controlling owner. Anything else in it is
/// someone else's.
fn in_place(current: &DynamicObject, wanted: &Value) -> bool {
    let meta = &current.metadata;
    let wanted_meta = &wanted["metadata"];
    let label_in_place = wanted_meta["labels"].as_object().is_some_and(|labels| {
        labels.iter().all(|(k, v)| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .map(String::as_str)
                == v.as_str()
        })
    });
    let pause_in_place = [ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS]
        .iter()
        .all(|key| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(*key))
                .map(String::as_str)
                == wanted_meta["annotations"][*key].as_str()
        });
    let owner_in_place = wanted_meta["ownerReferences"][0]["uid"]
        .as_str()
        .is_some_and(|uid| {
            meta.owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == uid && o.controller == Some(true))
        });
    meta.deletion_timestamp.is_none()
        && label_in_place
        && pause_in_place
        && owner_in_place
        && current.data.get("spec") == Some(&wanted["spec"])
}

async fn apply_scaled_object(
    dso: &DistributedScaledObject,
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let object = scaled_object(dso, namespace, name)?;
    if ctx
        .cached_scaled_object(namespace, name)
        .is_some_and(|current| in_place(&current, &object))
    {
        return Ok(());
    }
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
    fn only_replica_counts_wait_for_the_next_status_write() {
        let status: DistributedScaledObjectStatus = serde_json::from_value(json!({
            "totalCurrentReplicas": 4, "membersHealthyCount": 2, "membersTotalCount": 2,
            "memberClusterStatuses": {
                "m1": {"currentReplicas": 2, "desiredReplicas": 2, "state": "Ready"},
                "m2": {"currentReplicas": 2, "desiredReplicas": 2, "state": "Ready"}}
        }))
        .unwrap();
        let mut counts = status.clone();
        counts.total_current_replicas = 6;
        counts
            .member_cluster_statuses
            .get_mut("m1")
            .unwrap()
            .desired_replicas = 4;
        assert!(counts_only(&status, &counts));
        let mut state = counts.clone();
        state.member_cluster_statuses.get_mut("m2").unwrap().state = Some("Unreachable".into());
        assert!(!counts_only(&status, &state));
        let mut healthy = status.clone();
        healthy.members_healthy_count = 1;
        assert!(!counts_only(&status, &healthy));
    }

    #[test]
    fn a_child_scaled_object_already_in_place_is_not_applied_again() {
        let dso: DistributedScaledObject = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "nginx", "namespace": "default", "uid": "u-1"},
            "spec": {"scaledObjectSpec": {
                "scaleTargetRef": {"name": "nginx"}, "maxReplicaCount": 10,
                "triggers": [{"type": "kubernetes-resource", "metadata": {"targetValue": "5"}}]
            }}
        }))
        .unwrap();
        let wanted = scaled_object(&dso, "default", "nginx").unwrap();
        let stored = |edit: &dyn Fn(&mut Value)| -> DynamicObject {
            let mut object = wanted.clone();
            object["metadata"]["resourceVersion"] = json!("7");
            object["metadata"]["annotations"]["someone.else/note"] = json!("x");
            edit(&mut object);
            serde_json::from_value(object).unwrap()
        };
        assert!(in_place(&stored(&|_| {}), &wanted));
        // Anything kedge manages that differs is applied again.
        assert!(!in_place(
            &stored(&|o| o["spec"]["maxReplicaCount"] = json!(3)),
            &wanted
        ));
        assert!(!in_place(
            &stored(&|o| o["metadata"]["annotations"][ANNOTATION_PAUSED] = json!("true")),
            &wanted
        ));
        assert!(!in_place(
            &stored(&|o| o["metadata"]["labels"] = json!({})),
            &wanted
        ));
        assert!(!in_place(
            &stored(&|o| o["metadata"]["ownerReferences"] = json!([])),
            &wanted
        ));
        assert!(!in_place(
            &stored(&|o| o["metadata"]["deletionTimestamp"] = json!("2026-11-23T08:00:00Z")),
            &wanted
        ));
    }
}
