//! The Rust API: a `Sim` with a mapped image runs its pods as processes, keeps their files in
//! a temporary directory without `dir`, and stops the processes and removes the directory
//! when it shuts down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kedge_sim::{Cluster, Sim, SimConfig};
use serde_json::{Value, json};

fn alive(pid: u32) -> bool {
    // A zombie has exited: only its entry is left until its parent reaps it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// The pod's container status once it is running.
async fn running(c: &Cluster, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pod = c.object("v1", "Pod", "default", name);
        let status = pod
            .as_ref()
            .map(|p| p["status"]["containerStatuses"][0].clone())
            .unwrap_or_default();
        if status["state"]["running"].is_object() {
            return status;
        }
        assert!(Instant::now() < deadline, "{name} not running: {pod:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_processes_and_removes_their_temporary_directory() {
    let config = SimConfig {
        pod_start_delay: Duration::from_millis(10),
        run_images: [("test.kedge.dev/sh".to_string(), PathBuf::from("/bin/sh"))].into(),
        ..SimConfig::default()
    };
    let sim = Sim::start(&["a".to_string()], config, None).await.unwrap();
    let c = &sim.clusters()[0];
    for (name, image) in [("proc", "test.kedge.dev/sh:1"), ("sim", "nginx:1")] {
        c.put_object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": image,
                "args": ["-c", "sleep 300 & sleep 300; wait"]}]},
        }))
        .unwrap();
    }
    let status = running(c, "proc").await;
    let pid: u32 = status["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("kedge-sim://"))
        .and_then(|p| p.parse().ok())
        .expect("containerID kedge-sim://PID");
    assert!(alive(pid));
    let simulated = running(c, "sim").await;
    assert_eq!(
        simulated["containerID"], "sim://0",
        "an unmapped image stays simulated"
    );
    let dirs = || {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("kedge-sim-pods-{}-", std::process::id())))
            .count()
    };
    assert_eq!(dirs(), 1, "the pods' files are in a temporary directory");
    sim.shutdown().await;
    assert!(!alive(pid), "the process stopped with the Sim");
    assert_eq!(dirs(), 0, "the temporary directory is gone");
}
