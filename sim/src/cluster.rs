//! One virtual cluster's state (store, clock, faults, tokens, scalers) and its handle for
//! tests; [`crate::sim`] starts the clusters.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::keda::external::Scalers;
use crate::store::Store;

/// Simulated time: wall-clock time at start, then running at `speed` and
/// moved forward by [`crate::Sim::advance`].
#[derive(Debug)]
pub struct SimClock {
    inner: Mutex<ClockInner>,
}

#[derive(Debug, Clone, Copy)]
struct ClockInner {
    real_base: Instant,
    sim_base_ms: i64,
    speed: f64,
}

impl SimClock {
    /// A clock starting at the current wall-clock time.
    pub fn new(speed: f64) -> SimClock {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        SimClock {
            inner: Mutex::new(ClockInner {
                real_base: Instant::now(),
                sim_base_ms: now,
                speed: speed.max(0.0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClockInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Simulated milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        let c = *self.lock();
        c.sim_base_ms + (c.real_base.elapsed().as_secs_f64() * 1000.0 * c.speed) as i64
    }

    /// Current speed factor.
    pub fn speed(&self) -> f64 {
        self.lock().speed
    }

    /// Changes how fast simulated time runs relative to real time.
    pub fn set_speed(&self, speed: f64) {
        let now = self.now_ms();
        let mut c = self.lock();
        c.sim_base_ms = now;
        c.real_base = Instant::now();
        c.speed = speed.max(0.0);
    }

    /// Jumps simulated time forward.
    pub fn advance(&self, by: Duration) {
        self.lock().sim_base_ms += by.as_millis() as i64;
    }
}

/// Faults injected into one virtual cluster's API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Every request gets `503 ServiceUnavailable` and open watches end.
    pub unavailable: bool,
    /// Added before every response.
    pub latency: Duration,
    /// Fraction (0.0–1.0) of requests answered with `500 InternalError`.
    pub error_rate: f64,
    /// Open watches receive each change this long after it was stored, while reads see it
    /// at once: a kube-apiserver whose watch cache lags behind etcd, or a slow watch
    /// connection. Events stay in order.
    pub watch_lag: Duration,
}

/// Image repository (`ghcr.io/kedge-dev/kedge-hub`, no tag or digest) → local executable.
pub type ImageMap = std::collections::BTreeMap<String, PathBuf>;

/// Settings of the simulated clusters.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Ready nodes per cluster.
    pub nodes: usize,
    /// CPU capacity per node (quantity).
    pub node_cpu: String,
    /// Memory capacity per node (quantity).
    pub node_memory: String,
    /// Pod capacity per node.
    pub node_pods: u32,
    /// Simulated time from binding until a pod is Running and Ready.
    pub pod_start_delay: Duration,
    /// Simulated run time of Job pods (override per Job/Pod with [`ANN_RUN_SECONDS`]).
    pub job_duration: Duration,
    /// Whether Job pods fail by default (override with [`ANN_OUTCOME`]).
    pub job_pods_fail: bool,
    /// Events kept per cluster for watch resumption; older versions get 410.
    pub history: usize,
    /// Capacity of the live event channel; a watch lagging further is ended with 410.
    pub watch_channel: usize,
    /// Real time between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Initial speed of simulated time.
    pub speed: f64,
    /// First port; cluster `i` listens on `port_base + i` (0 = any free port).
    pub port_base: u16,
    /// Image repository (no tag or digest) → local executable: a pod whose every container
    /// image is here runs as real processes (see [`crate::processes`]). Empty by default:
    /// every pod is simulated.
    pub run_images: ImageMap,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            node_cpu: "8".into(),
            node_memory: "32Gi".into(),
            node_pods: 110,
            pod_start_delay: Duration::from_secs(1),
            job_duration: Duration::from_secs(5),
            job_pods_fail: false,
            history: 1000,
            watch_channel: 256,
            bookmark_interval: Duration::from_secs(10),
            speed: 1.0,
            port_base: 0,
            run_images: ImageMap::new(),
        }
    }
}

/// Pod or Job annotation: simulated run time of a Job pod in seconds.
pub const ANN_RUN_SECONDS: &str = "sim.kedge.dev/run-seconds";
/// Pod or Job annotation: `succeed` or `fail`.
pub const ANN_OUTCOME: &str = "sim.kedge.dev/outcome";

