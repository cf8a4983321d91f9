//! Who is connected: one entry per member that ever connected since the hub started, with its
//! live session (if any), versions, address and heartbeat freshness.
//!
//! Time is a parameter (`now`), so liveness rules are tested without sleeping.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kedge_protocol::unix_ms;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::link::{LinkDelta, LinkSample, LinkTraffic};
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
    /// The enrollment the certificate is bound to (`PeerIdentity::enrollment_uid`).
    pub enrollment_uid: Option<String>,
    /// The connection's figures once established: what the handshake cost.
    pub link: LinkSample,
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
    /// The enrollment (`MemberCluster` uid) the current or last session's certificate is
    /// bound to, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment_uid: Option<String>,
    /// Sessions this member opened since the hub started.
    pub sessions: u64,
    /// Set while two agents present this member's certificate: the address of the last one
    /// refused because the other held a live session.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub duplicate_from: String,
    /// What the current or last session's connection carried.
    #[serde(default)]
    pub link: LinkTraffic,
}

/// Replacements of a live, heartbeating session from elsewhere within [`CONTEST_WINDOW`]
/// after which the member is taken to have two agents with one certificate.
pub const CONTESTS: usize = 3;
/// See [`CONTESTS`].
pub const CONTEST_WINDOW: Duration = Duration::from_secs(60);
/// How long after the last contested attempt a member stays flagged as duplicated (while
/// flagged, a live session is never replaced: the second agent is refused and reported).
pub const DUPLICATE_HOLD: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Entry {
    /// Shared with the controllers' snapshots, which then copy nothing; a change while a
    /// snapshot is held copies it (`Arc::make_mut`).
    view: Arc<MemberSession>,
    last_heartbeat: Instant,
    /// Cancelled to end the live session (replacement, revocation); `None` when disconnected.
    live: Option<CancellationToken>,
    /// Why the live session is being ended by the hub (revocation), if it is.
    ending: Option<String>,
    /// When live sessions were replaced from another address, the latest [`CONTESTS`].
    contested: Vec<Instant>,
    /// Until when a second agent is refused instead of replacing the live session.
    duplicate_until: Option<Instant>,
    /// Since when the member has had no `MemberCluster` and no live session, as
    /// [`SessionRegistry::forget_departed`] last saw it.
    departed_since: Option<Instant>,
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
    /// How long a member may stay silent on a perfect link.
    pub fn deadline(&self) -> Duration {
        self.interval.saturating_mul(self.tolerance.max(1))
    }

    /// How long a member whose link has round-trip time `rtt` may stay silent: the
    /// tolerance plus what QUIC takes to recover a heartbeat lost three times in a row
    /// ([`kedge_net::tls::loss_recovery`]), so that a slow, lossy link is not a dead one.
    pub fn deadline_at(&self, rtt: Duration) -> Duration {
        self.deadline()
            .saturating_add(kedge_net::tls::loss_recovery(rtt))
    }
}

/// The session registry.
#[derive(Debug)]
pub struct SessionRegistry {
    entries: Mutex<BTreeMap<String, Entry>>,
    /// How many entries are `Connected`, changed with each change of state under the
    /// entries' lock: counting them at every registration made a reconnect storm of N
    /// members cost N² (4–8% of the hub's CPU at 10,000, `perf`).
    connected: AtomicUsize,
    liveness: Liveness,
    metrics: HubMetrics,
}

impl SessionRegistry {
    /// An empty registry.
    pub fn new(liveness: Liveness, metrics: HubMetrics) -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            connected: AtomicUsize::new(0),
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

