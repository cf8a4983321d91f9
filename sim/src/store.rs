//! In-memory object storage of one virtual cluster: objects, the resourceVersion
//! counter, the bounded event history for watches and the live event channel.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::resources::{ResourceDef, builtins};
use crate::util::{meta_mut, meta_str, name_suffix, new_uid, rfc3339};

/// A stored object; shared between the store, the history and watch streams.
pub type Obj = Arc<Value>;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventKind {
    /// Wire name of the event type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change in the store.
#[derive(Debug)]
pub struct Event {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Storage key of the resource (`group/plural`).
    pub res: Arc<str>,
    /// Namespace ("" for cluster-scoped).
    pub ns: String,
    /// Type of change.
    pub kind: EventKind,
    /// The object after the change (for deletes: the last state).
    pub obj: Obj,
    /// The object before the change, for MODIFIED (lets selector watches emit ADDED/DELETED).
    pub old: Option<Obj>,
    /// `obj` serialized once, shared by every watch that sends it unchanged.
    pub json: std::sync::OnceLock<Vec<u8>>,
    /// When the change was stored (a lagging watch, [`crate::Faults::watch_lag`], sends it
    /// that long after).
    pub at: std::time::Instant,
}

/// How dependents are handled when an owner is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Owner goes away now, the garbage collector deletes dependents afterwards.
    Background,
    /// Owner stays (with `foregroundDeletion`) until its dependents are gone.
    Foreground,
    /// Dependents lose their owner reference and stay.
    Orphan,
}

impl Propagation {
    /// Parses `propagationPolicy`.
    pub fn parse(s: &str) -> Result<Propagation> {
        match s {
            "Background" => Ok(Propagation::Background),
            "Foreground" => Ok(Propagation::Foreground),
            "Orphan" => Ok(Propagation::Orphan),
            other => Err(Error::Invalid(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            ))),
        }
    }
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteScope {
    /// The main resource: everything except status (when a status subresource exists).
    Main,
    /// The `/status` subresource: status only.
    Status,
    /// Controllers inside the simulator: everything.
    Internal,
}

impl WriteScope {
    /// The scope of a write to the main resource or to one of its subresources.
    pub fn for_subresource(sub: Option<&str>) -> Self {
        if sub == Some("status") {
            WriteScope::Status
        } else {
            WriteScope::Main
        }
    }
}

/// The storage of one virtual cluster.
#[derive(Debug)]
pub struct Store {
    /// Last issued resourceVersion.
    pub rv: u64,
    defs: Vec<Arc<ResourceDef>>,
    objects: HashMap<Arc<str>, BTreeMap<(String, String), Obj>>,
    log: VecDeque<Arc<Event>>,
    log_cap: usize,
    tx: broadcast::Sender<Arc<Event>>,
    /// Set by every write; cleared by the controllers when they have looked.
    pub dirty: bool,
    /// Set by a write that can give the garbage collector work: a deletion, an object with
    /// owners, an object being deleted. Cleared by the garbage collector when it has looked,
    /// so that the writes that cannot (a status, a Lease renewal) do not make it walk every
    /// object again: at 10,000 MemberClusters that walk was 85% of the simulator's CPU.
    pub gc_due: bool,
    /// The loopback addresses this cluster's pods hold (given back when a pod is removed).
    pod_ips: crate::pod_ips::Leases,
}

pub(crate) const FOREGROUND: &str = "foregroundDeletion";

