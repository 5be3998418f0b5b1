//! Records: header + body (DCS §3.1), record names, and client-side body sealing.
//!
//! A record's **header** binds everything a proof relies on: the capsule name, the body
//! (hash and length, or the root and count of its subrecord tree) and the ordered list of
//! backpointers. The **record name** is the hash of the encoded header, which is also the
//! header's chunk id in the store, so every read of a header re-verifies its name. The
//! body is stored as its own chunk, `TAG_BODY ‖ ciphertext`, whose hash is the body hash in
//! the header: a server can check a body against its header without any key.
//!
//! Every capsule-layer encoding starts with a two-byte tag (`0xCA`, kind), and object-layer
//! chunks and RFC 6962 tree nodes (`0x00` leaf, `0x01` interior) never start with `0xCA`,
//! so no header can be mistaken for another structure. (An object chunk and a tree node can
//! share a preimage shape, for instance a 65-byte object chunk starting with `0x01`, but
//! no check ever compares one with the other: a reader's cache holds only its capsule's
//! record names and tree nodes.)

use std::fmt;
use std::str::FromStr;

use aes_gcm_siv::Aes256GcmSiv;
use cairn_core::{Decoder, Encoder, Error, Hash, HashAlgo, Result};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::metadata::{BodyCipher, CapsuleName};

/// Tag of encoded capsule metadata.
pub const TAG_METADATA: [u8; 2] = [0xCA, 0x00];
/// Tag of a record header chunk.
pub const TAG_HEADER: [u8; 2] = [0xCA, 0x01];
/// Tag of a record body chunk.
pub const TAG_BODY: [u8; 2] = [0xCA, 0x02];
/// Tag of a subrecord chunk.
pub const TAG_SUBRECORD: [u8; 2] = [0xCA, 0x03];
/// Tag of a subrecord-list chunk (the leaves of one record's subrecord tree).
pub const TAG_SUBRECORD_LIST: [u8; 2] = [0xCA, 0x04];
/// Tag of a server journal chunk.
pub const TAG_JOURNAL: [u8; 2] = [0xCA, 0x05];
/// Format version of record headers.
pub const HEADER_VERSION: u8 = 1;
/// Most backpointers one header may carry.
pub const MAX_BACKPOINTERS: usize = 1024;
/// Largest body one record may carry (bigger data belongs in objects or subrecords).
pub const MAX_BODY_LEN: usize = 64 << 20;

/// Refuses a list of backpointers naming one record twice. Sorted, not compared pairwise:
/// [`MAX_BACKPOINTERS`] names differing only in their last byte took half a million full
/// compares per header.
fn check_distinct(backpointers: &[RecordName]) -> Result<()> {
    if backpointers.len() < 2 {
        return Ok(());
    }
    let mut sorted: Vec<&RecordName> = backpointers.iter().collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::decode(format!("backpointer {} appears twice", w[0]))),
        None => Ok(()),
    }
}

/// A record's name: the hash of its encoded header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordName(pub Hash);

impl RecordName {
    /// The underlying hash.
    pub fn hash(&self) -> &Hash {
        &self.0
    }
}

impl fmt::Display for RecordName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RecordName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rec:{}", self.0.short())
    }
}

impl FromStr for RecordName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(RecordName(s.parse()?))
    }
}

/// What a header says about its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRef {
    /// One body chunk: `hash = H(TAG_BODY ‖ bytes)`, `len = bytes.len()`.
    Plain {
        /// Hash of the body chunk.
        hash: Hash,
        /// Length of the stored (sealed) body in bytes.
        len: u64,
    },
    /// A Merkle tree of subrecords (DCS §4): `root` is its RFC 6962 root, `count` its
    /// number of leaves.
    Subrecords {
        /// The tree root, tagged with the capsule's algorithm.
        root: Hash,
        /// Number of subrecords (at least one).
        count: u64,
    },
}

