//! The embedded, crash-safe default backend: [`LogStore`].
//!
//! A Bitcask-style log-structured store: chunks are appended to segment files and found
//! through an in-memory hash index; refs live in memory and are persisted by commit records
//! appended to the same segment log, after the chunks they name. Nothing is ever
//! overwritten in place.
//!
//! # Directory layout
//!
//! | file | contents |
//! | --- | --- |
//! | `MANIFEST` | `"CAIRNMAN"`, format version (2), hash algorithm code, 2 zero bytes, CRC32 of the first 12 bytes. Written once, atomically (temporary file, fsync, rename, fsync directory). An existing store keeps its algorithm whatever [`LogStoreOptions::algo`] asks for; a store of another format version is refused. |
//! | `LOCK` | Held with an exclusive `flock` while the store is open; a second opener gets [`Error::Unavailable`]. |
//! | `seg-NNNNNN.log` | Append-only segments of chunk, tombstone and commit records. The highest-numbered one is *active* (appended to); the others are *sealed* (immutable, fully synced: when sealed, or under `Buffered` by a thread right after, see below). A new segment is started when the active one reaches [`LogStoreOptions::segment_size`]. |
//! | `seg-NNNNNN.hint` | For a sealed segment: its records in file order without chunk payloads (see below), so opening does not reread the data. Optional: a missing or damaged hint (CRC, or length mismatch with its segment) makes open rescan the segment and rewrite it (unless the segment is damaged). |
//! | `refs.snap` | Snapshot of the whole refs map and the sequence number of the last commit it includes, written atomically and durably (temporary file, fsync, rename, fsync directory) when [`LogStoreOptions::refs_log_max`] bytes of commit records were written since the last one (and twice the snapshot's size), and by compaction before it deletes a segment holding commit records the snapshot does not cover. |
//! | `refs-copy.snap` | The same bytes, written after `refs.snap`: read when `refs.snap` is damaged or missing, and each rewritten from the other at open when they differ (best effort); damage to either is reported. |
//! | `RECOVERY.log` | Damage crash recovery found, one line per place, appended durably; kept until an operator clears it ([`ChunkStore::clear_recovery_notes`]). |
//! | `RECOVERY.cleared` | The notes an operator cleared: damage that stays in the file (bit rot in the durable region is never cut) is not raised again, new damage is. |
//!
//! # Segment records
//!
//! A segment starts with a 16-byte header (`"CAIRNSEG"`, segment id u32, segment format
//! version (3; 2 is still read and appended to), hash algorithm code, 2 zero bytes).
//! Records follow back to back; integers are little-endian:
//!
//! ```text
//! 0   u32  crc    CRC32 of header bytes 8..50 and the payload (format 2: of bytes 4..)
//! 4   u32  hcrc   CRC32 of the segment id (u32), the record's offset (u64) and header
//!                 bytes 8..50 (format 2: of header bytes 8..50 alone); tells a damaged
//!                 payload from a damaged header, and binds the record to its place
//! 8   u8   kind   1 = chunk, 2 = tombstone (the chunk named by cid was removed), 3 = commit
//! 9   3    zero
//! 12  u32  len    payload length (0 for a tombstone)
//! 16  34   key    chunk, tombstone: multihash of the chunk
//!                 commit: u64 commit sequence number, then 26 zero bytes
//! 50  len  payload
//! ```
//!
//! A commit record's payload is one [`RefStore::commit`] batch in the canonical encoding of
//! `cairn-core`: update count (varint), then per update `1, name, value` (set) or
//! `2, name` (delete), names and values length-prefixed. A record is the unit of atomicity:
//! a batch is all-or-nothing. Sequence numbers increase by one per commit record in log
//! order (segment by segment). A commit record with no updates is a *sync marker*, written
//! by [`LogStore::sync`], by removals and when the store is closed, so that records written
//! since the last commit count as acknowledged. Since a commit follows, in the same log,
//! every chunk put before it, no watermark is needed: a commit is durable only if the
//! chunks before it are.
//!
//! Binding `hcrc` to the record's place matters when a scan resynchronises past a damaged
//! header: it searches byte by byte for the next header that passes its checks, and a
//! chunk's payload may hold records (a copy of a store kept in a store, or bytes that
//! happen to form one). Such a copy checks out only where it was first written, so the
//! scan skips it instead of replaying a tombstone or a commit it never wrote there.
//!
//! # Hint files
//!
//! `"CAIRNHNT"`, format version, 3 zero bytes, segment length (u64), entry count (u32), the
//! entries in file order, CRC32 of everything before it. A chunk or tombstone entry is
//! `kind u8, cid (34 bytes), offset u64, length u32`; a commit entry is `3, sequence number
//! u64, offset u64, length u32`, followed by the commit's payload, so that open replays
//! commits without reading the segment. Entries must tile the segment exactly.
//!
//! # Recovery (open)
//!
//! 1. Take the lock, read (or create) the manifest, then delete the temporary files this
//!    store's atomic writes left (`MANIFEST.tmp`, `refs.tmp`, `refs-copy.tmp`,
//!    `seg-NNNNNN.tmp`; no other name) and hints of missing segments. A commit sequence
//!    number read within 2^40 of `u64::MAX` is refused as not this store's.
//! 2. Read `refs.snap` (if any; its copy `refs-copy.snap` when it is damaged or missing).
//! 3. Sealed segments: load the hint file, or scan the records. A hint is written when a
//!    segment is sealed, with the commit payloads read back and checked against their
//!    record checksums (a commit record that fails gets the segment no hint, so every open
//!    rescans it and reports the damage). All of a sealed segment is
//!    durable (it was synced before it was sealed; under `Buffered`, just after), so
//!    damage there is bit rot: handled as
//!    in the durable region below, reported, and no hint is written for that segment (so
//!    the damage is reported at every open). Replay records into the index in segment
//!    order: a chunk record (re)points the cid to itself, a tombstone removes it.
//! 4. The active segment is scanned record by record.
//!    - *Torn tail*: after its last intact commit record, the first record that is
//!      incomplete or fails a checksum starts a torn tail (the scan checks frames, not
//!      payload hashes: a chunk stored under a wrong cid is found by its first read): the
//!      file is truncated there. A write interrupted part way (a crash mid-`pwrite`, a
//!      page that never reached the disk) was never acknowledged, so that cut is not
//!      damage. But when the cut holds a commit record whose header is intact
//!      and whose payload fails its checksum without being zeros from a 512-byte sector
//!      boundary on (what an interrupted write or a torn sector leaves, the segment being
//!      zero-filled ahead), a commit is lost that may have been acknowledged (bit rot after
//!      its sync): the cut is then reported as damage (one entry in `damage`, kept as a
//!      recovery note) rather than passed over in silence. So is a cut that starts at a
//!      whole record header failing its checks when none of the sectors it touches holds
//!      only zeros from where the record starts (an unwritten sector reads as the zeros the
//!      segment was filled with ahead, and sectors land in any order): it may have been the
//!      last commit record.
//!    - *Last group*: the records after the last commit record that is followed by a
//!      non-commit record (or after the segment header), up to and including the run of
//!      commit records that ends with the last intact one (a sync marker is a commit
//!      record, so it ends a group too). A region skipped by a resync (below) counts as
//!      commit records when it is the only region skipped between two accepted commit
//!      records and the second one's sequence number shows that commit records were lost
//!      there. A group reaches the file in one `pwrite` and is made durable by one
//!      `fdatasync`, and the next group is written only after that returned; but pages
//!      reach the disk in any order, so a power loss during that `fdatasync` can leave the
//!      group's commit records on disk and not an earlier page of it. So if any part of the
//!      last group is damaged (a record failing its checksum, bytes skipped by a resync, an
//!      out-of-sequence commit record), the group was never acknowledged: the file is truncated at its first damaged byte, and
//!      the group's commit records from there on are not applied (reported as a torn tail:
//!      `segment_bytes_truncated`, `segment_stop`, and one entry in `damage`). Commit
//!      records with no other record between them cannot be told apart from one group: a
//!      run of commit-only groups after a group's chunks is judged as one last group, so
//!      damage there costs the acknowledged commits of that run from the damage on.
//!    - *Earlier groups*: everything before the last group was acknowledged (synced)
//!      before the next group was written, so damage there is bit rot and never truncated:
//!      a record with a sound header and a bad payload is kept (reads of it fail with
//!      [`Error::Corrupt`]; a damaged commit record's updates are lost and counted in
//!      `commits_dropped`); a record whose header fails its checks is skipped by searching
//!      forward byte by byte for the next offset where a record header passes its header
//!      checksum and the record fits in the file, and the scan continues from there.
//!      Chunks in skipped bytes are absent from the index; the damage is counted in
//!      [`RecoveryReport`] (`damaged_records`, `damaged_bytes`, `damage`).
//!
//!    The same rules hold under [`Durability::Buffered`].
//!
//!    The active segment is then synced, so that what a killed run wrote but never synced
//!    is durable before it is replayed (and before a snapshot could take it in).
//!
//!    A chunk whose record is kept with a bad payload, or whose record fails its check on
//!    a later read (including reads by compaction), counts as absent to
//!    [`ChunkStore::has`] and to puts: putting the chunk again writes a sound copy, which
//!    the index then points at, rather than trusting the damaged one.
//!
//!    In every segment, a resync can lock onto a record embedded in a chunk payload. So
//!    after a resync, until a commit record is accepted, a commit record numbered above the
//!    snapshot's must follow the highest sequence number seen so far (`h`): its number must
//!    lie in `h + 1 ..= h + 1 + s / 50`, where `s` is the bytes skipped since the last
//!    accepted commit record (they can have held at most `s / 50` commit records; exactly
//!    `h + 1` when none could). Any other is reported in `damage`, ignored, and does not
//!    raise the sequence number.
//! 5. Refs: the snapshot, then every intact commit record with a higher sequence number, in
//!    log order. The next commit gets the highest sequence number left in the log (or the
//!    snapshot's) plus one.
//!
//! What recovery did is reported by [`LogStore::recovery`]; [`LogStore::commit_counters`]
//! counts commits, groups and syncs.
//!
//! # Writes and durability
//!
//! Chunk puts are appended to an in-memory write buffer ([`LogStoreOptions::write_buffer`],
//! 1 MiB by default) that is written with one `pwrite` when full: no system call per put.
//! Reads use `pread`, and serve records still in the buffer from memory. Every read is
//! verified against its cid.
//!
//! A commit is queued in the group that is gathering, and a *leader* (the first committer
//! to find no leader active) takes the oldest queued group, then: appends one commit record
//! per batch after the buffered chunk records and writes the buffer with a single `pwrite`;
//! (unless [`Durability::Buffered`]) `fdatasync`s the active segment once, which makes the
//! group's chunks and commits durable together; hands leadership to the next queued group
//! (one of its committers is woken and writes it, while the old leader finishes); applies
//! the batches to the refs in order (groups apply in log order even when the next leader
//! is quick); and wakes the group's committers with one broadcast (committers wait by group
//! number, so a finished group wakes only its own members). A commit is visible only after
//! its bytes are written (and synced, where the level asks for it). Segments roll only
//! between groups. Refs are kept twice in memory: a hash map for point lookups
//! ([`RefStore::get_ref`]) and an ordered map for prefix listings and snapshots, which
//! catches up after the group's committers are woken (or when a listing needs it). After
//! the wake-ups, off the commit path, the old leader keeps the active segment zero-filled
//! 1 MiB ahead of its data, so that a group's `fdatasync` rarely changes the file size (no
//! inode write); zeros never parse as a record, and are cut off when the segment is sealed,
//! when the store is closed, and (not reported as a torn tail) at open.
//!
//! - [`Durability::PerWrite`]: the leader takes one batch at a time: one `pwrite` and one
//!   `fdatasync` per commit.
//! - [`Durability::Group`]: the leader takes every queued batch; commits that arrive during
//!   a sync form the next group. A lone committer never waits for company.
//! - [`Durability::Buffered`]: as `Group`, with no syncs: a commit returns once its bytes
//!   (and the chunks before it) were handed to the kernel. Survives kill -9, not power
//!   loss.
//!
//! When the active segment fills up it is written out, `fdatasync`ed, sealed and its hint
//! written; the next segment is created with its header and its directory entry synced.
//! Under [`Durability::Buffered`] the `fdatasync` of the sealed segment is left to a thread
//! of its own (one segment queued at most; closing the store and writing `refs.snap` wait
//! for it), so the writer does not stall while a whole segment is written out: buffered
//! commits are not synced anyway, and a power loss right after a seal, which this level
//! does not promise to survive, shows up as reported damage in that segment at the next
//! open. Before writing `refs.snap` a buffered store syncs what the snapshot covers.
//! After a failed write or `fdatasync` on the commit path the store refuses further writes
//! (the kernel may have dropped the dirty pages) until it is reopened.
//!
//! # Removal and compaction
//!
//! [`ChunkStore::remove`] appends a tombstone per removed chunk and drops it from the index
//! (followed by a sync marker and synced under `PerWrite`/`Group`). [`ChunkStore::compact`]
//! seals the active segment if it is mostly garbage, then rewrites every sealed segment
//! whose garbage (bytes not referenced by the index; commit records are garbage) is at
//! least half its data. A segment holding commit records is only rewritten once a durable
//! `refs.snap` covers its highest sequence number (compaction writes one if needed; if the
//! last commits are not applied yet, the segment waits for the next compaction). Live
//! chunks are verified and appended again to the active segment, tombstones are carried
//! forward only while an older segment still holds a record they must suppress; the active
//! segment is synced, and only then are the old segments deleted, oldest first, and the
//! directory synced. A crash at any point leaves either the old or the new copy findable.
//! Damaged segments are not deleted.

