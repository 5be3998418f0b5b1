//! Client side of a capsule: the [`Writer`] (seals bodies, links records, signs) and the
//! [`Reader`] (verifies proofs against the capsule metadata and its own verification cache,
//! opens bodies). Neither does I/O: they build and check values that travel to and from a
//! [`crate::server::CapsuleServer`] however the caller likes.

use cairn_core::{Error, Hash, Result, SigningKey};

use crate::cache::{CachePolicy, MirrorMode, VerificationCache};
use crate::metadata::{CapsuleMetadata, CapsuleName};
use crate::proof::{
    DOMAIN_RECORD, RecordProof, SubrecordProof, SubrecordsProof, WriterSignature, subrecord_name,
    subrecord_root,
};
use crate::record::{
    BodyCrypto, BodyKey, BodyRef, Record, RecordHeader, RecordName, SealedSubrecords,
};

/// Builds, seals and signs records for one capsule as one of its writers.
pub struct Writer {
    meta: CapsuleMetadata,
    capsule: CapsuleName,
    key: SigningKey,
    index: u32,
    crypto: BodyCrypto,
    /// The records written so far that skip pointers may reach, newest last (at most 1024).
    recent: Vec<RecordName>,
    count: u64,
    skip_pointers: bool,
    pending: SealedSubrecords,
}

impl Writer {
    /// A writer for the capsule `meta` describes; `key` must be one of its writers.
    pub fn new(meta: CapsuleMetadata, key: SigningKey, body_key: Option<BodyKey>) -> Result<Self> {
        let index = meta.writer_index(&key.public()).ok_or_else(|| {
            Error::invalid(format!(
                "key {} is not a writer of this capsule",
                key.public()
            ))
        })?;
        let capsule = meta.name();
        let crypto = BodyCrypto::new(meta.cipher, body_key.as_ref(), &capsule);
        Ok(Writer {
            meta,
            capsule,
            key,
            index,
            crypto,
            recent: Vec::new(),
            count: 0,
            skip_pointers: false,
            pending: SealedSubrecords::new(),
        })
    }

    /// Also point each record at the records 2, 4, 8, … 1024 back when its sequence number
    /// is a multiple of that distance, so any record is O(log n) hops from a later signed
    /// one (DCS §3.1's "additional backpointers").
    pub fn with_skip_pointers(mut self, on: bool) -> Self {
        self.skip_pointers = on;
        self
    }

    /// Continues after `heads`, which the next record points to, all of them (whatever
    /// this writer wrote before). Its signature will vouch for each of them, so pass only
    /// heads this process holds or verified ([`Reader::verify_record`]): a server's word
    /// alone would let it have a record it made up signed by this writer.
    ///
    /// At most half of [`crate::record::MAX_BACKPOINTERS`] heads are taken (the first, in
    /// the order given), so the next record stays within the limit with its skip pointers
    /// and a merge's extra backpointers; the others stay heads, for a later record.
    pub fn continue_from(&mut self, heads: &[RecordName]) {
        // Each once (a header with a repeated backpointer is refused by every server, and
        // the chain would have gone on from it).
        let mut seen = std::collections::HashSet::with_capacity(heads.len());
        self.recent = heads
            .iter()
            .filter(|h| seen.insert(**h))
            .take(crate::record::MAX_BACKPOINTERS / 2)
            .copied()
            .collect();
        self.count = 0;
    }

    /// The capsule name.
    pub fn capsule(&self) -> CapsuleName {
        self.capsule
    }

    /// The capsule metadata.
    pub fn meta(&self) -> &CapsuleMetadata {
        &self.meta
    }

    /// The next record's backpointers: the previous record (or all heads continued from),
    /// skip pointers, then `extra`.
    fn backpointers(&self, extra: &[RecordName]) -> Vec<RecordName> {
        let mut bp = self.chain_pointers();
        for e in extra {
            if !bp.contains(e) {
                bp.push(*e);
            }
        }
        bp
    }

