//! The hub's external scaler over real sockets: KEDA's gRPC interface behind mutual TLS from
//! the scaler's own CA, answering from agents' samples, and a certificate rotation that
//! neither restarts the server nor drops a connection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kedge_core::podmetrics::PodMetricsTrigger;
use kedge_hub::metrics::HubMetrics;
use kedge_hub::podmetrics::certs::{CertsConfig, Material, ScalerCerts};
use kedge_hub::podmetrics::scaler::{self, Scaler, TRIGGER_INDEX_KEY};
use kedge_hub::podmetrics::{Configured, ConfiguredMember, PodMetrics};
use kedge_net::pki::CertificateAuthority;
use kedge_protocol::{PodMetricsReport, PodMetricsSample, WorkloadRef};
use kedge_scaler_api::external_scaler_client::ExternalScalerClient;
use kedge_scaler_api::{GetMetricsRequest, ScaledObjectRef};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn config() -> CertsConfig {
    CertsConfig {
        hub_namespace: "kedge-system".into(),
        keda_namespace: "keda".into(),
        names: vec!["127.0.0.1".into()],
        lifetime: Duration::from_secs(3600),
    }
}

struct Running {
    port: u16,
    certs: Arc<ScalerCerts>,
    pod_metrics: Arc<PodMetrics>,
    stop: CancellationToken,
}

async fn start(material: &Material) -> Running {
    let certs = Arc::new(ScalerCerts::default());
    certs.load(material).unwrap();
    let listener = scaler::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let pod_metrics = Arc::new(PodMetrics::default());
    let stop = CancellationToken::new();
    tokio::spawn(scaler::serve(
        listener,
        certs.clone(),
        Scaler::new(pod_metrics.clone(), HubMetrics::default()),
        stop.clone(),
    ));
    Running {
        port,
        certs,
        pod_metrics,
        stop,
    }
}

