//! Lazy reads: point look-ups, ranges and streaming, fetching only the nodes on the way.

use std::collections::VecDeque;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Bound;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::ChunkStore;

use super::cursor::{ElemCursor, NodeCursor};
use super::node::{Entry, blob_leaf_from_chunk, corrupt_err, load_blob_leaf};
use super::{TreeKind, TreeRef, expect_kind};

/// Reads `len` bytes of a Blob tree from `offset` (fewer at the end of the blob). An
/// `offset` past the end is [`Error::InvalidInput`].
pub fn blob_read(store: &dyn ChunkStore, t: &TreeRef, offset: u64, len: u64) -> Result<Vec<u8>> {
    expect_kind(t, &[TreeKind::Blob], "blob_read")?;
    if offset > t.count {
        return Err(Error::invalid(format!(
            "offset {offset} is past the end of a {}-byte blob",
            t.count
        )));
    }
    let end = offset.saturating_add(len).min(t.count);
    // The count comes from stored data: reserve at most 64 MiB up front, grow as read.
    let mut out = Vec::with_capacity((end - offset).min(64 << 20) as usize);
    if end == offset {
        return Ok(out);
    }
    let mut c = NodeCursor::new(store, t, 0);
    let mut pos = c.seek(offset, false)?;
    while pos < end {
        let e = c
            .next()?
            .ok_or_else(|| corrupt_err(&t.root, "blob tree ends before its count"))?;
        let leaf = load_blob_leaf(store, &e.cid, e.count)?;
        let s = (offset.max(pos) - pos) as usize;
        let x = (end.min(pos + e.count) - pos) as usize;
        out.extend_from_slice(&leaf[s..x]);
        pos += e.count;
    }
    Ok(out)
}

/// Leaves a [`BlobReader`] fetches at once when reading in order.
const READ_AHEAD_LEAVES: usize = 64;
/// Bytes of leaves a [`BlobReader`] fetches at once when reading in order.
const READ_AHEAD_BYTES: u64 = 256 << 10;

/// Streams a Blob tree (or a slice of one) with [`Read`] and [`Seek`], holding the path to
/// the current leaf and, when reading in order, the next leaves up to 256 KiB (fetched
/// with one [`ChunkStore::get_many`], so a store that keeps a blob's leaves side by side
/// reads them with one request; never past the end of the slice). Positions are relative
/// to the start of the slice. Errors from the store surface as [`io::Error`]s wrapping
/// the [`Error`].
pub struct BlobReader<'a> {
    tree: TreeRef,
    cursor: NodeCursor<'a>,
    leaf: Bytes,
    leaf_start: u64,
    /// The leaf after `leaf` is the front of `ahead` (or the cursor's next when `ahead`
    /// is empty).
    in_sequence: bool,
    /// Leaves fetched ahead, in order, with their offsets in the blob.
    ahead: VecDeque<(u64, Bytes)>,
    /// Where the cursor's next leaf starts.
    next_start: u64,
    start: u64,
    end: u64,
    pos: u64,
}

impl<'a> BlobReader<'a> {
    /// A reader over the whole blob.
    pub fn new(store: &'a dyn ChunkStore, t: &TreeRef) -> Self {
        Self::range(store, t, 0, u64::MAX)
    }

    /// A reader over `len` bytes from `offset` (clamped to the blob).
    pub fn range(store: &'a dyn ChunkStore, t: &TreeRef, offset: u64, len: u64) -> Self {
        let start = offset.min(t.count);
        BlobReader {
            tree: *t,
            cursor: NodeCursor::new(store, t, 0),
            leaf: Bytes::new(),
            leaf_start: 0,
            in_sequence: false,
            ahead: VecDeque::new(),
            next_start: 0,
            start,
            end: start.saturating_add(len).min(t.count),
            pos: start,
        }
    }

