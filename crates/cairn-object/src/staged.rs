//! Chunks a merge writes, held in memory until the merge is known to succeed.
//!
//! A merge may store versions and tree nodes on its way to an answer: the virtual base of
//! a criss-cross history, the pairwise merges of several untagged heads, the merged value
//! itself. When it ends in conflicts none of that may reach the store (an unresolved merge
//! writes nothing), so a merge runs on a view of the Db whose chunk writes land in a
//! [`Staged`] map; only a merge that moves a head writes them to the store
//! ([`Staged::flush_reachable`]: those its new version reaches, so not a virtual base or
//! the intermediate merges of several heads), under the writers' lock it held throughout,
//! before its ref commit. Reads see staged chunks first, then the store. Staged bytes are
//! bounded by the merge's memory limit (besides what the merge itself holds against it).
//! A chunk the store already has is not staged but put to the store at once, which adds
//! nothing to a sound store and lets the store's own checks (an object store syncs or
//! rewrites a copy it only sighted) vouch for the copy the new version will rest on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::{ChunkStore, Cid, Durability, HashAlgo, RefStore, RefUpdate, StoreStats};
use parking_lot::Mutex;

use crate::chunk::{self, ChunkKind};
use crate::fobject::FObject;
use crate::postree;

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
    /// Bytes of the chunks in `map`.
    bytes: u64,
    /// Chunks the merge wrote that the store had already (put to it, not staged), with the
    /// chunks they point to: those are followed all the same, since a chunk in the store
    /// does not vouch for its subtree (a flush cut short leaves parents whose children
    /// never came). Kept from the put, so the walk reads nothing back.
    through: HashMap<Cid, Vec<Cid>>,
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

    /// The staged chunks `root` reaches, children before parents. The walk goes through
    /// the chunks the merge wrote (staged, or put to the store because it had them) and
    /// stops at any other: those belong to versions already complete in the store.
    fn reachable(&self, root: &Cid) -> Result<Vec<Cid>> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        // (chunk, whether its children were pushed already: it is emitted then).
        let mut stack = vec![(*root, false)];
        while let Some((cid, expanded)) = stack.pop() {
            if expanded {
                out.push(cid);
                continue;
            }
            if !seen.insert(cid) {
                continue;
            }
            let children = {
                let s = self.chunks.lock();
                match (s.map.get(&cid), s.through.get(&cid)) {
                    (Some(bytes), _) => {
                        stack.push((cid, true));
                        children(bytes)?
                    }
                    (None, Some(children)) => children.clone(),
                    (None, None) => continue,
                }
            };
            stack.extend(children.into_iter().map(|c| (c, false)));
        }
        Ok(out)
    }

    /// Drops every staged chunk `root` does not reach (between the pairwise merges of
    /// several heads, what the running result no longer needs).
    pub(crate) fn retain_reachable(&self, root: &Cid) -> Result<()> {
        let keep: std::collections::HashSet<Cid> = self.reachable(root)?.into_iter().collect();
        let mut s = self.chunks.lock();
        let StagedChunks { map, bytes, .. } = &mut *s;
        map.retain(|cid, _| keep.contains(cid));
        *bytes = map.values().map(|c| c.len() as u64).sum();
        Ok(())
    }

    /// Writes the staged chunks `root` (the merge's new version) reaches to the store,
    /// children before parents, and drops the rest; returns how many were written.
    pub(crate) fn flush_reachable(&self, root: &Cid) -> Result<usize> {
        let reached = self.reachable(root)?;
        let staged = std::mem::take(&mut *self.chunks.lock());
        // Children first: a flush cut short leaves no parent without its children.
        for cid in &reached {
            if let Some(c) = staged.map.get(cid) {
                self.inner.put_hashed(*cid, c)?;
            }
        }
        Ok(reached.len())
    }
}

/// The chunks `bytes` (a chunk of a version or its tree) points to: a version's bases and
/// value tree root, an index node's children.
fn children(bytes: &[u8]) -> Result<Vec<Cid>> {
    Ok(match chunk::parse(bytes)? {
        (ChunkKind::Meta, _) => {
            let o = FObject::from_chunk(bytes)?;
            let mut out = o.bases;
            if let Some(t) = o.value.tree() {
                out.push(t.root);
            }
            out
        }
        (ChunkKind::UIndex | ChunkKind::SIndex, _) => postree::child_cids(bytes)?,
        _ => Vec::new(),
    })
}

