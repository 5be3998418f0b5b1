//! Verified streams of versions: how a node sends one version so that a client which
//! trusts nothing but a uid can check every byte before using it (ForkBase's tamper
//! evidence, §3.2, carried over the network).
//!
//! A stream is a sequence of frames, each `u32` little-endian length then that many bytes
//! of one chunk: first the version's Meta chunk (the FObject, whose hash is the uid), then,
//! for a chunkable value, every node of its POS-tree in depth-first pre-order (an index
//! node before its children, children in order; a subtree that occurs twice is sent
//! twice, so the receiver never has to keep content). Nothing follows the last node.
//!
//! [`send_version`] writes a stream from a store; [`VersionCheck`] is the receiving side as
//! a state machine without I/O: it hashes each chunk against the cid its verified parent
//! names (the Meta chunk against the expected uid), checks the tree's structure with
//! [`TreeCheck`], and hands out the value's content only once verified. [`FrameReader`]
//! cuts frames from a byte stream with a size limit.

use std::io::{self, Read};

use bytes::Bytes;
use cairn_core::{Error, Result};
use cairn_store::ChunkStore;

use crate::fobject::{FObject, Uid};
use crate::postree::{CheckedNode, Element, TreeCheck};
use crate::value::Value;

/// Largest chunk a [`FrameReader`] accepts by default (256 MiB). Blob leaves and index
/// nodes stay under 16 MiB; an element leaf holds at least one whole element, so a single
/// huge Map value makes a large leaf.
pub const MAX_FRAME: usize = 256 << 20;

/// Leaves fetched from the store in one request while sending, at most.
const SEND_WINDOW: usize = 64;
/// Bytes (blob trees) or elements (other trees) of leaves fetched in one request, at
/// most (the first leaf whatever its size).
const SEND_WINDOW_UNITS: u64 = 1 << 20;

/// Most POS-tree nodes a [`VersionCheck`] holds waiting to be checked (and most entries of
/// one index node): bounds a client's memory whatever a node sends.
pub const MAX_PENDING: usize = 1 << 21;

/// Most elements of one leaf a [`VersionCheck`] decodes: as many as a Cairn store puts in
/// a leaf, one-byte elements (an empty List element, say) filling a leaf of the largest
/// size (8 × [`crate::postree::TreeConfig::MAX_TARGET`] bytes). Decoded, such a leaf
/// takes about 1 GiB. (It was [`MAX_PENDING`], which leaves of small elements built with
/// large leaf targets pass: such a List could be stored but not fetched.)
pub const MAX_LEAF_ELEMENTS: usize = 8 * crate::postree::TreeConfig::MAX_TARGET as usize;

/// Writes the verified stream of version `(uid, object)` of `store` to `out`, one call of
/// `out` per frame header and per chunk (chunks as the store returned them, not copied).
/// Every chunk is verified by the store as it is read; a missing or damaged chunk stops
/// the stream with that error.
pub fn send_version(
    store: &dyn ChunkStore,
    object: &FObject,
    out: &mut dyn FnMut(Bytes) -> io::Result<()>,
) -> Result<()> {
    send_meta(object, out)?;
    let Value::Tree(t) = &object.value else {
        return Ok(());
    };
    // The same walk the receiver makes; it also checks what this node sends.
    let mut check = TreeCheck::new(t, false);
    let mut window: Vec<Bytes> = Vec::new();
    while let Some(cid) = check.next_cid()? {
        if window.is_empty() {
            // Leaves next to each other are fetched together (a store reads neighbours
            // written together with one request).
            let leaves: Vec<_> = check
                .next_leaves(SEND_WINDOW, SEND_WINDOW_UNITS)
                .into_iter()
                .map(|(cid, _)| cid)
                .collect();
            if leaves.len() > 1 {
                let got = store.get_many(&leaves)?;
                for (cid, c) in leaves.iter().zip(got).rev() {
                    window.push(c.ok_or_else(|| {
                        Error::not_found(format!("POS-tree chunk {cid} is missing from the store"))
                    })?);
                }
            }
        }
        let chunk = match window.pop() {
            Some(c) => c,
            None => crate::postree::load_chunk(store, &cid)?,
        };
        check.check(&chunk)?;
        write_frame(chunk, out)?;
    }
    Ok(())
}

/// Writes the first frame of the verified stream of `object` alone: its Meta chunk (a
/// receiver that wants the version without its content).
pub fn send_meta(object: &FObject, out: &mut dyn FnMut(Bytes) -> io::Result<()>) -> Result<()> {
    write_frame(Bytes::from(object.to_chunk()), out)
}

