//! Diffs that descend only where cids differ.
//!
//! Each side is a frontier: the not-yet-compared rest of the tree as a sequence of whole
//! subtrees (and, once a leaf is opened, its elements), in order. When both fronts are the
//! same subtree (equal cids) it is skipped unopened; otherwise the taller one is opened.

use std::collections::HashMap;
use std::ops::ControlFlow;

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::{ChunkStore, Cid};

use super::TreeRef;
use super::node::{Elem, Node, corrupt_err, load_node};

/// One key whose presence or value differs between two Map or Set trees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChange {
    /// The key.
    pub key: Bytes,
    /// Its value on the left (`a`) side; for a Set, `Some(empty)` means present.
    pub left: Option<Bytes>,
    /// Its value on the right (`b`) side; for a Set, `Some(empty)` means present.
    pub right: Option<Bytes>,
}

/// A region where two Blob or List trees differ: units `a_start..a_end` of `a` correspond
/// to units `b_start..b_end` of `b` (half-open; units are bytes or elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqChange {
    /// Start of the region in `a`.
    pub a_start: u64,
    /// End of the region in `a`.
    pub a_end: u64,
    /// Start of the region in `b`.
    pub b_start: u64,
    /// End of the region in `b`.
    pub b_end: u64,
}

#[derive(Clone, Debug)]
enum Item {
    Node { cid: Cid, level: u8, count: u64 },
    Elem(Elem),
}

struct Frontier<'a> {
    store: &'a dyn ChunkStore,
    tree: TreeRef,
    /// Reversed: the front is the last item.
    stack: Vec<Item>,
    /// Sorted trees: keys up to this one are left out (subtrees whose split key is not
    /// above it are never read).
    after: Option<Bytes>,
}

impl<'a> Frontier<'a> {
    fn new(store: &'a dyn ChunkStore, t: &TreeRef) -> Self {
        Frontier {
            store,
            tree: *t,
            stack: vec![Item::Node {
                cid: t.root,
                level: t.height,
                count: t.count,
            }],
            after: None,
        }
    }

    /// Leaves out the keys up to `after` (sorted trees).
    fn after(mut self, after: Option<&[u8]>) -> Self {
        self.after = after.map(Bytes::copy_from_slice);
        self
    }

    /// Whether `key` comes after the left-out keys.
    fn keeps(&self, key: Option<&Bytes>) -> bool {
        match (&self.after, key) {
            (Some(a), Some(k)) => k > a,
            _ => true,
        }
    }

    fn front(&self) -> Option<&Item> {
        self.stack.last()
    }

    /// Replaces the front node by its children (or its elements for a leaf).
    fn open(&mut self, leaves_too: bool) -> Result<()> {
        let Some(Item::Node { cid, level, count }) = self.stack.pop() else {
            return Ok(());
        };
        match load_node(self.store, self.tree.kind, &cid, level)? {
            Node::Index { entries, .. } => {
                // Checked sums: with saturation, crafted counts could add up to `u64::MAX`
                // and pass for a parent claiming as much.
                let mut sum = Some(0u64);
                for e in entries.iter().rev() {
                    sum = sum.and_then(|s| s.checked_add(e.count));
                    if self.keeps(e.key.as_ref()) {
                        self.stack.push(Item::Node {
                            cid: e.cid,
                            level: level - 1,
                            count: e.count,
                        });
                    }
                }
                if sum != Some(count) {
                    return Err(corrupt_err(&cid, "index counts disagree with the parent"));
                }
            }
            Node::Elems(elems) if leaves_too => {
                if elems.len() as u64 != count {
                    return Err(corrupt_err(&cid, "leaf count disagrees with the parent"));
                }
                let kept: Vec<Elem> = elems
                    .into_iter()
                    .filter(|e| self.keeps(Some(&e.key)))
                    .collect();
                self.stack.extend(kept.into_iter().rev().map(Item::Elem));
            }
            _ => {
                return Err(corrupt_err(&cid, "cannot open a leaf here"));
            }
        }
        Ok(())
    }

