//! Pulling an image from an OCI registry (the distribution API, through `oci-client`): its
//! manifest (for linux/amd64 when the reference names an index), its config and its layers,
//! each checked against its digest, the layers kept by digest under `oci/blobs/` in forkbox's
//! home so that a rebuild reads the same bytes without the network.
//!
//! Credentials come from forkbox's own `registries.json` (written by `forkbox image login`),
//! then `REGISTRY_AUTH_FILE`, then `~/.docker/config.json`; each is sent only to its registry.
//! A registry is spoken to over plain HTTP only when it is named insecure: by `image login
//! --insecure` or in `FORKBOX_INSECURE_REGISTRIES` (comma-separated `host[:port]`).
//!
//! A registry may have mirrors (`forkbox image mirror REGISTRY MIRROR…`, kept in the same
//! file), as container runtimes configure theirs: a pull asks each mirror in turn, the
//! registry itself last, under the same reference (`?ns=REGISTRY` tells a mirror whose it is);
//! what a mirror gives is checked against the digests as the registry's would be, and the
//! image keeps the registry's name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;

use crate::error::ImageError;
use crate::paths::{write_atomic, Paths};

/// The environment variable naming registries spoken to over plain HTTP.
pub const INSECURE_ENV: &str = "FORKBOX_INSECURE_REGISTRIES";
const LOGINS: &str = "registries.json";

/// A base image's reference as a recipe gives it: `python:3.8-slim`, `node:18`,
/// `registry.example:5000/team/node:18`, `busybox@sha256:…`. Docker Hub's short names resolve
/// as `docker` resolves them (`python` is `docker.io/library/python`).
pub fn parse_reference(s: &str) -> Result<Reference, String> {
    s.parse::<Reference>()
        .map_err(|e| format!("{s:?} is not an image reference: {e}"))
}

/// What forkbox keeps of a registry: credentials (base64 `user:password`, as docker keeps
/// them) and whether it speaks plain HTTP.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Login {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Registries (`host[:port]`) asked for this one's images first, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
}

/// The registries `forkbox image login` has recorded.
pub fn logins(paths: &Paths) -> BTreeMap<String, Login> {
    std::fs::read(paths.home().join(LOGINS))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records (or with `None`, forgets) how to reach `registry`; the file is readable by root only.
pub fn save_login(paths: &Paths, registry: &str, login: Option<Login>) -> Result<(), ImageError> {
    let mut all = logins(paths);
    match login {
        Some(l) => all.insert(registry.to_string(), l),
        None => all.remove(registry),
    };
    let json = serde_json::to_vec_pretty(&all)
        .map_err(|e| ImageError::io("encode registries.json", e.into()))?;
    let path = paths.home().join(LOGINS);
    write_atomic(&path, &json)
        .map_err(|e| ImageError::io(format!("write {}", path.display()), e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ImageError::io(format!("restrict {}", path.display()), e))
}

/// Docker Hub's names in docker's config files.
fn config_keys(registry: &str) -> Vec<String> {
    let mut keys = vec![
        registry.to_string(),
        format!("https://{registry}"),
        format!("http://{registry}"),
    ];
    if matches!(
        registry,
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    ) {
        keys.push("https://index.docker.io/v1/".into());
        keys.push("docker.io".into());
        keys.push("index.docker.io".into());
    }
    keys
}

/// The `auths` entry for `registry` in a docker/containers auth file.
fn auth_from_file(path: &Path, registry: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        auth: Option<String>,
    }
    let f: File = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    config_keys(registry)
        .iter()
        .find_map(|k| f.auths.get(k).and_then(|e| e.auth.clone()))
}

/// The credentials for `registry`, and which file gave them.
fn credentials(
    paths: &Paths,
    registry: &str,
) -> Result<(RegistryAuth, Option<String>), ImageError> {
    let mut found = logins(paths)
        .get(registry)
        .and_then(|l| l.auth.clone())
        .map(|a| (a, paths.home().join(LOGINS)));
    if found.is_none() {
        let mut files: Vec<PathBuf> = Vec::new();
        if let Some(f) = std::env::var_os("REGISTRY_AUTH_FILE") {
            files.push(f.into());
        }
        if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
            files.push(PathBuf::from(dir).join("config.json"));
        } else if let Some(home) = std::env::var_os("HOME") {
            files.push(PathBuf::from(home).join(".docker/config.json"));
        }
        found = files
            .into_iter()
            .find_map(|f| auth_from_file(&f, registry).map(|a| (a, f)));
    }
    let Some((auth, file)) = found else {
        return Ok((RegistryAuth::Anonymous, None));
    };
    let bad = || ImageError::Registry {
        reference: registry.to_string(),
        message: format!(
            "the credentials for {registry} in {} are not base64 `user:password`",
            file.display()
        ),
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let (user, pass) = text.split_once(':').ok_or_else(bad)?;
    Ok((
        RegistryAuth::Basic(user.to_string(), pass.to_string()),
        Some(file.display().to_string()),
    ))
}

/// The registries spoken to over plain HTTP.
fn insecure(paths: &Paths) -> Vec<String> {
    let mut v: Vec<String> = std::env::var(INSECURE_ENV)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    v.extend(
        logins(paths)
            .into_iter()
            .filter(|(_, l)| l.insecure)
            .map(|(r, _)| r),
    );
    v
}

/// The defaults an image's config gives the commands run in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDefaults {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
}

