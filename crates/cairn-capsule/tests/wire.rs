//! The capsule wire protocol end to end over loopback TCP: a writer and a reader talk to a
//! served `CapsuleServer` through `RemoteCapsule`, pipelined and not; errors arrive as the
//! same `Error` variants; anti-entropy runs between a local and a remote replica.

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_capsule::cache::MirrorMode;
use cairn_capsule::merkle::{verify_consistency, verify_inclusion};
use cairn_capsule::*;
use cairn_core::{Error, HashAlgo, SigningKey};
use cairn_store::{MemoryStore, Store};

fn server(seed: u8) -> Arc<CapsuleServer> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    Arc::new(CapsuleServer::new(
        store,
        SigningKey::from_seed(&[seed; 32]),
        ServerOptions::default(),
    ))
}

/// A sync request of session `session` from `k` (an initiator key, made up or not) to
/// `responder`, signed as `k`'s `seq`-th message of the session under the responder's
/// `nonce` (0 for the Hello).
fn signed_sync(
    k: &SigningKey,
    responder: &cairn_core::PublicKey,
    capsule: CapsuleName,
    (session, nonce): (u64, u64),
    seq: u64,
    msg: SyncMsg,
) -> Request {
    let m = cairn_capsule::sync::sync_msg_message(
        &capsule,
        &k.public(),
        responder,
        session,
        nonce,
        false,
        seq,
        Some(&msg),
    );
    Request::Sync {
        capsule,
        peer: k.public(),
        session,
        sig: k.sign(server::DOMAIN_SYNC_MSG, &m),
        msg,
    }
}

fn writer() -> (Writer, CapsuleMetadata, BodyKey) {
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "wire");
    let bk = BodyKey([7; 32]);
    (
        Writer::new(meta.clone(), wk, Some(bk.clone())).unwrap(),
        meta,
        bk,
    )
}

#[test]
fn write_read_prove_over_tcp() {
    let srv = server(9);
    let h = serve_tcp(srv.clone(), "127.0.0.1:0").unwrap();
    let mut rc = RemoteCapsule::connect(h.local_addr()).unwrap();
    let (mut w, meta, bk) = writer();
    let c = meta.name();
    let skey = rc.server_key().unwrap();
    assert_eq!(skey, srv.public_key());
    rc.create(&meta)
        .unwrap()
        .verify(&skey, &c, &AckKind::Created)
        .unwrap();
    assert_eq!(rc.list_capsules().unwrap(), vec![c]);
    // 40 records, pipelined, every 8th signed.
    let mut names = Vec::new();
    for i in 0..40 {
        let r = w.record(format!("record {i}").as_bytes(), &[]).unwrap();
        let n = r.name();
        let sigs = if i % 8 == 7 {
            vec![(n, w.sign(&n))]
        } else {
            vec![]
        };
        rc.send(&Request::Write {
            capsule: c,
            records: vec![r],
            signatures: sigs,
        })
        .unwrap();
        names.push(n);
    }
    assert_eq!(rc.in_flight(), 40);
    // A typed call now would read the oldest pipelined answer as its own: refused, and the
    // connection stays in step.
    assert!(matches!(rc.list_capsules(), Err(Error::InvalidInput(_))));
    assert_eq!(rc.in_flight(), 40);
    for (i, n) in names.iter().enumerate() {
        let Response::Ack(a) = rc.recv().unwrap() else {
            panic!("not an ack")
        };
        let signed = if i % 8 == 7 { vec![*n] } else { vec![] };
        a.verify(&skey, &c, &AckKind::wrote(vec![*n], signed))
            .unwrap();
    }
    // Read and verify through a reader session, acking each proof.
    let meta2 = rc.metadata(&c).unwrap();
    let mut reader = Reader::new(
        c,
        meta2,
        CachePolicy::Lru { capacity: 64 },
        Some(bk.clone()),
    )
    .unwrap();
    let session = rc
        .open_session(&c, reader.cache().policy(), &reader.cache().names())
        .unwrap();
    let mut total = 0;
    for (i, n) in names.iter().enumerate() {
        let rec = rc.read(&c, n).unwrap();
        assert_eq!(
            reader.open_record(n, &rec).unwrap(),
            format!("record {i}").as_bytes()
        );
        let issued = rc.prove(&c, n, Some(session)).unwrap();
        total += issued.proof.chain.len();
        reader.verify_record(n, &issued.proof).unwrap();
        rc.ack_proof(session, issued.proof_id).unwrap();
        reader.commit_staged();
    }
    assert!(
        total < 40 * 4,
        "the mirrored cache shortens proofs ({total})"
    );
    // Read-and-prove in a session whose mirror moves on issue: one request per verified
    // get, pipelined, each proof stopping at the one before it; no acks.
    let mut fresh = Reader::new(
        c,
        rc.metadata(&c).unwrap(),
        CachePolicy::Lru { capacity: 64 },
        Some(bk.clone()),
    )
    .unwrap();
    fresh.set_mirror_mode(MirrorMode::OnIssue);
    let optimistic = rc
        .open_session_with(&c, fresh.cache().policy(), MirrorMode::OnIssue, &[])
        .unwrap();
    for n in names.iter().rev() {
        rc.send(&Request::ReadProve {
            capsule: c,
            name: *n,
            session: Some(optimistic),
        })
        .unwrap();
    }
    let mut headers = 0;
    for (i, n) in names.iter().enumerate().rev() {
        let Response::RecordAndProof {
            proof_id,
            body,
            proof,
        } = rc.recv().unwrap()
        else {
            panic!("not a record and proof")
        };
        assert_eq!(proof_id, 0);
        headers += proof.chain.len();
        let plain = fresh.verify_read(n, body, &proof).unwrap();
        assert_eq!(plain, format!("record {i}").as_bytes());
    }
    assert!(
        headers <= 2 * names.len(),
        "pipelined proofs chain ({headers})"
    );
    rc.close_session(optimistic).unwrap();
    // A replayed ack is refused with the server's error kind, and the connection survives.
    assert!(matches!(rc.ack_proof(session, 1), Err(Error::Rejected(_))));
    rc.close_session(session).unwrap();
    // Checkpoint and Merkle-log proofs.
    // Verified against the server's key and the query's own nonce.
    let cp = rc.query_fresh(&c, &skey).unwrap();
    let other = cairn_core::SigningKey::from_seed(&[99; 32]).public();
    assert!(matches!(
        rc.query_fresh(&c, &other),
        Err(Error::Rejected(_))
    ));
    assert_eq!(cp.size, 40);
    assert_eq!(cp.heads, vec![names[39]]);
    let (index, path) = rc.log_inclusion(&c, &names[5], cp.size).unwrap();
    assert_eq!(index, 5);
    let leaf = CapsuleDag::log_leaf(&names[5]);
    verify_inclusion(HashAlgo::Blake3, index, cp.size, &leaf, &path, &cp.root).unwrap();
    let old = srv.with_dag(&c, |d| d.log().root_at(17)).unwrap().unwrap();
    let p = rc.log_consistency(&c, 17, 40).unwrap();
    verify_consistency(HashAlgo::Blake3, 17, 40, &old, &cp.root, &p).unwrap();
    // Errors keep their kind.
    let missing = RecordName(HashAlgo::Blake3.digest(b"nope"));
    assert!(matches!(rc.read(&c, &missing), Err(Error::NotFound(_))));
    assert!(matches!(
        rc.subrecords(&c, &names[0]),
        Err(Error::TypeMismatch(_))
    ));
    let mut bad = w.record(b"x", &[]).unwrap();
    bad.body[0] ^= 1;
    assert!(matches!(rc.write(&c, &[bad], &[]), Err(Error::Rejected(_))));
    // Garbage bytes get a decode error response, not a dropped connection.
    assert!(matches!(rc.call_bytes(&[1, 200, 3]), Err(Error::Decode(_))));
    assert!(rc.query_fresh(&c, &skey).is_ok());
    h.shutdown();
}