    /// Length of the slice being read.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True when the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    fn fill(&mut self) -> Result<()> {
        expect_kind(&self.tree, &[TreeKind::Blob], "BlobReader")?;
        let leaf_end = self.leaf_start + self.leaf.len() as u64;
        let in_sequence = std::mem::replace(&mut self.in_sequence, false);
        // Out of sequence until this fill succeeds: a failed seek or fetch leaves the
        // cursor past leaves it never handed out, so the next read must seek again (it
        // would otherwise file later leaves under this offset).
        if !(in_sequence && self.pos == leaf_end) {
            self.ahead.clear();
            self.next_start = self.cursor.seek(self.pos, false)?;
        }
        if self.ahead.is_empty() {
            self.fetch_ahead()?;
        }
        let (leaf_start, leaf) = self
            .ahead
            .pop_front()
            .ok_or_else(|| corrupt_err(&self.tree.root, "blob tree ends before its count"))?;
        self.leaf_start = leaf_start;
        self.leaf = leaf;
        self.in_sequence = true;
        if self.leaf.is_empty() || self.pos < self.leaf_start {
            self.in_sequence = false;
            return Err(corrupt_err(
                &self.tree.root,
                "blob leaf not where the index says",
            ));
        }
        Ok(())
    }

    /// Fetches the cursor's next leaves, up to [`READ_AHEAD_LEAVES`] and
    /// [`READ_AHEAD_BYTES`] and never past the end of the slice, into `ahead`.
    fn fetch_ahead(&mut self) -> Result<()> {
        let (entries, _) = take_leaves(
            &mut self.cursor,
            self.next_start,
            self.end,
            READ_AHEAD_LEAVES,
            READ_AHEAD_BYTES,
        )?;
        let leaves = fetch_leaves(self.cursor.store(), &entries)?;
        let mut at = self.next_start;
        for leaf in leaves {
            let len = leaf.len() as u64;
            self.ahead.push_back((at, leaf));
            at = at.saturating_add(len);
        }
        self.next_start = at;
        Ok(())
    }
}

/// Takes the cursor's next leaves, the first starting at blob offset `from`: at most
/// `max_leaves` of them, stopping once they reach `max_bytes` or `end`. Returns them and
/// the offset after the last.
fn take_leaves(
    cursor: &mut NodeCursor<'_>,
    from: u64,
    end: u64,
    max_leaves: usize,
    max_bytes: u64,
) -> Result<(Vec<Entry>, u64)> {
    let mut entries = Vec::new();
    let mut upto = from;
    while entries.len() < max_leaves && upto - from < max_bytes && upto < end {
        match cursor.next()? {
            Some(e) => {
                upto = upto.saturating_add(e.count);
                entries.push(e);
            }
            None => break,
        }
    }
    Ok((entries, upto))
}

/// Fetches leaves with one [`ChunkStore::get_many`] and checks each (kind, length).
fn fetch_leaves(store: &dyn ChunkStore, entries: &[Entry]) -> Result<Vec<Bytes>> {
    let cids: Vec<_> = entries.iter().map(|e| e.cid).collect();
    let chunks = store.get_many(&cids)?;
    if chunks.len() != entries.len() {
        return Err(Error::corrupt(format!(
            "the store returned {} chunks for {} cids",
            chunks.len(),
            entries.len()
        )));
    }
    entries
        .iter()
        .zip(chunks)
        .map(|(e, c)| blob_leaf_from_chunk(&e.cid, c, e.count))
        .collect()
}

/// Most threads [`copy_blob`] fetches and verifies windows of leaves on.
pub const COPY_BLOB_MAX_WORKERS: usize = 4;
/// Threads a [`copy_blob`] should use on this machine: one per core, up to
/// [`COPY_BLOB_MAX_WORKERS`].
pub fn copy_blob_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(COPY_BLOB_MAX_WORKERS)
}

/// Leaves in one [`copy_blob`] window.
const COPY_WINDOW_LEAVES: usize = 256;
/// Bytes of leaves in one [`copy_blob`] window (the store reads neighbours up to 1 MiB
/// with one request).
const COPY_WINDOW_BYTES: u64 = 1 << 20;

