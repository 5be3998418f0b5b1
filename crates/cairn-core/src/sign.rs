//! Signing keys, public keys and signatures (Ed25519, via `ed25519-dalek`).
//!
//! Capsule writers sign record names with these keys and servers sign acknowledgments and
//! checkpoints. Every signature covers a *domain tag* as well as the message
//! ([`SigningKey::sign`]), so a signature made for one purpose (say, an ack) can never be
//! replayed as another (a record signature). Verification is `verify_strict`: small-order
//! keys and non-canonical signatures are refused.
//!
//! Encodings carry an algorithm byte ([`SIG_ALGO_ED25519`]) so another scheme can be added
//! without ambiguity. Text form of a public key: `ed25519:` followed by 64 hex digits.

use std::fmt;
use std::str::FromStr;

use ed25519_dalek::Signer;

use crate::codec::{Decoder, Encoder};
use crate::error::{Error, Result};

/// Algorithm byte for Ed25519 in key and signature encodings.
pub const SIG_ALGO_ED25519: u8 = 1;
/// Bytes in an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Bytes in an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

/// A private signing key. Its bytes are wiped when it is dropped (`zeroize`).
#[derive(Clone)]
pub struct SigningKey(ed25519_dalek::SigningKey);

impl SigningKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<Self> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| Error::Unavailable(format!("no randomness for a new key: {e}")))?;
        let key = Self::from_seed(&seed);
        seed.fill(0);
        Ok(key)
    }

    /// The key whose 32-byte secret seed is `seed` (deterministic: tests, key files).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        SigningKey(ed25519_dalek::SigningKey::from_bytes(seed))
    }

    /// The secret seed, for writing to a key file.
    pub fn seed(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `msg` under `domain`: the signed bytes are `len(domain) ‖ domain ‖ msg`.
    pub fn sign(&self, domain: &[u8], msg: &[u8]) -> Signature {
        Signature(self.0.sign(&domain_message(domain, msg)))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.public())
    }
}

/// A public key that verifies [`Signature`]s.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl PublicKey {
    /// Parses the 32 raw key bytes; refuses bytes that are not a valid curve point.
    pub fn from_raw(bytes: &[u8]) -> Result<Self> {
        let arr: [u8; PUBLIC_KEY_LEN] = bytes
            .try_into()
            .map_err(|_| Error::decode(format!("public key is {} bytes, not 32", bytes.len())))?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&arr)
            .map_err(|_| Error::decode("public key is not a valid Ed25519 point"))?;
        if key.is_weak() {
            return Err(Error::decode("public key has small order"));
        }
        // Refuse non-canonical encodings (y >= p): one key, one byte string.
        if curve25519_canonical(&arr).is_none() {
            return Err(Error::decode("public key is not canonically encoded"));
        }
        Ok(PublicKey(key))
    }

    /// The 32 raw key bytes.
    pub fn raw(&self) -> &[u8; PUBLIC_KEY_LEN] {
        self.0.as_bytes()
    }

    /// Checks `sig` over `domain` and `msg` (see [`SigningKey::sign`]).
    pub fn verify(&self, domain: &[u8], msg: &[u8], sig: &Signature) -> Result<()> {
        self.0
            .verify_strict(&domain_message(domain, msg), &sig.0)
            .map_err(|_| Error::Rejected(format!("signature does not verify under key {self}")))
    }

    /// Appends the canonical encoding: algorithm byte, then the 32 key bytes.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(SIG_ALGO_ED25519).raw(self.raw());
    }

    /// Reads what [`PublicKey::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let algo = d.u8()?;
        if algo != SIG_ALGO_ED25519 {
            return Err(Error::decode(format!("unknown signature algorithm {algo}")));
        }
        Self::from_raw(d.raw(PUBLIC_KEY_LEN)?)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519:{}", hex::encode(self.raw()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for PublicKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let hexpart = s.strip_prefix("ed25519:").ok_or_else(|| {
            Error::invalid(format!("public key {s:?} does not start with \"ed25519:\""))
        })?;
        let raw = hex::decode(hexpart)
            .map_err(|e| Error::invalid(format!("public key {s:?} is not hex: {e}")))?;
        Self::from_raw(&raw).map_err(|e| Error::invalid(format!("public key {s:?}: {e}")))
    }
}

/// An Ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(ed25519_dalek::Signature);