/// A pulled image: its layers in order, on disk.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// `registry/repository@sha256:…`: the manifest pulled, which a rebuild pulls again.
    pub pinned: String,
    pub digest: String,
    pub defaults: ImageDefaults,
    pub layers: Vec<PathBuf>,
    /// Bytes fetched from the registry (layers already kept are not fetched again).
    pub fetched: u64,
}

/// What a pull reports as it goes.
#[derive(Debug, Clone)]
pub enum PullEvent {
    Manifest {
        pinned: String,
        layers: usize,
        bytes: u64,
    },
    Layer {
        n: usize,
        of: usize,
        digest: String,
        done: u64,
        size: u64,
        cached: bool,
    },
}

fn registry_error(
    reference: &Reference,
    e: oci_client::errors::OciDistributionError,
    login: &Option<String>,
) -> ImageError {
    use oci_client::errors::OciDistributionError as E;
    // Where it was asked: a mirror, else the registry (Docker Hub by its short name).
    let registry = match reference.resolve_registry() {
        "index.docker.io" => reference.registry(),
        r => r,
    };
    let message = match &e {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => match login {
            Some(file) => format!(
                "{registry} refused the credentials from {file} ({e}); check them with `forkbox image login {registry}`"
            ),
            None => format!(
                "{registry} asks for credentials ({e}); give them with `forkbox image login {registry}`"
            ),
        },
        E::ImageManifestNotFoundError(_) => format!("{registry} has no {} ({e})", reference.whole()),
        E::DigestError(_) => format!("a blob's bytes do not match its digest: {e}; nothing was kept"),
        E::RequestError(r) if r.is_connect() || r.is_timeout() => format!(
            "cannot reach {registry}: {e}; a registry that speaks plain HTTP must be named insecure (`forkbox image login --insecure {registry}` or {INSECURE_ENV})"
        ),
        _ => e.to_string(),
    };
    ImageError::Registry {
        reference: reference.whole(),
        message,
    }
}

fn client(paths: &Paths) -> Client {
    crate::sandbox::ca::install_provider();
    Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(insecure(paths)),
        platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
        connect_timeout: Some(std::time::Duration::from_secs(20)),
        read_timeout: Some(std::time::Duration::from_secs(120)),
        ..Default::default()
    })
}

