//! The certificates of the hub's KEDA external scaler, managed the way Kaito's scaler
//! manager does it, without anyone writing a Secret:
//!
//! - a CA of its own (not the member CA: a member's certificate cannot call the scaler),
//!   the server certificate and KEDA's client certificate live in the Secret [`TLS_SECRET`]
//!   of the hub namespace;
//! - KEDA's copy — the CA certificate and the client certificate and key, never a CA or
//!   server key — is the Secret [`CLIENT_SECRET`] in KEDA's namespace, named by the
//!   `ClusterTriggerAuthentication` [`TRIGGER_AUTHENTICATION`] that every child
//!   ScaledObject's pod-metrics trigger refers to;
//! - server and client certificates are issued again at two thirds of their lifetime. The
//!   gRPC server reads its certificate through a resolver over an in-memory cache
//!   ([`ScalerCerts`]) refreshed from the Secret, so a rotation needs no restart and no
//!   mounted file, and calls in flight keep their connection.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kedge_net::pki::{CertificateAuthority, Validity, cert_validity, renewal_due};
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use serde_json::json;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Secret in the hub namespace with the scaler CA, the server and the client certificate.
pub const TLS_SECRET: &str = "kedge-scaler-tls";
/// Secret in KEDA's namespace with what KEDA needs to call the scaler.
pub const CLIENT_SECRET: &str = "kedge-scaler-client";
/// The ClusterTriggerAuthentication KEDA calls the scaler with.
pub const TRIGGER_AUTHENTICATION: &str = "kedge-scaler";
/// Common Name of the scaler CA.
pub const CA_COMMON_NAME: &str = "kedge scaler CA";
/// Common Name of KEDA's client certificate.
pub const CLIENT_COMMON_NAME: &str = "keda-operator";
/// Lifetime of the scaler CA.
pub const CA_LIFETIME: time::Duration = time::Duration::days(3650);
/// How often the Secret is read again even when nothing is due (another hub may have
/// rotated it, or someone deleted it).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Wait after a failed attempt.
pub const RETRY: Duration = Duration::from_secs(10);

const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const SERVER_CRT: &str = "server.crt";
const SERVER_KEY: &str = "server.key";
const CLIENT_CRT: &str = "tls.crt";
const CLIENT_KEY: &str = "tls.key";
const FIELD_MANAGER: &str = "kedge-hub";

/// Where the certificates live and what they say.
#[derive(Debug, Clone)]
pub struct CertsConfig {
    /// The hub's namespace ([`TLS_SECRET`]).
    pub hub_namespace: String,
    /// KEDA's namespace ([`CLIENT_SECRET`]); KEDA reads a ClusterTriggerAuthentication's
    /// Secrets there (`KEDA_CLUSTER_OBJECT_NAMESPACE`, default `keda`).
    pub keda_namespace: String,
    /// DNS names and IP addresses of the server certificate: the host KEDA dials, first.
    pub names: Vec<String>,
    /// Lifetime of the server and client certificates.
    pub lifetime: Duration,
}

/// Why the scaler's certificates cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// The hub cluster refused or failed a request.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The failure.
        source: kube::Error,
    },
    /// A certificate could not be made or read.
    #[error("{0}")]
    Pki(String),
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CertsError {
    let what = what.into();
    move |source| CertsError::Kube { what, source }
}

fn pki(e: impl std::fmt::Display) -> CertsError {
    CertsError::Pki(e.to_string())
}

/// The PEM material of [`TLS_SECRET`].
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// Scaler CA certificate.
    pub ca_crt: String,
    /// Scaler CA key.
    pub ca_key: String,
    /// Server certificate.
    pub server_crt: String,
    /// Server key.
    pub server_key: String,
    /// KEDA's client certificate.
    pub client_crt: String,
    /// KEDA's client key.
    pub client_key: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material").finish_non_exhaustive()
    }
}