impl Store {
    /// An empty store with the built-in resources and the default namespaces.
    pub fn new(history: usize, channel: usize, now: i64) -> Store {
        let (tx, _) = broadcast::channel(channel.max(1));
        let mut s = Store {
            rv: 0,
            defs: builtins().into_iter().map(Arc::new).collect(),
            objects: HashMap::new(),
            log: VecDeque::new(),
            log_cap: history.max(1),
            tx,
            dirty: true,
            gc_due: true,
            pod_ips: crate::pod_ips::Leases::default(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // Cannot fail: the names are valid and the store is empty.
            let _ = s.create_internal("/namespaces", obj, now);
        }
        s
    }

    /// A scratch copy for dry-run writes: same objects (shared), no history, no
    /// subscribers, so nothing it does is visible outside.
    pub fn dry_clone(&self) -> Store {
        let (tx, _) = broadcast::channel(1);
        Store {
            rv: self.rv,
            defs: self.defs.clone(),
            objects: self.objects.clone(),
            log: VecDeque::new(),
            log_cap: 1,
            tx,
            dirty: false,
            gc_due: false,
            // A dry run never starts a pod, and must not give back the real pods' addresses.
            pod_ips: crate::pod_ips::Leases::default(),
        }
    }

    /// The pod's IP (see [`crate::pod_ips`]), or a `LoadBalancer` Service's external one: the
    /// one it holds, else a new one; `None` when every address is in use.
    pub fn pod_ip(&mut self, uid: &str) -> Option<std::net::Ipv4Addr> {
        self.pod_ips.lease(uid)
    }

    /// Subscribes to live events (call while holding the lock to avoid gaps).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// All resource definitions.
    pub fn defs(&self) -> &[Arc<ResourceDef>] {
        &self.defs
    }

    /// Finds a resource by group, version and plural name.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.defs
            .iter()
            .find(|d| {
                d.group == group && d.plural == plural && d.versions.iter().any(|v| v == version)
            })
            .cloned()
    }

    /// Finds a resource by storage key.
    pub fn def(&self, key: &str) -> Option<Arc<ResourceDef>> {
        self.defs.iter().find(|d| &*d.key == key).cloned()
    }

