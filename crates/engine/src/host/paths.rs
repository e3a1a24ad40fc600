//! Where forkbox keeps its files.
//!
//! ```text
//! $FORKBOX_HOME (default /var/lib/forkbox as root, else ~/.local/share/forkbox)
//! ├── kernels/<release>/      a Debian cloud kernel package, unpacked (vmlinuz, modules)
//! ├── cache/initramfs/        initramfs per (kernel, agent) pair, content-addressed
//! ├── cache/accel.json        the verdict of the KVM probe for this host
//! ├── cache/packages/         the package cache: its CA (ca.key, 0600) and the registries'
//! │                           responses (store/); removing it loses nothing but time
//! ├── images/<name>/<N>/      immutable images: rootfs.ext4, image.json, recipe.toml
//! ├── templates/<key>/        a booted image saved right after its agent answered: RAM file,
//! │                           device state, disk; what `create` restores (key: image, size,
//! │                           agent, kernel, QEMU)
//! ├── snapshots/<name>/       snapshots of running sandboxes, same layout as templates (their
//! │                           disk is a file under disks/)
//! ├── disks/<sandbox-id>/     a sandbox's disk overlays; kept after it is gone for as long as
//! │                           a snapshot's disk chain goes through them
//! └── run/<sandbox-id>/       one live sandbox: disk overlay, sockets, console log
//! ```

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Paths {
    home: PathBuf,
}

impl Paths {
    /// `$FORKBOX_HOME`, else the default for this user.
    pub fn from_env() -> Paths {
        if let Some(h) = std::env::var_os("FORKBOX_HOME").filter(|h| !h.is_empty()) {
            return Paths::new(h);
        }
        if nix::unistd::geteuid().is_root() {
            return Paths::new("/var/lib/forkbox");
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        Paths::new(base.join("forkbox"))
    }

    pub fn new(home: impl Into<PathBuf>) -> Paths {
        Paths { home: home.into() }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Makes forkbox's home (created if missing) readable by its owner only: it holds every
    /// sandbox's disk, memory and logs. A home that was made looser is tightened; the returned
    /// sentence says so, for the caller to show. A home owned by another user is refused.
    pub fn secure_home(&self) -> std::io::Result<Option<String>> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        // A home made here is private from the start (not made 0755 and then noted).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.home)?;
        let meta = std::fs::metadata(&self.home)?;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "forkbox's home {} belongs to uid {}, not to this user (uid {me}); give it \
                     back (chown {me} {}) or choose another with FORKBOX_HOME",
                    self.home.display(),
                    meta.uid(),
                    self.home.display()
                ),
            ));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 == 0 {
            return Ok(None);
        }
        std::fs::set_permissions(&self.home, std::fs::Permissions::from_mode(0o700))?;
        Ok(Some(format!(
            "forkbox's home {} was mode {mode:04o}, so other local users could read sandboxes' \
             disks and memory; it is now 0700",
            self.home.display()
        )))
    }
    pub fn kernels(&self) -> PathBuf {
        self.home.join("kernels")
    }
    pub fn package_cache(&self) -> PathBuf {
        self.home.join("cache/packages")
    }
    pub fn initramfs_cache(&self) -> PathBuf {
        self.home.join("cache/initramfs")
    }
    pub fn accel_verdict(&self) -> PathBuf {
        self.home.join("cache/accel.json")
    }
    pub fn images(&self) -> PathBuf {
        self.home.join("images")
    }
    pub fn run(&self) -> PathBuf {
        self.home.join("run")
    }
    pub fn templates(&self) -> PathBuf {
        self.home.join("templates")
    }
    pub fn snapshots(&self) -> PathBuf {
        self.home.join("snapshots")
    }
    pub fn disks(&self) -> PathBuf {
        self.home.join("disks")
    }
    /// Volumes: each a directory with its disk, never inside a snapshot.
    pub fn volumes(&self) -> PathBuf {
        self.home.join("volumes")
    }
}

/// Writes a file atomically: a temporary name in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
