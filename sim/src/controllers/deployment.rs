//! The Deployment controller: one ReplicaSet per pod template, status from its ReplicaSets.

use serde_json::json;

use super::events::record_event;
use super::{
    DEPLOYMENTS, REPLICASETS, condition, deleting, int, name_of, ns_name, owned_by, owner_ref,
    set_status, snapshot, strip_zero, template_hash, uid_of, write,
};
use crate::store::{Obj, Store};
use crate::util::get_path;

pub(super) fn deployments(store: &mut Store, now: i64) {
    let rss = snapshot(store, REPLICASETS);
    for d in snapshot(store, DEPLOYMENTS) {
        if deleting(&d) {
            continue;
        }
        let Some(template) = get_path(&d, "spec.template").cloned() else {
            continue;
        };
        let hash = template_hash(&template);
        let replicas = int(&d, "spec.replicas");
        let uid = uid_of(&d);
        let owned: Vec<&Obj> = owned_by(&rss, &uid).collect();
        let rs_name = format!("{}-{hash}", name_of(&d));
        let mut current = None;
        for rs in &owned {
            if name_of(rs) == rs_name {
                current = Some((*rs).clone());
            } else if int(rs, "spec.replicas") != 0 {
                let mut new = (***rs).clone();
                new["spec"]["replicas"] = json!(0);
                write(store, REPLICASETS, new, now);
            }
        }
        match &current {
            Some(rs) if int(rs, "spec.replicas") != replicas => {
                let old = int(rs, "spec.replicas");
                let mut new = (**rs).clone();
                new["spec"]["replicas"] = json!(replicas);
                write(store, REPLICASETS, new, now);
                let dir = if replicas > old { "up" } else { "down" };
                let msg = format!("Scaled {dir} replica set {rs_name} from {old} to {replicas}");
                record_event(
                    store,
                    &d,
                    false,
                    "ScalingReplicaSet",
                    &msg,
                    "deployment-controller",
                    now,
                );
            }
            Some(_) => {}
            None => {
                let mut selector = get_path(&d, "spec.selector").cloned().unwrap_or(json!({}));
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut tmpl = template.clone();
                tmpl["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut labels = get_path(&template, "metadata.labels")
                    .cloned()
                    .unwrap_or(json!({}));
                labels["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs_name, "namespace": ns_name(&d), "labels": labels,
                        "annotations": {"deployment.kubernetes.io/revision": "1", "deployment.kubernetes.io/desired-replicas": replicas.to_string()},
                        "ownerReferences": [owner_ref("apps/v1", "Deployment", &d)]},
                    "spec": {"replicas": replicas, "selector": selector, "template": tmpl},
                });
                let _ = store.create_internal(REPLICASETS, rs, now);
                let msg = format!("Scaled up replica set {rs_name} from 0 to {replicas}");
                record_event(
                    store,
                    &d,
                    false,
                    "ScalingReplicaSet",
                    &msg,
                    "deployment-controller",
                    now,
                );
            }
        }
        // Status from the ReplicaSets as they are now.
        let rss_now: Vec<Obj> = store
            .list(REPLICASETS, Some(&ns_name(&d)))
            .cloned()
            .collect();
        let owned: Vec<&Obj> = owned_by(&rss_now, &uid).collect();
        let sum = |p: &str| owned.iter().map(|rs| int(rs, p)).sum::<i64>();
        let updated = owned
            .iter()
            .find(|rs| name_of(rs) == rs_name)
            .map(|rs| int(rs, "status.replicas"))
            .unwrap_or(0);
        let total = sum("status.replicas");
        let available = sum("status.availableReplicas");
        let ready = sum("status.readyReplicas");
        let old = d.get("status");
        let avail_ok = available >= replicas;
        let progressing_done = updated == replicas && available >= replicas;
        let mut status = json!({
            "observedGeneration": int(&d, "metadata.generation"),
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "conditions": [
                condition("Available", avail_ok,
                    if avail_ok { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                    if avail_ok { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }, now, old),
                condition("Progressing", true,
                    if progressing_done { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                    &format!("ReplicaSet \"{rs_name}\" {}", if progressing_done { "has successfully progressed." } else { "is progressing." }), now, old),
            ],
        });
        if total - available > 0 {
            status["unavailableReplicas"] = json!(total - available);
        }
        strip_zero(
            &mut status,
            &[
                "readyReplicas",
                "availableReplicas",
                "updatedReplicas",
                "replicas",
            ],
        );
        set_status(store, DEPLOYMENTS, &d, status, now);
    }
}
