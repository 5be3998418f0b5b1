//! An in-memory backend: a hash map of chunks and a sorted map of refs. Nothing survives the
//! process; reads still verify, so tests of upper layers exercise the same checks. Also
//! [`DigestStore`], which names chunks and keeps none (for computing what a tree's root
//! would be).

use std::collections::{BTreeMap, HashMap, HashSet};

use parking_lot::RwLock;

use crate::{
    Bytes, ChunkStore, Cid, Durability, Error, HashAlgo, RefStore, RefUpdate, Result, StoreStats,
};

/// Chunks and refs held in memory.
#[derive(Default)]
pub struct MemoryStore {
    algo: HashAlgo,
    chunks: RwLock<HashMap<Cid, Bytes>>,
    refs: RwLock<BTreeMap<Vec<u8>, Bytes>>,
    /// Chunks a read found failing their hash: a put of the chunk stores it again.
    damaged: RwLock<HashSet<Cid>>,
}

impl MemoryStore {
    /// An empty store naming chunks with BLAKE3.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store naming chunks with `algo`.
    pub fn with_algo(algo: HashAlgo) -> Self {
        MemoryStore {
            algo,
            ..Default::default()
        }
    }

    /// Test hook: overwrites a stored chunk's bytes without changing its cid, to simulate
    /// damage. Returns false when the chunk is absent.
    pub fn tamper(&self, cid: &Cid, bytes: Vec<u8>) -> bool {
        match self.chunks.write().get_mut(cid) {
            Some(slot) => {
                *slot = Bytes::from(bytes);
                true
            }
            None => false,
        }
    }
}

impl ChunkStore for MemoryStore {
    fn algo(&self) -> HashAlgo {
        self.algo
    }

    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        crate::check_cid_algo(&cid, self.algo)?;
        let mut map = self.chunks.write();
        if map.contains_key(&cid) && !self.damaged.read().contains(&cid) {
            return Ok(false);
        }
        map.insert(cid, Bytes::copy_from_slice(chunk));
        self.damaged.write().remove(&cid);
        Ok(true)
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let Some(bytes) = self.chunks.read().get(cid).cloned() else {
            return Ok(None);
        };
        if !cid.matches(&bytes) {
            self.damaged.write().insert(*cid);
            return Err(Error::corrupt(format!(
                "chunk {cid} does not match its hash"
            )));
        }
        Ok(Some(bytes))
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        Ok(self.chunks.read().contains_key(cid) && !self.damaged.read().contains(cid))
    }

    fn chunk_len(&self, cid: &Cid) -> Result<Option<u64>> {
        Ok(self.chunks.read().get(cid).map(|b| b.len() as u64))
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        Ok(self.chunks.read().keys().copied().collect())
    }

    fn remove(&self, cids: &[Cid]) -> Result<()> {
        let mut map = self.chunks.write();
        let mut damaged = self.damaged.write();
        for c in cids {
            map.remove(c);
            damaged.remove(c);
        }
        Ok(())
    }

    fn stats(&self) -> Result<StoreStats> {
        let map = self.chunks.read();
        let chunk_bytes: u64 = map.values().map(|b| b.len() as u64).sum();
        Ok(StoreStats {
            chunks: map.len() as u64,
            chunk_bytes,
            bytes_on_disk: 0,
        })
    }
}

/// A chunk store that names every chunk put into it and keeps none: building a value
/// into it computes the cids (a POS-tree's root) that the same value has in any store of
/// the same hash algorithm, in memory bounded by the builder alone. Every get answers
/// absent.
#[derive(Clone, Copy, Debug, Default)]
pub struct DigestStore {
    algo: HashAlgo,
}

impl DigestStore {
    /// A store naming chunks with `algo`.
    pub fn new(algo: HashAlgo) -> Self {
        DigestStore { algo }
    }
}

impl ChunkStore for DigestStore {
    fn algo(&self) -> HashAlgo {
        self.algo
    }

    fn put_hashed(&self, cid: Cid, _chunk: &[u8]) -> Result<bool> {
        crate::check_cid_algo(&cid, self.algo)?;
        Ok(true)
    }

    fn get(&self, _cid: &Cid) -> Result<Option<Bytes>> {
        Ok(None)
    }

    fn has(&self, _cid: &Cid) -> Result<bool> {
        Ok(false)
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        Ok(Vec::new())
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> Result<StoreStats> {
        Ok(StoreStats::default())
    }
}

impl RefStore for MemoryStore {
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.refs.read().get(name).cloned())
    }

    fn list_refs(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>> {
        self.list_refs_from(prefix, prefix, usize::MAX)
    }

    fn list_refs_from(
        &self,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        Ok(self
            .refs
            .read()
            .range(prefix.max(from).to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (Bytes::copy_from_slice(k), v.clone()))
            .collect())
    }

    fn commit(&self, updates: &[RefUpdate]) -> Result<()> {
        let mut refs = self.refs.write();
        for u in updates {
            match u {
                RefUpdate::Set { name, value } => {
                    refs.insert(name.clone(), Bytes::copy_from_slice(value));
                }
                RefUpdate::Delete { name } => {
                    refs.remove(name);
                }
            }
        }
        Ok(())
    }

    fn durability(&self) -> Durability {
        Durability::Buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_dedup_and_tamper() {
        let s = MemoryStore::new();
        let a = s.put(b"hello").unwrap();
        assert_eq!(s.put(b"hello").unwrap(), a);
        assert_eq!(s.stats().unwrap().chunks, 1);
        assert_eq!(&s.get(&a).unwrap().unwrap()[..], b"hello");
        assert!(s.tamper(&a, b"jello".to_vec()));
        assert!(matches!(s.get(&a), Err(Error::Corrupt(_))));
        s.remove(&[a]).unwrap();
        assert!(s.get(&a).unwrap().is_none());
    }

    #[test]
    fn refs_commit_and_prefix() {
        let s = MemoryStore::new();
        s.commit(&[
            RefUpdate::Set {
                name: b"k/a".to_vec(),
                value: b"1".to_vec(),
            },
            RefUpdate::Set {
                name: b"k/b".to_vec(),
                value: b"2".to_vec(),
            },
            RefUpdate::Set {
                name: b"l/a".to_vec(),
                value: b"3".to_vec(),
            },
        ])
        .unwrap();
        assert_eq!(s.list_refs(b"k/").unwrap().len(), 2);
        s.commit(&[RefUpdate::Delete {
            name: b"k/a".to_vec(),
        }])
        .unwrap();
        assert_eq!(s.list_refs(b"k/").unwrap().len(), 1);
        assert!(s.get_ref(b"k/a").unwrap().is_none());
    }
}
