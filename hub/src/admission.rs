//! Which members may hold a session: exactly those with a `MemberCluster` that is not being
//! deleted, and — for a certificate issued by enrollment — only for the `MemberCluster`
//! object it was enrolled for. A `MemberCluster` is the only way a member comes to exist;
//! deleting it revokes the member: the hub refuses its certificate and ends its live
//! session (see [`revoke_live`]).
//!
//! The list is kept by a watch, which lags behind the API server (by milliseconds, or by
//! seconds on a loaded hub cluster). An admission from it is safe: a member deleted a moment
//! ago is revoked once the watch says so. A refusal is not: an agent that enrolls right after
//! its `MemberCluster` was created, or a `MemberCluster` created again, would be told it is
//! revoked. So every refusal is confirmed by a read of the hub cluster first
//! ([`Admission::confirmed_verdict`], and [`revoke_live`] for live sessions).
//!
//! A hub without a hub cluster (`--controllers false`: sessions only, for tests and
//! benchmarks) admits every certificate its CA signed, as before.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use kedge_core::crd::MemberCluster;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use kedge_net::telemetry::AUDIT;

use crate::registry::SessionRegistry;

/// One `MemberCluster` as admission sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrollment {
    /// Its `metadata.uid`.
    pub uid: String,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
}

/// The members the hub admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolled {
    /// No hub cluster: every certificate the CA signed.
    Anyone,
    /// The `MemberCluster` list has not been read yet.
    NotRead,
    /// These members, by name.
    Members(BTreeMap<String, Enrollment>),
}

/// What became of the member a session record is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Its `MemberCluster` is there (or cannot be known yet).
    Enrolled,
    /// Its `MemberCluster` is gone.
    Gone,
    /// A `MemberCluster` of that name was created anew: the record is of the member before.
    Replaced,
}

impl Enrolled {
    /// What became of `member`, whose session record is of enrollment `uid` (`None`: its
    /// certificate names none, and only the name counts).
    pub fn departure(&self, member: &str, uid: Option<&str>) -> Departure {
        let Enrolled::Members(members) = self else {
            return Departure::Enrolled;
        };
        match (members.get(member), uid) {
            (None, _) => Departure::Gone,
            (Some(now), Some(uid)) if now.uid != uid => Departure::Replaced,
            (Some(_), _) => Departure::Enrolled,
        }
    }
}

/// What admission says of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Open or keep the session.
    Admit,
    /// Not yet known; the agent should retry.
    NotYet(String),
    /// Refused, with a short label (metrics, audit) and what to do about it.
    Refuse {
        /// `not_enrolled`, `deleting` or `earlier_enrollment`.
        label: &'static str,
        /// A message for the agent's log and the hub's.
        message: String,
    },
}

/// Decides whether `member`, presenting a certificate bound to `cert_uid` (see
/// [`kedge_net::identity::PeerIdentity::enrollment_uid`]), may hold a session.
pub fn verdict(enrolled: &Enrolled, member: &str, cert_uid: Option<&str>) -> Verdict {
    let members = match enrolled {
        Enrolled::Anyone => return Verdict::Admit,
        Enrolled::NotRead => {
            return Verdict::NotYet(
                "the hub has not read its MemberClusters yet; retrying".to_owned(),
            );
        }
        Enrolled::Members(members) => members,
    };
    match members.get(member) {
        None => Verdict::Refuse {
            label: "not_enrolled",
            message: format!(
                "no MemberCluster {member:?} on the hub: the member is not enrolled or was \
                 deleted; enroll it with `kubectl kedge mc setup-member {member}` and apply \
                 its install to the member cluster: the agent enrolls with the new token and \
                 replaces its identity Secret by itself"
            ),
        },
        Some(e) if e.deleting => Verdict::Refuse {
            label: "deleting",
            message: format!("MemberCluster {member:?} is being deleted; the member is revoked"),
        },
        Some(e) if cert_uid.is_some_and(|uid| uid != e.uid) => Verdict::Refuse {
            label: "earlier_enrollment",
            message: format!(
                "the certificate of {member:?} was issued for an earlier enrollment \
                 (MemberCluster uid {}), not the current one (uid {}): apply the install \
                 printed by the `kubectl kedge mc setup-member {member}` that created it to \
                 the member cluster, and the agent enrolls with its token and replaces its \
                 identity Secret by itself; if that token is lost or spent, run `kubectl \
                 kedge mc delete-member {member}` and `kubectl kedge mc setup-member {member}` \
                 again",
                cert_uid.unwrap_or_default(),
                e.uid
            ),
        },
        Some(_) => Verdict::Admit,
    }
}

