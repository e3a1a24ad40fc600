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

/// The warm snapshot of image `reference` with this build's server: named by both, so a new
/// image or a new server makes a new one.
fn warm_name(reference: &str) -> String {
    use sha2::Digest as _;
    let h = sha2::Sha256::digest(forkbox_api::code::SERVER.as_bytes());
    let hex: String = h[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("e2b-ci-{}-{hex}", reference.replace('@', "-"))
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
    let name = warm_name(&image.reference);
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
    saved.map(|_| name)
}
