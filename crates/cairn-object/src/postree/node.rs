//! Node encodings, split rules and chunk loading shared by every POS-tree operation.

use bytes::Bytes;
use cairn_core::{Decoder, Encoder, Error, Result};
use cairn_store::{ChunkStore, Cid};

use super::{TreeConfig, TreeKind};
use crate::chunk::{self, CHUNK_HEADER_LEN, ChunkKind};

/// Highest level an index node may claim; deeper trees cannot be built (every index node
/// above the leaves has at least two children, so 64 levels cover any `u64` count).
pub(crate) const MAX_HEIGHT: u8 = 64;

/// One index entry: a child node, the number of units below it and, for sorted trees, the
/// last key in its subtree (the split key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub cid: Cid,
    pub count: u64,
    pub key: Option<Bytes>,
}

impl Entry {
    /// Encoded size in an index node, used by the split rule.
    pub fn encoded_len(&self) -> usize {
        let key = self
            .key
            .as_ref()
            .map_or(0, |k| varint_len(k.len() as u64) + k.len());
        cairn_core::hash::ENCODED_LEN + varint_len(self.count) + key
    }
}

/// One leaf element of a List (`key` is the element), Set (`key`) or Map (`key`, `value`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Elem {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// Bytes of the LEB128 varint encoding of `v`.
pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// True with probability `min(1, size / target)` for a uniformly distributed `h`: the
/// content-defined split pattern. Comparing `h / 2^64 < size / target` keeps the expected
/// node size near `target` bytes whatever the element sizes.
pub(crate) fn pattern(h: u64, size: usize, target: u64) -> bool {
    (h as u128) * (target as u128) < (size as u128) << 64
}

/// Hash of an element's key (List: the element) deciding leaf splits: xxh3-64, seed 0.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// A [`TreeConfig`] resolved into the sizes and masks the chunkers use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub leaf_target: u64,
    pub leaf_max: u64,
    pub index_target: u64,
    pub index_max: u64,
    pub cdc_min: usize,
    pub cdc_avg: usize,
    pub cdc_max: usize,
    mask_s: u64,
    mask_l: u64,
}

/// Smallest accepted target (FastCDC's masks start at 64-byte averages).
pub(crate) const MIN_TARGET: u32 = 64;
/// Largest accepted target (FastCDC's largest maximum chunk is 16 MiB = 8 × 2 MiB).
pub(crate) const MAX_TARGET: u32 = 1 << 21;

impl Params {
    pub fn new(cfg: &TreeConfig) -> Self {
        let leaf = cfg.leaf_target.clamp(MIN_TARGET, MAX_TARGET) & !1;
        let index = cfg.index_target.clamp(MIN_TARGET, MAX_TARGET);
        let avg = leaf as usize;
        let (mask_s, mask_l) =
            fastcdc::v2020::select_masks(avg, fastcdc::v2020::Normalization::Level1);
        Params {
            leaf_target: leaf as u64,
            leaf_max: leaf as u64 * 8,
            index_target: index as u64,
            index_max: index as u64 * 8,
            cdc_min: (avg / 4) & !1,
            cdc_avg: avg,
            cdc_max: avg * 8,
            mask_s,
            mask_l,
        }
    }

