//! Segment files: creation, opening and the record scan used by recovery and compaction.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_core::error::IoContext;

use super::format::{
    self, CommitEntry, FRAME_HEADER_LEN, FrameHeader, HintEntry, KIND_CHUNK, KIND_COMMIT,
    SEG_HEADER_LEN, SegPlace, frame_crc_ok, parse_frame_header,
};
use crate::{Cid, HashAlgo, Result};

/// One segment file, shared by readers (pread) and the single writer (pwrite).
pub(crate) struct Segment {
    pub id: u32,
    pub path: PathBuf,
    pub file: File,
    /// Bytes written to the file (readers may `pread` below this).
    pub flushed: AtomicU64,
    /// Bytes known to be on stable storage (`fdatasync`ed).
    pub synced: AtomicU64,
    /// Whether its records are bound to their place (format 3 on; see
    /// [`format::FramePlace`]).
    pub bound: bool,
    /// Held while the file is `fdatasync`ed (see [`Segment::sync`]).
    sync_lock: parking_lot::Mutex<()>,
    /// An `fdatasync` of the file failed: every later one fails too.
    sync_failed: std::sync::atomic::AtomicBool,
}

impl Segment {
    /// `fdatasync`s the file. Every sync of a segment goes through here, one at a time:
    /// the kernel reports a failed writeback to one `fdatasync` only, so two threads
    /// syncing at once could each see a different outcome, and the one that saw success
    /// would count data as durable that never reached the disk. Once one has failed, every
    /// later one fails too.
    ///
    /// `upto` is what the caller knows was written before it called (`flushed`, read
    /// then): on success [`Segment::synced`] reaches it before the lock is let go, so a
    /// cut after another thread's failed sync ([`Segment::cut_to_synced`]) never removes
    /// bytes a successful sync covered.
    pub fn sync(&self, upto: u64) -> std::io::Result<()> {
        let _one = self.sync_lock.lock();
        if self.sync_failed.load(Ordering::Acquire) {
            return Err(std::io::Error::other(
                "an earlier fdatasync of this segment failed",
            ));
        }
        self.file.sync_data().inspect_err(|_| {
            self.sync_failed.store(true, Ordering::Release);
        })?;
        self.synced.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// After a failed sync: cuts the file back to [`Segment::synced`], read under the sync
    /// lock (see [`Segment::sync`]), and returns that length.
    pub fn cut_to_synced(&self) -> std::io::Result<u64> {
        let _one = self.sync_lock.lock();
        let synced = self.synced.load(Ordering::Acquire);
        self.file.set_len(synced)?;
        self.flushed.store(synced, Ordering::Release);
        Ok(synced)
    }

    /// Reads exactly `len` bytes at `off` into a new buffer, without first zeroing it (the
    /// zeroing cost about 8% of a node's CPU streaming a blob from the page cache). Errors as [`std::os::unix::fs::FileExt::read_exact_at`] does.
    pub fn read_at(&self, len: usize, off: u64) -> std::io::Result<Vec<u8>> {
        read_exact_at_uninit(&self.file, len, off)
    }

    /// How its records name their places.
    pub fn place(&self) -> SegPlace {
        SegPlace {
            id: self.id,
            bound: self.bound,
        }
    }

    /// Creates segment `id` with its header, durably (file and directory entry synced),
    /// so that data appended to it later can be made durable with `fdatasync` alone.
    pub fn create(dir: &Path, id: u32, algo: HashAlgo) -> Result<Arc<Segment>> {
        let path = format::segment_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ctx(|| format!("creating segment {}", path.display()))?;
        file.write_all_at(&format::segment_header(id, algo), 0)
            .ctx(|| format!("writing header of {}", path.display()))?;
        file.sync_all()
            .ctx(|| format!("syncing {}", path.display()))?;
        format::sync_dir(dir)?;
        Ok(Arc::new(Segment {
            id,
            path,
            file,
            flushed: AtomicU64::new(SEG_HEADER_LEN),
            synced: AtomicU64::new(SEG_HEADER_LEN),
            bound: true,
            sync_lock: Default::default(),
            sync_failed: Default::default(),
        }))
    }

    /// Opens an existing segment file; returns it with its length, whether its records
    /// are bound to their place, and a note when the header's word on that was damaged.
    /// The format byte of the header says it (a header too short or unreadable is taken
    /// as current), unless the first record reads only the other way or the byte names no
    /// format: one flipped bit turns the current format into the unbound one (every record
    /// would then fail its checksum, and recovery cut the whole active segment as a torn
    /// write) or into no format at all (and the store would not open).
    pub fn open(dir: &Path, id: u32) -> Result<(File, PathBuf, u64, bool, Option<String>)> {
        let path = format::segment_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .ctx(|| format!("opening segment {}", path.display()))?;
        let len = file
            .metadata()
            .ctx(|| format!("reading metadata of {}", path.display()))?
            .len();
        let mut h = [0u8; SEG_HEADER_LEN as usize];
        let declared = file
            .read_exact_at(&mut h, 0)
            .map_or(true, |()| format::segment_bound(&h));
        // The format the first record reads in, if it reads in one.
        let mut first = [0u8; FRAME_HEADER_LEN];
        let read = len >= SEG_HEADER_LEN + FRAME_HEADER_LEN as u64
            && file.read_exact_at(&mut first, SEG_HEADER_LEN).is_ok();
        let reads_as = |bound: bool| {
            let at = format::SegPlace { id, bound }.at(SEG_HEADER_LEN);
            read && format::parse_frame_header(&first, at).is_ok()
        };
        let mut found = [declared, !declared].into_iter().find(|&b| reads_as(b));
        // No record written yet (the segment ends at its header, or zeros follow): a new
        // segment is always of the current format.
        let unwritten = !read || first.iter().all(|&b| b == 0);
        let unknown = ![format::SEG_VERSION, format::SEG_VERSION_UNBOUND].contains(&h[12]);
        let ours = h.starts_with(format::SEG_MAGIC);
        if found.is_none() && unwritten && unknown && ours {
            found = Some(true);
        }
        let bound = found.unwrap_or(declared);
        let byte = if bound {
            format::SEG_VERSION
        } else {
            format::SEG_VERSION_UNBOUND
        };
        // Only a header that is otherwise one of ours is mended (a header of another kind
        // of damage is reported where it is checked).
        let mend = found.is_some() && h[12] != byte && ours;
        if mend {
            // Mended on disk too, so the next open does not depend on the first record
            // staying readable. A failure fails the open: this sync shares the file with
            // the open's own sync of the active segment, and an error it swallowed (a
            // writeback of the last run that failed) would let that one pass.
            file.write_all_at(&[byte], 12)
                .and_then(|()| file.sync_data())
                .ctx(|| format!("mending the format byte of {}", path.display()))?;
        }
        let note = mend.then(|| {
            format!(
                "{}: the header's format byte ({}) was damaged: {}; {}",
                path.display(),
                h[12],
                if unwritten {
                    format!("no record written yet, so format {byte}")
                } else {
                    format!("its first record reads as format {byte}")
                },
                "rewritten"
            )
        });
        Ok((file, path, len, bound, note))
    }

    /// Wraps an opened file whose first `len` bytes are valid and durable.
    pub fn from_parts(id: u32, path: PathBuf, file: File, len: u64, bound: bool) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path,
            file,
            flushed: AtomicU64::new(len),
            synced: AtomicU64::new(len),
            bound,
            sync_lock: Default::default(),
            sync_failed: Default::default(),
        })
    }
}

