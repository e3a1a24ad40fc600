//! Reading test results out of what test runners print or write: pytest's `-rA` summary,
//! JUnit XML (pytest, Java, JS and Go reporters), `go test -json`, `cargo test` / nextest
//! output, TAP, and JavaScript's runners: `node --test` (TAP or spec), Jest and Vitest JSON,
//! Mocha JSON. Each parser takes text and returns every test it names with an outcome;
//! text it cannot read is an error for that run, never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod spec;
mod tap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Failed,
    Error,
    Skipped,
    /// Failed as it was marked to (pytest `xfail`): not a pass.
    Xfailed,
    /// Passed though marked to fail (a non-strict `xfail`; a strict one is reported failed).
    Xpassed,
}

/// Test id -> outcome.
pub type Results = BTreeMap<String, Outcome>;

/// What one report said: every test with its outcome, what each failed test said, and which
/// full names more than one test had.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub results: Results,
    /// What each failed or errored test said, by id, where the report tells.
    pub failures: Failures,
    /// How many tests had each full name so far.
    names: BTreeMap<String, usize>,
}

impl From<Results> for Parsed {
    fn from(results: Results) -> Parsed {
        Parsed {
            results,
            ..Parsed::default()
        }
    }
}

impl Parsed {
    /// Adds a test named `id`; the id it has. A name another test already had is another
    /// test of the same name (two `it('works')` in one suite, two files with the same suite
    /// path): it becomes `ID #2`, `ID #3`, … in the order the runner reported them, never
    /// merged with the first, which would let one's failure hide the other's.
    fn add(&mut self, id: String, o: Outcome) -> String {
        let n = self.names.entry(id.clone()).or_insert(0);
        *n += 1;
        let mut k = *n;
        let mut unique = match k {
            1 => id.clone(),
            k => format!("{id} #{k}"),
        };
        // A test really named so (`works #2`) keeps its name.
        while self.results.contains_key(&unique) {
            k += 1;
            unique = format!("{id} #{k}");
        }
        self.results.insert(unique.clone(), o);
        unique
    }

    /// Adds what another report of the same run said (a runner writes one report per
    /// process, Maven one per class): a test both name keeps its worse outcome.
    pub fn merge(&mut self, other: Parsed) {
        for (id, o) in other.results {
            add(&mut self.results, id, o);
        }
        self.failures.extend(other.failures);
        for (id, n) in other.names {
            let had = self.names.entry(id).or_insert(0);
            *had = (*had).max(n);
        }
    }

    /// Full names more than one test had, with how many had each.
    pub fn repeated(&self) -> BTreeMap<&str, usize> {
        self.names
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| (id.as_str(), *n))
            .collect()
    }

    /// What a report says of the names more than one test had, if any did.
    pub fn repeated_note(&self) -> Option<String> {
        let r = self.repeated();
        if r.is_empty() {
            return None;
        }
        let shown: Vec<String> = r
            .iter()
            .take(5)
            .map(|(id, n)| format!("\"{id}\" \u{d7}{n}"))
            .collect();
        let more = match r.len() {
            n if n > 5 => format!(" and {} more", n - 5),
            _ => String::new(),
        };
        Some(format!(
            "{} test names are shared by more than one test, told apart by ordinals (NAME #2, #3, \u{2026} in the order the runner reported them): {}{more}",
            r.len(),
            shown.join(", ")
        ))
    }
}

/// How many tests had each outcome, said in the words and order of pytest's summary line
/// (`2373 passed, 1 failed, 4 skipped, 1 xfailed`), so forkbox's figures read like the
/// runner's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub failed: usize,
    pub passed: usize,
    pub skipped: usize,
    pub xfailed: usize,
    pub xpassed: usize,
    pub error: usize,
}

impl Counts {
    pub fn of(r: &Results) -> Counts {
        let mut c = Counts::default();
        for o in r.values() {
            match o {
                Outcome::Passed => c.passed += 1,
                Outcome::Failed => c.failed += 1,
                Outcome::Error => c.error += 1,
                Outcome::Skipped => c.skipped += 1,
                Outcome::Xfailed => c.xfailed += 1,
                Outcome::Xpassed => c.xpassed += 1,
            }
        }
        c
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            (self.failed, "failed"),
            (self.passed, "passed"),
            (self.skipped, "skipped"),
            (self.xfailed, "xfailed"),
            (self.xpassed, "xpassed"),
            (self.error, if self.error == 1 { "error" } else { "errors" }),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, w)| format!("{n} {w}"))
        .collect();
        if parts.is_empty() {
            f.write_str("no tests")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Whichever of the formats below the text is.
    Auto,
    PytestRa,
    Junit,
    GoJson,
    Cargo,
    Tap,
    /// Jest's `--json` report, or Vitest's `--reporter=json` (the same shape).
    Jest,
    /// Mocha's `--reporter json`.
    Mocha,
    /// `node --test`: its TAP or its spec output.
    NodeTest,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("no test results found in the test command's output ({0})")]
    Empty(String),
    #[error("the JUnit XML report is not readable: {0}")]
    Xml(String),
}

fn add(r: &mut Results, id: String, o: Outcome) {
    let worst = |a: Outcome, b: Outcome| {
        let rank = |o| match o {
            Outcome::Error => 5,
            Outcome::Failed => 4,
            Outcome::Xfailed => 3,
            Outcome::Xpassed => 2,
            Outcome::Passed => 1,
            Outcome::Skipped => 0,
        };
        if rank(a) >= rank(b) {
            a
        } else {
            b
        }
    };
    r.entry(id).and_modify(|e| *e = worst(*e, o)).or_insert(o);
}

