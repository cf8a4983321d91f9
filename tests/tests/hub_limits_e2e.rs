//! A hub no peer can knock over, against the real binary over real sockets: unfinished
//! handshakes do not keep agents out, spoofed sources get a Retry and cost nothing, a session
//! gets the streams the protocol uses and nothing more, agent text is cleaned before anyone
//! sees it, and the session listing is not served to just anyone.
//!
//! Peers use loopback addresses other than 127.0.0.1 (all of 127.0.0.0/8 reaches the hub on
//! Linux) so that one "source" can be told from another.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kedge_net::pki::{CertificateAuthority, Validity};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kedge_protocol::{
    AgentMessage, FramedStream, Heartbeat, Hello, HubMessage, PROTOCOL_VERSION, RefusalCode,
};
use quinn::Connection;
use support::stall::{Stalled, stall};
use support::*;
use time::OffsetDateTime;

type Control = FramedStream<quinn::RecvStream, quinn::SendStream, HubMessage, AgentMessage>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Hub {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    pki: Pki,
    ports: HubPorts,
    hub: Proc,
    ca: CertificateAuthority,
}

async fn hub(extra: &[&str]) -> Hub {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["good"]).await;
    let ports = HubPorts::new();
    let mut args = vec!["--controllers", "false"];
    args.extend_from_slice(extra);
    let hub = start_hub_with(&pki, ports, "200ms", dir.path().join("hub.log"), &args);
    wait_for(Duration::from_secs(20), "the hub to answer", || async {
        ready(ports).await.filter(|r| *r)
    })
    .await;
    let ca = CertificateAuthority::from_pem(
        &std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        &std::fs::read_to_string(pki.path("ca-key.pem")).unwrap(),
    )
    .unwrap();
    Hub {
        dir: dir.path().to_owned(),
        _dir: dir,
        pki,
        ports,
        hub,
        ca,
    }
}

