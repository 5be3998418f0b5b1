//! The capsule wire protocol: canonical, versioned encodings of every message a remote
//! client or replica exchanges with a [`CapsuleServer`], a sans-IO dispatcher, and the TCP
//! glue over [`cairn_net`].
//!
//! - [`Request`] / [`Response`]: one variant per public server operation (create, write,
//!   sign, read, subrecords, checkpoints, Merkle-log proofs, reader sessions, record and
//!   subrecord proofs, read-and-prove, acks) plus a carrier for anti-entropy [`SyncMsg`]s. An error travels
//!   as [`Response::Error`] with a [`WireError`]: an [`ErrorCode`] per
//!   [`cairn_core::Error`] variant and the message.
//! - Encodings use [`cairn_core::codec`]: a version byte ([`WIRE_VERSION`], or
//!   [`SYNC_VERSION`] for a standalone [`SyncMsg`]), a tag byte, then the fields; records,
//!   headers, metadata and proofs are embedded in their own canonical encodings. Decoding
//!   is strict: an unknown version or tag, a truncated field, a trailing byte, a list
//!   over its cap or a non-canonical value is a [`cairn_core::Error::Decode`]. One value
//!   has one encoding, so whatever decodes re-encodes to the same bytes (fuzzed).
//! - [`dispatch`] runs a request against a server (no I/O, no state beyond the server);
//!   [`CapsuleService`] adds the responder side of anti-entropy sessions, which must live
//!   between messages, and serves encoded bytes ([`CapsuleService::handle_bytes`]), so any
//!   transport can carry the protocol.
//! - [`serve_tcp`] serves a server over [`cairn_net::rpc`]; [`RemoteCapsule`] is the
//!   client: typed calls, pipelining, and whole anti-entropy sessions against a remote
//!   replica ([`RemoteCapsule::sync_with`]).
//!
//! The transport authenticates nothing: acks, checkpoints and proofs are signed or
//! verifiable end to end, and a remote server is trusted for nothing else. The anti-entropy
//! carrier names the initiator's server key, which the responder uses to pick its sync
//! cursor; the Hello that starts a session is signed by that key, for this responder, with
//! a stamp within five minutes of the responder's clock and above the last one it took from
//! that replica, so no one can start a session in another replica's name or replay one
//! (stamps are kept in memory: after a responder restarts, a Hello captured less than five
//! minutes before could start one more session), and a Hello that fails the signature or
//! the stamp check does not touch the session open under that key. Every message of a
//! session, both ways, is signed by its sender's server key as its next one of that
//! session, and every one after the Hello also covers a random nonce the responder picks
//! for the session ([`crate::sync::SessionSeal`]); the initiator syncs only with the
//! server key its caller names ([`RemoteCapsule::sync_with`]). So someone who sees the
//! session number on the path cannot forge, replay or reorder a message, replay an
//! initiator's messages into a later session, nor end a session early (which would move a
//! replica's cursor); they can only drop messages, which fails the session (dropping the
//! last Done, or the answer to it, leaves one side finished and the other not: the next
//! session finds what is left). Sessions' memory is bounded ([`MAX_SYNC_SESSIONS`],
//! [`MAX_SYNC_NAMES`]) whatever keys a peer makes up.

use std::net::ToSocketAddrs;
use std::num::NonZeroUsize;
use std::sync::Arc;

use cairn_core::{Decoder, Encoder, Error, Hash, PublicKey, Result, Signature};
use cairn_net::{Client, ClientConfig, Reserve, ServerConfig, ServerHandle};
use lru::LruCache;
use parking_lot::Mutex;

use crate::cache::{CachePolicy, MirrorMode};
use crate::merkle::Digest;
use crate::metadata::{CapsuleMetadata, CapsuleName};
use crate::proof::{
    MAX_BATCH_SUBRECORDS, RecordProof, SubrecordProof, SubrecordsProof, WriterSignature,
};
use crate::record::{MAX_BODY_LEN, Record, RecordHeader, RecordName, SealedSubrecords};
use crate::riblt::CodedSymbol;
use crate::server::{
    Ack, AckKind, CapsuleServer, Checkpoint, Issued, MAX_SUBRECORDS, SessionId, SyncBody,
    SyncRecord,
};
use crate::sync::{MAX_STEPS, SessionSeal, SyncMsg, SyncReport, SyncState};

/// Format version of encoded [`Request`]s and [`Response`]s (2: sessions carry a
/// [`MirrorMode`]; read-and-prove; 3: a sync request carries its session number; 4: every
/// sync message and answer carries its sender's signature, [`crate::sync::SessionSeal`]).
pub const WIRE_VERSION: u8 = 4;
/// Format version of a standalone encoded [`SyncMsg`] (2: a Hello carries its stamp and the
/// initiator's signature; 3: name lists and wanted names travel in pages).
pub const SYNC_VERSION: u8 = 3;
/// Largest frame the TCP glue sends or accepts: a largest record body plus 1 MiB.
pub const MAX_FRAME: usize = MAX_BODY_LEN + (1 << 20);
/// Most records (and most signatures) in one write request or acknowledgment.
pub const MAX_BATCH: usize = 1 << 16;
/// Most names in one list (heads, roots, wanted names, capsules, subrecord names).
pub const MAX_NAMES: usize = 1 << 22;
/// Most coded symbols in one sync message.
pub const MAX_SYMBOLS: usize = 1 << 22;
/// Most digests in one Merkle-log audit path or consistency proof.
pub const MAX_PATH: usize = 128;
/// Longest error message carried (longer ones are cut at a character boundary).
pub const MAX_MESSAGE: usize = 16 << 10;
/// Most anti-entropy sessions a [`CapsuleService`] keeps open (the least recently used
/// is dropped past it).
pub const MAX_SYNC_SESSIONS: usize = 1024;
/// Most names all the anti-entropy sessions a [`CapsuleService`] keeps open compare,
/// together (a session holds about 110 bytes per name, so about 450 MiB): past it the
/// least recently used sessions are dropped, and a session that alone would hold more is
/// refused. The initiator's key is not authenticated, so without it a peer could open a
/// thousand sessions under made-up keys, each comparing the whole log.
pub const MAX_SYNC_NAMES: usize = 1 << 22;

/// Memory a responder budgets per name an anti-entropy session compares while it builds
/// the session (the name in its sorted list and in the first batch's encoder).
const SYNC_NAME_BYTES: usize = 160;
/// Elements preallocated for a decoded list (it grows past this only as elements decode).
const PREALLOC: usize = 1024;

// ---------------------------------------------------------------------------------------
// Errors

/// What kind of error a [`WireError`] carries: one code per [`cairn_core::Error`] variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorCode {
    /// [`Error::NotFound`].
    NotFound = 1,
    /// [`Error::Decode`].
    Decode = 2,
    /// [`Error::Corrupt`].
    Corrupt = 3,
    /// [`Error::InvalidInput`].
    InvalidInput = 4,
    /// [`Error::GuardMismatch`].
    GuardMismatch = 5,
    /// [`Error::TypeMismatch`].
    TypeMismatch = 6,
    /// [`Error::AlreadyExists`].
    AlreadyExists = 7,
    /// [`Error::Conflict`].
    Conflict = 8,
    /// [`Error::Rejected`].
    Rejected = 9,
    /// [`Error::Unavailable`].
    Unavailable = 10,
    /// [`Error::Io`] on the server.
    Io = 11,
}

impl ErrorCode {
    fn from_u8(c: u8) -> Result<Self> {
        Ok(match c {
            1 => ErrorCode::NotFound,
            2 => ErrorCode::Decode,
            3 => ErrorCode::Corrupt,
            4 => ErrorCode::InvalidInput,
            5 => ErrorCode::GuardMismatch,
            6 => ErrorCode::TypeMismatch,
            7 => ErrorCode::AlreadyExists,
            8 => ErrorCode::Conflict,
            9 => ErrorCode::Rejected,
            10 => ErrorCode::Unavailable,
            11 => ErrorCode::Io,
            other => return Err(Error::decode(format!("unknown error code {other}"))),
        })
    }
}

/// An error as it travels: its kind and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    /// The kind.
    pub code: ErrorCode,
    /// The message (at most [`MAX_MESSAGE`] bytes).
    pub message: String,
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut at = MAX_MESSAGE;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

impl WireError {
    /// An error of kind `code` (the message is cut to [`MAX_MESSAGE`] bytes).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: cut(message.into()),
        }
    }

    /// The [`cairn_core::Error`] this stands for. A server-side I/O error becomes an
    /// [`Error::Io`] whose context says it happened on the remote server.
    pub fn into_error(self) -> Error {
        let m = self.message;
        match self.code {
            ErrorCode::NotFound => Error::NotFound(m),
            ErrorCode::Decode => Error::Decode(m),
            ErrorCode::Corrupt => Error::Corrupt(m),
            ErrorCode::InvalidInput => Error::InvalidInput(m),
            ErrorCode::GuardMismatch => Error::GuardMismatch(m),
            ErrorCode::TypeMismatch => Error::TypeMismatch(m),
            ErrorCode::AlreadyExists => Error::AlreadyExists(m),
            ErrorCode::Conflict => Error::Conflict(m),
            ErrorCode::Rejected => Error::Rejected(m),
            ErrorCode::Unavailable => Error::Unavailable(m),
            ErrorCode::Io => Error::io("serving the request on the remote server", {
                std::io::Error::other(m)
            }),
        }
    }
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> Self {
        let (code, m) = match e {
            Error::NotFound(m) => (ErrorCode::NotFound, m.clone()),
            Error::Decode(m) => (ErrorCode::Decode, m.clone()),
            Error::Corrupt(m) => (ErrorCode::Corrupt, m.clone()),
            Error::InvalidInput(m) => (ErrorCode::InvalidInput, m.clone()),
            Error::GuardMismatch(m) => (ErrorCode::GuardMismatch, m.clone()),
            Error::TypeMismatch(m) => (ErrorCode::TypeMismatch, m.clone()),
            Error::AlreadyExists(m) => (ErrorCode::AlreadyExists, m.clone()),
            Error::Conflict(m) => (ErrorCode::Conflict, m.clone()),
            Error::Rejected(m) => (ErrorCode::Rejected, m.clone()),
            Error::Unavailable(m) => (ErrorCode::Unavailable, m.clone()),
            Error::Io { context, source } => (ErrorCode::Io, format!("{context}: {source}")),
        };
        WireError::new(code, m)
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        WireError::from(&e)
    }
}

// ---------------------------------------------------------------------------------------
// Field helpers

