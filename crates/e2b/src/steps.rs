//! An E2B template's build (what `Template.build` of E2B's SDKs sends: a base and steps) as a
//! Dockerfile and its context, which forkbox builds as any Dockerfile: every step in a sandbox
//! of the image being built, never on the host.
//!
//! E2B's semantics kept: steps run as `user` in its home unless a `USER` or `WORKDIR` step
//! says otherwise (E2B's builder makes `user` first), a `RUN` may name the user it runs as
//! for itself alone, `USER` makes a missing user, a `COPY` gives what it copies to the current
//! user unless it names an owner, and its source is the part of its pattern before the first
//! wildcard (the upload holds only what matched).

use serde::Deserialize;

/// One step as the SDKs send it (`TemplateStep`); keys the SDKs add (`forceUpload`,
/// `resolveSymlinks`, `gzip`) are ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub files_hash: Option<String>,
    /// `skip_cache()` before this step: the build takes nothing from an earlier one.
    #[serde(default)]
    pub force: Option<bool>,
}

/// The Dockerfile of a template build, and what each of its instructions was: `None` for
/// E2B's base phase (FROM and the default user), `Some(k)` for the template's step `k`
/// (1-based, as E2B's build status names a failed step).
#[derive(Debug, Default)]
pub struct Plan {
    pub dockerfile: String,
    pub origin: Vec<Option<usize>>,
    /// The uploads (by hash) the context must hold, each under `HASH/`.
    pub uploads: Vec<String>,
}

/// E2B's default user, made by its builder before the steps.
const DEFAULT_USER: &str = "user";