#[test]
fn subrecords_over_tcp() {
    let srv = server(9);
    let h = serve_tcp(srv.clone(), "127.0.0.1:0").unwrap();
    let mut rc = RemoteCapsule::connect(h.local_addr()).unwrap();
    let (mut w, meta, bk) = writer();
    let c = meta.name();
    rc.create(&meta).unwrap();
    let mut subs = Vec::new();
    for i in 0..9 {
        subs.push(w.write_subrecord(format!("sub {i}").as_bytes()).unwrap());
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    let ack = rc
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    ack.verify(
        &rc.server_key().unwrap(),
        &c,
        &AckKind::wrote(vec![header.name()], vec![header.name()]),
    )
    .unwrap();
    assert_eq!(rc.subrecords(&c, &header.name()).unwrap(), subs);
    let mut reader = Reader::new(c, meta, CachePolicy::Off, Some(bk)).unwrap();
    for (i, s) in subs.iter().enumerate() {
        let data = rc.read_subrecord(&c, s).unwrap();
        assert_eq!(
            reader.open_subrecord(s, &data).unwrap(),
            format!("sub {i}").as_bytes()
        );
        let p = rc.prove_subrecord(&c, s, None).unwrap();
        assert_eq!(p.proof_id, 0);
        reader.verify_subrecord(s, &p.proof).unwrap();
    }
    // All of them in one multiproof, over the wire.
    let all = rc.prove_subrecords(&c, &subs, None).unwrap();
    assert_eq!(all.proof.groups.len(), 1);
    reader.verify_subrecords(&subs, &all.proof).unwrap();
    assert!(matches!(
        rc.prove_subrecords(&c, &[subs[0], subs[0]], None),
        Err(cairn_core::Error::InvalidInput(_))
    ));
    // All of them in one read, in the order asked; one unknown name fails the whole read.
    let mut order = subs.clone();
    order.reverse();
    let bodies = rc.read_subrecords(&c, &order).unwrap();
    for (s, b) in order.iter().zip(&bodies) {
        let i = subs.iter().position(|x| x == s).unwrap();
        assert_eq!(
            reader.open_subrecord(s, b).unwrap(),
            format!("sub {i}").as_bytes()
        );
    }
    let stray = cairn_core::Hash::new(cairn_core::HashAlgo::Blake3, [7; 32]);
    assert!(matches!(
        rc.read_subrecords(&c, &[subs[0], stray]),
        Err(cairn_core::Error::NotFound(_))
    ));
    assert!(rc.read_subrecords(&c, &[]).unwrap().is_empty());
    // A batch mixes successes and failures, in order.
    let out = rc
        .call_batch(&[
            Request::Subrecords {
                capsule: c,
                record: header.name(),
            },
            Request::Metadata {
                capsule: CapsuleName(HashAlgo::Blake3.digest(b"no such capsule")),
            },
            Request::QueryFresh {
                capsule: c,
                nonce: [5; 16],
            },
        ])
        .unwrap();
    assert!(matches!(&out[0], Ok(Response::SubrecordNames(n)) if *n == subs));
    assert!(matches!(&out[1], Err(Error::NotFound(_))));
    assert!(matches!(&out[2], Ok(Response::Checkpoint(_))));
}

/// A responder holding more records than its sessions may compare still syncs with a
/// replica it never synced with: each session compares the oldest records that fit, the
/// next goes on from there, and the replicas converge (the responder refused every such
/// session, for good, since its cursor never moved).
#[test]
fn a_responder_with_more_records_than_a_session_holds_still_converges() {
    let (local, remote) = (server(1), server(2));
    let h = cairn_capsule::wire::serve_service(
        Arc::new(CapsuleService::new(remote.clone()).with_max_sync_names(40)),
        "127.0.0.1:0",
        cairn_capsule::wire::server_config(),
    )
    .unwrap();
    let (mut w, meta, _) = writer();
    let c = meta.name();
    local.create(&meta).unwrap();
    remote.create(&meta).unwrap();
    for i in 0..150u32 {
        let r = w.record(&i.to_le_bytes(), &[]).unwrap();
        let n = r.name();
        let sigs = if i % 3 == 2 {
            vec![(n, w.sign(&n))]
        } else {
            vec![]
        };
        remote.write(&c, &[r], &sigs).unwrap();
    }
    let names = |s: &CapsuleServer| -> BTreeSet<RecordName> {
        s.with_dag(&c, |d| d.order().iter().copied().collect())
            .unwrap()
    };
    let mut rc = RemoteCapsule::connect(h.local_addr()).unwrap();
    let mut sessions = 0;
    while names(&local) != names(&remote) {
        sessions += 1;
        assert!(sessions <= 10, "not converged after 10 sessions");
        let report = rc.sync_with(&local, &c, &remote.public_key()).unwrap();
        assert_eq!(report.corrupt + report.unproven, 0, "{report:?}");
    }
    assert_eq!(names(&local).len(), 150);
}

#[test]
fn anti_entropy_over_tcp() {
    let local = server(1);
    let remote = server(2);
    let h = serve_tcp(remote.clone(), "127.0.0.1:0").unwrap();
    let (mut w, meta, _) = writer();
    let c = meta.name();
    local.create(&meta).unwrap();
    remote.create(&meta).unwrap();
    let mut all = BTreeSet::new();
    for i in 0..30 {
        let r = w.record(&[i as u8; 20], &[]).unwrap();
        let n = r.name();
        all.insert(n);
        let sigs = if i % 5 == 4 {
            vec![(n, w.sign(&n))]
        } else {
            vec![]
        };
        // Records 0..10 on both, 10..20 only local, 20..30 only remote.
        if i < 20 {
            local.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
        }
        if !(10..20).contains(&i) {
            remote.write(&c, &[r], &sigs).unwrap();
        }
    }
    let mut rc = RemoteCapsule::connect(h.local_addr()).unwrap();
    let report = rc.sync_with(&local, &c, &remote.public_key()).unwrap();
    assert!(!report.quick_match);
    assert_eq!(report.corrupt + report.unproven, 0);
    let names = |s: &CapsuleServer| -> BTreeSet<RecordName> {
        s.with_dag(&c, |d| d.order().iter().copied().collect())
            .unwrap()
    };
    assert_eq!(names(&local), all);
    assert_eq!(names(&remote), all);
    // The next session is a quick match, and the responder keeps no session after it.
    let again = rc.sync_with(&local, &c, &remote.public_key()).unwrap();
    assert!(again.quick_match, "{again:?}");
    // A sync message outside a session is refused; dispatch alone refuses sync.
    let peer = local.public_key();
    let sig = local.sign_sync_msg(b"any");
    assert!(matches!(
        rc.sync_message(&c, peer, 7, SyncMsg::More, sig),
        Err(Error::NotFound(_))
    ));
    let r = dispatch(
        &remote,
        Request::Sync {
            capsule: c,
            peer,
            session: 7,
            msg: SyncMsg::Done,
            sig,
        },
    );
    assert!(matches!(
        r,
        Response::Error(WireError {
            code: ErrorCode::InvalidInput,
            ..
        })
    ));
}

/// Open anti-entropy sessions are bounded by the names they compare, whatever initiator
/// keys a peer makes up: a new session drops the least recently used ones to make room,
/// and one that alone would compare more than the budget compares the oldest that fit.
#[test]
fn sync_sessions_are_bounded_by_the_names_they_compare() {
    let srv = server(3);
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    let mut records = Vec::new();
    for i in 0..30 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let n = r.name();
        records.push(n);
        srv.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();
    }
    // A Hello from a made-up key, signed by it (what any peer can make).
    let responder = srv.public_key();
    let hello = || {
        let k = SigningKey::generate().unwrap();
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let msg = server::sync_hello_message(&c, &responder, &[0; 32], 30, at);
        let hello = SyncMsg::Hello {
            capsule: c,
            quick: [0; 32],
            count: 30,
            at,
            sig: k.sign(server::DOMAIN_SYNC_HELLO, &msg),
        };
        let req = signed_sync(&k, &responder, c, (7, 0), 0, hello);
        (k, req)
    };
    let is_ok = |r: &Response| matches!(r, Response::Sync { .. });
    // Room for two sessions of 30 names.
    let svc = CapsuleService::new(srv.clone()).with_max_sync_names(70);
    let (first_key, first) = hello();
    assert!(is_ok(&svc.handle(first)));
    assert!(is_ok(&svc.handle(hello().1)));
    assert_eq!(svc.open_syncs(), 2);
    // A third drops the least recently used (the first), whose next message is refused.
    assert!(is_ok(&svc.handle(hello().1)));
    assert_eq!(svc.open_syncs(), 2);
    let more = svc.handle(signed_sync(
        &first_key,
        &responder,
        c,
        (7, 0),
        1,
        SyncMsg::More,
    ));
    assert!(
        matches!(&more, Response::Error(e) if e.code == ErrorCode::NotFound),
        "{more:?}"
    );
    // A budget smaller than one session's records takes the oldest it has room for (the
    // next session goes on from there): a session it refused was refused for good.
    let small = CapsuleService::new(srv.clone()).with_max_sync_names(10);
    let r = small.handle(hello().1);
    assert!(is_ok(&r), "{r:?}");
    assert_eq!(small.open_syncs(), 1);
    // A session's names grow as it runs: one whose Exchange wants every record (so the
    // whole capsule is queued for it) makes the others give room.
    let svc = CapsuleService::new(srv.clone()).with_max_sync_names(70);
    let ((quiet_key, quiet), (busy_key, busy)) = (hello(), hello());
    assert!(is_ok(&svc.handle(quiet)));
    let Response::Sync {
        nonce: busy_nonce, ..
    } = svc.handle(busy)
    else {
        panic!("the Hello is answered")
    };
    assert_eq!(svc.open_syncs(), 2);
    let exchange = svc.handle(signed_sync(
        &busy_key,
        &responder,
        c,
        (7, busy_nonce),
        1,
        SyncMsg::Exchange {
            records: vec![],
            want: records.clone(),
            heads: vec![],
            roots: vec![],
            missing: vec![],
        },
    ));
    assert!(is_ok(&exchange), "{exchange:?}");
    assert_eq!(svc.open_syncs(), 1, "the quiet session gave room");
    let more = svc.handle(signed_sync(
        &quiet_key,
        &responder,
        c,
        (7, 0),
        1,
        SyncMsg::More,
    ));
    assert!(
        matches!(&more, Response::Error(e) if e.code == ErrorCode::NotFound),
        "{more:?}"
    );
}

