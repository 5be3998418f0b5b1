//! ForkBase's object engine for Cairn.
//!
//! This crate owns versioned objects: chunk framing ([`chunk`]), the Pattern-Oriented-Split
//! tree that stores Blob, List, Map and Set values ([`postree`]), and (in later modules)
//! FObjects, branch tables, fork, merge, diff, LCA, track, verification and GC.

pub mod chunk;
pub mod postree;
