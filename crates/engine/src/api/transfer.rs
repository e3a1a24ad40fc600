//! The engine's side of moving snapshots between nodes (see [`crate::snapshot::chunks`]): a
//! holder's manifests and chunks, a receiver's plan and assembly, and the sweep of disk files
//! made from chunks that nothing uses any more.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Engine, EngineError};
use crate::image::{ImageRef, ImageStore};
use crate::snapshot::chunks::{self, Hash, ImageManifest, ImagePlan, Manifest, Plan, Source};
use crate::snapshot::{SnapshotError, SnapshotMeta, SnapshotStore};

/// Most chunks one request may ask for.
pub const MAX_CHUNKS_PER_CALL: usize = 1024;

/// What a holder has told of its snapshots: where it reads each chunk it named.
#[derive(Default)]
pub struct Served {
    sources: std::sync::Mutex<HashMap<String, Arc<HashMap<Hash, Source>>>>,
}

/// Runs `f` on the blocking pool (it reads, hashes or writes files): its result, or the
/// task's failure as an engine error.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, EngineError>
where
    T: Send + 'static,
    E: Into<EngineError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(EngineError::Snapshot(SnapshotError::Io {
            what: "a snapshot's chunks".into(),
            source: std::io::Error::other(e),
        })),
    }
}

impl Engine {
    /// The root disks of this node's images.
    fn image_roots(&self) -> Vec<std::path::PathBuf> {
        ImageStore::new(&self.paths)
            .list()
            .iter()
            .map(|i| i.rootfs())
            .collect()
    }

    /// The manifest of snapshot `name` (held here), encoded; its chunks can be asked for
    /// from now on.
    pub(super) async fn manifest_of(&self, name: &str) -> Result<Vec<u8>, EngineError> {
        let snap = SnapshotStore::new(&self.paths).get(name)?;
        let paths = self.paths.clone();
        let (m, bytes) = blocking(move || {
            let (m, sources) = chunks::manifest(&paths, &snap)?;
            Ok::<_, SnapshotError>((sources, m.encode()?))
        })
        .await?;
        if let Ok(mut s) = self.served.sources.lock() {
            s.insert(name.to_string(), Arc::new(m));
        }
        Ok(bytes)
    }

    /// The manifest of image `reference` (held here), encoded; its chunks can be asked for
    /// from now on (as those of `image:NAME@N`).
    pub(super) async fn image_manifest_of(
        &self,
        reference: &ImageRef,
    ) -> Result<Vec<u8>, EngineError> {
        let image = ImageStore::new(&self.paths).resolve(reference)?;
        let key = format!("image:{}", image.reference());
        let paths = self.paths.clone();
        let (sources, bytes) = blocking(move || {
            let m =
                chunks::image_manifest(&paths, &image.meta.name, image.meta.version, &image.dir)?;
            Ok::<_, SnapshotError>((chunks::image_sources(&m), m.encode()?))
        })
        .await?;
        if let Ok(mut s) = self.served.sources.lock() {
            s.insert(key, Arc::new(sources));
        }
        Ok(bytes)
    }

    /// How this node would assemble image `manifest`; refused when it would not fit.
    pub(super) async fn plan_image_pull(
        &self,
        manifest: ImageManifest,
    ) -> Result<ImagePlan, EngineError> {
        let paths = self.paths.clone();
        let images = self.image_roots();
        blocking(move || chunks::plan_image(&paths, manifest, &images)).await
    }

    /// Assembles a planned image from this node's files and `fetched` (verified) chunks.
    pub(super) async fn assemble_image(
        &self,
        plan: ImagePlan,
        fetched: HashMap<Hash, Vec<u8>>,
    ) -> Result<super::ImageView, EngineError> {
        let paths = self.paths.clone();
        let reference = plan.manifest.reference();
        blocking(move || chunks::assemble_image(&paths, &plan, &fetched)).await?;
        self.get_image(&reference.parse()?)
    }

