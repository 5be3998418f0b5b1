//! Full-tree traversal and structural checking, for verification, garbage collection and
//! verified streams of versions.

use std::collections::HashMap;

use bytes::Bytes;
use cairn_core::{Decoder, Error, Result};
use cairn_store::{ChunkStore, Cid};

use super::node::{LeafElems, Node, corrupt_err, leaf_kind, load, parse_node_limited};
use super::{Element, TreeKind, TreeRef};
use crate::chunk::{self, ChunkKind};

/// A node as [`TreeCheck`] parses it: an element leaf is read lazily.
enum Parsed {
    Node(Node),
    Leaf(LeafElems),
}

struct Task {
    cid: Cid,
    level: u8,
    count: u64,
    /// The split key the parent recorded for this subtree (sorted trees, non-root).
    key: Option<Bytes>,
}

/// One node of a tree, as [`TreeCheck::accept`] found it.
#[derive(Debug)]
pub enum CheckedNode {
    /// An index node (its children come next, in order).
    Index,
    /// A blob leaf's bytes.
    Blob(Bytes),
    /// A List, Set or Map leaf's elements, in order.
    Elements(Vec<Element>),
}

/// The structural check of a whole POS-tree in depth-first pre-order, as a state machine
/// that does no I/O: [`TreeCheck::next_cid`] names the chunk it needs next and
/// [`TreeCheck::accept`] checks it. It checks chunk kinds, levels (the root at the tree's
/// height, each child one below its parent), counts (each parent entry and the tree's
/// count equal what the subtree holds), split keys (each equals its subtree's last key)
/// and, for Set and Map, strictly increasing keys across the whole tree. [`walk`] drives it
/// from a store; a verified stream of a version (`crate::stream`) drives it from chunks
/// sent by a node.
pub struct TreeCheck {
    kind: TreeKind,
    stack: Vec<Task>,
    /// Subtrees of unsorted trees already checked, with their counts (only when repeats
    /// are skipped).
    done: Option<HashMap<(Cid, u8), u64>>,
    prev_key: Option<Bytes>,
    first: bool,
    /// Most nodes waiting to be checked (and entries in one index node).
    max_pending: usize,
    /// Most elements in one leaf.
    max_leaf_elements: usize,
    /// The error that stopped the check: every later call fails with it.
    failed: Option<String>,
    /// Entries this check added to `done` (kept only for [`walk_sharing`], which takes
    /// back those of a walk that failed).
    added: Option<Vec<(Cid, u8)>>,
}

impl TreeCheck {
    /// A check of tree `t`. With `skip_repeats`, a subtree of an unsorted tree that occurs
    /// again (a run of equal leaves) is not asked for twice, only its count is compared;
    /// without, every occurrence is asked for, in order (a reader that needs the content).
    pub fn new(t: &TreeRef, skip_repeats: bool) -> Self {
        TreeCheck {
            kind: t.kind,
            stack: vec![Task {
                cid: t.root,
                level: t.height,
                count: t.count,
                key: None,
            }],
            done: (skip_repeats && !t.kind.is_sorted()).then(HashMap::new),
            prev_key: None,
            first: true,
            max_pending: usize::MAX,
            max_leaf_elements: usize::MAX,
            failed: None,
            added: None,
        }
    }

    /// This check, refusing ([`Error::Corrupt`]) a tree that would make it hold more than
    /// `max` nodes waiting to be checked (or an index node of more than `max` entries): a
    /// reader of chunks from an untrusted source bounds its memory with it (a tree a Cairn
    /// store builds stays far below: its index nodes hold at most a few hundred thousand
    /// entries and its stack one path's siblings).
    pub fn with_max_pending(mut self, max: usize) -> Self {
        self.max_pending = max;
        self
    }