    /// Length of the next blob leaf at the start of `data`. `data` must hold at least
    /// `cdc_max` bytes unless it reaches the end of the blob; the answer then depends only
    /// on the first `cdc_max` bytes.
    #[inline]
    pub fn cut(&self, data: &[u8]) -> usize {
        let (_, n) = fastcdc::v2020::cut(
            data,
            self.cdc_min,
            self.cdc_avg,
            self.cdc_max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        n
    }
}

/// The chunk kind of a tree's index nodes.
pub(crate) fn index_kind(kind: TreeKind) -> ChunkKind {
    if kind.is_sorted() {
        ChunkKind::SIndex
    } else {
        ChunkKind::UIndex
    }
}

/// The chunk kind of a tree's leaves.
pub(crate) fn leaf_kind(kind: TreeKind) -> ChunkKind {
    match kind {
        TreeKind::Blob => ChunkKind::Blob,
        TreeKind::List => ChunkKind::List,
        TreeKind::Set => ChunkKind::Set,
        TreeKind::Map => ChunkKind::Map,
    }
}

/// Hashes a framed chunk and stores it; returns its cid.
pub(crate) fn put_chunk(store: &dyn ChunkStore, framed: &[u8]) -> Result<Cid> {
    let cid = store.algo().digest(framed);
    store.put_hashed(cid, framed)?;
    Ok(cid)
}

/// Encodes an index node of `kind` at `level` (frame included).
pub(crate) fn encode_index(kind: TreeKind, level: u8, entries: &[Entry]) -> Vec<u8> {
    let size: usize = entries.iter().map(Entry::encoded_len).sum();
    let mut e = Encoder::with_capacity(CHUNK_HEADER_LEN + 12 + size);
    e.raw(&index_kind(kind).header());
    e.u8(level).varint(entries.len() as u64);
    for x in entries {
        e.hash(&x.cid);
        if let Some(k) = &x.key {
            e.bytes(k);
        }
        e.varint(x.count);
    }
    e.finish()
}

/// Encodes an element leaf (List/Set/Map) from its element count and encoded elements.
pub(crate) fn encode_elem_leaf(kind: TreeKind, n: u64, body: &[u8]) -> Vec<u8> {
    let mut e = Encoder::with_capacity(CHUNK_HEADER_LEN + 10 + body.len());
    e.raw(&leaf_kind(kind).header());
    e.varint(n).raw(body);
    e.finish()
}

/// Appends one element's leaf encoding to `body`.
pub(crate) fn encode_elem(body: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>) {
    push_bytes(body, key);
    if let Some(v) = value {
        push_bytes(body, v);
    }
}

fn push_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let mut v = b.len() as u64;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(b);
}

/// The empty tree's single leaf (frame included).
pub(crate) fn empty_leaf(kind: TreeKind) -> Vec<u8> {
    match kind {
        TreeKind::Blob => chunk::frame(ChunkKind::Blob, &[]),
        _ => encode_elem_leaf(kind, 0, &[]),
    }
}

/// A parsed node.
#[derive(Debug)]
pub(crate) enum Node {
    /// Index node: its level (≥ 1) and entries.
    Index { level: u8, entries: Vec<Entry> },
    /// Blob leaf: its raw bytes.
    Blob(Bytes),
    /// List/Set/Map leaf: its elements.
    Elems(Vec<Elem>),
}

fn corrupt(cid: &Cid, e: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("POS-tree chunk {cid}: {e}"))
}

/// Fetches a chunk (verified by the store); a missing chunk is [`Error::NotFound`].
pub(crate) fn load(store: &dyn ChunkStore, cid: &Cid) -> Result<Bytes> {
    store
        .get(cid)?
        .ok_or_else(|| Error::not_found(format!("POS-tree chunk {cid} is missing from the store")))
}

/// Parses an index node's payload; `sorted` selects SIndex entries. Checks the level range,
/// that the node is not empty, that counts are positive and that split keys increase.
pub(crate) fn decode_index(
    chunk: &Bytes,
    payload: &[u8],
    sorted: bool,
    max: usize,
) -> Result<(u8, Vec<Entry>)> {
    let mut d = Decoder::new(payload, "POS-tree index node");
    let level = d.u8()?;
    if level == 0 || level > MAX_HEIGHT {
        return Err(Error::decode(format!(
            "index node level {level} out of range"
        )));
    }
    let n = d.count(cairn_core::hash::ENCODED_LEN + 1 + sorted as usize)?;
    if n == 0 {
        return Err(Error::decode("index node without entries"));
    }
    if n > max {
        return Err(Error::decode(format!(
            "index node of {n} entries, more than the {max} accepted"
        )));
    }
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let cid = d.hash()?;
        let key = if sorted {
            let k = d.bytes()?;
            if let Some(Entry {
                key: Some(prev), ..
            }) = entries.last()
                && prev.as_ref() >= k
            {
                return Err(Error::decode(
                    "index node split keys are not strictly increasing",
                ));
            }
            Some(chunk.slice_ref(k))
        } else {
            None
        };
        let count = d.varint()?;
        if count == 0 {
            return Err(Error::decode("index entry with a zero count"));
        }
        entries.push(Entry { cid, count, key });
    }
    d.finish()?;
    Ok((level, entries))
}

