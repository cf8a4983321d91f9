//! Decoding of Kubernetes protobuf request bodies for the few kinds kubectl
//! creates through its typed clients (`kubectl create secret|configmap|namespace|serviceaccount|deployment|job`).
//! Other kinds sent as protobuf get `415 UnsupportedMediaType`.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, Clone, Copy)]
enum F {
    Str(&'static str),
    /// `bytes`, rendered base64 like the JSON form.
    Bytes(&'static str),
    Bool(&'static str),
    /// int32/int64 as varint.
    Int(&'static str),
    /// `map<string, Quantity>` (Quantity is a message with the string in field 1).
    MapQuantity(&'static str),
    MapStr(&'static str),
    MapBytes(&'static str),
    RepStr(&'static str),
    Msg(&'static str, &'static [(u32, F)]),
    RepMsg(&'static str, &'static [(u32, F)]),
}

const OWNER_REF: &[(u32, F)] = &[
    (1, F::Str("kind")),
    (3, F::Str("name")),
    (4, F::Str("uid")),
    (5, F::Str("apiVersion")),
    (6, F::Bool("controller")),
    (7, F::Bool("blockOwnerDeletion")),
];

const OBJECT_META: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("generateName")),
    (3, F::Str("namespace")),
    (5, F::Str("uid")),
    (6, F::Str("resourceVersion")),
    (11, F::MapStr("labels")),
    (12, F::MapStr("annotations")),
    (13, F::RepMsg("ownerReferences", OWNER_REF)),
    (14, F::RepStr("finalizers")),
];

const SECRET: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapBytes("data")),
    (3, F::Str("type")),
    (4, F::MapStr("stringData")),
    (5, F::Bool("immutable")),
];

const CONFIG_MAP: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapStr("data")),
    (3, F::MapBytes("binaryData")),
    (4, F::Bool("immutable")),
];

const NAMESPACE_SPEC: &[(u32, F)] = &[(1, F::RepStr("finalizers"))];

const NAMESPACE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", NAMESPACE_SPEC)),
];

const SERVICE_ACCOUNT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (4, F::Bool("automountServiceAccountToken")),
];

const LABEL_SELECTOR_REQ: &[(u32, F)] = &[
    (1, F::Str("key")),
    (2, F::Str("operator")),
    (3, F::RepStr("values")),
];

const LABEL_SELECTOR: &[(u32, F)] = &[
    (1, F::MapStr("matchLabels")),
    (2, F::RepMsg("matchExpressions", LABEL_SELECTOR_REQ)),
];

const CONTAINER_PORT: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Int("hostPort")),
    (3, F::Int("containerPort")),
    (4, F::Str("protocol")),
];

const ENV_VAR: &[(u32, F)] = &[(1, F::Str("name")), (2, F::Str("value"))];

const RESOURCES: &[(u32, F)] = &[
    (1, F::MapQuantity("limits")),
    (2, F::MapQuantity("requests")),
];

const CONTAINER: &[(u32, F)] = &[
    (1, F::Str("name")),
    (2, F::Str("image")),
    (3, F::RepStr("command")),
    (4, F::RepStr("args")),
    (5, F::Str("workingDir")),
    (6, F::RepMsg("ports", CONTAINER_PORT)),
    (7, F::RepMsg("env", ENV_VAR)),
    (8, F::Msg("resources", RESOURCES)),
    (14, F::Str("imagePullPolicy")),
];

const POD_SPEC: &[(u32, F)] = &[
    (2, F::RepMsg("containers", CONTAINER)),
    (3, F::Str("restartPolicy")),
    (4, F::Int("terminationGracePeriodSeconds")),
    (5, F::Int("activeDeadlineSeconds")),
    (6, F::Str("dnsPolicy")),
    (7, F::MapStr("nodeSelector")),
    (8, F::Str("serviceAccountName")),
];

const POD_TEMPLATE: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];

const DEPLOYMENT_SPEC: &[(u32, F)] = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
    (5, F::Int("minReadySeconds")),
    (6, F::Int("revisionHistoryLimit")),
    (7, F::Bool("paused")),
    (9, F::Int("progressDeadlineSeconds")),
];

const DEPLOYMENT: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", DEPLOYMENT_SPEC)),
];

