//! `MemberCluster` status: what the hub knows of each registered member's agent session:
//! state, versions, last heartbeat, certificate expiry and capacity. MemberClusters are
//! created by enrollment (`kubectl kedge mc setup-member`) or by hand, never by the hub.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kedge_core::crd::conditions::{
    CONDITION_READY, MemberPhase, REASON_CONNECTED, REASON_NOT_CONNECTED, condition,
};
use kedge_core::crd::member::{MemberCapacity, MemberLink};
use kedge_core::crd::{GROUP, MemberCluster, MemberClusterStatus, VERSION};
use kedge_core::time::from_unix_ms;
use kedge_protocol::ClusterCapacity;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{instrument, warn};

use super::{FIELD_MANAGER, Shared, bounded};
use crate::Result;
use crate::fleet::MemberSnapshot;
use crate::registry::SessionState;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "membercluster";
/// Longest wait between two passes (heartbeat times move even when nothing else does).
const RESYNC: Duration = Duration::from_secs(5);
/// Shortest wait between two passes.
const THROTTLE: Duration = Duration::from_millis(500);
/// When only `lastHeartbeatTime` moved, it is written at most this often (as a Node's status
/// is): writing every heartbeat would be 2,000 writes a second at 10,000 members with 5 s
/// heartbeats. Liveness itself is the hub's, not this field's.
pub const HEARTBEAT_REFRESH: Duration = Duration::from_secs(30);
/// Refreshes a second, on average, whatever the fleet size: status writes that bring a Ready
/// member's new session (address, link, the session in `Ready`'s message) or only its
/// heartbeat time. A hub restart or a network blip gives thousands of members a new session
/// at once; written at once, 10,000 such writes took the simulated hub cluster twice the CPU
/// the hub's 10,000 TLS handshakes took, in the very seconds the agents reconnect
/// (docs/scale.md, fifth round).
const REFRESH_WRITES_PER_SECOND: usize = 50;
/// Status writes one pass keeps in flight. After a hub restart or a reconnect storm every
/// member's status changes at once; written one after the other, 10,000 of them took minutes.
const WRITES_IN_FLIGHT: usize = 16;

/// The MemberCluster controller's context.
#[derive(Debug)]
pub struct MemberContext {
    /// What every controller shares.
    pub shared: Arc<Shared>,
    /// When the controller started.
    started: tokio::time::Instant,
    /// How long after the start MemberClusters of absent agents keep their state.
    startup_grace: Duration,
    /// When the hub cluster's MemberCluster CRD was found without `status.link` (a CRD older
    /// than this hub: Helm does not upgrade CRDs): statuses go without it until
    /// [`LINK_RETRY`] later.
    link_refused: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// How long after the CRD refused `status.link` the hub tries it again (an operator may have
/// applied the current CRDs meanwhile).
const LINK_RETRY: Duration = Duration::from_secs(600);

/// Whether a pass writes `status.link`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkMode {
    /// Every status carries it.
    Write,
    /// The CRD refused it: no status carries it.
    Omit,
    /// The CRD refused it a while ago: the first write of the pass tries it again.
    Probe,
}

/// Whether `error` is the API server refusing `status.link` as a field its schema lacks.
fn refuses_link(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.message.contains(".status.link") && status.message.contains("not declared in schema"))
}

impl MemberContext {
    /// The MemberCluster controller's context, starting now.
    pub fn new(shared: Arc<Shared>) -> Self {
        // Agents notice a lost hub only after their own heartbeat deadline and then back off
        // before dialing again: give them two deadlines.
        let startup_grace = shared
            .fleet
            .registry()
            .liveness()
            .deadline()
            .saturating_mul(2);
        Self {
            shared,
            started: tokio::time::Instant::now(),
            startup_grace,
            link_refused: std::sync::Mutex::new(None),
        }
    }

    /// Whether statuses carry `status.link`: yes, unless the CRD refused it; once
    /// [`LINK_RETRY`] passed since, one write tries it again.
    fn link_mode(&self) -> LinkMode {
        let refused = self
            .link_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *refused {
            None => LinkMode::Write,
            Some(at) if at.elapsed() >= LINK_RETRY => LinkMode::Probe,
            Some(_) => LinkMode::Omit,
        }
    }