fn list<T>(
    d: &mut Decoder<'_>,
    min_len: usize,
    max: usize,
    what: &str,
    mut item: impl FnMut(&mut Decoder<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let n = d.count(min_len)?;
    if n > max {
        return Err(Error::decode(format!("{n} {what} (at most {max})")));
    }
    let mut out = Vec::with_capacity(n.min(PREALLOC));
    for _ in 0..n {
        out.push(item(d)?);
    }
    Ok(out)
}

fn enc_names(e: &mut Encoder, names: &[RecordName]) {
    e.varint(names.len() as u64);
    for n in names {
        e.hash(n.hash());
    }
}

fn dec_names(d: &mut Decoder<'_>, max: usize) -> Result<Vec<RecordName>> {
    list(d, 34, max, "record names", |d| Ok(RecordName(d.hash()?)))
}

fn enc_hashes(e: &mut Encoder, hashes: &[Hash]) {
    e.varint(hashes.len() as u64);
    for h in hashes {
        e.hash(h);
    }
}

fn dec_hashes(d: &mut Decoder<'_>, max: usize) -> Result<Vec<Hash>> {
    list(d, 34, max, "hashes", |d| d.hash())
}

fn enc_digests(e: &mut Encoder, ds: &[Digest]) {
    e.varint(ds.len() as u64);
    for x in ds {
        e.raw(x);
    }
}

fn dec_digest(d: &mut Decoder<'_>) -> Result<Digest> {
    let mut x = [0u8; 32];
    x.copy_from_slice(d.raw(32)?);
    Ok(x)
}

fn dec_digests(d: &mut Decoder<'_>, max: usize) -> Result<Vec<Digest>> {
    list(d, 32, max, "digests", dec_digest)
}

fn enc_capsule(e: &mut Encoder, c: &CapsuleName) {
    e.hash(c.hash());
}

fn dec_capsule(d: &mut Decoder<'_>) -> Result<CapsuleName> {
    Ok(CapsuleName(d.hash()?))
}

fn dec_name(d: &mut Decoder<'_>) -> Result<RecordName> {
    Ok(RecordName(d.hash()?))
}

fn enc_session(e: &mut Encoder, s: &Option<SessionId>) {
    match s {
        None => {
            e.u8(0);
        }
        Some(id) => {
            e.u8(1).varint(id.0);
        }
    }
}

fn dec_session(d: &mut Decoder<'_>) -> Result<Option<SessionId>> {
    match d.u8()? {
        0 => Ok(None),
        1 => Ok(Some(SessionId(d.varint()?))),
        other => Err(Error::decode(format!("bad session flag {other}"))),
    }
}

fn enc_opt_sig(e: &mut Encoder, s: &Option<WriterSignature>) {
    match s {
        None => {
            e.u8(0);
        }
        Some(ws) => {
            e.u8(1);
            ws.encode(e);
        }
    }
}

fn dec_opt_sig(d: &mut Decoder<'_>) -> Result<Option<WriterSignature>> {
    match d.u8()? {
        0 => Ok(None),
        1 => Ok(Some(WriterSignature::decode(d)?)),
        other => Err(Error::decode(format!("bad signature flag {other}"))),
    }
}

fn enc_header(e: &mut Encoder, h: &RecordHeader) {
    e.bytes(&h.encode());
}

fn dec_header(d: &mut Decoder<'_>) -> Result<RecordHeader> {
    RecordHeader::decode(d.bytes()?)
}

fn enc_record(e: &mut Encoder, r: &Record) {
    enc_header(e, &r.header);
    e.bytes(&r.body);
}

fn dec_record(d: &mut Decoder<'_>) -> Result<Record> {
    let header = dec_header(d)?;
    let body = d.bytes()?;
    if body.len() > MAX_BODY_LEN {
        return Err(Error::decode(format!(
            "record body of {} bytes is too large",
            body.len()
        )));
    }
    Ok(Record {
        header,
        body: body.to_vec(),
    })
}

fn enc_subrecords(e: &mut Encoder, subs: &SealedSubrecords) {
    e.varint(subs.len() as u64);
    for s in subs.iter() {
        e.bytes(s);
    }
}

fn dec_subrecords(d: &mut Decoder<'_>) -> Result<SealedSubrecords> {
    let mut left = MAX_SUBRECORDS;
    dec_subrecords_within(d, &mut left)
}

/// Most subrecords all the records of one sync message carry together. An empty subrecord
/// is one byte on the wire and an 8-byte offset in memory (and its name and tree leaf once
/// checked), so without a cap across the records a message of a few MiB decoded into
/// hundreds of MiB; senders cut their messages to it (`sync::SyncSession`).
pub const MAX_SYNC_SUBRECORDS: usize = 1 << 21;

/// Decodes a list of subrecords, taking each from `left` (refused when it runs out).
/// The list is one buffer and an offset per subrecord ([`SealedSubrecords`]), grown as the
/// subrecords arrive, so it takes at most 16 times its wire size (an empty subrecord, an
/// offset of 8 bytes, twice while the list grows) and about twice its wire size for
/// subrecords of more than a few bytes.
fn dec_subrecords_within(d: &mut Decoder<'_>, left: &mut usize) -> Result<SealedSubrecords> {
    let n = d.count(1)?;
    if n > MAX_SUBRECORDS {
        return Err(Error::decode(format!(
            "{n} subrecords (at most {MAX_SUBRECORDS})"
        )));
    }
    *left = left.checked_sub(n).ok_or_else(|| {
        Error::decode(format!(
            "more than {MAX_SYNC_SUBRECORDS} subrecords in one message"
        ))
    })?;
    // Grown as the subrecords arrive (what is left of the message is not this list's: a
    // sync message of many records asked for its whole rest per record).
    let mut subs = SealedSubrecords::with_capacity(n.min(PREALLOC), 0);
    for _ in 0..n {
        subs.push(d.bytes()?);
    }
    Ok(subs)
}

fn enc_metadata(e: &mut Encoder, m: &CapsuleMetadata) {
    e.bytes(&m.encode());
}

fn dec_metadata(d: &mut Decoder<'_>) -> Result<CapsuleMetadata> {
    let bytes = d.bytes()?;
    CapsuleMetadata::check_encoded_len(bytes.len()).map_err(Error::decode)?;
    CapsuleMetadata::decode(bytes)
}

fn enc_ack(e: &mut Encoder, a: &Ack) {
    enc_capsule(e, &a.capsule);
    match &a.kind {
        AckKind::Created => {
            e.u8(0);
        }
        AckKind::Wrote(names) => {
            e.u8(1);
            enc_names(e, names);
        }
        AckKind::Signed(n) => {
            e.u8(2).hash(n.hash());
        }
        AckKind::WroteSigned { records, signed } => {
            e.u8(3);
            enc_names(e, records);
            enc_names(e, signed);
        }
    }
    e.varint(a.log_size);
    a.server.encode(e);
    a.sig.encode(e);
}

fn dec_ack(d: &mut Decoder<'_>) -> Result<Ack> {
    let capsule = dec_capsule(d)?;
    let kind = match d.u8()? {
        0 => AckKind::Created,
        1 => AckKind::Wrote(dec_names(d, MAX_BATCH)?),
        2 => AckKind::Signed(dec_name(d)?),
        3 => AckKind::WroteSigned {
            records: dec_names(d, MAX_BATCH)?,
            signed: dec_names(d, MAX_BATCH)?,
        },
        other => return Err(Error::decode(format!("unknown ack kind {other}"))),
    };
    Ok(Ack {
        capsule,
        kind,
        log_size: d.varint()?,
        server: PublicKey::decode(d)?,
        sig: cairn_core::Signature::decode(d)?,
    })
}

/// A QueryFresh nonce: 16 raw bytes.
fn dec_nonce(d: &mut Decoder<'_>) -> Result<[u8; 16]> {
    let mut n = [0u8; 16];
    n.copy_from_slice(d.raw(16)?);
    Ok(n)
}

fn enc_checkpoint(e: &mut Encoder, c: &Checkpoint) {
    enc_capsule(e, &c.capsule);
    e.varint(c.size).raw(&c.root);
    enc_names(e, &c.heads);
    e.varint(c.time_ms).raw(&c.nonce);
    c.server.encode(e);
    c.sig.encode(e);
}

fn dec_checkpoint(d: &mut Decoder<'_>) -> Result<Checkpoint> {
    Ok(Checkpoint {
        capsule: dec_capsule(d)?,
        size: d.varint()?,
        root: dec_digest(d)?,
        heads: dec_names(d, MAX_NAMES)?,
        time_ms: d.varint()?,
        nonce: dec_nonce(d)?,
        server: PublicKey::decode(d)?,
        sig: cairn_core::Signature::decode(d)?,
    })
}

fn enc_sync_record(e: &mut Encoder, r: &SyncRecord) {
    enc_header(e, &r.header);
    match &r.body {
        SyncBody::Plain(b) => {
            e.u8(0).bytes(b);
        }
        SyncBody::Subrecords(subs) => {
            e.u8(1);
            enc_subrecords(e, subs);
        }
    }
    enc_opt_sig(e, &r.signature);
}

fn dec_sync_record(d: &mut Decoder<'_>, subrecords_left: &mut usize) -> Result<SyncRecord> {
    let header = dec_header(d)?;
    let body = match d.u8()? {
        0 => {
            let b = d.bytes()?;
            if b.len() > MAX_BODY_LEN {
                return Err(Error::decode("sync record body is too large"));
            }
            SyncBody::Plain(b.to_vec())
        }
        1 => SyncBody::Subrecords(dec_subrecords_within(d, subrecords_left)?),
        other => return Err(Error::decode(format!("unknown sync body kind {other}"))),
    };
    Ok(SyncRecord {
        header,
        body,
        signature: dec_opt_sig(d)?,
    })
}

fn enc_sync_records(e: &mut Encoder, rs: &[SyncRecord]) {
    e.varint(rs.len() as u64);
    for r in rs {
        enc_sync_record(e, r);
    }
}

fn dec_sync_records(d: &mut Decoder<'_>) -> Result<Vec<SyncRecord>> {
    // An encoded header alone is over 70 bytes.
    let mut left = MAX_SYNC_SUBRECORDS;
    list(d, 72, MAX_NAMES, "sync records", |d| {
        dec_sync_record(d, &mut left)
    })
}

/// Decodes a standalone value with `f`, refusing trailing bytes.
fn standalone<T>(
    bytes: &[u8],
    what: &'static str,
    f: impl FnOnce(&mut Decoder<'_>) -> Result<T>,
) -> Result<T> {
    let mut d = Decoder::new(bytes, what);
    let v = f(&mut d)?;
    d.finish()?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------
// SyncMsg

const SYNC_HELLO: u8 = 0;
const SYNC_IN_SYNC: u8 = 1;
const SYNC_SYMBOLS: u8 = 2;
const SYNC_MORE: u8 = 3;
const SYNC_SEND_NAMES: u8 = 4;
const SYNC_NAMES: u8 = 5;
const SYNC_EXCHANGE: u8 = 6;
const SYNC_PATCH: u8 = 7;
const SYNC_DONE: u8 = 8;

impl SyncMsg {
    /// Appends the encoding: [`SYNC_VERSION`], a tag, the fields.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(SYNC_VERSION);
        match self {
            SyncMsg::Hello {
                capsule,
                quick,
                count,
                at,
                sig,
            } => {
                e.u8(SYNC_HELLO);
                enc_capsule(e, capsule);
                e.raw(quick).varint(*count).u64_le(*at);
                sig.encode(e);
            }
            SyncMsg::InSync => {
                e.u8(SYNC_IN_SYNC);
            }
            SyncMsg::Symbols(syms) => {
                e.u8(SYNC_SYMBOLS).varint(syms.len() as u64);
                for s in syms {
                    e.raw(&s.sum).u64_le(s.check).ivarint(s.count);
                }
            }
            SyncMsg::More => {
                e.u8(SYNC_MORE);
            }
            SyncMsg::SendNames { from } => {
                e.u8(SYNC_SEND_NAMES).varint(*from);
            }
            SyncMsg::Names { names, more } => {
                e.u8(SYNC_NAMES);
                enc_names(e, names);
                e.u8(u8::from(*more));
            }
            SyncMsg::Exchange {
                records,
                want,
                heads,
                roots,
                missing,
            } => {
                e.u8(SYNC_EXCHANGE);
                enc_sync_records(e, records);
                enc_names(e, want);
                enc_names(e, heads);
                enc_names(e, roots);
                enc_names(e, missing);
            }
            SyncMsg::Patch {
                records,
                want,
                heads,
                roots,
                missing,
            } => {
                e.u8(SYNC_PATCH);
                enc_sync_records(e, records);
                enc_names(e, want);
                enc_names(e, heads);
                enc_names(e, roots);
                enc_names(e, missing);
            }
            SyncMsg::Done => {
                e.u8(SYNC_DONE);
            }
        }
    }

    /// Reads what [`SyncMsg::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[SYNC_VERSION])?;
        Ok(match d.u8()? {
            SYNC_HELLO => SyncMsg::Hello {
                capsule: dec_capsule(d)?,
                quick: dec_digest(d)?,
                count: d.varint()?,
                at: d.u64_le()?,
                sig: cairn_core::Signature::decode(d)?,
            },
            SYNC_IN_SYNC => SyncMsg::InSync,
            SYNC_SYMBOLS => SyncMsg::Symbols(list(d, 41, MAX_SYMBOLS, "coded symbols", |d| {
                Ok(CodedSymbol {
                    sum: dec_digest(d)?,
                    check: d.u64_le()?,
                    count: d.ivarint()?,
                })
            })?),
            SYNC_MORE => SyncMsg::More,
            SYNC_SEND_NAMES => SyncMsg::SendNames { from: d.varint()? },
            SYNC_NAMES => SyncMsg::Names {
                names: dec_names(d, MAX_NAMES)?,
                more: match d.u8()? {
                    0 => false,
                    1 => true,
                    other => {
                        return Err(Error::decode(format!(
                            "a name page's more flag is {other}, not 0 or 1"
                        )));
                    }
                },
            },
            SYNC_EXCHANGE => SyncMsg::Exchange {
                records: dec_sync_records(d)?,
                want: dec_names(d, MAX_NAMES)?,
                heads: dec_names(d, MAX_NAMES)?,
                roots: dec_names(d, MAX_NAMES)?,
                missing: dec_names(d, MAX_NAMES)?,
            },
            SYNC_PATCH => SyncMsg::Patch {
                records: dec_sync_records(d)?,
                want: dec_names(d, MAX_NAMES)?,
                heads: dec_names(d, MAX_NAMES)?,
                roots: dec_names(d, MAX_NAMES)?,
                missing: dec_names(d, MAX_NAMES)?,
            },
            SYNC_DONE => SyncMsg::Done,
            other => return Err(Error::decode(format!("unknown sync message tag {other}"))),
        })
    }

    /// Encodes to a standalone byte string.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        self.encode(&mut e);
        e.finish()
    }

    /// Decodes a standalone byte string, refusing trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        standalone(bytes, "sync message", Self::decode)
    }
}

// ---------------------------------------------------------------------------------------
// Requests

/// A request to a capsule server: one variant per public server operation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a request lives for one call; the sync variant (a Hello and two \
              signatures inline, about 450 bytes) is not worth a heap allocation per message"
)]
pub enum Request {
    /// The server's public key (what acks and checkpoints are signed with).
    ServerKey,
    /// Names of all capsules the server holds.
    ListCapsules,
    /// [`CapsuleServer::create`].
    Create {
        /// The new capsule's metadata.
        meta: CapsuleMetadata,
    },
    /// [`CapsuleServer::metadata`].
    Metadata {
        /// The capsule.
        capsule: CapsuleName,
    },
    /// [`CapsuleServer::write`]: records and signatures, all or nothing.
    Write {
        /// The capsule.
        capsule: CapsuleName,
        /// Records to store.
        records: Vec<Record>,
        /// Writer signatures on records in this batch or already stored.
        signatures: Vec<(RecordName, WriterSignature)>,
    },
    /// [`CapsuleServer::sign`].
    Sign {
        /// The capsule.
        capsule: CapsuleName,
        /// The record signed.
        name: RecordName,
        /// The writer's signature.
        sig: WriterSignature,
    },
    /// [`CapsuleServer::read`].
    Read {
        /// The capsule.
        capsule: CapsuleName,
        /// The record.
        name: RecordName,
    },
    /// [`CapsuleServer::read_subrecord`].
    ReadSubrecord {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecord's name.
        sub: Hash,
    },
    /// [`CapsuleServer::read_subrecords`]: many subrecords in one response.
    ReadSubrecords {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecords' names, at most [`MAX_BATCH_SUBRECORDS`].
        subs: Vec<Hash>,
    },
    /// [`CapsuleServer::subrecords`].
    Subrecords {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecord record.
        record: RecordName,
    },
    /// [`CapsuleServer::commit_subrecords`].
    CommitSubrecords {
        /// The capsule.
        capsule: CapsuleName,
        /// The record header carrying the subrecord root.
        header: RecordHeader,
        /// The sealed subrecords, in tree order.
        subrecords: SealedSubrecords,
        /// The writer's signature on the record, if any.
        sig: Option<WriterSignature>,
    },
    /// [`CapsuleServer::query_fresh`]: a signed [`Checkpoint`].
    QueryFresh {
        /// The capsule.
        capsule: CapsuleName,
        /// The reader's fresh random value, signed back in the checkpoint.
        nonce: [u8; 16],
    },
    /// [`CapsuleServer::log_inclusion`] (check the answer with
    /// [`crate::server::Checkpoint::verify_includes`]).
    LogInclusion {
        /// The capsule.
        capsule: CapsuleName,
        /// The record.
        name: RecordName,
        /// The log size the proof is for.
        size: u64,
    },
    /// [`CapsuleServer::log_consistency`] (check the answer with
    /// [`crate::server::Checkpoint::verify_extends`]).
    LogConsistency {
        /// The capsule.
        capsule: CapsuleName,
        /// The older log size.
        first: u64,
        /// The newer log size.
        second: u64,
    },
    /// [`CapsuleServer::open_session_with`].
    OpenSession {
        /// The capsule.
        capsule: CapsuleName,
        /// The reader's cache policy.
        policy: CachePolicy,
        /// When the server's mirror takes in a proof's names.
        mode: MirrorMode,
        /// Names the reader's cache holds, least recent first.
        cached: Vec<Hash>,
    },
    /// [`CapsuleServer::close_session`].
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// [`CapsuleServer::prove`].
    Prove {
        /// The capsule.
        capsule: CapsuleName,
        /// The record.
        name: RecordName,
        /// The reader session whose cache may shorten the proof.
        session: Option<SessionId>,
    },
    /// [`CapsuleServer::prove_subrecord`].
    ProveSubrecord {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecord's name.
        sub: Hash,
        /// The reader session whose cache may shorten the proof.
        session: Option<SessionId>,
    },
    /// [`CapsuleServer::prove_subrecords`]: one multiproof for many subrecords.
    ProveSubrecords {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecords' names, distinct, at most [`MAX_BATCH_SUBRECORDS`].
        subs: Vec<Hash>,
        /// The reader session whose cache may shorten the record proofs.
        session: Option<SessionId>,
    },
    /// [`CapsuleServer::prove_record_subrecords`]: one multiproof of all of one record's
    /// subrecords, by index.
    ProveRecordSubrecords {
        /// The capsule.
        capsule: CapsuleName,
        /// The subrecord record.
        record: RecordName,
        /// The reader session whose cache may shorten the record proof.
        session: Option<SessionId>,
    },
    /// [`CapsuleServer::read_and_prove`]: a record's body and its proof in one response.
    ReadProve {
        /// The capsule.
        capsule: CapsuleName,
        /// The record.
        name: RecordName,
        /// The reader session whose cache may shorten the proof.
        session: Option<SessionId>,
    },
    /// [`CapsuleServer::ack`].
    Ack {
        /// The session.
        session: SessionId,
        /// The proof id acknowledged.
        proof_id: u64,
    },
    /// One anti-entropy message from the initiator of a session (see
    /// [`CapsuleService`]); a [`SyncMsg::Hello`] starts a new session.
    Sync {
        /// The capsule.
        capsule: CapsuleName,
        /// The initiator's server key (picks the responder's sync cursor).
        peer: PublicKey,
        /// The session: a random number the initiator picks for its Hello (not 0) and
        /// sends with every later message, so no one else can continue (or end) the
        /// session by naming the capsule and the initiator's public key.
        session: u64,
        /// The message.
        msg: SyncMsg,
        /// The initiator's signature of the message as its next of this session
        /// ([`crate::sync::SessionSeal`]).
        sig: Signature,
    },
}

