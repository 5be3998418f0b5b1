//! Verified streams of versions: what a node sends is what a client rebuilds, and any
//! change to the stream (a flipped byte, a missing, extra, reordered or substituted chunk,
//! another version) is refused before the content it carries is handed out.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use cairn_core::Error;
use cairn_object::postree::TreeConfig;
use cairn_object::stream::{FrameReader, Verified, VersionCheck, send_version};
use cairn_object::{At, Db, FObject, NewValue, PutOptions, Target, Uid, Value};
use cairn_store::MemoryStore;

use common::noise;

fn db() -> Db {
    let cfg = TreeConfig {
        leaf_target: 128,
        index_target: 256,
    };
    Db::with_config(Arc::new(MemoryStore::new()), cfg)
}

fn put(db: &Db, key: &str, v: NewValue) -> Uid {
    db.put(
        key.as_bytes(),
        Target::Branch("master"),
        v,
        &PutOptions::default(),
    )
    .unwrap()
}

/// The chunks `send_version` writes for `uid`, one per frame.
fn chunks_of(db: &Db, key: &str, uid: Uid) -> Vec<Bytes> {
    let v = db.get(key.as_bytes(), &At::Uid(uid)).unwrap();
    let mut wire = Vec::new();
    send_version(db.chunks(), &v.object, &mut |b| {
        wire.extend_from_slice(&b);
        Ok(())
    })
    .unwrap();
    let mut r = FrameReader::new(&wire[..]);
    let mut out = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        out.push(c);
    }
    out
}

/// A List of small elements in a store of large leaves has leaves of more than
/// [`cairn_object::stream::MAX_PENDING`] elements (an empty element never cuts a leaf: a
/// 512 KiB target cuts at 4 MiB, 4 Mi elements); its verified stream is taken, as far as a
/// store builds them ([`cairn_object::stream::MAX_LEAF_ELEMENTS`]).
#[test]
fn leaves_of_many_small_elements_stream() {
    let db = Db::with_config(
        Arc::new(MemoryStore::new()),
        TreeConfig {
            leaf_target: 1 << 19,
            index_target: 4096,
        },
    );
    let n = cairn_object::stream::MAX_PENDING + 100_000;
    let uid = put(&db, "l", NewValue::List(vec![Vec::new(); n]));
    let chunks = chunks_of(&db, "l", uid);
    assert_eq!(chunks.len(), 2, "the Meta chunk and one leaf");
    let (_, content) = receive(uid, &chunks).unwrap();
    assert_eq!(content, vec![b'\n'; n]);
}

/// What a client rebuilds from `chunks`: the version and its content (blob bytes, or
/// elements as `key=value` lines), or the first error.
fn receive(uid: Uid, chunks: &[Bytes]) -> Result<(FObject, Vec<u8>), Error> {
    let mut check = VersionCheck::new(uid);
    let mut object = None;
    let mut content = Vec::new();
    for c in chunks {
        match check.accept(c.clone())? {
            Verified::Object(o) => object = Some(o),
            Verified::Index => {}
            Verified::Bytes(b) => content.extend_from_slice(&b),
            Verified::Elements(es) => {
                for e in es {
                    content.extend_from_slice(&e.key);
                    if let Some(v) = e.value {
                        content.push(b'=');
                        content.extend_from_slice(&v);
                    }
                    content.push(b'\n');
                }
            }
        }
    }
    if !check.is_complete()? {
        return Err(Error::corrupt("stream ended early"));
    }
    Ok((object.unwrap(), content))
}

fn lines(items: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in items {
        out.extend_from_slice(&i);
        out.push(b'\n');
    }
    out
}

