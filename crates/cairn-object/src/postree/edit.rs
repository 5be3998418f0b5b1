//! Copy-on-write edits with resynchronisation.
//!
//! An edit is a list of replacements on one level: "old units `[old_start, old_end)` become
//! these new items". For each replacement the level is re-chunked from the start of the
//! node holding `old_start` (every earlier boundary depends only on earlier content, so it
//! stays), feeding the old items before the edit, the new items, then the old items after
//! it, until a new boundary falls on an old node boundary past the edit: from there on the
//! old nodes are what a rebuild would produce. The nodes replaced on this level become the
//! replacements for the next level up, until a level has a single node: the new root.
//! The result is therefore exactly the tree a from-scratch build of the new content gives.

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::ChunkStore;

use super::build::{
    CdcWindow, ElemBuilder, IndexBuilder, Levels, NodeBuilder, build_blob, empty, finish_tree,
};
use super::cursor::{ElemCursor, NodeCursor};
use super::node::{Elem, Entry, Node, Params, corrupt_err, load_blob_leaf, load_node};
use super::{TreeConfig, TreeKind, TreeRef, expect_kind, read};

/// Old units `[old_start, old_end)` of a level are replaced by `new` items.
pub(crate) struct Rep<I> {
    pub old_start: u64,
    pub old_end: u64,
    pub new: Vec<I>,
}

/// The old content of a level, read item by item.
trait Source {
    type Item;
    fn units(item: &Self::Item) -> u64;
    /// Positions on the first item of the node holding unit `offset`; returns its offset.
    fn seek_node_start(&mut self, offset: u64) -> Result<u64>;
    /// Moves forward to the item starting at `offset` (an item boundary).
    fn skip_to(&mut self, offset: u64) -> Result<()>;
    fn next(&mut self) -> Result<Option<Self::Item>>;
    /// True when the next item starts a node of the level being rebuilt.
    fn at_node_start(&self) -> bool;
}

impl Source for ElemCursor<'_> {
    type Item = Elem;
    fn units(_: &Elem) -> u64 {
        1
    }
    fn seek_node_start(&mut self, offset: u64) -> Result<u64> {
        self.seek_leaf_start(offset)
    }
    fn skip_to(&mut self, offset: u64) -> Result<()> {
        ElemCursor::skip_to(self, offset)
    }
    fn next(&mut self) -> Result<Option<Elem>> {
        ElemCursor::next(self)
    }
    fn at_node_start(&self) -> bool {
        ElemCursor::at_node_start(self)
    }
}

struct NodeSource<'a>(NodeCursor<'a>);

impl Source for NodeSource<'_> {
    type Item = Entry;
    fn units(e: &Entry) -> u64 {
        e.count
    }
    fn seek_node_start(&mut self, offset: u64) -> Result<u64> {
        self.0.seek(offset, true)
    }
    fn skip_to(&mut self, offset: u64) -> Result<()> {
        if offset >= self.0.tree().count {
            self.0.set_end();
            return Ok(());
        }
        let at = self.0.seek(offset, false)?;
        if at != offset {
            return Err(corrupt_err(
                &self.0.tree().root,
                format!("no node boundary at unit {offset} where one was found before"),
            ));
        }
        Ok(())
    }
    fn next(&mut self) -> Result<Option<Entry>> {
        self.0.next()
    }
    fn at_node_start(&self) -> bool {
        self.0.at_node_start()
    }
}

fn inconsistent(t: &TreeRef) -> Error {
    corrupt_err(&t.root, "subtree counts are inconsistent")
}

