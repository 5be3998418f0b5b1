//! Server-side checks found missing in review (2026-11-27): a signature sent with a
//! subrecord commit of a present record is kept, a checkpoint is bound to its capsule, a
//! subrecord read never answers with a record's body, and a sync message cannot decode
//! into far more memory than its bytes.

use std::sync::Arc;

use cairn_capsule::record::body_hash;
use cairn_capsule::*;
use cairn_core::{HashAlgo, SigningKey};
use cairn_store::{MemoryStore, Store};

fn setup() -> (CapsuleServer, Writer, CapsuleMetadata) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    );
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "test");
    server.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, Some(BodyKey([7; 32]))).unwrap();
    (server, w, meta)
}

/// A subrecord record committed unsigned, then again with the writer's signature: the
/// signature is stored before the ack, so the record can be proven.
#[test]
fn a_signature_on_a_present_subrecord_record_is_kept() {
    let (server, mut w, meta) = setup();
    let c = meta.name();
    w.write_subrecord(b"a").unwrap();
    w.write_subrecord(b"b").unwrap();
    let (header, subs, sig) = w.commit_subrecords(&[]).unwrap();
    let name = header.name();
    server.commit_subrecords(&c, &header, &subs, None).unwrap();
    assert!(server.prove(&c, &name, None).is_err());
    let ack = server
        .commit_subrecords(&c, &header, &subs, Some(sig))
        .unwrap();
    ack.verify(
        &server.public_key(),
        &c,
        &AckKind::wrote(vec![name], vec![name]),
    )
    .unwrap();
    assert!(
        server
            .with_dag(&c, |d| d.signature(&name).is_some())
            .unwrap()
    );
    server.prove(&c, &name, None).unwrap();
}

/// A server answering a QueryFresh of one capsule with another capsule's checkpoint is
/// refused.
#[test]
fn a_checkpoint_of_another_capsule_is_refused() {
    let (server, mut w, meta) = setup();
    let a = meta.name();
    let wk2 = SigningKey::from_seed(&[2; 32]);
    let meta_b = CapsuleMetadata::new(HashAlgo::Blake3, wk2.public(), "other");
    server.create(&meta_b).unwrap();
    let r = w.record(b"x", &[]).unwrap();
    let n = r.name();
    server.write(&a, &[r], &[(n, w.sign(&n))]).unwrap();
    let pk = server.public_key();
    server.query_fresh(&a).unwrap().verify(&pk, &a).unwrap();
    let cp_b = server.query_fresh(&meta_b.name()).unwrap();
    assert!(matches!(
        cp_b.verify(&pk, &a),
        Err(cairn_core::Error::Rejected(_))
    ));
    cp_b.verify(&pk, &meta_b.name()).unwrap();
}

/// A subrecord read of a name that is a record's body hash (its body cached) is not
/// answered with that body.
#[test]
fn a_subrecord_read_never_answers_with_a_record_body() {
    let (server, mut w, meta) = setup();
    let c = meta.name();
    let r = w.record(b"secret", &[]).unwrap();
    let n = r.name();
    let bh = body_hash(HashAlgo::Blake3, &r.body);
    server.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();
    assert!(server.read_subrecord(&c, &bh).is_err());
}

/// A sync message of many empty subrecords (one byte each on the wire) is refused once
/// its records carry more than `MAX_SYNC_SUBRECORDS` together, before it decodes into
/// gigabytes; a message within the cap decodes.
#[test]
fn a_sync_message_cannot_carry_unbounded_subrecords() {
    let header = RecordHeader {
        capsule: CapsuleName(HashAlgo::Blake3.digest(b"c")),
        body: BodyRef::Subrecords {
            root: HashAlgo::Blake3.digest(b"r"),
            count: 1,
        },
        backpointers: vec![],
    };
    let msg = |records: usize, each: usize| {
        let rec = SyncRecord {
            header: header.clone(),
            body: SyncBody::Subrecords(vec![Vec::new(); each]),
            signature: None,
        };
        Request::Sync {
            capsule: CapsuleName(HashAlgo::Blake3.digest(b"c")),
            peer: SigningKey::from_seed(&[5; 32]).public(),
            msg: SyncMsg::Exchange {
                records: vec![rec; records],
                want: vec![],
                heads: vec![],
                roots: vec![],
                missing: vec![],
            },
        }
        .to_bytes()
    };
    let within = msg(2, MAX_SYNC_SUBRECORDS / 2);
    assert!(Request::from_bytes(&within).is_ok());
    let past = msg(3, MAX_SYNC_SUBRECORDS / 2);
    let e = Request::from_bytes(&past).unwrap_err();
    assert!(e.to_string().contains("subrecords in one message"), "{e}");
}
