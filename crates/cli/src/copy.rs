//! `forkbox sandbox upload` and `download`: a directory as one tar.zst stream, a single file
//! (up to the API's 64 MiB for one file) as it is, as `docker cp` and `kubectl cp` take both.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use forkbox_client::Client;

use crate::daemon::show;

/// Copies host directory or file `host` to `guest` in sandbox `id`.
pub async fn upload(
    c: &Client,
    id: &str,
    host: &Path,
    guest: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let meta = std::fs::metadata(host)
        .with_context(|| format!("{} cannot be read on the host", host.display()))?;
    if !meta.is_file() {
        let v = c.upload_dir(id, host, guest).await?;
        return show(json, &v, || {
            println!(
                "uploaded {} to {id}:{guest} ({} bytes compressed)",
                host.display(),
                v.bytes
            )
        });
    }
    let max = forkbox_engine::api::MAX_FILE_BYTES as u64;
    anyhow::ensure!(
        meta.len() <= max,
        "{} is {} bytes, over the {} MiB one file may carry: put it in a directory and upload that",
        host.display(),
        meta.len(),
        max >> 20
    );
    let dest = file_destination(c, id, host, guest).await?;
    let data = std::fs::read(host).with_context(|| format!("read {}", host.display()))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let n = data.len();
    c.write_file(id, &dest, data, mode).await?;
    show(
        json,
        &serde_json::json!({ "bytes": n, "path": dest }),
        || println!("uploaded {} to {id}:{dest} ({n} bytes)", host.display()),
    )
}

/// Where a file uploaded to `guest` goes: into it when it is a directory in the sandbox, else
/// at that path (a new file, or the file there replaced).
async fn file_destination(
    c: &Client,
    id: &str,
    host: &Path,
    guest: &str,
) -> anyhow::Result<String> {
    let name = host
        .file_name()
        .and_then(|n| n.to_str())
        .context("the file's name is not UTF-8")?;
    let inside = format!("{}/{name}", guest.trim_end_matches('/'));
    if guest.ends_with('/') {
        return Ok(inside);
    }
    match c.list_dir(id, guest).await {
        Ok(_) => Ok(inside),
        Err(e) if e.code() == "not_found" || e.code() == "bad_request" => Ok(guest.to_string()),
        Err(e) => Err(e.into()),
    }
}

/// Copies `guest` out of sandbox `id`: a directory into the new host directory `host`; a file
/// into the host directory `host` or to the new file `host`.
pub async fn download(
    c: &Client,
    id: &str,
    guest: &str,
    host: &Path,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match c.read_file(id, guest).await {
        Ok(data) => {
            let dest = host_destination(host, guest)?;
            write_new(&dest, &data)?;
            return show(
                json,
                &serde_json::json!({ "files": 1, "bytes": data.len(), "dest": dest }),
                || {
                    println!(
                        "downloaded {id}:{guest} to {} ({} bytes)",
                        dest.display(),
                        data.len()
                    )
                },
            );
        }
        // A directory, or a file over what one read carries: as an archive.
        Err(e) if e.code() == "bad_request" || e.code() == "payload_too_large" => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("{guest} in sandbox {id}"))),
    }
    let files = c.download_into(id, guest, host).await?;
    show(
        json,
        &serde_json::json!({ "files": files, "dest": host }),
        || {
            println!(
                "downloaded {id}:{guest} to {} ({files} files)",
                host.display()
            )
        },
    )
}

/// The host path a downloaded file goes to: into `host` when it is a directory, else `host`.
fn host_destination(host: &Path, guest: &str) -> anyhow::Result<PathBuf> {
    if host.is_dir() {
        let name = guest
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(guest);
        anyhow::ensure!(
            !name.is_empty() && name != "." && name != "..",
            "{guest} names no file"
        );
        return Ok(host.join(name));
    }
    Ok(host.to_path_buf())
}

/// Writes a new file; one that is there already is left as it is.
fn write_new(dest: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .with_context(|| match dest.exists() {
            true => format!(
                "{} exists already; nothing was overwritten (remove it, or give another path)",
                dest.display()
            ),
            false => format!("create {}", dest.display()),
        })?;
    f.write_all(data)
        .with_context(|| format!("write {}", dest.display()))
}
