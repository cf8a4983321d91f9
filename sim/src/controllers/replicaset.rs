//! The ReplicaSet controller: creates and deletes pods to match `spec.replicas`.

use serde_json::json;

use super::events::record_event;
use super::{
    MAX_CREATES_PER_PASS, PODS, REPLICASETS, delete, deleting, int, name_of, new_pod, ns_name,
    owned_by, pod_ready, set_status, snapshot, strip_zero, terminal, uid_of,
};
use crate::store::{Obj, Store};
use crate::util::get_path;

pub(super) fn replicasets(store: &mut Store, now: i64) {
    let pods = snapshot(store, PODS);
    for rs in snapshot(store, REPLICASETS) {
        if deleting(&rs) {
            continue;
        }
        let uid = uid_of(&rs);
        let mut mine: Vec<&Obj> = owned_by(&pods, &uid)
            .filter(|p| !deleting(p) && !terminal(p))
            .collect();
        let want = int(&rs, "spec.replicas").max(0) as usize;
        let template = get_path(&rs, "spec.template").cloned().unwrap_or(json!({}));
        // Bounded per pass so a huge replica count cannot stall the cluster.
        for _ in mine.len()..want.min(mine.len() + MAX_CREATES_PER_PASS) {
            let name = format!("{}-{}", name_of(&rs), crate::util::name_suffix(5));
            let pod = new_pod("ReplicaSet", "apps/v1", &rs, &template, name.clone(), &[]);
            if store.create_internal(PODS, pod, now).is_ok() {
                let msg = format!("Created pod: {name}");
                record_event(
                    store,
                    &rs,
                    false,
                    "SuccessfulCreate",
                    &msg,
                    "replicaset-controller",
                    now,
                );
            }
        }
        if mine.len() > want {
            // Not-ready and unscheduled pods go first, like the real controller.
            mine.sort_by_key(|p| (pod_ready(p), get_path(p, "spec.nodeName").is_some()));
            for p in mine.iter().take(mine.len() - want) {
                delete(store, PODS, &ns_name(p), &name_of(p), now);
                let msg = format!("Deleted pod: {}", name_of(p));
                record_event(
                    store,
                    &rs,
                    false,
                    "SuccessfulDelete",
                    &msg,
                    "replicaset-controller",
                    now,
                );
            }
        }
        let pods_now: Vec<Obj> = store.list(PODS, Some(&ns_name(&rs))).cloned().collect();
        let live: Vec<&Obj> = owned_by(&pods_now, &uid)
            .filter(|p| !deleting(p) && !terminal(p))
            .collect();
        let ready = live.iter().filter(|p| pod_ready(p)).count() as i64;
        let mut status = json!({
            "replicas": live.len(), "fullyLabeledReplicas": live.len(), "readyReplicas": ready,
            "availableReplicas": ready, "observedGeneration": int(&rs, "metadata.generation"),
        });
        strip_zero(
            &mut status,
            &["readyReplicas", "availableReplicas", "fullyLabeledReplicas"],
        );
        set_status(store, REPLICASETS, &rs, status, now);
    }
}
