//! The OpenAPI document (generated from the handlers and the engine's types) and the router
//! agree: every documented operation reaches a handler, every route is documented, and real
//! answers from a real engine match their schemas (that test boots VMs).
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkbox_engine::api::Engine;
use forkbox_engine::paths::Paths;
use tower::ServiceExt;

fn doc() -> serde_json::Value {
    serde_json::from_str(&forkbox_server::doc::json()).unwrap()
}

#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let home = tempfile::tempdir().unwrap();
    let app = forkbox_server::router(Arc::new(Engine::new(Paths::new(home.path()))));
    let doc = doc();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            let uri = format!(
                "{}?path=/x",
                path.replace("{id}", "sb-none").replace("{cid}", "cmd-none")
            );
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(uri)
                .header("content-type", "application/json")
                .body(Body::from(if method == "post" {
                    r#"{"argv":["true"],"ttl_seconds":5,"signal":15}"#
                } else {
                    ""
                }))
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}: no such method on the route"
            );
            // The router's own 404 has no body; every handler explains itself.
            assert!(
                !(status == StatusCode::NOT_FOUND && body.is_empty()),
                "{method} {path}: documented but not routed"
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} operations checked");
}

#[test]
fn every_route_is_documented() {
    use forkbox_engine::api::routes::route;
    let source = include_str!("../src/lib.rs");
    let doc = doc();
    let paths = doc["paths"].as_object().unwrap();
    let mut routes = 0;
    // The router names each path by an operation of the route table: `.route(op::NAME.path`.
    for piece in source.split(".route(").skip(1) {
        let name = piece
            .trim_start()
            .strip_prefix("op::")
            .and_then(|p| p.split(".path").next())
            .unwrap_or_else(|| panic!("a route not taken from the route table: {piece:.60}"));
        let path = route(name)
            .unwrap_or_else(|| panic!("no operation {name}"))
            .path;
        assert!(
            paths.contains_key(path),
            "route {path} is not in openapi.json"
        );
        routes += 1;
    }
    assert_eq!(
        routes,
        paths.len(),
        "openapi.json documents paths the router does not have"
    );
}

/// An operation's success reply as the document describes it, spelled as the route table
/// spells replies: `SandboxView`, `Vec<ImageView>`, `Lines<CommandEvent>`, `Octets`, `Text`,
/// `Empty`.
fn documented_reply(op: &serde_json::Value) -> String {
    let responses = op["responses"].as_object().unwrap();
    let ok = responses
        .keys()
        .filter(|s| s.starts_with('2'))
        .min()
        .unwrap_or_else(|| panic!("no success documented: {op}"));
    let Some(content) = responses[ok]["content"].as_object() else {
        return "Empty".into();
    };
    let name = |schema: &serde_json::Value| -> Option<String> {
        let r = schema["$ref"].as_str()?;
        Some(r.rsplit('/').next()?.to_string())
    };
    // A reply with several kinds (exec: JSON, or NDJSON with `stream=true`) is its JSON one.
    let (media, body) = content
        .iter()
        .find(|(m, _)| m.as_str() == "application/json")
        .or_else(|| content.iter().next())
        .unwrap();
    let schema = &body["schema"];
    match media.as_str() {
        "application/octet-stream" => "Octets".into(),
        "application/x-ndjson" => format!("Lines<{}>", name(schema).unwrap()),
        "application/json" => match (name(schema), name(&schema["items"])) {
            (Some(n), _) => n,
            (None, Some(n)) if schema["type"] == "array" => format!("Vec<{n}>"),
            _ => "Text".into(),
        },
        _ => "Text".into(),
    }
}

/// Each operation's success reply in the document is the one the route table names (which the
/// server's handlers and the Rust client are held to when compiled).
#[test]
fn every_documented_reply_is_the_route_tables() {
    use forkbox_engine::api::routes::ROUTES;
    let doc = doc();
    for r in ROUTES {
        let op = &doc["paths"][r.path][r.method.as_str().to_lowercase()];
        assert!(
            op.is_object(),
            "{} {} is not documented",
            r.method.as_str(),
            r.path
        );
        assert_eq!(
            documented_reply(op),
            r.reply.replace(' ', ""),
            "{} ({} {}): the document's reply is not the table's",
            r.op,
            r.method.as_str(),
            r.path
        );
    }
}

