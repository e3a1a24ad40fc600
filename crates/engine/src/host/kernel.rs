//! Guest kernels (Debian's cloud kernel, unpacked into forkbox's home) and the initramfs that
//! carries the guest agent and the few modules it needs.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cpio::CpioWriter;
use crate::error::SetupError;
use crate::paths::{write_atomic, Paths};

/// Modules the agent loads, in the order the kernel needs them (dependencies are added first).
/// The cloud kernel builds virtio drivers as modules; ext4 is built in.
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_console", "virtio_rng"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub release: String,
    pub dir: PathBuf,
}

impl Kernel {
    pub fn vmlinuz(&self) -> PathBuf {
        self.dir.join(format!("boot/vmlinuz-{}", self.release))
    }

    fn modules_root(&self) -> PathBuf {
        self.dir.join("lib/modules").join(&self.release)
    }

    /// The kernel with this release, if it is installed in forkbox's home.
    pub fn find(paths: &Paths, release: &str) -> Option<Kernel> {
        let k = Kernel {
            release: release.to_string(),
            dir: paths.kernels().join(release),
        };
        k.vmlinuz().is_file().then_some(k)
    }

    /// Installed kernels, newest (by version order of the release string) last.
    pub fn installed(paths: &Paths) -> Vec<Kernel> {
        let mut out: Vec<Kernel> = fs::read_dir(paths.kernels())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Kernel::find(paths, &e.file_name().to_string_lossy()))
            .collect();
        out.sort_by(|a, b| version_cmp(&a.release, &b.release));
        out
    }

    pub fn newest(paths: &Paths) -> Result<Kernel, SetupError> {
        Kernel::installed(paths)
            .pop()
            .ok_or_else(|| SetupError::NoKernel {
                dir: paths.kernels(),
            })
    }

    /// The module files for `wanted` and everything they depend on, dependencies first.
    pub fn module_files(&self, wanted: &[&str]) -> Result<Vec<PathBuf>, SetupError> {
        let mut index = BTreeMap::new();
        index_modules(&self.modules_root(), &mut index);
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        for w in wanted {
            visit(&norm(w), &index, &mut seen, &mut order, &self.release)?;
        }
        Ok(order)
    }
}

fn norm(name: &str) -> String {
    name.replace('-', "_")
}

fn index_modules(dir: &Path, index: &mut BTreeMap<String, PathBuf>) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            index_modules(&p, index);
        } else if let Some(stem) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko"))
        {
            index.insert(norm(stem), p);
        }
    }
}

fn visit(
    name: &str,
    index: &BTreeMap<String, PathBuf>,
    seen: &mut HashSet<String>,
    order: &mut Vec<PathBuf>,
    release: &str,
) -> Result<(), SetupError> {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let Some(path) = index.get(name) else {
        // Built into the kernel (no .ko): nothing to load.
        return Ok(());
    };
    let data = fs::read(path).map_err(|e| SetupError::io(format!("read {}", path.display()), e))?;
    for dep in modinfo_depends(&data).map_err(|m| SetupError::BadKernel {
        release: release.into(),
        message: format!("{}: {m}", path.display()),
    })? {
        visit(&norm(&dep), index, seen, order, release)?;
    }
    order.push(path.clone());
    Ok(())
}

/// The `depends=` list of a kernel module, read from its `.modinfo` ELF section.
pub fn modinfo_depends(ko: &[u8]) -> Result<Vec<String>, String> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(ko).map_err(|e| format!("not an ELF module: {e}"))?;
    let section = file
        .section_by_name(".modinfo")
        .ok_or("no .modinfo section")?;
    let data = section.data().map_err(|e| e.to_string())?;
    Ok(data
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .filter_map(|kv| kv.strip_prefix("depends="))
        .flat_map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect())
}

/// Compares release strings like `6.1.0-57-cloud-amd64` numerically where they are numbers.
fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |s: &str| -> Vec<(u64, String)> {
        s.split(|c: char| !c.is_ascii_alphanumeric())
            .map(|p| (p.parse::<u64>().unwrap_or(0), p.to_string()))
            .collect()
    };
    parts(a).cmp(&parts(b))
}

/// Builds (or finds in the cache) the initramfs for this kernel and agent binary.
pub fn initramfs(paths: &Paths, kernel: &Kernel, agent: &[u8]) -> Result<PathBuf, SetupError> {
    // The key is what determines the content: the kernel (its modules are fixed per release),
    // the module list, and the agent. Resolving module files walks the kernel's module tree, so
    // it happens only when the initramfs is built, not on every sandbox start.
    let mut h = Sha256::new();
    h.update(kernel.release.as_bytes());
    h.update(GUEST_MODULES.join(",").as_bytes());
    h.update(agent);
    let digest: String = h
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = paths
        .initramfs_cache()
        .join(format!("{}-{digest}.cpio", kernel.release));
    if path.is_file() {
        return Ok(path);
    }
    let modules = kernel.module_files(GUEST_MODULES)?;
    let mut w = CpioWriter::new(Vec::with_capacity(agent.len() + (1 << 20)));
    let io = |e| SetupError::io("write initramfs".to_string(), e);
    for d in [
        "dev",
        "proc",
        "sys",
        "newroot",
        "forkbox",
        "forkbox/modules",
    ] {
        w.dir(d, 0o755).map_err(io)?;
    }
    w.char_dev("dev/console", 0o600, 5, 1).map_err(io)?;
    w.file("init", 0o755, agent).map_err(io)?;
    for (i, m) in modules.iter().enumerate() {
        let data = fs::read(m).map_err(|e| SetupError::io(format!("read {}", m.display()), e))?;
        let name = m
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        w.file(&format!("forkbox/modules/{i:02}-{name}"), 0o644, &data)
            .map_err(io)?;
    }
    let bytes = w.finish().map_err(io)?;
    write_atomic(&path, &bytes)
        .map_err(|e| SetupError::io(format!("write {}", path.display()), e))?;
    // Older initramfs files of this kernel (earlier agents) are not used again. QEMU reads
    // the initramfs at start, so removing one that a running VM was started with is safe.
    let prefix = format!("{}-", kernel.release);
    for e in fs::read_dir(paths.initramfs_cache())
        .into_iter()
        .flatten()
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) && n.ends_with(".cpio") && e.path() != path {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn release_order_is_numeric() {
        let mut v = vec![
            "6.1.0-9-cloud-amd64",
            "6.1.0-57-cloud-amd64",
            "6.1.0-10-cloud-amd64",
        ];
        v.sort_by(|a, b| version_cmp(a, b));
        assert_eq!(
            v,
            [
                "6.1.0-9-cloud-amd64",
                "6.1.0-10-cloud-amd64",
                "6.1.0-57-cloud-amd64"
            ]
        );
    }

    #[test]
    fn modinfo_of_non_elf_is_an_error() {
        assert!(modinfo_depends(b"not elf").is_err());
    }
}
