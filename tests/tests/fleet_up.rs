//! `kedge-sim up --headless`: the scripted fleet comes up with every agent connected, is
//! usable with the real kubectl, and stops cleanly. The demo's example on that fleet: its
//! DistributedScaledJob turns a queue into Jobs in the members, and its inference scene
//! scales simulated vLLM engines on the requests waiting on them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};
use kedge_sim::demo::{DSJ_NAME, INFERENCE_DSO_NAME, install_example};
use kedge_sim::engines::{self, Demand};
use kedge_sim::fleet::{Fleet, FleetConfig, HUB_CLUSTER};
use kedge_sim::link::LinkSpec;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::{bin, wait_for};
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
        .stderr(std::fs::File::create(dir.path().join("up.stderr")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let started = std::time::Instant::now();
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
    assert!(
        ready,
        "no `fleet ready` line after {:?}; output so far: {seen:#?}; stderr: {}; hub log: {}",
        started.elapsed(),
        std::fs::read_to_string(dir.path().join("up.stderr")).unwrap_or_default(),
        std::fs::read_to_string(dir.path().join("logs/hub.log")).unwrap_or_default()
    );
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
    // DIR/fleet.env, printed before `fleet ready`, names the same kubeconfigs and ops URL.
    let env_file = dir.path().join("fleet.env");
    assert!(
        seen.iter()
            .any(|l| l.starts_with("fleet file:") && l.contains(&env_file.display().to_string())),
        "no `fleet file:` line: {seen:#?}"
    );
    let env = fleet_env(&env_file);
    assert_eq!(env["OPS_URL"], ops);
    assert_eq!(env["KEDGE_HUB_OPS_URL"], ops);
    assert_eq!(env["MEMBERS"], "member-1,member-2");
    for (key, file) in [
        ("HUB_KUBECONFIG", "hub.kubeconfig"),
        ("MEMBER_1_KUBECONFIG", "member-1.kubeconfig"),
        ("MEMBER_2_KUBECONFIG", "member-2.kubeconfig"),
    ] {
        assert_eq!(
            std::path::Path::new(&env[key]),
            dir.path().join(file),
            "{key}"
        );
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
    // The members were enrolled with `kubectl kedge mc setup-member`: each has its
    // MemberCluster, its spent token is gone, and its agent keeps the identity it enrolled
    // for (CN = the member) in its own Secret.
    let kubectl = |kubeconfig: &str, args: &[&str]| {
        let mut command = std::process::Command::new("/usr/bin/kubectl");
        command
            .arg("--kubeconfig")
            .arg(dir.path().join(kubeconfig))
            .args(args);
        command.output().unwrap()
    };
    let listed = kubectl("hub.kubeconfig", &["get", "mc", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .collect::<Vec<_>>(),
        [
            "membercluster.kedge.dev/member-1",
            "membercluster.kedge.dev/member-2"
        ]
    );
    let tokens = kubectl(
        "hub.kubeconfig",
        &["get", "secrets", "-n", "kedge-system", "-o", "name"],
    );
    let tokens = String::from_utf8_lossy(&tokens.stdout).into_owned();
    assert!(
        !tokens.contains("kedge-bootstrap-"),
        "unspent tokens: {tokens}"
    );
    for member in ["member-1", "member-2"] {
        let identity = kubectl(
            &format!("{member}.kubeconfig"),
            &[
                "get",
                "secret",
                "kedge-agent-identity",
                "-n",
                "kedge-system",
                "-o",
                "name",
            ],
        );
        assert!(identity.status.success(), "{member} has no identity Secret");
    }

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
    assert!(
        !env_file.exists(),
        "fleet.env outlived the fleet it describes"
    );
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

/// What `kedge-sim up` installs for the demo, on the same fleet (three members, the real
/// hub and agents): a queue of 10 in the example's ConfigMap becomes 10 Jobs in the members,
/// split by the example's weights 2:3:5, and the DSJ's status counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_example_dsj_turns_a_queue_into_jobs_in_the_members() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(3, dir.path().to_owned()).unwrap();
    // Tests run from target/<profile>/deps; the binaries are one level up.
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    let fleet = Fleet::up(config).await.expect("fleet up");
    install_example(&fleet).await.unwrap();
    let client = |name: &str| fleet.sim.cluster(name).unwrap().client().unwrap();
    let dsjs: Api<DistributedScaledJob> = Api::namespaced(client(HUB_CLUSTER), "default");
    let limit = Duration::from_secs(60);

    // Until a member has reported its Jobs it gets none; wait for all three, as the demo's
    // script does by starting a few seconds in.
    wait_for(limit, "every member Ready for the example DSJ", || async {
        let status = dsjs.get(DSJ_NAME).await.ok()?.status?;
        let ready = |m: &str| {
            status
                .member_cluster_statuses
                .get(m)
                .is_some_and(|s| s.state.as_deref() == Some("Ready"))
        };
        ["member-1", "member-2", "member-3"]
            .into_iter()
            .all(ready)
            .then_some(())
    })
    .await;

    let queue = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"length": "10"}});
    Api::<ConfigMap>::namespaced(client(HUB_CLUSTER), "default")
        .patch(
            "work-queue",
            &PatchParams::apply("fleet-up-test").force(),
            &Patch::Apply(&queue),
        )
        .await
        .unwrap();
    let selector = format!("kedge.dev/distributedscaledjob={DSJ_NAME}");
    let counts = wait_for(limit, "10 Jobs in the members", || async {
        let mut counts = Vec::new();
        for member in fleet.members() {
            let jobs = Api::<Job>::namespaced(client(&member), "default")
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            counts.push(jobs.items.len());
        }
        (counts.iter().sum::<usize>() >= 10).then_some(counts)
    })
    .await;
    assert_eq!(counts, [2, 3, 5], "Jobs per member, weights 2:3:5");
    // The example's Jobs run for 15 s: the status counts all 10 running well before any
    // finishes.
    wait_for(
        limit,
        "the DSJ's status to count 10 running Jobs",
        || async {
            let status = dsjs.get(DSJ_NAME).await.ok()?.status?;
            (status.desired_jobs == 10 && status.running_jobs == 10).then_some(())
        },
    )
    .await;

    // The inference scene, through the agents as setup-member installs them (least
    // privilege) and the hub's scaler as `kedge-sim up` starts it: engines share the
    // requests waiting; the DSO keeps about 10 per engine (threshold 10, maxReplicaCount 12).
    //
    // It settles anywhere in the dead zone, not on one count: the HPA scales up only above
    // 10 × 1.1 per engine and down only below 10 × 0.5, and each member's sample is scraped
    // at its own moment. A member still reporting the share of fewer engines makes a step
    // overshoot (30 waiting: 1 → 5 engines, 6 each), and a stepwise scale-down can stop at
    // 2 engines with 5 each. Both are stable and right; an exact count was a flaky test.
    let demand = Demand::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let members = fleet.members();
    let serving = engines::serve(&fleet.sim, &members, demand.clone(), stop.clone());
    let dsos: Api<DistributedScaledObject> = Api::namespaced(client(HUB_CLUSTER), "default");
    // The engine counts the HPA holds for `waiting` requests: `waiting / n` in [5, 11].
    let dead_zone = |waiting: u32| {
        (1..=12).filter(move |n: &i32| {
            let per_engine = f64::from(waiting) / f64::from(*n);
            (5.0..=11.0).contains(&per_engine)
        })
    };
    assert_eq!(dead_zone(30).collect::<Vec<_>>(), [3, 4, 5, 6]);
    let counted = dsos.clone();
    let settled = move |waiting: u32| {
        let dsos = counted.clone();
        async move {
            let status = dsos.get(INFERENCE_DSO_NAME).await.ok()?.status?;
            let counted = status.pod_metrics.first()?.pods_counted;
            let engines = status.total_current_replicas;
            (counted == i64::from(engines) && dead_zone(waiting).any(|n| n == engines))
                .then_some(engines)
        }
    };
    // A step that does not come says what the fleet saw: the DSO's status, the child
    // ScaledObject's HPA, and the tail of every log.
    let logs = dir.path().join("logs");
    let step = |waiting: u32| {
        let (demand, settled, logs) = (demand.clone(), settled.clone(), logs.clone());
        let (fleet, dsos) = (&fleet, dsos.clone());
        async move {
            demand.set(waiting);
            let reached = tokio::time::timeout(limit, async {
                loop {
                    if let Some(engines) = settled(waiting).await {
                        return engines;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
            match reached {
                Ok(engines) => engines,
                Err(_) => {
                    let status = dsos
                        .get(INFERENCE_DSO_NAME)
                        .await
                        .ok()
                        .and_then(|d| d.status);
                    let hpas = fleet
                        .sim
                        .cluster(HUB_CLUSTER)
                        .unwrap()
                        .shared()
                        .store()
                        .list("/horizontalpodautoscalers", Some("default"))
                        .map(|h| h["status"].to_string())
                        .collect::<Vec<_>>();
                    panic!(
                        "timed out after {limit:?} waiting for the engines to settle for \
                         {waiting} requests waiting\nDSO status: {status:#?}\nHPA status: \
                         {hpas:?}\n{}",
                        log_tails(&logs)
                    );
                }
            }
        }
    };
    let scene = async {
        // 30 waiting on the one warm engine: more engines, 5 to 11 each (3 when every sample
        // is current).
        let up = step(30).await;
        assert!(up > 1, "scaled up from one engine");
        // 80 waiting: 8 to 12 engines.
        let more = step(80).await;
        assert!(more > up, "scaled up again: {up} → {more}");
        // 10 waiting, under the scale-down tolerance at that count: back to 1 or 2.
        let down = step(10).await;
        assert!(down < more, "scaled down: {more} → {down}");
        stop.cancel();
    };
    tokio::join!(serving, scene);
    fleet.shutdown().await;
}

/// `kedge-sim up --agent-namespaces default,shop`: the namespaces the agents act in exist in
/// every cluster before the members are enrolled, so enrollment (which grants the agent its
/// Role in each of them) succeeds and every agent connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_creates_the_agent_namespaces_in_every_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(2, dir.path().to_owned()).unwrap();
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    config.agent_namespaces = vec!["default".into(), "shop".into()];
    let fleet = Fleet::up(config).await.expect("fleet up");
    for cluster in [HUB_CLUSTER, "member-1", "member-2"] {
        let client = fleet.sim.cluster(cluster).unwrap().client().unwrap();
        let namespaces: Api<Namespace> = Api::all(client);
        assert!(
            namespaces.get_opt("shop").await.unwrap().is_some(),
            "no namespace shop in {cluster}"
        );
    }
    fleet.shutdown().await;
}

/// `DIR/fleet.env` as a map (its values are single words for a temporary directory).
fn fleet_env(path: &std::path::Path) -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(path).expect("fleet.env written before `fleet ready`");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `kedge-sim up` without `--headless`, as `make demo` runs it: every frame starts with the
/// header (kubeconfigs, ops URL, logs, fleet.env) and the tour's countdown, the commands it
/// offers work as printed, and an inference log line names the engines the table of the
/// same frame shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_header_names_the_fleet_and_its_commands_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin("kedge-sim"))
        .args(["up", "--members", "2", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Frames start with a clear-screen sequence; collect them until one shows the first
    // inference step's log line (the script runs it at 1 s).
    let mut frames: Vec<String> = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, first)) = line.split_once("\x1b[2J\x1b[H") {
                if frames
                    .last()
                    .is_some_and(|f| f.contains("] inference: 30 "))
                {
                    return true;
                }
                frames.push(format!("{first}\n"));
            } else if let Some(frame) = frames.last_mut() {
                frame.push_str(&line);
                frame.push('\n');
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(
        found,
        "no frame with the inference step; frames: {frames:#?}"
    );
    let first = &frames[0];
    let env = fleet_env(&dir.path().join("fleet.env"));
    for fact in [
        env["HUB_KUBECONFIG"].as_str(),
        &env["MEMBER_1_KUBECONFIG"],
        &env["MEMBER_2_KUBECONFIG"],
        &env["OPS_URL"],
        &env["LOGS_DIR"],
        &dir.path().join("fleet.env").display().to_string(),
        &env["DASHBOARD_URL"],
    ] {
        assert!(first.contains(fact), "the header lacks {fact}:\n{first}");
    }
    // The dashboard it runs shows the demo's members and workloads.
    let snapshot = dashboard_snapshot(&env["DASHBOARD_URL"]).await;
    let keys = |kind: &str| -> Vec<String> {
        snapshot["kinds"][kind]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v["key"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(keys("member"), ["member-1", "member-2"], "{snapshot}");
    assert_eq!(keys("dso"), ["default/nginx", "default/vllm"], "{snapshot}");
    assert_eq!(keys("dsj"), ["default/queue-worker"], "{snapshot}");
    assert!(first.contains("scene 1/5: "), "{first}");
    assert!(first.contains(" · the tour restarts in "), "{first}");

    // The commands the header offers, run as printed.
    let commands: Vec<&str> = first
        .lines()
        .skip_while(|l| !l.starts_with("try"))
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("try").trim())
        .collect();
    assert_eq!(commands.len(), 5, "{first}");
    for command in commands {
        let out = Command::new("sh")
            .args(["-c", command])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "`{command}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The log's engine count is the table's in the frame that wrote it.
    let frame = frames.last().unwrap();
    let logged = frame
        .split("] inference: 30 requests waiting on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the inference line names its engines");
    let shown = frame
        .lines()
        .find(|l| l.starts_with("dso/vllm"))
        .and_then(|l| l.rsplit("engines ").next())
        .expect("the inference section names its engines");
    assert_eq!(logged, shown.trim(), "{frame}");

    let pid = child.id().unwrap().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "kedge-sim up exit status {status:?}");
}

/// `GET /api/snapshot` of the dashboard at `url` (`http://127.0.0.1:PORT/`), as JSON.
async fn dashboard_snapshot(url: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let request =
        format!("GET /api/snapshot HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The last 30 lines of every log in `dir`, for a failure message.
fn log_tails(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(30)..];
        out.push_str(&format!(
            "--- {} (last {} lines)\n{}\n",
            entry.path().display(),
            tail.len(),
            tail.join("\n")
        ));
    }
    out
}

/// `FleetConfig::links` (`kedge-sim up --link`): a member's agent reaches the hub through a
/// link emulator, and its session lives on across NAT rebindings (QUIC migration on the
/// hub); a link for a member the fleet does not have is refused before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_a_link_emulator_keeps_its_session_across_rebinds() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(2, dir.path().to_owned()).unwrap();
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    config.links.insert("member-3".into(), LinkSpec::default());
    let refused = Fleet::up(config.clone()).await.expect_err("no member-3");
    assert!(
        refused.to_string().contains(
            "a link for member-3, which is not a member (the members are member-1, member-2)"
        ),
        "{refused}"
    );
    config.links.clear();
    let spec: LinkSpec = "rtt=40ms,rebind=500ms,seed=1".parse().unwrap();
    config.links.insert("member-1".into(), spec.clone());
    let fleet = Fleet::up(config).await.expect("fleet up");
    let link = fleet.link("member-1").expect("member-1's link");
    assert!(fleet.link("member-2").is_none());
    assert_eq!(link.spec(), spec);
    let session = |sessions: Vec<serde_json::Value>| {
        sessions
            .into_iter()
            .find(|s| s["member"] == "member-1")
            .map(|s| (s["state"].clone(), s["sessionId"].clone()))
    };
    let first = session(fleet.sessions().await.unwrap()).expect("member-1's session");
    assert_eq!(first.0, "Connected");
    wait_for(Duration::from_secs(30), "three rebinds", || async {
        (link.stats().rebinds >= 3).then_some(())
    })
    .await;
    // Heartbeats after the last rebind reached the hub from the new address.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        session(fleet.sessions().await.unwrap()),
        Some(first),
        "the same session, still connected"
    );
    let stats = link.stats();
    assert!(
        stats.to_hub.packets > 0 && stats.to_agent.packets > 0,
        "{stats:?}"
    );
    // One handshake: every rebind was a QUIC migration the hub counted, not a new session.
    let sessions = fleet.sessions().await.unwrap();
    let s = sessions.iter().find(|s| s["member"] == "member-1").unwrap();
    assert_eq!(s["sessions"], 1, "{s}");
    let migrations = s["link"]["migrations"].as_u64().unwrap();
    assert!(migrations >= 3, "{s}");
    let metrics = support::ops_get(
        support::HubPorts {
            quic: 0,
            ops: fleet.ops_url().rsplit(':').next().unwrap().parse().unwrap(),
        },
        "/metrics",
    )
    .await
    .unwrap();
    let value = |name: &str| -> u64 {
        let key = format!("{name}{{member=\"member-1\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in /metrics"))
    };
    assert_eq!(value("kedge_hub_member_sessions_total"), 1);
    assert!(value("kedge_hub_member_migrations_total") >= 3);
    fleet.shutdown().await;
}
