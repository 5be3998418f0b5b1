//! Every bucket is a capsule: mutations become signed records, every version a writer made
//! has a proof a reader checks against the capsule alone, and forged or misplaced proofs are
//! refused.

use std::sync::Arc;

use cairn_capsule::*;
use cairn_core::{Error, SigningKey};
use cairn_object::{At, BuiltinResolver, Db, MergeOutcome, NewValue, PutOptions, Target};
use cairn_store::{LogStore, LogStoreOptions, MemoryStore, Store};
use proptest::prelude::*;

mod support;

fn server(store: &Arc<dyn Store>) -> Arc<CapsuleServer> {
    Arc::new(CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    ))
}

fn open(store: &Arc<dyn Store>, key: Option<SigningKey>) -> cairn_core::Result<Bucket> {
    Bucket::open(Db::new(store.clone()), server(store), key)
}

fn writer() -> SigningKey {
    SigningKey::from_seed(&[1; 32])
}

fn s(v: &str) -> NewValue {
    NewValue::String(v.as_bytes().to_vec())
}

fn proven(b: &Bucket, key: &[u8], uid: &cairn_object::Uid) -> Mutation {
    let p = b.prove(key, uid).unwrap();
    let meta = b.metadata().unwrap();
    // The reader trusts the capsule name only: the metadata must hash to it.
    assert_eq!(meta.name(), b.capsule().unwrap());
    let back = VersionProof::from_bytes(&p.to_bytes()).unwrap();
    assert_eq!(back, p);
    p.verify(meta, key, uid).unwrap().0
}

#[test]
fn every_mutation_is_a_record_and_versions_are_proven() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
    let f = b.fork(b"k", &At::Branch("master".into()), "dev").unwrap();
    assert_eq!(f, v1);
    let v2 = b.put(b"k", Target::Branch("dev"), s("ab"), &o).unwrap();
    let v3 = b.put(b"k", Target::Branch("master"), s("ac"), &o).unwrap();
    let MergeOutcome::Merged(m) = b
        .merge_into(
            b"k",
            "master",
            &At::Branch("dev".into()),
            &BuiltinResolver::Ours,
            &o,
        )
        .unwrap()
    else {
        panic!("expected a merge")
    };
    let u1 = b.put(b"k", Target::Base(v1), s("x"), &o).unwrap();
    b.rename(b"k", "dev", "old").unwrap();
    b.remove(b"k", "old").unwrap();

    let capsule = b.capsule().unwrap();
    let records = b.server().with_dag(&capsule, |d| d.len()).unwrap();
    assert_eq!(records, 8, "one record per mutation");
    let m1 = proven(&b, b"k", &v1);
    assert_eq!(m1.kind, MutationKind::Put);
    assert_eq!(m1.branch.as_deref(), Some("master"));
    assert!(m1.bases.is_empty());
    let mm = proven(&b, b"k", &m);
    assert_eq!(mm.kind, MutationKind::Merge);
    assert_eq!(mm.bases.len(), 2);
    assert!(mm.bases.contains(&v2) && mm.bases.contains(&v3));
    let mu = proven(&b, b"k", &u1);
    assert_eq!(mu.branch, None, "a put on a base makes an untagged head");
    // Fork, rename and remove are recorded but make no version.
    let kinds: Vec<MutationKind> = b
        .server()
        .with_dag(&capsule, |d| d.order().to_vec())
        .unwrap()
        .iter()
        .map(|n| {
            let r = b.server().read(&capsule, n).unwrap();
            Mutation::decode(&r.body).unwrap().kind
        })
        .collect();
    assert_eq!(
        kinds,
        [
            MutationKind::Put,
            MutationKind::Fork,
            MutationKind::Put,
            MutationKind::Put,
            MutationKind::Merge,
            MutationKind::Put,
            MutationKind::Rename,
            MutationKind::Remove
        ]
    );
    // A failed mutation changes nothing and records nothing.
    assert!(b.rename(b"k", "nope", "x").is_err());
    assert!(
        b.put(b"k", Target::Branch("master"), NewValue::Integer(1), &o)
            .is_err()
    );
    assert_eq!(b.server().with_dag(&capsule, |d| d.len()).unwrap(), 8);
}