/// Validates real answers against the document: each status must be documented for its
/// operation, and a JSON body (or each line of an NDJSON one) must match its schema.
struct Checker {
    doc: serde_json::Value,
    app: axum::Router,
    checked: Vec<String>,
}

impl Checker {
    fn schema_for(&self, path: &str, method: &str, status: u16) -> Option<serde_json::Value> {
        self.schema_of(path, method, status, None)
    }

    /// The schema of an answer, by its content type when the operation has several.
    fn schema_of(
        &self,
        path: &str,
        method: &str,
        status: u16,
        content_type: Option<&str>,
    ) -> Option<serde_json::Value> {
        let op = &self.doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not documented");
        let resp = &op["responses"][status.to_string()];
        assert!(
            resp.is_object(),
            "{method} {path} answered {status}, which is not documented"
        );
        let content = resp["content"].as_object()?;
        let media = match content_type {
            Some(t) if content.len() > 1 => content
                .iter()
                .find(|(k, _)| t.starts_with(k.as_str()))
                .map(|(_, m)| m)
                .unwrap_or_else(|| panic!("{method} {path}: {t} is not documented")),
            _ => content.iter().next()?.1,
        };
        Some(media["schema"].clone())
    }

    fn validate(&self, schema: &serde_json::Value, value: &serde_json::Value, what: &str) {
        let mut root = schema.as_object().cloned().unwrap_or_default();
        root.insert("components".into(), self.doc["components"].clone());
        let root = serde_json::Value::Object(root);
        let v = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
            .unwrap_or_else(|e| panic!("{what}: the schema does not compile: {e}"));
        let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{what}: {value} does not match its schema: {errors:?}"
        );
    }

    /// Sends a request to the router and checks the answer; the JSON body (the last NDJSON
    /// line of a stream).
    async fn call(
        &mut self,
        method: &str,
        uri: &str,
        doc_path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri);
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        // A call that never ends fails the test saying which (a hang says only the test's name).
        let started = std::time::Instant::now();
        println!("{method} {uri}");
        let answer = async {
            let resp = self
                .app
                .clone()
                .oneshot(req.body(body).unwrap())
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
                .await
                .unwrap();
            (status, content_type, bytes)
        };
        let (status, content_type, bytes) =
            tokio::time::timeout(std::time::Duration::from_secs(150), answer)
                .await
                .unwrap_or_else(|_| panic!("{method} {uri} did not answer in 150 s"));
        println!("  {status} ({:.1} s)", started.elapsed().as_secs_f64());
        let ndjson = content_type.contains("ndjson");
        let what = format!("{method} {uri} -> {status}");
        let schema = self.schema_of(
            doc_path,
            &method.to_lowercase(),
            status,
            Some(&content_type),
        );
        let mut last = serde_json::Value::Null;
        let values: Vec<serde_json::Value> = if ndjson {
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        } else if bytes.is_empty() {
            vec![]
        } else {
            vec![serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)]
        };
        if let Some(schema) = &schema {
            for v in &values {
                self.validate(schema, v, &what);
                last = v.clone();
            }
        }
        self.checked.push(what);
        (status, last)
    }
}

