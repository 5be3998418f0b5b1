//! End-to-end and adversarial tests of capsules: writer → server → reader.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use cairn_capsule::merkle::{verify_consistency, verify_inclusion};
use cairn_capsule::record::{MAX_BODY_LEN, body_hash};
use cairn_capsule::*;
use cairn_core::{Error, HashAlgo, SigningKey};
use cairn_store::{LogStore, LogStoreOptions, MemoryStore, Store};
use proptest::prelude::*;

fn setup() -> (CapsuleServer, Writer, CapsuleMetadata, BodyKey) {
    let server = server_with(ServerOptions::default());
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "test");
    let bk = BodyKey([7; 32]);
    let ack = server.create(&meta).unwrap();
    ack.verify(&server.public_key(), &meta.name(), &AckKind::Created)
        .unwrap();
    let w = Writer::new(meta.clone(), wk, Some(bk.clone())).unwrap();
    (server, w, meta, bk)
}

/// Writes `n` records, signing every `per_sig`-th (and the last); returns their names.
/// A writer whose key is not one of the capsule's writers (at writer index 0 all the same).
fn intruder(meta: &CapsuleMetadata) -> Writer {
    Writer::new(
        CapsuleMetadata {
            writers: vec![SigningKey::from_seed(&[3; 32]).public()],
            ..meta.clone()
        },
        SigningKey::from_seed(&[3; 32]),
        None,
    )
    .unwrap()
}

fn write_chain(
    server: &CapsuleServer,
    w: &mut Writer,
    n: usize,
    per_sig: usize,
) -> Vec<RecordName> {
    let c = w.capsule();
    let mut names = Vec::new();
    for i in 0..n {
        let r = w.record(format!("record {i}").as_bytes(), &[]).unwrap();
        let name = r.name();
        let sigs = if (i + 1) % per_sig == 0 || i + 1 == n {
            vec![(name, w.sign(&name))]
        } else {
            vec![]
        };
        let ack = server.write(&c, &[r], &sigs).unwrap();
        ack.verify(
            &server.public_key(),
            &c,
            &AckKind::for_write(vec![name], &sigs),
        )
        .unwrap();
        names.push(name);
    }
    names
}

#[test]
fn write_read_prove_with_and_without_cache() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 100, 10);
    // Creating it again changes nothing and the ack names the log as it stands.
    let again = server.create(&meta).unwrap();
    again
        .verify(&server.public_key(), &c, &AckKind::Created)
        .unwrap();
    assert_eq!(again.log_size, 100);
    // Without a cache: every proof verifies and runs to the next signature.
    let mut plain = Reader::new(
        c,
        server.metadata(&c).unwrap(),
        CachePolicy::Off,
        Some(bk.clone()),
    )
    .unwrap();
    let mut total_plain = 0;
    for (i, n) in names.iter().enumerate() {
        let rec = server.read(&c, n).unwrap();
        assert_eq!(
            plain.open_record(n, &rec).unwrap(),
            format!("record {i}").as_bytes()
        );
        let p = server.prove(&c, n, None).unwrap().proof;
        assert_eq!(p.chain.len(), 10 - i % 10);
        total_plain += p.chain.len();
        plain.verify_record(n, &p).unwrap();
    }
    // With a mirrored cache: the first proof of each signature block is long, the rest
    // stop at the reader's cache.
    let policy = CachePolicy::Lru { capacity: 1000 };
    let mut reader = Reader::new(c, meta.clone(), policy, Some(bk)).unwrap();
    let sid = server
        .open_session(&c, policy, &reader.cache().names())
        .unwrap();
    let mut total_cached = 0;
    for n in &names {
        let issued = server.prove(&c, n, Some(sid)).unwrap();
        total_cached += issued.proof.chain.len();
        reader.verify_record(n, &issued.proof).unwrap();
        server.ack(sid, issued.proof_id).unwrap();
        reader.commit_staged();
    }
    assert_eq!(total_plain, 550);
    assert_eq!(total_cached, 10 * 10 + 90);
    // A replayed ack is refused.
    let issued = server.prove(&c, &names[0], Some(sid)).unwrap();
    server.ack(sid, issued.proof_id).unwrap();
    assert!(matches!(
        server.ack(sid, issued.proof_id),
        Err(Error::Rejected(_))
    ));
    assert!(matches!(server.ack(sid, 999_999), Err(Error::Rejected(_))));
}

/// A proof longer than its answer has room for is refused with a clear error, before the
/// chain is walked when the witness's hop count alone says so (before, the server built
/// it whole: a chain longer than a reader's frame broke the connection); a record nearer
/// its signature, or one the reader's cache reaches, is still proven. Here with 64 KiB of
/// room instead of the frame's 65 MiB, so that the chains stay small.
#[test]
fn proofs_longer_than_an_answer_are_refused_clearly() {
    let room = 64 << 10;
    let server = server_with(ServerOptions {
        max_proof_bytes: room,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "test");
    let bk = BodyKey([7; 32]);
    server.create(&meta).unwrap();
    let c = meta.name();
    let mut w = Writer::new(meta.clone(), wk, Some(bk.clone()))
        .unwrap()
        .with_skip_pointers(false);
    // A linear chain too long by the witness's hop count alone.
    let n = room / 72 + 10;
    let records: Vec<Record> = (0..n).map(|i| w.record(&[i as u8], &[]).unwrap()).collect();
    let last = records[n - 1].name();
    server
        .write(&c, &records, &[(last, w.sign(&last))])
        .unwrap();
    let first = records[0].name();
    let err = server.prove(&c, &first, None).unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m)
            if m.contains(&format!("a chain of {n} records")) && m.contains("sign a record nearer")),
        "{err}"
    );
    assert!(server.read_and_prove(&c, &first, None).is_err());
    // Within the room by hops, over it in bytes (each header here takes 107 bytes).
    let over = room / 100;
    let err = server
        .prove(&c, &records[n - over].name(), None)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("bytes of headers")),
        "{err}"
    );
    let near = records[n - 5].name();
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, Some(bk.clone())).unwrap();
    let p = server.prove(&c, &near, None).unwrap().proof;
    assert_eq!(p.chain.len(), 5);
    reader.verify_record(&near, &p).unwrap();
    // A reader that caches a record next to the first is proven through it.
    let policy = CachePolicy::Lru { capacity: 16 };
    let second = records[1].name();
    let sid = server.open_session(&c, policy, &[*second.hash()]).unwrap();
    let issued = server.prove(&c, &first, Some(sid)).unwrap();
    assert_eq!(issued.proof.chain.len(), 2);
    assert!(matches!(issued.proof.anchor, Anchor::Cached));

    // Few records, but headers of 100 backpointers each (to records this replica lacks):
    // the chain's bytes, not its length, are over.
    let ghosts: Vec<RecordName> = (0..100u32)
        .map(|i| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes())))
        .collect();
    let fat: Vec<Record> = (0..40)
        .map(|i| w.record(&[i as u8], &ghosts).unwrap())
        .collect();
    let top = fat[39].name();
    server.write(&c, &fat, &[(top, w.sign(&top))]).unwrap();
    let err = server.prove(&c, &fat[0].name(), None).unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("bytes of headers")),
        "{err}"
    );
    let p = server.prove(&c, &fat[30].name(), None).unwrap().proof;
    reader.verify_record(&fat[30].name(), &p).unwrap();
}

#[test]
fn server_refuses_bad_writes_and_changes_nothing() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 3, 3);
    let size = server.query_fresh(&c, [1; 16]).unwrap().size;
    // Tampered body.
    let mut r = w.record(b"x", &[]).unwrap();
    r.body[0] ^= 1;
    assert!(matches!(
        server.write(&c, &[r], &[]),
        Err(Error::Rejected(_))
    ));
    // A header naming another capsule.
    let other = CapsuleMetadata::new(
        HashAlgo::Blake3,
        SigningKey::from_seed(&[2; 32]).public(),
        "other",
    );
    let foreign = Record::new(other.name(), b"y".to_vec(), vec![names[2]]);
    assert!(matches!(
        server.write(&c, &[foreign], &[]),
        Err(Error::Rejected(_))
    ));
    // A forged signature: made by a key that is not a writer.
    let r = w.record(b"z", &[]).unwrap();
    let intruder = intruder(&meta);
    let forged = intruder.sign(&r.name());
    assert!(matches!(
        server.write(&c, std::slice::from_ref(&r), &[(r.name(), forged)]),
        Err(Error::Rejected(_))
    ));
    assert!(matches!(
        server.sign(&c, &names[0], forged),
        Err(Error::Rejected(_))
    ));
    // One record signed twice in one write (copies of a public signature cost a
    // verification each): refused.
    let r = w.record(b"twice", &[]).unwrap();
    let sig = w.sign(&r.name());
    let e = server
        .write(
            &c,
            std::slice::from_ref(&r),
            &[(r.name(), sig), (r.name(), sig)],
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let Anchor::Signed(stored) = server.prove(&c, &names[2], None).unwrap().proof.anchor else {
        panic!("names[2] is signed")
    };
    assert!(matches!(
        server.write(&c, &[], &vec![(names[2], stored); 3]),
        Err(Error::InvalidInput(_))
    ));
    // A signature on a record the server does not have.
    let ghost = w.record(b"ghost", &[]).unwrap();
    assert!(matches!(
        server.sign(&c, &ghost.name(), w.sign(&ghost.name())),
        Err(Error::NotFound(_))
    ));
    // Nothing changed.
    let after = server.query_fresh(&c, [1; 16]).unwrap();
    assert_eq!(after.size, size);
    assert_eq!(after.heads, vec![names[2]]);
}

#[test]
fn reader_refuses_bad_proofs() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 20, 5);
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    let good = server.prove(&c, &names[1], None).unwrap().proof;
    assert_eq!(good.chain.len(), 4);
    // Truncated proof: the last header is dropped, so the signature is on another name.
    let mut t = good.clone();
    t.chain.pop();
    assert!(matches!(
        reader.verify_record(&names[1], &t),
        Err(Error::Rejected(_))
    ));
    // Altered backpointers in a middle header break the chain.
    let mut a = good.clone();
    a.chain[2].backpointers.reverse();
    a.chain[2].backpointers.push(names[10]);
    assert!(reader.verify_record(&names[1], &a).is_err());
    // Proof for another record.
    assert!(reader.verify_record(&names[2], &good).is_err());
    // A record not in the capsule, proved by a chain from another capsule.
    let (s2, mut w2, m2, _) = setup_other();
    let n2 = write_chain(&s2, &mut w2, 2, 2);
    let p2 = s2.prove(&m2.name(), &n2[0], None).unwrap().proof;
    assert!(matches!(
        reader.verify_record(&n2[0], &p2),
        Err(Error::Rejected(_))
    ));
    // An anchor that claims a cache the reader does not have.
    let mut cached = good.clone();
    cached.anchor = Anchor::Cached;
    assert!(matches!(
        reader.verify_record(&names[1], &cached),
        Err(Error::Rejected(_))
    ));
    // Forged signature anchor.
    let mut forged = good.clone();
    if let Anchor::Signed(ws) = &mut forged.anchor {
        ws.sig = SigningKey::from_seed(&[5; 32]).sign(cairn_capsule::proof::DOMAIN_RECORD, b"x");
    }
    assert!(matches!(
        reader.verify_record(&names[1], &forged),
        Err(Error::Rejected(_))
    ));
    // Encodings round-trip and truncated bytes are refused.
    let bytes = good.to_bytes();
    assert_eq!(RecordProof::from_bytes(&bytes).unwrap(), good);
    assert!(RecordProof::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    reader.verify_record(&names[1], &good).unwrap();
    // A record no signature covers yet has no proof.
    let r = w.record(b"unsigned", &[]).unwrap();
    server.write(&c, std::slice::from_ref(&r), &[]).unwrap();
    assert!(matches!(
        server.prove(&c, &r.name(), None),
        Err(Error::NotFound(_))
    ));
}

fn setup_other() -> (CapsuleServer, Writer, CapsuleMetadata, BodyKey) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[19; 32]),
        ServerOptions::default(),
    );
    let wk = SigningKey::from_seed(&[11; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "other");
    server.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, Some(BodyKey([0; 32]))).unwrap();
    (server, w, meta, BodyKey([0; 32]))
}

