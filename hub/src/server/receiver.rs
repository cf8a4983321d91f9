//! The thread that takes the hub's QUIC datagrams off its UDP socket.
//!
//! quinn's endpoint driver reads every datagram from the socket and hands it to its
//! connection's task. On the runtime of the sessions and the controllers it waits its turn
//! behind them, and while it waits the kernel's socket buffer fills and drops what follows:
//! a planning pass over 10,000 members, or the cryptography of a hundred handshakes, let the
//! kernel drop 30,000 datagrams during the fleet bench's first connections (`ss -uam`), and
//! a dropped first packet of a handshake costs its agent a 3 s timeout. Here the driver runs
//! alone on a runtime of its own, in a thread of its own that the kernel wakes as datagrams
//! arrive; the connections, sessions and controllers stay on the hub's runtime.

use std::io;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The receive thread; it ends when this is dropped (after the endpoint closed).
#[derive(Debug)]
pub struct Receiver {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl Receiver {
    /// Starts the thread and its runtime.
    pub fn start() -> io::Result<Self> {
        let (started, start) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("kedge-quic-rx".to_owned())
            .spawn(move || {
                let runtime = match Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let _ = started.send(Ok(runtime.handle().clone()));
                // Until the hub lets go of the receiver; the runtime is dropped here, in a
                // thread of its own, where that may block.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        let handle = start
            .recv()
            .map_err(|_| io::Error::other("the QUIC receive thread ended as it started"))??;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }

    /// Runs `create` (which creates the endpoint) on this thread's runtime: quinn registers
    /// the socket with it and spawns its endpoint driver there. The connections it accepts
    /// run where `accept` is awaited.
    pub fn enter<R>(&self, create: impl FnOnce() -> R) -> R {
        let _entered = self.handle.enter();
        create()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::net::{SocketAddr, UdpSocket};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// The kernel's count of datagrams dropped for the UDP socket bound to `addr`.
    fn drops(addr: SocketAddr) -> u64 {
        let local = format!(":{:04X}", addr.port());
        std::fs::read_to_string("/proc/net/udp")
            .unwrap()
            .lines()
            .skip(1)
            .find(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|a| a.ends_with(&local))
            })
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap()
    }

    /// An endpoint on a socket with the kernel's default buffers, created in `enter`'s context.
    fn endpoint(
        enter: impl FnOnce(&dyn Fn() -> quinn::Endpoint) -> quinn::Endpoint,
    ) -> quinn::Endpoint {
        enter(&|| {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                None,
                socket,
                Arc::new(quinn::TokioRuntime),
            )
            .unwrap()
        })
    }

    /// 4,000 datagrams of 1,200 bytes (about ten times the default socket buffer) in bursts
    /// of 40 a millisecond apart, while the thread that runs the hub's runtime is busy.
    fn burst(to: SocketAddr) {
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let datagram = [0u8; 1200];
        for _ in 0..100 {
            for _ in 0..40 {
                sender.send_to(&datagram, to).unwrap();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    #[test]
    fn datagrams_are_read_while_the_hubs_runtime_is_busy() {
        // The hub's runtime, kept busy by this thread (it runs nothing during the burst).
        let hub = Builder::new_current_thread().enable_all().build().unwrap();

        // With the endpoint driver on the busy runtime, the kernel drops the burst...
        let on_hub = endpoint(|create| {
            let _entered = hub.enter();
            create()
        });
        let addr = on_hub.local_addr().unwrap();
        burst(addr);
        assert!(drops(addr) > 1_000, "{} dropped", drops(addr));

        // ...and with it on the receive thread, not one datagram.
        let receiver = Receiver::start().unwrap();
        let on_receiver = endpoint(|create| receiver.enter(create));
        let addr = on_receiver.local_addr().unwrap();
        burst(addr);
        assert_eq!(drops(addr), 0);
        drop(receiver);
    }
}
