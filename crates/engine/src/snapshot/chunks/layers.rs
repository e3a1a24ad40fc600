//! A snapshot's RAM as layers (the template's pages, then what each save wrote on top), its
//! manifest, and where this node reads each chunk a manifest names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    chunk_of, disk_chain, file_layer, format_of, io, read_region, Chunk, DiskFile, Hash, Layer,
    Manifest, Source, PAGE, PAGES, REGION,
};
use crate::paths::{write_atomic, Paths};
use crate::snapshot::{Snapshot, SnapshotError, META};

/// The record of what a save wrote on top of its parent's RAM file.
pub const WRITTEN: &str = "written.bin";
/// A snapshot's RAM layers once known (kept beside its RAM file).
pub const LAYERS: &str = "layers.bin";

/// Where this node reads chunks, by hash.
pub type Sources = HashMap<Hash, Source>;

/// What a save wrote: the RAM file it started from and the byte ranges written on top of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Written {
    pub parent_mem: PathBuf,
    pub runs: Vec<(u64, u64)>,
}

impl Written {
    /// Bytes of the pages written.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|(s, e)| e - s).sum()
    }

    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = postcard::to_stdvec(self).map_err(std::io::Error::other)?;
        write_atomic(&dir.join(WRITTEN), &bytes)
    }
    /// The record in snapshot directory `dir`, if its save made one.
    pub fn load(dir: &Path) -> Option<Written> {
        postcard::from_bytes(&std::fs::read(dir.join(WRITTEN)).ok()?).ok()
    }
}

