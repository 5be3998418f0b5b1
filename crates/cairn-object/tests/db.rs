//! Object-layer tests: ForkBase Table 1 semantics against simple models.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cairn_core::Error;
use cairn_object::postree::{self, TreeConfig};
use cairn_object::{
    At, BuiltinResolver, Db, Diff, DiffCursor, MergeOutcome, NewValue, Op, PutOptions, Target,
    Value, VerifyProgress,
};
use cairn_store::{ChunkStore, MemoryStore};
use proptest::prelude::*;

use common::noise;

fn db() -> (Db, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let cfg = TreeConfig {
        leaf_target: 128,
        index_target: 256,
    };
    (Db::with_config(store.clone(), cfg), store)
}

/// Merges branch `dev` of `key` into `master` with `resolver`.
fn merge_dev(
    db: &Db,
    key: &[u8],
    resolver: &dyn cairn_object::Resolver,
    opts: &PutOptions,
) -> cairn_core::Result<MergeOutcome> {
    db.merge_into(key, "master", &At::Branch("dev".into()), resolver, opts)
}

fn master() -> At {
    At::Branch("master".into())
}

fn put_str(db: &Db, key: &str, target: Target<'_>, v: &str) -> cairn_object::Uid {
    db.put(
        key.as_bytes(),
        target,
        NewValue::String(v.into()),
        &PutOptions::default(),
    )
    .unwrap()
}

fn string_at(db: &Db, key: &str, at: &At) -> String {
    match db.get(key.as_bytes(), at).unwrap().object.value {
        Value::String(b) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("not a string: {other:?}"),
    }
}

fn blob_of(db: &Db, v: &Value) -> Vec<u8> {
    let t = v.tree().unwrap();
    postree::blob_read(db.chunks(), t, 0, t.count).unwrap()
}

#[test]
fn figure3a_fork_on_demand() {
    let (db, _) = db();
    let s1 = put_str(&db, "k", Target::Branch("master"), "S1");
    db.fork(b"k", &master(), "new").unwrap();
    let s2 = put_str(&db, "k", Target::Branch("new"), "S2");
    assert_eq!(string_at(&db, "k", &master()), "S1");
    assert_eq!(string_at(&db, "k", &At::Branch("new".into())), "S2");
    let tagged = db.list_tagged(b"k").unwrap();
    assert_eq!(
        tagged,
        vec![("master".to_string(), s1), ("new".to_string(), s2)]
    );
    assert!(db.list_untagged(b"k").unwrap().is_empty());
    // One branch's head, read alone; a prefix of a branch name is no branch.
    assert_eq!(db.branch_head(b"k", "master").unwrap(), Some(s1));
    assert_eq!(db.branch_head(b"k", "new").unwrap(), Some(s2));
    assert_eq!(db.branch_head(b"k", "ne").unwrap(), None);
    assert_eq!(db.branch_head(b"other", "master").unwrap(), None);
    // Fork from a non-head uid (M12).
    put_str(&db, "k", Target::Branch("master"), "S3");
    db.fork(b"k", &At::Uid(s1), "old").unwrap();
    assert_eq!(string_at(&db, "k", &At::Branch("old".into())), "S1");
    assert!(matches!(
        db.fork(b"k", &master(), "old"),
        Err(Error::AlreadyExists(_))
    ));
}

