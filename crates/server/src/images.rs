//! Images: the list, one image, its removal, and builds from a recipe or from a Dockerfile
//! with its context, each an operation of the engine.

use super::*;

/// How the build contexts kept in the home's `tmp` are named.
const CONTEXT_PREFIX: &str = ".context-";

/// Outside a cluster nothing builds on the daemon's own account (the CLI builds a carried image
/// itself, with its progress); a cluster's node answers this in its routing
/// (`cluster::routing`).
#[utoipa::path(get, path = "/v1/cluster/builds/{name}", params(("name" = String, Path, description = "a carried image's name"), ("from" = Option<usize>, Query, description = "the first line wanted")), responses((status = 200, body = BuildLogView), (status = 404, description = "no build of it under way or ended on a node", body = ErrorBody)))]
pub(crate) async fn build_log(UrlPath(name): UrlPath<String>) -> Response {
    refusal(
        forkbox_engine::api::Code::ImageNotFound,
        format!(
            "no build of image {name} here: this daemon is not a cluster's node (outside a \
             cluster the CLI builds a carried image itself)"
        ),
    )
}

/// The builds under way in this home: the daemon's own (an E2B template's first build, a
/// build through this API) and those of a CLI of the same home.
#[utoipa::path(get, path = "/v1/builds", responses((status = 200, body = Vec<BuildView>)))]
pub(crate) async fn list_builds(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::list_builds, _>(&e, ops::ListBuilds {}, StatusCode::OK).await
}

#[utoipa::path(get, path = "/v1/images", responses((status = 200, body = Vec<ImageView>)))]
pub(crate) async fn list_images(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::list_images, _>(&e, ops::ListImages {}, StatusCode::OK).await
}

pub(crate) fn image_ref(r: &str) -> Result<forkbox_engine::image::ImageRef, ApiError> {
    r.parse()
        .map_err(|e: forkbox_engine::error::ImageError| ApiError(e.into()))
}

#[utoipa::path(get, path = "/v1/images/{reference}", params(("reference" = String, Path, description = "NAME (the newest) or NAME@N")), responses((status = 200, body = ImageView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_image(State(e): State<Arc<Engine>>, UrlPath(r): UrlPath<String>) -> Api {
    let reference = image_ref(&r)?;
    answer::<reply::get_image, _>(&e, ops::GetImage { reference }, StatusCode::OK).await
}

#[utoipa::path(delete, path = "/v1/images/{reference}", params(("reference" = String, Path, description = "NAME@N")), responses((status = 200, description = "the removed image", body = ImageView), (status = 404, body = ErrorBody), (status = 409, description = "in use", body = ErrorBody)))]
pub(crate) async fn remove_image(State(e): State<Arc<Engine>>, UrlPath(r): UrlPath<String>) -> Api {
    let reference = image_ref(&r)?;
    answer::<reply::remove_image, _>(&e, ops::RemoveImage { reference }, StatusCode::OK).await
}

/// Builds an image; the answer is newline-delimited JSON [`BuildProgress`] events, the last of
/// which is `done`, `up_to_date` or `error`. A bad recipe is refused before anything starts.
/// The build goes on if the client leaves.
#[utoipa::path(post, path = "/v1/images", request_body = BuildRequest, responses((status = 200, description = "NDJSON progress, one BuildProgress a line, ending with done, up_to_date or error", body = BuildProgress, content_type = "application/x-ndjson"), (status = 400, description = "the body does not parse, or the recipe is not valid", body = ErrorBody)))]
pub(crate) async fn build_image(
    State(e): State<Arc<Engine>>,
    Body(request): Body<BuildRequest>,
) -> Api {
    let recipe = forkbox_engine::api::build_recipe(&request)?;
    let if_changed = request.if_changed;
    Ok(streamed(e, (), move |events| ops::BuildImage {
        recipe,
        source: None,
        if_changed,
        events,
    }))
}

/// Builds an image from a Dockerfile: the body is the build context as tar.zst (plain files,
/// directories and links with relative names), the Dockerfile in it; the answer is
/// newline-delimited JSON [`BuildProgress`] events as a recipe build's. Every instruction runs
/// in a sandbox, never on the host. The build goes on if the client leaves.
#[utoipa::path(post, path = "/v1/images/dockerfile", params(("name" = String, Query, description = "the image's name (its next version is built)"), ("dockerfile" = Option<String>, Query, description = "the Dockerfile's path in the context (default Dockerfile)"), ("arg" = Option<Vec<String>>, Query, description = "a build argument NAME=VALUE, once for each"), ("if_changed" = Option<bool>, Query, description = "build only if the newest version of the name was made of other inputs (the Dockerfile, the arguments, the context's files, the forkbox images it names); otherwise answer up_to_date with it")), request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the build context, tar.zst"), responses((status = 200, description = "NDJSON progress, one BuildProgress a line, ending with done or error", body = BuildProgress, content_type = "application/x-ndjson"), (status = 400, description = "no name, a bad argument, or no Dockerfile in the context", body = ErrorBody)))]
pub(crate) async fn build_dockerfile(
    State(e): State<Arc<Engine>>,
    uri: axum::http::Uri,
    body: axum::body::Body,
) -> Api {
    let DockerfileQuery {
        name,
        file,
        args,
        if_changed,
    } = dockerfile_query(uri.query().unwrap_or(""))?;
    // The context goes to a file of the home's first: the build reads the Dockerfile from it
    // before anything starts, and unpacks it (each entry checked) into its own directory.
    let dir = e.paths().home().join("tmp");
    let context = tempfile_in(&dir)?;
    let size = write_body(body, context.path()).await?;
    tracing::info!("image {name}: a Dockerfile build with a {size}-byte context");
    let text = dockerfile_in(context.path(), &file).await?;
    let path = context.path().to_path_buf();
    Ok(streamed(e, context, move |events| ops::BuildDockerfile {
        name,
        dockerfile: text,
        context: path,
        args,
        if_changed,
        events,
    }))
}

