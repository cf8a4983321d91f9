//! The member identity: the Common Name of the client certificate, never a message field,
//! and the URI SAN `urn:kedge:member:<member>:<uid>` that binds an enrolled certificate to
//! one `MemberCluster`. This is the one place that writes and reads both.

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::{Error, Result};

/// What the hub knows about a peer from its verified certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The member name (certificate Common Name).
    pub member: String,
    /// Certificate expiry, Unix seconds.
    pub not_after_unix: i64,
    /// Certificate serial number, hex, for revocation and logs.
    pub serial: String,
    /// The `metadata.uid` of the `MemberCluster` the certificate was enrolled for, from its
    /// URI SAN `urn:kedge:member:<member>:<uid>`; `None` for certificates not issued by
    /// enrollment (`kubectl kedge dev-certs`, an external CA).
    pub enrollment_uid: Option<String>,
}

/// Prefix of the URI SAN that binds an enrolled certificate to one `MemberCluster` object.
pub const ENROLLMENT_URI_PREFIX: &str = "urn:kedge:member:";

/// The URI SAN of a certificate enrolled as `member` for the `MemberCluster` with `uid`.
pub fn enrollment_uri(member: &str, uid: &str) -> String {
    format!("{ENROLLMENT_URI_PREFIX}{member}:{uid}")
}

/// The enrollment uid from the URI SANs `uris`: `Ok(None)` without one; an error for a
/// binding to another member, a malformed one or more than one.
fn enrollment_uid<'a>(member: &str, uris: impl Iterator<Item = &'a str>) -> Result<Option<String>> {
    let mut found = None;
    for uri in uris {
        let Some(rest) = uri.strip_prefix(ENROLLMENT_URI_PREFIX) else {
            continue;
        };
        let (named, uid) = rest.split_once(':').unwrap_or((rest, ""));
        if named != member {
            // A peer's text is repeated only when it is a (short, plain) member name.
            let named = if is_valid_member_name(named) {
                format!("member {named:?}")
            } else {
                "a malformed member name".to_owned()
            };
            return Err(Error::Identity(format!(
                "certificate for {member:?} is bound to {named}"
            )));
        }
        let well_formed = !uid.is_empty()
            && uid.len() <= 64
            && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !well_formed || found.is_some() {
            return Err(Error::Identity(format!(
                "certificate for {member:?} has a malformed or repeated {ENROLLMENT_URI_PREFIX} URI"
            )));
        }
        found = Some(uid.to_owned());
    }
    Ok(found)
}

/// Whether `name` is a valid member name: an RFC 1123 DNS label, like a Kubernetes object name.
pub fn is_valid_member_name(name: &str) -> bool {
    kedge_protocol::is_dns1123_label(name)
}

/// Reads the member identity from the leaf of a verified client certificate chain.
pub fn peer_identity(chain: &[CertificateDer<'_>]) -> Result<PeerIdentity> {
    let leaf = chain
        .first()
        .ok_or_else(|| Error::Identity("no client certificate".into()))?;
    PeerIdentity::from_der(leaf.as_ref())
}

impl PeerIdentity {
    /// Reads the member identity of a DER certificate: its Common Name must be a member name,
    /// and an enrollment URI SAN, if any, must name that member and one well-formed uid.
    pub fn from_der(der: &[u8]) -> Result<Self> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| Error::Identity(format!("unparseable certificate: {e}")))?;
        let member = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or_else(|| Error::Identity("certificate has no Common Name".into()))?
            .to_owned();
        if !is_valid_member_name(&member) {
            return Err(Error::Identity(format!(
                "Common Name {member:?} is not a valid member name (lowercase RFC 1123 label)"
            )));
        }
        let san = cert
            .subject_alternative_name()
            .map_err(|e| Error::Identity(format!("unparseable subjectAltName: {e}")))?;
        let uris = san.iter().flat_map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::URI(uri) => Some(*uri),
                    _ => None,
                })
        });
        let enrollment_uid = enrollment_uid(&member, uris)?;
        Ok(Self {
            member,
            not_after_unix: cert.validity().not_after.timestamp(),
            serial: cert.raw_serial_as_string(),
            enrollment_uid,
        })
    }

    /// Reads the member identity of the first certificate of a PEM text.
    pub fn from_pem(pem: &str) -> Result<Self> {
        use rustls_pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| Error::Identity(format!("not a PEM certificate: {e}")))?;
        Self::from_der(der.as_ref())
    }
}

