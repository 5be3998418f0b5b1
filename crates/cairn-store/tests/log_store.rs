//! Behaviour of the embedded log backend: chunks, refs, reopen, removal, compaction, torn
//! tails, tampering, locking, group commit, and a model-based property test.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cairn_store::{
    Bytes, ChunkStore, Cid, Durability, Error, HashAlgo, LogStore, LogStoreOptions, RefStore,
    RefUpdate,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn opts(durability: Durability) -> LogStoreOptions {
    LogStoreOptions {
        durability,
        ..Default::default()
    }
}

/// Tiny segments and buffers, so rolls, hints, snapshots and compaction all happen.
fn small(durability: Durability) -> LogStoreOptions {
    LogStoreOptions {
        durability,
        segment_size: 8 << 10,
        write_buffer: 4096,
        refs_log_max: 4096,
        ..Default::default()
    }
}

fn set(name: &str, value: &[u8]) -> RefUpdate {
    RefUpdate::Set {
        name: name.as_bytes().to_vec(),
        value: value.to_vec(),
    }
}

fn del(name: &str) -> RefUpdate {
    RefUpdate::Delete {
        name: name.as_bytes().to_vec(),
    }
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

fn all_refs(s: &LogStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    s.list_refs(b"")
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "LOCK" {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Records of a segment: `(offset, kind, payload length)`.
fn segment_records(seg: &Path) -> Vec<(u64, u8, u64)> {
    let b = fs::read(seg).unwrap();
    let mut out = Vec::new();
    let mut pos = 16usize;
    while pos + 50 <= b.len() {
        let len = u32::from_le_bytes(b[pos + 12..pos + 16].try_into().unwrap()) as usize;
        out.push((pos as u64, b[pos + 8], len as u64));
        pos += 50 + len;
    }
    out
}

const KIND_COMMIT: u8 = 3;

/// Puts `n` chunks of 1000 bytes, commits ref `root`, then removes all but every `keep`-th
/// chunk; returns the removed cids and the kept chunks.
fn put_then_remove_most(s: &LogStore, n: u64, keep: usize) -> (Vec<Cid>, Vec<(Cid, Vec<u8>)>) {
    let mut chunks = Vec::new();
    for i in 0..n {
        let data = payload(i, 1000);
        chunks.push((s.put(&data).unwrap(), data));
    }
    s.commit(&[set("root", b"r")]).unwrap();
    let (dead, live): (Vec<_>, Vec<_>) = chunks
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % keep != 0);
    let dead: Vec<Cid> = dead.into_iter().map(|(_, (c, _))| c).collect();
    s.remove(&dead).unwrap();
    (dead, live.into_iter().map(|(_, x)| x).collect())
}

fn file_len(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

#[test]
fn put_get_has_dedup_stats() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    assert_eq!(s.path(), dir.path());
    let mut cids = Vec::new();
    let mut total = 0u64;
    for i in 0..100u64 {
        let data = payload(i, (i as usize * 37) % 5000);
        total += data.len() as u64;
        let cid = s.put(&data).unwrap();
        // Readable while still in the write buffer.
        assert_eq!(&s.get(&cid).unwrap().unwrap()[..], &data[..]);
        cids.push((cid, data));
    }
    for (cid, data) in &cids {
        assert!(!s.put_hashed(*cid, data).unwrap(), "dedup");
        assert!(s.has(cid).unwrap());
    }
    s.sync().unwrap();
    for (cid, data) in &cids {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    let absent = HashAlgo::Blake3.digest(b"absent");
    assert!(s.get(&absent).unwrap().is_none());
    assert!(!s.has(&absent).unwrap());
    let st = s.stats().unwrap();
    assert_eq!(st.chunks, 100);
    assert_eq!(st.chunk_bytes, total);
    assert!(st.bytes_on_disk > total);
    let listed: HashSet<Cid> = s.cids().unwrap().into_iter().collect();
    assert_eq!(listed, cids.iter().map(|(c, _)| *c).collect());
    // A cid of the other algorithm is refused.
    let wrong = HashAlgo::Sha256.digest(b"x");
    assert!(matches!(
        s.put_hashed(wrong, b"x"),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(s.durability(), Durability::Group);
}

#[test]
fn reopen_keeps_chunks_and_refs_for_both_algos() {
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        for d in Durability::ALL {
            let dir = tempfile::tempdir().unwrap();
            let mut o = small(d);
            o.algo = algo;
            let s = LogStore::open(dir.path(), o.clone()).unwrap();
            assert_eq!(s.algo(), algo);
            let mut chunks = Vec::new();
            for i in 0..60u64 {
                let data = payload(i + 1000, 300 + i as usize * 11);
                chunks.push((s.put(&data).unwrap(), data));
                s.commit(&[set(&format!("k/{i:03}"), &i.to_le_bytes())])
                    .unwrap();
            }
            s.commit(&[del("k/000"), set("other", b"x")]).unwrap();
            let refs = all_refs(&s);
            assert_eq!(refs.len(), 60);
            drop(s);
            // The stored algorithm wins over the requested one.
            let mut o2 = o.clone();
            o2.algo = match algo {
                HashAlgo::Blake3 => HashAlgo::Sha256,
                HashAlgo::Sha256 => HashAlgo::Blake3,
            };
            let s = LogStore::open(dir.path(), o2).unwrap();
            assert_eq!(s.algo(), algo);
            assert_eq!(*s.recovery(), Default::default(), "clean reopen");
            assert!(s.segment_paths().len() > 1, "segments rolled");
            for (cid, data) in &chunks {
                assert_eq!(cid.algo(), algo);
                assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
            }
            assert_eq!(all_refs(&s), refs);
            assert_eq!(s.list_refs(b"k/").unwrap().len(), 59);
            assert_eq!(
                &s.get_ref(b"k/059").unwrap().unwrap()[..],
                &59u64.to_le_bytes()
            );
            assert!(s.get_ref(b"k/000").unwrap().is_none());
            // And keeps working.
            let c = s.put(b"after reopen").unwrap();
            s.commit(&[set("after", c.to_bytes().as_slice())]).unwrap();
            drop(s);
            let s = LogStore::open(dir.path(), o).unwrap();
            assert!(s.has(&c).unwrap());
            assert!(s.get_ref(b"after").unwrap().is_some());
        }
    }
}

#[test]
fn remove_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let a = s.put(b"a").unwrap();
    let b = s.put(b"b").unwrap();
    s.remove(&[a, HashAlgo::Blake3.digest(b"never stored")])
        .unwrap();
    assert!(!s.has(&a).unwrap());
    assert!(s.get(&a).unwrap().is_none());
    assert_eq!(s.stats().unwrap().chunks, 1);
    drop(s);
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    assert!(!s.has(&a).unwrap());
    assert!(s.has(&b).unwrap());
    // Put again after removal: present again, also after reopen.
    assert!(s.put_hashed(a, b"a").unwrap());
    drop(s);
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    assert_eq!(&s.get(&a).unwrap().unwrap()[..], b"a");
}

#[test]
fn compact_reclaims_space_and_keeps_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let (dead, live) = put_then_remove_most(&s, 200, 4);
    let before = s.stats().unwrap().bytes_on_disk;
    let segs_before = s.segment_paths().len();
    let reclaimed = s.compact().unwrap();
    let after = s.stats().unwrap();
    assert!(reclaimed > 0, "reclaimed {reclaimed}");
    assert!(
        after.bytes_on_disk < before,
        "{before} -> {}",
        after.bytes_on_disk
    );
    assert!(s.segment_paths().len() < segs_before);
    assert_eq!(after.chunks, live.len() as u64);
    for (cid, data) in &live {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    drop(s);
    let s = LogStore::open(dir.path(), o).unwrap();
    for (cid, data) in &live {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    for cid in &dead {
        assert!(!s.has(cid).unwrap());
    }
    assert_eq!(s.get_ref(b"root").unwrap().as_deref(), Some(&b"r"[..]));
    // Nothing left to do.
    assert_eq!(s.compact().unwrap(), 0);
}

/// A tombstone in a compacted segment must be carried forward while an older, kept segment
/// still holds the chunk it removed; otherwise the chunk would come back at the next open.
#[test]
fn compaction_keeps_needed_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let x = s.put(&payload(9999, 100)).unwrap();
    let mut keep = Vec::new();
    while s.segment_paths().len() < 2 {
        keep.push(s.put(&payload(keep.len() as u64, 700)).unwrap());
    }
    // Segment 2 onwards: filler, then the tombstone of x.
    let mut filler = Vec::new();
    while s.segment_paths().len() < 3 {
        filler.push(s.put(&payload(50_000 + filler.len() as u64, 700)).unwrap());
    }
    s.remove(&[x]).unwrap();
    s.remove(&filler).unwrap();
    assert!(s.compact().unwrap() > 0);
    assert!(
        s.segment_paths()[0].ends_with("seg-000001.log"),
        "segment 1 kept"
    );
    drop(s);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    assert!(!s.has(&x).unwrap(), "removed chunk resurrected");
    for c in &keep {
        assert!(s.get(c).unwrap().is_some());
    }
    // Compacting again (also removing the rest) keeps it removed.
    s.remove(&keep).unwrap();
    s.compact().unwrap();
    drop(s);
    let s = LogStore::open(dir.path(), o).unwrap();
    assert!(!s.has(&x).unwrap());
    assert_eq!(s.stats().unwrap().chunks, 0);
}

#[test]
fn refs_are_snapshotted_and_commit_segments_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    for i in 0..500u32 {
        s.commit(&[set(&format!("r/{}", i % 37), &i.to_le_bytes()), del("r/3")])
            .unwrap();
    }
    let refs = all_refs(&s);
    assert!(dir.path().join("refs.snap").exists());
    assert!(!dir.path().join("refs.log").exists());
    let segs = s.segment_paths().len();
    assert!(segs > 3, "{segs}");
    // Segments of nothing but commit records are garbage once a snapshot covers them.
    assert!(s.compact().unwrap() > 0);
    assert!(s.segment_paths().len() < segs);
    drop(s);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    assert_eq!(all_refs(&s), refs);
    assert_eq!(*s.recovery(), Default::default());
    s.commit(&[set("r/3", b"back")]).unwrap();
    assert_eq!(s.get_ref(b"r/3").unwrap().as_deref(), Some(&b"back"[..]));
    drop(s);
    let s = LogStore::open(dir.path(), o).unwrap();
    assert_eq!(s.get_ref(b"r/3").unwrap().as_deref(), Some(&b"back"[..]));
    assert_eq!(s.list_refs(b"").unwrap().len(), refs.len() + 1);
}

/// `refs.snap` is the only record of the refs whose commit segments compaction deleted:
/// a second copy is kept, so a rotted (or lost) snapshot is read from it, reported, and
/// rewritten. Both damaged is refused rather than opened without those refs.
#[test]
fn a_damaged_refs_snapshot_is_read_from_its_copy() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    for i in 0..500u32 {
        s.commit(&[set(&format!("r/{}", i % 37), &i.to_le_bytes())])
            .unwrap();
    }
    assert!(s.compact().unwrap() > 0);
    let refs = all_refs(&s);
    drop(s);
    let snap = dir.path().join("refs.snap");
    let copy = dir.path().join("refs-copy.snap");
    assert_eq!(fs::read(&snap).unwrap(), fs::read(&copy).unwrap());
    let flip = |p: &Path| {
        let mut b = fs::read(p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x10;
        fs::write(p, b).unwrap();
    };
    for damage in ["rot", "gone"] {
        if damage == "rot" {
            flip(&snap);
        } else {
            fs::remove_file(&snap).unwrap();
        }
        let s = LogStore::open(dir.path(), o.clone()).unwrap();
        assert_eq!(all_refs(&s), refs, "{damage}");
        let notes = &s.recovery().damage;
        assert!(
            notes.iter().any(|d| d.contains("refs-copy.snap")),
            "{notes:?}"
        );
        drop(s);
        assert_eq!(
            fs::read(&snap).unwrap(),
            fs::read(&copy).unwrap(),
            "{damage}"
        );
    }
    // The copy rotted: reported, and rewritten from the snapshot.
    flip(&copy);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    assert_eq!(all_refs(&s), refs);
    let notes = &s.recovery().damage;
    assert!(
        notes.iter().any(|d| d.contains("copy of refs.snap")),
        "{notes:?}"
    );
    drop(s);
    assert_eq!(fs::read(&snap).unwrap(), fs::read(&copy).unwrap());
    // Both: refused.
    flip(&snap);
    flip(&copy);
    let e = LogStore::open(dir.path(), o).err().expect("refused");
    assert!(e.to_string().contains("refs.snap"), "{e}");
}

#[test]
fn hints_are_optional() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Buffered);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let mut chunks = Vec::new();
    for i in 0..100u64 {
        let data = payload(i, 500);
        chunks.push((s.put(&data).unwrap(), data));
    }
    drop(s);
    let hints: Vec<PathBuf> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hint"))
        .collect();
    assert!(hints.len() >= 2);
    fs::remove_file(&hints[0]).unwrap();
    fs::write(&hints[1], b"garbage").unwrap();
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    for (cid, data) in &chunks {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    drop(s);
    // Rewritten by the open above.
    assert!(hints[0].exists());
}

#[test]
fn damaged_sealed_segment_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let mut chunks = Vec::new();
    for i in 0..40u64 {
        let data = payload(i, 600);
        chunks.push((s.put(&data).unwrap(), data));
    }
    let first = s.segment_paths()[0].clone();
    drop(s);
    fs::remove_file(first.with_extension("hint")).unwrap();
    let f = OpenOptions::new().write(true).open(&first).unwrap();
    f.write_all_at(&[0xff], 16 + 12).unwrap(); // length field of the first record
    // Bit rot in a sealed segment is reported, and costs only the damaged record.
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let r = s.recovery().clone();
    assert_eq!(r.damaged_records, 1, "{r:?}");
    assert_eq!(r.damaged_bytes, 50 + 600, "{r:?}");
    assert!(r.damage[0].contains("seg-000001.log"), "{r:?}");
    assert!(!s.has(&chunks[0].0).unwrap());
    for (cid, data) in &chunks[1..] {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    drop(s);
    // No hint is written for a damaged segment: the damage is reported at every open.
    let s = LogStore::open(dir.path(), o).unwrap();
    assert_eq!(s.recovery().damaged_records, 1);
}

/// Flips one payload byte of the first chunk record in `seg` (of `len` bytes).
fn rot_first_chunk(seg: &Path, len: u64) {
    let rec = segment_records(seg)
        .into_iter()
        .find(|r| r.1 == 1 && r.2 == len)
        .unwrap();
    let f = OpenOptions::new().read(true).write(true).open(seg).unwrap();
    let at = rec.0 + 50 + 7;
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at).unwrap();
    f.write_all_at(&[byte[0] ^ 0x01], at).unwrap();
}

