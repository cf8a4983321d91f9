//! The garbage collector: ownerReferences and foreground deletion.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;

use super::{delete, deleting, name_of, ns_name, uid_of, write};
use crate::store::{FOREGROUND, Obj, Store, finalizers, owner_uids};
use crate::util::{meta_mut, meta_str};

/// Deletes objects whose owners are all gone, and finishes foreground deletions.
///
/// It runs after every write, so the uids are borrowed from the store, not copied: copying
/// every uid of a hub cluster with 1,000 MemberClusters into a set of new strings was half of
/// the simulator's CPU time under the fleet bench.
pub(super) fn garbage_collect(store: &mut Store, now: i64) {
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
