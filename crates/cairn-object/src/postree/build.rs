//! Bottom-up construction (ForkBase Algorithm 1), streaming: leaves are cut as content
//! arrives and every level's chunker runs at once, so memory stays bounded by a few nodes
//! per level.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use cairn_core::{Error, HashAlgo, Result};
use cairn_store::{ChunkStore, Cid};

use super::node::{
    Elem, Entry, MAX_HEIGHT, Params, empty_leaf, encode_elem, encode_elem_leaf, encode_index,
    key_hash, pattern, put_chunk,
};
use super::{TreeConfig, TreeKind, TreeRef};
use crate::chunk::{CHUNK_HEADER_LEN, ChunkKind};

/// A chunker for one level: items go in, finished nodes come out as index entries.
pub(crate) trait NodeBuilder {
    /// What the level is made of (elements or child entries).
    type Item;
    /// Adds an item; returns the node it completed, if the item ended one.
    fn push(&mut self, item: Self::Item) -> Result<Option<Entry>>;
    /// Closes the pending node, if any (end of the level).
    fn flush(&mut self) -> Result<Option<Entry>>;
    /// True when no items are pending.
    fn is_empty(&self) -> bool;
}

/// Cuts List/Set/Map leaves.
pub(crate) struct ElemBuilder<'a> {
    store: &'a dyn ChunkStore,
    kind: TreeKind,
    p: Params,
    body: Vec<u8>,
    n: u64,
    last_key: (usize, usize),
}

impl<'a> ElemBuilder<'a> {
    pub fn new(store: &'a dyn ChunkStore, kind: TreeKind, p: Params) -> Self {
        ElemBuilder {
            store,
            kind,
            p,
            body: Vec::with_capacity((p.leaf_target * 2) as usize),
            n: 0,
            last_key: (0, 0),
        }
    }

    /// Adds one element given as slices.
    pub fn push_raw(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<Option<Entry>> {
        let before = self.body.len();
        encode_elem(&mut self.body, key, value);
        self.n += 1;
        let size = self.body.len() - before;
        let kstart = before + super::node::varint_len(key.len() as u64);
        self.last_key = (kstart, kstart + key.len());
        if pattern(key_hash(key), size, self.p.leaf_target)
            || self.body.len() as u64 >= self.p.leaf_max
        {
            self.emit().map(Some)
        } else {
            Ok(None)
        }
    }

    fn emit(&mut self) -> Result<Entry> {
        let framed = encode_elem_leaf(self.kind, self.n, &self.body);
        let cid = put_chunk(self.store, &framed)?;
        let key = self
            .kind
            .is_sorted()
            .then(|| Bytes::copy_from_slice(&self.body[self.last_key.0..self.last_key.1]));
        let e = Entry {
            cid,
            count: self.n,
            key,
        };
        self.body.clear();
        self.n = 0;
        Ok(e)
    }
}

impl NodeBuilder for ElemBuilder<'_> {
    type Item = Elem;
    fn push(&mut self, item: Elem) -> Result<Option<Entry>> {
        self.push_raw(&item.key, item.value.as_deref())
    }
    fn flush(&mut self) -> Result<Option<Entry>> {
        if self.n == 0 {
            Ok(None)
        } else {
            self.emit().map(Some)
        }
    }
    fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// Cuts index nodes at one level.
pub(crate) struct IndexBuilder<'a> {
    store: &'a dyn ChunkStore,
    kind: TreeKind,
    level: u8,
    p: Params,
    entries: Vec<Entry>,
    size: u64,
}

impl<'a> IndexBuilder<'a> {
    pub fn new(store: &'a dyn ChunkStore, kind: TreeKind, level: u8, p: Params) -> Result<Self> {
        if level == 0 || level > MAX_HEIGHT {
            return Err(Error::invalid(format!(
                "a POS-tree cannot grow past {MAX_HEIGHT} levels"
            )));
        }
        Ok(IndexBuilder {
            store,
            kind,
            level,
            p,
            entries: Vec::new(),
            size: 0,
        })
    }

    fn emit(&mut self) -> Result<Entry> {
        let framed = encode_index(self.kind, self.level, &self.entries);
        let cid = put_chunk(self.store, &framed)?;
        let mut count = 0u64;
        for e in &self.entries {
            count = count
                .checked_add(e.count)
                .ok_or_else(|| Error::invalid("POS-tree count overflows 64 bits"))?;
        }
        let key = self.entries.last().and_then(|e| e.key.clone());
        self.entries.clear();
        self.size = 0;
        Ok(Entry { cid, count, key })
    }
}