/// A store in `dir` holding a 3000-byte chunk (committed), then eight more groups (with
/// small segments, into later segments); returns the chunk, its cid and the path of the
/// first segment, the store closed.
fn a_chunk_then_groups(
    dir: &std::path::Path,
    o: &LogStoreOptions,
) -> (Vec<u8>, cairn_store::Cid, std::path::PathBuf) {
    let s = LogStore::open(dir, o.clone()).unwrap();
    let x = payload(7, 3000);
    let cid = s.put(&x).unwrap();
    s.commit(&[set("x", &cid.to_bytes())]).unwrap();
    for i in 0..8u64 {
        let c = s.put(&payload(100 + i, 1500)).unwrap();
        s.commit(&[set(&format!("k{i}"), &c.to_bytes())]).unwrap();
    }
    let seg = s.segment_paths()[0].clone();
    (x, cid, seg)
}

/// A chunk whose stored record rotted is not trusted by a later put of the same bytes:
/// that put writes a sound copy, so the commit naming it is backed by readable data. The
/// damage is found by the scan at open (active segment) or by a read (a sealed segment
/// opened from its hint, which is not rescanned).
#[test]
fn a_rotted_chunk_is_repaired_by_putting_it_again() {
    for sealed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let o = if sealed {
            small(Durability::Group)
        } else {
            opts(Durability::Group)
        };
        let (x, cid, seg) = a_chunk_then_groups(dir.path(), &o);
        assert_eq!(seg.with_extension("hint").exists(), sealed);
        rot_first_chunk(&seg, 3000);

        let s = LogStore::open(dir.path(), o.clone()).unwrap();
        if !sealed {
            assert_eq!(s.recovery().damaged_records, 1, "{:?}", s.recovery());
            assert!(
                !s.has(&cid).unwrap(),
                "a damaged record does not count as held"
            );
        }
        assert!(matches!(s.get(&cid), Err(Error::Corrupt(_))));
        assert!(
            !s.has(&cid).unwrap(),
            "a read that found damage marks the chunk"
        );
        assert!(s.put_hashed(cid, &x).unwrap(), "the put wrote a fresh copy");
        assert_eq!(&s.get(&cid).unwrap().unwrap()[..], &x[..]);
        assert!(s.has(&cid).unwrap());
        s.commit(&[set("x again", &cid.to_bytes())]).unwrap();
        drop(s);

        let s = LogStore::open(dir.path(), o).unwrap();
        assert_eq!(&s.get(&cid).unwrap().unwrap()[..], &x[..]);
        assert!(s.has(&cid).unwrap());
        assert!(!s.put_hashed(cid, &x).unwrap(), "the sound copy is trusted");
    }
}

