//! `logstore_recovery` target: damaged store directories must open cleanly or fail cleanly.
//!
//! Written against `LogStore`'s public API only (`open`, `path`, `segment_paths`, the
//! `ChunkStore`/`RefStore` traits), so it survives on-disk format changes: a template store
//! is created once per process by `LogStore::open` itself (several segments, hints, refs
//! commits, a tombstone), its files are captured, and every input is a list of edits
//! applied to a fresh copy of those files before reopening.
//!
//! Input: a sequence of edits, each
//!
//! ```text
//! u8   file   index into the template's files sorted by name (LOCK excluded), modulo
//! u8   mode   0 truncate to `off` then append data · 1 append · 2 overwrite at `off`
//!             3 xor at `off` · 4 truncate to `off` · 5 delete the file (low 7 bits,
//!             modulo 6); bit 7 of the *first* edit's mode also runs the write check
//! u16  off    little-endian
//! u16  len    little-endian; then `len` data bytes (fewer at the end of the input)
//! ```
//!
//! Checks: `open` returns `Ok` or an `Err`, never panics. When `Ok`: every cid that
//! `cids()` lists is either returned by `get` with bytes hashing to it, or `get` fails with
//! `Error::Corrupt` (and `has` then denies it, so a put writes a sound copy); refs list. With the write check: every template chunk whose read fails with
//! `Error::Corrupt` is put again and then reads back exactly; and the recovered store
//! accepts a put and a commit, after which it reopens with all of these visible (opt-in per
//! input because reopening
//! after a commit scans the refs log's 1 MiB zero-filled tail, which costs ~100 ms per run
//! under sanitizer coverage instrumentation).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cairn_core::{Error, Result};
use cairn_store::{ChunkStore, Durability, LogStore, LogStoreOptions, RefStore, RefUpdate};

/// Options used for the template and every reopen: small segments so a handful of chunks
/// spans several (sealed with hints, and an active one), no syncs.
pub fn options() -> LogStoreOptions {
    LogStoreOptions {
        durability: Durability::Buffered,
        segment_size: 1024,
        write_buffer: 4096,
        refs_log_max: 300,
        ..LogStoreOptions::default()
    }
}

/// A scratch directory on tmpfs when there is one.
fn scratch(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("cairn-fuzz-{tag}-{}", std::process::id()))
}

fn fill(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 31 + k * 7) as u8).collect()
}

/// The template's files: (name, bytes), sorted by name, LOCK excluded.
pub struct Template {
    pub files: Vec<(String, Vec<u8>)>,
    /// Every chunk the template put, in order.
    pub chunks: Vec<Vec<u8>>,
    /// Names of the segment files (from `segment_paths`), oldest first.
    pub segments: Vec<String>,
}

fn build_template() -> Result<Template> {
    let dir = scratch("template");
    let _ = fs::remove_dir_all(&dir);
    let mut chunks = Vec::new();
    {
        let s = LogStore::open(&dir, options())?;
        let mut kept = Vec::new();
        for i in 0..24 {
            let bytes = fill(i, 20 + (i * 37) % 200);
            let c = s.put(&bytes)?;
            chunks.push(bytes);
            kept.push(c);
            if i % 3 == 2 {
                s.commit(&[RefUpdate::Set {
                    name: format!("ref/{}", i % 5).into_bytes(),
                    value: c.to_bytes().to_vec(),
                }])?;
            }
            if i == 10 {
                s.remove(&[kept[1], kept[4]])?;
                s.commit(&[RefUpdate::Delete {
                    name: b"ref/2".to_vec(),
                }])?;
            }
        }
        s.commit(&[RefUpdate::Set {
            name: b"head".to_vec(),
            value: b"tail".to_vec(),
        }])?;
    }
    // Reopen once: open cuts the zeros kept ahead of the refs log.
    let segments = {
        let s = LogStore::open(&dir, options())?;
        s.segment_paths()
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect()
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| Error::io("listing template", e))? {
        let entry = entry.map_err(|e| Error::io("listing template", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "LOCK" {
            continue;
        }
        let bytes = fs::read(entry.path()).map_err(|e| Error::io("reading template", e))?;
        files.push((name, bytes));
    }
    files.sort();
    let _ = fs::remove_dir_all(&dir);
    Ok(Template {
        files,
        chunks,
        segments,
    })
}

/// The per-process template.
pub fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| build_template().expect("building the template store"))
}

/// One edit of the template's files.
#[derive(Clone, Debug)]
pub struct Edit {
    pub file: u8,
    pub mode: u8,
    pub off: u16,
    pub data: Vec<u8>,
}

impl Edit {
    pub fn encode(edits: &[Edit]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in edits {
            out.push(e.file);
            out.push(e.mode);
            out.extend_from_slice(&e.off.to_le_bytes());
            out.extend_from_slice(&(e.data.len() as u16).to_le_bytes());
            out.extend_from_slice(&e.data);
        }
        out
    }

    fn parse(mut data: &[u8]) -> Vec<Edit> {
        let mut out = Vec::new();
        while data.len() >= 6 && out.len() < 16 {
            let len = u16::from_le_bytes([data[4], data[5]]) as usize;
            let end = (6 + len).min(data.len());
            out.push(Edit {
                file: data[0],
                mode: data[1],
                off: u16::from_le_bytes([data[2], data[3]]),
                data: data[6..end].to_vec(),
            });
            data = &data[end..];
        }
        out
    }
}

