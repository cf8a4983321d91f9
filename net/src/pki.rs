//! Certificates for the hub and its members, issued by the hub's CA with rcgen.
//!
//! Member certificates carry the member name as Common Name and only the `clientAuth` extended
//! key usage; hub certificates carry the hub's DNS names/IPs and only `serverAuth`, so neither
//! can stand in for the other.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use rustls_pki_types::CertificateSigningRequestDer;
use time::{Duration, OffsetDateTime};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::identity::{enrollment_uri, is_valid_member_name};
use crate::{Error, Result};

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The validity window of a certificate to issue.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// Valid from shortly before `now` (clock skew: a tenth of the lifetime, at most a
    /// minute, so that renewal at two thirds of the window stays close to two thirds of the
    /// time the holder actually has) for `lifetime`.
    pub fn issued(now: OffsetDateTime, lifetime: Duration) -> Self {
        let skew = (lifetime / 10_i32).clamp(Duration::ZERO, Duration::minutes(1));
        Self {
            not_before: now - skew,
            not_after: now + lifetime,
        }
    }

    /// Valid from a minute before `now` (clock skew) for `lifetime`.
    pub fn starting(now: OffsetDateTime, lifetime: Duration) -> Self {
        Self {
            not_before: now - Duration::minutes(1),
            not_after: now + lifetime,
        }
    }
}

/// The hub's certificate authority.
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

fn serial(now: OffsetDateTime, salt: &str) -> SerialNumber {
    // Unique enough for a private CA: issue time in nanoseconds plus a digest of the subject.
    let mut bytes = now.unix_timestamp_nanos().to_be_bytes().to_vec();
    let digest = salt.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    bytes.extend_from_slice(&digest.to_be_bytes());
    // Positive, as RFC 5280 requires.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// What every member certificate says: CN = the member, O = `kedge:members`, signing only,
/// `clientAuth` only (it cannot serve as the hub), with the issuer's key identifier.
fn member_params(member: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, member);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "kedge:members");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params
}

impl CertificateAuthority {
    /// Generates a new self-signed CA.
    pub fn generate(common_name: &str, validity: Validity) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "kedge");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.serial_number = Some(serial(validity.not_before, common_name));
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem,
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its PEM certificate and key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let issuer = Issuer::from_ca_cert_pem(cert_pem, KeyPair::from_pem(key_pem)?)?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }

    /// The CA certificate (the bundle agents verify the hub against).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues the hub's server certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, names: &[String], validity: Validity) -> Result<IssuedCert> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kedge-hub");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        self.issue(params, validity, "kedge-hub")
    }

    /// Issues a client certificate with a fresh key for a client that is not a member, such
    /// as KEDA calling the hub's external scaler: CN = `common_name`, `clientAuth` only.
    pub fn issue_client(&self, common_name: &str, validity: Validity) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        self.issue(params, validity, common_name)
    }

    /// Issues a member's client certificate with a fresh key (development and tests; in
    /// production the agent generates its key and sends a CSR).
    pub fn issue_member(&self, member: &str, validity: Validity) -> Result<IssuedCert> {
        if !is_valid_member_name(member) {
            return Err(Error::Identity(format!(
                "{member:?} is not a valid member name (lowercase RFC 1123 label)"
            )));
        }
        self.issue(member_params(member), validity, member)
    }

    /// Issues a member's client certificate for the public key of `csr`, whose Common Name
    /// must be `member`. Everything else in the request is ignored: the certificate carries
    /// CN = `member`, the `clientAuth` extended key usage and exactly one URI SAN,
    /// [`enrollment_uri`]`(member, uid)`.
    pub fn issue_member_csr(
        &self,
        csr: &Csr,
        member: &str,
        uid: &str,
        validity: Validity,
    ) -> Result<String, CsrError> {
        csr.check_member(member)?;
        let invalid = |e: rcgen::Error| CsrError::Invalid(e.to_string());
        let mut params = member_params(member);
        params.subject_alt_names = vec![SanType::URI(
            enrollment_uri(member, uid).try_into().map_err(invalid)?,
        )];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.serial_number = Some(serial(OffsetDateTime::now_utc(), member));
        let signed = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key.clone(),
        }
        .signed_by(&self.issuer)
        .map_err(invalid)?;
        Ok(signed.pem())
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        validity: Validity,
        subject: &str,
    ) -> Result<IssuedCert> {
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.serial_number = Some(serial(OffsetDateTime::now_utc(), subject));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Why a certificate signing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// Not a parseable PKCS#10 request, or its signature does not verify.
    #[error("not a valid PKCS#10 request: {0}")]
    Invalid(String),
    /// The request's Common Name is not the member it is for.
    #[error("the request names {requested:?}, not {expected:?}")]
    NameMismatch {
        /// The Common Name in the request.
        requested: String,
        /// The member the token or session belongs to.
        expected: String,
    },
}

