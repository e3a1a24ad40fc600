//! A template's start command, as E2B's builder runs it: in a sandbox of the built image, in
//! the background as the template's user, its ready command tried every 2 s (at most 10
//! minutes) until it succeeds; then the sandbox is saved as the caller's snapshot named after
//! the template, which `Sandbox.create` of the template copies (the start command running in
//! each copy, as on E2B).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use forkbox_api::{CreateRequest, ExecRequest, SnapshotRequest};
use forkbox_client::Client;
use serde_json::json;

use crate::{guest, keys, E2b};

/// The snapshot a template with a start command is copied from, for `owner`.
pub(crate) fn snapshot_of(owner: &str, template: &str) -> Option<String> {
    keys::snapshot_name(owner, Some(template)).ok()
}

/// Runs `cmd` in a sandbox of image `template` until `ready` succeeds, and saves it.
pub(crate) async fn save(
    e: &E2b,
    client: &Client,
    owner: &str,
    build: &str,
    template: &str,
    cmd: &str,
    ready: &str,
) -> Result<(), String> {
    let name = snapshot_of(owner, template)
        .ok_or_else(|| format!("template {template}: its name cannot name a snapshot"))?;
    let sb = client
        .create(&CreateRequest {
            image: Some(template.to_string()),
            ..Default::default()
        })
        .await
        .map_err(|err| format!("start a sandbox of {template}: {err}"))?;
    let r = run_until_ready(e, client, build, &sb.info.id, cmd, ready).await;
    let saved = match r {
        Ok(()) => {
            // The template's newer build replaces the older one's sandbox state.
            let _ = client.delete_snapshot(&name).await;
            client
                .snapshot(
                    &sb.info.id,
                    &SnapshotRequest {
                        name: Some(name.clone()),
                        ..Default::default()
                    },
                )
                .await
                .map(|_| ())
                .map_err(|err| format!("save the started sandbox: {err}"))
        }
        Err(m) => Err(m),
    };
    let _ = client.delete(&sb.info.id).await;
    saved?;
    e.builds_log(
        build,
        format!("saved with its start command running ({name})"),
    );
    Ok(())
}

async fn run_until_ready(
    e: &E2b,
    client: &Client,
    build: &str,
    id: &str,
    cmd: &str,
    ready: &str,
) -> Result<(), String> {
    let shell = |c: &str| {
        vec![
            "/bin/bash".to_string(),
            "-l".into(),
            "-c".into(),
            c.to_string(),
        ]
    };
    let record = json!({"config": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": {}}, "tag": "start"});
    let mut env = BTreeMap::new();
    env.insert("E2B_PROC".to_string(), record.to_string());
    e.builds_log(build, format!("[finalize] start command: {cmd}"));
    client
        .start_command(
            id,
            &ExecRequest {
                argv: Some(guest::start("", "", &shell(cmd))),
                env,
                ..Default::default()
            },
        )
        .await
        .map_err(|err| format!("start command {cmd:?}: {err}"))?;
    e.builds_log(build, format!("[finalize] waiting for: {ready}"));
    let started = Instant::now();
    loop {
        let r = client
            .exec(
                id,
                &ExecRequest {
                    argv: Some(guest::run("", "", &shell(ready))),
                    timeout_secs: Some(60),
                    ..Default::default()
                },
            )
            .await
            .map_err(|err| format!("ready command {ready:?}: {err}"))?;
        if r.exit_code == 0 {
            return Ok(());
        }
        if started.elapsed() > crate::builds::READY_WITHIN {
            return Err(format!(
                "the ready command {ready:?} did not succeed within 10 minutes (last exit {})",
                r.exit_code
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