mod format;
mod refs;
mod segment;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cairn_core::error::IoContext;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{
    Bytes, ChunkStore, Cid, Durability, Error, HashAlgo, RefStore, RefUpdate, Result, StoreStats,
};
use format::{
    CommitEntry, FRAME_HEADER_LEN, HintEntry, KIND_CHUNK, KIND_TOMBSTONE, MAX_CHUNK_LEN,
    SEG_HEADER_LEN,
};
use refs::Op;
use segment::{Durable, Segment, SeqBefore};

/// Options for opening a [`LogStore`].
#[derive(Clone, Debug)]
pub struct LogStoreOptions {
    /// Durability of commits.
    pub durability: Durability,
    /// Hash algorithm for a new store (an existing store keeps its own).
    pub algo: HashAlgo,
    /// Size at which the active segment is sealed and a new one started (default 256 MiB).
    pub segment_size: u64,
    /// Size of the in-memory write buffer for chunk records (default 1 MiB).
    pub write_buffer: usize,
    /// Bytes of commit records written since the last `refs.snap` past which a new snapshot
    /// is written (default 64 MiB; they must also be twice the size of the last snapshot).
    /// Compaction writes one too when it needs to delete a segment holding commit records.
    pub refs_log_max: u64,
    /// Bytes of the most recently written log kept in the page cache besides the active
    /// segment (default 256 MiB; `None`: all of it, until the kernel needs the memory).
    /// Sealed segments are dropped from the page cache once this many bytes were written
    /// after them (`posix_fadvise(DONTNEED)`, 8 MiB at a time, Linux only), so that
    /// writing keeps reusing the same memory instead of taking fresh pages: on a virtual
    /// machine that hands freed memory back to its host, a write into never-touched
    /// memory cost about six times the CPU of one into reused memory (see
    /// `docs/benchmarks.md`, "Page-cache window"). Reads of dropped data come from the
    /// disk (and are cached again by the kernel).
    pub page_cache_window: Option<u64>,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            durability: Durability::default(),
            algo: HashAlgo::default(),
            segment_size: 256 << 20,
            write_buffer: 1 << 20,
            refs_log_max: 64 << 20,
            page_cache_window: Some(256 << 20),
        }
    }
}

/// What [`LogStore::open`] found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from the end of the active segment (a torn tail, or a last group of writes
    /// that was not durably written).
    pub segment_bytes_truncated: u64,
    /// Commit records in acknowledged data that could not be replayed (checksum failure or
    /// out-of-order sequence number after damage): their updates are lost, and `damage`
    /// says which.
    pub commits_dropped: u64,
    /// Records kept although their payload checksum fails (reads of them report corruption).
    pub damaged_records: u64,
    /// Why the active segment's scan found a torn tail, if it did.
    pub segment_stop: Option<String>,
    /// Bytes of acknowledged (durable) segment data skipped because record headers there
    /// were damaged; the records in them are lost (not truncated: the bytes stay).
    pub damaged_bytes: u64,
    /// One description per damaged place found in acknowledged data (file, offset, what),
    /// plus one when the active segment's last group of writes was cut because part of it
    /// never reached the disk (see the module documentation, Recovery).
    pub damage: Vec<String>,
}

/// Where a chunk record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    seg: u32,
    /// Offset of the record header.
    off: u64,
    /// Payload length.
    len: u32,
}

impl Loc {
    fn frame_len(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + self.len as u64
    }
}

const SHARDS: usize = 16;

/// Most bytes [`LogStore`]'s `get_many` reads with one `pread`.
const GET_MANY_RUN: u64 = 1 << 20;

/// The commit path keeps the active segment extended with zeros this far ahead of its data,
/// so that a group's `fdatasync` usually overwrites allocated blocks without changing the
/// file size (no filesystem journal commit: measurably cheaper). Zeros never parse as a
/// record; they are cut off when the segment is sealed or the store closed, and at open.
const PREALLOC: u64 = 1 << 20;

/// The cid → location index, sharded to keep readers and the writer off each other.
struct Index {
    shards: Vec<RwLock<ChunkMap>>,
}

/// One index shard. Keyed by foldhash with a per-process random seed: cheaper than
/// std's SipHash per lookup (every leaf of a streamed blob is one lookup), still keyed, so
/// a writer who grinds contents for colliding cids cannot aim at this process's buckets.
type ChunkMap = HashMap<Cid, Loc, foldhash::fast::RandomState>;

impl Index {
    fn new() -> Self {
        Index {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(ChunkMap::default()))
                .collect(),
        }
    }

    fn shard(&self, cid: &Cid) -> &RwLock<ChunkMap> {
        &self.shards[cid.digest()[31] as usize % SHARDS]
    }

    fn get(&self, cid: &Cid) -> Option<Loc> {
        self.shard(cid).read().get(cid).copied()
    }

    fn contains(&self, cid: &Cid) -> bool {
        self.shard(cid).read().contains_key(cid)
    }

    fn insert(&self, cid: Cid, loc: Loc) {
        self.shard(&cid).write().insert(cid, loc);
    }

    fn remove(&self, cid: &Cid) -> Option<Loc> {
        self.shard(cid).write().remove(cid)
    }

    fn replay(&self, seg: u32, records: &[HintEntry]) {
        for r in records {
            match r.kind {
                KIND_CHUNK => self.insert(
                    r.cid,
                    Loc {
                        seg,
                        off: r.off,
                        len: r.len,
                    },
                ),
                _ => {
                    self.remove(&r.cid);
                }
            }
        }
    }
}

/// The single appender to the active segment.
struct Writer {
    seg: Arc<Segment>,
    /// Records not yet written to the file; they start at `seg.flushed`.
    buf: Vec<u8>,
    cap: usize,
    /// Every chunk and tombstone record of the active segment, for its hint file.
    hints: Vec<HintEntry>,
    /// Every commit record of the active segment (payloads not kept: read back for the
    /// hint file when the segment is sealed).
    commits: Vec<CommitEntry>,
    /// Sequence number of the next commit record.
    next_seq: u64,
    /// Chunk or tombstone records were appended after the last commit record.
    dirty: bool,
    /// The active segment held damage when the store was opened: it gets no hint file when
    /// sealed, so every open rescans it and reports the damage again (a hint would carry a
    /// damaged commit's payload as if it were intact).
    damaged: bool,
    /// End of the zeros written ahead of the data of the active segment (see [`PREALLOC`]).
    alloc_end: u64,
    /// Offset of the active segment up to which the kernel was asked to start writing
    /// pages back (see [`WRITEBACK_STEP`]).
    writeback: u64,
    /// The thread that makes those requests (`None`: made inline).
    writeback_thread: Option<Writeback>,
    /// Bytes written to the segments sealed since the store was opened: the position of the
    /// active segment's first byte in the stream of everything written since then.
    base: u64,
    /// Ranges of sealed segments not yet dropped from the page cache, oldest first (see
    /// [`LogStoreOptions::page_cache_window`]).
    behind: VecDeque<Behind>,
}

/// A range of a sealed segment still in the page cache.
struct Behind {
    /// Not kept open by this: a segment deleted by compaction is simply skipped.
    seg: std::sync::Weak<Segment>,
    from: u64,
    to: u64,
    /// Position of the segment's first byte in the stream of everything written since the
    /// store was opened.
    start: u64,
}

/// Bytes that must pass out of the page-cache window before the next part of the log is
/// dropped from the page cache (one `posix_fadvise` call each time).
const DROP_STEP: u64 = 8 << 20;

/// Bytes of chunk records written to the active segment (not yet synced) after which the
/// kernel is asked to start writing them to the disk (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`, which does not wait), at the levels that sync. A large put
/// then overlaps its disk writes with chunking and hashing, and its commit's `fdatasync`
/// waits only for the last few MiB instead of every page of the upload (RocksDB's
/// `bytes_per_sync` does the same).
const WRITEBACK_STEP: u64 = 2 << 20;

/// A thread that asks the kernel to start writing back ranges of segments
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). The call "does not wait" for the writes,
/// but it does submit them, which can take a millisecond or two per request (block
/// allocation, queueing); made by the appender, under the writer's lock, that stalled
/// every put and commit behind it. The thread takes that off them.
struct Writeback {
    jobs: std::sync::mpsc::SyncSender<(Arc<Segment>, u64, u64)>,
}

impl Writeback {
    /// Starts the thread; `None` when the system refuses one (requests are then inline),
    /// and where there is no `sync_file_range` to ask for (nothing to do).
    fn start() -> Option<Writeback> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let (jobs, todo) = std::sync::mpsc::sync_channel::<(Arc<Segment>, u64, u64)>(4);
        std::thread::Builder::new()
            .name("cairn-writeback".into())
            .spawn(move || {
                // Ends when the writer (the only sender) is dropped.
                for (seg, off, len) in todo {
                    segment::start_writeback(&seg.file, off, len);
                }
            })
            .ok()?;
        Some(Writeback { jobs })
    }
}

