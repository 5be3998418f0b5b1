//! `postree_node` target: POS-tree node decoding through the public surface.
//!
//! The node decoders are `pub(crate)`, so the input is turned into a small chunk store and
//! a [`TreeRef`], and every public reader runs over it. Input layout (canonical codec):
//!
//! ```text
//! u8     flags: bits 0-1 kind (Blob, List, Set, Map), bits 2-3 root height (0..=3)
//! varint count    the TreeRef's unit count
//! varint a        an offset / index argument
//! varint b        a length / end argument
//! bytes  key      a key argument (Set/Map look-ups and ranges)
//! bytes* chunks   up to MAX_CHUNKS length-prefixed chunks; chunk 0 is the root
//! ```
//!
//! Children must be named by their hash, which a fuzzer cannot produce, so a chunk may hold
//! a *placeholder*: the 34 bytes `1e 20 'C' 'I' 'D' j` + 28 arbitrary bytes are replaced by
//! the cid of chunk `j` when `j > i` (chunks are hashed from last to first, so the graph is
//! acyclic). The seed generator turns real trees into this form.

use std::io::{Read, Seek, SeekFrom};
use std::ops::{Bound, ControlFlow};

use cairn_core::{Decoder, Encoder, Error, Result};
use cairn_object::postree::{self, BlobReader, TreeKind, TreeRef};
use cairn_store::{ChunkStore, Cid, MemoryStore};

/// Most chunks taken from one input.
pub const MAX_CHUNKS: usize = 64;
/// Placeholder prefix; the byte after it is the chunk index.
pub const PLACEHOLDER: [u8; 5] = [0x1e, 0x20, b'C', b'I', b'D'];
/// Bytes a placeholder occupies (a whole multihash).
pub const CID_LEN: usize = cairn_core::hash::ENCODED_LEN;
/// Elements or bytes read per operation at most (claimed counts may be astronomically large
/// for a tiny store: unsorted trees may repeat a subtree, legitimately).
const MAX_UNITS: usize = 4096;
const MAX_VISITS: usize = 4096;

/// The kinds in flag order.
pub const KINDS: [TreeKind; 4] = [TreeKind::Blob, TreeKind::List, TreeKind::Set, TreeKind::Map];

/// A parsed input.
pub struct Input<'a> {
    pub kind: TreeKind,
    pub height: u8,
    pub count: u64,
    pub a: u64,
    pub b: u64,
    pub key: &'a [u8],
    pub chunks: Vec<&'a [u8]>,
}

impl<'a> Input<'a> {
    fn parse(data: &'a [u8]) -> Result<Self> {
        let mut d = Decoder::new(data, "fuzz input");
        let flags = d.u8()?;
        let count = d.varint()?;
        let a = d.varint()?;
        let b = d.varint()?;
        let key = d.bytes()?;
        let mut chunks = Vec::new();
        while !d.is_empty() && chunks.len() < MAX_CHUNKS {
            chunks.push(d.bytes()?);
        }
        Ok(Input {
            kind: KINDS[(flags & 3) as usize],
            height: (flags >> 2) & 3,
            count,
            a,
            b,
            key,
            chunks,
        })
    }

    /// Encodes an input (for the seed generator).
    pub fn encode(&self) -> Vec<u8> {
        let k = KINDS.iter().position(|k| *k == self.kind).unwrap() as u8;
        let mut e = Encoder::new();
        e.u8(k | (self.height.min(3) << 2))
            .varint(self.count)
            .varint(self.a)
            .varint(self.b)
            .bytes(self.key);
        for c in &self.chunks {
            e.bytes(c);
        }
        e.finish()
    }
}

/// Replaces placeholders in chunk `i` naming a later chunk by that chunk's cid.
pub fn substitute(chunk: &[u8], i: usize, cids: &[Option<Cid>]) -> Vec<u8> {
    let mut out = chunk.to_vec();
    let mut p = 0;
    while p + CID_LEN <= out.len() {
        if out[p..p + PLACEHOLDER.len()] == PLACEHOLDER {
            let j = out[p + PLACEHOLDER.len()] as usize;
            if j > i
                && let Some(Some(c)) = cids.get(j)
            {
                out[p..p + CID_LEN].copy_from_slice(&c.to_bytes());
                p += CID_LEN;
                continue;
            }
        }
        p += 1;
    }
    out
}