/// Re-chunks one level around the replacements (sorted, disjoint); returns the replaced
/// nodes of the level as replacements for the level above.
fn rechunk<S: Source, B: NodeBuilder<Item = S::Item>>(
    t: &TreeRef,
    src: &mut S,
    b: &mut B,
    reps: Vec<Rep<S::Item>>,
) -> Result<Vec<Rep<Entry>>> {
    let mut out = Vec::new();
    let mut reps = reps.into_iter().peekable();
    while let Some(first) = reps.peek() {
        let start = src.seek_node_start(first.old_start)?;
        if start > first.old_start || out.last().is_some_and(|r: &Rep<Entry>| start < r.old_end) {
            return Err(inconsistent(t));
        }
        let mut pos = start;
        let mut fed = false;
        let mut new = Vec::new();
        loop {
            if let Some(r) = reps.peek() {
                if r.old_start < pos {
                    return Err(inconsistent(t));
                }
                if r.old_start == pos
                    && let Some(r) = reps.next()
                {
                    for it in r.new {
                        if let Some(e) = b.push(it)? {
                            new.push(e);
                        }
                    }
                    src.skip_to(r.old_end)?;
                    pos = r.old_end;
                    fed = true;
                    continue;
                }
            }
            if fed && b.is_empty() && src.at_node_start() {
                break;
            }
            match src.next()? {
                Some(it) => {
                    pos += S::units(&it);
                    if let Some(e) = b.push(it)? {
                        new.push(e);
                    }
                }
                None => {
                    if let Some(e) = b.flush()? {
                        new.push(e);
                    }
                    if pos != t.count || reps.peek().is_some() {
                        return Err(inconsistent(t));
                    }
                    break;
                }
            }
        }
        out.push(Rep {
            old_start: start,
            old_end: pos,
            new,
        });
    }
    Ok(out)
}

/// A tree whose level `level` consists of `nodes`.
fn tree_from_level(
    store: &dyn ChunkStore,
    p: Params,
    kind: TreeKind,
    nodes: Vec<Entry>,
    level: u8,
) -> Result<TreeRef> {
    match nodes.len() {
        0 => empty(store, kind),
        1 => Ok(TreeRef {
            kind,
            root: nodes[0].cid,
            count: nodes[0].count,
            height: level,
        }),
        _ => {
            let mut lv = Levels::new(store, kind, p, level);
            for n in nodes {
                lv.push(n)?;
            }
            finish_tree(store, kind, lv)
        }
    }
}

/// The old units no replacement covers, as half-open ranges.
fn gaps(reps: &[Rep<Entry>], total: u64) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut at = 0;
    for r in reps {
        if r.old_start > at {
            gaps.push((at, r.old_start));
        }
        at = at.max(r.old_end);
    }
    if at < total {
        gaps.push((at, total));
    }
    gaps
}

/// The old node spanning exactly `[x, y)` on `level`, if there is one.
fn node_spanning(
    store: &dyn ChunkStore,
    t: &TreeRef,
    level: u8,
    (x, y): (u64, u64),
) -> Result<Option<Entry>> {
    let mut c = NodeCursor::new(store, t, level);
    let s = c.seek(x, false)?;
    Ok(match c.next()? {
        Some(e) if s == x && x + e.count == y => Some(e),
        _ => None,
    })
}

/// The old root as an index entry (with its split key, the tree's last key, when sorted).
fn root_entry(store: &dyn ChunkStore, t: &TreeRef) -> Result<Entry> {
    let mut e = t.root_entry();
    if t.kind.is_sorted() {
        e.key = match load_node(store, t.kind, &t.root, t.height)? {
            Node::Index { entries, .. } => entries.last().and_then(|x| x.key.clone()),
            Node::Elems(elems) => elems.last().map(|x| x.key.clone()),
            Node::Blob(_) => None,
        };
        if e.key.is_none() {
            return Err(inconsistent(t));
        }
    }
    Ok(e)
}

