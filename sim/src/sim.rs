//! The running simulator: boots each virtual cluster (its store with nodes, HTTP server,
//! controllers and external-scaler calls) and moves the shared clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, ClusterShared, SimClock, SimConfig};
use crate::error::Result;
use crate::store::Store;

/// A running simulator: many virtual clusters in one process.
#[derive(Debug)]
pub struct Sim {
    clock: Arc<SimClock>,
    clusters: Vec<Cluster>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Sim {
    /// Starts one virtual cluster per name; writes `DIR/NAME.kubeconfig` when `dir` is given.
    pub async fn start(names: &[String], config: SimConfig, dir: Option<&Path>) -> Result<Sim> {
        let clock = Arc::new(SimClock::new(config.speed));
        let shutdown = CancellationToken::new();
        if let Some(d) = dir {
            tokio::fs::create_dir_all(d).await?;
        }
        let mut clusters = Vec::with_capacity(names.len());
        let mut tasks = Vec::with_capacity(names.len() * 2);
        for (i, name) in names.iter().enumerate() {
            let port = if config.port_base == 0 {
                0
            } else {
                config.port_base.saturating_add(i as u16)
            };
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
            let addr = listener.local_addr()?;
            let now = clock.now_ms();
            let mut store = Store::new(config.history, config.watch_channel, now);
            crate::controllers::add_nodes(&mut store, &config, now);
            let shared = Arc::new(ClusterShared::new(
                name.clone(),
                addr,
                store,
                clock.clone(),
                config.clone(),
                shutdown.clone(),
            ));
            let router = crate::api::router(shared.clone());
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let serve = axum::serve(listener, router)
                    .with_graceful_shutdown(async move { stop.cancelled().await });
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "cluster server ended");
                }
            }));
            tasks.push(tokio::spawn(crate::controllers::run(shared.clone())));
            tasks.push(tokio::spawn(crate::keda::grpc::run(shared.clone())));
            tasks.push(tokio::spawn(crate::services::run(shared.clone())));
            let kubeconfig = dir.map(|d| d.join(format!("{name}.kubeconfig")));
            let cluster = Cluster::new(shared, kubeconfig.clone());
            if let Some(path) = kubeconfig {
                tokio::fs::write(&path, cluster.kubeconfig()).await?;
            }
            clusters.push(cluster);
        }
        let sim = Sim {
            clock,
            clusters,
            shutdown,
            tasks,
        };
        if let Some(d) = dir {
            tokio::fs::write(d.join("kubeconfig"), sim.kubeconfig()).await?;
        }
        Ok(sim)
    }

    /// One kubeconfig for every cluster: a context per cluster, named after it, the first
    /// one current (`DIR/kubeconfig` when started with a directory).
    pub fn kubeconfig(&self) -> String {
        let mut clusters = String::new();
        let mut contexts = String::new();
        let mut users = String::new();
        for c in &self.clusters {
            let n = c.name();
            clusters.push_str(&format!(
                "- name: {n}\n  cluster:\n    server: {}\n",
                c.url()
            ));
            contexts.push_str(&format!(
                "- name: {n}\n  context:\n    cluster: {n}\n    user: {n}\n    namespace: default\n"
            ));
            users.push_str(&format!("- name: {n}\n  user: {{}}\n"));
        }
        let current = self.clusters.first().map_or("", |c| c.name());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{contexts}current-context: {current}\nusers:\n{users}preferences: {{}}\n"
        )
    }

    /// Starts `n` clusters named `cluster-0` … `cluster-{n-1}` without kubeconfig files.
    pub async fn start_n(n: usize, config: SimConfig) -> Result<Sim> {
        let names: Vec<String> = (0..n).map(|i| format!("cluster-{i}")).collect();
        Sim::start(&names, config, None).await
    }

    /// All clusters in start order.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// A cluster by name.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name() == name)
    }

    /// Simulated milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Moves simulated time forward and lets controllers react.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.wake_all();
    }

    /// Runs simulated time `speed` times faster than real time.
    pub fn set_speed(&self, speed: f64) {
        self.clock.set_speed(speed);
        self.wake_all();
    }

    fn wake_all(&self) {
        for c in &self.clusters {
            c.shared().wake.notify_one();
            c.shared().scalers.clock_moved();
        }
    }

    /// Stops every server, watch and controller, and waits for them.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