/// The layer of the pages `runs` of `mem` (what a save wrote), on top of `below`.
fn written_layer(mem: &Path, runs: &[(u64, u64)], below: &Hash) -> std::io::Result<Layer> {
    let f = std::fs::File::open(mem)?;
    let mut masks: std::collections::BTreeMap<u64, u16> = Default::default();
    for &(start, end) in runs {
        let mut p = start / PAGE;
        while p * PAGE < end {
            *masks.entry(p / PAGES).or_default() |= 1 << (p % PAGES);
            p += 1;
        }
    }
    let masks: Vec<(u64, u16)> = masks.into_iter().collect();
    // Hashed on every core, in order (a save's written pages are what a cross-node fork waits
    // for its holder to name).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = masks.len().div_ceil(threads.max(1)).max(1);
    let parts: Vec<std::io::Result<Vec<Chunk>>> = std::thread::scope(|s| {
        let handles: Vec<_> = masks
            .chunks(per)
            .map(|part| {
                let f = &f;
                s.spawn(move || {
                    let mut buf = vec![0u8; REGION as usize];
                    let mut out = Vec::with_capacity(part.len());
                    for &(r, m) in part {
                        read_region(f, r, &mut buf)?;
                        if let Some((c, _)) = chunk_of(r, &buf, Some(m), false) {
                            out.push(c);
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a hashing thread panicked")))
            })
            .collect()
    });
    let mut chunks = Vec::with_capacity(masks.len());
    for p in parts {
        chunks.extend(p?);
    }
    Ok(Layer::new(Some(below), chunks))
}

/// Where the layer of a file that never changes (an image's disk, a frozen overlay) is kept,
/// keyed by its path, inode, size and modification time.
pub(super) fn layer_cache(paths: &Paths, path: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    let key = blake3::hash(
        format!(
            "chunks-v1\0{}\0{}\0{}\0{}.{}",
            path.display(),
            m.ino(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        )
        .as_bytes(),
    );
    Ok(paths
        .home()
        .join("cache/chunks")
        .join(key.to_hex().as_str()))
}

/// A file's layer if it was computed before (a look-up, never a hash).
pub(super) fn known_file_layer(paths: &Paths, path: &Path) -> Option<(u64, Layer)> {
    let bytes = std::fs::read(layer_cache(paths, path).ok()?).ok()?;
    postcard::from_bytes(&bytes).ok()
}

/// A file's layer, computed once and kept (see [`layer_cache`]).
pub(super) fn cached_file_layer(paths: &Paths, path: &Path) -> std::io::Result<(u64, Layer)> {
    if let Some(l) = known_file_layer(paths, path) {
        return Ok(l);
    }
    let l = file_layer(path)?;
    if let Ok(bytes) = postcard::to_stdvec(&l) {
        let _ = write_atomic(&layer_cache(paths, path)?, &bytes);
    }
    Ok(l)
}

/// The RAM layers of `snap`, computed once and kept (`layers.bin`).
pub fn mem_layers(paths: &Paths, snap: &Snapshot) -> Result<Vec<Layer>, SnapshotError> {
    mem_layers_depth(paths, snap, 0)
}

/// The RAM layers of `snap` if they were computed before (a look-up, never a hash).
fn known_mem_layers(snap: &Snapshot) -> Option<Vec<Layer>> {
    postcard::from_bytes(&std::fs::read(snap.dir.join(LAYERS)).ok()?).ok()
}

fn mem_layers_depth(
    paths: &Paths,
    snap: &Snapshot,
    depth: usize,
) -> Result<Vec<Layer>, SnapshotError> {
    if let Some(l) = known_mem_layers(snap) {
        return Ok(l);
    }
    let mem = crate::fastram::resolve(&snap.mem());
    let parent = Written::load(&snap.dir).and_then(|w| {
        let p = (depth < 64).then(|| holder_of_mem(paths, &w.parent_mem))??;
        Some((p, w))
    });
    let layers = match parent {
        Some((p, w)) => {
            let mut below = mem_layers_depth(paths, &p, depth + 1)?;
            let top = below.last().map(|l| l.id).unwrap_or([0; 32]);
            below.push(written_layer(&mem, &w.runs, &top).map_err(io("hash written pages"))?);
            below
        }
        None => flat_mem_layers(&mem)?,
    };
    keep_mem_layers(snap, &layers);
    Ok(layers)
}

/// A RAM file as one layer of its own (its non-zero pages).
fn flat_mem_layers(mem: &Path) -> Result<Vec<Layer>, SnapshotError> {
    Ok(vec![file_layer(mem).map_err(io("hash a RAM file"))?.1])
}

fn keep_mem_layers(snap: &Snapshot, layers: &[Layer]) {
    if let Ok(bytes) = postcard::to_stdvec(layers) {
        let _ = write_atomic(&snap.dir.join(LAYERS), &bytes);
    }
}

/// Adds to `index` the chunks of RAM layers `layers` (base first) that RAM file `mem` holds as
/// their names say. A chunk of a lower layer is not in the file any more when a layer above it
/// wrote one of its pages (a save writes its pages over its parent's copy): those are read
/// from the file of the layer they belong to, or not at all.
pub(super) fn index_intact(index: &mut Sources, mem: &Path, layers: &[Layer]) {
    let mut above: HashMap<u32, u16> = HashMap::new();
    for l in layers.iter().rev() {
        for c in &l.chunks {
            if above.get(&c.region).copied().unwrap_or(0) & c.mask == 0 {
                index.entry(c.hash).or_insert_with(|| Source {
                    file: mem.to_path_buf(),
                    chunk: *c,
                });
            }
        }
        for c in &l.chunks {
            *above.entry(c.region).or_default() |= c.mask;
        }
    }
}

/// Every RAM chunk this node's snapshots and templates hold intact (see [`index_intact`]),
/// from those whose layers are known.
pub(super) fn local_mem_index(
    paths: &Paths,
    index: &mut Sources,
    fits: impl Fn(&Snapshot) -> bool,
) {
    for s in local_snapshots(paths).iter().filter(|s| fits(s)) {
        if let Some(layers) = known_mem_layers(s) {
            index_intact(index, &crate::fastram::resolve(&s.mem()), &layers);
        }
    }
}

/// Every snapshot and template of this home.
pub fn local_snapshots(paths: &Paths) -> Vec<Snapshot> {
    [paths.snapshots(), paths.templates()]
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Snapshot::load(&e.path()))
        .collect()
}

/// The snapshot or template whose RAM file is `mem`.
fn holder_of_mem(paths: &Paths, mem: &Path) -> Option<Snapshot> {
    local_snapshots(paths)
        .into_iter()
        .find(|s| crate::fastram::resolve(&s.mem()) == mem)
}

/// The manifest of a snapshot this node holds, and where this node reads each chunk it
/// names. Every chunk is readable as named: when a RAM chunk of a lower layer is held by no
/// file here any more (a save wrote over it and the file it came from is gone), the RAM is
/// named as one layer of what its file holds now.
pub fn manifest(paths: &Paths, snap: &Snapshot) -> Result<(Manifest, Sources), SnapshotError> {
    let meta = std::fs::read_to_string(snap.dir.join(META)).map_err(io("read snapshot.json"))?;
    let file = crate::fastram::resolve(&snap.mem());
    let mem_len = std::fs::metadata(&file)
        .map_err(io("read the RAM file's size"))?
        .len();
    let mut mem = mem_layers(paths, snap)?;
    let mut index = Sources::new();
    index_intact(&mut index, &file, &mem);
    if !all_in(&index, &mem) {
        local_mem_index(paths, &mut index, |s| s.dir != snap.dir);
        if !all_in(&index, &mem) {
            tracing::info!(
                "snapshot {}: the RAM file of a layer below its own is gone; naming its RAM \
                 as one layer",
                snap.meta.name
            );
            mem = flat_mem_layers(&file)?;
            keep_mem_layers(snap, &mem);
            index.clear();
            index_intact(&mut index, &file, &mem);
        }
    }
    let vmstate = std::fs::read(snap.vmstate()).map_err(io("read the device state"))?;
    let mut disks = Vec::new();
    for path in disk_chain(&snap.disk()).map_err(io("follow the disk chain"))? {
        let (len, layer) =
            cached_file_layer(paths, &path).map_err(io(format!("hash {}", path.display())))?;
        let format = format_of(&path).map_err(io(format!("read {}", path.display())))?;
        for c in &layer.chunks {
            index.entry(c.hash).or_insert_with(|| Source {
                file: path.clone(),
                chunk: *c,
            });
        }
        disks.push(DiskFile {
            path,
            len,
            format,
            layer,
        });
    }
    let m = Manifest {
        meta,
        mem_len,
        mem,
        vmstate,
        disks,
    };
    Ok((m, index))
}

/// Whether every chunk of `layers` has a source in `index`.
fn all_in(index: &Sources, layers: &[Layer]) -> bool {
    layers
        .iter()
        .flat_map(|l| &l.chunks)
        .all(|c| index.contains_key(&c.hash))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::snapshot::chunks::{read_chunk, verify};

    /// A template's RAM file and a save on top of it that wrote one page of region 2: the
    /// template's chunk of region 2 is no longer in the save's file, and is served from the
    /// template's (the chunks a fresh node fetched from such a holder failed to verify).
    #[test]
    fn a_chunk_a_save_wrote_over_is_read_from_the_file_below() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (base, top) = (dir.path().join("base"), dir.path().join("top"));
        let len = 4 * REGION;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8 | 1).collect();
        std::fs::write(&base, &data).unwrap_or_else(|e| panic!("{e}"));
        let mut saved = data.clone();
        let at = (2 * REGION + PAGE) as usize;
        saved[at..at + PAGE as usize].fill(0xee);
        std::fs::write(&top, &saved).unwrap_or_else(|e| panic!("{e}"));
        let below = file_layer(&base).unwrap_or_else(|e| panic!("{e}")).1;
        let runs = [(at as u64, at as u64 + PAGE)];
        let above = written_layer(&top, &runs, &below.id).unwrap_or_else(|e| panic!("{e}"));
        let layers = vec![below.clone(), above];
        let overwritten = below.chunks[2];
        let stale = read_chunk(&top, &overwritten).unwrap_or_else(|e| panic!("{e}"));
        assert!(!verify(&overwritten, &stale), "the save changed region 2");

        let mut index = Sources::new();
        index_intact(&mut index, &top, &layers);
        assert!(!index.contains_key(&overwritten.hash));
        assert_eq!(index.len(), below.chunks.len());
        index_intact(&mut index, &base, &layers[..1]);
        for c in layers.iter().flat_map(|l| &l.chunks) {
            let s = index.get(&c.hash).unwrap_or_else(|| panic!("no source"));
            let bytes = read_chunk(&s.file, &s.chunk).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                verify(c, &bytes),
                "region {} from {}",
                c.region,
                s.file.display()
            );
        }
        // Rebuilt from the layers in order, the file is the save's.
        let out = dir.path().join("out");
        let f = crate::ram::new_file(&out, len).unwrap_or_else(|e| panic!("{e}"));
        for c in layers.iter().flat_map(|l| &l.chunks) {
            let s = &index[&c.hash];
            let bytes = read_chunk(&s.file, &s.chunk).unwrap_or_else(|e| panic!("{e}"));
            let mut at = 0;
            for i in 0..PAGES {
                if c.mask & (1 << i) != 0 {
                    f.write_all_at(&bytes[at..at + PAGE as usize], c.offset() + i * PAGE)
                        .unwrap_or_else(|e| panic!("{e}"));
                    at += PAGE as usize;
                }
            }
        }
        assert_eq!(std::fs::read(&out).ok(), Some(saved));
    }
}
