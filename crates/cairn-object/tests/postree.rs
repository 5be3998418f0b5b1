//! POS-tree properties checked against simple models (Vec<u8>, Vec<Vec<u8>>, BTreeMap,
//! BTreeSet) with small node sizes so trees have several levels.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use cairn_core::Error;
use cairn_object::postree::{self, BlobReader, BlobWriter, TreeConfig, TreeKind, TreeRef};
use cairn_store::{ChunkStore, MemoryStore};
use proptest::prelude::*;

type Change = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

fn cfg(leaf: u32, index: u32) -> TreeConfig {
    TreeConfig {
        leaf_target: leaf,
        index_target: index,
    }
}

fn small() -> impl Strategy<Value = TreeConfig> {
    (
        prop_oneof![Just(64u32), Just(128), Just(256)],
        prop_oneof![Just(64u32), Just(128), Just(256)],
    )
        .prop_map(|(l, i)| cfg(l, i))
}

/// Blob content mixing random bytes and runs (runs force max-size cuts).
fn blob_data(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::collection::vec(any::<u8>(), 0..2000),
            1 => (any::<u8>(), 0..3000usize).prop_map(|(b, n)| vec![b; n]),
        ],
        0..(max / 1000).max(1),
    )
    .prop_map(|parts| parts.concat())
}

fn walk_ok(s: &MemoryStore, t: &TreeRef) {
    let mut n = 0;
    postree::walk(s, t, &mut |_, _| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert!(n >= 1);
}

fn list_model(s: &MemoryStore, t: &TreeRef) -> Vec<Vec<u8>> {
    postree::iter(s, t)
        .map(|e| e.unwrap().key.to_vec())
        .collect()
}

fn map_model(s: &MemoryStore, t: &TreeRef) -> BTreeMap<Vec<u8>, Vec<u8>> {
    postree::iter(s, t)
        .map(|e| {
            let e = e.unwrap();
            (e.key.to_vec(), e.value.unwrap().to_vec())
        })
        .collect()
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(0u8..4, 1..4),
        prop::collection::vec(any::<u8>(), 0..12),
    ]
}

fn apply_seq(a: &[u8], changes: &[postree::SeqChange], b_full: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for c in changes {
        out.extend_from_slice(&a[at..c.a_start as usize]);
        out.extend_from_slice(&b_full[c.b_start as usize..c.b_end as usize]);
        at = c.a_end as usize;
    }
    out.extend_from_slice(&a[at..]);
    out
}

#[derive(Debug, Clone)]
enum BlobEdit {
    Splice { at: f64, del: usize, ins: Vec<u8> },
}

