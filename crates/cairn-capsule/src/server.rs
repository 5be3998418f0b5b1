//! The capsule server (DCS §3.2, §4.1): it stores capsules in a Cairn [`Store`], verifies
//! everything before storing it, acknowledges every write with its own signature, keeps
//! witnesses eagerly, answers proofs (shortened by each reader session's mirrored
//! verification cache), and keeps a per-capsule Merkle log with signed checkpoints.
//!
//! **Persistence.** A capsule is its metadata chunk (cid = capsule name), one chunk per
//! record header (cid = record name), one chunk per body or subrecord, and a *journal*: a
//! hash-linked chain of chunks listing, in acceptance order, what this server accepted
//! (records and signatures). The ref `capsule/<name>` points at the newest journal chunk;
//! moving it is the commit, so a write is acknowledged only once it is durable at the
//! store's level. Opening a capsule replays its journal, re-verifying every header (by its
//! cid) and every signature, and rebuilds the in-memory [`CapsuleDag`].
//!
//! **What is refused.** A record naming another capsule, a body that does not match its
//! header, a subrecord list that does not hash to the header's root, a signature that does
//! not verify under a listed writer key, a signature on a record this server does not have,
//! and, past [`ServerOptions::max_unproven`], more records that no signature covers yet.
//! Each gets a clear error and changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use cairn_core::{Decoder, Encoder, Error, Hash, PublicKey, Result, Signature, SigningKey};
use cairn_store::{RefUpdate, Store};
use lru::LruCache;
use parking_lot::Mutex;

use crate::cache::{CachePolicy, MirrorMode, VerificationCache};
use crate::dag::{CapsuleDag, StoredBody};
use crate::merkle::{self, Digest, MerkleLog};
use crate::metadata::{CapsuleMetadata, CapsuleName};
use crate::proof::{
    Anchor, MAX_BATCH_SUBRECORDS, RecordProof, SubrecordGroup, SubrecordProof, SubrecordsProof,
    WriterSignature, subrecord_leaf, subrecord_name, subrecord_root,
};
use crate::record::{
    BodyRef, Record, RecordHeader, RecordName, SealedSubrecords, TAG_BODY, TAG_JOURNAL,
    TAG_SUBRECORD, TAG_SUBRECORD_LIST, body_chunk, body_hash,
};

/// Signature domain of server acknowledgments.
pub const DOMAIN_ACK: &[u8] = b"cairn/capsule/ack/v1";
/// Signature domain of server checkpoints.
pub const DOMAIN_CHECKPOINT: &[u8] = b"cairn/capsule/checkpoint/v1";
/// Signature domain of an anti-entropy Hello (the initiator's server key signs it).
pub const DOMAIN_SYNC_HELLO: &[u8] = b"cairn/capsule/sync-hello/v1";
/// Signature domain of the messages of a remote anti-entropy session
/// ([`crate::sync::SessionSeal`]).
pub const DOMAIN_SYNC_MSG: &[u8] = b"cairn/capsule/sync-msg/v1";

/// What the initiator of an anti-entropy session signs in its Hello: the capsule, the
/// responder's server key (a Hello is good for one responder), the quick check, the size
/// of its set and its stamp (never reused with a responder, so a Hello cannot be replayed).
pub fn sync_hello_message(
    capsule: &CapsuleName,
    responder: &PublicKey,
    quick: &Digest,
    count: u64,
    at: u64,
) -> Vec<u8> {
    let mut e = Encoder::new();
    e.bytes(&capsule.hash().to_bytes())
        .raw(responder.raw())
        .raw(quick)
        .varint(count)
        .u64_le(at);
    e.finish()
}
const JOURNAL_VERSION: u8 = 1;
const REF_PREFIX: &[u8] = b"capsule/";
/// Most subrecords one record may hold.
pub const MAX_SUBRECORDS: usize = 1 << 20;
/// Proofs a session may leave un-acked before the oldest are forgotten.
const MAX_PENDING_ACKS: usize = 1 << 16;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Most records per capsule that no writer signature covers yet; past it, writes are
    /// refused until the writer signs.
    pub max_unproven: usize,
    /// Most memory per capsule those records may hold, as
    /// [`crate::dag::unproven_cost`] counts it (headers, backpointers, subrecord index
    /// entries): anyone may write unsigned records, and a count alone let a few of the
    /// largest ones hold gigabytes. Past it, writes that add unproven records are refused
    /// until the writer signs.
    pub max_unproven_bytes: u64,
    /// Most memory the unproven records of all capsules hold together (by the same
    /// count): the per-capsule limit alone let anyone fill every capsule of a server that
    /// holds many. Past it, writes that add unproven records to any capsule are refused
    /// (as past [`ServerOptions::max_unproven_bytes`]); signed writes still go in. An
    /// unloaded capsule counts what its unproven records held when it was unloaded; one
    /// not loaded since the server started counts from its first load. Unsigned records
    /// nothing will ever prove (junk) are never freed, so once junk fills this budget
    /// every capsule's writers must send a signature with their writes (a write
    /// whose signatures cover its records is always taken): the price of bounding memory
    /// when anyone may write.
    pub max_unproven_bytes_total: u64,
    /// Most subrecord trees each capsule keeps in memory for proofs.
    pub tree_cache: usize,
    /// Most leaves, across its cached trees, each capsule keeps in memory (a tree keeps
    /// about 64 bytes per leaf). The least recently used trees go first; a tree larger
    /// than this is rebuilt for each request instead of kept.
    pub tree_cache_leaves: usize,
    /// Bytes of verified sealed bodies and subrecords (each up to
    /// [`MAX_CACHED_BODY`] bytes) kept in memory so reads of them skip the store; 0 keeps
    /// none.
    pub body_cache_bytes: usize,
    /// Most capsules kept loaded in memory (each holds its record DAG: about 110 bytes
    /// per record, plus its cached trees). Past it, the least recently used capsules no
    /// request is using are unloaded; the next request for one replays its journal from
    /// the store. A hub serving many users' buckets stays within this however many
    /// there are.
    pub max_loaded_capsules: usize,
    /// Most reader sessions kept (each mirrors a reader's verification cache, at most
    /// [`CachePolicy::MAX_CAPACITY`] names). Opening one more ends the least recently used
    /// session: a later request naming it is answered [`Error::NotFound`] ("session N"),
    /// and its reader opens a new one (seeded with the names it caches). Readers that
    /// vanish without closing their session (a dropped connection) are forgotten this way
    /// instead of piling up.
    pub max_sessions: usize,
    /// Most names the mirrors of all sessions hold together (about 100 bytes each). When
    /// a proof or an ack takes them past it, the least recently used other sessions end
    /// (as past [`ServerOptions::max_sessions`]) until they fit again; a session asking
    /// for a cache larger than this alone is refused.
    pub max_mirrored_names: usize,
    /// Most bytes of headers one record proof carries ([`DEFAULT_MAX_PROOF_BYTES`] by
    /// default; at most [`MAX_PROOF_BYTES`], the most any answer has room for).
    pub max_proof_bytes: usize,
    /// The server keys of the replicas that may start anti-entropy sessions with this
    /// server; `None` (the default) takes any key. Set it where the replicas are known:
    /// anyone can make keys, and each (capsule, key) pair holds a place in the table of
    /// recent Hellos ([`MAX_HELLO_STAMPS`]) for five minutes.
    pub sync_peers: Option<Vec<PublicKey>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_unproven: 1_000_000,
            max_unproven_bytes: 64 << 20,
            max_unproven_bytes_total: 1 << 30,
            tree_cache: 256,
            tree_cache_leaves: 1 << 22,
            body_cache_bytes: 256 << 20,
            max_loaded_capsules: 4096,
            max_sessions: 4096,
            max_mirrored_names: CachePolicy::MAX_CAPACITY as usize * 2,
            max_proof_bytes: DEFAULT_MAX_PROOF_BYTES,
            sync_peers: None,
        }
    }
}

/// Largest sealed body or subrecord the server's body cache holds.
pub const MAX_CACHED_BODY: usize = 4096;

/// Most bytes one batched answer ([`CapsuleServer::read_subrecords`],
/// [`CapsuleServer::prove_subrecords`]) may carry: half of a wire frame
/// ([`crate::wire::MAX_FRAME`]). A request whose answer would be larger is refused before
/// anything is issued; ask for fewer names at a time.
pub const MAX_BATCH_ANSWER_BYTES: usize = 32 << 20;

/// Most bytes of headers one record proof carries: what a wire frame
/// ([`crate::wire::MAX_FRAME`]) holds, less room for the rest of the answer (the most
/// [`ServerOptions::max_proof_bytes`] may be). A read-and-prove has the frame less its body; a
/// subrecord multiproof, [`MAX_BATCH_ANSWER_BYTES`]. A record whose shortest chain to a
/// signature (or to what the reader caches) is longer cannot be proven until its writer
/// signs a record nearer to it; the server says so rather than build an answer no reader
/// would take.
pub const MAX_PROOF_BYTES: usize = crate::wire::MAX_FRAME - (64 << 10);

/// Default of [`ServerOptions::max_proof_bytes`]: 960 KiB of headers, a chain of about
/// 9,000 records with one backpointer each. Proofs are built before their memory is
/// charged to a network endpoint's budget, so the default keeps each answer small; raise
/// it (up to [`MAX_PROOF_BYTES`]) for capsules whose writers sign rarely.
pub const DEFAULT_MAX_PROOF_BYTES: usize = (1 << 20) - (64 << 10);

/// Fewest bytes an encoded record header takes (tag, version, capsule name, body
/// reference, backpointer count).
const MIN_HEADER_BYTES: usize = 72;

/// The memory an answer carrying the body `header` names needs: the body as read, and its
/// copy in the encoded answer.
fn answer_bytes(header: &RecordHeader) -> usize {
    match header.body {
        BodyRef::Plain { len, .. } => usize::try_from(len).unwrap_or(usize::MAX).saturating_mul(2),
        BodyRef::Subrecords { .. } => 0,
    }
}

fn proof_too_long(name: &RecordName, what: String, room: usize) -> Error {
    Error::Unavailable(format!(
        "the proof of record {name} would hold {what}, more than the {room} bytes this \
         answer has room for; the writer must sign a record nearer to it"
    ))
}

/// Sealed bodies and subrecords this server has verified (on write, against the header's
/// body hash or the subrecord root, or read back from the store, which checks every chunk
/// against its cid), keyed by that hash and kept up to a byte budget, so a read of a
/// recent record needs no store read and no re-hash. Records are immutable and named by
/// their hash, so an entry never goes stale. Eviction is `quick_cache`'s CLOCK-Pro
/// (sharded): a hit marks the entry under a read lock and relinks nothing. Half the
/// budget is for entries read since they were inserted, so a stream of writes nobody
/// reads yet still keeps the newest bodies.
///
/// Keyed by capsule and hash: an entry exists only for a body or subrecord that capsule
/// accepted, so a hit also answers "is this subrecord in this capsule?" without the
/// capsule's lock.
struct BodyCache {
    cache: Option<BodyMap>,
}

/// The cache proper: sealed bytes by (capsule, hash, is a subrecord), weighed in bytes.
/// Record bodies and subrecords are kept apart, so a read of a subrecord never answers
/// with a record's body.
type BodyKey = (CapsuleName, Hash, bool);
type BodyMap =
    quick_cache::sync::Cache<BodyKey, Arc<[u8]>, BodyWeight, foldhash::fast::RandomState>;

/// What a cached body costs the budget: its bytes plus the bookkeeping per entry.
#[derive(Clone)]
struct BodyWeight;

impl quick_cache::Weighter<BodyKey, Arc<[u8]>> for BodyWeight {
    fn weight(&self, _: &BodyKey, sealed: &Arc<[u8]>) -> u64 {
        (sealed.len() + BODY_ENTRY_OVERHEAD) as u64
    }
}

/// Bookkeeping bytes counted per cache entry on top of the body.
const BODY_ENTRY_OVERHEAD: usize = 96;

impl BodyCache {
    /// A cache of at most `budget` bytes (none when 0).
    fn new(budget: usize) -> Self {
        let cache = (budget > 0)
            .then(|| {
                // Both capacities and the allocations are set and in range: `build`
                // cannot fail. Ghosts (recently evicted names, about 72 bytes each, kept
                // outside the budget) are capped near a tenth of the estimated entries.
                quick_cache::OptionsBuilder::new()
                    .estimated_items_capacity((budget / (BODY_ENTRY_OVERHEAD + 160)).max(1))
                    .weight_capacity(budget as u64)
                    .hot_allocation(0.5)
                    .ghost_allocation(0.1)
                    .build()
                    .expect("body cache options are complete and in range")
            })
            .map(|opts| {
                quick_cache::sync::Cache::with_options(
                    opts,
                    BodyWeight,
                    foldhash::fast::RandomState::default(),
                    Default::default(),
                )
            });
        BodyCache { cache }
    }

    /// The cached record body (`sub` false) or subrecord (`sub` true) named `h`.
    fn get(&self, capsule: &CapsuleName, h: &Hash, sub: bool) -> Option<Arc<[u8]>> {
        self.cache.as_ref()?.get(&(*capsule, *h, sub))
    }

    /// Keeps `sealed` under `capsule` and `h`: the caller has verified that `sealed`
    /// hashes to `h`, and the capsule holds it (or, for a record body, holds or is about
    /// to hold its record, which every read looks up first).
    fn insert(&self, capsule: &CapsuleName, h: Hash, sub: bool, sealed: &[u8]) {
        if sealed.len() > MAX_CACHED_BODY {
            return;
        }
        if let Some(c) = &self.cache {
            c.insert((*capsule, h, sub), Arc::from(sealed));
        }
    }
}

/// What an acknowledgment acknowledges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckKind {
    /// The capsule was created (or already existed with this metadata).
    Created,
    /// These records are stored.
    Wrote(Vec<RecordName>),
    /// A signature on this record is stored.
    Signed(RecordName),
    /// These records are stored, and a writer signature on each of `signed` (the
    /// signatures the write carried): a server cannot keep the records, drop a signature
    /// and still acknowledge the write.
    WroteSigned {
        /// The records stored.
        records: Vec<RecordName>,
        /// The records whose signature the write carried, all now stored.
        signed: Vec<RecordName>,
    },
}

impl AckKind {
    /// What a write of `records` carrying `signatures` is acknowledged with.
    pub fn for_write(
        records: Vec<RecordName>,
        signatures: &[(RecordName, WriterSignature)],
    ) -> AckKind {
        AckKind::wrote(records, signatures.iter().map(|(n, _)| *n).collect())
    }

    /// What a write of `records` carrying signatures on `signed` is acknowledged with.
    pub fn wrote(records: Vec<RecordName>, signed: Vec<RecordName>) -> AckKind {
        if signed.is_empty() {
            AckKind::Wrote(records)
        } else {
            AckKind::WroteSigned { records, signed }
        }
    }
}

/// A server's signed acknowledgment: the write is durable at the server's level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The capsule.
    pub capsule: CapsuleName,
    /// What was stored.
    pub kind: AckKind,
    /// The capsule's Merkle-log size after the write.
    pub log_size: u64,
    /// The acknowledging server.
    pub server: PublicKey,
    /// The server's signature over all of the above.
    pub sig: Signature,
}

impl Ack {
    fn message(capsule: &CapsuleName, kind: &AckKind, log_size: u64) -> Vec<u8> {
        let mut e = Encoder::versioned(1);
        e.hash(capsule.hash());
        match kind {
            AckKind::Created => {
                e.u8(0);
            }
            AckKind::Wrote(names) => {
                e.u8(1).varint(names.len() as u64);
                for n in names {
                    e.hash(n.hash());
                }
            }
            AckKind::Signed(n) => {
                e.u8(2).hash(n.hash());
            }
            AckKind::WroteSigned { records, signed } => {
                e.u8(3).varint(records.len() as u64);
                for n in records {
                    e.hash(n.hash());
                }
                e.varint(signed.len() as u64);
                for n in signed {
                    e.hash(n.hash());
                }
            }
        }
        e.varint(log_size);
        e.finish()
    }

    /// Checks that this ack is `server`'s signature over exactly `expected` in `capsule`
    /// (so an ack for another write, another capsule or from another server is refused).
    pub fn verify(
        &self,
        server: &PublicKey,
        capsule: &CapsuleName,
        expected: &AckKind,
    ) -> Result<()> {
        if &self.server != server {
            return Err(Error::Rejected(format!(
                "ack is from {}, not {server}",
                self.server
            )));
        }
        if &self.capsule != capsule || &self.kind != expected {
            return Err(Error::Rejected(
                "ack does not acknowledge this write".into(),
            ));
        }
        server.verify(
            DOMAIN_ACK,
            &Self::message(&self.capsule, &self.kind, self.log_size),
            &self.sig,
        )
    }
}

/// A server-signed statement of a capsule's log and heads at one moment (QueryFresh).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The capsule.
    pub capsule: CapsuleName,
    /// Number of records in the server's log.
    pub size: u64,
    /// The log's RFC 6962 root.
    pub root: Digest,
    /// The heads of the record DAG's proven part (records a writer signature reaches
    /// that no such record points to), sorted: every one has a proof. Unsigned records,
    /// which anyone may write, are left out, so they cannot hide the newest signed state.
    pub heads: Vec<RecordName>,
    /// Server time, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The nonce of the QueryFresh this answers, so that a recorded checkpoint cannot be
    /// replayed as the answer to a later one.
    pub nonce: [u8; 16],
    /// The signing server.
    pub server: PublicKey,
    /// Signature over all of the above.
    pub sig: Signature,
}

impl Checkpoint {
    fn message(
        capsule: &CapsuleName,
        size: u64,
        root: &Digest,
        heads: &[RecordName],
        time_ms: u64,
        nonce: &[u8; 16],
    ) -> Vec<u8> {
        let mut e = Encoder::versioned(2);
        e.hash(capsule.hash()).varint(size).raw(root);
        e.varint(heads.len() as u64);
        for h in heads {
            e.hash(h.hash());
        }
        e.varint(time_ms).raw(nonce);
        e.finish()
    }

    /// Checks that this is `capsule`'s checkpoint answering the QueryFresh that carried
    /// `nonce`, and the server's signature on it (a server answering with another
    /// capsule's checkpoint, or anyone replaying an earlier one, is refused).
    pub fn verify(
        &self,
        server: &PublicKey,
        capsule: &CapsuleName,
        nonce: &[u8; 16],
    ) -> Result<()> {
        if &self.server != server {
            return Err(Error::Rejected("checkpoint is from another server".into()));
        }
        if &self.capsule != capsule {
            return Err(Error::Rejected(format!(
                "checkpoint of capsule {} where capsule {capsule} was asked for",
                self.capsule
            )));
        }
        if &self.nonce != nonce {
            return Err(Error::Rejected(
                "checkpoint answers another QueryFresh (its nonce differs): a replay".into(),
            ));
        }
        server.verify(
            DOMAIN_CHECKPOINT,
            &Self::message(
                &self.capsule,
                self.size,
                &self.root,
                &self.heads,
                self.time_ms,
                &self.nonce,
            ),
            &self.sig,
        )
    }