    /// The bytes of chunks `hashes` of snapshot `name` (or of `image:NAME@N`), one after
    /// another in that order (as this node's files hold them, not verified here: the receiver
    /// verifies).
    pub(super) async fn chunks_of(
        &self,
        name: &str,
        hashes: Vec<Hash>,
    ) -> Result<Vec<u8>, EngineError> {
        if hashes.len() > MAX_CHUNKS_PER_CALL {
            return Err(EngineError::BadRequest(format!(
                "{} chunks asked at once; at most {MAX_CHUNKS_PER_CALL}",
                hashes.len()
            )));
        }
        let known = self
            .served
            .sources
            .lock()
            .ok()
            .and_then(|s| s.get(name).cloned());
        let sources = match known {
            Some(s) => s,
            None => {
                match name.strip_prefix("image:") {
                    Some(r) => self.image_manifest_of(&r.parse()?).await?,
                    None => self.manifest_of(name).await?,
                };
                self.served
                    .sources
                    .lock()
                    .ok()
                    .and_then(|s| s.get(name).cloned())
                    .unwrap_or_default()
            }
        };
        let name = name.to_string();
        blocking(move || {
            let mut out = Vec::new();
            for h in &hashes {
                let Some(src) = sources.get(h) else {
                    return Err(EngineError::BadRequest(format!(
                        "snapshot {name} has no chunk {}",
                        blake3::Hash::from(*h).to_hex()
                    )));
                };
                let bytes = chunks::read_chunk(&src.file, &src.chunk).map_err(|e| {
                    EngineError::Snapshot(SnapshotError::Io {
                        what: format!("read a chunk of {}", src.file.display()),
                        source: e,
                    })
                })?;
                out.extend_from_slice(&bytes);
            }
            Ok(out)
        })
        .await
    }

    /// How this node would assemble the snapshot of `manifest`: refused at once when it
    /// exists here already or would not fit this node's disk.
    pub(super) async fn plan_pull(&self, manifest: Manifest) -> Result<Plan, EngineError> {
        let paths = self.paths.clone();
        let images = self.image_roots();
        blocking(move || {
            let plan = chunks::plan(&paths, manifest, &images)?;
            chunks::check_room(&paths, &plan)?;
            Ok::<_, SnapshotError>(plan)
        })
        .await
    }

    /// Starts an assembly while the chunks are fetched (see [`chunks::stage`]).
    pub(super) async fn stage(
        &self,
        base: Option<std::path::PathBuf>,
        mem_len: u64,
    ) -> Result<std::path::PathBuf, EngineError> {
        let paths = self.paths.clone();
        blocking(move || chunks::stage(&paths, base.as_deref(), mem_len)).await
    }

    /// Finishes a staged snapshot from this node's files and `fetched` chunks (verified by
    /// the caller); no sweep of `objects/` runs meanwhile.
    pub(super) async fn assemble(
        &self,
        plan: Plan,
        fetched: HashMap<Hash, Vec<u8>>,
        staged: std::path::PathBuf,
    ) -> Result<SnapshotMeta, EngineError> {
        let _held = self.assembling.read().await;
        let paths = self.paths.clone();
        let durable = !plan
            .manifest
            .meta()
            .is_ok_and(|m| m.name.starts_with(super::AUTO_SNAPSHOT));
        let snap =
            blocking(move || chunks::assemble(&paths, &plan, &fetched, durable, &staged)).await?;
        Ok(snap.meta)
    }

    /// Removes the disk files made from chunks that no disk chain here goes through.
    pub(super) async fn sweep_objects(&self) {
        let _alone = self.assembling.write().await;
        let paths = self.paths.clone();
        if let Ok(removed) = tokio::task::spawn_blocking(move || {
            chunks::sweep_objects(&paths, std::time::Duration::ZERO)
        })
        .await
        {
            for f in removed {
                tracing::info!("removed {} (no disk chain uses it)", f.display());
            }
        }
    }
}
