//! The agent at the other end of a session: either its own QUIC connection to this hub, or a
//! connection another hub replica holds and relays to this one (the active replica of a
//! sharded hub, see `relay`). A session reads and closes both alike.

use std::sync::{Arc, Mutex};

use kedge_protocol::close_code;
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::link::LinkSample;

/// An agent's connection, as a session sees it.
#[derive(Debug, Clone)]
pub(crate) enum Peer {
    /// The agent's own connection to this hub.
    Direct(Connection),
    /// The agent's connection to another replica, relayed stream by stream.
    Relayed(Arc<Relayed>),
}

/// A relayed agent connection: the replica that holds it sends each of the agent's streams
/// on a stream of its relay connection, and learns on the relay's control stream when this
/// hub closes the session (see `relay`).
#[derive(Debug)]
pub(crate) struct Relayed {
    /// The replica that holds the agent's connection.
    pub(crate) replica: String,
    /// Cancelled once the session is closed, by either end.
    pub(crate) closed: CancellationToken,
    /// Why it closed: the agent's or the relay's words, or the close this hub asked for.
    pub(crate) reason: Mutex<Option<String>>,
    /// The close this hub asked for, for the relay to pass on to the agent.
    pub(crate) close: Mutex<Option<(u32, String)>>,
    /// Tells the relay to pass a close on.
    pub(crate) close_requested: CancellationToken,
    /// The agent's further streams, in the order it opened them.
    pub(crate) streams: tokio::sync::Mutex<mpsc::Receiver<(SendStream, RecvStream)>>,
    /// The latest reading of the agent's connection, sent by the replica that holds it.
    pub(crate) sample: Mutex<LinkSample>,
}

impl Relayed {
    /// Marks the session closed for `reason`, unless it already was.
    pub(crate) fn ended(&self, reason: String) {
        let mut stored = lock(&self.reason);
        if stored.is_none() {
            *stored = Some(reason);
        }
        self.closed.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Peer {
    /// Closes the agent's connection with `code` and `reason`.
    pub(crate) fn close(&self, code: u32, reason: &str) {
        match self {
            Peer::Direct(connection) => connection.close(VarInt::from_u32(code), reason.as_bytes()),
            Peer::Relayed(relayed) => {
                if relayed.closed.is_cancelled() {
                    return;
                }
                *lock(&relayed.close) = Some((code, reason.to_owned()));
                relayed.ended(format!(
                    "closed by this hub ({}: {reason})",
                    close_code::name(u64::from(code))
                ));
                relayed.close_requested.cancel();
            }
        }
    }

    /// Waits until the connection is closed, by either end.
    pub(crate) async fn closed(&self) {
        match self {
            Peer::Direct(connection) => {
                connection.closed().await;
            }
            Peer::Relayed(relayed) => relayed.closed.cancelled().await,
        }
    }

    /// The next stream the agent opens; `Err` with why the connection ended.
    pub(crate) async fn accept_bi(&self) -> Result<(SendStream, RecvStream), String> {
        match self {
            Peer::Direct(connection) => connection
                .accept_bi()
                .await
                .map_err(|e| closed_reason(connection).unwrap_or_else(|| clean_error(&e))),
            Peer::Relayed(relayed) => {
                let mut streams = relayed.streams.lock().await;
                tokio::select! {
                    biased;
                    stream = streams.recv() => stream.ok_or_else(|| self.ended_reason()),
                    _ = relayed.closed.cancelled() => Err(self.ended_reason()),
                }
            }
        }
    }

    /// Why the connection ended, if it did.
    pub(crate) fn close_reason(&self) -> Option<String> {
        match self {
            Peer::Direct(connection) => closed_reason(connection),
            Peer::Relayed(relayed) => relayed.closed.is_cancelled().then(|| self.ended_reason()),
        }
    }

    fn ended_reason(&self) -> String {
        match self {
            Peer::Direct(_) => "connection ended".to_owned(),
            Peer::Relayed(relayed) => lock(&relayed.reason)
                .clone()
                .unwrap_or_else(|| format!("relay from hub replica {} ended", relayed.replica)),
        }
    }

    /// Reads the connection's statistics now (for a relayed one: the replica's last reading).
    pub(crate) fn sample(&self) -> LinkSample {
        match self {
            Peer::Direct(connection) => LinkSample::of(connection),
            Peer::Relayed(relayed) => *lock(&relayed.sample),
        }
    }
}

/// A connection error as text safe to log: a peer's close reason is its own bytes.
pub(crate) fn clean_error(error: &quinn::ConnectionError) -> String {
    kedge_protocol::clean_text(&error.to_string(), kedge_protocol::MAX_MESSAGE_BYTES)
}

/// The reason the connection already closed, if it did; the agent's own words cleaned.
pub(crate) fn closed_reason(connection: &Connection) -> Option<String> {
    connection.close_reason().map(|e| match e {
        quinn::ConnectionError::ApplicationClosed(c) => format!(
            "agent closed the connection ({}: {})",
            close_code::name(c.error_code.into_inner()),
            kedge_protocol::clean_text(
                &String::from_utf8_lossy(&c.reason),
                kedge_protocol::MAX_MESSAGE_BYTES
            )
        ),
        other => clean_error(&other),
    })
}
