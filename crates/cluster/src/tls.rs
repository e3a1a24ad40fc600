//! Mutual TLS between the nodes of a cluster: a cluster CA, a certificate per node bound to its
//! name, and the rustls configurations both ends of a node's call use.
//!
//! - `forkbox cluster init-ca --dir D` makes the CA ([`init_ca`]): `D/ca.pem` and `D/ca.key`
//!   (mode 0600). The key stays with the operator; nodes hold only `ca.pem`.
//! - `forkbox cluster issue-cert --ca D --node NAME --out O` ([`issue`]) writes `O/ca.pem`,
//!   `O/node.pem` and `O/node.key`: a certificate for both server and client use whose one
//!   name that counts is the DNS name `NAME.node.forkbox` ([`dns_name`]), plus any `--host`
//!   (an etcd member's address, for a certificate etcd serves with).
//! - `forkbox serve --cluster-tls O` loads them ([`Identity::load`]): a certificate for another
//!   node name, an expired one or one the CA did not sign stops the node at start with words.
//!
//! A node calling a peer checks the peer's certificate against the CA *and* the name the
//! cluster's records give that peer, so a node cannot answer as another; the peer checks the
//! caller's against the CA, and the name in it against the node the call is signed as.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The DNS suffix of the name a node's certificate carries.
pub const NAME_SUFFIX: &str = ".node.forkbox";
/// What a node's TLS directory holds.
pub const CA_FILE: &str = "ca.pem";
pub const CERT_FILE: &str = "node.pem";
pub const KEY_FILE: &str = "node.key";
/// An etcd that serves with a certificate of another CA: its CA, beside the node's files.
pub const ETCD_CA_FILE: &str = "etcd-ca.pem";
const CA_KEY_FILE: &str = "ca.key";

/// The name node `node`'s certificate carries, and that its peers check.
pub fn dns_name(node: &str) -> String {
    format!("{node}{NAME_SUFFIX}")
}

/// The rustls crypto provider every TLS end here uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes it the process's default too: etcd's client (tonic) and reqwest ask rustls for the
/// default.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn read(path: &Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("read {what} {}: {e}", path.display()))
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .map_err(|e| format!("write {}: {e}", path.display()))
}

/// Refuses to write into `dir` if any of `files` is there already (nothing is overwritten).
fn all_absent(dir: &Path, files: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("make {}: {e}", dir.display()))?;
    match files.iter().map(|f| dir.join(f)).find(|p| p.exists()) {
        Some(p) => Err(format!(
            "{} exists already; nothing was written (remove it, or choose another directory)",
            p.display()
        )),
        None => Ok(()),
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn offset(unix: i64) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|e| e.to_string())
}

/// Makes a cluster CA in `dir` (valid for ten years); the paths of its certificate and key.
pub fn init_ca(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    all_absent(dir, &[CA_FILE, CA_KEY_FILE])?;
    let key = rcgen::KeyPair::generate().map_err(|e| format!("make the CA's key: {e}"))?;
    let mut params = rcgen::CertificateParams::default();
    let id = &hex(&random_bytes()?)[..12];
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("forkbox cluster CA {id}"),
    );
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = now_unix();
    params.not_before = offset(now - 3600)?;
    params.not_after = offset(now + 10 * 365 * 86_400)?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("make the CA's certificate: {e}"))?;
    let (c, k) = (dir.join(CA_FILE), dir.join(CA_KEY_FILE));
    write_new(&k, &key.serialize_pem(), 0o600)?;
    write_new(&c, &cert.pem(), 0o644)?;
    Ok((c, k))
}

fn random_bytes() -> Result<[u8; 16], String> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).map_err(|e| format!("draw random bytes: {e}"))?;
    Ok(b)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What a certificate is issued for.
#[derive(Debug, Clone)]
pub struct Request {
    /// The node's name (its certificate's `NAME.node.forkbox`).
    pub node: String,
    /// More names it serves under: IP addresses or DNS names (an etcd member's).
    pub hosts: Vec<String>,
    /// When it stops being valid, in Unix seconds.
    pub not_after_unix: i64,
}

/// Issues a node certificate signed by the CA in `ca_dir` into `out` (with a copy of the CA's
/// certificate); the files written.
pub fn issue(ca_dir: &Path, req: &Request, out: &Path) -> Result<Vec<PathBuf>, String> {
    if req.not_after_unix <= now_unix() {
        return Err("a certificate must stay valid past now (--days 1 or more)".into());
    }
    issue_valid_from(ca_dir, req, now_unix() - 3600, out)
}

