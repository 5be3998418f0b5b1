//! Value types (ForkBase §3.4): primitive types stored inline in the FObject (String,
//! Integer, Tuple) and chunkable types stored as POS-trees (Blob, List, Map, Set), plus the
//! type operations (Append, Insert, Add, Multiply, splices and batched updates); and the
//! text forms of values that the CLI and the HTTP API share ([`NewValue::parse_text`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use cairn_core::{Decoder, Encoder, Error, Result};

use crate::postree::{TreeKind, TreeRef};

/// The type of a value, as recorded in an FObject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ValueType {
    /// Bytes stored inline.
    String = 1,
    /// A signed 64-bit integer.
    Integer = 2,
    /// A short sequence of byte strings stored inline.
    Tuple = 3,
    /// Bytes stored as a POS-tree (content-defined chunks, deduplicated).
    Blob = 4,
    /// A sequence of elements stored as a POS-tree.
    List = 5,
    /// A sorted key-value map stored as a POS-tree.
    Map = 6,
    /// A sorted set stored as a POS-tree.
    Set = 7,
}

impl ValueType {
    /// Every type, in code order.
    pub const ALL: [ValueType; 7] = [
        ValueType::String,
        ValueType::Integer,
        ValueType::Tuple,
        ValueType::Blob,
        ValueType::List,
        ValueType::Map,
        ValueType::Set,
    ];

    /// Parses the type code byte.
    pub fn from_code(b: u8) -> Result<Self> {
        ValueType::ALL
            .into_iter()
            .find(|t| *t as u8 == b)
            .ok_or_else(|| Error::decode(format!("unknown value type code {b}")))
    }

    /// Lowercase name used by the CLI and the HTTP API.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::String => "string",
            ValueType::Integer => "integer",
            ValueType::Tuple => "tuple",
            ValueType::Blob => "blob",
            ValueType::List => "list",
            ValueType::Map => "map",
            ValueType::Set => "set",
        }
    }

    /// True for types stored as POS-trees.
    pub fn is_chunkable(self) -> bool {
        matches!(
            self,
            ValueType::Blob | ValueType::List | ValueType::Map | ValueType::Set
        )
    }

    /// The POS-tree kind of a chunkable type.
    pub fn tree_kind(self) -> Option<TreeKind> {
        match self {
            ValueType::Blob => Some(TreeKind::Blob),
            ValueType::List => Some(TreeKind::List),
            ValueType::Map => Some(TreeKind::Map),
            ValueType::Set => Some(TreeKind::Set),
            _ => None,
        }
    }

    /// The value type stored as a POS-tree of `kind`.
    pub fn of_tree(kind: TreeKind) -> Self {
        match kind {
            TreeKind::Blob => ValueType::Blob,
            TreeKind::List => ValueType::List,
            TreeKind::Map => ValueType::Map,
            TreeKind::Set => ValueType::Set,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ValueType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ValueType::ALL
            .into_iter()
            .find(|t| t.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown type {s:?} (expected string, integer, tuple, blob, list, map or set)"
                ))
            })
    }
}