/// Longest Common Name a request may carry (RFC 5280's `ub-common-name`); member names are
/// shorter still, and a longer one is never repeated in an error.
pub const MAX_COMMON_NAME: usize = 64;

/// A PKCS#10 certificate signing request whose self-signature verified: what the hub reads
/// of an agent's request, its one Common Name and its public key. The hub parses a request
/// once, checks it, and issues from what it parsed.
#[derive(Debug, Clone)]
pub struct Csr {
    common_name: String,
    public_key: rcgen::PublicKey,
}

impl Csr {
    /// Parses a DER request: one request and nothing after it, a signature that verifies
    /// with its own key, and exactly one Common Name.
    pub fn parse(der: &[u8]) -> Result<Self, CsrError> {
        let (rest, csr) = X509CertificationRequest::from_der(der)
            .map_err(|e| CsrError::Invalid(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CsrError::Invalid("trailing bytes after the request".into()));
        }
        csr.verify_signature()
            .map_err(|e| CsrError::Invalid(format!("bad signature: {e}")))?;
        let subject = &csr.certification_request_info.subject;
        let mut names = subject.iter_common_name();
        let common_name = names
            .next()
            .ok_or_else(|| CsrError::Invalid("no Common Name".into()))?
            .as_str()
            .map_err(|e| CsrError::Invalid(format!("unreadable Common Name: {e}")))?
            .to_owned();
        if names.next().is_some() {
            return Err(CsrError::Invalid("more than one Common Name".into()));
        }
        if common_name.len() > MAX_COMMON_NAME {
            return Err(CsrError::Invalid(format!(
                "the Common Name is longer than {MAX_COMMON_NAME} bytes"
            )));
        }
        let public_key =
            CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(der))
                .map_err(|e| CsrError::Invalid(e.to_string()))?
                .public_key;
        Ok(Self {
            common_name,
            public_key,
        })
    }

    /// The request's Common Name: the member it asks a certificate for.
    pub fn common_name(&self) -> &str {
        &self.common_name
    }

    /// Refuses a request whose Common Name is not `member`.
    pub fn check_member(&self, member: &str) -> Result<(), CsrError> {
        if self.common_name != member {
            return Err(CsrError::NameMismatch {
                requested: self.common_name.clone(),
                expected: member.to_owned(),
            });
        }
        Ok(())
    }
}

/// A fresh ECDSA P-256 key pair and a PKCS#10 request for `member` (the agent's side of
/// enrollment and renewal). Returns the key (PEM, PKCS#8) and the request (DER).
pub fn member_csr(member: &str) -> Result<(String, Vec<u8>)> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, member);
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

/// When to renew a certificate valid from `not_before` to `not_after`: at two thirds of its
/// lifetime, so a failed attempt leaves a third of it for retries.
pub fn renewal_due(not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    let lifetime = (not_after - not_before).max(Duration::ZERO);
    not_before + lifetime * 2 / 3
}