    /// Checks that this checkpoint's log extends `earlier`'s, given the consistency
    /// `proof` between their sizes ([`CapsuleServer::log_consistency`] of `earlier.size`
    /// and `self.size`): the same capsule, a size no smaller, and the earlier root a prefix
    /// of this one (RFC 9162 §2.1.4). A server that rewrote, dropped or forked what it
    /// showed before cannot pass. Both checkpoints must have passed
    /// [`Checkpoint::verify`] first, against the same server's key: this checks their
    /// logs, not their signatures or who signed them (each replica orders its own log, so
    /// only one server's checkpoints extend each other).
    pub fn verify_extends(&self, earlier: &Checkpoint, proof: &[Digest]) -> Result<()> {
        if self.capsule != earlier.capsule {
            return Err(Error::Rejected(format!(
                "checkpoints of capsules {} and {} do not extend each other",
                earlier.capsule, self.capsule
            )));
        }
        if self.size < earlier.size {
            return Err(Error::Rejected(format!(
                "the log shrank from {} to {} records",
                earlier.size, self.size
            )));
        }
        merkle::verify_consistency(
            self.capsule.hash().algo(),
            earlier.size,
            self.size,
            &earlier.root,
            &self.root,
            proof,
        )
        .map_err(|e| {
            Error::Rejected(format!(
                "the log of {} records does not extend the earlier one of {}: {e}",
                self.size, earlier.size
            ))
        })
    }

    /// Checks that record `name` is leaf `index` of this checkpoint's log, given its
    /// inclusion `path` ([`CapsuleServer::log_inclusion`] at `self.size`). This
    /// checkpoint must have passed [`Checkpoint::verify`] first.
    pub fn verify_includes(&self, name: &RecordName, index: u64, path: &[Digest]) -> Result<()> {
        merkle::verify_inclusion(
            self.capsule.hash().algo(),
            index,
            self.size,
            &CapsuleDag::log_leaf(name),
            path,
            &self.root,
        )
        .map_err(|e| {
            Error::Rejected(format!(
                "record {name} is not in the log of {} records: {e}",
                self.size
            ))
        })
    }
}

/// A reader session: its mirrored verification cache and the proofs awaiting its ack.
struct Session {
    capsule: CapsuleName,
    mirror: VerificationCache,
    mode: MirrorMode,
    /// Proofs issued and not yet acked ([`MirrorMode::OnAck`]), by id, with the names
    /// each will bring into the mirror.
    pending: BTreeMap<u64, Vec<Hash>>,
    /// Names in `pending`, counted in `mirrored` like the mirror's own.
    pending_names: usize,
    next_proof: u64,
    /// Names held by all sessions' mirrors and pending proofs, shared with the server (see
    /// [`ServerOptions::max_mirrored_names`]); this session's part leaves with it.
    mirrored: Arc<AtomicUsize>,
}

impl Session {
    /// Takes `names` into the mirror and counts what it grew by.
    fn mirror_insert(&mut self, names: &[Hash]) {
        let before = self.mirror.len();
        self.mirror.insert_all(names);
        let grew = self.mirror.len().saturating_sub(before);
        self.mirrored.fetch_add(grew, Ordering::Relaxed);
    }

    /// Keeps proof `id`'s names until its ack (counted against the mirrors' budget: a
    /// reader that never acks must not hold more than one that does), dropping the
    /// oldest proofs past [`MAX_PENDING_ACKS`] or while this session alone would hold
    /// more than `budget` names (their acks are then refused).
    fn hold_pending(&mut self, id: u64, names: Vec<Hash>, budget: usize) {
        self.pending_names += names.len();
        self.mirrored.fetch_add(names.len(), Ordering::Relaxed);
        self.pending.insert(id, names);
        while self.pending.len() > 1
            && (self.pending.len() > MAX_PENDING_ACKS || self.held() > budget)
        {
            if let Some((_, old)) = self.pending.pop_first() {
                self.release_pending(old.len());
            }
        }
    }

    /// The names of proof `id`, which leave the pending count (none when never issued or
    /// already acked).
    fn take_pending(&mut self, id: u64) -> Option<Vec<Hash>> {
        let names = self.pending.remove(&id)?;
        self.release_pending(names.len());
        Some(names)
    }

    fn release_pending(&mut self, n: usize) {
        self.pending_names -= n;
        self.mirrored.fetch_sub(n, Ordering::Relaxed);
    }

    /// Names this session holds against the budget: its mirror's and its pending proofs'.
    fn held(&self) -> usize {
        self.mirror.len() + self.pending_names
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.mirrored.fetch_sub(self.held(), Ordering::Relaxed);
    }
}

/// Identifies a reader session on one server: 64 random bits, so it cannot be guessed by
/// another client (whoever names a session can ack its proofs or close it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionId(pub u64);

/// A proof handed to a session, with the id its ack must name.
#[derive(Clone, Debug)]
pub struct Issued<P> {
    /// Id to acknowledge once verified (see [`CapsuleServer::ack`]); 0 when there is
    /// nothing to acknowledge (no session, or a [`MirrorMode::OnIssue`] session).
    pub proof_id: u64,
    /// The proof.
    pub proof: P,
}

/// One capsule's state on this server.
struct Capsule {
    dag: CapsuleDag,
    journal_head: Option<Hash>,
    journal_seq: u64,
    /// Subrecord name → (record, index), the first record that held it.
    subrecords: foldhash::HashMap<Hash, (RecordName, u32)>,
    /// Later records holding a subrecord name `subrecords` has under another record (rare:
    /// a repeated plaintext subrecord, or one copied into an unsigned record by anyone).
    more_subrecords: foldhash::HashMap<Hash, Vec<(RecordName, u32)>>,
    trees: LruCache<RecordName, Arc<MerkleLog>>,
    /// Which load of this server's this is (unique, from 1; see [`SyncCursor::load`]).
    load: u64,
    /// Leaves across `trees`.
    tree_leaves: usize,
}

impl Capsule {
    /// Notes that subrecord `sub` is at `index` of `record`.
    fn index_subrecord(&mut self, sub: Hash, record: RecordName, index: u32) {
        match self.subrecords.entry(sub) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((record, index));
            }
            std::collections::hash_map::Entry::Occupied(o) if o.get().0 != record => {
                // A record's own repeats come one after another (records are indexed whole,
                // once each), so only the last entry can be this record: constant time
                // however many records hold the name.
                let more = self.more_subrecords.entry(sub).or_default();
                if more.last().is_none_or(|(r, _)| *r != record) {
                    more.push((record, index));
                }
            }
            std::collections::hash_map::Entry::Occupied(_) => {}
        }
    }

    /// Where subrecord `sub` is: in the first record holding it that a signature reaches,
    /// else the first record holding it. So a subrecord someone copied into an unsigned
    /// record first still has a proof through the writer's signed record. A proven holder
    /// found among the later ones takes the first place, so the search runs once.
    fn subrecord_at(&mut self, sub: &Hash) -> Option<(RecordName, u32)> {
        let first = *self.subrecords.get(sub)?;
        let dag = &self.dag;
        let proven = |r: &RecordName| dag.is_proven(r);
        if proven(&first.0) {
            return Some(first);
        }
        let Some(more) = self.more_subrecords.get_mut(sub) else {
            return Some(first);
        };
        let Some(i) = more.iter().position(|(r, _)| proven(r)) else {
            return Some(first);
        };
        let found = std::mem::replace(&mut more[i], first);
        self.subrecords.insert(*sub, found);
        Some(found)
    }
}

impl Capsule {
    /// Keeps `tree` for later proofs, within the count and leaf budgets of `opts`.
    fn cache_tree(&mut self, opts: &ServerOptions, record: RecordName, tree: Arc<MerkleLog>) {
        let leaves = tree.size() as usize;
        if leaves > opts.tree_cache_leaves {
            return;
        }
        self.tree_leaves += leaves;
        if let Some((_, old)) = self.trees.push(record, tree) {
            // Evicted for room, or the same record's tree replaced.
            self.tree_leaves -= old.size() as usize;
        }
        while self.tree_leaves > opts.tree_cache_leaves {
            match self.trees.pop_lru() {
                Some((_, old)) => self.tree_leaves -= old.size() as usize,
                None => break,
            }
        }
    }
}

/// Signs write acks on a thread of its own, so that a write's ack is signed while the
/// write's sync runs instead of after it (the ack's content is known before the commit;
/// a signature whose write then fails is dropped unseen). One job at a time: while it is
/// busy, writers sign their own acks, so no backlog builds up behind it. With a store
/// that does not sync, the hand-over can cost about what it saves. Started on first use;
/// the thread ends when the server is dropped.
struct AckSigner {
    key: SigningKey,
    jobs: Mutex<Option<std::sync::mpsc::Sender<SignJob>>>,
    busy: Arc<std::sync::atomic::AtomicBool>,
}

/// A message to sign under [`DOMAIN_ACK`] and where to send the signature.
struct SignJob {
    msg: Vec<u8>,
    reply: std::sync::mpsc::SyncSender<Signature>,
}

impl AckSigner {
    fn new(key: SigningKey) -> Self {
        AckSigner {
            key,
            jobs: Mutex::new(None),
            busy: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// Starts signing `msg`; `None` when the signing thread cannot be started (the caller
    /// then signs itself).
    fn start(&self, msg: Vec<u8>) -> Option<std::sync::mpsc::Receiver<Signature>> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return None;
        }
        let started = self.send(msg);
        if started.is_none() {
            self.busy.store(false, Ordering::Release);
        }
        started
    }

    fn send(&self, msg: Vec<u8>) -> Option<std::sync::mpsc::Receiver<Signature>> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let mut jobs = self.jobs.lock();
        if jobs.is_none() {
            let (tx, queue) = std::sync::mpsc::channel::<SignJob>();
            let key = self.key.clone();
            let busy = self.busy.clone();
            std::thread::Builder::new()
                .name("cairn-ack-signer".into())
                .spawn(move || {
                    while let Ok(job) = queue.recv() {
                        let sig = key.sign(DOMAIN_ACK, &job.msg);
                        busy.store(false, Ordering::Release);
                        let _ = job.reply.send(sig);
                    }
                })
                .ok()?;
            *jobs = Some(tx);
        }
        jobs.as_ref()?.send(SignJob { msg, reply }).ok()?;
        Some(rx)
    }
}

/// The capsules loaded in memory, least recently used first out (see
/// [`ServerOptions::max_loaded_capsules`]).
struct Loaded {
    map: LruCache<CapsuleName, Arc<Mutex<Capsule>>>,
    /// Capsules being loaded outside the map's lock, with how many loads of each are in
    /// flight and how many times the capsule was unloaded since the entry was made: a
    /// load that raced with an unload of the same capsule is not kept, since the state it
    /// read may predate writes made through the unloaded copy. (Unloads of other capsules
    /// do not matter: counting every unload made each load of a large capsule fail when
    /// many capsules were in use, and its last try replay under the map's lock.)
    loading: foldhash::HashMap<CapsuleName, (u32, u64)>,
    /// Capsules whose creation is under way ([`CapsuleServer::create`]).
    creating: foldhash::HashSet<CapsuleName>,
    /// What the unproven records of every loaded capsule hold, plus what those of the
    /// capsules in `unloaded_unproven` held when they were unloaded: unloading a capsule
    /// does not free its share of [`ServerOptions::max_unproven_bytes_total`], or anyone
    /// could fill capsules, have them unloaded (by touching enough others), fill more,
    /// and then have them all loaded at once.
    unproven_held: Arc<AtomicU64>,
    /// Capsules unloaded while their unproven records held memory, with how much (each
    /// entry stands for at least one record's [`crate::dag::unproven_cost`], which is
    /// several times its own size, so the budget bounds these too). Forgotten at restart.
    unloaded_unproven: foldhash::HashMap<CapsuleName, u64>,
}

/// Drops least recently used entries that nothing outside `map` holds until at most `max`
/// remain (fewer are dropped when too many are in use); returns how many went. Called with
/// the map's lock held, an entry held only by the map cannot be handed out meanwhile, as
/// long as every other holder got its handle from the map. Shared by the loaded capsules
/// here and a node's open buckets.
pub fn drop_idle<K: std::hash::Hash + Eq + Clone, V>(
    map: &mut LruCache<K, Arc<V>>,
    max: usize,
) -> usize {
    take_idle(map, max).len()
}

/// [`drop_idle`], handing back what it takes out.
fn take_idle<K: std::hash::Hash + Eq + Clone, V>(
    map: &mut LruCache<K, Arc<V>>,
    max: usize,
) -> Vec<(K, Arc<V>)> {
    let Some(excess) = map.len().checked_sub(max).filter(|&n| n > 0) else {
        return Vec::new();
    };
    let idle: Vec<K> = map
        .iter()
        .rev()
        .filter(|(_, v)| Arc::strong_count(v) == 1)
        .map(|(k, _)| k.clone())
        .take(excess)
        .collect();
    idle.into_iter().filter_map(|k| map.pop_entry(&k)).collect()
}

impl Loaded {
    /// Loads `cap` as capsule `name` and unloads idle capsules past `max`.
    fn insert(&mut self, name: CapsuleName, mut cap: Capsule, max: usize) -> Arc<Mutex<Capsule>> {
        // Its DAG counts its unproven records from now on, in place of what they were
        // remembered to hold (added before that is taken out, so that the total never
        // reads low meanwhile).
        cap.dag.set_meter(self.unproven_held.clone());
        if let Some(was) = self.unloaded_unproven.remove(&name) {
            self.unproven_held.fetch_sub(was, Ordering::Relaxed);
        }
        let cap = Arc::new(Mutex::new(cap));
        self.map.put(name, cap.clone());
        let gone = take_idle(&mut self.map, max);
        for (n, c) in gone {
            if let Some((_, unloads)) = self.loading.get_mut(&n) {
                *unloads += 1;
            }
            let held = c.lock().dag.unproven_bytes();
            if held > 0 {
                // Still counted once the DAG drops (which takes its share out).
                self.unproven_held.fetch_add(held, Ordering::Relaxed);
                self.unloaded_unproven.insert(n, held);
            }
        }
        cap
    }
}

/// Where the next anti-entropy session with a peer starts ([`CapsuleServer::since_last_sync`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncCursor {
    /// Position in the order this server's records became proven
    /// ([`CapsuleDag::proven_order`]): records proven from here on are compared.
    pub pos: u64,
    /// Which load of the capsule (journal replay) `pos` counts in, for a position a session
    /// took ([`CapsuleServer::since_last_sync`]); 0 for a kept cursor. A replay that finds
    /// a hole (or a filled one) builds another proven order, so a session whose capsule
    /// was unloaded and loaded again meanwhile does not move the cursor.
    pub load: u64,
}

/// How far a Hello's stamp may be from the responder's clock (5 minutes, in microseconds):
/// a Hello is good only that long, so a responder remembers stamps only that long.
pub const SYNC_HELLO_WINDOW_MICROS: u64 = 300_000_000;

/// Most (capsule, initiator) pairs whose last Hello stamp a server remembers (see
/// [`CapsuleServer::accept_sync_hello`]).
pub const MAX_HELLO_STAMPS: usize = 1 << 16;

/// How far ahead of the responder's clock a Hello's stamp may be (one minute, in
/// microseconds): replicas' clocks agree far better than that, and a stamp far in the
/// future would be remembered, and hold its place in the table, that much longer.
pub const SYNC_HELLO_AHEAD_MICROS: u64 = 60_000_000;

/// The last Hello stamp taken per (capsule, initiator), kept while in the window.
#[derive(Default)]
struct HelloStamps {
    map: HashMap<(CapsuleName, PublicKey), u64>,
}

impl HelloStamps {
    /// Takes a Hello's stamp `at` at time `now` (see [`CapsuleServer::accept_sync_hello`]);
    /// a `listed` peer ([`ServerOptions::sync_peers`]) is taken even when the table is
    /// full, so strangers filling it cannot keep a known replica out.
    fn take(
        &mut self,
        capsule: &CapsuleName,
        peer: &PublicKey,
        at: u64,
        now: u64,
        listed: bool,
    ) -> Result<()> {
        check_hello_window(at, now)?;
        // Checked under the same hold as the insert: two copies of one Hello arriving
        // together must not both pass, nor a lower stamp replace a higher one.
        self.check_new(capsule, peer, at)?;
        let key = (*capsule, *peer);
        if !listed && !self.map.contains_key(&key) && self.map.len() >= MAX_HELLO_STAMPS {
            self.map
                .retain(|_, s| s.saturating_add(SYNC_HELLO_WINDOW_MICROS) >= now);
            if self.map.len() >= MAX_HELLO_STAMPS {
                return Err(Error::Unavailable(format!(
                    "this server remembers the Hellos of {MAX_HELLO_STAMPS} (capsule, replica) \
                     pairs from the last {} s; try again in a few minutes",
                    SYNC_HELLO_WINDOW_MICROS / 1_000_000
                )));
            }
        }
        self.map.insert(key, at);
        Ok(())
    }

