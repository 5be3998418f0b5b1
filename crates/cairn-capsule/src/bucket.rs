//! Every bucket is a capsule (ARCHITECTURE.md: "bucket = capsule").
//!
//! A [`Bucket`] is a namespace of keys of the object engine ([`Db`]) whose every mutation
//! (put, update, fork, merge, rename, remove) appends a record to the bucket's capsule. The
//! record body is a [`Mutation`] naming the key, the branch, the version (uid) and its
//! bases; records are chained by backpointers and signed by the writer's key, so every
//! version a bucket created has a [`VersionProof`]: the record that names it plus the hash
//! chain from that record to a writer signature. A reader who knows only the capsule name
//! (e.g. from a chain) checks it with [`VersionProof::verify`].
//!
//! Records of concurrent mutations are written in groups, like the store's group commit:
//! whoever finds no group in flight writes every record queued so far in one
//! [`CapsuleServer::write`] with one signature on the newest, which covers the rest by hash
//! chain. One mutation alone is signed directly.
//!
//! The record comes first: the bucket is its Db's [`HeadRecorder`], so the Db appends the
//! mutation's record (and waits until it is durable) after storing the new version and
//! before the commit that makes it a head. When the record cannot be written nothing is
//! committed and the mutation fails, changing nothing visible; a crash in between leaves a
//! record of a mutation that never became visible (it was never acknowledged), never a
//! head without its record. So every head a bucket shows has a [`VersionProof`] or a
//! record of the fork, rename or merge that put it there.
//!
//! Bucket capsules store bodies in plaintext: a mutation holds key and branch names and
//! hashes, which the Db's refs hold in plaintext too; the values themselves stay in the Db.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use cairn_core::{Decoder, Encoder, Error, Hash, HashAlgo, PublicKey, Result, SigningKey};
use cairn_object::{
    At, Db, FObject, HeadChange, HeadChangeKind, HeadRecorder, MergeOutcome, NewValue, Op,
    PutOptions, Resolver, Target, TreeConfig, Uid, VersionMembership, check_bucket_name,
};
use parking_lot::{Condvar, Mutex};

use crate::client::Writer;
use crate::metadata::{BodyCipher, CapsuleMetadata, CapsuleName};
use crate::proof::RecordProof;
use crate::record::{Record, RecordHeader, RecordName};
use crate::seal::{OwnerSeal, bucket_owner};
use crate::server::CapsuleServer;

/// Capsule metadata setting that fixes a bucket's average POS-tree leaf size in bytes
/// (decimal). Written when the bucket's capsule is created, from the creating Db's
/// [`cairn_object::TreeConfig`], and applied to the bucket's Db on every open, so that
/// every version of the bucket is chunked alike (dedup, history-independent roots) however
/// the process that opens it is configured. A bucket created before this setting existed
/// has none and keeps the 4 KiB default it was written with, as does one created by
/// [`Bucket::open_with_metadata`] from metadata without it (set it there to choose the
/// size). Only the leaf size is per bucket (index nodes use the default target). A
/// read-only open ignores a value it cannot use: reads need no configuration.
pub const LEAF_SIZE_SETTING: &str = "cairn.leaf_size";

/// Format version of an encoded [`Mutation`] without an owner seal (records written before
/// seals existed keep it, byte for byte).
pub const MUTATION_VERSION: u8 = 1;
/// Format version of an encoded [`Mutation`] that carries an [`OwnerSeal`].
pub const SEALED_MUTATION_VERSION: u8 = 2;
/// Format version of an encoded [`VersionProof`] without the version's FObject.
pub const VERSION_PROOF_VERSION: u8 = 1;
/// Format version of an encoded [`VersionProof`] that carries the version's FObject (to
/// check its record's owner seal against).
pub const OBJECT_VERSION_PROOF_VERSION: u8 = 2;
/// The metadata setting that names the bucket a capsule backs.
pub const BUCKET_SETTING: &str = "cairn.bucket";
/// Longest key a mutation record may name (the Db's own limit is lower).
const MAX_KEY: usize = 1 << 16;
/// Longest branch name a mutation record may name.
const MAX_BRANCH: usize = 1 << 12;
/// Most bases one version may have in a mutation record.
const MAX_BASES: usize = 1 << 16;

/// What a mutation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MutationKind {
    /// A new version by Put or a type operation (Update); `branch` is the tagged branch it
    /// became the head of, or `None` for an untagged head.
    Put,
    /// Branch `branch` created at version `uid`.
    Fork,
    /// A merge: `uid` is the merged version (new, or an existing one fast-forwarded to);
    /// `branch` is the branch merged into, `None` for merged untagged heads.
    Merge,
    /// Branch `from` renamed to `branch`; its head is `uid`.
    Rename,
    /// Branch `branch` removed; its head was `uid`. Without a branch: untagged head `uid`
    /// left the heads (a merge found it contained in its target).
    Remove,
}

impl MutationKind {
    fn code(self) -> u8 {
        match self {
            MutationKind::Put => 1,
            MutationKind::Fork => 2,
            MutationKind::Merge => 3,
            MutationKind::Rename => 4,
            MutationKind::Remove => 5,
        }
    }

    fn from_code(c: u8) -> Result<Self> {
        Ok(match c {
            1 => MutationKind::Put,
            2 => MutationKind::Fork,
            3 => MutationKind::Merge,
            4 => MutationKind::Rename,
            5 => MutationKind::Remove,
            other => return Err(Error::decode(format!("unknown mutation kind {other}"))),
        })
    }

