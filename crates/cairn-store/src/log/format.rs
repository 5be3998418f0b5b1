//! Byte layouts of the files in a [`LogStore`](super::LogStore) directory, and the small
//! helpers that write and check them. Every layout is described in the module doc of
//! `log.rs`; this file is the single place that knows the offsets.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use cairn_core::error::IoContext;
use cairn_core::hash::ENCODED_LEN;

use crate::{Cid, Error, HashAlgo, Result};

/// Version of every file format in this module (segment, hint, snapshot, manifest). Bumped
/// on any incompatible change (2: commit records live in the segments; no `refs.log`).
pub(crate) const FORMAT_VERSION: u8 = 2;

/// Segment format whose record headers are bound to where they lie (see [`FramePlace`]).
pub(crate) const SEG_VERSION: u8 = 3;
/// The segment format before that (its records checksum the same bytes but not their
/// place), still read and appended to.
pub(crate) const SEG_VERSION_UNBOUND: u8 = 2;

/// Magic of a segment file.
pub(crate) const SEG_MAGIC: &[u8; 8] = b"CAIRNSEG";
/// Bytes before the first record of a segment.
pub(crate) const SEG_HEADER_LEN: u64 = 16;

/// Bytes of a record header in a segment (`crc, hcrc, kind, 0, 0, 0, len, cid`, where a
/// commit record has `seq u64` and 26 zero bytes in place of the cid).
pub(crate) const FRAME_HEADER_LEN: usize = 16 + ENCODED_LEN;
/// Record kind: a chunk (header + payload).
pub(crate) const KIND_CHUNK: u8 = 1;
/// Record kind: a tombstone (header only; the chunk named by the cid is removed).
pub(crate) const KIND_TOMBSTONE: u8 = 2;
/// Record kind: a ref commit (header carries the sequence number; payload = the updates).
pub(crate) const KIND_COMMIT: u8 = 3;
/// Largest chunk a segment record can hold.
pub(crate) const MAX_CHUNK_LEN: usize = (u32::MAX as usize) - FRAME_HEADER_LEN;

/// Magic of the manifest.
pub(crate) const MANIFEST_MAGIC: &[u8; 8] = b"CAIRNMAN";
/// Size of the manifest.
pub(crate) const MANIFEST_LEN: usize = 16;

/// Magic of the refs snapshot.
pub(crate) const SNAP_MAGIC: &[u8; 8] = b"CAIRNSNP";
/// Magic of a hint file.
pub(crate) const HINT_MAGIC: &[u8; 8] = b"CAIRNHNT";
/// Bytes of one chunk or tombstone hint entry (`kind, cid, offset u64, len u32`).
pub(crate) const HINT_ENTRY_LEN: usize = 1 + ENCODED_LEN + 8 + 4;
/// Bytes of a commit hint entry before its body (`kind, seq u64, offset u64, len u32`).
pub(crate) const HINT_COMMIT_LEN: usize = 1 + 8 + 8 + 4;

/// File names.
pub(crate) const MANIFEST: &str = "MANIFEST";
/// Lock file name.
pub(crate) const LOCK: &str = "LOCK";
/// Refs snapshot file name.
pub(crate) const REFS_SNAP: &str = "refs.snap";
/// A second copy of the refs snapshot, written after it: once compaction has deleted the
/// commit segments a snapshot covers, the snapshot is the only record of those refs, so
/// one rotted sector must not make the store unopenable.
pub(crate) const REFS_SNAP_COPY: &str = "refs-copy.snap";

/// Path of segment `id`.
pub(crate) fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(segment_name(id))
}

/// File name of segment `id` (what recovery notes name: they must read the same however
/// the directory is spelled).
pub(crate) fn segment_name(id: u32) -> String {
    format!("seg-{id:06}.log")
}

/// Path of the hint file of segment `id`.
pub(crate) fn hint_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("seg-{id:06}.hint"))
}

