//! Damage marks of the object-store chunk backend, through its `local` kind (a directory,
//! one file per object; no network): a chunk found damaged on read (bytes changed, or an
//! object larger than any chunk) is marked under `<prefix>/damaged/` once, a put of the
//! chunk writes it anew and clears the mark, a restart reads the marks back at claim time,
//! and GC clears the marks of the chunks it deletes. Also which errors keep the object
//! store's own text: the checks made at startup (probe, claim), not the request path.
#![cfg(all(feature = "object-store", unix))]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_store::object::object_store::local::LocalFileSystem;
use cairn_store::object::{MAX_OBJECT_CHUNK, ObjectChunkStore, ObjectStoreConfig, ObjectStoreKind};
use cairn_store::{ChunkStore, Cid, Durability, Error};

const OWNER: &str = "cairn node 01\n";
const PREFIX: &str = "p";

/// The chunk directory of the `local` kind inside the test's temporary directory.
fn chunk_dir(dir: &Path) -> PathBuf {
    dir.join("chunk-dir")
}

fn config(dir: &Path) -> ObjectStoreConfig {
    let mut c = ObjectStoreConfig::new(ObjectStoreKind::Local);
    c.path = Some(chunk_dir(dir));
    c.prefix = PREFIX.into();
    c
}

/// Opens the store in `dir` (chunks synced, as a node at `group` runs it) and claims it for
/// [`OWNER`]: `first` on the node's first start, as the node does.
fn open(dir: &Path, first: bool) -> ObjectChunkStore {
    let store = config(dir).open(Durability::Group).expect("open");
    store.claim(OWNER, first).expect("claim");
    store
}

/// The file holding `cid`'s chunk object.
fn chunk_file(store: &ObjectChunkStore, dir: &Path, cid: &Cid) -> PathBuf {
    chunk_dir(dir).join(store.chunk_path(cid).as_ref())
}

/// The file of `cid`'s damage mark: `<prefix>/damaged/<cid hex>`.
fn mark_file(dir: &Path, cid: &Cid) -> PathBuf {
    chunk_dir(dir)
        .join(PREFIX)
        .join("damaged")
        .join(cid.to_hex())
}

