//! The node's shared state: the store, the capsule server, the open buckets and the
//! metrics, built once by [`Node::open`] and shared by every request handler.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cairn_capsule::{Bucket, CapsuleServer, ServerOptions};
use cairn_core::SigningKey;
use cairn_object::Db;
use cairn_store::{LogStore, LogStoreOptions, Store};
use lru::LruCache;
use parking_lot::Mutex;

use crate::config::Config;
use crate::metrics::Metrics;

/// The capsule server's verified-body cache in a node (see `Node::open`).
const NODE_BODY_CACHE_BYTES: usize = 16 << 20;

/// The node key's file in the data directory: it signs capsule acks and checkpoints, and
/// writes the records of buckets the node keeps for its users (e.g. Gaia buckets).
pub const NODE_KEY_FILE: &str = "node.key";

/// Everything a request handler needs.
pub struct Node {
    /// The configuration the node started with.
    pub config: Config,
    /// The chunk and ref store.
    pub store: Arc<dyn Store>,
    /// The capsule server over the same store.
    pub capsules: Arc<CapsuleServer>,
    /// Request and storage metrics.
    pub metrics: Metrics,
    key: SigningKey,
    /// The store's one Db; every bucket is a view of it (shared writer and key locks).
    db: Db,
    /// Open buckets, least recently used first out (see [`Config::max_open_buckets`]: a
    /// hub whose users create buckets at will, as any Gaia address may write to its own,
    /// keeps its memory bounded this way).
    buckets: Mutex<LruCache<String, Arc<Bucket>>>,
    /// One gate per bucket being opened: its opener loads it (replaying its capsule) with
    /// no lock every request takes held, and a second request for it waits at the gate
    /// instead of opening a second copy.
    opening: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Permits for streamed transfers (`max_transfers`).
    transfers: Arc<tokio::sync::Semaphore>,
    /// The share of them reads may hold ([`read_share`]): the rest stays for writes, so
    /// slow readers cannot lock uploads out.
    reads: Arc<tokio::sync::Semaphore>,
    /// The share of them writes may hold ([`write_share`]): the rest stays for reads, so
    /// slow uploads (any Gaia identity, which costs nothing to make, may upload) cannot
    /// lock downloads out.
    writes: Arc<tokio::sync::Semaphore>,
    /// Transfers in progress per peer address ([`PeerCounts`]), within
    /// `max_transfers_per_ip`.
    peer_transfers: PeerCounts,
    /// Transfers in progress per IPv6 site ([`cairn_net::peer_site`]), within
    /// [`cairn_net::SITE_CONNECTIONS_FACTOR`] times `max_transfers_per_ip` (counted apart:
    /// a site's key may equal one of its /64s').
    site_transfers: PeerCounts,
    /// Signatures of the native API accepted recently, including before a restart.
    pub replay: crate::native::auth::ReplayGuard,
    /// KiB of memory for request bodies buffered whole and their parsed forms
    /// ([`Node::buffered_memory`]).
    buffered: Arc<tokio::sync::Semaphore>,
}

/// MiB of memory all buffered request bodies (typed values and JSON, at most
/// [`crate::native::objects::BUFFERED_LIMIT`] each) and their parsed forms may take at
/// once: one of the largest and some small ones.
pub const BUFFERED_MEMORY_MIB: u32 = 320;
/// Most MiB one merge through the node may hold in memory ([`cairn_object::Db::with_merge_memory`]),
/// taken whole from the budget of [`BUFFERED_MEMORY_MIB`] while it runs: at most five
/// merges at once when nothing else holds any.
pub const MERGE_MEMORY_MIB: u64 = 64;

/// Memory a buffered body takes at its peak, in multiples of its size: the body, the
/// parsed JSON or text, the values copied out of it and, for JSON, the set of its keys.
const BUFFERED_FACTOR: u64 = 4;

