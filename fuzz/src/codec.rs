//! `codec` target: drives a [`Decoder`] with a read sequence chosen by the input and checks
//! that every successful read consumed exactly the bytes [`Encoder`] writes for the value
//! read (the canonical-encoding rule), that positions only move forward and within bounds,
//! and that nothing panics.

use cairn_core::{Decoder, Encoder};

/// Input layout: `n = data[0]`; the next `n` bytes (or fewer) are op codes; the rest is the
/// buffer the decoder reads.
pub fn run(data: &[u8]) {
    crate::run_hash_parsers(data);
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize).min(rest.len());
    let (ops, buf) = rest.split_at(n);
    crate::run_hash_parsers(buf);
    let mut d = Decoder::new(buf, "fuzz");
    let mut ops = ops.iter().copied();
    while let Some(op) = ops.next() {
        let before = d.position();
        assert_eq!(d.remaining(), buf.len() - before);
        let mut e = Encoder::new();
        let ok = match op % 16 {
            0 => d
                .u8()
                .map(|v| {
                    e.u8(v);
                })
                .is_ok(),
            1 => d
                .bool()
                .map(|v| {
                    e.bool(v);
                })
                .is_ok(),
            2 => d
                .varint()
                .map(|v| {
                    e.varint(v);
                })
                .is_ok(),
            3 => d
                .ivarint()
                .map(|v| {
                    e.ivarint(v);
                })
                .is_ok(),
            4 => {
                let max = ops.next().unwrap_or(0) as usize * 97;
                match d.len(max) {
                    Ok(v) => {
                        assert!(v <= max);
                        e.varint(v as u64);
                        true
                    }
                    Err(_) => false,
                }
            }
            5 => d
                .u64_le()
                .map(|v| {
                    e.u64_le(v);
                })
                .is_ok(),
            6 => {
                let k = ops.next().unwrap_or(0) as usize;
                match d.raw(k) {
                    Ok(s) => {
                        assert_eq!(s.len(), k);
                        e.raw(s);
                        true
                    }
                    Err(_) => false,
                }
            }
            7 => d
                .bytes()
                .map(|v| {
                    e.bytes(v);
                })
                .is_ok(),
            8 => d
                .str()
                .map(|v| {
                    e.bytes(v.as_bytes());
                })
                .is_ok(),
            9 => d
                .hash()
                .map(|v| {
                    e.hash(&v);
                })
                .is_ok(),
            10 => {
                let min = ops.next().unwrap_or(0) as usize;
                let left = d.remaining();
                match d.count(min) {
                    Ok(c) => {
                        assert!(c <= left / min.max(1), "count {c} exceeds the input");
                        e.varint(c as u64);
                        true
                    }
                    Err(_) => false,
                }
            }
            11 => {
                let s = d.rest();
                e.raw(s);
                true
            }
            12 => {
                let supported = [ops.next().unwrap_or(1), 1];
                match d.version(&supported) {
                    Ok(v) => {
                        assert!(supported.contains(&v));
                        e.u8(v);
                        true
                    }
                    Err(_) => false,
                }
            }
            13 => {
                let fin = d.clone().finish();
                assert_eq!(fin.is_ok(), d.is_empty());
                continue;
            }
            14 => {
                // Skip ahead by re-reading from a fresh decoder over the same bytes: the
                // decoder is a pure function of (buffer, position).
                let mut f = Decoder::new(buf, "fuzz");
                if f.raw(before).is_ok() {
                    assert_eq!(f.remaining(), d.remaining());
                }
                continue;
            }
            _ => {
                let _ = format!("{d:?}");
                continue;
            }
        };
        let after = d.position();
        assert!(after >= before && after <= buf.len());
        if ok {
            assert_eq!(
                e.as_slice(),
                &buf[before..after],
                "op {} decoded non-canonical bytes",
                op % 16
            );
        }
    }
    let _ = d.finish();
}
