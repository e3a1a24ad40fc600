//! The on-disk image store.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::recipe::{valid_name, Recipe};
use crate::error::ImageError;
use crate::paths::Paths;

/// Version of the layout of an image directory (see COMPATIBILITY.md).
pub const IMAGE_FORMAT: u32 = 1;

/// `NAME` or `NAME@N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub name: String,
    pub version: Option<u32>,
}

impl FromStr for ImageRef {
    type Err = ImageError;
    fn from_str(s: &str) -> Result<Self, ImageError> {
        let (name, version) = match s.split_once('@') {
            Some((n, v)) => {
                let v = v
                    .parse::<u32>()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| ImageError::BadReference(s.into()))?;
                (n, Some(v))
            }
            None => (s, None),
        };
        if !valid_name(name) {
            return Err(ImageError::BadReference(s.into()));
        }
        Ok(ImageRef {
            name: name.into(),
            version,
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.version {
            Some(v) => write!(f, "{}@{v}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// What `image.json` records about an image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ImageMeta {
    pub format: u32,
    pub name: String,
    pub version: u32,
    pub suite: String,
    /// Release of the guest kernel (in forkbox's kernels directory) the image boots.
    pub kernel: String,
    pub created_unix: u64,
    /// Bytes of the installed files.
    pub content_bytes: u64,
    /// Size of the root disk the guest sees.
    pub disk_bytes: u64,
    /// Environment every command in a sandbox of this image gets.
    pub env: BTreeMap<String, String>,
    pub recipe: Recipe,
    pub build_seconds: f64,
    /// The working directory commands start in (a registry image's `WorkingDir`); `/root`
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The user commands run as (a registry image's `User`: NAME, UID, NAME:GROUP or
    /// UID:GID); root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The registry image it was built on, pinned: `registry/repository@sha256:…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled: Option<String>,
    /// What a Dockerfile build was made of ([`super::inputs`]): a build of the same inputs
    /// asked to run only if something changed returns this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub meta: ImageMeta,
}

impl Image {
    pub fn reference(&self) -> String {
        format!("{}@{}", self.meta.name, self.meta.version)
    }
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs.ext4")
    }
}

#[derive(Debug, Clone)]
pub struct ImageStore {
    paths: Paths,
}

impl ImageStore {
    pub fn new(paths: &Paths) -> ImageStore {
        ImageStore {
            paths: paths.clone(),
        }
    }

    fn versions(&self, name: &str) -> Vec<u32> {
        let mut v: Vec<u32> = fs::read_dir(self.paths.images().join(name))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .collect();
        v.sort_unstable();
        v
    }

    /// The version the next build of `name` gets.
    pub fn next_version(&self, name: &str) -> u32 {
        self.versions(name).last().map_or(1, |v| v + 1)
    }

    fn load(&self, name: &str, version: u32) -> Result<Image, ImageError> {
        let dir = self.paths.images().join(name).join(version.to_string());
        let corrupt = |message: String| ImageError::Corrupt {
            name: format!("{name}@{version}"),
            message,
        };
        let text = fs::read_to_string(dir.join("image.json"))
            .map_err(|e| corrupt(format!("image.json: {e}")))?;
        let meta: ImageMeta =
            serde_json::from_str(&text).map_err(|e| corrupt(format!("image.json: {e}")))?;
        if meta.format != IMAGE_FORMAT {
            return Err(corrupt(format!(
                "layout version {} is not {IMAGE_FORMAT}",
                meta.format
            )));
        }
        let image = Image { dir, meta };
        if !image.rootfs().is_file() {
            return Err(corrupt("rootfs.ext4 is missing".into()));
        }
        Ok(image)
    }

    /// Every image, by name then version. Broken entries are skipped.
    pub fn list(&self) -> Vec<Image> {
        let mut names: Vec<String> = fs::read_dir(self.paths.images())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| valid_name(n))
            .collect();
        names.sort();
        names
            .iter()
            .flat_map(|n| {
                self.versions(n)
                    .into_iter()
                    .filter_map(move |v| self.load(n, v).ok())
            })
            .collect()
    }

    fn available(&self) -> String {
        let all: Vec<String> = self.list().iter().map(Image::reference).collect();
        if all.is_empty() {
            "no images are built yet; build one with `forkbox image build -f images/python-bookworm.toml`".into()
        } else {
            format!("images there are: {}", all.join(", "))
        }
    }

    pub fn resolve(&self, r: &ImageRef) -> Result<Image, ImageError> {
        let version = match r.version {
            Some(v) => v,
            None => match self.versions(&r.name).last() {
                Some(v) => *v,
                None => {
                    return Err(ImageError::NotFound {
                        reference: r.to_string(),
                        available: self.available(),
                    })
                }
            },
        };
        match self.load(&r.name, version) {
            Err(ImageError::Corrupt { .. })
                if !self
                    .paths
                    .images()
                    .join(&r.name)
                    .join(version.to_string())
                    .exists() =>
            {
                Err(ImageError::NotFound {
                    reference: r.to_string(),
                    available: self.available(),
                })
            }
            other => other,
        }
    }

    /// Removes `NAME@N` (an explicit version is required). `users` are the live sandboxes
    /// using each image reference.
    pub fn remove(&self, r: &ImageRef, users: &[(String, String)]) -> Result<Image, ImageError> {
        if r.version.is_none() {
            let versions: Vec<String> = self
                .list()
                .iter()
                .filter(|i| i.meta.name == r.name)
                .map(|i| i.reference())
                .collect();
            return Err(ImageError::VersionNeeded {
                name: r.name.clone(),
                versions: match versions.is_empty() {
                    true => "there is none".into(),
                    false => format!("there are {}", versions.join(", ")),
                },
            });
        }
        let image = match self.resolve(r) {
            Ok(i) => i,
            Err(ImageError::Corrupt { .. }) => {
                let dir = self
                    .paths
                    .images()
                    .join(&r.name)
                    .join(r.version.unwrap_or(0).to_string());
                crate::tree::remove_tree(&dir)
                    .map_err(|e| ImageError::io(format!("remove {}", dir.display()), e.into()))?;
                return Err(ImageError::NotFound {
                    reference: r.to_string(),
                    available: "a broken copy was removed".into(),
                });
            }
            Err(e) => return Err(e),
        };
        let reference = image.reference();
        let using: Vec<&str> = users
            .iter()
            .filter(|(_, img)| *img == reference)
            .map(|(id, _)| id.as_str())
            .collect();
        if !using.is_empty() {
            return Err(ImageError::InUse {
                reference,
                sandboxes: using.join(", "),
            });
        }
        // Rename first so a concurrent sandbox start never sees a half-deleted image.
        let trash = self.paths.images().join(&r.name).join(format!(
            ".rm-{}-{}",
            image.meta.version,
            std::process::id()
        ));
        fs::rename(&image.dir, &trash)
            .map_err(|e| ImageError::io(format!("remove {}", image.dir.display()), e))?;
        crate::tree::remove_tree(&trash)
            .map_err(|e| ImageError::io(format!("remove {}", trash.display()), e.into()))?;
        // Its templates (`NAME-N-c…`) boot nothing else and their disks stand on its rootfs.
        let prefix = format!("{}-{}-c", image.meta.name, image.meta.version);
        for e in fs::read_dir(self.paths.templates())
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                crate::tree::discard_tree(&e.path());
            }
        }
        Ok(image)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(
            "py".parse::<ImageRef>().unwrap(),
            ImageRef {
                name: "py".into(),
                version: None
            }
        );
        assert_eq!(
            "py@3".parse::<ImageRef>().unwrap(),
            ImageRef {
                name: "py".into(),
                version: Some(3)
            }
        );
        for bad in ["py@", "py@0", "py@x", "@1", "a/b", ""] {
            assert!(bad.parse::<ImageRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_image_lists_the_ones_there_are() {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let store = ImageStore::new(&paths);
        let e = store
            .resolve(&"nope".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no images are built yet"), "{e}");
        let dir = paths.images().join("py/1");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("rootfs.ext4"), b"").unwrap();
        let meta = ImageMeta {
            format: IMAGE_FORMAT,
            name: "py".into(),
            version: 1,
            suite: "bookworm".into(),
            kernel: "k".into(),
            created_unix: 0,
            content_bytes: 0,
            disk_bytes: 0,
            env: Default::default(),
            recipe: Recipe::parse("name = \"py\"\nsuite = \"bookworm\"\n").unwrap(),
            build_seconds: 0.0,
            workdir: None,
            user: None,
            pulled: None,
            inputs: None,
        };
        fs::write(
            dir.join("image.json"),
            serde_json::to_string(&meta).unwrap(),
        )
        .unwrap();
        let e = store
            .resolve(&"nope".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("py@1"), "{e}");
        assert_eq!(
            store.resolve(&"py".parse().unwrap()).unwrap().reference(),
            "py@1"
        );
        assert_eq!(store.next_version("py"), 2);
        let e = store
            .remove(&"py@1".parse().unwrap(), &[("sb1".into(), "py@1".into())])
            .unwrap_err();
        assert!(e.to_string().contains("sb1"), "{e}");
        store.remove(&"py@1".parse().unwrap(), &[]).unwrap();
        assert!(store.list().is_empty());
    }
}
