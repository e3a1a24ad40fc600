//! The acceptance rule, in one place. A test is *lost* when it passed on the old toolchain
//! (in every baseline run: one whose outcome changed between runs is flaky and never counts)
//! and now failed, errored, or is missing from the run (a test that is gone counts as failed,
//! whatever the reason: a collection error, a deleted file, a suite that no longer runs). An
//! `xfail` test is not a pass, so it cannot be lost; one that starts passing (non-strict
//! `xpass`) is no loss either; a skipped test never counts. A collection error reported
//! for a file (`tests/x.py`) gives its error to every baseline test of that file. A port
//! is accepted only if it loses no test; accepted ports are ranked by the size of their
//! diff, then by test time.
//!
//! Before a verdict is final a plan's lost tests are run once more, alone where the runner can
//! select tests (pytest node ids), else with the whole suite: a test that passes then is
//! *lost, flaky*, listed with the verdict and not counted against the plan (its failure did
//! not repeat); one that fails again is *lost*. Tests flaky in the baseline never count.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::reports::{Outcome, Results};

/// The old toolchain's results over several runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Baseline {
    /// The outcome of each test in the first run.
    pub results: Results,
    /// Tests whose outcome differed between runs (or that were missing from one).
    pub flaky: BTreeSet<String>,
}

impl Baseline {
    pub fn from_runs(runs: &[Results]) -> Baseline {
        let Some(first) = runs.first() else {
            return Baseline::default();
        };
        let mut flaky = BTreeSet::new();
        let all: BTreeSet<&String> = runs.iter().flat_map(|r| r.keys()).collect();
        for id in all {
            let outcomes: BTreeSet<Option<Outcome>> =
                runs.iter().map(|r| r.get(id).copied()).collect();
            if outcomes.len() > 1 {
                flaky.insert(id.clone());
            }
        }
        Baseline {
            results: first.clone(),
            flaky,
        }
    }

    pub fn passed(&self) -> impl Iterator<Item = &String> {
        self.results
            .iter()
            .filter(|(id, o)| **o == Outcome::Passed && !self.flaky.contains(*id))
            .map(|(id, _)| id)
    }

    /// Tests that passed here (flaky excluded) and do not pass in `now`.
    pub fn lost(&self, now: &Results) -> Vec<String> {
        self.passed()
            .filter(|id| now.get(*id) != Some(&Outcome::Passed))
            .cloned()
            .collect()
    }

    /// `now` with each file-level collection error given to the baseline's tests of that
    /// file that `now` does not name (pytest reports `ERROR tests/x.py` and no test of it).
    pub fn attribute_file_errors(&self, now: &Results) -> Results {
        let mut out = now.clone();
        for (file, _) in now
            .iter()
            .filter(|(id, o)| **o == Outcome::Error && crate::reports::is_test_file(id))
        {
            let prefix = format!("{file}::");
            for id in self.results.keys().filter(|id| id.starts_with(&prefix)) {
                out.entry(id.clone()).or_insert(Outcome::Error);
            }
        }
        out
    }
}

/// What became of one plan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Attempt {
    pub plan: String,
    /// Why the plan could not be judged (the porter failed, the tests did not run, the report
    /// was unreadable, a timeout...), if so.
    pub failure: Option<String>,
    /// Whether the test command ran after the port: then every baseline test it did not
    /// report passing is lost, even when no result could be read (a suite that no longer
    /// collects loses every test).
    #[serde(default)]
    pub tests_ran: bool,
    pub results: Results,
    /// Lines added plus lines removed.
    pub diff_lines: u64,
    pub test_ms: u64,
    /// What its patch does to test files.
    #[serde(default)]
    pub test_changes: crate::integrity::TestChanges,
    /// The results of running its lost tests once more, when they were.
    #[serde(default)]
    pub rerun: Option<Results>,
}