#[test]
fn concurrent_writers_share_signatures_and_every_version_is_proven() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = Arc::new(open(&store, Some(writer())).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for i in 0..40 {
                    let key = format!("t{t}/key{}", i % 5).into_bytes();
                    let uid = b
                        .put(
                            &key,
                            Target::Branch("master"),
                            s(&format!("{t}/{i}")),
                            &PutOptions::default(),
                        )
                        .unwrap();
                    out.push((key, uid));
                }
                out
            })
        })
        .collect();
    let all: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let capsule = b.capsule().unwrap();
    let (records, heads) = b
        .server()
        .with_dag(&capsule, |d| (d.len(), d.heads()))
        .unwrap();
    assert_eq!(records, all.len());
    assert_eq!(heads.len(), 1, "the records form one chain");
    for (key, uid) in &all {
        proven(&b, key, uid);
    }
}

#[test]
fn reopen_continues_the_chain_and_guards_the_writer_key() {
    let dir = tempfile::tempdir().unwrap();
    let o = PutOptions::default();
    let v1 = {
        let store: Arc<dyn Store> =
            Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
        let b = open(&store, Some(writer())).unwrap();
        b.put(b"k", Target::Branch("master"), s("one"), &o).unwrap()
    };
    let store: Arc<dyn Store> =
        Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
    // Read-only: proofs work, writes are refused and change nothing.
    let ro = open(&store, None).unwrap();
    proven(&ro, b"k", &v1);
    let e = ro
        .put(b"k", Target::Branch("master"), s("two"), &o)
        .unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    assert_eq!(ro.db().get(b"k", &At::default_branch()).unwrap().uid, v1);
    drop(ro);
    // Another key is not a writer of this bucket.
    let e = open(&store, Some(SigningKey::from_seed(&[2; 32])))
        .err()
        .unwrap();
    assert!(matches!(e, Error::Rejected(_)), "{e}");
    assert!(
        e.to_string().contains("not a writer of bucket default"),
        "{e}"
    );
    // The writer continues the same chain.
    let b = open(&store, Some(writer())).unwrap();
    let v2 = b.put(b"k", Target::Branch("master"), s("two"), &o).unwrap();
    let capsule = b.capsule().unwrap();
    let heads = b.server().with_dag(&capsule, |d| d.heads()).unwrap();
    assert_eq!(heads.len(), 1);
    proven(&b, b"k", &v1);
    proven(&b, b"k", &v2);
    // Buckets are separate namespaces with separate capsules.
    let other = Bucket::open(
        Db::new(store.clone()).in_bucket("photos").unwrap(),
        server(&store),
        Some(writer()),
    )
    .unwrap();
    assert_ne!(other.capsule(), b.capsule());
    assert!(other.db().get(b"k", &At::default_branch()).is_err());
    assert!(other.prove(b"k", &v2).is_err());
    assert!(Db::new(store.clone()).in_bucket("Bad/Name").is_err());
}

#[test]
fn forged_or_misplaced_version_proofs_are_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
    let v2 = b.put(b"k", Target::Branch("master"), s("b"), &o).unwrap();
    let w = b.put(b"w", Target::Branch("master"), s("c"), &o).unwrap();
    let meta = b.metadata().unwrap().clone();
    let p = b.prove(b"k", &v1).unwrap();
    let rejected = |r: cairn_core::Result<(Mutation, Vec<RecordName>)>| match r {
        Err(Error::Rejected(m)) => m,
        other => panic!("expected a rejection, got {other:?}"),
    };
    // The proof names v1 of k only.
    rejected(p.verify(&meta, b"k", &v2));
    rejected(p.verify(&meta, b"w", &v1));
    rejected(b.prove(b"w", &w).unwrap().verify(&meta, b"k", &w));
    // A body edited to name another version no longer matches its header.
    let mut forged = p.clone();
    let mut m = Mutation::decode(&forged.record.body).unwrap();
    m.uid = v2;
    forged.record.body = m.encode();
    rejected(forged.verify(&meta, b"k", &v2));
    // A new record claiming v2, built without the writer key, has no valid chain.
    let mut forged = p.clone();
    forged.record = Record::new(meta.name(), m.encode(), vec![p.record.name()]);
    rejected(forged.verify(&meta, b"k", &v2));
    // Another capsule's metadata (another writer) does not accept the proof.
    let mut stranger = meta.clone();
    stranger.writers = vec![SigningKey::from_seed(&[3; 32]).public()];
    rejected(p.verify(&stranger, b"k", &v1));
    // A truncated or padded encoding does not decode.
    let bytes = p.to_bytes();
    for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
        assert!(VersionProof::from_bytes(&bytes[..cut]).is_err());
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(VersionProof::from_bytes(&padded).is_err());
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    let uid =
        any::<[u8; 32]>().prop_map(|d| cairn_core::Hash::new(cairn_core::HashAlgo::Blake3, d));
    (
        0u8..5,
        proptest::collection::vec(any::<u8>(), 1..40),
        "[a-z]{1,8}",
        "[a-z]{1,8}",
        uid.clone(),
        proptest::collection::vec(uid, 0..4),
        any::<bool>(),
        (any::<bool>(), any::<u64>(), any::<u8>(), any::<bool>()),
    )
        .prop_map(|(k, key, branch, from, uid, bases, tagged, seal)| {
            let kind = [
                MutationKind::Put,
                MutationKind::Fork,
                MutationKind::Merge,
                MutationKind::Rename,
                MutationKind::Remove,
            ][k as usize];
            let creates = matches!(kind, MutationKind::Put | MutationKind::Merge);
            let bases = if creates { bases } else { Vec::new() };
            // A seal names a base only on a put with one.
            let names_base = seal.3 && bases.len() == 1;
            Mutation {
                kind,
                key,
                branch: (tagged || !creates).then_some(branch),
                from: (kind == MutationKind::Rename).then_some(from),
                uid,
                bases,
                // Only puts carry seals (any bytes: decoding checks the format only).
                seal: (kind == MutationKind::Put && seal.0).then(|| OwnerSeal {
                    date: seal.1,
                    nonce: [seal.2; 16],
                    names_base,
                    signature: cairn_core::Signature::from_raw(&[seal.2; 64]).unwrap(),
                }),
            }
        })
}

