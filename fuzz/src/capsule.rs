//! Targets for `cairn-capsule`'s decoders and verifiers: `capsule_metadata`,
//! `record_header`, `record_proof`, `subrecord_proof`, `subrecords_proof` (this module)
//! and `merkle_proofs` ([`crate::merkle`]).
//!
//! Every decoder must be canonical (a value that decodes re-encodes to exactly the input
//! bytes) and every verifier must return `Ok` or `Err`, never panic. The proof targets also
//! check soundness against a **fixture**: a small capsule built once per process by the real
//! writer and server ([`fixture`]), whose metadata comes from fixed seed keys and a fixed
//! creation time and whose bodies are plaintext, so the fixture (and therefore every seed
//! made from it) is the same in every process. A fuzzer cannot make hash preimages or
//! Ed25519 signatures, so any proof it builds that verifies against the fixture's metadata
//! must consist of the fixture's own headers, end at a signature the fixture's writers made
//! or at a name the verifier trusts, and cache only true Merkle nodes; anything else is a
//! forgery and panics.
//!
//! Proof target input (`record_proof`, `subrecord_proof`):
//!
//! ```text
//! u8 mode   bit 0 clear: "raw": the rest of the input is an encoded proof, verified for the
//!           fixture target (record or subrecord) numbered mode >> 1 (modulo; the last
//!           subrecord number is a name that is in no tree);
//!           bit 0 set: "mutation": next byte = which valid proof of the fixture (modulo),
//!           (`subrecord_proof` only) one byte = another subrecord to try the mutated
//!           proof for, then up to MAX_EDITS edits of 4 bytes applied to that proof's
//!           encoding; (`record_proof` only) with bit 1 also set, "read-and-prove": the
//!           valid proof is one without a session, the edits apply to
//!           `len (u32 LE) ‖ body ‖ proof`, and `Reader::verify_read` checks the pair:
//!
//! `subrecords_proof` (multiproofs): bit 0 clear, "raw": the rest is an encoded
//! multiproof, verified for the fixture's list of subrecords numbered mode >> 1 (modulo;
//! the last list holds a name that is in no tree); bit 0 set, "mutation": next byte =
//! which valid multiproof (modulo), then edits as above.
//!
//! u8 op     low 2 bits: 0 xor · 1 set · 2 insert · 3 delete
//! u16 off   little-endian, modulo the current length (length + 1 for insert)
//! u8 val
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use cairn_capsule::merkle::{self, MerkleLog};
use cairn_capsule::proof::{subrecord_leaf, subrecord_name};
use cairn_capsule::{
    Anchor, BodyCipher, CachePolicy, CapsuleMetadata, CapsuleServer, RecordHeader, RecordName,
    RecordProof, ServerOptions, SubrecordProof, SubrecordsProof, Writer,
};
use cairn_core::{Decoder, Encoder, Hash, HashAlgo, SigningKey};
use cairn_store::{MemoryStore, Store};

/// Most edits one mutation input applies. An encoded header is over 100 bytes, so 64
/// single-byte edits can damage headers but never remove or add a whole one: a mutated
/// proof that verifies can only be the original one.
pub const MAX_EDITS: usize = 64;

/// `capsule_metadata`: metadata that decodes must re-encode to exactly the input.
pub fn run_capsule_metadata(data: &[u8]) {
    if let Ok(m) = CapsuleMetadata::decode(data) {
        let again = m.encode();
        assert_eq!(
            again, data,
            "CapsuleMetadata::decode accepted non-canonical bytes: {m:?}"
        );
        assert_eq!(
            CapsuleMetadata::decode(&again).expect("re-encoding decodes"),
            m
        );
        assert_eq!(m.name().hash(), &m.algo.digest(data));
        for (i, w) in m.writers.iter().enumerate() {
            assert_eq!(m.writer_index(w), Some(i as u32), "writers are distinct");
        }
    }
}

/// `record_header`: a header that decodes must re-encode to exactly the input, and its name
/// is the hash of the input.
pub fn run_record_header(data: &[u8]) {
    if let Ok(h) = RecordHeader::decode(data) {
        let again = h.encode();
        assert_eq!(
            again, data,
            "RecordHeader::decode accepted non-canonical bytes: {h:?}"
        );
        assert_eq!(
            RecordHeader::decode(&again).expect("re-encoding decodes"),
            h
        );
        let algo = h.capsule.hash().algo();
        assert_eq!(h.name(), RecordName(algo.digest(data)));
    }
}