/// One request's share of the memory for bodies parsed in memory
/// ([`Node::buffered_memory`]), charged as its bytes arrive: four times what it holds (it
/// is parsed once whole), so a client holds budget only for bytes it sent, and a body
/// without a declared length is charged for what it turns out to be.
pub struct BufferedMemory {
    pool: Arc<tokio::sync::Semaphore>,
    /// The KiB held (the pool counts KiB, so a small body holds little of it).
    held: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// KiB of the budget a body of `bytes` takes.
fn budget_kib(bytes: u64) -> u32 {
    bytes
        .saturating_mul(BUFFERED_FACTOR)
        .div_ceil(1 << 10)
        .clamp(1, u64::from(BUFFERED_MEMORY_MIB) << 10) as u32
}

impl BufferedMemory {
    /// Grows the share to cover a body of `bytes`; refused (503 for the caller) when the
    /// bodies in progress hold the budget.
    pub fn grow(&mut self, bytes: u64) -> Result<(), Busy> {
        self.grow_kib(budget_kib(bytes))
    }

    /// Grows the share to `bytes` of memory held as they are (not a body to parse: a
    /// streamed list's long line and its leaf); refused as [`BufferedMemory::grow`] is.
    pub fn hold(&mut self, bytes: u64) -> Result<(), Busy> {
        self.grow_kib(
            bytes
                .div_ceil(1 << 10)
                .clamp(1, u64::from(BUFFERED_MEMORY_MIB) << 10) as u32,
        )
    }

    fn grow_kib(&mut self, want: u32) -> Result<(), Busy> {
        let kib = self.held.as_ref().map_or(0, |h| h.num_permits() as u32);
        if want <= kib {
            return Ok(());
        }
        let more = self
            .pool
            .clone()
            .try_acquire_many_owned(want - kib)
            .map_err(|_| {
                Busy(format!(
                    "the request bodies being parsed in memory hold the {BUFFERED_MEMORY_MIB} \
                     MiB this node keeps for them; retry, or send a blob or a text list, \
                     which stream"
                ))
            })?;
        match &mut self.held {
            Some(h) => h.merge(more),
            None => self.held = Some(more),
        }
        Ok(())
    }
}

tokio::task_local! {
    /// The address group ([`cairn_net::peer_group`]) of the peer whose connection the
    /// current task serves, when its transfers are limited per address (set by the
    /// server around each connection; unset for loopback peers unless `limit_loopback`,
    /// and in requests handed to the router directly).
    pub static LIMITED_PEER: std::net::IpAddr;
    /// The address of the peer whose connection the current task serves (set by the
    /// server around each connection; unset in requests handed to the router directly).
    pub static PEER: std::net::IpAddr;
}

/// Counts of something held per peer address (connections, transfers), each given back
/// when its [`PeerSlot`] drops.
#[derive(Clone, Default)]
pub struct PeerCounts(Arc<Mutex<HashMap<std::net::IpAddr, usize>>>);

impl PeerCounts {
    /// One more for `ip`, unless it holds `max` already.
    pub fn take(&self, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut counts = self.0.lock();
        let n = counts.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            counts: self.clone(),
            ip,
        })
    }

    /// How many `ip` holds now.
    pub fn held(&self, ip: std::net::IpAddr) -> usize {
        self.0.lock().get(&ip).copied().unwrap_or(0)
    }
}