proptest! {
    #[test]
    fn mutations_round_trip_canonically(m in mutation_strategy()) {
        let bytes = m.encode();
        prop_assert_eq!(Mutation::decode(&bytes).unwrap(), m);
        for cut in 0..bytes.len() {
            prop_assert!(Mutation::decode(&bytes[..cut]).is_err());
        }
    }
}

#[test]
fn a_bucket_can_list_several_writers() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a, b) = (writer(), SigningKey::from_seed(&[2; 32]));
    let mut meta = CapsuleMetadata::new(cairn_core::HashAlgo::Blake3, a.public(), "shared");
    meta.writers.push(b.public());
    // Bodies must be plaintext and the metadata must name the bucket.
    let e = Bucket::open_with_metadata(
        Db::new(store.clone()),
        server(&store),
        Some(a.clone()),
        meta.clone(),
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    meta.cipher = BodyCipher::Plaintext;
    meta.settings
        .insert(bucket::BUCKET_SETTING.into(), "default".into());
    let srv = server(&store);
    let ba = Bucket::open_with_metadata(Db::new(store.clone()), srv.clone(), Some(a), meta.clone())
        .unwrap();
    let o = PutOptions::default();
    let v1 = ba.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
    drop(ba);
    let bb = Bucket::open(Db::new(store.clone()), srv, Some(b)).unwrap();
    assert_eq!(bb.capsule(), Some(meta.name()));
    let v2 = bb.put(b"k", Target::Branch("master"), s("b"), &o).unwrap();
    proven(&bb, b"k", &v1);
    proven(&bb, b"k", &v2);
    // Another metadata for the same bucket is refused.
    let mut other = meta.clone();
    other.description = "another".into();
    assert!(
        Bucket::open_with_metadata(Db::new(store.clone()), server(&store), None, other).is_err()
    );
}

/// Seeded random bytes, so content-defined chunking finds its boundaries.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Metadata the default bucket accepts (plaintext, naming the bucket), with `writer()`
/// as its writer and no leaf size setting.
fn default_bucket_metadata() -> CapsuleMetadata {
    let mut meta = CapsuleMetadata::new(cairn_core::HashAlgo::Blake3, writer().public(), "b");
    meta.cipher = BodyCipher::Plaintext;
    meta.settings
        .insert(bucket::BUCKET_SETTING.into(), "default".into());
    meta
}

/// The tree root `data` gets as a Blob under `leaf` bytes per leaf.
fn blob_root(leaf: u64, data: &[u8]) -> cairn_object::TreeRef {
    let cfg = cairn_object::TreeConfig::default()
        .with_leaf_target(leaf)
        .unwrap();
    cairn_object::postree::build_blob(&MemoryStore::new(), &cfg, data).unwrap()
}