/// State shared by one cluster's server, watches and controllers.
#[derive(Debug)]
pub struct ClusterShared {
    /// Cluster name.
    pub name: String,
    /// Listening address.
    pub addr: SocketAddr,
    /// Object storage.
    pub store: Mutex<Store>,
    /// Shared simulated clock.
    pub clock: Arc<SimClock>,
    /// Settings.
    pub config: SimConfig,
    faults: Mutex<Faults>,
    /// Metric values set by tests: (namespace, ScaledObject, trigger name/index/metric name) → value.
    pub metrics: Mutex<HashMap<(String, String, String), f64>>,
    /// Wakes the controllers.
    pub wake: Notify,
    watch_cancel: Mutex<CancellationToken>,
    shutdown: CancellationToken,
    tokens: Mutex<HashMap<String, crate::rbac::UserInfo>>,
    /// Resource requests served, by `verb resource[/subresource]` (see [`Cluster::requests`]).
    pub(crate) requests: Mutex<HashMap<String, u64>>,
    /// KEDA's external scalers: targets, last answers, call counts, gRPC channels.
    pub scalers: Scalers,
    /// `LoadBalancer` Services' frontends and endpoints ([`crate::services`]).
    pub load_balancers: crate::services::published::LoadBalancers,
    /// Where process pods keep their files (`NS/POD/...`); `None` without mapped images.
    pub(crate) pods_dir: Option<PathBuf>,
}

impl ClusterShared {
    /// A cluster's state with no faults, metrics, tokens or scalers yet; `shutdown` is the
    /// simulator's, and open watches end on a child of it.
    pub(crate) fn new(
        name: String,
        addr: SocketAddr,
        store: Store,
        clock: Arc<SimClock>,
        config: SimConfig,
        shutdown: CancellationToken,
        pods_dir: Option<PathBuf>,
    ) -> ClusterShared {
        ClusterShared {
            name,
            addr,
            store: Mutex::new(store),
            clock,
            config,
            faults: Mutex::new(Faults::default()),
            metrics: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            watch_cancel: Mutex::new(shutdown.child_token()),
            shutdown,
            tokens: Mutex::new(HashMap::new()),
            requests: Mutex::new(HashMap::new()),
            scalers: Scalers::default(),
            load_balancers: crate::services::published::LoadBalancers::default(),
            pods_dir,
        }
    }

    /// The user a bearer token authenticates as.
    pub fn user_for_token(&self, token: &str) -> Option<crate::rbac::UserInfo> {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }

    /// Issues a new random bearer token for `user`.
    pub fn issue_token(&self, user: crate::rbac::UserInfo) -> String {
        let token = format!(
            "kedge-sim.{:016x}{:016x}",
            crate::util::random_u64(),
            crate::util::random_u64()
        );
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), user);
        token
    }

    /// Locks the store (a poisoned lock is recovered: the store stays consistent per operation).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current faults.
    pub fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Token cancelled when open watches must end (unavailability, shutdown).
    pub fn watch_token(&self) -> CancellationToken {
        self.watch_cancel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Cancelled when the whole simulator stops.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Simulated now.
    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// Kubeconfig YAML for cluster `name` at `url` with a default `namespace`, authenticating
/// with `token` (none: no credentials, which the simulator serves as admin).
pub(crate) fn kubeconfig_yaml(
    name: &str,
    url: &str,
    namespace: &str,
    token: Option<&str>,
) -> String {
    kubeconfig_of(&[(name, url)], namespace, token)
}

/// Kubeconfig YAML with a cluster, a user and a context named after each of `clusters`
/// (`(name, url)`), the first context current; see [`kubeconfig_yaml`].
pub(crate) fn kubeconfig_of(
    clusters: &[(&str, &str)],
    namespace: &str,
    token: Option<&str>,
) -> String {
    let user = match token {
        Some(t) => format!("\n    token: {t}"),
        None => " {}".to_string(),
    };
    let (mut cs, mut ctxs, mut users) = (String::new(), String::new(), String::new());
    for (name, url) in clusters {
        cs.push_str(&format!("- name: {name}\n  cluster:\n    server: {url}\n"));
        ctxs.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n    namespace: {namespace}\n"
        ));
        users.push_str(&format!("- name: {name}\n  user:{user}\n"));
    }
    let current = clusters.first().map_or("", |c| c.0);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{cs}contexts:\n{ctxs}current-context: {current}\nusers:\n{users}preferences: {{}}\n"
    )
}

/// Handle to one virtual cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    inner: Arc<ClusterShared>,
    kubeconfig: Option<PathBuf>,
}

impl Cluster {
    /// A handle on a cluster's state; `kubeconfig` is where its kubeconfig is written.
    pub(crate) fn new(inner: Arc<ClusterShared>, kubeconfig: Option<PathBuf>) -> Cluster {
        Cluster { inner, kubeconfig }
    }

    /// Name of the cluster.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// Path of the kubeconfig written for this cluster, if a directory was given.
    pub fn kubeconfig_path(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }

    /// Kubeconfig YAML for this cluster (namespace `default`, no credentials).
    pub fn kubeconfig(&self) -> String {
        kubeconfig_yaml(&self.inner.name, &self.url(), "default", None)
    }

