//! OpenAPI v3 structural-schema pruning and validation of custom resources, as
//! kube-apiserver's apiextensions does it: unknown fields are pruned (and reported, for
//! `fieldValidation`), nulls of non-nullable fields dropped, and then every value is checked
//! against `type`, `format` (`int32`/`int64` range), `minimum`/`maximum` (and exclusive),
//! `minLength`/`maxLength`, `pattern`, `enum`, `minItems`/`maxItems`,
//! `minProperties`/`maxProperties`, `required`, `nullable`, `x-kubernetes-int-or-string` and
//! `x-kubernetes-preserve-unknown-fields`.
//!
//! Errors are worded as `k8s.io/kube-openapi/pkg/validation/errors` words them and turned
//! into field errors as `apiextensions-apiserver/pkg/apiserver/validation` does, so that a
//! client sees the same message from kedge-sim as from a real API server. Not checked:
//! CEL (`x-kubernetes-validations`), `allOf`/`anyOf`/`oneOf`/`not`, `multipleOf`,
//! `uniqueItems`, string formats (`date-time`, `byte`, …), list-type uniqueness.
//!
//! Everything here is pure and never panics, whatever the object or the schema holds.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value};

/// The kind of a field error (`field.ErrorType`), as `details.causes[].reason` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// `FieldValueRequired`.
    Required,
    /// `FieldValueInvalid`.
    Invalid,
    /// `FieldValueTypeInvalid`.
    TypeInvalid,
    /// `FieldValueNotSupported` (enum).
    NotSupported,
    /// `FieldValueTooLong` (maxLength).
    TooLong,
    /// `FieldValueTooMany` (maxItems, maxProperties).
    TooMany,
}

impl Cause {
    /// `field.ErrorType` as it is on the wire.
    pub fn reason(self) -> &'static str {
        match self {
            Cause::Required => "FieldValueRequired",
            Cause::Invalid => "FieldValueInvalid",
            Cause::TypeInvalid => "FieldValueTypeInvalid",
            Cause::NotSupported => "FieldValueNotSupported",
            Cause::TooLong => "FieldValueTooLong",
            Cause::TooMany => "FieldValueTooMany",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Cause::Required => "Required value",
            Cause::Invalid | Cause::TypeInvalid => "Invalid value",
            Cause::NotSupported => "Unsupported value",
            Cause::TooLong => "Too long",
            Cause::TooMany => "Too many",
        }
    }
}

/// One field error, as `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// What kind of error.
    pub cause: Cause,
    /// The field path as the API server reports it (`spec.x[0].y`, or `<nil>`).
    pub field: String,
    /// The offending value, rendered as Go's `field.Error` renders it (`None`: omitted).
    pub value: Option<String>,
    /// The detail after the value.
    pub detail: String,
    /// Where the value is in the object (for ratcheting); the field path but for `<nil>`.
    pub at: String,
}

impl FieldError {
    /// `ErrorBody()`: the message without the field.
    pub fn body(&self) -> String {
        let mut s = self.cause.text().to_string();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// `Error()`: `field: body`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// The message of an `Invalid` Status for `errors`, as `errors.NewInvalid` words it:
/// `Kind.group "name" is invalid: e` or `... is invalid: [e1, e2]`.
pub fn invalid_message(qualified_kind: &str, name: &str, errors: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errors {
        let m = e.message();
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    let name = go_quote(name);
    match seen.as_slice() {
        [] => format!("{qualified_kind} {name} is invalid"),
        [one] => format!("{qualified_kind} {name} is invalid: {one}"),
        many => format!("{qualified_kind} {name} is invalid: [{}]", many.join(", ")),
    }
}

/// Go's `%q` of a string (close enough: JSON escaping, which agrees on everything printable).
pub fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// Go's `%v` of a float64: the shortest representation, in exponent form when the exponent
/// is below -4 or at least 6 (`1e+06`, `2.147483647e+09`, `0.5`, `100000`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip representation: `2.147483647e9`.
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.unsigned_abs());
    }
    format!("{f}")
}