/// Walks a List/Set/Map leaf payload: hands `count` the element count once it is known to
/// be within `max` (and the payload's size), then each element's key and value (Map) to
/// `each`; checks that sorted kinds have strictly increasing keys and that nothing follows
/// the last element. Returns the element count and where the first element starts in
/// `payload`.
fn scan_elems<'p>(
    payload: &'p [u8],
    kind: TreeKind,
    max: usize,
    count: impl FnOnce(usize),
    mut each: impl FnMut(&'p [u8], Option<&'p [u8]>),
) -> Result<(usize, usize)> {
    let mut d = Decoder::new(payload, "POS-tree leaf");
    let is_map = kind == TreeKind::Map;
    let n = d.count(1 + is_map as usize)?;
    if n > max {
        return Err(Error::decode(format!(
            "leaf of {n} elements, more than the {max} accepted"
        )));
    }
    count(n);
    let start = d.position();
    let mut prev: Option<&[u8]> = None;
    for _ in 0..n {
        let key = d.bytes()?;
        let value = if is_map { Some(d.bytes()?) } else { None };
        if kind.is_sorted()
            && let Some(p) = prev
            && p >= key
        {
            return Err(Error::decode("leaf keys are not strictly increasing"));
        }
        prev = Some(key);
        each(key, value);
    }
    d.finish()?;
    Ok((n, start))
}

/// Parses a List/Set/Map leaf payload; checks sorted kinds have strictly increasing keys.
pub(crate) fn decode_elems(
    chunk: &Bytes,
    payload: &[u8],
    kind: TreeKind,
    max: usize,
) -> Result<Vec<Elem>> {
    let mut out: Vec<Elem> = Vec::new();
    let count = std::cell::Cell::new(0);
    scan_elems(
        payload,
        kind,
        max,
        |n| count.set(n),
        |k, v| {
            if out.capacity() == 0 {
                out.reserve_exact(count.get());
            }
            out.push(Elem {
                key: chunk.slice_ref(k),
                value: v.map(|v| chunk.slice_ref(v)),
            })
        },
    )?;
    Ok(out)
}

/// A List/Set/Map leaf read lazily: [`LeafElems::parse`] checks it whole (count within
/// bounds, strictly increasing keys for sorted kinds, no trailing bytes) without keeping
/// its elements, which are then decoded one at a time. A decoded element takes 64 bytes,
/// so a leaf of the largest size filled with one-byte elements took about 1 GiB as a
/// `Vec<Elem>`; read this way it takes the chunk alone.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeafElems {
    /// The encoded elements (the payload past its count).
    elems: Bytes,
    /// Offset in `elems` of the next element.
    pos: usize,
    /// Elements in the leaf.
    len: usize,
    /// Elements handed out so far.
    taken: usize,
    is_map: bool,
    first: Option<Bytes>,
    last: Option<Bytes>,
}

impl LeafElems {
    /// Checks the leaf `payload` (of `chunk`) as [`decode_elems`] does, keeping nothing
    /// but its first and last keys.
    pub(crate) fn parse(chunk: &Bytes, payload: &[u8], kind: TreeKind, max: usize) -> Result<Self> {
        let (mut first, mut last): (Option<&[u8]>, Option<&[u8]>) = (None, None);
        let (n, start) = scan_elems(
            payload,
            kind,
            max,
            |_| {},
            |k, _| {
                first.get_or_insert(k);
                last = Some(k);
            },
        )?;
        Ok(LeafElems {
            elems: chunk.slice_ref(&payload[start..]),
            pos: 0,
            len: n,
            taken: 0,
            is_map: kind == TreeKind::Map,
            first: first.map(|k| chunk.slice_ref(k)),
            last: last.map(|k| chunk.slice_ref(k)),
        })
    }