/// Writes `len` bytes of a Blob tree from `offset` (clamped to the blob) to `out`, with
/// `workers` threads (at most [`COPY_BLOB_MAX_WORKERS`]) each fetching and verifying whole
/// windows of leaves (up to 1 MiB, one [`ChunkStore::get_many`]) while the calling
/// thread walks the tree and writes finished windows in order. A cold read then keeps the
/// disk and several cores busy at once instead of alternating one read and one hash;
/// memory stays bounded (two windows in flight per worker). Every leaf is verified
/// against its cid before a byte of it is written. Returns the bytes written.
pub fn copy_blob(
    store: &dyn ChunkStore,
    t: &TreeRef,
    offset: u64,
    len: u64,
    workers: usize,
    out: &mut dyn io::Write,
) -> Result<u64> {
    copy_blob_into(store, t, offset, len, workers, &mut |b: Bytes| {
        out.write_all(&b)
    })
}

/// [`copy_blob`], handing each verified leaf (trimmed to the range) to `out` as a
/// [`Bytes`] that shares the store's read buffer, so a caller that forwards the bytes
/// (a network response) makes no copy of its own.
pub fn copy_blob_into(
    store: &dyn ChunkStore,
    t: &TreeRef,
    offset: u64,
    len: u64,
    workers: usize,
    out: &mut dyn FnMut(Bytes) -> io::Result<()>,
) -> Result<u64> {
    use std::sync::mpsc;

    expect_kind(t, &[TreeKind::Blob], "copy_blob")?;
    let start = offset.min(t.count);
    let end = start.saturating_add(len).min(t.count);
    if start == end {
        return Ok(0);
    }
    // A slice of a couple of windows gains nothing from threads.
    let workers = if end - start <= 2 * COPY_WINDOW_BYTES {
        1
    } else {
        workers.clamp(1, COPY_BLOB_MAX_WORKERS)
    };
    let write_err = |e: io::Error| Error::io("writing a blob", e);
    let mut cursor = NodeCursor::new(store, t, 0);
    // Blob offset of the next leaf the cursor yields.
    let mut next_leaf = cursor.seek(start, false)?;
    // Takes the cursor's next window: its leaves and where the first one starts.
    let mut take_window = |cursor: &mut NodeCursor<'_>| -> Result<Option<(u64, Vec<Entry>)>> {
        let from = next_leaf;
        let (entries, upto) =
            take_leaves(cursor, from, end, COPY_WINDOW_LEAVES, COPY_WINDOW_BYTES)?;
        next_leaf = upto;
        Ok((!entries.is_empty()).then_some((from, entries)))
    };
    let fetch = |entries: &[Entry]| fetch_leaves(store, entries);
    // Writes a window's leaves, trimmed to start..end; returns the bytes written.
    let emit = |from: u64,
                leaves: Vec<Bytes>,
                out: &mut dyn FnMut(Bytes) -> io::Result<()>|
     -> Result<u64> {
        let mut at = from;
        let mut n = 0u64;
        for leaf in leaves {
            let leaf_end = at + leaf.len() as u64;
            if leaf.is_empty() {
                return Err(corrupt_err(&t.root, "empty blob leaf"));
            }
            if leaf_end <= start || at >= end {
                at = leaf_end;
                continue;
            }
            let s = (start.max(at) - at) as usize;
            let x = (end.min(leaf_end) - at) as usize;
            out(leaf.slice(s..x)).map_err(write_err)?;
            n += (x - s) as u64;
            at = leaf_end;
        }
        Ok(n)
    };

    let mut written = 0u64;
    if workers == 1 {
        while let Some((from, entries)) = take_window(&mut cursor)? {
            written += emit(from, fetch(&entries)?, out)?;
        }
    } else {
        std::thread::scope(|scope| -> Result<()> {
            // Window k goes to worker k % workers; each worker answers in order, so window
            // k's answer is the next one on that worker's channel.
            let mut jobs = Vec::with_capacity(workers);
            let mut results = Vec::with_capacity(workers);
            for _ in 0..workers {
                let (job_tx, job_rx) = mpsc::channel::<Vec<Entry>>();
                let (res_tx, res_rx) = mpsc::channel::<Result<Vec<Bytes>>>();
                let fetch = &fetch;
                scope.spawn(move || {
                    for entries in job_rx {
                        if res_tx.send(fetch(&entries)).is_err() {
                            return;
                        }
                    }
                });
                jobs.push(job_tx);
                results.push(res_rx);
            }
            let mut starts = VecDeque::new();
            let (mut sent, mut done) = (0usize, 0usize);
            let mut more = true;
            loop {
                while more && sent - done < 2 * workers {
                    match take_window(&mut cursor)? {
                        Some((from, entries)) => {
                            starts.push_back(from);
                            jobs[sent % workers].send(entries).map_err(|_| {
                                Error::io(
                                    "reading a blob",
                                    io::Error::other("a reader thread stopped"),
                                )
                            })?;
                            sent += 1;
                        }
                        None => more = false,
                    }
                }
                let Some(from) = starts.pop_front() else {
                    break;
                };
                let leaves = results[done % workers].recv().map_err(|_| {
                    Error::io(
                        "reading a blob",
                        io::Error::other("a reader thread stopped"),
                    )
                })??;
                done += 1;
                written += emit(from, leaves, out)?;
            }
            // Dropping the job senders ends the workers.
            drop(jobs);
            Ok(())
        })?;
    }
    if written != end - start {
        return Err(corrupt_err(&t.root, "blob tree ends before its count"));
    }
    Ok(written)
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.end || buf.is_empty() {
            return Ok(0);
        }
        let leaf_end = self.leaf_start + self.leaf.len() as u64;
        if self.pos < self.leaf_start || self.pos >= leaf_end {
            self.fill().map_err(io::Error::other)?;
        }
        let off = (self.pos - self.leaf_start) as usize;
        let n = (self.leaf.len() - off)
            .min(buf.len())
            .min((self.end - self.pos) as usize);
        buf[..n].copy_from_slice(&self.leaf[off..off + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlobReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let len = self.len() as i128;
        let rel = (self.pos - self.start) as i128;
        let new = match to {
            SeekFrom::Start(n) => n as i128,
            SeekFrom::End(d) => len + d as i128,
            SeekFrom::Current(d) => rel + d as i128,
        };
        if new < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the blob",
            ));
        }
        let new = u64::try_from(new).unwrap_or(u64::MAX);
        self.pos = self.start.saturating_add(new);
        Ok(new)
    }
}

