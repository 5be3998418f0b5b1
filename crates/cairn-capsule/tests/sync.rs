//! Anti-entropy: replicas converge exactly over random divergences, and a faulty peer's
//! corrupt records are refused.

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_capsule::*;
use cairn_core::{HashAlgo, SigningKey};
use cairn_store::{MemoryStore, Store};
use proptest::prelude::*;

mod support;

fn server(seed: u8) -> CapsuleServer {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    CapsuleServer::new(
        store,
        SigningKey::from_seed(&[seed; 32]),
        ServerOptions::default(),
    )
}

fn present(s: &CapsuleServer, c: &CapsuleName) -> BTreeSet<RecordName> {
    s.with_dag(c, |d| d.order().iter().copied().collect())
        .unwrap()
}

fn proven(s: &CapsuleServer, c: &CapsuleName) -> BTreeSet<RecordName> {
    s.with_dag(c, |d| {
        d.order()
            .iter()
            .filter(|n| d.witness(n).and_then(|w| w.hops()).is_some())
            .copied()
            .collect()
    })
    .unwrap()
}

/// A Hello of capsule `c` with an all-zero quick check, `count` names, stamp and signature.
fn hello_msg(c: CapsuleName, count: u64, (at, sig): (u64, cairn_core::Signature)) -> SyncMsg {
    SyncMsg::Hello {
        capsule: c,
        quick: [0; 32],
        count,
        at,
        sig,
    }
}

/// Replicas A and B of one capsule, and every record name written to either.
type Scenario = (
    CapsuleServer,
    CapsuleServer,
    CapsuleName,
    BTreeSet<RecordName>,
);

/// A scenario: `n` records on up to 3 branches of one writer, signed every `every`, each
/// delivered to A, B or both.
fn scenario(n: usize, every: usize, placement: &[u8], branch: &[u8]) -> Scenario {
    scenario_in(BodyCipher::default(), n, every, placement, branch)
}

/// [`scenario`] with bodies sealed by `cipher`: with plaintext bodies the record names,
/// and so the coded symbols, are the same in every run.
fn scenario_in(
    cipher: BodyCipher,
    n: usize,
    every: usize,
    placement: &[u8],
    branch: &[u8],
) -> Scenario {
    let a = server(1);
    let b = server(2);
    let wk = SigningKey::from_seed(&[7; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "sync");
    meta.cipher = cipher;
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, Some(BodyKey([3; 32]))).unwrap();
    let mut tips: Vec<Option<RecordName>> = vec![None; 3];
    let mut all = BTreeSet::new();
    for i in 0..n {
        let br = (branch.get(i).copied().unwrap_or(0) % 3) as usize;
        // Branches fork from branch 0's tip; occasionally merge all tips.
        let mut bp: Vec<RecordName> = Vec::new();
        if let Some(t) = tips[br].or(tips[0]) {
            bp.push(t);
        }
        if i % 17 == 16 {
            for t in tips.iter().flatten() {
                if !bp.contains(t) {
                    bp.push(*t);
                }
            }
        }
        let sealed =
            cairn_capsule::record::BodyCrypto::new(meta.cipher, Some(&BodyKey([3; 32])), &c)
                .seal(format!("r{i}").as_bytes())
                .unwrap();
        let r = Record::new(c, sealed, bp);
        let name = r.name();
        tips[br] = Some(name);
        let sign = i % every == every - 1 || i + 1 == n;
        let sigs = if sign {
            vec![(name, w.sign(&name))]
        } else {
            vec![]
        };
        match placement.get(i).copied().unwrap_or(0) % 4 {
            0 => {
                a.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
            }
            1 => {
                b.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
            }
            _ => {
                a.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
                b.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
            }
        }
        all.insert(name);
    }
    // Every branch tip gets signed at the end so the whole union is provable.
    for t in tips.iter().flatten() {
        let ws = w.sign(t);
        for s in [&a, &b] {
            if s.with_dag(&c, |d| d.contains(t)).unwrap() {
                s.sign(&c, t, ws).unwrap();
            }
        }
    }
    (a, b, c, all)
}

#[test]
fn long_offline_replica_catches_up_and_second_sync_is_quick() {
    // B was offline for records 50..250 of 300.
    let placement: Vec<u8> = (0..300)
        .map(|i| if (50..250).contains(&i) { 0 } else { 2 })
        .collect();
    let (a, b, c, all) = scenario(300, 10, &placement, &[]);
    let (ra, rb) = sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), all);
    assert_eq!(present(&b, &c), all);
    assert_eq!(proven(&b, &c), all);
    assert_eq!(a.heads_roots(&c).unwrap(), b.heads_roots(&c).unwrap());
    assert!(!ra.quick_match && ra.symbols > 0, "{ra:?} {rb:?}");
    assert_eq!(rb.accepted, 200);
    // Set reconciliation moved the bulk in one exchange, not hundreds of Lu rounds.
    assert!(ra.rounds + rb.rounds <= 4, "{ra:?} {rb:?}");
    let (ra2, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(ra2.quick_match);
}

#[test]
fn faulty_peer_records_are_refused() {
    let placement: Vec<u8> = (0..40).map(|i| if i >= 20 { 0 } else { 2 }).collect();
    let (a, b, c, all) = scenario(40, 5, &placement, &[]);
    // A faulty A: tamper every body it sends.
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let tamper = |m: SyncMsg| match m {
        SyncMsg::Exchange {
            mut records,
            want,
            heads,
            roots,
            missing,
        } => {
            for r in &mut records {
                if let SyncBody::Plain(bd) = &mut r.body {
                    bd[0] ^= 1;
                }
            }
            SyncMsg::Exchange {
                records,
                want,
                heads,
                roots,
                missing,
            }
        }
        SyncMsg::Patch {
            mut records,
            want,
            heads,
            roots,
            missing,
        } => {
            for r in &mut records {
                if let SyncBody::Plain(bd) = &mut r.body {
                    bd[0] ^= 1;
                }
            }
            SyncMsg::Patch {
                records,
                want,
                heads,
                roots,
                missing,
            }
        }
        other => other,
    };
    let mut msg = Some(tamper(sa.start().unwrap()));
    let mut to_b = true;
    let mut steps = 0;
    while let Some(m) = msg {
        steps += 1;
        if steps > 300 {
            break;
        }
        msg = if to_b {
            sb.handle(m).unwrap()
        } else {
            sa.handle(m).unwrap().map(tamper)
        };
        to_b = !to_b;
    }
    assert!(sb.report().corrupt >= 20, "{:?}", sb.report());
    assert_eq!(sb.report().accepted, 0);
    assert_eq!(present(&b, &c).len(), 20);
    // An honest session afterwards converges.
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&b, &c), all);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A replay of a capsule's journal rebuilds the same acceptance order and the same
    /// order records became proven in (what a persisted sync cursor is a position in).
    #[test]
    fn the_proven_order_is_the_same_after_a_capsule_is_replayed(
        n in 1usize..120,
        every in 1usize..12,
        placement in proptest::collection::vec(any::<u8>(), 120),
        branch in proptest::collection::vec(any::<u8>(), 120),
    ) {
        // Records written unsigned and signed later, on either replica, then moved by a
        // sync (records a peer sent, applied in the order they came): a replay of each
        // replica's journal gives the same acceptance order and the same order records
        // became proven in, which a sync cursor is a position in.
        let (a, b, c, _) = scenario(n, every, &placement, &branch);
        sync_pair(&a, &b, &c).unwrap();
        for (seed, srv) in [(1u8, &a), (2u8, &b)] {
            // The orders, and which records are signed, signed late and how far from a
            // signature each is.
            let orders = |s: &CapsuleServer| {
                s.with_dag(&c, |d| {
                    let mut late: Vec<RecordName> = d.signed_late_names().copied().collect();
                    late.sort();
                    let state: Vec<_> = d
                        .order()
                        .iter()
                        .map(|n| (d.signature(n).copied(), d.witness(n).and_then(|w| w.hops())))
                        .collect();
                    (d.order().to_vec(), d.proven_order().to_vec(), late, state)
                })
                .unwrap()
            };
            let again = CapsuleServer::new(
                srv.store().clone(),
                SigningKey::from_seed(&[seed; 32]),
                ServerOptions::default(),
            );
            prop_assert_eq!(orders(srv), orders(&again));
        }
    }

    /// Random holes, stale and missing branches: after one session both replicas hold
    /// exactly the union, all proven, with the same heads and roots.
    #[test]
    fn replicas_converge_exactly(
        n in 1usize..120,
        every in 1usize..12,
        placement in proptest::collection::vec(any::<u8>(), 120),
        branch in proptest::collection::vec(any::<u8>(), 120),
    ) {
        let (a, b, c, all) = scenario(n, every, &placement, &branch);
        sync_pair(&a, &b, &c).unwrap();
        prop_assert_eq!(present(&a, &c), all.clone());
        prop_assert_eq!(present(&b, &c), all.clone());
        prop_assert_eq!(proven(&a, &c), all.clone());
        prop_assert_eq!(proven(&b, &c), all);
        prop_assert_eq!(a.heads_roots(&c).unwrap(), b.heads_roots(&c).unwrap());
    }
}