impl Material {
    fn from_secret(secret: &Secret) -> Result<Self, CertsError> {
        let data = secret.data.as_ref();
        let field = |key: &str| -> Result<String, CertsError> {
            let bytes = data.and_then(|d| d.get(key)).ok_or_else(|| {
                CertsError::Pki(format!(
                    "Secret {TLS_SECRET} has no {key:?}; delete it and the hub creates a new one"
                ))
            })?;
            String::from_utf8(bytes.0.clone()).map_err(|_| {
                CertsError::Pki(format!("Secret {TLS_SECRET}: {key:?} is not PEM text"))
            })
        };
        Ok(Self {
            ca_crt: field(CA_CRT)?,
            ca_key: field(CA_KEY)?,
            server_crt: field(SERVER_CRT)?,
            server_key: field(SERVER_KEY)?,
            client_crt: field(CLIENT_CRT)?,
            client_key: field(CLIENT_KEY)?,
        })
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    fn secret_data(&self) -> BTreeMap<String, ByteString> {
        Self::data(&[
            (CA_CRT, &self.ca_crt),
            (CA_KEY, &self.ca_key),
            (SERVER_CRT, &self.server_crt),
            (SERVER_KEY, &self.server_key),
            (CLIENT_CRT, &self.client_crt),
            (CLIENT_KEY, &self.client_key),
        ])
    }

    /// What KEDA gets: no CA key, no server key.
    fn client_data(&self) -> BTreeMap<String, ByteString> {
        Self::data(&[
            (CA_CRT, &self.ca_crt),
            (CLIENT_CRT, &self.client_crt),
            (CLIENT_KEY, &self.client_key),
        ])
    }

    /// New server and client certificates from `ca` at `now`.
    pub fn issue(
        ca: &CertificateAuthority,
        config: &CertsConfig,
        now: OffsetDateTime,
    ) -> Result<Self, CertsError> {
        let lifetime = time::Duration::try_from(config.lifetime).unwrap_or(CA_LIFETIME);
        let validity = Validity::issued(now, lifetime);
        let server = ca.issue_server(&config.names, validity).map_err(pki)?;
        let client = ca.issue_client(CLIENT_COMMON_NAME, validity).map_err(pki)?;
        Ok(Self {
            ca_crt: ca.cert_pem().to_owned(),
            ca_key: ca.key_pem().to_owned(),
            server_crt: server.cert_pem,
            server_key: server.key_pem,
            client_crt: client.cert_pem,
            client_key: client.key_pem,
        })
    }

    /// Everything new: a CA and its certificates.
    pub fn generate(config: &CertsConfig, now: OffsetDateTime) -> Result<Self, CertsError> {
        let ca =
            CertificateAuthority::generate(CA_COMMON_NAME, Validity::starting(now, CA_LIFETIME))
                .map_err(pki)?;
        Self::issue(&ca, config, now)
    }

    /// When the server certificate is due for renewal: at two thirds of its lifetime, or at
    /// once when it does not name what the hub is configured with.
    fn renewal_due(&self, config: &CertsConfig) -> Result<OffsetDateTime, CertsError> {
        let validity = cert_validity(&self.server_crt).map_err(pki)?;
        let names_match = server_names(&self.server_crt)
            .is_ok_and(|names| config.names.iter().all(|n| names.contains(n)));
        Ok(if names_match {
            renewal_due(validity.not_before, validity.not_after)
        } else {
            OffsetDateTime::UNIX_EPOCH
        })
    }
}

/// The DNS names and IP addresses a certificate names.
fn server_names(cert_pem: &str) -> Result<Vec<String>, CertsError> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(pki)?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).map_err(pki)?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => names.push((*d).to_owned()),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(names)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    verifier: Arc<dyn ClientCertVerifier>,
    ca_crt: String,
    server_crt: String,
}

/// The scaler's server certificate and client CA, as last read from [`TLS_SECRET`]: the
/// gRPC server's certificate resolver and client verifier. Nothing is served before the
/// first load (a handshake then fails, and KEDA retries).
#[derive(Debug, Default)]
pub struct ScalerCerts {
    loaded: RwLock<Option<Loaded>>,
}

impl ScalerCerts {
    /// Loads `material`: the new server certificate serves the next handshake.
    pub fn load(&self, material: &Material) -> Result<(), CertsError> {
        let mut guard = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        if let Some(current) = guard.as_ref()
            && current.server_crt == material.server_crt
            && current.ca_crt == material.ca_crt
        {
            return Ok(());
        }
        let chain = CertificateDer::pem_slice_iter(material.server_crt.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pki)?;
        let key = PrivateKeyDer::from_pem_slice(material.server_key.as_bytes()).map_err(pki)?;
        let provider = provider();
        let key = CertifiedKey::from_der(chain, key, &provider).map_err(pki)?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(material.ca_crt.as_bytes()) {
            roots.add(ca.map_err(pki)?).map_err(pki)?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(pki)?;
        *guard = Some(Loaded {
            key: Arc::new(key),
            verifier,
            ca_crt: material.ca_crt.clone(),
            server_crt: material.server_crt.clone(),
        });
        Ok(())
    }

    fn verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        let guard = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map(|l| l.verifier.clone())
    }

