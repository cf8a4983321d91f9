//! The hub's KEDA external scaler: KEDA's `externalscaler.proto` over gRPC with mutual TLS,
//! answering from the samples agents sent ([`PodMetrics`]).
//!
//! Each child ScaledObject of a DSO with a `kedge-pod-metrics` trigger carries an `external`
//! trigger whose metadata names this endpoint (`scalerAddress`) and the trigger
//! ([`TRIGGER_INDEX_KEY`]); KEDA sends that metadata back with every call, together with the
//! ScaledObject's namespace and name, which are the DSO's.
//!
//! - `GetMetricSpec`: one metric, target = the trigger's `threshold` per replica
//!   (`AverageValue`).
//! - `GetMetrics`: the fleet's per-pod average × the pods it is an average over, so that
//!   the HPA's division by the current replicas leaves the average in a steady fleet (see
//!   [`Reading::metric_value`](super::Reading::metric_value)). `UNAVAILABLE` when no pod in
//!   the fleet has a value: KEDA then keeps the replicas, or applies `fallback`.
//! - `IsActive` / `StreamIsActive`: whether the average is above zero (the stream looks
//!   again at every polling interval and sends each change).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kedge_scaler_api::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use kedge_scaler_api::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::certs::ScalerCerts;
use super::{PodMetrics, Reading};
use crate::metrics::HubMetrics;

pub use kedge_core::podmetrics::TRIGGER_INDEX_KEY;
/// Default port of the external scaler (the chart's `scaler.port`, `kubectl kedge install hub --scaler-port`).
pub const DEFAULT_PORT: u16 = 9090;
/// Most TLS connections open at once (KEDA keeps one per scaler address).
pub const MAX_CONNECTIONS: usize = 256;
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds of how often `StreamIsActive` looks at the value again: the DSO's polling
/// interval (how often new samples come), within these.
pub const STREAM_INTERVAL: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// The external-scaler service.
#[derive(Debug, Clone)]
pub struct Scaler {
    pod_metrics: Arc<PodMetrics>,
    metrics: HubMetrics,
}

/// The metric name KEDA is given for a pod metric (`vllm:num_requests_waiting` →
/// `pod-vllm-num-requests-waiting`): lowercase alphanumerics and dashes, as KEDA's metric
/// names are.
pub fn metric_name(metric: &str) -> String {
    let mut name = String::from("pod-");
    for c in metric.chars() {
        match c {
            'a'..='z' | '0'..='9' => name.push(c),
            'A'..='Z' => name.push(c.to_ascii_lowercase()),
            _ if !name.ends_with('-') => name.push('-'),
            _ => {}
        }
    }
    name.trim_end_matches('-').to_owned()
}

impl Scaler {
    /// The service over `pod_metrics`.
    pub fn new(pod_metrics: Arc<PodMetrics>, metrics: HubMetrics) -> Self {
        Self {
            pod_metrics,
            metrics,
        }
    }

    /// The DSO trigger a call is about: `namespace/name` and the trigger index.
    fn locate(so: Option<&ScaledObjectRef>) -> Result<(String, u32), Status> {
        let so = so.ok_or_else(|| Status::invalid_argument("no scaledObjectRef"))?;
        let index = so
            .scaler_metadata
            .get(TRIGGER_INDEX_KEY)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "the trigger's metadata has no {TRIGGER_INDEX_KEY}: this ScaledObject was \
                     not made by kedge for a kedge-pod-metrics trigger"
                ))
            })?
            .parse::<u32>()
            .map_err(|_| {
                Status::invalid_argument(format!("{TRIGGER_INDEX_KEY} is not a trigger index"))
            })?;
        Ok((format!("{}/{}", so.namespace, so.name), index))
    }

    fn reading(&self, so: Option<&ScaledObjectRef>) -> Result<Reading, Status> {
        let (owner, index) = Self::locate(so)?;
        self.pod_metrics
            .reading(&owner, index, Instant::now())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no kedge-pod-metrics trigger {index} of DistributedScaledObject {owner} \
                     (deleted, changed, or this hub is not the active one)"
                ))
            })
    }

    fn count<T>(&self, method: &str, result: Result<T, Status>) -> Result<T, Status> {
        let code = match &result {
            Ok(_) => "ok".to_owned(),
            Err(status) => format!("{:?}", status.code()).to_ascii_lowercase(),
        };
        self.metrics.scaler_request(method, &code);
        if let Err(status) = &result {
            debug!(method, code = ?status.code(), message = status.message(), "external scaler call failed");
        }
        result
    }
}

fn active(reading: &Reading) -> bool {
    reading.value.is_some_and(|v| v.average > 0.0)
}

