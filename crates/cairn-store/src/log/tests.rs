//! Unit tests of the log backend's internals (the behaviour is tested in `tests/`).

use super::*;

/// A ref update setting `name` to `value`.
fn set(name: &str, value: &[u8]) -> RefUpdate {
    RefUpdate::Set {
        name: name.as_bytes().to_vec(),
        value: value.to_vec(),
    }
}

/// Overwrites `bytes` at `at` in the file at `path` (damage, or a write that never landed).
fn overwrite(path: &std::path::Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

#[test]
fn garbage_ratio() {
    assert!(garbage_heavy(0, 0));
    assert!(garbage_heavy(100, 50));
    assert!(!garbage_heavy(100, 51));
    assert!(!garbage_heavy(100, 100));
}

/// A chunk's length comes from the index, without reading it, before and after a reopen;
/// absent and removed chunks have none. The memory store answers alike.
#[test]
fn chunk_len_from_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = vec![5u8; 70_000];
    let cid = {
        let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        let cid = s.put(&chunk).unwrap();
        assert_eq!(s.chunk_len(&cid).unwrap(), Some(70_000));
        s.commit(&[set("k", b"v")]).unwrap();
        cid
    };
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert_eq!(s.chunk_len(&cid).unwrap(), Some(70_000));
    let other = HashAlgo::Blake3.digest(b"never stored");
    assert_eq!(s.chunk_len(&other).unwrap(), None);
    s.remove(&[cid]).unwrap();
    assert_eq!(s.chunk_len(&cid).unwrap(), None);
    let m = crate::MemoryStore::new();
    let cid = m.put(&chunk).unwrap();
    assert_eq!(m.chunk_len(&cid).unwrap(), Some(70_000));
    assert_eq!(m.chunk_len(&other).unwrap(), None);
}

/// A failed read marks only the record that failed: a put that wrote a fresh copy in the
/// meantime keeps it sound (and nothing is noted in `DAMAGED.log` for it); an I/O error is
/// marked for this run only, a record failing its checks durably.
#[test]
fn a_damage_mark_names_the_record_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let x = vec![3u8; 5000];
    let cid = s.put(&x).unwrap();
    let old = s.index.get(&cid).unwrap();
    // Found damaged; a put then writes a fresh copy.
    s.mark_damaged(&cid, old, false);
    assert!(!s.has(&cid).unwrap());
    assert!(s.put_hashed(cid, &x).unwrap());
    assert_ne!(s.index.get(&cid), Some(old));
    // A read of the old place failing late marks nothing.
    s.mark_damaged(&cid, old, true);
    assert!(s.has(&cid).unwrap());
    let marks = dir.path().join(DAMAGE_MARKS);
    assert!(!marks.exists());
    // The new place failing its checks is marked and noted.
    let new = s.index.get(&cid).unwrap();
    s.mark_damaged(&cid, new, true);
    assert!(!s.has(&cid).unwrap());
    assert!(
        std::fs::read_to_string(&marks)
            .unwrap()
            .contains(&cid.to_string())
    );
}

#[test]
fn group_commit_shares_syncs_and_orders_batches() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    std::thread::scope(|sc| {
        for t in 0..8u8 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..50u8 {
                    s.commit(&[RefUpdate::Set {
                        name: vec![b'k'],
                        value: vec![t, i],
                    }])
                    .unwrap();
                }
            });
        }
    });
    let last = s.get_ref(b"k").unwrap().unwrap();
    assert_eq!(s.refs.read().seq, 400);
    let c = s.commit_counters();
    assert_eq!(c.commits, 400);
    assert!(c.syncs <= c.groups, "one sync per group at most: {c:?}");
    drop(s);
    // The last applied batch in memory is the last one in the log.
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert_eq!(s.get_ref(b"k").unwrap().unwrap(), last);
}

#[test]
fn buffered_reads_see_unflushed_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let c = s.put(b"pending").unwrap();
    assert_eq!(
        s.writer.lock().seg.flushed.load(Ordering::Acquire),
        SEG_HEADER_LEN
    );
    assert_eq!(&s.get(&c).unwrap().unwrap()[..], b"pending");
}

#[test]
fn failed_store_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert_eq!(s.write_failure(), None);
    let _ = s.fail(Error::invalid("simulated fsync failure"));
    assert!(matches!(s.put(b"x"), Err(Error::Unavailable(_))));
    assert!(matches!(s.commit(&[]), Err(Error::Unavailable(_))));
    let why = s.write_failure().expect("the failure is reported");
    assert!(why.contains("simulated fsync failure"), "{why}");
}