impl Signature {
    /// Parses the 64 raw signature bytes. (Whether they verify is checked later.)
    pub fn from_raw(bytes: &[u8]) -> Result<Self> {
        let arr: [u8; SIGNATURE_LEN] = bytes
            .try_into()
            .map_err(|_| Error::decode(format!("signature is {} bytes, not 64", bytes.len())))?;
        Ok(Signature(ed25519_dalek::Signature::from_bytes(&arr)))
    }

    /// The 64 raw signature bytes.
    pub fn raw(&self) -> [u8; SIGNATURE_LEN] {
        self.0.to_bytes()
    }

    /// Appends the canonical encoding: algorithm byte, then the 64 signature bytes.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(SIG_ALGO_ED25519).raw(&self.raw());
    }

    /// Reads what [`Signature::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let algo = d.u8()?;
        if algo != SIG_ALGO_ED25519 {
            return Err(Error::decode(format!("unknown signature algorithm {algo}")));
        }
        Self::from_raw(d.raw(SIGNATURE_LEN)?)
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", &hex::encode(self.raw())[..16])
    }
}

/// The point's canonical re-encoding equals `bytes`, or `None`.
fn curve25519_canonical(bytes: &[u8; 32]) -> Option<()> {
    let p = ed25519_dalek::VerifyingKey::from_bytes(bytes).ok()?;
    (p.to_edwards().compress().to_bytes() == *bytes).then_some(())
}

/// The bytes actually signed: a length-prefixed domain tag, then the message.
fn domain_message(domain: &[u8], msg: &[u8]) -> Vec<u8> {
    // Domains are short constants; a length byte keeps "ab"+"c" apart from "a"+"bc". A
    // longer domain is a programming error: cut to 255 bytes, its tail would pass for
    // the start of the message.
    assert!(
        domain.len() <= 255,
        "signing domains are at most 255 bytes ({} given)",
        domain.len()
    );
    let mut v = Vec::with_capacity(1 + domain.len() + msg.len());
    v.push(domain.len() as u8);
    v.extend_from_slice(domain);
    v.extend_from_slice(msg);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_domain_separation() {
        let k = SigningKey::from_seed(&[7; 32]);
        let sig = k.sign(b"cairn/test", b"hello");
        k.public().verify(b"cairn/test", b"hello", &sig).unwrap();
        assert!(k.public().verify(b"cairn/other", b"hello", &sig).is_err());
        assert!(k.public().verify(b"cairn/test", b"hellO", &sig).is_err());
        let other = SigningKey::from_seed(&[8; 32]);
        assert!(
            other
                .public()
                .verify(b"cairn/test", b"hello", &sig)
                .is_err()
        );
    }

    #[test]
    fn encodings_round_trip_and_text() {
        let k = SigningKey::generate().unwrap();
        let pk = k.public();
        let mut e = Encoder::new();
        pk.encode(&mut e);
        let sig = k.sign(b"d", b"m");
        sig.encode(&mut e);
        let bytes = e.finish();
        let mut d = Decoder::new(&bytes, "test");
        assert_eq!(PublicKey::decode(&mut d).unwrap(), pk);
        assert_eq!(Signature::decode(&mut d).unwrap(), sig);
        d.finish().unwrap();
        assert_eq!(pk.to_string().parse::<PublicKey>().unwrap(), pk);
        assert!("ed25519:zz".parse::<PublicKey>().is_err());
        assert!(PublicKey::from_raw(&[0u8; 31]).is_err());
        // The identity point has small order and is refused.
        let mut ident = [0u8; 32];
        ident[0] = 1;
        assert!(PublicKey::from_raw(&ident).is_err());
        // y = 3 encoded as p + 3 (non-canonical) is refused; found by the fuzzing work.
        let mut noncanon = [0xffu8; 32];
        noncanon[0] = 0xf0;
        noncanon[31] = 0x7f;
        assert!(PublicKey::from_raw(&noncanon).is_err());
    }

    /// A domain over 255 bytes is refused: cut to 255, its tail would read as the start
    /// of the message, so two (domain, message) pairs would share a signature.
    #[test]
    #[should_panic(expected = "at most 255 bytes")]
    fn a_domain_over_255_bytes_is_refused() {
        let k = SigningKey::from_seed(&[1; 32]);
        let _ = k.sign(&[b'd'; 256], b"message");
    }
}
