//! Checkable answers to history queries (ForkBase's Diff and LCA, Table 1 M16 and M17) for
//! a client that trusts nothing but uids.
//!
//! A node runs the query over a [`RecordingChunks`] view of its store, which notes every
//! chunk the query reads, and sends those chunks as frames of a verified stream (see
//! [`crate::stream`]). The client runs the same query, with the same arguments, over
//! chunks it accepts only under their own hash: [`check_diff_page`] over the chunks of a
//! diff page stored in any [`ChunkStore`] (such as `cairn_store::MemoryStore`),
//! [`check_lca`] over them or straight from the stream ([`StreamedChunks`]). Every chunk
//! the query reaches is the one its parent (or the uid) names, so the answer is the true
//! answer for those versions; a chunk left out makes the query fail instead of changing
//! its answer. What a node is still trusted for is only which uid a branch name stands
//! for.
//!
//! A diff page is built in memory: the versions' Meta chunks, then at most
//! [`EVIDENCE_BUDGET`] bytes of POS-tree nodes (a page that reads more is cut to fewer
//! changes). An LCA streams: each Meta chunk is sent as the search reads it and the client
//! searches as the chunks arrive, so neither side holds the history.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use bytes::Bytes;
use cairn_core::{Error, HashAlgo, Result};
use cairn_store::{ChunkStore, Cid, StoreStats};
use parking_lot::Mutex;

use crate::db::MAX_INLINE_BYTES;
use crate::fobject::Uid;
use crate::history::{Diff, DiffCursor, diff_page_in, lca_in, load_version, load_version_chunk};
use crate::stream::FrameReader;

/// Most bytes of POS-tree nodes one diff page carries (8 MiB), besides the two versions'
/// Meta chunks: the node builds the page in memory before sending it, so this bounds what
/// each answer holds, as a streamed download's buffers are bounded, and the client's
/// memory. A page that reads more is retried with fewer changes ([`diff_page_evidence`]).
pub const EVIDENCE_BUDGET: u64 = 8 << 20;

/// What each chunk counts against [`EVIDENCE_BUDGET`] besides its bytes: holding a chunk
/// costs a map entry and a handle, so a budget spent on millions of tiny chunks would
/// hold far more memory than its bytes. Node and client count alike.
pub const CHUNK_COST: u64 = 64;

/// Largest Meta chunk a client accepts in an answer: an inline value of at most
/// [`MAX_INLINE_BYTES`] and room for the key, context and bases.
pub const MAX_META_FRAME: usize = MAX_INLINE_BYTES + (1 << 20);

/// The answer of a chunk source to what it does not do (write, list, forget).
fn refuse<T>(what: &str) -> Result<T> {
    Err(Error::invalid(what))
}

/// Where a [`RecordingChunks`] puts what it notes.
enum Sink<'a> {
    /// Kept, up to a byte budget.
    Keep {
        budget: u64,
        chunks: Vec<Bytes>,
        bytes: u64,
        over: bool,
    },
    /// Handed on at once.
    Emit(Box<dyn FnMut(Bytes) -> Result<()> + Send + 'a>),
}

/// A read-only view of a chunk store that notes every distinct chunk read through it, in
/// the order first read: kept up to a byte budget (a read past it fails), or handed on
/// as it is read.
pub struct RecordingChunks<'a> {
    inner: &'a dyn ChunkStore,
    state: Mutex<(HashSet<Cid>, Sink<'a>)>,
}

impl<'a> RecordingChunks<'a> {
    /// Keeps reads of `inner`, at most `budget` bytes of distinct chunks.
    pub fn new(inner: &'a dyn ChunkStore, budget: u64) -> Self {
        let keep = Sink::Keep {
            budget,
            chunks: Vec::new(),
            bytes: 0,
            over: false,
        };
        RecordingChunks {
            inner,
            state: Mutex::new((HashSet::new(), keep)),
        }
    }

