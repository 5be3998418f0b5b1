//! [`Db`]: the ForkBase servlet for one bucket, embedded. It owns the branch tables and
//! every operation of ForkBase Table 1 that creates or names versions: Get (M1, M2),
//! Put (M3, M4, guarded), type operations, ListKeys (M8), ListTaggedBranches (M9),
//! ListUntaggedBranches (M10), Fork (M11, M12), Rename (M13) and Remove (M14). Merge,
//! Track, LCA and Diff live in [`crate::merge`] and [`crate::history`]; verification and GC
//! in [`crate::verify`] and [`crate::gc`].
//!
//! Concurrency: updates of one key are serialised by a striped per-key lock (the paper's
//! "concurrent updates on a tagged branch are serialized by the servlet"); expensive work
//! (building POS-trees) happens before the lock is taken. Every mutation ends in one
//! [`RefStore::commit`] of the key's branch table, the durability point: when a put returns,
//! its chunks and its new head survive a crash at the store's durability level.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use cairn_core::{Error, HashAlgo, Result};
use cairn_store::{ChunkStore, RefUpdate, Store};
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use crate::branch::{BranchTable, HeadPos, check_branch_name};
use crate::fobject::{FObject, Uid, check_key, show_key};
use crate::postree::{self, BlobWriter, TreeConfig};
use crate::value::{NewValue, Op, Value, ValueType};

/// The branch every command uses when none is named.
pub const DEFAULT_BRANCH: &str = "master";
/// Largest inline (String or Tuple) value, encoded; larger data belongs in a Blob or List.
pub const MAX_INLINE_BYTES: usize = 16 << 20;

/// Key-lock stripes. A put or fork holds its key's stripe until its commit is durable (a
/// whole group-commit `fdatasync`), so keys that share a stripe queue behind each other:
/// many stripes keep that rare under many concurrent writers.
const KEY_LOCK_STRIPES: usize = 4096;
/// Entries a key-lock stripe remembers about recent versions before it starts afresh.
const HEAD_CACHE_ENTRIES: usize = 64;

/// What a Put needs to know about its base version: enough to derive the new version
/// without re-reading (and re-hashing) the base, which for a large inline value is most of
/// a put's cost. Kept per key-lock stripe for versions this process wrote or read.
#[derive(Clone, Copy, Debug)]
struct BaseInfo {
    /// The version's key, as [`key_id`] names it: the cache stands in for reading the
    /// version to check that it belongs to the key, so a 64-bit stripe hash (whose
    /// collisions can be computed from the bucket name) would not do.
    key_id: [u8; 32],
    depth: u64,
    ty: ValueType,
}

/// Hashes a map key that is already a well-mixed `u64` (bytes of a cryptographic digest)
/// by passing it through.
#[derive(Default)]
pub(crate) struct PassHasher(u64);

impl std::hash::Hasher for PassHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A collision-resistant name of a key (its BLAKE3 digest), for [`BaseInfo`].
fn key_id(key: &[u8]) -> [u8; 32] {
    *cairn_core::HashAlgo::Blake3.digest(key).digest()
}

/// The first 8 bytes of a uid's digest: a well-mixed map key.
fn uid_word(uid: &Uid) -> u64 {
    let d = uid.digest();
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

thread_local! {
    /// Writers' holds ([`Db::writer_guard`]) this thread has now.
    static WRITER_HOLDS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this thread holds a writer's hold now (a write in progress).
pub(crate) fn holds_writer() -> bool {
    WRITER_HOLDS.with(|h| h.get() > 0)
}

/// A writer's hold on the writers' lock ([`Db::writer_guard`]).
pub(crate) struct WriterGuard<'a>(#[allow(dead_code)] RwLockReadGuard<'a, ()>);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        WRITER_HOLDS.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A key-lock stripe: the lock itself guards this small cache of recent versions.
#[derive(Default)]
pub(crate) struct Stripe {
    recent:
        std::collections::HashMap<u64, (Uid, BaseInfo), std::hash::BuildHasherDefault<PassHasher>>,
}

impl Stripe {
    fn remember(&mut self, uid: Uid, info: BaseInfo) {
        if self.recent.len() >= HEAD_CACHE_ENTRIES {
            self.recent.clear();
        }
        self.recent.insert(uid_word(&uid), (uid, info));
    }

    fn recall(&self, uid: &Uid) -> Option<BaseInfo> {
        match self.recent.get(&uid_word(uid)) {
            Some((u, info)) if u == uid => Some(*info),
            _ => None,
        }
    }
}

/// Where a Put goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// M3: the head of a tagged branch (created when the key is new).
    Branch(&'a str),
    /// M4: a new version derived from this uid; becomes an untagged head. Two puts on the
    /// same base fork on conflict.
    Base(Uid),
}

/// A version named by branch or by uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum At {
    /// The head of a tagged branch.
    Branch(String),
    /// A specific version.
    Uid(Uid),
}

impl At {
    /// Reads a command-line `BRANCH_OR_UID`: a 68-hex-digit version id, else a branch name.
    pub fn parse(s: &str) -> Self {
        match s.parse::<Uid>() {
            Ok(uid) => At::Uid(uid),
            Err(_) => At::Branch(s.to_string()),
        }
    }

    /// The default branch.
    pub fn default_branch() -> Self {
        At::Branch(DEFAULT_BRANCH.to_string())
    }
}

/// Which mutation a [`HeadChange`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadChangeKind {
    /// A put (or a type operation) made version `uid` the head of `branch`, or an untagged
    /// head when `branch` is `None`.
    Put,
    /// Tagged branch `branch` was created at `uid`.
    Fork,
    /// A merge made `uid` the head of `branch` (an untagged head when `None`).
    Merge,
    /// Branch `from` was renamed to `branch`; its head is `uid`.
    Rename,
    /// Branch `branch` was removed; its head was `uid`. With `branch` `None`: untagged
    /// head `uid` left the heads (a merge found it contained in its target).
    Remove,
}

/// A head-moving commit a [`Db`] is about to make, as shown to its [`HeadRecorder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadChange<'a> {
    /// What the commit does.
    pub kind: HeadChangeKind,
    /// The key.
    pub key: &'a [u8],
    /// The branch it creates, moves or removes (`None`: an untagged head).
    pub branch: Option<&'a str>,
    /// The branch renamed ([`HeadChangeKind::Rename`] only).
    pub from: Option<&'a str>,
    /// The version the commit makes a head, or the head it removes.
    pub uid: Uid,
    /// The version's bases (for puts and merges; empty otherwise).
    pub bases: &'a [Uid],
    /// The new version a put made (`None` for other changes).
    pub object: Option<&'a FObject>,
    /// The put's [`PutOptions::owner_seal`], for the recorder to check and keep.
    pub owner_seal: Option<&'a [u8]>,
}

/// Records every head-moving commit of a [`Db`] before it happens (a bucket's capsule
/// journal: [`Db::with_recorder`]). Called while the key's lock is held, after the new
/// version's chunks are stored and before the commit that makes it visible; when it fails
/// the commit is not made and the mutation fails with its error, changing nothing. A
/// recorder that returns only once its record is durable gives: every head the store shows
/// was recorded first, after any crash too.
pub trait HeadRecorder: Send + Sync {
    /// Records `change`; an error refuses it.
    fn record(&self, change: &HeadChange<'_>) -> Result<()>;

    /// Records the changes of one operation (a merge that drops heads besides making
    /// one), all or none: an error refuses them all. The default records them one by
    /// one, which a recorder that can write several at once should override.
    fn record_all(&self, changes: &[HeadChange<'_>]) -> Result<()> {
        changes.iter().try_for_each(|c| self.record(c))
    }
}

/// Which versions belong to a bucket ([`Db::with_members`]). Buckets share one chunk
/// store, so a version of any bucket loads in every other; a uid a caller names (a read
/// `At::Uid`, a fork's or merge's source, a put's base) must be a version of this bucket,
/// or another bucket's history, even versions its owner overwrote or deleted, could be
/// read and brought in through any bucket.
pub trait VersionMembership: Send + Sync {
    /// Whether `uid` is a version made in this bucket.
    fn holds(&self, uid: &Uid) -> Result<bool>;
}

/// Options of a Put.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Succeed only if the target branch's head is this uid (ForkBase's guarded Put).
    pub guard: Option<Uid>,
    /// Application metadata stored in the FObject (hashed into the uid).
    pub context: Vec<u8>,
    /// A branch put on a key that has heads but not this branch: create the branch with
    /// this version of the key as the new version's base (without it such a put is refused:
    /// use fork). Ignored when the branch exists.
    pub branch_from: Option<Uid>,
    /// Opaque bytes handed to the Db's [`HeadRecorder`] with the put's [`HeadChange`]: a
    /// bucket owner's seal over the version's content, which a bucket checks before it
    /// records the put and keeps in the record (`cairn_capsule::OwnerSeal`). A Db without
    /// a recorder ignores it.
    pub owner_seal: Option<Vec<u8>>,
}

/// A version and its uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// The version id.
    pub uid: Uid,
    /// The decoded FObject.
    pub object: FObject,
}

