//! Request signatures for buckets with an owner key.
//!
//! A bucket created with an owner Ed25519 public key accepts a mutation (PUT, PATCH, DELETE,
//! POST under the bucket) only when the request carries a signature by that key. Reads stay
//! open: what a bucket holds is public, and every version has a capsule proof. Buckets
//! created without an owner key are open to every client that can reach the node (the
//! default for a node on localhost).
//!
//! The scheme, `Cairn-Ed25519`, in the request headers:
//!
//! - `X-Cairn-Date`: the client's clock, whole seconds since the Unix epoch; the node
//!   accepts it within [`WINDOW_SECS`] of its own clock either way;
//! - `X-Cairn-Content-BLAKE3`: the 64 lowercase hex digits of the BLAKE3 hash (32 bytes) of
//!   the request body exactly as sent (of the empty string when there is no body). The
//!   node hashes the body as it streams in and refuses it, storing nothing, when it differs;
//! - `Authorization: Cairn-Ed25519 <128 hex digits>`: the Ed25519 signature (RFC 8032,
//!   checked with `verify_strict`) over the bytes `len(D) ‖ D ‖ M`, where `D` is the domain
//!   tag [`DOMAIN`] (`len(D)` is one byte) and `M` is the string to sign
//!   ([`RequestToSign::message`]): these lines joined by `\n`
//!
//!   ```text
//!   CAIRN-ED25519-V1
//!   <method, upper case>
//!   <path and query exactly as sent, e.g. /v1/buckets/b/objects/k?branch=dev>
//!   <X-Cairn-Date>
//!   <X-Cairn-Content-BLAKE3>
//!   <Content-Type, or empty>
//!   <If-Match, or empty>
//!   <X-Cairn-Context, or empty>
//!   ```
//!
//!   followed by one more line, `<X-Cairn-Nonce>`, when the request has that header: 1 to
//!   64 characters from `A-Z a-z 0-9 - _`, chosen at random per request. Ed25519 signatures
//!   are deterministic, so without a nonce two identical requests signed in the same
//!   second carry the same signature, and the node refuses the second as a replay; `cairn
//!   --server` always sends one. When the request has an `X-Cairn-Capsule` header (the
//!   bucket's capsule name, as `GET /v1/buckets/{bucket}` shows it), one more line follows:
//!   the nonce line (empty without a nonce), then `<X-Cairn-Capsule>`. The node refuses a
//!   signature bound to another capsule, so a request signed for one node's bucket cannot
//!   be replayed on another node's bucket of the same name and owner (each node writes its
//!   buckets' capsules with its own key, so their names differ); `cairn --server` sends it
//!   for every mutation of an existing bucket.
//!
//! A signature is accepted once: the node remembers the signatures it accepted until their
//! date leaves the window, so a captured request cannot be replayed. They are kept in
//! memory and, before the request's write, committed to the store as refs under
//! [`REPLAY_REFS`] (through the same group commit as every write, so at the node's
//! durability level), so a restart still refuses them. Every failure is 401
//! with a message naming the check that failed, and nothing is written.

use std::collections::{BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method, Uri, header};
use cairn_core::{HashAlgo, PublicKey, Signature, SigningKey};
use cairn_store::{RefStore, RefUpdate};
use parking_lot::Mutex;

use super::error::{ApiError, ApiResult};

/// The `Authorization` scheme name.
pub const SCHEME: &str = "Cairn-Ed25519";
/// The signature domain tag (see [`cairn_core::SigningKey::sign`]).
pub const DOMAIN: &[u8] = b"cairn/native/request/v1";
/// The first line of every string to sign.
pub const VERSION_LINE: &str = "CAIRN-ED25519-V1";
/// Header with the client's Unix time in seconds.
pub const DATE_HEADER: &str = "x-cairn-date";
/// Header with the hex BLAKE3 hash of the body.
pub const BODY_HASH_HEADER: &str = "x-cairn-content-blake3";
/// Header with a per-request random string (covered by the signature; optional).
pub const NONCE_HEADER: &str = "x-cairn-nonce";
/// The header naming the capsule of the bucket a signed request is for (optional, signed).
pub const CAPSULE_HEADER: &str = "x-cairn-capsule";
/// Longest accepted [`NONCE_HEADER`] value.
pub const MAX_NONCE_LEN: usize = 64;
/// Header with application metadata stored in a new version (covered by the signature).
pub const CONTEXT_HEADER: &str = "x-cairn-context";
/// How far a request's date may be from the node's clock, either way, in seconds.
pub const WINDOW_SECS: u64 = 300;
/// Most signatures remembered at once against replays (measured: 38 MiB when 8 keys hold
/// them, 64 MiB when 50,000 keys hold 8 each). Past this, the owner key holding the most
/// forgets its oldest eighth and its floor rises (see [`ReplayGuard`]).
const MAX_REMEMBERED: usize = 400_000;
/// Most signatures of one owner key remembered at once (166 signed requests a second over
/// the window): past this, that key's oldest eighth is forgotten and its floor rises.
pub const MAX_PER_OWNER: usize = 50_000;
/// Most owner keys with signatures or a floor remembered at once; past this (a flood of
/// made-up keys, each with a bucket of its own), the key holding the fewest signatures is
/// *parked*: its signatures are forgotten and only its floor, raised past them, is kept
/// (see [`ReplayGuard`]).
const MAX_OWNERS: usize = 50_000;
/// Most parked owner keys (a 32-byte key and an 8-byte floor each, plus the hash map's
/// overhead: some 25 MiB at most, estimated, not measured); past this,
/// signed requests of keys not in the table get 503 until parked floors expire.
const MAX_PARKED: usize = 1 << 19;

/// The parts of a request that its signature covers.
#[derive(Clone, Debug)]
pub struct RequestToSign<'a> {
    /// HTTP method, upper case.
    pub method: &'a str,
    /// Path and query as sent on the request line.
    pub path_and_query: &'a str,
    /// The `X-Cairn-Date` value: seconds since the Unix epoch.
    pub unix_secs: u64,
    /// BLAKE3 of the body.
    pub body_blake3: [u8; 32],
    /// `Content-Type` header value (empty when absent).
    pub content_type: &'a [u8],
    /// `If-Match` header value (empty when absent).
    pub if_match: &'a [u8],
    /// `X-Cairn-Context` header value (empty when absent).
    pub context: &'a [u8],
    /// `X-Cairn-Nonce` header value (empty when absent: then no nonce line is signed,
    /// unless a capsule line follows it).
    pub nonce: &'a [u8],
    /// `X-Cairn-Capsule` header value (empty when absent: then no capsule line is signed).
    pub capsule: &'a [u8],
}

impl RequestToSign<'_> {
    /// The string to sign (see the module documentation).
    pub fn message(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(160 + self.path_and_query.len());
        for (i, part) in [
            VERSION_LINE.as_bytes(),
            self.method.as_bytes(),
            self.path_and_query.as_bytes(),
            self.unix_secs.to_string().as_bytes(),
            hex::encode(self.body_blake3).as_bytes(),
            self.content_type,
            self.if_match,
            self.context,
            self.nonce,
            self.capsule,
        ]
        .into_iter()
        .enumerate()
        {
            // The optional lines: the nonce (present when it or the capsule is), then the
            // capsule.
            if (i == 8 && part.is_empty() && self.capsule.is_empty()) || (i == 9 && part.is_empty())
            {
                break;
            }
            if i > 0 {
                m.push(b'\n');
            }
            m.extend_from_slice(part);
        }
        m
    }

    /// The headers that authorize this request with `key`: `Authorization`,
    /// `X-Cairn-Date`, `X-Cairn-Content-BLAKE3`, and `X-Cairn-Nonce` when there is one.
    pub fn sign(&self, key: &SigningKey) -> Vec<(&'static str, String)> {
        let sig = key.sign(DOMAIN, &self.message());
        let mut h = vec![
            (
                "authorization",
                format!("{SCHEME} {}", hex::encode(sig.raw())),
            ),
            (DATE_HEADER, self.unix_secs.to_string()),
            (BODY_HASH_HEADER, hex::encode(self.body_blake3)),
        ];
        if !self.nonce.is_empty() {
            h.push((
                NONCE_HEADER,
                String::from_utf8_lossy(self.nonce).into_owned(),
            ));
        }
        if !self.capsule.is_empty() {
            h.push((
                CAPSULE_HEADER,
                String::from_utf8_lossy(self.capsule).into_owned(),
            ));
        }
        h
    }
}

/// The BLAKE3 hash of `body` as the signature scheme uses it.
pub fn body_blake3(body: &[u8]) -> [u8; 32] {
    *HashAlgo::Blake3.digest(body).digest()
}