    /// Records that the CRD took `status.link` (the current CRDs were applied).
    fn link_accepted(&self) {
        let mut refused = self
            .link_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused.take().is_some() {
            tracing::info!(
                "the MemberCluster CRD now has status.link; writing the link figures again"
            );
        }
    }

    /// Records that the CRD refused `status.link`, with a warning the first time.
    fn link_refused(&self) {
        let mut refused = self
            .link_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused.is_none() {
            warn!(
                "the MemberCluster CRD in the hub cluster has no status.link (it is older than this hub; \
                   Helm does not upgrade CRDs): statuses are written without the link figures, which \
                   /metrics and /v1/sessions still show. Apply the current CRDs: kubectl kedge crds | kubectl apply -f -"
            );
        }
        *refused = Some(tokio::time::Instant::now());
    }

    /// Whether the hub started so recently that agents may not have reconnected yet.
    fn starting(&self) -> bool {
        self.started.elapsed() < self.startup_grace
    }
}

fn capacity(c: &ClusterCapacity) -> MemberCapacity {
    let q = |s: String| Quantity(s);
    MemberCapacity {
        allocatable: BTreeMap::from([
            (
                "cpu".to_owned(),
                q(format!("{}m", c.allocatable_cpu_millis)),
            ),
            (
                "memory".to_owned(),
                q(c.allocatable_memory_bytes.to_string()),
            ),
            ("nodes".to_owned(), q(c.ready_nodes.to_string())),
        ]),
        allocated: BTreeMap::from([
            ("cpu".to_owned(), q(format!("{}m", c.requested_cpu_millis))),
            ("memory".to_owned(), q(c.requested_memory_bytes.to_string())),
        ]),
    }
}

fn ready_condition(
    ok: bool,
    reason: &str,
    message: String,
    old: Option<&MemberClusterStatus>,
) -> Condition {
    let previous = old.map(|o| o.conditions.as_slice()).unwrap_or_default();
    condition(
        previous,
        CONDITION_READY,
        ok,
        reason,
        message,
        None,
        std::time::SystemTime::now(),
    )
}

/// The status of a member the hub has a session record of.
pub fn status(
    snapshot: &MemberSnapshot,
    old: Option<&MemberClusterStatus>,
) -> Option<MemberClusterStatus> {
    let session = snapshot.session.as_ref()?;
    let connected = session.state == SessionState::Connected;
    Some(MemberClusterStatus {
        state: Some(
            if connected {
                MemberPhase::Ready
            } else {
                MemberPhase::Unreachable
            }
            .to_string(),
        ),
        agent_version: Some(session.agent_version.clone()),
        kubernetes_version: Some(session.kubernetes_version.clone()),
        address: Some(session.remote_addr.clone()),
        last_heartbeat_time: Some(from_unix_ms(session.last_heartbeat_unix_ms)),
        certificate_expiry: Some(from_unix_ms(
            session.cert_not_after_unix.saturating_mul(1000),
        )),
        // What the status says until this process has the member's report: a restarted hub
        // has none before the agent's first full report, and the capacity would vanish from
        // the status for a write and come back with the next.
        capacity: snapshot
            .capacity
            .as_ref()
            .map(capacity)
            .or_else(|| old.and_then(|o| o.capacity.clone())),
        link: Some(link(session)),
        conditions: vec![if connected {
            ready_condition(
                true,
                REASON_CONNECTED,
                format!(
                    "session {} from {}",
                    session.session_id, session.remote_addr
                ),
                old,
            )
        } else {
            ready_condition(false, REASON_NOT_CONNECTED, session.reason.clone(), old)
        }],
    })
}

/// The session's link figures as the status shows them.
fn link(session: &crate::registry::MemberSession) -> MemberLink {
    let traffic = &session.link;
    MemberLink {
        session_start: Some(from_unix_ms(session.connected_since_unix_ms)),
        observed_time: (traffic.sampled_unix_ms > 0).then(|| from_unix_ms(traffic.sampled_unix_ms)),
        rtt_milliseconds: traffic.rtt_us / 1000,
        bytes_sent: traffic.bytes_sent,
        bytes_received: traffic.bytes_received,
        packets_sent: traffic.packets_sent,
        packets_received: traffic.packets_received,
        lost_packets: traffic.lost_packets,
        handshake_bytes: traffic.handshake_bytes,
        migrations: traffic.migrations,
    }
}