/// Names of the entries right under `<prefix>/damaged/`, sorted (none if it is absent).
fn marks(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(chunk_dir(dir).join(PREFIX).join("damaged")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn sorted_hex(cids: &[Cid]) -> Vec<String> {
    let mut v: Vec<String> = cids.iter().map(Cid::to_hex).collect();
    v.sort();
    v
}

/// Damages a chunk file in place behind the store's back: same size, one byte changed.
fn flip(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(file, bytes).unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(got: cairn_store::Result<T>, cid: &Cid) {
    match got {
        Err(e @ Error::Corrupt(_)) => assert!(e.to_string().contains(&cid.to_hex()), "{e}"),
        other => panic!("expected a corrupt error naming {cid}, got {other:?}"),
    }
}

/// A chunk found damaged is marked once (reading it again, by `get`, `get_many` or `has`,
/// does not write the mark again); the next put of its bytes writes it anew and clears
/// the mark; damaged again after that, it is marked again.
#[test]
fn a_damaged_chunk_is_marked_once_and_a_put_repairs_it_and_clears_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let body = b"a chunk that will be damaged";
    let cid = store.put(body).unwrap();
    let other = store.put(b"a healthy neighbour").unwrap();
    assert!(marks(dir.path()).is_empty(), "nothing is marked yet");

    let file = chunk_file(&store, dir.path(), &cid);
    flip(&file);
    assert_corrupt(store.get(&cid), &cid);
    let mark = mark_file(dir.path(), &cid);
    let meta = std::fs::metadata(&mark).expect("the damaged chunk is marked");
    assert!(meta.is_file() && meta.len() == 0, "{meta:?}");
    assert_eq!(marks(dir.path()), vec![cid.to_hex()]);
    // A put through the local kind goes to a staged file renamed into place: a mark
    // written again would be a new inode.
    let inode = meta.ino();
    for _ in 0..3 {
        assert_corrupt(store.get(&cid), &cid);
    }
    assert_corrupt(store.get_many(&[other, cid]), &cid);
    assert!(!store.has(&cid).unwrap(), "a damaged chunk is not present");
    assert_eq!(
        std::fs::metadata(&mark).unwrap().ino(),
        inode,
        "the mark was written again"
    );
    assert_eq!(marks(dir.path()), vec![cid.to_hex()]);
    // The neighbour is not affected.
    assert_eq!(
        store.get(&other).unwrap().as_deref(),
        Some(&b"a healthy neighbour"[..])
    );
    assert!(store.has(&other).unwrap());

    // A put of the chunk writes it anew (not "already stored") and clears the mark.
    assert!(store.put_hashed(cid, body).unwrap(), "written anew");
    assert_eq!(std::fs::read(&file).unwrap(), body);
    assert!(!mark.exists(), "the mark of a repaired chunk is cleared");
    assert!(marks(dir.path()).is_empty(), "{:?}", marks(dir.path()));
    assert_eq!(store.get(&cid).unwrap().as_deref(), Some(&body[..]));
    assert!(store.has(&cid).unwrap());
    assert!(!store.put_hashed(cid, body).unwrap(), "stored now");

    // Damaged again after the repair: marked again (the mark is written once per damage,
    // not once per process).
    flip(&file);
    assert_corrupt(store.get_many(&[cid]), &cid);
    assert!(mark.exists(), "damage found again is marked again");
    assert!(!store.has(&cid).unwrap());
}

/// The marks outlive the process: after a restart, `claim` reads them back, so `has`
/// says the chunk is missing and the next put (single or batch) writes it anew instead
/// of taking the damaged object (same size, so a create-if-absent put finds it and a size
/// check passes) for it. Repaired, its mark is gone and a further restart trusts it.
#[test]
fn marks_are_read_back_at_claim_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let one = b"first damaged chunk".as_slice();
    let two = b"second damaged chunk".as_slice();
    let cid_one = store.put(one).unwrap();
    let cid_two = store.put(two).unwrap();
    let healthy = store.put(b"healthy").unwrap();
    let (file_one, file_two) = (
        chunk_file(&store, dir.path(), &cid_one),
        chunk_file(&store, dir.path(), &cid_two),
    );
    flip(&file_one);
    flip(&file_two);
    assert_corrupt(store.get(&cid_one), &cid_one);
    assert_corrupt(store.get(&cid_two), &cid_two);
    assert_eq!(marks(dir.path()), sorted_hex(&[cid_one, cid_two]));
    drop(store);

    // Restarted: nothing read yet in this process.
    let store = open(dir.path(), false);
    assert!(
        !store.has(&cid_one).unwrap(),
        "known damaged after the restart"
    );
    assert!(
        !store.has(&cid_two).unwrap(),
        "known damaged after the restart"
    );
    assert!(store.has(&healthy).unwrap());
    assert!(
        store.put_hashed(cid_one, one).unwrap(),
        "a put after a restart writes the damaged chunk anew"
    );
    assert_eq!(std::fs::read(&file_one).unwrap(), one);
    assert_eq!(store.put_batch(&[two]).unwrap(), vec![cid_two]);
    assert_eq!(
        std::fs::read(&file_two).unwrap(),
        two,
        "a batch put after a restart writes the damaged chunk anew"
    );
    assert!(marks(dir.path()).is_empty(), "{:?}", marks(dir.path()));
    assert!(store.has(&cid_one).unwrap() && store.has(&cid_two).unwrap());
    drop(store);

    // Repaired before this restart: trusted now.
    let store = open(dir.path(), false);
    assert!(store.has(&cid_one).unwrap() && store.has(&cid_two).unwrap());
    assert!(!store.put_hashed(cid_one, one).unwrap());
    assert_eq!(store.get(&cid_two).unwrap().as_deref(), Some(two));
}

/// Only objects right under `<prefix>/damaged/` named by a cid are marks: a stray file
/// or one in a directory below (another node's prefix may lie there) neither fails the
/// claim nor makes a healthy chunk count as damaged.
#[test]
fn only_cid_named_objects_right_under_damaged_are_marks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let healthy = store.put(b"healthy").unwrap();
    let marked = store.put(b"marked by hand").unwrap();
    drop(store);
    let damaged = chunk_dir(dir.path()).join(PREFIX).join("damaged");
    std::fs::create_dir_all(damaged.join("nested")).unwrap();
    std::fs::write(damaged.join("README"), b"not a mark").unwrap();
    std::fs::write(damaged.join("nested").join(healthy.to_hex()), b"").unwrap();
    std::fs::write(damaged.join(&healthy.to_hex()[..10]), b"").unwrap();
    std::fs::write(damaged.join(marked.to_hex()), b"").unwrap();

    let store = open(dir.path(), false);
    assert!(
        store.has(&healthy).unwrap(),
        "a stray or nested file is not a mark"
    );
    assert!(!store.put_hashed(healthy, b"healthy").unwrap());
    assert!(
        !store.has(&marked).unwrap(),
        "a mark right under damaged/ counts"
    );
    assert!(store.put_hashed(marked, b"marked by hand").unwrap());
    assert!(!mark_file(dir.path(), &marked).exists());
    // The other files are not the store's to clear.
    assert!(damaged.join("README").exists());
    assert!(damaged.join("nested").join(healthy.to_hex()).exists());
}