/// How a JSON value is rendered as a `BadValue`: strings quoted, numbers and booleans with
/// `%v`, anything else as JSON.
fn bad_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Number(n) => number_text(n),
        Value::Bool(b) => b.to_string(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn number_text(n: &serde_json::Number) -> String {
    match n.as_i64() {
        Some(i) => i.to_string(),
        None => go_float(n.as_f64().unwrap_or(f64::NAN)),
    }
}

/// A number as Go's JSON decoding into `interface{}` gives it to the validator: an `int64`
/// when it is an integer that fits, else a `float64`.
#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

fn num(n: &serde_json::Number) -> Num {
    match n.as_i64() {
        Some(i) => Num::Int(i),
        None => Num::Float(n.as_f64().unwrap_or(f64::NAN)),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

/// The types a schema node allows (`integer,string` for `x-kubernetes-int-or-string`).
fn types(schema: &Value) -> Vec<&str> {
    if flag(schema, "x-kubernetes-int-or-string") {
        return vec!["integer", "string"];
    }
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Removes what a structural schema does not declare, as the API server does when it
/// decodes a custom resource, and returns the paths of the unknown fields it removed
/// (`spec.memberCluster`, `spec.list[0].x`, `metadata.bogus`). `null` values of fields that
/// are not `nullable` are removed too (or replaced by their `default`), silently.
pub fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(map) = obj.as_object_mut() else {
        return out;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let mut unknown = Vec::new();
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => prune_metadata(value, &mut out),
            _ => match props.and_then(|p| p.get(key)) {
                Some(sub) => prune_node(sub, value, key, &mut out),
                None if flag(schema, "x-kubernetes-preserve-unknown-fields") => {}
                None => unknown.push(key.clone()),
            },
        }
    }
    for key in unknown {
        map.remove(&key);
        out.push(key);
    }
    drop_nulls(schema, map);
    out.sort();
    out
}

/// The fields of `ObjectMeta`: anything else under `metadata` is pruned.
const OBJECT_META: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

fn prune_metadata(meta: &mut Value, out: &mut Vec<String>) {
    let Some(map) = meta.as_object_mut() else {
        return;
    };
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !OBJECT_META.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in unknown {
        map.remove(&key);
        out.push(format!("metadata.{key}"));
    }
}

fn prune_node(schema: &Value, value: &mut Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let mut unknown = Vec::new();
            for (key, child) in map.iter_mut() {
                let at = join(path, key);
                if let Some(sub) = props.and_then(|p| p.get(key)) {
                    prune_node(sub, child, &at, out);
                } else if let Some(sub) = additional.filter(|a| a.is_object()) {
                    prune_node(sub, child, &at, out);
                } else if embedded && matches!(key.as_str(), "apiVersion" | "kind") {
                } else if embedded && key == "metadata" {
                    let mut sub = Vec::new();
                    prune_metadata(child, &mut sub);
                    out.extend(sub.into_iter().map(|s| join(path, &s)));
                } else if preserve || additional.and_then(Value::as_bool) == Some(true) {
                } else {
                    unknown.push(key.clone());
                }
            }
            for key in unknown {
                map.remove(&key);
                out.push(join(path, &key));
            }
            drop_nulls(schema, map);
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
                for (i, child) in items.iter_mut().enumerate() {
                    prune_node(item, child, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// `PruneNonNullableNullsWithoutDefaults`: a `null` in a field that is not `nullable` is
/// removed, or replaced by the field's `default`.
fn drop_nulls(schema: &Value, map: &mut Map<String, Value>) {
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let nulls: Vec<String> = map
        .iter()
        .filter(|(_, v)| v.is_null())
        .map(|(k, _)| k.clone())
        .collect();
    for key in nulls {
        let Some(sub) = props.and_then(|p| p.get(&key)).or(additional) else {
            continue;
        };
        if flag(sub, "nullable") {
            continue;
        }
        match sub.get("default") {
            Some(d) => {
                map.insert(key, d.clone());
            }
            None => {
                map.remove(&key);
            }
        }
    }
}

/// Every violation of `schema` in `obj`, in the order kube-openapi finds them within a
/// node (type, string, format, number, items, enum, properties, required); properties in
/// the schema's order. `metadata`, `apiVersion` and `kind` of the root are left to the
/// API server's own checks.
pub fn validate(schema: &Value, obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(map) = obj.as_object() else {
        out.push(FieldError {
            cause: Cause::TypeInvalid,
            field: "<nil>".into(),
            value: Some("\"\"".into()),
            detail: "must be an object".into(),
            at: String::new(),
        });
        return out;
    };
    let mut root = schema.clone();
    if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
        for k in ["apiVersion", "kind", "metadata"] {
            props.remove(k);
        }
    }
    let mut body = map.clone();
    for k in ["apiVersion", "kind", "metadata"] {
        body.remove(k);
    }
    node(&root, &Value::Object(body), "", &mut out);
    out
}

/// Validates `value` against `schema` as its own document, reporting fields under
/// `prefix`, as the status subresource is validated (`ValidateStatusUpdate`: the status
/// schema alone, at `field.NewPath("status")`): the field paths carry the prefix, the
/// messages do not (`status.count: Invalid value: -1: count in body should be …`).
pub fn validate_at(schema: &Value, value: &Value, prefix: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    node(schema, value, "", &mut out);
    let under = |path: &str| match path {
        "" | "<nil>" => prefix.to_string(),
        p => join(prefix, p),
    };
    for e in &mut out {
        e.at = under(&e.at);
        e.field = under(&e.field);
    }
    out
}

fn err(cause: Cause, path: &str, value: Option<String>, detail: String) -> FieldError {
    FieldError {
        cause,
        field: path.to_string(),
        value,
        detail,
        at: path.to_string(),
    }
}

fn data_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) => match num(n) {
            Num::Int(_) => "integer",
            Num::Float(_) => "number",
        },
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The format kube-openapi keeps after `StripUnsupportedFormatsPostProcess`, for numbers.
fn number_format(schema: &Value, types: &[&str]) -> Option<&'static str> {
    let format = schema.get("format").and_then(Value::as_str)?;
    match (types, format) {
        (["integer"], "int32") => Some("int32"),
        (["integer"], "int64") => Some("int64"),
        (["number"], "float") => Some("float"),
        (["number"], "double") => Some("double"),
        _ => None,
    }
}

fn node(schema: &Value, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    let ts = types(schema);
    let shown = if path.is_empty() { "." } else { path };
    // type
    if value.is_null() {
        if !ts.is_empty() && !flag(schema, "nullable") {
            out.push(err(
                Cause::TypeInvalid,
                path,
                Some("\"null\"".into()),
                format!("{shown} in body must be of type {}: \"null\"", ts.join(",")),
            ));
        }
        check_enum(schema, value, path, out);
        return;
    }
    let sch = data_type(value);
    let is_float_int = matches!(value, Value::Number(n) if matches!(num(n), Num::Float(f) if f.is_finite() && f.fract() == 0.0))
        && ts.contains(&"integer");
    let is_int_float = sch == "integer" && ts.contains(&"number");
    if !(ts.is_empty() || ts.contains(&sch) || is_float_int || is_int_float) {
        out.push(err(
            Cause::TypeInvalid,
            path,
            Some(go_quote(sch)),
            format!(
                "{shown} in body must be of type {}: {}",
                ts.join(","),
                go_quote(sch)
            ),
        ));
    }
    match value {
        Value::String(s) => check_string(schema, s, path, shown, out),
        Value::Number(n) => check_number(schema, &ts, n, path, shown, out),
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
                for (i, child) in items.iter().enumerate() {
                    node(item, child, &format!("{path}[{i}]"), out);
                }
            }
            let size = items.len() as u64;
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && size < min
            {
                out.push(err(
                    Cause::Invalid,
                    path,
                    Some(size.to_string()),
                    format!("{shown} in body should have at least {min} items"),
                ));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && size > max
            {
                out.push(too_many(path, size, max));
            }
        }
        _ => {}
    }
    check_enum(schema, value, path, out);
    if let Value::Object(map) = value {
        check_object(schema, map, path, shown, out);
    }
}

fn too_many(path: &str, actual: u64, max: u64) -> FieldError {
    let items = if max == 1 { "item" } else { "items" };
    err(
        Cause::TooMany,
        path,
        Some(actual.to_string()),
        format!("must have at most {max} {items}"),
    )
}

fn check_string(schema: &Value, s: &str, path: &str, shown: &str, out: &mut Vec<FieldError>) {
    let len = s.chars().count() as u64;
    // kube-openapi stops at the first failing string check.
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        let bytes = if max == 1 { "byte" } else { "bytes" };
        out.push(err(
            Cause::TooLong,
            path,
            None,
            format!("may not be more than {max} {bytes}"),
        ));
        return;
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        out.push(err(
            Cause::Invalid,
            path,
            Some(go_quote(s)),
            format!("{shown} in body should be at least {min} chars long"),
        ));
        return;
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        let detail = match matches(pattern, s) {
            Ok(true) => return,
            Ok(false) => format!("{shown} in body should match '{pattern}'"),
            Err(e) => {
                format!("{shown} in body should match '{pattern}, but pattern is invalid: {e}'")
            }
        };
        out.push(err(Cause::Invalid, path, Some(go_quote(s)), detail));
    }
}