/// A peer that does not follow the protocol is refused, whatever it claims: coded symbols
/// sent to the responder (which only sends them), a second Hello, symbols after they
/// decoded; a Hello claiming an absurd name count neither panics nor asks for absurd work.
#[test]
fn out_of_turn_messages_are_refused() {
    let placement: Vec<u8> = (0..40).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(40, 5, &placement, &[]);
    // A Hello A signs for B (each with a fresh stamp).
    let signed_hello = |count: u64| {
        hello_msg(
            c,
            count,
            a.sign_sync_hello(&c, &b.public_key(), &[0; 32], count),
        )
    };
    let hello = signed_hello(u64::MAX);
    // Responder B: a Hello with a huge count is answered with a bounded first batch.
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let Some(SyncMsg::Symbols(first)) = sb.handle(hello.clone()).unwrap() else {
        panic!("a Hello is answered with coded symbols")
    };
    assert!(first.len() <= 1 << 16);
    // Symbols sent to the responder, and a second Hello, are refused.
    let e = sb.handle(SyncMsg::Symbols(first.clone())).unwrap_err();
    assert!(e.to_string().contains("unexpected"), "{e}");
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let again = signed_hello(u64::MAX);
    sb.handle(again.clone()).unwrap();
    assert!(sb.handle(again).is_err());
    // A Hello is A's only if A signed it, for B, and only once: one replayed, one signed by
    // another key in A's name, and one A signed for another responder are refused.
    let e = SyncSession::new(&b, c, a.public_key())
        .unwrap()
        .handle(hello.clone())
        .unwrap_err();
    assert!(e.to_string().contains("replayed"), "{e}");
    let other = server(9);
    let forged = hello_msg(
        c,
        5,
        other.sign_sync_hello(&c, &b.public_key(), &[0; 32], 5),
    );
    let e = SyncSession::new(&b, c, a.public_key())
        .unwrap()
        .handle(forged)
        .unwrap_err();
    assert!(e.to_string().contains("not signed"), "{e}");
    let elsewhere = hello_msg(
        c,
        5,
        a.sign_sync_hello(&c, &other.public_key(), &[0; 32], 5),
    );
    let e = SyncSession::new(&b, c, a.public_key())
        .unwrap()
        .handle(elsewhere)
        .unwrap_err();
    assert!(e.to_string().contains("not signed"), "{e}");
    // A Hello is good for five minutes by the responder's clock: one A signed (with A's
    // key) ten minutes ago is refused, even though no session used it.
    let ten_minutes_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
        - 600_000_000;
    let msg = server::sync_hello_message(&c, &b.public_key(), &[0; 32], 5, ten_minutes_ago);
    let stale = hello_msg(
        c,
        5,
        (
            ten_minutes_ago,
            SigningKey::from_seed(&[1; 32]).sign(server::DOMAIN_SYNC_HELLO, &msg),
        ),
    );
    let e = SyncSession::new(&b, c, a.public_key())
        .unwrap()
        .handle(stale)
        .unwrap_err();
    assert!(e.to_string().contains("clock"), "{e}");
    // Initiator A: symbols are taken until they decode, not after.
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let mut msg = sa.start().unwrap();
    let mut last_symbols = None;
    while let Some(reply) = sb.handle(msg).unwrap() {
        if let SyncMsg::Symbols(s) = &reply {
            last_symbols = Some(s.clone());
        }
        match sa.handle(reply).unwrap() {
            Some(SyncMsg::More) => msg = SyncMsg::More,
            _ => break,
        }
    }
    let e = sa
        .handle(SyncMsg::Symbols(last_symbols.expect("symbols were sent")))
        .unwrap_err();
    assert!(e.to_string().contains("unexpected"), "{e}");
    // Each step only in its place: no InSync, Done or Patch for a responder that has not
    // had the Exchange, no unasked name list, no second Exchange, no request for symbols
    // or names after it (each would let a peer end a session early or make a server redo
    // work without bound).
    let empty_patch = SyncMsg::Patch {
        records: vec![],
        want: vec![],
        heads: vec![],
        roots: vec![],
        missing: vec![],
    };
    let exchange = SyncMsg::Exchange {
        records: vec![],
        want: vec![],
        heads: vec![],
        roots: vec![],
        missing: vec![],
    };
    let responder = || {
        let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
        sb.handle(signed_hello(10)).unwrap();
        sb
    };
    for early in [
        SyncMsg::InSync,
        SyncMsg::Done,
        empty_patch.clone(),
        SyncMsg::Names {
            names: vec![],
            more: false,
        },
    ] {
        let e = responder().handle(early).unwrap_err();
        assert!(e.to_string().contains("unexpected"), "{e}");
    }
    let mut sb = responder();
    sb.handle(exchange.clone()).unwrap();
    for late in [
        exchange.clone(),
        SyncMsg::More,
        SyncMsg::SendNames { from: 0 },
    ] {
        let e = sb.handle(late).unwrap_err();
        assert!(e.to_string().contains("unexpected"), "{e}");
    }
    // Pages of the name list go in order, each once: not from elsewhere than where the
    // last one ended, and none after the last.
    let e = responder()
        .handle(SyncMsg::SendNames { from: 1 })
        .unwrap_err();
    assert!(e.to_string().contains("unexpected"), "{e}");
    let mut sb = responder();
    let Some(SyncMsg::Names { names, more: false }) =
        sb.handle(SyncMsg::SendNames { from: 0 }).unwrap()
    else {
        panic!("the name list is one page");
    };
    assert!(
        sb.handle(SyncMsg::SendNames {
            from: names.len() as u64
        })
        .is_err(),
        "no page after the last"
    );
    assert!(
        sb.handle(SyncMsg::SendNames { from: 0 }).is_err(),
        "one name list per session"
    );
    // (A name list is taken in place of coded symbols: a responder sends one once its
    // symbols would outweigh it.)
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    sa.start().unwrap();
    for wrong in [exchange, empty_patch, SyncMsg::Done] {
        let e = sa.handle(wrong).unwrap_err();
        assert!(e.to_string().contains("unexpected"), "{e}");
    }
}

/// A record sent twice in one batch, once without and once with its signature, is taken
/// once and proven: the signature is kept whichever copy carried it.
#[test]
fn a_record_sent_twice_keeps_the_signature_of_either_copy() {
    let placement: Vec<u8> = vec![0; 4];
    let (a, _, c, _) = scenario(4, 4, &placement, &[]);
    let names: Vec<RecordName> = a.with_dag(&c, |d| d.order().to_vec()).unwrap();
    let signed = *names
        .iter()
        .find(|n| a.with_dag(&c, |d| d.signature(n).is_some()).unwrap())
        .expect("a signed record");
    let exported = a.export(&c, &[signed]).unwrap();
    assert_eq!(exported.len(), 1);
    assert!(exported[0].signature.is_some());
    let mut bare = exported[0].clone();
    bare.signature = None;
    let fresh = server(3);
    fresh
        .create(&a.with_dag(&c, |d| d.meta().clone()).unwrap())
        .unwrap();
    let r = fresh.apply_sync(&c, &[bare, exported[0].clone()]).unwrap();
    assert_eq!((r.accepted, r.unproven), (1, 0), "{r:?}");
    assert!(
        fresh
            .with_dag(&c, |d| d.signature(&signed).is_some())
            .unwrap()
    );
    fresh.prove(&c, &signed, None).unwrap();
}

/// Seals a body for a capsule.
type Seal = Box<dyn Fn(&str) -> Vec<u8>>;

/// `n` records of capsule `c`, each pointing at the one before (bodies sealed by `seal`).
fn chain_of(c: CapsuleName, seal: &Seal, n: usize) -> Vec<Record> {
    let mut chain: Vec<Record> = Vec::with_capacity(n);
    for i in 0..n {
        let back = chain.last().map(Record::name).into_iter().collect();
        chain.push(Record::new(c, seal(&format!("r{i}")), back));
    }
    chain
}

/// Two replicas A and B of a new capsule, its writer, and a function sealing a body for it.
struct Pair {
    a: CapsuleServer,
    b: CapsuleServer,
    c: CapsuleName,
    w: Writer,
    seal: Seal,
}

fn pair(label: &str) -> Pair {
    let (a, b) = (server(1), server(2));
    let wk = SigningKey::from_seed(&[7; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), label);
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, Some(BodyKey([3; 32]))).unwrap();
    let crypto = cairn_capsule::record::BodyCrypto::new(meta.cipher, Some(&BodyKey([3; 32])), &c);
    let seal = Box::new(move |s: &str| crypto.seal(s.as_bytes()).unwrap());
    Pair { a, b, c, w, seal }
}

/// Writes `r`, signed, to both replicas; returns its name.
fn both_signed(
    a: &CapsuleServer,
    b: &CapsuleServer,
    c: &CapsuleName,
    w: &Writer,
    r: Record,
) -> RecordName {
    let sig = vec![(r.name(), w.sign(&r.name()))];
    for s in [a, b] {
        s.write(c, std::slice::from_ref(&r), &sig).unwrap();
    }
    r.name()
}

