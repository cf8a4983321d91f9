//! The HTTP face of one virtual cluster: discovery, CRUD, patch, watch.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::cluster::ClusterShared;
use crate::error::{Error, Result};
use crate::http::{Req, selectors, system_time};
use crate::resources::{ResourceDef, group_order};
use crate::selector::{LabelSelector, labels_of};
use crate::store::{Propagation, WriteScope};
use crate::util::{hex_decode, hex_encode, meta_mut, meta_str, parse_query};

/// The largest request body kube-apiserver decodes for a write (`MaxRequestBodyBytes`):
/// anything longer gets `413 RequestEntityTooLarge`.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// The router of one cluster: every path goes through `handle`.
pub fn router(cluster: Arc<ClusterShared>) -> Router {
    Router::new().fallback(handle).with_state(cluster)
}

/// Whether reading a body failed on [`MAX_BODY`].
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

async fn handle(State(c): State<Arc<ClusterShared>>, req: Request) -> Response {
    let faults = c.faults();
    if faults.unavailable {
        return error_response(&Error::Unavailable(
            "the server is currently unable to handle the request".into(),
        ));
    }
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    if faults.error_rate > 0.0
        && (crate::util::random_u64() as f64 / u64::MAX as f64) < faults.error_rate
    {
        return error_response(&Error::Internal("injected failure".into()));
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) if is_length_limit(&e) => {
            return error_response(&Error::RequestEntityTooLarge(format!(
                "Request entity too large: limit is {MAX_BODY}"
            )));
        }
        Err(e) => {
            return error_response(&Error::BadRequest(format!("reading body: {e}")));
        }
    };
    let query = match parse_query(parts.uri.query()) {
        Ok(q) => q,
        Err(e) => return error_response(&e),
    };
    let segs = parts
        .uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| crate::util::percent_decode(s).unwrap_or_else(|_| s.to_string()))
        .collect();
    let user = match parts.headers.get(header::AUTHORIZATION) {
        None => None,
        Some(v) => {
            let token = v
                .to_str()
                .ok()
                .and_then(|s| s.strip_prefix("Bearer "))
                .map(str::trim)
                .unwrap_or_default();
            match c.user_for_token(token) {
                Some(u) => Some(u),
                None => return error_response(&Error::Unauthorized("Unauthorized".into())),
            }
        }
    };
    let r = Req {
        method: parts.method,
        segs,
        query,
        headers: parts.headers,
        body,
        user,
    };
    match route(&c, &r) {
        Ok(resp) => resp,
        Err(e) => error_response(&e),
    }
}

pub(crate) fn error_response(e: &Error) -> Response {
    json_response(
        StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

pub(crate) fn json_response(code: StatusCode, v: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn ok(v: &impl serde::Serialize) -> Result<Response> {
    Ok(json_response(StatusCode::OK, v))
}

fn route(c: &Arc<ClusterShared>, r: &Req) -> Result<Response> {
    let s: Vec<&str> = r.segs.iter().map(String::as_str).collect();
    match (&r.method, s.as_slice()) {
        (&Method::GET, ["version"]) => ok(&json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-kedge-sim",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
            "platform": "linux/amd64",
        })),
        (&Method::GET, ["healthz" | "livez" | "readyz"]) => {
            Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], "ok").into_response())
        }
        (&Method::GET, ["api"]) => ok(&json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": c.addr.to_string()}],
        })),
        (&Method::GET, ["apis"]) => ok(&group_list(c)),
        (&Method::GET, ["apis", group]) => group_doc(c, group),
        (&Method::GET, ["api", "v1"]) => resource_list(c, "", "v1"),
        (&Method::GET, ["apis", crate::keda::METRICS_GROUP, "v1beta1"]) => {
            ok(&crate::keda::metrics_discovery())
        }
        (
            &Method::GET,
            [
                "apis",
                crate::keda::METRICS_GROUP,
                "v1beta1",
                "namespaces",
                ns,
                metric,
            ],
        ) => {
            let sel = r.q("labelSelector").unwrap_or_default();
            ok(&crate::keda::external_metric(c, ns, metric, sel)?)
        }
        (&Method::GET, ["apis", group, version]) => resource_list(c, group, version),
        (_, ["api", "v1", rest @ ..]) => resource(c, r, "", "v1", rest),
        (_, ["apis", group, version, rest @ ..]) => resource(c, r, group, version, rest),
        (&Method::GET, ["openapi", "v3"]) => ok(&crate::openapi::root(&c.store())),
        (&Method::GET, ["openapi", "v3", "api", version]) => {
            let doc = crate::openapi::group_version(&c.store(), "", version);
            ok(&doc.ok_or_else(|| {
                Error::NotFound("the server could not find the requested resource".into())
            })?)
        }
        (&Method::GET, ["openapi", "v3", "apis", group, version]) => {
            let doc = crate::openapi::group_version(&c.store(), group, version);
            ok(&doc.ok_or_else(|| {
                Error::NotFound("the server could not find the requested resource".into())
            })?)
        }
        _ => Err(Error::NotFound(
            "the server could not find the requested resource".into(),
        )),
    }
}