/// A record header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// The capsule this record belongs to.
    pub capsule: CapsuleName,
    /// The body.
    pub body: BodyRef,
    /// Hash pointers to earlier records, in the writer's order (distinct).
    pub backpointers: Vec<RecordName>,
}

impl RecordHeader {
    /// The canonical encoding (what the record name hashes).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(80 + 34 * self.backpointers.len());
        e.raw(&TAG_HEADER).u8(HEADER_VERSION);
        e.hash(self.capsule.hash());
        match &self.body {
            BodyRef::Plain { hash, len } => {
                e.u8(0).hash(hash).varint(*len);
            }
            BodyRef::Subrecords { root, count } => {
                e.u8(1).hash(root).varint(*count);
            }
        }
        e.varint(self.backpointers.len() as u64);
        for b in &self.backpointers {
            e.hash(b.hash());
        }
        e.finish()
    }

    /// Parses an encoded header and checks it is well formed: known version, every hash
    /// in the capsule's algorithm, distinct backpointers, a non-empty subrecord tree.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "record header");
        let (capsule, body) = Self::decode_front(&mut d)?;
        let algo = capsule.hash().algo();
        let n = d.count(34)?;
        if n > MAX_BACKPOINTERS {
            return Err(Error::decode(format!(
                "{n} backpointers (at most {MAX_BACKPOINTERS})"
            )));
        }
        let mut backpointers: Vec<RecordName> = Vec::with_capacity(n);
        for _ in 0..n {
            let b = RecordName(d.hash()?);
            if b.hash().algo() != algo {
                return Err(Error::decode(
                    "backpointer uses another algorithm than the capsule",
                ));
            }
            backpointers.push(b);
        }
        check_distinct(&backpointers)?;
        d.finish()?;
        Ok(RecordHeader {
            capsule,
            body,
            backpointers,
        })
    }

    /// The capsule name and body reference, checked, leaving `d` at the backpointers.
    fn decode_front(d: &mut Decoder<'_>) -> Result<(CapsuleName, BodyRef)> {
        if d.raw(2)? != TAG_HEADER {
            return Err(Error::decode("not a record header (bad tag)"));
        }
        d.version(&[HEADER_VERSION])?;
        let capsule = CapsuleName(d.hash()?);
        let algo = capsule.hash().algo();
        let body = match d.u8()? {
            0 => {
                let hash = d.hash()?;
                let len = d.varint()?;
                if len > MAX_BODY_LEN as u64 {
                    return Err(Error::decode(format!("body of {len} bytes is too large")));
                }
                BodyRef::Plain { hash, len }
            }
            1 => {
                let root = d.hash()?;
                let count = d.varint()?;
                if count == 0 {
                    return Err(Error::decode("subrecord tree with no subrecords"));
                }
                BodyRef::Subrecords { root, count }
            }
            other => return Err(Error::decode(format!("unknown body kind {other}"))),
        };
        let body_algo = match &body {
            BodyRef::Plain { hash, .. } | BodyRef::Subrecords { root: hash, .. } => hash.algo(),
        };
        if body_algo != algo {
            return Err(Error::decode(
                "body hash uses another algorithm than the capsule",
            ));
        }
        Ok((capsule, body))
    }

    /// Checks what [`RecordHeader::decode`] checks, on a header built in memory (which
    /// skips the decoder): every hash in the capsule's algorithm, at most
    /// [`MAX_BACKPOINTERS`] distinct backpointers, a body of at most [`MAX_BODY_LEN`] bytes
    /// or a non-empty subrecord tree. One that fails this would not load again once stored.
    /// (`decode` makes the same checks inline, as it parses: it runs on every read, and a
    /// second pass over the parsed header cost reads a few percent.)
    pub fn check_well_formed(&self) -> Result<()> {
        let algo = self.capsule.hash().algo();
        let body_algo = match &self.body {
            BodyRef::Plain { hash, len } => {
                if *len > MAX_BODY_LEN as u64 {
                    return Err(Error::decode(format!("body of {len} bytes is too large")));
                }
                hash.algo()
            }
            BodyRef::Subrecords { root, count } => {
                if *count == 0 {
                    return Err(Error::decode("subrecord tree with no subrecords"));
                }
                root.algo()
            }
        };
        if body_algo != algo {
            return Err(Error::decode(
                "body hash uses another algorithm than the capsule",
            ));
        }
        let n = self.backpointers.len();
        if n > MAX_BACKPOINTERS {
            return Err(Error::decode(format!(
                "{n} backpointers (at most {MAX_BACKPOINTERS})"
            )));
        }
        for b in &self.backpointers {
            if b.hash().algo() != algo {
                return Err(Error::decode(
                    "backpointer uses another algorithm than the capsule",
                ));
            }
        }
        check_distinct(&self.backpointers)
    }

    /// The record name: the hash of the encoding, in the capsule's algorithm.
    pub fn name(&self) -> RecordName {
        RecordName(self.capsule.hash().algo().digest(&self.encode()))
    }
}

