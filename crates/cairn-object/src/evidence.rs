//! Checkable answers to history queries (ForkBase's Diff and LCA, Table 1 M16 and M17) for
//! a client that trusts nothing but uids.
//!
//! A node runs the query over a [`RecordingChunks`] view of its store, which keeps every
//! chunk the query reads, and sends those chunks as frames of a verified stream (see
//! [`crate::stream`]). The client stores each chunk under its own hash (any
//! [`ChunkStore`], such as `cairn_store::MemoryStore`) and runs the same query, with the
//! same arguments, over them: [`check_diff_page`], [`check_lca`]. Every chunk the query
//! reaches is the one its parent (or the uid) names, so the answer is the true answer for
//! those versions; a chunk left out makes the query fail instead of changing its answer.
//! What a node is still trusted for is only which uid a branch name stands for.

use std::collections::HashSet;

use bytes::Bytes;
use cairn_core::{Error, HashAlgo, Result};
use cairn_store::{ChunkStore, Cid, StoreStats};
use parking_lot::Mutex;

use crate::fobject::Uid;
use crate::history::{Diff, DiffCursor, diff_page_in, lca_in, load_version};

/// Most bytes of chunks one answer carries (8 MiB): the node builds an answer in memory
/// before sending it, so this bounds what each transfer holds, as a streamed download's
/// buffers are bounded, and the client's memory. A diff page that reads more is retried
/// with fewer changes ([`diff_page_evidence`]).
pub const EVIDENCE_BUDGET: u64 = 8 << 20;

/// A read-only view of a chunk store that keeps every distinct chunk read through it, in
/// the order first read, up to a byte budget (a read past it fails).
pub struct RecordingChunks<'a> {
    inner: &'a dyn ChunkStore,
    budget: u64,
    state: Mutex<Recorded>,
}

#[derive(Default)]
struct Recorded {
    seen: HashSet<Cid>,
    chunks: Vec<Bytes>,
    bytes: u64,
    over: bool,
}

impl<'a> RecordingChunks<'a> {
    /// Records reads of `inner`, at most `budget` bytes of distinct chunks.
    pub fn new(inner: &'a dyn ChunkStore, budget: u64) -> Self {
        RecordingChunks {
            inner,
            budget,
            state: Mutex::new(Recorded::default()),
        }
    }

    /// True when a read went past the budget (and failed).
    pub fn over_budget(&self) -> bool {
        self.state.lock().over
    }

    /// The chunks read, in the order first read.
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.state.into_inner().chunks
    }

    fn note(&self, cid: &Cid, chunk: &Bytes) -> Result<()> {
        let mut s = self.state.lock();
        if !s.seen.insert(*cid) {
            return Ok(());
        }
        s.bytes += chunk.len() as u64;
        if s.bytes > self.budget {
            s.over = true;
            return Err(Error::invalid(format!(
                "the query reads more than {} bytes of chunks",
                self.budget
            )));
        }
        s.chunks.push(chunk.clone());
        Ok(())
    }
}

impl ChunkStore for RecordingChunks<'_> {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }

    fn put_hashed(&self, _cid: Cid, _chunk: &[u8]) -> Result<bool> {
        Err(Error::invalid("a recording view of a store is read-only"))
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let got = self.inner.get(cid)?;
        if let Some(c) = &got {
            self.note(cid, c)?;
        }
        Ok(got)
    }

    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        let got = self.inner.get_many(cids)?;
        for (cid, c) in cids.iter().zip(&got) {
            if let Some(c) = c {
                self.note(cid, c)?;
            }
        }
        Ok(got)
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        // A query that only asks whether a chunk exists would give the client nothing to
        // check; record the chunk so the client's `has` answers the same.
        Ok(self.get(cid)?.is_some())
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        Err(Error::invalid(
            "a recording view of a store does not list chunks",
        ))
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        Err(Error::invalid("a recording view of a store is read-only"))
    }

    fn stats(&self) -> Result<StoreStats> {
        self.inner.stats()
    }
}

