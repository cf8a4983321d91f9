//! The hub's certificate authority, kept in the Secret `kedge-hub-ca` of the hub namespace,
//! and the hub's QUIC server certificate issued from it and renewed before it expires.
//!
//! The CA is created once: the first hub to start creates the Secret (create-if-absent); a
//! hub that loses that race reads the winner's. It is never regenerated while the Secret
//! exists: a Secret that cannot be read as a CA stops the hub with an error, because a new CA
//! would silently invalidate every member's certificate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kedge_net::pki::{CertificateAuthority, Validity, cert_validity, renewal_delay};
use kedge_net::tls::{self, TlsMaterial, TransportTuning};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{Error, Result};

/// Name of the Secret holding the hub CA in the hub namespace.
pub const CA_SECRET: &str = "kedge-hub-ca";
/// Key of the CA certificate (PEM) in [`CA_SECRET`].
pub const CA_CERT_KEY: &str = "tls.crt";
/// Key of the CA private key (PEM, PKCS#8) in [`CA_SECRET`].
pub const CA_KEY_KEY: &str = "tls.key";
/// Lifetime of a CA the hub creates.
pub const CA_LIFETIME: time::Duration = time::Duration::days(3650);
/// Common Name of a CA the hub creates.
pub const CA_COMMON_NAME: &str = "kedge hub CA";