/// A resync over a damaged chunk header can lock onto a commit record embedded in that
/// chunk's payload if it was forged for exactly that place (records are bound to their
/// place; see the next test for copies): one that does not follow the highest sequence
/// number seen is reported and ignored, and does not raise the next sequence number.
#[test]
fn stray_commit_after_a_resync_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for i in 0..3 {
        s.commit(&[set(&format!("k{i}"), b"v")]).unwrap();
    }
    // A chunk whose payload holds a valid commit record numbered 50, sealed for where it
    // will lie: 100 bytes into the payload of the next record.
    let ops = refs::encode_ops(&[set("stray", b"x")]).0;
    let mut data: Vec<u8> = (0..100u32).map(|i| (i * 7 + 1) as u8).collect();
    let place = {
        let w = s.writer.lock();
        w.seg.place().at(w.end() + FRAME_HEADER_LEN as u64 + 100)
    };
    data.extend_from_slice(&format::commit_header(50, &ops).seal(place, &ops));
    data.extend_from_slice(&ops);
    data.extend((0..100u32).map(|i| (i * 13 + 5) as u8));
    let p = s.put(&data).unwrap();
    s.commit(&[set("p", &p.to_bytes())]).unwrap();
    // A later group, so the damage below is in an acknowledged one.
    let q = s.put(b"later").unwrap();
    s.commit(&[set("q", &q.to_bytes())]).unwrap();
    let at = s.index.get(&p).unwrap().off;
    let mut want: Vec<Vec<u8>> = s
        .list_refs(b"")
        .unwrap()
        .into_iter()
        .map(|r| r.0.to_vec())
        .collect();
    want.sort();
    let seg = s.segment_paths()[0].clone();
    drop(s);
    let len = fs::metadata(&seg).unwrap().len();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at + 8).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at + 8).unwrap();

    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let r = s.recovery().clone();
    assert!(
        r.damage.iter().any(|d| d.contains("commit record 50")
            && d.contains("out of sequence")
            && d.contains("ignored")),
        "{r:?}"
    );
    assert_eq!(r.segment_bytes_truncated, 0, "{r:?}");
    assert_eq!(r.commits_dropped, 0, "{r:?}");
    assert_eq!(fs::metadata(&seg).unwrap().len(), len);
    assert!(
        s.get_ref(b"stray").unwrap().is_none(),
        "stray commit applied"
    );
    let mut got: Vec<Vec<u8>> = s
        .list_refs(b"")
        .unwrap()
        .into_iter()
        .map(|r| r.0.to_vec())
        .collect();
    got.sort();
    assert_eq!(got, want);
    assert!(s.get(&p).unwrap().is_none());
    assert!(s.get(&q).unwrap().is_some());
    assert_eq!(s.refs.read().seq, 5);
    assert_eq!(
        s.writer.lock().next_seq,
        6,
        "the stray raised the sequence number"
    );
    // Later commits apply, at every open.
    s.commit(&[set("after", b"y")]).unwrap();
    drop(s);
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert!(s.get_ref(b"after").unwrap().is_some());
    assert!(s.get_ref(b"stray").unwrap().is_none());
    assert_eq!(s.refs.read().seq, 6);
}

/// Records copied into a chunk's payload (a backup of a store kept in a store, or any
/// bytes that happen to form records) are records only where they were first written: a
/// resync over the chunk's damaged header skips them. Before records were bound to their
/// place, an embedded tombstone removed a live chunk and an embedded commit took the place
/// of the acknowledged commit of the same number.
#[test]
fn records_copied_into_a_payload_are_not_replayed_after_a_resync() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let v = s.put(b"a chunk that stays").unwrap();
    s.commit(&[set("v", &v.to_bytes())]).unwrap();
    // Records as another place of some store holds them: a tombstone of `v`, then the
    // commit that would come next here (2), setting `forged`.
    let elsewhere = format::SegPlace { id: 1, bound: true };
    let ops = refs::encode_ops(&[set("forged", b"x")]).0;
    let mut data: Vec<u8> = (0..100u32).map(|i| (i * 7 + 1) as u8).collect();
    data.extend_from_slice(
        &format::frame_header(KIND_TOMBSTONE, &v, &[]).seal(elsewhere.at(16), &[]),
    );
    data.extend_from_slice(
        &format::commit_header(2, &ops).seal(elsewhere.at(16 + FRAME_HEADER_LEN as u64), &ops),
    );
    data.extend_from_slice(&ops);
    data.extend((0..100u32).map(|i| (i * 13 + 5) as u8));
    let a = s.put(&data).unwrap();
    s.commit(&[set("a", &a.to_bytes())]).unwrap();
    let q = s.put(b"later").unwrap();
    s.commit(&[set("q", &q.to_bytes())]).unwrap();
    let at = s.index.get(&a).unwrap().off;
    let seg = s.segment_paths()[0].clone();
    drop(s);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at + 8).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at + 8).unwrap();
    drop(f);

    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let r = s.recovery().clone();
    assert_eq!(r.damaged_records, 1, "{r:?}");
    assert!(s.get_ref(b"forged").unwrap().is_none(), "{r:?}");
    assert_eq!(
        s.get(&v).unwrap().as_deref(),
        Some(&b"a chunk that stays"[..])
    );
    assert_eq!(s.get_ref(b"a").unwrap().as_deref(), Some(&a.to_bytes()[..]));
    assert!(s.get(&a).unwrap().is_none(), "the damaged chunk is gone");
    assert!(s.get(&q).unwrap().is_some());
    assert_eq!(s.refs.read().seq, 3);
}

#[test]
fn a_record_cut_short_at_a_sector_boundary_is_told_from_one_damaged_in_place() {
    use segment::cut_short;
    // A record at 4000..4300 (its payload from 4050): the sector boundary 4096 lies
    // inside its payload.
    let mut rec = vec![7u8; 300];
    assert!(!cut_short(4000, &rec), "intact bytes");
    rec[290] = 0;
    assert!(!cut_short(4000, &rec), "a zero byte is not a cut");
    // Zeros from the boundary on: the write stopped there (or that sector never landed).
    rec[96..].fill(0);
    assert!(cut_short(4000, &rec));
    // Zeros from before the boundary on: still a cut at the boundary.
    rec[60..].fill(0);
    assert!(cut_short(4000, &rec));
    // A flipped byte after the boundary: damage in place, not a cut.
    rec[200] = 0xff;
    assert!(!cut_short(4000, &rec));
    // No sector boundary inside the record: it cannot have been cut short.
    let mut small = vec![7u8; 100];
    small[60..].fill(0);
    assert!(!cut_short(4100, &small));
    // Zeros from a boundary inside the header (4096, six bytes in): the header passed its
    // checksum, so the write was not cut there.
    let mut head = vec![7u8; 100];
    head[6..].fill(0);
    assert!(!cut_short(4090, &head));
    // A record ending exactly at a boundary, zeros before it: the boundary is its end.
    let mut at_end = vec![7u8; 96];
    at_end[60..].fill(0);
    assert!(!cut_short(4000, &at_end));
}

