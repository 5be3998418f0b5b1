//! The POS-tree a blob upload must come back as. A node answers a put with a uid, and the
//! client prints that uid (and its user may anchor it on a chain): the version it names
//! must hold exactly the bytes sent. POS-trees depend on content and leaf size alone, so
//! the client builds the tree of the bytes it sends, as it sends them, into a store that
//! keeps nothing ([`DigestStore`]), and compares its root with the one the version names.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use bytes::Bytes;
use cairn_core::HashAlgo;
use cairn_object::postree::{BlobWriter, TreeRef, build_blob, build_list};
use cairn_object::{TreeConfig, Value, ValueType};
use cairn_store::DigestStore;

/// Pieces queued ahead of the tree builder (each an upload piece, shared, not copied).
const QUEUE: usize = 8;

/// How a bucket's blobs are chunked: what its node reports (`hash_algo`, `leaf_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeShape {
    /// The hash algorithm naming the bucket's chunks.
    pub algo: HashAlgo,
    /// Tree sizes: the bucket's leaf size, the default index size (only the leaf size is
    /// per bucket).
    pub cfg: TreeConfig,
}

impl TreeShape {
    /// The shape a node's bucket description states (`index_size` defaults to the object
    /// engine's), or `None` when it states none or one this build cannot use. A node that
    /// misstates it can only make a check fail, never pass: the root must still be the
    /// tree of the bytes sent.
    pub fn from_info(info: &serde_json::Value) -> Option<TreeShape> {
        let algo = info.get("hash_algo")?.as_str()?.parse().ok()?;
        let leaf = info.get("leaf_size")?.as_u64()?;
        let mut cfg = TreeConfig::default().with_leaf_target(leaf).ok()?;
        if let Some(n) = info.get("index_size") {
            let n = u32::try_from(n.as_u64()?).ok()?;
            if !(TreeConfig::MIN_TARGET..=TreeConfig::MAX_TARGET).contains(&n) {
                return None;
            }
            cfg.index_target = n;
        }
        Some(TreeShape { algo, cfg })
    }

    /// The tree of `data`, built at once.
    pub fn tree_of(&self, data: &[u8]) -> Result<TreeRef> {
        Ok(build_blob(&DigestStore::new(self.algo), &self.cfg, data)?)
    }
}

/// A tree built on its own thread from the pieces sent to it, in order: a blob's of its
/// bytes ([`TreeDigest::blob`]), a text list's of its lines ([`TreeDigest::list`]).
pub struct TreeDigest {
    thread: JoinHandle<Result<TreeRef>>,
}

impl TreeDigest {
    /// Starts the builder of a blob of `shape`; returns the sender of the pieces (its only
    /// one) and the builder.
    pub fn blob(shape: TreeShape) -> Result<(SyncSender<Bytes>, TreeDigest)> {
        Self::spawn(shape, build)
    }

    /// Starts the builder of a text list of `shape`: its text split into one element per
    /// line as the node splits a streamed list (a last line without its newline is an
    /// element too; empty text is none), so a list of any length is checked in constant
    /// memory, as the node stores it.
    pub fn list(shape: TreeShape) -> Result<(SyncSender<Bytes>, TreeDigest)> {
        Self::spawn(shape, build_list_of_lines)
    }

    fn spawn(
        shape: TreeShape,
        build: fn(TreeShape, Receiver<Bytes>) -> Result<TreeRef>,
    ) -> Result<(SyncSender<Bytes>, TreeDigest)> {
        let (tx, rx) = sync_channel::<Bytes>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("cairn-put-digest".into())
            .spawn(move || build(shape, rx))
            .context("starting the upload's tree builder")?;
        Ok((tx, TreeDigest { thread }))
    }

    /// The tree of every piece sent, once the sender is dropped.
    pub fn finish(self) -> Result<TreeRef> {
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the upload's tree builder panicked"))?
    }
}

/// The pieces received, read as one stream.
struct Pieces {
    rx: Receiver<Bytes>,
    cur: Bytes,
}

impl std::io::Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(b) => self.cur = b,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

fn build_list_of_lines(shape: TreeShape, rx: Receiver<Bytes>) -> Result<TreeRef> {
    // The lines as the node splits a streamed list, each at most as long as it takes one
    // (it refuses a longer one): memory stays bounded whatever the input.
    let text = std::io::BufReader::with_capacity(
        1 << 16,
        Pieces {
            rx,
            cur: Bytes::new(),
        },
    );
    let mut failed = None;
    let lines = cairn_node::native::body::bounded_lines(text, cairn_object::db::MAX_INLINE_BYTES)
        .map_while(|l| l.map_err(|e| failed = Some(e)).ok());
    let tree = build_list(&DigestStore::new(shape.algo), &shape.cfg, lines)?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(tree),
    }
}

