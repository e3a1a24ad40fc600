//! The image recipes that ship inside forkbox (the repository's `images/`), so that its images
//! build themselves on first use wherever the binary runs: by the CLI in its own home, by a
//! cluster on the node a create is placed on, and by E2B's front end for a template it is
//! asked for (`base`). Recipe texts in the TOML shape of `forkbox image build`.

/// (name, recipe text) of every recipe forkbox carries.
pub const RECIPES: &[(&str, &str)] = &[
    (
        "python-bookworm",
        include_str!("../../../images/python-bookworm.toml"),
    ),
    (
        "python-bullseye",
        include_str!("../../../images/python-bullseye.toml"),
    ),
    (
        "python-trixie",
        include_str!("../../../images/python-trixie.toml"),
    ),
    (
        "node-bookworm",
        include_str!("../../../images/node-bookworm.toml"),
    ),
    (
        "node-trixie",
        include_str!("../../../images/node-trixie.toml"),
    ),
    (
        "go-bookworm",
        include_str!("../../../images/go-bookworm.toml"),
    ),
    ("go-trixie", include_str!("../../../images/go-trixie.toml")),
    (
        "rust-bookworm",
        include_str!("../../../images/rust-bookworm.toml"),
    ),
    (
        "rust-trixie",
        include_str!("../../../images/rust-trixie.toml"),
    ),
    ("java-17", include_str!("../../../images/java-17.toml")),
    ("java-21", include_str!("../../../images/java-21.toml")),
    ("base", include_str!("../../../images/base.toml")),
    (
        "code-interpreter",
        include_str!("../../../images/code-interpreter.toml"),
    ),
];

/// The text of the recipe forkbox carries for image `name`, if it carries one.
pub fn recipe(name: &str) -> Option<&'static str> {
    RECIPES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}
