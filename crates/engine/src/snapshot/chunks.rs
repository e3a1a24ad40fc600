//! Snapshots as content-addressed chunks, so a node that lacks one fetches only what it does
//! not already hold.
//!
//! A file is cut into 64 KiB regions; a **chunk** is the pages of one region named by a mask
//! (16 bits, one per 4 KiB page) and hashed with BLAKE3 over the mask and those pages. A
//! region whose pages are all zero is left out. A snapshot's [`Manifest`] lists:
//!
//! - its RAM as **layers**, base first: the template's RAM (its non-zero pages), then, for each
//!   generation of saves, the pages the sandbox wrote since it was restored from the layer
//!   below (recorded by the save, see [`Written`]). Each layer's id covers the layers below it,
//!   so a node holding a RAM file whose top id equals layer *k*'s has the first *k* layers and
//!   needs only the chunks of the ones above;
//! - its device state, inline (tens of KiB);
//! - its disk chain, top first: each qcow2 overlay and the base image as one layer of its own.
//!
//! A node assembling a snapshot ([`plan`], then [`assemble`]) copies the longest base it holds,
//! takes every chunk it can from files it holds (read and verified), is given the rest
//! (verified the same way: a chunk whose bytes do not hash to its name is never written), and
//! publishes the snapshot whole or not at all. Disk files it lacks go to `objects/<id>.<ext>`
//! (the id the holder's manifest gives them), rebased onto where their backing file is here;
//! [`sweep_objects`] removes the ones no disk chain goes through any more.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Snapshot, SnapshotError, SnapshotMeta, MEM, META, VMSTATE};
use crate::paths::{write_atomic, Paths};

pub const PAGE: u64 = 4096;
pub const REGION: u64 = 64 * 1024;
const PAGES: u64 = REGION / PAGE;

/// A chunk's name: BLAKE3 of its mask and its pages.
pub type Hash = [u8; 32];

/// The record of what a save wrote on top of its parent's RAM file.
pub const WRITTEN: &str = "written.bin";
/// A snapshot's RAM layers once known (kept beside its RAM file).
pub const LAYERS: &str = "layers.bin";

/// The pages of one region a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub region: u32,
    pub mask: u16,
    pub hash: Hash,
    /// The first region of a qcow2 file: hashed with its backing file's name (and that name's
    /// place) left out, so the same overlay backed by a file elsewhere on another node has the
    /// same chunk (each node writes its own name, see [`normalize_qcow2_head`]).
    #[serde(default)]
    pub qcow2_head: bool,
}

impl Chunk {
    /// Bytes of page data the chunk carries.
    pub fn len(&self) -> usize {
        (self.mask.count_ones() as u64 * PAGE) as usize
    }
    pub fn is_empty(&self) -> bool {
        self.mask == 0
    }
    fn offset(&self) -> u64 {
        u64::from(self.region) * REGION
    }
}

/// A chunk's hash of its mask and data.
pub fn hash(mask: u16, data: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&mask.to_le_bytes());
    h.update(data);
    *h.finalize().as_bytes()
}

/// A chunk's hash as its name says it was made (see [`Chunk::qcow2_head`]).
fn hash_as(mask: u16, qcow2_head: bool, data: &[u8]) -> Hash {
    if !qcow2_head || mask & 1 == 0 {
        return hash(mask, data);
    }
    let mut d = data.to_vec();
    normalize_qcow2_head(&mut d[..PAGE as usize]);
    hash(mask, &d)
}

/// A qcow2 header's first page without what names its backing file: the name's offset and
/// length, and everything from the name on (nothing else lives past it in that page).
pub fn normalize_qcow2_head(page: &mut [u8]) {
    if page.len() < 20 || page[..4] != *b"QFI\xfb" {
        return;
    }
    let off = u64::from_be_bytes(page[8..16].try_into().unwrap_or_default());
    page[8..20].fill(0);
    if off >= 20 && (off as usize) < page.len() {
        page[off as usize..].fill(0);
    }
}

/// Chunks, and an id that names them and every layer below.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    pub id: Hash,
    pub chunks: Vec<Chunk>,
}