    /// Hands each distinct chunk read from `inner` to `emit` as it is read (an error from
    /// `emit` fails the read).
    pub fn streaming(
        inner: &'a dyn ChunkStore,
        emit: impl FnMut(Bytes) -> Result<()> + Send + 'a,
    ) -> Self {
        RecordingChunks {
            inner,
            state: Mutex::new((HashSet::new(), Sink::Emit(Box::new(emit)))),
        }
    }

    /// True when a read went past the budget (and failed).
    pub fn over_budget(&self) -> bool {
        matches!(self.state.lock().1, Sink::Keep { over: true, .. })
    }

    /// The chunks kept, in the order first read (none when streaming).
    pub fn into_chunks(self) -> Vec<Bytes> {
        match self.state.into_inner().1 {
            Sink::Keep { chunks, .. } => chunks,
            Sink::Emit(_) => Vec::new(),
        }
    }

    fn note(&self, cid: &Cid, chunk: &Bytes) -> Result<()> {
        let mut guard = self.state.lock();
        let (seen, sink) = &mut *guard;
        if !seen.insert(*cid) {
            return Ok(());
        }
        match sink {
            Sink::Keep {
                budget,
                chunks,
                bytes,
                over,
            } => {
                *bytes += chunk.len() as u64 + CHUNK_COST;
                if *bytes > *budget {
                    *over = true;
                    return Err(Error::invalid(format!(
                        "the query reads more than {budget} bytes of chunks"
                    )));
                }
                chunks.push(chunk.clone());
                Ok(())
            }
            Sink::Emit(emit) => emit(chunk.clone()),
        }
    }
}

impl ChunkStore for RecordingChunks<'_> {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }

    fn put_hashed(&self, _cid: Cid, _chunk: &[u8]) -> Result<bool> {
        refuse("a recording view of a store is read-only")
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
        refuse("a recording view of a store does not list chunks")
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        refuse("a recording view of a store is read-only")
    }

    fn stats(&self) -> Result<StoreStats> {
        self.inner.stats()
    }
}

/// Chunks read from a verified stream as a query asks for them: `get(cid)` reads frames
/// until one hashes to `cid`. A query that reads its chunks in the order a node's run of
/// the same query read them (and each once, as [`crate::history::lca_in`] does) finds
/// each one next; frames that come early are kept, at most [`EVIDENCE_BUDGET`] bytes
/// (each counting [`CHUNK_COST`] more than its length). A
/// chunk is handed out once. The end of the stream, or a cut one, means missing chunks.
pub struct StreamedChunks<R> {
    algo: HashAlgo,
    state: Mutex<Streamed<R>>,
}

struct Streamed<R> {
    frames: FrameReader<R>,
    early: HashMap<Cid, Bytes>,
    early_bytes: u64,
}

impl<R: Read + Send> StreamedChunks<R> {
    /// Chunks named with `algo`, read from `stream`, each frame at most [`MAX_META_FRAME`]
    /// bytes.
    pub fn new(stream: R, algo: HashAlgo) -> Self {
        StreamedChunks {
            algo,
            state: Mutex::new(Streamed {
                frames: FrameReader::with_limit(stream, MAX_META_FRAME),
                early: HashMap::new(),
                early_bytes: 0,
            }),
        }
    }
}

impl<R: Read + Send> ChunkStore for StreamedChunks<R> {
    fn algo(&self) -> HashAlgo {
        self.algo
    }

    fn put_hashed(&self, _cid: Cid, _chunk: &[u8]) -> Result<bool> {
        refuse("a streamed chunk source is read-only")
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let mut s = self.state.lock();
        if let Some(c) = s.early.remove(cid) {
            s.early_bytes -= c.len() as u64 + CHUNK_COST;
            return Ok(Some(c));
        }
        while let Some(c) = s.frames.next_chunk()? {
            let got = self.algo.digest(&c);
            if got == *cid {
                return Ok(Some(c));
            }
            s.early_bytes += c.len() as u64 + CHUNK_COST;
            if s.early_bytes > EVIDENCE_BUDGET {
                return Err(Error::Rejected(format!(
                    "the stream sent more than {EVIDENCE_BUDGET} bytes of chunks before they \
                     were needed"
                )));
            }
            s.early.insert(got, c);
        }
        Ok(None)
    }