    fn chain_pointers(&self) -> Vec<RecordName> {
        let mut bp = Vec::new();
        let n = self.recent.len();
        if n == 0 {
            return bp;
        }
        if self.count == 0 {
            // Continuing after someone else's heads: point at all of them.
            return self.recent.clone();
        }
        bp.push(self.recent[n - 1]);
        if self.skip_pointers {
            let mut d = 2usize;
            while d <= 1024 && d <= n && self.count.is_multiple_of(d as u64) {
                bp.push(self.recent[n - d]);
                d *= 2;
            }
        }
        bp
    }

    /// Seals `plaintext` into the next record, pointing at the previous one (plus
    /// `extra` backpointers, e.g. other branches' heads to merge them).
    pub fn record(&mut self, plaintext: &[u8], extra: &[RecordName]) -> Result<Record> {
        let sealed = self.crypto.seal(plaintext)?;
        let bp = self.backpointers(extra);
        let r = Record::new(self.capsule, sealed, bp);
        // Checked before the chain moves on: a record every server refuses (too large a
        // body, too many backpointers) would otherwise be the next one's only backpointer,
        // a hole no write can fill.
        r.header.check_well_formed()?;
        self.advance(r.name());
        Ok(r)
    }

    /// Where the writer's chain stands (the records the next one points at), to go back
    /// to with [`Writer::rewind`] when records made since are dropped unwritten.
    pub(crate) fn chain_mark(&self) -> (Vec<RecordName>, u64) {
        (self.recent.clone(), self.count)
    }

    /// Puts the chain back where [`Writer::chain_mark`] found it.
    pub(crate) fn rewind(&mut self, (recent, count): (Vec<RecordName>, u64)) {
        self.recent = recent;
        self.count = count;
    }

    fn advance(&mut self, name: RecordName) {
        if self.count == 0 {
            self.recent.clear();
        }
        self.recent.push(name);
        if self.recent.len() > 2048 {
            self.recent.drain(..1024);
        }
        self.count += 1;
    }

    /// This writer's signature on `name`.
    pub fn sign(&self, name: &RecordName) -> WriterSignature {
        WriterSignature {
            writer: self.index,
            sig: self.key.sign(DOMAIN_RECORD, &name.hash().to_bytes()),
        }
    }

    /// [`Writer::sign`], noting the signature in `reader` (this process reads what it
    /// writes): a proof that comes back anchored on exactly this signature then skips its
    /// Ed25519 check, since the signature was made here.
    pub fn sign_for(&self, name: &RecordName, reader: &mut Reader) -> WriterSignature {
        let sig = self.sign(name);
        // Only a reader of this capsule (the same metadata, so the same writer list) may
        // skip the check: for another capsule's reader this key may be no writer at all.
        if reader.capsule == self.capsule {
            reader.trust_own_signature(*name, sig);
        }
        sig
    }

    /// Write(subrecord) of the subrecord API: seals and buffers one subrecord; returns its
    /// name.
    pub fn write_subrecord(&mut self, plaintext: &[u8]) -> Result<Hash> {
        let sealed = self.crypto.seal(plaintext)?;
        // One record's subrecords travel in one anti-entropy message (see
        // `SealedSubrecords::check_len`): past it, commit first.
        let len = self.pending.body_len_with(&sealed);
        if len > crate::record::MAX_BODY_LEN {
            return Err(Error::invalid(format!(
                "this subrecord would take the record's subrecords to {len} bytes, past the \
                 {} one record may carry: commit the {} written so far first",
                crate::record::MAX_BODY_LEN,
                self.pending.len()
            )));
        }
        let name = subrecord_name(self.meta.algo, &sealed);
        self.pending.push(&sealed);
        Ok(name)
    }

    /// Commit(backpointers) of the subrecord API: makes one record of the buffered
    /// subrecords (its body is their Merkle tree) and signs its root by signing the record
    /// name. Returns the header, the sealed subrecords and the signature to send.
    pub fn commit_subrecords(
        &mut self,
        extra: &[RecordName],
    ) -> Result<(RecordHeader, SealedSubrecords, WriterSignature)> {
        if self.pending.is_empty() {
            return Err(Error::invalid("commit with no subrecords written"));
        }

        let (root, _) = subrecord_root(self.meta.algo, &self.pending);
        let bp = self.backpointers(extra);
        let header = RecordHeader {
            capsule: self.capsule,
            body: BodyRef::Subrecords {
                root,
                count: self.pending.len() as u64,
            },
            backpointers: bp,
        };
        // As in `record`: checked before the chain moves on (the subrecords stay buffered).
        header.check_well_formed()?;
        let subs = std::mem::take(&mut self.pending);
        let name = header.name();
        self.advance(name);
        let sig = self.sign(&name);
        Ok((header, subs, sig))
    }
}

