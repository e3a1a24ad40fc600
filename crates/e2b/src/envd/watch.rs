//! Directory watches: a watcher is a command in the guest ([`crate::guest::watch`]: the agent's
//! inotify helper) that prints a line per change, with the path's entry when asked. `WatchDir`
//! (JavaScript's SDK) streams its lines as events; `CreateWatcher`, `GetWatcherEvents` and
//! `RemoveWatcher` (Python's) keep it running and read what it printed since the last call.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use forkbox_api::{CommandEvent, ExecRequest};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{awake_target, bytes_field, Stream, Target};
use crate::errors::Failure;
use crate::{guest, E2b};

/// The longest line of the watcher's kept while it is not ended.
const MAX_LINE: usize = 8192;

/// A watcher made by `CreateWatcher`.
#[derive(Debug, Clone)]
pub(crate) struct Watcher {
    pub sandbox: String,
    cid: String,
    /// The next output chunk to read.
    next: usize,
    /// A line not ended yet.
    partial: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    /// Each event carries its entry (envd 0.6.3). (`allowNetworkMounts`, envd 0.6.4, needs
    /// nothing: the guest's inotify watches whatever file system it is given.)
    #[serde(default)]
    include_entry: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherId {
    #[serde(default)]
    watcher_id: String,
}

/// Starts a watch of `req.path`; its command, once it has its first listing.
async fn begin(e: &E2b, t: &Target, req: &WatchRequest) -> Result<crate::Ready, Failure> {
    let path = super::filesystem::path(&req.path)?;
    let flag = |b: bool| if b { "1" } else { "0" };
    let exec = ExecRequest {
        argv: Some(guest::watch(
            &t.user,
            path,
            flag(req.recursive),
            flag(req.include_entry),
        )),
        timeout_secs: Some(forkbox_api::MAX_TIMEOUT_SECS),
        ..Default::default()
    };
    e.start_until_ready(&t.id, &exec, |code, err| match code {
        2 => Failure::new(404, format!("path {path} not found")),
        20 => Failure::new(400, format!("path {path} is not a directory")),
        n => Failure::new(500, format!("watching {path} failed ({n}): {}", err.trim())),
    })
    .await
}

/// The events of whole lines `TYPE\tNAME`, the rest kept in `partial`.
fn events_of(partial: &mut String, more: &str) -> Vec<Value> {
    partial.push_str(more);
    let mut out = Vec::new();
    // A path is at most 4096 bytes: a longer "line" is not the watcher's, and is dropped
    // rather than held.
    if !partial.contains('\n') && partial.len() > MAX_LINE {
        partial.clear();
    }
    while let Some(nl) = partial.find('\n') {
        let line: String = partial.drain(..=nl).collect();
        let mut f = line.trim_end_matches('\n').splitn(3, '\t');
        let (Some(kind), Some(name)) = (f.next(), f.next()) else {
            continue;
        };
        let kind = match kind {
            "CREATE" | "WRITE" | "REMOVE" | "RENAME" | "CHMOD" => kind,
            _ => continue,
        };
        let mut v = json!({ "name": name, "type": format!("EVENT_TYPE_{kind}") });
        // With entries asked for: the path's entry, where it still exists.
        if let Some(entry) = f
            .next()
            .and_then(|rec| super::filesystem::entries(rec).pop())
        {
            v["entry"] = entry;
        }
        out.push(v);
    }
    out
}

/// `WatchDir`: `start`, then the watch's events as they come, until the client goes.
pub(super) async fn watch_dir(e: Arc<E2b>, headers: HeaderMap, body: Body) -> Response {
    let first = super::first_message(body).await;
    let (stream, resp) = Stream::open();
    tokio::spawn(async move {
        let r = match first {
            Ok((_, v)) => follow(&e, &headers, v, &stream).await,
            Err(f) => Err(f),
        };
        stream.end(r.err().as_ref()).await;
    });
    resp
}

async fn follow(
    e: &E2b,
    headers: &HeaderMap,
    first: Value,
    stream: &Stream,
) -> Result<(), Failure> {
    let t = awake_target(e, headers).await?;
    let req: WatchRequest = super::message(first)?;
    let crate::Ready {
        cid,
        mut events,
        rest,
    } = begin(e, &t, &req).await?;
    let stop = |e: &E2b| {
        let (daemon, id, cid) = (e.daemon.clone(), t.id.clone(), cid.clone());
        async move {
            let _ = daemon.signal(&id, &cid, 15).await;
        }
    };
    stream.send(&json!({ "start": {} })).await;
    let keep = super::keepalive(headers);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keep, keep);
    let mut partial = String::new();
    for v in events_of(&mut partial, &rest) {
        stream.send(&json!({ "filesystem": v })).await;
    }
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = tick.tick() => {
                if !stream.send(&json!({ "keepalive": {} })).await {
                    stop(e).await;
                    return Ok(());
                }
                continue;
            }
        };
        match ev? {
            Some(CommandEvent::Stdout { data_b64 }) => {
                let text = String::from_utf8_lossy(&bytes_field(&data_b64)?).into_owned();
                for v in events_of(&mut partial, &text) {
                    if !stream.send(&json!({ "filesystem": v })).await {
                        stop(e).await;
                        return Ok(());
                    }
                }
            }
            Some(CommandEvent::Exit(_)) | Some(CommandEvent::Error { .. }) | None => {
                return Err(Failure::new(
                    404,
                    format!("the watch of {} ended (the directory is gone?)", req.path),
                ))
            }
            Some(_) => {}
        }
        if stream.closed() {
            stop(e).await;
            return Ok(());
        }
    }
}

