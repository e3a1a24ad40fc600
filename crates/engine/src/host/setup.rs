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
/// Packages of QEMU's source with no program of their own that must have QEMU's version:
/// its shared files and firmware (microvm's qboot, the option ROMs).
pub const QEMU_COMPANIONS: &[&str] = &["qemu-system-common", "qemu-system-data"];

/// The oldest QEMU forkbox installs unless told to keep the distribution's: 9.0 tracks a TCG
/// guest's dirty pages exactly, and (from 8.2) copies can map their snapshot read-only.
pub const RECENT_QEMU: (u32, u32) = (9, 0);

/// Where the host's QEMU comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QemuSource {
    /// QEMU 9.0 or later: the distribution's if it has one, else (Debian 12) bookworm-backports.
    Recent,
    /// Whatever QEMU the distribution offers, or the one installed (`--qemu=system`).
    System,
}

/// The backports suite of Debian 12, which carries QEMU 10.0, and the sources file of its own
/// that setup adds for it.
const BACKPORTS: &str = "bookworm-backports";
const BACKPORTS_FILE: &str = "/etc/apt/sources.list.d/forkbox-backports.sources";
/// Packages that come from backports with its QEMU, beyond QEMU's own: the firmware it needs.
const BACKPORTS_ALSO: &[&str] = &["seabios"];

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
pub fn setup(
    paths: &Paths,
    qemu: QemuSource,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<SetupStep>, SetupError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(SetupError::NotRoot);
    }
    if which("apt-get").is_none() {
        return Err(SetupError::NoApt);
    }
    let mut steps = Vec::new();
    let updated = install_packages(qemu, progress, &mut steps)?;

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
    crate::tree::discard_tree(&tmp);
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
        crate::tree::discard_tree(&dest);
        std::fs::rename(&root, &dest).map_err(|e| SetupError::io("move kernel into place", e))?;
        Kernel::find(paths, &release).ok_or_else(|| SetupError::BadKernel {
            release: release.clone(),
            message: "the package holds no boot/vmlinuz".into(),
        })
    })();
    crate::tree::discard_tree(&tmp);
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

/// Every package built from QEMU's source that forkbox installs, with one version.
fn qemu_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .filter(|p| p.qemu)
        .map(|p| p.name)
        .chain(QEMU_COMPANIONS.iter().copied())
        .collect()
}

/// `major.minor.patch` of a Debian version of QEMU (`1:10.0.2+ds-2+deb13u1~bpo12+1` gives
/// 10.0.2), for comparing offers.
pub fn upstream(version: &str) -> Option<(u32, u32, u32)> {
    let v = version.split_once(':').map_or(version, |(_, v)| v);
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next().and_then(|p| p.parse().ok()).unwrap_or(0),
    ))
}

/// A Debian version without its binary-only rebuild suffix (`1:7.2+dfsg-7+deb12u18+b3` gives
/// `1:7.2+dfsg-7+deb12u18`): QEMU's architecture-free packages (`qemu-system-data`) are of the
/// same source version but carry no such suffix.
pub fn source_version(version: &str) -> &str {
    match version.rsplit_once("+b") {
        Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => version,
    }
}

/// Of the versions apt offers of a package, the one built from the same source as `version`
/// (`version` itself when offered).
fn same_source(offered: &[String], version: &str) -> Option<String> {
    offered
        .iter()
        .find(|o| *o == version)
        .or_else(|| {
            offered
                .iter()
                .find(|o| source_version(o) == source_version(version))
        })
        .cloned()
}

fn at_least(version: &str, min: Option<(u32, u32)>) -> bool {
    min.is_none_or(|(a, b)| upstream(version).is_some_and(|(x, y, _)| (x, y) >= (a, b)))
}

/// The one version every QEMU package gets: one already installed when apt offers it for all
/// of them (a QEMU someone installed is kept) and it is at least `min`; else, with a `min`, the
/// newest apt offers for all of them from `min` on (`None`: there is none); else apt's
/// candidate for QEMU itself.
fn qemu_version(
    installed: &[Option<String>],
    min: Option<(u32, u32)>,
) -> Result<Option<String>, SetupError> {
    let names = qemu_packages();
    let mut offered = Vec::new();
    for p in &names {
        offered.push(available_versions(p)?);
    }
    let everywhere = |v: &String| offered.iter().all(|o| same_source(o, v).is_some());
    let kept = PACKAGES
        .iter()
        .zip(installed)
        .filter(|(p, _)| p.qemu)
        .filter_map(|(_, v)| v.as_ref())
        .find(|v| everywhere(v) && at_least(v, min));
    if let Some(v) = kept {
        return Ok(Some(v.clone()));
    }
    if min.is_some() {
        return Ok(offered[0]
            .iter()
            .filter(|v| everywhere(v) && at_least(v, min))
            .max_by_key(|v| upstream(v))
            .cloned());
    }
    let first = names[0];
    let v = candidate(first)?.ok_or_else(|| SetupError::NoPackage {
        package: first.into(),
    })?;
    if !everywhere(&v) {
        return Err(SetupError::NoCommonVersion {
            packages: names.join(", "),
            version: v,
        });
    }
    Ok(Some(v))
}

