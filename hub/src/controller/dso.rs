//! The DistributedScaledObject controller: I/O only. It reads the DSO, the fleet and the
//! other DSOs, applies the child KEDA ScaledObject (whose target is the DSO's own `/scale`),
//! hands everything to `kedge_core::dso::outcome` — the one place DSO rules live — and
//! writes what it decided: commands into the [`Fleet`](crate::fleet::Fleet), Events, status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use kedge_core::crd::DistributedScaledObject;
use kedge_core::crd::conditions::{ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, LABEL_DSO};
use kedge_core::crd::dso::DistributedScaledObjectStatus;
use kedge_core::crd::keda::{DEFAULT_POLLING_INTERVAL, trigger_key};
use kedge_core::crd::member::NamespaceMapping;
use kedge_core::dso::member::{Claim, MemberFacts, Targets, members_of};
use kedge_core::dso::outcome::{Command, DsoInput, outcome};
use kedge_core::keda_object::{self, ExternalScaler};
use kedge_core::{podmetrics, tenancy, validate};
use kedge_protocol::WorkloadReplicas;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::finalizer::Event as Finalizer;
use kube::{Resource, ResourceExt};
use serde_json::Value;
use tracing::{debug, instrument, warn};

use super::observe;
use super::runner::Action;
use crate::podmetrics::{Configured, ConfiguredMember, certs};
use crate::{Error, Result};

mod context;

pub use context::DsoContext;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "distributedscaledobject";
/// Finalizer that clears a deleted DSO's desired state from every member.
pub const FINALIZER: &str = "kedge.dev/distributedscaledobject";

/// What the hub does for a DSO it cannot decode.
pub const HOOKS: super::decode::KindHooks<DsoContext> = super::decode::KindHooks {
    finalizer: FINALIZER,
    release,
};

fn ns_name(dso: &DistributedScaledObject) -> Result<(String, String)> {
    super::ns_name(dso, "DistributedScaledObject")
}

/// The fleet owner key of a DSO.
pub fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one DSO.
#[instrument(skip(ctx, obj), fields(dso = %obj.name_any(), namespace = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DistributedScaledObject>, ctx: Arc<DsoContext>) -> Result<Action> {
    let _timer = ctx.shared.metrics.reconcile_timer(CONTROLLER);
    // What this reconciliation takes (its API calls included) paces the re-planning after
    // fleet changes (see `pace`).
    let _running = ctx.pace.start();
    let (namespace, _) = ns_name(&obj)?;
    let api: Api<DistributedScaledObject> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    super::with_finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Finalizer::Apply(dso) => apply(&dso, &ctx).await,
            Finalizer::Cleanup(dso) => cleanup(&dso, &ctx).await,
        }
    })
    .await
}

/// Requeues a failed reconciliation, counts the failure and keeps its message for the
/// DSO's `Degraded` condition at the next reconciliation.
pub fn error_policy(
    obj: Arc<DistributedScaledObject>,
    error: &Error,
    ctx: Arc<DsoContext>,
) -> Action {
    warn!(dso = %obj.name_any(), %error, "reconcile failed");
    ctx.shared
        .metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    let owner = owner_key(&obj.namespace().unwrap_or_default(), &obj.name_any());
    ctx.record_error(&owner, error.to_string());
    Action::requeue(kedge_core::dso::outcome::RETRY)
}

async fn cleanup(dso: &DistributedScaledObject, ctx: &DsoContext) -> Result<Action> {
    let (namespace, name) = ns_name(dso)?;
    release(ctx, &namespace, &name);
    // The child ScaledObject goes with the DSO through its ownerReference.
    Ok(Action::await_change())
}

/// Releases everything the hub holds for DSO `namespace/name`: its commands in every member
/// (the workloads keep their replicas), its pod-metrics readings and what was tracked.
pub fn release(ctx: &DsoContext, namespace: &str, name: &str) {
    let owner = owner_key(namespace, name);
    ctx.shared.fleet.clear_owner(&owner);
    ctx.shared.fleet.pod_metrics().forget(&owner);
    ctx.publish_readings(namespace, name, Vec::new());
    ctx.forget(&owner);
}