impl NodeBuilder for IndexBuilder<'_> {
    type Item = Entry;
    fn push(&mut self, e: Entry) -> Result<Option<Entry>> {
        if self.kind.is_sorted() != e.key.is_some() {
            return Err(Error::corrupt(format!(
                "index entry for {} has the wrong shape for a {:?} tree",
                e.cid, self.kind
            )));
        }
        let esize = e.encoded_len();
        self.size += esize as u64;
        let split = !self.entries.is_empty()
            && (pattern(e.cid.low_u64(), esize, self.p.index_target)
                || self.size >= self.p.index_max);
        self.entries.push(e);
        if split {
            self.emit().map(Some)
        } else {
            Ok(None)
        }
    }
    fn flush(&mut self) -> Result<Option<Entry>> {
        if self.entries.is_empty() {
            Ok(None)
        } else {
            self.emit().map(Some)
        }
    }
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

struct LevelState<'a> {
    held: Option<Entry>,
    seen: u64,
    builder: IndexBuilder<'a>,
}

/// The index levels above a stream of nodes at level `base`. A level's first node is held
/// back until a second arrives, so no parent is built for a level that turns out to be the
/// root's.
pub(crate) struct Levels<'a> {
    store: &'a dyn ChunkStore,
    kind: TreeKind,
    p: Params,
    base: u8,
    levels: Vec<LevelState<'a>>,
}

impl<'a> Levels<'a> {
    pub fn new(store: &'a dyn ChunkStore, kind: TreeKind, p: Params, base: u8) -> Self {
        Levels {
            store,
            kind,
            p,
            base,
            levels: Vec::new(),
        }
    }

    /// Adds the next node at level `base`.
    pub fn push(&mut self, e: Entry) -> Result<()> {
        self.push_at(0, e)
    }

    fn push_at(&mut self, i: usize, e: Entry) -> Result<()> {
        if i == self.levels.len() {
            let level = self.base as usize + i + 1;
            let level = u8::try_from(level).unwrap_or(u8::MAX);
            self.levels.push(LevelState {
                held: None,
                seen: 0,
                builder: IndexBuilder::new(self.store, self.kind, level, self.p)?,
            });
        }
        let st = &mut self.levels[i];
        st.seen += 1;
        if st.seen == 1 {
            st.held = Some(e);
            return Ok(());
        }
        let mut out = Vec::new();
        if let Some(h) = st.held.take()
            && let Some(x) = st.builder.push(h)?
        {
            out.push(x);
        }
        if let Some(x) = st.builder.push(e)? {
            out.push(x);
        }
        for x in out {
            self.push_at(i + 1, x)?;
        }
        Ok(())
    }

    /// Closes every level; returns the root and its level, or `None` if nothing was pushed.
    pub fn finish(mut self) -> Result<Option<(Entry, u8)>> {
        let mut i = 0;
        while i < self.levels.len() {
            let st = &mut self.levels[i];
            if st.seen == 1 {
                let root = st.held.take();
                return Ok(root.map(|r| (r, self.base + i as u8)));
            }
            if let Some(x) = st.builder.flush()? {
                self.push_at(i + 1, x)?;
            }
            i += 1;
        }
        Ok(None)
    }
}

/// Turns the result of [`Levels::finish`] into a [`TreeRef`] (the empty leaf when nothing
/// was built).
pub(crate) fn finish_tree(
    store: &dyn ChunkStore,
    kind: TreeKind,
    levels: Levels<'_>,
) -> Result<TreeRef> {
    match levels.finish()? {
        Some((root, height)) => Ok(TreeRef {
            kind,
            root: root.cid,
            count: root.count,
            height,
        }),
        None => empty(store, kind),
    }
}

/// Stores the empty tree of `kind` (a single empty leaf) and returns it.
pub fn empty(store: &dyn ChunkStore, kind: TreeKind) -> Result<TreeRef> {
    let cid = put_chunk(store, &empty_leaf(kind))?;
    Ok(TreeRef {
        kind,
        root: cid,
        count: 0,
        height: 0,
    })
}

