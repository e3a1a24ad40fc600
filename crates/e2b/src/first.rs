//! A template's first preparation, in the background: its image built from forkbox's recipe
//! and, for the code interpreter, its warm sandbox made. It starts at the daemon's start for
//! the templates [`Options::prebuild`](crate::Options) names, or at the first create that needs
//! it. A create waits for it up to [`Options::create_wait`](crate::Options) (30 s by default,
//! well inside the SDKs' 60 s request timeout), then
//! answers at once with E2B's error body saying what is under way, how far it is and how long it
//! has taken; the same create made again later finds the template ready. A failed preparation
//! is said to the creates waiting on it, and the next create starts it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::errors::Failure;
use crate::{control, interpreter, E2b};

type Outcome = Option<Result<(), Failure>>;

struct Under {
    started: Instant,
    done: watch::Receiver<Outcome>,
}

/// The preparations under way, by template.
#[derive(Default)]
pub(crate) struct Firsts {
    under: Mutex<HashMap<String, Under>>,
}

/// The image a template is built as.
fn image_of(template: &str) -> &str {
    if interpreter::wanted(template) {
        interpreter::IMAGE
    } else {
        template
    }
}

/// Whether `template` needs nothing more before a create (the code interpreter's warm
/// snapshot stands on its image).
async fn prepared(e: &E2b, template: &str) -> bool {
    if interpreter::wanted(template) {
        return interpreter::made(e).await.is_some();
    }
    e.daemon.get_image(template).await.is_ok()
}

async fn prepare(e: &E2b, template: &str) -> Result<(), Failure> {
    let image = image_of(template);
    control::ensure_built(e, &e.daemon, image, "not built yet").await?;
    if interpreter::wanted(template) {
        interpreter::warm(e).await?;
    }
    Ok(())
}

/// The preparation of `template` under way, started now unless it already was.
fn start(e: &Arc<E2b>, template: &str) -> (Instant, watch::Receiver<Outcome>) {
    let mut under = e.firsts.under.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(u) = under.get(template) {
        return (u.started, u.done.clone());
    }
    let (tx, rx) = watch::channel(None);
    let started = Instant::now();
    under.insert(
        template.to_string(),
        Under {
            started,
            done: rx.clone(),
        },
    );
    let (e, template) = (e.clone(), template.to_string());
    tokio::spawn(async move {
        tracing::info!("e2b: preparing template {template} (its first build)");
        let outcome = prepare(&e, &template).await;
        if let Err(f) = &outcome {
            tracing::warn!(
                "e2b: template {template} could not be prepared: {}",
                f.message
            );
        }
        // Gone from the table before it is said: a create after a failure starts again.
        e.firsts
            .under
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&template);
        let _ = tx.send(Some(outcome));
    });
    (started, rx)
}

/// Waits until `template` is ready for a create: at once when it is, else for its first
/// preparation (started here unless under way) up to `e.create_wait`; past that, E2B's error body
/// saying how far it is (503: the SDK raises it, and a create later succeeds).
pub(crate) async fn ready(e: &E2b, template: &str) -> Result<(), Failure> {
    if prepared(e, template).await {
        return Ok(());
    }
    let me =
        e.me.upgrade()
            .ok_or_else(|| Failure::new(503, "the daemon is stopping"))?;
    let (started, mut done) = start(&me, template);
    // The outcome taken out of the channel's guard before anything else is awaited.
    let waited = tokio::time::timeout(e.create_wait, done.wait_for(Option::is_some))
        .await
        .map(|r| r.map(|outcome| outcome.clone()));
    match waited {
        Ok(Ok(outcome)) => outcome.unwrap_or(Ok(())),
        Ok(Err(_)) => Err(Failure::new(
            500,
            format!("the preparation of template {template} ended without an outcome"),
        )),
        Err(_) => Err(under_way(e, template, started).await),
    }
}

/// What a create is told while `template`'s first preparation runs.
async fn under_way(e: &E2b, template: &str, started: Instant) -> Failure {
    let image = image_of(template);
    let build = e
        .daemon
        .list_builds()
        .await
        .ok()
        .and_then(|b| b.into_iter().find(|b| b.name == image));
    let doing = match build {
        Some(b) => format!(
            "its image {image} is being built from forkbox's recipe, {}",
            b.summary()
        ),
        None => format!(
            "it is being prepared (the code interpreter's warm sandbox: a boot and its server's \
             start; {})",
            forkbox_api::so_far(started.elapsed().as_secs())
        ),
    };
    Failure::new(
        503,
        format!(
            "template {template} is not ready yet on this forkbox: {doing}. A first build \
             takes minutes (more under TCG); create it again then. `forkbox image ls` shows \
             how far it is; `forkbox setup --e2b` builds E2B's templates ahead"
        ),
    )
}

/// At the daemon's start: prepares each of `templates` this home does not have yet, one after
/// another, as the first create of each would. Waits for the daemon to answer first.
pub(crate) async fn prebuild(e: Arc<E2b>, templates: Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while e.daemon.info().await.is_err() {
        if Instant::now() > deadline {
            tracing::warn!("e2b: the daemon did not answer; no template is built ahead");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for template in templates {
        if prepared(&e, &template).await {
            continue;
        }
        eprintln!(
            "forkbox: E2B's template {template} is not built in this home; building it now, in \
             the background (`forkbox image ls` shows how far it is; --e2b-prebuild none \
             builds nothing ahead)"
        );
        let (_, mut done) = start(&e, &template);
        if let Ok(Some(Err(f))) = done.wait_for(Option::is_some).await.map(|o| o.clone()) {
            eprintln!(
                "forkbox: E2B's template {template} could not be built: {}",
                f.message
            );
        }
    }
}