impl Hub {
    fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.pki.path("ca.pem")).unwrap()
    }

    /// A client presenting a valid certificate for `member`.
    fn client(&self, member: &str) -> quinn::ClientConfig {
        let validity = Validity::starting(OffsetDateTime::now_utc(), time::Duration::hours(1));
        let cert = self.ca.issue_member(member, validity).unwrap();
        let material =
            TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, &self.ca_pem()).unwrap();
        tls::client_config(material, TransportTuning::default(), kedge_protocol::ALPN).unwrap()
    }

    /// Completes the TLS handshake from `from` as `member`.
    async fn connect(&self, from: &str, member: &str) -> Connection {
        let mut endpoint = quinn::Endpoint::client(SocketAddr::new(ip(from), 0)).unwrap();
        endpoint.set_default_client_config(self.client(member));
        let connecting = endpoint
            .connect(self.ports.quic_addr(), "localhost")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), connecting)
            .await
            .expect("handshake hung")
            .expect("handshake")
    }

    /// Sends a `Hello` with `agent_version` on a new control stream; returns the answer.
    async fn hello(&self, connection: &Connection, agent_version: &str) -> (Control, HubMessage) {
        let (send, recv) = connection.open_bi().await.unwrap();
        let mut control = Control::new(recv, send);
        control
            .send(&AgentMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                agent_version: agent_version.into(),
                kubernetes_version: "v1.33.0\r\n\u{1b}[2J".into(),
                last_applied_revision: 0,
                namespaces: vec![],
            }))
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), control.recv())
            .await
            .expect("the hub answers the Hello")
            .unwrap()
            .expect("an answer, not the end of the stream");
        (control, answer)
    }

    /// A session of `member` from `from`, welcomed.
    async fn session(&self, from: &str, member: &str) -> (Connection, Control) {
        let connection = self.connect(from, member).await;
        let (control, answer) = self.hello(&connection, "0.0.0-test").await;
        assert!(
            matches!(answer, HubMessage::Welcome(_)),
            "{member}: {answer:?}"
        );
        (connection, control)
    }

    fn log_lines(&self, needles: &[&str]) -> usize {
        self.hub
            .log_text()
            .lines()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .count()
    }

    /// Waits until the hub log has `count` lines containing every needle.
    async fn logged(&self, needles: &[&str], count: usize) {
        let what = format!("{count} hub log lines with {needles:?}");
        wait_for(Duration::from_secs(10), &what, || async {
            (self.log_lines(needles) >= count).then_some(())
        })
        .await;
    }

    /// `GET path` on the ops port with optional extra headers; (status, body).
    async fn get(&self, path: &str, headers: &str) -> (u16, String) {
        self.get_from("127.0.0.1", path, headers).await
    }

    /// [`Hub::get`] from the source address `from`.
    async fn get_from(&self, from: &str, path: &str, headers: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(ip(from), 0)).unwrap();
        let mut stream = socket
            .connect(SocketAddr::new(ip("127.0.0.1"), self.ports.ops))
            .await
            .unwrap();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, text)
    }

    /// The hub's metric `name` (summed over its labels matching `label`).
    async fn metric(&self, name: &str, label: &str) -> f64 {
        let (_, body) = self.get("/metrics", "").await;
        body.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_do_not_keep_an_agent_out() {
    let h = hub(&[
        "--max-connections",
        "4",
        "--max-handshakes",
        "12",
        "--max-handshakes-per-source",
        "6",
        // The overall and per-source limits, with the earlier timeout and no reserve for
        // known sources (handshake_fairness_e2e shows those).
        "--handshake-reserve",
        "0",
        "--handshake-timeout",
        "10s",
    ])
    .await;
    let quic = h.ports.quic_addr();
    let anonymous = || {
        tls::anonymous_client_config(
            &tls::load_certs(std::path::Path::new(&h.pki.path("ca.pem"))).unwrap(),
        )
        .unwrap()
    };
    // Spoofed sources never answer the Retry: 50 of them hold nothing.
    let spoofed: Vec<Stalled> = (0..50)
        .map(|_| stall(quic, "127.0.0.4", false, anonymous()))
        .collect();
    // Sources that answer the Retry and then fall silent mid-TLS: 6 hold a handshake each,
    // the per-source limit refuses the rest.
    let started = Instant::now();
    let stalled: Vec<Stalled> = (0..8)
        .map(|_| stall(quic, "127.0.0.2", true, anonymous()))
        .collect();
    h.logged(
        &[
            "kedge::audit",
            "TLS handshake refused",
            "source_handshake_limit",
        ],
        1,
    )
    .await;
    // Refused attempts are counted one by one, logged once a second.
    let refused = wait_for(Duration::from_secs(5), "2 refused handshakes", || async {
        let n = h
            .metric(
                "kedge_hub_handshake_failures_total",
                "source_handshake_limit",
            )
            .await;
        (n >= 2.0).then_some(n)
    })
    .await;
    assert_eq!(refused, 2.0, "6 of 8 held a handshake");
    // Peers with valid certificates that finish TLS and never say Hello.
    let mut silent = Vec::new();
    for i in 0..4 {
        silent.push(h.connect("127.0.0.3", &format!("lurker-{i}")).await);
    }

    // The agent gets in, long before any of them times out.
    let clusters = start_clusters(&h.dir, &["good"]).await;
    let _agent = start_agent(&h.pki, "good", h.ports, h.dir.join("good.log"));
    wait_for_states(h.ports, &["good"], "Connected", Duration::from_secs(8)).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        h.log_lines(&["timed out"]),
        0,
        "the stalled handshakes were still in progress"
    );
    assert!(h.metric("kedge_hub_retries_total", "").await >= 58.0);

    // Established sessions are what --max-connections bounds: 3 more fit, a 5th does not.
    let mut sessions = Vec::new();
    for member in ["s1", "s2", "s3"] {
        sessions.push(h.session("127.0.0.1", member).await);
    }
    let extra = h.connect("127.0.0.1", "s4").await;
    let (_control, answer) = h.hello(&extra, "0.0.0-test").await;
    let HubMessage::Refused(refusal) = answer else {
        panic!("expected a refusal at the session limit, got {answer:?}")
    };
    assert_eq!(refusal.code, RefusalCode::Unavailable);
    assert!(refusal.message.contains("--max-connections"), "{refusal:?}");
    h.logged(&["kedge::audit", "session refused", "session_limit"], 1)
        .await;
    // The same member reconnecting takes the place of its own previous session.
    let (again, _) = h.session("127.0.0.1", "s1").await;
    again.close(0u32.into(), b"done");
    drop((spoofed, stalled, silent, clusters));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_stream_and_datagrams_get_no_credit() {
    let h = hub(&[]).await;
    let (connection, _control) = h.session("127.0.0.1", "streamer").await;
    // The heartbeat stream is the second and last one.
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut beats = Control::new(recv, send);
    beats
        .send(&AgentMessage::Heartbeat(Heartbeat {
            seq: 1,
            sent_unix_ms: 0,
        }))
        .await
        .unwrap();
    let ack = tokio::time::timeout(Duration::from_secs(5), beats.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ack, Some(HubMessage::HeartbeatAck(_))), "{ack:?}");
    // A third bidirectional stream, any unidirectional one: no credit.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), connection.open_bi())
            .await
            .is_err(),
        "a third stream was granted"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(1), connection.open_uni())
            .await
            .is_err(),
        "a unidirectional stream was granted"
    );
    // Datagrams: the hub advertises none.
    assert_eq!(connection.max_datagram_size(), None);
    assert!(
        connection
            .send_datagram(bytes::Bytes::from_static(b"x"))
            .is_err()
    );
    assert!(
        connection.close_reason().is_none(),
        "the session is still up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_text_is_cut_and_cleaned_before_anyone_sees_it() {
    let h = hub(&[]).await;
    let version = format!("1.0.0\u{1b}]0;pwned\u{7}\n\u{202E}{}", "x".repeat(5000));
    let connection = h.connect("127.0.0.1", "dirty").await;
    let (_control, answer) = h.hello(&connection, &version).await;
    assert!(matches!(answer, HubMessage::Welcome(_)), "{answer:?}");
    let sessions = wait_for_states(h.ports, &["dirty"], "Connected", Duration::from_secs(5)).await;
    let dirty = state_of(&sessions, "dirty").unwrap();
    let shown = dirty["agentVersion"].as_str().unwrap();
    assert!(shown.starts_with("1.0.0]0;pwned xxx"), "{shown}");
    assert!(
        shown.len() <= kedge_protocol::MAX_TEXT_BYTES,
        "{}",
        shown.len()
    );
    assert!(shown.ends_with('\u{2026}'), "{shown}");
    assert!(
        !shown.chars().any(|c| c.is_control() || c == '\u{202E}'),
        "{shown:?}"
    );
    assert_eq!(dirty["kubernetesVersion"], "v1.33.0  [2J");
    // Nor in the hub's log.
    let log = h.hub.log_text();
    assert!(
        !log.contains('\u{1b}') && !log.contains('\u{202E}'),
        "raw agent text in the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_session_listing_is_served_to_127_0_0_1_only() {
    let h = hub(&[]).await;
    let (_connection, _control) = h.session("127.0.0.1", "listed").await;
    // From 127.0.0.1 (a process in the pod, kubectl port-forward): served, also to the CLI.
    let sessions = sessions(h.ports)
        .await
        .expect("kubectl kedge sessions from 127.0.0.1");
    assert!(state_of(&sessions, "listed").is_some(), "{sessions:?}");
    assert_eq!(h.get("/v1/sessions/listed", "").await.0, 200);
    // From elsewhere in 127.0.0.0/8 (where in-pod proxies forward outside traffic from):
    // refused, saying what to do, whatever it presents.
    for path in ["/v1/sessions", "/v1/sessions/listed"] {
        let (status, body) = h
            .get_from(
                "127.0.0.6",
                path,
                "Authorization: Bearer anything-at-all-0123\r\n",
            )
            .await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.contains("--ops-token-file") && body.contains("port-forward"),
            "{body}"
        );
    }
    // Metrics and probes stay open to any peer.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(h.get_from("127.0.0.6", path, "").await.0, 200, "{path}");
    }
    h.logged(&["kedge::audit", "ops request refused", "not_loopback"], 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_listing_needs_the_ops_token_when_one_is_set() {
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("ops-token");
    std::fs::write(&token_file, "kedge-test-token-0123456789abcdef\n").unwrap();
    let token_arg = token_file.display().to_string();
    let h = hub(&["--ops-token-file", &token_arg]).await;
    let (_connection, _control) = h.session("127.0.0.1", "listed").await;

    let ops_url = h.ports.ops_url();
    let kubectl_kedge = |extra: &[&str]| {
        let mut command = tokio::process::Command::new(bin("kubectl-kedge"));
        command
            .args(["sessions", "-o", "json", "--hub", &ops_url])
            .args(extra)
            .env_remove("KEDGE_HUB_OPS_TOKEN_FILE");
        async move { command.output().await }
    };
    // Without the token, even from loopback: refused, saying what to do.
    let out = kubectl_kedge(&[]).await.unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("401") && error.contains("--token-file"),
        "{error}"
    );
    // With the wrong one: refused.
    let wrong = token_dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-token-0123456789abcdef").unwrap();
    let out = kubectl_kedge(&["--token-file", wrong.to_str().unwrap()])
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not match"));
    // With it: served.
    let out = kubectl_kedge(&["--token-file", &token_arg]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sessions: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(state_of(&sessions, "listed").is_some(), "{sessions:?}");
    // One member's entry is guarded the same way.
    let (status, _) = h.get("/v1/sessions/listed", "").await;
    assert_eq!(status, 401);
    let (status, _) = h
        .get(
            "/v1/sessions/listed",
            "Authorization: Bearer kedge-test-token-0123456789abcdef\r\n",
        )
        .await;
    assert_eq!(status, 200);
    // Metrics and probes stay open.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(h.get(path, "").await.0, 200, "{path}");
    }
    h.logged(&["kedge::audit", "ops request refused", "missing_token"], 1)
        .await;
    h.logged(&["kedge::audit", "ops request refused", "wrong_token"], 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_an_audit_line_with_a_distinct_reason() {
    let h = hub(&[]).await;
    let now = OffsetDateTime::now_utc();
    let ca_pem = h.ca_pem();
    let config = |issuer: &CertificateAuthority, validity: Validity| {
        let cert = issuer.issue_member("intruder", validity).unwrap();
        let material = TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, &ca_pem).unwrap();
        tls::client_config(material, TransportTuning::default(), kedge_protocol::ALPN).unwrap()
    };
    let other_ca = CertificateAuthority::generate(
        "another CA",
        Validity::starting(now, time::Duration::days(1)),
    )
    .unwrap();
    let expired = Validity {
        not_before: now - time::Duration::hours(3),
        not_after: now - time::Duration::hours(1),
    };
    let anonymous = tls::anonymous_client_config(
        &tls::load_certs(std::path::Path::new(&h.pki.path("ca.pem"))).unwrap(),
    )
    .unwrap();
    for (client, reason) in [
        (
            config(&other_ca, Validity::starting(now, time::Duration::hours(1))),
            "unknown_ca",
        ),
        (config(&h.ca, expired), "certificate_expired"),
        (anonymous, "certificate_required"),
    ] {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(client);
        let connecting = endpoint.connect(h.ports.quic_addr(), "localhost").unwrap();
        if let Ok(Ok(connection)) = tokio::time::timeout(Duration::from_secs(10), connecting).await
        {
            let _ = tokio::time::timeout(Duration::from_secs(10), connection.closed()).await;
        }
        h.logged(&["kedge::audit", "TLS handshake refused", reason], 1)
            .await;
    }
    // A peer that finishes TLS and sends something other than a Hello.
    let connection = h.connect("127.0.0.1", "rude").await;
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut control = Control::new(recv, send);
    control
        .send(&AgentMessage::Heartbeat(Heartbeat {
            seq: 1,
            sent_unix_ms: 0,
        }))
        .await
        .unwrap();
    h.logged(
        &["kedge::audit", "session refused", "unexpected_message"],
        1,
    )
    .await;
}

/// An agent that stops reading gets its session closed once a message to it waits longer than
/// the send timeout: the hub's server run in-process (to shorten the timeout), over real QUIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_reading_is_closed_not_waited_for() {
    use kedge_hub::fleet::Fleet;
    use kedge_hub::metrics::HubMetrics;
    use kedge_hub::registry::{Liveness, SessionRegistry, SessionState};
    use kedge_hub::server::{ServerContext, ServerLimits, serve};
    use kedge_protocol::{StatusReport, WorkloadRef, WorkloadReplicas};

    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["deaf"]).await;
    let material = TlsMaterial::from_files(
        std::path::Path::new(&pki.path("hub.pem")),
        std::path::Path::new(&pki.path("hub-key.pem")),
        std::path::Path::new(&pki.path("ca.pem")),
    )
    .unwrap();
    let endpoint = quinn::Endpoint::server(
        tls::server_config(material, TransportTuning::default()).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let quic = endpoint.local_addr().unwrap();
    let metrics = HubMetrics::default();
    let liveness = Liveness {
        interval: Duration::from_secs(1),
        tolerance: 100,
    };
    let fleet = Arc::new(Fleet::new(Arc::new(SessionRegistry::new(
        liveness,
        metrics.clone(),
    ))));
    let limits = ServerLimits {
        send_timeout: Duration::from_millis(500),
        ..ServerLimits::default()
    };
    let ctx = Arc::new(ServerContext::new(fleet.clone(), metrics, limits));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(serve(endpoint, ctx, shutdown.clone()));

    let ca = CertificateAuthority::from_pem(
        &std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        &std::fs::read_to_string(pki.path("ca-key.pem")).unwrap(),
    )
    .unwrap();
    let cert = ca
        .issue_member(
            "deaf",
            Validity::starting(OffsetDateTime::now_utc(), time::Duration::hours(1)),
        )
        .unwrap();
    let ca_pem = std::fs::read_to_string(pki.path("ca.pem")).unwrap();
    let material = TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, &ca_pem).unwrap();
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    client.set_default_client_config(
        tls::client_config(material, TransportTuning::default(), kedge_protocol::ALPN).unwrap(),
    );
    let connection = client.connect(quic, "localhost").unwrap().await.unwrap();
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut control = Control::new(recv, send);
    control
        .send(&AgentMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_version: "0.0.0-test".into(),
            kubernetes_version: String::new(),
            last_applied_revision: 0,
            namespaces: vec![],
        }))
        .await
        .unwrap();
    let welcome = control.recv().await.unwrap();
    assert!(
        matches!(welcome, Some(HubMessage::Welcome(_))),
        "{welcome:?}"
    );
    control
        .send(&AgentMessage::Report(StatusReport {
            full: true,
            ..StatusReport::default()
        }))
        .await
        .unwrap();
    let session = wait_for(Duration::from_secs(5), "the first report", || async {
        fleet
            .member("deaf")
            .filter(|m| m.session_reported)
            .and_then(|m| m.session)
            .map(|s| s.session_id.clone())
    })
    .await;

    // From here on the agent reads nothing: a desired state larger than the flow-control
    // windows cannot be taken.
    let workloads: Vec<WorkloadReplicas> = (0..12_000)
        .map(|i| WorkloadReplicas {
            workload: WorkloadRef::deployment("default", format!("{i:0>100}")),
            replicas: Some(1),
            owner: "default/big".into(),
        })
        .collect();
    let started = Instant::now();
    fleet.set_workloads("deaf", &session, "default/big", workloads);
    let closed = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .expect("the hub closed the deaf agent's session");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "closed before the send timeout: {closed}"
    );
    assert!(closed.to_string().contains("took no data"), "{closed}");
    let view = fleet.registry().get("deaf").unwrap();
    assert_eq!(view.state, SessionState::Unreachable);
    assert!(view.reason.contains("took no data"), "{}", view.reason);
    shutdown.cancel();
    server.await.unwrap();
}
