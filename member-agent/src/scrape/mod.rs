//! Pod metrics: the hub names the workloads whose pods to scrape ([`kedge_protocol::ScrapeTargets`]),
//! the agent scrapes their ready pods every interval and sends one aggregate per target
//! ([`kedge_protocol::PodMetricsReport`]). Pods are reached only from inside their cluster;
//! only the aggregates cross to the hub.
//!
//! - [`schedule`]: when each target is due (pure);
//! - [`pods`]: which pods count and on which port (pure);
//! - [`http`]: one pod's exposition over HTTP or HTTPS;
//! - [`target`]: one scrape of one target, and its sample.

pub(crate) mod http;
pub(crate) mod pods;
pub(crate) mod schedule;
pub(crate) mod target;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kedge_protocol::{
    AgentMessage, MAX_FRAME_BYTES, MAX_SCRAPE_TARGETS, PodMetricsReport, PodMetricsSample,
    ScrapeTarget, ScrapeTargets,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use self::schedule::Schedule;
use self::target::Scraper;

/// The samples of targets scraped together, split into reports that each fit a frame with
/// room to spare (a sample's size is mostly its owner and error text).
pub(crate) fn reports(samples: Vec<PodMetricsSample>) -> Vec<PodMetricsReport> {
    const BUDGET: usize = MAX_FRAME_BYTES / 2;
    let size = |s: &PodMetricsSample| s.owner.len() + s.error.as_ref().map_or(0, String::len) + 64;
    let mut reports = Vec::new();
    let mut current = PodMetricsReport::default();
    let mut used = 0;
    for sample in samples {
        let n = size(&sample);
        if !current.samples.is_empty()
            && (used + n > BUDGET || current.samples.len() >= MAX_SCRAPE_TARGETS)
        {
            reports.push(std::mem::take(&mut current));
            used = 0;
        }
        used += n;
        current.samples.push(sample);
    }
    if !current.samples.is_empty() {
        reports.push(current);
    }
    reports
}

/// Runs the current scrape targets (replaced by every set `targets` receives) while a
/// session is up (`online`), sending the samples of the targets due together in one report
/// through `outbox`. Without a session nothing is scraped: there is no one to tell.
pub(crate) async fn scrape_loop(
    scraper: Arc<Scraper>,
    mut targets: watch::Receiver<Arc<ScrapeTargets>>,
    outbox: mpsc::Sender<AgentMessage>,
    online: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let mut schedule = Schedule::default();
    let mut batches = JoinSet::new();
    // The targets of each batch under way, to end them in the schedule even if a batch
    // panicked.
    let mut under_way: HashMap<tokio::task::Id, Vec<Arc<ScrapeTarget>>> = HashMap::new();
    loop {
        let next = schedule.next_due();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
                let set = targets.borrow_and_update().clone();
                schedule.replace(&set.targets, Instant::now());
                debug!(targets = schedule.len(), "scrape targets replaced");
            }
            Some(done) = batches.join_next_with_id() => {
                let (id, samples) = match done {
                    Ok((id, samples)) => (id, samples),
                    Err(e) => {
                        warn!(error = %e, "a scrape task failed; its targets run again when due");
                        (e.id(), Vec::new())
                    }
                };
                // Every target of the batch ends; only the samples of those still asked
                // for go out.
                let batch = under_way.remove(&id).unwrap_or_default();
                let current: Vec<bool> = batch.iter().map(|t| schedule.finished(t)).collect();
                if !online.load(Ordering::Acquire) {
                    continue;
                }
                let samples: Vec<PodMetricsSample> = samples
                    .into_iter()
                    .zip(current)
                    .filter_map(|(sample, current)| current.then_some(sample))
                    .collect();
                for report in reports(samples) {
                    if outbox.try_send(AgentMessage::PodMetrics(report)).is_err() {
                        debug!("outbox full; dropping pod metrics, the next scrape sends new ones");
                    }
                }
            }
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let due = schedule.take_due(Instant::now());
                if !online.load(Ordering::Acquire) {
                    for target in &due {
                        schedule.finished(target);
                    }
                    continue;
                }
                if due.is_empty() {
                    continue;
                }
                let scraper = scraper.clone();
                let batch = due.clone();
                let handle = batches.spawn(async move {
                    futures::future::join_all(batch.iter().map(|t| scraper.scrape(t))).await
                });
                under_way.insert(handle.id(), due);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(owner: &str, error: Option<String>) -> PodMetricsSample {
        PodMetricsSample {
            owner: owner.into(),
            trigger: 0,
            sum: 1.0,
            counted: 1,
            missing: 0,
            scraped_unix_ms: 0,
            error,
        }
    }

    #[test]
    fn samples_are_split_into_reports_that_fit_a_frame() {
        assert!(reports(Vec::new()).is_empty());
        let few = reports(vec![sample("ns/a", None), sample("ns/b", None)]);
        assert_eq!(few.len(), 1);
        assert_eq!(few[0].samples.len(), 2);
        // A hub naming long owners cannot make the agent build a frame too large to send.
        let long = "x".repeat(600 * 1024);
        let big: Vec<PodMetricsSample> = (0..8)
            .map(|_| sample(&long, Some("e".repeat(100))))
            .collect();
        let split = reports(big);
        assert!(split.len() >= 2, "{}", split.len());
        assert_eq!(split.iter().map(|r| r.samples.len()).sum::<usize>(), 8);
        for report in split {
            let message = AgentMessage::PodMetrics(report);
            assert!(kedge_protocol::encode(&message).is_ok());
        }
        let many = reports(
            (0..MAX_SCRAPE_TARGETS + 1)
                .map(|_| sample("a", None))
                .collect(),
        );
        assert_eq!(many.len(), 2);
    }
}

#[cfg(test)]
mod sim_test;
