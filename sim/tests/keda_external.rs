//! KEDA's `external` trigger against a real gRPC scaler on 127.0.0.1: a tonic server behind
//! a tokio-rustls acceptor that requires client certificates, certificates from rcgen.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kedge_scaler_api::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use kedge_scaler_api::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use kedge_sim::{Cluster, Sim, SimConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

const METRIC: &str = "queue-depth";

/// What the test scaler answers, and what it was asked.
#[derive(Debug, Default)]
struct ScalerState {
    value: f64,
    target: f64,
    active: bool,
    /// The last ScaledObjectRef received.
    last_ref: Option<ScaledObjectRef>,
    /// The client certificate of every call (DER), in order.
    client_certs: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
struct TestScaler(Arc<Mutex<ScalerState>>);

impl TestScaler {
    fn new(value: f64, target: f64, active: bool) -> TestScaler {
        TestScaler(Arc::new(Mutex::new(ScalerState {
            value,
            target,
            active,
            ..ScalerState::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ScalerState> {
        self.0.lock().expect("scaler state")
    }

    fn seen<T>(&self, request: &Request<T>, so_ref: Option<&ScaledObjectRef>) {
        let mut state = self.state();
        if let Some(cert) = request.peer_certs().and_then(|c| c.first().cloned()) {
            state.client_certs.push(cert.to_vec());
        }
        state.last_ref = so_ref.cloned();
    }
}

#[tonic::async_trait]
impl ExternalScaler for TestScaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        self.seen(&request, Some(request.get_ref()));
        Ok(Response::new(IsActiveResponse {
            result: self.state().active,
        }))
    }

    type StreamIsActiveStream = ReceiverStream<Result<IsActiveResponse, Status>>;

    async fn stream_is_active(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        Err(Status::unimplemented("KEDA's push scaler is not used"))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        self.seen(&request, Some(request.get_ref()));
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: METRIC.into(),
                target_size: 0,
                target_size_float: self.state().target,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        self.seen(&request, request.get_ref().scaled_object_ref.as_ref());
        if request.get_ref().metric_name != METRIC {
            return Err(Status::not_found("unknown metric"));
        }
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: METRIC.into(),
                metric_value: 0,
                metric_value_float: self.state().value,
            }],
        }))
    }
}

/// A CA and what it signs.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, name: &str) -> Leaf {
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        let der =
            rustls_pki_types::pem::PemObject::from_pem_slice(self.pem.as_bytes()).expect("CA PEM");
        roots.add(der).expect("CA root");
        roots
    }
}

/// The scaler's TLS: its certificate for 127.0.0.1, client certificates from `clients` required.
fn server_config(server: &Leaf, clients: &Ca) -> Arc<ServerConfig> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(clients.root_store()),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key_der.clone()));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server.der.clone()], key)
        .expect("server certificate");
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// The current TLS configuration of a running scaler; replacing it affects new connections.
type TlsSwitch = Arc<Mutex<Arc<ServerConfig>>>;

/// Serves `scaler` on 127.0.0.1 with mutual TLS; returns its address.
async fn serve_tls(scaler: TestScaler, tls: TlsSwitch) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let config = tls.lock().expect("tls").clone();
            let tx = tx.clone();
            // A failed handshake (an untrusted client or server) just drops the connection.
            tokio::spawn(async move {
                if let Ok(stream) = TlsAcceptor::from(config).accept(tcp).await {
                    let _ = tx.send(Ok::<_, std::io::Error>(stream)).await;
                }
            });
        }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ExternalScalerServer::new(scaler))
            .serve_with_incoming(ReceiverStream::new(rx)),
    );
    addr
}

/// Serves `scaler` on 127.0.0.1 in plaintext (h2c); returns its address.
async fn serve_plain(scaler: TestScaler) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tx.send(Ok::<_, std::io::Error>(tcp)).await;
        }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ExternalScalerServer::new(scaler))
            .serve_with_incoming(ReceiverStream::new(rx)),
    );
    addr
}

/// A cluster with KEDA installed and a Deployment `web` at 1 replica.
async fn cluster() -> Sim {
    let sim = Sim::start(&["hub".to_string()], SimConfig::default(), None)
        .await
        .expect("sim");
    let c = &sim.clusters()[0];
    kedge_sim::keda::install(c).expect("KEDA");
    c.put_object(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .expect("deployment");
    sim
}

/// The Secret in KEDA's namespace and the ClusterTriggerAuthentication naming its keys.
fn put_client_secret(c: &Cluster, ca: &Ca, client: &Leaf) {
    let b64 = |s: &str| kedge_sim::protobuf::base64(s.as_bytes());
    c.put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "scaler-client", "namespace": "keda"},
        "data": {"ca.crt": b64(&ca.pem), "tls.crt": b64(&client.cert_pem), "tls.key": b64(&client.key_pem)}}))
        .expect("secret");
    c.put_object(
        json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
        "metadata": {"name": "scaler"},
        "spec": {"secretTargetRef": [
            {"parameter": "caCert", "name": "scaler-client", "key": "ca.crt"},
            {"parameter": "tlsClientCert", "name": "scaler-client", "key": "tls.crt"},
            {"parameter": "tlsClientKey", "name": "scaler-client", "key": "tls.key"}]}}),
    )
    .expect("cluster trigger authentication");
}

