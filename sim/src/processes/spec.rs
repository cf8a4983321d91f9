//! What a container runs, resolved from its Pod as kubelet resolves it: argv with `$(VAR)`
//! expanded, env from values, the downward API, Secrets and ConfigMaps. Pure: objects come
//! through a lookup, and the answer is a value or the reason the container cannot start
//! yet.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use crate::util::get_path;

/// Where a reference points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A core/v1 Secret.
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

impl Source {
    fn kind(self) -> &'static str {
        match self {
            Source::Secret => "Secret",
            Source::ConfigMap => "ConfigMap",
        }
    }

    fn lower(self) -> &'static str {
        match self {
            Source::Secret => "secret",
            Source::ConfigMap => "configmap",
        }
    }
}

/// Reads a Secret or ConfigMap of the pod's namespace by name.
pub(crate) type Lookup<'a> = &'a dyn Fn(Source, &str) -> Option<Value>;

/// Why a container cannot start yet: kubelet's waiting reason and message. Kubelet retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// `CreateContainerConfigError` (env) or `ContainerCreating` (a volume).
    pub reason: &'static str,
    /// What is missing, in kubelet's words.
    pub message: String,
}

impl Blocked {
    fn config(message: String) -> Blocked {
        Blocked {
            reason: "CreateContainerConfigError",
            message,
        }
    }
}

/// The pod facts the downward API exposes besides its object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodAddrs<'a> {
    /// `status.podIP`.
    pub pod_ip: &'a str,
    /// `status.hostIP`.
    pub host_ip: &'a str,
}

/// A Secret's or ConfigMap's keys and bytes.
pub(super) fn entries(source: Source, obj: &Value) -> BTreeMap<String, Vec<u8>> {
    let b64 = |v: &Value| {
        v.as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
    };
    let mut out = BTreeMap::new();
    let (text, binary) = match source {
        Source::Secret => ("stringData", "data"),
        Source::ConfigMap => ("data", "binaryData"),
    };
    for (k, v) in obj
        .get(binary)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(bytes) = b64(v) {
            out.insert(k.clone(), bytes);
        }
    }
    for (k, v) in obj
        .get(text)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(s) = v.as_str() {
            out.insert(k.clone(), s.as_bytes().to_vec());
        }
    }
    out
}

pub(super) fn not_found(source: Source, name: &str) -> String {
    format!("{} \"{name}\" not found", source.lower())
}

/// One key of a Secret or ConfigMap (`Ok(None)`: optional and missing).
fn key_ref(
    source: Source,
    r: &Value,
    ns: &str,
    lookup: Lookup<'_>,
) -> Result<Option<String>, Blocked> {
    let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
    let key = r.get("key").and_then(Value::as_str).unwrap_or_default();
    let optional = r.get("optional").and_then(Value::as_bool) == Some(true);
    let Some(obj) = lookup(source, name) else {
        return if optional {
            Ok(None)
        } else {
            Err(Blocked::config(not_found(source, name)))
        };
    };
    match entries(source, &obj).remove(key) {
        Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        None if optional => Ok(None),
        None => Err(Blocked::config(format!(
            "couldn't find key {key} in {} {ns}/{name}",
            source.kind()
        ))),
    }
}

/// A downward-API field of the pod (`fieldRef.fieldPath`).
pub(crate) fn field(pod: &Value, path: &str, addrs: PodAddrs<'_>) -> Result<String, Blocked> {
    let s = |p: &str| {
        get_path(pod, p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let map_lines = |p: &str| {
        let lines: Vec<String> = get_path(pod, p)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
            .collect();
        lines.join("\n")
    };
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name"
        | "metadata.namespace"
        | "metadata.uid"
        | "spec.nodeName"
        | "spec.serviceAccountName" => s(path),
        "status.podIP" => addrs.pod_ip.to_string(),
        "status.podIPs" => addrs.pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => addrs.host_ip.to_string(),
        "metadata.labels" | "metadata.annotations" => map_lines(path),
        _ => {
            let (map, key) = if let Some(k) = keyed("metadata.labels['") {
                ("labels", k)
            } else if let Some(k) = keyed("metadata.annotations['") {
                ("annotations", k)
            } else {
                return Err(Blocked::config(format!("unsupported fieldPath: {path}")));
            };
            get_path(pod, &format!("metadata.{map}"))
                .and_then(|m| m.get(&key))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        }
    })
}