fn build(shape: TreeShape, rx: Receiver<Bytes>) -> Result<TreeRef> {
    let store = DigestStore::new(shape.algo);
    let mut w = BlobWriter::new(&store, &shape.cfg);
    for piece in rx {
        w.write_bytes(&piece)?;
    }
    Ok(w.finish()?)
}

/// The value a put of `text` as type `ty` makes in a bucket of `shape` (needed for the
/// tree types), parsed and built as the node does: a blob's tree, a list's tree of its
/// lines, a map's or set's tree of its text form, or the inline value.
pub fn value_of_text(ty: ValueType, text: Vec<u8>, shape: Option<TreeShape>) -> Result<Value> {
    use cairn_object::{NewValue, postree};
    let need_shape = || {
        shape.ok_or_else(|| {
            anyhow::anyhow!(
                "the node does not say how the bucket builds trees (hash_algo, leaf_size)"
            )
        })
    };
    Ok(match ty {
        ValueType::String => Value::String(text.into()),
        ValueType::Blob => Value::Tree(need_shape()?.tree_of(&text)?),
        ValueType::List => {
            let (tx, d) = TreeDigest::list(need_shape()?)?;
            // The builder thread takes the text while this one waits for it.
            let _ = tx.send(Bytes::from(text));
            drop(tx);
            Value::Tree(d.finish()?)
        }
        _ => match crate::format::parse_value(ty, text)? {
            NewValue::Integer(i) => Value::Integer(i),
            NewValue::Tuple(t) => Value::Tuple(t.into_iter().map(Bytes::from).collect()),
            NewValue::Map(m) => {
                let s = need_shape()?;
                Value::Tree(postree::build_map(
                    &DigestStore::new(s.algo),
                    &s.cfg,
                    m.iter(),
                )?)
            }
            NewValue::Set(m) => {
                let s = need_shape()?;
                Value::Tree(postree::build_set(
                    &DigestStore::new(s.algo),
                    &s.cfg,
                    m.iter(),
                )?)
            }
            other => anyhow::bail!(
                "text parsed as a {} is not a {}",
                other.value_type().name(),
                ty.name()
            ),
        },
    })
}

/// The value a put will make, built from its body's bytes as they are read, before the put
/// is sent (to seal it): blobs and lists through a tree builder in constant memory, other
/// types from their text, kept up to `limit` bytes (past it `finish` gives `None`: the
/// node refuses such a text anyway).
pub enum ValueBuilder {
    /// A blob or list: its tree, built on its own thread.
    Tree(Option<SyncSender<Bytes>>, TreeDigest),
    /// Any other type: its text, parsed at the end.
    Text {
        /// The type the text is parsed as.
        ty: ValueType,
        /// The text so far (`None` once past the limit).
        text: Option<Vec<u8>>,
        /// Most bytes kept.
        limit: u64,
        /// The bucket's tree shape (maps and sets).
        shape: Option<TreeShape>,
    },
}

impl ValueBuilder {
    /// A builder of a value of type `ty` in a bucket of `shape`.
    pub fn new(ty: ValueType, shape: Option<TreeShape>, limit: u64) -> Result<Self> {
        let need = || {
            shape.ok_or_else(|| {
                anyhow::anyhow!(
                    "the node does not say how the bucket builds trees (hash_algo, leaf_size)"
                )
            })
        };
        Ok(match ty {
            ValueType::Blob => {
                let (tx, d) = TreeDigest::blob(need()?)?;
                ValueBuilder::Tree(Some(tx), d)
            }
            ValueType::List => {
                let (tx, d) = TreeDigest::list(need()?)?;
                ValueBuilder::Tree(Some(tx), d)
            }
            _ => ValueBuilder::Text {
                ty,
                text: Some(Vec::new()),
                limit,
                shape,
            },
        })
    }