    /// This check, refusing ([`Error::Corrupt`]) a leaf of more than `max` elements before
    /// decoding them. A Cairn store's leaves hold up to
    /// [`crate::stream::MAX_LEAF_ELEMENTS`] (one-byte elements filling a leaf of the
    /// largest size).
    pub fn with_max_leaf_elements(mut self, max: usize) -> Self {
        self.max_leaf_elements = max;
        self
    }

    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(Error::corrupt(format!(
                "the tree check already failed: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// The cid of the chunk [`TreeCheck::accept`] expects next, or `None` once the whole
    /// tree was checked.
    pub fn next_cid(&mut self) -> Result<Option<Cid>> {
        self.check_failed()?;
        while let Some(task) = self.stack.last() {
            // The root is always checked: a subtree checked elsewhere (in another tree of
            // a [`walk_sharing`]) was not checked as a root.
            let Some(done) = self.done.as_ref().filter(|_| !self.first) else {
                return Ok(Some(task.cid));
            };
            // A subtree checked before counts only at the same level: the same chunk
            // where another level is expected is checked (and refused) there.
            let Some(&c) = done.get(&(task.cid, task.level)) else {
                return Ok(Some(task.cid));
            };
            if c != task.count {
                return Err(corrupt_err(
                    &task.cid,
                    format!("subtree holds {c} units, a parent says {}", task.count),
                ));
            }
            self.stack.pop();
        }
        Ok(None)
    }

    /// The cids and counts of the leaves expected next, in order, up to `max` leaves and
    /// until their counts reach `max_units` (fewer when an index node comes sooner; none
    /// when the next chunk is an index node). Only for a check that does not skip
    /// repeats (its next chunks are exactly the stack's top).
    pub(crate) fn next_leaves(&self, max: usize, max_units: u64) -> Vec<(Cid, u64)> {
        debug_assert!(
            self.done.is_none(),
            "next_leaves on a check that skips repeats"
        );
        let mut units = 0u64;
        self.stack
            .iter()
            .rev()
            .take_while(|t| t.level == 0)
            .take(max)
            .take_while(|t| {
                let more = units < max_units;
                units = units.saturating_add(t.count);
                more
            })
            .map(|t| (t.cid, t.count))
            .collect()
    }

    /// True once every chunk of the tree was accepted.
    pub fn is_complete(&mut self) -> Result<bool> {
        Ok(self.next_cid()?.is_none())
    }

    /// Checks `bytes` as the chunk [`TreeCheck::next_cid`] named, which the caller has
    /// verified against that cid (a store read does; [`TreeCheck::accept_unverified`]
    /// hashes it). Inconsistencies are [`Error::Corrupt`] naming the chunk; after an
    /// error, every later call fails too.
    pub fn accept(&mut self, bytes: &Bytes) -> Result<CheckedNode> {
        self.check_failed()?;
        let r = self.accept_checked(bytes, true);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    /// [`TreeCheck::accept`] for a caller that wants the check only: a leaf's elements are
    /// checked without being decoded into memory together (a leaf of small elements took
    /// 64 bytes an element that way, up to 1 GiB for the largest leaf).
    pub fn check(&mut self, bytes: &Bytes) -> Result<()> {
        self.check_failed()?;
        let r = self.accept_checked(bytes, false);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r.map(|_| ())
    }

    fn accept_checked(&mut self, bytes: &Bytes, keep: bool) -> Result<CheckedNode> {
        let task = match self.next_cid()? {
            Some(_) => self
                .stack
                .pop()
                .ok_or_else(|| Error::invalid("tree check ended"))?,
            None => {
                return Err(Error::invalid(
                    "the tree is complete; no further chunk belongs to it",
                ));
            }
        };
        let is_root = std::mem::replace(&mut self.first, false);
        let sorted = self.kind.is_sorted();
        // An element leaf is checked lazily, its elements decoded only when kept.
        let (ck, payload) = chunk::parse(bytes).map_err(|e| corrupt_err(&task.cid, e))?;
        let node = if self.kind != TreeKind::Blob && ck == leaf_kind(self.kind) {
            Parsed::Leaf(
                LeafElems::parse(bytes, payload, self.kind, self.max_leaf_elements)
                    .map_err(|e| corrupt_err(&task.cid, e))?,
            )
        } else {
            Parsed::Node(parse_node_limited(
                &task.cid,
                bytes,
                self.kind,
                self.max_pending,
                self.max_leaf_elements,
            )?)
        };
        let bad = |msg: String| Err(corrupt_err(&task.cid, msg));
        let out = match node {
            Parsed::Node(Node::Index { level, entries }) => {
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
                if self.stack.len().saturating_add(entries.len()) > self.max_pending {
                    return bad(format!(
                        "the tree would leave more than {} nodes waiting to be checked",
                        self.max_pending
                    ));
                }
                if sorted {
                    let last = entries.last().and_then(|e| e.key.clone());
                    if task.key.is_some() && task.key != last {
                        return bad("split key differs from the subtree's last key".into());
                    }
                }
                for e in entries.into_iter().rev() {
                    self.stack.push(Task {
                        cid: e.cid,
                        level: level - 1,
                        count: e.count,
                        key: e.key,
                    });
                }
                CheckedNode::Index
            }
            Parsed::Node(Node::Blob(b)) => {
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
                CheckedNode::Blob(b)
            }
            Parsed::Node(Node::Elems(_)) => {
                return bad("an element leaf parsed as a node".into());
            }
            Parsed::Leaf(leaf) => {
                if task.level != 0 {
                    return bad(format!("leaf where level {} was expected", task.level));
                }
                if leaf.len() as u64 != task.count || (leaf.len() == 0 && !is_root) {
                    return bad(format!(
                        "leaf of {} elements, expected {}",
                        leaf.len(),
                        task.count
                    ));
                }
                if sorted && let (Some(f), Some(l)) = (leaf.first_key(), leaf.last_key()) {
                    if self.prev_key.as_ref().is_some_and(|p| p >= f) {
                        return bad("keys are not strictly increasing across leaves".into());
                    }
                    if task.key.is_some() && task.key.as_ref() != Some(l) {
                        return bad("split key differs from the leaf's last key".into());
                    }
                    self.prev_key = Some(l.clone());
                }
                if keep {
                    CheckedNode::Elements(
                        leaf.collect()
                            .map_err(|e| corrupt_err(&task.cid, e))?
                            .into_iter()
                            .map(|e| Element {
                                key: e.key,
                                value: e.value,
                            })
                            .collect(),
                    )
                } else {
                    CheckedNode::Elements(Vec::new())
                }
            }
        };
        if let Some(done) = &mut self.done
            && done.insert((task.cid, task.level), task.count).is_none()
            && let Some(added) = &mut self.added
        {
            added.push((task.cid, task.level));
        }
        Ok(out)
    }

    /// [`TreeCheck::accept`] for bytes from an untrusted source: first checks that they
    /// hash to the cid expected next ([`Error::Corrupt`] when not).
    pub fn accept_unverified(&mut self, bytes: &Bytes) -> Result<CheckedNode> {
        let Some(cid) = self.next_cid()? else {
            return Err(Error::corrupt(
                "a chunk arrived after the tree was complete",
            ));
        };
        let got = cid.algo().digest(bytes);
        if got != cid {
            let e = format!("POS-tree chunk {cid}: the bytes received hash to {got}");
            self.failed = Some(e.clone());
            return Err(Error::corrupt(e));
        }
        self.accept(bytes)
    }
}

/// Visits every distinct chunk of tree `t` (each fetched with `store.get`, which verifies
/// it against its cid), parses every node and checks the structure as [`TreeCheck`]
/// describes; a repeated subtree of an unsorted tree is visited once. Inconsistencies are
/// [`Error::Corrupt`] naming the chunk; a missing chunk is [`Error::NotFound`] naming it.
/// Errors returned by `visit` stop the walk.
pub fn walk(
    store: &dyn ChunkStore,
    t: &TreeRef,
    visit: &mut dyn FnMut(&Cid, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut check = TreeCheck::new(t, true);
    while let Some(cid) = check.next_cid()? {
        let bytes = load(store, &cid)?;
        visit(&cid, &bytes)?;
        check.check(&bytes)?;
    }
    Ok(())
}

/// Subtrees [`walk_sharing`] found whole and sound, carried from tree to tree: index nodes
/// of blobs and of lists (kept apart: their index nodes are alike, their leaves are not),
/// at most a given number in all.
pub struct SharedSubtrees {
    by_kind: HashMap<TreeKind, HashMap<(Cid, u8), u64>>,
    held: usize,
    max: usize,
}

impl SharedSubtrees {
    /// Remembers at most `max` index nodes (about 64 bytes each).
    pub fn new(max: usize) -> Self {
        SharedSubtrees {
            by_kind: HashMap::new(),
            held: 0,
            max,
        }
    }

    /// Index nodes remembered.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }
}

/// [`walk`] of many trees that share subtrees (versions of one value): an index node of an
/// unsorted tree (Blob, List) that an earlier call checked whole at the same level, with
/// the same count, in a tree of the same kind, is not read again, nor anything below it.
/// `shared` carries those subtrees from call to call: a call that succeeds adds its index
/// nodes (never its leaves, so it holds about one entry per index-node fanout of leaves),
/// one that fails adds nothing, and past its `max` nothing more is added. A tree's root is
/// always read and checked. Sorted trees (Set, Map) are walked whole, as [`walk`] does:
/// their key order runs across subtrees.
pub fn walk_sharing(
    store: &dyn ChunkStore,
    t: &TreeRef,
    shared: &mut SharedSubtrees,
    visit: &mut dyn FnMut(&Cid, &[u8]) -> Result<()>,
) -> Result<()> {
    if t.kind.is_sorted() {
        return walk(store, t, visit);
    }
    let mut check = TreeCheck::new(t, true);
    check.done = Some(shared.by_kind.remove(&t.kind).unwrap_or_default());
    check.added = Some(Vec::new());
    let r = (|| {
        while let Some(cid) = check.next_cid()? {
            let bytes = load(store, &cid)?;
            visit(&cid, &bytes)?;
            check.check(&bytes)?;
        }
        Ok(())
    })();
    let mut done = check.done.take().unwrap_or_default();
    for (cid, level) in check.added.take().unwrap_or_default() {
        // Leaves are left out (one entry a leaf would be a map as large as the store's
        // index), and everything a failed walk added: its subtrees were not all checked.
        if level == 0 || r.is_err() || shared.held >= shared.max {
            done.remove(&(cid, level));
        } else {
            shared.held += 1;
        }
    }
    shared.by_kind.insert(t.kind, done);
    r
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

#[cfg(test)]
mod tests {
    use cairn_store::{ChunkStore, MemoryStore};

    use super::*;
    use crate::chunk::{self, ChunkKind};
    use crate::postree::node::{Entry, encode_index};

    /// A subtree checked at one level does not count as checked where another level is
    /// expected: the same index node reused one level too high fails the walk there,
    /// as every reader refuses it.
    #[test]
    fn a_repeated_subtree_counts_as_checked_only_at_its_level() {
        let s = MemoryStore::new();
        let put = |bytes: Vec<u8>| s.put(&bytes).unwrap();
        let leaf = put(chunk::frame(ChunkKind::Blob, b"hello"));
        let entry = |cid| Entry {
            cid,
            count: 5,
            key: None,
        };
        let x = put(encode_index(TreeKind::Blob, 1, &[entry(leaf)]));
        let y = put(encode_index(TreeKind::Blob, 2, &[entry(x)]));
        let tree = |root| TreeRef {
            kind: TreeKind::Blob,
            root,
            count: 10,
            height: 3,
        };
        // Sound: the same level-2 subtree twice.
        let fine = put(encode_index(TreeKind::Blob, 3, &[entry(y), entry(y)]));
        walk(&s, &tree(fine), &mut |_, _| Ok(())).unwrap();
        // X (level 1) where level 2 is expected, after it was checked at level 1.
        let bad = put(encode_index(TreeKind::Blob, 3, &[entry(y), entry(x)]));
        let e = walk(&s, &tree(bad), &mut |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("level"), "{e}");
    }

    /// An entry of an unsorted tree's index node.
    fn unsorted_entry(cid: Cid, count: u64) -> Entry {
        Entry {
            cid,
            count,
            key: None,
        }
    }

    /// Two blob leaves of 5 bytes each ("hello", "world"), stored in `s`.
    fn two_blob_leaves(s: &MemoryStore) -> (Cid, Cid) {
        (
            s.put(&chunk::frame(ChunkKind::Blob, b"hello")).unwrap(),
            s.put(&chunk::frame(ChunkKind::Blob, b"world")).unwrap(),
        )
    }

    /// A subtree checked whole in a blob does not count as checked in a list: their index
    /// nodes are alike, but a list of blob leaves is refused as `walk` refuses it.
    #[test]
    fn a_blob_subtree_is_not_a_checked_list_subtree() {
        let s = MemoryStore::new();
        let put = |bytes: Vec<u8>| s.put(&bytes).unwrap();
        let entry = unsorted_entry;
        let (l1, l2) = two_blob_leaves(&s);
        let x = put(encode_index(
            TreeKind::Blob,
            1,
            &[entry(l1, 5), entry(l2, 5)],
        ));
        let a = put(encode_index(
            TreeKind::Blob,
            2,
            &[entry(x, 10), entry(x, 10)],
        ));
        let tree = |kind, root| TreeRef {
            kind,
            root,
            count: 20,
            height: 2,
        };
        let mut shared = SharedSubtrees::new(1 << 20);
        walk_sharing(
            &s,
            &tree(TreeKind::Blob, a),
            &mut shared,
            &mut |_, _| Ok(()),
        )
        .unwrap();
        let root = put(encode_index(
            TreeKind::List,
            2,
            &[entry(x, 10), entry(x, 10)],
        ));
        let list = tree(TreeKind::List, root);
        assert!(walk(&s, &list, &mut |_, _| Ok(())).is_err());
        assert!(walk_sharing(&s, &list, &mut shared, &mut |_, _| Ok(())).is_err());
    }

    /// Across the trees of a [`walk_sharing`], a subtree checked in one tree is not read
    /// again in another, but a root always is: a node that was sound below a root (an
    /// index node of one child) is refused as a root; and a walk that failed leaves
    /// nothing behind.
    #[test]
    fn shared_subtrees_are_read_once_but_a_root_always_is() {
        let s = MemoryStore::new();
        let put = |bytes: Vec<u8>| s.put(&bytes).unwrap();
        let entry = unsorted_entry;
        let (l1, l2) = two_blob_leaves(&s);
        let x = put(encode_index(TreeKind::Blob, 1, &[entry(l1, 5)]));
        let y = put(encode_index(
            TreeKind::Blob,
            1,
            &[entry(l1, 5), entry(l2, 5)],
        ));
        let tree = |root, count, height| TreeRef {
            kind: TreeKind::Blob,
            root,
            count,
            height,
        };
        let a = put(encode_index(
            TreeKind::Blob,
            2,
            &[entry(x, 5), entry(y, 10)],
        ));
        let b = put(encode_index(
            TreeKind::Blob,
            2,
            &[entry(y, 10), entry(x, 5)],
        ));
        let mut shared = SharedSubtrees::new(16);
        let mut read = Vec::new();
        walk_sharing(&s, &tree(a, 15, 2), &mut shared, &mut |c, _| {
            read.push(*c);
            Ok(())
        })
        .unwrap();
        assert_eq!(read.len(), 5, "a, x, l1, y, l2 (l1 again skipped)");
        read.clear();
        walk_sharing(&s, &tree(b, 15, 2), &mut shared, &mut |c, _| {
            read.push(*c);
            Ok(())
        })
        .unwrap();
        assert_eq!(read, vec![b], "x and y were checked whole in a");
        // X checked below a root: as a root of one child it is refused all the same.
        let e = walk_sharing(&s, &tree(x, 5, 1), &mut shared, &mut |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("single child"), "{e}");
        // A failed walk adds nothing: z's subtree under a root whose count is wrong.
        let z = put(encode_index(
            TreeKind::Blob,
            1,
            &[entry(l2, 5), entry(l1, 5)],
        ));
        let c = put(encode_index(
            TreeKind::Blob,
            2,
            &[entry(z, 10), entry(x, 4)],
        ));
        assert!(walk_sharing(&s, &tree(c, 14, 2), &mut shared, &mut |_, _| Ok(())).is_err());
        let blobs = &shared.by_kind[&TreeKind::Blob];
        assert!(!blobs.contains_key(&(z, 1)));
        assert!(blobs.keys().all(|(_, level)| *level > 0), "no leaves kept");
        assert_eq!(shared.len(), blobs.len());
    }
}
