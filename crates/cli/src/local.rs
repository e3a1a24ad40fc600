//! The engine in this process, for what the CLI does without a daemon (image builds, lists and
//! removals, the bundled images): the same operations through the same `Engine::call`, so
//! the same failure has the same words and code as over the daemon's API.

use forkbox_engine::api::{ops, BuildProgress, Engine, EngineError, ImageView, Operation};
use forkbox_engine::image::{BuildEvent, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;

/// Carries out `op` on a private engine of `paths` (no pool, nothing recorded for a daemon).
async fn call<O: Operation>(paths: &Paths, op: O) -> Result<O::Reply, EngineError> {
    Engine::private(paths.clone()).call(op).await
}

pub fn list_images(paths: &Paths) -> anyhow::Result<Vec<ImageView>> {
    let rt = crate::daemon::current_thread()?;
    Ok(rt.block_on(call(paths, ops::ListImages {}))?)
}

/// The builds under way in this home (this process's, a daemon's, another CLI's).
pub fn list_builds(paths: &Paths) -> anyhow::Result<Vec<forkbox_engine::api::BuildView>> {
    let rt = crate::daemon::current_thread()?;
    Ok(rt.block_on(call(paths, ops::ListBuilds {}))?)
}

pub fn remove_image(paths: &Paths, reference: &ImageRef) -> anyhow::Result<ImageView> {
    let rt = crate::daemon::current_thread()?;
    let op = ops::RemoveImage {
        reference: reference.clone(),
    };
    Ok(rt.block_on(call(paths, op))?)
}

/// What a build did.
pub struct Built {
    pub image: ImageView,
    /// The newest version already came from this recipe (`if_changed`); nothing was built.
    pub up_to_date: bool,
}

/// What a build is of: the recipe, its text as written (kept with the image), where it came
/// from (for the progress lines).
pub struct Build<'a> {
    pub recipe: Recipe,
    pub source: &'a str,
    pub from: &'a str,
}

/// [`build_image_async`] on a runtime of its own, for callers outside one.
pub fn build_image(
    paths: &Paths,
    b: Build<'_>,
    if_changed: bool,
    quiet: bool,
) -> anyhow::Result<Built> {
    crate::daemon::current_thread()?.block_on(build_image_async(paths, b, if_changed, quiet))
}

/// Builds `b.recipe`, a line on standard error per step and per line of its log unless
/// `quiet`.
pub async fn build_image_async(
    paths: &Paths,
    b: Build<'_>,
    if_changed: bool,
    quiet: bool,
) -> anyhow::Result<Built> {
    let Build {
        recipe,
        source,
        from,
    } = b;
    let next = ImageStore::new(paths).next_version(&recipe.name);
    let (name, from) = (recipe.name.clone(), from.to_string());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BuildProgress>(4096);
    let printer = tokio::spawn(async move {
        let mut print = crate::bundled::printer();
        let mut up_to_date = false;
        let mut announced = false;
        while let Some(ev) = rx.recv().await {
            match ev {
                BuildProgress::UpToDate { .. } => up_to_date = true,
                _ if quiet => {}
                BuildProgress::Step { n, total, what } => {
                    if !announced {
                        eprintln!("forkbox: building {name}@{next} from {from}");
                        announced = true;
                    }
                    print(BuildEvent::Step { n, total, what });
                }
                BuildProgress::Log { line } => print(BuildEvent::Log(line)),
                BuildProgress::Done { .. } | BuildProgress::Error { .. } => {}
            }
        }
        up_to_date
    });
    let op = ops::BuildImage {
        recipe,
        source: Some(source.to_string()),
        if_changed,
        events: Some(tx),
    };
    let result = call(paths, op).await;
    // The command's sender is gone with it: the printer ends after the last event.
    let up_to_date = printer.await.unwrap_or(false);
    Ok(Built {
        image: result?,
        up_to_date,
    })
}