#[test]
fn wrong_mirror_slows_but_never_fools_the_reader() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 30, 10);
    let policy = CachePolicy::Lru { capacity: 100 };
    let mut reader = Reader::new(c, meta, policy, None).unwrap();
    // The session claims the reader caches records it never verified.
    let lie: Vec<_> = names[5..10].iter().map(|n| *n.hash()).collect();
    let sid = server.open_session(&c, policy, &lie).unwrap();
    let issued = server.prove(&c, &names[3], Some(sid)).unwrap();
    assert_eq!(issued.proof.anchor, Anchor::Cached);
    assert!(matches!(
        reader.verify_record(&names[3], &issued.proof),
        Err(Error::Rejected(_))
    ));
    // The reader falls back to a proof without the cache, which verifies.
    let full = server.prove(&c, &names[3], None).unwrap().proof;
    reader.verify_record(&names[3], &full).unwrap();
}

/// Writes `n` subrecords ("sub 0", "sub 1", ...), commits them as one signed record and
/// returns their names.
fn commit_subrecords(server: &CapsuleServer, w: &mut Writer, n: usize) -> Vec<cairn_core::Hash> {
    let subs = (0..n)
        .map(|i| w.write_subrecord(format!("sub {i}").as_bytes()).unwrap())
        .collect();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    server
        .commit_subrecords(&w.capsule(), &header, &sealed, Some(sig))
        .unwrap();
    subs
}

#[test]
fn subrecords_commit_read_prove() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let mut subs = Vec::new();
    for i in 0..37 {
        subs.push(w.write_subrecord(format!("sub {i}").as_bytes()).unwrap());
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    let name = header.name();
    // A tampered subrecord is refused.
    let mut bad: Vec<Vec<u8>> = sealed.iter().map(<[u8]>::to_vec).collect();
    bad[3][0] ^= 1;
    let bad = SealedSubrecords::from(bad);
    assert!(matches!(
        server.commit_subrecords(&c, &header, &bad, Some(sig)),
        Err(Error::Rejected(_))
    ));
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    assert_eq!(server.subrecords(&c, &name).unwrap(), subs);
    let policy = CachePolicy::Lru { capacity: 1000 };
    let mut reader = Reader::new(c, meta.clone(), policy, Some(bk)).unwrap();
    let sid = server.open_session(&c, policy, &[]).unwrap();
    let mut path_total = 0;
    for (i, s) in subs.iter().enumerate() {
        let data = server.read_subrecord(&c, s).unwrap();
        assert_eq!(
            reader.open_subrecord(s, &data).unwrap(),
            format!("sub {i}").as_bytes()
        );
        let issued = server.prove_subrecord(&c, s, Some(sid)).unwrap();
        path_total += issued.proof.path.len();
        reader.verify_subrecord(s, &issued.proof).unwrap();
        server.ack(sid, issued.proof_id).unwrap();
        reader.commit_staged();
    }
    // Sequential proofs share most of their paths: far fewer than 37 full paths (6 each).
    assert!(path_total < 37 * 2, "path_total {path_total}");
    // Without the cache every proof is a full path plus the record proof.
    let mut cold = Reader::new(c, meta, CachePolicy::Off, None).unwrap();
    let p = server.prove_subrecord(&c, &subs[5], None).unwrap().proof;
    assert!(p.path.len() >= 5 && p.record.is_some());
    cold.verify_subrecord(&subs[5], &p).unwrap();
    // The proof of one subrecord does not prove another.
    assert!(cold.verify_subrecord(&subs[6], &p).is_err());
    let mut cut = p.clone();
    cut.path.pop();
    assert!(cold.verify_subrecord(&subs[5], &cut).is_err());
}

/// A multiproof proves subrecords of several records at once; the whole of a record
/// takes no sibling; anything changed, dropped, moved or added is refused; the server
/// refuses unknown, repeated and too many names.
#[test]
fn subrecord_multiproofs_prove_many_and_refuse_tampering() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let a = commit_subrecords(&server, &mut w, 37);
    let b = commit_subrecords(&server, &mut w, 1);
    let d = commit_subrecords(&server, &mut w, 64);
    // Mixed records, out of order.
    let list: Vec<_> = vec![d[63], a[5], b[0], a[36], d[0], a[6], d[17]];
    let proof = server.prove_subrecords(&c, &list, None).unwrap();
    assert_eq!(proof.proof_id, 0);
    let p = proof.proof;
    assert_eq!(p.groups.len(), 3);
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, Some(bk)).unwrap();
    reader.verify_subrecords(&list, &p).unwrap();
    // The same proof does not prove the list in another order, a shorter or a longer one.
    let mut swapped = list.clone();
    swapped.swap(0, 1);
    assert!(reader.verify_subrecords(&swapped, &p).is_err());
    assert!(reader.verify_subrecords(&list[..6], &p).is_err());
    let mut longer = list.clone();
    longer.push(a[7]);
    assert!(reader.verify_subrecords(&longer, &p).is_err());
    // Every sibling bit, leaf position and count matters.
    let g = p
        .groups
        .iter()
        .position(|g| !g.siblings.is_empty())
        .unwrap();
    let mut bad = p.clone();
    bad.groups[g].siblings[0][7] ^= 0x10;
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].siblings.pop();
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].siblings.push([0; 32]);
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].leaves.pop();
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].leaves[0].0 += 1;
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].leaves[0].1 = 99;
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups[g].count += 1;
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    let dup = bad.groups[0].clone();
    bad.groups.push(dup);
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    let mut bad = p.clone();
    bad.groups.swap(0, 1);
    reader.verify_subrecords(&list, &bad).unwrap(); // order of groups does not matter
    let mut bad = p.clone();
    let other = bad.groups[1].record.clone();
    bad.groups[0].record = other;
    assert!(reader.verify_subrecords(&list, &bad).is_err());
    // The whole of a record: no sibling.
    let whole = server.prove_subrecords(&c, &d, None).unwrap().proof;
    assert_eq!(whole.groups.len(), 1);
    assert!(whole.groups[0].siblings.is_empty());
    reader.verify_subrecords(&d, &whole).unwrap();
    // The server refuses names it does not hold, repeated names and too many names.
    let mut unknown = list.clone();
    unknown.push(cairn_core::Hash::new(HashAlgo::Blake3, [9; 32]));
    assert!(matches!(
        server.prove_subrecords(&c, &unknown, None),
        Err(Error::NotFound(_))
    ));
    let mut twice = list.clone();
    twice.push(a[5]);
    assert!(matches!(
        server.prove_subrecords(&c, &twice, None),
        Err(Error::InvalidInput(_))
    ));
    let many = vec![a[0]; MAX_BATCH_SUBRECORDS + 1];
    assert!(matches!(
        server.prove_subrecords(&c, &many, None),
        Err(Error::InvalidInput(_))
    ));
    let none = server.prove_subrecords(&c, &[], None).unwrap().proof;
    assert!(none.groups.is_empty());
    reader.verify_subrecords(&[], &none).unwrap();
    // A batched read is bounded in bytes: one 1 MiB subrecord named 40 times is refused
    // (an answer over MAX_BATCH_ANSWER_BYTES), named 20 times it is read.
    let big = w.write_subrecord(&vec![7u8; 1 << 20]).unwrap();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    const { assert!(40 << 20 > MAX_BATCH_ANSWER_BYTES) };
    assert!(matches!(
        server.read_subrecords(&c, &vec![big; 40]),
        Err(Error::InvalidInput(_))
    ));
    let twenty = server.read_subrecords(&c, &vec![big; 20]).unwrap();
    assert_eq!(twenty.len(), 20);
    assert_eq!(
        reader.open_subrecord(&big, &twenty[19]).unwrap(),
        vec![7u8; 1 << 20]
    );
}

/// A subrecord's memory is asked for before it is read, from the body cache or from the
/// store (a network endpoint takes it from its budget first): a refused reservation ends
/// the read, and a batch is refused for its size before the subrecord that would pass
/// [`MAX_BATCH_ANSWER_BYTES`] is read.
#[test]
fn subrecord_reads_reserve_before_reading() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = SigningKey::from_seed(&[19; 32]);
    let server = CapsuleServer::new(store.clone(), key.clone(), ServerOptions::default());
    let wk = SigningKey::from_seed(&[11; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "reserve");
    let c = meta.name();
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([0; 32]))).unwrap();
    let big = w.write_subrecord(&vec![7u8; 1 << 20]).unwrap();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    let len = sealed.get(0).unwrap().len();
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    // The same store under a server just started: nothing in its body cache.
    let cold = CapsuleServer::new(store, key, ServerOptions::default());
    for server in [&server, &cold] {
        let mut asked = Vec::new();
        let got = server.read_subrecord_within(&c, &big, &mut |n| {
            asked.push(n);
            Err(Error::Unavailable("no memory".into()))
        });
        assert!(matches!(got, Err(Error::Unavailable(_))), "{got:?}");
        assert_eq!(asked, [len]);
        // Refused for its size on the 33rd name, with 32 reserved before it (the 33rd
        // never read).
        let mut reserved = 0;
        let got = server.read_subrecords_within(&c, &vec![big; 40], &mut |_| {
            reserved += 1;
            Ok(())
        });
        assert!(matches!(got, Err(Error::InvalidInput(_))), "{got:?}");
        assert_eq!(reserved, MAX_BATCH_ANSWER_BYTES / (len + 10));
        assert_eq!(
            server
                .read_subrecord_within(&c, &big, &mut |_| Ok(()))
                .unwrap(),
            sealed.get(0).unwrap()
        );
    }
}

/// A checkpoint's memory (its heads three times: the list, the signed message, the
/// answer) is asked for before it is built: a refused reservation ends the query.
#[test]
fn a_checkpoint_reserves_for_its_heads_first() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    for _ in 0..3 {
        // Three separate signed chains: three proven heads.
        let r = w.record(b"head", &[]).unwrap();
        let n = r.name();
        server.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();
    }
    let heads = server.query_fresh(&c, [1; 16]).unwrap().heads.len();
    let mut asked = Vec::new();
    let got = server.query_fresh_within(&c, [2; 16], &mut |n| {
        asked.push(n);
        Err(Error::Unavailable("no memory".into()))
    });
    assert!(matches!(got, Err(Error::Unavailable(_))), "{got:?}");
    assert_eq!(asked, [heads * 102 + 256]);
}

/// Within a session, a verified multiproof leaves the reader and the server's mirror
/// trusting each record's subrecord root: a later single proof of any subrecord of those
/// records stops at the root (no record proof), and verifies.
#[test]
fn subrecord_multiproof_roots_become_trusted() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let a = commit_subrecords(&server, &mut w, 40);
    let b = commit_subrecords(&server, &mut w, 9);
    let policy = CachePolicy::Lru { capacity: 1000 };
    for mode in [cache::MirrorMode::OnAck, cache::MirrorMode::OnIssue] {
        let mut reader = Reader::new(c, meta.clone(), policy, Some(bk.clone())).unwrap();
        reader.set_mirror_mode(mode);
        let sid = server.open_session_with(&c, policy, mode, &[]).unwrap();
        let list = [a[3], a[30], b[8]];
        let issued = server.prove_subrecords(&c, &list, Some(sid)).unwrap();
        reader.verify_subrecords(&list, &issued.proof).unwrap();
        if mode == cache::MirrorMode::OnAck {
            server.ack(sid, issued.proof_id).unwrap();
            reader.commit_staged();
        }
        for s in [a[0], a[39], b[2]] {
            let single = server.prove_subrecord(&c, &s, Some(sid)).unwrap();
            assert!(single.proof.record.is_none(), "{mode:?}: stops at the root");
            reader.verify_subrecord(&s, &single.proof).unwrap();
            if mode == cache::MirrorMode::OnAck {
                server.ack(sid, single.proof_id).unwrap();
                reader.commit_staged();
            }
        }
    }
}