/// How long to wait before renewing, seen at `now` (zero when already due).
pub fn renewal_delay(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> std::time::Duration {
    let left = renewal_due(not_before, not_after) - now;
    std::time::Duration::try_from(left).unwrap_or(std::time::Duration::ZERO)
}

/// Validity window of a PEM certificate (the first one), for renewal planning.
pub fn cert_validity(cert_pem: &str) -> Result<Validity> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| Error::Pem {
        path: "certificate".into(),
        reason: e.to_string(),
    })?;
    let (_, cert) =
        x509_parser::prelude::X509Certificate::from_der(der.as_ref()).map_err(|e| Error::Pem {
            path: "certificate".into(),
            reason: e.to_string(),
        })?;
    Ok(Validity {
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
    })
}

/// File names of a development PKI laid out in one directory by [`write_dev_pki`].
#[derive(Debug, Clone)]
pub struct DevPkiPaths {
    /// Directory holding everything.
    pub dir: PathBuf,
}

impl DevPkiPaths {
    /// CA certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    /// CA key.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca-key.pem")
    }
    /// Hub server certificate.
    pub fn hub_cert(&self) -> PathBuf {
        self.dir.join("hub.pem")
    }
    /// Hub server key.
    pub fn hub_key(&self) -> PathBuf {
        self.dir.join("hub-key.pem")
    }
    /// A member's client certificate.
    pub fn member_cert(&self, member: &str) -> PathBuf {
        self.dir.join(format!("member-{member}.pem"))
    }
    /// A member's client key.
    pub fn member_key(&self, member: &str) -> PathBuf {
        self.dir.join(format!("member-{member}-key.pem"))
    }
}

/// Writes a file readable only by its owner (mode 0600 on Unix: private keys), atomically:
/// see [`write_atomic`].
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    write_atomic(path, contents.as_bytes(), 0o600)
}

fn write_public(path: &Path, contents: &str) -> Result<()> {
    write_atomic(path, contents.as_bytes(), 0o644)
}

/// Writes `contents` to `path` so that the file is either its old self or complete, never
/// half-written or briefly readable by others: into a new temporary file in the same
/// directory, created with `mode` (Unix) and never through an existing path or link, synced,
/// then renamed over `path`. A symbolic link at `path` is replaced, not followed.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);

    let to_err = |source| Error::WriteFile {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        to_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file path",
        ))
    })?;
    let temp = dir.join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let mut options = fs::OpenOptions::new();
    // `create_new` fails on any existing entry, a symbolic link included.
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let written = options.open(&temp).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()
    });
    let renamed = written.and_then(|()| fs::rename(&temp, path));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&temp);
        return Err(to_err(e));
    }
    // Make the rename itself durable (best effort: not every platform syncs directories).
    if let Ok(dir) = fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Creates `dir` (and missing parents) with mode 0700 on Unix, so that only its owner can
/// list or reach the keys in it. An existing directory is kept as it is.
fn create_private_dir(dir: &Path) -> Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| Error::WriteFile {
        path: dir.to_owned(),
        source,
    })
}

