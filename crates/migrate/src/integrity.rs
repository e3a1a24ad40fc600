//! Test integrity: "no test lost" proves a port only if the tests are the same tests. A
//! plan's patch is read for the test files it changes (by the usual naming of test files
//! across runners), which it deletes, and how many assertions it takes out of them; the report
//! lists them per plan, and `protect_tests` rejects a plan that changes any.

use serde::{Deserialize, Serialize};

/// What a plan's patch does to the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestChanges {
    /// Test files the patch changes, adds or deletes.
    pub changed: Vec<String>,
    /// Of those, the ones it deletes.
    pub deleted: Vec<String>,
    /// Assertions removed from test files, net of those added (0 when it adds more).
    pub assertions_removed: u64,
}

impl TestChanges {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty()
    }

    /// One sentence for a verdict's reason.
    pub fn describe(&self) -> String {
        let mut s = format!("changes test files: {}", self.changed.join(", "));
        if !self.deleted.is_empty() {
            s += &format!("; deletes {}", self.deleted.join(", "));
        }
        if self.assertions_removed > 0 {
            s += &format!("; removes {} assertion(s)", self.assertions_removed);
        }
        s
    }
}

/// Which paths are test files: the usual naming of the runners ([`is_test_path`]) or, when
/// given (`--tests GLOB`), the globs alone (`tests/**`, `**/*_spec.rb`).
#[derive(Debug, Clone, Default)]
pub struct TestFiles {
    globs: Option<globset::GlobSet>,
}

impl TestFiles {
    /// The globs given, parsed once; an empty list is the runners' usual naming.
    pub fn new(patterns: &[String]) -> Result<TestFiles, String> {
        if patterns.is_empty() {
            return Ok(TestFiles::default());
        }
        let mut set = globset::GlobSetBuilder::new();
        for p in patterns {
            let glob = globset::GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("--tests {p:?}: {e}"))?;
            set.add(glob);
        }
        let globs = set.build().map_err(|e| format!("--tests: {e}"))?;
        Ok(TestFiles { globs: Some(globs) })
    }

    /// Whether `path` (relative to the code) is a test file.
    pub fn contains(&self, path: &str) -> bool {
        match &self.globs {
            Some(g) => g.is_match(path),
            None => is_test_path(path),
        }
    }
}

/// Whether `path` is a test file by the conventions of pytest, unittest, Go, Jest/Vitest/
/// Mocha and most Java and Rust layouts.
pub fn is_test_path(path: &str) -> bool {
    let mut parts = path.split('/');
    let name = parts.next_back().unwrap_or(path);
    let in_test_dir = path
        .split('/')
        .rev()
        .skip(1)
        .any(|d| matches!(d, "test" | "tests" | "testing" | "__tests__" | "spec"));
    in_test_dir
        || name == "conftest.py"
        || (name.starts_with("test_") && name.ends_with(".py"))
        || name.ends_with("_test.py")
        || name.ends_with("_test.go")
        || [".test.", ".spec."].iter().any(|m| name.contains(m))
}

/// A line that asserts something, in the languages whose tests forkbox reads.
fn asserts(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("assert")
        || l.contains(" assert ")
        || l.contains("self.assert")
        || l.contains("expect(")
        || l.contains("t.Error")
        || l.contains("t.Fatal")
        || l.contains("assert!(")
        || l.contains("assert_eq!(")
        || l.contains("Assert.")
}

/// Reads a unified diff (`git diff`) for what it does to the test files.
pub fn of_diff(diff: &str, tests: &TestFiles) -> TestChanges {
    let mut out = TestChanges::default();
    let (mut file, mut added, mut removed) = (None::<String>, 0u64, 0u64);
    let mut deleting = false;
    for line in diff.lines() {
        if let Some(rest) = line.strip_prefix("diff --git a/") {
            let path = rest.split(" b/").next().unwrap_or(rest).to_string();
            deleting = false;
            file = tests.contains(&path).then(|| {
                out.changed.push(path.clone());
                path
            });
            continue;
        }
        let Some(f) = &file else { continue };
        if line.starts_with("deleted file mode") && !deleting {
            deleting = true;
            out.deleted.push(f.clone());
        } else if let Some(l) = line.strip_prefix('+').filter(|_| !line.starts_with("+++")) {
            added += u64::from(asserts(l));
        } else if let Some(l) = line.strip_prefix('-').filter(|_| !line.starts_with("---")) {
            removed += u64::from(asserts(l));
        }
    }
    out.assertions_removed = removed.saturating_sub(added);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_files_are_told_by_their_names_and_directories() {
        for t in [
            "tests/test_api.py",
            "pkg/tests/helpers.py",
            "test_x.py",
            "x_test.py",
            "conftest.py",
            "server/handler_test.go",
            "src/app.test.ts",
            "src/__tests__/app.js",
            "web/button.spec.jsx",
        ] {
            assert!(is_test_path(t), "{t}");
        }
        for t in [
            "src/pkg/api.py",
            "testing.py",
            "contest.py",
            "attest/x.py",
            "tests",
        ] {
            assert!(!is_test_path(t), "{t}");
        }
    }

    #[test]
    fn a_diff_that_weakens_tests_is_read_for_it() {
        let diff = "\
diff --git a/src/calc.py b/src/calc.py
--- a/src/calc.py
+++ b/src/calc.py
@@ -1 +1 @@
-    assert x  # not a test file
+    return a - b
diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,3 +1,2 @@
-    assert sub(3, 1) == 2
-    assert sub(1, 3) == -2
+    assert sub(3, 1) in (2, 4)
diff --git a/tests/test_old.py b/tests/test_old.py
deleted file mode 100644
--- a/tests/test_old.py
+++ /dev/null
@@ -1 +0,0 @@
-def test_old(): assert True
";
        let c = of_diff(diff, &TestFiles::default());
        assert_eq!(c.changed, vec!["tests/test_calc.py", "tests/test_old.py"]);
        assert_eq!(c.deleted, vec!["tests/test_old.py"]);
        assert_eq!(c.assertions_removed, 2);
        assert!(
            c.describe().contains("deletes tests/test_old.py"),
            "{}",
            c.describe()
        );
        assert!(of_diff(
            "diff --git a/src/x.py b/src/x.py\n+x\n",
            &TestFiles::default()
        )
        .is_empty());
        // Globs given replace the usual naming.
        let spec = TestFiles::new(&["spec/**/*.rb".into(), "checks/*".into()]).unwrap();
        let diff = "diff --git a/spec/models/user_spec.rb b/spec/models/user_spec.rb\n-  expect(x)\ndiff --git a/checks/run.sh b/checks/run.sh\n+x\ndiff --git a/tests/test_a.py b/tests/test_a.py\n+x\ndiff --git a/checks/deep/x b/checks/deep/x\n+x\n";
        let c = of_diff(diff, &spec);
        assert_eq!(c.changed, vec!["spec/models/user_spec.rb", "checks/run.sh"]);
        assert_eq!(c.assertions_removed, 1);
        let bad = TestFiles::new(&["tests/[".into()]).unwrap_err();
        assert!(bad.contains("--tests \"tests/[\""), "{bad}");
    }
}
