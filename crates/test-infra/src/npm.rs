//! Node projects for tests: a published package's tarball with its suite, its development
//! dependencies trimmed, locked (this machine's npm writes lock files without `resolved`
//! URLs) and installed on the host; and a sandbox's QEMU throttled, as a slow guest.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The development dependencies qs's tape suite needs (the rest of its list is tooling).
pub const QS_KEEP: &[&str] = &[
    "tape",
    "es-value-fixtures",
    "for-each",
    "has-override-mistake",
    "has-property-descriptors",
    "has-symbols",
    "iconv-lite",
    "mock-property",
    "object-inspect",
    "safer-buffer",
];

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().expect("run npm");
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` holding the lock of the cache in `dir` (tests run side by side).
pub fn locked<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    let file = std::fs::File::create(dir.join(".lock")).expect("the lock file");
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("the lock");
    f()
}

/// `file` (a .tgz) unpacked into a fresh directory.
pub fn untar(file: &Path) -> tempfile::TempDir {
    let work = tempfile::tempdir().expect("a directory");
    run(
        Command::new("tar")
            .arg("xzf")
            .arg(file)
            .arg("-C")
            .arg(work.path()),
        &format!("tar xzf {}", file.display()),
    );
    work
}

/// The package `spec`'s tarball (fetched once into `dir/tarballs`), unpacked into a fresh
/// directory, its development dependencies trimmed to `keep` (plus `add`), its scripts replaced
/// by `npm_test` alone, locked and installed (`npm ci` on the host). Returns the directory and
/// the project in it.
pub fn project(
    dir: &Path,
    spec: &str,
    keep: &[&str],
    add: &[(&str, &str)],
    npm_test: Option<&str>,
) -> (tempfile::TempDir, PathBuf) {
    let cache = dir.join("tarballs");
    std::fs::create_dir_all(&cache).expect("the tarballs' directory");
    let file = cache.join(format!("{}.tgz", spec.replace(['/', '@'], "_")));
    locked(dir, || {
        if !file.exists() {
            let tmp = tempfile::tempdir_in(&cache).expect("a directory");
            run(
                Command::new("npm")
                    .args(["pack", "--silent", spec])
                    .current_dir(tmp.path()),
                &format!("npm pack {spec}"),
            );
            let packed = std::fs::read_dir(tmp.path())
                .expect("the packed tarball")
                .flatten()
                .next()
                .expect("the packed tarball")
                .path();
            std::fs::rename(packed, &file).expect("keep the tarball");
        }
    });
    let work = untar(&file);
    let code = work.path().join("package");
    let manifest = code.join("package.json");
    let mut pkg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).expect("package.json"))
            .expect("package.json");
    let mut dev = serde_json::Map::new();
    for (name, version) in pkg["devDependencies"]
        .as_object()
        .cloned()
        .unwrap_or_default()
    {
        if keep.contains(&name.as_str()) {
            dev.insert(name, version);
        }
    }
    for (name, version) in add {
        dev.insert(name.to_string(), serde_json::Value::from(*version));
    }
    pkg["devDependencies"] = serde_json::Value::Object(dev);
    // What would run on install is not the suite's business; `npm test` is the suite's.
    if let Some(o) = pkg.as_object_mut() {
        o.remove("scripts");
    }
    if let Some(test) = npm_test {
        pkg["scripts"] = serde_json::json!({ "test": test });
    }
    std::fs::write(
        &manifest,
        serde_json::to_vec_pretty(&pkg).expect("package.json"),
    )
    .expect("write package.json");
    run(
        Command::new("npm")
            .args([
                "install",
                "--package-lock-only",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
            ])
            .current_dir(&code),
        &format!("{spec}: npm install --package-lock-only"),
    );
    run(
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(&code),
        &format!("{spec}: npm ci"),
    );
    (work, code)
}

/// Limits the QEMU of sandbox `id` to `percent` of one core from now on (its cgroup's CPU
/// quota, v1 or v2): a guest that reads and answers slowly.
pub fn throttle(id: &str, percent: u32) {
    let quota = percent * 1000;
    let v1 = PathBuf::from(format!("/sys/fs/cgroup/cpu/forkbox/{id}/cpu.cfs_quota_us"));
    let (file, text) = if v1.exists() {
        (v1, quota.to_string())
    } else {
        (
            PathBuf::from(format!("/sys/fs/cgroup/forkbox/{id}/cpu.max")),
            format!("{quota} 100000"),
        )
    };
    std::fs::write(&file, text).unwrap_or_else(|e| panic!("throttle {}: {e}", file.display()));
}