/// Propagates replaced level-0 nodes (leaves) up to a new root. At each level the new node
/// sequence is the old one with the replacements applied; the first level left with a
/// single node holds the root, exactly as in a from-scratch build.
fn apply_levels(
    store: &dyn ChunkStore,
    p: Params,
    t: &TreeRef,
    mut reps: Vec<Rep<Entry>>,
) -> Result<TreeRef> {
    let kind = t.kind;
    let mut level = 0u8;
    loop {
        let gaps = gaps(&reps, t.count);
        if gaps.is_empty() {
            // Every old node of the level was replaced: the new level is known in full.
            let nodes = reps.into_iter().flat_map(|r| r.new).collect();
            return tree_from_level(store, p, kind, nodes, level);
        }
        if level >= t.height {
            // The old level is the root alone, and it survives: the replacements can only
            // be insertions in front of it or after it.
            let root = root_entry(store, t)?;
            let mut before = Vec::new();
            let mut after = Vec::new();
            for r in reps {
                if r.old_start == 0 && r.old_end == 0 {
                    before.extend(r.new);
                } else if r.old_start == t.count && r.old_end == t.count {
                    after.extend(r.new);
                } else {
                    return Err(inconsistent(t));
                }
            }
            before.push(root);
            before.extend(after);
            return tree_from_level(store, p, kind, before, level);
        }
        if reps.iter().all(|r| r.new.is_empty())
            && let [gap] = gaps[..]
            && let Some(e) = node_spanning(store, t, level, gap)?
        {
            // Deletions left a single old node on this level: it is the new root.
            return Ok(TreeRef {
                kind,
                root: e.cid,
                count: e.count,
                height: level,
            });
        }
        let mut src = NodeSource(NodeCursor::new(store, t, level));
        let mut b = IndexBuilder::new(store, kind, level + 1, p)?;
        reps = rechunk(t, &mut src, &mut b, reps)?;
        level += 1;
    }
}

/// Applies element replacements to a List/Set/Map tree.
fn splice_elems(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    t: &TreeRef,
    reps: Vec<Rep<Elem>>,
) -> Result<TreeRef> {
    if reps.is_empty() {
        return Ok(*t);
    }
    let p = Params::new(cfg);
    let mut b = ElemBuilder::new(store, t.kind, p);
    if t.count == 0 {
        let mut lv = Levels::new(store, t.kind, p, 0);
        for r in reps {
            for it in r.new {
                if let Some(e) = b.push(it)? {
                    lv.push(e)?;
                }
            }
        }
        if let Some(e) = b.flush()? {
            lv.push(e)?;
        }
        return finish_tree(store, t.kind, lv);
    }
    let mut src = ElemCursor::new(store, t);
    let leaves = rechunk(t, &mut src, &mut b, reps)?;
    apply_levels(store, p, t, leaves)
}

fn elem(b: &[u8]) -> Elem {
    Elem {
        key: Bytes::copy_from_slice(b),
        value: None,
    }
}

/// Replaces `delete` elements of a List tree at `index` with `insert`. `index` or
/// `index + delete` past the end is [`Error::InvalidInput`].
pub fn list_splice(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    t: &TreeRef,
    index: u64,
    delete: u64,
    insert: &[Bytes],
) -> Result<TreeRef> {
    expect_kind(t, &[TreeKind::List], "list_splice")?;
    let end = index
        .checked_add(delete)
        .filter(|&e| e <= t.count)
        .ok_or_else(|| {
            Error::invalid(format!(
                "list splice at {index} deleting {delete} is out of range for a list of {}",
                t.count
            ))
        })?;
    if delete == 0 && insert.is_empty() {
        return Ok(*t);
    }
    let new = insert
        .iter()
        .map(|b| Elem {
            key: b.clone(),
            value: None,
        })
        .collect();
    splice_elems(
        store,
        cfg,
        t,
        vec![Rep {
            old_start: index,
            old_end: end,
            new,
        }],
    )
}

/// Sorts edits by key, keeping the last edit of each key.
fn last_wins<V>(mut edits: Vec<(Vec<u8>, V)>) -> Vec<(Vec<u8>, V)> {
    edits.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<(Vec<u8>, V)> = Vec::with_capacity(edits.len());
    for e in edits {
        match out.last_mut() {
            Some(last) if last.0 == e.0 => *last = e,
            _ => out.push(e),
        }
    }
    out
}

