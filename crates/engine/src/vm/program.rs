//! Which QEMU runs the guests, and what its version can do.
//!
//! The QEMU is the one on `PATH` (what `forkbox setup` installs: 10.0 on Debian 12 from
//! `bookworm-backports`), or the program `FORKBOX_QEMU` names: a QEMU unpacked elsewhere (its
//! `usr` tree, with its firmware under `share/qemu`), which the jail then also shows its QEMUs,
//! read-only. Its version decides two of forkbox's protections:
//!
//! - 8.2 and later open a RAM file they map private read-only (`readonly=on,rom=off`): a copy's
//!   QEMU cannot write the snapshot its siblings map. Before, QEMU opened it read-write.
//! - 9.0 and later track a TCG guest's dirty pages exactly; before, forkbox pads TCG guests'
//!   RAM off a multiple of 256 KiB ([`super::TCG_RAM_TAIL_KIB`]).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The setting: the QEMU program (`qemu-system-x86_64`) to run instead of the one on `PATH`.
pub const QEMU_ENV: &str = "FORKBOX_QEMU";

/// QEMU's program name.
pub const QEMU: &str = "qemu-system-x86_64";

/// The QEMU program guests run on: `FORKBOX_QEMU` if set, else `qemu-system-x86_64` on `PATH`
/// (`None` when there is none).
pub fn program() -> Option<PathBuf> {
    match std::env::var_os(QEMU_ENV) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => crate::setup::which(QEMU),
    }
}

/// Fails with what to do when there is no QEMU to run.
pub fn require() -> Result<PathBuf, crate::error::SetupError> {
    match std::env::var_os(QEMU_ENV) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            if p.is_file() {
                Ok(p)
            } else {
                Err(crate::error::SetupError::MissingProgram {
                    program: format!("{} ({QEMU_ENV})", p.display()),
                })
            }
        }
        _ => crate::setup::require(QEMU),
    }
}

/// The `usr` tree of a QEMU that is not the system's (`FORKBOX_QEMU=/opt/q/usr/bin/qemu-…`
/// gives `/opt/q/usr`): the jail shows it read-only, and its firmware is looked up there first.
pub fn foreign_prefix() -> Option<PathBuf> {
    let p = program()?;
    let p = std::fs::canonicalize(&p).unwrap_or(p);
    let prefix = p.parent()?.parent()?.to_path_buf();
    (!prefix.starts_with("/usr")).then_some(prefix)
}

/// QEMU's arguments for its firmware: a foreign QEMU's own data directory first (`-L`), and
/// microvm's qboot named (`-bios`) where QEMU would not find it by its default name: Debian's
/// QEMU 7.2 links `bios-microvm.bin` to `qboot.rom` in its data directory, 10.0 has no such link
/// (its guest then prints nothing and hangs).
pub fn firmware_args() -> Vec<String> {
    let mut dirs = Vec::new();
    let mut args = Vec::new();
    if let Some(d) = foreign_prefix()
        .map(|p| p.join("share/qemu"))
        .filter(|d| d.is_dir())
    {
        args.extend(["-L".to_string(), d.display().to_string()]);
        dirs.push(d);
    }
    dirs.push(PathBuf::from("/usr/share/qemu"));
    if !dirs.iter().any(|d| d.join("bios-microvm.bin").exists()) {
        if let Some(qboot) = dirs
            .iter()
            .map(|d| d.join("qboot.rom"))
            .find(|f| f.exists())
        {
            args.extend(["-bios".to_string(), qboot.display().to_string()]);
        }
    }
    args
}

/// Environment that makes a foreign QEMU load its own modules (Debian's QEMU keeps TCG itself
/// in one, `accel-tcg-x86_64.so`, which must be of its version), none for the system's.
pub fn module_env() -> Option<(&'static str, PathBuf)> {
    let dir = foreign_prefix()?.join("lib/x86_64-linux-gnu/qemu");
    dir.is_dir().then_some(("QEMU_MODULE_DIR", dir))
}

/// The QEMU in use, as it names itself (`QEMU emulator version 10.0.2 ...`), asked once.
pub fn banner() -> String {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        program()
            .and_then(|p| {
                std::process::Command::new(p)
                    .arg("--version")
                    .envs(module_env())
                    .output()
                    .ok()
            })
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "unknown QEMU".into())
    })
    .clone()
}

/// `major.minor` of a `QEMU emulator version X.Y.Z ...` line.
pub fn version_of(line: &str) -> Option<(u32, u32)> {
    let v = line.split("version ").nth(1)?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `major.minor` of the QEMU in use (`None` when it cannot be told).
pub fn version() -> Option<(u32, u32)> {
    version_of(&banner())
}

/// Whether the QEMU in use opens a RAM file it maps private read-only (8.2 and later).
pub fn readonly_private_ram() -> bool {
    version().is_some_and(|v| v >= (8, 2))
}

/// Whether the QEMU in use tracks a TCG guest's dirty pages exactly whatever its RAM size (9.0
/// and later: "physmem: Fix migration dirty bitmap coherency with TCG memory access").
pub fn exact_tcg_dirty_tracking() -> bool {
    version().is_some_and(|v| v >= (9, 0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_their_banner() {
        assert_eq!(
            version_of("QEMU emulator version 7.2.15 (Debian 1:7.2+dfsg-7+deb12u7)"),
            Some((7, 2))
        );
        assert_eq!(
            version_of("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"),
            Some((10, 0))
        );
        assert_eq!(version_of("unknown QEMU"), None);
    }
}