/// One of a peer's slots in a [`PeerCounts`], given back when dropped.
pub struct PeerSlot {
    counts: PeerCounts,
    ip: std::net::IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// A streamed transfer's permit ([`Node::write_permit`], [`Node::read_permit`]), given
/// back when dropped.
pub struct Transfer {
    _total: tokio::sync::OwnedSemaphorePermit,
    /// The read's or the write's share.
    _share: tokio::sync::OwnedSemaphorePermit,
    /// The peer address's share, and its IPv6 site's, when its transfers are limited.
    _peer: Option<(PeerSlot, Option<PeerSlot>)>,
}

/// Why no transfer permit was free: the message of the 503 the caller answers.
#[derive(Debug)]
pub struct Busy(pub String);

/// How many of `max_transfers` reads may hold at once: all but a quarter, which stays for
/// requests that write (at least one transfer is a read's).
pub fn read_share(max_transfers: usize) -> usize {
    (max_transfers - max_transfers / 4).max(1)
}

/// How many of `max_transfers` requests that write may hold at once: all but an eighth
/// (at least one), which stays for reads. Uploads hold less memory than downloads, and a
/// hub's clients mostly upload, so their share is the larger: 224 of the default 256.
pub fn write_share(max_transfers: usize) -> usize {
    max_transfers
        .saturating_sub((max_transfers / 8).max(1))
        .max(1)
}

impl Node {
    /// Opens the store in the configured data directory (waiting for another process to
    /// let go of it up to `lock_timeout_secs`) and the node key (created on first start).
    pub fn open(config: Config) -> Result<Arc<Self>> {
        config.check()?;
        let opts = LogStoreOptions {
            durability: config.durability,
            page_cache_window: config.page_cache_window(),
            ..Default::default()
        };
        let timeout = Duration::from_secs_f64(config.lock_timeout_secs);
        let store = LogStore::open_waiting(&config.data_dir, opts, timeout, &mut |msg| {
            tracing::warn!("waiting for the store: {msg}")
        })
        .with_context(|| format!("opening store {}", config.data_dir.display()))?;
        let key = crate::keys::read_or_create(&config.data_dir.join(NODE_KEY_FILE), "node", false)?;
        let unrecorded = check_backend_record(&config)?;
        let store = with_backend(&config, store, &key, unrecorded)?;
        if unrecorded {
            write_backend_record(&config)?;
        }
        for note in store.recovery_notes()? {
            tracing::warn!(%note, "crash recovery found damage (see `cairn recovery`)");
        }
        let capsules = Arc::new(CapsuleServer::new(
            store.clone(),
            key.clone(),
            ServerOptions {
                // A node's capsules hold its buckets' mutation records, read for logs and
                // proofs rather than in bulk: a small body cache adds about 16 MiB (its
                // budget, plus a few percent of bookkeeping for recently evicted names) to
                // a long-running node's memory, next to its streaming buffers.
                body_cache_bytes: NODE_BODY_CACHE_BYTES,
                max_loaded_capsules: config.max_open_buckets,
                ..ServerOptions::default()
            },
        ));
        let replay =
            crate::native::auth::ReplayGuard::load(&*store, crate::native::auth::now_secs())
                .context("loading the signatures accepted before the last restart")?;
        Ok(Arc::new(Node {
            replay,
            transfers: Arc::new(tokio::sync::Semaphore::new(config.max_transfers)),
            reads: Arc::new(tokio::sync::Semaphore::new(read_share(
                config.max_transfers,
            ))),
            writes: Arc::new(tokio::sync::Semaphore::new(write_share(
                config.max_transfers,
            ))),
            config,
            // A merge holds at most this much (the changes of both sides, the regions they
            // touch, the conflicts), taken from the budget for bodies held in memory while
            // it runs (see `native::versions::merge`).
            db: Db::new(store.clone()).with_merge_memory(MERGE_MEMORY_MIB << 20),
            store,
            capsules,
            metrics: Metrics::new()?,
            key,
            buckets: Mutex::new(LruCache::unbounded()),
            opening: Mutex::new(HashMap::new()),
            peer_transfers: PeerCounts::default(),
            site_transfers: PeerCounts::default(),
            buffered: Arc::new(tokio::sync::Semaphore::new(
                (BUFFERED_MEMORY_MIB as usize) << 10,
            )),
        }))
    }

    /// An empty share of [`BUFFERED_MEMORY_MIB`] for one request body read whole and
    /// parsed; it grows with the bytes that arrive ([`BufferedMemory::grow`]) and goes
    /// back when dropped.
    pub fn buffered_memory(&self) -> BufferedMemory {
        BufferedMemory {
            pool: self.buffered.clone(),
            held: None,
        }
    }

    /// Whether the budget for bodies held in memory has room now for a body of `bytes`
    /// (taking nothing): asked before a signed request's signature is used, so that a
    /// request refused for memory can be sent again unchanged. (Room can still run out
    /// while the body arrives; then the request is cut with 503 and must be signed anew.)
    pub fn has_buffered_room(&self, bytes: u64) -> bool {
        budget_kib(bytes) as usize <= self.buffered.available_permits()
    }