/// A record that was unproven when two replicas last synced (so it did not travel) is
/// compared again once a signature reaches it: the next sync sends it, instead of the
/// quick check finding both sides in sync while one of them lacks it.
#[test]
fn a_record_proven_after_a_sync_travels_at_the_next_one() {
    let Pair { a, b, c, w, seal } = pair("late-proof");
    // A signed root on both; then x, unsigned, on A only.
    let root = both_signed(&a, &b, &c, &w, Record::new(c, seal("root"), vec![]));
    let x = Record::new(c, seal("x"), vec![root]);
    a.write(&c, std::slice::from_ref(&x), &[]).unwrap();
    // x is unproven, so this sync does not move it.
    sync_pair(&a, &b, &c).unwrap();
    assert!(!present(&b, &c).contains(&x.name()));
    // y, signed, names x: written to both replicas.
    both_signed(&a, &b, &c, &w, Record::new(c, seal("y"), vec![x.name()]));
    let (ra, rb) = sync_pair(&a, &b, &c).unwrap();
    assert!(!ra.quick_match, "{ra:?} {rb:?}");
    assert_eq!(present(&a, &c), present(&b, &c));
    assert!(proven(&b, &c).contains(&x.name()));
    assert!(b.missing(&c).unwrap().is_empty());
    // And then the replicas are in sync.
    let (ra2, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(ra2.quick_match, "{ra2:?}");
}

/// A record that stays unproven (its writer never signed past it) does not pin the sync
/// cursor: once two replicas have synced, later sessions compare only what is new, instead
/// of sending again every record accepted after that one.
#[test]
fn a_record_never_proven_does_not_make_every_sync_compare_again() {
    let Pair { a, b, c, w, seal } = pair("never");
    // An unsigned record early on A, then 30 signed records on their own chain, on both.
    let root = both_signed(&a, &b, &c, &w, Record::new(c, seal("root"), vec![]));
    let orphan = Record::new(c, seal("never signed"), vec![root]);
    a.write(&c, std::slice::from_ref(&orphan), &[]).unwrap();
    let mut tip = root;
    for i in 0..30 {
        let r = Record::new(c, seal(&format!("r{i}")), vec![tip]);
        tip = both_signed(&a, &b, &c, &w, r);
    }
    sync_pair(&a, &b, &c).unwrap();
    // The orphan is a head on A for good (it cannot travel), but the quick check covers
    // the proven part only: the replicas are found in sync, and nothing is sent again.
    for _ in 0..2 {
        let (ra, rb) = sync_pair(&a, &b, &c).unwrap();
        assert!(ra.quick_match, "{ra:?} {rb:?}");
        assert_eq!(ra.sent + rb.sent, 0, "{ra:?} {rb:?}");
        assert!(ra.symbols <= 64, "{ra:?}");
    }
}

/// An unsigned record anyone wrote, pointing into the middle of a signed chain (at the
/// parent of the head), does not make later sessions walk and resend that chain: before,
/// its holes and head made the quick check fail for good, and Lu's walk went down from it
/// through the proven records below, which the peer holds, in every session.
#[test]
fn an_unsigned_record_into_a_chain_does_not_make_sessions_resend_it() {
    let Pair { a, b, c, w, seal } = pair("intruder");
    let mut tip = both_signed(&a, &b, &c, &w, Record::new(c, seal("root"), vec![]));
    let mut chain = vec![tip];
    for i in 0..40 {
        tip = both_signed(
            &a,
            &b,
            &c,
            &w,
            Record::new(c, seal(&format!("r{i}")), vec![tip]),
        );
        chain.push(tip);
    }
    let ghost = RecordName(HashAlgo::Blake3.digest(b"a record nobody has"));
    let intruder = Record::new(c, seal("unsigned"), vec![chain[chain.len() - 2], ghost]);
    a.write(&c, std::slice::from_ref(&intruder), &[]).unwrap();
    for i in 0..3 {
        let (ra, rb) = sync_pair(&a, &b, &c).unwrap();
        assert_eq!(ra.sent + rb.sent, 0, "session {i}: {ra:?} {rb:?}");
        assert!(ra.quick_match || i == 0, "session {i}: {ra:?} {rb:?}");
        assert_eq!(ra.rounds + rb.rounds, 0, "session {i}: {ra:?} {rb:?}");
    }
    assert_eq!(proven(&a, &c), proven(&b, &c));
}

/// A replica that lost its data comes back with the same key, so the other side's cursor
/// is past a long chain signed only at its head: Lu's walk picks records deep in the chain,
/// and each travels with the records its proof runs through, so one session brings back
/// every record, proven (a record sent alone was refused as unproven and never sent again
/// in that session, which still ended with Done).
#[test]
fn one_session_restores_a_chain_signed_only_at_its_head() {
    let wk = SigningKey::from_seed(&[7; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "lu");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    let a = server(1);
    a.create(&meta).unwrap();
    let mut prev: Option<RecordName> = None;
    let n = 100;
    for i in 0..n {
        let r = Record::new(c, vec![i as u8; 8], prev.into_iter().collect());
        prev = Some(r.name());
        a.write(&c, std::slice::from_ref(&r), &[]).unwrap();
    }
    let w = Writer::new(meta.clone(), wk, None).unwrap();
    let head = prev.unwrap();
    a.sign(&c, &head, w.sign(&head)).unwrap();
    let b = server(2);
    b.create(&meta).unwrap();
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(proven(&b, &c).len(), n);
    let lost = server(2);
    lost.create(&meta).unwrap();
    let (_, rb) = sync_pair(&a, &lost, &c).unwrap();
    assert_eq!(rb.unproven, 0, "{rb:?}");
    assert_eq!(present(&lost, &c), present(&a, &c));
    assert_eq!(proven(&lost, &c).len(), n);
}

/// The names an initiator wants are taken only from the responder's own set: made-up
/// names (a Hello under any key, then an Exchange wanting millions of names) leave nothing
/// behind in the session.
#[test]
fn wanted_names_outside_the_responders_set_are_not_kept() {
    let placement: Vec<u8> = (0..40).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(40, 5, &placement, &[]);
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let hello = hello_msg(c, 0, a.sign_sync_hello(&c, &b.public_key(), &[0; 32], 0));
    sb.handle(hello).unwrap();
    let junk: Vec<RecordName> = (0..100_000u32)
        .map(|i| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes())))
        .collect();
    let reply = sb
        .handle(SyncMsg::Exchange {
            records: vec![],
            want: junk,
            heads: vec![],
            roots: vec![],
            missing: vec![],
        })
        .unwrap();
    assert!(matches!(reply, Some(SyncMsg::Patch { .. })));
    let held = present(&b, &c).len();
    assert!(
        sb.noted() <= held,
        "the session noted {} names for a capsule of {held} records",
        sb.noted()
    );
}

/// Coded symbols come in doubling batches: a responder that answers with fewer (an empty
/// batch, say, to make the initiator decode its whole set again and again) is refused.
#[test]
fn coded_symbol_batches_below_the_schedule_are_refused() {
    let placement: Vec<u8> = (0..40).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(40, 5, &placement, &[]);
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    sa.start().unwrap();
    let e = sa.handle(SyncMsg::Symbols(vec![])).unwrap_err();
    assert!(e.to_string().contains("fewer"), "{e}");
    // The honest schedule still converges.
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
}

