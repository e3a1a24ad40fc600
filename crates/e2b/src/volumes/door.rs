//! Which sandbox serves a volume's content calls. A volume's ext4 is written by guests, so the
//! host never mounts nor parses it: its files are reached in a sandbox that has it mounted.
//! That is the sandbox that has it now (a write through the API is then seen at once by the
//! program that uses the volume, as on E2B, where a volume is shared storage), or else a
//! helper sandbox of forkbox's base image, no network, that mounts it at [`HELPER_ROOT`] and
//! leaves after [`HELPER_IDLE_SECS`] without a call (a sandbox that asks for the volume
//! makes it leave at once).

use forkbox_api::{Code, CreateRequest, SandboxState, SandboxView, VolumeMount};

use crate::errors::Failure;
use crate::E2b;

/// The label that marks a helper, its value the volume it serves.
pub const HELPER_LABEL: &str = "e2b.volume-content";
/// Where a helper mounts its volume.
pub const HELPER_ROOT: &str = "/volume";
/// The image of a helper.
const HELPER_IMAGE: &str = "base";
/// How long a helper stays without a call.
pub const HELPER_IDLE_SECS: u64 = 60;

/// A sandbox that has the volume mounted, and where.
pub struct Door {
    pub sandbox: String,
    pub root: String,
    helper: bool,
}

/// Whether a call reads or writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The sandbox through which volume `name`'s files are reached for `access`: one that has it
/// mounted, else a helper (made now if there is none).
pub async fn open(e: &E2b, name: &str, access: Access) -> Result<Door, Failure> {
    let _one = e.volume_helpers.lock().await;
    if let Some(d) = holder(e, name, access).await? {
        if d.helper {
            // The helper stays while it is used.
            e.daemon.set_ttl(&d.sandbox, HELPER_IDLE_SECS).await?;
        }
        return Ok(d);
    }
    let req = CreateRequest {
        // E2B's default template: the one an E2B user has (built on first use).
        image: Some(HELPER_IMAGE.to_string()),
        labels: [(HELPER_LABEL.to_string(), name.to_string())].into(),
        ttl_seconds: Some(HELPER_IDLE_SECS),
        volumes: vec![VolumeMount {
            name: name.to_string(),
            path: HELPER_ROOT.to_string(),
            read_only: false,
        }],
        ..CreateRequest::default()
    };
    let v = crate::control::create_building(e, &e.daemon, &req).await?;
    tracing::info!(
        volume = name,
        sandbox = v.info.id,
        "a helper serves the volume's files"
    );
    Ok(Door {
        sandbox: v.info.id,
        root: HELPER_ROOT.to_string(),
        helper: true,
    })
}

/// The sandbox that has volume `name` mounted as `access` needs, if one has.
async fn holder(e: &E2b, name: &str, access: Access) -> Result<Option<Door>, Failure> {
    let v = e.daemon.get_volume(name).await?;
    let mut read_only = None;
    for h in &v.holders {
        let Ok(s) = e.daemon.get(&h.sandbox).await else {
            continue;
        };
        if h.read_only && access == Access::Write {
            read_only = Some(h.sandbox.clone());
            continue;
        }
        let door = door_of(&s, name)?;
        if door.is_some() {
            return Ok(door);
        }
    }
    match read_only {
        Some(id) => Err(Failure::new(
            409,
            format!(
                "volume {name} is mounted read-only by sandbox {id}: forkbox keeps a volume's \
                 one writer or many readers; kill the readers to write to it"
            ),
        )),
        None => Ok(None),
    }
}

/// Where sandbox `s` has volume `name`, if it is running (or wakes on use).
fn door_of(s: &SandboxView, name: &str) -> Result<Option<Door>, Failure> {
    let Some(m) = s.info.volumes.iter().find(|m| m.name == name) else {
        return Ok(None);
    };
    match s.state {
        SandboxState::Running | SandboxState::Sleeping | SandboxState::DiskFull => Ok(Some(Door {
            sandbox: s.info.id.clone(),
            root: m.path.trim_end_matches('/').to_string(),
            helper: s.labels.contains_key(HELPER_LABEL),
        })),
        _ => Err(Failure::of(
            Code::Conflict,
            format!(
                "volume {name} is mounted by sandbox {}, which is {:?}: resume it (connect) or \
                 kill it to reach the volume's files",
                s.info.id, s.state
            ),
        )),
    }
}

/// Makes the helpers of `names` leave (a sandbox is about to mount them, or a volume to go).
pub async fn release(e: &E2b, names: &[&str]) {
    let _one = e.volume_helpers.lock().await;
    for name in names {
        let Ok(v) = e.daemon.get_volume(name).await else {
            continue;
        };
        for h in &v.holders {
            let helper = e
                .daemon
                .get(&h.sandbox)
                .await
                .is_ok_and(|s| s.labels.get(HELPER_LABEL).map(String::as_str) == Some(name));
            if helper {
                if let Err(err) = e.daemon.delete(&h.sandbox).await {
                    tracing::warn!(sandbox = h.sandbox, "a volume's helper: {err}");
                }
            }
        }
    }
}