/// Node side of a diff page: runs [`crate::Db::diff_values_page`] between versions `a`
/// and `b` of `key` over `chunks`, recording what it reads. Returns the chunks (the two
/// Meta chunks first) and the page size used: `limit`, or less when a page of `limit`
/// changes reads more than `budget` bytes (the client checks the page at that size, and
/// the cursor of its last change goes on from there). A single change that reads more
/// than `budget` is [`Error::InvalidInput`].
pub fn diff_page_evidence(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    after: Option<&DiffCursor>,
    limit: usize,
    budget: u64,
) -> Result<(Vec<Bytes>, usize)> {
    let mut limit = limit;
    loop {
        let rec = RecordingChunks::new(chunks, budget);
        let run = || -> Result<()> {
            let va = load_version(&rec, key, a)?;
            let vb = load_version(&rec, key, b)?;
            diff_page_in(&rec, &va.value, &vb.value, after, limit).map(|_| ())
        };
        match run() {
            Ok(()) => return Ok((rec.into_chunks(), limit)),
            Err(_) if rec.over_budget() && limit > 1 => limit = (limit / 4).max(1),
            Err(e) => return Err(e),
        }
    }
}

/// Client side of a diff page: the page between versions `a` and `b` of `key`, computed
/// from `chunks` (each stored under its own hash) with the arguments the node used. Any
/// failure (a chunk missing, a version of another key) means the chunks do not support a
/// page, and is [`Error::Rejected`].
pub fn check_diff_page(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    after: Option<&DiffCursor>,
    limit: usize,
) -> Result<(Diff, Option<DiffCursor>)> {
    let run = || {
        let va = load_version(chunks, key, a)?;
        let vb = load_version(chunks, key, b)?;
        diff_page_in(chunks, &va.value, &vb.value, after, limit)
    };
    run().map_err(|e| Error::Rejected(format!("the chunks sent do not give the diff: {e}")))
}

/// Node side of an LCA: runs [`crate::Db::lca`] over `chunks`, recording the Meta chunks
/// it reads (`a`'s and `b`'s first).
pub fn lca_evidence(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    budget: u64,
) -> Result<Vec<Bytes>> {
    let rec = RecordingChunks::new(chunks, budget);
    lca_in(&rec, key, a, b)?;
    Ok(rec.into_chunks())
}

