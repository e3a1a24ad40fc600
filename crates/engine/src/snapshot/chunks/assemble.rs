//! A node's assembly of a snapshot it lacks: what it copies, reads from its own files and is
//! given, the disk files it makes under `objects/`, and the snapshot published whole.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::layers::{cached_file_layer, index_intact, known_file_layer};
use super::{
    backing_of, bad, disk_chain, free_bytes, io, local_snapshots, mem_layers, objects_dir,
    read_chunk, verify, write_chunk, Chunk, DiskFile, DiskFormat, Hash, Layer, Manifest, Source,
    LAYERS,
};
use crate::paths::{write_atomic, Paths};
use crate::snapshot::{Snapshot, SnapshotError, MEM, VMSTATE};

/// How a node gets a snapshot it lacks: what it copies, what it reads from its own files and
/// what it must be given.
#[derive(Debug)]
pub struct Plan {
    pub manifest: Manifest,
    /// A local RAM file equal to the first `n` layers, and `n`.
    pub base: Option<(PathBuf, usize)>,
    /// For each disk file (top first): a local file with its content, if any.
    pub disks_here: Vec<Option<PathBuf>>,
    /// Chunks read (and verified) from this node's files.
    pub local: HashMap<Hash, Vec<u8>>,
    /// Chunks to fetch, each once.
    pub missing: Vec<Chunk>,
}

impl Plan {
    pub fn missing_bytes(&self) -> u64 {
        self.missing.iter().map(|c| c.len() as u64).sum()
    }
    /// Bytes the assembled files take (RAM data above the base, disk files made here).
    pub fn bytes_written(&self) -> u64 {
        let from = self.base.as_ref().map_or(0, |b| b.1);
        let mem: u64 = self.manifest.mem[from..].iter().map(Layer::bytes).sum();
        let disks: u64 = self
            .manifest
            .disks
            .iter()
            .zip(&self.disks_here)
            .filter(|(_, here)| here.is_none())
            .map(|(d, _)| d.layer.bytes())
            .sum();
        mem + disks
    }
}

/// Ids of each disk file with the files below it (top first): two overlays of the same
/// content on different backing files are different files.
fn chain_ids(disks: &[DiskFile]) -> Vec<Hash> {
    let mut below = [0u8; 32];
    let mut ids: Vec<Hash> = disks
        .iter()
        .rev()
        .map(|d| {
            let mut h = blake3::Hasher::new();
            h.update(&d.layer.id);
            h.update(&below);
            below = *h.finalize().as_bytes();
            below
        })
        .collect();
    ids.reverse();
    ids
}

fn object_path(paths: &Paths, d: &DiskFile, chain_id: &Hash) -> PathBuf {
    objects_dir(paths).join(format!(
        "{}.{}",
        blake3::Hash::from(*chain_id).to_hex(),
        d.format.ext()
    ))
}

/// Whether `path` is one of this home's stores (images, templates, snapshots, disks, objects;
/// any of them may be a link to a store shared by several homes).
fn in_home(paths: &Paths, path: &Path) -> bool {
    let Ok(p) = path.canonicalize() else {
        return false;
    };
    ["images", "templates", "snapshots", "disks", "objects"]
        .iter()
        .filter_map(|s| paths.home().join(s).canonicalize().ok())
        .any(|root| p.starts_with(root))
}

/// For each file of a disk chain (top first), a local file with its content backed by the
/// local file of the one below: the same path when this node keeps it there, else the object
/// made from it earlier.
fn disks_here(paths: &Paths, disks: &[DiskFile], images: &[PathBuf]) -> Vec<Option<PathBuf>> {
    let ids = chain_ids(disks);
    let mut out: Vec<Option<PathBuf>> = vec![None; disks.len()];
    let mut below: Option<PathBuf> = None;
    for i in (0..disks.len()).rev() {
        let d = &disks[i];
        let below_ok = |p: &Path| backing_of(p).ok().flatten() == below;
        let obj = object_path(paths, d, &ids[i]);
        let here = if obj.exists() && below_ok(&obj) {
            Some(obj)
        } else if in_home(paths, &d.path)
            && below_ok(&d.path)
            && cached_file_layer(paths, &d.path)
                .is_ok_and(|(len, l)| len == d.len && l.id == d.layer.id)
        {
            Some(d.path.clone())
        } else if below.is_none() {
            // A base image this node keeps elsewhere (brought here, or built alike).
            images
                .iter()
                .find(|r| {
                    known_file_layer(paths, r)
                        .is_some_and(|(len, l)| len == d.len && l.id == d.layer.id)
                })
                .cloned()
        } else {
            None
        };
        // A file made here sits on the one below as made here: nothing above it is here.
        if here.is_none() {
            return out;
        }
        out[i] = here.clone();
        below = here;
    }
    out
}