impl Layer {
    fn new(below: Option<&Hash>, chunks: Vec<Chunk>) -> Layer {
        let mut h = blake3::Hasher::new();
        h.update(below.unwrap_or(&[0; 32]));
        for c in &chunks {
            h.update(&c.region.to_le_bytes());
            h.update(&c.mask.to_le_bytes());
            h.update(&c.hash);
        }
        Layer {
            id: *h.finalize().as_bytes(),
            chunks,
        }
    }
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskFormat {
    Qcow2,
    Raw,
}

impl DiskFormat {
    fn ext(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
    }
    fn name(self) -> &'static str {
        self.ext()
    }
}

/// One file of a disk chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFile {
    /// Where the holder keeps it (its backing file names it so).
    pub path: PathBuf,
    pub len: u64,
    pub format: DiskFormat,
    pub layer: Layer,
}

/// Everything a node needs to hold a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// `snapshot.json` as the holder has it.
    pub meta: String,
    pub mem_len: u64,
    /// Base first.
    pub mem: Vec<Layer>,
    pub vmstate: Vec<u8>,
    /// Top first; each backed by the next.
    pub disks: Vec<DiskFile>,
}

impl Manifest {
    pub fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        postcard::to_stdvec(self).map_err(|e| bad(format!("encode a manifest: {e}")))
    }
    pub fn decode(bytes: &[u8]) -> Result<Manifest, SnapshotError> {
        postcard::from_bytes(bytes)
            .map_err(|e| bad(format!("a manifest that does not decode: {e}")))
    }
    pub fn meta(&self) -> Result<SnapshotMeta, SnapshotError> {
        serde_json::from_str(&self.meta)
            .map_err(|e| bad(format!("a manifest's snapshot.json: {e}")))
    }
    /// Every chunk it names, each once.
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.mem
            .iter()
            .flat_map(|l| &l.chunks)
            .chain(self.disks.iter().flat_map(|d| &d.layer.chunks))
    }
}

