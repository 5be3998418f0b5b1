//! Chunk storage for Cairn.
//!
//! This crate owns the two things every higher layer persists:
//!
//! - **chunks** ([`ChunkStore`]): immutable byte strings named by their hash (cid), stored
//!   once however often they are written, and verified against their cid on every read;
//! - **refs** ([`RefStore`]): a small set of named, mutable values (the branch tables of
//!   `cairn-object`) updated by atomic batches. A [`RefStore::commit`] is the durability
//!   point: when it returns, the batch *and every chunk put before it* survive a crash at
//!   the store's [`Durability`] level.
//!
//! Backends: [`MemoryStore`] (tests, benchmarks of upper layers); [`DigestStore`], which
//! keeps nothing and only names chunks (hashing a value's tree without storing it);
//! [`LogStore`], the embedded default: append-only segment files with an in-memory index
//! (see `log.rs` and `docs/architecture.md` for the on-disk format and why); and, behind
//! the `object-store` feature, `object::ObjectChunkStore` (chunks in S3, Azure Blob, GCS
//! or a directory) with `object::SplitStore` pairing it with a ref store.

#![warn(missing_docs)]

pub mod log;
pub mod memory;
#[cfg(feature = "object-store")]
pub mod object;

use std::fmt;
use std::str::FromStr;

pub use bytes::Bytes;
pub use cairn_core::{Error, Hash, HashAlgo, Result};
pub use log::{CommitCounters, LogStore, LogStoreOptions, RecoveryReport};
pub use memory::{DigestStore, MemoryStore};

/// A chunk's name: the hash of its bytes.
pub type Cid = Hash;

/// How much a store promises about acknowledged writes when the process or machine dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every commit is written and `fdatasync`ed before it returns, one sync per commit.
    /// Survives kill -9 and power loss.
    PerWrite,
    /// Group commit: a commit returns only after an `fdatasync` that covers it, but
    /// concurrent commits share one sync (leader/follower, no added delay for a lone
    /// writer). Same guarantee as [`Durability::PerWrite`]; higher throughput under
    /// concurrency. The default.
    #[default]
    Group,
    /// A commit returns once its bytes are handed to the operating system (`write(2)`), with
    /// no sync. Survives kill -9 of the process, not power loss or a kernel crash.
    Buffered,
}

impl Durability {
    /// All levels, strongest first.
    pub const ALL: [Durability; 3] = [
        Durability::PerWrite,
        Durability::Group,
        Durability::Buffered,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Durability::PerWrite => "fsync",
            Durability::Group => "group",
            Durability::Buffered => "buffered",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fsync" | "per-write" => Ok(Durability::PerWrite),
            "group" | "group-commit" => Ok(Durability::Group),
            "buffered" | "none" => Ok(Durability::Buffered),
            other => Err(Error::invalid(format!(
                "unknown durability {other:?} (expected fsync, group or buffered)"
            ))),
        }
    }
}

/// Counters describing a store's contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Distinct live chunks.
    pub chunks: u64,
    /// Sum of the lengths of the distinct live chunks (what dedup leaves to store).
    pub chunk_bytes: u64,
    /// Bytes the backend occupies, framing and not-yet-compacted garbage included.
    pub bytes_on_disk: u64,
}

/// Immutable, content-addressed, deduplicated chunk storage.
///
/// Implementations verify every chunk they return against its cid and report a mismatch as
/// [`Error::Corrupt`] naming the cid; they never hand out unverified bytes.
pub trait ChunkStore: Send + Sync {
    /// The hash algorithm that names this store's chunks.
    fn algo(&self) -> HashAlgo;

    /// Stores `chunk` (if not already present) and returns its cid.
    fn put(&self, chunk: &[u8]) -> Result<Cid> {
        let cid = self.algo().digest(chunk);
        self.put_hashed(cid, chunk)?;
        Ok(cid)
    }

    /// Stores `chunk` under `cid`, which the caller has already computed as the hash of
    /// `chunk` with [`ChunkStore::algo`] (saves hashing twice on the write path). Returns
    /// true when the chunk was new. A wrong cid is a caller bug: reads would report the
    /// chunk corrupt. A chunk a read found damaged counts as absent (the put stores it
    /// again, and reads then find the new copy), as it does for [`ChunkStore::has`]: that
    /// is how a good copy from elsewhere repairs it.
    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool>;

    /// Stores several chunks; returns their cids in order.
    fn put_batch(&self, chunks: &[&[u8]]) -> Result<Vec<Cid>> {
        chunks.iter().map(|c| self.put(c)).collect()
    }

    /// Fetches a chunk, verified against `cid`. `Ok(None)` when absent.
    fn get(&self, cid: &Cid) -> Result<Option<Bytes>>;

    /// Checks, before a commit names them, that the chunks put so far went where they will
    /// stay: for a backend whose storage can be replaced under it (an object store's
    /// bucket wiped, a volume unmounted), a check made after every put acknowledged
    /// before this call. Nothing to do for the others.
    fn fence(&self) -> Result<()> {
        Ok(())
    }

