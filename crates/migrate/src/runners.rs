//! The test runners forkbox knows and how each is asked for a machine-readable report beside
//! the output a person reads (which stays as the runner prints it):
//!
//! | runner | how | read from |
//! |---|---|---|
//! | pytest | `PYTEST_ADDOPTS` adds `--junitxml` | a JUnit XML file |
//! | Jest | a Node preload adds `--json --outputFile` | a JSON file |
//! | Vitest | a Node preload adds `--reporter=json --outputFile.json` | a JSON file |
//! | Mocha | a Node preload records its runner's events | a JSON file |
//! | `go test` | `GOFLAGS=-json` | the output (shown as the text it carries) |
//! | Maven, Gradle | — (they write reports anyway) | their JUnit XML files |
//! | `node --test`, tape, cargo, nextest | — | the output |
//!
//! The Node preload acts only in the process whose script is the runner's own command line
//! (`jest/bin/jest.js`, `vitest/vitest.mjs`, `mocha/bin/…`), however it was reached: `npm
//! test`, `npx`, a script. A command line that already asks for the report keeps it.

use crate::reports::{self, Parsed};

/// Where the reports of one run are written in the guest (emptied before each run).
pub const REPORT_DIR: &str = "/tmp/forkbox-reports";
/// The Node preload, written into the guest before each run.
pub const HOOK_PATH: &str = "/tmp/forkbox-runner-hook.cjs";
/// Its source.
pub const HOOK: &str = include_str!("runner-hook.cjs");

/// What a test command is given so that the runners in it write their reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// Shell lines run before the command, in the same shell.
    pub prelude: String,
    /// Whether `go test` prints JSON (its text is then read back from the events).
    pub go_json: bool,
    /// Whether Maven's or Gradle's XML reports are read after the run.
    pub junit_files: bool,
    /// Whether `cargo test` runs every test binary whatever fails (`--no-fail-fast`).
    pub cargo: bool,
}

/// The words of the shell command `cmd`, separators dropped.
fn words(cmd: &str) -> impl Iterator<Item = &str> {
    cmd.split(|c: char| c.is_whitespace() || ";&|()`".contains(c))
        .filter(|w| !w.is_empty())
}

/// Whether `word` is a word of the shell command `cmd`, a path to it included (`./gradlew`,
/// `/usr/lib/go-1.22/bin/go`).
fn runs(cmd: &str, word: &str) -> bool {
    words(cmd).any(|w| w == word || w.ends_with(&format!("/{word}")))
}

/// Whether `cmd` runs `go test`.
fn go_test(cmd: &str) -> bool {
    let w: Vec<&str> = words(cmd).collect();
    w.windows(2)
        .any(|p| (p[0] == "go" || p[0].ends_with("/go")) && p[1] == "test")
}

/// What the test command `cmd` is given.
pub fn setup(cmd: &str) -> Setup {
    let go_json = go_test(cmd);
    let junit_files = ["mvn", "mvnw", "gradle", "gradlew"]
        .iter()
        .any(|w| runs(cmd, w));
    let mut prelude = format!(
        "rm -rf {REPORT_DIR} && mkdir -p {REPORT_DIR}\n\
         export FORKBOX_REPORTS={REPORT_DIR}\n\
         export NODE_OPTIONS=\"--require={HOOK_PATH}${{NODE_OPTIONS:+ $NODE_OPTIONS}}\"\n"
    );
    if go_json {
        prelude.push_str("export GOFLAGS=\"-json${GOFLAGS:+ $GOFLAGS}\"\n");
    }
    let cargo = runs(cmd, "cargo");
    if cargo {
        // A failing test binary stops `cargo test` (and nextest) before the next one: the
        // tests it did not run would count as lost. Where the command calls cargo itself,
        // every binary runs.
        prelude.push_str(CARGO_NO_FAIL_FAST);
    }
    if junit_files {
        prelude.push_str(&format!(
            "find . \\( {JUNIT_FILES} \\) -delete 2>/dev/null\n"
        ));
    }
    Setup {
        prelude,
        go_json,
        junit_files,
        cargo,
    }
}

