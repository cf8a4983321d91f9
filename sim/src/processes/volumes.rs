//! A pod's volumes as files: Secrets, ConfigMaps, the downward API and projected tokens,
//! and where each container mounts them. Pure: the writing is the supervisor's.

use std::path::PathBuf;

use serde_json::Value;

use super::spec::{Blocked, Lookup, PodAddrs, Source, entries, field, not_found};
use crate::util::get_path;

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    /// Path inside the volume.
    pub path: String,
    /// Contents.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// A pod volume's files (none: an empty directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Volume {
    /// The volume's name in the pod.
    pub name: String,
    /// Its files.
    pub files: Vec<File>,
}

const DEFAULT_MODE: u32 = 0o644;

fn mode(v: &Value, default: u32) -> u32 {
    v.get("mode")
        .or_else(|| v.get("defaultMode"))
        .and_then(Value::as_u64)
        .map(|m| m as u32)
        .unwrap_or(default)
}

/// The files of a Secret or ConfigMap source (`items` selects and renames keys).
fn key_files(
    source: Source,
    src: &Value,
    name_field: &str,
    default_mode: u32,
    volume: &str,
    lookup: Lookup<'_>,
) -> Result<Vec<File>, Blocked> {
    let name = src
        .get(name_field)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let optional = src.get("optional").and_then(Value::as_bool) == Some(true);
    let failed = |what: String| Blocked {
        reason: "ContainerCreating",
        message: format!("MountVolume.SetUp failed for volume \"{volume}\" : {what}"),
    };
    let Some(obj) = lookup(source, name) else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(failed(not_found(source, name)))
        };
    };
    let mut data = entries(source, &obj);
    let Some(items) = src.get("items").and_then(Value::as_array) else {
        return Ok(data
            .into_iter()
            .map(|(path, data)| File {
                path,
                data,
                mode: default_mode,
            })
            .collect());
    };
    let mut files = Vec::new();
    for item in items {
        let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
        let path = item.get("path").and_then(Value::as_str).unwrap_or(key);
        match data.remove(key) {
            Some(bytes) => files.push(File {
                path: path.to_string(),
                data: bytes,
                mode: mode(item, default_mode),
            }),
            None if optional => {}
            None => {
                return Err(failed(format!(
                    "configmap references non-existent config key: {key}"
                )));
            }
        }
    }
    Ok(files)
}

fn downward_files(
    pod: &Value,
    src: &Value,
    default_mode: u32,
    addrs: PodAddrs<'_>,
) -> Result<Vec<File>, Blocked> {
    let mut files = Vec::new();
    for item in src
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(path) = get_path(item, "fieldRef.fieldPath").and_then(Value::as_str) else {
            continue;
        };
        files.push(File {
            path: item
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            data: field(pod, path, addrs)?.into_bytes(),
            mode: mode(item, default_mode),
        });
    }
    Ok(files)
}

/// The pod's volumes as files: `secret`, `configMap`, `downwardAPI`, `projected` (those
/// three and `serviceAccountToken`, which gets `token`); every other kind (`emptyDir`,
/// `hostPath`, claims) is an empty directory.
pub(crate) fn volumes(
    pod: &Value,
    addrs: PodAddrs<'_>,
    token: &str,
    lookup: Lookup<'_>,
) -> Result<Vec<Volume>, Blocked> {
    let mut out = Vec::new();
    for v in get_path(pod, "spec.volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        let mut files = Vec::new();
        if let Some(s) = v.get("secret") {
            let m = mode(s, DEFAULT_MODE);
            files = key_files(Source::Secret, s, "secretName", m, name, lookup)?;
        } else if let Some(s) = v.get("configMap") {
            let m = mode(s, DEFAULT_MODE);
            files = key_files(Source::ConfigMap, s, "name", m, name, lookup)?;
        } else if let Some(s) = v.get("downwardAPI") {
            files = downward_files(pod, s, mode(s, DEFAULT_MODE), addrs)?;
        } else if let Some(p) = v.get("projected") {
            let m = mode(p, DEFAULT_MODE);
            for src in p
                .get("sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(s) = src.get("secret") {
                    files.extend(key_files(Source::Secret, s, "name", m, name, lookup)?);
                } else if let Some(s) = src.get("configMap") {
                    files.extend(key_files(Source::ConfigMap, s, "name", m, name, lookup)?);
                } else if let Some(s) = src.get("downwardAPI") {
                    files.extend(downward_files(pod, s, m, addrs)?);
                } else if let Some(s) = src.get("serviceAccountToken") {
                    files.push(File {
                        path: s
                            .get("path")
                            .and_then(Value::as_str)
                            .unwrap_or("token")
                            .to_string(),
                        data: token.as_bytes().to_vec(),
                        mode: m,
                    });
                }
            }
        }
        out.push(Volume {
            name: name.to_string(),
            files,
        });
    }
    Ok(out)
}

/// A container's mounts as (mountPath, host path): the volume's directory, or the file or
/// directory its `subPath` names.
pub(crate) fn mounts(
    container: &Value,
    volume_dir: &dyn Fn(&str) -> PathBuf,
) -> Vec<(String, PathBuf)> {
    container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let path = m.get("mountPath").and_then(Value::as_str)?;
            let dir = volume_dir(m.get("name").and_then(Value::as_str)?);
            let host = match m.get("subPath").and_then(Value::as_str) {
                Some(sub) if !sub.is_empty() => dir.join(sub),
                _ => dir,
            };
            Some((path.to_string(), host))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::json;

    use super::{mounts, volumes};
    use crate::processes::spec::tests::{ADDRS, objects, pod};

    #[test]
    fn volumes_become_files() {
        let vs = volumes(&pod(), ADDRS, "the-token", &objects).unwrap();
        let names: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["creds", "conf", "scratch", "all"]);
        assert_eq!(vs[0].files.len(), 1);
        assert_eq!(
            (vs[0].files[0].path.as_str(), &vs[0].files[0].data[..]),
            ("t/token", &b"tok"[..])
        );
        assert_eq!(vs[0].files[0].mode, 0o644);
        assert!(vs[1].files.is_empty() && vs[2].files.is_empty());
        let all: Vec<(&str, &[u8])> = vs[3]
            .files
            .iter()
            .map(|f| (f.path.as_str(), &f.data[..]))
            .collect();
        assert_eq!(all, [("sa-token", &b"the-token"[..]), ("ns", &b"shop"[..])]);
        let mut p = pod();
        p["spec"]["volumes"][0]["secret"]["secretName"] = json!("gone");
        let e = volumes(&p, ADDRS, "", &objects).unwrap_err();
        assert_eq!(e.reason, "ContainerCreating");
        assert!(
            e.message.contains("secret \"gone\" not found"),
            "{}",
            e.message
        );
        let c = json!({"volumeMounts": [
            {"name": "creds", "mountPath": "/etc/kedge"},
            {"name": "conf", "mountPath": "/etc/app.conf", "subPath": "app.conf"},
        ]});
        let m = mounts(&c, &|v| PathBuf::from("/d").join(v));
        assert_eq!(
            m,
            [
                ("/etc/kedge".to_string(), PathBuf::from("/d/creds")),
                (
                    "/etc/app.conf".to_string(),
                    PathBuf::from("/d/conf/app.conf")
                ),
            ]
        );
    }
}
