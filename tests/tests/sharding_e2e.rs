//! Sharded hub replicas (`--sharding`) end to end: three real hubs on one simulated hub
//! cluster with the hub CA in its Secret, three real agents, each dialling a different
//! replica first. The Lease holder decides for every object; the other two hold their
//! agents' connections and relay the sessions to it. A DSO and a DSJ spread over the members;
//! then a replica that relays is killed (its agent moves to another replica), and then the
//! active one is killed (a relaying replica takes the Lease, the others relay to it). No
//! member's count drops and no Job is created twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use support::dso::*;
use support::*;

const THREE: [&str; 3] = ["member-1", "member-2", "member-3"];

/// Longest wait for one step: a takeover waits out the 2 s Lease, and the agents' reconnects.
const STEP: Duration = Duration::from_secs(30);

fn members(weights: [u32; 3]) -> String {
    let mut yaml = "  memberClusters:\n".to_owned();
    for (member, weight) in THREE.iter().zip(weights) {
        yaml.push_str(&format!("  - {{name: {member}, weight: {weight}}}\n"));
    }
    yaml.trim_end().to_owned()
}

/// A hub replica with `--sharding`, its certificates issued from the CA Secret.
fn replica(fleet: &Fleet, ports: HubPorts, log: &str) -> Proc {
    let args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{}", ports.quic),
        "--ops-listen",
        &format!("127.0.0.1:{}", ports.ops),
        "--kubeconfig",
        &fleet.kubeconfig("hub").display().to_string(),
        "--namespace",
        "kedge-system",
        "--lease-namespace",
        "kedge-system",
        "--lease-duration",
        "2s",
        "--heartbeat-interval",
        HEARTBEAT,
        "--heartbeat-tolerance",
        "5",
        "--dsj-enabled",
        "true",
        "--sharding",
        "true",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    Proc::spawn(&bin("kedge-hub"), &args, fleet.dir.join(log))
}

/// The hub CA in its Secret: the one `dev-certs` made, so the agents' certificates hold.
async fn ca_secret(fleet: &Fleet) {
    let cert = std::fs::read_to_string(fleet.pki.dir.join("ca.pem")).unwrap();
    let key = std::fs::read_to_string(fleet.pki.dir.join("ca-key.pem")).unwrap();
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "kedge-hub-ca", "namespace": "kedge-system"},
        "stringData": {"tls.crt": cert, "tls.key": key},
    });
    apply(fleet, &secret.to_string(), "ca-secret.json").await;
}

/// Jobs of DSJ `work` per member.
async fn jobs(fleet: &Fleet) -> Vec<usize> {
    let mut out = Vec::new();
    for member in ["member-1", "member-2"] {
        let client = fleet.sim.cluster(member).unwrap().client().unwrap();
        let list = Api::<Job>::namespaced(client, "default")
            .list(&ListParams::default().labels("kedge.dev/distributedscaledjob=work"))
            .await
            .unwrap();
        out.push(list.items.len());
    }
    out
}

/// Waits until the hub on `ports` has every member Connected.
async fn serves_all(ports: HubPorts, what: &str) {
    wait_for_states(ports, &THREE, "Connected", STEP).await;
    eprintln!("{what}");
}