/// A verified subrecord proof makes the siblings on its path trusted, on the reader and
/// in the server's mirror alike: proving newest first, every second subrecord's leaf is
/// already trusted, so its proof is empty, and every proof still verifies.
#[test]
fn subrecord_proof_siblings_become_trusted() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let subs = commit_subrecords(&server, &mut w, 37);
    let policy = CachePolicy::Lru { capacity: 1000 };
    let mut reader = Reader::new(c, meta, policy, Some(bk)).unwrap();
    let sid = server.open_session(&c, policy, &[]).unwrap();
    let mut empty = 0;
    for s in subs.iter().rev() {
        let issued = server.prove_subrecord(&c, s, Some(sid)).unwrap();
        if issued.proof.path.is_empty() && issued.proof.record.is_none() {
            empty += 1;
        }
        reader.verify_subrecord(s, &issued.proof).unwrap();
        server.ack(sid, issued.proof_id).unwrap();
        reader.commit_staged();
    }
    // Leaves 35, 33, ..., 1 come with a path; 34, 32, ..., 0 were siblings before.
    assert_eq!(empty, 18, "empty proofs");
    // The same with the mirror moved on issue: the whole window is issued before the
    // reader verifies any of it, and the proofs still chain off each other's siblings.
    let mut quick = Reader::new(c, server.metadata(&c).unwrap(), policy, None).unwrap();
    quick.set_mirror_mode(cache::MirrorMode::OnIssue);
    let sid = server
        .open_session_with(&c, policy, cache::MirrorMode::OnIssue, &[])
        .unwrap();
    let window: Vec<_> = subs
        .iter()
        .rev()
        .map(|s| server.prove_subrecord(&c, s, Some(sid)).unwrap())
        .collect();
    let empty = window.iter().filter(|i| i.proof.path.is_empty()).count();
    assert_eq!(empty, 18, "empty proofs on issue");
    for (s, issued) in subs.iter().rev().zip(&window) {
        quick.verify_subrecord(s, &issued.proof).unwrap();
    }
    // On a reader of its own: a full proof of leaf 3 makes its sibling, leaf 2, trusted,
    // so an empty proof of 2 verifies; leaf 5 was on no verified path, and an empty proof
    // of it is refused.
    let mut other = Reader::new(c, server.metadata(&c).unwrap(), policy, None).unwrap();
    let p = server.prove_subrecord(&c, &subs[3], None).unwrap().proof;
    other.verify_subrecord(&subs[3], &p).unwrap();
    other.commit_staged();
    let mut empty = p.clone();
    empty.path.clear();
    empty.record = None;
    empty.index = 2;
    other.verify_subrecord(&subs[2], &empty).unwrap();
    empty.index = 5;
    assert!(other.verify_subrecord(&subs[5], &empty).is_err());
    // A full proof (no session) of leaf 2, whose leaf the reader already trusts, still
    // verifies: a reader that asks again without its cache after a mirror went wrong must
    // get somewhere. A tampered one is still refused.
    let full = server.prove_subrecord(&c, &subs[2], None).unwrap().proof;
    assert!(!full.path.is_empty() && full.record.is_some());
    other.verify_subrecord(&subs[2], &full).unwrap();
    let mut bad = full.clone();
    bad.path[0][0] ^= 1;
    assert!(other.verify_subrecord(&subs[2], &bad).is_err());
}

/// The verified-body cache answers a read only for the capsule that accepted the body: a
/// subrecord of one capsule, cached by its commit and by reads, is not found through
/// another capsule on the same server, nor is a subrecord whose commit was refused.
#[test]
fn cached_subrecords_stay_in_their_capsule() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let wk2 = SigningKey::from_seed(&[2; 32]);
    let meta2 = CapsuleMetadata::new(HashAlgo::Blake3, wk2.public(), "second");
    server.create(&meta2).unwrap();
    let c2 = meta2.name();
    let sub = w.write_subrecord(b"only in the first").unwrap();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    assert_eq!(
        server.read_subrecord(&c, &sub).unwrap(),
        sealed.get(0).unwrap()
    );
    assert!(matches!(
        server.read_subrecord(&c2, &sub),
        Err(Error::NotFound(_))
    ));
    // A commit refused for a bad signature caches nothing either.
    let lost = w.write_subrecord(b"refused").unwrap();
    let (header, sealed, _) = w.commit_subrecords(&[]).unwrap();
    let forged = WriterSignature {
        writer: 0,
        sig: wk2.sign(b"cairn/record", header.name().hash().digest()),
    };
    assert!(
        server
            .commit_subrecords(&c, &header, &sealed, Some(forged))
            .is_err()
    );
    assert!(matches!(
        server.read_subrecord(&c, &lost),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn merkle_log_checkpoints_and_proofs() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 50, 7);
    let pk = server.public_key();
    let cp1 = server.query_fresh(&c, [1; 16]).unwrap();
    cp1.verify(&pk, &c, &[1; 16]).unwrap();
    // A checkpoint answers the query whose nonce it signs: replayed for another, refused.
    let e = cp1.verify(&pk, &c, &[2; 16]).unwrap_err();
    assert!(e.to_string().contains("replay"), "{e}");
    let mut moved = cp1.clone();
    moved.nonce = [2; 16];
    assert!(
        moved.verify(&pk, &c, &[2; 16]).is_err(),
        "the nonce is signed"
    );
    let more = write_chain(&server, &mut w, 30, 7);
    let cp2 = server.query_fresh(&c, [1; 16]).unwrap();
    cp2.verify(&pk, &c, &[1; 16]).unwrap();
    assert_eq!(cp2.heads, vec![more[29]]);
    let cons = server.log_consistency(&c, cp1.size, cp2.size).unwrap();
    verify_consistency(
        HashAlgo::Blake3,
        cp1.size,
        cp2.size,
        &cp1.root,
        &cp2.root,
        &cons,
    )
    .unwrap();
    let (idx, path) = server.log_inclusion(&c, &names[17], cp2.size).unwrap();
    let leaf = CapsuleDag::log_leaf(&names[17]);
    verify_inclusion(HashAlgo::Blake3, idx, cp2.size, &leaf, &path, &cp2.root).unwrap();
    assert!(path.len() <= 7);
    let mut forged = cp2.clone();
    forged.size += 1;
    assert!(forged.verify(&pk, &c, &[1; 16]).is_err());
    // The same checks on the checkpoints themselves.
    cp2.verify_extends(&cp1, &cons).unwrap();
    cp2.verify_includes(&names[17], idx, &path).unwrap();
    cp2.verify_includes(
        &more[3],
        50 + 3,
        &server.log_inclusion(&c, &more[3], cp2.size).unwrap().1,
    )
    .unwrap();
    // A later checkpoint whose log is not the earlier one grown (a root rewritten at the
    // same sizes), one that shrank, a proof of another pair of sizes, another record or
    // index: refused.
    let mut rewritten = cp2.clone();
    rewritten.root[0] ^= 1;
    assert!(matches!(
        rewritten.verify_extends(&cp1, &cons),
        Err(Error::Rejected(_))
    ));
    assert!(matches!(
        cp1.verify_extends(&cp2, &cons),
        Err(Error::Rejected(_))
    ));
    let other = server.log_consistency(&c, cp1.size - 1, cp2.size).unwrap();
    assert!(cp2.verify_extends(&cp1, &other).is_err());
    assert!(cp2.verify_extends(&cp1, &cons[1..]).is_err());
    assert!(cp2.verify_includes(&names[18], idx, &path).is_err());
    assert!(cp2.verify_includes(&names[17], idx + 1, &path).is_err());
    assert!(rewritten.verify_includes(&names[17], idx, &path).is_err());
    // Equal checkpoints extend each other with an empty proof.
    cp2.verify_extends(&cp2, &[]).unwrap();
}

#[test]
fn journal_replays_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "durable");
    let c = meta.name();
    let (names, heads, root) = {
        let store: Arc<dyn Store> =
            Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
        let server = CapsuleServer::new(
            store,
            SigningKey::from_seed(&[9; 32]),
            ServerOptions::default(),
        );
        server.create(&meta).unwrap();
        let mut w = Writer::new(meta.clone(), wk.clone(), Some(BodyKey([7; 32])))
            .unwrap()
            .with_skip_pointers(true);
        let names = write_chain(&server, &mut w, 64, 16);
        let cp = server.query_fresh(&c, [1; 16]).unwrap();
        (names, cp.heads, cp.root)
    };
    let store: Arc<dyn Store> =
        Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
    let server = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    );
    assert_eq!(server.capsule_names().unwrap(), vec![c]);
    // A ref under the capsules' prefix that names no capsule (damage, another program's)
    // is left out of the listing, not the end of it.
    server
        .store()
        .commit(&[cairn_store::RefUpdate::Set {
            name: b"capsule/not-a-capsule".to_vec(),
            value: vec![1],
        }])
        .unwrap();
    assert_eq!(server.capsule_names().unwrap(), vec![c]);
    let cp = server.query_fresh(&c, [1; 16]).unwrap();
    assert_eq!(cp.heads, heads);
    assert_eq!(cp.root, root);
    let mut reader = Reader::new(c, server.metadata(&c).unwrap(), CachePolicy::Off, None).unwrap();
    for n in &names {
        let p = server.prove(&c, n, None).unwrap().proof;
        // Skip pointers keep chains logarithmic: without them the first record of each
        // 16-record block would need 16 headers; with them at most 2·log2(16) + 1.
        assert!(p.chain.len() <= 9, "chain of {}", p.chain.len());
        reader.verify_record(n, &p).unwrap();
    }
}

/// A model of witnesses: the shortest distance from each present record to a signed one,
/// walking from a record to present children that point at it.
fn model_hops(
    present: &BTreeSet<usize>,
    parents: &HashMap<usize, Vec<usize>>,
    signed: &BTreeSet<usize>,
) -> HashMap<usize, u32> {
    let mut dist = HashMap::new();
    let mut q = VecDeque::new();
    for s in signed {
        if present.contains(s) {
            dist.insert(*s, 0);
            q.push_back(*s);
        }
    }
    while let Some(x) = q.pop_front() {
        let d = dist[&x];
        for p in &parents[&x] {
            if present.contains(p) && !dist.contains_key(p) {
                dist.insert(*p, d + 1);
                q.push_back(*p);
            }
        }
    }
    dist
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Records arrive in any order (holes, late parents), signatures land anywhere: the
    /// DAG's witnesses are always shortest, heads and roots are the physical ones, and
    /// every proof the server gives verifies.
    #[test]
    fn dag_matches_model(
        n in 2usize..40,
        links in proptest::collection::vec((0usize..40, 0usize..40), 0..60),
        order_seed in any::<u64>(),
        sig_every in 1usize..9,
    ) {
        let (server, _w, meta, _) = setup();
        let c = meta.name();
        let wk = SigningKey::from_seed(&[1; 32]);
        // Record i points to i-1 and to random earlier records.
        let mut parents: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in 0..n {
            let mut ps = if i > 0 { vec![i - 1] } else { vec![] };
            for (a, b) in &links {
                let (a, b) = (a % n, b % n);
                if a == i && b < i && !ps.contains(&b) { ps.push(b); }
            }
            parents.insert(i, ps);
        }
        let mut recs: Vec<Record> = Vec::new();
        for i in 0..n {
            let bp = parents[&i].iter().map(|p| recs[*p].name()).collect();
            recs.push(Record::new(c, format!("{i}").into_bytes(), bp));
        }
        let writer = Writer::new(meta.clone(), wk, None).unwrap();
        // Deterministic shuffle of arrival order.
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = order_seed | 1;
        for i in (1..n).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut present = BTreeSet::new();
        let mut signed = BTreeSet::new();
        for (step, &i) in order.iter().enumerate() {
            let name = recs[i].name();
            let sigs = if step % sig_every == 0 { vec![(name, writer.sign(&name))] } else { vec![] };
            server.write(&c, &[recs[i].clone()], &sigs).unwrap();
            present.insert(i);
            if !sigs.is_empty() { signed.insert(i); }
            let want = model_hops(&present, &parents, &signed);
            server.with_dag(&c, |dag| {
                for &j in &present {
                    let got = dag.witness(&recs[j].name()).unwrap().hops();
                    assert_eq!(got, want.get(&j).copied(), "record {j}");
                }
                let heads: BTreeSet<_> = present.iter().filter(|&&j| {
                    !present.iter().any(|&k| parents[&k].contains(&j))
                }).map(|&j| recs[j].name()).collect();
                assert_eq!(dag.heads().into_iter().collect::<BTreeSet<_>>(), heads);
                let roots: BTreeSet<_> = present.iter().filter(|&&j| {
                    !parents[&j].iter().any(|p| present.contains(p))
                }).map(|&j| recs[j].name()).collect();
                assert_eq!(dag.roots().into_iter().collect::<BTreeSet<_>>(), roots);
            }).unwrap();
        }
        let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
        let want = model_hops(&present, &parents, &signed);
        for (i, r) in recs.iter().enumerate() {
            match server.prove(&c, &r.name(), None) {
                Ok(issued) => {
                    prop_assert_eq!(issued.proof.chain.len() as u32 - 1, want[&i]);
                    reader.verify_record(&r.name(), &issued.proof).unwrap();
                }
                Err(_) => prop_assert!(!want.contains_key(&i)),
            }
        }
    }
}

