//! E2B's domain mode: the SDKs call `https://api.D` and `https://PORT-ID.D`, so the daemon
//! answers `D` and every name under it over TLS with a certificate of a CA forkbox makes once
//! per home (`e2b-tls/ca.pem`, its key mode 0600, never sent anywhere) and the user trusts
//! (`ca.pem` into the system store, or `SSL_CERT_FILE` / `NODE_EXTRA_CA_CERTS`). The site's
//! certificate (`*.D` and `D`) is made again when the domain changes or it nears its end.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The CA's certificate in a home's E2B directory.
pub const CA_FILE: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
const SITE_CERT: &str = "site.pem";
const SITE_KEY: &str = "site.key";
const SITE_DOMAIN: &str = "site.domain";
/// A site's certificate lasts a year and is made again in its last month.
const SITE_DAYS: u64 = 365;
const RENEW_DAYS: u64 = 30;

/// A domain's certificate and key (PEM; the chain holds the CA after the site's certificate),
/// and where the CA to trust is.
#[derive(Debug, Clone)]
pub struct Site {
    pub domain: String,
    pub chain_pem: String,
    pub key_pem: String,
    pub ca_file: PathBuf,
}

/// A domain name as E2B's SDKs take it: lower-case labels of letters, digits and `-`.
pub fn check_domain(d: &str) -> Result<String, String> {
    let d = d.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !d.is_empty()
        && d.len() <= 200
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    match ok {
        true => Ok(d),
        false => Err(format!(
            "E2B domain {d:?} is not a domain name (labels of letters, digits and '-', e.g. e2b.example.internal)"
        )),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn at(unix: u64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The CA of directory `dir` (made on first use): its certificate and its key.
fn ca(dir: &Path) -> std::io::Result<(String, rcgen::KeyPair)> {
    let (cert, key) = (dir.join(CA_FILE), dir.join(CA_KEY));
    if let (Ok(c), Ok(k)) = (
        std::fs::read_to_string(&cert),
        std::fs::read_to_string(&key),
    ) {
        return Ok((c, rcgen::KeyPair::from_pem(&k).map_err(other)?));
    }
    std::fs::create_dir_all(dir)?;
    let key_pair = rcgen::KeyPair::generate().map_err(other)?;
    let mut p = rcgen::CertificateParams::default();
    let tag = crate::keys::random_hex(6)?;
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("forkbox E2B CA {tag}"));
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = at(now().saturating_sub(3600));
    p.not_after = at(now() + 10 * 365 * 86_400);
    let pem = p.self_signed(&key_pair).map_err(other)?.pem();
    write_private(&key, &key_pair.serialize_pem())?;
    std::fs::write(&cert, &pem)?;
    Ok((pem, key_pair))
}

/// The site of `domain` from directory `dir`, its CA and certificate made where missing.
pub fn site(dir: &Path, domain: &str) -> std::io::Result<Site> {
    let domain = check_domain(domain).map_err(other)?;
    let (ca_pem, ca_key) = ca(dir)?;
    let (cert_f, key_f, dom_f) = (
        dir.join(SITE_CERT),
        dir.join(SITE_KEY),
        dir.join(SITE_DOMAIN),
    );
    let fresh = std::fs::read_to_string(&dom_f).is_ok_and(|d| {
        let mut it = d.split_whitespace();
        it.next() == Some(domain.as_str())
            && it
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|end| end > now() + RENEW_DAYS * 86_400)
    });
    if fresh {
        if let (Ok(c), Ok(k)) = (
            std::fs::read_to_string(&cert_f),
            std::fs::read_to_string(&key_f),
        ) {
            return Ok(Site {
                domain,
                chain_pem: format!("{c}{ca_pem}"),
                key_pem: k,
                ca_file: dir.join(CA_FILE),
            });
        }
    }
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(other)?;
    let mut p = rcgen::CertificateParams::new(vec![domain.clone(), format!("*.{domain}")])
        .map_err(other)?;
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("*.{domain}"));
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    let end = now() + SITE_DAYS * 86_400;
    p.not_before = at(now().saturating_sub(3600));
    p.not_after = at(end);
    let key = rcgen::KeyPair::generate().map_err(other)?;
    let cert = p.signed_by(&key, &issuer).map_err(other)?.pem();
    write_private(&key_f, &key.serialize_pem())?;
    std::fs::write(&cert_f, &cert)?;
    std::fs::write(&dom_f, format!("{domain} {end}\n"))?;
    Ok(Site {
        domain,
        chain_pem: format!("{cert}{ca_pem}"),
        key_pem: key.serialize_pem(),
        ca_file: dir.join(CA_FILE),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_site_is_made_once_per_domain_under_one_ca() {
        let dir = std::env::temp_dir().join(format!("fbx-e2b-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = site(&dir, "E2B.Test.").unwrap();
        assert_eq!(a.domain, "e2b.test");
        let again = site(&dir, "e2b.test").unwrap();
        assert_eq!(a.chain_pem, again.chain_pem, "kept, not made again");
        let b = site(&dir, "other.test").unwrap();
        assert_ne!(a.chain_pem, b.chain_pem);
        let ca = std::fs::read_to_string(dir.join(CA_FILE)).unwrap();
        assert!(
            b.chain_pem.ends_with(&ca),
            "the chain ends with the same CA"
        );
        use std::os::unix::fs::PermissionsExt as _;
        for f in [CA_KEY, SITE_KEY] {
            let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        assert!(check_domain("bad_domain").is_err() && check_domain("").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