/// The distribution's release name (`bookworm`), from /etc/os-release.
fn codename() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
}

/// The Debian mirror apt already uses for `suite` (one-line or deb822 sources), else Debian's
/// own.
fn mirror_for(suite: &str) -> String {
    let mut texts = vec![std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut files: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            if f.extension().is_some_and(|x| x == "list" || x == "sources") {
                texts.push(std::fs::read_to_string(&f).unwrap_or_default());
            }
        }
    }
    texts
        .iter()
        .find_map(|t| mirror_in(t, suite))
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// The URI of an entry for `suite` in one sources file's text.
fn mirror_in(text: &str, suite: &str) -> Option<String> {
    // One-line style: `deb [options] URI suite components...`.
    let one_line = text.lines().find_map(|l| {
        let l = l.trim();
        let rest = l.strip_prefix("deb ")?;
        let rest = match rest.trim_start().strip_prefix('[') {
            Some(r) => r.split_once(']')?.1,
            None => rest,
        };
        let mut f = rest.split_whitespace();
        let uri = f.next()?;
        (f.next()? == suite).then(|| uri.to_string())
    });
    // deb822 style: stanzas of `Field: value` lines.
    one_line.or_else(|| {
        text.split("\n\n").find_map(|stanza| {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
            };
            let enabled = field("Enabled:").is_none_or(|v| v != "no");
            let debs = field("Types:").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
            let has = field("Suites:").is_some_and(|s| s.split_whitespace().any(|s| s == suite));
            (enabled && debs && has)
                .then(|| {
                    field("URIs:")?
                        .split_whitespace()
                        .next()
                        .map(str::to_string)
                })
                .flatten()
        })
    })
}

/// Whether apt's lists already hold `suite` (someone configured it before).
fn apt_knows(suite: &str) -> Result<bool, SetupError> {
    let policy = run(Command::new("apt-cache").arg("policy"))?;
    Ok(policy.contains(&format!(" {suite}/")))
}

/// Adds Debian 12's backports to apt's sources in a file of forkbox's own. Backports are pinned
/// at priority 100 by their release file (NotAutomatic, ButAutomaticUpgrades): nothing is
/// installed or upgraded from it unless named.
fn add_backports(
    progress: &mut dyn FnMut(&str),
    steps: &mut Vec<SetupStep>,
) -> Result<(), SetupError> {
    let mirror = mirror_for("bookworm");
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    let signed = if Path::new(keyring).exists() {
        format!("Signed-By: {keyring}\n")
    } else {
        String::new()
    };
    let text = format!(
        "# Added by `forkbox setup`: QEMU 10.0 for Debian 12 ({BACKPORTS}). apt pins backports\n\
         # at priority 100: nothing else is installed or upgraded from it unless named.\n\
         # Remove this file (then apt-get update) to drop it.\n\
         Types: deb\nURIs: {mirror}\nSuites: {BACKPORTS}\nComponents: main\n{signed}"
    );
    std::fs::write(BACKPORTS_FILE, text)
        .map_err(|e| SetupError::io(format!("write {BACKPORTS_FILE}"), e))?;
    progress(&format!(
        "added {BACKPORTS} ({mirror}) in {BACKPORTS_FILE}, for QEMU 10.0"
    ));
    steps.push(SetupStep {
        item: format!("apt source {BACKPORTS}"),
        why: "QEMU 10.0 for Debian 12 (nothing else is taken from it)".into(),
        action: format!("added {BACKPORTS_FILE} (remove it to drop it)"),
    });
    progress("updating the apt package lists");
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    Ok(())
}