    /// Counts `became` more (or, negative, fewer) `Connected` entries and publishes the
    /// gauges; called under the entries' lock.
    fn recount(&self, entries: &BTreeMap<String, Entry>, became: isize) {
        let connected = if became >= 0 {
            self.connected
                .fetch_add(became.unsigned_abs(), Ordering::Relaxed)
                + became.unsigned_abs()
        } else {
            self.connected
                .fetch_sub(became.unsigned_abs(), Ordering::Relaxed)
                - became.unsigned_abs()
        };
        debug_assert_eq!(
            connected,
            entries
                .values()
                .filter(|e| e.view.state == SessionState::Connected)
                .count()
        );
        self.metrics
            .set_sessions(connected as i64, (entries.len() - connected) as i64);
    }

    /// Records a new session and returns the token that ends it. A live older session of the
    /// same member is cancelled: the newer connection wins.
    pub fn register(&self, new: NewSession, now: Instant, wall: SystemTime) -> CancellationToken {
        let token = CancellationToken::new();
        let mut entries = self.lock();
        let sessions = entries.get(&new.member).map_or(0, |e| e.view.sessions) + 1;
        let was_connected = entries
            .get(&new.member)
            .is_some_and(|e| e.view.state == SessionState::Connected);
        let deadline = self.liveness.deadline();
        let (mut contested, duplicate_until) = entries
            .get(&new.member)
            .map(|e| (e.contested.clone(), e.duplicate_until))
            .unwrap_or_default();
        if let Some(old) = entries.get(&new.member)
            && let Some(live) = &old.live
        {
            tracing::info!(member = %new.member, old_session = %old.view.session_id,
                new_session = %new.session_id, "newer session replaces the live one");
            let fresh = now.saturating_duration_since(old.last_heartbeat) <= deadline;
            if fresh && old.view.remote_addr != new.remote_addr.to_string() {
                contested.retain(|t| now.saturating_duration_since(*t) <= CONTEST_WINDOW);
                contested.push(now);
                if contested.len() > CONTESTS {
                    contested.remove(0);
                }
            }
            live.cancel();
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
            enrollment_uid: new.enrollment_uid,
            sessions,
            duplicate_from: String::new(),
            link: LinkTraffic::established(&new.link, unix_ms(wall)),
        };
        self.metrics.member_session(&new.member);
        (self.metrics).member_link(&new.member, &LinkDelta::from(&new.link), new.link.rtt);
        entries.insert(
            new.member,
            Entry {
                view: Arc::new(view),
                last_heartbeat: now,
                live: Some(token.clone()),
                ending: None,
                contested,
                duplicate_until,
                departed_since: None,
            },
        );
        self.recount(&entries, isize::from(!was_connected));
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
        let view = Arc::make_mut(&mut entry.view);
        view.last_heartbeat_unix_ms = unix_ms(wall);
        if view.state != SessionState::Connected {
            tracing::info!(member, "heartbeats resumed");
            view.state = SessionState::Connected;
            view.reason.clear();
            self.recount(&entries, 1);
        }
    }

    /// Records a reading of `session_id`'s connection (at a heartbeat, or as it ends); ignored
    /// when that session is no longer current. An address other than the session's is a
    /// migration: the agent's NAT rebound or it moved, and the session carried on.
    pub fn link_observed(
        &self,
        member: &str,
        session_id: &str,
        sample: &LinkSample,
        wall: SystemTime,
    ) {
        let mut entries = self.lock();
        let Some(entry) = entries
            .get_mut(member)
            .filter(|e| e.view.session_id == session_id)
        else {
            return;
        };
        let view = Arc::make_mut(&mut entry.view);
        let delta = view.link.record(sample, unix_ms(wall));
        self.metrics.member_link(member, &delta, sample.rtt);
        if let Some(remote) = sample.remote
            && remote.to_string() != view.remote_addr
        {
            tracing::info!(member, from = %view.remote_addr, to = %remote,
                "the agent's address changed; the session migrated with it");
            view.remote_addr = remote.to_string();
            view.link.migrations += 1;
            self.metrics.member_migrated(member);
        }
    }

