//! Chunks in an object store: S3 (and S3-compatible servers such as MinIO), Azure Blob,
//! Google Cloud Storage or a local directory, through the `object_store` crate.
//!
//! - [`ObjectChunkStore`] implements [`ChunkStore`] over any
//!   `Arc<dyn object_store::ObjectStore>`. A chunk lives at
//!   `<prefix>/chunks/<first digest byte, hex>/<cid hex>`; the cid is the multihash hex of
//!   [`Hash::to_hex`](crate::Hash::to_hex), so the fan-out directory is the first byte of the
//!   digest (not the constant algorithm tag).
//! - [`SplitStore`] is a complete [`Store`](crate::Store): refs (and their atomic, durable
//!   commits) in an embedded [`LogStore`](crate::LogStore), chunks in an object store.
//! - [`ObjectStoreConfig`] builds the object store from a bucket name, prefix, endpoint and
//!   region, with credentials taken from the environment (`object_store`'s `from_env`
//!   builders: `AWS_*`, `AZURE_*`, `GOOGLE_*`).
//!
//! # Durability
//!
//! [`ObjectChunkStore::put_hashed`] returns only after the object store acknowledged the
//! PUT (for S3, Azure and GCS an acknowledged PUT is stored durably by the service; for the
//! `local` kind the file and its directory are `fsync`ed before the PUT returns; the 256
//! fan-out directories are created and synced when the store opens, and a chunk another
//! put of this process is still writing is synced before it counts as present; after a
//! failed put, every chunk found present is). Files an earlier run wrote at `buffered`
//! were never synced: a store opened at a syncing level therefore syncs the chunk
//! directory's file system once (`syncfs`) before it takes a write. A create-if-absent
//! PUT answered "exists" without proof that the object is stored (S3's 409 while another
//! conditional PUT of the key is in flight) is checked with a HEAD first. Upper
//! layers put a version's chunks before they commit the refs that name them, so by the time a
//! [`SplitStore`] commit starts, every chunk it refers to is already durable; the commit
//! itself then has the embedded log's [`Durability`]. An acknowledged write therefore
//! survives kill -9 and power loss of the node at that level, as with the embedded backend.
//! A crash between the chunk PUTs and the ref commit leaves unreferenced chunks in the
//! bucket (garbage for GC), never a ref naming a missing chunk.
//!
//! # Threads
//!
//! `object_store` is async; [`ChunkStore`] is sync. Each [`ObjectChunkStore`] owns a small
//! multi-thread tokio runtime and runs every request on it, waiting for the result on the
//! calling thread. This works from any thread and never panics or deadlocks, but it blocks
//! the caller for the length of a network round trip: call it from blocking threads
//! (`tokio::task::spawn_blocking`, as the node's handlers do), not directly from an async
//! task, where it would stall that executor thread.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{StreamExt, TryStreamExt};
/// The `object_store` crate this module builds on, for callers that build a store themselves.
pub use object_store;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::{
    Bytes, ChunkStore, Cid, Durability, Error, Hash, HashAlgo, RefStore, RefUpdate, Result,
    StoreStats,
};

/// Requests a batch operation keeps in flight at once.
pub const MAX_IN_FLIGHT: usize = 16;

/// Largest chunk object stored or read back. No layer writes larger chunks (capsule
/// bodies, the largest, are at most 64 MiB; POS-tree leaves at most 16 MiB), and a read
/// checks the object's size before taking its bytes: an object replaced in the bucket by
/// a huge one is reported corrupt, not read into memory.
pub const MAX_OBJECT_CHUNK: u64 = 128 << 20;

/// Refuses a chunk over [`MAX_OBJECT_CHUNK`] before anything is sent.
fn check_chunk_len(chunk: &[u8]) -> Result<()> {
    if chunk.len() as u64 > MAX_OBJECT_CHUNK {
        return Err(Error::invalid(format!(
            "chunk of {} bytes exceeds the object-store limit of {MAX_OBJECT_CHUNK}",
            chunk.len()
        )));
    }
    Ok(())
}

/// Worker threads of the runtime each [`ObjectChunkStore`] owns.
const RUNTIME_THREADS: usize = 2;

/// [`ChunkStore`] over an `object_store` backend. See the [module docs](self) for the key
/// layout, durability and threading.
pub struct ObjectChunkStore {
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// `<prefix>/cairn-owner`: which node writes under this prefix ([`Self::claim`]).
    owner: ObjectPath,
    algo: HashAlgo,
    /// False once the backend said it cannot do create-if-absent puts; then puts use a HEAD
    /// followed by an overwriting PUT (safe: the bytes under a cid never change).
    create_supported: Arc<AtomicBool>,
    /// Chunks a read found damaged: a put of one overwrites it (a create-if-absent put
    /// would find the damaged object and report the chunk present), and `has` says no.
    /// Each is also marked under `marks` until repaired, so that a restart remembers it
    /// ([`Self::claim`] reads the marks back).
    damaged: Arc<parking_lot::Mutex<std::collections::HashSet<Cid>>>,
    /// `<prefix>/damaged/`: one empty object per chunk known damaged, named by its cid.
    marks: ObjectPath,
    /// The chunks of `damaged` whose mark is in the store (written by this process, or
    /// read back at [`Self::claim`]): a mark is written once, and deleted only if there.
    marked: Arc<parking_lot::Mutex<std::collections::HashSet<Cid>>>,
    /// Once [`Self::claim`]ed: when the owner marker was last seen present. A chunk found
    /// missing is reported so only while the marker is there: a bucket or container
    /// deleted, replaced or re-pointed under a running node answers "not found" for
    /// every object, which must read as the store being unavailable, not as data gone.
    marker_seen: parking_lot::Mutex<MarkerCheck>,
    claimed: AtomicBool,
    /// Set for the `local` kind (see [`LocalSync`]).
    local: Option<LocalSync>,
    /// Always `Some` until drop.
    runtime: Option<tokio::runtime::Runtime>,
}

impl fmt::Debug for ObjectChunkStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectChunkStore")
            .field("store", &self.store.to_string())
            .field("root", &self.root.as_ref())
            .field("algo", &self.algo)
            .finish()
    }
}

