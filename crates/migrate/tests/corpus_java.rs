//! The Java corpus: Java code with its JUnit suites from Debian's binary packages (Debian's
//! source packages are not reachable from these machines), built by Maven offline from Debian's
//! own repository (`/usr/share/maven-repo`): Bazel's runfiles and zip libraries
//! (`bazel-bootstrap-source`) and SnakeYAML's examples (`libyaml-snake-java`). Each project is
//! laid out as a Maven project from the package's files and its build in `corpus-java/<name>`
//! (a `pom.xml`, `.mvn/maven.config`), run natively with `mvn test` in Debian chroots (bookworm's
//! OpenJDK 17 and Maven 3.8, trixie's OpenJDK 21 and Maven 3.9) and read from the JUnit XML
//! files Surefire writes, and through `forkbox migrate` from `java-17` to `java-21` (the bundled
//! images; SnakeYAML's on a recipe that adds its packages) with the same `mvn test` and two
//! plans: one that changes nothing and one that breaks one test. Promises checked per project:
//! the baseline is the native OpenJDK 17 run and the first plan's run the native OpenJDK 21 run,
//! test for test (`package.Class.method`, as JUnit tools name them); every id names a test
//! method in the sources; the plan that changes nothing loses what the native runs lose, the one
//! that breaks a test loses exactly that test besides.
//!
//! The packages are fetched with `apt-get download` into a cache (never committed). Runs with
//! `FORKBOX_CORPUS=1` (one project) or `FORKBOX_CORPUS=all` (every one); needs a Debian mirror.
//! Prints `FIGURE` lines.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_engine::image::Recipe;
use forkbox_migrate::reports::{self, Outcome, Results};
use forkbox_test_infra as infra;

mod common;
use common::{locked, passed};

/// What the native runs share with the images (`images/java-*.toml`).
const ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    (
        "JAVA_TOOL_OPTIONS",
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1",
    ),
];

/// Debian's package `package`, downloaded once into `dir/debs` and unpacked (once) beside it.
fn unpacked(dir: &Path, package: &str) -> PathBuf {
    let cache = dir.join("debs");
    let deb = common::deb(dir, package);
    locked(dir, || {
        let root = cache.join(format!("{package}.root"));
        if root.is_dir() {
            return root;
        }
        let tmp = cache.join(format!("{package}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        let st = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&tmp)
            .status()
            .unwrap();
        assert!(st.success(), "dpkg-deb -x {}", deb.display());
        std::fs::rename(&tmp, &root).unwrap();
        root
    })
}

/// A project: its name (its build is `corpus-java/<name>`), the Debian package holding its
/// code, the shell commands laying that out as a Maven project (run in the project, `$DEB` the
/// unpacked package), the images it migrates between, how many tests pass at least, and the
/// test the breaking plan breaks (`file`, `method`).
struct Project<'a> {
    name: &'a str,
    package: &'a str,
    layout: &'a str,
    images: (&'a str, &'a str),
    at_least: usize,
    breaks: (&'a str, &'a str),
}

/// A fresh copy of the project: the package's files laid out, then its build.
fn project(dir: &Path, p: &Project<'_>) -> (tempfile::TempDir, PathBuf) {
    let deb = unpacked(dir, p.package);
    let work = tempfile::tempdir().unwrap();
    let code = work.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    let build = infra::repo_root()
        .join("crates/migrate/tests/corpus-java")
        .join(p.name);
    let out = Command::new("sh")
        .args(["-ec", &format!("{}\ncp -a \"$BUILD\"/. .", p.layout)])
        .env("DEB", &deb)
        .env("BUILD", &build)
        .current_dir(&code)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "laying out {}: {}",
        p.name,
        String::from_utf8_lossy(&out.stderr)
    );
    (work, code)
}

/// The JUnit XML files Surefire wrote under `code`, read as forkbox reads them.
fn surefire(code: &Path) -> Results {
    let dir = code.join("target/surefire-reports");
    let mut all = Results::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("TEST-") && name.ends_with(".xml") {
            let text = std::fs::read_to_string(&p).unwrap();
            all.extend(reports::junit(&text).unwrap_or_else(|e| panic!("{name}: {e}")));
        }
    }
    all
}

