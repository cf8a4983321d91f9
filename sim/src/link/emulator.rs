//! The sockets and tasks of a [`LinkEmulator`]; every decision is [`Shaper::admit`]'s.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shaper::{Shaper, Verdict, direction_seeds};
use super::spec::{LinkSpec, MIN_REBIND};

/// Most datagrams on their way (delayed) per direction; more count as a full queue.
pub const MAX_IN_FLIGHT: usize = 4096;
const MAX_DATAGRAM: usize = 65_535;
/// An absurd delay holds a datagram this long rather than overflowing the clock.
const FOREVER: Duration = Duration::from_secs(86_400);

/// Counters of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectionStats {
    /// Datagrams that arrived at the emulator.
    pub received: u64,
    /// Datagrams sent on.
    pub packets: u64,
    /// Bytes of the datagrams sent on.
    pub bytes: u64,
    /// Dropped by `loss`.
    pub lost: u64,
    /// Dropped by a blackout's down phase or [`LinkEmulator::set_partitioned`].
    pub blacked_out: u64,
    /// Dropped because the rate queue (or the [`MAX_IN_FLIGHT`] bound) was full.
    pub queue_full: u64,
    /// Could not be sent: no client yet, an upstream socket failed, or the emulator stopped.
    pub unsent: u64,
}

impl DirectionStats {
    /// Datagrams still on their way: received and not yet sent, dropped or failed.
    pub fn in_flight(&self) -> u64 {
        self.received
            .saturating_sub(self.packets + self.lost + self.blacked_out + self.queue_full)
            .saturating_sub(self.unsent)
    }
}

/// What an emulator has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// From the agent towards the hub.
    pub to_hub: DirectionStats,
    /// From the hub towards the agent.
    pub to_agent: DirectionStats,
    /// Times the upstream socket was replaced by `rebind`.
    pub rebinds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToHub = 0,
    ToAgent = 1,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    packets: AtomicU64,
    bytes: AtomicU64,
    lost: AtomicU64,
    blacked_out: AtomicU64,
    queue_full: AtomicU64,
    unsent: AtomicU64,
    in_flight: AtomicUsize,
}

impl Counters {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> DirectionStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirectionStats {
            received: get(&self.received),
            packets: get(&self.packets),
            bytes: get(&self.bytes),
            lost: get(&self.lost),
            blacked_out: get(&self.blacked_out),
            queue_full: get(&self.queue_full),
            unsent: get(&self.unsent),
        }
    }
}

/// The spec in force, since when, and each direction's shaper.
#[derive(Debug)]
struct State {
    spec: LinkSpec,
    seed: u64,
    anchor: Instant,
    shapers: [Shaper; 2],
}

impl State {
    fn new(spec: LinkSpec) -> Self {
        let seed = spec.seed.unwrap_or_else(clock_seed);
        let (to_hub, to_agent) = direction_seeds(seed);
        Self {
            spec,
            seed,
            anchor: Instant::now(),
            shapers: [Shaper::new(to_hub), Shaper::new(to_agent)],
        }
    }
}

fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// When the upstream socket is replaced: every `every` after `anchor`.
#[derive(Debug, Clone, Copy)]
struct RebindPlan {
    every: Option<Duration>,
    anchor: Instant,
}

/// The one client (the agent) and the upstream socket the hub sees it from.
#[derive(Debug)]
struct Session {
    client: SocketAddr,
    upstream: Arc<UdpSocket>,
    /// Stops the task reading `upstream`; cancelled when the socket is replaced.
    reader: CancellationToken,
}

#[derive(Debug)]
struct Shared {
    hub: SocketAddr,
    listen: UdpSocket,
    state: Mutex<State>,
    session: Mutex<Option<Session>>,
    plan: watch::Sender<RebindPlan>,
    partitioned: AtomicBool,
    counters: [Counters; 2],
    rebinds: AtomicU64,
    queues: [mpsc::UnboundedSender<(Instant, Bytes)>; 2],
    cancel: CancellationToken,
}

