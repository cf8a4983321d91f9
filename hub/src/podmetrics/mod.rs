//! Scaling on what the pods say, across the fleet (`kedge-pod-metrics` triggers).
//!
//! Pods in members are never reached from the hub. The DSO controller tells each member's
//! agent which workload's pods to scrape ([`PodMetrics::configure`] → `HubMessage::Scrape`
//! on the member's session); each agent sends one aggregate per scrape (sum, pods counted,
//! pods missing a value), which the session records here ([`PodMetrics::record`]). The
//! hub's KEDA external scaler ([`scaler`]) reads the fleet-wide value
//! ([`PodMetrics::reading`]) when KEDA asks, and its certificates live in [`certs`].
//!
//! A member whose sample is missing or stale (unreachable, not yet scraped, pods not
//! listable) contributes its pods as *missing*, never as zeros: Kaito's rule then counts
//! them high while the fleet is at or under the threshold, so an outage never looks like an
//! idle fleet and scales it down.

pub mod certs;
pub mod scaler;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kedge_core::crd::MAX_LISTED_MEMBERS;
use kedge_core::crd::dso::{PodMetricsMemberStatus, PodMetricsStatus};
use kedge_core::podmetrics::{
    FleetValue, MemberSample, MetricPort, PodMetricsTrigger, Protocol, fleet_average,
};
use kedge_core::time::from_unix_ms;
use kedge_protocol::{PodMetricsReport, ScrapePort, ScrapeTarget, ScrapeTargets, WorkloadRef};
use tokio::sync::watch;
use tokio::time::Instant;

/// A sample is fresh for this many polling intervals (plus its scrape timeout and
/// [`FRESH_SLACK`]): one late scrape is not an outage, three are.
pub const FRESH_INTERVALS: u32 = 3;
/// Added to a sample's lifetime for delivery over the session.
pub const FRESH_SLACK: Duration = Duration::from_secs(2);

/// One `kedge-pod-metrics` trigger of a DSO, as the DSO controller configures it.
#[derive(Debug, Clone, PartialEq)]
pub struct Configured {
    /// Index of the trigger in the DSO's `triggers[]`.
    pub index: u32,
    /// The trigger's key (its `name`, or its type), as the DSO status shows it.
    pub key: String,
    /// Its parsed settings.
    pub trigger: PodMetricsTrigger,
    /// The DSO's `pollingInterval`.
    pub interval: Duration,
    /// The members to scrape: each with its workload and the ready pods it last reported.
    pub members: Vec<ConfiguredMember>,
}

/// One member a trigger is scraped in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredMember {
    /// Member name.
    pub member: String,
    /// The DSO's workload in that member.
    pub workload: WorkloadRef,
    /// Ready pods of the workload in the member's last report (what counts as missing when
    /// the member has no fresh sample and never had one).
    pub ready_pods: u32,
}

#[derive(Debug, Clone)]
struct Received {
    sample: MemberSample,
    at: Instant,
    scraped_unix_ms: i64,
    error: Option<String>,
}

#[derive(Debug)]
struct MemberState {
    workload: WorkloadRef,
    ready_pods: u32,
    last: Option<Received>,
    /// Pods the last sample that listed pods saw (counted + missing).
    last_pods: u32,
}

#[derive(Debug)]
struct TriggerState {
    key: String,
    trigger: PodMetricsTrigger,
    interval: Duration,
    members: BTreeMap<String, MemberState>,
}

impl TriggerState {
    fn fresh_for(&self) -> Duration {
        self.interval
            .saturating_mul(FRESH_INTERVALS)
            .saturating_add(self.trigger.scrape_timeout)
            .saturating_add(FRESH_SLACK)
    }
}

/// What one member contributes to a reading.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberReading {
    /// Member name.
    pub member: String,
    /// Sum over its pods that had a value.
    pub sum: f64,
    /// Its pods that had a value.
    pub counted: u32,
    /// Its pods without one (for a stale or absent sample: every pod it is known to run).
    pub missing: u32,
    /// Whether its last sample is too old (or there is none): its pods all count as missing.
    pub stale: bool,
    /// Why pods were missing, as the agent said, or why the member has no fresh sample.
    pub error: Option<String>,
    /// When its last sample was scraped, agent clock, Unix milliseconds.
    pub scraped_unix_ms: Option<i64>,
}

