//! Cairn's native HTTP API: buckets, objects, versions, branches and proofs over HTTP,
//! described by the OpenAPI 3 document served at `/openapi.json` (`openapi.json` beside
//! this file; a test checks that it describes exactly the routes of [`route_table`]).
//!
//! - [`buckets`]: create (open, or with an owner key), list, info and capsule metadata;
//! - [`objects`]: get (ranges, text or JSON), put (streamed, typed, guarded by `If-Match`),
//!   patch (type operations), delete (a branch), version metadata;
//! - [`versions`]: keys, branches, log, diff, LCA, fork, merge, rename, proofs;
//! - [`auth`]: the `Cairn-Ed25519` request signatures of buckets with an owner key;
//! - [`values`]: the text and JSON forms of typed values;
//! - [`body`]: constant-memory request and response bodies;
//! - [`error`]: JSON errors and the status of each [`cairn_core::Error`].
//!
//! Every storage call runs on the blocking pool. Keys are the rest of the path after the
//! operation (`/v1/buckets/{bucket}/objects/a/b.txt` is key `a/b.txt`), percent-decoded.

pub mod auth;
pub mod body;
pub mod buckets;
pub mod error;
pub mod objects;
pub mod values;
pub mod versions;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{Method, Uri, header};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, delete, get, on, patch, post, put};
use axum::{Extension, Router};
use cairn_object::{At, Uid};
use serde::de::DeserializeOwned;

use crate::node::Node;
use error::{ApiError, ApiResult};

/// The OpenAPI document of this API.
pub const OPENAPI: &str = include_str!("openapi.json");

/// State the native API keeps beside [`Node`] (signatures accepted recently are in
/// [`Node::replay`], loaded from the store at start).
#[derive(Default)]
pub struct Native {
    /// Serializes bucket creation.
    pub create: tokio::sync::Mutex<()>,
}

/// Every route: path (axum syntax), method, handler.
pub fn route_table() -> Vec<(&'static str, Method, MethodRouter<Arc<Node>>)> {
    const OBJ: &str = "/v1/buckets/{bucket}/objects/{*key}";
    vec![
        ("/openapi.json", Method::GET, get(openapi)),
        ("/v1/buckets", Method::GET, get(buckets::list)),
        ("/v1/buckets", Method::POST, post(buckets::create)),
        ("/v1/buckets/{bucket}", Method::GET, get(buckets::show)),
        (
            "/v1/buckets/{bucket}/metadata",
            Method::GET,
            get(buckets::metadata),
        ),
        (
            "/v1/buckets/{bucket}/keys",
            Method::GET,
            get(versions::keys),
        ),
        (OBJ, Method::GET, get(objects::get)),
        (OBJ, Method::PUT, put(objects::put)),
        (OBJ, Method::PATCH, patch(objects::patch)),
        (OBJ, Method::DELETE, delete(objects::remove)),
        (
            "/v1/buckets/{bucket}/stream/{*key}",
            Method::GET,
            get(objects::stream),
        ),
        (
            "/v1/buckets/{bucket}/meta/{*key}",
            Method::GET,
            get(objects::meta),
        ),
        (
            "/v1/buckets/{bucket}/branches/{*key}",
            Method::GET,
            get(versions::branches),
        ),
        (
            "/v1/buckets/{bucket}/log/{*key}",
            Method::GET,
            get(versions::log),
        ),
        (
            "/v1/buckets/{bucket}/diff/{*key}",
            Method::GET,
            get(versions::diff),
        ),
        (
            "/v1/buckets/{bucket}/lca/{*key}",
            Method::GET,
            get(versions::lca),
        ),
        (
            "/v1/buckets/{bucket}/proof/{*key}",
            Method::GET,
            get(versions::proof),
        ),
        (
            "/v1/buckets/{bucket}/fork/{*key}",
            Method::POST,
            post(versions::fork),
        ),
        (
            "/v1/buckets/{bucket}/merge/{*key}",
            Method::POST,
            post(versions::merge),
        ),
        (
            "/v1/buckets/{bucket}/rename/{*key}",
            Method::POST,
            post(versions::rename),
        ),
    ]
}