const REQ_SERVER_KEY: u8 = 0;
const REQ_LIST: u8 = 1;
const REQ_CREATE: u8 = 2;
const REQ_METADATA: u8 = 3;
const REQ_WRITE: u8 = 4;
const REQ_SIGN: u8 = 5;
const REQ_READ: u8 = 6;
const REQ_READ_SUB: u8 = 7;
const REQ_SUBRECORDS: u8 = 8;
const REQ_COMMIT_SUBS: u8 = 9;
const REQ_QUERY_FRESH: u8 = 10;
const REQ_LOG_INCLUSION: u8 = 11;
const REQ_LOG_CONSISTENCY: u8 = 12;
const REQ_OPEN_SESSION: u8 = 13;
const REQ_CLOSE_SESSION: u8 = 14;
const REQ_PROVE: u8 = 15;
const REQ_PROVE_SUB: u8 = 16;
const REQ_ACK: u8 = 17;
const REQ_SYNC: u8 = 18;
const REQ_READ_PROVE: u8 = 19;
const REQ_PROVE_SUBS: u8 = 20;
const REQ_READ_SUBS: u8 = 21;
const REQ_PROVE_RECORD_SUBS: u8 = 22;

/// Encodes a [`Request::Write`] from borrowed parts (no copy of the records).
pub fn encode_write(
    capsule: &CapsuleName,
    records: &[Record],
    signatures: &[(RecordName, WriterSignature)],
) -> Vec<u8> {
    let size: usize = records
        .iter()
        .map(|r| r.body.len() + 48 + 34 * r.header.backpointers.len() + 100)
        .sum();
    let mut e = Encoder::with_capacity(40 + size + 100 * signatures.len());
    e.u8(WIRE_VERSION).u8(REQ_WRITE);
    enc_capsule(&mut e, capsule);
    e.varint(records.len() as u64);
    for r in records {
        enc_record(&mut e, r);
    }
    e.varint(signatures.len() as u64);
    for (n, ws) in signatures {
        e.hash(n.hash());
        ws.encode(&mut e);
    }
    e.finish()
}

/// Encodes a [`Request::CommitSubrecords`] from borrowed parts (no copy of the
/// subrecords).
pub fn encode_commit_subrecords(
    capsule: &CapsuleName,
    header: &RecordHeader,
    subrecords: &SealedSubrecords,
    sig: Option<&WriterSignature>,
) -> Vec<u8> {
    let size = subrecords.total_bytes() + 5 * subrecords.len();
    let mut e = Encoder::with_capacity(200 + size);
    e.u8(WIRE_VERSION).u8(REQ_COMMIT_SUBS);
    enc_capsule(&mut e, capsule);
    enc_header(&mut e, header);
    enc_subrecords(&mut e, subrecords);
    enc_opt_sig(&mut e, &sig.copied());
    e.finish()
}

impl Request {
    /// Appends the encoding: [`WIRE_VERSION`], a tag, the fields.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(WIRE_VERSION);
        match self {
            Request::ServerKey => {
                e.u8(REQ_SERVER_KEY);
            }
            Request::ListCapsules => {
                e.u8(REQ_LIST);
            }
            Request::Create { meta } => {
                e.u8(REQ_CREATE);
                enc_metadata(e, meta);
            }
            Request::Metadata { capsule } => {
                e.u8(REQ_METADATA);
                enc_capsule(e, capsule);
            }
            Request::Write {
                capsule,
                records,
                signatures,
            } => {
                // One encoder for both paths: the borrowed form minus its version byte.
                e.raw(&encode_write(capsule, records, signatures)[1..]);
            }
            Request::Sign { capsule, name, sig } => {
                e.u8(REQ_SIGN);
                enc_capsule(e, capsule);
                e.hash(name.hash());
                sig.encode(e);
            }
            Request::Read { capsule, name } => {
                e.u8(REQ_READ);
                enc_capsule(e, capsule);
                e.hash(name.hash());
            }
            Request::ReadSubrecords { capsule, subs } => {
                e.u8(REQ_READ_SUBS);
                enc_capsule(e, capsule);
                enc_hashes(e, subs);
            }
            Request::ReadSubrecord { capsule, sub } => {
                e.u8(REQ_READ_SUB);
                enc_capsule(e, capsule);
                e.hash(sub);
            }
            Request::Subrecords { capsule, record } => {
                e.u8(REQ_SUBRECORDS);
                enc_capsule(e, capsule);
                e.hash(record.hash());
            }
            Request::CommitSubrecords {
                capsule,
                header,
                subrecords,
                sig,
            } => {
                e.raw(&encode_commit_subrecords(capsule, header, subrecords, sig.as_ref())[1..]);
            }
            Request::QueryFresh { capsule, nonce } => {
                e.u8(REQ_QUERY_FRESH);
                enc_capsule(e, capsule);
                e.raw(nonce);
            }
            Request::LogInclusion {
                capsule,
                name,
                size,
            } => {
                e.u8(REQ_LOG_INCLUSION);
                enc_capsule(e, capsule);
                e.hash(name.hash()).varint(*size);
            }
            Request::LogConsistency {
                capsule,
                first,
                second,
            } => {
                e.u8(REQ_LOG_CONSISTENCY);
                enc_capsule(e, capsule);
                e.varint(*first).varint(*second);
            }
            Request::OpenSession {
                capsule,
                policy,
                mode,
                cached,
            } => {
                e.u8(REQ_OPEN_SESSION);
                enc_capsule(e, capsule);
                policy.encode(e);
                mode.encode(e);
                enc_hashes(e, cached);
            }
            Request::CloseSession { session } => {
                e.u8(REQ_CLOSE_SESSION).varint(session.0);
            }
            Request::Prove {
                capsule,
                name,
                session,
            } => {
                e.u8(REQ_PROVE);
                enc_capsule(e, capsule);
                e.hash(name.hash());
                enc_session(e, session);
            }
            Request::ProveSubrecord {
                capsule,
                sub,
                session,
            } => {
                e.u8(REQ_PROVE_SUB);
                enc_capsule(e, capsule);
                e.hash(sub);
                enc_session(e, session);
            }
            Request::ProveSubrecords {
                capsule,
                subs,
                session,
            } => {
                e.u8(REQ_PROVE_SUBS);
                enc_capsule(e, capsule);
                enc_hashes(e, subs);
                enc_session(e, session);
            }
            Request::ProveRecordSubrecords {
                capsule,
                record,
                session,
            } => {
                e.u8(REQ_PROVE_RECORD_SUBS);
                enc_capsule(e, capsule);
                e.hash(record.hash());
                enc_session(e, session);
            }
            Request::ReadProve {
                capsule,
                name,
                session,
            } => {
                e.u8(REQ_READ_PROVE);
                enc_capsule(e, capsule);
                e.hash(name.hash());
                enc_session(e, session);
            }
            Request::Ack { session, proof_id } => {
                e.u8(REQ_ACK).varint(session.0).varint(*proof_id);
            }
            Request::Sync {
                capsule,
                peer,
                session,
                msg,
                sig,
            } => {
                e.u8(REQ_SYNC);
                enc_capsule(e, capsule);
                peer.encode(e);
                e.u64_le(*session);
                msg.encode(e);
                sig.encode(e);
            }
        }
    }

    /// Reads what [`Request::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[WIRE_VERSION])?;
        Ok(match d.u8()? {
            REQ_SERVER_KEY => Request::ServerKey,
            REQ_LIST => Request::ListCapsules,
            REQ_CREATE => Request::Create {
                meta: dec_metadata(d)?,
            },
            REQ_METADATA => Request::Metadata {
                capsule: dec_capsule(d)?,
            },
            REQ_WRITE => Request::Write {
                capsule: dec_capsule(d)?,
                records: list(d, 72, MAX_BATCH, "records", dec_record)?,
                signatures: list(d, 34 + 66, MAX_BATCH, "signatures", |d| {
                    Ok((dec_name(d)?, WriterSignature::decode(d)?))
                })?,
            },
            REQ_SIGN => Request::Sign {
                capsule: dec_capsule(d)?,
                name: dec_name(d)?,
                sig: WriterSignature::decode(d)?,
            },
            REQ_READ => Request::Read {
                capsule: dec_capsule(d)?,
                name: dec_name(d)?,
            },
            REQ_READ_SUB => Request::ReadSubrecord {
                capsule: dec_capsule(d)?,
                sub: d.hash()?,
            },
            REQ_READ_SUBS => Request::ReadSubrecords {
                capsule: dec_capsule(d)?,
                subs: dec_hashes(d, MAX_BATCH_SUBRECORDS)?,
            },
            REQ_SUBRECORDS => Request::Subrecords {
                capsule: dec_capsule(d)?,
                record: dec_name(d)?,
            },
            REQ_COMMIT_SUBS => Request::CommitSubrecords {
                capsule: dec_capsule(d)?,
                header: dec_header(d)?,
                subrecords: dec_subrecords(d)?,
                sig: dec_opt_sig(d)?,
            },
            REQ_QUERY_FRESH => Request::QueryFresh {
                capsule: dec_capsule(d)?,
                nonce: dec_nonce(d)?,
            },
            REQ_LOG_INCLUSION => Request::LogInclusion {
                capsule: dec_capsule(d)?,
                name: dec_name(d)?,
                size: d.varint()?,
            },
            REQ_LOG_CONSISTENCY => Request::LogConsistency {
                capsule: dec_capsule(d)?,
                first: d.varint()?,
                second: d.varint()?,
            },
            REQ_OPEN_SESSION => Request::OpenSession {
                capsule: dec_capsule(d)?,
                policy: CachePolicy::decode(d)?,
                mode: MirrorMode::decode(d)?,
                cached: dec_hashes(d, CachePolicy::MAX_CAPACITY as usize)?,
            },
            REQ_CLOSE_SESSION => Request::CloseSession {
                session: SessionId(d.varint()?),
            },
            REQ_PROVE => Request::Prove {
                capsule: dec_capsule(d)?,
                name: dec_name(d)?,
                session: dec_session(d)?,
            },
            REQ_PROVE_SUB => Request::ProveSubrecord {
                capsule: dec_capsule(d)?,
                sub: d.hash()?,
                session: dec_session(d)?,
            },
            REQ_PROVE_SUBS => Request::ProveSubrecords {
                capsule: dec_capsule(d)?,
                subs: dec_hashes(d, MAX_BATCH_SUBRECORDS)?,
                session: dec_session(d)?,
            },
            REQ_READ_PROVE => Request::ReadProve {
                capsule: dec_capsule(d)?,
                name: dec_name(d)?,
                session: dec_session(d)?,
            },
            REQ_PROVE_RECORD_SUBS => Request::ProveRecordSubrecords {
                capsule: dec_capsule(d)?,
                record: dec_name(d)?,
                session: dec_session(d)?,
            },
            REQ_ACK => Request::Ack {
                session: SessionId(d.varint()?),
                proof_id: d.varint()?,
            },
            REQ_SYNC => Request::Sync {
                capsule: dec_capsule(d)?,
                peer: PublicKey::decode(d)?,
                session: d.u64_le()?,
                msg: SyncMsg::decode(d)?,
                sig: Signature::decode(d)?,
            },
            other => return Err(Error::decode(format!("unknown request tag {other}"))),
        })
    }

    /// Encodes to a standalone byte string.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Request::Write {
                capsule,
                records,
                signatures,
            } => encode_write(capsule, records, signatures),
            Request::CommitSubrecords {
                capsule,
                header,
                subrecords,
                sig,
            } => encode_commit_subrecords(capsule, header, subrecords, sig.as_ref()),
            _ => {
                let mut e = Encoder::with_capacity(128);
                self.encode(&mut e);
                e.finish()
            }
        }
    }

    /// Decodes a standalone byte string, refusing trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        standalone(bytes, "capsule request", Self::decode)
    }

    /// The operation's name, for messages.
    pub fn op(&self) -> &'static str {
        match self {
            Request::ServerKey => "server_key",
            Request::ListCapsules => "list_capsules",
            Request::Create { .. } => "create",
            Request::Metadata { .. } => "metadata",
            Request::Write { .. } => "write",
            Request::Sign { .. } => "sign",
            Request::Read { .. } => "read",
            Request::ReadSubrecord { .. } => "read_subrecord",
            Request::ReadSubrecords { .. } => "read_subrecords",
            Request::Subrecords { .. } => "subrecords",
            Request::CommitSubrecords { .. } => "commit_subrecords",
            Request::QueryFresh { .. } => "query_fresh",
            Request::LogInclusion { .. } => "log_inclusion",
            Request::LogConsistency { .. } => "log_consistency",
            Request::OpenSession { .. } => "open_session",
            Request::CloseSession { .. } => "close_session",
            Request::Prove { .. } => "prove",
            Request::ProveSubrecord { .. } => "prove_subrecord",
            Request::ProveSubrecords { .. } => "prove_subrecords",
            Request::ProveRecordSubrecords { .. } => "prove_record_subrecords",
            Request::ReadProve { .. } => "read_prove",
            Request::Ack { .. } => "ack",
            Request::Sync { .. } => "sync",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Responses

/// A server's answer to one [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The request failed; nothing was changed by it.
    Error(WireError),
    /// Success with nothing to return (close_session, ack).
    Unit,
    /// The server's public key.
    ServerKey(PublicKey),
    /// Capsule names.
    Capsules(Vec<CapsuleName>),
    /// A signed acknowledgment (create, write, sign, commit_subrecords).
    Ack(Ack),
    /// Capsule metadata.
    Metadata(CapsuleMetadata),
    /// A record, header and sealed body.
    Record(Record),
    /// A sealed subrecord.
    Subrecord(Vec<u8>),
    /// Subrecord names in tree order.
    SubrecordNames(Vec<Hash>),
    /// A signed checkpoint.
    Checkpoint(Checkpoint),
    /// A Merkle-log inclusion proof.
    Inclusion {
        /// The leaf index of the record.
        index: u64,
        /// The audit path.
        path: Vec<Digest>,
    },
    /// A Merkle-log consistency proof.
    Consistency(Vec<Digest>),
    /// A new reader session.
    Session(SessionId),
    /// A record proof and the id its ack names.
    RecordProof {
        /// Id to acknowledge (0: nothing to acknowledge, such as outside a session).
        proof_id: u64,
        /// The proof.
        proof: RecordProof,
    },
    /// A subrecord proof and the id its ack names.
    SubrecordProof {
        /// Id to acknowledge (0: nothing to acknowledge, such as outside a session).
        proof_id: u64,
        /// The proof.
        proof: SubrecordProof,
    },
    /// Sealed subrecords, in the order requested.
    Subrecords(Vec<Vec<u8>>),
    /// A multiproof for many subrecords and the id its ack names.
    SubrecordsProof {
        /// Id to acknowledge (0: nothing to acknowledge, such as outside a session).
        proof_id: u64,
        /// The proof.
        proof: SubrecordsProof,
    },
    /// The responder's next anti-entropy message (`None` when its side is over), signed as
    /// its next of the session ([`crate::sync::SessionSeal`]).
    Sync {
        /// The message.
        msg: Option<SyncMsg>,
        /// The responder's signature.
        sig: Signature,
        /// The responder's nonce for the session, which the initiator's later messages
        /// cover.
        nonce: u64,
    },
    /// A record's sealed body and its proof (the proof's first header is the record's),
    /// with the id its ack names.
    RecordAndProof {
        /// Id to acknowledge (0 when there is nothing to acknowledge).
        proof_id: u64,
        /// The sealed body (empty for a subrecord record).
        body: Vec<u8>,
        /// The proof.
        proof: RecordProof,
    },
}