/// How long a refusal may wait for the read that confirms it; past that the agent is told to
/// retry (`Unavailable`), never that it is revoked.
const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// Reads confirming refusals at once: a burst of revoked members' dials does not become a
/// burst of requests to the hub cluster.
const CONFIRMING: usize = 16;

/// How soon [`revoke_live`] tries again after the hub cluster could not be read.
const CONFIRM_RETRY: Duration = Duration::from_secs(2);

/// The admission state shared by the QUIC server (new sessions) and [`revoke_live`].
#[derive(Debug)]
pub struct Admission {
    tx: watch::Sender<Enrolled>,
    /// Where refusals are confirmed; unset without a hub cluster (or before its client).
    reads: OnceLock<Api<MemberCluster>>,
    confirming: Semaphore,
}

impl Admission {
    /// Admission starting at `initial` ([`Enrolled::Anyone`] for a hub without a hub
    /// cluster, [`Enrolled::NotRead`] otherwise).
    pub fn new(initial: Enrolled) -> Self {
        Self {
            tx: watch::Sender::new(initial),
            reads: OnceLock::new(),
            confirming: Semaphore::new(CONFIRMING),
        }
    }

    /// Confirms refusals by reading `api` from now on (the first call wins).
    pub fn read_from(&self, api: Api<MemberCluster>) {
        let _ = self.reads.set(api);
    }

    /// [`Admission::verdict`] for a new session, with a refusal confirmed by a read of the
    /// member's `MemberCluster` (when the hub has a hub cluster): the watched list may not
    /// have the object yet. A read that fails or takes longer than [`CONFIRM_WITHIN`] is
    /// [`Verdict::NotYet`]: the agent retries, it is not told it is revoked.
    pub async fn confirmed_verdict(&self, member: &str, cert_uid: Option<&str>) -> Verdict {
        let cached = self.verdict(member, cert_uid);
        match (&cached, self.reads.get()) {
            // Boxed: every session's task holds the largest state of this future for its
            // whole life, and the API call is rare (`server::tests`).
            (Verdict::Refuse { .. }, Some(api)) => {
                Box::pin(self.confirm(api, member, cert_uid)).await
            }
            _ => cached,
        }
    }

    /// The verdict on `member` from a fresh read of its `MemberCluster` in `api`.
    async fn confirm(
        &self,
        api: &Api<MemberCluster>,
        member: &str,
        cert_uid: Option<&str>,
    ) -> Verdict {
        // A list by name, not a get: `list` is the verb every hub's RBAC grants for
        // MemberClusters (`get` comes with enrollment only).
        let params = ListParams::default().fields(&format!("metadata.name={member}"));
        let read = async {
            let _permit = self.confirming.acquire().await;
            list(api, &params).await
        };
        match tokio::time::timeout(CONFIRM_WITHIN, read).await {
            Ok(Ok(enrolled)) => verdict(&enrolled, member, cert_uid),
            Ok(Err(error)) => Verdict::NotYet(format!(
                "the hub could not read MemberCluster {member:?} to confirm its refusal \
                 ({error}); retrying"
            )),
            Err(_) => Verdict::NotYet(format!(
                "the hub could not read MemberCluster {member:?} to confirm its refusal within \
                 {CONFIRM_WITHIN:?}; retrying"
            )),
        }
    }

