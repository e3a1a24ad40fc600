//! `forkbox setup` on fresh Debian 12 hosts (mmdebstrap roots):
//!
//! - by default it brings QEMU 10.0 from bookworm-backports (an apt source of its own), and
//!   nothing else from there but the firmware it needs; on a host that carries a newer
//!   `qemu-utils` than any QEMU (a 1:99 from a local apt repository the test makes, which breaks
//!   every older QEMU the way a backported one breaks bookworm's), where installing
//!   `qemu-system-x86` alone would make apt remove it;
//! - `--qemu=system` keeps the distribution's QEMU 7.2 and adds no source.
//!
//! Both end with every program running, and a second run changes nothing.
//! Needs a Debian mirror (mmdebstrap, apt); ~4 minutes, no VM.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};

use forkbox_test_infra as infra;
use sha2::{Digest, Sha256};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `script` with `sh` inside `root`, with /proc and /dev mounted in a mount namespace of
/// its own (gone when it ends).
fn inside(root: &Path, script: &str) -> Output {
    let r = root.display();
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && \
             exec chroot {r} env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin FORKBOX_HOME=/fbhome sh -c \"$0\"",
        ))
        .arg(script)
        .output()
        .unwrap()
}

/// A package `qemu-utils` 1:99 whose `qemu-img` prints a version, and which breaks every
/// older QEMU, in an apt repository (flat, trusted) at `repo`.
fn conflicting_repo(repo: &Path) {
    let pkg = repo.join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/bin")).unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: qemu-utils\nVersion: 1:99.0\nArchitecture: amd64\n\
         Maintainer: forkbox tests <tests@forkbox.invalid>\n\
         Breaks: qemu-system-common (<< 1:99)\n\
         Description: a newer qemu-utils than the host's QEMU\n",
    )
    .unwrap();
    let img = pkg.join("usr/bin/qemu-img");
    std::fs::write(&img, "#!/bin/sh\necho 'qemu-img version 99.0'\n").unwrap();
    std::fs::set_permissions(&img, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let deb = repo.join("qemu-utils_99.0_amd64.deb");
    let st = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(&deb)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_dir_all(&pkg).unwrap();
    let control = Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .output()
        .unwrap();
    let bytes = std::fs::read(&deb).unwrap();
    let entry = format!(
        "{}Filename: ./qemu-utils_99.0_amd64.deb\nSize: {}\nSHA256: {:x}\n\n",
        text(&control.stdout),
        bytes.len(),
        Sha256::digest(&bytes),
    );
    std::fs::write(repo.join("Packages"), entry).unwrap();
}

/// The line of set-up's table about `item`.
fn line_of<'a>(table: &'a str, item: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(item))
        .unwrap_or_else(|| panic!("no line about {item} in:\n{table}"))
}

fn version(root: &Path, pkg: &str) -> String {
    let out = inside(root, &format!("dpkg-query -W -f '${{Version}}' {pkg}"));
    text(&out.stdout)
}