#[test]
fn object_gc_keeps_capsule_chunks_in_a_shared_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let db = cairn_object::Db::new(store.clone());
    let server = CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    );
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "shared");
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([7; 32]))).unwrap();
    let names = write_chain(&server, &mut w, 12, 4);
    // An object version that becomes garbage once its branch is removed.
    db.put(
        b"k",
        cairn_object::Target::Branch(cairn_object::DEFAULT_BRANCH),
        cairn_object::NewValue::String(b"v".to_vec()),
        &cairn_object::PutOptions::default(),
    )
    .unwrap();
    db.remove(b"k", cairn_object::DEFAULT_BRANCH).unwrap();
    let report = db.gc().unwrap();
    assert!(report.removed >= 1, "{report:?}");
    let c = meta.name();
    let fresh = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    );
    let mut reader = Reader::new(c, fresh.metadata(&c).unwrap(), CachePolicy::Off, None).unwrap();
    for n in &names {
        fresh.read(&c, n).unwrap();
        let p = fresh.prove(&c, n, None).unwrap().proof;
        reader.verify_record(n, &p).unwrap();
    }
}

/// A window of subrecord proofs issued before any ack (the bench's pipelined mode): the
/// reader stages what each verified, so none of them "runs past a trusted node"; after the
/// acks both copies of the cache hold the same names and later proofs stop early.
#[test]
fn pipelined_subrecord_proofs_with_acks_after_the_window() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let subs = commit_subrecords(&server, &mut w, 16);
    let policy = CachePolicy::Lru { capacity: 1000 };
    let mut reader = Reader::new(c, meta, policy, Some(bk)).unwrap();
    let sid = server.open_session(&c, policy, &[]).unwrap();
    let window: Vec<_> = subs[..8]
        .iter()
        .map(|s| server.prove_subrecord(&c, s, Some(sid)).unwrap())
        .collect();
    for (s, issued) in subs[..8].iter().zip(&window) {
        // Each proof of the window is a full path: nothing was acked when it was issued.
        assert!(issued.proof.record.is_some());
        reader.verify_subrecord(s, &issued.proof).unwrap();
    }
    assert!(reader.staged() > 0);
    for issued in &window {
        server.ack(sid, issued.proof_id).unwrap();
    }
    reader.commit_staged();
    assert_eq!(reader.staged(), 0);
    // The next proof stops at a node both sides now trust.
    let next = server.prove_subrecord(&c, &subs[9], Some(sid)).unwrap();
    assert!(next.proof.record.is_none());
    reader.verify_subrecord(&subs[9], &next.proof).unwrap();
}

/// With the mirror moved on issue, a pipelined window of proofs chains off each other: the
/// second proof stops at the first one's names, and both verify in order.
#[test]
fn on_issue_mirror_chains_pipelined_proofs() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 40, 20);
    let policy = CachePolicy::Lru { capacity: 1000 };
    let mut reader = Reader::new(c, meta, policy, Some(bk)).unwrap();
    reader.set_mirror_mode(cache::MirrorMode::OnIssue);
    let sid = server
        .open_session_with(&c, policy, cache::MirrorMode::OnIssue, &[])
        .unwrap();
    // Newest first, all issued before any is verified.
    let order: Vec<_> = names.iter().rev().copied().collect();
    let window: Vec<_> = order
        .iter()
        .map(|n| server.prove(&c, n, Some(sid)).unwrap())
        .collect();
    let total: usize = window.iter().map(|i| i.proof.chain.len()).sum();
    // names[39] is signed (1 header); every later proof is the record plus its cached
    // successor (2 headers), or 1 header for names[19], which is signed.
    assert_eq!(window[0].proof.chain.len(), 1);
    assert_eq!(total, 2 * names.len() - 2);
    for (n, issued) in order.iter().zip(&window) {
        assert_eq!(issued.proof_id, 0, "nothing to ack on issue");
        reader.verify_record(n, &issued.proof).unwrap();
    }
    // Acks are refused in this mode: there is nothing pending.
    assert!(server.ack(sid, 1).is_err());
}

/// With the mirror moved on issue, a proof the reader refuses leaves the server's mirror
/// ahead of the reader: later proofs stopping at the refused names are refused too (never
/// accepted), and a new session with the reader's own names restores short proofs.
#[test]
fn on_issue_mirror_drift_is_caught_and_resynchronised() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 20, 20);
    let policy = CachePolicy::Lru { capacity: 100 };
    let mode = cache::MirrorMode::OnIssue;
    let mut reader = Reader::new(c, meta, policy, Some(bk)).unwrap();
    reader.set_mirror_mode(mode);
    let sid = server.open_session_with(&c, policy, mode, &[]).unwrap();
    // The proof of names[15] is lost (say the reader dropped it): the server's mirror now
    // holds names[15..20], the reader's does not.
    let lost = server.prove(&c, &names[15], Some(sid)).unwrap();
    assert_eq!(lost.proof.chain.len(), 5);
    let issued = server.prove(&c, &names[14], Some(sid)).unwrap();
    assert_eq!(issued.proof.anchor, Anchor::Cached);
    assert_eq!(issued.proof.chain.len(), 2);
    assert!(matches!(issued.proof.anchor, Anchor::Cached));
    assert!(matches!(
        reader.verify_record(&names[14], &issued.proof),
        Err(Error::Rejected(_))
    ));
    assert!(reader.cache().is_empty());
    // Resynchronise: a new session seeded with what the reader really holds (nothing), so
    // the proof runs to the signature again, and the one after it stops at the cache.
    let sid = server
        .open_session_with(&c, policy, mode, &reader.cache().names())
        .unwrap();
    let issued = server.prove(&c, &names[14], Some(sid)).unwrap();
    assert_eq!(issued.proof.chain.len(), 6);
    reader.verify_record(&names[14], &issued.proof).unwrap();
    let issued = server.prove(&c, &names[13], Some(sid)).unwrap();
    assert_eq!(issued.proof.chain.len(), 2);
    assert!(matches!(issued.proof.anchor, Anchor::Cached));
    reader.verify_record(&names[13], &issued.proof).unwrap();
}

/// Read-and-prove: the body and the proof in one answer; a tampered body is refused and
/// notes nothing in the reader's cache.
#[test]
fn read_and_prove_checks_body_and_proof_together() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 12, 4);
    let policy = CachePolicy::Lru { capacity: 100 };
    let mode = cache::MirrorMode::OnIssue;
    let mut reader = Reader::new(c, meta, policy, Some(bk)).unwrap();
    reader.set_mirror_mode(mode);
    let sid = server.open_session_with(&c, policy, mode, &[]).unwrap();
    // A tampered body: refused, nothing cached.
    let (mut body, issued) = server.read_and_prove(&c, &names[2], None).unwrap();
    body[0] ^= 1;
    assert!(reader.verify_read(&names[2], body, &issued.proof).is_err());
    assert!(reader.cache().is_empty());
    // A proof for another record than the one asked: refused.
    let (body, other) = server.read_and_prove(&c, &names[3], None).unwrap();
    assert!(reader.verify_read(&names[2], body, &other.proof).is_err());
    assert!(reader.cache().is_empty());
    for (i, n) in names.iter().enumerate().rev() {
        let (body, issued) = server.read_and_prove(&c, n, Some(sid)).unwrap();
        let plain = reader.verify_read(n, body, &issued.proof).unwrap();
        assert_eq!(plain, format!("record {i}").as_bytes());
    }
    // An unknown record is a clear not-found and issues nothing.
    let stranger = RecordName(cairn_core::Hash::new(HashAlgo::Blake3, [3; 32]));
    assert!(matches!(
        server.read_and_prove(&c, &stranger, Some(sid)),
        Err(Error::NotFound(_))
    ));
}

/// The server's body cache hands out only what it verified: reads through a warm cache,
/// a cold one and none at all agree; a chunk damaged in the store after the write is
/// refused by every server that has to read it from the store (and is not cached by the
/// refusal), while the writing server keeps serving the bytes it verified; a tiny budget
/// evicts and falls back to the store.
#[test]
fn body_cache_serves_only_verified_bytes() {
    let mem = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = mem.clone();
    let server_with = |bytes: usize| {
        CapsuleServer::new(
            store.clone(),
            SigningKey::from_seed(&[9; 32]),
            ServerOptions {
                body_cache_bytes: bytes,
                ..ServerOptions::default()
            },
        )
    };
    let warm = server_with(64 << 20);
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "cache");
    let c = meta.name();
    let bk = BodyKey([7; 32]);
    warm.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(bk.clone())).unwrap();
    let names = write_chain(&warm, &mut w, 200, 10);
    let mut subs = Vec::new();
    for i in 0..20 {
        subs.push(w.write_subrecord(format!("sub {i}").as_bytes()).unwrap());
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    warm.commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    let reader = Reader::new(c, meta.clone(), CachePolicy::Off, Some(bk)).unwrap();
    let none = server_with(0);
    let tiny = server_with(16 * 300);
    for (i, n) in names.iter().enumerate() {
        for s in [&warm, &none, &tiny] {
            let r = s.read(&c, n).unwrap();
            assert_eq!(
                reader.open_record(n, &r).unwrap(),
                format!("record {i}").as_bytes()
            );
        }
    }
    for (i, sub) in subs.iter().enumerate() {
        for s in [&warm, &none, &tiny] {
            let data = s.read_subrecord(&c, sub).unwrap();
            assert_eq!(
                reader.open_subrecord(sub, &data).unwrap(),
                format!("sub {i}").as_bytes()
            );
        }
    }
    // Damage one body and one subrecord in the store.
    let n = names[57];
    let BodyRef::Plain { hash: body_cid, .. } = warm.read(&c, &n).unwrap().header.body else {
        panic!("a plain record")
    };
    for cid in [body_cid, subs[7]] {
        let mut bad = store.get(&cid).unwrap().unwrap().to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(mem.tamper(&cid, bad));
    }
    let cold = server_with(64 << 20);
    for s in [&none, &cold] {
        for _ in 0..2 {
            assert!(matches!(s.read(&c, &n), Err(Error::Corrupt(_))));
            assert!(matches!(
                s.read_subrecord(&c, &subs[7]),
                Err(Error::Corrupt(_))
            ));
        }
    }
    // The writing server verified these bytes on write and still serves them.
    assert_eq!(
        reader.open_record(&n, &warm.read(&c, &n).unwrap()).unwrap(),
        b"record 57"
    );
    let data = warm.read_subrecord(&c, &subs[7]).unwrap();
    assert_eq!(reader.open_subrecord(&subs[7], &data).unwrap(), b"sub 7");
}

#[test]
fn a_reader_skips_only_its_own_signature_byte_for_byte() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 20, 5);
    let good = server.prove(&c, &names[1], None).unwrap().proof;
    let Anchor::Signed(ws) = good.anchor.clone() else {
        panic!("a fresh reader's proof ends in a signature");
    };
    let anchor = good.chain.last().unwrap().name();
    // A writer in this process whose key is not the capsule's (writer index 0 all the
    // same): its signature is not authentic, so a proof anchored on it is refused...
    let intruder = intruder(&meta);
    let mut plain = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    let bogus = intruder.sign(&anchor);
    assert_eq!(bogus.writer, ws.writer);
    assert_ne!(bogus, ws);
    let mut forged = good.clone();
    forged.anchor = Anchor::Signed(bogus);
    assert!(matches!(
        plain.verify_record(&names[1], &forged),
        Err(Error::Rejected(_))
    ));
    // ... even when this process made it (`sign_for`): the intruder writes another capsule
    // (its metadata names another writer), so its signature is not noted in a reader of
    // this one and the Ed25519 check still runs.
    let mut trusting = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    assert_eq!(intruder.sign_for(&anchor, &mut trusting), bogus);
    assert!(trusting.verify_record(&names[1], &forged).is_err());
    // Noted for another name, it is checked (and refused).
    let mut other = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    intruder.sign_for(&names[19], &mut other);
    assert!(other.verify_record(&names[1], &forged).is_err());
    // The real writer's own signature noted: the forged proof is still refused, the good
    // one passes.
    let mut own = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    assert_eq!(w.sign_for(&anchor, &mut own), ws);
    assert!(own.verify_record(&names[1], &forged).is_err());
    own.verify_record(&names[1], &good).unwrap();
}

