//! Content hashes with an algorithm tag.
//!
//! A [`Hash`] is 32 digest bytes plus the [`HashAlgo`] that made them. Its binary form is a
//! multihash (`code`, `0x20`, 32 bytes: 34 bytes in all) and its text form is that multihash
//! in lowercase hex, so `1e20…` is BLAKE3 and `1220…` is SHA-256. BLAKE3 is the default;
//! SHA-256 can be chosen per store for interoperability with systems that require it.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Number of digest bytes in every Cairn hash.
pub const DIGEST_LEN: usize = 32;
/// Length of the binary (multihash) encoding of a [`Hash`].
pub const ENCODED_LEN: usize = DIGEST_LEN + 2;

/// The hash function that produced a digest. The discriminant is its multicodec code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum HashAlgo {
    /// BLAKE3 (multicodec 0x1e), Cairn's default: fast, SIMD-parallel.
    #[default]
    Blake3 = 0x1e,
    /// SHA-256 (multicodec 0x12).
    Sha256 = 0x12,
}

impl HashAlgo {
    /// The multicodec code that tags this algorithm in encodings.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Looks an algorithm up by its multicodec code.
    pub fn from_code(code: u8) -> Result<Self> {
        match code {
            0x1e => Ok(HashAlgo::Blake3),
            0x12 => Ok(HashAlgo::Sha256),
            other => Err(Error::decode(format!(
                "unknown hash algorithm code 0x{other:02x}"
            ))),
        }
    }

    /// Short lowercase name (`blake3`, `sha256`).
    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Blake3 => "blake3",
            HashAlgo::Sha256 => "sha256",
        }
    }

    /// Hashes `data` in one call.
    pub fn digest(self, data: &[u8]) -> Hash {
        let bytes: [u8; DIGEST_LEN] = match self {
            HashAlgo::Blake3 => *blake3::hash(data).as_bytes(),
            HashAlgo::Sha256 => {
                use sha2::Digest;
                sha2::Sha256::digest(data).into()
            }
        };
        Hash::new(self, bytes)
    }

    /// The hash of the concatenation of `parts`, as [`HashAlgo::digest`] of it. Small
    /// inputs (a tag and a name, a Merkle leaf) are joined on the stack and hashed in one
    /// call, without the heap-allocated state an incremental [`Hasher`] needs.
    pub fn digest_parts(self, parts: &[&[u8]]) -> Hash {
        const SMALL: usize = 256;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > SMALL {
            let mut h = self.hasher();
            for p in parts {
                h.update(p);
            }
            return h.finalize();
        }
        let mut buf = [0u8; SMALL];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.digest(&buf[..at])
    }

    /// Hashes each of `msgs`, appending the hashes to `out` in order (the same values as
    /// [`HashAlgo::digest`] on each). One call per batch, so a multi-message hasher from a
    /// well-kept crate can replace the loop without touching callers; Cairn does not ship
    /// its own implementation of a hash function.
    pub fn digest_many(self, msgs: &[&[u8]], out: &mut Vec<Hash>) {
        out.extend(msgs.iter().map(|m| self.digest(m)));
    }

    /// Starts an incremental hash.
    pub fn hasher(self) -> Hasher {
        match self {
            HashAlgo::Blake3 => Hasher::Blake3(Box::default()),
            HashAlgo::Sha256 => Hasher::Sha256(Default::default()),
        }
    }
}

impl FromStr for HashAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "blake3" => Ok(HashAlgo::Blake3),
            "sha256" | "sha-256" | "sha2-256" => Ok(HashAlgo::Sha256),
            other => Err(Error::invalid(format!(
                "unknown hash algorithm {other:?} (expected blake3 or sha256)"
            ))),
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An incremental hasher for either algorithm.
pub enum Hasher {
    /// BLAKE3 state (boxed: it is large).
    Blake3(Box<blake3::Hasher>),
    /// SHA-256 state.
    Sha256(sha2::Sha256),
}

impl Hasher {
    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        match self {
            Hasher::Blake3(h) => {
                h.update(data);
            }
            Hasher::Sha256(h) => sha2::Digest::update(h, data),
        }
        self
    }

    /// Finishes and returns the tagged hash.
    pub fn finalize(self) -> Hash {
        match self {
            Hasher::Blake3(h) => Hash::new(HashAlgo::Blake3, *h.finalize().as_bytes()),
            Hasher::Sha256(h) => Hash::new(HashAlgo::Sha256, sha2::Digest::finalize(h).into()),
        }
    }
}

/// A 32-byte digest tagged with the algorithm that made it. Names chunks (cid) and
/// versions (uid).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash {
    algo: HashAlgo,
    digest: [u8; DIGEST_LEN],
}