const RESP_ERROR: u8 = 0;
const RESP_UNIT: u8 = 1;
const RESP_SERVER_KEY: u8 = 2;
const RESP_CAPSULES: u8 = 3;
const RESP_ACK: u8 = 4;
const RESP_METADATA: u8 = 5;
const RESP_RECORD: u8 = 6;
const RESP_SUBRECORD: u8 = 7;
const RESP_SUB_NAMES: u8 = 8;
const RESP_CHECKPOINT: u8 = 9;
const RESP_INCLUSION: u8 = 10;
const RESP_CONSISTENCY: u8 = 11;
const RESP_SESSION: u8 = 12;
const RESP_RECORD_PROOF: u8 = 13;
const RESP_SUB_PROOF: u8 = 14;
const RESP_SYNC: u8 = 15;
const RESP_RECORD_AND_PROOF: u8 = 16;
const RESP_SUBS_PROOF: u8 = 17;
const RESP_SUBRECORDS: u8 = 18;

impl Response {
    /// Appends the encoding: [`WIRE_VERSION`], a tag, the fields.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(WIRE_VERSION);
        match self {
            Response::Error(w) => {
                let m = if w.message.len() > MAX_MESSAGE {
                    cut(w.message.clone())
                } else {
                    w.message.clone()
                };
                e.u8(RESP_ERROR).u8(w.code as u8).bytes(m.as_bytes());
            }
            Response::Unit => {
                e.u8(RESP_UNIT);
            }
            Response::ServerKey(k) => {
                e.u8(RESP_SERVER_KEY);
                k.encode(e);
            }
            Response::Capsules(cs) => {
                e.u8(RESP_CAPSULES).varint(cs.len() as u64);
                for c in cs {
                    enc_capsule(e, c);
                }
            }
            Response::Ack(a) => {
                e.u8(RESP_ACK);
                enc_ack(e, a);
            }
            Response::Metadata(m) => {
                e.u8(RESP_METADATA);
                enc_metadata(e, m);
            }
            Response::Record(r) => {
                e.u8(RESP_RECORD);
                enc_record(e, r);
            }
            Response::Subrecords(bs) => {
                e.u8(RESP_SUBRECORDS).varint(bs.len() as u64);
                for b in bs {
                    e.bytes(b);
                }
            }
            Response::Subrecord(b) => {
                e.u8(RESP_SUBRECORD).bytes(b);
            }
            Response::SubrecordNames(ns) => {
                e.u8(RESP_SUB_NAMES);
                enc_hashes(e, ns);
            }
            Response::Checkpoint(c) => {
                e.u8(RESP_CHECKPOINT);
                enc_checkpoint(e, c);
            }
            Response::Inclusion { index, path } => {
                e.u8(RESP_INCLUSION).varint(*index);
                enc_digests(e, path);
            }
            Response::Consistency(p) => {
                e.u8(RESP_CONSISTENCY);
                enc_digests(e, p);
            }
            Response::Session(s) => {
                e.u8(RESP_SESSION).varint(s.0);
            }
            Response::RecordProof { proof_id, proof } => {
                e.u8(RESP_RECORD_PROOF).varint(*proof_id);
                proof.encode(e);
            }
            Response::SubrecordProof { proof_id, proof } => {
                e.u8(RESP_SUB_PROOF).varint(*proof_id);
                proof.encode(e);
            }
            Response::SubrecordsProof { proof_id, proof } => {
                e.u8(RESP_SUBS_PROOF).varint(*proof_id);
                proof.encode(e);
            }
            Response::RecordAndProof {
                proof_id,
                body,
                proof,
            } => {
                e.u8(RESP_RECORD_AND_PROOF).varint(*proof_id).bytes(body);
                proof.encode(e);
            }
            Response::Sync { msg, sig, nonce } => {
                e.u8(RESP_SYNC);
                match msg {
                    None => {
                        e.u8(0);
                    }
                    Some(m) => {
                        e.u8(1);
                        m.encode(e);
                    }
                }
                sig.encode(e);
                e.u64_le(*nonce);
            }
        }
    }

    /// Reads what [`Response::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[WIRE_VERSION])?;
        Ok(match d.u8()? {
            RESP_ERROR => {
                let code = ErrorCode::from_u8(d.u8()?)?;
                let m = d.str()?;
                if m.len() > MAX_MESSAGE {
                    return Err(Error::decode(format!(
                        "error message of {} bytes (at most {MAX_MESSAGE})",
                        m.len()
                    )));
                }
                Response::Error(WireError {
                    code,
                    message: m.to_owned(),
                })
            }
            RESP_UNIT => Response::Unit,
            RESP_SERVER_KEY => Response::ServerKey(PublicKey::decode(d)?),
            RESP_CAPSULES => Response::Capsules(list(d, 34, MAX_NAMES, "capsules", dec_capsule)?),
            RESP_ACK => Response::Ack(dec_ack(d)?),
            RESP_METADATA => Response::Metadata(dec_metadata(d)?),
            RESP_RECORD => Response::Record(dec_record(d)?),
            RESP_SUBRECORD => Response::Subrecord(d.bytes()?.to_vec()),
            RESP_SUBRECORDS => {
                Response::Subrecords(list(d, 1, MAX_BATCH_SUBRECORDS, "subrecords", |d| {
                    Ok(d.bytes()?.to_vec())
                })?)
            }
            RESP_SUB_NAMES => Response::SubrecordNames(dec_hashes(d, MAX_SUBRECORDS)?),
            RESP_CHECKPOINT => Response::Checkpoint(dec_checkpoint(d)?),
            RESP_INCLUSION => Response::Inclusion {
                index: d.varint()?,
                path: dec_digests(d, MAX_PATH)?,
            },
            RESP_CONSISTENCY => Response::Consistency(dec_digests(d, MAX_PATH)?),
            RESP_SESSION => Response::Session(SessionId(d.varint()?)),
            RESP_RECORD_PROOF => Response::RecordProof {
                proof_id: d.varint()?,
                proof: RecordProof::decode(d)?,
            },
            RESP_SUB_PROOF => Response::SubrecordProof {
                proof_id: d.varint()?,
                proof: SubrecordProof::decode(d)?,
            },
            RESP_SUBS_PROOF => Response::SubrecordsProof {
                proof_id: d.varint()?,
                proof: SubrecordsProof::decode(d)?,
            },
            RESP_RECORD_AND_PROOF => Response::RecordAndProof {
                proof_id: d.varint()?,
                body: {
                    let b = d.bytes()?;
                    if b.len() > MAX_BODY_LEN {
                        return Err(Error::decode(format!(
                            "body of {} bytes is too large",
                            b.len()
                        )));
                    }
                    b.to_vec()
                },
                proof: RecordProof::decode(d)?,
            },
            RESP_SYNC => Response::Sync {
                msg: match d.u8()? {
                    0 => None,
                    1 => Some(SyncMsg::decode(d)?),
                    other => return Err(Error::decode(format!("bad sync flag {other}"))),
                },
                sig: Signature::decode(d)?,
                nonce: d.u64_le()?,
            },
            other => return Err(Error::decode(format!("unknown response tag {other}"))),
        })
    }

    /// Encodes to a standalone byte string.
    pub fn to_bytes(&self) -> Vec<u8> {
        let cap = match self {
            Response::Record(r) => 200 + r.body.len() + 34 * r.header.backpointers.len(),
            Response::RecordAndProof { body, proof, .. } => {
                200 + body.len() + 150 * proof.chain.len()
            }
            Response::Subrecord(b) => 16 + b.len(),
            Response::Subrecords(bs) => 16 + bs.iter().map(|b| b.len() + 5).sum::<usize>(),
            _ => 256,
        };
        let mut e = Encoder::with_capacity(cap);
        self.encode(&mut e);
        e.finish()
    }

    /// Decodes a standalone byte string, refusing trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        standalone(bytes, "capsule response", Self::decode)
    }

    /// `Err` for [`Response::Error`], the response otherwise.
    pub fn into_result(self) -> Result<Response> {
        match self {
            Response::Error(w) => Err(w.into_error()),
            other => Ok(other),
        }
    }

    /// The name of this response's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Error(_) => "error",
            Response::Unit => "unit",
            Response::ServerKey(_) => "server key",
            Response::Capsules(_) => "capsules",
            Response::Ack(_) => "ack",
            Response::Metadata(_) => "metadata",
            Response::Record(_) => "record",
            Response::Subrecord(_) => "subrecord",
            Response::Subrecords(_) => "subrecords",
            Response::SubrecordNames(_) => "subrecord names",
            Response::Checkpoint(_) => "checkpoint",
            Response::Inclusion { .. } => "inclusion proof",
            Response::Consistency(_) => "consistency proof",
            Response::Session(_) => "session",
            Response::RecordProof { .. } => "record proof",
            Response::SubrecordProof { .. } => "subrecord proof",
            Response::SubrecordsProof { .. } => "subrecords multiproof",
            Response::Sync { .. } => "sync message",
            Response::RecordAndProof { .. } => "record and proof",
        }
    }
}

fn result(r: Result<Response>) -> Response {
    r.unwrap_or_else(|e| Response::Error(WireError::from(&e)))
}

// ---------------------------------------------------------------------------------------
// Serving

/// Runs one request against `server`. Anti-entropy needs state between messages, so a
/// [`Request::Sync`] is refused here; serve it with a [`CapsuleService`].
pub fn dispatch(server: &CapsuleServer, req: Request) -> Response {
    result(run(server, req, &mut |_| Ok(())))
}