fn check_children(chunk: &[u8]) {
    match postree::child_cids(chunk) {
        Ok(v) => assert!(v.len() * CID_LEN <= chunk.len()),
        Err(Error::Decode(_) | Error::InvalidInput(_) | Error::Corrupt(_)) => {}
        Err(e) => panic!("child_cids: unexpected error kind: {e}"),
    }
}

/// Errors the readers may return on hostile trees.
fn acceptable(r: &Result<impl Sized>) {
    if let Err(e) = r {
        match e {
            Error::Corrupt(_)
            | Error::NotFound(_)
            | Error::Decode(_)
            | Error::InvalidInput(_)
            | Error::TypeMismatch(_) => {}
            other => panic!("unexpected error kind from a POS-tree reader: {other}"),
        }
    }
}

/// The target.
pub fn run(data: &[u8]) {
    check_children(data);
    let _ = TreeRef::decode(&mut Decoder::new(data, "fuzz TreeRef"));
    let Ok(input) = Input::parse(data) else {
        return;
    };
    let store = MemoryStore::new();
    let n = input.chunks.len();
    let mut cids: Vec<Option<Cid>> = vec![None; n];
    for i in (0..n).rev() {
        let bytes = substitute(input.chunks[i], i, &cids);
        check_children(&bytes);
        cids[i] = Some(store.put(&bytes).expect("memory put"));
    }
    let root = cids
        .first()
        .copied()
        .flatten()
        .unwrap_or_else(|| store.algo().digest(b"missing root"));
    let t = TreeRef {
        kind: input.kind,
        root,
        count: input.count,
        height: input.height,
    };
    // A TreeRef survives its own encoding.
    let mut e = Encoder::new();
    t.encode(&mut e);
    let enc = e.finish();
    let mut d = Decoder::new(&enc, "TreeRef");
    assert_eq!(TreeRef::decode(&mut d).unwrap(), t);
    exercise(&store, &t, &input);
}

fn exercise(store: &MemoryStore, t: &TreeRef, input: &Input) {
    let mut visits = 0usize;
    let r = postree::walk(store, t, &mut |cid, bytes| {
        assert!(cid.matches(bytes), "walk handed out unverified bytes");
        visits += 1;
        if visits > MAX_VISITS {
            return Err(Error::invalid("fuzz: visit budget exhausted"));
        }
        Ok(())
    });
    acceptable(&r);
    // `walk` checked the whole structure: every reader must then succeed.
    let valid = r.is_ok();
    let sorted = t.kind.is_sorted();
    let must =
        |ok: bool, what: &str| assert!(!valid || ok, "{what} failed on a tree walk accepted");

    let len = input.b.min(MAX_UNITS as u64);
    match t.kind {
        TreeKind::Blob => {
            let r = postree::blob_read(store, t, input.a, len);
            if let Ok(v) = &r {
                assert!(v.len() as u64 <= len);
                assert!(v.len() as u64 <= t.count.saturating_sub(input.a));
            }
            acceptable(&r);
            if input.a <= t.count {
                must(r.is_ok(), "blob_read");
            }
            let mut reader = BlobReader::range(store, t, input.a, len);
            let total = reader.len();
            let mut buf = [0u8; 97];
            let mut got = 0usize;
            for _ in 0..64 {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(_) => break,
                }
            }
            assert!(got as u64 <= total);
            let _ = reader.seek(SeekFrom::Start(input.b % 4096));
            let _ = reader.read(&mut buf);
            let _ = reader.seek(SeekFrom::End(-(input.a as i64 % 300)));
            let _ = reader.read(&mut buf);
            let _ = reader.seek(SeekFrom::Current(-1));
            let _ = reader.read(&mut buf);
        }
        TreeKind::List => {
            let r = postree::list_get(store, t, input.a);
            acceptable(&r);
            must(
                r.is_ok_and(|v| v.is_some() == (input.a < t.count)),
                "list_get",
            );
            if input.a <= input.b.min(t.count) {
                drain(
                    postree::list_range(store, t, input.a, input.b),
                    valid,
                    false,
                );
            }
            let n = drain(postree::iter(store, t), valid, false);
            must(n == t.count.min(MAX_UNITS as u64), "iter length");
        }
        TreeKind::Set | TreeKind::Map => {
            if t.kind == TreeKind::Set {
                let r = postree::set_contains(store, t, input.key);
                acceptable(&r);
                must(r.is_ok(), "set_contains");
            } else {
                let r = postree::map_get(store, t, input.key);
                acceptable(&r);
                must(r.is_ok(), "map_get");
            }
            let n = drain(postree::iter(store, t), valid, sorted);
            must(n == t.count.min(MAX_UNITS as u64), "iter length");
            let (from, to) = match input.a % 4 {
                0 => (Bound::Included(input.key), Bound::Unbounded),
                1 => (Bound::Excluded(input.key), Bound::Unbounded),
                2 => (Bound::Unbounded, Bound::Included(input.key)),
                _ => (Bound::Unbounded, Bound::Excluded(input.key)),
            };
            drain(postree::map_range(store, t, from, to), valid, sorted);
        }
    }
    diffs(store, t, input, valid);
    let refused = matches!(
        r,
        Err(Error::Corrupt(_) | Error::NotFound(_) | Error::Decode(_))
    );
    stream(store, t, input, valid, refused);
    // Readers of the other kinds must refuse the tree cleanly.
    acceptable(&postree::blob_read(store, t, 0, 16));
    acceptable(&postree::list_get(store, t, 0));
    acceptable(&postree::map_get(store, t, input.key));
    acceptable(&postree::set_contains(store, t, input.key));
}

