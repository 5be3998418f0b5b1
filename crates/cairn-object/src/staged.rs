//! Chunks a merge writes, held in memory until the merge is known to succeed.
//!
//! A merge may store versions and tree nodes on its way to an answer: the virtual base of
//! a criss-cross history, the pairwise merges of several untagged heads, the merged value
//! itself. When it ends in conflicts none of that may reach the store (an unresolved merge
//! writes nothing), so a merge runs on a view of the Db whose chunk writes land in a
//! [`Staged`] map; only a merge that moves a head [`Staged::flush`]es them to the store,
//! under the writers' lock it held throughout, before its ref commit. Reads see staged
//! chunks first, then the store. Staged bytes are bounded by the merge's memory limit.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::{ChunkStore, Cid, Durability, HashAlgo, RefStore, RefUpdate, StoreStats};
use parking_lot::Mutex;

/// A store view whose chunk writes are held in memory (see the module documentation).
/// Refs are read through to the store; a ref commit is refused.
pub(crate) struct Staged {
    inner: Arc<dyn cairn_store::Store>,
    chunks: Mutex<StagedChunks>,
    /// Most bytes of chunks held.
    limit: u64,
}

#[derive(Default)]
struct StagedChunks {
    map: HashMap<Cid, Bytes>,
    /// In the order first staged (the order the merge wrote them).
    order: Vec<Cid>,
    bytes: u64,
}

impl Staged {
    /// A view of `inner` holding at most `limit` bytes of new chunks.
    pub(crate) fn new(inner: Arc<dyn cairn_store::Store>, limit: u64) -> Self {
        Staged {
            inner,
            chunks: Mutex::new(StagedChunks::default()),
            limit,
        }
    }

    /// Writes every staged chunk to the store, in the order they were staged; returns how
    /// many there were.
    pub(crate) fn flush(&self) -> Result<usize> {
        let staged = std::mem::take(&mut *self.chunks.lock());
        for cid in &staged.order {
            if let Some(c) = staged.map.get(cid) {
                self.inner.put_hashed(*cid, c)?;
            }
        }
        Ok(staged.order.len())
    }
}

impl ChunkStore for Staged {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }

    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        cairn_store::check_cid_algo(&cid, self.inner.algo())?;
        if self.chunks.lock().map.contains_key(&cid) || self.inner.has(&cid)? {
            return Ok(false);
        }
        let mut s = self.chunks.lock();
        if s.map.contains_key(&cid) {
            return Ok(false);
        }
        let bytes = s.bytes.saturating_add(chunk.len() as u64);
        if bytes > self.limit {
            return Err(Error::invalid(format!(
                "the merge would write more than {} bytes of new chunks, its memory limit \
                 (they are held until the merge is known to succeed); nothing was merged",
                self.limit
            )));
        }
        s.bytes = bytes;
        s.map.insert(cid, Bytes::copy_from_slice(chunk));
        s.order.push(cid);
        Ok(true)
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        if let Some(c) = self.chunks.lock().map.get(cid) {
            return Ok(Some(c.clone()));
        }
        self.inner.get(cid)
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        Ok(self.chunks.lock().map.contains_key(cid) || self.inner.has(cid)?)
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        Err(Error::invalid("a merge's staged view lists no chunks"))
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        Err(Error::invalid("a merge's staged view removes no chunks"))
    }

    fn stats(&self) -> Result<StoreStats> {
        self.inner.stats()
    }
}

impl RefStore for Staged {
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>> {
        self.inner.get_ref(name)
    }

    fn list_refs(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.list_refs(prefix)
    }

    fn list_refs_from(
        &self,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.list_refs_from(prefix, from, limit)
    }

    fn commit(&self, _updates: &[RefUpdate]) -> Result<()> {
        Err(Error::invalid("a merge's staged view commits no refs"))
    }

    fn durability(&self) -> Durability {
        self.inner.durability()
    }
}
