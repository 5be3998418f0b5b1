//! Targets for the capsule wire protocol (`cairn_capsule::wire`) and the RPC framing
//! (`cairn_net::frame`): `sync_msg`, `sync_session`, `wire_request`, `wire_response`,
//! `frame`. (`sync_session` is documented at [`run_sync_session`].)
//!
//! **Codec targets** (`sync_msg`, `wire_request`, `wire_response`): the input is one
//! encoded message. Whatever decodes must re-encode to exactly the input (one value, one
//! encoding) and decode again to the same value. `wire_request` also runs every decoded
//! *read-only* request (server key, capsule list, metadata, read, subrecords, checkpoint,
//! Merkle-log proofs, proofs outside a session) against the [`server`] fixture through
//! `dispatch`, and checks that the response, success or error, round-trips the same way:
//! no panic in the server for any arguments a peer can send.
//!
//! **`frame`**: input `u32 max` (little-endian), `u8 chunk`, then a byte stream. The stream
//! is read frame by frame with the blocking `read_frame` (limit `max`) and fed to a
//! `FrameDecoder` in pieces of `chunk % 17 + 1` bytes. Both must yield the same payloads
//! and stop the same way: a clean end exactly at a frame boundary, a torn last frame
//! (`UnexpectedEof`; the decoder keeps the bytes), or a length over `max` (`Decode`, from
//! both, at the same frame). The payloads re-encoded with `write_frame` are exactly the
//! consumed prefix of the stream, and none exceeds `max`.

use std::io;
use std::sync::{Arc, OnceLock};

use cairn_capsule::wire::{Request, Response, dispatch};
use cairn_capsule::{
    CapsuleMetadata, CapsuleServer, Record, RecordName, ServerOptions, SyncMsg, SyncSession, Writer,
};
use cairn_core::{Error, Hash, HashAlgo, SigningKey};
use cairn_net::frame::{FrameDecoder, read_frame, write_frame};
use cairn_store::{MemoryStore, Store};

use crate::capsule::{fixture_keys, fixture_meta};

/// `sync_msg`: a sync message that decodes must re-encode to exactly the input.
pub fn run_sync_msg(data: &[u8]) {
    if let Ok(m) = SyncMsg::from_bytes(data) {
        let again = m.to_bytes();
        assert_eq!(
            again, data,
            "SyncMsg decoded from non-canonical bytes: {m:?}"
        );
        assert_eq!(SyncMsg::from_bytes(&again).expect("re-encoding decodes"), m);
    }
}

/// `wire_response`: a response that decodes must re-encode to exactly the input.
pub fn run_wire_response(data: &[u8]) {
    if let Ok(r) = Response::from_bytes(data) {
        check_response(&r, Some(data));
    }
}

fn check_response(r: &Response, input: Option<&[u8]>) {
    let again = r.to_bytes();
    if let Some(input) = input {
        assert_eq!(
            again, input,
            "Response decoded from non-canonical bytes: {r:?}"
        );
    }
    assert_eq!(
        &Response::from_bytes(&again).expect("an encoded response decodes"),
        r
    );
}

/// `wire_request`: a request that decodes must re-encode to exactly the input; read-only
/// requests are also dispatched to the fixture server.
pub fn run_wire_request(data: &[u8]) {
    let Ok(req) = Request::from_bytes(data) else {
        return;
    };
    let again = req.to_bytes();
    assert_eq!(
        again, data,
        "Request decoded from non-canonical bytes: {req:?}"
    );
    assert_eq!(
        Request::from_bytes(&again).expect("re-encoding decodes"),
        req
    );
    let read_only = match &req {
        Request::ServerKey
        | Request::ListCapsules
        | Request::Metadata { .. }
        | Request::Read { .. }
        | Request::ReadSubrecord { .. }
        | Request::ReadSubrecords { .. }
        | Request::Subrecords { .. }
        | Request::QueryFresh { .. }
        | Request::LogInclusion { .. }
        | Request::LogConsistency { .. } => true,
        Request::Prove { session, .. }
        | Request::ProveSubrecord { session, .. }
        | Request::ProveSubrecords { session, .. }
        | Request::ProveRecordSubrecords { session, .. }
        | Request::ReadProve { session, .. } => session.is_none(),
        _ => false,
    };
    if read_only {
        let resp = dispatch(&server().server, req);
        check_response(&resp, None);
    }
}