/// What a scan of a segment found.
#[derive(Default)]
pub(crate) struct Scan {
    /// Chunk and tombstone records, in file order.
    pub records: Vec<HintEntry>,
    /// Commit records, in file order (payloads kept for sequence numbers above the scan's
    /// `keep_after`).
    pub commits: Vec<CommitEntry>,
    /// Highest commit sequence number in a sound, accepted record header (not cut off).
    pub max_seq: u64,
    /// End of the valid data: where a torn tail starts, or the file length.
    pub end: u64,
    /// Why the scan found a torn tail (or cut the last group), if it did.
    pub stop: Option<String>,
    /// Damaged records in the durable region: records kept although their checksum fails,
    /// plus one per region skipped to resynchronise after a bad header.
    pub damaged: u64,
    /// Bytes of the durable region skipped to resynchronise after bad record headers.
    pub skipped: u64,
    /// One description per damaged place in the durable region, plus one when the active
    /// segment's last group was cut (see [`scan`]).
    pub damage: Vec<String>,
    /// The chunk records among `records` whose checksum fails: `(cid, offset)`.
    pub bad_chunks: Vec<(Cid, u64)>,
}

/// How much of a segment is durable (acknowledged), for [`scan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durable {
    /// All of it (a sealed segment: it was synced before it was sealed).
    All,
    /// Everything before its last group of writes, which ends with its last intact commit
    /// record (the active segment; see [`scan`]).
    UpToLastCommit,
}

