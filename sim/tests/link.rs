//! The link emulator over real UDP on 127.0.0.1: an echo server upstream that answers with
//! the sender's address, and real QUIC (quinn) through it. Time bounds are lower bounds
//! with generous upper ones: the machine is shared.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kedge_sim::link::{DirectionStats, LinkEmulator, LinkSpec};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long to wait for a reply that should come.
const WAIT: Duration = Duration::from_secs(2);
/// How long to wait before concluding a reply will not come.
const SILENCE: Duration = Duration::from_millis(300);

fn spec(text: &str) -> LinkSpec {
    text.parse().expect("valid spec")
}

/// An upstream that answers every datagram with the payload, `|`, and the sender's address.
async fn echo_server() -> io::Result<(SocketAddr, CancellationToken)> {
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    let addr = sock.local_addr()?;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        loop {
            let (n, from) = tokio::select! {
                () = stop.cancelled() => return,
                r = sock.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
            };
            let mut reply = buf.get(..n).unwrap_or_default().to_vec();
            reply.extend_from_slice(format!("|{from}").as_bytes());
            let _ = sock.send_to(&reply, from).await;
        }
    });
    Ok((addr, cancel))
}

async fn client() -> io::Result<UdpSocket> {
    UdpSocket::bind("127.0.0.1:0").await
}

/// Sends `msg` to the emulator and waits up to `wait` for the reply.
async fn round_trip(c: &UdpSocket, to: SocketAddr, msg: &str, wait: Duration) -> Option<String> {
    c.send_to(msg.as_bytes(), to).await.ok()?;
    let mut buf = vec![0u8; 2048];
    match tokio::time::timeout(wait, c.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) => Some(String::from_utf8_lossy(buf.get(..n)?).into_owned()),
        _ => None,
    }
}

/// The sender address the echo server reported.
fn seen_from(reply: &str) -> Option<SocketAddr> {
    reply.rsplit('|').next()?.parse().ok()
}

async fn setup(text: &str) -> io::Result<(LinkEmulator, CancellationToken)> {
    let (upstream, stop) = echo_server().await?;
    Ok((LinkEmulator::start(spec(text), upstream).await?, stop))
}

/// Every datagram received is accounted for once nothing is on its way.
fn adds_up(d: &DirectionStats) -> bool {
    d.in_flight() == 0 && d.received == d.packets + d.lost + d.blacked_out + d.queue_full + d.unsent
}

