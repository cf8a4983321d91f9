//! Shared harness of the end-to-end tests: real binaries, real sockets, loopback only.
// Harness code: a panic is how a test fails.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod dso;
pub mod enroll;
pub mod helm;
pub mod hub_peer;
pub mod stall;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

/// Path of a workspace binary next to the running test (target/<profile>/NAME).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile> directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --workspace --bins`; `make test` does)",
        path.display()
    );
    path
}

/// A free UDP port on 127.0.0.1.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free TCP port on 127.0.0.1.
pub fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process whose stderr goes to a log file; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(program: &Path, args: &[String], log: PathBuf) -> Proc {
        Self::spawn_env(program, args, &[], log)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_env(program: &Path, args: &[String], env: &[(&str, &str)], log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("KEDGE_TEST_LOG").unwrap_or_else(|_| "info,kedge_hub=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        Proc { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("process still running") as i32
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    /// Kills the process and waits (at most 5 s) until it is gone, so that what it held (a
    /// UDP port a restarted hub binds again, a file) is free when the drop returns; a kill
    /// alone leaves it running for a moment, longer on a loaded machine.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// A development PKI written by the real `kubectl-kedge dev-certs`.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub async fn create(dir: &Path, members: &[&str]) -> Pki {
        let out = Command::new(bin("kubectl-kedge"))
            .args(["dev-certs", "--dir"])
            .arg(dir)
            .args(["--members", &members.join(",")])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "dev-certs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Pki {
            dir: dir.to_owned(),
        }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

/// Ports and settings of one hub.
#[derive(Clone, Copy)]
pub struct HubPorts {
    pub quic: u16,
    pub ops: u16,
}

impl HubPorts {
    pub fn new() -> Self {
        HubPorts {
            quic: free_udp_port(),
            ops: free_tcp_port(),
        }
    }

    pub fn quic_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.quic))
    }

    pub fn ops_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ops)
    }
}

/// Starts a hub that only runs agent sessions (no hub cluster, whatever `$KUBECONFIG` says).
pub fn start_hub(pki: &Pki, ports: HubPorts, heartbeat: &str, log: PathBuf) -> Proc {
    start_hub_with(pki, ports, heartbeat, log, &["--controllers", "false"])
}