const JOB_SPEC: &[(u32, F)] = &[
    (1, F::Int("parallelism")),
    (2, F::Int("completions")),
    (3, F::Int("activeDeadlineSeconds")),
    (4, F::Msg("selector", LABEL_SELECTOR)),
    (5, F::Bool("manualSelector")),
    (6, F::Msg("template", POD_TEMPLATE)),
    (7, F::Int("backoffLimit")),
    (8, F::Int("ttlSecondsAfterFinished")),
    (9, F::Str("completionMode")),
    (10, F::Bool("suspend")),
];

const JOB: &[(u32, F)] = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", JOB_SPEC)),
];

/// Non-pointer numeric and bool fields whose zero value Go omits from JSON
/// (pointer fields are only encoded when set, so their zero is meaningful).
const OMIT_ZERO: &[&str] = &["minReadySeconds", "hostPort", "paused"];

const PRECONDITIONS: &[(u32, F)] = &[(1, F::Str("uid")), (2, F::Str("resourceVersion"))];

/// The body of a DELETE from a typed client (Helm's release storage sends it as protobuf).
const DELETE_OPTIONS: &[(u32, F)] = &[
    (1, F::Int("gracePeriodSeconds")),
    (2, F::Msg("preconditions", PRECONDITIONS)),
    (3, F::Bool("orphanDependents")),
    (4, F::Str("propagationPolicy")),
    (5, F::RepStr("dryRun")),
];

const TYPE_META: &[(u32, F)] = &[(1, F::Str("apiVersion")), (2, F::Str("kind"))];

const UNKNOWN: &[(u32, F)] = &[(1, F::Msg("typeMeta", TYPE_META)), (2, F::Bytes("raw"))];

/// Decodes a protobuf body (`k8s\0` + `runtime.Unknown`) into the JSON object.
pub fn decode(body: &[u8]) -> Result<Value> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Error::BadRequest("protobuf body without the k8s magic prefix".into()))?;
    let mut raw = Vec::new();
    let envelope = message(rest, UNKNOWN, Some(&mut raw))?;
    let api_version = envelope
        .get("typeMeta")
        .and_then(|t| t.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = envelope
        .get("typeMeta")
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Secret") => SECRET,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("batch/v1", "Job") => JOB,
        (_, "DeleteOptions") => DELETE_OPTIONS,
        _ => {
            return Err(Error::UnsupportedMediaType(format!(
                "kedge-sim decodes protobuf only for Secret, ConfigMap, Namespace, ServiceAccount, Deployment, Job and DeleteOptions (got {api_version} {kind}); send JSON"
            )));
        }
    };
    let mut obj = message(&raw, schema, None)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

fn truncated() -> Error {
    Error::BadRequest("truncated protobuf body".into())
}

impl Reader<'_> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos).ok_or_else(truncated)?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::BadRequest("protobuf varint too long".into()))
    }

    fn bytes(&mut self) -> Result<&[u8]> {
        let len = usize::try_from(self.varint()?).map_err(|_| truncated())?;
        let end = self.pos.checked_add(len).ok_or_else(truncated)?;
        let s = self.b.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn skip(&mut self, wire: u64) -> Result<()> {
        match wire {
            0 => {
                self.varint()?;
            }
            1 => self.pos += 8,
            2 => {
                self.bytes()?;
            }
            5 => self.pos += 4,
            w => {
                return Err(Error::BadRequest(format!(
                    "unsupported protobuf wire type {w}"
                )));
            }
        }
        if self.pos > self.b.len() {
            return Err(truncated());
        }
        Ok(())
    }
}

fn utf8(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec())
        .map_err(|_| Error::BadRequest("invalid UTF-8 in protobuf string".into()))
}

/// Decodes one map entry (`1: key, 2: value`).
fn entry(b: &[u8]) -> Result<(String, Vec<u8>)> {
    let mut r = Reader { b, pos: 0 };
    let (mut k, mut v) = (String::new(), Vec::new());
    while r.pos < b.len() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => k = utf8(r.bytes()?)?,
            (2, 2) => v = r.bytes()?.to_vec(),
            (_, w) => r.skip(w)?,
        }
    }
    Ok((k, v))
}