/// A valid record proof of the fixture and what verifying it must give.
pub struct ValidRecordProof {
    /// The record proved.
    pub target: RecordName,
    /// The proof as the server issued it.
    pub proof: RecordProof,
    /// Its encoding.
    pub bytes: Vec<u8>,
    /// Names `verify` returns for it.
    pub names: Vec<RecordName>,
    /// Names the verifier trusts (the session's cache when the server issued it in one).
    pub trusted: Vec<Hash>,
    /// The record's sealed body (its plaintext: the fixture's bodies are not encrypted).
    pub body: Vec<u8>,
}

/// A valid subrecord proof of the fixture and what verifying it must give.
pub struct ValidSubrecordProof {
    /// The subrecord proved.
    pub sub: Hash,
    /// The proof as the server issued it.
    pub proof: SubrecordProof,
    /// Its encoding.
    pub bytes: Vec<u8>,
    /// Tree nodes `verify` returns for it.
    pub nodes: Vec<Hash>,
    /// Record names `verify` returns for it.
    pub names: Vec<RecordName>,
    /// Names and nodes the verifier trusts.
    pub trusted: Vec<Hash>,
}

/// Where a subrecord of the fixture sits.
pub struct SubPosition {
    /// Its record.
    pub record: RecordName,
    /// Its index in the record's tree.
    pub index: u64,
    /// Every node of its true audit path, leaf first, root last.
    pub nodes: Vec<Hash>,
}

/// A capsule written by the real writer and server: 13 plain records (r0..r12, a chain;
/// r3, r7, r11 signed by writer 0), a subrecord record S1 (13 subrecords, signed), an
/// unsigned subrecord record S2 (6 subrecords) and a record r13 after it signed by writer 1.
pub struct Fixture {
    /// The capsule metadata (two writers).
    pub meta: CapsuleMetadata,
    /// Every header, by name.
    pub headers: HashMap<RecordName, RecordHeader>,
    /// Record names in writing order.
    pub names: Vec<RecordName>,
    /// Names some writer signed.
    pub signed: HashSet<RecordName>,
    /// Every subrecord, in order of its record then index.
    pub subs: Vec<Hash>,
    /// Where each subrecord sits.
    pub positions: HashMap<Hash, SubPosition>,
    /// What raw-mode verifications trust: the session cache of the session proofs.
    pub trusted: Vec<Hash>,
    /// Valid record proofs: one without a session per record, then session proofs.
    pub record_proofs: Vec<ValidRecordProof>,
    /// Valid subrecord proofs: one without a session per subrecord, then session proofs.
    pub subrecord_proofs: Vec<ValidSubrecordProof>,
    /// Lists of subrecords the multiproofs are for; the last holds a name in no tree.
    pub sub_lists: Vec<Vec<Hash>>,
    /// Valid multiproofs, for the lists without a session, then with one.
    pub subrecords_proofs: Vec<ValidSubrecordsProof>,
}

/// A valid multiproof of the fixture and what verifying it must give.
pub struct ValidSubrecordsProof {
    /// The list proved (one of [`Fixture::sub_lists`]).
    pub list: usize,
    /// Its encoding.
    pub bytes: Vec<u8>,
    /// What `verify_with` returns for it: per group, the root and the record names.
    pub verified: Vec<(Hash, Vec<RecordName>)>,
    /// Names the verifier trusts.
    pub trusted: Vec<Hash>,
}

/// Writer keys of the fixture.
pub fn fixture_keys() -> [SigningKey; 2] {
    [
        SigningKey::from_seed(&[0x11; 32]),
        SigningKey::from_seed(&[0x22; 32]),
    ]
}

/// The fixture's metadata: fixed keys and time, plaintext bodies.
pub fn fixture_meta() -> CapsuleMetadata {
    let [k0, k1] = fixture_keys();
    let mut settings = BTreeMap::new();
    settings.insert("consistency".to_string(), "available".to_string());
    CapsuleMetadata {
        algo: HashAlgo::Blake3,
        writers: vec![k0.public(), k1.public()],
        description: "cairn fuzz fixture".into(),
        created_ms: 1_790_000_000_000,
        cipher: BodyCipher::Plaintext,
        key_distribution: "none: plaintext".into(),
        settings,
    }
}

