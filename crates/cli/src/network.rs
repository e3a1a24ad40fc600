//! The network flags of `create`, `run` and `fork` (a policy, secrets), and `forkbox sandbox
//! network`, which replaces a running sandbox's policy.

use std::process::ExitCode;

use forkbox_client::Client;

use crate::daemon::show;

/// The policy alone: what `sandbox network` takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PolicyArgs {
    /// Outbound access to the internet through forkbox's host-side proxy (never the host
    /// itself, loopback, link-local or metadata addresses).
    #[arg(long)]
    pub internet: bool,
    /// Allow only this host (repeatable): pypi.org, *.pythonhosted.org, host:port, an IP, a
    /// network (10.0.0.0/24). With --internet and --deny: an exception to the deny list.
    #[arg(long = "allow", value_name = "HOST", value_parser = allow_entry)]
    pub allow: Vec<String>,
    /// With --internet, keep this out of reach (repeatable): example.org, *.example.org, an
    /// IP, a network (10.0.0.0/8), each optionally :PORT (else every port).
    #[arg(long = "deny", value_name = "HOST", requires = "internet", value_parser = deny_entry)]
    pub deny: Vec<String>,
}

impl PolicyArgs {
    /// The policy the flags give (none: no network).
    pub fn policy(&self) -> forkbox_engine::net::NetworkPolicy {
        forkbox_engine::net::NetworkPolicy {
            internet: self.internet,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
        }
    }
}

/// `forkbox sandbox network ID [--internet | --allow HOST...]`.
pub async fn set(c: &Client, id: &str, net: &PolicyArgs, json: bool) -> anyhow::Result<ExitCode> {
    let v = c.set_network(id, &net.policy()).await?;
    show(json, &v, || {
        let what = match (v.network.internet, v.network.allow.is_empty()) {
            (true, _) if !v.network.deny.is_empty() => {
                let mut w = format!("the internet but {}", v.network.deny.join(", "));
                if !v.network.allow.is_empty() {
                    w += &format!(" (except {})", v.network.allow.join(", "));
                }
                w
            }
            (true, _) => "the internet".to_string(),
            (false, true) => "no network".to_string(),
            (false, false) => v.network.allow.join(", "),
        };
        println!("{id} now reaches {what}")
    })
}

/// Network policy flags. Without any, no network at all.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// A secret the guest never holds (repeatable): NAME@HOST[,HOST...] takes the value of
    /// this host's $NAME, NAME=env:VAR@HOSTS of $VAR, NAME=file:PATH@HOSTS of a file. The
    /// guest's $NAME is a placeholder; HTTPS requests to the HOSTS carry the value in its
    /// place (headers, Basic credentials). Allows the HOSTS.
    #[arg(long = "secret", value_name = "NAME@HOSTS", value_parser = secret_arg)]
    pub secrets: Vec<forkbox_engine::api::SecretSpec>,
}

impl NetArgs {
    pub fn policy(&self) -> Option<forkbox_engine::net::NetworkPolicy> {
        let p = self.policy.policy();
        (!p.is_off()).then_some(p)
    }
}

pub(crate) fn deny_entry(s: &str) -> Result<String, String> {
    let p = forkbox_engine::net::NetworkPolicy {
        internet: true,
        allow: Vec::new(),
        deny: vec![s.to_string()],
    };
    p.validate()
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

pub(crate) fn allow_entry(s: &str) -> Result<String, String> {
    forkbox_engine::net::check_allow_entry(s).map_err(|e| e.to_string())
}

/// One `--secret`: the value read here, on the host, from the variable or file it names.
pub fn secret_arg(s: &str) -> Result<forkbox_engine::api::SecretSpec, String> {
    let (left, hosts) = s.rsplit_once('@').ok_or_else(|| {
        format!("{s:?}: name the hosts the secret may go to: NAME@HOST[,HOST...]")
    })?;
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect();
    let (name, value) = match left.split_once('=') {
        None => {
            let v = std::env::var(left).map_err(|_| {
                format!("--secret {left}@...: ${left} is not set in this environment (or give NAME=env:VAR@HOSTS, NAME=file:PATH@HOSTS)")
            })?;
            (left.to_string(), v)
        }
        Some((name, source)) => {
            let value = if let Some(var) = source.strip_prefix("env:") {
                std::env::var(var).map_err(|_| {
                    format!("--secret {name}: ${var} is not set in this environment")
                })?
            } else if let Some(path) = source.strip_prefix("file:") {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--secret {name}: cannot read {path}: {e}"))?;
                text.trim_end_matches(['\n', '\r']).to_string()
            } else {
                return Err(format!(
                    "--secret {name}={source}: the value comes from env:VAR or file:PATH (never the command line, where other users of this host can read it)"
                ));
            };
            (name.to_string(), value)
        }
    };
    let spec = forkbox_engine::api::SecretSpec {
        name,
        hosts,
        value,
        header: None,
    };
    forkbox_engine::api::validate_secrets(std::slice::from_ref(&spec))
        .map_err(|e| e.to_string())?;
    Ok(spec)
}