/// `mvn test` run natively in `root` on a fresh copy of the project; its results and how long
/// it took.
fn native(root: &Path, dir: &Path, p: &Project<'_>) -> (Results, u64) {
    let (_keep, code) = project(dir, p);
    let (out, ms) = common::native(root, &code, "mvn test", ENV);
    let results = surefire(&code);
    assert!(
        !results.is_empty(),
        "{} in {}: no results\n{}",
        p.name,
        root.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    (results, ms)
}

/// Whether a person finds the test `id` (`package.Class.method`) in the sources: the class's
/// file under `src/test/java` declaring that method.
fn findable(id: &str, code: &Path) -> bool {
    let Some((class, method)) = id.rsplit_once('.') else {
        return false;
    };
    let file = code
        .join("src/test/java")
        .join(format!("{}.java", class.replace('.', "/")));
    std::fs::read_to_string(file).is_ok_and(|s| s.contains(&format!("void {method}(")))
}

/// What the chroots carry: the packages of both images (their recipes), and SnakeYAML's.
fn packages(image: &str) -> Vec<String> {
    let file = infra::repo_root().join(format!("images/{image}.toml"));
    let (recipe, _) = Recipe::load(&file).unwrap();
    let mut apt = recipe.apt;
    apt.extend(["libyaml-snake-java", "libjoda-time-java"].map(String::from));
    apt
}

/// The image `name`: a carried one, or a test recipe in `tests/images`.
fn image(paths: &forkbox_engine::paths::Paths, name: &str) -> String {
    let test = infra::repo_root().join(format!("crates/migrate/tests/images/{name}.toml"));
    if test.exists() {
        infra::image(paths, name.trim_end_matches("-yaml"));
        infra::image_from(paths, &test).to_string()
    } else {
        infra::image(paths, name).to_string()
    }
}

async fn check(p: Project<'_>, first: bool) {
    if !common::runs(p.name, first) {
        return;
    }
    let paths = infra::home();
    let (old, new) = (image(&paths, p.images.0), image(&paths, p.images.1));
    let dir = paths.home().join("corpus-java");
    std::fs::create_dir_all(&dir).unwrap();
    let bookworm = common::chroot(
        &dir,
        "bookworm",
        &packages("java-17")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "usr/share/maven-repo/org/yaml/snakeyaml",
    );
    let trixie = common::chroot(
        &dir,
        "trixie",
        &packages("java-21")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "usr/share/maven-repo/org/yaml/snakeyaml",
    );
    let (jdk17, ms17) = native(&bookworm, &dir, &p);
    let (jdk21, ms21) = native(&trixie, &dir, &p);
    let (_keep, code) = project(&dir, &p);
    common::check_native(p.name, (&jdk17, &jdk21), p.at_least, |id| {
        findable(id, &code)
    });
    let (file, method) = p.breaks;
    let class = file
        .trim_start_matches("src/test/java/")
        .trim_end_matches(".java")
        .replace('/', ".");
    let broken = format!("{class}.{method}");
    assert_eq!(jdk17.get(&broken), Some(&Outcome::Passed), "{broken}");

    let breaks = format!(
        "sed -i 's/void {method}()[^{{]*{{/& org.junit.Assert.fail(\"broken by the plan\");/' {file} && grep -q 'broken by the plan' {file}"
    );
    let run = common::same_and_break(&paths, (&old, &new), code.clone(), "mvn test", &breaks).await;
    common::check_two_plans(p.name, &run, (&jdk17, &jdk21), &broken);
    let report = &run.report;
    assert!(
        report.results_source.contains("JUnit XML"),
        "{}: {}",
        p.name,
        report.results_source
    );
    println!(
        "FIGURE corpus-java {}: {} tests pass natively on OpenJDK 17 ({ms17} ms), {} on OpenJDK 21 ({ms21} ms); forkbox baseline {} ms, whole migration (2 plans) {} ms = {:.1}x (native 17 + 21 = {} ms); results read from {}",
        p.name,
        passed(&jdk17).len(),
        passed(&jdk21).len(),
        report.phases.baseline_ms,
        run.ms,
        run.ms as f64 / (ms17 + ms21).max(1) as f64,
        ms17 + ms21,
        report.results_source,
    );
}

/// Bazel's runfiles library: Guava, JSR 305, Truth; a test that needs `$TEST_TMPDIR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bazel_runfiles() {
    check(
        Project {
            name: "runfiles",
            package: "bazel-bootstrap-source",
            layout: "B=\"$DEB\"/usr/src/bazel-bootstrap/tools/java/runfiles
m=src/main/java/com/google/devtools/build/runfiles
t=src/test/java/com/google/devtools/build/runfiles
mkdir -p $m $t && cp \"$B\"/*.java $m && cp \"$B\"/testing/*.java $t",
            images: ("java-17", "java-21"),
            at_least: 13,
            breaks: (
                "src/test/java/com/google/devtools/build/runfiles/UtilTest.java",
                "testIsNullOrEmpty",
            ),
        },
        true,
    )
    .await;
}

/// Bazel's zip library: Guava's testlib beside Truth, a hundred tests in seven classes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bazel_zip() {
    check(
        Project {
            name: "zip",
            package: "bazel-bootstrap-source",
            layout: "B=\"$DEB\"/usr/src/bazel-bootstrap/src/java_tools/singlejar
m=src/main/java/com/google/devtools/build/zip
t=src/test/java/com/google/devtools/build/zip
mkdir -p $m $t && cp \"$B\"/java/com/google/devtools/build/zip/*.java $m
cp \"$B\"/javatests/com/google/devtools/build/zip/*.java $t && rm $t/ZipTests.java",
            images: ("java-17", "java-21"),
            at_least: 100,
            breaks: (
                "src/test/java/com/google/devtools/build/zip/ExtraDataTest.java",
                "testFromData",
            ),
        },
        false,
    )
    .await;
}

/// SnakeYAML's examples: JUnit 3 style `TestCase`s (run by JUnit 4), resources on the class
/// path, some failing with Debian's SnakeYAML 1.33 on either JDK (the examples are older than
/// the jar), on images built from a recipe on the bundled ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snakeyaml_examples() {
    check(
        Project {
            name: "snakeyaml",
            package: "libyaml-snake-java",
            layout: "E=\"$DEB\"/usr/share/doc/libyaml-snake-java/examples
mkdir -p src/test/java/examples src/test/resources/examples
cp -r \"$E\"/. src/test/java/examples/ && mv src/test/java/examples/*.yaml src/test/resources/examples/
(cd src/test/java/examples && rm CustomConstructor.java CustomListExampleTest.java CustomMapExampleTest.java)",
            images: ("java-17-yaml", "java-21-yaml"),
            at_least: 50,
            breaks: ("src/test/java/examples/DumpExampleTest.java", "testDump"),
        },
        false,
    )
    .await;
}
