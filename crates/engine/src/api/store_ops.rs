//! Operations on what the daemon stores besides sandboxes (images) and on one sandbox's files,
//! and the daemon's own description.

use tokio::sync::mpsc;

use super::*;
use crate::files::TransferError;
use crate::image::{ImageStore, Recipe};
use forkbox_protocol::ExecSpec;

/// Runs a build on a blocking thread, its events to `events` (a slow reader loses log lines,
/// never the build), ending with `done`.
async fn built(
    events: Option<mpsc::Sender<BuildProgress>>,
    build: impl FnOnce(
            &mut dyn FnMut(crate::image::BuildEvent),
        ) -> Result<crate::image::Image, crate::error::ImageError>
        + Send
        + 'static,
) -> Result<ImageView, EngineError> {
    let done = events.clone();
    let img = tokio::task::spawn_blocking(move || {
        let mut send = |ev: crate::image::BuildEvent| {
            let Some(tx) = &events else { return };
            let ev = match ev {
                crate::image::BuildEvent::Step { n, total, what } => {
                    BuildProgress::Step { n, total, what }
                }
                crate::image::BuildEvent::Log(line) => BuildProgress::Log { line },
            };
            let _ = tx.try_send(ev);
        };
        build(&mut send)
    })
    .await
    .map_err(|e| EngineError::Internal(format!("the build's task failed: {e}")))??;
    let view = ImageView::from(&img);
    if let Some(tx) = done {
        let _ = tx
            .send(BuildProgress::Done {
                image: view.clone(),
            })
            .await;
    }
    Ok(view)
}

impl Engine {
    pub(super) fn list_images(&self) -> Vec<ImageView> {
        ImageStore::new(&self.paths)
            .list()
            .iter()
            .map(ImageView::from)
            .collect()
    }

    pub(super) fn list_builds(&self) -> Vec<forkbox_api::BuildView> {
        crate::image::progress::under_way(&self.paths)
            .into_iter()
            .map(|u| forkbox_api::BuildView {
                seconds: u.seconds(),
                name: u.name,
                step: u.step,
                total: u.total,
                what: u.what,
                started_unix: u.started_unix,
            })
            .collect()
    }

    pub(super) fn get_image(&self, r: &ImageRef) -> Result<ImageView, EngineError> {
        Ok(ImageView::from(&ImageStore::new(&self.paths).resolve(r)?))
    }

    pub(super) async fn remove_image(&self, r: &ImageRef) -> Result<ImageView, EngineError> {
        // The pool's ready copies are no one's sandboxes: they go, not the removal.
        let pooled = self.pool.drain_image(&r.to_string()).await;
        if pooled > 0 {
            tracing::info!("{r}: stopped {pooled} pooled sandbox(es) to remove the image");
        }
        let paths = self.paths.clone();
        let r = r.clone();
        let removed = tokio::task::spawn_blocking(move || {
            crate::runstate::sweep(&paths);
            ImageStore::new(&paths).remove(&r, &crate::runstate::live(&paths))
        })
        .await
        .map_err(|e| EngineError::Internal(format!("the removal's task failed: {e}")))??;
        Ok(ImageView::from(&removed))
    }

    /// Builds an image, sending its progress to `events`, ending with `done` or `up_to_date`
    /// (a client that stops reading does not stop the build); the image, or the reason it
    /// could not be built.
    pub(super) async fn build_image(
        &self,
        recipe: Recipe,
        source: Option<String>,
        if_changed: bool,
        events: Option<mpsc::Sender<BuildProgress>>,
    ) -> Result<ImageView, EngineError> {
        if if_changed {
            if let Some(img) = up_to_date(&self.paths, &recipe) {
                return Ok(up_to_date_view(&img, events.as_ref()).await);
            }
        }
        let paths = self.paths.clone();
        built(events, move |send| {
            let text = source.unwrap_or_else(|| recipe.to_toml());
            crate::image::build(&paths, &recipe, &text, send)
        })
        .await
    }