/// Sets a chunk file's size to one byte over [`MAX_OBJECT_CHUNK`] (a sparse file: cheap).
fn make_oversized(file: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(MAX_OBJECT_CHUNK + 1)
        .unwrap();
}

/// An object larger than any chunk at a chunk's path is reported damaged (by `get` and by
/// `get_many`) and marked like a chunk whose bytes changed; after a restart the mark makes
/// `has` say no (the object is there), and a put writes the chunk anew and clears it.
#[test]
fn an_oversized_object_is_reported_damaged_and_marked() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let a = b"replaced by a huge object".as_slice();
    let b = b"also replaced by a huge object".as_slice();
    let cid_a = store.put(a).unwrap();
    let cid_b = store.put(b).unwrap();
    let (file_a, file_b) = (
        chunk_file(&store, dir.path(), &cid_a),
        chunk_file(&store, dir.path(), &cid_b),
    );
    make_oversized(&file_a);
    make_oversized(&file_b);
    assert_corrupt(store.get(&cid_a), &cid_a);
    assert_eq!(marks(dir.path()), vec![cid_a.to_hex()]);
    assert_corrupt(store.get_many(&[cid_b]), &cid_b);
    assert_eq!(marks(dir.path()), sorted_hex(&[cid_a, cid_b]));
    assert!(!store.has(&cid_a).unwrap() && !store.has(&cid_b).unwrap());
    drop(store);

    let store = open(dir.path(), false);
    assert!(
        !store.has(&cid_a).unwrap(),
        "known damaged after the restart"
    );
    assert!(
        !store.has(&cid_b).unwrap(),
        "known damaged after the restart"
    );
    assert!(store.put_hashed(cid_a, a).unwrap());
    assert_eq!(store.put_batch(&[b]).unwrap(), vec![cid_b]);
    assert_eq!(std::fs::read(&file_a).unwrap(), a);
    assert_eq!(std::fs::read(&file_b).unwrap(), b);
    assert!(marks(dir.path()).is_empty(), "{:?}", marks(dir.path()));
    assert_eq!(store.get(&cid_a).unwrap().as_deref(), Some(a));
}

/// GC removing damaged chunks clears their marks: one marked by this process and one
/// whose mark was read back at claim. Put again later, they are not taken for damaged
/// after a restart.
#[test]
fn removing_damaged_chunks_clears_their_marks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let before = b"found damaged before the restart".as_slice();
    let now = b"found damaged in this run".as_slice();
    let cid_before = store.put(before).unwrap();
    let cid_now = store.put(now).unwrap();
    let kept = store.put(b"kept").unwrap();
    flip(&chunk_file(&store, dir.path(), &cid_before));
    assert_corrupt(store.get(&cid_before), &cid_before);
    drop(store);

    let store = open(dir.path(), false);
    flip(&chunk_file(&store, dir.path(), &cid_now));
    assert_corrupt(store.get(&cid_now), &cid_now);
    assert_eq!(marks(dir.path()), sorted_hex(&[cid_before, cid_now]));
    store.remove(&[cid_before, cid_now]).unwrap();
    assert!(marks(dir.path()).is_empty(), "{:?}", marks(dir.path()));
    assert!(!chunk_file(&store, dir.path(), &cid_before).exists());
    assert!(!chunk_file(&store, dir.path(), &cid_now).exists());
    assert_eq!(store.cids().unwrap(), vec![kept]);
    // Written whole again.
    assert!(store.put_hashed(cid_before, before).unwrap());
    assert!(store.put_hashed(cid_now, now).unwrap());
    drop(store);

    let store = open(dir.path(), false);
    for cid in [cid_before, cid_now, kept] {
        assert!(store.has(&cid).unwrap(), "{cid} taken for damaged");
    }
    assert!(!store.put_hashed(cid_before, before).unwrap());
}

/// Replaces `path` (a file or nothing) by a symbolic link to itself: opening it fails with
/// an OS error (`ELOOP`) that is neither "not found" nor "permission denied" (the tests run
/// as root, where permissions do not stop anything).
fn make_loop(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(path.file_name().unwrap(), path).unwrap();
}

