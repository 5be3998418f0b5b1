//! Lazy cursors over one level of a POS-tree: they hold the path from the root (one parsed
//! node per level) and load nodes only as the walk reaches them.

use cairn_core::Result;
use cairn_store::{ChunkStore, Cid};

use super::node::{
    Elem, Entry, LeafElems, corrupt_err, load_elem_leaf_lazy, load_index, prefix_sums,
};
use super::{TreeKind, TreeRef};

struct Frame {
    level: u8,
    entries: Vec<Entry>,
    sums: Vec<u64>,
    /// Bottom frame: the next entry to yield. Ancestors: the next child to descend into.
    idx: usize,
}

/// Yields the nodes of one level, in order, as index entries.
pub(crate) struct NodeCursor<'a> {
    store: &'a dyn ChunkStore,
    tree: TreeRef,
    level: u8,
    stack: Vec<Frame>,
    /// The level is the root's: it has a single node.
    single: bool,
    root_pending: bool,
    pos: u64,
}

impl<'a> NodeCursor<'a> {
    /// A cursor over the nodes at `level` (0 = leaves); call a `seek` before `next`.
    pub fn new(store: &'a dyn ChunkStore, tree: &TreeRef, level: u8) -> Self {
        NodeCursor {
            store,
            tree: *tree,
            level,
            stack: Vec::new(),
            single: level >= tree.height,
            root_pending: false,
            pos: 0,
        }
    }

    pub fn store(&self) -> &'a dyn ChunkStore {
        self.store
    }

    pub fn tree(&self) -> &TreeRef {
        &self.tree
    }

    /// Offset (in units) where the next node starts.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    fn frame(&self, cid: &Cid, level: u8, count: u64) -> Result<Frame> {
        let entries = load_index(self.store, self.tree.kind, cid, level)?;
        let sums = prefix_sums(cid, &entries)?;
        let total = sums.last().copied().unwrap_or(0);
        if total != count {
            return Err(corrupt_err(
                cid,
                format!("index node covers {total} units, its parent says {count}"),
            ));
        }
        Ok(Frame {
            level,
            entries,
            sums,
            idx: 0,
        })
    }

    /// Positions the cursor past the last node.
    pub fn set_end(&mut self) {
        self.stack.clear();
        self.root_pending = false;
        self.pos = self.tree.count;
    }

    /// Positions the cursor on the node containing unit `offset` (the last node when
    /// `offset` is at or past the end); with `align`, on the first node sharing that node's
    /// parent. Returns the offset where the next yielded node starts.
    pub fn seek(&mut self, offset: u64, align: bool) -> Result<u64> {
        let target = offset.min(self.tree.count.saturating_sub(1));
        self.descend(
            |f, base| {
                let rel = target.saturating_sub(base);
                Some(f.sums[1..].partition_point(|&s| s <= rel))
            },
            align,
        )
    }

    /// Positions the cursor on the first node whose split key is `>= key` (`> key` with
    /// `after`); past the end when there is none. Sorted trees only.
    pub fn seek_key(&mut self, key: &[u8], after: bool) -> Result<u64> {
        self.descend(
            |f, _| {
                let i = f.entries.partition_point(|e| {
                    let k = e.key.as_deref().unwrap_or_default();
                    if after { k <= key } else { k < key }
                });
                (i < f.entries.len()).then_some(i)
            },
            false,
        )
    }

    fn descend(
        &mut self,
        choose: impl Fn(&Frame, u64) -> Option<usize>,
        align: bool,
    ) -> Result<u64> {
        self.stack.clear();
        if self.single {
            self.root_pending = true;
            self.pos = 0;
            return Ok(0);
        }
        let mut cid = self.tree.root;
        let mut level = self.tree.height;
        let mut count = self.tree.count;
        let mut base = 0u64;
        loop {
            let mut f = self.frame(&cid, level, count)?;
            let last = f.entries.len() - 1;
            let i = match choose(&f, base) {
                Some(i) => i.min(last),
                None if self.stack.is_empty() => {
                    self.set_end();
                    return Ok(self.pos);
                }
                None => last,
            };
            if level == self.level + 1 {
                let idx = if align { 0 } else { i };
                f.idx = idx;
                self.pos = base + f.sums[idx];
                self.stack.push(f);
                return Ok(self.pos);
            }
            cid = f.entries[i].cid;
            count = f.entries[i].count;
            base += f.sums[i];
            f.idx = i + 1;
            self.stack.push(f);
            level -= 1;
        }
    }

    /// The next node of the level.
    pub fn next(&mut self) -> Result<Option<Entry>> {
        if self.single {
            if self.root_pending {
                self.root_pending = false;
                self.pos += self.tree.count;
                return Ok(Some(self.tree.root_entry()));
            }
            return Ok(None);
        }
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            if top.idx >= top.entries.len() {
                self.stack.pop();
                continue;
            }
            let e = top.entries[top.idx].clone();
            top.idx += 1;
            if top.level == self.level + 1 {
                self.pos += e.count;
                return Ok(Some(e));
            }
            let level = top.level - 1;
            let f = self.frame(&e.cid, level, e.count)?;
            self.stack.push(f);
        }
    }

    /// True when the next node is the first child of its parent (or the level is done).
    pub fn at_node_start(&self) -> bool {
        if self.single {
            return true;
        }
        match self.stack.last() {
            None => true,
            Some(f) => f.idx == 0 || f.idx == f.entries.len(),
        }
    }
}