/// Damage a read found in a sealed segment outlives the process that found it: the mark
/// is noted in `DAMAGED.log`, so the next open marks the record again (a `cairn verify`
/// found the damage, and the `cairn put` run after it, in a new process, deduplicated
/// against the rotted record, since a segment opened from its hint is not rescanned).
#[test]
fn damage_a_read_found_is_known_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let (x, cid, seg) = a_chunk_then_groups(dir.path(), &o);
    assert!(seg.with_extension("hint").exists());
    rot_first_chunk(&seg, 3000);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    assert!(s.has(&cid).unwrap(), "opened from its hint: not yet known");
    assert!(matches!(s.get(&cid), Err(Error::Corrupt(_))));
    drop(s);
    let marks = dir.path().join(cairn_store::log::DAMAGE_MARKS);
    assert!(
        std::fs::read_to_string(&marks)
            .unwrap()
            .contains(&cid.to_string())
    );
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    assert!(!s.has(&cid).unwrap(), "the next open knows the damage");
    assert!(s.put_hashed(cid, &x).unwrap(), "a put writes a fresh copy");
    assert_eq!(&s.get(&cid).unwrap().unwrap()[..], &x[..]);
    s.commit(&[set("x again", &cid.to_bytes())]).unwrap();
    drop(s);
    // The mark named the damaged record's place: it lapses with the fresh copy.
    let s = LogStore::open(dir.path(), o).unwrap();
    assert!(s.has(&cid).unwrap(), "the fresh copy is trusted");
    assert!(
        !std::fs::read_to_string(&marks)
            .unwrap()
            .contains(&cid.to_string())
    );
}

/// A commit record that rots in the active segment before the segment is sealed must not
/// be carried into the sealed segment's hint under a fresh checksum (a hint is trusted
/// without a rescan): the next open finds the damage and never applies the rotted update.
#[test]
fn a_commit_that_rots_before_its_segment_is_sealed_is_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    s.commit(&[set("key", b"VALUE-ORIGINAL")]).unwrap();
    let seg = s.segment_paths()[0].clone();
    let commit = segment_records(&seg)
        .into_iter()
        .find(|r| r.1 == KIND_COMMIT)
        .unwrap();
    // Rot the last payload byte (in the value) while the store is open.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let at = commit.0 + 50 + commit.2 - 1;
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at).unwrap();
    f.write_all_at(&[byte[0] ^ 0x01], at).unwrap();
    // Chunks until the segment is sealed (hint written, or not).
    let mut i = 0;
    while s.segment_paths().len() < 2 {
        s.put(&payload(900 + i, 1000)).unwrap();
        i += 1;
    }
    drop(s);
    let s = LogStore::open(dir.path(), o).unwrap();
    let got = s.get_ref(b"key").unwrap();
    let mut rotted = b"VALUE-ORIGINAL".to_vec();
    let n = rotted.len();
    rotted[n - 1] ^= 0x01;
    assert_ne!(
        got.as_deref(),
        Some(&rotted[..]),
        "the rotted update was applied"
    );
    let r = s.recovery();
    assert!(r.damaged_records >= 1 && r.commits_dropped >= 1, "{r:?}");
}

/// Compaction leaves a segment in place when one of its live chunks has rotted. A
/// tombstone in another compacted segment that removes a chunk of the segment left in
/// place must then be carried over, or the removed chunk comes back at the next open.
#[test]
fn compaction_keeps_the_tombstones_a_damaged_segment_left_in_place_needs() {
    let dir = tempfile::tempdir().unwrap();
    let o = small(Durability::Group);
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let x = s.put(&payload(1, 3000)).unwrap();
    let d = s.put(&payload(2, 3000)).unwrap();
    let fill = s.put(&payload(3, 3000)).unwrap();
    s.commit(&[set("d", &d.to_bytes())]).unwrap();
    assert!(s.segment_paths().len() >= 2, "the first segment is sealed");
    let first = s.segment_paths()[0].clone();
    // Removing x and the filler writes their tombstones in a later segment.
    s.remove(&[x, fill]).unwrap();
    let mut i = 0;
    while s.segment_paths().len() < 4 {
        let c = s.put(&payload(1000 + i, 3000)).unwrap();
        s.remove(&[c]).unwrap();
        i += 1;
    }
    assert!(!s.has(&x).unwrap());
    drop(s);
    rot_first_chunk_with(&first, &d);

    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    s.compact().unwrap();
    assert!(
        first.exists(),
        "the segment with the rotted live chunk stays"
    );
    assert!(!s.has(&x).unwrap());
    drop(s);
    let s = LogStore::open(dir.path(), o).unwrap();
    assert!(
        !s.has(&x).unwrap(),
        "a removed chunk came back after compaction"
    );
    assert!(s.get(&x).unwrap().is_none());
}

/// Flips one payload byte of the chunk record of `cid` in `seg`.
fn rot_first_chunk_with(seg: &Path, cid: &Cid) {
    let b = fs::read(seg).unwrap();
    let want = cid.to_bytes();
    let rec = segment_records(seg)
        .into_iter()
        .find(|r| r.1 == 1 && b[r.0 as usize + 16..r.0 as usize + 50] == want[..])
        .unwrap();
    let f = OpenOptions::new().read(true).write(true).open(seg).unwrap();
    let at = rec.0 + 50 + 7;
    f.write_all_at(&[b[at as usize] ^ 0x01], at).unwrap();
}

/// A bit flip in a record header inside the acknowledged region (a group followed by a
/// later group) must cost that record only: never a truncation, never a commit.
#[test]
fn header_damage_in_durable_region_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let mut chunks = Vec::new();
    for i in 0..100u64 {
        let data = payload(i + 500, 4000);
        chunks.push((s.put(&data).unwrap(), data));
    }
    let all: Vec<u8> = chunks.iter().flat_map(|(c, _)| c.to_bytes()).collect();
    s.commit(&[set("blob", &all)]).unwrap();
    for i in 0..3 {
        s.commit(&[set(&format!("k{i}"), b"v")]).unwrap();
    }
    // A later group with a chunk: the damage below is in acknowledged groups.
    let later = s.put(b"a later group").unwrap();
    s.commit(&[set("later", &later.to_bytes())]).unwrap();
    let refs = all_refs(&s);
    let seg = s.segment_paths()[0].clone();
    drop(s);
    let recs: Vec<(u64, u8, u64)> = segment_records(&seg)
        .into_iter()
        .filter(|r| r.1 == 1)
        .collect();
    assert_eq!(recs.len(), 101);
    // (record, byte of its header): crc, hcrc, kind, reserved, len, cid.
    let mut cases = Vec::new();
    for k in [50usize, 0, 99] {
        for b in [0u64, 3, 4, 7, 8, 9, 12, 13, 15, 16, 17, 30, 49] {
            cases.push((k, b));
        }
    }
    for (k, b) in cases {
        let what = format!("record {k}, header byte {b}");
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        let p = copy.path().join("seg-000001.log");
        let len_before = file_len(&p);
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let at = recs[k].0 + b;
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, at).unwrap();
        f.write_all_at(&[byte[0] ^ 0x10], at).unwrap();
        let s = LogStore::open(copy.path(), opts(Durability::Group))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(all_refs(&s), refs, "{what}");
        assert_eq!(file_len(&p), len_before, "{what}: truncated");
        let r = s.recovery().clone();
        assert!(r.damaged_records >= 1, "{what}: {r:?}");
        assert!(!r.damage.is_empty(), "{what}: {r:?}");
        assert_eq!(r.segment_bytes_truncated, 0, "{what}: {r:?}");
        assert_eq!(r.commits_dropped, 0, "{what}: {r:?}");
        for (i, (cid, data)) in chunks.iter().enumerate() {
            if i == k {
                // Absent, reported corrupt, or (a damaged crc field only) still verified
                // against its cid: never wrong data.
                match s.get(cid) {
                    Ok(None) | Err(Error::Corrupt(_)) => {}
                    Ok(Some(got)) => assert!(got[..] == data[..], "{what}: wrong data"),
                    Err(e) => panic!("{what}: damaged chunk read as {e}"),
                }
            } else {
                let got = s
                    .get(cid)
                    .unwrap_or_else(|e| panic!("{what}: chunk {i}: {e}"));
                assert_eq!(got.as_deref(), Some(&data[..]), "{what}: chunk {i}");
            }
        }
        // Writes continue after the damage and survive another reopen.
        let c = s.put(b"after the damage").unwrap();
        s.commit(&[set("after", &c.to_bytes())]).unwrap();
        drop(s);
        let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
        assert!(s.get(&c).unwrap().is_some(), "{what}");
        assert_eq!(s.list_refs(b"").unwrap().len(), refs.len() + 1, "{what}");
    }
}

