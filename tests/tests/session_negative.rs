//! Hostile and broken peers against the real hub: each is refused with a clear logged reason,
//! and the hub keeps serving the agent that behaves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kedge_net::pki::{CertificateAuthority, Validity};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kedge_protocol::{
    AgentMessage, FramedStream, Hello, HubMessage, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
    RefusalCode, close_code,
};
use quinn::{Connection, ConnectionError};
use support::*;
use time::OffsetDateTime;

struct Fixture {
    _clusters: kedge_sim::Sim,
    _dir: tempfile::TempDir,
    pki: Pki,
    ports: HubPorts,
    hub: Proc,
    _agent: Proc,
    ca: CertificateAuthority,
}

async fn fixture() -> Fixture {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["good"]).await;
    let clusters = start_clusters(dir.path(), &["good"]).await;
    let ports = HubPorts::new();
    let hub = start_hub(&pki, ports, "200ms", dir.path().join("hub.log"));
    let agent = start_agent(&pki, "good", ports, dir.path().join("good.log"));
    wait_for_states(ports, &["good"], "Connected", Duration::from_secs(20)).await;
    let ca = CertificateAuthority::from_pem(
        &std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        &std::fs::read_to_string(pki.path("ca-key.pem")).unwrap(),
    )
    .unwrap();
    Fixture {
        _clusters: clusters,
        _dir: dir,
        pki,
        ports,
        hub,
        _agent: agent,
        ca,
    }
}

impl Fixture {
    fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.pki.path("ca.pem")).unwrap()
    }

    /// A client config presenting a certificate for `member` issued by `issuer`.
    fn client(
        &self,
        issuer: &CertificateAuthority,
        member: &str,
        validity: Validity,
        alpn: &[u8],
    ) -> quinn::ClientConfig {
        let cert = issuer.issue_member(member, validity).unwrap();
        let material =
            TlsMaterial::from_pem(&cert.cert_pem, &cert.key_pem, &self.ca_pem()).unwrap();
        tls::client_config(material, TransportTuning::default(), alpn).unwrap()
    }

    fn good_client(&self, member: &str) -> quinn::ClientConfig {
        self.client(&self.ca, member, valid_now(), kedge_protocol::ALPN)
    }

    /// Connects and waits until the connection is closed; returns the error that closed it.
    async fn rejected(&self, config: quinn::ClientConfig) -> ConnectionError {
        let connection = match self.connect(config).await {
            Err(e) => return e,
            Ok(connection) => connection,
        };
        // TLS 1.3 clients finish before the server has checked their certificate: the refusal
        // arrives as the connection's close.
        tokio::time::timeout(Duration::from_secs(10), connection.closed())
            .await
            .expect("hub never closed")
    }

    async fn connect(&self, config: quinn::ClientConfig) -> Result<Connection, ConnectionError> {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(config);
        let connecting = endpoint
            .connect(self.ports.quic_addr(), "localhost")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), connecting)
            .await
            .expect("handshake hung")
    }

    /// Waits until the hub log has a line containing every needle.
    async fn hub_logged(&self, needles: &[&str]) {
        let what = format!(
            "hub log line with {needles:?}; log so far:\n{}",
            self.hub.log_text()
        );
        wait_for(Duration::from_secs(5), &what, || async {
            self.hub
                .log_text()
                .lines()
                .any(|line| needles.iter().all(|n| line.contains(n)))
                .then_some(())
        })
        .await;
    }

    /// The well-behaved agent is still connected and a fresh session still works.
    async fn still_serving(&self) {
        let sessions = sessions(self.ports).await.expect("hub answers");
        assert_eq!(
            state_of(&sessions, "good").unwrap()["state"],
            "Connected",
            "{sessions:#?}"
        );
        let connection = self
            .connect(self.good_client("probe-ok"))
            .await
            .expect("handshake");
        let (mut control, welcome) = hello(&connection, PROTOCOL_VERSION).await;
        let Some(HubMessage::Welcome(w)) = welcome else {
            panic!("expected Welcome, got {welcome:?}")
        };
        assert_eq!(w.member, "probe-ok");
        control.finish().await.unwrap();
        connection.close(0u32.into(), b"done");
    }
}

fn valid_now() -> Validity {
    Validity::starting(OffsetDateTime::now_utc(), time::Duration::hours(1))
}

type Control = FramedStream<quinn::RecvStream, quinn::SendStream, HubMessage, AgentMessage>;

async fn hello(connection: &Connection, version: u16) -> (Control, Option<HubMessage>) {
    let (send, recv) = connection.open_bi().await.unwrap();
    let mut control = Control::new(recv, send);
    control
        .send(&AgentMessage::Hello(Hello {
            protocol_version: version,
            agent_version: "9.9.9-test".into(),
            kubernetes_version: String::new(),
            last_applied_revision: 0,
            namespaces: vec![],
        }))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), control.recv())
        .await
        .unwrap()
        .unwrap();
    (control, answer)
}

fn assert_tls_alert(error: &ConnectionError, alert: u64, what: &str) {
    let code = match error {
        ConnectionError::TransportError(e) => u64::from(e.code),
        ConnectionError::ConnectionClosed(c) => u64::from(c.error_code),
        other => panic!("{what}: expected a TLS alert, got {other}"),
    };
    assert_eq!(code, 0x100 + alert, "{what}: {error}");
}