/// When set reconciliation gives up, the responder's name list and the initiator's wanted
/// names travel a page per message, and the replicas still converge exactly: a capsule
/// of millions of records used to need one message holding every name, larger than a
/// frame, so such a replica could never catch up.
#[test]
fn name_lists_travel_in_pages_when_reconciliation_gives_up() {
    // Two disjoint halves of equal size: the coded symbols double from 32 and reach the
    // initiator's cap (2 × 224 + 64 = 512) with 512, too few to decode 448 differences
    // (a rateless IBLT needs about 1.35 symbols a difference).
    let placement: Vec<u8> = (0..448).map(|i| (i % 2) as u8).collect();
    let (a, b, c, all) = scenario_in(BodyCipher::Plaintext, 448, 1, &placement, &[]);
    const PAGE: usize = 16;
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    sa.set_name_page(PAGE);
    sb.set_name_page(PAGE);
    let (mut name_pages, mut want_pages) = (0, 0);
    let mut msg = Some(sa.start().unwrap());
    let mut to_b = true;
    while let Some(m) = msg {
        match &m {
            SyncMsg::Names { names, .. } => {
                assert!(names.len() <= PAGE, "a page of {} names", names.len());
                name_pages += 1;
            }
            SyncMsg::Exchange { want, .. } | SyncMsg::Patch { want, .. } => {
                assert!(want.len() <= PAGE, "{} wanted names at once", want.len());
                assert!(to_b || want.is_empty(), "the responder asked for names");
                want_pages += usize::from(!want.is_empty());
            }
            _ => {}
        }
        msg = if to_b { sb.handle(m) } else { sa.handle(m) }.unwrap();
        to_b = !to_b;
    }
    let (ra, rb) = (sa.report(), sb.report());
    assert!(ra.fallback && rb.fallback, "{ra:?} {rb:?}");
    // 224 names in pages of 16; 224 wanted names likewise.
    assert_eq!(name_pages, 14);
    assert_eq!(want_pages, 14);
    assert_eq!(present(&a, &c), all);
    assert_eq!(present(&b, &c), all);
    assert_eq!(proven(&a, &c), all);
    assert_eq!(proven(&b, &c), all);
    assert_eq!(a.heads_roots(&c).unwrap(), b.heads_roots(&c).unwrap());
    assert!(sa.is_finished() && sb.is_finished());
    let (again, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(again.quick_match, "{again:?}");
}

/// A Hello's claimed set size does not buy coded symbols: however many times it is asked
/// for more, the responder sends at most twice its own set (plus 64) and then its name
/// list, whether the claim is huge (a large first batch) or its own size (small batches
/// doubling up to the cap).
#[test]
fn a_claimed_count_does_not_buy_coded_symbols() {
    // 300 records, each signed: about 200 on B.
    let placement: Vec<u8> = (0..300).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(300, 1, &placement, &[]);
    let since = SyncState::new(&b, c, a.public_key()).unwrap().names();
    assert!(since > 100, "{since}");
    let cap = 2 * since + 64;
    for count in [u64::MAX, since as u64, 0] {
        let hello = hello_msg(
            c,
            count,
            a.sign_sync_hello(&c, &b.public_key(), &[0; 32], count),
        );
        let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
        let mut reply = sb.handle(hello).unwrap();
        let (mut symbols, mut batches) = (0, 0);
        let names = loop {
            match reply {
                Some(SyncMsg::Symbols(batch)) => {
                    symbols += batch.len();
                    batches += 1;
                    assert!(
                        symbols <= cap,
                        "{symbols} symbols, cap {cap} (count {count})"
                    );
                    reply = sb.handle(SyncMsg::More).unwrap();
                }
                Some(SyncMsg::Names { names, more }) => {
                    assert!(!more);
                    break names;
                }
                other => panic!("expected symbols or names, got {other:?}"),
            }
        };
        assert_eq!(names.len(), since);
        assert!(sb.report().fallback);
        if count == since as u64 {
            assert!(batches > 2, "{batches} batches (count {count})");
        }
        // Asked for more again, it refuses.
        assert!(sb.handle(SyncMsg::More).is_err());
    }
}

/// An initiator holding far more than the responder still converges when the responder
/// ends the coded symbols on its own and sends its (short) name list instead.
#[test]
fn a_responder_with_a_small_set_sends_its_names_instead_of_symbols() {
    // 400 records on A, every 40th also on B.
    let placement: Vec<u8> = (0..400).map(|i| if i % 40 == 0 { 2 } else { 0 }).collect();
    let (a, b, c, all) = scenario(400, 7, &placement, &[]);
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let mut msg = Some(sa.start().unwrap());
    let (mut to_b, mut unasked_names) = (true, false);
    let mut last_to_b = None;
    while let Some(m) = msg {
        if let (SyncMsg::Names { .. }, Some(SyncMsg::More)) = (&m, &last_to_b) {
            unasked_names = true;
        }
        if to_b {
            last_to_b = Some(m.clone());
        }
        msg = if to_b { sb.handle(m) } else { sa.handle(m) }.unwrap();
        to_b = !to_b;
    }
    assert!(
        unasked_names,
        "the responder answered More with its name list"
    );
    let (ra, rb) = (sa.report(), sb.report());
    assert!(ra.fallback && rb.fallback, "{ra:?} {rb:?}");
    assert!(rb.symbols <= 2 * 11 + 64, "{rb:?}");
    assert_eq!(present(&a, &c), all);
    assert_eq!(present(&b, &c), all);
    assert_eq!(proven(&b, &c), all);
    let (again, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(again.quick_match, "{again:?}");
}

/// A peer cannot keep the initiator asking for pages: a page announcing more must hold
/// names.
#[test]
fn an_empty_name_page_announcing_more_is_refused() {
    let placement: Vec<u8> = (0..448).map(|i| (i % 2) as u8).collect();
    let (a, b, c, _) = scenario_in(BodyCipher::Plaintext, 448, 1, &placement, &[]);
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    let mut msg = sa.start().unwrap();
    loop {
        msg = sb.handle(msg).unwrap().unwrap();
        match sa.handle(msg).unwrap().unwrap() {
            SyncMsg::SendNames { from: 0 } => break,
            SyncMsg::More => msg = SyncMsg::More,
            other => panic!("expected the fallback, got {other:?}"),
        }
    }
    let e = sa
        .handle(SyncMsg::Names {
            names: vec![],
            more: true,
        })
        .unwrap_err();
    assert!(e.to_string().contains("empty page"), "{e}");
}

/// A peer cannot keep a responder's session going with pages of wanted names that name
/// nothing it sends: such rounds count against the round limit like empty ones, so the
/// session ends with an error. (A page of names is progress only when it names records
/// of the responder's set not sent yet.)
#[test]
fn made_up_wanted_names_do_not_keep_a_session_going() {
    let placement: Vec<u8> = (0..40).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(40, 5, &placement, &[]);
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    sb.handle(hello_msg(
        c,
        10,
        a.sign_sync_hello(&c, &b.public_key(), &[0; 32], 10),
    ))
    .unwrap();
    let empty = || SyncMsg::Exchange {
        records: vec![],
        want: vec![],
        heads: vec![],
        roots: vec![],
        missing: vec![],
    };
    sb.handle(empty()).unwrap();
    let bogus = RecordName(HashAlgo::Blake3.digest(b"no such record"));
    let mut ended = None;
    for round in 0..1000 {
        let patch = SyncMsg::Patch {
            records: vec![],
            want: vec![bogus],
            heads: vec![],
            roots: vec![],
            missing: vec![],
        };
        match sb.handle(patch) {
            Ok(Some(SyncMsg::Patch { .. })) => {}
            Ok(other) => panic!("round {round}: {other:?}"),
            Err(e) => {
                ended = Some((round, e));
                break;
            }
        }
    }
    let (round, e) = ended.expect("the session went on for 1000 rounds");
    assert!(
        round <= cairn_capsule::sync::MAX_ROUNDS + 1,
        "ended after {round} rounds"
    );
    assert!(e.to_string().contains("did not converge"), "{e}");
}

/// Nor do records the responder holds unproven (unsigned ones anyone may write there
/// first), sent back one a round: an honest peer sends proven records only, and each
/// round walked the capsule under its lock, for as many rounds as such records.
#[test]
fn unproven_records_sent_back_do_not_keep_a_session_going() {
    let placement: Vec<u8> = (0..40).map(|i| (i % 3) as u8).collect();
    let (a, b, c, _) = scenario(40, 5, &placement, &[]);
    let junk: Vec<Record> = (0..200u32)
        .map(|i| Record::new(c, format!("junk {i}").into_bytes(), vec![]))
        .collect();
    b.write(&c, &junk, &[]).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    sb.handle(hello_msg(
        c,
        10,
        a.sign_sync_hello(&c, &b.public_key(), &[0; 32], 10),
    ))
    .unwrap();
    sb.handle(SyncMsg::Exchange {
        records: vec![],
        want: vec![],
        heads: vec![],
        roots: vec![],
        missing: vec![],
    })
    .unwrap();
    let mut ended = None;
    for (round, r) in junk.iter().enumerate() {
        let patch = SyncMsg::Patch {
            records: vec![SyncRecord {
                header: r.header.clone(),
                body: SyncBody::Plain(r.body.clone()),
                signature: None,
            }],
            want: vec![],
            heads: vec![],
            roots: vec![],
            missing: vec![],
        };
        match sb.handle(patch) {
            Ok(Some(SyncMsg::Patch { .. })) => {}
            Ok(other) => panic!("round {round}: {other:?}"),
            Err(e) => {
                ended = Some((round, e));
                break;
            }
        }
    }
    let (round, e) = ended.expect("the session went on for 200 rounds");
    assert!(
        round <= cairn_capsule::sync::MAX_ROUNDS + 1,
        "ended after {round} rounds"
    );
    assert!(e.to_string().contains("did not converge"), "{e}");
}

/// Unsigned records anyone may write (here 60 lone heads and roots on each side) do not
/// crowd a replica's heads, roots and holes out of its messages: each list is cut to its
/// limit with the proven names first, and the replicas still converge exactly on every
/// signed record. Before, a million such records made every message larger than a frame.
#[test]
fn unsigned_records_do_not_crowd_the_shape_lists_out() {
    let placement: Vec<u8> = (0..120)
        .map(|i| if i < 20 { 2 } else { (i % 2) as u8 })
        .collect();
    let (a, b, c, all) = scenario_in(BodyCipher::Plaintext, 120, 7, &placement, &[0, 1, 2]);
    for (s, tag) in [(&a, "a"), (&b, "b")] {
        let junk: Vec<Record> = (0..60u32)
            .map(|i| Record::new(c, format!("junk {tag} {i}").into_bytes(), vec![]))
            .collect();
        s.write(&c, &junk, &[]).unwrap();
    }
    const CUT: usize = 8;
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sb = SyncSession::new(&b, c, a.public_key()).unwrap();
    sa.set_shape_list(CUT);
    sb.set_shape_list(CUT);
    let mut msg = Some(sa.start().unwrap());
    let mut to_b = true;
    while let Some(m) = msg {
        if let SyncMsg::Exchange {
            heads,
            roots,
            missing,
            ..
        }
        | SyncMsg::Patch {
            heads,
            roots,
            missing,
            ..
        } = &m
        {
            assert!(heads.len() <= CUT && roots.len() <= CUT && missing.len() <= CUT);
            // The cut keeps proven heads first: those are what the peer's walk needs (a
            // proven record no proven record points to is a head of the whole DAG too,
            // unless unsigned records point to it).
            let sender = if to_b { &a } else { &b };
            let proven: Vec<RecordName> = sender
                .with_dag(&c, |d| {
                    d.heads().into_iter().filter(|h| d.is_proven(h)).collect()
                })
                .unwrap();
            if proven.len() <= CUT {
                assert!(proven.iter().all(|h| heads.contains(h)), "{heads:?}");
            } else {
                assert!(heads.iter().all(|h| proven.contains(h)), "{heads:?}");
            }
        }
        msg = if to_b { sb.handle(m) } else { sa.handle(m) }.unwrap();
        to_b = !to_b;
    }
    assert!(sa.is_finished() && sb.is_finished());
    assert_eq!(proven(&a, &c), all);
    assert_eq!(proven(&b, &c), all);
}

/// Runs a session between `a` (initiator) and `b` with a budget of one record per message
/// on both sides.
fn sync_one_record_per_message(
    a: &CapsuleServer,
    b: &CapsuleServer,
    c: &CapsuleName,
) -> cairn_core::Result<(SyncReport, SyncReport)> {
    let mut sa = SyncSession::new(a, *c, b.public_key())?;
    let mut sb = SyncSession::new(b, *c, a.public_key())?;
    sa.set_budget(1);
    sb.set_budget(1);
    let mut msg = Some(sa.start()?);
    let mut to_b = true;
    while let Some(m) = msg {
        msg = if to_b { sb.handle(m)? } else { sa.handle(m)? };
        to_b = !to_b;
    }
    Ok((sa.report(), sb.report()))
}

/// A replica restarted (its sync cursors are kept in memory) compares its whole log with a
/// peer that compares only its new records: the sets differ in hundreds of records both
/// hold. Either way round the session converges: an initiator does not ask for records it
/// holds proven, and records the peer sends that this side held already count as progress
/// the first time (they used to count as rounds that moved nothing, and past 64 of them
/// every later session failed for good).
#[test]
fn a_replica_that_lost_its_cursor_still_converges() {
    let store_b: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let open_b = || {
        CapsuleServer::new(
            store_b.clone(),
            SigningKey::from_seed(&[2; 32]),
            ServerOptions::default(),
        )
    };
    let a = server(1);
    let b = open_b();
    let wk = SigningKey::from_seed(&[7; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "restart");
    meta.cipher = BodyCipher::Plaintext;
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, None).unwrap();
    let mut tip: Option<RecordName> = None;
    let mut write = |a: &CapsuleServer, b: &CapsuleServer, i: usize| {
        let r = Record::new(c, format!("r{i}").into_bytes(), tip.into_iter().collect());
        tip = Some(both_signed(a, b, &c, &w, r));
    };
    for i in 0..150 {
        write(&a, &b, i);
    }
    sync_pair(&a, &b, &c).unwrap();
    // B restarts: its cursors are gone, A's are not. New records on both.
    drop(b);
    let b = open_b();
    for i in 150..155 {
        write(&a, &b, i);
    }
    let (ra, rb) = sync_one_record_per_message(&a, &b, &c).unwrap();
    assert_eq!(ra.accepted + rb.accepted, 0, "{ra:?} {rb:?}");
    // A asked for none of the records it holds.
    assert_eq!(rb.sent, 0, "{rb:?}");
    assert_eq!(present(&a, &c), present(&b, &c));
    // The restarted side starting the session sends its whole log, which the other side
    // holds: that is progress the first time, and the session ends.
    drop(b);
    let b = open_b();
    let (rb, ra) = sync_one_record_per_message(&b, &a, &c).unwrap();
    assert_eq!(ra.accepted + rb.accepted, 0, "{ra:?} {rb:?}");
    assert!(ra.duplicate > 64, "{ra:?}");
    // And then the replicas are in sync.
    let (ra, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(ra.quick_match, "{ra:?}");
}

/// A signature that reaches an old record both replicas hold unproven travels at the next
/// sync: sessions compare records in the order they became proven, so a record signed long
/// after it was accepted comes when it is signed. (Before, a cursor kept the newest 4096
/// unproven records to look at again; an older one signed later was compared by neither
/// side, the quick check found them in sync, and one replica never proved it.)
#[test]
fn a_signature_on_an_old_record_both_hold_travels() {
    let Pair { a, b, c, w, seal } = pair("late");
    let mut names = Vec::new();
    let mut prev: Option<RecordName> = None;
    for i in 0..4200 {
        let r = Record::new(c, seal(&format!("u{i}")), prev.into_iter().collect());
        prev = Some(r.name());
        names.push(r.name());
        for s in [&a, &b] {
            s.write(&c, std::slice::from_ref(&r), &[]).unwrap();
        }
    }
    sync_pair(&a, &b, &c).unwrap();
    // The writer signs the very first record, at A only.
    let first = names[0];
    a.sign(&c, &first, w.sign(&first)).unwrap();
    assert!(a.with_dag(&c, |d| d.is_proven(&first)).unwrap());
    assert!(!b.with_dag(&c, |d| d.is_proven(&first)).unwrap());
    sync_pair(&a, &b, &c).unwrap();
    assert!(b.with_dag(&c, |d| d.is_proven(&first)).unwrap());
    let (ra, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(ra.quick_match, "{ra:?}");
}

/// A signature added to a record both replicas already hold proven (by a signed child)
/// reaches the other replica, whichever starts the session: the signature is news to a
/// replica holding the record unsigned, though the record is not (the record goes into the
/// proven order again when signed, and a responder sends it unasked, since an initiator
/// does not ask for a record it holds proven; before, a responder's never travelled, and
/// the quick check then said in sync for good).
fn a_late_signature_travels(a_starts: bool) {
    let Pair { a, b, c, w, seal } = pair(if a_starts { "late-a" } else { "late-b" });
    let r = Record::new(c, seal("r"), vec![]);
    let child = Record::new(c, seal("child"), vec![r.name()]);
    for s in [&a, &b] {
        s.write(
            &c,
            &[r.clone(), child.clone()],
            &[(child.name(), w.sign(&child.name()))],
        )
        .unwrap();
        assert!(s.with_dag(&c, |d| d.is_proven(&r.name())).unwrap());
    }
    sync_pair(&a, &b, &c).unwrap();
    a.sign(&c, &r.name(), w.sign(&r.name())).unwrap();
    let signed = |s: &CapsuleServer| s.with_dag(&c, |d| d.signature(&r.name()).is_some());
    assert!(signed(&a).unwrap() && !signed(&b).unwrap());
    let (first, second) = if a_starts { (&a, &b) } else { (&b, &a) };
    sync_pair(first, second, &c).unwrap();
    assert!(signed(&b).unwrap(), "the signature reached B");
    // And the replicas settle: a session or two later, the quick check matches.
    let mut quick = false;
    for _ in 0..3 {
        quick = sync_pair(first, second, &c).unwrap().0.quick_match;
        if quick {
            break;
        }
    }
    assert!(quick);
}

#[test]
fn a_signature_on_a_record_already_proven_travels() {
    a_late_signature_travels(true);
}

#[test]
fn a_late_signature_reaches_an_initiator_holding_the_record_unsigned() {
    a_late_signature_travels(false);
}

/// Copies of one record in a batch are checked at most once with a signature and once
/// without: a thousand copies each carrying a wrong signature cost one verification (they
/// cost a thousand, under the capsule's lock), and the record still comes in unsigned,
/// proven by its signed child.
#[test]
fn copies_of_a_record_are_checked_once_a_kind() {
    let Pair { a, c, w, seal, .. } = pair("copies");
    let r = Record::new(c, seal("r"), vec![]);
    let child = Record::new(c, seal("child"), vec![r.name()]);
    let copy = |signature| SyncRecord {
        header: r.header.clone(),
        body: SyncBody::Plain(r.body.clone()),
        signature,
    };
    // A well-formed signature, of another record.
    let wrong = w.sign(&child.name());
    let mut batch: Vec<SyncRecord> = (0..1000).map(|_| copy(Some(wrong))).collect();
    batch.push(copy(None));
    batch.push(SyncRecord {
        header: child.header.clone(),
        body: SyncBody::Plain(child.body.clone()),
        signature: Some(w.sign(&child.name())),
    });
    let report = a.apply_sync(&c, &batch).unwrap();
    assert_eq!(report.corrupt, 1, "{report:?}");
    assert_eq!(report.accepted, 2, "{report:?}");
    assert!(a.with_dag(&c, |d| d.is_proven(&r.name())).unwrap());
    assert!(
        a.with_dag(&c, |d| d.signature(&r.name()).is_none())
            .unwrap()
    );
    // Held now: copies of it are duplicates, and only one bringing a signature the
    // capsule lacks is verified (and refused, being wrong).
    let report = a
        .apply_sync(&c, &[copy(Some(wrong)), copy(Some(wrong)), copy(None)])
        .unwrap();
    assert_eq!((report.corrupt, report.duplicate), (1, 2), "{report:?}");
}

/// Two replicas A and B of one capsule, each listing the other in `sync_peers` (so their
/// sync cursors are kept in their stores), and the capsule's writer.
struct Listed {
    ka: SigningKey,
    kb: SigningKey,
    opts: fn(&SigningKey) -> ServerOptions,
    sb: Arc<dyn Store>,
    a: CapsuleServer,
    b: CapsuleServer,
    c: CapsuleName,
    w: Writer,
}

fn listed_pair(description: &str) -> Listed {
    let (ka, kb) = (
        SigningKey::from_seed(&[1; 32]),
        SigningKey::from_seed(&[2; 32]),
    );
    let opts: fn(&SigningKey) -> ServerOptions = |peer| ServerOptions {
        sync_peers: Some(vec![peer.public()]),
        ..ServerOptions::default()
    };
    let (sa, sb): (Arc<dyn Store>, Arc<dyn Store>) =
        (Arc::new(MemoryStore::new()), Arc::new(MemoryStore::new()));
    let a = CapsuleServer::new(sa, ka.clone(), opts(&kb));
    let b = CapsuleServer::new(sb.clone(), kb.clone(), opts(&ka));
    let wk = SigningKey::from_seed(&[7; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), description);
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let w = Writer::new(meta, wk, Some(BodyKey([3; 32]))).unwrap();
    Listed {
        ka,
        kb,
        opts,
        sb,
        a,
        b,
        c,
        w,
    }
}

/// A replica listed in `sync_peers` keeps its sync cursor across a restart: after one
/// side restarts, the next session compares only the records proven since, as before the
/// restart (a stranger's cursor stays in memory only, and the store holds no ref of it).
#[test]
fn listed_replicas_keep_their_sync_cursor_across_a_restart() {
    let Listed {
        ka,
        kb,
        opts,
        sb,
        a,
        b,
        c,
        mut w,
    } = listed_pair("cursor");
    let mut write = |s: &CapsuleServer, n: usize| {
        for i in 0..n {
            let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
            let sig = vec![(r.name(), w.sign(&r.name()))];
            s.write(&c, std::slice::from_ref(&r), &sig).unwrap();
        }
    };
    write(&a, 500);
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
    // B restarts; A writes a few more.
    drop(b);
    let b = CapsuleServer::new(sb.clone(), kb.clone(), opts(&ka));
    write(&a, 3);
    let (ra, rb) = sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
    assert_eq!(rb.accepted, 3, "{ra:?} {rb:?}");
    assert!(
        ra.symbols <= 64,
        "the whole log was compared again: {ra:?} {rb:?}"
    );
    assert!(!ra.fallback, "{ra:?}");
    // One ref: B's cursor of A.
    let refs = |s: &Arc<dyn Store>| s.list_refs(b"capsule-sync/").unwrap();
    assert_eq!(refs(&sb).len(), 1);
    assert!(
        refs(&sb)[0]
            .0
            .ends_with(hex::encode(ka.public().raw()).as_bytes())
    );
    // Without the listing, the restarted side compares its whole log (and keeps no ref).
    let plain_b = CapsuleServer::new(sb.clone(), kb, ServerOptions::default());
    write(&a, 3);
    let (ra, rb) = sync_pair(&a, &plain_b, &c).unwrap();
    assert_eq!(rb.accepted, 3, "{ra:?} {rb:?}");
    assert!(ra.symbols > 64 || ra.fallback, "{ra:?} {rb:?}");
    let before = refs(&sb);
    drop(plain_b);
    let plain_b = CapsuleServer::new(
        sb.clone(),
        SigningKey::from_seed(&[2; 32]),
        ServerOptions::default(),
    );
    write(&a, 3);
    sync_pair(&a, &plain_b, &c).unwrap();
    assert_eq!(refs(&sb), before, "a cursor kept for a peer nobody listed");
}

/// A record handed to `apply_sync` whose header the journal's decoder would refuse (built
/// in memory: more backpointers than a header may hold) is refused and counted, as the
/// write paths refuse it, not journaled where it would keep the capsule from loading.
#[test]
fn apply_sync_refuses_a_header_the_journal_could_not_reload() {
    let (a, _, c, _) = scenario(4, 1, &[0, 0, 0, 0], &[]);
    let wk = SigningKey::from_seed(&[7; 32]);
    let w = Writer::new(a.metadata(&c).unwrap(), wk, None).unwrap();
    let backpointers: Vec<RecordName> = (0..1025u32)
        .map(|i| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes())))
        .collect();
    let mut r = Record::new(c, b"too many backpointers".to_vec(), backpointers);
    r.header.backpointers.dedup();
    let name = r.name();
    let body = match &r.header.body {
        BodyRef::Plain { .. } => SyncBody::Plain(r.body.clone()),
        _ => unreachable!(),
    };
    let before = present(&a, &c);
    let report = a
        .apply_sync(
            &c,
            &[SyncRecord {
                header: r.header.clone(),
                body,
                signature: Some(w.sign(&name)),
            }],
        )
        .unwrap();
    assert_eq!(report.corrupt, 1, "{report:?}");
    assert_eq!(present(&a, &c), before);
}

/// A record whose stored chunks are gone here is left out of what this side sends, and
/// counted: the session still carries the rest (it failed as a whole, in every later
/// session too), and the cursor stays, so the record is offered again.
#[test]
fn a_record_unreadable_here_does_not_stop_the_session() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = CapsuleServer::new(
        store.clone(),
        SigningKey::from_seed(&[1; 32]),
        ServerOptions::default(),
    );
    let b = server(2);
    let wk = SigningKey::from_seed(&[7; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "unreadable");
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let w = Writer::new(meta.clone(), wk, None).unwrap();
    let lost = Record::new(c, b"lost".to_vec(), vec![]);
    let kept = Record::new(c, b"kept".to_vec(), vec![]);
    let before: BTreeSet<_> = store.cids().unwrap().into_iter().collect();
    a.write(
        &c,
        std::slice::from_ref(&lost),
        &[(lost.name(), w.sign(&lost.name()))],
    )
    .unwrap();
    let added: Vec<_> = store
        .cids()
        .unwrap()
        .into_iter()
        .filter(|x| !before.contains(x))
        .collect();
    assert!(!added.is_empty());
    a.write(
        &c,
        std::slice::from_ref(&kept),
        &[(kept.name(), w.sign(&kept.name()))],
    )
    .unwrap();
    store.remove(&added).unwrap();
    for _ in 0..2 {
        let (_, ra) = sync_pair(&b, &a, &c).unwrap();
        assert_eq!(ra.unreadable, 1, "{ra:?}");
        assert!(present(&b, &c).contains(&kept.name()));
        assert!(!present(&b, &c).contains(&lost.name()));
    }
}

/// Lu's walk goes at most `depth` records from a peer's stale head: naming the capsule's
/// first record as its head made every message of a session walk (and hold the names of)
/// the whole capsule, under its lock. A session still converges, a few records a round
/// at first.
#[test]
fn the_walk_from_a_stale_head_is_bounded_by_depth() {
    let Pair { a, b, c, w, seal } = pair("stale-head");
    let chain = chain_of(c, &seal, 300);
    let last = chain[299].name();
    a.write(&c, &chain, &[(last, w.sign(&last))]).unwrap();
    let first = chain[0].name();
    let out = a.lu_patch(&c, &[first], &[], &[], 4).unwrap();
    // Four up from the stale head, and this side's head with four below it.
    assert!(out.len() <= 10, "{} names", out.len());
    // B holds the first record only (proven by its own signature): the sessions still
    // bring it the whole chain.
    b.write(&c, &chain[..1], &[(first, w.sign(&first))])
        .unwrap();
    sync_pair(&b, &a, &c).unwrap();
    assert_eq!(present(&b, &c), present(&a, &c));
}

/// A finished session moves the cursor on over records the peer holds, but not over one
/// signed after a chain proved it: the peer may hold it unsigned (it may have sent it), and
/// past that entry the signature would never travel.
#[test]
fn the_cursor_does_not_pass_a_late_signature() {
    let Pair { a, b, c, w, seal } = pair("cursor-late");
    let chain = chain_of(c, &seal, 10);
    let last = chain[9].name();
    a.write(&c, &chain, &[(last, w.sign(&last))]).unwrap();
    let peer = b.public_key();
    // A session comparing the first four records; the peer turns out to hold all of them.
    let (_, next) = a.since_last_sync_within(&c, &peer, 4).unwrap();
    let r = chain[6].name();
    a.sign(&c, &r, w.sign(&r)).unwrap();
    let all: std::collections::HashSet<RecordName> = chain.iter().map(Record::name).collect();
    a.finish_sync(&c, &peer, next, &all).unwrap();
    let (left, _) = a.since_last_sync(&c, &peer).unwrap();
    assert_eq!(left, vec![r], "the late signature is compared next time");
}

/// A record that arrives by anti-entropy with its own signature is signed from the start,
/// not first proven by a chain through the batch's other records and then "signed late"
/// (which made every such record travel again, unasked, and held finished sessions'
/// cursors back), and a replay of the journal gives the same proven order.
#[test]
fn records_synced_with_their_signatures_are_not_signed_late() {
    let Pair { a, b, c, w, seal } = pair("synced-signed");
    let chain = chain_of(c, &seal, 12);
    // Signed in the middle and at the end, in one write.
    let sigs: Vec<_> = [3, 7, 11]
        .iter()
        .map(|&i| (chain[i].name(), w.sign(&chain[i].name())))
        .collect();
    a.write(&c, &chain, &sigs).unwrap();
    assert_eq!(a.with_dag(&c, |d| d.signed_late_count()).unwrap(), 0);
    sync_pair(&b, &a, &c).unwrap();
    assert_eq!(present(&b, &c), present(&a, &c));
    assert_eq!(b.with_dag(&c, |d| d.signed_late_count()).unwrap(), 0);
    for i in [3, 7, 11] {
        let n = chain[i].name();
        assert!(b.with_dag(&c, |d| d.signature(&n).is_some()).unwrap());
    }
    // The next session is a quick match at once.
    assert!(sync_pair(&b, &a, &c).unwrap().0.quick_match);
}

/// A record whose header a replica lost (bit rot; the capsule loads with a hole at its
/// place) comes back from a peer that holds it: anti-entropy asks for the hole, the copy
/// fills it at its old place, and the replicas agree again, after a restart too.
#[test]
fn a_record_lost_at_one_replica_comes_back_from_its_peer() {
    let placement = vec![2u8; 60];
    let (a, b, c, all) = scenario(60, 5, &placement, &[]);
    let lost = *all.iter().nth(17).unwrap();
    let store = a.store().clone();
    let log_before = a
        .with_dag(&c, |d| (d.log().size(), d.log().root()))
        .unwrap();
    drop(a);
    store.remove(&[*lost.hash()]).unwrap();
    let reopen = |store: &Arc<dyn Store>| {
        CapsuleServer::new(
            store.clone(),
            SigningKey::from_seed(&[1; 32]),
            ServerOptions::default(),
        )
    };
    let a = reopen(&store);
    assert!(a.read(&c, &lost).is_err());
    assert!(a.with_dag(&c, |d| d.has_damage()).unwrap());
    sync_pair(&a, &b, &c).unwrap();
    a.with_dag(&c, |d| {
        assert!(!d.has_damage() && d.contains(&lost));
        assert_eq!((d.log().size(), d.log().root()), log_before);
    })
    .unwrap();
    a.read(&c, &lost).unwrap();
    assert_eq!(proven(&a, &c), all);
    assert_eq!(a.heads_roots(&c).unwrap(), b.heads_roots(&c).unwrap());
    drop(a);
    let a = reopen(&store);
    assert_eq!(
        a.with_dag(&c, |d| (d.log().size(), d.log().root()))
            .unwrap(),
        log_before
    );
    assert_eq!(proven(&a, &c), all);
    a.audit(&c).unwrap();
}

/// A load that finds a hole drops the capsule's stored sync cursors (they count positions
/// in a proven order the load rebuilds otherwise), so the next session compares from the
/// start and nothing is passed over; later sessions go on from where they stopped, hole
/// or not. A copy arriving without its signature gets the one the journal kept.
#[test]
fn a_load_with_holes_drops_the_sync_cursors_and_a_copy_gets_its_signature_back() {
    let Listed {
        ka,
        kb,
        opts,
        sb,
        a,
        b,
        c,
        mut w,
    } = listed_pair("holes");
    let mut records = Vec::new();
    for i in 0..50 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let sig = vec![(r.name(), w.sign(&r.name()))];
        a.write(&c, std::slice::from_ref(&r), &sig).unwrap();
        records.push(r);
    }
    sync_pair(&a, &b, &c).unwrap();
    let refs = |s: &Arc<dyn Store>| s.list_refs(b"capsule-sync/").unwrap();
    assert_eq!(refs(&sb).len(), 1);
    // B loses a header and restarts: its stored cursor goes.
    drop(b);
    let lost = records[20].name();
    sb.remove(&[*lost.hash()]).unwrap();
    let b = CapsuleServer::new(sb.clone(), kb.clone(), opts(&ka));
    assert!(b.with_dag(&c, |d| d.is_damaged(&lost)).unwrap());
    assert!(refs(&sb).is_empty());
    // The copy comes back unsigned (a writer resending it): the journal's signature is
    // put back on it, so it is proven by its own signature, as before.
    let r = &records[20];
    b.write(&c, std::slice::from_ref(r), &[]).unwrap();
    b.with_dag(&c, |d| {
        assert!(d.contains(&lost) && !d.has_damage());
        assert!(d.signature(&lost).is_some());
        assert!(d.is_proven(&lost));
    })
    .unwrap();
    // Sessions go on, and converge.
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
    assert_eq!(a.heads_roots(&c).unwrap(), b.heads_roots(&c).unwrap());
    // After a restart the replay (the record journaled twice now) drops the cursors
    // again, and the replicas still agree.
    drop(b);
    let b = CapsuleServer::new(sb.clone(), kb, opts(&ka));
    assert!(!refs(&sb).is_empty(), "the sessions stored a cursor again");
    assert!(b.with_dag(&c, |d| d.signature(&lost).is_some()).unwrap());
    assert!(refs(&sb).is_empty(), "dropped as the capsule loaded");
    let (ra, _) = sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
    assert!(ra.quick_match || ra.symbols > 0);
}

/// Flips one byte in the middle of `marker` wherever it is stored under `dir` (bit rot of
/// a chunk in a log store's segment); panics if it is nowhere.
fn rot(dir: &std::path::Path, marker: &[u8]) {
    let mut hit = false;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let Ok(mut bytes) = std::fs::read(&path) else {
            continue;
        };
        let mut changed = false;
        let mut i = 0;
        while let Some(at) = bytes[i..].windows(marker.len()).position(|w| w == marker) {
            bytes[i + at + marker.len() / 2] ^= 0x20;
            i += at + marker.len();
            changed = true;
        }
        if changed {
            std::fs::write(&path, &bytes).unwrap();
            hit = true;
        }
    }
    assert!(hit, "marker not found under {}", dir.display());
}