impl ObjectChunkStore {
    /// A chunk store keeping its objects under `<prefix>/chunks/` in `store`, naming chunks
    /// with BLAKE3. `prefix` may be empty; it is an object-store path (`a/b`, no `..`, no
    /// empty segments).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Self> {
        let prefix = prefix.trim_matches('/');
        let base = ObjectPath::parse(prefix)
            .map_err(|e| Error::invalid(format!("object store prefix {prefix:?}: {e}")))?;
        let root = base.clone().join("chunks");
        let marks = base.clone().join("damaged");
        let owner = base.join("cairn-owner");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("cairn-object-store")
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the object store runtime", e))?;
        Ok(ObjectChunkStore {
            store,
            root,
            owner,
            algo: HashAlgo::default(),
            create_supported: Arc::new(AtomicBool::new(true)),
            damaged: Default::default(),
            marks,
            marked: Default::default(),
            marker_seen: parking_lot::Mutex::new(MarkerCheck::default()),
            claimed: AtomicBool::new(false),
            local: None,
            runtime: Some(runtime),
        })
    }

    /// Names chunks with `algo` instead of BLAKE3.
    pub fn with_algo(mut self, algo: HashAlgo) -> Self {
        self.algo = algo;
        self
    }

    /// The object-store path of `cid`'s chunk: `<prefix>/chunks/<xx>/<cid hex>`.
    pub fn chunk_path(&self, cid: &Cid) -> ObjectPath {
        chunk_path(&self.root, cid)
    }

    /// The object store this chunk store writes to.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Checks that the store answers: lists one level under the chunk root. A missing
    /// bucket, wrong credentials or an unreachable endpoint fail here with the service's
    /// message, instead of later reads mistaking a missing bucket for missing chunks.
    pub fn probe(&self) -> Result<()> {
        let store = self.store.clone();
        let root = self.root.clone();
        let name = self.store.to_string();
        self.run(async move {
            store
                .list_with_delimiter(Some(&root))
                .await
                .map(|_| ())
                .map_err(|e| os_err_startup(&format!("reaching object store {name}"), e))
        })
    }

    /// Claims this prefix for the node `owner` names (a line identifying it, such as its
    /// key): the first claim (`first`) writes `<prefix>/cairn-owner` (create-if-absent),
    /// later ones by the same owner find it. A prefix another owner claimed is refused:
    /// two nodes writing one prefix would each count the other's half-written chunks as
    /// stored, and a GC of either would delete chunks the other needs. A later claim
    /// (`first` false: the node used this backend before) that finds no marker is refused
    /// too: the bucket, prefix or mounted directory is not the one the node wrote (empty,
    /// replaced, or a volume that failed to mount), and claiming it afresh would serve
    /// every version as missing and put new chunks where they vanish once the real one
    /// is back.
    pub fn claim(&self, owner: &str, first: bool) -> Result<()> {
        self.claim_replacing(owner, None, first)
    }

    /// [`Self::claim`], taking over a marker that names this node in another form by
    /// writing `owner` over it: `replaces` is the marker's first line up to what may
    /// differ (`cairn node <key>`), and a marker that is that line alone, or that line
    /// followed by ` instance ...`, is taken over. From then on the other form is another
    /// owner's.
    pub fn claim_replacing(&self, owner: &str, replaces: Option<&str>, first: bool) -> Result<()> {
        // The marker's entity tag, which later checks compare: from the read that found
        // the marker ours (a HEAD after it could see another node's marker written in
        // between, on a server that ignores conditional creates, and take its tag).
        let etag = self.claim_marker(owner, replaces, first)?;
        if let Some(local) = self.local.clone() {
            // The marker is durable whatever the durability of chunk writes: without it
            // every later start is refused.
            let owner = self.owner.clone();
            // At startup: the file system's own text goes to the operator.
            self.run(async move { local.settle_raw(&owner).await })?;
        }
        self.claimed.store(true, Ordering::SeqCst);
        {
            let mut check = self.marker_seen.lock();
            check.seen = Some(std::time::Instant::now());
            check.etag = etag;
        }
        // The prefix is this node's: chunks it found damaged before a restart are known
        // damaged again (their next put writes them anew).
        self.load_damage_marks()
    }

    /// Before an object found missing is reported as such: the prefix is still this
    /// node's (its owner marker is there, seen within [`MARKER_RECHECK`]), or the store is
    /// [`Error::Unavailable`].
    fn check_prefix_present(&self) -> Result<()> {
        self.check_marker(None)
    }

    /// The marker check: with `since`, a sighting counts only if its request was sent at
    /// or after `since` (see [`ChunkStore::fence`]); without, one within
    /// [`MARKER_RECHECK`] does.
    fn check_marker(&self, since: Option<std::time::Instant>) -> Result<()> {
        if !self.claimed.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Held across the HEAD: callers arriving meanwhile wait for it and take its answer,
        // instead of each sending their own when the window lapses. A failed check is
        // kept for a moment too: against an unreachable endpoint each HEAD retries for
        // minutes, and queued callers sending theirs one after another waited for all of
        // them.
        let mut check = self.marker_seen.lock();
        if let Some(t) = check.seen
            && since.map_or(t.elapsed() < MARKER_RECHECK, |s| t >= s)
        {
            return Ok(());
        }
        if let Some((t, e)) = &check.failed
            && t.elapsed() < MARKER_FAILED_RECHECK
        {
            return Err(e.error());
        }
        // When this check's request goes out: it vouches for what was written before.
        let sent = std::time::Instant::now();
        let store = self.store.clone();
        let path = self.owner.clone();
        let name = self.store.to_string();
        let claimed = check.etag.clone();
        let answer = self.run(async move {
            match store.head(&path).await {
                Ok(m) => match (claimed, m.e_tag) {
                    (Some(want), Some(got)) if want != got => {
                        tracing::error!(
                            target: "cairn_store::object",
                            "the owner marker {path} in {name} was rewritten since the node \
                             claimed the prefix (entity tag {got}, was {want})"
                        );
                        Err(Error::Unavailable(format!(
                            "the node's owner marker {path} was rewritten since the node \
                             claimed the prefix: the prefix was wiped or another node claimed \
                             it, so the node neither reads nor writes there (details in the \
                             node's log)"
                        )))
                    }
                    _ => Ok(()),
                },
                Err(object_store::Error::NotFound { .. }) => {
                    // The store's name goes to the log only (the error is answered to
                    // clients).
                    tracing::error!(
                        target: "cairn_store::object",
                        "{name} no longer holds the owner marker {path}"
                    );
                    Err(Error::Unavailable(format!(
                        "the object store no longer holds the node's owner marker {path}: the \
                         bucket, container or directory was deleted, replaced or is not the \
                         one the node uses, so its chunks cannot be read (details in the \
                         node's log)"
                    )))
                }
                Err(e) => Err(os_err(&format!("checking the owner marker {path}"), e)),
            }
        });
        match answer {
            Ok(()) => {
                check.seen = Some(sent);
                check.failed = None;
                Ok(())
            }
            Err(e) => {
                check.failed = Some((std::time::Instant::now(), CachedError::of(&e)));
                Err(e)
            }
        }
    }

    /// [`Self::claim`]'s marker; returns its entity tag, where the store gives one.
    fn claim_marker(
        &self,
        owner: &str,
        replaces: Option<&str>,
        first: bool,
    ) -> Result<Option<String>> {
        let store = self.store.clone();
        let path = self.owner.clone();
        let name = self.store.to_string();
        let want = Bytes::from(owner.as_bytes().to_vec());
        // The forms of this node's marker that are taken over (owned: the claim runs on the
        // store's runtime).
        let other_forms: Option<(Vec<u8>, Vec<u8>)> = replaces.map(|r| {
            (
                format!("{r}\n").into_bytes(),
                format!("{r} instance ").into_bytes(),
            )
        });
        let takes_over = move |got: &[u8]| {
            other_forms
                .as_ref()
                .is_some_and(|(alone, instance)| got == &alone[..] || got.starts_with(instance))
        };
        self.run(async move {
            let ctx = |e| os_err_startup(&format!("claiming {path} in {name}"), e);
            // The marker as it is now, if there is one.
            let read = || async {
                match store.get(&path).await {
                    Ok(got) if got.meta.size > 4096 => Err(Error::Rejected(format!(
                        "{path} in {name} is not a Cairn owner marker ({} bytes)",
                        got.meta.size
                    ))),
                    Ok(got) => {
                        let etag = got.meta.e_tag.clone();
                        Ok(Some((got.bytes().await.map_err(ctx)?, etag)))
                    }
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(ctx(e)),
                }
            };
            // This node's marker in another form is written over (conditionally on the tag
            // read, where the store gives one); none is created if still absent.
            let takeover = match read().await? {
                Some((got, etag)) if got != want && takes_over(&got) => Some(etag),
                Some((got, etag)) => return owned_by(&got, &want, &path, &name).map(|()| etag),
                None if !first => {
                    return Err(Error::Rejected(format!(
                        "{name} holds no {path}, though this node stored chunks there before: \
                         it is not the bucket, prefix or directory the node used (empty, \
                         replaced, or a volume that is not mounted), and its versions would \
                         read as missing. Point the [backend] at the node's chunks"
                    )));
                }
                None => None,
            };
            let mode = match &takeover {
                None => PutMode::Create,
                Some(Some(e)) => PutMode::Update(object_store::UpdateVersion {
                    e_tag: Some(e.clone()),
                    version: None,
                }),
                Some(None) => PutMode::Overwrite,
            };
            // On a server without conditional writes, written plainly. Either way it is read
            // back: a server that ignores the condition lets two nodes starting at once
            // overwrite each other's marker, and the one whose marker did not stay is
            // refused.
            match store
                .put_opts(&path, PutPayload::from(want.clone()), mode.into())
                .await
            {
                Ok(_) => {}
                // Created by another node meanwhile: the read back says whose it is.
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) if takeover.is_none() => {}
                Err(object_store::Error::Precondition { .. }) => {
                    return Err(Error::Rejected(format!(
                        "{path} in {name} changed while this node took it over: another \
                         instance of this node's key is starting or running on this prefix; \
                         stop it, then start this one again"
                    )));
                }
                Err(
                    object_store::Error::NotImplemented { .. }
                    | object_store::Error::NotSupported { .. },
                ) => {
                    store
                        .put(&path, PutPayload::from(want.clone()))
                        .await
                        .map_err(ctx)?;
                }
                Err(e) => return Err(ctx(e)),
            }
            match read().await? {
                Some((got, etag)) => owned_by(&got, &want, &path, &name).map(|()| etag),
                None => Err(Error::Unavailable(format!(
                    "{path} in {name} is not there right after it was written; try again"
                ))),
            }
        })
    }

    /// Passes `bytes` read for `cid` through only if they hash to it.
    fn verified(&self, cid: &Cid, bytes: Option<Bytes>) -> Result<Option<Bytes>> {
        match bytes {
            Some(bytes) if !cid.matches(&bytes) => {
                self.mark_damaged(&[*cid]);
                // The store's name (a bucket, an account, a local directory) goes to the
                // log only: the error is answered to clients.
                tracing::error!(
                    target: "cairn_store::object",
                    "chunk {cid} does not match its hash: object {} in {}",
                    self.chunk_path(cid),
                    self.store
                );
                Err(Error::corrupt(format!(
                    "chunk {cid} does not match its hash (object {}; details in the node's \
                     log)",
                    self.chunk_path(cid)
                )))
            }
            other => Ok(other),
        }
    }

    /// Notes `cids` as damaged, in memory and (best effort: the memory holds until a
    /// restart either way) as marks in the store, each written once.
    fn mark_damaged(&self, cids: &[Cid]) {
        self.damaged.lock().extend(cids.iter().copied());
        let new: Vec<Cid> = {
            let mut marked = self.marked.lock();
            cids.iter().copied().filter(|c| marked.insert(*c)).collect()
        };
        if new.is_empty() {
            return;
        }
        let store = self.store.clone();
        let paths: Vec<(Cid, ObjectPath)> = new.iter().map(|c| (*c, self.mark_path(c))).collect();
        let failed: Vec<Cid> = self
            .run(async move {
                Ok(futures_util::stream::iter(paths)
                    .map(|(c, m)| {
                        let store = store.clone();
                        async move { store.put(&m, PutPayload::default()).await.err().map(|e| (c, e)) }
                    })
                    .buffer_unordered(MAX_IN_FLIGHT)
                    .filter_map(std::future::ready)
                    .map(|(c, e)| {
                        tracing::warn!(target: "cairn_store::object", "marking damaged chunk {c}: {e}");
                        c
                    })
                    .collect()
                    .await)
            })
            .unwrap_or(new);
        let mut marked = self.marked.lock();
        for c in &failed {
            marked.remove(c);
        }
    }

    /// Forgets `cids` as damaged (written whole again, or removed), in memory and, for
    /// those marked, in the store.
    fn unmark_damaged(&self, cids: &[Cid]) {
        {
            let mut damaged = self.damaged.lock();
            for c in cids {
                damaged.remove(c);
            }
        }
        let gone: Vec<ObjectPath> = {
            let mut marked = self.marked.lock();
            cids.iter()
                .filter(|c| marked.remove(*c))
                .map(|c| self.mark_path(c))
                .collect()
        };
        if gone.is_empty() {
            return;
        }
        let store = self.store.clone();
        let _ = self.run(async move {
            futures_util::stream::iter(gone)
                .map(|m| {
                    let store = store.clone();
                    async move {
                        match store.delete(&m).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                            Err(e) => tracing::warn!(
                                target: "cairn_store::object",
                                "clearing the mark {m} of a repaired chunk: {e}"
                            ),
                        }
                    }
                })
                .buffer_unordered(MAX_IN_FLIGHT)
                .collect::<Vec<()>>()
                .await;
            Ok(())
        });
    }

    /// A chunk whose object [`fetch_object`] refused as larger than any chunk is damaged
    /// too (else a create-if-absent put would take that object for it).
    fn note_oversized(&self, cid: &Cid, e: &Error) {
        if matches!(e, Error::Corrupt(_)) {
            self.mark_damaged(&[*cid]);
        }
    }

    /// Where the mark of damaged chunk `cid` goes.
    fn mark_path(&self, cid: &Cid) -> ObjectPath {
        self.marks.clone().join(cid.to_hex())
    }

    /// Reads back the marks of chunks found damaged before (by this node before a
    /// restart), so that their next put writes them anew. Only objects right under
    /// `<prefix>/damaged/` named by a cid count (another node's prefix may lie below).
    fn load_damage_marks(&self) -> Result<()> {
        let store = self.store.clone();
        let marks = self.marks.clone();
        let depth = marks.parts().count() + 1;
        let name = self.store.to_string();
        let found: Vec<Cid> = self.run(async move {
            // One level (a delimiter listing): another node's prefix may lie below this one,
            // and a recursive listing held every one of its objects in memory at startup.
            let listed = store.list_with_delimiter(Some(&marks)).await.map_err(|e| {
                Error::Unavailable(format!(
                    "listing {marks}/ in {name} (the node reads back there which chunks \
                         it found damaged; it needs to list that prefix as well as chunks/): \
                         {e}"
                ))
            })?;
            Ok(listed
                .objects
                .iter()
                .filter(|m| m.location.parts().count() == depth)
                .filter_map(|m| {
                    let bytes = hex_decode(m.location.filename()?)?;
                    Hash::from_bytes(&bytes).ok()
                })
                .collect())
        })?;
        self.damaged.lock().extend(found.iter().copied());
        self.marked.lock().extend(found);
        Ok(())
    }

    /// Runs `fut` on the owned runtime and waits for it on the calling thread.
    fn run<T, F>(&self, fut: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let Some(rt) = self.runtime.as_ref() else {
            return Err(Error::Unavailable(
                "object store runtime is shut down".into(),
            ));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            // The receiver only goes away if the caller is gone; nothing to report then.
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| Error::Unavailable("object store request ended without a result".into()))?
    }
}