/// Damage to a commit record of an earlier group (one followed by a group that wrote a
/// chunk) is bit rot: the later commits stay. Damage to the last commit record is a torn
/// tail. (Commit records with no chunk between them cannot be told apart from one group:
/// see `torn_last_group_is_cut` for damage there.)
#[test]
fn commit_record_damage() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    for i in 0..5 {
        s.commit(&[set(&format!("k{i}"), b"value")]).unwrap();
    }
    let z = s.put(b"the last group").unwrap();
    s.commit(&[set("z", &z.to_bytes())]).unwrap();
    drop(s);
    let seg = dir.path().join("seg-000001.log");
    let commits: Vec<u64> = segment_records(&seg)
        .into_iter()
        .filter(|r| r.1 == KIND_COMMIT)
        .map(|r| r.0)
        .collect();
    assert_eq!(commits.len(), 6);
    let names = |s: &LogStore| -> Vec<String> {
        s.list_refs(b"")
            .unwrap()
            .into_iter()
            .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
            .collect()
    };
    // (commit record, byte): header bytes (crc, hcrc, kind, len, seq) and a payload byte.
    for (k, b) in [
        (1usize, 0u64),
        (1, 4),
        (1, 8),
        (1, 12),
        (1, 16),
        (0, 20),
        (2, 52),
    ] {
        let what = format!("commit {k}, byte {b}");
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        let p = copy.path().join("seg-000001.log");
        let len = file_len(&p);
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, commits[k] + b).unwrap();
        f.write_all_at(&[byte[0] ^ 0x08], commits[k] + b).unwrap();
        let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
        let mut want: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
        want.remove(k);
        want.push("z".into());
        assert_eq!(names(&s), want, "{what}");
        assert_eq!(file_len(&p), len, "{what}: truncated");
        let r = s.recovery().clone();
        assert!(!r.damage.is_empty(), "{what}: {r:?}");
        // A sound header with a bad checksum names the lost commit.
        assert_eq!(
            r.commits_dropped,
            u64::from(b == 0 || b >= 50),
            "{what}: {r:?}"
        );
        // The next commit gets a fresh sequence number and survives.
        s.commit(&[set("after", b"x")]).unwrap();
        drop(s);
        let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
        assert_eq!(s.list_refs(b"").unwrap().len(), 6, "{what}");
    }
    // The last commit record's header zeroed (its sector never reached the disk) or cut
    // off part way: an interrupted write, cut in silence (the chunk before it is kept).
    for hurt in ["zeroed", "truncated"] {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        let p = copy.path().join("seg-000001.log");
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        if hurt == "zeroed" {
            let n = file_len(&p) - commits[5];
            f.write_all_at(&vec![0u8; n as usize], commits[5]).unwrap();
        } else {
            f.set_len(commits[5] + 20).unwrap();
        }
        let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
        assert_eq!(names(&s), ["k0", "k1", "k2", "k3", "k4"], "{hurt}");
        assert_eq!(file_len(&p), commits[5], "{hurt}");
        assert!(s.has(&z).unwrap(), "{hurt}");
        assert!(s.recovery().damage.is_empty(), "{hurt}: {:?}", s.recovery());
        assert!(s.recovery_notes().unwrap().is_empty(), "{hurt}");
    }
    // A flipped byte in the last commit record's header: that header reached the disk
    // whole, so the commit it held may have been acknowledged. It is cut (nothing can
    // vouch for it) but reported as damage and kept as a recovery note, never silent.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    f.write_all_at(&[0xEE], commits[5] + 9).unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    assert_eq!(names(&s), ["k0", "k1", "k2", "k3", "k4"]);
    assert_eq!(file_len(&seg), commits[5]);
    assert!(s.has(&z).unwrap());
    let r = s.recovery().clone();
    assert!(r.segment_bytes_truncated > 0, "{r:?}");
    assert_eq!(r.damage.len(), 1, "{r:?}");
    assert!(
        r.damage[0].contains("not what an interrupted write leaves")
            && r.damage[0].contains("not applied"),
        "{r:?}"
    );
    assert_eq!(s.recovery_notes().unwrap(), r.damage);
}

type Refs = BTreeMap<Vec<u8>, Vec<u8>>;

/// One committed history with the file sizes after each commit, to cut files at random
/// points and check what recovery keeps.
struct History {
    dir: tempfile::TempDir,
    seg: PathBuf,
    /// (segment length, refs) after each commit
    states: Vec<(u64, Refs)>,
    chunks: HashMap<Cid, Vec<u8>>,
}

fn history(commits: u64) -> History {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let seg = s.segment_paths()[0].clone();
    let mut states = vec![(16, BTreeMap::new())];
    let mut chunks = HashMap::new();
    for i in 0..commits {
        // Every fifth chunk is larger than the write buffer's usual flush.
        let len = if i % 5 == 0 {
            40_000 + i as usize * 13
        } else {
            200 + (i as usize * 71) % 3000
        };
        let a = payload(i * 2, len);
        let b = payload(i * 2 + 1, 50);
        let (ca, cb) = (s.put(&a).unwrap(), s.put(&b).unwrap());
        chunks.insert(ca, a);
        chunks.insert(cb, b);
        let mut batch = vec![
            set(
                &format!("c/{i:04}"),
                &[ca.to_bytes(), cb.to_bytes()].concat(),
            ),
            set("head", &i.to_le_bytes()),
        ];
        if i > 0 {
            batch.push(del(&format!("c/{:04}", i - 1)));
        }
        s.commit(&batch).unwrap();
        states.push((0, all_refs(&s)));
    }
    // Each state ends with its commit record (the file itself runs on into zeros).
    let ends: Vec<u64> = segment_records(&seg)
        .into_iter()
        .take_while(|r| r.1 != 0)
        .filter(|r| r.1 == KIND_COMMIT)
        .map(|r| r.0 + 50 + r.2)
        .collect();
    assert_eq!(ends.len(), states.len() - 1);
    for (st, end) in states[1..].iter_mut().zip(ends) {
        st.0 = end;
    }
    // Chunks put after the last commit: never acknowledged.
    s.put(&payload(1 << 40, 5000)).unwrap();
    drop(s);
    History {
        dir,
        seg,
        states,
        chunks,
    }
}

/// Opens a damaged copy and checks it recovered exactly state `k`, with every chunk the
/// refs name readable.
fn check_recovers(h: &History, copy: &Path, k: usize, what: &str) {
    let s = LogStore::open(copy, opts(Durability::Group)).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        all_refs(&s),
        h.states[k].1,
        "{what}: expected state after {k} commits"
    );
    for (name, v) in all_refs(&s) {
        if name.starts_with(b"c/") {
            for c in v.chunks(34) {
                let cid = Cid::from_bytes(c).unwrap();
                let got = s
                    .get(&cid)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: lost chunk"));
                assert_eq!(&got[..], &h.chunks[&cid][..]);
            }
        }
    }
    // The store accepts writes after recovery and keeps them.
    let c = s.put(b"after recovery").unwrap();
    s.commit(&[set("z", &c.to_bytes())]).unwrap();
    drop(s);
    let s = LogStore::open(copy, opts(Durability::Group)).unwrap();
    assert!(s.get(&c).unwrap().is_some(), "{what}");
    assert!(s.get_ref(b"z").unwrap().is_some(), "{what}");
}

#[test]
fn torn_tails_recover_to_a_committed_prefix() {
    let h = history(40);
    let mut rng = StdRng::seed_from_u64(7);
    let seg_len = file_len(&h.seg);
    for round in 0..60 {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(h.dir.path(), copy.path());
        let seg = copy.path().join(h.seg.file_name().unwrap());
        let cut = match round % 3 {
            // Anywhere, or at a commit boundary (plus or minus a little).
            0 => rng.random_range(0..=seg_len),
            1 => {
                let k = rng.random_range(0..h.states.len());
                (h.states[k].0 as i64 + rng.random_range(-60i64..60)).clamp(0, seg_len as i64)
                    as u64
            }
            _ => seg_len,
        };
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(cut)
            .unwrap();
        if round % 2 == 1 {
            // Garbage after the cut, as a torn write can leave.
            let junk: Vec<u8> = (0..rng.random_range(1..200))
                .map(|_| rng.random())
                .collect();
            let f = OpenOptions::new().append(true).open(&seg).unwrap();
            f.write_all_at(&junk, file_len(&seg)).unwrap();
        }
        // Survivors: commits whose records lie before the cut.
        let k = h.states.iter().rposition(|(s, _)| *s <= cut).unwrap();
        check_recovers(&h, copy.path(), k, &format!("round {round}: cut {cut}"));
    }
}

/// Three groups that each put three chunks and commit, then a group that only commits (a
/// tag), for the tests of damage in the last group and in earlier ones.
struct Groups {
    dir: tempfile::TempDir,
    seg: PathBuf,
    /// Per chunk group: (record offset, cid, data) of each chunk.
    chunks: Vec<Vec<(u64, Cid, Vec<u8>)>>,
    /// Per group: offset of its commit record, and the refs after it.
    commits: Vec<(u64, Refs)>,
    len: u64,
}

