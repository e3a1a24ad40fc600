//! E2B's code interpreter (`code-interpreter-v1`): the `code-interpreter` image forkbox
//! carries, and forkbox's own code server in it (`forkbox_api::code::SERVER`, the one the
//! daemon's `run_code` starts). The first create of the template makes a sandbox of the
//! image, has the daemon start the server in it (a kernel up), and saves it as a snapshot
//! ([`warm`]); every create is a copy of that snapshot, its server and kernel already
//! running. Its port (49999) is reached as every other port of a sandbox is
//! (`E2b-Sandbox-Port`, or `49999-ID.DOMAIN`).

use crate::errors::Failure;
use crate::E2b;

/// The template name E2B's code interpreter SDKs ask for.
pub const TEMPLATE: &str = "code-interpreter-v1";
/// The image forkbox makes it of.
pub const IMAGE: &str = "code-interpreter";

/// Whether sandboxes of `template` (the alias or the image's name) get the server.
pub fn wanted(template: &str) -> bool {
    template == TEMPLATE || template == IMAGE
}

/// The warm snapshot of one build of image `reference` with this build's server: named by
/// all three, so a new image, the same `NAME@N` built again (its template and disks are new)
/// or a new server makes a new one.
fn warm_name(image: &forkbox_api::ImageView) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(forkbox_api::code::SERVER.as_bytes());
    h.update(image.created_unix.to_be_bytes());
    let hex: String = h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{WARM_PREFIX}{}-{hex}", image.reference.replace('@', "-"))
}

const WARM_PREFIX: &str = "e2b-ci-";

/// Removes the warm snapshots other than `keep` (earlier images, builds or servers). One whose
/// copies still run stays until they end (the daemon refuses while they depend on it).
async fn remove_older(e: &E2b, keep: &str) {
    let Ok(all) = e.daemon.list_snapshots().await else {
        return;
    };
    for s in all
        .iter()
        .filter(|s| s.name.starts_with(WARM_PREFIX) && s.name != keep)
    {
        match e.daemon.delete_snapshot(&s.name).await {
            Ok(_) => tracing::info!("e2b: removed {}, an earlier warm sandbox", s.name),
            Err(err) => tracing::debug!("e2b: {} stays: {err}", s.name),
        }
    }
}

/// Forgets the warm snapshot `name` after the daemon refused to restore it (a disk it stands
/// on is gone), so that the next [`warm`] makes it again.
pub async fn forget(e: &E2b, name: &str, why: &str) {
    tracing::warn!("e2b: {name} cannot be restored ({why}); making the warm sandbox again");
    let _ = e.daemon.delete_snapshot(name).await;
}

/// The warm snapshot of the newest image, when it is made and restores here (else `None`:
/// [`warm`] makes it).
pub async fn made(e: &E2b) -> Option<String> {
    let image = e.daemon.get_image(IMAGE).await.ok()?;
    let name = warm_name(&image);
    restorable(e, &name).await.ok()?.then_some(name)
}

/// Whether the warm snapshot `name` is there and restores here. One saved by another QEMU (the
/// host's QEMU upgraded since, as `forkbox setup` does) never will: it is removed, to be made
/// again.
async fn restorable(e: &E2b, name: &str) -> Result<bool, Failure> {
    let Ok(snap) = e.daemon.get_snapshot(name).await else {
        return Ok(false);
    };
    let ours = e.daemon.info().await?.qemu;
    if ours.as_ref().is_none_or(|q| *q == snap.qemu_version) {
        return Ok(true);
    }
    tracing::info!(
        "e2b: {name} was saved by {} and this daemon runs {}; making it again",
        snap.qemu_version,
        ours.unwrap_or_default()
    );
    let _ = e.daemon.delete_snapshot(name).await;
    Ok(false)
}

/// The name of the snapshot every code interpreter sandbox is a copy of, made first if this
/// daemon has none for the newest image (once, however many creates ask).
pub async fn warm(e: &E2b) -> Result<String, Failure> {
    let image = e.daemon.get_image(IMAGE).await?;
    let name = warm_name(&image);
    if restorable(e, &name).await? {
        return Ok(name);
    }
    let _one = e.warming.lock().await;
    if restorable(e, &name).await? {
        return Ok(name);
    }
    tracing::info!("e2b: making {name}, the code interpreter's warm sandbox");
    let v = e
        .daemon
        .create(&forkbox_api::CreateRequest {
            image: Some(image.reference.clone()),
            ..Default::default()
        })
        .await?;
    let id = v.info.id;
    // Listing its contexts starts the server (and its first kernel) through the daemon.
    let saved = async {
        e.daemon.list_code_contexts(&id).await?;
        let keep = forkbox_api::SnapshotRequest {
            name: Some(name.clone()),
            stay_paused: true,
        };
        e.daemon.snapshot(&id, &keep).await
    }
    .await
    .map_err(Failure::from);
    let _ = e.daemon.delete(&id).await;
    saved?;
    remove_older(e, &name).await;
    Ok(name)
}