impl Drop for ObjectChunkStore {
    fn drop(&mut self) {
        // `shutdown_background` does not block, so dropping the store inside an async
        // context (e.g. a test's tokio runtime) is fine.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn chunk_path(root: &ObjectPath, cid: &Cid) -> ObjectPath {
    let fan = hex_byte(cid.digest()[0]);
    root.clone().join(fan.as_str()).join(cid.to_hex())
}

fn hex_byte(b: u8) -> String {
    format!("{b:02x}")
}

/// A write answered "not found" (the bucket or container is gone): the store is
/// unavailable, not the chunk missing.
fn missing_on_write(e: Error) -> Error {
    match e {
        Error::NotFound(m) => Error::Unavailable(format!(
            "{m}: the bucket, container or directory the chunks go to is not there"
        )),
        other => other,
    }
}

/// [`os_err`] for the checks a node makes when it starts, whose errors go to its operator
/// only: with the object store's own text (the service's code and message).
fn os_err_startup(what: &str, e: object_store::Error) -> Error {
    let text = e.to_string();
    match os_err(what, e) {
        Error::Unavailable(_) => Error::Unavailable(format!("{what}: {text}")),
        other => other,
    }
}

/// How long a sighting of the owner marker vouches for the prefix (see
/// `ObjectChunkStore::check_prefix_present`).
const MARKER_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a failed check of the owner marker answers for the callers after it.
const MARKER_FAILED_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// A failed marker check's error, kept to answer the callers right after it alike: the
/// same kind (a full disk stays an I/O error, answered 507) and message.
enum CachedError {
    /// [`Error::Io`]: its context and the kind of its cause.
    Io(String, std::io::ErrorKind, String),
    /// [`Error::InvalidInput`].
    Invalid(String),
    /// Anything else, answered unavailable.
    Unavailable(String),
}

impl CachedError {
    fn of(e: &Error) -> Self {
        match e {
            Error::Io { context, source } => {
                CachedError::Io(context.clone(), source.kind(), source.to_string())
            }
            Error::InvalidInput(m) => CachedError::Invalid(m.clone()),
            Error::Unavailable(m) => CachedError::Unavailable(m.clone()),
            other => CachedError::Unavailable(other.to_string()),
        }
    }

    fn error(&self) -> Error {
        match self {
            CachedError::Io(context, kind, text) => {
                Error::io(context.clone(), std::io::Error::new(*kind, text.clone()))
            }
            CachedError::Invalid(m) => Error::InvalidInput(m.clone()),
            CachedError::Unavailable(m) => Error::Unavailable(m.clone()),
        }
    }
}

/// The last answers of the owner-marker check (see
/// `ObjectChunkStore::check_prefix_present`).
#[derive(Default)]
struct MarkerCheck {
    /// When the marker was last seen.
    seen: Option<std::time::Instant>,
    /// When the last check failed, and its error.
    failed: Option<(std::time::Instant, CachedError)>,
    /// The marker's entity tag when the node claimed the prefix, if the store gives one: a
    /// marker rewritten since (the prefix wiped and claimed by another node) has another.
    etag: Option<String>,
}

/// Maps an `object_store` error to Cairn's, naming what was being done. The object
/// store's own text (request URLs, the service's error body, which for S3 can name the
/// access key and echo what was signed) goes to the log only: the error is answered to
/// clients, anonymous readers of open buckets among them.
fn os_err(what: &str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    if !matches!(e, E::NotFound { .. }) {
        tracing::warn!(target: "cairn_store::object", "{what}: {e}");
    }
    match e {
        E::NotFound { path, .. } => Error::not_found(format!("{what}: object {path} not found")),
        E::InvalidPath { source } => Error::invalid(format!("{what}: {source}")),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Error::Unavailable(format!(
            "{what}: access denied by the object store (details in the node's log)"
        )),
        other => match out_of_space(&other) {
            // A full disk under a `local` chunk directory (or a quota): an I/O error of
            // that kind, which the node answers with 507.
            Some(kind) => Error::io(what, std::io::Error::new(kind, "the storage is full")),
            None => Error::Unavailable(format!(
                "{what}: the object store failed (details in the node's log)"
            )),
        },
    }
}

/// The kind of an I/O error in `e`'s causes that says the storage is full, if any.
fn out_of_space(e: &object_store::Error) -> Option<std::io::ErrorKind> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && cairn_core::error::out_of_space(io.kind())
        {
            return Some(io.kind());
        }
        cause = c.source();
    }
    None
}

/// Stores one chunk unless present (or, with `overwrite`, whether present or not: a copy
/// known to be damaged). True when it was new.
///
/// "Present" is only answered for a copy that is already durable: an S3 409 (another
/// conditional PUT of the key in flight, which may still fail) is checked with a HEAD and
/// followed by an overwriting PUT when the object is not there; with `local`, a copy that
/// another put just linked into place is synced (file and directory) before it counts,
/// since that put may not have synced the directory yet.
async fn put_object(
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    bytes: Bytes,
    create_supported: Arc<AtomicBool>,
    overwrite: bool,
    local: Option<LocalSync>,
) -> Result<bool> {
    // Puts of this chunk in flight in this process, this one included (`local` only).
    let flight = local.as_ref().map(|l| l.fly(&path));
    let result =
        put_object_counted(store, &path, bytes, &create_supported, overwrite, &local).await;
    if result.is_err()
        && let Some(l) = &local
    {
        // It may have linked the file without syncing it: from now on every chunk found
        // present is synced.
        l.suspect.store(true, Ordering::Relaxed);
    }
    drop(flight);
    result
}

/// [`put_object`] once the put is counted in flight.
async fn put_object_counted(
    store: Arc<dyn ObjectStore>,
    path: &ObjectPath,
    bytes: Bytes,
    create_supported: &AtomicBool,
    overwrite: bool,
    local: &Option<LocalSync>,
) -> Result<bool> {
    use object_store::Error as E;
    let path = path.clone();
    if overwrite {
        store
            .put(&path, PutPayload::from_bytes(bytes))
            .await
            .map_err(|e| os_err(&format!("storing chunk {path}"), e))?;
        return Ok(true);
    }
    if create_supported.load(Ordering::Relaxed) {
        let payload = PutPayload::from_bytes(bytes.clone());
        match store.put_opts(&path, payload, PutMode::Create.into()).await {
            Ok(_) => return Ok(true),
            Err(e @ (E::AlreadyExists { .. } | E::Precondition { .. })) => {
                if let Some(local) = local {
                    // EEXIST: linked by an earlier put of this process (which synced it
                    // before returning), by an earlier run (open synced the directories),
                    // or by a put still in flight, which may not have synced yet.
                    local.settle_if_in_flight(&path).await?;
                    // A file of another size there (cut or replaced behind the node's
                    // back) is not this chunk: written again below. A stat is cheap here.
                    match store.head(&path).await {
                        Ok(meta) if meta.size != bytes.len() as u64 => {}
                        Ok(_) => return Ok(false),
                        // Gone since: written again below.
                        Err(E::NotFound { .. }) => {}
                        // Not readable: not known to be stored (it was taken as stored,
                        // and acknowledged writes pointed at a chunk no read could get).
                        Err(e) => return Err(os_err(&format!("checking chunk {path}"), e)),
                    }
                    store
                        .put(&path, PutPayload::from_bytes(bytes))
                        .await
                        .map_err(|e| os_err(&format!("storing chunk {path}"), e))?;
                    return Ok(true);
                }
                if stored_for_sure(&e) {
                    return Ok(false);
                }
                // S3's 409 (another conditional PUT of the key in flight, which may still
                // fail) or GCS's 412: checked below before it counts as present.
            }
            Err(E::NotImplemented { .. }) | Err(E::NotSupported { .. }) => {
                create_supported.store(false, Ordering::Relaxed);
            }
            Err(e) => return Err(os_err(&format!("storing chunk {path}"), e)),
        }
    }
    match store.head(&path).await {
        // An object of another size is not this chunk (truncated or replaced in the
        // bucket): written again below rather than taken as stored.
        Ok(meta) if meta.size == bytes.len() as u64 => {
            if let Some(local) = local {
                local.settle_if_in_flight(&path).await?;
            }
            return Ok(false);
        }
        Ok(_) | Err(E::NotFound { .. }) => {}
        Err(e) => return Err(os_err(&format!("checking chunk {path}"), e)),
    }
    store
        .put(&path, PutPayload::from_bytes(bytes))
        .await
        .map_err(|e| os_err(&format!("storing chunk {path}"), e))?;
    Ok(true)
}

/// Whether a create-if-absent PUT's "exists" answer proves the object is stored: S3's
/// 412 (`object_store` wraps it in `AlreadyExists`), not its 409, which also comes as
/// `AlreadyExists` but means another conditional PUT of the key is still in flight.
fn stored_for_sure(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::Precondition { .. } => true,
        E::AlreadyExists { source, .. } => source
            .downcast_ref::<object_store::Error>()
            .is_some_and(|inner| matches!(inner, E::Precondition { .. } | E::NotModified { .. })),
        _ => false,
    }
}

/// The `local` kind: which chunks are being put in this process, so that with `fsync` a
/// chunk another put just linked into place is made durable before it counts as present
/// (see [`put_object`]). One process writes a chunk directory (the node's data directory
/// lock).
#[derive(Clone)]
struct LocalSync {
    fs: Arc<object_store::local::LocalFileSystem>,
    fsync: bool,
    in_flight: Arc<parking_lot::Mutex<std::collections::HashMap<ObjectPath, usize>>>,
    /// A put failed (it may have linked a file it did not sync): every chunk found
    /// present is synced from then on.
    suspect: Arc<AtomicBool>,
}

/// A put of one chunk, counted in [`LocalSync::in_flight`] while it lives.
struct Flight {
    in_flight: Arc<parking_lot::Mutex<std::collections::HashMap<ObjectPath, usize>>>,
    path: ObjectPath,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut m = self.in_flight.lock();
        if let Some(n) = m.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.path);
            }
        }
    }
}

impl LocalSync {
    /// Counts a put of `path` in flight until the result is dropped.
    fn fly(&self, path: &ObjectPath) -> Flight {
        *self.in_flight.lock().entry(path.clone()).or_default() += 1;
        Flight {
            in_flight: self.in_flight.clone(),
            path: path.clone(),
        }
    }

    /// Syncs the chunk at `path` when chunks are synced and another put of it is in
    /// flight (it linked the file, but may not have synced its directory yet).
    async fn settle_if_in_flight(&self, path: &ObjectPath) -> Result<()> {
        let others = self.in_flight.lock().get(path).copied().unwrap_or(0) > 1;
        if self.fsync && (others || self.suspect.load(Ordering::Relaxed)) {
            self.settle(path).await?;
        }
        Ok(())
    }

    /// [`LocalSync::settle_raw`] on the request path: the file system's text (paths, the
    /// OS error) goes to the log, as for the object store's own errors (see `os_err`); the
    /// error's kind stays (a full disk is still 507).
    async fn settle(&self, path: &ObjectPath) -> Result<()> {
        self.settle_raw(path).await.map_err(|e| {
            tracing::warn!(target: "cairn_store::object", "syncing chunk {path}: {e}");
            match e {
                Error::Io { source, .. } => Error::io(
                    format!("syncing chunk {path}"),
                    std::io::Error::new(
                        source.kind(),
                        "the file system failed (details in the node's log)",
                    ),
                ),
                other => other,
            }
        })
    }

    /// Syncs the chunk's file and its directory (the fan-out directories above it were
    /// made durable when the store opened: [`ObjectStoreConfig::open`]).
    async fn settle_raw(&self, path: &ObjectPath) -> Result<()> {
        let file = self
            .fs
            .path_to_filesystem(path)
            .map_err(|e| os_err(&format!("locating chunk {path}"), e))?;
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&file)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(format!("syncing chunk file {}", file.display()), e))?;
            match file.parent() {
                Some(dir) => sync_dir(dir),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| Error::Unavailable(format!("syncing chunk {path}: {e}")))?
    }
}

/// `fsync`s a directory so that its entries are durable.
fn sync_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
}

