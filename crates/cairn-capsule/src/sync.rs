//! Anti-entropy between two replicas of a capsule (DCS §3.4), as a sans-IO session: each
//! side is a [`SyncSession`] fed the peer's [`SyncMsg`]s; it answers with the next message
//! to send and never touches a network, so it runs unchanged over TCP, HTTP or the
//! deterministic simulator.
//!
//! Three stages, as DCS runs them, with the Bloom filter replaced by a complete method:
//!
//! 1. **Quick check.** Each side hashes the sorted names of the records that became proven
//!    on it since its last finished sync with this peer (with its heads and holes). Equal
//!    hashes: nothing to do.
//! 2. **Set reconciliation** of those two sets with a rateless IBLT ([`crate::riblt`]): the
//!    responder streams coded symbols, the initiator peels the difference (asking for more
//!    symbols while it cannot) and learns exactly what each side lacks, in about one round
//!    trip for small differences. Past twice its own set in symbols (plus 64), either side
//!    turns to the responder's full name list instead (the initiator asks for it; the
//!    responder sends it in place of more symbols, whatever size the initiator claimed),
//!    so the stage is always complete and its cost bounded by the sets' sizes. Name lists travel in pages ([`NAME_PAGE`]): the responder's list
//!    page by page on request, the initiator's wanted names one page per message, so no
//!    message outgrows a frame however large the sets.
//! 3. **Lu's heads/roots walk** for anything outside those sets (holes, stale and missing
//!    branches left by earlier failures): the sides exchange heads and roots and send what
//!    the other's DAG shape shows it lacks, round after round, until a round moves nothing.
//!
//! Every record received is verified by [`CapsuleServer::apply_sync`] before it is stored;
//! a faulty peer's corrupt or unprovable records are dropped and counted in the
//! [`SyncReport`].

use cairn_core::{Error, HashAlgo, PublicKey, Result, Signature};

use crate::merkle::Digest;
use crate::metadata::CapsuleName;
use crate::record::RecordName;
use crate::riblt::{self, CodedSymbol};
use crate::server::{CapsuleServer, SyncRecord};

/// Most Lu rounds that move nothing before a session gives up. A round in which this side
/// stored a new record, or still has a backlog held back by the message budget, does not
/// count: records are finite (each is stored once and sent at most once per session), so
/// such rounds end too.
pub const MAX_ROUNDS: usize = 64;

/// Most rounds one session runs, whatever they move: a round that sends new records is
/// progress (each goes once), but a peer could make each send one while it walks up to
/// [`crate::server::LU_MAX_NAMES`] names. At a full message budget (16 MiB a round) this
/// is 64 GiB one way; past it the session ends unavailable, and the next one goes on from
/// what this one stored (the last message's records included).
pub const MAX_SESSION_ROUNDS: usize = 4096;
/// Default budget of record bytes per message (see [`SyncState::set_budget`]): far below
/// the wire protocol's frame limit, so every message fits in a frame.
pub const SYNC_BUDGET: usize = 16 << 20;
/// Coded symbols in the first batch.
const FIRST_BATCH: usize = 32;
/// Most coded symbols in one batch (about 25 MiB encoded).
const MAX_SYMBOL_BATCH: usize = 1 << 19;
/// Default most names in one page of a name list ([`SyncMsg::Names`], or the wanted names
/// of an [`SyncMsg::Exchange`] or [`SyncMsg::Patch`]): 8.5 MiB of names, so a message
/// with a page, its shape lists and a full record budget stays within the wire's frame.
pub const NAME_PAGE: usize = 1 << 18;
/// Most names of each of the heads, roots and holes lists a message carries: past it, the
/// proven ones first (those are what a session moves), the rest left out. Anyone may write
/// unsigned records, and a million of them as heads and roots would otherwise make every
/// message of the capsule's sessions larger than a frame.
pub const SHAPE_LIST: usize = 1 << 18;
/// Bytes of one record name on the wire.
const NAME_BYTES: usize = 34;
/// Names each shape list keeps however large the records beside it: a largest body, its
/// header (1024 backpointers at most) and three such lists still fit in a frame.
const MIN_SHAPE_LIST: usize = 1024;
const _: () = assert!(
    crate::record::MAX_BODY_LEN + 200 + 1024 * NAME_BYTES + 3 * MIN_SHAPE_LIST * NAME_BYTES + 1024
        <= crate::wire::MAX_FRAME
);
// A page of names, the three shape lists (34 bytes a name encoded) and a message's records
// fit in a frame together.
const _: () =
    assert!((NAME_PAGE + 3 * SHAPE_LIST) * 34 + SYNC_BUDGET + (1 << 20) <= crate::wire::MAX_FRAME);

/// A message between two syncing replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncMsg {
    /// Initiator → responder: the quick-check hash and size of the initiator's set, signed
    /// by the initiator's server key, so no one can start (and end) a session in another
    /// replica's name and move its sync cursor.
    Hello {
        /// The capsule.
        capsule: CapsuleName,
        /// Hash over the sorted names of the initiator's since-last-sync set.
        quick: Digest,
        /// Size of that set.
        count: u64,
        /// The initiator's stamp, higher than any it used before with this responder.
        at: u64,
        /// The initiator's signature over [`crate::server::sync_hello_message`].
        sig: Signature,
    },
    /// Responder → initiator: the quick check matched; nothing to do.
    InSync,
    /// Responder → initiator: the next coded symbols of the responder's set.
    Symbols(Vec<CodedSymbol>),
    /// Initiator → responder: send more symbols.
    More,
    /// Initiator → responder: decoding gave up; send your since-set, sorted, from
    /// position `from` (0 first, then the count received so far).
    SendNames {
        /// Position in the responder's sorted since-set of the first name wanted.
        from: u64,
    },
    /// Responder → initiator: one page of the responder's sorted since-set (fallback).
    Names {
        /// The page.
        names: Vec<RecordName>,
        /// More pages follow (the initiator asks for them with [`SyncMsg::SendNames`]).
        more: bool,
    },
    /// Initiator → responder: records the responder lacks, names the initiator lacks, and
    /// the initiator's heads and roots.
    Exchange {
        /// Records for the responder.
        records: Vec<SyncRecord>,
        /// Names the initiator wants (the first page; the rest travel in its Patches).
        want: Vec<RecordName>,
        /// The initiator's heads.
        heads: Vec<RecordName>,
        /// The initiator's roots.
        roots: Vec<RecordName>,
        /// Names the initiator's records point to but it lacks.
        missing: Vec<RecordName>,
    },
    /// Either way, during Lu's walk: records for the receiver, and the sender's heads and
    /// roots.
    Patch {
        /// Records for the receiver.
        records: Vec<SyncRecord>,
        /// Initiator only: the next page of names it wants from the responder's set.
        want: Vec<RecordName>,
        /// The sender's heads.
        heads: Vec<RecordName>,
        /// The sender's roots.
        roots: Vec<RecordName>,
        /// Names the sender's records point to but it lacks.
        missing: Vec<RecordName>,
    },
    /// The session is over; both sides agree.
    Done,
}

/// What a session did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The quick check matched.
    pub quick_match: bool,
    /// Coded symbols exchanged.
    pub symbols: usize,
    /// Whether the full-name fallback ran.
    pub fallback: bool,
    /// Lu rounds run.
    pub rounds: usize,
    /// Records sent.
    pub sent: usize,
    /// Records received and stored.
    pub accepted: usize,
    /// Records received that were already here.
    pub duplicate: usize,
    /// Records held here with a damaged body whose body a checked copy from the peer
    /// replaced (counted in `duplicate` too).
    pub repaired: usize,
    /// Records received that failed verification.
    pub corrupt: usize,
    /// Records received that no signature reaches.
    pub unproven: usize,
    /// Records of this side's that were to be sent but could not be read (a chunk missing
    /// or failing its hash here): left out, and the sync cursor not moved.
    pub unreadable: usize,
}