fn blob_edit() -> impl Strategy<Value = BlobEdit> {
    (
        0.0..=1.0f64,
        prop_oneof![Just(0usize), 0..8usize, 0..3000usize],
        prop_oneof![
            Just(Vec::new()),
            prop::collection::vec(any::<u8>(), 0..8),
            prop::collection::vec(any::<u8>(), 0..3000),
            (any::<u8>(), 0..2000usize).prop_map(|(b, n)| vec![b; n]),
        ],
    )
        .prop_map(|(at, del, ins)| BlobEdit::Splice { at, del, ins })
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES raises the count for soak runs.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn blob_build_and_read(c in small(), data in blob_data(30_000), cuts in prop::collection::vec((0.0..=1.0f64, 0..5000u64), 1..8), wsize in 1..5000usize) {
        let s = MemoryStore::new();
        let t = postree::build_blob(&s, &c, &data).unwrap();
        prop_assert_eq!(t.count, data.len() as u64);
        walk_ok(&s, &t);
        // blob_leaf_lengths names exactly the leaves the tree holds.
        let mut leaves = BTreeSet::new();
        postree::walk(&s, &t, &mut |_, chunk| {
            if let (cairn_object::chunk::ChunkKind::Blob, payload) = cairn_object::chunk::parse(chunk)? {
                leaves.insert(payload.to_vec());
            }
            Ok(())
        }).unwrap();
        let lengths = postree::blob_leaf_lengths(&c, &data);
        prop_assert_eq!(lengths.iter().sum::<usize>(), data.len());
        let mut at = 0;
        let mut cut = BTreeSet::new();
        for n in lengths {
            cut.insert(data[at..at + n].to_vec());
            at += n;
        }
        if !data.is_empty() {
            prop_assert_eq!(cut, leaves);
        }
        prop_assert_eq!(postree::blob_read(&s, &t, 0, u64::MAX).unwrap(), data.clone());
        // The streaming writer gives the same tree whatever the write sizes.
        let mut w = BlobWriter::new(&s, &c);
        for part in data.chunks(wsize) {
            w.write_all(part).unwrap();
        }
        prop_assert_eq!(w.bytes_written(), data.len() as u64);
        prop_assert_eq!(w.finish().unwrap(), t);
        // ... and when it reads the input itself, in reads of any size, storing on the pipe.
        let piped = Arc::new(MemoryStore::new());
        let shared: Arc<dyn ChunkStore> = piped.clone();
        let mut w = BlobWriter::new(&*piped, &c).storing_on_pipe(shared);
        let mut input = Dribble { data: &data, step: wsize };
        while w.read_from(&mut input).unwrap() > 0 {}
        prop_assert_eq!(w.bytes_written(), data.len() as u64);
        prop_assert_eq!(w.finish().unwrap(), t);
        walk_ok(&piped, &t);
        let mut r = BlobReader::new(&s, &t);
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        prop_assert_eq!(&all, &data);
        for (f, len) in cuts {
            let off = (f * data.len() as f64) as u64;
            let end = (off + len).min(data.len() as u64);
            prop_assert_eq!(postree::blob_read(&s, &t, off, len).unwrap(), data[off as usize..end as usize].to_vec());
            let mut r = BlobReader::range(&s, &t, off, len);
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            prop_assert_eq!(&got[..], &data[off as usize..end as usize]);
            let mut r = BlobReader::new(&s, &t);
            r.seek(SeekFrom::Start(off)).unwrap();
            let mut got = vec![0u8; (end - off) as usize];
            r.read_exact(&mut got).unwrap();
            prop_assert_eq!(&got[..], &data[off as usize..end as usize]);
        }
        prop_assert!(matches!(postree::blob_read(&s, &t, data.len() as u64 + 1, 1), Err(Error::InvalidInput(_))));
        for (f, len) in [(0.0, u64::MAX), (0.5, 7), (1.0, 10)] {
            let off = (f * data.len() as f64) as u64;
            let end = off.saturating_add(len).min(data.len() as u64);
            let mut got = Vec::new();
            let n = postree::copy_blob(&s, &t, off, len, 2, &mut got).unwrap();
            prop_assert_eq!(n, end - off);
            prop_assert_eq!(&got[..], &data[off as usize..end as usize]);
        }
    }

    #[test]
    fn blob_edits_are_history_independent(c in small(), data in blob_data(20_000), edits in prop::collection::vec(blob_edit(), 1..6)) {
        let s = MemoryStore::new();
        let mut model = data;
        let mut t = postree::build_blob(&s, &c, &model).unwrap();
        for BlobEdit::Splice { at, del, ins } in edits {
            let off = (at * model.len() as f64) as usize;
            let del = del.min(model.len() - off);
            let before = t;
            t = postree::blob_splice(&s, &c, &t, off as u64, del as u64, &ins).unwrap();
            let before_model = model.clone();
            model.splice(off..off + del, ins.iter().copied());
            let fresh = postree::build_blob(&s, &c, &model).unwrap();
            prop_assert_eq!(t, fresh);
            prop_assert_eq!(postree::blob_read(&s, &t, 0, u64::MAX).unwrap(), model.clone());
            walk_ok(&s, &t);
            // diff_seq applied to the old version gives the new one.
            let ch = postree::diff_seq(&s, &before, &t).unwrap();
            prop_assert_eq!(apply_seq(&before_model, &ch, &model), model.clone());
            for w in ch.windows(2) {
                prop_assert!(w[0].a_end <= w[1].a_start && w[0].b_end <= w[1].b_start);
            }
        }
    }

    #[test]
    fn list_build_read_and_splice(c in small(), elems in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..600),
                                  edits in prop::collection::vec((0.0..=1.0f64, 0..30usize, prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..40)), 1..6),
                                  probes in prop::collection::vec((0.0..=1.0f64, 0..100u64), 1..6)) {
        let s = MemoryStore::new();
        let mut model = elems;
        let mut t = postree::build_list(&s, &c, &model).unwrap();
        prop_assert_eq!(t.count, model.len() as u64);
        prop_assert_eq!(list_model(&s, &t), model.clone());
        walk_ok(&s, &t);
        for (f, len) in &probes {
            let i = (f * model.len() as f64) as u64;
            prop_assert_eq!(postree::list_get(&s, &t, i).unwrap().map(|b| b.to_vec()), model.get(i as usize).cloned());
            let end = (i + len).min(model.len() as u64);
            let got: Vec<Vec<u8>> = postree::list_range(&s, &t, i, i + len).map(|e| e.unwrap().key.to_vec()).collect();
            prop_assert_eq!(got, model[i as usize..end as usize].to_vec());
        }
        for (f, del, ins) in edits {
            let i = (f * model.len() as f64) as usize;
            let del = del.min(model.len() - i);
            let before = t;
            let before_model = model.clone();
            let insb: Vec<Bytes> = ins.iter().map(|x| Bytes::copy_from_slice(x)).collect();
            t = postree::list_splice(&s, &c, &t, i as u64, del as u64, &insb).unwrap();
            model.splice(i..i + del, ins);
            prop_assert_eq!(t, postree::build_list(&s, &c, &model).unwrap());
            prop_assert_eq!(list_model(&s, &t), model.clone());
            walk_ok(&s, &t);
            let ch = postree::diff_seq(&s, &before, &t).unwrap();
            let mut rebuilt = Vec::new();
            let mut at = 0;
            for x in &ch {
                rebuilt.extend_from_slice(&before_model[at..x.a_start as usize]);
                rebuilt.extend_from_slice(&model[x.b_start as usize..x.b_end as usize]);
                at = x.a_end as usize;
            }
            rebuilt.extend_from_slice(&before_model[at..]);
            prop_assert_eq!(rebuilt, model.clone());
        }
    }

    #[test]
    fn map_build_update_diff(c in small(),
                             init in prop::collection::btree_map(key_strategy(), prop::collection::vec(any::<u8>(), 0..30), 0..500),
                             batches in prop::collection::vec(prop::collection::vec((key_strategy(), prop::option::of(prop::collection::vec(any::<u8>(), 0..30))), 0..40), 1..5),
                             probes in prop::collection::vec((key_strategy(), key_strategy()), 1..6)) {
        let s = MemoryStore::new();
        let mut model = init;
        let mut t = postree::build_map(&s, &c, &model).unwrap();
        prop_assert_eq!(map_model(&s, &t), model.clone());
        walk_ok(&s, &t);
        for batch in batches {
            let before = t;
            let before_model = model.clone();
            for (k, v) in &batch {
                match v {
                    Some(v) => { model.insert(k.clone(), v.clone()); }
                    None => { model.remove(k); }
                }
            }
            t = postree::map_update(&s, &c, &t, batch).unwrap();
            prop_assert_eq!(t, postree::build_map(&s, &c, &model).unwrap());
            prop_assert_eq!(map_model(&s, &t), model.clone());
            walk_ok(&s, &t);
            // diff against the model diff
            let got = postree::diff_sorted(&s, &before, &t).unwrap();
            let keys: BTreeSet<&Vec<u8>> = before_model.keys().chain(model.keys()).collect();
            let want: Vec<Change> = keys.into_iter()
                .filter(|k| before_model.get(*k) != model.get(*k))
                .map(|k| (k.clone(), before_model.get(k).cloned(), model.get(k).cloned()))
                .collect();
            let got: Vec<Change> = got.into_iter()
                .map(|x| (x.key.to_vec(), x.left.map(|v| v.to_vec()), x.right.map(|v| v.to_vec())))
                .collect();
            prop_assert_eq!(got, want);
        }
        for (a, b) in probes {
            prop_assert_eq!(postree::map_get(&s, &t, &a).unwrap().map(|v| v.to_vec()), model.get(&a).cloned());
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let got: Vec<Vec<u8>> = postree::map_range(&s, &t, Bound::Included(&lo), Bound::Excluded(&hi)).map(|e| e.unwrap().key.to_vec()).collect();
            let want: Vec<Vec<u8>> = model.range(lo.clone()..hi.clone()).map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(got, want);
            let got: Vec<Vec<u8>> = postree::map_range(&s, &t, Bound::Excluded(&lo), Bound::Included(&hi)).map(|e| e.unwrap().key.to_vec()).collect();
            let want: Vec<Vec<u8>> = model.range((Bound::Excluded(lo.clone()), Bound::Included(hi.clone()))).map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn set_build_update_diff(c in small(),
                             init in prop::collection::btree_set(key_strategy(), 0..700),
                             batches in prop::collection::vec(prop::collection::vec((key_strategy(), any::<bool>()), 0..60), 1..5),
                             probes in prop::collection::vec(key_strategy(), 1..8)) {
        let s = MemoryStore::new();
        let mut model = init;
        let mut t = postree::build_set(&s, &c, &model).unwrap();
        walk_ok(&s, &t);
        for batch in batches {
            let before = t;
            let before_model = model.clone();
            for (k, on) in &batch {
                if *on { model.insert(k.clone()); } else { model.remove(k); }
            }
            t = postree::set_update(&s, &c, &t, batch).unwrap();
            prop_assert_eq!(t, postree::build_set(&s, &c, &model).unwrap());
            walk_ok(&s, &t);
            let got: Vec<(Vec<u8>, bool, bool)> = postree::diff_sorted(&s, &before, &t).unwrap().into_iter()
                .map(|x| (x.key.to_vec(), x.left.is_some(), x.right.is_some())).collect();
            let want: Vec<(Vec<u8>, bool, bool)> = before_model.symmetric_difference(&model)
                .map(|k| (k.clone(), before_model.contains(k), model.contains(k))).collect();
            prop_assert_eq!(got, want);
        }
        let all: Vec<Vec<u8>> = postree::iter(&s, &t).map(|e| e.unwrap().key.to_vec()).collect();
        prop_assert_eq!(all, model.iter().cloned().collect::<Vec<_>>());
        for k in probes {
            prop_assert_eq!(postree::set_contains(&s, &t, &k).unwrap(), model.contains(&k));
            let got: Vec<Vec<u8>> = postree::map_range(&s, &t, Bound::Included(&k), Bound::Unbounded).map(|e| e.unwrap().key.to_vec()).collect();
            let want: Vec<Vec<u8>> = model.range(k.clone()..).cloned().collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn diff_seq_of_unrelated_blobs(c in small(), a in blob_data(8000), b in blob_data(8000)) {
        let s = MemoryStore::new();
        let ta = postree::build_blob(&s, &c, &a).unwrap();
        let tb = postree::build_blob(&s, &c, &b).unwrap();
        let ch = postree::diff_seq(&s, &ta, &tb).unwrap();
        prop_assert_eq!(apply_seq(&a, &ch, &b), b.clone());
        if a == b {
            prop_assert!(ch.is_empty());
        }
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; n];
    r.fill_bytes(&mut v);
    v
}

#[test]
fn small_edit_in_large_blob_writes_few_chunks() {
    let s = MemoryStore::new();
    let c = cfg(256, 256);
    let data = random_bytes(2 << 20, 7);
    let t = postree::build_blob(&s, &c, &data).unwrap();
    assert!(t.height >= 3, "height {}", t.height);
    for (i, off) in [0u64, 1, 777_777, 1 << 20, (2 << 20) - 1]
        .into_iter()
        .enumerate()
    {
        let before = s.stats().unwrap().chunks;
        let t2 = postree::blob_splice(&s, &c, &t, off, 1, &[i as u8 ^ 0x5a, 1, 2]).unwrap();
        let written = s.stats().unwrap().chunks - before;
        assert!(
            written <= 4 * (t.height as u64 + 1),
            "edit at {off} wrote {written} chunks (height {})",
            t.height
        );
        let ch = postree::diff_seq(&s, &t, &t2).unwrap();
        assert_eq!(ch.len(), 1);
        let span = ch[0].a_end - ch[0].a_start;
        assert!(span <= 8 * 256 * 4, "change region of {span} bytes");
    }
    // Appending keeps all but the last leaves and the right spine.
    let before = s.stats().unwrap().chunks;
    postree::blob_splice(&s, &c, &t, t.count, 0, b"tail").unwrap();
    assert!(s.stats().unwrap().chunks - before <= 4 * (t.height as u64 + 1));
}

#[test]
fn small_edit_in_large_map_writes_few_chunks() {
    let s = MemoryStore::new();
    let c = cfg(256, 256);
    let m: BTreeMap<Vec<u8>, Vec<u8>> = (0..20_000u32)
        .map(|i| (format!("key{i:08}").into_bytes(), i.to_le_bytes().to_vec()))
        .collect();
    let t = postree::build_map(&s, &c, &m).unwrap();
    let before = s.stats().unwrap().chunks;
    let t2 = postree::map_update(
        &s,
        &c,
        &t,
        vec![(b"key00012345".to_vec(), Some(b"x".to_vec()))],
    )
    .unwrap();
    let written = s.stats().unwrap().chunks - before;
    assert!(written <= 3 * (t.height as u64 + 1), "wrote {written}");
    let d = postree::diff_sorted(&s, &t, &t2).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].right.as_deref().unwrap(), b"x");
}

fn err_names(e: &Error, cid: &cairn_store::Cid) -> bool {
    e.to_string().contains(&cid.to_hex())
}

/// `copy_blob` over a blob of many windows, on 1 to 4 threads: every slice reads back
/// exactly; a tampered or missing leaf stops it with an error naming the leaf, and nothing
/// it wrote before stopping differs from the blob.
#[test]
fn copy_blob_in_parallel_matches_and_stops_at_damage() {
    let c = cfg(1024, 256);
    let data = random_bytes(6 << 20, 11);
    let s = MemoryStore::new();
    let t = postree::build_blob(&s, &c, &data).unwrap();
    let len = data.len() as u64;
    for workers in [1, 2, 3, 4] {
        for (off, n) in [
            (0, u64::MAX),
            (1, len - 2),
            (len / 3, 3 << 20),
            (len - 5, 100),
            (len, 1),
        ] {
            let end = off.saturating_add(n).min(len);
            let mut got = Vec::new();
            let wrote = postree::copy_blob(&s, &t, off, n, workers, &mut got).unwrap();
            assert_eq!(wrote, end - off, "workers {workers}, slice {off}+{n}");
            assert!(
                got == data[off as usize..end as usize],
                "workers {workers}, slice {off}+{n}"
            );
        }
    }
    // A leaf about two thirds in.
    let mut leaves = Vec::new();
    postree::walk(&s, &t, &mut |cid, bytes| {
        if postree::child_cids(bytes).unwrap().is_empty() {
            leaves.push(*cid);
        }
        Ok(())
    })
    .unwrap();
    let victim = leaves[leaves.len() * 2 / 3];
    let good = s.get(&victim).unwrap().unwrap();
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    s.tamper(&victim, bad);
    for workers in [1, 2, 4] {
        let mut got = Vec::new();
        let e = postree::copy_blob(&s, &t, 0, u64::MAX, workers, &mut got).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt(_)) && err_names(&e, &victim),
            "{e}"
        );
        assert!(got.len() < data.len() && got == data[..got.len()]);
    }
    s.tamper(&victim, good.to_vec());
    s.remove(&[victim]).unwrap();
    let e = postree::copy_blob(&s, &t, 0, u64::MAX, 2, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(e, Error::NotFound(_)) && err_names(&e, &victim),
        "{e}"
    );
    // A writer that fails stops the copy with its error.
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    s.put(&good).unwrap();
    let e = postree::copy_blob(&s, &t, 0, u64::MAX, 2, &mut Full).unwrap_err();
    assert!(e.to_string().contains("disk full"), "{e}");
}