/// One bucket of versioned objects over a [`Store`].
pub struct Db {
    store: Arc<dyn Store>,
    algo: HashAlgo,
    cfg: TreeConfig,
    prefix: Vec<u8>,
    /// Seeds the key hash that picks a key-lock stripe, so equal keys of different buckets
    /// land on different stripes.
    bucket_seed: u64,
    shared: Arc<Shared>,
    /// Sees every head-moving commit of this bucket before it is made.
    recorder: Option<Arc<dyn HeadRecorder>>,
    /// Says which versions a caller may name by uid (every one when `None`).
    members: Option<Arc<dyn VersionMembership>>,
    /// Most bytes one merge may hold in memory (see [`Db::with_merge_memory`]).
    merge_memory: u64,
}

/// What every bucket of one store shares: the key-lock stripes (with their caches of
/// recent versions) and the writers' lock that GC takes. GC is store-wide (chunks are
/// deduplicated across buckets), so all buckets of a store must exclude one another
/// through the same lock, and one set of stripes serves any number of buckets.
struct Shared {
    key_locks: Box<[Mutex<Stripe>]>,
    /// Writers hold it shared from their first chunk write to their commit; GC takes it
    /// exclusively for its short final mark-and-sweep (see [`crate::gc`]).
    gc_lock: RwLock<()>,
}

/// Times [`Db::branch_version`] reads a branch whose version went missing because the branch moved
/// and a GC collected the old version in between (each a race with a writer and a GC).
const GET_RETRIES: u32 = 4;

