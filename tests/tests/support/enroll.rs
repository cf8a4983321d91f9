//! The enrollment harness: a simulated hub cluster (kedge CRDs, namespace `kedge-system`)
//! and member clusters, the real `kedge-hub` in CA-Secret mode (no certificate files), the
//! real `kedge-agent` enrolling with a bootstrap token, and a scripted agent for what the
//! real one never does.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kedge_core::crd::{MemberCluster, MemberClusterSpec};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kedge_protocol::{
    AgentMessage, EnrollRequest, EnrollResponse, FramedStream, Heartbeat, Hello, HubMessage,
    PROTOCOL_VERSION,
};
use kedge_sim::{Sim, SimConfig};
use kube::api::PostParams;
use kube::{Api, Client};

use super::create_namespace;

use super::*;

/// The hub namespace (CA and token Secrets) and the agents' namespace.
pub const NS: &str = "kedge-system";

/// A hub cluster, member clusters and one hub in CA-Secret mode.
pub struct EnrollFleet {
    pub dir: PathBuf,
    pub sim: Sim,
    pub ports: HubPorts,
    pub hub: Proc,
    pub hub_client: Client,
}

/// An agent's side of a stream.
pub type AgentSide = FramedStream<quinn::RecvStream, quinn::SendStream, HubMessage, AgentMessage>;

