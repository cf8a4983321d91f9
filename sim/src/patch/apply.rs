//! Server-side apply (`application/apply-patch+yaml`) and field-manager bookkeeping
//! (`metadata.managedFields` in `FieldsV1` format) for ordinary writes.
//!
//! What is modelled, after sigs.k8s.io/structured-merge-diff as kube-apiserver uses it:
//! - every applier owns the field set of its last applied configuration (one `Apply`
//!   entry per manager and subresource); `Update` writes take ownership of the fields they
//!   change, away from every other manager;
//! - applying a value different from the live one to a field another manager owns is a
//!   conflict (409, the server's message format); `force` moves ownership instead; applying
//!   the same value shares ownership;
//! - a field an applier owned before, dropped from its new configuration and owned by no
//!   other manager is deleted; a live object without `managedFields` is first attributed
//!   to `before-first-apply`, as the real server does;
//! - associative lists (containers by `name`, conditions by `type`, ...) are `k:` entries,
//!   sets (`finalizers`) `v:` entries, other lists are atomic.
//!
//! Limits (an honest approximation): the schema is the built-in patch-strategy table of
//! [`super::strategic`], so lists of custom resources are atomic whatever their CRD's
//! `x-kubernetes-list-type` says (ports are keyed by port and protocol, `protocol`
//! defaulting to `TCP` as server defaulting would); only maps known to be free-form (labels, annotations, data,
//! selectors) and list items carry the `.` self-marker; a field removed by an applier
//! leaves its now-empty parent map in place; resourceVersion preconditions, defaulting and
//! validation are the caller's job; a main-resource apply ignores `status` and a
//! `status` apply only takes `status`.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use super::strategic::{ListStrategy, Ty, child_ty, list_strategy, root_ty};

/// Why an apply was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// 409 Conflict: other managers own fields this apply would change.
    #[error("{0}")]
    Conflict(ApplyConflict),
    /// 400 BadRequest: the applied configuration is not an object with `apiVersion`
    /// and `kind`.
    #[error("{0}")]
    BadRequest(String),
}

impl ApplyError {
    /// The HTTP status code of the `Status` the server returns.
    pub fn status_code(&self) -> u16 {
        match self {
            ApplyError::Conflict(_) => 409,
            ApplyError::BadRequest(_) => 400,
        }
    }

    /// The `Status.reason` the server returns.
    pub fn reason(&self) -> &'static str {
        match self {
            ApplyError::Conflict(_) => "Conflict",
            ApplyError::BadRequest(_) => "BadRequest",
        }
    }
}

/// A 409 apply conflict: the `Status.message` and one cause per conflicting field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyConflict {
    /// `Apply failed with 1 conflict: conflict with "mgr": .spec.replicas`.
    pub message: String,
    /// The `Status.details.causes` (type `FieldManagerConflict`).
    pub causes: Vec<ConflictCause>,
}

impl fmt::Display for ApplyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// One conflicting field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictCause {
    /// `conflict with "mgr"` (with ` using apps/v1 at TIME` for an `Update` manager).
    pub message: String,
    /// The field path, e.g. `.spec.replicas`.
    pub field: String,
}

/// Result alias for this module.
pub type Result<T, E = ApplyError> = std::result::Result<T, E>;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Pe {
    /// A map key or struct field: `f:name`.
    Field(String),
    /// An associative-list element by its key fields (canonical JSON values): `k:{...}`.
    Key(Vec<(String, String)>),
    /// A set element (canonical JSON): `v:...`.
    Value(String),
}

type Path = Vec<Pe>;
type FieldSet = BTreeSet<Path>;

fn path_string(p: &[Pe]) -> String {
    let mut s = String::new();
    for e in p {
        match e {
            Pe::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Pe::Key(kv) => {
                let parts: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push('[');
                s.push_str(&parts.join(","));
                s.push(']');
            }
            Pe::Value(v) => {
                s.push_str("[=");
                s.push_str(v);
                s.push(']');
            }
        }
    }
    s
}

fn encode_pe(e: &Pe) -> String {
    match e {
        Pe::Field(f) => format!("f:{f}"),
        Pe::Key(kv) => {
            let parts: Vec<String> = kv
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                .collect();
            format!("k:{{{}}}", parts.join(","))
        }
        Pe::Value(v) => format!("v:{v}"),
    }
}

fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| {
                    let val = m.get(*k).map(canonical).unwrap_or_default();
                    format!("{}:{val}", Value::String((*k).clone()))
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn decode_pe(s: &str) -> Option<Pe> {
    if let Some(f) = s.strip_prefix("f:") {
        return Some(Pe::Field(f.to_owned()));
    }
    if let Some(k) = s.strip_prefix("k:") {
        let Ok(Value::Object(m)) = serde_json::from_str::<Value>(k) else {
            return None;
        };
        let mut kv: Vec<(String, String)> =
            m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect();
        kv.sort();
        return Some(Pe::Key(kv));
    }
    if let Some(v) = s.strip_prefix("v:") {
        let v: Value = serde_json::from_str(v).ok()?;
        return Some(Pe::Value(canonical(&v)));
    }
    None
}

/// Builds the `FieldsV1` JSON of a field set.
fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for p in set {
        let mut node = &mut root;
        for e in p {
            let entry = node
                .entry(encode_pe(e))
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else { break };
            node = next;
        }
    }
    // A member that also has children is marked with ".".
    fn mark(node: &mut Map<String, Value>, path: &[Pe]) {
        match path.split_first() {
            None => {
                if !node.is_empty() {
                    node.insert(".".into(), Value::Object(Map::new()));
                }
            }
            Some((e, rest)) => {
                if let Some(Value::Object(next)) = node.get_mut(&encode_pe(e)) {
                    mark(next, rest);
                }
            }
        }
    }
    for p in set.iter().filter(|p| !p.is_empty()) {
        mark(&mut root, p);
    }
    Value::Object(root)
}