/// Why there is no value, for KEDA's log and the ScaledObject's condition.
fn no_value(owner: &Reading) -> Status {
    let why: Vec<String> = owner
        .members
        .iter()
        .map(|m| match &m.error {
            Some(e) => format!("{}: {e}", m.member),
            None => format!(
                "{}: {} pods, none with {}",
                m.member, m.missing, owner.metric_name
            ),
        })
        .collect();
    Status::unavailable(format!(
        "no pod in the fleet has a value of {} ({})",
        owner.metric_name,
        if why.is_empty() {
            "no member runs the workload".to_owned()
        } else {
            why.join("; ")
        }
    ))
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let result = self
            .reading(Some(request.get_ref()))
            .map(|r| Response::new(IsActiveResponse { result: active(&r) }));
        self.count("IsActive", result)
    }

    type StreamIsActiveStream = ActivityStream;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let so = request.into_inner();
        let first = self.count("StreamIsActive", self.reading(Some(&so)))?;
        let interval = first.interval.clamp(STREAM_INTERVAL.0, STREAM_INTERVAL.1);
        let scaler = self.clone();
        // The current activity at once, then each change.
        let stream = futures::stream::unfold(
            (scaler, so, None::<bool>, Some(active(&first))),
            move |(scaler, so, mut last, mut pending)| async move {
                loop {
                    if let Some(now) = pending.take()
                        && last != Some(now)
                    {
                        last = Some(now);
                        return Some((
                            Ok(IsActiveResponse { result: now }),
                            (scaler, so, last, None),
                        ));
                    }
                    tokio::time::sleep(interval).await;
                    match scaler.reading(Some(&so)) {
                        Ok(r) => pending = Some(active(&r)),
                        Err(status) => return Some((Err(status), (scaler, so, last, None))),
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let result = self.reading(Some(request.get_ref())).map(|r| {
            Response::new(GetMetricSpecResponse {
                metric_specs: vec![MetricSpec {
                    metric_name: metric_name(&r.metric_name),
                    target_size: r.threshold.ceil() as i64,
                    target_size_float: r.threshold,
                }],
            })
        });
        self.count("GetMetricSpec", result)
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let result = self
            .reading(request.get_ref().scaled_object_ref.as_ref())
            .and_then(|r| {
                let value = r.metric_value().ok_or_else(|| no_value(&r))?;
                Ok(Response::new(GetMetricsResponse {
                    metric_values: vec![MetricValue {
                        metric_name: metric_name(&r.metric_name),
                        metric_value: value.round() as i64,
                        metric_value_float: value,
                    }],
                }))
            });
        self.count("GetMetrics", result)
    }
}

/// Serves the external scaler on `listener` with mutual TLS through `certs` until `stop`.
pub async fn serve(
    listener: TcpListener,
    certs: Arc<ScalerCerts>,
    scaler: Scaler,
    stop: CancellationToken,
) {
    let config = match certs.server_config() {
        Ok(config) => Arc::new(config),
        Err(error) => {
            warn!(%error, "cannot configure the external scaler's TLS; not serving it");
            return;
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let (tx, rx) = mpsc::channel(16);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let accept_stop = stop.clone();
    let accept = async move {
        loop {
            let accepted = tokio::select! {
                _ = accept_stop.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(error) => {
                    warn!(%error, "accepting an external scaler connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!(%peer, "too many external scaler connections; closing this one");
                continue;
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx
                            .send(Ok::<_, std::io::Error>(SlotStream { tls, _slot: slot }))
                            .await;
                    }
                    Ok(Err(error)) => debug!(%peer, %error, "external scaler TLS handshake failed"),
                    Err(_) => debug!(%peer, "external scaler TLS handshake timed out"),
                }
            });
        }
    };
    let server = tonic::transport::Server::builder()
        .add_service(ExternalScalerServer::new(scaler))
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), stop.cancelled());
    tokio::select! {
        () = accept => {}
        result = server => {
            if let Err(error) = result {
                warn!(%error, "the external scaler stopped");
            }
        }
    }
}

/// Binds the external scaler's listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "external scaler listening (KEDA externalscaler.proto, mutual TLS)");
    Ok(listener)
}

/// A TLS connection holding its place among [`MAX_CONNECTIONS`].
#[derive(Debug)]
struct SlotStream {
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for SlotStream {
    type ConnectInfo = <tokio_rustls::server::TlsStream<tokio::net::TcpStream> as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tls.connect_info()
    }
}

impl tokio::io::AsyncRead for SlotStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SlotStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_what_keda_accepts() {
        assert_eq!(
            metric_name("vllm:num_requests_waiting"),
            "pod-vllm-num-requests-waiting"
        );
        assert_eq!(metric_name("A__b::"), "pod-a-b");
    }

    #[test]
    fn a_call_without_kedges_trigger_index_is_refused_with_the_reason() {
        let so = ScaledObjectRef {
            name: "llm".into(),
            namespace: "default".into(),
            scaler_metadata: Default::default(),
        };
        let err = Scaler::locate(Some(&so)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(TRIGGER_INDEX_KEY));
        let mut so = so;
        so.scaler_metadata
            .insert(TRIGGER_INDEX_KEY.into(), "2".into());
        assert_eq!(
            Scaler::locate(Some(&so)).unwrap(),
            ("default/llm".to_owned(), 2)
        );
    }
}
