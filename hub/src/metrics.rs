//! Hub metrics, served on `/metrics` of the ops endpoint.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A `reason` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Short stable reason.
    pub reason: String,
}

/// A `state` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// Session state.
    pub state: String,
}

/// A `kind` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// Message kind.
    pub kind: String,
}

/// Labels of controller metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// Controller name, e.g. `distributedscaledobject`.
    pub controller: String,
}

/// Labels of controller failure metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerErrorLabel {
    /// Controller name.
    pub controller: String,
    /// `Error::metric_label()` of the failure.
    pub error: String,
}

/// Labels of the external scaler's call counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScalerCallLabel {
    /// gRPC method, e.g. `GetMetrics`.
    pub method: String,
    /// `ok` or the gRPC status code, e.g. `unavailable`.
    pub code: String,
}

/// Labels of a DSO's pod-metrics trigger.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodMetricLabel {
    /// Namespace of the DSO.
    pub namespace: String,
    /// Name of the DSO.
    pub name: String,
    /// The trigger's key.
    pub trigger: String,
}

/// Labels of one member's contribution to a pod-metrics trigger.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodMetricMemberLabel {
    /// Namespace of the DSO.
    pub namespace: String,
    /// Name of the DSO.
    pub name: String,
    /// The trigger's key.
    pub trigger: String,
    /// Member name.
    pub member: String,
    /// `counted` or `missing` (pods), or `sum` (the member's sum of the metric).
    pub of: String,
}

/// A `member` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabel {
    /// Member name.
    pub member: String,
}

/// Labels of a member's traffic counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberDirectionLabel {
    /// Member name.
    pub member: String,
    /// `sent` (hub to agent) or `received` (agent to hub).
    pub direction: String,
}

/// How long reconciliations take, by controller: 0.5 ms to 16 s in powers of two.
#[derive(Debug, Clone)]
struct ReconcileSeconds(Family<ControllerLabel, Histogram, fn() -> Histogram>);

impl Default for ReconcileSeconds {
    fn default() -> Self {
        Self(Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        }))
    }
}

