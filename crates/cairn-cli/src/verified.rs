//! Versions read from a node, verified against their uid before any byte is used.
//!
//! `cairn --server get` reads the node's verified stream of a version
//! (`GET /v1/buckets/{b}/stream/{key}`, [`cairn_object::stream`]): the Meta chunk must hash
//! to the uid (the one given with `--uid`, else the one the node names as the branch head,
//! which only a trusted uid or a checked proof can vouch for), and every POS-tree node to
//! the cid its already verified parent names, so a node (or anything between it and the
//! client) that changes, drops, adds or reorders a byte of that version is caught before
//! the byte is printed, written to `--out` or decrypted. [`VerifiedValue`]
//! is a [`Read`] of the value in `cairn get`'s text form.

use std::cell::RefCell;
use std::io::{self, Read};
use std::rc::Rc;

use bytes::{Buf, Bytes};
use cairn_core::Error;
use cairn_object::stream::{FrameReader, Verified, VersionCheck};
use cairn_object::{FObject, Uid, ValueType};

use crate::format;

/// Where a [`VerifiedValue`] leaves the error that ended it, for the caller to report
/// with its own kind (a `Read` can only return an `io::Error`).
#[derive(Clone, Default)]
pub struct Failure(Rc<RefCell<Option<Error>>>);

impl Failure {
    /// The verification or transport error that stopped the read, if any.
    pub fn take(&self) -> Option<Error> {
        self.0.borrow_mut().take()
    }

    fn set(&self, e: Error) -> io::Error {
        let io = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        *self.0.borrow_mut() = Some(e);
        io
    }
}

/// A version's value read from a verified stream, in `cairn get`'s text form (blob and
/// string bytes raw; integer in decimal; tuple, list and set one element per line; map
/// `key=value` per line). Only verified content is ever returned by `read`; the end of the
/// value is returned only once the whole tree was checked and nothing follows it.
pub struct VerifiedValue<R> {
    frames: FrameReader<R>,
    check: VersionCheck,
    uid: Uid,
    object: FObject,
    pending: Bytes,
    ended: bool,
    error: Option<String>,
    failure: Failure,
    chunks: u64,
}

impl<R: Read> VerifiedValue<R> {
    /// Reads and checks the Meta chunk of the stream `body` against `uid`; `meta_only`:
    /// the stream holds nothing else (the value is not rendered).
    pub fn open(body: R, uid: Uid, meta_only: bool) -> cairn_core::Result<Self> {
        // The Meta chunk holds at most an inline value; the tree chunks after it may be
        // larger.
        let mut frames = FrameReader::with_limit(body, cairn_object::evidence::MAX_META_FRAME);
        let mut check = VersionCheck::new(uid);
        let first = frames
            .next_chunk()?
            .ok_or_else(|| Error::corrupt(format!("the node sent nothing for version {uid}")))?;
        frames.set_limit(cairn_object::stream::MAX_FRAME);
        let Verified::Object(object) = check.accept(first)? else {
            return Err(Error::corrupt(
                "a version stream must start with its Meta chunk",
            ));
        };
        let mut pending = Vec::new();
        if !meta_only {
            format::write_inline(&object.value, &mut pending)
                .map_err(|e| Error::io("rendering a value", e))?;
        }
        Ok(VerifiedValue {
            frames,
            check,
            uid,
            object,
            pending: Bytes::from(pending),
            ended: false,
            error: None,
            failure: Failure::default(),
            chunks: 1,
        })
    }

    /// The version, verified.
    pub fn object(&self) -> &FObject {
        &self.object
    }

    /// Chunks received and verified so far, the Meta chunk included (a subtree sent twice
    /// counts twice).
    pub fn chunks_checked(&self) -> u64 {
        self.chunks
    }

    /// Where a failed read leaves its error.
    pub fn failure(&self) -> Failure {
        self.failure.clone()
    }

    /// Fills `pending` with the next verified content; `false` at the verified end.
    fn refill(&mut self) -> cairn_core::Result<bool> {
        loop {
            if self.check.is_complete()? {
                if self.frames.next_chunk()?.is_some() {
                    return Err(Error::corrupt(format!(
                        "the node sent more than version {} holds",
                        self.uid
                    )));
                }
                return Ok(false);
            }
            let chunk = self.frames.next_chunk()?.ok_or_else(|| {
                Error::corrupt("the node's version stream ended before the whole value")
            })?;
            let verified = self.check.accept(chunk)?;
            self.chunks += 1;
            match verified {
                Verified::Bytes(b) if !b.is_empty() => {
                    self.pending = b;
                    return Ok(true);
                }
                Verified::Elements(es) if !es.is_empty() => {
                    let ty = self.object.value_type();
                    let mut text = Vec::new();
                    for e in &es {
                        format::write_element(ty, e, &mut text)
                            .map_err(|e| Error::io("rendering a value", e))?;
                    }
                    self.pending = Bytes::from(text);
                    return Ok(true);
                }
                _ => {}
            }
        }
    }

    /// The number of bytes `read` will return in all, when known up front (blobs and
    /// strings).
    pub fn len_hint(&self) -> Option<u64> {
        matches!(
            self.object.value_type(),
            ValueType::Blob | ValueType::String
        )
        .then(|| self.object.value.len())
    }
}

impl<R: Read> Read for VerifiedValue<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pending.is_empty() {
            if let Some(e) = &self.error {
                // Once failed, always failed: never a clean end after an error.
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.clone()));
            }
            if self.ended {
                return Ok(0);
            }
            match self.refill() {
                Ok(true) => {}
                Ok(false) => self.ended = true,
                Err(e) => {
                    self.error = Some(e.to_string());
                    return Err(self.failure.set(e));
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.advance(n);
        Ok(n)
    }
}