/// A Hello that is not signed by the key it names, or that was used already, is refused
/// before it touches the open session under that key: the real session goes on.
#[test]
fn a_forged_hello_does_not_end_a_real_session() {
    let srv = server(5);
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    for i in 0..10 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let n = r.name();
        srv.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();
    }
    let a = server(6);
    let svc = CapsuleService::new(srv.clone());
    let responder = srv.public_key();
    let (at, sig) = a.sign_sync_hello(&c, &responder, &[0; 32], 3);
    let mut seal = SessionSeal::initiator(c, a.public_key(), responder, 7);
    let hello_msg = SyncMsg::Hello {
        capsule: c,
        quick: [0; 32],
        count: 3,
        at,
        sig,
    };
    let hello = Request::Sync {
        capsule: c,
        peer: a.public_key(),
        session: 7,
        sig: seal.seal(&a, Some(&hello_msg)).unwrap(),
        msg: hello_msg,
    };
    let real = svc.handle(hello.clone());
    let Response::Sync {
        msg: Some(SyncMsg::Symbols(first)),
        sig: answer_sig,
        nonce,
    } = &real
    else {
        panic!("{real:?}")
    };
    let nonce = *nonce;
    // The answer is the responder's own, as its first of this session.
    seal.take_nonce(nonce).unwrap();
    seal.open(Some(&SyncMsg::Symbols(first.clone())), answer_sig)
        .unwrap();
    // The same (validly signed) Hello again: refused as a replay, and the session it
    // started goes on.
    let replayed = svc.handle(hello);
    assert!(
        matches!(&replayed, Response::Error(e) if e.code == ErrorCode::Rejected),
        "{replayed:?}"
    );
    let other = SigningKey::from_seed(&[42; 32]);
    let msg = server::sync_hello_message(&c, &responder, &[0; 32], 3, at + 1);
    let forged_hello = SyncMsg::Hello {
        capsule: c,
        quick: [0; 32],
        count: 3,
        at: at + 1,
        sig: other.sign(server::DOMAIN_SYNC_HELLO, &msg),
    };
    let forged = svc.handle(Request::Sync {
        capsule: c,
        peer: a.public_key(),
        session: 7,
        sig: SessionSeal::initiator(c, a.public_key(), responder, 7)
            .seal(&a, Some(&forged_hello))
            .unwrap(),
        msg: forged_hello,
    });
    assert!(
        matches!(&forged, Response::Error(e) if e.code == ErrorCode::Rejected),
        "{forged:?}"
    );
    // Anyone can name the capsule and the initiator's key, but not the session number its
    // Hello carried: a Done under another number neither ends nor finishes the session.
    for wrong in [SyncMsg::Done, SyncMsg::More] {
        let mut guess = SessionSeal::initiator(c, a.public_key(), responder, 8);
        let _ = guess.seal(&a, None).unwrap();
        guess.take_nonce(nonce).unwrap();
        let r = svc.handle(Request::Sync {
            capsule: c,
            peer: a.public_key(),
            session: 8,
            sig: guess.seal(&a, Some(&wrong)).unwrap(),
            msg: wrong,
        });
        assert!(
            matches!(&r, Response::Error(e) if e.code == ErrorCode::NotFound),
            "{r:?}"
        );
    }
    // Someone on the path sees the session number too: a message under it that the
    // initiator did not sign as its next one (signed by another key, the initiator's Hello
    // signature replayed, the initiator's next message for another session, or one signed
    // for a later place) is refused, and the session goes on.
    let more = SyncMsg::More;
    let stranger = SigningKey::from_seed(&[43; 32]);
    let m = sync::sync_msg_message(
        &c,
        &a.public_key(),
        &responder,
        7,
        nonce,
        false,
        1,
        Some(&more),
    );
    let mut other_session = SessionSeal::initiator(c, a.public_key(), responder, 9);
    let _ = other_session.seal(&a, None).unwrap();
    other_session.take_nonce(nonce).unwrap();
    // Right in all but the responder's nonce (as a message of an earlier session with the
    // same number would be, replayed after the responder restarted).
    let mut old_nonce = SessionSeal::initiator(c, a.public_key(), responder, 7);
    let _ = old_nonce.seal(&a, None).unwrap();
    old_nonce.take_nonce(nonce ^ 1).unwrap();
    let mut ahead = seal.clone();
    let _ = ahead.seal(&a, Some(&more)).unwrap();
    let Request::Sync { sig: hello_sig, .. } = &svc_hello_sig(&a, &c, &responder) else {
        unreachable!()
    };
    for sig in [
        stranger.sign(server::DOMAIN_SYNC_MSG, &m),
        *hello_sig,
        other_session.seal(&a, Some(&more)).unwrap(),
        ahead.seal(&a, Some(&more)).unwrap(),
        old_nonce.seal(&a, Some(&more)).unwrap(),
    ] {
        for msg in [SyncMsg::Done, SyncMsg::More] {
            let r = svc.handle(Request::Sync {
                capsule: c,
                peer: a.public_key(),
                session: 7,
                msg,
                sig,
            });
            assert!(
                matches!(&r, Response::Error(e) if e.code == ErrorCode::Rejected),
                "{r:?}"
            );
        }
    }
    assert_eq!(svc.open_syncs(), 1);
    let more_sig = seal.seal(&a, Some(&more)).unwrap();
    let next = svc.handle(Request::Sync {
        capsule: c,
        peer: a.public_key(),
        session: 7,
        msg: more.clone(),
        sig: more_sig,
    });
    let Response::Sync {
        msg: Some(SyncMsg::Symbols(batch)),
        sig,
        ..
    } = &next
    else {
        panic!("{next:?}")
    };
    // The responder's answers are numbered too: its first answer's signature does not
    // pass for its second, and the second's does.
    let answer = SyncMsg::Symbols(batch.clone());
    assert!(seal.clone().open(Some(&answer), answer_sig).is_err());
    seal.open(Some(&answer), sig).unwrap();
    // The same message sent again (a replay of what the initiator signed) is refused.
    let again = svc.handle(Request::Sync {
        capsule: c,
        peer: a.public_key(),
        session: 7,
        msg: more,
        sig: more_sig,
    });
    assert!(
        matches!(&again, Response::Error(e) if e.code == ErrorCode::Rejected),
        "{again:?}"
    );
    assert_eq!(svc.open_syncs(), 1);
}