/// A sliding window of blob bytes in which FastCDC finds leaf boundaries. Two bytes before
/// the window's head are always free, so a leaf is framed in place (header written over
/// bytes already stored) and hashed and stored without copying.
pub(crate) struct CdcWindow {
    /// Allocated (and zeroed) once as it grows; the bytes live in `head..end`.
    buf: Vec<u8>,
    head: usize,
    end: usize,
    cap: usize,
}

/// Most bytes [`CdcWindow::read_from`] asks a reader for at once: large enough that a
/// read costs little per byte, small enough that the window grows in steps.
const READ_STEP: usize = 256 << 10;
/// The window's first allocation for reads (it doubles from there as the blob grows).
const FIRST_STEP: usize = 32 << 10;

impl CdcWindow {
    pub fn new(p: &Params) -> Self {
        let cap = CHUNK_HEADER_LEN + 4 * p.cdc_max;
        // Grown on demand up to `cap`: a small blob never pays for the whole window.
        CdcWindow {
            buf: vec![0; CHUNK_HEADER_LEN],
            head: CHUNK_HEADER_LEN,
            end: CHUNK_HEADER_LEN,
            cap,
        }
    }

    /// Bytes waiting to be cut.
    pub fn avail(&self) -> usize {
        self.end - self.head
    }

    /// Moves the uncut bytes to the front when the window is full (they are fewer than a
    /// maximum leaf once everything decided has been cut).
    fn make_room(&mut self) {
        if self.end == self.cap {
            let n = self.avail();
            self.buf.copy_within(self.head..self.end, CHUNK_HEADER_LEN);
            self.head = CHUNK_HEADER_LEN;
            self.end = CHUNK_HEADER_LEN + n;
        }
    }