/// [`dispatch`], taking the memory of a large answer from `reserve` before reading it (see
/// [`CapsuleService::handle_bytes_within`]).
fn run(
    server: &CapsuleServer,
    req: Request,
    reserve: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Response> {
    Ok(match req {
        Request::ServerKey => Response::ServerKey(server.public_key()),
        Request::ListCapsules => Response::Capsules(server.capsule_names()?),
        Request::Create { meta } => Response::Ack(server.create(&meta)?),
        Request::Metadata { capsule } => Response::Metadata(server.metadata(&capsule)?),
        Request::Write {
            capsule,
            records,
            signatures,
        } => {
            // The ack names every record and signature: its memory is taken before the
            // write, so that once stored the write's answer is not dropped for the want
            // of it (its client could not tell whether the write happened).
            // Each body is held twice more while the write runs (decoded from the frame,
            // and framed as a chunk for the store): up to three times the frame in all.
            let bodies = records
                .iter()
                .fold(0usize, |n, r| n.saturating_add(r.body.len()));
            reserve(
                records
                    .len()
                    .saturating_add(signatures.len())
                    .saturating_mul(48)
                    .saturating_add(256)
                    .saturating_add(bodies.saturating_mul(2)),
            )?;
            Response::Ack(server.write(&capsule, &records, &signatures)?)
        }
        Request::Sign { capsule, name, sig } => Response::Ack(server.sign(&capsule, &name, sig)?),
        Request::Read { capsule, name } => {
            Response::Record(server.read_within(&capsule, &name, reserve)?)
        }
        Request::ReadSubrecord { capsule, sub } => Response::Subrecord(
            // Twice, as for many: as read, and in the encoded answer.
            server.read_subrecord_within(&capsule, &sub, &mut |n| reserve(n.saturating_mul(2)))?,
        ),
        Request::ReadSubrecords { capsule, subs } => Response::Subrecords(
            // Each subrecord twice: as read, and in the encoded answer.
            server
                .read_subrecords_within(&capsule, &subs, &mut |n| reserve(n.saturating_mul(2)))?,
        ),
        Request::Subrecords { capsule, record } => {
            Response::SubrecordNames(server.subrecords_within(&capsule, &record, reserve)?)
        }
        Request::CommitSubrecords {
            capsule,
            header,
            subrecords,
            sig,
        } => {
            // Checking them takes each subrecord's name and its tree's nodes (the tree is
            // kept for later proofs): more than their wire size when they are small.
            reserve(
                subrecords.len().saturating_mul(
                    std::mem::size_of::<Hash>() + 4 * std::mem::size_of::<Digest>(),
                ),
            )?;
            Response::Ack(server.commit_subrecords(&capsule, &header, &subrecords, sig)?)
        }
        Request::QueryFresh { capsule, nonce } => {
            Response::Checkpoint(server.query_fresh_within(&capsule, nonce, reserve)?)
        }
        Request::LogInclusion {
            capsule,
            name,
            size,
        } => {
            let (index, path) = server.log_inclusion(&capsule, &name, size)?;
            Response::Inclusion { index, path }
        }
        Request::LogConsistency {
            capsule,
            first,
            second,
        } => Response::Consistency(server.log_consistency(&capsule, first, second)?),
        Request::OpenSession {
            capsule,
            policy,
            mode,
            cached,
        } => Response::Session(server.open_session_with(&capsule, policy, mode, &cached)?),
        Request::CloseSession { session } => {
            server.close_session(session);
            Response::Unit
        }
        Request::Prove {
            capsule,
            name,
            session,
        } => {
            let Issued { proof_id, proof } = server.prove(&capsule, &name, session)?;
            Response::RecordProof { proof_id, proof }
        }
        Request::ProveSubrecord {
            capsule,
            sub,
            session,
        } => {
            let Issued { proof_id, proof } = server.prove_subrecord(&capsule, &sub, session)?;
            Response::SubrecordProof { proof_id, proof }
        }
        Request::ProveSubrecords {
            capsule,
            subs,
            session,
        } => {
            let Issued { proof_id, proof } = server.prove_subrecords(&capsule, &subs, session)?;
            Response::SubrecordsProof { proof_id, proof }
        }
        Request::ProveRecordSubrecords {
            capsule,
            record,
            session,
        } => {
            let Issued { proof_id, proof } =
                server.prove_record_subrecords_within(&capsule, &record, session, reserve)?;
            Response::SubrecordsProof { proof_id, proof }
        }
        Request::ReadProve {
            capsule,
            name,
            session,
        } => {
            let (body, Issued { proof_id, proof }) =
                server.read_and_prove_within(&capsule, &name, session, reserve)?;
            Response::RecordAndProof {
                proof_id,
                body,
                proof,
            }
        }
        Request::Ack { session, proof_id } => {
            server.ack(session, proof_id)?;
            Response::Unit
        }
        Request::Sync { .. } => {
            return Err(Error::invalid(
                "anti-entropy needs a CapsuleService endpoint (dispatch keeps no sessions)",
            ));
        }
    })
}

type SyncKey = (CapsuleName, PublicKey);
/// An open session: the names it holds, the session number its Hello carried, and its
/// state with its seal.
type OpenSync = (usize, u64, Arc<Mutex<OpenSession>>);

/// The responder's side of one open session: its state and its signatures.
struct OpenSession {
    state: SyncState,
    seal: SessionSeal,
}

/// A capsule server as a network endpoint: [`dispatch`] plus the responder side of
/// anti-entropy sessions, kept between messages per (capsule, initiator key). A
/// [`SyncMsg::Hello`] starts a session (replacing an unfinished one of the same key); a
/// session that ends or fails is dropped; at most [`MAX_SYNC_SESSIONS`] are kept.
pub struct CapsuleService {
    server: Arc<CapsuleServer>,
    syncs: Mutex<LruCache<SyncKey, OpenSync>>,
    /// Most names all open sessions compare together ([`MAX_SYNC_NAMES`] by default).
    max_sync_names: usize,
}

impl CapsuleService {
    /// An endpoint for `server`.
    pub fn new(server: Arc<CapsuleServer>) -> Self {
        let cap = NonZeroUsize::new(MAX_SYNC_SESSIONS).unwrap_or(NonZeroUsize::MIN);
        CapsuleService {
            server,
            syncs: Mutex::new(LruCache::new(cap)),
            max_sync_names: MAX_SYNC_NAMES,
        }
    }

    /// This endpoint with open anti-entropy sessions comparing at most `names` names
    /// together (default [`MAX_SYNC_NAMES`]).
    pub fn with_max_sync_names(mut self, names: usize) -> Self {
        self.max_sync_names = names;
        self
    }

    /// The server.
    pub fn server(&self) -> &Arc<CapsuleServer> {
        &self.server
    }

    /// Anti-entropy sessions open now.
    pub fn open_syncs(&self) -> usize {
        self.syncs.lock().len()
    }

    /// Runs one request.
    pub fn handle(&self, req: Request) -> Response {
        self.handle_within(req, &mut |_| Ok(()))
    }

    /// Decodes one request, runs it, and encodes the response (a request that does not
    /// decode gets a [`ErrorCode::Decode`] error response).
    pub fn handle_bytes(&self, req: &[u8]) -> Vec<u8> {
        self.handle_bytes_within(req, &mut |_| Ok(()))
    }

    /// [`CapsuleService::handle_bytes`], taking the memory a large answer needs from
    /// `reserve` before building it: a record's body (twice: as read, and in the encoded
    /// answer) before it is read from the store, each subrecord of a batched read (twice)
    /// as it is read, a record's list of subrecord names before it is read, and a sync
    /// answer's (a frame; 8 MiB for a Hello's coded symbols). An error from `reserve` (the endpoint's
    /// memory stayed in use) is answered as it is, with nothing read or issued. An answer
    /// larger than a frame ([`MAX_FRAME`]), which no reader would take, is answered with
    /// an error instead.
    pub fn handle_bytes_within(
        &self,
        req: &[u8],
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Vec<u8> {
        let resp = match Request::from_bytes(req) {
            Ok(r) => self.handle_within(r, reserve),
            Err(e) => Response::Error(WireError::from(&e)),
        };
        let bytes = resp.to_bytes();
        if bytes.len() <= MAX_FRAME {
            return bytes;
        }
        Response::Error(WireError::new(
            ErrorCode::Unavailable,
            format!(
                "the answer ({}) came to {} bytes, more than the {MAX_FRAME} a frame \
                 carries; ask for less at a time",
                resp.kind(),
                bytes.len()
            ),
        ))
        .to_bytes()
    }

    fn handle_within(
        &self,
        req: Request,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Response {
        match req {
            Request::Sync {
                capsule,
                peer,
                session,
                msg,
                sig,
            } => result(self.sync(capsule, peer, session, msg, &sig, reserve)),
            other => result(run(&self.server, other, reserve)),
        }
    }

    fn sync(
        &self,
        capsule: CapsuleName,
        peer: PublicKey,
        session: u64,
        msg: SyncMsg,
        sig: &Signature,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Response> {
        let key = (capsule, peer);
        let server = &*self.server;
        if let SyncMsg::Hello { capsule: c, .. } = &msg {
            if *c != capsule {
                return Err(Error::invalid(
                    "Hello names another capsule than the request",
                ));
            }
            if session == 0 {
                return Err(Error::invalid(
                    "a Hello names its session by a random number other than 0",
                ));
            }
            // A Hello that is not the peer's own (or is a replay), or that the peer did not
            // sign for this session number, is refused before a session state is built
            // for it.
            let nonce = crate::server::random_session_number()?;
            let mut seal =
                SessionSeal::responder(capsule, peer, server.public_key(), session, nonce);
            seal.open(Some(&msg), sig)?;
            msg.check_hello(&peer, server)?;
            // Its answer is a first batch of coded symbols (at most 65,536, held and
            // encoded: about 6 MiB), and the session holds every name it compares (sorted,
            // and in the encoder): taken once the Hello is known to be the peer's, so
            // made-up messages cost no memory, and counted before any name is collected
            // (a Hello under a fresh key starts from the capsule's first record).
            // A session compares at most `max` names: past that, the oldest of them, and
            // the next session goes on from there (refusing it refused a replica with
            // more to compare for good, as its cursor never moved).
            let max = self.max_sync_names;
            let backlog = server.sync_backlog(&capsule, &peer)?.min(max);
            reserve((8 << 20) + backlog.saturating_mul(SYNC_NAME_BYTES))?;
            let mut fresh = SyncState::new_within(server, capsule, peer, max)?;
            let names = fresh.names();
            if names > max {
                return Err(Error::Unavailable(format!(
                    "an anti-entropy session of capsule {capsule} would compare {names} \
                     records, more than the {max} this server holds for sessions"
                )));
            }
            // The Hello is handled (its stamp taken) before the session enters the table:
            // of two copies arriving together, the one refused as a replay never replaces
            // (and, failing, removes) the one taken.
            let out = fresh.handle(server, msg)?;
            let out_sig = seal.seal(server, out.as_ref())?;
            let names = fresh.weight();
            if !fresh.is_finished() {
                let mut syncs = self.syncs.lock();
                syncs.pop(&key);
                // Room for this session's names: drop the least recently used ones.
                let mut held: usize = syncs.iter().map(|(_, (n, _, _))| n).sum();
                while held + names > max {
                    match syncs.pop_lru() {
                        Some((_, (n, _, _))) => held -= n,
                        None => break,
                    }
                }
                let open = OpenSession { state: fresh, seal };
                syncs.put(key, (names, session, Arc::new(Mutex::new(open))));
            }
            return Ok(Response::Sync {
                msg: out,
                sig: out_sig,
                nonce,
            });
        }
        // Only with the number its Hello carried: the same answer as no session, so a
        // guess learns nothing.
        let state = self
            .syncs
            .lock()
            .get(&key)
            .filter(|(_, id, _)| *id == session)
            .map(|(_, _, s)| s.clone())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "no anti-entropy session {session} of capsule {capsule} with {peer}; \
                     start with Hello"
                ))
            })?;
        // A later answer may fill a frame (a batch of coded symbols, records up to the
        // message budget with the shape lists): taken for a session that exists (before
        // its seal moves on, so that a refusal leaves the session as it was). So does
        // applying the message's records: their decoded bodies, and per subrecord its
        // name, leaf, index and list entries (a few MiB of empty subrecords on the wire
        // took hundreds of MiB, counted as one frame).
        reserve(MAX_FRAME.saturating_add(sync_apply_bytes(&msg)))?;
        let mut open = state.lock();
        // A message the initiator did not sign as its next one is refused and leaves the
        // session as it was: someone who saw the session number cannot end it.
        open.seal.open(Some(&msg), sig)?;
        let nonce = open.seal.nonce().unwrap_or(0);
        let out = open.state.handle(server, msg).and_then(|out| {
            let sig = open.seal.seal(server, out.as_ref())?;
            Ok((out, sig))
        });
        let weight = open.state.weight();
        let mut syncs = self.syncs.lock();
        let ours = syncs
            .peek(&key)
            .is_some_and(|(_, _, s)| Arc::ptr_eq(s, &state));
        if out.is_err() || open.state.is_finished() {
            if ours {
                syncs.pop(&key);
            }
        } else if ours {
            // What a session holds grows as it runs (the names it sent or was sent, its
            // backlog): other sessions make room for it, least recently used first, so
            // sessions that each queue a whole capsule cannot pile up. This one is never
            // dropped for its own growth, which the capsule's size bounds.
            if let Some(entry) = syncs.get_mut(&key) {
                entry.0 = weight;
            }
            let mut held: usize = syncs.iter().map(|(_, (n, _, _))| n).sum();
            while held > self.max_sync_names && syncs.len() > 1 {
                match syncs.pop_lru() {
                    Some((k, v)) if k == key => {
                        // Touched by another message meanwhile: keep it, most recent.
                        syncs.put(k, v);
                        break;
                    }
                    Some((_, (n, _, _))) => held -= n,
                    None => break,
                }
            }
        }
        drop(syncs);
        drop(open);
        let (msg, sig) = out?;
        Ok(Response::Sync { msg, sig, nonce })
    }
}

/// Settings of [`serve_tcp`] and [`RemoteCapsule`]: frames up to [`MAX_FRAME`].
pub fn server_config() -> ServerConfig {
    ServerConfig {
        max_frame: MAX_FRAME,
        ..ServerConfig::default()
    }
}

/// Client settings matching [`server_config`].
pub fn client_config() -> ClientConfig {
    ClientConfig {
        max_frame: MAX_FRAME,
        ..ClientConfig::default()
    }
}

/// Memory applying the records of `msg` takes beyond its frame: each body decoded, and per
/// subrecord about [`SYNC_SUBRECORD_BYTES`] (its name and leaf while it is checked, then
/// its index and list entries once taken).
fn sync_apply_bytes(msg: &SyncMsg) -> usize {
    let records = match msg {
        SyncMsg::Exchange { records, .. } | SyncMsg::Patch { records, .. } => records,
        _ => return 0,
    };
    records.iter().fold(0usize, |n, r| {
        n.saturating_add(match &r.body {
            SyncBody::Plain(b) => b.len(),
            SyncBody::Subrecords(s) => s
                .heap_bytes()
                .saturating_add(s.len().saturating_mul(SYNC_SUBRECORD_BYTES)),
        })
    })
}

/// Bytes [`sync_apply_bytes`] counts per subrecord (a 33-byte name and a 32-byte leaf while
/// checked, a 72-byte index entry and a 34-byte list entry once taken, with overheads).
const SYNC_SUBRECORD_BYTES: usize = 200;

/// Serves `server` over TCP on `addr` (e.g. `"127.0.0.1:0"`; see
/// [`ServerHandle::local_addr`]) until the handle is shut down or dropped.
pub fn serve_tcp(server: Arc<CapsuleServer>, addr: impl ToSocketAddrs) -> Result<ServerHandle> {
    serve_service(Arc::new(CapsuleService::new(server)), addr, server_config())
}

/// Serves `service` over TCP with `config`.
pub fn serve_service(
    service: Arc<CapsuleService>,
    addr: impl ToSocketAddrs,
    config: ServerConfig,
) -> Result<ServerHandle> {
    cairn_net::serve_reserving(
        addr,
        config,
        move |req: &[u8], mem: &mut Reserve<'_, '_>| {
            service.handle_bytes_within(req, &mut |n| mem.reserve(n))
        },
    )
}

// ---------------------------------------------------------------------------------------
// Client

/// A connection to a remote capsule server. Typed methods mirror [`CapsuleServer`]'s; a
/// remote error comes back as the same [`cairn_core::Error`] variant, and the connection
/// stays usable after it (not after a transport error).
///
/// Pipelining: [`RemoteCapsule::send`] / [`RemoteCapsule::send_bytes`] queue requests and
/// [`RemoteCapsule::recv`] reads responses in the same order; keep a bounded number in
/// flight (see [`cairn_net::rpc`]), or use [`RemoteCapsule::call_batch`].
#[derive(Debug)]
pub struct RemoteCapsule {
    client: Client,
    buf: Vec<u8>,
}

fn unexpected<T>(op: &str, r: &Response) -> Result<T> {
    Err(Error::decode(format!(
        "server answered {op} with a {} response",
        r.kind()
    )))
}