#[test]
fn a_bucket_keeps_the_leaf_size_it_was_created_with() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let big = cairn_object::TreeConfig::default()
        .with_leaf_target(64 << 10)
        .unwrap();
    let db = Db::new(store.clone()).with_tree_config(big);
    let b = Bucket::open(db, server(&store), Some(writer())).unwrap();
    let meta = b.metadata().unwrap();
    assert_eq!(
        meta.settings
            .get(bucket::LEAF_SIZE_SETTING)
            .map(String::as_str),
        Some("65536")
    );
    let data = noise(700_000, 7);
    let o = PutOptions::default();
    let v1 = b
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::Blob(data.clone()),
            &o,
        )
        .unwrap();
    drop(b);
    // Reopened by a process configured for 4 KiB leaves: the bucket's own size wins.
    let b = open(&store, Some(writer())).unwrap();
    assert_eq!(b.db().tree_config().leaf_target, 64 << 10);
    let mut more = data.clone();
    more.extend_from_slice(&noise(300_000, 8));
    let v2 = b
        .put_blob_stream(
            b"k",
            Target::Branch("master"),
            &mut more.as_slice(),
            &o,
            &mut |_| {},
        )
        .unwrap();
    let root = |uid| {
        *b.db()
            .get(b"k", &At::Uid(uid))
            .unwrap()
            .object
            .value
            .tree()
            .unwrap()
    };
    assert_eq!(root(v1), blob_root(64 << 10, &data));
    assert_eq!(root(v2), blob_root(64 << 10, &more));
    assert_ne!(root(v2), blob_root(4096, &more));
    proven(&b, b"k", &v2);
    // An edit re-chunks with the bucket's size too: the root a fresh build gives.
    let insert = noise(3000, 9);
    let v3 = b
        .update(
            b"k",
            Target::Branch("master"),
            cairn_object::Op::BlobSplice {
                offset: 400_000,
                delete: 5000,
                insert: insert.clone(),
            },
            &o,
        )
        .unwrap();
    more.splice(400_000..405_000, insert);
    assert_eq!(root(v3), blob_root(64 << 10, &more));
    proven(&b, b"k", &v3);
}

#[test]
fn an_unusable_leaf_size_creates_nothing_and_does_not_block_reads() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // A Db configured with an odd leaf size: refused before the capsule is created.
    let odd = cairn_object::TreeConfig {
        leaf_target: 4097,
        index_target: 4096,
    };
    let e = Bucket::open(
        Db::new(store.clone()).with_tree_config(odd),
        server(&store),
        Some(writer()),
    )
    .err()
    .unwrap();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "invalid input: bucket default: metadata setting cairn.leaf_size = \"4097\" is \
         unusable: leaf size 4097 must be an even number of bytes from 64 to 2097152"
    );
    assert_eq!(open(&store, None).unwrap().capsule(), None);

    // A capsule written by some other version with a size this one cannot use (made by
    // hand here): writers are refused, readers are not.
    let mut meta = default_bucket_metadata();
    meta.settings
        .insert(bucket::LEAF_SIZE_SETTING.into(), "8388608".into());
    let srv = server(&store);
    srv.create(&meta).unwrap();
    store
        .commit(&[cairn_store::RefUpdate::Set {
            name: b"bucket-capsule/default".to_vec(),
            value: meta.name().hash().to_bytes().to_vec(),
        }])
        .unwrap();
    let e = Bucket::open(Db::new(store.clone()), srv.clone(), Some(writer()))
        .err()
        .unwrap();
    assert!(e.to_string().contains("8388608"), "{e}");
    let r = Bucket::open(Db::new(store.clone()), srv, None).unwrap();
    assert_eq!(r.capsule(), Some(meta.name()));
    assert!(r.db().list_keys().unwrap().is_empty());
}

#[test]
fn a_bucket_without_a_leaf_size_setting_keeps_4_kib_and_a_bad_one_is_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let big = cairn_object::TreeConfig::default()
        .with_leaf_target(64 << 10)
        .unwrap();
    let meta = default_bucket_metadata();
    // Unusable sizes: refused with a clear error, and no capsule is created.
    for bad in ["abc", "65537", "32", "4194304", "-1"] {
        let mut m = meta.clone();
        m.settings
            .insert(bucket::LEAF_SIZE_SETTING.into(), bad.into());
        let e = Bucket::open_with_metadata(
            Db::new(store.clone()).with_tree_config(big),
            server(&store),
            Some(writer()),
            m,
        )
        .err()
        .unwrap();
        assert!(matches!(e, Error::InvalidInput(_)), "{bad}: {e}");
        assert!(e.to_string().contains(bucket::LEAF_SIZE_SETTING), "{e}");
        let probe = open(&store, None).unwrap();
        assert_eq!(probe.capsule(), None, "{bad}: nothing may be created");
    }
    // Metadata written before the setting existed: the 4 KiB default, whatever the Db says.
    let b = Bucket::open_with_metadata(
        Db::new(store.clone()).with_tree_config(big),
        server(&store),
        Some(writer()),
        meta,
    )
    .unwrap();
    assert_eq!(b.db().tree_config().leaf_target, 4096);
    let data = noise(200_000, 3);
    let v = b
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::Blob(data.clone()),
            &PutOptions::default(),
        )
        .unwrap();
    let t = *b
        .db()
        .get(b"k", &At::Uid(v))
        .unwrap()
        .object
        .value
        .tree()
        .unwrap();
    assert_eq!(t, blob_root(4096, &data));
}

