//! The list of E2B suites' tests not expected to pass
//! (`crates/e2b/tests/suites/expected-failures.txt`), and each suite's outcomes judged against
//! it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use forkbox_test_infra as infra;

/// The list of tests not expected to pass.
pub fn expected_file() -> PathBuf {
    infra::repo_root().join("crates/e2b/tests/suites/expected-failures.txt")
}

/// One test's end as the suite's plugin wrote it.
#[derive(Debug, serde::Deserialize)]
pub struct Outcome {
    pub test: String,
    pub outcome: String,
    #[serde(default)]
    pub why: String,
}

/// The tests listed for `suite` in `mode` (lines for mode `any` count in every mode), each
/// with its reason. A line that does not read as `SUITE MODE TEST -- KIND: WORDS` with a known
/// kind fails the test.
pub fn listed(suite: &str, mode: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(expected_file()).unwrap();
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, reason) = line
            .split_once(" -- ")
            .unwrap_or_else(|| panic!("line {}: no ' -- REASON': {line}", n + 1));
        let kind = reason.split(':').next().unwrap_or("");
        assert!(
            ["internet", "template", "refused", "mode", "open"].contains(&kind),
            "line {}: the reason must start with internet:, template:, refused:, mode: or open: ({line})",
            n + 1
        );
        // A JavaScript test's name has spaces (`FILE > DESCRIBE > TEST`).
        let parts: Vec<&str> = head.splitn(3, ' ').map(str::trim).collect();
        assert_eq!(parts.len(), 3, "line {}: SUITE MODE TEST: {line}", n + 1);
        if parts[0] == suite && (parts[1] == mode || parts[1] == "any") {
            let again = out.insert(parts[2].to_string(), reason.to_string());
            assert!(again.is_none(), "line {}: listed twice: {line}", n + 1);
        }
    }
    out
}

/// Takes off `listed` the tests under `parts` (a folder or file of the suite's, as a test's
/// name begins: `tests/async`, `tests/template/build.test.ts`), which a run left out: only a
/// run that had them can judge them.
pub fn leave_out(listed: &mut BTreeMap<String, String>, parts: &[&str]) {
    listed.retain(|test, _| !parts.iter().any(|p| within(test, p)));
}

/// Whether test `name` is in `part`: its name begins with it, then a path's `/`, pytest's `::`
/// or vitest's ` > ` (`tests/async` holds `tests/async/x.py::t`, not `tests/asyncio.py::t`).
fn within(name: &str, part: &str) -> bool {
    name.strip_prefix(part)
        .is_some_and(|rest| ["/", "::", " > "].iter().any(|sep| rest.starts_with(sep)))
}

/// Compares `outcomes` of `suite` in `mode` (run in `secs`) with `listed`: prints the counts
/// and the wall time, fails on a failing test not listed, a listed test that passed and a
/// listed test the suite has not.
pub fn judge(
    suite: &str,
    mode: &str,
    listed: &BTreeMap<String, String>,
    (outcomes, secs): (Vec<Outcome>, f64),
    whole: bool,
) {
    assert!(!outcomes.is_empty(), "the suite reported no test");
    let mut passed = 0;
    let mut skipped = 0;
    let mut failed_listed = 0;
    let mut unexpected = Vec::new();
    let mut now_passing = Vec::new();
    let mut seen = BTreeSet::new();
    for o in &outcomes {
        seen.insert(o.test.as_str());
        match (o.outcome.as_str(), listed.get(&o.test)) {
            ("passed", None) => passed += 1,
            // A gap still owed may pass by chance (a race it loses most of the time).
            ("passed", Some(why)) if why.starts_with("open:") => {
                passed += 1;
                println!("listed as open, passed this time: {}", o.test);
            }
            ("passed", Some(_)) => now_passing.push(o.test.clone()),
            ("skipped", _) => skipped += 1,
            (_, Some(_)) => failed_listed += 1,
            (_, None) => unexpected.push(format!("{}\n    {}", o.test, o.why)),
        }
    }
    // Only the whole suite shows a listed test is gone.
    let missing: Vec<&String> = listed
        .keys()
        .filter(|t| whole && !seen.contains(t.as_str()))
        .collect();
    println!(
        "E2B SUITE {suite} ({mode} mode): {passed} passed, {failed_listed} listed as expected \
         to fail, {skipped} skipped, {} in all; {secs:.0} s",
        outcomes.len()
    );
    assert!(
        unexpected.is_empty(),
        "{} tests of E2B's {suite} suite failed in {mode} mode that are not in {}:\n{}",
        unexpected.len(),
        expected_file().display(),
        unexpected.join("\n")
    );
    assert!(
        now_passing.is_empty(),
        "listed as expected to fail in {mode} mode, but passed (take them off the list): {now_passing:#?}"
    );
    assert!(
        missing.is_empty(),
        "listed, but the suite has no such test: {missing:#?}"
    );
}

/// Puts over `outcomes` the passes of `second`, a lone run of tests that failed beside the
/// others: such a test was starved of the machine (its suite's timeouts are short for TCG),
/// and is said FLAKY.
pub fn take_reruns(outcomes: &mut [Outcome], second: Vec<Outcome>, again: &[String]) {
    for o in second
        .into_iter()
        .filter(|o| o.outcome == "passed" && again.contains(&o.test))
    {
        println!("FLAKY (failed beside the others, passed alone): {}", o.test);
        if let Some(first) = outcomes.iter_mut().find(|f| f.test == o.test) {
            *first = o;
        }
    }
}

/// A left-out part takes the tests under it and no namesake beside it.
#[test]
fn a_left_out_part_takes_its_tests_and_no_namesake() {
    let mut listed: BTreeMap<String, String> = [
        "tests/async/sandbox_async/test_a.py::test_x",
        "tests/asyncio_helpers.py::test_y",
        "tests/template/build.test.ts > build > works",
        "tests/template/build.test.tsx > other",
        "tests/sync/test_b.py::test_z",
    ]
    .into_iter()
    .map(|t| (t.to_string(), "open: a reason".to_string()))
    .collect();
    leave_out(
        &mut listed,
        &["tests/async", "tests/template/build.test.ts"],
    );
    let left: Vec<&str> = listed.keys().map(String::as_str).collect();
    assert_eq!(
        left,
        [
            "tests/asyncio_helpers.py::test_y",
            "tests/sync/test_b.py::test_z",
            "tests/template/build.test.tsx > other",
        ]
    );
}