/// Reads a `FieldsV1` JSON into a field set (unknown entries are skipped).
fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(node: &Map<String, Value>, prefix: &mut Path, out: &mut FieldSet) {
        for (k, child) in node {
            if k == "." {
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
                continue;
            }
            let (Some(pe), Value::Object(child)) = (decode_pe(k), child) else {
                continue;
            };
            prefix.push(pe);
            if child.is_empty() {
                out.insert(prefix.clone());
            } else {
                walk(child, prefix, out);
            }
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Value::Object(m) = v {
        walk(m, &mut Vec::new(), &mut out);
    }
    out
}

/// Which part of an object a write covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The main resource: everything but `status`.
    Main,
    /// The `status` subresource: only `status`.
    Status,
    /// Another subresource (e.g. `scale`): every field.
    All,
}

impl Scope {
    fn of(subresource: Option<&str>) -> Scope {
        match subresource {
            None => Scope::Main,
            Some("status") => Scope::Status,
            Some(_) => Scope::All,
        }
    }

    fn includes_root_field(self, field: &str) -> bool {
        if matches!(field, "apiVersion" | "kind") {
            return false;
        }
        match self {
            Scope::Main => field != "status",
            Scope::Status => field == "status",
            Scope::All => true,
        }
    }
}

/// Metadata the server owns: never part of a manager's field set nor taken from an apply.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Maps whose keys are data, not schema: the map itself is a member (`.`).
fn is_free_form_map(field: &str) -> bool {
    matches!(
        field,
        "labels"
            | "annotations"
            | "data"
            | "binaryData"
            | "stringData"
            | "nodeSelector"
            | "matchLabels"
    )
}

/// One key field of a list element, canonical JSON. `protocol` defaults to `TCP`, as the
/// server's defaulting does before structured-merge-diff sees ports.
fn key_field(elem: &Value, field: &str) -> Option<String> {
    match elem.get(field) {
        Some(v) if !v.is_null() => Some(canonical(v)),
        _ if field == "protocol" => Some("\"TCP\"".to_owned()),
        _ => None,
    }
}

/// The key of a list element whose strategic merge key is `key`, if the element has it.
/// Ports are keyed by port and protocol, as their `x-kubernetes-list-map-keys` say.
fn element_key(elem: &Value, key: &str) -> Option<Pe> {
    let fields: &[&str] = match key {
        "containerPort" => &["containerPort", "protocol"],
        "port" => &["port", "protocol"],
        _ => std::slice::from_ref(&key),
    };
    let mut pairs = Vec::with_capacity(fields.len());
    for f in fields {
        pairs.push(((*f).to_owned(), key_field(elem, f)?));
    }
    Some(Pe::Key(pairs))
}

/// Collects the member paths of `v` (the value at `prefix`, of schema type `ty`).
fn collect(v: &Value, ty: Ty, prefix: &mut Path, scope: Scope, out: &mut FieldSet) {
    let Value::Object(m) = v else { return };
    for (k, child) in m {
        if prefix.is_empty() && !scope.includes_root_field(k) {
            continue;
        }
        collect_member(child, ty, k, prefix, scope, out);
    }
}

/// The paths of member `field` of an object of type `ty`.
fn collect_member(
    child: &Value,
    ty: Ty,
    field: &str,
    prefix: &mut Path,
    scope: Scope,
    out: &mut FieldSet,
) {
    if ty == Ty::ObjectMeta && SERVER_METADATA.contains(&field) {
        return;
    }
    prefix.push(Pe::Field(field.to_owned()));
    collect_field(child, ty, field, prefix, scope, out);
    prefix.pop();
}

fn collect_field(
    child: &Value,
    parent: Ty,
    field: &str,
    prefix: &mut Path,
    scope: Scope,
    out: &mut FieldSet,
) {
    match child {
        Value::Null => {}
        Value::Object(m) if !m.is_empty() => {
            if is_free_form_map(field) {
                out.insert(prefix.clone());
            }
            collect(child, child_ty(parent, field), prefix, scope, out);
        }
        Value::Array(items) => match list_strategy(parent, field) {
            ListStrategy::Keyed(key, elem_ty)
                if items.iter().all(|e| element_key(e, key).is_some()) =>
            {
                for e in items {
                    let Some(pe) = element_key(e, key) else {
                        continue;
                    };
                    prefix.push(pe);
                    out.insert(prefix.clone());
                    collect(e, elem_ty, prefix, scope, out);
                    prefix.pop();
                }
            }
            ListStrategy::Set if items.iter().all(|e| !e.is_object() && !e.is_array()) => {
                for e in items {
                    prefix.push(Pe::Value(canonical(e)));
                    out.insert(prefix.clone());
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        },
        _ => {
            out.insert(prefix.clone());
        }
    }
}

fn field_set(obj: &Value, kind: &str, scope: Scope) -> FieldSet {
    field_set_below(obj, kind, scope, &|_| true)
}

/// [`field_set`], of the root fields `root` keeps only.
fn field_set_below(obj: &Value, kind: &str, scope: Scope, root: &dyn Fn(&str) -> bool) -> FieldSet {
    let mut out = FieldSet::new();
    let Value::Object(m) = obj else { return out };
    let ty = root_ty(kind);
    for (k, child) in m {
        if scope.includes_root_field(k) && root(k) {
            collect_member(child, ty, k, &mut Vec::new(), scope, &mut out);
        }
    }
    out
}

fn element_matches(elem: &Value, pe: &Pe) -> bool {
    match pe {
        Pe::Key(kv) => kv
            .iter()
            .all(|(k, v)| key_field(elem, k).is_some_and(|got| got == *v)),
        Pe::Value(v) => canonical(elem) == *v,
        Pe::Field(_) => false,
    }
}

fn get_at<'a>(mut v: &'a Value, path: &[Pe]) -> Option<&'a Value> {
    for e in path {
        v = match (e, v) {
            (Pe::Field(f), Value::Object(m)) => m.get(f)?,
            (Pe::Key(_) | Pe::Value(_), Value::Array(items)) => {
                items.iter().find(|i| element_matches(i, e))?
            }
            _ => return None,
        };
    }
    Some(v)
}

