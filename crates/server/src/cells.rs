//! Code cells: `run_code` and code contexts, each an operation of the engine (which starts the
//! sandbox's code server when it needs one and relays its events).

use super::*;
use forkbox_engine::api::{CodeContext, CodeContextRequest, CodeEvent, RunCodeRequest};

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", params(("id" = String, Path)), request_body = RunCodeRequest, responses((status = 200, description = "NDJSON CodeEvent lines as the cell runs, `end` last; the first call in a sandbox starts its code server (its image needs ipykernel: the bundled `code-interpreter` image has it)", body = CodeEvent, content_type = "application/x-ndjson"), (status = 400, body = ErrorBody), (status = 404, description = "no such sandbox or context", body = ErrorBody), (status = 409, description = "hibernated, or the sandbox cannot run code (said why)", body = ErrorBody)))]
pub(crate) async fn run_code(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(request): Body<RunCodeRequest>,
) -> Api {
    let rx = call(&e, ops::RunCode { id, request }).await?;
    Ok(ndjson(rx))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts", params(("id" = String, Path)), responses((status = 200, body = Vec<CodeContext>), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn list_code_contexts(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
) -> Api {
    answer::<reply::list_code_contexts, _>(&e, ops::CodeContexts { id }, StatusCode::OK).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts", params(("id" = String, Path)), request_body = CodeContextRequest, responses((status = 201, body = CodeContext), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create_code_context(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(request): Body<CodeContextRequest>,
) -> Api {
    let op = ops::CreateCodeContext { id, request };
    answer::<reply::create_code_context, _>(&e, op, StatusCode::CREATED).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts/{cid}/restart", params(("id" = String, Path), ("cid" = String, Path)), responses((status = 200, description = "the context, started again with nothing in it", body = CodeContext), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn restart_code_context(
    State(e): State<Arc<Engine>>,
    UrlPath((id, context_id)): UrlPath<(String, String)>,
) -> Api {
    let op = ops::RestartCodeContext { id, context_id };
    answer::<reply::restart_code_context, _>(&e, op, StatusCode::OK).await
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/code/contexts/{cid}", params(("id" = String, Path), ("cid" = String, Path)), responses((status = 200, body = Deleted), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_code_context(
    State(e): State<Arc<Engine>>,
    UrlPath((id, context_id)): UrlPath<(String, String)>,
) -> Api {
    let op = ops::DeleteCodeContext { id, context_id };
    answer::<reply::delete_code_context, _>(&e, op, StatusCode::OK).await
}
