//! Targets for buckets-as-capsules: `bucket_mutation` (the record body decoder) and
//! `version_proof` (`VersionProof::from_bytes` + `verify` + `owner_seal`).
//!
//! `bucket_mutation`: whatever decodes must re-encode to exactly the input bytes.
//!
//! `version_proof` checks soundness against a fixture bucket built once per process by the
//! real `Bucket` over a memory store, from fixed keys and fixed metadata, so it is the same
//! in every process. A fuzzer cannot make hash preimages or Ed25519 signatures, so a proof
//! that verifies for (key, uid) must carry the very record the writer wrote for that
//! version, and every header of its chain must be one the writer wrote. Input format:
//!
//! ```text
//! u8 mode   bit 0 clear: the rest is an encoded proof, checked for every fixture version;
//!           bit 0 set: next byte = which valid proof (modulo), then up to MAX_EDITS 4-byte
//!           edits of its encoding (see crate::capsule::apply_edits)
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use cairn_capsule::bucket::BUCKET_SETTING;
use cairn_capsule::{
    BodyCipher, Bucket, CapsuleMetadata, CapsuleServer, Mutation, OWNER_SETTING, OwnerSeal, Record,
    RecordName, SealedPut, ServerOptions, VersionProof,
};
use cairn_core::{HashAlgo, SigningKey};
use cairn_object::{At, BuiltinResolver, Db, MergeOutcome, NewValue, PutOptions, Target, Uid};
use cairn_store::{MemoryStore, Store};

use crate::capsule::apply_edits;

/// The fixture: the bucket's metadata, every version with its genuine record and a valid
/// proof's bytes, and every record name the writer made.
pub struct Fixture {
    /// The capsule metadata (what a reader trusts after checking its name).
    pub meta: CapsuleMetadata,
    /// (key, uid, genuine record, valid proof bytes), one per version the bucket made.
    pub versions: Vec<(Vec<u8>, Uid, Record, Vec<u8>)>,
    /// Every record the writer wrote.
    pub records: HashSet<RecordName>,
}

/// The bucket's owner, whose seal one put carries.
fn owner() -> SigningKey {
    SigningKey::from_seed(&[0x46; 32])
}

/// The fixture bucket (built once per process; deterministic).
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build)
}

fn build() -> Fixture {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let writer = SigningKey::from_seed(&[0x42; 32]);
    let meta = CapsuleMetadata {
        algo: HashAlgo::Blake3,
        writers: vec![writer.public(), SigningKey::from_seed(&[0x43; 32]).public()],
        description: "fuzz bucket".into(),
        created_ms: 1_700_000_000_000,
        cipher: BodyCipher::Plaintext,
        key_distribution: "none".into(),
        settings: BTreeMap::from([
            (BUCKET_SETTING.to_string(), "default".to_string()),
            (OWNER_SETTING.to_string(), owner().public().to_string()),
        ]),
    };
    let server = Arc::new(CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[0x44; 32]),
        ServerOptions::default(),
    ));
    let b = Bucket::open_with_metadata(Db::new(store), server, Some(writer), meta.clone())
        .expect("fixture bucket");
    let o = PutOptions::default();
    let s = |v: &str| NewValue::String(v.as_bytes().to_vec());
    let mut made: Vec<(Vec<u8>, Uid)> = Vec::new();
    let v1 = b
        .put(b"doc", Target::Branch("master"), s("one"), &o)
        .expect("put");
    made.push((b"doc".to_vec(), v1));
    b.fork(b"doc", &At::Branch("master".into()), "dev")
        .expect("fork");
    made.push((
        b"doc".to_vec(),
        b.put(b"doc", Target::Branch("dev"), s("one two"), &o)
            .expect("put"),
    ));
    made.push((
        b"doc".to_vec(),
        b.put(b"doc", Target::Branch("master"), s("zero one"), &o)
            .expect("put"),
    ));
    if let MergeOutcome::Merged(m) = b
        .merge_into(
            b"doc",
            "master",
            &At::Branch("dev".into()),
            &BuiltinResolver::Ours,
            &o,
        )
        .expect("merge")
    {
        made.push((b"doc".to_vec(), m));
    }
    made.push((
        b"doc".to_vec(),
        b.put(b"doc", Target::Base(v1), s("alt"), &o)
            .expect("untagged put"),
    ));
    made.push((
        b"n".to_vec(),
        b.put(b"n", Target::Branch("master"), NewValue::Integer(7), &o)
            .expect("put"),
    ));
    // A put its owner sealed (its proof carries the seal and the version).
    let sealed = s("sealed by the owner");
    let capsule = meta.name();
    let digest = {
        let scratch = Db::new(Arc::new(MemoryStore::new()));
        let u = scratch
            .put(b"x", Target::Branch("master"), sealed.clone(), &o)
            .expect("scratch put");
        scratch
            .load(&u)
            .expect("scratch load")
            .value_digest(HashAlgo::Blake3)
    };
    let seal = OwnerSeal::sign(
        &owner(),
        &SealedPut {
            capsule: &capsule,
            key: b"owned",
            branch: Some("master"),
            base: None,
            value: &digest,
            context: b"",
        },
        1_700_000_000,
        [0x45; 16],
    );
    let opts = PutOptions {
        owner_seal: Some(seal.encode()),
        ..PutOptions::default()
    };
    made.push((
        b"owned".to_vec(),
        b.put(b"owned", Target::Branch("master"), sealed, &opts)
            .expect("sealed put"),
    ));
    b.rename(b"doc", "dev", "old").expect("rename");
    let capsule = b.capsule().expect("capsule");
    let records: HashSet<RecordName> = b
        .server()
        .with_dag(&capsule, |d| d.order().iter().copied().collect())
        .expect("dag");
    let mut versions = Vec::new();
    for (key, uid) in made {
        let p = b.prove(&key, &uid).expect("prove");
        let (m, _) = p.verify(&meta, &key, &uid).expect("fixture proof verifies");
        let sealed = p.owner_seal(&meta, &m, &uid).expect("fixture seal checks");
        assert_eq!(
            sealed.is_some(),
            key == b"owned",
            "only the owned put is sealed"
        );
        versions.push((key, uid, p.record.clone(), p.to_bytes()));
    }
    Fixture {
        meta,
        versions,
        records,
    }
}

