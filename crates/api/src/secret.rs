//! Secrets a sandbox's requests carry without its guest ever holding them: the guest sees a
//! placeholder, and the host puts the value in place of it in requests to the secret's hosts.

use serde::{Deserialize, Serialize};

/// A secret given to a sandbox: its value goes only to the daemon (never returned, listed,
/// logged or stored), and only into requests to `hosts`.
#[derive(Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The environment variable the guest's commands find the placeholder in (`NPM_TOKEN`).
    pub name: String,
    /// Where the value may go: `registry.example.com`, `*.example.com` (its subdomains),
    /// `host:port`, an IP address; the same forms as a network allow list, never `*`.
    pub hosts: Vec<String>,
    /// The value; write-only.
    pub value: String,
    /// A header the host sets to the value itself on every HTTPS request to the hosts,
    /// replacing any the guest sent (`Authorization`: the value is then the whole
    /// `Bearer …`), instead of replacing a placeholder the guest sends; the guest then gets
    /// no placeholder at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("value", &"<hidden>")
            .field("header", &self.header)
            .finish()
    }
}

/// A sandbox's secret as its view shows it: the name and hosts, never the value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecretView {
    pub name: String,
    pub hosts: Vec<String>,
    /// The header it sets, if it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

/// Longest a secret's value may be.
pub const MAX_SECRET_LEN: usize = 16 * 1024;
/// Most secrets one sandbox may have.
pub const MAX_SECRETS: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("secret {0:?}: a name is an environment variable's: letters, digits and _, not starting with a digit")]
    BadName(String),
    #[error("secret {0:?} is given twice")]
    Twice(String),
    #[error("secret {0:?} has no hosts: name where it may go (NAME@HOST[,HOST...])")]
    NoHosts(String),
    #[error("secret {name:?}: host {host:?} {why}")]
    BadHost {
        name: String,
        host: String,
        why: &'static str,
    },
    #[error("secret {0:?} has an empty value")]
    Empty(String),
    #[error("secret {0:?}: a value longer than 16 KiB")]
    TooLong(String),
    #[error("secret {0:?}: a value with a line break or control character cannot go in a header")]
    BadValue(String),
    #[error("at most {MAX_SECRETS} secrets per sandbox")]
    TooMany,
    #[error("secret {0:?}: its header is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~), or is one the proxy owns (Host, Content-Length, Transfer-Encoding, Connection)")]
    BadHeader(String),
}

/// Checks secrets as given to a create or a fork.
pub fn validate_secrets(secrets: &[SecretSpec]) -> Result<(), SecretError> {
    if secrets.len() > MAX_SECRETS {
        return Err(SecretError::TooMany);
    }
    let mut seen = std::collections::HashSet::new();
    for s in secrets {
        let n = &s.name;
        let name_ok = !n.is_empty()
            && n.len() <= 128
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(SecretError::BadName(n.clone()));
        }
        if !seen.insert(n.clone()) {
            return Err(SecretError::Twice(n.clone()));
        }
        if s.hosts.is_empty() {
            return Err(SecretError::NoHosts(n.clone()));
        }
        for h in &s.hosts {
            let bad = |why| SecretError::BadHost {
                name: n.clone(),
                host: h.clone(),
                why,
            };
            let e = crate::network::parse_entry(h).ok_or(bad(
                "is not a host: use a name (api.example.com), *.domain, host:port or an IP address",
            ))?;
            if e.subdomains && !e.host.contains('.') {
                return Err(bad(
                    "would match a whole top-level domain: name the domain (*.example.com)",
                ));
            }
        }
        if let Some(h) = &s.header {
            let token = !h.is_empty()
                && h.len() <= 128
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
            let owned = ["host", "content-length", "transfer-encoding", "connection"]
                .contains(&h.to_ascii_lowercase().as_str());
            if !token || owned {
                return Err(SecretError::BadHeader(n.clone()));
            }
        }
        if s.value.is_empty() {
            return Err(SecretError::Empty(n.clone()));
        }
        if s.value.len() > MAX_SECRET_LEN {
            return Err(SecretError::TooLong(n.clone()));
        }
        if s.value.chars().any(|c| c.is_control()) {
            return Err(SecretError::BadValue(n.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, hosts: &[&str], value: &str) -> SecretSpec {
        SecretSpec {
            name: name.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            value: value.into(),
            header: None,
        }
    }

    #[test]
    fn bad_secrets_say_what_is_wrong() {
        let ok = spec("NPM_TOKEN", &["registry.example.com", "*.example.org"], "v");
        assert_eq!(validate_secrets(std::slice::from_ref(&ok)), Ok(()));
        let cases = [
            (spec("1X", &["a.com"], "v"), "environment variable"),
            (spec("A-B", &["a.com"], "v"), "environment variable"),
            (spec("T", &[], "v"), "no hosts"),
            (spec("T", &["*"], "v"), "is not a host"),
            (spec("T", &["*.com"], "v"), "top-level"),
            (spec("T", &["a.com"], ""), "empty"),
            (spec("T", &["a.com"], "a\r\nX-Evil: 1"), "line break"),
            (
                SecretSpec {
                    header: Some("Bad Header".into()),
                    ..spec("T", &["a.com"], "v")
                },
                "HTTP header name",
            ),
            (
                SecretSpec {
                    header: Some("Host".into()),
                    ..spec("T", &["a.com"], "v")
                },
                "the proxy owns",
            ),
        ];
        let header = SecretSpec {
            header: Some("Authorization".into()),
            ..ok.clone()
        };
        assert_eq!(validate_secrets(&[header]), Ok(()));
        for (s, says) in cases {
            let e = validate_secrets(std::slice::from_ref(&s))
                .expect_err(&s.name)
                .to_string();
            assert!(e.contains(says), "{e}");
        }
        let e = validate_secrets(&[ok.clone(), ok]).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn a_value_never_shows_in_debug_output() {
        let s = spec("T", &["a.com"], "s3cr3t-value");
        assert!(!format!("{s:?}").contains("s3cr3t"));
    }
}