/// Observes the time from its creation to its drop as one reconciliation of a controller.
#[derive(Debug)]
pub(crate) struct ReconcileTimer {
    histogram: Histogram,
    started: std::time::Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Every hub metric. Cheap to clone: metrics are shared handles.
#[derive(Debug, Clone, Default)]
pub struct HubMetrics {
    reconciles: Family<ControllerLabel, Counter>,
    reconcile_seconds: ReconcileSeconds,
    reconcile_failures: Family<ControllerErrorLabel, Counter>,
    status_writes: Family<ControllerLabel, Counter>,
    sessions: Family<StateLabel, Gauge>,
    handshake_failures: Family<ReasonLabel, Counter>,
    sessions_refused: Family<ReasonLabel, Counter>,
    frames_rejected: Family<ReasonLabel, Counter>,
    messages_received: Family<KindLabel, Counter>,
    report_entries_dropped: Family<ReasonLabel, Counter>,
    resyncs: Family<KindLabel, Counter>,
    reports_throttled: Counter,
    retries: Counter,
    heartbeats: Counter,
    leader: Gauge,
    relayed_sessions: Family<KindLabel, Gauge>,
    scaler_requests: Family<ScalerCallLabel, Counter>,
    pod_metric_average: Family<PodMetricLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pod_metric_members: Family<PodMetricMemberLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pod_metric_samples: Family<ReasonLabel, Counter>,
    member_link_bytes: Family<MemberDirectionLabel, Counter>,
    member_link_packets: Family<MemberDirectionLabel, Counter>,
    member_link_rtt: Family<MemberLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    member_sessions: Family<MemberLabel, Counter>,
    member_migrations: Family<MemberLabel, Counter>,
}

fn reason(reason: &str) -> ReasonLabel {
    ReasonLabel {
        reason: reason.to_owned(),
    }
}

impl HubMetrics {
    /// Registers every metric under the `kedge_hub` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kedge_hub");
        r.register(
            "sessions",
            "Members by session state",
            self.sessions.clone(),
        );
        r.register(
            "handshake_failures",
            "QUIC/TLS handshakes refused, by reason",
            self.handshake_failures.clone(),
        );
        r.register(
            "sessions_refused",
            "Sessions refused after the handshake, by reason",
            self.sessions_refused.clone(),
        );
        r.register(
            "frames_rejected",
            "Frames rejected as oversized or undecodable, by reason",
            self.frames_rejected.clone(),
        );
        r.register(
            "messages_received",
            "Agent messages received, by kind",
            self.messages_received.clone(),
        );
        r.register("heartbeats", "Heartbeats received", self.heartbeats.clone());
        r.register(
            "retries",
            "QUIC Retry packets sent to validate a connecting address",
            self.retries.clone(),
        );
        r.register(
            "report_entries_dropped",
            "Workload entries of agent reports dropped: not asked for, or over the per-member limit",
            self.report_entries_dropped.clone(),
        );
        r.register(
            "resyncs",
            "Sessions' first desired state: `sent`, or `in_sync` when the agent held that revision already (applied and acknowledged in an earlier session with this hub) and nothing was sent",
            self.resyncs.clone(),
        );
        r.register(
            "reports_throttled",
            "Agent reports delayed because a session exceeded its report rate",
            self.reports_throttled.clone(),
        );
        r.register(
            "leader",
            "1 while this hub is the active one (holds the lease, or runs without a hub cluster)",
            self.leader.clone(),
        );
        r.register(
            "relayed_sessions",
            "With --sharding: agent sessions this replica `relaying` holds and relays to the active one, and relayed sessions it `served` as the active one",
            self.relayed_sessions.clone(),
        );
        r.register(
            "scaler_requests",
            "Calls of the external scaler (KEDA externalscaler.proto), by method and outcome",
            self.scaler_requests.clone(),
        );
        r.register(
            "pod_metric_average",
            "Fleet-wide per-pod average of each DSO's kedge-pod-metrics trigger, missing pods counted by Kaito's rule; absent while no pod has a value",
            self.pod_metric_average.clone(),
        );
        r.register(
            "pod_metric_member",
            "Each member's contribution to a kedge-pod-metrics trigger: `sum` of the metric, pods `counted`, pods `missing` (a stale member's pods all count as missing)",
            self.pod_metric_members.clone(),
        );
        r.register(
            "pod_metric_samples",
            "Pod-metrics samples from agents: `accepted`, or `unsolicited` (for a trigger the member was not given)",
            self.pod_metric_samples.clone(),
        );
        r.register(
            "member_link_bytes",
            "UDP payload bytes of each member's sessions (IP and UDP headers not counted), by direction: `sent` to the agent, `received` from it",
            self.member_link_bytes.clone(),
        );
        r.register(
            "member_link_packets",
            "UDP datagrams of each member's sessions, by direction",
            self.member_link_packets.clone(),
        );
        r.register(
            "member_link_rtt_seconds",
            "Smoothed round-trip time of each member's live session, as of its last heartbeat",
            self.member_link_rtt.clone(),
        );
        r.register(
            "member_sessions",
            "Sessions each member established (one QUIC and TLS handshake each)",
            self.member_sessions.clone(),
        );
        r.register(
            "member_migrations",
            "Address changes of members' live sessions (NAT rebinding) carried over by QUIC connection migration, without a new handshake",
            self.member_migrations.clone(),
        );
        r.register(
            "reconciles",
            "Reconciliations started, by controller",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "How long reconciliations take, by controller (one DSO or DSJ each)",
            self.reconcile_seconds.0.clone(),
        );
        r.register(
            "reconcile_failures",
            "Reconciliations that failed, by controller and error",
            self.reconcile_failures.clone(),
        );
        r.register(
            "status_writes",
            "Status patches sent to the hub cluster, by controller",
            self.status_writes.clone(),
        );
    }

    pub(crate) fn scaler_request(&self, method: &str, code: &str) {
        self.scaler_requests
            .get_or_create(&ScalerCallLabel {
                method: method.to_owned(),
                code: code.to_owned(),
            })
            .inc();
    }

    pub(crate) fn pod_metric_samples(&self, outcome: &str, n: usize) {
        if n > 0 {
            self.pod_metric_samples
                .get_or_create(&reason(outcome))
                .inc_by(n as u64);
        }
    }

    /// Publishes the readings of the pod-metrics triggers of DSO `namespace/name`, and
    /// removes what it published before for triggers or members no longer there.
    pub(crate) fn pod_metric_readings(
        &self,
        namespace: &str,
        name: &str,
        readings: &[crate::podmetrics::Reading],
        previous: &[crate::podmetrics::Reading],
    ) {
        let trigger = |key: &str| PodMetricLabel {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            trigger: key.to_owned(),
        };
        let member = |key: &str, member: &str, of: &str| PodMetricMemberLabel {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            trigger: key.to_owned(),
            member: member.to_owned(),
            of: of.to_owned(),
        };
        let mut averages = std::collections::HashSet::new();
        let mut members = std::collections::HashSet::new();
        for r in readings {
            if let Some(v) = &r.value {
                let label = trigger(&r.key);
                self.pod_metric_average.get_or_create(&label).set(v.average);
                averages.insert(label);
            }
            for m in &r.members {
                for (of, value) in [
                    ("sum", m.sum),
                    ("counted", f64::from(m.counted)),
                    ("missing", f64::from(m.missing)),
                ] {
                    let label = member(&r.key, &m.member, of);
                    self.pod_metric_members.get_or_create(&label).set(value);
                    members.insert(label);
                }
            }
        }
        // What was published before and is no longer there goes.
        for r in previous {
            let label = trigger(&r.key);
            if !averages.contains(&label) {
                self.pod_metric_average.remove(&label);
            }
            for m in &r.members {
                for of in ["sum", "counted", "missing"] {
                    let label = member(&r.key, &m.member, of);
                    if !members.contains(&label) {
                        self.pod_metric_members.remove(&label);
                    }
                }
            }
        }
    }