/// Seconds since the Unix epoch by the node's clock.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Prefix of the refs that remember accepted signatures across restarts: the owner key (32
/// bytes) and the signature's [`sig_id`] (16 bytes, little-endian) follow, the value is the
/// Unix second (u64, little-endian) after which the signature's date is out of the window.
/// Refs written by earlier versions name the 64-byte signature instead, with the second
/// and then the owner key as the value (or the second alone, before owners were kept).
pub const REPLAY_REFS: &[u8] = b"native/replay/";

/// Prefix of the refs that keep owner keys' floors (see [`ReplayGuard`]) across restarts:
/// the owner key and the floor (u64, big-endian) follow, the value is empty. A floor ref is
/// never overwritten: a key's floor is the highest of its refs, and a raised floor's commit
/// deletes the ref of the floor before it. So commits landing in any order (two requests
/// that took their changes in one order and reached the store in the other) never lower
/// the stored floor, and a sweep deletes only refs whose own floor is past.
pub const REPLAY_FLOOR_REFS: &[u8] = b"native/replay-floor/";

fn floor_ref(owner: &[u8; 32], floor: u64) -> Vec<u8> {
    let mut name = REPLAY_FLOOR_REFS.to_vec();
    name.extend_from_slice(owner);
    name.extend_from_slice(&floor.to_be_bytes());
    name
}

fn replay_ref(owner: &[u8; 32], id: u128) -> Vec<u8> {
    let mut name = REPLAY_REFS.to_vec();
    name.extend_from_slice(owner);
    name.extend_from_slice(&id.to_le_bytes());
    name
}

/// The owner key and floor a floor ref names.
fn parse_floor_ref(name: &[u8]) -> Option<([u8; 32], u64)> {
    let rest = name.strip_prefix(REPLAY_FLOOR_REFS)?;
    let owner = <[u8; 32]>::try_from(rest.get(..32)?).ok()?;
    let floor = u64::from_be_bytes(<[u8; 8]>::try_from(rest.get(32..)?).ok()?);
    Some((owner, floor))
}

fn le_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(<[u8; 8]>::try_from(b.get(..8)?).ok()?))
}

/// Persisted signatures between two sweeps of expired replay refs.
const SWEEP_EVERY: u64 = 4096;

/// What [`check`] accepted: the hash the body must have, and the signature to remember.
#[derive(Clone, Copy, Debug)]
pub struct Checked {
    /// BLAKE3 hash the body must have (checked while it is read).
    pub body_blake3: [u8; 32],
    /// The request's signature.
    pub signature: [u8; 64],
    /// When the signature's date leaves the window (Unix seconds).
    pub expires: u64,
    /// The owner key that signed it.
    pub owner: [u8; 32],
}

/// Signatures accepted recently (until their date leaves the window), against replays.
///
/// Memory is bounded ([`MAX_REMEMBERED`] signatures, [`MAX_PER_OWNER`] of one key,
/// [`MAX_OWNERS`] keys) without refusing honest owners when the table fills: the key
/// holding the most signatures (the one that fills it) forgets its oldest eighth, and its
/// *floor* rises to the latest expiry it forgot. A request of that key whose date is not
/// past the floor is refused (401: sign it anew with the current time), which refuses
/// every replay of a forgotten signature. Other keys' floors do not move. A key that
/// holds more signatures in the window than the flooding keys do can become the one that
/// gives way: its oldest are forgotten first, so only its requests dated no later than
/// those (requests signed in the same second as many others, or sent late) are refused.
/// Forgotten signatures' refs are deleted and raised floors stored in the commit of the
/// next accepted signature ([`ReplayGuard::persist`]), and a reload applies the same
/// limits ([`ReplayGuard::load`]). Signatures and floors are kept [`SWEEP_GRACE_SECS`]
/// past the window. With [`MAX_OWNERS`] keys in the table, a new key's request parks the
/// key holding the fewest signatures: it forgets them all and keeps only its floor, so
/// no replay of them passes, and its later requests (dated after its last) still do.
/// Keeping the table full of keys does not lock new owners out with 503 until
/// [`MAX_PARKED`] keys are parked within the window too.
#[derive(Default)]
pub struct ReplayGuard {
    seen: Mutex<Seen>,
    persisted: std::sync::atomic::AtomicU64,
}

/// The remembered signatures, per owner key.
#[derive(Default)]
struct Seen {
    /// Per owner key: its signatures, in expiry order, and its floor.
    owners: HashMap<[u8; 32], OwnerSigs>,
    /// Signatures of refs written before owners were kept: they only expire.
    legacy: HashMap<[u8; 64], u64>,
    /// Signatures remembered in `owners`.
    total: usize,
    /// Owner keys by how many signatures they hold, to find the one holding the most.
    by_count: BTreeSet<(usize, [u8; 32])>,
    /// The second of the last sweep of expired signatures (at most one a second).
    swept_at: u64,
    /// Store changes the next [`ReplayGuard::persist`] commits: refs of forgotten
    /// signatures to delete, and owner keys whose floor rose.
    forgotten: Vec<([u8; 32], u128)>,
    floors_raised: std::collections::HashSet<[u8; 32]>,
    /// Parked owner keys (out of `owners`): their floors.
    parked: HashMap<[u8; 32], u64>,
    /// Keys in `owners` holding only a floor (no signature): parked first.
    idle: BTreeSet<[u8; 32]>,
    /// Floors of keys parked since the last store changes: (key, floor, floor stored
    /// before, 0 for none).
    parked_floors: Vec<([u8; 32], u64, u64)>,
}

/// One owner key's remembered signatures (by [`sig_id`]: when each leaves the window) and
/// its floor.
#[derive(Default)]
struct OwnerSigs {
    sigs: HashMap<u128, u64>,
    order: BTreeSet<(u64, u128)>,
    /// Signatures of this key expiring at or before this second were forgotten early:
    /// requests dated so are refused.
    floor: u64,
    /// The floor whose ref the last store changes wrote (0: none).
    stored_floor: u64,
}

/// A signature's name within its owner key's table: 128 bits of its BLAKE3 hash. Two
/// signatures of one key sharing it (a 2^-128 chance, or a signer reusing its own nonce
/// on purpose) make the second look like a replay: refused, never wrongly accepted.
fn sig_id(sig: &[u8; 64]) -> u128 {
    let h = HashAlgo::Blake3.digest(sig);
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.digest()[..16]);
    u128::from_le_bytes(b)
}

/// Why [`Seen::admit`] refused a signature.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Accepted before: a replay.
    Replayed,
    /// Dated at or before its key's floor.
    BelowFloor(u64),
    /// Out of the window by the latest clock the table has seen.
    Expired,
    /// Too many owner keys hold signatures or floors.
    Full,
}

impl Seen {
    fn count(&self, owner: &[u8; 32]) -> usize {
        self.owners.get(owner).map_or(0, |o| o.order.len())
    }

    fn floor(&self, owner: &[u8; 32]) -> u64 {
        match self.owners.get(owner) {
            Some(o) => o.floor,
            None => self.parked.get(owner).copied().unwrap_or(0),
        }
    }

    /// Records `sig` of `owner` as used until `expires`, making room as [`ReplayGuard`]
    /// says.
    fn admit(
        &mut self,
        owner: &[u8; 32],
        sig: &[u8; 64],
        expires: u64,
        now: u64,
        limits: Limits,
    ) -> Result<(), Refusal> {
        // Out of the window at this request's own clock, as `check` judges it (a request
        // that read the clock before a long wait for the lock).
        if expires < now {
            return Err(Refusal::Expired);
        }
        let id = sig_id(sig);
        let seen_before = self.legacy.get(sig).is_some_and(|e| *e >= now)
            || self
                .owners
                .get(owner)
                .and_then(|o| o.sigs.get(&id))
                .is_some_and(|e| *e >= now);
        if seen_before {
            return Err(Refusal::Replayed);
        }
        // A request refused by its floor makes no room: checked before anything is
        // forgotten (below, only what the requester's own key forgets can refuse it).
        if expires <= self.floor(owner) {
            return Err(Refusal::BelowFloor(self.floor(owner)));
        }
        let new_owner = |seen: &Seen| !seen.owners.contains_key(owner);
        let full = |seen: &Seen| {
            seen.total + seen.legacy.len() >= limits.max
                || seen.count(owner) >= limits.per_owner
                || (seen.owners.len() >= limits.owners && new_owner(seen))
        };
        if full(self) && self.swept_at != now {
            self.sweep(now);
        }
        if self.owners.len() >= limits.owners && new_owner(self) {
            // Room for this key: park the one holding the fewest signatures, unless the
            // parked keys are as many as may be.
            // (A parked key coming back frees its own place among them.)
            let room = self.parked.len() < limits.parked || self.parked.contains_key(owner);
            if !room || !self.park_one() {
                return Err(Refusal::Full);
            }
        }
        if self.count(owner) >= limits.per_owner {
            self.forget_oldest(owner);
        }
        if self.total + self.legacy.len() >= limits.max {
            // The key holding the most gives way; legacy signatures only expire.
            let Some(&(_, heaviest)) = self.by_count.last() else {
                return Err(Refusal::Full);
            };
            self.forget_oldest(&heaviest);
        }
        // What this key just forgot may reach past this request's date (it is older than
        // the key's oldest eighth).
        if expires <= self.floor(owner) {
            return Err(Refusal::BelowFloor(self.floor(owner)));
        }
        self.insert(owner, id, expires);
        Ok(())
    }