/// The fixture, built once per process.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(build_fixture)
}

fn subrecord_record(
    server: &CapsuleServer,
    w: &mut Writer,
    n: usize,
    tag: &str,
    sign: bool,
    f: &mut Fixture,
) {
    let c = w.capsule();
    let algo = f.meta.algo;
    let mut subs = Vec::new();
    for i in 0..n {
        subs.push(w.write_subrecord(format!("{tag} {i}").as_bytes()).unwrap());
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
    let name = header.name();
    server
        .commit_subrecords(&c, &header, &sealed, sign.then_some(sig))
        .unwrap();
    if sign {
        f.signed.insert(name);
    }
    let mut log = MerkleLog::new(algo);
    for s in &subs {
        log.push(subrecord_leaf(s));
    }
    for (i, s) in subs.iter().enumerate() {
        let i = i as u64;
        let path = log.inclusion_proof(i, log.size()).unwrap();
        let nodes = merkle::inclusion_nodes(algo, i, log.size(), &subrecord_leaf(s), &path)
            .into_iter()
            .map(|d| Hash::new(algo, d))
            .collect();
        f.positions.insert(
            *s,
            SubPosition {
                record: name,
                index: i,
                nodes,
            },
        );
    }
    f.subs.extend(subs);
    f.headers.insert(name, header);
    f.names.push(name);
}

fn build_fixture() -> Fixture {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[0x99; 32]),
        ServerOptions::default(),
    );
    let meta = fixture_meta();
    let c = meta.name();
    server.create(&meta).unwrap();
    let [k0, k1] = fixture_keys();
    let mut f = Fixture {
        meta: meta.clone(),
        headers: HashMap::new(),
        names: Vec::new(),
        signed: HashSet::new(),
        subs: Vec::new(),
        positions: HashMap::new(),
        trusted: Vec::new(),
        record_proofs: Vec::new(),
        subrecord_proofs: Vec::new(),
        sub_lists: Vec::new(),
        subrecords_proofs: Vec::new(),
    };
    let mut w = Writer::new(meta.clone(), k0, None).unwrap();
    for i in 0..13 {
        let r = w.record(format!("record {i}").as_bytes(), &[]).unwrap();
        let name = r.name();
        let sigs = if i % 4 == 3 {
            f.signed.insert(name);
            vec![(name, w.sign(&name))]
        } else {
            vec![]
        };
        server.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
        f.headers.insert(name, r.header);
        f.names.push(name);
    }
    subrecord_record(&server, &mut w, 13, "s1", true, &mut f);
    subrecord_record(&server, &mut w, 6, "s2", false, &mut f);
    let mut w1 = Writer::new(meta.clone(), k1, None).unwrap();
    w1.continue_from(&[*f.names.last().unwrap()]);
    let r = w1.record(b"record 13", &[]).unwrap();
    let name = r.name();
    f.signed.insert(name);
    server
        .write(&c, std::slice::from_ref(&r), &[(name, w1.sign(&name))])
        .unwrap();
    f.headers.insert(name, r.header);
    f.names.push(name);

    // The session cache: r5, r9, S2 and two inner nodes of S1's tree (above leaves 0..4
    // and 8..10).
    let s1 = f.names[13];
    let s2 = f.names[14];
    let node = |sub: usize, level: usize| f.positions[&f.subs[sub]].nodes[level];
    f.trusted = vec![
        *f.names[5].hash(),
        *f.names[9].hash(),
        *s2.hash(),
        node(0, 2),
        node(8, 1),
    ];
    let sid = server
        .open_session(&c, CachePolicy::Lru { capacity: 64 }, &f.trusted)
        .unwrap();
    for session in [false, true] {
        for n in f.names.clone() {
            let proof = server.prove(&c, &n, session.then_some(sid)).unwrap().proof;
            if session && !matches!(proof.anchor, Anchor::Cached) {
                continue;
            }
            let trusted = if session {
                f.trusted.clone()
            } else {
                Vec::new()
            };
            let names = proof.verify(&meta, &n, |h| trusted.contains(h)).unwrap();
            f.record_proofs.push(ValidRecordProof {
                target: n,
                bytes: proof.to_bytes(),
                proof,
                names,
                trusted,
                body: server.read(&c, &n).unwrap().body,
            });
        }
        for s in f.subs.clone() {
            let proof = server
                .prove_subrecord(&c, &s, session.then_some(sid))
                .unwrap()
                .proof;
            let full = f.positions[&s].nodes.len() - 1;
            if session && proof.path.len() == full && proof.record.is_none() {
                continue;
            }
            // A full proof is for a verifier that trusts none of its nodes: one that does
            // refuses it ("continues past a trusted node").
            let trusted = if session {
                f.trusted.clone()
            } else {
                Vec::new()
            };
            let (nodes, names) = proof.verify(&meta, &s, |h| trusted.contains(h)).unwrap();
            let mut e = Encoder::new();
            proof.encode(&mut e);
            f.subrecord_proofs.push(ValidSubrecordProof {
                sub: s,
                bytes: e.finish(),
                proof,
                nodes,
                names,
                trusted,
            });
        }
    }
    // Multiproofs: all of S1, all of S2, a mix of both out of order, a few of S1.
    let (s1_subs, s2_subs) = f.subs.split_at(13);
    f.sub_lists = vec![
        s1_subs.to_vec(),
        s2_subs.to_vec(),
        vec![s1_subs[3], s2_subs[5], s1_subs[12], s1_subs[0], s2_subs[1]],
        vec![s1_subs[1], s1_subs[2], s1_subs[7]],
    ];
    for session in [false, true] {
        for (list, subs) in f.sub_lists.iter().enumerate() {
            let proof = server
                .prove_subrecords(&c, subs, session.then_some(sid))
                .unwrap()
                .proof;
            let trusted = if session {
                f.trusted.clone()
            } else {
                Vec::new()
            };
            let verified = proof
                .verify_with(&meta, subs, |h| trusted.contains(h), |_, _| false)
                .unwrap();
            let mut e = Encoder::new();
            proof.encode(&mut e);
            f.subrecords_proofs.push(ValidSubrecordsProof {
                list,
                bytes: e.finish(),
                verified,
                trusted,
            });
        }
    }
    let mut stray = f.sub_lists[2].clone();
    stray.push(subrecord_name(f.meta.algo, b"not a subrecord"));
    f.sub_lists.push(stray);
    assert!(
        f.record_proofs
            .iter()
            .any(|p| p.proof.anchor == Anchor::Cached)
    );
    assert!(f.subrecord_proofs.iter().any(|p| p.proof.record.is_none()));
    assert!(
        f.positions
            .values()
            .all(|p| f.headers.contains_key(&p.record))
    );
    assert!(f.names.contains(&s1));
    f
}