async fn channel(
    port: u16,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("127.0.0.1");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

fn so_ref(index: &str) -> ScaledObjectRef {
    ScaledObjectRef {
        name: "llm".into(),
        namespace: "ai".into(),
        scaler_metadata: [(TRIGGER_INDEX_KEY.to_owned(), index.to_owned())].into(),
    }
}

fn configure(pod_metrics: &PodMetrics) {
    let metadata = BTreeMap::from([("threshold".to_owned(), "10".to_owned())]);
    pod_metrics.configure(
        "ai/llm",
        vec![Configured {
            index: 0,
            key: "kedge-pod-metrics".into(),
            trigger: PodMetricsTrigger::parse("t", &metadata).unwrap(),
            interval: Duration::from_secs(1),
            members: vec![ConfiguredMember {
                member: "edge-1".into(),
                workload: WorkloadRef::deployment("ai", "llm"),
                ready_pods: 3,
            }],
        }],
    );
}

fn sample(sum: f64, counted: u32) -> PodMetricsReport {
    PodMetricsReport {
        samples: vec![PodMetricsSample {
            owner: "ai/llm".into(),
            trigger: 0,
            sum,
            counted,
            missing: 0,
            scraped_unix_ms: 1,
            error: None,
        }],
    }
}

#[tokio::test]
async fn keda_gets_the_spec_and_the_value_over_mutual_tls() {
    let material = Material::generate(&config(), OffsetDateTime::now_utc()).unwrap();
    let hub = start(&material).await;
    configure(&hub.pod_metrics);
    let keda = channel(
        hub.port,
        &material.ca_crt,
        Some((&material.client_crt, &material.client_key)),
    )
    .await
    .unwrap();
    let mut client = ExternalScalerClient::new(keda);

    let spec = client
        .get_metric_spec(so_ref("0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(
        spec.metric_specs[0].metric_name,
        "pod-vllm-num-requests-waiting"
    );
    assert_eq!(spec.metric_specs[0].target_size_float, 10.0);

    // No sample yet: no value, and KEDA is told why.
    let request = || GetMetricsRequest {
        scaled_object_ref: Some(so_ref("0")),
        metric_name: "pod-vllm-num-requests-waiting".into(),
    };
    let err = client.get_metrics(request()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("edge-1: no sample yet"),
        "{}",
        err.message()
    );
    assert!(
        !client
            .is_active(so_ref("0"))
            .await
            .unwrap()
            .into_inner()
            .result
    );

    // 3 pods averaging 12: 12 × 3 pods, so the HPA's per-replica value (over 3) is 12.
    hub.pod_metrics
        .record("edge-1", sample(36.0, 3), tokio::time::Instant::now());
    let value = client.get_metrics(request()).await.unwrap().into_inner();
    assert_eq!(value.metric_values[0].metric_value_float, 36.0);
    assert_eq!(value.metric_values[0].metric_value, 36);
    assert!(
        client
            .is_active(so_ref("0"))
            .await
            .unwrap()
            .into_inner()
            .result
    );
    let mut stream = client
        .stream_is_active(so_ref("0"))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().result);
    // The queue empties: the stream says so within a polling interval (1 s here).
    hub.pod_metrics
        .record("edge-1", sample(0.0, 3), tokio::time::Instant::now());
    let change = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the change is pushed")
        .unwrap()
        .unwrap();
    assert!(!change.result);
    hub.pod_metrics
        .record("edge-1", sample(36.0, 3), tokio::time::Instant::now());

    // A trigger that is not configured, or a call without kedge's metadata.
    let missing = client.get_metric_spec(so_ref("7")).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let foreign = ScaledObjectRef {
        scaler_metadata: Default::default(),
        ..so_ref("0")
    };
    assert_eq!(
        client.is_active(foreign).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    hub.stop.cancel();
}

#[tokio::test]
async fn only_a_client_certificate_of_the_scaler_ca_gets_in() {
    let material = Material::generate(&config(), OffsetDateTime::now_utc()).unwrap();
    let hub = start(&material).await;
    configure(&hub.pod_metrics);
    // No client certificate.
    let anonymous = channel(hub.port, &material.ca_crt, None).await;
    let refused = match anonymous {
        Err(_) => true,
        Ok(channel) => ExternalScalerClient::new(channel)
            .is_active(so_ref("0"))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    // A certificate from another CA (a member's, say).
    let other = Material::generate(&config(), OffsetDateTime::now_utc()).unwrap();
    let stranger = channel(
        hub.port,
        &material.ca_crt,
        Some((&other.client_crt, &other.client_key)),
    )
    .await;
    let refused = match stranger {
        Err(_) => true,
        Ok(channel) => ExternalScalerClient::new(channel)
            .is_active(so_ref("0"))
            .await
            .is_err(),
    };
    assert!(refused, "a client certificate of another CA was served");
    hub.stop.cancel();
}

#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_and_old_ones_keep_working() {
    let now = OffsetDateTime::now_utc();
    let material = Material::generate(&config(), now).unwrap();
    let hub = start(&material).await;
    configure(&hub.pod_metrics);
    let identity = (material.client_crt.as_str(), material.client_key.as_str());
    let mut before = ExternalScalerClient::new(
        channel(hub.port, &material.ca_crt, Some(identity))
            .await
            .unwrap(),
    );
    before.get_metric_spec(so_ref("0")).await.unwrap();

    let ca = CertificateAuthority::from_pem(&material.ca_crt, &material.ca_key).unwrap();
    let renewed = Material::issue(&ca, &config(), now).unwrap();
    assert_ne!(renewed.server_crt, material.server_crt);
    hub.certs.load(&renewed).unwrap();

    // The connection made before the rotation keeps working.
    before.get_metric_spec(so_ref("0")).await.unwrap();
    // A new one with the new client certificate is served the new server certificate.
    let served = served_certificate(hub.port, &renewed).await;
    let renewed_der =
        rustls_pki_types::CertificateDer::from_pem_slice(renewed.server_crt.as_bytes()).unwrap();
    assert_eq!(served, renewed_der.as_ref());
    let mut after = ExternalScalerClient::new(
        channel(
            hub.port,
            &renewed.ca_crt,
            Some((&renewed.client_crt, &renewed.client_key)),
        )
        .await
        .unwrap(),
    );
    after.get_metric_spec(so_ref("0")).await.unwrap();
    hub.stop.cancel();
}

use rustls_pki_types::pem::PemObject;

/// The leaf certificate the server presents to a new TLS connection.
async fn served_certificate(port: u16, material: &Material) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(material.ca_crt.as_bytes()).unwrap())
        .unwrap();
    let chain = vec![
        rustls_pki_types::CertificateDer::from_pem_slice(material.client_crt.as_bytes()).unwrap(),
    ];
    let key =
        rustls_pki_types::PrivateKeyDer::from_pem_slice(material.client_key.as_bytes()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec()
}