/// The checks a node makes when it starts answer its operator, with the object store's
/// own text (here the OS error of the local directory).
#[test]
fn startup_errors_keep_the_object_stores_text() {
    let dir = tempfile::tempdir().unwrap();

    // The owner marker cannot be read.
    let store = config(dir.path()).open(Durability::Group).unwrap();
    let marker = chunk_dir(dir.path()).join(PREFIX).join("cairn-owner");
    make_loop(&marker);
    let e = store.claim(OWNER, true).unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("claiming") && text.contains("cairn-owner"),
        "{text}"
    );
    assert!(
        text.contains("os error"),
        "the store's own text is kept: {text}"
    );
    std::fs::remove_file(&marker).unwrap();
    store.claim(OWNER, true).unwrap();

    // The damage marks cannot be listed.
    let damaged = chunk_dir(dir.path()).join(PREFIX).join("damaged");
    make_loop(&damaged);
    let e = config(dir.path())
        .open(Durability::Group)
        .unwrap()
        .claim(OWNER, false)
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    let text = e.to_string();
    assert!(text.contains("p/damaged"), "{text}");
    assert!(
        text.contains("os error"),
        "the store's own text is kept: {text}"
    );
    std::fs::remove_file(&damaged).unwrap();

    // The chunk root cannot be listed.
    let other = dir.path().join("other");
    std::fs::create_dir_all(other.join("q")).unwrap();
    make_loop(&other.join("q").join("chunks"));
    let fs = Arc::new(LocalFileSystem::new_with_prefix(&other).unwrap());
    let e = ObjectChunkStore::new(fs, "q").unwrap().probe().unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    let text = e.to_string();
    assert!(text.contains("reaching object store"), "{text}");
    assert!(
        text.contains("os error"),
        "the store's own text is kept: {text}"
    );

    // A prefix another node claimed, and one this node used that has no marker, are
    // refused with the store's own explanation; the owner is unaffected.
    let stranger = config(dir.path()).open(Durability::Group).unwrap();
    for first in [true, false] {
        let e = stranger.claim("cairn node 02\n", first).unwrap_err();
        assert!(matches!(e, Error::Rejected(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains("another Cairn node"), "{text}");
        assert!(
            text.contains("cairn node 01") && text.contains("cairn node 02"),
            "{text}"
        );
    }
    let empty = tempfile::tempdir().unwrap();
    let e = config(empty.path())
        .open(Durability::Group)
        .unwrap()
        .claim(OWNER, false)
        .unwrap_err();
    assert!(matches!(e, Error::Rejected(_)), "{e}");
    assert!(e.to_string().contains("holds no"), "{e}");
    assert!(
        !chunk_dir(empty.path())
            .join(PREFIX)
            .join("cairn-owner")
            .exists(),
        "a refused claim writes no marker"
    );
    open(dir.path(), false);
}

/// Errors on the request path are answered to clients: they name what was being done but
/// not the object store's own text (which goes to the log), nor the directory's path.
/// An object that cannot be read (as opposed to read and found wrong) is not marked.
#[test]
fn request_path_errors_leave_the_object_stores_text_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let cid = store.put(b"unreadable").unwrap();
    make_loop(&chunk_file(&store, dir.path(), &cid));
    let root = chunk_dir(dir.path()).canonicalize().unwrap();
    let root = root.to_str().unwrap();
    let check = |e: Error, what: &str| {
        // An I/O error keeps its kind (a full disk stays 507), with the text replaced.
        assert!(
            matches!(e, Error::Unavailable(_) | Error::Io { .. }),
            "{what}: {e}"
        );
        let text = e.to_string();
        assert!(text.contains(what), "{text}");
        assert!(text.contains("node's log"), "{text}");
        for leak in ["os error", "symbolic", "LocalFileSystem", root] {
            assert!(!text.contains(leak), "{leak:?} in {text}");
        }
    };
    check(store.get(&cid).unwrap_err(), "reading chunk");
    check(store.get_many(&[cid]).unwrap_err(), "reading chunk");
    check(store.has(&cid).unwrap_err(), "checking chunk");
    check(store.cids().unwrap_err(), "listing chunks");
    check(store.stats().unwrap_err(), "listing chunks");
    // A put of the unreadable chunk is not taken as stored (it was: `Ok(false)`, and writes
    // acknowledged on it pointed at a chunk no read could get).
    check(store.put(b"unreadable").unwrap_err(), "checking chunk");
    // After a failed put every chunk found present is synced first: that sync's error
    // leaves the file system's text (the path) out too.
    check(store.put(b"unreadable").unwrap_err(), "syncing chunk");
    assert!(store.get(&cid).is_err());
    assert!(
        marks(dir.path()).is_empty(),
        "an unreadable chunk is not marked damaged: {:?}",
        marks(dir.path())
    );
}
