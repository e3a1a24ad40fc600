//! Finding the guest agent binary that goes into every initramfs.

use std::path::PathBuf;

use crate::error::SetupError;

pub const TRIPLE_DIR: &str = "x86_64-unknown-linux-gnu/agent";

fn candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = std::env::var_os("FORKBOX_AGENT").filter(|p| !p.is_empty()) {
        c.push(PathBuf::from(p));
        return c;
    }
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(PathBuf::from);
        if let Some(d) = &dir {
            c.push(d.join("forkbox-agent"));
            // PREFIX/bin/forkbox → PREFIX/lib/forkbox/forkbox-agent (scripts/install.sh).
            if let Some(prefix) = d.parent() {
                c.push(prefix.join("lib/forkbox/forkbox-agent"));
            }
        }
        // target/<profile>/forkbox, or target/<profile>/deps/<test> → target/<triple>/agent/
        for _ in 0..3 {
            dir = dir.and_then(|d| d.parent().map(PathBuf::from));
            if let Some(d) = &dir {
                c.push(d.join(TRIPLE_DIR).join("forkbox-agent"));
            }
        }
    }
    c
}

/// Whether any place the agent is looked for holds a file (nothing is read).
pub fn present() -> bool {
    candidates().iter().any(|p| p.is_file())
}

/// The agent's path and bytes: the first statically linked candidate. (A plain `cargo build`
/// of the workspace can leave a dynamically linked copy beside the CLI; it is passed over.)
pub fn locate() -> Result<(PathBuf, Vec<u8>), SetupError> {
    use object::Object;
    let cands = candidates();
    let mut dynamic = None;
    for p in &cands {
        let Ok(bytes) = std::fs::read(p) else {
            continue;
        };
        match object::File::parse(&*bytes) {
            Ok(file) if file.section_by_name(".interp").is_none() => return Ok((p.clone(), bytes)),
            _ => dynamic = dynamic.or(Some(p.clone())),
        }
    }
    match dynamic {
        Some(path) => Err(SetupError::AgentNotStatic { path }),
        None => Err(SetupError::NoAgent {
            looked: cands
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}