    /// Elements in the leaf.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first element's key.
    pub(crate) fn first_key(&self) -> Option<&Bytes> {
        self.first.as_ref()
    }

    /// The last element's key.
    pub(crate) fn last_key(&self) -> Option<&Bytes> {
        self.last.as_ref()
    }

    /// The next element and the bytes it takes, without moving past it.
    fn decode_next(&self) -> Result<Option<(Elem, usize)>> {
        if self.taken >= self.len {
            return Ok(None);
        }
        let rest = self.elems.get(self.pos..).unwrap_or_default();
        let mut d = Decoder::new(rest, "POS-tree leaf");
        let key = self.elems.slice_ref(d.bytes()?);
        let value = if self.is_map {
            Some(self.elems.slice_ref(d.bytes()?))
        } else {
            None
        };
        Ok(Some((Elem { key, value }, d.position())))
    }

    /// The next element.
    pub(crate) fn next_elem(&mut self) -> Result<Option<Elem>> {
        let next = self.decode_next()?;
        if let Some((_, used)) = &next {
            self.pos += used;
            self.taken += 1;
        }
        Ok(next.map(|(e, _)| e))
    }

    /// Moves past the elements whose key `before` accepts, up to the first it refuses;
    /// returns how many it moved past. Keys are compared in place (nothing is copied).
    pub(crate) fn skip_while(&mut self, mut before: impl FnMut(&[u8]) -> bool) -> Result<usize> {
        let mut skipped = 0;
        while self.taken < self.len {
            let rest = self.elems.get(self.pos..).unwrap_or_default();
            let mut d = Decoder::new(rest, "POS-tree leaf");
            if !before(d.bytes()?) {
                break;
            }
            if self.is_map {
                d.bytes()?;
            }
            self.pos += d.position();
            self.taken += 1;
            skipped += 1;
        }
        Ok(skipped)
    }

    /// Moves past the next `n` elements (fewer when the leaf ends first).
    pub(crate) fn skip(&mut self, n: usize) -> Result<()> {
        let mut left = n;
        self.skip_while(|_| {
            let go = left > 0;
            left = left.saturating_sub(1);
            go
        })?;
        Ok(())
    }

    /// Every element not handed out yet.
    pub(crate) fn collect(mut self) -> Result<Vec<Elem>> {
        let mut out = Vec::with_capacity(self.len - self.taken);
        while let Some(e) = self.next_elem()? {
            out.push(e);
        }
        Ok(out)
    }
}

/// Loads the element leaf `cid` of a `kind` tree lazily ([`LeafElems`]), checking it holds
/// the `count` elements its parent says.
pub(crate) fn load_elem_leaf_lazy(
    store: &dyn ChunkStore,
    kind: TreeKind,
    cid: &Cid,
    count: u64,
) -> Result<LeafElems> {
    let bytes = load(store, cid)?;
    let (ck, payload) = chunk::parse(&bytes).map_err(|e| corrupt(cid, e))?;
    if ck != leaf_kind(kind) || kind == TreeKind::Blob {
        return Err(corrupt(cid, "expected an element leaf"));
    }
    let leaf = LeafElems::parse(&bytes, payload, kind, usize::MAX).map_err(|e| corrupt(cid, e))?;
    if leaf.len() as u64 != count {
        return Err(corrupt(
            cid,
            format!(
                "leaf holds {} elements, its parent says {count}",
                leaf.len()
            ),
        ));
    }
    Ok(leaf)
}

/// Parses any node of a `kind` tree, checking the chunk kind matches. Decode errors become
/// [`Error::Corrupt`] naming the cid.
pub(crate) fn parse_node(cid: &Cid, chunk: &Bytes, kind: TreeKind) -> Result<Node> {
    parse_node_limited(cid, chunk, kind, usize::MAX, usize::MAX)
}