#[test]
fn walk_detects_tampering_and_missing_chunks() {
    let c = cfg(64, 64);
    let data = random_bytes(50_000, 3);
    for kind in [TreeKind::Blob, TreeKind::Map] {
        let s = MemoryStore::new();
        let t = match kind {
            TreeKind::Blob => postree::build_blob(&s, &c, &data).unwrap(),
            _ => postree::build_map(
                &s,
                &c,
                data.chunks(10)
                    .enumerate()
                    .map(|(i, ch)| (format!("{i:06}"), ch.to_vec())),
            )
            .unwrap(),
        };
        assert!(t.height >= 2);
        let mut cids = Vec::new();
        postree::walk(&s, &t, &mut |cid, bytes| {
            assert_eq!(
                postree::child_cids(bytes).unwrap().is_empty(),
                bytes[1] != 2 && bytes[1] != 3
            );
            cids.push(*cid);
            Ok(())
        })
        .unwrap();
        // Every chunk is reachable and distinct chunks are visited once.
        assert_eq!(cids.len(), s.stats().unwrap().chunks as usize);
        let leaf = *cids.last().unwrap();
        let index = cids[1];
        for victim in [leaf, index, t.root] {
            let good = s.get(&victim).unwrap().unwrap();
            let mut bad = good.to_vec();
            let n = bad.len();
            bad[n - 1] ^= 1;
            s.tamper(&victim, bad);
            let e = postree::walk(&s, &t, &mut |_, _| Ok(())).unwrap_err();
            assert!(
                matches!(e, Error::Corrupt(_)) && err_names(&e, &victim),
                "{e}"
            );
            s.tamper(&victim, good.to_vec());
            s.remove(&[victim]).unwrap();
            let e = postree::walk(&s, &t, &mut |_, _| Ok(())).unwrap_err();
            assert!(
                matches!(e, Error::NotFound(_)) && err_names(&e, &victim),
                "{e}"
            );
            s.put(&good).unwrap();
        }
        postree::walk(&s, &t, &mut |_, _| Ok(())).unwrap();
        // A structurally wrong tree whose chunks all verify: wrong count in the TreeRef.
        let wrong = TreeRef {
            count: t.count + 1,
            ..t
        };
        let e = postree::walk(&s, &wrong, &mut |_, _| Ok(())).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt(_)) && err_names(&e, &t.root),
            "{e}"
        );
        let wrong = TreeRef {
            height: t.height + 1,
            ..t
        };
        assert!(matches!(
            postree::walk(&s, &wrong, &mut |_, _| Ok(())),
            Err(Error::Corrupt(_))
        ));
        // A lookup through a damaged chunk fails cleanly instead of panicking.
        let good = s.get(&t.root).unwrap().unwrap();
        s.tamper(&t.root, b"garbage".to_vec());
        assert!(
            matches!(postree::iter(&s, &t).next(), Some(Err(_)) | None) || kind == TreeKind::Blob
        );
        assert!(postree::diff_sorted(&s, &t, &t).is_ok() || kind == TreeKind::Blob);
        s.tamper(&t.root, good.to_vec());
    }
}