#[test]
fn a_header_cut_short_at_a_sector_boundary_is_told_from_one_damaged_in_place() {
    use segment::header_cut_short;
    let len = FRAME_HEADER_LEN;
    // `region` runs from the header to the end of the last sector it touches.
    let region = |off: u64, fill: &dyn Fn(u64) -> u8| -> Vec<u8> {
        let to = (off + len as u64).div_ceil(512) * 512;
        (off..to).map(fill).collect()
    };
    // All zeros: the zero fill ahead of the data, or a sector that never landed.
    assert!(header_cut_short(4000, &region(4000, &|_| 0)));
    // A header across 4096 whose first sector landed and whose second did not.
    assert!(header_cut_short(
        4090,
        &region(4090, &|o| u8::from(o < 4096) * 7)
    ));
    // The reverse order: the second sector landed, the first (from the header on) did not.
    assert!(header_cut_short(
        500,
        &region(500, &|o| u8::from(o >= 512) * 7)
    ));
    // A whole header with a flipped byte: damage in place, wherever it lies.
    for off in [4000, 4090, 500] {
        assert!(!header_cut_short(off, &region(off, &|_| 7)), "{off}");
    }
    // A commit header ends in reserved zeros. A boundary inside them is not a cut while
    // that sector holds the payload that follows: the flipped header was written whole.
    let commit = |o: u64| match o - 480 {
        0..=17 => 9,
        18..=49 => 0,
        _ => 5,
    };
    assert!(!header_cut_short(480, &region(480, &commit)));
    // The same with the later sector really missing (zeros to its end): a cut.
    assert!(header_cut_short(
        480,
        &region(480, &|o| if o < 512 { commit(o) } else { 0 })
    ));
    // A region cut short by the end of the file counts as far as it goes.
    let short: Vec<u8> = region(4090, &|o| u8::from(o < 4096) * 7)[..len].to_vec();
    assert!(header_cut_short(4090, &short));
}

/// A closed store whose active segment ends `want` bytes past a 512-byte boundary; returns
/// its directory, segment path and length.
fn store_ending_at(want: u64) -> (tempfile::TempDir, std::path::PathBuf, u64) {
    for vlen in 0..1200usize {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
            s.commit(&[RefUpdate::Set {
                name: b"k".to_vec(),
                value: vec![7u8; vlen],
            }])
            .unwrap();
        }
        let p = dir.path().join("seg-000001.log");
        let len = std::fs::metadata(&p).unwrap().len();
        if len % 512 == want {
            return (dir, p, len);
        }
    }
    panic!("no value length puts the segment's end at {want} mod 512");
}

/// Appends `rec` at the end of the segment and reopens the store.
fn reopen_after_appending(
    dir: &std::path::Path,
    seg: &std::path::Path,
    at: u64,
    rec: &[u8],
) -> LogStore {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    f.write_all_at(rec, at).unwrap();
    drop(f);
    LogStore::open(dir, LogStoreOptions::default()).unwrap()
}

/// A power loss during an unacknowledged write whose record header crosses a sector
/// boundary, the later sector on disk and the earlier one not: a silent torn tail.
#[test]
fn a_header_whose_earlier_sector_never_landed_is_a_torn_tail() {
    let (dir, seg, len) = store_ending_at(500);
    let payload = vec![0x55u8; 3000];
    let cid = crate::HashAlgo::Blake3.digest(&payload);
    let mut rec = format::frame_header(KIND_CHUNK, &cid, &payload)
        .seal(format::SegPlace { id: 1, bound: true }.at(len), &payload)
        .to_vec();
    rec.extend_from_slice(&payload);
    rec[..12].fill(0);
    let s = reopen_after_appending(dir.path(), &seg, len, &rec);
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert!(s.recovery().segment_bytes_truncated > 0);
    assert!(s.get_ref(b"k").unwrap().is_some());
}

/// Bit rot in the last commit record's header is reported wherever the header lies,
/// including when a sector boundary falls inside its reserved zero bytes.
#[test]
fn a_rotted_last_commit_header_is_reported_wherever_it_lies() {
    for want in [480, 100] {
        let (dir, seg, len) = store_ending_at(want);
        let (ops, _) = refs::encode_ops(&[RefUpdate::Set {
            name: b"acked".to_vec(),
            value: b"v".to_vec(),
        }]);
        let mut rec = format::commit_header(2, &ops)
            .seal(format::SegPlace { id: 1, bound: true }.at(len), &ops)
            .to_vec();
        rec.extend_from_slice(&ops);
        rec[5] ^= 0x10;
        let s = reopen_after_appending(dir.path(), &seg, len, &rec);
        let r = s.recovery().clone();
        assert_eq!(r.damage.len(), 1, "at {want} mod 512: {r:?}");
        assert!(s.get_ref(b"acked").unwrap().is_none());
        assert!(s.get_ref(b"k").unwrap().is_some());
    }
}