/// [`parse_node`], refusing a node of more than `max` entries or elements before
/// decoding them (a reader bounding its memory against hostile chunks): `max` index
/// entries, `max_elems` leaf elements.
pub(crate) fn parse_node_limited(
    cid: &Cid,
    chunk: &Bytes,
    kind: TreeKind,
    max: usize,
    max_elems: usize,
) -> Result<Node> {
    let (ck, payload) = chunk::parse(chunk).map_err(|e| corrupt(cid, e))?;
    if ck == index_kind(kind) {
        let (level, entries) =
            decode_index(chunk, payload, kind.is_sorted(), max).map_err(|e| corrupt(cid, e))?;
        Ok(Node::Index { level, entries })
    } else if ck == leaf_kind(kind) {
        if kind == TreeKind::Blob {
            Ok(Node::Blob(chunk.slice_ref(payload)))
        } else {
            Ok(Node::Elems(
                decode_elems(chunk, payload, kind, max_elems).map_err(|e| corrupt(cid, e))?,
            ))
        }
    } else {
        Err(corrupt(
            cid,
            format!("a {kind:?} tree cannot hold a {ck:?} chunk"),
        ))
    }
}

/// Loads and parses the node `cid`, which its parent says is at `level`.
pub(crate) fn load_node(
    store: &dyn ChunkStore,
    kind: TreeKind,
    cid: &Cid,
    level: u8,
) -> Result<Node> {
    let bytes = load(store, cid)?;
    let node = parse_node(cid, &bytes, kind)?;
    match &node {
        Node::Index { level: l, .. } if *l != level => Err(corrupt(
            cid,
            format!("index node claims level {l}, its parent expects {level}"),
        )),
        Node::Blob(_) | Node::Elems(_) if level != 0 => Err(corrupt(
            cid,
            format!("found a leaf where its parent expects level {level}"),
        )),
        _ => Ok(node),
    }
}

/// Loads an index node expected at `level` ≥ 1.
pub(crate) fn load_index(
    store: &dyn ChunkStore,
    kind: TreeKind,
    cid: &Cid,
    level: u8,
) -> Result<Vec<Entry>> {
    match load_node(store, kind, cid, level)? {
        Node::Index { entries, .. } => Ok(entries),
        _ => Err(corrupt(cid, "expected an index node")),
    }
}

/// Loads a blob leaf's bytes and checks their length against the parent's count.
pub(crate) fn load_blob_leaf(store: &dyn ChunkStore, cid: &Cid, count: u64) -> Result<Bytes> {
    blob_leaf_from(cid, load_node(store, TreeKind::Blob, cid, 0)?, count)
}

/// A blob leaf from a chunk the store already returned (verified against `cid`), checked
/// like [`load_blob_leaf`]; `None` (an absent chunk) is reported as missing.
pub(crate) fn blob_leaf_from_chunk(cid: &Cid, chunk: Option<Bytes>, count: u64) -> Result<Bytes> {
    let chunk = chunk.ok_or_else(|| {
        Error::not_found(format!("POS-tree chunk {cid} is missing from the store"))
    })?;
    blob_leaf_from(cid, parse_node(cid, &chunk, TreeKind::Blob)?, count)
}

fn blob_leaf_from(cid: &Cid, node: Node, count: u64) -> Result<Bytes> {
    match node {
        Node::Blob(b) if b.len() as u64 == count => Ok(b),
        Node::Blob(b) => Err(corrupt(
            cid,
            format!("blob leaf holds {} bytes, its parent says {count}", b.len()),
        )),
        _ => Err(corrupt(cid, "expected a blob leaf")),
    }
}

/// Start offset of each entry relative to the node's start, plus the total at the end.
pub(crate) fn prefix_sums(cid: &Cid, entries: &[Entry]) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(entries.len() + 1);
    let mut acc = 0u64;
    out.push(0);
    for e in entries {
        acc = acc
            .checked_add(e.count)
            .ok_or_else(|| corrupt(cid, "subtree counts overflow"))?;
        out.push(acc);
    }
    Ok(out)
}

pub(crate) fn corrupt_err(cid: &Cid, e: impl std::fmt::Display) -> Error {
    corrupt(cid, e)
}