/// Replica A on a log store in `dir` (opened again on each call), with key seed 1.
fn log_replica(dir: &std::path::Path) -> CapsuleServer {
    let store: Arc<dyn Store> = Arc::new(
        cairn_store::LogStore::open(dir, cairn_store::LogStoreOptions::default()).unwrap(),
    );
    CapsuleServer::new(
        store,
        SigningKey::from_seed(&[1; 32]),
        ServerOptions::default(),
    )
}

/// A plaintext capsule named `label` created on every server of `on`, and its writer
/// (bodies stored as written, so a test can find and rot them on disk).
fn plaintext_capsule(label: &str, on: &[&CapsuleServer]) -> (CapsuleName, Writer) {
    let wk = SigningKey::from_seed(&[7; 32]);
    let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), label);
    meta.cipher = BodyCipher::Plaintext;
    for s in on {
        s.create(&meta).unwrap();
    }
    (meta.name(), Writer::new(meta, wk, None).unwrap())
}

/// A record whose body rotted on one replica (its header, place and signature sound) is
/// found by a read or by `audit`, asked for in the next anti-entropy session like a hole,
/// and its body stored again from the peer's checked copy: readable, durable across a
/// restart, and the Merkle log unchanged. Before, a record already held was never taken
/// again, so the body stayed lost however many replicas held it.
#[test]
fn a_damaged_body_comes_back_from_a_peer() {
    let dir = tempfile::tempdir().unwrap();
    let a = log_replica(dir.path());
    let b = server(2);
    let (c, mut w) = plaintext_capsule("body rot", &[&a, &b]);
    let body = |i: usize| format!("body-of-record-{i:04}-with-room-to-rot").into_bytes();
    let mut names = Vec::new();
    for i in 0..20 {
        let r = w.record(&body(i), &[]).unwrap();
        let sigs = if i % 5 == 4 {
            vec![(r.name(), w.sign(&r.name()))]
        } else {
            vec![]
        };
        for s in [&a, &b] {
            s.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
        }
        names.push(r.name());
    }
    let log = |s: &CapsuleServer| {
        s.with_dag(&c, |d| (d.log().size(), d.log().root()))
            .unwrap()
    };
    let log_before = log(&a);
    drop(a);
    rot(dir.path(), &body(7));
    rot(dir.path(), &body(12));
    let a = log_replica(dir.path());
    // Not noted until read: `audit` reads every body and names the damage.
    assert!(a.with_dag(&c, |d| d.body_damaged().count()).unwrap() == 0);
    let err = a.audit(&c).unwrap_err().to_string();
    assert!(err.contains("2 record(s)"), "{err}");
    assert!(matches!(
        a.read(&c, &names[7]),
        Err(cairn_core::Error::Corrupt(_))
    ));
    let damaged: Vec<RecordName> = a
        .with_dag(&c, |d| d.body_damaged().copied().collect())
        .unwrap();
    let mut expected = vec![names[7], names[12]];
    expected.sort();
    assert_eq!(damaged, expected);
    // B starts the session: A's holes list names what it wants.
    let (rb, ra) = sync_pair(&b, &a, &c).unwrap();
    assert_eq!((ra.repaired, rb.repaired), (2, 0), "{ra:?} {rb:?}");
    for (i, n) in names.iter().enumerate() {
        assert_eq!(a.read(&c, n).unwrap().body, body(i));
    }
    assert_eq!(a.with_dag(&c, |d| d.body_damaged().count()).unwrap(), 0);
    assert_eq!(log(&a), log_before);
    a.audit(&c).unwrap();
    // Nothing left to do.
    let (ra, _) = sync_pair(&a, &b, &c).unwrap();
    assert!(ra.quick_match, "{ra:?}");
    drop(a);
    let a = log_replica(dir.path());
    a.audit(&c).unwrap();
    assert_eq!(a.read(&c, &names[7]).unwrap().body, body(7));
    assert_eq!(log(&a), log_before);
}

