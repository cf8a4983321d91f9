//! The member identity: the Common Name of the client certificate, never a message field.

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
            return Err(Error::Identity(format!(
                "certificate for {member:?} is bound to member {named:?}"
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
    let (_, cert) = X509Certificate::from_der(leaf.as_ref())
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
    Ok(PeerIdentity {
        member,
        not_after_unix: cert.validity().not_after.timestamp(),
        serial: cert.raw_serial_as_string(),
        enrollment_uid,
    })
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
        for bad in [
            vec!["urn:kedge:member:edge-2:abc"],
            vec!["urn:kedge:member:edge-1:"],
            vec!["urn:kedge:member:edge-1"],
            vec!["urn:kedge:member:edge-1:a b"],
            vec!["urn:kedge:member:edge-1:a", "urn:kedge:member:edge-1:b"],
        ] {
            assert!(enrollment_uid("edge-1", bad.into_iter()).is_err());
        }
    }

    #[test]
    fn garbage_certificates_are_errors() {
        assert!(peer_identity(&[]).is_err());
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02, 0x03]);
        let err = peer_identity(&[junk]).unwrap_err();
        assert!(err.to_string().contains("unparseable"), "{err}");
    }
}