/// Hash of a body chunk: `H(TAG_BODY ‖ sealed)`.
pub fn body_hash(algo: HashAlgo, sealed: &[u8]) -> Hash {
    algo.digest_parts(&[&TAG_BODY, sealed])
}

/// The body chunk for `sealed` bytes.
pub fn body_chunk(sealed: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + sealed.len());
    v.extend_from_slice(&TAG_BODY);
    v.extend_from_slice(sealed);
    v
}

/// A whole record as written: the encoded header and the sealed body (empty for a
/// subrecord record, whose subrecords travel separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The decoded header.
    pub header: RecordHeader,
    /// Sealed body bytes (without the chunk tag).
    pub body: Vec<u8>,
}

impl Record {
    /// A plain record of `sealed` body bytes with `backpointers`.
    pub fn new(capsule: CapsuleName, sealed: Vec<u8>, backpointers: Vec<RecordName>) -> Self {
        let algo = capsule.hash().algo();
        let header = RecordHeader {
            capsule,
            body: BodyRef::Plain {
                hash: body_hash(algo, &sealed),
                len: sealed.len() as u64,
            },
            backpointers,
        };
        Record {
            header,
            body: sealed,
        }
    }

    /// The record's name.
    pub fn name(&self) -> RecordName {
        self.header.name()
    }

    /// Checks that the body matches the header's hash and length.
    pub fn check_body(&self) -> Result<()> {
        self.header.check_body(&self.body)
    }
}

impl RecordHeader {
    /// Checks that `body` is the body this header names: its hash and length for a plain
    /// body; nothing at all for a subrecord record, whose data are its subrecords.
    pub fn check_body(&self, body: &[u8]) -> Result<()> {
        match &self.body {
            BodyRef::Plain { hash, len } => {
                if body.len() as u64 != *len || body_hash(hash.algo(), body) != *hash {
                    return Err(Error::Rejected(format!(
                        "body of record {} does not match the hash in its header",
                        self.name()
                    )));
                }
                Ok(())
            }
            BodyRef::Subrecords { .. } => {
                if body.is_empty() {
                    Ok(())
                } else {
                    Err(Error::Rejected(
                        "a subrecord record carries its data as subrecords, not a body".into(),
                    ))
                }
            }
        }
    }
}

/// A 256-bit body key. Readers obtain it as the capsule metadata's `key_distribution`
/// says; servers never see it.
#[derive(Clone)]
pub struct BodyKey(pub [u8; 32]);

impl BodyKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k)
            .map_err(|e| Error::Unavailable(format!("no randomness for a body key: {e}")))?;
        Ok(BodyKey(k))
    }
}

impl fmt::Debug for BodyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BodyKey(..)")
    }
}

/// A capsule's body cipher with its key schedule and associated data set up once, for
/// sealing or opening many bodies of one capsule.
pub struct BodyCrypto {
    cipher: BodyCipher,
    aead: Option<BodyAead>,
    aad: Vec<u8>,
}

/// The keyed AEAD of a sealing cipher.
enum BodyAead {
    XChaCha(Box<XChaCha20Poly1305>),
    GcmSiv(Box<Aes256GcmSiv>),
}