#[test]
fn structurally_inconsistent_chunks_are_corrupt() {
    // Valid, correctly hashed chunks that lie: an index entry claims the wrong count.
    let s = MemoryStore::new();
    let c = cfg(64, 64);
    let t = postree::build_list(&s, &c, (0..2000u32).map(|i| i.to_be_bytes())).unwrap();
    let root = s.get(&t.root).unwrap().unwrap();
    let kids = postree::child_cids(&root).unwrap();
    // Rebuild a root whose entries swap two children: counts stay summed but keys/levels hold;
    // then claim a wrong count for the first child.
    let mut bytes = root.to_vec();
    // Entry layout after the 2-byte frame, level byte and varint n: cid (34) then varint count.
    let n_len = 1 + usize::from(kids.len() >= 128);
    let first_count_at = 2 + 1 + n_len + 34;
    bytes[first_count_at] ^= 1;
    let fake = s.put(&bytes).unwrap();
    let bad = TreeRef { root: fake, ..t };
    let e = postree::walk(&s, &bad, &mut |_, _| Ok(())).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    let mut any_err = false;
    for i in [0u64, 1, 500, 1999] {
        any_err |= postree::list_get(&s, &bad, i).is_err();
    }
    let _ = any_err;
    let r: Vec<_> = postree::iter(&s, &bad).collect();
    assert!(r.iter().any(|x| x.is_err()));
}