/// Decides how to assemble `m` here (see [`Plan`]); `images`: the root disks of this node's
/// images.
pub fn plan(paths: &Paths, manifest: Manifest, images: &[PathBuf]) -> Result<Plan, SnapshotError> {
    let meta = manifest.meta()?;
    // RAM files of the same shape; the one sharing the most layers is the base.
    let mut base: Option<(PathBuf, usize)> = None;
    let mut index: HashMap<Hash, Source> = HashMap::new();
    for s in local_snapshots(paths) {
        if s.meta.memory_mib != meta.memory_mib || s.meta.cpus != meta.cpus {
            continue;
        }
        let Ok(layers) = mem_layers(paths, &s) else {
            continue;
        };
        let mem = crate::fastram::resolve(&s.mem());
        if let Some(top) = layers.last() {
            if let Some(k) = manifest.mem.iter().position(|l| l.id == top.id) {
                if base.as_ref().is_none_or(|b| b.1 < k + 1) {
                    base = Some((mem.clone(), k + 1));
                }
            }
        }
        index_intact(&mut index, &mem, &layers);
    }
    let disks_here = disks_here(paths, &manifest.disks, images);
    for (d, here) in manifest.disks.iter().zip(&disks_here) {
        if let Some(file) = here {
            for c in &d.layer.chunks {
                index.entry(c.hash).or_insert_with(|| Source {
                    file: file.clone(),
                    chunk: *c,
                });
            }
        }
    }
    let from = base.as_ref().map_or(0, |b| b.1);
    let wanted: Vec<&Chunk> = manifest.mem[from..]
        .iter()
        .flat_map(|l| &l.chunks)
        .chain(
            manifest
                .disks
                .iter()
                .zip(&disks_here)
                .filter(|(_, h)| h.is_none())
                .flat_map(|(d, _)| &d.layer.chunks),
        )
        .collect();
    let mut local = HashMap::new();
    let mut missing = Vec::new();
    let mut seen = BTreeSet::new();
    for c in wanted {
        if !seen.insert(c.hash) {
            continue;
        }
        let bytes = index
            .get(&c.hash)
            .and_then(|s| read_chunk(&s.file, &s.chunk).ok())
            .filter(|b| verify(c, b));
        match bytes {
            Some(b) => {
                local.insert(c.hash, b);
            }
            None => missing.push(*c),
        }
    }
    Ok(Plan {
        manifest,
        base,
        disks_here,
        local,
        missing,
    })
}

/// Refuses a plan whose files would not fit this node's disk, saying by how much.
pub fn check_room(paths: &Paths, plan: &Plan) -> Result<(), SnapshotError> {
    let need = plan.bytes_written() + 64 * 1024 * 1024;
    std::fs::create_dir_all(paths.snapshots()).map_err(io("create snapshots/"))?;
    match free_bytes(&paths.snapshots()) {
        Some(free) if free < need => Err(SnapshotError::Io {
            what: format!("assemble snapshot here ({})", paths.home().display()),
            source: std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "this node's disk has {} MiB free and the snapshot needs {} MiB (its RAM and \
                     disk beyond what this node holds, and 64 MiB to spare)",
                    free >> 20,
                    need.div_ceil(1 << 20)
                ),
            ),
        }),
        _ => Ok(()),
    }
}

/// The bytes of chunk `c`: from this node's files or from those fetched (both verified).
fn bytes_of<'a>(
    plan: &'a Plan,
    fetched: &'a HashMap<Hash, Vec<u8>>,
    c: &Chunk,
) -> Result<&'a [u8], SnapshotError> {
    plan.local
        .get(&c.hash)
        .or_else(|| fetched.get(&c.hash))
        .map(Vec::as_slice)
        .ok_or_else(|| {
            bad(format!(
                "chunk {} was not fetched",
                blake3::Hash::from(c.hash).to_hex()
            ))
        })
}

/// Makes the disk files this node lacks under `objects/` (base first, each rebased onto where
/// its backing file is here); returns the top file's path here.
fn assemble_disks(
    paths: &Paths,
    plan: &Plan,
    fetched: &HashMap<Hash, Vec<u8>>,
    made: &mut Vec<PathBuf>,
) -> Result<PathBuf, SnapshotError> {
    let disks = &plan.manifest.disks;
    let ids = chain_ids(disks);
    let mut below: Option<(PathBuf, DiskFormat)> = None;
    for ((d, here), id) in disks.iter().zip(&plan.disks_here).zip(&ids).rev() {
        let path = match here {
            Some(p) => p.clone(),
            None => {
                let dest = object_path(paths, d, id);
                let tmp = objects_dir(paths).join(format!(
                    ".tmp-{}-{}",
                    blake3::Hash::from(*id).to_hex(),
                    std::process::id()
                ));
                std::fs::create_dir_all(objects_dir(paths)).map_err(io("create objects/"))?;
                made.push(tmp.clone());
                let f = crate::ram::new_file(&tmp, d.len)
                    .map_err(io(format!("create {}", tmp.display())))?;
                for c in &d.layer.chunks {
                    write_chunk(&f, c, bytes_of(plan, fetched, c)?)
                        .map_err(io(format!("write {}", tmp.display())))?;
                }
                f.set_len(d.len)
                    .map_err(io(format!("size {}", tmp.display())))?;
                f.sync_all()
                    .map_err(io(format!("sync {}", tmp.display())))?;
                if let (DiskFormat::Qcow2, Some((b, fmt))) = (d.format, &below) {
                    if backing_of(&tmp)
                        .map_err(io("read a qcow2 header"))?
                        .as_ref()
                        != Some(b)
                    {
                        rebase(&tmp, b, *fmt)?;
                    }
                }
                std::fs::rename(&tmp, &dest).map_err(io(format!("publish {}", dest.display())))?;
                made.pop();
                made.push(dest.clone());
                dest
            }
        };
        below = Some((path, d.format));
    }
    below
        .map(|b| b.0)
        .ok_or_else(|| bad("a manifest with no disk".into()))
}

