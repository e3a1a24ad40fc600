//! Mocha's default `spec` reporter: a suite's title on a line of its own, its tests two spaces
//! deeper (`✔ title`, `✓ title` before Mocha 10, `N) title` failed, `- title` pending), the
//! whole indented two spaces per level. A test's id is the path of its suites' titles and its
//! own (`Array > #indexOf() > returns -1`); the file is not printed, so two tests of the same
//! path in two files are told apart by ordinals. Reading stops at the summary (`N passing`),
//! after which the failures are listed again.

use super::{indent, Outcome, Parsed};

/// `  12 passing (30ms)`: the line that ends the tests and says this is Mocha's output.
fn summary(l: &str) -> bool {
    l.split_once(' ')
        .is_some_and(|(n, rest)| n.parse::<u64>().is_ok() && rest.starts_with("passing"))
}

/// Whether `text` is Mocha's spec output.
pub fn is_spec(text: &str) -> bool {
    text.lines().any(|l| summary(l.trim()))
}

/// A test line: its outcome and title.
fn test_line(l: &str) -> Option<(Outcome, &str)> {
    for mark in ['✔', '✓'] {
        if let Some(rest) = l.strip_prefix(mark) {
            // A slow test's time: `✔ title (105ms)`.
            let title = rest.trim();
            let title = match title.rfind(" (") {
                Some(p) if title.ends_with("ms)") => &title[..p],
                _ => title,
            };
            return Some((Outcome::Passed, title));
        }
    }
    if let Some(rest) = l.strip_prefix("- ") {
        return Some((Outcome::Skipped, rest.trim()));
    }
    let (n, rest) = l.split_once(") ")?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| (Outcome::Failed, rest.trim()))
}

/// Every test Mocha's spec output names; empty when `text` is not that output.
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    if !is_spec(text) {
        return out;
    }
    // Open suites: (indentation, title).
    let mut suites: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        if summary(l) {
            break;
        }
        let at = indent(line);
        // Mocha indents everything it prints under the root; what a test itself prints
        // usually starts at the margin, and is not a suite.
        if at == 0 {
            continue;
        }
        while suites.last().is_some_and(|(i, _)| *i >= at) {
            suites.pop();
        }
        match test_line(l) {
            Some((o, title)) => {
                let mut id: Vec<&str> = suites.iter().map(|(_, s)| s.as_str()).collect();
                id.push(title);
                out.add(id.join(" > "), o);
            }
            None => suites.push((at, l.to_string())),
        }
    }
    out
}
