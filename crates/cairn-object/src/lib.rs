//! ForkBase's object engine for Cairn.
//!
//! This crate owns versioned objects: chunk framing ([`chunk`]), the Pattern-Oriented-Split
//! tree that stores Blob, List, Map and Set values ([`postree`]), value types and type
//! operations ([`value`]), FObjects and uids ([`fobject`]), verified streams of versions
//! ([`stream`]) and checkable answers to history queries ([`evidence`]), branch tables ([`branch`]), and the [`Db`] that implements every ForkBase
//! API of Table 1: Get, Put (guarded), Merge with resolvers ([`merge`]), ListKeys,
//! ListTaggedBranches, ListUntaggedBranches, Fork, Rename, Remove, Track, LCA and Diff
//! ([`history`]), plus verification ([`verify`]) and garbage collection ([`gc`]).

#![warn(missing_docs)]

pub mod branch;
pub mod chunk;
pub mod db;
pub mod evidence;
pub mod fobject;
pub mod gc;
pub mod history;
pub mod merge;
pub mod postree;
mod staged;
pub mod stream;
pub mod value;
pub mod verify;

pub use branch::{BranchTable, HeadPos};
pub use db::{
    At, DEFAULT_BRANCH, DEFAULT_BUCKET, Db, HeadChange, HeadChangeKind, HeadRecorder, PutOptions,
    Target, Version, VersionMembership, apply_inline, check_bucket_name,
};
pub use fobject::{FObject, Uid};
pub use gc::GcReport;
pub use history::{Diff, DiffCursor, TrackEntry};
pub use merge::{BuiltinResolver, Conflict, ConflictAt, MergeOutcome, Resolution, Resolver};
pub use postree::{TreeConfig, TreeKind, TreeRef};
pub use value::{NewValue, Op, Value, ValueType, text_lines};
pub use verify::{Damage, VerifyProgress, VerifyReport};
