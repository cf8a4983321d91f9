//! One scrape of one target: the agent's policy, the workload's selector from its `/scale`
//! (as the HPA finds a workload's pods), its ready pods, each pod's metric, and the sample
//! that sums them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use hyper::http::uri::PathAndQuery;
use kedge_core::podmetrics::{MAX_SCRAPE_TIMEOUT, metric_sum};
use kedge_protocol::{
    FailureCode, MAX_MESSAGE_BYTES, MAX_SAMPLE_PODS, PodMetricsSample, ScrapeTarget, clean_text,
    unix_ms,
};
use kube::Api;
use kube::api::ListParams;
use rustls::ClientConfig;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::debug;

use super::http::{Fetch, Miss, fetch};
use super::pods::{ReadyPod, ScrapePod, ready_pods, resolve_port};
use crate::executor::{Executor, classify};
use crate::lite::for_each_page;
use crate::metrics::AgentMetrics;

/// Most pod requests in flight at once, over every target.
pub(crate) const MAX_PODS_IN_FLIGHT: usize = 32;

/// Most targets reading the member's API server (their `/scale` and pods) at once.
pub(crate) const MAX_TARGETS_READING: usize = 8;

/// How long one pod may take: the target's timeout, within 1 ms and
/// [`MAX_SCRAPE_TIMEOUT`].
pub(crate) fn pod_timeout(target: &ScrapeTarget) -> Duration {
    Duration::from_millis(target.timeout_ms).clamp(Duration::from_millis(1), MAX_SCRAPE_TIMEOUT)
}

/// What one ready pod gave.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodResult {
    /// Pod name.
    pub(crate) pod: String,
    /// Where it was asked, once its port resolved and its IP parsed.
    pub(crate) addr: Option<SocketAddr>,
    /// Its value, or why it has none.
    pub(crate) value: Result<f64, Miss>,
}

/// The value of `metric` in a pod's exposition `body`.
pub(crate) fn value_of(body: &str, metric: &str) -> Result<f64, Miss> {
    match metric_sum(body, metric) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(Miss::NoMetric(metric.to_owned())),
        Err(e) => Err(Miss::Malformed(e.to_string())),
    }
}

/// The sample of `target` from its pods' results: the sum and count of the values, the
/// pods without one, and why the first of them (by pod name) had none.
pub(crate) fn sample(
    target: &ScrapeTarget,
    mut pods: Vec<PodResult>,
    scraped_unix_ms: i64,
) -> PodMetricsSample {
    pods.sort_by(|a, b| a.pod.cmp(&b.pod));
    let (mut sum, mut counted, mut missing) = (0.0, 0u32, 0u32);
    let mut error = None;
    for pod in &pods {
        match &pod.value {
            Ok(value) => {
                sum += value;
                counted += 1;
            }
            Err(miss) => {
                missing += 1;
                error.get_or_insert_with(|| match pod.addr {
                    Some(addr) => format!("pod {} ({addr}): {miss}", pod.pod),
                    None => format!("pod {}: {miss}", pod.pod),
                });
            }
        }
    }
    if !sum.is_finite() {
        // Values each finite can still overflow together: no pod has a usable value then.
        missing += counted;
        counted = 0;
        sum = 0.0;
        error = Some("the sum of the pods' values is not a finite number".to_owned());
    }
    PodMetricsSample {
        owner: target.owner.clone(),
        trigger: target.trigger,
        sum,
        counted,
        missing,
        scraped_unix_ms,
        error: error.map(|e| clean_text(&e, MAX_MESSAGE_BYTES)),
    }
}

/// A sample of a target that was not scraped: refused by the policy, or its pods could not
/// be listed. Counts nothing, so the hub counts this member's pods as missing.
pub(crate) fn not_scraped(
    target: &ScrapeTarget,
    why: &str,
    scraped_unix_ms: i64,
) -> PodMetricsSample {
    PodMetricsSample {
        owner: target.owner.clone(),
        trigger: target.trigger,
        sum: 0.0,
        counted: 0,
        missing: 0,
        scraped_unix_ms,
        error: Some(clean_text(why, MAX_MESSAGE_BYTES)),
    }
}

/// Why a target's pods were not scraped, with its `outcome` label.
#[derive(Debug)]
struct NotScraped {
    outcome: &'static str,
    why: String,
}

impl NotScraped {
    fn new(outcome: &'static str, why: String) -> Self {
        Self { outcome, why }
    }
}

