//! The TOML recipe an image is built from.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ImageError;

/// Debian suites forkbox knows how to build, with the Python each ships.
pub const SUITES: &[(&str, &str)] = &[
    ("bullseye", "3.9"),
    ("bookworm", "3.11"),
    ("trixie", "3.13"),
];
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Image name: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// Debian suite: bullseye, bookworm or trixie.
    pub suite: String,
    /// Debian mirror used during the build.
    #[serde(default = "default_mirror")]
    pub mirror: String,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub npm: Vec<String>,
    /// Shell commands run in the image after the packages, in order, with network.
    #[serde(default)]
    pub run: Vec<String>,
    /// Environment for the build steps and for every command run in a sandbox of this image.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free space, in MiB, the root disk has beyond the installed files.
    #[serde(default = "default_free")]
    pub disk_free_mib: u64,
}

fn default_mirror() -> String {
    DEFAULT_MIRROR.to_string()
}
fn default_free() -> u64 {
    2048
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl Recipe {
    pub fn load(path: &Path) -> Result<(Recipe, String), ImageError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ImageError::RecipeUnreadable {
                path: path.to_path_buf(),
                source,
            })?;
        let recipe = Recipe::parse(&text).map_err(|message| ImageError::RecipeInvalid {
            path: path.to_path_buf(),
            message,
        })?;
        Ok((recipe, text))
    }

    pub fn parse(text: &str) -> Result<Recipe, String> {
        let r: Recipe = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
        r.validate()?;
        Ok(r)
    }

    fn validate(&self) -> Result<(), String> {
        if !valid_name(&self.name) {
            return Err(format!(
                "name {:?} must be 1-64 letters, digits, '-', '_' or '.' (not starting with '.')",
                self.name
            ));
        }
        if !SUITES.iter().any(|(s, _)| *s == self.suite) {
            let known: Vec<String> = SUITES
                .iter()
                .map(|(s, py)| format!("{s} (Python {py})"))
                .collect();
            return Err(format!(
                "suite {:?} is not supported; use one of: {}",
                self.suite,
                known.join(", ")
            ));
        }
        let pkg_ok = |p: &String| {
            !p.is_empty()
                && !p.starts_with('-')
                && !p.chars().any(|c| c.is_whitespace() || c == '\'')
        };
        for (list, what) in [(&self.apt, "apt"), (&self.pip, "pip"), (&self.npm, "npm")] {
            if let Some(bad) = list.iter().find(|p| !pkg_ok(p)) {
                return Err(format!("{what} package {bad:?} is not a package name"));
            }
        }
        for k in self.env.keys() {
            if k.is_empty()
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || k.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(format!("env name {k:?} is not a valid variable name"));
            }
        }
        if !self.mirror.starts_with("http://") && !self.mirror.starts_with("https://") {
            return Err(format!(
                "mirror {:?} must be an http:// or https:// URL",
                self.mirror
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn minimal_recipe_gets_defaults() {
        let r =
            Recipe::parse("name = \"py\"\nsuite = \"bookworm\"\napt = [\"python3\"]\n").unwrap();
        assert_eq!(r.mirror, DEFAULT_MIRROR);
        assert_eq!(r.disk_free_mib, 2048);
        assert!(r.pip.is_empty());
    }

    #[test]
    fn unknown_field_is_named() {
        let e =
            Recipe::parse("name = \"py\"\nsuite = \"bookworm\"\napt_packages = []\n").unwrap_err();
        assert!(e.contains("apt_packages"), "{e}");
    }

    #[test]
    fn unknown_suite_lists_supported_ones() {
        let e = Recipe::parse("name = \"py\"\nsuite = \"buster\"\n").unwrap_err();
        assert!(e.contains("bullseye") && e.contains("trixie"), "{e}");
    }

    #[test]
    fn bad_names_are_refused() {
        for n in ["", ".x", "a/b", "a b", "a@1"] {
            let text = format!("name = {n:?}\nsuite = \"bookworm\"\n");
            assert!(Recipe::parse(&text).is_err(), "{n:?} accepted");
        }
        assert!(
            Recipe::parse("name = \"x\"\nsuite = \"bookworm\"\napt = [\"--force\"]\n").is_err()
        );
        assert!(
            Recipe::parse("name = \"x\"\nsuite = \"bookworm\"\n[env]\n\"A B\" = \"1\"\n").is_err()
        );
    }
}
