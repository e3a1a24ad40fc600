//! Host programs that read what a guest wrote, run in QEMU's jail ([`super::jail`]): `e2fsck`
//! over a volume's disk or a built image's. A guest may craft its file system against a bug of
//! the checker; confined, the checker is no more than a QEMU taken over from inside its guest
//! would be: a uid of its own, no capabilities, no network, no `/proc`, and the one disk it
//! checks bound in read-write, nothing else of the host's but `/usr` read-only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::jail;
use crate::error::VmError;
use crate::paths::Paths;

/// Runs `program` with `args`, writing only the files `rw` (each must be writable by the group
/// `forkbox-vmm`), in a jail whose run directory is a new one under the home's `run/`
/// (removed after; one a crash leaves has no record and is swept a minute later). Unconfined,
/// as forkbox's user, when QEMU's jail is turned off (`FORKBOX_JAIL=off`).
pub fn run(
    paths: &Paths,
    program: &Path,
    args: &[&str],
    rw: &[PathBuf],
) -> Result<Output, VmError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // No /proc in the jail: e2fsck cannot see what is mounted (nothing it checks is).
        .env("EXT2FS_NO_MTAB_OK", "1")
        .stdin(Stdio::null());
    if !jail::enabled() {
        return cmd
            .output()
            .map_err(|e| VmError::io(format!("run {}", program.display()), e));
    }
    let hex = crate::random::hex(4).map_err(|e| VmError::io("draw a name", e))?;
    let run_dir = paths.run().join(format!("check-{hex}"));
    std::fs::create_dir_all(&run_dir).map_err(|e| VmError::io("make the check's directory", e))?;
    let out = (|| {
        let j = jail::Jail::new(&jail::Needs {
            run_dir: &run_dir,
            rw: rw.to_vec(),
            ro: Vec::new(),
            ro_last: None,
            kvm: false,
            die_with_parent: true,
        })?;
        // SAFETY: `enter` runs in the child between fork and exec and makes only system calls
        // on data prepared before the fork (see `Jail::enter`).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || j.enter());
        }
        cmd.output()
            .map_err(|e| VmError::io(format!("run {} confined", program.display()), e))
    })();
    crate::tree::discard_tree(&run_dir);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What a confined program sees: its own uid, the one file it was given (which it writes),
    /// and nothing else of the host's but `/usr` (no `/etc/hostname`, no `/proc`, of the home
    /// only that file and its run directory).
    #[test]
    fn a_confined_program_has_its_uid_and_its_one_file() {
        if !nix::unistd::geteuid().is_root() || !jail::enabled() {
            eprintln!("skipped: the jail needs root");
            return;
        }
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let disk = home.path().join("disk.ext4");
        std::fs::write(home.path().join("state.db"), "the host's").unwrap();
        std::fs::write(&disk, "before\n").unwrap();
        jail::share_file(&disk, true).unwrap();
        let d = disk.display();
        let h = home.path().display();
        let script = format!(
            "id -u; echo written >> {d}; cat /etc/hostname || echo no-hostname; \
             ls /proc/self || echo no-proc; echo home: $(ls {h})"
        );
        let out = run(
            &paths,
            Path::new("/bin/sh"),
            &["-c", &script],
            std::slice::from_ref(&disk),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let uid: u32 = text.lines().next().unwrap().trim().parse().unwrap();
        assert!(uid >= jail::UID_BASE, "{text}");
        assert!(
            text.contains("no-hostname") && text.contains("no-proc"),
            "{text}"
        );
        assert!(
            text.contains("no-home") || !text.contains("disk.ext4\n"),
            "{text}"
        );
        assert_eq!(std::fs::read_to_string(&disk).unwrap(), "before\nwritten\n");
        // e2fsck has what it needs in there: a clean ext4 checks clean, one whose superblock
        // is spoilt fails in words.
        let fs = home.path().join("vol.ext4");
        std::fs::File::create(&fs)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&fs)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        jail::share_file(&fs, true).unwrap();
        let e2fsck = crate::setup::require("e2fsck").unwrap();
        let check = || {
            let arg = fs.to_string_lossy();
            run(
                &paths,
                &e2fsck,
                &["-f", "-p", &arg],
                std::slice::from_ref(&fs),
            )
            .unwrap()
        };
        let clean = check();
        assert_eq!(clean.status.code(), Some(0), "{clean:?}");
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(&fs).unwrap();
            f.seek(std::io::SeekFrom::Start(1024)).unwrap();
            f.write_all(&[0xff; 1024]).unwrap();
        }
        let spoilt = check();
        assert!(spoilt.status.code().unwrap_or(0) >= 4, "{spoilt:?}");
        // Its run directory is gone.
        let left: Vec<_> = std::fs::read_dir(paths.run()).unwrap().flatten().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
