//! Length-prefixed frames: a `u32` big-endian payload length, then the payload.
//!
//! Readers enforce a maximum payload size chosen by the caller ([`DEFAULT_MAX_FRAME`] by
//! default) and fail with a clear [`Error::Decode`] when a length exceeds it. A reader never
//! allocates from the length field alone: the payload buffer grows only as bytes arrive,
//! so a peer that announces 64 MiB and sends 10 bytes costs 10 bytes.

use std::io::{self, Read, Write};

use cairn_core::{Error, Result};

/// Default largest payload a reader accepts: 64 MiB.
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;
/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

fn too_large(len: u64, max: usize) -> String {
    format!("frame too large: {len} bytes (limit {max})")
}

/// Writes one frame carrying `payload`; refuses a payload over `max` bytes (or over
/// `u32::MAX`) with [`Error::InvalidInput`] before writing anything.
pub fn write_frame(w: &mut impl Write, payload: &[u8], max: usize) -> Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| n as usize <= max)
        .ok_or_else(|| Error::invalid(too_large(payload.len() as u64, max)))?;
    w.write_all(&len.to_be_bytes())
        .and_then(|()| w.write_all(payload))
        .map_err(|e| Error::io("writing a frame", e))
}

/// Reads one frame's payload into `buf` (cleared first). Returns `Ok(false)` when the
/// stream ended cleanly before a new frame, `Ok(true)` when `buf` holds a payload.
///
/// A length over `max` is an [`Error::Decode`]; a stream that ends inside a frame is an
/// [`Error::Io`] of kind `UnexpectedEof`. After an error the stream position is
/// unspecified: drop the connection.
pub fn read_frame(r: &mut impl Read, max: usize, buf: &mut Vec<u8>) -> Result<bool> {
    buf.clear();
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(Error::io(
                    "reading a frame header",
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "peer closed the connection after {got} of {HEADER_LEN} header bytes"
                        ),
                    ),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading a frame header", e)),
        }
    }
    let len = u32::from_be_bytes(header) as u64;
    if len > max as u64 {
        return Err(Error::decode(too_large(len, max)));
    }
    let n = r
        .take(len)
        .read_to_end(buf)
        .map_err(|e| Error::io("reading a frame payload", e))?;
    if (n as u64) < len {
        return Err(Error::io(
            "reading a frame payload",
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("peer closed the connection after {n} of {len} payload bytes"),
            ),
        ));
    }
    Ok(true)
}

/// An incremental, sans-IO frame decoder: feed it bytes as they arrive with
/// [`FrameDecoder::push`] and take whole payloads with [`FrameDecoder::next_frame`].
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max: usize,
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    /// A decoder refusing payloads over `max` bytes.
    pub fn new(max: usize) -> Self {
        FrameDecoder {
            max,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as part of a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole payload, `Ok(None)` while it has not fully arrived. A length over
    /// the limit is an [`Error::Decode`], and stays one on every later call (the stream
    /// cannot be resynchronised).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>> {
        let avail = &self.buf[self.start..];
        let Some(header) = avail.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header) as u64;
        if len > self.max as u64 {
            return Err(Error::decode(too_large(len, self.max)));
        }
        let len = len as usize;
        if avail.len() - HEADER_LEN < len {
            return Ok(None);
        }
        let from = self.start + HEADER_LEN;
        self.start = from + len;
        Ok(Some(&self.buf[from..from + len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            write_frame(&mut out, p, DEFAULT_MAX_FRAME).unwrap();
        }
        out
    }

    #[test]
    fn limits() {
        let mut out = Vec::new();
        let err = write_frame(&mut out, &[0; 11], 10).unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
        assert!(err.to_string().contains("frame too large"), "{err}");
        assert!(out.is_empty(), "nothing written");
        write_frame(&mut out, &[7; 10], 10).unwrap();
        let mut buf = Vec::new();
        let err = read_frame(&mut &out[..], 9, &mut buf).unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err}");
        let mut d = FrameDecoder::new(9);
        d.push(&out);
        assert!(d.next_frame().is_err());
        assert!(d.next_frame().is_err(), "stays failed");
    }

    #[test]
    fn hostile_length_does_not_allocate() {
        // Announces 64 MiB, sends 3 bytes.
        let mut bytes = (DEFAULT_MAX_FRAME as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(b"abc");
        let mut buf = Vec::new();
        let err = read_frame(&mut &bytes[..], DEFAULT_MAX_FRAME, &mut buf).unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof),
            "{err}"
        );
        assert!(buf.capacity() < 1 << 16, "capacity {}", buf.capacity());
    }

    #[test]
    fn clean_and_torn_ends() {
        let mut buf = Vec::new();
        assert!(!read_frame(&mut &[][..], 10, &mut buf).unwrap());
        assert!(read_frame(&mut &[0, 0][..], 10, &mut buf).is_err());
        assert!(read_frame(&mut &[0, 0, 0, 2, 1][..], 10, &mut buf).is_err());
        let mut r = &[0, 0, 0, 0][..];
        assert!(read_frame(&mut r, 10, &mut buf).unwrap());
        assert!(buf.is_empty());
        assert!(!read_frame(&mut r, 10, &mut buf).unwrap());
    }

    proptest! {
        #[test]
        fn round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
                      cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
            let bytes = framed(&payloads);
            // Blocking reader.
            let mut r = &bytes[..];
            let mut buf = Vec::new();
            for p in &payloads {
                prop_assert!(read_frame(&mut r, DEFAULT_MAX_FRAME, &mut buf).unwrap());
                prop_assert_eq!(&buf, p);
            }
            prop_assert!(!read_frame(&mut r, DEFAULT_MAX_FRAME, &mut buf).unwrap());
            // Incremental decoder, fed in arbitrary pieces.
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            points.push(bytes.len());
            points.sort();
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            let mut at = 0;
            for p in points {
                d.push(&bytes[at..p]);
                at = p;
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f.to_vec());
                }
            }
            prop_assert_eq!(got, payloads);
            prop_assert_eq!(d.buffered(), 0);
        }
    }
}