impl BodyAead {
    /// Nonce length of the cipher.
    fn nonce_len(&self) -> usize {
        match self {
            BodyAead::XChaCha(_) => 24,
            BodyAead::GcmSiv(_) => 12,
        }
    }

    fn encrypt(&self, nonce: &[u8], p: Payload<'_, '_>) -> Option<Vec<u8>> {
        match self {
            BodyAead::XChaCha(a) => a.encrypt(XNonce::from_slice(nonce), p).ok(),
            BodyAead::GcmSiv(a) => a.encrypt(aes_gcm_siv::Nonce::from_slice(nonce), p).ok(),
        }
    }

    fn decrypt(&self, nonce: &[u8], p: Payload<'_, '_>) -> Option<Vec<u8>> {
        match self {
            BodyAead::XChaCha(a) => a.decrypt(XNonce::from_slice(nonce), p).ok(),
            BodyAead::GcmSiv(a) => a.decrypt(aes_gcm_siv::Nonce::from_slice(nonce), p).ok(),
        }
    }
}

/// Length of the AEAD tag both sealing ciphers append.
const TAG_LEN: usize = 16;

impl BodyCrypto {
    /// The cipher `cipher` of `capsule` under `key` (`None` for a reader or writer without
    /// the key: sealing and opening then fail for ciphers that need one).
    pub fn new(cipher: BodyCipher, key: Option<&BodyKey>, capsule: &CapsuleName) -> Self {
        let aead = match cipher {
            BodyCipher::Plaintext => None,
            BodyCipher::XChaCha20Poly1305 => {
                key.map(|k| BodyAead::XChaCha(Box::new(XChaCha20Poly1305::new((&k.0).into()))))
            }
            BodyCipher::Aes256GcmSiv => {
                key.map(|k| BodyAead::GcmSiv(Box::new(Aes256GcmSiv::new((&k.0).into()))))
            }
        };
        BodyCrypto {
            cipher,
            aead,
            aad: capsule.hash().to_bytes().to_vec(),
        }
    }

    fn aead(&self) -> Result<&BodyAead> {
        self.aead
            .as_ref()
            .ok_or_else(|| Error::invalid("this capsule seals bodies: a body key is needed"))
    }

    /// Seals `plaintext`: `nonce ‖ ciphertext ‖ tag` for the sealing ciphers, with a fresh
    /// random nonce (the capsule name is associated data, so a body cannot be moved to
    /// another capsule); the bytes themselves for plaintext capsules.
    pub fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>> {
        if self.cipher == BodyCipher::Plaintext {
            return Ok(plaintext.to_vec());
        }
        let aead = self.aead()?;
        let mut nonce = [0u8; 24];
        let nonce = &mut nonce[..aead.nonce_len()];
        getrandom::fill(nonce)
            .map_err(|e| Error::Unavailable(format!("no randomness for a nonce: {e}")))?;
        let ct = aead
            .encrypt(
                nonce,
                Payload {
                    msg: plaintext,
                    aad: &self.aad,
                },
            )
            .ok_or_else(|| Error::invalid("body too large to seal"))?;
        let mut out = Vec::with_capacity(nonce.len() + ct.len());
        out.extend_from_slice(nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// Opens what [`BodyCrypto::seal`] produced; a wrong key, a wrong
    /// capsule or any changed byte is an error.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>> {
        if self.cipher == BodyCipher::Plaintext {
            return Ok(sealed.to_vec());
        }
        let aead = self.aead()?;
        if sealed.len() < aead.nonce_len() + TAG_LEN {
            return Err(Error::Rejected("sealed body is too short".into()));
        }
        let (nonce, ct) = sealed.split_at(aead.nonce_len());
        aead.decrypt(
            nonce,
            Payload {
                msg: ct,
                aad: &self.aad,
            },
        )
        .ok_or_else(|| Error::Rejected("body does not open with this key for this capsule".into()))
    }
}

/// The sealed subrecords of one record, in tree order, held in one buffer.
///
/// A list of `Vec`s cost 24 bytes an entry besides each entry's own allocation, so a
/// request of many empty or tiny subrecords (one or two bytes each on the wire) decoded
/// into 16 to 28 times its size before any check; here an entry costs its bytes and one
/// offset.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SealedSubrecords {
    bytes: Vec<u8>,
    /// `ends[i]` is where subrecord `i` ends in `bytes` (it starts where `i - 1` ends).
    ends: Vec<usize>,
    /// The bytes of the subrecords' length prefixes on the wire (one varint each).
    prefixes: usize,
}