fn groups() -> Groups {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let seg = s.segment_paths()[0].clone();
    let mut chunks = Vec::new();
    let mut commits = Vec::new();
    for g in 0..3u64 {
        let mut mine = Vec::new();
        for j in 0..3u64 {
            let data = payload(900 + g * 10 + j, 3000 + j as usize * 500);
            mine.push((0, s.put(&data).unwrap(), data));
        }
        let v: Vec<u8> = mine.iter().flat_map(|c| c.1.to_bytes()).collect();
        s.commit(&[set(&format!("g{g}"), &v), set("head", &[g as u8])])
            .unwrap();
        commits.push((0, all_refs(&s)));
        chunks.push(mine);
    }
    s.commit(&[set("tag", b"v1")]).unwrap();
    commits.push((0, all_refs(&s)));
    drop(s);
    let recs: Vec<(u64, u8, u64)> = segment_records(&seg)
        .into_iter()
        .take_while(|r| r.1 != 0)
        .collect();
    let offs: Vec<u64> = recs.iter().filter(|r| r.1 == 1).map(|r| r.0).collect();
    for (c, off) in chunks.iter_mut().flatten().zip(&offs) {
        c.0 = *off;
    }
    let coffs: Vec<u64> = recs
        .iter()
        .filter(|r| r.1 == KIND_COMMIT)
        .map(|r| r.0)
        .collect();
    assert_eq!((offs.len(), coffs.len()), (9, 4));
    for (c, off) in commits.iter_mut().zip(coffs) {
        c.0 = off;
    }
    let len = file_len(&seg);
    Groups {
        dir,
        seg,
        chunks,
        commits,
        len,
    }
}

/// Damage to apply to a copy of the segment.
enum Hurt {
    /// Flip bits of the byte at this offset.
    Flip(u64),
    /// Zero this many bytes from this offset (a page that never reached the disk).
    Zero(u64, u64),
    /// Cut the file at this offset (a write interrupted part way).
    Truncate(u64),
}

/// A copy of the store with `hurt` done to its segment.
fn hurt_copy(g: &Groups, hurt: &Hurt) -> (tempfile::TempDir, PathBuf) {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(g.dir.path(), copy.path());
    let p = copy.path().join(g.seg.file_name().unwrap());
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    match *hurt {
        Hurt::Flip(at) => {
            let mut b = [0u8];
            f.read_exact_at(&mut b, at).unwrap();
            f.write_all_at(&[b[0] ^ 0x44], at).unwrap();
        }
        Hurt::Zero(at, n) => f.write_all_at(&vec![0u8; n as usize], at).unwrap(),
        Hurt::Truncate(at) => f.set_len(at).unwrap(),
    }
    (copy, p)
}

/// Power loss during the last group's fdatasync can leave its commit records on disk but
/// not a page before them: that group was never acknowledged, so it is cut at its first
/// damaged byte and its commits are not applied. (Consecutive commit records cannot be
/// told apart from one group: the tag commit after group 2 belongs to it.)
#[test]
fn torn_last_group_is_cut() {
    let g = groups();
    let last = &g.chunks[2];
    let c2 = g.commits[2].0;
    // (what, damage, where the file must be cut)
    let cases = [
        (
            "payload of chunk 0",
            Hurt::Flip(last[0].0 + 50 + 1000),
            last[0].0,
        ),
        (
            "payload of chunk 2",
            Hurt::Flip(last[2].0 + 50 + 7),
            last[2].0,
        ),
        ("hcrc of chunk 1", Hurt::Flip(last[1].0 + 4), last[1].0),
        ("kind of chunk 1", Hurt::Flip(last[1].0 + 8), last[1].0),
        ("len of chunk 1", Hurt::Flip(last[1].0 + 12), last[1].0),
        ("cid of chunk 1", Hurt::Flip(last[1].0 + 30), last[1].0),
        ("zeroed page", Hurt::Zero(last[1].0 - 10, 2000), last[0].0),
        ("payload of its commit", Hurt::Flip(c2 + 60), c2),
        ("kind of its commit", Hurt::Flip(c2 + 8), c2),
    ];
    for (what, hurt, cut) in cases {
        let (copy, p) = hurt_copy(&g, &hurt);
        let s = LogStore::open(copy.path(), opts(Durability::Group))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // The refs after group 1: neither group 2's commit nor the tag is applied.
        assert_eq!(all_refs(&s), g.commits[1].1, "{what}");
        assert_eq!(file_len(&p), cut, "{what}");
        let r = s.recovery().clone();
        assert_eq!(r.segment_bytes_truncated, g.len - cut, "{what}: {r:?}");
        let stop = r.segment_stop.clone().unwrap_or_default();
        assert!(stop.contains("not durably written"), "{what}: {r:?}");
        assert!(stop.contains("4 not applied"), "{what}: {r:?}");
        assert_eq!(r.damage.len(), 1, "{what}: {r:?}");
        assert!(r.damage[0].contains("not durably written"), "{what}: {r:?}");
        assert_eq!(
            (r.damaged_records, r.damaged_bytes, r.commits_dropped),
            (0, 0, 0),
            "{what}: {r:?}"
        );
        // Earlier groups are intact; group 2's chunks are gone from the cut on.
        for (o, cid, data) in g.chunks[..2].iter().flatten() {
            let got = s.get(cid).unwrap_or_else(|e| panic!("{what}: {o}: {e}"));
            assert_eq!(got.as_deref(), Some(&data[..]), "{what}: chunk at {o}");
        }
        for (o, cid, data) in last {
            if *o < cut {
                assert_eq!(s.get(cid).unwrap().as_deref(), Some(&data[..]), "{what}");
            } else {
                assert!(!s.has(cid).unwrap(), "{what}: chunk at {o} kept");
            }
        }
        // Writes continue (the next commit reuses number 3), and the next open is clean.
        let c = s.put(b"after the cut").unwrap();
        s.commit(&[set("after", &c.to_bytes())]).unwrap();
        let want = all_refs(&s);
        drop(s);
        let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
        assert_eq!(*s.recovery(), Default::default(), "{what}");
        assert_eq!(all_refs(&s), want, "{what}");
        assert!(s.get(&c).unwrap().is_some(), "{what}");
    }
    // Damage to the payload of the last commit record itself: group 2's commit stays and
    // the last one is cut. That commit record was written whole, so it may have been
    // acknowledged (bit rot after its sync, or a power loss during it): the loss is
    // reported as damage and kept as a recovery note, never silent.
    let (copy, p) = hurt_copy(&g, &Hurt::Flip(g.commits[3].0 + 55));
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    assert_eq!(all_refs(&s), g.commits[2].1);
    assert_eq!(file_len(&p), g.commits[3].0);
    let r = s.recovery().clone();
    assert_eq!(r.damage.len(), 1, "{r:?}");
    assert!(
        r.damage[0].contains("commit record is damaged") && r.damage[0].contains("not applied"),
        "{r:?}"
    );
    assert!(r.segment_bytes_truncated > 0, "{r:?}");
    assert_eq!(s.recovery_notes().unwrap(), r.damage);
    // A write cut short inside that record (a crash mid-write: never acknowledged) is an
    // ordinary torn tail, not damage.
    let (copy, p) = hurt_copy(&g, &Hurt::Truncate(g.commits[3].0 + 40));
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    assert_eq!(all_refs(&s), g.commits[2].1);
    assert_eq!(file_len(&p), g.commits[3].0);
    let r = s.recovery().clone();
    assert!(r.damage.is_empty(), "{r:?}");
    assert!(r.segment_bytes_truncated > 0, "{r:?}");
    assert!(s.recovery_notes().unwrap().is_empty());
}

/// Bit rot in the durable region stays in the file, so every open finds it again: once an
/// operator clears its note it is not raised again, but new damage is.
#[test]
fn cleared_damage_stays_cleared_and_new_damage_is_raised() {
    let g = groups();
    let mid = &g.chunks[1];
    let (copy, p) = hurt_copy(&g, &Hurt::Flip(mid[0].0 + 50 + 1000));
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    let first = s.recovery_notes().unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    s.clear_recovery_notes().unwrap();
    assert!(s.recovery_notes().unwrap().is_empty());
    drop(s);
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    assert_eq!(s.recovery().damage, first, "still found at open");
    assert!(
        s.recovery_notes().unwrap().is_empty(),
        "but not raised again"
    );
    drop(s);
    // New damage elsewhere: raised (and the old stays cleared).
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let at = mid[2].0 + 50 + 7;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x44], at).unwrap();
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    let notes = s.recovery_notes().unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_ne!(notes, first);
}