    /// Pops the next leaf (opening index nodes on the way): `(cid, count)`.
    fn next_leaf(&mut self) -> Result<Option<(Cid, u64)>> {
        loop {
            match self.stack.last() {
                None => return Ok(None),
                Some(Item::Node {
                    level: 0,
                    cid,
                    count,
                }) => {
                    let r = (*cid, *count);
                    self.stack.pop();
                    return Ok(Some(r));
                }
                Some(Item::Node { .. }) => self.open(false)?,
                Some(Item::Elem(_)) => {
                    return Err(Error::invalid("sequence diff met an element"));
                }
            }
        }
    }

    /// Rebuilds the frontier so its front is the leaf starting at unit `offset`.
    fn seek_leaf(&mut self, offset: u64) -> Result<()> {
        if self.seek_leaf_start(offset)? {
            return Ok(());
        }
        Err(corrupt_err(
            &self.tree.root,
            format!("no leaf starts at unit {offset}"),
        ))
    }

    /// [`Frontier::seek_leaf`], answering `false` when no leaf starts at `offset` (the
    /// end of the tree counts as a start).
    fn seek_leaf_start(&mut self, offset: u64) -> Result<bool> {
        self.stack.clear();
        self.stack.push(Item::Node {
            cid: self.tree.root,
            level: self.tree.height,
            count: self.tree.count,
        });
        let mut pos = 0u64;
        while let Some(Item::Node { count, level, .. }) = self.stack.last() {
            let (count, level) = (*count, *level);
            if pos.saturating_add(count) <= offset && count > 0 {
                pos += count;
                self.stack.pop();
            } else if pos == offset && level == 0 {
                return Ok(true);
            } else if level > 0 {
                self.open(false)?;
            } else {
                break;
            }
        }
        Ok(pos == offset && self.stack.is_empty())
    }
}

/// Leaves a sequence diff walks, both sides together, in one changed region before it
/// gives up finding where they meet again and reports the rest of both as one region
/// (about 1 GiB of 4 KiB leaves on each side).
const MAX_REGION_LEAVES: usize = 1 << 19;

/// Position `p` moved past `n` units, or a corrupt-tree error where that overflows.
fn checked_pos(p: u64, n: u64, cid: &Cid) -> Result<u64> {
    p.checked_add(n)
        .ok_or_else(|| corrupt_err(cid, "unit counts overflow"))
}

fn present(e: &Elem) -> Bytes {
    e.value.clone().unwrap_or_default()
}

/// The keys whose presence or value differ between Map (or Set) trees `a` and `b`, sorted
/// by key. Subtrees with equal cids on both sides are skipped without being read.
pub fn diff_sorted(store: &dyn ChunkStore, a: &TreeRef, b: &TreeRef) -> Result<Vec<KeyChange>> {
    Ok(collect_changes(usize::MAX, |each| diff_sorted_each(store, a, b, None, each))?.0)
}

/// Collects at most `limit` of the changes a streamed diff (`walk`, fed a visitor) hands
/// out; also whether more followed (the walk is stopped at the first one past `limit`).
pub fn collect_changes<T>(
    limit: usize,
    walk: impl FnOnce(&mut dyn FnMut(T) -> Result<ControlFlow<()>>) -> Result<()>,
) -> Result<(Vec<T>, bool)> {
    let mut out = Vec::new();
    let mut more = false;
    walk(&mut |c| {
        if out.len() == limit {
            more = true;
            return Ok(ControlFlow::Break(()));
        }
        out.push(c);
        Ok(ControlFlow::Continue(()))
    })?;
    Ok((out, more))
}