/// Verifies what a server returns, trusting only the capsule metadata (checked against
/// the capsule name) and its own verification cache.
///
/// What a proof verified goes into the cache as the session's [`MirrorMode`] says (set
/// it with [`Reader::set_mirror_mode`] to match the session opened): with
/// [`MirrorMode::OnAck`] (the default) it is staged, and [`Reader::commit_staged`] inserts
/// everything staged when the caller sends the acks of those proofs, in the order
/// verified, exactly as the server will; with [`MirrorMode::OnIssue`] it is inserted at
/// once, as the server did when it issued the proof. Proofs are always checked against
/// the inserted names only, so a proof that stops at a name the reader has merely staged
/// (or never verified) is refused.
pub struct Reader {
    meta: CapsuleMetadata,
    capsule: CapsuleName,
    cache: VerificationCache,
    mode: MirrorMode,
    /// Names verified but not yet inserted (acks not sent yet), in verification order.
    staged: Vec<Hash>,
    crypto: BodyCrypto,
    /// Signatures this process made itself (see [`Reader::trust_own_signature`]), newest
    /// last, at most [`OWN_SIGNATURES`].
    own: std::collections::VecDeque<(RecordName, WriterSignature)>,
}

/// How many of its own signatures a [`Reader`] remembers.
pub const OWN_SIGNATURES: usize = 64;

impl Reader {
    /// A reader of `capsule`. `meta` usually comes from an untrusted server: it is checked
    /// against the name.
    pub fn new(
        capsule: CapsuleName,
        meta: CapsuleMetadata,
        policy: CachePolicy,
        body_key: Option<BodyKey>,
    ) -> Result<Self> {
        if meta.name() != capsule {
            return Err(Error::Rejected(format!(
                "metadata does not hash to capsule name {capsule}"
            )));
        }
        let crypto = BodyCrypto::new(meta.cipher, body_key.as_ref(), &capsule);
        Ok(Reader {
            meta,
            capsule,
            cache: VerificationCache::new(policy)?,
            mode: MirrorMode::OnAck,
            staged: Vec::new(),
            own: std::collections::VecDeque::new(),
            crypto,
        })
    }

    /// The verification cache (its policy and names go to the server when a session opens).
    pub fn cache(&self) -> &VerificationCache {
        &self.cache
    }

    /// Notes a signature that this process made itself with one of the capsule's writer
    /// keys (only [`Writer::sign_for`] calls this, so nothing received can be noted). A
    /// proof anchored on a byte-equal copy of it, for the same name, then skips the
    /// Ed25519 check: a copy of a signature made here is authentic, whoever sends it back.
    /// Any other signature is checked as always. Keeps the newest [`OWN_SIGNATURES`].
    fn trust_own_signature(&mut self, name: RecordName, sig: WriterSignature) {
        if self.own.len() == OWN_SIGNATURES {
            self.own.pop_front();
        }
        self.own.push_back((name, sig));
    }

    /// True when `sig` on `name` is one of this process's own (see
    /// [`Reader::trust_own_signature`]).
    fn is_own(&self, name: &RecordName, sig: &WriterSignature) -> bool {
        self.own.iter().rev().any(|(n, s)| n == name && s == sig)
    }

    /// Checks a record proof against this reader's cache and own signatures; notes nothing.
    fn check_record_proof(
        &self,
        target: &RecordName,
        proof: &RecordProof,
    ) -> Result<Vec<RecordName>> {
        proof.verify_in(
            &self.meta,
            &self.capsule,
            target,
            |h| self.cache.contains(h),
            |n, s| self.is_own(n, s),
        )
    }

    /// The capsule metadata.
    pub fn meta(&self) -> &CapsuleMetadata {
        &self.meta
    }

