//! The embedded, crash-safe default backend (placeholder: being written).

use std::path::Path;

use crate::{Durability, HashAlgo, Result};

/// Options for opening a [`LogStore`].
#[derive(Clone, Debug, Default)]
pub struct LogStoreOptions {
    /// Durability of commits.
    pub durability: Durability,
    /// Hash algorithm for a new store (an existing store keeps its own).
    pub algo: HashAlgo,
}

/// The embedded log-structured store.
pub struct LogStore {}

impl LogStore {
    /// Opens or creates a store in `dir`.
    pub fn open(_dir: &Path, _opts: LogStoreOptions) -> Result<Self> {
        Err(cairn_core::Error::Unavailable(
            "LogStore not yet written".into(),
        ))
    }
}