/// The Secret that stores `ca` in `namespace`.
pub fn ca_secret(namespace: &str, ca: &CertificateAuthority) -> Secret {
    let data = BTreeMap::from([
        (
            CA_CERT_KEY.to_owned(),
            ByteString(ca.cert_pem().as_bytes().to_vec()),
        ),
        (
            CA_KEY_KEY.to_owned(),
            ByteString(ca.key_pem().as_bytes().to_vec()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_owned(),
                "kedge".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Reads the CA from its Secret; a missing key or unparseable PEM is an error, never a
/// reason to generate a new CA.
pub fn ca_from_secret(secret: &Secret) -> Result<CertificateAuthority> {
    let namespace = secret.metadata.namespace.clone().unwrap_or_default();
    let malformed = |reason: String| Error::CaSecret {
        namespace: namespace.clone(),
        reason,
    };
    let field = |key: &str| -> Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| malformed(format!("no data key {key:?}")))?;
        String::from_utf8(bytes.0.clone())
            .map_err(|_| malformed(format!("{key:?} is not UTF-8 PEM")))
    };
    let cert = field(CA_CERT_KEY)?;
    let key = field(CA_KEY_KEY)?;
    CertificateAuthority::from_pem(&cert, &key)
        .map_err(|e| malformed(format!("not a usable CA certificate and key: {e}")))
}

/// Returns the hub CA from the Secret [`CA_SECRET`] in `namespace`, creating it at `now` if
/// absent. Of concurrent creators exactly one wins; the others read its CA.
pub async fn load_or_create_ca(
    client: Client,
    namespace: &str,
    now: OffsetDateTime,
) -> Result<CertificateAuthority> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    if let Some(secret) = secrets.get_opt(CA_SECRET).await? {
        info!(target: "kedge::audit", %namespace, secret = CA_SECRET, "using the existing hub CA");
        return ca_from_secret(&secret);
    }
    let ca = CertificateAuthority::generate(CA_COMMON_NAME, Validity::starting(now, CA_LIFETIME))?;
    match secrets
        .create(&PostParams::default(), &ca_secret(namespace, &ca))
        .await
    {
        Ok(_) => {
            info!(target: "kedge::audit", %namespace, secret = CA_SECRET, "created the hub CA");
            Ok(ca)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Another hub created it between our read and our create: use that one.
            info!(target: "kedge::audit", %namespace, secret = CA_SECRET,
                "another hub created the CA first; using it");
            ca_from_secret(&secrets.get(CA_SECRET).await?)
        }
        Err(e) => Err(e.into()),
    }
}

/// DNS names and IP addresses the hub's server certificate carries, and its lifetime.
#[derive(Debug, Clone)]
pub struct ServerCertConfig {
    /// DNS names and IP addresses (as strings) of the certificate.
    pub names: Vec<String>,
    /// Lifetime of each server certificate; renewed at two thirds of it.
    pub lifetime: Duration,
    /// The QUIC transport of the hub's sessions.
    pub transport: TransportTuning,
}

/// Issues a server certificate from `ca` at `now`; returns the TLS material (trusting `ca`
/// for client certificates) and the certificate's validity.
pub fn server_material(
    ca: &CertificateAuthority,
    config: &ServerCertConfig,
    now: OffsetDateTime,
) -> Result<(TlsMaterial, Validity)> {
    let lifetime = time::Duration::try_from(config.lifetime).unwrap_or(CA_LIFETIME);
    let issued = ca.issue_server(&config.names, Validity::issued(now, lifetime))?;
    let validity = cert_validity(&issued.cert_pem)?;
    let material = TlsMaterial::from_pem(&issued.cert_pem, &issued.key_pem, ca.cert_pem())?;
    Ok((material, validity))
}

/// The key of the hub's address tokens in CA-Secret mode: the CA's key is what every replica
/// and every restart shares (the server certificate is issued anew each time). Made once per
/// process and handed to every renewal, with its log of the tokens used.
pub fn address_tokens(ca: &CertificateAuthority) -> tls::AddressTokens {
    tls::AddressTokens::derive(ca.key_pem().as_bytes())
}

/// Renews the hub's server certificate at two thirds of each certificate's lifetime, until
/// `stop`. The new configuration applies to new connections only: sessions stay up. It seals
/// address tokens with `tokens`, as the configuration it replaces did.
pub async fn renew_server_cert(
    endpoint: quinn::Endpoint,
    ca: Arc<CertificateAuthority>,
    config: ServerCertConfig,
    tokens: tls::AddressTokens,
    mut current: Validity,
    stop: CancellationToken,
) {
    loop {
        let wait = renewal_delay(
            current.not_before,
            current.not_after,
            OffsetDateTime::now_utc(),
        );
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let renewed = server_material(&ca, &config, OffsetDateTime::now_utc()).and_then(
            |(material, validity)| {
                let server = tls::enrolling_server_config(material, config.transport, &tokens)?;
                Ok((server, validity))
            },
        );
        match renewed {
            Ok((server, validity)) => {
                endpoint.set_server_config(Some(server));
                current = validity;
                info!(target: "kedge::audit", not_after = %validity.not_after,
                    "renewed the hub server certificate");
            }
            Err(error) => {
                warn!(%error, "cannot renew the hub server certificate; retrying in 10s");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn a_ca_round_trips_through_its_secret() {
        let ca =
            CertificateAuthority::generate("t", Validity::starting(now(), CA_LIFETIME)).unwrap();
        let secret = ca_secret("hub-ns", &ca);
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let again = ca_from_secret(&secret).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
    }

    #[test]
    fn a_malformed_ca_secret_is_an_error_naming_what_is_wrong() {
        let ca =
            CertificateAuthority::generate("t", Validity::starting(now(), CA_LIFETIME)).unwrap();
        let mut missing = ca_secret("ns", &ca);
        missing.data.as_mut().unwrap().remove(CA_KEY_KEY);
        let err = ca_from_secret(&missing).unwrap_err().to_string();
        assert!(err.contains("no data key \"tls.key\""), "{err}");
        let mut garbage = ca_secret("ns", &ca);
        garbage
            .data
            .as_mut()
            .unwrap()
            .insert(CA_CERT_KEY.into(), ByteString(b"garbage".to_vec()));
        let err = ca_from_secret(&garbage).unwrap_err().to_string();
        assert!(
            err.contains("kedge-hub-ca") && err.contains("not a usable CA"),
            "{err}"
        );
    }

    #[test]
    fn the_server_certificate_carries_the_configured_names_and_lifetime() {
        let t = now();
        let ca = CertificateAuthority::generate("t", Validity::starting(t, CA_LIFETIME)).unwrap();
        let config = ServerCertConfig {
            names: vec!["kedge-hub.ns.svc".into(), "10.0.0.7".into()],
            lifetime: Duration::from_secs(3600),
            transport: TransportTuning::default(),
        };
        let (material, validity) = server_material(&ca, &config, t).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(material.chain[0].as_ref()).unwrap();
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            sans,
            ["DNSName(kedge-hub.ns.svc)", "IPAddress(0a:00:00:07)"]
        );
        assert!(
            (validity.not_after - (t + time::Duration::hours(1))).abs()
                <= time::Duration::seconds(1)
        );
        // Renewal is due 40 minutes in, counted from the clock-skew margin before `t`.
        let due = renewal_delay(validity.not_before, validity.not_after, t);
        assert!(
            due > Duration::from_secs(39 * 60) && due < Duration::from_secs(40 * 60),
            "{due:?}"
        );
    }
}