impl RemoteCapsule {
    /// Connects to a server started by [`serve_tcp`].
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Ok(Self::from_client(Client::connect_with(
            addr,
            client_config(),
        )?))
    }

    /// Wraps an RPC connection.
    pub fn from_client(client: Client) -> Self {
        RemoteCapsule {
            client,
            buf: Vec::new(),
        }
    }

    /// Queues an encoded request (see [`encode_write`], [`Request::to_bytes`]).
    pub fn send_bytes(&mut self, req: &[u8]) -> Result<()> {
        self.client.send(req)
    }

    /// Queues a request.
    pub fn send(&mut self, req: &Request) -> Result<()> {
        self.client.send(&req.to_bytes())
    }

    /// Requests queued or sent whose responses have not been read.
    pub fn in_flight(&self) -> usize {
        self.client.in_flight()
    }

    /// The response to the oldest unanswered request; an error response is `Err`.
    pub fn recv(&mut self) -> Result<Response> {
        self.client.recv_into(&mut self.buf)?;
        Response::from_bytes(&self.buf)?.into_result()
    }

    /// Sends one encoded request and returns its response. Refused while responses to
    /// pipelined requests ([`RemoteCapsule::send`]) are unread: it would read the oldest of
    /// them as its own.
    pub fn call_bytes(&mut self, req: &[u8]) -> Result<Response> {
        if self.client.in_flight() != 0 {
            return Err(Error::invalid(format!(
                "a call with {} pipelined responses unread (recv them first)",
                self.client.in_flight()
            )));
        }
        self.client.send(req)?;
        self.recv()
    }

    /// Sends one request and returns its response.
    pub fn call(&mut self, req: &Request) -> Result<Response> {
        self.call_bytes(&req.to_bytes())
    }

    /// Sends all `reqs` pipelined; returns each one's result in order.
    pub fn call_batch(&mut self, reqs: &[Request]) -> Result<Vec<Result<Response>>> {
        let encoded: Vec<Vec<u8>> = reqs.iter().map(Request::to_bytes).collect();
        Ok(self
            .client
            .call_batch(&encoded)?
            .iter()
            .map(|b| Response::from_bytes(b).and_then(Response::into_result))
            .collect())
    }

    /// Sends all `reqs` pipelined and hands each one's result to `each` as soon as its
    /// response arrives, in order: the caller verifies early responses while the server
    /// still works on later ones. The first error `each` returns ends the call (the
    /// remaining responses are read and dropped) and is returned.
    pub fn call_batch_each(
        &mut self,
        reqs: &[Request],
        mut each: impl FnMut(usize, Result<Response>) -> Result<()>,
    ) -> Result<()> {
        let encoded: Vec<Vec<u8>> = reqs.iter().map(Request::to_bytes).collect();
        self.client.call_batch_each(&encoded, |i, b| {
            each(i, Response::from_bytes(b).and_then(Response::into_result))
        })
    }

    fn ack(&mut self, op: &str, req: &[u8]) -> Result<Ack> {
        match self.call_bytes(req)? {
            Response::Ack(a) => Ok(a),
            other => unexpected(op, &other),
        }
    }

    fn unit(&mut self, req: &Request) -> Result<()> {
        match self.call(req)? {
            Response::Unit => Ok(()),
            other => unexpected(req.op(), &other),
        }
    }

    /// The server's public key.
    pub fn server_key(&mut self) -> Result<PublicKey> {
        match self.call(&Request::ServerKey)? {
            Response::ServerKey(k) => Ok(k),
            other => unexpected("server_key", &other),
        }
    }

    /// Names of all capsules on the server.
    pub fn list_capsules(&mut self) -> Result<Vec<CapsuleName>> {
        match self.call(&Request::ListCapsules)? {
            Response::Capsules(c) => Ok(c),
            other => unexpected("list_capsules", &other),
        }
    }

    /// [`CapsuleServer::create`].
    ///
    /// The ack is returned as received, unverified: check it with [`Ack::verify`] against
    /// the server's key and the [`AckKind`] expected before trusting it.
    pub fn create(&mut self, meta: &CapsuleMetadata) -> Result<Ack> {
        let req = Request::Create { meta: meta.clone() }.to_bytes();
        self.ack("create", &req)
    }

    /// [`CapsuleServer::metadata`].
    pub fn metadata(&mut self, capsule: &CapsuleName) -> Result<CapsuleMetadata> {
        match self.call(&Request::Metadata { capsule: *capsule })? {
            Response::Metadata(m) => Ok(m),
            other => unexpected("metadata", &other),
        }
    }

    /// [`CapsuleServer::write`].
    ///
    /// The ack is returned as received, unverified: check it with [`Ack::verify`] against
    /// the server's key and the [`AckKind`] expected before trusting it.
    pub fn write(
        &mut self,
        capsule: &CapsuleName,
        records: &[Record],
        signatures: &[(RecordName, WriterSignature)],
    ) -> Result<Ack> {
        let req = encode_write(capsule, records, signatures);
        self.ack("write", &req)
    }

    /// [`CapsuleServer::sign`].
    ///
    /// The ack is returned as received, unverified: check it with [`Ack::verify`] against
    /// the server's key and the [`AckKind`] expected before trusting it.
    pub fn sign(
        &mut self,
        capsule: &CapsuleName,
        name: &RecordName,
        sig: WriterSignature,
    ) -> Result<Ack> {
        let req = Request::Sign {
            capsule: *capsule,
            name: *name,
            sig,
        }
        .to_bytes();
        self.ack("sign", &req)
    }

    /// [`CapsuleServer::commit_subrecords`].
    ///
    /// The ack is returned as received, unverified: check it with [`Ack::verify`] against
    /// the server's key and the [`AckKind`] expected before trusting it.
    pub fn commit_subrecords(
        &mut self,
        capsule: &CapsuleName,
        header: &RecordHeader,
        subrecords: &SealedSubrecords,
        sig: Option<WriterSignature>,
    ) -> Result<Ack> {
        let req = encode_commit_subrecords(capsule, header, subrecords, sig.as_ref());
        self.ack("commit_subrecords", &req)
    }

    /// [`CapsuleServer::read`].
    pub fn read(&mut self, capsule: &CapsuleName, name: &RecordName) -> Result<Record> {
        match self.call(&Request::Read {
            capsule: *capsule,
            name: *name,
        })? {
            Response::Record(r) => Ok(r),
            other => unexpected("read", &other),
        }
    }

    /// [`CapsuleServer::read_subrecords`].
    pub fn read_subrecords(
        &mut self,
        capsule: &CapsuleName,
        subs: &[Hash],
    ) -> Result<Vec<Vec<u8>>> {
        match self.call(&Request::ReadSubrecords {
            capsule: *capsule,
            subs: subs.to_vec(),
        })? {
            Response::Subrecords(bs) if bs.len() == subs.len() => Ok(bs),
            Response::Subrecords(bs) => Err(Error::decode(format!(
                "server answered {} subrecords for {} names",
                bs.len(),
                subs.len()
            ))),
            other => unexpected("read_subrecords", &other),
        }
    }

    /// [`CapsuleServer::read_subrecord`].
    pub fn read_subrecord(&mut self, capsule: &CapsuleName, sub: &Hash) -> Result<Vec<u8>> {
        match self.call(&Request::ReadSubrecord {
            capsule: *capsule,
            sub: *sub,
        })? {
            Response::Subrecord(b) => Ok(b),
            other => unexpected("read_subrecord", &other),
        }
    }

    /// [`CapsuleServer::subrecords`].
    pub fn subrecords(&mut self, capsule: &CapsuleName, record: &RecordName) -> Result<Vec<Hash>> {
        match self.call(&Request::Subrecords {
            capsule: *capsule,
            record: *record,
        })? {
            Response::SubrecordNames(n) => Ok(n),
            other => unexpected("subrecords", &other),
        }
    }

    /// [`CapsuleServer::query_fresh`] with a fresh random nonce; returns the checkpoint
    /// once it verifies against `server` (the server's key), this capsule and that nonce.
    pub fn query_fresh(&mut self, capsule: &CapsuleName, server: &PublicKey) -> Result<Checkpoint> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)
            .map_err(|e| Error::Unavailable(format!("no randomness for a nonce: {e}")))?;
        match self.call(&Request::QueryFresh {
            capsule: *capsule,
            nonce,
        })? {
            Response::Checkpoint(c) => {
                c.verify(server, capsule, &nonce)?;
                Ok(c)
            }
            other => unexpected("query_fresh", &other),
        }
    }

    /// [`CapsuleServer::log_inclusion`]: the server's answer, not yet checked; check it
    /// against a verified checkpoint with [`crate::server::Checkpoint::verify_includes`].
    pub fn log_inclusion(
        &mut self,
        capsule: &CapsuleName,
        name: &RecordName,
        size: u64,
    ) -> Result<(u64, Vec<Digest>)> {
        match self.call(&Request::LogInclusion {
            capsule: *capsule,
            name: *name,
            size,
        })? {
            Response::Inclusion { index, path } => Ok((index, path)),
            other => unexpected("log_inclusion", &other),
        }
    }

    /// [`CapsuleServer::log_consistency`]: the server's answer, not yet checked; check it
    /// between two verified checkpoints with
    /// [`crate::server::Checkpoint::verify_extends`].
    pub fn log_consistency(
        &mut self,
        capsule: &CapsuleName,
        first: u64,
        second: u64,
    ) -> Result<Vec<Digest>> {
        match self.call(&Request::LogConsistency {
            capsule: *capsule,
            first,
            second,
        })? {
            Response::Consistency(p) => Ok(p),
            other => unexpected("log_consistency", &other),
        }
    }

    /// [`CapsuleServer::open_session`].
    pub fn open_session(
        &mut self,
        capsule: &CapsuleName,
        policy: CachePolicy,
        cached: &[Hash],
    ) -> Result<SessionId> {
        self.open_session_with(capsule, policy, MirrorMode::OnAck, cached)
    }

    /// [`CapsuleServer::open_session_with`].
    pub fn open_session_with(
        &mut self,
        capsule: &CapsuleName,
        policy: CachePolicy,
        mode: MirrorMode,
        cached: &[Hash],
    ) -> Result<SessionId> {
        match self.call(&Request::OpenSession {
            capsule: *capsule,
            policy,
            mode,
            cached: cached.to_vec(),
        })? {
            Response::Session(s) => Ok(s),
            other => unexpected("open_session", &other),
        }
    }

    /// [`CapsuleServer::close_session`].
    pub fn close_session(&mut self, session: SessionId) -> Result<()> {
        self.unit(&Request::CloseSession { session })
    }

    /// [`CapsuleServer::prove`].
    pub fn prove(
        &mut self,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
    ) -> Result<Issued<RecordProof>> {
        match self.call(&Request::Prove {
            capsule: *capsule,
            name: *name,
            session,
        })? {
            Response::RecordProof { proof_id, proof } => Ok(Issued { proof_id, proof }),
            other => unexpected("prove", &other),
        }
    }

    /// [`CapsuleServer::prove_subrecord`].
    pub fn prove_subrecord(
        &mut self,
        capsule: &CapsuleName,
        sub: &Hash,
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordProof>> {
        match self.call(&Request::ProveSubrecord {
            capsule: *capsule,
            sub: *sub,
            session,
        })? {
            Response::SubrecordProof { proof_id, proof } => Ok(Issued { proof_id, proof }),
            other => unexpected("prove_subrecord", &other),
        }
    }

    /// [`CapsuleServer::prove_subrecords`].
    pub fn prove_subrecords(
        &mut self,
        capsule: &CapsuleName,
        subs: &[Hash],
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordsProof>> {
        match self.call(&Request::ProveSubrecords {
            capsule: *capsule,
            subs: subs.to_vec(),
            session,
        })? {
            Response::SubrecordsProof { proof_id, proof } => Ok(Issued { proof_id, proof }),
            other => unexpected("prove_subrecords", &other),
        }
    }

    /// [`CapsuleServer::prove_record_subrecords`].
    pub fn prove_record_subrecords(
        &mut self,
        capsule: &CapsuleName,
        record: &RecordName,
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordsProof>> {
        match self.call(&Request::ProveRecordSubrecords {
            capsule: *capsule,
            record: *record,
            session,
        })? {
            Response::SubrecordsProof { proof_id, proof } => Ok(Issued { proof_id, proof }),
            other => unexpected("prove_record_subrecords", &other),
        }
    }

    /// [`CapsuleServer::read_and_prove`]: the sealed body and the issued proof.
    pub fn read_and_prove(
        &mut self,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
    ) -> Result<(Vec<u8>, Issued<RecordProof>)> {
        match self.call(&Request::ReadProve {
            capsule: *capsule,
            name: *name,
            session,
        })? {
            Response::RecordAndProof {
                proof_id,
                body,
                proof,
            } => Ok((body, Issued { proof_id, proof })),
            other => unexpected("read_prove", &other),
        }
    }

    /// [`CapsuleServer::ack`].
    pub fn ack_proof(&mut self, session: SessionId, proof_id: u64) -> Result<()> {
        self.unit(&Request::Ack { session, proof_id })
    }

    /// Sends one anti-entropy message of session `session` (see [`Request::Sync`]) as the
    /// initiator `peer`, with its signature (see [`SessionSeal::seal`]); returns the
    /// responder's answer, its signature and the nonce it came with, unchecked (see
    /// [`SessionSeal::take_nonce`] and [`SessionSeal::open`]).
    pub fn sync_message(
        &mut self,
        capsule: &CapsuleName,
        peer: PublicKey,
        session: u64,
        msg: SyncMsg,
        sig: Signature,
    ) -> Result<(Option<SyncMsg>, Signature, u64)> {
        match self.call(&Request::Sync {
            capsule: *capsule,
            peer,
            session,
            msg,
            sig,
        })? {
            Response::Sync { msg, sig, nonce } => Ok((msg, sig, nonce)),
            other => unexpected("sync", &other),
        }
    }

    /// Runs a whole anti-entropy session of `capsule` between `local` (the initiator) and
    /// the remote server, the replica whose server key is `replica`; returns the local
    /// side's report. The key is the caller's to know: the server's own claim
    /// ([`RemoteCapsule::server_key`]) travels unauthenticated, so a server answering with
    /// another key is refused ([`Error::Rejected`]) before anything is sent.
    pub fn sync_with(
        &mut self,
        local: &CapsuleServer,
        capsule: &CapsuleName,
        replica: &PublicKey,
    ) -> Result<SyncReport> {
        let remote = self.server_key()?;
        if remote != *replica {
            return Err(Error::Rejected(format!(
                "the server reached is {remote}, not the replica {replica} to sync with"
            )));
        }
        let me = local.public_key();
        let mut st = SyncState::new(local, *capsule, remote)?;
        let mut msg = st.start(local)?;
        let session = crate::server::random_session_number()?;
        let mut seal = SessionSeal::initiator(*capsule, me, remote, session);
        for _ in 0..MAX_STEPS {
            let sig = seal.seal(local, Some(&msg))?;
            let (reply, sig, nonce) = self.sync_message(capsule, me, session, msg, sig)?;
            // Every answer must be the responder's own, in order: a forged InSync or Done
            // would end the session (and move this side's cursor) early.
            seal.take_nonce(nonce)?;
            seal.open(reply.as_ref(), &sig)?;
            let Some(reply) = reply else {
                // The responder's side is over only after this side's (its Done).
                if !st.is_finished() {
                    return Err(Error::Rejected(
                        "the responder ended the anti-entropy session before it was over".into(),
                    ));
                }
                return Ok(st.report());
            };
            match st.handle(local, reply)? {
                Some(next) => msg = next,
                None => return Ok(st.report()),
            }
        }
        Err(Error::Unavailable(
            "anti-entropy session did not end".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cairn_core::{HashAlgo, SigningKey};
    use proptest::prelude::*;

    use super::*;
    use crate::metadata::BodyCipher;
    use crate::proof::{Anchor, SubrecordGroup};
    use crate::record::BodyRef;

    fn h(d: [u8; 32]) -> Hash {
        Hash::new(HashAlgo::Blake3, d)
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_seed(&[seed; 32])
    }

    fn ws(writer: u32, seed: u8) -> WriterSignature {
        WriterSignature {
            writer,
            sig: key(seed).sign(b"test", &[seed]),
        }
    }

    fn header(capsule: u8, body: u8, subs: Option<u64>, bps: &[u8]) -> RecordHeader {
        let mut backpointers: Vec<RecordName> = Vec::new();
        for b in bps {
            let n = RecordName(h([*b; 32]));
            if !backpointers.contains(&n) {
                backpointers.push(n);
            }
        }
        RecordHeader {
            capsule: CapsuleName(h([capsule; 32])),
            body: match subs {
                Some(count) => BodyRef::Subrecords {
                    root: h([body; 32]),
                    count: count.max(1),
                },
                None => BodyRef::Plain {
                    hash: h([body; 32]),
                    len: body as u64 * 1000,
                },
            },
            backpointers,
        }
    }

    fn meta(seed: u8, description: String, settings: BTreeMap<String, String>) -> CapsuleMetadata {
        CapsuleMetadata {
            algo: HashAlgo::Blake3,
            writers: vec![key(seed).public(), key(seed.wrapping_add(1)).public()],
            description,
            created_ms: seed as u64 * 12345,
            cipher: match seed % 3 {
                0 => BodyCipher::Plaintext,
                1 => BodyCipher::XChaCha20Poly1305,
                _ => BodyCipher::Aes256GcmSiv,
            },
            key_distribution: "kds".into(),
            settings,
        }
    }

    fn record_proof(n: u8, signed: bool) -> RecordProof {
        RecordProof {
            chain: (0..n.max(1))
                .map(|i| header(1, i, None, &[i, i + 1]))
                .collect(),
            anchor: if signed {
                Anchor::Signed(ws(n as u32, n))
            } else {
                Anchor::Cached
            },
        }
    }

    fn capsule() -> CapsuleName {
        CapsuleName(h([1; 32]))
    }

    fn name(b: u8) -> RecordName {
        RecordName(h([b; 32]))
    }

    fn sync_record(i: u8) -> SyncRecord {
        SyncRecord {
            header: header(1, i, (i % 2 == 1).then_some(3), &[i]),
            body: if i % 2 == 1 {
                SyncBody::Subrecords(vec![vec![i; 3], vec![], vec![i]].into())
            } else {
                SyncBody::Plain(vec![i; i as usize])
            },
            signature: i.is_multiple_of(3).then(|| ws(0, i)),
        }
    }

    /// Each record's subrecord list is sized by its own subrecords as they decode: it was
    /// given the capacity of the whole rest of the message, so a message of many small
    /// subrecord records asked for memory growing with the square of its size.
    #[test]
    fn subrecord_lists_take_memory_by_their_own_size() {
        let records: Vec<SyncRecord> = (0..2000u32)
            .map(|i| SyncRecord {
                header: header(1, (i % 250) as u8, Some(1), &[]),
                body: SyncBody::Subrecords(vec![vec![7u8; 3]].into()),
                signature: None,
            })
            .collect();
        let msg = SyncMsg::Exchange {
            records,
            want: vec![],
            heads: vec![],
            roots: vec![],
            missing: vec![],
        };
        let bytes = msg.to_bytes();
        let SyncMsg::Exchange { records, .. } = SyncMsg::from_bytes(&bytes).unwrap() else {
            panic!("decoded as another message")
        };
        let held: usize = records
            .iter()
            .map(|r| match &r.body {
                SyncBody::Subrecords(s) => s.heap_bytes(),
                SyncBody::Plain(b) => b.capacity(),
            })
            .sum();
        assert!(
            held <= 2000 * 64,
            "{held} bytes for {} on the wire",
            bytes.len()
        );
    }

    fn sync_msgs() -> Vec<SyncMsg> {
        vec![
            SyncMsg::Hello {
                capsule: capsule(),
                quick: [7; 32],
                count: 300,
                at: 1_764_000_000_000_000,
                sig: SigningKey::from_seed(&[4; 32]).sign(b"test", b"hello"),
            },
            SyncMsg::InSync,
            SyncMsg::Symbols(vec![
                CodedSymbol {
                    sum: [1; 32],
                    check: u64::MAX,
                    count: -3,
                },
                CodedSymbol::default(),
            ]),
            SyncMsg::More,
            SyncMsg::SendNames { from: 0 },
            SyncMsg::SendNames { from: 1 << 40 },
            SyncMsg::Names {
                names: vec![name(1), name(2)],
                more: true,
            },
            SyncMsg::Names {
                names: vec![],
                more: false,
            },
            SyncMsg::Exchange {
                records: vec![sync_record(0), sync_record(1), sync_record(2)],
                want: vec![name(3)],
                heads: vec![name(4), name(5)],
                roots: vec![],
                missing: vec![name(6)],
            },
            SyncMsg::Patch {
                records: vec![sync_record(3)],
                want: vec![name(8)],
                heads: vec![],
                roots: vec![name(7)],
                missing: vec![],
            },
            SyncMsg::Done,
        ]
    }

    fn requests() -> Vec<Request> {
        let c = capsule();
        let mut out = vec![
            Request::ServerKey,
            Request::ListCapsules,
            Request::Create {
                meta: meta(
                    3,
                    "photos".into(),
                    BTreeMap::from([("a".into(), "b".into())]),
                ),
            },
            Request::Metadata { capsule: c },
            Request::Write {
                capsule: c,
                records: vec![
                    Record {
                        header: header(1, 2, None, &[]),
                        body: vec![1, 2, 3],
                    },
                    Record {
                        header: header(1, 3, None, &[4, 5]),
                        body: vec![],
                    },
                ],
                signatures: vec![(name(9), ws(1, 9))],
            },
            Request::Write {
                capsule: c,
                records: vec![],
                signatures: vec![],
            },
            Request::Sign {
                capsule: c,
                name: name(2),
                sig: ws(300, 4),
            },
            Request::Read {
                capsule: c,
                name: name(3),
            },
            Request::ReadSubrecord {
                capsule: c,
                sub: h([4; 32]),
            },
            Request::Subrecords {
                capsule: c,
                record: name(5),
            },
            Request::CommitSubrecords {
                capsule: c,
                header: header(1, 6, Some(2), &[1]),
                subrecords: vec![vec![1; 10], vec![]].into(),
                sig: Some(ws(0, 6)),
            },
            Request::CommitSubrecords {
                capsule: c,
                header: header(1, 6, Some(1), &[]),
                subrecords: vec![vec![1]].into(),
                sig: None,
            },
            Request::QueryFresh {
                capsule: c,
                nonce: [7; 16],
            },
            Request::LogInclusion {
                capsule: c,
                name: name(7),
                size: 1 << 40,
            },
            Request::LogConsistency {
                capsule: c,
                first: 3,
                second: 9,
            },
            Request::OpenSession {
                capsule: c,
                policy: CachePolicy::Lru { capacity: 100 },
                mode: MirrorMode::OnAck,
                cached: vec![h([8; 32]), Hash::new(HashAlgo::Sha256, [9; 32])],
            },
            Request::OpenSession {
                capsule: c,
                policy: CachePolicy::Off,
                mode: MirrorMode::OnIssue,
                cached: vec![],
            },
            Request::CloseSession {
                session: SessionId(u64::MAX),
            },
            Request::Prove {
                capsule: c,
                name: name(1),
                session: Some(SessionId(4)),
            },
            Request::Prove {
                capsule: c,
                name: name(1),
                session: None,
            },
            Request::ProveSubrecord {
                capsule: c,
                sub: h([2; 32]),
                session: Some(SessionId(0)),
            },
            Request::ProveSubrecords {
                capsule: c,
                subs: vec![h([2; 32]), h([3; 32])],
                session: Some(SessionId(1)),
            },
            Request::ProveSubrecords {
                capsule: c,
                subs: vec![],
                session: None,
            },
            Request::ProveRecordSubrecords {
                capsule: c,
                record: name(2),
                session: Some(SessionId(3)),
            },
            Request::ReadSubrecords {
                capsule: c,
                subs: vec![h([5; 32]), h([6; 32]), h([5; 32])],
            },
            Request::ReadProve {
                capsule: c,
                name: name(2),
                session: Some(SessionId(5)),
            },
            Request::ReadProve {
                capsule: c,
                name: name(3),
                session: None,
            },
            Request::Ack {
                session: SessionId(3),
                proof_id: 77,
            },
        ];
        for msg in sync_msgs() {
            out.push(Request::Sync {
                capsule: c,
                peer: key(5).public(),
                session: u64::MAX - 3,
                sig: key(5).sign(b"m", &msg.to_bytes()),
                msg,
            });
        }
        out
    }

    fn responses() -> Vec<Response> {
        let c = capsule();
        let server = key(9);
        let mut out = vec![
            Response::Unit,
            Response::ServerKey(server.public()),
            Response::Capsules(vec![c, CapsuleName(h([2; 32]))]),
            Response::Metadata(meta(4, "".into(), BTreeMap::new())),
            Response::Record(Record {
                header: header(1, 2, None, &[3]),
                body: vec![5; 100],
            }),
            Response::Subrecord(vec![1, 2]),
            Response::Subrecords(vec![vec![1, 2], vec![], vec![3; 40]]),
            Response::SubrecordNames(vec![h([1; 32]), h([2; 32])]),
            Response::Checkpoint(Checkpoint {
                capsule: c,
                size: 10,
                root: [3; 32],
                heads: vec![name(1), name(2)],
                time_ms: 1_700_000_000_000,
                nonce: [9; 16],
                server: server.public(),
                sig: server.sign(b"x", b"y"),
            }),
            Response::Inclusion {
                index: 4,
                path: vec![[1; 32], [2; 32]],
            },
            Response::Consistency(vec![]),
            Response::Session(SessionId(12)),
            Response::RecordProof {
                proof_id: 0,
                proof: record_proof(3, true),
            },
            Response::RecordProof {
                proof_id: 9,
                proof: record_proof(1, false),
            },
            Response::SubrecordProof {
                proof_id: 2,
                proof: SubrecordProof {
                    index: 3,
                    count: 7,
                    path: vec![[4; 32]; 3],
                    record: Some(record_proof(2, true)),
                },
            },
            Response::SubrecordsProof {
                proof_id: 4,
                proof: SubrecordsProof {
                    groups: vec![
                        SubrecordGroup {
                            count: 9,
                            leaves: vec![(0, 1), (5, 0)],
                            siblings: vec![[6; 32]; 3],
                            record: record_proof(2, true),
                        },
                        SubrecordGroup {
                            count: 1,
                            leaves: vec![(0, 2)],
                            siblings: vec![],
                            record: record_proof(1, false),
                        },
                    ],
                },
            },
            Response::SubrecordsProof {
                proof_id: 0,
                proof: SubrecordsProof { groups: vec![] },
            },
            Response::SubrecordProof {
                proof_id: 2,
                proof: SubrecordProof {
                    index: 0,
                    count: 1,
                    path: vec![],
                    record: None,
                },
            },
            Response::RecordAndProof {
                proof_id: 0,
                body: vec![6; 50],
                proof: record_proof(2, true),
            },
            Response::RecordAndProof {
                proof_id: 8,
                body: vec![],
                proof: record_proof(1, false),
            },
            Response::Sync {
                msg: None,
                sig: server.sign(b"n", b"o"),
                nonce: u64::MAX,
            },
        ];
        for kind in [
            AckKind::Created,
            AckKind::Wrote(vec![name(1), name(2)]),
            AckKind::Signed(name(3)),
        ] {
            out.push(Response::Ack(Ack {
                capsule: c,
                kind,
                log_size: 5,
                server: server.public(),
                sig: server.sign(b"a", b"b"),
            }));
        }
        for e in errors() {
            out.push(Response::Error(WireError::from(&e)));
        }
        out.extend(sync_msgs().into_iter().map(|m| Response::Sync {
            sig: server.sign(b"m", &m.to_bytes()),
            msg: Some(m),
            nonce: 3,
        }));
        out
    }

    fn errors() -> Vec<Error> {
        vec![
            Error::NotFound("a".into()),
            Error::Decode("b".into()),
            Error::Corrupt("c".into()),
            Error::InvalidInput("d".into()),
            Error::GuardMismatch("e".into()),
            Error::TypeMismatch("f".into()),
            Error::AlreadyExists("g".into()),
            Error::Conflict("h".into()),
            Error::Rejected("i".into()),
            Error::Unavailable("j".into()),
            Error::io("k", std::io::Error::other("l")),
        ]
    }

    /// Round trip, then strictness: every proper prefix, a trailing byte, another version.
    fn check<T: PartialEq + std::fmt::Debug>(
        v: &T,
        to: impl Fn(&T) -> Vec<u8>,
        from: impl Fn(&[u8]) -> Result<T>,
    ) {
        let bytes = to(v);
        assert_eq!(&from(&bytes).unwrap(), v);
        assert_eq!(to(&from(&bytes).unwrap()), bytes);
        for cut in 0..bytes.len() {
            assert!(from(&bytes[..cut]).is_err(), "{v:?} cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(from(&long).is_err(), "{v:?} with a trailing byte");
        let mut other = bytes.clone();
        other[0] = other[0].wrapping_add(1);
        assert!(from(&other).is_err(), "{v:?} as the next version");
        other[0] = other[0].wrapping_sub(2);
        assert!(from(&other).is_err(), "{v:?} as the previous version");
    }

    #[test]
    fn every_variant_round_trips_strictly() {
        for m in sync_msgs() {
            check(&m, SyncMsg::to_bytes, SyncMsg::from_bytes);
        }
        let reqs = requests();
        let tags: std::collections::HashSet<&str> = reqs.iter().map(Request::op).collect();
        assert_eq!(tags.len(), 23, "every request kind is exercised");
        for r in &reqs {
            check(r, Request::to_bytes, Request::from_bytes);
            // The generic encoder agrees with the borrowed fast paths.
            let mut e = Encoder::new();
            r.encode(&mut e);
            assert_eq!(e.finish(), r.to_bytes());
        }
        let resps = responses();
        let kinds: std::collections::HashSet<&str> = resps.iter().map(Response::kind).collect();
        assert_eq!(kinds.len(), 19, "every response kind is exercised");
        for r in &resps {
            check(r, Response::to_bytes, Response::from_bytes);
        }
    }

    #[test]
    fn unknown_tags_and_hostile_lengths() {
        for tag in [20u8, 100, 255] {
            assert!(Request::from_bytes(&[WIRE_VERSION, tag]).is_err());
        }
        for tag in [17u8, 200] {
            assert!(Response::from_bytes(&[WIRE_VERSION, tag]).is_err());
        }
        assert!(SyncMsg::from_bytes(&[SYNC_VERSION, 9]).is_err());
        assert!(Response::from_bytes(&[WIRE_VERSION, RESP_ERROR, 0, 0]).is_err());
        assert!(Response::from_bytes(&[WIRE_VERSION, RESP_ERROR, 12, 0]).is_err());
        assert!(Response::from_bytes(&[WIRE_VERSION, RESP_SYNC, 2]).is_err());
        assert!(Request::from_bytes(&[WIRE_VERSION, REQ_PROVE_SUB]).is_err());
        // A list announcing 2^62 records, 2^20 names, a 2^40-byte message: refused from
        // the length alone.
        let mut e = Encoder::new();
        e.u8(WIRE_VERSION)
            .u8(REQ_WRITE)
            .hash(capsule().hash())
            .varint(1 << 62);
        assert!(Request::from_bytes(&e.finish()).is_err());
        let mut e = Encoder::new();
        e.u8(WIRE_VERSION).u8(RESP_CAPSULES).varint(1 << 20);
        assert!(Response::from_bytes(&e.finish()).is_err());
        let mut e = Encoder::new();
        e.u8(WIRE_VERSION).u8(RESP_ERROR).u8(1).varint(1 << 40);
        assert!(Response::from_bytes(&e.finish()).is_err());
        // Over a cap even when the bytes are there: 129 path digests.
        let mut e = Encoder::new();
        e.u8(WIRE_VERSION).u8(RESP_CONSISTENCY);
        enc_digests(&mut e, &[[0; 32]; MAX_PATH + 1]);
        assert!(Response::from_bytes(&e.finish()).is_err());
        // A non-canonical embedded value (duplicate backpointer) is refused.
        let mut bad = header(1, 2, None, &[3]);
        bad.backpointers.push(bad.backpointers[0]);
        let mut e = Encoder::new();
        e.u8(WIRE_VERSION)
            .u8(RESP_RECORD)
            .bytes(&bad.encode())
            .bytes(&[]);
        assert!(Response::from_bytes(&e.finish()).is_err());
    }

    #[test]
    fn errors_keep_their_kind() {
        for e in errors() {
            let shown = e.to_string();
            let w = WireError::from(&e);
            let back = Response::from_bytes(&Response::Error(w).to_bytes())
                .unwrap()
                .into_result()
                .unwrap_err();
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&e),
                "{e}"
            );
            if !matches!(e, Error::Io { .. }) {
                assert_eq!(back.to_string(), shown);
            } else {
                assert!(back.to_string().contains("k: l"), "{back}");
            }
        }
        // Long messages are cut at a character boundary, and still decode.
        let long = "é".repeat(MAX_MESSAGE);
        let w = WireError::new(ErrorCode::Rejected, long);
        assert!(w.message.len() <= MAX_MESSAGE);
        let r = Response::Error(w.clone());
        assert_eq!(Response::from_bytes(&r.to_bytes()).unwrap(), r);
        let raw = Response::Error(WireError {
            code: ErrorCode::Corrupt,
            message: "x".repeat(MAX_MESSAGE + 5),
        });
        assert!(Response::from_bytes(&raw.to_bytes()).is_ok());
    }

    fn arb_hash() -> impl Strategy<Value = Hash> {
        (any::<bool>(), any::<[u8; 32]>()).prop_map(|(sha, d)| {
            Hash::new(
                if sha {
                    HashAlgo::Sha256
                } else {
                    HashAlgo::Blake3
                },
                d,
            )
        })
    }

    fn arb_header() -> impl Strategy<Value = RecordHeader> {
        (
            any::<u8>(),
            any::<u8>(),
            proptest::option::of(1u64..1000),
            proptest::collection::vec(any::<u8>(), 0..4),
        )
            .prop_map(|(c, b, s, bps)| header(c, b, s, &bps))
    }

    fn arb_names() -> impl Strategy<Value = Vec<RecordName>> {
        proptest::collection::vec(any::<[u8; 32]>().prop_map(|d| RecordName(h(d))), 0..4)
    }

    fn arb_sync_record() -> impl Strategy<Value = SyncRecord> {
        (
            arb_header(),
            proptest::option::of(proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..8),
                0..4,
            )),
            proptest::collection::vec(any::<u8>(), 0..32),
            proptest::option::of((any::<u32>(), any::<u8>())),
        )
            .prop_map(|(header, subs, plain, sig)| SyncRecord {
                header,
                body: match subs {
                    Some(s) => SyncBody::Subrecords(s.into()),
                    None => SyncBody::Plain(plain),
                },
                signature: sig.map(|(w, s)| ws(w, s)),
            })
    }

    fn arb_sync() -> impl Strategy<Value = SyncMsg> {
        prop_oneof![
            (
                any::<[u8; 32]>(),
                any::<[u8; 32]>(),
                any::<u64>(),
                any::<u64>(),
                any::<u8>()
            )
                .prop_map(|(c, q, n, at, k)| SyncMsg::Hello {
                    capsule: CapsuleName(h(c)),
                    quick: q,
                    count: n,
                    at,
                    sig: SigningKey::from_seed(&[k; 32]).sign(b"test", &q),
                }),
            Just(SyncMsg::InSync),
            Just(SyncMsg::More),
            any::<u64>().prop_map(|from| SyncMsg::SendNames { from }),
            Just(SyncMsg::Done),
            proptest::collection::vec(
                (any::<[u8; 32]>(), any::<u64>(), any::<i64>())
                    .prop_map(|(sum, check, count)| { CodedSymbol { sum, check, count } }),
                0..5
            )
            .prop_map(SyncMsg::Symbols),
            (arb_names(), any::<bool>()).prop_map(|(names, more)| SyncMsg::Names { names, more }),
            (
                proptest::collection::vec(arb_sync_record(), 0..3),
                arb_names(),
                arb_names(),
                arb_names(),
                arb_names()
            )
                .prop_map(|(records, want, heads, roots, missing)| SyncMsg::Exchange {
                    records,
                    want,
                    heads,
                    roots,
                    missing,
                }),
            (
                proptest::collection::vec(arb_sync_record(), 0..3),
                arb_names(),
                arb_names(),
                arb_names(),
                arb_names()
            )
                .prop_map(|(records, want, heads, roots, missing)| SyncMsg::Patch {
                    records,
                    want,
                    heads,
                    roots,
                    missing,
                }),
        ]
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        let c = any::<[u8; 32]>().prop_map(|d| CapsuleName(h(d)));
        let sess = proptest::option::of(any::<u64>().prop_map(SessionId));
        prop_oneof![
            Just(Request::ServerKey),
            Just(Request::ListCapsules),
            (
                any::<u8>(),
                "\\PC{0,12}",
                proptest::collection::btree_map("[a-z]{0,4}", "\\PC{0,4}", 0..3)
            )
                .prop_map(|(s, d, set)| Request::Create {
                    meta: meta(s, d, set)
                }),
            (
                c.clone(),
                proptest::collection::vec(
                    (arb_header(), proptest::collection::vec(any::<u8>(), 0..40)),
                    0..3
                ),
                proptest::collection::vec((any::<[u8; 32]>(), any::<u32>(), any::<u8>()), 0..3)
            )
                .prop_map(|(capsule, rs, sigs)| Request::Write {
                    capsule,
                    records: rs
                        .into_iter()
                        .map(|(header, body)| Record { header, body })
                        .collect(),
                    signatures: sigs
                        .into_iter()
                        .map(|(n, w, s)| (RecordName(h(n)), ws(w, s)))
                        .collect(),
                }),
            (c.clone(), any::<[u8; 32]>(), any::<u32>(), any::<u8>()).prop_map(
                |(capsule, n, w, s)| Request::Sign {
                    capsule,
                    name: RecordName(h(n)),
                    sig: ws(w, s),
                }
            ),
            (c.clone(), arb_hash()).prop_map(|(capsule, n)| Request::Read {
                capsule,
                name: RecordName(n),
            }),
            (c.clone(), arb_hash())
                .prop_map(|(capsule, sub)| Request::ReadSubrecord { capsule, sub }),
            (
                c.clone(),
                arb_header(),
                proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..4),
                proptest::option::of((any::<u32>(), any::<u8>()))
            )
                .prop_map(|(capsule, header, subrecords, sig)| {
                    Request::CommitSubrecords {
                        capsule,
                        header,
                        subrecords: subrecords.into(),
                        sig: sig.map(|(w, s)| ws(w, s)),
                    }
                }),
            (c.clone(), any::<[u8; 32]>(), any::<u64>()).prop_map(|(capsule, n, size)| {
                Request::LogInclusion {
                    capsule,
                    name: RecordName(h(n)),
                    size,
                }
            }),
            (c.clone(), any::<u64>(), any::<u64>()).prop_map(|(capsule, first, second)| {
                Request::LogConsistency {
                    capsule,
                    first,
                    second,
                }
            }),
            (
                c.clone(),
                proptest::option::of(1u32..=CachePolicy::MAX_CAPACITY),
                any::<bool>(),
                proptest::collection::vec(arb_hash(), 0..4)
            )
                .prop_map(|(capsule, cap, optimistic, cached)| Request::OpenSession {
                    capsule,
                    policy: cap.map_or(CachePolicy::Off, |capacity| CachePolicy::Lru { capacity }),
                    mode: if optimistic {
                        MirrorMode::OnIssue
                    } else {
                        MirrorMode::OnAck
                    },
                    cached,
                }),
            any::<u64>().prop_map(|s| Request::CloseSession {
                session: SessionId(s)
            }),
            (c.clone(), any::<[u8; 32]>(), sess.clone()).prop_map(|(capsule, n, session)| {
                Request::Prove {
                    capsule,
                    name: RecordName(h(n)),
                    session,
                }
            }),
            (c.clone(), arb_hash(), sess.clone()).prop_map(|(capsule, sub, session)| {
                Request::ProveSubrecord {
                    capsule,
                    sub,
                    session,
                }
            }),
            (c.clone(), any::<[u8; 32]>(), sess).prop_map(|(capsule, n, session)| {
                Request::ReadProve {
                    capsule,
                    name: RecordName(h(n)),
                    session,
                }
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(s, proof_id)| Request::Ack {
                session: SessionId(s),
                proof_id,
            }),
            (c, any::<u8>(), any::<u64>(), arb_sync()).prop_map(|(capsule, k, session, msg)| {
                Request::Sync {
                    capsule,
                    peer: key(k).public(),
                    session,
                    sig: key(k).sign(b"s", &session.to_le_bytes()),
                    msg,
                }
            }),
        ]
    }

    fn arb_response() -> impl Strategy<Value = Response> {
        let digests = |n| proptest::collection::vec(any::<[u8; 32]>(), 0..n);
        prop_oneof![
            (1u8..=11, "\\PC{0,20}").prop_map(|(code, m)| Response::Error(WireError::new(
                ErrorCode::from_u8(code).unwrap_or(ErrorCode::Io),
                m
            ))),
            Just(Response::Unit),
            (arb_header(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(header, body)| Response::Record(Record { header, body })),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Response::Subrecord),
            proptest::collection::vec(arb_hash(), 0..4).prop_map(Response::SubrecordNames),
            (any::<u64>(), digests(8))
                .prop_map(|(index, path)| Response::Inclusion { index, path }),
            digests(8).prop_map(Response::Consistency),
            (any::<u64>(), 1u8..5, any::<bool>()).prop_map(|(proof_id, n, s)| {
                Response::RecordProof {
                    proof_id,
                    proof: record_proof(n, s),
                }
            }),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                digests(8),
                proptest::option::of((1u8..4, any::<bool>()))
            )
                .prop_map(|(proof_id, index, count, path, rp)| {
                    Response::SubrecordProof {
                        proof_id,
                        proof: SubrecordProof {
                            index,
                            count,
                            path,
                            record: rp.map(|(n, s)| record_proof(n, s)),
                        },
                    }
                }),
            (any::<[u8; 32]>(), any::<u64>(), arb_names(), any::<u64>()).prop_map(
                |(c, size, heads, log_size)| {
                    let k = key(3);
                    if size.is_multiple_of(2) {
                        Response::Checkpoint(Checkpoint {
                            capsule: CapsuleName(h(c)),
                            size,
                            root: c,
                            heads,
                            time_ms: log_size,
                            nonce: [size as u8; 16],
                            server: k.public(),
                            sig: k.sign(b"c", &c),
                        })
                    } else {
                        // Both write acks: with and without the signatures named.
                        let kind = if size % 4 == 1 {
                            AckKind::Wrote(heads)
                        } else {
                            AckKind::wrote(heads.clone(), heads)
                        };
                        Response::Ack(Ack {
                            capsule: CapsuleName(h(c)),
                            kind,
                            log_size,
                            server: k.public(),
                            sig: k.sign(b"a", &c),
                        })
                    }
                }
            ),
            (proptest::option::of(arb_sync()), any::<u8>(), any::<u64>()).prop_map(
                |(msg, k, nonce)| Response::Sync {
                    msg,
                    sig: key(k).sign(b"r", &[k]),
                    nonce,
                }
            ),
            (
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..40),
                1u8..4,
                any::<bool>()
            )
                .prop_map(|(proof_id, body, n, s)| Response::RecordAndProof {
                    proof_id,
                    body,
                    proof: record_proof(n, s),
                }),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(r in arb_request()) {
            let b = r.to_bytes();
            prop_assert_eq!(&Request::from_bytes(&b).unwrap(), &r);
            let mut e = Encoder::new();
            r.encode(&mut e);
            prop_assert_eq!(e.finish(), b);
        }

        #[test]
        fn responses_round_trip(r in arb_response()) {
            let b = r.to_bytes();
            prop_assert_eq!(&Response::from_bytes(&b).unwrap(), &r);
        }

        #[test]
        fn sync_msgs_round_trip(m in arb_sync()) {
            let b = m.to_bytes();
            prop_assert_eq!(&SyncMsg::from_bytes(&b).unwrap(), &m);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            for b in [&bytes[..], &[&[WIRE_VERSION][..], &bytes].concat()] {
                if let Ok(r) = Request::from_bytes(b) {
                    prop_assert_eq!(r.to_bytes(), b);
                }
                if let Ok(r) = Response::from_bytes(b) {
                    prop_assert_eq!(r.to_bytes(), b);
                }
                if let Ok(m) = SyncMsg::from_bytes(b) {
                    prop_assert_eq!(m.to_bytes(), b);
                }
            }
        }
    }
}