/// One side of an anti-entropy session, borrowing its server.
pub struct SyncSession<'a> {
    server: &'a CapsuleServer,
    state: SyncState,
}

impl<'a> SyncSession<'a> {
    /// A session of `server` with the replica whose server key is `peer`.
    pub fn new(server: &'a CapsuleServer, capsule: CapsuleName, peer: PublicKey) -> Result<Self> {
        Ok(SyncSession {
            server,
            state: SyncState::new(server, capsule, peer)?,
        })
    }

    /// What the session has done so far.
    pub fn report(&self) -> SyncReport {
        self.state.report()
    }

    /// Names of records this session noted as sent or held by the peer (see
    /// [`SyncState::noted`]).
    pub fn noted(&self) -> usize {
        self.state.noted()
    }

    /// Whether the session is over.
    pub fn is_finished(&self) -> bool {
        self.state.is_finished()
    }

    /// The initiator's first message.
    pub fn start(&mut self) -> Result<SyncMsg> {
        self.state.start(self.server)
    }

    /// Sets the most names in a page of a name list this side sends (see
    /// [`SyncState::set_name_page`]).
    pub fn set_name_page(&mut self, names: usize) {
        self.state.set_name_page(names);
    }

    /// Sets the most names of each shape list this side sends (see
    /// [`SyncState::set_shape_list`]).
    pub fn set_shape_list(&mut self, names: usize) {
        self.state.set_shape_list(names);
    }

    /// Sets the budget of record bytes per message (see [`SyncState::set_budget`]).
    pub fn set_budget(&mut self, bytes: usize) {
        self.state.set_budget(bytes);
    }

    /// Feeds one message from the peer; returns the message to send back, or `None` when
    /// the session is over.
    pub fn handle(&mut self, msg: SyncMsg) -> Result<Option<SyncMsg>> {
        self.state.handle(self.server, msg)
    }
}

/// The state of one side of an anti-entropy session, without a borrow of its server (so
/// a network endpoint can keep it between messages); every step takes the server.
/// [`SyncSession`] is the same thing bound to one server.
pub struct SyncState {
    capsule: CapsuleName,
    peer: PublicKey,
    since: Vec<RecordName>,
    encoder: Option<riblt::Encoder>,
    received: Vec<CodedSymbol>,
    peer_count: u64,
    sent_names: std::collections::HashSet<RecordName>,
    /// This side's records that could not be read to send (not tried again this session).
    unreadable: std::collections::HashSet<RecordName>,
    /// Records chosen for sending but held back by the message budget, by witness hops
    /// on this side (signed records first), so every record travels after the records
    /// its proof runs through and the receiver can take it on arrival.
    backlog: std::collections::BTreeSet<(u32, RecordName)>,
    budget: usize,
    /// Rounds that moved nothing, counted against [`MAX_ROUNDS`].
    limited_rounds: usize,
    report: SyncReport,
    finished: bool,
    /// Which side this is, once known: the initiator sent Hello ([`SyncState::start`]),
    /// the responder received it. Each takes only the messages its side expects.
    role: Option<Role>,
    /// Initiator: coded symbols are still wanted (from Hello until they decode or the
    /// session falls back to full name lists).
    want_symbols: bool,
    /// Where the next session with this peer starts if this one finishes cleanly
    /// ([`CapsuleServer::since_last_sync`]).
    next_cursor: crate::server::SyncCursor,
    /// Exchange was sent (initiator) or received (responder): Patch rounds may follow,
    /// and no earlier step may come again.
    exchanged: bool,
    /// Initiator: asked for a page of the name list (SendNames) and not yet answered.
    names_asked: bool,
    /// Initiator: the pages of the responder's name list received so far.
    names_in: Vec<RecordName>,
    /// Responder: the position of the next page of its name list it sends, once asked.
    names_from: Option<usize>,
    /// Initiator: wanted names not yet sent (they go a page per message).
    want_rest: std::collections::VecDeque<RecordName>,
    /// Most names in a page this side sends.
    name_page: usize,
    /// Most names of each shape list this side sends.
    shape_list: usize,
}

/// The side of an anti-entropy session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Initiator,
    Responder,
}

/// The quick check: a hash over the sorted names received since the last sync, over the
/// current proven heads (so a replica that fell behind in an earlier, failed session, or
/// holds unsigned a record the other holds proven, is never taken for one in sync) and over
/// the holes proven records point at (names they point to that it lacks: two replicas that
/// agree on heads and recent records but not on what they miss are not in sync). `heads`
/// and `holes` come sorted.
fn quick_hash(
    algo: HashAlgo,
    names: &[RecordName],
    heads: &[RecordName],
    holes: &[RecordName],
) -> Digest {
    let mut sorted: Vec<&RecordName> = names.iter().collect();
    sorted.sort();
    let mut h = algo.hasher();
    h.update(b"cairn/capsule/quick-check/v2");
    for list in [sorted, heads.iter().collect(), holes.iter().collect()] {
        h.update(&(list.len() as u64).to_le_bytes());
        for n in list {
            h.update(&n.hash().to_bytes());
        }
    }
    *h.finalize().digest()
}

/// Checks that a Hello is signed by `peer` for `server` (the responder).
fn verify_hello(
    capsule: &CapsuleName,
    quick: &Digest,
    count: u64,
    at: u64,
    sig: &Signature,
    peer: &PublicKey,
    server: &CapsuleServer,
) -> Result<()> {
    let msg = crate::server::sync_hello_message(capsule, &server.public_key(), quick, count, at);
    peer.verify(crate::server::DOMAIN_SYNC_HELLO, &msg, sig)
        .map_err(|_| {
            Error::Rejected(format!(
                "the Hello is not signed by {peer} for this server: a session is started \
                 only by the replica whose key it names"
            ))
        })
}

/// What one side of a remote anti-entropy session signs for its `seq`-th message (0 the
/// Hello, or the answer to it): the capsule, both servers' keys, the session number, the
/// responder's nonce for the session (0 in the Hello, which is signed before the initiator
/// learns it), which side sent it, its place in that side's order and a hash of the
/// message (`None`: the responder's empty answer to a Done).
#[allow(clippy::too_many_arguments)]
pub fn sync_msg_message(
    capsule: &CapsuleName,
    initiator: &PublicKey,
    responder: &PublicKey,
    session: u64,
    nonce: u64,
    from_responder: bool,
    seq: u64,
    msg: Option<&SyncMsg>,
) -> Vec<u8> {
    let digest = match msg {
        Some(m) => *HashAlgo::Blake3.digest(&m.to_bytes()).digest(),
        None => [0; 32],
    };
    let mut e = cairn_core::Encoder::new();
    e.bytes(&capsule.hash().to_bytes())
        .raw(initiator.raw())
        .raw(responder.raw())
        .u64_le(session)
        .u64_le(nonce)
        .u8(u8::from(from_responder))
        .u64_le(seq)
        .u8(u8::from(msg.is_some()))
        .raw(&digest);
    e.finish()
}