/// Pages of `path` in the page cache and pages in all, by `mincore`; `None` on tmpfs,
/// whose pages `posix_fadvise` cannot drop.
#[cfg(target_os = "linux")]
fn resident_pages(path: &std::path::Path) -> Option<(usize, usize)> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a zeroed statfs is a valid out-parameter; the descriptor is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) }, 0);
    if st.f_type as i64 == 0x0102_1994 || len == 0 {
        return None;
    }
    let page = 4096usize;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: a private read-only mapping of an open file, unmapped before returning;
    // `vec` has one byte per page of it.
    unsafe {
        let m = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(m, libc::MAP_FAILED);
        assert_eq!(libc::mincore(m, len, vec.as_mut_ptr()), 0);
        libc::munmap(m, len);
    }
    Some((vec.iter().filter(|b| **b & 1 == 1).count(), pages))
}

#[test]
fn the_page_cache_window_drops_old_segments_and_loses_nothing() {
    const MIB: u64 = 1 << 20;
    for durability in Durability::ALL {
        let dir = tempfile::tempdir().unwrap();
        let opts = LogStoreOptions {
            durability,
            segment_size: 4 * MIB,
            page_cache_window: Some(4 * MIB),
            ..Default::default()
        };
        let s = LogStore::open(dir.path(), opts.clone()).unwrap();
        let mut cids = Vec::new();
        for i in 0..640u32 {
            let mut chunk: Vec<u8> = (0..64 << 10).map(|j| (i * 31 + j) as u8).collect();
            chunk[..4].copy_from_slice(&i.to_le_bytes());
            cids.push(s.put(&chunk).unwrap());
            if i % 16 == 15 {
                s.commit(&[RefUpdate::Set {
                    name: b"n".to_vec(),
                    value: i.to_le_bytes().to_vec(),
                }])
                .unwrap();
            }
        }
        let written = {
            let w = s.writer.lock();
            let written = w.base + w.seg.flushed.load(Ordering::Acquire);
            assert!(written > 40 * MIB, "{durability:?}: {written}");
            // What is still to be dropped lies within the window and one step of it.
            let kept: u64 = w.behind.iter().map(|b| b.to - b.from).sum();
            assert!(
                kept <= 4 * MIB + DROP_STEP,
                "{durability:?}: {kept} bytes of sealed segments never dropped"
            );
            written
        };
        // The sealed segments that ended a window and a step before the end are out of
        // the page cache (checked where the file system lets pages go).
        #[cfg(target_os = "linux")]
        {
            let paths = s.segment_paths();
            let mut end = 0u64;
            for p in &paths[..paths.len() - 1] {
                end += std::fs::metadata(p).unwrap().len();
                if end + 4 * MIB + DROP_STEP > written {
                    break;
                }
                if let Some((resident, pages)) = resident_pages(p) {
                    assert!(
                        resident * 10 <= pages,
                        "{durability:?}: {} keeps {resident} of {pages} pages cached",
                        p.display()
                    );
                }
            }
        }
        for (i, c) in cids.iter().enumerate() {
            let got = s.get(c).unwrap().unwrap();
            assert_eq!(got.len(), 64 << 10);
            assert_eq!(got[..4], (i as u32).to_le_bytes());
            assert_eq!(got[9], (i as u32 * 31 + 9) as u8);
        }
        drop(s);
        let s = LogStore::open(dir.path(), opts).unwrap();
        for c in &cids {
            assert!(s.get(c).unwrap().is_some());
        }
        assert_eq!(
            s.get_ref(b"n").unwrap().unwrap().as_ref(),
            639u32.to_le_bytes()
        );
    }
}

#[test]
fn without_a_window_nothing_is_tracked() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        segment_size: 1 << 20,
        page_cache_window: None,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts).unwrap();
    for i in 0..64u32 {
        let chunk = vec![i as u8; 64 << 10];
        s.put(&chunk).unwrap();
    }
    s.commit(&[]).unwrap();
    let w = s.writer.lock();
    assert!(w.base > 2 << 20);
    assert!(w.behind.is_empty());
}

/// A store written before records were bound to their place (segment format 2) opens,
/// reads, takes appends to its active segment in that format, and rolls to the current
/// format; every record reads back after another reopen.
#[test]
fn format_2_segments_are_read_and_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    drop(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
    // Segment 1 as format 2 wrote it: its header, a chunk, a commit naming it.
    let old = format::SegPlace {
        id: 1,
        bound: false,
    };
    let mut seg = format::segment_header(1, crate::HashAlgo::Blake3).to_vec();
    seg[12] = format::SEG_VERSION_UNBOUND;
    let chunk = b"written by format 2".to_vec();
    let cid = crate::HashAlgo::Blake3.digest(&chunk);
    seg.extend_from_slice(
        &format::frame_header(KIND_CHUNK, &cid, &chunk).seal(old.at(seg.len() as u64), &chunk),
    );
    seg.extend_from_slice(&chunk);
    let ops = refs::encode_ops(&[set("old", &cid.to_bytes())]).0;
    seg.extend_from_slice(&format::commit_header(1, &ops).seal(old.at(seg.len() as u64), &ops));
    seg.extend_from_slice(&ops);
    let path = dir.path().join("seg-000001.log");
    fs::write(&path, &seg).unwrap();
    let opts = LogStoreOptions {
        segment_size: 4096,
        ..LogStoreOptions::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert_eq!(s.get(&cid).unwrap().as_deref(), Some(&chunk[..]));
    assert!(!s.writer.lock().seg.bound);
    // Appends to the old active segment, then enough to roll to a new one.
    let mut put = Vec::new();
    for i in 0..20u32 {
        let data = format!("appended {i} ").repeat(40).into_bytes();
        let c = s.put(&data).unwrap();
        s.commit(&[set(&format!("new{i}"), &c.to_bytes())]).unwrap();
        put.push((c, data));
    }
    assert!(s.writer.lock().seg.bound, "rolled to the current format");
    drop(s);
    // Without hint files, the sealed segments (format 2 and 3) are scanned.
    for e in fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "hint") {
            fs::remove_file(p).unwrap();
        }
    }
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert_eq!(s.get(&cid).unwrap().as_deref(), Some(&chunk[..]));
    assert_eq!(
        s.get_ref(b"old").unwrap().as_deref(),
        Some(&cid.to_bytes()[..])
    );
    for (i, (c, data)) in put.iter().enumerate() {
        assert_eq!(s.get(c).unwrap().as_deref(), Some(&data[..]));
        assert_eq!(
            s.get_ref(format!("new{i}").as_bytes()).unwrap().as_deref(),
            Some(&c.to_bytes()[..])
        );
    }
}

