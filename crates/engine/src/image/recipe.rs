//! The TOML recipe an image is built from.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ImageError;

pub use forkbox_api::Seed;

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
    /// Debian suite: bullseye, bookworm or trixie. Taken from the base image when `base` is set.
    #[serde(default)]
    pub suite: String,
    /// What to build on instead of a fresh Debian root: another forkbox image (NAME or NAME@N;
    /// the build pins it to NAME@N) or an image in an OCI registry (`python:3.8-slim`,
    /// `registry.example:5000/team/node:18`, `…@sha256:…`; the build pins it to its digest).
    /// A Debian suite's name here is that suite, as in the API's seeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
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

/// What a recipe builds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A fresh Debian root of this suite.
    Debian(String),
    /// Another forkbox image.
    Image(super::ImageRef),
    /// An image in an OCI registry.
    Registry(oci_client::Reference),
}

impl Base {
    /// A recipe's `base`: a forkbox image when it is NAME or NAME@N, otherwise a registry
    /// reference (so `python` is a forkbox image and `python:latest` Docker Hub's).
    pub fn parse(base: &str) -> Result<Base, String> {
        if let Ok(r) = base.parse::<super::ImageRef>() {
            return Ok(Base::Image(r));
        }
        super::oci::parse_reference(base)
            .map(Base::Registry)
            .map_err(|_| {
                let suites: Vec<&str> = SUITES.iter().map(|(s, _)| *s).collect();
                format!(
                    "base {base:?} is neither a Debian suite ({}), a forkbox image (NAME or NAME@N) nor a registry image (NAME:TAG, HOST[:PORT]/PATH:TAG or …@sha256:DIGEST)",
                    suites.join(", ")
                )
            })
    }
}

/// The suite a recipe without a base uses.
pub const DEFAULT_SUITE: &str = "bookworm";

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
    /// What the recipe builds on (a checked recipe's base always parses).
    pub fn base(&self) -> Result<Base, String> {
        match &self.base {
            Some(b) => Base::parse(b),
            None => Ok(Base::Debian(self.suite.clone())),
        }
    }

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

    /// The recipe a [`Seed`] describes, checked.
    pub fn from_seed(name: &str, seed: Seed) -> Result<Recipe, String> {
        let mut r = Recipe {
            name: name.to_string(),
            suite: String::new(),
            base: seed.base,
            mirror: seed.mirror.unwrap_or_else(default_mirror),
            apt: seed.apt,
            pip: seed.pip,
            npm: seed.npm,
            run: seed.run,
            env: seed.env,
            disk_free_mib: seed.disk_free_mib.unwrap_or_else(default_free),
        };
        r.settle_base()?;
        r.validate()?;
        Ok(r)
    }

    /// One meaning for `base`, whatever the front end (TOML, an API dict, the SDKs): a base
    /// that names a Debian suite is that suite (`base = "bookworm"` is `suite = "bookworm"`;
    /// an image of that name is `bookworm@N`); anything else is an image. Neither base nor
    /// suite: Debian bookworm, as an API dict without `base` is.
    fn settle_base(&mut self) -> Result<(), String> {
        if self.base.is_none() && self.suite.is_empty() {
            self.suite = DEFAULT_SUITE.to_string();
        }
        let Some(base) = self.base.take_if(|b| SUITES.iter().any(|(s, _)| s == b)) else {
            return Ok(());
        };
        if !self.suite.is_empty() && self.suite != base {
            return Err(format!(
                "give `suite` or `base`, not both (base {base:?} is a Debian suite, and suite is {:?})",
                self.suite
            ));
        }
        self.suite = base;
        Ok(())
    }

    /// The recipe as TOML, as it is stored beside an image built from it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: &str) -> Result<Recipe, String> {
        let mut r: Recipe =
            toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
        r.settle_base()?;
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
        if let Some(base) = &self.base {
            Base::parse(base)?;
            if !self.suite.is_empty() {
                return Err(
                    "give `suite` or `base`, not both (an image's suite is its own)".into(),
                );
            }
        } else if !SUITES.iter().any(|(s, _)| *s == self.suite) {
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

    /// One table of bases, read through the TOML recipe and the API's seed: the same
    /// recipe either way (`base = "bookworm"` in TOML was read as an image named bookworm).
    #[test]
    fn a_base_means_the_same_in_toml_and_in_a_seed() {
        for (base, suite, image) in [
            ("bookworm", "bookworm", None),
            ("trixie", "trixie", None),
            ("bullseye", "bullseye", None),
            ("python-bookworm", "", Some("python-bookworm")),
            ("bookworm@2", "", Some("bookworm@2")),
            ("python:3.8-slim", "", Some("python:3.8-slim")),
        ] {
            let toml = Recipe::parse(&format!("name = \"x\"\nbase = \"{base}\"\n")).unwrap();
            let seed = Recipe::from_seed(
                "x",
                Seed {
                    base: Some(base.into()),
                    ..Seed::default()
                },
            )
            .unwrap();
            assert_eq!(toml, seed, "{base}");
            assert_eq!(
                (toml.suite.as_str(), toml.base.as_deref()),
                (suite, image),
                "{base}"
            );
        }
        let e =
            Recipe::parse("name = \"x\"\nbase = \"trixie\"\nsuite = \"bookworm\"\n").unwrap_err();
        assert!(e.contains("not both"), "{e}");
        assert!(Recipe::parse("name = \"x\"\nbase = \"bookworm\"\nsuite = \"bookworm\"\n").is_ok());
    }

    #[test]
    fn seeds_take_a_suite_an_image_or_the_default() {
        let r = Recipe::from_seed("x", Seed::default()).unwrap();
        assert_eq!((r.suite.as_str(), r.base), (DEFAULT_SUITE, None));
        let r = Recipe::from_seed(
            "x",
            Seed {
                base: Some("trixie".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.suite, "trixie");
        let r = Recipe::from_seed(
            "x",
            Seed {
                base: Some("legacy@2".into()),
                pip: vec!["six".into()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            (r.suite.as_str(), r.base.as_deref()),
            ("", Some("legacy@2"))
        );
        let back = Recipe::parse(&r.to_toml()).unwrap();
        assert_eq!(back, r);
        let r = Recipe::from_seed(
            "x",
            Seed {
                base: Some("python:3.8-slim".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(matches!(r.base(), Ok(Base::Registry(_))), "{r:?}");
        let e = Recipe::from_seed(
            "x",
            Seed {
                base: Some("not an image".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("neither a Debian suite"), "{e}");
        let e: Result<Seed, _> = serde_json::from_str(r#"{"bsae": "bookworm"}"#);
        assert!(e.unwrap_err().to_string().contains("bsae"));
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