/// [`diff_sorted`] of the keys after `after` (all with `None`), handing each change to
/// `each` in key order instead of collecting them: memory stays bounded by the trees'
/// depth, and subtrees holding only keys up to `after` are not read. `each` may stop the
/// walk (`Break`) or fail it (its error is returned).
pub fn diff_sorted_each(
    store: &dyn ChunkStore,
    a: &TreeRef,
    b: &TreeRef,
    after: Option<&[u8]>,
    each: &mut dyn FnMut(KeyChange) -> Result<ControlFlow<()>>,
) -> Result<()> {
    if a.kind != b.kind || !a.kind.is_sorted() {
        return Err(Error::TypeMismatch(format!(
            "diff_sorted compares two Map or two Set trees, not {:?} and {:?}",
            a.kind, b.kind
        )));
    }
    let mut fa = Frontier::new(store, a).after(after);
    let mut fb = Frontier::new(store, b).after(after);
    loop {
        match (fa.front(), fb.front()) {
            (None, None) => break,
            (Some(Item::Node { .. }), None) => fa.open(true)?,
            (None, Some(Item::Node { .. })) => fb.open(true)?,
            (Some(Item::Elem(e)), None) => {
                if each(KeyChange {
                    key: e.key.clone(),
                    left: Some(present(e)),
                    right: None,
                })?
                .is_break()
                {
                    return Ok(());
                }
                fa.stack.pop();
            }
            (None, Some(Item::Elem(e))) => {
                if each(KeyChange {
                    key: e.key.clone(),
                    left: None,
                    right: Some(present(e)),
                })?
                .is_break()
                {
                    return Ok(());
                }
                fb.stack.pop();
            }
            (
                Some(Item::Node {
                    cid: ca, level: la, ..
                }),
                Some(Item::Node {
                    cid: cb, level: lb, ..
                }),
            ) => {
                if ca == cb {
                    fa.stack.pop();
                    fb.stack.pop();
                } else {
                    let (la, lb) = (*la, *lb);
                    if la >= lb {
                        fa.open(true)?;
                    }
                    if lb >= la {
                        fb.open(true)?;
                    }
                }
            }
            (Some(Item::Node { .. }), Some(Item::Elem(_))) => fa.open(true)?,
            (Some(Item::Elem(_)), Some(Item::Node { .. })) => fb.open(true)?,
            (Some(Item::Elem(x)), Some(Item::Elem(y))) => match x.key.cmp(&y.key) {
                std::cmp::Ordering::Less => {
                    if each(KeyChange {
                        key: x.key.clone(),
                        left: Some(present(x)),
                        right: None,
                    })?
                    .is_break()
                    {
                        return Ok(());
                    }
                    fa.stack.pop();
                }
                std::cmp::Ordering::Greater => {
                    if each(KeyChange {
                        key: y.key.clone(),
                        left: None,
                        right: Some(present(y)),
                    })?
                    .is_break()
                    {
                        return Ok(());
                    }
                    fb.stack.pop();
                }
                std::cmp::Ordering::Equal => {
                    if x.value != y.value
                        && each(KeyChange {
                            key: x.key.clone(),
                            left: Some(present(x)),
                            right: Some(present(y)),
                        })?
                        .is_break()
                    {
                        return Ok(());
                    }
                    fa.stack.pop();
                    fb.stack.pop();
                }
            },
        }
    }
    Ok(())
}

/// The regions where Blob (or List) trees `a` and `b` differ, at leaf granularity, sorted
/// and disjoint. Outside them the content is identical (matched by equal cids), so
/// replacing each `a[a_start..a_end]` with `b[b_start..b_end]` turns `a` into `b`.
/// Identical subtrees are skipped unread; inside a changed region both sides are walked
/// leaf by leaf until a leaf of one side reappears on the other (resynchronisation).
pub fn diff_seq(store: &dyn ChunkStore, a: &TreeRef, b: &TreeRef) -> Result<Vec<SeqChange>> {
    Ok(collect_changes(usize::MAX, |each| diff_seq_each(store, a, b, None, each))?.0)
}

