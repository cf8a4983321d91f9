//! The running simulator: boots each virtual cluster (its store with nodes, HTTP server,
//! controllers and external-scaler calls) and moves the shared clock.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, ClusterShared, SimClock, SimConfig};
use crate::error::Result;
use crate::store::Store;

/// Where process pods keep their files: `DIR/pods`, or without `DIR` a temporary directory
/// (also returned second, to be removed at shutdown); `None` without mapped images.
fn pods_root(config: &SimConfig, dir: Option<&Path>) -> (Option<PathBuf>, Option<PathBuf>) {
    match (config.run_images.is_empty(), dir) {
        (true, _) => (None, None),
        // Absolute: a process runs in its own directory and finds its files from there.
        (false, Some(d)) => {
            let pods = d.join("pods");
            (Some(std::path::absolute(&pods).unwrap_or(pods)), None)
        }
        (false, None) => {
            let t = std::env::temp_dir().join(format!(
                "kedge-sim-pods-{}-{:08x}",
                std::process::id(),
                crate::util::random_u64() as u32
            ));
            (Some(t.clone()), Some(t))
        }
    }
}

/// A running simulator: many virtual clusters in one process.
#[derive(Debug)]
pub struct Sim {
    clock: Arc<SimClock>,
    clusters: Vec<Cluster>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// A temporary directory of process pods' files, removed at shutdown.
    temp_pods: Option<PathBuf>,
}

impl Sim {
    /// Starts one virtual cluster per name; writes `DIR/NAME.kubeconfig` when `dir` is given.
    pub async fn start(names: &[String], config: SimConfig, dir: Option<&Path>) -> Result<Sim> {
        let clock = Arc::new(SimClock::new(config.speed));
        let shutdown = CancellationToken::new();
        if let Some(d) = dir {
            tokio::fs::create_dir_all(d).await?;
        }
        let (pods_root, temp_pods) = pods_root(&config, dir);
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
            let pods_dir = pods_root.as_ref().map(|r| r.join(name));
            let shared = Arc::new(ClusterShared::new(
                name.clone(),
                addr,
                store,
                clock.clone(),
                config.clone(),
                shutdown.clone(),
                pods_dir.clone(),
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
            if let Some(pods) = pods_dir {
                tasks.push(tokio::spawn(crate::processes::run(shared.clone(), pods)));
            }
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
            temp_pods,
        };
        if let Some(d) = dir {
            tokio::fs::write(d.join("kubeconfig"), sim.kubeconfig()).await?;
        }
        Ok(sim)
    }

    /// One kubeconfig for every cluster: a context per cluster, named after it, the first
    /// one current (`DIR/kubeconfig` when started with a directory).
    pub fn kubeconfig(&self) -> String {
        let urls: Vec<(String, String)> = self
            .clusters
            .iter()
            .map(|c| (c.name().to_owned(), c.url()))
            .collect();
        let pairs: Vec<(&str, &str)> = urls.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
        crate::cluster::kubeconfig_of(&pairs, "default", None)
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

    /// Stops every server, watch, controller and process, and waits for them.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        if let Some(t) = self.temp_pods.take() {
            let _ = tokio::fs::remove_dir_all(t).await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.temp_pods.take() {
            let _ = std::fs::remove_dir_all(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_pods_keep_their_files_under_an_absolute_path() {
        let mut config = SimConfig::default();
        assert_eq!(
            pods_root(&config, Some(Path::new("rel"))),
            (None, None),
            "no images mapped"
        );
        config
            .run_images
            .insert("example.com/x".into(), PathBuf::from("/bin/sh"));
        let (pods, temp) = pods_root(&config, Some(Path::new("rel/dir")));
        let pods = pods.expect("a pods directory");
        assert!(pods.is_absolute(), "{}", pods.display());
        assert!(pods.ends_with("rel/dir/pods"));
        assert_eq!(temp, None, "the given directory is kept");
        let (pods, temp) = pods_root(&config, None);
        assert!(pods.is_some_and(|p| p.is_absolute()));
        assert!(temp.is_some(), "a temp directory is removed at shutdown");
    }
}
