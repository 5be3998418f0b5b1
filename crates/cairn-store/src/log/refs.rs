//! Encoding of ref batches (refs log records) and of the refs snapshot.

use std::collections::BTreeMap;

use cairn_core::{Decoder, Encoder};

use crate::{Bytes, RefUpdate, Result};

/// One decoded update: `(name, Some(value))` sets, `(name, None)` deletes.
pub(crate) type Op = (Vec<u8>, Option<Bytes>);

/// A position in the segment stream: everything before it was on stable storage when the
/// record carrying it was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Watermark {
    pub seg: u32,
    pub off: u64,
}

const OP_SET: u8 = 1;
const OP_DELETE: u8 = 2;
const RECORD_VERSION: u8 = 1;
const SNAPSHOT_VERSION: u8 = 1;

/// Encodes a batch's updates (`count, (op, name[, value])*`) and converts them to [`Op`]s.
pub(crate) fn encode_ops(updates: &[RefUpdate]) -> (Vec<u8>, Vec<Op>) {
    let size: usize = updates
        .iter()
        .map(|u| match u {
            RefUpdate::Set { name, value } => name.len() + value.len() + 11,
            RefUpdate::Delete { name } => name.len() + 6,
        })
        .sum();
    let mut e = Encoder::with_capacity(size + 5);
    let mut ops = Vec::with_capacity(updates.len());
    e.varint(updates.len() as u64);
    for u in updates {
        match u {
            RefUpdate::Set { name, value } => {
                e.u8(OP_SET).bytes(name).bytes(value);
                ops.push((name.clone(), Some(Bytes::copy_from_slice(value))));
            }
            RefUpdate::Delete { name } => {
                e.u8(OP_DELETE).bytes(name);
                ops.push((name.clone(), None));
            }
        }
    }
    (e.finish(), ops)
}

/// The part of a record the group-commit leader writes in front of the ops.
pub(crate) fn record_prefix(seq: u64, wm: Watermark) -> Vec<u8> {
    let mut e = Encoder::versioned(RECORD_VERSION);
    e.varint(seq).varint(wm.seg as u64).varint(wm.off);
    e.finish()
}

/// A decoded refs log record.
pub(crate) struct Record {
    pub seq: u64,
    pub wm: Watermark,
    pub ops: Vec<Op>,
    /// Offset of the record's frame in the refs log.
    pub off: u64,
}

fn decode_watermark(d: &mut Decoder<'_>) -> Result<Watermark> {
    let seg = d.varint()?;
    let off = d.varint()?;
    let seg = u32::try_from(seg).map_err(|_| cairn_core::Error::decode("segment id too big"))?;
    Ok(Watermark { seg, off })
}

fn decode_ops(d: &mut Decoder<'_>) -> Result<Vec<Op>> {
    let n = d.count(2)?;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        match d.u8()? {
            OP_SET => {
                let name = d.bytes()?.to_vec();
                let value = Bytes::copy_from_slice(d.bytes()?);
                ops.push((name, Some(value)));
            }
            OP_DELETE => ops.push((d.bytes()?.to_vec(), None)),
            other => {
                return Err(cairn_core::Error::decode(format!("unknown ref op {other}")));
            }
        }
    }
    Ok(ops)
}

/// Decodes a record body (a frame that passed its checksum).
pub(crate) fn decode_record(body: &[u8], off: u64) -> Result<Record> {
    let mut d = Decoder::new(body, "refs log record");
    d.version(&[RECORD_VERSION])?;
    let seq = d.varint()?;
    let wm = decode_watermark(&mut d)?;
    let ops = decode_ops(&mut d)?;
    d.finish()?;
    Ok(Record { seq, wm, ops, off })
}

/// Applies ops to a refs map.
pub(crate) fn apply(map: &mut BTreeMap<Vec<u8>, Bytes>, ops: impl IntoIterator<Item = Op>) {
    for (name, value) in ops {
        match value {
            Some(v) => {
                map.insert(name, v);
            }
            None => {
                map.remove(&name);
            }
        }
    }
}

/// Encodes a snapshot body: version, last seq, watermark, count, `(name, value)*`.
pub(crate) fn snapshot_body(seq: u64, wm: Watermark, map: &BTreeMap<Vec<u8>, Bytes>) -> Vec<u8> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut e = Encoder::with_capacity(size + 32);
    e.u8(SNAPSHOT_VERSION)
        .varint(seq)
        .varint(wm.seg as u64)
        .varint(wm.off)
        .varint(map.len() as u64);
    for (k, v) in map {
        e.bytes(k).bytes(v);
    }
    e.finish()
}

/// A decoded snapshot.
pub(crate) struct Snapshot {
    pub seq: u64,
    pub wm: Watermark,
    pub map: BTreeMap<Vec<u8>, Bytes>,
}

/// Decodes a snapshot body.
pub(crate) fn decode_snapshot(body: &[u8]) -> Result<Snapshot> {
    let mut d = Decoder::new(body, "refs snapshot");
    d.version(&[SNAPSHOT_VERSION])?;
    let seq = d.varint()?;
    let wm = decode_watermark(&mut d)?;
    let n = d.count(2)?;
    let mut map = BTreeMap::new();
    for _ in 0..n {
        let k = d.bytes()?.to_vec();
        let v = Bytes::copy_from_slice(d.bytes()?);
        map.insert(k, v);
    }
    d.finish()?;
    Ok(Snapshot { seq, wm, map })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip() {
        let ups = vec![
            RefUpdate::Set {
                name: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            RefUpdate::Delete {
                name: b"b".to_vec(),
            },
        ];
        let (bytes, ops) = encode_ops(&ups);
        let wm = Watermark { seg: 3, off: 99 };
        let mut body = record_prefix(7, wm);
        body.extend_from_slice(&bytes);
        let r = decode_record(&body, 16).unwrap();
        assert_eq!(r.seq, 7);
        assert_eq!(r.wm, wm);
        assert_eq!(r.ops, ops);
        body.push(0);
        assert!(decode_record(&body, 16).is_err());
    }

    #[test]
    fn snapshot_round_trip() {
        let mut m = BTreeMap::new();
        m.insert(b"x".to_vec(), Bytes::from_static(b"y"));
        m.insert(b"".to_vec(), Bytes::from_static(b""));
        let wm = Watermark { seg: 1, off: 16 };
        let s = decode_snapshot(&snapshot_body(5, wm, &m)).unwrap();
        assert_eq!((s.seq, s.wm, s.map), (5, wm, m));
    }
}