/// One element yielded by [`Iter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    /// The Set/Map key, or the List element.
    pub key: Bytes,
    /// The Map value (`None` for List and Set).
    pub value: Option<Bytes>,
}

enum Start {
    Index(u64),
    Key(Bytes, bool),
    Failed(Error),
}

enum Stop {
    Count(u64),
    Key(Bound<Bytes>),
}

/// A lazy iterator over the elements of a List, Set or Map tree (or a range of one),
/// loading one leaf at a time. Stops after the first error.
pub struct Iter<'a> {
    cursor: ElemCursor<'a>,
    start: Option<Start>,
    stop: Stop,
    done: bool,
}

impl<'a> Iter<'a> {
    fn new(store: &'a dyn ChunkStore, t: &TreeRef, start: Start, stop: Stop) -> Self {
        let start = match expect_kind(t, &[TreeKind::List, TreeKind::Set, TreeKind::Map], "iter") {
            Ok(()) => start,
            Err(e) => Start::Failed(e),
        };
        Iter {
            cursor: ElemCursor::new(store, t),
            start: Some(start),
            stop,
            done: false,
        }
    }

    fn step(&mut self) -> Result<Option<Element>> {
        match self.start.take() {
            Some(Start::Index(i)) => self.cursor.seek_item(i)?,
            Some(Start::Key(k, after)) => self.cursor.seek_key(&k, after)?,
            Some(Start::Failed(e)) => return Err(e),
            None => {}
        }
        if let Stop::Count(n) = self.stop
            && self.cursor.pos() >= n
        {
            return Ok(None);
        }
        let Some(e) = self.cursor.next()? else {
            return Ok(None);
        };
        if let Stop::Key(b) = &self.stop {
            let inside = match b {
                Bound::Included(k) => e.key <= *k,
                Bound::Excluded(k) => e.key < *k,
                Bound::Unbounded => true,
            };
            if !inside {
                return Ok(None);
            }
        }
        Ok(Some(Element {
            key: e.key,
            value: e.value,
        }))
    }
}