/// `bucket_mutation`.
pub fn run_mutation(data: &[u8]) {
    if let Ok(m) = Mutation::decode(data) {
        assert_eq!(
            m.encode(),
            data,
            "Mutation decoded from non-canonical bytes"
        );
    }
}

/// `version_proof` (input format in the module documentation).
pub fn run_version_proof(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let Some((&which, edits)) = rest.split_first() else {
            return;
        };
        let mut b = f.versions[which as usize % f.versions.len()].3.clone();
        apply_edits(&mut b, edits);
        b
    };
    let Ok(p) = VersionProof::from_bytes(&bytes) else {
        return;
    };
    assert_eq!(
        p.to_bytes(),
        bytes,
        "VersionProof decoded from non-canonical bytes"
    );
    let genuine: HashMap<(&[u8], Uid), &Record> = f
        .versions
        .iter()
        .map(|(k, u, r, _)| ((k.as_slice(), *u), r))
        .collect();
    for (key, uid, _, _) in &f.versions {
        if let Ok((m, names)) = p.verify(&f.meta, key, uid) {
            assert_eq!(
                Some(&&p.record),
                genuine.get(&(key.as_slice(), *uid)),
                "FORGERY: a proof verifies with a record the writer did not write"
            );
            assert_eq!(m.uid, *uid);
            assert!(
                names.iter().all(|n| f.records.contains(n)),
                "FORGERY: a verified chain holds a record the writer did not write"
            );
            // The seal verifier, on the genuine record: a seal it accepts is the owner's,
            // over the version the proof carries, which hashes to the uid.
            if let Ok(Some((k, _))) = p.owner_seal(&f.meta, &m, uid) {
                assert_eq!(k, owner().public(), "FORGERY: a seal by another key");
                let o = p.object.as_deref().expect("a checked seal had its version");
                assert_eq!(
                    HashAlgo::Blake3.digest(o),
                    *uid,
                    "FORGERY: a seal on another version"
                );
            }
        }
    }
}

/// Seeds: each valid proof raw, and as a mutation base.
pub fn version_proof_seeds() -> Vec<Vec<u8>> {
    let f = fixture();
    let mut seeds = Vec::new();
    for (k, (_, _, _, bytes)) in f.versions.iter().enumerate() {
        let mut raw = vec![0];
        raw.extend_from_slice(bytes);
        seeds.push(raw);
        seeds.push(vec![1, k as u8]);
        seeds.push(vec![1, k as u8, 0, 40, 0, 1]);
    }
    seeds
}

/// Seeds: every genuine record body.
pub fn mutation_seeds() -> Vec<Vec<u8>> {
    fixture()
        .versions
        .iter()
        .map(|(_, _, r, _)| r.body.clone())
        .collect()
}