impl Db {
    /// A Db over `store` with the default POS-tree configuration and the default bucket.
    ///
    /// Open one Db per store and share it (it is `Sync`); reach other buckets of the store
    /// with [`Db::for_bucket`]. GC's exclusion of writers and the cache of recent versions
    /// belong to that Db and its bucket views, so two Dbs opened separately on one store
    /// could let a GC in one remove chunks a put in the other is about to commit.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_config(store, TreeConfig::default())
    }

    /// A Db with a chosen POS-tree configuration.
    pub fn with_config(store: Arc<dyn Store>, cfg: TreeConfig) -> Self {
        let algo = store.algo();
        Db {
            store,
            algo,
            cfg,
            prefix: format!("bucket/{DEFAULT_BUCKET}/").into_bytes(),
            bucket_seed: xxhash_rust::xxh3::xxh3_64(DEFAULT_BUCKET.as_bytes()),
            shared: Arc::new(Shared {
                key_locks: (0..KEY_LOCK_STRIPES)
                    .map(|_| Mutex::new(Stripe::default()))
                    .collect(),
                gc_lock: RwLock::new(()),
            }),
            recorder: None,
            members: None,
            merge_memory: crate::merge::DEFAULT_MERGE_MEMORY,
        }
    }

    /// A view of bucket `name` of the same store that shares this Db's writer lock and
    /// key locks (as every bucket of a store must, see [`Db::new`]). Cheap: no I/O, and no
    /// per-bucket lock tables.
    pub fn for_bucket(&self, name: &str) -> Result<Db> {
        self.sibling(self.store.clone(), None).in_bucket(name)
    }

    /// This Db's bucket, locks and settings over `store`, recording no head change and
    /// taking only `members`' versions by uid.
    fn sibling(&self, store: Arc<dyn Store>, members: Option<Arc<dyn VersionMembership>>) -> Db {
        Db {
            store,
            algo: self.algo,
            cfg: self.cfg,
            prefix: self.prefix.clone(),
            bucket_seed: self.bucket_seed,
            shared: self.shared.clone(),
            recorder: None,
            members,
            merge_memory: self.merge_memory,
        }
    }

    /// A view of this Db (same bucket, locks and settings) whose chunk writes are held in
    /// memory until [`crate::staged::Staged::flush_reachable`]: what a merge runs on, so
    /// that one ending in conflicts writes nothing. Records no head change and commits no
    /// ref.
    pub(crate) fn staged_view(&self) -> (Db, Arc<crate::staged::Staged>) {
        let staged = Arc::new(crate::staged::Staged::new(
            self.store.clone(),
            self.merge_memory,
        ));
        (self.sibling(staged.clone(), self.members.clone()), staged)
    }

    /// This Db with merges holding at most `bytes` in memory (default
    /// [`crate::merge::DEFAULT_MERGE_MEMORY`]): the changes of both sides, the regions
    /// read to merge them and the conflicts; the new chunks it makes are held until it
    /// succeeds, up to `bytes` more. A merge that would need more fails with
    /// [`cairn_core::Error::InvalidInput`] and writes nothing.
    pub fn with_merge_memory(mut self, bytes: u64) -> Self {
        self.merge_memory = bytes;
        self
    }

    /// Most bytes one merge may hold in memory (see [`Db::with_merge_memory`]).
    pub fn merge_memory(&self) -> u64 {
        self.merge_memory
    }

    /// This Db with `recorder` seeing each of its head-moving commits first (see
    /// [`HeadRecorder`]). Other views of the store ([`Db::for_bucket`]) do not share it.
    pub fn with_recorder(mut self, recorder: Arc<dyn HeadRecorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// This Db taking only versions `members` holds where a caller names a version by uid
    /// (see [`VersionMembership`]); others are not found. Other views of the store
    /// ([`Db::for_bucket`]) do not share it.
    pub fn with_members(mut self, members: Arc<dyn VersionMembership>) -> Self {
        self.members = Some(members);
        self
    }

    /// Refuses (not found) a version `uid` of `key` a caller named that is not one of this
    /// bucket's ([`Db::with_members`]).
    pub(crate) fn admit(&self, key: &[u8], uid: &Uid) -> Result<()> {
        if self.is_member(uid)? {
            return Ok(());
        }
        Err(Error::not_found(format!(
            "version {uid} of key {} in bucket {}",
            show_key(key),
            self.bucket()
        )))
    }

    /// Whether `uid` is one of this bucket's versions (any is, without a membership).
    fn is_member(&self, uid: &Uid) -> Result<bool> {
        match &self.members {
            Some(m) => m.holds(uid),
            None => Ok(true),
        }
    }

    /// [`Db::admit`] for a uid named without its key (checked before its version is
    /// loaded, so a refusal says nothing of another bucket's version).
    pub(crate) fn admit_uid(&self, uid: &Uid) -> Result<()> {
        if self.is_member(uid)? {
            return Ok(());
        }
        Err(Error::not_found(format!(
            "version {uid} in bucket {}",
            self.bucket()
        )))
    }

    /// Shows `change` to the recorder, if any, before its commit.
    pub(crate) fn record_head(&self, change: HeadChange<'_>) -> Result<()> {
        self.record_heads(std::slice::from_ref(&change))
    }

    /// Shows the changes of one operation to the recorder, if any, before its commit (see
    /// [`HeadRecorder::record_all`]).
    pub(crate) fn record_heads(&self, changes: &[HeadChange<'_>]) -> Result<()> {
        match &self.recorder {
            Some(r) => {
                // Counted as a write in progress while the recorder runs: a rename or a
                // remove records under its key's lock without a writer's hold, and a GC
                // the recorder started would wait for that lock, holding every writer.
                WRITER_HOLDS.with(|h| h.set(h.get() + 1));
                struct Recording;
                impl Drop for Recording {
                    fn drop(&mut self) {
                        WRITER_HOLDS.with(|h| h.set(h.get().saturating_sub(1)));
                    }
                }
                let _recording = Recording;
                match changes {
                    [one] => r.record(one),
                    _ => r.record_all(changes),
                }
            }
            None => Ok(()),
        }
    }

    /// The same Db serving bucket `name` instead of the default one (each bucket is its own
    /// namespace of keys in the store's refs). Names are 1 to 64 bytes of `a-z 0-9 . _ -`.
    pub fn in_bucket(mut self, name: &str) -> Result<Self> {
        check_bucket_name(name)?;
        // A recorder and a membership belong to one bucket.
        self.recorder = None;
        self.members = None;
        self.prefix = format!("bucket/{name}/").into_bytes();
        self.bucket_seed = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        Ok(self)
    }

    /// The bucket this Db serves.
    pub fn bucket(&self) -> &str {
        // The prefix is `bucket/<name>/` with a name `check_bucket_name` accepted.
        std::str::from_utf8(&self.prefix[7..self.prefix.len() - 1]).unwrap_or(DEFAULT_BUCKET)
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The store as a chunk store (for [`postree`] reads).
    pub fn chunks(&self) -> &dyn ChunkStore {
        &*self.store
    }

    /// The hash algorithm naming this Db's chunks and versions.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// The POS-tree configuration used for new values.
    pub fn tree_config(&self) -> &TreeConfig {
        &self.cfg
    }

    /// The same Db building new values with `cfg` (reads need no configuration: a tree
    /// records its own boundaries). Keep one configuration per bucket for its whole life:
    /// versions built under different ones share few chunks, and the same content gives
    /// the same root only under one configuration (buckets record theirs, see
    /// `cairn_capsule::bucket`).
    pub fn with_tree_config(mut self, cfg: TreeConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// Where `key`'s heads live in the store's refs: the bucket prefix, the key escaped
    /// (0x00 → 0x00 0xFF) and terminated by 0x00 0x01, so that names sort by key bytes and
    /// one key's refs are one range. Each head is its own ref, so an update costs the same
    /// however many branches a key has:
    /// - `…key 00 01 't' <branch name>` → uid of the tagged branch's head;
    /// - `…key 00 01 'u' <uid bytes>` → uid of an untagged head.
    fn key_prefix(&self, key: &[u8]) -> Vec<u8> {
        let mut n = Vec::with_capacity(self.prefix.len() + key.len() + 3);
        n.extend_from_slice(&self.prefix);
        for &b in key {
            n.push(b);
            if b == 0 {
                n.push(0xFF);
            }
        }
        n.extend_from_slice(&[0, 1]);
        n
    }

    /// The name of one head ref: `kind` is `b't'` (tagged: `rest` = branch name) or `b'u'`
    /// (untagged: `rest` = uid bytes).
    fn head_name(prefix: &[u8], kind: u8, rest: &[u8]) -> Vec<u8> {
        let mut n = Vec::with_capacity(prefix.len() + 1 + rest.len());
        n.extend_from_slice(prefix);
        n.push(kind);
        n.extend_from_slice(rest);
        n
    }

    /// The ref update that sets tagged branch `branch` of `key` to `uid`.
    pub(crate) fn tagged_update(&self, key: &[u8], branch: &str, uid: &Uid) -> RefUpdate {
        RefUpdate::Set {
            name: Self::head_name(&self.key_prefix(key), b't', branch.as_bytes()),
            value: uid.to_bytes().to_vec(),
        }
    }

    /// The ref update that removes untagged head `uid` of `key`.
    pub(crate) fn untagged_delete(&self, key: &[u8], uid: &Uid) -> RefUpdate {
        RefUpdate::Delete {
            name: Self::head_name(&self.key_prefix(key), b'u', &uid.to_bytes()),
        }
    }

    /// Whether `uid` is an untagged head of `key` (one ref read).
    pub(crate) fn is_untagged_head(&self, key: &[u8], uid: &Uid) -> Result<bool> {
        Ok(self
            .store
            .get_ref(&Self::head_name(
                &self.key_prefix(key),
                b'u',
                &uid.to_bytes(),
            ))?
            .is_some())
    }

    /// The head of one tagged branch, read without loading the key's whole table.
    fn tagged_head(&self, prefix: &[u8], branch: &str) -> Result<Option<Uid>> {
        match self
            .store
            .get_ref(&Self::head_name(prefix, b't', branch.as_bytes()))?
        {
            None => Ok(None),
            Some(v) => Uid::from_bytes(&v).map(Some).map_err(|e| {
                Error::corrupt(format!("head ref of branch {branch:?} is damaged: {e}"))
            }),
        }
    }

    /// The key a head ref belongs to, from the ref name after the bucket prefix.
    fn key_of_ref(name: &[u8]) -> Option<(Vec<u8>, &[u8])> {
        let mut key = Vec::with_capacity(name.len());
        let mut i = 0;
        while i < name.len() {
            if name[i] == 0 {
                match name.get(i + 1) {
                    Some(0xFF) => key.push(0),
                    Some(1) => return Some((key, &name[i + 2..])),
                    _ => return None,
                }
                i += 2;
            } else {
                key.push(name[i]);
                i += 1;
            }
        }
        None
    }

    pub(crate) fn lock_key(&self, key: &[u8]) -> MutexGuard<'_, Stripe> {
        self.lock_key_hash(self.key_hash(key))
    }

    /// The hash of `key` in this bucket that picks its key-lock stripe.
    fn key_hash(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.bucket_seed)
    }

    /// Locks the stripe of a key whose [`Db::key_hash`] is `key_hash`.
    fn lock_key_hash(&self, key_hash: u64) -> MutexGuard<'_, Stripe> {
        let locks = &self.shared.key_locks;
        locks[(key_hash as usize) % locks.len()].lock()
    }

    /// Forgets cached facts about versions (GC calls it after removing chunks, so a removed
    /// version is never taken for present).
    pub(crate) fn forget_recent_versions(&self) {
        for s in self.shared.key_locks.iter() {
            s.lock().recent.clear();
        }
    }

    /// A writer's shared hold on the writers' lock (see [`crate::gc`]). The outermost
    /// hold of a thread queues behind a waiting GC, so writers that never pause cannot
    /// starve it; a hold taken inside another (a write path calling another) must not
    /// wait, or it would deadlock behind the GC waiting for the outer one.
    pub(crate) fn writer_guard(&self) -> WriterGuard<'_> {
        let held = WRITER_HOLDS.with(|h| {
            let n = h.get();
            h.set(n + 1);
            n
        });
        WriterGuard(if held == 0 {
            self.shared.gc_lock.read()
        } else {
            self.shared.gc_lock.read_recursive()
        })
    }

    /// GC's exclusive hold on the writers' lock of every bucket of the store. While GC
    /// waits, writers that come after it wait too ([`Db::writer_guard`]), so it waits 20 ms
    /// at a time, then lets writers in for 200 ms: writers that keep coming cannot starve
    /// it (those holding the lock finish within the 20 ms), while a writer that holds the
    /// lock for long (an upload streaming from a slow client) holds GC off, not every
    /// other writer of the store.
    pub(crate) fn gc_write_lock(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        loop {
            if let Some(g) = self
                .shared
                .gc_lock
                .try_write_for(std::time::Duration::from_millis(20))
            {
                return g;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    // ----- reads -----

    /// The branch table of `key`, or an empty one when the key does not exist (a key no
    /// put accepts, empty or too long, is [`Error::InvalidInput`]).
    pub fn table(&self, key: &[u8]) -> Result<BranchTable> {
        let (t, damage) = self.table_lenient(key)?;
        match damage.into_iter().next() {
            Some(why) => Err(Error::corrupt(format!(
                "branch table of key {} is damaged: {why}",
                show_key(key)
            ))),
            None => Ok(t),
        }
    }

    /// The branch table of `key` from its readable head refs, and what is wrong with each
    /// other one (so `verify` still walks a key's good heads past a damaged ref).
    pub(crate) fn table_lenient(&self, key: &[u8]) -> Result<(BranchTable, Vec<String>)> {
        check_key(key)?;
        let prefix = self.key_prefix(key);
        let mut t = BranchTable::default();
        let mut damage = Vec::new();
        for (name, value) in self.store.list_refs(&prefix)? {
            match parse_head_ref(&name[prefix.len()..], &value) {
                Ok((HeadPos::Tagged(branch), uid)) => {
                    t.tagged.insert(branch, uid);
                }
                Ok((HeadPos::Untagged(uid), _)) => {
                    t.untagged.insert(uid);
                }
                Err(why) => damage.push(why),
            }
        }
        Ok((t, damage))
    }

    /// The head of tagged branch `branch` of `key`, if it has one: one ref read, where
    /// [`Db::table`] reads every head of the key (a key with many branches, such as a Gaia
    /// file deleted under archival scopes many times, made every read of it slower).
    pub fn branch_head(&self, key: &[u8], branch: &str) -> Result<Option<Uid>> {
        check_key(key)?;
        let mut name = self.key_prefix(key);
        name.push(b't');
        name.extend_from_slice(branch.as_bytes());
        match self.store.get_ref(&name)? {
            None => Ok(None),
            Some(v) => Uid::from_bytes(&v).map(Some).map_err(|e| {
                Error::corrupt(format!(
                    "head ref of branch {branch:?} of key {}: {e}",
                    show_key(key)
                ))
            }),
        }
    }

    /// The tagged branch of `key` whose name is the greatest (in byte order) of those
    /// starting with `prefix`, with its head; `None` when there is none. Reads a few refs
    /// however many branches the key has: past a page of them, the greatest name is found
    /// byte by byte, each byte by a binary search of "is there a name at or above this",
    /// one ref read each.
    pub fn last_tagged_with_prefix(
        &self,
        key: &[u8],
        prefix: &str,
    ) -> Result<Option<(String, Uid)>> {
        check_key(key)?;
        let mut base = self.key_prefix(key);
        base.push(b't');
        base.extend_from_slice(prefix.as_bytes());
        let head_of = |name: &[u8], value: &[u8]| -> Result<(String, Uid)> {
            let branch = String::from_utf8_lossy(&name[base.len() - prefix.len()..]).into_owned();
            let uid = Uid::from_bytes(value).map_err(|e| {
                Error::corrupt(format!(
                    "head ref of branch {branch:?} of key {}: {e}",
                    show_key(key)
                ))
            })?;
            Ok((branch, uid))
        };
        const PAGE: usize = 64;
        let page = self.store.list_refs_from(&base, &base, PAGE)?;
        if page.len() < PAGE {
            return page.last().map(|(n, v)| head_of(n, v)).transpose();
        }
        // The least name at or above `from` under `base`.
        let first_from = |from: &[u8]| -> Result<Option<(Bytes, Bytes)>> {
            Ok(self
                .store
                .list_refs_from(&base, from, 1)?
                .into_iter()
                .next())
        };
        // `known` is a name present; `at` the prefix of the greatest name found so far.
        let mut at = base.clone();
        let mut known = page.last().map(|(n, _)| n.to_vec()).unwrap_or_default();
        loop {
            if known == at {
                // `at` itself is a name: the greatest only if no longer one follows.
                let mut next = at.clone();
                next.push(0);
                match first_from(&next)? {
                    Some((n, _)) if n.starts_with(&at) => known = n.to_vec(),
                    _ => break,
                }
            }
            // The greatest next byte b with a name at or above `at ‖ b` that still starts
            // with `at` (every name of this set that follows it starts with `at`).
            let (mut lo, mut hi) = (0u16, 255u16);
            let mut found = known.clone();
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                let mut probe = at.clone();
                probe.push(mid as u8);
                match first_from(&probe)? {
                    Some((n, _)) if n.starts_with(&at) => {
                        lo = mid;
                        found = n.to_vec();
                    }
                    _ => hi = mid - 1,
                }
            }
            at.push(lo as u8);
            known = found;
            if !known.starts_with(&at) {
                // (Cannot happen: `known` came from a probe at or below `at`.)
                break;
            }
        }
        match self.store.get_ref(&at)? {
            Some(v) => head_of(&at, &v).map(Some),
            None => Ok(None),
        }
    }

    /// The branch table of `key`; [`Error::NotFound`] when the key does not exist.
    pub fn existing_table(&self, key: &[u8]) -> Result<BranchTable> {
        let t = self.table(key)?;
        if t.is_empty() {
            return Err(Error::not_found(format!("key {}", show_key(key))));
        }
        Ok(t)
    }

    /// A page of `key`'s heads: up to `limit` (at least 1) of them, tagged branches by
    /// name and then untagged heads by uid, from just after `after` (from the first when
    /// `None`), and the place of the page's last head when more follow. Reads about the
    /// page's refs, where [`Db::table`] reads every head of the key (and concurrent puts on
    /// old bases can leave very many). [`Error::NotFound`] when the key has no heads; a
    /// damaged head ref is [`Error::Corrupt`].
    pub fn heads_page(
        &self,
        key: &[u8],
        after: Option<&HeadPos>,
        limit: usize,
    ) -> Result<(BranchTable, Option<HeadPos>)> {
        check_key(key)?;
        let limit = limit.max(1);
        let prefix = self.key_prefix(key);
        let mut from = prefix.clone();
        match after {
            None => {}
            Some(HeadPos::Tagged(name)) => {
                from.push(b't');
                from.extend_from_slice(name.as_bytes());
                // The first name after it.
                from.push(0);
            }
            Some(HeadPos::Untagged(uid)) => {
                from.push(b'u');
                from.extend_from_slice(&uid.to_bytes());
                from.push(0);
            }
        }
        let refs = self
            .store
            .list_refs_from(&prefix, &from, limit.saturating_add(1))?;
        if refs.is_empty() && after.is_none() {
            return Err(Error::not_found(format!("key {}", show_key(key))));
        }
        let more = refs.len() > limit;
        let mut t = BranchTable::default();
        let mut last = None;
        for (name, value) in refs.into_iter().take(limit) {
            let (pos, uid) = parse_head_ref(&name[prefix.len()..], &value).map_err(|why| {
                Error::corrupt(format!("a head of key {} is damaged: {why}", show_key(key)))
            })?;
            match &pos {
                HeadPos::Tagged(branch) => {
                    t.tagged.insert(branch.clone(), uid);
                }
                HeadPos::Untagged(_) => {
                    t.untagged.insert(uid);
                }
            }
            last = Some(pos);
        }
        Ok((t, if more { last } else { None }))
    }

    /// Loads and decodes a version (the store verifies the chunk against the uid).
    pub fn load(&self, uid: &Uid) -> Result<FObject> {
        let chunk = self
            .store
            .get(uid)?
            .ok_or_else(|| Error::not_found(format!("version {uid}")))?;
        FObject::from_chunk(&chunk)
            .map_err(|e| Error::corrupt(format!("version {uid} does not decode: {e}")))
    }

    /// Loads a version and checks it belongs to `key`.
    pub fn load_for_key(&self, key: &[u8], uid: &Uid) -> Result<FObject> {
        crate::history::load_version(self.chunks(), key, uid)
    }

    /// [`Db::load_for_key`] of a version reached through a head ref or a base, not named
    /// by the caller: a version of another key there is damage ([`Error::Corrupt`]).
    pub fn load_reached(&self, key: &[u8], uid: &Uid) -> Result<FObject> {
        crate::history::load_reached_version(self.chunks(), key, uid)
    }

    /// Resolves a branch name or uid of `key` to a uid.
    pub fn resolve(&self, key: &[u8], at: &At) -> Result<Uid> {
        match at {
            At::Uid(u) => {
                self.admit(key, u)?;
                Ok(*u)
            }
            At::Branch(b) => {
                // One ref read for a branch that is there; the key's whole table (every
                // head, and a key may have very many) only to say why one is not.
                if let Some(u) = self.branch_head(key, b)? {
                    return Ok(u);
                }
                let t = self.existing_table(key)?;
                t.tagged.get(b.as_str()).copied().ok_or_else(|| {
                    Error::not_found(format!(
                        "branch {b:?} of key {} ({})",
                        show_key(key),
                        t.describe()
                    ))
                })
            }
        }
    }

    /// M1 / M2: the version at a branch head or uid.
    pub fn get(&self, key: &[u8], at: &At) -> Result<Version> {
        match at {
            At::Uid(_) => {
                let uid = self.resolve(key, at)?;
                let object = self.load_for_key(key, &uid)?;
                Ok(Version { uid, object })
            }
            At::Branch(b) => match self.branch_version(key, b)? {
                Some(v) => Ok(v),
                // Says why (no such key, or which branches it has), unless the branch was
                // made again since: it was not there when read.
                None => Err(self.resolve(key, at).err().unwrap_or_else(|| {
                    Error::not_found(format!("branch {b:?} of key {}", show_key(key)))
                })),
            },
        }
    }

    /// The version at the head of tagged branch `branch` of `key`, if it has one (one ref
    /// read, as [`Db::branch_head`]). The head names its version through a head ref:
    /// another key's version there, or one the store does not hold, is damage
    /// ([`Error::Corrupt`]), not "not found" (a Gaia revocation read as absent would fail
    /// open). Unless the ref moved meanwhile: a put or a remove, then a GC collecting the
    /// version read a moment ago, between the ref read and the load. Then the branch is
    /// read again, a few times at most: a branch that moved on every try is
    /// [`Error::Unavailable`] (a race to retry, not damage). A value's chunks read after
    /// this returns can still be collected by such a move and a GC.
    pub fn branch_version(&self, key: &[u8], branch: &str) -> Result<Option<Version>> {
        let Some(mut uid) = self.branch_head(key, branch)? else {
            return Ok(None);
        };
        let mut tries = 0;
        loop {
            let err = match self.load_reached(key, &uid) {
                Ok(object) => return Ok(Some(Version { uid, object })),
                Err(e) => e,
            };
            if !matches!(err, Error::Corrupt(_)) {
                return Err(err);
            }
            match self.branch_head(key, branch)? {
                Some(now) if now != uid => uid = now,
                Some(_) => return Err(err),
                None => return Ok(None),
            }
            tries += 1;
            if tries >= GET_RETRIES {
                return Err(Error::Unavailable(format!(
                    "branch {branch:?} of key {} moved on each of {GET_RETRIES} reads while a \
                     GC collected what it named; try again",
                    show_key(key)
                )));
            }
        }
    }

    /// M8: every key with at least one head, sorted.
    pub fn list_keys(&self) -> Result<Vec<Bytes>> {
        let (keys, damage) = self.list_keys_lenient()?;
        match damage.into_iter().next() {
            Some(why) => Err(Error::corrupt(why)),
            None => Ok(keys),
        }
    }

    /// [`Db::list_keys`] of the ref names that parse, and what is wrong with each other one
    /// (so `verify` still checks every other key).
    pub(crate) fn list_keys_lenient(&self) -> Result<(Vec<Bytes>, Vec<String>)> {
        let mut keys: Vec<Bytes> = Vec::new();
        let mut damage = Vec::new();
        for (name, _) in self.store.list_refs(&self.prefix)? {
            let Some((key, _)) = Self::key_of_ref(&name[self.prefix.len()..]) else {
                damage.push(format!(
                    "head ref {:?} has an unknown form",
                    String::from_utf8_lossy(&name)
                ));
                continue;
            };
            if keys.last().is_none_or(|k| k[..] != key[..]) {
                keys.push(key.into());
            }
        }
        Ok((keys, damage))
    }

    /// M8 a page at a time: up to `limit` keys (at least one) that sort after `after` (from
    /// the first when `None`), in [`Db::list_keys`]'s order, and whether more follow. Reads
    /// about the page's refs, not every key's, so a bucket of millions of keys lists as
    /// fast as a small one.
    pub fn list_keys_page(&self, after: Option<&[u8]>, limit: usize) -> Result<(Vec<Bytes>, bool)> {
        self.list_keys_page_on(after, limit, None)
    }

    /// [`Db::list_keys_page`] of the keys that have tagged branch `branch` (all keys with
    /// a head when `None`).
    pub fn list_keys_page_on(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        branch: Option<&str>,
    ) -> Result<(Vec<Bytes>, bool)> {
        let (keys, next) = self.list_keys_page_bounded(after, limit, branch, usize::MAX)?;
        Ok((keys, next.is_some()))
    }

    /// [`Db::list_keys_page_on`] reading about `max_refs` head refs at most (and at least
    /// one batch of the store's listing), whatever the keys hold: returns the keys found
    /// and, when more may follow, the key to go on after (the last one listed, or past
    /// `max_refs` the last one looked at: every key up to it was looked at whole). A key's
    /// refs past its first few are not read one by one: its `branch` head is looked up and
    /// the rest of the key skipped, so a key with a long archive of branches costs a
    /// lookup and a batch, not its branches; and a run of keys without `branch` (deleted
    /// files whose history is kept) ends the call near `max_refs`.
    pub fn list_keys_page_bounded(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        branch: Option<&str>,
        max_refs: usize,
    ) -> Result<(Vec<Bytes>, Option<Bytes>)> {
        /// Refs of one key read before its branch is looked up and the key skipped.
        const SKIP_AFTER: usize = 8;
        /// The key being read.
        struct Current {
            key: Vec<u8>,
            refs: usize,
            listed: bool,
            /// Looked at whole (looked up): its other refs are passed over.
            skipping: bool,
        }
        let limit = limit.max(1);
        // All refs of key K start with `key_prefix(K)`, which ends with the terminator
        // 0x00 0x01; ending it with 0x00 0x02 instead gives the least name above all of
        // them and below every later key (a longer key continues with a byte above 0x00,
        // or with the escape 0x00 0xFF).
        let past = |k: &[u8]| {
            let mut p = self.key_prefix(k);
            if let Some(last) = p.last_mut() {
                *last = 2;
            }
            p
        };
        let mut from = match after {
            Some(k) => past(k),
            None => self.prefix.clone(),
        };
        let wanted = |head: &[u8]| match branch {
            None => true,
            Some(b) => head.first() == Some(&b't') && &head[1..] == b.as_bytes(),
        };
        let mut keys: Vec<Bytes> = Vec::with_capacity(limit.min(4096) + 1);
        let mut cur: Option<Current> = None;
        // The last key looked at whole.
        let mut done: Option<Vec<u8>> = None;
        let mut seen = 0usize;
        // A key has one ref per head, so a page of refs holds at most that many keys.
        let batch = limit.saturating_add(1).clamp(64, 4096);
        loop {
            let refs = self.store.list_refs_from(&self.prefix, &from, batch)?;
            for (name, _) in &refs {
                let (key, head) =
                    Self::key_of_ref(&name[self.prefix.len()..]).ok_or_else(|| {
                        Error::corrupt(format!(
                            "head ref {:?} has an unknown form",
                            String::from_utf8_lossy(name)
                        ))
                    })?;
                if cur.as_ref().is_none_or(|c| c.key != key) {
                    if let Some(c) = cur.take() {
                        done = Some(c.key);
                    }
                    if seen > max_refs
                        && let Some(d) = &done
                    {
                        return Ok((keys, Some(d.clone().into())));
                    }
                    cur = Some(Current {
                        key,
                        refs: 0,
                        listed: false,
                        skipping: false,
                    });
                }
                seen += 1;
                let Some(c) = cur.as_mut() else { continue };
                if c.skipping {
                    continue;
                }
                c.refs += 1;
                if !c.listed && wanted(head) {
                    if keys.len() == limit {
                        let last = keys.last().cloned();
                        return Ok((keys, last));
                    }
                    c.listed = true;
                    keys.push(c.key.clone().into());
                }
                if c.refs > SKIP_AFTER {
                    if !c.listed
                        && let Some(b) = branch
                    {
                        let mut tagged = self.key_prefix(&c.key);
                        tagged.push(b't');
                        tagged.extend_from_slice(b.as_bytes());
                        if self.store.get_ref(&tagged)?.is_some() {
                            if keys.len() == limit {
                                let last = keys.last().cloned();
                                return Ok((keys, last));
                            }
                            c.listed = true;
                            keys.push(c.key.clone().into());
                        }
                    }
                    c.skipping = true;
                }
            }
            let Some((last, _)) = refs.last().filter(|_| refs.len() == batch) else {
                return Ok((keys, None));
            };
            match cur.take_if(|c| c.skipping) {
                // The rest of a key looked at whole is not read.
                Some(c) => {
                    from = past(&c.key);
                    done = Some(c.key);
                }
                None => {
                    // The least name above the last one read.
                    from = last.to_vec();
                    from.push(0);
                }
            }
            if seen > max_refs
                && let Some(d) = &done
                && cur.is_none()
            {
                return Ok((keys, Some(d.clone().into())));
            }
        }
    }

    /// M9: tagged branches of `key` with their heads, sorted by name.
    pub fn list_tagged(&self, key: &[u8]) -> Result<Vec<(String, Uid)>> {
        Ok(self.existing_table(key)?.tagged.into_iter().collect())
    }

    /// M10: untagged heads of `key` (more than one means concurrent puts forked it).
    pub fn list_untagged(&self, key: &[u8]) -> Result<Vec<Uid>> {
        Ok(self.existing_table(key)?.untagged.into_iter().collect())
    }

    // ----- writes -----

    pub(crate) fn store_object(&self, o: &FObject) -> Result<Uid> {
        // Every inline value, however made (put, type operation, merge), within the limit.
        match &o.value {
            Value::String(b) => check_inline(b.len())?,
            Value::Tuple(t) => check_inline(tuple_bytes(t))?,
            _ => {}
        }
        let chunk = o.to_chunk();
        let uid = self.algo.digest(&chunk);
        self.store.put_hashed(uid, &chunk)?;
        Ok(uid)
    }

    /// Makes `t` the branch table of `key`: one atomic, durable commit of the head refs
    /// that changed.
    pub(crate) fn commit_table(&self, key: &[u8], t: &BranchTable) -> Result<()> {
        let before = self.table(key)?;
        let prefix = self.key_prefix(key);
        let name = |kind: u8, rest: &[u8]| Self::head_name(&prefix, kind, rest);
        let mut updates = Vec::new();
        for b in before.tagged.keys() {
            if !t.tagged.contains_key(b) {
                updates.push(RefUpdate::Delete {
                    name: name(b't', b.as_bytes()),
                });
            }
        }
        for (b, uid) in &t.tagged {
            if before.tagged.get(b) != Some(uid) {
                updates.push(RefUpdate::Set {
                    name: name(b't', b.as_bytes()),
                    value: uid.to_bytes().to_vec(),
                });
            }
        }
        for uid in before.untagged.difference(&t.untagged) {
            updates.push(RefUpdate::Delete {
                name: name(b'u', &uid.to_bytes()),
            });
        }
        for uid in t.untagged.difference(&before.untagged) {
            updates.push(RefUpdate::Set {
                name: name(b'u', &uid.to_bytes()),
                value: uid.to_bytes().to_vec(),
            });
        }
        if updates.is_empty() {
            return Ok(());
        }
        self.store.commit(&updates)
    }

    /// Stores a whole new value's chunks (POS-tree for chunkable types).
    ///
    /// Private to the crate: a value's chunks must be written under the writers' guard
    /// (see [`crate::gc`]) by the same call that commits the version naming them.
    pub(crate) fn store_value(&self, v: NewValue) -> Result<Value> {
        let s = self.chunks();
        Ok(match v {
            NewValue::String(b) => {
                check_inline(b.len())?;
                Value::String(b.into())
            }
            NewValue::Integer(i) => Value::Integer(i),
            NewValue::Tuple(items) => {
                check_inline(tuple_bytes(&items))?;
                Value::Tuple(items.into_iter().map(Bytes::from).collect())
            }
            NewValue::Blob(b) => Value::Tree(postree::build_blob(s, &self.cfg, &b)?),
            NewValue::List(items) => Value::Tree(postree::build_list(s, &self.cfg, items)?),
            NewValue::Map(m) => Value::Tree(postree::build_map(s, &self.cfg, m)?),
            NewValue::Set(m) => Value::Tree(postree::build_set(s, &self.cfg, m)?),
        })
    }

    /// M3 / M4: writes a whole new value. Returns the new uid.
    pub fn put(
        &self,
        key: &[u8],
        target: Target<'_>,
        value: NewValue,
        opts: &PutOptions,
    ) -> Result<Uid> {
        check_key(key)?;
        let _w = self.writer_guard();
        let value = self.store_value(value)?;
        self.put_value(key, target, opts, false, |base_ty, _| {
            if let Some(ty) = base_ty {
                same_type(key, ty, value.value_type())?;
            }
            Ok(value)
        })
    }

    /// Streams a Blob from `reader` in constant memory, then puts it like [`Db::put`].
    /// `progress` is called with the bytes read so far.
    pub fn put_blob_stream(
        &self,
        key: &[u8],
        target: Target<'_>,
        reader: &mut dyn Read,
        opts: &PutOptions,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Uid> {
        crate::fobject::check_context(&opts.context)?;
        self.put_blob_stream_then(key, target, reader, progress, &mut || Ok(opts.clone()))
    }

    /// Checks, without writing anything, what a put of a `ty` value to `target` with `opts`
    /// would be refused for on what the store holds now: the key, the context, the guard,
    /// a branch that is not there on a key that has heads, a base that is no version of
    /// the key, a value of another type than the head's. A streamed put checks these only
    /// once its whole input is stored, so a caller with a large input calls this first;
    /// the put checks again at its commit (the store may change meanwhile).
    pub fn check_put_target(
        &self,
        key: &[u8],
        target: Target<'_>,
        ty: ValueType,
        opts: &PutOptions,
    ) -> Result<()> {
        check_key(key)?;
        crate::fobject::check_context(&opts.context)?;
        // Versions the caller names, as the put admits them.
        if let Target::Base(u) = target {
            self.admit(key, &u)?;
        }
        if let Some(u) = &opts.branch_from {
            self.admit(key, u)?;
        }
        let head = match target {
            Target::Branch(b) => self.branch_head(key, b)?,
            Target::Base(_) => None,
        };
        if let Some((b, head)) = self.put_base(key, target, head, opts)? {
            let o = if head {
                self.load_reached(key, &b)?
            } else {
                self.load_for_key(key, &b)?
            };
            same_type(key, o.value_type(), ty)?;
        }
        Ok(())
    }

    /// What a put to `target` builds on, given the target branch's `head` (read by the
    /// caller): the head (`true`: reached through its head ref, so another key's version
    /// there is damage), a new branch's `branch_from`, a base version, or nothing on a key
    /// without heads. Refused: a new branch's bad name, a guard that does not hold or
    /// given with a base, a branch a key with heads does not have. (Named versions are
    /// admitted by the caller.)
    fn put_base(
        &self,
        key: &[u8],
        target: Target<'_>,
        head: Option<Uid>,
        opts: &PutOptions,
    ) -> Result<Option<(Uid, bool)>> {
        let b = match target {
            Target::Base(u) => {
                if opts.guard.is_some() {
                    return Err(guard_on_base());
                }
                return Ok(Some((u, false)));
            }
            Target::Branch(b) => b,
        };
        if head.is_none() {
            // A branch with a head passed this check when it was created.
            check_branch_name(b)?;
        }
        if let Some(g) = opts.guard
            && head != Some(g)
        {
            return Err(guard_mismatch(key, b, head, g));
        }
        Ok(match (head, opts.branch_from) {
            (Some(h), _) => Some((h, true)),
            (None, Some(from)) => Some((from, false)),
            (None, None) => {
                let table = self.table(key)?;
                if !table.is_empty() {
                    return Err(missing_branch(key, b, &table));
                }
                None
            }
        })
    }

    /// [`Db::put_blob_stream`] whose options are decided by `before_commit`, called once
    /// the whole blob is stored and right before the version is committed: a caller
    /// re-checks there what may have changed while the input arrived (an authorization,
    /// the branch's head), and an error from it commits nothing.
    pub fn put_blob_stream_then(
        &self,
        key: &[u8],
        target: Target<'_>,
        reader: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
        before_commit: &mut dyn FnMut() -> Result<PutOptions>,
    ) -> Result<Uid> {
        check_key(key)?;
        let _w = self.writer_guard();
        let shared: Arc<dyn ChunkStore> = self.store.clone();
        let mut w = BlobWriter::new(self.chunks(), &self.cfg).storing_on_pipe(shared);
        // The input is read straight into the writer's cutting window.
        while w.read_from(reader)? > 0 {
            progress(w.bytes_written());
        }
        let tree = w.finish()?;
        let opts = before_commit()?;
        crate::fobject::check_context(&opts.context)?;
        let opts = &opts;
        self.put_value(key, target, opts, false, |base_ty, _| {
            if let Some(ty) = base_ty {
                same_type(key, ty, ValueType::Blob)?;
            }
            Ok(Value::Tree(tree))
        })
    }

    /// Builds a List from `elements` as they arrive (constant memory), then puts it like
    /// [`Db::put`]. The first element error aborts the put; nothing is committed.
    pub fn put_list_stream(
        &self,
        key: &[u8],
        target: Target<'_>,
        elements: &mut dyn Iterator<Item = Result<Vec<u8>>>,
        opts: &PutOptions,
    ) -> Result<Uid> {
        check_key(key)?;
        crate::fobject::check_context(&opts.context)?;
        let _w = self.writer_guard();
        let mut failed = None;
        let it = std::iter::from_fn(|| match elements.next() {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                failed = Some(e);
                None
            }
            None => None,
        });
        let tree = postree::build_list(self.chunks(), &self.cfg, it)?;
        if let Some(e) = failed {
            return Err(e);
        }
        self.put_value(key, target, opts, false, |base_ty, _| {
            if let Some(ty) = base_ty {
                same_type(key, ty, ValueType::List)?;
            }
            Ok(Value::Tree(tree))
        })
    }

    /// Applies a type operation to the version at `target` (a branch head or a base uid)
    /// and stores the result as a new version, atomically with respect to other writers.
    /// The new version keeps the base version's context unless `opts` gives one.
    pub fn update(&self, key: &[u8], target: Target<'_>, op: Op, opts: &PutOptions) -> Result<Uid> {
        check_key(key)?;
        let _w = self.writer_guard();
        self.put_value(key, target, opts, true, |_, base| {
            let base = base.ok_or_else(|| {
                Error::not_found(format!(
                    "key {} (nothing to apply {} to)",
                    show_key(key),
                    op.name()
                ))
            })?;
            self.apply_op(&base.value, op)
        })
    }

    /// The common path of every Put: under the key lock, resolve the base, check the guard,
    /// make the value, store the FObject and commit the branch table. `make` gets the base's
    /// type, and the whole base version when `needs_base_value` (type operations, whose
    /// new version keeps the base's context when `opts` gives none).
    fn put_value(
        &self,
        key: &[u8],
        target: Target<'_>,
        opts: &PutOptions,
        needs_base_value: bool,
        make: impl FnOnce(Option<ValueType>, Option<&FObject>) -> Result<Value>,
    ) -> Result<Uid> {
        crate::fobject::check_context(&opts.context)?;
        // Versions the caller names, checked before any lock is taken.
        if let Target::Base(u) = target {
            self.admit(key, &u)?;
        }
        if let Some(u) = &opts.branch_from {
            self.admit(key, u)?;
        }
        let key_hash = self.key_hash(key);
        let key_id = key_id(key);
        let mut stripe = self.lock_key_hash(key_hash);
        // One buffer for every ref name this put looks up or writes: the key's prefix, then
        // a head's kind and name.
        let mut name = self.key_prefix(key);
        let plen = name.len();
        let head = match target {
            Target::Branch(b) => {
                name.push(b't');
                name.extend_from_slice(b.as_bytes());
                match self.store.get_ref(&name)? {
                    None => None,
                    Some(v) => Some(Uid::from_bytes(&v).map_err(|e| {
                        Error::corrupt(format!("head ref of branch {b:?} is damaged: {e}"))
                    })?),
                }
            }
            Target::Base(_) => None,
        };
        let (base, head_is_base) = match self.put_base(key, target, head, opts)? {
            Some((b, h)) => (Some(b), h),
            None => (None, false),
        };
        let cached = base
            .and_then(|b| stripe.recall(&b))
            .filter(|i| i.key_id == key_id);
        let (base_info, base_obj) = match base {
            None => (None, None),
            Some(b) => match cached {
                Some(info) if !needs_base_value => (Some(info), None),
                _ => {
                    // The branch's head is reached through its head ref; a base the caller
                    // named (`Target::Base`, `branch_from`) is looked up by uid.
                    let o = if head_is_base {
                        self.load_reached(key, &b)?
                    } else {
                        self.load_for_key(key, &b)?
                    };
                    let info = BaseInfo {
                        key_id,
                        depth: o.depth,
                        ty: o.value_type(),
                    };
                    (Some(info), Some(o))
                }
            },
        };
        let depth = match base_info {
            None => 0,
            Some(b) => b.depth.checked_add(1).ok_or_else(|| {
                Error::corrupt(format!(
                    "the base of this put on key {} claims the greatest depth there is",
                    show_key(key)
                ))
            })?,
        };
        let value = make(base_info.map(|i| i.ty), base_obj.as_ref())?;
        let object = FObject {
            key: Bytes::copy_from_slice(key),
            value,
            depth,
            bases: base.into_iter().collect(),
            context: match &base_obj {
                Some(b) if needs_base_value && opts.context.is_empty() => b.context.clone(),
                _ => Bytes::copy_from_slice(&opts.context),
            },
        };
        let uid = self.store_object(&object)?;
        stripe.remember(
            uid,
            BaseInfo {
                key_id,
                depth: object.depth,
                ty: object.value_type(),
            },
        );
        // Only the refs that change are written: the branch head (or the untagged heads).
        let mut updates = Vec::with_capacity(2);
        if let Some(h) = base {
            let mut untagged = Vec::with_capacity(plen + 35);
            untagged.extend_from_slice(&name[..plen]);
            untagged.push(b'u');
            untagged.extend_from_slice(&h.to_bytes());
            if self.store.get_ref(&untagged)?.is_some() {
                updates.push(RefUpdate::Delete { name: untagged });
            }
        }
        let uid_bytes = uid.to_bytes().to_vec();
        if let Target::Base(_) = target {
            name.truncate(plen);
            name.push(b'u');
            name.extend_from_slice(&uid_bytes);
        }
        updates.push(RefUpdate::Set {
            name,
            value: uid_bytes,
        });
        let branch = match target {
            Target::Branch(b) => Some(b),
            Target::Base(_) => None,
        };
        self.record_head(HeadChange {
            kind: HeadChangeKind::Put,
            key,
            branch,
            from: None,
            uid,
            bases: &object.bases,
            object: Some(&object),
            owner_seal: opts.owner_seal.as_deref(),
        })?;
        self.store.commit(&updates)?;
        Ok(uid)
    }

    fn apply_op(&self, v: &Value, op: Op) -> Result<Value> {
        let s = self.chunks();
        let mismatch = |v: &Value| {
            let t = v.value_type();
            let takes = match t {
                ValueType::String | ValueType::Tuple => "append, insert",
                ValueType::Integer => "add, multiply",
                ValueType::Blob => "blob splice",
                ValueType::List => "list splice",
                ValueType::Map => "map update",
                ValueType::Set => "set update",
            };
            let a = if t == ValueType::Integer { "an" } else { "a" };
            Error::TypeMismatch(format!(
                "{} does not apply to {a} {t} (it takes: {takes})",
                op.name()
            ))
        };
        if let Some(r) = apply_inline(v, &op) {
            return r;
        }
        Ok(match (v, &op) {
            (
                Value::Tree(t),
                Op::BlobSplice {
                    offset,
                    delete,
                    insert,
                },
            ) if v.value_type() == ValueType::Blob => Value::Tree(postree::blob_splice(
                s, &self.cfg, t, *offset, *delete, insert,
            )?),
            (
                Value::Tree(t),
                Op::ListSplice {
                    index,
                    delete,
                    insert,
                },
            ) if v.value_type() == ValueType::List => {
                let ins: Vec<Bytes> = insert.iter().map(|x| Bytes::copy_from_slice(x)).collect();
                Value::Tree(postree::list_splice(
                    s, &self.cfg, t, *index, *delete, &ins,
                )?)
            }
            (Value::Tree(t), Op::MapUpdate(edits)) if v.value_type() == ValueType::Map => {
                Value::Tree(postree::map_update(s, &self.cfg, t, edits.clone())?)
            }
            (Value::Tree(t), Op::SetUpdate(edits)) if v.value_type() == ValueType::Set => {
                Value::Tree(postree::set_update(s, &self.cfg, t, edits.clone())?)
            }
            _ => return Err(mismatch(v)),
        })
    }

    /// M11 / M12: creates tagged branch `new_branch` at a branch head or a version.
    pub fn fork(&self, key: &[u8], from: &At, new_branch: &str) -> Result<Uid> {
        check_key(key)?;
        check_branch_name(new_branch)?;
        if let At::Uid(u) = from {
            self.admit(key, u)?;
        }
        let _w = self.writer_guard();
        let key_hash = self.key_hash(key);
        let stripe = self.lock_key_hash(key_hash);
        let prefix = self.key_prefix(key);
        let uid = match from {
            At::Branch(b) => self.tagged_head(&prefix, b)?.ok_or_else(|| {
                Error::not_found(format!("branch {b:?} of key {}", show_key(key)))
            })?,
            At::Uid(u) => {
                // A uid from outside must name a version of this key (which may have no
                // branch left: forking one of its versions brings it back).
                let known = stripe.recall(u).is_some_and(|i| i.key_id == key_id(key));
                if !known {
                    self.load_for_key(key, u)?;
                }
                *u
            }
        };
        let name = Self::head_name(&prefix, b't', new_branch.as_bytes());
        if self.store.get_ref(&name)?.is_some() {
            return Err(Error::AlreadyExists(format!(
                "branch {new_branch:?} of key {}",
                show_key(key)
            )));
        }
        self.record_head(HeadChange {
            kind: HeadChangeKind::Fork,
            key,
            branch: Some(new_branch),
            from: None,
            uid,
            bases: &[],
            object: None,
            owner_seal: None,
        })?;
        self.store.commit(&[RefUpdate::Set {
            name,
            value: uid.to_bytes().to_vec(),
        }])?;
        Ok(uid)
    }

    /// M13: renames a tagged branch; returns its head.
    pub fn rename(&self, key: &[u8], from: &str, to: &str) -> Result<Uid> {
        check_branch_name(to)?;
        let _k = self.lock_key(key);
        // The two refs involved only: a key with many branches (a Gaia file deleted under
        // archival scopes many times, each a rename) made every rename read them all.
        // (The target first, as before: a rename onto a taken name is refused as such.)
        if self.branch_head(key, to)?.is_some() {
            return Err(Error::AlreadyExists(format!(
                "branch {to:?} of key {}",
                show_key(key)
            )));
        }
        let uid = match self.branch_head(key, from)? {
            Some(u) => u,
            None => return Err(self.missing_branch(key, from)),
        };
        self.record_head(HeadChange {
            kind: HeadChangeKind::Rename,
            key,
            branch: Some(to),
            from: Some(from),
            uid,
            bases: &[],
            object: None,
            owner_seal: None,
        })?;
        let prefix = self.key_prefix(key);
        self.store.commit(&[
            RefUpdate::Delete {
                name: Self::head_name(&prefix, b't', from.as_bytes()),
            },
            RefUpdate::Set {
                name: Self::head_name(&prefix, b't', to.as_bytes()),
                value: uid.to_bytes().to_vec(),
            },
        ])?;
        Ok(uid)
    }

    /// The error for branch `branch` of `key` not being there: the key's, when the key has
    /// no head at all.
    pub(crate) fn missing_branch(&self, key: &[u8], branch: &str) -> Error {
        match self.heads_page(key, None, 1) {
            Err(Error::NotFound(_)) => Error::not_found(format!("key {}", show_key(key))),
            Err(e) => e,
            Ok(_) => Error::not_found(format!("branch {branch:?} of key {}", show_key(key))),
        }
    }

    /// M14: removes a tagged branch (its versions stay until no head reaches them and GC
    /// runs). Removing a key's last head removes the key. Returns the removed head.
    pub fn remove(&self, key: &[u8], branch: &str) -> Result<Uid> {
        self.remove_guarded(key, branch, None)
    }

    /// [`Db::remove`] only if the branch's head is `guard` (when given), checked under the
    /// key's lock with the removal: otherwise a [`Error::GuardMismatch`] and nothing
    /// changes.
    pub fn remove_guarded(&self, key: &[u8], branch: &str, guard: Option<&Uid>) -> Result<Uid> {
        let _k = self.lock_key(key);
        // The branch's ref only (see `rename`).
        let Some(uid) = self.branch_head(key, branch)? else {
            // A guard names the head it expects: with none there, the guard fails (as an
            // HTTP If-Match on a missing resource does), rather than "not found".
            return Err(match guard {
                Some(g) => Error::GuardMismatch(format!(
                    "branch {branch:?} of key {} is at nothing, not {g}",
                    show_key(key)
                )),
                None => self.missing_branch(key, branch),
            });
        };
        if let Some(g) = guard
            && *g != uid
        {
            return Err(Error::GuardMismatch(format!(
                "branch {branch:?} of key {} is at {uid}, not {g}",
                show_key(key)
            )));
        }
        self.record_head(HeadChange {
            kind: HeadChangeKind::Remove,
            key,
            branch: Some(branch),
            from: None,
            uid,
            bases: &[],
            object: None,
            owner_seal: None,
        })?;
        self.store.commit(&[RefUpdate::Delete {
            name: Self::head_name(&self.key_prefix(key), b't', branch.as_bytes()),
        }])?;
        Ok(uid)
    }
}

/// One head ref of a key, from its name after the key's prefix (`t<branch>` or `u<uid>`)
/// and its value (the head's uid); what is wrong with it otherwise.
fn parse_head_ref(rest: &[u8], value: &[u8]) -> std::result::Result<(HeadPos, Uid), String> {
    let shown = || String::from_utf8_lossy(rest).into_owned();
    let uid = Uid::from_bytes(value).map_err(|e| format!("head ref {:?}: {e}", shown()))?;
    match rest.split_first() {
        Some((b't', branch)) => match std::str::from_utf8(branch) {
            Ok(branch) => Ok((HeadPos::Tagged(branch.to_string()), uid)),
            Err(_) => Err("a branch name is not UTF-8".into()),
        },
        Some((b'u', u)) if u == uid.to_bytes() => Ok((HeadPos::Untagged(uid), uid)),
        _ => Err(format!("head ref {:?} has an unknown form", shown())),
    }
}

/// The bucket a Db serves unless told otherwise (the CLI's bucket).
pub const DEFAULT_BUCKET: &str = "default";

/// Checks a bucket name: 1 to 64 bytes of lowercase letters, digits, `.`, `_` and `-`.
pub fn check_bucket_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "bucket name {name:?}: use 1 to 64 characters from a-z, 0-9, '.', '_' and '-'"
        )))
    }
}