/// The signatures of one remote anti-entropy session, sans-IO: each side signs every
/// message it sends with its server key ([`crate::server::DOMAIN_SYNC_MSG`] over
/// [`sync_msg_message`]) and checks every message it receives, numbered in each side's
/// order. Every message after the Hello also covers a nonce the responder picks for the
/// session and sends with its answers. Anyone on the path sees the session number (it only
/// names the session), but cannot forge, replay, reorder or move a message into another
/// session, nor replay an initiator's messages into a new session (after a responder
/// restart, say): without this, an observer could end a session early, which moves a
/// replica's sync cursor.
#[derive(Clone, Debug)]
pub struct SessionSeal {
    capsule: CapsuleName,
    initiator: PublicKey,
    responder: PublicKey,
    session: u64,
    /// The responder's nonce: the responder's own from the start, the initiator's once it
    /// has the first answer.
    nonce: Option<u64>,
    role: Role,
    sent: u64,
    received: u64,
}

impl SessionSeal {
    /// The initiator's seal of session `session` of `capsule` between `me` and `responder`.
    pub fn initiator(
        capsule: CapsuleName,
        me: PublicKey,
        responder: PublicKey,
        session: u64,
    ) -> Self {
        Self::new(capsule, me, responder, session, None, Role::Initiator)
    }

    /// The responder's seal of session `session` of `capsule` between `initiator` and `me`,
    /// with the `nonce` it picked for the session (random: it is what keeps the
    /// initiator's messages from being replayed into another session).
    pub fn responder(
        capsule: CapsuleName,
        initiator: PublicKey,
        me: PublicKey,
        session: u64,
        nonce: u64,
    ) -> Self {
        Self::new(
            capsule,
            initiator,
            me,
            session,
            Some(nonce),
            Role::Responder,
        )
    }

    fn new(
        capsule: CapsuleName,
        initiator: PublicKey,
        responder: PublicKey,
        session: u64,
        nonce: Option<u64>,
        role: Role,
    ) -> Self {
        SessionSeal {
            capsule,
            initiator,
            responder,
            session,
            nonce,
            role,
            sent: 0,
            received: 0,
        }
    }

    /// The session number.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The responder's nonce for the session, once known (the responder sends it with
    /// every answer).
    pub fn nonce(&self) -> Option<u64> {
        self.nonce
    }

    /// Initiator: takes the nonce an answer came with. The first answer's is the session's;
    /// a later answer naming another is [`Error::Rejected`].
    pub fn take_nonce(&mut self, nonce: u64) -> Result<()> {
        match self.nonce {
            None if self.role == Role::Initiator => {
                self.nonce = Some(nonce);
                Ok(())
            }
            Some(n) if n == nonce => Ok(()),
            _ => Err(Error::Rejected(format!(
                "anti-entropy session {} changed its nonce",
                self.session
            ))),
        }
    }

    /// The nonce message `seq` of the initiator (`from_responder` false) or of the
    /// responder covers: 0 in the Hello, the responder's after it.
    fn nonce_of(&self, from_responder: bool, seq: u64) -> Result<u64> {
        if !from_responder && seq == 0 {
            return Ok(0);
        }
        self.nonce.ok_or_else(|| {
            Error::invalid(format!(
                "anti-entropy session {}: no nonce from the responder yet",
                self.session
            ))
        })
    }

    /// What message `seq` of the side `from_responder` names is signed as.
    fn message(&self, from_responder: bool, seq: u64, msg: Option<&SyncMsg>) -> Result<Vec<u8>> {
        Ok(sync_msg_message(
            &self.capsule,
            &self.initiator,
            &self.responder,
            self.session,
            self.nonce_of(from_responder, seq)?,
            from_responder,
            seq,
            msg,
        ))
    }

    /// Signs the next message this side sends, with `server`'s key (which must be this
    /// side's key).
    pub fn seal(&mut self, server: &CapsuleServer, msg: Option<&SyncMsg>) -> Result<Signature> {
        let (me, from_responder) = match self.role {
            Role::Initiator => (self.initiator, false),
            Role::Responder => (self.responder, true),
        };
        if server.public_key() != me {
            return Err(Error::invalid(format!(
                "this anti-entropy session is {me}'s, not this server's"
            )));
        }
        let m = self.message(from_responder, self.sent, msg)?;
        self.sent += 1;
        Ok(server.sign_sync_msg(&m))
    }

    /// Checks the next message from the peer: [`Error::Rejected`] (and nothing counted) if
    /// the peer did not sign it as its next message of this session. (The initiator first
    /// takes the answer's nonce, [`SessionSeal::take_nonce`].)
    pub fn open(&mut self, msg: Option<&SyncMsg>, sig: &Signature) -> Result<()> {
        let (peer, from_responder) = match self.role {
            Role::Initiator => (self.responder, true),
            Role::Responder => (self.initiator, false),
        };
        let m = self.message(from_responder, self.received, msg)?;
        peer.verify(crate::server::DOMAIN_SYNC_MSG, &m, sig)
            .map_err(|_| {
                Error::Rejected(format!(
                    "anti-entropy message {} of session {} is not signed by {peer} as its \
                     next message of this session: forged, replayed or out of order",
                    self.received, self.session
                ))
            })?;
        self.received += 1;
        Ok(())
    }
}

impl SyncMsg {
    /// For a Hello: checks that `peer` signed it for `server` (the responder) and that its
    /// stamp is fresh and new ([`CapsuleServer::check_sync_hello`], nothing recorded),
    /// before a responder lets it replace a session; any other message passes.
    pub fn check_hello(&self, peer: &PublicKey, server: &CapsuleServer) -> Result<()> {
        match self {
            SyncMsg::Hello {
                capsule,
                quick,
                count,
                at,
                sig,
            } => {
                verify_hello(capsule, quick, *count, *at, sig, peer, server)?;
                server.check_sync_hello(capsule, peer, *at)
            }
            _ => Ok(()),
        }
    }
}

impl SyncState {
    /// A session of `server` with the replica whose server key is `peer`, comparing at
    /// most [`crate::wire::MAX_SYNC_NAMES`] names.
    pub fn new(server: &CapsuleServer, capsule: CapsuleName, peer: PublicKey) -> Result<Self> {
        Self::new_within(server, capsule, peer, crate::wire::MAX_SYNC_NAMES)
    }

    /// A session comparing at most `max` of the records proven since the last finished
    /// sync with `peer` (the oldest first; see [`CapsuleServer::since_last_sync_within`]).
    pub fn new_within(
        server: &CapsuleServer,
        capsule: CapsuleName,
        peer: PublicKey,
        max: usize,
    ) -> Result<Self> {
        let (mut since, next_cursor) = server.since_last_sync_within(&capsule, &peer, max)?;
        // Sorted, so the name list pages in a fixed order and membership is a search.
        since.sort_unstable();
        since.dedup();
        Ok(SyncState {
            capsule,
            peer,
            since,
            next_cursor,
            encoder: None,
            received: Vec::new(),
            peer_count: 0,
            sent_names: std::collections::HashSet::new(),
            unreadable: std::collections::HashSet::new(),
            backlog: std::collections::BTreeSet::new(),
            budget: SYNC_BUDGET,
            limited_rounds: 0,
            report: SyncReport::default(),
            finished: false,
            role: None,
            want_symbols: false,
            exchanged: false,
            names_asked: false,
            names_in: Vec::new(),
            names_from: None,
            want_rest: std::collections::VecDeque::new(),
            name_page: NAME_PAGE,
            shape_list: SHAPE_LIST,
        })
    }