/// Client side of an LCA: the least common ancestor of versions `a` and `b` of `key`,
/// computed from `chunks`. `None` (disjoint histories) only when every ancestor of both was
/// sent; any failure is [`Error::Rejected`].
pub fn check_lca(chunks: &dyn ChunkStore, key: &[u8], a: &Uid, b: &Uid) -> Result<Option<Uid>> {
    lca_in(chunks, key, a, b).map_err(|e| {
        Error::Rejected(format!(
            "the chunks sent do not give the common ancestor: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_store::MemoryStore;

    use super::*;
    use crate::db::{At, Db, PutOptions, Target};
    use crate::value::NewValue;

    fn replay(chunks: &[Bytes], algo: HashAlgo) -> MemoryStore {
        let m = MemoryStore::with_algo(algo);
        for c in chunks {
            m.put(c).unwrap();
        }
        m
    }

    fn map(entries: impl IntoIterator<Item = (String, String)>) -> NewValue {
        NewValue::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
        )
    }

    #[test]
    fn a_diff_page_checks_out_from_the_chunks_sent_and_fails_without_any_of_them() {
        let db = Db::new(Arc::new(MemoryStore::default()));
        let base: Vec<(String, String)> = (0..3000)
            .map(|i| {
                (
                    format!("key{i:05}"),
                    format!("value {i} {}", "x".repeat(40)),
                )
            })
            .collect();
        let a = db
            .put(
                b"m",
                Target::Branch("master"),
                map(base.clone()),
                &PutOptions::default(),
            )
            .unwrap();
        let mut changed = base.clone();
        for i in [5usize, 700, 1400, 2999] {
            changed[i].1 = format!("changed {i}");
        }
        changed.push(("key99999".into(), "new".into()));
        let b = db
            .put(
                b"m",
                Target::Branch("master"),
                map(changed),
                &PutOptions::default(),
            )
            .unwrap();
        let (va, vb) = (
            db.get(b"m", &At::Uid(a)).unwrap(),
            db.get(b"m", &At::Uid(b)).unwrap(),
        );
        for limit in [1usize, 2, 100] {
            let mut after = None;
            loop {
                let (sent, used) =
                    diff_page_evidence(db.chunks(), b"m", &a, &b, after.as_ref(), limit, 1 << 30)
                        .unwrap();
                assert_eq!(used, limit);
                let client = replay(&sent, db.algo());
                let got = check_diff_page(&client, b"m", &a, &b, after.as_ref(), limit).unwrap();
                let want = db
                    .diff_values_page(&va.object.value, &vb.object.value, after.as_ref(), limit)
                    .unwrap();
                assert_eq!(got, want);
                // Every chunk sent was needed: leave any one out and the check fails.
                for skip in 0..sent.len() {
                    let mut fewer = sent.clone();
                    fewer.remove(skip);
                    let client = replay(&fewer, db.algo());
                    let e =
                        check_diff_page(&client, b"m", &a, &b, after.as_ref(), limit).unwrap_err();
                    assert!(matches!(e, Error::Rejected(_)), "{e}");
                }
                match got.1 {
                    Some(c) => after = Some(c),
                    None => break,
                }
            }
        }
        // Over budget, the node sends a smaller page that still checks out.
        let bytes = |limit| -> u64 {
            let (sent, _) =
                diff_page_evidence(db.chunks(), b"m", &a, &b, None, limit, 1 << 30).unwrap();
            sent.iter().map(|c| c.len() as u64).sum()
        };
        let (one, all) = (bytes(1), bytes(100));
        assert!(one < all, "{one} {all}");
        let (sent, used) = diff_page_evidence(db.chunks(), b"m", &a, &b, None, 100, one).unwrap();
        assert!(used < 100, "{used}");
        let client = replay(&sent, db.algo());
        check_diff_page(&client, b"m", &a, &b, None, used).unwrap();
    }

    #[test]
    fn an_lca_checks_out_only_with_every_meta_chunk_it_walked() {
        let db = Db::new(Arc::new(MemoryStore::default()));
        let put = |branch: &str, v: &str| {
            let v = NewValue::String(v.as_bytes().to_vec());
            db.put(b"k", Target::Branch(branch), v, &PutOptions::default())
                .unwrap()
        };
        let root = put("master", "0");
        let mut main = root;
        for i in 0..20 {
            main = put("master", &format!("m{i}"));
        }
        db.fork(b"k", &At::Uid(root), "side").unwrap();
        let mut side = root;
        for i in 0..5 {
            side = put("side", &format!("s{i}"));
        }
        let sent = lca_evidence(db.chunks(), b"k", &main, &side, 1 << 30).unwrap();
        let client = replay(&sent, db.algo());
        assert_eq!(check_lca(&client, b"k", &main, &side).unwrap(), Some(root));
        for skip in 0..sent.len() {
            let mut fewer = sent.clone();
            fewer.remove(skip);
            let client = replay(&fewer, db.algo());
            assert!(check_lca(&client, b"k", &main, &side).is_err());
        }
        // Disjoint histories (another key's version cannot stand in).
        let x = NewValue::String(b"x".to_vec());
        let other = db
            .put(b"j", Target::Branch("master"), x, &PutOptions::default())
            .unwrap();
        assert!(lca_evidence(db.chunks(), b"k", &main, &other, 1 << 30).is_err());
    }
}
