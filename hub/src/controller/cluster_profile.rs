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
                match pass(&ctx, published, &mut refused).await {
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

/// The profiles this hub published (labelled as kedge's), by name.
async fn list(ctx: &ProfileContext) -> Result<BTreeMap<String, ClusterProfile>, ListError> {
    let api: Api<ClusterProfile> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let params =
        ListParams::default().labels(&format!("{LABEL_CLUSTER_MANAGER}={CLUSTER_MANAGER}"));
    match bounded("list ClusterProfiles", api.list(&params)).await {
        Ok(list) => Ok(list.items.into_iter().map(|p| (p.name_any(), p)).collect()),
        Err(e) if no_such_resource(&e) => Err(ListError::NoCrd),
        Err(e) => Err(ListError::Other(e)),
    }
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

/// The profiles to write (those that differ from `published`) and the names to delete (of
/// members no longer registered), for `members` at `now`; profiles in `refused` wait.
pub fn plan(
    members: &[Arc<kedge_core::crd::MemberCluster>],
    namespace: &str,
    taints: &BTreeMap<String, Vec<MemberTaint>>,
    published: &BTreeMap<String, ClusterProfile>,
    now: SystemTime,
) -> (Vec<ClusterProfile>, Vec<String>) {
    let mut writes = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for member in members {
        let name = member.name_any();
        if name.is_empty() {
            continue;
        }
        let current = published.get(&name);
        let member_taints = taints.get(&name).map(Vec::as_slice).unwrap_or_default();
        let wanted = profile(
            member,
            namespace,
            member_taints,
            current.and_then(|p| p.status.as_ref()),
            now,
        );
        if differs(current, &wanted) {
            writes.push(wanted);
        }
        names.insert(name);
    }
    let gone = published
        .keys()
        .filter(|name| !names.contains(*name))
        .cloned()
        .collect();
    (writes, gone)
}

/// One pass: writes what differs and deletes what lost its member, [`WRITES_IN_FLIGHT`] at a
/// time, at most [`WRITES_PER_PASS`] of each. A refused profile is left for
/// [`REFUSED_RETRY`]; any other failure ends the pass with the first error, after the rest
/// went.
async fn pass(
    ctx: &ProfileContext,
    published: &mut BTreeMap<String, ClusterProfile>,
    refused: &mut BTreeMap<String, tokio::time::Instant>,
) -> Result<()> {
    let members = ctx.shared.member_clusters().await?;
    let (writes, gone) = plan(
        &members,
        &ctx.namespace,
        &taints(ctx.dsjs.as_ref()),
        published,
        SystemTime::now(),
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

    fn healthy(p: &ClusterProfile) -> &str {
        let conditions = &p.status.as_ref().unwrap().conditions;
        let c = conditions
            .iter()
            .find(|c| c.type_ == CONDITION_CONTROL_PLANE_HEALTHY)
            .unwrap();
        c.status.as_str()
    }

    #[test]
    fn a_pass_writes_new_and_changed_profiles_only_and_deletes_those_of_gone_members() {
        let none = BTreeMap::new();
        let members = [member("a", "Ready"), member("b", "Pending")];
        let (writes, gone) = plan(&members, "fleet", &none, &BTreeMap::new(), at(100));
        assert_eq!(writes.len(), 2);
        assert!(gone.is_empty());
        let published: BTreeMap<String, ClusterProfile> =
            writes.into_iter().map(|p| (p.name_any(), p)).collect();
        // Nothing changed but the clock: nothing to write.
        let (writes, gone) = plan(&members, "fleet", &none, &published, at(200));
        assert!(writes.is_empty() && gone.is_empty());
        // `a` lost, `b` deleted, `c` new.
        let members = [member("a", "Unreachable"), member("c", "Ready")];
        let (writes, gone) = plan(&members, "fleet", &none, &published, at(300));
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
        let (first, _) = plan(
            &members,
            "fleet",
            &BTreeMap::new(),
            &BTreeMap::new(),
            at(100),
        );
        let published = first.into_iter().map(|p| (p.name_any(), p)).collect();
        let (writes, _) = plan(&members, "fleet", &by_member, &published, at(200));
        assert_eq!(writes.len(), 1);
        let properties = &writes[0].status.as_ref().unwrap().properties;
        let taint = properties
            .iter()
            .find(|p| p.name == PROPERTY_TAINTS)
            .unwrap();
        assert_eq!(taint.value, "batch/etl:hard until 1970-01-01T01:00:00Z");
        assert!(taints(None).is_empty());
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
