//! Chunk framing: every chunk the object layer writes starts with a format byte and a
//! [`ChunkKind`] byte (ForkBase Table 2), so a chunk read back can be checked to be the kind
//! the reader expects before its payload is parsed.

use cairn_core::{Error, Result};

/// Format version of chunk framing.
pub const CHUNK_FORMAT: u8 = 1;
/// Bytes of framing before a chunk's payload.
pub const CHUNK_HEADER_LEN: usize = 2;

/// What a chunk holds (ForkBase Table 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChunkKind {
    /// An encoded FObject (a version); its cid is the version's uid.
    Meta = 1,
    /// Index node of an unsorted POS-tree (Blob, List): child cids with element counts.
    UIndex = 2,
    /// Index node of a sorted POS-tree (Map, Set): child cids with split keys and counts.
    SIndex = 3,
    /// Blob leaf: raw bytes.
    Blob = 4,
    /// List leaf: a sequence of elements.
    List = 5,
    /// Set leaf: sorted, distinct elements.
    Set = 6,
    /// Map leaf: key-value pairs sorted by key, keys distinct.
    Map = 7,
}

impl ChunkKind {
    /// Parses a kind byte.
    pub fn from_byte(b: u8) -> Result<Self> {
        Ok(match b {
            1 => ChunkKind::Meta,
            2 => ChunkKind::UIndex,
            3 => ChunkKind::SIndex,
            4 => ChunkKind::Blob,
            5 => ChunkKind::List,
            6 => ChunkKind::Set,
            7 => ChunkKind::Map,
            other => return Err(Error::decode(format!("unknown chunk kind {other}"))),
        })
    }

    /// The two framing bytes that start a chunk of this kind.
    pub fn header(self) -> [u8; CHUNK_HEADER_LEN] {
        [CHUNK_FORMAT, self as u8]
    }
}

/// Frames `payload` as a chunk of `kind`.
pub fn frame(kind: ChunkKind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHUNK_HEADER_LEN + payload.len());
    v.extend_from_slice(&kind.header());
    v.extend_from_slice(payload);
    v
}

/// Splits a chunk into its kind and payload, checking the format byte.
pub fn parse(chunk: &[u8]) -> Result<(ChunkKind, &[u8])> {
    if chunk.len() < CHUNK_HEADER_LEN {
        return Err(Error::decode("chunk shorter than its 2-byte header"));
    }
    if chunk[0] != CHUNK_FORMAT {
        return Err(Error::decode(format!(
            "unsupported chunk format {} (this build reads {CHUNK_FORMAT})",
            chunk[0]
        )));
    }
    Ok((ChunkKind::from_byte(chunk[1])?, &chunk[CHUNK_HEADER_LEN..]))
}

/// Like [`parse`], but also requires the chunk to be of `expected` kind.
pub fn parse_kind(chunk: &[u8], expected: ChunkKind) -> Result<&[u8]> {
    let (kind, payload) = parse(chunk)?;
    if kind != expected {
        return Err(Error::corrupt(format!(
            "expected a {expected:?} chunk, found {kind:?}"
        )));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_errors() {
        let c = frame(ChunkKind::Map, b"xyz");
        assert_eq!(parse(&c).unwrap(), (ChunkKind::Map, &b"xyz"[..]));
        assert!(parse_kind(&c, ChunkKind::Set).is_err());
        assert!(parse(&[1]).is_err());
        assert!(parse(&[9, 1]).is_err());
        assert!(parse(&[1, 99]).is_err());
    }
}