    /// The server configuration of the gRPC endpoint: certificate and client verification
    /// through this cache, HTTP/2 only.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, CertsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(pki)?
            .with_client_cert_verifier(self.clone())
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ScalerCerts {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let guard = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map(|l| l.key.clone())
    }
}

fn not_loaded() -> rustls::Error {
    rustls::Error::General("the scaler's certificates are not loaded yet".into())
}

impl ClientCertVerifier for ScalerCerts {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier()
            .ok_or_else(not_loaded)?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()
            .ok_or_else(not_loaded)?
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()
            .ok_or_else(not_loaded)?
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app.kubernetes.io/part-of".to_owned(), "kedge".to_owned())])
}

fn secret(name: &str, namespace: &str, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The `ClusterTriggerAuthentication` resource.
fn trigger_authentication_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ClusterTriggerAuthentication"),
        "clustertriggerauthentications",
    )
}

/// The ClusterTriggerAuthentication naming [`CLIENT_SECRET`]'s keys as KEDA's external
/// scaler parameters (`caCert`, `tlsClientCert`, `tlsClientKey`).
pub fn trigger_authentication() -> serde_json::Value {
    let target = |parameter: &str, key: &str| json!({"parameter": parameter, "name": CLIENT_SECRET, "key": key});
    json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ClusterTriggerAuthentication",
        "metadata": {"name": TRIGGER_AUTHENTICATION, "labels": labels()},
        "spec": {"secretTargetRef": [
            target("caCert", CA_CRT),
            target("tlsClientCert", CLIENT_CRT),
            target("tlsClientKey", CLIENT_KEY),
        ]},
    })
}

/// Reads [`TLS_SECRET`], creating or renewing what is missing or due at `now`, and brings
/// KEDA's Secret and ClusterTriggerAuthentication in line with it. Returns the material
/// and when it is next due.
pub async fn ensure(
    client: &Client,
    config: &CertsConfig,
    now: OffsetDateTime,
) -> Result<(Material, OffsetDateTime), CertsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.hub_namespace);
    let read = secrets
        .get_opt(TLS_SECRET)
        .await
        .map_err(kube_error(format!(
            "reading Secret {}/{TLS_SECRET}",
            config.hub_namespace
        )))?;
    let material = match read {
        None => {
            let material = Material::generate(config, now)?;
            let wanted = secret(TLS_SECRET, &config.hub_namespace, material.secret_data());
            match secrets.create(&PostParams::default(), &wanted).await {
                Ok(_) => {
                    info!(target: "kedge::audit", secret = TLS_SECRET, "created the external scaler's CA and certificates");
                    material
                }
                // Another hub created it first: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => Material::from_secret(
                    &secrets
                        .get(TLS_SECRET)
                        .await
                        .map_err(kube_error("reading the scaler Secret another hub created"))?,
                )?,
                Err(e) => return Err(kube_error(format!("creating Secret {TLS_SECRET}"))(e)),
            }
        }
        Some(current) => {
            let material = Material::from_secret(&current)?;
            if material.renewal_due(config)? <= now {
                let ca = CertificateAuthority::from_pem(&material.ca_crt, &material.ca_key).map_err(|e| {
                    CertsError::Pki(format!(
                        "Secret {TLS_SECRET}: the scaler CA cannot be read ({e}); delete the Secret \
                         and the hub creates a new one"
                    ))
                })?;
                let renewed = Material::issue(&ca, config, now)?;
                let mut wanted = secret(TLS_SECRET, &config.hub_namespace, renewed.secret_data());
                // Only over what was read: of two hubs renewing at once, one wins.
                wanted.metadata.resource_version = current.metadata.resource_version.clone();
                secrets
                    .replace(TLS_SECRET, &PostParams::default(), &wanted)
                    .await
                    .map_err(kube_error(format!("renewing Secret {TLS_SECRET}")))?;
                info!(target: "kedge::audit", secret = TLS_SECRET, "renewed the external scaler's certificates");
                renewed
            } else {
                material
            }
        }
    };
    let keda: Api<Secret> = Api::namespaced(client.clone(), &config.keda_namespace);
    let client_secret = secret(
        CLIENT_SECRET,
        &config.keda_namespace,
        material.client_data(),
    );
    let current = keda
        .get_opt(CLIENT_SECRET)
        .await
        .map_err(kube_error(format!(
            "reading Secret {}/{CLIENT_SECRET} (is KEDA's namespace {:?}? see --keda-namespace)",
            config.keda_namespace, config.keda_namespace
        )))?;
    if current.as_ref().and_then(|s| s.data.as_ref()) != client_secret.data.as_ref() {
        keda.patch(
            CLIENT_SECRET,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&client_secret),
        )
        .await
        .map_err(kube_error(format!(
            "writing Secret {}/{CLIENT_SECRET} (does KEDA's namespace exist? see --keda-namespace)",
            config.keda_namespace
        )))?;
        info!(target: "kedge::audit", namespace = %config.keda_namespace, secret = CLIENT_SECRET,
            "gave KEDA the external scaler's client certificate");
    }
    let auths: Api<DynamicObject> =
        Api::all_with(client.clone(), &trigger_authentication_resource());
    auths
        .patch(
            TRIGGER_AUTHENTICATION,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&trigger_authentication()),
        )
        .await
        .map_err(kube_error(format!(
            "applying ClusterTriggerAuthentication {TRIGGER_AUTHENTICATION} (is KEDA installed?)"
        )))?;
    let due = material.renewal_due(config)?;
    Ok((material, due))
}