/// A damaged body is stored again when the record is written again (the writer still has
/// it), and a subrecord that rotted comes back from a peer, its record's list and other
/// subrecords kept.
#[test]
fn a_damaged_body_is_stored_again_by_a_write_and_a_subrecord_from_a_peer() {
    let dir = tempfile::tempdir().unwrap();
    let a = log_replica(dir.path());
    let b = server(2);
    let (c, mut w) = plaintext_capsule("subrecord rot", &[&a, &b]);
    let plain = w
        .record(b"a plain body that will rot on disk", &[])
        .unwrap();
    let ws = w.sign(&plain.name());
    a.write(&c, std::slice::from_ref(&plain), &[(plain.name(), ws)])
        .unwrap();
    let sub = |i: usize| format!("subrecord-{i:03}-with-room-to-rot").into_bytes();
    let subs: Vec<cairn_core::Hash> = (0..8)
        .map(|i| w.write_subrecord(&sub(i)).unwrap())
        .collect();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    for s in [&a, &b] {
        s.commit_subrecords(&c, &header, &sealed, Some(sig))
            .unwrap();
    }
    // A later write: damage in the store's last commit group is taken for a torn write at
    // recovery and cut off with it.
    let last = w.record(b"last", &[]).unwrap();
    let ws = w.sign(&last.name());
    a.write(&c, std::slice::from_ref(&last), &[(last.name(), ws)])
        .unwrap();
    drop(a);
    rot(dir.path(), b"a plain body that will rot");
    rot(dir.path(), &sub(5));
    let a = log_replica(dir.path());
    assert!(a.read(&c, &plain.name()).is_err());
    assert!(a.read_subrecord(&c, &subs[5]).is_err());
    assert!(
        a.with_dag(&c, |d| d.is_body_damaged(&plain.name())
            && d.is_body_damaged(&header.name()))
            .unwrap()
    );
    // The writer writes the plain record again (B never had it).
    a.write(&c, std::slice::from_ref(&plain), &[]).unwrap();
    assert_eq!(a.read(&c, &plain.name()).unwrap().body, plain.body);
    let (ra, _) = sync_pair(&a, &b, &c).unwrap();
    assert_eq!(ra.repaired, 1, "{ra:?}");
    for (i, s) in subs.iter().enumerate() {
        assert_eq!(a.read_subrecord(&c, s).unwrap(), sub(i));
    }
    assert!(a.with_dag(&c, |d| d.body_damaged().count() == 0).unwrap());
    drop(a);
    let a = log_replica(dir.path());
    a.audit(&c).unwrap();
    assert_eq!(a.read_subrecord(&c, &subs[5]).unwrap(), sub(5));
}

