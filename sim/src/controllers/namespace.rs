//! The namespace controller: default ServiceAccounts, deletion of terminating namespaces.

use std::sync::Arc;

use serde_json::json;

use super::{NAMESPACES, def, delete, deleting, name_of, ns_name};
use crate::store::Store;

/// Terminating namespaces: delete their content, then the namespace. Active
/// namespaces get their `default` ServiceAccount, like the real controller.
pub(super) fn namespaces(store: &mut Store, now: i64) {
    let active: Vec<String> = store
        .list(NAMESPACES, None)
        .filter(|n| !deleting(n))
        .map(|n| name_of(n))
        .collect();
    for ns in active {
        if store.get("/serviceaccounts", &ns, "default").is_none() {
            let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
            let _ = store.create_internal("/serviceaccounts", sa, now);
        }
    }
    let terminating: Vec<String> = store
        .list(NAMESPACES, None)
        .filter(|n| deleting(n))
        .map(|n| name_of(n))
        .collect();
    for ns in terminating {
        let content: Vec<(Arc<str>, String)> = store
            .all_objects()
            .filter(|(_, o)| ns_name(o) == ns && !deleting(o))
            .map(|(k, o)| (k.clone(), name_of(o)))
            .collect();
        for (key, name) in &content {
            delete(store, key, &ns, name, now);
        }
        let remaining = store.all_objects().any(|(_, o)| ns_name(o) == ns);
        if !remaining && let Some(d) = def(store, NAMESPACES) {
            store.remove(&d, "", &ns, None);
        }
    }
}