/// A server keeps at most `max_loaded_capsules` capsules in memory: the least recently used
/// idle ones are unloaded and replayed from the store on their next use, with nothing lost
/// (writes go on from where they were, under several threads, and the journals replay in
/// a fresh server).
#[test]
fn idle_capsules_are_unloaded_and_reload_intact() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let opts = ServerOptions {
        max_loaded_capsules: 3,
        ..ServerOptions::default()
    };
    let server = Arc::new(CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[9; 32]),
        opts,
    ));
    let bk = BodyKey([7; 32]);
    let writers: Vec<Writer> = (0..12u8)
        .map(|i| {
            let wk = SigningKey::from_seed(&[i + 1; 32]);
            let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), format!("c{i}"));
            server.create(&meta).unwrap();
            assert!(server.loaded_capsules() <= 3);
            Writer::new(meta, wk, Some(bk.clone())).unwrap()
        })
        .collect();
    // Four threads, three capsules each, interleaved so capsules load and unload all along.
    let mut per_thread: Vec<Vec<Writer>> = (0..4).map(|_| Vec::new()).collect();
    for (i, w) in writers.into_iter().enumerate() {
        per_thread[i % 4].push(w);
    }
    let handles: Vec<_> = per_thread
        .into_iter()
        .map(|mut ws| {
            let server = server.clone();
            std::thread::spawn(move || {
                for round in 0..20 {
                    for w in &mut ws {
                        write_chain(&server, w, 1 + round % 3, 2);
                    }
                }
                ws
            })
        })
        .collect();
    let writers: Vec<Writer> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        server.loaded_capsules() <= 3,
        "{}",
        server.loaded_capsules()
    );
    // 20 rounds of 1, 2, 3 records: 39 per capsule.
    let fresh = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    );
    for w in &writers {
        let c = w.capsule();
        assert_eq!(server.with_dag(&c, |d| d.len()).unwrap(), 39);
        assert_eq!(fresh.with_dag(&c, |d| d.len()).unwrap(), 39);
        assert_eq!(fresh.audit(&c).unwrap(), (39, 39_u64.div_ceil(2) + 6));
        assert_eq!(
            server.heads_roots(&c).unwrap(),
            fresh.heads_roots(&c).unwrap()
        );
    }
}

/// Past `max_sessions`, opening a session ends the least recently used one: requests
/// naming it are refused as not found (nothing else changes), the others go on.
#[test]
fn the_least_recently_used_session_ends_past_the_limit() {
    let server = server_with(ServerOptions {
        max_sessions: 2,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "sessions");
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([7; 32]))).unwrap();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 4, 4);
    let policy = CachePolicy::Lru { capacity: 100 };
    let a = server.open_session(&c, policy, &[]).unwrap();
    let b = server.open_session(&c, policy, &[]).unwrap();
    // `a` is used after `b`, so `b` is the least recently used when `d` opens.
    server.prove(&c, &names[0], Some(a)).unwrap();
    let d = server.open_session(&c, policy, &[]).unwrap();
    assert!(matches!(
        server.prove(&c, &names[1], Some(b)),
        Err(Error::NotFound(m)) if m.contains("session")
    ));
    for s in [a, d] {
        let issued = server.prove(&c, &names[2], Some(s)).unwrap();
        server.ack(s, issued.proof_id).unwrap();
    }
    // Closing frees a place: a new session does not end a live one.
    server.close_session(d);
    let e = server.open_session(&c, policy, &[]).unwrap();
    server.prove(&c, &names[3], Some(a)).unwrap();
    server.prove(&c, &names[3], Some(e)).unwrap();
    assert_eq!(server.with_dag(&c, |dag| dag.len()).unwrap(), 4);
}

/// The mirrors of all sessions together hold at most `max_mirrored_names` names: a proof,
/// an ack or a new session's seed that takes them past it ends the least recently used
/// other sessions (their requests are refused as not found), never the one that grew;
/// a session asking for more than the whole budget is refused; ended and closed
/// sessions give their names back.
#[test]
fn mirrors_stay_within_the_servers_name_budget() {
    let server = server_with(ServerOptions {
        max_mirrored_names: 10,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "mirror budget");
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([7; 32]))).unwrap();
    let c = meta.name();
    // One signature at the end: a proof of the first record names all eight.
    let names = write_chain(&server, &mut w, 8, 8);
    // Names a reader says it caches (none on the chain, so proofs run to the signature).
    let seed = |n: u8| -> Vec<cairn_core::Hash> {
        (0..n)
            .map(|i| cairn_core::Hash::new(HashAlgo::Blake3, [i; 32]))
            .collect()
    };
    let policy = CachePolicy::Lru { capacity: 10 };

    let e = server
        .open_session(&c, CachePolicy::Lru { capacity: 11 }, &[])
        .unwrap_err();
    assert!(e.to_string().contains("smaller cache"), "{e}");
    assert_eq!(server.mirrored_names(), 0);

    let a = server.open_session(&c, policy, &seed(6)).unwrap();
    let b = server.open_session(&c, policy, &seed(3)).unwrap();
    assert_eq!(server.mirrored_names(), 9);
    // A third session's seed goes past 10: `a`, the least recently used, ends.
    let d = server.open_session(&c, policy, &seed(3)).unwrap();
    assert_eq!(server.mirrored_names(), 6);
    assert!(matches!(
        server.prove(&c, &names[7], Some(a)),
        Err(Error::NotFound(m)) if m.contains("session")
    ));
    // `b` is issued a proof (the chain from the first record to the signature: eight
    // names). They count from the issue, as a reader that never acks holds them too: past
    // the budget, `d` ends, `b` stays.
    let issued = server.prove(&c, &names[0], Some(b)).unwrap();
    assert_eq!(issued.proof.chain.len(), 8);
    assert_eq!(server.mirrored_names(), 11);
    assert!(matches!(
        server.prove(&c, &names[7], Some(d)),
        Err(Error::NotFound(m)) if m.contains("session")
    ));
    // At the ack they move to the mirror, whose capacity keeps 10 of its 11.
    server.ack(b, issued.proof_id).unwrap();
    assert_eq!(server.mirrored_names(), 10);
    // `b` mirrors the whole chain now: its proofs stop at its own cache.
    let p = server.prove(&c, &names[5], Some(b)).unwrap();
    assert_eq!(p.proof.chain.len(), 1);
    server.ack(b, p.proof_id).unwrap();
    server.close_session(b);
    assert_eq!(server.mirrored_names(), 0);
}

/// A writer continued from given heads points its next record at all of them, also after
/// it wrote records of its own (the bucket journal continues from the capsule's heads
/// after a failed group).
#[test]
fn a_continued_writer_points_at_every_head() {
    let (_server, mut w, _meta, _key) = setup();
    let mut names = Vec::new();
    for i in 0..3 {
        names.push(w.record(format!("r{i}").as_bytes(), &[]).unwrap().name());
    }
    let next = w.record(b"r3", &[]).unwrap();
    assert_eq!(next.header.backpointers[0], names[2]);
    let heads = vec![names[0], names[1]];
    w.continue_from(&heads);
    let r = w.record(b"after", &[]).unwrap();
    assert_eq!(r.header.backpointers, heads);
    let r2 = w.record(b"after 2", &[]).unwrap();
    assert_eq!(r2.header.backpointers[0], r.name());
}

// Server-side checks found missing in review (2026-11-27).

/// A subrecord record committed unsigned, then again with the writer's signature: the
/// signature is stored before the ack, so the record can be proven.
#[test]
fn a_signature_on_a_present_subrecord_record_is_kept() {
    let (server, mut w, meta, _) = setup();
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
    let (server, mut w, meta, _) = setup();
    let a = meta.name();
    let wk2 = SigningKey::from_seed(&[2; 32]);
    let meta_b = CapsuleMetadata::new(HashAlgo::Blake3, wk2.public(), "other");
    server.create(&meta_b).unwrap();
    let r = w.record(b"x", &[]).unwrap();
    let n = r.name();
    server.write(&a, &[r], &[(n, w.sign(&n))]).unwrap();
    let pk = server.public_key();
    server
        .query_fresh(&a, [1; 16])
        .unwrap()
        .verify(&pk, &a, &[1; 16])
        .unwrap();
    let cp_b = server.query_fresh(&meta_b.name(), [1; 16]).unwrap();
    assert!(matches!(
        cp_b.verify(&pk, &a, &[1; 16]),
        Err(cairn_core::Error::Rejected(_))
    ));
    cp_b.verify(&pk, &meta_b.name(), &[1; 16]).unwrap();
}

/// A subrecord read of a name that is a record's body hash (its body cached) is not
/// answered with that body.
#[test]
fn a_subrecord_read_never_answers_with_a_record_body() {
    let (server, mut w, meta, _) = setup();
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
            body: SyncBody::Subrecords(vec![Vec::new(); each].into()),
            signature: None,
        };
        Request::Sync {
            capsule: CapsuleName(HashAlgo::Blake3.digest(b"c")),
            peer: SigningKey::from_seed(&[5; 32]).public(),
            session: 7,
            sig: SigningKey::from_seed(&[5; 32]).sign(b"test", b"sig"),
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

/// A reader asking for the whole of a record's subrecords checks that the list is all of
/// that record's, in order: a server answering with part of the list, with another
/// record's subrecords, or reordered is refused, though each listed subrecord is in the
/// capsule.
#[test]
fn a_whole_record_of_subrecords_is_checked_complete() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let a = commit_subrecords(&server, &mut w, 37);
    let rec_a = server.query_fresh(&c, [1; 16]).unwrap().heads[0];
    let b = commit_subrecords(&server, &mut w, 5);
    assert_eq!(server.subrecords(&c, &rec_a).unwrap(), a);
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, Some(bk)).unwrap();
    let whole = server.prove_subrecords(&c, &a, None).unwrap().proof;
    reader.verify_record_subrecords(&rec_a, &a, &whole).unwrap();
    // Part of the list: each is in the capsule, but it is not the whole record.
    let part = server.prove_subrecords(&c, &a[..30], None).unwrap().proof;
    reader.verify_subrecords(&a[..30], &part).unwrap();
    assert!(
        reader
            .verify_record_subrecords(&rec_a, &a[..30], &part)
            .is_err()
    );
    // Another record's subrecords, offered as this record's.
    let other = server.prove_subrecords(&c, &b, None).unwrap().proof;
    reader.verify_subrecords(&b, &other).unwrap();
    assert!(reader.verify_record_subrecords(&rec_a, &b, &other).is_err());
    // Reordered.
    let mut swapped = a.clone();
    swapped.swap(0, 1);
    let p = server.prove_subrecords(&c, &swapped, None).unwrap().proof;
    reader.verify_subrecords(&swapped, &p).unwrap();
    assert!(
        reader
            .verify_record_subrecords(&rec_a, &swapped, &p)
            .is_err()
    );
}