    /// Finds a resource by apiVersion and kind.
    pub fn def_for_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceDef>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.defs
            .iter()
            .find(|d| d.group == group && d.kind == kind && d.versions.iter().any(|v| v == version))
            .cloned()
    }

    /// One object.
    pub fn get(&self, key: &str, ns: &str, name: &str) -> Option<&Obj> {
        self.objects
            .get(key)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Objects of a resource, optionally in one namespace, ordered by (namespace, name).
    pub fn list<'a>(
        &'a self,
        key: &str,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Obj> + 'a {
        self.objects
            .get(key)
            .into_iter()
            .flat_map(move |m| match ns {
                Some(ns) => Box::new(
                    m.range((ns.to_string(), String::new())..)
                        .take_while(move |((n, _), _)| n == ns)
                        .map(|(_, o)| o),
                ) as Box<dyn Iterator<Item = &Obj>>,
                None => Box::new(m.values()),
            })
    }

    /// Objects after a (namespace, name) position, for paginated lists.
    pub fn list_after<'a>(
        &'a self,
        key: &str,
        ns: Option<&'a str>,
        after: (String, String),
    ) -> impl Iterator<Item = &'a Obj> + 'a {
        use std::ops::Bound;
        self.objects.get(key).into_iter().flat_map(move |m| {
            m.range((Bound::Excluded(after.clone()), Bound::Unbounded))
                .take_while(move |((n, _), _)| ns.is_none_or(|ns| ns == n))
                .map(|(_, o)| o)
        })
    }

    /// Every object of every resource (for the garbage collector).
    pub fn all_objects(&self) -> impl Iterator<Item = (&Arc<str>, &Obj)> {
        self.objects
            .iter()
            .flat_map(|(k, m)| m.values().map(move |o| (k, o)))
    }

    /// Oldest resourceVersion a watch can still resume from.
    pub fn oldest_rv(&self) -> u64 {
        self.log
            .front()
            .map(|e| e.rv.saturating_sub(1))
            .unwrap_or(self.rv)
    }

    /// Retained events after `rv`, or `Gone` if history does not reach back that far.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>> {
        if rv < self.oldest_rv() {
            return Err(Error::Gone(format!(
                "too old resource version: {rv} ({})",
                self.oldest_rv() + 1
            )));
        }
        Ok(self.log.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    /// Stores a changed object under a new resourceVersion and emits `MODIFIED`.
    fn store_modified(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        mut new: Value,
        old: Obj,
    ) -> Obj {
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let obj = Arc::new(new);
        self.objects
            .entry(def.key.clone())
            .or_default()
            .insert((ns.to_string(), name.to_string()), obj.clone());
        self.emit(
            def.key.clone(),
            ns.to_string(),
            EventKind::Modified,
            obj.clone(),
            Some(old),
        );
        obj
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(&mut self, res: Arc<str>, ns: String, kind: EventKind, obj: Obj, old: Option<Obj>) {
        self.gc_due |=
            kind == EventKind::Deleted || owner_uids(&obj).next().is_some() || deleting(&obj);
        let ev = Arc::new(Event {
            rv: self.rv,
            res,
            ns,
            kind,
            obj,
            old,
            json: std::sync::OnceLock::new(),
            at: std::time::Instant::now(),
        });
        if self.log.len() >= self.log_cap {
            self.log.pop_front();
        }
        self.log.push_back(ev.clone());
        // No receivers is fine.
        let _ = self.tx.send(ev);
        self.dirty = true;
    }

    /// Creates an object as a client would (`POST`): validation, defaulting, status reset.
    pub fn create(&mut self, def: &ResourceDef, ns: &str, mut obj: Value, now: i64) -> Result<Obj> {
        if !obj.is_object() {
            return Err(Error::BadRequest("the body must be a JSON object".into()));
        }
        let body_ns = meta_str(&obj, "namespace").unwrap_or_default().to_string();
        if def.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(Error::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
            match self.get("/namespaces", "", ns) {
                None => return Err(Error::not_found("", "namespaces", ns)),
                Some(n) if deleting(n) => {
                    return Err(Error::Forbidden(format!(
                        "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        def.plural,
                        meta_str(&obj, "name").unwrap_or_default()
                    )));
                }
                Some(_) => {}
            }
        }
        if def.status {
            reset_status(def, &mut obj);
        }
        crate::defaults::apply(def, &mut obj);
        crate::defaults::fold_string_data(def, &mut obj);
        check_schema(def, &obj, None)?;
        {
            let meta = meta_mut(&mut obj);
            for f in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "generation",
                "deletionGracePeriodSeconds",
            ] {
                meta.remove(f);
            }
        }
        self.insert(def, if def.namespaced { ns } else { "" }, obj, now)
    }

    /// Creates an object from inside the simulator (no status reset).
    pub fn create_internal(&mut self, key: &str, obj: Value, now: i64) -> Result<Obj> {
        let def = self
            .def(key)
            .ok_or_else(|| Error::NotFound(format!("resource {key} is not served")))?;
        let ns = meta_str(&obj, "namespace").unwrap_or_default().to_string();
        let mut obj = obj;
        crate::defaults::apply(&def, &mut obj);
        self.insert(&def, if def.namespaced { &ns } else { "" }, obj, now)
    }

    fn insert(&mut self, def: &ResourceDef, ns: &str, mut obj: Value, now: i64) -> Result<Obj> {
        let mut name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").unwrap_or_default();
            if prefix.is_empty() {
                return Err(Error::Invalid(format!(
                    "{} in version \"{}\" cannot be handled as a {}: metadata.name: Required value: name or generateName is required",
                    def.kind,
                    def.version(),
                    def.kind
                )));
            }
            name = format!("{prefix}{}", name_suffix(5));
        }
        validate_name(def, &name)?;
        let map = self.objects.entry(def.key.clone()).or_default();
        if map.contains_key(&(ns.to_string(), name.clone())) {
            return Err(Error::already_exists(&def.group, &def.plural, &name));
        }
        let rv = self.next_rv();
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| def.api_version(def.version()));
        {
            let root = obj
                .as_object_mut()
                .ok_or_else(|| Error::BadRequest("not an object".into()))?;
            root.insert("apiVersion".into(), json!(api_version));
            root.insert("kind".into(), json!(def.kind));
        }
        let meta = meta_mut(&mut obj);
        meta.insert("name".into(), json!(name));
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("creationTimestamp".into(), json!(rfc3339(now)));
        if def.tracks_generation() {
            meta.insert("generation".into(), json!(1));
        }
        check_size(&obj)?;
        let obj = Arc::new(obj);
        self.objects
            .entry(def.key.clone())
            .or_default()
            .insert((ns.to_string(), name.clone()), obj.clone());
        self.emit(
            def.key.clone(),
            ns.to_string(),
            EventKind::Added,
            obj.clone(),
            None,
        );
        if &*def.key == "apiextensions.k8s.io/customresourcedefinitions" {
            self.crd_created(&name, now);
            return Ok(self.get(&def.key, "", &name).cloned().unwrap_or(obj));
        }
        Ok(obj)
    }

    /// Replaces an object (`PUT` or the result of a patch).
    ///
    /// Checks the resourceVersion in `new` (if any), keeps immutable metadata,
    /// separates status from the rest according to `scope`, bumps generation on
    /// spec changes and finishes deletion when the last finalizer goes.
    pub fn update(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        mut new: Value,
        scope: WriteScope,
        now: i64,
    ) -> Result<Obj> {
        let ns = if def.namespaced { ns } else { "" };
        let old = self
            .get(&def.key, ns, name)
            .cloned()
            .ok_or_else(|| Error::not_found(&def.group, &def.plural, name))?;
        if !new.is_object() {
            return Err(Error::BadRequest("the body must be a JSON object".into()));
        }
        let body_name = meta_str(&new, "name").unwrap_or(name);
        if body_name != name {
            return Err(Error::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if def.namespaced {
            let body_ns = meta_str(&new, "namespace").unwrap_or(ns);
            if body_ns != ns {
                return Err(Error::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
        }
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|s| !s.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(Error::stale(&def.group, &def.plural, name));
        }
        // Which parts come from the request and which from the stored object.
        match scope {
            WriteScope::Status => {
                let status = new.get("status").cloned();
                // The field manager's record of the write (the API layer tracked it in the
                // request's object): a status applier that owned nothing would never prune
                // what it stopped applying.
                let managed = new
                    .get("metadata")
                    .and_then(|m| m.get("managedFields"))
                    .cloned();
                let mut merged = (*old).clone();
                if let Some(root) = merged.as_object_mut() {
                    match status {
                        Some(s) => root.insert("status".into(), s),
                        None => root.remove("status"),
                    };
                }
                if let Some(managed) = managed {
                    meta_mut(&mut merged).insert("managedFields".into(), managed);
                }
                new = merged;
            }
            WriteScope::Main if def.status => {
                if let Some(root) = new.as_object_mut() {
                    match old.get("status") {
                        Some(s) => root.insert("status".into(), s.clone()),
                        None => root.remove("status"),
                    };
                }
            }
            WriteScope::Main | WriteScope::Internal => {}
        }
        let old_meta = old
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        {
            let meta = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "namespace",
                "name",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(f) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
            if !meta.contains_key("managedFields")
                && let Some(mf) = old_meta.get("managedFields")
            {
                meta.insert("managedFields".into(), mf.clone());
            }
        }
        if let Some(root) = new.as_object_mut() {
            root.insert("kind".into(), json!(def.kind));
            if !root.contains_key("apiVersion") {
                root.insert(
                    "apiVersion".into(),
                    old.get("apiVersion").cloned().unwrap_or(Value::Null),
                );
            }
        }
        if def.tracks_generation() && spec_changed(def, &old, &new) {
            let g = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        crate::defaults::fold_string_data(def, &mut new);
        match scope {
            WriteScope::Main => check_schema(def, &new, Some(&old))?,
            WriteScope::Status => check_status_schema(def, &new, &old)?,
            WriteScope::Internal => {}
        }
        // A write that changes nothing returns the stored object untouched.
        let mut cmp = new.clone();
        meta_mut(&mut cmp).insert(
            "resourceVersion".into(),
            old_meta
                .get("resourceVersion")
                .cloned()
                .unwrap_or(Value::Null),
        );
        if cmp == *old {
            return Ok(old);
        }
        let deleting = old_meta.contains_key("deletionTimestamp");
        if deleting && finalizers(&new).is_empty() {
            return Ok(self.remove(def, ns, name, Some(new)).unwrap_or(old));
        }
        check_size(&new)?;
        let obj = self.store_modified(def, ns, name, new, old);
        if &*def.key == "apiextensions.k8s.io/customresourcedefinitions" {
            self.refresh_crd(name);
        }
        let _ = now;
        Ok(obj)
    }

    /// Deletes an object as `DELETE` does: with finalizers it only gets a
    /// deletionTimestamp; otherwise it is removed and dependents are handled
    /// according to `propagation`.
    pub fn delete(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        propagation: Propagation,
        precondition_rv: Option<&str>,
        now: i64,
    ) -> Result<Obj> {
        let ns = if def.namespaced { ns } else { "" };
        let old = self
            .get(&def.key, ns, name)
            .cloned()
            .ok_or_else(|| Error::not_found(&def.group, &def.plural, name))?;
        if let Some(rv) = precondition_rv
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(Error::Conflict(format!(
                "Operation cannot be fulfilled on {} \"{name}\": the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                def.plural,
                meta_str(&old, "resourceVersion").unwrap_or_default()
            )));
        }
        if propagation == Propagation::Orphan {
            self.orphan_dependents(meta_str(&old, "uid").unwrap_or_default(), now);
        }
        let mut fins = finalizers(&old);
        let is_ns = &*def.key == "/namespaces";
        if propagation == Propagation::Foreground && !fins.iter().any(|f| f == FOREGROUND) {
            fins.push(FOREGROUND.into());
        }
        if fins.is_empty() && !is_ns {
            return self
                .remove(def, ns, name, None)
                .ok_or_else(|| Error::not_found(&def.group, &def.plural, name));
        }
        if deleting(&old) && fins.len() == finalizers(&old).len() {
            return Ok(old);
        }
        let mut new = (*old).clone();
        let meta = meta_mut(&mut new);
        if !meta.contains_key("deletionTimestamp") {
            meta.insert("deletionTimestamp".into(), json!(rfc3339(now)));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        meta.insert("finalizers".into(), json!(fins));
        if is_ns {
            set_ns_terminating(&mut new);
        }
        let obj = self.store_modified(def, ns, name, new, old);
        Ok(obj)
    }

    /// Removes an object for good and emits DELETED.
    pub fn remove(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        last: Option<Value>,
    ) -> Option<Obj> {
        let old = self
            .objects
            .get_mut(&def.key)?
            .remove(&(ns.to_string(), name.to_string()))?;
        if matches!(&*def.key, "/pods" | "/services")
            && let Some(uid) = meta_str(&old, "uid")
        {
            self.pod_ips.release(uid);
        }
        // A CRD's objects go before the CRD itself, as kube-apiserver's finalizer deletes
        // them: watchers see their DELETED events, then the CRD's.
        if &*def.key == "apiextensions.k8s.io/customresourcedefinitions" {
            self.crd_removed(&old);
        }
        let rv = self.next_rv();
        let mut last = last.unwrap_or_else(|| (*old).clone());
        meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
        let obj = Arc::new(last);
        self.emit(
            def.key.clone(),
            ns.to_string(),
            EventKind::Deleted,
            obj.clone(),
            Some(old),
        );
        Some(obj)
    }

    fn orphan_dependents(&mut self, uid: &str, now: i64) {
        if uid.is_empty() {
            return;
        }
        let dependents: Vec<(Arc<str>, Obj)> = self
            .all_objects()
            .filter(|(_, o)| owner_uids(o).any(|u| u == uid))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, o) in dependents {
            let Some(def) = self.def(&key) else { continue };
            let mut new = (*o).clone();
            if let Some(refs) = meta_mut(&mut new)
                .get_mut("ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            let ns = meta_str(&o, "namespace").unwrap_or_default().to_string();
            let name = meta_str(&o, "name").unwrap_or_default().to_string();
            let _ = self.update(&def, &ns, &name, new, WriteScope::Internal, now);
        }
    }

    fn crd_created(&mut self, name: &str, now: i64) {
        self.refresh_crd(name);
        let key = "apiextensions.k8s.io/customresourcedefinitions";
        let Some(def) = self.def(key) else { return };
        let Some(crd) = self.get(key, "", name).cloned() else {
            return;
        };
        let mut new = (*crd).clone();
        let names = crd
            .get("spec")
            .and_then(|s| s.get("names"))
            .cloned()
            .unwrap_or(json!({}));
        let ts = rfc3339(now);
        let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "lastTransitionTime": ts, "reason": reason, "message": msg});
        new["status"] = json!({
            "acceptedNames": names,
            "conditions": [
                cond("NamesAccepted", "NoConflicts", "no conflicts found"),
                cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            ],
            "storedVersions": crd.get("spec").and_then(|s| s.get("versions")).and_then(Value::as_array)
                .map(|vs| vs.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                    .filter_map(|v| v.get("name").cloned()).collect::<Vec<_>>()).unwrap_or_default(),
        });
        let _ = self.update(&def, "", name, new, WriteScope::Internal, now);
    }

    /// Re-derives the served resource of a CRD after it changed.
    fn refresh_crd(&mut self, name: &str) {
        let Some(crd) = self
            .get("apiextensions.k8s.io/customresourcedefinitions", "", name)
            .cloned()
        else {
            return;
        };
        let Some(def) = ResourceDef::from_crd(&crd) else {
            return;
        };
        if self.defs.iter().any(|d| d.key == def.key && !d.crd) {
            return;
        }
        self.defs.retain(|d| d.key != def.key);
        self.defs.push(Arc::new(def));
    }

    fn crd_removed(&mut self, crd: &Value) {
        let Some(def) = ResourceDef::from_crd(crd) else {
            return;
        };
        if !self.defs.iter().any(|d| d.key == def.key && d.crd) {
            return;
        }
        let names: Vec<(String, String)> = self
            .objects
            .get(&def.key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for (ns, n) in names {
            self.remove(&def, &ns, &n, None);
        }
        self.defs.retain(|d| d.key != def.key);
    }
}

/// The largest object etcd stores (its `--max-request-bytes` default, 1.5 MiB). A custom
/// resource is stored as its JSON; built-in kinds are stored as protobuf, which is smaller,
/// so for them the simulator is the stricter of the two.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Refuses an object larger than [`MAX_OBJECT_BYTES`] as kube-apiserver relays etcd's
/// refusal: `500 InternalError`, "etcdserver: request is too large".
fn check_size(obj: &Value) -> Result<()> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, obj)
        .map_err(|e| Error::Internal(format!("encoding the object: {e}")))?;
    if count.0 > MAX_OBJECT_BYTES {
        return Err(Error::Internal("etcdserver: request is too large".into()));
    }
    Ok(())
}