/// Reads a segment file through a window of `pread`s.
struct Reader<'a> {
    file: &'a File,
    path: &'a Path,
    /// The segment, as its records name their places.
    place: SegPlace,
    len: u64,
    buf: Vec<u8>,
    start: u64,
}

const WINDOW: usize = 1 << 20;

impl<'a> Reader<'a> {
    /// The bytes `[off, off + n)` (the caller checked they lie in the file).
    fn get(&mut self, off: u64, n: usize) -> Result<&[u8]> {
        let have = off >= self.start && off + n as u64 <= self.start + self.buf.len() as u64;
        if !have {
            let want = (n.max(WINDOW) as u64).min(self.len.saturating_sub(off)) as usize;
            self.buf.resize(want.max(n), 0);
            self.file
                .read_exact_at(&mut self.buf, off)
                .ctx(|| format!("reading {} at offset {off}", self.path.display()))?;
            self.start = off;
        }
        let s = (off - self.start) as usize;
        Ok(&self.buf[s..s + n])
    }

    /// The header of a plausible record at `off` (sound header checksum, fits in the file).
    fn header_at(
        &mut self,
        off: u64,
    ) -> Result<Result<(FrameHeader, [u8; FRAME_HEADER_LEN]), String>> {
        if self.len.saturating_sub(off) < FRAME_HEADER_LEN as u64 {
            return Ok(Err(format!("incomplete record header at offset {off}")));
        }
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        hdr.copy_from_slice(self.get(off, FRAME_HEADER_LEN)?);
        let h = match parse_frame_header(&hdr, self.place.at(off)) {
            Ok(h) => h,
            Err(why) => return Ok(Err(format!("{why} at offset {off}"))),
        };
        if FRAME_HEADER_LEN as u64 + h.len as u64 > self.len - off {
            return Ok(Err(format!(
                "record at offset {off} runs past the end of the file"
            )));
        }
        Ok(Ok((h, hdr)))
    }

    /// The first offset at or after `from` where a record header passes its checks and the
    /// record fits in the file, searching byte by byte.
    fn resync(&mut self, from: u64) -> Result<Option<u64>> {
        let mut off = from;
        while self.len.saturating_sub(off) >= FRAME_HEADER_LEN as u64 {
            let n = ((self.len - off) as usize).min(WINDOW);
            let chunk = self.get(off, n)?.to_vec();
            let last = n - FRAME_HEADER_LEN;
            for i in 0..=last {
                let h = &chunk[i..i + FRAME_HEADER_LEN];
                // Cheap filters before the header checksum.
                if !format::plausible_kind(h[8]) || h[9..12] != [0, 0, 0] {
                    continue;
                }
                let at = off + i as u64;
                if let Ok(p) = parse_frame_header(h, self.place.at(at))
                    && FRAME_HEADER_LEN as u64 + p.len as u64 <= self.len - at
                {
                    return Ok(Some(at));
                }
            }
            off += last as u64 + 1;
        }
        Ok(None)
    }
}

/// Commit sequence numbers known before a segment is scanned, to judge commit records found
/// right after a resync (see [`scan`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeqBefore {
    /// Highest sequence number seen so far in log order (the snapshot's included).
    pub max: u64,
    /// Commit records numbered at most this are not judged (the snapshot covers them).
    pub floor: u64,
}

impl SeqBefore {
    /// No judging (compaction: it does not replay commits, and never deletes a damaged
    /// segment).
    pub const UNCHECKED: SeqBefore = SeqBefore {
        max: 0,
        floor: u64::MAX,
    };
}