/// Finds `key`: its rank (index of the first key `>= key`) and current element, if present.
fn locate(c: &mut ElemCursor<'_>, key: &[u8]) -> Result<(u64, Option<Elem>)> {
    c.seek_key(key, false)?;
    let rank = c.pos();
    Ok(match c.next()? {
        Some(e) if e.key.as_ref() == key => (rank, Some(e)),
        _ => (rank, None),
    })
}

/// Applies a batch of Map edits: `Some(value)` upserts, `None` deletes (absent keys are
/// ignored). Edits may come in any order; a later edit of the same key wins.
pub fn map_update(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    t: &TreeRef,
    edits: Vec<(Vec<u8>, Option<Vec<u8>>)>,
) -> Result<TreeRef> {
    expect_kind(t, &[TreeKind::Map], "map_update")?;
    let mut c = ElemCursor::new(store, t);
    let mut reps = Vec::new();
    for (k, v) in last_wins(edits) {
        let (rank, cur) = locate(&mut c, &k)?;
        let rep = match (cur, v) {
            (Some(old), Some(v)) if old.value.as_deref() == Some(v.as_slice()) => continue,
            (Some(_), Some(v)) => (rank + 1, Some(v)),
            (Some(_), None) => (rank + 1, None),
            (None, Some(v)) => (rank, Some(v)),
            (None, None) => continue,
        };
        reps.push(Rep {
            old_start: rank,
            old_end: rep.0,
            new: rep
                .1
                .map(|v| Elem {
                    key: Bytes::from(k),
                    value: Some(Bytes::from(v)),
                })
                .into_iter()
                .collect(),
        });
    }
    splice_elems(store, cfg, t, reps)
}

/// Applies a batch of Set edits: `true` inserts, `false` removes. Any order; a later edit
/// of the same key wins.
pub fn set_update(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    t: &TreeRef,
    edits: Vec<(Vec<u8>, bool)>,
) -> Result<TreeRef> {
    expect_kind(t, &[TreeKind::Set], "set_update")?;
    let mut c = ElemCursor::new(store, t);
    let mut reps = Vec::new();
    for (k, present) in last_wins(edits) {
        let (rank, cur) = locate(&mut c, &k)?;
        match (cur.is_some(), present) {
            (true, false) => reps.push(Rep {
                old_start: rank,
                old_end: rank + 1,
                new: Vec::new(),
            }),
            (false, true) => reps.push(Rep {
                old_start: rank,
                old_end: rank,
                new: vec![elem(&k)],
            }),
            _ => {}
        }
    }
    splice_elems(store, cfg, t, reps)
}

/// Where the bytes of the edited blob come from, in order.
enum Piece {
    Prefix(Bytes, usize),
    Insert(usize),
    Suffix(Bytes, usize),
    Done,
}