/// Finalizers of an object.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `obj` is being deleted (it has a `deletionTimestamp`).
pub(crate) fn deleting(obj: &Value) -> bool {
    obj.get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some()
}

/// UIDs in `ownerReferences`.
pub fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

fn set_ns_terminating(ns: &mut Value) {
    if let Some(root) = ns.as_object_mut() {
        root.insert("status".into(), json!({"phase": "Terminating"}));
    }
}

fn reset_status(def: &ResourceDef, obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    match def.kind.as_str() {
        "Node" => {}
        "Pod" => {
            root.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": "BestEffort"}),
            );
        }
        "Namespace" => {
            root.insert("status".into(), json!({"phase": "Active"}));
        }
        _ => {
            root.remove("status");
        }
    }
}

/// Did anything generation-relevant change? For kinds with a status
/// subresource that is everything but metadata and status; without one,
/// everything but metadata.
fn spec_changed(def: &ResourceDef, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Map<String, Value> {
        let mut m = v.as_object().cloned().unwrap_or_default();
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if def.status {
            m.remove("status");
        }
        m
    };
    strip(old) != strip(new)
}

/// Validates a custom resource against its CRD's structural schema, as the API server does
/// on every create and update (the status subresource included); on an update, errors about
/// values the update did not change are dropped (validation ratcheting).
fn check_schema(def: &ResourceDef, obj: &Value, old: Option<&Value>) -> Result<()> {
    let Some(schema) = def.schema.as_ref().filter(|_| def.crd) else {
        return Ok(());
    };
    let mut errors = crate::schema::validate(schema, obj);
    if let Some(old) = old {
        errors = crate::schema::ratchet(errors, old, obj);
    }
    if errors.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name").unwrap_or_default();
    Err(Error::invalid_fields(&def.group, &def.kind, name, errors))
}

/// The status subresource validates the status alone, against the status schema, as
/// `ValidateStatusUpdate` does (with ratcheting).
fn check_status_schema(def: &ResourceDef, obj: &Value, old: &Value) -> Result<()> {
    let Some(schema) = def
        .schema
        .as_ref()
        .filter(|_| def.crd)
        .and_then(|s| s.pointer("/properties/status"))
    else {
        return Ok(());
    };
    let Some(status) = obj.get("status") else {
        return Ok(());
    };
    let errors = crate::schema::ratchet(
        crate::schema::validate_at(schema, status, "status"),
        old,
        obj,
    );
    if errors.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name").unwrap_or_default();
    Err(Error::invalid_fields(&def.group, &def.kind, name, errors))
}

fn validate_name(def: &ResourceDef, name: &str) -> Result<()> {
    let ok = name.len() <= 253
        && name.chars().all(|c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || c == '-'
                || c == '.'
                || (def.crd && c == ':')
        })
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            def.kind
        )))
    }
}