/// A capsule whose load must drop its stored sync cursors (a hole) still loads when the
/// store refuses that commit (a full disk): its records stay readable, and its sessions
/// ignore the stored cursors instead (the capsule failed to load, every read with it).
#[test]
fn a_store_refusing_to_drop_cursors_costs_the_cursors_not_the_capsule() {
    use cairn_store::{ChunkStore, RefStore};
    let (ka, kb) = (
        SigningKey::from_seed(&[1; 32]),
        SigningKey::from_seed(&[2; 32]),
    );
    let opts = |peer: &SigningKey| ServerOptions {
        sync_peers: Some(vec![peer.public()]),
        ..ServerOptions::default()
    };
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = refuse.clone();
    let sb = Arc::new(support::GatedCommits::new(move |_| {
        if gate.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(cairn_core::Error::Unavailable("the disk is full".into()));
        }
        Ok(())
    }));
    let a = CapsuleServer::new(Arc::new(MemoryStore::new()), ka.clone(), opts(&kb));
    let b = CapsuleServer::new(sb.clone(), kb.clone(), opts(&ka));
    let wk = SigningKey::from_seed(&[7; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "refused");
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let mut w = Writer::new(meta, wk, Some(BodyKey([3; 32]))).unwrap();
    let mut names = Vec::new();
    for i in 0..30 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let sig = vec![(r.name(), w.sign(&r.name()))];
        a.write(&c, std::slice::from_ref(&r), &sig).unwrap();
        names.push(r.name());
    }
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(b.sync_backlog(&c, &ka.public()).unwrap(), 0);
    assert_eq!(sb.inner.list_refs(b"capsule-sync/").unwrap().len(), 1);
    drop(b);
    sb.inner.remove(&[*names[12].hash()]).unwrap();
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    let b = CapsuleServer::new(sb.clone(), kb.clone(), opts(&ka));
    b.read(&c, &names[3]).unwrap();
    assert!(b.with_dag(&c, |d| d.is_damaged(&names[12])).unwrap());
    // The stored cursor is still there, and ignored: the next session compares all.
    assert_eq!(sb.inner.list_refs(b"capsule-sync/").unwrap().len(), 1);
    assert_eq!(b.sync_backlog(&c, &ka.public()).unwrap(), 29);
}

