//! A UDP relay for fault injection on the agent↔hub QUIC path, on loopback.
//!
//! The agent dials the relay's [`UdpRelay::local_addr`] instead of the hub; the relay opens
//! one upstream socket per client address (so the hub sees one peer per agent, as through
//! a NAT) and forwards datagrams both ways. At runtime a test can add one-way latency
//! (applied in each direction, order preserved), drop a fraction of datagrams, or
//! partition the path (drop everything both ways). Shutdown is a `CancellationToken`;
//! dropping the relay cancels it too. The tests run real QUIC (quinn) through it.
//!
//! Limits: at most [`MAX_SESSIONS`] client addresses (datagrams from further clients are
//! dropped); sessions live until shutdown; each direction queues at most [`QUEUE_LEN`]
//! delayed datagrams (overflow is dropped, like a full router queue); drop decisions use
//! a fast non-cryptographic generator.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Most client addresses one relay serves.
pub const MAX_SESSIONS: usize = 1024;
/// Most datagrams waiting out their latency per direction and client.
pub const QUEUE_LEN: usize = 4096;
const MAX_DATAGRAM: usize = 65_535;

/// Counters of what the relay did, for assertions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RelayStats {
    /// Datagrams forwarded (either direction).
    pub forwarded: u64,
    /// Datagrams dropped by the drop rate, a partition or a full queue.
    pub dropped: u64,
}

#[derive(Debug)]
struct Shared {
    latency_us: AtomicU64,
    drop_rate_bits: AtomicU64,
    partitioned: AtomicBool,
    rng: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
}

