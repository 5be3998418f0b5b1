//! Owner seals: a put sealed by the bucket's owner is recorded with its seal and proven
//! to a reader who trusts only the capsule name; a seal that is not the owner's seal of
//! exactly that put is refused before anything is recorded or committed; a proof whose
//! seal or version was tampered with is refused.

use std::sync::Arc;

use cairn_capsule::*;
use cairn_core::{Error, HashAlgo, SigningKey};
use cairn_object::{At, Db, FObject, NewValue, PutOptions, Target, Uid};
use cairn_store::{MemoryStore, Store};

fn node_key() -> SigningKey {
    SigningKey::from_seed(&[1; 32])
}

fn owner() -> SigningKey {
    SigningKey::from_seed(&[7; 32])
}

/// A bucket written by the node's key whose metadata names `owner` (or the setting
/// `value` given instead).
fn bucket_named(store: &Arc<dyn Store>, owner_setting: Option<String>) -> Bucket {
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, node_key().public(), "sealed");
    meta.cipher = BodyCipher::Plaintext;
    meta.settings
        .insert(bucket::BUCKET_SETTING.into(), "default".into());
    if let Some(v) = owner_setting {
        meta.settings.insert(OWNER_SETTING.into(), v);
    }
    let srv = Arc::new(CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    ));
    Bucket::open_with_metadata(Db::new(store.clone()), srv, Some(node_key()), meta).unwrap()
}

fn owned_bucket(store: &Arc<dyn Store>) -> Bucket {
    bucket_named(store, Some(owner().public().to_string()))
}

/// What a client builds before sending: the FObject value the put will make.
fn value_digest(v: &NewValue, b: &Bucket) -> cairn_core::Hash {
    // The bucket builds the same value from the same input whatever the history, so a
    // scratch Db of the same configuration gives the digest without touching the bucket.
    let scratch = Db::new(Arc::new(MemoryStore::new())).with_tree_config(*b.db().tree_config());
    let uid = scratch
        .put(
            b"scratch",
            Target::Branch("master"),
            v.clone(),
            &PutOptions::default(),
        )
        .unwrap();
    scratch.load(&uid).unwrap().value_digest(HashAlgo::Blake3)
}

fn seal(
    b: &Bucket,
    key: &[u8],
    branch: Option<&str>,
    base: Option<&Uid>,
    v: &NewValue,
    context: &[u8],
    by: &SigningKey,
) -> Vec<u8> {
    let digest = value_digest(v, b);
    let capsule = b.capsule().unwrap();
    OwnerSeal::sign(
        by,
        &SealedPut {
            capsule: &capsule,
            key,
            branch,
            base,
            value: &digest,
            context,
        },
        1_800_000_000,
        [5; 16],
    )
    .encode()
}

fn with_seal(seal: Vec<u8>, context: &[u8]) -> PutOptions {
    PutOptions {
        context: context.to_vec(),
        owner_seal: Some(seal),
        ..PutOptions::default()
    }
}

fn records(b: &Bucket) -> usize {
    let c = b.capsule().unwrap();
    b.server().with_dag(&c, |d| d.order().len()).unwrap()
}

/// Checks the proof of `uid` as a reader: through its bytes, against the metadata alone.
fn reader_check(b: &Bucket, key: &[u8], uid: &Uid) -> cairn_core::Result<Option<OwnerSeal>> {
    let meta = b.metadata().unwrap();
    let p = VersionProof::from_bytes(&b.prove(key, uid)?.to_bytes())?;
    let (m, _) = p.verify(meta, key, uid)?;
    Ok(p.owner_seal(meta, &m, uid)?.map(|(k, s)| {
        assert_eq!(k, owner().public());
        s
    }))
}

#[test]
fn a_sealed_put_is_recorded_with_its_seal_and_proven_to_a_reader() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = owned_bucket(&store);
    let v = NewValue::String(b"hello".to_vec());
    let s = seal(&b, b"k", Some("master"), None, &v, b"ctx", &owner());
    let uid = b
        .put(
            b"k",
            Target::Branch("master"),
            v,
            &with_seal(s.clone(), b"ctx"),
        )
        .unwrap();
    let got = reader_check(&b, b"k", &uid).unwrap().expect("sealed");
    assert_eq!(got.encode(), s);
    assert_eq!(got.date, 1_800_000_000);

    // A blob streamed in is sealed alike (the seal names its tree's root).
    let data: Vec<u8> = (0..300_000u32).map(|i| ((i * 7919) >> 3) as u8).collect();
    let blob = NewValue::Blob(data.clone());
    let s = seal(&b, b"img", Some("master"), None, &blob, b"", &owner());
    let uid_b = b
        .put_blob_stream(
            b"img",
            Target::Branch("master"),
            &mut &data[..],
            &with_seal(s, b""),
            &mut |_| {},
        )
        .unwrap();
    assert!(reader_check(&b, b"img", &uid_b).unwrap().is_some());

    // A guarded put seals the head it expects: the version's one base.
    let v2 = NewValue::String(b"hello again".to_vec());
    let s = seal(&b, b"k", Some("master"), Some(&uid), &v2, b"", &owner());
    let opts = PutOptions {
        guard: Some(uid),
        ..with_seal(s, b"")
    };
    let uid2 = b.put(b"k", Target::Branch("master"), v2, &opts).unwrap();
    let got = reader_check(&b, b"k", &uid2).unwrap().expect("sealed");
    assert!(got.names_base);

    // An unsealed put is proven as before, and says it carries no seal.
    let uid3 = b
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String(b"unsealed".to_vec()),
            &PutOptions::default(),
        )
        .unwrap();
    assert!(reader_check(&b, b"k", &uid3).unwrap().is_none());
    assert!(b.prove(b"k", &uid3).unwrap().object.is_none());
}

