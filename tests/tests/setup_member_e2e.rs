//! Enrollment in one command, end to end: `kubectl kedge mc setup-member` against the hub
//! cluster, its output applied to the member cluster with the real `kubectl`, and the real
//! `kedge-agent` run as the rendered Deployment runs it (its args, its Secret's files, a token
//! of its ServiceAccount): it enrolls with the one-time token and its session comes up. The
//! hub runs in CA-Secret mode (no certificate files).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::Value;
use support::enroll::*;
use support::*;

/// The rendered Deployment's container, run here as the kubelet would: the Secret's files
/// where it mounts them, its args (`$(POD_NAMESPACE)` expanded), the hub address from the
/// Secret, and a token of its ServiceAccount (TokenRequest, by the real kubectl); it logs to
/// `log`.
async fn start_rendered_agent(
    fleet: &EnrollFleet,
    member: &str,
    deployment: &Value,
    secret: &Value,
    log: &str,
) -> Proc {
    let kubeconfig = fleet.dir.join(format!("{member}.kubeconfig"));
    let etc = mounted(fleet, member, "");
    std::fs::create_dir_all(&etc).unwrap();
    for key in ["ca.crt", "token"] {
        std::fs::write(mounted(fleet, member, key), secret_value(secret, key)).unwrap();
    }
    let token = kubectl_ok(&kubeconfig, &["create", "token", "kedge-agent", "-n", NS]).await;
    let agent_kubeconfig = fleet.dir.join(format!("{member}-agent.kubeconfig"));
    let cluster = fleet.sim.cluster(member).unwrap();
    std::fs::write(
        &agent_kubeconfig,
        cluster.kubeconfig_with_token(token.trim()),
    )
    .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut args = local_args(container, "/etc/kedge", &etc, NS);
    args.extend([
        "--kubeconfig".to_owned(),
        agent_kubeconfig.display().to_string(),
    ]);
    Proc::spawn_env(
        &bin("kedge-agent"),
        &args,
        &[("KEDGE_AGENT_HUB", &secret_value(secret, "hub"))],
        fleet.dir.join(log),
    )
}

/// Where [`start_rendered_agent`] puts the files of the install's Secret of `member`.
fn mounted(fleet: &EnrollFleet, member: &str, key: &str) -> std::path::PathBuf {
    fleet.dir.join(format!("etc-kedge-{member}")).join(key)
}

async fn wait_connected(fleet: &EnrollFleet, member: &str) {
    wait_connected_within(fleet, member, Duration::from_secs(30)).await;
}