    /// A permit for one request that reads a body (an upload, a mutation), held until it
    /// ends; refused while writes hold their share of `max_transfers` (see
    /// [`write_share`]), all are in progress, or the peer's address holds
    /// `max_transfers_per_ip` (the caller answers 503 with `Retry-After`).
    pub fn write_permit(&self) -> Result<Transfer, Busy> {
        self.permit(true)
    }

    /// A permit for one request that sends data from the store (a download, a listing),
    /// held until it ends; refused while reads hold their share of `max_transfers` (see
    /// [`read_share`]), all are in progress, or the peer's address holds
    /// `max_transfers_per_ip`.
    pub fn read_permit(&self) -> Result<Transfer, Busy> {
        self.permit(false)
    }

    fn permit(&self, write: bool) -> Result<Transfer, Busy> {
        let all = self.config.max_transfers;
        // One address cannot take every transfer (slow uploads at the rate floor held
        // them all, for anyone: a Gaia identity costs nothing to make).
        let peer = match LIMITED_PEER.try_with(|ip| *ip) {
            Ok(ip) if self.config.max_transfers_per_ip > 0 => {
                let max = self.config.max_transfers_per_ip;
                // One IPv6 site's /64s together hold at most a few addresses' share.
                let site = match cairn_net::peer_site(ip) {
                    Some(site) => {
                        let most = max.saturating_mul(cairn_net::SITE_CONNECTIONS_FACTOR);
                        Some(self.site_transfers.take(site, most).ok_or_else(|| {
                            Busy(format!(
                                "{most} transfers from your network (its /48) are in \
                                 progress ({} times max_transfers_per_ip); retry when one \
                                 ends",
                                cairn_net::SITE_CONNECTIONS_FACTOR
                            ))
                        })?)
                    }
                    None => None,
                };
                let slot = self.peer_transfers.take(ip, max).ok_or_else(|| {
                    Busy(format!(
                        "{max} transfers from your address are in progress \
                         (max_transfers_per_ip); retry when one ends"
                    ))
                })?;
                Some((slot, site))
            }
            _ => None,
        };
        let (shares, share, what, kept) = if write {
            (
                &self.writes,
                write_share(all),
                "writes",
                "an eighth is kept for reads",
            )
        } else {
            (
                &self.reads,
                read_share(all),
                "reads",
                "a quarter is kept for writes",
            )
        };
        let busy = || {
            Busy(format!(
                "{share} {what} or {all} transfers in all are in progress (max_transfers, of \
                 which {kept}); retry shortly"
            ))
        };
        let share = shares.clone().try_acquire_owned().map_err(|_| busy())?;
        Ok(Transfer {
            _total: self
                .transfers
                .clone()
                .try_acquire_owned()
                .map_err(|_| busy())?,
            _share: share,
            _peer: peer,
        })
    }

    /// Transfers in progress now from the address group of `ip` (see
    /// [`cairn_net::peer_group`]), when its transfers are limited.
    pub fn peer_transfers(&self, ip: std::net::IpAddr) -> usize {
        self.peer_transfers.held(cairn_net::peer_group(ip))
    }

    /// Streamed transfers in progress now.
    pub fn transfers_in_progress(&self) -> usize {
        self.config
            .max_transfers
            .saturating_sub(self.transfers.available_permits())
    }