/// A stored value: primitives inline, chunkable types by POS-tree root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// String bytes.
    String(Bytes),
    /// Integer.
    Integer(i64),
    /// Tuple elements.
    Tuple(Vec<Bytes>),
    /// Blob, List, Map or Set: the root of its POS-tree.
    Tree(TreeRef),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::String(_) => ValueType::String,
            Value::Integer(_) => ValueType::Integer,
            Value::Tuple(_) => ValueType::Tuple,
            Value::Tree(t) => ValueType::of_tree(t.kind),
        }
    }

    /// The POS-tree root, for chunkable values.
    pub fn tree(&self) -> Option<&TreeRef> {
        match self {
            Value::Tree(t) => Some(t),
            _ => None,
        }
    }

    /// Size in the value's natural unit: bytes for String and Blob, elements for Tuple, List,
    /// Map and Set, 8 for Integer.
    pub fn len(&self) -> u64 {
        match self {
            Value::String(b) => b.len() as u64,
            Value::Integer(_) => 8,
            Value::Tuple(t) => t.len() as u64,
            Value::Tree(t) => t.count,
        }
    }

    /// True when [`Value::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash under `algo` of the value's canonical encoding (its type byte and
    /// payload, as in the FObject): what a bucket owner's seal names of a version's
    /// content. It binds the value alone: inline bytes, or a tree's kind, root and size.
    pub fn digest(&self, algo: cairn_core::HashAlgo) -> cairn_core::Hash {
        let mut e = Encoder::new();
        self.encode(&mut e);
        algo.digest(&e.finish())
    }

    /// Writes the value's type byte and payload.
    pub(crate) fn encode(&self, e: &mut Encoder) {
        e.u8(self.value_type() as u8);
        match self {
            Value::String(b) => {
                e.bytes(b);
            }
            Value::Integer(i) => {
                e.ivarint(*i);
            }
            Value::Tuple(items) => {
                e.varint(items.len() as u64);
                for it in items {
                    e.bytes(it);
                }
            }
            Value::Tree(t) => t.encode(e),
        }
    }

    /// Reads what [`Value::encode`] wrote.
    pub(crate) fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let ty = ValueType::from_code(d.u8()?)?;
        Ok(match ty {
            ValueType::String => Value::String(Bytes::copy_from_slice(d.bytes()?)),
            ValueType::Integer => Value::Integer(d.ivarint()?),
            ValueType::Tuple => {
                // Within the inline limit as a put counts it (4 bytes an element beside its
                // bytes): an element costs 32 bytes in memory even when empty, so a chunk of
                // empty elements must not decode to 32 times its size.
                let n = d.count(1)?;
                let limit = crate::db::MAX_INLINE_BYTES;
                if n > limit / 4 {
                    return Err(Error::decode(format!(
                        "a tuple of {n} elements exceeds the inline limit of {} MiB",
                        limit >> 20
                    )));
                }
                let mut items = Vec::with_capacity(n);
                let mut size = 0usize;
                for _ in 0..n {
                    let b = d.bytes()?;
                    size += b.len() + 4;
                    if size > limit {
                        return Err(Error::decode(format!(
                            "a tuple exceeds the inline limit of {} MiB",
                            limit >> 20
                        )));
                    }
                    items.push(Bytes::copy_from_slice(b));
                }
                Value::Tuple(items)
            }
            _ => {
                let t = TreeRef::decode(d)?;
                if ValueType::of_tree(t.kind) != ty {
                    return Err(Error::decode(format!(
                        "value typed {ty} holds a {:?} tree",
                        t.kind
                    )));
                }
                Value::Tree(t)
            }
        })
    }
}

/// A whole new value for a Put, before it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewValue {
    /// String bytes.
    String(Vec<u8>),
    /// Integer.
    Integer(i64),
    /// Tuple elements.
    Tuple(Vec<Vec<u8>>),
    /// Blob bytes (for large inputs use the streaming put).
    Blob(Vec<u8>),
    /// List elements.
    List(Vec<Vec<u8>>),
    /// Map entries.
    Map(BTreeMap<Vec<u8>, Vec<u8>>),
    /// Set members.
    Set(BTreeSet<Vec<u8>>),
}

impl NewValue {
    /// The type this value will be stored as.
    pub fn value_type(&self) -> ValueType {
        match self {
            NewValue::String(_) => ValueType::String,
            NewValue::Integer(_) => ValueType::Integer,
            NewValue::Tuple(_) => ValueType::Tuple,
            NewValue::Blob(_) => ValueType::Blob,
            NewValue::List(_) => ValueType::List,
            NewValue::Map(_) => ValueType::Map,
            NewValue::Set(_) => ValueType::Set,
        }
    }
}

/// A type operation applied to the head of a branch to make a new version (ForkBase §3.4:
/// Append and Insert for String and Tuple, Add and Multiply for Integer; splices and batched
/// updates for chunkable types, which rewrite only the affected POS-tree path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// String: append bytes. Tuple: append one element.
    Append(Vec<u8>),
    /// String: insert bytes at a byte offset. Tuple: insert one element at an index.
    Insert(u64, Vec<u8>),
    /// Integer: add (checked).
    Add(i64),
    /// Integer: multiply (checked).
    Multiply(i64),
    /// Blob: replace `delete` bytes at `offset` with `insert`.
    BlobSplice {
        /// Byte offset.
        offset: u64,
        /// Bytes removed.
        delete: u64,
        /// Bytes inserted.
        insert: Vec<u8>,
    },
    /// List: replace `delete` elements at `index` with `insert`.
    ListSplice {
        /// Element index.
        index: u64,
        /// Elements removed.
        delete: u64,
        /// Elements inserted.
        insert: Vec<Vec<u8>>,
    },
    /// Map: upsert (`Some`) or delete (`None`) keys.
    MapUpdate(Vec<(Vec<u8>, Option<Vec<u8>>)>),
    /// Set: insert (`true`) or remove (`false`) members.
    SetUpdate(Vec<(Vec<u8>, bool)>),
}

impl Op {
    /// Short name for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Append(_) => "append",
            Op::Insert(..) => "insert",
            Op::Add(_) => "add",
            Op::Multiply(_) => "multiply",
            Op::BlobSplice { .. } => "blob splice",
            Op::ListSplice { .. } => "list splice",
            Op::MapUpdate(_) => "map update",
            Op::SetUpdate(_) => "set update",
        }
    }
}

