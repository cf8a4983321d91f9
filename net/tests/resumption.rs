//! A reconnect with the same client configuration resumes the TLS session (rustls says so in
//! its log: "Resuming using PSK"): neither side signs or verifies a certificate again, and it
//! costs about the bytes of the first (QUIC pads both handshakes' first datagrams alike). Real QUIC and TLS on loopback, with the configurations
//! kedge's hub and agent use.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::Duration;

use kedge_net::pki::{CertificateAuthority, Validity};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use time::OffsetDateTime;

/// What rustls's TLS 1.3 client logs.
static CLIENT_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target() == "rustls::client::tls13"
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            CLIENT_LOG.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Whether rustls resumed since the last call.
fn resumed() -> bool {
    let mut log = CLIENT_LOG.lock().unwrap();
    let resumed = log.iter().any(|line| line.contains("Resuming using PSK"));
    log.clear();
    resumed
}

/// Bytes both ways of one connection: its handshake, a byte each way, and what the server
/// sends after the handshake (its session ticket).
async fn connect_once(endpoint: &quinn::Endpoint, server: &quinn::Endpoint) -> u64 {
    let addr = server.local_addr().unwrap();
    let connecting = endpoint.connect(addr, "localhost").unwrap();
    let (client, accepted) = tokio::join!(connecting, async {
        server.accept().await.unwrap().await.unwrap()
    });
    let client = client.unwrap();
    let (mut send, mut recv) = client.open_bi().await.unwrap();
    send.write_all(b"x").await.unwrap();
    let (mut s_send, mut s_recv) = accepted.accept_bi().await.unwrap();
    let mut byte = [0u8; 1];
    s_recv.read_exact(&mut byte).await.unwrap();
    s_send.write_all(b"y").await.unwrap();
    recv.read_exact(&mut byte).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The hub identifies the member by the client certificate, resumed or not.
    let identity = accepted
        .peer_identity()
        .and_then(|any| {
            any.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .expect("the server sees the client's certificate");
    assert_eq!(identity.len(), 1, "the member certificate");
    let stats = client.stats();
    client.close(0u32.into(), b"done");
    accepted.closed().await;
    stats.udp_tx.bytes + stats.udp_rx.bytes
}

#[tokio::test]
async fn a_reconnect_resumes_the_tls_session_at_about_the_same_bytes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    log::set_logger(&Recorder).unwrap();
    log::set_max_level(log::LevelFilter::Debug);
    let now = OffsetDateTime::now_utc();
    let year = time::Duration::days(365);
    let ca = CertificateAuthority::generate("test-ca", Validity::starting(now, year)).unwrap();
    let hub = ca
        .issue_server(&["localhost".to_owned()], Validity::issued(now, year))
        .unwrap();
    let member = ca
        .issue_member("edge-1", Validity::issued(now, year))
        .unwrap();
    let hub = TlsMaterial::from_pem(&hub.cert_pem, &hub.key_pem, ca.cert_pem()).unwrap();
    let hub = tls::server_config(hub, TransportTuning::hub(Duration::from_secs(3))).unwrap();
    let server = quinn::Endpoint::server(hub, "127.0.0.1:0".parse().unwrap()).unwrap();
    // A fresh client configuration (an empty session cache), as a restarted agent has.
    let fresh = || {
        let material =
            TlsMaterial::from_pem(&member.cert_pem, &member.key_pem, ca.cert_pem()).unwrap();
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(
            tls::client_config(material, TransportTuning::agent(), kedge_protocol::ALPN).unwrap(),
        );
        endpoint
    };

    // Three full handshakes and three resumed ones; the fewest bytes of each, since a busy
    // machine can add a retransmitted or ACK-only datagram to any one connection.
    let endpoint = fresh();
    let mut full = vec![connect_once(&endpoint, &server).await];
    assert!(!resumed(), "the first connection has no session to resume");
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(connect_once(&endpoint, &server).await);
        assert!(
            resumed(),
            "a reconnect with the same configuration resumes a session"
        );
    }
    for _ in 0..2 {
        full.push(connect_once(&fresh(), &server).await);
        assert!(!resumed(), "a fresh configuration has no session to resume");
    }
    println!("full handshakes: {full:?} bytes; resumed: {again:?} bytes");
    let (full, again) = (
        full.into_iter().min().unwrap(),
        again.into_iter().min().unwrap(),
    );
    // The same datagrams, padded alike; a byte or two moves with varint lengths.
    assert!(again <= full + 64, "resumed {again} B, full {full} B");

    // Another configuration (a renewed certificate) does not resume a session of the old one.
    let other = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let renewed = ca
        .issue_member("edge-1", Validity::issued(now, year))
        .unwrap();
    let renewed =
        TlsMaterial::from_pem(&renewed.cert_pem, &renewed.key_pem, ca.cert_pem()).unwrap();
    let mut other = other;
    other.set_default_client_config(
        tls::client_config(renewed, TransportTuning::agent(), kedge_protocol::ALPN).unwrap(),
    );
    connect_once(&other, &server).await;
    assert!(
        !resumed(),
        "a new configuration starts with a full handshake"
    );
}