/// `lost` split by a re-run of those tests: (lost, lost but passing when run again).
pub fn split_by_rerun(lost: Vec<String>, rerun: Option<&Results>) -> (Vec<String>, Vec<String>) {
    match rerun {
        None => (lost, vec![]),
        Some(r) => lost
            .into_iter()
            .partition(|id| r.get(id) != Some(&Outcome::Passed)),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    pub plan: String,
    pub accepted: bool,
    /// Why it was rejected, in words.
    pub reason: String,
    /// Passed before (not flaky), not passing now, and not when run again.
    pub lost: Vec<String>,
    /// Passed before, failed in the plan's run, passed when run again ("lost, flaky"): listed,
    /// not counted.
    #[serde(default)]
    pub flaky_lost: Vec<String>,
    /// Failed or errored before, passing now.
    pub fixed: Vec<String>,
    /// Rank among accepted plans, 1 = the winner.
    pub rank: Option<usize>,
    /// Why it ranked where it did, against the plans before it (accepted plans only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_reason: Option<String>,
    /// Test files its patch changes (deletes, assertions it removes): "no test lost" proves
    /// less when the tests changed.
    #[serde(default)]
    pub test_changes: crate::integrity::TestChanges,
}

/// The verdict on each attempt; with `protect_tests`, a plan whose patch changes test files
/// is rejected whatever its tests say.
pub fn decide(baseline: &Baseline, attempts: &[Attempt], protect_tests: bool) -> Vec<Verdict> {
    let mut verdicts: Vec<Verdict> = attempts
        .iter()
        .map(|a| {
            let results = baseline.attribute_file_errors(&a.results);
            if let Some(f) = &a.failure {
                // Not judged by its tests (the porter failed), or judged with none readable.
                let (lost, flaky_lost) = if a.tests_ran {
                    split_by_rerun(baseline.lost(&results), a.rerun.as_ref())
                } else {
                    (vec![], vec![])
                };
                let reason = if lost.is_empty() {
                    f.clone()
                } else {
                    format!(
                        "{f}; {} test(s) that passed before do not pass now: {}",
                        lost.len(),
                        preview(&lost)
                    )
                };
                return Verdict {
                    plan: a.plan.clone(),
                    accepted: false,
                    reason,
                    lost,
                    flaky_lost,
                    fixed: vec![],
                    rank: None,
                    rank_reason: None,
                    test_changes: a.test_changes.clone(),
                };
            }
            let (lost, flaky_lost) = split_by_rerun(baseline.lost(&results), a.rerun.as_ref());
            let fixed: Vec<String> = baseline
                .results
                .iter()
                .filter(|(id, o)| {
                    matches!(o, Outcome::Failed | Outcome::Error) && !baseline.flaky.contains(*id)
                })
                .filter(|(id, _)| results.get(*id) == Some(&Outcome::Passed))
                .map(|(id, _)| id.clone())
                .collect();
            let tests = &a.test_changes;
            let tests_allowed = !protect_tests || tests.is_empty();
            let accepted = lost.is_empty() && tests_allowed;
            let flaky_note = match flaky_lost.len() {
                0 => String::new(),
                n => format!(
                    "; {n} test(s) failed in its run and passed when run again (lost, flaky): {}",
                    preview(&flaky_lost)
                ),
            };
            let reason = if lost.is_empty() && !accepted {
                format!("{} (tests are protected)", tests.describe())
            } else if accepted && !tests.is_empty() {
                format!(
                    "no test lost, but it {}; {} fixed; diff of {} lines",
                    tests.describe(),
                    fixed.len(),
                    a.diff_lines
                )
            } else if accepted {
                format!(
                    "no test lost; {} fixed; diff of {} lines",
                    fixed.len(),
                    a.diff_lines
                )
            } else {
                format!(
                    "{} test(s) that passed before do not pass now, nor when run again: {}",
                    lost.len(),
                    preview(&lost)
                )
            } + &flaky_note;
            Verdict {
                plan: a.plan.clone(),
                accepted,
                reason,
                lost,
                flaky_lost,
                fixed,
                rank: None,
                rank_reason: None,
                test_changes: tests.clone(),
            }
        })
        .collect();
    let by_plan: BTreeMap<&str, &Attempt> = attempts.iter().map(|a| (a.plan.as_str(), a)).collect();
    let mut order: Vec<usize> = (0..verdicts.len())
        .filter(|&i| verdicts[i].accepted)
        .collect();
    order.sort_by_key(|&i| {
        let a = by_plan[verdicts[i].plan.as_str()];
        (a.diff_lines, a.test_ms, verdicts[i].plan.clone())
    });
    let ranked: Vec<(String, u64, u64)> = order
        .iter()
        .map(|&i| {
            let a = by_plan[verdicts[i].plan.as_str()];
            (a.plan.clone(), a.diff_lines, a.test_ms)
        })
        .collect();
    for (rank, &i) in order.iter().enumerate() {
        verdicts[i].rank = Some(rank + 1);
        verdicts[i].rank_reason = Some(rank_reason(&ranked, rank));
    }
    verdicts
}

/// Why the accepted plan at `rank` (0-based) of `ranked` (plan, diff lines, test ms; in rank
/// order: smallest diff first, then fastest tests) stands there.
fn rank_reason(ranked: &[(String, u64, u64)], rank: usize) -> String {
    let (_, diff, ms) = &ranked[rank];
    if ranked.len() == 1 {
        return format!("the only accepted plan (diff of {diff} lines)");
    }
    if rank == 0 {
        let (next, next_diff, next_ms) = &ranked[1];
        return match next_diff == diff {
            true => format!(
                "the smallest diff ({diff} lines, as {next}'s) and faster tests ({ms} ms against {next_ms} ms)"
            ),
            false => format!(
                "the smallest diff of the {} accepted plans: {diff} lines against {next}'s {next_diff}",
                ranked.len()
            ),
        };
    }
    let (prev, prev_diff, prev_ms) = &ranked[rank - 1];
    match prev_diff == diff {
        true => format!(
            "same diff size as {prev} ({diff} lines) but slower tests ({ms} ms against {prev_ms} ms)"
        ),
        false => format!("a larger diff than {prev}: {diff} lines against {prev_diff}"),
    }
}

fn preview(ids: &[String]) -> String {
    let mut s: Vec<&str> = ids.iter().take(3).map(String::as_str).collect();
    if ids.len() > 3 {
        s.push("...");
    }
    s.join(", ")
}

/// Lines added plus removed in a unified diff (headers excluded).
pub fn diff_lines(diff: &str) -> u64 {
    diff.lines()
        .filter(|l| {
            (l.starts_with('+') && !l.starts_with("+++"))
                || (l.starts_with('-') && !l.starts_with("---"))
        })
        .count() as u64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::reports;
    use Outcome::*;

    fn res(v: &[(&str, Outcome)]) -> Results {
        v.iter().map(|(k, o)| (k.to_string(), *o)).collect()
    }

    fn decide_open(b: &Baseline, a: &[Attempt]) -> Vec<Verdict> {
        decide(b, a, false)
    }

    #[test]
    fn changed_tests_are_reported_and_rejected_when_protected() {
        let b = Baseline::from_runs(&[res(&[("tests/t.py::a", Passed)])]);
        let mut p = attempt("p", res(&[("tests/t.py::a", Passed)]), 2);
        p.test_changes = crate::integrity::TestChanges {
            changed: vec!["tests/t.py".into()],
            deleted: vec![],
            assertions_removed: 1,
        };
        let open = decide(&b, std::slice::from_ref(&p), false);
        assert!(open[0].accepted);
        assert!(
            open[0].reason.contains("changes test files: tests/t.py"),
            "{}",
            open[0].reason
        );
        assert!(
            open[0].reason.contains("removes 1 assertion"),
            "{}",
            open[0].reason
        );
        let protected = decide(&b, &[p], true);
        assert!(!protected[0].accepted);
        assert!(
            protected[0].reason.contains("tests are protected"),
            "{}",
            protected[0].reason
        );
    }

    fn attempt(plan: &str, r: Results, diff: u64) -> Attempt {
        Attempt {
            plan: plan.into(),
            failure: None,
            tests_ran: true,
            results: r,
            diff_lines: diff,
            test_ms: 100,
            test_changes: Default::default(),
            rerun: None,
        }
    }

    #[test]
    fn a_lost_test_that_passes_when_run_again_is_lost_flaky_and_not_counted() {
        let b = Baseline::from_runs(&[res(&[("a", Passed), ("b", Passed), ("c", Passed)])]);
        let mut only_flaky = attempt(
            "only-flaky",
            res(&[("a", Failed), ("b", Passed), ("c", Passed)]),
            2,
        );
        only_flaky.rerun = Some(res(&[("a", Passed)]));
        let mut one_real = attempt(
            "one-real",
            res(&[("a", Failed), ("b", Error), ("c", Passed)]),
            1,
        );
        one_real.rerun = Some(res(&[("a", Passed), ("b", Failed)]));
        let mut not_rerun = attempt(
            "not-rerun",
            res(&[("a", Failed), ("b", Passed), ("c", Passed)]),
            1,
        );
        not_rerun.rerun = None;
        // A re-run that did not report the test (it could not be selected) keeps it lost.
        let mut unseen = attempt("unseen", res(&[("b", Passed), ("c", Passed)]), 1);
        unseen.rerun = Some(res(&[]));
        let v = decide_open(&b, &[only_flaky, one_real, not_rerun, unseen]);
        assert!(v[0].accepted, "{:?}", v[0]);
        assert_eq!(v[0].lost, Vec::<String>::new());
        assert_eq!(v[0].flaky_lost, vec!["a"]);
        assert!(v[0].reason.contains("lost, flaky"), "{}", v[0].reason);
        assert!(!v[1].accepted);
        assert_eq!(
            (v[1].lost.clone(), v[1].flaky_lost.clone()),
            (vec!["b".to_string()], vec!["a".to_string()])
        );
        assert!(
            v[1].reason.contains("nor when run again") && v[1].reason.contains("lost, flaky"),
            "{}",
            v[1].reason
        );
        assert!(!v[2].accepted);
        assert_eq!(v[2].lost, vec!["a"]);
        assert!(!v[3].accepted);
        assert_eq!(v[3].lost, vec!["a"]);
    }

    #[test]
    fn flaky_tests_never_count_as_lost() {
        let b = Baseline::from_runs(&[
            res(&[("a", Passed), ("flake", Passed), ("c", Failed)]),
            res(&[("a", Passed), ("flake", Failed), ("c", Failed)]),
        ]);
        assert_eq!(b.flaky.iter().collect::<Vec<_>>(), vec!["flake"]);
        let v = decide_open(
            &b,
            &[attempt(
                "p",
                res(&[("a", Passed), ("flake", Failed), ("c", Failed)]),
                3,
            )],
        );
        assert!(v[0].accepted, "{v:?}");
        assert!(v[0].lost.is_empty());
    }

    #[test]
    fn a_plan_that_fixes_some_and_loses_one_is_rejected() {
        let b = Baseline::from_runs(&[res(&[
            ("a", Passed),
            ("b", Passed),
            ("c", Failed),
            ("d", Error),
        ])]);
        let v = decide_open(
            &b,
            &[attempt(
                "p",
                res(&[("a", Passed), ("b", Failed), ("c", Passed), ("d", Passed)]),
                1,
            )],
        );
        assert!(!v[0].accepted);
        assert_eq!(v[0].lost, vec!["b"]);
        assert_eq!(v[0].fixed, vec!["c", "d"]);
        assert!(v[0].reason.contains("b"), "{}", v[0].reason);
    }

    #[test]
    fn a_test_missing_afterwards_is_lost() {
        let b = Baseline::from_runs(&[res(&[("a", Passed), ("b", Passed)])]);
        let v = decide_open(&b, &[attempt("p", res(&[("a", Passed)]), 1)]);
        assert_eq!(v[0].lost, vec!["b"]);
    }

    #[test]
    fn crashed_timed_out_or_failed_porters_are_rejected_with_the_reason() {
        let b = Baseline::from_runs(&[res(&[("a", Passed)])]);
        let mut crashed = attempt("crash", Results::new(), 0);
        crashed.failure = Some("the test command printed no results (exit 139)".into());
        let mut slow = attempt("slow", Results::new(), 0);
        slow.failure = Some("the porter timed out after 600 s".into());
        slow.tests_ran = false;
        let mut bad = attempt("bad", Results::new(), 0);
        bad.failure = Some("the porter exited with 2".into());
        bad.tests_ran = false;
        let v = decide_open(&b, &[crashed, slow, bad]);
        assert!(v.iter().all(|v| !v.accepted && v.rank.is_none()));
        assert_eq!(v[1].reason, "the porter timed out after 600 s");
        // The tests ran and printed nothing readable: every baseline pass is lost.
        assert_eq!(v[0].lost, vec!["a"]);
        assert!(v[2].lost.is_empty(), "not judged by tests: {:?}", v[2]);
    }

    #[test]
    fn a_suite_that_no_longer_collects_loses_every_test_of_the_broken_file() {
        let b = Baseline::from_runs(&[res(&[
            ("tests/a.py::t1", Passed),
            ("tests/a.py::t2", Passed),
            ("tests/b.py::t3", Passed),
        ])]);
        let now = res(&[("tests/a.py", Error), ("tests/b.py::t3", Passed)]);
        let v = decide_open(&b, &[attempt("p", now.clone(), 1)]);
        assert_eq!(v[0].lost, vec!["tests/a.py::t1", "tests/a.py::t2"]);
        let given = b.attribute_file_errors(&now);
        assert_eq!(given["tests/a.py::t1"], Error);
    }

    #[test]
    fn xfail_is_no_pass_and_an_xpass_is_no_loss() {
        let b = Baseline::from_runs(&[res(&[
            ("known_bug", Xfailed),
            ("ok", Passed),
            ("skipped", Skipped),
        ])]);
        assert_eq!(b.passed().count(), 1, "xfail and skip are not passes");
        let v = decide_open(
            &b,
            &[attempt(
                "p",
                res(&[("known_bug", Xpassed), ("ok", Passed), ("skipped", Failed)]),
                1,
            )],
        );
        assert!(v[0].accepted, "{v:?}");
        // A pass that becomes an expected failure is lost.
        let v = decide_open(&b, &[attempt("q", res(&[("ok", Xfailed)]), 1)]);
        assert_eq!(v[0].lost, vec!["ok"]);
    }

    #[test]
    fn smallest_diff_wins_then_test_time() {
        let b = Baseline::from_runs(&[res(&[("a", Passed)])]);
        let mut big = attempt("big", res(&[("a", Passed)]), 40);
        big.test_ms = 1;
        let small = attempt("small", res(&[("a", Passed)]), 10);
        let mut tie_slow = attempt("tie-slow", res(&[("a", Passed)]), 10);
        tie_slow.test_ms = 500;
        let v = decide_open(&b, &[big, small, tie_slow]);
        let rank = |p: &str| v.iter().find(|x| x.plan == p).unwrap().rank;
        assert_eq!(
            (rank("small"), rank("tie-slow"), rank("big")),
            (Some(1), Some(2), Some(3))
        );
        // Each says why it stands where it does.
        let why = |p: &str| {
            v.iter()
                .find(|x| x.plan == p)
                .unwrap()
                .rank_reason
                .clone()
                .unwrap()
        };
        assert!(why("small").contains("smallest diff"), "{}", why("small"));
        assert!(
            why("tie-slow").contains("same diff size as small")
                && why("tie-slow").contains("500 ms"),
            "{}",
            why("tie-slow")
        );
        assert_eq!(
            why("big"),
            "a larger diff than tie-slow: 40 lines against 10"
        );
    }

    #[test]
    fn diff_lines_ignores_headers() {
        let d = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n context\n";
        assert_eq!(diff_lines(d), 2);
    }

    /// The false accept the old reading allowed: keyed by assertion description, one
    /// baseline failure of "should be equal" (a test needing the network) made every "should
    /// be equal" count as failing before, so a port breaking another one lost nothing. Read
    /// by named test, the port loses exactly the test it broke.
    #[test]
    fn tap_a_shared_assertion_name_hides_no_loss() {
        let base = "# needs the network\nnot ok 1 should be equal\n# adds\nok 2 should be equal\n# subtracts\nok 3 should be equal\n1..3\n";
        let port = "# needs the network\nnot ok 1 should be equal\n# adds\nok 2 should be equal\n# subtracts\nnot ok 3 should be equal\n1..3\n";
        let before =
            Baseline::from_runs(&[reports::parse(reports::Format::Tap, base).unwrap().results]);
        let now = reports::parse(reports::Format::Tap, port).unwrap().results;
        assert_eq!(before.lost(&now), vec!["subtracts".to_string()]);
        // Two tests of one name are two tests, and the report says so.
        let twice = "# adds\nok 1 should be equal\n# adds\nnot ok 2 should be equal\n1..2\n";
        let p = reports::parse(reports::Format::Tap, twice).unwrap();
        assert_eq!(p.results.get("adds"), Some(&reports::Outcome::Passed));
        assert_eq!(p.results.get("adds #2"), Some(&reports::Outcome::Failed));
        let note = p.repeated_note().unwrap();
        assert!(note.contains("\"adds\" \u{d7}2"), "{note}");
        // Plain TAP (no names) keeps a test per assertion, by description.
        let plain = reports::parse(
            reports::Format::Tap,
            "ok 1 - a\nok 2 - a\nnot ok 3 - b\n1..3\n",
        )
        .unwrap();
        assert_eq!(plain.results.len(), 3, "{:?}", plain.results);
        assert_eq!(plain.results.get("a #2"), Some(&reports::Outcome::Passed));
    }

    /// The same false accept in Mocha's spec output: keyed by bare title, two tests of one
    /// title in two suites were one id, and one's failure before hid the other's loss.
    #[test]
    fn mocha_spec_a_shared_title_hides_no_loss() {
        let base =
            "\n  network\n    1) works\n  math\n    ✔ works\n\n  1 passing (3ms)\n  1 failing\n";
        let port =
            "\n  network\n    1) works\n  math\n    2) works\n\n  0 passing (3ms)\n  2 failing\n";
        let before =
            Baseline::from_runs(&[reports::parse(reports::Format::Auto, base).unwrap().results]);
        let now = reports::parse(reports::Format::Auto, port).unwrap().results;
        assert_eq!(before.lost(&now), vec!["math > works".to_string()]);
        // Two files with the same suite path: two tests, told apart, and said.
        let files =
            "\n  math\n    ✔ works\n  math\n    1) works\n\n  1 passing (3ms)\n  1 failing\n";
        let p = reports::parse(reports::Format::Auto, files).unwrap();
        assert_eq!(
            p.results.get("math > works"),
            Some(&reports::Outcome::Passed)
        );
        assert_eq!(
            p.results.get("math > works #2"),
            Some(&reports::Outcome::Failed)
        );
        assert!(p.repeated_note().is_some());
    }
}
