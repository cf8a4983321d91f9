//! Calls external scalers over gRPC the way KEDA does: every polling interval `GetMetricSpec`,
//! then `GetMetrics` for its metric and `IsActive`, each under [`CALL_TIMEOUT`], on a channel
//! shared per (address, TLS material). One task per cluster follows the published targets and
//! runs one poller per external trigger; nothing here touches the store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kedge_scaler_api::external_scaler_client::ExternalScalerClient;
use kedge_scaler_api::{GetMetricsRequest, ScaledObjectRef};
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::external::{Reading, Sample, ScalerTarget, Scalers, Targets, TlsMaterial, TriggerKey};
use crate::cluster::ClusterShared;

/// The bound on each call, connecting and the TLS handshake included: a silent scaler makes
/// its trigger unreadable instead of stalling it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

type ChannelKey = (String, Option<TlsMaterial>);

/// gRPC channels by (address, TLS material), shared by the triggers that agree on both, as
/// KEDA's connection pool is. New material (a rotated Secret) is a new key, so a new channel.
#[derive(Debug, Default)]
struct Channels(Mutex<HashMap<ChannelKey, Channel>>);

impl Channels {
    /// Consistent through a panic elsewhere (a lookup or an insert), so poison is recovered.
    fn lock(&self) -> MutexGuard<'_, HashMap<ChannelKey, Channel>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The target's channel; it connects on first use, and again after a failure.
    fn get(&self, target: &ScalerTarget) -> Result<Channel, String> {
        let key = (target.address.clone(), target.tls.clone());
        let mut channels = self.lock();
        if let Some(channel) = channels.get(&key) {
            return Ok(channel.clone());
        }
        let channel = connect(target)?;
        channels.insert(key, channel.clone());
        Ok(channel)
    }

    /// Drops the channels no target uses any more (old TLS material included).
    fn retain(&self, targets: &Targets) {
        self.lock().retain(|(address, tls), _| {
            targets
                .values()
                .any(|t| &t.address == address && &t.tls == tls)
        });
    }
}

/// Follows the cluster's published targets: a poller per external trigger, replaced when its
/// target changes, stopped when it goes away. Ends at shutdown.
pub(crate) async fn run(c: Arc<ClusterShared>) {
    let channels = Arc::new(Channels::default());
    let mut published = c.scalers.subscribe();
    let mut pollers: HashMap<TriggerKey, (ScalerTarget, JoinHandle<()>)> = HashMap::new();
    loop {
        let targets = published.borrow_and_update().clone();
        pollers.retain(|key, (target, task)| {
            let keep = targets.get(key) == Some(target);
            if !keep {
                task.abort();
            }
            keep
        });
        c.scalers.retain(&targets);
        channels.retain(&targets);
        for (key, target) in targets.iter() {
            if !pollers.contains_key(key) {
                let task = tokio::spawn(poll_loop(
                    c.clone(),
                    channels.clone(),
                    key.clone(),
                    target.clone(),
                ));
                pollers.insert(key.clone(), (target.clone(), task));
            }
        }
        tokio::select! {
            _ = c.shutdown_token().cancelled() => break,
            changed = published.changed() => if changed.is_err() { break },
        }
    }
    for (_, task) in pollers.into_values() {
        task.abort();
    }
}

/// Polls one trigger at once, then every polling interval of simulated time; wakes the KEDA
/// loop when the answer changes.
async fn poll_loop(
    c: Arc<ClusterShared>,
    channels: Arc<Channels>,
    key: TriggerKey,
    target: ScalerTarget,
) {
    loop {
        let started = c.now();
        let reading = poll(&c.scalers, &channels, &target).await;
        if let Err(error) = &reading {
            tracing::debug!(cluster = %c.name, namespace = %key.0, scaled_object = %key.1, trigger = key.2, %error, "external scaler failed");
        }
        if c.scalers.record(&key, &target, reading) {
            c.wake.notify_one();
        }
        if !sleep_until(&c, started.saturating_add(target.interval_ms)).await {
            return;
        }
    }
}