/// Both locks guard plain values replaced whole, never half-written, so a panic elsewhere
/// while one was held leaves them consistent: poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn counters(&self, dir: Dir) -> &Counters {
        &self.counters[dir as usize]
    }

    /// Applies the spec to one datagram and queues it for delivery.
    fn admit(&self, dir: Dir, data: Bytes) {
        let c = self.counters(dir);
        Counters::count(&c.received);
        if self.partitioned.load(Ordering::Relaxed) {
            return Counters::count(&c.blacked_out);
        }
        let now = Instant::now();
        let verdict = {
            let mut state = lock(&self.state);
            let since = now.saturating_duration_since(state.anchor);
            let State { spec, shapers, .. } = &mut *state;
            shapers[dir as usize].admit(spec, since, data.len())
        };
        match verdict {
            Verdict::Deliver(after) => {
                if c.in_flight.fetch_add(1, Ordering::Relaxed) >= MAX_IN_FLIGHT {
                    c.in_flight.fetch_sub(1, Ordering::Relaxed);
                    return Counters::count(&c.queue_full);
                }
                let at = now.checked_add(after).unwrap_or(now + FOREVER);
                if self.queues[dir as usize].send((at, data)).is_err() {
                    c.in_flight.fetch_sub(1, Ordering::Relaxed);
                    Counters::count(&c.unsent);
                }
            }
            Verdict::Lost => Counters::count(&c.lost),
            Verdict::BlackedOut => Counters::count(&c.blacked_out),
            Verdict::QueueFull => Counters::count(&c.queue_full),
        }
    }

    /// Sends a datagram whose time has come: towards the hub from the current upstream
    /// socket, towards the agent to the current client.
    async fn send(&self, dir: Dir, data: Bytes) {
        let c = self.counters(dir);
        c.in_flight.fetch_sub(1, Ordering::Relaxed);
        let (upstream, client) = match lock(&self.session).as_ref() {
            Some(s) => (Some(Arc::clone(&s.upstream)), Some(s.client)),
            None => (None, None),
        };
        let sent = match (dir, upstream, client) {
            (Dir::ToHub, Some(upstream), _) => upstream.send(&data).await,
            (Dir::ToAgent, _, Some(client)) => self.listen.send_to(&data, client).await,
            _ => Err(io::Error::from(io::ErrorKind::NotConnected)),
        };
        // A failed send (no one listening) loses the datagram, as the network would.
        match sent {
            Ok(_) => {
                Counters::count(&c.packets);
                c.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            Err(_) => Counters::count(&c.unsent),
        }
    }

    /// A fresh upstream socket towards the hub, bound to `ip` (port chosen by the system),
    /// and the task reading what the hub sends to it.
    fn connect_upstream(
        self: &Arc<Self>,
        ip: IpAddr,
    ) -> io::Result<(Arc<UdpSocket>, CancellationToken)> {
        let socket = std::net::UdpSocket::bind((ip, 0))?;
        socket.set_nonblocking(true)?;
        socket.connect(self.hub)?;
        let socket = Arc::new(UdpSocket::from_std(socket)?);
        let reader = self.cancel.child_token();
        tokio::spawn(read_upstream(
            Arc::clone(self),
            Arc::clone(&socket),
            reader.clone(),
        ));
        Ok((socket, reader))
    }

    /// Serves a new client: a datagram from another address (a restarted agent) replaces
    /// the session, with a fresh upstream socket as a NAT gives a new flow a new mapping.
    fn open_session(self: &Arc<Self>, client: SocketAddr) -> io::Result<()> {
        let (upstream, reader) = self.connect_upstream(source_ip(self.hub))?;
        let old = lock(&self.session).replace(Session {
            client,
            upstream,
            reader,
        });
        if let Some(old) = old {
            old.reader.cancel();
        }
        Ok(())
    }

    /// Replaces the upstream socket (closing the old one), as a NAT rebinding changes the
    /// address the hub sees. On IPv4 loopback the address rotates through 127.0.0.2 …
    /// 127.0.0.254 where the system allows binding them, else only the port changes.
    fn rebind(self: &Arc<Self>) -> io::Result<()> {
        let mut session = lock(&self.session);
        let Some(session) = session.as_mut() else {
            return Ok(());
        };
        let n = self.rebinds.load(Ordering::Relaxed);
        let ip = match self.hub.ip() {
            IpAddr::V4(v4) if v4.is_loopback() => {
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (n % 253) as u8))
            }
            _ => source_ip(self.hub),
        };
        let (upstream, reader) = self
            .connect_upstream(ip)
            .or_else(|_| self.connect_upstream(source_ip(self.hub)))?;
        session.reader.cancel();
        session.upstream = upstream;
        session.reader = reader;
        self.rebinds.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The loopback address of `addr`'s family.
