//! Who is connected: one entry per member that ever connected since the hub started, with its
//! live session (if any), versions, address and heartbeat freshness.
//!
//! Time is a parameter (`now`), so liveness rules are tested without sleeping.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use kedge_protocol::unix_ms;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::HubMetrics;

/// Connection state of a member as the hub sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionState {
    /// A session is open and heartbeats arrive in time.
    Connected,
    /// No session, or heartbeats stopped for longer than the tolerance.
    Unreachable,
}

impl SessionState {
    /// The label used in metrics and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "Connected",
            Self::Unreachable => "Unreachable",
        }
    }
}

/// What a freshly handshaken session tells the registry.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Member name from the client certificate.
    pub member: String,
    /// Unique session id.
    pub session_id: String,
    /// Peer address.
    pub remote_addr: SocketAddr,
    /// Agent build version.
    pub agent_version: String,
    /// Member kube-apiserver version.
    pub kubernetes_version: String,
    /// Negotiated protocol version.
    pub protocol_version: u16,
    /// Client certificate expiry, Unix seconds.
    pub cert_not_after_unix: i64,
}

/// One member as shown by `/v1/sessions` and `kubectl kedge sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberSession {
    /// Member name from the client certificate.
    pub member: String,
    /// Current state.
    pub state: SessionState,
    /// Why the member is unreachable, empty when connected.
    pub reason: String,
    /// Id of the current or last session.
    pub session_id: String,
    /// Peer address of the current or last session.
    pub remote_addr: String,
    /// Agent build version.
    pub agent_version: String,
    /// Member kube-apiserver version.
    pub kubernetes_version: String,
    /// Negotiated protocol version.
    pub protocol_version: u16,
    /// When the current or last session was established, Unix milliseconds.
    pub connected_since_unix_ms: i64,
    /// When the last heartbeat arrived, Unix milliseconds.
    pub last_heartbeat_unix_ms: i64,
    /// Client certificate expiry, Unix seconds.
    pub cert_not_after_unix: i64,
    /// Sessions this member opened since the hub started.
    pub sessions: u64,
}

#[derive(Debug)]
struct Entry {
    view: MemberSession,
    last_heartbeat: Instant,
    /// Cancelled to end the live session (replacement, revocation); `None` when disconnected.
    live: Option<CancellationToken>,
}

/// Liveness rule: a member is unreachable once `tolerance` heartbeat intervals pass without one.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// Heartbeat interval the hub asks agents for.
    pub interval: Duration,
    /// Missed intervals tolerated before a member is `Unreachable`.
    pub tolerance: u32,
}

impl Liveness {
    /// How long a member may stay silent.
    pub fn deadline(&self) -> Duration {
        self.interval.saturating_mul(self.tolerance.max(1))
    }
}

/// The session registry.
#[derive(Debug)]
pub struct SessionRegistry {
    entries: Mutex<BTreeMap<String, Entry>>,
    liveness: Liveness,
    metrics: HubMetrics,
}