/// Whether `s` matches `pattern` (Go's RE2 and Rust's `regex` agree on the syntax schemas
/// use); compiled patterns are cached, and a pattern too large to compile is an error.
fn matches(pattern: &str, s: &str) -> Result<bool, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, regex::Regex>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // A poisoned cache only means another thread panicked while inserting; its map is
    // still a map of compiled patterns.
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(re) = cache.get(pattern) {
        return Ok(re.is_match(s));
    }
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| e.to_string())?;
    let hit = re.is_match(s);
    if cache.len() < 1_024 {
        cache.insert(pattern.to_string(), re);
    }
    Ok(hit)
}

fn check_number(
    schema: &Value,
    ts: &[&str],
    n: &serde_json::Number,
    path: &str,
    shown: &str,
    out: &mut Vec<FieldError>,
) {
    let v = num(n);
    let value = Some(number_text(n));
    // `IsValueValidAgainstRange`: the value must fit the type's format. kube-openapi returns
    // a plain error here, which apiextensions reports at the `<nil>` path.
    let type_name = match ts {
        ["integer"] => "integer",
        ["number"] => "number",
        _ => "",
    };
    let format = number_format(schema, ts);
    if type_name == "integer" {
        let fits = match (v, format) {
            (Num::Int(i), Some("int32")) => i32::try_from(i).is_ok(),
            (Num::Int(_), _) => true,
            (Num::Float(f), Some("int32")) => {
                f.fract() == 0.0 && f >= f64::from(i32::MIN) && f <= f64::from(i32::MAX)
            }
            (Num::Float(f), _) => {
                f.fract() == 0.0
                    && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f)
            }
        };
        if !fits {
            let detail = match format {
                Some(f) => {
                    format!("Checked value must be of type integer with format {f} in {shown}")
                }
                None => {
                    format!("Checked value must be of type integer (default format) in {shown}")
                }
            };
            out.push(FieldError {
                cause: Cause::Invalid,
                field: "<nil>".into(),
                value: Some("\"\"".into()),
                detail,
                at: path.to_string(),
            });
        }
    }
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(min) = bound("minimum") {
        let exclusive = flag(schema, "exclusiveMinimum");
        let (below, shown_min) = match v {
            Num::Int(i) => {
                let m = min as i64;
                (if exclusive { i <= m } else { i < m }, m.to_string())
            }
            Num::Float(f) => (if exclusive { f <= min } else { f < min }, go_float(min)),
        };
        if below {
            let relation = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.push(err(
                Cause::Invalid,
                path,
                value.clone(),
                format!("{shown} in body should be {relation} {shown_min}"),
            ));
        }
    }
    if let Some(max) = bound("maximum") {
        let exclusive = flag(schema, "exclusiveMaximum");
        let (above, shown_max) = match v {
            Num::Int(i) => {
                let m = max as i64;
                (if exclusive { i >= m } else { i > m }, m.to_string())
            }
            Num::Float(f) => (if exclusive { f >= max } else { f > max }, go_float(max)),
        };
        if above {
            let relation = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            out.push(err(
                Cause::Invalid,
                path,
                value,
                format!("{shown} in body should be {relation} {shown_max}"),
            ));
        }
    }
}