    /// Every `MemberCluster` as the hub cluster has it now (a fresh list, not the watched
    /// one); the watched list when there is no hub cluster to read.
    async fn read_all(&self) -> Result<Enrolled, String> {
        match self.reads.get() {
            Some(api) => list(api, &ListParams::default()).await,
            None => Ok(self.tx.borrow().clone()),
        }
    }

    /// The verdict on `member` with a certificate bound to `cert_uid`.
    pub fn verdict(&self, member: &str, cert_uid: Option<&str>) -> Verdict {
        verdict(&self.tx.borrow(), member, cert_uid)
    }

    /// Replaces what is enrolled; wakes [`revoke_live`] when it changed.
    pub fn set(&self, enrolled: Enrolled) {
        self.tx.send_if_modified(|current| {
            let changed = *current != enrolled;
            *current = enrolled;
            changed
        });
    }

    /// Records one `MemberCluster` as `enrollment` says (or its removal, for `None`) in an
    /// [`Enrolled::Members`] list, in place; wakes [`revoke_live`] only when that changed
    /// anything. Each of the hub's own status writes is a `MemberCluster` event: a copy and
    /// a comparison of the whole list for each was most of a 10,000-member hub's CPU time.
    pub fn record(&self, name: &str, enrollment: Option<Enrollment>) {
        self.tx.send_if_modified(|current| {
            let Enrolled::Members(members) = current else {
                return false;
            };
            match enrollment {
                Some(e) if members.get(name) != Some(&e) => {
                    members.insert(name.to_owned(), e);
                    true
                }
                Some(_) => false,
                None => members.remove(name).is_some(),
            }
        });
    }

    /// Waits until the `MemberCluster`s have been read, for at most `within`; whether they
    /// have been (at once when they have, or when there is no hub cluster).
    pub async fn read_within(&self, within: std::time::Duration) -> bool {
        let mut enrolled = self.tx.subscribe();
        let read = enrolled.wait_for(|e| !matches!(e, Enrolled::NotRead));
        matches!(tokio::time::timeout(within, read).await, Ok(Ok(_)))
    }

    /// Changes of what is enrolled.
    pub fn subscribe(&self) -> watch::Receiver<Enrolled> {
        self.tx.subscribe()
    }
}

/// The `MemberCluster`s of `api` that `params` select, read now (within [`CONFIRM_WITHIN`]).
async fn list(api: &Api<MemberCluster>, params: &ListParams) -> Result<Enrolled, String> {
    match tokio::time::timeout(CONFIRM_WITHIN, api.list_metadata(params)).await {
        Ok(Ok(list)) => Ok(Enrolled::Members(
            list.items
                .iter()
                .filter_map(|object| enrollment(&object.metadata))
                .collect(),
        )),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {CONFIRM_WITHIN:?}")),
    }
}

/// One `MemberCluster`'s name and enrollment, from its metadata.
fn enrollment(meta: &kube::core::ObjectMeta) -> Option<(String, Enrollment)> {
    Some((
        meta.name.clone()?,
        Enrollment {
            uid: meta.uid.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        },
    ))
}

/// Keeps `admission` in step with the hub cluster's `MemberCluster`s (metadata only) until
/// `shutdown`. A watch error keeps the last known list (a hub cluster hiccup revokes no one);
/// the watcher retries with backoff.
pub async fn watch_members(
    api: Api<PartialObjectMeta<MemberCluster>>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
) {
    let mut listing: BTreeMap<String, Enrollment> = BTreeMap::new();
    // `PartialObjectMeta`: metadata-only requests. The list a restarted hub reads before it
    // admits anyone is then a fraction of the full objects (every member's status).
    let stream = watch_stream(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            None => return,
            // After an error nothing changed; mid-list, the list is not complete.
            Some(Err(error)) => {
                warn!(%error, "watching MemberClusters failed; admission keeps the last list");
            }
            Some(Ok(Event::Init)) => listing.clear(),
            Some(Ok(Event::InitApply(object))) => listing.extend(enrollment(&object.metadata)),
            Some(Ok(Event::InitDone)) => {
                info!(
                    members = listing.len(),
                    "MemberClusters listed; admitting their members"
                );
                admission.set(Enrolled::Members(std::mem::take(&mut listing)));
            }
            Some(Ok(Event::Apply(object))) => {
                if let Some((name, e)) = enrollment(&object.metadata) {
                    admission.record(&name, Some(e));
                }
            }
            Some(Ok(Event::Delete(object))) => {
                if let Some(name) = &object.metadata.name {
                    admission.record(name, None);
                }
            }
        }
    }
}