/// pytest with `-rA`: the "short test summary info" lines `PASSED tests/x.py::t`, `FAILED
/// tests/x.py::t - AssertionError`, `ERROR ...`, `XFAIL ...`, `XPASS ...`, `SKIPPED [1]
/// tests/x.py:3: reason`. A collection error (`ERROR tests/x.py - ImportError`) is kept under
/// the file's path; `forkbox-migrate`'s verdicts give it to every test of that file.
pub fn pytest_ra(text: &str) -> Results {
    let mut r = Results::new();
    for line in text.lines() {
        let line = line.trim_end();
        let (word, rest) = match line.split_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let outcome = match word {
            "PASSED" => Outcome::Passed,
            "FAILED" => Outcome::Failed,
            "XFAIL" => Outcome::Xfailed,
            "XPASS" => Outcome::Xpassed,
            "ERROR" => Outcome::Error,
            "SKIPPED" => Outcome::Skipped,
            _ => continue,
        };
        // `SKIPPED [1] path:line: reason` names no test id; skip-by-location.
        let id = if outcome == Outcome::Skipped && rest.starts_with('[') {
            match rest
                .split_once("] ")
                .and_then(|(_, l)| l.split(": ").next())
            {
                Some(loc) => loc.to_string(),
                None => continue,
            }
        } else {
            node_id(rest).to_string()
        };
        let collection_error = outcome == Outcome::Error && is_test_file(&id);
        if id.contains("::") || outcome == Outcome::Skipped || collection_error {
            add(&mut r, id, outcome);
        }
    }
    r
}

/// The node id at the start of a summary line's rest: up to the first space outside the
/// parameter brackets (`tests/x.py::t[a b] - reason` gives `tests/x.py::t[a b]`; an XPASS
/// line has its reason after a plain space).
fn node_id(rest: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ' ' if depth <= 0 => return &rest[..i],
            _ => {}
        }
    }
    rest.trim()
}

/// Whether `id` names a file of tests rather than a test (`tests/test_x.py`).
pub fn is_test_file(id: &str) -> bool {
    !id.contains("::") && !id.contains(' ') && id.ends_with(".py")
}

/// One `<testcase>` of a JUnit XML report.
struct Case<'a> {
    name: &'a str,
    class: &'a str,
    file: Option<&'a str>,
    /// From its `<failure>`, `<error>` or `<skipped>` child; a skip of type `pytest.xfail` is
    /// an xfail.
    outcome: Outcome,
    /// A failure's or error's message and text (empty otherwise).
    detail: String,
}

/// Every `<testcase>` of a JUnit XML report, handed to `f`.
fn junit_cases(text: &str, mut f: impl FnMut(Case<'_>)) -> Result<(), ReportError> {
    let doc = roxmltree::Document::parse(text).map_err(|e| ReportError::Xml(e.to_string()))?;
    for case in doc.descendants().filter(|n| n.has_tag_name("testcase")) {
        let outcome = case
            .children()
            .find_map(|c| match (c.tag_name().name(), c.attribute("type")) {
                ("failure", _) => Some(Outcome::Failed),
                ("error", _) => Some(Outcome::Error),
                ("skipped", Some("pytest.xfail")) => Some(Outcome::Xfailed),
                ("skipped", _) => Some(Outcome::Skipped),
                _ => None,
            })
            .unwrap_or(Outcome::Passed);
        let detail = case
            .children()
            .find(|c| matches!(c.tag_name().name(), "failure" | "error"))
            .map(|c| {
                let message = c.attribute("message").unwrap_or("");
                let text = c.text().unwrap_or("").trim();
                match (message.is_empty(), text.is_empty()) {
                    (_, true) => message.to_string(),
                    (true, false) => text.to_string(),
                    (false, false) => format!("{message}\n{text}"),
                }
            })
            .unwrap_or_default();
        f(Case {
            name: case.attribute("name").unwrap_or(""),
            class: case.attribute("classname").unwrap_or(""),
            file: case.attribute("file"),
            outcome,
            detail,
        });
    }
    Ok(())
}

/// pytest's own JUnit XML (`junit_family=xunit1`, which names each test's `file`), read into
/// pytest node ids (`tests/test_a.py::TestX::test_one[1]`): the ids `-rA` prints, but with a
/// skipped test under its own id (the `-rA` summary names only its location) and an xfail
/// told apart (`<skipped type="pytest.xfail">`). A collection error is kept under its file.
pub fn pytest_junit(text: &str) -> Result<Results, ReportError> {
    pytest_junit_detailed(text).map(|(r, _)| r)
}

/// What each failed or errored test said (its message and text), by test id.
pub type Failures = BTreeMap<String, String>;

/// [`pytest_junit`], with what each failed or errored test said.
pub fn pytest_junit_detailed(text: &str) -> Result<(Results, Failures), ReportError> {
    let mut r = Results::new();
    let mut failures = Failures::new();
    junit_cases(
        text,
        |Case {
             name,
             class,
             file,
             outcome,
             detail,
         }| {
            let id = match file {
                Some(file) if !class.is_empty() => {
                    let module = file.trim_end_matches(".py").replace('/', ".");
                    match class.strip_prefix(&module) {
                        Some("") => format!("{file}::{name}"),
                        Some(rest) if rest.starts_with('.') => {
                            format!("{file}::{}::{name}", rest[1..].replace('.', "::"))
                        }
                        // The class path does not start at the file's (another rootdir).
                        _ => format!("{file}::{name}"),
                    }
                }
                // A collection error: `classname=""`, `name="tests.test_c"`.
                _ if class.is_empty() && outcome == Outcome::Error => {
                    format!("{}.py", name.replace('.', "/"))
                }
                _ => format!("{class}::{name}"),
            };
            if !detail.is_empty() {
                failures.insert(id.clone(), detail);
            }
            add(&mut r, id, outcome);
        },
    )?;
    Ok((r, failures))
}

/// JUnit XML: `<testcase classname= name=>` with `<failure>`, `<error>` or `<skipped>` (any
/// skip, an xfail too: only pytest's own report is read for those, by [`pytest_junit`]). A
/// test's id is `classname.name`, as JUnit tools name it.
pub fn junit(text: &str) -> Result<Results, ReportError> {
    let mut r = Results::new();
    junit_cases(
        text,
        |Case {
             name,
             class,
             outcome,
             ..
         }| {
            let id = if class.is_empty() {
                name.to_string()
            } else {
                format!("{class}.{name}")
            };
            let outcome = match outcome {
                Outcome::Xfailed => Outcome::Skipped,
                o => o,
            };
            add(&mut r, id, outcome);
        },
    )?;
    Ok(r)
}

/// `go test -json`: one JSON object per line; `Action` pass/fail/skip with a `Test`. A test's
/// id is `package/TestName` (a subtest's `package/TestName/sub`), as `go test -run` names it.
/// A package that failed without reporting any test (its test binary did not build, or
/// failed before its tests ran) is an error under the package's own id.
pub fn go_json(text: &str) -> Results {
    let mut r = Results::new();
    let mut tested = std::collections::BTreeSet::new();
    let mut failed = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(action), Some(pkg)) = (v["Action"].as_str(), v["Package"].as_str()) else {
            continue;
        };
        let Some(test) = v["Test"].as_str() else {
            if action == "fail" {
                failed.push(pkg.to_string());
            }
            continue;
        };
        let outcome = match action {
            "pass" => Outcome::Passed,
            "fail" => Outcome::Failed,
            "skip" => Outcome::Skipped,
            _ => continue,
        };
        tested.insert(pkg.to_string());
        add(&mut r, format!("{pkg}/{test}"), outcome);
    }
    for pkg in failed {
        if !tested.contains(&pkg) {
            add(&mut r, pkg, Outcome::Error);
        }
    }
    r
}

