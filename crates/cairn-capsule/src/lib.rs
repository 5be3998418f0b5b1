//! DataCapsules for Cairn (the DCS paper): the unit of ownership, provenance and
//! replication.
//!
//! A capsule is named by the hash of its [`CapsuleMetadata`] (writer keys, settings). Its
//! content is an append-only DAG of immutable [`Record`]s linked by hash pointers; writers
//! sign some record names, and every other record is proven by a hash chain to a signed one
//! ([`RecordProof`]). This crate owns:
//!
//! - [`metadata`], [`record`]: encodings, names, body sealing (AES-256-GCM-SIV by default, or XChaCha20-Poly1305);
//! - [`dag`]: one replica's DAG with eager witnesses (shortest proofs), heads and roots;
//! - [`proof`]: hash-chain and subrecord proofs and their verifiers;
//! - [`cache`]: the reader's verification cache and the server's exact mirror of it;
//! - [`merkle`]: RFC 6962 trees: the per-capsule Merkle log and subrecord trees;
//! - [`server`]: the capsule server over a Cairn store (verify, persist, ack, prove);
//! - [`client`]: the writer and reader sides;
//! - [`bucket`]: every bucket is a capsule: object mutations as signed records, version proofs;
//! - [`seal`]: a bucket owner's seal over what a put stores, kept in the put's record;
//! - [`wire`]: the versioned wire protocol (requests, responses, sync messages), a sans-IO
//!   dispatcher and the TCP glue over `cairn-net`.
//!
//! Everything received is verified before it is stored or trusted; see each module.

#![warn(missing_docs)]

pub mod bucket;
pub mod cache;
pub mod client;
pub mod dag;
pub mod merkle;
pub mod metadata;
pub mod proof;
pub mod record;
pub mod riblt;
pub mod seal;
pub mod server;
pub mod sync;
pub mod wire;

pub use bucket::{Bucket, Mutation, MutationKind, VersionProof};
pub use cache::{CachePolicy, VerificationCache};
pub use client::{OWN_SIGNATURES, Reader, Writer};
pub use dag::{CapsuleDag, Witness};
pub use metadata::{BodyCipher, CapsuleMetadata, CapsuleName};
pub use proof::{
    Anchor, MAX_BATCH_SUBRECORDS, RecordProof, SubrecordGroup, SubrecordProof, SubrecordsProof,
    WriterSignature,
};
pub use record::{BodyKey, BodyRef, Record, RecordHeader, RecordName, SealedSubrecords};
pub use seal::{OWNER_SETTING, OwnerSeal, SealedPut, bucket_owner};
pub use server::{
    Ack, AckKind, ApplyReport, CapsuleServer, Checkpoint, DEFAULT_MAX_PROOF_BYTES,
    MAX_BATCH_ANSWER_BYTES, MAX_PROOF_BYTES, ServerOptions, SessionId, SyncBody, SyncCursor,
    SyncRecord, drop_idle,
};
pub use sync::{SessionSeal, SyncMsg, SyncReport, SyncSession, SyncState, sync_pair};
pub use wire::{
    CapsuleService, ErrorCode, MAX_SYNC_SUBRECORDS, RemoteCapsule, Request, Response, WireError,
    dispatch, serve_tcp,
};