/// The whole of a genuine record's subrecords is proven even when the record repeats a
/// subrecord or shares one with an earlier record (a plaintext capsule: equal content,
/// equal name): proven by index, in process and over the wire. Asked by name, the shared
/// one was proven under the earlier record (two groups, refused) and the repeated one was
/// refused as named twice.
#[test]
fn whole_records_with_shared_or_repeated_subrecords_are_proven() {
    let server = Arc::new(server_with(ServerOptions::default()));
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "plain");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, None).unwrap();
    let mut commit = |parts: &[&[u8]]| {
        for p in parts {
            w.write_subrecord(p).unwrap();
        }
        let (h, subs, sig) = w.commit_subrecords(&[]).unwrap();
        server.commit_subrecords(&c, &h, &subs, Some(sig)).unwrap();
        h.name()
    };
    let _first = commit(&[b"a", b"b"]);
    let shared = commit(&[b"c", b"a"]);
    let repeated = commit(&[b"x", b"x", b"y"]);
    let service = CapsuleService::new(server.clone());
    for record in [shared, repeated] {
        let list = server.subrecords(&c, &record).unwrap();
        let proof = server
            .prove_record_subrecords(&c, &record, None)
            .unwrap()
            .proof;
        let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
        reader
            .verify_record_subrecords(&record, &list, &proof)
            .unwrap();
        // Over the wire, the same answer.
        let req = Request::ProveRecordSubrecords {
            capsule: c,
            record,
            session: None,
        };
        let Ok(Response::SubrecordsProof { proof: remote, .. }) =
            Response::from_bytes(&service.handle_bytes(&req.to_bytes()))
        else {
            panic!("no proof over the wire");
        };
        assert_eq!(remote, proof);
        // It is of this record only: offered for another it is refused.
        let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
        let other = if record == shared { repeated } else { shared };
        assert!(
            reader
                .verify_record_subrecords(&other, &list, &proof)
                .is_err()
        );
    }
    // A record with no subrecords is not one to prove this way.
    let plain = {
        let r = w.record(b"body", &[]).unwrap();
        let n = r.name();
        server
            .write(&c, std::slice::from_ref(&r), &[(n, w.sign(&n))])
            .unwrap();
        n
    };
    assert!(server.prove_record_subrecords(&c, &plain, None).is_err());
}

/// Session ids cannot be guessed from one's own: closing the ids next to a session's does
/// not end a session opened just before or after it.
#[test]
fn session_ids_are_not_guessable_from_neighbours() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 3, 1);
    let policy = CachePolicy::Lru { capacity: 100 };
    let first = server.open_session(&c, policy, &[]).unwrap();
    let mine = server.open_session(&c, policy, &[]).unwrap();
    let next = server.open_session(&c, policy, &[]).unwrap();
    for guess in [mine.0.wrapping_sub(1), mine.0.wrapping_add(1)] {
        server.close_session(SessionId(guess));
    }
    for s in [first, mine, next] {
        assert!(
            server.prove(&c, &names[0], Some(s)).is_ok(),
            "session {s:?} was closed"
        );
    }
    server.close_session(mine);
    assert!(server.prove(&c, &names[0], Some(mine)).is_err());
}

/// A session proof's search for a record the reader trusts looks at proven records only:
/// unsigned children (anyone may write them) cannot lead to a trusted record, and a
/// record with 10,000 of them made every proof of it walk them all. Also, the proven
/// heads a writer continues from leave those children out.
#[test]
fn the_search_for_a_trusted_record_skips_unproven_children() {
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "dag");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    let mut w = Writer::new(meta.clone(), wk, None).unwrap();
    let mut dag = CapsuleDag::new(meta);
    let body = |r: &Record| match r.header.body {
        cairn_capsule::record::BodyRef::Plain { hash, .. } => {
            cairn_capsule::dag::StoredBody::Plain { cid: hash }
        }
        _ => unreachable!("plain records"),
    };
    let chain: Vec<Record> = (0..4)
        .map(|i| w.record(format!("r{i}").as_bytes(), &[]).unwrap())
        .collect();
    for r in &chain {
        assert!(dag.insert(r.name(), &r.header, body(r)));
    }
    let newest = chain[3].name();
    dag.add_signature(newest, w.sign(&newest)).unwrap();
    let oldest = chain[0].name();
    for i in 0..10_000u32 {
        let junk = Record::new(c, i.to_le_bytes().to_vec(), vec![oldest]);
        dag.insert(junk.name(), &junk.header, body(&junk));
    }
    // The reader trusts chain[2]: the path from the oldest runs through chain[1].
    let asked = std::cell::Cell::new(0usize);
    let trusted = chain[2].name();
    let found = dag
        .chain_to_trusted(&oldest, |h| {
            asked.set(asked.get() + 1);
            h == trusted.hash()
        })
        .unwrap();
    assert_eq!(found, vec![oldest, chain[1].name(), trusted]);
    assert!(asked.get() <= 4, "{} records looked at", asked.get());
    assert_eq!(dag.proven_heads(), vec![newest]);
    assert_eq!(dag.heads().len(), 10_001);
}

/// A reader that never acks holds no more than the mirrors' budget on the server: each
/// pending proof's names count against it, and past it the oldest pending proofs go (their
/// acks are then refused). Before, 65,536 pending proofs per session were kept outside
/// the budget, whatever the session's cache capacity.
#[test]
fn pending_proofs_count_against_the_mirror_budget() {
    let server = server_with(ServerOptions {
        max_mirrored_names: 20,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "pending budget");
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([7; 32]))).unwrap();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 8, 8);
    let s = server
        .open_session(&c, CachePolicy::Lru { capacity: 1 }, &[])
        .unwrap();
    let ids: Vec<u64> = (0..100)
        .map(|_| server.prove(&c, &names[0], Some(s)).unwrap().proof_id)
        .collect();
    assert!(server.mirrored_names() <= 20, "{}", server.mirrored_names());
    // The oldest went; the newest is still acked.
    assert!(server.ack(s, ids[0]).is_err());
    server.ack(s, ids[99]).unwrap();
    // A session that caches nothing keeps nothing for its acks.
    let off = server.open_session(&c, CachePolicy::Off, &[]).unwrap();
    server.close_session(s);
    for _ in 0..10 {
        server.prove(&c, &names[0], Some(off)).unwrap();
    }
    assert_eq!(server.mirrored_names(), 0);
}

/// Unsigned records anyone may write fill `max_unproven`; a writer's chain signed at its
/// newest record is still taken (the signature proves the whole chain), while one more
/// unsigned record is refused. Before, each signature counted for one record, so a
/// grouped commit of two or more records failed for good.
#[test]
fn a_signed_chain_is_taken_when_unsigned_records_fill_the_limit() {
    let srv = server_with(ServerOptions {
        max_unproven: 10,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "unproven");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    srv.create(&meta).unwrap();
    let junk: Vec<Record> = (0..10u32)
        .map(|i| Record::new(c, i.to_le_bytes().to_vec(), vec![]))
        .collect();
    srv.write(&c, &junk, &[]).unwrap();
    let one_more = Record::new(c, b"one more".to_vec(), vec![]);
    let e = srv.write(&c, &[one_more], &[]).unwrap_err();
    assert!(e.to_string().contains("no signature covers"), "{e}");
    let mut w = Writer::new(meta, wk, None).unwrap();
    let chain: Vec<Record> = (0..3)
        .map(|i| w.record(format!("r{i}").as_bytes(), &[]).unwrap())
        .collect();
    let newest = chain[2].name();
    srv.write(&c, &chain, &[(newest, w.sign(&newest))]).unwrap();
    for r in &chain {
        assert!(srv.prove(&c, &r.name(), None).is_ok());
    }
}

/// Unsigned records are also bounded by the memory they hold (`max_unproven_bytes`):
/// records of 1024 made-up backpointers, or an unsigned commit of many subrecords, are
/// refused once the budget is spent, with nothing stored, while a writer's signed chain is
/// still taken; once the writer signs past what it had left unsigned, the budget frees.
#[test]
fn unsigned_records_are_bounded_by_the_memory_they_hold() {
    let srv = server_with(ServerOptions {
        max_unproven_bytes: 1 << 20,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "budget");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    srv.create(&meta).unwrap();
    // A writer's own unsigned records hold some of it until the writer signs past them.
    let mut w = Writer::new(meta.clone(), wk.clone(), None).unwrap();
    let mine: Vec<Record> = (0..3)
        .map(|i| w.record(format!("m{i}").as_bytes(), &[]).unwrap())
        .collect();
    srv.write(&c, &mine, &[]).unwrap();
    assert!(srv.with_dag(&c, |d| d.unproven_bytes()).unwrap() > 0);
    let last = mine[2].name();
    srv.sign(&c, &last, w.sign(&last)).unwrap();
    assert_eq!(srv.with_dag(&c, |d| d.unproven_bytes()).unwrap(), 0);
    // One more left unsigned, whose signature someone else gets hold of (from another
    // replica, say) to carry past the budget.
    let pending = w.record(b"pending", &[]).unwrap();
    let pending_name = pending.name();
    let pending_sig = w.sign(&pending_name);
    srv.write(&c, &[pending], &[]).unwrap();
    // A signed record whose parent is missing (a hole, as anti-entropy or a lost write
    // leaves): the parent will be proven as it arrives.
    // (Another chain of the writer's, so it proves nothing of the first.)
    let mut w2 = Writer::new(meta.clone(), wk.clone(), None).unwrap();
    let hole = w2.record(b"hole", &[]).unwrap();
    let above = w2.record(b"above", &[]).unwrap();
    let above_name = above.name();
    srv.write(&c, &[above], &[(above_name, w2.sign(&above_name))])
        .unwrap();
    let fat = |i: u32| {
        let back: Vec<RecordName> = (0..1024u32)
            .map(|j| {
                RecordName(HashAlgo::Blake3.digest(&[i.to_le_bytes(), j.to_le_bytes()].concat()))
            })
            .collect();
        Record::new(c, i.to_le_bytes().to_vec(), back)
    };
    // Each holds about 104 KiB by the count (1024 names twice, and the header).
    let mut taken = 0;
    let e = loop {
        match srv.write(&c, &[fat(taken)], &[]) {
            Ok(_) => taken += 1,
            Err(e) => break e,
        }
        assert!(taken < 100, "the budget never ran out");
    };
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(e.to_string().contains("sign one first"), "{e}");
    assert!((2..=10).contains(&taken), "{taken}");
    assert!(srv.with_dag(&c, |d| d.unproven_bytes()).unwrap() <= 1 << 20);
    assert!(srv.read(&c, &fat(taken).name()).is_err(), "nothing stored");
    // Spent to the last bytes with small unsigned records: the hole's record still goes
    // in, proven on arrival, so it costs the budget nothing.
    for i in 0.. {
        let junk = Record::new(c, format!("junk {i}").into_bytes(), vec![]);
        if srv.write(&c, &[junk], &[]).is_err() {
            break;
        }
        assert!(i < 10_000);
    }
    srv.write(&c, std::slice::from_ref(&hole), &[]).unwrap();
    assert!(srv.prove(&c, &hole.name(), None).is_ok());
    // A signature on a present unsigned record frees what that record holds, not the
    // whole budget: it does not carry a large unsigned record in with it.
    let e = srv
        .write(&c, &[fat(500)], &[(pending_name, pending_sig)])
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(srv.read(&c, &fat(500).name()).is_err(), "nothing stored");
    // Alone, that signature is taken, and frees its record.
    let held = srv.with_dag(&c, |d| d.unproven_bytes()).unwrap();
    srv.sign(&c, &pending_name, pending_sig).unwrap();
    assert!(srv.with_dag(&c, |d| d.unproven_bytes()).unwrap() < held);
    // An unsigned commit of many subrecords is refused too.
    let mut w = Writer::new(meta.clone(), wk.clone(), None).unwrap();
    for i in 0..20_000u32 {
        w.write_subrecord(&i.to_le_bytes()).unwrap();
    }
    let (h, subs, sig) = w.commit_subrecords(&[]).unwrap();
    let e = srv.commit_subrecords(&c, &h, &subs, None).unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    // Signed, it is taken; a writer's signed chain is too.
    srv.commit_subrecords(&c, &h, &subs, Some(sig)).unwrap();
    let mut w = Writer::new(meta.clone(), wk.clone(), None).unwrap();
    let chain: Vec<Record> = (0..3)
        .map(|i| w.record(format!("r{i}").as_bytes(), &[]).unwrap())
        .collect();
    let newest = chain[2].name();
    srv.write(&c, &chain, &[(newest, w.sign(&newest))]).unwrap();
}

/// Creations of one capsule racing each other and writes to it (a creation commits
/// without the server's map lock): one commits the capsule's ref, the others find it, and
/// a write made after any of them returned is never set back by another, here or in a
/// fresh server over the same store.
#[test]
fn racing_creations_keep_writes() {
    // A log store: its commits sync, which leaves the creations time to race.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).unwrap());
    let key = SigningKey::from_seed(&[9; 32]);
    let server = Arc::new(CapsuleServer::new(
        store.clone(),
        key.clone(),
        ServerOptions::default(),
    ));
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut written = Vec::new();
    for trial in 0..30 {
        let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), format!("r{trial}"));
        meta.cipher = BodyCipher::Plaintext;
        let c = meta.name();
        let handles: Vec<_> = (0..4u8)
            .map(|t| {
                let (server, meta) = (server.clone(), meta.clone());
                std::thread::spawn(move || {
                    let ack = server.create(&meta).unwrap();
                    ack.verify(&server.public_key(), &c, &AckKind::Created)
                        .unwrap();
                    let r = Record::new(c, vec![t, trial as u8], vec![]);
                    server.write(&c, std::slice::from_ref(&r), &[]).unwrap();
                    r.name()
                })
            })
            .collect();
        for h in handles {
            written.push((c, h.join().unwrap()));
        }
    }
    let fresh = CapsuleServer::new(store, key, ServerOptions::default());
    for srv in [&*server, &fresh] {
        for (c, name) in &written {
            srv.read(c, name).unwrap();
        }
    }
}