fn bad(why: String) -> SnapshotError {
    SnapshotError::Io {
        what: "a snapshot's chunks".into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let what = what.into();
    move |source| SnapshotError::Io { what, source }
}

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

fn is_zero(page: &[u8]) -> bool {
    // SAFETY: reinterpreting initialised bytes as u64s (align_to keeps the alignment).
    let (head, mid, tail) = unsafe { page.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && mid.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// The chunk of `region` holding the pages of `mask` (the region's bytes in `buf`), or the
/// non-zero ones when `mask` is `None`.
fn chunk_of(region: u64, buf: &[u8], mask: Option<u16>, qcow2: bool) -> Option<(Chunk, Vec<u8>)> {
    let mut m = 0u16;
    let mut data = Vec::new();
    for (i, page) in buf.chunks(PAGE as usize).enumerate() {
        let wanted = match mask {
            Some(mask) => mask & (1 << i) != 0,
            None => !is_zero(page),
        };
        if wanted {
            m |= 1 << i;
            data.extend_from_slice(page);
            data.resize(data.len() + (PAGE as usize - page.len()), 0);
        }
    }
    let head = qcow2 && region == 0;
    (m != 0).then(|| {
        let c = Chunk {
            region: region as u32,
            mask: m,
            hash: hash_as(m, head, &data),
            qcow2_head: head,
        };
        (c, data)
    })
}

/// Reads region `region` of `f` (zeros past its end).
fn read_region(f: &std::fs::File, region: u64, buf: &mut [u8]) -> std::io::Result<()> {
    buf.fill(0);
    let mut at = 0usize;
    while at < buf.len() {
        match f.read_at(&mut buf[at..], region * REGION + at as u64)? {
            0 => break,
            n => at += n,
        }
    }
    Ok(())
}

/// The regions of `f` that hold data (holes skipped), in order.
fn data_regions(f: &std::fs::File, len: u64) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for run in crate::ram::data_extents(f, len)? {
        for r in run.start / REGION..run.end.div_ceil(REGION) {
            if out.last() != Some(&r) {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// A whole file as one layer (its non-zero pages).
pub fn file_layer(path: &Path) -> std::io::Result<(u64, Layer)> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let qcow2 = format_of(path)? == DiskFormat::Qcow2;
    let mut buf = vec![0u8; REGION as usize];
    let mut chunks = Vec::new();
    for r in data_regions(&f, len)? {
        read_region(&f, r, &mut buf)?;
        if let Some((c, _)) = chunk_of(r, &buf, None, qcow2) {
            chunks.push(c);
        }
    }
    Ok((len, Layer::new(None, chunks)))
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
fn layer_cache(paths: &Paths, path: &Path) -> std::io::Result<PathBuf> {
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
fn known_file_layer(paths: &Paths, path: &Path) -> Option<(u64, Layer)> {
    let bytes = std::fs::read(layer_cache(paths, path).ok()?).ok()?;
    postcard::from_bytes(&bytes).ok()
}

/// A file's layer, computed once and kept (see [`layer_cache`]).
fn cached_file_layer(paths: &Paths, path: &Path) -> std::io::Result<(u64, Layer)> {
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

fn mem_layers_depth(
    paths: &Paths,
    snap: &Snapshot,
    depth: usize,
) -> Result<Vec<Layer>, SnapshotError> {
    if let Some(l) = std::fs::read(snap.dir.join(LAYERS))
        .ok()
        .and_then(|b| postcard::from_bytes::<Vec<Layer>>(&b).ok())
    {
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
        None => vec![file_layer(&mem).map_err(io("hash a RAM file"))?.1],
    };
    if let Ok(bytes) = postcard::to_stdvec(&layers) {
        let _ = write_atomic(&snap.dir.join(LAYERS), &bytes);
    }
    Ok(layers)
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

/// The file a qcow2 image is backed by, if any (its header's backing file name, resolved
/// against its directory), and its format.
pub fn backing_of(path: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut f = std::fs::File::open(path)?;
    let mut head = [0u8; 20];
    if f.read(&mut head)? < 20 || head[..4] != *b"QFI\xfb" {
        return Ok(None);
    }
    let off = u64::from_be_bytes(head[8..16].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(head[16..20].try_into().unwrap_or_default());
    if off == 0 || len == 0 || len > 4096 {
        return Ok(None);
    }
    let mut name = vec![0u8; len as usize];
    f.seek(SeekFrom::Start(off))?;
    f.read_exact(&mut name)?;
    let p = PathBuf::from(String::from_utf8_lossy(&name).into_owned());
    Ok(Some(match p.is_absolute() {
        true => p,
        false => path.parent().unwrap_or(Path::new("/")).join(p),
    }))
}

fn format_of(path: &Path) -> std::io::Result<DiskFormat> {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)?.read(&mut head)?;
    Ok(match n == 4 && head == *b"QFI\xfb" {
        true => DiskFormat::Qcow2,
        false => DiskFormat::Raw,
    })
}

/// The disk chain from `top` down to its base image.
pub fn disk_chain(top: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut chain = vec![top.to_path_buf()];
    while let Some(next) = backing_of(chain.last().map(PathBuf::as_path).unwrap_or(top))? {
        if chain.len() > 64 || chain.contains(&next) {
            return Err(std::io::Error::other(format!(
                "the disk chain of {} loops or is too long",
                top.display()
            )));
        }
        chain.push(next);
    }
    Ok(chain)
}

/// The manifest of a snapshot this node holds.
pub fn manifest(paths: &Paths, snap: &Snapshot) -> Result<Manifest, SnapshotError> {
    let meta = std::fs::read_to_string(snap.dir.join(META)).map_err(io("read snapshot.json"))?;
    let mem_len = std::fs::metadata(crate::fastram::resolve(&snap.mem()))
        .map_err(io("read the RAM file's size"))?
        .len();
    let mem = mem_layers(paths, snap)?;
    let vmstate = std::fs::read(snap.vmstate()).map_err(io("read the device state"))?;
    let mut disks = Vec::new();
    for path in disk_chain(&snap.disk()).map_err(io("follow the disk chain"))? {
        let (len, layer) =
            cached_file_layer(paths, &path).map_err(io(format!("hash {}", path.display())))?;
        let format = format_of(&path).map_err(io(format!("read {}", path.display())))?;
        disks.push(DiskFile {
            path,
            len,
            format,
            layer,
        });
    }
    Ok(Manifest {
        meta,
        mem_len,
        mem,
        vmstate,
        disks,
    })
}

/// Where a holder reads a chunk: a file and the chunk as that file's manifest names it.
#[derive(Debug, Clone)]
pub struct Source {
    pub file: PathBuf,
    pub chunk: Chunk,
}

/// Reads a chunk's pages from `file` (not verified).
pub fn read_chunk(file: &Path, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(file)?;
    let mut buf = vec![0u8; REGION as usize];
    read_region(&f, u64::from(chunk.region), &mut buf)?;
    let mut out = Vec::with_capacity(chunk.len());
    for i in 0..PAGES {
        if chunk.mask & (1 << i) != 0 {
            out.extend_from_slice(&buf[(i * PAGE) as usize..((i + 1) * PAGE) as usize]);
        }
    }
    Ok(out)
}

/// Every chunk of `m` by hash, with where this node reads it (a holder's index for serving).
pub fn sources(m: &Manifest, mem: &Path) -> HashMap<Hash, Source> {
    let mut out = HashMap::new();
    // Upper layers win: their pages are the file's.
    for l in m.mem.iter().rev() {
        for c in &l.chunks {
            out.entry(c.hash).or_insert_with(|| Source {
                file: mem.to_path_buf(),
                chunk: *c,
            });
        }
    }
    for d in &m.disks {
        for c in &d.layer.chunks {
            out.entry(c.hash).or_insert_with(|| Source {
                file: d.path.clone(),
                chunk: *c,
            });
        }
    }
    out
}

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

/// `objects/`: disk files made from other nodes' chunks.
pub fn objects_dir(paths: &Paths) -> PathBuf {
    paths.home().join("objects")
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
        for l in layers.iter().rev() {
            for c in &l.chunks {
                index.entry(c.hash).or_insert_with(|| Source {
                    file: mem.clone(),
                    chunk: *c,
                });
            }
        }
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

/// Whether `bytes` are the chunk `c` names.
pub fn verify(c: &Chunk, bytes: &[u8]) -> bool {
    bytes.len() == c.len() && hash_as(c.mask, c.qcow2_head, bytes) == c.hash
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
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

fn write_chunk(f: &std::fs::File, c: &Chunk, bytes: &[u8]) -> std::io::Result<()> {
    let mut at = 0usize;
    for i in 0..PAGES {
        if c.mask & (1 << i) != 0 {
            f.write_all_at(&bytes[at..at + PAGE as usize], c.offset() + i * PAGE)?;
            at += PAGE as usize;
        }
    }
    Ok(())
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
fn rebase(file: &Path, backing: &Path, fmt: DiskFormat) -> Result<(), SnapshotError> {
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
        .join(super::tmp_name().map_err(io("name a snapshot's directory"))?);
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
        if !super::valid_name(&meta.name) {
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
        meta.memory_bytes = super::allocated_bytes(&staged.join(MEM));
        super::publish(staged, &dest, &meta, durable)
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

/// An image as chunks: its small files inline, its root disk as one layer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageManifest {
    pub name: String,
    pub version: u32,
    /// `image.json`, `recipe.toml` and the like: (name, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    pub rootfs: DiskFile,
}

impl ImageManifest {
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
    pub fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        postcard::to_stdvec(self).map_err(|e| bad(format!("encode a manifest: {e}")))
    }
    pub fn decode(bytes: &[u8]) -> Result<ImageManifest, SnapshotError> {
        postcard::from_bytes(bytes)
            .map_err(|e| bad(format!("an image manifest that does not decode: {e}")))
    }
}

/// The manifest of an image this node holds (its root disk's chunks computed once).
/// (`dir`: the image's directory, holding `rootfs.ext4` and its small files.)
pub fn image_manifest(
    paths: &Paths,
    name: &str,
    version: u32,
    dir: &Path,
) -> Result<ImageManifest, SnapshotError> {
    let rootfs = dir.join("rootfs.ext4");
    let (len, layer) =
        cached_file_layer(paths, &rootfs).map_err(io(format!("hash {}", rootfs.display())))?;
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)
        .map_err(io(format!("read {}", dir.display())))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "rootfs.ext4" || !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let bytes = std::fs::read(e.path()).map_err(io(format!("read {}", e.path().display())))?;
        files.push((name, bytes));
    }
    Ok(ImageManifest {
        name: name.to_string(),
        version,
        files,
        rootfs: DiskFile {
            path: rootfs,
            len,
            format: DiskFormat::Raw,
            layer,
        },
    })
}

/// Where each chunk of an image's root disk is read here.
pub fn image_sources(m: &ImageManifest) -> HashMap<Hash, Source> {
    m.rootfs
        .layer
        .chunks
        .iter()
        .map(|c| {
            (
                c.hash,
                Source {
                    file: m.rootfs.path.clone(),
                    chunk: *c,
                },
            )
        })
        .collect()
}

/// What an image's assembly here reads from this node's files and must be given.
#[derive(Debug)]
pub struct ImagePlan {
    pub manifest: ImageManifest,
    pub local: HashMap<Hash, Vec<u8>>,
    pub missing: Vec<Chunk>,
}

/// Decides how to assemble image `m` here: chunks found in the root disks of this node's
/// images (`images`: their root disks; those whose chunks are known already) are read, the
/// rest fetched. Refused when it would not fit.
pub fn plan_image(
    paths: &Paths,
    manifest: ImageManifest,
    images: &[PathBuf],
) -> Result<ImagePlan, SnapshotError> {
    let mut index: HashMap<Hash, Source> = HashMap::new();
    for rootfs in images {
        if let Some((_, layer)) = known_file_layer(paths, rootfs) {
            for c in layer.chunks {
                index.entry(c.hash).or_insert(Source {
                    file: rootfs.clone(),
                    chunk: c,
                });
            }
        }
    }
    let mut local = HashMap::new();
    let mut missing = Vec::new();
    let mut seen = BTreeSet::new();
    for c in &manifest.rootfs.layer.chunks {
        if !seen.insert(c.hash) {
            continue;
        }
        match index
            .get(&c.hash)
            .and_then(|s| read_chunk(&s.file, &s.chunk).ok())
            .filter(|b| verify(c, b))
        {
            Some(b) => {
                local.insert(c.hash, b);
            }
            None => missing.push(*c),
        }
    }
    let need = manifest.rootfs.layer.bytes() + 64 * 1024 * 1024;
    std::fs::create_dir_all(paths.images()).map_err(io("create images/"))?;
    if let Some(free) = free_bytes(&paths.images()).filter(|f| *f < need) {
        return Err(SnapshotError::Io {
            what: format!("bring image {} here", manifest.reference()),
            source: std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "this node's disk has {} MiB free and the image needs {} MiB (and 64 MiB to \
                     spare)",
                    free >> 20,
                    need.div_ceil(1 << 20)
                ),
            ),
        });
    }
    Ok(ImagePlan {
        manifest,
        local,
        missing,
    })
}

/// Assembles image `plan` under `images/NAME/N` from this node's files and `fetched` chunks
/// (verified by the caller); whole or not at all.
pub fn assemble_image(
    paths: &Paths,
    plan: &ImagePlan,
    fetched: &HashMap<Hash, Vec<u8>>,
) -> Result<PathBuf, SnapshotError> {
    let m = &plan.manifest;
    let bad_name = |n: &str| n.is_empty() || n.contains('/') || n.starts_with('.');
    if bad_name(&m.name) || m.files.iter().any(|(n, _)| bad_name(n)) {
        return Err(bad(format!("an image manifest names {:?}", m.name)));
    }
    let parent = paths.images().join(&m.name);
    let dest = parent.join(m.version.to_string());
    if dest.exists() {
        return Ok(dest);
    }
    let tmp = parent.join(format!(".tmp-{}-{}", m.version, std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    let result = (|| {
        let rootfs = tmp.join("rootfs.ext4");
        let f = crate::ram::new_file(&rootfs, m.rootfs.len).map_err(io("create the root disk"))?;
        for c in &m.rootfs.layer.chunks {
            let bytes = plan
                .local
                .get(&c.hash)
                .or_else(|| fetched.get(&c.hash))
                .ok_or_else(|| bad("a chunk of the image was not fetched".into()))?;
            write_chunk(&f, c, bytes).map_err(io("write the root disk"))?;
        }
        f.set_len(m.rootfs.len).map_err(io("size the root disk"))?;
        f.sync_all().map_err(io("sync the root disk"))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o444))
                .map_err(io("make the root disk read-only"))?;
        }
        for (name, bytes) in &m.files {
            write_atomic(&tmp.join(name), bytes).map_err(io(format!("write {name}")))?;
        }
        std::fs::rename(&tmp, &dest).map_err(io(format!("publish {}", dest.display())))
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Its chunks are known (each verified): a snapshot of this image brought later finds them.
    let rootfs = dest.join("rootfs.ext4");
    if let (Ok(cache), Ok(bytes)) = (
        layer_cache(paths, &rootfs),
        postcard::to_stdvec(&(m.rootfs.len, &m.rootfs.layer)),
    ) {
        let _ = write_atomic(&cache, &bytes);
    }
    Ok(dest)
}

/// The files of the disk chain from `top` down, as far as it can be followed (an unreadable
/// header or a loop ends it).
fn chain_files(top: PathBuf) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut at = Some(top);
    while let Some(p) = at.take() {
        if out.contains(&p) {
            break;
        }
        at = backing_of(&p).ok().flatten();
        out.push(p);
    }
    out
}

/// The qcow2 overlays of this home's sandboxes, live (`run/`) and kept for snapshots (`disks/`).
fn sandbox_overlays(paths: &Paths) -> Vec<PathBuf> {
    [paths.disks(), paths.run()]
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|x| x == "qcow2"))
        .collect()
}

/// For each snapshot of this home (by name): the bytes only it holds (its RAM file, device
/// state, and the files of its disk chain no other snapshot, template or sandbox overlay
/// reaches).
pub fn held_alone(paths: &Paths, snaps: &[Snapshot]) -> HashMap<String, u64> {
    let mut users: HashMap<PathBuf, usize> = HashMap::new();
    let mut chains: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let names: BTreeSet<&str> = snaps.iter().map(|s| s.meta.name.as_str()).collect();
    for s in local_snapshots(paths) {
        let chain = chain_files(s.disk());
        for f in &chain {
            *users.entry(f.clone()).or_default() += 1;
        }
        if names.contains(s.meta.name.as_str()) {
            chains.push((s.meta.name.clone(), chain));
        }
    }
    // An overlay reaches the files below it, not itself (a frozen one is a snapshot's own top).
    for o in sandbox_overlays(paths) {
        for p in chain_files(o).into_iter().skip(1) {
            *users.entry(p).or_default() += 1;
        }
    }
    let by_name: HashMap<&str, &Snapshot> =
        snaps.iter().map(|s| (s.meta.name.as_str(), s)).collect();
    chains
        .into_iter()
        .filter_map(|(name, chain)| {
            let s = by_name.get(name.as_str())?;
            let own = super::allocated_bytes(&crate::fastram::resolve(&s.mem()))
                + super::allocated_bytes(&s.vmstate());
            let disks: u64 = chain
                .iter()
                .filter(|f| users.get(*f).copied().unwrap_or(0) <= 1)
                .map(|f| super::allocated_bytes(f))
                .sum();
            Some((name, own + disks))
        })
        .collect()
}

/// Removes `objects/` files no disk chain of this home goes through (snapshots, templates,
/// sandboxes' overlays), and leftovers of assemblies whose process is gone; returns what it
/// removed. An object younger than `min_age` is kept (another process may be assembling the
/// snapshot that will use it); the engine sweeps with none under way and `min_age` zero.
pub fn sweep_objects(paths: &Paths, min_age: std::time::Duration) -> Vec<PathBuf> {
    let dir = objects_dir(paths);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut tops: Vec<PathBuf> = local_snapshots(paths).iter().map(Snapshot::disk).collect();
    tops.extend(sandbox_overlays(paths));
    // Every file a chain reaches is kept, however the chain ends (a file unreadable or a loop
    // ends the walk, never the keeping).
    let used: BTreeSet<PathBuf> = tops.into_iter().flat_map(chain_files).collect();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let keep = match name.strip_prefix(".tmp-") {
            Some(rest) => super::maker_alive(rest),
            None => {
                used.contains(&p)
                    || e.metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age < min_age)
            }
        };
        if !keep && std::fs::remove_file(&p).is_ok() {
            removed.push(p);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_of_zeros_is_no_chunk_and_a_mask_names_its_pages() {
        let buf = vec![0u8; REGION as usize];
        assert!(chunk_of(0, &buf, None, false).is_none());
        let mut buf = buf;
        buf[5 * PAGE as usize] = 7;
        let (c, data) = chunk_of(3, &buf, None, false).unwrap_or_else(|| panic!("a chunk"));
        assert_eq!((c.region, c.mask, data.len()), (3, 1 << 5, PAGE as usize));
        assert!(verify(&c, &data));
        let mut flipped = data.clone();
        flipped[1] ^= 1;
        assert!(!verify(&c, &flipped));
        // A written page of zeros is still carried (it overwrites the layer below).
        let (w, wdata) = chunk_of(3, &buf, Some(0b11), false).unwrap_or_else(|| panic!("a chunk"));
        assert_eq!((w.mask, wdata.len()), (0b11, 2 * PAGE as usize));
    }

    #[test]
    fn a_layers_id_covers_the_layers_below() {
        let c = Chunk {
            region: 1,
            mask: 1,
            hash: [9; 32],
            qcow2_head: false,
        };
        let a = Layer::new(None, vec![c]);
        let b1 = Layer::new(Some(&a.id), vec![c]);
        let b2 = Layer::new(Some(&[1; 32]), vec![c]);
        assert_ne!(b1.id, b2.id);
        assert_ne!(a.id, b1.id);
    }

    #[test]
    fn a_qcow2_overlay_has_the_same_chunks_whatever_its_backing_files_name() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let img = |args: &[&str]| {
            let ok = std::process::Command::new("qemu-img")
                .args(args)
                .current_dir(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "qemu-img {args:?}");
        };
        img(&["create", "-q", "-f", "raw", "base.raw", "8M"]);
        let base = dir.path().join("base.raw");
        let far = dir.path().join("a-much-longer-name-for-the-same-base.raw");
        std::fs::copy(&base, &far).unwrap_or_else(|e| panic!("{e}"));
        let b = base.to_string_lossy().into_owned();
        img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "raw",
            "-b",
            &b,
            "top.qcow2",
        ]);
        let top = dir.path().join("top.qcow2");
        let moved = dir.path().join("moved.qcow2");
        std::fs::copy(&top, &moved).unwrap_or_else(|e| panic!("{e}"));
        rebase(&moved, &far, DiskFormat::Raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(backing_of(&moved).ok().flatten(), Some(far));
        let (l1, l2) = (
            file_layer(&top).unwrap_or_else(|e| panic!("{e}")).1,
            file_layer(&moved).unwrap_or_else(|e| panic!("{e}")).1,
        );
        assert_eq!(l1.id, l2.id);
        assert!(l1.chunks[0].qcow2_head);
        // Its bytes still verify against the name; any other change does not.
        let head = read_chunk(&moved, &l1.chunks[0]).unwrap_or_else(|e| panic!("{e}"));
        assert!(verify(&l1.chunks[0], &head));
        let mut other = head.clone();
        other[100] ^= 1;
        assert!(!verify(&l1.chunks[0], &other));
    }

    #[test]
    fn a_sparse_file_is_chunked_by_its_data_and_rebuilt_exactly() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("f");
        let f = crate::ram::new_file(&p, 10 * REGION + 100).unwrap_or_else(|e| panic!("{e}"));
        f.write_all_at(b"hello", 2 * REGION + 10)
            .unwrap_or_else(|e| panic!("{e}"));
        f.write_all_at(b"tail", 10 * REGION + 96)
            .unwrap_or_else(|e| panic!("{e}"));
        let (len, layer) = file_layer(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(len, 10 * REGION + 100);
        assert_eq!(
            layer.chunks.iter().map(|c| c.region).collect::<Vec<_>>(),
            vec![2, 10]
        );
        let q = dir.path().join("g");
        let g = crate::ram::new_file(&q, len).unwrap_or_else(|e| panic!("{e}"));
        for c in &layer.chunks {
            let bytes = read_chunk(&p, c).unwrap_or_else(|e| panic!("{e}"));
            assert!(verify(c, &bytes));
            write_chunk(&g, c, &bytes).unwrap_or_else(|e| panic!("{e}"));
        }
        // The last page is written whole: the rebuilt file is cut back to the length.
        g.set_len(len).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(std::fs::read(&p).ok(), std::fs::read(&q).ok());
    }
}