fn group_list(c: &ClusterShared) -> Value {
    let store = c.store();
    let mut groups: Vec<Value> = group_order(store.defs())
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(&g, &vs))
        .collect();
    groups.push(group_json(
        crate::keda::METRICS_GROUP,
        &["v1beta1".to_string()],
    ));
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn group_json(g: &str, vs: &[String]) -> Value {
    let versions: Vec<Value> = vs
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({
        "name": g,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

fn group_doc(c: &ClusterShared, group: &str) -> Result<Response> {
    if group == crate::keda::METRICS_GROUP {
        let mut g = group_json(group, &["v1beta1".to_string()]);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        return ok(&g);
    }
    let store = c.store();
    let (g, vs) = group_order(store.defs())
        .into_iter()
        .find(|(g, _)| g == group)
        .ok_or_else(|| {
            Error::NotFound("the server could not find the requested resource".into())
        })?;
    let mut doc = group_json(&g, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    ok(&doc)
}

fn resource_list(c: &ClusterShared, group: &str, version: &str) -> Result<Response> {
    let store = c.store();
    let resources: Vec<Value> = store
        .defs()
        .iter()
        .filter(|d| d.group == group && d.versions.iter().any(|v| v == version))
        .flat_map(|d| d.discovery())
        .collect();
    if resources.is_empty() {
        return Err(Error::NotFound(
            "the server could not find the requested resource".into(),
        ));
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    ok(
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// What a resource path addresses.
struct Target {
    def: Arc<ResourceDef>,
    version: String,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(c: &ClusterShared, group: &str, version: &str, rest: &[&str]) -> Result<Target> {
    let store = c.store();
    let not_found = || Error::NotFound("the server could not find the requested resource".into());
    let find = |plural: &str| store.find(group, version, plural).ok_or_else(not_found);
    let t = |def, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
        def,
        version: version.to_string(),
        ns: ns.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
    };
    let namespaced_coll = |plural: &str| {
        group.is_empty()
            || store
                .find(group, version, plural)
                .is_some_and(|d| d.namespaced)
    };
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if namespaced_coll(plural)
                && store
                    .find(group, version, plural)
                    .is_some_and(|d| d.namespaced) =>
        {
            let def = find(plural)?;
            match tail {
                [] => t(def, Some(ns), None, None),
                [name] => t(def, Some(ns), Some(name), None),
                [name, sub] => t(def, Some(ns), Some(name), Some(sub)),
                _ => return Err(not_found()),
            }
        }
        [plural] => t(find(plural)?, None, None, None),
        [plural, name] => {
            let def = find(plural)?;
            if def.namespaced {
                return Err(not_found());
            }
            t(def, None, Some(name), None)
        }
        [plural, name, sub] => {
            let def = find(plural)?;
            if def.namespaced {
                return Err(not_found());
            }
            t(def, None, Some(name), Some(sub))
        }
        _ => return Err(not_found()),
    };
    if let Some(sub) = &target.sub {
        let known = (sub == "status" && target.def.status)
            || (sub == "scale" && target.def.scale.is_some())
            || (sub == "token" && &*target.def.key == "/serviceaccounts")
            || (sub == "log" && &*target.def.key == "/pods");
        if !known {
            return Err(not_found());
        }
    }
    Ok(target)
}

fn resource(
    c: &Arc<ClusterShared>,
    r: &Req,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response> {
    let t = parse_target(c, group, version, rest)?;
    let verb = crate::auth::verb(&r.method, t.name.is_some(), r.flag("watch"));
    let what = match &t.sub {
        Some(sub) => format!("{verb} {}/{sub}", t.def.plural),
        None => format!("{verb} {}", t.def.plural),
    };
    *c.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(what)
        .or_default() += 1;
    if let Some(user) = &r.user {
        let attrs = crate::rbac::RequestAttributes::resource(
            verb,
            &t.def.group,
            &t.def.plural,
            t.ns.as_deref().unwrap_or_default(),
        )
        .named(t.name.as_deref().unwrap_or_default())
        .subresource(t.sub.as_deref().unwrap_or_default());
        crate::auth::check(&c.store(), user, &attrs)?;
    }
    if t.sub.as_deref() == Some("token") {
        return token_request(c, r, &t);
    }
    if let (Some("log"), &Method::GET, Some(ns), Some(name)) =
        (t.sub.as_deref(), &r.method, &t.ns, &t.name)
    {
        return crate::processes::logs::serve(c, r, ns, name);
    }
    match (&r.method, &t.name, t.sub.as_deref()) {
        (&Method::GET, None, _) if r.flag("watch") => {
            crate::watch::watch(c, r, &t.def, &t.version, t.ns.clone())
        }
        (&Method::GET, None, _) => list(c, r, &t),
        (&Method::GET, Some(name), None) => get(c, r, &t, name),
        (&Method::GET, Some(name), Some("status")) => get(c, r, &t, name),
        (&Method::GET, Some(name), Some("scale")) => {
            let store = c.store();
            let obj = load(&store, &t, name)?;
            ok(&scale_of(&t.def, &obj))
        }
        (&Method::POST, None, None) => create(c, r, &t),
        (&Method::PUT, Some(name), sub) => update(c, r, &t, name, sub),
        (&Method::PATCH, Some(name), sub) => patch(c, r, &t, name, sub),
        (&Method::DELETE, Some(name), None) => delete(c, r, &t, name),
        (&Method::DELETE, None, None) => delete_collection(c, r, &t),
        (m, _, _) => Err(Error::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {m}"
        ))),
    }
}

fn ns_of(t: &Target) -> Result<&str> {
    if t.def.namespaced {
        t.ns.as_deref().ok_or_else(|| {
            Error::NotFound("the server could not find the requested resource".into())
        })
    } else {
        Ok("")
    }
}

fn load(store: &crate::store::Store, t: &Target, name: &str) -> Result<crate::store::Obj> {
    let ns = ns_of(t)?;
    store
        .get(&t.def.key, ns, name)
        .cloned()
        .ok_or_else(|| Error::not_found(&t.def.group, &t.def.plural, name))
}

/// The object as served in the requested version: an Event converted between core/v1 and
/// events.k8s.io/v1 (`crate::events`), any other kind from its storage version
/// (`crate::convert`, e.g. an HPA in autoscaling/v1).
fn versioned(def: &ResourceDef, version: &str, obj: &Value) -> Value {
    versioned_ref(def, version, obj).into_owned()
}

/// [`versioned`], borrowing `obj` when it is stored in the version asked for.
fn versioned_ref<'a>(def: &ResourceDef, version: &str, obj: &'a Value) -> Cow<'a, Value> {
    let api_version = def.api_version(version);
    if let Some(event) = crate::events::converted(def, &api_version, obj) {
        return Cow::Owned(event);
    }
    if obj.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str()) {
        return Cow::Borrowed(obj);
    }
    Cow::Owned(crate::convert::to_served(def, version, obj))
}

/// The stored object as a write through `t` sees it: an Event stored through the other
/// Events API in this API's shape, so the write replaces it in this shape.
fn as_written(t: &Target, obj: crate::store::Obj) -> crate::store::Obj {
    match crate::events::converted(&t.def, &t.def.api_version(&t.version), &obj) {
        Some(event) => Arc::new(event),
        None => obj,
    }
}

/// A server-side Table (`Accept: ...;as=Table`).
pub(crate) fn table_of(r: &Req, def: &ResourceDef, objects: &[Value], now: i64) -> Value {
    let include = crate::table::IncludeObject::from_query(r.q("includeObject").unwrap_or_default());
    crate::table::to_table_with(
        &def.plural,
        objects,
        def.printer_columns.as_ref(),
        system_time(now),
        include,
    )
}

fn get(c: &ClusterShared, r: &Req, t: &Target, name: &str) -> Result<Response> {
    let store = c.store();
    let obj = load(&store, t, name)?;
    let obj = versioned(&t.def, &t.version, &obj);
    if r.wants_table() {
        let mut table = table_of(r, &t.def, &[obj], c.now());
        table["metadata"] = json!({"resourceVersion": store.rv.to_string()});
        return ok(&table);
    }
    if r.wants_metadata() {
        return ok(&crate::table::partial_metadata(&obj));
    }
    ok(&obj)
}

fn list(c: &ClusterShared, r: &Req, t: &Target) -> Result<Response> {
    let (lsel, fsel) = selectors(r, crate::events::field_kind(&t.def))?;
    let limit = match r.q("limit") {
        None | Some("") => None,
        Some(l) => {
            let n: i64 = l
                .parse()
                .map_err(|_| Error::BadRequest(format!("invalid limit {l:?}")))?;
            (n > 0).then_some(n as usize)
        }
    };
    let store = c.store();
    let current = store.rv;
    let mut list_rv = current;
    if let (Some(rv), Some("Exact")) = (r.q("resourceVersion"), r.q("resourceVersionMatch")) {
        let rv: u64 = rv
            .parse()
            .map_err(|_| Error::BadRequest(format!("invalid resourceVersion {rv:?}")))?;
        if rv != current {
            return Err(Error::Gone(format!(
                "too old resource version: {rv} ({current})"
            )));
        }
    } else if let Some(rv) = r.q("resourceVersion").filter(|v| !v.is_empty()) {
        rv.parse::<u64>()
            .map_err(|_| Error::BadRequest(format!("invalid resourceVersion {rv:?}")))?;
    }
    let ns = t.ns.as_deref();
    let after = match r.q("continue").filter(|s| !s.is_empty()) {
        None => None,
        Some(tok) => {
            let bad = || Error::BadRequest("continue key is not valid".into());
            let raw = hex_decode(tok).ok_or_else(bad)?;
            let raw = String::from_utf8(raw).map_err(|_| bad())?;
            let mut it = raw.splitn(3, '\0');
            let (rv, n, name) = (it.next(), it.next(), it.next());
            let rv: u64 = rv.and_then(|v| v.parse().ok()).ok_or_else(bad)?;
            if rv < store.oldest_rv() {
                return Err(Error::Gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                ));
            }
            list_rv = rv;
            Some((
                n.unwrap_or_default().to_string(),
                name.ok_or_else(bad)?.to_string(),
            ))
        }
    };
    let matches = |o: &&crate::store::Obj| {
        (lsel.is_everything() || lsel.matches(&labels_of(o))) && fsel.matches(o)
    };
    let iter: Box<dyn Iterator<Item = &crate::store::Obj>> = match after {
        Some(a) => Box::new(store.list_after(&t.def.key, ns, a)),
        None => Box::new(store.list(&t.def.key, ns)),
    };
    // The objects are shared (`Arc`): the store is locked only while they are picked, not
    // while they are converted and serialized (a list of 10,000 objects held every write
    // back for as long).
    let mut objects: Vec<crate::store::Obj> = Vec::new();
    let mut more = false;
    for o in iter.filter(matches) {
        if limit.is_some_and(|l| objects.len() >= l) {
            more = true;
            break;
        }
        objects.push(o.clone());
    }
    drop(store);
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if more && let Some(last) = objects.last() {
        let key = format!(
            "{list_rv}\0{}\0{}",
            meta_str(last, "namespace").unwrap_or_default(),
            meta_str(last, "name").unwrap_or_default()
        );
        meta["continue"] = json!(hex_encode(key.as_bytes()));
    }
    if r.wants_metadata() {
        let items: Vec<Value> = objects
            .iter()
            .map(|o| crate::table::partial_metadata(o))
            .collect();
        return ok(&json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": items,
        }));
    }
    if r.wants_table() {
        let items: Vec<Value> = objects
            .iter()
            .map(|o| versioned(&t.def, &t.version, o))
            .collect();
        let mut table = table_of(r, &t.def, &items, c.now());
        table["metadata"] = meta;
        return ok(&table);
    }
    // An object stored in the version asked for is serialized as it is, not copied.
    #[derive(serde::Serialize)]
    struct List<'a> {
        kind: String,
        #[serde(rename = "apiVersion")]
        api_version: String,
        metadata: Value,
        items: Vec<Cow<'a, Value>>,
    }
    ok(&List {
        kind: format!("{}List", t.def.kind),
        api_version: t.def.api_version(&t.version),
        metadata: meta,
        items: objects
            .iter()
            .map(|o| versioned_ref(&t.def, &t.version, o))
            .collect(),
    })
}