/// A session whose capsule is unloaded and loaded again while it runs, the reload finding
/// a hole (so another proven order), does not keep the position it took in the old order:
/// the next session compares from the start.
#[test]
fn a_session_across_a_reload_keeps_no_cursor_of_the_old_order() {
    let opts = ServerOptions {
        max_loaded_capsules: 1,
        ..ServerOptions::default()
    };
    let sb: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = server(1);
    let b = CapsuleServer::new(sb.clone(), SigningKey::from_seed(&[2; 32]), opts);
    let wk = SigningKey::from_seed(&[7; 32]);
    let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "reloaded");
    let other = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "other");
    let c = meta.name();
    a.create(&meta).unwrap();
    b.create(&meta).unwrap();
    let mut w = Writer::new(meta, wk, Some(BodyKey([3; 32]))).unwrap();
    let mut names = Vec::new();
    for i in 0..40 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let sig = vec![(r.name(), w.sign(&r.name()))];
        for s in [&a, &b] {
            s.write(&c, std::slice::from_ref(&r), &sig).unwrap();
        }
        names.push(r.name());
    }
    // A writes more, so the session has something to move.
    for i in 40..45 {
        let r = w.record(format!("r{i}").as_bytes(), &[]).unwrap();
        let sig = vec![(r.name(), w.sign(&r.name()))];
        a.write(&c, std::slice::from_ref(&r), &sig).unwrap();
    }
    let mut sa = SyncSession::new(&a, c, b.public_key()).unwrap();
    let mut sbs = SyncSession::new(&b, c, a.public_key()).unwrap();
    let hello = sa.start().unwrap();
    let mut msg = sbs.handle(hello).unwrap();
    // B's capsule is pushed out by another, and loads again with a hole.
    b.create(&other).unwrap();
    b.with_dag(&other.name(), |_| ()).unwrap();
    sb.remove(&[*names[10].hash()]).unwrap();
    assert!(b.with_dag(&c, |d| d.is_damaged(&names[10])).unwrap());
    let mut to_a = true;
    while let Some(m) = msg {
        msg = if to_a { sa.handle(m) } else { sbs.handle(m) }.unwrap();
        to_a = !to_a;
    }
    assert!(sbs.is_finished());
    let proven = b.with_dag(&c, |d| d.proven_order().len()).unwrap();
    assert_eq!(b.sync_backlog(&c, &a.public_key()).unwrap(), proven);
    // And the replicas agree after another session.
    sync_pair(&a, &b, &c).unwrap();
    assert_eq!(present(&a, &c), present(&b, &c));
}

/// A subrecord record whose subrecord rotted is stored again when the writer commits its
/// subrecords again (no peer needed), its place and list kept.
#[test]
fn a_damaged_subrecord_is_stored_again_by_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let a = log_replica(dir.path());
    let (c, mut w) = plaintext_capsule("recommit", &[&a]);
    let sub = |i: usize| format!("subrecord-{i:03}-recommitted-after-rot").into_bytes();
    let subs: Vec<cairn_core::Hash> = (0..4)
        .map(|i| w.write_subrecord(&sub(i)).unwrap())
        .collect();
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    a.commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    let last = w.record(b"last", &[]).unwrap();
    let ws = w.sign(&last.name());
    a.write(&c, std::slice::from_ref(&last), &[(last.name(), ws)])
        .unwrap();
    let log_before = a
        .with_dag(&c, |d| (d.log().size(), d.log().root()))
        .unwrap();
    drop(a);
    rot(dir.path(), &sub(2));
    let a = log_replica(dir.path());
    assert!(a.read_subrecord(&c, &subs[2]).is_err());
    assert!(
        a.with_dag(&c, |d| d.is_body_damaged(&header.name()))
            .unwrap()
    );
    a.commit_subrecords(&c, &header, &sealed, Some(sig))
        .unwrap();
    assert_eq!(a.read_subrecord(&c, &subs[2]).unwrap(), sub(2));
    assert!(
        !a.with_dag(&c, |d| d.is_body_damaged(&header.name()))
            .unwrap()
    );
    assert_eq!(
        a.with_dag(&c, |d| (d.log().size(), d.log().root()))
            .unwrap(),
        log_before
    );
    drop(a);
    let a = log_replica(dir.path());
    a.audit(&c).unwrap();
}