/// What `go test -json` carries for people: the text of its `output` events (and of
/// `build-output` events, Go 1.24's), lines that are not JSON as they are.
pub fn go_json_text(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) if v.is_object() => {
                if let Some(o) = v["Output"].as_str() {
                    out.push_str(o);
                }
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// `cargo test` (`test a::b ... ok|FAILED|ignored`) and nextest (`PASS [ 0.1s] crate::bin test`).
pub fn cargo(text: &str) -> Results {
    let mut r = Results::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("test ") {
            if let Some((name, result)) = rest.rsplit_once(" ... ") {
                let outcome = match result.split([' ', ',']).next().unwrap_or("") {
                    "ok" => Outcome::Passed,
                    "FAILED" => Outcome::Failed,
                    "ignored" => Outcome::Skipped,
                    _ => continue,
                };
                add(&mut r, name.trim().to_string(), outcome);
            }
            continue;
        }
        let (word, rest) = match line.split_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let outcome = match word {
            "PASS" => Outcome::Passed,
            "FAIL" | "TIMEOUT" | "SIGSEGV" | "SIGABRT" => Outcome::Failed,
            "SKIP" => Outcome::Skipped,
            _ => continue,
        };
        if let Some((_, id)) = rest.split_once("] ") {
            let id = id.split_once(") ").map(|(_, i)| i).unwrap_or(id);
            add(&mut r, id.trim().to_string(), outcome);
        }
    }
    r
}

/// TAP from any producer (tape, node-tap, `node --test`, …): every named test, see [`tap`].
pub fn tap(text: &str) -> Parsed {
    tap::parse(text)
}

/// Mocha's default spec output: every test by its suite path, see [`spec`].
pub fn mocha_spec(text: &str) -> Parsed {
    spec::parse(text)
}

/// The first JSON object in `text` that has `key` at its top level (a runner may print other
/// lines before its report).
fn json_report(text: &str, key: &str) -> Option<serde_json::Value> {
    text.match_indices('{').find_map(|(at, _)| {
        let v = serde_json::Deserializer::from_str(&text[at..])
            .into_iter::<serde_json::Value>()
            .next()?
            .ok()?;
        v.get(key).is_some().then_some(v)
    })
}

