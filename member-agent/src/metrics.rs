//! Agent metrics, served on `/metrics` of the ops endpoint.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A `result` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Outcome.
    pub result: String,
}

/// An `outcome` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// Outcome.
    pub outcome: String,
}

/// Every agent metric. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    pub(crate) connected: Gauge,
    connects: Family<ResultLabel, Counter>,
    pub(crate) heartbeat_rtt_ms: Gauge,
    pod_scrapes: Family<OutcomeLabel, Counter>,
    pod_scrape_seconds: Histogram,
    desired_states: Counter,
    desired_revision: Gauge,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self {
            connected: Gauge::default(),
            connects: Family::default(),
            heartbeat_rtt_ms: Gauge::default(),
            pod_scrapes: Family::default(),
            // 1 ms to 16 s: loopback answers to pods at their timeout.
            pod_scrape_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            desired_states: Counter::default(),
            desired_revision: Gauge::default(),
        }
    }
}

impl AgentMetrics {
    /// Registers every metric under the `kedge_agent` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kedge_agent");
        r.register(
            "connected",
            "1 while a session with the hub is established",
            self.connected.clone(),
        );
        r.register(
            "connects",
            "Connection attempts by result",
            self.connects.clone(),
        );
        r.register(
            "heartbeat_rtt_ms",
            "Round-trip time of the last heartbeat",
            self.heartbeat_rtt_ms.clone(),
        );
        r.register(
            "pod_scrapes",
            "Pod metrics scrapes by outcome: one per ready pod asked (counted, or why it has \
             no value), or one per target not scraped (refused, unreadable, invalid_target)",
            self.pod_scrapes.clone(),
        );
        r.register(
            "pod_scrape_seconds",
            "How long one pod's metrics request took (connect, TLS and response)",
            self.pod_scrape_seconds.clone(),
        );
        r.register(
            "desired_states",
            "Desired states received from the hub (each replaces the last whole: after an outage, one brings the latest)",
            self.desired_states.clone(),
        );
        r.register(
            "desired_revision",
            "Revision of the last desired state received from the hub",
            self.desired_revision.clone(),
        );
    }

    /// Counts a desired state of `revision` received.
    pub(crate) fn desired_state(&self, revision: u64) {
        self.desired_states.inc();
        self.desired_revision
            .set(i64::try_from(revision).unwrap_or(i64::MAX));
    }

    /// Counts one scrape outcome; `took` is how long a pod's request took, if one was made.
    pub(crate) fn pod_scraped(&self, outcome: &str, took: Option<std::time::Duration>) {
        self.pod_scrapes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
        if let Some(took) = took {
            self.pod_scrape_seconds.observe(took.as_secs_f64());
        }
    }

    pub(crate) fn connect_result(&self, result: &str) {
        self.connects
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }
}