    pub(crate) fn reconciled(&self, controller: &str) {
        self.reconciles
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// Counts a reconciliation and times it until the returned timer is dropped.
    pub(crate) fn reconcile_timer(&self, controller: &str) -> ReconcileTimer {
        self.reconciled(controller);
        ReconcileTimer {
            histogram: self
                .reconcile_seconds
                .0
                .get_or_create(&ControllerLabel {
                    controller: controller.to_owned(),
                })
                .clone(),
            started: std::time::Instant::now(),
        }
    }

    pub(crate) fn reconcile_failed(&self, controller: &str, error: &str) {
        self.reconcile_failures
            .get_or_create(&ControllerErrorLabel {
                controller: controller.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }

    pub(crate) fn status_written(&self, controller: &str) {
        self.status_writes
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    pub(crate) fn set_sessions(&self, connected: i64, unreachable: i64) {
        self.sessions
            .get_or_create(&StateLabel {
                state: "Connected".into(),
            })
            .set(connected);
        self.sessions
            .get_or_create(&StateLabel {
                state: "Unreachable".into(),
            })
            .set(unreachable);
    }

    pub(crate) fn handshake_failed(&self, why: &str) {
        self.handshake_failures.get_or_create(&reason(why)).inc();
    }

    pub(crate) fn session_refused(&self, why: &str) {
        self.sessions_refused.get_or_create(&reason(why)).inc();
    }

    pub(crate) fn frame_rejected(&self, why: &str) {
        self.frames_rejected.get_or_create(&reason(why)).inc();
    }

    /// A session's first desired state: sent, or not needed (`in_sync`).
    pub(crate) fn resync(&self, in_sync: bool) {
        let kind = if in_sync { "in_sync" } else { "sent" };
        self.resyncs
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub(crate) fn message_received(&self, kind: &str) {
        self.messages_received
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub(crate) fn report_entries_dropped(&self, why: &str, n: u64) {
        self.report_entries_dropped
            .get_or_create(&reason(why))
            .inc_by(n);
    }

    pub(crate) fn report_throttled(&self) {
        self.reports_throttled.inc();
    }

    pub(crate) fn retry_sent(&self) {
        self.retries.inc();
    }

    pub(crate) fn heartbeat(&self) {
        self.heartbeats.inc();
    }

    /// A session of `member` was established.
    pub(crate) fn member_session(&self, member: &str) {
        self.member_sessions
            .get_or_create(&MemberLabel {
                member: member.to_owned(),
            })
            .inc();
    }

    /// `member`'s session carried `delta` more and has round-trip time `rtt`.
    pub(crate) fn member_link(
        &self,
        member: &str,
        delta: &crate::link::LinkDelta,
        rtt: std::time::Duration,
    ) {
        let label = |direction: &str| MemberDirectionLabel {
            member: member.to_owned(),
            direction: direction.to_owned(),
        };
        for (direction, bytes, packets) in [
            ("sent", delta.bytes_sent, delta.packets_sent),
            ("received", delta.bytes_received, delta.packets_received),
        ] {
            let label = label(direction);
            self.member_link_bytes.get_or_create(&label).inc_by(bytes);
            self.member_link_packets
                .get_or_create(&label)
                .inc_by(packets);
        }
        self.member_link_rtt
            .get_or_create(&MemberLabel {
                member: member.to_owned(),
            })
            .set(rtt.as_secs_f64());
    }

    /// `member`'s live session moved to a new address.
    pub(crate) fn member_migrated(&self, member: &str) {
        self.member_migrations
            .get_or_create(&MemberLabel {
                member: member.to_owned(),
            })
            .inc();
    }

    /// Removes every per-member series of `member` (a member that was deleted).
    pub(crate) fn forget_member(&self, member: &str) {
        for direction in ["sent", "received"] {
            let label = MemberDirectionLabel {
                member: member.to_owned(),
                direction: direction.to_owned(),
            };
            self.member_link_bytes.remove(&label);
            self.member_link_packets.remove(&label);
        }
        let label = MemberLabel {
            member: member.to_owned(),
        };
        self.member_link_rtt.remove(&label);
        self.member_sessions.remove(&label);
        self.member_migrations.remove(&label);
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// One more (`delta` 1) or one fewer (-1) relayed session of `kind`: `relaying` or
    /// `served`.
    pub(crate) fn relayed_session(&self, kind: &'static str, delta: i64) {
        self.relayed_sessions
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc_by(delta);
    }
}
