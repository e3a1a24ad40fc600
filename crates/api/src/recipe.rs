//! The recipe shape the API and the SDKs take.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The recipe shape the API and the SDKs take: the image's name is given beside it.
/// `base` is a Debian suite (bullseye, bookworm, trixie), another forkbox image (NAME or
/// NAME@N) or a registry's image (`python:3.8-slim`, `HOST:PORT/PATH:TAG`, `…@sha256:…`);
/// without it, Debian bookworm.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    pub base: Option<String>,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub npm: Vec<String>,
    #[serde(default)]
    pub run: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub disk_free_mib: Option<u64>,
    pub mirror: Option<String>,
}