/// Real answers from the daemon's router on a real engine (VMs booted under the test home's
/// images) match the generated document: one sandbox, its exec (plain and streamed), a
/// background command, files, a snapshot and its fork, hibernate and resume, an image build,
/// and the errors on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_match_their_schemas() {
    let paths = forkbox_test_infra::isolated_home("openapi-real");
    let engine = Arc::new(Engine::new(paths));
    let mut c = Checker {
        doc: doc(),
        app: forkbox_server::router(engine.clone()),
        checked: vec![],
    };
    use serde_json::json;
    c.call("GET", "/v1/health", "/v1/health", None).await;
    c.call("GET", "/v1/info", "/v1/info", None).await;
    c.call("GET", "/v1/images", "/v1/images", None).await;
    let img = "/v1/images/{reference}";
    c.call("GET", "/v1/images/python-bookworm", img, None).await;
    assert_eq!(c.call("GET", "/v1/images/nope", img, None).await.0, 404);
    assert_eq!(c.call("GET", "/v1/images/a@b", img, None).await.0, 400);
    let build =
        json!({"name": "openapi-test", "recipe": {"base": "python-bookworm"}, "if_changed": true});
    let (_, last) = c
        .call("POST", "/v1/images", "/v1/images", Some(build))
        .await;
    assert!(
        matches!(last["type"].as_str(), Some("done" | "up_to_date")),
        "{last}"
    );
    let (s, sb) = c
        .call(
            "POST",
            "/v1/sandboxes",
            "/v1/sandboxes",
            Some(json!({"ttl_seconds": 600})),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();
    let one = "/v1/sandboxes/{id}";
    c.call("GET", "/v1/sandboxes", "/v1/sandboxes", None).await;
    c.call("GET", &format!("/v1/sandboxes/{id}"), one, None)
        .await;
    assert_eq!(
        c.call("GET", "/v1/sandboxes/sb-none", one, None).await.0,
        404
    );
    let exec = "/v1/sandboxes/{id}/exec";
    let (_, r) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            exec,
            Some(json!({"shell": "echo hi"})),
        )
        .await;
    assert_eq!(r["stdout"], "hi\n");
    let (_, last) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec?stream=true"),
            exec,
            Some(json!({"argv": ["sh", "-c", "echo a; echo b >&2"]})),
        )
        .await;
    assert_eq!(last["type"], "exit");
    let (_, started) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/commands"),
            "/v1/sandboxes/{id}/commands",
            Some(json!({"shell": "echo bg"})),
        )
        .await;
    let cid = started["command_id"].as_str().unwrap().to_string();
    c.call(
        "GET",
        &format!("/v1/sandboxes/{id}/commands/{cid}/events"),
        "/v1/sandboxes/{id}/commands/{cid}/events",
        None,
    )
    .await;
    c.call(
        "GET",
        &format!("/v1/sandboxes/{id}/commands/{cid}"),
        "/v1/sandboxes/{id}/commands/{cid}",
        None,
    )
    .await;
    let files = "/v1/sandboxes/{id}/files";
    let req = Request::builder()
        .method("PUT")
        .uri(format!("/v1/sandboxes/{id}/files?path=/tmp/x/y.txt"))
        .body(Body::from("data"))
        .unwrap();
    let resp = c.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    let schema = c.schema_for(files, "put", 200).unwrap();
    c.validate(&schema, &body, "PUT files");
    assert_eq!(
        c.call(
            "GET",
            &format!("/v1/sandboxes/{id}/files?path=/nope"),
            files,
            None
        )
        .await
        .0,
        404
    );
    let (_, dir) = c
        .call(
            "GET",
            &format!("/v1/sandboxes/{id}/dir?path=/tmp/x"),
            "/v1/sandboxes/{id}/dir",
            None,
        )
        .await;
    assert_eq!(dir["entries"][0]["name"], "y.txt");
    c.call(
        "POST",
        &format!("/v1/sandboxes/{id}/ttl"),
        "/v1/sandboxes/{id}/ttl",
        Some(json!({"ttl_seconds": 900})),
    )
    .await;
    let (s, snap) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/snapshot"),
            "/v1/sandboxes/{id}/snapshot",
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 201, "{snap}");
    let name = snap["name"].as_str().unwrap().to_string();
    c.call("GET", "/v1/snapshots", "/v1/snapshots", None).await;
    c.call(
        "GET",
        &format!("/v1/snapshots/{name}"),
        "/v1/snapshots/{id}",
        None,
    )
    .await;
    let (s, forked) = c
        .call(
            "POST",
            &format!("/v1/snapshots/{name}/fork"),
            "/v1/snapshots/{id}/fork",
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(s, 201, "{forked}");
    let copy = forked["sandboxes"][0]["id"].as_str().unwrap().to_string();
    c.call(
        "POST",
        &format!("/v1/sandboxes/{copy}/hibernate"),
        "/v1/sandboxes/{id}/hibernate",
        None,
    )
    .await;
    assert_eq!(
        c.call(
            "POST",
            &format!("/v1/sandboxes/{copy}/exec"),
            exec,
            Some(json!({"shell": "true"}))
        )
        .await
        .0,
        409
    );
    c.call(
        "POST",
        &format!("/v1/sandboxes/{copy}/resume"),
        "/v1/sandboxes/{id}/resume",
        None,
    )
    .await;
    c.call("DELETE", &format!("/v1/sandboxes/{copy}"), one, None)
        .await;
    c.call(
        "DELETE",
        &format!("/v1/snapshots/{name}"),
        "/v1/snapshots/{id}",
        None,
    )
    .await;
    let (s, forked) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/fork"),
            "/v1/sandboxes/{id}/fork",
            Some(json!({"count": 1, "ttl_seconds": 600})),
        )
        .await;
    assert_eq!(s, 201, "{forked}");
    let copy = forked["sandboxes"][0]["id"].as_str().unwrap().to_string();
    let (_, started) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{copy}/commands"),
            "/v1/sandboxes/{id}/commands",
            Some(json!({"argv": ["sleep", "600"]})),
        )
        .await;
    let cid = started["command_id"].as_str().unwrap();
    let (s, _) = c
        .call(
            "POST",
            &format!("/v1/sandboxes/{copy}/commands/{cid}/signal"),
            "/v1/sandboxes/{id}/commands/{cid}/signal",
            Some(json!({"signal": 9})),
        )
        .await;
    assert_eq!(s, 202);
    c.call("DELETE", &format!("/v1/sandboxes/{copy}"), one, None)
        .await;
    c.call("DELETE", &format!("/v1/sandboxes/{id}"), one, None)
        .await;
    println!(
        "checked {} answers:\n  {}",
        c.checked.len(),
        c.checked.join("\n  ")
    );
    assert!(
        c.checked.len() >= 33,
        "only {} answers checked",
        c.checked.len()
    );
    engine.shutdown().await;
}

