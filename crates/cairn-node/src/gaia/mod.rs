//! A drop-in Gaia hub. Being built (issue 4).

use std::sync::Arc;

use axum::Router;
use serde::Deserialize;

use crate::node::Node;

/// Gaia hub settings (the `[gaia]` table of the config file).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GaiaConfig {}

/// The Gaia hub's routes.
pub fn routes(_node: &Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
}