/// The mirrors recorded for the registry `reference` names.
fn mirrors(paths: &Paths, reference: &Reference) -> Vec<String> {
    logins(paths)
        .get(reference.resolve_registry())
        .map(|l| l.mirrors.clone())
        .unwrap_or_default()
}

/// Pulls `reference`: from each of its registry's mirrors in turn, then from the registry.
pub async fn pull(
    paths: &Paths,
    reference: &Reference,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<Pulled, ImageError> {
    let mut failed = Vec::new();
    for m in mirrors(paths, reference) {
        let mut through = reference.clone();
        through.set_mirror_registry(m.clone());
        match pull_from(paths, &through, progress).await {
            Ok(p) => return Ok(p),
            Err(e) => {
                tracing::warn!(
                    mirror = m,
                    "pulling {} through a mirror: {e}",
                    reference.whole()
                );
                failed.push(format!("mirror {m}: {e}"));
            }
        }
    }
    pull_from(paths, reference, progress)
        .await
        .map_err(|e| match (e, failed.is_empty()) {
            (e, true) => e,
            (ImageError::Registry { reference, message }, false) => ImageError::Registry {
                reference,
                message: format!("{message} (after its mirrors: {})", failed.join("; ")),
            },
            (e, false) => e,
        })
}

/// Pulls `reference` from where it resolves: manifest, config, and every layer not already
/// kept.
async fn pull_from(
    paths: &Paths,
    reference: &Reference,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<Pulled, ImageError> {
    let (auth, login) = credentials(paths, reference.resolve_registry())?;
    let client = client(paths);
    let err = |e| registry_error(reference, e, &login);
    let (manifest, digest, config) = client
        .pull_manifest_and_config(reference, &auth)
        .await
        .map_err(err)?;
    let pinned = Reference::with_digest(
        reference.registry().to_string(),
        reference.repository().to_string(),
        digest.clone(),
    )
    .whole();
    let config = linux_amd64_config(reference, &config)?;
    let defaults = defaults(&config);
    let bytes = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
    progress(PullEvent::Manifest {
        pinned: pinned.clone(),
        layers: manifest.layers.len(),
        bytes,
    });
    let blobs = paths.home().join("oci/blobs");
    std::fs::create_dir_all(&blobs)
        .map_err(|e| ImageError::io(format!("create {}", blobs.display()), e))?;
    let mut layers = Vec::new();
    let mut fetched = 0;
    let of = manifest.layers.len();
    for (i, layer) in manifest.layers.iter().enumerate() {
        check_layer_type(reference, layer)?;
        let hex = sha256_hex(reference, layer)?;
        let path = blobs.join(hex);
        let size = layer.size.max(0) as u64;
        let event = |done, cached| PullEvent::Layer {
            n: i + 1,
            of,
            digest: layer.digest.clone(),
            done,
            size,
            cached,
        };
        if path.is_file() {
            progress(event(size, true));
            layers.push(path);
            continue;
        }
        // A part file of this pull's own: two pulls of one image at once (a daemon building
        // two templates FROM it) each fetch into their own and the last rename wins, the
        // bytes being the same.
        static PULLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PULLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let part = blobs.join(format!(".{hex}.{}.{n}", std::process::id()));
        let file = tokio::fs::File::create(&part)
            .await
            .map_err(|e| ImageError::io(format!("create {}", part.display()), e))?;
        let mut report = |done| progress(event(done, false));
        let counted = Counted {
            inner: file,
            done: 0,
            last: 0,
            limit: size,
            report: &mut report,
        };
        // oci-client checks the bytes against the layer's digest before it returns; the
        // writer refuses more bytes than the manifest declared, so a registry cannot fill the
        // host's disk before that check.
        let got = client.pull_blob(reference, layer, counted).await;
        if let Err(e) = got {
            let _ = std::fs::remove_file(&part);
            return Err(err(e));
        }
        std::fs::rename(&part, &path)
            .map_err(|e| ImageError::io(format!("keep layer {}", layer.digest), e))?;
        progress(event(size, false));
        fetched += size;
        layers.push(path);
    }
    Ok(Pulled {
        pinned,
        digest,
        defaults,
        layers,
        fetched,
    })
}

/// The image's config, which must be an OCI image config of a linux/amd64 image.
fn linux_amd64_config(
    reference: &Reference,
    config: &str,
) -> Result<oci_spec::image::ImageConfiguration, ImageError> {
    let config: oci_spec::image::ImageConfiguration =
        serde_json::from_str(config).map_err(|e| ImageError::Registry {
            reference: reference.whole(),
            message: format!("its config is not an OCI image config: {e}"),
        })?;
    if config.os().to_string() != "linux" || config.architecture().to_string() != "amd64" {
        return Err(ImageError::Registry {
            reference: reference.whole(),
            message: format!(
                "it is a {}/{} image; forkbox runs linux/amd64",
                config.os(),
                config.architecture()
            ),
        });
    }
    Ok(config)
}

/// A layer's digest as the 64 hex digits of its SHA-256 (its blob's file name): a registry
/// that names it otherwise is refused.
fn sha256_hex<'d>(reference: &Reference, layer: &'d OciDescriptor) -> Result<&'d str, ImageError> {
    layer
        .digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageError::Registry {
            reference: reference.whole(),
            message: format!("layer digest {:?} is not a sha256 digest", layer.digest),
        })
}

