//! What a Dockerfile build is made of, as one digest: the Dockerfile's text, its build
//! arguments, every file of its context (path, kind, mode, link target and content; not
//! times) and, for each `FROM` that names a forkbox image, the version it resolves to now. A
//! build records it ([`super::ImageMeta::inputs`]); a build asked to run only if something
//! changed (`--if-changed`, E2B's cache) finds the newest version of the name made of the
//! same inputs and returns it instead, nothing run. A registry's image is matched by its name as
//! written, as Docker's cache matches it (build without the cache to take a tag that moved).

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::dockerfile as df;
use super::{Base, Context, Image, ImageRef, ImageStore};
use crate::error::ImageError;
use crate::paths::Paths;

/// Changes when what a digest covers changes.
const FORMAT: &str = "forkbox dockerfile inputs 1";

/// The digest of a build of `dockerfile` (parsed as `file`) with `args` in `context`.
pub fn digest(
    paths: &Paths,
    dockerfile: &str,
    file: &df::Dockerfile,
    args: &BTreeMap<String, String>,
    context: Context<'_>,
) -> Result<String, ImageError> {
    let files = match context {
        Context::Archive(a) => archive_entries(a),
        Context::Dir(d) => dir_entries(d),
    }
    .map_err(|e| ImageError::io("read the build context for its digest", e))?;
    let mut h = Sha256::new();
    let mut put = |s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    put(FORMAT);
    put(dockerfile);
    for (k, v) in args {
        put(&format!("arg {k}={v}"));
    }
    for (path, entry) in &files {
        put(&format!("file {path} {entry}"));
    }
    for from in bases(paths, file, args) {
        put(&format!("from {from}"));
    }
    Ok(hex(&h.finalize()))
}

/// The newest version of `name`, when it was made of `inputs`.
pub fn same_as_newest(paths: &Paths, name: &str, inputs: &str) -> Option<Image> {
    let newest = ImageStore::new(paths)
        .resolve(&ImageRef {
            name: name.to_string(),
            version: None,
        })
        .ok()?;
    (newest.meta.inputs.as_deref() == Some(inputs)).then_some(newest)
}

/// Each stage's `FROM` with the global arguments put in; a forkbox image's as the version it
/// resolves to and when that was made.
fn bases(paths: &Paths, file: &df::Dockerfile, args: &BTreeMap<String, String>) -> Vec<String> {
    let globals = file.globals(args);
    let store = ImageStore::new(paths);
    file.stages
        .iter()
        .map(|st| {
            let from = df::substitute(&st.from, &globals);
            match Base::parse(&from) {
                Ok(Base::Image(r)) => match store.resolve(&r) {
                    Ok(img) => format!("{} made {}", img.reference(), img.meta.created_unix),
                    Err(_) => from,
                },
                _ => from,
            }
        })
        .collect()
}

/// A context's entries from its archive (tar.zst): path to kind, mode, link and content.
fn archive_entries(archive: &Path) -> io::Result<BTreeMap<String, String>> {
    let f = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(zstd::Decoder::new(f)?);
    let mut out = BTreeMap::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = normal(&entry.path()?.to_string_lossy());
        let mode = entry.header().mode()? & 0o7777;
        let kind = entry.header().entry_type();
        let described = if kind.is_dir() {
            format!("d {mode:o}")
        } else if kind.is_symlink() || kind.is_hard_link() {
            let link = entry
                .link_name()?
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{} {link}", if kind.is_symlink() { "l" } else { "h" })
        } else {
            format!("f {mode:o} {}", content(&mut entry)?)
        };
        if !path.is_empty() && path != "." {
            out.insert(path, described);
        }
    }
    Ok(out)
}

