//! Garbage collection: reclaim chunks that no head reaches (tagged or untagged, of any key
//! of any bucket), safely while writes continue.
//!
//! 1. Snapshot the candidate set: every cid in the store now. Chunks written later are
//!    never candidates.
//! 2. Mark from all heads, concurrently with writers.
//! 3. Take the writers' lock exclusively (writers hold it shared from their first chunk
//!    write to their commit, so none is half-way): mark again from the heads as they are now
//!    (cheap: only what changed is new), then remove the unmarked candidates. A writer that
//!    deduplicated against a garbage chunk has committed by then, so its new head marks it.
//! 4. Release the lock and let the store compact (reclaim disk space).
//!
//! Marking stops at the first unreadable chunk and the GC removes nothing: a damaged store
//! is never made worse.

use std::collections::HashSet;

use cairn_core::{Error, Result};

use crate::chunk::{self, ChunkKind};
use crate::db::Db;
use crate::fobject::Uid;
use crate::postree;

/// What a GC run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Chunks in the store when the run started.
    pub candidates: u64,
    /// Candidates found reachable.
    pub live: u64,
    /// Chunks removed.
    pub removed: u64,
    /// Disk bytes the store reclaimed by compaction.
    pub bytes_reclaimed: u64,
    /// Chunks no head reaches that failed their hash when read (kept: a damaged chunk
    /// cannot be told an object's from a capsule's, and no version can be brought back
    /// through it, since loading it fails).
    pub damaged_kept: u64,
}

impl Db {
    /// Runs a full GC (see the module documentation).
    pub fn gc(&self) -> Result<GcReport> {
        self.gc_with_progress(&mut |_| {})
    }

