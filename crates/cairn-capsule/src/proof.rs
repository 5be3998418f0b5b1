//! Integrity proofs (DCS §3.3, §4.2) and the signatures they end in.
//!
//! A [`RecordProof`] is a hash chain of headers: `chain[0]` is the record to prove and each
//! next header holds a backpointer to the one before it; the last header is either signed
//! by a writer listed in the capsule metadata ([`Anchor::Signed`]) or already trusted by the
//! reader ([`Anchor::Cached`], from its verification cache). A [`SubrecordProof`] is an
//! RFC 6962 audit path from a subrecord up to its record's root (then a record proof), or
//! up to a tree node the reader already trusts. A [`SubrecordsProof`] proves many
//! subrecords at once: per record, a Merkle multiproof up to its root, then its record
//! proof.
//!
//! The verifiers here are what a reader runs; they trust nothing but the capsule metadata
//! (checked against the capsule name) and the reader's own cache, and return every name
//! they verified so the reader can cache them.

use cairn_core::{Decoder, Encoder, Error, Hash, HashAlgo, Result, Signature};

use crate::merkle::{self, Digest, Walk};
use crate::metadata::{CapsuleMetadata, CapsuleName};
use crate::record::{BodyRef, RecordHeader, RecordName, SealedSubrecords, TAG_SUBRECORD};

/// Signature domain for a writer's signature on a record name.
pub const DOMAIN_RECORD: &[u8] = b"cairn/capsule/record-signature/v1";
/// Format version of encoded proofs.
pub const PROOF_VERSION: u8 = 1;
/// Longest hash chain a reader accepts.
pub const MAX_CHAIN: usize = 1 << 20;

/// A writer's signature on a record name, naming the writer by index in the metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterSignature {
    /// Index of the signing key in [`CapsuleMetadata::writers`].
    pub writer: u32,
    /// Signature over the record name under [`DOMAIN_RECORD`].
    pub sig: Signature,
}

impl WriterSignature {
    /// Checks the signature on `name` against the capsule's writers.
    pub fn verify(&self, meta: &CapsuleMetadata, name: &RecordName) -> Result<()> {
        let key = meta.writers.get(self.writer as usize).ok_or_else(|| {
            Error::Rejected(format!(
                "signature names writer {} but the capsule has {}",
                self.writer,
                meta.writers.len()
            ))
        })?;
        key.verify(DOMAIN_RECORD, &name.hash().to_bytes(), &self.sig)
            .map_err(|_| Error::Rejected(format!("writer signature on record {name} is forged")))
    }

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        e.varint(self.writer as u64);
        self.sig.encode(e);
    }

    /// Reads what [`WriterSignature::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let writer =
            u32::try_from(d.varint()?).map_err(|_| Error::decode("writer index too large"))?;
        Ok(WriterSignature {
            writer,
            sig: Signature::decode(d)?,
        })
    }
}

/// What the last header of a hash chain rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// A writer's signature on the last header's name.
    Signed(WriterSignature),
    /// The last header's name is in the reader's verification cache.
    Cached,
}

/// A hash-chain proof for one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordProof {
    /// Headers from the record to prove (first) to the anchor (last).
    pub chain: Vec<RecordHeader>,
    /// What the last header rests on.
    pub anchor: Anchor,
}

impl RecordProof {
    /// Verifies that `target` belongs to the capsule described by `meta`, trusting only
    /// `meta` and names for which `trusted` returns true. Returns the verified names, target
    /// first.
    pub fn verify(
        &self,
        meta: &CapsuleMetadata,
        target: &RecordName,
        trusted: impl Fn(&Hash) -> bool,
    ) -> Result<Vec<RecordName>> {
        self.verify_with(meta, target, trusted, |_, _| false)
    }