/// Replaces `delete` bytes at `offset` of a Blob tree with `insert`, re-chunking only from
/// the leaf whose boundary the edit can move until the boundaries resynchronise.
/// `offset` or `offset + delete` past the end is [`Error::InvalidInput`].
pub fn blob_splice(
    store: &dyn ChunkStore,
    cfg: &TreeConfig,
    t: &TreeRef,
    offset: u64,
    delete: u64,
    insert: &[u8],
) -> Result<TreeRef> {
    expect_kind(t, &[TreeKind::Blob], "blob_splice")?;
    let end = offset
        .checked_add(delete)
        .filter(|&e| e <= t.count)
        .ok_or_else(|| {
            Error::invalid(format!(
                "blob splice at {offset} deleting {delete} is out of range for a blob of {} bytes",
                t.count
            ))
        })?;
    if delete == 0 && insert.is_empty() {
        return Ok(*t);
    }
    if t.count == 0 {
        return build_blob(store, cfg, insert);
    }
    let p = Params::new(cfg);
    let ins_len = insert.len() as u64;
    let ins_end = offset
        .checked_add(ins_len)
        .ok_or_else(|| Error::invalid("blob would exceed 2^64 bytes"))?;

    // FastCDC decides a cut from the bytes before it, the byte at it, and whether the
    // input goes on for two more bytes (it tests candidate positions in pairs and never in
    // the last pair of the input). So the first leaf an edit at `offset` can change is the
    // one holding byte `offset - 3`; every boundary before it stays.
    let mut cur = NodeCursor::new(store, t, 0);
    let start = cur.seek(offset.saturating_sub(3), false)?;
    if start > offset {
        return Err(inconsistent(t));
    }
    let prefix = Bytes::from(read::blob_read(store, t, start, offset - start)?);
    if prefix.len() as u64 != offset - start {
        return Err(inconsistent(t));
    }
    let mut piece = Piece::Prefix(prefix, 0);

    // Old leaf boundaries at or after `end`, in old offsets.
    let mut boundaries = std::collections::VecDeque::new();
    let mut suffix_entered = false;
    let enter_suffix = |cur: &mut NodeCursor<'_>,
                        boundaries: &mut std::collections::VecDeque<u64>|
     -> Result<Piece> {
        if end >= t.count {
            boundaries.push_back(t.count);
            return Ok(Piece::Done);
        }
        let ls = cur.seek(end, false)?;
        let e = cur.next()?.ok_or_else(|| inconsistent(t))?;
        let leaf = load_blob_leaf(store, &e.cid, e.count)?;
        if ls == end {
            boundaries.push_back(end);
        }
        boundaries.push_back(ls + e.count);
        let skip = end
            .checked_sub(ls)
            .filter(|&n| n < e.count)
            .ok_or_else(|| inconsistent(t))?;
        Ok(Piece::Suffix(leaf, skip as usize))
    };

    let mut win = CdcWindow::new(&p);
    let mut new_leaves = Vec::new();
    let mut new_off = start;
    let old_end;
    loop {
        if new_off >= ins_end {
            if !suffix_entered {
                suffix_entered = true;
                piece = enter_suffix(&mut cur, &mut boundaries)?;
            }
            let q = new_off - ins_len + delete;
            while boundaries.front().is_some_and(|&b| b < q) {
                boundaries.pop_front();
            }
            if boundaries.front() == Some(&q) {
                old_end = q;
                break;
            }
        }
        while win.avail() < p.cdc_max && !matches!(piece, Piece::Done) {
            piece = match piece {
                Piece::Prefix(b, i) => {
                    let n = win.push(&b[i..]);
                    if i + n < b.len() {
                        Piece::Prefix(b, i + n)
                    } else {
                        Piece::Insert(0)
                    }
                }
                Piece::Insert(i) => {
                    let n = win.push(&insert[i..]);
                    if i + n < insert.len() {
                        Piece::Insert(i + n)
                    } else if suffix_entered {
                        Piece::Done
                    } else {
                        suffix_entered = true;
                        enter_suffix(&mut cur, &mut boundaries)?
                    }
                }
                Piece::Suffix(b, i) => {
                    let n = win.push(&b[i..]);
                    if i + n < b.len() {
                        Piece::Suffix(b, i + n)
                    } else {
                        match cur.next()? {
                            Some(e) => {
                                let leaf = load_blob_leaf(store, &e.cid, e.count)?;
                                boundaries.push_back(cur.pos());
                                Piece::Suffix(leaf, 0)
                            }
                            None => Piece::Done,
                        }
                    }
                }
                Piece::Done => Piece::Done,
            };
        }
        let eof = matches!(piece, Piece::Done);
        match win.emit(store, &p, eof)? {
            Some(e) => {
                new_off += e.count;
                new_leaves.push(e);
            }
            None if eof => {
                old_end = t.count;
                break;
            }
            None => return Err(Error::invalid("blob window failed to fill")),
        }
    }
    win.clear();
    let reps = vec![Rep {
        old_start: start,
        old_end,
        new: new_leaves,
    }];
    apply_levels(store, p, t, reps)
}