/// Parses a JSON (or YAML) request body into an object.
fn body_json(r: &Req) -> Result<Value> {
    if r.body.is_empty() {
        return Err(Error::BadRequest("the request body is empty".into()));
    }
    let ct = r.content_type();
    if ct.contains("protobuf") {
        return crate::protobuf::decode(&r.body);
    }
    if ct.contains("cbor") {
        return Err(Error::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
        )));
    }
    let v: Value = if ct.contains("yaml") {
        serde_yaml::from_slice(&r.body)
            .map_err(|e| Error::BadRequest(format!("invalid YAML body: {e}")))?
    } else {
        serde_json::from_slice(&r.body)
            .map_err(|e| Error::BadRequest(format!("invalid JSON body: {e}")))?
    };
    Ok(v)
}

fn check_kind(t: &Target, obj: &Value) -> Result<()> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != t.def.kind
        && !(t.sub.as_deref() == Some("scale") && kind == "Scale")
    {
        return Err(Error::BadRequest(format!(
            "the API version in the data ({}) does not match the expected API version ({}) or kind {kind} does not match {}",
            obj.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            t.def.api_version(&t.version),
            t.def.kind
        )));
    }
    Ok(())
}

/// `?fieldValidation=`: what a write does with fields the schema does not declare and with
/// fields a JSON body names twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (the default).
    Warn,
    /// Refuse the write (what kubectl asks for by default, `--validate=strict`).
    Strict,
}