    /// Parks a key holding only a floor, or else the owner key holding the fewest
    /// signatures: its signatures are forgotten, its floor rises past
    /// them and is all that is kept. False when the table holds no key.
    fn park_one(&mut self) -> bool {
        let victim = match (self.idle.first(), self.by_count.first()) {
            (Some(k), _) => *k,
            (None, Some(&(_, k))) => k,
            (None, None) => match self.owners.keys().next() {
                Some(k) => *k,
                None => return false,
            },
        };
        let Some(o) = self.owners.remove(&victim) else {
            return false;
        };
        let n = o.order.len();
        let mut floor = o.floor;
        for (exp, id) in o.order {
            floor = floor.max(exp);
            self.forgotten.push((victim, id));
        }
        self.total -= n;
        self.by_count.remove(&(n, victim));
        self.floors_raised.remove(&victim);
        self.idle.remove(&victim);
        if floor != o.stored_floor || n > 0 {
            self.parked_floors.push((victim, floor, o.stored_floor));
        }
        if floor > 0 {
            self.parked.insert(victim, floor);
        }
        true
    }

    /// Adds a signature of `owner` whatever the limits (an expired one of the same id is
    /// replaced).
    fn insert(&mut self, owner: &[u8; 32], id: u128, expires: u64) {
        if !self.owners.contains_key(owner)
            && let Some(floor) = self.parked.remove(owner)
        {
            // Back from the parked keys: its floor comes along (stored already).
            self.owners.insert(
                *owner,
                OwnerSigs {
                    floor,
                    stored_floor: floor,
                    ..OwnerSigs::default()
                },
            );
        }
        let o = self.owners.entry(*owner).or_default();
        let before = o.order.len();
        match o.sigs.insert(id, expires) {
            Some(old) => {
                o.order.remove(&(old, id));
            }
            None => self.total += 1,
        }
        o.order.insert((expires, id));
        let after = o.order.len();
        self.recount(owner, before, after);
    }

    /// Moves `owner` in `by_count` from `before` to `after` signatures.
    fn recount(&mut self, owner: &[u8; 32], before: usize, after: usize) {
        if before != after {
            self.by_count.remove(&(before, *owner));
            if after > 0 {
                self.by_count.insert((after, *owner));
                self.idle.remove(owner);
            } else {
                self.idle.insert(*owner);
            }
        }
    }

    /// Forgets the oldest eighth (at least one) of `owner`'s signatures and raises its
    /// floor to the latest expiry forgotten.
    fn forget_oldest(&mut self, owner: &[u8; 32]) {
        let Some(o) = self.owners.get_mut(owner) else {
            return;
        };
        let before = o.order.len();
        for _ in 0..(before / 8).max(1) {
            let Some((exp, id)) = o.order.pop_first() else {
                break;
            };
            o.sigs.remove(&id);
            o.floor = o.floor.max(exp);
            self.forgotten.push((*owner, id));
        }
        self.floors_raised.insert(*owner);
        let after = o.order.len();
        self.total -= before - after;
        self.recount(owner, before, after);
    }

    /// The store changes owed since the last call: deletes of forgotten signatures' refs,
    /// and the raised floors.
    fn take_store_changes(&mut self) -> Vec<RefUpdate> {
        // Every key whose forgotten signatures' refs this batch deletes gets its floor ref
        // in the same batch, stored already or not: the commit that stored it may not
        // have landed yet (commits land in any order), and a crash between the two must
        // not leave the deletes without the floor that refuses those signatures.
        let mut needs_floor: BTreeSet<[u8; 32]> = self.forgotten.iter().map(|(o, _)| *o).collect();
        let mut out: Vec<RefUpdate> = self
            .forgotten
            .drain(..)
            .map(|(o, id)| RefUpdate::Delete {
                name: replay_ref(&o, id),
            })
            .collect();
        for (o, floor, stored) in self.parked_floors.drain(..) {
            out.push(RefUpdate::Set {
                name: floor_ref(&o, floor),
                value: Vec::new(),
            });
            if stored != 0 && stored != floor {
                out.push(RefUpdate::Delete {
                    name: floor_ref(&o, stored),
                });
            }
            needs_floor.remove(&o);
        }
        needs_floor.extend(std::mem::take(&mut self.floors_raised));
        for o in needs_floor {
            if let Some(entry) = self.owners.get_mut(&o) {
                if entry.floor == 0 {
                    continue;
                }
                out.push(RefUpdate::Set {
                    name: floor_ref(&o, entry.floor),
                    value: Vec::new(),
                });
                if entry.stored_floor != 0 && entry.stored_floor != entry.floor {
                    out.push(RefUpdate::Delete {
                        name: floor_ref(&o, entry.stored_floor),
                    });
                }
                entry.stored_floor = entry.floor;
            } else if let Some(&floor) = self.parked.get(&o) {
                // Parked: its floor ref is this one (stored, or in `parked_floors` above).
                out.push(RefUpdate::Set {
                    name: floor_ref(&o, floor),
                    value: Vec::new(),
                });
            }
            // Neither: swept meanwhile, its floor out of every window.
        }
        out
    }

    /// Drops the signatures expired at `now`, and the floors no request can reach any more.
    fn sweep(&mut self, now: u64) {
        self.swept_at = now;
        // What left the window less than SWEEP_GRACE_SECS ago is kept: a request judged
        // at an earlier clock reading (read before a wait for the lock, or a clock stepped
        // back by up to that much) still finds every signature it could replay.
        let now = now.saturating_sub(SWEEP_GRACE_SECS);
        self.legacy.retain(|_, e| *e >= now);
        let mut changed = Vec::new();
        self.owners.retain(|key, o| {
            let before = o.order.len();
            while let Some(&(exp, id)) = o.order.first()
                && exp < now
            {
                o.order.pop_first();
                o.sigs.remove(&id);
            }
            if o.order.len() != before {
                changed.push((*key, before, o.order.len()));
            }
            !o.order.is_empty() || o.floor >= now
        });
        self.parked.retain(|_, floor| *floor >= now);
        for (key, before, after) in changed {
            self.total -= before - after;
            self.recount(&key, before, after);
        }
        // Keys the sweep dropped whole are idle no more.
        let owners = &self.owners;
        self.idle.retain(|k| owners.contains_key(k));
    }
}

/// How long signatures and floors are kept past the window: a clock reading (or the clock
/// itself) may go back by this much without reopening what the table dropped. A clock
/// stepped back further can let a signature dropped meanwhile be replayed once.
pub const SWEEP_GRACE_SECS: u64 = 300;

/// The table's bounds (the constants above; smaller in tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    max: usize,
    per_owner: usize,
    owners: usize,
    parked: usize,
}

const LIMITS: Limits = Limits {
    max: MAX_REMEMBERED,
    per_owner: MAX_PER_OWNER,
    owners: MAX_OWNERS,
    parked: MAX_PARKED,
};

impl ReplayGuard {
    /// The guard with the signatures and floors an earlier run of the node persisted that
    /// are still in the window at `now`, within the table's limits (what does not fit is
    /// forgotten as at run time, raising floors); expired and forgotten refs are removed.
    pub fn load(store: &dyn RefStore, now: u64) -> cairn_core::Result<Self> {
        Self::load_within(store, now, LIMITS)
    }

