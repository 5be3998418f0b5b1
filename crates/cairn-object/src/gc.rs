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
}

impl Db {
    /// Runs a full GC (see the module documentation).
    pub fn gc(&self) -> Result<GcReport> {
        let notes = self.store().recovery_notes()?;
        if !notes.is_empty() {
            return Err(Error::corrupt(format!(
                "crash recovery found damage ({}); GC removes nothing until it is dealt with \
                 and the notes are cleared",
                notes.join("; ")
            )));
        }
        let candidates: HashSet<Uid> = self.store().cids()?.into_iter().collect();
        let mut marked = HashSet::new();
        self.mark_all(&mut marked)?;
        let removed = {
            let _excl = self.gc_write_lock();
            self.mark_all(&mut marked)?;
            let mut dead: Vec<Uid> = Vec::new();
            for c in candidates.iter().filter(|c| !marked.contains(*c)) {
                // Only object-layer chunks (framed with CHUNK_FORMAT) are this GC's to
                // reclaim; chunks of other layers sharing the store (capsule records,
                // journals, metadata: they start with 0xCA) are append-only and kept.
                if let Some(bytes) = self.store().get(c)?
                    && bytes.first() == Some(&crate::chunk::CHUNK_FORMAT)
                {
                    dead.push(*c);
                }
            }
            // Forgotten first: a remove that fails part way (an object-store delete batch
            // cut short) must not leave the cache vouching for versions it deleted (a fork
            // or a put on a base trusts it and skips loading the version).
            self.forget_recent_versions();
            self.store().remove(&dead)?;
            dead.len() as u64
        };
        let bytes_reclaimed = self.store().compact()?;
        Ok(GcReport {
            candidates: candidates.len() as u64,
            live: candidates.len() as u64 - removed,
            removed,
            bytes_reclaimed,
        })
    }

    fn mark_all(&self, marked: &mut HashSet<Uid>) -> Result<()> {
        // Every head ref of every key of every bucket holds a head uid.
        for (name, value) in self.store().list_refs(b"bucket/")? {
            let head = Uid::from_bytes(&value).map_err(|e| {
                Error::corrupt(format!(
                    "head ref {:?} is damaged ({e}); GC removes nothing",
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
