//! A test store shared by the capsule tests: a memory store whose commits pass through a
//! gate first, to inject a failing disk (a journal that cannot be written, a store that
//! refuses every commit).

use cairn_core::{Hash, HashAlgo, Result};
use cairn_store::{Bytes, ChunkStore, MemoryStore, RefStore, RefUpdate, StoreStats};

/// Decides whether a commit goes through (`Ok`) or fails with the error it returns.
type Gate = Box<dyn Fn(&[RefUpdate]) -> Result<()> + Send + Sync>;

/// A [`MemoryStore`] whose every commit is first shown to a gate.
pub struct GatedCommits {
    /// The store underneath (reads, chunk writes and passed commits go to it).
    pub inner: MemoryStore,
    gate: Gate,
}

impl GatedCommits {
    /// An empty store whose commits `gate` lets through or fails.
    pub fn new(gate: impl Fn(&[RefUpdate]) -> Result<()> + Send + Sync + 'static) -> Self {
        GatedCommits {
            inner: MemoryStore::new(),
            gate: Box::new(gate),
        }
    }
}

impl ChunkStore for GatedCommits {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }
    fn put_hashed(&self, cid: Hash, chunk: &[u8]) -> Result<bool> {
        self.inner.put_hashed(cid, chunk)
    }
    fn get(&self, cid: &Hash) -> Result<Option<Bytes>> {
        self.inner.get(cid)
    }
    fn has(&self, cid: &Hash) -> Result<bool> {
        self.inner.has(cid)
    }
    fn cids(&self) -> Result<Vec<Hash>> {
        self.inner.cids()
    }
    fn remove(&self, cids: &[Hash]) -> Result<()> {
        self.inner.remove(cids)
    }
    fn stats(&self) -> Result<StoreStats> {
        self.inner.stats()
    }
}

impl RefStore for GatedCommits {
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>> {
        self.inner.get_ref(name)
    }
    fn list_refs(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.list_refs(prefix)
    }
    fn commit(&self, updates: &[RefUpdate]) -> Result<()> {
        (self.gate)(updates)?;
        self.inner.commit(updates)
    }
    fn durability(&self) -> cairn_store::Durability {
        self.inner.durability()
    }
}
