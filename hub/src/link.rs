//! What each member's link costs and how it behaves, from the hub's end of the agent's QUIC
//! connection: UDP bytes and datagrams both ways, loss and round-trip time, read from quinn's
//! connection statistics when the session starts, at every heartbeat and when it ends.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One reading of a session's connection (also what a relaying replica sends of its agents'
/// connections, see `server/relay.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSample {
    /// The agent's address as the connection now sees it (changes with QUIC migration).
    pub remote: Option<SocketAddr>,
    /// UDP payload bytes the hub sent.
    pub bytes_sent: u64,
    /// UDP payload bytes the hub received.
    pub bytes_received: u64,
    /// Datagrams the hub sent.
    pub packets_sent: u64,
    /// Datagrams the hub received.
    pub packets_received: u64,
    /// Packets the hub declared lost.
    pub lost_packets: u64,
    /// Smoothed round-trip time.
    pub rtt: Duration,
}

impl LinkSample {
    /// Reads `connection`'s statistics now.
    pub fn of(connection: &quinn::Connection) -> Self {
        let stats = connection.stats();
        Self {
            remote: Some(connection.remote_address()),
            bytes_sent: stats.udp_tx.bytes,
            bytes_received: stats.udp_rx.bytes,
            packets_sent: stats.udp_tx.datagrams,
            packets_received: stats.udp_rx.datagrams,
            lost_packets: stats.path.lost_packets,
            rtt: stats.path.rtt,
        }
    }
}

/// What a member's current or last session carried, as `/v1/sessions` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkTraffic {
    /// UDP payload bytes the hub sent in this session.
    pub bytes_sent: u64,
    /// UDP payload bytes the hub received in this session.
    pub bytes_received: u64,
    /// Datagrams the hub sent.
    pub packets_sent: u64,
    /// Datagrams the hub received.
    pub packets_received: u64,
    /// Packets the hub declared lost.
    pub lost_packets: u64,
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u64,
    /// Bytes both ways until the session was established: the QUIC and TLS handshake and
    /// the `Hello` (a resumed TLS session costs less than a full one).
    pub handshake_bytes: u64,
    /// Datagrams both ways until the session was established. A reconnect with more than
    /// the first connection had resent one (the agent or the hub was slow to answer, or a
    /// datagram was lost).
    #[serde(default)]
    pub handshake_packets: u64,
    /// Times the agent's address changed under the live session (NAT rebinding), each
    /// carried over by QUIC connection migration rather than a new handshake.
    pub migrations: u64,
    /// When these figures were read, Unix milliseconds (0: never).
    pub sampled_unix_ms: i64,
}

/// How much `sample` adds to what `before` counted: the deltas the per-member counters of
/// `/metrics` grow by. Counters never go back, so a smaller figure adds nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkDelta {
    /// Bytes sent since.
    pub bytes_sent: u64,
    /// Bytes received since.
    pub bytes_received: u64,
    /// Datagrams sent since.
    pub packets_sent: u64,
    /// Datagrams received since.
    pub packets_received: u64,
}

impl From<&LinkSample> for LinkDelta {
    /// What the first reading of a session adds: everything it counted.
    fn from(sample: &LinkSample) -> Self {
        Self {
            bytes_sent: sample.bytes_sent,
            bytes_received: sample.bytes_received,
            packets_sent: sample.packets_sent,
            packets_received: sample.packets_received,
        }
    }
}

impl LinkTraffic {
    /// The figures of a session established with `handshake` read.
    pub fn established(handshake: &LinkSample, at_unix_ms: i64) -> Self {
        let mut traffic = Self::default();
        traffic.record(handshake, at_unix_ms);
        traffic.handshake_bytes = handshake.bytes_sent + handshake.bytes_received;
        traffic.handshake_packets = handshake.packets_sent + handshake.packets_received;
        traffic
    }

    /// Takes in a later reading of the same session; returns what it adds.
    pub fn record(&mut self, sample: &LinkSample, at_unix_ms: i64) -> LinkDelta {
        let delta = LinkDelta {
            bytes_sent: sample.bytes_sent.saturating_sub(self.bytes_sent),
            bytes_received: sample.bytes_received.saturating_sub(self.bytes_received),
            packets_sent: sample.packets_sent.saturating_sub(self.packets_sent),
            packets_received: sample
                .packets_received
                .saturating_sub(self.packets_received),
        };
        self.bytes_sent = self.bytes_sent.max(sample.bytes_sent);
        self.bytes_received = self.bytes_received.max(sample.bytes_received);
        self.packets_sent = self.packets_sent.max(sample.packets_sent);
        self.packets_received = self.packets_received.max(sample.packets_received);
        self.lost_packets = self.lost_packets.max(sample.lost_packets);
        self.rtt_us = u64::try_from(sample.rtt.as_micros()).unwrap_or(u64::MAX);
        self.sampled_unix_ms = at_unix_ms;
        delta
    }

    /// The smoothed round-trip time.
    pub fn rtt(&self) -> Duration {
        Duration::from_micros(self.rtt_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent: u64, received: u64, rtt_ms: u64) -> LinkSample {
        LinkSample {
            remote: None,
            bytes_sent: sent,
            bytes_received: received,
            packets_sent: sent / 100,
            packets_received: received / 100,
            lost_packets: 0,
            rtt: Duration::from_millis(rtt_ms),
        }
    }

    #[test]
    fn a_session_counts_its_handshake_then_grows_by_deltas() {
        let mut t = LinkTraffic::established(&sample(3_000, 2_000, 1), 10);
        assert_eq!((t.handshake_bytes, t.handshake_packets), (5_000, 50));
        assert_eq!((t.bytes_sent, t.bytes_received), (3_000, 2_000));
        // The first reading adds all it counted.
        let first = LinkDelta::from(&sample(3_000, 2_000, 1));
        assert_eq!(
            first,
            LinkTraffic::default().record(&sample(3_000, 2_000, 1), 0)
        );
        assert_eq!((first.bytes_sent, first.packets_received), (3_000, 20));
        let d = t.record(&sample(3_100, 2_300, 600), 20);
        assert_eq!((d.bytes_sent, d.bytes_received), (100, 300));
        assert_eq!((d.packets_sent, d.packets_received), (1, 3));
        assert_eq!(t.rtt(), Duration::from_millis(600));
        assert_eq!(t.sampled_unix_ms, 20);
        // The handshake stays what it was.
        assert_eq!((t.handshake_bytes, t.handshake_packets), (5_000, 50));
    }

    #[test]
    fn a_smaller_reading_adds_nothing_and_counts_never_go_back() {
        let mut t = LinkTraffic::established(&sample(3_000, 2_000, 1), 0);
        let d = t.record(&sample(10, 10, 1), 1);
        assert_eq!(d, LinkDelta::default());
        assert_eq!((t.bytes_sent, t.bytes_received), (3_000, 2_000));
    }
}