fn scaled_object(address: SocketAddr, authenticated: bool, extra: Value) -> Value {
    let mut trigger = json!({"type": "external",
        "metadata": {"scalerAddress": address.to_string(), "podSelector": "app=web"}});
    if authenticated {
        trigger["authenticationRef"] =
            json!({"name": "scaler", "kind": "ClusterTriggerAuthentication"});
    }
    let mut so = json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"scaleTargetRef": {"name": "web"}, "pollingInterval": 5,
            "minReplicaCount": 1, "maxReplicaCount": 20, "triggers": [trigger]}});
    if let (Some(spec), Some(extra)) = (so["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    so
}

fn replicas(c: &Cluster) -> Option<i64> {
    c.object("apps/v1", "Deployment", "default", "web")?["spec"]["replicas"].as_i64()
}

fn ready(c: &Cluster) -> Option<Value> {
    let so = c.object("keda.sh/v1alpha1", "ScaledObject", "default", "web")?;
    so["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `secs` seconds.
async fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_replicas(c: &Cluster, want: i64) {
    eventually(10, &format!("{want} replicas"), || {
        (replicas(c) == Some(want)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_trigger_over_mutual_tls_scales_to_value_over_target() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let ca = Ca::new("scaler-ca");
    let server = ca.leaf("127.0.0.1");
    let client = ca.leaf("keda");
    let scaler = TestScaler::new(23.0, 5.0, true);
    let addr = serve_tls(
        scaler.clone(),
        Arc::new(Mutex::new(server_config(&server, &ca))),
    )
    .await;
    put_client_secret(c, &ca, &client);
    c.put_object(scaled_object(addr, true, json!({})))
        .expect("scaled object");

    // ceil(23 / 5)
    wait_replicas(c, 5).await;
    let so = c
        .object("keda.sh/v1alpha1", "ScaledObject", "default", "web")
        .expect("scaled object");
    assert_eq!(
        so["status"]["externalMetricNames"],
        json!([format!("s0-{METRIC}")])
    );
    assert_eq!(ready(c).expect("Ready")["status"], "True");
    {
        let state = scaler.state();
        let so_ref = state.last_ref.clone().expect("a ScaledObjectRef");
        assert_eq!(
            (so_ref.name.as_str(), so_ref.namespace.as_str()),
            ("web", "default")
        );
        assert_eq!(
            so_ref
                .scaler_metadata
                .get("podSelector")
                .map(String::as_str),
            Some("app=web")
        );
        assert_eq!(
            so_ref.scaler_metadata.get("scalerAddress"),
            Some(&addr.to_string())
        );
        assert!(
            state
                .client_certs
                .iter()
                .all(|der| *der == client.der.to_vec()),
            "every call presents KEDA's client certificate"
        );
    }
    for method in ["GetMetricSpec", "GetMetrics", "IsActive"] {
        assert!(c.scaler_calls(method, "Ok") >= 1, "{method} called");
    }

    // The next polling interval reads the new value: ceil(42 / 5).
    scaler.state().value = 42.0;
    sim.advance(Duration::from_secs(6));
    wait_replicas(c, 9).await;
    assert!(c.scaler_calls("GetMetrics", "Ok") >= 2);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaler_signed_by_another_ca_is_refused_and_the_condition_says_why() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let ca = Ca::new("scaler-ca");
    let other = Ca::new("someone-else");
    let server = ca.leaf("127.0.0.1");
    let client = ca.leaf("keda");
    let scaler = TestScaler::new(23.0, 5.0, true);
    let addr = serve_tls(
        scaler.clone(),
        Arc::new(Mutex::new(server_config(&server, &ca))),
    )
    .await;
    // KEDA trusts `other`, which did not sign the scaler's certificate.
    put_client_secret(c, &other, &client);
    c.put_object(scaled_object(addr, true, json!({})))
        .expect("scaled object");

    let cond = eventually(10, "Ready=False", || {
        ready(c).filter(|r| r["status"] == "False")
    })
    .await;
    assert_eq!(cond["reason"], "KEDAScalerFailed");
    let message = cond["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "s0-external: GetMetricSpec {addr}: rpc error: code = "
        )),
        "{message}"
    );
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert_eq!(replicas(c), Some(1), "not scaled");
    assert!(scaler.state().last_ref.is_none(), "no call got through");
    assert_eq!(c.scaler_calls("GetMetricSpec", "Ok"), 0);
    assert_eq!(
        c.scaler_calls("GetMetrics", "Ok") + c.scaler_calls("IsActive", "Ok"),
        0
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_works_without_an_authentication_ref() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let scaler = TestScaler::new(7.5, 2.5, true);
    let addr = serve_plain(scaler.clone()).await;
    c.put_object(scaled_object(addr, false, json!({})))
        .expect("scaled object");
    // ceil(7.5 / 2.5)
    wait_replicas(c, 3).await;
    assert!(c.scaler_calls("IsActive", "Ok") >= 1);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inactive_scaler_idles_the_target() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let scaler = TestScaler::new(23.0, 5.0, false);
    let addr = serve_plain(scaler.clone()).await;
    c.put_object(scaled_object(
        addr,
        false,
        json!({"minReplicaCount": 2, "idleReplicaCount": 0}),
    ))
    .expect("scaled object");
    // IsActive=false: idleReplicaCount, whatever the value.
    wait_replicas(c, 0).await;
    let so = c
        .object("keda.sh/v1alpha1", "ScaledObject", "default", "web")
        .expect("scaled object");
    let active = so["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Active").cloned())
        .expect("Active");
    assert_eq!(active["status"], "False");

    scaler.state().active = true;
    sim.advance(Duration::from_secs(6));
    wait_replicas(c, 5).await;

    // Without idleReplicaCount an inactive scaler leaves minReplicaCount.
    scaler.state().active = false;
    c.put_object(scaled_object(addr, false, json!({"minReplicaCount": 2})))
        .expect("scaled object");
    wait_replicas(c, 2).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_in_the_secret_are_used_by_the_next_calls() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let old_ca = Ca::new("scaler-ca-1");
    let old_client = old_ca.leaf("keda");
    let scaler = TestScaler::new(23.0, 5.0, true);
    let tls = Arc::new(Mutex::new(server_config(
        &old_ca.leaf("127.0.0.1"),
        &old_ca,
    )));
    let addr = serve_tls(scaler.clone(), tls.clone()).await;
    put_client_secret(c, &old_ca, &old_client);
    c.put_object(scaled_object(addr, true, json!({})))
        .expect("scaled object");
    wait_replicas(c, 5).await;
    let ok_before = c.scaler_calls("GetMetrics", "Ok");

    // The scaler rotates to a new CA (new connections only), then the Secret follows.
    let new_ca = Ca::new("scaler-ca-2");
    let new_client = new_ca.leaf("keda");
    *tls.lock().expect("tls") = server_config(&new_ca.leaf("127.0.0.1"), &new_ca);
    put_client_secret(c, &new_ca, &new_client);
    eventually(10, "a call with the new client certificate", || {
        let state = scaler.state();
        (state.client_certs.last() == Some(&new_client.der.to_vec())).then_some(())
    })
    .await;
    scaler.state().value = 42.0;
    sim.advance(Duration::from_secs(6));
    wait_replicas(c, 9).await;
    // The poll right after the rotation, and the one after the interval.
    eventually(10, "KEDA to keep calling through the rotation", || {
        (c.scaler_calls("GetMetrics", "Ok") >= ok_before + 2).then_some(())
    })
    .await;
    for code in ["Unavailable", "Unknown", "DeadlineExceeded", "Internal"] {
        for method in ["GetMetricSpec", "GetMetrics", "IsActive"] {
            assert_eq!(c.scaler_calls(method, code), 0, "{method} {code}");
        }
    }
    assert_eq!(ready(c).expect("Ready")["status"], "True");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_trigger_is_a_condition_not_a_crash() {
    let sim = cluster().await;
    let c = &sim.clusters()[0];
    let mut so = scaled_object("127.0.0.1:1".parse().expect("address"), true, json!({}));
    so["spec"]["triggers"][0]["metadata"] = json!({"podSelector": "app=web"});
    c.put_object(so).expect("scaled object");
    let cond = eventually(10, "Ready=False", || {
        ready(c).filter(|r| r["status"] == "False")
    })
    .await;
    assert_eq!(cond["reason"], "KEDAScalerFailed");
    assert!(
        cond["message"]
            .as_str()
            .is_some_and(|m| m.contains("missing required parameter \"scalerAddress\"")),
        "{cond}"
    );

    // A ClusterTriggerAuthentication whose Secret is missing.
    c.put_object(scaled_object(
        "127.0.0.1:1".parse().expect("address"),
        true,
        json!({}),
    ))
    .expect("scaled object");
    let cond = eventually(10, "the missing authentication", || {
        ready(c).filter(|r| {
            r["message"].as_str().is_some_and(|m| {
                m.contains("clustertriggerauthentications.keda.sh \"scaler\" not found")
            })
        })
    })
    .await;
    assert_eq!(cond["reason"], "KEDAScalerFailed");
    assert_eq!(replicas(c), Some(1));
    sim.shutdown().await;
}