    fn load_within(store: &dyn RefStore, now: u64, limits: Limits) -> cairn_core::Result<Self> {
        let guard = ReplayGuard::default();
        let mut updates = Vec::new();
        {
            let mut seen = guard.seen.lock();
            seen.swept_at = now;
            for (name, _) in store.list_refs(REPLAY_FLOOR_REFS)? {
                let Some((owner, f)) = parse_floor_ref(&name) else {
                    continue; // not a ref this module wrote
                };
                if f < now.saturating_sub(SWEEP_GRACE_SECS) {
                    updates.push(RefUpdate::Delete {
                        name: name.to_vec(),
                    });
                    continue;
                }
                let o = seen.owners.entry(owner).or_default();
                if f > o.floor {
                    // Only the highest floor ref of a key is kept.
                    if o.stored_floor != 0 {
                        updates.push(RefUpdate::Delete {
                            name: floor_ref(&owner, o.stored_floor),
                        });
                    }
                    o.floor = f;
                    o.stored_floor = f;
                } else {
                    updates.push(RefUpdate::Delete {
                        name: name.to_vec(),
                    });
                }
            }
            for (name, value) in store.list_refs(REPLAY_REFS)? {
                let rest = &name[REPLAY_REFS.len()..];
                let (owner, id, legacy, exp) = match rest.len() {
                    48 => {
                        let owner = <[u8; 32]>::try_from(&rest[..32]).ok();
                        let id = <[u8; 16]>::try_from(&rest[32..])
                            .ok()
                            .map(u128::from_le_bytes);
                        (owner, id, None, le_u64(&value))
                    }
                    64 => {
                        let sig = <[u8; 64]>::try_from(rest).ok();
                        let owner = value.get(8..40).and_then(|o| <[u8; 32]>::try_from(o).ok());
                        match (sig, owner) {
                            (Some(sig), Some(o)) => {
                                (Some(o), Some(sig_id(&sig)), None, le_u64(&value))
                            }
                            (Some(sig), None) if value.len() == 8 => {
                                (None, None, Some(sig), le_u64(&value))
                            }
                            _ => continue,
                        }
                    }
                    _ => continue, // not a ref this module wrote
                };
                let Some(exp) = exp else { continue };
                let below_floor = owner.is_some_and(|o| exp <= seen.floor(&o));
                if exp < now.saturating_sub(SWEEP_GRACE_SECS) || below_floor {
                    updates.push(RefUpdate::Delete {
                        name: name.to_vec(),
                    });
                    continue;
                }
                match (owner, id, legacy) {
                    (Some(o), Some(id), _) => seen.insert(&o, id, exp),
                    (_, _, Some(sig)) => {
                        seen.legacy.insert(sig, exp);
                    }
                    _ => {}
                }
            }
            seen.owners
                .retain(|_, o| !o.order.is_empty() || o.floor >= now);
            seen.idle = seen
                .owners
                .iter()
                .filter(|(_, o)| o.order.is_empty())
                .map(|(k, _)| *k)
                .collect();
            // Keys past the table's share (parked ones come back as floors) are parked
            // again, as at run time: those holding only a floor (stored already) first.
            while seen.owners.len() > limits.owners && seen.park_one() {}
            seen.owners.shrink_to_fit();
            // The limits of this run, as at run time.
            let heavy: Vec<[u8; 32]> = seen
                .by_count
                .iter()
                .rev()
                .take_while(|(n, _)| *n > limits.per_owner)
                .map(|(_, k)| *k)
                .collect();
            for k in heavy {
                while seen.count(&k) > limits.per_owner {
                    seen.forget_oldest(&k);
                }
            }
            while seen.total + seen.legacy.len() > limits.max {
                let Some(&(_, heaviest)) = seen.by_count.last() else {
                    break;
                };
                seen.forget_oldest(&heaviest);
            }
            updates.extend(seen.take_store_changes());
        }
        if !updates.is_empty() {
            store.commit(&updates)?;
        }
        Ok(guard)
    }

    /// Commits an accepted signature to `store` (blocking: run it off the runtime, before
    /// the request's write), with the refs of signatures forgotten since the last commit
    /// deleted and the floors raised meanwhile written, in the same commit (until it lands,
    /// a restart remembers the forgotten signatures again); now and then removes the
    /// expired ones.
    pub fn persist(&self, store: &dyn RefStore, c: &Checked, now: u64) -> cairn_core::Result<()> {
        let mut updates = vec![RefUpdate::Set {
            name: replay_ref(&c.owner, sig_id(&c.signature)),
            value: c.expires.to_le_bytes().to_vec(),
        }];
        updates.extend(self.seen.lock().take_store_changes());
        store.commit(&updates)?;
        let n = self
            .persisted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % SWEEP_EVERY == SWEEP_EVERY - 1 {
            sweep_refs(store, now)?;
        }
        Ok(())
    }
}

/// Deletes the replay refs whose signature is out of the window at `now`, and the floor
/// refs whose floor is past. A floor ref never changes, so deleting one whose floor is past
/// is right whatever commits land meanwhile.
fn sweep_refs(store: &dyn RefStore, now: u64) -> cairn_core::Result<()> {
    let now = now.saturating_sub(SWEEP_GRACE_SECS);
    let mut expired = Vec::new();
    for (name, value) in store.list_refs(REPLAY_REFS)? {
        if le_u64(&value).is_some_and(|e| e < now) {
            expired.push(RefUpdate::Delete {
                name: name.to_vec(),
            });
        }
    }
    for (name, _) in store.list_refs(REPLAY_FLOOR_REFS)? {
        if parse_floor_ref(&name).is_some_and(|(_, f)| f < now) {
            expired.push(RefUpdate::Delete {
                name: name.to_vec(),
            });
        }
    }
    if !expired.is_empty() {
        store.commit(&expired)?;
    }
    Ok(())
}

impl ReplayGuard {
    /// Records `sig` of `owner` as used until `expires`; false when it was used already.
    /// 401 when it is dated at or before `owner`'s floor, 503 when the table holds as many
    /// owner keys as it may (see [`ReplayGuard`]).
    fn first_use(
        &self,
        owner: &[u8; 32],
        sig: [u8; 64],
        expires: u64,
        now: u64,
    ) -> ApiResult<bool> {
        self.first_use_within(owner, sig, expires, now, LIMITS)
    }

    fn first_use_within(
        &self,
        owner: &[u8; 32],
        sig: [u8; 64],
        expires: u64,
        now: u64,
        limits: Limits,
    ) -> ApiResult<bool> {
        match self.seen.lock().admit(owner, &sig, expires, now, limits) {
            Ok(()) => Ok(true),
            Err(Refusal::Replayed) => Ok(false),
            Err(Refusal::Expired) => Err(ApiError::unauthorized(format!(
                "{DATE_HEADER} left the {WINDOW_SECS} s window while the request waited; sign \
                 it anew"
            ))),
            Err(Refusal::BelowFloor(floor)) => Err(ApiError::unauthorized(format!(
                "this owner key signs more requests than the node remembers, and it no longer \
                 remembers those dated {} or earlier: sign the request anew with the current \
                 time",
                floor.saturating_sub(WINDOW_SECS)
            ))),
            Err(Refusal::Full) => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "too many owner keys signed requests in the replay window; retry shortly",
            )
            .with_header(header::RETRY_AFTER, header::HeaderValue::from_static("5"))),
        }
    }
}

fn header_bytes<'h>(headers: &'h HeaderMap, name: &str) -> &'h [u8] {
    headers.get(name).map(|v| v.as_bytes()).unwrap_or_default()
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> ApiResult<&'h str> {
    let v = headers
        .get(name)
        .ok_or_else(|| ApiError::unauthorized(format!("header {name} is missing")))?;
    v.to_str()
        .map_err(|_| ApiError::unauthorized(format!("header {name} is not ASCII text")))
}

/// The body hash a signed request names ([`BODY_HASH_HEADER`]), for a caller that holds
/// the whole body to compare before [`check`] takes the signature's place against replays.
pub fn signed_body_hash(headers: &HeaderMap) -> ApiResult<[u8; 32]> {
    let mut body_hash = [0u8; 32];
    hex::decode_to_slice(
        header_str(headers, BODY_HASH_HEADER)?.trim(),
        &mut body_hash,
    )
    .map_err(|_| ApiError::unauthorized(format!("{BODY_HASH_HEADER} must be 64 hex digits")))?;
    Ok(body_hash)
}