/// Keeps the certificates current and `certs` loaded until `stop`: at start, when due, and
/// every [`RECHECK`].
pub async fn maintain(
    client: Client,
    config: CertsConfig,
    certs: Arc<ScalerCerts>,
    stop: CancellationToken,
) {
    loop {
        let now = OffsetDateTime::now_utc();
        let wait = match ensure(&client, &config, now).await {
            Ok((material, due)) => match certs.load(&material) {
                Ok(()) => std::time::Duration::try_from(due - OffsetDateTime::now_utc())
                    .unwrap_or(Duration::ZERO)
                    .clamp(Duration::from_millis(100), RECHECK),
                Err(error) => {
                    warn!(%error, "cannot load the external scaler's certificate; retrying");
                    RETRY
                }
            },
            Err(error) => {
                warn!(%error, "cannot keep the external scaler's certificates; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config(names: &[&str]) -> CertsConfig {
        CertsConfig {
            hub_namespace: "kedge-system".into(),
            keda_namespace: "keda".into(),
            names: names.iter().map(|s| (*s).to_owned()).collect(),
            lifetime: Duration::from_secs(3600),
        }
    }

    #[test]
    fn keda_gets_no_private_key_but_its_own() {
        let material =
            Material::generate(&config(&["localhost"]), OffsetDateTime::now_utc()).unwrap();
        let data = material.client_data();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            [CA_CRT, CLIENT_CRT, CLIENT_KEY]
        );
        let all = material.secret_data();
        let back = Material::from_secret(&secret(TLS_SECRET, "ns", all)).unwrap();
        assert!(back == material);
    }

    #[test]
    fn renewal_is_due_at_two_thirds_or_when_the_names_change() {
        let now = OffsetDateTime::now_utc();
        let material =
            Material::generate(&config(&["kedge-hub.kedge-system.svc", "127.0.0.1"]), now).unwrap();
        let due = material
            .renewal_due(&config(&["kedge-hub.kedge-system.svc", "127.0.0.1"]))
            .unwrap();
        assert!(
            due > now + time::Duration::minutes(30) && due < now + time::Duration::minutes(41),
            "{due}"
        );
        let renamed = material.renewal_due(&config(&["scaler.example"])).unwrap();
        assert!(renamed < now);
    }

    #[test]
    fn a_secret_missing_a_key_says_how_to_recover() {
        let mut data = Material::generate(&config(&["localhost"]), OffsetDateTime::now_utc())
            .unwrap()
            .secret_data();
        data.remove(SERVER_KEY);
        let err = Material::from_secret(&secret(TLS_SECRET, "ns", data)).unwrap_err();
        assert!(
            err.to_string()
                .contains("delete it and the hub creates a new one"),
            "{err}"
        );
    }

    #[test]
    fn the_resolver_serves_what_was_loaded_last() {
        let certs = Arc::new(ScalerCerts::default());
        assert!(certs.verifier().is_none());
        let first = Material::generate(&config(&["localhost"]), OffsetDateTime::now_utc()).unwrap();
        certs.load(&first).unwrap();
        let key = |c: &ScalerCerts| c.loaded.read().unwrap().as_ref().unwrap().key.cert[0].clone();
        let before = key(&certs);
        let ca = CertificateAuthority::from_pem(&first.ca_crt, &first.ca_key).unwrap();
        let renewed =
            Material::issue(&ca, &config(&["localhost"]), OffsetDateTime::now_utc()).unwrap();
        certs.load(&renewed).unwrap();
        assert_ne!(key(&certs), before);
        assert!(certs.server_config().is_ok());
    }
}