    /// Refuses a Hello stamped `at` that is not above the last one taken from `peer` for
    /// `capsule`.
    fn check_new(&self, capsule: &CapsuleName, peer: &PublicKey, at: u64) -> Result<()> {
        let last = self.map.get(&(*capsule, *peer)).copied().unwrap_or(0);
        if at <= last {
            return Err(Error::Rejected(
                "a Hello this replica already started a session with (replayed)".into(),
            ));
        }
        Ok(())
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Format version of a stored sync cursor: a position in the proven order. Version 2
/// counts the order as [`CapsuleDag::insert_signed`] builds it (a record journaled with
/// its own signature is listed once, where it was listed twice before); a cursor of
/// another version is not used, so the first session after an upgrade compares everything
/// instead of skipping records its old position no longer means.
const SYNC_CURSOR_VERSION: u8 = 2;

/// Most peers a server keeps a sync cursor for in memory (the least recently used is
/// forgotten: the next session with that peer compares everything, unless the peer is one
/// of [`ServerOptions::sync_peers`], whose cursors are also kept in the store).
pub const MAX_SYNC_CURSORS: usize = 1024;

/// The capsule server.
pub struct CapsuleServer {
    store: Arc<dyn Store>,
    key: SigningKey,
    signer: AckSigner,
    opts: ServerOptions,
    capsules: Mutex<Loaded>,
    /// Signalled when a creation ends (`Loaded::creating`).
    created: parking_lot::Condvar,
    /// Reader sessions, least recently used first out ([`ServerOptions::max_sessions`]).
    sessions: Mutex<LruCache<SessionId, Arc<Mutex<Session>>>>,
    /// Names held by all sessions' mirrors ([`ServerOptions::max_mirrored_names`]).
    mirrored: Arc<AtomicUsize>,
    /// Per (capsule, peer server): where in the order this server's records became proven
    /// the next sync with that peer starts (see [`CapsuleServer::since_last_sync`]).
    cursors: Mutex<LruCache<(CapsuleName, PublicKey), SyncCursor>>,
    /// Capsules whose stored sync cursors a load had to drop but could not (the store
    /// refused the commit): until the process ends, sessions of theirs ignore stored
    /// cursors (compare from the start, or from a cursor this run kept) instead of the
    /// capsule failing to load.
    stale_cursors: Mutex<HashSet<CapsuleName>>,
    /// Capsule loads so far (each [`Capsule`] gets the next number).
    loads: AtomicU64,
    /// The stamp of the last Hello this server signed ([`CapsuleServer::sign_sync_hello`]).
    hello_stamp: AtomicU64,
    /// Per (capsule, initiator): the stamp of the last Hello accepted, while it is within
    /// [`SYNC_HELLO_WINDOW_MICROS`] (see [`CapsuleServer::accept_sync_hello`]).
    hello_stamps: Mutex<HelloStamps>,
    /// Verified sealed bodies and subrecords of recent records.
    bodies: BodyCache,
    /// What the unproven records of all capsules hold
    /// ([`ServerOptions::max_unproven_bytes_total`]; see `Loaded::unproven_held`).
    unproven_held: Arc<AtomicU64>,
    /// What writes under way were let in for, of the same budget, before their records
    /// are in their DAG and counted in `unproven_held` (see [`UnprovenReservation`]).
    unproven_reserved: AtomicU64,
}

/// A write's share of [`ServerOptions::max_unproven_bytes_total`], taken when the write is
/// checked and given back when it is done (its records are then counted by their DAG, or
/// it failed). Writes to different capsules run at once, each past its check and through
/// its journal's sync before its records count: without the reservation each saw the
/// others' room, and together they went past the total.
struct UnprovenReservation<'a> {
    reserved: &'a AtomicU64,
    bytes: u64,
}

impl Drop for UnprovenReservation<'_> {
    fn drop(&mut self) {
        self.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

enum JournalEntry {
    Record {
        name: RecordName,
        body: StoredBody,
    },
    Signature {
        name: RecordName,
        sig: WriterSignature,
    },
}

fn encode_journal(prev: Option<&Hash>, seq: u64, entries: &[JournalEntry]) -> Vec<u8> {
    let mut e = Encoder::with_capacity(16 + entries.len() * 80);
    e.raw(&TAG_JOURNAL).u8(JOURNAL_VERSION);
    match prev {
        Some(p) => {
            e.u8(1).hash(p);
        }
        None => {
            e.u8(0);
        }
    }
    e.varint(seq).varint(entries.len() as u64);
    for en in entries {
        match en {
            JournalEntry::Record { name, body } => {
                e.u8(0).hash(name.hash());
                match body {
                    StoredBody::Plain { cid } => {
                        e.u8(0).hash(cid);
                    }
                    StoredBody::Subrecords { list, count } => {
                        e.u8(1).hash(list).varint(*count);
                    }
                }
            }
            JournalEntry::Signature { name, sig } => {
                e.u8(1).hash(name.hash());
                sig.encode(&mut e);
            }
        }
    }
    e.finish()
}

fn decode_journal(bytes: &[u8]) -> Result<(Option<Hash>, u64, Vec<JournalEntry>)> {
    let mut d = Decoder::new(bytes, "capsule journal");
    if d.raw(2)? != TAG_JOURNAL {
        return Err(Error::decode("not a capsule journal chunk"));
    }
    d.version(&[JOURNAL_VERSION])?;
    let prev = match d.u8()? {
        0 => None,
        1 => Some(d.hash()?),
        other => return Err(Error::decode(format!("bad journal prev flag {other}"))),
    };
    let seq = d.varint()?;
    let n = d.count(36)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = d.u8()?;
        let name = RecordName(d.hash()?);
        entries.push(match kind {
            0 => {
                let body = match d.u8()? {
                    0 => StoredBody::Plain { cid: d.hash()? },
                    1 => StoredBody::Subrecords {
                        list: d.hash()?,
                        count: d.varint()?,
                    },
                    other => return Err(Error::decode(format!("bad journal body kind {other}"))),
                };
                JournalEntry::Record { name, body }
            }
            1 => JournalEntry::Signature {
                name,
                sig: WriterSignature::decode(&mut d)?,
            },
            other => return Err(Error::decode(format!("bad journal entry kind {other}"))),
        });
    }
    d.finish()?;
    Ok((prev, seq, entries))
}

/// Prefix of the refs that keep sync cursors across restarts
/// ([`CapsuleServer::finish_sync`]): `capsule-sync/<capsule>/<peer key>`.
const SYNC_CURSOR_PREFIX: &[u8] = b"capsule-sync/";

fn cursor_ref_name(capsule: &CapsuleName, peer: &PublicKey) -> Vec<u8> {
    let mut v = SYNC_CURSOR_PREFIX.to_vec();
    v.extend_from_slice(capsule.hash().to_hex().as_bytes());
    v.push(b'/');
    v.extend_from_slice(hex::encode(peer.raw()).as_bytes());
    v
}

fn ref_name(capsule: &CapsuleName) -> Vec<u8> {
    let mut v = REF_PREFIX.to_vec();
    v.extend_from_slice(capsule.hash().to_hex().as_bytes());
    v
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl CapsuleServer {
    /// A server over `store`, signing acks and checkpoints with `key`.
    pub fn new(store: Arc<dyn Store>, key: SigningKey, opts: ServerOptions) -> Self {
        let unproven_held = Arc::new(AtomicU64::new(0));
        CapsuleServer {
            store,
            signer: AckSigner::new(key.clone()),
            key,
            bodies: BodyCache::new(opts.body_cache_bytes),
            opts,
            created: parking_lot::Condvar::new(),
            capsules: Mutex::new(Loaded {
                map: LruCache::unbounded(),
                loading: Default::default(),
                creating: Default::default(),
                unproven_held: unproven_held.clone(),
                unloaded_unproven: Default::default(),
            }),
            sessions: Mutex::new(LruCache::unbounded()),
            mirrored: Arc::new(AtomicUsize::new(0)),
            unproven_held,
            unproven_reserved: AtomicU64::new(0),
            hello_stamp: AtomicU64::new(0),
            hello_stamps: Mutex::new(HelloStamps::default()),
            stale_cursors: Mutex::new(HashSet::new()),
            loads: AtomicU64::new(0),
            cursors: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(MAX_SYNC_CURSORS)
                    .unwrap_or(std::num::NonZeroUsize::MIN),
            )),
        }
    }

    /// The server's public key (what readers check acks and checkpoints against).
    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn make_ack(&self, capsule: CapsuleName, kind: AckKind, log_size: u64) -> Ack {
        let sig = self
            .key
            .sign(DOMAIN_ACK, &Ack::message(&capsule, &kind, log_size));
        Ack {
            capsule,
            kind,
            log_size,
            server: self.key.public(),
            sig,
        }
    }

    /// Names of all capsules in the store.
    pub fn capsule_names(&self) -> Result<Vec<CapsuleName>> {
        let mut out = Vec::new();
        for (k, _) in self.store.list_refs(REF_PREFIX)? {
            // A ref whose name is not a capsule name (damage, or another program's) is left
            // out and logged, not the end of the listing: every other capsule is still
            // named.
            let parsed = std::str::from_utf8(&k[REF_PREFIX.len()..])
                .ok()
                .and_then(|h| h.parse::<CapsuleName>().ok());
            match parsed {
                Some(name) => out.push(name),
                None => tracing::warn!(
                    "capsule ref {:?} does not name a capsule; left out of the listing",
                    String::from_utf8_lossy(&k)
                ),
            }
        }
        Ok(out)
    }