impl ChunkStore for Staged {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }

    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        cairn_store::check_cid_algo(&cid, self.inner.algo())?;
        // The map's lock is not held across the store's I/O.
        if self.chunks.lock().map.contains_key(&cid) {
            return Ok(false);
        }
        if self.inner.has(&cid)? {
            // Not staged (nor followed by `reachable`): the version will rest on the
            // store's copy, so the store's own put checks it, as for any put. A `has`
            // may be only a sighting (an object store's HEAD: any object of that name,
            // perhaps cut short or not yet synced); the put syncs or rewrites such a
            // chunk, and leaves a sound one as it is, writing nothing.
            let new = self.inner.put_hashed(cid, chunk)?;
            // (Bytes that are no version or tree node point to nothing.)
            let children = children(chunk).unwrap_or_default();
            self.chunks.lock().through.insert(cid, children);
            return Ok(new);
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
        Ok(true)
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let staged = self.chunks.lock().map.get(cid).cloned();
        match staged {
            Some(c) => Ok(Some(c)),
            None => self.inner.get(cid),
        }
    }

    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        // Staged ones from the map, the rest from the store in one call (a backend reads
        // neighbours together).
        let mut out: Vec<Option<Bytes>> = {
            let s = self.chunks.lock();
            cids.iter().map(|c| s.map.get(c).cloned()).collect()
        };
        let missing: Vec<Cid> = cids
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(c, _)| *c)
            .collect();
        if missing.is_empty() {
            return Ok(out);
        }
        let mut fetched = self.inner.get_many(&missing)?.into_iter();
        for slot in out.iter_mut().filter(|o| o.is_none()) {
            *slot = fetched.next().flatten();
        }
        Ok(out)
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        let staged = self.chunks.lock().map.contains_key(cid);
        Ok(staged || self.inner.has(cid)?)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use cairn_core::Error;
    use cairn_store::{ChunkStore, MemoryStore};

    use cairn_store::{Cid, Durability, HashAlgo, RefStore, RefUpdate, StoreStats};
    use parking_lot::Mutex;

    use super::Staged;
    use crate::db::Db;
    use crate::fobject::FObject;
    use crate::postree::TreeConfig;
    use crate::value::NewValue;

    /// Only what the flushed version reaches is written (not an abandoned one staged
    /// beside it); dropping what a version does not reach frees it; past the limit a
    /// write is refused and nothing is written.
    #[test]
    fn only_what_the_new_version_reaches_is_written() {
        let store = Arc::new(MemoryStore::new());
        let cfg = TreeConfig {
            leaf_target: 128,
            index_target: 256,
        };
        let db = Db::with_config(store.clone(), cfg).with_merge_memory(1 << 20);
        let (view, staged) = db.staged_view();
        let version = |seed: u8| {
            let blob: Vec<u8> = (0..5000u32).map(|i| (i as u8) ^ seed).collect();
            let value = view.store_value(NewValue::Blob(blob)).unwrap();
            view.store_object(&FObject {
                key: Bytes::from_static(b"k"),
                value,
                depth: 0,
                bases: Vec::new(),
                context: Bytes::new(),
            })
            .unwrap()
        };
        let kept = version(1);
        let dropped = version(2);
        assert!(
            store.cids().unwrap().is_empty(),
            "nothing written while staged"
        );
        assert!(view.load(&dropped).is_ok(), "reads see staged chunks");
        staged.retain_reachable(&kept).unwrap();
        assert!(view.load(&dropped).is_err(), "dropped");
        let n = staged.flush_reachable(&kept).unwrap();
        assert_eq!(store.cids().unwrap().len(), n);
        assert!(n > 3, "the version and its tree");
        let v = db.load(&kept).unwrap();
        let t = v.value.tree().unwrap();
        let read = crate::postree::blob_read(db.chunks(), t, 0, t.count).unwrap();
        assert_eq!(read.len(), 5000);

        let small = Db::new(Arc::new(MemoryStore::new())).with_merge_memory(100);
        let (view, _staged) = small.staged_view();
        let e = view.store_value(NewValue::Blob(vec![7; 5000])).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
        assert!(small.store().cids().unwrap().is_empty());
    }

    /// A memory store that notes every chunk put to it.
    #[derive(Default)]
    struct NotedPuts {
        inner: MemoryStore,
        puts: Mutex<Vec<Cid>>,
    }

    impl ChunkStore for NotedPuts {
        fn algo(&self) -> HashAlgo {
            self.inner.algo()
        }
        fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> cairn_core::Result<bool> {
            self.puts.lock().push(cid);
            self.inner.put_hashed(cid, chunk)
        }
        fn get(&self, cid: &Cid) -> cairn_core::Result<Option<Bytes>> {
            self.inner.get(cid)
        }
        fn has(&self, cid: &Cid) -> cairn_core::Result<bool> {
            self.inner.has(cid)
        }
        fn cids(&self) -> cairn_core::Result<Vec<Cid>> {
            self.inner.cids()
        }
        fn remove(&self, cids: &[Cid]) -> cairn_core::Result<()> {
            self.inner.remove(cids)
        }
        fn stats(&self) -> cairn_core::Result<StoreStats> {
            self.inner.stats()
        }
    }

    impl RefStore for NotedPuts {
        fn get_ref(&self, name: &[u8]) -> cairn_core::Result<Option<Bytes>> {
            self.inner.get_ref(name)
        }
        fn list_refs(&self, prefix: &[u8]) -> cairn_core::Result<Vec<(Bytes, Bytes)>> {
            self.inner.list_refs(prefix)
        }
        fn list_refs_from(
            &self,
            prefix: &[u8],
            from: &[u8],
            limit: usize,
        ) -> cairn_core::Result<Vec<(Bytes, Bytes)>> {
            self.inner.list_refs_from(prefix, from, limit)
        }
        fn commit(&self, updates: &[RefUpdate]) -> cairn_core::Result<()> {
            self.inner.commit(updates)
        }
        fn durability(&self) -> Durability {
            self.inner.durability()
        }
    }

    /// A chunk the store says it has is put to the store, not staged: the version rests
    /// on the store's copy, so the store's put must check it (an object store's `has` is
    /// a sighting of some object of that name, which its put syncs or rewrites when it
    /// is cut short). A new chunk is only staged.
    #[test]
    fn a_chunk_the_store_has_goes_through_the_stores_put() {
        let store = Arc::new(NotedPuts::default());
        let present = b"present chunk".to_vec();
        let cid = store.put(&present).unwrap();
        store.puts.lock().clear();
        let staged = Staged::new(store.clone(), 1 << 20);
        assert!(!staged.put_hashed(cid, &present).unwrap());
        assert_eq!(*store.puts.lock(), vec![cid], "put to the store");
        assert!(staged.chunks.lock().map.is_empty(), "not staged");
        let new = b"new chunk".to_vec();
        let new_cid = store.algo().digest(&new);
        assert!(staged.put_hashed(new_cid, &new).unwrap());
        assert_eq!(
            store.puts.lock().len(),
            1,
            "a new chunk waits for the flush"
        );
        assert!(!store.has(&new_cid).unwrap());
    }

    /// A chunk the store already has (an index node a flush cut short left behind, its
    /// leaf never written) does not stop the walk: the leaf the new version needs below it
    /// is written. It was dropped, and the merge acknowledged a head no read could get.
    #[test]
    fn a_chunk_left_in_the_store_without_its_children_does_not_hide_them() {
        let store = Arc::new(MemoryStore::new());
        let cfg = TreeConfig {
            leaf_target: 128,
            index_target: 256,
        };
        let db = Db::with_config(store.clone(), cfg).with_merge_memory(1 << 20);
        let blob: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let version = |view: &Db| {
            let value = view.store_value(NewValue::Blob(blob.clone())).unwrap();
            view.store_object(&FObject {
                key: Bytes::from_static(b"k"),
                value,
                depth: 0,
                bases: Vec::new(),
                context: Bytes::new(),
            })
            .unwrap()
        };
        // An index node of the version, and its children, as a first merge staged them.
        let (view, staged) = db.staged_view();
        let v = version(&view);
        let (index, index_bytes) = {
            let s = staged.chunks.lock();
            s.map
                .iter()
                .find(|(_, b)| {
                    matches!(
                        crate::chunk::parse(b).unwrap().0,
                        crate::chunk::ChunkKind::UIndex
                    )
                })
                .map(|(c, b)| (*c, b.clone()))
                .unwrap()
        };
        drop((view, staged));
        // That flush was cut short: the index node reached the store, its leaves did not.
        store.put_hashed(index, &index_bytes).unwrap();
        let (view, staged) = db.staged_view();
        assert_eq!(version(&view), v);
        staged.flush_reachable(&v).unwrap();
        for child in crate::postree::child_cids(&index_bytes).unwrap() {
            assert!(
                store.has(&child).unwrap(),
                "child {child} of the index node"
            );
        }
        let t = *db.load(&v).unwrap().value.tree().unwrap();
        let read = crate::postree::blob_read(db.chunks(), &t, 0, t.count).unwrap();
        assert_eq!(read, blob);
    }
}