#[test]
fn figure3b_fork_on_conflict_and_merge_untagged() {
    let (db, _) = db();
    let s1 = put_str(&db, "k", Target::Branch("master"), "S1");
    let s2 = put_str(&db, "k", Target::Base(s1), "S1+W1");
    let s3 = put_str(&db, "k", Target::Base(s1), "S1+W2");
    let heads: BTreeSet<_> = db.list_untagged(b"k").unwrap().into_iter().collect();
    assert_eq!(heads, BTreeSet::from([s2, s3]));
    // Same put again is idempotent (same value and history, same uid).
    assert_eq!(put_str(&db, "k", Target::Base(s1), "S1+W2"), s3);
    assert_eq!(db.list_untagged(b"k").unwrap().len(), 2);
    assert_eq!(db.lca(b"k", &s2, &s3).unwrap(), Some(s1));
    // Unresolved merge writes nothing.
    match db
        .merge_untagged(b"k", &[], &BuiltinResolver::Manual, &PutOptions::default())
        .unwrap()
    {
        MergeOutcome::Conflicts(c) => assert_eq!(c.len(), 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(db.list_untagged(b"k").unwrap().len(), 2);
    let MergeOutcome::Merged(m) = db
        .merge_untagged(b"k", &[], &BuiltinResolver::Append, &PutOptions::default())
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(db.list_untagged(b"k").unwrap(), vec![m]);
    let v = db.get(b"k", &At::Uid(m)).unwrap().object;
    assert_eq!(v.bases.len(), 2);
    // append: one side, then what the other added to the base ("+W1" or "+W2").
    let Value::String(b) = &v.value else { panic!() };
    assert!(&b[..] == b"S1+W1+W2" || &b[..] == b"S1+W2+W1", "{b:?}");
}

#[test]
fn guarded_put() {
    let (db, _) = db();
    let a = put_str(&db, "k", Target::Branch("master"), "a");
    let opts = PutOptions {
        guard: Some(a),
        ..Default::default()
    };
    let b = db
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String("b".into()),
            &opts,
        )
        .unwrap();
    // The guard is stale now: rejected, nothing changes.
    let err = db.put(
        b"k",
        Target::Branch("master"),
        NewValue::String("c".into()),
        &opts,
    );
    assert!(matches!(err, Err(Error::GuardMismatch(_))));
    assert_eq!(db.resolve(b"k", &master()).unwrap(), b);
}

/// A guarded merge is a compare-and-set on the target branch: with a stale guard it
/// changes nothing (before, merges ignored the guard and committed over a head another
/// writer had moved); guards make no sense on a merge of untagged heads and are refused.
#[test]
fn a_guarded_merge_checks_the_target_head() {
    let (db, _) = db();
    let a = put_str(&db, "k", Target::Branch("master"), "a");
    db.fork(b"k", &master(), "dev").unwrap();
    put_str(&db, "k", Target::Branch("dev"), "a\nd");
    let b = put_str(&db, "k", Target::Branch("master"), "b\na");
    let stale = PutOptions {
        guard: Some(a),
        ..Default::default()
    };
    let err = merge_dev(&db, b"k", &BuiltinResolver::Append, &stale);
    assert!(matches!(err, Err(Error::GuardMismatch(_))), "{err:?}");
    assert_eq!(db.resolve(b"k", &master()).unwrap(), b);
    let current = PutOptions {
        guard: Some(b),
        ..Default::default()
    };
    let merged = merge_dev(&db, b"k", &BuiltinResolver::Append, &current).unwrap();
    assert!(matches!(merged, MergeOutcome::Merged(_)), "{merged:?}");
    let err = db.merge_untagged(b"k", &[], &BuiltinResolver::Append, &current);
    assert!(matches!(err, Err(Error::InvalidInput(_))), "{err:?}");
}

/// A guard on a branch (or key) that is not there fails as a guard, for a removal and a
/// merge as for a put (they answered "not found", which an HTTP If-Match on a missing
/// resource is not); unguarded, they are still "not found". Nothing changes.
#[test]
fn a_guard_on_a_missing_branch_is_a_guard_mismatch() {
    let (db, _) = db();
    let a = put_str(&db, "k", Target::Branch("master"), "a");
    db.fork(b"k", &master(), "dev").unwrap();
    let guard = PutOptions {
        guard: Some(a),
        ..Default::default()
    };
    for key in [&b"k"[..], b"no-such-key"] {
        let err = db.remove_guarded(key, "nowhere", Some(&a));
        assert!(matches!(err, Err(Error::GuardMismatch(_))), "{err:?}");
        let err = db.remove_guarded(key, "nowhere", None);
        assert!(matches!(err, Err(Error::NotFound(_))), "{err:?}");
        let dev = At::Branch("dev".into());
        let err = db.merge_into(key, "nowhere", &dev, &BuiltinResolver::Ours, &guard);
        assert!(matches!(err, Err(Error::GuardMismatch(_))), "{err:?}");
        let unguarded = PutOptions::default();
        let err = db.merge_into(key, "nowhere", &dev, &BuiltinResolver::Ours, &unguarded);
        assert!(matches!(err, Err(Error::NotFound(_))), "{err:?}");
    }
    let t = db.table(b"k").unwrap();
    assert_eq!(t.tagged.len(), 2);
    assert!(db.table(b"no-such-key").unwrap().is_empty());
}

/// GC called from a write in progress on the same thread (its commit callback) is refused
/// at once: it waits for every writer to let go, so before it waited for itself for ever.
#[test]
fn gc_inside_a_write_is_refused_not_a_deadlock() {
    let (db, _) = db();
    let mut gc_result = None;
    let uid = db
        .put_blob_stream_then(
            b"k",
            Target::Branch("master"),
            &mut &b"some bytes"[..],
            &mut |_| {},
            &mut || {
                gc_result = Some(db.gc().map(|_| ()));
                Ok(PutOptions::default())
            },
        )
        .unwrap();
    assert!(
        matches!(gc_result, Some(Err(Error::InvalidInput(_)))),
        "{gc_result:?}"
    );
    assert_eq!(db.resolve(b"k", &master()).unwrap(), uid);
    db.gc().unwrap();
}

/// Nor is a GC a head recorder starts from a rename or a remove, which record under the
/// key's lock without a writer's hold: it waited for that lock holding every writer out,
/// and the store hung.
#[test]
fn gc_from_a_rename_or_remove_recorder_is_refused_not_a_deadlock() {
    use cairn_object::{HeadChange, HeadChangeKind, HeadRecorder};
    #[derive(Default)]
    struct GcOnRecord {
        db: std::sync::OnceLock<std::sync::Weak<Db>>,
        results: parking_lot::Mutex<Vec<(HeadChangeKind, bool)>>,
    }
    impl HeadRecorder for GcOnRecord {
        fn record(&self, c: &HeadChange<'_>) -> cairn_core::Result<()> {
            if matches!(c.kind, HeadChangeKind::Rename | HeadChangeKind::Remove)
                && let Some(db) = self.db.get().and_then(std::sync::Weak::upgrade)
            {
                let refused = matches!(db.gc(), Err(Error::InvalidInput(_)));
                self.results.lock().push((c.kind, refused));
            }
            Ok(())
        }
    }
    let recorder = Arc::new(GcOnRecord::default());
    let db = Arc::new(Db::new(Arc::new(MemoryStore::new())).with_recorder(recorder.clone()));
    recorder.db.set(Arc::downgrade(&db)).unwrap();
    let o = PutOptions::default();
    db.put(
        b"k",
        Target::Branch("master"),
        NewValue::String(b"v".to_vec()),
        &o,
    )
    .unwrap();
    db.fork(b"k", &At::Branch("master".into()), "dev").unwrap();
    db.rename(b"k", "dev", "old").unwrap();
    db.remove(b"k", "old").unwrap();
    assert_eq!(
        *recorder.results.lock(),
        vec![
            (HeadChangeKind::Rename, true),
            (HeadChangeKind::Remove, true)
        ]
    );
    db.gc().unwrap();
}

/// A custom resolver can answer a List region or a Tuple with elements, which a text
/// answer (one element per line) cannot carry: an element holding a newline, or one empty
/// element. Elements for a map value leave the conflict open.
#[test]
fn a_resolver_answers_lists_and_tuples_with_elements() {
    struct Elements(Vec<bytes::Bytes>);
    impl cairn_object::Resolver for Elements {
        fn resolve(
            &self,
            _: cairn_object::ValueType,
            _: &cairn_object::Conflict,
        ) -> Option<cairn_object::Resolution> {
            Some(cairn_object::Resolution::Elements(self.0.clone()))
        }
    }
    let (db, _) = db();
    let o = PutOptions::default();
    let answer = Elements(vec!["two\nlines".into(), "".into()]);
    // `key` holds one element on master; master and dev then each put another in its place.
    let conflicting =
        |key: &[u8], make: fn(Vec<Vec<u8>>) -> NewValue, [base, ours, theirs]: [&str; 3]| {
            db.put(key, Target::Branch("master"), make(vec![base.into()]), &o)
                .unwrap();
            db.fork(key, &master(), "dev").unwrap();
            for (branch, v) in [("master", ours), ("dev", theirs)] {
                db.put(key, Target::Branch(branch), make(vec![v.into()]), &o)
                    .unwrap();
            }
        };
    // A list whose one element both sides changed.
    conflicting(b"l", NewValue::List, ["x", "ours", "theirs"]);
    let MergeOutcome::Merged(uid) = merge_dev(&db, b"l", &answer, &o).unwrap() else {
        panic!("the resolver's elements resolve the list");
    };
    let v = db.get(b"l", &At::Uid(uid)).unwrap().object.value;
    assert_eq!(list_of(&db, &v), vec![b"two\nlines".to_vec(), Vec::new()]);
    // A tuple.
    conflicting(b"t", NewValue::Tuple, ["a", "b", "c"]);
    let MergeOutcome::Merged(uid) = merge_dev(&db, b"t", &answer, &o).unwrap() else {
        panic!("the resolver's elements resolve the tuple");
    };
    assert_eq!(
        db.get(b"t", &At::Uid(uid)).unwrap().object.value,
        Value::Tuple(answer.0.clone())
    );
    // A string: elements are not a string's answer.
    put_str(&db, "s", Target::Branch("master"), "a");
    db.fork(b"s", &master(), "dev").unwrap();
    put_str(&db, "s", Target::Branch("master"), "b");
    put_str(&db, "s", Target::Branch("dev"), "c");
    assert!(matches!(
        merge_dev(&db, b"s", &answer, &o).unwrap(),
        MergeOutcome::Conflicts(_)
    ));
}

#[test]
fn errors_change_nothing() {
    let (db, store) = db();
    put_str(&db, "k", Target::Branch("master"), "a");
    let before = store.stats().unwrap();
    assert!(matches!(
        db.get(b"nope", &master()),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        db.get(b"k", &At::Branch("dev".into())),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        db.put(
            b"k",
            Target::Branch("typo"),
            NewValue::String("x".into()),
            &PutOptions::default()
        ),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        db.put(
            b"k",
            Target::Branch("master"),
            NewValue::Integer(1),
            &PutOptions::default()
        ),
        Err(Error::TypeMismatch(_))
    ));
    assert!(matches!(
        db.update(
            b"k",
            Target::Branch("master"),
            Op::Add(1),
            &PutOptions::default()
        ),
        Err(Error::TypeMismatch(_))
    ));
    assert!(matches!(
        db.put(
            b"",
            Target::Branch("master"),
            NewValue::Integer(1),
            &PutOptions::default()
        ),
        Err(Error::InvalidInput(_))
    ));
    assert!(db.fork(b"k", &master(), "bad name").is_err());
    assert_eq!(store.stats().unwrap(), before);
}

#[test]
fn primitive_type_operations() {
    let (db, _) = db();
    let o = PutOptions::default();
    let m = Target::Branch("master");
    db.put(b"s", m, NewValue::String("hello".into()), &o)
        .unwrap();
    db.update(b"s", m, Op::Append(b" world".to_vec()), &o)
        .unwrap();
    db.update(b"s", m, Op::Insert(0, b">> ".to_vec()), &o)
        .unwrap();
    assert_eq!(string_at(&db, "s", &master()), ">> hello world");
    db.put(b"i", m, NewValue::Integer(6), &o).unwrap();
    db.update(b"i", m, Op::Add(1), &o).unwrap();
    db.update(b"i", m, Op::Multiply(6), &o).unwrap();
    assert_eq!(
        db.get(b"i", &master()).unwrap().object.value,
        Value::Integer(42)
    );
    assert!(db.update(b"i", m, Op::Multiply(i64::MAX), &o).is_err());
    db.put(b"t", m, NewValue::Tuple(vec![b"a".to_vec()]), &o)
        .unwrap();
    db.update(b"t", m, Op::Append(b"c".to_vec()), &o).unwrap();
    db.update(b"t", m, Op::Insert(1, b"b".to_vec()), &o)
        .unwrap();
    assert_eq!(
        db.get(b"t", &master()).unwrap().object.value,
        Value::Tuple(vec!["a".into(), "b".into(), "c".into()])
    );
    // A tuple cannot grow past the inline limit a put of it has (16 MiB), by append or
    // insert: the update is refused and the head stays.
    let big = vec![0u8; 6 << 20];
    db.put(
        b"big",
        m,
        NewValue::Tuple(vec![big.clone(), big.clone()]),
        &o,
    )
    .unwrap();
    let head = db.get(b"big", &master()).unwrap().uid;
    for op in [Op::Append(big.clone()), Op::Insert(0, big.clone())] {
        let e = db.update(b"big", m, op, &o).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    }
    assert_eq!(db.get(b"big", &master()).unwrap().uid, head);
    // Nor by a merge: two branches each appending 6 MiB, merged with `append`.
    db.fork(b"big", &At::Branch("master".into()), "dev")
        .unwrap();
    db.update(b"big", m, Op::Append(vec![1u8; 1 << 20]), &o)
        .unwrap();
    db.update(
        b"big",
        Target::Branch("dev"),
        Op::Append(vec![3u8; 1 << 20]),
        &o,
    )
    .unwrap();
    let before = db.get(b"big", &master()).unwrap().uid;
    db.update(
        b"big",
        Target::Branch("dev"),
        Op::Append(vec![2u8; 2 << 20]),
        &o,
    )
    .unwrap();
    let e = merge_dev(&db, b"big", &BuiltinResolver::Append, &o).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert_eq!(db.get(b"big", &master()).unwrap().uid, before);
}

#[test]
fn rename_remove_list_keys_track() {
    let (db, _) = db();
    let v: Vec<_> = (0..5)
        .map(|i| put_str(&db, "k", Target::Branch("master"), &i.to_string()))
        .collect();
    put_str(&db, "other", Target::Branch("master"), "x");
    assert_eq!(
        db.list_keys().unwrap(),
        vec![bytes::Bytes::from("k"), bytes::Bytes::from("other")]
    );
    let t = db.track(b"k", &master(), 1, 3).unwrap();
    assert_eq!(
        t.iter().map(|e| e.uid).collect::<Vec<_>>(),
        vec![v[3], v[2], v[1]]
    );
    assert_eq!(
        t.iter().map(|e| e.distance).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let t = db.track(b"k", &At::Uid(v[2]), 0, 10).unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(t[2].object.depth, 0);
    db.rename(b"k", "master", "main").unwrap();
    assert!(db.get(b"k", &master()).is_err());
    assert_eq!(db.resolve(b"k", &At::Branch("main".into())).unwrap(), v[4]);
    db.remove(b"k", "main").unwrap();
    assert_eq!(db.list_keys().unwrap(), vec![bytes::Bytes::from("other")]);
    assert!(db.remove(b"other", "nope").is_err());
}

#[test]
fn map_merge_per_key_and_resolvers() {
    let (db, _) = db();
    let o = PutOptions::default();
    let m = |pairs: &[(&str, &str)]| NewValue::Map(str_map(pairs));
    db.put(
        b"m",
        Target::Branch("master"),
        m(&[("a", "1"), ("b", "2"), ("c", "3")]),
        &o,
    )
    .unwrap();
    db.fork(b"m", &master(), "dev").unwrap();
    db.update(
        b"m",
        Target::Branch("master"),
        Op::MapUpdate(vec![
            (b"a".to_vec(), Some(b"10".to_vec())),
            (b"d".to_vec(), Some(b"4".to_vec())),
        ]),
        &o,
    )
    .unwrap();
    db.update(
        b"m",
        Target::Branch("dev"),
        Op::MapUpdate(vec![
            (b"b".to_vec(), None),
            (b"a".to_vec(), Some(b"5".to_vec())),
        ]),
        &o,
    )
    .unwrap();
    // a conflicts (10 vs 5); b and d merge cleanly.
    let r = merge_dev(&db, b"m", &BuiltinResolver::Manual, &o).unwrap();
    let MergeOutcome::Conflicts(c) = r else {
        panic!("{r:?}")
    };
    assert_eq!(c.len(), 1);
    let MergeOutcome::Merged(u) = merge_dev(&db, b"m", &BuiltinResolver::Sum, &o).unwrap() else {
        panic!()
    };
    assert_eq!(
        map_at(&db, b"m", &At::Uid(u)),
        [("a", "14"), ("c", "3"), ("d", "4")].map(|(k, v)| (k.to_string(), v.to_string()))
    );
    // Merging again is a no-op.
    assert!(matches!(
        merge_dev(&db, b"m", &BuiltinResolver::Manual, &o).unwrap(),
        MergeOutcome::UpToDate(_)
    ));
}

#[test]
fn fast_forward_merge() {
    let (db, _) = db();
    put_str(&db, "k", Target::Branch("master"), "a");
    db.fork(b"k", &master(), "dev").unwrap();
    let b = put_str(&db, "k", Target::Branch("dev"), "b");
    assert_eq!(
        merge_dev(&db, b"k", &BuiltinResolver::Manual, &PutOptions::default()).unwrap(),
        MergeOutcome::FastForward(b)
    );
    assert_eq!(db.resolve(b"k", &master()).unwrap(), b);
}

#[test]
fn diff_between_versions() {
    let (db, _) = db();
    let o = PutOptions::default();
    let data = noise(50_000, 1);
    let a = db
        .put(
            b"b",
            Target::Branch("master"),
            NewValue::Blob(data.clone()),
            &o,
        )
        .unwrap();
    let b = db
        .update(
            b"b",
            Target::Branch("master"),
            Op::BlobSplice {
                offset: 25_000,
                delete: 3,
                insert: b"xyz!".to_vec(),
            },
            &o,
        )
        .unwrap();
    match db.diff(&a, &b).unwrap() {
        Diff::Seq(changes) => {
            assert!(!changes.is_empty());
            let changed: u64 = changes.iter().map(|c| c.a_end - c.a_start).sum();
            assert!(
                changed < 5_000,
                "diff touched {changed} bytes for a 3-byte edit"
            );
            assert!(
                changes
                    .iter()
                    .all(|c| c.a_start <= 25_000 + 3 && c.a_end >= 25_000)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(db.diff(&a, &a).unwrap(), Diff::Same);
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
}

fn apply(model: &mut Vec<u8>, e: &Edit) -> Op {
    match e {
        Edit::Insert(at, b) => {
            let at = at % (model.len() + 1);
            model.splice(at..at, b.iter().copied());
            Op::BlobSplice {
                offset: at as u64,
                delete: 0,
                insert: b.clone(),
            }
        }
        Edit::Delete(at, n) => {
            let at = at % (model.len() + 1);
            let n = (*n).min(model.len() - at);
            model.drain(at..at + n);
            Op::BlobSplice {
                offset: at as u64,
                delete: n as u64,
                insert: vec![],
            }
        }
    }
}

fn arb_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..40)
        )
            .prop_map(|(a, b)| Edit::Insert(a, b)),
        (any::<usize>(), 1usize..40).prop_map(|(a, n)| Edit::Delete(a, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Blob three-way merge: when the two sides edit regions 2 KB apart (many leaves at
    /// this test's 128-byte leaf target), the merge equals applying both edits to the base.
    #[test]
    fn blob_merge_matches_model(seed in any::<u64>(), e1 in arb_edit(), e2 in arb_edit()) {
        let (db, _) = db();
        let o = PutOptions::default();
        let base = noise(20_000, seed);
        db.put(b"b", Target::Branch("master"), NewValue::Blob(base.clone()), &o).unwrap();
        db.fork(b"b", &master(), "dev").unwrap();
        // Ours edits the first half, theirs the second half: never overlapping.
        let mut ours = base.clone();
        let e1 = match e1 { Edit::Insert(a, b) => Edit::Insert(a % 9_000, b), Edit::Delete(a, n) => Edit::Delete(a % 9_000, n) };
        let e2 = match e2 { Edit::Insert(a, b) => Edit::Insert(11_000 + a % 9_000, b), Edit::Delete(a, n) => Edit::Delete(11_000 + a % 8_900, n) };
        let op1 = apply(&mut ours, &e1);
        let mut theirs = base.clone();
        let op2 = apply(&mut theirs, &e2);
        db.update(b"b", Target::Branch("master"), op1, &o).unwrap();
        db.update(b"b", Target::Branch("dev"), op2, &o).unwrap();
        let out = merge_dev(&db, b"b", &BuiltinResolver::Manual, &o).unwrap();
        let mut expect = base.clone();
        apply(&mut expect, &e2);
        apply(&mut expect, &e1);
        match out {
            MergeOutcome::Merged(u) => {
                let v = db.get(b"b", &At::Uid(u)).unwrap().object.value;
                prop_assert_eq!(blob_of(&db, &v), expect);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    /// Set merges always succeed and equal the model three-way merge.
    #[test]
    fn set_merge_matches_model(
        base in proptest::collection::btree_set(0u16..200, 0..60),
        add1 in proptest::collection::btree_set(0u16..200, 0..20),
        del1 in proptest::collection::btree_set(0u16..200, 0..20),
        add2 in proptest::collection::btree_set(0u16..200, 0..20),
        del2 in proptest::collection::btree_set(0u16..200, 0..20),
    ) {
        let (db, _) = db();
        let o = PutOptions::default();
        let enc = |x: &u16| x.to_be_bytes().to_vec();
        db.put(b"s", Target::Branch("master"), NewValue::Set(base.iter().map(enc).collect()), &o).unwrap();
        db.fork(b"s", &master(), "dev").unwrap();
        let edits = |add: &BTreeSet<u16>, del: &BTreeSet<u16>| -> Vec<(Vec<u8>, bool)> {
            add.iter().map(|x| (enc(x), true)).chain(del.iter().filter(|x| !add.contains(x)).map(|x| (enc(x), false))).collect()
        };
        db.update(b"s", Target::Branch("master"), Op::SetUpdate(edits(&add1, &del1)), &o).unwrap();
        db.update(b"s", Target::Branch("dev"), Op::SetUpdate(edits(&add2, &del2)), &o).unwrap();
        let side = |add: &BTreeSet<u16>, del: &BTreeSet<u16>| -> BTreeSet<u16> {
            base.iter().copied().filter(|x| !del.contains(x) || add.contains(x)).chain(add.iter().copied()).collect()
        };
        let (s1, s2) = (side(&add1, &del1), side(&add2, &del2));
        // Three-way: keep x if (in s1 and in s2) or (changed on one side to present).
        let all: BTreeSet<u16> = base.iter().chain(s1.iter()).chain(s2.iter()).copied().collect();
        let want: BTreeSet<u16> = all.into_iter().filter(|x| {
            let b = base.contains(x);
            let (a1, a2) = (s1.contains(x), s2.contains(x));
            if a1 == b { a2 } else { a1 }
        }).collect();
        let out = merge_dev(&db, b"s", &BuiltinResolver::Manual, &o).unwrap();
        let uid = match out { MergeOutcome::Merged(u) | MergeOutcome::FastForward(u) | MergeOutcome::UpToDate(u) => u, c => panic!("{c:?}") };
        let t = *db.get(b"s", &At::Uid(uid)).unwrap().object.value.tree().unwrap();
        let got: BTreeSet<u16> = postree::iter(db.chunks(), &t).map(|e| { let k = e.unwrap().key; u16::from_be_bytes([k[0], k[1]]) }).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn verify_names_damage_and_gc_keeps_history() {
    let (db, store) = db();
    let o = PutOptions::default();
    let data = noise(30_000, 3);
    let v1 = db
        .put(
            b"doc",
            Target::Branch("master"),
            NewValue::Blob(data.clone()),
            &o,
        )
        .unwrap();
    let v2 = db
        .update(
            b"doc",
            Target::Branch("master"),
            Op::BlobSplice {
                offset: 10,
                delete: 5,
                insert: vec![],
            },
            &o,
        )
        .unwrap();
    put_str(&db, "tmp", Target::Branch("master"), "garbage soon");
    assert!(db.verify(None, &mut |_, _| {}).unwrap().is_intact());
    // GC after removing "tmp" reclaims its chunk but keeps every version of doc.
    db.remove(b"tmp", "master").unwrap();
    let before = store.stats().unwrap().chunks;
    let r = db.gc().unwrap();
    assert_eq!(r.removed, 1);
    assert_eq!(store.stats().unwrap().chunks, before - 1);
    assert_eq!(
        blob_of(&db, &db.get(b"doc", &At::Uid(v1)).unwrap().object.value),
        data
    );
    assert!(db.verify(None, &mut |_, _| {}).unwrap().is_intact());
    // Damage one leaf of v1's tree: verify names the key and the damaged version.
    let t = *db
        .get(b"doc", &At::Uid(v1))
        .unwrap()
        .object
        .value
        .tree()
        .unwrap();
    let mut leaves = Vec::new();
    postree::walk(db.chunks(), &t, &mut |cid, bytes| {
        if postree::child_cids(bytes)?.is_empty() {
            leaves.push(*cid);
        }
        Ok(())
    })
    .unwrap();
    let victim = *leaves.last().unwrap();
    let mut bytes = store.get(&victim).unwrap().unwrap().to_vec();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    assert!(store.tamper(&victim, bytes));
    let report = db.verify(Some(b"doc"), &mut |_, _| {}).unwrap();
    assert!(!report.is_intact());
    let text = report
        .damage
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("\"doc\""), "{text}");
    assert!(text.contains(&victim.to_hex()), "{text}");
    assert!(
        text.contains(&v1.to_hex()) || text.contains(&v2.to_hex()),
        "{text}"
    );
    // GC refuses to delete anything from a damaged store.
    assert!(db.gc().is_err());
}

#[test]
fn history_independent_values() {
    let (db, _) = db();
    let o = PutOptions::default();
    // Build a map by edits in one order on one key and at once on another: same root.
    let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..500u32)
        .map(|i| (format!("k{i:05}").into_bytes(), vec![i as u8; 20]))
        .collect();
    db.put(
        b"a",
        Target::Branch("master"),
        NewValue::Map(BTreeMap::new()),
        &o,
    )
    .unwrap();
    for chunk in entries.chunks(37).rev() {
        db.update(
            b"a",
            Target::Branch("master"),
            Op::MapUpdate(
                chunk
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect(),
            ),
            &o,
        )
        .unwrap();
    }
    db.put(
        b"b",
        Target::Branch("master"),
        NewValue::Map(entries.into_iter().collect()),
        &o,
    )
    .unwrap();
    let ta = *db
        .get(b"a", &master())
        .unwrap()
        .object
        .value
        .tree()
        .unwrap();
    let tb = *db
        .get(b"b", &master())
        .unwrap()
        .object
        .value
        .tree()
        .unwrap();
    assert_eq!(ta.root, tb.root);
}

#[test]
fn concurrent_writers_on_distinct_and_shared_keys() {
    let (db, _) = db();
    db.put(
        b"shared",
        Target::Branch("master"),
        NewValue::Integer(0),
        &PutOptions::default(),
    )
    .unwrap();
    let db = Arc::new(db);
    std::thread::scope(|s| {
        for t in 0..8 {
            let db = db.clone();
            s.spawn(move || {
                for i in 0..50 {
                    put_str(
                        &db,
                        &format!("own{t}"),
                        Target::Branch("master"),
                        &i.to_string(),
                    );
                    db.update(
                        b"shared",
                        Target::Branch("master"),
                        Op::Add(1),
                        &PutOptions::default(),
                    )
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(
        db.get(b"shared", &master()).unwrap().object.value,
        Value::Integer(400)
    );
    assert_eq!(db.track(b"own3", &master(), 0, 1000).unwrap().len(), 50);
}

/// A map of the given string pairs, as bytes.
fn str_map(pairs: &[(&str, &str)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn list_of(db: &Db, v: &Value) -> Vec<Vec<u8>> {
    postree::iter(db.chunks(), v.tree().unwrap())
        .map(|e| e.unwrap().key.to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// List three-way merge against a Vec model: element edits separated by at least one
    /// untouched element always merge, whatever the leaf boundaries, and give both edits.
    #[test]
    fn list_merge_matches_model(
        n in 0usize..1500,
        a in any::<u16>(), da in 0usize..4, ia in 0usize..60,
        gap in 1usize..400, db_ in 0usize..4, ib in 0usize..60,
        theirs_first in any::<bool>(),
    ) {
        let (db, _) = db();
        let o = PutOptions::default();
        let base: Vec<Vec<u8>> = (0..n).map(|i| format!("e{i}").into_bytes()).collect();
        let pa = if n == 0 { 0 } else { a as usize % (n + 1) };
        let da = da.min(n - pa);
        let pb = pa + da + gap;
        prop_assume!(pb <= n);
        let db_ = db_.min(n - pb);
        let ins_a: Vec<Vec<u8>> = (0..ia).map(|k| format!("a{k}").into_bytes()).collect();
        let ins_b: Vec<Vec<u8>> = (0..ib).map(|k| format!("b{k}").into_bytes()).collect();
        let mut expect = base.clone();
        expect.splice(pb..pb + db_, ins_b.iter().cloned());
        expect.splice(pa..pa + da, ins_a.iter().cloned());
        db.put(b"l", Target::Branch("master"), NewValue::List(base.clone()), &o).unwrap();
        db.fork(b"l", &master(), "dev").unwrap();
        let ea = Op::ListSplice { index: pa as u64, delete: da as u64, insert: ins_a };
        let eb = Op::ListSplice { index: pb as u64, delete: db_ as u64, insert: ins_b };
        let (mine, theirs) = if theirs_first { (eb, ea) } else { (ea, eb) };
        db.update(b"l", Target::Branch("master"), mine, &o).unwrap();
        db.update(b"l", Target::Branch("dev"), theirs, &o).unwrap();
        let out = merge_dev(&db, b"l", &BuiltinResolver::Manual, &o).unwrap();
        let uid = match out {
            MergeOutcome::Merged(u) | MergeOutcome::FastForward(u) | MergeOutcome::UpToDate(u) => u,
            MergeOutcome::Conflicts(c) => { prop_assert!(false, "conflict on disjoint edits: {:?}", c); unreachable!() }
        };
        prop_assert_eq!(list_of(&db, &db.get(b"l", &At::Uid(uid)).unwrap().object.value), expect);
    }
}

/// Several edits a side, interleaved with the other side's in one leaf (so one region):
/// each side's edits that overlap none of the other's are all kept, whatever resolves the
/// parts where both edited (before, the whole region went to the resolver as one
/// conflict, so `Theirs` dropped ours' other edits and `Manual` reported edits that did
/// not overlap).
#[test]
fn interleaved_edits_in_one_region_each_survive() {
    let o = PutOptions::default();
    let base: Vec<Vec<u8>> = (0..100).map(|i| format!("e{i}").into_bytes()).collect();
    let set = |db: &Db, branch: &str, at: u64, v: &str| {
        let splice = Op::ListSplice {
            index: at,
            delete: 1,
            insert: vec![v.as_bytes().to_vec()],
        };
        // Each side's own context, so the same edit on both sides makes two versions.
        let opts = PutOptions {
            context: branch.as_bytes().to_vec(),
            ..PutOptions::default()
        };
        db.update(b"l", Target::Branch(branch), splice, &opts)
            .unwrap();
    };
    let merged = |resolver: BuiltinResolver, edits: &[(&str, u64, &str)]| {
        let (db, _) = db();
        db.put(
            b"l",
            Target::Branch("master"),
            NewValue::List(base.clone()),
            &o,
        )
        .unwrap();
        db.fork(b"l", &master(), "dev").unwrap();
        for (branch, at, v) in edits {
            set(&db, branch, *at, v);
        }
        match merge_dev(&db, b"l", &resolver, &o).unwrap() {
            MergeOutcome::Merged(u) => Ok(list_of(
                &db,
                &db.get(b"l", &At::Uid(u)).unwrap().object.value,
            )),
            MergeOutcome::Conflicts(c) => Err(c),
            other => panic!("{other:?}"),
        }
    };
    let with = |changes: &[(usize, &str)]| {
        let mut v = base.clone();
        for (i, x) in changes {
            v[*i] = x.as_bytes().to_vec();
        }
        v
    };
    // Ours at 10 and 50, theirs at 30: no conflict at all.
    let edits = [("master", 10, "O1"), ("master", 50, "O2"), ("dev", 30, "T")];
    for r in [
        BuiltinResolver::Manual,
        BuiltinResolver::Theirs,
        BuiltinResolver::Ours,
    ] {
        assert_eq!(
            merged(r, &edits).unwrap(),
            with(&[(10, "O1"), (30, "T"), (50, "O2")]),
            "{r:?}"
        );
    }
    // Both made the same edit at 10 and ours another at 50: agreed, no conflict.
    let edits = [("master", 10, "X"), ("master", 50, "O"), ("dev", 10, "X")];
    assert_eq!(
        merged(BuiltinResolver::Manual, &edits).unwrap(),
        with(&[(10, "X"), (50, "O")])
    );
    // A real conflict at 30 beside edits elsewhere: only 30 is reported, and Theirs or
    // Ours settles just that element.
    let edits = [
        ("master", 10, "O1"),
        ("master", 30, "O3"),
        ("dev", 30, "T3"),
        ("dev", 70, "T7"),
    ];
    let c = merged(BuiltinResolver::Manual, &edits).unwrap_err();
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(
        matches!(
            c[0].at,
            cairn_object::ConflictAt::Range { start: 30, end: 31 }
        ),
        "{:?}",
        c[0].at
    );
    assert_eq!(
        merged(BuiltinResolver::Theirs, &edits).unwrap(),
        with(&[(10, "O1"), (30, "T3"), (70, "T7")])
    );
    assert_eq!(
        merged(BuiltinResolver::Ours, &edits).unwrap(),
        with(&[(10, "O1"), (30, "O3"), (70, "T7")])
    );
}

/// Union keeps an element both sides hold: theirs moved X from the front to the back
/// while both changed B. X's removal at the front is theirs alone (agreed), so X must come
/// back with their conflicting part (it was looked for in ours' whole region, found at
/// the front that the merge drops, and left out).
#[test]
fn union_keeps_an_element_moved_by_one_side() {
    let (db, _) = db();
    let o = PutOptions::default();
    let put = |branch: &str, v: &[&str], ctx: &str| {
        let opts = PutOptions {
            context: ctx.as_bytes().to_vec(),
            ..PutOptions::default()
        };
        db.put(
            b"l",
            Target::Branch(branch),
            NewValue::List(items(v)),
            &opts,
        )
        .unwrap();
    };
    put("master", &["X", "P", "Q", "B", "C"], "base");
    db.fork(b"l", &master(), "dev").unwrap();
    put("master", &["X", "P", "Q", "B1", "C"], "ours");
    put("dev", &["P", "Q", "B2", "X", "C"], "theirs");
    let r = merge_dev(&db, b"l", &BuiltinResolver::Union, &o).unwrap();
    let MergeOutcome::Merged(u) = r else {
        panic!("{r:?}")
    };
    let got = list_of(&db, &db.get(b"l", &At::Uid(u)).unwrap().object.value);
    assert_eq!(got, items(&["P", "Q", "B1", "B2", "X", "C"]));
}

#[test]
fn nearby_blob_edits_in_one_leaf_merge() {
    let (db, _) = db();
    let o = PutOptions::default();
    let cfg_db = Db::new(Arc::new(MemoryStore::new()));
    for d in [&db, &cfg_db] {
        let base = noise(200_000, 9);
        d.put(
            b"b",
            Target::Branch("master"),
            NewValue::Blob(base.clone()),
            &o,
        )
        .unwrap();
        d.fork(b"b", &master(), "dev").unwrap();
        d.update(
            b"b",
            Target::Branch("master"),
            Op::BlobSplice {
                offset: 10,
                delete: 1,
                insert: b"O".to_vec(),
            },
            &o,
        )
        .unwrap();
        d.update(
            b"b",
            Target::Branch("dev"),
            Op::BlobSplice {
                offset: 1500,
                delete: 1,
                insert: b"T".to_vec(),
            },
            &o,
        )
        .unwrap();
        let MergeOutcome::Merged(u) = merge_dev(d, b"b", &BuiltinResolver::Manual, &o).unwrap()
        else {
            panic!("edits 1490 bytes apart must merge")
        };
        let mut expect = base;
        expect[10] = b'O';
        expect[1500] = b'T';
        assert_eq!(
            blob_of(d, &d.get(b"b", &At::Uid(u)).unwrap().object.value),
            expect
        );
    }
}

#[test]
fn append_resolver_does_not_repeat_the_base() {
    let (db, _) = db();
    let o = PutOptions::default();
    put_str(&db, "s", Target::Branch("master"), "base");
    db.fork(b"s", &master(), "dev").unwrap();
    db.update(
        b"s",
        Target::Branch("master"),
        Op::Append(b"AA2".to_vec()),
        &o,
    )
    .unwrap();
    db.update(b"s", Target::Branch("dev"), Op::Append(b"BB2".to_vec()), &o)
        .unwrap();
    merge_dev(&db, b"s", &BuiltinResolver::Append, &o).unwrap();
    assert_eq!(string_at(&db, "s", &master()), "baseAA2BB2");
    // Blob: both append at the end of one leaf.
    let base = noise(200_000, 4);
    db.put(
        b"b",
        Target::Branch("master"),
        NewValue::Blob(base.clone()),
        &o,
    )
    .unwrap();
    db.fork(b"b", &master(), "dev").unwrap();
    db.update(
        b"b",
        Target::Branch("master"),
        Op::BlobSplice {
            offset: 200_000,
            delete: 0,
            insert: b"abc".to_vec(),
        },
        &o,
    )
    .unwrap();
    db.update(
        b"b",
        Target::Branch("dev"),
        Op::BlobSplice {
            offset: 200_000,
            delete: 0,
            insert: b"xyz".to_vec(),
        },
        &o,
    )
    .unwrap();
    let out = merge_dev(&db, b"b", &BuiltinResolver::Manual, &o).unwrap();
    assert!(
        matches!(out, MergeOutcome::Conflicts(_)),
        "two appends at one point conflict"
    );
    let MergeOutcome::Merged(u) = merge_dev(&db, b"b", &BuiltinResolver::Append, &o).unwrap()
    else {
        panic!()
    };
    let mut expect = base;
    expect.extend_from_slice(b"abcxyz");
    assert_eq!(
        blob_of(&db, &db.get(b"b", &At::Uid(u)).unwrap().object.value),
        expect
    );
}

#[test]
fn unrelated_histories_conflict_instead_of_dropping_a_side() {
    let (db, _) = db();
    let empty = Value::Tree(postree::empty(db.chunks(), cairn_object::TreeKind::List).unwrap());
    let value_of = |k: &[u8], v: NewValue| {
        db.put(k, Target::Branch("master"), v, &PutOptions::default())
            .unwrap();
        db.get(k, &master()).unwrap().object.value
    };
    let a = value_of(b"x", NewValue::List(vec![b"a".to_vec()]));
    let b = value_of(b"y", NewValue::List(vec![b"b".to_vec()]));
    assert!(
        db.merge_values(&empty, &a, &b, &BuiltinResolver::Manual)
            .unwrap()
            .is_err()
    );
    let merged = db
        .merge_values(&empty, &a, &b, &BuiltinResolver::Append)
        .unwrap()
        .unwrap();
    assert_eq!(list_of(&db, &merged), vec![b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn merge_untagged_takes_only_untagged_heads() {
    let (db, _) = db();
    let v1 = put_str(&db, "k", Target::Branch("master"), "1");
    let v2 = put_str(&db, "k", Target::Base(v1), "2");
    put_str(&db, "k", Target::Base(v1), "3");
    let err = db.merge_untagged(
        b"k",
        &[v1, v1],
        &BuiltinResolver::Ours,
        &PutOptions::default(),
    );
    assert!(matches!(err, Err(Error::InvalidInput(_))));
    // One untagged head named twice is not a merge (it used to answer with that head).
    let heads = db.list_untagged(b"k").unwrap();
    let err = db.merge_untagged(
        b"k",
        &[v2, v2],
        &BuiltinResolver::Ours,
        &PutOptions::default(),
    );
    assert!(
        matches!(&err, Err(Error::InvalidInput(m)) if m.contains("named twice")),
        "{err:?}"
    );
    assert_eq!(db.list_untagged(b"k").unwrap(), heads);
}

#[test]
fn keys_with_zero_bytes_and_shared_prefixes_stay_apart() {
    let (db, _) = db();
    let keys: [&[u8]; 5] = [b"a", b"a\x00", b"a\x00\x01t", b"a\x00b", b"ab"];
    for (i, k) in keys.iter().enumerate() {
        db.put(
            k,
            Target::Branch("master"),
            NewValue::Integer(i as i64),
            &PutOptions::default(),
        )
        .unwrap();
    }
    db.fork(b"a", &master(), "dev").unwrap();
    let listed: Vec<Vec<u8>> = db
        .list_keys()
        .unwrap()
        .into_iter()
        .map(|k| k.to_vec())
        .collect();
    let mut want: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    want.sort();
    assert_eq!(listed, want);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            db.get(k, &master()).unwrap().object.value,
            Value::Integer(i as i64)
        );
        assert_eq!(db.list_tagged(k).unwrap().len(), if i == 0 { 2 } else { 1 });
    }
}

/// Keys a page at a time give exactly `list_keys`, whatever the page size, with keys that
/// are prefixes of one another, hold NUL and 0xFF bytes, and have several heads each; in
/// the memory store and in the embedded log.
#[test]
fn key_pages_match_the_whole_listing() {
    let mem: Arc<dyn cairn_store::Store> = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn cairn_store::Store> = Arc::new(
        cairn_store::LogStore::open(dir.path(), cairn_store::LogStoreOptions::default()).unwrap(),
    );
    let keys: Vec<&[u8]> = vec![
        b"a", b"a\0", b"a\0\0", b"a\0b", b"a\x01", b"ab", b"b", b"\0", b"\0\xff", b"\xff",
        b"\xff\0", b"z/1", b"z/2", b"z/10",
    ];
    for store in [mem, log] {
        let db = Db::new(store).for_bucket("pages").unwrap();
        for (i, k) in keys.iter().enumerate() {
            let v = NewValue::Integer(i as i64);
            let u = db
                .put(k, Target::Branch("master"), v, &PutOptions::default())
                .unwrap();
            // Extra heads: tagged branches and an untagged one.
            for b in 0..(i % 4) {
                db.fork(k, &At::Uid(u), &format!("br{b}")).unwrap();
            }
            if i % 3 == 0 {
                db.put(
                    k,
                    Target::Base(u),
                    NewValue::Integer(-1),
                    &PutOptions::default(),
                )
                .unwrap();
            }
        }
        let all = db.list_keys().unwrap();
        assert_eq!(all.len(), keys.len());
        for limit in [1, 2, 3, 5, 13, 14, 15, 100] {
            let mut got = Vec::new();
            let mut after: Option<bytes::Bytes> = None;
            loop {
                let (page, more) = db.list_keys_page(after.as_deref(), limit).unwrap();
                assert!(page.len() <= limit);
                assert!(!page.is_empty() || !more);
                got.extend(page.iter().cloned());
                if !more {
                    break;
                }
                after = page.last().cloned();
            }
            assert_eq!(got, all, "limit {limit}");
        }
        // A cursor that names no key starts after where it would sort.
        let (page, _) = db.list_keys_page(Some(b"a\0a"), 2).unwrap();
        assert_eq!(
            page,
            vec![
                bytes::Bytes::from_static(b"a\0b"),
                bytes::Bytes::from_static(b"a\x01")
            ]
        );
        let (page, more) = db.list_keys_page(Some(b"\xff\xff"), 10).unwrap();
        assert!(page.is_empty() && !more);
    }
}

/// A merge holds at most the Db's merge memory: past it, it fails with a clear error and
/// moves no head; with room, the same merge goes through. Blob regions and Map changes
/// alike.
#[test]
fn merges_past_their_memory_fail_cleanly_and_change_nothing() {
    let store = Arc::new(MemoryStore::new());
    let o = PutOptions::default();
    let roomy = Db::new(store.clone());
    let tight = roomy
        .for_bucket(roomy.bucket())
        .unwrap()
        .with_merge_memory(200_000);
    // Blob: both sides append 300 KB of their own (one conflicting region at the end,
    // settled by the append resolver), so the merge must read both appends.
    let base = noise(100_000, 1);
    roomy
        .put(b"blob", Target::Branch("master"), NewValue::Blob(base), &o)
        .unwrap();
    roomy.fork(b"blob", &master(), "dev").unwrap();
    for (branch, seed) in [("master", 4), ("dev", 7)] {
        roomy
            .update(
                b"blob",
                Target::Branch(branch),
                Op::BlobSplice {
                    offset: 100_000,
                    delete: 0,
                    insert: noise(300_000, seed),
                },
                &o,
            )
            .unwrap();
    }
    // Map: both sides set the same 3,000 keys to different 100-byte values.
    roomy
        .put(
            b"map",
            Target::Branch("master"),
            NewValue::Map(BTreeMap::new()),
            &o,
        )
        .unwrap();
    roomy.fork(b"map", &master(), "dev").unwrap();
    for (branch, fill) in [("master", b'o'), ("dev", b't')] {
        let entries: BTreeMap<Vec<u8>, Vec<u8>> = (0..3000)
            .map(|i| (format!("k{i:05}").into_bytes(), vec![fill; 100]))
            .collect();
        roomy
            .put(b"map", Target::Branch(branch), NewValue::Map(entries), &o)
            .unwrap();
    }
    for (key, resolver) in [
        (&b"blob"[..], BuiltinResolver::Append),
        (&b"map"[..], BuiltinResolver::Theirs),
    ] {
        let before = roomy.get(key, &master()).unwrap().uid;
        let e = merge_dev(&tight, key, &resolver, &o).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidInput(m) if m.contains("in memory") && m.contains("nothing was written")),
            "{e}"
        );
        assert_eq!(roomy.get(key, &master()).unwrap().uid, before);
        let MergeOutcome::Merged(u) = merge_dev(&roomy, key, &resolver, &o).unwrap() else {
            panic!("the merge fits the default memory")
        };
        assert_eq!(roomy.get(key, &master()).unwrap().uid, u);
    }
    let merged = roomy.get(b"blob", &master()).unwrap();
    let Value::Tree(t) = merged.object.value else {
        panic!("a blob")
    };
    assert_eq!(t.count, 700_000);
}

/// All pages of a diff, followed through their cursors (each cursor also through its text
/// form).
fn diff_pages(db: &Db, a: &Value, b: &Value, limit: usize) -> (Diff, usize) {
    let (mut sorted, mut seq, mut pages) = (Vec::new(), Vec::new(), 0);
    let mut after: Option<DiffCursor> = None;
    loop {
        let (d, next) = db.diff_values_page(a, b, after.as_ref(), limit).unwrap();
        pages += 1;
        match d {
            Diff::Sorted(c) => {
                assert!(c.len() <= limit);
                sorted.extend(c)
            }
            Diff::Seq(c) => {
                assert!(c.len() <= limit);
                seq.extend(c)
            }
            other => return (other, pages),
        }
        match next {
            None => break,
            Some(c) => after = Some(DiffCursor::parse(&c.token()).unwrap()),
        }
    }
    if sorted.is_empty() && !seq.is_empty() {
        (Diff::Seq(seq), pages)
    } else if seq.is_empty() && !sorted.is_empty() {
        (Diff::Sorted(sorted), pages)
    } else {
        panic!("a diff of trees that differ has changes of one kind")
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Paging a diff (any page size) gives exactly the whole diff, for Maps and Blobs.
    #[test]
    fn diff_pages_add_up_to_the_whole_diff(
        seed in any::<u64>(),
        map_edits in proptest::collection::vec((0u32..3000, proptest::option::of(0u8..4)), 1..60),
        blob_edits in proptest::collection::vec((0usize..60_000, 0usize..300, 0usize..300), 1..12),
        limit in 1usize..9,
    ) {
        let (db, _) = db();
        let o = PutOptions::default();
        let base: BTreeMap<Vec<u8>, Vec<u8>> = (0..3000u32)
            .map(|i| (format!("k{i:05}").into_bytes(), format!("v{i}").into_bytes()))
            .collect();
        let mut edited = base.clone();
        for (k, v) in &map_edits {
            let k = format!("k{k:05}").into_bytes();
            match v {
                Some(v) => edited.insert(k, vec![*v; 3]),
                None => edited.remove(&k),
            };
        }
        let ua = db.put(b"m", Target::Branch("master"), NewValue::Map(base), &o).unwrap();
        let ub = db.put(b"m", Target::Branch("master"), NewValue::Map(edited), &o).unwrap();
        let blob = noise(60_000, seed);
        let mut changed = blob.clone();
        for (at, del, ins) in &blob_edits {
            let at = (*at).min(changed.len());
            let del = (*del).min(changed.len() - at);
            changed.splice(at..at + del, noise(*ins, seed ^ at as u64));
        }
        let uc = db.put(b"b", Target::Branch("master"), NewValue::Blob(blob), &o).unwrap();
        let ud = db.put(b"b", Target::Branch("master"), NewValue::Blob(changed), &o).unwrap();
        for (x, y) in [(ua, ub), (ub, ua), (uc, ud), (ud, uc)] {
            let (vx, vy) = (db.load(&x).unwrap().value, db.load(&y).unwrap().value);
            let whole = db.diff_values(&vx, &vy).unwrap();
            let (paged, pages) = diff_pages(&db, &vx, &vy, limit);
            prop_assert_eq!(&paged, &whole);
            let n = match &whole {
                Diff::Sorted(c) => c.len(),
                Diff::Seq(c) => c.len(),
                _ => 0,
            };
            prop_assert!(pages <= n.div_ceil(limit).max(1) + 1);
        }
    }
}

/// Cursors that do not fit the diff are refused with a clear error.
#[test]
fn diff_cursors_that_do_not_fit_are_refused() {
    let (db, _) = db();
    let o = PutOptions::default();
    let ua = db
        .put(
            b"b",
            Target::Branch("master"),
            NewValue::Blob(noise(20_000, 1)),
            &o,
        )
        .unwrap();
    let ub = db
        .put(
            b"b",
            Target::Branch("master"),
            NewValue::Blob(noise(20_000, 5)),
            &o,
        )
        .unwrap();
    let (va, vb) = (db.load(&ua).unwrap().value, db.load(&ub).unwrap().value);
    for token in ["", "x", "k0g", "r1", "r-1-2", "r1-x"] {
        let e = DiffCursor::parse(token).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{token:?}: {e}");
    }
    let invalid = |after: DiffCursor| {
        let e = db.diff_values_page(&va, &vb, Some(&after), 10).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{after:?}: {e}");
    };
    invalid(DiffCursor::AfterKey("k".into()));
    invalid(DiffCursor::AfterRegion { a: 3, b: 0 });
    invalid(DiffCursor::AfterRegion { a: 0, b: 20_001 });
    assert!(db.diff_values_page(&va, &vb, None, 0).is_err());
    let s = Value::Integer(1);
    let e = db
        .diff_values_page(
            &s,
            &Value::Integer(2),
            Some(&DiffCursor::AfterRegion { a: 0, b: 0 }),
            5,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
}

/// A version's context is at most `MAX_CONTEXT_LEN` bytes: a longer one is refused, on
/// every put path, and nothing is written.
#[test]
fn contexts_past_the_limit_are_refused() {
    let (db, _) = db();
    let max = cairn_object::fobject::MAX_CONTEXT_LEN;
    let opts = |n: usize| PutOptions {
        context: vec![b'c'; n],
        ..PutOptions::default()
    };
    db.put(
        b"k",
        Target::Branch("master"),
        NewValue::String("v".into()),
        &opts(max),
    )
    .unwrap();
    let before = db.get(b"k", &master()).unwrap().uid;
    let long = opts(max + 1);
    let refused = |r: cairn_core::Result<cairn_object::Uid>| {
        let e = r.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidInput(m) if m.contains("context")),
            "{e}"
        );
    };
    refused(db.put(
        b"k",
        Target::Branch("master"),
        NewValue::String("w".into()),
        &long,
    ));
    refused(db.put_blob_stream(
        b"b",
        Target::Branch("master"),
        &mut &b"data"[..],
        &long,
        &mut |_| {},
    ));
    refused(db.put_list_stream(
        b"l",
        Target::Branch("master"),
        &mut std::iter::empty(),
        &long,
    ));
    assert_eq!(db.get(b"k", &master()).unwrap().uid, before);
    assert!(db.get(b"b", &master()).is_err());
    assert!(db.get(b"l", &master()).is_err());
}

/// A branch put on a key that lacks the branch is refused unless it names the base to
/// create the branch from (`branch_from`), which must be a version of the key.
#[test]
fn a_put_creates_a_missing_branch_only_from_a_named_version_of_the_key() {
    let (db, _) = db();
    let a = put_str(&db, "k", Target::Branch("master"), "a");
    db.rename(b"k", "master", "kept").unwrap();
    let e = db
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String("b".into()),
            &PutOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    let other = put_str(&db, "other", Target::Branch("master"), "x");
    let from = |u| PutOptions {
        branch_from: Some(u),
        ..PutOptions::default()
    };
    assert!(
        db.put(
            b"k",
            Target::Branch("master"),
            NewValue::String("b".into()),
            &from(other)
        )
        .is_err()
    );
    let b = db
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String("b".into()),
            &from(a),
        )
        .unwrap();
    let v = db.get(b"k", &master()).unwrap();
    assert_eq!((v.uid, v.object.bases.clone()), (b, vec![a]));
    assert_eq!(db.get(b"k", &At::Branch("kept".into())).unwrap().uid, a);
    // With the branch there, `branch_from` changes nothing.
    let c = db
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String("c".into()),
            &from(a),
        )
        .unwrap();
    assert_eq!(db.get(b"k", &master()).unwrap().object.bases, vec![b]);
    assert_eq!(db.get(b"k", &master()).unwrap().uid, c);
}

/// A diff resumed at the end of one side finds nothing more, even where the other side's
/// tree is an empty node (found by the `postree_node` fuzz target).
#[test]
fn a_diff_resumed_at_the_ends_reports_nothing() {
    let s = MemoryStore::new();
    let cfg = TreeConfig::default();
    let small = postree::build_blob(&s, &cfg, b"abc").unwrap();
    let empty = postree::empty(&s, postree::TreeKind::Blob).unwrap();
    let whole = postree::diff_seq(&s, &small, &empty).unwrap();
    assert_eq!(whole.len(), 1);
    let mut rest = Vec::new();
    postree::diff_seq_each(&s, &small, &empty, Some((3, 0)), &mut |c| {
        rest.push(c);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(rest, []);
}

/// A put or merge on a base version claiming the greatest depth there is fails cleanly and
/// stores no head (the new depth would wrap to 0 and make an unloadable version; found in
/// review).
#[test]
fn a_base_at_the_greatest_depth_is_refused() {
    let store = Arc::new(MemoryStore::new());
    let db = Db::new(store.clone());
    let crafted = cairn_object::FObject {
        key: bytes::Bytes::from_static(b"k"),
        value: Value::Integer(1),
        depth: u64::MAX,
        bases: vec![store.algo().digest(b"x")],
        context: bytes::Bytes::new(),
    };
    let chunk = crafted.to_chunk();
    let uid = store.algo().digest(&chunk);
    store.put_hashed(uid, &chunk).unwrap();
    let e = db
        .put(
            b"k",
            Target::Base(uid),
            NewValue::Integer(2),
            &PutOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    assert!(db.existing_table(b"k").is_err(), "no head was stored");
}

/// A store whose removes delete `.1` cids in all, then fail (an object store's delete
/// stream cut short at the `.1`-th delete). Within one call the cids go in no set order
/// (here the reverse of the list), as an object store's concurrent delete batches do.
struct FlakyRemove(MemoryStore, std::sync::atomic::AtomicUsize);

impl FlakyRemove {
    fn new(deletes: usize) -> Self {
        FlakyRemove(MemoryStore::new(), deletes.into())
    }
}

impl ChunkStore for FlakyRemove {
    fn algo(&self) -> cairn_store::HashAlgo {
        self.0.algo()
    }
    fn put_hashed(&self, c: cairn_store::Hash, b: &[u8]) -> cairn_core::Result<bool> {
        self.0.put_hashed(c, b)
    }
    fn get(&self, c: &cairn_store::Hash) -> cairn_core::Result<Option<bytes::Bytes>> {
        self.0.get(c)
    }
    fn has(&self, c: &cairn_store::Hash) -> cairn_core::Result<bool> {
        self.0.has(c)
    }
    fn cids(&self) -> cairn_core::Result<Vec<cairn_store::Hash>> {
        self.0.cids()
    }
    fn remove(&self, cids: &[cairn_store::Hash]) -> cairn_core::Result<()> {
        use std::sync::atomic::Ordering;
        let left = self.1.load(Ordering::SeqCst);
        if cids.len() < left {
            self.0.remove(cids)?;
            self.1.fetch_sub(cids.len(), Ordering::SeqCst);
            return Ok(());
        }
        let some: Vec<_> = cids.iter().rev().take(left).copied().collect();
        self.0.remove(&some)?;
        self.1.store(0, Ordering::SeqCst);
        Err(Error::Unavailable("the delete stream broke".into()))
    }
    fn stats(&self) -> cairn_core::Result<cairn_store::StoreStats> {
        self.0.stats()
    }
}

impl cairn_store::RefStore for FlakyRemove {
    fn get_ref(&self, n: &[u8]) -> cairn_core::Result<Option<bytes::Bytes>> {
        self.0.get_ref(n)
    }
    fn list_refs(&self, p: &[u8]) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.0.list_refs(p)
    }
    fn list_refs_from(
        &self,
        p: &[u8],
        f: &[u8],
        l: usize,
    ) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.0.list_refs_from(p, f, l)
    }
    fn commit(&self, u: &[cairn_store::RefUpdate]) -> cairn_core::Result<()> {
        self.0.commit(u)
    }
    fn durability(&self) -> cairn_store::Durability {
        self.0.durability()
    }
}

/// A GC whose remove fails part way leaves no cached version it deleted: a fork from the
/// deleted version's uid then loads it and fails, instead of making a branch whose head
/// is missing.
#[test]
fn a_gc_cut_short_leaves_no_cached_version_it_deleted() {
    let db = Db::new(Arc::new(FlakyRemove::new(1)));
    let o = PutOptions::default();
    db.put(
        b"k",
        Target::Branch("master"),
        NewValue::String("keep".into()),
        &o,
    )
    .unwrap();
    db.fork(b"k", &At::Branch("master".into()), "tmp").unwrap();
    // An inline value: the version's Meta chunk is its only chunk.
    let gone = db
        .put(
            b"k",
            Target::Branch("tmp"),
            NewValue::String("x".into()),
            &o,
        )
        .unwrap();
    db.remove(b"k", "tmp").unwrap();
    assert!(db.gc().is_err(), "the remove failed part way");
    assert!(
        db.load(&gone).is_err(),
        "the garbage version's chunk was deleted"
    );
    assert!(db.fork(b"k", &At::Uid(gone), "back").is_err());
    let v = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(v.is_intact(), "{:?}", v.damage);
}

/// GC removes what points at a chunk before the chunk (versions deepest first, then index
/// nodes from the top, then leaves), one rank after another even from a store that
/// deletes each batch in no set order, so a remove cut short anywhere leaves only whole
/// versions: a dead version whose Meta chunk is still there can be forked back and read
/// in full. Before, the order was a hash set's, and a cut could leave a version whose tree
/// was half gone, which a fork brought back as a head that no GC could then mark.
#[test]
fn a_gc_cut_short_leaves_only_whole_versions() {
    // The remove is cut after 1, 2, … chunks: within the versions, at the index nodes and
    // among the leaves.
    for cut in 1..=16usize {
        let db = Db::new(Arc::new(FlakyRemove::new(cut)));
        let o = PutOptions::default();
        let seed = cut as u64 * 10;
        let blob = |n| NewValue::Blob(noise(20_000, seed + n));
        db.put(b"k", Target::Branch("master"), blob(0), &o).unwrap();
        db.fork(b"k", &At::Branch("master".into()), "tmp").unwrap();
        let dead = [
            (db.put(b"k", Target::Branch("tmp"), blob(1), &o).unwrap(), 1),
            (db.put(b"k", Target::Branch("tmp"), blob(2), &o).unwrap(), 2),
        ];
        db.remove(b"k", "tmp").unwrap();
        // The remove fails part way (or, past the last dead chunk, completes).
        let _ = db.gc();
        // The deepest dead version goes first.
        assert!(db.load(&dead[1].0).is_err(), "cut {cut}");
        for (i, (uid, n)) in dead.iter().enumerate() {
            if db.load(uid).is_err() {
                continue;
            }
            let branch = format!("back{i}");
            db.fork(b"k", &At::Uid(*uid), &branch).unwrap();
            let got = db.get(b"k", &At::Branch(branch)).unwrap();
            let tree = got.object.value.tree().expect("a blob");
            let bytes = postree::blob_read(db.chunks(), tree, 0, tree.count).unwrap();
            assert!(bytes == noise(20_000, seed + n), "cut {cut}: version {i}");
        }
        let v = db.verify(None, &mut |_, _| {}).unwrap();
        assert!(v.is_intact(), "cut {cut}: {:?}", v.damage);
    }
}

/// Map contents as (key, value) strings.
fn map_at(db: &Db, key: &[u8], at: &At) -> Vec<(String, String)> {
    let v = db.get(key, at).unwrap().object.value;
    postree::iter(db.chunks(), v.tree().unwrap())
        .map(|e| {
            let e = e.unwrap();
            (
                String::from_utf8(e.key.to_vec()).unwrap(),
                String::from_utf8(e.value.unwrap().to_vec()).unwrap(),
            )
        })
        .collect()
}

fn map_edit(db: &Db, branch: &str, k: &str, v: Option<&str>, ctx: u8) -> cairn_object::Uid {
    let o = PutOptions {
        context: vec![ctx],
        ..Default::default()
    };
    db.update(
        b"m",
        Target::Branch(branch),
        Op::MapUpdate(vec![(
            k.as_bytes().to_vec(),
            v.map(|v| v.as_bytes().to_vec()),
        )]),
        &o,
    )
    .unwrap()
}

/// A criss-cross history (each branch merged the other's head) has two merge bases. The
/// merge runs against both (merged into one virtual base), so a deletion made after them is
/// kept whichever base sorts first; against one of them alone it came back in some runs.
#[test]
fn criss_cross_merges_keep_changes_made_after_either_base() {
    let dev = At::Branch("dev".into());
    // The context byte varies the uids, so each run puts the two bases in another order.
    for ctx in 0..8u8 {
        let (db, _) = db();
        let o = PutOptions::default();
        db.put(
            b"m",
            Target::Branch("master"),
            NewValue::Map(BTreeMap::new()),
            &o,
        )
        .unwrap();
        db.fork(b"m", &master(), "dev").unwrap();
        let b1 = map_edit(&db, "master", "a", Some("1"), ctx);
        let c1 = map_edit(&db, "dev", "b", Some("1"), 0);
        for (into, from) in [("master", c1), ("dev", b1)] {
            let r = db
                .merge_into(b"m", into, &At::Uid(from), &BuiltinResolver::Manual, &o)
                .unwrap();
            assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
        }
        let (mh, dh) = (
            db.resolve(b"m", &master()).unwrap(),
            db.resolve(b"m", &dev).unwrap(),
        );
        let mut bases = db.merge_bases(b"m", &mh, &dh).unwrap();
        bases.sort();
        let mut want = vec![b1, c1];
        want.sort();
        assert_eq!(bases, want, "two merge bases");
        map_edit(&db, "dev", "b", None, 0);
        map_edit(&db, "master", "c", Some("1"), 0);
        let r = db
            .merge_into(b"m", "master", &dev, &BuiltinResolver::Manual, &o)
            .unwrap();
        assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
        let keys: Vec<String> = map_at(&db, b"m", &master())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            ["a", "c"],
            "run {ctx}: dev's deletion of b was undone"
        );
    }
}

/// Append over Blobs and Lists acts on the span the sides changed, not on the whole leaves
/// around it: theirs' change lands right after ours, whatever the leaf size.
#[test]
fn append_puts_their_change_next_to_ours_whatever_the_chunking() {
    for leaf in [128u32, 1024, 4096] {
        let cfg = TreeConfig {
            leaf_target: leaf,
            index_target: 256,
        };
        let db = Db::with_config(Arc::new(MemoryStore::new()), cfg);
        let o = PutOptions::default();
        let base = noise(50_000, 7);
        db.put(
            b"b",
            Target::Branch("master"),
            NewValue::Blob(base.clone()),
            &o,
        )
        .unwrap();
        let elems: Vec<Vec<u8>> = (0..3000).map(|i| format!("e{i}").into_bytes()).collect();
        db.put(
            b"l",
            Target::Branch("master"),
            NewValue::List(elems.clone()),
            &o,
        )
        .unwrap();
        for k in [&b"b"[..], b"l"] {
            db.fork(k, &master(), "dev").unwrap();
        }
        for (branch, x) in [("master", b'O'), ("dev", b'T')] {
            let splice = Op::BlobSplice {
                offset: 10,
                delete: 1,
                insert: vec![x],
            };
            db.update(b"b", Target::Branch(branch), splice, &o).unwrap();
            let splice = Op::ListSplice {
                index: 5,
                delete: 1,
                insert: vec![vec![x]],
            };
            db.update(b"l", Target::Branch(branch), splice, &o).unwrap();
        }
        for k in [&b"b"[..], b"l"] {
            let r = merge_dev(&db, k, &BuiltinResolver::Append, &o).unwrap();
            assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
        }
        let mut want = base[..10].to_vec();
        want.extend_from_slice(b"OT");
        want.extend_from_slice(&base[11..]);
        let got = blob_of(&db, &db.get(b"b", &master()).unwrap().object.value);
        assert!(
            got == want,
            "leaf {leaf}: the blob's append is not at offset 10"
        );
        let mut want = elems[..5].to_vec();
        want.extend([b"O".to_vec(), b"T".to_vec()]);
        want.extend_from_slice(&elems[6..]);
        let got = list_of(&db, &db.get(b"l", &master()).unwrap().object.value);
        assert!(
            got == want,
            "leaf {leaf}: the list's append is not at index 5"
        );
    }
}

/// Append leaves a Map entry one side deleted and the other edited as a conflict: there
/// is nothing to append to (it used to keep a fragment of theirs).
#[test]
fn append_does_not_resolve_a_deleted_map_entry() {
    let (db, _) = db();
    let o = PutOptions::default();
    let start: BTreeMap<Vec<u8>, Vec<u8>> = [(b"k".to_vec(), b"hello".to_vec())].into();
    db.put(b"m", Target::Branch("master"), NewValue::Map(start), &o)
        .unwrap();
    db.fork(b"m", &master(), "dev").unwrap();
    map_edit(&db, "master", "k", None, 0);
    map_edit(&db, "dev", "k", Some("hello world"), 0);
    let r = merge_dev(&db, b"m", &BuiltinResolver::Append, &o).unwrap();
    assert!(matches!(r, MergeOutcome::Conflicts(_)), "{r:?}");
    assert!(map_at(&db, b"m", &master()).is_empty());
}

/// A branch forked from an untagged head, then merged into: the old head now has a
/// descendant, so it is no longer listed as an untagged head.
#[test]
fn merging_into_a_branch_at_an_untagged_head_drops_that_head() {
    let (db, _) = db();
    let s1 = put_str(&db, "k", Target::Branch("master"), "S1");
    let s2 = put_str(&db, "k", Target::Base(s1), "S1+W1");
    let s3 = put_str(&db, "k", Target::Base(s1), "S1+W2");
    assert_eq!(db.list_untagged(b"k").unwrap().len(), 2);
    db.fork(b"k", &At::Uid(s2), "w1").unwrap();
    let MergeOutcome::Merged(m) = db
        .merge_into(
            b"k",
            "w1",
            &At::Uid(s3),
            &BuiltinResolver::Append,
            &PutOptions::default(),
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(db.resolve(b"k", &At::Branch("w1".into())).unwrap(), m);
    assert!(db.list_untagged(b"k").unwrap().is_empty());
}

/// Merge bases that conflict with each other do not block a merge: the virtual base keeps
/// their own common base's value there, and the caller's resolver settles the heads.
#[test]
fn conflicting_merge_bases_leave_the_heads_to_the_resolver() {
    let dev = At::Branch("dev".into());
    for (resolver, want) in [(BuiltinResolver::Ours, "m"), (BuiltinResolver::Theirs, "d")] {
        let (db, _) = db();
        let o = PutOptions::default();
        put_str(&db, "k", Target::Branch("master"), "b");
        db.fork(b"k", &master(), "dev").unwrap();
        let m1 = put_str(&db, "k", Target::Branch("master"), "m");
        let d1 = put_str(&db, "k", Target::Branch("dev"), "d");
        for (into, from) in [("master", d1), ("dev", m1)] {
            let r = db
                .merge_into(b"k", into, &At::Uid(from), &BuiltinResolver::Ours, &o)
                .unwrap();
            assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
        }
        let r = db
            .merge_into(b"k", "master", &dev, &BuiltinResolver::Manual, &o)
            .unwrap();
        assert!(matches!(r, MergeOutcome::Conflicts(_)), "{r:?}");
        let r = db.merge_into(b"k", "master", &dev, &resolver, &o).unwrap();
        assert!(matches!(r, MergeOutcome::Merged(_)), "{resolver:?}: {r:?}");
        assert_eq!(string_at(&db, "k", &master()), want);
    }
}

/// Union adds their elements found nowhere in ours, not only outside the changed span.
#[test]
fn union_skips_their_elements_anywhere_in_ours() {
    let (db, _) = db();
    let o = PutOptions::default();
    db.put(
        b"l",
        Target::Branch("master"),
        NewValue::List(items(&["x", "y"])),
        &o,
    )
    .unwrap();
    db.fork(b"l", &master(), "dev").unwrap();
    for (branch, add) in [("master", "z"), ("dev", "x")] {
        let splice = Op::ListSplice {
            index: 2,
            delete: 0,
            insert: items(&[add]),
        };
        db.update(b"l", Target::Branch(branch), splice, &o).unwrap();
    }
    let r = merge_dev(&db, b"l", &BuiltinResolver::Union, &o).unwrap();
    assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
    let got = list_of(&db, &db.get(b"l", &master()).unwrap().object.value);
    assert_eq!(got, items(&["x", "y", "z"]));
}

/// The virtual base of conflicting merge bases keeps their own base's content as it is:
/// a List element holding a newline stays one element (through the conflict's text it
/// became two, and a head that went back to it conflicted).
#[test]
fn a_virtual_base_keeps_list_elements_whole() {
    let (db, _) = db();
    let o = PutOptions::default();
    db.put(
        b"l",
        Target::Branch("master"),
        NewValue::List(items(&["x\ny", "k"])),
        &o,
    )
    .unwrap();
    db.fork(b"l", &master(), "dev").unwrap();
    let set = |branch: &str, v: &str| {
        let splice = Op::ListSplice {
            index: 0,
            delete: 1,
            insert: items(&[v]),
        };
        db.update(b"l", Target::Branch(branch), splice, &o).unwrap()
    };
    let m1 = set("master", "m");
    let d1 = set("dev", "d");
    for (into, from) in [("master", d1), ("dev", m1)] {
        let r = db
            .merge_into(b"l", into, &At::Uid(from), &BuiltinResolver::Ours, &o)
            .unwrap();
        assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
    }
    set("dev", "x\ny");
    let r = merge_dev(&db, b"l", &BuiltinResolver::Manual, &o).unwrap();
    assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
    let got = list_of(&db, &db.get(b"l", &master()).unwrap().object.value);
    assert_eq!(got, items(&["m", "k"]));
}

/// List elements from strings.
fn items(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|x| x.as_bytes().to_vec()).collect()
}

/// A damaged head ref is reported without hiding the key's other damage, and a ref name
/// that does not parse is reported without stopping the whole check: before, one bad ref
/// made `verify` report only the branch table of its key, and one bad name made `verify`
/// of the whole store fail with no report at all.
#[test]
fn verify_reports_past_damaged_refs() {
    let store = Arc::new(MemoryStore::new());
    let db = Db::new(store.clone());
    let o = PutOptions::default();
    db.put(
        b"a",
        Target::Branch("master"),
        NewValue::Blob(noise(20_000, 7)),
        &o,
    )
    .unwrap();
    let root = db
        .get(b"a", &At::Branch("master".into()))
        .unwrap()
        .object
        .value
        .tree()
        .unwrap()
        .root;
    store.remove(&[root]).unwrap();
    let uid = db.get(b"a", &At::Branch("master".into())).unwrap().uid;
    cairn_store::RefStore::commit(
        &*store,
        &[
            cairn_store::RefUpdate::Set {
                name: b"bucket/default/a\0\x01zjunk".to_vec(),
                value: uid.to_bytes().to_vec(),
            },
            cairn_store::RefUpdate::Set {
                name: b"bucket/default/b\0\x07".to_vec(),
                value: uid.to_bytes().to_vec(),
            },
        ],
    )
    .unwrap();
    for key in [None, Some(&b"a"[..])] {
        let v = db.verify(key, &mut |_, _| {}).unwrap();
        let all: Vec<String> = v.damage.iter().map(|d| d.to_string()).collect();
        assert!(
            all.iter()
                .any(|d| d.contains("unknown form") && d.contains("zjunk")),
            "{all:#?}"
        );
        assert!(
            all.iter().any(|d| d.contains(&root.to_string())),
            "the missing tree chunk is reported: {all:#?}"
        );
        if key.is_none() {
            assert!(all.iter().any(|d| d.contains("b\\0\\u{7}")), "{all:#?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// LCA and merge bases over random histories (versions with up to three earlier bases,
    /// several roots) match a model built from ancestor sets: the LCA is the deepest
    /// common ancestor (greatest (depth, uid)), the merge bases are the common ancestors
    /// no other common ancestor descends from, deepest first. The walk forgets versions
    /// deeper than where it is, so this also checks that nothing it forgets is needed.
    #[test]
    fn lca_and_merge_bases_match_a_model(
        parents in proptest::collection::vec(proptest::collection::vec(any::<prop::sample::Index>(), 0..4), 1..40),
        pairs in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..8),
    ) {
        let store = MemoryStore::new();
        let mut uids: Vec<cairn_object::Uid> = Vec::new();
        let mut depth: Vec<u64> = Vec::new();
        let mut anc: Vec<BTreeSet<usize>> = Vec::new();
        for (i, ps) in parents.iter().enumerate() {
            let mut bases: Vec<usize> = if i == 0 { vec![] } else { ps.iter().map(|p| p.index(i)).collect() };
            bases.sort_unstable();
            bases.dedup();
            let d = bases.iter().map(|b| depth[*b] + 1).max().unwrap_or(0);
            let o = cairn_object::FObject {
                key: bytes::Bytes::from_static(b"k"),
                value: Value::Integer(i as i64),
                depth: d,
                bases: bases.iter().map(|b| uids[*b]).collect(),
                context: bytes::Bytes::new(),
            };
            let chunk = o.to_chunk();
            let uid = store.algo().digest(&chunk);
            store.put_hashed(uid, &chunk).unwrap();
            let mut a: BTreeSet<usize> = bases.iter().flat_map(|b| anc[*b].iter().copied()).collect();
            a.insert(i);
            uids.push(uid);
            depth.push(d);
            anc.push(a);
        }
        let n = uids.len();
        for (x, y) in pairs {
            let (a, b) = (x.index(n), y.index(n));
            let common: Vec<usize> = anc[a].intersection(&anc[b]).copied().collect();
            let key = |i: &usize| (depth[*i], uids[*i]);
            let want_lca = common.iter().max_by_key(|i| key(i)).map(|i| uids[*i]);
            let got_lca = cairn_object::history::lca_in(&store, b"k", &uids[a], &uids[b]).unwrap();
            prop_assert_eq!(got_lca, want_lca);
            let mut want_bases: Vec<usize> = common
                .iter()
                .copied()
                .filter(|c| !common.iter().any(|o| o != c && anc[*o].contains(c)))
                .collect();
            want_bases.sort_by_key(|i| std::cmp::Reverse(key(i)));
            let want_bases: Vec<cairn_object::Uid> = want_bases.iter().map(|i| uids[*i]).collect();
            let got_bases = cairn_object::history::merge_bases_in(&store, b"k", &uids[a], &uids[b]).unwrap();
            prop_assert_eq!(got_bases, want_bases);
        }
    }
}

/// `heads_page` walks a key's heads a page at a time, tagged by name then untagged by
/// uid: at every page size the pages put together are exactly the whole table, each page
/// but the last says where to go on (its text form parses back), and a key with no heads
/// is not found.
#[test]
fn heads_pages_put_together_are_the_whole_table() {
    use cairn_object::HeadPos;
    let (db, _) = db();
    let root = put_str(&db, "k", Target::Branch("master"), "root");
    for i in 0..7 {
        db.fork(b"k", &master(), &format!("b{i}")).unwrap();
        put_str(&db, "k", Target::Base(root), &format!("concurrent {i}"));
    }
    let whole = db.table(b"k").unwrap();
    assert_eq!((whole.tagged.len(), whole.untagged.len()), (8, 7));
    for limit in 1..=16 {
        let mut got = cairn_object::BranchTable::default();
        let mut after: Option<HeadPos> = None;
        let mut pages = 0;
        loop {
            let (page, next) = db.heads_page(b"k", after.as_ref(), limit).unwrap();
            assert!(page.tagged.len() + page.untagged.len() <= limit);
            got.tagged.extend(page.tagged);
            got.untagged.extend(page.untagged);
            pages += 1;
            match next {
                Some(pos) => {
                    assert_eq!(pos.to_string().parse::<HeadPos>().unwrap(), pos);
                    after = Some(pos);
                }
                None => break,
            }
        }
        assert_eq!(got, whole, "limit {limit}");
        assert_eq!(pages, 15usize.div_ceil(limit), "limit {limit}");
    }
    let e = db.heads_page(b"nothing", None, 10).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    for bad in ["", "tagged:", "tagged:has space", "untagged:zz", "other:x"] {
        assert!(bad.parse::<HeadPos>().is_err(), "{bad:?}");
    }
}

/// Another key's version is "not found" where the caller names it (by uid), and damage
/// where the store's own refs or history reach it (a head ref naming it): a damaged head
/// must not read as a key or version that is not there.
#[test]
fn another_keys_version_is_not_found_when_named_and_damage_when_reached() {
    let (db, store) = db();
    put_str(&db, "k", Target::Branch("master"), "mine");
    let other = put_str(&db, "other", Target::Branch("master"), "theirs");
    for e in [
        db.get(b"k", &At::Uid(other)).unwrap_err(),
        db.lca(b"k", &db.resolve(b"k", &master()).unwrap(), &other)
            .unwrap_err(),
        db.track(b"k", &At::Uid(other), 0, 3).unwrap_err(),
    ] {
        assert!(matches!(e, Error::NotFound(_)), "{e}");
    }
    // Branch "evil" of key k names the other key's version.
    cairn_store::RefStore::commit(
        &*store,
        &[cairn_store::RefUpdate::Set {
            name: b"bucket/default/k\0\x01tevil".to_vec(),
            value: other.to_bytes().to_vec(),
        }],
    )
    .unwrap();
    let head = db.resolve(b"k", &At::Branch("evil".into())).unwrap();
    assert_eq!(head, other);
    let evil = At::Branch("evil".into());
    for e in [
        db.load_reached(b"k", &head).unwrap_err(),
        // Reading the branch (a Gaia revocation read as absent would fail open), its log,
        // a put on it, and merges with it.
        db.get(b"k", &evil).unwrap_err(),
        db.track(b"k", &evil, 0, 3).unwrap_err(),
        db.put(
            b"k",
            Target::Branch("evil"),
            NewValue::String("x".into()),
            &PutOptions::default(),
        )
        .unwrap_err(),
        db.merge_into(
            b"k",
            "master",
            &evil,
            &BuiltinResolver::Ours,
            &PutOptions::default(),
        )
        .unwrap_err(),
        db.merge_into(
            b"k",
            "evil",
            &master(),
            &BuiltinResolver::Ours,
            &PutOptions::default(),
        )
        .unwrap_err(),
    ] {
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
    }
    let e = db.all_versions(b"k").unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    // A head ref naming a version the store does not hold is damage too (by uid, such a
    // version is simply not found).
    let made_up: cairn_object::Uid = format!("1e20{}", "07".repeat(32)).parse().unwrap();
    cairn_store::RefStore::commit(
        &*store,
        &[cairn_store::RefUpdate::Set {
            name: b"bucket/default/k\0\x01tgone".to_vec(),
            value: made_up.to_bytes().to_vec(),
        }],
    )
    .unwrap();
    let e = db.get(b"k", &At::Branch("gone".into())).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    let e = db.get(b"k", &At::Uid(made_up)).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    let v = db.verify(Some(&b"k"[..]), &mut |_, _| {}).unwrap();
    assert!(
        v.damage
            .iter()
            .any(|d| d.to_string().contains("reached as a version of key")),
        "{:?}",
        v.damage
    );
}

/// A version whose base is missing is reported for that base only: its depth, which the
/// missing base may have set, is not also called wrong (the check counted only the bases
/// it could read).
#[test]
fn verify_reports_a_missing_base_without_a_depth_mismatch() {
    let (db, store) = db();
    put_str(&db, "k", Target::Branch("master"), "one");
    let second = put_str(&db, "k", Target::Branch("master"), "two");
    put_str(&db, "k", Target::Branch("master"), "three");
    store.remove(&[second]).unwrap();
    let v = db.verify(Some(&b"k"[..]), &mut |_, _| {}).unwrap();
    let all: Vec<String> = v.damage.iter().map(|d| d.to_string()).collect();
    assert!(
        all.iter().any(|d| d.contains(&second.to_string())),
        "{all:#?}"
    );
    assert!(!all.iter().any(|d| d.contains("depth")), "{all:#?}");
}

/// A version whose base claims the greatest depth there is (`u64::MAX`, so no version can
/// follow it) is reported as damage by `verify`, naming the key and version, without an
/// overflow; the damaged head is reached through an ordinary head ref.
#[test]
fn verify_reports_a_base_at_the_greatest_depth() {
    let (db, store) = db();
    let root = put_str(&db, "k", Target::Branch("master"), "fine");
    // (A version without bases must have depth 0: the decoder refuses anything else.)
    let deepest = cairn_object::FObject {
        key: bytes::Bytes::from_static(b"k"),
        value: Value::String(bytes::Bytes::from_static(b"deep")),
        depth: u64::MAX,
        bases: vec![root],
        context: bytes::Bytes::new(),
    };
    let a = store.put(&deepest.to_chunk()).unwrap();
    assert_eq!(a, deepest.uid(cairn_core::HashAlgo::Blake3));
    let child = cairn_object::FObject {
        key: bytes::Bytes::from_static(b"k"),
        value: Value::String(bytes::Bytes::from_static(b"after")),
        depth: u64::MAX,
        bases: vec![a],
        context: bytes::Bytes::new(),
    };
    let b = store.put(&child.to_chunk()).unwrap();
    cairn_store::RefStore::commit(
        &*store,
        &[cairn_store::RefUpdate::Set {
            name: b"bucket/default/k\0\x01tdeep".to_vec(),
            value: b.to_bytes().to_vec(),
        }],
    )
    .unwrap();
    let v = db.verify(Some(&b"k"[..]), &mut |_, _| {}).unwrap();
    let all: Vec<String> = v.damage.iter().map(|d| d.to_string()).collect();
    assert!(
        all.iter()
            .any(|d| d.contains("greatest depth") && d.contains(&b.to_string())),
        "{all:#?}"
    );
    // The key's good head is still walked and found intact.
    assert!(v.versions >= 3, "{v:?}");
}

/// A store that acts out a put or remove and a GC landing between a branch read's ref
/// lookup and its version load: the first `get` of the chosen version runs the chosen ref
/// updates, deletes the version's chunk and answers that it is not there.
struct GcBetween {
    inner: MemoryStore,
    race: std::sync::Mutex<Option<(cairn_store::Hash, Vec<cairn_store::RefUpdate>)>>,
}

impl GcBetween {
    fn new() -> Arc<GcBetween> {
        Arc::new(GcBetween {
            inner: MemoryStore::new(),
            race: std::sync::Mutex::new(None),
        })
    }

    /// The name of the ref of branch `branch` while it holds `uid`.
    fn ref_of(&self, branch: &str, uid: &cairn_object::Uid) -> Vec<u8> {
        use cairn_store::RefStore;
        self.list_refs(b"bucket/")
            .unwrap()
            .into_iter()
            .find(|(n, v)| n.ends_with(branch.as_bytes()) && v[..] == uid.to_bytes()[..])
            .map(|(n, _)| n.to_vec())
            .unwrap()
    }

    /// The next `get` of `victim` moves the ref `name` to `to` and collects `victim`.
    fn race_move(&self, victim: cairn_object::Uid, name: Vec<u8>, to: cairn_object::Uid) {
        *self.race.lock().unwrap() = Some((
            victim,
            vec![cairn_store::RefUpdate::Set {
                name,
                value: to.to_bytes().to_vec(),
            }],
        ));
    }
}

impl ChunkStore for GcBetween {
    fn algo(&self) -> cairn_store::HashAlgo {
        self.inner.algo()
    }
    fn put_hashed(&self, c: cairn_store::Hash, b: &[u8]) -> cairn_core::Result<bool> {
        self.inner.put_hashed(c, b)
    }
    fn get(&self, c: &cairn_store::Hash) -> cairn_core::Result<Option<bytes::Bytes>> {
        let mut race = self.race.lock().unwrap();
        if race.as_ref().is_some_and(|(v, _)| v == c)
            && let Some((v, updates)) = race.take()
        {
            use cairn_store::RefStore;
            self.inner.commit(&updates)?;
            self.inner.remove(&[v])?;
            return Ok(None);
        }
        drop(race);
        self.inner.get(c)
    }
    fn has(&self, c: &cairn_store::Hash) -> cairn_core::Result<bool> {
        self.inner.has(c)
    }
    fn cids(&self) -> cairn_core::Result<Vec<cairn_store::Hash>> {
        self.inner.cids()
    }
    fn remove(&self, cids: &[cairn_store::Hash]) -> cairn_core::Result<()> {
        self.inner.remove(cids)
    }
    fn stats(&self) -> cairn_core::Result<cairn_store::StoreStats> {
        self.inner.stats()
    }
}

impl cairn_store::RefStore for GcBetween {
    fn get_ref(&self, n: &[u8]) -> cairn_core::Result<Option<bytes::Bytes>> {
        self.inner.get_ref(n)
    }
    fn list_refs(&self, p: &[u8]) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.inner.list_refs(p)
    }
    fn list_refs_from(
        &self,
        p: &[u8],
        f: &[u8],
        l: usize,
    ) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.inner.list_refs_from(p, f, l)
    }
    fn commit(&self, u: &[cairn_store::RefUpdate]) -> cairn_core::Result<()> {
        self.inner.commit(u)
    }
    fn durability(&self) -> cairn_store::Durability {
        self.inner.durability()
    }
}

/// A branch read that loses its version to a GC after the branch moved or went away
/// meanwhile reads the branch again: the new head, or "not found" once it is removed; a
/// head whose version is missing with no move in between is still damage.
#[test]
fn a_branch_read_racing_a_move_and_a_gc_reads_the_branch_again() {
    use cairn_store::RefUpdate;
    let store = GcBetween::new();
    let db = Db::new(store.clone());
    let o = PutOptions::default();
    let put = |b: &str, s: &str| {
        db.put(b"k", Target::Branch(b), NewValue::String(s.into()), &o)
            .unwrap()
    };
    let old = put("master", "old");
    db.fork(b"k", &At::Branch("master".into()), "keep").unwrap();
    db.fork(b"k", &At::Branch("master".into()), "side").unwrap();
    put("keep", "kept");
    // The ref of branch master (side, forked from it, holds the same uid until its put).
    let name = store.ref_of("master", &old);

    // Moved to a new version, the old one collected.
    let newer = put("side", "new");
    store.race_move(old, name.clone(), newer);
    let v = db.get(b"k", &At::Branch("master".into())).unwrap();
    assert_eq!(v.uid, newer, "the branch's new head");

    // Removed, its version collected: not found, not damage.
    *store.race.lock().unwrap() = Some((newer, vec![RefUpdate::Delete { name: name.clone() }]));
    let e = db.get(b"k", &At::Branch("master".into())).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");

    // A head whose version is missing with nothing moving: damage.
    let kept = db.get(b"k", &At::Branch("keep".into())).unwrap().uid;
    *store.race.lock().unwrap() = Some((kept, Vec::new()));
    let e = db.get(b"k", &At::Branch("keep".into())).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
}

/// Under `sum`, a counter both sides changed alike adds up both changes (5, each side +1:
/// 7, not the 6 they agree on), for an Integer and for a Map's numbers; Map entries both
/// sides set alike to something that is no number, or deleted, stay agreed.
#[test]
fn sum_adds_up_changes_both_sides_made_alike() {
    let (db, _) = db();
    let ctx = |c: &str| PutOptions {
        context: c.as_bytes().to_vec(),
        ..PutOptions::default()
    };
    db.put(
        b"n",
        Target::Branch("master"),
        NewValue::Integer(5),
        &PutOptions::default(),
    )
    .unwrap();
    db.fork(b"n", &master(), "dev").unwrap();
    // Contexts tell the two increments apart (the same content, bases and context would
    // be the same version).
    db.update(b"n", Target::Branch("master"), Op::Add(1), &ctx("a"))
        .unwrap();
    db.update(b"n", Target::Branch("dev"), Op::Add(1), &ctx("b"))
        .unwrap();
    let MergeOutcome::Merged(u) =
        merge_dev(&db, b"n", &BuiltinResolver::Sum, &PutOptions::default()).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        db.get(b"n", &At::Uid(u)).unwrap().object.value,
        Value::Integer(7)
    );

    let m = |pairs: &[(&str, &str)]| NewValue::Map(str_map(pairs));
    db.put(
        b"m",
        Target::Branch("master"),
        m(&[("hits", "5"), ("name", "x"), ("gone", "1")]),
        &PutOptions::default(),
    )
    .unwrap();
    db.fork(b"m", &master(), "dev").unwrap();
    let alike = Op::MapUpdate(vec![
        (b"hits".to_vec(), Some(b"6".to_vec())),
        (b"name".to_vec(), Some(b"y".to_vec())),
        (b"gone".to_vec(), None),
    ]);
    db.update(b"m", Target::Branch("master"), alike.clone(), &ctx("a"))
        .unwrap();
    db.update(b"m", Target::Branch("dev"), alike, &ctx("b"))
        .unwrap();
    let MergeOutcome::Merged(u) =
        merge_dev(&db, b"m", &BuiltinResolver::Sum, &PutOptions::default()).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        map_at(&db, b"m", &At::Uid(u)),
        [("hits", "7"), ("name", "y")].map(|(k, v)| (k.to_string(), v.to_string()))
    );
}

/// Append adds after ours what theirs inserted, or what theirs replaced a conflict's whole
/// span with; an edit of theirs inside the span ("quick" to "quack" while ours deleted
/// "quick ") is left as a conflict, not appended as the fragment that differs ("a").
#[test]
fn append_leaves_an_edit_inside_the_span_as_a_conflict() {
    let (db, _) = db();
    let o = PutOptions::default();
    let base = "The quick brown fox";
    for (key, blob) in [("s", false), ("b", true)] {
        let v = |s: &str| {
            if blob {
                NewValue::Blob(s.as_bytes().to_vec())
            } else {
                NewValue::String(s.into())
            }
        };
        let k = key.as_bytes();
        db.put(k, Target::Branch("master"), v(base), &o).unwrap();
        db.fork(k, &master(), "dev").unwrap();
        db.put(k, Target::Branch("master"), v("The brown fox"), &o)
            .unwrap();
        // Theirs as `text`, merged into ours with append.
        let merge_theirs = |text: &str| {
            db.put(k, Target::Branch("dev"), v(text), &o).unwrap();
            merge_dev(&db, k, &BuiltinResolver::Append, &o).unwrap()
        };
        // An edit inside the word, replacing or inserting: a conflict.
        for edit in ["The quack brown fox", "The quickest brown fox"] {
            let r = merge_theirs(edit);
            assert!(
                matches!(r, MergeOutcome::Conflicts(_)),
                "{key} {edit}: {r:?}"
            );
        }
        // Theirs adding after the span is appended, as before.
        let r = merge_theirs("The quick brown fox jumps");
        let MergeOutcome::Merged(u) = r else {
            panic!("{key}: {r:?}")
        };
        let got = match db.get(key.as_bytes(), &At::Uid(u)).unwrap().object.value {
            Value::String(b) => b.to_vec(),
            other => blob_of(&db, &other),
        };
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "The brown fox jumps",
            "{key}"
        );
    }
    // A Map value: the same.
    let m = |v: &str| NewValue::Map([(b"k".to_vec(), v.as_bytes().to_vec())].into());
    db.put(b"m", Target::Branch("master"), m("hello"), &o)
        .unwrap();
    db.fork(b"m", &master(), "dev").unwrap();
    db.put(b"m", Target::Branch("master"), m("hello world"), &o)
        .unwrap();
    db.put(b"m", Target::Branch("dev"), m("help"), &o).unwrap();
    let r = merge_dev(&db, b"m", &BuiltinResolver::Append, &o).unwrap();
    assert!(matches!(r, MergeOutcome::Conflicts(_)), "{r:?}");
}

/// An unresolved merge writes nothing: not the pairwise merges of untagged heads made
/// before the pair that conflicts, not the virtual base of a criss-cross history. A merge
/// whose new chunks pass its memory limit fails, writing nothing either.
#[test]
fn an_unresolved_merge_writes_nothing() {
    let (db, store) = db();
    let o = PutOptions::default();
    let m = |pairs: &[(&str, &str)]| NewValue::Map(str_map(pairs));
    let base = db
        .put(b"u", Target::Branch("master"), m(&[("a", "1")]), &o)
        .unwrap();
    let on_base = |v| db.put(b"u", Target::Base(base), v, &o).unwrap();
    let h1 = on_base(m(&[("a", "1"), ("b", "1")]));
    let h2 = on_base(m(&[("a", "1"), ("c", "1")]));
    let h3 = on_base(m(&[("a", "1"), ("b", "9")]));
    let before = store.cids().unwrap().len();
    let r = db
        .merge_untagged(b"u", &[h1, h2, h3], &BuiltinResolver::Manual, &o)
        .unwrap();
    assert!(matches!(r, MergeOutcome::Conflicts(_)), "{r:?}");
    assert_eq!(store.cids().unwrap().len(), before, "h1 + h2 was not kept");
    // Resolved, it writes the merged version and its chunks.
    let r = db
        .merge_untagged(b"u", &[h1, h2, h3], &BuiltinResolver::Theirs, &o)
        .unwrap();
    let MergeOutcome::Merged(u) = r else {
        panic!("{r:?}")
    };
    assert!(store.cids().unwrap().len() > before);
    assert_eq!(db.load(&u).unwrap().bases, vec![h1, h2, h3]);

    // A criss-cross history: the merge bases are merged into a virtual base first.
    let list = |v: &[Vec<u8>]| NewValue::List(v.to_vec());
    let l0: Vec<Vec<u8>> = (0..100).map(|i| format!("e{i}").into_bytes()).collect();
    db.put(b"l", Target::Branch("master"), list(&l0), &o)
        .unwrap();
    db.fork(b"l", &master(), "dev").unwrap();
    let (mut ours, mut theirs) = (l0.clone(), l0.clone());
    ours[10] = b"O".to_vec();
    theirs[40] = b"T".to_vec();
    let a1 = db
        .put(b"l", Target::Branch("master"), list(&ours), &o)
        .unwrap();
    let d1 = db
        .put(b"l", Target::Branch("dev"), list(&theirs), &o)
        .unwrap();
    let manual = BuiltinResolver::Manual;
    db.merge_into(b"l", "master", &At::Uid(d1), &manual, &o)
        .unwrap();
    db.merge_into(b"l", "dev", &At::Uid(a1), &manual, &o)
        .unwrap();
    ours[40] = b"T".to_vec();
    theirs[10] = b"O".to_vec();
    ours[70] = b"mine".to_vec();
    theirs[70] = b"yours".to_vec();
    db.put(b"l", Target::Branch("master"), list(&ours), &o)
        .unwrap();
    let d2 = db
        .put(b"l", Target::Branch("dev"), list(&theirs), &o)
        .unwrap();
    let head = db.resolve(b"l", &master()).unwrap();
    assert_eq!(
        cairn_object::history::merge_bases_in(db.chunks(), b"l", &head, &d2)
            .unwrap()
            .len(),
        2
    );
    let before = store.cids().unwrap().len();
    let r = db
        .merge_into(b"l", "master", &At::Uid(d2), &manual, &o)
        .unwrap();
    assert!(matches!(r, MergeOutcome::Conflicts(_)), "{r:?}");
    assert_eq!(
        store.cids().unwrap().len(),
        before,
        "the virtual base was not kept"
    );
    assert_eq!(db.resolve(b"l", &master()).unwrap(), head);

    // New chunks past the merge's memory: refused, nothing written.
    let small = Db::with_config(
        store.clone(),
        TreeConfig {
            leaf_target: 128,
            index_target: 256,
        },
    )
    .with_merge_memory(64);
    let r = small.merge_into(b"l", "master", &At::Uid(d2), &BuiltinResolver::Ours, &o);
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    assert_eq!(store.cids().unwrap().len(), before);
    let r = db
        .merge_into(b"l", "master", &At::Uid(d2), &BuiltinResolver::Ours, &o)
        .unwrap();
    assert!(matches!(r, MergeOutcome::Merged(_)), "{r:?}");
}

/// A verify racing a put and a GC that collect a head's version between reading the table
/// and walking the head reports no damage for it (the head moved), and still walks the
/// versions it shares with heads that are there; a missing version of a head that did not
/// move is damage.
#[test]
fn verify_racing_a_move_and_a_gc_reports_no_damage() {
    let store = GcBetween::new();
    let db = Db::new(store.clone());
    let o = PutOptions::default();
    let put = |b: &str, s: &str| {
        db.put(b"k", Target::Branch(b), NewValue::String(s.into()), &o)
            .unwrap()
    };
    put("master", "first");
    db.fork(b"k", &master(), "other").unwrap();
    let old = put("master", "second");
    let name = store.ref_of("master", &old);
    let newer = put("other", "third");
    store.race_move(old, name, newer);
    let v = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(v.is_intact(), "{:?}", v.damage);
    assert!(store.race.lock().unwrap().is_none(), "the race ran");
    // Nothing moving: a head whose version is missing is damage.
    *store.race.lock().unwrap() = Some((newer, Vec::new()));
    let v = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(!v.is_intact());
    assert!(
        v.damage.iter().all(|d| d.uid == Some(newer)),
        "{:?}",
        v.damage
    );
}

/// A fork names its key as a put does: an empty key or one over the limit is refused as
/// bad input (it was "not found").
#[test]
fn fork_refuses_a_bad_key_as_bad_input() {
    let (db, _) = db();
    put_str(&db, "k", Target::Branch("master"), "v");
    for key in [
        Vec::new(),
        vec![b'k'; cairn_object::fobject::MAX_KEY_LEN + 1],
    ] {
        let err = db.fork(&key, &At::Branch("master".into()), "b");
        assert!(matches!(err, Err(Error::InvalidInput(_))), "{err:?}");
    }
}

/// A head ref whose value rotted stops GC and every change to its key, and no operation
/// of the key can remove it; `drop_damaged_heads` deletes it (and only it), after which GC
/// runs and the key's other branches go on.
#[test]
fn damaged_head_refs_can_be_dropped() {
    let (db, store) = db();
    put_str(&db, "k", Target::Branch("master"), "one");
    db.fork(b"k", &At::Branch("master".into()), "dev").unwrap();
    put_str(&db, "other", Target::Branch("master"), "fine");
    cairn_store::RefStore::commit(
        &*store,
        &[cairn_store::RefUpdate::Set {
            name: b"bucket/default/k\0\x01tmaster".to_vec(),
            value: b"rotted".to_vec(),
        }],
    )
    .unwrap();
    assert!(db.gc().is_err());
    assert!(db.table(b"k").is_err());
    assert_eq!(db.drop_damaged_heads().unwrap().len(), 1);
    assert!(db.drop_damaged_heads().unwrap().is_empty());
    db.gc().unwrap();
    let t = db.table(b"k").unwrap();
    assert!(t.tagged.contains_key("dev") && !t.tagged.contains_key("master"));
    assert_eq!(string_at(&db, "k", &At::Branch("dev".into())), "one");
    assert_eq!(
        string_at(&db, "other", &At::Branch("master".into())),
        "fine"
    );
}

/// Many untagged heads merge in the order named: an order-sensitive resolver (append)
/// takes every head's change once, in that order, and every head is a base of the result.
#[test]
fn many_untagged_heads_merge_in_the_order_named() {
    let (db, _) = db();
    for n in [2usize, 3, 5, 8, 200] {
        let key = format!("k{n}");
        let b = put_str(&db, &key, Target::Branch("master"), "S");
        let heads: Vec<cairn_object::Uid> = (0..n)
            .map(|i| put_str(&db, &key, Target::Base(b), &format!("S+{i}")))
            .collect();
        // Named in reverse: the merge follows the order given.
        let named: Vec<cairn_object::Uid> = heads.iter().rev().copied().collect();
        let MergeOutcome::Merged(m) = db
            .merge_untagged(
                key.as_bytes(),
                &named,
                &BuiltinResolver::Append,
                &PutOptions::default(),
            )
            .unwrap()
        else {
            panic!("{n} heads")
        };
        let v = db.get(key.as_bytes(), &At::Uid(m)).unwrap().object;
        let Value::String(got) = &v.value else {
            panic!()
        };
        let want: String = std::iter::once("S".to_string())
            .chain((0..n).rev().map(|i| format!("+{i}")))
            .collect();
        assert_eq!(String::from_utf8_lossy(got), want, "{n} heads");
        assert_eq!(v.bases, named, "{n} heads: every head a base, in order");
        assert_eq!(db.list_untagged(key.as_bytes()).unwrap(), vec![m]);
    }
}

/// A store that counts its chunk reads and ref listings, and runs a hook the first time a
/// given chunk is read.
struct Spy {
    inner: Arc<MemoryStore>,
    gets: std::sync::atomic::AtomicUsize,
    lists: std::sync::atomic::AtomicUsize,
    /// Refs the listings returned.
    listed: std::sync::atomic::AtomicUsize,
    trigger: std::sync::Mutex<Option<cairn_store::Hash>>,
    hook: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Spy {
    fn over(inner: Arc<MemoryStore>) -> Self {
        Spy {
            inner,
            gets: 0.into(),
            lists: 0.into(),
            listed: 0.into(),
            trigger: std::sync::Mutex::new(None),
            hook: std::sync::OnceLock::new(),
        }
    }

    fn count(n: &std::sync::atomic::AtomicUsize) -> usize {
        n.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl ChunkStore for Spy {
    fn algo(&self) -> cairn_store::HashAlgo {
        self.inner.algo()
    }
    fn put_hashed(&self, c: cairn_store::Hash, b: &[u8]) -> cairn_core::Result<bool> {
        self.inner.put_hashed(c, b)
    }
    fn get(&self, c: &cairn_store::Hash) -> cairn_core::Result<Option<bytes::Bytes>> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fire = {
            let mut t = self.trigger.lock().unwrap();
            let fire = t.as_ref() == Some(c);
            if fire {
                *t = None;
            }
            fire
        };
        if fire && let Some(h) = self.hook.get() {
            h();
        }
        self.inner.get(c)
    }
    fn has(&self, c: &cairn_store::Hash) -> cairn_core::Result<bool> {
        self.inner.has(c)
    }
    fn cids(&self) -> cairn_core::Result<Vec<cairn_store::Hash>> {
        self.inner.cids()
    }
    fn remove(&self, cids: &[cairn_store::Hash]) -> cairn_core::Result<()> {
        self.inner.remove(cids)
    }
    fn stats(&self) -> cairn_core::Result<cairn_store::StoreStats> {
        self.inner.stats()
    }
}

impl cairn_store::RefStore for Spy {
    fn get_ref(&self, n: &[u8]) -> cairn_core::Result<Option<bytes::Bytes>> {
        self.inner.get_ref(n)
    }
    fn list_refs(&self, p: &[u8]) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.list_refs(p)
    }
    fn list_refs_from(
        &self,
        p: &[u8],
        f: &[u8],
        l: usize,
    ) -> cairn_core::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
        self.lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let refs = self.inner.list_refs_from(p, f, l)?;
        self.listed
            .fetch_add(refs.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(refs)
    }
    fn commit(&self, u: &[cairn_store::RefUpdate]) -> cairn_core::Result<()> {
        self.inner.commit(u)
    }
    fn durability(&self) -> cairn_store::Durability {
        self.inner.durability()
    }
}

/// The merge-base walk stops once no live version carries one of the sides: a master that
/// merged a long-lived feature branch since the fork (the branch forked near the start)
/// was walked down to the feature's start below the answer, every version of master's
/// history read. The answers are as before (a model-based test checks them on random
/// histories).
#[test]
fn merge_base_walks_stop_when_a_side_runs_out() {
    let (db, store) = db();
    let first = put_str(&db, "k", Target::Branch("master"), "0");
    db.fork(b"k", &At::Uid(first), "feature").unwrap();
    put_str(&db, "k", Target::Branch("feature"), "f");
    for i in 1..400 {
        put_str(&db, "k", Target::Branch("master"), &format!("m{i}"));
    }
    // Dev forks; then master merges the feature (forked at the start) and goes on.
    let fork = db.get(b"k", &master()).unwrap().uid;
    db.fork(b"k", &At::Uid(fork), "dev").unwrap();
    let dev = put_str(&db, "k", Target::Branch("dev"), "d");
    db.merge_into(
        b"k",
        "master",
        &At::Branch("feature".into()),
        &BuiltinResolver::Ours,
        &PutOptions::default(),
    )
    .unwrap();
    let mut head = fork;
    for i in 0..5 {
        head = put_str(&db, "k", Target::Branch("master"), &format!("n{i}"));
    }
    let counting = Spy::over(store.clone());
    let bases = cairn_object::history::merge_bases_in(&counting, b"k", &head, &dev).unwrap();
    assert_eq!(bases, vec![fork]);
    let reads = Spy::count(&counting.gets);
    assert!(
        reads < 40,
        "{reads} versions read for a merge base 6 versions down"
    );
}

/// A rename or a removal reads and writes the refs of the branches involved only, not the
/// key's whole table (a Gaia file deleted under archival scopes keeps a branch per delete,
/// each a rename: every delete read them all, twice); the errors are as before.
#[test]
fn renames_and_removals_touch_only_their_branches() {
    let store = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let db = Db::new(store.clone());
    let v = put_str(&db, "k", Target::Branch("master"), "v");
    for i in 0..50 {
        db.fork(b"k", &At::Uid(v), &format!("b{i}")).unwrap();
    }
    let lists = || Spy::count(&store.lists);
    let before = lists();
    db.rename(b"k", "b3", "renamed").unwrap();
    db.remove(b"k", "b4").unwrap();
    db.remove_guarded(b"k", "b5", Some(&v)).unwrap();
    assert_eq!(lists(), before, "no listing of the key's heads");
    let names: Vec<String> = db
        .list_tagged(b"k")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"renamed".to_string()));
    for gone in ["b3", "b4", "b5"] {
        assert!(!names.contains(&gone.to_string()), "{gone}");
    }
    assert_eq!(names.len(), 51 - 3 + 1);
    // The errors, as before (a taken target first).
    assert!(matches!(
        db.rename(b"k", "b6", "b7"),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        db.rename(b"k", "nothing", "b7"),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        db.rename(b"k", "nothing", "x"),
        Err(Error::NotFound(m)) if m.contains("branch")
    ));
    assert!(matches!(
        db.rename(b"none", "master", "x"),
        Err(Error::NotFound(m)) if m.starts_with("key")
    ));
    assert!(matches!(
        db.remove(b"none", "master"),
        Err(Error::NotFound(m)) if m.starts_with("key")
    ));
    assert!(matches!(
        db.remove_guarded(
            b"k",
            "b6",
            Some(&put_str(&db, "j", Target::Branch("master"), "o"))
        ),
        Err(Error::GuardMismatch(_))
    ));
    // Removing every branch removes the key.
    for (n, _) in db.list_tagged(b"k").unwrap() {
        db.remove(b"k", &n).unwrap();
    }
    assert!(matches!(db.table(b"k"), Ok(t) if t.is_empty()));
    assert!(!db.list_keys().unwrap().iter().any(|k| &k[..] == b"k"));
}

/// Damage in a head's history is still reported when a put moves the branch on while
/// verify walks it (the old head stays in the new head's history): the walk is taken
/// again from the key's heads as they are then. Before, the damage was dropped as if GC
/// had collected the version, and verify said the store was intact.
#[test]
fn verify_keeps_damage_a_moving_head_still_reaches() {
    let store = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let cfg = TreeConfig {
        leaf_target: 128,
        index_target: 256,
    };
    let db = Arc::new(Db::with_config(store.clone(), cfg));
    let blob: Vec<u8> = (0..20_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    db.put(
        b"a",
        Target::Branch("master"),
        NewValue::Blob(blob),
        &PutOptions::default(),
    )
    .unwrap();
    let root = db
        .get(b"a", &master())
        .unwrap()
        .object
        .value
        .tree()
        .unwrap()
        .root;
    store.inner.remove(&[root]).unwrap();
    assert!(!db.verify(None, &mut |_, _| {}).unwrap().is_intact());
    // A put on master lands while verify reads the (missing) root.
    let db2 = db.clone();
    let _ = store.hook.set(Box::new(move || {
        db2.put(
            b"a",
            Target::Branch("master"),
            NewValue::Blob(b"new".to_vec()),
            &PutOptions::default(),
        )
        .unwrap();
    }));
    *store.trigger.lock().unwrap() = Some(root);
    let during = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(!during.is_intact(), "{:?}", during.damage);
    // After it, as before.
    assert!(!db.verify(None, &mut |_, _| {}).unwrap().is_intact());

    // A rename while the head is walked (what a Gaia delete under an archival scope
    // does): the head is the same version under another name, walked again there.
    let store = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let db = Arc::new(Db::with_config(store.clone(), cfg));
    let blob: Vec<u8> = (0..20_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    db.put(
        b"a",
        Target::Branch("master"),
        NewValue::Blob(blob),
        &PutOptions::default(),
    )
    .unwrap();
    let root = db
        .get(b"a", &master())
        .unwrap()
        .object
        .value
        .tree()
        .unwrap()
        .root;
    store.inner.remove(&[root]).unwrap();
    let db2 = db.clone();
    let _ = store.hook.set(Box::new(move || {
        db2.rename(b"a", "master", "kept").unwrap();
    }));
    *store.trigger.lock().unwrap() = Some(root);
    let during = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(!during.is_intact(), "renamed: {:?}", during.damage);
}

/// `verify` reads what versions of a blob share once: 31 versions of a 2 MB blob, each a
/// small edit of the one before, cost about the chunks the store holds, not 31 trees; a
/// damaged leaf they all share is still reported in every version.
#[test]
fn verify_reads_what_versions_share_once() {
    let (db, store) = db();
    let o = PutOptions::default();
    let data = noise(2 << 20, 11);
    let mut uids = vec![
        db.put(b"doc", Target::Branch("master"), NewValue::Blob(data), &o)
            .unwrap(),
    ];
    for i in 0..30u64 {
        uids.push(
            db.update(
                b"doc",
                Target::Branch("master"),
                Op::BlobSplice {
                    offset: (1 << 20) + i * 20_000,
                    delete: 3,
                    insert: vec![i as u8; 7],
                },
                &o,
            )
            .unwrap(),
        );
    }
    let tree_chunks = |uid| {
        let t = *db
            .get(b"doc", &At::Uid(uid))
            .unwrap()
            .object
            .value
            .tree()
            .unwrap();
        let mut n = 0u64;
        postree::walk(db.chunks(), &t, &mut |_, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
        n
    };
    let whole: u64 = uids.iter().map(|u| tree_chunks(*u)).sum();
    let report = db.verify(None, &mut |_, _| {}).unwrap();
    assert!(report.is_intact());
    assert_eq!(report.versions, 31);
    let stored = store.stats().unwrap().chunks;
    assert!(
        // (The leaves beside an edit, under an index node it changed, are read again.)
        report.chunks < 2 * stored && report.chunks * 10 < whole,
        "{} chunks read, {stored} stored, {whole} in the 31 trees",
        report.chunks
    );
    // The first leaf is in every version.
    let t = *db
        .get(b"doc", &At::Uid(uids[0]))
        .unwrap()
        .object
        .value
        .tree()
        .unwrap();
    let mut first_leaf = None;
    postree::walk(db.chunks(), &t, &mut |cid, bytes| {
        if first_leaf.is_none() && postree::child_cids(bytes)?.is_empty() {
            first_leaf = Some(*cid);
        }
        Ok(())
    })
    .unwrap();
    let victim = first_leaf.unwrap();
    let mut bytes = store.get(&victim).unwrap().unwrap().to_vec();
    bytes[10] ^= 1;
    assert!(store.tamper(&victim, bytes));
    let report = db.verify(None, &mut |_, _| {}).unwrap();
    let damaged: BTreeSet<_> = report.damage.iter().filter_map(|d| d.uid).collect();
    assert_eq!(damaged, uids.iter().copied().collect::<BTreeSet<_>>());
}

/// A listing of the keys with a branch reads past a key's long archive of other branches
/// with one lookup, and a bounded listing stops after about its budget of refs at a key
/// boundary, going on from there: every key with the branch is listed once, however the
/// pages fall.
#[test]
fn a_branch_listing_skips_archives_and_keeps_to_its_budget() {
    let spy = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let db = Db::new(spy.clone());
    let first = put_str(&db, "a-file", Target::Branch("master"), "a");
    let b = put_str(&db, "b-file", Target::Branch("master"), "b");
    for i in 0..2000 {
        db.fork(b"b-file", &At::Uid(b), &format!(".history.{i:05}"))
            .unwrap();
    }
    for i in 0..300 {
        put_str(
            &db,
            &format!("c-gone-{i:03}"),
            Target::Branch(".history.1"),
            "c",
        );
    }
    put_str(&db, "d-file", Target::Branch("master"), "d");
    let _ = first;
    let files: Vec<bytes::Bytes> = ["a-file", "b-file", "d-file"]
        .iter()
        .map(|k| bytes::Bytes::copy_from_slice(k.as_bytes()))
        .collect();
    let listed = || Spy::count(&spy.listed);
    let before = listed();
    let (keys, more) = db.list_keys_page_on(None, 100, Some("master")).unwrap();
    assert_eq!((keys, more), (files.clone(), false));
    let read = listed() - before;
    assert!(read < 700, "{read} refs read for 2302 stored");
    // Bounded: pages of at most about 50 refs each, ending at key boundaries.
    let mut all = Vec::new();
    let mut after: Option<bytes::Bytes> = None;
    let mut calls = 0;
    loop {
        let before = listed();
        let (keys, next) = db
            .list_keys_page_bounded(after.as_deref(), 100, Some("master"), 50)
            .unwrap();
        calls += 1;
        assert!(
            listed() - before <= 50 + 101 + 9,
            "{} refs read",
            listed() - before
        );
        all.extend(keys);
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(all, files);
    assert!(
        calls > 3,
        "the run of 300 keys without master took {calls} calls"
    );
}

/// `gc_with_progress` names each phase as it starts, in order, with the counts it knows
/// (what the CLI's spinner shows on a long collection), and collects as `gc` does.
#[test]
fn gc_names_its_phases() {
    let (db, _store) = db();
    put_str(&db, "keep", Target::Branch("master"), "kept");
    put_str(&db, "tmp", Target::Branch("master"), "garbage soon");
    db.remove(b"tmp", "master").unwrap();
    let mut phases = Vec::new();
    let r = db
        .gc_with_progress(&mut |p| phases.push(p.to_string()))
        .unwrap();
    assert_eq!(r.removed, 1);
    let starts: Vec<&str> = phases
        .iter()
        .map(|p| p.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(
        starts,
        [
            "listing",
            "marking",
            "reading",
            "marking",
            "removing",
            "compacting"
        ],
        "{phases:?}"
    );
    assert_eq!(phases[4], "removing 1 chunks");
}

/// `last_tagged_with_prefix` finds the greatest branch name under a prefix, with its head,
/// reading a few refs however many branches the key has; names of other prefixes (before
/// and after it) are not taken, and a name that is a prefix of another is handled.
#[test]
fn the_last_tagged_branch_under_a_prefix_is_found_without_reading_all() {
    let spy = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let db = Db::new(spy.clone());
    let u = put_str(&db, "f", Target::Branch("master"), "x");
    assert_eq!(db.last_tagged_with_prefix(b"f", ".history.").unwrap(), None);
    for b in ["zzz", ".hist", ".historz", ".history"] {
        db.fork(b"f", &At::Uid(u), b).unwrap();
    }
    assert_eq!(db.last_tagged_with_prefix(b"f", ".history.").unwrap(), None);
    let mut names = Vec::new();
    let mut x: u64 = 12345;
    for n in [1usize, 5, 63, 64, 65, 300] {
        while names.len() < n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let name = format!(
                ".history.{}.{:x}",
                1_700_000_000_000 + (x >> 44),
                x & 0xffff
            );
            if !names.contains(&name) {
                db.fork(b"f", &At::Uid(u), &name).unwrap();
                names.push(name);
            }
        }
        let max = names.iter().max().unwrap().clone();
        let before = Spy::count(&spy.listed);
        let got = db.last_tagged_with_prefix(b"f", ".history.").unwrap();
        assert_eq!(got, Some((max.clone(), u)), "{n} names");
        let read = Spy::count(&spy.listed) - before;
        assert!(read <= 64 + 20 * 9, "{read} refs read for {n} names");
    }
    // A name that is a prefix of the others, and the greatest under a longer prefix.
    db.fork(b"f", &At::Uid(u), ".history.9").unwrap();
    db.fork(b"f", &At::Uid(u), ".history.9.1").unwrap();
    assert_eq!(
        db.last_tagged_with_prefix(b"f", ".history.").unwrap(),
        Some((".history.9.1".to_string(), u))
    );
    assert_eq!(
        db.last_tagged_with_prefix(b"f", ".history.9").unwrap(),
        Some((".history.9.1".to_string(), u))
    );
}

/// A merge into a branch reads and writes the refs involved only (the target branch, and
/// the untagged heads it retires), not the key's whole table; outcomes and errors are as
/// before.
#[test]
fn merges_into_a_branch_touch_only_their_refs() {
    let store = Arc::new(Spy::over(Arc::new(MemoryStore::new())));
    let db = Db::new(store.clone());
    let o = PutOptions::default();
    let v = put_str(&db, "k", Target::Branch("master"), "v");
    for i in 0..50 {
        db.fork(b"k", &At::Uid(v), &format!("b{i}")).unwrap();
    }
    put_str(&db, "k", Target::Branch("b1"), "v1");
    // An untagged head from a put on a base.
    let loose = db
        .put(
            b"k",
            Target::Base(v),
            NewValue::String(b"loose".to_vec()),
            &o,
        )
        .unwrap();
    let lists = || Spy::count(&store.lists);
    let before = lists();
    let ff = db
        .merge_into(
            b"k",
            "master",
            &At::Branch("b1".into()),
            &BuiltinResolver::Manual,
            &o,
        )
        .unwrap();
    assert!(matches!(ff, MergeOutcome::FastForward(_)), "{ff:?}");
    // Up to date, from the untagged head's ancestor: nothing to do.
    let same = db
        .merge_into(b"k", "b2", &At::Uid(v), &BuiltinResolver::Manual, &o)
        .unwrap();
    assert!(matches!(same, MergeOutcome::UpToDate(_)), "{same:?}");
    // The untagged head merged into master: it leaves the heads.
    let merged = db
        .merge_into(b"k", "master", &At::Uid(loose), &BuiltinResolver::Ours, &o)
        .unwrap();
    assert!(matches!(merged, MergeOutcome::Merged(_)), "{merged:?}");
    assert_eq!(lists(), before, "no listing of the key's heads");
    assert!(db.list_untagged(b"k").unwrap().is_empty());
    assert_eq!(db.list_tagged(b"k").unwrap().len(), 51);
    assert!(matches!(
        db.merge_into(b"k", "nothing", &At::Uid(v), &BuiltinResolver::Manual, &o),
        Err(Error::NotFound(m)) if m.contains("branch")
    ));
    assert!(matches!(
        db.merge_into(b"none", "master", &At::Uid(v), &BuiltinResolver::Manual, &o),
        Err(Error::NotFound(m)) if m.starts_with("key")
    ));
}

/// `verify_with_progress` reports within a large value (every 4096 chunks), then after
/// each key, with counts that only grow and end at the report's.
#[test]
fn verify_reports_progress_within_a_large_value() {
    let (db, _store) = db();
    let o = PutOptions::default();
    db.put(
        b"big",
        Target::Branch("master"),
        NewValue::Blob(noise(24 << 20, 5)),
        &o,
    )
    .unwrap();
    put_str(&db, "small", Target::Branch("master"), "s");
    let mut seen: Vec<VerifyProgress> = Vec::new();
    let report = db
        .verify_with_progress(None, &mut |p| seen.push(*p))
        .unwrap();
    assert!(report.is_intact());
    assert!(
        seen.iter().any(|p| p.keys_done == 0 && p.chunks >= 4096),
        "no progress inside the large value: {:?}",
        &seen[..seen.len().min(4)]
    );
    assert!(
        seen.windows(2)
            .all(|w| w[0].chunks <= w[1].chunks && w[0].keys_done <= w[1].keys_done)
    );
    assert_eq!(
        seen.last().copied(),
        Some(VerifyProgress {
            keys_done: 2,
            keys_total: 2,
            chunks: report.chunks
        })
    );
}

/// A chunk no head reaches that fails its hash (a dead version's leaf, a capsule's chunk
/// sharing the store) is kept and counted, and the collection goes on: it stopped every
/// later GC for good (no tool removes it).
#[test]
fn gc_keeps_and_counts_damaged_chunks_no_head_reaches() {
    let (db, store) = db();
    let o = PutOptions::default();
    put_str(&db, "keep", Target::Branch("master"), "kept");
    let u = db
        .put(
            b"dead",
            Target::Branch("master"),
            NewValue::Blob(noise(20_000, 7)),
            &o,
        )
        .unwrap();
    db.remove(b"dead", "master").unwrap();
    let mut leaf = db.load(&u).unwrap().value.tree().unwrap().root;
    loop {
        let bytes = store.get(&leaf).unwrap().unwrap();
        match postree::child_cids(&bytes).unwrap().first() {
            Some(child) => leaf = *child,
            None => break,
        }
    }
    let mut other = vec![0xCA, 0x02];
    other.extend_from_slice(b"a capsule's chunk");
    let other = store.put(&other).unwrap();
    for c in [leaf, other] {
        let mut bytes = store.get(&c).unwrap().unwrap().to_vec();
        bytes[5] ^= 1;
        assert!(store.tamper(&c, bytes));
    }
    let r = db.gc().unwrap();
    assert_eq!(r.damaged_kept, 2);
    assert!(r.removed > 0, "the dead version's sound chunks go");
    assert!(store.cids().unwrap().contains(&leaf));
    assert!(store.cids().unwrap().contains(&other));
    assert_eq!(string_at(&db, "keep", &master()), "kept");
}
