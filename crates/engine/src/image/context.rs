//! A Dockerfile build's context: where COPY sources come from (never outside it), what
//! `.dockerignore` leaves out, and how sources are packed and placed in the build's sandbox.

use std::path::{Component, Path, PathBuf};

use super::build as b;
use super::docker::failed;
use crate::error::ImageError;

/// Where a build's context is.
#[derive(Debug, Clone, Copy)]
pub enum Context<'a> {
    /// A directory of the host's (the CLI's `forkbox image build --dockerfile`).
    Dir(&'a Path),
    /// A tar.zst file of it (what the API's clients send): unpacked into the build's own
    /// directory with every entry checked (plain files, directories and links with relative
    /// names), and gone with it.
    Archive(&'a Path),
}

/// The context's directory: the one given, or the archive unpacked in the build's `work`.
pub(super) fn context_dir(
    name: &str,
    context: Context<'_>,
    work: &Path,
) -> Result<PathBuf, ImageError> {
    let dir = match context {
        Context::Dir(d) => d.to_path_buf(),
        Context::Archive(file) => {
            let dir = work.join("context");
            std::fs::create_dir(&dir)
                .map_err(|e| ImageError::io("make the context's directory", e))?;
            let f = std::fs::File::open(file).map_err(|e| {
                failed(
                    name,
                    "read the build context",
                    format!("{}: {e}", file.display()),
                )
            })?;
            crate::files::unpack_checked(std::io::BufReader::new(f), &dir).map_err(|e| {
                failed(
                    name,
                    "read the build context",
                    format!(
                        "the context is not a tar.zst of plain files, directories and links: {e}"
                    ),
                )
            })?;
            dir
        }
    };
    dir.canonicalize().map_err(|e| {
        failed(
            name,
            "read the build context",
            format!("{}: {e}", dir.display()),
        )
    })
}

/// A COPY source relative to the context, or none if it climbs out of it.
pub(super) fn inside_context(s: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(s).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir if !out.pop() => return None,
            _ => {}
        }
    }
    Some(out)
}

/// `*` and `?` in one path component.
pub(super) fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The paths (relative to the context) a source names: itself, or what its wildcards in the
/// last component match; never what `.dockerignore` leaves out.
pub(super) fn expand(context: &Path, rel: &Path, ignore: &Ignore) -> Vec<PathBuf> {
    let last = rel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !last.contains(['*', '?']) {
        let full = context.join(rel);
        if full.symlink_metadata().is_ok() && (rel.as_os_str().is_empty() || !ignore.excluded(rel))
        {
            return vec![rel.to_path_buf()];
        }
        return vec![];
    }
    let parent = rel.parent().unwrap_or(Path::new(""));
    let mut out: Vec<PathBuf> = std::fs::read_dir(context.join(parent))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| parent.join(e.file_name()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| wildcard(&last, &n.to_string_lossy()))
                && !ignore.excluded(p)
        })
        .collect();
    out.sort();
    out
}

/// One source as sent: `staging/K/NAME` (a directory whose contents are copied when
/// `whole_dir`).
pub(super) struct Placed {
    pub(super) k: usize,
    pub(super) name: String,
    pub(super) is_dir: bool,
    /// The archive holds the directory's contents at `staging/K/` (a stage's directory).
    pub(super) whole_dir: bool,
}

/// Packs each picked path as `K/NAME` (directories with what `.dockerignore` leaves) into a
/// tar.zst at `out`.
pub(super) fn pack_context(
    context: &Path,
    picked: &[PathBuf],
    ignore: &Ignore,
    out: &Path,
) -> std::io::Result<Vec<Placed>> {
    let f = std::fs::File::create(out)?;
    let enc = zstd::Encoder::new(f, 3)?;
    let mut tar = tar::Builder::new(enc);
    tar.follow_symlinks(false);
    let mut placed = Vec::new();
    for (k, rel) in picked.iter().enumerate() {
        let full = context.join(rel);
        let meta = full.symlink_metadata()?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| ".".into());
        let is_dir = meta.is_dir();
        let top = PathBuf::from(k.to_string()).join(if rel.as_os_str().is_empty() {
            "context"
        } else {
            &name
        });
        if is_dir {
            let mut stack = vec![(full.clone(), rel.clone(), top.clone())];
            while let Some((dir, drel, dtop)) = stack.pop() {
                tar.append_path_with_name(&dir, &dtop)?;
                let mut entries: Vec<_> = std::fs::read_dir(&dir)?.flatten().collect();
                entries.sort_by_key(|e| e.file_name());
                for e in entries {
                    let erel = drel.join(e.file_name());
                    if ignore.excluded(&erel) {
                        continue;
                    }
                    let etop = dtop.join(e.file_name());
                    if e.file_type()?.is_dir() {
                        stack.push((e.path(), erel, etop));
                    } else {
                        tar.append_path_with_name(e.path(), &etop)?;
                    }
                }
            }
        } else {
            tar.append_path_with_name(&full, &top)?;
        }
        placed.push(Placed {
            k,
            name: top
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            is_dir,
            whole_dir: false,
        });
    }
    tar.into_inner()?.finish()?;
    Ok(placed)
}