/// Every type, as (key, uid, the content a client must rebuild).
fn versions(db: &Db) -> Vec<(&'static str, Uid, Vec<u8>)> {
    let blob = noise(40_000, 7);
    let list: Vec<Vec<u8>> = (0..900).map(|i| format!("item {i}").into_bytes()).collect();
    let map: BTreeMap<Vec<u8>, Vec<u8>> = (0..700)
        .map(|i| {
            (
                format!("k{i:05}").into_bytes(),
                format!("v{i}").into_bytes(),
            )
        })
        .collect();
    let set: BTreeSet<Vec<u8>> = (0..800).map(|i| format!("m{i:05}").into_bytes()).collect();
    let map_lines = map
        .iter()
        .map(|(k, v)| [k.as_slice(), b"=", v.as_slice()].concat());
    vec![
        (
            "s",
            put(db, "s", NewValue::String(b"hello".to_vec())),
            vec![],
        ),
        ("i", put(db, "i", NewValue::Integer(-42)), vec![]),
        ("b", put(db, "b", NewValue::Blob(blob.clone())), blob),
        // A run of equal leaves: a repeated subtree is sent (and rebuilt) every time.
        (
            "z",
            put(db, "z", NewValue::Blob(vec![0; 30_000])),
            vec![0; 30_000],
        ),
        ("e", put(db, "e", NewValue::Blob(Vec::new())), vec![]),
        ("l", put(db, "l", NewValue::List(list.clone())), lines(list)),
        (
            "m",
            put(db, "m", NewValue::Map(map.clone())),
            lines(map_lines),
        ),
        ("t", put(db, "t", NewValue::Set(set.clone())), lines(set)),
    ]
}

#[test]
fn every_type_round_trips_verified() {
    let db = db();
    for (key, uid, want) in versions(&db) {
        let chunks = chunks_of(&db, key, uid);
        let (o, got) = receive(uid, &chunks).unwrap();
        assert_eq!(o.uid(uid.algo()), uid, "{key}");
        assert_eq!(o.key.as_ref(), key.as_bytes());
        assert_eq!(got, want, "{key}: content rebuilt from the stream");
        if let Value::Tree(t) = &o.value
            && t.height > 0
        {
            assert!(chunks.len() > 3, "{key}: a multi-level tree");
        }
    }
}

#[test]
fn any_flipped_byte_is_refused() {
    let db = db();
    for (key, uid, _) in versions(&db) {
        let chunks = chunks_of(&db, key, uid);
        for i in 0..chunks.len() {
            for at in [0, chunks[i].len() / 2, chunks[i].len() - 1] {
                let mut bad = chunks.clone();
                let mut c = bad[i].to_vec();
                c[at] ^= 0x20;
                bad[i] = Bytes::from(c);
                let e = receive(uid, &bad).unwrap_err();
                assert!(matches!(e, Error::Corrupt(_)), "{key} chunk {i}: {e}");
            }
        }
    }
}

#[test]
fn missing_extra_reordered_or_foreign_chunks_are_refused() {
    let db = db();
    let all = versions(&db);
    for (key, uid, _) in &all {
        let chunks = chunks_of(&db, key, *uid);
        // Any chunk left out: refused or reported incomplete.
        for i in 0..chunks.len() {
            let mut bad = chunks.clone();
            bad.remove(i);
            assert!(receive(*uid, &bad).is_err(), "{key} without chunk {i}");
        }
        // A chunk sent twice, or one more at the end.
        let mut bad = chunks.clone();
        bad.push(chunks[chunks.len() - 1].clone());
        assert!(
            receive(*uid, &bad).is_err(),
            "{key} with a repeated last chunk"
        );
        if chunks.len() > 2 {
            let mut bad = chunks.clone();
            bad.swap(1, 2);
            let same = bad[1] == bad[2];
            assert!(same || receive(*uid, &bad).is_err(), "{key} reordered");
        }
    }
    // Another version's stream under this uid: refused at its first chunk.
    let (_, b_uid, _) = &all[2];
    let (l_key, l_uid, _) = &all[5];
    let e = receive(*b_uid, &chunks_of(&db, l_key, *l_uid)).unwrap_err();
    assert!(e.to_string().contains("Meta chunk"), "{e}");
    // A node swapping in the tree of another blob under a genuine Meta chunk.
    let (b_key, _, _) = &all[2];
    let mut bad = chunks_of(&db, b_key, *b_uid);
    let other = put(&db, "other", NewValue::Blob(noise(40_000, 8)));
    bad.truncate(1);
    bad.extend(chunks_of(&db, "other", other).into_iter().skip(1));
    assert!(matches!(receive(*b_uid, &bad), Err(Error::Corrupt(_))));
}