/// The value an operation on an inline value (String, Tuple, Integer) makes, as
/// [`Db::update`] makes it; `None` for a value or an operation on a POS-tree, or one that
/// does not apply to the value's type. A client checking what a node made of its update
/// computes the same.
pub fn apply_inline(v: &Value, op: &Op) -> Option<Result<Value>> {
    let past_end = |pos: u64, len: usize, what: &str| {
        usize::try_from(pos)
            .ok()
            .filter(|p| *p <= len)
            .ok_or_else(|| {
                Error::invalid(format!("insert at {pos} is past the end ({len} {what})"))
            })
    };
    Some(match (v, op) {
        (Value::String(b), Op::Append(x)) => check_inline(b.len() + x.len()).map(|()| {
            let mut n = b.to_vec();
            n.extend_from_slice(x);
            Value::String(n.into())
        }),
        (Value::String(b), Op::Insert(pos, x)) => {
            past_end(*pos, b.len(), "bytes").and_then(|pos| {
                check_inline(b.len() + x.len())?;
                let mut n = Vec::with_capacity(b.len() + x.len());
                n.extend_from_slice(&b[..pos]);
                n.extend_from_slice(x);
                n.extend_from_slice(&b[pos..]);
                Ok(Value::String(n.into()))
            })
        }
        (Value::Tuple(t), Op::Append(x)) => check_inline(tuple_bytes(t) + x.len() + 4).map(|()| {
            let mut n = t.clone();
            n.push(Bytes::copy_from_slice(x));
            Value::Tuple(n)
        }),
        (Value::Tuple(t), Op::Insert(pos, x)) => {
            past_end(*pos, t.len(), "elements").and_then(|pos| {
                check_inline(tuple_bytes(t) + x.len() + 4)?;
                let mut n = t.clone();
                n.insert(pos, Bytes::copy_from_slice(x));
                Ok(Value::Tuple(n))
            })
        }
        (Value::Integer(i), Op::Add(x)) => i
            .checked_add(*x)
            .map(Value::Integer)
            .ok_or_else(|| Error::invalid(format!("{i} + {x} overflows a 64-bit integer"))),
        (Value::Integer(i), Op::Multiply(x)) => i
            .checked_mul(*x)
            .map(Value::Integer)
            .ok_or_else(|| Error::invalid(format!("{i} * {x} overflows a 64-bit integer"))),
        _ => return None,
    })
}