/// The unproven-memory budget also holds across capsules (`max_unproven_bytes_total`):
/// junk written into many capsules, each under its own limit, is refused past the total,
/// in every capsule, while signed writes still go in; a signature frees its share for the
/// others. Unloading a capsule does not free its share (or anyone could fill capsules,
/// have them unloaded, fill more and have them all loaded again), and loading it again
/// does not count it twice.
#[test]
fn unsigned_records_are_bounded_across_capsules_and_unloads() {
    let srv = server_with(ServerOptions {
        max_unproven_bytes: 1 << 20,
        max_unproven_bytes_total: 64 << 10,
        max_loaded_capsules: 1,
        ..ServerOptions::default()
    });
    let wk = SigningKey::from_seed(&[1; 32]);
    let capsule = |label: &str| {
        let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), label);
        meta.cipher = BodyCipher::Plaintext;
        srv.create(&meta).unwrap();
        meta
    };
    let (ma, mb, mc) = (capsule("a"), capsule("b"), capsule("c"));
    let (a, b, c) = (ma.name(), mb.name(), mc.name());
    let junk = |c: CapsuleName, i: u32| Record::new(c, format!("junk {i}").into_bytes(), vec![]);
    // The writer's own unsigned records in `a`, then anyone's junk in `b`, until the
    // total runs out (each capsule far under its own limit).
    let mut wa = Writer::new(ma.clone(), wk.clone(), None).unwrap();
    let mine: Vec<Record> = (0..20)
        .map(|i| wa.record(format!("m{i}").as_bytes(), &[]).unwrap())
        .collect();
    srv.write(&a, &mine, &[]).unwrap();
    let mut taken = 0;
    let e = loop {
        match srv.write(&b, &[junk(b, taken)], &[]) {
            Ok(_) => taken += 1,
            Err(e) => break e,
        }
        assert!(taken < 10_000, "the total never ran out");
    };
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(
        e.to_string().contains("across this server's capsules"),
        "{e}"
    );
    assert!(taken > 50, "{taken}");
    let held = srv.unproven_bytes_held();
    assert!(held <= 64 << 10 && held > 60 << 10, "{held}");
    // Nothing stored of the refused one, and no unsigned record goes into `c` either.
    assert!(srv.read(&b, &junk(b, taken).name()).is_err());
    assert!(srv.write(&c, &[junk(c, 0)], &[]).is_err());
    // A writer's signed chain still goes in.
    let mut wc = Writer::new(mc.clone(), wk.clone(), None).unwrap();
    let chain: Vec<Record> = (0..3)
        .map(|i| wc.record(format!("c{i}").as_bytes(), &[]).unwrap())
        .collect();
    let newest = chain[2].name();
    srv.write(&c, &chain, &[(newest, wc.sign(&newest))])
        .unwrap();
    // Capsules were loaded and unloaded all along (one stays loaded): the total did not
    // move, and touching `b` again (loaded anew, its junk replayed) counts it once.
    assert_eq!(srv.loaded_capsules(), 1);
    assert_eq!(srv.unproven_bytes_held(), held);
    assert_eq!(srv.with_dag(&b, |d| d.len()).unwrap(), taken as usize);
    assert_eq!(srv.unproven_bytes_held(), held);
    assert!(srv.write(&c, &[junk(c, 1)], &[]).is_err());
    // The writer of `a` signs past its records: their share is free for the others.
    let last = mine[19].name();
    srv.sign(&a, &last, wa.sign(&last)).unwrap();
    assert!(srv.unproven_bytes_held() < held);
    srv.write(&c, &[junk(c, 1)], &[]).unwrap();
}

/// A subrecord someone first put into an unsigned record (anyone may write one, and a
/// plaintext subrecord's name is predictable) still has a proof once the writer's signed
/// record holds it: proofs go through a proven record. Before, the subrecord was indexed
/// under the first record only, and had no proof for good.
#[test]
fn a_subrecord_copied_into_an_unsigned_record_first_is_proven_through_the_signed_one() {
    let srv = server_with(ServerOptions::default());
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "subrecords");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    srv.create(&meta).unwrap();
    // The copy: the same subrecord in a record committed without a signature (built
    // here with a writer's encoder; anyone can build the same header and body).
    let mut w = Writer::new(meta.clone(), wk.clone(), None).unwrap();
    for _ in 0..3 {
        w.write_subrecord(b"dup").unwrap();
        let (h1, s1, _) = w.commit_subrecords(&[]).unwrap();
        srv.commit_subrecords(&c, &h1, &s1, None).unwrap();
    }
    // The writer's own record, signed, holding it too.
    let mut w2 = Writer::new(meta.clone(), wk, None).unwrap();
    w2.write_subrecord(b"dup").unwrap();
    w2.write_subrecord(b"other").unwrap();
    let (h2, s2, sig2) = w2.commit_subrecords(&[]).unwrap();
    srv.commit_subrecords(&c, &h2, &s2, Some(sig2)).unwrap();
    let subs = srv.subrecords(&c, &h2.name()).unwrap();
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    // Twice: the first proof finds the signed holder, the second starts from it.
    for s in subs.iter().chain(&subs) {
        let p = srv.prove_subrecord(&c, s, None).unwrap().proof;
        reader.verify_subrecord(s, &p).unwrap();
    }
    let p = srv.prove_subrecords(&c, &subs, None).unwrap().proof;
    reader.verify_subrecords(&subs, &p).unwrap();
}

/// A header built in memory is well formed exactly when its encoding decodes: what the
/// server checks before it stores one (so a reload never meets a header it refuses).
#[test]
fn a_header_is_well_formed_exactly_when_its_encoding_decodes() {
    use cairn_capsule::record::{BodyRef, MAX_BACKPOINTERS, MAX_BODY_LEN, RecordHeader};
    let c = CapsuleName(HashAlgo::Blake3.digest(b"c"));
    let name = |i: u32| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes()));
    let plain = |len| BodyRef::Plain {
        hash: HashAlgo::Blake3.digest(b"body"),
        len,
    };
    let header = |body, backpointers| RecordHeader {
        capsule: c,
        body,
        backpointers,
    };
    let cases = [
        (header(plain(3), vec![name(1), name(2)]), true),
        (
            header(plain(3), (0..MAX_BACKPOINTERS as u32).map(name).collect()),
            true,
        ),
        (
            header(plain(3), (0..=MAX_BACKPOINTERS as u32).map(name).collect()),
            false,
        ),
        (header(plain(3), vec![name(1), name(1)]), false),
        (header(plain(MAX_BODY_LEN as u64 + 1), vec![]), false),
        (
            header(
                BodyRef::Subrecords {
                    root: HashAlgo::Blake3.digest(b"root"),
                    count: 0,
                },
                vec![],
            ),
            false,
        ),
        (
            header(
                BodyRef::Plain {
                    hash: HashAlgo::Sha256.digest(b"body"),
                    len: 3,
                },
                vec![],
            ),
            false,
        ),
        (
            header(plain(3), vec![RecordName(HashAlgo::Sha256.digest(b"x"))]),
            false,
        ),
    ];
    for (i, (h, ok)) in cases.iter().enumerate() {
        assert_eq!(h.check_well_formed().is_ok(), *ok, "case {i}");
        assert_eq!(RecordHeader::decode(&h.encode()).is_ok(), *ok, "case {i}");
    }
}

/// A capsule server over a new in-memory store, with `opts`.
fn server_with(opts: ServerOptions) -> CapsuleServer {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    CapsuleServer::new(store, SigningKey::from_seed(&[9; 32]), opts)
}

/// A record of subrecords has no body to open: reading it as a record is refused with a
/// type mismatch in a plaintext capsule too (its empty body used to open as an empty
/// value there, and fail as too short in a sealed one).
#[test]
fn a_record_of_subrecords_is_not_opened_as_a_body() {
    let (server, _, _, _) = setup();
    let wk = SigningKey::from_seed(&[5; 32]);
    let meta = CapsuleMetadata {
        cipher: cairn_capsule::metadata::BodyCipher::Plaintext,
        ..CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "plain")
    };
    let c = meta.name();
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta.clone(), wk, None).unwrap();
    w.write_subrecord(b"one").unwrap();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    let name = header.name();
    let policy = CachePolicy::Lru { capacity: 100 };
    let mut reader = Reader::new(c, meta, policy, None).unwrap();
    let rec = server.read(&c, &name).unwrap();
    assert!(matches!(
        reader.open_record(&name, &rec),
        Err(Error::TypeMismatch(_))
    ));
    let proof = server.prove(&c, &name, None).unwrap().proof;
    assert!(matches!(
        reader.verify_read(&name, rec.body.clone(), &proof),
        Err(Error::TypeMismatch(_))
    ));
    // The proof itself is fine: the record is proven, its subrecords read one by one.
    reader.verify_record(&name, &proof).unwrap();
}

