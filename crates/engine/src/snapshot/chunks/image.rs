//! Images as chunks: an image's manifest, and a node's assembly of an image it lacks.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layers::{cached_file_layer, known_file_layer, layer_cache};
use super::{
    bad, free_bytes, io, read_chunk, verify, write_chunk, Chunk, DiskFile, DiskFormat, Hash, Source,
};
use crate::paths::{write_atomic, Paths};
use crate::snapshot::SnapshotError;

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
        crate::tree::discard_tree(&tmp);
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