fn check_layer_type(reference: &Reference, layer: &OciDescriptor) -> Result<(), ImageError> {
    let t = layer.media_type.as_str();
    let ok = t.starts_with("application/vnd.oci.image.layer.v1.tar")
        && !t.contains("nondistributable")
        || t.starts_with("application/vnd.docker.image.rootfs.diff.tar");
    if ok && !t.contains("foreign") {
        return Ok(());
    }
    Err(ImageError::Registry {
        reference: reference.whole(),
        message: format!(
            "layer {} has media type {t:?}, which is not a filesystem layer forkbox can apply",
            layer.digest
        ),
    })
}

/// Env (`K=V`), WorkingDir and User from an image config.
fn defaults(config: &oci_spec::image::ImageConfiguration) -> ImageDefaults {
    let Some(c) = config.config() else {
        return ImageDefaults::default();
    };
    let env = c
        .env()
        .iter()
        .flatten()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    ImageDefaults {
        env,
        workdir: nonempty(c.working_dir()),
        user: nonempty(c.user()),
    }
}

/// An `AsyncWrite` that reports the bytes through it every 4 MiB and refuses any past `limit`.
struct Counted<'a, W> {
    inner: W,
    done: u64,
    last: u64,
    limit: u64,
    report: &'a mut dyn FnMut(u64),
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<'_, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.done + buf.len() as u64 > this.limit {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the {} bytes the manifest declared",
                this.limit
            ))));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.done += n as u64;
            if this.done - this.last >= 4 << 20 {
                this.last = this.done;
                (this.report)(this.done);
            }
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn short_names_resolve_as_docker_does() {
        let r = parse_reference("python:3.8-slim").unwrap();
        assert_eq!(r.whole(), "docker.io/library/python:3.8-slim");
        let r = parse_reference("registry.example:5000/team/node:18").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("registry.example:5000", "team/node", Some("18"))
        );
        assert!(parse_reference("Not An Image").is_err());
    }

    #[test]
    fn docker_config_entries_are_found_by_registry() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.json");
        std::fs::write(&f, r#"{"auths":{"https://index.docker.io/v1/":{"auth":"aHViOnB3"},"localhost:5000":{"auth":"dTpw"}}}"#).unwrap();
        assert_eq!(
            auth_from_file(&f, "index.docker.io").as_deref(),
            Some("aHViOnB3")
        );
        assert_eq!(
            auth_from_file(&f, "localhost:5000").as_deref(),
            Some("dTpw")
        );
        assert_eq!(auth_from_file(&f, "localhost:5001"), None);
    }
}