/// Jest's `--json` report, and Vitest's `--reporter=json` (the same shape): each assertion as
/// `FILE > ANCESTOR > … > TITLE`; a file that failed without running any test (it did not
/// load) is an error under its own name.
pub fn jest_json(text: &str) -> Parsed {
    let mut r = Parsed::default();
    let Some(report) = json_report(text, "testResults") else {
        return r;
    };
    let files = report["testResults"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for file in &files {
        let name = file["name"].as_str().unwrap_or("");
        let cases = file["assertionResults"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if cases.is_empty() && file["status"] == "failed" {
            r.add(name.to_string(), Outcome::Error);
        }
        for case in &cases {
            let mut id = vec![name.to_string()];
            id.extend(
                case["ancestorTitles"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(str::to_string)),
            );
            id.push(case["title"].as_str().unwrap_or("").to_string());
            let outcome = match case["status"].as_str().unwrap_or("") {
                "passed" => Outcome::Passed,
                "failed" => Outcome::Failed,
                _ => Outcome::Skipped, // pending, skipped, todo, disabled
            };
            r.add(id.join(" > "), outcome);
        }
    }
    r
}

/// Mocha's JSON reporter: each test as `FILE > FULL TITLE`; a failed hook (`"before all"
/// hook …`) is an error under its own title.
pub fn mocha_json(text: &str) -> Parsed {
    let mut r = Parsed::default();
    let Some(report) = json_report(text, "passes").filter(|v| v.get("failures").is_some()) else {
        return r;
    };
    let id = |t: &serde_json::Value| {
        let title = t["fullTitle"].as_str().unwrap_or("");
        match t["file"].as_str() {
            Some(file) => format!("{file} > {title}"),
            None => title.to_string(),
        }
    };
    for (list, outcome) in [
        ("passes", Outcome::Passed),
        ("pending", Outcome::Skipped),
        ("failures", Outcome::Failed),
    ] {
        for t in report[list].as_array().into_iter().flatten() {
            let hook = t["title"].as_str().is_some_and(|s| s.contains("hook"));
            let o = match (outcome, hook) {
                (Outcome::Failed, true) => Outcome::Error,
                (o, _) => o,
            };
            r.add(id(t), o);
        }
    }
    r
}

/// Indentation of a line, in characters.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// `node --test`'s spec output: `▶ suite`, then `✔`/`✖`/`﹣` lines indented under it; the
/// summary of failing tests at the end repeats them and is not read.
pub fn node_spec(text: &str) -> Parsed {
    let mut r = Parsed::default();
    let mut suites: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        let at = indent(line);
        let l = line.trim();
        if l.starts_with("✖ failing tests") {
            break;
        }
        let (mark, rest) = match l.chars().next() {
            Some(c @ ('▶' | '✔' | '✖' | '﹣')) => (c, l[c.len_utf8()..].trim()),
            _ => continue,
        };
        // "name (1.23ms)" or "name (1.23ms) # SKIP"
        let (rest, directive) = rest.split_once(" # ").unwrap_or((rest, ""));
        let name = match rest.rfind(" (") {
            Some(p) if rest.ends_with("ms)") => &rest[..p],
            _ => rest,
        };
        while suites.last().is_some_and(|(i, _)| *i > at) {
            suites.pop();
        }
        if mark == '▶' {
            suites.push((at, name.to_string()));
            continue;
        }
        if suites.last().is_some_and(|(i, n)| *i == at && n == name) {
            suites.pop(); // a suite's closing line
            continue;
        }
        let outcome = match (mark, directive.to_ascii_uppercase()) {
            (_, d) if d.starts_with("SKIP") || d.starts_with("TODO") => Outcome::Skipped,
            ('﹣', _) => Outcome::Skipped,
            ('✔', _) => Outcome::Passed,
            _ => Outcome::Failed,
        };
        let mut id: Vec<&str> = suites.iter().map(|(_, n)| n.as_str()).collect();
        id.push(name);
        r.add(id.join(" > "), outcome);
    }
    r
}

/// `node --test`'s TAP (read as any TAP, see [`tap`]) or spec output, whichever `text` is.
pub fn node_test(text: &str) -> Parsed {
    match text.contains("# Subtest: ") {
        true => tap(text),
        false => node_spec(text),
    }
}

/// Reads results in `format` from `text`; `Auto` tries JUnit XML, the JSON reports, then each
/// line format, and takes the first that finds tests. Where a runner names two tests alike
/// (the JavaScript runners), they are two tests, told apart by ordinals (see
/// [`Parsed::repeated_note`]); where a runner reports one test twice (pytest's setup and
/// teardown, a rerun), it keeps its worst outcome.
pub fn parse(format: Format, text: &str) -> Result<Parsed, ReportError> {
    let found = match format {
        Format::Junit => junit(text)?.into(),
        Format::PytestRa => pytest_ra(text).into(),
        Format::GoJson => go_json(text).into(),
        Format::Cargo => cargo(text).into(),
        Format::Tap => tap(text),
        Format::Jest => jest_json(text),
        Format::Mocha => match mocha_json(text) {
            r if r.results.is_empty() => mocha_spec(text),
            r => r,
        },
        Format::NodeTest => node_test(text),
        Format::Auto => {
            if text.trim_start().starts_with('<') {
                junit(text)?.into()
            } else {
                // The JSON reports are looked for only where there can be one.
                let json = |f: fn(&str) -> Parsed| match text.contains('{') {
                    true => f(text),
                    false => Parsed::default(),
                };
                let lines = |f: fn(&str) -> Results| Parsed::from(f(text));
                // Tried in turn, each only when those before it found nothing.
                let readers: [&dyn Fn() -> Parsed; 8] = [
                    &|| json(jest_json),
                    &|| json(mocha_json),
                    &|| lines(pytest_ra),
                    &|| lines(go_json),
                    &|| lines(cargo),
                    // Before `node --test`'s spec, which marks passes with the same ✔.
                    &|| mocha_spec(text),
                    &|| node_test(text),
                    &|| tap(text),
                ];
                readers
                    .iter()
                    .map(|read| read())
                    .find(|r| !r.results.is_empty())
                    .unwrap_or_default()
            }
        }
    };
    if found.results.is_empty() {
        return Err(ReportError::Empty(format!("format {format:?}")));
    }
    Ok(found)
}

/// What to add to a test command whose standard output held no results forkbox reads, given
/// what it printed on standard error (where Jest and Vitest print their human report).
pub fn what_to_add(stderr: &str) -> &'static str {
    let jest = stderr.contains("Tests:") && (stderr.contains("PASS ") || stderr.contains("FAIL "));
    let vitest = stderr.contains("Test Files ");
    if jest {
        "this looks like Jest, which prints its report on standard error: add --json (jest --json)"
    } else if vitest {
        "this looks like Vitest: add --reporter=json (vitest run --reporter=json)"
    } else {
        "make the command print a report forkbox reads on standard output: pytest, JUnit XML, go test -json, cargo test, TAP (tape, node-tap, node --test --test-reporter=tap), Mocha's spec or --reporter json, Jest's --json or Vitest's --reporter=json"
    }
}

