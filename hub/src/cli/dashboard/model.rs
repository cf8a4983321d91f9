//! What the dashboard knows: the objects its watches deliver, cut down to what the pages
//! show, each workload's recent split, and what changed since the last push.
//!
//! Everything here is pure (no I/O): the watches call [`Model::apply`], [`Model::delete`]
//! and [`Model::relisted`]; the server takes [`Model::snapshot`] for a new page and
//! [`Model::take_delta`] for the pages already open.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// The kinds the dashboard watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `MemberCluster` (cluster-scoped).
    Member,
    /// `DistributedScaledObject`.
    Dso,
    /// `DistributedScaledJob`.
    Dsj,
    /// `events.k8s.io/v1` `Event` about a kedge object.
    Event,
}

impl Kind {
    /// Every kind, in the order the page lists access problems.
    pub const ALL: [Kind; 4] = [Kind::Member, Kind::Dso, Kind::Dsj, Kind::Event];

    /// The resource's plural, as RBAC and `kubectl` name it.
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Member => "memberclusters.kedge.dev",
            Kind::Dso => "distributedscaledobjects.kedge.dev",
            Kind::Dsj => "distributedscaledjobs.kedge.dev",
            Kind::Event => "events.events.k8s.io",
        }
    }
}

/// How much the dashboard keeps.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How far back each workload's split is kept.
    pub history: Duration,
    /// Samples kept per workload (the oldest go first).
    pub samples_per_workload: usize,
    /// Events kept per object (the oldest go first).
    pub events_per_object: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            history: Duration::from_secs(15 * 60),
            samples_per_workload: 2_000,
            events_per_object: 50,
        }
    }
}

/// One point of a workload's split: the total and, per member, `[desired, current]`
/// (a DSO's replicas; a DSJ's running and pending Jobs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    /// The fleet-wide total (a DSO's `totalTargetReplicas`, a DSJ's `desiredJobs`).
    pub total: Option<i64>,
    /// Per member.
    pub members: BTreeMap<String, [i64; 2]>,
}

/// The objects of one kind, changed or deleted since the last push.
#[derive(Debug, Default, Serialize)]
pub struct Changes {
    /// New or changed objects (their views).
    pub upsert: Vec<Box<RawValue>>,
    /// Keys of objects gone.
    pub delete: Vec<String>,
}

/// What changed since the last push.
#[derive(Debug, Default, Serialize)]
pub struct Delta {
    /// Per kind.
    pub kinds: BTreeMap<Kind, Changes>,
    /// New samples, each with its workload's key.
    pub samples: Vec<(String, Sample)>,
    /// Access problems per kind (an empty string: the kind reads again).
    pub errors: BTreeMap<Kind, String>,
    /// The server's clock, milliseconds since the Unix epoch.
    pub now: u64,
}

impl Delta {
    /// Whether there is nothing to push.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && self.samples.is_empty() && self.errors.is_empty()
    }
}

/// Everything the dashboard shows, for a page that just opened.
#[derive(Debug, Serialize)]
pub struct Snapshot<'a> {
    /// Per kind, every object's view.
    pub kinds: BTreeMap<Kind, Vec<&'a RawValue>>,
    /// Each workload's samples.
    pub history: BTreeMap<&'a str, &'a VecDeque<Sample>>,
    /// Access problems per kind.
    pub errors: &'a BTreeMap<Kind, String>,
    /// The server's clock, milliseconds since the Unix epoch.
    pub now: u64,
    /// The namespace the dashboard is limited to, if any.
    pub namespace: Option<&'a str>,
    /// Whether every watch has listed once.
    pub synced: bool,
}

/// The dashboard's state.
#[derive(Debug, Default)]
pub struct Model {
    limits: Limits,
    namespace: Option<String>,
    /// Each object's view, kept as its JSON text: a tenth of the memory of a
    /// `serde_json::Value`, and what the page is sent anyway.
    objects: BTreeMap<Kind, BTreeMap<String, Box<RawValue>>>,
    /// What each Event is about, by the Event's key.
    event_about: HashMap<String, String>,
    /// Event keys per regarded object, oldest first.
    events_of: HashMap<String, VecDeque<String>>,
    history: BTreeMap<String, VecDeque<Sample>>,
    errors: BTreeMap<Kind, String>,
    listed: BTreeSet<Kind>,
    pending: Delta,
}

impl Model {
    /// An empty model.
    pub fn new(limits: Limits, namespace: Option<String>) -> Self {
        Self {
            limits,
            namespace,
            ..Self::default()
        }
    }