fn loopback(addr: SocketAddr) -> IpAddr {
    if addr.is_ipv4() {
        Ipv4Addr::LOCALHOST.into()
    } else {
        Ipv6Addr::LOCALHOST.into()
    }
}

/// The address upstream sockets bind: loopback towards a hub on loopback, else any.
fn source_ip(hub: SocketAddr) -> IpAddr {
    match hub.ip() {
        ip if ip.is_loopback() => ip,
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// A running link emulator between one agent and the hub. Stopped by
/// [`LinkEmulator::shutdown`], by its token, or on drop.
#[derive(Debug)]
pub struct LinkEmulator {
    local: SocketAddr,
    shared: Arc<Shared>,
}

impl LinkEmulator {
    /// Binds loopback (port chosen by the system, the family of `hub`) and forwards to `hub`
    /// as `spec` says.
    pub async fn start(spec: LinkSpec, hub: SocketAddr) -> io::Result<LinkEmulator> {
        Self::start_with_token(spec, hub, CancellationToken::new()).await
    }

    /// Like [`LinkEmulator::start`], stopping when `cancel` is cancelled.
    pub async fn start_with_token(
        spec: LinkSpec,
        hub: SocketAddr,
        cancel: CancellationToken,
    ) -> io::Result<LinkEmulator> {
        let listen = UdpSocket::bind((loopback(hub), 0)).await?;
        let local = listen.local_addr()?;
        let state = State::new(spec);
        let (plan, plan_rx) = watch::channel(RebindPlan {
            every: state.spec.rebind,
            anchor: state.anchor,
        });
        let (to_hub, to_hub_rx) = mpsc::unbounded_channel();
        let (to_agent, to_agent_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            hub,
            listen,
            state: Mutex::new(state),
            session: Mutex::new(None),
            plan,
            partitioned: AtomicBool::new(false),
            counters: [Counters::default(), Counters::default()],
            rebinds: AtomicU64::new(0),
            queues: [to_hub, to_agent],
            cancel,
        });
        tokio::spawn(read_client(Arc::clone(&shared)));
        tokio::spawn(deliver(Arc::clone(&shared), Dir::ToHub, to_hub_rx));
        tokio::spawn(deliver(Arc::clone(&shared), Dir::ToAgent, to_agent_rx));
        tokio::spawn(rebind_on_schedule(Arc::clone(&shared), plan_rx));
        Ok(LinkEmulator { local, shared })
    }

    /// The address the agent sends to instead of the hub's.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The hub's address.
    pub fn hub_addr(&self) -> SocketAddr {
        self.shared.hub
    }

    /// The address the hub sees the agent at now (`None` before the agent's first datagram).
    pub fn upstream_addr(&self) -> Option<SocketAddr> {
        lock(&self.shared.session)
            .as_ref()
            .and_then(|s| s.upstream.local_addr().ok())
    }

    /// The spec in force.
    pub fn spec(&self) -> LinkSpec {
        lock(&self.shared.state).spec.clone()
    }

    /// The seed of the draws in force: the spec's `seed`, else one taken from the clock.
    pub fn seed(&self) -> u64 {
        lock(&self.shared.state).seed
    }

    /// Replaces the spec for datagrams arriving from now on (those on their way keep their
    /// delivery time). It starts afresh: generators reseeded, rate queue empty, and the
    /// blackout and rebind schedules anchored now.
    pub fn set_spec(&self, spec: LinkSpec) {
        let state = State::new(spec);
        let plan = RebindPlan {
            every: state.spec.rebind,
            anchor: state.anchor,
        };
        *lock(&self.shared.state) = state;
        self.shared.plan.send_replace(plan);
    }

    /// Drops everything both ways while `true` (counted as `blacked_out`), whatever the spec.
    pub fn set_partitioned(&self, partitioned: bool) {
        self.shared
            .partitioned
            .store(partitioned, Ordering::Relaxed);
    }

    /// What the emulator has done so far.
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            to_hub: self.shared.counters(Dir::ToHub).snapshot(),
            to_agent: self.shared.counters(Dir::ToAgent).snapshot(),
            rebinds: self.shared.rebinds.load(Ordering::Relaxed),
        }
    }

    /// The token that stops the emulator.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Stops forwarding; every socket closes once its task sees the cancellation.
    pub fn shutdown(&self) {
        self.shared.cancel.cancel();
    }
}