/// The initiator takes only answers the responder signed as its next one of the session,
/// from the replica it meant to reach: someone on the path who answers a Hello with a
/// made-up InSync (signed by a stranger, or with the stranger's key passed off as the
/// server's), or a later message with an earlier answer, ends the session with an error
/// and moves no cursor, instead of having it end "in sync".
#[test]
fn the_initiator_refuses_answers_the_responder_did_not_sign_in_order() {
    let local = server(1);
    let remote = server(2);
    let (mut w, meta, _) = writer();
    let c = meta.name();
    local.create(&meta).unwrap();
    remote.create(&meta).unwrap();
    for i in 0..20 {
        let r = w.record(&[i as u8; 20], &[]).unwrap();
        let n = r.name();
        let s = w.sign(&n);
        if i < 10 {
            local.write(&c, &[r], &[(n, s)]).unwrap();
        } else {
            remote.write(&c, &[r], &[(n, s)]).unwrap();
        }
    }
    let stranger = SigningKey::from_seed(&[77; 32]);
    let (initiator, responder) = (local.public_key(), remote.public_key());
    // What an attacker on the path answers in place of the server's answer to `req`, the
    // `k`-th sync message of the session when it is one (the first answer given).
    type Forge = dyn Fn(&Request, u64, &[u8]) -> Option<Vec<u8>> + Send + Sync;
    let run = |forge: Arc<Forge>| {
        let svc = Arc::new(CapsuleService::new(remote.clone()));
        let seen = Arc::new(std::sync::Mutex::new((0u64, Vec::<Vec<u8>>::new())));
        let h = cairn_net::serve(
            "127.0.0.1:0",
            cairn_capsule::wire::server_config(),
            move |bytes: &[u8]| {
                let real = svc.handle_bytes(bytes);
                let Ok(req) = Request::from_bytes(bytes) else {
                    return real;
                };
                let mut seen = seen.lock().unwrap();
                let k = seen.0;
                if matches!(req, Request::Sync { .. }) {
                    seen.0 += 1;
                    seen.1.push(real.clone());
                }
                let first = seen.1.first().cloned().unwrap_or_default();
                forge(&req, k, &first).unwrap_or(real)
            },
        )
        .unwrap();
        let mut rc = RemoteCapsule::connect(h.local_addr()).unwrap();
        rc.sync_with(&local, &c, &responder)
    };
    // What the next session with the remote compares: all of local's records until a
    // session finishes.
    let compared = || local.since_last_sync(&c, &responder).unwrap().0.len();
    assert_eq!(compared(), 10);
    // A made-up InSync for the Hello, signed by the stranger as the responder's first
    // answer.
    let stranger_key = stranger.public();
    let made_up_in_sync = Arc::new(move |req: &Request| {
        let Request::Sync { session, .. } = req else {
            return None;
        };
        let m = sync::sync_msg_message(
            &c,
            &initiator,
            &stranger.public(),
            *session,
            5,
            true,
            0,
            Some(&SyncMsg::InSync),
        );
        Some(
            Response::Sync {
                msg: Some(SyncMsg::InSync),
                sig: stranger.sign(server::DOMAIN_SYNC_MSG, &m),
                nonce: 5,
            }
            .to_bytes(),
        )
    });
    let forge = made_up_in_sync.clone();
    let in_sync = Arc::new(move |req: &Request, _: u64, _: &[u8]| forge(req));
    let e = run(in_sync).unwrap_err();
    assert!(matches!(e, Error::Rejected(_)), "{e}");
    // The same, with the stranger's key given as the server's: refused before the Hello.
    let posing = Arc::new(move |req: &Request, _: u64, _: &[u8]| match req {
        Request::ServerKey => Some(Response::ServerKey(stranger_key).to_bytes()),
        _ => made_up_in_sync(req),
    });
    let e = run(posing).unwrap_err();
    assert!(
        matches!(&e, Error::Rejected(m) if m.contains("not the replica")),
        "{e}"
    );
    // The responder's first answer again, as its second.
    let replay = Arc::new(|req: &Request, k: u64, first: &[u8]| {
        (matches!(req, Request::Sync { .. }) && k == 1).then(|| first.to_vec())
    });
    let e = run(replay).unwrap_err();
    assert!(matches!(e, Error::Rejected(_)), "{e}");
    // No session finished on this side: the next one still compares everything.
    assert_eq!(compared(), 10);
    let h = serve_tcp(remote.clone(), "127.0.0.1:0").unwrap();
    let report = RemoteCapsule::connect(h.local_addr())
        .unwrap()
        .sync_with(&local, &c, &responder)
        .unwrap();
    assert!(!report.quick_match, "{report:?}");
    assert_eq!(local.with_dag(&c, |d| d.order().len()).unwrap(), 20);
    assert_eq!(remote.with_dag(&c, |d| d.order().len()).unwrap(), 20);
}