/// Checks that a request is signed by `owner` (see the module documentation) at `now`,
/// for the bucket whose capsule is `capsule` when known (a request bound to another
/// capsule is refused).
/// Returns the BLAKE3 hash the body must have (the caller checks it while reading the
/// body) and the signature, which the caller persists ([`ReplayGuard::persist`]) before
/// it writes anything.
pub fn check(
    owner: &PublicKey,
    capsule: Option<&str>,
    replay: &ReplayGuard,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    now: u64,
) -> ApiResult<Checked> {
    let auth = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized(format!(
            "this bucket has an owner key: sign the request ({SCHEME}, see /openapi.json)"
        ))
    })?;
    // The signature covers one value of each of these: a second one (added on the way)
    // could change what the request does (a second Content-Type makes a JSON body a blob)
    // while the signature still verifies.
    for name in [
        header::AUTHORIZATION.as_str(),
        DATE_HEADER,
        BODY_HASH_HEADER,
        header::CONTENT_TYPE.as_str(),
        header::IF_MATCH.as_str(),
        CONTEXT_HEADER,
        NONCE_HEADER,
        CAPSULE_HEADER,
    ] {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(ApiError::unauthorized(format!(
                "header {name} appears more than once; a signed request carries each header \
                 it signs once"
            )));
        }
    }
    let auth = auth
        .to_str()
        .map_err(|_| ApiError::unauthorized("the Authorization header is not ASCII text"))?;
    let sig_hex = auth
        .strip_prefix(SCHEME)
        .and_then(|s| s.strip_prefix(' '))
        .ok_or_else(|| {
            ApiError::unauthorized(format!("the Authorization scheme must be {SCHEME}"))
        })?;
    let mut sig_raw = [0u8; 64];
    hex::decode_to_slice(sig_hex.trim(), &mut sig_raw)
        .map_err(|_| ApiError::unauthorized("the signature must be 128 hex digits (64 bytes)"))?;
    let sig = Signature::from_raw(&sig_raw)
        .map_err(|e| ApiError::unauthorized(format!("bad signature: {e}")))?;
    let date: u64 = header_str(headers, DATE_HEADER)?
        .trim()
        .parse()
        .map_err(|_| {
            ApiError::unauthorized(format!("{DATE_HEADER} must be whole seconds since 1970"))
        })?;
    if date.abs_diff(now) > WINDOW_SECS {
        return Err(ApiError::unauthorized(format!(
            "{DATE_HEADER} {date} is more than {WINDOW_SECS} s from the node's clock ({now})"
        )));
    }
    let body_hash = signed_body_hash(headers)?;
    let nonce = header_bytes(headers, NONCE_HEADER);
    if headers.contains_key(NONCE_HEADER)
        && (nonce.is_empty()
            || nonce.len() > MAX_NONCE_LEN
            || !nonce
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_'))
    {
        return Err(ApiError::unauthorized(format!(
            "{NONCE_HEADER} must be 1 to {MAX_NONCE_LEN} characters from A-Z a-z 0-9 - _"
        )));
    }
    let bound = header_bytes(headers, CAPSULE_HEADER);
    if headers.contains_key(CAPSULE_HEADER) {
        let named = std::str::from_utf8(bound).unwrap_or_default();
        match capsule {
            Some(c) if named != c => {
                return Err(ApiError::unauthorized(format!(
                    "the request was signed for capsule {named:?}, and this bucket's capsule \
                     is {c} (a request for a bucket on another node?)"
                )));
            }
            _ if named.is_empty() => {
                return Err(ApiError::unauthorized(format!(
                    "{CAPSULE_HEADER} must name the bucket's capsule"
                )));
            }
            _ => {}
        }
    }
    let path_and_query = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or_else(|| uri.path());
    let req = RequestToSign {
        method: method.as_str(),
        path_and_query,
        unix_secs: date,
        body_blake3: body_hash,
        content_type: header_bytes(headers, header::CONTENT_TYPE.as_str()),
        if_match: header_bytes(headers, header::IF_MATCH.as_str()),
        context: header_bytes(headers, CONTEXT_HEADER),
        nonce,
        capsule: bound,
    };
    owner.verify(DOMAIN, &req.message(), &sig).map_err(|_| {
        ApiError::unauthorized(format!(
            "the signature does not verify under the bucket's owner key {owner}"
        ))
    })?;
    let expires = date.saturating_add(WINDOW_SECS);
    if !replay.first_use(owner.raw(), sig_raw, expires, now)? {
        return Err(ApiError::unauthorized(
            "this signature was used already (replayed request); sign each request anew",
        ));
    }
    Ok(Checked {
        body_blake3: body_hash,
        signature: sig_raw,
        expires,
        owner: *owner.raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &SigningKey, date: u64, body: &[u8]) -> (Uri, HeaderMap) {
        request_with_nonce(key, date, body, b"")
    }

    fn request_with_nonce(
        key: &SigningKey,
        date: u64,
        body: &[u8],
        nonce: &[u8],
    ) -> (Uri, HeaderMap) {
        request_bound(key, date, body, nonce, b"")
    }

    fn request_bound(
        key: &SigningKey,
        date: u64,
        body: &[u8],
        nonce: &[u8],
        capsule: &[u8],
    ) -> (Uri, HeaderMap) {
        let uri: Uri = "/v1/buckets/b/objects/k?branch=dev".parse().unwrap();
        let req = RequestToSign {
            method: "PUT",
            path_and_query: "/v1/buckets/b/objects/k?branch=dev",
            unix_secs: date,
            body_blake3: body_blake3(body),
            content_type: b"text/plain",
            if_match: b"",
            context: b"",
            nonce,
            capsule,
        };
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        for (n, v) in req.sign(key) {
            h.insert(n, v.parse().unwrap());
        }
        (uri, h)
    }

    #[test]
    fn message_layout_is_the_documented_one() {
        let req = RequestToSign {
            method: "POST",
            path_and_query: "/x?y=1",
            unix_secs: 7,
            body_blake3: body_blake3(b""),
            content_type: b"application/json",
            if_match: b"\"u\"",
            context: b"c",
            nonce: b"",
            capsule: b"",
        };
        let expected = format!(
            "CAIRN-ED25519-V1\nPOST\n/x?y=1\n7\n{}\napplication/json\n\"u\"\nc",
            // BLAKE3 of the empty string.
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(req.message(), expected.as_bytes());
        // The signed bytes are len(D) ‖ D ‖ M, checkable with the key alone.
        let key = SigningKey::from_seed(&[3; 32]);
        let h = req.sign(&key);
        assert_eq!(h.len(), 3, "no nonce header without a nonce");
        let sig_hex = h[0].1.strip_prefix("Cairn-Ed25519 ").unwrap();
        let sig = Signature::from_raw(&hex::decode(sig_hex).unwrap()).unwrap();
        key.public()
            .verify(DOMAIN, expected.as_bytes(), &sig)
            .unwrap();
        // A nonce is one more line, and one more header.
        let with = RequestToSign {
            nonce: b"n-1_A",
            ..req
        };
        assert_eq!(with.message(), format!("{expected}\nn-1_A").as_bytes());
        let h = with.sign(&key);
        assert_eq!(h[3], (NONCE_HEADER, "n-1_A".to_string()));
        // A capsule is one more line after the nonce's (empty without a nonce), and one
        // more header.
        let bound = RequestToSign {
            capsule: b"cap",
            ..with
        };
        assert_eq!(
            bound.message(),
            format!("{expected}\nn-1_A\ncap").as_bytes()
        );
        let bound = RequestToSign {
            nonce: b"",
            ..bound
        };
        assert_eq!(bound.message(), format!("{expected}\n\ncap").as_bytes());
        assert_eq!(bound.sign(&key)[3], (CAPSULE_HEADER, "cap".to_string()));
    }

    /// A header the signature covers, sent twice, is refused before anything is taken: the
    /// signature covers one value, and a second Content-Type would make a JSON body a
    /// blob. The same request with each header once then passes.
    #[test]
    fn a_signed_header_sent_twice_is_refused() {
        let key = SigningKey::from_seed(&[8; 32]);
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        let (uri, h) = request_with_nonce(&key, now, b"x", b"n1");
        for (name, extra) in [
            (header::CONTENT_TYPE.as_str(), "application/json"),
            (header::IF_MATCH.as_str(), "\"u\""),
            (CONTEXT_HEADER, "c"),
            (NONCE_HEADER, "n2"),
            (DATE_HEADER, "1700000001"),
            (CAPSULE_HEADER, "blake3:aaaa"),
        ] {
            let mut twice = h.clone();
            // Once present (nonce, date) or not (If-Match, context, capsule): a second copy
            // of a header it lacks is then the first of two below.
            if !twice.contains_key(name) {
                twice.append(name, header::HeaderValue::from_static("first"));
            }
            twice.append(name, extra.parse().unwrap());
            let e =
                check(&key.public(), None, &guard, &Method::PUT, &uri, &twice, now).unwrap_err();
            assert!(
                e.message.contains("more than once"),
                "{name}: {}",
                e.message
            );
        }
        check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap();
    }

    /// A request bound to a capsule is accepted for that capsule only; the binding is
    /// signed (dropping or changing the header breaks the signature).
    #[test]
    fn a_request_bound_to_a_capsule_is_refused_for_another() {
        let key = SigningKey::from_seed(&[6; 32]);
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        let signed = |nonce: &[u8], capsule: &[u8]| request_bound(&key, now, b"x", nonce, capsule);
        let here = "blake3:aaaa";
        let (uri, h) = signed(b"n1", here.as_bytes());
        let e = check(
            &key.public(),
            Some("blake3:bbbb"),
            &guard,
            &Method::PUT,
            &uri,
            &h,
            now,
        )
        .unwrap_err();
        assert!(e.message.contains("another node"), "{}", e.message);
        check(
            &key.public(),
            Some(here),
            &guard,
            &Method::PUT,
            &uri,
            &h,
            now,
        )
        .unwrap();
        let (uri, mut h) = signed(b"n2", here.as_bytes());
        h.remove(CAPSULE_HEADER);
        let e = check(
            &key.public(),
            Some(here),
            &guard,
            &Method::PUT,
            &uri,
            &h,
            now,
        )
        .unwrap_err();
        assert!(e.message.contains("does not verify"), "{}", e.message);
        // Unbound requests (older clients) still pass.
        let (uri, h) = signed(b"n3", b"");
        check(
            &key.public(),
            Some(here),
            &guard,
            &Method::PUT,
            &uri,
            &h,
            now,
        )
        .unwrap();
    }

    #[test]
    fn nonces_let_identical_requests_through_and_are_checked() {
        let key = SigningKey::from_seed(&[4; 32]);
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        // Two identical requests in the same second, told apart by their nonces.
        for nonce in [&b"aaaa"[..], b"bbbb"] {
            let (uri, h) = request_with_nonce(&key, now, b"same", nonce);
            check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap();
        }
        // Each is still accepted once.
        let (uri, h) = request_with_nonce(&key, now, b"same", b"aaaa");
        let e = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap_err();
        assert!(e.message.contains("replayed"), "{}", e.message);
        // The nonce is signed: changing or dropping it breaks the signature.
        let (uri, mut h) = request_with_nonce(&key, now, b"same", b"cccc");
        h.insert(NONCE_HEADER, "dddd".parse().unwrap());
        let e = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap_err();
        assert!(e.message.contains("does not verify"), "{}", e.message);
        let (uri, mut h) = request_with_nonce(&key, now, b"same", b"eeee");
        h.remove(NONCE_HEADER);
        assert!(check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).is_err());
        // Malformed nonces are refused before the signature is looked at.
        for bad in ["", "a b", "a\tb", &"x".repeat(MAX_NONCE_LEN + 1)] {
            let (uri, mut h) = request_with_nonce(&key, now, b"same", b"ffff");
            h.insert(NONCE_HEADER, bad.parse().unwrap());
            let e = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap_err();
            assert!(e.message.contains(NONCE_HEADER), "{bad:?}: {}", e.message);
        }
    }

    fn sig(i: u32) -> [u8; 64] {
        let mut s = [0u8; 64];
        s[..4].copy_from_slice(&i.to_le_bytes());
        s
    }

    /// Room for two signatures: a third makes the table sweep.
    const TINY: Limits = Limits {
        max: 2,
        per_owner: 2,
        owners: 4,
        parked: 2,
    };

    const SMALL: Limits = Limits {
        max: 16,
        per_owner: 8,
        owners: 4,
        parked: 2,
    };

    /// One owner key past its share forgets its own oldest signatures (its floor rises to
    /// the latest of them), not other keys': its requests signed now still pass, one dated
    /// at or before the floor is refused (every replay of a forgotten signature with it),
    /// and nothing is refused with 503.
    #[test]
    fn a_key_past_its_share_forgets_its_oldest_signatures() {
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let use_at = |owner: &[u8; 32], i: u32, expires: u64, now: u64| {
            guard.first_use_within(owner, sig(i), expires, now, SMALL)
        };
        assert!(use_at(&b, 1000, now + 300, now).unwrap());
        // a signs 8 requests dated over 8 seconds: its share is full.
        for i in 0..8 {
            assert!(use_at(&a, i, now + 300 + i as u64, now + i as u64).unwrap());
        }
        // The ninth forgets the oldest (one eighth of 8), expiring at now + 300.
        let t = now + 8;
        assert!(use_at(&a, 8, t + 300, t).unwrap());
        assert_eq!(guard.seen.lock().count(&a), 8);
        assert_eq!(guard.seen.lock().owners[&a].floor, now + 300);
        // A replay of the forgotten signature is refused by the floor; of a remembered one,
        // as a replay.
        let e = use_at(&a, 0, now + 300, t).unwrap_err();
        assert_eq!(e.status, 401);
        assert!(e.message.contains("sign the request anew"), "{}", e.message);
        assert!(!use_at(&a, 1, now + 301, t).unwrap());
        // A new request dated at the floor's second is refused too; one dated later passes.
        assert_eq!(use_at(&a, 50, now + 300, t).unwrap_err().status, 401);
        assert!(use_at(&a, 51, t + 300, t).unwrap());
        // b was not touched.
        assert_eq!(guard.seen.lock().count(&b), 1);
        assert!(!use_at(&b, 1000, now + 300, t).unwrap());
        assert_eq!(guard.seen.lock().owners[&b].floor, 0);
    }

    /// When the whole table is full, the key holding the most signatures gives way (the
    /// flooder), and an honest key's requests are accepted, not refused with 503.
    #[test]
    fn a_full_table_takes_room_from_the_key_holding_the_most() {
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        let keys: Vec<[u8; 32]> = (1..=3u8).map(|k| [k; 32]).collect();
        let honest = [9u8; 32];
        // Three flooding keys fill the table (16) with 6, 5 and 5 signatures.
        let mut i = 0;
        for (k, n) in keys.iter().zip([6, 5, 5]) {
            for _ in 0..n {
                assert!(
                    guard
                        .first_use_within(k, sig(i), now + 300, now, SMALL)
                        .unwrap()
                );
                i += 1;
            }
        }
        assert_eq!(guard.seen.lock().total, 16);
        // The honest key's request takes the room of the first key's oldest signature.
        assert!(
            guard
                .first_use_within(&honest, sig(100), now + 300, now, SMALL)
                .unwrap()
        );
        let seen = guard.seen.lock();
        assert_eq!(seen.total, 16);
        assert_eq!(seen.count(&keys[0]), 5);
        assert_eq!(seen.owners[&keys[0]].floor, now + 300);
        assert_eq!(seen.count(&honest), 1);
        assert_eq!(seen.owners[&honest].floor, 0);
        drop(seen);
        // Past MAX_OWNERS keys (4 here) a new key parks the one holding the fewest
        // signatures (here the honest key): it forgets them and keeps a floor past them,
        // so a replay is refused and its later requests pass.
        let use_at = |k: u8, i: u32, expires: u64| {
            guard.first_use_within(&[k; 32], sig(i), expires, now, SMALL)
        };
        assert!(use_at(7, 200, now + 300).unwrap());
        assert_eq!(guard.seen.lock().parked.get(&honest), Some(&(now + 300)));
        let e = use_at(9, 100, now + 300).unwrap_err();
        assert!(e.message.contains("sign the request anew"), "{}", e.message);
        assert!(use_at(9, 101, now + 301).unwrap());
        assert!(!guard.seen.lock().parked.contains_key(&honest));
        assert_eq!(guard.seen.lock().floor(&honest), now + 300);
        assert!(!use_at(9, 101, now + 301).unwrap(), "a replay");
        // Past MAX_PARKED parked keys (2 here) a key the table holds nothing for gets
        // 503, until the parked floors leave the window.
        assert!(use_at(10, 300, now + 300).unwrap());
        assert_eq!(guard.seen.lock().parked.len(), 2);
        let e = use_at(11, 301, now + 300).unwrap_err();
        assert_eq!(e.status, 503);
        assert!(e.message.contains("owner keys"), "{}", e.message);
        let later = now + 302 + SWEEP_GRACE_SECS;
        assert!(
            guard
                .first_use_within(&[11u8; 32], sig(302), later + 300, later, SMALL)
                .unwrap()
        );
        let seen = guard.seen.lock();
        assert_eq!(seen.total, 1);
        assert_eq!(seen.owners.len(), 1);
        assert_eq!(seen.by_count.len(), 1);
        assert!(seen.parked.is_empty());
    }

    /// Whatever the order of requests, owners, dates and sweeps, no signature is accepted
    /// twice while its date is in the window, and the table's indexes stay in step with
    /// its signatures within its limits (a model check with small limits).
    #[test]
    fn the_replay_table_never_accepts_a_replay_and_stays_consistent() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let guard = ReplayGuard::default();
        let mut now = 1_700_000_000u64;
        let limits = Limits {
            max: 40,
            per_owner: 12,
            owners: 6,
            parked: 4,
        };
        // Every signature made: its owner, its expiry, and whether it was accepted.
        let mut made: Vec<([u8; 32], u64, bool)> = Vec::new();
        let (mut accepted, mut replays_refused) = (0, 0);
        for step in 0..20_000u32 {
            if rng.random_ratio(1, 50) {
                now += rng.random_range(1..=40);
            }
            let id = if made.is_empty() || rng.random_ratio(1, 2) {
                // A new signature, dated within the window of `now` (some of it ahead).
                let owner = [rng.random_range(0..8u8); 32];
                let date = now + rng.random_range(0..=WINDOW_SECS + 30) - WINDOW_SECS;
                made.push((owner, date + WINDOW_SECS, false));
                made.len() - 1
            } else {
                rng.random_range(0..made.len())
            };
            let (owner, expires, before) = made[id];
            if expires < now {
                continue; // out of the window: `check` refuses it before the table
            }
            let got = guard.first_use_within(&owner, sig(id as u32), expires, now, limits);
            if before {
                assert!(
                    !matches!(got, Ok(true)),
                    "step {step}: a replay was accepted"
                );
                replays_refused += 1;
            } else if matches!(got, Ok(true)) {
                made[id].2 = true;
                accepted += 1;
            }
            let seen = guard.seen.lock();
            let owned: usize = seen.owners.values().map(|o| o.order.len()).sum();
            assert_eq!(owned, seen.total, "step {step}");
            assert!(seen.total <= limits.max, "step {step}");
            assert!(seen.owners.len() <= limits.owners, "step {step}");
            assert!(seen.parked.len() <= limits.parked, "step {step}");
            let idle: BTreeSet<[u8; 32]> = seen
                .owners
                .iter()
                .filter(|(_, o)| o.order.is_empty())
                .map(|(k, _)| *k)
                .collect();
            assert_eq!(seen.idle, idle, "step {step}");
            for k in seen.parked.keys() {
                assert!(!seen.owners.contains_key(k), "step {step}: parked and held");
            }
            for (k, o) in &seen.owners {
                assert!(o.order.len() <= limits.per_owner, "step {step}");
                let n = o.order.len();
                assert_eq!(seen.by_count.contains(&(n, *k)), n > 0, "step {step}");
                assert_eq!(o.sigs.len(), n, "step {step}");
                for (e, id) in &o.order {
                    assert_eq!(o.sigs.get(id), Some(e), "step {step}");
                }
            }
            assert_eq!(
                seen.by_count.len(),
                seen.owners.values().filter(|o| !o.order.is_empty()).count()
            );
        }
        // The run exercised both sides.
        assert!(
            accepted > 1000 && replays_refused > 300,
            "{accepted} {replays_refused}"
        );
    }

    /// A request whose clock reading is older than one the table already judged at is
    /// judged at the later one: a sweep at T + 1 cannot let a replay read at T through.
    #[test]
    fn a_stale_clock_reading_cannot_replay_what_a_sweep_dropped() {
        let guard = ReplayGuard::default();
        let t = 1_700_000_000;
        let (a, b) = ([1u8; 32], [2u8; 32]);
        // a's signature expires at t; b's fill the table.
        assert!(guard.first_use_within(&a, sig(1), t, t, TINY).unwrap());
        assert!(
            guard
                .first_use_within(&b, sig(2), t + 300, t, TINY)
                .unwrap()
        );
        // At t + 1 the table is full and sweeps; a's signature left the window a second
        // ago and is kept for the grace.
        assert!(
            guard
                .first_use_within(&b, sig(3), t + 301, t + 1, TINY)
                .unwrap()
        );
        // A replay of a's signature whose `now` was read at t is refused.
        assert!(!guard.first_use_within(&a, sig(1), t, t, TINY).unwrap());
        // So is one judged 10 s behind a sweep (a request that waited, or a clock stepped
        // back a little).
        assert!(
            guard
                .first_use_within(&a, sig(4), t + 15, t + 5, TINY)
                .unwrap()
        );
        assert!(
            guard
                .first_use_within(&b, sig(5), t + 320, t + 20, TINY)
                .unwrap()
        );
        assert!(
            !guard
                .first_use_within(&a, sig(4), t + 15, t + 10, TINY)
                .unwrap()
        );
        // Out of the window at the request's own clock: refused before the table.
        let e = guard
            .first_use_within(&a, sig(6), t, t + 1, TINY)
            .unwrap_err();
        assert!(e.message.contains("left the 300 s window"), "{}", e.message);
    }

    /// A clock stepped back is followed, not held against every later request; within the
    /// grace, what a sweep at the later reading dropped is still refused.
    #[test]
    fn a_clock_stepped_back_does_not_lock_signed_requests_out() {
        let guard = ReplayGuard::default();
        let t = 1_700_000_000;
        let a = [1u8; 32];
        assert!(
            guard
                .first_use_within(&a, sig(1), t + 3600 + 300, t + 3600, SMALL)
                .unwrap()
        );
        // The clock is pulled back an hour: a request signed now passes.
        assert!(
            guard
                .first_use_within(&a, sig(2), t + 300, t, SMALL)
                .unwrap()
        );
        // A sweep at t + 10 keeps what left the window within the grace: a request judged
        // at t + 4 (6 s behind) cannot replay it.
        let g = ReplayGuard::default();
        let b = [2u8; 32];
        assert!(g.first_use_within(&a, sig(1), t + 5, t, TINY).unwrap());
        assert!(g.first_use_within(&b, sig(2), t + 300, t, TINY).unwrap());
        assert!(
            g.first_use_within(&b, sig(3), t + 310, t + 10, TINY)
                .unwrap()
        );
        assert!(!matches!(
            g.first_use_within(&a, sig(1), t + 5, t + 4, TINY),
            Ok(true)
        ));
    }

    /// What a key forgot stays forgotten across a restart: its refs are deleted and its
    /// floor persisted in the commit of the next accepted signature, and a reload applies
    /// the table's limits to whatever refs it finds (here left by a run that had larger
    /// limits), raising floors as at run time.
    #[test]
    fn forgetting_and_floors_survive_a_restart() {
        let store = cairn_store::MemoryStore::new();
        let now = 1_700_000_000;
        let a = [1u8; 32];
        let guard = ReplayGuard::default();
        let accept = |g: &ReplayGuard, i: u32, expires: u64, limits: Limits| {
            assert!(
                g.first_use_within(&a, sig(i), expires, now, limits)
                    .unwrap()
            );
            let c = Checked {
                body_blake3: [0; 32],
                signature: sig(i),
                expires,
                owner: a,
            };
            g.persist(&store, &c, now).unwrap();
        };
        for i in 0..9 {
            accept(&guard, i, now + 100 + i as u64, SMALL);
        }
        // The ninth forgot the first (expiring at now + 100): its ref is gone, the floor
        // is stored.
        assert_eq!(store.list_refs(REPLAY_REFS).unwrap().len(), 8);
        assert_eq!(
            store.list_refs(REPLAY_FLOOR_REFS).unwrap()[0].0.as_ref(),
            &floor_ref(&a, now + 100)[..]
        );
        let again = ReplayGuard::load_within(&store, now, SMALL).unwrap();
        assert_eq!(again.seen.lock().count(&a), 8);
        let e = again
            .first_use_within(&a, sig(0), now + 100, now, SMALL)
            .unwrap_err();
        assert!(e.message.contains("sign the request anew"), "{}", e.message);
        assert!(
            !again
                .first_use_within(&a, sig(1), now + 101, now, SMALL)
                .unwrap()
        );
        // A run with a larger share left 20 refs; a reload with the small share keeps the
        // newest 8 and raises the floor past the others.
        let big = Limits {
            max: 100,
            per_owner: 100,
            owners: 10,
            parked: 10,
        };
        for i in 100..112 {
            accept(&again, i, now + 200 + i as u64, big);
        }
        assert_eq!(store.list_refs(REPLAY_REFS).unwrap().len(), 20);
        let third = ReplayGuard::load_within(&store, now, SMALL).unwrap();
        assert_eq!(third.seen.lock().count(&a), 8);
        assert_eq!(store.list_refs(REPLAY_REFS).unwrap().len(), 8);
        let floor = third.seen.lock().floor(&a);
        assert_eq!(floor, now + 200 + 103);
        for i in 0..112u32 {
            let expires = if i < 100 {
                now + 100 + i as u64
            } else {
                now + 200 + i as u64
            };
            if !(9..100).contains(&i) {
                assert!(
                    !matches!(
                        third.first_use_within(&a, sig(i), expires, now, SMALL),
                        Ok(true)
                    ),
                    "signature {i} accepted twice"
                );
            }
        }
    }

    /// Two requests' store changes committed in the other order than they were taken, and
    /// a sweep that listed an old floor before a new one landed, still leave the stored
    /// floor at its highest: after a restart no forgotten signature is accepted.
    #[test]
    fn floor_refs_hold_whatever_order_commits_land_in() {
        let store = cairn_store::MemoryStore::new();
        let now = 1_700_000_000;
        let a = [1u8; 32];
        // An old floor of a, past by now, that a sweep will delete.
        store
            .commit(&[RefUpdate::Set {
                name: floor_ref(&a, now - 5),
                value: Vec::new(),
            }])
            .unwrap();
        let guard = ReplayGuard::default();
        let mut taken = Vec::new();
        for i in 0..10u32 {
            let expires = now + 100 + i as u64;
            assert!(
                guard
                    .first_use_within(&a, sig(i), expires, now, SMALL)
                    .unwrap()
            );
            let mut updates = vec![RefUpdate::Set {
                name: replay_ref(&a, sig_id(&sig(i))),
                value: expires.to_le_bytes().to_vec(),
            }];
            updates.extend(guard.seen.lock().take_store_changes());
            taken.push(updates);
        }
        // Requests 8 and 9 each forgot one signature; their commits land last-taken first,
        // then the sweep (which listed the old floor before them) lands.
        let (last, before) = (taken.pop().unwrap(), taken.pop().unwrap());
        for u in &taken {
            store.commit(u).unwrap();
        }
        store.commit(&last).unwrap();
        store.commit(&before).unwrap();
        sweep_refs(&store, now).unwrap();
        let again = ReplayGuard::load_within(&store, now, SMALL).unwrap();
        assert_eq!(again.seen.lock().floor(&a), now + 101);
        for i in 0..10u32 {
            let got = again.first_use_within(&a, sig(i), now + 100 + i as u64, now, SMALL);
            assert!(!matches!(got, Ok(true)), "signature {i} accepted twice");
        }
        // One floor ref is left, the highest.
        let floors = store.list_refs(REPLAY_FLOOR_REFS).unwrap();
        assert_eq!(floors.len(), 1);
        assert_eq!(parse_floor_ref(&floors[0].0), Some((a, now + 101)));
    }

    /// Every batch of store changes that deletes a key's forgotten signatures carries the
    /// key's floor too: when only a later batch lands (commits in another order than
    /// taken, then a crash), none of the signatures it deletes is accepted after a
    /// restart.
    #[test]
    fn each_batch_deleting_forgotten_signatures_carries_their_floor() {
        use cairn_store::RefStore;
        let store = cairn_store::MemoryStore::new();
        let now = 1_700_000_000;
        let k = [3u8; 32];
        let e = now + 300;
        let guard = ReplayGuard::default();
        // Eight signatures of one second fill the key's share; each is stored.
        for i in 0..8u32 {
            assert!(guard.first_use_within(&k, sig(i), e, now, SMALL).unwrap());
            store
                .commit(&[RefUpdate::Set {
                    name: replay_ref(&k, sig_id(&sig(i))),
                    value: e.to_le_bytes().to_vec(),
                }])
                .unwrap();
        }
        // A ninth of a later second forgets the oldest (floor E); its batch is taken...
        assert!(
            guard
                .first_use_within(&k, sig(8), e + 1, now, SMALL)
                .unwrap()
        );
        let lost = guard.seen.lock().take_store_changes();
        assert!(!lost.is_empty());
        // ...and never lands; a tenth forgets one more of the same second (the floor stays
        // E, taken as stored already), and only its batch lands.
        assert!(
            guard
                .first_use_within(&k, sig(9), e + 2, now, SMALL)
                .unwrap()
        );
        let landed = guard.seen.lock().take_store_changes();
        assert!(
            landed
                .iter()
                .any(|u| matches!(u, RefUpdate::Set { name, .. } if name == &floor_ref(&k, e))),
            "{landed:?}"
        );
        store.commit(&landed).unwrap();
        let again = ReplayGuard::load_within(&store, now, SMALL).unwrap();
        for i in 0..8u32 {
            assert!(
                !matches!(again.first_use_within(&k, sig(i), e, now, SMALL), Ok(true)),
                "signature {i} accepted again"
            );
        }
    }

    /// A parked key's floor reaches the store in the commit that deletes its forgotten
    /// signatures' refs: after a restart none of them is accepted again, its later
    /// requests are, and a reload with the same limits parks keys past the share again.
    #[test]
    fn parked_keys_keep_their_floor_across_a_restart() {
        let store = cairn_store::MemoryStore::new();
        let now = 1_700_000_000;
        let accept = |g: &ReplayGuard, k: u8, i: u32, expires: u64| {
            assert!(
                g.first_use_within(&[k; 32], sig(i), expires, now, SMALL)
                    .unwrap()
            );
            let c = Checked {
                body_blake3: [0; 32],
                signature: sig(i),
                expires,
                owner: [k; 32],
            };
            g.persist(&store, &c, now).unwrap();
        };
        let first = ReplayGuard::default();
        // Key 1 signs twice, keys 2 to 5 once each: the fifth key parks one of them.
        accept(&first, 1, 10, now + 300);
        accept(&first, 1, 11, now + 301);
        for k in 2..=5u8 {
            accept(&first, k, k as u32, now + 290 + k as u64);
        }
        let parked: Vec<[u8; 32]> = first.seen.lock().parked.keys().copied().collect();
        assert_eq!(parked.len(), 1);
        let p = parked[0];
        let p_sig = p[0] as u32;
        let p_exp = now + 290 + p[0] as u64;
        assert_eq!(first.seen.lock().floor(&p), p_exp);
        let second = ReplayGuard::load_within(&store, now, SMALL).unwrap();
        assert!(
            !matches!(
                second.first_use_within(&p, sig(p_sig), p_exp, now, SMALL),
                Ok(true)
            ),
            "the parked key's signature was accepted again"
        );
        for (k, i, e) in [(1u8, 10u32, now + 300), (1, 11, now + 301)] {
            assert!(
                !matches!(
                    second.first_use_within(&[k; 32], sig(i), e, now, SMALL),
                    Ok(true)
                ),
                "{k}/{i} accepted again"
            );
        }
        assert!(
            second
                .first_use_within(&p, sig(99), p_exp + 1, now, SMALL)
                .unwrap()
        );
        let seen = second.seen.lock();
        assert!(seen.owners.len() <= SMALL.owners);
        assert!(seen.parked.len() <= SMALL.parked);
    }

    #[test]
    fn accepted_signatures_survive_a_reload_until_they_expire() {
        let store = cairn_store::MemoryStore::new();
        let key = SigningKey::from_seed(&[5; 32]);
        let now = 1_700_000_000;
        let first = ReplayGuard::default();
        let (uri, h) = request(&key, now, b"kept");
        let kept = check(&key.public(), None, &first, &Method::PUT, &uri, &h, now).unwrap();
        first.persist(&store, &kept, now).unwrap();
        let (uri2, h2) = request(&key, now - WINDOW_SECS + 10, b"old");
        let old = check(&key.public(), None, &first, &Method::PUT, &uri2, &h2, now).unwrap();
        first.persist(&store, &old, now).unwrap();
        // A restart 20 s later: the first is still in its window, the second is not.
        let later = now + 20;
        let second = ReplayGuard::load(&store, later).unwrap();
        let e = check(&key.public(), None, &second, &Method::PUT, &uri, &h, later).unwrap_err();
        assert!(e.message.contains("replayed"), "{}", e.message);
        // The second left the window 10 s ago: kept for the grace, then removed.
        assert_eq!(store.list_refs(REPLAY_REFS).unwrap().len(), 2);
        assert_eq!(second.seen.lock().count(key.public().raw()), 2);
        let past_grace = ReplayGuard::load(&store, now + 11 + SWEEP_GRACE_SECS).unwrap();
        assert_eq!(store.list_refs(REPLAY_REFS).unwrap().len(), 1);
        // The signer's share is restored with it; a value written before owners were kept
        // (8 bytes) still guards against its replay and counts against no owner.
        assert_eq!(past_grace.seen.lock().count(key.public().raw()), 1);
        let mut legacy = REPLAY_REFS.to_vec();
        legacy.extend_from_slice(&[9u8; 64]);
        store
            .commit(&[RefUpdate::Set {
                name: legacy,
                value: (later + 100).to_le_bytes().to_vec(),
            }])
            .unwrap();
        let third = ReplayGuard::load(&store, later).unwrap();
        assert!(
            !third
                .first_use(&[7; 32], [9u8; 64], later + 100, later)
                .unwrap()
        );
        assert_eq!(third.seen.lock().total, 1);
        assert_eq!(third.seen.lock().legacy.len(), 1);
        assert_eq!(third.seen.lock().owners.len(), 1);
    }

    #[test]
    fn checks_key_window_and_replays() {
        let key = SigningKey::from_seed(&[1; 32]);
        let other = SigningKey::from_seed(&[2; 32]);
        let guard = ReplayGuard::default();
        let now = 1_700_000_000;
        let (uri, h) = request(&key, now, b"hello");
        let got = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap();
        assert_eq!(got.body_blake3, body_blake3(b"hello"));
        // The same signature again is a replay.
        let e = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap_err();
        assert!(e.message.contains("replayed"), "{}", e.message);
        // Another key, another method, a stale date, a changed header.
        let (uri, h) = request(&other, now, b"hello");
        assert!(check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).is_err());
        let (uri, h) = request(&key, now + 1, b"hello");
        assert!(check(&key.public(), None, &guard, &Method::POST, &uri, &h, now).is_err());
        let (uri, h) = request(&key, now - WINDOW_SECS - 1, b"hello");
        let e = check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).unwrap_err();
        assert!(e.message.contains("from the node's clock"), "{}", e.message);
        let (uri, mut h) = request(&key, now + 2, b"hello");
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now).is_err());
        let (uri, mut h) = request(&key, now + 3, b"hello");
        h.remove(header::AUTHORIZATION);
        assert_eq!(
            check(&key.public(), None, &guard, &Method::PUT, &uri, &h, now)
                .unwrap_err()
                .status,
            401
        );
    }
}