/// [`diff_seq`] from units `from` = `(a, b)` on (the two sides' ends of an earlier region,
/// or `(0, 0)` with `None`), handing each region to `each` in order instead of collecting
/// them. `each` may stop the walk (`Break`) or fail it (its error is returned). A `from`
/// that is not where a leaf starts on both sides, or lies past an end, is refused
/// ([`Error::InvalidInput`]); one at leaf starts that no region ended at is taken as given
/// (the diff of what follows those positions, which need not line up).
pub fn diff_seq_each(
    store: &dyn ChunkStore,
    a: &TreeRef,
    b: &TreeRef,
    from: Option<(u64, u64)>,
    each: &mut dyn FnMut(SeqChange) -> Result<ControlFlow<()>>,
) -> Result<()> {
    if a.kind != b.kind || a.kind.is_sorted() {
        return Err(Error::TypeMismatch(format!(
            "diff_seq compares two Blob or two List trees, not {:?} and {:?}",
            a.kind, b.kind
        )));
    }
    let mut fa = Frontier::new(store, a);
    let mut fb = Frontier::new(store, b);
    let (mut pa, mut pb) = from.unwrap_or((0, 0));
    if (pa, pb) != (0, 0) {
        let bad = || {
            Error::invalid(format!(
                "diff position {pa}/{pb} is not where a leaf starts on both sides"
            ))
        };
        if pa > a.count || pb > b.count {
            return Err(bad());
        }
        if !fa.seek_leaf_start(pa)? || !fb.seek_leaf_start(pb)? {
            return Err(bad());
        }
    }
    loop {
        let (ha, hb) = match (fa.front(), fb.front()) {
            (None, None) => break,
            (
                Some(Item::Node {
                    cid: ca,
                    level: la,
                    count: na,
                }),
                Some(Item::Node {
                    cid: cb,
                    level: lb,
                    count: nb,
                }),
            ) => ((*ca, *la, *na), (*cb, *lb, *nb)),
            (None, _) | (_, None) => {
                // What one side has left (nothing when both are at their ends: a diff
                // resumed at the end of one side may find only an empty node on the other).
                if (pa < a.count || pb < b.count)
                    && each(SeqChange {
                        a_start: pa,
                        a_end: a.count,
                        b_start: pb,
                        b_end: b.count,
                    })?
                    .is_break()
                {
                    return Ok(());
                }
                break;
            }
            _ => return Err(Error::invalid("sequence diff met an element")),
        };
        if ha.0 == hb.0 {
            // Counts passed their parents' checks, which sum within `u64`, but a crafted
            // tree may repeat a subtree: positions never wrap, they fail.
            pa = checked_pos(pa, ha.2, &a.root)?;
            pb = checked_pos(pb, hb.2, &b.root)?;
            fa.stack.pop();
            fb.stack.pop();
            continue;
        }
        if ha.1 > 0 || hb.1 > 0 {
            if ha.1 >= hb.1 {
                fa.open(false)?;
            }
            if hb.1 >= ha.1 {
                fb.open(false)?;
            }
            continue;
        }
        // Two different leaves: a changed region starts here.
        let (ra, rb) = (pa, pb);
        let mut seen_a: HashMap<Cid, u64> = HashMap::new();
        let mut seen_b: HashMap<Cid, u64> = HashMap::new();
        let mut done_a = false;
        let mut done_b = false;
        let mut steps = 0usize;
        loop {
            // A region walked this far without the sides meeting again runs to both ends:
            // still a diff (outside it the content is the same), a coarser one, and the
            // walk's memory (the leaves seen) and time stay bounded.
            steps += 1;
            if steps > MAX_REGION_LEAVES {
                pa = a.count;
                pb = b.count;
                done_a = true;
                done_b = true;
            }
            // One side exhausted: the rest of the other is this region's (walking it leaf
            // by leaf could only find a leaf seen earlier on the exhausted side; and a
            // deduplicated tree may claim far more leaves than it stores).
            if done_a != done_b {
                if done_b {
                    pa = a.count;
                } else {
                    pb = b.count;
                }
                done_a = true;
                done_b = true;
            }
            let take_a = !done_a && (done_b || pa - ra <= pb - rb);
            if !take_a && done_b {
                if each(SeqChange {
                    a_start: ra,
                    a_end: pa,
                    b_start: rb,
                    b_end: pb,
                })?
                .is_break()
                {
                    return Ok(());
                }
                return Ok(());
            }
            let (f, p, done, seen, other_seen, other, po) = if take_a {
                (
                    &mut fa,
                    &mut pa,
                    &mut done_a,
                    &mut seen_a,
                    &seen_b,
                    &mut fb,
                    &mut pb,
                )
            } else {
                (
                    &mut fb,
                    &mut pb,
                    &mut done_b,
                    &mut seen_b,
                    &seen_a,
                    &mut fa,
                    &mut pa,
                )
            };
            match f.next_leaf()? {
                None => *done = true,
                Some((cid, count)) => {
                    if let Some(&q) = other_seen.get(&cid) {
                        f.stack.push(Item::Node {
                            cid,
                            level: 0,
                            count,
                        });
                        other.seek_leaf(q)?;
                        *po = q;
                        break;
                    }
                    seen.entry(cid).or_insert(*p);
                    *p = checked_pos(*p, count, &cid)?;
                }
            }
        }
        if each(SeqChange {
            a_start: ra,
            a_end: pa,
            b_start: rb,
            b_end: pb,
        })?
        .is_break()
        {
            return Ok(());
        }
    }
    Ok(())
}
