//! The Pattern-Oriented-Split tree (ForkBase §4.3): a content-defined Merkle B+-tree that
//! stores Blob, List, Set and Map values.
//!
//! # Structure
//!
//! Every node is one chunk, framed with [`crate::chunk::frame`] and named by the hash of its
//! bytes. Level 0 holds the leaves; a node at level `h ≥ 1` is an index node whose entries
//! name nodes at level `h − 1`. The root is the single node of the topmost level; a tree
//! with one leaf has height 0 and that leaf is its root. The empty tree is one empty leaf.
//!
//! Encodings (payloads after the 2-byte frame, written with [`cairn_core::Encoder`]):
//!
//! - Blob leaf (`ChunkKind::Blob`): the raw bytes.
//! - List / Set leaf: `varint n`, then `n` length-prefixed elements (Set: strictly
//!   increasing keys).
//! - Map leaf: `varint n`, then `n` pairs `(bytes key, bytes value)`, keys strictly increasing.
//! - UIndex (Blob, List): `u8 level`, `varint n`, then `n` × (`cid` 34 bytes, `varint count`).
//! - SIndex (Set, Map): `u8 level`, `varint n`, then `n` × (`cid`, `bytes split key`,
//!   `varint count`); the split key is the last key of the child's subtree.
//!
//! Counts are bytes for Blob trees and elements otherwise, so positional look-ups binary
//! search the prefix sums and keyed look-ups binary search the split keys.
//!
//! # Split rules (boundaries depend on content only)
//!
//! - Blob leaves: FastCDC v2020 (normalisation level 1) with `min = target/4`,
//!   `avg = target`, `max = 8 × target` (ForkBase's α = 8). A cut depends only on the bytes
//!   from the previous cut up to the cut (including the byte at it) and on whether at least
//!   two more bytes follow (FastCDC tests candidates in pairs), so an edit at `offset`
//!   re-chunks from the leaf holding byte `offset − 3`.
//! - List / Set / Map leaves end after element `e` when `xxh3_64(key(e))` (List: the
//!   element) falls below `2^64 × size(e) / leaf_target` — a pattern whose probability is
//!   proportional to the element's encoded size, so leaves average about `leaf_target`
//!   bytes — or when the leaf reaches `8 × leaf_target` bytes. A pattern inside an element
//!   thus extends the leaf to the element's end (ForkBase §4.3.2). A Map value edit can
//!   add or remove the boundary after its own entry (the odds depend on the entry's size)
//!   and move size-forced cuts after it, until the boundaries agree again; other pattern
//!   boundaries stay where they were.
//! - Index nodes (ForkBase's P′) end after an entry when the child cid's
//!   [`Hash::low_u64`](cairn_core::Hash::low_u64) falls below `2^64 × size(entry) /
//!   index_target`, or at `8 × index_target` bytes, but never before holding two entries
//!   (which guarantees every level shrinks and the build terminates).
//!
//! Because every boundary depends only on the content since the previous boundary, the
//! tree is a function of its content (history independence), and an edit re-chunks from
//! the first affected node until a new boundary coincides with an old one, then repeats
//! one level up with the replaced nodes — copy-on-write touching O(height) chunks per
//! localised edit.

mod build;
mod cursor;
mod diff;
mod edit;
mod node;
mod read;
mod walk;

use cairn_core::{Decoder, Encoder, Error, Result};
use cairn_store::Cid;

pub use build::{
    BlobWriter, blob_leaf_lengths, build_blob, build_list, build_map, build_set, empty,
};
pub use diff::{
    KeyChange, SeqChange, collect_changes, diff_seq, diff_seq_each, diff_sorted, diff_sorted_each,
};
pub use edit::{blob_splice, list_splice, map_update, set_update};
pub(crate) use node::load as load_chunk;
pub use read::{
    BlobReader, COPY_BLOB_MAX_WORKERS, Element, Iter, blob_read, copy_blob, copy_blob_into,
    copy_blob_workers, iter, list_get, list_range, map_get, map_range, set_contains,
};
pub use walk::{CheckedNode, SharedSubtrees, TreeCheck, child_cids, walk, walk_sharing};

