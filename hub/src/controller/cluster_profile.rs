//! Publishes one SIG-Multicluster `ClusterProfile` per MemberCluster (see
//! `docs/cluster-inventory.md`): what `kedge_core::crd::cluster_profile::profile` makes of
//! the MemberCluster cache (and, with the DSJ controller, of the DSJ taints), server-side
//! applied into one namespace when it differs from what was published, and deleted when its
//! member goes. Without the ClusterProfile CRD in the hub cluster it warns once and looks
//! again every [`CRD_RETRY`]; the other controllers never wait for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use kedge_core::crd::DistributedScaledJob;
use kedge_core::crd::cluster_profile::{
    CLUSTER_MANAGER, ClusterProfile, LABEL_CLUSTER_MANAGER, MemberTaint, differs, profile,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{FIELD_MANAGER, Shared, bounded};
use crate::{Error, Result};
use kedge_net::kube_client::LIST_PAGE;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "clusterprofile";
/// How often the MemberCluster cache is compared with what was published: a change shows in
/// a profile within this (and the MemberCluster status writer's own delay).
const PASS: Duration = Duration::from_secs(2);
/// How often the published profiles are listed again, so that one edited or deleted by
/// someone else is written again and one of a member deleted meanwhile goes.
const RELIST: Duration = Duration::from_secs(300);
/// How long after finding no ClusterProfile CRD the hub looks again.
pub const CRD_RETRY: Duration = Duration::from_secs(60);
/// How long a profile the API server refused (a foreign one of the same name, a missing
/// namespace) is left alone before it is tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);
/// Writes (and deletes) one pass keeps in flight.
const WRITES_IN_FLIGHT: usize = 8;
/// Most writes one pass sends; the rest still differ next pass. Bounds a pass after a
/// restart of a large fleet's hub to a few seconds.
const WRITES_PER_PASS: usize = 256;

/// The publisher's context.
pub struct ProfileContext {
    /// What every controller shares (the MemberCluster cache among it).
    pub shared: Arc<Shared>,
    /// Where the profiles go (`--cluster-profile-namespace`).
    pub namespace: String,
    /// DistributedScaledJobs, for their taints; `None` without the DSJ controller.
    pub dsjs: Option<Store<DistributedScaledJob>>,
}

impl std::fmt::Debug for ProfileContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileContext")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Why listing the published profiles failed.
#[derive(Debug)]
enum ListError {
    /// The hub cluster serves no `clusterprofiles.multicluster.x-k8s.io`.
    NoCrd,
    /// Anything else (retried with backoff).
    Other(Error),
}

/// Whether `error` is the API server not knowing the resource at all (no CRD): a 404 on a
/// list, which a missing namespace does not cause.
fn no_such_resource(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(status)) if status.code == 404)
}

/// The warning for a hub cluster without the ClusterProfile CRD, once.
fn warn_no_crd(namespace: &str) {
    warn!(
        namespace,
        retry_in = ?CRD_RETRY,
        "the hub cluster has no ClusterProfile CRD (clusterprofiles.multicluster.x-k8s.io), so no \
         ClusterProfiles are published; everything else works. Install it: \
         kubectl create -f deploy/crds/clusterprofiles.multicluster.x-k8s.io.yaml (or \
         `kubectl kedge crds | kubectl create -f -`, which leaves existing CRDs alone), or turn \
         publishing off with --cluster-profiles=false"
    );
}