/// The document and the API's route table (`forkbox_api::routes`, which the Rust client builds
/// its requests from and the SDKs are checked against) name the same operations at the same
/// methods and paths, so with the two tests above the router, the document, the table and
/// the client cannot drift apart.
#[test]
fn the_document_is_the_route_table() {
    use forkbox_engine::api::routes::ROUTES;
    let doc = doc();
    let mut documented = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            documented.insert((id, method.to_uppercase(), path.clone()));
        }
    }
    let table: std::collections::BTreeSet<_> = ROUTES
        .iter()
        .map(|r| {
            (
                r.op.to_string(),
                r.method.as_str().to_string(),
                r.path.to_string(),
            )
        })
        .collect();
    assert_eq!(
        documented.difference(&table).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "documented, not in the route table"
    );
    assert_eq!(
        table.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "in the route table, not documented"
    );
}

/// `docs/reference/http-api.json` is the document the daemon serves now, so the reference people
/// read never drifts from the code; with FORKBOX_BLESS=1 this test writes it anew.
#[test]
fn the_checked_in_reference_is_the_document() {
    let made = forkbox_server::doc::json() + "\n";
    let path = forkbox_test_infra::repo_root().join("docs/reference/http-api.json");
    if std::env::var_os("FORKBOX_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        old == made,
        "docs/reference/http-api.json is not the document the code makes now; write it anew \
         with `FORKBOX_BLESS=1 cargo nextest run -p forkbox-server --test openapi \
         the_checked_in_reference_is_the_document` and commit it"
    );
}