async fn wait_connected_within(fleet: &EnrollFleet, member: &str, limit: Duration) {
    wait_for(limit, &format!("{member} connected"), || async {
        let listed = sessions(fleet.ports).await?;
        (state_of(&listed, member)?["state"] == "Connected").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_member_output_applied_with_kubectl_enrolls_the_agent() {
    let mut tmp = tempfile::tempdir().unwrap();
    if std::env::var_os("KEDGE_E2E_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("logs in {}", tmp.path().display());
    }
    let dir = tmp.path();
    let fleet = EnrollFleet::start(dir, &["edge-1", "edge-2"], "24h").await;
    let member = dir.join("edge-1.kubeconfig");
    kubectl_ok(&member, &["create", "namespace", "apps"]).await;
    let hub_address = format!("127.0.0.1:{}", fleet.ports.quic);

    // Refused without touching anything: a bad name, no namespaces.
    let (ok, _, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "Edge_1",
            "--namespaces",
            "apps",
            "--hub-address",
            &hub_address,
        ],
    )
    .await;
    assert!(!ok && err.contains("not a valid member name"), "{err}");
    let (ok, _, err) = kedge_mc(
        dir,
        &["setup-member", "edge-1", "--hub-address", &hub_address],
    )
    .await;
    assert!(!ok && err.contains("--namespaces"), "{err}");
    let (ok, _, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "edge-1",
            "--namespaces",
            "apps",
            "--hub-address",
            "hub.example",
        ],
    )
    .await;
    assert!(!ok && err.contains("is not HOST:PORT"), "{err}");
    assert!(
        kubectl_ok(&dir.join("hub.kubeconfig"), &["get", "mc", "-o", "name"])
            .await
            .trim()
            .is_empty(),
        "a refused setup-member created something"
    );

    // The install, printed.
    let (ok, install, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "edge-1",
            "--namespaces",
            "apps",
            "--hub-address",
            &hub_address,
            "--hub-server-name",
            "localhost",
            "--ttl",
            "10m",
        ],
    )
    .await;
    assert!(ok, "setup-member failed: {err}");
    let mc: Value = serde_json::from_str(
        &kubectl_ok(
            &dir.join("hub.kubeconfig"),
            &["get", "mc", "edge-1", "-o", "json"],
        )
        .await,
    )
    .unwrap();
    assert_eq!(mc["spec"]["namespaces"], serde_json::json!(["apps"]));
    let token_secret = fleet.secret(NS, "kedge-bootstrap-edge-1").await.unwrap();
    assert!(token_secret.data.unwrap().contains_key("token-hash"));
    // Enrolling it twice is refused with what to do.
    let (ok, _, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "edge-1",
            "--namespaces",
            "apps",
            "--hub-address",
            &hub_address,
        ],
    )
    .await;
    assert!(!ok && err.contains("mc delete-member edge-1"), "{err}");

    // Applied to the member with the real kubectl.
    let file = dir.join("edge-1-install.yaml");
    std::fs::write(&file, &install).unwrap();
    kubectl_ok(&member, &["apply", "-f", file.to_str().unwrap()]).await;

    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&install)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect();
    let secret = objects.iter().find(|o| o["kind"] == "Secret").unwrap();
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(secret_value(secret, "hub"), hub_address);
    let agent =
        start_rendered_agent(&fleet, "edge-1", deployment, secret, "edge-1-agent.log").await;

    // It enrolls and connects; the token is spent; its identity is in its Secret.
    wait_connected(&fleet, "edge-1").await;
    assert!(
        fleet.secret(NS, "kedge-bootstrap-edge-1").await.is_none(),
        "token not spent"
    );
    let identity = kubectl_ok(
        &member,
        &[
            "get",
            "secret",
            "kedge-agent-identity",
            "-n",
            NS,
            "-o",
            "json",
        ],
    )
    .await;
    assert!(identity.contains("tls.crt"), "{identity}");
    assert!(
        agent.log_text().contains("enrolled"),
        "{}",
        agent.log_text()
    );

    // `mc list-members` shows it with its namespaces.
    let (ok, listed, _) = kedge_mc(dir, &["list-members"]).await;
    assert!(ok);
    let row = listed.lines().find(|l| l.starts_with("edge-1")).unwrap();
    assert!(row.contains("apps"), "{listed}");

    // With --member-kubeconfig, setup-member applies the install itself.
    let edge2 = dir.join("edge-2.kubeconfig");
    kubectl_ok(&edge2, &["create", "namespace", "apps"]).await;
    let (ok, said, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "edge-2",
            "--namespaces",
            "apps",
            "--hub-address",
            &hub_address,
            "--hub-server-name",
            "localhost",
            "--member-kubeconfig",
            edge2.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(said.contains("member edge-2 enrolled"), "{said}");
    let get = |kind: &'static str, name: &'static str| {
        let edge2 = edge2.clone();
        async move {
            let json = kubectl_ok(&edge2, &["get", kind, name, "-n", NS, "-o", "json"]).await;
            serde_json::from_str::<Value>(&json).unwrap()
        }
    };
    let deployment = get("deployment", "kedge-agent").await;
    let secret = get("secret", "kedge-agent-bootstrap").await;
    let _agent2 =
        start_rendered_agent(&fleet, "edge-2", &deployment, &secret, "edge-2-agent.log").await;
    wait_connected(&fleet, "edge-2").await;
}

