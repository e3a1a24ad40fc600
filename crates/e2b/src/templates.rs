//! Templates forkbox carries a recipe for (`base`, E2B's default, and forkbox's own images):
//! built through the daemon's API the first time a create asks for one, from the same recipe
//! text the CLI builds on first use.

use std::collections::BTreeMap;

use forkbox_api::{BuildProgress, BuildRequest, Seed};
use serde::Deserialize;

use crate::errors::Failure;

/// The recipe file's shape (`images/*.toml`), as far as a seed carries it.
#[derive(Debug, Deserialize)]
struct RecipeText {
    #[serde(default)]
    suite: String,
    base: Option<String>,
    #[serde(default)]
    apt: Vec<String>,
    #[serde(default)]
    pip: Vec<String>,
    #[serde(default)]
    npm: Vec<String>,
    #[serde(default)]
    run: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    disk_free_mib: Option<u64>,
    mirror: Option<String>,
}

/// The build request forkbox's carried recipe of `name` is, if it carries one.
pub fn seed(name: &str) -> Option<Seed> {
    let text = forkbox_api::carried::recipe(name)?;
    let r: RecipeText = toml::from_str(text).ok()?;
    let base = r.base.or((!r.suite.is_empty()).then_some(r.suite));
    Some(Seed {
        base,
        apt: r.apt,
        pip: r.pip,
        npm: r.npm,
        run: r.run,
        env: r.env,
        disk_free_mib: r.disk_free_mib,
        mirror: r.mirror,
    })
}

/// Builds image `name` from `seed` through the daemon, its steps in the log.
pub async fn build(client: &forkbox_client::Client, name: &str, seed: Seed) -> Result<(), Failure> {
    let req = BuildRequest {
        name: name.to_string(),
        recipe: seed,
        if_changed: true,
    };
    let mut events = client.build_image(&req).await?;
    while let Some(ev) = events.next().await? {
        match ev {
            BuildProgress::Step { n, total, what } => {
                tracing::info!("e2b: template {name}: [{n}/{total}] {what}")
            }
            BuildProgress::Done { .. } | BuildProgress::UpToDate { .. } => return Ok(()),
            BuildProgress::Error { message, .. } => {
                return Err(Failure::of(
                    forkbox_api::Code::BuildFailed,
                    format!("template {name} could not be built: {message}"),
                ))
            }
            _ => {}
        }
    }
    Err(Failure::of(
        forkbox_api::Code::BuildFailed,
        format!("template {name}: the build ended without saying it was done"),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn every_carried_recipe_is_a_seed() {
        for (name, _) in forkbox_api::carried::RECIPES {
            let s = super::seed(name).unwrap();
            assert!(s.base.is_some(), "{name}");
        }
        let base = super::seed("base").unwrap();
        assert!(base.apt.iter().any(|p| p == "python3") && base.apt.iter().any(|p| p == "nodejs"));
        assert!(super::seed("nope").is_none());
    }
}