#[test]
fn frames_are_bounded_and_cuts_are_errors() {
    let db = db();
    let uid = put(&db, "b", NewValue::Blob(noise(5_000, 3)));
    let v = db.get(b"b", &At::Uid(uid)).unwrap();
    let mut wire = Vec::new();
    send_version(db.chunks(), &v.object, &mut |b| {
        wire.extend_from_slice(&b);
        Ok(())
    })
    .unwrap();
    // Cut anywhere inside a frame: an error, never a clean end.
    let mut ends = vec![0usize];
    let mut at = 0;
    while at < wire.len() {
        let n = u32::from_le_bytes(wire[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + n;
        ends.push(at);
    }
    for cut in 1..wire.len() {
        let mut r = FrameReader::new(&wire[..cut]);
        let mut result = Ok(());
        loop {
            match r.next_chunk() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        assert_eq!(result.is_ok(), ends.contains(&cut), "cut at {cut}");
    }
    // A frame announcing more than the limit is refused before anything is allocated.
    let huge = (u32::MAX).to_le_bytes();
    let e = FrameReader::new(&huge[..]).next_chunk().unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
}

#[test]
fn a_check_bounds_its_memory_and_stays_failed() {
    use cairn_object::postree::TreeCheck;
    let db = db();
    let uid = put(
        &db,
        "l",
        NewValue::List((0..3000).map(|i| format!("e{i}").into_bytes()).collect()),
    );
    let v = db.get(b"l", &At::Uid(uid)).unwrap();
    let t = *v.object.value.tree().unwrap();
    let chunks = chunks_of(&db, "l", uid);
    assert!(t.height >= 2, "a tree of several index levels");
    // A check allowed fewer pending nodes than the tree needs refuses it.
    let mut check = TreeCheck::new(&t, false).with_max_pending(2);
    let mut at = 1;
    let e = loop {
        match check.accept_unverified(&chunks[at]) {
            Ok(_) => at += 1,
            Err(e) => break e,
        }
    };
    let msg = e.to_string();
    assert!(
        msg.contains("waiting to be checked") || msg.contains("entries, more than the 2"),
        "{e}"
    );
    // Failed once, failed for good: no later call reports progress or completion.
    assert!(check.next_cid().is_err());
    assert!(check.is_complete().is_err());
    assert!(check.accept_unverified(&chunks[at + 1]).is_err());
    // A leaf of more elements than allowed is refused before its elements are decoded.
    let mut check = TreeCheck::new(&t, false).with_max_pending(1 << 20);
    let mut leaf_refused = false;
    for c in &chunks[1..] {
        match check.accept_unverified(c) {
            Ok(_) => {}
            Err(e) => {
                panic!("an honest tree was refused: {e}");
            }
        }
    }
    assert!(check.is_complete().unwrap());
    // Leaves of ~600 elements under index nodes of at most 57 entries.
    let wide = Db::with_config(
        Arc::new(MemoryStore::new()),
        TreeConfig {
            leaf_target: 4096,
            index_target: 256,
        },
    );
    let wuid = put(
        &wide,
        "l",
        NewValue::List((0..20_000).map(|i| format!("e{i}").into_bytes()).collect()),
    );
    let wv = wide.get(b"l", &At::Uid(wuid)).unwrap();
    let wchunks = chunks_of(&wide, "l", wuid);
    let mut small =
        TreeCheck::new(wv.object.value.tree().unwrap(), false).with_max_leaf_elements(100);
    for c in &wchunks[1..] {
        if let Err(e) = small.accept_unverified(c) {
            leaf_refused = e.to_string().contains("elements, more than the 100");
            break;
        }
    }
    assert!(leaf_refused, "a leaf of more than 100 elements is refused");
    // After a hash mismatch too.
    let mut check = TreeCheck::new(&t, false);
    assert!(check.accept_unverified(&chunks[2]).is_err());
    assert!(check.accept_unverified(&chunks[1]).is_err(), "stays failed");
}
