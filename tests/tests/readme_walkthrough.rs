//! The README's install walkthrough, run verbatim (issue 29): the fenced block after the
//! marker `<!-- walkthrough -->` is written to a script and run by bash with `set -euo
//! pipefail`, from a directory that looks like the repository root to it (`deploy/` and
//! `target/` link to this tree's), with no `KUBECONFIG` and no `helm` on `PATH`, as on a
//! fresh machine; a second run puts a `helm` on `PATH` (`scripts/helm_cli.py`: helm's
//! command line on the real Helm engine), so the block's Helm branch runs too. Each starts
//! kedge-sim, installs the hub and the agents (kedge-sim runs their images as real
//! processes), enrolls two edge clusters, and waits for a DSO and a DSJ to spread work over
//! them; then the test checks the outcome itself. A README edit that breaks a step fails
//! here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARKER: &str = "<!-- walkthrough -->";
/// The whole walkthrough, with room for a loaded machine.
const LIMIT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The fenced `sh` block that follows the marker.
fn walkthrough(readme: &str) -> Result<String, String> {
    let after = readme
        .split_once(MARKER)
        .ok_or_else(|| format!("README.md has no {MARKER}"))?
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .ok_or("the marker is not followed by a ```sh block")?;
    let end = body.find("\n```").ok_or("the ```sh block is not closed")?;
    Ok(body[..=end].to_owned())
}

#[test]
fn the_walkthrough_block_is_found_and_only_it() {
    let text =
        format!("intro\n{MARKER}\n\n```sh\necho one\necho two\n```\nafter\n```sh\nno\n```\n");
    assert_eq!(walkthrough(&text).unwrap(), "echo one\necho two\n");
    assert!(walkthrough("no marker").is_err());
    assert!(walkthrough(&format!("{MARKER}\ntext\n```sh\nx\n```")).is_err());
    assert!(walkthrough(&format!("{MARKER}\n```sh\nunclosed\n")).is_err());
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Ends everything the script started (its process group) when dropped: SIGTERM lets
/// kedge-sim stop the processes it runs; SIGKILL only to a group still there 10 s later.
/// The group is never signalled once it is gone, since its number may then be reused.
/// Signals go through `kill(2)` itself: procps' `kill -TERM -PGID` parses the group as
/// `-` and its first digit (it signalled process group 1, i.e. every process, here).
struct Group(rustix::process::Pid);

impl Group {
    fn signal(&self, sig: Option<rustix::process::Signal>) -> bool {
        match sig {
            Some(sig) => rustix::process::kill_process_group(self.0, sig).is_ok(),
            None => rustix::process::test_kill_process_group(self.0).is_ok(),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.signal(Some(rustix::process::Signal::TERM)) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            if !self.signal(None) {
                return;
            }
        }
        self.signal(Some(rustix::process::Signal::KILL));
    }
}

/// Every pod of each cluster and the last lines of kedge's own pods' logs, for a failure.
fn clusters_now(kubeconfig: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr)
            })
            .unwrap_or_default()
    };
    let mut out = String::new();
    for (ctx, deploy) in [
        ("mgmt", "kedge-hub"),
        ("edge-1", "kedge-agent"),
        ("edge-2", "kedge-agent"),
    ] {
        out += &format!(
            "--- {ctx}: pods\n{}",
            run(&["--context", ctx, "get", "pods", "-A", "-o", "wide"])
        );
        let logs = run(&[
            "--context",
            ctx,
            "-n",
            "kedge-system",
            "logs",
            &format!("deploy/{deploy}"),
            "--tail=15",
        ]);
        out += &format!("--- {ctx}: {deploy} log\n{logs}");
    }
    out
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn the_readme_walkthrough_runs_verbatim_without_helm() {
    run_walkthrough(false);
}

#[test]
fn the_readme_walkthrough_runs_verbatim_with_helm() {
    run_walkthrough(true);
}