    /// Lower-case name, as the CLI prints it.
    pub fn name(self) -> &'static str {
        match self {
            MutationKind::Put => "put",
            MutationKind::Fork => "fork",
            MutationKind::Merge => "merge",
            MutationKind::Rename => "rename",
            MutationKind::Remove => "remove",
        }
    }
}

/// The body of a bucket record: one mutation of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mutation {
    /// What happened.
    pub kind: MutationKind,
    /// The key.
    pub key: Vec<u8>,
    /// The branch written, created, merged into, renamed to or removed (see
    /// [`MutationKind`]); `None` for untagged heads.
    pub branch: Option<String>,
    /// For a rename: the old branch name.
    pub from: Option<String>,
    /// The version the mutation made, moved a head to, or removed the head of.
    pub uid: Uid,
    /// The bases of `uid` when the mutation created it (Put, Merge); empty otherwise.
    pub bases: Vec<Uid>,
    /// The bucket owner's seal over the put's content (Put only; see [`crate::seal`]):
    /// checked by the node before it recorded the put, and by a reader with
    /// [`VersionProof::owner_seal`].
    pub seal: Option<OwnerSeal>,
}

impl Mutation {
    /// Whether this mutation created version `uid` (so its record proves the version).
    pub fn creates_version(&self) -> bool {
        matches!(self.kind, MutationKind::Put | MutationKind::Merge)
    }

    /// The canonical encoding (the record body).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::versioned(match self.seal {
            Some(_) => SEALED_MUTATION_VERSION,
            None => MUTATION_VERSION,
        });
        e.u8(self.kind.code()).bytes(&self.key);
        for s in [&self.branch, &self.from] {
            match s {
                Some(s) => e.u8(1).bytes(s.as_bytes()),
                None => e.u8(0),
            };
        }
        e.hash(&self.uid).varint(self.bases.len() as u64);
        for b in &self.bases {
            e.hash(b);
        }
        if let Some(seal) = &self.seal {
            seal.encode_fields(&mut e);
        }
        e.finish()
    }

    /// Decodes and checks an encoding; anything but the canonical bytes is refused.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "bucket mutation");
        let version = d.version(&[MUTATION_VERSION, SEALED_MUTATION_VERSION])?;
        let kind = MutationKind::from_code(d.u8()?)?;
        let key = d.bytes()?;
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(Error::decode("mutation key is empty or too long"));
        }
        let key = key.to_vec();
        let mut names = [None, None];
        for n in &mut names {
            *n = match d.u8()? {
                0 => None,
                1 => {
                    let s = d.str()?;
                    if s.is_empty() || s.len() > MAX_BRANCH {
                        return Err(Error::decode("mutation branch is empty or too long"));
                    }
                    Some(s.to_string())
                }
                other => return Err(Error::decode(format!("bad option tag {other}"))),
            };
        }
        let [branch, from] = names;
        let uid = d.hash()?;
        let n = d.count(33)?;
        if n > MAX_BASES {
            return Err(Error::decode("mutation names too many bases"));
        }
        let mut bases = Vec::with_capacity(n);
        for _ in 0..n {
            bases.push(d.hash()?);
        }
        let seal = match version {
            SEALED_MUTATION_VERSION => Some(OwnerSeal::decode_fields(&mut d)?),
            _ => None,
        };
        d.finish()?;
        let m = Mutation {
            kind,
            key,
            branch,
            from,
            uid,
            bases,
            seal,
        };
        m.check_shape()?;
        Ok(m)
    }

    /// The fields each kind needs are there, and the others are not.
    fn check_shape(&self) -> Result<()> {
        if self.bases.len() > MAX_BASES {
            return Err(Error::decode(format!(
                "a mutation with {} bases (at most {MAX_BASES})",
                self.bases.len()
            )));
        }
        if self.seal.is_some() && self.kind != MutationKind::Put {
            return Err(Error::decode(format!(
                "a {} mutation with an owner seal (only puts are sealed)",
                self.kind.name()
            )));
        }
        if self.seal.is_some_and(|s| s.names_base) && self.bases.len() != 1 {
            return Err(Error::decode(format!(
                "a put sealed on its one base names {} bases",
                self.bases.len()
            )));
        }
        let ok = match self.kind {
            MutationKind::Put | MutationKind::Merge => self.from.is_none(),
            MutationKind::Fork => {
                self.branch.is_some() && self.from.is_none() && self.bases.is_empty()
            }
            // Without a branch: an untagged head a merge found contained in its target.
            MutationKind::Remove => self.from.is_none() && self.bases.is_empty(),
            MutationKind::Rename => {
                self.branch.is_some() && self.from.is_some() && self.bases.is_empty()
            }
        };
        if ok {
            Ok(())
        } else {
            Err(Error::decode(format!(
                "a {} mutation with the wrong fields",
                self.kind.name()
            )))
        }
    }
}

/// The proof that a bucket's writer made version `uid` of a key: the record naming it and
/// the hash chain from that record to a writer signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionProof {
    /// The record whose body is the mutation that created the version.
    pub record: Record,
    /// The chain from that record to a signed one.
    pub proof: RecordProof,
    /// The version's FObject (its Meta chunk, which hashes to the uid), carried when the
    /// record has an owner seal so that a reader can check the seal against the value.
    pub object: Option<Vec<u8>>,
}

