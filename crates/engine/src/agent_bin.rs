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
        }
        // target/<profile>/forkbox, or target/<profile>/deps/<test> → target/<triple>/agent/
        for _ in 0..3 {
            dir = dir.and_then(|d| d.parent().map(PathBuf::from));
            if let Some(d) = &dir {
                c.push(d.join(TRIPLE_DIR).join("forkbox-agent"));
            }
        }
    }
    c.push(PathBuf::from("/usr/local/lib/forkbox/forkbox-agent"));
    c.push(PathBuf::from("/usr/lib/forkbox/forkbox-agent"));
    c
}

/// The agent's path and bytes. It must be statically linked.
pub fn locate() -> Result<(PathBuf, Vec<u8>), SetupError> {
    let cands = candidates();
    for p in &cands {
        if let Ok(bytes) = std::fs::read(p) {
            use object::Object;
            let file = object::File::parse(&*bytes).map_err(|e| SetupError::BadKernel {
                release: "agent".into(),
                message: format!("{} is not an ELF binary: {e}", p.display()),
            })?;
            if file.section_by_name(".interp").is_some() {
                return Err(SetupError::AgentNotStatic { path: p.clone() });
            }
            return Ok((p.clone(), bytes));
        }
    }
    Err(SetupError::NoAgent { looked: cands.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ") })
}