/// Bytes of `v` as a varint (7 bits a byte).
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

impl SealedSubrecords {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty list with room for `count` subrecords of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        SealedSubrecords {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(count),
            prefixes: 0,
        }
    }

    /// Appends one sealed subrecord.
    pub fn push(&mut self, sealed: &[u8]) {
        self.bytes.extend_from_slice(sealed);
        self.ends.push(self.bytes.len());
        self.prefixes += varint_len(sealed.len() as u64);
    }

    /// How many subrecords the list holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the list holds none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The memory the list holds (its buffer and offsets, as allocated).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * std::mem::size_of::<usize>()
    }

    /// The bytes of all the subrecords together.
    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The subrecords' size as a record body is counted against [`MAX_BODY_LEN`]: their
    /// bytes and length prefixes, as they travel in a message.
    pub fn body_len(&self) -> usize {
        self.bytes.len().saturating_add(self.prefixes)
    }

    /// The size [`Self::body_len`] would be with `sealed` pushed.
    pub fn body_len_with(&self, sealed: &[u8]) -> usize {
        self.body_len()
            .saturating_add(sealed.len())
            .saturating_add(varint_len(sealed.len() as u64))
    }

    /// Refuses subrecords over [`MAX_BODY_LEN`] together ([`Self::body_len`]) in a new
    /// record: a record of either kind must travel whole in one anti-entropy message, or
    /// no session could send it, nor the records after it.
    pub fn check_len(&self) -> Result<()> {
        if self.body_len() > MAX_BODY_LEN {
            return Err(Error::invalid(format!(
                "{} subrecords of {} bytes together (with their length prefixes) are more \
                 than the {MAX_BODY_LEN} one record may carry; commit them as several records",
                self.len(),
                self.total_bytes()
            )));
        }
        Ok(())
    }

    /// Subrecord `i`, if the list has that many.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.bytes.get(start..end)
    }

    /// The subrecords in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.bytes[start..self.ends[i]]
        })
    }
}

impl fmt::Debug for SealedSubrecords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|s| s.len()))
            .finish()
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for SealedSubrecords {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut list = SealedSubrecords::new();
        for s in iter {
            list.push(s.as_ref());
        }
        list
    }
}