impl VersionProof {
    /// Checks the proof against the capsule `meta` describes (the caller checks that `meta`
    /// hashes to the capsule name it trusts, e.g. with [`crate::Reader::new`]): the record
    /// belongs to the capsule, its body matches its header, the body is a mutation that
    /// created version `uid` of `key`, and the chain reaches a valid writer signature.
    /// Returns the mutation and the names on the chain, the record first.
    pub fn verify(
        &self,
        meta: &CapsuleMetadata,
        key: &[u8],
        uid: &Uid,
    ) -> Result<(Mutation, Vec<RecordName>)> {
        if meta.cipher != BodyCipher::Plaintext {
            return Err(Error::Rejected(
                "a bucket capsule stores its mutations in plaintext; this one does not".into(),
            ));
        }
        let name = self.record.name();
        if self.record.header.capsule != meta.name() {
            return Err(Error::Rejected(format!(
                "record {name} belongs to capsule {}, not {}",
                self.record.header.capsule,
                meta.name()
            )));
        }
        self.record.check_body()?;
        let m = Mutation::decode(&self.record.body)
            .map_err(|e| Error::Rejected(format!("record {name} is not a mutation: {e}")))?;
        if !m.creates_version() || m.uid != *uid || m.key != key {
            return Err(Error::Rejected(format!(
                "record {name} is a {} of another version or key, not the one that made {uid}",
                m.kind.name()
            )));
        }
        let names = self.proof.verify(meta, &name, |_| false)?;
        if let Some(chunk) = &self.object
            && meta.algo.digest(chunk) != *uid
        {
            return Err(Error::Rejected(format!(
                "the FObject this proof carries does not hash to version {uid}"
            )));
        }
        Ok((m, names))
    }

    /// The bucket owner's seal on the put that made version `uid`, checked, when its
    /// record carries one: `Ok(Some((owner, seal)))` when the owner `meta` names
    /// ([`crate::seal::OWNER_SETTING`]) sealed exactly the version's key, value, context
    /// and branch (and base, when the seal names one); `Ok(None)` when the record has no
    /// seal (the node recorded the version alone). Call after [`Self::verify`] accepted
    /// the proof for `key` and `uid`, with the mutation it returned. A seal that does not
    /// verify, or a sealed record whose proof carries no FObject, is [`Error::Rejected`].
    pub fn owner_seal(
        &self,
        meta: &CapsuleMetadata,
        m: &Mutation,
        uid: &Uid,
    ) -> Result<Option<(PublicKey, OwnerSeal)>> {
        let Some(seal) = m.seal else {
            return Ok(None);
        };
        let owner = bucket_owner(meta)?.ok_or_else(|| {
            Error::Rejected(format!(
                "version {uid}'s record carries an owner seal, but capsule {} names no owner \
                 key",
                meta.name()
            ))
        })?;
        let chunk = self.object.as_deref().ok_or_else(|| {
            Error::Rejected(format!(
                "version {uid}'s record carries an owner seal, but the proof does not carry \
                 the version to check it against"
            ))
        })?;
        if meta.algo.digest(chunk) != *uid {
            return Err(Error::Rejected(format!(
                "the FObject this proof carries does not hash to version {uid}"
            )));
        }
        let object = FObject::from_chunk(chunk)
            .map_err(|e| Error::Rejected(format!("the FObject of version {uid}: {e}")))?;
        if object.key[..] != m.key[..] || object.bases != m.bases {
            return Err(Error::Rejected(format!(
                "version {uid} has another key or other bases than its record names"
            )));
        }
        seal.verify_put(
            &owner,
            &meta.name(),
            m.branch.as_deref(),
            &object,
            meta.algo,
        )?;
        Ok(Some((owner, seal)))
    }

    /// The canonical encoding (what `cairn verify --proof --out` writes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut e = Encoder::versioned(match self.object {
            Some(_) => OBJECT_VERSION_PROOF_VERSION,
            None => VERSION_PROOF_VERSION,
        });
        e.bytes(&self.record.header.encode())
            .bytes(&self.record.body)
            .bytes(&self.proof.to_bytes());
        if let Some(o) = &self.object {
            e.bytes(o);
        }
        e.finish()
    }

    /// Decodes an encoding (checks nothing but the format: call [`VersionProof::verify`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, "version proof");
        let version = d.version(&[VERSION_PROOF_VERSION, OBJECT_VERSION_PROOF_VERSION])?;
        let header = RecordHeader::decode(d.bytes()?)?;
        let body = d.bytes()?.to_vec();
        let proof = RecordProof::from_bytes(d.bytes()?)?;
        let object = match version {
            OBJECT_VERSION_PROOF_VERSION => Some(d.bytes()?.to_vec()),
            _ => None,
        };
        d.finish()?;
        Ok(VersionProof {
            record: Record { header, body },
            proof,
            object,
        })
    }
}

/// The ref that maps a bucket name to its capsule.
fn capsule_ref(bucket: &str) -> Vec<u8> {
    format!("bucket-capsule/{bucket}").into_bytes()
}

/// The capsule of bucket `bucket` in `store`, if it has one yet (read without opening the
/// bucket, which would make one for a writer).
pub fn bucket_capsule(store: &dyn cairn_store::Store, bucket: &str) -> Result<Option<CapsuleName>> {
    match store.get_ref(&capsule_ref(bucket))? {
        Some(v) => Ok(Some(CapsuleName(Hash::from_bytes(&v).map_err(|e| {
            Error::corrupt(format!("capsule ref of bucket {bucket}: {e}"))
        })?))),
        None => Ok(None),
    }
}

/// One queued record and the slot its mutation waits on.
struct Queued {
    record: Record,
    mutation: Mutation,
    done: Arc<Mutex<Option<Result<RecordName>>>>,
}