fn json(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `RUN` of `script` in `/bin/sh`, in the exec form (any text, newlines included, is safe).
fn run(script: &str) -> String {
    format!("RUN [\"/bin/sh\", \"-c\", {}]\n", json(script))
}

/// Makes user `u` when it is missing, as E2B's `USER` step does.
fn make_user(u: &str) -> String {
    let q = crate::guest::quote(u);
    run(&format!(
        "id -u {q} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {q}"
    ))
}

/// Fails, in the words of E2B's builder, when user `u` that `cmd` is to run as is missing.
fn user_exists(u: &str, cmd: &str) -> String {
    let said = format!(
        "failed to run command '{cmd}': command failed: unauthenticated: invalid username: '{u}'"
    );
    format!(
        "id -u {} >/dev/null 2>&1 || {{ echo {} >&2; exit 1; }}",
        crate::guest::quote(u),
        crate::guest::quote(&said)
    )
}

/// The part of a COPY source before its first wildcard (what E2B's builder copies from).
fn source_prefix(src: &str) -> String {
    let wild = |c: &str| c.contains(['*', '?', '[', '{']);
    src.trim_start_matches("./")
        .split('/')
        .take_while(|c| !wild(c))
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

impl Plan {
    fn push(&mut self, line: String, origin: Option<usize>) {
        // One instruction a line: `origin` is indexed by instruction.
        for l in line.lines() {
            self.dockerfile.push_str(l);
            self.dockerfile.push('\n');
            self.origin.push(origin);
        }
    }
}

/// The plan of a build from `base` (a forkbox image's name or a registry's image) through
/// `steps`; what it cannot build is said by step.
pub fn plan(base: &str, steps: &[Step]) -> Result<Plan, (usize, String)> {
    let mut p = Plan::default();
    p.push(format!("FROM {base}"), None);
    p.push("USER root".into(), None);
    p.push(make_user(DEFAULT_USER), None);
    p.push(format!("USER {DEFAULT_USER}"), None);
    p.push(format!("WORKDIR /home/{DEFAULT_USER}"), None);
    let mut user = DEFAULT_USER.to_string();
    for (i, s) in steps.iter().enumerate() {
        let k = Some(i + 1);
        let a = |n: usize| s.args.get(n).map(String::as_str).unwrap_or("");
        match s.kind.as_str() {
            "RUN" => {
                let who = a(1);
                if who.is_empty() || who == user {
                    p.push(run(a(0)), k);
                } else {
                    p.push("USER root".into(), k);
                    p.push(run(&user_exists(who, a(0))), k);
                    p.push(format!("USER {who}"), k);
                    p.push(run(a(0)), k);
                    p.push(format!("USER {user}"), k);
                }
            }
            "ENV" => {
                if s.args.len() % 2 != 0 {
                    return Err((i + 1, "ENV needs name and value pairs".into()));
                }
                let pairs: Vec<String> = s
                    .args
                    .chunks(2)
                    .map(|kv| format!("{}={}", kv[0], json(&kv[1])))
                    .collect();
                if !pairs.is_empty() {
                    p.push(format!("ENV {}", pairs.join(" ")), k);
                }
            }
            "WORKDIR" if !a(0).is_empty() => {
                p.push("USER root".into(), k);
                p.push(format!("WORKDIR {}", a(0)), k);
                p.push(run(&format!("chown {} .", crate::guest::quote(&user))), k);
                p.push(format!("USER {user}"), k);
            }
            "USER" if !a(0).is_empty() => {
                user = a(0).to_string();
                p.push("USER root".into(), k);
                p.push(make_user(&user), k);
                p.push(format!("USER {user}"), k);
            }
            "COPY" => copy(&mut p, s, &user, i + 1)?,
            other => {
                return Err((
                    i + 1,
                    format!(
                    "step {other} {:?} is not one forkbox builds (COPY, ENV, RUN, WORKDIR, USER)",
                    s.args
                ),
                ))
            }
        }
    }
    // The image's own user stays root: the front end's commands start as root and become the
    // sandbox's user themselves, as envd does.
    p.push("USER root".into(), None);
    Ok(p)
}

fn copy(p: &mut Plan, s: &Step, user: &str, k: usize) -> Result<(), (usize, String)> {
    let a = |n: usize| s.args.get(n).map(String::as_str).unwrap_or("");
    let hash = s.files_hash.clone().unwrap_or_default();
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err((k, "COPY needs the filesHash of its upload".into()));
    }
    let (src, dest) = (source_prefix(a(0)), a(1));
    if dest.is_empty() {
        return Err((k, "COPY needs a destination".into()));
    }
    let from = if src.is_empty() {
        hash.clone()
    } else {
        format!("{hash}/{src}")
    };
    let owner = match a(2) {
        "" => format!("{user}:{user}"),
        o if o.contains(':') => o.to_string(),
        o => format!("{o}:{o}"),
    };
    let mut flags = format!("--chown={owner}");
    if !a(3).is_empty() {
        flags += &format!(" --chmod={}", a(3));
    }
    p.push("USER root".into(), Some(k));
    p.push(
        format!("COPY {flags} [{}, {}]", json(&from), json(dest)),
        Some(k),
    );
    p.push(format!("USER {user}"), Some(k));
    if !p.uploads.contains(&hash) {
        p.uploads.push(hash);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> Step {
        Step {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            files_hash: (kind == "COPY").then(|| "ab".repeat(32)),
            force: None,
        }
    }

    #[test]
    fn steps_become_instructions_named_by_their_step() {
        let p = plan(
            "base",
            &[
                step("COPY", &["folder/*", "folder", "", ""]),
                step("RUN", &["whoami", "root"]),
                step("ENV", &["A", "x \"y\"", "B", "$A"]),
                step("WORKDIR", &["/app"]),
                step("USER", &["builder"]),
            ],
        )
        .unwrap();
        let lines: Vec<&str> = p.dockerfile.lines().collect();
        assert_eq!(lines.len(), p.origin.len());
        assert_eq!(lines[0], "FROM base");
        let h = "ab".repeat(32);
        let of = |k: usize| -> Vec<&str> {
            lines
                .iter()
                .zip(&p.origin)
                .filter(|(_, o)| **o == Some(k))
                .map(|(l, _)| *l)
                .collect()
        };
        assert_eq!(
            of(1),
            vec![
                "USER root",
                &format!("COPY --chown=user:user [\"{h}/folder\", \"folder\"]"),
                "USER user"
            ]
        );
        let run_as = of(2);
        assert_eq!(run_as.len(), 5);
        assert_eq!(run_as[0], "USER root");
        assert!(run_as[1].contains("id -u 'root'") && run_as[1].contains("invalid username: "));
        assert_eq!(
            run_as[2..],
            [
                "USER root",
                "RUN [\"/bin/sh\", \"-c\", \"whoami\"]",
                "USER user"
            ]
        );
        assert_eq!(of(3), vec![r#"ENV A="x \"y\"" B="$A""#]);
        assert_eq!(of(4)[1], "WORKDIR /app");
        assert_eq!(*of(5).last().unwrap(), "USER builder");
        assert_eq!(p.uploads, vec![h]);
        assert_eq!(source_prefix("./a/b*/c"), "a");
        assert_eq!(source_prefix("*.py"), "");
        assert_eq!(source_prefix("app.py"), "app.py");
        let e = plan("base", &[step("HEALTHCHECK", &[])]).unwrap_err();
        assert_eq!(e.0, 1);
    }
}
