//! The deployment files, checked offline: the Kubernetes manifests render with kustomize (the
//! base with its etcd and the external-etcd overlay), every object validates strictly against
//! Kubernetes 1.32's schemas, no environment variable is set twice over (a patch that left
//! `value` beside `valueFrom`), and every forkbox flag the manifests and the systemd unit pass
//! is one this build's `forkbox` has.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::process::Command;

use forkbox_test_infra as infra;

fn render(dir: &str) -> std::path::PathBuf {
    let root = infra::repo_root();
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(root.join("deploy/kubernetes").join(dir))
        .output()
        .expect("kubectl (with kustomize) runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::env::temp_dir().join(format!(
        "forkbox-deploy-{}-{}.yaml",
        dir.replace('/', "-"),
        std::process::id()
    ));
    std::fs::write(&file, &out.stdout).unwrap();
    file
}

/// Every `--flag` of `forkbox serve` and `forkbox token create`, from their help.
fn flags(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_forkbox"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

const CHECK: &str = r#"
import sys, yaml, re
serve, token = open(sys.argv[2]).read(), open(sys.argv[3]).read()
problems = []
for doc in yaml.safe_load_all(open(sys.argv[1])):
    spec = (doc.get("spec") or {})
    pod = (spec.get("template") or {}).get("spec") or {}
    for c in pod.get("containers", []):
        for e in c.get("env", []):
            if "value" in e and "valueFrom" in e:
                problems.append(f"{doc['kind']}/{c['name']}: env {e['name']} has value and valueFrom")
        words = " ".join(c.get("command", []) + c.get("args", []))
        if not re.search(r"(^|[\s|])forkbox\s", words):
            continue  # etcd's own flags
        help = token if "token create" in words else serve
        for flag in re.findall(r"(--[a-z][a-z-]+)", words):
            if flag not in help:
                problems.append(f"{doc['kind']}/{c['name']}: forkbox has no {flag}")
print("\n".join(problems))
sys.exit(1 if problems else 0)
"#;

#[test]
fn the_kubernetes_manifests_render_and_validate() {
    let python = infra::kube_python();
    let serve = std::env::temp_dir().join(format!("forkbox-serve-help-{}", std::process::id()));
    let token = std::env::temp_dir().join(format!("forkbox-token-help-{}", std::process::id()));
    std::fs::write(&serve, flags(&["serve"])).unwrap();
    std::fs::write(&token, flags(&["token", "create"])).unwrap();
    for dir in ["base", "external-etcd"] {
        let file = render(dir);
        let out = Command::new(&python)
            .args(["-m", "kubernetes_validate", "--strict", "-k", "1.32.0"])
            .arg(&file)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{dir}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for kind in ["daemonset/forkbox", "job/forkbox-tokens", "service/forkbox"] {
            assert!(
                said.contains(&format!("resource {kind} ")),
                "{dir}: {kind} not validated: {said}"
            );
        }
        assert_eq!(
            said.contains("statefulset/forkbox-etcd"),
            dir == "base",
            "{said}"
        );
        let out = Command::new(&python)
            .args(["-c", CHECK])
            .args([&file, &serve, &token])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{dir}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_file(file);
    }
}

#[test]
fn the_systemd_unit_passes_flags_forkbox_has() {
    let unit =
        std::fs::read_to_string(infra::repo_root().join("deploy/systemd/forkbox.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    assert!(exec.starts_with("/usr/local/bin/forkbox serve "), "{exec}");
    let help = flags(&["serve"]);
    for word in exec.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(word), "forkbox serve has no {word}");
    }
    // The settings it leaves to the environment file are ones serve reads.
    for var in ["FORKBOX_CLUSTER", "FORKBOX_NODE", "FORKBOX_ADVERTISE"] {
        assert!(
            help.contains(&format!("env: {var}")),
            "serve does not read {var}"
        );
    }
}