/// Scans the records of a segment file of `len` bytes.
///
/// Inside the durable region (see [`Durable`]) damage is bit rot, never a torn write: a
/// record whose header is sound but whose checksum fails is kept and counted as damaged
/// (reads of that chunk report it corrupt; a damaged commit record's updates are lost and
/// reported); a record whose header fails its checks is skipped by searching forward, byte
/// by byte, for the next offset where a record header passes its header checksum and the
/// record fits in the file, and the skipped bytes are reported. After such a resync, until a
/// commit record is accepted, a commit record numbered above `before.floor` must follow the
/// highest sequence number seen (`before.max` and this segment's): its number must lie in
/// `max + 1 ..= max + 1 + skipped / FRAME_HEADER_LEN` (`skipped`: bytes skipped since the
/// last accepted commit record, which can have held at most that many commit records).
/// Otherwise it is taken for a record embedded in a chunk payload that the resync locked
/// onto: it is reported as damage, not returned, and does not raise `max_seq`.
///
/// In the active segment ([`Durable::UpToLastCommit`]):
/// - The first bad record (incomplete, failing a checksum, or a chunk that does not match
///   its cid) after the last intact commit record starts a torn tail: the scan ends there
///   (`end`, `stop`).
/// - The *last group* is the records after the last commit record that is followed by a
///   non-commit record (or after the segment header), up to and including the run of
///   commit records that ends with the last intact one. A region skipped by a resync counts
///   as commit records when it is the only region skipped between two accepted commit
///   records and the second one's number shows that commit records were lost (so a damaged
///   commit record header of an earlier group does not merge it with the next group;
///   inside the final run it is damage of the last group). A group is written with one
///   `pwrite` and made durable by one `fdatasync`, and the next group is written only
///   after that returned, so only the last group can have been torn by a power loss during
///   its `fdatasync` (pages reach the disk in any order). If any part of it is damaged (a
///   record failing its checksum, a chunk not matching its cid, bytes skipped by a resync,
///   an out-of-sequence commit record), it was not durably written: the scan ends at the
///   first damaged byte (`end`, `stop`, and one `damage` entry), so the group's commits
///   from there on are not applied. Damage in earlier groups is bit rot, handled as above;
///   so is damage in the last group up to the end of its last commit record that
///   `refs.snap` covers (numbered at most `before.floor`): that much was synced before the
///   snapshot was written, and only what follows it can have been torn.
pub(crate) fn scan(
    file: &File,
    path: &Path,
    place: SegPlace,
    len: u64,
    durable: Durable,
    keep_after: u64,
    before: SeqBefore,
) -> Result<Scan> {
    struct Event {
        pos: u64,
        skipped: u64,
        /// What is wrong, without the file name.
        why: String,
        /// The full description.
        what: String,
    }
    /// A record or a skipped region, in file order (they tile the scanned file).
    struct Item {
        end: u64,
        /// An accepted commit record (sound header; its payload may be damaged).
        commit: bool,
        /// A skipped region that held commit records: the next accepted commit record's
        /// number shows some were lost, and this is the only region skipped since the
        /// previous one.
        lost_commit: bool,
    }
    let mut rd = Reader {
        file,
        path,
        place,
        len,
        buf: Vec::new(),
        start: 0,
    };
    let mut out = Scan::default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut events: Vec<Event> = Vec::new();
    let mut items: Vec<Item> = Vec::new();
    let mut pos = SEG_HEADER_LEN;
    let mut last_commit_end = SEG_HEADER_LEN;
    // The first bad record after the last intact commit record.
    let mut first_bad: Option<(u64, String)> = None;
    // Highest sequence number of an accepted commit record header, in log order.
    let mut max_seen = before.max;
    // Bytes skipped by resyncs since the last accepted commit record (None: in sync).
    let mut resynced: Option<u64> = None;
    // Items of the regions skipped since the last accepted commit record.
    let mut skips: Vec<usize> = Vec::new();
    while pos < len {
        let (h, hdr) = match rd.header_at(pos)? {
            Ok(x) => x,
            Err(why) => {
                if first_bad.is_none() {
                    first_bad = Some((pos, why.clone()));
                }
                let (next, what) = match rd.resync(pos + 1)? {
                    Some(next) => (
                        next,
                        format!(
                            "{name}: {why}; skipped {} bytes to the next record at offset {next}",
                            next - pos
                        ),
                    ),
                    None => (
                        len,
                        format!(
                            "{name}: {why}; no valid record follows ({} bytes skipped)",
                            len - pos
                        ),
                    ),
                };
                events.push(Event {
                    pos,
                    skipped: next - pos,
                    why,
                    what,
                });
                resynced = Some(resynced.unwrap_or(0) + (next - pos));
                skips.push(items.len());
                items.push(Item {
                    end: next,
                    commit: false,
                    lost_commit: false,
                });
                pos = next;
                continue;
            }
        };
        let size = FRAME_HEADER_LEN as u64 + h.len as u64;
        if h.kind == KIND_COMMIT
            && h.seq > before.floor
            && let Some(skipped) = resynced
        {
            let lo = max_seen.saturating_add(1);
            let hi = lo.saturating_add(skipped / FRAME_HEADER_LEN as u64);
            if h.seq < lo || h.seq > hi {
                let why = format!(
                    "commit record {} at offset {pos}, found after skipping damaged bytes, is out \
                     of sequence (expected {lo}..={hi})",
                    h.seq
                );
                if first_bad.is_none() {
                    first_bad = Some((pos, why.clone()));
                }
                events.push(Event {
                    pos,
                    skipped: 0,
                    what: format!("{name}: {why}; ignored"),
                    why,
                });
                items.push(Item {
                    end: pos + size,
                    commit: false,
                    lost_commit: false,
                });
                pos += size;
                continue;
            }
            resynced = None;
        }
        let payload = rd.get(pos + FRAME_HEADER_LEN as u64, h.len as usize)?;
        let intact = frame_crc_ok(&hdr, &h, payload, place.bound);
        if !intact {
            let why = format!("record checksum mismatch at offset {pos}");
            let what = if h.kind == KIND_COMMIT {
                format!("{name}: commit {}: {why}; its updates are lost", h.seq)
            } else {
                format!("{name}: {why}")
            };
            if first_bad.is_none() {
                first_bad = Some((pos, why.clone()));
            }
            events.push(Event {
                pos,
                skipped: 0,
                why,
                what,
            });
        }
        match (h.kind, h.cid) {
            (KIND_COMMIT, _) => {
                if h.seq > max_seen.saturating_add(1)
                    && let [only] = skips[..]
                {
                    items[only].lost_commit = true;
                }
                skips.clear();
                out.max_seq = out.max_seq.max(h.seq);
                max_seen = max_seen.max(h.seq);
                out.commits.push(CommitEntry {
                    seq: h.seq,
                    off: pos,
                    len: h.len,
                    ops: (intact && h.seq > keep_after).then(|| payload.to_vec()),
                    intact,
                });
                if intact {
                    last_commit_end = pos + size;
                    first_bad = None;
                }
            }
            (kind, Some(cid)) => {
                if !intact && kind == KIND_CHUNK {
                    out.bad_chunks.push((cid, pos));
                }
                out.records.push(HintEntry {
                    kind,
                    cid,
                    off: pos,
                    len: h.len,
                })
            }
            _ => {}
        }
        items.push(Item {
            end: pos + size,
            commit: h.kind == KIND_COMMIT,
            lost_commit: false,
        });
        pos += size;
    }
    out.end = len;
    // Where the active segment ends, why, and whether the cut is of the last group.
    let mut cut: Option<(u64, String, bool)> = None;
    if durable == Durable::UpToLastCommit {
        // The last group: it ends with the last intact commit record.
        if let Some(last) = items
            .iter()
            .rposition(|i| i.commit && i.end == last_commit_end)
        {
            // A region skipped where commit records were lost counts as commit records.
            let mut run = last;
            while run > 0 && (items[run - 1].commit || items[run - 1].lost_commit) {
                run -= 1;
            }
            let group_start = items[..run]
                .iter()
                .rposition(|i| i.commit || i.lost_commit)
                .map_or(SEG_HEADER_LEN, |j| items[j].end);
            // Up to the last commit of the group that `refs.snap` covers, the group was
            // durably written: the snapshot is written only after the commits it covers
            // were synced. Damage there is bit rot, as in earlier groups (cutting it would
            // drop chunks the snapshot's refs name); only what follows that commit (later
            // commit-only groups that merged into this run) can have been torn.
            let from = if before.floor == u64::MAX {
                group_start
            } else {
                out.commits
                    .iter()
                    // Every commit listed passed its header checksum, so its number holds
                    // even when its payload rotted.
                    .filter(|c| {
                        c.off >= group_start && c.off < last_commit_end && c.seq <= before.floor
                    })
                    .map(|c| c.off + FRAME_HEADER_LEN as u64 + u64::from(c.len))
                    .max()
                    .unwrap_or(group_start)
            };
            // A record's frame checksum covers its payload: a torn write is an event of the
            // scan. A chunk whose checksum holds but whose payload does not hash to its cid
            // was written as it reads (a caller named it wrongly): kept as a bad chunk, as
            // anywhere else (reads of it report it corrupt), not taken for a torn write
            // that would cost the group's acknowledged commits.
            let bad = events
                .iter()
                .find(|e| e.pos >= from && e.pos < last_commit_end)
                .map(|e| (e.pos, e.why.clone()));
            if let Some((at, why)) = bad {
                let lost: Vec<u64> = out
                    .commits
                    .iter()
                    .filter(|c| c.off >= at && c.off < last_commit_end)
                    .map(|c| c.seq)
                    .collect();
                // Name what the lost commits changed, so the loss can be traced to keys:
                // the first few, and how many more (a group of thousands of commits made
                // a note of megabytes, printed by every command).
                const NAMED: usize = 32;
                let mut names: Vec<String> = Vec::new();
                let mut seen: std::collections::HashSet<bytes::Bytes> = Default::default();
                for c in out
                    .commits
                    .iter()
                    .filter(|c| c.off >= at && c.off < last_commit_end)
                {
                    if let Ok(body) = rd.get(c.off + FRAME_HEADER_LEN as u64, c.len as usize)
                        && let Ok(ops) = super::refs::decode_ops(body)
                    {
                        for (name, _) in ops {
                            if names.len() < NAMED && !seen.contains(&name) {
                                names.push(String::from_utf8_lossy(&name).into_owned());
                            }
                            seen.insert(name);
                        }
                    }
                }
                let touched = if names.is_empty() {
                    String::new()
                } else {
                    let more = seen.len() - names.len();
                    format!(
                        " (refs they changed: {}{})",
                        names.join(", "),
                        if more > 0 {
                            format!(", and {more} more")
                        } else {
                            String::new()
                        }
                    )
                };
                let seqs = match (lost.first(), lost.last()) {
                    (Some(a), Some(b)) if a != b => format!("commits {a}..={b}"),
                    (Some(a), _) => format!("commit {a}"),
                    _ => "no commit".into(),
                };
                cut = Some((
                    at,
                    format!(
                        "the last group of writes (offsets {group_start}..{last_commit_end}) \
                         was not durably written ({why}): cut at offset {at}, {seqs} not applied{touched}"
                    ),
                    true,
                ));
            }
        }
        if cut.is_none() {
            // A write interrupted before its commit record was complete was never
            // acknowledged: cut silently. But a commit record written whole whose payload
            // fails its checksum is a commit lost, maybe an acknowledged one (bit rot in
            // the last group): say so.
            let mut lost: Vec<u64> = Vec::new();
            if let Some((at, _)) = &first_bad {
                for c in out.commits.iter().filter(|c| c.off >= *at && !c.intact) {
                    let n = FRAME_HEADER_LEN + c.len as usize;
                    if !cut_short(c.off, rd.get(c.off, n)?) {
                        lost.push(c.seq);
                    }
                }
            }
            // Likewise a record header that reached the disk whole but fails its checks
            // (rather than being zeros from a sector boundary on, as an interrupted write
            // leaves it) was damaged in place: it may be the last, acknowledged, commit.
            let mut rotted = None;
            if let Some((at, why)) = &first_bad
                && lost.is_empty()
                && len.saturating_sub(*at) >= FRAME_HEADER_LEN as u64
            {
                // The header and the rest of the sectors it touches (see header_cut_short).
                let to = (*at + FRAME_HEADER_LEN as u64).div_ceil(SECTOR) * SECTOR;
                let region = rd.get(*at, (to.min(len) - *at) as usize)?;
                if parse_frame_header(&region[..FRAME_HEADER_LEN], place.at(*at)).is_err()
                    && !header_cut_short(*at, region)
                {
                    rotted = Some(format!(
                        "{why}, and those bytes are not what an interrupted write leaves: cut \
                         there; if it was the last commit record, that commit is not applied \
                         (lost if it had been acknowledged)"
                    ));
                }
            }
            cut = first_bad.map(|(at, why)| {
                if let Some(msg) = rotted {
                    return (at, msg, true);
                }
                match (lost.first(), lost.last()) {
                    (Some(a), Some(b)) => {
                        let seqs = if a == b {
                            format!("commit {a}")
                        } else {
                            format!("commits {a}..={b}")
                        };
                        let msg = format!(
                            "the last write's commit record is damaged ({why}): cut at offset \
                             {at}, {seqs} not applied (lost if it had been acknowledged)"
                        );
                        (at, msg, true)
                    }
                    _ => (at, why, false),
                }
            });
        }
    }
    let mut group_cut = None;
    if let Some((at, why, group)) = cut {
        out.records.retain(|r| r.off < at);
        out.commits.retain(|c| c.off < at);
        // Commits cut off are gone: their numbers will be given again.
        out.max_seq = out.commits.iter().map(|c| c.seq).max().unwrap_or(0);
        events.retain(|e| e.pos < at);
        out.end = at;
        if group {
            group_cut = Some(format!("{name}: {why}"));
        }
        out.stop = Some(why);
    }
    for e in events {
        out.damaged += 1;
        out.skipped += e.skipped;
        out.damage.push(e.what);
    }
    out.damage.extend(group_cut);
    Ok(out)
}