/// The shell that puts the sent sources where docker would: a directory's contents into
/// DEST, a file into DEST (or DEST/ when DEST is a directory), a local archive unpacked by
/// ADD; owners and modes as `--chown`/`--chmod` say.
pub(super) fn place_script(
    staging: &str,
    placed: &[Placed],
    dest: &str,
    add: bool,
    chown: Option<&str>,
    chmod: Option<&str>,
    dest_is_dir: bool,
) -> String {
    let q = b::sh_quote;
    let mut s = format!("set -e\nS={}\nD={}\n", q(staging), q(dest));
    if let Some(o) = chown {
        s += &format!("chown -R {} \"$S\"\n", q(o));
    }
    if let Some(m) = chmod {
        s += &format!("find \"$S\" -mindepth 2 -exec chmod {} {{}} +\n", q(m));
    }
    let into_dir = dest_is_dir || placed.len() > 1;
    for p in placed {
        let src = if p.whole_dir {
            format!("\"$S\"/{}", p.k)
        } else {
            format!("\"$S\"/{}/{}", p.k, q(&p.name))
        };
        let archive = [
            ".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst",
        ]
        .iter()
        .any(|e| p.name.ends_with(e));
        if p.is_dir {
            s += &format!("mkdir -p \"$D\"\ncp -a {src}/. \"$D\"/\n");
        } else if add && archive {
            s += &format!("mkdir -p \"$D\"\ntar -xf {src} -C \"$D\"\n");
        } else if into_dir {
            s += &format!("mkdir -p \"$D\"\ncp -a {src} \"$D\"/\n");
        } else {
            s += &format!("mkdir -p \"$(dirname \"$D\")\"\ncp -a {src} \"$D\"\n");
        }
    }
    s += "rm -rf \"$S\"\n";
    s
}

/// `.dockerignore`: patterns over paths relative to the context (`*`, `?` within a component,
/// `**` any number of them, `!` to take back); a pattern that names a directory leaves out
/// everything in it.
#[derive(Debug, Default)]
pub(super) struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    pub(super) fn load(context: &Path) -> Ignore {
        let text = std::fs::read_to_string(context.join(".dockerignore")).unwrap_or_default();
        let rules = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (neg, p) = match l.strip_prefix('!') {
                    Some(p) => (true, p.trim()),
                    None => (false, l),
                };
                let parts = p
                    .trim_start_matches("./")
                    .trim_matches('/')
                    .split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .map(str::to_string)
                    .collect();
                (neg, parts)
            })
            .collect();
        Ignore { rules }
    }

    pub(super) fn excluded(&self, rel: &Path) -> bool {
        let comps: Vec<String> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let mut out = false;
        for (neg, pat) in &self.rules {
            // The path, or a directory above it, matches.
            if (1..=comps.len()).any(|n| matches(pat, &comps[..n])) {
                out = !neg;
            }
        }
        out
    }
}

pub(super) fn matches(pat: &[String], comps: &[String]) -> bool {
    match (pat.first(), comps.first()) {
        (None, None) => true,
        (Some(p), _) if p == "**" => {
            matches(&pat[1..], comps) || (!comps.is_empty() && matches(pat, &comps[1..]))
        }
        (Some(p), Some(c)) => wildcard(p, c) && matches(&pat[1..], &comps[1..]),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sources_stay_in_the_context_and_wildcards_match_as_docker_matches() {
        assert_eq!(
            inside_context("./pkg/../package.json"),
            Some(PathBuf::from("package.json"))
        );
        assert_eq!(inside_context("../outside"), None);
        assert!(wildcard("package*.json", "package-lock.json"));
        assert!(wildcard("package*.json", "package.json"));
        assert!(!wildcard("package*.json", "package.jsonx"));
    }

    #[test]
    fn dockerignore_leaves_out_what_it_names() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join(".dockerignore"),
            "node_modules\n**/*.log\n!keep.log\n# c\n",
        )
        .unwrap();
        let ig = Ignore::load(t.path());
        assert!(ig.excluded(Path::new("node_modules/x/index.js")));
        assert!(ig.excluded(Path::new("a/b/debug.log")));
        assert!(!ig.excluded(Path::new("keep.log")));
        assert!(!ig.excluded(Path::new("src/index.js")));
    }
}