/// Zeros written ahead of the data leave a sealed segment even when the writer lost track
/// of them (a write of zeros that failed part way): the roll cuts the file at its data,
/// so the next open finds the segment whole (no rescan, no damage).
#[test]
fn a_roll_cuts_zeros_the_writer_lost_track_of() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        segment_size: 4096,
        ..LogStoreOptions::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let a = s.put(&[1u8; 3000]).unwrap();
    s.commit(&[RefUpdate::Set {
        name: b"a".to_vec(),
        value: a.to_bytes().to_vec(),
    }])
    .unwrap();
    {
        let mut w = s.writer.lock();
        assert!(
            w.seg.file.metadata().unwrap().len() > w.end(),
            "zeros ahead"
        );
        w.alloc_end = 0;
    }
    let b = s.put(&[2u8; 3000]).unwrap();
    s.commit(&[RefUpdate::Set {
        name: b"b".to_vec(),
        value: b.to_bytes().to_vec(),
    }])
    .unwrap();
    let first = s.segment_paths()[0].clone();
    assert!(s.segment_paths().len() >= 2, "rolled");
    drop(s);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    let sealed_len = fs::metadata(&first).unwrap().len();
    let data_end = s.index.get(&a).unwrap().off + (FRAME_HEADER_LEN + 3000) as u64;
    assert!(sealed_len < data_end + 4096, "{sealed_len} vs {data_end}");
    assert_eq!(s.get(&a).unwrap().unwrap().len(), 3000);
    assert_eq!(s.get(&b).unwrap().unwrap().len(), 3000);
}

/// A commit whose `fdatasync` fails is reported failed and is not there after a reopen in
/// the same boot (its bytes, still in the page cache, are cut), while every commit
/// acknowledged before it is.
#[test]
fn a_commit_whose_sync_failed_is_not_replayed_by_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let kept = s.put(b"acknowledged").unwrap();
    s.commit(&[set("acked", b"v")]).unwrap();
    let lost = s.put(b"never acknowledged").unwrap();
    s.fail_next_sync.store(true, Ordering::Release);
    let e = s.commit(&[set("failed", b"v")]).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(
        s.commit(&[set("after", b"v")]).is_err(),
        "the store is failed"
    );
    drop(s);
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert!(s.get_ref(b"acked").unwrap().is_some());
    assert!(
        s.get_ref(b"failed").unwrap().is_none(),
        "{:?}",
        s.recovery()
    );
    assert!(s.get_ref(b"after").unwrap().is_none());
    assert!(s.get(&kept).unwrap().is_some());
    assert!(s.get(&lost).unwrap().is_none());
    s.commit(&[set("next", b"v")]).unwrap();
}

/// A segment whose seal `fdatasync` fails is cut back to what is known durable, as the
/// active segment is after a failed commit sync: a reopen in the same boot does not find
/// the chunks written since the last sync (the kernel may keep their pages clean though
/// they never reached the disk), so a later put of the same bytes stores them again
/// rather than deduplicating against chunks that may not exist, and its commit is durable.
#[test]
fn a_segment_whose_seal_sync_failed_is_cut_to_what_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Group,
        segment_size: 256 << 10,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let kept = s.put(b"acknowledged").unwrap();
    s.commit(&[set("acked", b"v")]).unwrap();
    s.fail_next_sync.store(true, Ordering::Release);
    let mut unsynced = Vec::new();
    let e = loop {
        let i = unsynced.len() as u32;
        let chunk: Vec<u8> = (0..4096u32)
            .map(|j| (i ^ j) as u8)
            .chain(i.to_le_bytes())
            .collect();
        match s.put(&chunk) {
            Ok(c) => unsynced.push((c, chunk)),
            Err(e) => break e,
        }
        assert!(unsynced.len() < 1000, "no segment was sealed");
    };
    assert!(e.to_string().contains("injected"), "{e}");
    drop(s);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert!(s.get(&kept).unwrap().is_some());
    assert!(s.get_ref(b"acked").unwrap().is_some());
    for (c, _) in &unsynced {
        assert!(!s.has(c).unwrap(), "a chunk never synced came back");
    }
    // Written again, it is stored (not taken as present) and its commit is durable.
    let (c, chunk) = &unsynced[0];
    assert!(s.put_hashed(*c, chunk).unwrap());
    s.commit(&[set("again", b"v")]).unwrap();
    assert!(s.get(c).unwrap().is_some());
}