/// Applies up to [`MAX_EDITS`] 4-byte edits (see the module documentation) to `bytes`.
pub fn apply_edits(bytes: &mut Vec<u8>, edits: &[u8]) {
    for e in edits.chunks_exact(4).take(MAX_EDITS) {
        let off = u16::from_le_bytes([e[1], e[2]]) as usize;
        let val = e[3];
        match e[0] & 3 {
            0 if !bytes.is_empty() => {
                let i = off % bytes.len();
                bytes[i] ^= val;
            }
            1 if !bytes.is_empty() => {
                let i = off % bytes.len();
                bytes[i] = val;
            }
            2 => bytes.insert(off % (bytes.len() + 1), val),
            3 if !bytes.is_empty() => {
                let i = off % bytes.len();
                bytes.remove(i);
            }
            _ => {}
        }
    }
}

/// Checks what `RecordProof::verify` returned for `p`: the names are the chain's, every
/// header is the fixture's, and the chain ends at a fixture signature or a trusted name.
fn check_record_names(
    f: &Fixture,
    p: &RecordProof,
    target: &RecordName,
    names: &[RecordName],
    trusted: &HashSet<Hash>,
) {
    assert_eq!(names.len(), p.chain.len(), "one name per header");
    assert_eq!(names[0], *target, "verified for another target");
    for (h, n) in p.chain.iter().zip(names) {
        assert_eq!(h.name(), *n);
        assert!(
            f.headers.get(n) == Some(h),
            "FORGERY: verified a header that is not the fixture's: {h:?}"
        );
    }
    let last = names[names.len() - 1];
    match &p.anchor {
        Anchor::Signed(_) => assert!(
            f.signed.contains(&last),
            "FORGERY: a signature verified on {last}, which no writer signed"
        ),
        Anchor::Cached => assert!(trusted.contains(last.hash()), "Cached anchor not trusted"),
    }
}