    /// When verified names enter the cache; must match the mode of the session the proofs
    /// come from. Switching commits whatever is staged.
    pub fn set_mirror_mode(&mut self, mode: MirrorMode) {
        self.commit_staged();
        self.mode = mode;
    }

    /// The mirror mode (see [`Reader::set_mirror_mode`]).
    pub fn mirror_mode(&self) -> MirrorMode {
        self.mode
    }

    /// Number of names verified and staged, waiting for [`Reader::commit_staged`].
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Inserts every staged name, in the order verified. Call it when sending the acks of
    /// all proofs verified since the last call (in that order): the server then inserts
    /// the same names in the same order, so the mirror stays exact.
    pub fn commit_staged(&mut self) {
        self.cache.insert_all(&self.staged);
        self.staged.clear();
    }

    /// Drops the staged names without inserting them (the acks will not be sent).
    pub fn discard_staged(&mut self) {
        self.staged.clear();
    }

    fn note_verified(&mut self, names: impl IntoIterator<Item = Hash>) {
        let capacity = match self.cache.policy() {
            // No cache: nothing is inserted, so nothing is staged either (a reader without
            // acks to send kept every name it ever verified).
            CachePolicy::Off => return,
            CachePolicy::Lru { capacity } => capacity as usize,
        };
        match self.mode {
            MirrorMode::OnAck => {
                self.staged.extend(names);
                // Past twice the capacity, only each name's last occurrence is kept, of the
                // newest `capacity` names, in order: inserting those leaves the cache as
                // inserting every staged name would (an insert moves a name to the front,
                // so only its last one counts, and older names are evicted or stay behind
                // them alike). A reader that never commits (no session, no acks) holds at
                // most about twice its capacity, whatever it verifies again and again.
                if self.staged.len() > 2 * capacity + 1024 {
                    let mut seen = std::collections::HashSet::with_capacity(capacity);
                    let mut kept: Vec<Hash> = Vec::with_capacity(capacity);
                    for n in self.staged.iter().rev() {
                        if kept.len() == capacity {
                            break;
                        }
                        if seen.insert(*n) {
                            kept.push(*n);
                        }
                    }
                    kept.reverse();
                    self.staged = kept;
                }
            }
            MirrorMode::OnIssue => {
                let names: Vec<Hash> = names.into_iter().collect();
                self.cache.insert_all(&names);
            }
        }
    }

    /// Verifies a record proof for `target`; on success notes every name it verified (in
    /// the order the server's mirror will insert them) and returns them.
    pub fn verify_record(
        &mut self,
        target: &RecordName,
        proof: &RecordProof,
    ) -> Result<Vec<RecordName>> {
        let names = self.check_record_proof(target, proof)?;
        self.note_verified(names.iter().map(|n| *n.hash()));
        Ok(names)
    }

    /// Verifies a subrecord proof for the subrecord named `sub`; on success notes the tree
    /// nodes it computed, the siblings its path consumed and the record names it verified.
    pub fn verify_subrecord(&mut self, sub: &Hash, proof: &SubrecordProof) -> Result<()> {
        let cached = proof.verify_in(
            &self.meta,
            &self.capsule,
            sub,
            |h| self.cache.contains(h),
            |n, s| self.is_own(n, s),
        );
        let (nodes, names) = match cached {
            Ok(v) => v,
            // A full proof (one that reaches a record proof) for a reader that already
            // trusts a node on its path, which a proof outside a session, or after the
            // mirror fell behind, is: checked as a whole, trusting nothing cached.
            Err(_) if proof.record.is_some() => proof.verify_in(
                &self.meta,
                &self.capsule,
                sub,
                |_| false,
                |n, s| self.is_own(n, s),
            )?,
            Err(e) => return Err(e),
        };
        // The siblings the path consumed are bound by where the walk ended (a trusted node,
        // or the root the record proof binds): trusting them too, as DCS does, lets a
        // later proof of a neighbouring subrecord stop at its leaf. The server's mirror
        // notes the same names in the same order: nodes, siblings, record names.
        let algo = self.meta.algo;
        let siblings = proof.path.iter().map(|d| Hash::new(algo, *d));
        self.note_verified(
            nodes
                .into_iter()
                .chain(siblings)
                .chain(names.iter().map(|n| *n.hash())),
        );
        Ok(())
    }

