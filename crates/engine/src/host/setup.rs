//! Installs what forkbox needs on a Debian or Ubuntu host: QEMU, qemu-img, mmdebstrap,
//! CA certificates, e2fsprogs, and Debian's cloud kernel, unpacked into forkbox's own home (never /boot).

use std::path::Path;
use std::process::Command;

use crate::error::SetupError;
use crate::kernel::Kernel;
use crate::paths::Paths;

/// One Debian package forkbox needs, the program it brings and why.
pub struct Package {
    pub name: &'static str,
    pub program: &'static str,
    /// Arguments that make the program print its version and exit 0.
    pub version_args: &'static [&'static str],
    pub why: &'static str,
    /// Built from Debian's `qemu` source: such packages must share one version, or apt
    /// removes one to install the other.
    pub qemu: bool,
}

/// Host packages and why forkbox needs each.
pub const PACKAGES: &[Package] = &[
    Package {
        name: "qemu-system-x86",
        program: "qemu-system-x86_64",
        version_args: &["--version"],
        why: "runs each sandbox as a microvm guest",
        qemu: true,
    },
    Package {
        name: "qemu-utils",
        program: "qemu-img",
        version_args: &["--version"],
        why: "creates each sandbox's copy-on-write disk overlay",
        qemu: true,
    },
    Package {
        name: "mmdebstrap",
        program: "mmdebstrap",
        version_args: &["--version"],
        why: "builds image root filesystems from Debian packages",
        qemu: false,
    },
    Package {
        name: "ca-certificates",
        program: "update-ca-certificates",
        version_args: &["--help"],
        why: "the certificate authorities that check registries' and model APIs' TLS",
        qemu: false,
    },
    Package {
        name: "e2fsprogs",
        program: "mkfs.ext4",
        version_args: &["-V"],
        why: "turns an image's root into an ext4 disk image",
        qemu: false,
    },
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
    let updated = install_packages(progress, &mut steps)?;

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

/// The version dpkg has installed of `pkg`, if it is installed.
fn installed_version(pkg: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Abbrev}|${Version}", pkg])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (status, version) = text.split_once('|')?;
    (out.status.success() && status.starts_with("ii")).then(|| version.trim().to_string())
}

/// Every version of `pkg` apt can install.
fn available_versions(pkg: &str) -> Result<Vec<String>, SetupError> {
    let out = run(Command::new("apt-cache").args(["madison", pkg]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split('|').nth(1))
        .map(|v| v.trim().to_string())
        .collect())
}

