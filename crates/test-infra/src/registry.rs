//! A real OCI registry on loopback (Debian's `docker-registry`), and images the tests make
//! themselves: OCI layouts written here from Debian roots and hand-made layers, pushed with
//! `skopeo`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// A `docker-registry` serving on 127.0.0.1, stopped when dropped.
pub struct Registry {
    pub addr: String,
    /// Where it keeps its blobs (`docker/registry/v2/blobs/sha256/..`).
    pub storage: PathBuf,
    /// `user:password` it asks for, if any.
    pub creds: Option<String>,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Registry {
    /// Starts a registry; with `creds` (`user:password`) it asks for them (htpasswd, bcrypt).
    pub fn start(creds: Option<&str>) -> Registry {
        // A free port can be taken between asking and binding (by another test's registry,
        // say, which would then answer for this one): a registry that exits is started again
        // on another port, and one is used only while its own process lives.
        for _ in 0..5 {
            if let Some(reg) = Registry::try_start(creds) {
                return reg;
            }
        }
        panic!("docker-registry did not start on any of 5 ports");
    }

    fn try_start(creds: Option<&str>) -> Option<Registry> {
        let dir = tempfile::tempdir().expect("registry dir");
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.path().join("data");
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n  secret: forkbox-test\n",
            storage.display()
        );
        if let Some(c) = creds {
            let (user, pass) = c.split_once(':').expect("user:password");
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, pass])
                .output()
                .expect("run htpasswd (apache2-utils)");
            assert!(out.status.success(), "htpasswd failed");
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, &out.stdout).expect("write htpasswd");
            cfg += &format!(
                "auth:\n  htpasswd:\n    realm: forkbox-test\n    path: {}\n",
                file.display()
            );
        }
        let cfg_file = dir.path().join("config.yml");
        std::fs::write(&cfg_file, cfg).expect("write registry config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry (Debian package docker-registry)");
        let mut reg = Registry {
            addr,
            storage,
            creds: creds.map(str::to_string),
            child,
            _dir: dir,
        };
        let mut exited = false;
        let up = crate::wait_until(Duration::from_secs(20), || {
            exited = matches!(reg.child.try_wait(), Ok(Some(_)));
            exited || std::net::TcpStream::connect(&reg.addr).is_ok()
        });
        std::thread::sleep(Duration::from_millis(200));
        if exited || matches!(reg.child.try_wait(), Ok(Some(_))) {
            return None;
        }
        assert!(up, "docker-registry did not listen on {}", reg.addr);
        Some(reg)
    }

    /// Pushes the OCI layout `layout` (tag `tag` in it) as `REPO:TAG` here, with skopeo.
    pub fn push(&self, layout: &Path, repo_tag: &str) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some(c) = &self.creds {
            cmd.arg(format!("--dest-creds={c}"));
        }
        let out = cmd
            .arg(format!("oci:{}:latest", layout.display()))
            .arg(format!("docker://{}/{repo_tag}", self.addr))
            .output()
            .expect("run skopeo");
        assert!(
            out.status.success(),
            "skopeo copy to {repo_tag} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The file the registry keeps a blob in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// A tar entry of a hand-made layer.
pub enum Entry<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a str, u32),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
}

/// A gzip tar layer of `entries`, written as given (`..` and absolute paths too: hostile
/// layers are what some tests need).
pub fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        let (path, data): (&str, &[u8]) = match e {
            Entry::Dir(p, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                (p, &[])
            }
            Entry::File(p, text, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (p, text.as_bytes())
            }
            Entry::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_link_name(target).expect("link target");
                (p, &[])
            }
            Entry::HardLink(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_link_name(target).expect("link target");
                (p, &[])
            }
        };
        h.set_size(data.len() as u64);
        let bytes = path.as_bytes();
        h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        h.set_cksum();
        b.append(&h, data).expect("append to layer");
    }
    gzip(&b.into_inner().expect("finish layer"))
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// An image config's defaults.
#[derive(Default)]
pub struct Config<'a> {
    pub env: &'a [&'a str],
    pub workdir: Option<&'a str>,
    pub user: Option<&'a str>,
}

