//! TAP, as tape, node-tap, `node --test` and other producers print it. A test is the runner's
//! named test, not an assertion: tape's `# name` heading (its assertions follow it), or a
//! TAP14 subtest (`# Subtest: name`, its lines indented, closed by the point at the parent's
//! indentation; nested; node-tap's buffered `ok 1 - name {` … `}` too). Its id is its path of
//! names (`outer > inner`); it passed when all its assertions (and its own closing point)
//! passed, and a failing assertion is reported under it with its number and description.
//! Assertions under no name at all (plain TAP) are a test each, named by their description.

use super::{indent, Outcome, Parsed};

/// What a report keeps of one test's failing assertions and their diagnostics.
const SAID_CAP: usize = 4096;

/// One assertion or closing point: `ok 7 - description # SKIP why`.
struct Point {
    ok: bool,
    num: String,
    desc: String,
    /// `SKIP` or `TODO`: neither a pass nor a failure of the suite.
    skip: bool,
}

impl Point {
    fn parse(line: &str) -> Option<Point> {
        let (ok, rest) = match line.strip_prefix("not ok") {
            Some(rest) => (false, rest),
            None => (true, line.strip_prefix("ok")?),
        };
        if !(rest.is_empty() || rest.starts_with(' ')) {
            return None;
        }
        let rest = rest.trim_start();
        let (num, desc) = match rest.split_once(' ') {
            Some((n, d)) if n.parse::<u64>().is_ok() => (n, d),
            _ if rest.parse::<u64>().is_ok() => (rest, ""),
            _ => ("", rest),
        };
        let (desc, directive) = match desc.split_once(" # ") {
            Some((d, dir)) => (d, dir),
            None => match desc.strip_prefix("# ") {
                Some(dir) => ("", dir),
                None => (desc, ""),
            },
        };
        let directive = directive.trim().to_ascii_uppercase();
        let desc = desc.trim();
        let desc = desc.strip_prefix("- ").unwrap_or(desc).trim();
        Some(Point {
            ok,
            num: num.to_string(),
            desc: desc.to_string(),
            skip: directive.starts_with("SKIP") || directive.starts_with("TODO"),
        })
    }

    /// Failed as the suite counts it (a TODO's failure is expected).
    fn failed(&self) -> bool {
        !self.ok && !self.skip
    }

    fn outcome(&self) -> Outcome {
        if self.skip {
            Outcome::Skipped
        } else if self.ok {
            Outcome::Passed
        } else {
            Outcome::Failed
        }
    }

