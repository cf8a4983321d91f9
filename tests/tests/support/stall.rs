//! Peers that start a handshake and fall silent.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A client that sends a QUIC Initial from `from` and, with `answer_retry`, answers the hub's
/// Retry with a validated Initial, then falls silent: a TLS handshake that never finishes.
/// Driven by quinn-proto by hand, so nothing is sent that the test did not ask for.
pub struct Stalled {
    _socket: UdpSocket,
    _connection: quinn_proto::Connection,
}

pub fn stall(
    hub: SocketAddr,
    from: &str,
    answer_retry: bool,
    config: quinn::ClientConfig,
) -> Stalled {
    let socket = UdpSocket::bind(SocketAddr::new(ip(from), 0)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let (_, mut connection) = endpoint
        .connect(Instant::now(), config, hub, "localhost")
        .unwrap();
    let flush = |connection: &mut quinn_proto::Connection| {
        let mut buf = Vec::new();
        while let Some(transmit) = connection.poll_transmit(Instant::now(), 1, &mut buf) {
            socket
                .send_to(&buf[..transmit.size], transmit.destination)
                .unwrap();
            buf.clear();
        }
    };
    flush(&mut connection);
    if answer_retry {
        let mut datagram = vec![0u8; 65_536];
        let (n, remote) = socket.recv_from(&mut datagram).expect("the hub answers");
        let mut response = Vec::new();
        let event = endpoint.handle(
            Instant::now(),
            remote,
            None,
            None,
            bytes::BytesMut::from(&datagram[..n]),
            &mut response,
        );
        let Some(quinn_proto::DatagramEvent::ConnectionEvent(_, event)) = event else {
            panic!("expected the hub's Retry for the connection")
        };
        connection.handle_event(event);
        flush(&mut connection);
    }
    Stalled {
        _socket: socket,
        _connection: connection,
    }
}