#[test]
fn input_validation() {
    let s = MemoryStore::new();
    let c = TreeConfig::default();
    let bad = |r: cairn_core::Result<TreeRef>| matches!(r, Err(Error::InvalidInput(_)));
    assert!(bad(postree::build_map(
        &s,
        &c,
        vec![(b"b", b"1"), (b"a", b"2")]
    )));
    assert!(bad(postree::build_map(
        &s,
        &c,
        vec![(b"a", b"1"), (b"a", b"2")]
    )));
    assert!(bad(postree::build_set(&s, &c, vec![b"x", b"x"])));
    let t = postree::build_blob(&s, &c, b"hello").unwrap();
    assert!(bad(postree::blob_splice(&s, &c, &t, 6, 0, b"")));
    assert!(bad(postree::blob_splice(&s, &c, &t, 3, 3, b"")));
    assert!(matches!(
        postree::blob_read(&s, &t, 6, 1),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(postree::blob_read(&s, &t, 5, 10).unwrap(), b"");
    assert_eq!(postree::blob_read(&s, &t, 3, 10).unwrap(), b"lo");
    let l = postree::build_list(&s, &c, [b"a", b"b"]).unwrap();
    assert!(bad(postree::list_splice(&s, &c, &l, 3, 0, &[])));
    assert!(bad(postree::list_splice(&s, &c, &l, 1, 2, &[])));
    assert!(postree::list_range(&s, &l, 3, 4).next().unwrap().is_err());
    assert_eq!(postree::list_get(&s, &l, 2).unwrap(), None);
    // Wrong kinds are type mismatches.
    assert!(matches!(
        postree::map_get(&s, &l, b"a"),
        Err(Error::TypeMismatch(_))
    ));
    assert!(matches!(
        postree::diff_sorted(&s, &l, &l),
        Err(Error::TypeMismatch(_))
    ));
    // TreeRef round trip.
    let mut e = cairn_core::Encoder::new();
    l.encode(&mut e);
    let b = e.finish();
    let mut d = cairn_core::Decoder::new(&b, "t");
    assert_eq!(TreeRef::decode(&mut d).unwrap(), l);
    d.finish().unwrap();
}

#[test]
fn empty_trees() {
    let s = MemoryStore::new();
    let c = cfg(64, 64);
    for kind in [TreeKind::Blob, TreeKind::List, TreeKind::Set, TreeKind::Map] {
        let e = postree::empty(&s, kind).unwrap();
        assert_eq!((e.count, e.height), (0, 0));
        walk_ok(&s, &e);
        let built = match kind {
            TreeKind::Blob => postree::build_blob(&s, &c, b"").unwrap(),
            TreeKind::List => postree::build_list(&s, &c, Vec::<Vec<u8>>::new()).unwrap(),
            TreeKind::Set => postree::build_set(&s, &c, Vec::<Vec<u8>>::new()).unwrap(),
            TreeKind::Map => postree::build_map(&s, &c, Vec::<(Vec<u8>, Vec<u8>)>::new()).unwrap(),
        };
        assert_eq!(built, e);
    }
    // Filling and emptying a tree returns to the empty tree.
    let e = postree::empty(&s, TreeKind::Blob).unwrap();
    let data = random_bytes(5000, 1);
    let t = postree::blob_splice(&s, &c, &e, 0, 0, &data).unwrap();
    assert_eq!(t, postree::build_blob(&s, &c, &data).unwrap());
    assert_eq!(postree::blob_splice(&s, &c, &t, 0, 5000, b"").unwrap(), e);
    let m = postree::empty(&s, TreeKind::Map).unwrap();
    let edits: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..300u32)
        .map(|i| (i.to_be_bytes().to_vec(), Some(vec![1; 9])))
        .collect();
    let t = postree::map_update(&s, &c, &m, edits.clone()).unwrap();
    assert_eq!(t.count, 300);
    let dels = edits.into_iter().map(|(k, _)| (k, None)).collect();
    assert_eq!(postree::map_update(&s, &c, &t, dels).unwrap(), m);
}

#[test]
#[ignore = "throughput measurement; run with --release -- --ignored --nocapture"]
fn blob_build_throughput() {
    let data = random_bytes(512 << 20, 42);
    let c = TreeConfig::default();
    for round in 0..3 {
        let s = MemoryStore::new();
        let t0 = std::time::Instant::now();
        let t = postree::build_blob(&s, &c, &data).unwrap();
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "round {round}: build_blob {} MiB in {dt:.3}s = {:.0} MB/s ({} chunks, height {})",
            data.len() >> 20,
            data.len() as f64 / dt / 1e6,
            s.stats().unwrap().chunks,
            t.height
        );
    }
    // Keeps nothing: isolates the chunking + hashing cost.
    let s = cairn_store::DigestStore::new(cairn_core::HashAlgo::Blake3);
    let t0 = std::time::Instant::now();
    postree::build_blob(&s, &c, &data).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "build_blob into a discarding store: {:.0} MB/s",
        data.len() as f64 / dt / 1e6
    );
    let s = MemoryStore::new();
    let t0 = std::time::Instant::now();
    let mut w = BlobWriter::new(&s, &c);
    for part in data.chunks(1 << 20) {
        w.write_all(part).unwrap();
    }
    w.finish().unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "BlobWriter (1 MiB writes): {:.0} MB/s",
        data.len() as f64 / dt / 1e6
    );
}

#[test]
#[ignore = "component timing"]
fn blob_components_timing() {
    let data = random_bytes(256 << 20, 42);
    let p = 4096usize;
    let (ms, ml) = fastcdc::v2020::select_masks(p, fastcdc::v2020::Normalization::Level1);
    let t0 = std::time::Instant::now();
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let (_, n) = fastcdc::v2020::cut(&data[at..], p / 4, p, p * 8, ms, ml, ms << 1, ml << 1);
        cuts.push((at, n));
        at += n;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!("cdc: {:.0} MB/s", data.len() as f64 / dt / 1e6);
    let t0 = std::time::Instant::now();
    let mut x = 0u8;
    for &(a, n) in &cuts {
        x ^= blake3::hash(&data[a..a + n]).as_bytes()[0];
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "blake3 per chunk: {:.0} MB/s {x}",
        data.len() as f64 / dt / 1e6
    );
    let s = MemoryStore::new();
    let cids: Vec<_> = cuts
        .iter()
        .map(|&(a, n)| s.algo().digest(&data[a..a + n]))
        .collect();
    let s = MemoryStore::new();
    let t0 = std::time::Instant::now();
    for (c, &(a, n)) in cids.iter().zip(&cuts) {
        s.put_hashed(*c, &data[a..a + n]).unwrap();
    }
    let dt = t0.elapsed().as_secs_f64();
    println!("store put: {:.0} MB/s", data.len() as f64 / dt / 1e6);
}