    /// Records that `session_id` renewed its certificate, now valid until `not_after_unix`.
    pub fn certificate_renewed(&self, member: &str, session_id: &str, not_after_unix: i64) {
        let mut entries = self.lock();
        if let Some(entry) = entries
            .get_mut(member)
            .filter(|e| e.view.session_id == session_id)
        {
            Arc::make_mut(&mut entry.view).cert_not_after_unix = not_after_unix;
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
        let view = Arc::make_mut(&mut entry.view);
        let was_connected = view.state == SessionState::Connected;
        view.state = SessionState::Unreachable;
        view.reason = format!("session closed: {reason}");
        self.recount(&entries, -isize::from(was_connected));
    }

    /// Ends the live session of `member`, if any, as a newer session would replace it.
    /// Returns whether one was live.
    pub fn end_session(&self, member: &str) -> bool {
        self.lock()
            .get(member)
            .and_then(|e| e.live.as_ref())
            .map(CancellationToken::cancel)
            .is_some()
    }

    /// Ends the live session of `member`, if any, saying `why` (revocation). Returns whether
    /// one was live.
    pub fn revoke(&self, member: &str, why: &str) -> bool {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(member) else {
            return false;
        };
        let Some(live) = &entry.live else {
            return false;
        };
        live.cancel();
        entry.ending = Some(why.to_owned());
        true
    }

    /// Why the hub ends `session_id` of `member`, when it revokes it (`None`: replaced).
    pub fn ending(&self, member: &str, session_id: &str) -> Option<String> {
        let entries = self.lock();
        let entry = entries.get(member)?;
        (entry.view.session_id == session_id)
            .then(|| entry.ending.clone())
            .flatten()
    }

    /// Members with a live session and the enrollment of its certificate.
    pub fn live_members(&self) -> Vec<(String, Option<String>)> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.live.is_some())
            .map(|(m, e)| (m.clone(), e.view.enrollment_uid.clone()))
            .collect()
    }

    /// Whether a new session of `member` from `remote` must be refused because two agents
    /// present the member's certificate: its live session keeps heartbeating and was already
    /// contested [`CONTESTS`] times within [`CONTEST_WINDOW`] (or the member is still flagged
    /// from that). Returns the message for both sides' logs, and flags the member in
    /// `/v1/sessions` (`duplicateFrom`).
    pub fn duplicate(&self, member: &str, remote: SocketAddr, now: Instant) -> Option<String> {
        let deadline = self.liveness.deadline();
        let mut entries = self.lock();
        let entry = entries.get_mut(member)?;
        let live =
            entry.live.is_some() && now.saturating_duration_since(entry.last_heartbeat) <= deadline;
        let contested = entry.contested.len() >= CONTESTS
            && entry
                .contested
                .first()
                .is_some_and(|t| now.saturating_duration_since(*t) <= CONTEST_WINDOW);
        let flagged = entry.duplicate_until.is_some_and(|until| now < until);
        if !live || !(contested || flagged) {
            return None;
        }
        entry.duplicate_until = Some(now + DUPLICATE_HOLD);
        Arc::make_mut(&mut entry.view).duplicate_from = remote.to_string();
        Some(format!(
            "member {member:?} already has a live session from {} and its certificate is \
             also used from {remote}: two agents share one identity; stop one of them or \
             enroll it under its own name",
            entry.view.remote_addr
        ))
    }

    /// Marks members whose heartbeats are overdue (for their link's round-trip time, see
    /// [`Liveness::deadline_at`]) as `Unreachable`; returns their names.
    pub fn sweep(&self, now: Instant) -> Vec<String> {
        let mut entries = self.lock();
        let mut newly = Vec::new();
        for (member, entry) in entries.iter_mut() {
            let silent = now.saturating_duration_since(entry.last_heartbeat);
            let rtt = entry.view.link.rtt();
            let deadline = self.liveness.deadline_at(rtt);
            if entry.view.state == SessionState::Connected && silent > deadline {
                let view = Arc::make_mut(&mut entry.view);
                view.state = SessionState::Unreachable;
                view.reason = format!(
                    "no heartbeat for {} (tolerance {} x {}, plus {} for loss recovery at {} round trip)",
                    humantime::format_duration(round_ms(silent)),
                    self.liveness.tolerance,
                    humantime::format_duration(self.liveness.interval),
                    humantime::format_duration(round_ms(
                        deadline.saturating_sub(self.liveness.deadline())
                    )),
                    humantime::format_duration(round_ms(rtt)),
                );
                newly.push(member.clone());
            }
        }
        if !newly.is_empty() {
            self.recount(&entries, -(newly.len() as isize));
        }
        newly
    }

    /// Forgets the members `departed` says are gone once they have had no live session for
    /// as long as it says to keep them: their `/v1/sessions` entry, with the revocation's
    /// reason, and their per-member metric series. `departed` is given each member without a
    /// live session and the enrollment of its last session's certificate, and says how long
    /// to keep it, or `None` while the member is enrolled. Without it a fleet whose members
    /// come and go would list every member it ever had, count each as `Unreachable` in
    /// `kedge_hub_sessions`, and keep their series for the hub's life. Returns the members
    /// forgotten, each with the id of its last session.
    pub fn forget_departed(
        &self,
        now: Instant,
        departed: impl Fn(&str, Option<&str>) -> Option<Duration>,
    ) -> Vec<(String, String)> {
        let mut entries = self.lock();
        let mut gone = Vec::new();
        for (member, entry) in entries.iter_mut() {
            let keep = match entry.live {
                Some(_) => None,
                None => departed(member, entry.view.enrollment_uid.as_deref()),
            };
            let Some(keep) = keep else {
                entry.departed_since = None;
                continue;
            };
            let since = *entry.departed_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= keep {
                gone.push((member.clone(), entry.view.session_id.clone()));
            }
        }
        for (member, _) in &gone {
            entries.remove(member);
            self.metrics.forget_member(member);
        }
        if !gone.is_empty() {
            // Only entries without a live session go, none of them `Connected`.
            self.recount(&entries, 0);
        }
        gone
    }

    /// Every member, sorted by name.
    pub fn snapshot(&self) -> Vec<MemberSession> {
        self.lock().values().map(|e| (*e.view).clone()).collect()
    }

    /// Names of the members with a session record (connected or not).
    pub fn names(&self) -> BTreeSet<String> {
        self.lock().keys().cloned().collect()
    }

    /// One member.
    pub fn get(&self, member: &str) -> Option<MemberSession> {
        self.lock().get(member).map(|e| (*e.view).clone())
    }

    /// One member, shared with the registry (nothing is copied).
    pub fn shared(&self, member: &str) -> Option<Arc<MemberSession>> {
        self.lock().get(member).map(|e| e.view.clone())
    }

    /// Every member, shared with the registry, sorted by name.
    pub fn shared_all(&self) -> Vec<Arc<MemberSession>> {
        self.lock().values().map(|e| e.view.clone()).collect()
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> SessionRegistry {
        measured_registry().0
    }

    /// A registry (1 s heartbeats, a tolerance of 3) and the metrics it publishes to.
    fn measured_registry() -> (SessionRegistry, HubMetrics) {
        let metrics = HubMetrics::default();
        let liveness = Liveness {
            interval: Duration::from_secs(1),
            tolerance: 3,
        };
        (SessionRegistry::new(liveness, metrics.clone()), metrics)
    }

    /// What `metrics` expose on `/metrics`.
    fn exposition(metrics: &HubMetrics) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
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
            enrollment_uid: None,
            link: LinkSample::default(),
        }
    }

    /// The `kedge_hub_sessions` gauges of `metrics`: (Connected, Unreachable).
    fn gauges(metrics: &HubMetrics) -> (i64, i64) {
        let text = exposition(metrics);
        let value = |state: &str| {
            let prefix = format!("kedge_hub_sessions{{state=\"{state}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .map_or(0, |v| v.parse().unwrap())
        };
        (value("Connected"), value("Unreachable"))
    }

    #[test]
    fn the_session_gauges_follow_every_change_of_state() {
        let (r, metrics) = measured_registry();
        let (t0, wall) = (Instant::now(), SystemTime::now());
        r.register(session("a", "a1"), t0, wall);
        r.register(session("b", "b1"), t0, wall);
        r.register(session("c", "c1"), t0, wall);
        assert_eq!(gauges(&metrics), (3, 0));
        // A replacement is still one connected member.
        r.register(session("a", "a2"), t0, wall);
        assert_eq!(gauges(&metrics), (3, 0));
        // The replaced session's late end changes nothing; the current one's does.
        r.disconnected("a", "a1", "replaced");
        assert_eq!(gauges(&metrics), (3, 0));
        r.disconnected("a", "a2", "closed");
        assert_eq!(gauges(&metrics), (2, 1));
        // A closed session ended twice is counted once.
        r.disconnected("a", "a2", "closed");
        assert_eq!(gauges(&metrics), (2, 1));
        // Silent members turn unreachable together; a heartbeat brings one back.
        r.heartbeat("c", "c1", t0 + Duration::from_secs(4), wall);
        assert_eq!(r.sweep(t0 + Duration::from_secs(4)), vec!["b".to_string()]);
        assert_eq!(gauges(&metrics), (1, 2));
        r.heartbeat("b", "b1", t0 + Duration::from_secs(5), wall);
        assert_eq!(gauges(&metrics), (2, 1));
        // A member unreachable by silence that reconnects counts once.
        assert_eq!(r.sweep(t0 + Duration::from_secs(20)).len(), 2);
        assert_eq!(gauges(&metrics), (0, 3));
        r.register(session("b", "b2"), t0, wall);
        r.register(session("a", "a3"), t0, wall);
        assert_eq!(gauges(&metrics), (2, 1));
    }

    /// The member series of `metrics`, as exposed.
    fn member_series(metrics: &HubMetrics, member: &str) -> Vec<String> {
        let text = exposition(metrics);
        let label = format!("member=\"{member}\"");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&label))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_deleted_member_is_forgotten_with_its_series_once_its_retention_has_passed() {
        let (r, metrics) = measured_registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let retain = Duration::from_secs(60);
        let at = |s: u64| t0 + Duration::from_secs(s);
        for member in ["gone", "kept", "live"] {
            r.register(session(member, &format!("{member}-1")), t0, wall);
        }
        assert_eq!(member_series(&metrics, "gone").len(), 6);
        r.disconnected("gone", "gone-1", "revoked: MemberCluster deleted");
        r.disconnected("kept", "kept-1", "link lost");
        let deleted = |m: &str, _: Option<&str>| (m != "kept").then_some(retain);
        // A deleted member whose session is live (not yet revoked) is never forgotten; a
        // member with a MemberCluster neither, however long it has been unreachable.
        assert!(r.forget_departed(at(1), deleted).is_empty());
        assert!(r.forget_departed(at(60), deleted).is_empty());
        assert_eq!(gauges(&metrics), (1, 2));
        let forgotten = r.forget_departed(at(61), deleted);
        assert_eq!(forgotten, vec![("gone".to_string(), "gone-1".to_string())]);
        assert_eq!(r.names(), BTreeSet::from(["kept".into(), "live".into()]));
        assert!(member_series(&metrics, "gone").is_empty());
        assert_eq!(member_series(&metrics, "kept").len(), 6);
        assert_eq!(gauges(&metrics), (1, 1));
        // A member set up again before its retention passed starts over.
        r.disconnected("live", "live-1", "revoked");
        assert!(r.forget_departed(at(100), deleted).is_empty());
        assert!(r.forget_departed(at(130), |_, _| None).is_empty());
        assert!(r.forget_departed(at(170), deleted).is_empty());
        assert_eq!(
            r.forget_departed(at(230), deleted),
            vec![("live".to_string(), "live-1".to_string())]
        );
        // Forgetting is not a revocation of what comes later: the same name enrolled again
        // gets a session, counted from one.
        r.register(session("gone", "gone-2"), at(231), wall);
        assert_eq!(r.get("gone").unwrap().sessions, 1);
        assert_eq!(gauges(&metrics), (1, 1));
    }

    /// The record of a member whose `MemberCluster` was created anew (another enrollment) is
    /// forgotten at once: the name is the new member's, which never connected yet.
    #[test]
    fn a_record_of_an_earlier_enrollment_goes_as_soon_as_its_session_ended() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let enrolled = |uid: &str| NewSession {
            enrollment_uid: Some(uid.to_owned()),
            ..session("m", &format!("s-{uid}"))
        };
        r.register(enrolled("uid-1"), t0, wall);
        // The MemberCluster now has uid-2: the record is of uid-1.
        let now_enrolled =
            |_: &str, uid: Option<&str>| (uid != Some("uid-2")).then_some(Duration::ZERO);
        assert!(r.forget_departed(t0, now_enrolled).is_empty(), "live");
        r.disconnected("m", "s-uid-1", "revoked: MemberCluster deleted");
        assert_eq!(
            r.forget_departed(t0, now_enrolled),
            vec![("m".to_string(), "s-uid-1".to_string())]
        );
        assert!(r.get("m").is_none());
        // The new enrollment's record stays, however long it is away.
        r.register(enrolled("uid-2"), t0, wall);
        r.disconnected("m", "s-uid-2", "link lost");
        let later = t0 + Duration::from_secs(3600);
        assert!(r.forget_departed(later, now_enrolled).is_empty());
    }

    #[test]
    fn a_member_turns_unreachable_only_after_the_tolerance() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        r.register(session("a", "s1"), t0, wall);
        assert!(r.sweep(t0 + Duration::from_millis(2_900)).is_empty());
        r.heartbeat("a", "s1", t0 + Duration::from_secs(2), wall);
        // 3 s of tolerance and 175 ms of loss recovery on a link without delay.
        assert!(r.sweep(t0 + Duration::from_millis(5_150)).is_empty());
        assert_eq!(
            r.sweep(t0 + Duration::from_millis(5_200)),
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
        assert_eq!(r.live_members(), vec![("b".to_owned(), None)]);
        assert_eq!(r.ending("b", "s1"), None);
        assert!(r.revoke("b", "MemberCluster deleted"));
        assert!(token.is_cancelled());
        assert_eq!(
            r.ending("b", "s1").as_deref(),
            Some("MemberCluster deleted")
        );
        assert_eq!(r.ending("b", "s0"), None);
        r.disconnected("b", "s1", "revoked");
        let b = r.get("b").unwrap();
        assert_eq!(b.state, SessionState::Unreachable);
        assert_eq!(b.reason, "session closed: revoked");
        assert!(r.live_members().is_empty());
        assert!(!r.revoke("b", "again"));
        assert!(!r.revoke("nobody", "x"));
    }

    #[test]
    fn a_slow_lossy_link_gets_time_for_loss_recovery_and_says_so() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let far = LinkSample {
            rtt: Duration::from_millis(600),
            ..LinkSample::default()
        };
        r.register(
            NewSession {
                link: far,
                ..session("edge", "s1")
            },
            t0,
            wall,
        );
        // 3 s of tolerance plus 7 probe timeouts of 1.225 s: 11.575 s.
        assert!(r.sweep(t0 + Duration::from_millis(11_500)).is_empty());
        assert_eq!(r.sweep(t0 + Duration::from_millis(11_600)), vec!["edge"]);
        let reason = r.get("edge").unwrap().reason;
        assert!(
            reason.contains("plus 8s 575ms for loss recovery at 600ms round trip"),
            "{reason}"
        );
    }

    #[test]
    fn link_readings_count_traffic_and_migrations_of_the_current_session_only() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let handshake = LinkSample {
            remote: Some("127.0.0.1:5000".parse().unwrap()),
            bytes_sent: 4_000,
            bytes_received: 3_000,
            ..LinkSample::default()
        };
        r.register(
            NewSession {
                link: handshake,
                ..session("a", "s1")
            },
            t0,
            wall,
        );
        let later = LinkSample {
            bytes_sent: 4_100,
            bytes_received: 3_050,
            ..handshake
        };
        r.link_observed("a", "s1", &later, wall);
        let a = r.get("a").unwrap();
        assert_eq!(
            (a.link.handshake_bytes, a.link.bytes_sent, a.link.migrations),
            (7_000, 4_100, 0)
        );
        // The NAT rebound: same session, new address.
        let moved = LinkSample {
            remote: Some("127.0.0.1:6000".parse().unwrap()),
            bytes_sent: 4_200,
            ..later
        };
        r.link_observed("a", "s1", &moved, wall);
        let a = r.get("a").unwrap();
        assert_eq!(
            (a.remote_addr.as_str(), a.link.migrations, a.sessions),
            ("127.0.0.1:6000", 1, 1)
        );
        // A replaced session's late reading changes nothing.
        r.register(session("a", "s2"), t0, wall);
        r.link_observed("a", "s1", &moved, wall);
        assert_eq!(r.get("a").unwrap().link.migrations, 0);
    }

    fn from(member: &str, id: &str, addr: &str) -> NewSession {
        NewSession {
            remote_addr: addr.parse().unwrap(),
            ..session(member, id)
        }
    }

    #[test]
    fn two_agents_with_one_certificate_are_flagged_and_stop_replacing_each_other() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let (x, y) = ("127.0.0.1:1000", "127.0.0.2:2000");
        // A restarted agent replacing its own stale session once is no duplicate.
        r.register(from("a", "s1", x), t0, wall);
        assert_eq!(r.duplicate("a", y.parse().unwrap(), t0), None);
        // Two agents: each replaces the other while it still heartbeats.
        for (i, addr) in [y, x, y].into_iter().enumerate() {
            let now = t0 + Duration::from_secs(i as u64 + 1);
            assert_eq!(
                r.duplicate("a", addr.parse().unwrap(), now),
                None,
                "attempt {i}"
            );
            r.register(from("a", &format!("s{}", i + 2), addr), now, wall);
        }
        // The next attempt is refused and the member is flagged.
        let now = t0 + Duration::from_secs(5);
        let message = r.duplicate("a", x.parse().unwrap(), now).unwrap();
        assert!(
            message.contains("two agents share one identity"),
            "{message}"
        );
        assert_eq!(r.get("a").unwrap().duplicate_from, x);
        // Still refused after the window, while the holder heartbeats.
        let later = t0 + CONTEST_WINDOW + Duration::from_secs(30);
        r.heartbeat("a", "s4", later, wall);
        assert!(r.duplicate("a", x.parse().unwrap(), later).is_some());
        // Once the holder's session ends, the other agent gets in.
        r.disconnected("a", "s4", "gone");
        assert_eq!(r.duplicate("a", x.parse().unwrap(), later), None);
    }

    #[test]
    fn replacing_a_silent_session_is_no_contest() {
        let r = registry();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        r.register(from("a", "s1", "127.0.0.1:1"), t0, wall);
        // Heartbeats stopped (deadline 3 s): each replacement is a reconnect, not a duplicate.
        for i in 0..5u64 {
            let now = t0 + Duration::from_secs(10 * (i + 1));
            assert_eq!(r.duplicate("a", "127.0.0.9:9".parse().unwrap(), now), None);
            r.register(
                from("a", &format!("s{}", i + 2), &format!("127.0.0.{}:1", i + 2)),
                now,
                wall,
            );
        }
    }
}
