//! Pod metrics across the session (protocol version [`PODMETRICS_PROTOCOL_VERSION`] and
//! later): the hub tells an agent which workloads' pods to scrape ([`ScrapeTargets`]) and the
//! agent answers with one aggregate per scrape ([`PodMetricsReport`]). Pods are never reached
//! from the hub; only these aggregates cross the boundary.
//!
//! [`PODMETRICS_PROTOCOL_VERSION`]: crate::PODMETRICS_PROTOCOL_VERSION

use serde::{Deserialize, Serialize};

use crate::WorkloadRef;

/// Most scrape targets the agent runs; further targets of a [`ScrapeTargets`] are ignored.
pub const MAX_SCRAPE_TARGETS: usize = 1024;

/// Most pods one sample may count (counted + missing): more than any workload of one member.
pub const MAX_SAMPLE_PODS: u32 = 100_000;

/// Shortest scrape interval the agent honours (KEDA's `pollingInterval` is whole seconds).
pub const MIN_SCRAPE_INTERVAL_MS: u64 = 1_000;

/// The port a pod serves its metrics on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScrapePort {
    /// A port number.
    Number(u16),
    /// The name of a container port of the pod.
    Name(String),
}

/// One pod-metrics trigger of one hub object, as this member runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrapeTarget {
    /// `namespace/name` of the DistributedScaledObject.
    pub owner: String,
    /// Index of the trigger in the DSO's `triggers[]`.
    pub trigger: u32,
    /// The workload whose ready pods are scraped.
    pub workload: WorkloadRef,
    /// The metric to sum over a pod's series, e.g. `vllm:num_requests_waiting`.
    pub metric_name: String,
    /// Where the pods serve it.
    pub port: ScrapePort,
    /// HTTP path, e.g. `/metrics`.
    pub path: String,
    /// `https` (certificates are not verified: pods serve self-signed ones) or `http`.
    pub https: bool,
    /// How often to scrape (the DSO's `pollingInterval`).
    pub interval_ms: u64,
    /// How long one pod may take to answer.
    pub timeout_ms: u64,
}

/// The complete set of scrapes the member should run; it replaces any earlier set (an empty
/// one stops every scrape).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrapeTargets {
    /// The scrapes.
    pub targets: Vec<ScrapeTarget>,
}

/// What one scrape of one target found in this member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodMetricsSample {
    /// The target's `owner`.
    pub owner: String,
    /// The target's `trigger`.
    pub trigger: u32,
    /// Sum of the metric over the pods that had it.
    pub sum: f64,
    /// Ready pods that had the metric.
    pub counted: u32,
    /// Ready pods without a value: unreachable, timed out, an error status, an unreadable
    /// or oversized body, or no such metric.
    pub missing: u32,
    /// When the scrape ended, agent clock.
    pub scraped_unix_ms: i64,
    /// Why the pods could not be listed at all (then `counted` and `missing` are 0 and the
    /// hub counts this member's pods as missing), or why the first missing pod was missing.
    pub error: Option<String>,
}

/// Samples of one or more targets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodMetricsReport {
    /// One sample per target scraped since the last report.
    pub samples: Vec<PodMetricsSample>,
}
