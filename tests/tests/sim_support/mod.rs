//! Helpers shared by the kedge-sim fidelity tests.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kedge_sim::{Sim, SimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};

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

/// A `kedge-sim serve` process and its directory, both gone when dropped.
pub struct Serve {
    child: tokio::process::Child,
    dir: PathBuf,
}

impl Serve {
    /// Runs `KEDGE_SIM serve ARGS --dir DIR` (a fresh temp directory) until it says it is
    /// ready.
    pub async fn start(kedge_sim: &Path, args: &[&str]) -> Serve {
        let dir = std::env::temp_dir().join(format!(
            "kedge-sim-serve-{}-{}",
            std::process::id(),
            kedge_sim::util::random_u64() % 1_000_000
        ));
        let mut child = tokio::process::Command::new(kedge_sim)
            .arg("serve")
            .args(args)
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn kedge-sim");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("kedge-sim ready") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        assert!(ready, "no ready line from kedge-sim serve");
        Serve { child, dir }
    }

    /// Where it writes its kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `DIR/CLUSTER.kubeconfig`.
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        self.dir.join(format!("{cluster}.kubeconfig"))
    }

    /// SIGTERM; asserts that it exits with success within 15 s.
    pub async fn stop(mut self) {
        let pid = self.child.id().expect("pid");
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        let exit = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("kedge-sim exits after SIGTERM")
            .expect("wait");
        assert!(exit.success(), "{exit:?}");
    }
}

impl Drop for Serve {
    /// A failed test still stops kedge-sim with SIGTERM, so that it stops its processes (a
    /// SIGKILL would leave them running).
    fn drop(&mut self) {
        if let (Ok(None), Some(pid)) = (self.child.try_wait(), self.child.id()) {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            let start = std::time::Instant::now();
            while matches!(self.child.try_wait(), Ok(None))
                && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
