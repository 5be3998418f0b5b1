//! Unit tests of the log backend's internals (the behaviour is tested in `tests/`).

use super::*;

#[test]
fn garbage_ratio() {
    assert!(garbage_heavy(0, 0));
    assert!(garbage_heavy(100, 50));
    assert!(!garbage_heavy(100, 51));
    assert!(!garbage_heavy(100, 100));
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
    let _ = s.fail(Error::invalid("simulated fsync failure"));
    assert!(matches!(s.put(b"x"), Err(Error::Unavailable(_))));
    assert!(matches!(s.commit(&[]), Err(Error::Unavailable(_))));
}

/// A resync over a damaged chunk header can lock onto a commit record embedded in that
/// chunk's payload: one that does not follow the highest sequence number seen is reported
/// and ignored, and does not raise the next sequence number.
#[test]
fn stray_commit_after_a_resync_is_ignored() {
    let set = |name: &str, value: &[u8]| RefUpdate::Set {
        name: name.as_bytes().to_vec(),
        value: value.to_vec(),
    };
    let dir = tempfile::tempdir().unwrap();
    let s = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for i in 0..3 {
        s.commit(&[set(&format!("k{i}"), b"v")]).unwrap();
    }
    // A chunk whose payload holds a valid commit record numbered 50.
    let ops = refs::encode_ops(&[set("stray", b"x")]).0;
    let mut data: Vec<u8> = (0..100u32).map(|i| (i * 7 + 1) as u8).collect();
    data.extend_from_slice(&format::commit_header(50, &ops));
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
    // All zeros: the zero fill ahead of the data, or a sector that never landed.
    assert!(header_cut_short(4000, &vec![0u8; len]));
    // Zeros from a sector boundary inside the header (4096, six bytes in) on.
    let mut hdr = vec![7u8; len];
    hdr[6..].fill(0);
    assert!(header_cut_short(4090, &hdr));
    // The same bytes with no boundary inside: written whole, so damaged in place.
    assert!(!header_cut_short(4000, &hdr));
    // A whole header with a flipped byte.
    assert!(!header_cut_short(4090, &vec![7u8; len]));
    // Non-zero bytes after the boundary: that sector landed too.
    hdr[len - 1] = 1;
    assert!(!header_cut_short(4090, &hdr));
}