fn message(b: &[u8], schema: &[(u32, F)], mut raw_out: Option<&mut Vec<u8>>) -> Result<Value> {
    let mut out = Map::new();
    let mut r = Reader { b, pos: 0 };
    while r.pos < b.len() {
        let tag = r.varint()?;
        let (field, wire) = ((tag >> 3) as u32, tag & 7);
        let Some((_, f)) = schema.iter().find(|(n, _)| *n == field) else {
            r.skip(wire)?;
            continue;
        };
        let want_wire = match f {
            F::Bool(_) | F::Int(_) => 0,
            _ => 2,
        };
        if wire != want_wire {
            return Err(Error::BadRequest(format!(
                "protobuf field {field} has wire type {wire}"
            )));
        }
        match *f {
            // Go omits empty strings (`omitempty`); gogo still encodes them.
            F::Str(n) => {
                let v = utf8(r.bytes()?)?;
                if !v.is_empty() {
                    out.insert(n.into(), json!(v));
                }
            }
            F::Bytes(n) => {
                let v = r.bytes()?;
                if n == "raw"
                    && let Some(o) = raw_out.as_deref_mut()
                {
                    *o = v.to_vec();
                    continue;
                }
                out.insert(n.into(), json!(base64(v)));
            }
            F::Bool(n) => {
                let v = r.varint()? != 0;
                if v || !OMIT_ZERO.contains(&n) {
                    out.insert(n.into(), json!(v));
                }
            }
            // int32 negatives arrive sign-extended to 64 bits.
            F::Int(n) => {
                let v = r.varint()? as i64;
                if v != 0 || !OMIT_ZERO.contains(&n) {
                    out.insert(n.into(), json!(v));
                }
            }
            F::MapQuantity(n) => {
                let (k, v) = entry(r.bytes()?)?;
                let q = message(&v, &[(1, F::Str("string"))], None)?;
                let m = out.entry(n).or_insert_with(|| json!({}));
                m[k] = q.get("string").cloned().unwrap_or(json!("0"));
            }
            F::MapStr(n) | F::MapBytes(n) => {
                let (k, v) = entry(r.bytes()?)?;
                let v = if matches!(f, F::MapStr(_)) {
                    json!(utf8(&v)?)
                } else {
                    json!(base64(&v))
                };
                let m = out.entry(n).or_insert_with(|| json!({}));
                m[k] = v;
            }
            F::RepStr(n) => {
                let s = utf8(r.bytes()?)?;
                let a = out.entry(n).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(json!(s));
                }
            }
            F::Msg(n, sub) => {
                out.insert(n.into(), message(r.bytes()?, sub, None)?);
            }
            F::RepMsg(n, sub) => {
                let m = message(r.bytes()?, sub, None)?;
                let a = out.entry(n).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(m);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Standard base64 with padding.
pub fn base64(b: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        s.push(T[(n >> 18) as usize & 63] as char);
        s.push(T[(n >> 12) as usize & 63] as char);
        s.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((n << 3) as u8) | wire, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_secret() -> Result<()> {
        let meta = field(1, 2, b"creds");
        let entry = [field(1, 2, b"user"), field(2, 2, b"admin")].concat();
        let secret = [
            field(1, 2, &meta),
            field(2, 2, &entry),
            field(3, 2, b"Opaque"),
        ]
        .concat();
        let tm = [field(1, 2, b"v1"), field(2, 2, b"Secret")].concat();
        let body = [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, &secret)].concat();
        let v = decode(&body)?;
        assert_eq!(v["metadata"]["name"], "creds");
        assert_eq!(v["data"]["user"], "YWRtaW4=");
        assert_eq!(v["type"], "Opaque");
        assert_eq!(v["kind"], "Secret");
        Ok(())
    }

    #[test]
    fn decodes_delete_options() -> Result<()> {
        let pre = field(1, 2, b"uid-1");
        let opts = [field(2, 2, &pre), field(4, 2, b"Foreground")].concat();
        let tm = [
            field(1, 2, b"meta.k8s.io/v1"),
            field(2, 2, b"DeleteOptions"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, &opts)].concat();
        let v = decode(&body)?;
        assert_eq!(v["preconditions"]["uid"], "uid-1");
        assert_eq!(v["propagationPolicy"], "Foreground");
        Ok(())
    }

    #[test]
    fn rejects_garbage() {
        assert!(decode(b"nope").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
        assert!(decode(b"k8s\0\x0a\x02\x0a\x05").is_err());
    }

    #[test]
    fn base64_matches_reference() {
        assert_eq!(base64(b"admin"), "YWRtaW4=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
    }
}