/// Anti-entropy messages take their answer's memory only once they are known to be the
/// peer's (a Hello) or to belong to a session (the others): made-up messages of a hundred
/// bytes each reserved a frame (65 MiB) first.
#[test]
fn sync_messages_reserve_memory_only_once_authenticated() {
    let srv = server(5);
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    let r = w.record(b"r", &[]).unwrap();
    let n = r.name();
    srv.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();
    let a = server(6);
    let svc = CapsuleService::new(srv.clone());
    let responder = srv.public_key();
    let mut asked = Vec::new();
    let send = |req: Request, asked: &mut Vec<usize>| {
        let out = svc.handle_bytes_within(&req.to_bytes(), &mut |b| {
            asked.push(b);
            Ok(())
        });
        Response::from_bytes(&out).unwrap()
    };
    // A Hello signed by a key that is not the peer's.
    let other = SigningKey::from_seed(&[42; 32]);
    let (at, _) = a.sign_sync_hello(&c, &responder, &[0; 32], 3);
    let msg = server::sync_hello_message(&c, &responder, &[0; 32], 3, at);
    let forged = SyncMsg::Hello {
        capsule: c,
        quick: [0; 32],
        count: 3,
        at,
        sig: other.sign(server::DOMAIN_SYNC_HELLO, &msg),
    };
    let r = send(
        Request::Sync {
            capsule: c,
            peer: a.public_key(),
            session: 7,
            sig: SessionSeal::initiator(c, a.public_key(), responder, 7)
                .seal(&a, Some(&forged))
                .unwrap(),
            msg: forged,
        },
        &mut asked,
    );
    assert!(matches!(r, Response::Error(_)), "{r:?}");
    // A Done for a session that does not exist.
    let mut guess = SessionSeal::initiator(c, a.public_key(), responder, 9);
    let _ = guess.seal(&a, None).unwrap();
    guess.take_nonce(12345).unwrap();
    let r = send(
        Request::Sync {
            capsule: c,
            peer: a.public_key(),
            session: 9,
            sig: guess.seal(&a, Some(&SyncMsg::Done)).unwrap(),
            msg: SyncMsg::Done,
        },
        &mut asked,
    );
    assert!(matches!(r, Response::Error(_)), "{r:?}");
    assert!(asked.is_empty(), "made-up messages reserved {asked:?}");
    // The peer's own Hello reserves its answer and room for every name the session
    // compares (160 bytes each), counted before they are collected.
    let backlog = srv.sync_backlog(&c, &a.public_key()).unwrap();
    assert!(backlog > 0);
    let r = send(svc_hello_sig(&a, &c, &responder), &mut asked);
    assert!(matches!(r, Response::Sync { .. }), "{r:?}");
    assert_eq!(asked, vec![(8 << 20) + 160 * backlog]);
}