    /// An object of `kind` was added or changed. `now` is milliseconds since the epoch.
    pub fn apply(&mut self, kind: Kind, object: &Value, now: u64) {
        if let Some(view) = view(kind, object) {
            self.apply_view(kind, view, now);
        }
    }

    /// [`Model::apply`] of an object's [`view`].
    fn apply_view(&mut self, kind: Kind, view: Value, now: u64) {
        let Some(key) = view.get("key").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        self.errors_cleared(kind);
        if kind == Kind::Event {
            self.keep_event(&key, &view);
        }
        if matches!(kind, Kind::Dso | Kind::Dsj) {
            self.sample(&key, &view, now);
        }
        // A view is plain JSON (strings, numbers, maps): it always serializes.
        let Ok(raw) = serde_json::value::to_raw_value(&view) else {
            return;
        };
        let objects = self.objects.entry(kind).or_default();
        if objects.get(&key).is_some_and(|old| old.get() == raw.get()) {
            return;
        }
        objects.insert(key, raw.clone());
        self.pending.kinds.entry(kind).or_default().upsert.push(raw);
    }

    /// An object of `kind` was deleted.
    pub fn delete(&mut self, kind: Kind, object: &Value) {
        if let Some(key) = view(kind, object)
            .as_ref()
            .and_then(|v| v.get("key"))
            .and_then(Value::as_str)
        {
            self.remove(kind, key);
        }
    }

    /// A watch listed `kind` afresh: `objects` is everything there is now.
    /// `views` are the objects' [`view`]s, which the watch makes as the list arrives (a
    /// large list is never held whole).
    pub fn relisted(&mut self, kind: Kind, views: Vec<Value>, now: u64) {
        let keep: BTreeSet<String> = views
            .iter()
            .filter_map(|v| v.get("key").and_then(Value::as_str).map(str::to_owned))
            .collect();
        let gone: Vec<String> = self
            .objects
            .get(&kind)
            .map(|m| m.keys().filter(|k| !keep.contains(*k)).cloned().collect())
            .unwrap_or_default();
        for key in gone {
            self.remove(kind, &key);
        }
        for view in views {
            self.apply_view(kind, view, now);
        }
        self.errors_cleared(kind);
        self.listed.insert(kind);
    }

    /// A watch of `kind` failed (forbidden, the CRD missing, the API unreachable); it
    /// retries by itself.
    pub fn failed(&mut self, kind: Kind, message: String) {
        if self.errors.get(&kind) != Some(&message) {
            self.errors.insert(kind, message.clone());
            self.pending.errors.insert(kind, message);
        }
    }

    /// Everything, for a page that just opened.
    pub fn snapshot(&self, now: u64) -> Snapshot<'_> {
        Snapshot {
            kinds: Kind::ALL
                .iter()
                .map(|k| {
                    (
                        *k,
                        self.objects
                            .get(k)
                            .map(|m| m.values().map(|raw| &**raw).collect())
                            .unwrap_or_default(),
                    )
                })
                .collect(),
            history: self.history.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            errors: &self.errors,
            now,
            namespace: self.namespace.as_deref(),
            synced: Kind::ALL
                .iter()
                .all(|k| self.listed.contains(k) || self.errors.contains_key(k)),
        }
    }

    /// What changed since the last call.
    pub fn take_delta(&mut self, now: u64) -> Delta {
        let mut delta = std::mem::take(&mut self.pending);
        delta.now = now;
        delta
    }

    /// Drops samples older than the history window (called now and then).
    pub fn prune(&mut self, now: u64) {
        let horizon =
            now.saturating_sub(u64::try_from(self.limits.history.as_millis()).unwrap_or(u64::MAX));
        for samples in self.history.values_mut() {
            // Keep the last sample before the horizon: it is the split at the window's start.
            while samples.len() > 1 && samples.get(1).is_some_and(|s| s.t <= horizon) {
                samples.pop_front();
            }
        }
    }

    /// How many objects of `kind` the model holds.
    pub fn count(&self, kind: Kind) -> usize {
        self.objects.get(&kind).map_or(0, BTreeMap::len)
    }

    fn errors_cleared(&mut self, kind: Kind) {
        if self.errors.remove(&kind).is_some() {
            self.pending.errors.insert(kind, String::new());
        }
    }

    fn remove(&mut self, kind: Kind, key: &str) {
        if self
            .objects
            .get_mut(&kind)
            .and_then(|m| m.remove(key))
            .is_none()
        {
            return;
        }
        if matches!(kind, Kind::Dso | Kind::Dsj) {
            self.history.remove(key);
        }
        if let Some(about) = self.event_about.remove(key).filter(|_| kind == Kind::Event)
            && let Some(keys) = self.events_of.get_mut(&about)
        {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.events_of.remove(&about);
            }
        }
        self.pending
            .kinds
            .entry(kind)
            .or_default()
            .delete
            .push(key.to_owned());
    }

    fn keep_event(&mut self, key: &str, view: &Value) {
        let Some(about) = view.get("about").and_then(Value::as_str) else {
            return;
        };
        let keys = self.events_of.entry(about.to_owned()).or_default();
        if keys.iter().any(|k| k == key) {
            return;
        }
        keys.push_back(key.to_owned());
        self.event_about.insert(key.to_owned(), about.to_owned());
        let mut dropped = Vec::new();
        while keys.len() > self.limits.events_per_object {
            dropped.extend(keys.pop_front());
        }
        for old in dropped {
            self.remove(Kind::Event, &old);
        }
    }

    fn sample(&mut self, key: &str, view: &Value, now: u64) {
        let sample = sample_of(view, now);
        let samples = self.history.entry(key.to_owned()).or_default();
        if samples
            .back()
            .is_some_and(|last| last.total == sample.total && last.members == sample.members)
        {
            return;
        }
        samples.push_back(sample.clone());
        while samples.len() > self.limits.samples_per_workload {
            samples.pop_front();
        }
        self.pending.samples.push((key.to_owned(), sample));
    }
}

