//! A CA whose certificates a sandbox's guest trusts, for the connections the host ends itself
//! ([`crate::intercept`]): a sandbox's own for its secrets (made with it, its key only in this
//! process's memory), and a home's for its package cache (kept in the home, 0600, so that
//! forks, sandboxes that wake and a restarted daemon present the same one). Every host
//! certificate it issues shares one key made per process; each is made once per host name.
//! Also the TLS configuration of the host's own connections to the real hosts.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and the server configurations it made so far.
pub struct Ca {
    der: CertificateDer<'static>,
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The one key of every host certificate this CA issues.
    leaf_key: rcgen::KeyPair,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The year of `t`, by the host's clock.
fn year(t: std::time::SystemTime) -> i32 {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

/// This year (a certificate's validity starts the year before).
fn this_year() -> i32 {
    year(std::time::SystemTime::now())
}

fn validity(params: &mut rcgen::CertificateParams) {
    let year = this_year();
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
}

fn ca_params(name: &str) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name.to_string());
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params);
    params
}

/// The file a home's CA is kept in: its certificate and its key, PEM.
const HOME_CA: &str = "ca.key";

impl Ca {
    /// A new CA named `name`, in this process's memory only.
    pub fn new(name: &str) -> Result<Ca, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| format!("make a CA key: {e}"))?;
        let params = ca_params(name);
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("make a CA certificate: {e}"))?;
        Ca::from_parts(
            cert.der().clone(),
            cert.pem(),
            rcgen::Issuer::new(params, key),
        )
    }

    /// The CA kept in `dir` (made there the first time, 0600; made again when it no longer
    /// holds for this year and the next).
    pub fn kept_in(dir: &Path, name: &str) -> Result<Ca, String> {
        let file = dir.join(HOME_CA);
        // A CA holds from the year before it was made to two years after: one made in an
        // earlier year than the last is made again before it runs out.
        let made = std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .map_or(0, year);
        let text = std::fs::read_to_string(&file)
            .ok()
            .filter(|_| made >= this_year() - 1);
        if let Some(text) = text {
            match Ca::parse(&text) {
                Ok(ca) => return Ok(ca),
                Err(e) => tracing::info!("{}: {e}; making a new CA", file.display()),
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let key = rcgen::KeyPair::generate().map_err(|e| format!("make a CA key: {e}"))?;
        let params = ca_params(name);
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("make a CA certificate: {e}"))?;
        let text = format!("{}{}", cert.pem(), key.serialize_pem());
        // Written whole under another name, then put in place: a process starting at the
        // same time reads one CA or the other, never half of one.
        let tmp = dir.join(format!(".{HOME_CA}.{}", std::process::id()));
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| format!("write {}: {e}", tmp.display()))?;
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &file).map_err(|e| format!("write {}: {e}", file.display()))?;
        Ca::from_parts(
            cert.der().clone(),
            cert.pem(),
            rcgen::Issuer::new(params, key),
        )
    }

    /// A CA from its certificate and key (PEM, one after the other).
    fn parse(text: &str) -> Result<Ca, String> {
        let der = CertificateDer::from_pem_slice(text.as_bytes())
            .map_err(|e| format!("no certificate: {e}"))?;
        const END: &str = "-----END CERTIFICATE-----";
        let (cert, key) = text.split_once(END).ok_or("no certificate")?;
        let cert_pem = format!("{}{END}\n", cert.trim_start());
        let key = rcgen::KeyPair::from_pem(key.trim()).map_err(|e| format!("no key: {e}"))?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| format!("not a CA this can use: {e}"))?;
        Ca::from_parts(der, cert_pem, issuer)
    }

    fn from_parts(
        der: CertificateDer<'static>,
        pem: String,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ) -> Result<Ca, String> {
        let leaf_key = rcgen::KeyPair::generate().map_err(|e| format!("make a key: {e}"))?;
        Ok(Ca {
            der,
            pem,
            issuer,
            leaf_key,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate, PEM: the guest trusts it.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The TLS configuration the guest's side of a connection to `host` is served with: a
    /// certificate for `host` this CA issued (made once per host), HTTP/1.1 only.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some(c) = lock(&self.configs).get(host) {
            return Ok(c.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("a certificate for {host:?}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host.to_string());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| format!("a certificate for {host:?}: {e}"))?;
        let key = PrivateKeyDer::try_from(self.leaf_key.serialize_der())
            .map_err(|e| format!("a key for {host:?}: {e}"))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS for {host:?}: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.der.clone()], key)
            .map_err(|e| format!("TLS for {host:?}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // A client's next connection resumes its session (no certificate to verify again):
        // `npm ci` opens a hundred, and an emulated guest pays for each verification.
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
        let config = Arc::new(config);
        lock(&self.configs).insert(host.to_string(), config.clone());
        Ok(config)
    }
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes `ring`, forkbox's one TLS crypto provider, the process's default: reqwest and the OCI
/// client are built without a provider of their own and take the default. Idempotent.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The TLS configuration of this side's connections to the real hosts: verified against the
/// host's CA bundle (read once), HTTP/1.1.
pub fn upstream_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let bundle = crate::net::host_ca_bundle().ok_or(
                "the host has no CA bundle (/etc/ssl/certs/ca-certificates.crt or SSL_CERT_FILE) to verify the real host against",
            )?;
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(bundle)
                .map_err(|e| format!("read {}: {e}", bundle.display()))?
                .filter_map(Result::ok);
            roots.add_parsable_certificates(certs);
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_ca_is_the_same_ca_next_time_and_its_file_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let a = Ca::kept_in(dir.path(), "forkbox test CA").expect("made");
        let b = Ca::kept_in(dir.path(), "forkbox test CA").expect("read back");
        assert_eq!(a.pem(), b.pem());
        let mode = std::fs::metadata(dir.path().join(HOME_CA))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!a.pem().contains("PRIVATE"));
        // A damaged file is replaced, not an error.
        std::fs::write(dir.path().join(HOME_CA), "not a CA").expect("write");
        let c = Ca::kept_in(dir.path(), "forkbox test CA").expect("made again");
        assert_ne!(c.pem(), a.pem());
        c.server_config("registry.npmjs.org")
            .expect("a certificate");
    }
}