fn check_enum(schema: &Value, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    let Some(allowed) = schema.get("enum").and_then(Value::as_array) else {
        return;
    };
    if allowed.is_empty() {
        return;
    }
    let same = |a: &Value| match (a, value) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == value,
    };
    if allowed.iter().any(same) {
        return;
    }
    let supported: Vec<String> = allowed
        .iter()
        .map(|a| match a {
            Value::String(s) => go_quote(s),
            other => go_quote(&serde_json::to_string(other).unwrap_or_default()),
        })
        .collect();
    out.push(err(
        Cause::NotSupported,
        path,
        Some(bad_value(value)),
        format!("supported values: {}", supported.join(", ")),
    ));
}

fn check_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    shown: &str,
    out: &mut Vec<FieldError>,
) {
    let count = map.len() as u64;
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && count < min
    {
        out.push(err(
            Cause::Invalid,
            path,
            Some(count.to_string()),
            format!("{shown} in body should have at least {min} properties"),
        ));
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && count > max
    {
        out.push(too_many(path, count, max));
    }
    let props = schema.get("properties").and_then(Value::as_object);
    if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        for (key, child) in map {
            if props.is_none_or(|p| !p.contains_key(key)) {
                node(additional, child, &join(path, key), out);
            }
        }
    }
    if let Some(props) = props {
        for (key, sub) in props {
            if let Some(child) = map.get(key) {
                node(sub, child, &join(path, key), out);
            }
        }
    }
    for key in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(key) {
            out.push(err(Cause::Required, &join(path, key), None, String::new()));
        }
    }
}