    /// [`RecordProof::verify`], where `authentic` answers true for a signature already
    /// known to be authentic (one this process made itself): an anchor with such a
    /// signature is not checked again. Everything else is checked as by `verify`.
    pub fn verify_with(
        &self,
        meta: &CapsuleMetadata,
        target: &RecordName,
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<Vec<RecordName>> {
        self.verify_in(meta, &meta.name(), target, trusted, authentic)
    }

    /// [`RecordProof::verify_with`] for a caller that holds `capsule`, the name of `meta`
    /// (a reader verifying many proofs hashes its metadata once, not once per proof).
    pub(crate) fn verify_in(
        &self,
        meta: &CapsuleMetadata,
        capsule: &CapsuleName,
        target: &RecordName,
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<Vec<RecordName>> {
        debug_assert!(meta.name() == *capsule);
        if self.chain.is_empty() {
            return Err(Error::Rejected("proof has no headers".into()));
        }
        if self.chain.len() > MAX_CHAIN {
            return Err(Error::Rejected("proof chain is too long".into()));
        }
        let mut names = Vec::with_capacity(self.chain.len());
        for (i, h) in self.chain.iter().enumerate() {
            if h.capsule != *capsule {
                return Err(Error::Rejected(format!(
                    "proof header {i} names capsule {}, not {capsule}",
                    h.capsule
                )));
            }
            let name = h.name();
            if let Some(prev) = names.last() {
                if !h.backpointers.contains(prev) {
                    return Err(Error::Rejected(format!(
                        "proof header {i} does not point back to header {}",
                        i - 1
                    )));
                }
            } else if name != *target {
                return Err(Error::Rejected(format!(
                    "proof is for record {name}, not {target}"
                )));
            }
            names.push(name);
        }
        // `names` is non-empty: the chain is.
        let last = names[names.len() - 1];
        match &self.anchor {
            Anchor::Signed(ws) => {
                if !authentic(&last, ws) {
                    ws.verify(meta, &last)?
                }
            }
            Anchor::Cached => {
                if !trusted(last.hash()) {
                    return Err(Error::Rejected(format!(
                        "proof ends at record {last}, which this reader has not verified"
                    )));
                }
            }
        }
        Ok(names)
    }

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(PROOF_VERSION);
        e.varint(self.chain.len() as u64);
        for h in &self.chain {
            e.bytes(&h.encode());
        }
        match &self.anchor {
            Anchor::Signed(ws) => {
                e.u8(1);
                ws.encode(e);
            }
            Anchor::Cached => {
                e.u8(0);
            }
        }
    }

    /// Reads what [`RecordProof::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[PROOF_VERSION])?;
        let n = d.count(40)?;
        if n == 0 || n > MAX_CHAIN {
            return Err(Error::decode(format!("proof with {n} headers")));
        }
        // A header takes more memory decoded than its 40 bytes at least on the wire:
        // capacity grows with the headers read, past the first thousand.
        let mut chain = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            chain.push(RecordHeader::decode(d.bytes()?)?);
        }
        let anchor = match d.u8()? {
            0 => Anchor::Cached,
            1 => Anchor::Signed(WriterSignature::decode(d)?),
            other => return Err(Error::decode(format!("unknown proof anchor {other}"))),
        };
        Ok(RecordProof { chain, anchor })
    }

    /// Encodes to a standalone byte string.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        self.encode(&mut e);
        e.finish()
    }

    /// Decodes a standalone byte string, refusing trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "record proof");
        let p = Self::decode(&mut d)?;
        d.finish()?;
        Ok(p)
    }
}

/// A subrecord's name: the hash of its chunk, `H(TAG_SUBRECORD ‖ data)`.
pub fn subrecord_name(algo: HashAlgo, data: &[u8]) -> Hash {
    algo.digest_parts(&[&TAG_SUBRECORD, data])
}

/// The Merkle leaf of a subrecord: `H(0x00 ‖ name digest)`.
pub fn subrecord_leaf(name: &Hash) -> Digest {
    merkle::leaf_hash(name.algo(), name.digest())
}

/// The root of a record's subrecord tree over sealed subrecords `subs`, tagged with
/// `algo` (what the header's `BodyRef::Subrecords::root` holds), and their names.
pub fn subrecord_root(algo: HashAlgo, subs: &SealedSubrecords) -> (Hash, Vec<Hash>) {
    let names: Vec<Hash> = subs.iter().map(|s| subrecord_name(algo, s)).collect();
    let leaves: Vec<Digest> = names.iter().map(subrecord_leaf).collect();
    (Hash::new(algo, merkle::root_of(algo, &leaves)), names)
}

