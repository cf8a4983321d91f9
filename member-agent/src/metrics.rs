//! Agent metrics, served on `/metrics` of the ops endpoint.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A `result` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Outcome.
    pub result: String,
}

/// Every agent metric. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    pub(crate) connected: Gauge,
    connects: Family<ResultLabel, Counter>,
    pub(crate) heartbeat_rtt_ms: Gauge,
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
    }

    pub(crate) fn connect_result(&self, result: &str) {
        self.connects
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }
}