/// The writer side: records are built here in order and written in groups.
struct Chain {
    writer: Writer,
    queue: Vec<Queued>,
    writing: bool,
}

/// The versions of a bucket: those a proven record of its capsule created. The bucket's
/// Db takes only these where a caller names a version by uid ([`VersionMembership`]), and
/// proofs are found through the same index.
struct BucketVersions {
    server: Arc<CapsuleServer>,
    /// The bucket's capsule (none yet: no versions).
    capsule: Option<CapsuleName>,
    bucket: String,
    /// uid → the record that created it; built on first use from the capsule.
    index: Mutex<Option<VersionIndex>>,
}

/// [`BucketVersions`]' index.
struct VersionIndex {
    /// uid → the record that created it.
    map: HashMap<Uid, (RecordName, bool)>,
    /// Proven records found damaged when the index was built (left out of it, so that one
    /// flipped bit does not cost every lookup: a uid not found then may be one of theirs).
    damaged: Vec<RecordName>,
    /// Those among `damaged` a copy from a peer (or written again) may repair: holes in the
    /// capsule (header lost at load) and records whose body was found damaged. Once one
    /// is readable again, the index is built again.
    holes: Vec<RecordName>,
}

impl BucketVersions {
    /// Notes the versions `records` created, once the capsule holds them (only when the
    /// index was built: a later build reads them from the capsule).
    fn note<'a>(&self, records: impl IntoIterator<Item = (&'a Mutation, RecordName)>) {
        if let Some(index) = self.index.lock().as_mut() {
            for (m, name) in records {
                if m.creates_version() {
                    offer(&mut index.map, m, name);
                }
            }
        }
    }

    /// Reads a record of the bucket's capsule and decodes its mutation.
    fn mutation(&self, capsule: &CapsuleName, name: &RecordName) -> Result<(Record, Mutation)> {
        let record = self.server.read(capsule, name)?;
        if record.name() != *name || record.header.capsule != *capsule {
            return Err(Error::corrupt(format!(
                "record {name} read back as another"
            )));
        }
        record.check_body()?;
        let m = Mutation::decode(&record.body)
            .map_err(|e| Error::corrupt(format!("record {name} of bucket {}: {e}", self.bucket)))?;
        Ok((record, m))
    }

    /// The record that created version `uid`, if any (the index is built from the capsule
    /// on first use and kept up to date by later mutations).
    fn record_of(&self, uid: &Uid) -> Result<Option<RecordName>> {
        let Some(capsule) = self.capsule else {
            return Ok(None);
        };
        let mut index = self.index.lock();
        if index.is_none() {
            // Proven records only: an unsigned record (anyone may write one) claiming a
            // uid must not stand for the writer's.
            let (order, mut damaged) = self.server.with_dag(&capsule, |d| {
                (
                    d.order()
                        .iter()
                        .filter(|n| d.is_proven(n))
                        .copied()
                        .collect::<Vec<_>>(),
                    // Records whose header could not be read back at load are damaged too.
                    d.damaged().copied().collect::<Vec<_>>(),
                )
            })?;
            let mut holes = damaged.clone();
            let mut map = HashMap::with_capacity(order.len());
            for name in order {
                // A damaged record is left out (and named when a uid is not found), not
                // the end of the build: one flipped bit made every lookup by uid, and
                // every proof of the bucket, fail. Other errors (the store unavailable)
                // end it, and the next lookup builds again.
                let m = match self.mutation(&capsule, &name) {
                    Ok((_, m)) => m,
                    Err(Error::Corrupt(_)) => {
                        damaged.push(name);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if m.creates_version() {
                    offer(&mut map, &m, name);
                }
            }
            // The read above noted a damaged body with the capsule (see
            // `CapsuleDag::body_damaged`); any other failure (a body that does not decode)
            // no copy will change.
            let body_damaged: Vec<RecordName> = self.server.with_dag(&capsule, |d| {
                damaged
                    .iter()
                    .filter(|n| d.is_body_damaged(n))
                    .copied()
                    .collect()
            })?;
            holes.extend(body_damaged);
            *index = Some(VersionIndex {
                map,
                damaged,
                holes,
            });
        }
        // A record left out as damaged may have been filled or repaired since (a copy
        // from a peer):
        // then the index is built again, once, before a miss is answered.
        if let Some(ix) = index.as_ref()
            && !ix.map.contains_key(uid)
            && !ix.holes.is_empty()
            && self.server.with_dag(&capsule, |d| {
                ix.holes
                    .iter()
                    .any(|n| d.contains(n) && !d.is_body_damaged(n))
            })?
        {
            *index = None;
            drop(index);
            return self.record_of(uid);
        }
        let Some(index) = index.as_ref() else {
            return Ok(None);
        };
        match index.map.get(uid) {
            Some((name, _)) => Ok(Some(*name)),
            None if !index.damaged.is_empty() => Err(Error::corrupt(format!(
                "no record of bucket {} names version {uid}, but {} of its records are \
                 damaged (the first {}): it may be one of theirs",
                self.bucket,
                index.damaged.len(),
                index.damaged[0]
            ))),
            None => Ok(None),
        }
    }
}

/// Takes record `name` of mutation `m` as the one that made its version: the first, unless
/// a later one carries the owner's seal and the first does not (the same put made again,
/// sealed, makes the same uid; its proof should show the seal).
fn offer(map: &mut HashMap<Uid, (RecordName, bool)>, m: &Mutation, name: RecordName) {
    let sealed = m.seal.is_some();
    match map.entry(m.uid) {
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert((name, sealed));
        }
        std::collections::hash_map::Entry::Occupied(mut e) if sealed && !e.get().1 => {
            e.insert((name, true));
        }
        std::collections::hash_map::Entry::Occupied(_) => {}
    }
}