/// The fleet-wide value of one trigger at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The trigger's key.
    pub key: String,
    /// The metric scraped.
    pub metric_name: String,
    /// Target average per pod.
    pub threshold: f64,
    /// The DSO's polling interval: how often the agents scrape.
    pub interval: Duration,
    /// The fleet value; `None` when no pod anywhere had a value.
    pub value: Option<FleetValue>,
    /// Per member, in name order.
    pub members: Vec<MemberReading>,
}

impl Reading {
    /// What the external scaler answers KEDA: the per-pod average times the pods it is an
    /// average over (those counted and those missing). KEDA's HPA divides an
    /// `AverageValue` metric by the current replicas, so in a steady fleet its per-replica
    /// value is the average itself and desired = ceil(pods × average / threshold).
    ///
    /// Not times the current replicas: while new pods start, the replicas grow before the
    /// agents see the pods, and the old pods' average times the new count would make the
    /// HPA overshoot (1 pod at 30 becomes 3, and 30 × 3 / 10 asks for 9).
    ///
    /// Rounded to thousandths, as KEDA turns a value into a milli-quantity: without it, ten
    /// requests shared by nine pods would come back as 10.000000000000002 and ask for a
    /// second replica.
    pub fn metric_value(&self) -> Option<f64> {
        self.value
            .as_ref()
            .map(|v| (v.average * (v.counted + v.missing) as f64 * 1000.0).round() / 1000.0)
    }
}

/// What [`PodMetrics::record`] did with a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordedSamples {
    /// Samples kept.
    pub accepted: usize,
    /// Samples for a trigger this member was not asked to scrape.
    pub unsolicited: usize,
}

#[derive(Debug, Default)]
struct Inner {
    triggers: BTreeMap<(String, u32), TriggerState>,
    /// Each member's scrape targets as last published.
    published: BTreeMap<String, watch::Sender<Arc<ScrapeTargets>>>,
}