/// A proof that a subrecord belongs to a record of the capsule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubrecordProof {
    /// The subrecord's position in its record's tree.
    ///
    /// **Not authenticated by a cut proof.** When the path stops at a cached interior node
    /// (`record` is `None`), verification binds only the subtree below that node: `index`
    /// and `count` may be changed as long as the walk takes the same turns below it, and
    /// the proof still verifies. Only a proof whose path reaches the root (and whose record
    /// proof binds the header's `count`) authenticates `index` and `count`; never rely on
    /// them otherwise.
    pub index: u64,
    /// The number of subrecords in that tree. Like [`SubrecordProof::index`], bound only
    /// by a proof that reaches the root, not by one cut at a cached interior node.
    pub count: u64,
    /// Audit path from the leaf upward, possibly cut short at a node the reader trusts.
    pub path: Vec<Digest>,
    /// The record proof, when the path runs all the way to the root; `None` when it stops
    /// at a trusted node.
    pub record: Option<RecordProof>,
}

impl SubrecordProof {
    /// Verifies that the subrecord named `sub` belongs to the capsule. Returns the tree
    /// nodes computed on the way (leaf first; they are trustworthy once this returns Ok)
    /// and the record names verified. On Ok the whole `path` was consumed, so its
    /// siblings are bound by the node the walk ended at and are trustworthy too.
    pub fn verify(
        &self,
        meta: &CapsuleMetadata,
        sub: &Hash,
        trusted: impl Fn(&Hash) -> bool,
    ) -> Result<(Vec<Hash>, Vec<RecordName>)> {
        self.verify_with(meta, sub, trusted, |_, _| false)
    }

    /// [`SubrecordProof::verify`], skipping the check of signatures `authentic` vouches
    /// for (see [`RecordProof::verify_with`]).
    pub fn verify_with(
        &self,
        meta: &CapsuleMetadata,
        sub: &Hash,
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<(Vec<Hash>, Vec<RecordName>)> {
        self.verify_in(meta, &meta.name(), sub, trusted, authentic)
    }

    /// [`SubrecordProof::verify_with`] for a caller that holds `capsule`, the name of
    /// `meta`.
    pub(crate) fn verify_in(
        &self,
        meta: &CapsuleMetadata,
        capsule: &CapsuleName,
        sub: &Hash,
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<(Vec<Hash>, Vec<RecordName>)> {
        let algo = meta.algo;
        if sub.algo() != algo {
            return Err(Error::Rejected(
                "subrecord name uses another algorithm".into(),
            ));
        }
        let leaf = subrecord_leaf(sub);
        // The nodes the walk computes (the leaf, then each parent), noted as it goes: they
        // are what a verified proof lets the reader trust.
        let mut nodes = Vec::new();
        let walk = merkle::inclusion_walk(algo, self.index, self.count, &leaf, &self.path, |d| {
            let h = Hash::new(algo, *d);
            nodes.push(h);
            trusted(&h)
        })?;
        match walk {
            Walk::Stopped { steps, .. } => {
                if steps != self.path.len() || self.record.is_some() {
                    return Err(Error::Rejected(
                        "subrecord proof continues past a trusted node".into(),
                    ));
                }
                Ok((nodes, Vec::new()))
            }
            Walk::Root(root) => {
                let rp = self.record.as_ref().ok_or_else(|| {
                    Error::Rejected("subrecord proof ends at an untrusted root".into())
                })?;
                let names = verify_subrecord_root(
                    meta, capsule, rp, root, self.count, &trusted, &authentic,
                )?;
                Ok((nodes, names))
            }
        }
    }

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(PROOF_VERSION).varint(self.index).varint(self.count);
        e.varint(self.path.len() as u64);
        for p in &self.path {
            e.raw(p);
        }
        match &self.record {
            Some(rp) => {
                e.u8(1);
                rp.encode(e);
            }
            None => {
                e.u8(0);
            }
        }
    }

    /// Reads what [`SubrecordProof::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[PROOF_VERSION])?;
        let index = d.varint()?;
        let count = d.varint()?;
        let n = d.count(32)?;
        if n > 64 {
            return Err(Error::decode("subrecord path longer than 64"));
        }
        let mut path = Vec::with_capacity(n);
        for _ in 0..n {
            let mut x = [0u8; 32];
            x.copy_from_slice(d.raw(32)?);
            path.push(x);
        }
        let record = match d.u8()? {
            0 => None,
            1 => Some(RecordProof::decode(d)?),
            other => return Err(Error::decode(format!("unknown subrecord anchor {other}"))),
        };
        Ok(SubrecordProof {
            index,
            count,
            path,
            record,
        })
    }
}

