//! Cairn's foundation layer: tagged content hashes ([`Hash`], [`HashAlgo`]), Ed25519 keys
//! and signatures ([`sign`]), the canonical binary encoding every hashed structure uses
//! ([`codec`]), and the shared [`Error`] type.
//!
//! This crate does no I/O. Everything above it (chunk stores, objects, capsules, replicas,
//! the chain, the node) names data by [`Hash`] and serialises it with [`codec`], so a proof
//! built by one layer can be checked by any other.

#![warn(missing_docs)]

pub mod codec;
pub mod error;
pub mod hash;
pub mod sign;

pub use codec::{Decoder, Encoder};
pub use error::{Error, Result};
pub use hash::{Hash, HashAlgo, Hasher};
pub use sign::{PublicKey, Signature, SigningKey};