/// Recovery notes torn inside a character by a crash during an append (or hit by bit rot)
/// are read lossily: the store opens, the notes are read and cleared, and the new note
/// goes on a line of its own (it would have been glued to the torn one).
#[test]
fn torn_or_garbled_recovery_notes_do_not_stop_the_store() {
    let g = groups();
    let mid = &g.chunks[1];
    let (copy, _p) = hurt_copy(&g, &Hurt::Flip(mid[0].0 + 50 + 1000));
    let notes = copy.path().join(cairn_store::log::RECOVERY_NOTES);
    fs::write(&notes, b"an earlier note cut inside \xE2\x82").unwrap();
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    let got = s.recovery_notes().unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("an earlier note cut inside"), "{got:?}");
    assert_eq!(got[1], s.recovery().damage[0]);
    s.clear_recovery_notes().unwrap();
    assert!(s.recovery_notes().unwrap().is_empty());
    drop(s);
    // The cleared file holds the torn bytes too: the damage stays cleared.
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    assert_eq!(s.recovery().damage.len(), 1);
    assert!(s.recovery_notes().unwrap().is_empty());
}

/// A segment that held damage when it was opened as the active one is sealed without a
/// hint: every later open rescans it, so a damaged commit never comes back as if intact,
/// and its damage is still found.
#[test]
fn a_segment_damaged_at_open_is_sealed_without_a_hint() {
    let g = groups();
    let (copy, p) = hurt_copy(&g, &Hurt::Flip(g.commits[1].0 + 60));
    let mut without_g1 = g.commits[3].1.clone();
    without_g1.remove(&b"g1"[..]);
    let small = LogStoreOptions {
        segment_size: g.len + 4096,
        ..opts(Durability::Group)
    };
    let s = LogStore::open(copy.path(), small.clone()).unwrap();
    assert_eq!(all_refs(&s), without_g1);
    let first = s.recovery().damage.clone();
    assert!(!first.is_empty());
    // Fill the segment until it is sealed and another one started.
    for i in 0..4u32 {
        let c = s.put(&i.to_le_bytes().repeat(1000)).unwrap();
        s.commit(&[set(&format!("after{i}"), &c.to_bytes())])
            .unwrap();
    }
    let segs = s.segment_paths();
    assert!(segs.len() >= 2, "{segs:?}");
    let mut want = all_refs(&s);
    drop(s);
    assert!(
        !p.with_extension("hint").exists(),
        "a hint for the damaged segment"
    );
    let s = LogStore::open(copy.path(), small).unwrap();
    assert_eq!(s.recovery().damage, first, "the damage is found again");
    want.remove(&b"g1"[..]);
    assert_eq!(all_refs(&s), want);
    assert!(!all_refs(&s).contains_key(&b"g1"[..]));
}

/// A cut is made once; the same text at a later open is a new loss (the offset and the
/// sequence number are reused after a cut), raised even after the first one was cleared.
#[test]
fn a_later_cut_with_the_same_text_is_raised_again() {
    let g = groups();
    let at = g.commits[3].0;
    let (copy, p) = hurt_copy(&g, &Hurt::Flip(at + 55));
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    let first = s.recovery_notes().unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    s.clear_recovery_notes().unwrap();
    // The next commit takes the cut one's place and number; then the same damage again.
    s.commit(&[set("again", b"x")]).unwrap();
    drop(s);
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at + 52).unwrap();
    f.write_all_at(&[b[0] ^ 0x44], at + 52).unwrap();
    let s = LogStore::open(copy.path(), opts(Durability::Group)).unwrap();
    assert_eq!(s.recovery().damage, first, "the same text");
    assert_eq!(s.recovery_notes().unwrap(), first, "raised again");
}

/// The same damage in an earlier group is bit rot in acknowledged data: reported, never
/// cut, and the later commits still apply.
#[test]
fn damage_in_an_earlier_group_is_bit_rot() {
    let g = groups();
    let mid = &g.chunks[1];
    let c1 = g.commits[1].0;
    let all = g.commits[3].1.clone();
    let mut without_g1 = all.clone();
    without_g1.remove(&b"g1"[..]);
    // (what, damage, damaged chunk, refs expected)
    let cases = [
        (
            "payload of chunk 0",
            Hurt::Flip(mid[0].0 + 50 + 1000),
            Some(0),
            &all,
        ),
        ("kind of chunk 1", Hurt::Flip(mid[1].0 + 8), Some(1), &all),
        ("cid of chunk 2", Hurt::Flip(mid[2].0 + 30), Some(2), &all),
        (
            "zeroed page",
            Hurt::Zero(mid[1].0 + 100, 2000),
            Some(1),
            &all,
        ),
        (
            "payload of its commit",
            Hurt::Flip(c1 + 60),
            None,
            &without_g1,
        ),
        ("kind of its commit", Hurt::Flip(c1 + 8), None, &without_g1),
    ];
    for (what, hurt, bad, want) in cases {
        let (copy, p) = hurt_copy(&g, &hurt);
        let s = LogStore::open(copy.path(), opts(Durability::Group))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&all_refs(&s), want, "{what}");
        assert_eq!(file_len(&p), g.len, "{what}: truncated");
        let r = s.recovery().clone();
        assert_eq!(r.segment_bytes_truncated, 0, "{what}: {r:?}");
        assert_eq!(r.segment_stop, None, "{what}: {r:?}");
        assert!(r.damaged_records >= 1, "{what}: {r:?}");
        assert!(!r.damage.is_empty(), "{what}: {r:?}");
        assert!(
            !r.damage.iter().any(|d| d.contains("not durably written")),
            "{what}: {r:?}"
        );
        for (k, (o, cid, data)) in g.chunks.iter().flatten().enumerate() {
            if bad.map(|b| b + 3) == Some(k) {
                match s.get(cid) {
                    Ok(None) | Err(Error::Corrupt(_)) => {}
                    Ok(Some(got)) => assert!(got[..] == data[..], "{what}: wrong data"),
                    Err(e) => panic!("{what}: damaged chunk read as {e}"),
                }
            } else {
                let got = s.get(cid).unwrap_or_else(|e| panic!("{what}: {o}: {e}"));
                assert_eq!(got.as_deref(), Some(&data[..]), "{what}: chunk at {o}");
            }
        }
    }
}

#[test]
fn tampered_payload_is_reported_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let a = s.put(&payload(1, 4000)).unwrap();
    let b = s.put(&payload(2, 4000)).unwrap();
    s.commit(&[set("a", &a.to_bytes())]).unwrap();
    // A later group: `a` is in an acknowledged group that is not the last one.
    let c = s.put(b"later").unwrap();
    s.commit(&[set("c", &c.to_bytes())]).unwrap();
    let seg = s.segment_paths()[0].clone();
    // Flip a payload byte of `a` (header 16 bytes, record header 50 bytes).
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, 16 + 50 + 100).unwrap();
    f.write_all_at(&[byte[0] ^ 1], 16 + 50 + 100).unwrap();
    match s.get(&a) {
        Err(Error::Corrupt(m)) => {
            assert!(m.contains(&a.to_string()), "{m}");
            assert!(m.contains("seg-000001.log"), "{m}");
        }
        other => panic!("expected corrupt, got {other:?}"),
    }
    assert!(s.get(&b).unwrap().is_some());
    drop(s);
    // After reopen the damaged record is acknowledged data, kept and still reported.
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    assert_eq!(s.recovery().damaged_records, 1);
    assert!(matches!(s.get(&a), Err(Error::Corrupt(m)) if m.contains(&a.to_string())));
    assert!(s.get(&b).unwrap().is_some());
    // Header damage too.
    f.write_all_at(&[0xAA], 16 + 20).unwrap();
    assert!(matches!(s.get(&a), Err(Error::Corrupt(m)) if m.contains(&a.to_string())));
}

#[test]
fn second_open_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    match LogStore::open(dir.path(), opts(Durability::Group)) {
        Err(Error::Unavailable(m)) => assert!(m.contains("in use by another process"), "{m}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("second open succeeded"),
    }
    drop(s);
    LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
}