    /// Sets the most names of each of the heads, roots and holes lists this side sends
    /// (default [`SHAPE_LIST`]).
    pub fn set_shape_list(&mut self, names: usize) {
        self.shape_list = names.max(1);
    }

    /// Sets the most names in a page of a name list this side sends (default
    /// [`NAME_PAGE`]).
    pub fn set_name_page(&mut self, names: usize) {
        self.name_page = names.max(1);
    }

    /// Whether `name` is in this side's since-set.
    fn in_since(&self, name: &RecordName) -> bool {
        self.since.binary_search(name).is_ok()
    }

    /// Initiator: the next page of names it wants to go with `records` (empty when all
    /// went, or when `records` is a single record over the budget: a page beside it could
    /// take the message past a frame, so it waits for the next message).
    fn next_want_page(&mut self, records: &[SyncRecord]) -> Vec<RecordName> {
        let size = records
            .iter()
            .map(wire_size)
            .fold(0usize, usize::saturating_add);
        if size > self.budget {
            return Vec::new();
        }
        let n = self.want_rest.len().min(self.name_page);
        self.want_rest.drain(..n).collect()
    }

    /// Sets the budget of record bytes per message (default [`SYNC_BUDGET`]). A message
    /// carries records while they fit in the budget (at least one record, so a single
    /// record larger than the budget still travels); the rest wait for the next rounds. Both sides keep exchanging Patches until neither has anything left.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes.max(1);
    }

    /// Names this session compares (its records since the last sync with the peer).
    pub fn names(&self) -> usize {
        self.since.len()
    }

    /// Names the session holds now: those it compares, those it noted as sent or held by
    /// the peer, its backlog and the wanted names it has yet to send. What its memory
    /// grows with as it runs.
    pub fn weight(&self) -> usize {
        self.since
            .len()
            .saturating_add(self.sent_names.len())
            .saturating_add(self.backlog.len())
            .saturating_add(self.want_rest.len())
    }

    /// What the session has done so far.
    pub fn report(&self) -> SyncReport {
        self.report
    }

    /// Names of records this session noted as sent or as held by the peer: at most the
    /// records this side holds, whatever the peer asks for.
    pub fn noted(&self) -> usize {
        self.sent_names.len()
    }

    /// Whether the session is over.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The capsule being synced.
    pub fn capsule(&self) -> &CapsuleName {
        &self.capsule
    }

    /// The peer's server key.
    pub fn peer(&self) -> &PublicKey {
        &self.peer
    }

    /// The initiator's first message.
    pub fn start(&mut self, server: &CapsuleServer) -> Result<SyncMsg> {
        if self.role.is_some() {
            return Err(Error::invalid("anti-entropy session already started"));
        }
        self.role = Some(Role::Initiator);
        self.want_symbols = true;
        let quick = self.quick(server)?;
        let count = self.since.len() as u64;
        let (at, sig) = server.sign_sync_hello(&self.capsule, &self.peer, &quick, count);
        Ok(SyncMsg::Hello {
            capsule: self.capsule,
            quick,
            count,
            at,
            sig,
        })
    }

    fn quick(&self, server: &CapsuleServer) -> Result<Digest> {
        // Of the proven part only: a record no signature reaches never travels, so an
        // unsigned head (anyone may write one) or a hole only it points at would make the
        // check fail in every later session, each of which would then walk the capsule.
        // Proven records whose body is damaged here count as holes: the check fails while
        // one is, so the session walks and the peer sends the copy it has.
        let (heads, holes) = server.with_dag(&self.capsule, |d| (d.proven_heads(), d.wanted()))?;
        Ok(quick_hash(
            self.capsule.hash().algo(),
            &self.since,
            &heads,
            &holes,
        ))
    }

    /// Ends the session; the next one starts from now only if this one saw no bad record
    /// (after a faulty exchange, the next session compares everything again).
    fn finish(&mut self, server: &CapsuleServer) -> Result<()> {
        self.finished = true;
        if self.report.corrupt == 0 && self.report.unproven == 0 && self.report.unreadable == 0 {
            server.finish_sync(
                &self.capsule,
                &self.peer,
                std::mem::take(&mut self.next_cursor),
                &self.sent_names,
            )?;
        }
        Ok(())
    }

    /// Applies the peer's `records`; returns how many were new here and how many names
    /// this session had not noted before (a record this side already held, sent for the
    /// first time in the session, is progress too: a replica that lost its cursor sends
    /// what the other has, once).
    fn apply(&mut self, server: &CapsuleServer, records: &[SyncRecord]) -> Result<(usize, usize)> {
        let r = server.apply_sync(&self.capsule, records)?;
        // The peer has what it sends: never send it back. Only names of records this side
        // now holds proven are noted (whatever the peer sent that failed its checks is
        // not), so the set stays within the capsule's size. Nor is a record held here
        // unproven progress: an honest peer sends proven records only, and a peer sending
        // unsigned records it wrote here earlier, one a round, kept a session going for as
        // many rounds, each walking the capsule under its lock.
        let names: Vec<RecordName> = records.iter().map(|r| r.header.name()).collect();
        let held: Vec<bool> = server.with_dag(&self.capsule, |d| {
            names.iter().map(|n| d.is_proven(n)).collect()
        })?;
        let mut noted = 0;
        for (n, h) in names.into_iter().zip(held) {
            if h && self.sent_names.insert(n) {
                noted += 1;
            }
        }
        self.report.accepted += r.accepted;
        self.report.duplicate += r.duplicate;
        self.report.repaired += r.repaired;
        self.report.corrupt += r.corrupt;
        self.report.unproven += r.unproven;
        Ok((r.accepted, noted))
    }

    /// Queues the proven records among `names` for sending, never the same record twice
    /// in one session (so a peer that refuses what it gets cannot keep the session going
    /// forever), then exports queued records up to the message budget, fewest witness
    /// hops first (a receiver takes a record only once a signature reaches it through
    /// records it holds or receives with it).
    ///
    /// Each record goes with the records its proof runs through (its witness chain to a
    /// signed record), so the receiver can prove it whatever it holds: a record sent
    /// without them could be refused as unproven and never sent again in the session.
    /// Names this side lacks or cannot prove are not noted, so the set of sent names stays
    /// within the capsule's size whatever names the peer asks for.
    fn export(&mut self, server: &CapsuleServer, names: &[RecordName]) -> Result<Vec<SyncRecord>> {
        let sent = &mut self.sent_names;
        let backlog = &mut self.backlog;
        let unreadable = &self.unreadable;
        server.with_dag(&self.capsule, |d| {
            for n in names {
                let mut cur = *n;
                // A name already sent had its chain queued with it.
                while !sent.contains(&cur) && !unreadable.contains(&cur) {
                    let next = match d.witness(&cur) {
                        Some(crate::dag::Witness::Signed) => None,
                        Some(crate::dag::Witness::Next { next, .. }) => Some(next),
                        _ => break,
                    };
                    let hops = d.witness(&cur).and_then(|w| w.hops()).unwrap_or(0);
                    sent.insert(cur);
                    backlog.insert((hops, cur));
                    match next {
                        Some(next) => cur = next,
                        None => break,
                    }
                }
            }
        })?;
        let mut out = Vec::new();
        let mut size = 0usize;
        let mut subrecords = 0usize;
        while size < self.budget {
            let Some(&(_, n)) = self.backlog.first() else {
                break;
            };
            // Names this side lacks (or cannot prove) export to nothing and cost nothing.
            // A record whose stored chunks are missing or damaged here is left out and
            // counted (the session goes on with the rest, and the cursor stays, so it is
            // offered again once repaired); failing the session for it stopped every
            // later session that would send it. An I/O error still ends the session.
            let recs = match server.export(&self.capsule, &[n]) {
                Ok(recs) => recs,
                Err(Error::Corrupt(_) | Error::NotFound(_) | Error::Decode(_)) => {
                    self.backlog.pop_first();
                    self.sent_names.remove(&n);
                    self.unreadable.insert(n);
                    self.report.unreadable = self.unreadable.len();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let add = recs
                .iter()
                .map(wire_size)
                .fold(0usize, usize::saturating_add);
            // A record that would take the message past the budget waits for the next one
            // (unless the message is empty), so a message stays within a frame however
            // large the records: a large one after a medium one used to overflow it, every
            // time, as the order is fixed.
            // Nor past the subrecords a receiver decodes in one message (a single record
            // holds at most `MAX_SUBRECORDS`, below it).
            let subs: usize = recs.iter().map(sync_subrecords).sum();
            if !out.is_empty()
                && (size.saturating_add(add) > self.budget
                    || subrecords + subs > crate::wire::MAX_SYNC_SUBRECORDS)
            {
                break;
            }
            self.backlog.pop_first();
            size = size.saturating_add(add);
            subrecords += subs;
            out.extend(recs);
        }
        self.report.sent += out.len();
        Ok(out)
    }

    /// Most coded symbols this side sends (responder) or takes before falling back to name
    /// lists (initiator): twice its own set, whatever the peer claims. Past it a name list
    /// of this side's set is smaller than the symbols still needed (a coded symbol is
    /// larger than a name), so the responder switches to it on its own: an initiator that
    /// claims millions of names cannot have it encode and send millions of symbols.
    fn symbol_cap(&self) -> usize {
        self.since
            .len()
            .saturating_mul(2)
            .saturating_add(64)
            .min(1 << 22)
    }

    /// Responder: the next page of this side's sorted since-set, from `from`.
    fn names_page(&mut self, from: usize) -> SyncMsg {
        self.report.fallback = true;
        let end = from.saturating_add(self.name_page).min(self.since.len());
        self.names_from = Some(end);
        SyncMsg::Names {
            names: self.since[from..end].to_vec(),
            more: end < self.since.len(),
        }
    }

    /// This side's heads, roots and holes, each cut to [`SyncState::set_shape_list`]'s
    /// count (proven ones first), read under one hold of the capsule.
    ///
    /// The lists also leave room in the frame for `records` and `want`: a record over the
    /// message budget travels alone (up to the largest body), and with full lists beside
    /// it the message would outgrow the frame, in every session.
    fn shape(
        &self,
        server: &CapsuleServer,
        records: &[SyncRecord],
        want: usize,
    ) -> Result<(Vec<RecordName>, Vec<RecordName>, Vec<RecordName>)> {
        let used = records
            .iter()
            .map(wire_size)
            .fold(0usize, usize::saturating_add)
            .saturating_add(want.saturating_mul(NAME_BYTES));
        let room = crate::wire::MAX_FRAME
            .saturating_sub(1 << 20)
            .saturating_sub(used);
        let max = self
            .shape_list
            .min((room / (3 * NAME_BYTES)).max(MIN_SHAPE_LIST));
        server.with_dag(&self.capsule, |d| {
            let cut = |mut names: Vec<RecordName>, key: &dyn Fn(&RecordName) -> bool| {
                if names.len() > max {
                    // Stable: sorted order kept within each kind.
                    names.sort_by_key(|n| !key(n));
                    names.truncate(max);
                    names.sort();
                }
                names
            };
            let proven = |n: &RecordName| d.is_proven(n);
            // A hole matters when a proven record points at it. A proven record whose body
            // is damaged here is listed as missing too: the peer's walk sends a proven
            // record it is asked for, and this side stores its checked body again (an
            // older peer does the same, so the repair needs no new message).
            let wanted_hole = |n: &RecordName| d.has_proven_child(n) || d.is_body_damaged(n);
            let mut missing = d.missing();
            if d.body_damaged().next().is_some() {
                missing.extend(d.body_damaged().filter(|n| d.is_proven(n)));
                missing.sort_unstable();
            }
            (
                cut(d.heads(), &proven),
                cut(d.roots(), &proven),
                cut(missing, &wanted_hole),
            )
        })
    }

    fn exchange(
        &mut self,
        server: &CapsuleServer,
        mine_only: &[RecordName],
        theirs_only: Vec<RecordName>,
    ) -> Result<SyncMsg> {
        let records = self.export(server, mine_only)?;
        self.exchanged = true;
        // Names of the peer's set this side already holds proven are not asked for (the
        // sets differ after a replica lost its cursor, not the records): noted as held on
        // both sides instead.
        let held: Vec<bool> = server.with_dag(&self.capsule, |d| {
            theirs_only.iter().map(|n| d.is_proven(n)).collect()
        })?;
        let mut wanted = Vec::with_capacity(theirs_only.len());
        for (n, h) in theirs_only.into_iter().zip(held) {
            if h {
                self.sent_names.insert(n);
            } else {
                wanted.push(n);
            }
        }
        self.want_rest = wanted.into();
        let want = self.next_want_page(&records);
        let (heads, roots, missing) = self.shape(server, &records, want.len())?;
        Ok(SyncMsg::Exchange {
            records,
            want,
            heads,
            roots,
            missing,
        })
    }

    /// A Patch carrying `records`, `want` and this side's current heads, roots and holes.
    fn patch(
        &self,
        server: &CapsuleServer,
        records: Vec<SyncRecord>,
        want: Vec<RecordName>,
    ) -> Result<SyncMsg> {
        let (heads, roots, missing) = self.shape(server, &records, want.len())?;
        Ok(SyncMsg::Patch {
            records,
            want,
            heads,
            roots,
            missing,
        })
    }

    fn depth(&self) -> usize {
        (4usize << self.report.rounds.min(14)).min(1 << 16)
    }

    /// Feeds one message from the peer; returns the message to send back, or `None` when
    /// the session is over.
    pub fn handle(&mut self, server: &CapsuleServer, msg: SyncMsg) -> Result<Option<SyncMsg>> {
        if self.finished {
            return Err(Error::invalid("anti-entropy session already finished"));
        }
        let algo = self.capsule.hash().algo();
        match msg {
            SyncMsg::Hello {
                capsule,
                quick,
                count,
                at,
                sig,
            } => {
                if capsule != self.capsule {
                    return Err(Error::invalid("peer syncs another capsule"));
                }
                if self.role.is_some() {
                    return Err(Error::invalid("unexpected Hello: the session has started"));
                }
                verify_hello(&capsule, &quick, count, at, &sig, &self.peer, server)?;
                server.accept_sync_hello(&capsule, &self.peer, at)?;
                self.role = Some(Role::Responder);
                // A peer holds at most as many names as a message can list.
                self.peer_count = count.min(crate::wire::MAX_NAMES as u64);
                if quick == self.quick(server)? {
                    self.report.quick_match = true;
                    self.finish(server)?;
                    return Ok(Some(SyncMsg::InSync));
                }
                let digests: Vec<Digest> = self.since.iter().map(|n| *n.hash().digest()).collect();
                let mut enc = riblt::Encoder::new(digests);
                let batch = enc.next_symbols(
                    FIRST_BATCH
                        .max(
                            self.peer_count
                                .abs_diff(self.since.len() as u64)
                                .saturating_mul(2)
                                .min(1 << 16) as usize,
                        )
                        .min(1 << 16)
                        .min(self.symbol_cap()),
                );
                self.report.symbols += batch.len();
                self.encoder = Some(enc);
                Ok(Some(SyncMsg::Symbols(batch)))
            }
            SyncMsg::InSync => {
                if self.role != Some(Role::Initiator) || !self.want_symbols {
                    return Err(Error::invalid("unexpected InSync from the peer"));
                }
                self.report.quick_match = true;
                self.finish(server)?;
                Ok(None)
            }
            SyncMsg::More => {
                if self.role != Some(Role::Responder) || self.exchanged || self.names_from.is_some()
                {
                    return Err(Error::invalid("unexpected request for coded symbols"));
                }
                let cap = self.symbol_cap();
                let Some(enc) = self.encoder.as_mut() else {
                    return Err(Error::invalid("peer asked for symbols before Hello"));
                };
                let n = (enc.produced() as usize).clamp(FIRST_BATCH, MAX_SYMBOL_BATCH);
                if (enc.produced() as usize).saturating_add(n) > cap {
                    // The symbols still needed would outweigh this side's name list: send
                    // that instead, page by page (the initiator asks for the rest).
                    self.encoder = None;
                    return Ok(Some(self.names_page(0)));
                }
                let batch = enc.next_symbols(n);
                self.report.symbols += batch.len();
                Ok(Some(SyncMsg::Symbols(batch)))
            }
            SyncMsg::Symbols(batch) => {
                // Only the initiator decodes, and only until the symbols decode or it
                // falls back to name lists: a peer cannot pile up symbols to decode again
                // and again.
                if self.role != Some(Role::Initiator) || !self.want_symbols {
                    return Err(Error::invalid("unexpected coded symbols from the peer"));
                }
                // A responder's batches double (the first holds at least FIRST_BATCH), so
                // decoding runs a few dozen times at most: a batch smaller than that
                // schedule would make this side decode its whole set again for nothing.
                let least = FIRST_BATCH.max(self.received.len()).min(MAX_SYMBOL_BATCH);
                if batch.len() < least {
                    return Err(Error::invalid(format!(
                        "the peer sent {} coded symbols, fewer than the {least} its batch holds",
                        batch.len()
                    )));
                }
                // No more than a responder sends in one batch, nor past what this side
                // would ever ask for.
                if batch.len() > MAX_SYMBOL_BATCH
                    || self.received.len() + batch.len()
                        > self.symbol_cap().saturating_add(MAX_SYMBOL_BATCH)
                {
                    return Err(Error::invalid(format!(
                        "the peer sent {} coded symbols, more than asked for",
                        batch.len()
                    )));
                }
                self.report.symbols += batch.len();
                self.received.extend(batch);
                let local: Vec<Digest> = self.since.iter().map(|n| *n.hash().digest()).collect();
                match riblt::decode(&self.received, &local) {
                    Some(diff) => {
                        let to_name = |d: &Digest| RecordName(cairn_core::Hash::new(algo, *d));
                        let mine: Vec<RecordName> = diff.local_only.iter().map(to_name).collect();
                        let theirs: Vec<RecordName> =
                            diff.remote_only.iter().map(to_name).collect();
                        self.want_symbols = false;
                        self.received = Vec::new();
                        self.exchange(server, &mine, theirs).map(Some)
                    }
                    None if self.received.len() >= self.symbol_cap() => {
                        self.report.fallback = true;
                        self.want_symbols = false;
                        self.names_asked = true;
                        self.received = Vec::new();
                        Ok(Some(SyncMsg::SendNames { from: 0 }))
                    }
                    None => Ok(Some(SyncMsg::More)),
                }
            }
            SyncMsg::SendNames { from } => {
                // Pages go in order, each once: the first at 0, each next one where the
                // last ended.
                let expected = self.names_from.unwrap_or(0);
                if self.role != Some(Role::Responder)
                    || self.exchanged
                    || from != expected as u64
                    || (self.names_from.is_some() && expected >= self.since.len())
                {
                    return Err(Error::invalid("unexpected request for the name list"));
                }
                self.encoder = None;
                Ok(Some(self.names_page(expected)))
            }
            SyncMsg::Names { names, more } => {
                // Asked for, or the responder's answer to More once its symbols would have
                // outweighed its name list (the first page).
                if self.role != Some(Role::Initiator) || !(self.names_asked || self.want_symbols) {
                    return Err(Error::invalid("unexpected name list from the peer"));
                }
                if self.want_symbols {
                    self.report.fallback = true;
                    self.want_symbols = false;
                    self.names_asked = true;
                    self.received = Vec::new();
                }
                // Every page but the last holds names, and all of them together no more
                // than a list may: a peer cannot keep this side asking forever.
                if more && names.is_empty() {
                    return Err(Error::invalid(
                        "the peer sent an empty page of its name list with more to follow",
                    ));
                }
                if self.names_in.len().saturating_add(names.len()) > crate::wire::MAX_NAMES {
                    return Err(Error::invalid(format!(
                        "the peer's name list holds more than {} names",
                        crate::wire::MAX_NAMES
                    )));
                }
                self.names_in.extend(names);
                if more {
                    return Ok(Some(SyncMsg::SendNames {
                        from: self.names_in.len() as u64,
                    }));
                }
                self.names_asked = false;
                let mut theirs = std::mem::take(&mut self.names_in);
                theirs.sort_unstable();
                theirs.dedup();
                let mine_only: Vec<RecordName> = self
                    .since
                    .iter()
                    .filter(|n| theirs.binary_search(n).is_err())
                    .copied()
                    .collect();
                let theirs_only: Vec<RecordName> =
                    theirs.into_iter().filter(|n| !self.in_since(n)).collect();
                self.exchange(server, &mine_only, theirs_only).map(Some)
            }
            SyncMsg::Exchange {
                records,
                want,
                heads,
                roots,
                missing,
            } => {
                if self.role != Some(Role::Responder) || self.exchanged {
                    return Err(Error::invalid("unexpected Exchange from the peer"));
                }
                self.exchanged = true;
                self.apply(server, &records)?;
                // The initiator wants names of this side's set (what decoding or the name
                // list showed it): anything else is not taken from a peer's list.
                let mut names: Vec<RecordName> =
                    want.into_iter().filter(|n| self.in_since(n)).collect();
                // The initiator does not ask for a record it holds proven, so one this side
                // signed after a chain proved it (listed again for its signature) would
                // never reach an initiator holding it unsigned: it goes unasked.
                let since = &self.since;
                names.extend(server.with_dag(&self.capsule, |d| {
                    // Whichever is smaller is walked (the since-set is sorted).
                    if d.signed_late_count() < since.len() {
                        d.signed_late_names()
                            .filter(|n| since.binary_search(n).is_ok())
                            .copied()
                            .collect::<Vec<_>>()
                    } else {
                        since.iter().filter(|n| d.signed_late(n)).copied().collect()
                    }
                })?);
                names.extend(server.lu_patch(
                    &self.capsule,
                    &heads,
                    &roots,
                    &missing,
                    self.depth(),
                )?);
                names.sort();
                names.dedup();
                let records = self.export(server, &names)?;
                self.patch(server, records, Vec::new()).map(Some)
            }
            SyncMsg::Patch {
                records,
                want,
                heads,
                roots,
                missing,
            } => {
                if !self.exchanged {
                    return Err(Error::invalid("unexpected Patch before the Exchange"));
                }
                if !want.is_empty() && self.role != Some(Role::Responder) {
                    return Err(Error::invalid("the responder asked for names in a Patch"));
                }
                self.report.rounds += 1;
                let incoming = records.len();
                let asked = !want.is_empty();
                let was_backlogged = !self.backlog.is_empty();
                let (accepted, noted) = self.apply(server, &records)?;
                // Past the limit, after what this message brought is stored.
                if self.report.rounds > MAX_SESSION_ROUNDS {
                    return Err(Error::Unavailable(format!(
                        "anti-entropy ran {MAX_SESSION_ROUNDS} rounds; the next session goes \
                         on from what this one stored"
                    )));
                }
                let mut names =
                    server.lu_patch(&self.capsule, &heads, &roots, &missing, self.depth())?;
                // The next page of the initiator's wanted names, of this side's set only. It
                // is progress only when it names a record of that set not sent yet: pages of
                // made-up or repeated names count against the limit like empty rounds.
                let wanted: Vec<RecordName> =
                    want.into_iter().filter(|n| self.in_since(n)).collect();
                let new_wants = wanted.iter().any(|n| !self.sent_names.contains(n));
                names.extend(wanted);
                let out = self.export(server, &names)?;
                let want_page = self.next_want_page(&out);
                // A round that moved nothing new either way counts against the limit (a
                // page of wanted names this side sends is progress: it has finitely many).
                // Records this side sends for the first time are progress too: each goes
                // once a session, so they cannot keep it going for ever (a side walking a
                // long branch to a peer that sends nothing back counted every round).
                if accepted == 0
                    && noted == 0
                    && !was_backlogged
                    && out.is_empty()
                    && want_page.is_empty()
                    && !new_wants
                {
                    self.limited_rounds += 1;
                    if self.limited_rounds > MAX_ROUNDS {
                        return Err(Error::Unavailable(format!(
                            "anti-entropy did not converge in {MAX_ROUNDS} rounds"
                        )));
                    }
                }
                // Over only when neither side sends or asks for anything: a peer with a
                // backlog always sends records, even ones this side already had, and an
                // initiator with wanted names left always sends their next page.
                if out.is_empty() && incoming == 0 && !asked && want_page.is_empty() {
                    self.finish(server)?;
                    return Ok(Some(SyncMsg::Done));
                }
                self.patch(server, out, want_page).map(Some)
            }
            SyncMsg::Done => {
                if !self.exchanged {
                    return Err(Error::invalid("unexpected Done before the Exchange"));
                }
                if !self.want_rest.is_empty() {
                    return Err(Error::invalid(
                        "the peer ended the session before sending every wanted record",
                    ));
                }
                self.finish(server)?;
                Ok(None)
            }
        }
    }
}

/// Messages [`sync_pair`] and remote sessions exchange before giving up: a safety net
/// only, since [`MAX_ROUNDS`] and the finite backlog already end every session.
pub const MAX_STEPS: usize = 1 << 20;

/// Approximate encoded size of a record in a sync message.
/// Subrecords a sync record carries.
fn sync_subrecords(r: &SyncRecord) -> usize {
    match &r.body {
        crate::server::SyncBody::Plain(_) => 0,
        crate::server::SyncBody::Subrecords(subs) => subs.len(),
    }
}

fn wire_size(r: &SyncRecord) -> usize {
    let body = match &r.body {
        crate::server::SyncBody::Plain(b) => b.len(),
        crate::server::SyncBody::Subrecords(subs) => subs.body_len(),
    };
    100 + 34 * r.header.backpointers.len() + body + 70
}

/// Runs a whole session between two servers in memory (tests, the simulator, local
/// replicas). Returns both sides' reports.
pub fn sync_pair(
    a: &CapsuleServer,
    b: &CapsuleServer,
    capsule: &CapsuleName,
) -> Result<(SyncReport, SyncReport)> {
    let mut sa = SyncSession::new(a, *capsule, b.public_key())?;
    let mut sb = SyncSession::new(b, *capsule, a.public_key())?;
    let mut msg = Some(sa.start()?);
    let mut to_b = true;
    let mut steps = 0;
    while let Some(m) = msg {
        steps += 1;
        if steps > MAX_STEPS {
            return Err(Error::Unavailable(
                "anti-entropy session did not end".into(),
            ));
        }
        msg = if to_b { sb.handle(m)? } else { sa.handle(m)? };
        to_b = !to_b;
    }
    Ok((sa.report(), sb.report()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_core::{HashAlgo, SigningKey};
    use cairn_store::{MemoryStore, Store};

    use super::*;
    use crate::server::ServerOptions;
    use crate::{BodyKey, CapsuleMetadata, Writer};

    fn server(seed: u8) -> CapsuleServer {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        CapsuleServer::new(
            store,
            SigningKey::from_seed(&[seed; 32]),
            ServerOptions::default(),
        )
    }

    /// A seal signs only with its own side's key, and each signature passes for exactly
    /// one message at one place of one direction of one session: the responder's empty
    /// answer does not pass for a Done, an initiator's message not for the responder's
    /// (shown with one key on both sides, so only the direction tells them apart), and
    /// the initiator's messages after the Hello not under another responder nonce.
    #[test]
    fn a_seal_binds_the_message_its_place_its_side_and_the_nonce() {
        let (a, b) = (server(1), server(2));
        let c = CapsuleMetadata::new(HashAlgo::Blake3, a.public_key(), "seal").name();
        let mut init = SessionSeal::initiator(c, a.public_key(), b.public_key(), 5);
        let mut resp = SessionSeal::responder(c, a.public_key(), b.public_key(), 5, 77);
        assert!(init.clone().seal(&b, Some(&SyncMsg::More)).is_err());
        assert!(resp.clone().seal(&a, None).is_err());
        let s0 = init.seal(&a, Some(&SyncMsg::More)).unwrap();
        assert!(resp.clone().open(Some(&SyncMsg::Done), &s0).is_err());
        resp.open(Some(&SyncMsg::More), &s0).unwrap();
        // Taken once: the same signature is not the next message.
        assert!(resp.clone().open(Some(&SyncMsg::More), &s0).is_err());
        // Before the first answer the initiator has no nonce to sign under.
        assert!(init.clone().seal(&a, Some(&SyncMsg::More)).is_err());
        let none = resp.seal(&b, None).unwrap();
        let mut taken = init.clone();
        taken.take_nonce(77).unwrap();
        assert!(taken.clone().open(Some(&SyncMsg::Done), &none).is_err());
        let mut other_nonce = init.clone();
        other_nonce.take_nonce(78).unwrap();
        assert!(other_nonce.open(None, &none).is_err());
        taken.open(None, &none).unwrap();
        assert!(taken.take_nonce(78).is_err(), "the nonce cannot change");
        // Message 1 of the initiator under nonce 77 passes the responder; under 78 not.
        let mut under_78 = init.clone();
        under_78.take_nonce(78).unwrap();
        under_78.received = 1;
        let wrong = under_78.seal(&a, Some(&SyncMsg::More)).unwrap();
        assert!(resp.clone().open(Some(&SyncMsg::More), &wrong).is_err());
        let right = taken.seal(&a, Some(&SyncMsg::More)).unwrap();
        resp.open(Some(&SyncMsg::More), &right).unwrap();
        assert_eq!(taken.session(), 5);
        // One key on both sides: the direction alone separates the two sides' messages.
        let mut i2 = SessionSeal::initiator(c, a.public_key(), a.public_key(), 6);
        let mut r2 = SessionSeal::responder(c, a.public_key(), a.public_key(), 6, 1);
        let hello = i2.seal(&a, Some(&SyncMsg::More)).unwrap();
        r2.open(Some(&SyncMsg::More), &hello).unwrap();
        let answer = r2.seal(&a, Some(&SyncMsg::More)).unwrap();
        i2.take_nonce(1).unwrap();
        let mine = i2.seal(&a, Some(&SyncMsg::More)).unwrap();
        i2.open(Some(&SyncMsg::More), &answer).unwrap();
        r2.open(Some(&SyncMsg::More), &mine).unwrap();
        // The initiator's message 1 (same key, nonce, place and content) does not pass as
        // the responder's answer 1; the responder's own does.
        assert!(i2.clone().open(Some(&SyncMsg::More), &mine).is_err());
        let answer1 = r2.seal(&a, Some(&SyncMsg::More)).unwrap();
        i2.open(Some(&SyncMsg::More), &answer1).unwrap();
    }

    /// With a budget of one byte every message carries one record, so the session needs
    /// far more than MAX_ROUNDS rounds; backlog rounds do not count, and it converges.
    #[test]
    fn budget_splits_messages_and_still_converges() {
        let (a, b) = (server(1), server(2));
        let wk = SigningKey::from_seed(&[7; 32]);
        let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "budget");
        let c = meta.name();
        a.create(&meta).unwrap();
        b.create(&meta).unwrap();
        let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([3; 32]))).unwrap();
        let mut all = std::collections::BTreeSet::new();
        for i in 0..150 {
            let r = w.record(&[i as u8; 64], &[]).unwrap();
            let n = r.name();
            all.insert(n);
            let sigs = if i % 10 == 9 {
                vec![(n, w.sign(&n))]
            } else {
                vec![]
            };
            // 0..20 on both, 20..130 only on A, 130..150 only on B.
            if i < 130 {
                a.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
            }
            if !(20..130).contains(&i) {
                b.write(&c, std::slice::from_ref(&r), &sigs).unwrap();
            }
        }
        let mut sa = SyncState::new(&a, c, b.public_key()).unwrap();
        let mut sb = SyncState::new(&b, c, a.public_key()).unwrap();
        sa.set_budget(1);
        sb.set_budget(1);
        let mut msg = Some(sa.start(&a).unwrap());
        let mut to_b = true;
        let mut most = 0;
        while let Some(m) = msg {
            if let SyncMsg::Exchange { records, .. } | SyncMsg::Patch { records, .. } = &m {
                most = most.max(records.len());
            }
            msg = if to_b {
                sb.handle(&b, m).unwrap()
            } else {
                sa.handle(&a, m).unwrap()
            };
            to_b = !to_b;
        }
        assert_eq!(most, 1, "one record per message");
        assert!(sa.is_finished() && sb.is_finished());
        let names = |s: &CapsuleServer| -> std::collections::BTreeSet<RecordName> {
            s.with_dag(&c, |d| d.order().iter().copied().collect())
                .unwrap()
        };
        assert_eq!(names(&a), all);
        assert_eq!(names(&b), all);
        let (ra, rb) = (sa.report(), sb.report());
        assert!(ra.rounds + rb.rounds > MAX_ROUNDS, "{ra:?} {rb:?}");
        assert_eq!(ra.accepted + rb.accepted, 130, "{ra:?} {rb:?}");
        assert_eq!(ra.unproven + rb.unproven, 0, "{ra:?} {rb:?}");
        // Lu's walk re-sends a few shared ancestors; nothing is echoed back.
        assert!(ra.sent + rb.sent <= 130 + 40, "{ra:?} {rb:?}");
        assert!(sync_pair(&a, &b, &c).unwrap().0.quick_match);
    }

    /// A message never goes past its budget to take one more record (unless it holds a
    /// single one): a large record after a smaller one waits for the next message, so
    /// messages stay within a wire frame.
    #[test]
    fn a_record_that_does_not_fit_waits_for_the_next_message() {
        let (a, b) = (server(1), server(2));
        let wk = SigningKey::from_seed(&[7; 32]);
        let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "fit");
        let c = meta.name();
        a.create(&meta).unwrap();
        b.create(&meta).unwrap();
        let mut w = Writer::new(meta.clone(), wk, Some(BodyKey([3; 32]))).unwrap();
        for i in 0..40 {
            let len = if i % 3 == 0 { 2500 } else { 300 };
            let r = w.record(&vec![i as u8; len], &[]).unwrap();
            let n = r.name();
            a.write(&c, std::slice::from_ref(&r), &[(n, w.sign(&n))])
                .unwrap();
        }
        let budget = 3000;
        let mut sa = SyncState::new(&a, c, b.public_key()).unwrap();
        let mut sb = SyncState::new(&b, c, a.public_key()).unwrap();
        sa.set_budget(budget);
        sb.set_budget(budget);
        let mut msg = Some(sa.start(&a).unwrap());
        let mut to_b = true;
        let mut messages = 0;
        while let Some(m) = msg {
            if let SyncMsg::Exchange { records, .. } | SyncMsg::Patch { records, .. } = &m
                && !records.is_empty()
            {
                messages += 1;
                let size: usize = records.iter().map(wire_size).sum();
                assert!(
                    size <= budget || records.len() == 1,
                    "{size} bytes in {}",
                    records.len()
                );
            }
            msg = if to_b {
                sb.handle(&b, m).unwrap()
            } else {
                sa.handle(&a, m).unwrap()
            };
            to_b = !to_b;
        }
        assert!(messages > 10, "{messages}");
        assert_eq!(b.with_dag(&c, |d| d.len()).unwrap(), 40);
    }

    /// A message carrying a record as large as a body may be keeps its shape lists within
    /// the frame: cut (proven names first) to what room is left, down to
    /// `MIN_SHAPE_LIST`. Before, anyone's 2^18 lone unsigned records filled the lists, and
    /// a record over about 39 MiB then never fit in a frame.
    #[test]
    fn shape_lists_leave_room_for_a_large_record() {
        let a = server(1);
        let wk = SigningKey::from_seed(&[7; 32]);
        let meta = CapsuleMetadata::new(HashAlgo::Blake3, wk.public(), "room");
        let c = meta.name();
        a.create(&meta).unwrap();
        // Lone unsigned records, each pointing at a record nobody has: each is a head and
        // a root, and its backpointer a hole.
        let n = MIN_SHAPE_LIST + 500;
        for i in 0..n as u32 {
            let ghost = RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes()));
            let r = crate::Record::new(c, i.to_le_bytes().to_vec(), vec![ghost]);
            a.write(&c, std::slice::from_ref(&r), &[]).unwrap();
        }
        let st = SyncState::new(&a, c, server(2).public_key()).unwrap();
        let (h, r, m) = st.shape(&a, &[], 0).unwrap();
        assert_eq!((h.len(), r.len(), m.len()), (n, n, n));
        let big = SyncRecord {
            header: crate::Record::new(c, vec![], vec![]).header,
            body: crate::server::SyncBody::Plain(vec![0; crate::record::MAX_BODY_LEN]),
            signature: None,
        };
        let (h, r, m) = st.shape(&a, std::slice::from_ref(&big), 0).unwrap();
        assert_eq!(
            (h.len(), r.len(), m.len()),
            (MIN_SHAPE_LIST, MIN_SHAPE_LIST, MIN_SHAPE_LIST)
        );
        let used = wire_size(&big) + 3 * MIN_SHAPE_LIST * NAME_BYTES;
        assert!(used + 1024 <= crate::wire::MAX_FRAME);
    }
}
