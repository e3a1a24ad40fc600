//! The image recipes that ship inside forkbox, so its default image builds itself on first use
//! wherever the binary was installed.

use forkbox_engine::image::{bundled, BuildEvent, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;

/// The recipe of the carried image `reference` names when this home has no version of it yet
/// and the reference names none.
fn unbuilt(paths: &Paths, reference: &ImageRef) -> Option<&'static str> {
    if reference.version.is_some() || ImageStore::new(paths).resolve(reference).is_ok() {
        return None;
    }
    bundled::recipe(&reference.name)
}

/// [`ensure`] on a runtime of its own, for callers outside one.
pub fn ensure_blocking(paths: &Paths, reference: &ImageRef, quiet: bool) -> anyhow::Result<()> {
    crate::daemon::current_thread()?.block_on(ensure(paths, reference, quiet))
}

/// Builds the image `reference` names from forkbox's own recipe when the store has no version
/// of it yet and the reference names no version; says what it does on standard error unless
/// `quiet`.
pub async fn ensure(paths: &Paths, reference: &ImageRef, quiet: bool) -> anyhow::Result<()> {
    let Some(text) = unbuilt(paths, reference) else {
        return Ok(());
    };
    let recipe = Recipe::parse(text).map_err(anyhow::Error::msg)?;
    if !quiet {
        eprintln!(
            "forkbox: image {} is not built yet; building it from forkbox's own recipe (once, a minute or two)",
            reference.name
        );
    }
    let build = crate::local::Build {
        recipe,
        source: text,
        from: "forkbox's recipe",
    };
    crate::local::build_image_async(paths, build, false, quiet).await?;
    Ok(())
}

/// [`ensure`] before a create through this host's daemon, unless that daemon is a cluster's
/// node: a cluster builds a carried image itself, once, on the node the create is placed on
/// (which then serves it to the others), so it is not built here beside it. True when the
/// cluster may build it (see [`with_cluster_build`]).
pub async fn ensure_for(
    paths: &Paths,
    daemon: &forkbox_client::Client,
    reference: &ImageRef,
) -> anyhow::Result<bool> {
    if unbuilt(paths, reference).is_none() {
        return Ok(false);
    }
    match daemon.info().await?.node {
        Some(node) => {
            eprintln!(
                "forkbox: image {} is not built here (node {node}); the cluster builds it from \
                 forkbox's own recipe on the node the sandbox is placed on, once, unless a node \
                 holds it already (a minute or two)",
                reference.name
            );
            Ok(true)
        }
        None => ensure(paths, reference, false).await.map(|()| false),
    }
}

/// Runs `work` (a create through a cluster's node) and meanwhile prints the progress of image
/// `image`'s first build in the cluster, from whichever node builds it, in [`printer`]'s lines.
pub async fn with_cluster_build<T>(
    daemon: &forkbox_client::Client,
    image: &str,
    work: impl std::future::Future<Output = T>,
) -> T {
    let follow = async {
        let (mut from, mut said) = (0, false);
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let Ok(Some(v)) = daemon.build_log(image, from).await else {
                continue;
            };
            if !said {
                eprintln!("forkbox: node {} builds image {image}:", v.node);
                said = true;
            }
            for line in &v.lines {
                eprintln!("{line}");
            }
            from = v.next;
            if v.done {
                return;
            }
        }
    };
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => r,
        // The build ended: what is left is the create's own wait.
        () = follow => work.await,
    }
}

/// A build's progress on standard error: a line per step (with the time since the start) and
/// per line of its log.
pub fn printer() -> impl FnMut(BuildEvent) {
    let started = std::time::Instant::now();
    move |ev: BuildEvent| eprintln!("{}", ev.line(started.elapsed().as_secs_f64()))
}