/// Parses `seg-NNNNNN.<ext>` file names.
pub(crate) fn parse_segment_name(name: &str, ext: &str) -> Option<u32> {
    let rest = name.strip_prefix("seg-")?.strip_suffix(ext)?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

// ---------------------------------------------------------------------------------------
// Segments

/// The 16-byte segment header.
pub(crate) fn segment_header(id: u32, algo: HashAlgo) -> [u8; SEG_HEADER_LEN as usize] {
    let mut h = [0u8; SEG_HEADER_LEN as usize];
    h[..8].copy_from_slice(SEG_MAGIC);
    h[8..12].copy_from_slice(&id.to_le_bytes());
    h[12] = SEG_VERSION;
    h[13] = algo.code();
    h
}

/// Whether the records of a segment whose header is `h` are bound to their place: all but
/// those of [`SEG_VERSION_UNBOUND`] segments (a damaged header is taken as current).
pub(crate) fn segment_bound(h: &[u8]) -> bool {
    h.get(12) != Some(&SEG_VERSION_UNBOUND)
}

/// Checks a segment header read from disk.
pub(crate) fn check_segment_header(h: &[u8], id: u32, algo: HashAlgo) -> Result<(), String> {
    if h.len() < SEG_HEADER_LEN as usize || &h[..8] != SEG_MAGIC {
        return Err("not a Cairn segment (bad magic)".into());
    }
    if le_u32(&h[8..12]) != id {
        return Err(format!(
            "header names segment {} but the file name says {id}",
            le_u32(&h[8..12])
        ));
    }
    if h[12] != SEG_VERSION && h[12] != SEG_VERSION_UNBOUND {
        return Err(format!("unsupported segment format version {}", h[12]));
    }
    if h[13] != algo.code() {
        return Err(format!(
            "segment uses hash code 0x{:02x}, the store uses {algo}",
            h[13]
        ));
    }
    Ok(())
}

/// Where a record header lies. From segment format [`SEG_VERSION`] on, its header
/// checksum covers the segment id and the offset too, so a record's bytes found anywhere
/// else (inside a chunk's payload, say, if that chunk is a copy of a store) never pass as a
/// record there: a scan resynchronising past damage cannot pick them up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FramePlace {
    /// Segment id.
    pub seg: u32,
    /// Offset of the header in the segment.
    pub off: u64,
    /// Whether the segment binds records to their place (see [`segment_bound`]).
    pub bound: bool,
}

/// A segment as its records' places name it: its id and whether they are bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegPlace {
    /// Segment id.
    pub id: u32,
    /// Whether records are bound to their place (see [`segment_bound`]).
    pub bound: bool,
}

impl SegPlace {
    /// The place at offset `off` of this segment.
    pub fn at(self, off: u64) -> FramePlace {
        FramePlace {
            seg: self.id,
            off,
            bound: self.bound,
        }
    }
}

/// The header checksum (`hcrc`) of header `h` at `at`.
fn header_crc(h: &[u8], at: FramePlace) -> u32 {
    let mut c = crc32fast::Hasher::new();
    if at.bound {
        c.update(&at.seg.to_le_bytes());
        c.update(&at.off.to_le_bytes());
    }
    c.update(&h[8..FRAME_HEADER_LEN]);
    c.finalize()
}

/// The bytes of header `h` the whole-record checksum (`crc`) covers before the payload:
/// the fields after `hcrc` (bound segments) or `hcrc` and those fields (older ones).
fn crc_prefix(h: &[u8], bound: bool) -> &[u8] {
    if bound {
        &h[8..FRAME_HEADER_LEN]
    } else {
        &h[4..FRAME_HEADER_LEN]
    }
}

/// A record header before it has a place: its fields and the checksum of the record
/// computed once, outside any lock; [`Frame::seal`] adds what depends on the place where
/// it is written.
pub(crate) struct Frame {
    h: [u8; FRAME_HEADER_LEN],
    /// `crc` as a bound segment has it (it does not depend on the place).
    crc: u32,
}

