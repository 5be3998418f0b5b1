//! Cairn's native HTTP API. Being built (issue 4): objects, versions, branches, proofs.

use std::sync::Arc;

use axum::Router;

use crate::node::Node;

/// The native API's routes.
pub fn routes() -> Router<Arc<Node>> {
    Router::new()
}