/// The QEMU version to install from `source`, and the suite it comes from when that is not
/// the distribution's own (backports). May add backports to apt's sources.
fn choose_qemu(
    source: QemuSource,
    installed: &[Option<String>],
    progress: &mut dyn FnMut(&str),
    steps: &mut Vec<SetupStep>,
) -> Result<(String, Option<&'static str>), SetupError> {
    let min = match source {
        QemuSource::System => None,
        QemuSource::Recent => Some(RECENT_QEMU),
    };
    let from = |v: &String| v.contains("~bpo").then_some(BACKPORTS);
    if let Some(v) = qemu_version(installed, min)? {
        let suite = from(&v);
        return Ok((v, suite));
    }
    let name = codename().unwrap_or_default();
    if name == "bookworm" && !apt_knows(BACKPORTS)? {
        add_backports(progress, steps)?;
        if let Some(v) = qemu_version(installed, min)? {
            let suite = from(&v);
            return Ok((v, suite));
        }
    }
    Err(SetupError::NoRecentQemu {
        offered: candidate(qemu_packages()[0])?.unwrap_or_else(|| "none".into()),
        release: if name.is_empty() {
            "this system".into()
        } else {
            name
        },
    })
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

/// `apt-get install`'s arguments: forkbox's packages, each of QEMU's at the version built from
/// the same source as `version`, and what comes from backports with it (`suite`).
fn install_args(version: &str, suite: Option<&str>) -> Result<Vec<String>, SetupError> {
    let mut args: Vec<String> = PACKAGES
        .iter()
        .filter(|p| !p.qemu)
        .map(|p| p.name.to_string())
        .collect();
    for p in qemu_packages() {
        let exact = same_source(&available_versions(p)?, version).ok_or_else(|| {
            SetupError::NoCommonVersion {
                packages: qemu_packages().join(", "),
                version: version.to_string(),
            }
        })?;
        args.push(format!("{p}={exact}"));
    }
    if let Some(suite) = suite {
        args.extend(BACKPORTS_ALSO.iter().map(|p| format!("{p}/{suite}")));
    }
    Ok(args)
}

/// Installs forkbox's host packages in one apt transaction when a program is missing or
/// does not run, or the QEMU packages' versions differ; checks afterwards that every program
/// runs. Returns whether apt's package lists were updated.
fn install_packages(
    source: QemuSource,
    progress: &mut dyn FnMut(&str),
    steps: &mut Vec<SetupStep>,
) -> Result<bool, SetupError> {
    let installed: Vec<Option<String>> =
        PACKAGES.iter().map(|p| installed_version(p.name)).collect();
    let qemu_versions: std::collections::BTreeSet<&str> = PACKAGES
        .iter()
        .zip(&installed)
        .filter(|(p, _)| p.qemu)
        .filter_map(|(_, v)| v.as_deref())
        .map(source_version)
        .collect();
    let broken: Vec<&Package> = PACKAGES.iter().filter(|p| !runs(p)).collect();
    let old = source == QemuSource::Recent
        && !qemu_versions.iter().all(|v| at_least(v, Some(RECENT_QEMU)));
    let companions_off = QEMU_COMPANIONS.iter().any(|c| {
        installed_version(c).is_some_and(|v| qemu_versions.iter().any(|q| *q != source_version(&v)))
    });
    if broken.is_empty() && qemu_versions.len() <= 1 && !old && !companions_off {
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
            qemu_versions.iter().copied().collect::<Vec<_>>().join(", ")
        ));
    }
    if old {
        progress(&format!(
            "QEMU {} is older than {}.{}: copies could write their snapshot's RAM file, and TCG guests need padded RAM",
            qemu_versions.iter().copied().collect::<Vec<_>>().join(", "),
            RECENT_QEMU.0,
            RECENT_QEMU.1
        ));
    }
    progress("updating the apt package lists");
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    let (version, suite) = choose_qemu(source, &installed, progress, steps)?;
    let args = install_args(&version, suite)?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn qemu_versions_compare_by_their_upstream_release() {
        assert_eq!(upstream("1:10.0.2+ds-2+deb13u1~bpo12+1"), Some((10, 0, 2)));
        assert_eq!(upstream("1:7.2+dfsg-7+deb12u18+b3"), Some((7, 2, 0)));
        assert_eq!(upstream("1:99.0"), Some((99, 0, 0)));
        assert!(at_least("1:10.0.2+ds-2+deb13u1~bpo12+1", Some(RECENT_QEMU)));
        assert!(!at_least("1:7.2+dfsg-7+deb12u18+b3", Some(RECENT_QEMU)));
        assert!(at_least("1:7.2+dfsg-7+deb12u18+b3", None));
    }

    /// Debian 12's QEMU: the architecture-free data package has no binNMU suffix.
    #[test]
    fn qemu_packages_match_by_source_version() {
        assert_eq!(
            source_version("1:7.2+dfsg-7+deb12u18+b3"),
            "1:7.2+dfsg-7+deb12u18"
        );
        assert_eq!(
            source_version("1:10.0.2+ds-2+deb13u1~bpo12+1"),
            "1:10.0.2+ds-2+deb13u1~bpo12+1"
        );
        let data = vec![
            "1:7.2+dfsg-7+deb12u18".to_string(),
            "1:7.2+dfsg-7+deb12u15".into(),
        ];
        assert_eq!(
            same_source(&data, "1:7.2+dfsg-7+deb12u18+b3").as_deref(),
            Some("1:7.2+dfsg-7+deb12u18")
        );
        assert_eq!(same_source(&data, "1:7.2+dfsg-7+deb12u17+b1"), None);
    }

    #[test]
    fn the_mirror_is_the_one_apt_uses_for_the_suite() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirror_in(deb822, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(mirror_in(deb822, "trixie"), None);
        let disabled =
            "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n";
        assert_eq!(mirror_in(disabled, "bookworm"), None);
        let one_line = "# comment\ndeb [signed-by=/k.gpg arch=amd64] http://one.example/debian bookworm main\n\
                        deb http://sec.example/debian-security bookworm-security main\n";
        assert_eq!(
            mirror_in(one_line, "bookworm").as_deref(),
            Some("http://one.example/debian")
        );
        assert_eq!(
            mirror_in("deb http://plain.example/debian bookworm main", "bookworm").as_deref(),
            Some("http://plain.example/debian")
        );
    }
}