/// Scrapes targets in the member: shared by every scrape, bounding pod requests and API
/// reads over all of them.
#[derive(Debug)]
pub(crate) struct Scraper {
    executor: Arc<Executor>,
    metrics: AgentMetrics,
    pod_requests: Semaphore,
    api_reads: Semaphore,
    /// For `https` targets; why not, should the TLS configuration not build.
    tls: Result<Arc<ClientConfig>, String>,
}

impl Scraper {
    /// A scraper acting within `executor`'s policy and client.
    pub(crate) fn new(executor: Arc<Executor>, metrics: AgentMetrics) -> Self {
        Self {
            executor,
            metrics,
            pod_requests: Semaphore::new(MAX_PODS_IN_FLIGHT),
            api_reads: Semaphore::new(MAX_TARGETS_READING),
            tls: super::http::insecure_client_config().map_err(|e| e.to_string()),
        }
    }

    /// Scrapes every ready pod of `target` once.
    pub(crate) async fn scrape(&self, target: &ScrapeTarget) -> PodMetricsSample {
        let now = || unix_ms(SystemTime::now());
        let prepared = match self.prepare(target) {
            Ok(prepared) => prepared,
            Err(not) => return self.not_scraped(target, not, now()),
        };
        let pods = {
            let _reading = self.api_reads.acquire().await.ok();
            match self.ready_pods(target).await {
                Ok(pods) => pods,
                Err(not) => return self.not_scraped(target, not, now()),
            }
        };
        let (path, tls) = prepared;
        let results: Vec<PodResult> = futures::stream::iter(pods)
            .map(|pod| self.scrape_pod(target, &path, tls.as_ref(), pod))
            .buffer_unordered(MAX_PODS_IN_FLIGHT)
            .collect()
            .await;
        sample(target, results, now())
    }

    fn not_scraped(&self, target: &ScrapeTarget, not: NotScraped, at: i64) -> PodMetricsSample {
        debug!(owner = %target.owner, trigger = target.trigger, outcome = not.outcome,
            why = %not.why, "pods not scraped");
        self.metrics.pod_scraped(not.outcome, None);
        not_scraped(target, &not.why, at)
    }

    /// The target's path, and its TLS configuration when `https`.
    fn prepare(
        &self,
        target: &ScrapeTarget,
    ) -> Result<(PathAndQuery, Option<Arc<ClientConfig>>), NotScraped> {
        let path = target
            .path
            .parse::<PathAndQuery>()
            .ok()
            .filter(|p| p.as_str().starts_with('/'))
            .ok_or_else(|| {
                NotScraped::new(
                    "invalid_target",
                    format!("metric path {:?} is not an absolute URL path", target.path),
                )
            })?;
        let tls = match (&self.tls, target.https) {
            (_, false) => None,
            (Ok(config), true) => Some(config.clone()),
            (Err(why), true) => {
                return Err(NotScraped::new(
                    "invalid_target",
                    format!("cannot configure TLS: {why}"),
                ));
            }
        };
        Ok((path, tls))
    }

