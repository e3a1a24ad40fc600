//! Volumes: disks of their own that outlive the sandboxes that mount them.

use serde::{Deserialize, Serialize};

use crate::Invalid;

/// A volume's size when none is asked for: 1 GiB.
pub const DEFAULT_VOLUME_MIB: u64 = 1024;
/// Smallest volume (its file system's journal and tables need room): 16 MiB.
pub const MIN_VOLUME_MIB: u64 = 16;
/// Largest volume: 16 TiB.
pub const MAX_VOLUME_MIB: u64 = 16 << 20;
/// Most volumes one sandbox mounts.
pub const MAX_VOLUMES_PER_SANDBOX: usize = 4;

/// `POST /v1/volumes`: a new volume.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreateRequest {
    /// 1 to 63 of `a-z 0-9 - _ .`, starting with a letter or digit.
    pub name: String,
    /// Its size: `512m`, `10g`, `1t` or a number of bytes (default 1 GiB). Its space on the
    /// host's disk is taken at once, so that a write the guest was told succeeded never meets a
    /// full host disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// In a cluster: the node it lives on (default: the node that takes the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A volume and who has it mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeView {
    pub name: String,
    pub size_bytes: u64,
    pub created_unix: u64,
    /// The sandboxes that have it mounted (sleeping ones too): one read-write, or any number
    /// read-only.
    #[serde(default)]
    pub holders: Vec<VolumeHolder>,
    /// In a cluster: the node it lives on (sandboxes that mount it are placed there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeHolder {
    pub sandbox: String,
    pub read_only: bool,
}

/// A volume a sandbox mounts: `NAME:/path` (read-write) or `NAME:/path:ro`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    pub name: String,
    /// Where it appears in the guest: an absolute path, not `/` nor one of the system's own
    /// directories (`/proc`, `/sys`, `/dev`, `/run`, `/etc`, `/usr`, …).
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// A volume mounted in a sandbox: what it asked for, and the disk slot it is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MountedVolume {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    /// Which of the VM's volume slots carries it (0-based).
    pub slot: u32,
}

/// Whether `name` can name a volume.
pub fn valid_volume_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.')
        })
}

/// Parses a size: a number of bytes, or a number with `k`, `m`, `g` or `t` (powers of 1024;
/// `10g`, `10G`, `10GiB`, `1.5g`). Refused in words when it is not one.
pub fn parse_size(s: &str) -> Result<u64, Invalid> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        Some('t') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n > 0.0)
        .ok_or_else(|| {
            Invalid(format!(
                "{s:?} is not a size: give a number with k, m, g or t (e.g. 512m, 10g)"
            ))
        })?;
    Ok((n * (1u64 << shift) as f64) as u64)
}

impl VolumeCreateRequest {
    /// The name and size (bytes, a whole number of MiB), checked.
    pub fn checked(&self) -> Result<(String, u64), Invalid> {
        if !valid_volume_name(&self.name) {
            return Err(Invalid(format!(
                "{:?} is not a volume name: 1 to 63 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit",
                self.name
            )));
        }
        let bytes = match &self.size {
            Some(s) => parse_size(s)?,
            None => DEFAULT_VOLUME_MIB << 20,
        };
        let mib = bytes.div_ceil(1 << 20);
        if !(MIN_VOLUME_MIB..=MAX_VOLUME_MIB).contains(&mib) {
            return Err(Invalid(format!(
                "a volume is {MIN_VOLUME_MIB} MiB to 16 TiB, not {} MiB",
                mib
            )));
        }
        Ok((self.name.clone(), mib << 20))
    }
}

/// Guest directories a volume may not cover.
const RESERVED: &[&str] = &[
    "/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/bin", "/sbin", "/lib", "/boot",
];