/// The wire fixture: a server holding the fixture capsule (metadata of
/// [`crate::capsule::fixture_meta`]): ten plain records in a chain (r2, r5, r9 signed by
/// writer 0) and a signed subrecord record of five subrecords. Built once per process.
pub struct WireFixture {
    /// The server (read-only after construction).
    pub server: Arc<CapsuleServer>,
    /// The capsule metadata.
    pub meta: CapsuleMetadata,
    /// The plain records, in order.
    pub records: Vec<Record>,
    /// The subrecord record's name.
    pub sub_record: RecordName,
    /// Its subrecords' names.
    pub subs: Vec<Hash>,
}

/// The wire fixture.
pub fn server() -> &'static WireFixture {
    static F: OnceLock<WireFixture> = OnceLock::new();
    F.get_or_init(|| {
        let meta = fixture_meta();
        let (server, records, sub_record, subs) = build_server(0x77, &meta, 10);
        WireFixture {
            server: Arc::new(server),
            meta,
            records,
            sub_record,
            subs,
        }
    })
}

type Built = (CapsuleServer, Vec<Record>, RecordName, Vec<Hash>);

/// A server with `n` plain records of the fixture capsule and a subrecord record.
fn build_server(key: u8, meta: &CapsuleMetadata, n: usize) -> Built {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = CapsuleServer::new(
        store,
        SigningKey::from_seed(&[key; 32]),
        ServerOptions::default(),
    );
    let c = meta.name();
    server.create(meta).expect("create the fixture capsule");
    let [k0, _] = fixture_keys();
    let mut w = Writer::new(meta.clone(), k0, None).expect("fixture writer");
    let mut records = Vec::new();
    for i in 0..n {
        let r = w
            .record(format!("wire record {i}").as_bytes(), &[])
            .expect("record");
        let name = r.name();
        let sigs = if i % 4 == 2 || i + 1 == n {
            vec![(name, w.sign(&name))]
        } else {
            vec![]
        };
        server
            .write(&c, std::slice::from_ref(&r), &sigs)
            .expect("write");
        records.push(r);
    }
    let mut subs = Vec::new();
    for i in 0..5 {
        subs.push(
            w.write_subrecord(format!("wire sub {i}").as_bytes())
                .expect("subrecord"),
        );
    }
    let (header, sealed, sig) = w.commit_subrecords(&[]).expect("commit");
    server
        .commit_subrecords(&c, &header, &sealed, Some(sig))
        .expect("commit subrecords");
    (server, records, header.name(), subs)
}

/// Two replicas of the fixture capsule: A (the fixture server's twin, ten records and a
/// subrecord record) and B (only the first four records plus a fork of its own, signed by
/// writer 1); and A's records.
fn sync_replicas() -> (CapsuleServer, CapsuleServer, Vec<Record>) {
    let meta = fixture_meta();
    let c = meta.name();
    let (a, records, _, _) = build_server(0x78, &meta, 10);
    let (b, _, _, _) = build_server(0x79, &meta, 0);
    b.write(&c, &records[..4], &[]).expect("copy records");
    let [_, k1] = fixture_keys();
    let mut w1 = Writer::new(meta.clone(), k1, None).expect("writer 1");
    w1.continue_from(&[records[3].name()]);
    let fork = w1.record(b"fork", &[]).expect("fork");
    let fname = fork.name();
    b.write(&c, &[fork], &[(fname, w1.sign(&fname))])
        .expect("write fork");
    (a, b, records)
}

/// The messages of a real anti-entropy session from A to B ([`sync_replicas`]), in the
/// order sent: A's Hello first, then B's and A's in turn.
fn sync_transcript() -> Vec<SyncMsg> {
    let (a, b, _) = sync_replicas();
    let c = fixture_meta().name();
    let mut sa = SyncSession::new(&a, c, b.public_key()).expect("session a");
    let mut sb = SyncSession::new(&b, c, a.public_key()).expect("session b");
    let mut out = Vec::new();
    let mut msg = Some(sa.start().expect("start"));
    let mut to_b = true;
    while let Some(m) = msg {
        out.push(m.clone());
        msg = if to_b { sb.handle(m) } else { sa.handle(m) }.expect("sync step");
        to_b = !to_b;
    }
    out
}

/// Every message of a real anti-entropy session ([`sync_transcript`]), plus the messages
/// such a session rarely sends.
pub fn sync_messages() -> Vec<SyncMsg> {
    let (_, _, records) = sync_replicas();
    let mut out = sync_transcript();
    out.extend([
        SyncMsg::InSync,
        SyncMsg::More,
        SyncMsg::SendNames { from: 0 },
        SyncMsg::SendNames { from: 3 },
        SyncMsg::Names {
            names: records.iter().map(Record::name).collect(),
            more: false,
        },
        SyncMsg::Names {
            names: records.iter().take(2).map(Record::name).collect(),
            more: true,
        },
    ]);
    out
}