    /// The ready pods of the target's workload: refused outside the agent's namespaces and
    /// kinds; found by the label selector its `/scale` reports.
    async fn ready_pods(&self, target: &ScrapeTarget) -> Result<Vec<ReadyPod>, NotScraped> {
        let w = &target.workload;
        let api = self.executor.workload_api(w).await.map_err(|failure| {
            let outcome = match failure.code {
                FailureCode::NamespaceNotAllowed | FailureCode::KindNotAllowed => "refused",
                _ => "unreadable",
            };
            NotScraped::new(outcome, failure.message)
        })?;
        let what = format!("reading the scale of {} {}/{}", w.kind, w.namespace, w.name);
        let scale = api
            .get_scale(&w.name)
            .await
            .map_err(|e| NotScraped::new("unreadable", classify(&e, &what).message))?;
        let selector = scale
            .status
            .and_then(|s| s.selector)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| {
                NotScraped::new(
                    "unreadable",
                    format!("{what}: it reports no pod selector (status.selector)"),
                )
            })?;
        let pods: Api<ScrapePod> = Api::namespaced(self.executor.client().clone(), &w.namespace);
        let mut ready = Vec::new();
        for_each_page(&pods, ListParams::default().labels(&selector), |page| {
            ready.extend(ready_pods(&page));
        })
        .await
        .map_err(|e| {
            let what = format!("listing the pods of {} {}/{}", w.kind, w.namespace, w.name);
            NotScraped::new("unreadable", classify(&e, &what).message)
        })?;
        ready.sort_by(|a, b| a.name.cmp(&b.name));
        ready.truncate(MAX_SAMPLE_PODS as usize);
        Ok(ready)
    }

    async fn scrape_pod(
        &self,
        target: &ScrapeTarget,
        path: &PathAndQuery,
        tls: Option<&Arc<ClientConfig>>,
        pod: ReadyPod,
    ) -> PodResult {
        let addr = resolve_port(&pod, &target.port)
            .map_err(Miss::NoPort)
            .and_then(|port| {
                let ip: IpAddr = pod
                    .ip
                    .parse()
                    .map_err(|_| Miss::BadAddress(pod.ip.clone()))?;
                Ok(SocketAddr::new(ip, port))
            });
        let (addr, value) = match addr {
            Err(miss) => {
                self.metrics.pod_scraped(miss.outcome(), None);
                (None, Err(miss))
            }
            Ok(addr) => {
                // Never closed: a permit always comes.
                let _permit = self.pod_requests.acquire().await.ok();
                let started = Instant::now();
                let request = Fetch {
                    addr,
                    path,
                    tls,
                    timeout: pod_timeout(target),
                };
                let value = fetch(request)
                    .await
                    .and_then(|body| value_of(&body, &target.metric_name));
                let outcome = value.as_ref().map_or_else(Miss::outcome, |_| "counted");
                self.metrics.pod_scraped(outcome, Some(started.elapsed()));
                (Some(addr), value)
            }
        };
        PodResult {
            pod: pod.name,
            addr,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::schedule::tests::target;

    fn result(pod: &str, value: Result<f64, Miss>) -> PodResult {
        PodResult {
            pod: pod.into(),
            addr: Some("127.1.0.4:5000".parse().unwrap()),
            value,
        }
    }

    #[test]
    fn a_sample_sums_the_pods_with_a_value_and_names_the_first_without() {
        let t = target("ns/dso", 2, 1_000);
        let s = sample(
            &t,
            vec![
                result("web-3", Err(Miss::Status(500))),
                result("web-0", Ok(1.5)),
                result("web-1", Err(Miss::Timeout(Duration::from_secs(5)))),
                result("web-2", Ok(2.0)),
                PodResult {
                    pod: "web-4".into(),
                    addr: None,
                    value: Err(Miss::NoPort("no container port named \"m\"".into())),
                },
            ],
            42,
        );
        assert_eq!(
            (
                s.owner.as_str(),
                s.trigger,
                s.sum,
                s.counted,
                s.missing,
                s.scraped_unix_ms
            ),
            ("ns/dso", 2, 3.5, 2, 3, 42)
        );
        assert_eq!(
            s.error.as_deref(),
            Some("pod web-1 (127.1.0.4:5000): timed out after 5s")
        );
        let none = sample(&t, vec![], 7);
        assert_eq!((none.counted, none.missing, none.error), (0, 0, None));
        let s = sample(
            &t,
            vec![result("a", Ok(f64::MAX)), result("b", Ok(f64::MAX))],
            1,
        );
        assert_eq!((s.sum, s.counted, s.missing), (0.0, 0, 2));
        assert!(s.error.unwrap().contains("not a finite number"));
    }

    #[test]
    fn a_pods_value_is_the_sum_of_its_series() {
        let text =
            "# HELP m waiting\n# TYPE m gauge\nm{model=\"a\"} 2\nm{model=\"b\"} 3.5\nother 9\n";
        assert_eq!(value_of(text, "m"), Ok(5.5));
        assert_eq!(
            value_of(text, "absent"),
            Err(Miss::NoMetric("absent".into()))
        );
        let bad = value_of("m{model=\"a\"} lots\n", "m").unwrap_err();
        assert_eq!(bad.outcome(), "malformed");
        assert!(bad.to_string().contains("line 1"), "{bad}");
    }

    #[test]
    fn timeouts_are_bounded() {
        let mut t = target("ns/dso", 0, 1_000);
        t.timeout_ms = 0;
        assert_eq!(pod_timeout(&t), Duration::from_millis(1));
        t.timeout_ms = u64::MAX;
        assert_eq!(pod_timeout(&t), MAX_SCRAPE_TIMEOUT);
    }
}