/// Random DAGs of plain records, inserted in a random order (children before parents
/// make holes that later fill) with signatures on random records at random times:
/// after every step, the proven heads the DAG keeps are exactly the proven records no
/// proven record points to (the definition, computed over the whole DAG), and each
/// record's (or hole's) proven children exactly its children that are proven.
#[test]
fn proven_heads_match_their_definition_on_random_dags() {
    let wk = SigningKey::from_seed(&[1; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "heads");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    let w = Writer::new(meta.clone(), wk, None).unwrap();
    let body = |r: &Record| match r.header.body {
        cairn_capsule::record::BodyRef::Plain { hash, .. } => {
            cairn_capsule::dag::StoredBody::Plain { cid: hash }
        }
        _ => unreachable!("plain records"),
    };
    let shape = (
        proptest::collection::vec(proptest::collection::vec(any::<u16>(), 0..3), 1..40),
        any::<u64>(),
        proptest::collection::vec(any::<u16>(), 0..12),
    );
    proptest!(ProptestConfig::with_cases(200), |((parents, order_seed, signed) in shape)| {
        // Record i points back at up to two earlier records.
        let mut recs: Vec<Record> = Vec::new();
        for (i, ps) in parents.iter().enumerate() {
            let mut back: Vec<RecordName> = Vec::new();
            if i > 0 {
                for p in ps {
                    let n = recs[*p as usize % i].name();
                    if !back.contains(&n) {
                        back.push(n);
                    }
                }
            }
            recs.push(Record::new(c, format!("r{i}").into_bytes(), back));
        }
        // A shuffled insertion order, with each signature placed at a random step.
        let mut order: Vec<usize> = (0..recs.len()).collect();
        let mut x = order_seed | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut dag = CapsuleDag::new(meta.clone());
        let mut inserted = Vec::new();
        for (step, &i) in order.iter().enumerate() {
            let r = &recs[i];
            dag.insert(r.name(), &r.header, body(r));
            inserted.push(r.name());
            for s in &signed {
                if *s as usize % order.len() == step {
                    let n = inserted[*s as usize % inserted.len()];
                    let _ = dag.add_signature(n, w.sign(&n));
                }
            }
            let by_definition: Vec<RecordName> = inserted
                .iter()
                .copied()
                .filter(|n| dag.is_proven(n))
                .filter(|n| !dag.children(n).iter().any(|k| dag.is_proven(k)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            prop_assert_eq!(dag.proven_heads(), by_definition);
            // The proven children kept (what proof searches walk) are exactly the proven
            // ones among the children, of present records and of holes alike.
            for n in inserted.iter().chain(dag.missing().iter()) {
                let kept: BTreeSet<RecordName> =
                    dag.proven_children(n).iter().copied().collect();
                let by_definition: BTreeSet<RecordName> = dag
                    .children(n)
                    .iter()
                    .copied()
                    .filter(|k| dag.is_proven(k))
                    .collect();
                prop_assert_eq!(dag.proven_children(n).len(), kept.len());
                prop_assert_eq!(kept, by_definition);
            }
            // The memory budget of unproven records adds up what they hold.
            let held: u64 = inserted
                .iter()
                .filter(|n| !dag.is_proven(n))
                .map(|n| {
                    let x = dag.node(n).unwrap();
                    x.unproven_cost()
                })
                .sum();
            prop_assert_eq!(dag.unproven_bytes(), held);
        }
    });
}

/// Anyone may write unsigned records, but one pointing at the newest signed record does
/// not hide it from a checkpoint: QueryFresh lists the proven heads, each of which a
/// reader can prove. Once the writer signs past it, the checkpoint moves on.
#[test]
fn an_unsigned_record_cannot_hide_the_signed_head_from_a_checkpoint() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 3, 3);
    let head = names[2];
    let stranger = intruder(&meta);
    let junk = Record::new(c, b"junk".to_vec(), vec![head]);
    server.write(&c, std::slice::from_ref(&junk), &[]).unwrap();
    assert_eq!(
        server.with_dag(&c, |d| d.heads()).unwrap(),
        vec![junk.name()]
    );
    let cp = server.query_fresh(&c, [9; 16]).unwrap();
    cp.verify(&server.public_key(), &c, &[9; 16]).unwrap();
    assert_eq!(cp.heads, vec![head]);
    let mut reader = Reader::new(c, meta.clone(), CachePolicy::Off, None).unwrap();
    for h in &cp.heads {
        let p = server.prove(&c, h, None).unwrap().proof;
        reader.verify_record(h, &p).unwrap();
    }
    // A stranger's signature proves nothing; the writer's next signed record moves it.
    let r = Record::new(c, b"x".to_vec(), vec![junk.name()]);
    assert!(
        server
            .write(
                &c,
                std::slice::from_ref(&r),
                &[(r.name(), stranger.sign(&r.name()))]
            )
            .is_err()
    );
    assert_eq!(server.query_fresh(&c, [9; 16]).unwrap().heads, vec![head]);
    let next = write_chain(&server, &mut w, 1, 1)[0];
    assert_eq!(server.query_fresh(&c, [9; 16]).unwrap().heads, vec![next]);
}

/// A session whose reader caches nothing gets proofs that need no ack (id 0), and the
/// server holds nothing for them: an entry per unacked proof, counted as no name, let such
/// sessions hold megabytes each outside the mirror budget. An ack of id 0 is taken.
#[test]
fn proofs_for_a_reader_that_caches_nothing_hold_nothing() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 20, 10);
    let sid = server.open_session(&c, CachePolicy::Off, &[]).unwrap();
    for n in &names {
        let issued = server.prove(&c, n, Some(sid)).unwrap();
        assert_eq!(issued.proof_id, 0);
    }
    server.ack(sid, 0).unwrap();
    assert_eq!(server.mirrored_names(), 0);
    // A caching session still gets ids to ack, and an unknown one is refused.
    let policy = CachePolicy::Lru { capacity: 100 };
    let sid = server.open_session(&c, policy, &[]).unwrap();
    let issued = server.prove(&c, &names[0], Some(sid)).unwrap();
    assert_ne!(issued.proof_id, 0);
    assert!(server.ack(sid, issued.proof_id + 1).is_err());
    server.ack(sid, issued.proof_id).unwrap();
}

/// One record's subrecords take at most `MAX_BODY_LEN` bytes together (with 5 bytes of
/// framing each), as a plain body does: a larger record could never travel in an
/// anti-entropy message, and every record after it in a session's order stayed behind.
/// The writer refuses the subrecord that would pass it (commit first), and the server a
/// record past it, storing nothing.
#[test]
fn a_records_subrecords_fit_one_sync_message() {
    let (server, mut w, meta, _) = setup();
    let c = meta.name();
    let half = vec![7u8; MAX_BODY_LEN / 2];
    w.write_subrecord(&half).unwrap();
    let e = w.write_subrecord(&half).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert!(e.to_string().contains("commit"), "{e}");
    // The one written is committed alone.
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    assert_eq!(sealed.len(), 1);
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();

    // A record built past the limit by hand is refused.
    let big: SealedSubrecords = [vec![1u8; MAX_BODY_LEN / 2], vec![2u8; MAX_BODY_LEN / 2]]
        .into_iter()
        .collect();
    let (root, _) = cairn_capsule::proof::subrecord_root(HashAlgo::Blake3, &big);
    let header = RecordHeader {
        capsule: c,
        body: BodyRef::Subrecords { root, count: 2 },
        backpointers: vec![header.name()],
    };
    let name = header.name();
    let e = server
        .commit_subrecords(&c, &header, &big, Some(w.sign(&name)))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert!(server.read(&c, &name).is_err(), "nothing stored");
}

/// Metadata is bounded: anyone who may create a capsule chooses it, and every loaded
/// capsule holds it in memory (a 60 MiB description was taken over the wire).
#[test]
fn capsule_metadata_is_bounded() {
    let (server, _, _, _) = setup();
    let key = SigningKey::from_seed(&[77; 32]);
    let big = CapsuleMetadata::new(
        HashAlgo::Blake3,
        key.public(),
        "x".repeat(metadata::MAX_METADATA_BYTES),
    );
    assert!(big.encode().len() > metadata::MAX_METADATA_BYTES);
    // (Decoding alone takes it: a capsule made before the bound stays readable.)
    assert_eq!(CapsuleMetadata::decode(&big.encode()).unwrap(), big);
    assert!(matches!(server.create(&big), Err(Error::InvalidInput(_))));
    assert!(server.metadata(&big.name()).is_err());
    // Over the wire: refused as the request is decoded, nothing created.
    assert!(Request::from_bytes(&Request::Create { meta: big.clone() }.to_bytes()).is_err());
    let service = CapsuleService::new(Arc::new(server));
    let req = Request::Create { meta: big.clone() };
    let answer = service.handle_bytes(&req.to_bytes());
    assert!(matches!(
        Response::from_bytes(&answer),
        Ok(Response::Error(_))
    ));
    // Below the bound, as before.
    let fits = CapsuleMetadata::new(HashAlgo::Blake3, key.public(), "x".repeat(60_000));
    assert_eq!(CapsuleMetadata::decode(&fits.encode()).unwrap(), fits);
}

/// A record whose header chunk is lost (bit rot, or a record the store's recovery skipped)
/// costs that record, not the capsule: after a reload every other record is read and
/// proven, the capsule takes writes, the damaged one is a hole at its old place in the
/// log, and a copy from a peer fills it there (so a replay gives the same log).
#[test]
fn a_lost_record_header_costs_that_record_not_the_capsule() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let on = |s: &Arc<dyn Store>| {
        CapsuleServer::new(
            s.clone(),
            SigningKey::from_seed(&[9; 32]),
            ServerOptions::default(),
        )
    };
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "t");
    let c = meta.name();
    let mut w = Writer::new(meta.clone(), wk.clone(), Some(BodyKey([7; 32]))).unwrap();
    let mut records = Vec::new();
    let (log_before, root_before) = {
        let s = on(&store);
        s.create(&meta).unwrap();
        for i in 0..10 {
            let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
            let n = r.name();
            s.write(&c, std::slice::from_ref(&r), &[(n, w.sign(&n))])
                .unwrap();
            records.push(r);
        }
        s.with_dag(&c, |d| (d.log().size(), d.log().root()))
            .unwrap()
    };
    let names: Vec<RecordName> = records.iter().map(Record::name).collect();
    store.remove(&[*names[3].hash()]).unwrap();
    let s = on(&store);
    for (i, n) in names.iter().enumerate() {
        if i == 3 {
            assert!(s.read(&c, n).is_err());
            assert!(s.prove(&c, n, None).is_err());
        } else {
            assert_eq!(s.read(&c, n).unwrap().name(), *n, "record {i}");
            s.prove(&c, n, None).unwrap();
        }
    }
    s.with_dag(&c, |d| {
        assert_eq!(d.damaged().copied().collect::<Vec<_>>(), vec![names[3]]);
        // Every record keeps its place in the log.
        assert_eq!((d.log().size(), d.log().root()), (log_before, root_before));
        assert!(d.missing().contains(&names[3]));
    })
    .unwrap();
    // An audit names the damage.
    assert!(s.audit(&c).is_err());
    // The capsule takes writes.
    let r = w.record(b"after", &[]).unwrap();
    let n = r.name();
    s.write(&c, std::slice::from_ref(&r), &[(n, w.sign(&n))])
        .unwrap();
    // A copy from a peer fills the hole at its old place.
    let copy = SyncRecord {
        header: records[3].header.clone(),
        body: SyncBody::Plain(records[3].body.clone()),
        signature: Some(w.sign(&names[3])),
    };
    s.apply_sync(&c, &[copy]).unwrap();
    let live = s
        .with_dag(&c, |d| {
            assert!(!d.has_damage() && d.contains(&names[3]));
            (d.log().size(), d.log().root(), d.order().to_vec())
        })
        .unwrap();
    assert_eq!(live.0, log_before + 1);
    s.read(&c, &names[3]).unwrap();
    drop(s);
    // A replay reads the header back at its first place and builds the same log.
    let s = on(&store);
    let replayed = s
        .with_dag(&c, |d| (d.log().size(), d.log().root(), d.order().to_vec()))
        .unwrap();
    assert_eq!(replayed, live);
    s.audit(&c).unwrap();
}

/// A reader that never commits its staged names (no session, no acks to send) holds no
/// more of them than decide its cache's final state, and none with the cache off; a commit
/// after the trim leaves the cache as inserting every name would.
#[test]
fn a_reader_without_acks_stages_a_bounded_number_of_names() {
    let (server, mut w, meta, bk) = setup();
    let c = meta.name();
    let names = write_chain(&server, &mut w, 50, 1);
    let mut off = Reader::new(c, meta.clone(), CachePolicy::Off, Some(bk.clone())).unwrap();
    let mut small = Reader::new(
        c,
        meta.clone(),
        CachePolicy::Lru { capacity: 8 },
        Some(bk.clone()),
    )
    .unwrap();
    let mut whole = Reader::new(c, meta, CachePolicy::Lru { capacity: 8 }, Some(bk)).unwrap();
    let mut every = Vec::new();
    for _ in 0..40 {
        for n in &names {
            let p = server.prove(&c, n, None).unwrap().proof;
            off.verify_record(n, &p).unwrap();
            let got = small.verify_record(n, &p).unwrap();
            every.extend(got.iter().map(|r| *r.hash()));
        }
    }
    assert_eq!(off.staged(), 0);
    assert!(small.staged() <= 2 * 8 + 1024, "{} staged", small.staged());
    // Fewer distinct names than the capacity, verified again and again: bounded too.
    let mut hot = Reader::new(
        c,
        small.meta().clone(),
        CachePolicy::Lru { capacity: 64 },
        None,
    )
    .unwrap();
    let p = server.prove(&c, &names[3], None).unwrap().proof;
    for _ in 0..5000 {
        hot.verify_record(&names[3], &p).unwrap();
    }
    assert!(hot.staged() <= 2 * 64 + 1024, "{} staged", hot.staged());
    small.commit_staged();
    whole.discard_staged();
    // The same final cache as inserting every verified name in order.
    let mut reference = VerificationCache::new(CachePolicy::Lru { capacity: 8 }).unwrap();
    reference.insert_all(&every);
    assert_eq!(small.cache().names(), reference.names());
}

/// The writer's chain does not move on past a record every server refuses (a repeated
/// head, too many backpointers): `record` fails and the next record points where the
/// refused one would have.
#[test]
fn a_writer_does_not_chain_past_a_record_no_server_takes() {
    let (server, mut w, _meta, _bk) = setup();
    let names = write_chain(&server, &mut w, 2, 1);
    // A head given twice is taken once.
    w.continue_from(&[names[1], names[1]]);
    let r = w.record(b"merge", &[]).unwrap();
    assert_eq!(r.header.backpointers, vec![names[1]]);
    r.header.check_well_formed().unwrap();
    let extra: Vec<RecordName> = (0..1025u32)
        .map(|i| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes())))
        .collect();
    assert!(w.record(b"fat", &extra).is_err());
    let after = w.record(b"after", &[]).unwrap();
    assert_eq!(after.header.backpointers, vec![r.name()]);
}