/// `cargo test` and `cargo nextest run` with `--no-fail-fast`, as a function of the shell the
/// test command runs in.
const CARGO_NO_FAIL_FAST: &str = r#"cargo() {
  case "$1 $2" in
    "test "*|"t "*) c=$1; shift; command cargo "$c" --no-fail-fast "$@" ;;
    "nextest run"|"nextest r") n=$1; r=$2; shift 2; command cargo "$n" "$r" --no-fail-fast "$@" ;;
    *) command cargo "$@" ;;
  esac
}
"#;

/// `find` tests for the JUnit XML files Maven (Surefire) and Gradle write.
pub const JUNIT_FILES: &str =
    "-path '*/surefire-reports/TEST-*.xml' -o -path '*/test-results/*/TEST-*.xml'";

/// A report file the run left in [`REPORT_DIR`] (or a JUnit file of Maven's or Gradle's),
/// read by its runner's reader; what it was.
pub fn read_report(name: &str, text: &str) -> Option<(Parsed, &'static str)> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let (parsed, what) = if base.starts_with("jest-") {
        (
            reports::jest_json(text),
            "Jest's JSON report (--json, added by forkbox)",
        )
    } else if base.starts_with("vitest-") {
        (
            reports::jest_json(text),
            "Vitest's JSON reporter (added by forkbox)",
        )
    } else if base.starts_with("mocha-") {
        (
            reports::mocha_json(text),
            "Mocha's runner events (recorded by forkbox)",
        )
    } else if base.starts_with("TEST-") && base.ends_with(".xml") {
        (
            reports::junit(text).ok()?.into(),
            "the JUnit XML reports Maven or Gradle wrote",
        )
    } else {
        return None;
    };
    Some((parsed, what))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_read_for_their_runners() {
        assert!(setup("go test ./...").go_json);
        assert!(setup("cd x && /usr/lib/go-1.22/bin/go test -race ./...").go_json);
        assert!(!setup("npm test").go_json);
        assert!(!setup("cargo test").go_json);
        assert!(!setup("go vet ./... && echo test").go_json);
        assert!(setup("mvn -o test").junit_files);
        assert!(setup("./gradlew test --offline").junit_files);
        assert!(!setup("pytest -q").junit_files);
        assert!(setup("cargo test --all").prelude.contains("--no-fail-fast"));
        assert!(!setup("pytest").prelude.contains("--no-fail-fast"));
        // Every run gets the Node preload; a NODE_OPTIONS of the image's is kept after it.
        assert!(setup("pytest")
            .prelude
            .contains("${NODE_OPTIONS:+ $NODE_OPTIONS}"));
    }

    #[test]
    fn report_files_go_to_their_runners_readers() {
        let jest = r#"{"testResults":[{"name":"/w/a.test.js","status":"passed","assertionResults":[{"ancestorTitles":["s"],"title":"t","status":"passed"}]}]}"#;
        let (p, what) = read_report("/tmp/forkbox-reports/jest-12.json", jest).unwrap();
        assert_eq!(p.results.len(), 1);
        assert!(p.results.contains_key("/w/a.test.js > s > t"));
        assert!(what.contains("Jest"));
        let mocha = r#"{"stats":{},"passes":[{"title":"t","fullTitle":"s t","file":"/w/a.js"}],"pending":[],"failures":[{"title":"\"before all\" hook","fullTitle":"s \"before all\" hook","file":"/w/b.js"}]}"#;
        let (p, _) = read_report("mocha-3.json", mocha).unwrap();
        assert_eq!(p.results["/w/a.js > s t"], reports::Outcome::Passed);
        assert_eq!(
            p.results["/w/b.js > s \"before all\" hook"],
            reports::Outcome::Error
        );
        let surefire = r#"<?xml version="1.0"?><testsuite name="org.a.BTest" tests="2"><testcase classname="org.a.BTest" name="adds"/><testcase classname="org.a.BTest" name="fails"><failure message="x"/></testcase></testsuite>"#;
        let (p, what) =
            read_report("/w/target/surefire-reports/TEST-org.a.BTest.xml", surefire).unwrap();
        assert_eq!(p.results["org.a.BTest.adds"], reports::Outcome::Passed);
        assert_eq!(p.results["org.a.BTest.fails"], reports::Outcome::Failed);
        assert!(what.contains("Maven or Gradle"));
        assert!(read_report("other.json", "{}").is_none());
    }
}