    fn has(&self, _cid: &Cid) -> Result<bool> {
        refuse("a streamed chunk source hands chunks out, it does not answer has")
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        refuse("a streamed chunk source does not list chunks")
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        refuse("a streamed chunk source is read-only")
    }

    fn stats(&self) -> Result<StoreStats> {
        Ok(StoreStats::default())
    }
}

/// Node side of a diff page: runs [`crate::Db::diff_values_page`] between versions `a`
/// and `b` of `key` over `chunks`, recording what it reads. Returns the chunks (the Meta
/// chunks of `a` and, when it differs, `b` first) and the page size used: `limit`, or less
/// when a page of `limit` changes reads more than `budget` bytes of POS-tree nodes (the
/// client checks the page at that size, and the cursor of its last change goes on from
/// there). A single change that reads more than `budget` is [`Error::InvalidInput`].
pub fn diff_page_evidence(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    after: Option<&DiffCursor>,
    limit: usize,
    budget: u64,
) -> Result<(Vec<Bytes>, usize)> {
    let (meta_a, va) = load_version_chunk(chunks, key, a)?;
    let (meta_b, vb) = load_version_chunk(chunks, key, b)?;
    let mut metas = vec![meta_a];
    if a != b {
        metas.push(meta_b);
    }
    let meta_bytes: u64 = metas.iter().map(|m| m.len() as u64).sum::<u64>() * 2;
    let allowed = |sent: u64| {
        sent.saturating_mul(DIFF_READS_PER_BYTE_SENT)
            .saturating_add(DIFF_READS_BASE)
    };
    let too_repetitive = || {
        Error::invalid(
            "this diff reads its POS-tree nodes far more often than a client checking it \
             allows (a value whose content repeats): read the two versions with get and \
             compare them",
        )
    };
    let mut limit = limit;
    loop {
        let rec = RecordingChunks::new(chunks, budget);
        // The client's check reads the same chunks, in the same order, within a bound set
        // by the bytes it is sent (`check_diff_page`): a page it would refuse is refused
        // here, and the walk stops once no page within the budget could pass.
        let cap = allowed(budget.saturating_add(meta_bytes));
        let counted = CountedReads {
            inner: &rec,
            left: std::sync::atomic::AtomicU64::new(cap),
            exhausted: Default::default(),
        };
        match diff_page_in(&counted, &va.value, &vb.value, after, limit) {
            Ok(_) => {
                let read = cap - counted.left.load(std::sync::atomic::Ordering::Relaxed);
                let chunks = rec.into_chunks();
                let sent: u64 = chunks.iter().map(|c| c.len() as u64).sum::<u64>() + meta_bytes / 2;
                if read.saturating_add(meta_bytes) > allowed(sent) {
                    return Err(too_repetitive());
                }
                metas.extend(chunks);
                return Ok((metas, limit));
            }
            Err(_) if counted.exhausted.load(std::sync::atomic::Ordering::Relaxed) => {
                return Err(too_repetitive());
            }
            Err(_) if rec.over_budget() && limit > 1 => limit = (limit / 4).max(1),
            Err(_) if rec.over_budget() => {
                return Err(Error::invalid(format!(
                    "one change of this diff reads more than {} MiB of POS-tree nodes, more \
                     than a node sends for checking (read the two versions with get and \
                     compare them)",
                    budget >> 20
                )));
            }
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
    let sent = chunks.stats()?.chunk_bytes;
    let reads = sent
        .saturating_mul(DIFF_READS_PER_BYTE_SENT)
        .saturating_add(DIFF_READS_BASE);
    check_diff_page_within(chunks, key, a, b, after, limit, reads)
}

/// Bytes of chunks a client's diff check may read per byte it was sent, beyond
/// [`DIFF_READS_BASE`]: an honest page reads each node a few times at most, while made-up
/// trees whose subtrees repeat can make a diff read a few chunks over and over (the work
/// growing as a power of the tree's height), which this bound cuts short.
pub const DIFF_READS_PER_BYTE_SENT: u64 = 64;
/// Bytes of chunks a client's diff check may always read.
pub const DIFF_READS_BASE: u64 = 256 << 20;

/// [`check_diff_page`] allowed to read at most `reads` bytes of chunks (each read counting
/// at least 64).
pub fn check_diff_page_within(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    after: Option<&DiffCursor>,
    limit: usize,
    reads: u64,
) -> Result<(Diff, Option<DiffCursor>)> {
    let counted = CountedReads {
        inner: chunks,
        left: std::sync::atomic::AtomicU64::new(reads),
        exhausted: Default::default(),
    };
    let run = || {
        let va = load_version(&counted, key, a)?;
        let vb = load_version(&counted, key, b)?;
        diff_page_in(&counted, &va.value, &vb.value, after, limit)
    };
    run().map_err(|e| Error::Rejected(format!("the chunks sent do not give the diff: {e}")))
}

/// A read-only view of a chunk store that refuses reads past a count of bytes.
struct CountedReads<'a> {
    inner: &'a dyn ChunkStore,
    left: std::sync::atomic::AtomicU64,
    /// A read was refused: the count ran out.
    exhausted: std::sync::atomic::AtomicBool,
}

impl CountedReads<'_> {
    fn spend(&self, n: u64) -> Result<()> {
        use std::sync::atomic::Ordering;
        let ok = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(n))
            .is_ok();
        if ok {
            Ok(())
        } else {
            self.exhausted.store(true, Ordering::Relaxed);
            Err(Error::Rejected(
                "the diff reads its chunks more often than this client allows for the bytes it \
                 was sent (64 times, plus 256 MiB): a node that made up repeating trees, or a \
                 value whose content repeats (compare the versions with get)"
                    .into(),
            ))
        }
    }
}