/// One flipped bit in a segment header's format byte (current → unbound) would make every
/// record fail its checksum: the active segment was cut whole as a torn write, a sealed
/// one read as corrupt. The first record tells the format; the damage is reported.
#[test]
fn a_damaged_format_byte_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Group,
        segment_size: 64 << 10,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let mut chunks = Vec::new();
    for i in 0..150u32 {
        let data = i.to_le_bytes().repeat(250);
        chunks.push((s.put(&data).unwrap(), data));
        s.commit(&[set(&format!("r{i}"), b"v")]).unwrap();
    }
    let paths = s.segment_paths();
    assert!(paths.len() >= 3, "sealed segments and an active one");
    drop(s);
    // The first sealed segment and the active one: current → unbound, or to no format.
    overwrite(&paths[0], 12, &[format::SEG_VERSION ^ 1]);
    overwrite(paths.last().unwrap(), 12, &[format::SEG_VERSION ^ 4]);
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    assert_eq!(s.list_refs(b"").unwrap().len(), 150, "{:?}", s.recovery());
    for (c, d) in &chunks {
        assert_eq!(&s.get(c).unwrap().unwrap()[..], &d[..]);
    }
    let damage = &s.recovery().damage;
    assert_eq!(damage.len(), 2, "{damage:?}");
    assert!(
        damage.iter().all(|d| d.contains("format byte")),
        "{damage:?}"
    );
    drop(s);
    // Mended on disk.
    for p in [&paths[0], paths.last().unwrap()] {
        assert_eq!(std::fs::read(p).unwrap()[12], format::SEG_VERSION);
    }
    // The active segment's byte names no format and its first record is damaged too:
    // nothing tells the format, and the store is not opened.
    overwrite(paths.last().unwrap(), 12, &[format::SEG_VERSION ^ 4]);
    overwrite(paths.last().unwrap(), 16 + 4, &[0xff]);
    assert!(LogStore::open(dir.path(), opts).is_err());
    // A segment with no record yet is of the current format.
    let dir = tempfile::tempdir().unwrap();
    drop(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
    let seg = format::segment_path(dir.path(), 1);
    overwrite(&seg, 12, &[0x7f]);
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert_eq!(s.recovery().damage.len(), 1, "{:?}", s.recovery());
    s.put(b"after").unwrap();
    s.commit(&[set("after", b"v")]).unwrap();
    drop(s);
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert!(s.get_ref(b"after").unwrap().is_some());
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
}

/// A group leader whose `fdatasync` succeeded acknowledges its group even if, before it
/// notes the sync, a roll on another thread fails its own sync and cuts the segment back
/// to what is known durable: the successful sync counts before its lock is let go, so the
/// cut keeps the group. (The cut used to read a `synced` the leader had not raised yet and
/// removed an acknowledged commit.) The interleaving, replayed by hand.
#[test]
fn a_failed_roll_sync_keeps_a_group_whose_sync_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Group,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    s.put(b"base").unwrap();
    s.commit(&[set("base", b"v")]).unwrap();
    // The leader writes its group's commit record and syncs it.
    let (ops, _) = refs::encode_ops(&[set("acked", b"v")]);
    let (seg, end) = {
        let mut w = s.writer.lock();
        w.append_commit(&ops);
        w.flush().unwrap();
        (w.seg.clone(), w.seg.flushed.load(Ordering::Acquire))
    };
    s.timed_sync(&seg, end).unwrap();
    // Before the leader acknowledges, a put fills the segment and its roll's sync fails.
    s.put(b"a put that fills the segment").unwrap();
    s.fail_next_sync.store(true, Ordering::Release);
    {
        let mut w = s.writer.lock();
        assert!(s.roll(&mut w).is_err());
    }
    assert!(seg.synced.load(Ordering::Acquire) >= end);
    drop(s);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert!(s.get_ref(b"acked").unwrap().is_some(), "{:?}", s.recovery());
}

/// Under `Buffered`, sealed segments are synced by the sealer thread: the writer goes on
/// at once, every sealed segment is synced by the time the store is closed (and before a
/// snapshot is written), and a reopen finds everything, with no damage.
#[test]
fn buffered_segments_are_sealed_by_their_own_thread_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Buffered,
        segment_size: 256 << 10,
        refs_log_max: 4 << 10,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    assert!(s.sealer.is_some());
    let mut cids = Vec::new();
    for i in 0..400u32 {
        let chunk: Vec<u8> = (0..4096u32)
            .map(|j| (i ^ j) as u8)
            .chain(i.to_le_bytes())
            .collect();
        cids.push(s.put(&chunk).unwrap());
        s.commit(&[set(&format!("k{i}"), &i.to_le_bytes())])
            .unwrap();
    }
    let segs: Vec<Arc<Segment>> = s.segments.read().values().cloned().collect();
    assert!(segs.len() > 4, "{} segments", segs.len());
    // A snapshot was written along the way: it waited for the sealed segments.
    assert!(s.snap.lock().seq > 0);
    // A forced sync covers the sealed segments too (compaction relies on it before it
    // deletes what it copied).
    s.sync().unwrap();
    let active_now = s.writer.lock().seg.id;
    for g in segs.iter().filter(|g| g.id != active_now) {
        assert_eq!(
            g.synced.load(Ordering::Acquire),
            g.flushed.load(Ordering::Acquire),
            "segment {} synced by sync()",
            g.id
        );
    }
    drop(s);
    let active = segs.iter().map(|g| g.id).max().unwrap();
    for g in segs.iter().filter(|g| g.id != active) {
        assert_eq!(
            g.synced.load(Ordering::Acquire),
            g.flushed.load(Ordering::Acquire),
            "segment {} synced by the time the store closed",
            g.id
        );
    }
    // Each sealed segment got its hint, written once the segment was synced.
    for g in segs.iter().filter(|g| g.id != active) {
        assert!(
            format::hint_path(dir.path(), g.id).exists(),
            "hint of {}",
            g.id
        );
    }
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert!(s.recovery_notes().unwrap().is_empty());
    for (i, c) in cids.iter().enumerate() {
        assert!(s.get(c).unwrap().is_some(), "chunk {i}");
        assert_eq!(
            s.get_ref(format!("k{i}").as_bytes()).unwrap().unwrap(),
            (i as u32).to_le_bytes().to_vec()
        );
    }
}