/// Requests of every kind, made of the fixture's real values.
pub fn requests() -> Vec<Request> {
    let f = server();
    let c = f.meta.name();
    let [k0, _] = fixture_keys();
    let w = Writer::new(f.meta.clone(), k0, None).expect("writer");
    let r0 = f.records[0].name();
    let sub_header = f.server.read(&c, &f.sub_record).expect("sub record").header;
    let subs: cairn_capsule::SealedSubrecords = f
        .subs
        .iter()
        .map(|s| f.server.read_subrecord(&c, s).expect("subrecord"))
        .collect();
    let mut out = vec![
        Request::ServerKey,
        Request::ListCapsules,
        Request::Create {
            meta: f.meta.clone(),
        },
        Request::Metadata { capsule: c },
        Request::Write {
            capsule: c,
            records: f.records[..2].to_vec(),
            signatures: vec![(r0, w.sign(&r0))],
        },
        Request::Sign {
            capsule: c,
            name: r0,
            sig: w.sign(&r0),
        },
        Request::Read {
            capsule: c,
            name: f.records[4].name(),
        },
        Request::ReadSubrecord {
            capsule: c,
            sub: f.subs[1],
        },
        Request::Subrecords {
            capsule: c,
            record: f.sub_record,
        },
        Request::CommitSubrecords {
            capsule: c,
            header: sub_header,
            subrecords: subs,
            sig: Some(w.sign(&f.sub_record)),
        },
        Request::QueryFresh {
            capsule: c,
            nonce: [3; 16],
        },
        Request::LogInclusion {
            capsule: c,
            name: f.records[3].name(),
            size: 11,
        },
        Request::LogConsistency {
            capsule: c,
            first: 4,
            second: 11,
        },
        Request::OpenSession {
            capsule: c,
            policy: cairn_capsule::CachePolicy::Lru { capacity: 16 },
            mode: cairn_capsule::cache::MirrorMode::OnAck,
            cached: vec![*r0.hash()],
        },
        Request::OpenSession {
            capsule: c,
            policy: cairn_capsule::CachePolicy::Lru { capacity: 16 },
            mode: cairn_capsule::cache::MirrorMode::OnIssue,
            cached: vec![],
        },
        Request::CloseSession {
            session: cairn_capsule::SessionId(1),
        },
        Request::Prove {
            capsule: c,
            name: f.records[0].name(),
            session: None,
        },
        Request::Prove {
            capsule: c,
            name: f.records[1].name(),
            session: Some(cairn_capsule::SessionId(1)),
        },
        Request::ProveSubrecord {
            capsule: c,
            sub: f.subs[3],
            session: None,
        },
        Request::ProveSubrecords {
            capsule: c,
            subs: vec![f.subs[4], f.subs[0], f.subs[2]],
            session: None,
        },
        Request::ProveRecordSubrecords {
            capsule: c,
            record: f.records[f.records.len() - 1].name(),
            session: None,
        },
        Request::ReadSubrecords {
            capsule: c,
            subs: vec![f.subs[1], f.subs[3]],
        },
        Request::ReadProve {
            capsule: c,
            name: f.records[6].name(),
            session: None,
        },
        Request::ReadProve {
            capsule: c,
            name: f.records[2].name(),
            session: Some(cairn_capsule::SessionId(2)),
        },
        Request::Ack {
            session: cairn_capsule::SessionId(1),
            proof_id: 1,
        },
    ];
    let initiator = SigningKey::from_seed(&[0x79; 32]);
    let peer = initiator.public();
    for (seq, msg) in sync_messages().into_iter().take(3).enumerate() {
        let signed = cairn_capsule::sync::sync_msg_message(
            &c,
            &peer,
            &f.server.public_key(),
            7,
            if seq == 0 { 0 } else { 11 },
            false,
            seq as u64,
            Some(&msg),
        );
        out.push(Request::Sync {
            capsule: c,
            peer,
            session: 7,
            sig: initiator.sign(cairn_capsule::server::DOMAIN_SYNC_MSG, &signed),
            msg,
        });
    }
    out
}