#[tokio::test]
async fn a_perfect_link_forwards_both_ways_from_one_upstream_address() -> io::Result<()> {
    let (link, stop) = setup("rtt=0s").await?;
    assert!(link.local_addr().ip().is_loopback());
    assert_eq!(link.upstream_addr(), None);
    let c = client().await?;
    let r1 = round_trip(&c, link.local_addr(), "a1", WAIT)
        .await
        .expect("reply");
    let r2 = round_trip(&c, link.local_addr(), "a2", WAIT)
        .await
        .expect("reply");
    assert!(r1.starts_with("a1|"), "{r1}");
    assert_eq!(seen_from(&r1), seen_from(&r2));
    assert_eq!(seen_from(&r1), link.upstream_addr());
    let s = link.stats();
    assert_eq!((s.to_hub.packets, s.to_agent.packets, s.rebinds), (2, 2, 0));
    assert_eq!(s.to_hub.bytes, 4);
    assert!(adds_up(&s.to_hub) && adds_up(&s.to_agent), "{s:?}");
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn rtt_adds_the_round_trip_and_set_spec_takes_it_away() -> io::Result<()> {
    let (link, stop) = setup("rtt=400ms").await?;
    let c = client().await?;
    let start = Instant::now();
    assert!(
        round_trip(&c, link.local_addr(), "slow", Duration::from_secs(5))
            .await
            .is_some()
    );
    let rtt = start.elapsed();
    assert!(
        (Duration::from_millis(400)..Duration::from_secs(3)).contains(&rtt),
        "{rtt:?}"
    );

    link.set_spec(spec("rtt=200ms,jitter=100ms,seed=1"));
    for _ in 0..5 {
        let start = Instant::now();
        assert!(
            round_trip(&c, link.local_addr(), "j", Duration::from_secs(5))
                .await
                .is_some()
        );
        let rtt = start.elapsed();
        // Each way within 100 ms ± 50 ms: the round trip within 200 ms ± 100 ms.
        assert!(rtt >= Duration::from_millis(100), "{rtt:?}");
    }
    link.set_spec(LinkSpec::default());
    let start = Instant::now();
    assert!(
        round_trip(&c, link.local_addr(), "fast", WAIT)
            .await
            .is_some()
    );
    assert!(start.elapsed() < Duration::from_millis(400));
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn loss_drops_about_the_percent_each_way() -> io::Result<()> {
    let (link, stop) = setup("loss=5,seed=11").await?;
    let c = client().await?;
    const N: u64 = 2000;
    let mut buf = vec![0u8; 2048];
    let mut got = 0u64;
    for batch in 0..N / 50 {
        for i in 0..50 {
            c.send_to(format!("p{batch}-{i}").as_bytes(), link.local_addr())
                .await?;
        }
        // Drain the replies, so no socket buffer overflows.
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(30), c.recv_from(&mut buf)).await
        {
            got += 1;
        }
    }
    // Until every echo has come back through (or a generous deadline: the machine is shared).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        while let Ok(Ok(_)) = tokio::time::timeout(SILENCE, c.recv_from(&mut buf)).await {
            got += 1;
        }
        let s = link.stats();
        let settled = s.to_agent.received == s.to_hub.packets && s.to_agent.packets == got;
        if settled || Instant::now() > deadline {
            break;
        }
    }
    let s = link.stats();
    assert_eq!(s.to_hub.received, N, "{s:?}");
    assert!((60..=140).contains(&s.to_hub.lost), "{s:?}");
    assert_eq!(s.to_agent.received, N - s.to_hub.lost, "{s:?}");
    assert!((55..=135).contains(&s.to_agent.lost), "{s:?}");
    assert_eq!(got, s.to_agent.packets);
    assert!(adds_up(&s.to_hub) && adds_up(&s.to_agent), "{s:?}");
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn the_same_seed_loses_the_same_datagrams() -> io::Result<()> {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (link, stop) = setup("loss=30,seed=5").await?;
        let c = client().await?;
        for i in 0..40 {
            c.send_to(format!("{i}").as_bytes(), link.local_addr())
                .await?;
        }
        let mut buf = vec![0u8; 2048];
        let mut answered = std::collections::BTreeSet::new();
        while let Ok(Ok((n, _))) = tokio::time::timeout(SILENCE, c.recv_from(&mut buf)).await {
            let reply = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
            answered.insert(reply.split('|').next().unwrap_or_default().to_owned());
        }
        runs.push(answered);
        stop.cancel();
    }
    assert_eq!(runs[0], runs[1]);
    assert!((5..=35).contains(&runs[0].len()), "{:?}", runs[0]);
    Ok(())
}