/// A last group that `refs.snap` already covers was durably written: damage in it is bit
/// rot, reported and kept, not a torn write to cut (which would drop the intact chunks
/// after the damage while the refs replayed from the snapshot still name them).
#[test]
fn damage_in_a_last_group_the_snapshot_covers_is_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        refs_log_max: 0,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let a = s.put(&[1u8; 3000]).unwrap();
    let b = s.put(&[2u8; 3000]).unwrap();
    s.commit(&[set("k", b"v")]).unwrap();
    assert_eq!(s.snap.lock().seq, 1, "the snapshot covers the commit");
    let loc = s.index.get(&a).unwrap();
    let path = s.segments.read()[&loc.seg].path.clone();
    drop(s);
    // Rot one byte of the first chunk's payload.
    overwrite(&path, loc.off + format::FRAME_HEADER_LEN as u64 + 100, &[9]);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert_eq!(
        s.recovery().segment_bytes_truncated,
        0,
        "{:?}",
        s.recovery()
    );
    assert_eq!(s.get_ref(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(&s.get(&b).unwrap().unwrap()[..], &[2u8; 3000][..]);
    assert!(matches!(s.get(&a), Err(Error::Corrupt(_))));
    assert!(!s.recovery().damage.is_empty(), "the rot is reported");
}

/// A last segment whose 16-byte header is all zeros (its length reached the disk, its
/// header did not, in a crash inside the segment's creation) is initialised again at
/// open, as a shorter one is, instead of failing the open.
#[test]
fn a_last_segment_with_a_zero_header_is_initialised_again() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions::default();
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let c = s.put(b"kept").unwrap();
    s.commit(&[set("k", b"v")]).unwrap();
    drop(s);
    let next = format::segment_path(dir.path(), 2);
    std::fs::write(&next, [0u8; SEG_HEADER_LEN as usize]).unwrap();
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert_eq!(&s.get(&c).unwrap().unwrap()[..], b"kept");
    assert_eq!(s.get_ref(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let c2 = s.put(b"after").unwrap();
    s.commit(&[set("k2", b"w")]).unwrap();
    assert_eq!(&s.get(&c2).unwrap().unwrap()[..], b"after");
}

/// Commit-only groups written after the one `refs.snap` covers merge into the same last
/// run of commit records: damage after the covered commit is still a torn write, cut there,
/// and no later commit is applied.
#[test]
fn damage_after_the_covered_commit_of_a_last_run_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        refs_log_max: 0,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let a = s.put(&[1u8; 3000]).unwrap();
    // A large value, so that the snapshot is large and the small commits after it write
    // no other one.
    s.commit(&[set("big", &[5u8; 1000])]).unwrap();
    assert_eq!(s.snap.lock().seq, 1);
    s.commit(&[set("k2", b"2")]).unwrap();
    s.commit(&[set("k3", b"3")]).unwrap();
    assert_eq!(s.snap.lock().seq, 1, "no snapshot past the first commit");
    let (path, second) = {
        let w = s.writer.lock();
        let c = w.commits.iter().find(|c| c.seq == 2).unwrap().off;
        (w.seg.path.clone(), c)
    };
    drop(s);
    // The second commit's header never reached the disk.
    overwrite(&path, second, &[0u8; format::FRAME_HEADER_LEN]);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert_eq!(
        s.get_ref(b"big").unwrap().as_deref(),
        Some(&[5u8; 1000][..])
    );
    assert_eq!(&s.get(&a).unwrap().unwrap()[..], &[1u8; 3000][..]);
    assert_eq!(s.get_ref(b"k2").unwrap(), None);
    assert_eq!(
        s.get_ref(b"k3").unwrap(),
        None,
        "no commit after a torn one"
    );
    assert!(
        s.recovery().segment_bytes_truncated > 0,
        "{:?}",
        s.recovery()
    );
}

/// A commit record that `refs.snap` covers but whose payload rotted still marks the end
/// of the durable part of the last run: the commit after it is kept and applied, and the
/// rot is reported as damage, not cut as a torn write.
#[test]
fn a_rotted_covered_commit_does_not_cut_the_commits_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        refs_log_max: 0,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    s.commit(&[set("k1", b"1")]).unwrap();
    s.commit(&[set("big", &[5u8; 1000])]).unwrap();
    assert_eq!(s.snap.lock().seq, 2);
    s.commit(&[set("k3", b"3")]).unwrap();
    assert_eq!(s.snap.lock().seq, 2, "no snapshot past the second commit");
    let (path, second) = {
        let w = s.writer.lock();
        let c = w.commits.iter().find(|c| c.seq == 2).unwrap().clone();
        (w.seg.path.clone(), c)
    };
    drop(s);
    let at = second.off + format::FRAME_HEADER_LEN as u64 + u64::from(second.len) / 2;
    overwrite(&path, at, &[0xEE]);
    let s = LogStore::open(dir.path(), opts).unwrap();
    assert_eq!(
        s.recovery().segment_bytes_truncated,
        0,
        "{:?}",
        s.recovery()
    );
    assert_eq!(s.get_ref(b"k3").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(
        s.get_ref(b"big").unwrap().as_deref(),
        Some(&[5u8; 1000][..])
    );
    assert!(!s.recovery().damage.is_empty());
}

/// A compaction whose copies' sync fails (a full or failing disk) leaves the store failed
/// for writes, but reads go on: every live chunk it had copied is read from its original,
/// still in place, not looked for in a copy the failure cut away (which read as corrupt
/// and made the chunk look absent).
#[test]
fn reads_go_on_from_the_originals_after_a_compaction_whose_sync_failed() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Group,
        segment_size: 64 << 10,
        write_buffer: 4096,
        refs_log_max: 4096,
        ..Default::default()
    };
    let s = LogStore::open(dir.path(), opts.clone()).unwrap();
    let mut chunks = Vec::new();
    for i in 0..200u32 {
        let data: Vec<u8> = (0..1000u32)
            .map(|j| (i * 7 + j) as u8)
            .chain(i.to_le_bytes())
            .collect();
        chunks.push((s.put(&data).unwrap(), data));
    }
    s.commit(&[set("root", b"r")]).unwrap();
    let (dead, live): (Vec<_>, Vec<_>) = chunks
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 4 != 0);
    let dead: Vec<Cid> = dead.into_iter().map(|(_, (c, _))| c).collect();
    let live: Vec<(Cid, Vec<u8>)> = live.into_iter().map(|(_, x)| x).collect();
    s.remove(&dead).unwrap();
    // A fresh active segment with room for every copy: the sync that fails is the one
    // after the copies, not a roll before them.
    s.roll(&mut s.writer.lock()).unwrap();
    s.fail_next_sync.store(true, Ordering::Release);
    let e = s.compact().unwrap_err();
    assert!(!s.fail_next_sync.load(Ordering::Acquire));
    assert!(e.to_string().contains("injected"), "{e}");
    for (cid, data) in &live {
        assert!(s.has(cid).unwrap());
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    drop(s);
    let s = LogStore::open(dir.path(), opts).unwrap();
    for (cid, data) in &live {
        assert_eq!(&s.get(cid).unwrap().unwrap()[..], &data[..]);
    }
    assert_eq!(s.get_ref(b"root").unwrap().as_deref(), Some(&b"r"[..]));
}