/// Names of the registered members; on failure, the error and the members the DSO's
/// status already lists (so a hub-cluster hiccup never drops a member from the plan). A
/// status cut to its listing bound does not name every member: then the reconciliation
/// fails and changes nothing.
async fn registered(
    ctx: &DsoContext,
    previous: &DistributedScaledObjectStatus,
) -> Result<(BTreeSet<String>, Option<String>)> {
    match ctx.shared.member_clusters().await {
        // A MemberCluster whose agent never enrolled or connected can run nothing yet.
        Ok(list) => Ok((
            list.iter()
                .filter(|m| super::joined(m))
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

/// The members of `names` that have no MemberCluster (none when the MemberClusters cannot
/// be read now: then nothing is said about them).
async fn not_enrolled(ctx: &DsoContext, names: &BTreeSet<String>) -> BTreeSet<String> {
    let mut missing = BTreeSet::new();
    for name in names {
        if ctx.shared.member_cluster(name).await == Some(false) {
            missing.insert(name.clone());
        }
    }
    missing
}

/// The members whose target namespace this DSO's namespace was not granted (tenancy,
/// [`kedge_core::tenancy`]). MemberClusters are read only when a member is targeted outside
/// the DSO's own namespace; when they cannot be read the reconcile fails and changes nothing.
async fn namespace_refusals(
    ctx: &DsoContext,
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
    let grants = grants_of(&ctx.shared.member_clusters().await?);
    Ok(tenancy::refusals(
        namespace,
        placements.iter().map(|(m, n)| (m.as_str(), n.as_str())),
        &grants,
    ))
}

/// Member → the namespace grants of its MemberCluster.
fn grants_of(
    members: &[Arc<kedge_core::crd::MemberCluster>],
) -> BTreeMap<String, Vec<NamespaceMapping>> {
    members
        .iter()
        .filter_map(|m| Some((m.metadata.name.clone()?, m.spec.namespace_mappings.clone())))
        .collect()
}

async fn apply(dso: &DistributedScaledObject, ctx: &DsoContext) -> Result<Action> {
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
    let pod_metrics = has_pod_metrics(dso);
    let no_scaler = pod_metrics && ctx.scaler_address().is_none();
    if no_scaler {
        errors.push(format!(
            "this hub serves no external scaler for the {} trigger (start it with \
             --scaler-listen; the Helm chart does): the child ScaledObject is not applied",
            podmetrics::TRIGGER_TYPE
        ));
    }
    if validated.is_ok() && !no_scaler {
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
    let targets = Targets::new(&dso.spec, &namespace);
    let members = read_members(dso, ctx, &owner, &targets, &previous, &mut errors).await?;

    let selector = format!("{LABEL_DSO}={name}");
    let mut decided = outcome(&DsoInput {
        generation: dso.metadata.generation,
        selector: &selector,
        settings: validated.as_ref().map_err(String::as_str),
        not_allowed: &members.not_allowed,
        total: dso.spec.total_target_replicas,
        keda_unavailable: keda_unavailable.as_deref(),
        errors: &errors,
        previous: &previous,
        members: &members.facts,
        elsewhere: &members.elsewhere,
        now: SystemTime::now(),
    });
    debug!(plan = ?decided.plan, commands = ?decided.commands, "decided");

    send_commands(ctx, &owner, &targets, &members.snapshots, &decided.commands);
    if pod_metrics && validated.is_ok() && !no_scaler {
        let configured = pod_metrics_triggers(dso, &members.names, &targets, &members.snapshots);
        let readings = pod_metric_readings(ctx, &owner, configured);
        decided.status.pod_metrics = crate::podmetrics::status_of(&readings);
        ctx.publish_readings(&namespace, &name, readings);
        // The status follows the value at the DSO's polling interval.
        let interval = polling_interval(dso);
        decided.requeue = decided.requeue.min(interval);
    } else {
        ctx.shared.fleet.pod_metrics().forget(&owner);
        ctx.publish_readings(&namespace, &name, Vec::new());
    }
    ctx.track(&owner, std::mem::take(&mut decided.tracked));
    // A handful at most (members that changed alike share one): written together.
    futures::future::join_all(
        decided
            .events
            .into_iter()
            .map(|e| ctx.shared.publish_event(dso, e)),
    )
    .await;
    let mut requeue = decided.requeue;
    if decided.status != observed
        && let Some(wait) =
            write_when_due(ctx, &owner, &namespace, &name, &previous, &decided.status).await?
    {
        // Written at the next reconciliation, which comes by then.
        requeue = requeue.min(wait);
    }
    ctx.remember(&owner, decided.status);
    Ok(Action::requeue(requeue))
}

/// What the hub knows of a DSO's members, read for one reconciliation.
struct Members {
    /// The DSO's members.
    names: BTreeSet<String>,
    /// Members it no longer uses that still hold its commands.
    elsewhere: Vec<String>,
    /// The fleet's snapshot of both.
    snapshots: BTreeMap<String, crate::fleet::MemberSnapshot>,
    /// Members whose target namespace this DSO's namespace was not granted, with why.
    not_allowed: BTreeMap<String, String>,
    /// What the hub knows of each member, for `outcome`.
    facts: Vec<MemberFacts>,
}

/// Reads the DSO's members: registered MemberClusters (a listing failure goes to `errors`),
/// sessions, tenancy grants, claims on shared workloads and the phases tracked last.
async fn read_members(
    dso: &DistributedScaledObject,
    ctx: &DsoContext,
    owner: &str,
    targets: &Targets<'_>,
    previous: &DistributedScaledObjectStatus,
    errors: &mut Vec<String>,
) -> Result<Members> {
    let namespace = dso.namespace().unwrap_or_default();
    let (registered, listing_failed) = if dso.spec.member_clusters.is_empty() {
        registered(ctx, previous).await?
    } else {
        (BTreeSet::new(), None)
    };
    errors.extend(listing_failed);
    let connected = ctx.shared.fleet.registry().names();
    let names = members_of(&dso.spec, &registered, &connected);
    let elsewhere: Vec<String> = ctx
        .shared
        .fleet
        .holders(owner)
        .into_iter()
        .filter(|m| !names.contains(m))
        .collect();
    // Only this DSO's members (and those still holding its commands) are copied.
    let snapshots = ctx
        .shared
        .fleet
        .members_named(names.iter().chain(&elsewhere));
    let not_allowed = namespace_refusals(ctx, targets, &namespace, &names).await?;
    let grants = || grants_of(&ctx.shared.member_clusters_cached());
    let missing = if dso.spec.member_clusters.is_empty() {
        BTreeSet::new()
    } else {
        not_enrolled(ctx, &names).await
    };
    let claims = observe::claims(dso, &names, &registered, &connected, &ctx.dsos(), &grants);
    let facts = names
        .iter()
        .map(|member| {
            observe::facts(
                member,
                targets.of(member),
                snapshots.get(member),
                missing.contains(member),
                claims.get(member).cloned().unwrap_or(Claim::Sole),
                ctx.tracked(owner, member),
            )
        })
        .collect();
    Ok(Members {
        names,
        elsewhere,
        snapshots,
        not_allowed,
        facts,
    })
}

/// Puts the decided commands into the members' desired state: `Clear` drops the DSO's
/// commands there; a member without a session gets none.
fn send_commands(
    ctx: &DsoContext,
    owner: &str,
    targets: &Targets<'_>,
    snapshots: &BTreeMap<String, crate::fleet::MemberSnapshot>,
    commands: &BTreeMap<String, Command>,
) {
    for (member, command) in commands {
        let workload = targets.of(member);
        let replicas = match command {
            Command::Clear => {
                ctx.shared.fleet.clear_workloads(member, owner);
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
        ctx.shared.fleet.set_workloads(
            member,
            &session,
            owner,
            vec![WorkloadReplicas {
                workload,
                replicas,
                owner: owner.to_owned(),
            }],
        );
    }
}

/// Configures the pod-metrics scrapes of `owner` and returns its readings so far.
fn pod_metric_readings(
    ctx: &DsoContext,
    owner: &str,
    configured: Vec<Configured>,
) -> Vec<crate::podmetrics::Reading> {
    let pod_metrics = ctx.shared.fleet.pod_metrics();
    pod_metrics.configure(owner, configured);
    pod_metrics
        .readings(owner, tokio::time::Instant::now())
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// Writes a changed `status` now, or returns how long until it is due. A state or condition
/// that changed is written at once; replica counts alone that moved again within the second
/// wait for its end. Compared with the status decided last (written, or due with counts
/// only), not with the cached object, which may not show this process's last write yet:
/// against that older status every reconciliation after a rescale looked like a change of
/// conditions.
async fn write_when_due(
    ctx: &DsoContext,
    owner: &str,
    namespace: &str,
    name: &str,
    previous: &DistributedScaledObjectStatus,
    status: &DistributedScaledObjectStatus,
) -> Result<Option<std::time::Duration>> {
    if counts_only(previous, status)
        && let Some(wait) = ctx.status_wait(owner)
    {
        return Ok(Some(wait));
    }
    if let Err(e) = write_status(ctx, namespace, name, status).await {
        // Shown in `Degraded` once a write goes through again.
        ctx.record_error(owner, format!("writing status: {e}"));
        return Err(e);
    }
    ctx.status_written(owner);
    Ok(None)
}

/// Whether `a` and `b` differ at most in replica counts (and the time of the last scaling
/// progress, which moves with them) and pod-metrics readings.
fn counts_only(a: &DistributedScaledObjectStatus, b: &DistributedScaledObjectStatus) -> bool {
    let without_counts = |s: &DistributedScaledObjectStatus| {
        let mut s = s.clone();
        s.total_current_replicas = 0;
        // Pod-metrics readings move with every scrape, like replica counts.
        s.pod_metrics.clear();
        for m in s.member_cluster_statuses.values_mut() {
            m.current_replicas = 0;
            m.desired_replicas = 0;
            m.last_scaling_progress_time = None;
        }
        s
    };
    without_counts(a) == without_counts(b)
}

/// The DSO's `pollingInterval` (KEDA's default 30 s).
fn polling_interval(dso: &DistributedScaledObject) -> std::time::Duration {
    let seconds = dso
        .spec
        .scaled_object_spec
        .polling_interval
        .unwrap_or(DEFAULT_POLLING_INTERVAL)
        .max(1);
    std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(30))
}

/// The DSO's `kedge-pod-metrics` triggers as the scrapes of its members: each member's
/// workload, and the ready pods it last reported there.
fn pod_metrics_triggers(
    dso: &DistributedScaledObject,
    names: &BTreeSet<String>,
    targets: &Targets<'_>,
    snapshots: &BTreeMap<String, crate::fleet::MemberSnapshot>,
) -> Vec<Configured> {
    let members: Vec<ConfiguredMember> = names
        .iter()
        .map(|member| {
            let workload = targets.of(member);
            let ready_pods = snapshots
                .get(member)
                .and_then(|s| s.workloads.get(&workload))
                .map_or(0, |w| u32::try_from(w.ready_replicas).unwrap_or(0));
            ConfiguredMember {
                member: member.clone(),
                workload,
                ready_pods,
            }
        })
        .collect();
    dso.spec
        .scaled_object_spec
        .triggers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.type_ == podmetrics::TRIGGER_TYPE)
        .filter_map(|(index, t)| {
            let at = format!("spec.scaledObjectSpec.triggers[{index}]");
            // Validated before: a trigger that does not parse is never configured.
            let trigger = podmetrics::PodMetricsTrigger::parse(&at, &t.metadata).ok()?;
            Some(Configured {
                index: u32::try_from(index).ok()?,
                key: trigger_key(t).to_owned(),
                trigger,
                interval: polling_interval(dso),
                members: members.clone(),
            })
        })
        .collect()
}

async fn write_status(
    ctx: &DsoContext,
    namespace: &str,
    name: &str,
    status: &DistributedScaledObjectStatus,
) -> Result<()> {
    super::write_status::<DistributedScaledObject>(&ctx.shared, CONTROLLER, namespace, name, status)
        .await
}

/// Whether the DSO has a `kedge-pod-metrics` trigger.
pub fn has_pod_metrics(dso: &DistributedScaledObject) -> bool {
    dso.spec
        .scaled_object_spec
        .triggers
        .iter()
        .any(|t| t.type_ == podmetrics::TRIGGER_TYPE)
}

/// The child KEDA ScaledObject of a DSO, from the one builder
/// ([`kedge_core::keda_object::child_of_dso`]); its `kedge-pod-metrics` triggers call the
/// hub's external scaler at `scaler_address`.
pub fn scaled_object(
    dso: &DistributedScaledObject,
    namespace: &str,
    name: &str,
    scaler_address: Option<&str>,
) -> Result<Value> {
    let owner = dso.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "DistributedScaledObject",
        field: "metadata.uid",
    })?;
    let scaler = scaler_address.map(|address| ExternalScaler {
        address,
        authentication: certs::TRIGGER_AUTHENTICATION,
    });
    let object = keda_object::child_of_dso(dso, namespace, name, owner, scaler);
    serde_json::to_value(object).map_err(|source| Error::Serialize {
        what: "scaledObjectSpec",
        source,
    })
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
    ctx: &DsoContext,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let object = scaled_object(dso, namespace, name, ctx.scaler_address())?;
    if ctx
        .cached_scaled_object(namespace, name)
        .is_some_and(|current| in_place(&current, &object))
    {
        return Ok(());
    }
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.shared.client.clone(),
        namespace,
        &super::scaled_object_resource(),
    );
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
    use serde_json::json;

    #[test]
    fn a_pod_metrics_trigger_becomes_an_external_trigger_with_the_dead_zone() {
        let dso: DistributedScaledObject = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "llm", "namespace": "ai", "uid": "u-1"},
            "spec": {"scaledObjectSpec": {
                "scaleTargetRef": {"name": "vllm"},
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                    "scaleDown": {"tolerance": 0.2, "stabilizationWindowSeconds": 300}}}},
                "triggers": [
                    {"type": "cpu", "metadata": {"value": "50"}},
                    {"type": "kedge-pod-metrics", "name": "queue", "metadata": {"threshold": "4"}}
                ]
            }}
        }))
        .unwrap();
        assert!(has_pod_metrics(&dso));
        let so = scaled_object(&dso, "ai", "llm", Some("kedge-hub.kedge-system.svc:9090")).unwrap();
        let triggers = &so["spec"]["triggers"];
        assert_eq!(triggers[0]["type"], "cpu");
        assert_eq!(
            triggers[1],
            json!({
                "type": "external", "name": "queue", "metricType": "AverageValue",
                "metadata": {"threshold": "4", "scalerAddress": "kedge-hub.kedge-system.svc:9090",
                    "kedgeTrigger": "1"},
                "authenticationRef": {"name": "kedge-scaler", "kind": "ClusterTriggerAuthentication"}
            })
        );
        // The DSO's own tolerance wins; the direction it leaves open gets the dead zone.
        let behavior = &so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
        assert_eq!(behavior["scaleUp"]["tolerance"], "0.1");
        assert_eq!(behavior["scaleDown"]["tolerance"], "0.2");
        assert_eq!(behavior["scaleDown"]["stabilizationWindowSeconds"], 300);
        // Without a scaler nothing is rewritten (the controller refuses to apply it).
        let plain = scaled_object(&dso, "ai", "llm", None).unwrap();
        assert_eq!(plain["spec"]["triggers"][1]["type"], "kedge-pod-metrics");
    }

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
        let so = scaled_object(&dso, "default", "nginx", None).unwrap();
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
        let wanted = scaled_object(&dso, "default", "nginx", None).unwrap();
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
