//! FObject (ForkBase Figure 2): one version of one key. Its canonical encoding, framed as a
//! Meta chunk, is hashed to give the version's uid, so the uid commits to the value (inline
//! or by POS-tree root), the key, the depth and every base version: a uid names a version
//! *and its whole derivation history* (ForkBase §3.2, tamper evidence).

use bytes::Bytes;
use cairn_core::{Decoder, Encoder, Error, Hash, HashAlgo, Result};

use crate::chunk::{self, ChunkKind};
use crate::value::{Value, ValueType};

/// A version id: the hash of a version's Meta chunk.
pub type Uid = Hash;

/// Format version of the FObject encoding.
pub const FOBJECT_FORMAT: u8 = 1;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// Longest context (application metadata of a version) accepted, in bytes: it travels in
/// every history listing, so it stays small; larger data belongs in a value.
pub const MAX_CONTEXT_LEN: usize = 4096;

/// Refuses a context longer than [`MAX_CONTEXT_LEN`].
pub fn check_context(context: &[u8]) -> Result<()> {
    if context.len() > MAX_CONTEXT_LEN {
        return Err(Error::invalid(format!(
            "a version's context is {} bytes; at most {MAX_CONTEXT_LEN} are accepted (store \
             larger data as a value)",
            context.len()
        )));
    }
    Ok(())
}

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FObject {
    /// The object's key.
    pub key: Bytes,
    /// The value: inline for primitives, a POS-tree root for chunkable types.
    pub value: Value,
    /// Distance to the first version: 0 for a root, else 1 + the largest base depth.
    pub depth: u64,
    /// The versions this one derives from (none for a first version, two or more for a
    /// merge).
    pub bases: Vec<Uid>,
    /// Application metadata (a commit message, a nonce); part of the hashed bytes.
    pub context: Bytes,
}

impl FObject {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        self.value.value_type()
    }

    /// The canonical encoding (without chunk framing).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(64 + self.key.len() + self.context.len());
        e.u8(FOBJECT_FORMAT);
        e.bytes(&self.key);
        self.value.encode(&mut e);
        e.varint(self.depth);
        e.varint(self.bases.len() as u64);
        for b in &self.bases {
            e.hash(b);
        }
        e.bytes(&self.context);
        e.finish()
    }

    /// The Meta chunk: the framed encoding whose hash is the uid.
    pub fn to_chunk(&self) -> Vec<u8> {
        chunk::frame(ChunkKind::Meta, &self.encode())
    }

    /// [`Value::digest`] of the version's value: what a bucket owner's seal names of it.
    pub fn value_digest(&self, algo: HashAlgo) -> cairn_core::Hash {
        self.value.digest(algo)
    }

    /// The uid this version has under `algo`.
    pub fn uid(&self, algo: HashAlgo) -> Uid {
        algo.digest(&self.to_chunk())
    }

    /// Parses a Meta chunk. Strict: unknown versions, bad fields and trailing bytes are
    /// errors.
    pub fn from_chunk(chunk: &[u8]) -> Result<Self> {
        let payload = chunk::parse_kind(chunk, ChunkKind::Meta)?;
        let mut d = Decoder::new(payload, "FObject");
        d.version(&[FOBJECT_FORMAT])?;
        let key = d.bytes()?;
        if key.len() > MAX_KEY_LEN {
            return Err(Error::decode(format!(
                "FObject key is {} bytes (limit {MAX_KEY_LEN})",
                key.len()
            )));
        }
        let key = Bytes::copy_from_slice(key);
        let value = Value::decode(&mut d)?;
        let depth = d.varint()?;
        let n = d.count(cairn_core::hash::ENCODED_LEN)?;
        let mut bases = Vec::with_capacity(n);
        for _ in 0..n {
            bases.push(d.hash()?);
        }
        let context = Bytes::copy_from_slice(d.bytes()?);
        d.finish()?;
        if depth == 0 && !bases.is_empty() {
            return Err(Error::decode("FObject with bases has depth 0"));
        }
        if depth > 0 && bases.is_empty() {
            return Err(Error::decode("FObject without bases has depth > 0"));
        }
        Ok(FObject {
            key,
            value,
            depth,
            bases,
            context,
        })
    }
}

/// Checks that a key is acceptable: non-empty and at most [`MAX_KEY_LEN`] bytes.
pub fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key must not be empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "key is {} bytes (limit {MAX_KEY_LEN})",
            key.len()
        )));
    }
    Ok(())
}

/// Renders key bytes for messages: as text when UTF-8, else hex.
pub fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("0x{}", hex_lower(key)),
    }
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(|v| Value::String(v.into())),
            any::<i64>().prop_map(Value::Integer),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..5)
                .prop_map(|v| Value::Tuple(v.into_iter().map(Bytes::from).collect())),
        ]
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            key in proptest::collection::vec(any::<u8>(), 1..40),
            value in arb_value(),
            nbases in 0usize..4,
            ctx in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let bases: Vec<Uid> = (0..nbases).map(|i| HashAlgo::Blake3.digest(&[i as u8])).collect();
            let o = FObject {
                key: key.into(),
                value,
                depth: if nbases == 0 { 0 } else { 7 },
                bases,
                context: ctx.into(),
            };
            let chunk = o.to_chunk();
            prop_assert_eq!(FObject::from_chunk(&chunk).unwrap(), o.clone());
            prop_assert_eq!(o.uid(HashAlgo::Blake3), HashAlgo::Blake3.digest(&chunk));
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = FObject::from_chunk(&bytes);
            let mut framed = vec![1u8, 1u8];
            framed.extend_from_slice(&bytes);
            let _ = FObject::from_chunk(&framed);
        }
    }

    #[test]
    fn uid_commits_to_every_field() {
        let base = FObject {
            key: "k".into(),
            value: Value::String("v".into()),
            depth: 1,
            bases: vec![HashAlgo::Blake3.digest(b"p")],
            context: Bytes::new(),
        };
        let u = base.uid(HashAlgo::Blake3);
        let mut o = base.clone();
        o.key = "k2".into();
        assert_ne!(o.uid(HashAlgo::Blake3), u);
        let mut o = base.clone();
        o.value = Value::String("w".into());
        assert_ne!(o.uid(HashAlgo::Blake3), u);
        let mut o = base.clone();
        o.depth = 2;
        assert_ne!(o.uid(HashAlgo::Blake3), u);
        let mut o = base.clone();
        o.bases = vec![HashAlgo::Blake3.digest(b"q")];
        assert_ne!(o.uid(HashAlgo::Blake3), u);
        let mut o = base.clone();
        o.context = "msg".into();
        assert_ne!(o.uid(HashAlgo::Blake3), u);
        assert_ne!(base.uid(HashAlgo::Sha256), u);
    }
}