    /// [`Db::gc`], naming each phase to `progress` as it starts (listing, marking, reading
    /// what is unreachable, marking again with writers held off, removing, compacting), so
    /// a long collection can be shown.
    pub fn gc_with_progress(&self, progress: &mut dyn FnMut(&str)) -> Result<GcReport> {
        // GC waits for every writer to let go: one called while this thread writes (from
        // a write's callback) would wait for itself for ever.
        if crate::db::holds_writer() {
            return Err(Error::invalid(
                "GC cannot run while this thread holds a write in progress",
            ));
        }
        let notes = self.store().recovery_notes()?;
        if !notes.is_empty() {
            return Err(Error::corrupt(format!(
                "crash recovery found damage ({}); GC removes nothing until it is dealt with \
                 and the notes are cleared",
                notes.join("; ")
            )));
        }
        progress("listing the store's chunks");
        let candidates: HashSet<Uid> = self.store().cids()?.into_iter().collect();
        let mut marked = HashSet::new();
        progress(&format!(
            "marking what the heads reach (of {} chunks)",
            candidates.len()
        ));
        self.mark_all(&mut marked)?;
        progress(&format!(
            "reading the {} chunks no head reaches",
            candidates.len().saturating_sub(marked.len())
        ));
        // Only object-layer chunks (framed with CHUNK_FORMAT) are this GC's to reclaim;
        // chunks of other layers sharing the store (capsule records, journals, metadata:
        // they start with 0xCA) are append-only and kept. A chunk's bytes never change, so
        // this is read (and each chunk's hash checked) before writers are held off.
        let mut unmarked: Vec<((u8, u64), Uid)> = Vec::new();
        // A damaged one is kept and counted: it stopped every later GC for good (no tool
        // removes it, and a capsule's chunk comes back only from a peer).
        let mut damaged_kept = 0u64;
        for c in candidates.iter().filter(|c| !marked.contains(*c)) {
            let bytes = match self.store().get(c) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(Error::Corrupt(_)) => {
                    damaged_kept += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if bytes.first() == Some(&crate::chunk::CHUNK_FORMAT) {
                unmarked.push((removal_rank(&bytes), *c));
            }
        }
        // Whatever points at a chunk goes before it, so a remove cut short (an object-store
        // delete batch that fails, a crash) leaves only whole versions and whole subtrees:
        // never a version a fork or a put could bring back whose tree or bases are gone.
        unmarked.sort_unstable();
        let removed = {
            progress("marking again, writers held off");
            let _excl = self.gc_write_lock();
            self.mark_all(&mut marked)?;
            // One group per rank: chunks of one rank never point at each other, and a
            // store that deletes a group in parallel (an object store's concurrent
            // batches) finishes it before the next group starts.
            let mut groups: Vec<Vec<Uid>> = Vec::new();
            let mut last = None;
            for (rank, c) in unmarked.into_iter().filter(|(_, c)| !marked.contains(c)) {
                if last != Some(rank) {
                    groups.push(Vec::new());
                    last = Some(rank);
                }
                if let Some(g) = groups.last_mut() {
                    g.push(c);
                }
            }
            // Forgotten first: a remove that fails part way (an object-store delete batch
            // cut short) must not leave the cache vouching for versions it deleted (a fork
            // or a put on a base trusts it and skips loading the version).
            self.forget_recent_versions();
            progress(&format!(
                "removing {} chunks",
                groups.iter().map(Vec::len).sum::<usize>()
            ));
            self.store().remove_in_order(&groups)?;
            groups.iter().map(|g| g.len() as u64).sum()
        };
        progress("compacting the store");
        let bytes_reclaimed = self.store().compact()?;
        Ok(GcReport {
            candidates: candidates.len() as u64,
            live: candidates.len() as u64 - removed,
            removed,
            bytes_reclaimed,
            damaged_kept,
        })
    }

    /// Deletes every head ref, of every bucket of the store, whose value is not a uid (the
    /// damage that makes GC remove nothing and the key's other operations fail, which no
    /// other operation can touch); returns their names, shown as text. The versions they
    /// named, if any, are no longer heads: GC may collect them once nothing else reaches
    /// them. (A bucket's capsule still holds the records of the changes that made them.)
    pub fn drop_damaged_heads(&self) -> Result<Vec<String>> {
        let _w = self.writer_guard();
        let damaged: Vec<Vec<u8>> = self
            .store()
            .list_refs(b"bucket/")?
            .into_iter()
            .filter(|(_, value)| Uid::from_bytes(value).is_err())
            .map(|(name, _)| name.to_vec())
            .collect();
        if damaged.is_empty() {
            return Ok(Vec::new());
        }
        let shown = damaged
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        self.store().commit(
            &damaged
                .into_iter()
                .map(|name| cairn_store::RefUpdate::Delete { name })
                .collect::<Vec<_>>(),
        )?;
        Ok(shown)
    }

    fn mark_all(&self, marked: &mut HashSet<Uid>) -> Result<()> {
        // Every head ref of every key of every bucket holds a head uid.
        for (name, value) in self.store().list_refs(b"bucket/")? {
            let head = Uid::from_bytes(&value).map_err(|e| {
                Error::corrupt(format!(
                    "head ref {:?} is damaged ({e}); GC removes nothing (`cairn recovery \
                     --drop-damaged-heads` deletes such refs)",
                    String::from_utf8_lossy(&name)
                ))
            })?;
            self.mark_version(head, marked)?;
        }
        Ok(())
    }

    fn mark_version(&self, head: Uid, marked: &mut HashSet<Uid>) -> Result<()> {
        let mut versions = vec![head];
        while let Some(uid) = versions.pop() {
            if !marked.insert(uid) {
                continue;
            }
            let o = self.load(&uid).map_err(|e| {
                Error::corrupt(format!(
                    "cannot mark version {uid} ({e}); GC removes nothing"
                ))
            })?;
            versions.extend(o.bases.iter().copied());
            if let Some(t) = o.value.tree() {
                self.mark_tree(t.root, marked)?;
            }
        }
        Ok(())
    }

    fn mark_tree(&self, root: Uid, marked: &mut HashSet<Uid>) -> Result<()> {
        let mut stack = vec![root];
        while let Some(cid) = stack.pop() {
            if !marked.insert(cid) {
                continue;
            }
            let bytes = self.store().get(&cid)?.ok_or_else(|| {
                Error::corrupt(format!("chunk {cid} is missing; GC removes nothing"))
            })?;
            let (kind, _) = chunk::parse(&bytes)?;
            if matches!(kind, ChunkKind::UIndex | ChunkKind::SIndex) {
                stack.extend(postree::child_cids(&bytes)?);
            }
        }
        Ok(())
    }
}

/// Where a dead chunk goes in GC's removal order (lowest first): versions first, deepest
/// first (a version before its bases), then index nodes, highest level first, then leaves.
/// A chunk that does not parse goes last.
fn removal_rank(chunk: &[u8]) -> (u8, u64) {
    match chunk::parse(chunk) {
        Ok((ChunkKind::Meta, _)) => (
            0,
            crate::fobject::FObject::from_chunk(chunk).map_or(u64::MAX, |o| u64::MAX - o.depth),
        ),
        Ok((ChunkKind::UIndex | ChunkKind::SIndex, payload)) => (
            1,
            u64::from(u8::MAX - payload.first().copied().unwrap_or(0)),
        ),
        Ok(_) => (2, 0),
        Err(_) => (3, 0),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::time::Duration;

    use cairn_store::MemoryStore;

    use crate::db::Db;

    /// Writers that keep the lock held between them (each hold overlapping the next) do not
    /// starve GC: while it waits, later writers wait too. A writer already holding the
    /// lock can take it again inside (no deadlock behind the waiting GC), and a long hold
    /// keeps GC off, not other writers.
    #[test]
    fn busy_writers_do_not_starve_gc_and_a_long_hold_does_not_stop_writers() {
        let db = Arc::new(Db::new(Arc::new(MemoryStore::new())));
        let stop = Arc::new(AtomicU8::new(0));
        let writers: Vec<_> = (0..3)
            .map(|i| {
                let (db, stop) = (db.clone(), stop.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(2 * i));
                    // At most 3 s, so a starved GC fails the test instead of hanging it.
                    let t0 = std::time::Instant::now();
                    while stop.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(3)
                    {
                        let _w = db.writer_guard();
                        drop(db.writer_guard());
                        std::thread::sleep(Duration::from_millis(6));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let t = std::time::Instant::now();
        drop(db.gc_write_lock());
        let waited = t.elapsed();
        stop.store(1, Ordering::SeqCst);
        for w in writers {
            w.join().unwrap();
        }
        assert!(waited < Duration::from_secs(2), "GC waited {waited:?}");
        // A long hold: GC keeps trying, and another writer still gets in meanwhile.
        let long = db.writer_guard();
        let gc = {
            let db = db.clone();
            std::thread::spawn(move || drop(db.gc_write_lock()))
        };
        std::thread::sleep(Duration::from_millis(100));
        let other = {
            let db = db.clone();
            std::thread::spawn(move || drop(db.writer_guard()))
        };
        let t = std::time::Instant::now();
        while !other.is_finished() {
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "a writer waited behind a GC held off by a long hold"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(long);
        gc.join().unwrap();
        other.join().unwrap();
    }
}