/// Writes an OCI layout of one image (tag `latest`) with `layers` (gzip tars) at `dir`;
/// returns the manifest's digest.
pub fn write_layout(dir: &Path, layers: &[Vec<u8>], config: &Config<'_>) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("create layout");
    let put = |bytes: &[u8]| {
        let d = digest(bytes);
        std::fs::write(blobs.join(d.trim_start_matches("sha256:")), bytes).expect("write blob");
        d
    };
    let mut diff_ids = Vec::new();
    let mut descs = Vec::new();
    for l in layers {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&l[..]), &mut raw)
            .expect("layers are gzip");
        diff_ids.push(digest(&raw));
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": put(l),
            "size": l.len(),
        }));
    }
    let mut cfg = serde_json::json!({
        "Env": config.env,
    });
    if let Some(w) = config.workdir {
        cfg["WorkingDir"] = w.into();
    }
    if let Some(u) = config.user {
        cfg["User"] = u.into();
    }
    let config_json = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("encode config");
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(&config_json),
            "size": config_json.len(),
        },
        "layers": descs,
    }))
    .expect("encode manifest");
    let manifest_digest = put(&manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": "latest"},
        }],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).expect("write index.json");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("write oci-layout");
    manifest_digest
}

/// A Debian bookworm minbase root as a gzip tar layer (mmdebstrap), made once per test home.
pub fn debian_layer(paths: &forkbox_engine::paths::Paths) -> Vec<u8> {
    let file = paths.home().join("cache/oci-test-bookworm-minbase.tar.gz");
    crate::with_lock(paths, || {
        if !file.is_file() {
            eprintln!("test-infra: making a Debian root for the registry tests (once per machine)");
            std::fs::create_dir_all(file.parent().expect("cache dir")).expect("cache dir");
            let tar = file.with_extension("part");
            let out = crate::mmdebstrap()
                .args(["--quiet", "--variant=minbase", "--format=tar", "bookworm"])
                .arg(&tar)
                .output()
                .expect("run mmdebstrap");
            assert!(
                out.status.success(),
                "mmdebstrap failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let raw = std::fs::read(&tar).expect("read the root's tar");
            let _ = std::fs::remove_file(&tar);
            // Whole or not at all: a file that is there is never one being written.
            forkbox_engine::paths::write_atomic(&file, &gzip(&raw)).expect("keep the root layer");
        }
    });
    std::fs::read(&file).expect("read the root layer")
}

/// A mirror of Docker Hub on loopback for the daemon of home `paths`: a registry holding the
/// public images E2B's template tests name (`ubuntu:22.04`), each made here from what this
/// machine reaches (a Debian bookworm minbase root: a shell, coreutils and `useradd`, what the
/// tests run in it), recorded in the home's `registries.json` as docker.io's mirror (plain
/// HTTP), as `forkbox image mirror docker.io http://ADDR` records it. Stopped when dropped.
pub fn hub_mirror(paths: &forkbox_engine::paths::Paths) -> Registry {
    use forkbox_engine::image::oci::{logins, save_login};
    let reg = Registry::start(None);
    let t = tempfile::tempdir().expect("a layout dir");
    let layout = t.path().join("layout");
    write_layout(
        &layout,
        &[debian_layer(&crate::home())],
        &Config {
            env: &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            workdir: None,
            user: None,
        },
    );
    reg.push(&layout, "library/ubuntu:22.04");
    let mut mirror = logins(paths).remove(&reg.addr).unwrap_or_default();
    mirror.insecure = true;
    save_login(paths, &reg.addr, Some(mirror)).expect("record the mirror as plain HTTP");
    let mut hub = logins(paths).remove("index.docker.io").unwrap_or_default();
    hub.mirrors = vec![reg.addr.clone()];
    save_login(paths, "index.docker.io", Some(hub)).expect("record docker.io's mirror");
    reg
}