/// `syncfs(2)` of the file system holding `dir`: every file on it written so far is
/// durable when it returns.
#[cfg(target_os = "linux")]
fn sync_file_system(dir: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir)
        .map_err(|e| Error::io(format!("opening {} to sync it", dir.display()), e))?;
    // SAFETY: `f` is an open file descriptor for the length of the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(Error::io(
            format!("syncing the file system of {}", dir.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Without `syncfs`: `sync(2)`, every file system.
#[cfg(not(target_os = "linux"))]
fn sync_file_system(_dir: &std::path::Path) -> Result<()> {
    // SAFETY: takes no arguments and cannot fail.
    unsafe { libc::sync() };
    Ok(())
}

/// Creates the 256 fan-out directories of a `local` chunk root (and the directories above
/// them, up to `dir`) and makes every one durable, so that no put has to create one: a put
/// that creates a directory syncs it, but a concurrent put into the new directory could
/// return before that sync, leaving its chunk unreachable after a power loss.
fn create_fan_out_dirs(
    fs: &object_store::local::LocalFileSystem,
    dir: &std::path::Path,
    root: &ObjectPath,
    fsync: bool,
) -> Result<()> {
    // The store names files by `dir` made absolute and canonical: compare like with like.
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| Error::io(format!("resolving chunk directory {}", dir.display()), e))?;
    let dir = dir.as_path();
    let mut fan_dirs = Vec::with_capacity(256);
    for b in 0..=255u8 {
        let probe = root.clone().join(hex_byte(b).as_str()).join("x");
        let file = fs
            .path_to_filesystem(&probe)
            .map_err(|e| os_err(&format!("locating chunk directory of {probe}"), e))?;
        let Some(fan) = file.parent() else {
            return Err(Error::invalid(format!(
                "chunk path {} has no directory",
                file.display()
            )));
        };
        std::fs::create_dir_all(fan)
            .map_err(|e| Error::io(format!("creating chunk directory {}", fan.display()), e))?;
        fan_dirs.push(fan.to_path_buf());
    }
    if !fsync {
        return Ok(());
    }
    for fan in &fan_dirs {
        sync_dir(fan)?;
    }
    // The directories between the fan-out and `dir`, and `dir`'s own entry in its parent.
    if let Some(first) = fan_dirs.first() {
        let mut at = first.parent();
        while let Some(d) = at {
            sync_dir(d)?;
            if d == dir {
                if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent)?;
                }
                break;
            }
            at = d.parent();
        }
    }
    Ok(())
}

/// Reads one object; `None` when absent.
async fn fetch_object(store: Arc<dyn ObjectStore>, path: ObjectPath) -> Result<Option<Bytes>> {
    let got = match store.get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(os_err(&format!("reading chunk {path}"), e)),
    };
    if got.meta.size > MAX_OBJECT_CHUNK {
        return Err(Error::corrupt(format!(
            "chunk object {path} is {} bytes, over the limit of {MAX_OBJECT_CHUNK} no chunk \
             exceeds: it was changed in the bucket",
            got.meta.size
        )));
    }
    got.bytes()
        .await
        .map(Some)
        .map_err(|e| os_err(&format!("reading chunk {path}"), e))
}

/// Parses the cid out of a chunk object's path (`<root>/<xx>/<cid hex>`); `None` for
/// objects that are not chunks of this root (an operator's stray file, or a chunk of
/// another node whose prefix lies under this one's).
fn cid_of(root: &ObjectPath, path: &ObjectPath) -> Option<Cid> {
    if path.parts().count() != root.parts().count() + 2 {
        return None;
    }
    let name = path.filename()?;
    let bytes = hex_decode(name)?;
    let cid = Hash::from_bytes(&bytes).ok()?;
    let fan = path.parts().rev().nth(1)?;
    // Only the name a put writes (lower-case hex): a copy under another spelling (upper
    // case, a `+`) is not the object `get` reads, and listed it counted a chunk twice.
    (fan.as_ref() == hex_byte(cid.digest()[0]) && name == cid.to_hex()).then_some(cid)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl ChunkStore for ObjectChunkStore {
    /// The owner marker checked by a request sent after this call began (one HEAD, shared
    /// by the commits that wait for it).
    fn fence(&self) -> Result<()> {
        self.check_marker(Some(std::time::Instant::now()))
    }

    fn algo(&self) -> HashAlgo {
        self.algo
    }

    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        crate::check_cid_algo(&cid, self.algo)?;
        check_chunk_len(chunk)?;
        // Not into a bucket that is no longer this node's (deleted and made anew,
        // re-pointed): acknowledged there, the chunk would be gone once it is back.
        self.check_prefix_present()?;
        let mut overwrite = self.damaged.lock().contains(&cid);
        loop {
            let fut = put_object(
                self.store.clone(),
                self.chunk_path(&cid),
                Bytes::copy_from_slice(chunk),
                self.create_supported.clone(),
                overwrite,
                self.local.clone(),
            );
            let new = self.run(fut).map_err(missing_on_write)?;
            if overwrite {
                self.unmark_damaged(&[cid]);
            } else if !new && self.damaged.lock().contains(&cid) {
                // A read found the object damaged while this put found it there and took
                // it for the chunk: write it anew rather than acknowledge a copy known bad.
                overwrite = true;
                continue;
            }
            return Ok(new);
        }
    }

    /// Puts up to [`MAX_IN_FLIGHT`] chunks concurrently; returns when every one was
    /// acknowledged (or with the first error).
    fn put_batch(&self, chunks: &[&[u8]]) -> Result<Vec<Cid>> {
        chunks.iter().try_for_each(|c| check_chunk_len(c))?;
        self.check_prefix_present()?;
        let mut cids = Vec::with_capacity(chunks.len());
        let mut jobs = Vec::with_capacity(chunks.len());
        let mut repaired = Vec::new();
        {
            let damaged = self.damaged.lock();
            for chunk in chunks {
                let cid = self.algo.digest(chunk);
                let overwrite = damaged.contains(&cid);
                if overwrite {
                    repaired.push(cid);
                }
                cids.push(cid);
                jobs.push((
                    self.chunk_path(&cid),
                    Bytes::copy_from_slice(chunk),
                    overwrite,
                ));
            }
        }
        let store = self.store.clone();
        let create = self.create_supported.clone();
        let local = self.local.clone();
        self.run(async move {
            futures_util::stream::iter(jobs)
                .map(|(path, bytes, overwrite)| {
                    put_object(
                        store.clone(),
                        path,
                        bytes,
                        create.clone(),
                        overwrite,
                        local.clone(),
                    )
                })
                .buffer_unordered(MAX_IN_FLIGHT)
                .try_for_each(|_| async { Ok(()) })
                .await
        })
        .map_err(missing_on_write)?;
        if !repaired.is_empty() {
            self.unmark_damaged(&repaired);
        }
        // A read may have found one damaged while its put found the object there and took
        // it for the chunk: those are written anew (`put_hashed` overwrites a chunk known
        // damaged) rather than acknowledged as stored.
        let late: Vec<usize> = {
            let damaged = self.damaged.lock();
            (0..cids.len())
                .filter(|&i| damaged.contains(&cids[i]))
                .collect()
        };
        for i in late {
            self.put_hashed(cids[i], chunks[i])?;
        }
        Ok(cids)
    }

    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        let fetched = self
            .run(fetch_object(self.store.clone(), self.chunk_path(cid)))
            .inspect_err(|e| self.note_oversized(cid, e))?;
        if fetched.is_none() {
            self.check_prefix_present()?;
        }
        self.verified(cid, fetched)
    }

    /// Fetches up to [`MAX_IN_FLIGHT`] chunks concurrently (results in order), each
    /// verified against its cid like [`ChunkStore::get`] as it arrives: the first that
    /// does not match ends the batch, dropping the fetches in flight (checked once all
    /// had arrived, objects replaced in the bucket by large ones were all held first).
    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        let store = self.store.clone();
        let jobs: Vec<(Cid, ObjectPath)> = cids.iter().map(|c| (*c, self.chunk_path(c))).collect();
        let fetched = self.run(async move {
            let mut out = Vec::with_capacity(jobs.len());
            let mut arriving = futures_util::stream::iter(jobs)
                .map(|(cid, path)| {
                    let store = store.clone();
                    async move { (cid, fetch_object(store, path).await) }
                })
                .buffered(MAX_IN_FLIGHT);
            while let Some((cid, fetched)) = arriving.next().await {
                let bytes = match fetched {
                    Ok(b) => b,
                    Err(e) => return Ok(Err((cid, Err(e)))),
                };
                if let Some(b) = &bytes
                    && !cid.matches(b)
                {
                    return Ok(Err((cid, Ok(bytes))));
                }
                out.push(bytes);
            }
            Ok(Ok(out))
        })?;
        match fetched {
            Ok(all) => {
                if all.iter().any(Option::is_none) {
                    self.check_prefix_present()?;
                }
                Ok(all)
            }
            // Refused (and noted as damaged) as `get` refuses it.
            Err((cid, Ok(bytes))) => self.verified(&cid, bytes).map(|b| vec![b]),
            Err((cid, Err(e))) => {
                self.note_oversized(&cid, &e);
                Err(e)
            }
        }
    }

    fn has(&self, cid: &Cid) -> Result<bool> {
        if self.damaged.lock().contains(cid) {
            return Ok(false);
        }
        // A HEAD (`chunk_len`).
        Ok(self.chunk_len(cid)?.is_some())
    }

    fn chunk_len(&self, cid: &Cid) -> Result<Option<u64>> {
        // The object's size from a HEAD, whatever its damage mark says (a mark does not stop
        // a `get` whose bytes verify, after a restore say; the read that follows checks).
        let path = self.chunk_path(cid);
        let store = self.store.clone();
        let size = self.run(async move {
            match store.head(&path).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(os_err(&format!("checking chunk {path}"), e)),
            }
        })?;
        if size.is_none() {
            self.check_prefix_present()?;
        }
        Ok(size)
    }

    fn cids(&self) -> Result<Vec<Cid>> {
        let store = self.store.clone();
        let root = self.root.clone();
        self.run(async move {
            store
                .list(Some(&root))
                .map_err(|e| os_err("listing chunks", e))
                .try_filter_map(|meta| {
                    let cid = cid_of(&root, &meta.location);
                    async move { Ok(cid) }
                })
                .try_collect()
                .await
        })
    }

    fn remove(&self, cids: &[Cid]) -> Result<()> {
        let paths: Vec<ObjectPath> = cids.iter().map(|c| self.chunk_path(c)).collect();
        let store = self.store.clone();
        let result = self.run(async move {
            let locations = futures_util::stream::iter(paths.into_iter().map(Ok)).boxed();
            let mut deleted = store.delete_stream(locations);
            // Every batch is waited for, also after one fails: a batch left running could
            // delete a chunk after GC let writers in again, under a writer that had just
            // found it stored.
            let mut first_error = None;
            while let Some(res) = deleted.next().await {
                match res {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            match first_error {
                Some(e) => Err(os_err("removing chunks", e)),
                None => Ok(()),
            }
        });
        match &result {
            // Which of them are gone is not known: a later put of any of them writes it
            // again instead of taking it as stored.
            Err(_) => self.damaged.lock().extend(cids.iter().copied()),
            // Gone: damaged ones are no longer (their marks go too).
            Ok(()) => self.unmark_damaged(cids),
        }
        result
    }

    fn stats(&self) -> Result<StoreStats> {
        let store = self.store.clone();
        let root = self.root.clone();
        self.run(async move {
            let mut stats = StoreStats::default();
            let mut list = store.list(Some(&root));
            while let Some(meta) = list.next().await {
                let meta = meta.map_err(|e| os_err("listing chunks", e))?;
                stats.bytes_on_disk += meta.size;
                if cid_of(&root, &meta.location).is_some() {
                    stats.chunks += 1;
                    stats.chunk_bytes += meta.size;
                }
            }
            Ok(stats)
        })
    }
}

/// A complete store whose chunks live in one backend and refs in another: the node uses an
/// [`ObjectChunkStore`] for chunks and the embedded [`LogStore`](crate::LogStore) for refs.
///
/// Upper layers put chunks before committing the refs that name them, and
/// [`ChunkStore::put_hashed`] returns only once the chunk backend acknowledged the write, so
/// a [`RefStore::commit`] here is made only after every chunk it refers to is durable in the
/// chunk backend. [`RefStore::durability`] is the weaker of the two backends' levels.
pub struct SplitStore<C, R> {
    chunks: C,
    refs: R,
    chunk_durability: Durability,
}

impl<C: ChunkStore, R: ChunkStore + RefStore> SplitStore<C, R> {
    /// Chunks in `chunks` (whose acknowledged puts are durable at `chunk_durability`), refs
    /// in `refs`. Chunks already in `refs` are not read: start from an empty chunk side or
    /// copy them over first.
    pub fn new(chunks: C, refs: R, chunk_durability: Durability) -> Self {
        SplitStore {
            chunks,
            refs,
            chunk_durability,
        }
    }

    /// The chunk backend.
    pub fn chunks(&self) -> &C {
        &self.chunks
    }

    /// The ref backend.
    pub fn refs(&self) -> &R {
        &self.refs
    }
}

impl<C: ChunkStore, R: ChunkStore + RefStore> ChunkStore for SplitStore<C, R> {
    fn algo(&self) -> HashAlgo {
        self.chunks.algo()
    }
    fn put_hashed(&self, cid: Cid, chunk: &[u8]) -> Result<bool> {
        self.chunks.put_hashed(cid, chunk)
    }
    fn put_batch(&self, chunks: &[&[u8]]) -> Result<Vec<Cid>> {
        self.chunks.put_batch(chunks)
    }
    fn get(&self, cid: &Cid) -> Result<Option<Bytes>> {
        self.chunks.get(cid)
    }
    fn get_many(&self, cids: &[Cid]) -> Result<Vec<Option<Bytes>>> {
        self.chunks.get_many(cids)
    }
    fn has(&self, cid: &Cid) -> Result<bool> {
        self.chunks.has(cid)
    }
    fn chunk_len(&self, cid: &Cid) -> Result<Option<u64>> {
        self.chunks.chunk_len(cid)
    }
    fn cids(&self) -> Result<Vec<Cid>> {
        self.chunks.cids()
    }
    fn remove(&self, cids: &[Cid]) -> Result<()> {
        self.chunks.remove(cids)
    }
    fn remove_in_order(&self, groups: &[Vec<Cid>]) -> Result<()> {
        self.chunks.remove_in_order(groups)
    }
    fn compact(&self) -> Result<u64> {
        Ok(self.chunks.compact()? + self.refs.compact()?)
    }
    fn stats(&self) -> Result<StoreStats> {
        let mut s = self.chunks.stats()?;
        s.bytes_on_disk += self.refs.stats()?.bytes_on_disk;
        Ok(s)
    }
    fn recovery_notes(&self) -> Result<Vec<String>> {
        let mut notes = self.refs.recovery_notes()?;
        notes.extend(self.chunks.recovery_notes()?);
        Ok(notes)
    }
    fn clear_recovery_notes(&self) -> Result<()> {
        self.refs.clear_recovery_notes()?;
        self.chunks.clear_recovery_notes()
    }
}

impl<C: ChunkStore, R: ChunkStore + RefStore> RefStore for SplitStore<C, R> {
    fn get_ref(&self, name: &[u8]) -> Result<Option<Bytes>> {
        self.refs.get_ref(name)
    }
    fn list_refs(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>> {
        self.refs.list_refs(prefix)
    }
    fn list_refs_from(
        &self,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.refs.list_refs_from(prefix, from, limit)
    }
    fn commit(&self, updates: &[RefUpdate]) -> Result<()> {
        // The chunks this commit names are where they will stay: the prefix was still this
        // node's after they were put (a wipe or an unmount since the last sighting, within
        // its 5 s window, let puts be acknowledged into storage that was not the node's).
        self.chunks.fence()?;
        self.refs.commit(updates)
    }
    fn durability(&self) -> Durability {
        let refs = self.refs.durability();
        if refs == Durability::Buffered || self.chunk_durability == Durability::Buffered {
            Durability::Buffered
        } else {
            refs
        }
    }
    fn write_failure(&self) -> Option<String> {
        self.refs.write_failure()
    }
}

/// Which object store holds the chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectStoreKind {
    /// Amazon S3 or an S3-compatible server (MinIO, Ceph RGW, R2, ...).
    S3,
    /// Azure Blob Storage.
    Azure,
    /// Google Cloud Storage.
    Gcs,
    /// A directory on the local file system, one file per chunk.
    Local,
}

impl ObjectStoreKind {
    /// The name used in configs.
    pub fn name(self) -> &'static str {
        match self {
            ObjectStoreKind::S3 => "s3",
            ObjectStoreKind::Azure => "azure",
            ObjectStoreKind::Gcs => "gcs",
            ObjectStoreKind::Local => "local",
        }
    }
}

