//! Full-tree traversal for verification and garbage collection.

use std::collections::HashMap;

use bytes::Bytes;
use cairn_core::{Decoder, Error, Result};
use cairn_store::{ChunkStore, Cid};

use super::TreeRef;
use super::node::{Node, corrupt_err, load, parse_node};
use crate::chunk::{self, ChunkKind};

struct Task {
    cid: Cid,
    level: u8,
    count: u64,
    /// The split key the parent recorded for this subtree (sorted trees, non-root).
    key: Option<Bytes>,
}

/// Visits every distinct chunk of tree `t` (each fetched with `store.get`, which verifies
/// it against its cid), parses every node and checks the structure: chunk kinds, levels
/// (the root at `t.height`, each child one below its parent), counts (each parent entry and
/// `t.count` equal what the subtree holds), split keys (each equals its subtree's last key)
/// and, for Set and Map, strictly increasing keys across the whole tree. Inconsistencies are
/// [`Error::Corrupt`] naming the chunk; a missing chunk is [`Error::NotFound`] naming it.
/// Errors returned by `visit` stop the walk.
pub fn walk(
    store: &dyn ChunkStore,
    t: &TreeRef,
    visit: &mut dyn FnMut(&Cid, &[u8]) -> Result<()>,
) -> Result<()> {
    let sorted = t.kind.is_sorted();
    let mut stack = vec![Task {
        cid: t.root,
        level: t.height,
        count: t.count,
        key: None,
    }];
    // Unsorted trees may repeat a subtree (e.g. runs of equal leaves): check it once.
    let mut done: HashMap<Cid, u64> = HashMap::new();
    let mut prev_key: Option<Bytes> = None;
    let mut first = true;
    while let Some(task) = stack.pop() {
        let is_root = std::mem::replace(&mut first, false);
        if !sorted && let Some(&c) = done.get(&task.cid) {
            if c != task.count {
                return Err(corrupt_err(
                    &task.cid,
                    format!("subtree holds {c} units, a parent says {}", task.count),
                ));
            }
            continue;
        }
        let bytes = load(store, &task.cid)?;
        visit(&task.cid, &bytes)?;
        let node = parse_node(&task.cid, &bytes, t.kind)?;
        let bad = |msg: String| Err(corrupt_err(&task.cid, msg));
        match node {
            Node::Index { level, entries } => {
                if level != task.level {
                    return bad(format!(
                        "index node at level {level}, expected {}",
                        task.level
                    ));
                }
                if is_root && entries.len() < 2 {
                    return bad("root index node with a single child".into());
                }
                let mut sum = 0u64;
                for e in &entries {
                    sum = sum
                        .checked_add(e.count)
                        .ok_or_else(|| corrupt_err(&task.cid, "counts overflow"))?;
                }
                if sum != task.count {
                    return bad(format!("node holds {sum} units, expected {}", task.count));
                }
                if sorted {
                    let last = entries.last().and_then(|e| e.key.clone());
                    if task.key.is_some() && task.key != last {
                        return bad("split key differs from the subtree's last key".into());
                    }
                }
                for e in entries.into_iter().rev() {
                    stack.push(Task {
                        cid: e.cid,
                        level: level - 1,
                        count: e.count,
                        key: e.key,
                    });
                }
            }
            Node::Blob(b) => {
                if task.level != 0 {
                    return bad(format!("leaf where level {} was expected", task.level));
                }
                if b.len() as u64 != task.count || (b.is_empty() && !is_root) {
                    return bad(format!(
                        "blob leaf of {} bytes, expected {}",
                        b.len(),
                        task.count
                    ));
                }
            }
            Node::Elems(elems) => {
                if task.level != 0 {
                    return bad(format!("leaf where level {} was expected", task.level));
                }
                if elems.len() as u64 != task.count || (elems.is_empty() && !is_root) {
                    return bad(format!(
                        "leaf of {} elements, expected {}",
                        elems.len(),
                        task.count
                    ));
                }
                if sorted && let (Some(f), Some(l)) = (elems.first(), elems.last()) {
                    if prev_key.as_ref().is_some_and(|p| *p >= f.key) {
                        return bad("keys are not strictly increasing across leaves".into());
                    }
                    if task.key.is_some() && task.key.as_ref() != Some(&l.key) {
                        return bad("split key differs from the leaf's last key".into());
                    }
                    prev_key = Some(l.key.clone());
                }
            }
        }
        if !sorted {
            done.insert(task.cid, task.count);
        }
    }
    Ok(())
}

/// The children named by a chunk: the child cids of an index node (UIndex or SIndex),
/// nothing for a leaf. Other chunk kinds are [`Error::InvalidInput`].
pub fn child_cids(chunk: &[u8]) -> Result<Vec<Cid>> {
    let (kind, payload) = chunk::parse(chunk)?;
    match kind {
        ChunkKind::UIndex | ChunkKind::SIndex => {
            let sorted = kind == ChunkKind::SIndex;
            let mut d = Decoder::new(payload, "POS-tree index node");
            d.u8()?;
            let n = d.count(cairn_core::hash::ENCODED_LEN + 1 + sorted as usize)?;
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(d.hash()?);
                if sorted {
                    d.bytes()?;
                }
                d.varint()?;
            }
            d.finish()?;
            Ok(out)
        }
        ChunkKind::Blob | ChunkKind::List | ChunkKind::Set | ChunkKind::Map => Ok(Vec::new()),
        ChunkKind::Meta => Err(Error::invalid(
            "child_cids reads POS-tree chunks, not FObject meta chunks",
        )),
    }
}
