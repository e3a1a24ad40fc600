//! The console's pages, style and script: the project's own, embedded in the binary.

use axum::response::Response;

/// Nothing but this daemon: no script, style, font or image from elsewhere, no inline script,
/// no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A migration's report: its own inline style, nothing else; no script, no origin.
pub const REPORT_CSP: &str =
    "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const LOGIN: &str = include_str!("assets/login.html");
const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

pub fn css() -> Response {
    super::asset("text/css; charset=utf-8", CSS)
}

pub fn js() -> Response {
    super::asset("text/javascript; charset=utf-8", JS)
}

/// Text for HTML: `&`, `<`, `>`, quotes escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON made safe inside a `<script type="application/json">` element: no `<`, `>` or `&`
/// as themselves (a label holding `</script>` stays a string).
fn script_json(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The console, with the state it starts from.
pub fn index_page(csrf: &str, initial_json: &str) -> String {
    INDEX
        .replace("{{CSRF}}", &escape(csrf))
        .replace("{{INITIAL}}", &script_json(initial_json))
}

/// The login page, saying why the last try failed.
pub fn login_page(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", escape(e)))
        .unwrap_or_default();
    LOGIN.replace("{{ERROR}}", &error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_cannot_close_its_script_element() {
        let page = index_page(
            "c\"sr<f",
            r#"{"labels":{"x":"</script><script>alert(1)</script>&"}}"#,
        );
        assert!(!page.contains("</script><script>alert"));
        assert!(page.contains("\\u003c/script\\u003e"));
        assert!(page.contains("content=\"c&quot;sr&lt;f\""));
    }

    #[test]
    fn pages_fetch_nothing_from_elsewhere() {
        for text in [INDEX, LOGIN, CSS, JS] {
            for far in ["http://", "https://", "//cdn", "@import", "fonts.g"] {
                assert!(!text.contains(far), "{far} in an asset");
            }
        }
    }
}