/// Waits for `done`, checking meanwhile that no member's count of DSO `web` changes from
/// `split` and that the Jobs never exceed `jobs_at_most`.
async fn holding<T>(
    fleet: &Fleet,
    split: [i64; 3],
    jobs_at_most: usize,
    what: &str,
    mut done: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        let now = fleet.split("web", &THREE);
        for ((member, got), want) in THREE.iter().zip(&now).zip(split) {
            assert_eq!(*got, Some(want), "{what}: {member} changed");
        }
        let total: usize = jobs(fleet).await.iter().sum();
        assert!(
            total <= jobs_at_most,
            "{what}: {total} Jobs, at most {jobs_at_most} were due"
        );
        if let Some(value) = done().await {
            eprintln!("{what}: {:?}", start.elapsed());
            return value;
        }
        assert!(start.elapsed() < STEP, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_sessions_and_one_decides() {
    let (_dir, fleet) = start_with(&THREE, |c| c.job_duration = Duration::from_secs(600)).await;
    for member in THREE {
        deployment(&fleet.sim, member, "web", 1).await;
    }
    ca_secret(&fleet).await;
    let ports = [HubPorts::new(), HubPorts::new(), HubPorts::new()];
    let mut hubs: Vec<Option<Proc>> = vec![Some(replica(&fleet, ports[0], "hub-0.log"))];
    wait_for(STEP, "replica 0 to be active", || async {
        (ready(ports[0]).await == Some(true)).then_some(())
    })
    .await;
    hubs.push(Some(replica(&fleet, ports[1], "hub-1.log")));
    hubs.push(Some(replica(&fleet, ports[2], "hub-2.log")));
    for p in &ports[1..] {
        wait_for(
            STEP,
            "a relaying replica to be ready (it knows where to relay)",
            || async { (ready(*p).await == Some(true)).then_some(()) },
        )
        .await;
    }
    // member-N dials replica N-1 first, then the others in turn.
    let mut agents: Vec<Proc> = (0..3)
        .map(|i| {
            let order = [ports[i], ports[(i + 1) % 3], ports[(i + 2) % 3]];
            fleet.start_agent_to(THREE[i], &order, &format!("{}.log", THREE[i]))
        })
        .collect();
    serves_all(ports[0], "every member has a session at the active replica").await;
    // The two relaying replicas hold member-2's and member-3's connections.
    for (i, member) in [(1, "member-2"), (2, "member-3")] {
        wait_for(STEP, &format!("replica {i} to relay {member}"), || async {
            let log = hubs[i].as_ref().unwrap().log_text();
            log.contains("relaying sessions to the active hub replica")
                .then_some(())
        })
        .await;
    }
    // A relaying replica holds no session record: it says where to ask instead of listing
    // nobody.
    let (code, text) = ops_request(ports[1], "/v1/sessions").await.unwrap();
    assert_eq!(code, 421, "{text}");
    assert!(
        text.contains("relays its agents' sessions to the active replica"),
        "{text}"
    );
    // Each relaying replica counts the session it relays; the active one counts both.
    for p in &ports[1..] {
        let metrics = ops_get(*p, "/metrics").await.unwrap();
        assert!(
            metrics.contains(r#"kedge_hub_relayed_sessions{kind="relaying"} 1"#),
            "{metrics}"
        );
    }
    let metrics = ops_get(ports[0], "/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"kedge_hub_relayed_sessions{kind="served"} 2"#),
        "{metrics}"
    );
    let active_log = hubs[0].as_ref().unwrap().log_text();
    assert_eq!(
        active_log
            .matches("a hub replica relays its sessions here")
            .count(),
        2,
        "{active_log}"
    );

    // One DSO over the three members, 1:2:3 of 12; one DSJ over member-1 and member-2.
    // Shares stay through a takeover: the Lease (2 s) and the reconnects fit in 10 s.
    let dso = dso_yaml("web", &members([1, 2, 3]), "absent")
        .replace("gracePeriod: 3s", "gracePeriod: 10s");
    apply(&fleet, &dso, "web.yaml").await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=12"]).await;
    fleet
        .wait_split("web", &THREE, &[2, 4, 6], "2:4:6 of 12")
        .await;
    apply(&fleet, &dsj_yaml("queue"), "work.yaml").await;
    set_queue(&fleet, 5).await;
    wait_for(STEP, "5 Jobs, 2:3", || async {
        (jobs(&fleet).await == [2, 3]).then_some(())
    })
    .await;

    // The replica relaying member-2 dies: member-2 moves to the next replica on its list.
    let mut dead = hubs[1].take().unwrap();
    dead.signal("KILL");
    let _ = dead.child.wait().await;
    holding(
        &fleet,
        [2, 4, 6],
        5,
        "member-2 back after its replica died",
        || async {
            let s = sessions(ports[0]).await?;
            let session = state_of(&s, "member-2")?;
            (session["state"] == "Connected" && session["sessions"].as_u64()? >= 2).then_some(())
        },
    )
    .await;

    // The active replica dies: replica 2 takes the Lease once it expires; the agents of
    // replica 0 reconnect, member-3's session is served where it is.
    let mut dead = hubs[0].take().unwrap();
    dead.signal("KILL");
    let _ = dead.child.wait().await;
    holding(
        &fleet,
        [2, 4, 6],
        5,
        "replica 2 active with every member",
        || async {
            let ready = ready(ports[2]).await == Some(true);
            let s = sessions(ports[2]).await?;
            let all = THREE
                .iter()
                .all(|m| state_of(&s, m).is_some_and(|x| x["state"] == "Connected"));
            (ready && all).then_some(())
        },
    )
    .await;
    // It decides now: a new total and more Jobs, none twice.
    fleet.kubectl(&["scale", "dso/web", "--replicas=18"]).await;
    fleet
        .wait_split("web", &THREE, &[3, 6, 9], "3:6:9 of 18")
        .await;
    set_queue(&fleet, 10).await;
    wait_for(STEP, "10 Jobs, 4:6", || async {
        (jobs(&fleet).await == [4, 6]).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        jobs(&fleet).await,
        [4, 6],
        "Jobs after the takeover did not stay"
    );

    // A relayed member is deleted: the active replica's revocation reaches the agent
    // through the replica that holds its connection.
    let relay = HubPorts::new();
    let _relaying = replica(&fleet, relay, "hub-3.log");
    wait_for(STEP, "the new replica to be ready", || async {
        (ready(relay).await == Some(true)).then_some(())
    })
    .await;
    agents[2].signal("KILL");
    let _ = agents[2].child.wait().await;
    let before = sessions(ports[2]).await.unwrap();
    let established = state_of(&before, "member-3").unwrap()["sessions"]
        .as_u64()
        .unwrap();
    let member3 = fleet.start_agent_to("member-3", &[relay], "member-3-relayed.log");
    wait_for(STEP, "member-3 relayed by the new replica", || async {
        let s = sessions(ports[2]).await?;
        let m = state_of(&s, "member-3")?;
        (m["state"] == "Connected" && m["sessions"].as_u64()? > established).then_some(())
    })
    .await;
    fleet
        .kubectl(&["delete", "membercluster", "member-3"])
        .await;
    // Its session ends with the active replica's code and reason, not a stream that ended.
    let lost = wait_for(STEP, "the relayed agent's session to end", || async {
        let log = member3.log_text();
        let line = log
            .lines()
            .find(|l| l.contains("session with the hub lost"))?;
        Some(line.to_owned())
    })
    .await;
    assert!(
        lost.contains("hub closed the connection (revoked: "),
        "{lost}"
    );
}