    /// Builds an image from a Dockerfile and its context's archive, its progress as
    /// [`build_image`](Self::build_image)'s.
    pub(super) async fn build_dockerfile(
        &self,
        op: super::ops::BuildDockerfile,
    ) -> Result<ImageView, EngineError> {
        let paths = self.paths.clone();
        let super::ops::BuildDockerfile {
            name,
            dockerfile,
            context,
            args,
            if_changed,
            events,
        } = op;
        // What the build is made of, read once (the context's files: off the async threads):
        // compared with the newest version's when asked, recorded by the build.
        let (p, n, d, c, a) = (
            paths.clone(),
            name.clone(),
            dockerfile.clone(),
            context.clone(),
            args.clone(),
        );
        let inputs = tokio::task::spawn_blocking(move || {
            let req = crate::image::DockerBuild {
                name: &n,
                dockerfile: &d,
                context: crate::image::Context::Archive(&c),
                args: a,
            };
            crate::image::inputs_of(&p, &req)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("the build's digest task failed: {e}")))??;
        if if_changed {
            if let Some(img) = crate::image::inputs::same_as_newest(&paths, &name, &inputs) {
                return Ok(up_to_date_view(&img, events.as_ref()).await);
            }
        }
        built(events, move |send| {
            let req = crate::image::DockerBuild {
                name: &name,
                dockerfile: &dockerfile,
                context: crate::image::Context::Archive(&context),
                args,
            };
            crate::image::build_dockerfile_of(&paths, &req, inputs, send)
        })
        .await
    }

    pub(super) async fn read_file(
        &self,
        id: &str,
        path: &GuestPath,
    ) -> Result<Vec<u8>, EngineError> {
        let sb = self.sandbox(id).await?;
        let data = sb
            .client()
            .read_file(path.as_str())
            .await
            .map_err(TransferError::from)?;
        self.metrics.bytes_downloaded.inc_by(data.len() as u64);
        Ok(data)
    }

    pub(super) async fn write_file(
        &self,
        id: &str,
        path: &GuestPath,
        data: &[u8],
        mode: u32,
    ) -> Result<Written, EngineError> {
        if mode > 0o7777 {
            return Err(EngineError::BadRequest(format!(
                "mode {mode:o} is not a file mode (0 to 7777 octal)"
            )));
        }
        let sb = self.sandbox(id).await?;
        sb.client()
            .write_file(path.as_str(), data, mode)
            .await
            .map_err(TransferError::from)?;
        self.metrics.bytes_uploaded.inc_by(data.len() as u64);
        Ok(Written {
            path: path.to_string(),
            bytes: data.len() as u64,
        })
    }