/// A Hello signed by `a` for session 7 of `c` with `responder` (its request signature is
/// the initiator's message 0 of that session).
fn svc_hello_sig(a: &CapsuleServer, c: &CapsuleName, responder: &cairn_core::PublicKey) -> Request {
    let (at, sig) = a.sign_sync_hello(c, responder, &[0; 32], 3);
    let msg = SyncMsg::Hello {
        capsule: *c,
        quick: [0; 32],
        count: 3,
        at,
        sig,
    };
    Request::Sync {
        capsule: *c,
        peer: a.public_key(),
        session: 7,
        sig: SessionSeal::initiator(*c, a.public_key(), *responder, 7)
            .seal(a, Some(&msg))
            .unwrap(),
        msg,
    }
}

/// A write takes the memory of its ack before it stores anything: an ack of thousands of
/// names is larger than a connection holds uncharged, and was charged only once built,
/// after the write, when a shortage could only drop the answer to a stored write. A
/// refused reservation stores nothing.
#[test]
fn a_write_reserves_its_ack_before_storing() {
    let srv = server(9);
    let service = CapsuleService::new(srv.clone());
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    let records: Vec<_> = (0..3000u32)
        .map(|i| w.record(&i.to_le_bytes(), &[]).unwrap())
        .collect();
    let last = records[2999].name();
    let req = Request::Write {
        capsule: c,
        records: records.clone(),
        signatures: vec![(last, w.sign(&last))],
    }
    .to_bytes();
    let out =
        service.handle_bytes_within(&req, &mut |_| Err(Error::Unavailable("no memory".into())));
    assert!(matches!(
        Response::from_bytes(&out).unwrap(),
        Response::Error(_)
    ));
    assert!(srv.read(&c, &last).is_err(), "nothing stored");
    let mut asked = Vec::new();
    let out = service.handle_bytes_within(&req, &mut |b| {
        asked.push(b);
        Ok(())
    });
    assert!(matches!(
        Response::from_bytes(&out).unwrap(),
        Response::Ack(_)
    ));
    assert!(out.len() > 64 << 10, "{}", out.len());
    assert!(
        asked.iter().sum::<usize>() >= out.len(),
        "{asked:?} for {}",
        out.len()
    );
}