    /// Create(metadata): stores the metadata and an empty journal. Creating a capsule that
    /// exists is acknowledged again, with its current log size, and changes nothing.
    pub fn create(&self, meta: &CapsuleMetadata) -> Result<Ack> {
        let bytes = meta.encode();
        // As the wire refuses it: every loaded capsule holds its metadata in memory.
        CapsuleMetadata::check_encoded_len(bytes.len()).map_err(Error::invalid)?;
        let name = meta.name();
        cairn_store::check_cid_algo(name.hash(), self.store.algo()).map_err(|_| {
            Error::invalid(format!(
                "capsule hashes with {} but this store uses {}",
                meta.algo,
                self.store.algo()
            ))
        })?;
        let mut caps = self.capsules.lock();
        // One creation of a name at a time, and none while another is under way: a second
        // one that had looked before the first's commit would set the capsule's ref back
        // to an empty journal over writes made since.
        while caps.creating.contains(&name) {
            self.created.wait(&mut caps);
        }
        if caps.map.contains(&name) || self.store.get_ref(&ref_name(&name))?.is_some() {
            // The ack names the log as it stands (loaded for it if need be).
            drop(caps);
            let size = self.capsule(&name)?.lock().dag.log().size();
            return Ok(self.make_ack(name, AckKind::Created, size));
        }
        caps.creating.insert(name);
        drop(caps);
        /// Ends the creation however it ends (a panic in the store too: the name would
        /// otherwise stay claimed, and every later creation of it wait for ever).
        struct Creating<'a>(&'a CapsuleServer, CapsuleName);
        impl Drop for Creating<'_> {
            fn drop(&mut self) {
                self.0.capsules.lock().creating.remove(&self.1);
                self.0.created.notify_all();
            }
        }
        let creating = Creating(self, name);
        // Written and committed without the map's lock: every request for every capsule
        // took it, and waited behind this commit's sync. Not inserted loaded: the first
        // use loads it from the store (an empty journal), as it would any capsule.
        self.store.put_hashed(*name.hash(), &bytes)?;
        let journal = encode_journal(None, 0, &[]);
        let jcid = self.store.put(&journal)?;
        self.store.commit(&[RefUpdate::Set {
            name: ref_name(&name),
            value: jcid.to_bytes().to_vec(),
        }])?;
        drop(creating);
        Ok(self.make_ack(name, AckKind::Created, 0))
    }

    /// In-memory state of a capsule whose newest journal chunk is `journal_head`, before
    /// any replay.
    fn new_capsule(&self, meta: CapsuleMetadata, journal_head: Hash) -> Capsule {
        let trees = NonZeroUsize::new(self.opts.tree_cache).unwrap_or(NonZeroUsize::MIN);
        Capsule {
            dag: CapsuleDag::new(meta),
            journal_head: Some(journal_head),
            journal_seq: 0,
            subrecords: Default::default(),
            more_subrecords: Default::default(),
            trees: LruCache::new(trees),
            tree_leaves: 0,
            load: self.loads.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// Stores sealed subrecords (one chunk each, named by `names`) and their list chunk;
    /// returns the list's cid.
    fn store_subrecords(&self, subs: &SealedSubrecords, names: &[Hash]) -> Result<Hash> {
        let mut list = Encoder::with_capacity(4 + 34 * names.len());
        list.raw(&TAG_SUBRECORD_LIST).varint(names.len() as u64);
        for (data, n) in subs.iter().zip(names) {
            let mut chunk = Vec::with_capacity(2 + data.len());
            chunk.extend_from_slice(&TAG_SUBRECORD);
            chunk.extend_from_slice(data);
            self.store.put_hashed(*n, &chunk)?;
            list.hash(n);
        }
        self.store.put(&list.finish())
    }

    /// The capsule, loaded (journal replayed) on first use.
    fn capsule(&self, name: &CapsuleName) -> Result<Arc<Mutex<Capsule>>> {
        for _ in 0..3 {
            let unloads = {
                let mut caps = self.capsules.lock();
                if let Some(c) = caps.map.get(name) {
                    return Ok(c.clone());
                }
                let entry = caps.loading.entry(*name).or_insert((0, 0));
                entry.0 += 1;
                entry.1
            };
            // Loaded without the map's lock (replaying a journal takes a while).
            let loaded = self.load(name);
            let mut caps = self.capsules.lock();
            let raced = match caps.loading.get_mut(name) {
                Some((loads, now)) => {
                    let raced = *now != unloads;
                    *loads -= 1;
                    if *loads == 0 {
                        caps.loading.remove(name);
                    }
                    raced
                }
                None => true,
            };
            let loaded = loaded?;
            if let Some(c) = caps.map.get(name) {
                return Ok(c.clone());
            }
            if raced {
                // A copy loaded and unloaded meanwhile may have been written to.
                continue;
            }
            return Ok(caps.insert(*name, loaded, self.opts.max_loaded_capsules));
        }
        // Unloads kept racing this load (heavy churn past the limit): load under the map's
        // lock, which no unload can race.
        let mut caps = self.capsules.lock();
        if let Some(c) = caps.map.get(name) {
            return Ok(c.clone());
        }
        let loaded = self.load(name)?;
        Ok(caps.insert(*name, loaded, self.opts.max_loaded_capsules))
    }

    /// Names the mirrors of all sessions hold now (see
    /// [`ServerOptions::max_mirrored_names`]).
    pub fn mirrored_names(&self) -> usize {
        self.mirrored.load(Ordering::Relaxed)
    }

    /// Capsules loaded in memory now (see [`ServerOptions::max_loaded_capsules`]).
    pub fn loaded_capsules(&self) -> usize {
        self.capsules.lock().map.len()
    }

    fn load(&self, name: &CapsuleName) -> Result<Capsule> {
        let head = self
            .store
            .get_ref(&ref_name(name))?
            .ok_or_else(|| Error::NotFound(format!("capsule {name}")))?;
        let head = Hash::from_bytes(&head)?;
        let meta_bytes = self.store.get(name.hash())?.ok_or_else(|| {
            Error::corrupt(format!("metadata chunk of capsule {name} is missing"))
        })?;
        let meta = CapsuleMetadata::decode(&meta_bytes)?;
        if meta.name() != *name {
            return Err(Error::corrupt(format!(
                "metadata of capsule {name} does not match its name"
            )));
        }
        // Walk the journal back to its start, then replay forward.
        let mut chunks = Vec::new();
        let mut cur = Some(head);
        while let Some(cid) = cur {
            let bytes = self.store.get(&cid)?.ok_or_else(|| {
                Error::corrupt(format!("journal chunk {cid} of capsule {name} is missing"))
            })?;
            let (prev, seq, entries) = decode_journal(&bytes)?;
            chunks.push((seq, entries));
            cur = prev;
        }
        let mut cap = self.new_capsule(meta, head);
        // Whether this replay's proven order may differ from the one the stored sync
        // cursors count positions in: records lost (holes), or a record journaled twice (a
        // hole filled in an earlier run: live, its copy became proven after the records
        // that followed it; replayed, at its first place).
        let mut reorders = false;
        for (seq, entries) in chunks.into_iter().rev() {
            if seq != cap.journal_seq {
                return Err(Error::corrupt(format!(
                    "journal of capsule {name} skips from entry {} to {seq}",
                    cap.journal_seq
                )));
            }
            cap.journal_seq += entries.len() as u64;
            // A record goes in with the first signature its journal group carries for it,
            // as the write or sync that journaled them put it in (see
            // `CapsuleDag::insert_signed`), so the proven order replays the same.
            let records: std::collections::HashSet<RecordName> = entries
                .iter()
                .filter_map(|e| match e {
                    JournalEntry::Record { name, .. } => Some(*name),
                    JournalEntry::Signature { .. } => None,
                })
                .collect();
            let mut own_sig: HashMap<RecordName, WriterSignature> = HashMap::new();
            for e in &entries {
                if let JournalEntry::Signature { name: rn, sig } = e
                    && records.contains(rn)
                    && (sig.writer as usize) < cap.dag.meta().writers.len()
                {
                    own_sig.entry(*rn).or_insert(*sig);
                }
            }
            for en in entries {
                match en {
                    JournalEntry::Record { name: rn, body } => {
                        // A header or subrecord list that is missing or fails its checks
                        // costs that record (a hole at its place), not the capsule: every
                        // other record stays readable, provable and writable after.
                        // Other failures (the store unavailable) fail the load.
                        let read = (|| -> Result<(RecordHeader, Vec<Hash>)> {
                            let hb = self.store.get(rn.hash())?.ok_or_else(|| {
                                Error::corrupt(format!(
                                    "header of record {rn} in capsule {name} is missing"
                                ))
                            })?;
                            let header = RecordHeader::decode(&hb)
                                .map_err(|e| Error::corrupt(format!("header of {rn}: {e}")))?;
                            cap.dag.check_header(&header)?;
                            if header.name() != rn {
                                return Err(Error::corrupt(format!(
                                    "header of record {rn} reads back as another"
                                )));
                            }
                            let leaves = match &body {
                                StoredBody::Subrecords { list, .. } => {
                                    self.subrecord_list(list).map_err(|e| match e {
                                        Error::Decode(m) => Error::corrupt(m),
                                        e => e,
                                    })?
                                }
                                _ => Vec::new(),
                            };
                            Ok((header, leaves))
                        })();
                        let (header, leaves) = match read {
                            Ok(r) => r,
                            Err(Error::Corrupt(_)) => {
                                cap.dag.insert_damaged(rn);
                                reorders = true;
                                continue;
                            }
                            Err(e) => return Err(e),
                        };
                        reorders |= cap.dag.contains(&rn);
                        for (i, s) in leaves.iter().enumerate() {
                            cap.index_subrecord(*s, rn, i as u32);
                        }
                        cap.dag
                            .insert_signed(rn, &header, body, own_sig.get(&rn).copied());
                    }
                    JournalEntry::Signature { name: rn, sig } => {
                        // The journal is a hash chain from the capsule ref (every chunk
                        // re-hashed on read), and each signature in it was verified before
                        // it was journaled, so replay does not pay for Ed25519 again;
                        // `audit` re-verifies them all.
                        if !cap.dag.contains(&rn) {
                            // The signature of a record found damaged above is kept for
                            // its copy.
                            if cap.dag.note_damaged_signature(&rn, sig) {
                                continue;
                            }
                            return Err(Error::corrupt(format!(
                                "journal of capsule {name} signs record {rn}, which it lacks"
                            )));
                        }
                        if sig.writer as usize >= cap.dag.meta().writers.len() {
                            return Err(Error::corrupt(format!(
                                "journal of capsule {name} names writer {} it does not have",
                                sig.writer
                            )));
                        }
                        cap.dag.insert_verified_signature(rn, sig);
                    }
                }
            }
        }
        // A store that refuses the commit (full, or failed) does not cost the capsule's
        // reads: its stored cursors are ignored instead, until one is dropped for good.
        if reorders && self.forget_cursors(name).is_err() {
            self.stale_cursors.lock().insert(*name);
        }
        Ok(cap)
    }

    /// Drops every sync cursor of `capsule`, cached and stored: its sessions compare from
    /// the start once, then go on as usual (a cursor counts positions in the proven order,
    /// which a load with holes, or after a hole was filled, rebuilds otherwise).
    fn forget_cursors(&self, capsule: &CapsuleName) -> Result<()> {
        {
            let mut cursors = self.cursors.lock();
            let keys: Vec<(CapsuleName, PublicKey)> = cursors
                .iter()
                .filter(|(k, _)| k.0 == *capsule)
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                cursors.pop(&k);
            }
        }
        let mut prefix = SYNC_CURSOR_PREFIX.to_vec();
        prefix.extend_from_slice(capsule.hash().to_hex().as_bytes());
        prefix.push(b'/');
        let deletes: Vec<RefUpdate> = self
            .store
            .list_refs(&prefix)?
            .into_iter()
            .map(|(name, _)| RefUpdate::Delete {
                name: name.to_vec(),
            })
            .collect();
        if !deletes.is_empty() {
            self.store.commit(&deletes)?;
        }
        Ok(())
    }

    /// Passes `r` on, first noting record `name`'s body damaged (see
    /// [`CapsuleDag::body_damaged`]) when it failed as a missing or damaged stored chunk
    /// does ([`Error::Corrupt`]), so anti-entropy asks peers for a good copy. Called with
    /// the capsule's lock not held.
    fn noting_body_damage<T>(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        r: Result<T>,
    ) -> Result<T> {
        if let Err(Error::Corrupt(_)) = &r
            && let Ok(cap) = self.capsule(capsule)
        {
            // Read again under the lock: a copy stored since (a peer's, a write's) is not
            // taken for damage.
            let mut cap = cap.lock();
            if let Some(body) = cap.dag.node(name).map(|n| n.body)
                && matches!(
                    self.read_body_chunks(name, body),
                    Err(Error::Corrupt(_) | Error::Decode(_))
                )
            {
                cap.dag.note_body_damaged(name);
            }
        }
        r
    }

    fn subrecord_list(&self, list: &Hash) -> Result<Vec<Hash>> {
        let bytes = self
            .store
            .get(list)?
            .ok_or_else(|| Error::corrupt(format!("subrecord list {list} is missing")))?;
        let mut d = Decoder::new(&bytes, "subrecord list");
        if d.raw(2)? != TAG_SUBRECORD_LIST {
            return Err(Error::decode("not a subrecord list chunk"));
        }
        let n = d.count(34)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(d.hash()?);
        }
        d.finish()?;
        Ok(out)
    }

    /// Appends journal entries and moves the capsule ref: the durability point.
    fn append_journal(
        &self,
        name: &CapsuleName,
        cap: &mut Capsule,
        entries: &[JournalEntry],
    ) -> Result<()> {
        let bytes = encode_journal(cap.journal_head.as_ref(), cap.journal_seq, entries);
        let cid = self.store.put(&bytes)?;
        self.store.commit(&[RefUpdate::Set {
            name: ref_name(name),
            value: cid.to_bytes().to_vec(),
        }])?;
        cap.journal_head = Some(cid);
        cap.journal_seq += entries.len() as u64;
        Ok(())
    }

    /// The capsule's metadata.
    pub fn metadata(&self, capsule: &CapsuleName) -> Result<CapsuleMetadata> {
        Ok(self.capsule(capsule)?.lock().dag.meta().clone())
    }

    /// Write(records) and optionally Sign: verifies every record (capsule, body hash), and
    /// every signature, then stores them all or nothing. Records may arrive in any order
    /// and may point at records not (yet) present (holes).
    pub fn write(
        &self,
        capsule: &CapsuleName,
        records: &[Record],
        signatures: &[(RecordName, WriterSignature)],
    ) -> Result<Ack> {
        // The ack is signed on the signer's thread while this one commits (and syncs).
        let mut early = None;
        let (names, size) =
            self.write_inner(capsule, records, signatures, false, &mut |names, size| {
                let kind = AckKind::for_write(names.to_vec(), signatures);
                let msg = Ack::message(capsule, &kind, size);
                early = self.signer.start(msg).map(|rx| (size, rx));
            })?;
        let kind = AckKind::for_write(names, signatures);
        if let Some((signed_size, rx)) = early
            && signed_size == size
            && let Ok(sig) = rx.recv()
        {
            return Ok(Ack {
                capsule: *capsule,
                kind,
                log_size: size,
                server: self.key.public(),
                sig,
            });
        }
        Ok(self.make_ack(*capsule, kind, size))
    }

    /// [`CapsuleServer::write`] without signing an ack, for writers in this process (a
    /// [`crate::Bucket`]): returns the names written and the log size. Records are verified
    /// exactly as for `write`; with `own_signatures` the signatures are not, because the
    /// caller made them a moment ago with a key it checked against the metadata
    /// ([`crate::Writer::new`]); [`CapsuleServer::audit`] re-verifies them.
    pub(crate) fn write_unacked(
        &self,
        capsule: &CapsuleName,
        records: &[Record],
        signatures: &[(RecordName, WriterSignature)],
        own_signatures: bool,
    ) -> Result<(Vec<RecordName>, u64)> {
        self.write_inner(capsule, records, signatures, own_signatures, &mut |_, _| {})
    }

    /// [`CapsuleServer::write_unacked`], calling `committing(names, log size)` with what
    /// the ack will say just before the journal commit starts (only when there is one).
    fn write_inner(
        &self,
        capsule: &CapsuleName,
        records: &[Record],
        signatures: &[(RecordName, WriterSignature)],
        own_signatures: bool,
        committing: &mut dyn FnMut(&[RecordName], u64),
    ) -> Result<(Vec<RecordName>, u64)> {
        let cap = self.capsule(capsule)?;
        // What needs no capsule state is checked before its lock is taken (hashing a
        // large write's bodies held its readers and writers meanwhile).
        let mut names = Vec::with_capacity(records.len());
        let mut encoded = Vec::with_capacity(records.len());
        for r in records {
            if r.header.capsule != *capsule {
                return Err(Error::Rejected(format!(
                    "record names capsule {}, not {capsule}",
                    r.header.capsule
                )));
            }
            if matches!(r.header.body, BodyRef::Subrecords { .. }) {
                return Err(Error::invalid(
                    "subrecord records are written with commit_subrecords",
                ));
            }
            r.check_body()?;
            check_reloadable(&r.header)?;
            let hb = r.header.encode();
            names.push(RecordName(capsule.hash().algo().digest(&hb)));
            encoded.push(hb);
        }
        let mut cap = cap.lock();
        // Sets, not scans: a batch of 65,536 records took seconds of quadratic compares
        // under the capsule lock.
        let mut seen = std::collections::HashSet::with_capacity(names.len());
        let fresh: Vec<usize> = (0..records.len())
            .filter(|&i| !cap.dag.contains(&names[i]) && seen.insert(names[i]))
            .collect();
        let batch: Vec<RecordName> = fresh.iter().map(|&i| names[i]).collect();
        // One signature per record: copies of one public signature made a request of
        // 65,536 verifications under the capsule lock.
        let mut signed = std::collections::HashSet::with_capacity(signatures.len());
        for (n, ws) in signatures {
            if !signed.insert(*n) {
                return Err(Error::invalid(format!(
                    "record {n} is signed twice in one write"
                )));
            }
            if !cap.dag.contains(n) && !seen.contains(n) {
                return Err(Error::NotFound(format!(
                    "cannot sign record {n}: not in capsule {capsule}"
                )));
            }
            // A signature the record already holds was verified when it was stored.
            if !own_signatures && cap.dag.signature(n) != Some(ws) {
                ws.verify(cap.dag.meta(), n)?;
            }
        }
        // Records of the batch its signatures prove (a signed record and every record of
        // the batch it reaches through backpointers) are not counted: a writer's chain
        // signed at its newest record is taken whatever unsigned records others left.
        let proven = proven_in_batch(&batch, &fresh, records, signatures, |n| {
            cap.dag.has_proven_child(n)
        });
        let new_unproven = proven.iter().filter(|p| !**p).count();
        // Their memory too.
        let new_bytes: u64 = fresh
            .iter()
            .zip(&proven)
            .filter(|(_, p)| !**p)
            .map(|(&i, _)| {
                crate::dag::unproven_cost(encoded[i].len(), records[i].header.backpointers.len(), 0)
            })
            .sum();
        let over = |covered: usize, freed: u64| {
            cap.dag.unproven() + new_unproven > self.opts.max_unproven + covered
                || self.unproven_bytes_over(&cap.dag, new_bytes, freed)
        };
        // Signatures on present unproven records free those records and the unsigned ones
        // they reach (what `unproven_reached` counts: a signature on a record already
        // proven frees nothing). Walked only when the limits would refuse without them.
        let mut freed = 0;
        if over(0, 0) {
            let (covered, f) = cap.dag.unproven_reached(signatures.iter().map(|(n, _)| n));
            freed = f;
            if cap.dag.unproven() + new_unproven > self.opts.max_unproven + covered {
                return Err(Error::Unavailable(format!(
                    "capsule {capsule} already holds {} records no signature covers (limit {}); sign one first",
                    cap.dag.unproven(),
                    self.opts.max_unproven
                )));
            }
            self.check_unproven_bytes(capsule, &cap.dag, new_bytes, freed)?;
        }
        // Held until the records are in the DAG (end of this call).
        let _reserved = self.reserve_unproven(new_bytes, freed)?;
        let mut entries = Vec::with_capacity(fresh.len() + signatures.len());
        for &i in &fresh {
            let r = &records[i];
            // Subrecord headers were refused above.
            let BodyRef::Plain { hash: cid, .. } = r.header.body else {
                continue;
            };
            self.store.put_hashed(cid, &body_chunk(&r.body))?;
            self.store.put_hashed(*names[i].hash(), &encoded[i])?;
            entries.push(JournalEntry::Record {
                name: names[i],
                body: StoredBody::Plain { cid },
            });
        }
        // A record held here whose body was found damaged, written again: its checked body
        // is stored anew (the record keeps its place; nothing is journaled for it).
        let mut repaired = Vec::new();
        for (r, n) in records.iter().zip(&names) {
            // (A second copy in the batch finds the chunk sound and costs a lookup.)
            if let (true, BodyRef::Plain { hash, .. }) = (cap.dag.is_body_damaged(n), r.header.body)
            {
                self.store.put_hashed(hash, &body_chunk(&r.body))?;
                repaired.push(*n);
            }
        }
        for (n, ws) in signatures {
            if cap.dag.signature(n).is_none() {
                entries.push(JournalEntry::Signature { name: *n, sig: *ws });
            }
        }
        if !entries.is_empty() {
            // Every fresh record becomes one leaf of the capsule's log below.
            committing(&names, cap.dag.log().size() + fresh.len() as u64);
            self.append_journal(capsule, &mut cap, &entries)?;
        } else if !repaired.is_empty() {
            self.store.commit(&[])?;
        }
        for n in &repaired {
            cap.dag.clear_body_damaged(n);
        }
        // A fresh record's own signature (the first the write carries for it, as the
        // journal's first entry for it) goes in with it, as a replay of the journal does.
        let mut own_sig: HashMap<RecordName, WriterSignature> = HashMap::new();
        for (n, ws) in signatures {
            own_sig.entry(*n).or_insert(*ws);
        }
        for &i in &fresh {
            let r = &records[i];
            if let BodyRef::Plain { hash, .. } = r.header.body {
                // Only now, with the record journaled: a hit there means it was accepted.
                self.bodies.insert(capsule, hash, false, &r.body);
                cap.dag.insert_signed(
                    names[i],
                    &r.header,
                    StoredBody::Plain { cid: hash },
                    own_sig.get(&names[i]).copied(),
                );
            }
        }
        for (n, ws) in signatures {
            cap.dag.insert_verified_signature(*n, *ws);
        }
        Ok((names, cap.dag.log().size()))
    }

    /// Re-verifies a capsule from its stored state: every record header is re-read (and
    /// re-hashed) and checked against the capsule, every writer signature is checked
    /// again, and every body chunk (a plain body, a subrecord list and its subrecords) is
    /// re-read, which re-hashes it. Returns (records, signatures) checked. A body found
    /// missing or damaged is noted ([`CapsuleDag::body_damaged`], so anti-entropy asks
    /// peers for it) and the audit goes on through the rest, then fails naming how many.
    pub fn audit(&self, capsule: &CapsuleName) -> Result<(u64, u64)> {
        let (records, signatures, bodies) = self.audit_headers(capsule)?;
        // Bodies are read without the capsule's lock (writers and readers go on).
        let mut damaged: Vec<RecordName> = Vec::new();
        for (name, body) in bodies {
            match self.read_body_chunks(&name, body) {
                Ok(()) => {}
                Err(Error::Corrupt(_) | Error::Decode(_)) => damaged.push(name),
                Err(e) => return Err(e),
            }
        }
        if !damaged.is_empty() {
            let cap = self.capsule(capsule)?;
            let mut cap = cap.lock();
            // Read again under the lock before noting: a copy may have been stored since.
            damaged.retain(|n| {
                cap.dag.node(n).map(|node| node.body).is_some_and(|body| {
                    matches!(
                        self.read_body_chunks(n, body),
                        Err(Error::Corrupt(_) | Error::Decode(_))
                    )
                })
            });
            for n in &damaged {
                cap.dag.note_body_damaged(n);
            }
        }
        if let Some(first) = damaged.first() {
            return Err(Error::corrupt(format!(
                "capsule {capsule}: the body of {} record(s) is missing or damaged (first: \
                 {first}); anti-entropy with a replica holding them stores them again",
                damaged.len()
            )));
        }
        Ok((records, signatures))
    }

    /// Reads every chunk of record `name`'s body (`body`), which re-hashes it: the body
    /// chunk, or the subrecord list and each subrecord. [`Error::Corrupt`] when one is
    /// missing or damaged.
    fn read_body_chunks(&self, name: &RecordName, body: StoredBody) -> Result<()> {
        match body {
            StoredBody::Plain { cid } => self
                .store
                .get(&cid)?
                .map(|_| ())
                .ok_or_else(|| Error::corrupt(format!("body of record {name} is missing"))),
            StoredBody::Subrecords { list, .. } => {
                for s in self.subrecord_list(&list)? {
                    self.store.get(&s)?.ok_or_else(|| {
                        Error::corrupt(format!("subrecord {s} of record {name} is missing"))
                    })?;
                }
                Ok(())
            }
        }
    }

    /// The header and signature part of [`CapsuleServer::audit`], under the capsule's
    /// lock; also returns how each record keeps its body.
    fn audit_headers(&self, capsule: &CapsuleName) -> Result<(u64, u64, RecordBodies)> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        let mut records = 0;
        let mut signatures = 0;
        let mut bodies = Vec::with_capacity(cap.dag.order().len());
        for n in cap.dag.order() {
            let header = self.header(n)?;
            cap.dag.check_header(&header)?;
            if header.name() != *n {
                return Err(Error::corrupt(format!("record {n} reads back as another")));
            }
            records += 1;
            if let Some(ws) = cap.dag.signature(n) {
                ws.verify(cap.dag.meta(), n)
                    .map_err(|e| Error::corrupt(format!("stored signature on record {n}: {e}")))?;
                signatures += 1;
            }
            if let Some(node) = cap.dag.node(n) {
                bodies.push((*n, node.body));
            }
        }
        Ok((records, signatures, bodies))
    }

    /// Sign(record name, signature): stores a writer signature on a present record.
    pub fn sign(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        ws: WriterSignature,
    ) -> Result<Ack> {
        let cap = self.capsule(capsule)?;
        let mut cap = cap.lock();
        if !cap.dag.contains(name) {
            return Err(Error::NotFound(format!(
                "cannot sign record {name}: not in capsule {capsule}"
            )));
        }
        ws.verify(cap.dag.meta(), name)?;
        if cap.dag.signature(name).is_none() {
            self.append_journal(
                capsule,
                &mut cap,
                &[JournalEntry::Signature {
                    name: *name,
                    sig: ws,
                }],
            )?;
            cap.dag.insert_verified_signature(*name, ws);
        }
        let size = cap.dag.log().size();
        Ok(self.make_ack(*capsule, AckKind::Signed(*name), size))
    }

    /// Commit(backpointers) of the subrecord API: stores `subrecords` as one record whose
    /// header (built and signed by the writer) carries their tree's root.
    pub fn commit_subrecords(
        &self,
        capsule: &CapsuleName,
        header: &RecordHeader,
        subrecords: &SealedSubrecords,
        sig: Option<WriterSignature>,
    ) -> Result<Ack> {
        // The subrecords are hashed and their tree built before the capsule is locked: a
        // million of them took the lock from its readers and writers meanwhile. The cheap
        // refusals come first (an unknown capsule, a header that is not this capsule's).
        let cap = self.capsule(capsule)?;
        cap.lock().dag.check_header(header)?;
        check_reloadable(header)?;
        let algo = capsule.hash().algo();
        let BodyRef::Subrecords { root, count } = header.body else {
            return Err(Error::invalid(
                "commit_subrecords needs a header with a subrecord root",
            ));
        };
        if subrecords.is_empty()
            || subrecords.len() > MAX_SUBRECORDS
            || count != subrecords.len() as u64
        {
            return Err(Error::Rejected(format!(
                "header counts {count} subrecords but {} were sent",
                subrecords.len()
            )));
        }
        subrecords.check_len()?;
        // The tree the root is checked with is the one later proofs walk: keep it.
        let names: Vec<Hash> = subrecords.iter().map(|s| subrecord_name(algo, s)).collect();
        let mut tree = MerkleLog::new(algo);
        for n in &names {
            tree.push(subrecord_leaf(n));
        }
        if Hash::new(algo, tree.root()) != root {
            return Err(Error::Rejected(
                "subrecords do not hash to the header's root".into(),
            ));
        }
        let hb = header.encode();
        let name = RecordName(algo.digest(&hb));
        let mut cap = cap.lock();
        cap.dag.check_header(header)?;
        if let Some(ws) = &sig {
            ws.verify(cap.dag.meta(), &name)?;
        }
        if cap.dag.contains(&name) {
            // Present already (committed unsigned, or received by anti-entropy): a signature
            // sent now is kept, as `write` keeps one on a present record, before the ack.
            // A body found damaged is stored again from these subrecords, checked above
            // against the header's root (the list they make is the one journaled).
            let repair = cap.dag.is_body_damaged(&name);
            if repair {
                let stored = cap.dag.node(&name).map(|n| n.body);
                let list = self.store_subrecords(subrecords, &names)?;
                if !matches!(stored, Some(StoredBody::Subrecords { list: l, .. }) if l == list) {
                    return Err(Error::corrupt(format!(
                        "record {name}: its subrecords make another list than the one journaled"
                    )));
                }
            }
            if let Some(ws) = sig
                && cap.dag.signature(&name).is_none()
            {
                self.append_journal(
                    capsule,
                    &mut cap,
                    &[JournalEntry::Signature { name, sig: ws }],
                )?;
                cap.dag.insert_verified_signature(name, ws);
            } else if repair {
                // The stored copies made durable, as a commit makes anything.
                self.store.commit(&[])?;
            }
            if repair {
                cap.dag.clear_body_damaged(&name);
            }
            let size = cap.dag.log().size();
            let signed = sig.map(|_| name).into_iter().collect();
            return Ok(self.make_ack(*capsule, AckKind::wrote(vec![name], signed), size));
        }
        if sig.is_none() && cap.dag.unproven() + 1 > self.opts.max_unproven {
            return Err(Error::Unavailable(format!(
                "capsule {capsule} holds too many records no signature covers; sign one first"
            )));
        }
        let cost = match sig {
            None => crate::dag::unproven_cost(hb.len(), header.backpointers.len(), count),
            Some(_) => 0,
        };
        self.check_unproven_bytes(capsule, &cap.dag, cost, 0)?;
        // Held until the record is in the DAG (end of this call).
        let _reserved = self.reserve_unproven(cost, 0)?;
        let list_cid = self.store_subrecords(subrecords, &names)?;
        self.store.put_hashed(*name.hash(), &hb)?;
        let body = StoredBody::Subrecords {
            list: list_cid,
            count,
        };
        let mut entries = vec![JournalEntry::Record { name, body }];
        if let Some(ws) = sig {
            entries.push(JournalEntry::Signature { name, sig: ws });
        }
        self.append_journal(capsule, &mut cap, &entries)?;
        for (i, n) in names.iter().enumerate() {
            cap.index_subrecord(*n, name, i as u32);
        }
        // Only now that the capsule holds them (see `BodyCache`).
        for (data, n) in subrecords.iter().zip(&names) {
            self.bodies.insert(capsule, *n, true, data);
        }
        cap.dag.insert_signed(name, header, body, sig);
        cap.cache_tree(&self.opts, name, Arc::new(tree));
        let size = cap.dag.log().size();
        let signed = sig.map(|_| name).into_iter().collect();
        Ok(self.make_ack(*capsule, AckKind::wrote(vec![name], signed), size))
    }

    fn header(&self, name: &RecordName) -> Result<RecordHeader> {
        let bytes = self
            .store
            .get(name.hash())?
            .ok_or_else(|| Error::corrupt(format!("header of record {name} is missing")))?;
        RecordHeader::decode(&bytes)
    }

    /// The header of a present record, from the bytes the DAG keeps in memory.
    fn mem_header(cap: &Capsule, name: &RecordName) -> Result<RecordHeader> {
        cap.dag.header(name).ok_or_else(|| {
            Error::NotFound(format!("record {name} in capsule {}", cap.dag.name()))
        })?
    }

    /// The sealed body of record `name` if the body cache holds it (checked against the
    /// header's body hash and length); `None` when it must be read from the store.
    fn cached_body(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        body: StoredBody,
        header: &RecordHeader,
    ) -> Result<Option<Vec<u8>>> {
        let (StoredBody::Plain { cid }, BodyRef::Plain { hash, len }) = (body, &header.body) else {
            return Ok(None);
        };
        let Some(sealed) = self.bodies.get(capsule, &cid, false) else {
            return Ok(None);
        };
        if cid != *hash || sealed.len() as u64 != *len {
            return Err(body_mismatch(name));
        }
        Ok(Some(sealed.to_vec()))
    }

    /// The sealed body of record `name` past the body cache: reads the body chunk from the
    /// store (and keeps it in the cache).
    fn stored_body(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        body: StoredBody,
        header: &RecordHeader,
    ) -> Result<Vec<u8>> {
        let read = self.stored_body_unnoted(capsule, name, body, header);
        self.noting_body_damage(capsule, name, read)
    }

    /// [`CapsuleServer::stored_body`] without noting damage.
    fn stored_body_unnoted(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        body: StoredBody,
        header: &RecordHeader,
    ) -> Result<Vec<u8>> {
        let mismatch = || body_mismatch(name);
        match (body, &header.body) {
            (StoredBody::Plain { cid }, BodyRef::Plain { hash, len }) => {
                // The body chunk is `TAG_BODY ‖ sealed`, named by the header's body hash;
                // the store re-hashed it against that cid on this read, so only the name
                // and the length are left to check.
                if cid != *hash {
                    return Err(mismatch());
                }
                let chunk = self
                    .store
                    .get(&cid)?
                    .ok_or_else(|| Error::corrupt(format!("body of record {name} is missing")))?;
                if chunk.len() < 2 || chunk[..2] != TAG_BODY || (chunk.len() - 2) as u64 != *len {
                    return Err(mismatch());
                }
                self.bodies.insert(capsule, cid, false, &chunk[2..]);
                // Reuses the chunk's buffer when the store handed over the only reference.
                let mut sealed = Vec::from(chunk);
                sealed.drain(..2);
                Ok(sealed)
            }
            (StoredBody::Subrecords { .. }, BodyRef::Subrecords { .. }) => Ok(Vec::new()),
            _ => Err(mismatch()),
        }
    }

    /// Read(name): the record's header and (sealed) body, checked against each other.
    pub fn read(&self, capsule: &CapsuleName, name: &RecordName) -> Result<Record> {
        self.read_within(capsule, name, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::read`], calling `reserve` with twice the body's length (as read,
    /// and in an encoded answer) before a body the cache does not hold is read from the
    /// store, with no lock held (a network endpoint takes it from its memory budget, so
    /// many large reads at once wait for memory); an error from `reserve` ends the read
    /// with that error.
    pub fn read_within(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Record> {
        let cap = self.capsule(capsule)?;
        let (stored, header) = Self::stored_record(&cap.lock(), capsule, name)?;
        let body = match self.cached_body(capsule, name, stored, &header)? {
            Some(body) => body,
            None => {
                reserve(answer_bytes(&header))?;
                self.stored_body(capsule, name, stored, &header)?
            }
        };
        Ok(Record { header, body })
    }

    /// How record `name` of a locked capsule is stored, and its header.
    fn stored_record(
        cap: &Capsule,
        capsule: &CapsuleName,
        name: &RecordName,
    ) -> Result<(StoredBody, RecordHeader)> {
        let node = cap
            .dag
            .node(name)
            .ok_or_else(|| Error::NotFound(format!("record {name} in capsule {capsule}")))?;
        Ok((node.body, RecordHeader::decode(&node.header)?))
    }

    /// Read-and-prove: the record's sealed body and [`CapsuleServer::prove`]'s proof for it,
    /// whose first header is the record's (so the header travels once). The body is read
    /// before the proof is issued, so a failed read leaves the session's mirror as it was.
    pub fn read_and_prove(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
    ) -> Result<(Vec<u8>, Issued<RecordProof>)> {
        self.read_and_prove_within(capsule, name, session, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::read_and_prove`], reserving as [`CapsuleServer::read_within`]
    /// does; a refused reservation issues nothing.
    pub fn read_and_prove_within(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<u8>, Issued<RecordProof>)> {
        let cap = self.capsule(capsule)?;
        let mut locked = cap.lock();
        let (stored, header) = Self::stored_record(&locked, capsule, name)?;
        // A body the cache holds is read under the lock; any other is read outside it,
        // since that may read the store.
        let body = match self.cached_body(capsule, name, stored, &header)? {
            Some(body) => body,
            None => {
                drop(locked);
                reserve(answer_bytes(&header))?;
                let body = self.stored_body(capsule, name, stored, &header)?;
                locked = cap.lock();
                body
            }
        };
        // The proof travels beside the body: it has the rest of the frame.
        let room = MAX_PROOF_BYTES.saturating_sub(body.len());
        let issued = self.prove_locked(&locked, capsule, name, session, Some(header), room)?;
        Ok((body, issued))
    }

    /// Read(subrecord name): the subrecord's bytes.
    pub fn read_subrecord(&self, capsule: &CapsuleName, sub: &Hash) -> Result<Vec<u8>> {
        self.read_subrecord_within(capsule, sub, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::read_subrecord`], calling `reserve` with the subrecord's length
    /// before its bytes are read or copied (a subrecord may be tens of MiB, and a network
    /// endpoint takes them from its memory budget first); an error from `reserve` ends the
    /// read with that error.
    pub fn read_subrecord_within(
        &self,
        capsule: &CapsuleName,
        sub: &Hash,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<u8>> {
        // A hit means the capsule accepted this subrecord (see `BodyCache`).
        if let Some(sealed) = self.bodies.get(capsule, sub, true) {
            reserve(sealed.len())?;
            return Ok(sealed.to_vec());
        }
        {
            let cap = self.capsule(capsule)?;
            if !cap.lock().subrecords.contains_key(sub) {
                return Err(Error::NotFound(format!(
                    "subrecord {sub} in capsule {capsule}"
                )));
            }
        }
        let missing = || Error::corrupt(format!("subrecord {sub} is missing"));
        let len = match self.store.chunk_len(sub) {
            Ok(Some(len)) => len,
            Ok(None) => return Err(self.subrecord_damaged(capsule, sub, missing())),
            Err(e) => return Err(e),
        };
        reserve(usize::try_from(len.saturating_sub(2)).unwrap_or(usize::MAX))?;
        let chunk = match self.store.get(sub) {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Err(self.subrecord_damaged(capsule, sub, missing())),
            Err(e) => return Err(self.subrecord_damaged(capsule, sub, e)),
        };
        let sealed = chunk.get(2..).unwrap_or_default();
        self.bodies.insert(capsule, *sub, true, sealed);
        Ok(sealed.to_vec())
    }

    /// Passes on `e`, a failed read of subrecord `sub`'s chunk, first noting the bodies of
    /// the records holding `sub` damaged when the chunk is missing or damaged.
    fn subrecord_damaged(&self, capsule: &CapsuleName, sub: &Hash, e: Error) -> Error {
        if matches!(e, Error::Corrupt(_))
            && let Ok(cap) = self.capsule(capsule)
        {
            let mut cap = cap.lock();
            // Read again under the lock, as `noting_body_damage` does.
            if matches!(self.store.get(sub), Ok(Some(_))) {
                return e;
            }
            let mut holders: Vec<RecordName> =
                cap.subrecords.get(sub).map(|h| h.0).into_iter().collect();
            if let Some(more) = cap.more_subrecords.get(sub) {
                holders.extend(more.iter().map(|h| h.0));
            }
            for h in holders {
                cap.dag.note_body_damaged(&h);
            }
        }
        e
    }

    /// Read(many subrecord names): their bytes, in the order named; all or nothing (a name
    /// the capsule does not hold fails the whole request). At most
    /// [`MAX_BATCH_SUBRECORDS`] names.
    pub fn read_subrecords(&self, capsule: &CapsuleName, subs: &[Hash]) -> Result<Vec<Vec<u8>>> {
        self.read_subrecords_within(capsule, subs, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::read_subrecords`], calling `reserve` with the bytes of each
    /// subrecord before reading it (a network endpoint takes them from its memory budget,
    /// so many large batches read at once wait for memory); an error from `reserve` ends
    /// the read with that error.
    pub fn read_subrecords_within(
        &self,
        capsule: &CapsuleName,
        subs: &[Hash],
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<Vec<u8>>> {
        if subs.len() > MAX_BATCH_SUBRECORDS {
            return Err(Error::invalid(format!(
                "{} subrecords in one read request; at most {MAX_BATCH_SUBRECORDS}",
                subs.len()
            )));
        }
        // The answer is bounded in bytes, not only in names: a name may be repeated and a
        // subrecord may be large.
        let mut total = 0usize;
        let mut out = Vec::with_capacity(subs.len().min(4096));
        for s in subs {
            // Counted and reserved before each is read.
            let sealed = self.read_subrecord_within(capsule, s, &mut |n| {
                total = total.saturating_add(n).saturating_add(10);
                if total > MAX_BATCH_ANSWER_BYTES {
                    return Err(Error::invalid(format!(
                        "the {} subrecords asked for come to more than {} MiB; ask for fewer at a time",
                        subs.len(),
                        MAX_BATCH_ANSWER_BYTES >> 20
                    )));
                }
                reserve(n)
            })?;
            out.push(sealed);
        }
        Ok(out)
    }

    /// Subrecords(record): the names of a record's subrecords, in tree order.
    pub fn subrecords(&self, capsule: &CapsuleName, record: &RecordName) -> Result<Vec<Hash>> {
        self.subrecords_within(capsule, record, &mut |_| Ok(()))
    }

    /// How record `record` of `capsule` keeps its body (NotFound when it is not present).
    fn record_body(&self, capsule: &CapsuleName, record: &RecordName) -> Result<StoredBody> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        Ok(cap
            .dag
            .node(record)
            .ok_or_else(|| Error::NotFound(format!("record {record} in capsule {capsule}")))?
            .body)
    }

    /// [`CapsuleServer::subrecords`], taking the memory the list and its answer hold (the
    /// stored list, the names, their encoding: about 100 bytes a subrecord, 100 MiB for
    /// the largest record) from `reserve` before reading the list.
    pub fn subrecords_within(
        &self,
        capsule: &CapsuleName,
        record: &RecordName,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<Hash>> {
        match self.record_body(capsule, record)? {
            StoredBody::Subrecords { list, count } => {
                let each = 2 * 34 + std::mem::size_of::<Hash>();
                reserve(
                    usize::try_from(count)
                        .unwrap_or(usize::MAX)
                        .saturating_mul(each),
                )?;
                let read = self.subrecord_list(&list);
                self.noting_body_damage(capsule, record, read)
            }
            StoredBody::Plain { .. } => Err(Error::TypeMismatch(format!(
                "record {record} has no subrecords"
            ))),
        }
    }

    /// QueryFresh(): the proven heads ([`CapsuleDag::proven_heads`]), with the log size
    /// and root, signed by this server together with the reader's `nonce` (a fresh random
    /// value per query). The log counts every accepted record, signed or not: inclusion
    /// in it shows the server took a record, not that a writer signed it.
    pub fn query_fresh(&self, capsule: &CapsuleName, nonce: [u8; 16]) -> Result<Checkpoint> {
        self.query_fresh_within(capsule, nonce, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::query_fresh`], calling `reserve` with the memory the checkpoint's
    /// heads take (the list, the signed message, the answer) before building it, without
    /// holding the capsule's lock meanwhile (a writer can make a capsule of a million
    /// proven heads, and a network endpoint takes that memory from its budget first).
    pub fn query_fresh_within(
        &self,
        capsule: &CapsuleName,
        nonce: [u8; 16],
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Checkpoint> {
        let cap = self.capsule(capsule)?;
        let per_head = 3 * 34;
        let mut reserved = 0;
        let mut want = cap.lock().dag.proven_heads_len();
        let cap = loop {
            // More if writes added heads while waiting for the memory.
            reserve(
                want.saturating_sub(reserved)
                    .saturating_mul(per_head)
                    .saturating_add(if reserved == 0 { 256 } else { 0 }),
            )?;
            reserved = want;
            let locked = cap.lock();
            want = locked.dag.proven_heads_len();
            if want <= reserved {
                break locked;
            }
        };
        let size = cap.dag.log().size();
        let root = cap.dag.log().root();
        let heads = cap.dag.proven_heads();
        let time_ms = now_ms();
        let msg = Checkpoint::message(capsule, size, &root, &heads, time_ms, &nonce);
        let cp = Checkpoint {
            capsule: *capsule,
            size,
            root,
            heads,
            time_ms,
            nonce,
            server: self.key.public(),
            sig: self.key.sign(DOMAIN_CHECKPOINT, &msg),
        };
        Ok(cp)
    }

    /// The Merkle-log inclusion proof of `name` in the log's first `size` leaves; returns
    /// the leaf index and the audit path.
    pub fn log_inclusion(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        size: u64,
    ) -> Result<(u64, Vec<Digest>)> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        let index = cap
            .dag
            .node(name)
            .ok_or_else(|| Error::NotFound(format!("record {name} in capsule {capsule}")))?
            .index;
        Ok((index, cap.dag.log().inclusion_proof(index, size)?))
    }

    /// The Merkle-log consistency proof between sizes `first` and `second`.
    pub fn log_consistency(
        &self,
        capsule: &CapsuleName,
        first: u64,
        second: u64,
    ) -> Result<Vec<Digest>> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        cap.dag.log().consistency_proof(first, second)
    }

    /// Starts a reader session with a mirrored verification cache: `policy` is the
    /// reader's, `cached` the names it already holds, least recent first.
    pub fn open_session(
        &self,
        capsule: &CapsuleName,
        policy: CachePolicy,
        cached: &[Hash],
    ) -> Result<SessionId> {
        self.open_session_with(capsule, policy, MirrorMode::OnAck, cached)
    }

    /// [`CapsuleServer::open_session`] with the mirror mode the reader chose: whether the
    /// mirror takes in a proof's names when the reader acks it or when this server issues
    /// it.
    pub fn open_session_with(
        &self,
        capsule: &CapsuleName,
        policy: CachePolicy,
        mode: MirrorMode,
        cached: &[Hash],
    ) -> Result<SessionId> {
        self.capsule(capsule)?;
        if let CachePolicy::Lru { capacity } = policy
            && capacity as usize > self.opts.max_mirrored_names
        {
            return Err(Error::invalid(format!(
                "cache capacity {capacity} exceeds the {} names this server mirrors for all \
                 sessions together; ask for a smaller cache",
                self.opts.max_mirrored_names
            )));
        }
        let mut session = Session {
            capsule: *capsule,
            mirror: VerificationCache::new(policy)?,
            mode,
            pending: BTreeMap::new(),
            pending_names: 0,
            next_proof: 1,
            mirrored: self.mirrored.clone(),
        };
        session.mirror_insert(cached);
        // Random, so that no other client can name (and close, or ack proofs in) a session
        // it did not open: a session id is a capability.
        let id = {
            let mut sessions = self.sessions.lock();
            while sessions.len() >= self.opts.max_sessions.max(1) {
                sessions.pop_lru();
            }
            let id = loop {
                let id = SessionId(random_session_number()?);
                if !sessions.contains(&id) {
                    break id;
                }
            };
            sessions.put(id, Arc::new(Mutex::new(session)));
            id
        };
        self.keep_mirrors_in_budget(id);
        Ok(id)
    }

    /// Ends the least recently used sessions other than `keep` while the mirrors hold more
    /// than [`ServerOptions::max_mirrored_names`] names. Takes no session's lock (one in
    /// use is counted as holding nothing, so this may end one session too many rather
    /// than wait); its names leave the count when its last user lets go.
    fn keep_mirrors_in_budget(&self, keep: SessionId) {
        let max = self.opts.max_mirrored_names;
        let mut held = self.mirrored.load(Ordering::Relaxed);
        if held <= max {
            return;
        }
        let mut ended = Vec::new();
        {
            let mut sessions = self.sessions.lock();
            while held > max {
                match sessions.peek_lru() {
                    Some((id, _)) if *id != keep => {}
                    _ => break,
                }
                let Some((_, s)) = sessions.pop_lru() else {
                    break;
                };
                held = held.saturating_sub(s.try_lock().map_or(0, |g| g.held()));
                ended.push(s);
            }
        }
        // Dropped (and uncounted) outside the map's lock.
        drop(ended);
    }

    /// Ends a session.
    pub fn close_session(&self, id: SessionId) {
        self.sessions.lock().pop(&id);
    }

    fn session(&self, id: SessionId, capsule: &CapsuleName) -> Result<Arc<Mutex<Session>>> {
        let s = self
            .sessions
            .lock()
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("session {}", id.0)))?;
        if s.lock().capsule != *capsule {
            return Err(Error::invalid("session belongs to another capsule"));
        }
        Ok(s)
    }

    /// Hands `proof` to `session`: its names go into the mirror now ([`MirrorMode::OnIssue`])
    /// or when the reader acks it. The caller then calls
    /// [`CapsuleServer::keep_mirrors_in_budget`].
    fn issue<P>(session: &mut Session, inserts: Vec<Hash>, proof: P, budget: usize) -> Issued<P> {
        if session.mode == MirrorMode::OnIssue {
            session.mirror_insert(&inserts);
            return Issued { proof_id: 0, proof };
        }
        // A mirror that caches nothing takes nothing in at the ack either, and a proof
        // with nothing to insert needs no ack: id 0, nothing held (an entry per unacked
        // proof, counted as no name, let a session hold megabytes outside the budget).
        if inserts.is_empty() || session.mirror.policy() == CachePolicy::Off {
            return Issued { proof_id: 0, proof };
        }
        let id = session.next_proof;
        session.next_proof += 1;
        session.hold_pending(id, inserts, budget);
        Issued {
            proof_id: id,
            proof,
        }
    }

    /// `first`, when given, is `name`'s header, already decoded by the caller.
    fn record_proof(
        &self,
        cap: &Capsule,
        name: &RecordName,
        trusted: Option<&VerificationCache>,
        mut first: Option<RecordHeader>,
        room: usize,
    ) -> Result<(RecordProof, Vec<Hash>)> {
        let room = room.min(self.opts.max_proof_bytes);
        let (names, cached) =
            match trusted.and_then(|m| cap.dag.chain_to_trusted(name, |h| m.contains(h))) {
                Some(c) => (c, true),
                None => {
                    // A chain longer than an answer holds is refused before it is walked:
                    // the witness says how long the shortest chain is, and every header
                    // takes some bytes.
                    if let Some(hops) = cap.dag.witness(name).and_then(|w| w.hops()) {
                        let records = hops as usize + 1;
                        if records.saturating_mul(MIN_HEADER_BYTES) > room {
                            let what = format!("a chain of {records} records");
                            return Err(proof_too_long(name, what, room));
                        }
                    }
                    (cap.dag.chain_to_signature(name)?, false)
                }
            };
        let bytes: usize = names
            .iter()
            .map(|n| cap.dag.node(n).map_or(0, |x| x.header.len() + 5))
            .sum();
        if bytes > room {
            let what = format!("{bytes} bytes of headers ({} records)", names.len());
            return Err(proof_too_long(name, what, room));
        }
        let mut chain = Vec::with_capacity(names.len());
        for n in &names {
            chain.push(match first.take() {
                Some(h) if n == name => h,
                _ => Self::mem_header(cap, n)?,
            });
        }
        let anchor = if cached {
            Anchor::Cached
        } else {
            let last = names[names.len() - 1];
            let ws = cap.dag.signature(&last).copied().ok_or_else(|| {
                Error::corrupt(format!(
                    "record {last} is marked signed but has no signature"
                ))
            })?;
            Anchor::Signed(ws)
        };
        Ok((
            RecordProof { chain, anchor },
            names.iter().map(|n| *n.hash()).collect(),
        ))
    }

    /// Prove(name): the shortest chain to a writer signature, or, within a session, to a
    /// record the reader's mirrored cache holds if that is shorter.
    pub fn prove(
        &self,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
    ) -> Result<Issued<RecordProof>> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        self.prove_locked(&cap, capsule, name, session, None, MAX_PROOF_BYTES)
    }

    /// `first`, when given, is `name`'s header, already decoded by the caller.
    fn prove_locked(
        &self,
        cap: &Capsule,
        capsule: &CapsuleName,
        name: &RecordName,
        session: Option<SessionId>,
        first: Option<RecordHeader>,
        room: usize,
    ) -> Result<Issued<RecordProof>> {
        match session {
            None => {
                let (proof, _) = self.record_proof(cap, name, None, first, room)?;
                Ok(Issued { proof_id: 0, proof })
            }
            Some(id) => {
                let s = self.session(id, capsule)?;
                let mut s = s.lock();
                let (proof, inserts) =
                    self.record_proof(cap, name, Some(&s.mirror), first, room)?;
                let issued = Self::issue(&mut s, inserts, proof, self.opts.max_mirrored_names);
                drop(s);
                self.keep_mirrors_in_budget(id);
                Ok(issued)
            }
        }
    }

    fn tree(&self, cap: &mut Capsule, record: &RecordName) -> Result<Arc<MerkleLog>> {
        if let Some(t) = cap.trees.get(record) {
            return Ok(t.clone());
        }
        let list = match cap.dag.node(record).map(|n| n.body) {
            Some(StoredBody::Subrecords { list, .. }) => list,
            _ => {
                return Err(Error::NotFound(format!(
                    "record {record} has no subrecords"
                )));
            }
        };
        let mut t = MerkleLog::new(cap.dag.meta().algo);
        let leaves = self.subrecord_list(&list).inspect_err(|e| {
            if matches!(e, Error::Corrupt(_)) {
                cap.dag.note_body_damaged(record);
            }
        })?;
        for s in leaves {
            t.push(subrecord_leaf(&s));
        }
        let t = Arc::new(t);
        cap.cache_tree(&self.opts, *record, t.clone());
        Ok(t)
    }

    /// Prove(subrecord name): the audit path to the record's root and the record's proof,
    /// or, within a session, a path cut at the first node the reader's cache holds.
    pub fn prove_subrecord(
        &self,
        capsule: &CapsuleName,
        sub: &Hash,
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordProof>> {
        let cap = self.capsule(capsule)?;
        let mut cap = cap.lock();
        let (record, index) = cap
            .subrecord_at(sub)
            .ok_or_else(|| Error::NotFound(format!("subrecord {sub} in capsule {capsule}")))?;
        let tree = self.tree(&mut cap, &record)?;
        let algo = cap.dag.meta().algo;
        let count = tree.size();
        let index = index as u64;
        let leaf = subrecord_leaf(sub);
        let sess = match session {
            Some(id) => Some(self.session(id, capsule)?),
            None => None,
        };
        let mut guard = sess.as_ref().map(|s| s.lock());
        // Within a session, walk up from the leaf only as far as the first node the mirror
        // holds, computing only the siblings the walk reaches: those nodes are what the
        // proof verifies (and the mirror takes in). Without a session nothing is cut and
        // nothing is inserted.
        let mut nodes: Vec<Hash> = Vec::new();
        let (path, cut) = match guard.as_ref() {
            None => (tree.inclusion_proof(index, count)?, false),
            Some(s) => {
                let (used, walk) = tree.walk_inclusion(index, count, &leaf, |d| {
                    let h = Hash::new(algo, *d);
                    nodes.push(h);
                    s.mirror.contains(&h)
                })?;
                (used, matches!(walk, merkle::Walk::Stopped { .. }))
            }
        };
        let (record_proof, mut inserts) = if cut {
            (None, Vec::new())
        } else {
            let (rp, names) = self.record_proof(
                &cap,
                &record,
                guard.as_deref().map(|s| &s.mirror),
                None,
                MAX_PROOF_BYTES,
            )?;
            (Some(rp), names)
        };
        // As the reader notes them: the walk's nodes, the siblings it consumed (bound by
        // where it ended), then the record proof's names.
        let mut node_inserts = nodes;
        if guard.is_some() {
            node_inserts.extend(path.iter().map(|d| Hash::new(algo, *d)));
        }
        node_inserts.append(&mut inserts);
        let proof = SubrecordProof {
            index,
            count,
            path,
            record: record_proof,
        };
        let issued = match guard.as_deref_mut() {
            Some(s) => Self::issue(s, node_inserts, proof, self.opts.max_mirrored_names),
            None => Issued { proof_id: 0, proof },
        };
        drop(guard);
        if let Some(id) = session {
            self.keep_mirrors_in_budget(id);
        }
        Ok(issued)
    }

    /// Prove(many subrecord names) at once: one Merkle multiproof per record they belong
    /// to, each up to the record's subrecord root, then the record's proof (cut, within a
    /// session, at a record the reader's cache holds). The reader then trusts each
    /// record's subrecord root and the record names verified, and the mirror notes the
    /// same, in the same order. All names must be distinct and in the capsule; at most
    /// [`MAX_BATCH_SUBRECORDS`].
    pub fn prove_subrecords(
        &self,
        capsule: &CapsuleName,
        subs: &[Hash],
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordsProof>> {
        if subs.len() > MAX_BATCH_SUBRECORDS {
            return Err(Error::invalid(format!(
                "{} subrecords in one proof request; at most {MAX_BATCH_SUBRECORDS}",
                subs.len()
            )));
        }
        let pos_of = |i: usize| u32::try_from(i).map_err(|_| Error::invalid("too many subrecords"));
        let cap = self.capsule(capsule)?;
        let mut cap = cap.lock();
        // Group the names by record, in the order their records first appear. Names of
        // one record usually come together: the last group is tried first.
        let mut groups: Vec<(RecordName, Vec<(u64, u32)>)> = Vec::new();
        let mut group_of: foldhash::HashMap<RecordName, usize> = Default::default();
        for (pos, sub) in subs.iter().enumerate() {
            let (record, index) = cap
                .subrecord_at(sub)
                .ok_or_else(|| Error::NotFound(format!("subrecord {sub} in capsule {capsule}")))?;
            let g = match groups.last() {
                Some((r, _)) if *r == record => groups.len() - 1,
                _ => *group_of.entry(record).or_insert_with(|| {
                    groups.push((record, Vec::new()));
                    groups.len() - 1
                }),
            };
            groups[g].1.push((index as u64, pos_of(pos)?));
        }
        self.prove_groups(capsule, &mut cap, groups, subs, session)
    }

    /// Prove(the whole of one record's subrecords): one multiproof of every index of
    /// `record`'s subrecord tree, in order (the list [`CapsuleServer::subrecords`]
    /// answers), then the record's proof, as [`CapsuleServer::prove_subrecords`] builds
    /// them: what [`crate::Reader::verify_record_subrecords`] checks. By index, not by
    /// name, so a record that repeats a subrecord, or shares one with an earlier record
    /// (equal plaintext gives an equal name), is proven too: asking by name proved such a
    /// subrecord under the first record holding it, or refused it as named twice. At most
    /// [`MAX_BATCH_SUBRECORDS`] subrecords.
    pub fn prove_record_subrecords(
        &self,
        capsule: &CapsuleName,
        record: &RecordName,
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordsProof>> {
        self.prove_record_subrecords_within(capsule, record, session, &mut |_| Ok(()))
    }

    /// [`CapsuleServer::prove_record_subrecords`], taking the memory of the record's name
    /// list from `reserve` before reading it (and refusing a record of more than
    /// [`MAX_BATCH_SUBRECORDS`] before that).
    pub fn prove_record_subrecords_within(
        &self,
        capsule: &CapsuleName,
        record: &RecordName,
        session: Option<SessionId>,
        reserve: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Issued<SubrecordsProof>> {
        let count = self.record_body(capsule, record)?.subrecords();
        if count > MAX_BATCH_SUBRECORDS as u64 {
            return Err(Error::invalid(format!(
                "record {record} has {count} subrecords; a proof of them all takes at most \
                 {MAX_BATCH_SUBRECORDS}: ask for them by name in parts"
            )));
        }
        let subs = self.subrecords_within(capsule, record, reserve)?;
        let cap = self.capsule(capsule)?;
        let mut cap = cap.lock();
        let leaves = (0..subs.len()).map(|i| (i as u64, i as u32)).collect();
        self.prove_groups(capsule, &mut cap, vec![(*record, leaves)], &subs, session)
    }

    /// The multiproof of `groups` (per record, its (index, position in `subs`) leaves),
    /// issued in `session` when given.
    fn prove_groups(
        &self,
        capsule: &CapsuleName,
        cap: &mut parking_lot::MutexGuard<'_, Capsule>,
        groups: Vec<(RecordName, Vec<(u64, u32)>)>,
        subs: &[Hash],
        session: Option<SessionId>,
    ) -> Result<Issued<SubrecordsProof>> {
        let algo = cap.dag.meta().algo;
        let sess = match session {
            Some(id) => Some(self.session(id, capsule)?),
            None => None,
        };
        let mut guard = sess.as_ref().map(|s| s.lock());
        let mut out = Vec::with_capacity(groups.len());
        let mut inserts = Vec::new();
        let mut indices = Vec::new();
        // Counted as the groups are built, so a request whose records each sit at the end
        // of a long chain stops once the answer is too large, instead of building every
        // chain first (quadratic work and memory in the number of records).
        let mut size = 0usize;
        let too_large = || {
            Error::invalid(format!(
                "a multiproof for these {} subrecords would exceed {} MiB; ask for fewer at a time",
                subs.len(),
                MAX_BATCH_ANSWER_BYTES >> 20
            ))
        };
        for (record, mut leaves) in groups {
            leaves.sort_unstable_by_key(|l| l.0);
            if let Some(w) = leaves.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::invalid(format!(
                    "subrecord {} named twice in one proof request",
                    subs[w[1].1 as usize]
                )));
            }
            let tree = self.tree(cap, &record)?;
            let count = tree.size();
            indices.clear();
            indices.extend(leaves.iter().map(|l| l.0));
            let siblings = tree.multi_proof(&indices, count)?;
            let (rp, mut names) = self.record_proof(
                cap,
                &record,
                guard.as_deref().map(|s| &s.mirror),
                None,
                MAX_BATCH_ANSWER_BYTES,
            )?;
            // Refused before it is issued (the mirror has not moved) when it would not fit.
            size += 32 + 15 * leaves.len() + 32 * siblings.len() + rp.to_bytes().len();
            if size > MAX_BATCH_ANSWER_BYTES {
                return Err(too_large());
            }
            inserts.push(Hash::new(algo, tree.root()));
            inserts.append(&mut names);
            out.push(SubrecordGroup {
                count,
                leaves,
                siblings,
                record: rp,
            });
        }
        let proof = SubrecordsProof { groups: out };
        let issued = match guard.as_deref_mut() {
            Some(s) => Self::issue(s, inserts, proof, self.opts.max_mirrored_names),
            None => Issued { proof_id: 0, proof },
        };
        drop(guard);
        if let Some(id) = session {
            self.keep_mirrors_in_budget(id);
        }
        Ok(issued)
    }

    /// A reader's acknowledgment that it verified proof `proof_id` and cached what it
    /// proved; the server applies the same insertions to its mirror. An ack for a proof
    /// never issued, or already acknowledged (a replay), is refused and changes nothing;
    /// one for id 0 (a proof that needed none) is taken and changes nothing.
    pub fn ack(&self, session: SessionId, proof_id: u64) -> Result<()> {
        let s = self
            .sessions
            .lock()
            .get(&session)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("session {}", session.0)))?;
        // Id 0 names a proof that needed no ack (see `issue`).
        if proof_id == 0 {
            return Ok(());
        }
        let mut s = s.lock();
        let inserts = s.take_pending(proof_id).ok_or_else(|| {
            Error::Rejected(format!(
                "ack for proof {proof_id} refused: never issued to this session or already acknowledged"
            ))
        })?;
        s.mirror_insert(&inserts);
        drop(s);
        self.keep_mirrors_in_budget(session);
        Ok(())
    }

    /// Runs `f` on the capsule's DAG (anti-entropy, tests, stats).
    pub fn with_dag<T>(
        &self,
        capsule: &CapsuleName,
        f: impl FnOnce(&CapsuleDag) -> T,
    ) -> Result<T> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        Ok(f(&cap.dag))
    }
}

/// A record as anti-entropy ships it: header, body or subrecords, and its writer signature
/// if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    /// The header.
    pub header: RecordHeader,
    /// The body.
    pub body: SyncBody,
    /// The writer signature on this record, if any.
    pub signature: Option<WriterSignature>,
}

/// The data of a [`SyncRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncBody {
    /// A plain record's sealed body.
    Plain(Vec<u8>),
    /// A subrecord record's sealed subrecords, in tree order.
    Subrecords(SealedSubrecords),
}

/// Records and how each keeps its body.
type RecordBodies = Vec<(RecordName, StoredBody)>;

/// What [`CapsuleServer::apply_sync`] did with a batch from a peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Records stored.
    pub accepted: usize,
    /// Records already present.
    pub duplicate: usize,
    /// Present records with a damaged body whose body a checked copy replaced (counted
    /// in `duplicate` too).
    pub repaired: usize,
    /// Records refused because they failed a check (body, capsule, subrecords, signature).
    pub corrupt: usize,
    /// Records refused because no writer signature reaches them.
    pub unproven: usize,
}

impl SyncRecord {
    /// Checks everything that needs no other record: capsule, body or subrecord root,
    /// signature, against the capsule `capsule` (whose metadata is `meta`: its name is
    /// passed, not hashed again for every record). Returns the record name and, for a
    /// subrecord record, the subrecord names.
    fn check(
        &self,
        capsule: &CapsuleName,
        meta: &CapsuleMetadata,
    ) -> Result<(RecordName, Vec<Hash>)> {
        if self.header.capsule != *capsule {
            return Err(Error::Rejected("record names another capsule".into()));
        }
        // A header built in memory (not decoded from the wire) may break what the
        // journal's decoder takes back: refused, as the write paths refuse it, so it
        // cannot keep the capsule from loading.
        check_reloadable(&self.header)?;
        let name = self.header.name();
        let mut sub_names = Vec::new();
        match (&self.header.body, &self.body) {
            (BodyRef::Plain { hash, len }, SyncBody::Plain(b)) => {
                if b.len() as u64 != *len || body_hash(meta.algo, b) != *hash {
                    return Err(Error::Rejected(format!(
                        "body of record {name} does not match the hash in its header"
                    )));
                }
            }
            (BodyRef::Subrecords { root, count }, SyncBody::Subrecords(subs)) => {
                // (Not `check_len`: a record committed before that limit travels still.)
                if subs.len() as u64 != *count || subs.len() > MAX_SUBRECORDS {
                    return Err(Error::Rejected("subrecord count does not match".into()));
                }
                let (computed, names) = subrecord_root(meta.algo, subs);
                if computed != *root {
                    return Err(Error::Rejected("subrecords do not hash to the root".into()));
                }
                sub_names = names;
            }
            _ => {
                return Err(Error::Rejected(
                    "body kind does not match the header".into(),
                ));
            }
        }
        if let Some(ws) = &self.signature {
            ws.verify(meta, &name)?;
        }
        Ok((name, sub_names))
    }
}

impl CapsuleServer {
    /// Records that became proven here since the last finished sync with `peer` (records
    /// accepted unsigned come when a signature reaches them: only proven records travel),
    /// and the cursor the next sync starts from if this one finishes.
    pub fn since_last_sync(
        &self,
        capsule: &CapsuleName,
        peer: &PublicKey,
    ) -> Result<(Vec<RecordName>, SyncCursor)> {
        self.since_last_sync_within(capsule, peer, usize::MAX)
    }

    /// [`CapsuleServer::since_last_sync`], at most the first `max` of those records (in
    /// the order they became proven), with the cursor just past them: a session compares
    /// at most `max` names, and the next one goes on from where it stopped. (A replica
    /// that had compared nothing with a peer, with more records than a session holds,
    /// was refused by it for good.)
    pub fn since_last_sync_within(
        &self,
        capsule: &CapsuleName,
        peer: &PublicKey,
        max: usize,
    ) -> Result<(Vec<RecordName>, SyncCursor)> {
        let cap = self.capsule(capsule)?;
        // (After the load, which may drop the capsule's cursors.)
        let cursor = self.sync_cursor(capsule, peer)?;
        let cap = cap.lock();
        let (order, proven) = (cap.dag.order(), cap.dag.proven_order());
        let from = (cursor.pos as usize).min(proven.len());
        let to = from.saturating_add(max).min(proven.len());
        let names = proven[from..to]
            .iter()
            .filter_map(|&i| order.get(i as usize).copied())
            .collect();
        Ok((
            names,
            SyncCursor {
                pos: to as u64,
                load: cap.load,
            },
        ))
    }

    /// How many names [`CapsuleServer::since_last_sync`] would hand a session with `peer`
    /// now, counted without collecting them (a responder refuses or budgets a session
    /// before building it). A record signed after a chain proved it comes twice in the
    /// proven order, so the count (like the names handed out) can exceed the records.
    pub fn sync_backlog(&self, capsule: &CapsuleName, peer: &PublicKey) -> Result<usize> {
        let cap = self.capsule(capsule)?;
        let cursor = self.sync_cursor(capsule, peer)?;
        let proven = cap.lock().dag.proven_order().len();
        Ok(proven.saturating_sub(cursor.pos.min(proven as u64) as usize))
    }

    /// Where the next sync of `capsule` with `peer` starts.
    fn sync_cursor(&self, capsule: &CapsuleName, peer: &PublicKey) -> Result<SyncCursor> {
        let cached = self.cursors.lock().get(&(*capsule, *peer)).cloned();
        Ok(match cached {
            Some(c) => c,
            None if self.stale_cursors.lock().contains(capsule) => SyncCursor::default(),
            None => self.stored_cursor(capsule, peer)?.unwrap_or_default(),
        })
    }

    /// Marks a sync with `peer` finished. The next one starts from `next` (from
    /// [`CapsuleServer::since_last_sync`] when this one started), moved on over the records
    /// proven after it that `peer_has` (the peer sent them, or was sent them, in this
    /// session); any other record proven meanwhile (from a third replica, or signed since)
    /// is compared next time.
    pub fn finish_sync(
        &self,
        capsule: &CapsuleName,
        peer: &PublicKey,
        next: SyncCursor,
        peer_has: &std::collections::HashSet<RecordName>,
    ) -> Result<()> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        // The capsule was loaded again since the session took its position: the position
        // may count in another order (see `SyncCursor::load`), so it is not kept.
        if next.load != 0 && next.load != cap.load {
            return Ok(());
        }
        let (order, proven) = (cap.dag.order(), cap.dag.proven_order());
        // Not over a record signed after a chain proved it: the peer holding the record
        // (it may have sent it, unsigned) does not tell that it holds the signature, and
        // past that entry the signature would never travel.
        let mut p = (next.pos as usize).min(proven.len());
        while p < proven.len()
            && order
                .get(proven[p] as usize)
                .is_some_and(|n| peer_has.contains(n) && !cap.dag.signed_late(n))
        {
            p += 1;
        }
        drop(cap);
        let moved = self
            .cursors
            .lock()
            .put(
                (*capsule, *peer),
                SyncCursor {
                    pos: p as u64,
                    load: 0,
                },
            )
            .is_none_or(|old| old.pos != p as u64);
        if moved && self.keeps_cursor_of(peer) {
            // Kept in the store for the replicas this server is told to sync with (a
            // stranger's key, which costs nothing to make, would add a ref per session),
            // when it moved. The position is in the order records became proven, which a
            // replay of the journal rebuilds the same (test
            // `the_proven_order_is_the_same_after_a_capsule_is_replayed`). Best effort: a
            // session that converged does not fail for it, and a stored cursor left behind
            // only makes the next session after a restart compare more.
            let mut value = vec![SYNC_CURSOR_VERSION];
            value.extend_from_slice(&(p as u64).to_le_bytes());
            let _ = self.store.commit(&[RefUpdate::Set {
                name: cursor_ref_name(capsule, peer),
                value,
            }]);
        }
        Ok(())
    }

    /// Whether `peer`'s sync cursors are kept across restarts: it is listed in
    /// [`ServerOptions::sync_peers`].
    fn keeps_cursor_of(&self, peer: &PublicKey) -> bool {
        self.opts
            .sync_peers
            .as_ref()
            .is_some_and(|peers| peers.contains(peer))
    }

    /// The cursor of `peer` for `capsule` kept in the store, if any. One that does not
    /// parse (a later format) is ignored: the next sync compares everything, which is
    /// slower, never wrong.
    fn stored_cursor(&self, capsule: &CapsuleName, peer: &PublicKey) -> Result<Option<SyncCursor>> {
        if !self.keeps_cursor_of(peer) {
            return Ok(None);
        }
        let Some(v) = self.store.get_ref(&cursor_ref_name(capsule, peer))? else {
            return Ok(None);
        };
        match (
            v.first(),
            v.get(1..).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        ) {
            (Some(&SYNC_CURSOR_VERSION), Some(pos)) => Ok(Some(SyncCursor {
                pos: u64::from_le_bytes(pos),
                load: 0,
            })),
            _ => Ok(None),
        }
    }

    /// Signs the Hello of a session with `responder`: returns its stamp (microseconds since
    /// 1970, or one more than the last this server signed, whichever is higher) and the
    /// signature over [`sync_hello_message`].
    pub fn sign_sync_hello(
        &self,
        capsule: &CapsuleName,
        responder: &PublicKey,
        quick: &Digest,
        count: u64,
    ) -> (u64, Signature) {
        let now = now_micros();
        let mut at = 0;
        let _ = self
            .hello_stamp
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                at = now.max(last.saturating_add(1));
                Some(at)
            });
        let msg = sync_hello_message(capsule, responder, quick, count, at);
        (at, self.key.sign(DOMAIN_SYNC_HELLO, &msg))
    }

    /// Whether unproven records of `cost` bytes would take `dag` past
    /// [`ServerOptions::max_unproven_bytes`], counting `freed` bytes of present records the
    /// same request's signatures prove (they leave the budget).
    fn unproven_bytes_over(&self, dag: &CapsuleDag, cost: u64, freed: u64) -> bool {
        let held = dag.unproven_bytes().saturating_sub(freed);
        cost > 0
            && (held.saturating_add(cost) > self.opts.max_unproven_bytes
                || self.unproven_held_total(freed).saturating_add(cost)
                    > self.opts.max_unproven_bytes_total)
    }

    /// What the unproven records of all capsules hold, with what writes under way were let
    /// in for, less `freed` bytes a request's signatures prove.
    fn unproven_held_total(&self, freed: u64) -> u64 {
        self.unproven_held
            .load(Ordering::Acquire)
            .saturating_add(self.unproven_reserved.load(Ordering::Acquire))
            .saturating_sub(freed)
    }

    /// Takes `cost` bytes of [`ServerOptions::max_unproven_bytes_total`] for a write under
    /// way (checked and taken in one step, so writes to other capsules checked at the same
    /// time cannot all take the same room), counting `freed` bytes its signatures prove.
    /// Hold it until the write's records are in their DAG. Refused as
    /// [`CapsuleServer::check_unproven_bytes`] refuses.
    fn reserve_unproven(&self, cost: u64, freed: u64) -> Result<UnprovenReservation<'_>> {
        let mut reserved = self.unproven_reserved.load(Ordering::Acquire);
        if cost > 0 {
            loop {
                let total = self
                    .unproven_held
                    .load(Ordering::Acquire)
                    .saturating_add(reserved)
                    .saturating_sub(freed);
                if total.saturating_add(cost) > self.opts.max_unproven_bytes_total {
                    return Err(Error::Unavailable(format!(
                        "the records no signature covers across this server's capsules \
                         already hold {total} bytes, and these would add {cost} (limit {}); \
                         sign one first",
                        self.opts.max_unproven_bytes_total
                    )));
                }
                match self.unproven_reserved.compare_exchange_weak(
                    reserved,
                    reserved + cost,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(now) => reserved = now,
                }
            }
        }
        Ok(UnprovenReservation {
            reserved: &self.unproven_reserved,
            bytes: cost,
        })
    }

    /// What the unproven records of all capsules hold now, loaded or unloaded since this
    /// server started (see [`ServerOptions::max_unproven_bytes_total`]).
    pub fn unproven_bytes_held(&self) -> u64 {
        self.unproven_held.load(Ordering::Relaxed)
    }

    /// Refuses (as [`Error::Unavailable`]) what [`CapsuleServer::unproven_bytes_over`]
    /// finds over the budget.
    fn check_unproven_bytes(
        &self,
        capsule: &CapsuleName,
        dag: &CapsuleDag,
        cost: u64,
        freed: u64,
    ) -> Result<()> {
        if !self.unproven_bytes_over(dag, cost, freed) {
            return Ok(());
        }
        let held = dag.unproven_bytes().saturating_sub(freed);
        if held.saturating_add(cost) <= self.opts.max_unproven_bytes {
            return Err(Error::Unavailable(format!(
                "the records no signature covers across this server's capsules already hold \
                 {} bytes, and these would add {cost} (limit {}); sign one first",
                self.unproven_held_total(freed),
                self.opts.max_unproven_bytes_total
            )));
        }
        Err(Error::Unavailable(format!(
            "capsule {capsule}'s records no signature covers already hold {held} bytes, and \
             these would add {cost} (limit {}); sign one first",
            self.opts.max_unproven_bytes
        )))
    }

    /// Signs a message of a remote anti-entropy session ([`crate::sync::sync_msg_message`])
    /// with this server's key.
    pub fn sign_sync_msg(&self, msg: &[u8]) -> Signature {
        self.key.sign(DOMAIN_SYNC_MSG, msg)
    }

    /// Checks a Hello from `peer` without taking it: the peer must be one this server syncs
    /// with ([`ServerOptions::sync_peers`]), and the stamp must lie within
    /// [`SYNC_HELLO_WINDOW_MICROS`] before this server's clock (or
    /// [`SYNC_HELLO_AHEAD_MICROS`] after it) and above the stamp of every Hello this peer
    /// started a session of `capsule` with in that window, so a captured Hello cannot
    /// start another session: [`Error::Rejected`] otherwise. A responder checks this before
    /// a Hello touches the session open under its key.
    pub fn check_sync_hello(&self, capsule: &CapsuleName, peer: &PublicKey, at: u64) -> Result<()> {
        self.check_sync_peer(peer)?;
        check_hello_window(at, now_micros())?;
        self.hello_stamps.lock().check_new(capsule, peer, at)
    }

    fn check_sync_peer(&self, peer: &PublicKey) -> Result<()> {
        match &self.opts.sync_peers {
            Some(peers) if !peers.contains(peer) => Err(Error::Rejected(format!(
                "{peer} is not a replica this server syncs with"
            ))),
            _ => Ok(()),
        }
    }

    /// Takes the stamp of a Hello from `peer` (whose signature was checked), after
    /// [`CapsuleServer::check_sync_hello`]. Stamps are remembered while in the window, at
    /// most [`MAX_HELLO_STAMPS`] (capsule, peer) pairs: with that many remembered, a pair
    /// not among them is refused ([`Error::Unavailable`]) until stamps leave the window,
    /// while remembered pairs go on. (Dropping remembered stamps instead would let their
    /// Hellos be replayed, or, with a floor raised over them, let stamps made up a little
    /// in the future lock every replica out.)
    pub fn accept_sync_hello(
        &self,
        capsule: &CapsuleName,
        peer: &PublicKey,
        at: u64,
    ) -> Result<()> {
        self.check_sync_peer(peer)?;
        let listed = self.keeps_cursor_of(peer);
        let mut stamps = self.hello_stamps.lock();
        // The clock is read under the hold: a thread that read it earlier could otherwise
        // take a stamp at the window's edge that a later one has just forgotten.
        stamps.take(capsule, peer, at, now_micros(), listed)
    }

    /// The present, proven records among `names`, ready to ship to a peer.
    pub fn export(&self, capsule: &CapsuleName, names: &[RecordName]) -> Result<Vec<SyncRecord>> {
        let picked: Vec<(RecordName, StoredBody, Option<WriterSignature>)> = {
            let cap = self.capsule(capsule)?;
            let cap = cap.lock();
            names
                .iter()
                .filter_map(|n| {
                    let node = cap.dag.node(n)?;
                    node.witness.hops()?;
                    Some((*n, node.body, cap.dag.signature(n).copied()))
                })
                .collect()
        };
        let mut out = Vec::with_capacity(picked.len());
        for (name, body, signature) in picked {
            let header = self.header(&name)?;
            let body = match body {
                StoredBody::Plain { .. } => SyncBody::Plain(self.read(capsule, &name)?.body),
                StoredBody::Subrecords { list, .. } => {
                    let mut subs = SealedSubrecords::new();
                    let leaves = self.subrecord_list(&list);
                    for s in self.noting_body_damage(capsule, &name, leaves)? {
                        subs.push(&self.read_subrecord(capsule, &s)?);
                    }
                    SyncBody::Subrecords(subs)
                }
            };
            out.push(SyncRecord {
                header,
                body,
                signature,
            });
        }
        Ok(out)
    }

    /// Stores the body of present record `name` again from `copy`, a copy checked whole
    /// against its header (`sub_names`: its subrecord names, for a subrecord record): the
    /// body chunk, or the subrecord chunks and their list. The store takes a chunk it
    /// holds damaged or lacks and keeps a sound one. Commits nothing.
    fn store_body_again(
        &self,
        cap: &Capsule,
        name: &RecordName,
        copy: &SyncRecord,
        sub_names: &[Hash],
    ) -> Result<()> {
        let stored = cap
            .dag
            .node(name)
            .ok_or_else(|| Error::NotFound(format!("record {name}")))?
            .body;
        match (&copy.body, stored) {
            (SyncBody::Plain(b), StoredBody::Plain { cid }) => {
                self.store.put_hashed(cid, &body_chunk(b))?;
            }
            (SyncBody::Subrecords(subs), StoredBody::Subrecords { list, .. }) => {
                if self.store_subrecords(subs, sub_names)? != list {
                    return Err(Error::corrupt(format!(
                        "record {name}: the copy's subrecord list is not the one journaled"
                    )));
                }
            }
            _ => return Err(body_mismatch(name)),
        }
        Ok(())
    }

    /// Stores what a peer sent, after verifying every record: a record is taken only if it
    /// passes its own checks and a writer signature reaches it through records in this
    /// batch or already here. Everything else is dropped and counted.
    pub fn apply_sync(&self, capsule: &CapsuleName, batch: &[SyncRecord]) -> Result<ApplyReport> {
        let cap = self.capsule(capsule)?;
        let meta = cap.lock().dag.meta().clone();
        let mut report = ApplyReport::default();
        // Each record is checked (body or subrecord hashes, signature) before the capsule
        // is locked: a batch of a frame's worth of records held its readers and writers
        // that long. Copies of one record in a batch are checked at most twice, once with
        // a signature and once without (the first of each kind; none past a passed check
        // that had a signature), and a record the capsule holds only for a signature it
        // lacks there: copies of one record, each with a signature to verify, took the
        // capsule's lock for seconds.
        let names: Vec<RecordName> = batch.iter().map(|r| r.header.name()).collect();
        // (present, signed, present with a damaged body: checked whole, to store anew).
        let held: Vec<(bool, bool, bool)> = {
            let cap = cap.lock();
            names
                .iter()
                .map(|n| {
                    (
                        cap.dag.contains(n),
                        cap.dag.signature(n).is_some(),
                        cap.dag.is_body_damaged(n),
                    )
                })
                .collect()
        };
        let mut verdicts: Vec<Option<Result<Vec<Hash>>>> = Vec::with_capacity(batch.len());
        // Per name: (a copy with a signature was tried, one without was, one with a
        // signature passed).
        let mut tried: HashMap<RecordName, (bool, bool, bool)> = HashMap::new();
        for ((r, name), &(present, signed, repair)) in batch.iter().zip(&names).zip(&held) {
            let with_sig = r.signature.is_some();
            let t = tried.entry(*name).or_default();
            let skip = t.2
                || if with_sig { t.0 } else { t.1 }
                || (present && !repair && (signed || !with_sig));
            if skip {
                verdicts.push(None);
                continue;
            }
            if with_sig {
                t.0 = true;
            } else {
                t.1 = true;
            }
            let verdict = if present && !repair {
                r.signature
                    .as_ref()
                    .map_or(Ok(()), |ws| ws.verify(&meta, name))
                    .map(|()| Vec::new())
            } else {
                r.check(capsule, &meta).map(|(_, sub_names)| sub_names)
            };
            t.2 |= with_sig && verdict.is_ok();
            verdicts.push(Some(verdict));
        }
        let mut cap = cap.lock();
        let mut fresh: HashMap<RecordName, &SyncRecord> = HashMap::new();
        // Checked fresh records in the peer's order, with their subrecord names.
        let mut checked: Vec<(RecordName, &SyncRecord, Vec<Hash>)> = Vec::new();
        let mut new_sigs: Vec<(RecordName, WriterSignature)> = Vec::new();
        let mut late_sigs: HashMap<RecordName, WriterSignature> = HashMap::new();
        let mut repaired: Vec<RecordName> = Vec::new();
        for (((r, &name), verdict), &(_, _, repair)) in
            batch.iter().zip(&names).zip(verdicts).zip(&held)
        {
            let sub_names = match verdict {
                // A copy not checked again: of a record held (as before, a duplicate), or
                // of one earlier in the batch (kept once).
                None => {
                    if cap.dag.contains(&name) {
                        report.duplicate += 1;
                    }
                    continue;
                }
                Some(Err(_)) => {
                    report.corrupt += 1;
                    continue;
                }
                Some(Ok(sub_names)) => sub_names,
            };
            if cap.dag.contains(&name) {
                report.duplicate += 1;
                if let Some(ws) = r.signature
                    && cap.dag.signature(&name).is_none()
                {
                    new_sigs.push((name, ws));
                }
                // A copy checked whole (body, subrecords) of a record whose body is damaged
                // here: its body is stored again, the record keeping its place.
                // (A copy that does not rebuild the journaled list leaves the damage for
                // another peer's copy; the store failing ends the batch.)
                if repair && cap.dag.is_body_damaged(&name) {
                    match self.store_body_again(&cap, &name, r, &sub_names) {
                        Ok(()) => {
                            cap.dag.clear_body_damaged(&name);
                            repaired.push(name);
                        }
                        Err(Error::Corrupt(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            // A record sent twice is kept once, with a signature either copy carried
            // (each copy's was checked above).
            match fresh.entry(name) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(r);
                    checked.push((name, r, sub_names));
                }
                std::collections::hash_map::Entry::Occupied(o) => {
                    if o.get().signature.is_none()
                        && let Some(ws) = r.signature
                    {
                        late_sigs.insert(name, ws);
                    }
                }
            }
        }
        // Which fresh records does a signature reach? Seeds: signed fresh records, fresh
        // records a proven present record points to, and present records signed in this
        // batch; then walk down backpointers through fresh records and through present
        // records that are not proven yet (a batch may complete their chains too).
        let mut proven: HashSet<RecordName> = HashSet::new();
        let mut visited: HashSet<RecordName> = HashSet::new();
        let mut queue: VecDeque<RecordName> = VecDeque::new();
        for (n, r) in &fresh {
            let by_child = cap.dag.has_proven_child(n);
            if r.signature.is_some() || late_sigs.contains_key(n) || by_child {
                proven.insert(*n);
                visited.insert(*n);
                queue.push_back(*n);
            }
        }
        for (n, _) in &new_sigs {
            if visited.insert(*n) {
                queue.push_back(*n);
            }
        }
        while let Some(x) = queue.pop_front() {
            let parents: Vec<RecordName> = match fresh.get(&x) {
                Some(r) => r.header.backpointers.clone(),
                None => cap
                    .dag
                    .node(&x)
                    .map(|n| n.backpointers.to_vec())
                    .unwrap_or_default(),
            };
            for p in parents {
                if fresh.contains_key(&p) {
                    if proven.insert(p) {
                        visited.insert(p);
                        queue.push_back(p);
                    }
                } else if cap.dag.witness(&p) == Some(crate::dag::Witness::Unknown)
                    && visited.insert(p)
                {
                    queue.push_back(p);
                }
            }
        }
        report.unproven = fresh.len() - proven.len();
        let mut entries = Vec::new();
        let mut inserts = Vec::new();
        // What memory takes in once the journal holds the records: verified bodies for the
        // body cache (a hit there means the capsule accepted it) and subrecords by name.
        let mut cached: Vec<(Hash, &[u8])> = Vec::new();
        let mut subrecord_index: Vec<(Hash, RecordName, u32)> = Vec::new();
        // Keep the peer's order for the accepted records (deterministic journal).
        for (name, r, sub_names) in checked {
            if !proven.remove(&name) {
                continue;
            }
            let hb = r.header.encode();
            let body = match (&r.body, r.header.body) {
                (SyncBody::Plain(b), BodyRef::Plain { hash, .. }) => {
                    self.store.put_hashed(hash, &body_chunk(b))?;
                    cached.push((hash, b));
                    StoredBody::Plain { cid: hash }
                }
                (SyncBody::Subrecords(subs), _) => {
                    let list = self.store_subrecords(subs, &sub_names)?;
                    for (i, sn) in sub_names.iter().enumerate() {
                        subrecord_index.push((*sn, name, i as u32));
                    }
                    StoredBody::Subrecords {
                        list,
                        count: subs.len() as u64,
                    }
                }
                // `check` refused mismatched kinds.
                (SyncBody::Plain(_), _) => continue,
            };
            self.store.put_hashed(*name.hash(), &hb)?;
            entries.push(JournalEntry::Record { name, body });
            let sig = r.signature.or_else(|| late_sigs.get(&name).copied());
            if let Some(ws) = sig {
                new_sigs.push((name, ws));
            }
            inserts.push((name, r.header.clone(), body, sig));
        }
        for (name, ws) in &new_sigs {
            entries.push(JournalEntry::Signature {
                name: *name,
                sig: *ws,
            });
        }
        report.repaired = repaired.len();
        if entries.is_empty() {
            // Repaired bodies are made as durable as a commit makes anything.
            if !repaired.is_empty() {
                self.store.commit(&[])?;
            }
            return Ok(report);
        }
        self.append_journal(capsule, &mut cap, &entries)?;
        report.accepted = inserts.len();
        for (hash, b) in cached {
            self.bodies.insert(capsule, hash, false, b);
        }
        for (sn, name, i) in subrecord_index {
            cap.index_subrecord(sn, name, i);
        }
        // A fresh record goes in with its own signature, as a replay of the journal does
        // (signed late otherwise, when a record of the batch proved it first).
        for (name, header, body, sig) in inserts {
            cap.dag.insert_signed(name, &header, body, sig);
        }
        for (name, ws) in new_sigs {
            cap.dag.insert_verified_signature(name, ws);
        }
        Ok(report)
    }

    /// Heads and roots of this server's DAG of `capsule`.
    pub fn heads_roots(&self, capsule: &CapsuleName) -> Result<(Vec<RecordName>, Vec<RecordName>)> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        Ok((cap.dag.heads(), cap.dag.roots()))
    }

    /// Names this server's records point to but that it does not have (its holes).
    pub fn missing(&self, capsule: &CapsuleName) -> Result<Vec<RecordName>> {
        Ok(self.capsule(capsule)?.lock().dag.missing())
    }

    /// Lu's heads/roots walk (DCS §3.4): given a peer's heads and roots, the records this
    /// server should send it: descendants of the peer's stale heads, ancestors of the
    /// peer's roots that are holes, and this server's own heads and roots (with up to
    /// `depth` records beyond them) that the peer does not list, and the records the peer
    /// lists as missing (with up to `depth` of their ancestors). Only proven records.
    ///
    /// Every walk goes at most `depth` records from where it starts, and one call names at
    /// most [`LU_MAX_NAMES`]: the walk up from a stale head went to the end of the
    /// capsule on every message, under its lock (a peer naming the capsule's first record
    /// as its head made each message cost the whole capsule, and an honest bulk transfer
    /// walked the rest of the capsule again each round). What a call leaves out comes in
    /// later rounds, as the peer's heads move on with what it receives (and `depth` grows
    /// with the rounds).
    pub fn lu_patch(
        &self,
        capsule: &CapsuleName,
        peer_heads: &[RecordName],
        peer_roots: &[RecordName],
        peer_missing: &[RecordName],
        depth: usize,
    ) -> Result<Vec<RecordName>> {
        let cap = self.capsule(capsule)?;
        let cap = cap.lock();
        let dag = &cap.dag;
        // What the peer lists is cut as the message would be: a longer list is made up.
        fn cut(l: &[RecordName]) -> &[RecordName] {
            &l[..l.len().min(crate::sync::SHAPE_LIST)]
        }
        let (peer_heads, peer_roots, peer_missing) =
            (cut(peer_heads), cut(peer_roots), cut(peer_missing));
        let known: HashSet<RecordName> = peer_heads.iter().chain(peer_roots).copied().collect();
        let mut out: Vec<RecordName> = Vec::new();
        let mut seen: HashSet<RecordName> = HashSet::new();
        let walk = |start: RecordName,
                    down: bool,
                    limit: usize,
                    out: &mut Vec<RecordName>,
                    seen: &mut HashSet<RecordName>| {
            let mut q = VecDeque::from([(start, 0usize)]);
            while let Some((x, d)) = q.pop_front() {
                if d >= limit || out.len() >= LU_MAX_NAMES {
                    continue;
                }
                let next: Vec<RecordName> = if down {
                    dag.node(&x)
                        .map(|n| n.backpointers.to_vec())
                        .unwrap_or_default()
                } else {
                    dag.proven_children(&x).to_vec()
                };
                // Through proven records only (what is sent): an unproven record's
                // descendants are unproven too, and the ancestors of a proven one proven.
                for y in next {
                    if out.len() >= LU_MAX_NAMES {
                        break;
                    }
                    if dag.is_proven(&y) && !known.contains(&y) && seen.insert(y) {
                        out.push(y);
                        q.push_back((y, d + 1));
                    }
                }
            }
        };
        // Each start walked once: a peer repeating one head (or root) a million times in
        // a message would otherwise have its descendants walked a million times, under the
        // capsule's lock.
        let peer_heads: BTreeSet<RecordName> = peer_heads.iter().copied().collect();
        let peer_roots: BTreeSet<RecordName> = peer_roots.iter().copied().collect();
        for h in &peer_heads {
            // Stale branch: the peer's head has proven descendants here.
            if dag.contains(h) && dag.has_proven_child(h) {
                walk(*h, false, depth, &mut out, &mut seen);
            }
        }
        for r in &peer_roots {
            // Hole: the peer's root has ancestors here.
            if let Some(n) = dag.node(r)
                && n.backpointers.iter().any(|p| dag.contains(p))
            {
                walk(*r, true, depth, &mut out, &mut seen);
            }
        }
        for m in peer_missing {
            // A hole the peer knows it has (beyond Lu: a record with one present and one
            // absent backpointer is no root, so roots alone miss such holes).
            if out.len() < LU_MAX_NAMES && dag.is_proven(m) && seen.insert(*m) {
                out.push(*m);
                walk(*m, true, depth, &mut out, &mut seen);
            }
        }
        // From this side's proven heads and roots: a walk down from an unsigned head
        // (anyone may write one, pointing anywhere) sent its proven ancestors, which the
        // peer holds, in every session.
        for h in dag.proven_heads() {
            if out.len() < LU_MAX_NAMES && !known.contains(&h) && seen.insert(h) {
                out.push(h);
                walk(h, true, depth, &mut out, &mut seen);
            }
        }
        for r in dag.roots() {
            if out.len() < LU_MAX_NAMES
                && dag.is_proven(&r)
                && !known.contains(&r)
                && seen.insert(r)
            {
                out.push(r);
                walk(r, false, depth, &mut out, &mut seen);
            }
        }
        out.retain(|n| dag.is_proven(n));
        Ok(out)
    }
}

/// Most names one [`CapsuleServer::lu_patch`] call hands out (a name page's worth).
pub const LU_MAX_NAMES: usize = 1 << 18;

/// The error for a stored body that does not match its record's header.
fn body_mismatch(name: &RecordName) -> Error {
    Error::corrupt(format!(
        "stored body of record {name} does not match its header"
    ))
}

/// Which of the batch's fresh records (`batch[j]` is `records[fresh[j]]`'s name) are
/// proven as they arrive: a signed one, one a present proven record points to, and every
/// fresh record those reach through backpointers within the batch.
fn proven_in_batch(
    batch: &[RecordName],
    fresh: &[usize],
    records: &[Record],
    signatures: &[(RecordName, WriterSignature)],
    has_proven_child: impl Fn(&RecordName) -> bool,
) -> Vec<bool> {
    // Most batches: one record.
    if let [one] = batch {
        return vec![signatures.iter().any(|(n, _)| n == one) || has_proven_child(one)];
    }
    if signatures.is_empty() && !batch.iter().any(&has_proven_child) {
        return vec![false; batch.len()];
    }
    let at: HashMap<&RecordName, usize> = batch.iter().enumerate().map(|(j, n)| (n, j)).collect();
    let mut proven = vec![false; batch.len()];
    // Starting points: signed records of the batch, and records a present proven record
    // already points to (a hole being filled is proven as it arrives).
    let mut stack: Vec<usize> = signatures
        .iter()
        .filter_map(|(n, _)| at.get(n).copied())
        .chain((0..batch.len()).filter(|&j| has_proven_child(&batch[j])))
        .collect();
    while let Some(j) = stack.pop() {
        if std::mem::replace(&mut proven[j], true) {
            continue;
        }
        for b in &records[fresh[j]].header.backpointers {
            if let Some(&k) = at.get(b)
                && !proven[k]
            {
                stack.push(k);
            }
        }
    }
    proven
}

/// Refuses a Hello stamped `at` more than [`SYNC_HELLO_WINDOW_MICROS`] from `now`.
fn check_hello_window(at: u64, now: u64) -> Result<()> {
    if at > now.saturating_add(SYNC_HELLO_AHEAD_MICROS) {
        return Err(Error::Rejected(format!(
            "the Hello's stamp is {} s ahead of this server's clock (at most {} s): check \
             both servers' clocks",
            (at - now) / 1_000_000,
            SYNC_HELLO_AHEAD_MICROS / 1_000_000
        )));
    }
    if at.abs_diff(now) > SYNC_HELLO_WINDOW_MICROS {
        return Err(Error::Rejected(format!(
            "the Hello's stamp is {} s from this server's clock (at most {} s): check both \
             servers' clocks",
            at.abs_diff(now) / 1_000_000,
            SYNC_HELLO_WINDOW_MICROS / 1_000_000
        )));
    }
    Ok(())
}

/// A random number other than 0 naming a session (a reader session, an anti-entropy
/// session): whoever names a session acts in it, so it must not be guessable.
pub(crate) fn random_session_number() -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b)
            .map_err(|e| Error::Unavailable(format!("no randomness for a session: {e}")))?;
        let n = u64::from_le_bytes(b);
        if n != 0 {
            return Ok(n);
        }
    }
}
/// Refuses a header that a reload would not decode: one built in this process skips the
/// decoder's checks ([`RecordHeader::check_well_formed`]: at most
/// [`crate::record::MAX_BACKPOINTERS`] distinct backpointers, hashes in the capsule's
/// algorithm, a bounded body), and once journaled it would keep the whole capsule from
/// loading.
fn check_reloadable(header: &RecordHeader) -> Result<()> {
    header
        .check_well_formed()
        .map_err(|e| Error::invalid(format!("record header refused: {e}")))
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Writer;
    use cairn_core::HashAlgo;
    use cairn_store::MemoryStore;

    /// A full table of Hello stamps drops nothing still in the window: a pair not in it is
    /// refused as busy (not taken, and not forgotten later to be replayed), pairs in it go
    /// on, a listed replica is taken anyway, stamps far ahead of the clock are refused, and
    /// stamps that leave the window make room. Before, the oldest eighth was dropped and a
    /// floor raised over it, so a table filled with stamps made up 299 s ahead locked every
    /// replica out.
    #[test]
    fn a_full_hello_table_refuses_new_pairs_and_keeps_the_ones_it_holds() {
        let mut st = HelloStamps::default();
        let peer = SigningKey::from_seed(&[3; 32]).public();
        let name = |i: u64| CapsuleName(HashAlgo::Blake3.digest(&i.to_le_bytes()));
        let now = 10_000_000_000_000u64;
        // An honest replica's pair, then a flood of pairs, some stamped ahead of the clock.
        st.take(&name(u64::MAX), &peer, now, now, false).unwrap();
        let e = st
            .take(
                &name(0),
                &peer,
                now + SYNC_HELLO_AHEAD_MICROS + 1,
                now,
                false,
            )
            .unwrap_err();
        assert!(e.to_string().contains("ahead"), "{e}");
        // Most of the table leaves the window 4 s from now.
        let soon = now - SYNC_HELLO_WINDOW_MICROS + 4_000_000;
        for i in 0..MAX_HELLO_STAMPS as u64 - 1 {
            let at = if i < 1000 { now + 50_000_000 } else { soon };
            st.take(&name(i), &peer, at, now, false).unwrap();
        }
        let full = MAX_HELLO_STAMPS as u64;
        let e = st
            .take(&name(full), &peer, now + 1, now + 1, false)
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        // A listed replica is taken all the same.
        st.take(&name(full + 1), &peer, now + 1, now + 1, true)
            .unwrap();
        // The honest replica's pair goes on, and its old Hello is still a replay.
        st.take(&name(u64::MAX), &peer, now + 2, now + 2, false)
            .unwrap();
        let e = st
            .take(&name(u64::MAX), &peer, now, now + 3, false)
            .unwrap_err();
        assert!(e.to_string().contains("replayed"), "{e}");
        // Once stamps leave the window, new pairs are taken again.
        let later = now + 4_000_001;
        st.take(&name(full), &peer, later, later, false).unwrap();
        assert!(st.map.len() < MAX_HELLO_STAMPS / 2, "{}", st.map.len());
        // With known replicas set, another key is refused before anything is kept.
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let strict = CapsuleServer::new(
            store,
            SigningKey::from_seed(&[5; 32]),
            ServerOptions {
                sync_peers: Some(vec![peer]),
                ..ServerOptions::default()
            },
        );
        let stranger = SigningKey::from_seed(&[4; 32]).public();
        let e = strict
            .accept_sync_hello(&name(1), &stranger, now_micros())
            .unwrap_err();
        assert!(e.to_string().contains("not a replica"), "{e}");
        strict
            .accept_sync_hello(&name(1), &peer, now_micros())
            .unwrap();
    }

    /// Acks signed on the signer's thread while the write commits are the same acks: each
    /// verifies and names the log size the capsule has after the write, from one writer
    /// and from several at once (when the signer is busy, writers sign their own), for
    /// new records, records already present and signatures alone.
    #[test]
    fn acks_signed_during_the_commit_verify_and_name_the_log_size() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let server = Arc::new(CapsuleServer::new(
            store,
            SigningKey::from_seed(&[5; 32]),
            ServerOptions::default(),
        ));
        let mut metas = Vec::new();
        for t in 0..4u8 {
            let wk = SigningKey::from_seed(&[10 + t; 32]);
            let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "acks");
            meta.cipher = crate::metadata::BodyCipher::Plaintext;
            server.create(&meta).unwrap();
            metas.push((meta, wk));
        }
        let key = server.public_key();
        std::thread::scope(|scope| {
            for (meta, wk) in metas {
                let server = server.clone();
                scope.spawn(move || {
                    let c = meta.name();
                    let mut w = Writer::new(meta, wk, None).unwrap();
                    for i in 0..50u32 {
                        let r = w.record(&i.to_le_bytes(), &[]).unwrap();
                        let name = r.name();
                        let sig = (name, w.sign(&name));
                        let sigs = if i % 3 == 0 { vec![sig] } else { vec![] };
                        let ack = server.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
                        ack.verify(&key, &c, &AckKind::for_write(vec![name], &sigs))
                            .unwrap();
                        // The ack names the signature it carried: an ack for the records
                        // alone does not pass for it.
                        if i % 3 == 0 {
                            assert!(ack.verify(&key, &c, &AckKind::Wrote(vec![name])).is_err());
                        }
                        let size = server.with_dag(&c, |d| d.log().size()).unwrap();
                        assert_eq!(ack.log_size, size);
                        assert_eq!(size, u64::from(i) + 1);
                        // Again: nothing new to commit, the same size.
                        let again = server.write(&c, std::slice::from_ref(&r), &[]).unwrap();
                        again.verify(&key, &c, &AckKind::Wrote(vec![name])).unwrap();
                        assert_eq!(again.log_size, size);
                        // A signature alone.
                        if i % 3 == 1 {
                            let ack = server.write(&c, &[], &[sig]).unwrap();
                            ack.verify(&key, &c, &AckKind::wrote(vec![], vec![name]))
                                .unwrap();
                            assert_eq!(ack.log_size, size);
                        }
                    }
                });
            }
        });
    }

    /// The tree cache keeps within its leaf budget (least recently used trees go first, a
    /// tree over the budget is not kept), and proofs verify whether or not their tree was
    /// Writes under way hold their share of the server-wide unproven budget from their
    /// check until their records count in their DAG: a write checked meanwhile (to
    /// another capsule, which runs at once) sees that share taken. Before, each checked
    /// against what the DAGs held alone, so writes to many capsules at once, each past
    /// its check and waiting for its journal's sync, went past the total together.
    #[test]
    fn writes_under_way_hold_their_share_of_the_unproven_total() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let opts = ServerOptions {
            max_unproven_bytes_total: 64 << 10,
            ..ServerOptions::default()
        };
        let server = CapsuleServer::new(store, SigningKey::from_seed(&[3; 32]), opts);
        let wk = SigningKey::from_seed(&[4; 32]);
        let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "junk");
        meta.cipher = crate::metadata::BodyCipher::Plaintext;
        let c = meta.name();
        server.create(&meta).unwrap();
        let junk = |i: u32| Record::new(c, format!("junk {i}").into_bytes(), vec![]);
        // Another write under way holds all but a few bytes of the total.
        let held = server.reserve_unproven((64 << 10) - 10, 0).unwrap();
        let e = server.write(&c, &[junk(0)], &[]).unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        assert!(
            e.to_string().contains("across this server's capsules"),
            "{e}"
        );
        // Nor can another reservation take the same room.
        assert!(server.reserve_unproven(100, 0).is_err());
        // Once it is done (dropped), the room is back, and a finished write gives its
        // reservation back too: only what the DAG holds stays counted.
        drop(held);
        server.write(&c, &[junk(0)], &[]).unwrap();
        assert_eq!(server.unproven_reserved.load(Ordering::Acquire), 0);
        assert!(server.unproven_bytes_held() > 0);
        assert_eq!(server.unproven_held_total(0), server.unproven_bytes_held());
    }

    /// kept.
    #[test]
    fn the_tree_cache_keeps_within_its_leaf_budget() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let opts = ServerOptions {
            tree_cache_leaves: 100,
            ..ServerOptions::default()
        };
        let server = CapsuleServer::new(store, SigningKey::from_seed(&[3; 32]), opts);
        let wk = SigningKey::from_seed(&[4; 32]);
        let mut meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "trees");
        meta.cipher = crate::metadata::BodyCipher::Plaintext;
        let c = meta.name();
        server.create(&meta).unwrap();
        let mut w = Writer::new(meta.clone(), wk, None).unwrap();
        let mut all = Vec::new();
        for n in [60, 30, 50, 150, 20] {
            let subs: Vec<Hash> = (0..n)
                .map(|i| w.write_subrecord(format!("{n} {i}").as_bytes()).unwrap())
                .collect();
            let (header, sealed, sig) = w.commit_subrecords(&[]).unwrap();
            server
                .commit_subrecords(&c, &header, &sealed, Some(sig))
                .unwrap();
            let cap = server.capsule(&c).unwrap();
            let cap = cap.lock();
            let held: usize = cap.trees.iter().map(|(_, t)| t.size() as usize).sum();
            assert_eq!(held, cap.tree_leaves);
            assert!(cap.tree_leaves <= 100, "{} leaves kept", cap.tree_leaves);
            assert!(cap.trees.iter().all(|(_, t)| t.size() != 150));
            all.push(subs);
        }
        let mut reader = crate::client::Reader::new(c, meta, CachePolicy::Off, None).unwrap();
        for subs in &all {
            let p = server.prove_subrecords(&c, subs, None).unwrap().proof;
            reader.verify_subrecords(subs, &p).unwrap();
            let one = server
                .prove_subrecord(&c, &subs[subs.len() / 2], None)
                .unwrap();
            reader
                .verify_subrecord(&subs[subs.len() / 2], &one.proof)
                .unwrap();
        }
        let cap = server.capsule(&c).unwrap();
        assert!(cap.lock().tree_leaves <= 100);
    }
}