    /// Takes the next bytes of the body.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            ValueBuilder::Tree(tx, _) => {
                // A builder that stopped (a line too long) says why in `finish`.
                if let Some(t) = tx
                    && t.send(Bytes::copy_from_slice(bytes)).is_err()
                {
                    *tx = None;
                }
            }
            ValueBuilder::Text { text, limit, .. } => {
                if let Some(t) = text {
                    if (t.len() + bytes.len()) as u64 > *limit {
                        *text = None;
                    } else {
                        t.extend_from_slice(bytes);
                    }
                }
            }
        }
    }

    /// The value of every byte taken; `None` for a text past the limit.
    pub fn finish(self) -> Result<Option<Value>> {
        match self {
            ValueBuilder::Tree(tx, d) => {
                drop(tx);
                Ok(Some(Value::Tree(d.finish()?)))
            }
            ValueBuilder::Text {
                ty, text, shape, ..
            } => text.map(|t| value_of_text(ty, t, shape)).transpose(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_store::MemoryStore;
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn shape(leaf: u64) -> TreeShape {
        TreeShape {
            algo: HashAlgo::Blake3,
            cfg: TreeConfig::default().with_leaf_target(leaf).unwrap(),
        }
    }

    /// The digest of pieces is the tree a store builds of their bytes, whatever the piece
    /// sizes, and another leaf size gives another root.
    #[test]
    fn digest_matches_the_stored_tree() {
        let mut rng = SmallRng::seed_from_u64(7);
        let data: Vec<u8> = (0..3_000_000).map(|_| rng.random()).collect();
        let stored = build_blob(&MemoryStore::new(), &shape(65536).cfg, &data).unwrap();
        for piece in [1usize, 4096, 100_003, 1 << 20] {
            let (tx, d) = TreeDigest::blob(shape(65536)).unwrap();
            let feeder = std::thread::spawn({
                let data = data.clone();
                move || {
                    for p in data.chunks(piece) {
                        tx.send(Bytes::copy_from_slice(p)).unwrap();
                    }
                }
            });
            feeder.join().unwrap();
            assert_eq!(d.finish().unwrap(), stored, "pieces of {piece}");
        }
        assert_eq!(shape(65536).tree_of(&data).unwrap(), stored);
        assert_ne!(shape(4096).tree_of(&data).unwrap().root, stored.root);
        // Empty input: the empty tree.
        let empty = build_blob(&MemoryStore::new(), &shape(65536).cfg, &[]).unwrap();
        let (tx, d) = TreeDigest::blob(shape(65536)).unwrap();
        drop(tx);
        assert_eq!(d.finish().unwrap(), empty);
    }

    /// A list's digest, from its text in pieces of any size, is the tree of the elements
    /// the text form makes (empty text none, a lone newline one empty element, a last line
    /// without its newline one element).
    #[test]
    fn list_digest_matches_the_text_forms_tree() {
        let mut rng = SmallRng::seed_from_u64(9);
        let mut long = Vec::new();
        for i in 0..40_000u32 {
            long.extend_from_slice(format!("element {i} {}", rng.random::<u16>()).as_bytes());
            long.push(b'\n');
        }
        let texts: [&[u8]; 7] = [b"", b"\n", b"a", b"a\n", b"a\n\nbc\n", b"x\ny", &long];
        for text in texts {
            let cairn_object::NewValue::List(items) =
                cairn_object::NewValue::parse_text(cairn_object::ValueType::List, text.to_vec())
                    .unwrap()
            else {
                unreachable!()
            };
            let want = build_list(&MemoryStore::new(), &shape(4096).cfg, items.iter()).unwrap();
            for piece in [1usize, 7, 65_536] {
                if piece == 1 && text.len() > 100 {
                    continue;
                }
                let (tx, d) = TreeDigest::list(shape(4096)).unwrap();
                for p in text.chunks(piece) {
                    tx.send(Bytes::copy_from_slice(p)).unwrap();
                }
                drop(tx);
                assert_eq!(d.finish().unwrap(), want, "{} bytes in {piece}", text.len());
            }
        }
    }

    #[test]
    fn shape_from_a_bucket_description() {
        let info = serde_json::json!({"hash_algo": "blake3", "leaf_size": 65536});
        assert_eq!(TreeShape::from_info(&info), Some(shape(65536)));
        let info =
            serde_json::json!({"hash_algo": "blake3", "leaf_size": 65536, "index_size": 8192});
        let mut want = shape(65536);
        want.cfg.index_target = 8192;
        assert_eq!(TreeShape::from_info(&info), Some(want));
        for bad in [
            serde_json::json!({"hash_algo": "blake3", "leaf_size": 65536, "index_size": 1}),
            serde_json::json!({"hash_algo": "blake3", "leaf_size": 65536, "index_size": "8192"}),
            serde_json::json!({"leaf_size": 65536}),
            serde_json::json!({"hash_algo": "md5", "leaf_size": 65536}),
            serde_json::json!({"hash_algo": "blake3", "leaf_size": 3}),
            serde_json::json!({"hash_algo": "blake3", "leaf_size": "65536"}),
        ] {
            assert_eq!(TreeShape::from_info(&bad), None, "{bad}");
        }
    }
}