/// The record comes before the head: a mutation whose record cannot be written fails and
/// leaves every head as it was, and the bucket goes on (its chain continues from what the
/// capsule holds, so later versions are proven).
#[test]
fn a_mutation_whose_record_fails_changes_no_head() {
    // Fails the journal's commits (the capsule's ref moves) while `fail` is 1 (unavailable)
    // or 2 (a full disk).
    let fail = Arc::new(std::sync::atomic::AtomicU8::new(0));
    let gate = fail.clone();
    let store: Arc<dyn Store> = Arc::new(support::GatedCommits::new(move |updates| {
        let journal = updates.iter().any(|u| match u {
            cairn_store::RefUpdate::Set { name, .. } | cairn_store::RefUpdate::Delete { name } => {
                name.starts_with(b"capsule/")
            }
        });
        match gate.load(std::sync::atomic::Ordering::SeqCst) {
            1 if journal => Err(Error::Unavailable("journal disk failed (injected)".into())),
            2 if journal => Err(Error::io(
                "writing the journal",
                std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full (injected)"),
            )),
            _ => Ok(()),
        }
    }));
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b.put(b"k", Target::Branch("master"), s("one"), &o).unwrap();
    b.fork(b"k", &At::Branch("master".into()), "dev").unwrap();
    let capsule = b.capsule().unwrap();
    let records = b.server().with_dag(&capsule, |d| d.len()).unwrap();
    let heads = |b: &Bucket| {
        (
            b.db().list_tagged(b"k").unwrap(),
            b.db().list_untagged(b"k").unwrap(),
        )
    };
    let before = heads(&b);

    for mode in [1, 2] {
        fail.store(mode, std::sync::atomic::Ordering::SeqCst);
        let failures: Vec<cairn_core::Error> = vec![
            b.put(b"k", Target::Branch("master"), s("two"), &o)
                .unwrap_err(),
            b.put(b"k", Target::Base(v1), s("side"), &o).unwrap_err(),
            b.put(b"new", Target::Branch("master"), s("x"), &o)
                .unwrap_err(),
            b.fork(b"k", &At::Branch("master".into()), "f").unwrap_err(),
            b.rename(b"k", "dev", "dev2").unwrap_err(),
            b.remove(b"k", "dev").unwrap_err(),
        ];
        for e in &failures {
            if mode == 1 {
                assert!(matches!(e, Error::Unavailable(_)), "{e}");
            } else {
                // A full disk stays an I/O error of its kind (the node answers 507).
                assert!(
                    matches!(e, Error::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::StorageFull),
                    "{e}"
                );
                assert!(e.to_string().contains("disk full (injected)"), "{e}");
            }
            assert!(e.to_string().contains("nothing was committed"), "{e}");
        }
    }
    assert_eq!(heads(&b), before, "no head moved");
    assert!(
        matches!(b.db().list_tagged(b"new"), Err(Error::NotFound(_))),
        "key \"new\" was never created"
    );
    assert_eq!(b.server().with_dag(&capsule, |d| d.len()).unwrap(), records);

    // The disk is back: writing goes on, and the new version is proven.
    fail.store(0, std::sync::atomic::Ordering::SeqCst);
    let v2 = b.put(b"k", Target::Branch("master"), s("two"), &o).unwrap();
    assert_eq!(proven(&b, b"k", &v2).bases, vec![v1]);
    let reopened = open(&store, Some(writer())).unwrap();
    assert_eq!(proven(&reopened, b"k", &v2).uid, v2);
}