    /// Verifies a proof that every subrecord in `subs` belongs to the capsule (the list
    /// the proof was requested for, in the same order); on success notes each record's
    /// subrecord root and the record names verified, as the server's mirror does.
    pub fn verify_subrecords(&mut self, subs: &[Hash], proof: &SubrecordsProof) -> Result<()> {
        let verified = proof.verify_in(
            &self.meta,
            &self.capsule,
            subs,
            |h| self.cache.contains(h),
            |n, s| self.is_own(n, s),
        )?;
        self.note_groups(verified);
        Ok(())
    }

    /// Notes what a subrecord multiproof verified as the server's mirror inserts it, group
    /// by group: the root, then that record's names.
    fn note_groups(&mut self, verified: Vec<(Hash, Vec<RecordName>)>) {
        let noted: Vec<Hash> = verified
            .into_iter()
            .flat_map(|(root, names)| {
                std::iter::once(root).chain(names.into_iter().map(|n| *n.hash()))
            })
            .collect();
        self.note_verified(noted);
    }

    /// Verifies that `subs` is the whole of `record`'s subrecords, in order (the list
    /// `subrecords` answers), with a multiproof of all of them; notes what it verified, as
    /// [`Reader::verify_subrecords`] does.
    pub fn verify_record_subrecords(
        &mut self,
        record: &RecordName,
        subs: &[Hash],
        proof: &SubrecordsProof,
    ) -> Result<()> {
        let verified = proof.verify_record_in(
            &self.meta,
            &self.capsule,
            record,
            subs,
            |h| self.cache.contains(h),
            |n, s| self.is_own(n, s),
        )?;
        self.note_groups(verified);
        Ok(())
    }

    /// Read-and-prove: verifies `proof` for `target` (its first header is the record's),
    /// checks the sealed `body` against that header and opens it. The proof's names are
    /// noted only when all of that succeeds (so under [`MirrorMode::OnAck`], ack the proof
    /// exactly when this returns `Ok`).
    pub fn verify_read(
        &mut self,
        target: &RecordName,
        body: Vec<u8>,
        proof: &RecordProof,
    ) -> Result<Vec<u8>> {
        let names = self.check_record_proof(target, proof)?;
        let header = proof
            .chain
            .first()
            .ok_or_else(|| Error::Rejected("proof has no headers".into()))?;
        refuse_subrecord_record(header)?;
        header.check_body(&body)?;
        let plain = self.crypto.open(&body)?;
        self.note_verified(names.iter().map(|n| *n.hash()));
        Ok(plain)
    }

    /// Checks a record read from a server against `name` (header hash, capsule, body hash)
    /// and opens its body. The record's integrity still needs a proof
    /// ([`Reader::verify_record`]).
    pub fn open_record(&self, name: &RecordName, record: &Record) -> Result<Vec<u8>> {
        if record.name() != *name {
            return Err(Error::Rejected(format!(
                "server returned another record than {name}"
            )));
        }
        if record.header.capsule != self.capsule {
            return Err(Error::Rejected("record belongs to another capsule".into()));
        }
        refuse_subrecord_record(&record.header)?;
        record.check_body()?;
        self.crypto.open(&record.body)
    }

    /// Checks subrecord bytes against their name and opens them.
    pub fn open_subrecord(&self, sub: &Hash, sealed: &[u8]) -> Result<Vec<u8>> {
        if subrecord_name(self.meta.algo, sealed) != *sub {
            return Err(Error::Rejected(format!(
                "subrecord bytes do not match name {sub}"
            )));
        }
        self.crypto.open(sealed)
    }
}

/// A record of subrecords has no body to open: its data are its subrecords, read and
/// proven one by one. Opening its empty body would answer an empty value in a plaintext
/// capsule and an error in a sealed one.
fn refuse_subrecord_record(header: &RecordHeader) -> Result<()> {
    match header.body {
        BodyRef::Plain { .. } => Ok(()),
        BodyRef::Subrecords { .. } => Err(Error::TypeMismatch(format!(
            "record {} holds subrecords, not a body: read its subrecords",
            header.name()
        ))),
    }
}