fn decode_record_proof(bytes: &[u8]) -> Option<RecordProof> {
    let p = RecordProof::from_bytes(bytes).ok()?;
    let again = p.to_bytes();
    assert_eq!(
        again, bytes,
        "RecordProof::from_bytes accepted non-canonical bytes: {p:?}"
    );
    assert_eq!(
        RecordProof::from_bytes(&again).expect("re-encoding decodes"),
        p
    );
    Some(p)
}

/// `record_proof` (input format in the module documentation).
pub fn run_record_proof(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    if mode & 1 == 0 {
        let target = f.names[(mode >> 1) as usize % f.names.len()];
        let trusted: HashSet<Hash> = f.trusted.iter().copied().collect();
        let Some(p) = decode_record_proof(rest) else {
            return;
        };
        let trust = |h: &Hash| trusted.contains(h);
        if let Ok(names) = p.verify(&f.meta, &target, trust) {
            check_record_names(f, &p, &target, &names, &trusted);
        }
        let own = p.chain[0].name();
        if let Ok(names) = p.verify(&f.meta, &own, trust) {
            check_record_names(f, &p, &own, &names, &trusted);
        }
        return;
    }
    let Some((&which, edits)) = rest.split_first() else {
        return;
    };
    if mode & 2 != 0 {
        run_read_and_prove(f, which, edits);
        return;
    }
    let v = &f.record_proofs[which as usize % f.record_proofs.len()];
    let mut bytes = v.bytes.clone();
    apply_edits(&mut bytes, edits);
    let Some(p) = decode_record_proof(&bytes) else {
        return;
    };
    let trusted: HashSet<Hash> = v.trusted.iter().copied().collect();
    let trust = |h: &Hash| trusted.contains(h);
    if let Ok(names) = p.verify(&f.meta, &v.target, trust) {
        check_record_names(f, &p, &v.target, &names, &trusted);
        assert_eq!(
            names, v.names,
            "FORGERY: mutated proof verifies another chain"
        );
        assert_eq!(
            p, v.proof,
            "mutated proof verifies but differs from the original"
        );
    }
    let own = p.chain[0].name();
    if let Ok(names) = p.verify(&f.meta, &own, trust) {
        check_record_names(f, &p, &own, &names, &trusted);
        assert_eq!(
            own, v.target,
            "FORGERY: mutated proof verifies another target"
        );
        assert_eq!(
            names, v.names,
            "FORGERY: mutated proof verifies another chain"
        );
    }
}

/// Read-and-prove: a valid `(body, proof)` answer without a session, laid out as
/// `len (u32 LE) ‖ body ‖ proof` and then edited; whatever `Reader::verify_read` accepts
/// must be exactly the record's body and proof.
fn run_read_and_prove(f: &Fixture, which: u8, edits: &[u8]) {
    let plain: Vec<&ValidRecordProof> = f
        .record_proofs
        .iter()
        .filter(|v| v.trusted.is_empty())
        .collect();
    let v = plain[which as usize % plain.len()];
    let mut bytes = (v.body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&v.body);
    bytes.extend_from_slice(&v.bytes);
    apply_edits(&mut bytes, edits);
    let Some((len, rest)) = bytes.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize;
    if len > rest.len() {
        return;
    }
    let (body, proof) = rest.split_at(len);
    let Some(p) = decode_record_proof(proof) else {
        return;
    };
    let mut reader = cairn_capsule::Reader::new(
        f.meta.name(),
        f.meta.clone(),
        CachePolicy::Lru { capacity: 64 },
        None,
    )
    .expect("fixture reader");
    reader.set_mirror_mode(cairn_capsule::cache::MirrorMode::OnIssue);
    match reader.verify_read(&v.target, body.to_vec(), &p) {
        Ok(opened) => {
            assert_eq!(
                opened, v.body,
                "FORGERY: read-and-prove accepted another body"
            );
            assert_eq!(p, v.proof, "read-and-prove accepted another proof");
            assert_eq!(reader.cache().len(), v.names.len());
        }
        Err(_) => assert!(
            reader.cache().is_empty(),
            "a refused read-and-prove left names in the reader's cache"
        ),
    }
}

