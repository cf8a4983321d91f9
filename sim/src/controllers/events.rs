//! Events: core v1 ones recorded by the controllers; every Event, of either API, expires after
//! its TTL.

use serde_json::{Value, json};

use super::{Timers, delete, name_of, ns_name, uid_of};
use crate::store::Store;
use crate::util::{meta_str, parse_rfc3339, rfc3339};

/// Core v1 Events live this long (kube-apiserver's default `--event-ttl`).
const EVENT_TTL_MS: i64 = 3_600_000;
const EVENTS: &str = crate::resources::EVENTS_KEY;

/// Records a core v1 Event about `obj`, as the real controllers do.
pub(super) fn record_event(
    store: &mut Store,
    obj: &Value,
    warning: bool,
    reason: &str,
    message: &str,
    component: &str,
    now: i64,
) {
    let ts = rfc3339(now);
    let name = format!("{}.{:016x}", name_of(obj), crate::util::random_u64());
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns_name(obj)},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "name": name_of(obj), "namespace": ns_name(obj), "uid": uid_of(obj),
            "resourceVersion": meta_str(obj, "resourceVersion").unwrap_or_default(),
        },
        "reason": reason, "message": message,
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": "",
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        "type": if warning { "Warning" } else { "Normal" },
    });
    let _ = store.create_internal(EVENTS, ev, now);
}

/// Deletes Events older than the TTL.
pub(super) fn expire_events(store: &mut Store, now: i64, timers: &mut Timers) {
    let mut expired = Vec::new();
    for e in store.list(EVENTS, None) {
        let created = meta_str(e, "creationTimestamp")
            .and_then(parse_rfc3339)
            .unwrap_or(now);
        if now >= created + EVENT_TTL_MS {
            expired.push((ns_name(e), name_of(e)));
        } else {
            timers.at(created + EVENT_TTL_MS);
        }
    }
    for (ns, name) in expired {
        delete(store, EVENTS, &ns, &name, now);
    }
}