/// Validation ratcheting (`CRDValidationRatcheting`, on by default): on an update, an error
/// about a value that the update did not change is dropped, so an object stored before a
/// stricter schema can still be updated (its status written, its labels changed).
pub fn ratchet(errors: Vec<FieldError>, old: &Value, new: &Value) -> Vec<FieldError> {
    errors
        .into_iter()
        .filter(|e| {
            // A missing required field is unchanged when its parent is.
            let at = if e.cause == Cause::Required {
                parent(&e.at)
            } else {
                e.at.as_str()
            };
            match (lookup(old, at), lookup(new, at)) {
                (Some(a), Some(b)) => a != b,
                _ => true,
            }
        })
        .collect()
}

fn parent(path: &str) -> &str {
    match path.rfind(['.', '[']) {
        Some(i) => &path[..i],
        None => "",
    }
}

/// The value at a field path (`spec.list[2].name`); keys containing `.` or `[` are not
/// told apart from nesting, which only makes ratcheting keep an error it could drop.
fn lookup<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut at = obj;
    if path.is_empty() {
        return Some(at);
    }
    for part in path.split('.') {
        let (key, indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            at = at.get(key)?;
        }
        for index in indices.split('[').filter(|s| !s.is_empty()) {
            let i: usize = index.trim_end_matches(']').parse().ok()?;
            at = at.get(i)?;
        }
    }
    Some(at)
}

