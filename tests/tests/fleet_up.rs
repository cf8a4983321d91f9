//! `kedge-sim up --headless`: the scripted fleet comes up with every agent connected, is
//! usable with the real kubectl, and stops cleanly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::bin;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_fleet_comes_up_connected_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin("kedge-sim"))
        .args([
            "up",
            "--headless",
            "--members",
            "2",
            "--heartbeat",
            "300ms",
            "--dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let ready = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = line.contains("fleet ready");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(ready, "no `fleet ready` line; output so far: {seen:#?}");
    let ops = seen
        .iter()
        .find_map(|l| l.split_whitespace().skip_while(|w| *w != "ops").nth(1))
        .expect("ops URL printed")
        .to_owned();

    for file in [
        "hub.kubeconfig",
        "member-1.kubeconfig",
        "member-2.kubeconfig",
    ] {
        assert!(dir.path().join(file).exists(), "{file} missing");
    }
    // The hub has kedge's CRDs; kubectl resolves the short name.
    let out = Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(dir.path().join("hub.kubeconfig"))
        .args(["get", "dso", "-A"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl get dso: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every member is connected, and only once ready was printed (checked before printing).
    let sessions = Command::new(bin("kubectl-kedge"))
        .args(["sessions", "-o", "json", "--hub", &ops])
        .output()
        .await
        .unwrap();
    let sessions: serde_json::Value = serde_json::from_slice(&sessions.stdout).unwrap();
    let states: Vec<(&str, &str)> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["member"].as_str().unwrap(), s["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![("member-1", "Connected"), ("member-2", "Connected")]
    );

    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "kedge-sim up exit status {status:?}");
    // The hub went down with it.
    let after = Command::new(bin("kubectl-kedge"))
        .args(["sessions", "--hub", &ops])
        .output()
        .await
        .unwrap();
    assert!(
        !after.status.success(),
        "the hub still answers after the fleet stopped"
    );
}
