//! Server-side printing: `meta.k8s.io/v1` `Table`s, as kube-apiserver returns them for
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what `kubectl get` asks for).
//!
//! Columns and cells follow `pkg/printers/internalversion/printers.go` of Kubernetes 1.33
//! for the resources kedge uses (the column tables of `printers`); custom resources get their CRD's
//! `additionalPrinterColumns` (evaluated with [`crate::jsonpath`]) or the CRD default
//! `Age`; `customresourcedefinitions` and other resources get the apiserver's default
//! `Name`/`Created At` convertor. Ages use apimachinery's `duration.HumanDuration`.
//!
//! Limits: the pod `STATUS` column covers the common reasons (phase, `status.reason`, init
//! container progress, waiting/terminated reasons, `Terminating`) but not every corner of
//! `printPod` (e.g. sidecar restartable init containers); a CRD column whose JSONPath
//! does not parse yields empty cells instead of rejecting the CRD.

use std::borrow::Borrow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::jsonpath::JsonPath;

mod printers;

use printers::{NAME, builtin, pod_row_conditions};

/// What each row's `object` holds (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the server's default).
    #[default]
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the query parameter (`None`, `Metadata`, `Object`); anything else is the
    /// default.
    pub fn from_query(v: &str) -> Self {
        match v {
            "None" => IncludeObject::None,
            "Object" => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Builds the Table for `objects` of `resource` (plural, e.g. `pods`). For a custom
/// resource pass the served CRD version's `additionalPrinterColumns` (or `None`).
/// `objects` may be owned values or references (`&[Value]` or `&[&Value]`). The caller sets
/// `metadata.resourceVersion` (and `continue`) of the returned Table.
pub fn to_table<O: Borrow<Value>>(
    resource: &str,
    objects: &[O],
    printer_columns: Option<&Value>,
    now: SystemTime,
) -> Value {
    to_table_with(
        resource,
        objects,
        printer_columns,
        now,
        IncludeObject::Metadata,
    )
}

/// [`to_table`] with an explicit `includeObject`.
pub fn to_table_with<O: Borrow<Value>>(
    resource: &str,
    objects: &[O],
    printer_columns: Option<&Value>,
    now: SystemTime,
    include: IncludeObject,
) -> Value {
    let (columns, cells): (Vec<Value>, Cells) = match printer_columns {
        Some(Value::Array(cols)) if !cols.is_empty() => crd_columns(cols, now),
        Some(_) | None => builtin(resource, now),
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let o: &Value = o.borrow();
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells(o)));
            if printer_columns.is_none()
                && resource == "pods"
                && let Some(c) = pod_row_conditions(o)
            {
                row.insert("conditions".into(), c);
            }
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row.insert("object".into(), partial_metadata(o));
                }
                IncludeObject::Object => {
                    row.insert("object".into(), o.clone());
                }
            }
            Value::Object(row)
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// `o` as a `meta.k8s.io/v1` `PartialObjectMetadata`: its metadata only.
pub(crate) fn partial_metadata(o: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn s<'a>(o: &'a Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn i(o: &Value, pointer: &str) -> i64 {
    o.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn arr<'a>(o: &'a Value, pointer: &str) -> &'a [Value] {
    o.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn name(o: &Value) -> Value {
    Value::String(s(o, "/metadata/name").to_owned())
}

/// Parses an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, fractions and offsets allowed).
pub fn parse_rfc3339(t: &str) -> Option<SystemTime> {
    let b = t.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20 || b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) || b.get(13) != Some(&b':') {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut pos = 19;
    let mut nanos: u32 = 0;
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        let frac = t.get(start..pos)?;
        if frac.is_empty() {
            return None;
        }
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        nanos = digits.parse().ok()?;
    }
    let offset = match b.get(pos) {
        Some(b'Z' | b'z') if pos + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if pos + 6 == b.len() && b.get(pos + 3) == Some(&b':') => {
            let o = num(pos + 1..pos + 3)? * 3600 + num(pos + 4..pos + 6)? * 60;
            if *sign == b'+' { o } else { -o }
        }
        _ => return None,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// apimachinery's `duration.HumanDuration` of a signed number of seconds.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Seconds from `from` to `to`, negative if `to` is earlier.
fn seconds_between(from: SystemTime, to: SystemTime) -> i64 {
    match to.duration_since(from) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// `translateTimestampSince`: the age of an RFC 3339 timestamp, `<unknown>` if absent.
pub fn age(timestamp: &str, now: SystemTime) -> String {
    match parse_rfc3339(timestamp) {
        Some(t) => human_duration(seconds_between(t, now)),
        None if timestamp.is_empty() => "<unknown>".into(),
        None => "<invalid>".into(),
    }
}

fn age_cell(o: &Value, now: SystemTime) -> Value {
    Value::String(age(s(o, "/metadata/creationTimestamp"), now))
}

type Cells = Box<dyn Fn(&Value) -> Vec<Value>>;

/// Formats a time as RFC 3339 in UTC with second precision.
pub fn format_rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn crd_columns(cols: &[Value], now: SystemTime) -> (Vec<Value>, Cells) {
    let mut defs = vec![NAME.definition()];
    let mut evals: Vec<(Option<JsonPath>, String)> = Vec::new();
    for c in cols {
        let ty = s(c, "/type").to_owned();
        defs.push(json!({
            "name": s(c, "/name"),
            "type": ty,
            "format": s(c, "/format"),
            "description": s(c, "/description"),
            "priority": i(c, "/priority"),
        }));
        evals.push((JsonPath::parse(s(c, "/jsonPath")).ok(), ty));
    }
    (
        defs,
        Box::new(move |o| {
            let mut cells = vec![name(o)];
            for (path, ty) in &evals {
                let first = path.as_ref().and_then(|p| p.find(o).into_iter().next());
                cells.push(match first {
                    None | Some(Value::Null) => Value::Null,
                    Some(v) => crd_cell(ty, v, now),
                });
            }
            cells
        }),
    )
}

/// apiextensions' `cellForJSONValue`.
fn crd_cell(ty: &str, v: &Value, now: SystemTime) -> Value {
    match (ty, v) {
        ("integer", Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        ("boolean", Value::Bool(b)) => Value::Bool(*b),
        ("date", Value::String(t)) => match parse_rfc3339(t) {
            Some(t) => json!(human_duration(seconds_between(t, now))),
            None => json!("<invalid>"),
        },
        ("string", Value::String(s)) => json!(s),
        ("string", other) => json!(other.to_string()),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: &str = "2026-03-01T12:00:00Z";

    fn now() -> SystemTime {
        parse_rfc3339(NOW).unwrap_or(UNIX_EPOCH)
    }

    fn names(t: &Value) -> Vec<String> {
        t["columnDefinitions"]
            .as_array()
            .map(|c| c.iter().map(|c| s(c, "/name").to_owned()).collect())
            .unwrap_or_default()
    }

    fn cells(t: &Value, row: usize) -> Vec<Value> {
        t["rows"][row]["cells"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn time_helpers() {
        assert_eq!(
            parse_rfc3339("1970-01-01T00:01:00Z"),
            UNIX_EPOCH.checked_add(Duration::from_secs(60))
        );
        assert_eq!(
            parse_rfc3339("2026-03-01T13:00:00+01:00"),
            parse_rfc3339("2026-03-01T12:00:00Z")
        );
        assert!(parse_rfc3339("2026-03-01T12:00:00.5Z") > parse_rfc3339("2026-03-01T12:00:00Z"));
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-03-01 12:00",
            "2026-03-01T12:00:00",
            "x",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
        assert_eq!(format_rfc3339(now()), NOW);
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600 + 12 * 60, "3h12m"),
            (5 * 3600, "5h"),
            (30 * 3600, "30h"),
            (50 * 3600, "2d2h"),
            (72 * 3600, "3d"),
            (100 * 86_400, "100d"),
            (3 * 365 * 86_400 + 10 * 86_400, "3y10d"),
            (10 * 365 * 86_400, "10y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn pods() {
        let running = json!({
            "metadata": {"name": "web-1", "creationTimestamp": "2026-03-01T11:55:00Z"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}], "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                 "lastState": {"terminated": {"finishedAt": "2026-03-01T11:58:00Z"}}},
                {"name": "b", "ready": false, "restartCount": 0, "state": {"running": {}}}
            ]}
        });
        let pending = json!({
            "metadata": {"name": "web-2", "creationTimestamp": "2026-03-01T09:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        });
        let crash = json!({
            "metadata": {"name": "c", "creationTimestamp": "2026-03-01T11:00:00Z",
                         "deletionTimestamp": null},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        });
        let done = json!({
            "metadata": {"name": "d"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "a", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}
        });
        let init = json!({
            "metadata": {"name": "i", "deletionTimestamp": "2026-03-01T11:59:00Z"},
            "spec": {"initContainers": [{"name": "x"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending"}
        });
        let t = to_table("pods", &[running, pending, crash, done, init], None, now());
        assert_eq!(
            names(&t),
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["columnDefinitions"][5]["priority"], 1);
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web-1"),
                json!("1/2"),
                json!("Running"),
                json!("2 (2m ago)"),
                json!("5m"),
                json!("10.0.0.5"),
                json!("node-1"),
                json!("<none>"),
                json!("<none>")
            ]
        );
        assert_eq!(cells(&t, 1)[2], "Pending");
        assert_eq!(cells(&t, 1)[4], "3h");
        assert_eq!(cells(&t, 1)[6], "<none>");
        assert_eq!(cells(&t, 2)[2], "CrashLoopBackOff");
        assert_eq!(cells(&t, 2)[3], "5");
        assert_eq!(cells(&t, 3)[2], "Completed");
        assert_eq!(cells(&t, 3)[4], "<unknown>");
        assert_eq!(cells(&t, 4)[2], "Terminating");
        assert_eq!(
            t["rows"][0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": "web-1", "creationTimestamp": "2026-03-01T11:55:00Z"}})
        );
        assert_eq!(
            t["rows"][3]["conditions"],
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded",
                    "message": "The pod has completed successfully."}])
        );
        assert!(t["rows"][0].get("conditions").is_none());
    }

    #[test]
    fn pod_status_corner_cases() {
        let gated = json!({"metadata": {"name": "g"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}});
        let init_waiting = json!({"metadata": {"name": "w"},
            "spec": {"initContainers": [{"name": "x"}, {"name": "y"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "x", "state": {"terminated": {"exitCode": 0}}},
                {"name": "y", "state": {"running": {}}}]}});
        let init_failed = json!({"metadata": {"name": "f"},
            "spec": {"initContainers": [{"name": "x"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "x", "restartCount": 3, "state": {"terminated": {"exitCode": 2}}}]}});
        let sidecar = json!({"metadata": {"name": "s"},
            "spec": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
                     "containers": [{"name": "a"}]},
            "status": {"phase": "Running", "initContainerStatuses": [
                {"name": "proxy", "started": true, "ready": true, "restartCount": 1,
                 "state": {"running": {}}}],
                "containerStatuses": [{"name": "a", "ready": true, "state": {"running": {}}}]}});
        let succeeded_deleting = json!({"metadata": {"name": "d", "deletionTimestamp": "2026-03-01T11:00:00Z"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Succeeded"}});
        let signal = json!({"metadata": {"name": "k"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}});
        let t = to_table(
            "pods",
            &[
                gated,
                init_waiting,
                init_failed,
                sidecar,
                succeeded_deleting,
                signal,
            ],
            None,
            now(),
        );
        let status: Vec<Value> = (0..6).map(|r| cells(&t, r)[2].clone()).collect();
        assert_eq!(
            status,
            [
                "SchedulingGated",
                "Init:1/2",
                "Init:ExitCode:2",
                "Running",
                "Succeeded",
                "Signal:9"
            ]
        );
        assert_eq!(cells(&t, 2)[3], "3");
        assert_eq!(cells(&t, 3)[1], "2/2", "a started sidecar counts as ready");
        assert_eq!(cells(&t, 3)[3], "1");
        assert_eq!(t["rows"][5]["conditions"][0]["reason"], "Failed");
    }

    #[test]
    fn workloads() {
        let d = json!({
            "metadata": {"name": "web", "creationTimestamp": "2026-03-01T11:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "app", "image": "nginx:1"},
                                                          {"name": "side", "image": "envoy"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
        });
        let t = to_table("deployments", std::slice::from_ref(&d), None, now());
        assert_eq!(
            names(&t),
            [
                "Name",
                "Ready",
                "Up-to-date",
                "Available",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("60m"),
                json!("app,side"),
                json!("nginx:1,envoy"),
                json!("app=web")
            ]
        );
        let by_ref = to_table("deployments", &[&d], None, now());
        assert_eq!(
            by_ref,
            to_table("deployments", std::slice::from_ref(&d), None, now())
        );
        let t = to_table("statefulsets", std::slice::from_ref(&d), None, now());
        assert_eq!(names(&t), ["Name", "Ready", "Age", "Containers", "Images"]);
        assert_eq!(cells(&t, 0)[1], "2/3");
        let t = to_table("replicasets", &[d], None, now());
        assert_eq!(cells(&t, 0)[1..4], [json!(3), json!(0), json!(2)]);

        let job = json!({
            "metadata": {"name": "j", "creationTimestamp": "2026-03-01T11:50:00Z"},
            "spec": {"completions": 3, "template": {"spec": {"containers": [{"name": "w", "image": "busybox"}]}}},
            "status": {"succeeded": 3, "startTime": "2026-03-01T11:50:00Z",
                       "completionTime": "2026-03-01T11:50:45Z",
                       "conditions": [{"type": "Complete", "status": "True"}]}
        });
        let running = json!({
            "metadata": {"name": "k"}, "spec": {"parallelism": 4},
            "status": {"startTime": "2026-03-01T11:57:00Z", "succeeded": 1}
        });
        let t = to_table("jobs", &[job, running], None, now());
        assert_eq!(
            names(&t),
            [
                "Name",
                "Status",
                "Completions",
                "Duration",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0)[..5],
            [
                json!("j"),
                json!("Complete"),
                json!("3/3"),
                json!("45s"),
                json!("10m")
            ]
        );
        assert_eq!(
            cells(&t, 1)[1..4],
            [json!("Running"), json!("1/1 of 4"), json!("3m")]
        );
    }

    #[test]
    fn cluster_objects() {
        let node = json!({
            "metadata": {"name": "n1", "creationTimestamp": "2026-02-27T12:00:00Z",
                         "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Sim"}}
        });
        let t = to_table("nodes", &[node], None, now());
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("n1"),
                json!("Ready,SchedulingDisabled"),
                json!("control-plane,edge"),
                json!("2d"),
                json!("v1.33.0"),
                json!("10.0.0.1"),
                json!("<none>"),
                json!("Sim"),
                json!("<unknown>"),
                json!("<unknown>")
            ]
        );
        let ns = json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}});
        assert_eq!(
            cells(&to_table("namespaces", &[ns], None, now()), 0)[1],
            "Active"
        );
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}});
        assert_eq!(cells(&to_table("configmaps", &[cm], None, now()), 0)[1], 3);
        let sec = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "MQ=="}});
        let t = to_table("secrets", &[sec], None, now());
        assert_eq!(names(&t), ["Name", "Type", "Data", "Age"]);
        assert_eq!(cells(&t, 0)[1..3], [json!("Opaque"), json!(1)]);
        let sa = json!({"metadata": {"name": "default"}});
        assert_eq!(
            cells(&to_table("serviceaccounts", &[sa], None, now()), 0)[1],
            0
        );
        let lease = json!({"metadata": {"name": "hub"}, "spec": {"holderIdentity": "hub-0"}});
        assert_eq!(
            cells(&to_table("leases", &[lease], None, now()), 0)[1],
            "hub-0"
        );
        let crd = json!({"metadata": {"name": "dsos.kedge.dev",
                                      "creationTimestamp": "2026-03-01T10:00:00+00:00"}});
        let t = to_table("customresourcedefinitions", &[crd], None, now());
        assert_eq!(names(&t), ["Name", "Created At"]);
        assert_eq!(cells(&t, 0)[1], "2026-03-01T10:00:00Z");
        let rb = json!({"metadata": {"name": "rb"}, "roleRef": {"kind": "Role", "name": "agent"},
                        "subjects": [{"kind": "ServiceAccount", "name": "a", "namespace": "k"},
                                     {"kind": "User", "name": "u"}]});
        let t = to_table("rolebindings", &[rb], None, now());
        assert_eq!(cells(&t, 0)[1], "Role/agent");
        assert_eq!(cells(&t, 0)[3..], [json!("u"), json!(""), json!("k/a")]);
    }

    #[test]
    fn events() {
        let ev = json!({
            "metadata": {"name": "web.1"}, "type": "Warning", "reason": "FailedScheduling",
            "involvedObject": {"kind": "Pod", "name": "web-1"}, "message": "0/3 nodes available ",
            "source": {"component": "default-scheduler"}, "count": 4,
            "firstTimestamp": "2026-03-01T11:00:00Z", "lastTimestamp": "2026-03-01T11:59:30Z"
        });
        let t = to_table("events", &[ev], None, now());
        assert_eq!(names(&t)[..4], ["Last Seen", "Type", "Reason", "Object"]);
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("30s"),
                json!("Warning"),
                json!("FailedScheduling"),
                json!("pod/web-1"),
                json!(""),
                json!("default-scheduler"),
                json!("0/3 nodes available"),
                json!("60m"),
                json!(4),
                json!("web.1")
            ]
        );
    }

    #[test]
    fn events_k8s_io_and_series() {
        let ev = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e2"}, "type": "Normal", "reason": "Scaled",
            "regarding": {"kind": "Deployment", "name": "web", "fieldPath": "spec"},
            "note": "scaled to 3", "reportingController": "kedge-agent", "reportingInstance": "m1",
            "eventTime": "2026-03-01T11:58:00.000000Z",
            "series": {"count": 7, "lastObservedTime": "2026-03-01T11:59:50.000000Z"}
        });
        let single = json!({"metadata": {"name": "e3"}, "involvedObject": {"kind": "Node"},
                            "eventTime": "2026-03-01T11:59:00.000000Z"});
        let t = to_table("events", &[ev, single], None, now());
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("10s"),
                json!("Normal"),
                json!("Scaled"),
                json!("deployment/web"),
                json!("spec"),
                json!("kedge-agent, m1"),
                json!("scaled to 3"),
                json!("2m"),
                json!(7),
                json!("e2")
            ]
        );
        assert_eq!(cells(&t, 1)[0], "60s", "last seen falls back to first seen");
        assert_eq!(cells(&t, 1)[3], "node");
        assert_eq!(cells(&t, 1)[8], 1, "a singleton event counts once");
    }

    #[test]
    fn job_status_precedence() {
        let job = |conds: Value, deleting: bool| {
            let mut j = json!({"metadata": {"name": "j"}, "status": {"conditions": conds}});
            if deleting {
                j["metadata"]["deletionTimestamp"] = json!("2026-03-01T11:00:00Z");
            }
            j
        };
        let cases = [
            (
                job(
                    json!([{"type": "Failed", "status": "True"}, {"type": "Complete", "status": "True"}]),
                    true,
                ),
                "Complete",
            ),
            (
                job(json!([{"type": "Failed", "status": "True"}]), true),
                "Failed",
            ),
            (
                job(json!([{"type": "Suspended", "status": "True"}]), true),
                "Terminating",
            ),
            (
                job(json!([{"type": "Suspended", "status": "True"}]), false),
                "Suspended",
            ),
            (
                job(json!([{"type": "FailureTarget", "status": "True"}]), false),
                "FailureTarget",
            ),
            (
                job(json!([{"type": "Complete", "status": "False"}]), false),
                "Running",
            ),
        ];
        for (j, want) in cases {
            let t = to_table("jobs", std::slice::from_ref(&j), None, now());
            assert_eq!(cells(&t, 0)[1], want, "{j}");
            assert_eq!(cells(&t, 0)[7], "<none>");
        }
        let d = json!({"metadata": {"name": "d"}});
        assert_eq!(cells(&to_table("deployments", &[d], None, now()), 0)[7], "");
    }

    #[test]
    fn custom_resources() {
        let cols = json!([
            {"name": "Total", "type": "integer", "jsonPath": ".spec.totalTargetReplicas"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
            {"name": "Weight", "type": "number", "jsonPath": ".spec.weight", "priority": 1},
            {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
            {"name": "Clusters", "type": "string", "jsonPath": ".spec.clusters"},
            {"name": "Seen", "type": "date", "jsonPath": ".status.lastSeen"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]);
        let dso = json!({
            "metadata": {"name": "web", "creationTimestamp": "2026-03-01T08:48:00Z"},
            "spec": {"totalTargetReplicas": 7, "weight": 1.5, "paused": false, "clusters": ["a", "b"]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "lastSeen": "not-a-date"}
        });
        let bare = json!({"metadata": {"name": "empty"}});
        let t = to_table_with(
            "distributedscaledobjects",
            &[dso.clone(), bare],
            Some(&cols),
            now(),
            IncludeObject::Object,
        );
        assert_eq!(
            names(&t),
            [
                "Name", "Total", "Ready", "Weight", "Paused", "Clusters", "Seen", "Age"
            ]
        );
        assert_eq!(t["columnDefinitions"][3]["priority"], 1);
        assert_eq!(t["columnDefinitions"][1]["type"], "integer");
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!(7),
                json!("True"),
                json!(1.5),
                json!(false),
                json!("[\"a\",\"b\"]"),
                json!("<invalid>"),
                json!("3h12m")
            ]
        );
        assert_eq!(
            cells(&t, 1)[1..],
            [
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null
            ]
        );
        assert_eq!(t["rows"][0]["object"], dso);

        // Without printer columns: the CRD default Name + Age.
        let t = to_table_with(
            "widgets",
            std::slice::from_ref(&dso),
            None,
            now(),
            IncludeObject::None,
        );
        assert_eq!(names(&t), ["Name", "Age"]);
        assert_eq!(cells(&t, 0), vec![json!("web"), json!("3h12m")]);
        assert!(t["rows"][0].get("object").is_none());
    }

    proptest! {
        #[test]
        fn rfc3339_never_panics(t in "\\PC{0,30}") {
            let _ = parse_rfc3339(&t);
        }

        #[test]
        fn rfc3339_round_trips(secs in 0u64..8_000_000_000) {
            let t = UNIX_EPOCH + Duration::from_secs(secs);
            prop_assert_eq!(parse_rfc3339(&format_rfc3339(t)), Some(t));
        }

        #[test]
        fn garbage_objects_never_panic(name in "\\PC{0,10}", n in any::<i64>(), ts in "[0-9TZ:.-]{0,25}") {
            let o = json!({"metadata": {"name": name, "creationTimestamp": ts},
                           "spec": {"replicas": n, "containers": n, "completions": n},
                           "status": {"containerStatuses": [{"restartCount": n, "state": {"terminated": {"signal": n}}}],
                                      "conditions": name, "startTime": ts}});
            for r in ["pods", "deployments", "statefulsets", "replicasets", "jobs", "nodes",
                      "events", "secrets", "configmaps", "leases", "customresourcedefinitions", "x"] {
                let _ = to_table(r, std::slice::from_ref(&o), None, now());
            }
        }
    }
}