/// Leaf lengths of a tree in order (walk visits chunks depth-first, left to right).
fn leaf_units(s: &MemoryStore, t: &TreeRef) -> Vec<u64> {
    let mut out = Vec::new();
    postree::walk(s, t, &mut |_, bytes| {
        match bytes[1] {
            4 => out.push(bytes.len() as u64 - 2),
            5..=7 => {
                let mut d = cairn_core::Decoder::new(&bytes[2..], "t");
                out.push(d.varint().unwrap());
            }
            _ => {}
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn insert_ending_on_a_boundary_before_the_first_leaf() {
    // An insertion at offset 0 whose last new leaf ends exactly where the old content
    // starts: the old tree is kept whole and the new leaves go in front of it.
    let c = cfg(64, 64);
    let mut hits = 0;
    for seed in 0..3000u64 {
        let s = MemoryStore::new();
        let r = random_bytes(400, seed);
        let d = &r[..10 + (seed % 200) as usize];
        let x = &r[200..200 + 1 + (seed % 190) as usize];
        let td = postree::build_blob(&s, &c, d).unwrap();
        let whole = [x, d].concat();
        let tw = postree::build_blob(&s, &c, &whole).unwrap();
        let mut at = 0;
        let on_boundary = leaf_units(&s, &tw).iter().any(|n| {
            at += n;
            at == x.len() as u64
        });
        hits += on_boundary as u32;
        assert_eq!(
            postree::blob_splice(&s, &c, &td, 0, 0, x).unwrap(),
            tw,
            "seed {seed}"
        );
    }
    assert!(hits > 5, "only {hits} boundary hits");
    let mut hits = 0;
    for seed in 0..3000u64 {
        let s = MemoryStore::new();
        let r = random_bytes(64, seed);
        let d: Vec<&[u8]> = r[..8 * (1 + seed as usize % 6)].chunks(4).collect();
        let x: Vec<Bytes> = r[48..]
            .chunks(2)
            .take(1 + seed as usize % 8)
            .map(Bytes::copy_from_slice)
            .collect();
        let td = postree::build_list(&s, &c, &d).unwrap();
        let mut whole: Vec<&[u8]> = x.iter().map(|b| b.as_ref()).collect();
        whole.extend(d.iter().copied());
        let tw = postree::build_list(&s, &c, &whole).unwrap();
        let mut at = 0;
        hits += leaf_units(&s, &tw).iter().any(|n| {
            at += n;
            at == x.len() as u64
        }) as u32;
        assert_eq!(
            postree::list_splice(&s, &c, &td, 0, 0, &x).unwrap(),
            tw,
            "seed {seed}"
        );
    }
    assert!(hits > 5, "only {hits} boundary hits");
}

#[test]
fn batch_leaving_a_single_node() {
    let s = MemoryStore::new();
    let c = cfg(64, 64);
    let m: BTreeMap<Vec<u8>, Vec<u8>> = (0..3000u32)
        .map(|i| (i.to_be_bytes().to_vec(), vec![i as u8; 5]))
        .collect();
    let t = postree::build_map(&s, &c, &m).unwrap();
    assert!(t.height >= 3);
    for keep in [0u32, 1, 1500, 2999] {
        for change in [false, true] {
            let mut edits: Vec<(Vec<u8>, Option<Vec<u8>>)> = m
                .keys()
                .filter(|k| **k != keep.to_be_bytes())
                .map(|k| (k.clone(), None))
                .collect();
            let v = if change {
                b"new".to_vec()
            } else {
                vec![keep as u8; 5]
            };
            edits.push((keep.to_be_bytes().to_vec(), Some(v.clone())));
            let got = postree::map_update(&s, &c, &t, edits).unwrap();
            let want = postree::build_map(&s, &c, [(keep.to_be_bytes(), v)]).unwrap();
            assert_eq!(got, want, "keep {keep} change {change}");
            walk_ok(&s, &got);
        }
    }
    // Keep a few keys spread over the tree.
    let keep: BTreeSet<u32> = [3, 700, 701, 2500].into();
    let edits = m
        .keys()
        .filter(|k| !keep.contains(&u32::from_be_bytes(k[..4].try_into().unwrap())))
        .map(|k| (k.clone(), None))
        .collect();
    let got = postree::map_update(&s, &c, &t, edits).unwrap();
    let want = postree::build_map(
        &s,
        &c,
        keep.iter().map(|k| (k.to_be_bytes(), vec![*k as u8; 5])),
    )
    .unwrap();
    assert_eq!(got, want);
}

/// Deterministic bytes that do not depend on any crate's generator (splitmix64), with
/// zero runs mixed in so some leaves are cut at the maximum size.
fn golden_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        let x = next();
        if x % 97 == 0 {
            let run = (x >> 8) as usize % 70_000;
            v.resize(v.len() + run, (x >> 40) as u8);
        } else {
            v.extend_from_slice(&x.to_le_bytes());
        }
    }
    v.truncate(n);
    v
}

/// Root cids of fixed inputs, recorded before the blob write path was optimised: cids,
/// chunk framing and POS-tree boundaries must never change, or stored data stops matching.
#[test]
fn golden_roots_are_unchanged() {
    use cairn_core::HashAlgo;
    let data = golden_bytes(3 << 20, 1);
    let elems: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| format!("element-{i:06}-{}", i.wrapping_mul(2_654_435_761)).into_bytes())
        .collect();
    let mut got = Vec::new();
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        for c in [TreeConfig::default(), cfg(64, 64), cfg(1000, 256)] {
            let s = MemoryStore::with_algo(algo);
            for n in [
                0usize,
                1,
                2,
                3,
                100,
                1023,
                1024,
                1025,
                4096,
                70_000,
                3 << 20,
            ] {
                let t = postree::build_blob(&s, &c, &data[..n]).unwrap();
                let mut w = BlobWriter::new(&s, &c);
                for part in data[..n].chunks(77_777) {
                    w.write_all(part).unwrap();
                }
                assert_eq!(w.finish().unwrap(), t);
                got.push(format!("{algo} {c:?} blob {n}: {}", t.root));
            }
            let t = postree::build_list(&s, &c, &elems).unwrap();
            got.push(format!("{algo} {c:?} list: {}", t.root));
            let t = postree::build_map(&s, &c, elems.iter().map(|e| (e, e))).unwrap();
            got.push(format!("{algo} {c:?} map: {}", t.root));
            let t = postree::build_set(&s, &c, &elems).unwrap();
            got.push(format!("{algo} {c:?} set: {}", t.root));
        }
    }
    let blob = "blake3 TreeConfig { leaf_target: 4096, index_target: 4096 } blob 3145728: \
                1e20aa43ea72a80e071bbb0a69b5b61b5c0b0bc96935405973cb52465ec2235e5c0d";
    assert!(
        got.iter().any(|g| g == blob),
        "default 3 MiB blob root changed"
    );
    let joined = got.join("\n");
    let fingerprint = cairn_core::HashAlgo::Sha256
        .digest(joined.as_bytes())
        .to_hex();
    println!("{joined}\nfingerprint {fingerprint}");
    assert_eq!(fingerprint, GOLDEN_FINGERPRINT, "{joined}");
}

const GOLDEN_FINGERPRINT: &str =
    "12205b919527667b411b089d9ad6b2f1f08f3673391a22e4ca525177c84a0a8a12ce";

