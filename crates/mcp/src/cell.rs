//! A code cell's events gathered into one tool result: its output's tails, its results as
//! text (each plot also as an image block), its error.

use forkbox_api::CodeEvent;
use forkbox_client::{ClientError, Events};
use rmcp::model::{CallToolResult, ContentBlock};

use crate::{Tail, EXEC_TAIL};

/// Most characters of one result's text kept.
const RESULT_TEXT: usize = 8 * 1024;

#[derive(Default)]
pub(crate) struct Cell {
    out: Tail,
    err: Tail,
    results: Vec<serde_json::Value>,
    images: Vec<(String, &'static str)>,
    error: Option<serde_json::Value>,
    execution_count: Option<u64>,
}

/// Reads a cell's events to its end.
pub(crate) async fn collect(mut events: Events<CodeEvent>) -> Result<Cell, ClientError> {
    let mut cell = Cell::default();
    while let Some(ev) = events.next().await? {
        match ev {
            CodeEvent::Stdout { text } => cell.out.push(text.as_bytes(), EXEC_TAIL),
            CodeEvent::Stderr { text } => cell.err.push(text.as_bytes(), EXEC_TAIL),
            CodeEvent::Result(r) => {
                let text = r
                    .text
                    .as_deref()
                    .map(|t| t.chars().take(RESULT_TEXT).collect::<String>());
                let mut formats = Vec::new();
                for (name, data, mime) in [
                    ("png", &r.png, "image/png"),
                    ("jpeg", &r.jpeg, "image/jpeg"),
                ] {
                    if let Some(d) = data {
                        cell.images.push((d.clone(), mime));
                        formats.push(name);
                    }
                }
                for (name, present) in [
                    ("html", r.html.is_some()),
                    ("markdown", r.markdown.is_some()),
                    ("svg", r.svg.is_some()),
                    ("json", r.json.is_some()),
                    ("latex", r.latex.is_some()),
                ] {
                    if present {
                        formats.push(name);
                    }
                }
                cell.results.push(serde_json::json!({
                    "text": text,
                    "is_main_result": r.is_main_result,
                    "formats": formats,
                }));
            }
            CodeEvent::Error {
                name,
                value,
                traceback,
            } => {
                cell.error = Some(serde_json::json!({
                    "name": name,
                    "value": value,
                    "traceback": strip_ansi(&traceback),
                }))
            }
            CodeEvent::End { execution_count } => {
                cell.execution_count = execution_count;
                return Ok(cell);
            }
        }
    }
    Err(ClientError::Transport(
        "the cell's stream ended before the cell did".into(),
    ))
}

impl Cell {
    pub(crate) fn into_result(self) -> CallToolResult {
        let summary = serde_json::json!({
            "stdout": self.out.text("stdout"),
            "stderr": self.err.text("stderr"),
            "results": self.results,
            "error": self.error,
            "execution_count": self.execution_count,
        });
        let mut blocks = vec![ContentBlock::text(
            serde_json::to_string_pretty(&summary).unwrap_or_default(),
        )];
        blocks.extend(
            self.images
                .into_iter()
                .map(|(data, mime)| ContentBlock::image(data, mime)),
        );
        // A cell that raised is the code's failure, not the tool's: the agent reads it.
        CallToolResult::success(blocks)
    }
}

/// A traceback without the terminal colours IPython puts in it.
fn strip_ansi(s: &str) -> String {
    anstream::adapter::strip_str(s).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn colours_leave_a_traceback() {
        assert_eq!(
            super::strip_ansi("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: x"),
            "ZeroDivisionError: x"
        );
    }
}