    /// Free bytes after the data: when fewer than `want`, the allocation grows (doubling,
    /// from [`FIRST_STEP`], up to the window's size; only the new part is zeroed), so a
    /// small blob never zeroes more than about twice its size.
    fn spare(&mut self, want: usize) -> &mut [u8] {
        let len = self.buf.len();
        if len - self.end < want && len < self.cap {
            let grown = len
                .saturating_mul(2)
                .max(self.end + want.min(FIRST_STEP))
                .min(self.cap);
            self.buf.resize(grown, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Appends as much of `data` as fits; returns how much was taken.
    pub fn push(&mut self, data: &[u8]) -> usize {
        self.make_room();
        let spare = self.spare(data.len());
        let take = spare.len().min(data.len());
        spare[..take].copy_from_slice(&data[..take]);
        self.end += take;
        take
    }

    /// Reads once from `reader` straight into the window (no copy through a buffer of the
    /// caller's); returns the bytes read, 0 at the end of the input.
    pub fn read_from(&mut self, reader: &mut dyn io::Read) -> io::Result<usize> {
        self.make_room();
        let spare = self.spare(READ_STEP);
        let room = spare.len().min(READ_STEP);
        let n = reader.read(&mut spare[..room])?;
        // A reader claiming more than it was given is broken; never trust it past the slice.
        let n = n.min(room);
        self.end += n;
        Ok(n)
    }

    /// Drops everything pending.
    pub fn clear(&mut self) {
        self.head = CHUNK_HEADER_LEN;
        self.end = CHUNK_HEADER_LEN;
    }

    /// Cuts the next leaf into `batch` if its boundary is decided (as [`CdcWindow::emit`]
    /// decides it); returns false when it is not.
    pub fn cut_into(&mut self, p: &Params, eof: bool, batch: &mut LeafBatch) -> bool {
        let avail = self.avail();
        if avail == 0 || (!eof && avail < p.cdc_max) {
            return false;
        }
        let n = p.cut(&self.buf[self.head..self.end]).clamp(1, avail);
        batch.push(&self.buf[self.head..self.head + n]);
        self.head += n;
        true
    }

    /// Cuts and stores the next leaf if its boundary is decided: the window holds a full
    /// maximum-size span, or `eof` says no more bytes will come.
    pub fn emit(&mut self, store: &dyn ChunkStore, p: &Params, eof: bool) -> Result<Option<Entry>> {
        let avail = self.avail();
        if avail == 0 || (!eof && avail < p.cdc_max) {
            return Ok(None);
        }
        let n = p.cut(&self.buf[self.head..self.end]).clamp(1, avail);
        let start = self.head - CHUNK_HEADER_LEN;
        self.buf[start..self.head].copy_from_slice(&ChunkKind::Blob.header());
        let cid = put_chunk(store, &self.buf[start..self.head + n])?;
        self.head += n;
        Ok(Some(Entry {
            cid,
            count: n as u64,
            key: None,
        }))
    }
}

/// Framed blob leaves waiting to be hashed and stored together, through one
/// [`cairn_core::HashAlgo::digest_many`] call per batch (today a loop over the leaves; a
/// multi-message hasher from a well-kept crate could fill more SIMD lanes than a 4 to
/// 5 KiB leaf alone does, without touching this code). The batch is small enough to stay
/// in the L2 cache between framing and hashing.
pub(crate) struct LeafBatch {
    /// Framed leaves back to back.
    buf: Vec<u8>,
    /// End of each leaf in `buf`.
    ends: Vec<usize>,
    cids: Vec<Cid>,
    /// Bytes of leaves collected before the batch is hashed and stored.
    limit: usize,
    /// The leaves are already in the store (the pipe thread stored them).
    stored: bool,
    /// Why the pipe thread could not store them.
    failure: Option<Error>,
}

/// Bytes of leaves collected before a batch is hashed and stored, at least: small enough
/// to stay in the L2 cache between framing and hashing at the default 4 KiB leaves.
const BATCH_MIN_BYTES: usize = 256 << 10;
/// Leaves per batch, at least, within [`BATCH_MAX_BYTES`]: with large leaves (a node's
/// 64 KiB) a batch of 256 KiB held only four, and a 100 MB upload handed 400 batches to the
/// hashing thread and back; batches of 16 leaves (1 MiB) wrote it 7% faster
/// (`docs/benchmarks.md`, "Leaf batches").
const BATCH_MIN_LEAVES: usize = 16;
/// Bytes of leaves collected before a batch is hashed and stored, at most (a writer holds
/// up to four batches and its cutting window: about 6 MiB per concurrent upload at most).
const BATCH_MAX_BYTES: usize = 1 << 20;

impl LeafBatch {
    /// An empty batch for leaves cut with `p`.
    pub fn new(p: &Params) -> Self {
        LeafBatch {
            // Grown on demand: a small blob never pays for a whole batch.
            buf: Vec::new(),
            ends: Vec::new(),
            cids: Vec::new(),
            limit: (BATCH_MIN_LEAVES * p.leaf_target as usize)
                .clamp(BATCH_MIN_BYTES, BATCH_MAX_BYTES),
            stored: false,
            failure: None,
        }
    }

    /// Adds one leaf (its frame is added here).
    pub fn push(&mut self, leaf: &[u8]) {
        self.buf.extend_from_slice(&ChunkKind::Blob.header());
        self.buf.extend_from_slice(leaf);
        self.ends.push(self.buf.len());
    }

    /// True when the batch should be flushed.
    pub fn is_full(&self) -> bool {
        self.buf.len() >= self.limit
    }

    /// True when no leaf is pending.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Hashes and stores every pending leaf, in order, and pushes their entries to `levels`.
    pub fn flush(&mut self, store: &dyn ChunkStore, levels: &mut Levels<'_>) -> Result<()> {
        self.hash(store.algo());
        self.store_hashed(store, levels)
    }

    /// Computes the cid of every pending leaf (the part of [`LeafBatch::flush`] that can
    /// run on another thread).
    fn hash(&mut self, algo: HashAlgo) {
        let mut msgs = Vec::with_capacity(self.ends.len());
        let mut start = 0;
        for &end in &self.ends {
            msgs.push(&self.buf[start..end]);
            start = end;
        }
        self.cids.clear();
        algo.digest_many(&msgs, &mut self.cids);
    }

    /// Stores the leaves [`LeafBatch::hash`] hashed, in order.
    fn store_leaves(&self, store: &dyn ChunkStore) -> Result<()> {
        let mut start = 0;
        for (&end, &cid) in self.ends.iter().zip(&self.cids) {
            store.put_hashed(cid, &self.buf[start..end])?;
            start = end;
        }
        Ok(())
    }

    /// Stores the leaves [`LeafBatch::hash`] hashed, in order (unless the pipe thread
    /// already did), pushes their entries to `levels`, and empties the batch for reuse.
    fn store_hashed(&mut self, store: &dyn ChunkStore, levels: &mut Levels<'_>) -> Result<()> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        if !self.stored {
            self.store_leaves(store)?;
        }
        let mut start = 0;
        for (&end, &cid) in self.ends.iter().zip(&self.cids) {
            levels.push(Entry {
                cid,
                count: (end - start - CHUNK_HEADER_LEN) as u64,
                key: None,
            })?;
            start = end;
        }
        self.buf.clear();
        self.ends.clear();
        self.cids.clear();
        self.stored = false;
        Ok(())
    }
}

/// The error of a [`HashPipe`] whose thread is gone.
fn pipe_stopped() -> Error {
    Error::Unavailable("the blob hashing thread stopped".into())
}

/// Batches a [`BlobWriter`] keeps in flight on its hashing thread.
const HASH_PIPE_DEPTH: usize = 2;

/// A second thread that hashes a [`BlobWriter`]'s full leaf batches while the writer cuts
/// the next ones, handing them back in order. Hashing is the largest single cost of a blob
/// put (BLAKE3 over 4 KiB leaves), so a large upload uses two cores instead of one. Given
/// the store as well ([`BlobWriter::storing_on_pipe`]), the thread also stores the leaves
/// it hashed, in order: appending them to the log (a copy into its buffer and one into
/// the page cache) was a quarter of the writer thread's time on a 100 MB upload, while
/// the hashing thread sat idle most of it. Building the index stays on the writer's
/// thread, in the original order, so the tree is exactly the one a single thread builds.
struct HashPipe {
    /// `None` once the pipe is shutting down (dropping it ends the thread's loop).
    to_hasher: Option<std::sync::mpsc::SyncSender<LeafBatch>>,
    hashed: Option<std::sync::mpsc::Receiver<LeafBatch>>,
    in_flight: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HashPipe {
    /// Starts the thread, which also stores each batch's leaves in `store` when given;
    /// `None` when the system refuses a thread (the writer then hashes inline).
    fn start(algo: HashAlgo, store: Option<Arc<dyn ChunkStore>>) -> Option<HashPipe> {
        let (to_hasher, todo) = std::sync::mpsc::sync_channel::<LeafBatch>(HASH_PIPE_DEPTH);
        let (done, hashed) = std::sync::mpsc::sync_channel::<LeafBatch>(HASH_PIPE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("cairn-blob-hash".into())
            .spawn(move || {
                // Ends when the writer drops its sender (finished or abandoned).
                for mut batch in todo {
                    batch.hash(algo);
                    if let Some(store) = &store {
                        match batch.store_leaves(&**store) {
                            Ok(()) => batch.stored = true,
                            Err(e) => batch.failure = Some(e),
                        }
                    }
                    if done.send(batch).is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(HashPipe {
            to_hasher: Some(to_hasher),
            hashed: Some(hashed),
            in_flight: 0,
            thread: Some(thread),
        })
    }

    /// Hands a full batch to the thread.
    fn send(&mut self, batch: LeafBatch) -> Result<()> {
        self.to_hasher
            .as_ref()
            .ok_or_else(pipe_stopped)?
            .send(batch)
            .map_err(|_| pipe_stopped())?;
        self.in_flight += 1;
        Ok(())
    }

    /// Takes back the oldest batch in flight, hashed. An error only if the thread died.
    fn receive(&mut self) -> Result<LeafBatch> {
        let b = self
            .hashed
            .as_ref()
            .ok_or_else(pipe_stopped)?
            .recv()
            .map_err(|_| pipe_stopped())?;
        self.in_flight -= 1;
        Ok(b)
    }
}

impl Drop for HashPipe {
    /// Waits for the thread, so that no leaf of an abandoned blob reaches the store after
    /// the put that abandoned it has returned.
    fn drop(&mut self) {
        // Without its sender the thread's loop ends; without the receiver its next hand-back
        // fails and it returns, so it finishes at most the batch it is on.
        self.to_hasher = None;
        self.hashed = None;
        if let Some(t) = self.thread.take() {
            // A panic there was already reported by the writer as a stopped thread.
            let _ = t.join();
        }
    }
}

/// Streams a blob into a POS-tree: implements [`io::Write`], stores leaves as soon as their
/// content-defined boundaries are known (in batches of 256 KiB to 1 MiB, hashed together), and
/// keeps only a bounded window in memory.
pub struct BlobWriter<'a> {
    store: &'a dyn ChunkStore,
    p: Params,
    win: CdcWindow,
    batch: LeafBatch,
    levels: Levels<'a>,
    written: u64,
    /// Hashing on a second thread, started at the second full batch (so small blobs never
    /// start a thread); `None` before that or when turned off.
    pipe: Option<HashPipe>,
    pipelined: bool,
    /// The store, shared with the hashing thread so that it stores the leaves too.
    shared: Option<Arc<dyn ChunkStore>>,
    /// Full batches so far.
    batches: u64,
    /// Emptied batches to reuse.
    spare: Vec<LeafBatch>,
}

impl<'a> BlobWriter<'a> {
    /// A writer storing chunks in `store` with the node sizes of `cfg`. Blobs larger than
    /// one batch (256 KiB to 1 MiB) are hashed on a second thread ([`BlobWriter::single_threaded`]
    /// turns that off); the tree is the same either way.
    pub fn new(store: &'a dyn ChunkStore, cfg: &TreeConfig) -> Self {
        let p = Params::new(cfg);
        BlobWriter {
            store,
            p,
            win: CdcWindow::new(&p),
            batch: LeafBatch::new(&p),
            levels: Levels::new(store, TreeKind::Blob, p, 0),
            written: 0,
            pipe: None,
            pipelined: true,
            shared: None,
            batches: 0,
            spare: Vec::new(),
        }
    }

    /// Hashes on the calling thread only (for measuring one core).
    pub fn single_threaded(mut self) -> Self {
        self.pipelined = false;
        self
    }

    /// Lets the hashing thread store the leaves it hashed as well (see [`HashPipe`]);
    /// `store` must be the store this writer was made with. The tree is the same.
    pub fn storing_on_pipe(mut self, store: Arc<dyn ChunkStore>) -> Self {
        self.shared = Some(store);
        self
    }

    /// Hands a full batch on: to the hashing thread when there is one (storing the oldest
    /// batch in flight once the pipe is full), else hashes and stores it here.
    fn submit(&mut self) -> Result<()> {
        self.batches += 1;
        if self.pipe.is_none() && self.pipelined && self.batches >= 2 {
            self.pipe = HashPipe::start(self.store.algo(), self.shared.clone());
            if self.pipe.is_none() {
                self.pipelined = false;
            }
        }
        let Some(pipe) = self.pipe.as_mut() else {
            return self.batch.flush(self.store, &mut self.levels);
        };
        if pipe.in_flight == HASH_PIPE_DEPTH {
            let mut done = pipe.receive()?;
            done.store_hashed(self.store, &mut self.levels)?;
            self.spare.push(done);
        }
        let p = self.p;
        let next = self.spare.pop().unwrap_or_else(|| LeafBatch::new(&p));
        let full = std::mem::replace(&mut self.batch, next);
        pipe.send(full)
    }

    /// Cuts every leaf whose boundary is decided (all that is left when `eof`), handing on
    /// each batch that fills.
    fn cut_decided(&mut self, eof: bool) -> Result<()> {
        while self.win.cut_into(&self.p, eof, &mut self.batch) {
            if self.batch.is_full() {
                self.submit()?;
            }
        }
        Ok(())
    }

    /// Stores every batch still on the hashing thread, in order.
    fn drain(&mut self) -> Result<()> {
        if let Some(pipe) = self.pipe.as_mut() {
            while pipe.in_flight > 0 {
                let mut done = pipe.receive()?;
                done.store_hashed(self.store, &mut self.levels)?;
            }
        }
        Ok(())
    }

    /// Bytes accepted so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Reads once from `reader` straight into the cutting window (saving the copy through
    /// a buffer that [`io::Write`] needs) after cutting every leaf already decided;
    /// returns the bytes read, 0 at the end of the input. Interrupted reads are retried.
    pub fn read_from(&mut self, reader: &mut dyn io::Read) -> Result<usize> {
        self.cut_decided(false)?;
        loop {
            match self.win.read_from(reader) {
                Ok(n) => {
                    self.written += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("reading the input", e)),
            }
        }
    }

    /// Appends `data` (the [`io::Write`] path without the error conversion).
    pub fn write_bytes(&mut self, data: &[u8]) -> Result<()> {
        let mut rest = data;
        while !rest.is_empty() {
            self.cut_decided(false)?;
            let n = self.win.push(rest);
            rest = &rest[n..];
        }
        self.written += data.len() as u64;
        Ok(())
    }

    /// Cuts the last leaves, builds the index levels and returns the tree.
    pub fn finish(mut self) -> Result<TreeRef> {
        self.cut_decided(true)?;
        self.drain()?;
        if !self.batch.is_empty() {
            self.batch.flush(self.store, &mut self.levels)?;
        }
        finish_tree(self.store, TreeKind::Blob, self.levels)
    }
}

impl io::Write for BlobWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_bytes(buf).map_err(io::Error::other)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Builds a Blob tree from `data` (the same tree a [`BlobWriter`] builds from the same
/// bytes, cut directly from the input: each leaf is copied once, into a batch of framed
/// leaves that are hashed together and stored).
pub fn build_blob(store: &dyn ChunkStore, cfg: &TreeConfig, data: &[u8]) -> Result<TreeRef> {
    let p = Params::new(cfg);
    let mut levels = Levels::new(store, TreeKind::Blob, p, 0);
    let mut batch = LeafBatch::new(&p);
    let mut rest = data;
    while !rest.is_empty() {
        let n = p.cut(rest).clamp(1, rest.len());
        batch.push(&rest[..n]);
        if batch.is_full() {
            batch.flush(store, &mut levels)?;
        }
        rest = &rest[n..];
    }
    batch.flush(store, &mut levels)?;
    finish_tree(store, TreeKind::Blob, levels)
}

/// The lengths of the leaves [`build_blob`] cuts `data` into (content-defined, so the
/// same bytes always give the same lengths), without hashing or storing anything: for
/// estimating dedup and for measuring chunking on its own. Empty data has no lengths (its
/// tree is one empty leaf).
pub fn blob_leaf_lengths(cfg: &TreeConfig, data: &[u8]) -> Vec<usize> {
    let p = Params::new(cfg);
    let mut out = Vec::with_capacity(data.len() / p.cdc_avg.max(1) + 1);
    let mut rest = data;
    while !rest.is_empty() {
        let n = p.cut(rest).clamp(1, rest.len());
        out.push(n);
        rest = &rest[n..];
    }
    out
}

fn build_elems(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    kind: TreeKind,
    each: impl FnOnce(&mut dyn FnMut(&[u8], Option<&[u8]>) -> Result<()>) -> Result<()>,
) -> Result<TreeRef> {
    let p = Params::new(cfg);
    let mut leaves = ElemBuilder::new(store, kind, p);
    let mut levels = Levels::new(store, kind, p, 0);
    let mut prev: Option<Vec<u8>> = None;
    let mut index = 0u64;
    each(&mut |k, v| {
        if kind.is_sorted() {
            match &mut prev {
                Some(pk) if pk.as_slice() >= k => {
                    return Err(Error::invalid(format!(
                        "{kind:?} keys must be strictly increasing: key #{index} is not greater than the one before"
                    )));
                }
                Some(pk) => {
                    pk.clear();
                    pk.extend_from_slice(k);
                }
                None => prev = Some(k.to_vec()),
            }
        }
        index += 1;
        if let Some(e) = leaves.push_raw(k, v)? {
            levels.push(e)?;
        }
        Ok(())
    })?;
    if let Some(e) = leaves.flush()? {
        levels.push(e)?;
    }
    finish_tree(store, kind, levels)
}

/// Builds a List tree from its elements.
pub fn build_list<I, B>(store: &dyn ChunkStore, cfg: &TreeConfig, elems: I) -> Result<TreeRef>
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    build_elems(store, cfg, TreeKind::List, |f| {
        for e in elems {
            f(e.as_ref(), None)?;
        }
        Ok(())
    })
}

/// Builds a Map tree from entries in strictly increasing key order
/// ([`Error::InvalidInput`] otherwise).
pub fn build_map<I, K, V>(store: &dyn ChunkStore, cfg: &TreeConfig, entries: I) -> Result<TreeRef>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    build_elems(store, cfg, TreeKind::Map, |f| {
        for (k, v) in entries {
            f(k.as_ref(), Some(v.as_ref()))?;
        }
        Ok(())
    })
}

/// Builds a Set tree from keys in strictly increasing order ([`Error::InvalidInput`]
/// otherwise).
pub fn build_set<I, K>(store: &dyn ChunkStore, cfg: &TreeConfig, keys: I) -> Result<TreeRef>
where
    I: IntoIterator<Item = K>,
    K: AsRef<[u8]>,
{
    build_elems(store, cfg, TreeKind::Set, |f| {
        for k in keys {
            f(k.as_ref(), None)?;
        }
        Ok(())
    })
}