/// Under [`Durability::Buffered`], syncs each sealed segment on a thread of its own, so
/// that sealing does not stall the writer while up to a whole segment of dirty pages is
/// written out (about 90 ms per 256 MiB segment on the project's machine). Buffered
/// commits are not synced anyway: what a sealed segment holds survives the death of the
/// process as soon as it is written to the kernel, and after a power loss, which this
/// level does not promise to survive, damage recovery finds in a recently sealed segment
/// is reported as damage. The queue holds one segment: a writer that seals the next one
/// while the previous is still being synced waits for it, so unsynced data stays bounded.
/// A failed sync fails the store, as one on the commit path does. Closing the store waits
/// for the queue ([`Sealer::finish`]), and so does writing `refs.snap`.
struct Sealer {
    jobs: Mutex<Option<std::sync::mpsc::SyncSender<SealJob>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Work for the [`Sealer`] thread, done in order.
enum SealJob {
    /// Sync this sealed segment, written up to this offset, then write its hint file
    /// (path and bytes) if any: a hint is written only once its segment is durable.
    Seal(Arc<Segment>, u64, Option<(PathBuf, PathBuf, Vec<u8>)>),
    /// Answer once every job before this one is done.
    Barrier(std::sync::mpsc::SyncSender<()>),
}

impl Sealer {
    /// Starts the thread; `None` when the system refuses one (segments are then synced
    /// inline).
    fn start(failed: Arc<Mutex<Option<String>>>, flag: Arc<AtomicBool>) -> Option<Sealer> {
        let (jobs, todo) = std::sync::mpsc::sync_channel::<SealJob>(1);
        let thread = std::thread::Builder::new()
            .name("cairn-sealer".into())
            .spawn(move || {
                for job in todo {
                    match job {
                        SealJob::Seal(seg, end, hint) => match seg.sync(end) {
                            Ok(()) => {
                                if let Some((dir, path, bytes)) = hint {
                                    let _ = format::write_atomic(&dir, &path, &bytes, false);
                                }
                            }
                            Err(e) => {
                                let mut f = failed.lock();
                                if f.is_none() {
                                    *f = Some(format!("syncing {}: {e}", seg.path.display()));
                                }
                                flag.store(true, Ordering::Release);
                            }
                        },
                        SealJob::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .ok()?;
        Some(Sealer {
            jobs: Mutex::new(Some(jobs)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn sender(&self) -> Option<std::sync::mpsc::SyncSender<SealJob>> {
        self.jobs.lock().clone()
    }

    /// Hands a sealing job to the thread (waiting while the queue is full); gives it back
    /// when the thread is gone (the caller then does it inline).
    fn seal(&self, job: SealJob) -> Option<SealJob> {
        match self.sender() {
            Some(j) => j.send(job).err().map(|e| e.0),
            None => Some(job),
        }
    }

    /// Waits until every segment handed over so far is synced (or its sync failed, which
    /// fails the store).
    fn wait(&self) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self
            .sender()
            .is_some_and(|j| j.send(SealJob::Barrier(tx)).is_ok())
        {
            let _ = rx.recv();
        }
    }

    /// Ends the thread once it has synced every segment handed over.
    fn finish(&self) {
        self.jobs.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Writer {
    /// Asks the kernel to start writing back what was flushed since the last request, if
    /// that is at least [`WRITEBACK_STEP`] bytes past both it and the last sync. A hint:
    /// it does not wait, and an error shows up at the next `fdatasync`, which reports it.
    /// The request goes to the writeback thread; when that thread is still busy with
    /// earlier ones, this one waits for the next step (the commit's `fdatasync` writes
    /// whatever no request covered).
    fn start_writeback(&mut self) {
        let flushed = self.seg.flushed.load(Ordering::Acquire);
        let from = self.writeback.max(self.seg.synced.load(Ordering::Acquire));
        if flushed < from.saturating_add(WRITEBACK_STEP) {
            return;
        }
        match &self.writeback_thread {
            Some(t) => {
                if t.jobs
                    .try_send((self.seg.clone(), from, flushed - from))
                    .is_err()
                {
                    return;
                }
            }
            None => segment::start_writeback(&self.seg.file, from, flushed - from),
        }
        self.writeback = flushed;
    }

    fn end(&self) -> u64 {
        self.seg.flushed.load(Ordering::Acquire) + self.buf.len() as u64
    }

    /// The parts of sealed segments written more than `window` bytes before the end of the
    /// data written so far, [`DROP_STEP`] bytes at a time (`None`: none), to be dropped from
    /// the page cache by [`drop_cached`]. Sealed segments were synced when sealed, so their
    /// pages are clean and one request drops them. The active segment is never dropped: its
    /// commit records are read back when it is sealed.
    fn drop_behind(&mut self, window: Option<u64>) -> Vec<(Arc<Segment>, u64, u64)> {
        let mut jobs = Vec::new();
        let Some(window) = window else {
            return jobs;
        };
        let flushed = self.seg.flushed.load(Ordering::Acquire);
        let Some(cut) = (self.base + flushed).checked_sub(window) else {
            return jobs;
        };
        while let Some(b) = self.behind.front_mut() {
            let upto = b.to.min(cut.saturating_sub(b.start)).max(b.from);
            if upto < b.to && upto < b.from + DROP_STEP {
                break;
            }
            if upto > b.from
                && let Some(seg) = b.seg.upgrade()
            {
                jobs.push((seg, b.from, upto - b.from));
            }
            if upto < b.to {
                b.from = upto;
                break;
            }
            self.behind.pop_front();
        }
        jobs
    }

    fn append(&mut self, frame: &format::Frame, kind: u8, cid: Cid, payload: &[u8]) -> Loc {
        let off = self.end();
        self.buf
            .extend_from_slice(&frame.seal(self.seg.place().at(off), payload));
        self.buf.extend_from_slice(payload);
        self.dirty = true;
        let len = payload.len() as u32;
        self.hints.push(HintEntry {
            kind,
            cid,
            off,
            len,
        });
        Loc {
            seg: self.seg.id,
            off,
            len,
        }
    }

    /// Appends a commit record with the next sequence number; returns that number.
    fn append_commit(&mut self, ops: &[u8]) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let off = self.end();
        self.buf.extend_from_slice(
            &format::commit_header(seq, ops).seal(self.seg.place().at(off), ops),
        );
        self.buf.extend_from_slice(ops);
        self.commits.push(CommitEntry {
            seq,
            off,
            len: ops.len() as u32,
            ops: None,
            intact: true,
        });
        self.dirty = false;
        seq
    }

    /// Keeps zeros written [`PREALLOC`] bytes ahead of the end of the data (best effort).
    /// Half a [`PREALLOC`] at a time: the zeros' pages are written out by the next group's
    /// `fdatasync`, and one slow sync in many measured better than all syncs a bit slower.
    fn prealloc(&mut self) {
        let end = self.end();
        if self.alloc_end >= end + PREALLOC / 2 {
            return;
        }
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = self.alloc_end.max(end);
        let to = end + PREALLOC;
        while at < to {
            let n = (to - at).min(ZEROS.len() as u64);
            if self
                .seg
                .file
                .write_all_at(&ZEROS[..n as usize], at)
                .is_err()
            {
                return;
            }
            at += n;
            self.alloc_end = at;
        }
    }

    /// Cuts the zeros written ahead of the data off the file (before sealing or closing).
    /// Judged by the file's length, not by `alloc_end`: a write of zeros that failed part
    /// way may have extended the file without moving it.
    fn trim(&mut self) -> std::io::Result<()> {
        let end = self.seg.flushed.load(Ordering::Acquire);
        if self.alloc_end > end || self.seg.file.metadata()?.len() > end {
            self.seg.file.set_len(end)?;
        }
        self.alloc_end = 0;
        Ok(())
    }

    /// Writes the buffer to the file (no sync).
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let at = self.seg.flushed.load(Ordering::Acquire);
        if let Err(e) = self.seg.file.write_all_at(&self.buf, at) {
            // Part of the buffer may have reached the file (a short write, then ENOSPC):
            // whole commit records among it would be replayed by a reopen although their
            // commits failed. Cut the file back to what was written before (best effort;
            // the caller fails the store, so the buffer is not needed again).
            self.buf.clear();
            if self.seg.file.set_len(at).is_ok() {
                self.alloc_end = 0;
            }
            return Err(Error::io(format!("writing {}", self.seg.path.display()), e));
        }
        self.seg
            .flushed
            .store(at + self.buf.len() as u64, Ordering::Release);
        self.buf.clear();
        if self.buf.capacity() > 4 * self.cap {
            self.buf = Vec::with_capacity(self.cap);
        }
        Ok(())
    }
}

/// The refs map and the sequence number of the last commit applied to it.
struct RefsState {
    /// Every ref, ordered, except the updates in `pending`.
    map: BTreeMap<Bytes, Bytes>,
    /// Updates already in `LogStore::lookup` and not yet in `map`, in order: a group's
    /// committers are woken once `lookup` has their updates, and `map` catches up after
    /// (or first, when a reader needs it).
    pending: Vec<Op>,
    seq: u64,
    /// The last commit group applied (group numbers restart at 1 with every open).
    group: u64,
}

/// The last `refs.snap` written, and the commit bytes written since.
struct SnapState {
    seq: u64,
    len: u64,
    since: u64,
}

/// A commit waiting for a leader.
struct Pending {
    ops_bytes: Vec<u8>,
    ops: Vec<Op>,
    /// The group it is written in.
    group: u64,
    /// Sync even under [`Durability::Buffered`] ([`LogStore::sync`]).
    force: bool,
    /// A sync marker, not a commit: written (as an empty commit) only when records follow
    /// the last commit record, so that they too count as acknowledged.
    marker: bool,
}

/// Group-commit state.
struct Queue {
    /// True while some committer leads (from taking the queue until it hands over or finds
    /// the queue empty).
    leader: bool,
    /// Commits waiting for a leader, oldest first.
    pending: VecDeque<Pending>,
    /// Number of the group that queued commits join (groups are numbered from 1, in the
    /// order they are written). Under [`Durability::PerWrite`] every commit is a group.
    gathering: u64,
}

/// Waiting places of committers, one per group number modulo [`WAKE_RING`]: a finished
/// group wakes all its committers with one broadcast, and no other group's.
struct WakeSlot {
    lock: std::sync::Mutex<()>,
    cv: std::sync::Condvar,
}

/// Under `Group` and `Buffered` at most three groups have waiters at once (one finishing,
/// one being written, one gathering); under `PerWrite` every waiting committer is a group,
/// and groups that share a place wake each other for nothing, so there are many places.
const WAKE_RING: usize = 64;

/// The error of a failed group, until every committer of the group has collected it.
struct Failure {
    group: u64,
    msg: String,
    /// Committers of the group that have not collected it yet.
    left: usize,
}

/// How a waiting committer's wait ended.
enum Woken {
    /// Its group is written (or failed).
    Done,
    /// It leads now: its group is the oldest one queued.
    Lead,
}

/// The embedded log-structured store (see the module documentation for the format).
pub struct LogStore {
    dir: PathBuf,
    algo: HashAlgo,
    opts: LogStoreOptions,
    _lock: File,
    index: Index,
    segments: RwLock<BTreeMap<u32, Arc<Segment>>>,
    writer: Mutex<Writer>,
    refs: RwLock<RefsState>,
    /// The same refs by name, for point lookups (the ordered map costs a string comparison
    /// per level, which is most of a lookup once there are many refs). Updated under the
    /// `refs` write lock, before `refs` itself, so a reader never sees a ref go back.
    lookup: RwLock<HashMap<Bytes, Bytes>>,
    snap: Mutex<SnapState>,
    queue: Mutex<Queue>,
    /// Highest group written (and synced, where the level asks for it); groups finish in
    /// order.
    done: AtomicU64,
    /// A group whose committers should take over leadership (0: none).
    handoff: AtomicU64,
    wake: [WakeSlot; WAKE_RING],
    failures: Mutex<Vec<Failure>>,
    any_failure: AtomicBool,
    /// Chunks the index points at whose stored record failed its checksum (at open) or
    /// its check on a read: a put of one writes a fresh copy instead of trusting it.
    damaged: Mutex<HashSet<Cid>>,
    any_damaged: AtomicBool,
    compact_lock: Mutex<()>,
    /// Why the store refuses writes (shared with the sealer thread, see [`Sealer`]).
    failed: Arc<Mutex<Option<String>>>,
    failed_flag: Arc<AtomicBool>,
    /// Under [`Durability::Buffered`], the thread that syncs sealed segments (`None`:
    /// synced inline when sealed).
    sealer: Option<Sealer>,
    /// Tests: the next `fdatasync` on the commit path fails.
    #[cfg(test)]
    fail_next_sync: AtomicBool,
    recovery: RecoveryReport,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    groups: AtomicU64,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
}

/// Counters of the commit path since the store was opened (for benchmarks and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitCounters {
    /// Commits written.
    pub commits: u64,
    /// Groups they were written in (one segment write each).
    pub groups: u64,
    /// `fdatasync` calls on the commit path (one per group at most).
    pub syncs: u64,
    /// Time spent in those calls, in microseconds.
    pub sync_micros: u64,
}

/// Whether `name` is a temporary file this store writes ([`format::write_atomic`] of the
/// manifest, the refs snapshot or its copy, or a hint).
fn is_own_tmp(name: &str) -> bool {
    let own = |file: &str| format::tmp_path(std::path::Path::new(file)).as_os_str() == name;
    own(format::MANIFEST)
        || own(format::REFS_SNAP)
        || own(format::REFS_SNAP_COPY)
        || own(DAMAGE_MARKS)
        || format::parse_segment_name(name, ".tmp").is_some()
}

fn garbage_heavy(data: u64, live: u64) -> bool {
    data == 0 || (data > live && (data - live) * 2 >= data)
}

impl LogStore {
    /// [`LogStore::open`], waiting up to `timeout` while another process has the store
    /// open; `waiting` is called once (with the reason) if the wait passes half a second.
    pub fn open_waiting(
        dir: &Path,
        opts: LogStoreOptions,
        timeout: std::time::Duration,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<Self> {
        let start = std::time::Instant::now();
        let mut told = false;
        loop {
            match LogStore::open(dir, opts.clone()) {
                Err(Error::Unavailable(msg)) if start.elapsed() < timeout => {
                    if !told && start.elapsed().as_millis() > 500 {
                        waiting(&msg);
                        told = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// Opens or creates a store in `dir`, recovering from any crash (see the module
    /// documentation). Fails with [`Error::Unavailable`] when another process (or another
    /// `LogStore` in this one) has it open.
    pub fn open(dir: &Path, opts: LogStoreOptions) -> Result<Self> {
        // The directories this open creates: each one's entry in its parent is synced, or
        // a power loss could take a new store, acknowledged commits and all, with it.
        let created: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
        fs::create_dir_all(dir).ctx(|| format!("creating store directory {}", dir.display()))?;
        for d in created.iter().rev() {
            if let Some(parent) = d.parent() {
                // `cairn-data`'s parent is "": the working directory.
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                format::sync_dir(parent)?;
            }
        }
        let dir = dir.to_path_buf();
        let lock_path = dir.join(format::LOCK);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .ctx(|| format!("opening {}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(Error::Unavailable(format!(
                    "store {} is in use by another process",
                    dir.display()
                )));
            }
            Err(TryLockError::Error(e)) => {
                return Err(Error::io(format!("locking {}", lock_path.display()), e));
            }
        }

        // Directory listing.
        let mut seg_ids = Vec::new();
        let mut hint_ids = Vec::new();
        let mut leftovers = Vec::new();
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = format::parse_segment_name(name, ".log") {
                seg_ids.push(id);
            } else if let Some(id) = format::parse_segment_name(name, ".hint") {
                hint_ids.push(id);
            } else if is_own_tmp(name) {
                leftovers.push(entry.path());
            }
        }
        seg_ids.sort_unstable();

        // Manifest.
        let mpath = dir.join(format::MANIFEST);
        let algo = match fs::read(&mpath) {
            Ok(b) => format::parse_manifest(&b, &mpath)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !seg_ids.is_empty() {
                    return Err(Error::corrupt(format!(
                        "{} is missing but the directory holds segments",
                        mpath.display()
                    )));
                }
                format::write_atomic(&dir, &mpath, &format::manifest_bytes(opts.algo), true)?;
                opts.algo
            }
            Err(e) => return Err(Error::io(format!("reading {}", mpath.display()), e)),
        };
        // Files an interrupted atomic write left (only this store's names, and only once
        // the manifest says the directory is a store: a mistyped path deletes nothing).
        for p in leftovers {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", p.display()), e)),
            }
        }
        // Hints of missing segments go, and so does a hint of the last segment: it is the
        // active one, and a hint is only for sealed ones (a roll whose next segment could
        // not be made leaves one behind, which could hide damage the segment holds).
        for id in hint_ids {
            if seg_ids.binary_search(&id).is_err() || seg_ids.last() == Some(&id) {
                let p = format::hint_path(&dir, id);
                fs::remove_file(&p).ctx(|| format!("removing {}", p.display()))?;
            }
        }

        let mut report = RecoveryReport::default();

        // Refs snapshot (commit records replayed on top of it come from the segments), or
        // its copy when it is damaged or gone; each is then rewritten from the other.
        let snap_path = dir.join(format::REFS_SNAP);
        let copy_path = dir.join(format::REFS_SNAP_COPY);
        let read_snapshot = |path: &Path| -> Result<Option<(refs::Snapshot, Vec<u8>)>> {
            match fs::read(path) {
                Ok(b) => {
                    let body = format::parse_snapshot(&b, path)?;
                    let s = refs::decode_snapshot(body)
                        .map_err(|e| Error::corrupt(format!("{}: {e}", path.display())))?;
                    Ok(Some((s, b)))
                }
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
            }
        };
        let primary = read_snapshot(&snap_path);
        let copy = read_snapshot(&copy_path);
        // A rewrite is best effort (the copy is redundancy, and a full disk must not keep
        // a store from opening to serve reads); the next snapshot writes both anyway. Until
        // both hold the same snapshot, none counts as covering any commit (`pair_ok`), so
        // compaction writes both before it deletes a segment whose commits only the newer
        // one holds (the older one, read after the newer one rots, would roll refs back).
        let mut pair_ok = true;
        let (snap, snap_len) = match (primary, copy) {
            (Ok(Some((s, b))), copy) => {
                match &copy {
                    Ok(Some((_, c))) if *c == b => {}
                    // Written before copies were kept, or a crash between the two writes.
                    Ok(_) => {
                        pair_ok = format::write_atomic(&dir, &copy_path, &b, true).is_ok();
                    }
                    Err(e) => {
                        report.damage.push(format!(
                            "{e} (the copy of refs.snap at commit {}): rewritten from refs.snap",
                            s.seq
                        ));
                        pair_ok = format::write_atomic(&dir, &copy_path, &b, true).is_ok();
                    }
                }
                (Some(s), b.len() as u64)
            }
            (Ok(None), Ok(None)) => (None, 0),
            (primary, Ok(Some((s, b)))) => {
                let why = match primary {
                    Err(e) => e.to_string(),
                    Ok(_) => format!("{} is missing", snap_path.display()),
                };
                report.damage.push(format!(
                    "{why}: read its copy, {} (commit {}), and rewrote it",
                    copy_path.display(),
                    s.seq
                ));
                pair_ok = format::write_atomic(&dir, &snap_path, &b, true).is_ok();
                (Some(s), b.len() as u64)
            }
            (Err(e), _) => return Err(e),
            // The snapshot gone and its copy damaged: nothing to fall back on.
            (Ok(None), Err(e)) => return Err(e),
        };
        let snap_seq = snap.as_ref().map_or(0, |s| s.seq);
        let mut commits: Vec<(u32, CommitEntry)> = Vec::new();
        let mut max_seq = snap_seq;

        // Sealed segments.
        let index = Index::new();
        // Chunk records whose checksum fails, as (cid, segment, offset).
        let mut bad_chunks: Vec<(Cid, u32, u64)> = Vec::new();
        let mut segments = BTreeMap::new();
        let last = seg_ids.last().copied();
        // A `buffered` run's sealer syncs sealed segments after the fact: one being synced
        // and one queued may still be only in the page cache if that run was killed. Make
        // them durable before anything here trusts them (a hint written for one, a
        // snapshot covering commits that need its chunks).
        for &id in seg_ids.iter().filter(|&&id| Some(id) != last).rev().take(2) {
            let path = format::segment_path(&dir, id);
            fs::File::open(&path)
                .and_then(|f| f.sync_data())
                .ctx(|| format!("syncing {}", path.display()))?;
        }
        for &id in seg_ids.iter().filter(|&&id| Some(id) != last) {
            let (file, path, len, bound, note) = Segment::open(&dir, id)?;
            report.damage.extend(note);
            let seg = Segment::from_parts(id, path, file, len, bound);
            let before = SeqBefore {
                max: max_seq,
                floor: snap_seq,
            };
            let sealed = sealed_records(&dir, &seg, algo, true, snap_seq, before)?;
            report.damaged_records += sealed.damaged;
            report.damaged_bytes += sealed.skipped;
            report.damage.extend(sealed.damage);
            index.replay(id, &sealed.records);
            bad_chunks.extend(sealed.bad_chunks.iter().map(|&(cid, off)| (cid, id, off)));
            max_seq = max_seq.max(sealed.max_seq);
            commits.extend(sealed.commits.into_iter().map(|c| (id, c)));
            segments.insert(id, seg);
        }

        // The active segment.
        let mut active_damaged = false;
        let (active, hints, active_commits) = match last {
            None => (Segment::create(&dir, 1, algo)?, Vec::new(), Vec::new()),
            Some(id) => {
                let (file, path, len, bound, note) = Segment::open(&dir, id)?;
                let damaged_format = note.is_some();
                report.damage.extend(note);
                // A header of zeros and nothing after it: the file's length reached the disk
                // but its header did not (a crash inside `Segment::create`).
                let zero_header = len == SEG_HEADER_LEN && {
                    let mut h = [0u8; SEG_HEADER_LEN as usize];
                    file.read_exact_at(&mut h, 0)
                        .ctx(|| format!("reading {}", path.display()))?;
                    h.iter().all(|&b| b == 0)
                };
                if len < SEG_HEADER_LEN || zero_header {
                    // Torn while being created: it never held a record.
                    file.set_len(0)
                        .and_then(|_| file.write_all_at(&format::segment_header(id, algo), 0))
                        .and_then(|_| file.sync_all())
                        .ctx(|| format!("initialising {}", path.display()))?;
                    report.segment_bytes_truncated = len;
                    (
                        // The header just written is the current format's.
                        Segment::from_parts(id, path, file, SEG_HEADER_LEN, true),
                        Vec::new(),
                        Vec::new(),
                    )
                } else {
                    let mut h = [0u8; SEG_HEADER_LEN as usize];
                    file.read_exact_at(&mut h, 0)
                        .ctx(|| format!("reading {}", path.display()))?;
                    if damaged_format {
                        // Reported above: the first record told the format.
                        h[12] = if bound {
                            format::SEG_VERSION
                        } else {
                            format::SEG_VERSION_UNBOUND
                        };
                    }
                    if let Err(why) = format::check_segment_header(&h, id, algo) {
                        // The file name gives the id and the manifest the algorithm: a
                        // header hit by bit rot is rewritten when the segment's first
                        // record, whose checksum binds it to this segment and place, says
                        // the file is this segment (or when no record follows, so nothing
                        // rests on it). Otherwise the store does not open: the bytes may
                        // be another file's.
                        let mut first = [0u8; FRAME_HEADER_LEN];
                        let bound_first = len >= SEG_HEADER_LEN + FRAME_HEADER_LEN as u64
                            && file.read_exact_at(&mut first, SEG_HEADER_LEN).is_ok()
                            && format::parse_frame_header(
                                &first,
                                format::SegPlace { id, bound: true }.at(SEG_HEADER_LEN),
                            )
                            .is_ok();
                        let empty =
                            !bound_first && segment::all_zeros(&file, &path, SEG_HEADER_LEN, len)?;
                        // Magic and id intact with another store's hash algorithm is a
                        // segment of another store, not bit rot: refused.
                        let foreign = h.starts_with(format::SEG_MAGIC)
                            && h[8..12] == id.to_le_bytes()
                            && HashAlgo::from_code(h[13]).is_ok_and(|a| a != algo);
                        if foreign || !(bound_first || empty) {
                            return Err(Error::corrupt(format!("{}: {why}", path.display())));
                        }
                        let mut fresh = format::segment_header(id, algo);
                        // In the format the segment's records are written in (and go on
                        // being written in: `bound` below).
                        fresh[12] = if bound {
                            format::SEG_VERSION
                        } else {
                            format::SEG_VERSION_UNBOUND
                        };
                        let note = format!(
                            "{}: the header was damaged ({why}); {}: rewritten",
                            path.display(),
                            if bound_first {
                                "its first record is bound to this segment"
                            } else {
                                "no record follows it"
                            }
                        );
                        // The note first: a crash after the rewrite would leave no word.
                        record_recovery_notes(
                            &dir,
                            &RecoveryReport {
                                damage: vec![note.clone()],
                                ..Default::default()
                            },
                        )?;
                        file.write_all_at(&fresh, 0)
                            .and_then(|()| file.sync_data())
                            .ctx(|| format!("rewriting the header of {}", path.display()))?;
                        report.damage.push(note);
                    }
                    let before = SeqBefore {
                        max: max_seq,
                        floor: snap_seq,
                    };
                    let scan = segment::scan(
                        &file,
                        &path,
                        format::SegPlace { id, bound },
                        len,
                        Durable::UpToLastCommit,
                        snap_seq,
                        before,
                    )?;
                    if scan.end < len {
                        // Zeros written ahead of the data are not a torn tail.
                        if !segment::all_zeros(&file, &path, scan.end, len)? {
                            report.segment_bytes_truncated = len - scan.end;
                            report.segment_stop = scan.stop;
                            // The notes first: a crash after the cut but before the notes
                            // at the end of `open` would leave no word of what was cut.
                            // (The notes at the end add only what is new.)
                            let mut so_far = report.clone();
                            so_far.damage.extend(scan.damage.iter().cloned());
                            record_recovery_notes(&dir, &so_far)?;
                        }
                        file.set_len(scan.end)
                            .and_then(|_| file.sync_all())
                            .ctx(|| format!("truncating torn tail of {}", path.display()))?;
                    }
                    // What the last run wrote and never synced (it was killed before its
                    // sync) may still be only in the page cache, yet it is replayed below
                    // and a snapshot could soon take it in: make it durable first (the
                    // sealed segments a killed sealer left were synced above).
                    file.sync_data()
                        .ctx(|| format!("syncing {}", path.display()))?;
                    active_damaged = scan.damaged > 0;
                    report.damaged_records += scan.damaged;
                    report.damaged_bytes += scan.skipped;
                    report.damage.extend(scan.damage);
                    index.replay(id, &scan.records);
                    bad_chunks.extend(scan.bad_chunks.iter().map(|&(cid, off)| (cid, id, off)));
                    max_seq = max_seq.max(scan.max_seq);
                    let mine = scan
                        .commits
                        .iter()
                        .map(|c| CommitEntry {
                            ops: None,
                            ..c.clone()
                        })
                        .collect();
                    commits.extend(scan.commits.into_iter().map(|c| (id, c)));
                    (
                        Segment::from_parts(id, path, file, scan.end, bound),
                        scan.records,
                        mine,
                    )
                }
            }
        };
        // The active segment's entry in the directory: a run killed inside
        // `Segment::create` may have left it unsynced, and this run acknowledges commits in
        // it with `fdatasync`s of the file alone.
        format::sync_dir(&dir)?;
        segments.insert(active.id, active.clone());

        // Refs: the snapshot, then the commit records after it, in log order.
        let mut map = snap.map(|s| s.map).unwrap_or_default();
        let mut last_seq = snap_seq;
        let mut since = 0u64;
        for (id, c) in commits {
            if c.seq <= snap_seq {
                continue;
            }
            since += FRAME_HEADER_LEN as u64 + c.len as u64;
            let seg = format::segment_name(id);
            let at = || format!("{seg} at offset {}: commit {}", c.off, c.seq);
            if !c.intact {
                // Already described in `damage`.
                report.commits_dropped += 1;
                continue;
            }
            if c.seq <= last_seq {
                report.commits_dropped += 1;
                report.damage.push(format!(
                    "{}: sequence number not above {last_seq}; ignored",
                    at()
                ));
                continue;
            }
            let Some(body) = c.ops else { continue };
            match refs::decode_ops(&body) {
                Ok(ops) => {
                    last_seq = c.seq;
                    refs::apply(&mut map, ops);
                }
                Err(e) => {
                    report.commits_dropped += 1;
                    report.damage.push(format!("{}: undecodable: {e}", at()));
                }
            }
        }

        // Records a read found damaged in an earlier run (see `persist_damage_mark`); the
        // marks that no longer apply (a fresh copy was written, or compaction moved or
        // dropped the record) are dropped from the file.
        let marks_path = dir.join(DAMAGE_MARKS);
        if let Ok(bytes) = fs::read(&marks_path) {
            // Line by line: a damaged or cut line costs only its own mark.
            let lines = bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty());
            let marks: Vec<(Cid, u32, u64)> = lines
                .clone()
                .filter_map(|l| {
                    let mut f = std::str::from_utf8(l).ok()?.split(' ');
                    let cid = f.next()?.parse().ok()?;
                    Some((cid, f.next()?.parse().ok()?, f.next()?.parse().ok()?))
                })
                .collect();
            let live: Vec<&(Cid, u32, u64)> = marks
                .iter()
                .filter(|(cid, seg, off)| {
                    index
                        .get(cid)
                        .is_some_and(|l| l.seg == *seg && l.off == *off)
                })
                .collect();
            if live.len() < lines.count() {
                let kept: String = live
                    .iter()
                    .map(|(c, s, o)| format!("{c} {s} {o}\n"))
                    .collect();
                let _ = format::write_atomic(&dir, &marks_path, kept.as_bytes(), true);
            }
            bad_chunks.extend(marks);
        }
        // A damaged chunk record the index still points at (no later copy replaced it)
        // counts as absent for puts, so putting the chunk again writes a sound copy.
        let damaged: HashSet<Cid> = bad_chunks
            .into_iter()
            .filter(|&(cid, seg, off)| {
                index
                    .get(&cid)
                    .is_some_and(|l| l.seg == seg && l.off == off)
            })
            .map(|(cid, _, _)| cid)
            .collect();
        // Sequence numbers grow by one a commit: one read this close to the end was not
        // written by this store (a crafted or damaged file whose CRC happens to hold).
        if max_seq >= u64::MAX - (1 << 40) {
            return Err(Error::corrupt(format!(
                "store {}: commit sequence number {max_seq} is near its limit; the refs \
                 snapshot or a commit record was not written by this store",
                dir.display()
            )));
        }
        let cap = opts.write_buffer.max(4096);
        let failed = Arc::new(Mutex::new(None));
        let failed_flag = Arc::new(AtomicBool::new(false));
        let sealer = if opts.durability == Durability::Buffered {
            Sealer::start(failed.clone(), failed_flag.clone())
        } else {
            None
        };
        Ok(LogStore {
            algo,
            any_damaged: AtomicBool::new(!damaged.is_empty()),
            damaged: Mutex::new(damaged),
            index,
            segments: RwLock::new(segments),
            writer: Mutex::new(Writer {
                seg: active,
                buf: Vec::with_capacity(cap),
                cap,
                hints,
                commits: active_commits,
                next_seq: max_seq + 1,
                dirty: false,
                damaged: active_damaged,
                alloc_end: 0,
                writeback: 0,
                writeback_thread: if opts.durability == Durability::Buffered {
                    None
                } else {
                    Writeback::start()
                },
                base: 0,
                behind: VecDeque::new(),
            }),
            lookup: RwLock::new(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            refs: RwLock::new(RefsState {
                map,
                pending: Vec::new(),
                seq: last_seq,
                group: 0,
            }),
            snap: Mutex::new(SnapState {
                seq: if pair_ok { snap_seq } else { 0 },
                len: snap_len,
                since,
            }),
            queue: Mutex::new(Queue {
                leader: false,
                pending: VecDeque::new(),
                gathering: 1,
            }),
            done: AtomicU64::new(0),
            handoff: AtomicU64::new(0),
            wake: std::array::from_fn(|_| WakeSlot {
                lock: std::sync::Mutex::new(()),
                cv: std::sync::Condvar::new(),
            }),
            failures: Mutex::new(Vec::new()),
            any_failure: AtomicBool::new(false),
            compact_lock: Mutex::new(()),
            failed,
            failed_flag,
            sealer,
            #[cfg(test)]
            fail_next_sync: AtomicBool::new(false),
            recovery: {
                record_recovery_notes(&dir, &report)?;
                report
            },
            counters: Counters::default(),
            _lock: lock,
            dir,
            opts,
        })
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// What opening the store found and repaired.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Counters of the commit path since open.
    pub fn commit_counters(&self) -> CommitCounters {
        let c = &self.counters;
        CommitCounters {
            commits: c.commits.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            sync_micros: c.sync_nanos.load(Ordering::Relaxed) / 1000,
        }
    }

    /// `fdatasync`s a file on the commit path; a failure poisons the store.
    fn timed_sync(&self, seg: &Segment, upto: u64) -> Result<()> {
        let t = std::time::Instant::now();
        let path = &seg.path;
        #[cfg(test)]
        if self.fail_next_sync.swap(false, Ordering::AcqRel) {
            let e = std::io::Error::other("injected fdatasync failure");
            return Err(self.fail(Error::io(format!("syncing {}", path.display()), e)));
        }
        seg.sync(upto)
            .map_err(|e| self.fail(Error::io(format!("syncing {}", path.display()), e)))?;
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.counters
            .sync_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Paths of the segment files, oldest first (the last is the active one).
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        self.segments
            .read()
            .values()
            .map(|s| s.path.clone())
            .collect()
    }

    /// Writes buffered records and `fdatasync`s the active segment, whatever the durability
    /// level. Records written since the last commit are followed by a sync marker (an empty
    /// commit record), so that recovery treats them as acknowledged.
    pub fn sync(&self) -> Result<()> {
        self.check_failed()?;
        let (ops_bytes, ops) = refs::encode_ops(&[]);
        self.enqueue(ops_bytes, ops, true, true)
    }

    /// After a failed `fdatasync` of the active segment `seg` (the store is failed already):
    /// cuts the file back to what is known durable. Past it lie only records no commit
    /// acknowledged (at the levels that sync), and their pages may stay in the page cache
    /// marked clean although they never reached the disk: a reopen in this boot would read
    /// them and replay commits that were reported as failed. Best effort: a cut that fails
    /// leaves the file as it was.
    fn cut_unsynced(&self, seg: &Segment) {
        let mut w = self.writer.lock();
        w.buf.clear();
        if seg.cut_to_synced().is_ok() {
            w.alloc_end = 0;
        }
    }

    /// Records a fatal write error: further writes are refused until the store is reopened.
    fn fail(&self, e: Error) -> Error {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some(e.to_string());
        }
        self.failed_flag.store(true, Ordering::Release);
        e
    }

    /// True when the index holds `cid` and its record is not known to be damaged.
    fn holds_sound(&self, cid: &Cid) -> bool {
        self.index.contains(cid)
            && !(self.any_damaged.load(Ordering::Acquire) && self.damaged.lock().contains(cid))
    }

    /// Marks chunk `cid` damaged after its record at `at` failed to read (`rot`: failed
    /// its checks, rather than an I/O error), if the index still points there: a put may
    /// have written a fresh copy meanwhile, which must not be marked. A record that failed
    /// its checks is also noted durably ([`LogStore::persist_damage_mark`]), unless the
    /// store has failed (it writes nothing more); an I/O error, which may pass, is not.
    fn mark_damaged(&self, cid: &Cid, at: Loc, rot: bool) {
        // Puts change the index under the writer's lock.
        let _w = self.writer.lock();
        if self.index.get(cid) != Some(at) {
            return;
        }
        let first = self.damaged.lock().insert(*cid);
        self.any_damaged.store(true, Ordering::Release);
        if first && rot && !self.failed_flag.load(Ordering::Acquire) {
            self.persist_damage_mark(cid, at);
        }
    }

    /// Notes a damage mark in [`DAMAGE_MARKS`], so that the next open marks the record
    /// again: a sealed segment opened from its hint is not rescanned, so a record a read
    /// found bad (a `cairn verify`) would otherwise count as held again in the next
    /// process (the `cairn put` meant to repair it deduplicated against it). A mark names
    /// the record's place, so it lapses once a fresh copy of the chunk is written. Best
    /// effort: a mark that is not written only loses that.
    fn persist_damage_mark(&self, cid: &Cid, loc: Loc) {
        let path = self.dir.join(DAMAGE_MARKS);
        // Led by a newline: a line cut short by an earlier failed append stays apart.
        let line = format!("\n{cid} {} {}\n", loc.seg, loc.off);
        let _ = append_durably(&self.dir, &path, &line);
    }

    fn check_failed(&self) -> Result<()> {
        if !self.failed_flag.load(Ordering::Acquire) {
            return Ok(());
        }
        let msg = self.failed.lock().clone().unwrap_or_default();
        Err(Error::Unavailable(format!(
            "store {} refuses writes after an earlier error ({msg}); reopen it",
            self.dir.display()
        )))
    }

    /// After an append: writes the buffer out when full and rolls the segment when full.
    fn after_append(&self, w: &mut Writer) -> Result<()> {
        if w.buf.len() >= w.cap {
            w.flush().map_err(|e| self.fail(e))?;
            if self.opts.durability != Durability::Buffered {
                w.start_writeback();
            }
        }
        if w.end() >= self.opts.segment_size {
            self.roll(w)?;
            // A large put may roll many segments before its commit: drop them as it goes
            // (sealed segments are clean, so this starts no disk writes).
            drop_cached(w.drop_behind(self.opts.page_cache_window));
        }
        Ok(())
    }

    /// Seals the active segment (written, synced, hint written) and starts the next one.
    fn roll(&self, w: &mut Writer) -> Result<()> {
        w.flush().map_err(|e| self.fail(e))?;
        let old = w.seg.clone();
        let end = old.flushed.load(Ordering::Acquire);
        w.trim()
            .map_err(|e| self.fail(Error::io(format!("trimming {}", old.path.display()), e)))?;
        // The hint of the sealed segment (an optimisation: if it is lost, open rescans the
        // segment). A segment that held damage gets none, so that every open finds and
        // reports the damage.
        let hints = std::mem::take(&mut w.hints);
        let mut commits = std::mem::take(&mut w.commits);
        let damaged = std::mem::replace(&mut w.damaged, false);
        let hint =
            (!damaged && segment::read_commit_ops(&old, end, &mut commits).is_ok()).then(|| {
                (
                    self.dir.clone(),
                    format::hint_path(&self.dir, old.id),
                    format::hint_bytes(end, &hints, &commits),
                )
            });
        // Buffered: synced, then its hint written, by the sealer thread (see `Sealer`);
        // otherwise now, as commits whose chunks it holds may be acknowledged once the
        // next segment is synced.
        let job = SealJob::Seal(old.clone(), end, hint);
        let inline = match &self.sealer {
            Some(s) => s.seal(job),
            None => Some(job),
        };
        if let Some(SealJob::Seal(_, _, hint)) = inline {
            #[cfg(test)]
            let synced = if self.fail_next_sync.swap(false, Ordering::AcqRel) {
                Err(std::io::Error::other("injected fdatasync failure"))
            } else {
                old.sync(end)
            };
            #[cfg(not(test))]
            let synced = old.sync(end);
            if let Err(e) = synced {
                let e = self.fail(Error::io(format!("syncing {}", old.path.display()), e));
                // As after a failed sync of the active segment (`cut_unsynced`, which takes
                // the writer this holds): the records past what is known durable go, or a
                // reopen in this boot would read them from pages the kernel may keep clean
                // though they never reached the disk, and take their chunks as stored
                // (a later put would deduplicate against them and its commit be
                // acknowledged). The segment stays the last one, so a reopen takes it as
                // the active one and finds the cut end. Not under `Buffered` (a sealer that
                // could not start): commits acknowledged unsynced lie past `synced`, and
                // they were promised to survive a crash of the process.
                if self.opts.durability != Durability::Buffered && old.cut_to_synced().is_ok() {
                    w.alloc_end = 0;
                }
                return Err(e);
            }
            if let Some((dir, path, bytes)) = hint {
                let _ = format::write_atomic(&dir, &path, &bytes, false);
            }
        }
        let id = old
            .id
            .checked_add(1)
            .ok_or_else(|| Error::invalid("segment ids exhausted"))?;
        let new = Segment::create(&self.dir, id, self.algo).map_err(|e| {
            // Leave no half-made segment behind (a reopen would take it for the active one
            // and the segment just sealed for a synced one), and accept no more writes.
            let path = format::segment_path(&self.dir, id);
            if std::fs::remove_file(&path).is_ok() {
                let _ = format::sync_dir(&self.dir);
            }
            self.fail(e)
        })?;
        self.segments.write().insert(id, new.clone());
        if self.opts.page_cache_window.is_some() {
            w.behind.push_back(Behind {
                seg: Arc::downgrade(&old),
                from: 0,
                to: end,
                start: w.base,
            });
        }
        w.base += end;
        w.seg = new;
        w.writeback = 0;
        Ok(())
    }

    /// Reads the record at `loc` (from the file, or from the write buffer).
    fn read_frame(&self, seg: &Segment, loc: Loc) -> Result<Vec<u8>> {
        let total = loc.frame_len();
        if loc.off + total > seg.flushed.load(Ordering::Acquire) {
            let w = self.writer.lock();
            let flushed = w.seg.flushed.load(Ordering::Acquire);
            if w.seg.id == seg.id && loc.off >= flushed {
                let start = (loc.off - flushed) as usize;
                return match w.buf.get(start..start + total as usize) {
                    Some(b) => Ok(b.to_vec()),
                    None => Err(Error::corrupt(format!(
                        "index points past the end of {} (offset {})",
                        seg.path.display(),
                        loc.off
                    ))),
                };
            }
        }
        match seg.read_at(total as usize, loc.off) {
            Ok(frame) => Ok(frame),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(Error::corrupt(format!(
                "{} ends inside the record at offset {}",
                seg.path.display(),
                loc.off
            ))),
            Err(e) => Err(Error::io(
                format!("reading {} at offset {}", seg.path.display(), loc.off),
                e,
            )),
        }
    }

    /// Reads and verifies the chunk `cid` stored at `loc` of `seg`.
    fn read_chunk(&self, cid: &Cid, seg: &Segment, loc: Loc) -> Result<Bytes> {
        // (Every failure to read is taken as damage, an I/O error too: the chunk is then
        // written anew by its next put, which costs a copy if the disk only hiccuped.)
        let where_ = || format!("{} at offset {}", seg.path.display(), loc.off);
        let frame = self.read_frame(seg, loc).map_err(|e| {
            self.mark_damaged(cid, loc, false);
            Error::corrupt(format!("chunk {cid} unreadable ({}): {e}", where_()))
        })?;
        Self::check_chunk_frame(cid, seg, loc, Bytes::from(frame))
            .inspect_err(|_| self.mark_damaged(cid, loc, true))
    }

    /// Checks a chunk's record as read from `seg` at `loc`: a chunk record of this cid and
    /// length whose payload hashes to the cid. Returns the payload.
    fn check_chunk_frame(cid: &Cid, seg: &Segment, loc: Loc, frame: Bytes) -> Result<Bytes> {
        let where_ = || format!("{} at offset {}", seg.path.display(), loc.off);
        let h = format::parse_frame_header(&frame, seg.place().at(loc.off))
            .map_err(|why| Error::corrupt(format!("chunk {cid} in {}: {why}", where_())))?;
        if h.kind != KIND_CHUNK || h.cid != Some(*cid) || h.len != loc.len {
            return Err(Error::corrupt(format!(
                "chunk {cid} in {}: the record there is not this chunk",
                where_()
            )));
        }
        let payload = frame.slice(FRAME_HEADER_LEN..);
        if !cid.matches(&payload) {
            return Err(Error::corrupt(format!(
                "chunk {cid} in {} does not match its hash",
                where_()
            )));
        }
        Ok(payload)
    }

    /// Writes one group of commits (the caller is the leader): their commit records go after
    /// the buffered chunk records, with one `pwrite` and (unless buffered) one `fdatasync`
    /// of the active segment. Returns the sequence number of the last commit record written
    /// (none when the group held only sync markers with nothing to mark). The group is
    /// applied to the refs by [`LogStore::apply_group`].
    fn write_group(&self, group: &[Pending]) -> Result<Option<u64>> {
        self.check_failed()?;
        let durable = self.opts.durability != Durability::Buffered || group.iter().any(|p| p.force);
        let mut written = 0u64;
        let mut last = None;
        let (seg, end) = {
            let mut w = self.writer.lock();
            // Segments roll between groups (a roll syncs the old segment before sealing it).
            if w.end() >= self.opts.segment_size {
                self.roll(&mut w)?;
            }
            for p in group {
                if p.marker && !w.dirty {
                    continue;
                }
                last = Some(w.append_commit(&p.ops_bytes));
                written += (FRAME_HEADER_LEN + p.ops_bytes.len()) as u64;
            }
            if let Err(e) = w.flush() {
                // `flush` cut the file back to where the write began (best effort) and
                // dropped the buffer: the store refuses everything until it is reopened.
                return Err(self.fail(e));
            }
            let seg = w.seg.clone();
            let end = seg.flushed.load(Ordering::Acquire);
            (seg, end)
        };
        if durable
            && seg.synced.load(Ordering::Acquire) < end
            && let Err(e) = self.timed_sync(&seg, end)
        {
            if self.opts.durability != Durability::Buffered {
                self.cut_unsynced(&seg);
            }
            return Err(e);
        }
        // A forced sync under `Buffered` (`sync()`, compaction before it deletes what it
        // copied) covers the segments sealed before it too, which the sealer may still be
        // syncing.
        if durable && let Some(s) = &self.sealer {
            s.wait();
            self.check_failed()?;
        }
        let commits = group.iter().filter(|p| !p.marker).count() as u64;
        if commits > 0 {
            self.counters.groups.fetch_add(1, Ordering::Relaxed);
            self.counters.commits.fetch_add(commits, Ordering::Relaxed);
        }
        if written > 0 {
            self.snap.lock().since += written;
        }
        Ok(last)
    }

    /// Applies written group `g` to the refs (`last`: its last commit record, if it wrote
    /// any; `None` also for a failed group, which applies nothing). Groups apply in order: a
    /// leader that took over while the previous one was still applying waits for it.
    fn apply_group(&self, g: u64, group: Vec<Pending>, last: Option<u64>) {
        loop {
            let mut r = self.refs.write();
            if r.group + 1 < g {
                drop(r);
                std::thread::yield_now();
                continue;
            }
            if let Some(last) = last {
                let mut l = self.lookup.write();
                for p in group {
                    for (name, value) in &p.ops {
                        match value {
                            Some(v) => l.insert(name.clone(), v.clone()),
                            None => l.remove(name),
                        };
                    }
                    r.pending.extend(p.ops);
                }
                r.seq = last;
            }
            r.group = r.group.max(g);
            return;
        }
    }

    /// Work after a group that its committers need not wait for: keeping zeros ahead of
    /// the data (see [`PREALLOC`]) and writing a refs snapshot when one is due.
    fn after_group(&self) {
        if self.failed_flag.load(Ordering::Acquire) {
            return;
        }
        let jobs = {
            let mut w = self.writer.lock();
            w.prealloc();
            w.drop_behind(self.opts.page_cache_window)
        };
        drop_cached(jobs);
        if !self.refs.read().pending.is_empty() {
            drain_pending(&mut self.refs.write());
        }
        let mut snap = self.snap.lock();
        if snap.since > self.opts.refs_log_max && snap.since > 2 * snap.len {
            // A failed snapshot is retried when as many bytes again were written.
            if self.write_snapshot(&mut snap).is_err() {
                snap.since /= 2;
            }
        }
    }

    /// The refs state with `map` up to date (read-locked).
    fn ordered_refs(&self) -> RwLockReadGuard<'_, RefsState> {
        let r = self.refs.read();
        if r.pending.is_empty() {
            return r;
        }
        drop(r);
        let mut w = self.refs.write();
        drain_pending(&mut w);
        RwLockWriteGuard::downgrade(w)
    }

    /// Writes `refs.snap` (durably) from the applied refs state, if it is newer.
    fn write_snapshot(&self, snap: &mut SnapState) -> Result<()> {
        let (seq, body) = {
            let r = self.ordered_refs();
            (r.seq, refs::snapshot_body(r.seq, &r.map))
        };
        if seq <= snap.seq {
            return Ok(());
        }
        if self.opts.durability == Durability::Buffered {
            // The snapshot is durable: so must be the commits it covers, which a buffered
            // store has only handed to the kernel (after a power loss the snapshot would
            // name chunks that never reached the disk). They are in the active segment as
            // of now or in segments sealed before: the sealer syncs those first.
            let (seg, upto) = {
                let w = self.writer.lock();
                (w.seg.clone(), w.seg.flushed.load(Ordering::Acquire))
            };
            if let Some(s) = &self.sealer {
                s.wait();
            }
            self.check_failed()?;
            seg.sync(upto)
                .map_err(|e| self.fail(Error::io(format!("syncing {}", seg.path.display()), e)))?;
        }
        let bytes = format::snapshot_bytes(&body);
        for name in [format::REFS_SNAP, format::REFS_SNAP_COPY] {
            format::write_atomic(&self.dir, &self.dir.join(name), &bytes, true)?;
        }
        snap.seq = seq;
        snap.len = bytes.len() as u64;
        snap.since = 0;
        Ok(())
    }

    /// Makes sure a durable `refs.snap` covers commit `seq`; false if it cannot yet (the
    /// commit is written but not applied).
    fn snapshot_covers(&self, seq: u64) -> Result<bool> {
        let mut snap = self.snap.lock();
        if snap.seq < seq {
            self.write_snapshot(&mut snap)?;
        }
        Ok(snap.seq >= seq)
    }

    /// Records of a sealed segment (hint, or a scan).
    fn sealed_records(&self, seg: &Segment) -> Result<Sealed> {
        sealed_records(
            &self.dir,
            seg,
            self.algo,
            false,
            u64::MAX,
            SeqBefore::UNCHECKED,
        )
    }

    /// Bytes of live records per segment.
    fn live_bytes(&self) -> HashMap<u32, u64> {
        let mut live = HashMap::new();
        for shard in &self.index.shards {
            for loc in shard.read().values() {
                *live.entry(loc.seg).or_insert(0) += loc.frame_len();
            }
        }
        live
    }
}

/// Brings the ordered refs map up to date with the updates applied since.
fn drain_pending(r: &mut RefsState) {
    let ops = std::mem::take(&mut r.pending);
    refs::apply(&mut r.map, ops);
}

/// The records of a sealed segment, and any damage found reading them.
#[derive(Default)]
struct Sealed {
    records: Vec<HintEntry>,
    commits: Vec<CommitEntry>,
    max_seq: u64,
    damaged: u64,
    skipped: u64,
    damage: Vec<String>,
    /// Chunk records whose checksum fails: `(cid, offset)`.
    bad_chunks: Vec<(Cid, u64)>,
}

/// Records of a sealed segment: from its hint file when valid, else by scanning it (and
/// then, when `write_hint` and the segment is undamaged, writing the hint). A sealed segment
/// was synced before it was sealed, so all of it is durable: damage is resynchronised over
/// and reported, never fatal.
fn sealed_records(
    dir: &Path,
    seg: &Segment,
    algo: HashAlgo,
    write_hint: bool,
    keep_after: u64,
    before: SeqBefore,
) -> Result<Sealed> {
    let len = seg.flushed.load(Ordering::Acquire);
    let hpath = format::hint_path(dir, seg.id);
    if let Ok(b) = fs::read(&hpath)
        && let Some((records, commits)) = format::parse_hint(&b, len, keep_after)
    {
        return Ok(Sealed {
            records,
            max_seq: commits.iter().map(|c| c.seq).max().unwrap_or(0),
            commits,
            ..Default::default()
        });
    }
    let mut damage = Vec::new();
    let mut h = [0u8; SEG_HEADER_LEN as usize];
    let header = match seg.file.read_exact_at(&mut h, 0) {
        Ok(()) => format::check_segment_header(&h, seg.id, algo),
        Err(e) => Err(format!("unreadable header: {e}")),
    };
    if let Err(why) = &header {
        damage.push(format!(
            "sealed segment {}: {why}",
            format::segment_name(seg.id)
        ));
    }
    let keep = if write_hint { 0 } else { keep_after };
    let mut scan = segment::scan(
        &seg.file,
        &seg.path,
        seg.place(),
        len,
        Durable::All,
        keep,
        before,
    )?;
    damage.extend(scan.damage);
    if write_hint && damage.is_empty() {
        let _ = format::write_atomic(
            dir,
            &hpath,
            &format::hint_bytes(len, &scan.records, &scan.commits),
            false,
        );
    }
    for c in scan.commits.iter_mut().filter(|c| c.seq <= keep_after) {
        c.ops = None;
    }
    Ok(Sealed {
        records: scan.records,
        commits: scan.commits,
        max_seq: scan.max_seq,
        damaged: scan.damaged + u64::from(header.is_err()),
        skipped: scan.skipped,
        damage,
        bad_chunks: scan.bad_chunks,
    })
}

impl Drop for LogStore {
    fn drop(&mut self) {
        // A failed store writes nothing more.
        if !self.failed_flag.load(Ordering::Acquire) {
            let mut w = self.writer.lock();
            if w.dirty {
                // A sync marker, so the records since the last commit count as acknowledged.
                w.append_commit(&refs::encode_ops(&[]).0);
            }
            if w.flush().is_ok() && w.trim().is_ok() && self.opts.durability != Durability::Buffered
            {
                let _ = w.seg.sync(w.seg.flushed.load(Ordering::Acquire));
            }
        }
        // Sealed segments are synced when the store closes, at every level; and a failed
        // store's sealer is done too before the directory's lock goes (a reopen must not
        // meet its temporary files).
        if let Some(s) = &self.sealer {
            s.finish();
        }
    }
}

/// File in the store directory where recovery records the damage it found, so that the
/// damage stays visible (to `verify`, to GC, to every command) after the open that found
/// it, until an operator clears it.
pub const RECOVERY_NOTES: &str = "RECOVERY.log";

/// File in a store directory noting the chunk records reads found damaged, one
/// `cid segment offset` a line (see `LogStore::persist_damage_mark`).
pub const DAMAGE_MARKS: &str = "DAMAGED.log";

/// File in the store directory holding the recovery notes an operator cleared. Damage in
/// the durable region is not cut away, so every open finds it again; a note cleared once
/// is not raised again for the same damage (the same line), while new damage is.
pub const RECOVERY_CLEARED: &str = "RECOVERY.cleared";

/// The text of `path`, or nothing when it does not exist. Read lossily: these files only
/// hold advice, and an append torn inside a character (or a flipped bit) must not stop the
/// store from opening, nor the notes from being read or cleared.
fn read_lines_file(path: &Path) -> Result<String> {
    match fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

/// Appends `text` (whole lines) to `path` after a newline, and makes it durable (the file
/// and its directory entry): an earlier append a crash cut inside its line stays a line of
/// its own instead of swallowing the first new one. Readers skip the empty lines this
/// leaves.
fn append_durably(dir: &Path, path: &Path, text: &str) -> Result<()> {
    let text = format!("\n{text}");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ctx(|| format!("opening {}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes())
        .and_then(|_| f.sync_all())
        .ctx(|| format!("writing {}", path.display()))?;
    format::sync_dir(dir)
}

/// Appends the damage `report` describes to the store's recovery notes (once per distinct
/// line, and not a line an operator already cleared unless it reports a cut), durably.
fn record_recovery_notes(dir: &Path, report: &RecoveryReport) -> Result<()> {
    if report.damage.is_empty() {
        return Ok(());
    }
    let path = dir.join(RECOVERY_NOTES);
    let existing = read_lines_file(&path)?;
    let cleared = read_lines_file(&dir.join(RECOVERY_CLEARED))?;
    let pending: HashSet<&str> = existing.lines().filter(|l| !l.is_empty()).collect();
    let cleared: HashSet<&str> = cleared.lines().filter(|l| !l.is_empty()).collect();
    // A cut is gone from the file once made, so the same text at a later open is a new
    // loss (offsets and sequence numbers are reused after a cut): never suppressed.
    let is_cut = |line: &str| {
        report
            .segment_stop
            .as_deref()
            .is_some_and(|why| line.ends_with(why))
    };
    let mut add = String::new();
    for d in &report.damage {
        let line = d.replace('\n', " ");
        let known =
            pending.contains(line.as_str()) || (cleared.contains(line.as_str()) && !is_cut(&line));
        if !known {
            add.push_str(&line);
            add.push('\n');
        }
    }
    if add.is_empty() {
        return Ok(());
    }
    append_durably(dir, &path, &add)
}

impl ChunkStore for LogStore {
    fn algo(&self) -> HashAlgo {
        self.algo
    }

    fn recovery_notes(&self) -> Result<Vec<String>> {
        let path = self.dir.join(RECOVERY_NOTES);
        Ok(read_lines_file(&path)?
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    fn clear_recovery_notes(&self) -> Result<()> {
        let path = self.dir.join(RECOVERY_NOTES);
        // Remember what was cleared first, so the next open does not raise it again.
        let notes = read_lines_file(&path)?;
        if !notes.is_empty() {
            append_durably(&self.dir, &self.dir.join(RECOVERY_CLEARED), &notes)?;
        }
        match fs::remove_file(&path) {
            Ok(()) => format::sync_dir(&self.dir),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
        }
    }

    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        crate::check_cid_algo(&cid, self.algo)?;
        if chunk.len() > MAX_CHUNK_LEN {
            return Err(Error::invalid(format!(
                "chunk of {} bytes exceeds the limit of {MAX_CHUNK_LEN}",
                chunk.len()
            )));
        }
        if self.holds_sound(&cid) {
            return Ok(false);
        }
        self.check_failed()?;
        let header = format::frame_header(KIND_CHUNK, &cid, chunk);
        let mut w = self.writer.lock();
        if self.holds_sound(&cid) {
            return Ok(false);
        }
        let loc = w.append(&header, KIND_CHUNK, cid, chunk);
        self.index.insert(cid, loc);
        if self.any_damaged.load(Ordering::Acquire) {
            self.damaged.lock().remove(&cid);
        }
        self.after_append(&mut w)?;
        Ok(true)
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        // A location can go stale when compaction moves the chunk and deletes the old
        // segment between our index lookup and the read; look it up again then.
        for _ in 0..8 {
            let Some(loc) = self.index.get(cid) else {
                return Ok(None);
            };
            let Some(seg) = self.segments.read().get(&loc.seg).cloned() else {
                continue;
            };
            // (A failed read marks the chunk: see `read_chunk`.)
            return self.read_chunk(cid, &seg, loc).map(Some);
        }
        Err(Error::corrupt(format!(
            "chunk {cid}: the index points at a segment that no longer exists"
        )))
    }

    /// Chunks that lie back to back in one segment's written part (a blob's leaves, stored
    /// in order) are read with one `pread` of up to [`GET_MANY_RUN`] bytes, then each is
    /// checked like a single get. Anything else (the write buffer, a segment compaction
    /// just removed) falls back to [`ChunkStore::get`].
    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        let locs: Vec<Option<Loc>> = cids.iter().map(|c| self.index.get(c)).collect();
        let mut out = Vec::with_capacity(cids.len());
        let mut i = 0;
        while i < cids.len() {
            let Some(first) = locs[i] else {
                out.push(None);
                i += 1;
                continue;
            };
            // The longest run of neighbours starting at i.
            let mut end = first.off + first.frame_len();
            let mut j = i + 1;
            while j < cids.len() {
                match locs[j] {
                    Some(l)
                        if l.seg == first.seg
                            && l.off == end
                            && end + l.frame_len() - first.off <= GET_MANY_RUN =>
                    {
                        end += l.frame_len();
                        j += 1;
                    }
                    _ => break,
                }
            }
            let seg = self.segments.read().get(&first.seg).cloned();
            let readable = seg
                .as_ref()
                .is_some_and(|s| end <= s.flushed.load(Ordering::Acquire));
            match seg {
                Some(seg) if readable && j > i + 1 => {
                    match seg.read_at((end - first.off) as usize, first.off) {
                        Ok(run) => {
                            let run = Bytes::from(run);
                            for k in i..j {
                                let Some(l) = locs[k] else { continue };
                                let at = (l.off - first.off) as usize;
                                let frame = run.slice(at..at + l.frame_len() as usize);
                                let chunk = Self::check_chunk_frame(&cids[k], &seg, l, frame)
                                    .inspect_err(|_| self.mark_damaged(&cids[k], l, true))?;
                                out.push(Some(chunk));
                            }
                        }
                        // A short read or an I/O error: let the single gets report it
                        // precisely (or find the chunk moved by compaction).
                        Err(_) => {
                            for c in &cids[i..j] {
                                out.push(self.get(c)?);
                            }
                        }
                    }
                }
                _ => {
                    for c in &cids[i..j] {
                        out.push(self.get(c)?);
                    }
                }
            }
            i = j;
        }
        Ok(out)
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        Ok(self.holds_sound(cid))
    }

    fn chunk_len(&self, cid: &Cid) -> Result<Option<u64>> {
        Ok(self.index.get(cid).map(|loc| u64::from(loc.len)))
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        let mut out = Vec::new();
        for shard in &self.index.shards {
            out.extend(shard.read().keys().copied());
        }
        Ok(out)
    }

    fn remove(&self, cids: &[Cid]) -> Result<()> {
        self.check_failed()?;
        let mut any = false;
        {
            let mut w = self.writer.lock();
            for cid in cids {
                if !self.index.contains(cid) {
                    continue;
                }
                let header = format::frame_header(KIND_TOMBSTONE, cid, &[]);
                w.append(&header, KIND_TOMBSTONE, *cid, &[]);
                self.index.remove(cid);
                any = true;
                self.after_append(&mut w)?;
            }
        }
        if any {
            if self.opts.durability == Durability::Buffered {
                self.writer.lock().flush().map_err(|e| self.fail(e))?;
            } else {
                self.sync()?;
            }
        }
        Ok(())
    }

    /// One batch: tombstones are appended in list order, and a crash keeps a prefix of
    /// them (recovery cuts a torn tail), so the groups' order holds without a sync
    /// between them.
    fn remove_in_order(&self, groups: &[Vec<Cid>]) -> Result<()> {
        self.remove(&groups.concat())
    }

    fn compact(&self) -> Result<u64> {
        self.check_failed()?;
        let _guard = self.compact_lock.lock();
        let live = self.live_bytes();
        {
            let mut w = self.writer.lock();
            let data = w.end().saturating_sub(SEG_HEADER_LEN);
            let l = live.get(&w.seg.id).copied().unwrap_or(0);
            if data > 0 && garbage_heavy(data, l) {
                self.roll(&mut w)?;
            }
        }
        let active = self.writer.lock().seg.id;
        let sealed: Vec<Arc<Segment>> = self
            .segments
            .read()
            .values()
            .filter(|s| s.id < active)
            .cloned()
            .collect();
        let (heavy, mut keep): (Vec<_>, Vec<_>) = sealed.into_iter().partition(|s| {
            let data = s
                .flushed
                .load(Ordering::Acquire)
                .saturating_sub(SEG_HEADER_LEN);
            garbage_heavy(data, live.get(&s.id).copied().unwrap_or(0))
        });
        // A segment holding commit records can go only once a durable refs.snap covers them.
        let mut cands = Vec::new();
        for s in heavy {
            let sealed = self.sealed_records(&s)?;
            if self.snapshot_covers(sealed.max_seq)? {
                cands.push((s, sealed));
            } else {
                keep.push(s);
            }
        }
        keep.sort_by_key(|s| s.id);
        if cands.is_empty() {
            return Ok(0);
        }
        let mut written = 0u64;
        let mut unsafe_to_delete = BTreeSet::new();
        // Each live chunk copied: its cid, where it was and where its copy went.
        let mut copied: Vec<(Cid, Loc, Loc)> = Vec::new();
        let copy_phase = (|| -> Result<()> {
            // First the live chunks: copied to the active segment, or, when one cannot be read,
            // left in place with the whole segment (for reads to report).
            for (s, sealed) in &cands {
                if !sealed.damage.is_empty() {
                    // Leave damaged segments in place, for inspection.
                    unsafe_to_delete.insert(s.id);
                }
                for r in sealed.records.iter().filter(|r| r.kind == KIND_CHUNK) {
                    let loc = Loc {
                        seg: s.id,
                        off: r.off,
                        len: r.len,
                    };
                    if self.index.get(&r.cid) != Some(loc) {
                        continue;
                    }
                    let chunk = match self.read_chunk(&r.cid, s, loc) {
                        Ok(c) => c,
                        Err(Error::Corrupt(_)) => {
                            // (Marked by `read_chunk`.)
                            unsafe_to_delete.insert(s.id);
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let header = format::frame_header(KIND_CHUNK, &r.cid, &chunk);
                    let mut w = self.writer.lock();
                    // A store that failed meanwhile takes no more writes, copies included.
                    self.check_failed()?;
                    if self.index.get(&r.cid) != Some(loc) {
                        continue;
                    }
                    let new = w.append(&header, KIND_CHUNK, r.cid, &chunk);
                    self.index.insert(r.cid, new);
                    copied.push((r.cid, loc, new));
                    written += new.frame_len();
                    self.after_append(&mut w)?;
                }
            }
            // Then the tombstones: a tombstone is copied when a segment that stays (one not
            // compacted, or a candidate left in place above) holds an earlier record of its
            // chunk, which the tombstone must keep removed at the next open.
            //
            // Found in one pass over the staying segments, oldest first, holding only the
            // cids of the tombstones in question (each tombstone looking through every
            // staying segment, keeping each one's cids, took tombstones × segments steps
            // and memory of a second index after a large GC).
            let mut newest_tombstone: HashMap<Cid, u32> = HashMap::new();
            for (s, sealed) in &cands {
                for r in sealed.records.iter().filter(|r| r.kind != KIND_CHUNK) {
                    if !self.index.contains(&r.cid) {
                        let at = newest_tombstone.entry(r.cid).or_insert(s.id);
                        *at = (*at).max(s.id);
                    }
                }
            }
            let mut stays: Vec<u32> = keep
                .iter()
                .map(|k| k.id)
                .chain(unsafe_to_delete.iter().copied())
                .collect();
            stays.sort_unstable();
            let newest = newest_tombstone.values().copied().max().unwrap_or(0);
            // The oldest staying segment holding a chunk record of each such cid (below its
            // newest tombstone: none above matters).
            let mut oldest_holder: HashMap<Cid, u32> = HashMap::new();
            for &id in stays.iter().take_while(|&&id| id < newest) {
                let loaded;
                let records = match cands.iter().find(|(c, _)| c.id == id) {
                    Some((_, sealed)) => &sealed.records,
                    None => {
                        // `stays` names only kept segments and candidates.
                        let Some(k) = keep.iter().find(|k| k.id == id) else {
                            continue;
                        };
                        loaded = self.sealed_records(k)?;
                        &loaded.records
                    }
                };
                for r in records.iter().filter(|r| r.kind == KIND_CHUNK) {
                    if newest_tombstone.get(&r.cid).is_some_and(|&t| id < t) {
                        oldest_holder.entry(r.cid).or_insert(id);
                    }
                }
            }
            for (s, sealed) in &cands {
                for r in sealed.records.iter().filter(|r| r.kind != KIND_CHUNK) {
                    if self.index.contains(&r.cid) {
                        continue;
                    }
                    let needed = oldest_holder.get(&r.cid).is_some_and(|&h| h < s.id);
                    if !needed {
                        continue;
                    }
                    let header = format::frame_header(KIND_TOMBSTONE, &r.cid, &[]);
                    let mut w = self.writer.lock();
                    self.check_failed()?;
                    if self.index.contains(&r.cid) {
                        continue;
                    }
                    w.append(&header, KIND_TOMBSTONE, r.cid, &[]);
                    written += FRAME_HEADER_LEN as u64;
                    self.after_append(&mut w)?;
                }
            }
            // The copies must be durable before the originals go, and out of the last group,
            // which recovery cuts at its first damaged record as a torn write: a refs.snap
            // covering the sync's marker (applied when `sync` returns) puts them in the
            // durable region, where damage loses only the damaged record.
            self.sync()?;
            let seq = self.refs.read().seq;
            if !self.snapshot_covers(seq)? {
                return Err(Error::invalid(
                    "compaction: the refs snapshot does not cover the copies' sync",
                ));
            }
            Ok(())
        })();
        if let Err(e) = copy_phase {
            // A failed write or sync (which fails the store) cut the copies still in the
            // buffer or past the last sync; the originals are all still in place (nothing
            // is deleted before this point): reads go back to them instead of failing on
            // the vanished copies. Any other error leaves the copies whole, and the index
            // on them. Under the writer's lock, as `remove` changes the index under it.
            let _w = self.writer.lock();
            if self.failed_flag.load(Ordering::Acquire) {
                let mut damaged = self.damaged.lock();
                for (cid, old, new) in &copied {
                    if self.index.get(cid) == Some(*new) {
                        self.index.insert(*cid, *old);
                        damaged.remove(cid);
                    }
                }
            }
            return Err(e);
        }
        // Oldest first, each removal durable before the next: unlinks are not ordered
        // otherwise, and a crash that kept an older segment but lost a newer one could
        // bring back a chunk whose tombstone only the newer one held.
        let mut gone: Vec<&Arc<Segment>> = cands
            .iter()
            .map(|(s, _)| s)
            .filter(|s| !unsafe_to_delete.contains(&s.id))
            .collect();
        gone.sort_by_key(|s| s.id);
        let mut freed = 0u64;
        for s in gone {
            // Out of the map only once its removal is durable: a segment whose unlink
            // failed, or was not synced, stays known, so a later compaction never drops a
            // tombstone that a newer segment holds for a chunk still in it (which the next
            // open would bring back). That compaction unlinks it again (gone already is
            // fine).
            match fs::remove_file(&s.path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", s.path.display()), e)),
            }
            let hint = format::hint_path(&self.dir, s.id);
            match fs::remove_file(&hint) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", hint.display()), e)),
            }
            format::sync_dir(&self.dir)?;
            self.segments.write().remove(&s.id);
            freed += s.flushed.load(Ordering::Acquire);
        }
        Ok(freed.saturating_sub(written))
    }

    fn stats(&self) -> Result<StoreStats> {
        let mut chunks = 0u64;
        let mut chunk_bytes = 0u64;
        for shard in &self.index.shards {
            let s = shard.read();
            chunks += s.len() as u64;
            chunk_bytes += s.values().map(|l| l.len as u64).sum::<u64>();
        }
        let mut bytes_on_disk = self.writer.lock().buf.len() as u64;
        for entry in fs::read_dir(&self.dir).ctx(|| format!("listing {}", self.dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", self.dir.display()))?;
            // Files can vanish under a concurrent compaction; skip them.
            if let Ok(m) = entry.metadata()
                && m.is_file()
            {
                bytes_on_disk += m.len();
            }
        }
        Ok(StoreStats {
            chunks,
            chunk_bytes,
            bytes_on_disk,
        })
    }
}

impl RefStore for LogStore {
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.lookup.read().get(name).cloned())
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
            .ordered_refs()
            .map
            .range::<[u8], _>((
                std::ops::Bound::Included(prefix.max(from)),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn commit(&self, updates: &[RefUpdate]) -> Result<()> {
        self.check_failed()?;
        let (ops_bytes, ops) = refs::encode_ops(updates);
        // A record's length field is 32 bits; chunks are bounded the same way.
        if ops_bytes.len() > MAX_CHUNK_LEN {
            return Err(Error::invalid(format!(
                "a commit of {} bytes of ref updates exceeds the limit of {MAX_CHUNK_LEN}",
                ops_bytes.len()
            )));
        }
        self.enqueue(ops_bytes, ops, false, false)
    }

    fn durability(&self) -> Durability {
        self.opts.durability
    }

    fn write_failure(&self) -> Option<String> {
        if !self.failed_flag.load(Ordering::Acquire) {
            return None;
        }
        self.failed.lock().clone()
    }
}

/// Drops the given ranges of segments from the page cache (see [`Writer::drop_behind`]).
fn drop_cached(jobs: Vec<(Arc<Segment>, u64, u64)>) {
    for (seg, from, len) in jobs {
        segment::drop_cached(&seg.file, from, len);
    }
}

/// Locks a `std` mutex guarding no data (a poisoned one is as good as any).
fn lock_unit(m: &std::sync::Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LogStore {
    /// Queues a commit (or a sync marker) and waits until a leader wrote it, or leads.
    fn enqueue(&self, ops_bytes: Vec<u8>, ops: Vec<Op>, force: bool, marker: bool) -> Result<()> {
        let (group, lead) = {
            let mut q = self.queue.lock();
            let group = q.gathering;
            if self.opts.durability == Durability::PerWrite {
                q.gathering += 1;
            }
            q.pending.push_back(Pending {
                ops_bytes,
                ops,
                group,
                force,
                marker,
            });
            (group, !std::mem::replace(&mut q.leader, true))
        };
        if !lead {
            match self.wait_for(group) {
                Woken::Lead => {}
                Woken::Done => return self.group_result(group),
            }
        }
        // Lead: write the oldest queued group (ours, unless groups queued before ours are
        // still waiting), hand leadership to the next group's committers, apply the group
        // and wake its committers; until our own group is done.
        loop {
            let batch: Vec<Pending> = {
                let mut q = self.queue.lock();
                let g = q.pending.front().map_or(0, |p| p.group);
                let n = q.pending.iter().take_while(|p| p.group == g).count();
                if g == q.gathering {
                    q.gathering += 1;
                }
                q.pending.drain(..n).collect()
            };
            let Some(g) = batch.first().map(|p| p.group) else {
                // Cannot happen: our own commit stays queued until we take it.
                self.queue.lock().leader = false;
                return Err(Error::Unavailable("commit queue lost a commit".into()));
            };
            let mine = g == group;
            let followers = batch.len() - usize::from(mine);
            let written = self.write_group(&batch);
            // A failure is on record before anything can mark this group done (the next
            // leader's `finish_group` can come first, see below), so no follower of a
            // failed group ever reads "done" without it.
            if let Err(e) = &written
                && followers > 0
            {
                self.failures.lock().push(Failure {
                    group: g,
                    msg: e.to_string(),
                    left: followers,
                });
                self.any_failure.store(true, Ordering::Release);
            }
            let last = written.as_ref().ok().copied().flatten();
            // With syncs, hand over before applying and waking, so that the next group's
            // I/O overlaps them (`apply_group` keeps groups in order; a sync takes far
            // longer than an apply). Without, a group is written in microseconds: apply
            // first, so the next leader never waits for this one.
            let early = self.opts.durability != Durability::Buffered;
            let mut batch = Some(batch);
            if !early {
                self.apply_group(g, batch.take().unwrap_or_default(), last);
            }
            if mine {
                let next = {
                    let mut q = self.queue.lock();
                    let next = q.pending.front().map(|p| p.group);
                    if next.is_none() {
                        q.leader = false;
                    }
                    next
                };
                if let Some(h) = next {
                    self.hand_over(h);
                }
            }
            if let Some(batch) = batch {
                self.apply_group(g, batch, last);
            }
            let res = written.map(|_| ());
            self.finish_group(g);
            self.after_group();
            if mine {
                return res;
            }
        }
    }

    /// Asks the committers of queued group `h` to lead (one of them takes it).
    fn hand_over(&self, h: u64) {
        self.handoff.store(h, Ordering::Release);
        let w = &self.wake[(h % WAKE_RING as u64) as usize];
        drop(lock_unit(&w.lock));
        if self.opts.durability == Durability::PerWrite {
            // Every commit is its own group, so other groups wait here too.
            w.cv.notify_all();
        } else {
            // Only group `h` waits here (see `wait_for`): wake one of them.
            w.cv.notify_one();
        }
    }

    /// Marks group `g` written and wakes its committers, with one broadcast.
    fn finish_group(&self, g: u64) {
        // A leader that handed over can get here after the next leader's group: keep the
        // highest.
        self.done.fetch_max(g, Ordering::AcqRel);
        let w = &self.wake[(g % WAKE_RING as u64) as usize];
        drop(lock_unit(&w.lock));
        w.cv.notify_all();
    }

    /// Waits until group `g` is written, or its committers are asked to lead.
    ///
    /// Under `Group` and `Buffered`, the groups with waiters are at most the one being
    /// finished, the one being written and the one gathering, so a waiting place holds one
    /// group's committers and a hand-over wakes just one of them. A leader that is slow to
    /// wake its finished group can let a later group share its place; a committer of the
    /// finished group that takes the hand-over's wake-up passes it on.
    fn wait_for(&self, g: u64) -> Woken {
        let w = &self.wake[(g % WAKE_RING as u64) as usize];
        let mut guard = lock_unit(&w.lock);
        loop {
            if self.done.load(Ordering::Acquire) >= g {
                let h = self.handoff.load(Ordering::Acquire);
                if h != 0 && h != g && h % WAKE_RING as u64 == g % WAKE_RING as u64 {
                    w.cv.notify_one();
                }
                return Woken::Done;
            }
            if self.handoff.load(Ordering::Acquire) == g
                && self
                    .handoff
                    .compare_exchange(g, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return Woken::Lead;
            }
            guard =
                w.cv.wait(guard)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The outcome of group `g` (written) for one of its committers.
    fn group_result(&self, g: u64) -> Result<()> {
        if !self.any_failure.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut f = self.failures.lock();
        let Some(i) = f.iter().position(|x| x.group == g) else {
            return Ok(());
        };
        f[i].left -= 1;
        let msg = if f[i].left == 0 {
            f.swap_remove(i).msg
        } else {
            f[i].msg.clone()
        };
        Err(Error::Unavailable(format!(
            "commit failed in {}: {msg}",
            self.dir.display()
        )))
    }
}

#[cfg(test)]
mod tests;