/// Responses of every kind: the fixture server's answers to [`requests`] (read-only ones
/// through `dispatch`, the rest run on a scratch twin), errors, and sync answers.
pub fn responses() -> Vec<Response> {
    let f = server();
    let meta = fixture_meta();
    let (twin, _, _, _) = build_server(0x7a, &meta, 10);
    let mut out = Vec::new();
    for req in requests() {
        let r = match &req {
            Request::Sync { .. } => continue,
            Request::Write { .. }
            | Request::Sign { .. }
            | Request::Create { .. }
            | Request::CommitSubrecords { .. }
            | Request::OpenSession { .. }
            | Request::CloseSession { .. }
            | Request::Ack { .. } => dispatch(&twin, req),
            _ => dispatch(&f.server, req),
        };
        out.push(r);
    }
    // A session proof, so Prove with a session has a real answer.
    let c = meta.name();
    let sid = twin
        .open_session(&c, cairn_capsule::CachePolicy::Lru { capacity: 16 }, &[])
        .expect("session");
    out.push(dispatch(
        &twin,
        Request::Prove {
            capsule: c,
            name: f.records[5].name(),
            session: Some(sid),
        },
    ));
    // A read-and-prove in an optimistic session.
    let sid = twin
        .open_session_with(
            &c,
            cairn_capsule::CachePolicy::Lru { capacity: 16 },
            cairn_capsule::cache::MirrorMode::OnIssue,
            &[],
        )
        .expect("session");
    out.push(dispatch(
        &twin,
        Request::ReadProve {
            capsule: c,
            name: f.records[4].name(),
            session: Some(sid),
        },
    ));
    out.push(dispatch(
        &f.server,
        Request::Read {
            capsule: c,
            name: RecordName(HashAlgo::Blake3.digest(b"absent")),
        },
    ));
    out.push(Response::Error(
        (&Error::io("testing", io::Error::other("an i/o error"))).into(),
    ));
    // Signatures of the right shape (the codec targets decode, they do not verify).
    let responder = SigningKey::from_seed(&[0x7a; 32]);
    out.extend(sync_messages().into_iter().map(|m| Response::Sync {
        sig: responder.sign(cairn_capsule::server::DOMAIN_SYNC_MSG, &m.to_bytes()),
        msg: Some(m),
        nonce: 11,
    }));
    out.push(Response::Sync {
        msg: None,
        sig: responder.sign(cairn_capsule::server::DOMAIN_SYNC_MSG, b""),
        nonce: 11,
    });
    out
}

/// Seeds of the codec targets.
pub fn sync_msg_seeds() -> Vec<Vec<u8>> {
    sync_messages().iter().map(SyncMsg::to_bytes).collect()
}

/// `sync_session`: one side of a real anti-entropy session between the replicas of
/// [`sync_replicas`] is driven by the input. Byte 0 bit 0 picks the side the input plays:
/// 0, the initiator (B takes a real Hello from A, then the input's messages); 1, the
/// responder (A sends a real Hello, then takes the input's messages). The rest is a list of
/// messages, each a little-endian `u16` length and an encoded [`SyncMsg`] (ones that do not
/// decode are skipped); the session takes them until it refuses one.
///
/// Oracle: no panic; afterwards the side that took the messages still passes
/// `CapsuleServer::audit` (every record it holds re-reads and re-verifies, every signature
/// checks), and every record it gained is proven: a peer can make it store nothing it
/// could not verify.
pub fn run_sync_session(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let c = fixture_meta().name();
    let (a, b, _) = sync_replicas();
    let mut sa = SyncSession::new(&a, c, b.public_key()).expect("session a");
    let mut sb = SyncSession::new(&b, c, a.public_key()).expect("session b");
    let hello = sa.start().expect("start");
    let (target, session) = if mode & 1 == 0 {
        if sb.handle(hello).is_err() {
            return;
        }
        (&b, &mut sb)
    } else {
        (&a, &mut sa)
    };
    let before: std::collections::HashSet<RecordName> = target
        .with_dag(&c, |d| d.order().iter().copied().collect())
        .expect("dag");
    while rest.len() >= 2 {
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let end = (2 + len).min(rest.len());
        let bytes = &rest[2..end];
        rest = &rest[end..];
        let Ok(m) = SyncMsg::from_bytes(bytes) else {
            continue;
        };
        if session.handle(m).is_err() {
            break;
        }
    }
    target.audit(&c).expect("what a sync stored re-verifies");
    target
        .with_dag(&c, |d| {
            for n in d.order() {
                assert!(
                    before.contains(n) || d.is_proven(n),
                    "a sync stored record {n}, which no signature reaches"
                );
            }
        })
        .expect("dag");
}