#[test]
fn a_seal_that_is_not_the_owners_seal_of_this_put_changes_nothing() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = owned_bucket(&store);
    let first = b
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String(b"first".to_vec()),
            &PutOptions::default(),
        )
        .unwrap();
    let v = NewValue::String(b"mine".to_vec());
    let other = NewValue::String(b"theirs".to_vec());
    let cases: Vec<(&str, Vec<u8>, &[u8], Target<'_>)> = vec![
        (
            "signed by another key",
            seal(&b, b"k", Some("master"), None, &v, b"", &node_key()),
            b"",
            Target::Branch("master"),
        ),
        (
            "another value",
            seal(&b, b"k", Some("master"), None, &other, b"", &owner()),
            b"",
            Target::Branch("master"),
        ),
        (
            "another key",
            seal(&b, b"j", Some("master"), None, &v, b"", &owner()),
            b"",
            Target::Branch("master"),
        ),
        (
            "another branch",
            seal(&b, b"k", Some("dev"), None, &v, b"", &owner()),
            b"",
            Target::Branch("master"),
        ),
        (
            "another context",
            seal(&b, b"k", Some("master"), None, &v, b"a", &owner()),
            b"b",
            Target::Branch("master"),
        ),
        (
            "a base the put does not have",
            seal(&b, b"k", Some("master"), Some(&first), &v, b"", &owner()),
            b"",
            Target::Base(first),
        ),
        ("malformed", vec![1, 2, 3], b"", Target::Branch("master")),
    ];
    let before = records(&b);
    for (what, s, ctx, target) in cases {
        let e = b
            .put(b"k", target, v.clone(), &with_seal(s, ctx))
            .unwrap_err();
        if what == "malformed" {
            assert!(matches!(e, Error::InvalidInput(_)), "{what}: {e}");
        } else {
            assert!(matches!(e, Error::Rejected(_)), "{what}: {e}");
        }
        assert_eq!(records(&b), before, "{what}: a record was written");
        assert_eq!(
            b.db().get(b"k", &At::default_branch()).unwrap().uid,
            first,
            "{what}: the head moved"
        );
        assert_eq!(
            b.db().table(b"k").unwrap().heads().len(),
            1,
            "{what}: a head was added"
        );
    }
}

#[test]
fn seals_need_an_owner_key_in_the_metadata() {
    for setting in [None, Some("open".to_string()), Some("nonsense".to_string())] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let b = bucket_named(&store, setting.clone());
        let v = NewValue::String(b"x".to_vec());
        let s = seal(&b, b"k", Some("master"), None, &v, b"", &owner());
        let e = b
            .put(b"k", Target::Branch("master"), v, &with_seal(s, b""))
            .unwrap_err();
        assert!(matches!(e, Error::Rejected(_)), "{setting:?}: {e}");
        assert!(matches!(
            b.db().get(b"k", &At::default_branch()),
            Err(Error::NotFound(_))
        ));
    }
}