#[tokio::test]
async fn rate_limits_throughput() -> io::Result<()> {
    // 400 kbit/s: 40 datagrams of 1000 bytes (320 kbit) take at least 0.8 s.
    let (link, stop) = setup("rate=400kbit").await?;
    let c = client().await?;
    let start = Instant::now();
    for i in 0..40u8 {
        c.send_to(&[i; 1000], link.local_addr()).await?;
    }
    let mut buf = vec![0u8; 2048];
    let mut got = 0;
    while got < 40 {
        tokio::time::timeout(Duration::from_secs(5), c.recv_from(&mut buf)).await??;
        got += 1;
    }
    let took = start.elapsed();
    assert!(
        (Duration::from_millis(780)..Duration::from_secs(4)).contains(&took),
        "{took:?}"
    );
    let s = link.stats();
    assert_eq!(
        (s.to_hub.packets, s.to_hub.bytes, s.to_hub.queue_full),
        (40, 40_000, 0)
    );
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn a_full_rate_queue_drops_the_tail() -> io::Result<()> {
    // 1 kbit/s: a 1200-byte datagram takes 9.6 s, so 54 fill the 64 KiB queue.
    let (link, stop) = setup("rate=1kbit").await?;
    let c = client().await?;
    for i in 0..70u8 {
        c.send_to(&[i; 1200], link.local_addr()).await?;
    }
    let deadline = Instant::now() + WAIT;
    while link.stats().to_hub.received < 70 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = link.stats().to_hub;
    assert_eq!(
        (s.received, s.queue_full, s.in_flight()),
        (70, 16, 54),
        "{s:?}"
    );
    assert_eq!(s.packets, 0, "the first is through after 9.6 s, not yet");
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn blackout_drops_in_the_down_phase_only() -> io::Result<()> {
    let start = Instant::now();
    // Up for the first second, down for the next, and again.
    let (link, stop) = setup("blackout=1s/2s").await?;
    let c = client().await?;
    assert!(
        round_trip(&c, link.local_addr(), "up", Duration::from_millis(500))
            .await
            .is_some()
    );
    tokio::time::sleep_until(start + Duration::from_millis(1200)).await;
    assert_eq!(
        round_trip(&c, link.local_addr(), "down", Duration::from_millis(500)).await,
        None
    );
    tokio::time::sleep_until(start + Duration::from_millis(2150)).await;
    let r = round_trip(
        &c,
        link.local_addr(),
        "up-again",
        Duration::from_millis(700),
    )
    .await;
    assert!(r.is_some_and(|r| r.starts_with("up-again|")));
    let s = link.stats();
    assert_eq!(
        (s.to_hub.blacked_out, s.to_hub.packets, s.to_agent.packets),
        (1, 2, 2),
        "{s:?}"
    );
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn partition_drops_everything_then_heals() -> io::Result<()> {
    let (link, stop) = setup("rtt=0s").await?;
    let c = client().await?;
    assert!(
        round_trip(&c, link.local_addr(), "before", WAIT)
            .await
            .is_some()
    );
    link.set_partitioned(true);
    assert_eq!(
        round_trip(&c, link.local_addr(), "during", SILENCE).await,
        None
    );
    assert_eq!(link.stats().to_hub.blacked_out, 1);
    link.set_partitioned(false);
    let r = round_trip(&c, link.local_addr(), "after", WAIT).await;
    assert!(r.is_some_and(|r| r.starts_with("after|")));
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn rebind_changes_the_address_the_upstream_sees() -> io::Result<()> {
    let (link, stop) = setup("rebind=300ms").await?;
    let c = client().await?;
    let mut seen = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1300) {
        let r = round_trip(&c, link.local_addr(), "hi", WAIT)
            .await
            .expect("reply");
        let from = seen_from(&r).expect("an address");
        if seen.last() != Some(&from) {
            seen.push(from);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.len() >= 3, "{seen:?}");
    let ports: std::collections::BTreeSet<u16> = seen.iter().map(SocketAddr::port).collect();
    assert_eq!(ports.len(), seen.len(), "a fresh port each time: {seen:?}");
    let s = link.stats();
    assert!(s.rebinds + 1 >= seen.len() as u64, "{s:?} {seen:?}");
    assert_eq!(link.upstream_addr(), seen.last().copied());
    assert!(adds_up(&s.to_hub), "{s:?}");
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn a_new_client_address_gets_a_new_session() -> io::Result<()> {
    let (link, stop) = setup("rtt=0s").await?;
    let (a, b) = (client().await?, client().await?);
    let ra = round_trip(&a, link.local_addr(), "a", WAIT)
        .await
        .expect("reply");
    let rb = round_trip(&b, link.local_addr(), "b", WAIT)
        .await
        .expect("reply");
    assert!(rb.starts_with("b|"));
    assert_ne!(
        seen_from(&ra),
        seen_from(&rb),
        "a restarted agent is a new flow"
    );
    stop.cancel();
    Ok(())
}

#[tokio::test]
async fn shutdown_and_drop_stop_forwarding() -> io::Result<()> {
    let (link, stop) = setup("rtt=0s").await?;
    let c = client().await?;
    assert!(
        round_trip(&c, link.local_addr(), "up", WAIT)
            .await
            .is_some()
    );
    let token = link.cancellation_token();
    link.shutdown();
    assert!(token.is_cancelled());
    assert_eq!(
        round_trip(&c, link.local_addr(), "down", SILENCE).await,
        None
    );

    let (link, _) = setup("rtt=0s").await?;
    let (token, addr) = (link.cancellation_token(), link.local_addr());
    drop(link);
    assert!(token.is_cancelled());
    assert_eq!(round_trip(&c, addr, "gone", SILENCE).await, None);
    stop.cancel();
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A QUIC server echoing every bidirectional stream (handing out its connections), and a
/// client endpoint that trusts it.
async fn quic_pair() -> Result<
    (
        quinn::Endpoint,
        tokio::sync::mpsc::UnboundedReceiver<quinn::Connection>,
        quinn::Endpoint,
    ),
    BoxError,
> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    let cert = ck.cert.der().clone();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
    let server_cfg = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key.into())?;
    let server = quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse()?)?;
    let (conns, conns_rx) = tokio::sync::mpsc::unbounded_channel();
    let accept = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accept.accept().await {
            let conns = conns.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let _ = conns.send(conn.clone());
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        if let Ok(data) = recv.read_to_end(1024).await {
                            let _ = send.write_all(&data).await;
                            let _ = send.finish();
                        }
                    });
                }
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let client_cfg = quinn::ClientConfig::with_root_certificates(Arc::new(roots))?;
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    client.set_default_client_config(client_cfg);
    Ok((server, conns_rx, client))
}

async fn quic_echo(conn: &quinn::Connection, msg: &[u8]) -> Result<Vec<u8>, BoxError> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(msg).await?;
    send.finish()?;
    Ok(recv.read_to_end(1024).await?)
}