/// The `MemberCluster` uid the certificate in the identity Secret of `member` is bound to.
async fn identity_uid(fleet: &EnrollFleet, member: &str) -> Option<String> {
    let secrets = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        fleet.member_client(member).await,
        NS,
    );
    let data = secrets
        .get_opt("kedge-agent-identity")
        .await
        .unwrap()?
        .data?;
    let pem = String::from_utf8(data.get("tls.crt")?.0.clone()).ok()?;
    kedge_net::identity::PeerIdentity::from_pem(&pem)
        .ok()
        .filter(|identity| identity.member == member)?
        .enrollment_uid
}

/// The uid of the `MemberCluster` `member`.
async fn member_uid(fleet: &EnrollFleet, member: &str) -> String {
    kube::Api::<kedge_core::crd::MemberCluster>::all(fleet.hub_client.clone())
        .get(member)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// `setup-member edge-1` applying the install to the member cluster (the hub at
/// `hub_address`); returns the installed Deployment and Secret.
async fn set_up_edge_1(dir: &std::path::Path, hub_address: &str) -> (Value, Value) {
    let member = dir.join("edge-1.kubeconfig");
    let (ok, _, err) = kedge_mc(
        dir,
        &[
            "setup-member",
            "edge-1",
            "--namespaces",
            "apps",
            "--hub-address",
            hub_address,
            "--hub-server-name",
            "localhost",
            "--member-kubeconfig",
            member.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "setup-member: {err}");
    let get = |kind: &'static str, name: &'static str| {
        let member = member.clone();
        async move {
            let json = kubectl_ok(&member, &["get", kind, name, "-n", NS, "-o", "json"]).await;
            serde_json::from_str::<Value>(&json).unwrap()
        }
    };
    (
        get("deployment", "kedge-agent").await,
        get("secret", "kedge-agent-bootstrap").await,
    )
}

/// A member deleted and set up again, its agent reinstalled while the member cluster still
/// holds the old identity Secret: the agent sees a bootstrap token its identity was not
/// enrolled with, enrolls again by itself and replaces the Secret, Connected within 30 s with
/// no manual step. Then, the agent running: deleted, it holds only its spent token and stays
/// out without sending it; set up again, the new install updates its mounted token (as the
/// kubelet updates a Secret volume) and the revoked agent enrolls again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_set_up_again_reconnects_by_itself_despite_its_old_identity() {
    let mut tmp = tempfile::tempdir().unwrap();
    if std::env::var_os("KEDGE_E2E_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!("logs in {}", tmp.path().display());
    }
    let dir = tmp.path();
    let fleet = EnrollFleet::start(dir, &["edge-1"], "24h").await;
    let member = dir.join("edge-1.kubeconfig");
    kubectl_ok(&member, &["create", "namespace", "apps"]).await;
    let hub_address = format!("127.0.0.1:{}", fleet.ports.quic);
    let delete = || async {
        let (ok, _, err) = kedge_mc(dir, &["delete-member", "edge-1"]).await;
        assert!(ok, "delete-member: {err}");
    };

    let (deployment, secret) = set_up_edge_1(dir, &hub_address).await;
    let mut agent =
        start_rendered_agent(&fleet, "edge-1", &deployment, &secret, "agent-1.log").await;
    wait_connected(&fleet, "edge-1").await;
    let first = member_uid(&fleet, "edge-1").await;
    assert_eq!(identity_uid(&fleet, "edge-1").await, Some(first.clone()));

    // Deleted and set up again while the agent is down; the identity Secret of the first
    // enrollment stays in the member cluster.
    agent.signal("TERM");
    let _ = agent.child.wait().await;
    delete().await;
    let (deployment, secret) = set_up_edge_1(dir, &hub_address).await;
    let second = member_uid(&fleet, "edge-1").await;
    assert_ne!(second, first);
    assert_eq!(identity_uid(&fleet, "edge-1").await, Some(first.clone()));
    let restarted = std::time::Instant::now();
    let agent = start_rendered_agent(&fleet, "edge-1", &deployment, &secret, "agent-2.log").await;
    wait_connected(&fleet, "edge-1").await;
    eprintln!(
        "reinstalled agent connected {:?} after its start",
        restarted.elapsed()
    );
    assert_eq!(identity_uid(&fleet, "edge-1").await, Some(second.clone()));
    let log = agent.log_text();
    assert!(log.contains("the member was set up again"), "{log}");
    assert!(
        fleet.secret(NS, "kedge-bootstrap-edge-1").await.is_none(),
        "the new token is spent"
    );

    // Deleted, the agent running: revoked, and with only its spent token it stays out; it
    // does not even send that token.
    let refused_before = fleet.hub.log_text().matches("enrollment refused").count();
    delete().await;
    wait_for(Duration::from_secs(10), "edge-1 revoked", || async {
        let listed = sessions(fleet.ports).await?;
        (state_of(&listed, "edge-1").is_none_or(|s| s["state"] != "Connected")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = sessions(fleet.ports).await.unwrap();
    let state = state_of(&listed, "edge-1").unwrap();
    assert_eq!(state["state"], "Unreachable", "{state}");
    assert!(fleet.hub.log_text().contains("not_enrolled"));
    assert_eq!(
        fleet.hub.log_text().matches("enrollment refused").count(),
        refused_before,
        "the spent token was sent"
    );

    // Set up again: the new token reaches the running agent through its mounted Secret.
    let (_, secret) = set_up_edge_1(dir, &hub_address).await;
    let third = member_uid(&fleet, "edge-1").await;
    std::fs::write(
        mounted(&fleet, "edge-1", "token"),
        secret_value(&secret, "token"),
    )
    .unwrap();
    let updated = std::time::Instant::now();
    // Bounded by the reconnect backoff the refusals grew (--reconnect-max 30 s, jittered).
    wait_connected_within(&fleet, "edge-1", Duration::from_secs(60)).await;
    eprintln!(
        "running agent connected {:?} after its token was updated",
        updated.elapsed()
    );
    assert_eq!(identity_uid(&fleet, "edge-1").await, Some(third));
    let log = agent.log_text();
    assert!(log.contains("enrolled again"), "{log}");
}

/// A namespace the agent is to act in but the member cluster lacks: setup-member names it
/// and the cluster, prints the command that creates it and leaves nothing behind on the
/// hub; that command run, setup-member succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_member_namespace_is_named_with_the_command_that_creates_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fleet = EnrollFleet::start(dir, &["edge-1"], "24h").await;
    let member = dir.join("edge-1.kubeconfig");
    let hub_address = format!("127.0.0.1:{}", fleet.ports.quic);
    let member_path = member.to_str().unwrap();
    let args = [
        "setup-member",
        "edge-1",
        "--namespaces",
        "apps",
        "--hub-address",
        &hub_address,
        "--member-kubeconfig",
        member_path,
    ];
    let (ok, _, err) = kedge_mc(dir, &args).await;
    assert!(!ok, "setup-member succeeded without namespace apps");
    let fix = format!(
        "kubectl --kubeconfig {} create namespace apps",
        member.display()
    );
    assert!(
        err.contains("namespace \"apps\" does not exist") && err.contains("member edge-1"),
        "{err}"
    );
    assert!(err.contains(&fix), "{err}");
    assert!(!err.contains("ApiError"), "{err}");
    let members: kube::Api<kedge_core::crd::MemberCluster> =
        kube::Api::all(fleet.hub_client.clone());
    assert!(
        members.get_opt("edge-1").await.unwrap().is_none(),
        "a MemberCluster was left"
    );

    let create: Vec<&str> = fix.split(' ').skip(1).collect();
    let out = tokio::process::Command::new("/usr/bin/kubectl")
        .args(&create)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, _, err) = kedge_mc(dir, &args).await;
    assert!(ok, "setup-member: {err}");
}