/// The version apt would install of `pkg`.
fn candidate(pkg: &str) -> Result<Option<String>, SetupError> {
    let out = run(Command::new("apt-cache").args(["policy", pkg]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .find(|v| *v != "(none)")
        .map(str::to_string))
}

/// True when the package's program runs and prints its version.
fn runs(pkg: &Package) -> bool {
    which(pkg.program).is_some_and(|path| {
        Command::new(path)
            .args(pkg.version_args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The one version every QEMU package gets: one already installed when apt offers it for all
/// of them (a newer QEMU someone installed is kept), else apt's candidate for QEMU itself.
fn qemu_version(installed: &[Option<String>]) -> Result<String, SetupError> {
    let qemu: Vec<&Package> = PACKAGES.iter().filter(|p| p.qemu).collect();
    let mut offered = Vec::new();
    for p in &qemu {
        offered.push(available_versions(p.name)?);
    }
    let everywhere = |v: &String| offered.iter().all(|o| o.contains(v));
    let kept = PACKAGES
        .iter()
        .zip(installed)
        .filter(|(p, _)| p.qemu)
        .filter_map(|(_, v)| v.as_ref())
        .find(|v| everywhere(v));
    if let Some(v) = kept {
        return Ok(v.clone());
    }
    let first = qemu[0].name;
    let v = candidate(first)?.ok_or_else(|| SetupError::NoPackage {
        package: first.into(),
    })?;
    if !everywhere(&v) {
        return Err(SetupError::NoCommonVersion {
            packages: qemu.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
            version: v,
        });
    }
    Ok(v)
}

/// `apt-get install` of `args` in one transaction (only simulated with `simulate`).
fn apt_install(args: &[String], simulate: bool) -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.args([
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "--allow-downgrades",
    ]);
    if simulate {
        cmd.arg("--simulate");
    }
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// The packages a simulated install (`plan`, apt's output) would remove: QEMU's own of another
/// version only; any other is refused before anything changes.
fn what_apt_removes(plan: &str, args: &[String]) -> Result<Vec<String>, SetupError> {
    let removed: Vec<String> = plan
        .lines()
        .filter_map(|l| l.strip_prefix("Remv "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let foreign: Vec<&str> = removed
        .iter()
        .map(String::as_str)
        .filter(|p| !p.starts_with("qemu"))
        .collect();
    if !foreign.is_empty() {
        return Err(SetupError::WouldRemove {
            packages: foreign.join(", "),
            command: format!("apt-get install {}", args.join(" ")),
        });
    }
    Ok(removed)
}

/// Installs forkbox's host packages in one apt transaction when a program is missing or
/// does not run, or the QEMU packages' versions differ; checks afterwards that every program
/// runs. Returns whether apt's package lists were updated.
fn install_packages(
    progress: &mut dyn FnMut(&str),
    steps: &mut Vec<SetupStep>,
) -> Result<bool, SetupError> {
    let installed: Vec<Option<String>> =
        PACKAGES.iter().map(|p| installed_version(p.name)).collect();
    let qemu_versions: std::collections::BTreeSet<&String> = PACKAGES
        .iter()
        .zip(&installed)
        .filter(|(p, _)| p.qemu)
        .filter_map(|(_, v)| v.as_ref())
        .collect();
    let broken: Vec<&Package> = PACKAGES.iter().filter(|p| !runs(p)).collect();
    if broken.is_empty() && qemu_versions.len() <= 1 {
        for (p, v) in PACKAGES.iter().zip(&installed) {
            steps.push(SetupStep {
                item: format!("{} ({})", p.name, p.program),
                why: p.why.into(),
                action: match v {
                    Some(v) => format!("already present ({v})"),
                    None => "already present (not from apt)".into(),
                },
            });
        }
        return Ok(false);
    }
    for p in &broken {
        progress(&format!(
            "{} ({}) is missing or does not run",
            p.name, p.program
        ));
    }
    if qemu_versions.len() > 1 {
        progress(&format!(
            "the QEMU packages have different versions ({}); apt would remove one to change the other",
            qemu_versions.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    progress("updating the apt package lists");
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    let version = qemu_version(&installed)?;
    let args: Vec<String> = PACKAGES
        .iter()
        .map(|p| match p.qemu {
            true => format!("{}={version}", p.name),
            false => p.name.to_string(),
        })
        .collect();
    let removed = what_apt_removes(&run(&mut apt_install(&args, true))?, &args)?;
    if !removed.is_empty() {
        progress(&format!(
            "apt replaces {} (QEMU packages of another version)",
            removed.join(", ")
        ));
    }
    progress(&format!("installing {} in one transaction", args.join(" ")));
    run(&mut apt_install(&args, false))?;
    for (p, before) in PACKAGES.iter().zip(&installed) {
        if !runs(p) {
            return Err(SetupError::DoesNotRun {
                program: p.program.into(),
                package: p.name.into(),
            });
        }
        let after = installed_version(p.name).unwrap_or_default();
        let action = match before {
            None => format!("installed ({after})"),
            Some(b) if *b == after => format!("kept ({after})"),
            Some(b) => format!("changed {b} -> {after}"),
        };
        steps.push(SetupStep {
            item: format!("{} ({})", p.name, p.program),
            why: p.why.into(),
            action,
        });
    }
    Ok(true)
}