/// The native API's routes.
pub fn routes() -> Router<Arc<Node>> {
    let mut router = Router::new();
    for (path, _, handler) in route_table() {
        router = router.route(path, handler);
    }
    // Unknown paths under /v1 answer in the API's JSON error form.
    router = router.route(
        "/v1/{*rest}",
        on(axum::routing::MethodFilter::GET, not_found)
            .on(axum::routing::MethodFilter::PUT, not_found)
            .on(axum::routing::MethodFilter::POST, not_found)
            .on(axum::routing::MethodFilter::DELETE, not_found)
            .on(axum::routing::MethodFilter::PATCH, not_found),
    );
    router
        .layer(axum::middleware::map_response(json_method_not_allowed))
        .layer(Extension(Arc::new(Native::default())))
}

/// A method a route does not take answers in the API's JSON error form too (it answered
/// 405 with an empty body; the router adds its `Allow` header to this answer).
async fn json_method_not_allowed(
    method: Method,
    uri: Uri,
    resp: axum::response::Response,
) -> axum::response::Response {
    use axum::body::HttpBody;
    use axum::response::IntoResponse;
    if resp.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED
        || resp.body().size_hint().exact() != Some(0)
    {
        return resp;
    }
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} does not take {method} (see the Allow header and /openapi.json)",
            uri.path()
        ),
    )
    .into_response()
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {} (see /openapi.json)", uri.path()),
    )
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

/// The bucket name of a `/v1/buckets/{bucket}/...` route.
pub struct BucketPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for BucketPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let Path(bucket) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        Ok(BucketPath(bucket))
    }
}

/// The bucket and key of a `/v1/buckets/{bucket}/<op>/{*key}` route.
pub struct KeyPath {
    /// The bucket name.
    pub bucket: String,
    /// The key (percent-decoded; may contain `/`).
    pub key: String,
}

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let Path((bucket, key)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        Ok(KeyPath { bucket, key })
    }
}

/// A query that takes no parameters (an unknown one is refused).
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// Parses the query string; unknown parameters are refused (a typo must not write
/// somewhere else).
pub fn query<T: DeserializeOwned>(uri: &Uri) -> ApiResult<T> {
    Query::<T>::try_from_uri(uri)
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// The ETag of a version: its uid, quoted.
pub fn etag(uid: &Uid) -> String {
    format!("\"{uid}\"")
}

/// Parses a version id.
pub fn parse_uid(s: &str) -> ApiResult<Uid> {
    s.trim()
        .parse::<Uid>()
        .map_err(|e| ApiError::bad_request(format!("{s:?} is not a version id: {e}")))
}

/// The query of requests that read one version: `?branch=` or `?uid=`.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct VersionQuery {
    /// A tagged branch.
    pub branch: Option<String>,
    /// A version id.
    pub uid: Option<String>,
}

impl VersionQuery {
    /// The version it names (see [`version_at`]).
    pub fn at(self) -> ApiResult<At> {
        version_at(self.branch, self.uid)
    }
}

/// The version named by `?branch=` or `?uid=` (default: the `master` head).
pub fn version_at(branch: Option<String>, uid: Option<String>) -> ApiResult<At> {
    match (branch, uid) {
        (Some(_), Some(_)) => Err(ApiError::bad_request("give ?branch= or ?uid=, not both")),
        (_, Some(u)) => Ok(At::Uid(parse_uid(&u)?)),
        (Some(b), None) => Ok(At::Branch(b)),
        (None, None) => Ok(At::default_branch()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OpenAPI document describes exactly the routes the router serves.
    #[test]
    fn openapi_describes_every_route() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let paths = doc["paths"].as_object().unwrap();
        let mut served = std::collections::BTreeSet::new();
        for (path, method, _) in route_table() {
            let p = path.replace("{*key}", "{key}");
            let m = method.as_str().to_ascii_lowercase();
            let op = &paths
                .get(&p)
                .unwrap_or_else(|| panic!("{p} is not in openapi.json"))[&m];
            assert!(op.is_object(), "{m} {p} is not in openapi.json");
            assert!(op["summary"].is_string(), "{m} {p} has no summary");
            assert!(op["responses"].is_object(), "{m} {p} has no responses");
            served.insert((p, m));
        }
        for (p, item) in paths {
            for m in item.as_object().unwrap().keys() {
                if m == "parameters" {
                    continue;
                }
                assert!(
                    served.contains(&(p.clone(), m.clone())),
                    "openapi.json describes {m} {p}, which is not served"
                );
            }
        }
    }
}