impl From<Vec<Vec<u8>>> for SealedSubrecords {
    fn from(subs: Vec<Vec<u8>>) -> Self {
        subs.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subrecord list counts its length prefixes as the wire encodes them (a varint of 7
    /// bits a byte), not a guess of five bytes each, which refused records that fit.
    #[test]
    fn subrecord_prefixes_are_counted_as_encoded() {
        for (len, prefix) in [
            (0usize, 1usize),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
        ] {
            let subs: SealedSubrecords = [vec![0u8; len]].into_iter().collect();
            let mut e = Encoder::new();
            e.bytes(subs.get(0).unwrap());
            assert_eq!(e.len(), len + prefix);
            assert_eq!(subs.body_len(), len + prefix, "{len}");
            assert_eq!(
                SealedSubrecords::new().body_len_with(&vec![0u8; len]),
                len + prefix
            );
        }
    }

    fn capsule() -> CapsuleName {
        CapsuleName(HashAlgo::Blake3.digest(b"capsule"))
    }

    #[test]
    fn header_round_trip_and_binding() {
        let c = capsule();
        let p1 = RecordName(HashAlgo::Blake3.digest(b"p1"));
        let p2 = RecordName(HashAlgo::Blake3.digest(b"p2"));
        let r = Record::new(c, b"body".to_vec(), vec![p1, p2]);
        let bytes = r.header.encode();
        assert_eq!(RecordHeader::decode(&bytes).unwrap(), r.header);
        r.check_body().unwrap();
        let mut swapped = r.header.clone();
        swapped.backpointers.reverse();
        assert_ne!(swapped.name(), r.name());
        let mut other = r.header.clone();
        other.capsule = CapsuleName(HashAlgo::Blake3.digest(b"other"));
        assert_ne!(other.name(), r.name());
        let mut tampered = r.clone();
        tampered.body[0] ^= 1;
        assert!(tampered.check_body().is_err());
        let mut dup = r.header.clone();
        dup.backpointers = vec![p1, p1];
        assert!(RecordHeader::decode(&dup.encode()).is_err());
        assert!(dup.check_well_formed().is_err());
        // A repeat anywhere among many (not next to its twin) is found too.
        let mut many: Vec<RecordName> = (0..MAX_BACKPOINTERS as u32)
            .map(|i| RecordName(HashAlgo::Blake3.digest(&i.to_le_bytes())))
            .collect();
        let mut distinct = r.header.clone();
        distinct.backpointers = many.clone();
        assert_eq!(RecordHeader::decode(&distinct.encode()).unwrap(), distinct);
        distinct.check_well_formed().unwrap();
        many[700] = many[3];
        dup.backpointers = many;
        let err = RecordHeader::decode(&dup.encode()).unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
        assert!(dup.check_well_formed().is_err());
    }

    #[test]
    fn seal_open() {
        let c = capsule();
        let k = BodyKey::generate().unwrap();
        for (x, nonce_len) in [
            (BodyCipher::XChaCha20Poly1305, 24),
            (BodyCipher::Aes256GcmSiv, 12),
        ] {
            let s = BodyCrypto::new(x, Some(&k), &c).seal(b"secret").unwrap();
            assert_eq!(s.len(), nonce_len + 6 + TAG_LEN);
            assert_eq!(
                BodyCrypto::new(x, Some(&k), &c).open(&s).unwrap(),
                b"secret"
            );
            // Fresh nonces: sealing the same body twice gives different bytes.
            assert_ne!(BodyCrypto::new(x, Some(&k), &c).seal(b"secret").unwrap(), s);
            let other = CapsuleName(HashAlgo::Blake3.digest(b"x"));
            assert!(BodyCrypto::new(x, Some(&k), &other).open(&s).is_err());
            let k2 = BodyKey::generate().unwrap();
            assert!(BodyCrypto::new(x, Some(&k2), &c).open(&s).is_err());
            // Any flipped byte (nonce, ciphertext or tag) and any cut is refused.
            for i in 0..s.len() {
                let mut bad = s.clone();
                bad[i] ^= 1;
                assert!(
                    BodyCrypto::new(x, Some(&k), &c).open(&bad).is_err(),
                    "byte {i}"
                );
            }
            for n in 0..s.len() {
                assert!(
                    BodyCrypto::new(x, Some(&k), &c).open(&s[..n]).is_err(),
                    "cut {n}"
                );
            }
            // The other cipher does not open it.
            let y = if x == BodyCipher::Aes256GcmSiv {
                BodyCipher::XChaCha20Poly1305
            } else {
                BodyCipher::Aes256GcmSiv
            };
            assert!(BodyCrypto::new(y, Some(&k), &c).open(&s).is_err());
            // Without the key: a clear error, for sealing and for opening.
            assert!(BodyCrypto::new(x, None, &c).seal(b"secret").is_err());
            assert!(BodyCrypto::new(x, None, &c).open(&s).is_err());
        }
        // Plaintext capsules keep the bytes as they are.
        let p = BodyCrypto::new(BodyCipher::Plaintext, None, &c);
        assert_eq!(p.open(&p.seal(b"open").unwrap()).unwrap(), b"open");
    }
}