/// Creates (or reuses) a CA in `dir` and issues a hub certificate for `hub_names` and a
/// client certificate per member. Existing CA files are reused so that re-running adds
/// members without invalidating certificates already handed out. A new `dir` is created
/// 0700; keys are written 0600 with [`write_atomic`].
pub fn write_dev_pki(
    dir: &Path,
    hub_names: &[String],
    members: &[String],
    lifetime: Duration,
) -> Result<DevPkiPaths> {
    create_private_dir(dir)?;
    let paths = DevPkiPaths {
        dir: dir.to_owned(),
    };
    let now = OffsetDateTime::now_utc();
    let ca = match (
        fs::read_to_string(paths.ca_cert()),
        fs::read_to_string(paths.ca_key()),
    ) {
        (Ok(cert), Ok(key)) => CertificateAuthority::from_pem(&cert, &key)?,
        _ => {
            let ca = CertificateAuthority::generate(
                "kedge development CA",
                Validity::starting(now, Duration::days(3650)),
            )?;
            write_public(&paths.ca_cert(), ca.cert_pem())?;
            write_private(&paths.ca_key(), ca.key_pem())?;
            ca
        }
    };
    let hub = ca.issue_server(hub_names, Validity::starting(now, lifetime))?;
    write_public(&paths.hub_cert(), &hub.cert_pem)?;
    write_private(&paths.hub_key(), &hub.key_pem)?;
    for member in members {
        let issued = ca.issue_member(member, Validity::starting(now, lifetime))?;
        write_public(&paths.member_cert(member), &issued.cert_pem)?;
        write_private(&paths.member_key(member), &issued.key_pem)?;
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::peer_identity;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn member_certificates_carry_the_member_name() {
        let now = OffsetDateTime::now_utc();
        let ca =
            CertificateAuthority::generate("test CA", Validity::starting(now, Duration::days(1)))
                .unwrap();
        let issued = ca
            .issue_member("edge-1", Validity::starting(now, Duration::hours(2)))
            .unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let id = peer_identity(&[der]).unwrap();
        assert_eq!(id.member, "edge-1");
        assert!((id.not_after_unix - (now + Duration::hours(2)).unix_timestamp()).abs() <= 1);
    }

    #[test]
    fn invalid_member_names_are_refused() {
        let now = OffsetDateTime::now_utc();
        let ca =
            CertificateAuthority::generate("test CA", Validity::starting(now, Duration::days(1)))
                .unwrap();
        let err = ca
            .issue_member("Bad_Name", Validity::starting(now, Duration::hours(1)))
            .unwrap_err();
        assert!(err.to_string().contains("not a valid member name"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn dev_keys_are_private_atomic_and_never_written_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("new").join("pki");
        // A link planted where the hub key goes must not redirect the key elsewhere.
        let elsewhere = root.path().join("elsewhere");
        fs::write(&elsewhere, "untouched").unwrap();
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("hub-key.pem")).unwrap();
        let paths = write_dev_pki(
            &dir,
            &["localhost".into()],
            &["edge-1".into()],
            Duration::hours(1),
        )
        .unwrap();
        assert_eq!(fs::read_to_string(&elsewhere).unwrap(), "untouched");
        assert!(
            !fs::symlink_metadata(paths.hub_key())
                .unwrap()
                .file_type()
                .is_symlink()
        );
        for key in [paths.ca_key(), paths.hub_key(), paths.member_key("edge-1")] {
            assert_eq!(mode(&key), 0o600, "{}", key.display());
            assert!(fs::read_to_string(&key).unwrap().contains("PRIVATE KEY"));
        }
        assert_eq!(mode(&paths.ca_cert()), 0o644);
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        // A directory it creates is the owner's alone.
        let fresh = root.path().join("fresh");
        write_dev_pki(&fresh, &["localhost".into()], &[], Duration::hours(1)).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        // Rewriting replaces the file whole, keeping the mode.
        write_private(&paths.hub_key(), "new").unwrap();
        assert_eq!(fs::read_to_string(paths.hub_key()).unwrap(), "new");
        assert_eq!(mode(&paths.hub_key()), 0o600);
    }

    #[test]
    fn a_ca_round_trips_through_pem() {
        let now = OffsetDateTime::now_utc();
        let ca =
            CertificateAuthority::generate("test CA", Validity::starting(now, Duration::days(1)))
                .unwrap();
        let again = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        again
            .issue_server(
                &["localhost".into()],
                Validity::starting(now, Duration::hours(1)),
            )
            .unwrap();
        assert!(CertificateAuthority::from_pem("garbage", "garbage").is_err());
    }

    #[test]
    fn a_csr_becomes_a_member_certificate_with_one_uri() {
        let now = OffsetDateTime::now_utc();
        let ca =
            CertificateAuthority::generate("test CA", Validity::starting(now, Duration::days(1)))
                .unwrap();
        let (_key, csr) = member_csr("edge-1").unwrap();
        let csr = Csr::parse(&csr).unwrap();
        assert_eq!(csr.common_name(), "edge-1");
        let pem = ca
            .issue_member_csr(
                &csr,
                "edge-1",
                "uid-1",
                Validity::starting(now, Duration::hours(24)),
            )
            .unwrap();
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(
            peer_identity(std::slice::from_ref(&der)).unwrap().member,
            "edge-1"
        );
        let (_, cert) = x509_parser::prelude::X509Certificate::from_der(der.as_ref()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let uris: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(uris, ["URI(urn:kedge:member:edge-1:uid-1)"]);
        let eku = cert.extended_key_usage().unwrap().unwrap();
        assert!(eku.value.client_auth && !eku.value.server_auth);
        let validity = cert_validity(&pem).unwrap();
        assert!((validity.not_after - (now + Duration::hours(24))).abs() <= Duration::seconds(1));
    }

    #[test]
    fn a_csr_for_another_member_or_garbage_is_refused() {
        let now = OffsetDateTime::now_utc();
        let ca =
            CertificateAuthority::generate("test CA", Validity::starting(now, Duration::days(1)))
                .unwrap();
        let validity = Validity::starting(now, Duration::hours(1));
        let (_key, csr) = member_csr("edge-2").unwrap();
        let err = ca
            .issue_member_csr(&Csr::parse(&csr).unwrap(), "edge-1", "u", validity)
            .unwrap_err();
        assert_eq!(
            err,
            CsrError::NameMismatch {
                requested: "edge-2".into(),
                expected: "edge-1".into()
            }
        );
        let mut trailing = csr.clone();
        trailing.push(0);
        for junk in [
            &[][..],
            &[0x30][..],
            &[0x30, 0x03, 0x01, 0x02, 0x03],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0xff; 256],
            &csr[..csr.len() - 1],
            &trailing,
        ] {
            let err = Csr::parse(junk).unwrap_err();
            assert!(matches!(err, CsrError::Invalid(_)), "{err}");
        }
        // A flipped bit in the signed part breaks the signature.
        let mut tampered = csr.clone();
        let mid = tampered.len() / 2;
        tampered[mid] ^= 0x01;
        assert!(Csr::parse(&tampered).is_err());
    }

    /// A request signed by `key` with the subject `name`.
    fn request(name: DistinguishedName) -> Vec<u8> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = name;
        params.serialize_request(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_csr_needs_one_short_common_name() {
        let err = Csr::parse(&request(DistinguishedName::new())).unwrap_err();
        assert_eq!(err, CsrError::Invalid("no Common Name".into()));
        let mut long = DistinguishedName::new();
        long.push(DnType::CommonName, "a".repeat(MAX_COMMON_NAME + 1));
        let err = Csr::parse(&request(long)).unwrap_err();
        assert!(err.to_string().contains("longer than 64"), "{err}");
        // Only the Common Name counts: other attributes are ignored.
        let mut other = DistinguishedName::new();
        other.push(DnType::CommonName, "edge-1");
        other.push(DnType::OrganizationName, "system:masters");
        let csr = Csr::parse(&request(other)).unwrap();
        assert_eq!(csr.common_name(), "edge-1");
        assert!(csr.check_member("edge-1").is_ok());
    }

    #[test]
    fn short_certificates_are_backdated_a_tenth_of_their_lifetime() {
        let now = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let short = Validity::issued(now, Duration::seconds(20));
        assert_eq!(short.not_before, now - Duration::seconds(2));
        // Renewal comes at 12.67 s of the 20 s the holder has.
        let delay = renewal_delay(short.not_before, short.not_after, now);
        assert_eq!(delay.as_millis(), 12_666, "{delay:?}");
        let long = Validity::issued(now, Duration::days(1));
        assert_eq!(long.not_before, now - Duration::minutes(1));
    }

    #[test]
    fn renewal_is_due_at_two_thirds_of_the_lifetime() {
        let start = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let end = start + Duration::seconds(30);
        assert_eq!(renewal_due(start, end), start + Duration::seconds(20));
        assert_eq!(
            renewal_delay(start, end, start),
            std::time::Duration::from_secs(20)
        );
        assert_eq!(
            renewal_delay(start, end, start + Duration::seconds(19)),
            std::time::Duration::from_secs(1)
        );
        assert_eq!(
            renewal_delay(start, end, start + Duration::seconds(25)),
            std::time::Duration::ZERO
        );
        // A backwards window is due at once rather than never.
        assert_eq!(renewal_due(end, start), end);
    }
}
