//! The hub's UDP socket. QUIC's datagrams reach the hub in bursts: a thousand agents
//! reconnecting after a restart, or acknowledging a fan-out, at once. A socket with the
//! kernel's default receive buffer (208 KiB on Linux) overflows, and the kernel drops what
//! does not fit: the fleet bench counted thousands of drops a minute at 1,000 members
//! (`/proc/net/udp`), and a dropped first packet of a handshake costs that agent its
//! handshake timeout. The hub asks for [`SOCKET_BUFFER`]; the kernel grants at most
//! `net.core.rmem_max` / `net.core.wmem_max`.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// The receive and send buffers the hub asks for.
pub const SOCKET_BUFFER: usize = 8 << 20;
/// Below this receive buffer the hub warns at startup: bursts will be dropped.
pub const LOW_RECEIVE_BUFFER: usize = 1 << 20;

/// A bound UDP socket and the buffers the kernel granted.
#[derive(Debug)]
pub struct Bound {
    /// The socket, ready for `quinn::Endpoint::new`.
    pub socket: std::net::UdpSocket,
    /// The receive buffer granted, in bytes (as the kernel reports it).
    pub receive_buffer: usize,
    /// The send buffer granted, in bytes.
    pub send_buffer: usize,
}

/// Binds `addr` with receive and send buffers of up to `buffer` bytes each. Asking for more
/// than the kernel allows is not an error: the kernel grants its maximum, and
/// [`Bound::receive_buffer`] says what that was.
pub fn bind(addr: SocketAddr, buffer: usize) -> io::Result<Bound> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort by design: a refusal leaves the default, which `receive_buffer` reports.
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    socket.bind(&addr.into())?;
    let receive_buffer = socket.recv_buffer_size()?;
    let send_buffer = socket.send_buffer_size()?;
    Ok(Bound {
        socket: socket.into(),
        receive_buffer,
        send_buffer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctl(name: &str) -> Option<usize> {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    #[test]
    fn the_socket_gets_the_largest_buffer_the_kernel_allows() {
        let default = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let default = socket2::SockRef::from(&default).recv_buffer_size().unwrap();
        let bound = bind("127.0.0.1:0".parse().unwrap(), SOCKET_BUFFER).unwrap();
        assert!(bound.socket.local_addr().unwrap().port() > 0);
        assert!(
            bound.receive_buffer >= default,
            "{bound:?} < default {default}"
        );
        // Where the kernel allows more than its default, the hub gets more (Linux reports
        // twice what it grants, for its bookkeeping).
        if let Some(max) = sysctl("rmem_max") {
            let granted = SOCKET_BUFFER.min(max);
            assert!(bound.receive_buffer >= granted, "{bound:?}, rmem_max {max}");
        }
        if let Some(max) = sysctl("wmem_max") {
            assert!(
                bound.send_buffer >= SOCKET_BUFFER.min(max),
                "{bound:?}, wmem_max {max}"
            );
        }
        // The address is taken: a second bind fails with the system's error.
        let taken = bound.socket.local_addr().unwrap();
        assert!(bind(taken, SOCKET_BUFFER).is_err());
    }
}