/// Runs the build `op` makes with its events' sender, answering its progress as
/// newline-delimited JSON; an error ends it as an `error` event. `keep` (a context's file)
/// lives until the build ends; the build goes on if the client leaves.
fn streamed<O, K>(
    e: Arc<Engine>,
    keep: K,
    op: impl FnOnce(Option<tokio::sync::mpsc::Sender<BuildProgress>>) -> O,
) -> Response
where
    O: forkbox_engine::api::Operation<Reply = forkbox_engine::api::ImageView>,
    K: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<BuildProgress>(1024);
    let op = op(Some(tx.clone()));
    tokio::spawn(async move {
        if let Err(err) = e.call(op).await {
            let _ = tx
                .send(BuildProgress::Error {
                    status: err.http_status(),
                    code: err.code().as_str().into(),
                    message: err.to_string(),
                })
                .await;
        }
        drop(keep);
    });
    ndjson(rx)
}

fn bad(message: String) -> ApiError {
    ApiError(forkbox_engine::api::EngineError::BadRequest(message))
}

/// A Dockerfile build's query (`arg` may come many times, which a struct cannot take).
struct DockerfileQuery {
    name: String,
    /// The Dockerfile's path in the context.
    file: String,
    args: std::collections::BTreeMap<String, String>,
    if_changed: bool,
}

fn dockerfile_query(query: &str) -> Result<DockerfileQuery, ApiError> {
    let (mut name, mut file, mut args) = (None, None, std::collections::BTreeMap::new());
    let mut if_changed = false;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "name" => name = Some(v.into_owned()),
            "dockerfile" => file = Some(v.into_owned()),
            "arg" => {
                let (a, b) = v
                    .split_once('=')
                    .ok_or_else(|| bad(format!("build argument {v:?} is not NAME=VALUE")))?;
                args.insert(a.to_string(), b.to_string());
            }
            "if_changed" => {
                if_changed = match &*v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(bad(format!("if_changed={v:?}: true or false"))),
                }
            }
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?} (name, dockerfile, arg, if_changed)"
                )))
            }
        }
    }
    let name = name.ok_or_else(|| bad("give the image's name: ?name=NAME".into()))?;
    Ok(DockerfileQuery {
        name,
        file: file.unwrap_or_else(|| "Dockerfile".into()),
        args,
        if_changed,
    })
}

fn tempfile_in(dir: &std::path::Path) -> Result<tempfile::NamedTempFile, ApiError> {
    std::fs::create_dir_all(dir)
        .and_then(|()| {
            tempfile::Builder::new()
                .prefix(CONTEXT_PREFIX)
                .tempfile_in(dir)
        })
        .map_err(|e| {
            ApiError(forkbox_engine::api::EngineError::Internal(format!(
                "keep the build context in {}: {e}",
                dir.display()
            )))
        })
}

/// Writes a request's body to `path`; its size.
async fn write_body(body: axum::body::Body, path: &std::path::Path) -> Result<u64, ApiError> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let io = |e: std::io::Error| {
        ApiError(forkbox_engine::api::EngineError::Internal(format!(
            "keep the build context: {e}"
        )))
    };
    let mut f = tokio::fs::File::create(path).await.map_err(io)?;
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| bad(format!("the build context did not arrive whole: {e}")))?;
        size += chunk.len() as u64;
        f.write_all(&chunk).await.map_err(io)?;
    }
    f.flush().await.map_err(io)?;
    Ok(size)
}

/// The text of the Dockerfile at `file` in the context archive at `archive`.
async fn dockerfile_in(archive: &std::path::Path, file: &str) -> Result<String, ApiError> {
    let (archive, want) = (
        archive.to_path_buf(),
        file.trim_start_matches("./").to_string(),
    );
    let found = tokio::task::spawn_blocking(move || -> std::io::Result<Option<String>> {
        let f = std::fs::File::open(archive)?;
        let mut tar = tar::Archive::new(zstd::Decoder::new(std::io::BufReader::new(f))?);
        for entry in tar.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.into_owned();
            let rel = path.strip_prefix("./").unwrap_or(&path);
            if rel == std::path::Path::new(&want) && entry.header().entry_type().is_file() {
                let mut text = String::new();
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(&mut entry, 1 << 20),
                    &mut text,
                )?;
                return Ok(Some(text));
            }
        }
        Ok(None)
    })
    .await
    .map_err(|e| {
        ApiError(forkbox_engine::api::EngineError::Internal(format!(
            "read the build context: {e}"
        )))
    })?
    .map_err(|e| bad(format!("the build context is not a tar.zst: {e}")))?;
    found.ok_or_else(|| {
        bad(format!(
            "the build context has no file {file:?} (give its path with ?dockerfile=PATH)"
        ))
    })
}

/// Build contexts a killed daemon left in the home's `tmp` (only the home's one daemon writes
/// them, and it has just started); a line for each removed.
pub(crate) fn sweep_contexts(paths: &forkbox_engine::paths::Paths) -> Vec<String> {
    let dir = paths.home().join("tmp");
    std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(CONTEXT_PREFIX))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            std::fs::remove_file(e.path()).ok()?;
            Some(format!(
                "removed {} (a killed build's context)",
                e.path().display()
            ))
        })
        .collect()
}
