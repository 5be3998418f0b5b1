//! `evidence` target: the client side of checkable Diff and LCA
//! (`cairn_object::evidence`) over hostile chunks, and the node side's completeness.
//!
//! Input layout (canonical codec):
//!
//! ```text
//! u8     flags: bit 0 the query (0 diff, 1 LCA), bits 1-4 the diff page size - 1
//! bytes  key      the key both versions must belong to
//! bytes  cursor   a diff cursor token (`k<hex>` or `r<a>-<b>`); empty or unparsable: none
//! bytes* chunks   up to MAX_CHUNKS length-prefixed chunks, placeholders as in `postree`;
//!                 chunk 0 is version `a`'s Meta chunk, chunk 1 version `b`'s (`a` when
//!                 there is one chunk)
//! ```
//!
//! Properties: the checks never panic and fail only with `Rejected`; and whatever the
//! node side records while answering (`diff_page_evidence`, `lca_evidence`) is enough for
//! the check to reach the node's own answer (nothing a query reads goes unrecorded).

use cairn_core::{Decoder, Encoder, Error, Result};
use cairn_object::evidence::{
    StreamedChunks, check_diff_page, check_lca, diff_page_evidence, lca_evidence,
};
use cairn_object::history::{diff_page_in, lca_in};
use cairn_object::{DiffCursor, Uid};
use cairn_store::{ChunkStore, Cid, MemoryStore};

use crate::postree::substitute;

/// Most chunks taken from one input.
pub const MAX_CHUNKS: usize = 64;
/// Bytes of chunks the node side may record per answer here.
const BUDGET: u64 = 1 << 20;

/// A parsed input.
pub struct Input<'a> {
    /// True for an LCA, false for a diff page.
    pub lca: bool,
    /// Diff page size (1 to 16).
    pub limit: usize,
    /// The key.
    pub key: &'a [u8],
    /// A diff cursor token.
    pub cursor: &'a [u8],
    /// The chunks, placeholders unresolved.
    pub chunks: Vec<&'a [u8]>,
}

impl<'a> Input<'a> {
    fn parse(data: &'a [u8]) -> Result<Self> {
        let mut d = Decoder::new(data, "fuzz input");
        let flags = d.u8()?;
        let key = d.bytes()?;
        let cursor = d.bytes()?;
        let mut chunks = Vec::new();
        while !d.is_empty() && chunks.len() < MAX_CHUNKS {
            chunks.push(d.bytes()?);
        }
        Ok(Input {
            lca: flags & 1 == 1,
            limit: 1 + ((flags >> 1) & 15) as usize,
            key,
            cursor,
            chunks,
        })
    }

    /// Encodes an input (for the seed generator).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u8(u8::from(self.lca) | (((self.limit.clamp(1, 16) - 1) as u8) << 1))
            .bytes(self.key)
            .bytes(self.cursor);
        for c in &self.chunks {
            e.bytes(c);
        }
        e.finish()
    }
}

fn rejected_only<T>(r: &Result<T>, what: &str) {
    if let Err(e) = r {
        assert!(matches!(e, Error::Rejected(_)), "{what}: {e}");
    }
}

fn replay(chunks: &[bytes::Bytes]) -> MemoryStore {
    let m = MemoryStore::new();
    for c in chunks {
        m.put(c).expect("memory put");
    }
    m
}

/// The chunks of an input, placeholders resolved, and the uids of chunks 0 and 1.
fn resolve(input: &Input) -> Option<(MemoryStore, Uid, Uid)> {
    if input.chunks.is_empty() {
        return None;
    }
    let store = MemoryStore::new();
    let n = input.chunks.len();
    let mut cids: Vec<Option<Cid>> = vec![None; n];
    for i in (0..n).rev() {
        let bytes = substitute(input.chunks[i], i, &cids);
        cids[i] = Some(store.put(&bytes).expect("memory put"));
    }
    let a: Uid = cids[0]?;
    let b: Uid = cids.get(1).copied().flatten().unwrap_or(a);
    Some((store, a, b))
}

/// True when the input's check succeeds (for the seed generator: its seeds must reach the
/// end of a real query, not fail on the first chunk).
pub fn checks_out(data: &[u8]) -> bool {
    let Ok(input) = Input::parse(data) else {
        return false;
    };
    let Some((store, a, b)) = resolve(&input) else {
        return false;
    };
    match input.lca {
        true => check_lca(&store, input.key, &a, &b).is_ok_and(|l| l.is_some()),
        false => check_diff_page(&store, input.key, &a, &b, None, input.limit).is_ok(),
    }
}

/// The target.
pub fn run(data: &[u8]) {
    let Ok(input) = Input::parse(data) else {
        return;
    };
    let Some((store, a, b)) = resolve(&input) else {
        return;
    };
    let key = input.key;
    if input.lca {
        rejected_only(&check_lca(&store, key, &a, &b), "check_lca");
        let direct = lca_in(&store, key, &a, &b).ok();
        let mut sent = Vec::new();
        let mut bytes = 0u64;
        let node = lca_evidence(&store, key, &a, &b, |c| {
            bytes += c.len() as u64;
            if bytes > BUDGET {
                return Err(Error::invalid("fuzz: answer budget"));
            }
            sent.push(c);
            Ok(())
        });
        if node.is_ok() {
            let mut framed = Vec::new();
            for c in &sent {
                cairn_object::stream::write_frame(c.clone(), &mut |p| {
                    framed.extend_from_slice(&p);
                    Ok(())
                })
                .expect("framing");
            }
            let streamed = StreamedChunks::new(std::io::Cursor::new(framed), store.algo());
            let again = check_lca(&streamed, key, &a, &b);
            assert_eq!(again.ok(), direct, "the streamed chunks give another LCA");
            let again = check_lca(&replay(&sent), key, &a, &b);
            assert_eq!(again.ok(), direct, "the recorded chunks give another LCA");
        }
        return;
    }
    let cursor = std::str::from_utf8(input.cursor)
        .ok()
        .and_then(|t| DiffCursor::parse(t).ok());
    let limit = input.limit;
    rejected_only(
        &check_diff_page(&store, key, &a, &b, cursor.as_ref(), limit),
        "check_diff_page",
    );
    if let Ok((sent, used)) =
        diff_page_evidence(&store, key, &a, &b, cursor.as_ref(), limit, BUDGET)
    {
        assert!((1..=limit).contains(&used));
        let from_node = (|| {
            let va = cairn_object::history::load_version(&store, key, &a)?;
            let vb = cairn_object::history::load_version(&store, key, &b)?;
            diff_page_in(&store, &va.value, &vb.value, cursor.as_ref(), used)
        })()
        .expect("the node side answered");
        let checked = check_diff_page(&replay(&sent), key, &a, &b, cursor.as_ref(), used)
            .expect("the recorded chunks suffice");
        assert_eq!(checked, from_node, "the recorded chunks give another page");
    }
}