fn field_validation(r: &Req, options: &str) -> Result<FieldValidation> {
    match r.q("fieldValidation") {
        None | Some("" | "Warn") => Ok(FieldValidation::Warn),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some(other) => Err(Error::invalid_fields(
            "meta.k8s.io",
            options,
            "",
            vec![crate::schema::FieldError {
                cause: crate::schema::Cause::NotSupported,
                field: "fieldValidation".into(),
                value: Some(crate::schema::go_quote(other)),
                detail: "supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"".into(),
                at: String::new(),
            }],
        )),
    }
}

/// What strict decoding finds in a write: the fields a JSON body names twice (when `raw`
/// is that body) and the fields of `obj` that the CRD's schema does not declare, which are
/// pruned from `obj`. Each as kube-apiserver words it: `unknown field "spec.x"`.
fn strict_decoding(t: &Target, r: &Req, raw: Option<&[u8]>, obj: &mut Value) -> Vec<String> {
    let mut problems: Vec<String> = Vec::new();
    if let Some(schema) = t.def.schema.as_ref().filter(|_| t.def.crd) {
        problems.extend(
            crate::schema::prune(schema, obj)
                .iter()
                .map(|p| format!("unknown field {}", crate::schema::go_quote(p))),
        );
    }
    if let Some(raw) = raw.filter(|_| !r.content_type().contains("yaml")) {
        problems.extend(
            crate::schema::duplicate_fields(raw)
                .unwrap_or_default()
                .iter()
                .map(|p| format!("duplicate field {}", crate::schema::go_quote(p))),
        );
    }
    problems
}

