//! Embeds the static guest agent in the CLI when one is built (`scripts/build.sh agent`, or
//! `FORKBOX_AGENT=PATH`), so an installed `forkbox` (`cargo install --path crates/cli`) runs
//! sandboxes with nothing beside it. A release build without one stops here, saying what to
//! run: otherwise the first `forkbox run` would fail on a missing agent.

use std::path::PathBuf;

const TRIPLE_DIR: &str = "x86_64-unknown-linux-gnu/agent";

/// Whether `bytes` is an ELF file without a program interpreter (statically linked).
fn is_static_elf(bytes: &[u8]) -> bool {
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let at = phoff as usize + i * usize::from(phentsize);
        // PT_INTERP (3): the program needs a dynamic loader.
        bytes.get(at..at + 4) != Some(&3u32.to_le_bytes())
    })
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FORKBOX_AGENT");
    println!("cargo::rustc-check-cfg=cfg(forkbox_embedded_agent)");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("FORKBOX_AGENT").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(t).join(TRIPLE_DIR).join("forkbox-agent"));
    }
    candidates.push(
        manifest
            .join("../../target")
            .join(TRIPLE_DIR)
            .join("forkbox-agent"),
    );
    for path in &candidates {
        let Ok(bytes) = std::fs::read(path) else {
            continue;
        };
        println!("cargo:rerun-if-changed={}", path.display());
        if !is_static_elf(&bytes) {
            continue;
        }
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("forkbox-agent");
        if std::fs::write(&out, &bytes).is_ok() {
            println!("cargo:rustc-cfg=forkbox_embedded_agent");
            return;
        }
    }
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        panic!(
            "\n\nforkbox needs its guest agent, built statically, and none is built yet.\n\
             Run `scripts/build.sh agent` in the repository (or set FORKBOX_AGENT to a static \
             forkbox-agent), then build or install again:\n\
             \n    scripts/build.sh agent && cargo install --path crates/cli\n\n\
             Looked for: {}\n",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}