/// A context's entries from its directory, as [`archive_entries`] has them, without what its
/// `.dockerignore` leaves out (as a build never sees it).
fn dir_entries(dir: &Path) -> io::Result<BTreeMap<String, String>> {
    let ignore = super::context::Ignore::load(dir);
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let rel = e
                .path()
                .strip_prefix(dir)
                .unwrap_or(&e.path())
                .to_path_buf();
            if ignore.excluded(&rel) {
                continue;
            }
            let meta = e.path().symlink_metadata()?;
            let path = normal(&rel.to_string_lossy());
            let mode = meta.permissions().mode() & 0o7777;
            let described = if meta.is_dir() {
                stack.push(e.path());
                format!("d {mode:o}")
            } else if meta.file_type().is_symlink() {
                format!("l {}", std::fs::read_link(e.path())?.to_string_lossy())
            } else {
                format!(
                    "f {mode:o} {}",
                    content(&mut std::fs::File::open(e.path())?)?
                )
            };
            out.insert(path, described);
        }
    }
    Ok(out)
}

fn normal(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_end_matches('/')
        .to_string()
}

fn content(r: &mut impl Read) -> io::Result<String> {
    let mut h = Sha256::new();
    io::copy(r, &mut h)?;
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn context(files: &[(&str, &str, u32)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, text, mode) in files {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        d
    }

    fn archive_of(dir: &Path) -> tempfile::NamedTempFile {
        let out = tempfile::NamedTempFile::new().unwrap();
        let enc = zstd::Encoder::new(std::fs::File::create(out.path()).unwrap(), 3).unwrap();
        let mut tar = tar::Builder::new(enc);
        tar.append_dir_all(".", dir).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
        out
    }

    fn digest_of(home: &Path, text: &str, args: &[(&str, &str)], ctx: Context<'_>) -> String {
        let paths = Paths::new(home.to_path_buf());
        let file = df::parse(text).unwrap();
        let args = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        digest(&paths, text, &file, &args, ctx).unwrap()
    }

    #[test]
    fn the_same_inputs_give_the_same_digest_and_any_change_another() {
        let home = tempfile::tempdir().unwrap();
        let text = "FROM alpine:3.20\nCOPY . /app\nRUN make\n";
        let a = context(&[
            ("main.c", "int main(){}", 0o644),
            ("sub/run.sh", "echo", 0o755),
        ]);
        let d = |t: &str, args: &[(&str, &str)], dir: &Path| {
            digest_of(home.path(), t, args, Context::Dir(dir))
        };
        let base = d(text, &[], a.path());
        // The directory and its archive agree; times do not count.
        let archive = archive_of(a.path());
        assert_eq!(
            digest_of(home.path(), text, &[], Context::Archive(archive.path())),
            base
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(a.path().join("main.c"), "int main(){}").unwrap();
        assert_eq!(d(text, &[], a.path()), base);
        // Each of these is another build.
        assert_ne!(
            d(
                "FROM alpine:3.20\nCOPY . /app\nRUN make all\n",
                &[],
                a.path()
            ),
            base
        );
        assert_ne!(d(text, &[("V", "1")], a.path()), base);
        let content = context(&[
            ("main.c", "int main(){return 1;}", 0o644),
            ("sub/run.sh", "echo", 0o755),
        ]);
        assert_ne!(d(text, &[], content.path()), base);
        let mode = context(&[
            ("main.c", "int main(){}", 0o644),
            ("sub/run.sh", "echo", 0o644),
        ]);
        assert_ne!(d(text, &[], mode.path()), base);
        let more = context(&[
            ("main.c", "int main(){}", 0o644),
            ("sub/run.sh", "echo", 0o755),
            ("x", "", 0o644),
        ]);
        assert_ne!(d(text, &[], more.path()), base);
        // What .dockerignore leaves out does not count.
        let ignore = more.path().join(".dockerignore");
        std::fs::write(&ignore, "x\n").unwrap();
        std::fs::set_permissions(&ignore, std::fs::Permissions::from_mode(0o644)).unwrap();
        let ignoring = d(text, &[], more.path());
        std::fs::write(more.path().join("x"), "changed").unwrap();
        assert_eq!(d(text, &[], more.path()), ignoring);
    }
}
