//! Templates a newer one replaced. A template's key names everything it was made from (the
//! image's build, the agent and kernel, the warm-up, the kernel's command line), so a forkbox
//! upgraded, or an image rebuilt under its version, makes a new template beside the old one;
//! nothing would ever start from the old one again, and each holds ~120 MB of disk (more in
//! RAM files). When a template is made, the ones it replaces go: those of the same image, size,
//! process cap, QEMU and accelerator (a template of another QEMU or accelerator is not
//! replaced: both may be in use on one host) that no disk of this home stands on (a sandbox's
//! overlay, a snapshot's or a hibernation's disk chain).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{Snapshot, SnapshotMeta};
use crate::paths::Paths;

/// Removes the templates `made` replaces that nothing stands on; returns what it removed.
pub fn retire_replaced(paths: &Paths, made: &SnapshotMeta) -> Vec<PathBuf> {
    let root = paths.templates();
    let replaced: Vec<Snapshot> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Snapshot::load(&e.path()))
        .filter(|t| replaces(made, &t.meta))
        .collect();
    if replaced.is_empty() {
        return Vec::new();
    }
    let used = used_files(paths);
    let mut removed = Vec::new();
    for t in replaced {
        if used.iter().any(|f| f.starts_with(&t.dir)) || named_as_parent(paths, &t.meta.name) {
            continue;
        }
        if super::fastram::remove_snapshot_dir(&t.dir).is_ok() {
            let _ = std::fs::remove_file(root.join(format!(".{}.lock", t.meta.name)));
            removed.push(t.dir);
        }
    }
    removed
}

/// Whether `old` is a template that `made` replaces: the same image, size, process cap, QEMU
/// and accelerator, another key.
fn replaces(made: &SnapshotMeta, old: &SnapshotMeta) -> bool {
    old.kind == super::SnapshotKind::Template
        && old.name != made.name
        && old.image == made.image
        && old.cpus == made.cpus
        && old.memory_mib == made.memory_mib
        && old.max_procs == made.max_procs
        && old.qemu_version == made.qemu_version
        && old.accel.accel == made.accel.accel
}

/// Every file a disk of this home reads through its backing chain: the overlays of sandboxes
/// (`run/`), the disks of snapshots and hibernations (`snapshots/`, `disks/`).
fn used_files(paths: &Paths) -> BTreeSet<PathBuf> {
    let mut used = BTreeSet::new();
    for root in [paths.run(), paths.snapshots(), paths.disks()] {
        for dir in subdirs(&root) {
            for f in regular_files(&dir) {
                used.extend(crate::vm::jail::backing_chain(&f));
            }
        }
    }
    used
}

/// Whether a snapshot of this home names `template` as what it was copied from (its disk
/// stands on the template's even where its chain could not be read).
fn named_as_parent(paths: &Paths, template: &str) -> bool {
    subdirs(&paths.snapshots())
        .iter()
        .filter_map(|d| Snapshot::load(d))
        .any(|s| s.meta.parent.as_deref() == Some(template))
}

fn subdirs(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Regular files only (never a socket or a FIFO, which an open could wait on).
fn regular_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn template(paths: &Paths, name: &str, qemu: &str) -> SnapshotMeta {
        let dir = paths.templates().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let meta: SnapshotMeta = serde_json::from_value(serde_json::json!({
            "name": name, "kind": "template", "image": "py@1",
            "kernel_path": "/k", "initramfs_path": "/i",
            "accel": {"accel": "tcg", "reason": ""},
            "cpus": 1, "memory_mib": 1024, "max_procs": 4096, "qemu_version": qemu,
            "parent": null, "from_sandbox": null, "created_unix": 1,
            "pause_ms": null, "took_ms": 1, "memory_bytes": 0,
        }))
        .unwrap();
        std::fs::write(
            dir.join(super::super::META),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        for f in [super::super::MEM, super::super::VMSTATE] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let disk = dir.join(super::super::DISK);
        qcow2(&disk, None);
        std::fs::write(paths.templates().join(format!(".{name}.lock")), b"").unwrap();
        meta
    }

    /// A qcow2 header (version 3) naming `backing`, as `backing_chain` reads it.
    fn qcow2(path: &Path, backing: Option<&Path>) {
        let mut h = vec![0u8; 512];
        h[..4].copy_from_slice(b"QFI\xfb");
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        if let Some(b) = backing {
            let name = b.as_os_str().as_encoded_bytes();
            h[8..16].copy_from_slice(&112u64.to_be_bytes());
            h[16..20].copy_from_slice(&(name.len() as u32).to_be_bytes());
            h[112..112 + name.len()].copy_from_slice(name);
        }
        std::fs::write(path, h).unwrap();
    }

    /// The templates a new one replaces go unless a sandbox's overlay or a snapshot stands on
    /// them; another QEMU's template stays.
    #[test]
    fn replaced_templates_go_unless_a_disk_stands_on_them() {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let q10 = "QEMU 10";
        let old = template(&paths, "py-1-c1-m1024-aaaa", q10);
        let in_use = template(&paths, "py-1-c1-m1024-bbbb", q10);
        let parent = template(&paths, "py-1-c1-m1024-cccc", q10);
        let other_qemu = template(&paths, "py-1-c1-m1024-dddd", "QEMU 7.2");
        let run = paths.run().join("sb1");
        std::fs::create_dir_all(&run).unwrap();
        qcow2(
            &run.join("disk.qcow2"),
            Some(&paths.templates().join(&in_use.name).join("disk.qcow2")),
        );
        let snap = paths.snapshots().join("s1");
        std::fs::create_dir_all(&snap).unwrap();
        let mut meta = parent.clone();
        meta.name = "s1".into();
        meta.kind = crate::snapshot::SnapshotKind::Snapshot;
        meta.parent = Some(parent.name.clone());
        std::fs::write(
            snap.join("snapshot.json"),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        for f in ["mem", "vmstate"] {
            std::fs::write(snap.join(f), b"x").unwrap();
        }
        qcow2(&snap.join("disk.qcow2"), None);
        let made = template(&paths, "py-1-c1-m1024-eeee", q10);
        let removed = retire_replaced(&paths, &made);
        let t = paths.templates();
        assert_eq!(removed, vec![t.join(&old.name)]);
        assert!(!t.join(&old.name).exists());
        assert!(!t.join(format!(".{}.lock", old.name)).exists());
        for kept in [&in_use, &parent, &other_qemu, &made] {
            assert!(
                t.join(&kept.name).join("disk.qcow2").exists(),
                "{}",
                kept.name
            );
        }
    }
}