    /// The line as the runner printed it, without its directive.
    fn said(&self) -> String {
        let mark = if self.ok { "ok" } else { "not ok" };
        [mark, &self.num, &self.desc]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Assertions under one heading (tape's `# name`), or under none.
#[derive(Default)]
struct Group {
    heading: Option<String>,
    /// Each assertion, with what it said when it failed (its line and diagnostics).
    points: Vec<(Point, String)>,
}

impl Group {
    fn outcome(&self) -> Outcome {
        if self.points.iter().any(|(p, _)| p.failed()) {
            Outcome::Failed
        } else if self.points.iter().all(|(p, _)| p.skip) {
            Outcome::Skipped
        } else {
            Outcome::Passed
        }
    }

    fn failures(&self) -> String {
        let mut s = String::new();
        for (_, said) in self.points.iter().filter(|(p, _)| p.failed()) {
            if s.len() + said.len() > SAID_CAP {
                break;
            }
            s.push_str(said);
            s.push('\n');
        }
        s.trim_end().to_string()
    }
}

/// One level of the output: the top, or a subtest.
struct Block {
    /// Indentation of the parent's lines, where this subtest's closing point comes.
    parent_at: usize,
    /// Its path of names (empty at the top).
    path: Vec<String>,
    groups: Vec<Group>,
    /// Whether it holds subtests, and whether one of them failed.
    children: bool,
    child_failed: bool,
    /// Its plan came after its points: comments from here on are a summary (`# tests 7`).
    planned: bool,
    /// Buffered (node-tap's `ok 1 - name {` … `}`): its closing point came first.
    closing: Option<Point>,
}

impl Block {
    fn new(path: Vec<String>, parent_at: usize, closing: Option<Point>) -> Block {
        Block {
            parent_at,
            path,
            groups: vec![Group::default()],
            children: false,
            child_failed: false,
            planned: false,
            closing,
        }
    }

    fn group(&mut self) -> &mut Group {
        if self.groups.is_empty() {
            self.groups.push(Group::default());
        }
        let last = self.groups.len() - 1;
        &mut self.groups[last]
    }

    fn has_points(&self) -> bool {
        self.groups.iter().any(|g| !g.points.is_empty())
    }
}

#[derive(Default)]
struct Reader {
    /// The top first, the innermost subtest last.
    stack: Vec<Block>,
    out: Parsed,
}

impl Reader {
    fn top(&mut self) -> &mut Block {
        if self.stack.is_empty() {
            self.stack.push(Block::new(Vec::new(), 0, None));
        }
        let last = self.stack.len() - 1;
        &mut self.stack[last]
    }

    /// A test of `o` named `id`, with what its failure said.
    fn test(&mut self, id: &[String], o: Outcome, said: String) {
        let id = self.out.add(id.join(" > "), o);
        if !said.is_empty() && matches!(o, Outcome::Failed | Outcome::Error) {
            self.out.failures.insert(id, said);
        }
    }

    /// Ends the innermost subtest, closed by `closing` (or by its buffered opening line, or
    /// by nothing when its output ended early): its tests are added, its parent told.
    fn finish(&mut self, closing: Option<Point>) {
        let Some(mut b) = self.stack.pop() else {
            return;
        };
        let closing = closing.or(b.closing.take());
        let mut failed = b.child_failed;
        let direct = b.has_points();
        for g in std::mem::take(&mut b.groups) {
            if g.points.is_empty() {
                continue;
            }
            let mut o = g.outcome();
            let mut id = b.path.clone();
            match &g.heading {
                Some(h) => id.push(h.clone()),
                // The subtest's own assertions: the test is the subtest, and its closing point
                // counts too (a plan not met, an exception after the assertions).
                None => {
                    if closing.as_ref().is_some_and(Point::failed) && !b.child_failed {
                        o = Outcome::Failed;
                    }
                }
            }
            failed |= o == Outcome::Failed;
            let said = match (g.failures(), &closing) {
                (s, Some(c)) if s.is_empty() && g.heading.is_none() => c.said(),
                (s, _) => s,
            };
            self.test(&id, o, said);
        }
        match &closing {
            // A leaf with no assertions of its own (`node --test`'s tests): its point says.
            Some(c) if !direct && !b.children => {
                failed |= c.failed();
                self.test(&b.path, c.outcome(), c.said());
            }
            // A suite that failed while every test in it passed (a hook threw): an error
            // under its own name.
            Some(c) if !direct && c.failed() && !b.child_failed => {
                failed = true;
                self.test(&b.path, Outcome::Error, c.said());
            }
            _ => {}
        }
        if let Some(parent) = self.stack.last_mut() {
            parent.children = true;
            parent.child_failed |= failed;
        }
    }

    /// The top's assertions: under a heading, a test per heading; under none, a test each.
    fn finish_top(&mut self) {
        let Some(top) = self.stack.pop() else {
            return;
        };
        for g in top.groups {
            match &g.heading {
                Some(h) if !g.points.is_empty() => {
                    let (o, said) = (g.outcome(), g.failures());
                    self.test(std::slice::from_ref(h), o, said);
                }
                Some(_) => {}
                None => {
                    for (p, said) in g.points {
                        let name = if p.desc.is_empty() {
                            p.num.clone()
                        } else {
                            p.desc.clone()
                        };
                        self.test(&[name], p.outcome(), said);
                    }
                }
            }
        }
    }

    /// Ends the subtests a line at indentation `at` is outside of; whether the line was the
    /// innermost one's closing point (or its buffered form's `}`), and so is used up.
    fn leave(&mut self, at: usize, line: &str) -> bool {
        while self.stack.len() > 1 {
            let top = self.top();
            if at > top.parent_at {
                return false;
            }
            let buffered = top.closing.is_some();
            if at == top.parent_at {
                if buffered && line == "}" {
                    self.finish(None);
                    return true;
                }
                if !buffered {
                    if let Some(p) = Point::parse(line).filter(|p| !p.desc.ends_with(" {")) {
                        self.finish(Some(p));
                        return true;
                    }
                }
            }
            self.finish(None);
        }
        false
    }

    /// Reads one line; what it was.
    fn line(&mut self, at: usize, l: &str) -> Line {
        if self.leave(at, l) {
            return Line::Point;
        }
        if let Some(name) = l.strip_prefix("# Subtest:") {
            let mut path = self.top().path.clone();
            path.push(name.trim().to_string());
            self.stack.push(Block::new(path, at, None));
            return Line::Other;
        }
        if let Some(p) = Point::parse(l) {
            if let Some(name) = p.desc.strip_suffix(" {") {
                let mut path = self.top().path.clone();
                path.push(name.trim().to_string());
                let child = Block::new(path, at, Some(p));
                self.stack.push(child);
                return Line::Other;
            }
            let said = if p.failed() { p.said() } else { String::new() };
            self.top().group().points.push((p, said));
            return Line::Assertion;
        }
        if let Some(c) = l.strip_prefix('#') {
            let top = self.top();
            if !top.planned && !c.trim().is_empty() {
                top.groups.push(Group {
                    heading: Some(c.trim().to_string()),
                    points: Vec::new(),
                });
            }
            return Line::Other;
        }
        if is_plan(l) {
            let top = self.top();
            top.planned |= top.has_points() || top.children;
        }
        Line::Other
    }
}

/// What a line was, for the diagnostics that may follow it.
#[derive(PartialEq)]
enum Line {
    Assertion,
    /// A closing point (its diagnostics are the runner's, not an assertion's).
    Point,
    Other,
}

/// `1..N` (maybe with `# SKIP why`).
fn is_plan(l: &str) -> bool {
    l.split_once("..").is_some_and(|(a, b)| {
        a.parse::<u64>().is_ok()
            && b.split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok())
    })
}

/// Every test a TAP stream names (see the module's text).
pub fn parse(text: &str) -> Parsed {
    let mut r = Reader::default();
    // Inside a YAML diagnostics block opened at this indentation (`---` … `...`), and
    // whether it is an assertion's.
    let mut yaml: Option<(usize, bool)> = None;
    let mut last = Line::Other;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        let at = indent(line);
        if let Some((y, mine)) = yaml {
            if at >= y && l != "..." {
                // What a failing assertion said: kept with it.
                if let Some((p, said)) = r.top().group().points.last_mut().filter(|_| mine) {
                    if p.failed() && said.len() < SAID_CAP {
                        said.push('\n');
                        said.push_str(line.get(y..).unwrap_or(l).trim_end());
                    }
                }
                continue;
            }
            yaml = None;
            if l == "..." {
                continue;
            }
        }
        if l == "---" && last != Line::Other {
            yaml = Some((at, last == Line::Assertion));
            last = Line::Other;
            continue;
        }
        last = r.line(at, l);
    }
    while r.stack.len() > 1 {
        r.finish(None);
    }
    r.finish_top();
    r.out
}
