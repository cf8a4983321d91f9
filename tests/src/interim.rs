//! Seams for the pure modules (selectors, quantities, patches, tables) that the
//! server calls through. Each function here is the single place the server
//! depends on that behaviour, so the dedicated modules plug in behind it.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::util::{get_path, labels_of, rfc3339};

/// A parsed label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
#[derive(Debug, Clone, Default)]
pub struct LabelSel {
    reqs: Vec<Req>,
}

#[derive(Debug, Clone)]
enum Req {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl LabelSel {
    /// Parses the string form used in `labelSelector=`.
    pub fn parse(s: &str) -> Result<LabelSel> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || Error::BadRequest(format!("unable to parse requirement: {part:?}"));
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(valid_key(k.trim()).ok_or_else(bad)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotIn(valid_key(k.trim()).ok_or_else(bad)?, vec![v.trim().into()])
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Req::In(valid_key(k.trim()).ok_or_else(bad)?, vec![v.trim().into()])
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(
                    valid_key(k.trim()).ok_or_else(bad)?,
                    set(rest).ok_or_else(bad)?,
                )
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(
                    valid_key(k.trim()).ok_or_else(bad)?,
                    set(rest).ok_or_else(bad)?,
                )
            } else {
                Req::Exists(valid_key(part).ok_or_else(bad)?)
            };
            reqs.push(req);
        }
        Ok(LabelSel { reqs })
    }

    /// Converts a `metav1.LabelSelector` object.
    pub fn from_json(v: &Value) -> Result<LabelSel> {
        let mut reqs = Vec::new();
        if let Some(m) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in m {
                let val = val
                    .as_str()
                    .ok_or_else(|| Error::Invalid(format!("matchLabels.{k} must be a string")))?;
                reqs.push(Req::In(k.clone(), vec![val.to_string()]));
            }
        }
        if let Some(exprs) = v.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let req = match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Req::In(key.into(), values),
                    Some("NotIn") => Req::NotIn(key.into(), values),
                    Some("Exists") => Req::Exists(key.into()),
                    Some("DoesNotExist") => Req::NotExists(key.into()),
                    other => {
                        return Err(Error::Invalid(format!(
                            "invalid label selector operator {other:?}"
                        )));
                    }
                };
                reqs.push(req);
            }
        }
        Ok(LabelSel { reqs })
    }

    /// True when the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Does the label set satisfy every requirement?
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// The canonical string form (used for `/scale` `status.selector`).
    pub fn to_string_form(&self) -> String {
        self.reqs
            .iter()
            .map(|r| match r {
                Req::In(k, vs) if vs.len() == 1 => format!("{k}={}", vs[0]),
                Req::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Req::NotIn(k, vs) if vs.len() == 1 => format!("{k}!={}", vs[0]),
                Req::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Req::Exists(k) => k.clone(),
                Req::NotExists(k) => format!("!{k}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn valid_key(k: &str) -> Option<String> {
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| k.to_string())
}

fn set(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|s| s.trim().to_string()).collect())
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A parsed field selector (`metadata.name=x,status.phase!=Running`).
#[derive(Debug, Clone, Default)]
pub struct FieldSel {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSel {
    /// Parses the string form used in `fieldSelector=`.
    pub fn parse(s: &str) -> Result<FieldSel> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, true, v)
            } else {
                return Err(Error::BadRequest(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            reqs.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSel { reqs })
    }

    /// Does the object satisfy every requirement? Missing fields compare as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(k, eq, v)| {
            let actual = match get_path(obj, k) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *v) == *eq
        })
    }
}

/// Parses a Kubernetes quantity to milli-units (`"100m"` → 100, `"1Gi"` → 1073741824000).
pub fn parse_quantity(s: &str) -> Result<i128> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let bad = || {
        Error::Invalid(format!(
            "quantities must match the regular expression: {s:?}"
        ))
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let neg = int_part.starts_with('-');
    let int_part = int_part.trim_start_matches(['+', '-']);
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(bad());
    }
    let int: i128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| bad())?
    };
    let frac_digits = &frac_part[..frac_part.len().min(9)];
    let frac: i128 = if frac_digits.is_empty() {
        0
    } else {
        frac_digits.parse().map_err(|_| bad())?
    };
    let frac_scale = 10i128.pow(frac_digits.len() as u32);
    // value = (int + frac/frac_scale) * mult_num / mult_den, in milli-units.
    let (mult_num, mult_den): (i128, i128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "u" => (1, 1000),
        "n" => (1, 1_000_000),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "Ki" => (1024 * 1000, 1),
        "Mi" => (1024i128.pow(2) * 1000, 1),
        "Gi" => (1024i128.pow(3) * 1000, 1),
        "Ti" => (1024i128.pow(4) * 1000, 1),
        "Pi" => (1024i128.pow(5) * 1000, 1),
        _ => return Err(bad()),
    };
    let total = (int * frac_scale + frac) * mult_num;
    let den = frac_scale * mult_den;
    let v = (total + den - 1) / den;
    Ok(if neg { -v } else { v })
}