/// The split a workload's view shows.
pub fn sample_of(view: &Value, now: u64) -> Sample {
    let kind = view.get("kind").and_then(Value::as_str).unwrap_or_default();
    let status = view.get("status").unwrap_or(&Value::Null);
    let int = |v: Option<&Value>| v.and_then(Value::as_i64);
    // A DSO's member: desired and current replicas; a DSJ's: running and pending Jobs.
    let (total, fields) = if kind == "dso" {
        (
            int(view.pointer("/spec/totalTargetReplicas")),
            ["desiredReplicas", "currentReplicas"],
        )
    } else {
        (
            int(status.get("desiredJobs")),
            ["runningJobs", "pendingJobs"],
        )
    };
    let pair = |m: &Value| fields.map(|f| int(m.get(f)).unwrap_or(0));
    let members = status
        .get("memberClusterStatuses")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(name, s)| (name.clone(), pair(s))).collect())
        .unwrap_or_default();
    Sample {
        t: now,
        total,
        members,
    }
}

/// What the page needs of an object, with a `key` unique within its kind; `None` for an
/// object without a name, or an Event about something other than kedge's objects.
pub fn view(kind: Kind, object: &Value) -> Option<Value> {
    let metadata = object.get("metadata")?;
    let name = metadata.get("name")?.as_str()?;
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let created = metadata
        .get("creationTimestamp")
        .cloned()
        .unwrap_or(Value::Null);
    match kind {
        Kind::Member => Some(json!({
            "key": name,
            "name": name,
            "created": created,
            "spec": pick(object.get("spec"), &["namespaces", "description"]),
            "status": object.get("status").cloned().unwrap_or(Value::Null),
        })),
        Kind::Dso | Kind::Dsj => {
            let mut spec = object.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(spec) = spec.as_object_mut() {
                // The pod template is the bulk of a DSJ and no page shows it.
                spec.remove("jobTargetRef");
            }
            let annotations = metadata.get("annotations").and_then(Value::as_object);
            let paused = annotations.and_then(|a| {
                a.get("autoscaling.keda.sh/paused-replicas")
                    .or_else(|| a.get("autoscaling.keda.sh/paused"))
                    .cloned()
            });
            Some(json!({
                "key": format!("{namespace}/{name}"),
                "kind": if kind == Kind::Dso { "dso" } else { "dsj" },
                "namespace": namespace,
                "name": name,
                "created": created,
                "generation": metadata.get("generation").cloned().unwrap_or(Value::Null),
                "paused": paused,
                "spec": spec,
                "status": object.get("status").cloned().unwrap_or(Value::Null),
            }))
        }
        Kind::Event => {
            let regarding = object.get("regarding")?;
            let api_version = regarding
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !api_version.starts_with("kedge.dev/") {
                return None;
            }
            let about_kind = match regarding.get("kind").and_then(Value::as_str)? {
                "DistributedScaledObject" => "dso",
                "DistributedScaledJob" => "dsj",
                "MemberCluster" => "member",
                _ => return None,
            };
            let about_name = regarding.get("name").and_then(Value::as_str)?;
            let about_namespace = regarding
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let about = if about_kind == "member" {
                format!("member/{about_name}")
            } else {
                format!("{about_kind}/{about_namespace}/{about_name}")
            };
            let time = object
                .get("eventTime")
                .filter(|t| !t.is_null())
                .or_else(|| object.get("deprecatedLastTimestamp"))
                .or_else(|| metadata.get("creationTimestamp"))
                .cloned()
                .unwrap_or(Value::Null);
            Some(json!({
                "key": format!("{namespace}/{name}"),
                "about": about,
                "type": object.get("type").cloned().unwrap_or(Value::Null),
                "reason": object.get("reason").cloned().unwrap_or(Value::Null),
                "note": object.get("note").cloned().unwrap_or(Value::Null),
                "time": time,
            }))
        }
    }
}