    /// How long a transfer may move no byte before it is cut (`stall_timeout_secs`).
    pub fn stall_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.config.stall_timeout_secs)
    }

    /// A fresh count against the minimum transfer rate (`min_rate_bytes_per_sec`, checked
    /// over each stall timeout's worth of waiting for the client).
    pub fn rate_floor(&self) -> crate::rate::RateFloor {
        crate::rate::RateFloor::new(self.config.min_rate_bytes_per_sec, self.stall_timeout())
    }

    /// A [`Db`] over bucket `name` that shares the store's writer and key locks with every
    /// other bucket of this node (see [`Db::for_bucket`]).
    pub fn db_for(&self, name: &str) -> cairn_core::Result<Db> {
        self.db.for_bucket(name)
    }

    /// [`Node::db_for`] building values with `leaf_size`-byte leaves: the Db a bucket the
    /// node creates starts with (an existing bucket's capsule overrides it with the leaf
    /// size it was created with).
    fn db_for_new(&self, name: &str, leaf_size: u64) -> cairn_core::Result<Db> {
        let cfg = self.db.tree_config().with_leaf_target(leaf_size)?;
        Ok(self.db_for(name)?.with_tree_config(cfg))
    }

    /// The bucket `name`, opened once and shared; the node key writes its capsule records
    /// (the bucket's capsule is created on first use).
    pub fn bucket(&self, name: &str) -> cairn_core::Result<Arc<Bucket>> {
        if let Some(b) = self.buckets.lock().get(name) {
            return Ok(b.clone());
        }
        self.opening_one(name, || {
            let db = self.db_for_new(name, self.config.leaf_size)?;
            Bucket::open(db, self.capsules.clone(), Some(self.key.clone()))
        })
        .map(|(b, _)| b)
    }

    /// Opens bucket `name` with `open` unless it is open already, one opener per name at a
    /// time, without holding the open buckets' lock while it loads. Returns the bucket and
    /// whether this call opened it.
    fn opening_one(
        &self,
        name: &str,
        open: impl FnOnce() -> cairn_core::Result<Bucket>,
    ) -> cairn_core::Result<(Arc<Bucket>, bool)> {
        let gate = self
            .opening
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone();
        let result = {
            let _turn = gate.lock();
            // Opened by the request this one waited for?
            let found = self.buckets.lock().get(name).cloned();
            match found {
                Some(b) => Ok((b, false)),
                None => open().map(|b| {
                    let b = Arc::new(b);
                    keep_open(
                        &mut self.buckets.lock(),
                        name,
                        b.clone(),
                        self.config.max_open_buckets,
                    );
                    (b, true)
                }),
            }
        };
        // The gate goes with its last user. This user's clone is dropped under the map's
        // lock, so of two users finishing together the second always sees itself last
        // (dropped after the lock, both could count three and leave the entry for good).
        let mut opening = self.opening.lock();
        let last = Arc::strong_count(&gate) == 2;
        drop(gate);
        if last {
            opening.remove(name);
        }
        result
    }

    /// Buckets open now (at most [`Config::max_open_buckets`] unless more are in use).
    pub fn open_buckets(&self) -> usize {
        self.buckets.lock().len()
    }

    /// Creates bucket `name` with a new capsule whose metadata carries `settings` besides
    /// the usual ones, so they are bound into the capsule name (the native API records a
    /// bucket's owner key this way), and opens it like [`Node::bucket`]. Its leaves
    /// average `leaf_size` bytes (default: the config's `leaf_size`), recorded in the
    /// metadata too. Fails when the bucket already has a capsule.
    pub fn create_bucket(
        &self,
        name: &str,
        leaf_size: Option<u64>,
        settings: &[(&str, String)],
    ) -> cairn_core::Result<Arc<Bucket>> {
        let leaf_size = leaf_size.unwrap_or(self.config.leaf_size);
        let db = self.db_for_new(name, leaf_size)?;
        let mut meta = cairn_capsule::CapsuleMetadata::new(
            db.algo(),
            self.key.public(),
            format!("bucket {name}"),
        );
        meta.cipher = cairn_capsule::BodyCipher::Plaintext;
        meta.key_distribution = "none: mutation records are plaintext".into();
        meta.settings.insert(
            cairn_capsule::bucket::BUCKET_SETTING.to_string(),
            name.to_string(),
        );
        meta.settings.insert(
            cairn_capsule::bucket::LEAF_SIZE_SETTING.to_string(),
            leaf_size.to_string(),
        );
        for (k, v) in settings {
            meta.settings.insert(k.to_string(), v.clone());
        }
        // Through the bucket's gate: no other request opens it meanwhile.
        // `open_with_metadata` refuses metadata other than an existing capsule's; a bucket
        // already open (a concurrent create got there first) is not created again.
        let (b, opened) = self.opening_one(name, || {
            Bucket::open_with_metadata(db, self.capsules.clone(), Some(self.key.clone()), meta)
        })?;
        if !opened {
            return Err(cairn_core::Error::AlreadyExists(format!(
                "bucket {name:?} (created meanwhile)"
            )));
        }
        Ok(b)
    }

    /// The node's public key (what clients check acks, checkpoints and bucket records
    /// against).
    pub fn public_key(&self) -> cairn_core::PublicKey {
        self.key.public()
    }
}