#[test]
fn group_commit_from_32_threads() {
    for d in [Durability::Group, Durability::PerWrite] {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(LogStore::open(dir.path(), opts(d)).unwrap());
        let per_thread = if d == Durability::Group { 100 } else { 20 };
        let start = Instant::now();
        std::thread::scope(|sc| {
            for t in 0..32u64 {
                let s = s.clone();
                sc.spawn(move || {
                    for i in 0..per_thread {
                        let c = s.put(&payload(t << 32 | i, 256)).unwrap();
                        s.commit(&[set(&format!("t{t}/{i}"), &c.to_bytes())])
                            .unwrap();
                        assert!(s.get_ref(format!("t{t}/{i}").as_bytes()).unwrap().is_some());
                    }
                });
            }
        });
        eprintln!(
            "{d}: {} commits from 32 threads in {:?}",
            32 * per_thread,
            start.elapsed()
        );
        drop(s);
        let s = LogStore::open(dir.path(), opts(d)).unwrap();
        assert_eq!(s.list_refs(b"t").unwrap().len() as u64, 32 * per_thread);
        for t in 0..32u64 {
            for i in 0..per_thread {
                let v = s.get_ref(format!("t{t}/{i}").as_bytes()).unwrap().unwrap();
                let c = Cid::from_bytes(&v).unwrap();
                assert_eq!(
                    &s.get(&c).unwrap().unwrap()[..],
                    &payload(t << 32 | i, 256)[..]
                );
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8),
    Remove(Vec<u8>),
    Commit(Vec<(u8, Option<u8>)>),
    Reopen,
    Compact,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => any::<u8>().prop_map(|i| Op::Put(i % 48)),
        2 => prop::collection::vec(any::<u8>().prop_map(|i| i % 48), 1..6).prop_map(Op::Remove),
        3 => prop::collection::vec((any::<u8>().prop_map(|k| k % 12), any::<Option<u8>>()), 0..4)
            .prop_map(Op::Commit),
        1 => Just(Op::Reopen),
        1 => Just(Op::Compact),
        1 => Just(Op::Sync),
    ]
}

fn pool(i: u8) -> Vec<u8> {
    payload(i as u64 + 77, (i as usize * 97) % 1500)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn matches_a_model(ops in prop::collection::vec(op(), 1..60), d in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let o = LogStoreOptions { segment_size: 4 << 10, ..small(Durability::ALL[d]) };
        let mut s = LogStore::open(dir.path(), o.clone()).unwrap();
        let mut chunks: HashMap<Cid, Vec<u8>> = HashMap::new();
        let mut refs: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let cid = |i: u8| HashAlgo::Blake3.digest(&pool(i));
        for op in ops {
            match op {
                Op::Put(i) => {
                    let data = pool(i);
                    let new = s.put_hashed(cid(i), &data).unwrap();
                    prop_assert_eq!(new, chunks.insert(cid(i), data).is_none());
                }
                Op::Remove(is) => {
                    let cids: Vec<Cid> = is.iter().map(|&i| cid(i)).collect();
                    s.remove(&cids).unwrap();
                    for c in cids {
                        chunks.remove(&c);
                    }
                }
                Op::Commit(ups) => {
                    let batch: Vec<RefUpdate> = ups.iter().map(|(k, v)| match v {
                        Some(v) => set(&format!("ref{k}"), &[*v; 3]),
                        None => del(&format!("ref{k}")),
                    }).collect();
                    s.commit(&batch).unwrap();
                    for (k, v) in ups {
                        let name = format!("ref{k}").into_bytes();
                        match v {
                            Some(v) => { refs.insert(name, vec![v; 3]); }
                            None => { refs.remove(&name); }
                        }
                    }
                }
                Op::Reopen => {
                    drop(s);
                    s = LogStore::open(dir.path(), o.clone()).unwrap();
                    prop_assert_eq!(s.recovery().clone(), Default::default());
                }
                Op::Compact => { s.compact().unwrap(); }
                Op::Sync => s.sync().unwrap(),
            }
            prop_assert_eq!(s.stats().unwrap().chunks, chunks.len() as u64);
        }
        let got: HashSet<Cid> = s.cids().unwrap().into_iter().collect();
        prop_assert_eq!(got, chunks.keys().copied().collect::<HashSet<_>>());
        for (c, data) in &chunks {
            prop_assert_eq!(&s.get(c).unwrap().unwrap()[..], &data[..]);
        }
        prop_assert_eq!(all_refs(&s), refs.clone());
        let live: u64 = chunks.values().map(|d| d.len() as u64).sum();
        prop_assert_eq!(s.stats().unwrap().chunk_bytes, live);
        drop(s);
        let s = LogStore::open(dir.path(), o).unwrap();
        let got: HashSet<Cid> = s.cids().unwrap().into_iter().collect();
        prop_assert_eq!(got, chunks.keys().copied().collect::<HashSet<_>>());
        prop_assert_eq!(all_refs(&s), refs);
    }
}

/// Throughput sanity check; run with
/// `cargo test --release -p cairn-store --test log_store -- --ignored --nocapture throughput`.
/// `CAIRN_TP=ingest` or `CAIRN_TP=commit` runs one part only.
#[test]
#[ignore]
fn throughput() {
    let part = std::env::var("CAIRN_TP").unwrap_or_default();
    if part.is_empty() || part == "ingest" {
        ingest_throughput();
    }
    if part.is_empty() || part == "commit" {
        commit_throughput();
    }
}

fn ingest_throughput() {
    // 4 KiB chunks, cids computed up front (put_hashed), 1 MiB write buffer.
    let n = 256_000u64;
    let mut rng = StdRng::seed_from_u64(1);
    let data: Vec<(Cid, Vec<u8>)> = (0..n)
        .map(|_| {
            let mut c = vec![0u8; 4096];
            rng.fill(&mut c[..]);
            (HashAlgo::Blake3.digest(&c), c)
        })
        .collect();
    for (label, segment_size) in [("one segment", 4u64 << 30), ("256 MiB segments", 256 << 20)] {
        let dir = tempfile::tempdir().unwrap();
        let o = LogStoreOptions {
            segment_size,
            ..opts(Durability::Group)
        };
        let s = LogStore::open(dir.path(), o).unwrap();
        let t = Instant::now();
        for (cid, c) in &data {
            s.put_hashed(*cid, c).unwrap();
        }
        let put = t.elapsed().as_secs_f64();
        s.sync().unwrap();
        let all = t.elapsed().as_secs_f64();
        let gb = (n * 4096) as f64 / 1e9;
        eprintln!(
            "ingest ({label}): {n} x 4 KiB put_hashed: {:.0} puts/s = {:.2} GB/s; \
             including the final fdatasync: {:.2} GB/s",
            n as f64 / put,
            gb / put,
            gb / all
        );
        drop(s);
        drop(dir);
        // Let writeback of the deleted data settle before the next measurement.
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

fn commit_throughput() {
    for threads in [1u64, 32, 64] {
        for d in [
            Durability::Group,
            Durability::PerWrite,
            Durability::Buffered,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let s = Arc::new(LogStore::open(dir.path(), opts(d)).unwrap());
            let total = match d {
                Durability::PerWrite => 1000,
                Durability::Group if threads == 1 => 1000,
                _ => 64_000,
            };
            let per = total / threads;
            let t = Instant::now();
            std::thread::scope(|sc| {
                for th in 0..threads {
                    let s = s.clone();
                    sc.spawn(move || {
                        for i in 0..per {
                            s.commit(&[set(&format!("b/{th}"), &i.to_le_bytes())])
                                .unwrap();
                        }
                    });
                }
            });
            let secs = t.elapsed().as_secs_f64();
            let c = s.commit_counters();
            eprintln!(
                "commits: {d:>8}, {threads:2} threads: {:>7.0} commits/s  \
                 ({:.1} per group, {} syncs, {:.0} us per sync)",
                (threads * per) as f64 / secs,
                c.commits as f64 / c.groups as f64,
                c.syncs,
                c.sync_micros as f64 / c.syncs.max(1) as f64
            );
        }
    }
    // Commits that each follow a chunk put (segment and refs log synced per group).
    for threads in [32u64, 64] {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(LogStore::open(dir.path(), opts(Durability::Group)).unwrap());
        let per = 64_000 / threads;
        let t = Instant::now();
        std::thread::scope(|sc| {
            for th in 0..threads {
                let s = s.clone();
                sc.spawn(move || {
                    for i in 0..per {
                        let c = s.put(&payload(th << 32 | i, 1024)).unwrap();
                        s.commit(&[set(&format!("b/{th}"), &c.to_bytes())]).unwrap();
                    }
                });
            }
        });
        let secs = t.elapsed().as_secs_f64();
        let c = s.commit_counters();
        eprintln!(
            "put 1 KiB + commit, group, {threads} threads: {:.0} commits/s  \
             ({:.1} per group, {} syncs, {:.0} us per sync)",
            (threads * per) as f64 / secs,
            c.commits as f64 / c.groups as f64,
            c.syncs,
            c.sync_micros as f64 / c.syncs.max(1) as f64
        );
    }
    let _ = Bytes::new();
}

/// `get_many` returns exactly what single gets return, in order, for chunks side by side
/// (one read), chunks still in the write buffer, absent cids, duplicates and chunks in
/// other segments; a flipped byte inside a run fails the call naming that chunk.
#[test]
fn get_many_matches_single_gets_and_verifies_each_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), small(Durability::Group)).unwrap();
    let mut cids = Vec::new();
    for i in 0..40u64 {
        cids.push(s.put(&payload(i, 300 + (i as usize * 37) % 900)).unwrap());
        if i % 7 == 6 {
            s.commit(&[set(&format!("r{i}"), &cids[i as usize].to_bytes())])
                .unwrap();
        }
    }
    // The last few are only in the write buffer; one cid is absent; some repeat.
    let absent = HashAlgo::default().digest(b"never stored");
    let mut ask = cids.clone();
    ask.insert(5, absent);
    ask.push(cids[3]);
    ask.push(cids[3]);
    ask.extend(cids.iter().rev().take(10).copied());
    let many = s.get_many(&ask).unwrap();
    assert_eq!(many.len(), ask.len());
    for (c, got) in ask.iter().zip(&many) {
        assert_eq!(got, &s.get(c).unwrap(), "{c}");
    }
    assert!(many[5].is_none());
    assert_eq!(many.iter().filter(|m| m.is_none()).count(), 1);
    drop(many);
    // Flip a payload byte of the 2nd chunk of the first segment (its records are
    // neighbours, so the run read covers it).
    s.commit(&[set("end", b"x")]).unwrap();
    let seg = s.segment_paths()[0].clone();
    let records = segment_records(&seg);
    let (off, _, _) = records[1];
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let at = off + 50 + 10;
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at).unwrap();
    f.write_all_at(&[byte[0] ^ 1], at).unwrap();
    let damaged = cids[1];
    match s.get_many(&cids[..4]) {
        Err(Error::Corrupt(m)) => assert!(m.contains(&damaged.to_string()), "{m}"),
        other => panic!("expected corrupt, got {other:?}"),
    }
    // The others still read, alone or in a run that does not include the damaged one.
    assert!(s.get_many(&cids[2..6]).unwrap().iter().all(|c| c.is_some()));
    assert!(s.get(&cids[0]).unwrap().is_some());
}