/// Disk sector size: a write interrupted part way (the kernel stops a buffered write at a
/// page boundary, a disk tears a write at a sector boundary) leaves a record whole up to
/// such a boundary and, since the segment is zero-filled ahead of its data, zeros from
/// there on. Pages are whole sectors.
const SECTOR: u64 = 512;

/// Whether the record at file offset `off` with bytes `rec` (header and payload) looks cut
/// short rather than damaged in place: its bytes are zero from a sector boundary inside
/// its payload to its end. (The header passed its checksum, so a cut lies after it.)
pub(super) fn cut_short(off: u64, rec: &[u8]) -> bool {
    let end = off + rec.len() as u64;
    let zeros = rec.iter().rev().take_while(|&&b| b == 0).count() as u64;
    // First sector boundary inside the record's trailing zeros.
    let boundary = (end - zeros).div_ceil(SECTOR) * SECTOR;
    boundary >= off + FRAME_HEADER_LEN as u64 && boundary < end
}

/// Whether a record header at file offset `off` that fails its checks may be an
/// interrupted write rather than damage in place. `region` is the file from `off` to the
/// end of the last sector the header touches (or to the end of the file). A power loss
/// leaves whole sectors unwritten, in any order, and an unwritten sector reads as the
/// zeros the segment was filled with ahead of its data. So the header may be torn when
/// one of its sectors holds only zeros from where this record starts: the part of its
/// first sector from `off` on, or a whole later sector (not just the header's bytes of
/// it: a commit header ends in reserved zeros, and its payload follows in that sector).
pub(super) fn header_cut_short(off: u64, region: &[u8]) -> bool {
    let end = off + region.len() as u64;
    let zeros = |from: u64, to: u64| {
        let (a, b) = ((from - off) as usize, (to.min(end) - off) as usize);
        region[a..b].iter().all(|&x| x == 0)
    };
    let mut sector_end = (off / SECTOR + 1) * SECTOR;
    if zeros(off, sector_end) {
        return true;
    }
    let header_end = off + FRAME_HEADER_LEN as u64;
    while sector_end < header_end && sector_end < end {
        if zeros(sector_end, sector_end + SECTOR) {
            return true;
        }
        sector_end += SECTOR;
    }
    false
}