/// Points a qcow2 overlay at a new backing file of the same content (its header only).
pub(super) fn rebase(file: &Path, backing: &Path, fmt: DiskFormat) -> Result<(), SnapshotError> {
    let out = std::process::Command::new("qemu-img")
        .args(["rebase", "-u", "-f", "qcow2", "-F", fmt.name(), "-b"])
        .arg(backing)
        .arg(file)
        .output()
        .map_err(io("run qemu-img rebase"))?;
    if !out.status.success() {
        return Err(bad(format!(
            "qemu-img rebase {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Starts a snapshot's assembly while its chunks are fetched: a `.tmp-` directory under
/// `snapshots/` with the RAM file made and `base` (a RAM file this node holds, see
/// [`Plan::base`]) copied into it. [`assemble`] finishes it; [`discard`] drops it.
pub fn stage(paths: &Paths, base: Option<&Path>, mem_len: u64) -> Result<PathBuf, SnapshotError> {
    let tmp = paths
        .snapshots()
        .join(crate::snapshot::tmp_name().map_err(io("name a snapshot's directory"))?);
    std::fs::create_dir_all(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    let made = (|| {
        let mem = tmp.join(MEM);
        crate::ram::new_file(&mem, mem_len).map_err(io("create the RAM file"))?;
        if let Some(base) = base {
            crate::ram::copy_data(base, &mem, mem_len)
                .map_err(io(format!("copy {}", base.display())))?;
        }
        Ok(())
    })();
    match made {
        Ok(()) => Ok(tmp),
        Err(e) => {
            discard(&tmp);
            Err(e)
        }
    }
}

/// Drops a staged assembly (see [`stage`]).
pub fn discard(staged: &Path) {
    let _ = crate::fastram::remove_snapshot_dir(staged);
}

/// Finishes the snapshot of `plan` staged in `staged` (see [`stage`]), under
/// `snapshots/<name>`, from this node's files and the `fetched` chunks (every one verified by
/// the caller with [`verify`]); whole or not at all (the staged directory goes either way).
pub fn assemble(
    paths: &Paths,
    plan: &Plan,
    fetched: &HashMap<Hash, Vec<u8>>,
    durable: bool,
    staged: &Path,
) -> Result<Snapshot, SnapshotError> {
    let mut made = Vec::new();
    let result = (|| {
        let mut meta = plan.manifest.meta()?;
        if !crate::snapshot::valid_name(&meta.name) {
            return Err(SnapshotError::BadName(meta.name));
        }
        let dest = paths.snapshots().join(&meta.name);
        if dest.exists() {
            return Err(SnapshotError::Exists(meta.name));
        }
        let top = assemble_disks(paths, plan, fetched, &mut made)?;
        disk_chain(&top).map_err(io("check the disk chain made"))?;
        assemble_mem(plan, fetched, staged)?;
        std::fs::write(staged.join(VMSTATE), &plan.manifest.vmstate)
            .map_err(io("write the device state"))?;
        let layers = postcard::to_stdvec(&plan.manifest.mem).map_err(|e| bad(e.to_string()))?;
        write_atomic(&staged.join(LAYERS), &layers).map_err(io("write the RAM layers"))?;
        meta.disk = Some(top);
        meta.disk_dirs = Vec::new();
        meta.memory_bytes = crate::snapshot::allocated_bytes(&staged.join(MEM));
        crate::snapshot::publish(staged, &dest, &meta, durable)
    })();
    if result.is_err() {
        discard(staged);
        for f in made.iter().filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-"))
        }) {
            let _ = std::fs::remove_file(f);
        }
    }
    result
}

fn assemble_mem(
    plan: &Plan,
    fetched: &HashMap<Hash, Vec<u8>>,
    dir: &Path,
) -> Result<(), SnapshotError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEM))
        .map_err(io("open the staged RAM file"))?;
    let from = plan.base.as_ref().map_or(0, |b| b.1);
    for l in &plan.manifest.mem[from..] {
        for c in &l.chunks {
            write_chunk(&f, c, bytes_of(plan, fetched, c)?).map_err(io("write the RAM file"))?;
        }
    }
    f.set_len(plan.manifest.mem_len)
        .map_err(io("size the RAM file"))
}