impl Frame {
    fn new(kind: u8, key: &[u8; ENCODED_LEN], payload: &[u8]) -> Frame {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[8] = kind;
        h[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        h[16..].copy_from_slice(key);
        let mut c = crc32fast::Hasher::new();
        c.update(crc_prefix(&h, true));
        c.update(payload);
        Frame {
            h,
            crc: c.finalize(),
        }
    }

    /// The header of this record with `payload` as written at `at`: `hcrc` covers the
    /// header fields after it (and, in a bound segment, the place), so a damaged payload
    /// can be told from a damaged header; `crc` covers [`crc_prefix`] and the payload (an
    /// unbound segment's, which covers `hcrc` too, is computed here).
    pub fn seal(&self, at: FramePlace, payload: &[u8]) -> [u8; FRAME_HEADER_LEN] {
        let mut h = self.h;
        let hcrc = header_crc(&h, at);
        h[4..8].copy_from_slice(&hcrc.to_le_bytes());
        let crc = if at.bound {
            self.crc
        } else {
            let mut c = crc32fast::Hasher::new();
            c.update(crc_prefix(&h, false));
            c.update(payload);
            c.finalize()
        };
        h[..4].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// A chunk or tombstone record header, to seal where it is written.
pub(crate) fn frame_header(kind: u8, cid: &Cid, payload: &[u8]) -> Frame {
    Frame::new(kind, &cid.to_bytes(), payload)
}

/// The record header of commit `seq` whose payload is `ops`, to seal where it is written.
pub(crate) fn commit_header(seq: u64, ops: &[u8]) -> Frame {
    let mut key = [0u8; ENCODED_LEN];
    key[..8].copy_from_slice(&seq.to_le_bytes());
    Frame::new(KIND_COMMIT, &key, ops)
}

/// A record header that passed its header checksum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameHeader {
    pub crc: u32,
    pub kind: u8,
    pub len: u32,
    /// The chunk (chunk and tombstone records).
    pub cid: Option<Cid>,
    /// The commit sequence number (commit records).
    pub seq: u64,
}

/// Whether `kind` names a record kind (a cheap filter before the header checksum).
pub(crate) fn plausible_kind(kind: u8) -> bool {
    matches!(kind, KIND_CHUNK | KIND_TOMBSTONE | KIND_COMMIT)
}

/// Parses and checks a record header found at `at` (not the payload).
pub(crate) fn parse_frame_header(h: &[u8], at: FramePlace) -> Result<FrameHeader, String> {
    if h.len() < FRAME_HEADER_LEN {
        return Err("incomplete record header".into());
    }
    let hcrc = le_u32(&h[4..8]);
    if header_crc(h, at) != hcrc {
        return Err("record header checksum mismatch".into());
    }
    let kind = h[8];
    if h[9..12] != [0, 0, 0] {
        return Err("nonzero reserved bytes in record header".into());
    }
    let len = le_u32(&h[12..16]);
    let (cid, seq) = match kind {
        KIND_CHUNK | KIND_TOMBSTONE => {
            if kind == KIND_TOMBSTONE && len != 0 {
                return Err("tombstone with a payload".into());
            }
            let cid = Cid::from_bytes(&h[16..FRAME_HEADER_LEN]).map_err(|e| e.to_string())?;
            (Some(cid), 0)
        }
        KIND_COMMIT => {
            if h[24..FRAME_HEADER_LEN].iter().any(|&b| b != 0) {
                return Err("nonzero reserved bytes in commit record header".into());
            }
            (None, le_u64(&h[16..24]))
        }
        other => return Err(format!("unknown record kind {other}")),
    };
    Ok(FrameHeader {
        crc: le_u32(&h[..4]),
        kind,
        len,
        cid,
        seq,
    })
}

/// True when the record's whole-frame checksum matches `payload` (`bound`: the record lies
/// in a bound segment, see [`FramePlace`]).
pub(crate) fn frame_crc_ok(h: &[u8], hdr: &FrameHeader, payload: &[u8], bound: bool) -> bool {
    let mut c = crc32fast::Hasher::new();
    c.update(crc_prefix(h, bound));
    c.update(payload);
    c.finalize() == hdr.crc
}

// ---------------------------------------------------------------------------------------
// Manifest

/// The manifest: magic, format version, hash algorithm code, CRC.
pub(crate) fn manifest_bytes(algo: HashAlgo) -> [u8; MANIFEST_LEN] {
    let mut m = [0u8; MANIFEST_LEN];
    m[..8].copy_from_slice(MANIFEST_MAGIC);
    m[8] = FORMAT_VERSION;
    m[9] = algo.code();
    let crc = crc32fast::hash(&m[..12]);
    m[12..].copy_from_slice(&crc.to_le_bytes());
    m
}

/// Parses the manifest; returns the store's hash algorithm.
pub(crate) fn parse_manifest(m: &[u8], path: &Path) -> Result<HashAlgo> {
    let bad = |why: &str| Error::corrupt(format!("{}: {why}", path.display()));
    if m.len() != MANIFEST_LEN || &m[..8] != MANIFEST_MAGIC {
        return Err(bad("not a Cairn log store manifest"));
    }
    if crc32fast::hash(&m[..12]) != le_u32(&m[12..]) {
        return Err(bad("manifest checksum mismatch"));
    }
    if m[8] != FORMAT_VERSION {
        return Err(bad(&format!(
            "unsupported store format version {} (this build reads {FORMAT_VERSION})",
            m[8]
        )));
    }
    HashAlgo::from_code(m[9]).map_err(|e| bad(&e.to_string()))
}

// ---------------------------------------------------------------------------------------
// Hints

/// A chunk or tombstone record of a segment, as listed in its hint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HintEntry {
    pub kind: u8,
    pub cid: Cid,
    /// Offset of the record header in the segment.
    pub off: u64,
    /// Payload length.
    pub len: u32,
}

/// A commit record of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommitEntry {
    pub seq: u64,
    /// Offset of the record header in the segment.
    pub off: u64,
    /// Payload length.
    pub len: u32,
    /// The payload (the encoded updates), when it was kept (see the readers).
    pub ops: Option<Vec<u8>>,
    /// False when the record's checksum failed (bit rot): its updates are lost.
    pub intact: bool,
}