impl VersionMembership for BucketVersions {
    fn holds(&self, uid: &Uid) -> Result<bool> {
        self.record_of(uid).map(|r| r.is_some())
    }
}

/// A writable bucket's capsule journal: the [`HeadRecorder`] of the bucket's Db, which
/// appends one record per mutation before the Db commits it.
struct Journal {
    server: Arc<CapsuleServer>,
    capsule: CapsuleName,
    chain: Mutex<Chain>,
    written: Condvar,
    /// The bucket's versions, told of each group written.
    versions: Arc<BucketVersions>,
    /// The owner key the capsule's metadata names ([`crate::seal::OWNER_SETTING`]),
    /// whose seals a put may carry; `Err` (its message) when the setting is not a key.
    owner: std::result::Result<Option<PublicKey>, String>,
    /// The bucket's hash algorithm (of the value digests seals name).
    algo: HashAlgo,
}

impl HeadRecorder for Journal {
    fn record(&self, c: &HeadChange<'_>) -> Result<()> {
        self.append(self.mutation(c)?).map(|_| ())
    }

    /// The records go out in one group (one capsule write), so all or none are written.
    fn record_all(&self, changes: &[HeadChange<'_>]) -> Result<()> {
        let ms = changes
            .iter()
            .map(|c| self.mutation(c))
            .collect::<Result<Vec<_>>>()?;
        self.append_all(ms).map(|_| ())
    }
}

impl Journal {
    /// The record body of `c`, with its owner seal checked.
    fn mutation(&self, c: &HeadChange<'_>) -> Result<Mutation> {
        let kind = match c.kind {
            HeadChangeKind::Put => MutationKind::Put,
            HeadChangeKind::Fork => MutationKind::Fork,
            HeadChangeKind::Merge => MutationKind::Merge,
            HeadChangeKind::Rename => MutationKind::Rename,
            HeadChangeKind::Remove => MutationKind::Remove,
        };
        let m = Mutation {
            kind,
            key: c.key.to_vec(),
            branch: c.branch.map(str::to_string),
            from: c.from.map(str::to_string),
            uid: c.uid,
            bases: c.bases.to_vec(),
            seal: match c.owner_seal {
                Some(bytes) => Some(self.check_seal(c, bytes)?),
                None => None,
            },
        };
        // A record that would not decode must not be written (the change is refused).
        m.check_shape()?;
        Ok(m)
    }

    /// The owner seal `bytes` a put carries, checked against the version it made
    /// ([`Error::InvalidInput`] when malformed, [`Error::Rejected`] when it is not the
    /// owner's seal of this put): nothing is recorded or committed otherwise.
    fn check_seal(&self, c: &HeadChange<'_>, bytes: &[u8]) -> Result<OwnerSeal> {
        let seal = OwnerSeal::decode(bytes)
            .map_err(|e| Error::invalid(format!("the owner seal is malformed: {e}")))?;
        let object = match (c.kind, c.object) {
            (HeadChangeKind::Put, Some(o)) => o,
            _ => {
                return Err(Error::invalid(
                    "an owner seal can only be given with a put of a new version",
                ));
            }
        };
        let owner = match &self.owner {
            Ok(Some(k)) => k,
            Ok(None) => {
                return Err(Error::Rejected(format!(
                    "the bucket's capsule {} names no owner key, so no owner seal can be \
                     checked",
                    self.capsule
                )));
            }
            Err(why) => return Err(Error::Rejected(why.clone())),
        };
        seal.verify_put(owner, &self.capsule, c.branch, object, self.algo)?;
        Ok(seal)
    }

    /// Appends the record of `m` and returns once it is durable (or failed). Records queued
    /// while another thread writes go out together in the next group.
    fn append(&self, m: Mutation) -> Result<RecordName> {
        let mut names = self.append_all(vec![m])?;
        names
            .pop()
            .ok_or_else(|| Error::invalid("no record was appended"))
    }