/// Starts a hub with extra flags (e.g. `--kubeconfig HUB` to run the controllers).
pub fn start_hub_with(
    pki: &Pki,
    ports: HubPorts,
    heartbeat: &str,
    log: PathBuf,
    extra: &[&str],
) -> Proc {
    let mut args = vec![
        "--listen".into(),
        format!("127.0.0.1:{}", ports.quic),
        "--ops-listen".into(),
        format!("127.0.0.1:{}", ports.ops),
        "--tls-cert".into(),
        pki.path("hub.pem"),
        "--tls-key".into(),
        pki.path("hub-key.pem"),
        "--tls-ca".into(),
        pki.path("ca.pem"),
        "--heartbeat-interval".into(),
        heartbeat.into(),
        "--heartbeat-tolerance".into(),
        "3".into(),
    ];
    // A hub with a hub cluster competes for a Lease: in `default` unless the test says
    // otherwise, and short, so a hub killed mid-test is succeeded quickly.
    for (flag, value) in [("--lease-namespace", "default"), ("--lease-duration", "2s")] {
        if !extra.contains(&flag) {
            args.extend([flag.to_owned(), value.to_owned()]);
        }
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    Proc::spawn(&bin("kedge-hub"), &args, log)
}

/// One simulated member cluster per name, with `DIR/NAME.kubeconfig` written.
pub async fn start_clusters(dir: &Path, names: &[&str]) -> kedge_sim::Sim {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    kedge_sim::Sim::start(&names, kedge_sim::SimConfig::default(), Some(dir))
        .await
        .expect("simulated clusters start")
}

/// Starts an agent for `member`, acting on the simulated cluster `DIR/MEMBER.kubeconfig`.
pub fn start_agent(pki: &Pki, member: &str, ports: HubPorts, log: PathBuf) -> Proc {
    start_agent_with(pki, member, ports, log, &[])
}

/// [`start_agent`] with extra flags; `--all-namespaces` unless they name `--namespaces`.
pub fn start_agent_with(
    pki: &Pki,
    member: &str,
    ports: HubPorts,
    log: PathBuf,
    extra: &[&str],
) -> Proc {
    let mut args = vec![
        "--kubeconfig".into(),
        pki.dir
            .join(format!("{member}.kubeconfig"))
            .display()
            .to_string(),
        "--hub".into(),
        format!("127.0.0.1:{}", ports.quic),
        "--hub-server-name".into(),
        "localhost".into(),
        "--tls-cert".into(),
        pki.path(&format!("member-{member}.pem")),
        "--tls-key".into(),
        pki.path(&format!("member-{member}-key.pem")),
        "--tls-ca".into(),
        pki.path("ca.pem"),
        "--ops-listen".into(),
        "127.0.0.1:0".into(),
        "--reconnect-initial".into(),
        "100ms".into(),
        "--reconnect-max".into(),
        "1s".into(),
    ];
    if !extra.contains(&"--namespaces") {
        args.push("--all-namespaces".into());
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    Proc::spawn(&agent_bin(), &args, log)
}

/// The agent binary: `KEDGE_AGENT_BIN` when set (a bench measuring the shipped `agent`
/// profile), else the one of the test's own profile.
pub fn agent_bin() -> PathBuf {
    std::env::var_os("KEDGE_AGENT_BIN").map_or_else(|| bin("kedge-agent"), PathBuf::from)
}

/// The hub's sessions, read with the real `kubectl kedge sessions -o json`.
/// `None` while the hub does not answer.
pub async fn sessions(ports: HubPorts) -> Option<Vec<Value>> {
    let out = Command::new(bin("kubectl-kedge"))
        .args(["sessions", "-o", "json", "--hub", &ports.ops_url()])
        .output()
        .await
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Whether the process answering on `ops` says it is ready (`/readyz` 200); `None` while
/// nothing answers.
pub async fn ready(ports: HubPorts) -> Option<bool> {
    Some(ops_request(ports, "/readyz").await?.0 == 200)
}

/// The body of `GET PATH` on the hub's ops endpoint, if it answers 200.
pub async fn ops_get(ports: HubPorts, path: &str) -> Option<String> {
    let (status, body) = ops_request(ports, path).await?;
    (status == 200).then_some(body)
}

/// The status code and body of `GET PATH` on the hub's ops endpoint; `None` while nothing
/// answers (or not within 5 s).
pub async fn ops_request(ports: HubPorts, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", ports.ops))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((
        head.split_whitespace().nth(1)?.parse().ok()?,
        body.to_owned(),
    ))
}

/// The state of one member, if the hub knows it.
pub fn state_of<'a>(sessions: &'a [Value], member: &str) -> Option<&'a Value> {
    sessions.iter().find(|s| s["member"] == member)
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `limit` with `what`.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every listed member is in `state` on the hub; returns the sessions.
pub async fn wait_for_states(
    ports: HubPorts,
    members: &[&str],
    state: &str,
    limit: Duration,
) -> Vec<Value> {
    wait_for(limit, &format!("{members:?} to be {state}"), || async {
        let sessions = sessions(ports).await?;
        members
            .iter()
            .all(|m| state_of(&sessions, m).is_some_and(|s| s["state"] == state))
            .then_some(sessions)
    })
    .await
}

/// A key of a Secret object's `data`, decoded (the Secret as JSON, e.g. a rendered one).
pub fn secret_value(secret: &Value, key: &str) -> String {
    let bytes: k8s_openapi::ByteString = serde_json::from_value(secret["data"][key].clone())
        .unwrap_or_else(|e| panic!("Secret key {key}: {e}"));
    String::from_utf8(bytes.0).unwrap()
}

/// A rendered container's args as a test runs its binary here, the way the kubelet would
/// run it: files under `mount` read from `files`, `$(POD_NAMESPACE)` expanded, a listener on
/// all interfaces moved to a free loopback port, JSON logs made text (readable assertions on
/// the log).
pub fn local_args(
    container: &Value,
    mount: &str,
    files: &Path,
    pod_namespace: &str,
) -> Vec<String> {
    let mount = format!("{}/", mount.trim_end_matches('/'));
    container["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("string args");
            match a.strip_prefix(mount.as_str()) {
                Some(file) => files.join(file).display().to_string(),
                None if a == "$(POD_NAMESPACE)" => pod_namespace.to_owned(),
                None if a.starts_with("0.0.0.0:") => "127.0.0.1:0".to_owned(),
                None if a == "json" => "text".to_owned(),
                None => a.to_owned(),
            }
        })
        .collect()
}

/// Creates namespace `name` in the cluster of `client`.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .unwrap();
}
