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