/// Adds one `Warning: 299 - "…"` header per warning, as kube-apiserver does.
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// `?dryRun=All`: the write runs against a scratch copy of the store and is not persisted.
fn dry_run(r: &Req) -> Result<bool> {
    match r.q("dryRun") {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(v) => Err(Error::BadRequest(format!(
            "dryRun: Unsupported value: {v:?}: supported values: \"All\""
        ))),
    }
}

fn created(c: &ClusterShared, obj: &Value) -> Result<Response> {
    c.wake.notify_one();
    Ok(json_response(StatusCode::CREATED, obj))
}

fn done(c: &ClusterShared, obj: &Value) -> Result<Response> {
    c.wake.notify_one();
    ok(obj)
}

fn create(c: &ClusterShared, r: &Req, t: &Target) -> Result<Response> {
    let dry = dry_run(r)?;
    let validation = field_validation(r, "CreateOptions")?;
    let ns = ns_of(t)?.to_string();
    let mut obj = body_json(r)?;
    check_kind(t, &obj)?;
    if !obj.is_object() {
        return Err(Error::BadRequest("the body must be a JSON object".into()));
    }
    let warnings = decoded(t, r, validation, Some(&r.body), &mut obj)?;
    if obj.get("apiVersion").is_none() {
        obj["apiVersion"] = json!(t.def.api_version(&t.version));
    }
    let obj = crate::convert::to_stored(&t.def, &t.version, &obj);
    let now = c.now();
    let obj = crate::patch::apply::record_update(
        &Value::Null,
        &obj,
        &manager_of(r),
        "Update",
        None,
        &crate::util::rfc3339(now),
    );
    let mut guard = c.store();
    let mut scratch = None;
    let store: &mut crate::store::Store = if dry {
        scratch.insert(guard.dry_clone())
    } else {
        &mut guard
    };
    let out = store.create(&t.def, &ns, obj, now)?;
    drop(guard);
    Ok(with_warnings(
        created(c, &versioned(&t.def, &t.version, &out))?,
        &warnings,
    ))
}

/// Strict decoding of a create or update body: refused under `Strict` as kube-apiserver
/// refuses a body it cannot decode, else the warnings to send (none under `Ignore`).
fn decoded(
    t: &Target,
    r: &Req,
    validation: FieldValidation,
    raw: Option<&[u8]>,
    obj: &mut Value,
) -> Result<Vec<String>> {
    let problems = strict_decoding(t, r, raw, obj);
    match validation {
        FieldValidation::Strict if !problems.is_empty() => Err(Error::BadRequest(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            problems.join(", "),
            kind = t.def.kind,
            version = t.version,
        ))),
        FieldValidation::Ignore => Ok(Vec::new()),
        _ => Ok(problems),
    }
}