    /// [`Self::append`] for several mutations, queued together so that they go out in one
    /// group: all are written or none.
    fn append_all(&self, ms: Vec<Mutation>) -> Result<Vec<RecordName>> {
        let capsule = self.capsule;
        let mut c = self.chain.lock();
        let mut dones = Vec::with_capacity(ms.len());
        let mut queued = Vec::with_capacity(ms.len());
        // (Only several records need it: one that cannot be made never moved the chain.)
        let mark = (ms.len() > 1).then(|| c.writer.chain_mark());
        for m in ms {
            let done = Arc::new(Mutex::new(None));
            let record = match c.writer.record(&m.encode(), &[]) {
                Ok(r) => r,
                Err(e) => {
                    // None is queued: the chain goes back to where it stood, or the next
                    // record would point at records never written (a hole for ever).
                    if let Some(mark) = mark {
                        c.writer.rewind(mark);
                    }
                    return Err(e);
                }
            };
            queued.push(Queued {
                record,
                mutation: m,
                done: done.clone(),
            });
            dones.push(done);
        }
        c.queue.extend(queued);
        let mut names = Vec::with_capacity(dones.len());
        loop {
            while let Some(done) = dones.get(names.len()) {
                match done.lock().take() {
                    Some(r) => names.push(r?),
                    None => break,
                }
            }
            if names.len() == dones.len() {
                return Ok(names);
            }
            if c.writing {
                self.written.wait(&mut c);
                continue;
            }
            // Nobody is writing: write every queued record as one group.
            c.writing = true;
            let group = std::mem::take(&mut c.queue);
            let last = group[group.len() - 1].record.name();
            let sig = c.writer.sign(&last);
            drop(c);
            let records: Vec<Record> = group.iter().map(|q| q.record.clone()).collect();
            // A panic in the write fails the group like an error: `writing` must be reset
            // and the waiters woken, or every later writer of the bucket (holding its key
            // lock and the writers' lock) would wait forever.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.server
                    .write_unacked(&capsule, &records, &[(last, sig)], true)
            }))
            .unwrap_or_else(|_| {
                Err(Error::Unavailable(
                    "writing to the bucket's capsule panicked".into(),
                ))
            });
            if result.is_ok() {
                self.versions
                    .note(group.iter().map(|q| (&q.mutation, q.record.name())));
            }
            for q in &group {
                *q.done.lock() = Some(match &result {
                    Ok(_) => Ok(q.record.name()),
                    Err(e) => Err(nothing_committed(
                        e,
                        format!(
                            "the record of this {} (version {}) could not be written to the \
                             bucket's capsule, so nothing was committed",
                            q.mutation.kind.name(),
                            q.mutation.uid
                        ),
                    )),
                });
            }
            c = self.chain.lock();
            if let Err(e) = &result {
                // Records queued meanwhile point back at the group the capsule never got:
                // they fail too (their mutations commit nothing), and later records start
                // from the capsule's heads.
                for q in std::mem::take(&mut c.queue) {
                    *q.done.lock() = Some(Err(nothing_committed(
                        e,
                        format!(
                            "the record of this {} (version {}) followed one the bucket's \
                             capsule could not take, so nothing was committed",
                            q.mutation.kind.name(),
                            q.mutation.uid
                        ),
                    )));
                }
                // The next record must not point at what the capsule never got (a hole
                // forever): at its proven heads, or at nothing when they cannot be read.
                match self.server.with_dag(&capsule, |d| d.proven_heads()) {
                    Ok(heads) => c.writer.continue_from(&heads),
                    Err(_) => c.writer.continue_from(&[]),
                }
            }
            c.writing = false;
            self.written.notify_all();
        }
    }
}

/// The POS-tree configuration of the bucket whose capsule `meta` describes: its
/// [`LEAF_SIZE_SETTING`], or the 4 KiB default for a bucket created without one. Only the
/// leaf size is per bucket; index nodes always use the default target, so the
/// configuration depends on the metadata alone, never on the process that opens it.
fn bucket_tree_config(bucket: &str, meta: &CapsuleMetadata) -> Result<TreeConfig> {
    let cfg = TreeConfig::default();
    let Some(v) = meta.settings.get(LEAF_SIZE_SETTING) else {
        return Ok(cfg);
    };
    let why = match v.parse::<u64>() {
        Ok(n) => match cfg.with_leaf_target(n) {
            Ok(cfg) => return Ok(cfg),
            Err(Error::InvalidInput(m)) => m,
            Err(e) => e.to_string(),
        },
        Err(_) => "not a number of bytes".to_string(),
    };
    Err(Error::invalid(format!(
        "bucket {bucket}: metadata setting {LEAF_SIZE_SETTING} = {v:?} is unusable: {why}"
    )))
}

/// A bucket of objects whose every mutation is a signed record of its capsule.
pub struct Bucket {
    /// The bucket's Db; with a writer, its recorder is `journal`.
    db: Db,
    server: Arc<CapsuleServer>,
    meta: Option<CapsuleMetadata>,
    journal: Option<Arc<Journal>>,
    versions: Arc<BucketVersions>,
}

impl Bucket {
    /// Opens bucket `db.bucket()` of `db`'s store, whose capsules `server` keeps (over the
    /// same store). With a `writer` key the bucket accepts mutations: its capsule is created
    /// on first open with that key as the one writer, and a later open with a key that is
    /// not one of the capsule's writers is refused. Without one the bucket is read-only.
    pub fn open(db: Db, server: Arc<CapsuleServer>, writer: Option<SigningKey>) -> Result<Self> {
        Self::open_inner(db, server, writer, None)
    }

    /// [`Bucket::open`] for a bucket whose capsule, if it does not exist yet, is created from
    /// `meta` (e.g. to list several writers). `meta` must use plaintext bodies, the Db's hash
    /// algorithm and name this bucket in its [`BUCKET_SETTING`]; an existing capsule must be
    /// the one `meta` names.
    pub fn open_with_metadata(
        db: Db,
        server: Arc<CapsuleServer>,
        writer: Option<SigningKey>,
        meta: CapsuleMetadata,
    ) -> Result<Self> {
        let bucket = db.bucket();
        if meta.cipher != BodyCipher::Plaintext
            || meta.algo != db.algo()
            || meta.settings.get(BUCKET_SETTING).map(String::as_str) != Some(bucket)
        {
            return Err(Error::invalid(format!(
                "bucket {bucket} metadata must use plaintext bodies, hash with {} and set \
                 {BUCKET_SETTING} = {bucket}",
                db.algo()
            )));
        }
        Self::open_inner(db, server, writer, Some(meta))
    }

