//! The sockets of one load-balancer frontend: TCP connections are spliced to an endpoint;
//! UDP datagrams go through one upstream socket per client address (as through a NAT), so
//! the endpoint sees one peer per client and its replies find their way back.
//!
//! Endpoints are picked round-robin per TCP connection or UDP client. A UDP client stays on
//! its endpoint while that endpoint is in the list; once it leaves (its pod went away or is
//! no longer Ready) the client's next datagram goes to another one. A UDP client silent for
//! [`UDP_IDLE`] is forgotten.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Frontend, Protocol};

/// How long a silent UDP client keeps its upstream socket.
pub(super) const UDP_IDLE: Duration = Duration::from_secs(300);
const MAX_DATAGRAM: usize = 65_535;

/// A running frontend; dropping it closes its sockets.
#[derive(Debug)]
pub(super) struct Forwarder {
    endpoints: watch::Sender<Vec<SocketAddr>>,
    cancel: CancellationToken,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Forwarder {
    /// Listens on the frontend's address until dropped or `shutdown` is cancelled.
    pub(super) async fn start(
        frontend: Frontend,
        endpoints: Vec<SocketAddr>,
        shutdown: &CancellationToken,
    ) -> io::Result<Forwarder> {
        let cancel = shutdown.child_token();
        let (tx, rx) = watch::channel(endpoints);
        match frontend.protocol {
            Protocol::Tcp => {
                let listener = TcpListener::bind(frontend.addr).await?;
                tokio::spawn(tcp(listener, rx, cancel.clone()));
            }
            Protocol::Udp => {
                let socket = Arc::new(UdpSocket::bind(frontend.addr).await?);
                tokio::spawn(udp(socket, rx, cancel.clone()));
            }
        }
        Ok(Forwarder {
            endpoints: tx,
            cancel,
        })
    }

    /// Replaces the endpoints (a no-op when they are the same).
    pub(super) fn set_endpoints(&self, endpoints: Vec<SocketAddr>) {
        self.endpoints.send_if_modified(|old| {
            let changed = *old != endpoints;
            if changed {
                *old = endpoints;
            }
            changed
        });
    }
}

/// Round-robin over the current endpoints.
#[derive(Debug, Default)]
struct Picker(AtomicUsize);

impl Picker {
    fn pick(&self, endpoints: &[SocketAddr]) -> Option<SocketAddr> {
        if endpoints.is_empty() {
            return None;
        }
        let i = self.0.fetch_add(1, Ordering::Relaxed);
        Some(endpoints[i % endpoints.len()])
    }
}

async fn tcp(
    listener: TcpListener,
    endpoints: watch::Receiver<Vec<SocketAddr>>,
    cancel: CancellationToken,
) {
    let picker = Picker::default();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((mut client, _)) = accepted else {
            continue;
        };
        // No endpoint: the connection is closed at once, as a load balancer without healthy
        // targets resets it.
        let Some(target) = picker.pick(&endpoints.borrow()) else {
            continue;
        };
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let Ok(mut upstream) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
            }
        });
    }
}

struct Session {
    endpoint: SocketAddr,
    upstream: Arc<UdpSocket>,
    last: Instant,
    cancel: CancellationToken,
}

async fn udp(
    socket: Arc<UdpSocket>,
    endpoints: watch::Receiver<Vec<SocketAddr>>,
    cancel: CancellationToken,
) {
    let picker = Picker::default();
    let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sweep = tokio::time::interval(Duration::from_secs(30));
    loop {
        let (n, client) = tokio::select! {
            _ = cancel.cancelled() => break,
            _ = sweep.tick() => {
                sessions.retain(|_, s| {
                    let keep = s.last.elapsed() < UDP_IDLE;
                    if !keep { s.cancel.cancel(); }
                    keep
                });
                continue;
            }
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(_) => continue,
            },
        };
        let current = endpoints.borrow().clone();
        let stale = sessions
            .get(&client)
            .is_some_and(|s| !current.contains(&s.endpoint));
        if stale && let Some(s) = sessions.remove(&client) {
            s.cancel.cancel();
        }
        let session = match sessions.entry(client) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let Some(endpoint) = picker.pick(&current) else {
                    continue;
                };
                match open(&socket, client, endpoint, &cancel).await {
                    Ok(s) => v.insert(s),
                    Err(e) => {
                        tracing::debug!(error = %e, %endpoint, "load balancer upstream failed");
                        continue;
                    }
                }
            }
        };
        session.last = Instant::now();
        let _ = session.upstream.send(&buf[..n]).await;
    }
    for s in sessions.into_values() {
        s.cancel.cancel();
    }
}