/// `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`.
pub(super) async fn unary(
    e: &E2b,
    t: &Target,
    method: &str,
    bytes: &[u8],
) -> Result<Value, Failure> {
    match method {
        "CreateWatcher" => {
            let req: WatchRequest = super::unary(bytes)?;
            let cid = begin(e, t, &req).await?.cid;
            let id =
                crate::keys::random_hex(12).map_err(|err| Failure::new(500, err.to_string()))?;
            e.watchers.lock().unwrap_or_else(|p| p.into_inner()).insert(
                id.clone(),
                Watcher {
                    sandbox: t.id.clone(),
                    cid,
                    next: 0,
                    partial: String::new(),
                },
            );
            Ok(json!({ "watcherId": id }))
        }
        "GetWatcherEvents" => {
            let req: WatcherId = super::unary(bytes)?;
            let w = watcher(e, t, &req.watcher_id)?;
            let poll = e.daemon.poll(&t.id, &w.cid, w.next).await?;
            let mut text = String::new();
            for c in &poll.chunks {
                if c.stream == forkbox_api::Stream::Stdout {
                    text.push_str(&String::from_utf8_lossy(&bytes_field(&c.data_b64)?));
                }
            }
            let mut partial = w.partial.clone();
            if w.next == 0 {
                partial.clear();
                text = text.strip_prefix("ready\n").unwrap_or(&text).to_string();
            }
            let events = events_of(&mut partial, &text);
            if let Some(x) = e
                .watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(&req.watcher_id)
            {
                x.next = poll.next;
                x.partial = partial;
            }
            if poll.exit.is_some() && events.is_empty() {
                e.watchers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&req.watcher_id);
                return Err(Failure::new(
                    404,
                    format!("watcher {} ended (the directory is gone?)", req.watcher_id),
                ));
            }
            Ok(json!({ "events": events }))
        }
        "RemoveWatcher" => {
            let req: WatcherId = super::unary(bytes)?;
            let w = watcher(e, t, &req.watcher_id)?;
            e.watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&req.watcher_id);
            let _ = e.daemon.signal(&t.id, &w.cid, 15).await;
            Ok(json!({}))
        }
        m => Err(Failure::new(501, format!("no method {m}"))),
    }
}

fn watcher(e: &E2b, t: &Target, id: &str) -> Result<Watcher, Failure> {
    e.watchers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .filter(|w| w.sandbox == t.id)
        .cloned()
        .ok_or_else(|| Failure::new(404, format!("watcher {id} not found")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_events_whole() {
        let mut p = String::new();
        assert!(events_of(&mut p, "CREATE\ta").is_empty());
        let v = events_of(&mut p, ".txt\nWRITE\ta.txt\nbogus\n");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0], json!({"name": "a.txt", "type": "EVENT_TYPE_CREATE"}));
        assert_eq!(v[1]["type"], "EVENT_TYPE_WRITE");
        assert!(p.is_empty());
        events_of(&mut p, &"x".repeat(MAX_LINE + 1));
        assert!(p.is_empty(), "an endless line is dropped, not held");
    }

    /// The watch script under this host's `sh`: a file made, written, renamed and removed.
    #[test]
    fn the_watch_script_sees_changes() {
        let dir = std::env::temp_dir().join(format!("fbx-e2b-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(guest::watch_script())
            .arg("w")
            .arg(&dir)
            .arg("0")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut first = [0u8; 6];
        std::io::Read::read_exact(&mut out, &mut first).unwrap();
        assert_eq!(&first, b"ready\n");
        let pause = || std::thread::sleep(std::time::Duration::from_millis(600));
        std::fs::write(dir.join("a"), b"1").unwrap();
        pause();
        std::fs::write(dir.join("a"), b"22").unwrap();
        pause();
        std::fs::rename(dir.join("a"), dir.join("b")).unwrap();
        pause();
        std::fs::remove_file(dir.join("b")).unwrap();
        pause();
        child.kill().unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
        let _ = child.wait();
        let mut p = String::new();
        let got: Vec<String> = events_of(&mut p, &text)
            .iter()
            .map(|v| {
                format!(
                    "{} {}",
                    v["type"].as_str().unwrap(),
                    v["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "EVENT_TYPE_CREATE a",
                "EVENT_TYPE_WRITE a",
                "EVENT_TYPE_WRITE a",
                "EVENT_TYPE_RENAME a",
                "EVENT_TYPE_CREATE b",
                "EVENT_TYPE_REMOVE b"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