impl Shared {
    fn random_unit(&self) -> f64 {
        // splitmix64 over an atomic counter: lock-free and well distributed.
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn should_drop(&self) -> bool {
        if self.partitioned.load(Ordering::Relaxed) {
            return true;
        }
        let rate = f64::from_bits(self.drop_rate_bits.load(Ordering::Relaxed));
        rate > 0.0 && (rate >= 1.0 || self.random_unit() < rate)
    }

    fn deadline(&self) -> Instant {
        let now = Instant::now();
        let latency = Duration::from_micros(self.latency_us.load(Ordering::Relaxed));
        // An absurd latency holds datagrams for a day rather than overflowing the clock.
        now.checked_add(latency)
            .unwrap_or_else(|| now + Duration::from_secs(86_400))
    }

    /// Applies faults to one datagram and queues it for delivery.
    fn admit(&self, queue: &mpsc::Sender<(Instant, Bytes)>, data: Bytes) {
        if self.should_drop() || queue.try_send((self.deadline(), data)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A running relay. Cancelled by [`UdpRelay::shutdown`], by its token, or on drop.
#[derive(Debug)]
pub struct UdpRelay {
    local: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl UdpRelay {
    /// Binds `listen` (e.g. `127.0.0.1:0`) and relays to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<UdpRelay> {
        Self::start_with_token(listen, upstream, CancellationToken::new()).await
    }

    /// Like [`UdpRelay::start`], stopping when `cancel` (e.g. a child of the test
    /// harness's token) is cancelled.
    pub async fn start_with_token(
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> io::Result<UdpRelay> {
        let socket = Arc::new(UdpSocket::bind(listen).await?);
        let local = socket.local_addr()?;
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(local.port());
        let shared = Arc::new(Shared {
            latency_us: AtomicU64::new(0),
            drop_rate_bits: AtomicU64::new(0f64.to_bits()),
            partitioned: AtomicBool::new(false),
            rng: AtomicU64::new(seed),
            forwarded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        tokio::spawn(run(socket, upstream, Arc::clone(&shared), cancel.clone()));
        Ok(UdpRelay {
            local,
            shared,
            cancel,
        })
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// One-way latency added to every datagram in each direction (so a round trip gains
    /// twice this). Applies to datagrams received from now on.
    pub fn set_latency(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(us, Ordering::Relaxed);
    }

    /// Fraction of datagrams dropped in each direction, clamped to `0.0..=1.0` (NaN is 0).
    pub fn set_drop_rate(&self, rate: f64) {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        self.shared
            .drop_rate_bits
            .store(rate.to_bits(), Ordering::Relaxed);
    }

    /// Drops everything both ways while `true`.
    pub fn set_partitioned(&self, partitioned: bool) {
        self.shared
            .partitioned
            .store(partitioned, Ordering::Relaxed);
    }

    /// What the relay has done so far.
    pub fn stats(&self) -> RelayStats {
        RelayStats {
            forwarded: self.shared.forwarded.load(Ordering::Relaxed),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
        }
    }

    /// The token that stops the relay.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops relaying; every socket is closed once its task sees the cancellation.
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

struct Session {
    to_upstream: mpsc::Sender<(Instant, Bytes)>,
}

async fn run(
    socket: Arc<UdpSocket>,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            () = cancel.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                // ICMP errors surface here on some platforms; the socket stays usable.
                Err(_) => continue,
            },
        };
        let data = Bytes::copy_from_slice(buf.get(..n).unwrap_or_default());
        if !sessions.contains_key(&client) {
            if sessions.len() >= MAX_SESSIONS {
                shared.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match open_session(&socket, client, upstream, &shared, &cancel).await {
                Ok(s) => {
                    sessions.insert(client, s);
                }
                Err(_) => {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
        }
        if let Some(s) = sessions.get(&client) {
            shared.admit(&s.to_upstream, data);
        }
    }
}

async fn open_session(
    listen: &Arc<UdpSocket>,
    client: SocketAddr,
    upstream: SocketAddr,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
) -> io::Result<Session> {
    let bind: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::LOCALHOST, 0).into()
    } else {
        (Ipv6Addr::LOCALHOST, 0).into()
    };
    let up = Arc::new(UdpSocket::bind(bind).await?);
    up.connect(upstream).await?;

    let (to_upstream, up_rx) = mpsc::channel(QUEUE_LEN);
    let (to_client, down_rx) = mpsc::channel(QUEUE_LEN);

    // client → upstream, after the latency.
    let sock = Arc::clone(&up);
    tokio::spawn(deliver(
        up_rx,
        Arc::clone(shared),
        cancel.clone(),
        move |d| {
            let sock = Arc::clone(&sock);
            async move { sock.send(&d).await.map(drop) }
        },
    ));
    // upstream → client, after the latency.
    let listen = Arc::clone(listen);
    tokio::spawn(deliver(
        down_rx,
        Arc::clone(shared),
        cancel.clone(),
        move |d| {
            let listen = Arc::clone(&listen);
            async move { listen.send_to(&d, client).await.map(drop) }
        },
    ));
    // Read what upstream sends back to this client.
    let shared = Arc::clone(shared);
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let n = tokio::select! {
                () = cancel.cancelled() => return,
                r = up.recv(&mut buf) => match r {
                    Ok(n) => n,
                    // ECONNREFUSED from an ICMP port-unreachable: upstream not listening yet.
                    Err(_) => continue,
                },
            };
            let data = Bytes::copy_from_slice(buf.get(..n).unwrap_or_default());
            shared.admit(&to_client, data);
        }
    });
    Ok(Session { to_upstream })
}

/// Sends queued datagrams once their deadline passes, in order.
async fn deliver<F, Fut>(
    mut rx: mpsc::Receiver<(Instant, Bytes)>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    send: F,
) where
    F: Fn(Bytes) -> Fut,
    Fut: Future<Output = io::Result<()>>,
{
    loop {
        let (deadline, data) = tokio::select! {
            () = cancel.cancelled() => return,
            item = rx.recv() => match item {
                Some(item) => item,
                None => return,
            },
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(deadline) => {}
        }
        // A send error (peer gone) loses this datagram, as the network would.
        match send(data).await {
            Ok(()) => shared.forwarded.fetch_add(1, Ordering::Relaxed),
            Err(_) => shared.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long to wait for a reply that should come (generous: the machine is shared).
    const WAIT: Duration = Duration::from_secs(2);
    /// How long to wait before concluding a reply will not come.
    const SILENCE: Duration = Duration::from_millis(300);

    /// An upstream that answers every datagram with the payload plus the sender's port.
    async fn echo_server() -> io::Result<(SocketAddr, CancellationToken)> {
        let sock = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = sock.local_addr()?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            loop {
                let (n, from) = tokio::select! {
                    () = stop.cancelled() => return,
                    r = sock.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
                };
                let mut reply = buf.get(..n).unwrap_or_default().to_vec();
                reply.extend_from_slice(format!("|{}", from.port()).as_bytes());
                let _ = sock.send_to(&reply, from).await;
            }
        });
        Ok((addr, cancel))
    }

    async fn client() -> io::Result<UdpSocket> {
        UdpSocket::bind("127.0.0.1:0").await
    }

    /// Sends `msg` to the relay and waits up to `wait` for the reply.
    async fn round_trip(
        c: &UdpSocket,
        relay: SocketAddr,
        msg: &str,
        wait: Duration,
    ) -> Option<String> {
        c.send_to(msg.as_bytes(), relay).await.ok()?;
        let mut buf = vec![0u8; 2048];
        match tokio::time::timeout(wait, c.recv_from(&mut buf)).await {
            Ok(Ok((n, _))) => Some(String::from_utf8_lossy(buf.get(..n)?).into_owned()),
            _ => None,
        }
    }

    async fn setup() -> io::Result<(UdpRelay, CancellationToken)> {
        let (upstream, stop) = echo_server().await?;
        let relay =
            UdpRelay::start("127.0.0.1:0".parse().map_err(io::Error::other)?, upstream).await?;
        Ok((relay, stop))
    }

    #[tokio::test]
    async fn relays_both_ways_with_one_upstream_socket_per_client() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        assert!(relay.local_addr().ip().is_loopback());
        assert_ne!(relay.local_addr().port(), 0);
        let (a, b) = (client().await?, client().await?);
        let ra = round_trip(&a, relay.local_addr(), "a1", WAIT).await;
        let ra2 = round_trip(&a, relay.local_addr(), "a2", WAIT).await;
        let rb = round_trip(&b, relay.local_addr(), "b1", WAIT).await;
        let port = |r: &Option<String>| {
            r.as_deref()
                .and_then(|r| r.split('|').nth(1))
                .map(str::to_owned)
        };
        assert!(
            ra.as_deref().is_some_and(|r| r.starts_with("a1|")),
            "{ra:?}"
        );
        assert!(
            rb.as_deref().is_some_and(|r| r.starts_with("b1|")),
            "{rb:?}"
        );
        assert_eq!(port(&ra), port(&ra2), "a client keeps its upstream socket");
        assert_ne!(
            port(&ra),
            port(&rb),
            "each client gets its own upstream socket"
        );
        assert_eq!(
            relay.stats(),
            RelayStats {
                forwarded: 6,
                dropped: 0
            }
        );
        stop.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn latency_applies_in_both_directions() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let c = client().await?;
        relay.set_latency(Duration::from_millis(300));
        let start = std::time::Instant::now();
        let r = round_trip(&c, relay.local_addr(), "slow", Duration::from_secs(5)).await;
        let rtt = start.elapsed();
        assert!(r.is_some());
        assert!(rtt >= Duration::from_millis(600), "rtt {rtt:?}");
        relay.set_latency(Duration::ZERO);
        let start = std::time::Instant::now();
        assert!(
            round_trip(&c, relay.local_addr(), "fast", WAIT)
                .await
                .is_some()
        );
        assert!(start.elapsed() < Duration::from_millis(500));
        stop.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn partition_drops_everything_then_heals() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let c = client().await?;
        assert!(
            round_trip(&c, relay.local_addr(), "before", WAIT)
                .await
                .is_some()
        );
        relay.set_partitioned(true);
        assert_eq!(
            round_trip(&c, relay.local_addr(), "during", SILENCE).await,
            None
        );
        assert_eq!(relay.stats().dropped, 1);
        relay.set_partitioned(false);
        let r = round_trip(&c, relay.local_addr(), "after", WAIT).await;
        assert!(
            r.as_deref().is_some_and(|r| r.starts_with("after|")),
            "{r:?}"
        );
        stop.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn drop_rate_loses_a_fraction() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let c = client().await?;
        relay.set_drop_rate(1.0);
        assert_eq!(round_trip(&c, relay.local_addr(), "x", SILENCE).await, None);
        relay.set_drop_rate(0.5);
        const N: usize = 200;
        for i in 0..N {
            c.send_to(format!("p{i}").as_bytes(), relay.local_addr())
                .await?;
        }
        let mut got = 0;
        let mut buf = vec![0u8; 2048];
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(1), c.recv_from(&mut buf)).await
        {
            got += 1;
            if got == N {
                break;
            }
        }
        // Each datagram survives two 50% drops: expect ~50 of 200.
        assert!((10..=120).contains(&got), "got {got} of {N}");
        let s = relay.stats();
        // Forwarded = those that reached upstream + `got`; every datagram is counted once
        // per hop it attempted: 1 ("x") + N up + (reached upstream) down.
        let reached_upstream = s.forwarded - got as u64;
        assert_eq!(
            s.forwarded + s.dropped,
            1 + N as u64 + reached_upstream,
            "{s:?}"
        );
        relay.set_drop_rate(f64::NAN);
        assert!(
            round_trip(&c, relay.local_addr(), "ok", WAIT)
                .await
                .is_some()
        );
        stop.cancel();
        Ok(())
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A QUIC server that echoes every bidirectional stream, and a client endpoint that
    /// trusts it.
    async fn quic_pair() -> Result<(quinn::Endpoint, SocketAddr, quinn::Endpoint), BoxError> {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let cert = ck.cert.der().clone();
        let key = rustls_pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
        let server_cfg = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key.into())?;
        let server = quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse()?)?;
        let server_addr = server.local_addr()?;
        let accept = server.clone();
        tokio::spawn(async move {
            while let Some(incoming) = accept.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
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
        Ok((server, server_addr, client))
    }

    async fn quic_echo(conn: &quinn::Connection, msg: &[u8]) -> Result<Vec<u8>, BoxError> {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(msg).await?;
        send.finish()?;
        Ok(recv.read_to_end(1024).await?)
    }

    #[tokio::test]
    async fn quic_through_the_relay_survives_loss_latency_and_partition() -> Result<(), BoxError> {
        let (server, server_addr, client) = quic_pair().await?;
        let relay = UdpRelay::start("127.0.0.1:0".parse()?, server_addr).await?;
        relay.set_latency(Duration::from_millis(20));
        let connecting = client.connect(relay.local_addr(), "localhost")?;
        let conn = tokio::time::timeout(Duration::from_secs(10), connecting).await??;
        let got = tokio::time::timeout(WAIT, quic_echo(&conn, b"hello")).await??;
        assert_eq!(got, b"hello");

        // Loss: QUIC retransmits, every exchange still completes.
        // (10% per direction keeps retransmission backoff, and so the test's run time, short.)
        relay.set_drop_rate(0.1);
        // At least five exchanges, and keep going (boundedly) until some loss happened.
        for i in 0..40 {
            if i >= 5 && relay.stats().dropped > 0 {
                break;
            }
            let msg = format!("lossy-{i}");
            let got =
                tokio::time::timeout(Duration::from_secs(20), quic_echo(&conn, msg.as_bytes()))
                    .await??;
            assert_eq!(got, msg.as_bytes());
        }
        assert!(relay.stats().dropped > 0);
        relay.set_drop_rate(0.0);

        // Partition: nothing gets through...
        relay.set_partitioned(true);
        let stalled = tokio::time::timeout(SILENCE, quic_echo(&conn, b"cut")).await;
        assert!(
            stalled.is_err(),
            "an exchange completed through a partition"
        );
        // ...until it heals, on the same connection.
        relay.set_partitioned(false);
        let got =
            tokio::time::timeout(Duration::from_secs(20), quic_echo(&conn, b"healed")).await??;
        assert_eq!(got, b"healed");

        conn.close(0u32.into(), b"done");
        server.close(0u32.into(), b"done");
        Ok(())
    }

    #[tokio::test]
    async fn absurd_latency_holds_datagrams_without_panicking() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let c = client().await?;
        relay.set_latency(Duration::MAX);
        assert_eq!(
            round_trip(&c, relay.local_addr(), "held", SILENCE).await,
            None
        );
        assert_eq!(
            relay.stats(),
            RelayStats::default(),
            "queued, not sent or dropped"
        );
        stop.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn shutdown_stops_relaying() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let c = client().await?;
        assert!(
            round_trip(&c, relay.local_addr(), "up", WAIT)
                .await
                .is_some()
        );
        let token = relay.cancellation_token();
        relay.shutdown();
        assert!(token.is_cancelled());
        assert_eq!(
            round_trip(&c, relay.local_addr(), "down", SILENCE).await,
            None
        );
        stop.cancel();
        Ok(())
    }

    #[tokio::test]
    async fn dropping_the_relay_cancels_it() -> io::Result<()> {
        let (relay, stop) = setup().await?;
        let token = relay.cancellation_token();
        let addr = relay.local_addr();
        drop(relay);
        assert!(token.is_cancelled());
        let c = client().await?;
        assert_eq!(round_trip(&c, addr, "gone", SILENCE).await, None);
        stop.cancel();
        Ok(())
    }
}