#[tokio::test]
async fn a_quic_connection_survives_rebinds_by_migrating() -> Result<(), BoxError> {
    let (server, mut conns, client) = quic_pair().await?;
    let link = LinkEmulator::start(spec("rebind=300ms,rtt=10ms"), server.local_addr()?).await?;
    let connecting = client.connect(link.local_addr(), "localhost")?;
    let conn = tokio::time::timeout(Duration::from_secs(10), connecting).await??;
    let server_conn = tokio::time::timeout(WAIT, conns.recv())
        .await?
        .ok_or("no connection")?;
    let mut remotes = vec![server_conn.remote_address()];
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_millis(1600) || remotes.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(20), "{remotes:?}");
        let msg = format!("m{i}");
        let got = tokio::time::timeout(Duration::from_secs(10), quic_echo(&conn, msg.as_bytes()))
            .await??;
        assert_eq!(got, msg.as_bytes());
        let remote = server_conn.remote_address();
        if remotes.last() != Some(&remote) {
            remotes.push(remote);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(link.stats().rebinds >= 3, "{:?}", link.stats());
    assert_eq!(Some(server_conn.remote_address()), link.upstream_addr());
    assert!(
        conn.close_reason().is_none(),
        "the same connection throughout"
    );
    conn.close(0u32.into(), b"done");
    server.close(0u32.into(), b"done");
    Ok(())
}

#[tokio::test]
async fn quic_survives_loss_latency_and_a_partition() -> Result<(), BoxError> {
    let (server, _conns, client) = quic_pair().await?;
    let link = LinkEmulator::start(spec("rtt=40ms,loss=10,seed=3"), server.local_addr()?).await?;
    let connecting = client.connect(link.local_addr(), "localhost")?;
    let conn = tokio::time::timeout(Duration::from_secs(20), connecting).await??;
    for i in 0..10 {
        let msg = format!("lossy-{i}");
        let got = tokio::time::timeout(Duration::from_secs(20), quic_echo(&conn, msg.as_bytes()))
            .await??;
        assert_eq!(got, msg.as_bytes());
    }
    let s = link.stats();
    assert!(s.to_hub.lost + s.to_agent.lost > 0, "{s:?}");
    link.set_spec(spec("rtt=40ms"));
    link.set_partitioned(true);
    let stalled = tokio::time::timeout(SILENCE, quic_echo(&conn, b"cut")).await;
    assert!(
        stalled.is_err(),
        "an exchange completed through a partition"
    );
    link.set_partitioned(false);
    let got = tokio::time::timeout(Duration::from_secs(20), quic_echo(&conn, b"healed")).await??;
    assert_eq!(got, b"healed");
    conn.close(0u32.into(), b"done");
    server.close(0u32.into(), b"done");
    Ok(())
}
