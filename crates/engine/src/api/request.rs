//! Requests turned into what the engine runs: each is parsed into its type once (in
//! `forkbox-api`) and checked here.

use forkbox_api::{BuildRequest, ExecRequest, ImageView, TerminalSize, MAX_TIMEOUT_SECS};
use forkbox_protocol::{ExecSpec, Program};

use super::EngineError;

/// Checks an exec request and turns it into the protocol's command.
pub fn exec_spec(r: ExecRequest) -> Result<ExecSpec, EngineError> {
    let program = match (r.argv, r.shell) {
        (Some(a), None) if !a.is_empty() => Program::Argv(a),
        (None, Some(s)) => Program::Shell(s),
        _ => {
            return Err(EngineError::BadRequest(
                "give exactly one of `argv` (non-empty) and `shell`".into(),
            ))
        }
    };
    let timeout_ms = match (r.timeout_secs, r.timeout_ms) {
        (Some(_), Some(_)) => {
            return Err(EngineError::BadRequest(
                "give `timeout_secs` or `timeout_ms`, not both".into(),
            ))
        }
        (Some(s), None) => Some(s.saturating_mul(1000)),
        (None, ms) => ms,
    };
    if let Some(t) = timeout_ms {
        if t == 0 || t > MAX_TIMEOUT_SECS * 1000 {
            return Err(EngineError::BadRequest(format!(
                "timeout {t} ms is not between 1 ms and {MAX_TIMEOUT_SECS} s (24 h)"
            )));
        }
    }
    Ok(ExecSpec {
        program,
        cwd: r.cwd,
        env: r.env.into_iter().collect(),
        timeout_ms,
        stdin: r.stdin,
        tty: r.tty.map(TerminalSize::checked).transpose()?,
        user: None,
    })
}

/// The recipe a build request describes, checked.
pub fn build_recipe(r: &BuildRequest) -> Result<crate::image::Recipe, EngineError> {
    crate::image::Recipe::from_seed(&r.name, r.recipe.clone())
        .map_err(|m| EngineError::BadRequest(format!("recipe for {:?}: {m}", r.name)))
}

impl From<&crate::image::Image> for ImageView {
    fn from(i: &crate::image::Image) -> ImageView {
        ImageView {
            reference: i.reference(),
            name: i.meta.name.clone(),
            version: i.meta.version,
            suite: i.meta.suite.clone(),
            base: i.meta.recipe.base.clone(),
            pulled: i.meta.pulled.clone(),
            workdir: i.meta.workdir.clone(),
            user: i.meta.user.clone(),
            kernel: i.meta.kernel.clone(),
            content_mib: i.meta.content_bytes >> 20,
            disk_mib: i.meta.disk_bytes >> 20,
            created_unix: i.meta.created_unix,
            build_seconds: i.meta.build_seconds,
            env: i.meta.env.clone(),
        }
    }
}

/// `value` when it lies in `range`, else a bad request naming `what` and the bounds.
pub(super) fn within<T>(
    what: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, EngineError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(EngineError::BadRequest(format!(
            "{what} {value} is not between {} and {}",
            range.start(),
            range.end()
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// One recipe, one meaning: each row is the same recipe as TOML (what `forkbox image
    /// build -f` reads) and as the API's JSON body (what the SDKs and the CLI over the daemon
    /// send), and both give the same recipe or the same refusal.
    #[test]
    fn a_recipe_means_the_same_as_toml_and_as_the_apis_json() {
        let rows: &[(&str, serde_json::Value)] = &[
            ("", serde_json::json!({})),
            (
                "base = \"bookworm\"",
                serde_json::json!({"base": "bookworm"}),
            ),
            (
                "base = \"trixie\"\npip = [\"pytest\"]\napt = [\"git\"]",
                serde_json::json!({"base": "trixie", "pip": ["pytest"], "apt": ["git"]}),
            ),
            (
                "base = \"bullseye\"\nnpm = [\"left-pad\"]\ndisk_free_mib = 512",
                serde_json::json!({"base": "bullseye", "npm": ["left-pad"], "disk_free_mib": 512}),
            ),
            (
                "base = \"python-bookworm\"\nrun = [\"echo hi\"]\n[env]\nA_B = \"1\"",
                serde_json::json!({"base": "python-bookworm", "run": ["echo hi"], "env": {"A_B": "1"}}),
            ),
            (
                "base = \"bookworm@2\"",
                serde_json::json!({"base": "bookworm@2"}),
            ),
            (
                "base = \"python:3.8-slim\"",
                serde_json::json!({"base": "python:3.8-slim"}),
            ),
            (
                "base = \"localhost:5000/team/node:18\"",
                serde_json::json!({"base": "localhost:5000/team/node:18"}),
            ),
            (
                "mirror = \"https://mirror.example/debian\"",
                serde_json::json!({"mirror": "https://mirror.example/debian"}),
            ),
            // Refused alike, with the same words.
            (
                "base = \"no such thing!\"",
                serde_json::json!({"base": "no such thing!"}),
            ),
            (
                "pip = [\"-r requirements.txt\"]",
                serde_json::json!({"pip": ["-r requirements.txt"]}),
            ),
            (
                "[env]\n\"1X\" = \"y\"",
                serde_json::json!({"env": {"1X": "y"}}),
            ),
            (
                "mirror = \"ftp://old.example\"",
                serde_json::json!({"mirror": "ftp://old.example"}),
            ),
        ];
        for (toml, json) in rows {
            let from_toml = crate::image::Recipe::parse(&format!("name = \"x\"\n{toml}\n"));
            let body = serde_json::json!({"name": "x", "recipe": json});
            let request: BuildRequest = serde_json::from_value(body).unwrap();
            let from_json = build_recipe(&request);
            match (from_toml, from_json) {
                (Ok(t), Ok(j)) => assert_eq!(t, j, "{toml}"),
                (Err(t), Err(j)) => {
                    let j = j.to_string();
                    assert!(j.ends_with(&t), "{toml}: TOML says {t:?}, the API {j:?}");
                }
                (t, j) => panic!("{toml}: TOML gives {t:?}, the API {j:?}"),
            }
        }
        // A field neither knows is refused by both.
        assert!(crate::image::Recipe::parse("name = \"x\"\npackages = [\"git\"]\n").is_err());
        let body = serde_json::json!({"name": "x", "recipe": {"packages": ["git"]}});
        assert!(serde_json::from_value::<BuildRequest>(body).is_err());
    }
}