/// A fresh Debian 12 root under `dir`, with this forkbox in it.
fn fresh_bookworm(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("host");
    let st = Command::new("mmdebstrap")
        .args(["--variant=minbase", "--quiet", "bookworm"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "mmdebstrap failed");
    std::fs::copy(
        env!("CARGO_BIN_EXE_forkbox"),
        root.join("usr/local/bin/forkbox"),
    )
    .unwrap();
    root
}

/// Every program runs after setup; the QEMU packages share one version, `qemu-system-x86`'s of
/// which is returned.
fn programs_run(root: &Path) -> String {
    let out = inside(
        root,
        "qemu-system-x86_64 --version && qemu-img --version && mmdebstrap --version && mkfs.ext4 -V && test -s /etc/ssl/certs/ca-certificates.crt && test -e /usr/share/qemu/qboot.rom",
    );
    assert!(
        out.status.success(),
        "a program does not run after setup: {}",
        text(&out.stderr)
    );
    let versions: Vec<String> = [
        "qemu-system-x86",
        "qemu-system-common",
        "qemu-system-data",
        "qemu-utils",
    ]
    .iter()
    .map(|p| version(root, p))
    .collect();
    // One source version (the architecture-free data package has no binNMU suffix).
    let source = forkbox_engine::setup::source_version;
    assert!(
        versions.iter().all(|v| source(v) == source(&versions[0])),
        "{versions:?}"
    );
    versions[0].clone()
}

/// Set-up again changes nothing and says what is there.
fn second_run_changes_nothing(root: &Path, args: &str, utils: &str) {
    let out = inside(root, &format!("forkbox setup {args}"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = line_of(&stdout, "qemu-utils (qemu-img)");
    assert!(
        line.contains(&format!("already present ({utils})")),
        "{stdout}"
    );
    assert!(
        !text(&out.stderr).contains("installing"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn setup_brings_qemu_10_from_backports_even_over_a_newer_conflicting_qemu_utils() {
    let home = infra::home();
    let dir = tempfile::tempdir_in(home.home()).unwrap();
    let root = fresh_bookworm(dir.path());

    conflicting_repo(&root.join("localrepo"));
    std::fs::write(
        root.join("etc/apt/sources.list.d/newer.list"),
        "deb [trusted=yes] file:/localrepo ./\n",
    )
    .unwrap();
    let out = inside(
        &root,
        "apt-get update -q >/dev/null && apt-get install -y -q qemu-utils=1:99.0 >/dev/null && qemu-img --version",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("99.0"));

    let out = inside(&root, "forkbox setup");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stderr}{stdout}");
    assert!(out.status.success(), "setup failed:\n{stdout}\n{stderr}");
    assert!(
        line_of(&stdout, "apt source bookworm-backports").contains("forkbox-backports.sources"),
        "setup should say which apt source it added:\n{stdout}"
    );
    let line = line_of(&stdout, "qemu-utils (qemu-img)");
    assert!(
        line.contains("changed 1:99.0 -> 1:10."),
        "setup should say qemu-utils changed to backports' QEMU 10, never that it was \
         present:\n{stdout}\n{stderr}"
    );
    let utils = programs_run(&root);
    assert!(
        utils.starts_with("1:10.") && utils.contains("~bpo12"),
        "{utils}"
    );
    let out = inside(&root, "qemu-system-x86_64 --version");
    assert!(
        text(&out.stdout).contains("version 10."),
        "{}",
        text(&out.stdout)
    );

    // Nothing but QEMU and its firmware came from backports, and apt still prefers bookworm's
    // own versions for everything else (backports pinned at 100).
    let out = inside(&root, "dpkg-query -W -f '${Package} ${Version}\\n'");
    let ours = [
        "qemu-system-x86",
        "qemu-system-common",
        "qemu-system-data",
        "qemu-utils",
        "seabios",
    ];
    let from_backports: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.contains("~bpo"))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|p| !ours.contains(p))
        .map(str::to_string)
        .collect();
    assert!(from_backports.is_empty(), "{from_backports:?}");
    let policy = text(&inside(&root, "apt-cache policy").stdout);
    assert!(
        policy
            .lines()
            .any(|l| l.trim_start().starts_with("100 ") && l.contains("bookworm-backports")),
        "{policy}"
    );

    second_run_changes_nothing(&root, "", &utils);
}

#[test]
fn setup_keeps_the_distributions_qemu_when_asked() {
    let home = infra::home();
    let dir = tempfile::tempdir_in(home.home()).unwrap();
    let root = fresh_bookworm(dir.path());

    let out = inside(&root, "forkbox setup --qemu=system");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stderr}{stdout}");
    assert!(out.status.success(), "setup failed:\n{stdout}\n{stderr}");
    assert!(
        !root
            .join("etc/apt/sources.list.d/forkbox-backports.sources")
            .exists(),
        "--qemu=system added backports"
    );
    let utils = programs_run(&root);
    assert!(utils.starts_with("1:7.2"), "{utils}");
    second_run_changes_nothing(&root, "--qemu=system", &utils);
}