/// Publishes ClusterProfiles until `shutdown`.
pub async fn run(ctx: Arc<ProfileContext>, shutdown: CancellationToken) {
    let mut published: Option<BTreeMap<String, ClusterProfile>> = None;
    let mut up_to_date = UpToDate::default();
    let mut listed = tokio::time::Instant::now();
    let mut refused: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut no_crd = false;
    let mut relist = false;
    let mut backoff = Duration::ZERO;
    info!(namespace = %ctx.namespace, "ClusterProfile publisher started");
    loop {
        let wait = match published.as_mut() {
            Some(published) if !relist && listed.elapsed() < RELIST => {
                ctx.shared.metrics.reconciled(CONTROLLER);
                match pass(&ctx, published, &mut up_to_date, &mut refused).await {
                    Ok(()) => {
                        backoff = Duration::ZERO;
                        PASS
                    }
                    Err(error) => {
                        // The CRD (or the namespace) went away: list again, which tells.
                        relist = no_such_resource(&error);
                        failed(&ctx, &error, &mut backoff)
                    }
                }
            }
            _ => match list(&ctx).await {
                Ok(now) => {
                    if no_crd {
                        info!("the ClusterProfile CRD is there now; publishing ClusterProfiles");
                    }
                    no_crd = false;
                    published = Some(now);
                    up_to_date = UpToDate::default();
                    listed = tokio::time::Instant::now();
                    relist = false;
                    Duration::ZERO
                }
                Err(ListError::NoCrd) => {
                    if !no_crd {
                        warn_no_crd(&ctx.namespace);
                    }
                    no_crd = true;
                    published = None;
                    CRD_RETRY
                }
                Err(ListError::Other(error)) => failed(&ctx, &error, &mut backoff),
            },
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Logs and counts a failed pass or list; the wait before the next: 1 s doubling to 30 s.
fn failed(ctx: &ProfileContext, error: &Error, backoff: &mut Duration) -> Duration {
    warn!(%error, "ClusterProfiles not published");
    ctx.shared
        .metrics
        .reconcile_failed(CONTROLLER, error.metric_label());
    *backoff = (*backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
    *backoff
}

/// The profiles this hub published (labelled as kedge's), by name, listed in pages
/// ([`LIST_PAGE`]): a relist of 10,000 members' profiles at once was a 16 MB response
/// decoded at once (about 80 MB with what it held), every 5 minutes, and the hub's RSS kept
/// 50 MB of that peak (docs/scale.md, ninth round).
async fn list(ctx: &ProfileContext) -> Result<BTreeMap<String, ClusterProfile>, ListError> {
    let api: Api<ClusterProfile> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let params =
        ListParams::default().labels(&format!("{LABEL_CLUSTER_MANAGER}={CLUSTER_MANAGER}"));
    let listed =
        kedge_net::kube_client::list_paged(&api, &params, LIST_PAGE, |p| (p.name_any(), kept(p)));
    match bounded("list ClusterProfiles", listed).await {
        Ok(profiles) => Ok(profiles.into_iter().collect()),
        Err(e) if no_such_resource(&e) => Err(ListError::NoCrd),
        Err(e) => Err(ListError::Other(e)),
    }
}

/// What the publisher keeps of a listed profile, one per member for the hub's life: not who
/// manages which field, which nothing here reads. As serde's tree, a kedge profile's
/// `managedFields` (about 550 bytes of JSON) took about 7 KB of heap, more than the rest of
/// the profile, for every member from the first relist on (docs/scale.md, ninth round).
fn kept(mut profile: ClusterProfile) -> ClusterProfile {
    profile.metadata.managed_fields = None;
    profile
}

/// The DSJ taints by member, from every DSJ's `status.scheduling.taints`.
fn taints(dsjs: Option<&Store<DistributedScaledJob>>) -> BTreeMap<String, Vec<MemberTaint>> {
    let mut by_member: BTreeMap<String, Vec<MemberTaint>> = BTreeMap::new();
    for dsj in dsjs.map(Store::state).unwrap_or_default() {
        let owner = format!("{}/{}", dsj.namespace().unwrap_or_default(), dsj.name_any());
        let records = dsj
            .status
            .as_ref()
            .and_then(|s| s.scheduling.as_ref())
            .map(|s| s.taints.as_slice());
        for taint in records.unwrap_or_default() {
            by_member
                .entry(taint.member.clone())
                .or_default()
                .push(MemberTaint {
                    dsj: owner.clone(),
                    taint: taint.clone(),
                });
        }
    }
    by_member
}

/// The members whose published profile was last found to be what their inputs make: the
/// MemberCluster (the cache's object, the same `Arc` until it changes) and its DSJ taints,
/// good until the first of those taints ends. A pass does not build such a member's profile
/// again: at 10,000 members building and comparing every profile every [`PASS`] was about
/// 16 millicores of an idle hub (docs/scale.md, seventh round). Emptied when the published
/// profiles are listed again, so that one changed by someone else is found.
#[derive(Debug, Default)]
pub struct UpToDate(BTreeMap<String, Inputs>);

/// What one member's profile was built from.
#[derive(Debug)]
struct Inputs {
    member: Arc<kedge_core::crd::MemberCluster>,
    taints: Vec<MemberTaint>,
    /// When the first of `taints` ends (its value then changes).
    until: Option<SystemTime>,
}

impl UpToDate {
    /// Whether `name`'s profile was up to date with these inputs, and still is at `now`.
    fn holds(
        &self,
        name: &str,
        member: &Arc<kedge_core::crd::MemberCluster>,
        taints: &[MemberTaint],
        now: SystemTime,
    ) -> bool {
        self.0.get(name).is_some_and(|seen| {
            Arc::ptr_eq(&seen.member, member)
                && seen.taints == taints
                && seen.until.is_none_or(|until| now < until)
        })
    }

    /// Records that `name`'s published profile is what `member` and `taints` make at `now`.
    fn record(
        &mut self,
        name: String,
        member: &Arc<kedge_core::crd::MemberCluster>,
        taints: &[MemberTaint],
        now: SystemTime,
    ) {
        let ends = taints
            .iter()
            .flat_map(|t| [&t.taint.hard_until, &t.taint.soft_until]);
        let until = ends
            .flatten()
            .map(kedge_core::time::from_time)
            .filter(|end| *end > now)
            .min();
        let inputs = Inputs {
            member: member.clone(),
            taints: taints.to_vec(),
            until,
        };
        self.0.insert(name, inputs);
    }
}

/// What one pass makes of the members.
#[derive(Debug, Default)]
pub struct Plan {
    /// The profiles that differ from what was published.
    pub writes: Vec<ClusterProfile>,
    /// Published profiles of members no longer registered.
    pub gone: Vec<String>,
    /// Profiles built (those of members whose inputs changed, or not yet up to date).
    pub built: usize,
}

/// The profiles to write (those that differ from `published`) and the names to delete (of
/// members no longer registered), for `members` at `now`. Members `up_to_date` says are
/// unchanged are skipped; it learns which are.
pub fn plan(
    members: &[Arc<kedge_core::crd::MemberCluster>],
    namespace: &str,
    taints: &BTreeMap<String, Vec<MemberTaint>>,
    published: &BTreeMap<String, ClusterProfile>,
    now: SystemTime,
    up_to_date: &mut UpToDate,
) -> Plan {
    let mut plan = Plan::default();
    let mut names = std::collections::BTreeSet::new();
    for member in members {
        let name = member.name_any();
        if name.is_empty() {
            continue;
        }
        let current = published.get(&name);
        let member_taints = taints.get(&name).map(Vec::as_slice).unwrap_or_default();
        if current.is_some() && up_to_date.holds(&name, member, member_taints, now) {
            names.insert(name);
            continue;
        }
        plan.built += 1;
        let wanted = profile(
            member,
            namespace,
            member_taints,
            current.and_then(|p| p.status.as_ref()),
            now,
        );
        if differs(current, &wanted) {
            // Up to date once written: the next pass finds it so.
            up_to_date.0.remove(&name);
            plan.writes.push(wanted);
        } else {
            up_to_date.record(name.clone(), member, member_taints, now);
        }
        names.insert(name);
    }
    up_to_date.0.retain(|name, _| names.contains(name));
    plan.gone = published
        .keys()
        .filter(|name| !names.contains(*name))
        .cloned()
        .collect();
    plan
}

/// One pass: writes what differs and deletes what lost its member, [`WRITES_IN_FLIGHT`] at a
/// time, at most [`WRITES_PER_PASS`] of each. A refused profile is left for
/// [`REFUSED_RETRY`]; any other failure ends the pass with the first error, after the rest
/// went.
async fn pass(
    ctx: &ProfileContext,
    published: &mut BTreeMap<String, ClusterProfile>,
    up_to_date: &mut UpToDate,
    refused: &mut BTreeMap<String, tokio::time::Instant>,
) -> Result<()> {
    let members = ctx.shared.member_clusters().await?;
    let Plan { writes, gone, .. } = plan(
        &members,
        &ctx.namespace,
        &taints(ctx.dsjs.as_ref()),
        published,
        SystemTime::now(),
        up_to_date,
    );
    refused.retain(|_, at| at.elapsed() < REFUSED_RETRY);
    let writes: Vec<ClusterProfile> = writes
        .into_iter()
        .filter(|p| !refused.contains_key(&p.name_any()))
        .take(WRITES_PER_PASS)
        .collect();
    let written = write_all(ctx, writes, published, refused).await;
    let deleted = delete_all(ctx, gone, published).await;
    written.and(deleted)
}

/// Applies `writes`, recording each one applied in `published` and each one refused for
/// itself alone in `refused`.
async fn write_all(
    ctx: &ProfileContext,
    writes: Vec<ClusterProfile>,
    published: &mut BTreeMap<String, ClusterProfile>,
    refused: &mut BTreeMap<String, tokio::time::Instant>,
) -> Result<()> {
    let mut results = futures::stream::iter(writes)
        .map(|p| async move {
            let result = apply(ctx, &p).await;
            (p, result)
        })
        .buffer_unordered(WRITES_IN_FLIGHT);
    let mut first_error = None;
    while let Some((p, result)) = results.next().await {
        let name = p.name_any();
        match result {
            Ok(()) => {
                ctx.shared.metrics.status_written(CONTROLLER);
                published.insert(name, p);
            }
            // Refused for this profile alone (a foreign profile of the same name whose
            // cluster manager cannot change, a missing namespace): the others still go.
            Err(Error::Kube(kube::Error::Api(status)))
                if status.code != 404 && status.code != 429 && status.code < 500 =>
            {
                warn!(profile = %name, namespace = %ctx.namespace, error = %status.message,
                    retry_in = ?REFUSED_RETRY, "ClusterProfile refused");
                refused.insert(name, tokio::time::Instant::now());
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Deletes the profiles named in `gone` (one already gone counts as deleted), and forgets
/// them in `published`.
async fn delete_all(
    ctx: &ProfileContext,
    gone: Vec<String>,
    published: &mut BTreeMap<String, ClusterProfile>,
) -> Result<()> {
    let api: Api<ClusterProfile> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let deletes = futures::stream::iter(gone.into_iter().take(WRITES_PER_PASS))
        .map(|name| {
            let api = api.clone();
            async move {
                let result = bounded(
                    "delete ClusterProfile",
                    api.delete(&name, &DeleteParams::default()),
                )
                .await;
                (name, result)
            }
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let mut first_error = None;
    for (name, result) in deletes {
        match result {
            Ok(_) => {
                info!(profile = %name, "member gone; ClusterProfile deleted");
                published.remove(&name);
            }
            Err(Error::Kube(kube::Error::Api(status))) if status.code == 404 => {
                published.remove(&name);
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Server-side applies `p`: labels and spec, then its status (a subresource, which an apply
/// of the object ignores).
async fn apply(ctx: &ProfileContext, p: &ClusterProfile) -> Result<()> {
    let api: Api<ClusterProfile> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let name = p.name_any();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let api_version = ClusterProfile::api_version(&());
    let object = json!({
        "apiVersion": api_version,
        "kind": "ClusterProfile",
        "metadata": {"name": name, "labels": p.metadata.labels},
        "spec": p.spec,
    });
    bounded(
        "apply ClusterProfile",
        api.patch(&name, &params, &Patch::Apply(&object)),
    )
    .await?;
    let status = json!({
        "apiVersion": api_version,
        "kind": "ClusterProfile",
        "status": p.status,
    });
    bounded(
        "apply ClusterProfile status",
        api.patch_status(&name, &params, &Patch::Apply(&status)),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use kedge_core::crd::cluster_profile::{CONDITION_CONTROL_PLANE_HEALTHY, PROPERTY_TAINTS};
    use kedge_core::crd::{MemberCluster, MemberClusterSpec, MemberClusterStatus};

    use super::*;

    fn member(name: &str, state: &str) -> Arc<MemberCluster> {
        let mut m = MemberCluster::new(name, MemberClusterSpec::default());
        m.status = Some(MemberClusterStatus {
            state: Some(state.to_owned()),
            kubernetes_version: Some("v1.33.0".into()),
            ..Default::default()
        });
        Arc::new(m)
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A listed profile is kept without its managed fields, and is no different for that:
    /// the next pass does not write it again.
    #[test]
    fn a_listed_profile_is_kept_without_managed_fields_and_still_up_to_date() {
        let wanted = profile(&member("edge-1", "Ready"), "kedge-fleet", &[], None, at(10));
        let mut listed = serde_json::to_value(&wanted).unwrap();
        // As the API server returns it: kedge's two entries (the object and its status).
        listed["metadata"]["managedFields"] = json!([
            {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:x-k8s.io/cluster-manager": {}}},
                          "f:spec": {"f:clusterManager": {"f:name": {}}, "f:displayName": {}}},
             "manager": "kedge-hub", "operation": "Apply", "time": "2026-11-29T00:59:13Z"},
            {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:status": {"f:conditions": {}, "f:properties": {},
                                       "f:version": {"f:kubernetes": {}}}},
             "manager": "kedge-hub", "operation": "Apply", "subresource": "status",
             "time": "2026-11-29T00:59:13Z"},
        ]);
        let listed: ClusterProfile = serde_json::from_value(listed).unwrap();
        assert_eq!(
            listed.metadata.managed_fields.as_ref().map(Vec::len),
            Some(2)
        );
        let kept = kept(listed);
        assert_eq!(kept.metadata.managed_fields, None);
        assert!(!differs(Some(&kept), &wanted));
    }

    fn healthy(p: &ClusterProfile) -> &str {
        let conditions = &p.status.as_ref().unwrap().conditions;
        let c = conditions
            .iter()
            .find(|c| c.type_ == CONDITION_CONTROL_PLANE_HEALTHY)
            .unwrap();
        c.status.as_str()
    }

    /// Publishes `writes` into `published`, as a pass whose writes all succeed does.
    fn publish(published: &mut BTreeMap<String, ClusterProfile>, writes: Vec<ClusterProfile>) {
        published.extend(writes.into_iter().map(|p| (p.name_any(), p)));
    }

    #[test]
    fn a_pass_writes_new_and_changed_profiles_only_and_deletes_those_of_gone_members() {
        let none = BTreeMap::new();
        let mut seen = UpToDate::default();
        let members = [member("a", "Ready"), member("b", "Pending")];
        let Plan { writes, gone, .. } = plan(
            &members,
            "fleet",
            &none,
            &BTreeMap::new(),
            at(100),
            &mut seen,
        );
        assert_eq!(writes.len(), 2);
        assert!(gone.is_empty());
        let mut published = BTreeMap::new();
        publish(&mut published, writes);
        // Nothing changed but the clock: nothing to write.
        let Plan { writes, gone, .. } =
            plan(&members, "fleet", &none, &published, at(200), &mut seen);
        assert!(writes.is_empty() && gone.is_empty());
        // `a` lost, `b` deleted, `c` new.
        let members = [member("a", "Unreachable"), member("c", "Ready")];
        let Plan { writes, gone, .. } =
            plan(&members, "fleet", &none, &published, at(300), &mut seen);
        let written: Vec<(String, &str)> =
            writes.iter().map(|p| (p.name_any(), healthy(p))).collect();
        assert_eq!(
            written,
            [("a".to_owned(), "False"), ("c".to_owned(), "True")]
        );
        assert_eq!(gone, ["b"]);
    }

    #[test]
    fn taints_are_gathered_by_member_and_a_new_one_is_a_change() {
        let (store, mut writer) = kube::runtime::reflector::store::<DistributedScaledJob>();
        let dsj: DistributedScaledJob = serde_json::from_value(json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledJob",
            "metadata": {"name": "etl", "namespace": "batch"},
            "spec": {"scaledJobSpec": {"jobTargetRef": {"template": {"spec": {"containers": []}}}}},
            "status": {"scheduling": {"taints": [
                {"member": "a", "hardUntil": "1970-01-01T01:00:00Z"}]}}
        }))
        .expect("a DSJ");
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(dsj));
        let by_member = taints(Some(&store));
        assert_eq!(by_member["a"][0].dsj, "batch/etl");
        assert!(!by_member.contains_key("b"));
        let members = [member("a", "Ready")];
        let mut seen = UpToDate::default();
        let first = plan(
            &members,
            "fleet",
            &BTreeMap::new(),
            &BTreeMap::new(),
            at(100),
            &mut seen,
        );
        let mut published = BTreeMap::new();
        publish(&mut published, first.writes);
        let writes = plan(
            &members,
            "fleet",
            &by_member,
            &published,
            at(200),
            &mut seen,
        )
        .writes;
        assert_eq!(writes.len(), 1);
        let properties = &writes[0].status.as_ref().unwrap().properties;
        let taint = properties
            .iter()
            .find(|p| p.name == PROPERTY_TAINTS)
            .unwrap();
        assert_eq!(taint.value, "batch/etl:hard until 1970-01-01T01:00:00Z");
        assert!(taints(None).is_empty());
    }

    /// A DSJ's soft taint on `member` until `until` seconds.
    fn soft_taint(member: &str, until: u64) -> BTreeMap<String, Vec<MemberTaint>> {
        let taint = kedge_core::crd::dsj::TaintRecord {
            member: member.to_owned(),
            class: None,
            size: None,
            priority: None,
            soft_until: Some(kedge_core::time::to_time(at(until))),
            hard_until: None,
        };
        let dsj = "batch/etl".to_owned();
        BTreeMap::from([(member.to_owned(), vec![MemberTaint { dsj, taint }])])
    }

    #[test]
    fn a_member_whose_inputs_did_not_change_is_not_built_again_until_a_taint_ends() {
        let none = BTreeMap::new();
        let mut seen = UpToDate::default();
        let mut published = BTreeMap::new();
        let a = member("a", "Ready");
        let members = [a.clone(), member("b", "Ready")];
        let mut pass = |members: &[Arc<MemberCluster>], taints, now, seen: &mut UpToDate| {
            let plan = plan(members, "fleet", taints, &published, at(now), seen);
            let written: Vec<String> = plan.writes.iter().map(|p| p.name_any()).collect();
            publish(&mut published, plan.writes);
            (plan.built, written)
        };
        assert_eq!(pass(&members, &none, 100, &mut seen).0, 2);
        // Written last pass: built once more, found up to date, then left alone.
        assert_eq!(pass(&members, &none, 102, &mut seen), (2, vec![]));
        assert_eq!(pass(&members, &none, 104, &mut seen), (0, vec![]));
        // `b` changed (the cache holds a new object): only `b` is built, and nothing in it
        // that a profile shows changed.
        let members = [a.clone(), member("b", "Ready")];
        assert_eq!(pass(&members, &none, 106, &mut seen), (1, vec![]));
        // A taint on `a` until 300 s: built and written, then up to date until it ends.
        let tainted = soft_taint("a", 300);
        assert_eq!(
            pass(&members, &tainted, 200, &mut seen),
            (1, vec!["a".into()])
        );
        assert_eq!(pass(&members, &tainted, 202, &mut seen), (1, vec![]));
        assert_eq!(pass(&members, &tainted, 299, &mut seen), (0, vec![]));
        // It ended: `a`'s profile loses it.
        assert_eq!(
            pass(&members, &tainted, 301, &mut seen),
            (1, vec!["a".into()])
        );
        // Listed again (a profile edited by someone else): every member is built again.
        assert_eq!(
            pass(&members, &tainted, 303, &mut UpToDate::default()),
            (2, vec![])
        );
        // A member deleted: its profile goes, and it is forgotten.
        let plan = plan(
            &members[..1],
            "fleet",
            &tainted,
            &published,
            at(305),
            &mut seen,
        );
        assert_eq!(plan.gone, ["b"]);
        assert!(!seen.0.contains_key("b"));
    }

    #[test]
    fn only_a_missing_resource_counts_as_no_crd() {
        let api = |code: u16| {
            Error::Kube(kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            })))
        };
        assert!(no_such_resource(&api(404)));
        assert!(!no_such_resource(&api(403)));
        assert!(!no_such_resource(&Error::Timeout { what: "x" }));
    }
}