/// A client's upstream socket, connected to `endpoint`, with the task that returns replies.
async fn open(
    socket: &Arc<UdpSocket>,
    client: SocketAddr,
    endpoint: SocketAddr,
    cancel: &CancellationToken,
) -> io::Result<Session> {
    let bind: SocketAddr = if endpoint.is_ipv4() {
        ([127, 0, 0, 1], 0).into()
    } else {
        (std::net::Ipv6Addr::LOCALHOST, 0).into()
    };
    let upstream = Arc::new(UdpSocket::bind(bind).await?);
    upstream.connect(endpoint).await?;
    let cancel = cancel.child_token();
    let (up, down, stop) = (upstream.clone(), socket.clone(), cancel.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let n = tokio::select! {
                _ = stop.cancelled() => return,
                r = up.recv(&mut buf) => match r {
                    Ok(n) => n,
                    // ICMP unreachable from a closed port: keep the session, the
                    // endpoint may come back.
                    Err(_) => continue,
                },
            };
            let _ = down.send_to(&buf[..n], client).await;
        }
    });
    Ok(Session {
        endpoint,
        upstream,
        last: Instant::now(),
        cancel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picker_rotates_and_has_nothing_without_endpoints() {
        let p = Picker::default();
        let a: SocketAddr = "127.0.0.2:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.3:1".parse().unwrap();
        assert_eq!(p.pick(&[]), None);
        let got: Vec<_> = (0..4).filter_map(|_| p.pick(&[a, b])).collect();
        assert_eq!(got.iter().filter(|x| **x == a).count(), 2);
        assert_eq!(got.iter().filter(|x| **x == b).count(), 2);
    }

    #[tokio::test]
    async fn udp_and_tcp_reach_the_endpoint_and_follow_a_change_of_endpoint() {
        let shutdown = CancellationToken::new();
        // Two UDP echo servers that prefix their answer with their name.
        let mut servers = Vec::new();
        for name in ["a", "b"] {
            let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = s.local_addr().unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok((n, from)) = s.recv_from(&mut buf).await {
                    let mut out = name.as_bytes().to_vec();
                    out.extend_from_slice(&buf[..n]);
                    let _ = s.send_to(&out, from).await;
                }
            });
            servers.push(addr);
        }
        let probe = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let free = probe.local_addr().unwrap();
        drop(probe);
        let frontend = Frontend {
            addr: free,
            protocol: Protocol::Udp,
        };
        let f = Forwarder::start(frontend, vec![servers[0]], &shutdown)
            .await
            .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(free).await.unwrap();
        let ask = |msg: &'static [u8]| {
            let client = &client;
            async move {
                client.send(msg).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf))
                    .await
                    .expect("an answer")
                    .unwrap();
                buf[..n].to_vec()
            }
        };
        assert_eq!(ask(b"1").await, b"a1");
        f.set_endpoints(vec![servers[1]]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            ask(b"2").await,
            b"b2",
            "the old endpoint left: the next one serves"
        );

        // TCP: an echo server behind a frontend.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let free = probe.local_addr().unwrap();
        drop(probe);
        let tcp = Frontend {
            addr: free,
            protocol: Protocol::Tcp,
        };
        let _t = Forwarder::start(tcp, vec![echo_addr], &shutdown)
            .await
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = TcpStream::connect(free).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        shutdown.cancel();
    }
}