/// Scrape targets by member and samples by trigger.
#[derive(Debug, Default)]
pub struct PodMetrics {
    inner: Mutex<Inner>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // Every update is a set of whole-entry stores: a poisoned lock holds no torn entry.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The scrape target of `member` for trigger `index` of `owner`.
fn target(owner: &str, index: u32, state: &TriggerState, workload: &WorkloadRef) -> ScrapeTarget {
    let t = &state.trigger;
    ScrapeTarget {
        owner: owner.to_owned(),
        trigger: index,
        workload: workload.clone(),
        metric_name: t.metric_name.clone(),
        port: match &t.metric_port {
            MetricPort::Number(n) => ScrapePort::Number(*n),
            MetricPort::Name(name) => ScrapePort::Name(name.clone()),
        },
        path: t.metric_path.clone(),
        https: t.metric_protocol == Protocol::Https,
        interval_ms: u64::try_from(state.interval.as_millis()).unwrap_or(u64::MAX),
        timeout_ms: u64::try_from(t.scrape_timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

impl PodMetrics {
    /// The scrape targets of `member`, for its session to send (protocol 5 and later).
    pub fn targets(&self, member: &str) -> watch::Receiver<Arc<ScrapeTargets>> {
        lock(&self.inner)
            .published
            .entry(member.to_owned())
            .or_insert_with(|| watch::channel(Arc::default()).0)
            .subscribe()
    }

    /// Sets the pod-metrics triggers of `owner` (`namespace/name` of a DSO), replacing what
    /// it had; an empty list forgets it. Samples of members that stay are kept. Members whose
    /// set of targets changed get the new set on their session.
    pub fn configure(&self, owner: &str, triggers: Vec<Configured>) {
        let mut inner = lock(&self.inner);
        let mut old: BTreeMap<u32, TriggerState> = BTreeMap::new();
        let keys: Vec<(String, u32)> = inner
            .triggers
            .range((owner.to_owned(), 0)..=(owner.to_owned(), u32::MAX))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(state) = inner.triggers.remove(&key) {
                old.insert(key.1, state);
            }
        }
        // Most DSOs have no pod-metrics trigger: nothing to do for them.
        if old.is_empty() && triggers.is_empty() {
            return;
        }
        // Only the members the owner scrapes in, before or after, can see their set change.
        let affected: std::collections::BTreeSet<String> = old
            .values()
            .flat_map(|s| s.members.keys().cloned())
            .chain(
                triggers
                    .iter()
                    .flat_map(|c| c.members.iter().map(|m| m.member.clone())),
            )
            .collect();
        for c in triggers {
            let mut previous = old.remove(&c.index).map(|s| s.members).unwrap_or_default();
            let members = c
                .members
                .into_iter()
                .map(|m| {
                    let kept = previous
                        .remove(&m.member)
                        .filter(|p| p.workload == m.workload);
                    let (last, last_pods) = kept.map_or((None, 0), |p| (p.last, p.last_pods));
                    (
                        m.member,
                        MemberState {
                            workload: m.workload,
                            ready_pods: m.ready_pods,
                            last,
                            last_pods,
                        },
                    )
                })
                .collect();
            inner.triggers.insert(
                (owner.to_owned(), c.index),
                TriggerState {
                    key: c.key,
                    trigger: c.trigger,
                    interval: c.interval,
                    members,
                },
            );
        }
        Self::publish(&mut inner, affected);
    }

    /// Forgets `owner` (its DSO was deleted).
    pub fn forget(&self, owner: &str) {
        self.configure(owner, Vec::new());
    }

    /// Drops what was published to `member`, which the hub forgot (its `MemberCluster` is
    /// gone and its session ended). A trigger that still names it publishes anew.
    pub fn forget_member(&self, member: &str) {
        lock(&self.inner).published.remove(member);
    }

    /// Recomputes the targets of `members` and sends those that changed.
    fn publish(inner: &mut Inner, members: std::collections::BTreeSet<String>) {
        let mut wanted: BTreeMap<String, Vec<ScrapeTarget>> = BTreeMap::new();
        for ((owner, index), state) in &inner.triggers {
            for (member, m) in &state.members {
                if members.contains(member) {
                    wanted.entry(member.clone()).or_default().push(target(
                        owner,
                        *index,
                        state,
                        &m.workload,
                    ));
                }
            }
        }
        for member in members {
            let targets = wanted.remove(&member).unwrap_or_default();
            let sender = inner
                .published
                .entry(member)
                .or_insert_with(|| watch::channel(Arc::default()).0);
            sender.send_if_modified(|current| {
                if current.targets == targets {
                    return false;
                }
                *current = Arc::new(ScrapeTargets { targets });
                true
            });
        }
    }

    /// Records the samples of a report from `member` (already sanitized), received at
    /// `now`. Samples for a trigger the member was not asked to scrape are dropped.
    pub fn record(&self, member: &str, report: PodMetricsReport, now: Instant) -> RecordedSamples {
        let mut recorded = RecordedSamples::default();
        let mut inner = lock(&self.inner);
        for s in report.samples {
            let Some(m) = inner
                .triggers
                .get_mut(&(s.owner, s.trigger))
                .and_then(|t| t.members.get_mut(member))
            else {
                recorded.unsolicited += 1;
                continue;
            };
            let listed = s.error.is_none() || s.counted + s.missing > 0;
            if listed {
                m.last_pods = s.counted + s.missing;
            }
            m.last = Some(Received {
                sample: MemberSample {
                    sum: s.sum,
                    counted: s.counted,
                    missing: s.missing,
                },
                at: now,
                scraped_unix_ms: s.scraped_unix_ms,
                error: s.error,
            });
            recorded.accepted += 1;
        }
        recorded
    }

    /// The fleet-wide value of trigger `index` of `owner` at `now`; `None` when no such
    /// trigger is configured.
    pub fn reading(&self, owner: &str, index: u32, now: Instant) -> Option<Reading> {
        let inner = lock(&self.inner);
        let state = inner.triggers.get(&(owner.to_owned(), index))?;
        Some(read(state, now))
    }

    /// Every configured trigger of `owner` by index, read at `now`.
    pub fn readings(&self, owner: &str, now: Instant) -> Vec<(u32, Reading)> {
        let inner = lock(&self.inner);
        inner
            .triggers
            .range((owner.to_owned(), 0)..=(owner.to_owned(), u32::MAX))
            .map(|((_, index), state)| (*index, read(state, now)))
            .collect()
    }
}

/// A trigger's reading: fresh samples as they are, every other member's pods as missing.
fn read(state: &TriggerState, now: Instant) -> Reading {
    let fresh_for = state.fresh_for();
    let members: Vec<MemberReading> = state
        .members
        .iter()
        .map(|(member, m)| {
            let fresh = m
                .last
                .as_ref()
                .filter(|r| now.saturating_duration_since(r.at) <= fresh_for);
            let listed =
                fresh.filter(|r| r.error.is_none() || r.sample.counted + r.sample.missing > 0);
            match listed {
                Some(r) => MemberReading {
                    member: member.clone(),
                    sum: r.sample.sum,
                    counted: r.sample.counted,
                    missing: r.sample.missing,
                    stale: false,
                    error: r.error.clone(),
                    scraped_unix_ms: Some(r.scraped_unix_ms),
                },
                None => {
                    let why = match (&m.last, fresh) {
                        (_, Some(r)) => r.error.clone().unwrap_or_default(),
                        (Some(r), None) => format!(
                            "no sample for {}s (last scraped {}s ago)",
                            fresh_for.as_secs(),
                            now.saturating_duration_since(r.at).as_secs()
                        ),
                        (None, None) => "no sample yet".to_owned(),
                    };
                    MemberReading {
                        member: member.clone(),
                        sum: 0.0,
                        counted: 0,
                        missing: m.last_pods.max(m.ready_pods),
                        stale: true,
                        error: Some(why),
                        scraped_unix_ms: m.last.as_ref().map(|r| r.scraped_unix_ms),
                    }
                }
            }
        })
        .collect();
    let samples: Vec<MemberSample> = members
        .iter()
        .map(|m| MemberSample {
            sum: m.sum,
            counted: m.counted,
            missing: m.missing,
        })
        .collect();
    Reading {
        key: state.key.clone(),
        metric_name: state.trigger.metric_name.clone(),
        threshold: state.trigger.threshold,
        interval: state.interval,
        value: fleet_average(state.trigger.threshold, samples),
        members,
    }
}

/// A number as a status shows it: at most three decimals, no trailing zeros.
pub fn decimal(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// The DSO status entries of `readings`.
pub fn status_of(readings: &[Reading]) -> Vec<PodMetricsStatus> {
    readings
        .iter()
        .map(|r| {
            // Members with missing pods first, then by name, within the listing bound.
            let mut members: Vec<&MemberReading> = r.members.iter().collect();
            members.sort_by_key(|m| (m.missing == 0, m.member.as_str()));
            members.truncate(MAX_LISTED_MEMBERS);
            PodMetricsStatus {
                trigger: r.key.clone(),
                metric_name: r.metric_name.clone(),
                threshold: decimal(r.threshold),
                average: r.value.map(|v| decimal(v.average)),
                measured_average: r.value.map(|v| decimal(v.measured_average)),
                pods_counted: r
                    .value
                    .map_or(0, |v| i64::try_from(v.counted).unwrap_or(i64::MAX)),
                pods_missing: r.members.iter().map(|m| i64::from(m.missing)).sum(),
                missing_counted_as: r
                    .value
                    .filter(|v| v.missing > 0)
                    .map(|v| decimal(v.missing_counted_as)),
                members: members
                    .into_iter()
                    .map(|m| {
                        (
                            m.member.clone(),
                            PodMetricsMemberStatus {
                                sum: decimal(m.sum),
                                pods_counted: i64::from(m.counted),
                                pods_missing: i64::from(m.missing),
                                stale: m.stale,
                                message: m.error.clone().filter(|e| !e.is_empty()),
                                last_scrape_time: m.scraped_unix_ms.map(from_unix_ms),
                            },
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Unix milliseconds of now, for samples made by tests.
#[cfg(test)]
fn now_unix_ms() -> i64 {
    kedge_protocol::unix_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use kedge_protocol::PodMetricsSample;

    fn workload(name: &str) -> WorkloadRef {
        WorkloadRef::deployment("default", name)
    }

    fn trigger(threshold: f64) -> PodMetricsTrigger {
        let metadata = BTreeMap::from([("threshold".to_owned(), threshold.to_string())]);
        PodMetricsTrigger::parse("t", &metadata).unwrap()
    }

    fn configured(members: &[(&str, u32)]) -> Configured {
        Configured {
            index: 0,
            key: "kedge-pod-metrics".into(),
            trigger: trigger(10.0),
            interval: Duration::from_secs(5),
            members: members
                .iter()
                .map(|(m, ready)| ConfiguredMember {
                    member: (*m).into(),
                    workload: workload("llm"),
                    ready_pods: *ready,
                })
                .collect(),
        }
    }

    fn sample(owner: &str, sum: f64, counted: u32, missing: u32) -> PodMetricsSample {
        PodMetricsSample {
            owner: owner.into(),
            trigger: 0,
            sum,
            counted,
            missing,
            scraped_unix_ms: now_unix_ms(),
            error: None,
        }
    }

    fn report(samples: Vec<PodMetricsSample>) -> PodMetricsReport {
        PodMetricsReport { samples }
    }

    #[test]
    fn members_get_their_targets_and_lose_them_when_the_dso_goes() {
        let metrics = PodMetrics::default();
        let mut a = metrics.targets("a");
        metrics.configure("ns/llm", vec![configured(&[("a", 1), ("b", 1)])]);
        assert!(a.has_changed().unwrap());
        let targets = a.borrow_and_update().clone();
        assert_eq!(targets.targets.len(), 1);
        let t = &targets.targets[0];
        assert_eq!((t.owner.as_str(), t.trigger), ("ns/llm", 0));
        assert_eq!(t.port, ScrapePort::Number(5000));
        assert!(t.https);
        assert_eq!((t.interval_ms, t.timeout_ms), (5000, 5000));
        // The same configuration again sends nothing.
        metrics.configure("ns/llm", vec![configured(&[("a", 1), ("b", 1)])]);
        assert!(!a.has_changed().unwrap());
        metrics.forget("ns/llm");
        assert!(a.borrow_and_update().targets.is_empty());
        assert!(metrics.reading("ns/llm", 0, Instant::now()).is_none());
    }

    #[test]
    fn a_member_scraped_for_two_dsos_keeps_the_other_when_one_goes() {
        let metrics = PodMetrics::default();
        let mut a = metrics.targets("a");
        let mut b = metrics.targets("b");
        metrics.configure("ns/one", vec![configured(&[("a", 1)])]);
        metrics.configure("ns/two", vec![configured(&[("a", 1), ("b", 1)])]);
        let owners = |rx: &mut watch::Receiver<Arc<ScrapeTargets>>| {
            rx.borrow_and_update()
                .targets
                .iter()
                .map(|t| t.owner.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(owners(&mut a), ["ns/one", "ns/two"]);
        assert_eq!(owners(&mut b), ["ns/two"]);
        metrics.forget("ns/one");
        assert_eq!(owners(&mut a), ["ns/two"]);
        // b was not in ns/one: its set is not sent again.
        assert!(!b.has_changed().unwrap());
        // A DSO that never had a pod-metrics trigger changes nothing.
        metrics.forget("ns/three");
        assert!(!a.has_changed().unwrap());
    }

    #[test]
    fn the_fleet_average_spans_members_and_answers_kedas_average_value() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 2), ("b", 2)])]);
        let now = Instant::now();
        let a = metrics.record("a", report(vec![sample("ns/llm", 30.0, 2, 0)]), now);
        let b = metrics.record("b", report(vec![sample("ns/llm", 50.0, 2, 0)]), now);
        assert_eq!((a.accepted, b.accepted), (1, 1));
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        let value = reading.value.unwrap();
        assert_eq!((value.average, value.counted, value.missing), (20.0, 4, 0));
        // Over the 4 pods: 80, which the HPA divides by its 4 current replicas.
        assert_eq!(reading.metric_value(), Some(80.0));
    }

    #[test]
    fn the_answer_is_in_thousandths_so_a_shared_queue_adds_up() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 9)])]);
        let now = Instant::now();
        // Ten requests over nine pods, each reporting 10/9, summed by the agent.
        let sum: f64 = std::iter::repeat_n(10.0 / 9.0, 9).sum();
        metrics.record("a", report(vec![sample("ns/llm", sum, 9, 0)]), now);
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        assert_ne!(reading.value.unwrap().average * 9.0, 10.0);
        assert_eq!(reading.metric_value(), Some(10.0));
    }

    #[test]
    fn a_silent_member_counts_its_pods_as_missing_not_as_zeros() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 2), ("b", 3)])]);
        let t0 = Instant::now();
        metrics.record("a", report(vec![sample("ns/llm", 4.0, 2, 0)]), t0);
        metrics.record("b", report(vec![sample("ns/llm", 6.0, 3, 0)]), t0);
        // b goes silent; a keeps reporting.
        let now = t0 + Duration::from_secs(30);
        metrics.record("a", report(vec![sample("ns/llm", 4.0, 2, 0)]), now);
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        let b = &reading.members[1];
        assert!(b.stale);
        assert_eq!((b.counted, b.missing), (0, 3));
        let value = reading.value.unwrap();
        // a averages 2 (under 10): b's three pods count as 15 each, not as 0.
        assert_eq!((value.counted, value.missing), (2, 3));
        assert_eq!(value.average, (4.0 + 3.0 * 15.0) / 5.0);
    }

    #[test]
    fn a_member_that_cannot_list_its_pods_counts_the_pods_it_reported_as_missing() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 2), ("b", 4)])]);
        let now = Instant::now();
        metrics.record("a", report(vec![sample("ns/llm", 40.0, 2, 0)]), now);
        let mut failed = sample("ns/llm", 0.0, 0, 0);
        failed.error = Some("listing pods: forbidden".into());
        metrics.record("b", report(vec![failed]), now);
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        let b = &reading.members[1];
        assert_eq!((b.counted, b.missing, b.stale), (0, 4, true));
        assert_eq!(b.error.as_deref(), Some("listing pods: forbidden"));
        // a averages 20 (over 10): b's pods count as 0.
        assert_eq!(reading.value.unwrap().average, 40.0 / 6.0);
    }

    #[test]
    fn samples_for_triggers_a_member_was_not_given_are_dropped() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 1)])]);
        let now = Instant::now();
        let recorded = metrics.record(
            "b",
            report(vec![
                sample("ns/llm", 1e9, 1, 0),
                sample("ns/other", 1.0, 1, 0),
            ]),
            now,
        );
        assert_eq!((recorded.accepted, recorded.unsolicited), (0, 2));
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        assert_eq!(reading.value, None);
        assert_eq!(reading.metric_value(), None);
    }

    #[test]
    fn decimals_are_short() {
        assert_eq!(decimal(12.0), "12");
        assert_eq!(decimal(12.5), "12.5");
        assert_eq!(decimal(1.0 / 3.0), "0.333");
        assert_eq!(decimal(-0.0001), "0");
    }

    #[test]
    fn the_status_shows_the_value_and_each_members_part_missing_first() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 2), ("b", 3)])]);
        let now = Instant::now();
        metrics.record("b", report(vec![sample("ns/llm", 24.0, 2, 0)]), now);
        let status = status_of(
            &metrics
                .readings("ns/llm", now)
                .into_iter()
                .map(|(_, r)| r)
                .collect::<Vec<_>>(),
        );
        let s = &status[0];
        // b averages 12 (over 10): a's two silent pods count as 0.
        assert_eq!(
            (s.average.as_deref(), s.measured_average.as_deref()),
            (Some("6"), Some("12"))
        );
        assert_eq!((s.pods_counted, s.pods_missing), (2, 2));
        assert_eq!(s.missing_counted_as.as_deref(), Some("0"));
        let a = &s.members["a"];
        assert!(a.stale);
        assert_eq!(a.message.as_deref(), Some("no sample yet"));
        assert_eq!(s.members.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.members["b"].sum, "24");
    }

    #[test]
    fn a_member_whose_workload_changes_starts_over() {
        let metrics = PodMetrics::default();
        metrics.configure("ns/llm", vec![configured(&[("a", 1)])]);
        let now = Instant::now();
        metrics.record("a", report(vec![sample("ns/llm", 5.0, 1, 0)]), now);
        let mut moved = configured(&[("a", 1)]);
        moved.members[0].workload = workload("other");
        metrics.configure("ns/llm", vec![moved]);
        let reading = metrics.reading("ns/llm", 0, now).unwrap();
        assert!(reading.members[0].stale);
        assert_eq!(reading.value, None);
    }
}