impl Iterator for Iter<'_> {
    type Item = Result<Element>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Iterates every element of a List, Set or Map tree.
pub fn iter<'a>(store: &'a dyn ChunkStore, t: &TreeRef) -> Iter<'a> {
    Iter::new(store, t, Start::Index(0), Stop::Count(t.count))
}

/// Iterates List elements `start..end` (`end` clamped to the length). `start` past the end
/// or after `end` yields one [`Error::InvalidInput`].
pub fn list_range<'a>(store: &'a dyn ChunkStore, t: &TreeRef, start: u64, end: u64) -> Iter<'a> {
    let end = end.min(t.count);
    let s = if t.kind != TreeKind::List {
        Start::Failed(Error::TypeMismatch(format!(
            "list_range works on List trees, this one is a {:?}",
            t.kind
        )))
    } else if start > end {
        Start::Failed(Error::invalid(format!(
            "list range {start}..{end} is invalid for a list of {}",
            t.count
        )))
    } else {
        Start::Index(start)
    };
    Iter::new(store, t, s, Stop::Count(end))
}

/// Iterates the Map entries (or Set keys) with keys between `from` and `to`.
pub fn map_range<'a>(
    store: &'a dyn ChunkStore,
    t: &TreeRef,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
) -> Iter<'a> {
    let s = if !t.kind.is_sorted() {
        Start::Failed(Error::TypeMismatch(format!(
            "map_range works on Map and Set trees, this one is a {:?}",
            t.kind
        )))
    } else {
        match from {
            Bound::Included(k) => Start::Key(Bytes::copy_from_slice(k), false),
            Bound::Excluded(k) => Start::Key(Bytes::copy_from_slice(k), true),
            Bound::Unbounded => Start::Index(0),
        }
    };
    let stop = Stop::Key(match to {
        Bound::Included(k) => Bound::Included(Bytes::copy_from_slice(k)),
        Bound::Excluded(k) => Bound::Excluded(Bytes::copy_from_slice(k)),
        Bound::Unbounded => Bound::Unbounded,
    });
    Iter::new(store, t, s, stop)
}

/// Element `index` of a List tree (`None` past the end).
pub fn list_get(store: &dyn ChunkStore, t: &TreeRef, index: u64) -> Result<Option<Bytes>> {
    expect_kind(t, &[TreeKind::List], "list_get")?;
    if index >= t.count {
        return Ok(None);
    }
    let mut c = ElemCursor::new(store, t);
    c.seek_item(index)?;
    Ok(c.next()?.map(|e| e.key))
}

fn find(store: &dyn ChunkStore, t: &TreeRef, key: &[u8]) -> Result<Option<Option<Bytes>>> {
    let mut c = ElemCursor::new(store, t);
    c.seek_key(key, false)?;
    Ok(match c.next()? {
        Some(e) if e.key.as_ref() == key => Some(e.value),
        _ => None,
    })
}

/// The value stored under `key` in a Map tree.
pub fn map_get(store: &dyn ChunkStore, t: &TreeRef, key: &[u8]) -> Result<Option<Bytes>> {
    expect_kind(t, &[TreeKind::Map], "map_get")?;
    Ok(find(store, t, key)?.flatten())
}

/// True when `key` is in a Set tree.
pub fn set_contains(store: &dyn ChunkStore, t: &TreeRef, key: &[u8]) -> Result<bool> {
    expect_kind(t, &[TreeKind::Set], "set_contains")?;
    Ok(find(store, t, key)?.is_some())
}
