//! The CA of a state directory, which every sandbox trusts: made once (its key owner-only),
//! it signs the leaf the proxy shows for a name it intercepts (`network.rules`), one leaf
//! per name, kept.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's files in the state directory.
const CERT_FILE: &str = "ca.pem";
const KEY_FILE: &str = "ca.key";

/// Leaves kept at most (one per intercepted name; past this the cache starts over).
const MAX_LEAVES: usize = 1024;

/// The CA and the leaves it made.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    der: CertificateDer<'static>,
    /// One key for every leaf of this run: minting a leaf is then one signature.
    leaf_key: KeyPair,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// The CA's identity, the same every run: a leaf names its issuer by it (and by the
/// key's identifier), so a CA loaded from its files signs leaves its certificate verifies.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "e2b-local sandbox egress CA");
    name.push(DnType::OrganizationName, "e2b-local");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl Ca {
    /// Loads the CA of `dir`, or makes it there (key file mode 0600).
    pub(crate) fn open(dir: &Path) -> Result<Ca, String> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        let fail = |what: &str, error: &dyn std::fmt::Display| format!("{what}: {error}");
        let (pem, key) = match (
            std::fs::read_to_string(&cert_path),
            std::fs::read_to_string(&key_path),
        ) {
            (Ok(pem), Ok(key)) => {
                let key = KeyPair::from_pem(&key)
                    .map_err(|e| fail(&format!("cannot read {}", key_path.display()), &e))?;
                (pem, key)
            }
            _ => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| fail(&format!("cannot create {}", dir.display()), &e))?;
                let key = KeyPair::generate().map_err(|e| fail("cannot make the CA key", &e))?;
                let cert = ca_params()
                    .self_signed(&key)
                    .map_err(|e| fail("cannot make the CA certificate", &e))?;
                write_private(&key_path, key.serialize_pem().as_bytes())
                    .map_err(|e| fail(&format!("cannot write {}", key_path.display()), &e))?;
                std::fs::write(&cert_path, cert.pem())
                    .map_err(|e| fail(&format!("cannot write {}", cert_path.display()), &e))?;
                (cert.pem(), key)
            }
        };
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map_err(|e| fail(&format!("cannot read {}", cert_path.display()), &e))?;
        let leaf_key = KeyPair::generate().map_err(|e| fail("cannot make a leaf key", &e))?;
        Ok(Ca {
            issuer: Issuer::new(ca_params(), key),
            pem,
            der,
            leaf_key,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub(crate) fn pem(&self) -> &str {
        &self.pem
    }

    /// The TLS server side for `name`: a leaf for it signed by the CA, HTTP/1.1 by ALPN.
    pub(crate) fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let name = name.to_ascii_lowercase();
        if let Some(config) = self
            .configs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
        {
            return Ok(Arc::clone(config));
        }
        let mut params = CertificateParams::new(vec![name.clone()])
            .map_err(|e| format!("cannot make a certificate for {name}: {e}"))?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, name.as_str());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(90);
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| format!("cannot sign a certificate for {name}: {e}"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), self.der.clone()], key)
        .map_err(|e| format!("cannot use the certificate for {name}: {e}"))?;
        // HTTP/2 or HTTP/1.1, as the client prefers; upstream it is HTTP/1.1 (`intercept`).
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut configs = self.configs.lock().unwrap_or_else(PoisonError::into_inner);
        if configs.len() >= MAX_LEAVES {
            configs.clear();
        }
        configs.insert(name, Arc::clone(&config));
        Ok(config)
    }
}

/// Writes a file only its owner may read, created so (never readable for a moment).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier as _;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_ca_is_made_once_with_an_owner_only_key_and_signs_leaves_it_verifies() {
        // contract: X13
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::open(dir.path()).expect("made");
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = Ca::open(dir.path()).expect("loaded");
        assert_eq!(ca.pem(), again.pem());
        // A leaf of the reloaded CA verifies against the first CA's certificate.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).expect("root");
        let config = again.server_config("API.example.test").expect("leaf");
        assert!(Arc::ptr_eq(
            &config,
            &again.server_config("api.example.test").expect("cached")
        ));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("verifier");
        let leaf = {
            let mut params =
                CertificateParams::new(vec!["api.example.test".to_owned()]).expect("params");
            params.use_authority_key_identifier_extension = true;
            params
                .signed_by(&again.leaf_key, &again.issuer)
                .expect("signed")
        };
        verifier
            .verify_server_cert(
                leaf.der(),
                &[],
                &rustls_pki_types::ServerName::try_from("api.example.test").expect("name"),
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .expect("verified");
    }
}