/// Where and how to reach an object store. Credentials are not part of it: they come from
/// the environment, read by `object_store`'s `from_env` builders (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, ...; `AZURE_STORAGE_ACCOUNT_NAME`,
/// `AZURE_STORAGE_ACCOUNT_KEY`, ...; `GOOGLE_SERVICE_ACCOUNT`, ...), so they never sit in a
/// config file. Fields given here override the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStoreConfig {
    /// The kind of store.
    pub kind: ObjectStoreKind,
    /// Bucket (S3, GCS) or container (Azure). Required for the cloud kinds.
    pub bucket: Option<String>,
    /// Path prefix inside the bucket or directory (may be empty).
    pub prefix: String,
    /// Service endpoint URL, e.g. `http://127.0.0.1:9000` for MinIO (S3, Azure; GCS base URL).
    pub endpoint: Option<String>,
    /// Region (S3).
    pub region: Option<String>,
    /// Allow plain-HTTP endpoints (local test servers).
    pub allow_http: bool,
    /// Directory of the `local` kind (created when missing).
    pub path: Option<PathBuf>,
}

impl ObjectStoreConfig {
    /// A config of `kind` with every optional field empty.
    pub fn new(kind: ObjectStoreKind) -> Self {
        ObjectStoreConfig {
            kind,
            bucket: None,
            prefix: String::new(),
            endpoint: None,
            region: None,
            allow_http: false,
            path: None,
        }
    }

    /// Rejects combinations that cannot work (a missing bucket, a `path` for a cloud kind,
    /// a bad prefix), with a message naming the field.
    pub fn check(&self) -> Result<()> {
        let kind = self.kind.name();
        let bad = |msg: String| Err(Error::invalid(format!("backend kind {kind:?}: {msg}")));
        ObjectPath::parse(self.prefix.trim_matches('/'))
            .map_err(|e| Error::invalid(format!("backend prefix {:?}: {e}", self.prefix)))?;
        match self.kind {
            ObjectStoreKind::Local => {
                if self.path.is_none() {
                    return bad("`path` (the chunk directory) is required".into());
                }
                for (name, set) in [
                    ("bucket", self.bucket.is_some()),
                    ("endpoint", self.endpoint.is_some()),
                    ("region", self.region.is_some()),
                ] {
                    if set {
                        return bad(format!("`{name}` does not apply to a local directory"));
                    }
                }
            }
            ObjectStoreKind::S3 | ObjectStoreKind::Azure | ObjectStoreKind::Gcs => {
                if self.bucket.as_deref().is_none_or(str::is_empty) {
                    return bad("`bucket` is required".into());
                }
                if self.path.is_some() {
                    return bad("`path` applies only to kind = \"local\"".into());
                }
                if self.region.is_some() && self.kind != ObjectStoreKind::S3 {
                    return bad("`region` applies only to kind = \"s3\"".into());
                }
            }
        }
        Ok(())
    }

    /// How durable an acknowledged put is in this store, when built for refs committed at
    /// `refs`: the cloud services store an acknowledged PUT durably; the `local` kind
    /// `fsync`s each chunk unless `refs` is [`Durability::Buffered`].
    pub fn chunk_durability(&self, refs: Durability) -> Durability {
        match self.kind {
            ObjectStoreKind::Local if refs == Durability::Buffered => Durability::Buffered,
            _ => Durability::PerWrite,
        }
    }

    /// Builds the object store (credentials from the environment). `refs` is the durability
    /// of the ref store it will be paired with (see [`ObjectStoreConfig::chunk_durability`]).
    pub fn build(&self, refs: Durability) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.build_parts(refs)?.0)
    }

    /// [`Self::build`], and for the `local` kind the file system store with its directory.
    #[allow(clippy::type_complexity)]
    fn build_parts(
        &self,
        refs: Durability,
    ) -> Result<(
        Arc<dyn ObjectStore>,
        Option<(Arc<object_store::local::LocalFileSystem>, PathBuf)>,
    )> {
        self.check()?;
        let kind = self.kind.name();
        let fail = |e: object_store::Error| {
            Error::invalid(format!(
                "backend kind {kind:?}: cannot configure the store: {e}"
            ))
        };
        let bucket = self.bucket.clone().unwrap_or_default();
        // Each setting the table does not make is left to the environment (`AWS_*`,
        // `AZURE_*`, `GOOGLE_*`, as `object_store` reads it): `allow_http` only when true,
        // and no client options replaced whole (that dropped GCS's proxy and timeouts).
        let allow_http = self.allow_http.then_some("true");
        let mut local = None;
        let store: Arc<dyn ObjectStore> = match self.kind {
            ObjectStoreKind::S3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
                if let Some(v) = allow_http {
                    b = b.with_config(
                        object_store::aws::AmazonS3ConfigKey::Client(
                            object_store::ClientConfigKey::AllowHttp,
                        ),
                        v,
                    );
                }
                if let Some(endpoint) = &self.endpoint {
                    b = b.with_endpoint(endpoint);
                }
                if let Some(region) = &self.region {
                    b = b.with_region(region);
                }
                Arc::new(b.build().map_err(fail)?)
            }
            ObjectStoreKind::Azure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(bucket);
                if let Some(v) = allow_http {
                    b = b.with_config(
                        object_store::azure::AzureConfigKey::Client(
                            object_store::ClientConfigKey::AllowHttp,
                        ),
                        v,
                    );
                }
                if let Some(endpoint) = &self.endpoint {
                    b = b.with_endpoint(endpoint.clone());
                }
                Arc::new(b.build().map_err(fail)?)
            }
            ObjectStoreKind::Gcs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket);
                if let Some(v) = allow_http {
                    b = b.with_config(
                        object_store::gcp::GoogleConfigKey::Client(
                            object_store::ClientConfigKey::AllowHttp,
                        ),
                        v,
                    );
                }
                if let Some(endpoint) = &self.endpoint {
                    b = b.with_config(object_store::gcp::GoogleConfigKey::BaseUrl, endpoint);
                }
                Arc::new(b.build().map_err(fail)?)
            }
            ObjectStoreKind::Local => {
                let Some(dir) = &self.path else {
                    return Err(Error::invalid("backend kind \"local\": `path` is required"));
                };
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::io(format!("creating chunk directory {}", dir.display()), e)
                })?;
                // No automatic cleanup: the fan-out directories stay when their last chunk
                // is removed (see `create_fan_out_dirs`).
                let fs = Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(dir)
                        .map_err(fail)?
                        .with_fsync(refs != Durability::Buffered),
                );
                local = Some((fs.clone(), dir.clone()));
                fs
            }
        };
        Ok((store, local))
    }

    /// Builds the object store and an [`ObjectChunkStore`] over it at [`Self::prefix`]
    /// (without contacting it: see [`ObjectChunkStore::probe`]). For the `local` kind it
    /// creates the chunk directories, durably when chunks are `fsync`ed.
    pub fn open(&self, refs: Durability) -> Result<ObjectChunkStore> {
        let (store, local) = self.build_parts(refs)?;
        let mut chunks = ObjectChunkStore::new(store, &self.prefix)?;
        if let Some((fs, dir)) = local {
            let fsync = self.chunk_durability(refs) != Durability::Buffered;
            create_fan_out_dirs(&fs, &dir, &chunks.root, fsync)?;
            if fsync {
                // Chunks an earlier run wrote at `buffered` were never synced, and a put
                // that finds one counts it present: made durable once, here, before any
                // write is acknowledged.
                sync_file_system(&dir)?;
            }
            chunks.local = Some(LocalSync {
                fs,
                fsync,
                in_flight: Default::default(),
                suspect: Default::default(),
            });
        }
        Ok(chunks)
    }
}

