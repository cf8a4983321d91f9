//! The `kedge-sim serve` command.

mod sim_support;
mod support;

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_kubeconfigs_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("kedge-sim-cli-{}", std::process::id()));
    let mut child = tokio::process::Command::new(support::bin("kedge-sim"))
        .args([
            "serve",
            "--clusters",
            "east,west",
            "--nodes",
            "2",
            "--node-cpu",
            "4",
            "--dir",
        ])
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
    assert!(ready, "no ready line");

    for name in ["east", "west"] {
        let kc = dir.join(format!("{name}.kubeconfig"));
        let out = sim_support::kubectl_ok(
            &kc,
            &[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.capacity.cpu}",
            ],
        )
        .await;
        assert_eq!(out, "4 4");
        let out = sim_support::kubectl_ok(&kc, &["config", "current-context"]).await;
        assert_eq!(out.trim(), name);
    }

    let pid = child.id().expect("pid");
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .expect("kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("wait");
    assert!(exit.success(), "{exit:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
