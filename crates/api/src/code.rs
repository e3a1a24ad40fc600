//! Code cells: stateful execution in a sandbox (`run_code`). A program of forkbox's own
//! ([`SERVER`], Python) answers in the guest on [`SERVER_PORT`], a Jupyter kernel per Python
//! context, a Node process per JavaScript context, a shell per bash cell; the daemon starts it
//! on the first call that needs it and relays each cell's events as they come. E2B's code
//! interpreter SDKs reach the same server through E2B's front end.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The server, as it is written into a sandbox (`/opt/forkbox/ci/server.py`).
pub const SERVER: &str = include_str!("code_server.py");
/// Where it is written in the guest.
pub const SERVER_PATH: &str = "/opt/forkbox/ci/server.py";
/// The guest port it listens on (E2B's code interpreter's).
pub const SERVER_PORT: u16 = 49999;
/// The languages a cell may be written in.
pub const LANGUAGES: &[&str] = &["python", "javascript", "bash"];

/// `POST /v1/sandboxes/{id}/code`: one cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeRequest {
    pub code: String,
    /// `python` (the default), `javascript` or `bash`: the language's default context.
    pub language: Option<String>,
    /// A context made by `POST …/code/contexts` instead (not with `language`).
    pub context_id: Option<String>,
    /// Environment variables for this cell alone.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Interrupt the cell after this many seconds (default and at most 300).
    pub timeout_secs: Option<u64>,
}

impl RunCodeRequest {
    /// Checked: a known language, not both a language and a context, a timeout of 1-300 s.
    pub fn check(&self) -> Result<(), crate::Invalid> {
        if self.language.is_some() && self.context_id.is_some() {
            return Err(crate::Invalid(
                "give a language or a context_id, not both (a context has its language)".into(),
            ));
        }
        if let Some(l) = &self.language {
            check_language(l)?;
        }
        if let Some(t) = self.timeout_secs {
            if !(1..=300).contains(&t) {
                return Err(crate::Invalid(format!("timeout_secs {t} is not 1 to 300")));
            }
        }
        Ok(())
    }
}

fn check_language(l: &str) -> Result<(), crate::Invalid> {
    if LANGUAGES.contains(&l) {
        Ok(())
    } else {
        Err(crate::Invalid(format!(
            "language {l:?} is not one of {}",
            LANGUAGES.join(", ")
        )))
    }
}

/// One event of a cell, as newline-delimited JSON (`type` tells which), as it happens:
/// output, results and an error if any, then `end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    /// A value the cell displayed, or its last expression's (`is_main_result`).
    Result(CodeResult),
    /// An exception (its class name, message and traceback), a timeout (`TimeoutError`), a
    /// kernel that died during the cell and was started again (`KernelDied`), past the
    /// output limit (`OutputLimitError`), the relay broken off (`ForkboxRelayError`), a bash cell's
    /// non-zero exit (`CommandExitError`).
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    /// The cell is over; Python counts its cells per context.
    End {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        execution_count: Option<u64>,
    },
}

/// A result in every format the kernel gave it in (a plot: `png`, base64).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CodeResult {
    pub is_main_result: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub json: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
}

/// `POST /v1/sandboxes/{id}/code/contexts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeContextRequest {
    /// `python` (the default), `javascript` or `bash`.
    pub language: Option<String>,
    /// Its working directory (default: the home of the server's user).
    pub cwd: Option<String>,
}

impl CodeContextRequest {
    pub fn check(&self) -> Result<(), crate::Invalid> {
        if let Some(l) = &self.language {
            check_language(l)?;
        }
        match &self.cwd {
            Some(c) if !c.starts_with('/') => {
                Err(crate::Invalid(format!("cwd {c:?} is not an absolute path")))
            }
            _ => Ok(()),
        }
    }
}

/// A context: a language, a working directory, and state of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CodeContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_they_are_written() {
        let lines = [
            r#"{"type":"stdout","text":"hi\n"}"#,
            r#"{"type":"result","is_main_result":true,"text":"2","png":"iVBO"}"#,
            r#"{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"..."}"#,
            r#"{"type":"end","execution_count":3}"#,
        ];
        for l in lines {
            let e: CodeEvent = serde_json::from_str(l).unwrap();
            let back: serde_json::Value = serde_json::to_value(&e).unwrap();
            assert_eq!(back, serde_json::from_str::<serde_json::Value>(l).unwrap());
        }
    }

    #[test]
    fn a_cell_names_a_language_or_a_context() {
        let both = RunCodeRequest {
            language: Some("python".into()),
            context_id: Some("c".into()),
            ..Default::default()
        };
        assert!(both.check().is_err());
        let ruby = RunCodeRequest {
            language: Some("ruby".into()),
            ..Default::default()
        };
        assert!(ruby
            .check()
            .unwrap_err()
            .0
            .contains("python, javascript, bash"));
        let long = RunCodeRequest {
            timeout_secs: Some(301),
            ..Default::default()
        };
        assert!(long.check().is_err());
        assert!(RunCodeRequest::default().check().is_ok());
    }
}