    /// Fetches several chunks, in order (`None` for an absent one), each verified against
    /// its cid exactly as [`ChunkStore::get`] does. Backends that keep chunks written
    /// together side by side read such neighbours with one request (a blob's leaves, read
    /// in order).
    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        cids.iter().map(|c| self.get(c)).collect()
    }

    /// True when the chunk is present (no verification), and not known to be damaged (a
    /// read found it failing its hash).
    fn has(&self, cid: &Cid) -> Result<bool>;

    /// The length of chunk `cid` if present, learned without reading it where the backend
    /// can (the local log's index, an object's metadata); others read it. For sizing a
    /// read before making it (a server takes a large answer's memory from its budget
    /// first): unverified, so only what a later [`ChunkStore::get`] returns is the chunk.
    fn chunk_len(&self, cid: &Cid) -> Result<Option<u64>> {
        Ok(self.get(cid)?.map(|b| b.len() as u64))
    }

    /// Every live cid, in no particular order (for GC and verification).
    fn cids(&self) -> Result<Vec<Cid>>;

    /// Forgets the given chunks (GC sweep). Space is reclaimed by the backend in its own
    /// time (see [`ChunkStore::compact`]). Absent cids are ignored.
    fn remove(&self, cids: &[Cid]) -> Result<()>;

    /// Removes `groups` one after another: no chunk of a group is removed before every
    /// chunk of the groups before it, so a removal cut short (an error, a crash) has
    /// removed a prefix of the groups and part of one. The default calls
    /// [`ChunkStore::remove`] once per group, for backends whose `remove` works in
    /// parallel (object stores delete in concurrent batches); a backend whose `remove`
    /// applies its list in order may take all groups at once.
    fn remove_in_order(&self, groups: &[Vec<Cid>]) -> Result<()> {
        for g in groups.iter().filter(|g| !g.is_empty()) {
            self.remove(g)?;
        }
        Ok(())
    }

    /// Reclaims space held by removed chunks, where the backend needs a separate step.
    /// Returns the bytes reclaimed.
    fn compact(&self) -> Result<u64> {
        Ok(0)
    }

    /// Current counters.
    fn stats(&self) -> Result<StoreStats>;

    /// Damage that crash recovery found and repaired around (records lost to bit rot,
    /// commits cut because their group was not durably written), kept until
    /// [`ChunkStore::clear_recovery_notes`]. Empty for a healthy store.
    fn recovery_notes(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Forgets the recovery notes (after an operator has dealt with them).
    fn clear_recovery_notes(&self) -> Result<()> {
        Ok(())
    }
}

/// Rejects a cid made with another hash algorithm than the store's (every backend's
/// `put_hashed` starts with this).
pub fn check_cid_algo(cid: &Cid, algo: HashAlgo) -> Result<()> {
    if cid.algo() != algo {
        return Err(Error::invalid(format!(
            "cid {cid:?} uses {} but this store uses {algo}",
            cid.algo()
        )));
    }
    Ok(())
}

/// One change in a [`RefStore::commit`] batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefUpdate {
    /// Sets `name` to `value`.
    Set {
        /// Ref name.
        name: Vec<u8>,
        /// New value.
        value: Vec<u8>,
    },
    /// Deletes `name` (no-op when absent).
    Delete {
        /// Ref name.
        name: Vec<u8>,
    },
}

/// Small named mutable values, changed by atomic, durable batches.
pub trait RefStore: Send + Sync {
    /// Reads a ref.
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>>;

    /// All refs whose name starts with `prefix`, sorted by name.
    fn list_refs(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>>;

    /// At most `limit` refs whose name starts with `prefix` and is not below `from`, sorted
    /// by name: one page of [`RefStore::list_refs`], costing the page rather than every
    /// ref under the prefix in the ordered backends.
    fn list_refs_from(
        &self,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        let mut all = self.list_refs(prefix)?;
        let start = all.partition_point(|(k, _)| k.as_ref() < from);
        all.truncate(start.saturating_add(limit).min(all.len()));
        Ok(all.split_off(start))
    }

    /// Applies `updates` atomically: after a crash either all or none are visible. When it
    /// returns, the batch and every chunk put before the call are durable at the store's
    /// [`Durability`].
    fn commit(&self, updates: &[RefUpdate]) -> Result<()>;

    /// The durability level commits get.
    fn durability(&self) -> Durability;

    /// Why the store refuses every write until it is reopened, if it does: after a write
    /// or `fdatasync` failed (a full disk, an I/O error), what reached the disk is no
    /// longer known, so a store stops taking writes rather than acknowledge one it cannot
    /// vouch for. Reads go on. `None` for backends that never enter that state.
    fn write_failure(&self) -> Option<String> {
        None
    }
}

/// A complete backend: chunks plus refs.
pub trait Store: ChunkStore + RefStore {}
impl<T: ChunkStore + RefStore> Store for T {}