/// How many test results one line of a runner's live output reports, for a progress count
/// while the suite runs (an estimate: the parsed report is what counts). Knows pytest's
/// progress dots (`..F.s [ 40%]`) and `-v` lines, TAP, `cargo test` and `go test -json`.
pub fn tests_in_line(line: &str) -> usize {
    let l = line.trim_end();
    if let Some(open) = l.rfind(" [") {
        if l.ends_with("%]") {
            let marks = l[..open].trim_end();
            if !marks.is_empty() && marks.chars().all(|c| ".FEsxX".contains(c)) {
                return marks.len();
            }
        }
    }
    let pytest_v = l.contains("::")
        && [
            " PASSED", " FAILED", " ERROR", " SKIPPED", " XFAIL", " XPASS",
        ]
        .iter()
        .any(|w| l.contains(w));
    let tap = l.starts_with("ok ") || l.starts_with("not ok ");
    let cargo = l.starts_with("test ")
        && (l.ends_with(" ... ok") || l.ends_with(" ... FAILED") || l.ends_with(" ... ignored"));
    let go = l.contains("\"Test\":")
        && [
            "\"Action\":\"pass\"",
            "\"Action\":\"fail\"",
            "\"Action\":\"skip\"",
        ]
        .iter()
        .any(|a| l.contains(a));
    usize::from(pytest_v || tap || cargo || go)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What every JavaScript fixture holds: the same suite (tests/fixtures: real output of
    /// Jest 29, Vitest 2, Mocha 10, and Node 20's test runner, paths rewritten to /work).
    fn same_suite(r: &Results, file: &str, sep_top: &str) {
        let id = |rest: &str| match file {
            "" => rest.to_string(),
            f => format!("{f}{sep_top}{rest}"),
        };
        let want = [
            (id("math > adds"), Outcome::Passed),
            (id("math > adds negatives"), Outcome::Passed),
            (id("math > edge cases > handles zero"), Outcome::Passed),
            (
                id("math > edge cases > is wrong on purpose"),
                Outcome::Failed,
            ),
            (id("math > is skipped"), Outcome::Skipped),
            (id("top level"), Outcome::Passed),
        ];
        exactly(r, &want);
    }

    /// `r` holds exactly the tests of `want`, with their outcomes.
    fn exactly<S: AsRef<str>>(r: &Results, want: &[(S, Outcome)]) {
        assert_eq!(r.len(), want.len(), "{r:?}");
        for (id, o) in want {
            let id = id.as_ref();
            assert_eq!(r.get(id), Some(o), "{id} in {r:?}");
        }
    }

    #[test]
    fn javascript_runners_real_output() {
        let jest = include_str!("fixtures/jest.json");
        same_suite(&jest_json(jest).results, "/work/test/math.test.js", " > ");
        assert_eq!(parse(Format::Auto, jest).unwrap(), jest_json(jest));
        let vitest = include_str!("fixtures/vitest.json");
        same_suite(
            &jest_json(vitest).results,
            "/work/test/vmath.test.mjs",
            " > ",
        );
        // Mocha names a test by its full title, words joined by spaces.
        let mocha = mocha_json(include_str!("fixtures/mocha.json")).results;
        assert_eq!(mocha.len(), 6, "{mocha:?}");
        assert_eq!(
            mocha.get("/work/test/math.mocha.js > math edge cases is wrong on purpose"),
            Some(&Outcome::Failed)
        );
        assert_eq!(
            mocha.get("/work/test/math.mocha.js > math is skipped"),
            Some(&Outcome::Skipped)
        );
        assert_eq!(
            parse(Format::Auto, include_str!("fixtures/mocha.json"))
                .unwrap()
                .results,
            mocha
        );
        let tap = include_str!("fixtures/node-tap.txt");
        same_suite(&node_test(tap).results, "", "");
        assert_eq!(parse(Format::Auto, tap).unwrap(), node_test(tap));
        let spec = include_str!("fixtures/node-spec.txt");
        same_suite(&node_spec(spec).results, "", "");
        assert_eq!(parse(Format::Auto, spec).unwrap(), node_spec(spec));
    }

    #[test]
    fn javascript_reports_survive_garbage() {
        for text in [
            "",
            "{",
            "{\"testResults\": 3}",
            "{\"testResults\": [{\"assertionResults\": [{\"status\": 7}]}]}",
            "{\"passes\": {}, \"failures\": null}",
            "# Subtest: a\n    not ok 1 - b\nok 9 - nothing open",
            "▶ a\n  ✔ \n✖ failing tests:\n✖ x",
            "    ok 1 - deeper than anything\n# Subtest: x",
        ] {
            let _ = jest_json(text);
            let _ = mocha_json(text);
            let _ = node_test(text);
            let _ = parse(Format::Auto, text);
        }
        // A Jest file that did not load is an error under its own name.
        let r = jest_json(
            "{\"testResults\": [{\"name\": \"/w/a.test.js\", \"status\": \"failed\", \"assertionResults\": []}]}",
        );
        assert_eq!(r.results.get("/w/a.test.js"), Some(&Outcome::Error));
    }

    /// Real pytest 7 output with -rA (abridged: the passes section headers are kept).
    const PYTEST: &str = "\
============================= test session starts ==============================
collected 5 items

tests/test_a.py .F.s                                                     [ 80%]
tests/test_b.py E                                                        [100%]

==================================== ERRORS ====================================
_________________________ ERROR at setup of test_conn __________________________
=================================== FAILURES ===================================
___________________________________ test_two ___________________________________
    def test_two():
>       assert 1 == 2
E       assert 1 == 2
tests/test_a.py:5: AssertionError
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[1.2-1.10--1]
PASSED tests/test_a.py::test_space[a b - c]
SKIPPED [1] tests/test_a.py:9: not on this platform
XFAIL tests/test_a.py::test_known - bug 12
XPASS tests/test_a.py::test_fixed[x] reason: bug 13
ERROR tests/test_c.py - ModuleNotFoundError: No module named 'gone'
FAILED tests/test_a.py::test_two - assert 1 == 2
ERROR tests/test_b.py::test_conn - ConnectionRefusedError: [Errno 111]
============== 1 failed, 2 passed, 1 skipped, 1 error in 0.12s ===============
";

    #[test]
    fn pytest_summary_lines() {
        let r = parse(Format::Auto, PYTEST).unwrap().results;
        assert_eq!(r["tests/test_a.py::test_one"], Outcome::Passed);
        assert_eq!(
            r["tests/test_a.py::test_param[1.2-1.10--1]"],
            Outcome::Passed
        );
        assert_eq!(r["tests/test_a.py::test_two"], Outcome::Failed);
        assert_eq!(r["tests/test_b.py::test_conn"], Outcome::Error);
        assert_eq!(r["tests/test_a.py:9"], Outcome::Skipped);
        assert_eq!(r["tests/test_a.py::test_space[a b - c]"], Outcome::Passed);
        assert_eq!(r["tests/test_a.py::test_known"], Outcome::Xfailed);
        assert_eq!(r["tests/test_a.py::test_fixed[x]"], Outcome::Xpassed);
        // A collection error stays, under its file.
        assert_eq!(r["tests/test_c.py"], Outcome::Error);
        assert_eq!(r.len(), 9);
        assert_eq!(
            Counts::of(&r).to_string(),
            "1 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 errors"
        );
    }

    #[test]
    fn pytest_junit_gives_node_ids_skips_by_id_and_xfails() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" file="tests/test_a.py" line="3" time="0.001" />
<testcase classname="tests.test_a.TestX" name="test_p[a b-1]" file="tests/test_a.py" line="9" time="0.001" />
<testcase classname="tests.test_a" name="test_skip" file="tests/test_a.py" line="12" time="0"><skipped type="pytest.skip" message="no">tests/test_a.py:12: no</skipped></testcase>
<testcase classname="tests.test_a" name="test_known" file="tests/test_a.py" line="15" time="0"><skipped type="pytest.xfail" message="bug" /></testcase>
<testcase classname="tests.test_a" name="test_two" file="tests/test_a.py" line="18" time="0"><failure message="assert 1 == 2">x</failure></testcase>
<testcase classname="" name="tests.test_c" time="0"><error message="collection failure">ImportError</error></testcase>
</testsuite></testsuites>"#;
        let r = pytest_junit(xml).unwrap();
        assert_eq!(r["tests/test_a.py::test_one"], Outcome::Passed);
        assert_eq!(r["tests/test_a.py::TestX::test_p[a b-1]"], Outcome::Passed);
        assert_eq!(r["tests/test_a.py::test_skip"], Outcome::Skipped);
        assert_eq!(r["tests/test_a.py::test_known"], Outcome::Xfailed);
        assert_eq!(r["tests/test_a.py::test_two"], Outcome::Failed);
        assert_eq!(r["tests/test_c.py"], Outcome::Error);
        assert_eq!(
            Counts::of(&r).to_string(),
            "1 failed, 2 passed, 1 skipped, 1 xfailed, 1 error"
        );
    }

    #[test]
    fn junit_xml_from_pytest_and_maven() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3">
<testcase classname="tests.test_a" name="test_one" time="0.001" />
<testcase classname="tests.test_a" name="test_two" time="0.001"><failure message="assert 1 == 2">tests/test_a.py:5: AssertionError</failure></testcase>
<testcase classname="tests.test_a" name="test_skip" time="0.000"><skipped type="pytest.skip" message="no">skip</skipped></testcase>
</testsuite><testsuite name="com.example.AppTest"><testcase name="adds" classname="com.example.AppTest" time="0.01"><error type="java.lang.NullPointerException"/></testcase></testsuite></testsuites>"#;
        let r = parse(Format::Auto, xml).unwrap().results;
        assert_eq!(r["tests.test_a.test_one"], Outcome::Passed);
        assert_eq!(r["tests.test_a.test_two"], Outcome::Failed);
        assert_eq!(r["tests.test_a.test_skip"], Outcome::Skipped);
        assert_eq!(r["com.example.AppTest.adds"], Outcome::Error);
        assert!(matches!(
            junit("<testsuite><testcase"),
            Err(ReportError::Xml(_))
        ));
    }

    #[test]
    fn go_test_json() {
        let text = r#"{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/m","Test":"TestA"}
{"Time":"2024-01-01T00:00:00Z","Action":"output","Package":"example.com/m","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Package":"example.com/m","Test":"TestA","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/m","Test":"TestB","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"skip","Package":"example.com/m","Test":"TestC","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Package":"example.com/m","Test":"TestD/with_sub","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/m","Elapsed":0.01}"#;
        let r = parse(Format::Auto, text).unwrap().results;
        assert_eq!(r["example.com/m/TestA"], Outcome::Passed);
        assert_eq!(r["example.com/m/TestB"], Outcome::Failed);
        assert_eq!(r["example.com/m/TestC"], Outcome::Skipped);
        assert_eq!(r["example.com/m/TestD/with_sub"], Outcome::Passed);
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn a_go_package_that_did_not_build_is_an_error() {
        let text = "{\"Action\":\"run\",\"Package\":\"m/a\",\"Test\":\"TestA\"}\n{\"Action\":\"fail\",\"Package\":\"m/a\",\"Test\":\"TestA\"}\n{\"Action\":\"fail\",\"Package\":\"m/a\"}\n{\"Action\":\"output\",\"Package\":\"m/b\",\"Output\":\"FAIL\\tm/b [build failed]\\n\"}\n{\"Action\":\"fail\",\"Package\":\"m/b\",\"FailedBuild\":\"m/b [m/b.test]\"}\n";
        let r = go_json(text);
        assert_eq!(r["m/a/TestA"], Outcome::Failed);
        assert_eq!(r["m/b"], Outcome::Error);
        assert!(!r.contains_key("m/a"));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn go_json_gives_back_the_text_people_read() {
        let text = "{\"Action\":\"run\",\"Package\":\"m\",\"Test\":\"TestA\"}\n{\"Action\":\"output\",\"Package\":\"m\",\"Test\":\"TestA\",\"Output\":\"=== RUN   TestA\\n\"}\n{\"Action\":\"output\",\"Package\":\"m\",\"Output\":\"ok  \\tm\\t0.01s\\n\"}\n# m [build failed]\n";
        assert_eq!(
            go_json_text(text),
            "=== RUN   TestA\nok  \tm\t0.01s\n# m [build failed]\n"
        );
    }

    #[test]
    fn cargo_test_and_nextest() {
        let text = "running 3 tests\ntest api::tests::a ... ok\ntest api::tests::b ... FAILED\ntest api::tests::c ... ignored, slow\n\ntest result: FAILED. 1 passed; 1 failed; 1 ignored\n";
        let r = parse(Format::Auto, text).unwrap().results;
        assert_eq!(r["api::tests::a"], Outcome::Passed);
        assert_eq!(r["api::tests::b"], Outcome::Failed);
        assert_eq!(r["api::tests::c"], Outcome::Skipped);
        let next = "        PASS [   0.012s] (1/53) forkbox-engine api::tests::a\n        FAIL [   1.000s] (2/53) forkbox-cli::cli b\n";
        let r = cargo(next);
        assert_eq!(r["forkbox-engine api::tests::a"], Outcome::Passed);
        assert_eq!(r["forkbox-cli::cli b"], Outcome::Failed);
    }

    #[test]
    fn tap_with_directives() {
        let text = "TAP version 13\n1..4\nok 1 - adds\nnot ok 2 - subtracts\n  ---\n  message: nope\n  ...\nok 3 - network # SKIP offline\nnot ok 4 - later # TODO not yet\n";
        let r = parse(Format::Auto, text).unwrap().results;
        assert_eq!(r["adds"], Outcome::Passed);
        assert_eq!(r["subtracts"], Outcome::Failed);
        assert_eq!(r["network"], Outcome::Skipped);
        assert_eq!(r["later"], Outcome::Skipped);
    }

    /// tape's output (as tape 5 prints it): a test is a `# name` heading with the assertions
    /// under it, not an assertion; a failing assertion is reported under its test with its
    /// number, description and diagnostics; the summary after the plan names no test.
    const TAPE: &str = "TAP version 13
# parses a simple string
ok 1 should be deeply equivalent
ok 2 should be deeply equivalent
# parses arrays
ok 3 should be deeply equivalent
not ok 4 should be equal
  ---
    operator: equal
    expected: 2
    actual:   3
    at: Test.<anonymous> (/work/test/parse.js:40:11)
  ...
ok 5 should be equal
# needs the network
ok 6 fetched # SKIP offline
# stringifies
ok 7 should be equal

1..7
# tests 7
# pass  5
# skip  1
# fail  1
";

    #[test]
    fn tape_tests_are_its_named_tests() {
        let p = parse(Format::Auto, TAPE).unwrap();
        let want = [
            ("parses a simple string", Outcome::Passed),
            ("parses arrays", Outcome::Failed),
            ("needs the network", Outcome::Skipped),
            ("stringifies", Outcome::Passed),
        ];
        exactly(&p.results, &want);
        let said = &p.failures["parses arrays"];
        assert!(said.starts_with("not ok 4 should be equal"), "{said}");
        assert!(
            said.contains("expected: 2") && said.contains("actual:   3"),
            "{said}"
        );
        assert_eq!(p.repeated_note(), None);
    }

    /// node-tap's TAP14: subtests by `# Subtest:` and indentation, nested, and the buffered
    /// form `ok 1 - name {` … `}`; a subtest is a test with its own assertions; a file's
    /// subtest holding only subtests is a suite; a subtest whose plan failed, with every
    /// assertion passing, failed.
    #[test]
    fn node_tap_subtests_are_tests_by_their_path() {
        let text = "TAP version 14
# Subtest: test/parse.js
    # Subtest: parses
        ok 1 - should be equal
        ok 2 - should be equal
        1..2
    ok 1 - parses # time=3ms
    # Subtest: nested
        # Subtest: deeper
            not ok 1 - should be equal
              ---
              found: 1
              wanted: 2
              ...
            1..1
        not ok 1 - deeper # time=1ms
        1..1
    not ok 2 - nested # time=2ms
    # Subtest: short plan
        ok 1 - should be equal
        1..2
    not ok 3 - short plan
    ok 4 - buffered {
        ok 1 - should be truthy
        1..1
    }
    1..4
not ok 1 - test/parse.js # time=40ms
1..1
# { total: 5, pass: 3, fail: 2 }
";
        let p = parse(Format::Auto, text).unwrap();
        let want = [
            ("test/parse.js > parses", Outcome::Passed),
            ("test/parse.js > nested > deeper", Outcome::Failed),
            ("test/parse.js > short plan", Outcome::Failed),
            ("test/parse.js > buffered", Outcome::Passed),
        ];
        exactly(&p.results, &want);
        let said = &p.failures["test/parse.js > nested > deeper"];
        assert!(
            said.starts_with("not ok 1 should be equal") && said.contains("wanted: 2"),
            "{said}"
        );
    }

    /// Mocha's default spec reporter (Mocha 10's marks; ✓ before it): ids by the suite path
    /// the indentation shows; the failures listed again after the summary are not read.
    const MOCHA_SPEC: &str = "
  dates
    adding
      ✔ adds days over a leap day
      ✔ batches evenly (112ms)
    subtracting
      ✔ adds days over a leap day
      1) crosses a year
  lists
    ✓ batches evenly
    - is pending
  ✔ at the top


  5 passing (140ms)
  1 pending
  1 failing

  1) dates
       subtracting
         crosses a year:
     AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:
  ✔ not a test
";

    #[test]
    fn mocha_spec_tests_are_named_by_their_suites() {
        let p = parse(Format::Auto, MOCHA_SPEC).unwrap();
        let want = [
            (
                "dates > adding > adds days over a leap day",
                Outcome::Passed,
            ),
            ("dates > adding > batches evenly", Outcome::Passed),
            (
                "dates > subtracting > adds days over a leap day",
                Outcome::Passed,
            ),
            ("dates > subtracting > crosses a year", Outcome::Failed),
            ("lists > batches evenly", Outcome::Passed),
            ("lists > is pending", Outcome::Skipped),
            ("at the top", Outcome::Passed),
        ];
        exactly(&p.results, &want);
        assert_eq!(parse(Format::Mocha, MOCHA_SPEC).unwrap(), p);
    }

    /// `npm test` of the Node example (real Mocha 10 spec output on Node 18, times left out):
    /// 43 tests, each under its suite.
    #[test]
    fn mocha_spec_of_the_node_example() {
        let p = parse(Format::Auto, include_str!("fixtures/mocha-spec.txt")).unwrap();
        assert_eq!(p.results.len(), 43, "{:?}", p.results);
        assert!(p.results.values().all(|o| *o == Outcome::Passed));
        assert!(
            p.results.keys().all(|id| id.contains(" > ")),
            "{:?}",
            p.results
        );
        assert_eq!(
            p.results.get("dates > adds days over a leap day"),
            Some(&Outcome::Passed)
        );
        assert_eq!(p.repeated_note(), None);
    }

    #[test]
    fn unreadable_output_is_an_error_not_a_panic() {
        assert!(matches!(
            parse(Format::Auto, "Traceback (most recent call last):\n  boom"),
            Err(ReportError::Empty(_))
        ));
        assert!(parse(Format::Auto, "").is_err());
        for garbage in [
            "<",
            "ok",
            "not ok x",
            "test  ...  ",
            "PASSED",
            "{\"Test\":1}",
            "\u{0}\u{ffff}",
        ] {
            let _ = parse(Format::Auto, garbage);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod robustness {
    use super::*;

    /// A cheap stand-in for the fuzz target (`fuzz/fuzz_targets/test_reports.rs`, which needs
    /// nightly): every parser on many pseudo-random mixes of report fragments and bytes.
    #[test]
    fn no_input_makes_a_parser_panic() {
        let pieces = [
            "PASSED ",
            "FAILED ",
            "ERROR ",
            "SKIPPED [1] ",
            "::",
            " - ",
            "ok ",
            "not ok ",
            "# SKIP",
            "test ",
            " ... ",
            "ok",
            "FAILED",
            "ignored,",
            "PASS [",
            "] ",
            "(1/2) ",
            "{\"Action\":\"pass\",\"Test\":",
            "\"x\"}",
            "<testcase name=\"a\">",
            "<failure/>",
            "</testcase>",
            "<",
            ">",
            "\n",
            "1",
            "\u{0}",
            "é",
            "]",
        ];
        let mut x: u64 = 42;
        for _ in 0..5000 {
            let mut s = String::new();
            for _ in 0..(x % 12) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            for f in [
                Format::Auto,
                Format::PytestRa,
                Format::Junit,
                Format::GoJson,
                Format::Cargo,
                Format::Tap,
            ] {
                let _ = parse(f, &s);
            }
        }
    }

    #[test]
    fn live_lines_are_counted() {
        assert_eq!(
            tests_in_line("..F.s                                    [ 40%]"),
            5
        );
        assert_eq!(tests_in_line("tests/t.py::test_a PASSED      [ 50%]"), 1);
        assert_eq!(tests_in_line("ok 3 - adds"), 1);
        assert_eq!(tests_in_line("not ok 4 - subtracts"), 1);
        assert_eq!(tests_in_line("test tests::it_works ... ok"), 1);
        assert_eq!(
            tests_in_line(
                r#"{"Time":"x","Action":"pass","Package":"p","Test":"TestA","Elapsed":0}"#
            ),
            1
        );
        assert_eq!(tests_in_line("collected 47 items"), 0);
        assert_eq!(tests_in_line("[100%]"), 0);
        assert_eq!(tests_in_line(""), 0);
    }
}
