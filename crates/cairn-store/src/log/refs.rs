//! Encoding of ref batches (the payload of commit records) and of the refs snapshot.

use std::collections::BTreeMap;

use cairn_core::{Decoder, Encoder};

use crate::{Bytes, RefUpdate, Result};

/// One decoded update: `(name, Some(value))` sets, `(name, None)` deletes.
pub(crate) type Op = (Bytes, Option<Bytes>);

const OP_SET: u8 = 1;
const OP_DELETE: u8 = 2;
const SNAPSHOT_VERSION: u8 = 2;

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
                ops.push((
                    Bytes::copy_from_slice(name),
                    Some(Bytes::copy_from_slice(value)),
                ));
            }
            RefUpdate::Delete { name } => {
                e.u8(OP_DELETE).bytes(name);
                ops.push((Bytes::copy_from_slice(name), None));
            }
        }
    }
    (e.finish(), ops)
}

/// Decodes the payload of a commit record (`count, (op, name[, value])*`).
pub(crate) fn decode_ops(body: &[u8]) -> Result<Vec<Op>> {
    let mut d = Decoder::new(body, "commit record");
    let ops = decode_ops_from(&mut d)?;
    d.finish()?;
    Ok(ops)
}

fn decode_ops_from(d: &mut Decoder<'_>) -> Result<Vec<Op>> {
    let n = d.count(2)?;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        match d.u8()? {
            OP_SET => {
                let name = Bytes::copy_from_slice(d.bytes()?);
                let value = Bytes::copy_from_slice(d.bytes()?);
                ops.push((name, Some(value)));
            }
            OP_DELETE => ops.push((Bytes::copy_from_slice(d.bytes()?), None)),
            other => {
                return Err(cairn_core::Error::decode(format!("unknown ref op {other}")));
            }
        }
    }
    Ok(ops)
}

/// Applies ops to a refs map.
pub(crate) fn apply(map: &mut BTreeMap<Bytes, Bytes>, ops: impl IntoIterator<Item = Op>) {
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

/// Encodes a snapshot body: version, last seq, count, `(name, value)*`.
pub(crate) fn snapshot_body(seq: u64, map: &BTreeMap<Bytes, Bytes>) -> Vec<u8> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut e = Encoder::with_capacity(size + 32);
    e.u8(SNAPSHOT_VERSION).varint(seq).varint(map.len() as u64);
    for (k, v) in map {
        e.bytes(k).bytes(v);
    }
    e.finish()
}

/// A decoded snapshot.
pub(crate) struct Snapshot {
    pub seq: u64,
    pub map: BTreeMap<Bytes, Bytes>,
}

/// Decodes a snapshot body.
pub(crate) fn decode_snapshot(body: &[u8]) -> Result<Snapshot> {
    let mut d = Decoder::new(body, "refs snapshot");
    d.version(&[SNAPSHOT_VERSION])?;
    let seq = d.varint()?;
    let n = d.count(2)?;
    let mut map = BTreeMap::new();
    for _ in 0..n {
        let k = Bytes::copy_from_slice(d.bytes()?);
        let v = Bytes::copy_from_slice(d.bytes()?);
        map.insert(k, v);
    }
    d.finish()?;
    Ok(Snapshot { seq, map })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip() {
        let ups = vec![
            RefUpdate::Set {
                name: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            RefUpdate::Delete {
                name: b"b".to_vec(),
            },
        ];
        let (mut bytes, ops) = encode_ops(&ups);
        assert_eq!(decode_ops(&bytes).unwrap(), ops);
        bytes.push(0);
        assert!(decode_ops(&bytes).is_err());
    }

    #[test]
    fn snapshot_round_trip() {
        let mut m = BTreeMap::new();
        m.insert(Bytes::from_static(b"x"), Bytes::from_static(b"y"));
        m.insert(Bytes::from_static(b""), Bytes::from_static(b""));
        let s = decode_snapshot(&snapshot_body(5, &m)).unwrap();
        assert_eq!((s.seq, s.map), (5, m));
    }
}