/// Writes one frame: the chunk's length, then the chunk.
pub fn write_frame(chunk: Bytes, out: &mut dyn FnMut(Bytes) -> io::Result<()>) -> Result<()> {
    let send_err = |e: io::Error| Error::io("sending a version stream", e);
    let len = u32::try_from(chunk.len())
        .map_err(|_| Error::invalid("a chunk too large for a version stream"))?;
    out(Bytes::copy_from_slice(&len.to_le_bytes())).map_err(send_err)?;
    out(chunk).map_err(send_err)
}

/// A piece of a version's content, verified, as [`VersionCheck::accept`] hands it out.
#[derive(Debug)]
pub enum Verified {
    /// The version itself (the Meta chunk, hashed to the expected uid).
    Object(FObject),
    /// An index node: nothing to output.
    Index,
    /// Bytes of a Blob, in order.
    Bytes(Bytes),
    /// Elements of a List, Set or Map, in order.
    Elements(Vec<Element>),
}

/// The receiving side of a verified stream: checks chunks one at a time against the uid
/// the caller trusts.
pub struct VersionCheck {
    expect: Uid,
    tree: Option<TreeCheck>,
    object_seen: bool,
}

impl VersionCheck {
    /// A check of the stream of version `expect`.
    pub fn new(expect: Uid) -> Self {
        VersionCheck {
            expect,
            tree: None,
            object_seen: false,
        }
    }

    /// Checks the next chunk of the stream. The first must be a Meta chunk hashing to the
    /// expected uid; then every POS-tree node in pre-order, each hashing to the cid its
    /// parent names. Anything else is [`Error::Corrupt`] (and the check should be dropped).
    pub fn accept(&mut self, chunk: Bytes) -> Result<Verified> {
        if !self.object_seen {
            let got = self.expect.algo().digest(&chunk);
            if got != self.expect {
                return Err(Error::corrupt(format!(
                    "version {}: the Meta chunk received hashes to {got}",
                    self.expect
                )));
            }
            let object = FObject::from_chunk(&chunk)
                .map_err(|e| Error::corrupt(format!("version {}: {e}", self.expect)))?;
            self.object_seen = true;
            if let Value::Tree(t) = &object.value {
                self.tree = Some(
                    TreeCheck::new(t, false)
                        .with_max_pending(MAX_PENDING)
                        .with_max_leaf_elements(MAX_LEAF_ELEMENTS),
                );
            }
            return Ok(Verified::Object(object));
        }
        let Some(tree) = &mut self.tree else {
            return Err(Error::corrupt(format!(
                "version {}: a chunk arrived after the whole value",
                self.expect
            )));
        };
        Ok(match tree.accept_unverified(&chunk)? {
            CheckedNode::Index => Verified::Index,
            CheckedNode::Blob(b) => Verified::Bytes(b),
            CheckedNode::Elements(e) => Verified::Elements(e),
        })
    }

    /// True once the whole version was received and checked.
    pub fn is_complete(&mut self) -> Result<bool> {
        Ok(self.object_seen
            && match &mut self.tree {
                Some(t) => t.is_complete()?,
                None => true,
            })
    }
}

/// Cuts the frames of a verified stream from a byte stream.
pub struct FrameReader<R> {
    inner: R,
    limit: usize,
}

impl<R: Read> FrameReader<R> {
    /// Frames from `inner`, each at most [`MAX_FRAME`] bytes.
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            limit: MAX_FRAME,
        }
    }

    /// Frames from `inner`, each at most `limit` bytes.
    pub fn with_limit(inner: R, limit: usize) -> Self {
        FrameReader { inner, limit }
    }

    /// Changes the size limit for the frames still to come.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// The next chunk, or `None` at a clean end (no byte of a further frame). A stream cut
    /// inside a frame, or a frame longer than the limit, is an error.
    pub fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < len.len() {
            match self.inner.read(&mut len[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(cut("a frame header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("reading a version stream", e)),
            }
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > self.limit {
            return Err(Error::corrupt(format!(
                "a version stream announces a chunk of {n} bytes (limit {})",
                self.limit
            )));
        }
        // Grown as bytes arrive (not zeroed up front), so a frame header claiming more than
        // the stream holds costs no more memory than the stream sent.
        let mut buf = Vec::with_capacity(n.min(1 << 20));
        (&mut self.inner)
            .take(n as u64)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io("reading a version stream", e))?;
        if buf.len() < n {
            return Err(cut("a chunk"));
        }
        Ok(Some(Bytes::from(buf)))
    }
}

fn cut(what: &str) -> Error {
    Error::corrupt(format!("the version stream ends inside {what}"))
}