/// Merging three untagged heads makes one version with all three as bases, so every
/// version in the new head's history has a proof (pairwise merges used to leave an
/// unrecorded intermediate version in it); a merge that finds the other side contained
/// records the untagged head it drops.
#[test]
fn merged_untagged_heads_leave_only_recorded_versions() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
    let heads: Vec<_> = ["x", "y", "z"]
        .iter()
        .map(|v| b.put(b"k", Target::Base(v1), s(v), &o).unwrap())
        .collect();
    let MergeOutcome::Merged(m) = b
        .merge_untagged(b"k", &[], &BuiltinResolver::Append, &o)
        .unwrap()
    else {
        panic!("expected a merge")
    };
    let mm = proven(&b, b"k", &m);
    assert_eq!(mm.kind, MutationKind::Merge);
    let mut bases = mm.bases.clone();
    bases.sort();
    let mut want = heads.clone();
    want.sort();
    assert_eq!(bases, want, "one version based on every merged head");
    let db = b.db();
    let mut stack = vec![m];
    while let Some(u) = stack.pop() {
        proven(&b, b"k", &u);
        stack.extend(db.load(&u).unwrap().bases);
    }
    // Contained: fork at the merged head, then merge an older untagged head into it.
    let old = b.put(b"k", Target::Base(v1), s("w"), &o).unwrap();
    let w = b.put(b"k", Target::Base(old), s("w2"), &o).unwrap();
    b.fork(b"k", &At::Uid(w), "dev").unwrap();
    let before = b
        .server()
        .with_dag(&b.capsule().unwrap(), |d| d.len())
        .unwrap();
    let r = b
        .merge_into(b"k", "dev", &At::Uid(w), &BuiltinResolver::Manual, &o)
        .unwrap();
    assert!(matches!(r, MergeOutcome::UpToDate(_)), "{r:?}");
    assert!(!b.db().list_untagged(b"k").unwrap().contains(&w));
    let capsule = b.capsule().unwrap();
    let after = b
        .server()
        .with_dag(&capsule, |d| d.order().to_vec())
        .unwrap();
    assert_eq!(after.len(), before + 1, "the dropped head is recorded");
    let last = b.server().read(&capsule, &after[after.len() - 1]).unwrap();
    let m = Mutation::decode(&last.body).unwrap();
    assert_eq!((m.kind, m.branch, m.uid), (MutationKind::Remove, None, w));
}

/// Anyone may write unsigned records to a bucket's capsule. One naming a version nobody
/// made must stay unproven when the bucket is opened again and writes: its writer
/// continues from proven heads only, so its signature never vouches for the made-up
/// record (before, it pointed at every head, and the forged version proof verified).
#[test]
fn a_non_writers_unsigned_record_never_gets_the_writers_signature() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let srv = server(&store);
    let o = PutOptions::default();
    let first = {
        let b = Bucket::open(Db::new(store.clone()), srv.clone(), Some(writer())).unwrap();
        b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap()
    };
    let (meta, capsule) = {
        let b = Bucket::open(Db::new(store.clone()), srv.clone(), None).unwrap();
        (b.metadata().unwrap().clone(), b.capsule().unwrap())
    };
    let fake_uid = cairn_core::HashAlgo::Blake3.digest(b"a version nobody made");
    let forged = Mutation {
        kind: MutationKind::Put,
        key: b"k".to_vec(),
        branch: Some("master".into()),
        from: None,
        uid: fake_uid,
        bases: vec![],
        seal: None,
    };
    let rec = Record::new(capsule, forged.encode(), vec![]);
    srv.write(&capsule, std::slice::from_ref(&rec), &[])
        .unwrap();
    let b = Bucket::open(Db::new(store.clone()), srv.clone(), Some(writer())).unwrap();
    let second = b.put(b"k", Target::Branch("master"), s("b"), &o).unwrap();
    assert!(srv.prove(&capsule, &rec.name(), None).is_err());
    // The made-up record does not stand for a version either.
    assert!(b.record_of(&fake_uid).unwrap().is_none());
    assert!(b.prove(b"k", &fake_uid).is_err());
    // The writer's own versions stay proven, the new one chained to the old.
    for uid in [first, second] {
        let p = b.prove(b"k", &uid).unwrap();
        p.verify(&meta, b"k", &uid).unwrap();
    }
}