impl SessionRegistry {
    /// An empty registry.
    pub fn new(liveness: Liveness, metrics: HubMetrics) -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            liveness,
            metrics,
        }
    }

    /// The liveness rule in force.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        // A panic while holding the lock cannot leave an entry half-written (every update is
        // a plain field store), so a poisoned lock is still safe to use.
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn recount(&self, entries: &BTreeMap<String, Entry>) {
        let connected = entries
            .values()
            .filter(|e| e.view.state == SessionState::Connected)
            .count();
        self.metrics
            .set_sessions(connected as i64, (entries.len() - connected) as i64);
    }

    /// Records a new session and returns the token that ends it. A live older session of the
    /// same member is cancelled: the newer connection wins.
    pub fn register(&self, new: NewSession, now: Instant, wall: SystemTime) -> CancellationToken {
        let token = CancellationToken::new();
        let mut entries = self.lock();
        let sessions = entries.get(&new.member).map_or(0, |e| e.view.sessions) + 1;
        if let Some(old) = entries.get(&new.member).and_then(|e| e.live.as_ref()) {
            tracing::info!(member = %new.member, old_session = %entries[&new.member].view.session_id,
                new_session = %new.session_id, "newer session replaces the live one");
            old.cancel();
        }
        let view = MemberSession {
            member: new.member.clone(),
            state: SessionState::Connected,
            reason: String::new(),
            session_id: new.session_id,
            remote_addr: new.remote_addr.to_string(),
            agent_version: new.agent_version,
            kubernetes_version: new.kubernetes_version,
            protocol_version: new.protocol_version,
            connected_since_unix_ms: unix_ms(wall),
            last_heartbeat_unix_ms: unix_ms(wall),
            cert_not_after_unix: new.cert_not_after_unix,
            sessions,
        };
        entries.insert(
            new.member,
            Entry {
                view,
                last_heartbeat: now,
                live: Some(token.clone()),
            },
        );
        self.recount(&entries);
        token
    }

    /// Records a heartbeat of `session_id`; ignored when that session is no longer current.
    pub fn heartbeat(&self, member: &str, session_id: &str, now: Instant, wall: SystemTime) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(member) else {
            return;
        };
        if entry.view.session_id != session_id || entry.live.is_none() {
            return;
        }
        entry.last_heartbeat = now;
        entry.view.last_heartbeat_unix_ms = unix_ms(wall);
        if entry.view.state != SessionState::Connected {
            tracing::info!(member, "heartbeats resumed");
            entry.view.state = SessionState::Connected;
            entry.view.reason.clear();
            self.recount(&entries);
        }
    }

    /// Records that `session_id` renewed its certificate, now valid until `not_after_unix`.
    pub fn certificate_renewed(&self, member: &str, session_id: &str, not_after_unix: i64) {
        let mut entries = self.lock();
        if let Some(entry) = entries
            .get_mut(member)
            .filter(|e| e.view.session_id == session_id)
        {
            entry.view.cert_not_after_unix = not_after_unix;
        }
    }

    /// Records the end of `session_id`; ignored when a newer session already replaced it.
    pub fn disconnected(&self, member: &str, session_id: &str, reason: &str) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(member) else {
            return;
        };
        if entry.view.session_id != session_id {
            return;
        }
        entry.live = None;
        entry.view.state = SessionState::Unreachable;
        entry.view.reason = format!("session closed: {reason}");
        self.recount(&entries);
    }

    /// Ends the live session of `member`, if any (revocation). Returns whether one was live.
    pub fn end_session(&self, member: &str) -> bool {
        let entries = self.lock();
        entries
            .get(member)
            .and_then(|e| e.live.as_ref())
            .map(CancellationToken::cancel)
            .is_some()
    }

    /// Marks members whose heartbeats are overdue as `Unreachable`; returns their names.
    pub fn sweep(&self, now: Instant) -> Vec<String> {
        let deadline = self.liveness.deadline();
        let mut entries = self.lock();
        let mut newly = Vec::new();
        for (member, entry) in entries.iter_mut() {
            let silent = now.saturating_duration_since(entry.last_heartbeat);
            if entry.view.state == SessionState::Connected && silent > deadline {
                entry.view.state = SessionState::Unreachable;
                entry.view.reason = format!(
                    "no heartbeat for {} (tolerance {} x {})",
                    humantime::format_duration(round_ms(silent)),
                    self.liveness.tolerance,
                    humantime::format_duration(self.liveness.interval),
                );
                newly.push(member.clone());
            }
        }
        if !newly.is_empty() {
            self.recount(&entries);
        }
        newly
    }

    /// Every member, sorted by name.
    pub fn snapshot(&self) -> Vec<MemberSession> {
        self.lock().values().map(|e| e.view.clone()).collect()
    }

    /// One member.
    pub fn get(&self, member: &str) -> Option<MemberSession> {
        self.lock().get(member).map(|e| e.view.clone())
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> SessionRegistry {
        let liveness = Liveness {
            interval: Duration::from_secs(1),
            tolerance: 3,
        };
        SessionRegistry::new(liveness, HubMetrics::default())
    }

    fn session(member: &str, id: &str) -> NewSession {
        NewSession {
            member: member.into(),
            session_id: id.into(),
            remote_addr: "127.0.0.1:5000".parse().unwrap(),
            agent_version: "0.1.0".into(),
            kubernetes_version: "v1.33.1".into(),
            protocol_version: 1,
            cert_not_after_unix: 0,
        }
    }

    #[test]
    fn a_member_turns_unreachable_only_after_the_tolerance() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        r.register(session("a", "s1"), t0, wall);
        assert!(r.sweep(t0 + Duration::from_millis(2_900)).is_empty());
        r.heartbeat("a", "s1", t0 + Duration::from_secs(2), wall);
        assert!(r.sweep(t0 + Duration::from_millis(4_900)).is_empty());
        assert_eq!(
            r.sweep(t0 + Duration::from_millis(5_100)),
            vec!["a".to_string()]
        );
        let a = r.get("a").unwrap();
        assert_eq!(a.state, SessionState::Unreachable);
        assert!(a.reason.contains("no heartbeat"), "{}", a.reason);
        // Reported once, not on every sweep.
        assert!(r.sweep(t0 + Duration::from_secs(9)).is_empty());
        // A late heartbeat of the same session brings it back.
        r.heartbeat("a", "s1", t0 + Duration::from_secs(10), wall);
        assert_eq!(r.get("a").unwrap().state, SessionState::Connected);
    }

    #[test]
    fn a_newer_session_replaces_the_old_one_and_the_old_end_is_ignored() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let first = r.register(session("a", "s1"), t0, wall);
        let second = r.register(session("a", "s2"), t0, wall);
        assert!(first.is_cancelled());
        assert!(!second.is_cancelled());
        // The replaced session's handler reports its end late: nothing changes.
        r.disconnected("a", "s1", "replaced");
        let a = r.get("a").unwrap();
        assert_eq!(
            (a.state, a.session_id.as_str(), a.sessions),
            (SessionState::Connected, "s2", 2)
        );
        // Heartbeats of the old session are ignored.
        r.heartbeat("a", "s1", t0 + Duration::from_secs(60), wall);
        assert_eq!(r.sweep(t0 + Duration::from_secs(4)), vec!["a".to_string()]);
    }

    #[test]
    fn a_closed_session_is_unreachable_at_once_and_can_be_ended() {
        let r = registry();
        let t0 = Instant::now();
        let token = r.register(session("b", "s1"), t0, SystemTime::now());
        assert!(r.end_session("b"));
        assert!(token.is_cancelled());
        r.disconnected("b", "s1", "revoked");
        let b = r.get("b").unwrap();
        assert_eq!(b.state, SessionState::Unreachable);
        assert_eq!(b.reason, "session closed: revoked");
        assert!(!r.end_session("b"));
        assert!(!r.end_session("nobody"));
    }
}