fn pick(object: Option<&Value>, fields: &[&str]) -> Value {
    let mut out = Map::new();
    if let Some(object) = object.and_then(Value::as_object) {
        for field in fields {
            if let Some(v) = object.get(*field) {
                out.insert((*field).to_owned(), v.clone());
            }
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DSO views of `objects`.
    fn views(objects: &[Value]) -> Vec<Value> {
        objects.iter().filter_map(|o| view(Kind::Dso, o)).collect()
    }

    /// A kept view as a value, to look into.
    fn parsed(raw: &RawValue) -> Value {
        serde_json::from_str(raw.get()).unwrap_or(Value::Null)
    }

    fn dso(name: &str, total: i64, split: &[(&str, i64, i64)]) -> Value {
        let members: Map<String, Value> = split
            .iter()
            .map(|(m, d, c)| {
                (
                    (*m).to_owned(),
                    json!({"desiredReplicas": d, "currentReplicas": c}),
                )
            })
            .collect();
        json!({
            "metadata": {"name": name, "namespace": "shop", "annotations": {"autoscaling.keda.sh/paused": "true"}},
            "spec": {"totalTargetReplicas": total, "scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}},
            "status": {"memberClusterStatuses": members},
        })
    }

    fn event(name: &str, kind: &str, about: &str, note: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "shop"},
            "regarding": {"apiVersion": "kedge.dev/v1alpha1", "kind": kind, "name": about, "namespace": "shop"},
            "reason": "Scaled", "type": "Normal", "note": note,
            "eventTime": "2026-11-26T10:00:00.000000Z",
        })
    }

    #[test]
    fn a_dso_view_keeps_what_the_page_shows_and_records_its_split() {
        let mut model = Model::new(Limits::default(), None);
        model.apply(
            Kind::Dso,
            &dso("web", 6, &[("a", 3, 2), ("b", 3, 3)]),
            1_000,
        );
        let delta = model.take_delta(1_001);
        let upsert = &delta.kinds[&Kind::Dso].upsert;
        assert_eq!(upsert.len(), 1);
        assert_eq!(parsed(&upsert[0])["key"], "shop/web");
        assert_eq!(parsed(&upsert[0])["paused"], "true");
        assert_eq!(delta.samples.len(), 1);
        assert_eq!(delta.samples[0].1.total, Some(6));
        assert_eq!(delta.samples[0].1.members["a"], [3, 2]);
        assert_eq!(delta.now, 1_001);

        // The same object again: nothing to push, no new sample.
        model.apply(
            Kind::Dso,
            &dso("web", 6, &[("a", 3, 2), ("b", 3, 3)]),
            2_000,
        );
        assert!(model.take_delta(2_001).is_empty());

        // A new split: one upsert, one sample.
        model.apply(
            Kind::Dso,
            &dso("web", 6, &[("a", 3, 3), ("b", 3, 3)]),
            3_000,
        );
        let delta = model.take_delta(3_001);
        assert_eq!(delta.kinds[&Kind::Dso].upsert.len(), 1);
        assert_eq!(delta.samples[0].1.members["a"], [3, 3]);
        assert_eq!(model.snapshot(3_002).history["shop/web"].len(), 2);
    }

    #[test]
    fn a_dsj_pod_template_is_left_out_and_its_jobs_are_the_split() {
        let dsj = json!({
            "metadata": {"name": "q", "namespace": "shop"},
            "spec": {"jobTargetRef": {"template": {"spec": {"containers": []}}}, "pollingInterval": 5},
            "status": {"desiredJobs": 4, "memberClusterStatuses": {"a": {"runningJobs": 3, "pendingJobs": 1}}},
        });
        let v = view(Kind::Dsj, &dsj).expect("a view");
        assert!(v["spec"].get("jobTargetRef").is_none());
        assert_eq!(v["spec"]["pollingInterval"], 5);
        let s = sample_of(&v, 7);
        assert_eq!((s.total, s.members["a"]), (Some(4), [3, 1]));
    }

    #[test]
    fn a_relist_deletes_what_is_gone_and_history_goes_with_it() {
        let mut model = Model::new(Limits::default(), None);
        model.relisted(Kind::Dso, views(&[dso("a", 1, &[]), dso("b", 2, &[])]), 1);
        model.take_delta(2);
        model.relisted(Kind::Dso, views(&[dso("b", 2, &[])]), 3);
        let delta = model.take_delta(4);
        assert_eq!(delta.kinds[&Kind::Dso].delete, vec!["shop/a".to_owned()]);
        assert!(delta.kinds[&Kind::Dso].upsert.is_empty());
        let snapshot = model.snapshot(5);
        assert!(!snapshot.history.contains_key("shop/a"));
        assert_eq!(snapshot.kinds[&Kind::Dso].len(), 1);
    }

    #[test]
    fn events_about_other_things_are_ignored_and_each_object_keeps_its_latest() {
        let limits = Limits {
            events_per_object: 2,
            ..Limits::default()
        };
        let mut model = Model::new(limits, None);
        let mut pod_event = event("p", "Pod", "x", "n");
        pod_event["regarding"]["apiVersion"] = json!("v1");
        model.apply(Kind::Event, &pod_event, 1);
        assert_eq!(model.count(Kind::Event), 0);
        for i in 0..3 {
            model.apply(
                Kind::Event,
                &event(
                    &format!("e{i}"),
                    "DistributedScaledObject",
                    "web",
                    "<b>x</b>",
                ),
                1,
            );
        }
        assert_eq!(model.count(Kind::Event), 2);
        let snapshot = model.snapshot(2);
        let events: Vec<Value> = snapshot.kinds[&Kind::Event]
            .iter()
            .map(|e| parsed(e))
            .collect();
        let keys: Vec<&str> = events.iter().filter_map(|e| e["key"].as_str()).collect();
        assert_eq!(keys, ["shop/e1", "shop/e2"]);
        // The note is data, passed as it is (the page puts it in text nodes).
        assert_eq!(events[0]["note"], "<b>x</b>");
        assert_eq!(events[0]["about"], "dso/shop/web");
        // Events that expire leave nothing behind.
        for i in 1..3 {
            let e = event(&format!("e{i}"), "DistributedScaledObject", "web", "");
            model.delete(Kind::Event, &e);
        }
        assert_eq!(model.count(Kind::Event), 0);
        assert!(model.events_of.is_empty());
        assert!(model.event_about.is_empty());
    }

    #[test]
    fn access_errors_are_pushed_once_and_cleared_when_the_kind_reads_again() {
        let mut model = Model::new(Limits::default(), Some("shop".into()));
        model.failed(Kind::Member, "forbidden".into());
        model.failed(Kind::Member, "forbidden".into());
        assert_eq!(model.take_delta(1).errors[&Kind::Member], "forbidden");
        assert!(model.take_delta(2).is_empty());
        let snapshot = model.snapshot(3);
        assert_eq!(snapshot.errors[&Kind::Member], "forbidden");
        assert!(!snapshot.synced);
        for kind in [Kind::Dso, Kind::Dsj, Kind::Event] {
            model.relisted(kind, Vec::new(), 4);
        }
        // A kind that cannot be read does not hold the page back.
        assert!(model.snapshot(4).synced);
        model.relisted(Kind::Member, Vec::new(), 5);
        assert_eq!(model.take_delta(6).errors[&Kind::Member], "");
    }

    #[test]
    fn prune_keeps_the_window_and_the_split_at_its_start() {
        let limits = Limits {
            history: Duration::from_secs(10),
            ..Limits::default()
        };
        let mut model = Model::new(limits, None);
        for (i, t) in [0_u64, 5_000, 12_000, 14_000].iter().enumerate() {
            let total = i64::try_from(i).unwrap_or(0);
            model.apply(Kind::Dso, &dso("web", total, &[]), *t);
        }
        model.prune(20_000);
        let snapshot = model.snapshot(20_000);
        let times: Vec<u64> = snapshot.history["shop/web"].iter().map(|s| s.t).collect();
        assert_eq!(times, [5_000, 12_000, 14_000]);
    }
}
