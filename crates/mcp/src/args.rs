//! What each tool takes: its arguments as the tool's JSON schema describes them.

use rmcp::schemars;
use serde::Deserialize;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateArgs {
    /// Image NAME or NAME@N (e.g. "python-bookworm"); the default image when absent.
    pub image: Option<String>,
    /// Delete the sandbox this many seconds from now (default 3600).
    pub ttl_seconds: Option<u64>,
    /// Reach the whole internet through forkbox's proxy. No network at all by default.
    pub internet: Option<bool>,
    /// Reach only these hosts (e.g. ["pypi.org", "*.pythonhosted.org"]).
    pub allow: Option<Vec<String>>,
    /// Keep the sandbox when this session ends (it is hibernated when its TTL passes).
    pub persistent: Option<bool>,
    /// Let it sleep after this many seconds unused (no command running, no call): its memory
    /// and processes are kept on disk without a VM, and the next call that needs it (exec,
    /// files, a port connection) wakes it; the caller sees only the delay.
    pub idle_seconds: Option<u64>,
    /// Secrets its HTTPS requests to the named hosts carry (e.g. a registry token). The value
    /// is read from this server's own environment (the variable `env`, or `name`), so it
    /// passes through neither the conversation nor the sandbox: the guest's $NAME holds a
    /// placeholder the host replaces in requests to `hosts`.
    pub secrets: Option<Vec<SecretArg>>,
    /// Volumes to mount, each "NAME:/path" (read-write: one sandbox at a time) or
    /// "NAME:/path:ro" (read-only: any number); make one with volume_create.
    pub volumes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct VolumeArgs {
    /// 1 to 63 of a-z, 0-9, '-', '_' and '.'.
    pub name: String,
    /// Its size, e.g. "512m" or "10g" (default 1g; taken on the host's disk at once).
    pub size: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct VolumeNameArgs {
    pub name: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SecretArg {
    /// The guest's environment variable (e.g. "NPM_TOKEN").
    pub name: String,
    /// Where the value may go (e.g. ["registry.npmjs.org"]).
    pub hosts: Vec<String>,
    /// The variable of this server's environment that holds the value (default: `name`).
    pub env: Option<String>,
}

/// Secrets for a create, their values from this server's environment.
pub(crate) fn secret_specs(
    args: Option<Vec<SecretArg>>,
) -> Result<Vec<forkbox_api::SecretSpec>, String> {
    args.unwrap_or_default()
        .into_iter()
        .map(|a| {
            let var = a.env.unwrap_or_else(|| a.name.clone());
            let value = std::env::var(&var).map_err(|_| {
                format!(
                    "secret {}: ${var} is not set in the MCP server's environment (set it where the server is started; values never pass through the conversation)",
                    a.name
                )
            })?;
            Ok(forkbox_api::SecretSpec {
                name: a.name,
                hosts: a.hosts,
                value,
                header: None,
            })
        })
        .collect()
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PortArgs {
    pub sandbox: String,
    /// The port a server in the sandbox listens on (e.g. 3000).
    pub guest_port: u16,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxArgs {
    /// The sandbox id (sb-...).
    pub sandbox: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecArgs {
    pub sandbox: String,
    /// A shell command line, run with /bin/sh -c.
    pub command: String,
    /// Working directory in the sandbox (default /root).
    pub cwd: Option<String>,
    /// Kill it after this many seconds (default 600, at most 86400).
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PathArgs {
    pub sandbox: String,
    /// A path in the sandbox: absolute, or relative to /root.
    pub path: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteArgs {
    pub sandbox: String,
    pub path: String,
    /// The file's whole new text.
    pub content: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct EditArgs {
    pub sandbox: String,
    pub path: String,
    /// Exact text to replace; it must occur exactly once in the file.
    pub old: String,
    /// What replaces it.
    pub new: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct UploadArgs {
    pub sandbox: String,
    /// An absolute host directory under an allowed root.
    pub host_dir: String,
    /// Where it goes in the sandbox (made if missing).
    pub guest_dir: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DownloadArgs {
    pub sandbox: String,
    /// A file or directory in the sandbox.
    pub guest_path: String,
    /// A host directory that does not exist yet, under an allowed root.
    pub host_dir: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DiffArgs {
    pub sandbox: String,
    /// The git work tree (default /work).
    pub cwd: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SnapshotArgs {
    pub sandbox: String,
    /// A name for the snapshot; one is made up when absent.
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ForkArgs {
    /// A sandbox id of this session, or a snapshot name.
    pub source: String,
    /// How many copies, 1 to 20.
    pub count: u32,
    /// TTL of the copies in seconds (default 3600).
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunTestsArgs {
    pub sandbox: String,
    /// The test command (default: python3 -m pytest -q -rA -p no:cacheprovider). Its output
    /// is read by forkbox's parsers: pytest -rA, JUnit XML, go test -json, cargo, TAP.
    pub command: Option<String>,
    /// Working directory (default /work).
    pub cwd: Option<String>,
    /// Compare with the report saved earlier under this name: which tests that passed there
    /// do not pass now (lost), and which pass now that did not (fixed).
    pub baseline: Option<String>,
    /// Save this run's results under this name, for a later baseline.
    pub save_as: Option<String>,
    pub timeout_seconds: Option<u64>,
}

/// What the tests did.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunCodeArgs {
    pub sandbox: String,
    /// The cell's code.
    pub code: String,
    /// "python" (default), "javascript" or "bash"; each language has a default context whose
    /// state (variables, imports) carries from one call to the next.
    pub language: Option<String>,
    /// A context made by code_context instead of the language's default one.
    pub context: Option<String>,
    /// Interrupt the cell after this many seconds (default and at most 300).
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CodeContextArgs {
    pub sandbox: String,
    /// "python" (default), "javascript" or "bash".
    pub language: Option<String>,
    /// Its working directory (absolute; default the home of the server's user).
    pub cwd: Option<String>,
}
