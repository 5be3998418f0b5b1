//! Canonical binary encoding.
//!
//! Every structure Cairn hashes is written with [`Encoder`] and read back with [`Decoder`].
//! The rules make the encoding canonical (one value, one byte string), which is what lets a
//! hash stand for a value:
//!
//! - a structure starts with a version byte ([`Encoder::versioned`]);
//! - unsigned integers are LEB128 varints, shortest form only (a padded varint is an error);
//! - byte strings and lists are a varint length followed by their contents;
//! - hashes are their 34-byte multihash form;
//! - a decoder must consume every byte ([`Decoder::finish`]): trailing data is an error.
//!
//! Decoding never panics and never allocates more than the input's length, whatever the
//! bytes claim.

use crate::error::{Error, Result};
use crate::hash::{ENCODED_LEN, Hash};

/// Builds a canonical encoding in memory.
#[derive(Default, Debug, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// An encoder with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
        }
    }

    /// An encoder whose first byte is the format `version`.
    pub fn versioned(version: u8) -> Self {
        let mut e = Self::new();
        e.u8(version);
        e
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a boolean as one byte, 0 or 1.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }

    /// Appends an unsigned integer as a shortest-form LEB128 varint.
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return self;
            }
            self.buf.push(byte | 0x80);
        }
    }

    /// Appends a signed integer, zig-zag mapped onto a varint.
    pub fn ivarint(&mut self, v: i64) -> &mut Self {
        self.varint(((v << 1) ^ (v >> 63)) as u64)
    }

    /// Appends a fixed 8-byte little-endian integer.
    pub fn u64_le(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends bytes with no length prefix (the reader must know the length).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends a hash in its 34-byte multihash form.
    pub fn hash(&mut self, h: &Hash) -> &mut Self {
        self.buf.extend_from_slice(&h.to_bytes());
        self
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Borrows the bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// Returns the finished encoding.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads a canonical encoding strictly: every malformed input is an [`Error::Decode`].
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    /// Starts reading `buf`; `what` names the structure in error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Decoder { buf, pos: 0, what }
    }

    /// Reads the version byte and checks it is one of `supported`.
    pub fn version(&mut self, supported: &[u8]) -> Result<u8> {
        let v = self.u8()?;
        if supported.contains(&v) {
            Ok(v)
        } else {
            Err(self.err(format!(
                "unsupported format version {v} (this build reads {supported:?})"
            )))
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::decode(format!("{} at byte {}: {msg}", self.what, self.pos))
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Current read offset.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// True when every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.err("unexpected end of input"))?;
        self.pos += 1;
        Ok(b)
    }

    /// Reads a boolean byte (0 or 1 only).
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("boolean byte must be 0 or 1, got {b}"))),
        }
    }

    /// Reads a shortest-form LEB128 varint of at most 64 bits.
    pub fn varint(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            let low = (b & 0x7f) as u64;
            if shift == 63 && low > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= low << shift;
            if b & 0x80 == 0 {
                if b == 0 && shift > 0 {
                    return Err(self.err("varint is not in shortest form"));
                }
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(self.err("varint longer than 10 bytes"));
            }
        }
    }

    /// Reads a zig-zag signed varint.
    pub fn ivarint(&mut self) -> Result<i64> {
        let u = self.varint()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    /// Reads a varint that must fit in `usize` and be at most `max`.
    pub fn len(&mut self, max: usize) -> Result<usize> {
        let v = self.varint()?;
        if v > max as u64 {
            return Err(self.err(format!("length {v} exceeds limit {max}")));
        }
        Ok(v as usize)
    }

    /// Reads a fixed 8-byte little-endian integer.
    pub fn u64_le(&mut self) -> Result<u64> {
        let b = self.raw(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads exactly `n` raw bytes.
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.err(format!("needs {n} bytes, only {} remain", self.remaining())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len(self.remaining())?;
        self.raw(n)
    }

    /// Reads a length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|e| self.err(format!("invalid UTF-8: {e}")))
    }

    /// Reads a 34-byte multihash.
    pub fn hash(&mut self) -> Result<Hash> {
        let b = self.raw(ENCODED_LEN)?;
        Hash::from_bytes(b).map_err(|e| self.err(e))
    }

    /// Reads a list count, bounded by the bytes left divided by the smallest element size,
    /// so a hostile count cannot make the caller allocate more than the input justifies.
    pub fn count(&mut self, min_elem_len: usize) -> Result<usize> {
        let max = self.remaining() / min_elem_len.max(1);
        self.len(max)
    }

    /// Reads the rest of the input.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// Checks that every byte was consumed.
    pub fn finish(self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(self.err(format!("{} trailing bytes", self.remaining())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashAlgo;
    use proptest::prelude::*;

    #[test]
    fn varint_rejects_padding_and_overflow() {
        assert!(Decoder::new(&[0x80, 0x00], "t").varint().is_err());
        assert!(Decoder::new(&[0xff; 11], "t").varint().is_err());
        let mut e = Encoder::new();
        e.varint(u64::MAX);
        assert_eq!(Decoder::new(e.as_slice(), "t").varint().unwrap(), u64::MAX);
        assert!(
            Decoder::new(
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                "t"
            )
            .varint()
            .is_err()
        );
    }

    #[test]
    fn version_and_trailing_bytes() {
        let mut e = Encoder::versioned(1);
        e.bytes(b"abc");
        let mut bytes = e.finish();
        let mut d = Decoder::new(&bytes, "t");
        assert!(d.version(&[2]).is_err());
        bytes.push(0);
        let mut d = Decoder::new(&bytes, "t");
        d.version(&[1]).unwrap();
        assert_eq!(d.bytes().unwrap(), b"abc");
        assert!(d.finish().is_err());
    }

    #[test]
    fn hostile_lengths_do_not_allocate() {
        let mut e = Encoder::new();
        e.varint(u64::MAX >> 1);
        let b = e.finish();
        assert!(Decoder::new(&b, "t").bytes().is_err());
        assert!(Decoder::new(&b, "t").count(1).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(a in any::<u64>(), i in any::<i64>(), s in proptest::collection::vec(any::<u8>(), 0..300), flag in any::<bool>()) {
            let h = HashAlgo::Blake3.digest(&s);
            let mut e = Encoder::versioned(3);
            e.varint(a).ivarint(i).bytes(&s).bool(flag).hash(&h).u64_le(a);
            let bytes = e.finish();
            let mut d = Decoder::new(&bytes, "t");
            prop_assert_eq!(d.version(&[3]).unwrap(), 3);
            prop_assert_eq!(d.varint().unwrap(), a);
            prop_assert_eq!(d.ivarint().unwrap(), i);
            prop_assert_eq!(d.bytes().unwrap(), &s[..]);
            prop_assert_eq!(d.bool().unwrap(), flag);
            prop_assert_eq!(d.hash().unwrap(), h);
            prop_assert_eq!(d.u64_le().unwrap(), a);
            d.finish().unwrap();
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = Decoder::new(&bytes, "t");
            let _ = d.version(&[1]);
            let _ = d.varint();
            let _ = d.bytes();
            let _ = d.hash();
            let _ = d.str();
        }
    }
}