/// Target node sizes of new POS-trees. Changing them changes every boundary, so all
/// versions that should share chunks must use the same configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeConfig {
    /// Average leaf size in bytes (clamped to 64 B ..= 2 MiB). Blob leaves are cut by
    /// FastCDC with min = target/4, avg = target, max = 8 × target.
    pub leaf_target: u32,
    /// Average index node size in bytes (clamped to 64 B ..= 2 MiB); max 8 × target.
    pub index_target: u32,
}

impl TreeConfig {
    /// Smallest node target accepted by [`TreeConfig::with_leaf_target`].
    pub const MIN_TARGET: u32 = node::MIN_TARGET;
    /// Largest node target accepted by [`TreeConfig::with_leaf_target`].
    pub const MAX_TARGET: u32 = node::MAX_TARGET;

    /// This configuration with average leaf size `bytes`; an even number in
    /// [`TreeConfig::MIN_TARGET`] ..= [`TreeConfig::MAX_TARGET`], or an error saying so (a
    /// value outside is refused rather than clamped, so a stored setting means exactly
    /// what it says).
    pub fn with_leaf_target(self, bytes: u64) -> Result<Self> {
        if bytes < Self::MIN_TARGET as u64
            || bytes > Self::MAX_TARGET as u64
            || !bytes.is_multiple_of(2)
        {
            return Err(Error::invalid(format!(
                "leaf size {bytes} must be an even number of bytes from {} to {}",
                Self::MIN_TARGET,
                Self::MAX_TARGET
            )));
        }
        Ok(TreeConfig {
            leaf_target: bytes as u32,
            ..self
        })
    }
}

impl Default for TreeConfig {
    fn default() -> Self {
        TreeConfig {
            leaf_target: 4096,
            index_target: 4096,
        }
    }
}

/// What a POS-tree stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TreeKind {
    /// A byte sequence (UIndex nodes over Blob leaves).
    Blob,
    /// A sequence of byte-string elements (UIndex nodes over List leaves).
    List,
    /// Sorted distinct byte-string keys (SIndex nodes over Set leaves).
    Set,
    /// Sorted distinct keys with values (SIndex nodes over Map leaves).
    Map,
}

impl TreeKind {
    /// True for the key-sorted kinds (Set, Map).
    pub fn is_sorted(self) -> bool {
        matches!(self, TreeKind::Set | TreeKind::Map)
    }

    fn tag(self) -> u8 {
        match self {
            TreeKind::Blob => 4,
            TreeKind::List => 5,
            TreeKind::Set => 6,
            TreeKind::Map => 7,
        }
    }

    fn from_tag(t: u8) -> Result<Self> {
        Ok(match t {
            4 => TreeKind::Blob,
            5 => TreeKind::List,
            6 => TreeKind::Set,
            7 => TreeKind::Map,
            other => return Err(Error::decode(format!("unknown POS-tree kind {other}"))),
        })
    }
}

/// A POS-tree root as an FObject records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TreeRef {
    /// What the tree stores.
    pub kind: TreeKind,
    /// Cid of the root node.
    pub root: Cid,
    /// Bytes (Blob) or elements (List, Set, Map) in the tree.
    pub count: u64,
    /// Level of the root: 0 when the root is a leaf.
    pub height: u8,
}

impl TreeRef {
    /// Appends the canonical encoding: kind byte, root cid, varint count, height byte.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(self.kind.tag())
            .hash(&self.root)
            .varint(self.count)
            .u8(self.height);
    }

    /// Reads what [`TreeRef::encode`] wrote.
    pub fn decode(d: &mut Decoder) -> Result<Self> {
        let kind = TreeKind::from_tag(d.u8()?)?;
        let root = d.hash()?;
        let count = d.varint()?;
        let height = d.u8()?;
        if height > node::MAX_HEIGHT {
            return Err(Error::decode(format!(
                "POS-tree height {height} out of range"
            )));
        }
        Ok(TreeRef {
            kind,
            root,
            count,
            height,
        })
    }

    fn root_entry(&self) -> node::Entry {
        node::Entry {
            cid: self.root,
            count: self.count,
            key: None,
        }
    }
}

/// Fails with [`Error::TypeMismatch`] unless `t` is one of `kinds`.
fn expect_kind(t: &TreeRef, kinds: &[TreeKind], op: &str) -> Result<()> {
    if kinds.contains(&t.kind) {
        Ok(())
    } else {
        Err(Error::TypeMismatch(format!(
            "{op} works on {kinds:?} trees, this one is a {:?}",
            t.kind
        )))
    }
}