impl VolumeMount {
    /// Checked: a volume name, and an absolute, normal guest path off the system's own
    /// directories.
    pub fn checked(&self) -> Result<(), Invalid> {
        if !valid_volume_name(&self.name) {
            return Err(Invalid(format!("{:?} is not a volume name", self.name)));
        }
        let p = &self.path;
        let normal = p.starts_with('/')
            && p.len() > 1
            && !p.ends_with('/')
            && p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !normal || p.len() > 1024 {
            return Err(Invalid(format!(
                "volume {}: {p:?} is not a place to mount it: give an absolute path such as /data",
                self.name
            )));
        }
        if RESERVED
            .iter()
            .any(|r| p == r || p.strip_prefix(r).is_some_and(|rest| rest.starts_with('/')))
        {
            return Err(Invalid(format!(
                "volume {}: {p} is the system's own; mount it elsewhere (e.g. /data, /workspace, /mnt/{})",
                self.name, self.name
            )));
        }
        Ok(())
    }

    /// Checks a sandbox's mounts together: each alone, at most [`MAX_VOLUMES_PER_SANDBOX`],
    /// no volume twice, no path twice or inside another.
    pub fn check_all(mounts: &[VolumeMount]) -> Result<(), Invalid> {
        if mounts.len() > MAX_VOLUMES_PER_SANDBOX {
            return Err(Invalid(format!(
                "a sandbox mounts at most {MAX_VOLUMES_PER_SANDBOX} volumes, not {}",
                mounts.len()
            )));
        }
        for (i, m) in mounts.iter().enumerate() {
            m.checked()?;
            for o in &mounts[..i] {
                if o.name == m.name {
                    return Err(Invalid(format!("volume {} is asked for twice", m.name)));
                }
                let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
                if inside(&m.path, &o.path) || inside(&o.path, &m.path) {
                    return Err(Invalid(format!(
                        "volumes {} and {} overlap ({} and {})",
                        o.name, m.name, o.path, m.path
                    )));
                }
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for VolumeMount {
    type Err = Invalid;
    /// `NAME:/path`, `NAME:/path:ro` or `NAME:/path:rw`.
    fn from_str(s: &str) -> Result<VolumeMount, Invalid> {
        let bad = || {
            Invalid(format!(
                "{s:?} is not a volume mount: give NAME:/path or NAME:/path:ro"
            ))
        };
        let (name, rest) = s.split_once(':').ok_or_else(bad)?;
        let (path, read_only) = match rest.rsplit_once(':') {
            Some((p, "ro")) => (p, true),
            Some((p, "rw")) => (p, false),
            Some(_) => return Err(bad()),
            None => (rest, false),
        };
        let m = VolumeMount {
            name: name.to_string(),
            path: path.to_string(),
            read_only,
        };
        m.checked()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("10g").ok(), Some(10 << 30));
        assert_eq!(parse_size("10GiB").ok(), Some(10 << 30));
        assert_eq!(parse_size("512M").ok(), Some(512 << 20));
        assert_eq!(parse_size("1.5g").ok(), Some(3 << 29));
        assert_eq!(parse_size("4096").ok(), Some(4096));
        for bad in ["", "g", "-1g", "ten", "10x"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let small = VolumeCreateRequest {
            name: "cache".into(),
            size: Some("1m".into()),
            node: None,
        };
        assert!(small.checked().is_err());
    }

    #[test]
    fn mounts_parse_and_bad_ones_say_why() {
        let m: VolumeMount = "cache:/data:ro".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (m.name.as_str(), m.path.as_str(), m.read_only),
            ("cache", "/data", true)
        );
        let m: VolumeMount = "cache:/data".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(!m.read_only);
        for bad in [
            "cache",
            "cache:data",
            "cache:/",
            "cache:/proc/x",
            "Cache:/d",
            "c:/a/../b",
            "c:/d:rx",
        ] {
            assert!(bad.parse::<VolumeMount>().is_err(), "{bad}");
        }
        let two = |a: &str, b: &str| {
            VolumeMount::check_all(&[
                a.parse().unwrap_or_else(|e| panic!("{e}")),
                b.parse().unwrap_or_else(|e| panic!("{e}")),
            ])
        };
        assert!(two("a:/data", "b:/data/x").is_err());
        assert!(two("a:/data", "a:/other").is_err());
        assert!(two("a:/data", "b:/database").is_ok());
    }
}
