//! Installs what forkbox needs on a Debian or Ubuntu host: QEMU, qemu-img, mmdebstrap,
//! e2fsprogs, and Debian's cloud kernel, unpacked into forkbox's own home (never /boot).

use std::path::Path;
use std::process::Command;

use crate::error::SetupError;
use crate::kernel::Kernel;
use crate::paths::Paths;

/// Host packages and why forkbox needs each.
pub const PACKAGES: &[(&str, &str, &str)] = &[
    (
        "qemu-system-x86",
        "qemu-system-x86_64",
        "runs each sandbox as a microvm guest",
    ),
    (
        "qemu-utils",
        "qemu-img",
        "creates each sandbox's copy-on-write disk overlay",
    ),
    (
        "mmdebstrap",
        "mmdebstrap",
        "builds image root filesystems from Debian packages",
    ),
    (
        "e2fsprogs",
        "mkfs.ext4",
        "turns an image's root into an ext4 disk image",
    ),
];
/// The kernel package whose dependency is the concrete kernel to unpack.
pub const KERNEL_META_PACKAGE: &str = "linux-image-cloud-amd64";

/// One thing setup did or found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SetupStep {
    pub item: String,
    pub why: String,
    pub action: String,
}

pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].iter().map(Into::into))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Fails with a pointer to `forkbox setup` when a program forkbox runs is missing.
pub fn require(program: &str) -> Result<std::path::PathBuf, SetupError> {
    which(program).ok_or_else(|| SetupError::MissingProgram {
        program: program.into(),
    })
}

fn run(cmd: &mut Command) -> Result<String, SetupError> {
    let text = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .output()
        .map_err(|e| SetupError::io(format!("run {text}"), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(SetupError::CommandFailed {
            command: text,
            status: out.status.to_string(),
            detail: tail.into_iter().rev().collect::<Vec<_>>().join(" / "),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs set-up. Idempotent: what is present is left as it is. `progress` gets a line per step.
pub fn setup(paths: &Paths, progress: &mut dyn FnMut(&str)) -> Result<Vec<SetupStep>, SetupError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(SetupError::NotRoot);
    }
    if which("apt-get").is_none() {
        return Err(SetupError::NoApt);
    }
    let mut steps = Vec::new();
    let missing: Vec<&(&str, &str, &str)> = PACKAGES
        .iter()
        .filter(|(_, prog, _)| which(prog).is_none())
        .collect();
    let mut updated = false;
    if !missing.is_empty() {
        progress("updating the apt package lists");
        run(Command::new("apt-get").arg("update").arg("-q"))?;
        updated = true;
        let names: Vec<&str> = missing.iter().map(|(p, _, _)| *p).collect();
        progress(&format!("installing {}", names.join(", ")));
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    for (pkg, prog, why) in PACKAGES {
        let action = if missing.iter().any(|(p, _, _)| p == pkg) {
            "installed"
        } else {
            "already present"
        };
        steps.push(SetupStep {
            item: format!("{pkg} ({prog})"),
            why: why.to_string(),
            action: action.into(),
        });
    }

    let kernel_why =
        "the guest kernel every sandbox boots (unpacked into forkbox's home, not /boot)";
    match Kernel::newest(paths) {
        Ok(k) => steps.push(SetupStep {
            item: format!("kernel {}", k.release),
            why: kernel_why.into(),
            action: "already present".into(),
        }),
        Err(_) => {
            if !updated {
                progress("updating the apt package lists");
                run(Command::new("apt-get").arg("update").arg("-q"))?;
            }
            let k = install_kernel(paths, progress)?;
            steps.push(SetupStep {
                item: format!("kernel {}", k.release),
                why: kernel_why.into(),
                action: format!("unpacked into {}", k.dir.display()),
            });
        }
    }
    Ok(steps)
}

fn install_kernel(paths: &Paths, progress: &mut dyn FnMut(&str)) -> Result<Kernel, SetupError> {
    let deps = run(Command::new("apt-cache").args(["depends", KERNEL_META_PACKAGE]))?;
    let pkg = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| SetupError::CommandFailed {
            command: format!("apt-cache depends {KERNEL_META_PACKAGE}"),
            status: "no kernel package".into(),
            detail: "this distribution has no Debian cloud kernel; install forkbox on Debian"
                .into(),
        })?
        .to_string();
    let release = pkg.trim_start_matches("linux-image-").to_string();
    progress(&format!("downloading guest kernel package {pkg}"));
    std::fs::create_dir_all(paths.kernels())
        .map_err(|e| SetupError::io("create kernels dir", e))?;
    let tmp = paths
        .kernels()
        .join(format!(".unpack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| SetupError::io("create temp dir", e))?;
    let result = (|| {
        run(Command::new("apt-get")
            .arg("download")
            .arg(&pkg)
            .current_dir(&tmp))?;
        let deb = std::fs::read_dir(&tmp)
            .map_err(|e| SetupError::io("list download", e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| SetupError::CommandFailed {
                command: format!("apt-get download {pkg}"),
                status: "no .deb".into(),
                detail: "the download produced no package file".into(),
            })?;
        progress(&format!("unpacking {}", deb.display()));
        let root = tmp.join("root");
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let _ = std::fs::remove_file(&deb);
        let dest = paths.kernels().join(&release);
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&root, &dest).map_err(|e| SetupError::io("move kernel into place", e))?;
        Kernel::find(paths, &release).ok_or_else(|| SetupError::BadKernel {
            release: release.clone(),
            message: "the package holds no boot/vmlinuz".into(),
        })
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// True when `path` exists and can be opened for reading and writing.
pub fn usable_device(path: &Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .is_ok()
}
