//! The OpenAPI document and the router agree: every documented operation reaches a handler, and
//! every route the router has is documented. No VM is started (requests name no real sandbox).
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkbox_engine::api::Engine;
use forkbox_engine::paths::Paths;
use tower::ServiceExt;

fn doc() -> serde_json::Value {
    serde_json::from_str(forkbox_server::OPENAPI).unwrap()
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
    let source = include_str!("../src/lib.rs");
    let doc = doc();
    let paths = doc["paths"].as_object().unwrap();
    let mut routes = 0;
    for piece in source.split(".route(").skip(1) {
        let path = piece
            .trim_start()
            .trim_start_matches('"')
            .split('"')
            .next()
            .unwrap();
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