fn assert_app_close(error: &ConnectionError, code: u32, reason_part: &str) {
    let ConnectionError::ApplicationClosed(close) = error else {
        panic!("expected an application close, got {error}")
    };
    assert_eq!(close.error_code, quinn::VarInt::from_u32(code), "{error}");
    let reason = String::from_utf8_lossy(&close.reason);
    assert!(
        reason.contains(reason_part),
        "close reason {reason:?} lacks {reason_part:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_from_another_ca_is_refused() {
    let f = fixture().await;
    let other = CertificateAuthority::generate("impostor CA", valid_now()).unwrap();
    let error = f
        .rejected(f.client(&other, "impostor", valid_now(), kedge_protocol::ALPN))
        .await;
    assert_tls_alert(&error, 48, "unknown CA"); // unknown_ca
    f.hub_logged(&["TLS handshake refused", "unknown_ca"]).await;
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_client_certificate_is_refused() {
    let f = fixture().await;
    let trusted = kedge_net::tls::load_certs(std::path::Path::new(&f.pki.path("ca.pem"))).unwrap();
    let error = f
        .rejected(tls::anonymous_client_config(&trusted).unwrap())
        .await;
    assert_tls_alert(&error, 116, "no certificate"); // certificate_required
    f.hub_logged(&["TLS handshake refused", "certificate_required"])
        .await;
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_client_certificate_is_refused() {
    let f = fixture().await;
    let now = OffsetDateTime::now_utc();
    let expired = Validity {
        not_before: now - time::Duration::days(2),
        not_after: now - time::Duration::days(1),
    };
    let error = f
        .rejected(f.client(&f.ca, "stale", expired, kedge_protocol::ALPN))
        .await;
    assert_tls_alert(&error, 45, "expired"); // certificate_expired
    f.hub_logged(&["TLS handshake refused", "certificate_expired"])
        .await;
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_alpn_is_refused() {
    let f = fixture().await;
    let error = f
        .rejected(f.client(&f.ca, "old-agent", valid_now(), b"kedge/0"))
        .await;
    assert_tls_alert(&error, 120, "ALPN"); // no_application_protocol
    f.hub_logged(&["TLS handshake refused", "no_application_protocol"])
        .await;
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_version_mismatch_is_refused_with_a_reason() {
    let f = fixture().await;
    let connection = f.connect(f.good_client("future-agent")).await.unwrap();
    let (_control, answer) = hello(&connection, PROTOCOL_VERSION + 98).await;
    let Some(HubMessage::Refused(refusal)) = answer else {
        panic!("expected Refused, got {answer:?}")
    };
    assert_eq!(refusal.code, RefusalCode::UnsupportedVersion);
    assert!(
        refusal
            .message
            .contains(&format!("protocol version {}", PROTOCOL_VERSION + 98)),
        "{}",
        refusal.message
    );
    assert_eq!(
        (refusal.min_protocol_version, refusal.max_protocol_version),
        (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
    );
    connection.close(close_code::REFUSED.into(), b"ok");
    f.hub_logged(&["session refused", "future-agent", "protocol version"])
        .await;
    let sessions = sessions(f.ports).await.unwrap();
    assert!(
        state_of(&sessions, "future-agent").is_none(),
        "a refused member was registered"
    );
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_closes_only_that_session() {
    let f = fixture().await;
    let connection = f.connect(f.good_client("bloater")).await.unwrap();
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    // Announce a 64 MiB frame; the hub must refuse it from the prefix alone.
    send.write_all(&(64u32 << 20).to_be_bytes()).await.unwrap();
    // The hub may already have closed the connection: the write may fail.
    let _ = send.write_all(&[0u8; 1024]).await;
    let error = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .unwrap();
    assert_app_close(&error, close_code::PROTOCOL_ERROR, "exceeds");
    f.hub_logged(&["bad frame from agent", "bloater", "oversized"])
        .await;
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_close_only_that_session() {
    let f = fixture().await;
    // Deterministic pseudo-random bytes (xorshift), framed with a plausible length so that
    // they reach the message decoder.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let garbage: Vec<u8> = (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 0x80 // high bit set: never a valid postcard varint end
        })
        .collect();
    let connection = f.connect(f.good_client("noisy")).await.unwrap();
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    let mut frame = (garbage.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&garbage);
    send.write_all(&frame).await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .unwrap();
    assert_app_close(&error, close_code::PROTOCOL_ERROR, "undecodable");
    f.hub_logged(&["bad frame from agent", "noisy", "undecodable"])
        .await;

    // Unframed garbage on a stream is refused the same way.
    let connection = f.connect(f.good_client("noisier")).await.unwrap();
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    let _ = send.write_all(&[0xff; 512]).await;
    let error = tokio::time::timeout(Duration::from_secs(10), connection.closed())
        .await
        .unwrap();
    assert_app_close(&error, close_code::PROTOCOL_ERROR, "bad frame");
    f.still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_session_replaces_the_old_one() {
    let f = fixture().await;
    let config = f.good_client("twin");
    let first = f.connect(config.clone()).await.unwrap();
    let (_c1, w1) = hello(&first, PROTOCOL_VERSION).await;
    assert!(matches!(w1, Some(HubMessage::Welcome(_))));
    let second = f.connect(config).await.unwrap();
    let (_c2, w2) = hello(&second, PROTOCOL_VERSION).await;
    let Some(HubMessage::Welcome(w2)) = w2 else {
        panic!("{w2:?}")
    };
    let error = tokio::time::timeout(Duration::from_secs(10), first.closed())
        .await
        .unwrap();
    assert_app_close(&error, close_code::REPLACED, "replaced");
    let sessions = sessions(f.ports).await.unwrap();
    let twin = state_of(&sessions, "twin").unwrap();
    assert_eq!(twin["sessionId"], w2.session_id.as_str());
    assert_eq!(twin["sessions"], 2);
    assert!(
        second.close_reason().is_none(),
        "the newer session must survive"
    );
    let _ = Arc::new(second);
}