/// The field manager of a write: `?fieldManager=`, else the User-Agent's program name.
fn manager_of(r: &Req) -> String {
    if let Some(m) = r.q("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    r.headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// Records an Update in `managedFields` of `new` relative to `old`.
fn track(old: &Value, new: &Value, r: &Req, sub: Option<&str>, now: i64) -> Value {
    crate::patch::apply::record_update(
        old,
        new,
        &manager_of(r),
        "Update",
        sub,
        &crate::util::rfc3339(now),
    )
}

fn update(
    c: &ClusterShared,
    r: &Req,
    t: &Target,
    name: &str,
    sub: Option<&str>,
) -> Result<Response> {
    let dry = dry_run(r)?;
    let validation = field_validation(r, "UpdateOptions")?;
    let ns = ns_of(t)?.to_string();
    let mut body = body_json(r)?;
    check_kind(t, &body)?;
    let warnings = if sub == Some("scale") {
        Vec::new()
    } else {
        decoded(t, r, validation, Some(&r.body), &mut body)?
    };
    let now = c.now();
    let mut guard = c.store();
    let mut scratch = None;
    let store: &mut crate::store::Store = if dry {
        scratch.insert(guard.dry_clone())
    } else {
        &mut guard
    };
    let out = match sub {
        Some("scale") => {
            let current = load(store, t, name)?;
            write_scale(store, t, &current, &body, &manager_of(r), now)?
        }
        _ => {
            let scope = WriteScope::for_subresource(sub);
            let current = as_written(t, load(store, t, name)?);
            if crate::events::shared(&t.def) && body.get("apiVersion").is_none() {
                body["apiVersion"] = json!(t.def.api_version(&t.version));
            }
            let body = crate::convert::to_stored(&t.def, &t.version, &body);
            let body = track(&current, &body, r, sub, now);
            let out = store.update(&t.def, &ns, name, body, scope, now)?;
            versioned(&t.def, &t.version, &out)
        }
    };
    drop(guard);
    Ok(with_warnings(done(c, &out)?, &warnings))
}

/// The `autoscaling/v1` Scale view of an object.
pub(crate) fn scale_of(def: &ResourceDef, obj: &Value) -> Value {
    let Some(spec) = &def.scale else {
        return Value::Null;
    };
    let get_i = |p: &str| {
        crate::util::get_path(obj, p)
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let selector = spec
        .selector
        .as_deref()
        .and_then(|p| crate::util::get_path(obj, p));
    let selector = match selector {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Object(_)) => LabelSelector::from_label_selector_json(v)
            .map(|s| s.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    };
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let mut m = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    let mut status = json!({"replicas": get_i(&spec.status_replicas)});
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": {"replicas": get_i(&spec.spec_replicas)},
        "status": status,
    })
}

fn write_scale(
    store: &mut crate::store::Store,
    t: &Target,
    current: &Value,
    scale: &Value,
    manager: &str,
    now: i64,
) -> Result<Value> {
    let ns = ns_of(t)?;
    let name = t.name.as_deref().unwrap_or_default();
    let Some(spec) = &t.def.scale else {
        return Err(Error::NotFound(
            "the server could not find the requested resource".into(),
        ));
    };
    let replicas = scale
        .get("spec")
        .and_then(|s| s.get("replicas"))
        .map(|v| {
            v.as_i64().ok_or_else(|| {
                Error::Invalid("spec.replicas: Invalid value: must be an integer".into())
            })
        })
        .transpose()?
        .unwrap_or(0);
    if replicas < 0 {
        return Err(Error::Invalid(format!(
            "Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"
        )));
    }
    let mut obj = current.clone();
    if let Some(rv) = scale
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        && !rv.is_empty()
    {
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv));
    }
    crate::util::set_path(&mut obj, &spec.spec_replicas, json!(replicas));
    let obj = crate::patch::apply::record_update(
        current,
        &obj,
        manager,
        "Update",
        Some("scale"),
        &crate::util::rfc3339(now),
    );
    let out = store.update(&t.def, ns, name, obj, WriteScope::Main, now)?;
    Ok(scale_of(&t.def, &out))
}

