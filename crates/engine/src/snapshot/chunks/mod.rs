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

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{SnapshotError, SnapshotMeta};

mod assemble;
mod image;
mod layers;
mod objects;

pub use assemble::{assemble, check_room, discard, plan, stage, Plan};
pub use image::{
    assemble_image, image_manifest, image_sources, plan_image, ImageManifest, ImagePlan,
};
pub use layers::{local_snapshots, manifest, mem_layers, Sources, Written, LAYERS, WRITTEN};
pub use objects::{held_alone, objects_dir, sweep_objects};

pub const PAGE: u64 = 4096;
pub const REGION: u64 = 64 * 1024;
const PAGES: u64 = REGION / PAGE;

/// A chunk's name: BLAKE3 of its mask and its pages.
pub type Hash = [u8; 32];

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

/// Whether `bytes` are the chunk `c` names.
pub fn verify(c: &Chunk, bytes: &[u8]) -> bool {
    bytes.len() == c.len() && hash_as(c.mask, c.qcow2_head, bytes) == c.hash
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
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

#[cfg(test)]
mod tests {
    use super::assemble::rebase;
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