/// Reads the payloads of commit records of `seg` (for its hint file), checking each
/// record's header and checksum: a hint is trusted at the next open without a rescan, so
/// a payload that rotted since it was written must not enter one under a fresh checksum.
pub(crate) fn read_commit_ops(seg: &Segment, len: u64, commits: &mut [CommitEntry]) -> Result<()> {
    let mut rd = Reader {
        file: &seg.file,
        path: &seg.path,
        place: seg.place(),
        len,
        buf: Vec::new(),
        start: 0,
    };
    for c in commits.iter_mut().filter(|c| c.ops.is_none()) {
        let end = c.off + FRAME_HEADER_LEN as u64 + c.len as u64;
        if end > len {
            return Err(crate::Error::corrupt(format!(
                "{}: commit record at offset {} runs past the end",
                seg.path.display(),
                c.off
            )));
        }
        let frame = rd.get(c.off, FRAME_HEADER_LEN + c.len as usize)?;
        let (head, payload) = frame.split_at(FRAME_HEADER_LEN);
        let sound = parse_frame_header(head, seg.place().at(c.off)).is_ok_and(|h| {
            h.kind == KIND_COMMIT
                && h.seq == c.seq
                && h.len == c.len
                && frame_crc_ok(head, &h, payload, seg.bound)
        });
        if !sound {
            return Err(crate::Error::corrupt(format!(
                "{}: commit record {} at offset {} fails its check",
                seg.path.display(),
                c.seq,
                c.off
            )));
        }
        c.ops = Some(payload.to_vec());
    }
    Ok(())
}