/// Seeds of `sync_session`: each side's messages of the real session, as the input
/// format frames them (and with the rare messages appended).
pub fn sync_session_seeds() -> Vec<Vec<u8>> {
    let transcript = sync_transcript();
    let extra = &sync_messages()[transcript.len()..];
    let frame = |mode: u8, msgs: &mut dyn Iterator<Item = &SyncMsg>| {
        let mut out = vec![mode];
        for m in msgs {
            let b = m.to_bytes();
            let Ok(len) = u16::try_from(b.len()) else {
                continue;
            };
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&b);
        }
        out
    };
    // The initiator's messages after its Hello; the responder's.
    let initiator = || transcript.iter().skip(2).step_by(2);
    let responder = || transcript.iter().skip(1).step_by(2);
    vec![
        frame(0, &mut initiator()),
        frame(1, &mut responder()),
        frame(0, &mut initiator().chain(extra)),
        frame(1, &mut responder().chain(extra)),
    ]
}

/// Seeds of `wire_request`.
pub fn wire_request_seeds() -> Vec<Vec<u8>> {
    requests().iter().map(Request::to_bytes).collect()
}

/// Seeds of `wire_response`.
pub fn wire_response_seeds() -> Vec<Vec<u8>> {
    responses().iter().map(Response::to_bytes).collect()
}

/// Builds a `frame` input: `max`, `chunk`, then `stream`.
pub fn frame_input(max: u32, chunk: u8, stream: &[u8]) -> Vec<u8> {
    let mut v = max.to_le_bytes().to_vec();
    v.push(chunk);
    v.extend_from_slice(stream);
    v
}

/// Seeds of `frame`: clean, torn and over-limit streams.
pub fn frame_seeds() -> Vec<Vec<u8>> {
    let mut clean = Vec::new();
    for p in [&b""[..], b"a", b"hello frames", &[7u8; 300][..]] {
        write_frame(&mut clean, p, usize::MAX).expect("frame");
    }
    let mut torn = clean.clone();
    write_frame(&mut torn, &[1; 40], usize::MAX).expect("frame");
    torn.truncate(torn.len() - 9);
    let mut big = Vec::new();
    write_frame(&mut big, b"ok", usize::MAX).expect("frame");
    big.extend_from_slice(&u32::MAX.to_be_bytes());
    big.extend_from_slice(b"xyz");
    vec![
        frame_input(1 << 20, 0, &clean),
        frame_input(1 << 20, 5, &torn),
        frame_input(100, 16, &clean),
        frame_input(u32::MAX, 3, &big),
        frame_input(64, 1, &big),
    ]
}

/// `frame`: the blocking reader and the incremental decoder agree (see the module docs).
pub fn run_frame(data: &[u8]) {
    let Some((head, stream)) = data.split_first_chunk::<5>() else {
        return;
    };
    let max = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let chunk = head[4] as usize % 17 + 1;

    // Blocking reader.
    let mut r = stream;
    let mut blocking: Vec<Vec<u8>> = Vec::new();
    let mut buf = Vec::new();
    let end = loop {
        match read_frame(&mut r, max, &mut buf) {
            Ok(true) => {
                assert!(buf.len() <= max, "payload over the limit");
                // Never more room than the bytes that arrived justify.
                assert!(
                    buf.capacity() <= 2 * stream.len() + 64,
                    "read_frame allocated {} for a {}-byte stream",
                    buf.capacity(),
                    stream.len()
                );
                blocking.push(std::mem::take(&mut buf));
            }
            Ok(false) => break "clean",
            Err(Error::Decode(m)) => {
                assert!(m.contains("frame too large"), "{m}");
                break "large";
            }
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::UnexpectedEof => {
                break "torn";
            }
            Err(e) => panic!("unexpected error reading frames: {e}"),
        }
    };
    let mut consumed = Vec::new();
    for p in &blocking {
        write_frame(&mut consumed, p, max).expect("a payload within the limit re-encodes");
    }
    assert_eq!(
        &stream[..consumed.len()],
        &consumed[..],
        "re-encoding differs"
    );
    match end {
        "clean" => assert_eq!(consumed.len(), stream.len()),
        "torn" => assert!(consumed.len() < stream.len()),
        _ => assert!(stream.len() - consumed.len() >= 4),
    }

    // Incremental decoder, fed in pieces.
    let mut d = FrameDecoder::new(max);
    let mut incremental: Vec<Vec<u8>> = Vec::new();
    let mut failed = false;
    'feed: for piece in stream.chunks(chunk) {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => incremental.push(f.to_vec()),
                Ok(None) => break,
                Err(Error::Decode(_)) => {
                    failed = true;
                    break 'feed;
                }
                Err(e) => panic!("unexpected decoder error: {e}"),
            }
        }
    }
    assert_eq!(incremental, blocking, "decoder and reader disagree");
    assert_eq!(failed, end == "large", "decoder and reader end differently");
    if !failed {
        assert_eq!(d.buffered(), stream.len() - consumed.len());
        assert!(d.next_frame().expect("no error").is_none());
    }
}