/// Waits until simulated time reaches `due` (`false`: the simulator is shutting down).
async fn sleep_until(c: &ClusterShared, due: i64) -> bool {
    loop {
        // Registered before the clock is read, so a jump in between is not missed.
        let moved = c.scalers.clock_notify().notified();
        tokio::pin!(moved);
        moved.as_mut().enable();
        let now = c.now();
        if now >= due {
            return true;
        }
        let speed = c.clock.speed();
        let wait = if speed > 0.0 {
            Duration::from_millis(((due - now) as f64 / speed) as u64)
                .clamp(Duration::from_millis(1), Duration::from_secs(1))
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = c.shutdown_token().cancelled() => return false,
            _ = &mut moved => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One poll: `GetMetricSpec`, `GetMetrics` for its first metric, `IsActive`.
async fn poll(scalers: &Scalers, channels: &Channels, target: &ScalerTarget) -> Reading {
    let mut client = ExternalScalerClient::new(channels.get(target)?);
    let address = target.address.as_str();
    let so_ref = ScaledObjectRef {
        name: target.name.clone(),
        namespace: target.namespace.clone(),
        scaler_metadata: target
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let specs = call(
        scalers,
        "GetMetricSpec",
        address,
        client.get_metric_spec(so_ref.clone()),
    )
    .await?;
    let spec = specs
        .metric_specs
        .into_iter()
        .next()
        .ok_or_else(|| format!("GetMetricSpec {address}: no metric spec returned"))?;
    let per_replica = if spec.target_size_float > 0.0 {
        spec.target_size_float
    } else {
        spec.target_size as f64
    };
    // NaN included: no usable target.
    if per_replica.is_nan() || per_replica <= 0.0 {
        return Err(format!(
            "GetMetricSpec {address}: metric {:?} has no target (targetSize and targetSizeFloat are 0)",
            spec.metric_name
        ));
    }
    let request = GetMetricsRequest {
        scaled_object_ref: Some(so_ref.clone()),
        metric_name: spec.metric_name.clone(),
    };
    let metrics = call(scalers, "GetMetrics", address, client.get_metrics(request)).await?;
    if metrics.metric_values.is_empty() {
        return Err(format!(
            "GetMetrics {address}: no value for metric {:?}",
            spec.metric_name
        ));
    }
    let value = metrics
        .metric_values
        .iter()
        .map(|m| {
            if m.metric_value_float > 0.0 {
                m.metric_value_float
            } else {
                m.metric_value as f64
            }
        })
        .sum();
    let active = call(scalers, "IsActive", address, client.is_active(so_ref))
        .await?
        .result;
    Ok(Sample {
        metric: spec.metric_name,
        value,
        target: per_replica,
        active,
    })
}

/// One call under [`CALL_TIMEOUT`], counted by method and outcome (`Ok` or the status code).
async fn call<T>(
    scalers: &Scalers,
    method: &str,
    address: &str,
    response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    let (outcome, result) = match tokio::time::timeout(CALL_TIMEOUT, response).await {
        Ok(Ok(response)) => ("Ok".to_string(), Ok(response.into_inner())),
        Ok(Err(status)) => (format!("{:?}", status.code()), Err(describe(&status))),
        Err(_) => (
            format!("{:?}", tonic::Code::DeadlineExceeded),
            Err(format!(
                "rpc error: code = DeadlineExceeded desc = no answer within {CALL_TIMEOUT:?}"
            )),
        ),
    };
    scalers.count(method, &outcome);
    result.map_err(|e| format!("{method} {address}: {e}"))
}

/// A status as grpc-go prints it, with the transport's causes (a TLS error, say) appended.
fn describe(status: &tonic::Status) -> String {
    let mut out = format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    );
    if let Some(source) = std::error::Error::source(status) {
        append_causes(&mut out, source);
    }
    out
}

/// Appends an error and its sources, skipping what the text already says.
fn append_causes(out: &mut String, error: &(dyn std::error::Error + 'static)) {
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = e.source();
    }
}

/// A lazily connecting channel for the target: h2c, TLS verified against `caCert` with the
/// address's host as the server name, mutual TLS with a client certificate, or `unsafeSsl`.
fn connect(target: &ScalerTarget) -> Result<Channel, String> {
    let scheme = if target.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let failed = |what: &str, e: tonic::transport::Error| {
        let mut out = format!("{what} for scalerAddress {:?}", target.address);
        append_causes(&mut out, &e);
        out
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", target.address))
        .map_err(|e| failed("invalid address", e))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    if let Some(tls) = &target.tls {
        let mut config = ClientTlsConfig::new()
            .domain_name(tls.server_name.clone())
            .timeout(CALL_TIMEOUT);
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint = if tls.skip_verify {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            // `unsafeSsl`: any server certificate (its handshake signatures still checked).
            let verifier = kedge_net::tls::AnyServerCertificate::new(&provider);
            endpoint.tls_config_with_verifier(config, Arc::new(verifier))
        } else {
            if let Some(ca) = &tls.ca {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            endpoint.tls_config(config)
        }
        .map_err(|e| failed("invalid TLS material", e))?;
    }
    Ok(endpoint.connect_lazy())
}