fn remove_at(v: &mut Value, path: &[Pe]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for e in parents {
        let next = match (e, cur) {
            (Pe::Field(f), Value::Object(m)) => m.get_mut(f),
            (Pe::Key(_) | Pe::Value(_), Value::Array(items)) => {
                items.iter_mut().find(|i| element_matches(i, e))
            }
            _ => None,
        };
        let Some(next) = next else { return };
        cur = next;
    }
    match (last, cur) {
        (Pe::Field(f), Value::Object(m)) => {
            m.remove(f);
        }
        (Pe::Key(_) | Pe::Value(_), Value::Array(items)) => {
            items.retain(|i| !element_matches(i, last));
        }
        _ => {}
    }
}

/// Merges an applied configuration into the live object, following the schema.
fn merge_applied(live: &mut Value, applied: &Value, ty: Ty, root: bool, scope: Scope) {
    let (Value::Object(l), Value::Object(a)) = (&mut *live, applied) else {
        *live = applied.clone();
        return;
    };
    for (k, av) in a {
        if root && !scope.includes_root_field(k) && !matches!(k.as_str(), "apiVersion" | "kind") {
            continue;
        }
        if ty == Ty::ObjectMeta && SERVER_METADATA.contains(&k.as_str()) && l.contains_key(k) {
            continue;
        }
        if ty == Ty::ObjectMeta && k == "managedFields" {
            continue;
        }
        if av.is_null() {
            l.remove(k);
            continue;
        }
        let child = child_ty(ty, k);
        match (l.get_mut(k), av) {
            (Some(lv @ Value::Object(_)), Value::Object(_)) => {
                merge_applied(lv, av, child, false, scope);
            }
            (Some(Value::Array(litems)), Value::Array(aitems)) => {
                merge_list(litems, aitems, list_strategy(ty, k));
            }
            (_, av) => {
                l.insert(k.clone(), av.clone());
            }
        }
    }
}

fn merge_list(live: &mut Vec<Value>, applied: &[Value], strategy: ListStrategy) {
    match strategy {
        ListStrategy::Keyed(key, elem_ty)
            if applied
                .iter()
                .chain(live.iter())
                .all(|e| element_key(e, key).is_some()) =>
        {
            for a in applied {
                let Some(pe) = element_key(a, key) else {
                    continue;
                };
                match live.iter_mut().find(|l| element_matches(l, &pe)) {
                    Some(l) => merge_applied(l, a, elem_ty, false, Scope::All),
                    None => live.push(a.clone()),
                }
            }
        }
        ListStrategy::Set => {
            for a in applied {
                if !live.contains(a) {
                    live.push(a.clone());
                }
            }
        }
        _ => *live = applied.to_vec(),
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    fields: FieldSet,
}

impl Entry {
    fn parse(v: &Value) -> Option<Entry> {
        let mut entry = Entry::header(v)?;
        entry.fields = fields_of(v);
        Some(entry)
    }

    /// The entry without its fields (`None`: not an entry, it has no operation).
    fn header(v: &Value) -> Option<Entry> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(Entry {
            manager: s("manager").unwrap_or_default(),
            operation: s("operation")?,
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").filter(|s| !s.is_empty()),
            fields: FieldSet::new(),
        })
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::String(self.manager.clone()));
        m.insert("operation".into(), Value::String(self.operation.clone()));
        m.insert("apiVersion".into(), Value::String(self.api_version.clone()));
        if let Some(t) = &self.time {
            m.insert("time".into(), Value::String(t.clone()));
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), to_fields_v1(&self.fields));
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), Value::String(s.clone()));
        }
        Value::Object(m)
    }

    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    /// How conflict messages name this manager (apiserver's `printManager`).
    fn printed(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
            if let Some(t) = &self.time {
                s.push_str(&format!(" at {t}"));
            }
        }
        s
    }
}

/// The fields an entry owns (its `fieldsV1`).
fn fields_of(entry: &Value) -> FieldSet {
    entry
        .get("fieldsV1")
        .map(from_fields_v1)
        .unwrap_or_default()
}

fn managed_fields(obj: &Value) -> Option<&Vec<Value>> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
}

fn entries_of(obj: &Value) -> Option<Vec<Entry>> {
    managed_fields(obj).map(|a| a.iter().filter_map(Entry::parse).collect())
}

fn set_entries(obj: &mut Value, entries: &[Entry]) {
    set_managed_fields(
        obj,
        entries
            .iter()
            .filter(|e| !e.fields.is_empty())
            .map(Entry::to_json)
            .collect(),
    );
}

fn set_managed_fields(obj: &mut Value, live: Vec<Value>) {
    let Value::Object(root) = obj else { return };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else { return };
    if live.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(live));
    }
}

/// Whether two values of an owned field differ. Maps are containers, never conflicting
/// leaves: their keys are fields of their own.
fn leaf_differs(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Object(_)), Some(Value::Object(_))) => false,
        _ => a != b,
    }
}

/// Whether `p` is a key field of an associative-list item (`...[name="x"].name`): it
/// lives as long as its item does.
fn is_key_field(p: &[Pe]) -> bool {
    match p {
        [.., Pe::Key(pairs), Pe::Field(f)] => pairs.iter().any(|(k, _)| k == f),
        _ => false,
    }
}

/// Whether `set` holds a path below `p`. Paths sort lexicographically, so the paths that
/// extend `p` come right after it: only the first path greater than `p` is looked at (a scan
/// of the set made every apply of an object with thousands of fields quadratic: a DSO
/// status over 1,000 members took ~200 ms of the simulator's CPU).
fn has_descendant(set: &FieldSet, p: &[Pe]) -> bool {
    use std::ops::Bound;
    set.range::<[Pe], _>((Bound::Excluded(p), Bound::Unbounded))
        .next()
        .is_some_and(|q| q.len() > p.len() && q.starts_with(p))
}