/// Chunks larger than the write buffer and small ones interleave in order across segment
/// rolls; all read back, also after reopening, with and without sync.
#[test]
fn large_and_small_chunks_interleave_across_rolls() {
    for durability in [Durability::Group, Durability::Buffered] {
        let dir = tempfile::tempdir().unwrap();
        let o = LogStoreOptions {
            durability,
            segment_size: 300 << 10,
            write_buffer: 16 << 10,
            ..Default::default()
        };
        let s = LogStore::open(dir.path(), o.clone()).unwrap();
        let mut all = Vec::new();
        for i in 0..60u64 {
            let len = match i % 4 {
                0 => 64 << 10,
                1 => 100,
                2 => 32 << 10,
                _ => (32 << 10) - 1,
            };
            let data = payload(1000 + i, len + i as usize);
            let cid = s.put(&data).unwrap();
            all.push((cid, data));
            if i % 7 == 6 {
                s.commit(&[set(&format!("k{i}"), &cid.to_bytes())]).unwrap();
            }
        }
        s.commit(&[set("done", b"1")]).unwrap();
        assert!(
            s.segment_paths().len() > 3,
            "the chunks span several segments"
        );
        for (cid, data) in &all {
            assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
        }
        let cids: Vec<Cid> = all.iter().map(|(c, _)| *c).collect();
        for (got, (_, data)) in s.get_many(&cids).unwrap().into_iter().zip(&all) {
            assert_eq!(&got.unwrap()[..], &data[..]);
        }
        drop(s);
        let s = LogStore::open(dir.path(), o).unwrap();
        for (cid, data) in &all {
            assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
        }
        assert_eq!(s.get_ref(b"done").unwrap().as_deref(), Some(&b"1"[..]));
    }
}

/// Compaction's copies are the only copies once the originals are deleted: they must be
/// in the durable region (under refs.snap's floor), where damage loses only the damaged
/// record, not in a last group that recovery may cut as torn. One rotted copy used to
/// cut every later copy at the next open, and the refs still named them.
#[test]
fn a_rotted_compaction_copy_loses_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogStoreOptions {
        segment_size: 64 << 10,
        ..small(Durability::Group)
    };
    let s = LogStore::open(dir.path(), o.clone()).unwrap();
    let (_, live) = put_then_remove_most(&s, 300, 10);
    assert!(s.compact().unwrap() > 0);
    let active = s.segment_paths().last().unwrap().clone();
    drop(s);
    rot_first_chunk(&active, 1000);
    let s = LogStore::open(dir.path(), o).unwrap();
    let lost = live
        .iter()
        .filter(|(c, d)| !matches!(s.get(c), Ok(Some(b)) if b[..] == d[..]))
        .count();
    assert_eq!(lost, 1, "only the rotted copy is lost");
    assert_eq!(s.get_ref(b"root").unwrap().as_deref(), Some(&b"r"[..]));
}

/// Bit rot in the active segment's header (magic, id or hash code) no longer keeps the
/// store from opening: the first record, bound to this segment and place, shows the file
/// is the segment, so the header is rewritten (and reported) and every write is there. A
/// file whose first record does not read as this segment's is still refused.
#[test]
fn a_damaged_active_segment_header_is_rewritten() {
    for at in [0u64, 9, 13] {
        let dir = tempfile::tempdir().unwrap();
        let (c, want) = {
            let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
            let c = s.put(&[7u8; 3000]).unwrap();
            s.commit(&[set("a", &c.to_bytes())]).unwrap();
            (c, all_refs(&s))
        };
        let seg = dir.path().join("seg-000001.log");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x21], at).unwrap();
        drop(f);
        let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
        let r = s.recovery().clone();
        assert!(
            r.damage.iter().any(|d| d.contains("header was damaged")),
            "byte {at}: {r:?}"
        );
        assert_eq!(all_refs(&s), want, "byte {at}");
        assert_eq!(s.get(&c).unwrap().unwrap(), vec![7u8; 3000]);
        // Writes go on, and the next open finds nothing to mend.
        let c2 = s.put(b"after").unwrap();
        s.commit(&[set("b", &c2.to_bytes())]).unwrap();
        drop(s);
        let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
        assert!(
            s.recovery().damage.is_empty(),
            "byte {at}: {:?}",
            s.recovery()
        );
        assert!(s.get(&c2).unwrap().is_some());
        drop(s);
        // Not a segment of this store at all: the same damage and a first record that
        // does not read here (another file's bytes) is refused, as before.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg)
            .unwrap();
        f.write_all_at(b"X", 0).unwrap();
        f.write_all_at(&[0xAB; 8], SEG_HEADER_LEN_FOR_TEST).unwrap();
        drop(f);
        assert!(LogStore::open(dir.path(), opts(Durability::Group)).is_err());
    }
}

/// The segment header's length (magic 8, id 4, format 1, hash code 1, reserved 2).
const SEG_HEADER_LEN_FOR_TEST: u64 = 16;

/// The note of a cut group names the first refs its commits changed and counts the rest: a
/// group of thousands made one line of megabytes, printed by every command.
#[test]
fn a_cut_groups_note_names_a_few_refs_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let seg = {
        let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
        s.commit(&[set("first", b"1")]).unwrap();
        // The last group: a chunk and the commit of 40 refs.
        let c = s.put(&payload(77, 3000)).unwrap();
        let many: Vec<RefUpdate> = (0..40)
            .map(|i| set(&format!("k{i:02}"), &c.to_bytes()))
            .collect();
        s.commit(&many).unwrap();
        s.segment_paths()[0].clone()
    };
    // The chunk of the last group is damaged: the group is cut.
    let chunk = segment_records(&seg)
        .into_iter()
        .filter(|r| r.1 == 1)
        .map(|r| r.0)
        .next_back()
        .unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let at = chunk + 60 + 1000;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    drop(f);
    let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
    let note = s
        .recovery()
        .damage
        .iter()
        .find(|d| d.contains("refs they changed"))
        .cloned()
        .unwrap_or_else(|| panic!("{:?}", s.recovery()));
    assert!(
        note.contains("k00, k01") && note.ends_with(", and 8 more)"),
        "{note}"
    );
    assert!(!note.contains("k32"), "{note}");
}

/// A segment whose header is whole but names another hash algorithm is another store's
/// segment, not bit rot: the store refuses to open rather than take it as its own.
#[test]
fn a_segment_of_another_hash_algorithm_is_refused_not_mended() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = LogStore::open(dir.path(), opts(Durability::Group)).unwrap();
        let c = s.put(&[7u8; 3000]).unwrap();
        s.commit(&[set("a", &c.to_bytes())]).unwrap();
    }
    let seg = dir.path().join("seg-000001.log");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    // The SHA-256 code where the store's BLAKE3 code stood.
    f.write_all_at(&[0x12], 13).unwrap();
    drop(f);
    let e = LogStore::open(dir.path(), opts(Durability::Group))
        .err()
        .unwrap();
    assert!(e.to_string().contains("hash code"), "{e}");
    let mut b = [0u8];
    let f = OpenOptions::new().read(true).open(&seg).unwrap();
    f.read_exact_at(&mut b, 13).unwrap();
    assert_eq!(b[0], 0x12, "the header was left as found");
}