    fn open_inner(
        db: Db,
        server: Arc<CapsuleServer>,
        writer: Option<SigningKey>,
        wanted: Option<CapsuleMetadata>,
    ) -> Result<Self> {
        let bucket = db.bucket().to_string();
        check_bucket_name(&bucket)?;
        let store = db.store().clone();
        let capsule = match store.get_ref(&capsule_ref(&bucket))? {
            Some(v) => Some(CapsuleName(Hash::from_bytes(&v).map_err(|e| {
                Error::corrupt(format!("capsule ref of bucket {bucket}: {e}"))
            })?)),
            None => None,
        };
        let meta = match (capsule, &writer) {
            (Some(c), _) => {
                // Read the metadata chunk alone (named by the capsule name), so read-only
                // opens never replay the capsule's journal.
                let bytes = store.get(c.hash())?.ok_or_else(|| {
                    Error::corrupt(format!(
                        "metadata of capsule {c} (bucket {bucket}) is missing"
                    ))
                })?;
                let meta = CapsuleMetadata::decode(&bytes)?;
                if let Some(w) = &wanted
                    && w.name() != c
                {
                    return Err(Error::invalid(format!(
                        "bucket {bucket} already has capsule {c}, not {}",
                        w.name()
                    )));
                }
                if meta.name() != c {
                    return Err(Error::corrupt(format!(
                        "metadata of capsule {c} (bucket {bucket}) does not hash to its name"
                    )));
                }
                Some(meta)
            }
            (None, Some(key)) => {
                let meta = match wanted {
                    Some(m) => m,
                    None => {
                        let mut meta = CapsuleMetadata::new(
                            db.algo(),
                            key.public(),
                            format!("bucket {bucket}"),
                        );
                        meta.cipher = BodyCipher::Plaintext;
                        meta.key_distribution = "none: mutation records are plaintext".into();
                        meta.settings
                            .insert(BUCKET_SETTING.to_string(), bucket.clone());
                        meta.settings.insert(
                            LEAF_SIZE_SETTING.to_string(),
                            db.tree_config().leaf_target.to_string(),
                        );
                        meta
                    }
                };
                // Refuse an unusable leaf size before anything is created.
                bucket_tree_config(&bucket, &meta)?;
                server.create(&meta)?;
                store.commit(&[cairn_store::RefUpdate::Set {
                    name: capsule_ref(&bucket),
                    value: meta.name().hash().to_bytes().to_vec(),
                }])?;
                Some(meta)
            }
            (None, None) => None,
        };
        let db = match &meta {
            // A writer builds values, so it needs the bucket's own leaf size.
            Some(meta) if writer.is_some() => {
                db.with_tree_config(bucket_tree_config(&bucket, meta)?)
            }
            // Reads need no configuration (a tree records its own boundaries): a setting
            // this version cannot use must not make the bucket unreadable.
            Some(meta) => {
                db.with_tree_config(bucket_tree_config(&bucket, meta).unwrap_or_default())
            }
            None => db,
        };
        let versions = Arc::new(BucketVersions {
            server: server.clone(),
            capsule: meta.as_ref().map(CapsuleMetadata::name),
            bucket: db.bucket().to_string(),
            index: Mutex::new(None),
        });
        let journal = match (&meta, writer) {
            (Some(meta), Some(key)) => {
                let public = key.public();
                let mut w = Writer::new(meta.clone(), key, None).map_err(|_| {
                    // Refused like a node refuses a request signed by a key that is not
                    // the bucket's: the signature would not be accepted.
                    Error::Rejected(format!(
                        "key {public} is not a writer of bucket {bucket} (capsule {}); \
                         writers: {}",
                        meta.name(),
                        meta.writers
                            .iter()
                            .map(|k| k.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
                // Only proven heads: anyone may write unsigned records to a capsule, and
                // the writer's next signature vouches for every record it points to.
                let heads = server.with_dag(&meta.name(), |d| d.proven_heads())?;
                w.continue_from(&heads);
                Some(Arc::new(Journal {
                    server: server.clone(),
                    capsule: meta.name(),
                    chain: Mutex::new(Chain {
                        writer: w,
                        queue: Vec::new(),
                        writing: false,
                    }),
                    written: Condvar::new(),
                    versions: versions.clone(),
                    owner: bucket_owner(meta).map_err(|e| e.to_string()),
                    algo: meta.algo,
                }))
            }
            _ => None,
        };
        let db = match &journal {
            Some(j) => db.with_recorder(j.clone()),
            None => db,
        };
        let db = db.with_members(versions.clone());
        Ok(Bucket {
            db,
            server,
            meta,
            journal,
            versions,
        })
    }

    /// The object engine (reads, history, diff, verify; write through the bucket).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The capsule server keeping this bucket's capsule.
    pub fn server(&self) -> &Arc<CapsuleServer> {
        &self.server
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        self.db.bucket()
    }

    /// The capsule's metadata (`None` while no writer has opened the bucket yet).
    pub fn metadata(&self) -> Option<&CapsuleMetadata> {
        self.meta.as_ref()
    }

    /// The capsule's name (`None` while no writer has opened the bucket yet).
    pub fn capsule(&self) -> Option<CapsuleName> {
        self.meta.as_ref().map(|m| m.name())
    }

    fn check_writable(&self) -> Result<()> {
        match self.journal {
            Some(_) => Ok(()),
            None => Err(Error::invalid(format!(
                "bucket {} is open read-only (no writer key): mutations need one",
                self.name()
            ))),
        }
    }

    /// [`Db::put`], recorded.
    pub fn put(
        &self,
        key: &[u8],
        target: Target<'_>,
        value: NewValue,
        opts: &PutOptions,
    ) -> Result<Uid> {
        self.check_writable()?;
        self.db.put(key, target, value, opts)
    }

    /// [`Db::put_blob_stream`], recorded.
    pub fn put_blob_stream(
        &self,
        key: &[u8],
        target: Target<'_>,
        reader: &mut dyn Read,
        opts: &PutOptions,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Uid> {
        self.check_writable()?;
        self.db.put_blob_stream(key, target, reader, opts, progress)
    }

    /// [`Db::put_blob_stream_then`], recorded.
    pub fn put_blob_stream_then(
        &self,
        key: &[u8],
        target: Target<'_>,
        reader: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
        before_commit: &mut dyn FnMut() -> Result<PutOptions>,
    ) -> Result<Uid> {
        self.check_writable()?;
        self.db
            .put_blob_stream_then(key, target, reader, progress, before_commit)
    }

    /// [`Db::put_list_stream`], recorded.
    pub fn put_list_stream(
        &self,
        key: &[u8],
        target: Target<'_>,
        elements: &mut dyn Iterator<Item = Result<Vec<u8>>>,
        opts: &PutOptions,
    ) -> Result<Uid> {
        self.check_writable()?;
        self.db.put_list_stream(key, target, elements, opts)
    }

    /// [`Db::update`] (a type operation), recorded as a put.
    pub fn update(&self, key: &[u8], target: Target<'_>, op: Op, opts: &PutOptions) -> Result<Uid> {
        self.check_writable()?;
        self.db.update(key, target, op, opts)
    }

    /// [`Db::fork`], recorded.
    pub fn fork(&self, key: &[u8], from: &At, new_branch: &str) -> Result<Uid> {
        self.check_writable()?;
        self.db.fork(key, from, new_branch)
    }

    /// [`Db::merge_into`], recorded when it moved the branch.
    pub fn merge_into(
        &self,
        key: &[u8],
        into: &str,
        from: &At,
        resolver: &dyn Resolver,
        opts: &PutOptions,
    ) -> Result<MergeOutcome> {
        self.check_writable()?;
        self.db.merge_into(key, into, from, resolver, opts)
    }

    /// [`Db::merge_untagged`], recorded when it made a version.
    pub fn merge_untagged(
        &self,
        key: &[u8],
        uids: &[Uid],
        resolver: &dyn Resolver,
        opts: &PutOptions,
    ) -> Result<MergeOutcome> {
        self.check_writable()?;
        self.db.merge_untagged(key, uids, resolver, opts)
    }

    /// [`Db::rename`], recorded.
    pub fn rename(&self, key: &[u8], from: &str, to: &str) -> Result<Uid> {
        self.check_writable()?;
        self.db.rename(key, from, to)
    }

    /// [`Db::remove`], recorded.
    pub fn remove(&self, key: &[u8], branch: &str) -> Result<Uid> {
        self.remove_guarded(key, branch, None)
    }

    /// [`Bucket::remove`] only if the branch's head is `guard` (when given; see
    /// [`Db::remove_guarded`]).
    pub fn remove_guarded(&self, key: &[u8], branch: &str, guard: Option<&Uid>) -> Result<Uid> {
        self.check_writable()?;
        self.db.remove_guarded(key, branch, guard)
    }

    /// Reads a record of the bucket's capsule and decodes its mutation.
    fn mutation(&self, capsule: &CapsuleName, name: &RecordName) -> Result<(Record, Mutation)> {
        self.versions.mutation(capsule, name)
    }

    /// The record that created version `uid`, if any (the index is built from the capsule
    /// on first use and kept up to date by later mutations).
    pub fn record_of(&self, uid: &Uid) -> Result<Option<RecordName>> {
        self.versions.record_of(uid)
    }

    /// The proof that this bucket's writer created version `uid` of `key`.
    pub fn prove(&self, key: &[u8], uid: &Uid) -> Result<VersionProof> {
        let capsule = self.capsule().ok_or_else(|| {
            Error::not_found(format!(
                "a proof: bucket {} has no capsule yet (no mutation was recorded)",
                self.name()
            ))
        })?;
        // A version that does not exist at all is just that, not a missing record.
        self.db().load(uid)?;
        let name = self.record_of(uid)?.ok_or_else(|| {
            Error::not_found(format!(
                "a record of bucket {} that created version {uid} (the version predates the \
                 bucket's capsule, or its write was never acknowledged)",
                self.name()
            ))
        })?;
        let (record, m) = self.mutation(&capsule, &name)?;
        if m.key != key {
            return Err(Error::not_found(format!(
                "version {uid} in key {:?}: the bucket's record names key {:?}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&m.key)
            )));
        }
        let proof = self.server.prove(&capsule, &name, None)?.proof;
        // A sealed put's proof carries the version, to check the seal against.
        let object = match m.seal {
            Some(_) => Some(self.db().load(uid)?.to_chunk()),
            None => None,
        };
        Ok(VersionProof {
            record,
            proof,
            object,
        })
    }
}

/// The error of a mutation whose record the capsule did not take because of `cause`
/// (shared by a group, so rebuilt for each member): an I/O error stays one of the same
/// kind, so a full disk is still told apart from other failures (the node answers 507);
/// anything else is [`Error::Unavailable`]. `what` says what was not committed.
fn nothing_committed(cause: &Error, what: String) -> Error {
    match cause {
        Error::Io { context, source } => Error::io(
            format!("{what} ({context})"),
            std::io::Error::new(source.kind(), source.to_string()),
        ),
        other => Error::Unavailable(format!("{what}: {other}")),
    }
}