fn conflict_message(conflicts: &[(String, String)]) -> String {
    if let [(mgr, path)] = conflicts {
        return format!("Apply failed with 1 conflict: conflict with {mgr}: {path}");
    }
    let managers: BTreeSet<&String> = conflicts.iter().map(|(m, _)| m).collect();
    let mut lines = Vec::new();
    for m in managers {
        lines.push(format!("conflicts with {m}:"));
        for (_, p) in conflicts.iter().filter(|(cm, _)| cm == m) {
            lines.push(format!("- {p}"));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Options of [`apply_subresource`].
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions<'a> {
    /// The field manager (`?fieldManager=`).
    pub manager: &'a str,
    /// `?force=true`: take ownership of conflicting fields.
    pub force: bool,
    /// The timestamp to record (RFC 3339).
    pub now: &'a str,
    /// `None` for the main resource, `Some("status")` for `/status`.
    pub subresource: Option<&'a str>,
}

/// Server-side apply of `applied` by `manager` on the main resource. `live` is `None` when
/// the object does not exist yet (apply creates it). Returns the new object with its
/// `metadata.managedFields`.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
) -> Result<Value> {
    apply_subresource(
        live,
        applied,
        ApplyOptions {
            manager,
            force,
            now,
            subresource: None,
        },
    )
}

/// Server-side apply on the main resource or a subresource (see [`ApplyOptions`]).
pub fn apply_subresource(
    live: Option<&Value>,
    applied: &Value,
    opts: ApplyOptions<'_>,
) -> Result<Value> {
    let Value::Object(a) = applied else {
        return Err(ApplyError::BadRequest(
            "the applied configuration must be an object".into(),
        ));
    };
    let (Some(api_version), Some(kind)) = (
        a.get("apiVersion").and_then(Value::as_str),
        a.get("kind").and_then(Value::as_str),
    ) else {
        return Err(ApplyError::BadRequest(
            "apiVersion and kind must be set in the applied configuration".into(),
        ));
    };
    let scope = Scope::of(opts.subresource);
    let mut entries = match live {
        None => Vec::new(),
        Some(l) => entries_of(l).unwrap_or_else(|| {
            vec![Entry {
                manager: "before-first-apply".into(),
                operation: "Update".into(),
                api_version: api_version.to_owned(),
                time: Some(opts.now.to_owned()),
                subresource: None,
                fields: field_set(l, kind, Scope::Main),
            }]
        }),
    };
    let live_obj = live.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    let new_set = field_set(applied, kind, scope);

    // Conflicts: another manager owns a leaf we set, and the values differ.
    let mut conflicts: Vec<(usize, Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.is(opts.manager, "Apply", opts.subresource) {
            continue;
        }
        for p in e.fields.intersection(&new_set) {
            if has_descendant(&new_set, p) {
                continue;
            }
            if leaf_differs(get_at(&live_obj, p), get_at(applied, p)) {
                conflicts.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !opts.force {
        let mut named: Vec<(String, String)> = conflicts
            .iter()
            .filter_map(|(i, p)| entries.get(*i).map(|e| (e.printed(), path_string(p))))
            .collect();
        named.sort();
        return Err(ApplyError::Conflict(ApplyConflict {
            message: conflict_message(&named),
            causes: named
                .into_iter()
                .map(|(m, field)| ConflictCause {
                    message: format!("conflict with {m}"),
                    field,
                })
                .collect(),
        }));
    }
    for (i, p) in &conflicts {
        if let Some(e) = entries.get_mut(*i) {
            e.fields.remove(p);
        }
    }

    let previous = entries
        .iter()
        .position(|e| e.is(opts.manager, "Apply", opts.subresource));
    let old_set = previous
        .and_then(|i| entries.get(i))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: FieldSet = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != previous)
        .flat_map(|(_, e)| e.fields.iter().cloned())
        .collect();

    let mut result = live_obj;
    merge_applied(&mut result, applied, root_ty(kind), true, scope);
    // Ancestors first: removing a list item by its key must happen before its key field goes.
    for p in old_set.difference(&new_set) {
        if others.contains(p)
            || has_descendant(&others, p)
            || has_descendant(&new_set, p)
            || is_key_field(p)
        {
            continue;
        }
        remove_at(&mut result, p);
        // An object the removal left empty goes too, unless someone still applies it: an
        // entry of a map keyed by data (a DSO's `memberClusterStatuses`) is a member of its
        // own in structured-merge-diff, so its key leaves with its last field.
        for depth in (2..p.len()).rev() {
            let parent = &p[..depth];
            let empty =
                get_at(&result, parent).is_some_and(|v| v.as_object().is_some_and(Map::is_empty));
            if !empty
                || new_set.contains(parent)
                || others.contains(parent)
                || has_descendant(&others, parent)
                || has_descendant(&new_set, parent)
            {
                break;
            }
            remove_at(&mut result, parent);
        }
    }

    let entry = Entry {
        manager: opts.manager.to_owned(),
        operation: "Apply".into(),
        api_version: api_version.to_owned(),
        time: Some(opts.now.to_owned()),
        subresource: opts.subresource.map(str::to_owned),
        fields: new_set,
    };
    match previous.and_then(|i| entries.get_mut(i)) {
        Some(e) => *e = entry,
        None => entries.push(entry),
    }
    set_entries(&mut result, &entries);
    Ok(result)
}

/// Records an ordinary write (create, update, merge/JSON/strategic patch) by `manager` in
/// `new`'s `managedFields`: the fields that changed from `old` (use `Value::Null` for a
/// create) move to the `(manager, operation, subresource)` entry; fields that no longer
/// exist leave every entry. If the client sent its own `managedFields` (different from
/// `old`'s), those are the starting point, as on the real server.
pub fn record_update(
    old: &Value,
    new: &Value,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    now: &str,
) -> Value {
    record_update_reading(
        old,
        new,
        Write {
            manager,
            operation,
            subresource,
            now,
        },
        Reading::ChangedRoots,
    )
}

/// Who writes, and when.
#[derive(Clone, Copy)]
struct Write<'a> {
    manager: &'a str,
    operation: &'a str,
    subresource: Option<&'a str>,
    now: &'a str,
}

/// What [`record_update`] reads of the objects and their `managedFields`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reading {
    /// Only the root fields (`spec`, `status`, `metadata`, ...) whose value the write
    /// changed, and only the stored entries that own fields under them (or are the
    /// writer's). A root field the write left alone holds exactly what it held, so no path
    /// under it changed or stopped existing, and an entry that owns nothing else is left as
    /// stored. A `/scale` write to an object with a 1,000-member status read and wrote all
    /// of the status' thousands of fields for one changed number (32-44 ms of the
    /// simulator's time).
    ChangedRoots,
    /// Every field and every entry: what `ChangedRoots` must equal (the property tests).
    #[cfg(test)]
    Everything,
}

fn record_update_reading(old: &Value, new: &Value, write: Write<'_>, reading: Reading) -> Value {
    let Write {
        manager,
        operation,
        subresource,
        now,
    } = write;
    let kind = new.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = new
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let scope = Scope::of(subresource);
    let changed_root = |root: &str| match reading {
        Reading::ChangedRoots => root_changed(old, new, root),
        #[cfg(test)]
        Reading::Everything => true,
    };
    let stored = managed_fields(old);
    // The entries the client sent start over from its own (parsed, all of them); the
    // stored ones, already the simulator's, are read only where the write reaches them.
    let sent = managed_fields(new).filter(|sent| Some(*sent) != stored);
    let left_alone = |raw: &Value| {
        sent.is_none()
            && reading == Reading::ChangedRoots
            && match raw.get("fieldsV1") {
                Some(Value::Object(fields)) => {
                    !fields.is_empty()
                        && fields
                            .keys()
                            .all(|k| k.strip_prefix("f:").is_some_and(|root| !changed_root(root)))
                }
                _ => false,
            }
    };
    let mut entries: Vec<Managed<'_>> = sent
        .or(stored)
        .into_iter()
        .flatten()
        .filter_map(|raw| {
            let mut entry = Entry::header(raw)?;
            if !entry.is(manager, operation, subresource) && left_alone(raw) {
                return Some(Managed::Stored(raw));
            }
            entry.fields = fields_of(raw);
            Some(Managed::Read(entry))
        })
        .collect();
    let old_set = field_set_below(old, kind, scope, &changed_root);
    let new_set = field_set_below(new, kind, scope, &changed_root);
    let changed: FieldSet = new_set
        .iter()
        .filter(|p| {
            !old_set.contains(*p)
                || (!has_descendant(&new_set, p) && leaf_differs(get_at(old, p), get_at(new, p)))
        })
        .cloned()
        .collect();

    for e in &mut entries {
        let Managed::Read(e) = e else { continue };
        e.fields.retain(|p| get_at(new, p).is_some());
        if !e.is(manager, operation, subresource) {
            e.fields.retain(|p| !changed.contains(p));
        }
    }
    if !changed.is_empty() {
        let own = entries.iter_mut().find_map(|e| match e {
            Managed::Read(e) if e.is(manager, operation, subresource) => Some(e),
            _ => None,
        });
        match own {
            Some(e) => {
                e.fields.extend(changed);
                e.time = Some(now.to_owned());
                e.api_version = api_version;
            }
            None => entries.push(Managed::Read(Entry {
                manager: manager.to_owned(),
                operation: operation.to_owned(),
                api_version,
                time: Some(now.to_owned()),
                subresource: subresource.map(str::to_owned),
                fields: changed,
            })),
        }
    }
    let mut out = new.clone();
    set_managed_fields(
        &mut out,
        entries
            .iter()
            .filter_map(|e| match e {
                Managed::Stored(raw) => Some((*raw).clone()),
                Managed::Read(e) => (!e.fields.is_empty()).then(|| e.to_json()),
            })
            .collect(),
    );
    out
}

/// Whether root field `root` differs between `old` and `new`; `metadata` without its
/// `managedFields`, which are no one's fields (and, with thousands of fields owned, the
/// largest part of the comparison).
fn root_changed(old: &Value, new: &Value, root: &str) -> bool {
    if root != "metadata" {
        return old.get(root) != new.get(root);
    }
    fn fields(meta: Option<&Value>) -> Option<impl Iterator<Item = (&String, &Value)>> {
        meta.and_then(Value::as_object)
            .map(|meta| meta.iter().filter(|(k, _)| *k != "managedFields"))
    }
    match (fields(old.get(root)), fields(new.get(root))) {
        (Some(a), Some(b)) => !a.eq(b),
        _ => old.get(root) != new.get(root),
    }
}

/// One `managedFields` entry of a write: as stored, or read and being updated.
enum Managed<'a> {
    Stored(&'a Value),
    Read(Entry),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";

    fn pe() -> impl Strategy<Value = Pe> {
        prop_oneof![
            "[ab]{1,2}".prop_map(Pe::Field),
            "[ab]{1,2}".prop_map(|v| Pe::Key(vec![("name".into(), v)])),
            "[ab]{1,2}".prop_map(Pe::Value),
        ]
    }

    proptest! {
        /// The ordered lookup answers as a scan of the whole set would.
        #[test]
        fn has_descendant_is_a_scan_of_the_set(
            set in proptest::collection::btree_set(proptest::collection::vec(pe(), 0..4), 0..24),
            p in proptest::collection::vec(pe(), 0..3),
        ) {
            let scan = set.iter().any(|q| q.len() > p.len() && q.starts_with(&p));
            prop_assert_eq!(has_descendant(&set, &p), scan);
        }
    }

    fn deploy(replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                {"name": "app", "image": image}
            ]}}}
        })
    }

    fn ok(r: Result<Value>) -> Value {
        r.unwrap_or_else(|e| panic!("apply failed: {e}"))
    }

    fn managers(obj: &Value) -> Vec<(String, String)> {
        entries_of(obj)
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.manager, e.operation))
            .collect()
    }

    #[test]
    fn first_apply_creates_with_fields_v1() {
        let obj = ok(apply(None, &deploy(2, "app:1"), "kubectl", false, T0));
        assert_eq!(obj["spec"]["replicas"], 2);
        let mf = &obj["metadata"]["managedFields"][0];
        assert_eq!(mf["manager"], "kubectl");
        assert_eq!(mf["operation"], "Apply");
        assert_eq!(mf["apiVersion"], "apps/v1");
        assert_eq!(mf["time"], T0);
        assert_eq!(mf["fieldsType"], "FieldsV1");
        assert_eq!(
            mf["fieldsV1"],
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}
                }}}}
            })
        );
        // FieldsV1 round-trips through our parser.
        let set = from_fields_v1(&mf["fieldsV1"]);
        assert_eq!(
            set,
            field_set(&deploy(2, "app:1"), "Deployment", Scope::Main)
        );
    }

    #[test]
    fn conflict_with_other_applier_and_force() {
        let live = ok(apply(None, &deploy(2, "app:1"), "kubectl", false, T0));
        let err = apply(Some(&live), &deploy(5, "app:1"), "kedge", false, T1);
        let Err(ApplyError::Conflict(c)) = err else {
            panic!("expected a conflict, got {err:?}");
        };
        assert_eq!(
            c.message,
            "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"
        );
        assert_eq!(
            c.causes,
            vec![ConflictCause {
                message: "conflict with \"kubectl\"".into(),
                field: ".spec.replicas".into()
            }]
        );
        let err = ApplyError::Conflict(c);
        assert_eq!((err.status_code(), err.reason()), (409, "Conflict"));

        // Same values: shared ownership, no conflict.
        let shared = ok(apply(Some(&live), &deploy(2, "app:1"), "kedge", false, T1));
        assert_eq!(managers(&shared).len(), 2);

        let forced = ok(apply(Some(&live), &deploy(5, "app:1"), "kedge", true, T1));
        assert_eq!(forced["spec"]["replicas"], 5);
        let es = entries_of(&forced).unwrap_or_default();
        let kubectl = es.iter().find(|e| e.manager == "kubectl");
        let rep: Path = vec![Pe::Field("spec".into()), Pe::Field("replicas".into())];
        assert!(kubectl.is_some_and(|e| !e.fields.contains(&rep)));
        assert!(
            es.iter()
                .any(|e| e.manager == "kedge" && e.fields.contains(&rep))
        );
    }

    #[test]
    fn multiple_conflicts_message_and_update_manager_format() {
        let created = record_update(
            &Value::Null,
            &deploy(1, "app:1"),
            "kubectl-create",
            "Update",
            None,
            T0,
        );
        let err = apply(Some(&created), &deploy(3, "app:2"), "kedge", false, T1);
        let Err(ApplyError::Conflict(c)) = err else {
            panic!("expected a conflict, got {err:?}");
        };
        assert_eq!(
            c.message,
            "Apply failed with 2 conflicts: conflicts with \"kubectl-create\" using apps/v1 at \
             2026-01-01T00:00:00Z:\n- .spec.replicas\n- \
             .spec.template.spec.containers[name=\"app\"].image"
        );
        assert_eq!(c.causes.len(), 2);
    }

    #[test]
    fn removed_fields_are_deleted_unless_owned_elsewhere() {
        let mut cfg = deploy(2, "app:1");
        cfg["metadata"]["labels"]["tier"] = json!("front");
        cfg["metadata"]["annotations"] = json!({"note": "x"});
        let live = ok(apply(None, &cfg, "kubectl", false, T0));
        // Another manager shares `tier`.
        let mut other = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"tier": "front"}}});
        let live = ok(apply(Some(&live), &other, "helper", false, T0));
        // kubectl drops tier and the annotation from its config.
        let live = ok(apply(
            Some(&live),
            &deploy(2, "app:1"),
            "kubectl",
            false,
            T1,
        ));
        assert_eq!(
            live["metadata"]["labels"],
            json!({"app": "web", "tier": "front"})
        );
        assert!(
            live["metadata"]
                .get("annotations")
                .is_none_or(|a| a == &json!({}))
        );
        // helper drops it too: now it is deleted.
        other["metadata"] = json!({"name": "web"});
        let live = ok(apply(Some(&live), &other, "helper", false, T1));
        assert_eq!(live["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(managers(&live), vec![("kubectl".into(), "Apply".into())]);
    }

    #[test]
    fn associative_list_items_merge_and_are_removed() {
        let mut two = deploy(1, "app:1");
        two["spec"]["template"]["spec"]["containers"] =
            json!([{"name": "app", "image": "app:1"}, {"name": "side", "image": "s:1"}]);
        let live = ok(apply(None, &two, "kubectl", false, T0));
        // A controller adds a field to the app container via an update.
        let mut updated = live.clone();
        updated["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"limits": {"cpu": "1"}});
        let live = record_update(&live, &updated, "ctrl", "Update", None, T0);
        // kubectl drops the sidecar and changes the image.
        let live = ok(apply(
            Some(&live),
            &deploy(1, "app:2"),
            "kubectl",
            false,
            T1,
        ));
        let cs = &live["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs.as_array().map(Vec::len), Some(1));
        assert_eq!(cs[0]["image"], "app:2");
        assert_eq!(cs[0]["resources"], json!({"limits": {"cpu": "1"}}));
    }

    #[test]
    fn ports_are_keyed_by_port_and_protocol() {
        let mut cfg = deploy(1, "app:1");
        cfg["spec"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}]);
        let live = ok(apply(None, &cfg, "kubectl", false, T0));
        let c = &live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]
            ["f:containers"]["k:{\"name\":\"app\"}"]["f:ports"];
        assert!(
            c.get("k:{\"containerPort\":80,\"protocol\":\"TCP\"}")
                .is_some(),
            "{c}"
        );
        assert!(
            c.get("k:{\"containerPort\":53,\"protocol\":\"UDP\"}")
                .is_some(),
            "{c}"
        );
        // A second manager changing port 80's name conflicts with a readable path.
        let mut other = cfg.clone();
        other["spec"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 80, "protocol": "TCP", "name": "web"}]);
        other["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:1");
        let shared = ok(apply(Some(&live), &other, "ports", false, T1));
        let ports = &shared["spec"]["template"]["spec"]["containers"][0]["ports"];
        assert_eq!(ports.as_array().map(Vec::len), Some(2));
        assert_eq!(ports[0]["name"], "web");
        other["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = json!("http");
        let err = apply(Some(&shared), &other, "third", false, T1);
        let Err(ApplyError::Conflict(c)) = err else {
            panic!("expected a conflict, got {err:?}");
        };
        assert_eq!(
            c.causes[0].field,
            ".spec.template.spec.containers[name=\"app\"].ports[containerPort=80,protocol=\"TCP\"].name"
        );
    }

    #[test]
    fn items_another_manager_still_uses_keep_their_key() {
        let mut two = deploy(1, "app:1");
        two["spec"]["template"]["spec"]["containers"] =
            json!([{"name": "app", "image": "app:1"}, {"name": "side", "image": "s:1"}]);
        let live = ok(apply(None, &two, "kubectl", false, T0));
        let mut updated = live.clone();
        updated["spec"]["template"]["spec"]["containers"][1]["resources"] = json!({"cpu": "1"});
        let live = record_update(&live, &updated, "ctrl", "Update", None, T0);
        // kubectl drops the sidecar, but ctrl still owns a field in it.
        let live = ok(apply(
            Some(&live),
            &deploy(1, "app:1"),
            "kubectl",
            false,
            T1,
        ));
        let cs = &live["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[1], json!({"name": "side", "resources": {"cpu": "1"}}));
    }

    #[test]
    fn finalizers_are_a_set_and_atomic_lists_replace() {
        let mut cfg = deploy(1, "app:1");
        cfg["metadata"]["finalizers"] = json!(["a"]);
        cfg["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "x"}]);
        let live = ok(apply(None, &cfg, "kubectl", false, T0));
        let mf = &live["metadata"]["managedFields"][0]["fieldsV1"];
        assert_eq!(mf["f:metadata"]["f:finalizers"], json!({"v:\"a\"": {}}));
        assert_eq!(
            mf["f:spec"]["f:template"]["f:spec"]["f:tolerations"],
            json!({})
        );
        let mut other = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "finalizers": ["b"]}});
        let live = ok(apply(Some(&live), &other, "gc", false, T0));
        assert_eq!(live["metadata"]["finalizers"], json!(["a", "b"]));
        other["metadata"]["finalizers"] = json!([]);
        let live = ok(apply(Some(&live), &other, "gc", false, T1));
        assert_eq!(live["metadata"]["finalizers"], json!(["a"]));
    }

    #[test]
    fn before_first_apply_owns_unmanaged_objects() {
        let live = deploy(1, "app:1");
        let err = apply(Some(&live), &deploy(2, "app:1"), "kubectl", false, T1);
        let Err(ApplyError::Conflict(c)) = err else {
            panic!("expected a conflict, got {err:?}");
        };
        assert!(
            c.message.starts_with(
                "Apply failed with 1 conflict: conflict with \"before-first-apply\" using apps/v1"
            ),
            "{}",
            c.message
        );
    }

    #[test]
    fn a_status_map_applied_anew_keeps_only_the_keys_applied() {
        let dso = |keys: std::ops::Range<usize>| {
            let statuses: Map<String, Value> = keys
                .map(|i| {
                    (
                        format!("member-{i}"),
                        json!({"state": "Ready", "currentReplicas": 1}),
                    )
                })
                .collect();
            json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
                "metadata": {"name": "app", "namespace": "default"},
                "status": {"memberClusterStatuses": statuses}})
        };
        let opts = ApplyOptions {
            manager: "kedge-hub",
            force: true,
            now: T1,
            subresource: Some("status"),
        };
        let live = ok(apply(
            None,
            &json!({"apiVersion": "kedge.dev/v1alpha1",
            "kind": "DistributedScaledObject", "metadata": {"name": "app", "namespace": "default"},
            "spec": {}}),
            "kubectl",
            false,
            T0,
        ));
        let first = ok(apply_subresource(Some(&live), &dso(0..1000), opts));
        let second = ok(apply_subresource(Some(&first), &dso(63..1063), opts));
        let keys = second["status"]["memberClusterStatuses"]
            .as_object()
            .unwrap();
        assert_eq!(keys.len(), 1000);
        assert!(!keys.contains_key("member-0"));
    }

    #[test]
    fn status_apply_is_separate() {
        let live = ok(apply(None, &deploy(1, "app:1"), "kubectl", false, T0));
        let status = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 9},
            "status": {"readyReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]}});
        let opts = ApplyOptions {
            manager: "kedge-status",
            force: false,
            now: T1,
            subresource: Some("status"),
        };
        let out = ok(apply_subresource(Some(&live), &status, opts));
        assert_eq!(out["spec"]["replicas"], 1, "status apply ignores spec");
        assert_eq!(out["status"]["readyReplicas"], 1);
        let e = entries_of(&out).unwrap_or_default();
        let st = e.iter().find(|e| e.manager == "kedge-status");
        assert!(st.is_some_and(|e| e.subresource.as_deref() == Some("status")));
        // A main-resource apply ignores status.
        let out2 = ok(apply(Some(&out), &status, "kubectl", true, T1));
        assert_eq!(out2["status"]["readyReplicas"], 1);
        assert_eq!(out2["spec"]["replicas"], 9);
    }

    #[test]
    fn record_update_transfers_and_drops_ownership() {
        let live = ok(apply(None, &deploy(2, "app:1"), "kubectl", false, T0));
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(4);
        let out = record_update(&live, &scaled, "kedge-agent", "Update", Some("scale"), T1);
        let es = entries_of(&out).unwrap_or_default();
        let rep: Path = vec![Pe::Field("spec".into()), Pe::Field("replicas".into())];
        assert!(es.iter().any(|e| e.manager == "kedge-agent"
            && e.subresource.as_deref() == Some("scale")
            && e.fields == FieldSet::from([rep.clone()])));
        assert!(
            es.iter()
                .all(|e| e.manager == "kedge-agent" || !e.fields.contains(&rep))
        );
        // Now kubectl re-applying replicas 2 conflicts with the scale writer.
        let err = apply(Some(&out), &deploy(2, "app:1"), "kubectl", false, T1);
        let Err(ApplyError::Conflict(c)) = err else {
            panic!("expected a conflict, got {err:?}");
        };
        assert_eq!(
            c.causes[0].message,
            "conflict with \"kedge-agent\" with subresource \"scale\" using apps/v1 at \
             2026-01-01T00:01:00Z"
        );

        // Removing a label drops it from every manager; a no-op update adds no entry.
        let mut unlabeled = out.clone();
        unlabeled["metadata"]["labels"] = json!({});
        let out2 = record_update(&out, &unlabeled, "editor", "Update", None, T1);
        assert!(!managers(&out2).iter().any(|(m, _)| m == "editor"));
        let es = entries_of(&out2).unwrap_or_default();
        assert!(es.iter().all(|e| {
            !e.fields
                .iter()
                .any(|p| p.len() >= 3 && p.get(1) == Some(&Pe::Field("labels".into())))
        }));
    }

    #[test]
    fn bad_requests() {
        for bad in [
            json!([]),
            json!({"kind": "Deployment"}),
            json!({"apiVersion": "v1"}),
        ] {
            let err = apply(None, &bad, "m", false, T0);
            assert_eq!(err.map_err(|e| e.status_code()), Err(400), "{bad}");
        }
    }

    fn arb_obj() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (0i64..3).prop_map(|n| json!(n)),
            "[a-c]{0,2}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(5, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("spec".to_string()),
                        Just("template".to_string()),
                        Just("containers".to_string()),
                        Just("ports".to_string()),
                        Just("containerPort".to_string()),
                        Just("name".to_string()),
                        Just("metadata".to_string()),
                        Just("labels".to_string()),
                        Just("finalizers".to_string()),
                        Just("managedFields".to_string()),
                        Just("status".to_string()),
                        Just("conditions".to_string()),
                        Just("type".to_string()),
                    ],
                    inner,
                    0..4,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map(
            prop_oneof![
                Just("metadata".to_string()),
                Just("spec".to_string()),
                Just("status".to_string())
            ],
            tree,
            0..3,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest! {
        #[test]
        fn fields_v1_round_trips(labels in prop::collection::btree_map("[a-z]{1,5}", "[a-z0-9]{0,5}", 0..5),
                                 names in prop::collection::btree_set("[a-z]{1,5}", 1..4),
                                 replicas in 0i64..10) {
            let containers: Vec<Value> = names.iter().map(|n| json!({"name": n, "image": n})).collect();
            let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "x", "labels": labels},
                "spec": {"replicas": replicas, "template": {"spec": {"containers": containers}}}});
            let set = field_set(&obj, "Deployment", Scope::Main);
            prop_assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
        }

        /// Re-applying the same configuration changes nothing but the entry's time, and
        /// every applied field is in the result.
        #[test]
        fn apply_is_idempotent_and_keeps_applied_fields(
            labels in prop::collection::btree_map("[a-z]{1,4}", "[a-z0-9]{0,4}", 0..4),
            names in prop::collection::btree_set("[a-z]{1,4}", 1..4),
            replicas in 0i64..5,
        ) {
            let containers: Vec<Value> =
                names.iter().map(|n| json!({"name": n, "image": format!("{n}:1")})).collect();
            let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "x", "labels": labels},
                "spec": {"replicas": replicas, "template": {"spec": {"containers": containers}}}});
            let once = apply(None, &cfg, "m", false, T0);
            prop_assert!(once.is_ok());
            let once = once.unwrap_or_default();
            let twice = apply(Some(&once), &cfg, "m", false, T0);
            prop_assert_eq!(twice.as_ref(), Ok(&once));
            for p in field_set(&cfg, "Deployment", Scope::Main) {
                prop_assert_eq!(get_at(&once, &p), get_at(&cfg, &p), "{}", path_string(&p));
            }
        }

        #[test]
        fn arbitrary_objects_never_panic(live in arb_obj(), applied in arb_obj(), force in any::<bool>()) {
            let mut applied = applied;
            if let Value::Object(m) = &mut applied {
                m.insert("apiVersion".into(), json!("apps/v1"));
                m.insert("kind".into(), json!("Deployment"));
            }
            if let Ok(out) = apply(Some(&live), &applied, "a", force, T0) {
                let again = apply(Some(&out), &applied, "b", force, T1);
                let _ = again.map(|o| record_update(&out, &o, "c", "Update", None, T1));
            }
            let _ = record_update(&live, &applied, "u", "Update", Some("status"), T0);
        }

        /// Reading only the root fields a write changed records what reading everything
        /// does, over a sequence of writes by three managers to the main resource and its
        /// subresources.
        #[test]
        fn reading_the_changed_roots_records_what_reading_everything_does(
            objects in prop::collection::vec(arb_obj(), 2..6),
            writers in prop::collection::vec((0usize..3, 0usize..3), 5),
        ) {
            let managers = ["hub", "agent", "kubectl"];
            let subresources = [None, Some("status"), Some("scale")];
            let mut live = Value::Null;
            for (i, obj) in objects.iter().enumerate() {
                let mut obj = obj.clone();
                if let Value::Object(m) = &mut obj {
                    m.insert("apiVersion".into(), json!("apps/v1"));
                    m.insert("kind".into(), json!("Deployment"));
                    // The stored entries ride along, as a client's read-modify-write sends them.
                    if let Some(mf) = managed_fields(&live) {
                        let meta = m.entry("metadata").or_insert_with(|| json!({}));
                        if meta.is_object() {
                            meta["managedFields"] = Value::Array(mf.clone());
                        }
                    }
                }
                let (who, sub) = writers[i % writers.len()];
                let write = Write {
                    manager: managers[who],
                    operation: "Update",
                    subresource: subresources[sub],
                    now: if i % 2 == 0 { T0 } else { T1 },
                };
                let fast = record_update_reading(&live, &obj, write, Reading::ChangedRoots);
                let all = record_update_reading(&live, &obj, write, Reading::Everything);
                prop_assert_eq!(&fast, &all);
                live = fast;
            }
        }

        #[test]
        fn garbage_managed_fields_never_panic(mf in "\\PC{0,60}") {
            let mut live = deploy(1, "a");
            live["metadata"]["managedFields"] = json!([
                {"manager": "x", "operation": "Update", "fieldsV1": {mf.clone(): {}, "f:spec": {mf: {}}}}
            ]);
            let _ = apply(Some(&live), &deploy(2, "b"), "m", false, T0);
            let _ = record_update(&live, &deploy(3, "c"), "m", "Update", None, T0);
        }
    }
}