/// [`issue`] with any validity, valid from `not_before_unix`: an expired certificate too
/// (what a node must refuse, and a test of that needs).
pub fn issue_valid_from(
    ca_dir: &Path,
    req: &Request,
    not_before_unix: i64,
    out: &Path,
) -> Result<Vec<PathBuf>, String> {
    let ca_pem = read(&ca_dir.join(CA_FILE), "the CA's certificate")?;
    let ca_key = read(&ca_dir.join(CA_KEY_FILE), "the CA's key")?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key).map_err(|e| format!("the CA's key: {e}"))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| format!("the CA's certificate: {e}"))?;
    let (cert, key) = leaf(&issuer, req, not_before_unix)?;
    all_absent(out, &[CERT_FILE, KEY_FILE])?;
    let files = [out.join(CA_FILE), out.join(CERT_FILE), out.join(KEY_FILE)];
    if files[0].exists() {
        if read(&files[0], "the CA's certificate")? != ca_pem {
            return Err(format!(
                "{} holds another CA's certificate; nothing was written",
                files[0].display()
            ));
        }
    } else {
        write_new(&files[0], &ca_pem, 0o644)?;
    }
    write_new(&files[2], &key, 0o600)?;
    write_new(&files[1], &cert, 0o644)?;
    Ok(files.to_vec())
}

/// A leaf certificate and its key (PEM), signed by `issuer`, valid from `not_before_unix`.
fn leaf(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    req: &Request,
    not_before_unix: i64,
) -> Result<(String, String), String> {
    check_name(&req.node)?;
    let mut names = vec![dns_name(&req.node)];
    names.extend(req.hosts.iter().cloned());
    let mut params = rcgen::CertificateParams::new(names)
        .map_err(|e| format!("a name of the certificate: {e}"))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, dns_name(&req.node));
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = offset(not_before_unix)?;
    params.not_after = offset(req.not_after_unix)?;
    let key = rcgen::KeyPair::generate().map_err(|e| format!("make a key: {e}"))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| format!("sign the certificate: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn check_name(node: &str) -> Result<(), String> {
    // Room for the suffix within a DNS name's 253 bytes.
    match crate::node_name_ok(node, 200) {
        true => Ok(()),
        false => Err(format!(
            "node name {node:?} must be a-z, 0-9, '-' and '.' (neither first nor last)"
        )),
    }
}

/// What a certificate says, as far as a node checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The node it names (from its `NAME.node.forkbox`), if any.
    pub node: Option<String>,
    pub not_before_unix: i64,
    pub not_after_unix: i64,
}

/// Reads the node name and validity of a DER certificate.
pub fn facts(der: &[u8]) -> Result<Facts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let node = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => {
                    d.strip_suffix(NAME_SUFFIX).map(str::to_string)
                }
                _ => None,
            })
        });
    Ok(Facts {
        node,
        not_before_unix: cert.validity().not_before.timestamp(),
        not_after_unix: cert.validity().not_after.timestamp(),
    })
}