/// Runs the walkthrough; `helm`: with a `helm` on `PATH` (`scripts/helm_cli.py`, helm's
/// command line for `install` on the real Helm engine), so it takes its Helm branch.
fn run_walkthrough(helm: bool) {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let block = walkthrough(&readme).expect("the walkthrough block");
    let dir = std::env::temp_dir().join(format!(
        "kedge-walkthrough-{}-{}",
        if helm { "helm" } else { "kubectl" },
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for link in ["deploy", "target"] {
        std::os::unix::fs::symlink(repo().join(link), dir.join(link)).unwrap();
    }
    let script = dir.join("walkthrough.sh");
    std::fs::write(&script, format!("set -euo pipefail\nset -x\n{block}")).unwrap();
    let output = dir.join("walkthrough.out");
    let log = std::fs::File::create(&output).unwrap();
    // A fresh machine's PATH: no kubectl-kedge until the block adds it, and helm only when
    // asked for.
    let mut path = "/usr/local/bin:/usr/bin:/bin".to_owned();
    if helm {
        let bin = dir.join("helm-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let wrapper = format!(
            "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
            support::helm::python().display(),
            repo().join("scripts/helm_cli.py").display()
        );
        std::fs::write(bin.join("helm"), wrapper).unwrap();
        std::fs::set_permissions(
            bin.join("helm"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        path = format!("{}:{path}", bin.display());
    }
    let mut child = Command::new("bash")
        .arg(&script)
        .current_dir(&dir)
        .env_clear()
        .env("PATH", &path)
        .env("HOME", &dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("run bash");
    let group = Group(
        rustix::process::Pid::from_raw(child.id() as i32).expect("a child's pid is positive"),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = || {
        format!(
            "--- walkthrough output (last 60 lines):\n{}\n--- kedge-sim (last 20 lines):\n{}\n{}",
            tail(&output, 60),
            tail(&dir.join("kedge-try.log"), 20),
            clusters_now(&dir.join("kedge-try/kubeconfig"))
        )
    };
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!(
            "the walkthrough failed ({s}) after {:?}\n{}",
            started.elapsed(),
            report()
        ),
        None => panic!("the walkthrough did not end within {LIMIT:?}\n{}", report()),
    }
    eprintln!(
        "the walkthrough ran in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // What the walkthrough promised, checked apart from its own waits.
    let kc = dir.join("kedge-try/kubeconfig");
    let members = kubectl(
        &kc,
        &[
            "--context",
            "mgmt",
            "get",
            "memberclusters",
            "-o",
            "jsonpath={.items[*].status.state}",
        ],
    );
    assert_eq!(members, "Ready Ready", "both members Ready\n{}", report());
    let hub_restarts = kubectl(
        &kc,
        &[
            "--context",
            "mgmt",
            "-n",
            "kedge-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=kedge-hub",
            "-o",
            "jsonpath={.items[*].status.containerStatuses[0].restartCount}",
        ],
    );
    assert_eq!(hub_restarts, "0", "one hub process, never restarted");
    let mut jobs = 0;
    for m in ["edge-1", "edge-2"] {
        let replicas = kubectl(
            &kc,
            &[
                "--context",
                m,
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.replicas}",
            ],
        );
        assert_eq!(replicas, "2", "{m}'s share of the DSO's 4");
        let names = kubectl(&kc, &["--context", m, "get", "jobs", "-o", "name"]);
        assert!(!names.is_empty(), "{m} runs Jobs of the DSJ");
        jobs += names.lines().count();
    }
    assert!(
        jobs >= 4,
        "the queue of 4 became at least 4 Jobs, got {jobs}"
    );
    // Installed the way the branch says: Helm keeps a release Secret per install.
    for (ctx, release) in [
        ("mgmt", "kedge-hub"),
        ("edge-1", "kedge-agent"),
        ("edge-2", "kedge-agent"),
    ] {
        let secrets = kubectl(
            &kc,
            &[
                "--context",
                ctx,
                "-n",
                "kedge-system",
                "get",
                "secrets",
                "-o",
                "name",
            ],
        );
        let helm_release = format!("secret/sh.helm.release.v1.{release}.v1");
        assert_eq!(
            secrets.lines().any(|l| l == helm_release),
            helm,
            "{ctx}: {helm_release} {} (helm on PATH: {helm})\n{secrets}",
            if helm { "missing" } else { "present" }
        );
    }
    drop(group);
    let _ = std::fs::remove_dir_all(&dir);
}