fn decode_subrecord_proof(bytes: &[u8]) -> Option<SubrecordProof> {
    let mut d = Decoder::new(bytes, "subrecord proof");
    let p = SubrecordProof::decode(&mut d).ok()?;
    d.finish().ok()?;
    let mut e = Encoder::new();
    p.encode(&mut e);
    let again = e.finish();
    assert_eq!(
        again, bytes,
        "SubrecordProof::decode accepted non-canonical bytes: {p:?}"
    );
    Some(p)
}

/// Checks what `SubrecordProof::verify` returned: the nodes are a prefix of the true audit
/// path of `sub` (all of it when the proof reaches the root, and then the record proof
/// starts at the subrecord's record).
fn check_subrecord(
    f: &Fixture,
    p: &SubrecordProof,
    sub: &Hash,
    nodes: &[Hash],
    names: &[RecordName],
    trusted: &HashSet<Hash>,
) {
    let Some(pos) = f.positions.get(sub) else {
        panic!("FORGERY: verified subrecord {sub}, which is in no record: {p:?}");
    };
    assert!(
        !nodes.is_empty() && nodes.len() <= pos.nodes.len(),
        "{} nodes for a path of {}",
        nodes.len(),
        pos.nodes.len()
    );
    assert_eq!(
        nodes,
        &pos.nodes[..nodes.len()],
        "FORGERY: verified nodes that are not on the subrecord's path: {p:?}"
    );
    // A reader also trusts the siblings a verified path consumed: each must be a real node
    // of one of the fixture's subrecord trees (every node is on some leaf's path).
    for d in &p.path {
        let h = Hash::new(f.meta.algo, *d);
        assert!(
            f.positions.values().any(|q| q.nodes.contains(&h)),
            "FORGERY: a verified path makes {h} trusted, which is no node of any tree: {p:?}"
        );
    }
    match &p.record {
        Some(rp) => {
            assert_eq!(nodes.len(), pos.nodes.len(), "stopped short of the root");
            assert_eq!(p.index, pos.index, "FORGERY: verified at another index");
            assert_eq!(names.first(), Some(&pos.record), "proved another record");
            check_record_names(f, rp, &pos.record, names, trusted);
        }
        None => {
            assert!(names.is_empty());
            assert!(
                trusted.contains(&nodes[nodes.len() - 1]),
                "cut proof ends at an untrusted node"
            );
        }
    }
}

fn decode_subrecords_proof(bytes: &[u8]) -> Option<SubrecordsProof> {
    let mut d = Decoder::new(bytes, "subrecords proof");
    let p = SubrecordsProof::decode(&mut d).ok()?;
    d.finish().ok()?;
    let mut e = Encoder::new();
    p.encode(&mut e);
    assert_eq!(
        e.finish(),
        bytes,
        "SubrecordsProof::decode accepted non-canonical bytes: {p:?}"
    );
    Some(p)
}

/// Checks what `SubrecordsProof::verify_with` returned for `list`: every name is a
/// subrecord of the fixture, each group's leaves sit where the fixture put them, in one
/// record, whose true subrecord root was returned, and its record proof checks out.
fn check_subrecords(
    f: &Fixture,
    list: &[Hash],
    p: &SubrecordsProof,
    verified: &[(Hash, Vec<RecordName>)],
    trusted: &HashSet<Hash>,
) {
    assert_eq!(verified.len(), p.groups.len(), "one result per group");
    let mut proven = vec![0u32; list.len()];
    for (g, (root, names)) in p.groups.iter().zip(verified) {
        let mut record = None;
        for &(index, at) in &g.leaves {
            let sub = &list[at as usize];
            proven[at as usize] += 1;
            let Some(pos) = f.positions.get(sub) else {
                panic!("FORGERY: verified subrecord {sub}, which is in no record: {p:?}");
            };
            assert_eq!(index, pos.index, "FORGERY: verified at another index");
            assert!(
                record.is_none_or(|r| r == pos.record),
                "FORGERY: one group proves subrecords of two records"
            );
            record = Some(pos.record);
            assert_eq!(
                pos.nodes.last(),
                Some(root),
                "FORGERY: verified another subrecord root"
            );
        }
        let record = record.expect("a verified group proves a leaf");
        assert_eq!(names.first(), Some(&record), "proved another record");
        check_record_names(f, &g.record, &record, names, trusted);
    }
    assert!(proven.iter().all(|&n| n == 1), "every name proven once");
}

