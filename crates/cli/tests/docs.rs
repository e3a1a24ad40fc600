//! The pages a newcomer reads stay true to the repository: every relative link in the README,
//! ARCHITECTURE.md and `docs/` leads to a file or folder that exists (a `#anchor` into a Markdown
//! file to a heading that makes it, by GitHub's rules), the README stays a front page (at most
//! 250 lines, the two set-up commands alone under "Two commands"), CI runs the README's test
//! command, and `docs/reference/cli.md` is what `forkbox man --markdown` prints now. No VM.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const README_MOST_LINES: usize = 250;
const BLESS: &str = "FORKBOX_BLESS";

fn repo() -> PathBuf {
    forkbox_test_infra::repo_root()
}

/// The lines of `text` outside fenced code blocks, with their numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// The targets of the `[text](target)` links on `line`, code spans left out.
fn link_targets(line: &str) -> Vec<&str> {
    let b = line.as_bytes();
    let mut targets = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            // A code span ends at the next run of as many backticks.
            let n = b[i..].iter().take_while(|&&c| c == b'`').count();
            let ticks = &line[i..i + n];
            i = match line[i + n..].find(ticks) {
                Some(end) => i + n + end + n,
                None => i + n,
            };
        } else if b[i..].starts_with(b"](") {
            let rest = &line[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim());
            i += 2 + end;
        } else {
            i += 1;
        }
    }
    targets
}

/// The anchor GitHub makes of a heading: lowercase, spaces to `-`, punctuation other than `-`
/// and `_` dropped (a link's text stays, its target goes).
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        text += &rest[..at];
        rest = rest[at..].find(')').map_or("", |end| &rest[at + end + 1..]);
    }
    text += rest;
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor the headings of a Markdown text make (a repeated one gets `-1`, `-2`, …).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let s = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(s.clone()).or_default();
        out.push(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// What is wrong with the relative links of the Markdown file `file`: one line each.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    let mut broken = Vec::new();
    for (n, line) in prose(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let shown = file.strip_prefix(repo()).unwrap_or(file);
            let at = format!("{}:{n}: ({target})", shown.display());
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            if path.starts_with('/') {
                broken.push(format!(
                    "{at}: absolute; links here are relative to their file"
                ));
                continue;
            }
            let to = if path.is_empty() {
                file.to_path_buf()
            } else {
                dir.join(path)
            };
            if !to.exists() {
                broken.push(format!("{at}: no such file or folder"));
            } else if !anchor.is_empty() && to.extension().is_some_and(|e| e == "md") {
                let theirs = anchors(&std::fs::read_to_string(&to).unwrap());
                if !theirs.iter().any(|a| a == anchor) {
                    broken.push(format!("{at}: no heading makes #{anchor}"));
                }
            }
        }
    }
    broken
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            markdown_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

#[test]
fn every_relative_link_leads_somewhere() {
    let root = repo();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    markdown_under(&root.join("docs"), &mut files);
    assert!(files.len() > 10, "only {} pages read", files.len());
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker finds what it is there to find: a missing file, a missing heading, an absolute
/// path; and it leaves code, fenced or inline, and other sites alone.
#[test]
fn the_link_checker_finds_broken_links() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("other.md"),
        "# A Title: `here`, twice\n## Ok\n## Ok\n",
    )
    .unwrap();
    let page = dir.path().join("page.md");
    let text =
        "[a](other.md#a-title-here-twice) [b](other.md#ok-1) [c](#mine) [d](https://x.org/y)\n\
                ## Mine\n\
                `[e](nowhere.md)` [f](missing.md) [g](other.md#nothing)\n\
                ```\n[h](nowhere.md)\n```\n\
                [i](/etc/passwd)\n";
    std::fs::write(&page, text).unwrap();
    let broken = broken_links(&page).join("\n");
    for (wrong, why) in [
        ("(missing.md)", "no such file"),
        ("(other.md#nothing)", "no heading makes #nothing"),
        ("(/etc/passwd)", "absolute"),
    ] {
        assert!(
            broken.contains(&format!("{wrong}: {why}")),
            "{wrong} not found broken:\n{broken}"
        );
    }
    assert_eq!(broken.lines().count(), 3, "{broken}");
}

#[test]
fn the_readme_is_a_front_page_with_two_commands() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() <= README_MOST_LINES,
        "README.md has {} lines, more than {README_MOST_LINES}: move the rest into docs/",
        lines.len()
    );
    let start = lines
        .iter()
        .position(|l| *l == "## Two commands")
        .expect("README.md has a section \"## Two commands\"");
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |e| start + 1 + e);
    let mut blocks = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in &lines[start + 1..end] {
        match (open.take(), line.trim_start().starts_with("```")) {
            (None, true) => open = Some(Vec::new()),
            (Some(block), true) => blocks.push(block.join("\n")),
            (Some(mut block), false) => {
                block.push(line.trim());
                open = Some(block);
            }
            (None, false) => {}
        }
    }
    assert_eq!(
        blocks,
        ["./scripts/demo.sh", "./scripts/test.sh"],
        "\"## Two commands\" sets forkbox up and tests it in two commands, one block each"
    );
}

#[test]
fn ci_runs_the_readmes_test_command() {
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "./scripts/test.sh"),
        ".ci/run does not run ./scripts/test.sh, the README's test command:\n{ci}"
    );
}

/// Fails when `file` (under the repository) is not `made`, naming the first line that differs;
/// with FORKBOX_BLESS=1 writes it instead.
fn matches_or_bless(file: &str, made: &str, test: &str) {
    let path = repo().join(file);
    if std::env::var_os(BLESS).is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, made).unwrap();
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old == made {
        return;
    }
    let line = old
        .lines()
        .zip(made.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(old.lines().count().min(made.lines().count()));
    panic!(
        "{file} is not what the code makes now (first difference at line {}); write it anew \
         with `{BLESS}=1 cargo nextest run -p forkbox-cli --test docs {test}` and commit it",
        line + 1
    );
}

#[test]
fn the_cli_reference_is_what_forkbox_prints() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_forkbox"))
        .args(["man", "--markdown"])
        .env("FORKBOX_HOME", home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "forkbox man --markdown: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = String::from_utf8(out.stdout).unwrap();
    assert!(made.contains("## `forkbox sandbox exec`"), "{made}");
    matches_or_bless(
        "docs/reference/cli.md",
        &made,
        "the_cli_reference_is_what_forkbox_prints",
    );
}