fn patch(
    c: &ClusterShared,
    r: &Req,
    t: &Target,
    name: &str,
    sub: Option<&str>,
) -> Result<Response> {
    let dry = dry_run(r)?;
    let validation = field_validation(r, "PatchOptions")?;
    let ns = ns_of(t)?.to_string();
    let ct = r
        .content_type()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let now = c.now();
    let ts = crate::util::rfc3339(now);
    let mut guard = c.store();
    let mut scratch = None;
    let store: &mut crate::store::Store = if dry {
        scratch.insert(guard.dry_clone())
    } else {
        &mut guard
    };
    let current = store
        .get(&t.def.key, &ns, name)
        .cloned()
        .map(|o| as_written(t, o));
    if ct == "application/apply-patch+yaml" {
        let manager = r
            .q("fieldManager")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                Error::BadRequest(
                    "PATCH requests with apply content type must provide a fieldManager".into(),
                )
            })?;
        let force = r.flag("force");
        let applied = body_json(r)?;
        if sub != Some("scale") {
            check_kind(t, &applied)?;
            // Server-side apply types the applied configuration by the schema, whatever
            // `fieldValidation` says: a field the schema does not declare is an error.
            if let Some(schema) = t.def.schema.as_ref().filter(|_| t.def.crd) {
                let unknown = crate::schema::prune(schema, &mut applied.clone());
                if !unknown.is_empty() {
                    return Err(Error::Internal(format!(
                        "failed to create typed patch object ({ns}/{name}; {}, Kind={}): {}",
                        t.def.api_version(&t.version),
                        t.def.kind,
                        unknown
                            .iter()
                            .map(|p| format!(".{p}: field not declared in schema"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        let opts = |subresource| crate::patch::apply::ApplyOptions {
            manager,
            force,
            now: &ts,
            subresource,
        };
        let Some(current) = current else {
            if sub.is_some() {
                return Err(Error::not_found(&t.def.group, &t.def.plural, name));
            }
            // An apply that creates the object needs `create` as well as `patch`, as in
            // kube-apiserver: `patch` alone must not bring objects into existence.
            if let Some(user) = &r.user {
                let attrs = crate::rbac::RequestAttributes::resource(
                    "create",
                    &t.def.group,
                    &t.def.plural,
                    &ns,
                )
                .named(name);
                crate::auth::check(store, user, &attrs)?;
            }
            let obj = crate::patch::apply::apply_subresource(None, &applied, opts(None))?;
            let mut obj = crate::convert::to_stored(&t.def, &t.version, &obj);
            meta_mut(&mut obj).insert("name".into(), json!(name));
            let out = store.create(&t.def, &ns, obj, now)?;
            drop(guard);
            return created(c, &versioned(&t.def, &t.version, &out));
        };
        let out = match sub {
            Some("scale") => {
                let scale = scale_of(&t.def, &current);
                let patched =
                    crate::patch::apply::apply_subresource(Some(&scale), &applied, opts(sub))?;
                write_scale(store, t, &current, &patched, manager, now)?
            }
            _ => {
                let served = versioned(&t.def, &t.version, &current);
                let obj =
                    crate::patch::apply::apply_subresource(Some(&served), &applied, opts(sub))?;
                let mut obj = crate::convert::to_stored(&t.def, &t.version, &obj);
                // Apply never carries a precondition unless the user sets one.
                if meta_str(&applied, "resourceVersion").is_none() {
                    meta_mut(&mut obj).remove("resourceVersion");
                }
                let scope = WriteScope::for_subresource(sub);
                let out = store.update(&t.def, &ns, name, obj, scope, now)?;
                versioned(&t.def, &t.version, &out)
            }
        };
        drop(guard);
        return done(c, &out);
    }
    let current = current.ok_or_else(|| Error::not_found(&t.def.group, &t.def.plural, name))?;
    let base = match sub {
        Some("scale") => scale_of(&t.def, &current),
        _ => versioned(&t.def, &t.version, &current),
    };
    let mut doc = base.clone();
    match ct.as_str() {
        "application/json-patch+json" => {
            let p: Value = serde_json::from_slice(&r.body)
                .map_err(|e| Error::BadRequest(format!("invalid JSON patch: {e}")))?;
            crate::patch::json_patch(&mut doc, &p)?;
        }
        "application/merge-patch+json" => {
            let p: Value = serde_json::from_slice(&r.body)
                .map_err(|e| Error::BadRequest(format!("invalid JSON merge patch: {e}")))?;
            if !p.is_object() {
                return Err(Error::BadRequest(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            crate::patch::json_merge(&mut doc, &p);
        }
        "application/strategic-merge-patch+json" => {
            if t.def.crd {
                return Err(Error::UnsupportedMediaType(
                    "strategic merge patch is not supported for custom resources; use a JSON merge patch or apply".into(),
                ));
            }
            let p: Value = serde_json::from_slice(&r.body)
                .map_err(|e| Error::BadRequest(format!("invalid strategic merge patch: {e}")))?;
            if !p.is_object() {
                return Err(Error::BadRequest(
                    "a strategic merge patch must be a JSON object".into(),
                ));
            }
            crate::patch::strategic_merge(&mut doc, &p, &t.def.kind)?;
        }
        other => {
            return Err(Error::UnsupportedMediaType(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
            )));
        }
    }
    let mut warnings = Vec::new();
    if sub != Some("scale") {
        let patched = serde_json::to_string(&doc).unwrap_or_default();
        let raw = (ct == "application/merge-patch+json"
            || ct == "application/strategic-merge-patch+json")
            .then_some(&r.body[..]);
        let problems = strict_decoding(t, r, raw, &mut doc);
        match validation {
            FieldValidation::Strict if !problems.is_empty() => {
                // kube-apiserver reports it as an invalid `patch` of no kind and no name.
                return Err(Error::invalid_fields(
                    "",
                    "",
                    "",
                    vec![crate::schema::FieldError {
                        cause: crate::schema::Cause::Invalid,
                        field: "patch".into(),
                        value: Some(crate::schema::go_quote(&patched)),
                        detail: format!("strict decoding error: {}", problems.join(", ")),
                        at: String::new(),
                    }],
                ));
            }
            FieldValidation::Ignore => {}
            _ => warnings = problems,
        }
    }
    // A patch that does not mention resourceVersion carries no precondition.
    let patch_rv = meta_str(&doc, "resourceVersion").map(str::to_string);
    let base_rv = meta_str(&base, "resourceVersion").map(str::to_string);
    if patch_rv == base_rv {
        meta_mut(&mut doc).remove("resourceVersion");
    }
    let out = match sub {
        Some("scale") => write_scale(store, t, &current, &doc, &manager_of(r), now)?,
        _ => {
            let doc = crate::convert::to_stored(&t.def, &t.version, &doc);
            let doc = track(&current, &doc, r, sub, now);
            let scope = WriteScope::for_subresource(sub);
            let out = store.update(&t.def, &ns, name, doc, scope, now)?;
            versioned(&t.def, &t.version, &out)
        }
    };
    drop(guard);
    Ok(with_warnings(done(c, &out)?, &warnings))
}

/// A DELETE's DeleteOptions, JSON or (from typed Go clients such as Helm's release storage)
/// protobuf; `None` without a body.
fn delete_options_body(r: &Req) -> Result<Option<Value>> {
    if r.body.is_empty() {
        return Ok(None);
    }
    if r.content_type().contains("protobuf") {
        return crate::protobuf::decode(&r.body).map(Some);
    }
    serde_json::from_slice(&r.body)
        .map(Some)
        .map_err(|e| Error::BadRequest(format!("invalid DeleteOptions: {e}")))
}

fn delete_options(r: &Req) -> Result<(Propagation, Option<String>)> {
    let mut propagation = Propagation::Background;
    let mut precondition = None;
    if let Some(opts) = delete_options_body(r)? {
        if let Some(p) = opts.get("propagationPolicy").and_then(Value::as_str) {
            propagation = Propagation::parse(p)?;
        } else if opts.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            propagation = Propagation::Orphan;
        }
        precondition = opts
            .get("preconditions")
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(p) = r.q("propagationPolicy") {
        propagation = Propagation::parse(p)?;
    }
    Ok((propagation, precondition))
}

/// `preconditions.uid` of DeleteOptions, checked as the API server does: a different uid is a
/// 409 Conflict (the name now belongs to another object). A missing object is left to the
/// store's NotFound.
fn check_uid_precondition(
    r: &Req,
    current: Option<&Value>,
    plural: &str,
    name: &str,
) -> Result<()> {
    let Some(opts) = delete_options_body(r)? else {
        return Ok(());
    };
    let Some(want) = opts.pointer("/preconditions/uid").and_then(Value::as_str) else {
        return Ok(());
    };
    let Some(current) = current else {
        return Ok(());
    };
    let have = current
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if have != want {
        return Err(Error::Conflict(format!(
            "Operation cannot be fulfilled on {plural} \"{name}\": Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
        )));
    }
    Ok(())
}

fn delete(c: &ClusterShared, r: &Req, t: &Target, name: &str) -> Result<Response> {
    let dry = dry_run(r)?;
    let ns = ns_of(t)?.to_string();
    let (propagation, precondition) = delete_options(r)?;
    let now = c.now();
    let mut guard = c.store();
    let mut scratch = None;
    let store: &mut crate::store::Store = if dry {
        scratch.insert(guard.dry_clone())
    } else {
        &mut guard
    };
    let existed_before = store.get(&t.def.key, &ns, name).cloned();
    check_uid_precondition(r, existed_before.as_deref(), &t.def.plural, name)?;
    let out = store.delete(&t.def, &ns, name, propagation, precondition.as_deref(), now)?;
    let still_there = store.get(&t.def.key, &ns, name).is_some();
    drop(guard);
    c.wake.notify_one();
    let _ = existed_before;
    let code = if still_there {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok(json_response(code, &versioned(&t.def, &t.version, &out)))
}

fn delete_collection(c: &ClusterShared, r: &Req, t: &Target) -> Result<Response> {
    let dry = dry_run(r)?;
    let (lsel, fsel) = selectors(r, crate::events::field_kind(&t.def))?;
    let (propagation, _) = delete_options(r)?;
    let now = c.now();
    let mut guard = c.store();
    let mut scratch = None;
    let store: &mut crate::store::Store = if dry {
        scratch.insert(guard.dry_clone())
    } else {
        &mut guard
    };
    let ns = t.ns.as_deref();
    let targets: Vec<(String, String)> = store
        .list(&t.def.key, ns)
        .filter(|o| lsel.matches(&labels_of(o)) && fsel.matches(o))
        .map(|o| {
            (
                meta_str(o, "namespace").unwrap_or_default().to_string(),
                meta_str(o, "name").unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (n, name) in targets {
        if let Ok(o) = store.delete(&t.def, &n, &name, propagation, None, now) {
            items.push(versioned(&t.def, &t.version, &o));
        }
    }
    let rv = store.rv;
    drop(guard);
    done(
        c,
        &json!({
            "kind": format!("{}List", t.def.kind),
            "apiVersion": t.def.api_version(&t.version),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    )
}

/// `POST .../serviceaccounts/NAME/token` (TokenRequest, e.g. `kubectl create token`):
/// issues a bearer token for the ServiceAccount. The request body is not needed.
fn token_request(c: &ClusterShared, r: &Req, t: &Target) -> Result<Response> {
    if r.method != Method::POST {
        return Err(Error::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource: {}",
            r.method
        )));
    }
    let ns = ns_of(t)?.to_string();
    let name = t.name.clone().unwrap_or_default();
    if c.store().get(&t.def.key, &ns, &name).is_none() {
        return Err(Error::not_found("", "serviceaccounts", &name));
    }
    let token = c.issue_token(crate::rbac::UserInfo::service_account(&ns, &name));
    let expires = crate::util::rfc3339(c.now() + 3_600_000);
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
            "status": {"token": token, "expirationTimestamp": expires},
        }),
    ))
}