/// Splits text into lines, dropping one trailing newline (the text form of tuples, lists,
/// sets and maps): empty text has no element, and `"\n"` one empty element, as the text
/// form writes them (it read `"\n"` as no element, so one empty element did not come back).
pub fn text_lines(input: &[u8]) -> Vec<Vec<u8>> {
    if input.is_empty() {
        return Vec::new();
    }
    let input = input.strip_suffix(b"\n").unwrap_or(input);
    input.split(|b| *b == b'\n').map(|l| l.to_vec()).collect()
}

impl NewValue {
    /// Parses the text form of a value of type `ty`, as `cairn put` reads it and the HTTP
    /// API accepts it: string and blob as raw bytes; integer as decimal; tuple, list and
    /// set as one element per line; map as one `key=value` per line (split at the first
    /// `=`; a repeated key is an error).
    pub fn parse_text(ty: ValueType, input: Vec<u8>) -> Result<NewValue> {
        Ok(match ty {
            ValueType::String => NewValue::String(input),
            ValueType::Blob => NewValue::Blob(input),
            ValueType::Integer => {
                let s = std::str::from_utf8(&input)
                    .map_err(|_| Error::invalid("an integer must be decimal text"))?;
                NewValue::Integer(s.trim().parse().map_err(|e| {
                    Error::invalid(format!("{:?} is not a 64-bit integer: {e}", s.trim()))
                })?)
            }
            ValueType::Tuple => NewValue::Tuple(text_lines(&input)),
            ValueType::List => NewValue::List(text_lines(&input)),
            ValueType::Set => {
                NewValue::Set(text_lines(&input).into_iter().collect::<BTreeSet<_>>())
            }
            ValueType::Map => {
                let mut m = BTreeMap::new();
                // A lone newline is an empty map (a map has no empty line to hold).
                let lines = if input == b"\n" {
                    Vec::new()
                } else {
                    text_lines(&input)
                };
                for (i, l) in lines.into_iter().enumerate() {
                    let eq = l.iter().position(|b| *b == b'=').ok_or_else(|| {
                        Error::invalid(format!(
                            "map line {} has no '=' (expected key=value)",
                            i + 1
                        ))
                    })?;
                    if m.insert(l[..eq].to_vec(), l[eq + 1..].to_vec()).is_some() {
                        return Err(Error::invalid(format!(
                            "map line {} repeats key {:?}",
                            i + 1,
                            String::from_utf8_lossy(&l[..eq])
                        )));
                    }
                }
                NewValue::Map(m)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text lines read back what the text form writes: no element is empty text, one
    /// empty element a lone newline (read as no element before), and a map keeps taking a
    /// lone newline as empty.
    #[test]
    fn text_lines_round_trip_empty_elements() {
        assert_eq!(text_lines(b""), Vec::<Vec<u8>>::new());
        assert_eq!(text_lines(b"\n"), vec![Vec::<u8>::new()]);
        assert_eq!(text_lines(b"\n\n"), vec![Vec::<u8>::new(), Vec::new()]);
        assert_eq!(text_lines(b"a\nb"), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(text_lines(b"a\nb\n"), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(
            NewValue::parse_text(ValueType::Tuple, b"\n".to_vec()).unwrap(),
            NewValue::Tuple(vec![Vec::new()])
        );
        assert_eq!(
            NewValue::parse_text(ValueType::Map, b"\n".to_vec()).unwrap(),
            NewValue::Map(BTreeMap::new())
        );
    }

    /// A tuple decodes only within the inline limit a put applies: a chunk of empty
    /// elements (one byte each on the wire, 32 bytes each in memory) is refused before it
    /// is held.
    #[test]
    fn tuples_past_the_inline_limit_do_not_decode() {
        let limit = crate::db::MAX_INLINE_BYTES;
        let encoded = |n: usize, each: &[u8]| {
            let mut e = Encoder::new();
            e.u8(ValueType::Tuple as u8).varint(n as u64);
            for _ in 0..n {
                e.bytes(each);
            }
            e.finish()
        };
        let at = encoded(limit / 4, b"");
        assert!(Value::decode(&mut Decoder::new(&at, "value")).is_ok());
        let over = encoded(limit / 4 + 1, b"");
        let e = Value::decode(&mut Decoder::new(&over, "value")).unwrap_err();
        assert!(e.to_string().contains("inline limit"), "{e}");
        let heavy = encoded(5, &vec![7u8; limit / 4]);
        assert!(Value::decode(&mut Decoder::new(&heavy, "value")).is_err());
    }
}