/// The node a peer's verified certificate chain names (its first certificate).
pub fn peer_node(chain: &[CertificateDer<'_>]) -> Option<String> {
    facts(chain.first()?.as_ref()).ok()?.node
}

fn pem_certs(text: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: {e}"))?;
    match certs.is_empty() {
        true => Err(format!("{what} holds no certificate")),
        false => Ok(certs),
    }
}

/// A node's certificate, key and cluster CA, checked.
#[derive(Clone)]
pub struct Identity {
    pub dir: PathBuf,
    pub node: String,
    pub not_after_unix: i64,
    pub ca_pem: String,
    /// The CA etcd's certificate is checked against (`etcd-ca.pem` if given, else the
    /// cluster's).
    pub etcd_ca_pem: String,
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("dir", &self.dir)
            .field("node", &self.node)
            .field("not_after_unix", &self.not_after_unix)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads `dir`'s files for node `node`: refused with words if the certificate names
    /// another node, is not valid now, or was not signed by the CA beside it.
    pub fn load(dir: &Path, node: &str) -> Result<Identity, String> {
        let ca_pem = read(&dir.join(CA_FILE), "the cluster CA's certificate")?;
        let cert_pem = read(&dir.join(CERT_FILE), "this node's certificate")?;
        let key_pem = read(&dir.join(KEY_FILE), "this node's key")?;
        let etcd_ca = dir.join(ETCD_CA_FILE);
        let etcd_ca_pem = match etcd_ca.exists() {
            true => read(&etcd_ca, "etcd's CA certificate")?,
            false => ca_pem.clone(),
        };
        let chain = pem_certs(&cert_pem, "this node's certificate")?;
        let f = facts(chain[0].as_ref())?;
        let cert_file = dir.join(CERT_FILE);
        match &f.node {
            Some(n) if n == node => {}
            Some(n) => {
                return Err(format!(
                    "{} is node {n}'s certificate, not node {node}'s: issue one for this node \
                     (forkbox cluster issue-cert --node {node})",
                    cert_file.display()
                ))
            }
            None => {
                return Err(format!(
                    "{} names no node ({}): issue one with forkbox cluster issue-cert --node \
                     {node}",
                    cert_file.display(),
                    dns_name("NAME")
                ))
            }
        }
        let now = now_unix();
        if now > f.not_after_unix || now < f.not_before_unix {
            return Err(format!(
                "{} is not valid now (valid from {} to {}, Unix seconds; now {now}): issue a \
                 new one with forkbox cluster issue-cert --node {node}",
                cert_file.display(),
                f.not_before_unix,
                f.not_after_unix
            ));
        }
        let id = Identity {
            dir: dir.to_path_buf(),
            node: node.to_string(),
            not_after_unix: f.not_after_unix,
            ca_pem,
            etcd_ca_pem,
            cert_pem,
            key_pem,
        };
        // A node whose own certificate its CA does not accept could call no peer.
        let verifier = id
            .client_verifier()
            .map_err(|e| format!("the cluster CA in {}: {e}", dir.display()))?;
        let end = &chain[0];
        verifier
            .verify_client_cert(end, &chain[1..], rustls::pki_types::UnixTime::now())
            .map_err(|e| {
                format!(
                    "{} was not issued by the cluster CA beside it ({}): {e}",
                    cert_file.display(),
                    dir.join(CA_FILE).display()
                )
            })?;
        Ok(id)
    }

    /// Loads `dir`'s files for whichever node its certificate names (an operator's tools,
    /// which reach etcd with any node's certificate or one issued for `operator`).
    pub fn load_any(dir: &Path) -> Result<Identity, String> {
        let cert_pem = read(&dir.join(CERT_FILE), "the certificate")?;
        let chain = pem_certs(&cert_pem, "the certificate")?;
        match facts(chain[0].as_ref())?.node {
            Some(n) => Identity::load(dir, &n),
            None => Err(format!(
                "{} names no node: issue one with forkbox cluster issue-cert",
                dir.join(CERT_FILE).display()
            )),
        }
    }

    fn roots(&self) -> Result<rustls::RootCertStore, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in pem_certs(&self.ca_pem, "the cluster CA's certificate")? {
            roots
                .add(c)
                .map_err(|e| format!("the cluster CA's certificate: {e}"))?;
        }
        Ok(roots)
    }

    /// What a peer's client certificate is checked with: issued by the cluster CA.
    fn client_verifier(
        &self,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
        rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.roots()?),
            provider(),
        )
        .build()
        .map_err(|e| e.to_string())
    }

    fn chain_and_key(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        use rustls::pki_types::pem::PemObject;
        let chain = pem_certs(&self.cert_pem, "this node's certificate")?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("this node's key: {e}"))?;
        Ok((chain, key))
    }

    /// The configuration a node's calls to its peers use: the cluster CA as the only root, this
    /// node's certificate as the client's.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        let (chain, key) = self.chain_and_key()?;
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("this node's certificate and key: {e}"))
    }

    /// The configuration a node's listener takes TLS connections with: a client certificate of
    /// the cluster CA required.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, String> {
        let (chain, key) = self.chain_and_key()?;
        let verifier = self.client_verifier()?;
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| format!("this node's certificate and key: {e}"))
    }

    /// The name a call to node `peer` must find in its certificate.
    pub fn server_name(peer: &str) -> Result<ServerName<'static>, String> {
        ServerName::try_from(dns_name(peer)).map_err(|e| format!("node name {peer:?}: {e}"))
    }

    /// etcd's client TLS: etcd's CA, this node's certificate as the client's.
    pub fn etcd(&self) -> etcd_client::TlsOptions {
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.etcd_ca_pem))
            .identity(etcd_client::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(node: &str, days: i64) -> Request {
        Request {
            node: node.into(),
            hosts: vec!["127.0.0.1".into()],
            not_after_unix: now_unix() + days * 86_400,
        }
    }

    #[test]
    fn a_node_loads_its_own_certificate_and_no_other() {
        let d = tempfile::tempdir().unwrap();
        let (ca, out) = (d.path().join("ca"), d.path().join("a"));
        init_ca(&ca).unwrap();
        assert!(init_ca(&ca).unwrap_err().contains("exists already"));
        issue(&ca, &req("a", 30), &out).unwrap();
        let id = Identity::load(&out, "a").unwrap();
        assert_eq!(id.node, "a");
        id.client_config().unwrap();
        id.server_config().unwrap();
        let e = Identity::load(&out, "b").unwrap_err();
        assert!(e.contains("node a's certificate, not node b's"), "{e}");
        // Issued again into the same place: refused, the files kept.
        let before = std::fs::read(out.join(KEY_FILE)).unwrap();
        assert!(issue(&ca, &req("a", 30), &out).is_err());
        assert_eq!(std::fs::read(out.join(KEY_FILE)).unwrap(), before);
    }

    #[test]
    fn another_clusters_or_an_expired_certificate_is_refused_at_start() {
        let d = tempfile::tempdir().unwrap();
        let (ca1, ca2) = (d.path().join("ca1"), d.path().join("ca2"));
        init_ca(&ca1).unwrap();
        init_ca(&ca2).unwrap();
        let out = d.path().join("x");
        issue(&ca2, &req("a", 30), &out).unwrap();
        std::fs::copy(ca1.join(CA_FILE), out.join(CA_FILE)).unwrap();
        let e = Identity::load(&out, "a").unwrap_err();
        assert!(e.contains("was not issued by the cluster CA"), "{e}");
        let old = d.path().join("old");
        assert!(issue(&ca1, &req("a", -1), &old).is_err());
        issue_valid_from(&ca1, &req("a", -1), now_unix() - 10 * 86_400, &old).unwrap();
        let e = Identity::load(&old, "a").unwrap_err();
        assert!(e.contains("is not valid now"), "{e}");
    }
}
