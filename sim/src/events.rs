//! The two Event APIs over one storage, as kube-apiserver serves them: core/v1 `events` and
//! events.k8s.io/v1 `events` read and write the same objects. An Event is stored in the shape
//! of the API that last wrote it and converted when the other API reads it, field by field as
//! upstream's `pkg/apis/events/v1/conversion.go` does, with the zero values Go's encoder
//! writes for the fields the target shape always carries.

use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;

/// The storage key both Event APIs use.
pub const KEY: &str = crate::resources::EVENTS_KEY;
/// apiVersion of the core Events API.
pub const CORE: &str = "v1";
/// apiVersion of the events.k8s.io Events API.
pub const EVENTS_V1: &str = "events.k8s.io/v1";

/// The fields that change name, as (core/v1, events.k8s.io/v1). The rest (metadata, reason,
/// type, action, related, series, eventTime, reportingInstance) keep theirs.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// How Go's encoder writes a field's zero value when no `omitempty` leaves it out.
#[derive(Debug, Clone, Copy)]
enum Zero {
    /// `metav1.Time`, `metav1.MicroTime`: `null`.
    Null,
    /// A struct (`ObjectReference`, `EventSource`): `{}`, `omitempty` or not.
    Object,
    /// A string without `omitempty`: `""`.
    EmptyString,
}

impl Zero {
    fn value(self) -> Value {
        match self {
            Zero::Null => Value::Null,
            Zero::Object => json!({}),
            Zero::EmptyString => json!(""),
        }
    }
}

/// What Go's encoder does with one Event type's empty fields.
#[derive(Debug)]
struct Shape {
    /// Left out when empty (`omitempty` strings, counts and pointers).
    omitted: &'static [&'static str],
    /// Always written, with their zero value when absent.
    always: &'static [(&'static str, Zero)],
}

const CORE_SHAPE: Shape = Shape {
    omitted: &[
        "reason", "message", "type", "action", "count", "series", "related",
    ],
    always: &[
        ("involvedObject", Zero::Object),
        ("source", Zero::Object),
        ("firstTimestamp", Zero::Null),
        ("lastTimestamp", Zero::Null),
        ("eventTime", Zero::Null),
        ("reportingComponent", Zero::EmptyString),
        ("reportingInstance", Zero::EmptyString),
    ],
};

const EVENTS_SHAPE: Shape = Shape {
    omitted: &[
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
        "note",
        "type",
        "deprecatedCount",
        "series",
        "related",
    ],
    always: &[
        ("eventTime", Zero::Null),
        ("regarding", Zero::Object),
        ("deprecatedSource", Zero::Object),
        ("deprecatedFirstTimestamp", Zero::Null),
        ("deprecatedLastTimestamp", Zero::Null),
    ],
};

/// Whether `def` is one of the two Event APIs.
pub fn shared(def: &ResourceDef) -> bool {
    &*def.key == KEY && def.kind == "Event"
}

/// `obj` in the shape of `api_version` when `def` is an Event API and `obj` is stored in the
/// other API's shape; `None` when no conversion is needed.
pub fn converted(def: &ResourceDef, api_version: &str, obj: &Value) -> Option<Value> {
    if !shared(def) || is_events_v1(api_version) == is_events_v1(stored_version(obj)) {
        return None;
    }
    Some(convert(obj, api_version))
}

/// The kind a field selector on `def` is checked for: events.k8s.io/v1 accepts other labels
/// than core/v1 (see [`crate::selector::EVENTS_V1_KIND`]).
pub fn field_kind(def: &ResourceDef) -> &str {
    if shared(def) && def.group == "events.k8s.io" {
        crate::selector::EVENTS_V1_KIND
    } else {
        &def.kind
    }
}

fn stored_version(obj: &Value) -> &str {
    obj.get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(CORE)
}

fn is_events_v1(api_version: &str) -> bool {
    api_version.starts_with("events.k8s.io/")
}

/// Converts an Event to the shape of `api_version` (`v1` or `events.k8s.io/v1`); its own
/// shape is read from its apiVersion, and an Event already in the target shape is returned
/// as it is. Fields the source shape does not have are dropped, as decoding into the source
/// type would have dropped them.
pub fn convert(obj: &Value, api_version: &str) -> Value {
    let to_events = is_events_v1(api_version);
    let Some(src) = obj
        .as_object()
        .filter(|_| is_events_v1(stored_version(obj)) != to_events)
    else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in src {
        if let Some(name) = target_name(k, to_events) {
            out.insert(name.to_string(), v.clone());
        }
    }
    out.insert("apiVersion".into(), json!(api_version));
    let shape = if to_events {
        &EVENTS_SHAPE
    } else {
        &CORE_SHAPE
    };
    out.retain(|k, v| !(shape.omitted.contains(&k.as_str()) && is_zero(v)));
    for &(field, zero) in shape.always {
        out.entry(field).or_insert_with(|| zero.value());
    }
    Value::Object(out)
}

