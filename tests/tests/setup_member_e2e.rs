//! Enrollment in one command, end to end: `kubectl kedge mc setup-member` against the hub
//! cluster, its output applied to the member cluster with the real `kubectl`, and the real
//! `kedge-agent` run as the rendered Deployment runs it (its args, its Secret's files, a token
//! of its ServiceAccount): it enrolls with the one-time token and its session comes up. The
//! hub runs in CA-Secret mode (no certificate files).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::enroll::*;
use support::*;

async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl kedge mc ARGS` against the hub cluster: (success, stdout, stderr).
async fn kedge_mc(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin("kubectl-kedge"))
        .arg("mc")
        .args(args)
        .arg("--kubeconfig")
        .arg(dir.join("hub.kubeconfig"))
        .args(["--hub-namespace", NS])
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rendered Deployment's container, run here as the kubelet would: the Secret's files
/// where it mounts them, its args (`$(POD_NAMESPACE)` expanded), the hub address from the
/// Secret, and a token of its ServiceAccount (TokenRequest, by the real kubectl).
async fn start_rendered_agent(
    fleet: &EnrollFleet,
    member: &str,
    deployment: &Value,
    secret: &Value,
) -> Proc {
    let kubeconfig = fleet.dir.join(format!("{member}.kubeconfig"));
    let etc = fleet.dir.join(format!("etc-kedge-{member}"));
    std::fs::create_dir_all(&etc).unwrap();
    for key in ["ca.crt", "token"] {
        std::fs::write(etc.join(key), secret_value(secret, key)).unwrap();
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
        fleet.dir.join(format!("{member}-agent.log")),
    )
}

async fn wait_connected(fleet: &EnrollFleet, member: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("{member} connected"),
        || async {
            let listed = sessions(fleet.ports).await?;
            (state_of(&listed, member)?["state"] == "Connected").then_some(())
        },
    )
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
    let agent = start_rendered_agent(&fleet, "edge-1", deployment, secret).await;

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
    let _agent2 = start_rendered_agent(&fleet, "edge-2", &deployment, &secret).await;
    wait_connected(&fleet, "edge-2").await;
}