/// The bytes a tuple counts against [`MAX_INLINE_BYTES`] (as a put of it counts them).
fn tuple_bytes<T: AsRef<[u8]>>(t: &[T]) -> usize {
    t.iter().map(|i| i.as_ref().len() + 4).sum()
}

fn check_inline(n: usize) -> Result<()> {
    if n > MAX_INLINE_BYTES {
        return Err(Error::invalid(format!(
            "inline values are limited to {} MiB; store large data as a blob or list",
            MAX_INLINE_BYTES >> 20
        )));
    }
    Ok(())
}

/// A put's guard `g` on branch `b` of `key`, whose head is `head`, does not hold.
fn guard_mismatch(key: &[u8], b: &str, head: Option<Uid>, g: Uid) -> Error {
    Error::GuardMismatch(format!(
        "branch {b:?} of key {} is at {}, not {g}",
        show_key(key),
        head.map(|h| h.to_string())
            .unwrap_or_else(|| "nothing".into())
    ))
}

/// A put to branch `b`, which `key` (with heads, `table`) does not have.
fn missing_branch(key: &[u8], b: &str, table: &crate::branch::BranchTable) -> Error {
    Error::not_found(format!(
        "branch {b:?} of key {} ({}); use fork to create it",
        show_key(key),
        table.describe()
    ))
}

/// A guard given with a put on a base version.
fn guard_on_base() -> Error {
    Error::invalid("a guard applies to a branch put, not to a put on a base version")
}

fn same_type(key: &[u8], old: ValueType, new: ValueType) -> Result<()> {
    if old != new {
        return Err(Error::TypeMismatch(format!(
            "key {} holds a {old}; a {new} cannot be put on it (use another key)",
            show_key(key)
        )));
    }
    Ok(())
}
