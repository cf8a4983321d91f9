//! Decoding of Kubernetes protobuf request bodies (`k8s\0` + `runtime.Unknown`), which
//! kubectl and other typed Go clients send for built-in kinds (`kubectl create …`, `run`,
//! `expose`, `autoscale`; Go controllers' Leases and Events). Every built-in kind but
//! CustomResourceDefinition has a schema; the field numbers are those of k8s.io/api's
//! `generated.proto`, and each schema lists the fields typed clients commonly set (others
//! are skipped). Kinds without a schema get `415 UnsupportedMediaType` naming the kind,
//! as kedge-sim accepts them as JSON.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

mod schema;

use schema::{DELETE_OPTIONS, F, KINDS, OMIT_ZERO, UNKNOWN};

const MAGIC: &[u8] = b"k8s\0";

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
    let schema = if kind == "DeleteOptions" {
        DELETE_OPTIONS
    } else {
        KINDS
            .iter()
            .find(|(v, k, _)| *v == api_version && *k == kind)
            .map(|(_, _, schema)| *schema)
            .ok_or_else(|| unsupported(&api_version, &kind))?
    };
    let mut obj = message(&raw, schema, None)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

fn unsupported(api_version: &str, kind: &str) -> Error {
    let known: Vec<&str> = KINDS.iter().map(|(_, k, _)| *k).collect();
    Error::UnsupportedMediaType(format!(
        "kedge-sim cannot decode a protobuf {kind} ({api_version}); it accepts {kind} as JSON (Content-Type: application/json). Protobuf is decoded for {} and DeleteOptions",
        known.join(", ")
    ))
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
            F::Quantity(n) | F::Time(n) | F::MicroTime(n) | F::IntOrStr(n) => {
                if let Some(v) = value_type(*f, r.bytes()?)? {
                    out.insert(n.into(), v);
                }
            }
            // An embedded struct (`LocalObjectReference`): its fields sit inline in JSON.
            F::Msg("", sub) => {
                if let Value::Object(m) = message(r.bytes()?, sub, None)? {
                    out.extend(m);
                }
            }
            F::MapQuantity(n) => {
                let (k, v) = entry(r.bytes()?)?;
                let q = value_type(F::Quantity(n), &v)?.unwrap_or(json!("0"));
                let m = out.entry(n).or_insert_with(|| json!({}));
                m[k] = q;
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

/// The JSON of apimachinery's value types, which JSON renders as one string or number;
/// `None` for a zero `Time` (Go's JSON leaves it out as null).
fn value_type(f: F, b: &[u8]) -> Result<Option<Value>> {
    Ok(match f {
        F::Quantity(_) => {
            let q = message(b, &[(1, F::Str("string"))], None)?;
            Some(q.get("string").cloned().unwrap_or(json!("0")))
        }
        F::Time(_) | F::MicroTime(_) => {
            let t = message(b, &[(1, F::Int("seconds")), (2, F::Int("nanos"))], None)?;
            t.get("seconds").and_then(Value::as_i64).map(|secs| {
                let nanos = t.get("nanos").and_then(Value::as_i64).unwrap_or(0);
                json!(timestamp(secs, nanos, matches!(f, F::MicroTime(_))))
            })
        }
        F::IntOrStr(_) => {
            let schema = [
                (1, F::Int("type")),
                (2, F::Int("intVal")),
                (3, F::Str("strVal")),
            ];
            let v = message(b, &schema, None)?;
            Some(if v.get("type").and_then(Value::as_i64) == Some(1) {
                v.get("strVal").cloned().unwrap_or(json!(""))
            } else {
                v.get("intVal").cloned().unwrap_or(json!(0))
            })
        }
        _ => None,
    })
}

/// RFC 3339 in UTC as Go renders `metav1.Time` (seconds) or `metav1.MicroTime`
/// (microseconds).
fn timestamp(secs: i64, nanos: i64, micro: bool) -> String {
    let s = crate::util::rfc3339(secs.saturating_mul(1000));
    match s.strip_suffix('Z') {
        Some(base) if micro => format!("{base}.{:06}Z", nanos / 1000),
        _ => s,
    }
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

    /// A varint field (numbers below 16).
    fn varint(n: u32, mut v: u64) -> Vec<u8> {
        let mut out = vec![(n << 3) as u8];
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn envelope(api_version: &[u8], kind: &[u8], object: &[u8]) -> Vec<u8> {
        let tm = [field(1, 2, api_version), field(2, 2, kind)].concat();
        [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, object)].concat()
    }

    #[test]
    fn decodes_a_service_with_int_or_string_ports() -> Result<()> {
        let named = [varint(1, 1), field(3, 2, b"http")].concat();
        let port = [varint(3, 80), field(4, 2, &named)].concat();
        let spec = [field(1, 2, &port), field(4, 2, b"ClusterIP")].concat();
        let svc = [field(1, 2, &field(1, 2, b"web")), field(2, 2, &spec)].concat();
        let v = decode(&envelope(b"v1", b"Service", &svc))?;
        assert_eq!(v["spec"]["ports"][0]["port"], 80);
        assert_eq!(v["spec"]["ports"][0]["targetPort"], "http");
        assert_eq!(v["spec"]["type"], "ClusterIP");
        Ok(())
    }

    #[test]
    fn other_kinds_are_refused_naming_the_kind_and_json() {
        let body = envelope(
            b"apiextensions.k8s.io/v1",
            b"CustomResourceDefinition",
            &field(1, 2, b""),
        );
        let e = decode(&body).expect_err("no protobuf schema for CRDs");
        assert!(matches!(e, Error::UnsupportedMediaType(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("CustomResourceDefinition") && text.contains("as JSON"),
            "{text}"
        );
    }

    #[test]
    fn decodes_a_lease_with_micro_times() -> Result<()> {
        // 2026-01-02T03:04:05Z and 123456789 ns.
        let time = [varint(1, 1_767_323_045), varint(2, 123_456_789)].concat();
        let spec = [field(1, 2, b"hub-0"), field(4, 2, &time), field(3, 2, &[])].concat();
        let lease = [field(1, 2, &field(1, 2, b"kedge-hub")), field(2, 2, &spec)].concat();
        let v = decode(&envelope(b"coordination.k8s.io/v1", b"Lease", &lease))?;
        assert_eq!(v["spec"]["holderIdentity"], "hub-0");
        assert_eq!(v["spec"]["renewTime"], "2026-01-02T03:04:05.123456Z");
        assert!(
            v["spec"].get("acquireTime").is_none(),
            "a zero time is left out: {v}"
        );
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