/// Checks that `rp`'s first header is a subrecord record whose tree has root `root` and
/// `count` leaves, then verifies `rp` for it; returns the names it verified.
fn verify_subrecord_root(
    meta: &CapsuleMetadata,
    capsule: &CapsuleName,
    rp: &RecordProof,
    root: Digest,
    count: u64,
    trusted: impl Fn(&Hash) -> bool,
    authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
) -> Result<Vec<RecordName>> {
    let head = rp
        .chain
        .first()
        .ok_or_else(|| Error::Rejected("record proof has no headers".into()))?;
    match head.body {
        BodyRef::Subrecords { root: r, count: c }
            if r == Hash::new(meta.algo, root) && c == count => {}
        _ => {
            return Err(Error::Rejected(
                "subrecord path does not lead to the record's subrecord root".into(),
            ));
        }
    }
    rp.verify_in(meta, capsule, &head.name(), trusted, authentic)
}

/// Most subrecords one [`SubrecordsProof`] proves (and one request may name).
pub const MAX_BATCH_SUBRECORDS: usize = 100_000;

/// A proof that several subrecords belong to the capsule, for a reader that wants many
/// at once (the whole of a record, or a client's batch): one [`SubrecordGroup`] per
/// record they belong to. Each group is a Merkle multiproof from its subrecords up to the
/// record's subrecord root, then the record's proof; the siblings two leaves share are
/// sent and hashed once, and proving every subrecord of a record takes no sibling at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubrecordsProof {
    /// One group per record, each proving some of the requested subrecords.
    pub groups: Vec<SubrecordGroup>,
}

/// The part of a [`SubrecordsProof`] for the subrecords of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubrecordGroup {
    /// The number of subrecords in the record's tree (checked against its header).
    pub count: u64,
    /// The subrecords proven: `(index in the tree, position in the list the reader asked
    /// about)`, in strictly increasing index order.
    pub leaves: Vec<(u64, u32)>,
    /// The multiproof's siblings ([`crate::merkle::MerkleLog::multi_proof`]).
    pub siblings: Vec<Digest>,
    /// The record's proof: its first header is the record whose subrecord root the
    /// leaves and siblings must give.
    pub record: RecordProof,
}