/// What writing `wanted` over `current` would bring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worth {
    /// Nothing: it is written, or only a heartbeat time younger than [`HEARTBEAT_REFRESH`]
    /// moved (and the link figures that move with every heartbeat).
    Nothing,
    /// Only the heartbeat time (and link figures), written [`HEARTBEAT_REFRESH`] ago or more.
    Heartbeat,
    /// A new session of a member that was and is `Ready`, with nothing else changed: its
    /// address, link figures and the session named in `Ready`'s message. Its state, versions,
    /// certificate and capacity are what the status says already.
    Session,
    /// Something else changed.
    Change,
}

/// Whether `wanted` is worth writing over `current`: anything but the heartbeat time changed,
/// or the written heartbeat time is [`HEARTBEAT_REFRESH`] old.
pub fn worth_writing(current: Option<&MemberClusterStatus>, wanted: &MemberClusterStatus) -> Worth {
    let Some(current) = current else {
        return Worth::Change;
    };
    if current == wanted {
        return Worth::Nothing;
    }
    let mut same_beat = wanted.clone();
    same_beat.last_heartbeat_time = current.last_heartbeat_time.clone();
    // Traffic counters and the round trip move with every heartbeat, as its time does; a
    // new session (its start) is a change.
    if let (Some(link), Some(written)) = (same_beat.link.as_mut(), current.link.as_ref())
        && link.session_start == written.session_start
    {
        *link = written.clone();
    }
    if &same_beat != current {
        return if new_session_only(current, &same_beat) {
            Worth::Session
        } else {
            Worth::Change
        };
    }
    match (&current.last_heartbeat_time, &wanted.last_heartbeat_time) {
        (Some(written), Some(now)) => {
            let age_ms = now.0.as_millisecond() - written.0.as_millisecond();
            if age_ms.unsigned_abs() >= HEARTBEAT_REFRESH.as_millis() as u64 {
                Worth::Heartbeat
            } else {
                Worth::Nothing
            }
        }
        _ => Worth::Change,
    }
}

/// Whether `wanted` differs from `current` only in what a new session of a member that stays
/// `Ready` brings: its address, its link figures, its heartbeat time and the message of a
/// condition whose status and reason stay.
fn new_session_only(current: &MemberClusterStatus, wanted: &MemberClusterStatus) -> bool {
    let ready = Some(MemberPhase::Ready.as_str());
    if current.state.as_deref() != ready || wanted.state.as_deref() != ready {
        return false;
    }
    let mut same = wanted.clone();
    same.address.clone_from(&current.address);
    same.link.clone_from(&current.link);
    same.last_heartbeat_time
        .clone_from(&current.last_heartbeat_time);
    for condition in &mut same.conditions {
        if let Some(written) = current.conditions.iter().find(|c| {
            c.type_ == condition.type_
                && c.status == condition.status
                && c.reason == condition.reason
        }) {
            condition.message.clone_from(&written.message);
        }
    }
    &same == current
}

/// How many refreshes ([`Worth::Session`], then [`Worth::Heartbeat`]) a pass may write after
/// `since` the previous one: at most [`REFRESH_WRITES_PER_SECOND`] on average. Up to 1,500
/// members that refreshes each heartbeat time every [`HEARTBEAT_REFRESH`]; a larger fleet's
/// are refreshed less often (10,000 members: every 200 s, as a Node's status is when nothing
/// changes), oldest first, instead of bursts of thousands of writes every 30 s. After a hub
/// restart, 10,000 members' new sessions show in their statuses within 200 s, while their
/// state (`Ready`) never stopped being right.
fn refresh_budget(since: Duration) -> usize {
    let budget = since.as_secs_f64() * REFRESH_WRITES_PER_SECOND as f64;
    (budget as usize).clamp(1, REFRESH_WRITES_PER_SECOND * RESYNC.as_secs() as usize)
}

/// The status of a registered member that has not connected since the hub started.
pub fn absent_status(old: Option<&MemberClusterStatus>) -> MemberClusterStatus {
    let mut status = old.cloned().unwrap_or_default();
    let was_seen = old.is_some_and(|o| {
        o.state.is_some() && o.state.as_deref() != Some(MemberPhase::Pending.as_str())
    });
    status.state = Some(
        if was_seen {
            MemberPhase::Unreachable
        } else {
            MemberPhase::Pending
        }
        .to_string(),
    );
    status.conditions = vec![ready_condition(
        false,
        REASON_NOT_CONNECTED,
        if was_seen {
            "agent not connected since the hub started".to_owned()
        } else {
            "agent never connected".to_owned()
        },
        old,
    )];
    status
}