/// Fields a JSON object names twice (`spec.x`, `spec.list[0].y`), which strict decoding
/// refuses; `None` when `bytes` is not JSON at all (the caller reports that).
pub fn duplicate_fields(bytes: &[u8]) -> Option<Vec<String>> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    struct Seed<'a> {
        path: String,
        out: &'a mut Vec<String>,
        depth: usize,
    }
    impl<'de> DeserializeSeed<'de> for Seed<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Seed<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut i = 0;
            loop {
                let seed = Seed {
                    path: format!("{}[{i}]", self.path),
                    out: &mut *self.out,
                    depth: self.depth + 1,
                };
                if seq.next_element_seed(seed)?.is_none() {
                    return Ok(());
                }
                i += 1;
            }
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = join(&self.path, &key);
                if !seen.insert(key) && !self.out.contains(&path) {
                    self.out.push(path.clone());
                }
                map.next_value_seed(Seed {
                    path,
                    out: &mut *self.out,
                    depth: self.depth + 1,
                })?;
            }
            Ok(())
        }
    }
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Seed {
        path: String::new(),
        out: &mut out,
        depth: 0,
    }
    .deserialize(&mut de)
    .ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "required": ["target"], "properties": {
                "target": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 63,
                             "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
                "value": {"type": "integer", "format": "int32",
                          "minimum": -2147483648.0, "maximum": 2147483647.0},
                "total": {"type": "integer", "format": "int32", "minimum": 0.0, "maximum": 1000000.0},
                "ratio": {"type": "number", "exclusiveMinimum": true, "minimum": 0.0},
                "mode": {"type": "string", "enum": ["a", "b"], "nullable": true},
                "port": {"x-kubernetes-int-or-string": true},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "labels": {"type": "object", "maxProperties": 2,
                           "additionalProperties": {"type": "string"}},
                "members": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
                    "type": "object", "properties": {"name": {"type": "string"}}}},
                "flag": {"type": "boolean", "default": false}
            }},
            "status": {"type": "object", "properties": {"count": {"type": "integer"}}}
        }})
    }

    fn messages(obj: Value) -> Vec<String> {
        validate(&schema(), &obj)
            .iter()
            .map(FieldError::message)
            .collect()
    }

    fn valid() -> Value {
        json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
               "spec": {"target": {"name": "web"}}})
    }

    fn with(path: &str, v: Value) -> Value {
        let mut obj = valid();
        obj["spec"][path] = v;
        obj
    }

    #[test]
    fn a_valid_object_has_no_errors() {
        assert!(messages(valid()).is_empty());
        let all = json!({"metadata": {}, "spec": {"target": {"name": "a.b"}, "value": -5,
            "total": 3, "ratio": 0.5, "mode": "a", "port": "http", "free": {"x": [1]},
            "labels": {"a": "b"}, "members": [{"name": "m"}], "flag": true},
            "status": {"count": 1}});
        assert_eq!(
            messages(all),
            vec![
                "spec.target.name: Invalid value: \"a.b\": spec.target.name in body should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
            ]
        );
        assert!(messages(with("port", json!(8080))).is_empty());
    }

    #[test]
    fn int32_bounds_as_kube_apiserver_words_them() {
        assert_eq!(
            messages(with("value", json!(3_000_000_000_i64))),
            vec![
                "<nil>: Invalid value: \"\": Checked value must be of type integer with format int32 in spec.value",
                "spec.value: Invalid value: 3000000000: spec.value in body should be less than or equal to 2147483647",
            ]
        );
        assert_eq!(
            messages(with("total", json!(-1))),
            vec![
                "spec.total: Invalid value: -1: spec.total in body should be greater than or equal to 0"
            ]
        );
        // A float is compared as a float and printed as Go prints one.
        assert_eq!(
            messages(with("total", json!(5e9))),
            vec![
                "<nil>: Invalid value: \"\": Checked value must be of type integer with format int32 in spec.total",
                "spec.total: Invalid value: 5e+09: spec.total in body should be less than or equal to 1e+06",
            ]
        );
        assert!(
            messages(with("total", json!(7.0))).is_empty(),
            "an integral float is an integer"
        );
        assert_eq!(
            messages(with("ratio", json!(0))),
            vec!["spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0"]
        );
    }

    #[test]
    fn types_required_enums_lengths_and_counts() {
        assert_eq!(
            messages(with("total", json!("7"))),
            vec![
                "spec.total: Invalid value: \"string\": spec.total in body must be of type integer: \"string\""
            ]
        );
        assert_eq!(
            messages(json!({"spec": {}})),
            vec!["spec.target: Required value"]
        );
        assert_eq!(messages(json!({})), vec!["spec: Required value"]);
        assert_eq!(
            messages(with("mode", json!("c"))),
            vec!["spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\""]
        );
        let mut long = valid();
        long["spec"]["target"]["name"] = json!("m".repeat(5_000));
        assert_eq!(
            messages(long),
            vec!["spec.target.name: Too long: may not be more than 63 bytes"]
        );
        assert_eq!(
            messages(with("members", json!([{}, {}, {}]))),
            vec!["spec.members: Too many: 3: must have at most 2 items"]
        );
        assert_eq!(
            messages(with("members", json!([]))),
            vec![
                "spec.members: Invalid value: 0: spec.members in body should have at least 1 items"
            ]
        );
        assert_eq!(
            messages(with("labels", json!({"a": "1", "b": "2", "c": 3}))),
            vec![
                "spec.labels: Too many: 3: must have at most 2 items",
                "spec.labels.c: Invalid value: \"integer\": spec.labels.c in body must be of type string: \"integer\"",
            ]
        );
        assert_eq!(
            messages(with("port", json!(true))),
            vec![
                "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\""
            ]
        );
        assert_eq!(
            messages(with("members", json!([null]))),
            vec![
                "spec.members[0]: Invalid value: \"null\": spec.members[0] in body must be of type object: \"null\""
            ]
        );
    }

    #[test]
    fn the_invalid_message_lists_every_error_once() {
        let errs = validate(&schema(), &json!({"spec": {"total": -1, "mode": "c"}}));
        assert_eq!(
            invalid_message("K.x", "a", &errs),
            "K.x \"a\" is invalid: [spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\", spec.total: Invalid value: -1: spec.total in body should be greater than or equal to 0, spec.target: Required value]"
        );
        assert_eq!(
            invalid_message("K.x", "a", &errs[..1]).matches('[').count(),
            0
        );
    }

    #[test]
    fn pruning_removes_and_reports_unknown_fields_and_drops_nulls() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K",
            "metadata": {"name": "a", "bogus": 1},
            "spec": {"target": {"name": "a", "nmae": "b"}, "memberCluster": "x",
                     "free": {"anything": {"goes": 1}}, "labels": {"k": "v"},
                     "members": [{"name": "m", "weight": 2}], "flag": null, "mode": null,
                     "total": null},
            "extra": true});
        let pruned = prune(&schema(), &mut obj);
        assert_eq!(
            pruned,
            vec![
                "extra",
                "metadata.bogus",
                "spec.memberCluster",
                "spec.members[0].weight",
                "spec.target.nmae"
            ]
        );
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
                "spec": {"target": {"name": "a"}, "free": {"anything": {"goes": 1}},
                         "labels": {"k": "v"}, "members": [{"name": "m"}], "flag": false,
                         "mode": null}})
        );
    }

    #[test]
    fn the_status_is_validated_on_its_own_with_its_path_only_in_the_field() {
        let status = &schema()["properties"]["status"];
        let errs: Vec<String> = validate_at(status, &json!({"count": "x"}), "status")
            .iter()
            .map(FieldError::message)
            .collect();
        assert_eq!(
            errs,
            vec![
                "status.count: Invalid value: \"string\": count in body must be of type integer: \"string\""
            ]
        );
        let int32 =
            json!({"type": "object", "properties": {"n": {"type": "integer", "format": "int32"}}});
        let errs: Vec<String> = validate_at(&int32, &json!({"n": 3_000_000_000_i64}), "status")
            .iter()
            .map(FieldError::message)
            .collect();
        assert_eq!(
            errs,
            vec![
                "status: Invalid value: \"\": Checked value must be of type integer with format int32 in n"
            ]
        );
    }

    #[test]
    fn ratcheting_keeps_errors_only_for_what_changed() {
        let old = with("total", json!(5_000_000));
        let mut new = old.clone();
        new["status"] = json!({"count": 1});
        assert!(ratchet(validate(&schema(), &new), &old, &new).is_empty());
        new["spec"]["total"] = json!(6_000_000);
        assert_eq!(ratchet(validate(&schema(), &new), &old, &new).len(), 1);
        let old = json!({"spec": {}});
        let new = json!({"spec": {}, "status": {"count": 1}});
        assert!(ratchet(validate(&schema(), &new), &old, &new).is_empty());
    }

    #[test]
    fn duplicate_fields_are_found_with_their_paths() {
        let dups = duplicate_fields(
            br#"{"spec": {"a": 1, "b": [{"x": 1, "x": 2}], "a": 2}, "kind": "K"}"#,
        );
        assert_eq!(
            dups,
            Some(vec!["spec.b[0].x".to_string(), "spec.a".to_string()])
        );
        assert_eq!(duplicate_fields(br#"{"a": 1}"#), Some(vec![]));
        assert_eq!(duplicate_fields(b"{"), None);
    }

    #[test]
    fn go_float_formatting() {
        for (f, s) in [
            (1e6, "1e+06"),
            (2147483647.0, "2.147483647e+09"),
            (100000.0, "100000"),
            (0.5, "0.5"),
            (0.00001, "1e-05"),
            (-3.5e9, "-3.5e+09"),
            (0.0, "0"),
        ] {
            assert_eq!(go_float(f), s);
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|i| json!(i)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "[a-z.\\[\\]0-9]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("spec".to_string()),
                        Just("target".to_string()),
                        Just("name".to_string()),
                        Just("type".to_string()),
                        Just("properties".to_string()),
                        Just("items".to_string()),
                        Just("maximum".to_string()),
                        Just("pattern".to_string()),
                        Just("required".to_string()),
                        "[a-z]{1,4}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// No object, and no schema, makes the validator or the pruner panic.
        #[test]
        fn never_panics(obj in arb_json(), junk_schema in arb_json()) {
            for s in [schema(), junk_schema] {
                let mut o = obj.clone();
                let _ = prune(&s, &mut o);
                let errs = validate(&s, &o);
                let _ = ratchet(errs.clone(), &obj, &o);
                let _ = invalid_message("K.x", "a", &errs);
            }
            let bytes = serde_json::to_vec(&obj).unwrap_or_default();
            prop_assert!(duplicate_fields(&bytes).is_some());
        }

        /// After pruning, nothing is left that the schema does not declare.
        #[test]
        fn pruning_is_idempotent(obj in arb_json()) {
            let mut once = obj;
            let _ = prune(&schema(), &mut once);
            let mut twice = once.clone();
            prop_assert!(prune(&schema(), &mut twice).is_empty());
            prop_assert_eq!(once, twice);
        }
    }
}