    /// Lists a directory with the guest's own `find` (one fixed program, names NUL-separated),
    /// so that no name can be mistaken for another.
    pub(super) async fn list_dir(
        &self,
        id: &str,
        path: &GuestPath,
    ) -> Result<DirListing, EngineError> {
        const SCRIPT: &str = r#"if [ ! -e "$1" ]; then echo "no such file or directory: $1" >&2; exit 3; fi
if [ ! -d "$1" ]; then echo "not a directory: $1" >&2; exit 4; fi
find -H "$1" -mindepth 1 -maxdepth 1 -printf '%y\t%s\t%m\t%T@\t%P\0' | head -z -n "$2""#;
        let sb = self.sandbox(id).await?;
        let out = sb
            .run(ExecSpec {
                program: forkbox_protocol::Program::Argv(vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    SCRIPT.into(),
                    "sh".into(),
                    path.to_string(),
                    (MAX_DIR_ENTRIES + 1).to_string(),
                ]),
                cwd: None,
                env: vec![],
                timeout_ms: Some(60_000),
                stdin: false,
                tty: None,
                user: None,
            })
            .await?;
        let refused = |kind, out: &crate::client::Output| {
            EngineError::Transfer(TransferError::Agent(crate::error::AgentError::Refused {
                kind,
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }))
        };
        match out.code() {
            0 => {}
            3 => return Err(refused(forkbox_protocol::ErrorKind::NotFound, &out)),
            4 => return Err(refused(forkbox_protocol::ErrorKind::InvalidRequest, &out)),
            _ => return Err(refused(forkbox_protocol::ErrorKind::Io, &out)),
        }
        let mut entries: Vec<DirEntry> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .filter_map(parse_entry)
            .collect();
        let truncated = entries.len() > MAX_DIR_ENTRIES;
        entries.truncate(MAX_DIR_ENTRIES);
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(DirListing {
            path: path.to_string(),
            entries,
            truncated,
        })
    }

    pub(super) async fn put_archive(
        &self,
        id: &str,
        path: &str,
        format: ArchiveFormat,
        chunks: mpsc::Receiver<Vec<u8>>,
    ) -> Result<Unpacked, EngineError> {
        let sb = self.sandbox(id).await?;
        let chunks = match format {
            ArchiveFormat::TarZst => chunks,
            ArchiveFormat::TarGz => crate::files::gzip_to_zstd(chunks),
        };
        let bytes = crate::files::put_archive(sb.client(), path, chunks).await?;
        self.metrics.bytes_uploaded.inc_by(bytes);
        Ok(Unpacked { bytes })
    }

    /// The archive's chunks, counted as they go.
    pub(super) async fn get_archive(
        &self,
        id: &str,
        path: &str,
        format: ArchiveFormat,
    ) -> Result<mpsc::Receiver<Result<Vec<u8>, crate::error::AgentError>>, EngineError> {
        let sb = self.sandbox(id).await?;
        let rx = crate::files::get_archive(sb.client(), path).await?;
        let mut rx = match format {
            ArchiveFormat::TarZst => rx,
            ArchiveFormat::TarGz => crate::files::zstd_to_gzip(rx),
        };
        let (tx, out) = mpsc::channel(8);
        let counter = self.metrics.bytes_downloaded.clone();
        tokio::spawn(async move {
            while let Some(item) = rx.recv().await {
                if let Ok(chunk) = &item {
                    counter.inc_by(chunk.len() as u64);
                }
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        Ok(out)
    }

    pub(super) async fn info(&self) -> InfoView {
        let accel = crate::vm::host_decision(&self.paths, crate::vm::AccelChoice::Auto)
            .await
            .ok()
            .flatten();
        InfoView {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: forkbox_protocol::PROTOCOL_VERSION,
            home: self.paths.home().display().to_string(),
            accel,
            kernels: crate::kernel::Kernel::installed(&self.paths)
                .into_iter()
                .map(|k| k.release)
                .collect(),
            images: ImageStore::new(&self.paths)
                .list()
                .iter()
                .map(|i| i.reference())
                .collect(),
            sandboxes: self.sandboxes.read().await.len() + self.sleepers.read().await.len(),
            pool: self.pool.view(),
            node: self.node().map(str::to_string),
            qemu: Some(crate::snapshot::qemu_version()),
        }
    }
}

/// The row of `img`, found up to date, said to `events` as `up_to_date`.
async fn up_to_date_view(
    img: &crate::image::Image,
    events: Option<&mpsc::Sender<BuildProgress>>,
) -> ImageView {
    let view = ImageView::from(img);
    if let Some(tx) = events {
        let _ = tx
            .send(BuildProgress::UpToDate {
                image: view.clone(),
            })
            .await;
    }
    view
}

/// The newest image of the recipe's name when it was built from this very recipe (a base
/// image compared as the version it resolves to now).
pub fn up_to_date(paths: &Paths, recipe: &Recipe) -> Option<crate::image::Image> {
    let store = ImageStore::new(paths);
    let newest = store
        .resolve(&ImageRef {
            name: recipe.name.clone(),
            version: None,
        })
        .ok()?;
    let mut wanted = recipe.clone();
    if let Some(base) = &recipe.base {
        wanted.base = Some(store.resolve(&base.parse().ok()?).ok()?.reference());
    }
    (newest.meta.recipe == wanted).then_some(newest)
}

/// One `find -printf '%y\t%s\t%m\t%T@\t%P'` record.
fn parse_entry(record: &[u8]) -> Option<DirEntry> {
    let text = String::from_utf8_lossy(record);
    let mut f = text.splitn(5, '\t');
    let kind = match f.next()? {
        "f" => EntryKind::File,
        "d" => EntryKind::Dir,
        "l" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let size = f.next()?.parse().ok()?;
    let mode = u32::from_str_radix(f.next()?, 8).ok()?;
    let modified_unix = f.next()?.parse().ok()?;
    let name = f.next()?.to_string();
    Some(DirEntry {
        name,
        kind,
        size,
        mode,
        modified_unix,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn find_records_parse_and_names_keep_tabs() {
        let e = parse_entry(b"f\t12\t644\t1700000000.5\ta\tb").unwrap();
        assert_eq!(e.name, "a\tb");
        assert_eq!((e.kind, e.size, e.mode), (EntryKind::File, 12, 0o644));
        assert!(parse_entry(b"garbage").is_none());
    }

    #[test]
    fn guest_paths_are_checked_once() {
        assert_eq!(GuestPath::parse("x/y").unwrap().as_str(), "/root/x/y");
        assert_eq!(
            GuestPath::parse("/etc/os-release").unwrap().as_str(),
            "/etc/os-release"
        );
        assert!(GuestPath::parse("").is_err());
        assert!(GuestPath::parse("a\0b").is_err());
    }
}