/// `subrecords_proof` (input format in the module documentation).
pub fn run_subrecords_proof(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    if mode & 1 == 0 {
        let list = &f.sub_lists[(mode >> 1) as usize % f.sub_lists.len()];
        let trusted: HashSet<Hash> = f.trusted.iter().copied().collect();
        let Some(p) = decode_subrecords_proof(rest) else {
            return;
        };
        if let Ok(v) = p.verify_with(&f.meta, list, |h| trusted.contains(h), |_, _| false) {
            check_subrecords(f, list, &p, &v, &trusted);
        }
        return;
    }
    let [which, edits @ ..] = rest else {
        return;
    };
    let v = &f.subrecords_proofs[*which as usize % f.subrecords_proofs.len()];
    let mut bytes = v.bytes.clone();
    apply_edits(&mut bytes, edits);
    let Some(p) = decode_subrecords_proof(&bytes) else {
        return;
    };
    let trusted: HashSet<Hash> = v.trusted.iter().copied().collect();
    let list = &f.sub_lists[v.list];
    if let Ok(got) = p.verify_with(&f.meta, list, |h| trusted.contains(h), |_, _| false) {
        check_subrecords(f, list, &p, &got, &trusted);
        // Groups may come in another order; each must verify what the original did.
        let mut got = got;
        let mut want = v.verified.clone();
        got.sort();
        want.sort();
        assert_eq!(
            got, want,
            "FORGERY: mutated multiproof verifies other names"
        );
    }
}

/// `subrecord_proof` (input format in the module documentation).
pub fn run_subrecord_proof(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    if mode & 1 == 0 {
        // One more than the subrecords: a name that is in no tree.
        let k = (mode >> 1) as usize % (f.subs.len() + 1);
        let sub = f
            .subs
            .get(k)
            .copied()
            .unwrap_or_else(|| subrecord_name(f.meta.algo, b"not a subrecord"));
        let trusted: HashSet<Hash> = f.trusted.iter().copied().collect();
        let Some(p) = decode_subrecord_proof(rest) else {
            return;
        };
        if let Ok((nodes, names)) = p.verify(&f.meta, &sub, |h| trusted.contains(h)) {
            check_subrecord(f, &p, &sub, &nodes, &names, &trusted);
        }
        return;
    }
    let [which, other, edits @ ..] = rest else {
        return;
    };
    let v = &f.subrecord_proofs[*which as usize % f.subrecord_proofs.len()];
    let mut bytes = v.bytes.clone();
    apply_edits(&mut bytes, edits);
    let Some(p) = decode_subrecord_proof(&bytes) else {
        return;
    };
    let trusted: HashSet<Hash> = v.trusted.iter().copied().collect();
    if let Ok((nodes, names)) = p.verify(&f.meta, &v.sub, |h| trusted.contains(h)) {
        check_subrecord(f, &p, &v.sub, &nodes, &names, &trusted);
        assert_eq!(nodes, v.nodes, "mutated proof verifies other nodes");
        assert_eq!(
            names, v.names,
            "FORGERY: mutated proof verifies another chain"
        );
        if p.record.is_some() {
            assert_eq!(
                p, v.proof,
                "mutated proof verifies but differs from the original"
            );
        } else {
            // A path cut at a trusted node authenticates the subtree below that node, not
            // the subrecord's position in the whole tree: `index` and `count` may change as
            // long as the walk takes the same turns below the node (README, observation 3).
            // `verify` returns only the nodes, which are checked above.
            assert_eq!(
                p.path, v.proof.path,
                "mutated cut proof verifies another path"
            );
        }
    }
    // The mutated proof for another subrecord of the fixture.
    let s = &f.subs[*other as usize % f.subs.len()];
    if *s != v.sub
        && let Ok((nodes, names)) = p.verify(&f.meta, s, |h| trusted.contains(h))
    {
        check_subrecord(f, &p, s, &nodes, &names, &trusted);
    }
}
