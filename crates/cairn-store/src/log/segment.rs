//! Segment files: creation, opening and the record scan used by recovery and compaction.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cairn_core::error::IoContext;

use super::format::{
    self, FRAME_HEADER_LEN, HintEntry, KIND_CHUNK, SEG_HEADER_LEN, frame_crc_ok, parse_frame_header,
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
pub(crate) struct Scan {
    /// Records in file order.
    pub records: Vec<HintEntry>,
    /// End of the last good record.
    pub end: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop: Option<String>,
    /// Records kept although their payload checksum failed (inside the durable region).
    pub damaged: u64,
}

/// Scans the records of a segment file of `len` bytes.
///
/// A record that lies wholly before `strict_from` (the durable watermark) and whose header
/// is sound but whose payload checksum fails is kept and counted as damaged: it was
/// acknowledged, so it is bit rot, and reads of that chunk will report it corrupt. Any
/// other bad record ends the scan (a torn tail). Chunk records that reach past
/// `strict_from` are also checked against their cid.
pub(crate) fn scan(file: &File, path: &Path, len: u64, strict_from: u64) -> Result<Scan> {
    let mut r = BufReader::with_capacity(1 << 20, file);
    r.seek(SeekFrom::Start(SEG_HEADER_LEN))
        .ctx(|| format!("seeking in {}", path.display()))?;
    let mut records = Vec::new();
    let mut pos = SEG_HEADER_LEN;
    let mut damaged = 0;
    let mut hdr = [0u8; FRAME_HEADER_LEN];
    let mut payload = Vec::new();
    let read_err = |pos: u64| move || format!("reading {} at offset {pos}", path.display());
    let stop = loop {
        if pos >= len {
            break None;
        }
        if len - pos < FRAME_HEADER_LEN as u64 {
            break Some(format!("incomplete record header at offset {pos}"));
        }
        r.read_exact(&mut hdr).ctx(read_err(pos))?;
        let h = match parse_frame_header(&hdr) {
            Ok(h) => h,
            Err(why) => break Some(format!("{why} at offset {pos}")),
        };
        let size = FRAME_HEADER_LEN as u64 + h.len as u64;
        if size > len - pos {
            break Some(format!(
                "record at offset {pos} runs past the end of the file"
            ));
        }
        payload.resize(h.len as usize, 0);
        r.read_exact(&mut payload).ctx(read_err(pos))?;
        let strict = pos + size > strict_from;
        if !frame_crc_ok(&hdr, &h, &payload) {
            if strict {
                break Some(format!("record checksum mismatch at offset {pos}"));
            }
            damaged += 1;
        } else if strict && h.kind == KIND_CHUNK && !h.cid.matches(&payload) {
            break Some(format!(
                "chunk at offset {pos} does not match its cid {}",
                h.cid
            ));
        }
        records.push(HintEntry {
            kind: h.kind,
            cid: h.cid,
            off: pos,
            len: h.len,
        });
        pos += size;
    };
    Ok(Scan {
        records,
        end: pos,
        stop,
        damaged,
    })
}