/// Whether bytes `[from, to)` of a file are all zero.
pub(crate) fn all_zeros(file: &File, path: &Path, from: u64, to: u64) -> Result<bool> {
    let mut buf = vec![0u8; WINDOW];
    let mut off = from;
    while off < to {
        let n = ((to - off) as usize).min(WINDOW);
        file.read_exact_at(&mut buf[..n], off)
            .ctx(|| format!("reading {} at offset {off}", path.display()))?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        off += n as u64;
    }
    Ok(true)
}

/// `pread`s exactly `len` bytes at `off` into a new buffer whose bytes are never read
/// before the kernel has written them.
fn read_exact_at_uninit(file: &File, len: usize, off: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let mut done = 0usize;
    while done < len {
        let at = off
            .checked_add(done as u64)
            .and_then(|a| libc::off_t::try_from(a).ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "read offset out of range"))?;
        // SAFETY: the destination is the buffer's unfilled capacity, `len - done` bytes
        // starting `done` bytes in; pread writes at most that many bytes there and reads
        // none, and `file` keeps the descriptor open for the call.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(done).cast(),
                len - done,
                at,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "failed to fill whole buffer",
                ));
            }
            _ => {
                let e = Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: the first `len` bytes were all written by pread above.
    unsafe { buf.set_len(len) };
    Ok(buf)
}

