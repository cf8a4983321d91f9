//! KEDA's trigger authentication: the parameters a trigger's `authenticationRef` resolves to.
//!
//! Only `spec.secretTargetRef` is emulated (the other sources, pod identity, env, Vault, ...,
//! contribute nothing). Pure: reads the store, returns a value or the message KEDA's
//! condition would carry.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use crate::store::Store;
use crate::util::get_path;

const TRIGGER_AUTHENTICATIONS: &str = "keda.sh/triggerauthentications";
const CLUSTER_TRIGGER_AUTHENTICATIONS: &str = "keda.sh/clustertriggerauthentications";
const SECRETS: &str = "/secrets";
/// Where KEDA reads the Secrets of a ClusterTriggerAuthentication: its own namespace, KEDA's
/// `KEDA_CLUSTER_OBJECT_NAMESPACE` default.
pub const KEDA_NAMESPACE: &str = "keda";

/// The parameters (`caCert`, `tlsClientCert`, ...) the trigger's `authenticationRef` names,
/// read from their Secrets; empty without an `authenticationRef`.
pub(crate) fn auth_params(
    store: &Store,
    namespace: &str,
    trigger: &Value,
) -> Result<BTreeMap<String, String>, String> {
    let Some(auth_ref) = trigger.get("authenticationRef") else {
        return Ok(BTreeMap::new());
    };
    let name = auth_ref
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("authenticationRef has no name")?;
    let kind = auth_ref
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("TriggerAuthentication");
    let (key, auth_ns, secret_ns) = match kind {
        "TriggerAuthentication" => (TRIGGER_AUTHENTICATIONS, namespace, namespace),
        "ClusterTriggerAuthentication" => (CLUSTER_TRIGGER_AUTHENTICATIONS, "", KEDA_NAMESPACE),
        other => {
            return Err(format!(
                "authenticationRef kind {other:?}: expected TriggerAuthentication or ClusterTriggerAuthentication"
            ));
        }
    };
    let resource = &key["keda.sh/".len()..];
    let auth = store
        .def(key)
        .and_then(|_| store.get(key, auth_ns, name))
        .ok_or_else(|| format!("{resource}.keda.sh {name:?} not found"))?;
    let refs = match get_path(auth, "spec.secretTargetRef") {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Array(refs)) => refs,
        Some(_) => return Err(format!("{kind} {name}: spec.secretTargetRef is not a list")),
    };
    let mut params = BTreeMap::new();
    for (i, r) in refs.iter().enumerate() {
        let field = |f: &str| {
            r.get(f)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| format!("{kind} {name}: spec.secretTargetRef[{i}].{f} is required"))
        };
        let (parameter, secret, secret_key) = (field("parameter")?, field("name")?, field("key")?);
        let value = secret_value(store, secret_ns, secret, secret_key)?;
        params.insert(parameter.to_string(), value);
    }
    Ok(params)
}

/// `data[key]` of a Secret, base64-decoded (or `stringData[key]` of a Secret the simulator
/// created inside itself), as UTF-8 text: KEDA's parameters are strings.
fn secret_value(store: &Store, ns: &str, name: &str, key: &str) -> Result<String, String> {
    let secret = store
        .get(SECRETS, ns, name)
        .ok_or_else(|| format!("secrets {name:?} not found in namespace {ns:?}"))?;
    let bytes = if let Some(encoded) = get_path(secret, "data").and_then(|d| d.get(key)) {
        let encoded = encoded
            .as_str()
            .ok_or_else(|| format!("Secret {ns}/{name}: data[{key:?}] is not a string"))?;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| format!("Secret {ns}/{name}: data[{key:?}] is not base64: {e}"))?
    } else if let Some(text) = get_path(secret, "stringData").and_then(|d| d.get(key)) {
        text.as_str()
            .ok_or_else(|| format!("Secret {ns}/{name}: stringData[{key:?}] is not a string"))?
            .as_bytes()
            .to_vec()
    } else {
        return Err(format!("Secret {ns}/{name} has no key {key:?}"));
    };
    String::from_utf8(bytes).map_err(|_| format!("Secret {ns}/{name}: {key:?} is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::auth_params;
    use crate::store::Store;

    fn store() -> Store {
        let mut s = Store::new(10, 10, 0);
        for crd in crate::keda::CRDS {
            let crd: serde_json::Value = serde_yaml::from_str(crd).expect("CRD YAML");
            s.create_internal("apiextensions.k8s.io/customresourcedefinitions", crd, 0)
                .expect("CRD");
        }
        s.create_internal(
            "/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "keda"}}),
            0,
        )
        .expect("namespace");
        s
    }

    fn put(s: &mut Store, key: &str, obj: serde_json::Value) {
        s.create_internal(key, obj, 0).expect("object");
    }

    #[test]
    fn a_cluster_trigger_authentication_reads_secrets_in_kedas_namespace() {
        let mut s = store();
        put(
            &mut s,
            "keda.sh/clustertriggerauthentications",
            json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
                "metadata": {"name": "hub"}, "spec": {"secretTargetRef": [
                    {"parameter": "caCert", "name": "hub-client", "key": "ca.crt"},
                    {"parameter": "tlsClientKey", "name": "hub-client", "key": "tls.key"}]}}),
        );
        put(
            &mut s,
            "/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hub-client", "namespace": "keda"},
                "data": {"ca.crt": "Q0EgUEVN"}, "stringData": {"tls.key": "KEY"}}),
        );
        let trigger = json!({"type": "external", "authenticationRef": {"name": "hub", "kind": "ClusterTriggerAuthentication"}});
        let params = auth_params(&s, "default", &trigger).expect("params");
        assert_eq!(params.get("caCert").map(String::as_str), Some("CA PEM"));
        assert_eq!(params.get("tlsClientKey").map(String::as_str), Some("KEY"));
        // The same Secret in the ScaledObject's namespace does not count.
        let namespaced = json!({"authenticationRef": {"name": "hub"}});
        assert_eq!(
            auth_params(&s, "default", &namespaced),
            Err("triggerauthentications.keda.sh \"hub\" not found".into())
        );
    }

    #[test]
    fn every_malformed_reference_is_a_message() {
        let mut s = store();
        put(
            &mut s,
            "keda.sh/triggerauthentications",
            json!({"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
                "metadata": {"name": "ta", "namespace": "default"}, "spec": {"secretTargetRef": [
                    {"parameter": "caCert", "name": "s", "key": "ca.crt"}]}}),
        );
        let trigger = json!({"authenticationRef": {"name": "ta"}});
        assert_eq!(
            auth_params(&s, "default", &trigger),
            Err("secrets \"s\" not found in namespace \"default\"".into())
        );
        put(
            &mut s,
            "/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"},
                "data": {"ca.crt": "not base64!"}}),
        );
        let err = auth_params(&s, "default", &trigger).expect_err("bad base64");
        assert!(
            err.starts_with("Secret default/s: data[\"ca.crt\"] is not base64"),
            "{err}"
        );
        for (trigger, want) in [
            (
                json!({"authenticationRef": {}}),
                "authenticationRef has no name",
            ),
            (
                json!({"authenticationRef": {"name": "x", "kind": "Vault"}}),
                "authenticationRef kind \"Vault\": expected TriggerAuthentication or ClusterTriggerAuthentication",
            ),
        ] {
            assert_eq!(auth_params(&s, "default", &trigger), Err(want.into()));
        }
        assert!(
            auth_params(&s, "default", &json!({"type": "external"}))
                .expect("no authenticationRef")
                .is_empty()
        );
    }
}