impl Hash {
    /// Wraps raw digest bytes made by `algo`.
    pub const fn new(algo: HashAlgo, digest: [u8; DIGEST_LEN]) -> Self {
        Hash { algo, digest }
    }

    /// The algorithm that made this digest.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// The 32 digest bytes.
    pub fn digest(&self) -> &[u8; DIGEST_LEN] {
        &self.digest
    }

    /// The first eight digest bytes as a little-endian integer: uniformly distributed, used
    /// for content-defined split decisions on index nodes (ForkBase's pattern P').
    pub fn low_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.digest[..8]);
        u64::from_le_bytes(b)
    }

    /// True when `data` hashes to this value under this hash's algorithm.
    pub fn matches(&self, data: &[u8]) -> bool {
        self.algo.digest(data) == *self
    }

    /// The 34-byte multihash encoding.
    pub fn to_bytes(&self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        out[0] = self.algo.code();
        out[1] = DIGEST_LEN as u8;
        out[2..].copy_from_slice(&self.digest);
        out
    }

    /// Parses the 34-byte multihash encoding; rejects any other length or tag.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != ENCODED_LEN {
            return Err(Error::decode(format!(
                "hash must be {ENCODED_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        let algo = HashAlgo::from_code(bytes[0])?;
        if bytes[1] as usize != DIGEST_LEN {
            return Err(Error::decode(format!(
                "hash digest length must be {DIGEST_LEN}, got {}",
                bytes[1]
            )));
        }
        let mut digest = [0u8; DIGEST_LEN];
        digest.copy_from_slice(&bytes[2..]);
        Ok(Hash { algo, digest })
    }

    /// Lowercase hex of the multihash encoding (68 characters).
    pub fn to_hex(&self) -> String {
        hex::encode(self.to_bytes())
    }

    /// A short prefix for humans (not unique; never parse it back).
    pub fn short(&self) -> String {
        hex::encode(&self.digest[..6])
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algo, hex::encode(&self.digest[..8]))
    }
}

impl FromStr for Hash {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != ENCODED_LEN * 2 {
            return Err(Error::invalid(format!(
                "a hash (a version id or capsule name) is {} hex characters, got {} ({s:?})",
                ENCODED_LEN * 2,
                s.len()
            )));
        }
        let bytes = hex::decode(s).map_err(|e| Error::invalid(format!("bad hash {s:?}: {e}")))?;
        Hash::from_bytes(&bytes).map_err(|e| Error::invalid(format!("bad hash {s:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // BLAKE3("") and SHA-256("") from their specifications.
        assert_eq!(
            hex::encode(HashAlgo::Blake3.digest(b"").digest()),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(
            hex::encode(HashAlgo::Sha256.digest(b"").digest()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn incremental_matches_one_shot() {
        for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
            let mut h = algo.hasher();
            h.update(b"hello ").update(b"world");
            assert_eq!(h.finalize(), algo.digest(b"hello world"));
        }
    }

    #[test]
    fn digest_parts_matches_one_shot_at_every_size() {
        let data: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
            for len in [0, 1, 33, 255, 256, 257, 600] {
                let whole = algo.digest(&data[..len]);
                let cut = len / 3;
                assert_eq!(algo.digest_parts(&[&data[..len]]), whole);
                assert_eq!(
                    algo.digest_parts(&[&data[..cut], &[], &data[cut..len]]),
                    whole
                );
            }
            assert_eq!(algo.digest_parts(&[]), algo.digest(b""));
        }
    }

    #[test]
    fn text_and_binary_round_trip() {
        let h = HashAlgo::Sha256.digest(b"x");
        assert!(h.to_hex().starts_with("1220"));
        assert_eq!(h.to_hex().parse::<Hash>().unwrap(), h);
        assert_eq!(Hash::from_bytes(&h.to_bytes()).unwrap(), h);
        let b = HashAlgo::Blake3.digest(b"x");
        assert!(b.to_hex().starts_with("1e20"));
        assert_ne!(b, h);
    }

    #[test]
    fn rejects_bad_encodings() {
        assert!(Hash::from_bytes(&[0x1e, 0x20]).is_err());
        let mut bytes = HashAlgo::Blake3.digest(b"x").to_bytes();
        bytes[0] = 0x99;
        assert!(Hash::from_bytes(&bytes).is_err());
        bytes[0] = 0x1e;
        bytes[1] = 0x10;
        assert!(Hash::from_bytes(&bytes).is_err());
        assert!("zz".parse::<Hash>().is_err());
        assert!("g".repeat(68).parse::<Hash>().is_err());
    }
}