/// A scripted agent's first exchange with the hub at `addr` through `endpoint`: the QUIC
/// connection with `config`, the control stream, and the hub's answer to its `Hello`
/// (speaking `protocol_version`).
pub async fn scripted_hello(
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    protocol_version: u16,
) -> (quinn::Connection, AgentSide, Option<HubMessage>) {
    let connection = endpoint
        .connect_with(config, addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut control = AgentSide::new(recv, send);
    control
        .send(&AgentMessage::Hello(Hello {
            protocol_version,
            agent_version: format!("scripted-v{protocol_version}"),
            kubernetes_version: String::new(),
            last_applied_revision: 0,
            namespaces: vec![],
        }))
        .await
        .unwrap();
    let answer = control.recv().await.unwrap();
    (connection, control, answer)
}

/// A scripted agent's session with the hub at `addr`: the QUIC connection with `material`,
/// the control stream after `Hello` (speaking `protocol_version`) and `Welcome`, and a
/// heartbeat stream kept alive in the background (at most ~17 minutes). A hub that refuses
/// the session as `Unavailable` (not leading yet, its MemberClusters not read yet) is dialed
/// again for up to 30 s, as a real agent retries.
pub async fn scripted_agent(
    addr: SocketAddr,
    material: TlsMaterial,
    protocol_version: u16,
) -> (quinn::Connection, AgentSide, kedge_protocol::Welcome) {
    let config =
        tls::client_config(material, TransportTuning::default(), kedge_protocol::ALPN).unwrap();
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (connection, control, welcome) = loop {
        let (connection, control, answer) =
            scripted_hello(&endpoint, config.clone(), addr, protocol_version).await;
        match answer {
            Some(HubMessage::Welcome(welcome)) => break (connection, control, welcome),
            Some(HubMessage::Refused(refusal))
                if refusal.code == kedge_protocol::RefusalCode::Unavailable
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("expected Welcome, got {other:?}"),
        }
    };
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut beats = AgentSide::new(recv, send);
    tokio::spawn(async move {
        for seq in 1..10_000 {
            let beat = AgentMessage::Heartbeat(Heartbeat {
                seq,
                sent_unix_ms: 0,
            });
            if beats.send(&beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (connection, control, welcome)
}

impl EnrollFleet {
    /// Starts the clusters and a hub issuing member certificates of `member_lifetime`.
    pub async fn start(dir: &Path, members: &[&str], member_lifetime: &str) -> EnrollFleet {
        Self::start_with(dir, members, member_lifetime, &[]).await
    }

    /// [`EnrollFleet::start`] with extra hub flags.
    pub async fn start_with(
        dir: &Path,
        members: &[&str],
        member_lifetime: &str,
        hub_flags: &[&str],
    ) -> EnrollFleet {
        let mut names = vec!["hub".to_owned()];
        names.extend(members.iter().map(|m| m.to_string()));
        let sim = Sim::start(&names, SimConfig::default(), Some(dir))
            .await
            .unwrap();
        let hub_client = kube_client(&dir.join("hub.kubeconfig")).await;
        apply_crds(&dir.join("hub.kubeconfig")).await;
        create_namespace(&hub_client, NS).await;
        for member in members {
            create_namespace(
                &kube_client(&dir.join(format!("{member}.kubeconfig"))).await,
                NS,
            )
            .await;
        }
        let ports = HubPorts::new();
        let hub = start_ca_hub(dir, ports, member_lifetime, "hub.log", hub_flags);
        let mut fleet = EnrollFleet {
            dir: dir.to_owned(),
            sim,
            ports,
            hub,
            hub_client,
        };
        // The hub is up once its CA Secret exists and its ops endpoint answers.
        let start = std::time::Instant::now();
        while fleet.secret(NS, "kedge-hub-ca").await.is_none() {
            assert!(
                fleet.hub.is_running() && start.elapsed() < Duration::from_secs(20),
                "the hub did not create its CA Secret:\n{}",
                fleet.hub.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wait_for(Duration::from_secs(20), "the hub to answer", || async {
            sessions(ports).await
        })
        .await;
        std::fs::write(fleet.ca_path(), fleet.ca_pem().await).unwrap();
        fleet
    }

    /// Where the hub CA bundle is written for agents.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("hub-ca.pem")
    }

    /// The hub CA certificate, from its Secret.
    pub async fn ca_pem(&self) -> String {
        let secret = self.secret(NS, "kedge-hub-ca").await.unwrap();
        String::from_utf8(secret.data.unwrap()["tls.crt"].0.clone()).unwrap()
    }

    /// A Secret of the hub cluster.
    pub async fn secret(&self, ns: &str, name: &str) -> Option<Secret> {
        Api::<Secret>::namespaced(self.hub_client.clone(), ns)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// A client of member cluster `member`.
    pub async fn member_client(&self, member: &str) -> Client {
        kube_client(&self.dir.join(format!("{member}.kubeconfig"))).await
    }

    /// Creates the `MemberCluster` `member`; returns its uid.
    pub async fn create_member(&self, member: &str) -> String {
        let mc = MemberCluster::new(member, MemberClusterSpec::default());
        Api::<MemberCluster>::all(self.hub_client.clone())
            .create(&PostParams::default(), &mc)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap()
    }

    /// Mints a token for `member` valid from `now` for `ttl` and stores its Secret, bound to
    /// the `MemberCluster` `member` (to a uid no object has, without an owner the garbage
    /// collector would miss, when there is none); returns the token.
    pub async fn create_token(
        &self,
        member: &str,
        now: time::OffsetDateTime,
        ttl: Duration,
    ) -> String {
        let uid = Api::<MemberCluster>::all(self.hub_client.clone())
            .get_opt(member)
            .await
            .unwrap()
            .and_then(|mc| mc.metadata.uid);
        let minted = kedge_hub::enroll::mint_bootstrap_token(member, now, ttl).unwrap();
        let mut secret = minted
            .secret(uid.as_deref().unwrap_or("no-membercluster"), NS)
            .unwrap();
        if uid.is_none() {
            secret.metadata.owner_references = None;
        }
        let secrets = Api::<Secret>::namespaced(self.hub_client.clone(), NS);
        let _ = secrets
            .delete(&secret.metadata.name.clone().unwrap(), &Default::default())
            .await;
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        minted.token.as_str().to_owned()
    }

    /// Writes `token` to a file for an agent.
    pub fn token_file(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, format!("{token}\n")).unwrap();
        path
    }

    /// Starts a real agent for `member` without certificate files, with `extra` flags.
    pub fn start_agent(&self, member: &str, log: &str, extra: &[&str]) -> Proc {
        let mut args = vec![
            "--kubeconfig".into(),
            self.dir
                .join(format!("{member}.kubeconfig"))
                .display()
                .to_string(),
            "--hub".into(),
            format!("127.0.0.1:{}", self.ports.quic),
            "--hub-server-name".into(),
            "localhost".into(),
            "--tls-ca".into(),
            self.ca_path().display().to_string(),
            "--agent-namespace".into(),
            NS.into(),
            // These tests are about identity, not about where the agent may act.
            "--all-namespaces".into(),
            "--ops-listen".into(),
            "127.0.0.1:0".into(),
        ];
        // Fast reconnects unless the test sets its own.
        for (flag, value) in [("--reconnect-initial", "100ms"), ("--reconnect-max", "1s")] {
            if !extra.contains(&flag) {
                args.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        Proc::spawn(&bin("kedge-agent"), &args, self.dir.join(log))
    }

    /// Sends one enrollment request straight to the hub; returns its answer.
    pub async fn enroll(&self, token: &str, csr_der: Vec<u8>) -> EnrollResponse {
        let trusted = kedge_net::tls::load_certs(&self.ca_path()).unwrap();
        let config = tls::enroll_client_config(&trusted, TransportTuning::default()).unwrap();
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let request = EnrollRequest {
            protocol_version: PROTOCOL_VERSION,
            token: token.into(),
            csr_der,
        };
        kedge_net::enroll::enroll(
            &endpoint,
            config,
            self.ports.quic_addr(),
            "localhost",
            &request,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
    }

    /// Enrolls `member` (its `MemberCluster` exists) with a fresh token and key: the key
    /// (PEM) and the certificate the hub issued; a refusal fails the test.
    pub async fn enrolled(&self, member: &str) -> (String, kedge_protocol::IssuedCertificate) {
        let token = self
            .create_token(
                member,
                time::OffsetDateTime::now_utc(),
                Duration::from_secs(3600),
            )
            .await;
        let (key, csr) = kedge_net::pki::member_csr(member).unwrap();
        match self.enroll(&token, csr).await {
            EnrollResponse::Issued(cert) => (key, cert),
            EnrollResponse::Refused(refusal) => panic!("{member} enrolls: {refusal:?}"),
        }
    }

    /// The hub's answer to a scripted agent's `Hello` with `cert_pem`/`key_pem`, once (the
    /// CA from its file: the hub cluster may be failing on purpose).
    pub async fn hello_answer(&self, cert_pem: &str, key_pem: &str) -> Option<HubMessage> {
        let ca_pem = std::fs::read_to_string(self.ca_path()).unwrap();
        let material = TlsMaterial::from_pem(cert_pem, key_pem, &ca_pem).unwrap();
        let config =
            tls::client_config(material, TransportTuning::default(), kedge_protocol::ALPN).unwrap();
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = self.ports.quic_addr();
        scripted_hello(&endpoint, config, addr, PROTOCOL_VERSION)
            .await
            .2
    }

    /// The hub's refusal of a scripted agent's `Hello` with `cert_pem`/`key_pem`; anything
    /// else fails the test.
    pub async fn hello_refused(&self, cert_pem: &str, key_pem: &str) -> kedge_protocol::Refusal {
        match self.hello_answer(cert_pem, key_pem).await {
            Some(HubMessage::Refused(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Opens a session as a scripted agent with `cert_pem`/`key_pem`: Hello, Welcome, and
    /// heartbeats every 100 ms in the background. It never renews.
    pub async fn scripted_session(
        &self,
        cert_pem: &str,
        key_pem: &str,
    ) -> (quinn::Connection, AgentSide, String) {
        let material = TlsMaterial::from_pem(cert_pem, key_pem, &self.ca_pem().await).unwrap();
        let (connection, control, welcome) =
            scripted_agent(self.ports.quic_addr(), material, PROTOCOL_VERSION).await;
        (connection, control, welcome.session_id)
    }
}

/// The real `kubectl ARGS` against the cluster of `kubeconfig`; its stdout. Fails the test
/// when it fails.
pub async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
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
pub async fn kedge_mc(dir: &Path, args: &[&str]) -> (bool, String, String) {
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

/// A kube client for the cluster of `kubeconfig`.
pub async fn kube_client(kubeconfig: &Path) -> Client {
    kedge_net::kube_client::client(Some(kubeconfig))
        .await
        .unwrap()
}

async fn apply_crds(kubeconfig: &Path) {
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    let out = tokio::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-f", crds])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply CRDs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `kedge-hub` without certificate files: CA from the Secret in `kedge-system`.
pub fn start_ca_hub(
    dir: &Path,
    ports: HubPorts,
    member_lifetime: &str,
    log: &str,
    extra: &[&str],
) -> Proc {
    let mut args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{}", ports.quic),
        "--ops-listen",
        &format!("127.0.0.1:{}", ports.ops),
        "--kubeconfig",
        &dir.join("hub.kubeconfig").display().to_string(),
        "--namespace",
        NS,
        "--lease-namespace",
        NS,
        "--server-dns-names",
        "localhost",
        "--member-cert-lifetime",
        member_lifetime,
        "--heartbeat-interval",
        "200ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // A short Lease, unless the test asks for another.
    if !extra.contains(&"--lease-duration") {
        args.extend(["--lease-duration".to_owned(), "2s".to_owned()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::spawn(&bin("kedge-hub"), &args, dir.join(log))
}