#[test]
fn a_reader_refuses_a_proof_whose_seal_or_version_was_tampered_with() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = owned_bucket(&store);
    let meta = b.metadata().unwrap().clone();
    let v = NewValue::String(b"genuine".to_vec());
    let s = seal(&b, b"k", Some("master"), None, &v, b"", &owner());
    let uid = b
        .put(b"k", Target::Branch("master"), v, &with_seal(s, b""))
        .unwrap();
    let p = b.prove(b"k", &uid).unwrap();
    let (m, _) = p.verify(&meta, b"k", &uid).unwrap();

    // The version swapped for another FObject: it no longer hashes to the uid.
    let mut swapped = p.clone();
    let mut o = FObject::from_chunk(p.object.as_ref().unwrap()).unwrap();
    o.value = cairn_object::Value::String(b"forged".to_vec().into());
    swapped.object = Some(o.to_chunk());
    assert!(matches!(
        swapped.verify(&meta, b"k", &uid),
        Err(Error::Rejected(_))
    ));
    assert!(matches!(
        swapped.owner_seal(&meta, &m, &uid),
        Err(Error::Rejected(_))
    ));

    // The version left out: the seal cannot be checked, and that is said.
    let mut bare = p.clone();
    bare.object = None;
    assert!(bare.verify(&meta, b"k", &uid).is_ok());
    assert!(matches!(
        bare.owner_seal(&meta, &m, &uid),
        Err(Error::Rejected(_))
    ));

    // A seal in the mutation changed: its record's body no longer matches its header.
    let mut m2 = m.clone();
    let mut forged_seal = m2.seal.unwrap();
    forged_seal.date += 1;
    m2.seal = Some(forged_seal);
    let mut resealed = p.clone();
    resealed.record.body = m2.encode();
    assert!(resealed.verify(&meta, b"k", &uid).is_err());
    // Checked on its own against the genuine version, the changed seal fails too.
    assert!(matches!(
        p.owner_seal(&meta, &m2, &uid),
        Err(Error::Rejected(_))
    ));

    // Metadata naming another owner (so another capsule) refuses the seal.
    let mut other = meta.clone();
    other
        .settings
        .insert(OWNER_SETTING.into(), node_key().public().to_string());
    assert!(p.owner_seal(&other, &m, &uid).is_err());
}

#[test]
fn seals_and_sealed_mutations_round_trip_canonically() {
    let key = owner();
    let capsule = CapsuleName(HashAlgo::Blake3.digest(b"c"));
    let value = HashAlgo::Blake3.digest(b"v");
    let base = HashAlgo::Blake3.digest(b"b");
    let s = OwnerSeal::sign(
        &key,
        &SealedPut {
            capsule: &capsule,
            key: b"k",
            branch: None,
            base: Some(&base),
            value: &value,
            context: b"",
        },
        42,
        [3; 16],
    );
    let bytes = s.encode();
    assert_eq!(bytes.len(), seal::OWNER_SEAL_LEN);
    assert_eq!(OwnerSeal::decode(&bytes).unwrap(), s);
    for cut in 0..bytes.len() {
        assert!(OwnerSeal::decode(&bytes[..cut]).is_err());
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(OwnerSeal::decode(&padded).is_err());
    // The flag byte is 0 or 1 only.
    let mut bad_flag = bytes.clone();
    bad_flag[1 + 8 + 16] = 2;
    assert!(OwnerSeal::decode(&bad_flag).is_err());

    let m = Mutation {
        kind: MutationKind::Put,
        key: b"k".to_vec(),
        branch: None,
        from: None,
        uid: value,
        bases: vec![base],
        seal: Some(s),
    };
    let enc = m.encode();
    assert_eq!(Mutation::decode(&enc).unwrap(), m);
    // Only a put carries a seal.
    let fork = Mutation {
        kind: MutationKind::Fork,
        branch: Some("b".into()),
        bases: vec![],
        ..m.clone()
    };
    assert!(Mutation::decode(&fork.encode()).is_err());
    // An unsealed mutation keeps the first format, byte for byte.
    let plain = Mutation { seal: None, ..m };
    assert_eq!(plain.encode()[0], bucket::MUTATION_VERSION);
}

/// The same put made again, sealed, makes the same version (same base, value and
/// context): its proof shows the sealed record, not the first, unsealed one. A record
/// sealed on its one base that names another number of bases does not decode.
#[test]
fn a_sealed_record_of_an_existing_version_is_the_one_proven() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = owned_bucket(&store);
    let base = b
        .put(
            b"k",
            Target::Branch("master"),
            NewValue::String(b"one".to_vec()),
            &PutOptions::default(),
        )
        .unwrap();
    let v = NewValue::String(b"two".to_vec());
    let plain = b
        .put(b"k", Target::Base(base), v.clone(), &PutOptions::default())
        .unwrap();
    assert!(reader_check(&b, b"k", &plain).unwrap().is_none());
    let s = seal(&b, b"k", None, Some(&base), &v, b"", &owner());
    let sealed = b
        .put(b"k", Target::Base(base), v, &with_seal(s, b""))
        .unwrap();
    assert_eq!(sealed, plain, "the same version");
    assert!(reader_check(&b, b"k", &sealed).unwrap().is_some());
    // After a reload (the index built from the capsule) too.
    drop(b);
    let srv = Arc::new(CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    ));
    let b = Bucket::open(Db::new(store.clone()), srv, Some(node_key())).unwrap();
    assert!(reader_check(&b, b"k", &sealed).unwrap().is_some());

    let p = b.prove(b"k", &sealed).unwrap();
    let mut m = Mutation::decode(&p.record.body).unwrap();
    assert!(m.seal.unwrap().names_base);
    m.bases.clear();
    assert!(Mutation::decode(&m.encode()).is_err());
}
