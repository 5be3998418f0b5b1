//! The error type shared by every Cairn layer.
//!
//! Variants are coarse on purpose: each one maps to one clear line for a CLI user and to one
//! HTTP status for the node. Details travel in the message strings.

use std::io;

/// Result with Cairn's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in Cairn, grouped by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A named thing (key, branch, version, chunk) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Bytes failed to parse: bad version byte, truncated field, trailing data, bad varint.
    #[error("decode error: {0}")]
    Decode(String),
    /// Stored or received bytes do not match the hash that names them, or a structure is
    /// internally inconsistent. The message names what is damaged.
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// The caller asked for something malformed or impossible (bad name, bad argument).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A guarded write found a different head than the guard named.
    #[error("guard mismatch: {0}")]
    GuardMismatch(String),
    /// An operation met a value of a different type than it works on.
    #[error("type mismatch: {0}")]
    TypeMismatch(String),
    /// Something already exists where a new one was to be created (e.g. a branch name).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// A merge found conflicts its resolver could not settle; nothing was written.
    #[error("merge conflict: {0}")]
    Conflict(String),
    /// Received or stored data failed a cryptographic check: a bad signature, a broken hash
    /// chain, a record naming another capsule, a proof that does not lead to a trusted root.
    /// Nothing was stored or accepted.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The store is in use by another process or otherwise unavailable.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// An operating-system I/O error, with what Cairn was doing when it happened.
    #[error("i/o error while {context}: {source}")]
    Io {
        /// What Cairn was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Whether an I/O error of `kind` says the storage is full: the disk, a quota, or the
/// process's file size limit.
pub fn out_of_space(kind: io::ErrorKind) -> bool {
    use io::ErrorKind::{FileTooLarge, QuotaExceeded, StorageFull};
    matches!(kind, StorageFull | FileTooLarge | QuotaExceeded)
}

impl Error {
    /// Wraps an I/O error with a short description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Builds a [`Error::Decode`] from anything printable.
    pub fn decode(msg: impl std::fmt::Display) -> Self {
        Error::Decode(msg.to_string())
    }

    /// Builds a [`Error::Corrupt`] from anything printable.
    pub fn corrupt(msg: impl std::fmt::Display) -> Self {
        Error::Corrupt(msg.to_string())
    }

    /// Builds a [`Error::InvalidInput`] from anything printable.
    pub fn invalid(msg: impl std::fmt::Display) -> Self {
        Error::InvalidInput(msg.to_string())
    }

    /// Builds a [`Error::NotFound`] from anything printable.
    pub fn not_found(msg: impl std::fmt::Display) -> Self {
        Error::NotFound(msg.to_string())
    }
}

/// Extension for attaching context to `std::io::Result`.
pub trait IoContext<T> {
    /// Converts an I/O error into [`Error::Io`] with the given context.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(context(), e))
    }
}