/// The name of source field `k` in the target shape; `None` for a field only the target
/// shape has (the source type has no such field).
fn target_name(k: &str, to_events: bool) -> Option<&str> {
    let Some(&(core, events)) = RENAMED.iter().find(|&&(c, e)| k == c || k == e) else {
        return Some(k);
    };
    let (from, to) = if to_events {
        (core, events)
    } else {
        (events, core)
    };
    (k == from).then_some(to)
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_i64() == Some(0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_v1() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default", "resourceVersion": "7"},
            "eventTime": "2026-03-01T11:58:00.000000Z",
            "reportingController": "kedge-hub", "reportingInstance": "hub-0",
            "action": "Scale", "reason": "Scaled", "type": "Normal", "note": "to 3",
            "regarding": {"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
                          "name": "web", "namespace": "default", "uid": "u1"},
            "series": {"count": 2, "lastObservedTime": "2026-03-01T11:59:00.000000Z"},
        })
    }

    fn core_v1() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "p.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u2"},
            "reason": "Scheduled", "message": "assigned to node-0", "type": "Normal",
            "source": {"component": "default-scheduler"},
            "firstTimestamp": "2026-03-01T11:00:00Z", "lastTimestamp": "2026-03-01T11:05:00Z",
            "count": 3, "reportingComponent": "default-scheduler", "reportingInstance": "",
        })
    }

    #[test]
    fn events_v1_reads_as_core_with_go_zero_values() {
        let core = convert(&events_v1(), CORE);
        assert_eq!(
            core,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "web.1", "namespace": "default", "resourceVersion": "7"},
                "eventTime": "2026-03-01T11:58:00.000000Z",
                "reportingComponent": "kedge-hub", "reportingInstance": "hub-0",
                "action": "Scale", "reason": "Scaled", "type": "Normal", "message": "to 3",
                "involvedObject": {"apiVersion": "kedge.dev/v1alpha1",
                    "kind": "DistributedScaledObject", "name": "web", "namespace": "default",
                    "uid": "u1"},
                "series": {"count": 2, "lastObservedTime": "2026-03-01T11:59:00.000000Z"},
                "source": {}, "firstTimestamp": null, "lastTimestamp": null,
            })
        );
        // Back: the original plus the zero values events.k8s.io/v1 always carries.
        let mut want = events_v1();
        want["deprecatedSource"] = json!({});
        want["deprecatedFirstTimestamp"] = Value::Null;
        want["deprecatedLastTimestamp"] = Value::Null;
        assert_eq!(convert(&core, EVENTS_V1), want);
        assert_eq!(
            convert(&events_v1(), EVENTS_V1),
            events_v1(),
            "same shape: unchanged"
        );
    }

    #[test]
    fn core_reads_as_events_v1_with_go_zero_values() {
        let ev = convert(&core_v1(), EVENTS_V1);
        assert_eq!(
            ev,
            json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "p.1", "namespace": "default"},
                "regarding": {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u2"},
                "reason": "Scheduled", "note": "assigned to node-0", "type": "Normal",
                "deprecatedSource": {"component": "default-scheduler"},
                "deprecatedFirstTimestamp": "2026-03-01T11:00:00Z",
                "deprecatedLastTimestamp": "2026-03-01T11:05:00Z",
                "deprecatedCount": 3, "reportingController": "default-scheduler",
                "eventTime": null,
            })
        );
        // Back to core: the same object, `reportingInstance: ""` and the zero eventTime
        // included, as the server prints them.
        let mut want = core_v1();
        want["eventTime"] = Value::Null;
        assert_eq!(convert(&ev, CORE), want);
    }

    #[test]
    fn fields_the_source_shape_lacks_are_dropped() {
        let mut odd = core_v1();
        odd["note"] = json!("not a core field");
        let ev = convert(&odd, EVENTS_V1);
        assert_eq!(ev["note"], json!("assigned to node-0"));
        let mut odd = events_v1();
        odd["message"] = json!("not an events.k8s.io field");
        assert_eq!(convert(&odd, CORE)["message"], json!("to 3"));
    }

    #[test]
    fn only_the_other_shape_is_converted() {
        let defs = crate::resources::builtins();
        let def = |group: &str| {
            defs.iter()
                .find(|d| d.plural == "events" && d.group == group)
                .unwrap()
        };
        let (core, events) = (def(""), def("events.k8s.io"));
        assert_eq!(&*core.key, KEY);
        assert_eq!(core.key, events.key, "one storage behind both APIs");
        assert!(converted(core, CORE, &core_v1()).is_none());
        assert!(converted(events, EVENTS_V1, &events_v1()).is_none());
        assert_eq!(
            converted(core, CORE, &events_v1()),
            Some(convert(&events_v1(), CORE))
        );
        assert_eq!(
            converted(events, EVENTS_V1, &core_v1()),
            Some(convert(&core_v1(), EVENTS_V1))
        );
        let cm = defs.iter().find(|d| d.plural == "configmaps").unwrap();
        assert!(converted(cm, EVENTS_V1, &core_v1()).is_none());
        assert_eq!(field_kind(core), "Event");
        assert_eq!(field_kind(events), crate::selector::EVENTS_V1_KIND);
    }
}
