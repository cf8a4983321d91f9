//! Helpers shared by the kedge-sim fidelity tests.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kedge_sim::{Sim, SimConfig};

/// Output of one kubectl run.
#[derive(Debug)]
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A simulator with one cluster and its kubeconfig in a fresh temp directory.
pub async fn start(name: &str, config: SimConfig) -> (Sim, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "kedge-sim-test-{name}-{}-{}",
        std::process::id(),
        kedge_sim::util::random_u64() % 1_000_000
    ));
    let sim = Sim::start(&[name.to_string()], config, Some(&dir))
        .await
        .expect("start sim");
    let kc = dir.join(format!("{name}.kubeconfig"));
    (sim, kc)
}

/// Fast simulated cluster defaults for tests.
pub fn fast() -> SimConfig {
    SimConfig {
        pod_start_delay: Duration::from_millis(200),
        job_duration: Duration::from_millis(500),
        bookmark_interval: Duration::from_millis(300),
        ..SimConfig::default()
    }
}

/// Runs `/usr/bin/kubectl --kubeconfig KC ARGS...` with a 60 s limit.
pub async fn kubectl(kc: &Path, args: &[&str]) -> Out {
    let mut cmd = tokio::process::Command::new("/usr/bin/kubectl");
    cmd.arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("kubectl timed out")
        .expect("run kubectl");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs kubectl and panics with its output unless it succeeds.
pub async fn kubectl_ok(kc: &Path, args: &[&str]) -> String {
    let out = kubectl(kc, args).await;
    assert!(
        out.ok,
        "kubectl {args:?} failed:\n{}\n{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// Path of a fixture file.
pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
