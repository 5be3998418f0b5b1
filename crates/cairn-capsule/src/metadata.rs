//! Capsule metadata and capsule names (DCS §2.2).
//!
//! A capsule is named by the hash of its metadata, so the name commits to the writers'
//! public keys, the description, the creation time and every setting: whoever knows the
//! name can check the metadata a server hands out, and from it every writer signature.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use cairn_core::{Decoder, Encoder, Error, Hash, HashAlgo, PublicKey, Result};

use crate::record::TAG_METADATA;

/// Format version of encoded metadata.
pub const METADATA_VERSION: u8 = 1;
/// Most writer keys one capsule may list.
pub const MAX_WRITERS: usize = 256;
/// Longest encoded metadata (writer keys, description, settings) a capsule is created with
/// or that travels on the wire: every loaded capsule keeps its metadata in memory, and
/// anyone who may create a capsule chooses it, so it is bounded (256 writers take 8.5 KiB).
pub const MAX_METADATA_BYTES: usize = 64 << 10;

/// A capsule's name: the hash of its encoded metadata.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct CapsuleName(pub Hash);

impl CapsuleName {
    /// The underlying hash.
    pub fn hash(&self) -> &Hash {
        &self.0
    }
}

impl fmt::Display for CapsuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for CapsuleName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(CapsuleName(s.parse()?))
    }
}

/// The symmetric cipher that seals record bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BodyCipher {
    /// Bodies are stored as written (public data; integrity still holds).
    Plaintext,
    /// XChaCha20-Poly1305 with a random 24-byte nonce per body and the capsule name as
    /// associated data.
    XChaCha20Poly1305,
    /// AES-256-GCM-SIV (RFC 8452) with a random 12-byte nonce per body and the capsule name
    /// as associated data. The default: nonce-misuse resistant (two bodies sealed under a
    /// repeated nonce reveal only whether they are equal), and with AES instructions
    /// cheaper than XChaCha20-Poly1305 on the small bodies capsules often hold (capsule
    /// reads 10–45% faster in `cairn bench capsule`, `docs/benchmarks.md`).
    #[default]
    Aes256GcmSiv,
}

impl BodyCipher {
    fn code(self) -> u8 {
        match self {
            BodyCipher::Plaintext => 0,
            BodyCipher::XChaCha20Poly1305 => 1,
            BodyCipher::Aes256GcmSiv => 2,
        }
    }

    fn from_code(c: u8) -> Result<Self> {
        match c {
            0 => Ok(BodyCipher::Plaintext),
            1 => Ok(BodyCipher::XChaCha20Poly1305),
            2 => Ok(BodyCipher::Aes256GcmSiv),
            other => Err(Error::decode(format!("unknown body cipher {other}"))),
        }
    }
}

/// Immutable capsule metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapsuleMetadata {
    /// Hash algorithm for record names, bodies and Merkle trees of this capsule.
    pub algo: HashAlgo,
    /// Public keys of the authorized writers, in order (a signature names its writer by
    /// index).
    pub writers: Vec<PublicKey>,
    /// Human-readable description.
    pub description: String,
    /// Creation time, milliseconds since the Unix epoch (as the creator's clock said).
    pub created_ms: u64,
    /// How bodies are sealed.
    pub cipher: BodyCipher,
    /// How readers obtain the body key (free text for the key-distribution service; Cairn
    /// never sees the key).
    pub key_distribution: String,
    /// Other settings, sorted by key (e.g. `consistency = available`).
    pub settings: BTreeMap<String, String>,
}

impl CapsuleMetadata {
    /// Metadata for one writer, with defaults for the rest and the current time.
    pub fn new(algo: HashAlgo, writer: PublicKey, description: impl Into<String>) -> Self {
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        CapsuleMetadata {
            algo,
            writers: vec![writer],
            description: description.into(),
            created_ms,
            cipher: BodyCipher::default(),
            key_distribution: "out of band".into(),
            settings: BTreeMap::new(),
        }
    }