/// Opening a store deletes only the temporary files it writes itself, and only once the
/// manifest shows the directory is a store.
#[test]
fn open_deletes_only_its_own_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    s.commit(&[set("k", b"v")]).unwrap();
    drop(s);
    let own = [
        "MANIFEST.tmp",
        "refs.tmp",
        "refs-copy.tmp",
        "seg-000001.tmp",
    ];
    let others = ["notes.tmp", "seg-x.tmp", "refs.snap.tmp"];
    for n in own.iter().chain(&others) {
        fs::write(dir.path().join(n), b"x").unwrap();
    }
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for n in own {
        assert!(!dir.path().join(n).exists(), "{n} is left over");
    }
    for n in others {
        assert!(dir.path().join(n).exists(), "{n} was deleted");
    }
    assert_eq!(s.get_ref(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(s);
    // A directory whose manifest is not a store's: refused, nothing deleted.
    fs::write(dir.path().join("MANIFEST"), b"not a manifest").unwrap();
    fs::write(dir.path().join("refs.tmp"), b"x").unwrap();
    assert!(LogStore::open(dir.path(), LogStoreOptions::default()).is_err());
    assert!(dir.path().join("refs.tmp").exists());
}

/// When open cannot mend the refs snapshot's copy, neither file counts as covering any
/// commit: the next snapshot a compaction needs writes both first (and fails while the
/// copy cannot be written), so no segment goes whose commits only one file holds.
#[test]
fn a_snapshot_pair_open_could_not_mend_covers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    s.commit(&[set("a", b"1")]).unwrap();
    s.commit(&[set("b", b"2")]).unwrap();
    assert!(s.snapshot_covers(2).unwrap());
    let seq = s.snap.lock().seq;
    assert!(seq >= 2);
    drop(s);
    // The copy becomes something open can neither read nor replace.
    let copy = dir.path().join(format::REFS_SNAP_COPY);
    fs::remove_file(&copy).unwrap();
    fs::create_dir(&copy).unwrap();
    fs::write(copy.join("x"), b"x").unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert!(!s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert_eq!(s.get_ref(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    assert!(s.snapshot_covers(seq).is_err(), "the pair is not whole");
    fs::remove_dir_all(&copy).unwrap();
    assert!(s.snapshot_covers(seq).unwrap());
    assert_eq!(
        fs::read(&copy).unwrap(),
        fs::read(dir.path().join(format::REFS_SNAP)).unwrap()
    );
}

/// A chunk a caller stored under a wrong cid, in the last group of writes, is kept as a
/// bad chunk (its frame checksum holds: it was written as it reads), not taken for a torn
/// write: the acknowledged commit after it survives the reopen. (A payload that fails its
/// checksum too is a torn write there, and is cut: see the tests of torn tails above.)
#[test]
fn a_chunk_stored_under_a_wrong_cid_does_not_cut_the_commits_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let wrong = HashAlgo::Blake3.digest(b"what the caller meant");
    {
        let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        s.put(b"first").unwrap();
        s.commit(&[set("before", b"1")]).unwrap();
        s.put_hashed(wrong, b"something else").unwrap();
        s.commit(&[set("acked", b"2")]).unwrap();
    }
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    assert!(s.recovery().damage.is_empty(), "{:?}", s.recovery());
    assert_eq!(s.get_ref(b"acked").unwrap().as_deref(), Some(&b"2"[..]));
    assert!(matches!(s.get(&wrong), Err(Error::Corrupt(_))));
}