impl SubrecordsProof {
    /// Verifies that every subrecord named in `subs` belongs to the capsule. Returns, per
    /// group, the record's subrecord root and the record names its proof verified (all
    /// trustworthy once this returns Ok). A proof that leaves any of `subs` out, proves
    /// one twice, or names a position outside `subs` is refused.
    pub fn verify_with(
        &self,
        meta: &CapsuleMetadata,
        subs: &[Hash],
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<Vec<(Hash, Vec<RecordName>)>> {
        self.verify_in(meta, &meta.name(), subs, trusted, authentic)
    }

    /// [`SubrecordsProof::verify_with`] for a caller that holds `capsule`, the name of
    /// `meta`.
    pub(crate) fn verify_in(
        &self,
        meta: &CapsuleMetadata,
        capsule: &CapsuleName,
        subs: &[Hash],
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<Vec<(Hash, Vec<RecordName>)>> {
        let algo = meta.algo;
        if subs.iter().any(|s| s.algo() != algo) {
            return Err(Error::Rejected(
                "subrecord name uses another algorithm".into(),
            ));
        }
        let mut covered = vec![false; subs.len()];
        let mut verified = Vec::with_capacity(self.groups.len());
        let mut leaves = Vec::new();
        for g in &self.groups {
            leaves.clear();
            for &(index, pos) in &g.leaves {
                let seen = covered.get_mut(pos as usize).ok_or_else(|| {
                    Error::Rejected(format!(
                        "proof names subrecord {pos} of a list of {}",
                        subs.len()
                    ))
                })?;
                if std::mem::replace(seen, true) {
                    return Err(Error::Rejected(format!(
                        "proof proves subrecord {} twice",
                        subs[pos as usize]
                    )));
                }
                leaves.push((index, subrecord_leaf(&subs[pos as usize])));
            }
            let root = merkle::multi_root(algo, g.count, &leaves, &g.siblings)?;
            let names = verify_subrecord_root(
                meta, capsule, &g.record, root, g.count, &trusted, &authentic,
            )?;
            verified.push((Hash::new(algo, root), names));
        }
        if let Some(pos) = covered.iter().position(|c| !c) {
            return Err(Error::Rejected(format!(
                "proof does not cover subrecord {}",
                subs[pos]
            )));
        }
        Ok(verified)
    }

    /// [`SubrecordsProof::verify_in`] for the whole of one record: `subs` must be all of
    /// `record`'s subrecords, in tree order (one group, of that record, whose leaves are
    /// every index, each at its own position). A server that leaves some out, adds another
    /// record's or reorders them is refused; [`SubrecordsProof::verify_in`] alone only
    /// shows that each listed subrecord is in some record of the capsule.
    pub(crate) fn verify_record_in(
        &self,
        meta: &CapsuleMetadata,
        capsule: &CapsuleName,
        record: &RecordName,
        subs: &[Hash],
        trusted: impl Fn(&Hash) -> bool,
        authentic: impl Fn(&RecordName, &WriterSignature) -> bool,
    ) -> Result<Vec<(Hash, Vec<RecordName>)>> {
        let [g] = self.groups.as_slice() else {
            return Err(Error::Rejected(format!(
                "a proof of one record's subrecords has {} groups",
                self.groups.len()
            )));
        };
        if g.record.chain.first().map(|h| h.name()) != Some(*record) {
            return Err(Error::Rejected(format!(
                "the proof is of another record's subrecords, not {record}'s"
            )));
        }
        if g.count != subs.len() as u64
            || g.leaves.len() != subs.len()
            || g.leaves
                .iter()
                .enumerate()
                .any(|(i, &(index, pos))| index != i as u64 || pos as usize != i)
        {
            return Err(Error::Rejected(format!(
                "the list is not all {} subrecords of record {record}, in order",
                g.count
            )));
        }
        self.verify_in(meta, capsule, subs, trusted, authentic)
    }

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Encoder) {
        e.u8(PROOF_VERSION).varint(self.groups.len() as u64);
        for g in &self.groups {
            e.varint(g.count).varint(g.leaves.len() as u64);
            for &(index, pos) in &g.leaves {
                e.varint(index).varint(pos as u64);
            }
            e.varint(g.siblings.len() as u64);
            for s in &g.siblings {
                e.raw(s);
            }
            g.record.encode(e);
        }
    }

    /// Reads what [`SubrecordsProof::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        d.version(&[PROOF_VERSION])?;
        // A group takes at least 3 bytes before its record proof.
        let n = d.count(3)?;
        let mut groups = Vec::with_capacity(n.min(1024));
        let mut total = 0usize;
        for _ in 0..n {
            let count = d.varint()?;
            let k = d.count(2)?;
            total += k;
            if total > MAX_BATCH_SUBRECORDS {
                return Err(Error::decode(format!(
                    "subrecord multiproof proves more than {MAX_BATCH_SUBRECORDS} subrecords"
                )));
            }
            let mut leaves = Vec::with_capacity(k);
            for _ in 0..k {
                let index = d.varint()?;
                let pos = u32::try_from(d.varint()?)
                    .map_err(|_| Error::decode("subrecord position too large"))?;
                leaves.push((index, pos));
            }
            let m = d.count(32)?;
            let mut siblings = Vec::with_capacity(m);
            for _ in 0..m {
                let mut x = [0u8; 32];
                x.copy_from_slice(d.raw(32)?);
                siblings.push(x);
            }
            groups.push(SubrecordGroup {
                count,
                leaves,
                siblings,
                record: RecordProof::decode(d)?,
            });
        }
        Ok(SubrecordsProof { groups })
    }
}