/// Adds `bucket` to the open ones and closes least recently used idle buckets past `max`
/// ([`cairn_capsule::drop_idle`]): every request gets its handle from the map, so a closed
/// bucket is never in use, and two open copies of one bucket (two record chains) never
/// exist.
fn keep_open(
    open: &mut LruCache<String, Arc<Bucket>>,
    name: &str,
    bucket: Arc<Bucket>,
    max: usize,
) {
    open.put(name.to_string(), bucket);
    cairn_capsule::drop_idle(open, max);
}

/// The node's store: the embedded log alone, or (for any other `[backend] kind`) refs in
/// the log and chunks in the configured object store.
#[cfg(feature = "object-store")]
fn with_backend(
    config: &Config,
    log: LogStore,
    key: &SigningKey,
    first: bool,
) -> Result<Arc<dyn Store>> {
    use cairn_store::object::SplitStore;
    use cairn_store::{ChunkStore, RefStore};
    let Some(os) = config.backend.object_store() else {
        return Ok(Arc::new(log));
    };
    let kind = config.backend.kind.name();
    // Chunks already in the log would be invisible behind an object-store backend while
    // refs still name them: refuse instead of serving a store with holes.
    let local = log.stats()?.chunks;
    if local > 0 {
        anyhow::bail!(
            "[backend] kind = \"{kind}\", but {} already holds {local} chunks of the embedded \
             backend; start with an empty data_dir for this backend, or keep kind = \"embedded\"",
            config.data_dir.display()
        );
    }
    let chunks = os
        .open(config.durability)
        .with_context(|| format!("[backend] kind = \"{kind}\""))?;
    chunks
        .probe()
        .with_context(|| format!("[backend] kind = \"{kind}\": the chunk store does not answer"))?;
    // A first start (no record of this backend in data_dir, no refs in the log) claims
    // the prefix; any later one must find its own claim there. The claim names the node's
    // key and this data directory's instance id, so a second node started with a copy of
    // the key file and a fresh data_dir is refused (it would count the first one's
    // half-written chunks as stored).
    let first = first && log.list_refs_from(b"", b"", 1)?.is_empty();
    // A node that used this backend before takes over a marker naming its key in another
    // form: the key alone (claimed before instance ids), or another instance id (its
    // `INSTANCE` file lost, say with a `data_dir` restored from a backup made before it).
    // Only a first start, in a data directory that never used the backend, is refused
    // another instance's prefix.
    let instance = instance_id(&config.data_dir)?;
    let this_key = format!("cairn node {}", key.public());
    chunks
        .claim_replacing(
            &format!("{this_key} instance {instance}\n"),
            (!first).then_some(this_key.as_str()),
            first,
        )
        .with_context(|| format!("[backend] kind = \"{kind}\", prefix {:?}", os.prefix))?;
    tracing::info!(backend = kind, store = %chunks.object_store(), prefix = %os.prefix, "chunks in an object store");
    let durability = os.chunk_durability(config.durability);
    Ok(Arc::new(SplitStore::new(chunks, log, durability)))
}

/// The node's store: this build has only the embedded log (`Config::check` already refused
/// any other `[backend] kind`).
#[cfg(not(feature = "object-store"))]
fn with_backend(
    config: &Config,
    log: LogStore,
    _key: &SigningKey,
    _first: bool,
) -> Result<Arc<dyn Store>> {
    config.backend.check()?;
    Ok(Arc::new(log))
}