/// Asks the kernel to start writing `len` bytes of `file` from `off` back to the disk,
/// without waiting (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). Durability still comes from
/// `fdatasync` alone; this only starts the disk's work earlier. Errors are ignored: they
/// surface at the next `fdatasync`.
#[cfg(target_os = "linux")]
pub(crate) fn start_writeback(file: &File, off: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (libc::off64_t::try_from(off), libc::off64_t::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open for the lifetime of `file`; the call reads no memory
    // of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Elsewhere there is no `sync_file_range`: the commit's `fdatasync` does all the work.
#[cfg(not(target_os = "linux"))]
pub(crate) fn start_writeback(_file: &File, _off: u64, _len: u64) {}

/// Asks the kernel to drop `len` bytes of `file` from `off` from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`). Pages still dirty are not dropped (the call
/// starts their writeback instead), so no data is lost; reads of the range afterwards come
/// from the disk, verified as always. Errors are ignored: this only frees memory.
#[cfg(target_os = "linux")]
pub(crate) fn drop_cached(file: &File, off: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // A length of 0 would mean "to the end of the file".
    if len == 0 {
        return;
    }
    let (Ok(off), Ok(len)) = (libc::off64_t::try_from(off), libc::off64_t::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open for the lifetime of `file`; the call reads no memory
    // of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED);
    }
}

/// Elsewhere the page cache is left to the kernel.
#[cfg(not(target_os = "linux"))]
pub(crate) fn drop_cached(_file: &File, _off: u64, _len: u64) {}