/// Diffs of the tree: against itself (nothing differs on a valid tree) and against the
/// empty tree of its kind, whole and resumed from the input's key (sorted kinds) or from
/// positions `(a, b)` (sequences). On a valid tree a resumed diff is exactly the tail of
/// the whole one; on any tree nothing panics and errors are of the expected kinds.
fn diffs(store: &MemoryStore, t: &TreeRef, input: &Input, valid: bool) {
    let Ok(empty) = postree::empty(store, t.kind) else {
        return;
    };
    let budget = |n: &mut usize| {
        *n += 1;
        if *n > MAX_UNITS {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    if t.kind.is_sorted() {
        let mut n = 0;
        let r = postree::diff_sorted_each(store, t, t, None, &mut |_| {
            assert!(!valid, "a valid tree differs from itself");
            Ok(budget(&mut n))
        });
        acceptable(&r);
        let collect = |after: Option<&[u8]>| {
            let mut out = Vec::new();
            let mut n = 0;
            let r = postree::diff_sorted_each(store, &empty, t, after, &mut |c| {
                out.push(c.key.to_vec());
                Ok(budget(&mut n))
            });
            acceptable(&r);
            r.map(|()| out)
        };
        let (whole, tail) = (collect(None), collect(Some(input.key)));
        if valid && t.count < MAX_UNITS as u64 {
            let (whole, tail) = (whole.unwrap(), tail.unwrap());
            let want: Vec<Vec<u8>> = whole
                .into_iter()
                .filter(|k| k.as_slice() > input.key)
                .collect();
            assert_eq!(
                tail, want,
                "a diff resumed after a key is not the whole one's tail"
            );
        }
    } else {
        let collect = |from: Option<(u64, u64)>| {
            let mut out = Vec::new();
            let mut n = 0;
            let r = postree::diff_seq_each(store, t, &empty, from, &mut |c| {
                out.push(c);
                Ok(budget(&mut n))
            });
            acceptable(&r);
            r.map(|()| out)
        };
        let _ = collect(Some((input.a, input.b)));
        let mut n = 0;
        let r = postree::diff_seq_each(store, t, t, None, &mut |_| {
            assert!(!valid, "a valid tree differs from itself");
            Ok(budget(&mut n))
        });
        acceptable(&r);
        // Resumed at the end of each region of the whole diff, the rest follows exactly.
        if valid
            && t.count < MAX_UNITS as u64
            && let Ok(whole) = collect(None)
        {
            for (i, c) in whole.iter().enumerate() {
                let rest = collect(Some((c.a_end, c.b_end))).unwrap();
                assert_eq!(&rest[..], &whole[i + 1..], "a resumed diff lost its place");
            }
        }
    }
}

/// Drains up to [`MAX_UNITS`] elements. On a tree `walk` accepted (`valid`), no read may
/// fail and sorted trees yield strictly increasing keys. Returns the elements seen.
fn drain(it: postree::Iter<'_>, valid: bool, sorted: bool) -> u64 {
    let mut prev: Option<Vec<u8>> = None;
    let mut n = 0;
    for r in it.take(MAX_UNITS) {
        acceptable(&r);
        match r {
            Ok(e) => {
                if valid && sorted {
                    if let Some(p) = &prev {
                        assert!(
                            p.as_slice() < e.key.as_ref(),
                            "keys out of order on a valid tree"
                        );
                    }
                    prev = Some(e.key.to_vec());
                }
                n += 1;
            }
            Err(e) => assert!(!valid, "reader failed on a tree walk accepted: {e}"),
        }
    }
    n
}

/// The verified stream of a version holding `t`: a node sends it only when the tree is
/// sound, a client accepts exactly what was sent and rebuilds what the positional readers
/// return, and any flipped byte of the stream is refused.
fn stream(store: &MemoryStore, t: &TreeRef, input: &Input, valid: bool, refused: bool) {
    use cairn_object::stream::{FrameReader, Verified, VersionCheck, send_version};
    use cairn_object::{FObject, Value};
    let object = FObject {
        key: bytes::Bytes::from_static(b"k"),
        value: Value::Tree(*t),
        depth: 0,
        bases: Vec::new(),
        context: bytes::Bytes::new(),
    };
    let uid = object.uid(store.algo());
    let mut wire = Vec::new();
    let mut frames = 0usize;
    let sent = send_version(store, &object, &mut |b| {
        frames += 1;
        if frames > 2 * MAX_VISITS {
            return Err(std::io::Error::other("fuzz: frame budget exhausted"));
        }
        wire.extend_from_slice(&b);
        Ok(())
    });
    let over_budget = frames > 2 * MAX_VISITS;
    if let Err(e) = &sent
        && !over_budget
    {
        match e {
            Error::Corrupt(_) | Error::NotFound(_) | Error::Decode(_) | Error::InvalidInput(_) => {}
            other => panic!("send_version: unexpected error kind: {other}"),
        }
        assert!(!valid, "send_version refused a tree walk accepted: {e}");
    }
    if sent.is_err() {
        return;
    }
    // The node's walk checks what `walk` checks: a tree `walk` refused is not sent whole.
    assert!(!refused, "send_version sent a tree walk refused");
    // What a client makes of it: the whole stream verifies.
    let receive = |wire: &[u8]| -> Result<Vec<Vec<u8>>> {
        let mut r = FrameReader::new(wire);
        let mut check = VersionCheck::new(uid);
        let mut units = Vec::new();
        while let Some(c) = r.next_chunk()? {
            match check.accept(c)? {
                Verified::Bytes(b) => units.push(b.to_vec()),
                Verified::Elements(es) => {
                    for e in es {
                        let mut u = e.key.to_vec();
                        if let Some(v) = e.value {
                            u.push(b'=');
                            u.extend_from_slice(&v);
                        }
                        units.push(u);
                    }
                }
                Verified::Object(_) | Verified::Index => {}
            }
        }
        if !check.is_complete()? {
            return Err(Error::corrupt("incomplete"));
        }
        Ok(units)
    };
    let units = receive(&wire).expect("a client refused what send_version sent");
    if t.count <= MAX_UNITS as u64 {
        match t.kind {
            TreeKind::Blob => {
                let whole = postree::blob_read(store, t, 0, t.count).expect("blob_read");
                assert_eq!(units.concat(), whole, "stream and blob_read differ");
            }
            _ => {
                let mut n = 0usize;
                for (i, el) in postree::iter(store, t).enumerate() {
                    let el = el.expect("iter of a streamed tree");
                    let mut u = el.key.to_vec();
                    if let Some(v) = el.value {
                        u.push(b'=');
                        u.extend_from_slice(&v);
                    }
                    assert_eq!(units.get(i), Some(&u), "stream and iter differ at {i}");
                    n += 1;
                }
                assert_eq!(n, units.len(), "stream and iter lengths differ");
            }
        }
    }
    // Any sequence of the stream's frames (chosen by the key bytes: repeats, drops,
    // reorders) is refused unless it carries exactly the honest content.
    let frames: Vec<&[u8]> = {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= wire.len() {
            let n =
                u32::from_le_bytes([wire[at], wire[at + 1], wire[at + 2], wire[at + 3]]) as usize;
            out.push(&wire[at..at + 4 + n]);
            at += 4 + n;
        }
        out
    };
    if !input.key.is_empty() {
        let mut mixed = Vec::new();
        for &k in input.key.iter().take(256) {
            mixed.extend_from_slice(frames[k as usize % frames.len()]);
        }
        if let Ok(got) = receive(&mixed) {
            assert_eq!(
                got, units,
                "a reordered stream was accepted with other content"
            );
        }
    }
    // One flipped byte anywhere is refused.
    if !wire.is_empty() {
        let at = (input.a as usize) % wire.len();
        let mut bad = wire.clone();
        bad[at] ^= 1 << (input.b % 8);
        assert!(
            receive(&bad).is_err(),
            "a stream with byte {at} flipped was accepted"
        );
    }
}