/// Yields the elements of a List/Set/Map tree in order.
pub(crate) struct ElemCursor<'a> {
    nodes: NodeCursor<'a>,
    /// The current leaf, read lazily (its elements are decoded one at a time: a leaf of
    /// small elements decoded whole took 64 bytes an element, up to 1 GiB a leaf).
    leaf: LeafElems,
    /// Elements of `leaf` moved past.
    idx: usize,
    pos: u64,
}

impl<'a> ElemCursor<'a> {
    pub fn new(store: &'a dyn ChunkStore, tree: &TreeRef) -> Self {
        ElemCursor {
            nodes: NodeCursor::new(store, tree, 0),
            leaf: LeafElems::default(),
            idx: 0,
            pos: 0,
        }
    }

    fn kind(&self) -> TreeKind {
        self.nodes.tree().kind
    }

    /// Index of the next element.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    fn load_next(&mut self) -> Result<bool> {
        self.idx = 0;
        match self.nodes.next()? {
            Some(e) => {
                self.leaf = load_elem_leaf_lazy(self.nodes.store(), self.kind(), &e.cid, e.count)?;
                Ok(true)
            }
            None => {
                self.leaf = LeafElems::default();
                Ok(false)
            }
        }
    }

    /// Positions on the first element of the leaf holding element `offset` (the last leaf
    /// when past the end); returns that leaf's first index.
    pub fn seek_leaf_start(&mut self, offset: u64) -> Result<u64> {
        let s = self.nodes.seek(offset, false)?;
        self.load_next()?;
        self.pos = s;
        Ok(s)
    }

    /// Positions on element `offset` (past the end when `offset >= count`).
    pub fn seek_item(&mut self, offset: u64) -> Result<()> {
        if offset >= self.nodes.tree().count {
            self.nodes.set_end();
            self.leaf = LeafElems::default();
            self.idx = 0;
            self.pos = self.nodes.tree().count;
            return Ok(());
        }
        let s = self.nodes.seek(offset, false)?;
        self.load_next()?;
        let idx = offset.saturating_sub(s);
        if idx >= self.leaf.len() as u64 {
            return Err(corrupt_err(
                &self.nodes.tree().root,
                format!("element {offset} is not where the index says"),
            ));
        }
        self.leaf.skip(idx as usize)?;
        self.idx = idx as usize;
        self.pos = offset;
        Ok(())
    }

    /// Skips forward to element `offset` (≥ the current position).
    pub fn skip_to(&mut self, offset: u64) -> Result<()> {
        let ahead = offset.saturating_sub(self.pos);
        if ahead <= (self.leaf.len() - self.idx) as u64 {
            self.leaf.skip(ahead as usize)?;
            self.idx += ahead as usize;
            self.pos += ahead;
            Ok(())
        } else {
            self.seek_item(offset)
        }
    }

    /// Positions on the first element with key `>= key` (`> key` with `after`).
    pub fn seek_key(&mut self, key: &[u8], after: bool) -> Result<()> {
        let s = self.nodes.seek_key(key, after)?;
        if !self.load_next()? {
            self.pos = s;
            return Ok(());
        }
        // Past the elements before `key`, one at a time (the leaf is read lazily).
        self.idx += self
            .leaf
            .skip_while(|k| if after { k <= key } else { k < key })?;
        self.pos = s + self.idx as u64;
        Ok(())
    }

    /// The next element.
    pub fn next(&mut self) -> Result<Option<Elem>> {
        loop {
            if let Some(e) = self.leaf.next_elem()? {
                self.idx += 1;
                self.pos += 1;
                return Ok(Some(e));
            }
            if !self.load_next()? {
                return Ok(None);
            }
        }
    }

    /// True when the next element starts a leaf (or there is none).
    pub fn at_node_start(&self) -> bool {
        self.idx == 0 || self.idx >= self.leaf.len()
    }
}
