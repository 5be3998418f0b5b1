//! Segment files: creation, opening and the record scan used by recovery and compaction.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cairn_core::error::IoContext;

use super::format::{
    self, FRAME_HEADER_LEN, FrameHeader, HintEntry, KIND_CHUNK, SEG_HEADER_LEN, frame_crc_ok,
    parse_frame_header,
};
use crate::{HashAlgo, Result};

/// One segment file, shared by readers (pread) and the single writer (pwrite).
pub(crate) struct Segment {
    pub id: u32,
    pub path: PathBuf,
    pub file: File,
    /// Bytes written to the file (readers may `pread` below this).
    pub flushed: AtomicU64,
    /// Bytes known to be on stable storage (`fdatasync`ed).
    pub synced: AtomicU64,
}

impl Segment {
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
        }))
    }

    /// Opens an existing segment file; returns it with its length.
    pub fn open(dir: &Path, id: u32) -> Result<(File, PathBuf, u64)> {
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
        Ok((file, path, len))
    }

    /// Wraps an opened file whose first `len` bytes are valid and durable.
    pub fn from_parts(id: u32, path: PathBuf, file: File, len: u64) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path,
            file,
            flushed: AtomicU64::new(len),
            synced: AtomicU64::new(len),
        })
    }
}

/// What a scan of a segment found.
#[derive(Default)]
pub(crate) struct Scan {
    /// Records in file order.
    pub records: Vec<HintEntry>,
    /// End of the last good record (or of the durable region, if that lies further).
    pub end: u64,
    /// Why the scan stopped before the end of the file, if it did (a torn tail).
    pub stop: Option<String>,
    /// Damaged records inside the durable region: records kept although their payload
    /// checksum fails, plus one per region skipped to resynchronise after a bad header.
    pub damaged: u64,
    /// Bytes of the durable region skipped to resynchronise after bad record headers.
    pub skipped: u64,
    /// One description per damaged place in the durable region.
    pub damage: Vec<String>,
}

/// Reads a segment file through a window of `pread`s.
struct Reader<'a> {
    file: &'a File,
    path: &'a Path,
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
        let h = match parse_frame_header(&hdr) {
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
                if let Ok(p) = parse_frame_header(h) {
                    let at = off + i as u64;
                    if FRAME_HEADER_LEN as u64 + p.len as u64 <= self.len - at {
                        return Ok(Some(at));
                    }
                }
            }
            off += last as u64 + 1;
        }
        Ok(None)
    }
}

/// Scans the records of a segment file of `len` bytes.
///
/// `strict_from` is the end of the durable region (everything before it was acknowledged
/// as being on stable storage). Inside the durable region damage is bit rot, never a torn
/// write: a record whose header is sound but whose payload checksum fails is kept and
/// counted as damaged (reads of that chunk report it corrupt); a record whose header fails
/// its checks is skipped by searching forward, byte by byte, for the next offset where a
/// record header passes its checksum and the record fits in the file, and the skipped bytes
/// are reported. Nothing before `strict_from` ends the scan. Past it, the first bad record
/// (incomplete, failing a checksum, or a chunk not matching its cid) ends the scan: a torn
/// tail.
pub(crate) fn scan(file: &File, path: &Path, len: u64, strict_from: u64) -> Result<Scan> {
    let mut rd = Reader {
        file,
        path,
        len,
        buf: Vec::new(),
        start: 0,
    };
    let mut out = Scan::default();
    let mut pos = SEG_HEADER_LEN;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stop = loop {
        if pos >= len {
            break None;
        }
        let (h, hdr) = match rd.header_at(pos)? {
            Ok(x) => x,
            Err(why) => {
                if pos >= strict_from {
                    break Some(why);
                }
                // Bit rot in the durable region: resynchronise.
                out.damaged += 1;
                match rd.resync(pos + 1)? {
                    Some(next) => {
                        out.skipped += next - pos;
                        out.damage.push(format!(
                            "{name}: {why}; skipped {} bytes to the next record at offset {next}",
                            next - pos
                        ));
                        pos = next;
                        continue;
                    }
                    None => {
                        // Nothing valid follows; keep (never cut) the durable region.
                        let keep = strict_from.min(len);
                        out.skipped += keep - pos;
                        out.damage.push(format!(
                            "{name}: {why}; no valid record follows, {} bytes skipped",
                            keep - pos
                        ));
                        pos = keep;
                        if pos < len {
                            break Some(format!(
                                "no valid record after the durable region at offset {pos}"
                            ));
                        }
                        break None;
                    }
                }
            }
        };
        let size = FRAME_HEADER_LEN as u64 + h.len as u64;
        let strict = pos + size > strict_from;
        let payload = rd.get(pos + FRAME_HEADER_LEN as u64, h.len as usize)?;
        if !frame_crc_ok(&hdr, &h, payload) {
            if strict {
                break Some(format!("record checksum mismatch at offset {pos}"));
            }
            out.damaged += 1;
            out.damage
                .push(format!("{name}: record checksum mismatch at offset {pos}"));
        } else if strict && h.kind == KIND_CHUNK && !h.cid.matches(payload) {
            break Some(format!(
                "chunk at offset {pos} does not match its cid {}",
                h.cid
            ));
        }
        out.records.push(HintEntry {
            kind: h.kind,
            cid: h.cid,
            off: pos,
            len: h.len,
        });
        pos += size;
    };
    out.end = pos;
    out.stop = stop;
    Ok(out)
}
