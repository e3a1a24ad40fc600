//! Plans files: each plan has a name, its instruction text and its porter.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub name: String,
    #[serde(default)]
    pub instructions: String,
    pub porter: Porter,
}

/// Who carries out a plan: exactly one of `command`, `host` or `llm`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Porter {
    /// A command run inside the fork, in the code's directory (`/work`), with the plans
    /// directory at `/plan` and the instruction text in `$FORKBOX_PLAN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// A command run on the host (`sh -c`, in the plans directory) that drives the fork from
    /// outside through forkbox's API: `$FORKBOX_SANDBOX` is the fork, `$FORKBOX_API` the API's
    /// address (`unix:/path`, which `forkbox sandbox ...` uses), `$FORKBOX_PLAN` the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// forkbox's own LLM porter: a chat-completions model given exec/read/write/diff tools on
    /// the fork, iterating until no test is lost or its step budget runs out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmPorter>,
    /// Longest the porter may run.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlmPorter {
    /// The model; the endpoint's default model (`FORKBOX_LLM_MODEL`) when left out.
    #[serde(default)]
    pub model: Option<String>,
    /// Most model calls.
    #[serde(default = "default_steps")]
    pub max_steps: u32,
    /// Longest one model call may take.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_secs: u64,
}

/// A porter, resolved.
#[derive(Debug, Clone, Copy)]
pub enum PorterKind<'a> {
    Guest(&'a str),
    Host(&'a str),
    Llm(&'a LlmPorter),
}

impl Porter {
    pub fn kind(&self) -> Option<PorterKind<'_>> {
        match (&self.command, &self.host, &self.llm) {
            (Some(c), None, None) => Some(PorterKind::Guest(c)),
            (None, Some(h), None) => Some(PorterKind::Host(h)),
            (None, None, Some(l)) => Some(PorterKind::Llm(l)),
            _ => None,
        }
    }

    /// One line saying what the porter is, for reports.
    pub fn describe(&self) -> String {
        match self.kind() {
            Some(PorterKind::Guest(c)) => c.to_string(),
            Some(PorterKind::Host(h)) => format!("host: {h}"),
            Some(PorterKind::Llm(l)) => format!(
                "llm: {} (at most {} steps)",
                l.model.as_deref().unwrap_or("the endpoint's default model"),
                l.max_steps
            ),
            None => "none".into(),
        }
    }
}

fn default_steps() -> u32 {
    30
}

fn default_request_timeout() -> u64 {
    180
}

fn default_timeout() -> u64 {
    1800
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlansFile {
    plan: Vec<Plan>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlansError {
    #[error("cannot read the plans file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the plans file {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// At most this many plans: one fork each, from one snapshot.
pub const MAX_PLANS: usize = 10;

pub fn load(path: &Path) -> Result<Vec<Plan>, PlansError> {
    let text = std::fs::read_to_string(path).map_err(|source| PlansError::Read {
        path: path.into(),
        source,
    })?;
    let invalid = |message: String| PlansError::Invalid {
        path: path.into(),
        message,
    };
    let file: PlansFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if file.plan.is_empty() || file.plan.len() > MAX_PLANS {
        return Err(invalid(format!(
            "it has {} plans; give 1 to {MAX_PLANS} `[[plan]]` tables",
            file.plan.len()
        )));
    }
    let mut names = std::collections::BTreeSet::new();
    for p in &file.plan {
        let ok = !p.name.is_empty()
            && p.name.len() <= 40
            && p.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            return Err(invalid(format!(
                "plan name {:?}: use 1-40 of a-z, 0-9, '-', '_', '.'",
                p.name
            )));
        }
        if !names.insert(p.name.clone()) {
            return Err(invalid(format!("two plans are named {:?}", p.name)));
        }
        match p.porter.kind() {
            None => {
                return Err(invalid(format!(
                    "plan {:?}: give its porter exactly one of `command` (run in the fork), `host` (run on the host) or `llm`",
                    p.name
                )))
            }
            Some(PorterKind::Guest(c) | PorterKind::Host(c)) if c.trim().is_empty() => {
                return Err(invalid(format!(
                    "plan {:?} has an empty porter command",
                    p.name
                )))
            }
            Some(PorterKind::Llm(l)) if l.max_steps == 0 || l.request_timeout_secs == 0 => {
                return Err(invalid(format!(
                    "plan {:?}: max_steps and request_timeout_secs must be at least 1",
                    p.name
                )))
            }
            _ => {}
        }
    }
    Ok(file.plan)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load_str(s: &str) -> Result<Vec<Plan>, PlansError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plans.toml");
        std::fs::write(&p, s).unwrap();
        load(&p)
    }

    #[test]
    fn the_demo_plans_load() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plans/plans.toml");
        let plans = load(&p).unwrap();
        assert_eq!(
            plans.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["minimal", "modernize", "wrong"]
        );
    }

    #[test]
    fn bad_plans_files_say_what_is_wrong() {
        let e = load_str(
            "[[plan]]\nname='a'\nporter={command='x'}\n[[plan]]\nname='a'\nporter={command='y'}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("two plans are named"), "{e}");
        let e = load_str("[[plan]]\nname='a b'\nporter={command='x'}\n").unwrap_err();
        assert!(e.to_string().contains("plan name"), "{e}");
        let e = load_str("[[plan]]\nname='a'\nporter={command='x'}\ncolour=1\n").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        assert!(load_str("").is_err());
        let e = load_str("[[plan]]\nname='a'\nporter={command='x', host='y'}\n").unwrap_err();
        assert!(e.to_string().contains("exactly one"), "{e}");
        let e = load_str("[[plan]]\nname='a'\nporter={}\n").unwrap_err();
        assert!(e.to_string().contains("exactly one"), "{e}");
        let e = load_str("[[plan]]\nname='a'\nporter={llm={max_steps=0}}\n").unwrap_err();
        assert!(e.to_string().contains("max_steps"), "{e}");
    }

    #[test]
    fn the_porters_example_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plans/porters.toml");
        let kinds: Vec<String> = load(&p)
            .unwrap()
            .iter()
            .map(|p| {
                format!("{:?}", p.porter.kind().unwrap())
                    .split('(')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(kinds, ["Guest", "Host", "Llm"]);
    }

    #[test]
    fn the_three_porters_load() {
        let plans = load_str(
            "[[plan]]\nname='a'\nporter={command='x'}\n\
             [[plan]]\nname='b'\nporter={host='forkbox sandbox exec $FORKBOX_SANDBOX -- true'}\n\
             [[plan]]\nname='c'\nporter={llm={model='m', max_steps=5}}\n",
        )
        .unwrap();
        assert!(matches!(
            plans[0].porter.kind(),
            Some(PorterKind::Guest("x"))
        ));
        assert!(matches!(plans[1].porter.kind(), Some(PorterKind::Host(_))));
        match plans[2].porter.kind() {
            Some(PorterKind::Llm(l)) => {
                assert_eq!(l.model.as_deref(), Some("m"));
                assert_eq!(l.max_steps, 5);
                assert_eq!(l.request_timeout_secs, 180);
            }
            k => panic!("{k:?}"),
        }
    }
}