/// `Ok` when the owner marker `got` (at `path` in `name`) names `want`.
fn owned_by(got: &[u8], want: &[u8], path: &impl std::fmt::Display, name: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else if got.is_empty() {
        Err(Error::Rejected(format!(
            "{path} in {name} is empty: the owner marker was damaged (written but not made \
             durable before a crash?); if this prefix is this node's, write its line into \
             it ({:?})",
            String::from_utf8_lossy(want).trim()
        )))
    } else if got
        .split(|b| b.is_ascii_whitespace())
        .take(3)
        .eq(want.split(|b| b.is_ascii_whitespace()).take(3))
    {
        // The same node key, another instance: its key file copied to a second data
        // directory, whose process would count the other's half-written chunks as stored.
        Err(Error::Rejected(format!(
            "the prefix of {path} in {name} belongs to another instance of this node's key \
             ({:?}; this one is {:?}): a node started with a copy of the key file and \
             another data_dir. Stop the other instance, or give this one its own prefix",
            String::from_utf8_lossy(got).trim(),
            String::from_utf8_lossy(want).trim()
        )))
    } else {
        Err(Error::Rejected(format!(
            "the prefix of {path} in {name} belongs to another Cairn node ({:?}; this one is \
             {:?}): give each node its own prefix",
            String::from_utf8_lossy(got).trim(),
            String::from_utf8_lossy(want).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_paths_fan_out_by_digest_and_parse_back() {
        let store =
            ObjectChunkStore::new(Arc::new(object_store::memory::InMemory::new()), "p/q").unwrap();
        let cid = HashAlgo::default().digest(b"x");
        let path = store.chunk_path(&cid);
        let text = path.as_ref().to_string();
        assert!(text.starts_with("p/q/chunks/"));
        assert_eq!(
            text,
            format!("p/q/chunks/{:02x}/{}", cid.digest()[0], cid.to_hex())
        );
        let root = ObjectPath::from("p/q/chunks");
        assert_eq!(cid_of(&root, &path), Some(cid));
        assert_eq!(cid_of(&root, &ObjectPath::from("p/q/chunks/00/zz")), None);
        assert_eq!(
            cid_of(
                &root,
                &ObjectPath::from("p/q/chunks/zz/".to_string() + &cid.to_hex())
            ),
            None
        );
        // A chunk of a store whose prefix lies under this one's is not this store's.
        let nested = ObjectPath::from(format!(
            "p/q/chunks/x/chunks/{:02x}/{}",
            cid.digest()[0],
            cid.to_hex()
        ));
        assert_eq!(cid_of(&root, &nested), None);
    }

    #[test]
    fn config_check_names_the_problem() {
        let mut c = ObjectStoreConfig::new(ObjectStoreKind::S3);
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("bucket"), "{e}");
        c.bucket = Some("b".into());
        c.path = Some("x".into());
        assert!(c.check().unwrap_err().to_string().contains("path"));
        let mut l = ObjectStoreConfig::new(ObjectStoreKind::Local);
        assert!(l.check().unwrap_err().to_string().contains("path"));
        l.path = Some("x".into());
        l.region = Some("r".into());
        assert!(l.check().unwrap_err().to_string().contains("region"));
        l.region = None;
        l.prefix = "a/../b".into();
        assert!(l.check().is_err());
    }

    /// Puts, gets, batches, lists, overwrites (through the raw object store, behind the
    /// chunk store's back) and removes chunks through `store`.
    fn exercise(store: &ObjectChunkStore) {
        let a = store.put(b"alpha").unwrap();
        assert!(
            !store.put_hashed(a, b"alpha").unwrap(),
            "a second put is not new"
        );
        assert_eq!(store.get(&a).unwrap().as_deref(), Some(&b"alpha"[..]));
        assert!(store.has(&a).unwrap());
        let missing = HashAlgo::default().digest(b"never stored");
        assert_eq!(store.get(&missing).unwrap(), None);
        assert!(!store.has(&missing).unwrap());

        let bodies: Vec<Vec<u8>> = (0..40u32).map(|i| i.to_le_bytes().repeat(100)).collect();
        let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        let cids = store.put_batch(&refs).unwrap();
        for (cid, body) in cids.iter().zip(&bodies) {
            assert_eq!(*cid, HashAlgo::default().digest(body));
            assert_eq!(store.get(cid).unwrap().as_deref(), Some(body.as_slice()));
        }
        let mut listed = store.cids().unwrap();
        listed.sort();
        let mut want = cids.clone();
        want.push(a);
        want.sort();
        assert_eq!(listed, want);
        let mut asked = vec![cids[5], missing, a, cids[5], cids[39]];
        let many = store.get_many(&asked).unwrap();
        assert_eq!(many[0].as_deref(), Some(bodies[5].as_slice()));
        assert_eq!(many[1], None);
        assert_eq!(many[2].as_deref(), Some(&b"alpha"[..]));
        assert_eq!(many[3], many[0]);
        assert_eq!(many[4].as_deref(), Some(bodies[39].as_slice()));
        let stats = store.stats().unwrap();
        assert_eq!(stats.chunks, 41);
        assert_eq!(stats.chunk_bytes, 5 + 40 * 400);

        // Bytes replaced behind the store's back are reported, never returned.
        let raw = store.object_store().clone();
        let path = store.chunk_path(&a);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(raw.put(&path, PutPayload::from_static(b"omega")))
            .unwrap();
        let err = store.get(&a).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        assert!(err.to_string().contains(&a.to_string()), "{err}");
        asked.truncate(3);
        let err = store.get_many(&asked).unwrap_err();
        assert!(
            err.to_string().contains(&a.to_string()),
            "get_many verifies too: {err}"
        );
        // A chunk found damaged is repaired by the next put of its bytes (a put reporting
        // it present would leave a new reference to unreadable bytes).
        assert!(!store.has(&a).unwrap());
        assert!(store.put_hashed(a, b"alpha").unwrap());
        assert_eq!(store.get(&a).unwrap().as_deref(), Some(&b"alpha"[..]));
        assert!(store.has(&a).unwrap());

        store.remove(&[a, cids[0], missing]).unwrap();
        assert!(!store.has(&a).unwrap());
        assert_eq!(store.get(&cids[0]).unwrap(), None);
        assert_eq!(store.cids().unwrap().len(), 39);
        assert!(store.has(&cids[1]).unwrap());
    }

    #[test]
    fn in_memory_round_trip() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        exercise(&ObjectChunkStore::new(mem, "tenant/x").unwrap());
    }

    #[test]
    fn local_directory_round_trip_and_config() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ObjectStoreConfig::new(ObjectStoreKind::Local);
        config.path = Some(dir.path().join("chunks-here"));
        config.prefix = "p".into();
        let store = config.open(Durability::Group).unwrap();
        exercise(&store);
        // One file per chunk under the directory, fanned out by the first digest byte.
        let cid = store.put(b"on disk").unwrap();
        let file = dir
            .path()
            .join("chunks-here/p/chunks")
            .join(format!("{:02x}", cid.digest()[0]))
            .join(cid.to_hex());
        assert_eq!(std::fs::read(file).unwrap(), b"on disk");
        // A stray file is not a chunk: listed neither by cids() nor in the chunk counts.
        let before = store.cids().unwrap();
        std::fs::write(dir.path().join("chunks-here/p/chunks/README"), b"x").unwrap();
        assert_eq!(store.cids().unwrap().len(), before.len());
        assert!(store.cids().unwrap().contains(&cid));
        assert_eq!(store.stats().unwrap().chunks, before.len() as u64);
        // Every fan-out directory exists from the start (made durable at open, so no put
        // creates one), and stays when its last chunk goes.
        let fan = |b: u8| dir.path().join(format!("chunks-here/p/chunks/{b:02x}"));
        assert!((0..=255u8).all(|b| fan(b).is_dir()));
        store.remove(&[cid]).unwrap();
        assert!(fan(cid.digest()[0]).is_dir());
        assert!(store.put_hashed(cid, b"on disk").unwrap());
        // A chunk file cut short behind the store's back is not taken as the chunk when
        // the chunk is put again: it is written whole.
        let file = dir
            .path()
            .join("chunks-here/p/chunks")
            .join(format!("{:02x}", cid.digest()[0]))
            .join(cid.to_hex());
        std::fs::write(&file, b"on").unwrap();
        assert!(store.put_hashed(cid, b"on disk").unwrap(), "written again");
        assert_eq!(std::fs::read(&file).unwrap(), b"on disk");
        assert!(!store.put_hashed(cid, b"on disk").unwrap(), "stored now");
    }

    /// An object store whose create-if-absent puts answer "already exists" without
    /// storing anything, as S3 answers 409 when another conditional PUT of the key is in
    /// flight (which may still fail) (`false`), or overwrite, as a server that ignores
    /// `If-None-Match` does (`true`).
    #[derive(Debug)]
    /// (The third field counts reads; the fourth, when set, is written over the owner
    /// marker just before the first HEAD of it answers, as another node could.)
    struct ConflictingCreates(
        object_store::memory::InMemory,
        bool,
        std::sync::atomic::AtomicUsize,
        parking_lot::Mutex<Option<Vec<u8>>>,
    );

    impl fmt::Display for ConflictingCreates {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "ConflictingCreates")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for ConflictingCreates {
        async fn put_opts(
            &self,
            location: &ObjectPath,
            payload: PutPayload,
            opts: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            if matches!(opts.mode, PutMode::Create) && self.1 {
                return self.0.put(location, payload).await;
            }
            if matches!(opts.mode, PutMode::Create) {
                return Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "409 ConditionalRequestConflict".into(),
                });
            }
            self.0.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &ObjectPath,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &ObjectPath,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let other = if options.head && location.as_ref().ends_with("cairn-owner") {
                self.3.lock().take()
            } else {
                None
            };
            if let Some(other) = other {
                self.0.put(location, PutPayload::from(other)).await?;
            }
            self.0.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
            self.0.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.0.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &ObjectPath,
            to: &ObjectPath,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    /// The object store's own error text (the request URL, the service's error body, which
    /// can name the access key) stays out of the error, which the node answers to clients.
    #[test]
    fn object_store_error_text_stays_out_of_errors() {
        let secret = "AKIAEXAMPLE SignatureDoesNotMatch https://s3.internal/bucket/p/chunks/00/ab";
        for e in [
            object_store::Error::Generic {
                store: "S3",
                source: secret.into(),
            },
            object_store::Error::PermissionDenied {
                path: "p/chunks/00/ab".into(),
                source: secret.into(),
            },
        ] {
            let got = os_err("reading chunk", e).to_string();
            assert!(
                !got.contains("AKIA") && !got.contains("s3.internal"),
                "{got}"
            );
            assert!(
                got.contains("reading chunk") && got.contains("node's log"),
                "{got}"
            );
        }
    }

    /// An empty owner marker (written but not made durable before a crash) is named as
    /// damaged, not as another node's.
    #[test]
    fn an_empty_owner_marker_is_named_damaged() {
        let e = owned_by(b"", b"cairn node 01\n", &"p/cairn-owner", "LocalFileSystem")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is empty") && !e.contains("another Cairn node"),
            "{e}"
        );
        let e = owned_by(
            b"cairn node 02\n",
            b"cairn node 01\n",
            &"p/cairn-owner",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("another Cairn node"), "{e}");
    }

    /// A claimed prefix whose owner marker went away (the bucket deleted or replaced under
    /// the running node) makes missing chunks an unavailable store, not data gone; with
    /// the marker there, a missing chunk is reported missing.
    #[test]
    fn a_vanished_prefix_is_unavailable_not_missing_chunks() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", true).unwrap();
        let cid = store.put(b"a chunk").unwrap();
        let absent = HashAlgo::default().digest(b"never stored");
        assert_eq!(store.get(&absent).unwrap(), None);
        assert!(!store.has(&absent).unwrap());
        // The bucket is wiped.
        for path in [store.chunk_path(&cid), store.owner.clone()] {
            let mem = mem.clone();
            store
                .run(async move { mem.delete(&path).await.map_err(|e| os_err("wiping", e)) })
                .unwrap();
        }
        store.marker_seen.lock().seen = None;
        for e in [
            store.get(&cid).unwrap_err(),
            store.has(&cid).unwrap_err(),
            store.get_many(&[cid]).unwrap_err(),
            // Nor do writes go there: acknowledged in a bucket made anew, they would be
            // gone once the real one is back.
            store.put(b"a new chunk").unwrap_err(),
        ] {
            assert!(matches!(e, Error::Unavailable(_)), "{e}");
            assert!(e.to_string().contains("no longer holds"), "{e}");
            assert!(!e.to_string().contains("InMemory"), "{e}");
        }
    }

    /// A marker rewritten since the claim (the prefix wiped, or claimed by another node)
    /// makes the store unavailable, not a place to keep reading and writing: the check
    /// looked only for a marker, any marker.
    #[test]
    fn a_marker_rewritten_since_the_claim_is_not_this_nodes() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", true).unwrap();
        let cid = store.put(b"a chunk").unwrap();
        let owner = store.owner.clone();
        {
            let mem = mem.clone();
            store
                .run(async move {
                    mem.put(&owner, PutPayload::from_static(b"cairn node 02\n"))
                        .await
                        .map(|_| ())
                        .map_err(|e| os_err("rewriting", e))
                })
                .unwrap();
        }
        store.marker_seen.lock().seen = None;
        for e in [
            store.put(b"a new chunk").unwrap_err(),
            store
                .get(&HashAlgo::default().digest(b"absent"))
                .unwrap_err(),
        ] {
            assert!(matches!(e, Error::Unavailable(_)), "{e}");
            assert!(e.to_string().contains("rewritten"), "{e}");
        }
        // Chunks found stay readable (they are checked against their cid).
        assert_eq!(&store.get(&cid).unwrap().unwrap()[..], b"a chunk");
    }

    /// A failed check of the owner marker answers for the callers right after it (each
    /// HEAD against an unreachable endpoint retries for minutes, and queued callers sent
    /// theirs one after another), and the next check after that moment looks again.
    #[test]
    fn a_failed_marker_check_answers_for_a_moment_then_is_made_again() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", true).unwrap();
        let absent = HashAlgo::default().digest(b"never stored");
        let owner = store.owner.clone();
        let marker = {
            let (mem, owner) = (mem.clone(), owner.clone());
            store
                .run(async move {
                    let got = mem.get(&owner).await.map_err(|e| os_err("reading", e))?;
                    got.bytes().await.map_err(|e| os_err("reading", e))
                })
                .unwrap()
        };
        {
            let (mem, owner) = (mem.clone(), owner.clone());
            store
                .run(async move { mem.delete(&owner).await.map_err(|e| os_err("wiping", e)) })
                .unwrap();
        }
        store.marker_seen.lock().seen = None;
        let first = store.get(&absent).unwrap_err();
        assert!(matches!(first, Error::Unavailable(_)), "{first}");
        // The marker is back, but the failure still answers for a moment.
        {
            let (mem, owner) = (mem.clone(), owner.clone());
            store
                .run(async move {
                    mem.put(&owner, PutPayload::from(marker))
                        .await
                        .map(|_| ())
                        .map_err(|e| os_err("restoring", e))
                })
                .unwrap();
        }
        let again = store.get(&absent).unwrap_err();
        // The same error, kind and text (it was wrapped once more).
        assert!(matches!(again, Error::Unavailable(_)), "{again}");
        assert_eq!(again.to_string(), first.to_string());
        // (Put back, the marker has another entity tag, which a claim would not take for
        // this node's: this test is about the timing, so the tag is not compared.)
        store.marker_seen.lock().etag = None;
        std::thread::sleep(MARKER_FAILED_RECHECK + std::time::Duration::from_millis(100));
        assert_eq!(store.get(&absent).unwrap(), None);
    }

    /// A chunk found damaged stays known as damaged across a restart (a mark in the
    /// store, read back by `claim`): the next put of its bytes writes it anew instead of
    /// taking the damaged object for it (a create-if-absent put finds one there), and the
    /// mark goes once it is repaired.
    #[test]
    fn damage_found_before_a_restart_is_repaired_by_the_next_put() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", true).unwrap();
        let cid = store.put(b"the chunk").unwrap();
        let path = store.chunk_path(&cid);
        let put_raw = |store: &ObjectChunkStore, bytes: &'static [u8]| {
            let (mem, path) = (mem.clone(), path.clone());
            store
                .run(async move {
                    mem.put(&path, PutPayload::from_static(bytes))
                        .await
                        .map(|_| ())
                        .map_err(|e| os_err("overwriting", e))
                })
                .unwrap();
        };
        put_raw(&store, b"the chunX");
        let e = store.get(&cid).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        // The store's name goes to the log, not into the error a client is answered.
        assert!(!e.to_string().contains("InMemory"), "{e}");
        drop(store);
        // Restarted: nothing read yet.
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", false).unwrap();
        assert!(!store.has(&cid).unwrap(), "known damaged after the restart");
        assert!(store.put_hashed(cid, b"the chunk").unwrap(), "written anew");
        assert_eq!(&store.get(&cid).unwrap().unwrap()[..], b"the chunk");
        // Repaired: the mark is gone, and a further restart takes the chunk as stored.
        drop(store);
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        store.claim("cairn node 01\n", false).unwrap();
        assert!(store.has(&cid).unwrap());
        assert!(!store.put_hashed(cid, b"the chunk").unwrap());
        // A damaged chunk removed (by GC) leaves no mark behind.
        put_raw(&store, b"the chunX");
        assert!(store.get(&cid).is_err());
        assert!(store.marked.lock().contains(&cid));
        store.remove(&[cid]).unwrap();
        assert!(store.marked.lock().is_empty() && store.damaged.lock().is_empty());
        let marks = store.marks.clone();
        let left: Vec<object_store::ObjectMeta> = store
            .run(async move {
                mem.list(Some(&marks))
                    .try_collect()
                    .await
                    .map_err(|e| os_err("listing", e))
            })
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A batch read checks each chunk as it arrives: the first object that does not match
    /// its cid ends the batch (all were fetched and held before any was checked, so
    /// objects replaced in the bucket by large ones filled memory first).
    #[test]
    fn a_batch_read_stops_at_the_first_damaged_chunk() {
        let mem = Arc::new(ConflictingCreates(
            object_store::memory::InMemory::new(),
            true,
            Default::default(),
            Default::default(),
        ));
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        let cids: Vec<Cid> = (0..256u32)
            .map(|i| store.put(&i.to_le_bytes()).unwrap())
            .collect();
        let path = store.chunk_path(&cids[0]);
        store
            .run({
                let mem = mem.clone();
                async move {
                    mem.0
                        .put(&path, PutPayload::from(vec![9u8; 1 << 20]))
                        .await
                        .map(|_| ())
                        .map_err(|e| os_err("overwriting", e))
                }
            })
            .unwrap();
        let before = mem.2.load(std::sync::atomic::Ordering::SeqCst);
        let e = store.get_many(&cids).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
        let read = mem.2.load(std::sync::atomic::Ordering::SeqCst) - before;
        assert!(
            read <= 2 * MAX_IN_FLIGHT,
            "{read} objects read for one damaged first"
        );
        // Noted as damaged, as a single read notes it; the others still read.
        assert!(!store.has(&cids[0]).unwrap());
        assert_eq!(store.get_many(&cids[1..]).unwrap().len(), 255);
    }

    /// S3's 412 (wrapped in `AlreadyExists`) proves the object stored; its 409 (another
    /// conditional PUT in flight) and other errors do not.
    #[test]
    fn only_a_precondition_failure_proves_a_chunk_stored() {
        use object_store::Error as E;
        let pre = || E::Precondition {
            path: "p".into(),
            source: "412".into(),
        };
        assert!(stored_for_sure(&pre()));
        assert!(stored_for_sure(&E::AlreadyExists {
            path: "p".into(),
            source: Box::new(pre()),
        }));
        assert!(!stored_for_sure(&E::AlreadyExists {
            path: "p".into(),
            source: "409 ConditionalRequestConflict".into(),
        }));
    }

    /// Puts in flight are counted per chunk and forgotten when they end.
    #[test]
    fn puts_in_flight_are_counted_per_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let fs =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let l = LocalSync {
            fs,
            fsync: true,
            in_flight: Default::default(),
            suspect: Default::default(),
        };
        let p = ObjectPath::from("a/b");
        let one = l.fly(&p);
        let two = l.fly(&p);
        assert_eq!(l.in_flight.lock().get(&p), Some(&2));
        drop(one);
        assert_eq!(l.in_flight.lock().get(&p), Some(&1));
        drop(two);
        assert!(l.in_flight.lock().is_empty());
    }

    #[test]
    fn a_conflicting_create_is_not_taken_for_a_stored_chunk() {
        let store = ObjectChunkStore::new(
            Arc::new(ConflictingCreates(
                object_store::memory::InMemory::new(),
                false,
                Default::default(),
                Default::default(),
            )),
            "",
        )
        .unwrap();
        let cid = store.put(b"raced").unwrap();
        assert_eq!(store.get(&cid).unwrap().as_deref(), Some(&b"raced"[..]));
        assert!(!store.put_hashed(cid, b"raced").unwrap(), "stored now");
        let bodies = [&b"one"[..], &b"two"[..]];
        for cid in store.put_batch(&bodies).unwrap() {
            assert!(store.get(&cid).unwrap().is_some());
        }
    }

    #[test]
    fn split_store_keeps_refs_in_the_log_and_chunks_in_the_object_store() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let chunks = ObjectChunkStore::new(mem.clone(), "").unwrap();
        let split = SplitStore::new(chunks, crate::MemoryStore::new(), Durability::PerWrite);
        let cid = split.put(b"payload").unwrap();
        split
            .commit(&[RefUpdate::Set {
                name: b"branch/main".to_vec(),
                value: cid.to_bytes().to_vec(),
            }])
            .unwrap();
        assert_eq!(split.get(&cid).unwrap().as_deref(), Some(&b"payload"[..]));
        assert!(
            split.refs().cids().unwrap().is_empty(),
            "no chunk in the ref store"
        );
        assert_eq!(split.chunks().cids().unwrap(), vec![cid]);
        assert_eq!(
            split.get_ref(b"branch/main").unwrap().as_deref(),
            Some(&cid.to_bytes()[..])
        );
        assert_eq!(split.durability(), split.refs().durability());
    }

    /// A second instance of a node's key (its key file copied to another data directory)
    /// is refused the prefix the first one claimed, naming the case; a node whose marker
    /// names its key alone (claimed before instance ids) takes it over once, and from then
    /// on the older form is refused.
    #[test]
    fn another_instance_of_a_key_is_refused_and_an_older_marker_taken_over() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let a = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        a.claim("cairn node 01 instance aa\n", true).unwrap();
        let b = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        let e = b.claim("cairn node 01 instance bb\n", true).unwrap_err();
        assert!(e.to_string().contains("another instance"), "{e}");
        // An older marker, taken over by its node (not a first start).
        let mem = Arc::new(object_store::memory::InMemory::new());
        let old = ObjectChunkStore::new(mem.clone(), "q").unwrap();
        old.claim("cairn node 01\n", true).unwrap();
        let new = ObjectChunkStore::new(mem.clone(), "q").unwrap();
        new.claim_replacing("cairn node 01 instance aa\n", Some("cairn node 01"), false)
            .unwrap();
        let again = ObjectChunkStore::new(mem.clone(), "q").unwrap();
        assert!(again.claim("cairn node 01\n", false).is_err());
        // Its instance id lost (a data directory restored from an older backup): a node
        // that used the prefix before takes over its key's marker of another instance.
        let restored = ObjectChunkStore::new(mem.clone(), "q").unwrap();
        restored
            .claim_replacing("cairn node 01 instance cc\n", Some("cairn node 01"), false)
            .unwrap();
        // Another key's marker is never taken over.
        let other = ObjectChunkStore::new(mem.clone(), "q").unwrap();
        assert!(
            other
                .claim_replacing("cairn node 02 instance dd\n", Some("cairn node 02"), false)
                .is_err()
        );
        // A first start does not take an older marker over (another data directory).
        let mem = Arc::new(object_store::memory::InMemory::new());
        let old = ObjectChunkStore::new(mem.clone(), "r").unwrap();
        old.claim("cairn node 01\n", true).unwrap();
        let fresh = ObjectChunkStore::new(mem.clone(), "r").unwrap();
        assert!(
            fresh
                .claim_replacing("cairn node 01 instance bb\n", None, true)
                .is_err()
        );
    }

    /// A commit checks the owner marker after the chunks it names were put, whatever the
    /// last sighting: a prefix wiped (or a volume unmounted) within the 5 s a sighting
    /// counts for reads refuses the commit (unavailable), so no version is acknowledged
    /// naming chunks put where they will not stay. Commits right after one another share
    /// nothing stale: each is checked after its own puts.
    #[test]
    fn a_commit_after_the_prefix_was_wiped_is_refused() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let chunks = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        chunks.claim("cairn node 01\n", true).unwrap();
        let owner = chunks.owner.clone();
        let split = SplitStore::new(chunks, crate::MemoryStore::new(), Durability::PerWrite);
        let set = |cid: Cid| {
            vec![RefUpdate::Set {
                name: b"branch/main".to_vec(),
                value: cid.to_bytes().to_vec(),
            }]
        };
        let first = split.put(b"first").unwrap();
        split.commit(&set(first)).unwrap();
        split
            .chunks()
            .run(async move { mem.delete(&owner).await.map_err(|e| os_err("wiping", e)) })
            .unwrap();
        // The sighting is fresh: the chunk put goes through, and the commit does not.
        let second = split.put(b"after the wipe").unwrap();
        let e = split.commit(&set(second)).unwrap_err();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        assert_eq!(
            split.get_ref(b"branch/main").unwrap().as_deref(),
            Some(&first.to_bytes()[..])
        );
    }

    /// Chunks are listed under the name a put gives them only: a copy of one under an
    /// upper-case name (a sync tool, a case-folding gateway) is not a second chunk.
    #[test]
    fn only_canonical_names_are_listed_as_chunks() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        let c = store.put(b"chunk").unwrap();
        let upper = ObjectPath::from(format!(
            "p/chunks/{:02x}/{}",
            c.digest()[0],
            c.to_hex().to_uppercase()
        ));
        store
            .run(async move {
                mem.put(&upper, object_store::PutPayload::from_static(b"stray"))
                    .await
                    .map(|_| ())
                    .map_err(|e| os_err("writing", e))
            })
            .unwrap();
        assert_eq!(store.cids().unwrap(), vec![c]);
        assert_eq!(store.stats().unwrap().chunks, 1);
    }

    /// A chunk object replaced in the bucket by one over the limit is reported corrupt
    /// from its size, before its bytes are read; a chunk over the limit is refused before
    /// anything is sent.
    #[test]
    fn an_oversized_chunk_object_is_corrupt_without_being_read() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        let cid = store.put(b"small").unwrap();
        let huge = vec![0u8; MAX_OBJECT_CHUNK as usize + 1];
        store
            .run({
                let mem = mem.clone();
                let path = store.chunk_path(&cid);
                let huge = Bytes::from(huge.clone());
                async move {
                    mem.put(&path, PutPayload::from(huge))
                        .await
                        .map_err(|e| os_err("replacing", e))
                }
            })
            .unwrap();
        assert!(matches!(store.get(&cid), Err(Error::Corrupt(_))));
        assert!(matches!(
            store.put_hashed(HashAlgo::Blake3.digest(&huge), &huge),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            store.put_batch(&[&huge]),
            Err(Error::InvalidInput(_))
        ));
    }

    /// An object of another size at a chunk's path (truncated or replaced in the bucket,
    /// not yet read by this process) is not taken for the chunk when the chunk is put
    /// again: it is written anew, and reads back whole. (Before, a HEAD finding any object
    /// there counted the chunk as stored.)
    #[test]
    fn a_truncated_object_is_written_again_not_taken_as_stored() {
        let mem = Arc::new(ConflictingCreates(
            object_store::memory::InMemory::new(),
            false,
            Default::default(),
            Default::default(),
        ));
        let store = ObjectChunkStore::new(mem.clone(), "p").unwrap();
        let cid = store.put(b"the whole chunk").unwrap();
        store
            .run({
                let mem = mem.clone();
                let path = store.chunk_path(&cid);
                async move {
                    mem.put(&path, PutPayload::from_static(b"the whole"))
                        .await
                        .map_err(|e| os_err("truncating", e))
                }
            })
            .unwrap();
        // A fresh client of the bucket (nothing read yet, so nothing known damaged).
        let again = ObjectChunkStore::new(mem, "p").unwrap();
        assert!(
            again.put_hashed(cid, b"the whole chunk").unwrap(),
            "written again"
        );
        assert_eq!(
            again.get(&cid).unwrap().as_deref(),
            Some(&b"the whole chunk"[..])
        );
    }

    /// A full disk under the object store (a `local` chunk directory) is an I/O error of
    /// its kind, which the node answers with 507; other failures stay unavailable.
    #[test]
    fn a_full_disk_is_an_io_error_of_its_kind() {
        let full = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "No space left on device",
            )),
        };
        match os_err("writing chunk x", full) {
            Error::Io { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::StorageFull)
            }
            other => panic!("{other}"),
        }
        let other = object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        assert!(matches!(
            os_err("writing chunk x", other),
            Error::Unavailable(_)
        ));
    }

    /// A prefix is claimed once: the same owner finds its claim, another is refused, and
    /// a nested prefix is a prefix of its own.
    #[test]
    fn a_prefix_belongs_to_the_node_that_claimed_it() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let a = ObjectChunkStore::new(mem.clone(), "tenant").unwrap();
        // A node that used this backend before finds no marker in an empty prefix (a
        // bucket replaced, a volume not mounted): refused, and nothing is written.
        let e = a.claim("cairn node 01\n", false).unwrap_err();
        assert!(
            e.to_string()
                .contains("not the bucket, prefix or directory"),
            "{e}"
        );
        let e = a.claim("cairn node 01\n", false).unwrap_err();
        assert!(matches!(e, Error::Rejected(_)), "{e}");
        a.claim("cairn node 01\n", true).unwrap();
        a.claim("cairn node 01\n", true).unwrap();
        a.claim("cairn node 01\n", false).unwrap();
        let b = ObjectChunkStore::new(mem.clone(), "tenant/").unwrap();
        for first in [true, false] {
            let e = b.claim("cairn node 02\n", first).unwrap_err();
            assert!(matches!(e, Error::Rejected(_)), "{e}");
            assert!(e.to_string().contains("another Cairn node"), "{e}");
        }
        ObjectChunkStore::new(mem, "tenant/inner")
            .unwrap()
            .claim("cairn node 02\n", true)
            .unwrap();
        // The marker is not a chunk.
        assert!(a.cids().unwrap().is_empty());
        // On a server that ignores If-None-Match, a second node does not overwrite the
        // first one's marker: the marker is read before it is written.
        let lax = Arc::new(ConflictingCreates(
            object_store::memory::InMemory::new(),
            true,
            Default::default(),
            Default::default(),
        ));
        let first = ObjectChunkStore::new(lax.clone(), "shared").unwrap();
        first.claim("cairn node 01\n", true).unwrap();
        let second = ObjectChunkStore::new(lax, "shared").unwrap();
        let e = second.claim("cairn node 02\n", true).unwrap_err();
        assert!(e.to_string().contains("another Cairn node"), "{e}");
        first.claim("cairn node 01\n", false).unwrap();
    }

    /// The marker's entity tag is the one of the read that found the marker this node's:
    /// taken from a HEAD after it, it could be another node's marker written in between
    /// (on a server that ignores conditional creates), and then no later check would see
    /// that the prefix had been taken over.
    #[test]
    fn a_marker_rewritten_after_the_claim_read_is_detected() {
        let lax = Arc::new(ConflictingCreates(
            object_store::memory::InMemory::new(),
            true,
            Default::default(),
            parking_lot::Mutex::new(Some(b"cairn node 02\n".to_vec())),
        ));
        let store = ObjectChunkStore::new(lax, "p").unwrap();
        store.claim("cairn node 01\n", true).unwrap();
        // The next check of the marker (forced: it is otherwise made at most every 5 s).
        store.marker_seen.lock().seen = None;
        let e = store.put(b"a chunk").unwrap_err();
        assert!(e.to_string().contains("rewritten"), "{e}");
    }
}