/// Blobs past two 256 KiB batches are hashed on a second thread: the tree (root, every
/// chunk) is exactly the single-threaded one, for several leaf sizes and write sizes.
#[test]
fn pipelined_blob_writer_builds_the_single_threaded_tree() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let data: Vec<u8> = (0..(3 << 20) + 12_345)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for (leaf, wsize) in [
        (64, 1_000),
        (4096, 77_777),
        (4096, 1 << 20),
        (16_384, 300_001),
    ] {
        let c = cfg(leaf, 4096);
        let want = postree::build_blob(&MemoryStore::new(), &c, &data).unwrap();
        let one = MemoryStore::new();
        let mut w = BlobWriter::new(&one, &c).single_threaded();
        for part in data.chunks(wsize) {
            w.write_all(part).unwrap();
        }
        assert_eq!(w.finish().unwrap(), want, "single-threaded, leaf {leaf}");
        let two = MemoryStore::new();
        let mut w = BlobWriter::new(&two, &c);
        for part in data.chunks(wsize) {
            w.write_all(part).unwrap();
        }
        assert_eq!(w.finish().unwrap(), want, "pipelined, leaf {leaf}");
        walk_ok(&two, &want);
        let (mut a, mut b) = (one.cids().unwrap(), two.cids().unwrap());
        a.sort();
        b.sort();
        assert_eq!(a, b, "the same chunks, leaf {leaf}");
        let mut all = Vec::new();
        BlobReader::new(&two, &want).read_to_end(&mut all).unwrap();
        assert!(all == data, "read back, leaf {leaf}");

        // Leaves stored by the hashing thread, input read straight into the window in
        // reads of `wsize` bytes at most: the same tree and the same chunks.
        let three = Arc::new(MemoryStore::new());
        let shared: Arc<dyn ChunkStore> = three.clone();
        let mut w = BlobWriter::new(&*three, &c).storing_on_pipe(shared);
        let mut input = Dribble {
            data: &data,
            step: wsize,
        };
        while w.read_from(&mut input).unwrap() > 0 {}
        assert_eq!(w.bytes_written(), data.len() as u64);
        assert_eq!(w.finish().unwrap(), want, "stored on the pipe, leaf {leaf}");
        let mut c3 = three.cids().unwrap();
        c3.sort();
        assert_eq!(a, c3, "the same chunks stored on the pipe, leaf {leaf}");
        walk_ok(&three, &want);
    }
}

/// A reader that hands out at most `step` bytes per read.
struct Dribble<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// A store whose puts fail after `budget` chunks, and whose reads fail while
/// `fail_reads` is set.
struct FailingStore {
    inner: MemoryStore,
    budget: AtomicUsize,
    fail_reads: std::sync::atomic::AtomicBool,
}

impl FailingStore {
    fn check_read(&self) -> cairn_core::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(Error::Unavailable("read failed (injected)".into()));
        }
        Ok(())
    }
}

impl ChunkStore for FailingStore {
    fn algo(&self) -> cairn_core::HashAlgo {
        self.inner.algo()
    }
    fn put_hashed(&self, cid: cairn_store::Cid, chunk: &[u8]) -> cairn_core::Result<bool> {
        if self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
            .is_err()
        {
            return Err(Error::Unavailable("disk full (injected)".into()));
        }
        self.inner.put_hashed(cid, chunk)
    }
    fn get(&self, cid: &cairn_store::Cid) -> cairn_core::Result<Option<Bytes>> {
        self.check_read()?;
        self.inner.get(cid)
    }
    fn get_many(&self, cids: &[cairn_store::Cid]) -> cairn_core::Result<Vec<Option<Bytes>>> {
        self.check_read()?;
        self.inner.get_many(cids)
    }
    fn has(&self, cid: &cairn_store::Cid) -> cairn_core::Result<bool> {
        self.inner.has(cid)
    }
    fn cids(&self) -> cairn_core::Result<Vec<cairn_store::Cid>> {
        self.inner.cids()
    }
    fn remove(&self, cids: &[cairn_store::Cid]) -> cairn_core::Result<()> {
        self.inner.remove(cids)
    }
    fn stats(&self) -> cairn_core::Result<cairn_store::StoreStats> {
        self.inner.stats()
    }
}