/// A subrecord commit is charged for the names and tree its check builds, which for small
/// subrecords are several times their wire size. A refused charge stores nothing.
#[test]
fn a_subrecord_commit_reserves_its_decoded_copy_and_its_tree() {
    let srv = server(9);
    let service = CapsuleService::new(srv.clone());
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    let count = 20_000;
    for i in 0..count as u32 {
        w.write_subrecord(&i.to_le_bytes()).unwrap();
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    let name = header.name();
    let req = Request::CommitSubrecords {
        capsule: c,
        header,
        subrecords: sealed,
        sig: Some(sig),
    }
    .to_bytes();
    let out =
        service.handle_bytes_within(&req, &mut |_| Err(Error::Unavailable("no memory".into())));
    match Response::from_bytes(&out).unwrap() {
        Response::Error(e) => assert!(matches!(e.into_error(), Error::Unavailable(_))),
        other => panic!("answered {}", other.kind()),
    }
    assert!(srv.read(&c, &name).is_err(), "nothing stored");

    let mut asked = Vec::new();
    let out = service.handle_bytes_within(&req, &mut |b| {
        asked.push(b);
        Ok(())
    });
    assert!(matches!(
        Response::from_bytes(&out).unwrap(),
        Response::Ack(_)
    ));
    // A name and about four tree digests a subrecord.
    assert!(
        asked.iter().sum::<usize>() >= count * (33 + 4 * 32),
        "{asked:?} for {count} subrecords"
    );
    assert!(srv.read(&c, &name).is_ok());
}

/// The endpoint takes the memory of a large answer before building it: a record read
/// reserves twice its body (as read, and in the encoded answer), a batched subrecord read
/// reserves as it reads, and a refused reservation is answered "unavailable" with no
/// proof issued.
#[test]
fn large_answers_reserve_their_memory_first() {
    let srv = server(9);
    let service = CapsuleService::new(srv.clone());
    let (mut w, meta, _) = writer();
    let c = meta.name();
    srv.create(&meta).unwrap();
    let body = vec![7u8; 1 << 20];
    let r = w.record(&body, &[]).unwrap();
    let n = r.name();
    let sealed = r.body.len();
    srv.write(&c, &[r], &[(n, w.sign(&n))]).unwrap();

    let mut asked = Vec::new();
    let req = Request::Read {
        capsule: c,
        name: n,
    }
    .to_bytes();
    let out = service.handle_bytes_within(&req, &mut |b| {
        asked.push(b);
        Ok(())
    });
    assert!(matches!(
        Response::from_bytes(&out).unwrap(),
        Response::Record(_)
    ));
    assert_eq!(asked, vec![2 * sealed]);

    // Refused: the answer says so, and a session's proof is not issued.
    let policy = CachePolicy::Lru { capacity: 16 };
    let sid = srv.open_session(&c, policy, &[]).unwrap();
    let req = Request::ReadProve {
        capsule: c,
        name: n,
        session: Some(sid),
    }
    .to_bytes();
    let out =
        service.handle_bytes_within(&req, &mut |_| Err(Error::Unavailable("no memory".into())));
    match Response::from_bytes(&out).unwrap() {
        Response::Error(e) => assert!(matches!(e.into_error(), Error::Unavailable(_))),
        other => panic!("answered {}", other.kind()),
    }
    // The first proof the session is issued is still proof 1 (nothing was issued above).
    let issued = srv.prove(&c, &n, Some(sid)).unwrap();
    assert_eq!(issued.proof_id, 1);

    // A batched subrecord read reserves each subrecord as it is read.
    let subs: Vec<_> = (0..3)
        .map(|i| w.write_subrecord(&vec![i as u8; 5000]).unwrap())
        .collect();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    srv.commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    let req = Request::ReadSubrecords {
        capsule: c,
        subs: subs.clone(),
    }
    .to_bytes();
    let mut asked = Vec::new();
    let out = service.handle_bytes_within(&req, &mut |b| {
        asked.push(b);
        Ok(())
    });
    assert!(matches!(Response::from_bytes(&out).unwrap(), Response::Subrecords(s) if s.len() == 3));
    let want: Vec<usize> = sealed.iter().map(|s| 2 * s.len()).collect();
    assert_eq!(asked, want);
    // Refused at the second subrecord: an error, not a partial answer.
    let mut left = 1;
    let out = service.handle_bytes_within(&req, &mut |_| {
        if left == 0 {
            return Err(Error::Unavailable("no memory".into()));
        }
        left -= 1;
        Ok(())
    });
    assert!(matches!(
        Response::from_bytes(&out).unwrap(),
        Response::Error(_)
    ));

    // A record's list of subrecord names reserves its memory (the stored list, the names,
    // their encoding) before the list is read: a record of a million subrecords made
    // answers of 100 MiB that were charged only once built. Refused, it is an error.
    let list = Request::Subrecords {
        capsule: c,
        record: header.name(),
    }
    .to_bytes();
    let mut asked = Vec::new();
    let out = service.handle_bytes_within(&list, &mut |b| {
        asked.push(b);
        Ok(())
    });
    let answer_len = out.len();
    assert!(
        matches!(Response::from_bytes(&out).unwrap(), Response::SubrecordNames(s) if s == subs)
    );
    assert_eq!(asked.len(), 1);
    assert!(
        asked[0] >= answer_len,
        "{asked:?} for an answer of {answer_len}"
    );
    let out =
        service.handle_bytes_within(&list, &mut |_| Err(Error::Unavailable("no memory".into())));
    match Response::from_bytes(&out).unwrap() {
        Response::Error(e) => assert!(matches!(e.into_error(), Error::Unavailable(_))),
        other => panic!("answered {}", other.kind()),
    }
}

/// A write's bodies are counted against the request's memory: each is held twice more
/// while the write runs (decoded, and framed as a chunk), which the ack's share alone left
/// out (sixteen 64 MiB writes fit a budget meant for five).
#[test]
fn a_write_takes_memory_for_its_bodies() {
    let server = Arc::new(CapsuleServer::new(
        Arc::new(MemoryStore::new()),
        SigningKey::from_seed(&[9; 32]),
        ServerOptions::default(),
    ));
    let wk = SigningKey::from_seed(&[1; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "mem");
    let c = meta.name();
    server.create(&meta).unwrap();
    let mut w = Writer::new(meta, wk, Some(BodyKey([7; 32]))).unwrap();
    let r = w.record(&vec![5u8; 1 << 20], &[]).unwrap();
    let n = r.name();
    let body = r.body.len();
    let req = Request::Write {
        capsule: c,
        records: vec![r],
        signatures: vec![(n, w.sign(&n))],
    }
    .to_bytes();
    let service = CapsuleService::new(server.clone());
    // Refused for want of it: nothing is written.
    let answer = service.handle_bytes_within(&req, &mut |want| {
        if want >= 2 * body {
            Err(Error::Unavailable("busy".into()))
        } else {
            Ok(())
        }
    });
    assert!(matches!(
        Response::from_bytes(&answer),
        Ok(Response::Error(_))
    ));
    assert!(!server.with_dag(&c, |d| d.contains(&n)).unwrap());
    // With room, taken.
    let mut taken = 0usize;
    let answer = service.handle_bytes_within(&req, &mut |want| {
        taken += want;
        Ok(())
    });
    assert!(matches!(
        Response::from_bytes(&answer),
        Ok(Response::Ack(_))
    ));
    assert!(taken >= 2 * body, "{taken}");
}
