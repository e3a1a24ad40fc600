//! Volumes through the engine: made, listed and removed here, and mounted by the sandboxes
//! that ask for them (create and fork), one writer or many readers.

use super::*;
use crate::error::VolumeError;
use crate::volumes::VolumeStore;

impl Engine {
    pub(super) async fn create_volume(
        &self,
        r: VolumeCreateRequest,
    ) -> Result<VolumeView, EngineError> {
        self.pinned_here(r.node.as_deref())?;
        let (name, bytes) = r.checked()?;
        let paths = self.paths.clone();
        let mut view = blocking(move || VolumeStore::new(&paths).create(&name, bytes)).await?;
        view.node = self.node.get().cloned();
        Ok(view)
    }

    pub(super) async fn list_volumes(&self) -> Result<Vec<VolumeView>, EngineError> {
        let paths = self.paths.clone();
        let mut all = tokio::task::spawn_blocking(move || VolumeStore::new(&paths).list())
            .await
            .map_err(|e| EngineError::Internal(format!("listing volumes: {e}")))?;
        for v in &mut all {
            v.node = self.node.get().cloned();
        }
        Ok(all)
    }

    pub(super) async fn get_volume(&self, name: &str) -> Result<VolumeView, EngineError> {
        let (paths, name) = (self.paths.clone(), name.to_string());
        let mut view = blocking(move || VolumeStore::new(&paths).get(&name)).await?;
        view.node = self.node.get().cloned();
        Ok(view)
    }

    pub(super) async fn remove_volume(&self, name: &str) -> Result<Deleted, EngineError> {
        let (paths, n) = (self.paths.clone(), name.to_string());
        blocking(move || VolumeStore::new(&paths).remove(&n)).await?;
        Ok(Deleted {
            deleted: name.to_string(),
        })
    }

    /// The volumes copies of `source` mount (see [`for_copies`]), and what they lack of it.
    pub(super) async fn fork_volumes(
        &self,
        source: &str,
        r: &ForkRequest,
    ) -> Result<(Vec<MountedVolume>, Vec<String>), EngineError> {
        let source_volumes = self
            .sandboxes
            .read()
            .await
            .get(source)
            .map(|e| e.sandbox.info().volumes.clone())
            .unwrap_or_default();
        let mut notes = Vec::new();
        let copy_volumes =
            for_copies(&self.paths, &source_volumes, &r.volumes, source, &mut notes)?;
        if r.count > 1 && copy_volumes.iter().any(|v| !v.read_only) {
            return Err(EngineError::BadRequest(format!(
                "{} copies cannot all mount a volume read-write (one writer at a time): ask for it read-only, or for one copy",
                r.count
            )));
        }
        Ok((copy_volumes, notes))
    }

    /// Gives back what a sandbox that is gone held.
    pub(super) fn release_volumes(&self, info: &SandboxInfo) {
        release(&self.paths, info);
    }
}

/// Gives back the volumes sandbox `info` held.
pub(super) fn release(paths: &Paths, info: &SandboxInfo) {
    VolumeStore::new(paths).release(&info.id, info.volumes.iter().map(|v| v.name.as_str()));
}

/// The slots of the volumes a sandbox asks for (in the order asked), checked and found.
pub(super) fn slotted(
    paths: &Paths,
    asked: &[VolumeMount],
) -> Result<Vec<MountedVolume>, EngineError> {
    VolumeMount::check_all(asked)?;
    let store = VolumeStore::new(paths);
    asked
        .iter()
        .enumerate()
        .map(|(slot, m)| {
            store.disk(&m.name).map_err(SandboxError::from)?;
            Ok(MountedVolume {
                name: m.name.clone(),
                path: m.path.clone(),
                read_only: m.read_only,
                slot: slot as u32,
            })
        })
        .collect()
}

/// The volumes copies of a sandbox that has `source` mount: those it has read-only (at their
/// paths) and those the fork asks for; those it has read-write are left out, said in `notes`.
pub(super) fn for_copies(
    paths: &Paths,
    source: &[MountedVolume],
    asked: &[VolumeMount],
    source_id: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<MountedVolume>, EngineError> {
    let mut all: Vec<VolumeMount> = Vec::new();
    for v in source {
        if asked.iter().any(|a| a.name == v.name) {
            continue;
        }
        if v.read_only {
            all.push(VolumeMount {
                name: v.name.clone(),
                path: v.path.clone(),
                read_only: true,
            });
        } else {
            notes.push(format!(
                "volume {} is not in the copies: {source_id} has it read-write, and a volume has one writer at a time",
                v.name
            ));
        }
    }
    all.extend(asked.iter().cloned());
    slotted(paths, &all)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Internal(format!("a volume's task failed: {e}")))?
        .map_err(|e| EngineError::Sandbox(e.into()))
}
