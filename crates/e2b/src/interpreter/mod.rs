//! E2B's code interpreter (`code-interpreter-v1`): the `code-interpreter` image forkbox
//! carries, and forkbox's own server for it ([`SERVER`], Python on a Jupyter kernel). The
//! first create of the template makes a sandbox of the image, starts the server in it (a
//! kernel up), and saves it as a snapshot ([`warm`]); every create is a copy of that snapshot,
//! its server and kernel already running. Its port (49999) is reached as every other port of
//! a sandbox is (`E2b-Sandbox-Port`, or `49999-ID.DOMAIN`).

use forkbox_api::ExecRequest;

use crate::errors::Failure;
use crate::{guest, E2b};

/// The template name E2B's code interpreter SDKs ask for.
pub const TEMPLATE: &str = "code-interpreter-v1";
/// The image forkbox makes it of.
pub const IMAGE: &str = "code-interpreter";
/// The server, as it is written into the sandbox.
pub const SERVER: &str = include_str!("server.py");
const SERVER_PATH: &str = "/opt/forkbox/ci/server.py";
/// How long a new sandbox's server may take to start its first kernel (TCG is slow).
const START_SECS: u64 = 180;

/// The image a template names: the code interpreter's alias, or the name itself.
pub fn image_for(template: &str) -> &str {
    match template {
        TEMPLATE => IMAGE,
        t => t,
    }
}

/// Whether sandboxes of `template` get the server.
pub fn wanted(template: &str) -> bool {
    image_for(template) == IMAGE
}

/// The warm snapshot of image `reference` with this build's server: named by both, so a new
/// image or a new server makes a new one.
fn warm_name(reference: &str) -> String {
    use sha2::Digest as _;
    let h = sha2::Sha256::digest(SERVER.as_bytes());
    let hex: String = h[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("e2b-ci-{}-{hex}", reference.replace('@', "-"))
}

/// The name of the snapshot every code interpreter sandbox is a copy of, made first if this
/// daemon has none for the newest image (once, however many creates ask).
pub async fn warm(e: &E2b) -> Result<String, Failure> {
    let image = e.daemon.get_image(IMAGE).await?;
    let name = warm_name(&image.reference);
    if e.daemon.get_snapshot(&name).await.is_ok() {
        return Ok(name);
    }
    let _one = e.warming.lock().await;
    if e.daemon.get_snapshot(&name).await.is_ok() {
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
    let saved = match start(e, &id).await {
        Ok(()) => e
            .daemon
            .snapshot(
                &id,
                &forkbox_api::SnapshotRequest {
                    name: Some(name.clone()),
                    stay_paused: true,
                },
            )
            .await
            .map_err(Failure::from),
        Err(f) => Err(f),
    };
    let _ = e.daemon.delete(&id).await;
    saved.map(|_| name)
}

/// Puts the server into sandbox `id` and starts it as the default user; returns once it
/// listens with its first Python kernel ready.
async fn start(e: &E2b, id: &str) -> Result<(), Failure> {
    e.daemon
        .write_file(id, SERVER_PATH, SERVER.as_bytes().to_vec(), 0o644)
        .await?;
    let exec = ExecRequest {
        argv: Some(guest::as_user("", r#"exec python3 "$1""#, &[SERVER_PATH])),
        ..Default::default()
    };
    let wait = e.start_until_ready(id, &exec, |_, err| {
        Failure::new(
            500,
            format!(
                "the code interpreter's server in {id} stopped: {}",
                err.trim()
            ),
        )
    });
    match tokio::time::timeout(std::time::Duration::from_secs(START_SECS), wait).await {
        Ok(r) => r.map(drop),
        Err(_) => Err(Failure::new(
            503,
            format!("the code interpreter's server in {id} did not start within {START_SECS} s"),
        )),
    }
}
