//! No function of the engine, the server, the CLI or E2B's front end runs over 100 lines: a step that wants
//! more usually hides a type or a step that wants a name. Reads the source as rustfmt writes it
//! (a function ends at the `}` with its own indentation); no VM.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};

const MOST_LINES: usize = 100;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The name of the function a line starts, if it starts one.
fn starts_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for word in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(word).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Functions over `most` lines in `text`: (name, first line, lines).
fn long_functions(text: &str, most: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = starts_fn(line) else {
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        // A declaration without a body (a trait's) ends with `;` before any `{`.
        let body = lines[i..]
            .iter()
            .position(|l| l.trim_end().ends_with('{'))
            .filter(|&b| !lines[i..i + b].iter().any(|l| l.trim_end().ends_with(';')));
        let Some(b) = body else {
            continue;
        };
        if lines[i + b].trim_end().ends_with("{}") {
            continue;
        }
        if let Some(end) = lines[i + b..].iter().position(|l| l.trim_end() == close) {
            let n = b + end + 1;
            if n > most {
                long.push((name.to_string(), i + 1, n));
            }
        }
    }
    long
}

#[test]
fn no_function_is_over_100_lines() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for c in ["engine", "server", "cli", "e2b"] {
        rust_files(&crates.join(c).join("src"), &mut files);
    }
    assert!(files.len() > 40, "only {} files read", files.len());
    let mut long = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (name, line, n) in long_functions(&text, MOST_LINES) {
            let at = f.strip_prefix(crates).unwrap_or(f).display().to_string();
            long.push(format!("{at}:{line}: {name} is {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines (give their steps names):\n{}",
        long.join("\n")
    );
}

/// The check finds a long function, counts to its own closing brace (not a nested one's) and
/// passes over declarations without a body.
#[test]
fn a_long_function_would_be_found() {
    let mut text = String::from("trait T {\n    fn decl(&self);\n}\n\nimpl X {\n    pub async fn long(&self) {\n        if x {\n        }\n");
    for _ in 0..100 {
        text.push_str("        step();\n");
    }
    text.push_str("    }\n\n    fn short() {\n        one();\n    }\n}\n");
    let long = long_functions(&text, MOST_LINES);
    assert_eq!(long, vec![("long".to_string(), 6, 104)]);
    assert!(long_functions(&text, 104).is_empty());
}