/// A record that the journal's reload would not decode (here, more backpointers than a
/// header may hold) is refused when written, never acknowledged: once journaled it kept
/// the whole capsule from loading after a restart.
#[test]
fn a_header_a_reload_would_refuse_is_refused_when_written() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let srv = server(&store);
    let o = PutOptions::default();
    let capsule = {
        let b = Bucket::open(Db::new(store.clone()), srv.clone(), Some(writer())).unwrap();
        b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
        b.capsule().unwrap()
    };
    // Many unsigned heads, by anyone.
    let junk: Vec<Record> = (0..1025u32)
        .map(|i| Record::new(capsule, i.to_le_bytes().to_vec(), vec![]))
        .collect();
    srv.write(&capsule, &junk, &[]).unwrap();
    let too_many = Record::new(
        capsule,
        b"x".to_vec(),
        junk.iter().map(Record::name).collect(),
    );
    let e = srv.write(&capsule, &[too_many], &[]).unwrap_err();
    assert!(e.to_string().contains("backpointers"), "{e}");
    // The bucket writes on, and the capsule loads again after a restart.
    let uid = {
        let b = Bucket::open(Db::new(store.clone()), srv.clone(), Some(writer())).unwrap();
        b.put(b"k", Target::Branch("master"), s("b"), &o).unwrap()
    };
    let b = Bucket::open(Db::new(store.clone()), server(&store), Some(writer())).unwrap();
    assert_eq!(b.db().get(b"k", &At::default_branch()).unwrap().uid, uid);
    b.prove(b"k", &uid).unwrap();
}

/// One damaged record costs only the versions it names: the uid → record index is built
/// without it (the build stopped at it, and every lookup by uid and every proof of the
/// bucket failed), and a uid not found then is answered as possibly damaged, not absent.
#[test]
fn a_damaged_record_costs_only_its_own_version() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b
        .put(b"k1", Target::Branch("master"), s("one"), &o)
        .unwrap();
    let v2 = b
        .put(b"k2", Target::Branch("master"), s("two"), &o)
        .unwrap();
    let capsule = b.capsule().unwrap();
    let r1 = b.record_of(&v1).unwrap().unwrap();
    let BodyRef::Plain { hash, .. } = b.server().read(&capsule, &r1).unwrap().header.body else {
        panic!("a plain record")
    };
    drop(b);
    // Its body chunk is damaged in the store.
    store.remove(&[hash]).unwrap();
    store.put_hashed(hash, b"damaged").unwrap();
    let b = open(&store, Some(writer())).unwrap();
    assert_eq!(proven(&b, b"k2", &v2).uid, v2);
    let e = b.record_of(&v1).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");
}

/// The same with the record's header chunk lost (bit rot in a ~100-byte chunk, or a record
/// the store's recovery skipped): the bucket still opens for writing, other versions stay
/// proven, and a lookup of the lost one names the damage. (The whole capsule refused to
/// load, so every version lost its proof and the bucket took no more writes.)
#[test]
fn a_lost_record_header_costs_only_its_own_version() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b
        .put(b"k1", Target::Branch("master"), s("one"), &o)
        .unwrap();
    let v2 = b
        .put(b"k2", Target::Branch("master"), s("two"), &o)
        .unwrap();
    let r1 = b.record_of(&v1).unwrap().unwrap();
    drop(b);
    store.remove(&[*r1.hash()]).unwrap();
    let b = open(&store, Some(writer())).unwrap();
    assert_eq!(proven(&b, b"k2", &v2).uid, v2);
    let e = b.record_of(&v1).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    let v3 = b
        .put(b"k3", Target::Branch("master"), s("three"), &o)
        .unwrap();
    assert_eq!(proven(&b, b"k3", &v3).uid, v3);
}

