//! Request bodies and query strings read the API's way: one that does not parse is refused
//! like every other bad request, a 400 with code `bad_request` and the parser's words (axum's
//! own extractors answer a plain-text 400, 415 or 422 with no code).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, OptionalFromRequest, Request};
use axum::http::request::Parts;
use forkbox_engine::api::EngineError;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// A JSON body of type `T`.
pub(crate) struct Body<T>(pub T);

/// A query string of type `T`.
pub(crate) struct Params<T>(pub T);

fn bad_body(r: JsonRejection) -> ApiError {
    let words = format!("the request body: {}", r.body_text());
    ApiError(if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        EngineError::TooLarge(words)
    } else {
        EngineError::BadRequest(words)
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match <axum::Json<T> as FromRequest<S>>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Body(v)),
            Err(r) => Err(bad_body(r)),
        }
    }
}

/// No body (no JSON content type) is `None`; a body that does not parse is refused.
impl<S: Send + Sync, T: DeserializeOwned> OptionalFromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, ApiError> {
        match <axum::Json<T> as OptionalFromRequest<S>>::from_request(req, state).await {
            Ok(v) => Ok(v.map(|axum::Json(v)| Body(v))),
            Err(r) => Err(bad_body(r)),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Params(v)),
            Err(r) => Err(query_refused(r)),
        }
    }
}

fn query_refused(r: QueryRejection) -> ApiError {
    ApiError(EngineError::BadRequest(format!(
        "the query string: {}",
        r.body_text()
    )))
}