    /// The canonical encoding (its hash is the capsule name).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(128);
        e.raw(&TAG_METADATA).u8(METADATA_VERSION);
        e.u8(self.algo.code());
        e.varint(self.writers.len() as u64);
        for w in &self.writers {
            w.encode(&mut e);
        }
        e.bytes(self.description.as_bytes());
        e.varint(self.created_ms);
        e.u8(self.cipher.code());
        e.bytes(self.key_distribution.as_bytes());
        e.varint(self.settings.len() as u64);
        for (k, v) in &self.settings {
            e.bytes(k.as_bytes()).bytes(v.as_bytes());
        }
        e.finish()
    }

    /// Parses and checks an encoding: known versions, at least one writer, no duplicate
    /// writer, settings strictly sorted, nothing trailing. (Not [`MAX_METADATA_BYTES`]:
    /// creation and the wire refuse more, and a capsule made before the bound stays
    /// readable.)
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "capsule metadata");
        if d.raw(2)? != TAG_METADATA {
            return Err(Error::decode("not capsule metadata (bad tag)"));
        }
        d.version(&[METADATA_VERSION])?;
        let algo = HashAlgo::from_code(d.u8()?)?;
        let n = d.count(33)?;
        if n == 0 || n > MAX_WRITERS {
            return Err(Error::decode(format!(
                "capsule lists {n} writers (1 to {MAX_WRITERS} allowed)"
            )));
        }
        let mut writers = Vec::with_capacity(n);
        for _ in 0..n {
            let w = PublicKey::decode(&mut d)?;
            if writers.contains(&w) {
                return Err(Error::decode(format!("writer {w} listed twice")));
            }
            writers.push(w);
        }
        let description = d.str()?.to_owned();
        let created_ms = d.varint()?;
        let cipher = BodyCipher::from_code(d.u8()?)?;
        let key_distribution = d.str()?.to_owned();
        let ns = d.count(2)?;
        let mut settings = BTreeMap::new();
        let mut last: Option<String> = None;
        for _ in 0..ns {
            let k = d.str()?.to_owned();
            let v = d.str()?.to_owned();
            if last.as_ref().is_some_and(|l| *l >= k) {
                return Err(Error::decode("capsule settings are not strictly sorted"));
            }
            last = Some(k.clone());
            settings.insert(k, v);
        }
        d.finish()?;
        Ok(CapsuleMetadata {
            algo,
            writers,
            description,
            created_ms,
            cipher,
            key_distribution,
            settings,
        })
    }

    /// The capsule name: hash of [`CapsuleMetadata::encode`].
    pub fn name(&self) -> CapsuleName {
        CapsuleName(self.algo.digest(&self.encode()))
    }

    /// Refuses an encoding of `len` bytes past [`MAX_METADATA_BYTES`] (the message; creation
    /// and the wire each make it their error).
    pub fn check_encoded_len(len: usize) -> std::result::Result<(), String> {
        if len > MAX_METADATA_BYTES {
            return Err(format!(
                "capsule metadata of {len} bytes (at most {MAX_METADATA_BYTES})"
            ));
        }
        Ok(())
    }

    /// The index of `key` among the writers.
    pub fn writer_index(&self, key: &PublicKey) -> Option<u32> {
        self.writers.iter().position(|w| w == key).map(|i| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::SigningKey;

    #[test]
    fn round_trip_and_name_binds_everything() {
        let k = SigningKey::from_seed(&[1; 32]).public();
        let mut m = CapsuleMetadata::new(HashAlgo::Blake3, k, "photos");
        m.settings.insert("consistency".into(), "available".into());
        let bytes = m.encode();
        assert_eq!(CapsuleMetadata::decode(&bytes).unwrap(), m);
        let name = m.name();
        let mut m2 = m.clone();
        m2.description.push('!');
        assert_ne!(m2.name(), name);
        let mut m3 = m.clone();
        m3.writers[0] = SigningKey::from_seed(&[2; 32]).public();
        assert_ne!(m3.name(), name);
        // Trailing bytes and truncation are refused.
        let mut long = bytes.clone();
        long.push(0);
        assert!(CapsuleMetadata::decode(&long).is_err());
        assert!(CapsuleMetadata::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