/// An untagged head that a merge of several finds contained in another (a fast forward or
/// an up-to-date step) leaves the heads recorded, as a Remove without a branch; a merge
/// that makes no version writes no merge record. The head left the heads unrecorded.
#[test]
fn contained_untagged_heads_a_merge_drops_are_recorded() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = open(&store, Some(writer())).unwrap();
    let o = PutOptions::default();
    let v1 = b.put(b"k", Target::Branch("master"), s("a"), &o).unwrap();
    let a = b.put(b"k", Target::Base(v1), s("x"), &o).unwrap();
    let y = b.put(b"k", Target::Base(a), s("y"), &o).unwrap();
    let z = b.put(b"k", Target::Base(y), s("z"), &o).unwrap();
    // The same put again makes the same version, an untagged head once more.
    assert_eq!(b.put(b"k", Target::Base(v1), s("x"), &o).unwrap(), a);
    let mut heads = b.db().list_untagged(b"k").unwrap();
    heads.sort();
    let mut want = vec![a, z];
    want.sort();
    assert_eq!(heads, want);
    let capsule = b.capsule().unwrap();
    let before = b.server().with_dag(&capsule, |d| d.len()).unwrap();
    let r = b
        .merge_untagged(b"k", &[], &BuiltinResolver::Append, &o)
        .unwrap();
    assert_eq!(r, MergeOutcome::FastForward(z));
    assert_eq!(b.db().list_untagged(b"k").unwrap(), vec![z]);
    let order = b
        .server()
        .with_dag(&capsule, |d| d.order().to_vec())
        .unwrap();
    let added = |from: usize| -> Vec<(Mutation, bool)> {
        let order = b
            .server()
            .with_dag(&capsule, |d| d.order().to_vec())
            .unwrap();
        order[from..]
            .iter()
            .map(|n| {
                let m = Mutation::decode(&b.server().read(&capsule, n).unwrap().body).unwrap();
                let signed = b
                    .server()
                    .with_dag(&capsule, |d| d.signature(n).is_some())
                    .unwrap();
                (m, signed)
            })
            .collect()
    };
    let got = added(before);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.kind, got[0].0.branch.clone(), got[0].0.uid),
        (MutationKind::Remove, None, a)
    );
    // A fast forward of a branch whose head was an untagged head records its leaving too,
    // with the merge, in one group (one signature, on the last: all or none).
    assert_eq!(b.put(b"k", Target::Base(v1), s("x"), &o).unwrap(), a);
    b.fork(b"k", &At::Uid(a), "dev").unwrap();
    let before = order.len() + 2;
    let r = b
        .merge_into(b"k", "dev", &At::Uid(z), &BuiltinResolver::Manual, &o)
        .unwrap();
    assert_eq!(r, MergeOutcome::FastForward(z));
    let got = added(before);
    let kinds: Vec<_> = got
        .iter()
        .map(|(m, signed)| (m.kind, m.branch.clone(), m.uid, *signed))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (MutationKind::Remove, None, a, false),
            (MutationKind::Merge, Some("dev".to_string()), z, true),
        ]
    );
}

/// A uid names a version only in its own bucket, for the history operations too: the LCA,
/// the merge bases and the diff of another bucket's version are not found through this
/// one (they computed over it: the node checked, the Db API did not).
#[test]
fn history_operations_take_only_this_buckets_versions() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let db = Db::new(store.clone());
    let srv = server(&store);
    let mine = Bucket::open(db.for_bucket("mine").unwrap(), srv.clone(), Some(writer())).unwrap();
    let theirs = Bucket::open(db.for_bucket("theirs").unwrap(), srv, Some(writer())).unwrap();
    let put = |b: &Bucket, v: &str| {
        b.put(b"k", Target::Branch("master"), s(v), &Default::default())
            .unwrap()
    };
    let a = put(&mine, "one");
    let b = put(&mine, "two");
    let foreign = put(&theirs, "secret");
    let d = mine.db();
    assert_eq!(d.lca(b"k", &a, &b).unwrap(), Some(a));
    assert_eq!(d.merge_bases(b"k", &a, &b).unwrap(), vec![a]);
    d.diff(&a, &b).unwrap();
    for (x, y) in [(a, foreign), (foreign, a)] {
        assert!(matches!(d.lca(b"k", &x, &y), Err(Error::NotFound(_))));
        assert!(matches!(
            d.merge_bases(b"k", &x, &y),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(d.diff(&x, &y), Err(Error::NotFound(_))));
    }
}

/// Once a damaged record is whole again (its lost header filled, or its damaged body
/// stored anew, by a copy from a peer or the writer), the bucket's versions index sees
/// it: the version's lookup and proof work without a restart.
#[test]
fn a_record_whole_again_is_seen_by_the_bucket_index() {
    for header in [true, false] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let b = open(&store, Some(writer())).unwrap();
        let o = PutOptions::default();
        let v1 = b
            .put(b"k1", Target::Branch("master"), s("one"), &o)
            .unwrap();
        b.put(b"k2", Target::Branch("master"), s("two"), &o)
            .unwrap();
        let capsule = b.capsule().unwrap();
        let r1 = b.record_of(&v1).unwrap().unwrap();
        let rec = b.server().read(&capsule, &r1).unwrap();
        let BodyRef::Plain { hash, .. } = rec.header.body else {
            panic!("a plain record")
        };
        drop(b);
        if header {
            store.remove(&[*r1.hash()]).unwrap();
        } else {
            store.remove(&[hash]).unwrap();
            store.put_hashed(hash, b"damaged").unwrap();
        }
        let b = open(&store, Some(writer())).unwrap();
        assert!(matches!(b.record_of(&v1), Err(Error::Corrupt(_))));
        // The copy comes back (as a peer's sync, or the writer, would bring it).
        b.server()
            .write(&capsule, std::slice::from_ref(&rec), &[])
            .unwrap();
        assert_eq!(b.record_of(&v1).unwrap(), Some(r1), "header lost: {header}");
        assert_eq!(proven(&b, b"k1", &v1).uid, v1);
    }
}