/// The Common Name of the leaf certificate a quinn connection's peer presented (verified by
/// the TLS handshake), if any.
pub fn connection_common_name(connection: &quinn::Connection) -> Option<String> {
    let chain = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())?;
    let (_, cert) = X509Certificate::from_der(chain.first()?.as_ref()).ok()?;
    let name = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(name.to_owned())
}

/// Extracts the identity of a quinn connection's peer, if it presented a certificate.
pub fn connection_identity(connection: &quinn::Connection) -> Result<PeerIdentity> {
    let chain = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or_else(|| Error::Identity("peer presented no certificate".into()))?;
    peer_identity(&chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_follow_rfc1123_labels() {
        for ok in ["a", "member-1", "edge-eu-west-3", "x1"] {
            assert!(is_valid_member_name(ok), "{ok}");
        }
        let too_long = "a".repeat(64);
        for bad in ["", "-a", "a-", "Member", "a.b", "a_b", too_long.as_str()] {
            assert!(!is_valid_member_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_enrollment_uri_binds_one_member_and_one_uid() {
        let uri = enrollment_uri("edge-1", "3f1c-99");
        assert_eq!(
            enrollment_uid("edge-1", [uri.as_str()].into_iter()).unwrap(),
            Some("3f1c-99".into())
        );
        assert_eq!(
            enrollment_uid("edge-1", ["https://example.com"].into_iter()).unwrap(),
            None
        );
        // Another scheme or namespace is not an enrollment binding: ignored.
        for other in [
            "urn:kedge:members:edge-1:abc",
            "URN:KEDGE:MEMBER:edge-1:abc",
            "kedge://edge-1/abc",
            "urn:kedge:member",
            "",
        ] {
            assert_eq!(enrollment_uid("edge-1", [other].into_iter()).unwrap(), None);
        }
        let long_uid = format!("urn:kedge:member:edge-1:{}", "a".repeat(65));
        let huge = format!("urn:kedge:member:{}", "x".repeat(1 << 20));
        for bad in [
            vec!["urn:kedge:member:edge-2:abc"],
            vec!["urn:kedge:member:edge-1:"],
            vec!["urn:kedge:member:edge-1"],
            vec!["urn:kedge:member::abc"],
            vec!["urn:kedge:member:edge-1:a b"],
            vec!["urn:kedge:member:edge-1:a:b"],
            vec!["urn:kedge:member:edge-1:a", "urn:kedge:member:edge-1:b"],
            vec!["urn:kedge:member:edge-1:a", "urn:kedge:member:edge-1:a"],
            vec![long_uid.as_str()],
            vec![huge.as_str()],
        ] {
            let error = enrollment_uid("edge-1", bad.clone().into_iter()).unwrap_err();
            assert!(error.to_string().contains("edge-1"), "{bad:?}: {error}");
        }
        // A uid of the longest allowed length still binds.
        let longest = enrollment_uri("edge-1", &"a".repeat(64));
        assert!(enrollment_uid("edge-1", [longest.as_str()].into_iter()).is_ok());
    }

    #[test]
    fn garbage_certificates_are_errors() {
        assert!(peer_identity(&[]).is_err());
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02, 0x03]);
        let err = peer_identity(&[junk]).unwrap_err();
        assert!(err.to_string().contains("unparseable"), "{err}");
        for junk in [&[][..], &[0x30], &[0x30, 0x82, 0xff, 0xff], &[0xff; 64]] {
            assert!(PeerIdentity::from_der(junk).is_err(), "{junk:?}");
        }
        for pem in [
            "",
            "garbage",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            assert!(PeerIdentity::from_pem(pem).is_err(), "{pem:?}");
        }
    }
}