/// The file in `data_dir` holding its instance id (32 hex digits, made at the first start
/// with an object-store backend), which the owner marker of the chunks' prefix names.
pub const INSTANCE_FILE: &str = "INSTANCE";

/// This data directory's instance id ([`INSTANCE_FILE`]), made (random, written durably)
/// if it has none.
#[cfg(feature = "object-store")]
fn instance_id(data_dir: &std::path::Path) -> Result<String> {
    let path = data_dir.join(INSTANCE_FILE);
    let read = |path: &std::path::Path| -> Result<Option<String>> {
        match std::fs::read_to_string(path) {
            Ok(s) => {
                let id = s.trim();
                anyhow::ensure!(
                    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{} does not hold an instance id (32 hex digits); it is damaged",
                    path.display()
                );
                Ok(Some(id.to_string()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    };
    if let Some(id) = read(&path)? {
        return Ok(id);
    }
    let mut raw = [0u8; 16];
    getrandom::fill(&mut raw).map_err(|e| anyhow::anyhow!("making an instance id: {e}"))?;
    let id = hex::encode(raw);
    // Another process making it at the same moment: its id is read back.
    if !crate::keys::create_private_file(&path, &format!("{id}\n"))? {
        return read(&path)?.with_context(|| format!("reading {}", path.display()));
    }
    Ok(id)
}

/// The file in `data_dir` that records where its chunks live (written by the first start
/// with an object-store backend).
pub const BACKEND_RECORD_FILE: &str = "BACKEND";

/// The backend a config names, as [`BACKEND_RECORD_FILE`] records it: kind, place and
/// prefix (not credentials or endpoints, which may change).
fn backend_record(config: &Config) -> Option<String> {
    let b = &config.backend;
    if b.kind == crate::config::BackendKind::Embedded {
        return None;
    }
    let place = match (&b.bucket, &b.path) {
        (Some(bucket), _) => format!("bucket {bucket}"),
        // The directory itself, however it is spelled (relative to where the node starts,
        // with a trailing slash, through a link).
        (None, Some(path)) => {
            let abs = std::fs::canonicalize(path)
                .or_else(|_| std::path::absolute(path))
                .unwrap_or_else(|_| path.clone());
            let abs: std::path::PathBuf = abs.components().collect();
            format!("path {}", abs.display())
        }
        (None, None) => String::new(),
    };
    Some(format!(
        "kind {}\n{place}\nprefix {}\n",
        b.kind.name(),
        b.prefix.trim_matches('/')
    ))
}

/// Refuses a data directory whose refs name chunks in another backend than the config's:
/// started with another bucket, prefix or kind (or as `embedded`), every version would
/// read as missing. True when the config names an object store the directory has no
/// record of yet ([`write_backend_record`] writes it once that backend opened).
fn check_backend_record(config: &Config) -> Result<bool> {
    let path = config.data_dir.join(BACKEND_RECORD_FILE);
    let want = backend_record(config);
    let have = match std::fs::read_to_string(&path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    match (have, want) {
        (Some(have), want) if Some(&have) != want.as_ref() => anyhow::bail!(
            "{} keeps its chunks in another backend ({}) than this config's ({}): its \
             versions would read as missing. Start it with the [backend] it was made with",
            config.data_dir.display(),
            have.trim().replace('\n', ", "),
            want.as_deref().map_or("kind embedded".to_string(), |w| w
                .trim()
                .replace('\n', ", "))
        ),
        (have, want) => Ok(have.is_none() && want.is_some()),
    }
}

/// Writes [`BACKEND_RECORD_FILE`], durably, once the backend opened (a `local` directory
/// exists then, and its path resolves as it will at every later start).
fn write_backend_record(config: &Config) -> Result<()> {
    let path = config.data_dir.join(BACKEND_RECORD_FILE);
    let want = backend_record(config).unwrap_or_default();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, want.as_bytes())
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| std::fs::File::open(&config.data_dir)?.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}