/// Whether the session `snapshot` shows (if any) is of `member`'s enrollment: its
/// certificate names no enrollment, or this `MemberCluster`'s uid.
fn of_enrollment(snapshot: &MemberSnapshot, member: &MemberCluster) -> bool {
    let uid = snapshot
        .session
        .as_ref()
        .and_then(|s| s.enrollment_uid.as_deref());
    uid.is_none_or(|uid| member.metadata.uid.as_deref() == Some(uid))
}

/// The statuses of `wanted` worth writing over what `current` says is written: every
/// [`Worth::Change`], then as many refreshes as `refreshes` allows: new sessions
/// ([`Worth::Session`]) before heartbeat times, the oldest heartbeat times first.
fn worth_its_write<'a>(
    wanted: BTreeMap<String, MemberClusterStatus>,
    current: impl Fn(&str) -> Option<&'a MemberClusterStatus>,
    refreshes: usize,
) -> Vec<(String, MemberClusterStatus)> {
    let mut writes = Vec::new();
    let mut sessions = Vec::new();
    let mut heartbeats = Vec::new();
    for (name, status) in wanted {
        let current = current(&name);
        match worth_writing(current, &status) {
            Worth::Change => writes.push((name, status)),
            Worth::Session => sessions.push((name, status)),
            Worth::Heartbeat => {
                let written = current.and_then(|c| c.last_heartbeat_time.clone());
                heartbeats.push((written, name, status));
            }
            Worth::Nothing => {}
        }
    }
    // The heartbeats written longest ago (by name among equals), as many as the budget has
    // room for. At 10,000 members nearly every member waits for its refresh and a pass has
    // room for a few dozen: the others are not sorted, and the statuses are not moved by the
    // sort (sorting all of them, about 8,500 statuses of ~600 bytes each, was a fifth of the
    // pass, docs/scale.md seventh round).
    let room = refreshes.saturating_sub(sessions.len());
    let oldest = first_in_order(&heartbeats, room, |a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let mut heartbeats: Vec<Option<(String, MemberClusterStatus)>> = heartbeats
        .into_iter()
        .map(|(_, name, status)| Some((name, status)))
        .collect();
    writes.extend(sessions.into_iter().take(refreshes));
    writes.extend(oldest.into_iter().filter_map(|i| heartbeats[i].take()));
    writes
}

/// The positions of the `n` first of `items` in the order `by`, first first, without sorting
/// (or moving) the rest: what a full sort's first `n` would be, for an order without ties.
fn first_in_order<T>(
    items: &[T],
    n: usize,
    by: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    let cmp = |a: &usize, b: &usize| by(&items[*a], &items[*b]);
    if n < order.len() {
        if n > 0 {
            order.select_nth_unstable_by(n - 1, cmp);
        }
        order.truncate(n);
    }
    order.sort_unstable_by(cmp);
    order
}

/// Writes MemberCluster status from the fleet until `shutdown`.
pub async fn run(ctx: Arc<MemberContext>, shutdown: CancellationToken) {
    let mut changes = ctx.shared.fleet.subscribe();
    let mut backoff = Duration::ZERO;
    let mut last_pass = tokio::time::Instant::now();
    loop {
        ctx.shared.metrics.reconciled(CONTROLLER);
        let refreshes = refresh_budget(last_pass.elapsed());
        last_pass = tokio::time::Instant::now();
        match sync(&ctx, &shutdown, refreshes).await {
            Ok(()) => backoff = Duration::ZERO,
            Err(error) => {
                warn!(%error, "MemberCluster status not written");
                ctx.shared
                    .metrics
                    .reconcile_failed(CONTROLLER, error.metric_label());
                // Back off while the hub cluster refuses: 1 s doubling to 30 s.
                backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(THROTTLE) => {}
        }
        changes.borrow_and_update();
    }
}

/// One pass: writes every status that changed, [`WRITES_IN_FLIGHT`] at a time, until the
/// first refused write or `shutdown`. A pass cut short by shutdown leaves the rest to the next
/// active hub, which recomputes every status from its own sessions: waiting for thousands of
/// writes would hold the Lease (and the standby) for as long.
#[instrument(skip_all)]
async fn sync(ctx: &MemberContext, shutdown: &CancellationToken, refreshes: usize) -> Result<()> {
    let api: Api<MemberCluster> = Api::all(ctx.shared.client.clone());
    let registered: BTreeMap<String, Arc<MemberCluster>> = ctx
        .shared
        .member_clusters()
        .await?
        .into_iter()
        .map(|m| (m.metadata.name.clone().unwrap_or_default(), m))
        .collect();
    let snapshots = ctx.shared.fleet.members();
    let link_mode = ctx.link_mode();
    let mut wanted: BTreeMap<String, MemberClusterStatus> = BTreeMap::new();
    for snapshot in &snapshots {
        // Only members with a MemberCluster get a session (see `crate::admission`); one
        // deleted meanwhile is not created again.
        let Some(member) = registered.get(&snapshot.name) else {
            continue;
        };
        // A session of an earlier enrollment is not this MemberCluster's: its state (revoked),
        // addresses and certificate belong to the member deleted before it.
        if !of_enrollment(snapshot, member) {
            continue;
        }
        let old = member.status.as_ref();
        if let Some(status) = status(snapshot, old) {
            wanted.insert(snapshot.name.clone(), status);
        }
    }
    for (name, member) in &registered {
        // Right after a hub start, agents are still finding the new hub.
        if !wanted.contains_key(name) && !name.is_empty() && !ctx.starting() {
            wanted.insert(name.clone(), absent_status(member.status.as_ref()));
        }
    }
    // Without `status.link` in the CRD, statuses are compared and written without it.
    let mut links = BTreeMap::new();
    if link_mode != LinkMode::Write {
        for (name, status) in &mut wanted {
            if let Some(link) = status.link.take() {
                links.insert(name.clone(), link);
            }
        }
    }
    let current = |name: &str| registered.get(name).and_then(|m| m.status.as_ref());
    let mut writes = worth_its_write(wanted, current, refreshes);
    if link_mode == LinkMode::Probe
        && let Some((name, status)) = writes.first_mut()
    {
        status.link = links.remove(name.as_str());
    }
    let writes = writes.into_iter().map(Ok);
    let api = &api;
    let written = futures::stream::iter(writes).try_for_each_concurrent(
        WRITES_IN_FLIGHT,
        |(name, mut status)| async move {
            let apply = |status: &MemberClusterStatus| {
                let patch = json!({
                    "apiVersion": format!("{GROUP}/{VERSION}"),
                    "kind": "MemberCluster",
                    "status": status,
                });
                let name = name.clone();
                async move {
                    let params = PatchParams::apply(FIELD_MANAGER).force();
                    api.patch_status(&name, &params, &Patch::Apply(&patch))
                        .await
                }
            };
            let first = bounded("apply MemberCluster status", apply(&status)).await;
            match first {
                // An older CRD: the rest of the status still goes.
                Err(crate::Error::Kube(e)) if status.link.is_some() && refuses_link(&e) => {
                    ctx.link_refused();
                    status.link = None;
                    bounded("apply MemberCluster status", apply(&status)).await?;
                }
                other => {
                    other?;
                    if status.link.is_some() {
                        ctx.link_accepted();
                    }
                }
            }
            ctx.shared.metrics.status_written(CONTROLLER);
            Ok(())
        },
    );
    tokio::select! {
        // Writes in flight are dropped: each is applied whole or not at all.
        _ = shutdown.cancelled() => Ok(()),
        done = written => done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::MemberSession;

    #[tokio::test(start_paused = true)]
    async fn absent_agents_keep_their_state_for_two_heartbeat_deadlines_after_the_start() {
        let shared = Shared::for_tests();
        let deadline = shared.fleet.registry().liveness().deadline();
        let ctx = MemberContext::new(shared);
        assert!(ctx.starting());
        tokio::time::advance(deadline * 2 - Duration::from_millis(1)).await;
        assert!(ctx.starting());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!ctx.starting());
    }

    fn snapshot(state: SessionState) -> MemberSnapshot {
        MemberSnapshot {
            session_reported: true,
            name: "m1".into(),
            session: Some(std::sync::Arc::new(MemberSession {
                member: "m1".into(),
                state,
                reason: "no heartbeat for 3s".into(),
                session_id: "s-1".into(),
                remote_addr: "127.0.0.1:9".into(),
                agent_version: "0.1.0".into(),
                kubernetes_version: "v1.33.0".into(),
                protocol_version: 1,
                connected_since_unix_ms: 1_000,
                last_heartbeat_unix_ms: 5_000,
                cert_not_after_unix: 86_400,
                enrollment_uid: Some("uid-1".into()),
                sessions: 1,
                duplicate_from: String::new(),
                link: crate::link::LinkTraffic::default(),
            })),
            workloads: Default::default(),
            capacity: Some(ClusterCapacity {
                nodes: 3,
                ready_nodes: 3,
                allocatable_cpu_millis: 24_000,
                allocatable_memory_bytes: 1 << 30,
                requested_cpu_millis: 500,
                requested_memory_bytes: 1 << 20,
            }),
            failures: vec![],
            revision: 1,
            acked_revision: 1,
            released: None,
            last_report: None,
        }
    }

    #[test]
    fn a_session_of_an_earlier_enrollment_is_not_the_member_clusters() {
        let member = |uid: &str| {
            let mut m = MemberCluster::new("m1", Default::default());
            m.metadata.uid = Some(uid.into());
            m
        };
        let mut snap = snapshot(SessionState::Unreachable);
        assert!(of_enrollment(&snap, &member("uid-1")));
        assert!(!of_enrollment(&snap, &member("uid-2")));
        // A certificate that names no enrollment, or no session at all: only the name counts.
        let session = snap.session.take().unwrap();
        assert!(of_enrollment(&snap, &member("uid-2")));
        snap.session = Some(std::sync::Arc::new(MemberSession {
            enrollment_uid: None,
            ..(*session).clone()
        }));
        assert!(of_enrollment(&snap, &member("uid-2")));
    }

    #[test]
    fn status_from_a_connected_session() {
        let s = status(&snapshot(SessionState::Connected), None).unwrap();
        assert_eq!(s.state.as_deref(), Some(MemberPhase::Ready.as_str()));
        assert_eq!(s.agent_version.as_deref(), Some("0.1.0"));
        assert_eq!(s.kubernetes_version.as_deref(), Some("v1.33.0"));
        assert_eq!(s.address.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(s.last_heartbeat_time.unwrap().0.as_second(), 5);
        assert_eq!(s.certificate_expiry.unwrap().0.as_second(), 86_400);
        let c = s.capacity.unwrap();
        assert_eq!(c.allocatable["cpu"].0, "24000m");
        assert_eq!(c.allocated["memory"].0, (1u64 << 20).to_string());
        assert_eq!(s.conditions[0].status, "True");
    }

    #[test]
    fn unreachable_and_absent_members_and_kept_transition_times() {
        let up = status(&snapshot(SessionState::Connected), None).unwrap();
        let down = status(&snapshot(SessionState::Unreachable), Some(&up)).unwrap();
        assert_eq!(
            down.state.as_deref(),
            Some(MemberPhase::Unreachable.as_str())
        );
        assert_eq!(down.conditions[0].message, "no heartbeat for 3s");
        let mut old = up.clone();
        old.conditions[0].last_transition_time = kedge_core::time::to_time(std::time::UNIX_EPOCH);
        let again = status(&snapshot(SessionState::Connected), Some(&old)).unwrap();
        assert_eq!(
            again.conditions[0].last_transition_time,
            kedge_core::time::to_time(std::time::UNIX_EPOCH)
        );

        assert_eq!(
            absent_status(None).state.as_deref(),
            Some(MemberPhase::Pending.as_str())
        );
        assert_eq!(worth_writing(None, &up), Worth::Change);
        assert_eq!(worth_writing(Some(&up), &up), Worth::Nothing);
        assert_eq!(worth_writing(Some(&up), &down), Worth::Change);
        let absent = absent_status(Some(&up));
        assert_eq!(
            absent.state.as_deref(),
            Some(MemberPhase::Unreachable.as_str())
        );
        assert_eq!(absent.agent_version.as_deref(), Some("0.1.0"));
    }

    #[test]
    fn a_heartbeat_alone_is_written_every_thirty_seconds() {
        let written = status(&snapshot(SessionState::Connected), None).unwrap();
        let mut later = snapshot(SessionState::Connected);
        let beat = |s: &mut MemberSnapshot, ms: i64| {
            if let Some(session) = s.session.as_mut() {
                std::sync::Arc::make_mut(session).last_heartbeat_unix_ms = ms;
            }
        };
        beat(&mut later, 5_000 + 29_999);
        let worth = |later: &MemberSnapshot| {
            worth_writing(Some(&written), &status(later, Some(&written)).unwrap())
        };
        assert_eq!(worth(&later), Worth::Nothing);
        // Traffic moves with every heartbeat: no write of its own either.
        if let Some(session) = later.session.as_mut() {
            let link = &mut std::sync::Arc::make_mut(session).link;
            link.bytes_received += 60;
            link.rtt_us = 612_000;
        }
        assert_eq!(worth(&later), Worth::Nothing);
        beat(&mut later, 5_000 + 30_000);
        assert_eq!(worth(&later), Worth::Heartbeat);
        let refreshed = status(&later, Some(&written)).unwrap().link.unwrap();
        assert_eq!(
            (refreshed.bytes_received, refreshed.rtt_milliseconds),
            (60, 612)
        );
        // A new session is a refresh of its own.
        beat(&mut later, 5_000 + 1_000);
        if let Some(session) = later.session.as_mut() {
            std::sync::Arc::make_mut(session).connected_since_unix_ms += 1_000;
        }
        assert_eq!(worth(&later), Worth::Session);
        // Anything else that changes is written at once, the heartbeat with it.
        beat(&mut later, 5_000 + 1_000);
        later.capacity.as_mut().unwrap().requested_cpu_millis += 100;
        assert_eq!(worth(&later), Worth::Change);
    }

    /// A new session of the member as a reconnect brings it: another session, address and
    /// session start.
    fn reconnected(snapshot: &mut MemberSnapshot) -> &mut MemberSession {
        let session = std::sync::Arc::make_mut(snapshot.session.as_mut().unwrap());
        session.session_id = "s-2".into();
        session.remote_addr = "127.0.0.1:10".into();
        session.connected_since_unix_ms += 60_000;
        session.last_heartbeat_unix_ms += 60_000;
        session.link.bytes_received += 3_500;
        session
    }

    #[test]
    fn a_ready_members_new_session_is_a_refresh_and_anything_more_a_change() {
        let written = status(&snapshot(SessionState::Connected), None).unwrap();
        let worth = |later: &MemberSnapshot| {
            worth_writing(Some(&written), &status(later, Some(&written)).unwrap())
        };
        let mut later = snapshot(SessionState::Connected);
        reconnected(&mut later);
        assert_eq!(worth(&later), Worth::Session);
        let refreshed = status(&later, Some(&written)).unwrap();
        assert_eq!(refreshed.address.as_deref(), Some("127.0.0.1:10"));
        assert_eq!(
            refreshed.conditions[0].message,
            "session s-2 from 127.0.0.1:10"
        );
        // An upgraded agent, a renewed certificate, another Kubernetes: written at once.
        let mut upgraded = snapshot(SessionState::Connected);
        reconnected(&mut upgraded).agent_version = "0.2.0".into();
        assert_eq!(worth(&upgraded), Worth::Change);
        let mut renewed = snapshot(SessionState::Connected);
        reconnected(&mut renewed).cert_not_after_unix += 86_400;
        assert_eq!(worth(&renewed), Worth::Change);
        let mut moved = snapshot(SessionState::Connected);
        reconnected(&mut moved).kubernetes_version = "v1.34.0".into();
        assert_eq!(worth(&moved), Worth::Change);
        // A restarted hub before the agent's first report: the capacity written stays.
        let mut unreported = snapshot(SessionState::Connected);
        reconnected(&mut unreported);
        unreported.capacity = None;
        assert_eq!(worth(&unreported), Worth::Session);
        let kept = status(&unreported, Some(&written)).unwrap();
        assert_eq!(kept.capacity, written.capacity);
        assert!(written.capacity.is_some());
        // Back from Unreachable, or gone: a change of state.
        let down = status(&snapshot(SessionState::Unreachable), None).unwrap();
        let mut back = snapshot(SessionState::Connected);
        reconnected(&mut back);
        let back = status(&back, Some(&down)).unwrap();
        assert_eq!(worth_writing(Some(&down), &back), Worth::Change);
        assert_eq!(worth_writing(Some(&back), &down), Worth::Change);
    }

    #[test]
    fn changes_go_at_once_and_refreshes_within_the_budget_new_sessions_first() {
        let written = status(&snapshot(SessionState::Connected), None).unwrap();
        let member = |n: usize| format!("m{n}");
        let mut current = BTreeMap::new();
        let mut wanted = BTreeMap::new();
        for n in 0..9 {
            let mut later = snapshot(SessionState::Connected);
            let mut was = written.clone();
            match n % 3 {
                // A heartbeat alone, 30 s and more after the one written: m6's the oldest.
                0 => {
                    was.last_heartbeat_time = Some(from_unix_ms(10_000 - 1_000 * n as i64));
                    let session = std::sync::Arc::make_mut(later.session.as_mut().unwrap());
                    session.last_heartbeat_unix_ms += 60_000;
                }
                // A new session.
                1 => {
                    reconnected(&mut later);
                }
                // A change.
                _ => reconnected(&mut later).agent_version = "0.2.0".into(),
            }
            wanted.insert(member(n), status(&later, Some(&was)).unwrap());
            current.insert(member(n), was);
        }
        let names = |budget: usize| -> Vec<String> {
            worth_its_write(wanted.clone(), |name| current.get(name), budget)
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        // The three changes whatever the budget, then the three new sessions, then the
        // heartbeat written longest ago.
        assert_eq!(names(1), ["m2", "m5", "m8", "m1"]);
        assert_eq!(names(4), ["m2", "m5", "m8", "m1", "m4", "m7", "m6"]);
        assert_eq!(names(5), ["m2", "m5", "m8", "m1", "m4", "m7", "m6", "m3"]);
        assert_eq!(
            names(250),
            ["m2", "m5", "m8", "m1", "m4", "m7", "m6", "m3", "m0"]
        );
    }

    proptest::proptest! {
        /// The `n` first are those of a full sort, in its order.
        #[test]
        fn first_in_order_is_a_full_sorts_beginning(
            times in proptest::collection::vec(proptest::option::of(0u8..6), 0..40),
            n in 0usize..45,
        ) {
            // Unique keys, as (heartbeat time, member name) are.
            let items: Vec<(Option<u8>, String)> = times
                .into_iter()
                .enumerate()
                .map(|(i, t)| (t, format!("m{i:02}")))
                .collect();
            let mut sorted: Vec<usize> = (0..items.len()).collect();
            sorted.sort_by_key(|i| items[*i].clone());
            sorted.truncate(n);
            let picked = first_in_order(&items, n, Ord::cmp);
            proptest::prop_assert_eq!(picked, sorted);
        }
    }

    #[test]
    fn an_older_crd_refusing_the_link_is_told_from_other_errors() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "InternalError")
                    .with_code(code)
                    .boxed(),
            )
        };
        let refused = api(
            500,
            "failed to create typed patch object (/edge-1; kedge.dev/v1alpha1, Kind=MemberCluster): \
             .status.link: field not declared in schema",
        );
        assert!(refuses_link(&refused));
        let other_field = api(500, ".status.other: field not declared in schema");
        assert!(!refuses_link(&other_field));
        assert!(!refuses_link(&api(409, "conflict on .status.link")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_link_is_left_out_then_tried_again_on_one_write() {
        let ctx = MemberContext::new(Shared::for_tests());
        assert_eq!(ctx.link_mode(), LinkMode::Write);
        ctx.link_refused();
        assert_eq!(ctx.link_mode(), LinkMode::Omit);
        tokio::time::advance(LINK_RETRY).await;
        assert_eq!(ctx.link_mode(), LinkMode::Probe);
        ctx.link_accepted();
        assert_eq!(ctx.link_mode(), LinkMode::Write);
    }

    #[test]
    fn refreshes_are_bounded_whatever_the_fleet_size() {
        // A pass every 5 s (at rest) may refresh 250 statuses: 50 a second.
        assert_eq!(refresh_budget(RESYNC), 250);
        assert_eq!(refresh_budget(Duration::from_millis(500)), 25);
        // Never none, never more than a resync interval's worth.
        assert_eq!(refresh_budget(Duration::ZERO), 1);
        assert_eq!(refresh_budget(Duration::from_secs(3_600)), 250);
    }
}
