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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Porter {
    /// A command run inside the fork, in the code's directory (`/work`), with the plans
    /// directory at `/plan` and the instruction text in `$FORKBOX_PLAN`.
    pub command: String,
    /// Longest the porter may run.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
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
        if p.porter.command.trim().is_empty() {
            return Err(invalid(format!(
                "plan {:?} has an empty porter command",
                p.name
            )));
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
    }
}