/// Applies a strategic-merge patch. Approximation: JSON merge semantics with
/// `$patch`/`$retainKeys`/`$setElementOrder` directives stripped.
pub fn strategic_merge(target: &mut Value, patch: &Value, _kind: &str) -> Result<()> {
    let mut p = patch.clone();
    strip_directives(&mut p);
    json_patch::merge(target, &p);
    Ok(())
}

fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$') && !k.starts_with("$setElementOrder/"));
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

/// Server-side apply. Approximation: the applied configuration is deep-merged
/// over the live object (maps merge, lists and scalars are replaced) and the
/// manager is recorded in `managedFields`; nothing is removed and there are no
/// conflicts between managers.
pub fn apply(live: Option<&Value>, applied: &Value, manager: &str, now_ms: i64) -> Value {
    let mut out = live.cloned().unwrap_or_else(|| json!({}));
    deep_merge(&mut out, applied);
    let entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": applied.get("apiVersion").cloned().unwrap_or(Value::Null),
        "time": rfc3339(now_ms),
        "fieldsType": "FieldsV1",
        "fieldsV1": {},
    });
    let meta = crate::util::meta_mut(&mut out);
    let mut fields: Vec<Value> = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    fields.retain(|f| {
        !(f.get("manager").and_then(Value::as_str) == Some(manager)
            && f.get("operation").and_then(Value::as_str) == Some("Apply"))
    });
    fields.push(entry);
    meta.insert("managedFields".into(), Value::Array(fields));
    out
}

fn deep_merge(target: &mut Value, src: &Value) {
    match (target, src) {
        (Value::Object(t), Value::Object(s)) => {
            for (k, v) in s {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        deep_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, s) => *t = s.clone(),
    }
}

/// Builds a `meta.k8s.io/v1` Table: NAME, CRD printer columns if given, AGE.
pub fn to_table(
    objects: &[&Value],
    columns: Option<&Value>,
    now_ms: i64,
    include_obj: bool,
) -> Value {
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let mut paths = Vec::new();
    let mut has_age_col = false;
    if let Some(cols) = columns.and_then(Value::as_array) {
        for c in cols {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            let path = c
                .get("jsonPath")
                .and_then(Value::as_str)
                .unwrap_or_default();
            has_age_col |= path == ".metadata.creationTimestamp";
            defs.push(json!({
                "name": name,
                "type": c.get("type").cloned().unwrap_or(json!("string")),
                "format": c.get("format").cloned().unwrap_or(json!("")),
                "description": c.get("description").cloned().unwrap_or(json!("")),
                "priority": c.get("priority").cloned().unwrap_or(json!(0)),
            }));
            paths.push((
                path.to_string(),
                c.get("type").and_then(Value::as_str) == Some("date"),
            ));
        }
    }
    if !has_age_col {
        defs.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp", "priority": 0}));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(crate::util::meta_str(o, "name").unwrap_or_default())];
            for (p, is_date) in &paths {
                let cell = match get_path(o, p) {
                    Some(Value::String(s)) if *is_date => json!(age(s, now_ms)),
                    Some(v) => v.clone(),
                    None => Value::Null,
                };
                cells.push(cell);
            }
            if !has_age_col {
                let created = crate::util::meta_str(o, "creationTimestamp").unwrap_or_default();
                cells.push(json!(age(created, now_ms)));
            }
            let object = if include_obj {
                (*o).clone()
            } else {
                partial_meta(o)
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": defs,
        "rows": rows,
    })
}

fn partial_meta(o: &Value) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), json!("PartialObjectMetadata"));
    m.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
    m.insert(
        "metadata".into(),
        o.get("metadata").cloned().unwrap_or(json!({})),
    );
    Value::Object(m)
}

/// Human age like kubectl's (`5s`, `3m`, `2h`, `4d`).
fn age(ts: &str, now_ms: i64) -> String {
    let Some(t) = crate::util::parse_rfc3339(ts) else {
        return "<unknown>".into();
    };
    let s = ((now_ms - t) / 1000).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Labels of an object, for selector matching.
pub fn object_labels(obj: &Value) -> BTreeMap<String, String> {
    labels_of(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors() -> Result<()> {
        let labels: BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".into(), "fe".into()),
        ]
        .into();
        assert!(LabelSel::parse("app=web")?.matches(&labels));
        assert!(LabelSel::parse("app in (web,db),!missing")?.matches(&labels));
        assert!(!LabelSel::parse("app notin (web)")?.matches(&labels));
        assert!(!LabelSel::parse("tier!=fe")?.matches(&labels));
        assert!(LabelSel::parse("a=b=c,@@").is_err());
        Ok(())
    }

    #[test]
    fn quantities() -> Result<()> {
        assert_eq!(parse_quantity("100m")?, 100);
        assert_eq!(parse_quantity("2")?, 2000);
        assert_eq!(parse_quantity("1.5")?, 1500);
        assert_eq!(parse_quantity("1Ki")?, 1_024_000);
        assert_eq!(parse_quantity("1G")?, 1_000_000_000_000);
        assert!(parse_quantity("abc").is_err());
        assert!(parse_quantity("1Xi").is_err());
        Ok(())
    }
}