/// Sets `name` to `value`, keeping the position of an earlier definition (a later one wins,
/// as in kubelet).
fn set(env: &mut Vec<(String, String)>, name: &str, value: String) {
    match env.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value,
        None => env.push((name.to_string(), value)),
    }
}

fn lookup_env<'a>(env: &'a [(String, String)]) -> impl Fn(&str) -> Option<&'a str> {
    move |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A container's environment as kubelet builds it: `envFrom` first, then `env` in order
/// (each `value` expanded against what is defined before it).
pub(crate) fn env(
    pod: &Value,
    container: &Value,
    addrs: PodAddrs<'_>,
    lookup: Lookup<'_>,
) -> Result<Vec<(String, String)>, Blocked> {
    let ns = get_path(pod, "metadata.namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut out: Vec<(String, String)> = Vec::new();
    for from in container
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
        let (source, r) = match (from.get("secretRef"), from.get("configMapRef")) {
            (Some(r), _) => (Source::Secret, r),
            (None, Some(r)) => (Source::ConfigMap, r),
            (None, None) => continue,
        };
        let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
        match lookup(source, name) {
            Some(obj) => {
                for (k, v) in entries(source, &obj) {
                    set(
                        &mut out,
                        &format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
            None if r.get("optional").and_then(Value::as_bool) == Some(true) => {}
            None => return Err(Blocked::config(not_found(source, name))),
        }
    }
    for e in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = e.get("name").and_then(Value::as_str) else {
            continue;
        };
        let value = if let Some(from) = e.get("valueFrom") {
            if let Some(path) = get_path(from, "fieldRef.fieldPath").and_then(Value::as_str) {
                Some(field(pod, path, addrs)?)
            } else if let Some(r) = from.get("secretKeyRef") {
                key_ref(Source::Secret, r, ns, lookup)?
            } else if let Some(r) = from.get("configMapKeyRef") {
                key_ref(Source::ConfigMap, r, ns, lookup)?
            } else {
                return Err(Blocked::config(format!(
                    "env {name}: only fieldRef, secretKeyRef and configMapKeyRef are supported by kedge-sim"
                )));
            }
        } else {
            let raw = e.get("value").and_then(Value::as_str).unwrap_or_default();
            Some(expand(raw, lookup_env(&out)))
        };
        if let Some(v) = value {
            set(&mut out, name, v);
        }
    }
    Ok(out)
}

/// Kubernetes' `$(VAR)` expansion: a defined `$(VAR)` becomes its value, an undefined one
/// stays as written, `$$` is a literal `$` (so `$$(VAR)` gives `$(VAR)`).
pub(crate) fn expand<'a>(input: &str, vars: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match vars(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

/// The arguments after the program: `command[1..]` (`command[0]` names the image's entry
/// point, which the mapped executable replaces), then `args`, each `$(VAR)`-expanded.
pub(crate) fn args(container: &Value, env: &[(String, String)]) -> Vec<String> {
    let strings = |k: &str| {
        container
            .get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let command = strings("command");
    command
        .into_iter()
        .skip(1)
        .chain(strings("args"))
        .map(|a| expand(&a, lookup_env(env)))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::{Value, json};

    use super::{PodAddrs, Source, args, env, expand};

    pub(crate) const ADDRS: PodAddrs<'static> = PodAddrs {
        pod_ip: "127.1.2.3",
        host_ip: "172.18.0.2",
    };

    /// A bound pod with a label, an annotation and four kinds of volume.
    pub(crate) fn pod() -> Value {
        json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1",
                "labels": {"app": "web"}, "annotations": {"team": "edge"}},
            "spec": {"nodeName": "node-0", "serviceAccountName": "runner", "volumes": [
                {"name": "creds", "secret": {"secretName": "creds", "items": [{"key": "token", "path": "t/token"}]}},
                {"name": "conf", "configMap": {"name": "missing", "optional": true}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "all", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "sa-token"}},
                    {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                ]}},
            ]},
        })
    }

    /// Secret `creds` and ConfigMap `settings`.
    pub(crate) fn objects(source: Source, name: &str) -> Option<Value> {
        match (source, name) {
            // "s3cret" and "tok".
            (Source::Secret, "creds") => {
                Some(json!({"data": {"password": "czNjcmV0", "token": "dG9r"}}))
            }
            (Source::ConfigMap, "settings") => {
                Some(json!({"data": {"LEVEL": "debug", "MODE": "fast"}}))
            }
            _ => None,
        }
    }

    #[test]
    fn env_resolves_values_fields_and_keys_in_order_with_expansion() {
        let c = json!({
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}],
            "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "WHERE", "value": "$(NS)/$(UNSET)/$$(NS)"},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": true}}},
                {"name": "APP_MODE", "value": "slow"},
            ],
        });
        let got = env(&pod(), &c, ADDRS, &objects).unwrap();
        let want: Vec<(String, String)> = [
            ("APP_LEVEL", "debug"),
            ("APP_MODE", "slow"),
            ("NS", "shop"),
            ("WHERE", "shop/$(UNSET)/$(NS)"),
            ("APP", "web"),
            ("TEAM", "edge"),
            ("IP", "127.1.2.3"),
            ("HOST", "172.18.0.2"),
            ("SA", "runner"),
            ("NODE", "node-0"),
            ("UID", "u-1"),
            ("PASS", "s3cret"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_missing_required_secret_or_key_blocks_with_kubelets_message() {
        let missing = json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]});
        let e = env(&pod(), &missing, ADDRS, &objects).unwrap_err();
        assert_eq!(e.reason, "CreateContainerConfigError");
        assert_eq!(e.message, "secret \"gone\" not found");
        let no_key = json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}]});
        let e = env(&pod(), &no_key, ADDRS, &objects).unwrap_err();
        assert_eq!(e.message, "couldn't find key k in ConfigMap shop/settings");
        let from = json!({"envFrom": [{"secretRef": {"name": "gone"}}]});
        assert!(env(&pod(), &from, ADDRS, &objects).is_err());
        let optional = json!({"envFrom": [{"secretRef": {"name": "gone", "optional": true}}]});
        assert_eq!(env(&pod(), &optional, ADDRS, &objects).unwrap(), []);
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let vars = |n: &str| match n {
            "A" => Some("1"),
            "EMPTY" => Some(""),
            _ => None,
        };
        for (input, want) in [
            ("$(A)", "1"),
            ("x$(A)y$(A)", "x1y1"),
            ("$(B)", "$(B)"),
            ("$$(A)", "$(A)"),
            ("$$", "$"),
            ("$(EMPTY)z", "z"),
            ("$(A", "$(A"),
            ("a$", "a$"),
            ("$x", "$x"),
            ("€$(A)€", "€1€"),
        ] {
            assert_eq!(expand(input, vars), want, "{input}");
        }
    }

    #[test]
    fn args_drop_the_entry_point_and_expand() {
        let c = json!({"command": ["/bin/app", "serve"], "args": ["--ns", "$(NS)"]});
        let env = [("NS".to_string(), "shop".to_string())];
        assert_eq!(args(&c, &env), ["serve", "--ns", "shop"]);
        assert_eq!(args(&json!({"args": ["-c", "echo"]}), &[]), ["-c", "echo"]);
    }
}