/// Serialises a hint file: magic, version, 3 zero bytes, segment length (u64), entry count
/// (u32), entries in file order, CRC of everything before it. A chunk or tombstone entry is
/// `kind, cid, offset u64, len u32`; a commit entry is `3, seq u64, offset u64, len u32,
/// payload`. Every commit in `commits` must carry its payload.
pub(crate) fn hint_bytes(seg_len: u64, entries: &[HintEntry], commits: &[CommitEntry]) -> Vec<u8> {
    let body: usize = commits
        .iter()
        .map(|c| HINT_COMMIT_LEN + c.len as usize)
        .sum();
    let mut out = Vec::with_capacity(24 + entries.len() * HINT_ENTRY_LEN + body + 4);
    out.extend_from_slice(HINT_MAGIC);
    out.extend_from_slice(&[FORMAT_VERSION, 0, 0, 0]);
    out.extend_from_slice(&seg_len.to_le_bytes());
    out.extend_from_slice(&((entries.len() + commits.len()) as u32).to_le_bytes());
    let (mut e, mut c) = (entries.iter().peekable(), commits.iter().peekable());
    loop {
        let take_commit = match (e.peek(), c.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(a), Some(b)) => b.off < a.off,
        };
        if take_commit {
            let Some(x) = c.next() else { break };
            out.push(KIND_COMMIT);
            out.extend_from_slice(&x.seq.to_le_bytes());
            out.extend_from_slice(&x.off.to_le_bytes());
            out.extend_from_slice(&x.len.to_le_bytes());
            out.extend_from_slice(x.ops.as_deref().unwrap_or_default());
        } else {
            let Some(x) = e.next() else { break };
            out.push(x.kind);
            out.extend_from_slice(&x.cid.to_bytes());
            out.extend_from_slice(&x.off.to_le_bytes());
            out.extend_from_slice(&x.len.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Parses a hint file; `None` when it is damaged or does not describe a segment of
/// `seg_len` bytes (the caller then rescans the segment). Commit payloads are kept only for
/// commits with a sequence number above `keep_after`.
pub(crate) fn parse_hint(
    b: &[u8],
    seg_len: u64,
    keep_after: u64,
) -> Option<(Vec<HintEntry>, Vec<CommitEntry>)> {
    if b.len() < 28 || &b[..8] != HINT_MAGIC || b[8] != FORMAT_VERSION {
        return None;
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32fast::hash(body) != le_u32(crc) || le_u64(&body[12..20]) != seg_len {
        return None;
    }
    let n = le_u32(&body[20..24]) as usize;
    let mut rest = &body[24..];
    let mut out = Vec::new();
    let mut commits = Vec::new();
    let mut end = SEG_HEADER_LEN;
    for _ in 0..n {
        let kind = *rest.first()?;
        let (off, len) = if kind == KIND_COMMIT {
            let e = rest.get(..HINT_COMMIT_LEN)?;
            let seq = le_u64(&e[1..]);
            let off = le_u64(&e[9..]);
            let len = le_u32(&e[17..]);
            let ops = rest.get(HINT_COMMIT_LEN..HINT_COMMIT_LEN + len as usize)?;
            rest = &rest[HINT_COMMIT_LEN + len as usize..];
            commits.push(CommitEntry {
                seq,
                off,
                len,
                ops: (seq > keep_after).then(|| ops.to_vec()),
                intact: true,
            });
            (off, len)
        } else {
            let e = rest.get(..HINT_ENTRY_LEN)?;
            rest = &rest[HINT_ENTRY_LEN..];
            let cid = Cid::from_bytes(&e[1..1 + ENCODED_LEN]).ok()?;
            let off = le_u64(&e[1 + ENCODED_LEN..]);
            let len = le_u32(&e[1 + ENCODED_LEN + 8..]);
            if !(kind == KIND_CHUNK || (kind == KIND_TOMBSTONE && len == 0)) {
                return None;
            }
            out.push(HintEntry {
                kind,
                cid,
                off,
                len,
            });
            (off, len)
        };
        // Entries must tile the segment exactly, in order.
        if off != end {
            return None;
        }
        end = off + FRAME_HEADER_LEN as u64 + len as u64;
    }
    (end == seg_len && rest.is_empty()).then_some((out, commits))
}

// ---------------------------------------------------------------------------------------
// Refs snapshot

/// Wraps a snapshot body: magic, body, CRC of both.
pub(crate) fn snapshot_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(SNAP_MAGIC);
    out.extend_from_slice(body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Unwraps a snapshot; errors name the file.
pub(crate) fn parse_snapshot<'a>(b: &'a [u8], path: &Path) -> Result<&'a [u8]> {
    if b.len() < 12 || &b[..8] != SNAP_MAGIC {
        return Err(Error::corrupt(format!(
            "{}: not a Cairn refs snapshot",
            path.display()
        )));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32fast::hash(body) != le_u32(crc) {
        return Err(Error::corrupt(format!(
            "{}: refs snapshot checksum mismatch",
            path.display()
        )));
    }
    Ok(&body[8..])
}

// ---------------------------------------------------------------------------------------
// Files

/// Fsyncs a directory so that creates, renames and deletes in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx(|| format!("syncing directory {}", dir.display()))
}

/// The temporary file [`write_atomic`] writes `path` through.
pub(crate) fn tmp_path(path: &Path) -> std::path::PathBuf {
    path.with_extension("tmp")
}

/// Writes `bytes` to `path` atomically: temporary file, fsync, rename, fsync directory.
pub(crate) fn write_atomic(dir: &Path, path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let tmp = tmp_path(path);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .ctx(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .ctx(|| format!("writing {}", tmp.display()))?;
    if durable {
        f.sync_all().ctx(|| format!("syncing {}", tmp.display()))?;
    }
    drop(f);
    fs::rename(&tmp, path).ctx(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_header_round_trip_and_damage() {
        let payload = b"hello world";
        let cid = HashAlgo::Blake3.digest(payload);
        for bound in [true, false] {
            let at = FramePlace {
                seg: 7,
                off: 4096,
                bound,
            };
            let h = frame_header(KIND_CHUNK, &cid, payload).seal(at, payload);
            let p = parse_frame_header(&h, at).unwrap();
            assert_eq!(p.cid, Some(cid));
            assert_eq!(p.len as usize, payload.len());
            assert!(frame_crc_ok(&h, &p, payload, bound));
            assert!(!frame_crc_ok(&h, &p, b"hello worle", bound));
            for i in 4..FRAME_HEADER_LEN {
                let mut bad = h;
                bad[i] ^= 0x40;
                assert!(parse_frame_header(&bad, at).is_err(), "byte {i}");
            }
            // A bound record is a record only where it was written: not at another offset,
            // nor in another segment (an unbound one is anywhere).
            for elsewhere in [FramePlace { off: 4097, ..at }, FramePlace { seg: 8, ..at }] {
                assert_eq!(parse_frame_header(&h, elsewhere).is_ok(), !bound);
            }
            let c = commit_header(77, b"ops").seal(at, b"ops");
            let p = parse_frame_header(&c, at).unwrap();
            assert_eq!((p.kind, p.seq, p.len, p.cid), (KIND_COMMIT, 77, 3, None));
            assert!(frame_crc_ok(&c, &p, b"ops", bound));
        }
        // The unbound form is the format-2 record: hcrc over the fields, crc over hcrc,
        // the fields and the payload.
        let at = FramePlace {
            seg: 1,
            off: 16,
            bound: false,
        };
        let h = frame_header(KIND_CHUNK, &cid, payload).seal(at, payload);
        assert_eq!(le_u32(&h[4..8]), crc32fast::hash(&h[8..]));
        let mut c = crc32fast::Hasher::new();
        c.update(&h[4..]);
        c.update(payload);
        assert_eq!(le_u32(&h[..4]), c.finalize());
    }

    #[test]
    fn hints_round_trip() {
        let cid = HashAlgo::Sha256.digest(b"x");
        let e = vec![
            HintEntry {
                kind: KIND_CHUNK,
                cid,
                off: SEG_HEADER_LEN,
                len: 1,
            },
            HintEntry {
                kind: KIND_TOMBSTONE,
                cid,
                off: SEG_HEADER_LEN + FRAME_HEADER_LEN as u64 + 1,
                len: 0,
            },
        ];
        let len = SEG_HEADER_LEN + 2 * FRAME_HEADER_LEN as u64 + 1;
        let c = vec![CommitEntry {
            seq: 9,
            off: len,
            len: 3,
            ops: Some(vec![1, 2, 3]),
            intact: true,
        }];
        let len2 = len + FRAME_HEADER_LEN as u64 + 3;
        let b = hint_bytes(len2, &e, &c);
        assert_eq!(parse_hint(&b, len2, 0).unwrap(), (e.clone(), c.clone()));
        let (_, skipped) = parse_hint(&b, len2, 9).unwrap();
        assert_eq!(skipped[0].ops, None);
        assert!(parse_hint(&b, len2 + 1, 0).is_none());
        let mut bad = b.clone();
        bad[30] ^= 1;
        assert!(parse_hint(&bad, len2, 0).is_none());
        assert!(parse_hint(&hint_bytes(len, &e, &[]), len, 0).is_some());
    }

    #[test]
    fn segment_names() {
        assert_eq!(parse_segment_name("seg-000012.log", ".log"), Some(12));
        assert_eq!(parse_segment_name("seg-.log", ".log"), None);
        assert_eq!(parse_segment_name("seg-0001.hint", ".log"), None);
        assert_eq!(parse_segment_name("seg-+1.log", ".log"), None);
    }
}