    /// kube client configuration for this cluster (default namespace `default`).
    ///
    /// Note that kube retries 429/503/504 up to 15 times with exponential
    /// backoff by default; set `default_retry = false` to see injected 503s at once.
    pub fn kube_config(&self) -> Result<kube::Config> {
        let uri: axum::http::Uri = self
            .url()
            .parse()
            .map_err(|e| Error::Internal(format!("cluster url: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        Ok(config)
    }

    /// A kube client for this cluster (default namespace `default`).
    pub fn client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// Issues a bearer token for a ServiceAccount: requests with it are
    /// authorized by the cluster's RBAC objects (the ServiceAccount need not exist).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.inner
            .issue_token(crate::rbac::UserInfo::service_account(namespace, name))
    }

    /// Issues a bearer token for a user in groups (`system:masters` is admin).
    pub fn user_token(&self, name: &str, groups: &[&str]) -> String {
        self.inner
            .issue_token(crate::rbac::UserInfo::user(name, groups))
    }

    /// Kubeconfig YAML that authenticates with `token`.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        kubeconfig_yaml(&self.inner.name, &self.url(), "default", Some(token))
    }

    /// A kube client that authenticates with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_with_token(token))
            .map_err(|e| Error::Internal(format!("kubeconfig: {e}")))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Internal(format!("kubeconfig: {e}")))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Sets a KEDA trigger value for a ScaledObject. `trigger` is the trigger's
    /// `name`, its index (`"0"`) or its metric name (`"s0-..."`).
    pub fn set_metric(&self, namespace: &str, scaled_object: &str, trigger: &str, value: f64) {
        self.inner
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                (namespace.into(), scaled_object.into(), trigger.into()),
                value,
            );
        self.inner.wake.notify_one();
    }

    /// Replaces the injected faults. Making the API unavailable ends open watches.
    pub fn set_faults(&self, faults: Faults) {
        if faults.unavailable {
            let mut tok = self
                .inner
                .watch_cancel
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            tok.cancel();
            *tok = self.inner.shutdown.child_token();
        }
        *self.inner.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// Current faults.
    pub fn faults(&self) -> Faults {
        self.inner.faults()
    }

    /// How many resource requests the cluster has served for `what`: a verb and a resource,
    /// e.g. `"get deployments/scale"`, `"watch pods"` (tests count an agent's API calls).
    pub fn requests(&self, what: &str) -> u64 {
        let requests = self
            .inner
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        requests.get(what).copied().unwrap_or(0)
    }

    /// How many calls the KEDA emulation made to external scalers (`external` triggers):
    /// `method` is `GetMetricSpec`, `GetMetrics` or `IsActive`; `outcome` is `Ok` or the gRPC
    /// status code's name as tonic spells it (`Unavailable`, `DeadlineExceeded`, ...).
    pub fn scaler_calls(&self, method: &str, outcome: &str) -> u64 {
        self.inner.scalers.calls(method, outcome)
    }

    /// Reads an object straight from the store (`api_version` like `apps/v1`); an Event comes
    /// in the shape of the Events API `api_version` names.
    pub fn object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let store = self.inner.store();
        let def = store.def_for_kind(api_version, kind)?;
        let ns = if def.namespaced { namespace } else { "" };
        let obj = store.get(&def.key, ns, name)?;
        Some(crate::events::converted(&def, api_version, obj).unwrap_or_else(|| (**obj).clone()))
    }

    /// Creates or replaces an object straight in the store, bypassing the API
    /// (and its faults). Status is kept as given.
    pub fn put_object(&self, obj: Value) -> Result<Value> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let now = self.inner.now();
        let mut store = self.inner.store();
        let def = store
            .def_for_kind(api_version, kind)
            .ok_or_else(|| Error::NotFound(format!("no resource for {api_version} {kind}")))?;
        let ns = crate::util::meta_str(&obj, "namespace")
            .unwrap_or("default")
            .to_string();
        let name = crate::util::meta_str(&obj, "name")
            .unwrap_or_default()
            .to_string();
        let ns = if def.namespaced { ns } else { String::new() };
        let out = if store.get(&def.key, &ns, &name).is_some() {
            let mut obj = obj;
            crate::util::meta_mut(&mut obj).remove("resourceVersion");
            store.update(
                &def,
                &ns,
                &name,
                obj,
                crate::store::WriteScope::Internal,
                now,
            )?
        } else {
            let mut obj = obj;
            if def.namespaced {
                crate::util::meta_mut(&mut obj).insert("namespace".into(), json!(ns));
            }
            store.create_internal(&def.key, obj, now)?
        };
        drop(store);
        self.inner.wake.notify_one();
        Ok((*out).clone())
    }

    /// Shared state (for the server and controllers).
    pub fn shared(&self) -> &Arc<ClusterShared> {
        &self.inner
    }
}
