//! The StatefulSet controller: ordinal pods, ordered or parallel.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::events::record_event;
use super::{
    MAX_CREATES_PER_PASS, PODS, STATEFULSETS, delete, deleting, int, name_of, new_pod, ns_name,
    owned_by, pod_ready, set_status, snapshot, strip_zero, template_hash, uid_of,
};
use crate::store::{Obj, Store};
use crate::util::get_path;

pub(super) fn statefulsets(store: &mut Store, now: i64) {
    let pods = snapshot(store, PODS);
    for s in snapshot(store, STATEFULSETS) {
        if deleting(&s) {
            continue;
        }
        let uid = uid_of(&s);
        let name = name_of(&s);
        let want = int(&s, "spec.replicas").max(0);
        let parallel =
            get_path(&s, "spec.podManagementPolicy").and_then(Value::as_str) == Some("Parallel");
        let template = get_path(&s, "spec.template").cloned().unwrap_or(json!({}));
        let mine: HashMap<i64, &Obj> = owned_by(&pods, &uid)
            .filter(|p| !deleting(p))
            .filter_map(|p| {
                let n = name_of(p);
                let ord = n.strip_prefix(&format!("{name}-"))?.parse::<i64>().ok()?;
                Some((ord, p))
            })
            .collect();
        let hash = template_hash(&template);
        for ord in 0..want.min(mine.len() as i64 + MAX_CREATES_PER_PASS as i64) {
            if mine.contains_key(&ord) {
                continue;
            }
            let all_lower_ready = (0..ord).all(|o| mine.get(&o).is_some_and(|p| pod_ready(p)));
            if !parallel && !all_lower_ready {
                break;
            }
            let pod_name = format!("{name}-{ord}");
            let mut pod = new_pod(
                "StatefulSet",
                "apps/v1",
                &s,
                &template,
                pod_name.clone(),
                &[
                    ("statefulset.kubernetes.io/pod-name", pod_name),
                    ("apps.kubernetes.io/pod-index", ord.to_string()),
                    ("controller-revision-hash", format!("{name}-{hash}")),
                ],
            );
            pod["spec"]["hostname"] = json!(format!("{name}-{ord}"));
            if store.create_internal(PODS, pod, now).is_ok() {
                let msg = format!("create Pod {name}-{ord} in StatefulSet {name} successful");
                record_event(
                    store,
                    &s,
                    false,
                    "SuccessfulCreate",
                    &msg,
                    "statefulset-controller",
                    now,
                );
            }
            if !parallel {
                break;
            }
        }
        let mut extra: Vec<i64> = mine.keys().copied().filter(|o| *o >= want).collect();
        extra.sort_unstable_by(|a, b| b.cmp(a));
        let take = if parallel {
            extra.len()
        } else {
            extra.len().min(1)
        };
        for ord in extra.into_iter().take(take) {
            delete(store, PODS, &ns_name(&s), &format!("{name}-{ord}"), now);
        }
        let pods_now: Vec<Obj> = store.list(PODS, Some(&ns_name(&s))).cloned().collect();
        let live: Vec<&Obj> = owned_by(&pods_now, &uid).filter(|p| !deleting(p)).collect();
        let ready = live.iter().filter(|p| pod_ready(p)).count() as i64;
        let mut status = json!({
            "observedGeneration": int(&s, "metadata.generation"),
            "replicas": live.len(), "readyReplicas": ready, "currentReplicas": live.len(),
            "updatedReplicas": live.len(), "availableReplicas": ready,
            "currentRevision": format!("{name}-{hash}"), "updateRevision": format!("{name}-{hash}"),
            "collisionCount": 0,
        });
        strip_zero(
            &mut status,
            &[
                "readyReplicas",
                "availableReplicas",
                "currentReplicas",
                "updatedReplicas",
            ],
        );
        set_status(store, STATEFULSETS, &s, status, now);
    }
}