/// A put that fails on the hashing thread fails the blob write with that error, and no
/// chunk is stored once the writer has returned it.
#[test]
fn a_store_failure_on_the_pipe_thread_fails_the_blob() {
    let data = random_bytes(8 << 20, 7);
    let c = cfg(4096, 4096);
    for budget in [0, 1, 300, 1500] {
        let store = Arc::new(FailingStore {
            inner: MemoryStore::new(),
            budget: AtomicUsize::new(budget),
            fail_reads: Default::default(),
        });
        let shared: Arc<dyn ChunkStore> = store.clone();
        let mut w = BlobWriter::new(&*store, &c).storing_on_pipe(shared);
        let mut input = Dribble {
            data: &data,
            step: 100_000,
        };
        let err = loop {
            match w.read_from(&mut input) {
                Ok(0) => break w.finish().err(),
                Ok(_) => continue,
                Err(e) => {
                    drop(w);
                    break Some(e);
                }
            }
        };
        let err = err.unwrap_or_else(|| panic!("budget {budget}: the write succeeded"));
        assert!(
            err.to_string().contains("disk full (injected)"),
            "budget {budget}: {err}"
        );
        // Every put before the failing one was stored (random data: no chunk repeats).
        let held = store.inner.cids().unwrap().len();
        assert_eq!(held, budget, "budget {budget}: {held} chunks stored");
        // Re-armed, the store would take any put still coming from a hashing thread that
        // outlived the writer: none comes.
        store.budget.store(usize::MAX, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(store.inner.cids().unwrap().len(), held, "budget {budget}");
    }
}

/// An index node whose children's counts add up past `u64::MAX` (saturating to a parent
/// claiming as much) is refused as corrupt by a diff, neither panicking nor wrapping
/// positions (found in review).
#[test]
fn a_diff_refuses_counts_that_overflow() {
    let s = MemoryStore::new();
    let put = |b: &[u8]| {
        let cid = s.algo().digest(b);
        s.put_hashed(cid, b).unwrap();
        cid
    };
    let leaf = put(&[1, 4, b'a']);
    let mut e = cairn_core::Encoder::new();
    e.raw(&[1, 2]).u8(1).varint(2);
    e.hash(&leaf).varint(u64::MAX);
    e.hash(&leaf).varint(1);
    let idx = put(&e.finish());
    let crafted = TreeRef {
        kind: TreeKind::Blob,
        root: idx,
        count: u64::MAX,
        height: 1,
    };
    let other = postree::build_blob(&s, &cfg(64, 64), b"b").unwrap();
    for (x, y) in [(&crafted, &other), (&other, &crafted)] {
        let e = postree::diff_seq(&s, x, y).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
    }
}

/// A deduplicated tree may claim far more leaves than it stores (each index node naming
/// one child twice: 2^40 leaves in 41 chunks). A diff against a small or an empty blob
/// ends at once: once one side is exhausted, the rest of the other is one region, not
/// walked leaf by leaf.
#[test]
fn a_diff_does_not_walk_what_a_deduplicated_tree_claims() {
    let s = MemoryStore::new();
    let put = |b: &[u8]| {
        let cid = s.algo().digest(b);
        s.put_hashed(cid, b).unwrap();
        cid
    };
    let bomb_of = |leaf: u8| {
        let mut child = put(&[1, 4, leaf]);
        let mut count = 1u64;
        for level in 1..=40u8 {
            let mut e = cairn_core::Encoder::new();
            e.raw(&[1, 2]).u8(level).varint(2);
            e.hash(&child).varint(count);
            e.hash(&child).varint(count);
            child = put(&e.finish());
            count *= 2;
        }
        TreeRef {
            kind: TreeKind::Blob,
            root: child,
            count,
            height: 40,
        }
    };
    let bomb = bomb_of(b'a');
    let count = bomb.count;
    let small = postree::build_blob(&s, &cfg(64, 64), b"bb").unwrap();
    let empty = postree::empty(&s, TreeKind::Blob).unwrap();
    for other in [&small, &empty] {
        let d = postree::diff_seq(&s, &bomb, other).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].a_end, d[0].b_end), (count, other.count));
        let d = postree::diff_seq(&s, other, &bomb).unwrap();
        assert_eq!((d[0].a_end, d[0].b_end), (other.count, count));
    }
    // Two such trees that never meet again: the walk gives up after a bounded number of
    // leaves and reports everything as one region.
    let other_bomb = bomb_of(b'b');
    let d = postree::diff_seq(&s, &bomb, &other_bomb).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].a_start, d[0].a_end, d[0].b_start, d[0].b_end),
        (0, count, 0, count)
    );
}

/// A read retried after a failed fetch returns the bytes at its position: the reader's
/// cursor had moved past leaves it never handed out, and the retry used to return bytes
/// from further on, silently.
#[test]
fn a_blob_read_retried_after_a_failed_fetch_reads_the_right_bytes() {
    let s = FailingStore {
        inner: MemoryStore::new(),
        budget: AtomicUsize::new(usize::MAX),
        fail_reads: Default::default(),
    };
    let cfg = TreeConfig {
        leaf_target: 256,
        index_target: 256,
    };
    let data = random_bytes(200_000, 11);
    let t = postree::build_blob(&s, &cfg, &data).unwrap();
    let mut r = BlobReader::new(&s, &t);
    let mut got = vec![0u8; 5_000];
    r.read_exact(&mut got).unwrap();
    // Read on to the end of the leaves fetched ahead, then fail the next fetch.
    let mut at = 5_000usize;
    let mut buf = vec![0u8; 1];
    s.fail_reads.store(true, Ordering::SeqCst);
    let failed = loop {
        match r.read(&mut buf) {
            Ok(n) => {
                assert_eq!(buf[..n], data[at..at + n]);
                at += n;
            }
            Err(_) => break at,
        }
    };
    s.fail_reads.store(false, Ordering::SeqCst);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(
        rest == data[failed..],
        "the retried read is not at offset {failed}"
    );
}

/// Every leaf cut at the size limit: a List of one element repeated, whose hash shows no
/// pattern, so no leaf ends early. Splices at the front, the middle, the end, across the
/// last leaf and down to one leaf give the tree a build of the same list gives.
#[test]
fn edits_of_a_list_cut_only_at_the_size_limit_match_a_rebuild() {
    let s = MemoryStore::new();
    let c = cfg(64, 64);
    // An element that is never a pattern boundary: with 300 copies, leaves hold many.
    let elem = (0u32..1000)
        .map(|i| format!("element {i}").into_bytes())
        .find(|e| {
            let t = postree::build_list(&s, &c, vec![e.clone(); 300]).unwrap();
            let units = leaf_units(&s, &t);
            units.len() > 1 && units[..units.len() - 1].iter().all(|&n| n > 2)
        })
        .expect("some element shows no pattern");
    let n = 600u64;
    let list: Vec<Vec<u8>> = vec![elem.clone(); n as usize];
    let t = postree::build_list(&s, &c, list.clone()).unwrap();
    // Full leaves are all alike, so the walk meets one of them and the last one.
    let units = leaf_units(&s, &t);
    let per_leaf = units[0];
    let last = if n.is_multiple_of(per_leaf) {
        per_leaf
    } else {
        n % per_leaf
    };
    assert!(
        per_leaf > 2 && n / per_leaf >= 8 && t.height >= 2,
        "{units:?} {t:?}"
    );
    let other = Bytes::from_static(b"x");
    let cases: Vec<(u64, u64, Vec<Bytes>)> = vec![
        (0, 0, vec![other.clone()]),
        (0, 1, vec![]),
        (n / 2, 0, vec![Bytes::from(elem.clone())]),
        (n / 2, 3, vec![other.clone(), other.clone()]),
        (n, 0, vec![Bytes::from(elem.clone()); 5]),
        (n - last, last, vec![]),
        (n - per_leaf - 1, per_leaf + 1, vec![other.clone()]),
        (1, n - 1, vec![]),
        (0, n - 1, vec![]),
        (
            per_leaf,
            1,
            vec![Bytes::from(elem.clone()); 3 * per_leaf as usize],
        ),
    ];
    for (index, delete, insert) in cases {
        let got = postree::list_splice(&s, &c, &t, index, delete, &insert).unwrap();
        let mut want = list.clone();
        want.splice(
            index as usize..(index + delete) as usize,
            insert.iter().map(|b| b.to_vec()),
        );
        let rebuilt = postree::build_list(&s, &c, want.clone()).unwrap();
        assert_eq!(
            got,
            rebuilt,
            "splice at {index}, delete {delete}, insert {}",
            insert.len()
        );
        assert_eq!(list_model(&s, &got), want);
        walk_ok(&s, &got);
    }
}
