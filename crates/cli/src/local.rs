//! The engine in this process, for what the CLI does without a daemon (image builds, lists and
//! removals, the bundled images): the same [`Command`]s through the same `Engine::handle`, so
//! the same failure has the same words and code as over the daemon's API.

use forkbox_engine::api::{BuildProgress, Command, Engine, EngineError, ImageView, Reply};
use forkbox_engine::image::{BuildEvent, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;

/// Runs `cmd` on a private engine of `paths` (no pool, nothing recorded for a daemon).
async fn handle(paths: &Paths, cmd: Command) -> Result<Reply, EngineError> {
    Engine::private(paths.clone()).handle(cmd).await
}

fn image_of(reply: Reply) -> Result<ImageView, EngineError> {
    match reply {
        Reply::Image(v) => Ok(v),
        _ => Err(EngineError::Internal(
            "the engine answered an image command with another kind of reply".into(),
        )),
    }
}

pub fn list_images(paths: &Paths) -> anyhow::Result<Vec<ImageView>> {
    let rt = crate::daemon::current_thread()?;
    match rt.block_on(handle(paths, Command::ListImages))? {
        Reply::Images(v) => Ok(v),
        _ => Err(EngineError::Internal(
            "the engine answered a list of images with another kind of reply".into(),
        )
        .into()),
    }
}

pub fn remove_image(paths: &Paths, reference: &ImageRef) -> anyhow::Result<ImageView> {
    let rt = crate::daemon::current_thread()?;
    let cmd = Command::RemoveImage {
        reference: reference.clone(),
    };
    Ok(image_of(rt.block_on(handle(paths, cmd))?)?)
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
    let cmd = Command::BuildImage {
        recipe,
        source: Some(source.to_string()),
        if_changed,
        events: Some(tx),
    };
    let result = handle(paths, cmd).await.and_then(image_of);
    // The command's sender is gone with it: the printer ends after the last event.
    let up_to_date = printer.await.unwrap_or(false);
    Ok(Built {
        image: result?,
        up_to_date,
    })
}
