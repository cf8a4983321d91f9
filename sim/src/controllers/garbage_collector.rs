//! The garbage collector: ownerReferences and foreground deletion.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;

use super::{delete, deleting, name_of, ns_name, uid_of, write};
use crate::store::{FOREGROUND, Obj, Store, finalizers, owner_uids};
use crate::util::{meta_mut, meta_str};

/// Deletes objects whose owners are all gone, and finishes foreground deletions.
///
/// It walks every object, so it runs only after a write that can give it work
/// ([`Store::gc_due`]), and the uids are borrowed from the store, not copied: copying every
/// uid of a hub cluster with 1,000 MemberClusters into a set of new strings was half of the
/// simulator's CPU time under the fleet bench.
pub(super) fn garbage_collect(store: &mut Store, now: i64) {
    if !std::mem::take(&mut store.gc_due) {
        return;
    }
    let (doomed, fg_owners, has_dependents) = {
        let uids: HashSet<&str> = store
            .all_objects()
            .map(|(_, o)| meta_str(o, "uid").unwrap_or_default())
            .collect();
        let fg_owners: HashSet<String> = store
            .all_objects()
            .filter(|(_, o)| deleting(o) && finalizers(o).iter().any(|f| f == FOREGROUND))
            .map(|(_, o)| uid_of(o))
            .collect();
        let mut doomed = Vec::new();
        let mut has_dependents: HashSet<String> = HashSet::new();
        for (key, o) in store.all_objects() {
            let owners: Vec<&str> = owner_uids(o).collect();
            if owners.is_empty() {
                continue;
            }
            for u in &owners {
                has_dependents.insert((*u).to_string());
            }
            let orphaned = owners.iter().all(|u| !uids.contains(*u));
            let fg = owners.iter().any(|u| fg_owners.contains(*u));
            if (orphaned || fg) && !deleting(o) {
                doomed.push((key.clone(), ns_name(o), name_of(o)));
            }
        }
        (doomed, fg_owners, has_dependents)
    };
    for (key, ns, name) in doomed {
        delete(store, &key, &ns, &name, now);
    }
    if fg_owners.is_empty() {
        return;
    }
    // Foreground owners without remaining dependents lose their finalizer.
    let finished: Vec<(Arc<str>, Obj)> = store
        .all_objects()
        .filter(|(_, o)| fg_owners.contains(&uid_of(o)) && !has_dependents.contains(&uid_of(o)))
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    for (key, o) in finished {
        let mut new = (*o).clone();
        let fins: Vec<String> = finalizers(&o)
            .into_iter()
            .filter(|f| f != FOREGROUND)
            .collect();
        meta_mut(&mut new).insert("finalizers".into(), json!(fins));
        write(store, &key, new, now);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::garbage_collect;
    use crate::store::{Propagation, Store, WriteScope};

    const CM: &str = "/configmaps";

    fn configmap(name: &str, owner_uid: Option<&str>) -> serde_json::Value {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}});
        if let Some(uid) = owner_uid {
            cm["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]);
        }
        cm
    }

    #[test]
    fn only_writes_that_can_orphan_or_finish_a_deletion_make_it_look() {
        let mut store = Store::new(100, 16, 0);
        let def = store.def(CM).unwrap();
        let owner = store
            .create(&def, "default", configmap("owner", None), 0)
            .unwrap();
        let uid = owner["metadata"]["uid"].as_str().unwrap().to_owned();
        store
            .create(&def, "default", configmap("dependent", Some(&uid)), 0)
            .unwrap();
        garbage_collect(&mut store, 0);
        assert!(!store.gc_due, "it has looked");

        // A write of an object without owners (a status, a Lease renewal) gives it no work.
        let mut changed = configmap("owner", None);
        changed["data"]["a"] = json!("2");
        store
            .update(&def, "default", "owner", changed, WriteScope::Main, 0)
            .unwrap();
        assert!(
            !store.gc_due,
            "an ownerless write must not make it walk every object"
        );

        // The owner's deletion does, and the dependent goes.
        store
            .delete(&def, "default", "owner", Propagation::Background, None, 0)
            .unwrap();
        assert!(store.gc_due);
        garbage_collect(&mut store, 0);
        assert!(
            store.get(CM, "default", "dependent").is_none(),
            "orphan collected"
        );

        // A dependent written with an owner that does not exist is collected too.
        store
            .create(&def, "default", configmap("stray", Some("no-such-uid")), 0)
            .unwrap();
        assert!(store.gc_due);
        garbage_collect(&mut store, 0);
        assert!(store.get(CM, "default", "stray").is_none());
    }
}