fn apply(files: &mut [(String, Option<Vec<u8>>)], e: &Edit) {
    let slot = &mut files[e.file as usize % files.len()].1;
    let off = e.off as usize;
    match (e.mode & 0x7f) % 6 {
        0 => {
            let f = slot.get_or_insert_with(Vec::new);
            f.truncate(off);
            f.extend_from_slice(&e.data);
        }
        1 => slot.get_or_insert_with(Vec::new).extend_from_slice(&e.data),
        2 => {
            let f = slot.get_or_insert_with(Vec::new);
            let at = off.min(f.len());
            let end = at + e.data.len();
            if f.len() < end {
                f.resize(end, 0);
            }
            f[at..end].copy_from_slice(&e.data);
        }
        3 => {
            if let Some(f) = slot {
                for (k, b) in e.data.iter().enumerate() {
                    if let Some(x) = f.get_mut(off + k) {
                        *x ^= b;
                    }
                }
            }
        }
        4 => {
            if let Some(f) = slot {
                f.truncate(off);
            }
        }
        _ => *slot = None,
    }
}

fn check_open(dir: &Path) -> Option<LogStore> {
    match LogStore::open(dir, options()) {
        Ok(s) => Some(s),
        Err(Error::Unavailable(m)) => panic!("store still locked: {m}"),
        Err(_) => None,
    }
}

fn check_contents(s: &LogStore) {
    let Ok(cids) = s.cids() else { return };
    for c in &cids {
        let sound = match s.get(c) {
            Ok(Some(b)) => {
                assert!(c.matches(&b), "get({c}) returned bytes of another hash");
                true
            }
            Ok(None) => panic!("cids() lists {c} but get() does not find it"),
            Err(Error::Corrupt(_)) => false,
            Err(e) => panic!("get({c}) failed with a non-Corrupt error: {e}"),
        };
        // A record whose checksum field alone is damaged still reads back sound, and may
        // still count as damaged to `has`: a put then writes one more copy, harmlessly.
        if !sound {
            assert!(
                !s.has(c).unwrap_or(false),
                "has({c}) holds a chunk whose read fails as corrupt"
            );
        }
    }
    let _ = s.list_refs(b"");
    let _ = s.stats();
}

/// The target.
pub fn run(data: &[u8]) {
    let t = template();
    let dir = scratch("run");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating the scratch directory");
    let mut files: Vec<(String, Option<Vec<u8>>)> = t
        .files
        .iter()
        .map(|(n, b)| (n.clone(), Some(b.clone())))
        .collect();
    let edits = Edit::parse(data);
    let write_check = edits.first().is_some_and(|e| e.mode & 0x80 != 0);
    for e in &edits {
        apply(&mut files, e);
    }
    for (name, bytes) in &files {
        if let Some(b) = bytes {
            fs::write(dir.join(name), b).expect("writing a store file");
        }
    }
    let Some(s) = check_open(&dir) else {
        let _ = fs::remove_dir_all(&dir);
        return;
    };
    assert_eq!(s.path(), dir.as_path());
    check_contents(&s);

    if !write_check {
        drop(s);
        let _ = fs::remove_dir_all(&dir);
        return;
    }
    // A chunk whose stored copy is damaged is repaired by putting it again.
    let mut repaired = Vec::new();
    for bytes in &t.chunks {
        let c = s.algo().digest(bytes);
        if matches!(s.get(&c), Err(Error::Corrupt(_))) && s.put(bytes).is_ok() {
            match s.get(&c) {
                Ok(Some(b)) => assert_eq!(b.as_ref(), &bytes[..], "repaired chunk {c}"),
                other => panic!("chunk {c} put again after damage does not read back: {other:?}"),
            }
            repaired.push(c);
        }
    }
    // The recovered store must take new writes and survive a reopen with them.
    let probe = b"cairn-fuzz probe chunk".as_slice();
    let wrote = s.put(probe).and_then(|c| {
        s.commit(&[RefUpdate::Set {
            name: b"fuzz/probe".to_vec(),
            value: c.to_bytes().to_vec(),
        }])
        .map(|()| c)
    });
    drop(s);
    if let Ok(c) = wrote {
        let s = match LogStore::open(&dir, options()) {
            Ok(s) => s,
            Err(e) => panic!("a recovered store that accepted a commit fails to reopen: {e}"),
        };
        match s.get(&c) {
            Ok(Some(b)) => assert_eq!(b.as_ref(), probe),
            other => panic!("chunk put before a commit lost after reopen: {other:?}"),
        }
        match s.get_ref(b"fuzz/probe") {
            Ok(Some(v)) => assert_eq!(v.as_ref(), &c.to_bytes()[..]),
            other => panic!("committed ref lost after reopen: {other:?}"),
        }
        for r in &repaired {
            match s.get(r) {
                Ok(Some(b)) => assert!(r.matches(&b)),
                other => panic!("repaired chunk {r} lost after reopen: {other:?}"),
            }
        }
        check_contents(&s);
    }
    let _ = fs::remove_dir_all(&dir);
}
