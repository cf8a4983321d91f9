//! Just enough OpenAPI v3 for kubectl: the root index and, per group-version,
//! one PATCH operation per kind that declares the `fieldValidation` query
//! parameter, so kubectl leaves validation to the server instead of
//! downloading schemas. No schemas are served (`kubectl explain` is unsupported).

use serde_json::{Map, Value, json};

use crate::store::Store;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3`.
pub fn root(store: &Store) -> Value {
    let mut paths = Map::new();
    for d in store.defs() {
        for v in &d.versions {
            let p = gv_path(&d.group, v);
            let url = format!("/openapi/v3/{p}?hash={}", store.rv);
            paths.insert(p, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/G/V`; `None` if the group-version is not served.
pub fn group_version(store: &Store, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for d in store
        .defs()
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
    {
        let base = gv_path(&d.group, version);
        let path = if d.namespaced {
            format!("/{base}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("/{base}/{}/{{name}}", d.plural)
        };
        let gvk = json!({"group": d.group, "version": version, "kind": d.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let content = json!({
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
        });
        paths.insert(
            path,
            json!({
                "patch": {
                    "operationId": format!("patch{}", d.kind),
                    "parameters": params,
                    "requestBody": {"content": content, "required": true},
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                },
                "put": {
                    "operationId": format!("replace{}", d.kind),
                    "parameters": params,
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "put",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-kedge-sim"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