impl ChunkStore for CountedReads<'_> {
    fn algo(&self) -> HashAlgo {
        self.inner.algo()
    }

    fn put_hashed(&self, _cid: Cid, _chunk: &[u8]) -> Result<bool> {
        refuse("a counted view of a store is read-only")
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let got = self.inner.get(cid)?;
        self.spend(got.as_ref().map_or(0, |c| c.len() as u64).max(64))?;
        Ok(got)
    }

    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        let got = self.inner.get_many(cids)?;
        for c in &got {
            self.spend(c.as_ref().map_or(0, |c| c.len() as u64).max(64))?;
        }
        Ok(got)
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        self.spend(64)?;
        self.inner.has(cid)
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        refuse("a counted view of a store does not list chunks")
    }

    fn remove(&self, _cids: &[Cid]) -> Result<()> {
        refuse("a counted view of a store is read-only")
    }

    fn stats(&self) -> Result<StoreStats> {
        self.inner.stats()
    }
}

/// Node side of an LCA: runs [`crate::Db::lca`] over `chunks`, handing each Meta chunk it
/// reads (`a`'s and `b`'s first, each once) to `emit` as it is read.
pub fn lca_evidence(
    chunks: &dyn ChunkStore,
    key: &[u8],
    a: &Uid,
    b: &Uid,
    emit: impl FnMut(Bytes) -> Result<()> + Send,
) -> Result<()> {
    let rec = RecordingChunks::streaming(chunks, emit);
    lca_in(&rec, key, a, b).map(|_| ())
}