/// Ends every live session admission no longer admits, each time what is enrolled changes,
/// until `shutdown`: deleting a `MemberCluster` drops its agent within a second. The watched
/// list only names the candidates; a fresh list of the hub cluster confirms them, since the
/// watch may not yet have a `MemberCluster` a session was admitted for. When that list
/// cannot be read, it tries again after [`CONFIRM_RETRY`].
pub async fn revoke_live(
    admission: Arc<Admission>,
    registry: Arc<SessionRegistry>,
    shutdown: CancellationToken,
) {
    let mut changes = admission.subscribe();
    loop {
        let candidates: Vec<_> = registry
            .live_members()
            .into_iter()
            .filter(|(member, cert_uid)| {
                matches!(
                    admission.verdict(member, cert_uid.as_deref()),
                    Verdict::Refuse { .. }
                )
            })
            .collect();
        let mut retry = false;
        if !candidates.is_empty() {
            match admission.read_all().await {
                Ok(enrolled) => {
                    for (member, cert_uid) in candidates {
                        if let Verdict::Refuse { label, message } =
                            verdict(&enrolled, &member, cert_uid.as_deref())
                            && registry.revoke(&member, &message)
                        {
                            warn!(target: AUDIT, member, reason = label, %message, "live session revoked");
                        }
                    }
                }
                Err(error) => {
                    warn!(%error, candidates = candidates.len(), retry = ?CONFIRM_RETRY,
                        "cannot list MemberClusters to confirm revocations; trying again");
                    retry = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                // A burst of changes (a list) is handled once.
                tokio::time::sleep(Duration::from_millis(20)).await;
                changes.borrow_and_update();
                info!("MemberClusters changed; checking live sessions");
            }
            _ = tokio::time::sleep(CONFIRM_RETRY), if retry => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn members(entries: &[(&str, &str, bool)]) -> Enrolled {
        Enrolled::Members(
            entries
                .iter()
                .map(|(name, uid, deleting)| {
                    (
                        (*name).to_owned(),
                        Enrollment {
                            uid: (*uid).to_owned(),
                            deleting: *deleting,
                        },
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn a_record_is_of_a_member_enrolled_gone_or_replaced() {
        let now = members(&[("m", "uid-2", false), ("d", "uid-3", true)]);
        assert_eq!(now.departure("m", Some("uid-2")), Departure::Enrolled);
        assert_eq!(now.departure("m", Some("uid-1")), Departure::Replaced);
        // A certificate that names no enrollment: only the name counts.
        assert_eq!(now.departure("m", None), Departure::Enrolled);
        // Being deleted is not gone yet: its revocation says so.
        assert_eq!(now.departure("d", Some("uid-3")), Departure::Enrolled);
        assert_eq!(now.departure("x", Some("uid-2")), Departure::Gone);
        assert_eq!(now.departure("x", None), Departure::Gone);
        for unknown in [Enrolled::NotRead, Enrolled::Anyone] {
            assert_eq!(unknown.departure("x", Some("u")), Departure::Enrolled);
        }
    }

    fn label(v: Verdict) -> &'static str {
        match v {
            Verdict::Admit => "admit",
            Verdict::NotYet(_) => "not_yet",
            Verdict::Refuse { label, .. } => label,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_before_the_list_waits_for_it_for_a_bounded_time() {
        let admission = std::sync::Arc::new(Admission::new(Enrolled::NotRead));
        // Nothing read: refused once the wait is over, not before.
        let started = tokio::time::Instant::now();
        assert!(!admission.read_within(Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        // Read while it waits: admitted at once.
        let reader = admission.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            reader.set(members(&[("a", "u1", false)]));
        });
        let started = tokio::time::Instant::now();
        assert!(admission.read_within(Duration::from_secs(5)).await);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(label(admission.verdict("a", Some("u1"))), "admit");
        // Already read, or no hub cluster: no wait at all.
        assert!(admission.read_within(Duration::ZERO).await);
        assert!(
            Admission::new(Enrolled::Anyone)
                .read_within(Duration::ZERO)
                .await
        );
    }

    #[test]
    fn only_enrolled_members_of_the_current_enrollment_are_admitted() {
        let enrolled = members(&[("m1", "u1", false), ("m2", "u2", true)]);
        assert_eq!(label(verdict(&enrolled, "m1", None)), "admit");
        assert_eq!(label(verdict(&enrolled, "m1", Some("u1"))), "admit");
        assert_eq!(
            label(verdict(&enrolled, "m1", Some("u0"))),
            "earlier_enrollment"
        );
        assert_eq!(label(verdict(&enrolled, "m2", Some("u2"))), "deleting");
        assert_eq!(label(verdict(&enrolled, "m3", None)), "not_enrolled");
        assert_eq!(label(verdict(&Enrolled::NotRead, "m1", None)), "not_yet");
        assert_eq!(label(verdict(&Enrolled::Anyone, "m3", Some("x"))), "admit");
    }

    #[test]
    fn refusals_say_what_to_do() {
        let Verdict::Refuse { message, .. } = verdict(&members(&[]), "edge-7", None) else {
            panic!("admitted");
        };
        assert!(
            message.contains("kubectl kedge mc setup-member edge-7"),
            "{message}"
        );
        let enrolled = members(&[("edge-7", "u2", false)]);
        let Verdict::Refuse { message, .. } = verdict(&enrolled, "edge-7", Some("u1")) else {
            panic!("admitted");
        };
        for part in [
            "uid u1",
            "uid u2",
            "enrolls with its token",
            "kubectl kedge mc delete-member edge-7",
            "kubectl kedge mc setup-member edge-7",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
    }

    #[test]
    fn one_member_changes_in_place_and_wakes_only_on_a_change() {
        let admission = Admission::new(Enrolled::NotRead);
        let mut changes = admission.subscribe();
        // Before the first list nothing is recorded: the list replaces everything.
        admission.record(
            "m1",
            Some(Enrollment {
                uid: "u1".into(),
                deleting: false,
            }),
        );
        assert_eq!(*changes.borrow_and_update(), Enrolled::NotRead);
        admission.set(members(&[("m1", "u1", false)]));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        // The same enrollment again (a status write, say): no wake-up.
        admission.record(
            "m1",
            Some(Enrollment {
                uid: "u1".into(),
                deleting: false,
            }),
        );
        assert!(!changes.has_changed().unwrap());
        // Being deleted, a new member, a removal: each wakes revocation.
        admission.record(
            "m1",
            Some(Enrollment {
                uid: "u1".into(),
                deleting: true,
            }),
        );
        assert!(changes.has_changed().unwrap());
        assert_eq!(label(admission.verdict("m1", None)), "deleting");
        admission.record(
            "m2",
            Some(Enrollment {
                uid: "u2".into(),
                deleting: false,
            }),
        );
        assert_eq!(
            *changes.borrow_and_update(),
            members(&[("m1", "u1", true), ("m2", "u2", false)])
        );
        admission.record("m3", None);
        assert!(!changes.has_changed().unwrap());
        admission.record("m1", None);
        assert!(changes.has_changed().unwrap());
        assert_eq!(label(admission.verdict("m1", None)), "not_enrolled");
    }
}