impl Drop for LinkEmulator {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Reads the agent's datagrams (towards the hub).
async fn read_client(shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            () = shared.cancel.cancelled() => return,
            r = shared.listen.recv_from(&mut buf) => match r {
                Ok(r) => r,
                // ICMP errors surface here on some platforms; the socket stays usable.
                Err(_) => continue,
            },
        };
        let current = lock(&shared.session).as_ref().map(|s| s.client);
        if current != Some(client)
            && let Err(e) = shared.open_session(client)
        {
            tracing::warn!(%client, error = %e, "link emulator: no upstream socket");
            let c = shared.counters(Dir::ToHub);
            Counters::count(&c.received);
            Counters::count(&c.unsent);
            continue;
        }
        shared.admit(
            Dir::ToHub,
            Bytes::copy_from_slice(buf.get(..n).unwrap_or_default()),
        );
    }
}

/// Reads what the hub sends to one upstream socket (towards the agent).
async fn read_upstream(shared: Arc<Shared>, socket: Arc<UdpSocket>, stop: CancellationToken) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let n = tokio::select! {
            () = stop.cancelled() => return,
            r = socket.recv(&mut buf) => match r {
                Ok(n) => n,
                // ECONNREFUSED from an ICMP port-unreachable: the hub is not listening yet.
                Err(_) => continue,
            },
        };
        shared.admit(
            Dir::ToAgent,
            Bytes::copy_from_slice(buf.get(..n).unwrap_or_default()),
        );
    }
}

/// A datagram waiting for its time, ordered by time then arrival.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    at: Instant,
    seq: u64,
    data: Bytes,
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends each queued datagram of one direction at its time (jitter may reorder them).
async fn deliver(shared: Arc<Shared>, dir: Dir, mut rx: mpsc::UnboundedReceiver<(Instant, Bytes)>) {
    let mut pending = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let next = pending.peek().map(|Reverse(p): &Reverse<Pending>| p.at);
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            item = rx.recv() => {
                let Some((at, data)) = item else { return };
                pending.push(Reverse(Pending { at, seq, data }));
                seq += 1;
            }
            () = sleep_until(next) => {
                let now = Instant::now();
                while pending.peek().is_some_and(|Reverse(p)| p.at <= now) {
                    if let Some(Reverse(p)) = pending.pop() {
                        shared.send(dir, p.data).await;
                    }
                }
            }
        }
    }
}

/// Rebinds every `every` of the plan in force, counted from its anchor.
async fn rebind_on_schedule(shared: Arc<Shared>, mut plan: watch::Receiver<RebindPlan>) {
    loop {
        let RebindPlan { every, anchor } = *plan.borrow_and_update();
        let next = every.and_then(|every| {
            // A spec built in code is not checked as a parsed one is.
            let every = every.max(MIN_REBIND);
            let since = Instant::now().saturating_duration_since(anchor);
            let k = since.as_nanos() / every.as_nanos().max(1) + 1;
            let offset = u64::try_from(every.as_nanos() * k).ok()?;
            anchor.checked_add(Duration::from_nanos(offset))
        });
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            changed = plan.changed() => if changed.is_err() { return },
            () = sleep_until(next) => {
                if let Err(e) = shared.rebind() {
                    tracing::warn!(error = %e, "link emulator: rebind failed, keeping the socket");
                }
            }
        }
    }
}