/// Client side of an LCA: the least common ancestor of versions `a` and `b` of `key`,
/// computed from `chunks` (a store of chunks each under its own hash, or a
/// [`StreamedChunks`]). `None` (disjoint histories) only when every ancestor of both was
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

    fn lca_chunks(db: &Db, a: &Uid, b: &Uid) -> Result<Vec<Bytes>> {
        let mut sent = Vec::new();
        lca_evidence(db.chunks(), b"k", a, b, |c| {
            sent.push(c);
            Ok(())
        })?;
        Ok(sent)
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
        // Pages of any sizes, one after the other, make up the whole diff.
        let whole = match db.diff_values(&va.object.value, &vb.object.value).unwrap() {
            Diff::Sorted(cs) => cs,
            d => panic!("{d:?}"),
        };
        for sizes in [[1usize, 3, 2], [2, 1, 5], [4, 4, 1]] {
            let (mut got, mut after, mut i) = (Vec::new(), None, 0);
            loop {
                let limit = sizes[i % sizes.len()];
                i += 1;
                let (sent, used) =
                    diff_page_evidence(db.chunks(), b"m", &a, &b, after.as_ref(), limit, 1 << 30)
                        .unwrap();
                let client = replay(&sent, db.algo());
                let (page, next) =
                    check_diff_page(&client, b"m", &a, &b, after.as_ref(), used).unwrap();
                match page {
                    Diff::Sorted(cs) => got.extend(cs),
                    d => panic!("{d:?}"),
                }
                match next {
                    Some(c) => after = Some(c),
                    None => break,
                }
            }
            assert_eq!(got, whole, "pages of sizes {sizes:?}");
        }
        // Over budget, the node sends a smaller page that still checks out.
        let bytes = |limit| -> u64 {
            let (sent, _) =
                diff_page_evidence(db.chunks(), b"m", &a, &b, None, limit, 1 << 30).unwrap();
            // POS-tree nodes only: the budget does not count the two Meta chunks.
            sent.iter()
                .skip(2)
                .map(|c| c.len() as u64 + CHUNK_COST)
                .sum()
        };
        let (one, all) = (bytes(1), bytes(100));
        assert!(one < all, "{one} {all}");
        let (sent, used) = diff_page_evidence(db.chunks(), b"m", &a, &b, None, 100, one).unwrap();
        assert!(used < 100, "{used}");
        let client = replay(&sent, db.algo());
        check_diff_page(&client, b"m", &a, &b, None, used).unwrap();
        // The check reads within its allowance, and refuses a diff that would read more
        // (as one over made-up trees with repeating subtrees would).
        let sent_bytes: u64 = sent.iter().map(|c| c.len() as u64).sum();
        check_diff_page_within(&client, b"m", &a, &b, None, used, 64 * sent_bytes).unwrap();
        let e = check_diff_page_within(&client, b"m", &a, &b, None, used, 200).unwrap_err();
        assert!(
            e.to_string().contains("more often than this client allows"),
            "{e}"
        );
    }

    /// A history wider than the LCA walk's frontier bound (here, in a unit test, 64
    /// versions and bases; 4 Mi in a build) is refused, on the node and in a client's
    /// check alike: a made-up stream of versions naming thousands of bases each held the
    /// checking client's memory without end.
    #[test]
    fn an_lca_walk_refuses_a_history_wider_than_its_bound() {
        let db = Db::new(Arc::new(MemoryStore::default()));
        let root = db
            .put(
                b"k",
                Target::Branch("master"),
                NewValue::String(b"0".to_vec()),
                &PutOptions::default(),
            )
            .unwrap();
        let heads: Vec<Uid> = (0..70)
            .map(|i| {
                db.put(
                    b"k",
                    Target::Base(root),
                    NewValue::String(format!("h{i}").into_bytes()),
                    &PutOptions::default(),
                )
                .unwrap()
            })
            .collect();
        // One version on all of them (as an untagged merge of them makes one).
        let head = db.get(b"k", &At::Uid(heads[0])).unwrap().object;
        let wide = db
            .store_object(&crate::FObject {
                bases: heads.clone(),
                depth: head.depth + 1,
                ..head
            })
            .unwrap();
        let e = db.lca(b"k", &wide, &root).unwrap_err();
        assert!(e.to_string().contains("wider than"), "{e}");
        let e = lca_chunks(&db, &wide, &root).unwrap_err();
        assert!(e.to_string().contains("wider than"), "{e}");
        // A narrow history is walked as before.
        assert_eq!(db.lca(b"k", &heads[0], &root).unwrap(), Some(root));
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
        let sent = lca_chunks(&db, &main, &side).unwrap();
        let client = replay(&sent, db.algo());
        assert_eq!(check_lca(&client, b"k", &main, &side).unwrap(), Some(root));
        for skip in 0..sent.len() {
            let mut fewer = sent.clone();
            fewer.remove(skip);
            let client = replay(&fewer, db.algo());
            assert!(check_lca(&client, b"k", &main, &side).is_err());
        }
        // Straight from the stream, each chunk hashed as the search asks for it.
        let framed = |chunks: &[Bytes]| -> Vec<u8> {
            let mut out = Vec::new();
            for c in chunks {
                crate::stream::write_frame(c.clone(), &mut |p| {
                    out.extend_from_slice(&p);
                    Ok(())
                })
                .unwrap();
            }
            out
        };
        let streamed =
            |chunks: &[Bytes]| StreamedChunks::new(std::io::Cursor::new(framed(chunks)), db.algo());
        assert_eq!(
            check_lca(&streamed(&sent), b"k", &main, &side).unwrap(),
            Some(root)
        );
        let mut reordered = sent.clone();
        reordered.swap(3, 5);
        assert_eq!(
            check_lca(&streamed(&reordered), b"k", &main, &side).unwrap(),
            Some(root),
            "chunks sent early are kept until asked for"
        );
        for skip in 0..sent.len() {
            let mut fewer = sent.clone();
            fewer.remove(skip);
            let e = check_lca(&streamed(&fewer), b"k", &main, &side).unwrap_err();
            assert!(matches!(e, Error::Rejected(_)), "{e}");
        }
        let mut cut = framed(&sent);
        cut.truncate(cut.len() - 3);
        let e = check_lca(
            &StreamedChunks::new(std::io::Cursor::new(cut), db.algo()),
            b"k",
            &main,
            &side,
        )
        .unwrap_err();
        assert!(matches!(e, Error::Rejected(_)), "{e}");
        // A version and itself: its own LCA, from its one Meta chunk.
        let one = lca_chunks(&db, &main, &main).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(
            check_lca(&streamed(&one), b"k", &main, &main).unwrap(),
            Some(main)
        );
        // Disjoint histories (another key's version cannot stand in).
        let x = NewValue::String(b"x".to_vec());
        let other = db
            .put(b"j", Target::Branch("master"), x, &PutOptions::default())
            .unwrap();
        assert!(lca_chunks(&db, &main, &other).is_err());
    }

    /// Early frames count [`CHUNK_COST`] each besides their bytes: a stream of tiny
    /// chunks sent before they are needed is refused once they would hold the budget in
    /// memory, not after millions of them.
    #[test]
    fn tiny_early_chunks_count_their_cost() {
        let n = (EVIDENCE_BUDGET / (3 + CHUNK_COST)) as u32 + 10;
        let mut stream = Vec::new();
        for i in 0..n {
            let c = Bytes::from(i.to_le_bytes()[..3].to_vec());
            crate::stream::write_frame(c, &mut |p| {
                stream.extend_from_slice(&p);
                Ok(())
            })
            .unwrap();
        }
        let s = StreamedChunks::new(std::io::Cursor::new(stream), HashAlgo::Blake3);
        let absent = HashAlgo::Blake3.digest(b"not in the stream");
        assert!(matches!(s.get(&absent), Err(Error::Rejected(_))));
    }
}
