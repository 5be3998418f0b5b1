//! One replica's view of a capsule's record DAG, with no I/O: which records are present,
//! their backpointers, heads and roots (in the *physical* sense of DCS §3.4), writer
//! signatures, each record's **witness** (DCS §3.3), and the order in which this replica
//! accepted records (the leaves of its Merkle log).
//!
//! Witnesses are kept eagerly. A signed record has witness `Signed`; any other record
//! points to the next record on a shortest hash chain towards a signed one, with the
//! chain's length, or is `Unknown`. A new signature runs a breadth-first search down the
//! backpointers that stops wherever the known chain is already as short (DCS's pruned BFS);
//! a record that arrives after some of its children (anti-entropy fills holes out of order)
//! takes its witness from them and propagates it the same way. Lengths only ever shrink,
//! so updates commute.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_core::{Error, Hash, Result};

use crate::merkle::{self, MerkleLog};
use crate::metadata::{CapsuleMetadata, CapsuleName};
use crate::proof::WriterSignature;
use crate::record::{RecordHeader, RecordName};

/// A record's witness: how far it is from a writer signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Witness {
    /// The record itself carries a writer signature.
    Signed,
    /// `next` is the next record on a shortest chain to a signed record, `hops` away.
    Next {
        /// A present child whose backpointers include this record.
        next: RecordName,
        /// Length of the chain from this record to the signed one.
        hops: u32,
    },
    /// No signed record reaches this one yet.
    Unknown,
}

impl Witness {
    /// Chain length to a signature (`Some(0)` when signed), or `None` when unknown.
    pub fn hops(&self) -> Option<u32> {
        match self {
            Witness::Signed => Some(0),
            Witness::Next { hops, .. } => Some(*hops),
            Witness::Unknown => None,
        }
    }
}

/// Where a record's body lives in the chunk store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredBody {
    /// One body chunk.
    Plain {
        /// The body chunk's cid (the header's body hash).
        cid: Hash,
    },
    /// A subrecord tree whose leaves are listed in one chunk.
    Subrecords {
        /// Cid of the subrecord-list chunk.
        list: Hash,
        /// Number of subrecords.
        count: u64,
    },
}

impl StoredBody {
    /// Subrecords the body holds (0 for a plain body).
    pub fn subrecords(&self) -> u64 {
        match self {
            StoredBody::Plain { .. } => 0,
            StoredBody::Subrecords { count, .. } => *count,
        }
    }
}

/// A present record.
#[derive(Clone, Debug)]
pub struct Node {
    /// Backpointers from the header.
    pub backpointers: Box<[RecordName]>,
    /// Current witness.
    pub witness: Witness,
    /// Position in this replica's acceptance order (its Merkle-log leaf index).
    pub index: u64,
    /// Where the body is.
    pub body: StoredBody,
    /// The encoded header (its hash is the record name), kept so reads and proofs need
    /// not fetch and re-hash the header chunk.
    pub header: Box<[u8]>,
}

impl Node {
    /// What this record holds while no signature covers it, by [`unproven_cost`].
    pub fn unproven_cost(&self) -> u64 {
        unproven_cost(
            self.header.len(),
            self.backpointers.len(),
            self.body.subrecords(),
        )
    }
}

/// The DAG state of one capsule at one replica.
pub struct CapsuleDag {
    meta: CapsuleMetadata,
    name: CapsuleName,
    nodes: foldhash::HashMap<RecordName, Node>,
    children: foldhash::HashMap<RecordName, Vec<RecordName>>,
    /// The proven ones among `children` (kept as records become proven), so searches
    /// through the proven part never step over the unsigned records anyone may write.
    proven_children: foldhash::HashMap<RecordName, Vec<RecordName>>,
    heads: BTreeSet<RecordName>,
    /// Heads of the proven part: proven records no proven record points to (kept as
    /// records become proven, so asking costs nothing however many unsigned records
    /// anyone wrote).
    proven_heads: BTreeSet<RecordName>,
    /// Acceptance positions of the proven records, in the order they became proven (a
    /// record accepted unsigned and signed later comes at its signing).
    proven_order: Vec<u64>,
    roots: BTreeSet<RecordName>,
    /// Names some present record points to that are not present (holes).
    missing: BTreeSet<RecordName>,
    signatures: foldhash::HashMap<RecordName, WriterSignature>,
    /// Records signed after a chain had proven them (listed in `proven_order` twice): a
    /// replica may hold them unsigned, and anti-entropy sends them to it unasked (see
    /// [`CapsuleDag::signed_late`]).
    signed_late: foldhash::HashSet<RecordName>,
    order: Vec<RecordName>,
    /// Records journaled here whose header (or subrecord list) could not be read back
    /// when the capsule was loaded, each with the place it holds in the log and the order
    /// and the signature the journal holds for it: not present (a hole their children
    /// point to), so one damaged chunk costs the records it names, not the capsule. A copy
    /// that arrives again takes that place, with that signature.
    damaged: foldhash::HashMap<RecordName, (u64, Option<WriterSignature>)>,
    /// Present records whose body (a plain body chunk, a subrecord list or one of its
    /// subrecords) was found missing or failing its hash when read: the header, place and
    /// signature stand, the body does not. Anti-entropy asks peers for them like holes,
    /// and a checked copy (from a peer, or written again) stores the body anew.
    body_damaged: BTreeSet<RecordName>,
    log: MerkleLog,
    unproven: usize,
    /// What the unproven records hold in memory, by [`unproven_cost`].
    unproven_bytes: u64,
    /// Where `unproven_bytes` is also added up with other DAGs' (a server's total across
    /// its loaded capsules), if anywhere; see [`CapsuleDag::set_meter`].
    meter: Option<Arc<AtomicU64>>,
}

impl Drop for CapsuleDag {
    fn drop(&mut self) {
        // An unloaded capsule's records hold no memory any more.
        if let Some(m) = &self.meter {
            m.fetch_sub(self.unproven_bytes, Ordering::Relaxed);
        }
    }
}

/// Bytes of memory a record is taken to hold while no signature covers it: its header,
/// its backpointers twice (kept, and indexed as children), a fixed overhead, and for a
/// subrecord record its subrecords' index entries. What [`CapsuleDag::unproven_bytes`]
/// adds up, for a server's budget of records anyone may write.
pub fn unproven_cost(header_len: usize, backpointers: usize, subrecords: u64) -> u64 {
    // A backpointer is kept in the node, indexed as a child (an entry and a vector of its
    // own when its target is absent) and, when absent, listed as missing.
    const BACKPOINTER: u64 = 200;
    const NODE: u64 = 320;
    const SUBRECORD: u64 = 80;
    (header_len as u64)
        .saturating_add(BACKPOINTER * backpointers as u64)
        .saturating_add(NODE)
        .saturating_add(subrecords.saturating_mul(SUBRECORD))
}

impl CapsuleDag {
    /// An empty DAG for the capsule `meta` describes.
    pub fn new(meta: CapsuleMetadata) -> Self {
        let name = meta.name();
        let log = MerkleLog::new(meta.algo);
        CapsuleDag {
            meta,
            name,
            nodes: Default::default(),
            children: Default::default(),
            proven_children: Default::default(),
            heads: BTreeSet::new(),
            proven_heads: BTreeSet::new(),
            proven_order: Vec::new(),
            roots: BTreeSet::new(),
            missing: BTreeSet::new(),
            signatures: Default::default(),
            signed_late: Default::default(),
            order: Vec::new(),
            damaged: Default::default(),
            body_damaged: BTreeSet::new(),
            log,
            unproven: 0,
            unproven_bytes: 0,
            meter: None,
        }
    }

    /// Adds this DAG's [`CapsuleDag::unproven_bytes`] to `meter`, now and as it changes,
    /// until the DAG is dropped (which takes them out again): a server sums what all its
    /// loaded capsules' unproven records hold in one counter. Replaces an earlier meter.
    pub fn set_meter(&mut self, meter: Arc<AtomicU64>) {
        if let Some(old) = self.meter.take() {
            old.fetch_sub(self.unproven_bytes, Ordering::Relaxed);
        }
        meter.fetch_add(self.unproven_bytes, Ordering::Relaxed);
        self.meter = Some(meter);
    }

    /// The metadata.
    pub fn meta(&self) -> &CapsuleMetadata {
        &self.meta
    }

    /// The capsule name.
    pub fn name(&self) -> CapsuleName {
        self.name
    }

    /// Number of present records.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no record is present.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Records present with no witness yet.
    pub fn unproven(&self) -> usize {
        self.unproven
    }

    /// What the records present with no witness yet hold, by [`unproven_cost`].
    pub fn unproven_bytes(&self) -> u64 {
        self.unproven_bytes
    }

    /// The present records with no witness yet that signatures on `signed` would prove
    /// (those among `signed` and the unproven records their backpointers reach): how many,
    /// and what they hold by [`unproven_cost`]. What a write carrying those signatures
    /// frees of a server's budget of unproven records.
    pub fn unproven_reached<'a>(
        &self,
        signed: impl IntoIterator<Item = &'a RecordName>,
    ) -> (usize, u64) {
        let unproven = |n: &RecordName| {
            self.nodes
                .get(n)
                .is_some_and(|x| x.witness == Witness::Unknown)
        };
        let mut seen: foldhash::HashSet<RecordName> = Default::default();
        let mut stack: Vec<RecordName> = signed
            .into_iter()
            .filter(|n| unproven(n))
            .copied()
            .collect();
        let (mut count, mut bytes) = (0usize, 0u64);
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            let Some(x) = self.nodes.get(&n) else {
                continue;
            };
            count += 1;
            bytes += x.unproven_cost();
            stack.extend(x.backpointers.iter().filter(|p| unproven(p)));
        }
        (count, bytes)
    }

    /// Checks that `header` may join this capsule (before anything is stored).
    pub fn check_header(&self, header: &RecordHeader) -> Result<()> {
        if header.capsule != self.name {
            return Err(Error::Rejected(format!(
                "record names capsule {}, not {}",
                header.capsule, self.name
            )));
        }
        Ok(())
    }

    /// Whether `name` is present.
    pub fn contains(&self, name: &RecordName) -> bool {
        self.nodes.contains_key(name)
    }

    /// The node for `name`.
    pub fn node(&self, name: &RecordName) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// The header of `name`, decoded from the bytes kept in memory.
    pub fn header(&self, name: &RecordName) -> Option<Result<RecordHeader>> {
        self.nodes
            .get(name)
            .map(|n| RecordHeader::decode(&n.header))
    }

    /// The witness of `name`.
    pub fn witness(&self, name: &RecordName) -> Option<Witness> {
        self.nodes.get(name).map(|n| n.witness)
    }

    /// The writer signature on `name`, if any.
    pub fn signature(&self, name: &RecordName) -> Option<&WriterSignature> {
        self.signatures.get(name)
    }

    /// Current heads (present records no present record points to), sorted.
    pub fn heads(&self) -> Vec<RecordName> {
        self.heads.iter().copied().collect()
    }

    /// Whether `name` is present and a writer signature reaches it (its witness is known).
    pub fn is_proven(&self, name: &RecordName) -> bool {
        self.witness(name).and_then(|w| w.hops()).is_some()
    }

    /// Heads of the proven part of the DAG (proven records no proven record points to),
    /// sorted: what a writer may continue from, and what a checkpoint lists. Records no
    /// signature reaches (anyone can write them) stay out, so a writer's next signature
    /// never vouches for one, and a reader is never pointed at a head it cannot prove.
    pub fn proven_heads(&self) -> Vec<RecordName> {
        self.proven_heads.iter().copied().collect()
    }

    /// How many proven heads there are (the length of [`CapsuleDag::proven_heads`]).
    pub fn proven_heads_len(&self) -> usize {
        self.proven_heads.len()
    }

    /// Current roots (present records none of whose backpointers is present), sorted.
    pub fn roots(&self) -> Vec<RecordName> {
        self.roots.iter().copied().collect()
    }

    /// Names that present records point to but that are not present (the holes), sorted.
    pub fn missing(&self) -> Vec<RecordName> {
        self.missing.iter().copied().collect()
    }

    /// Present records that point to `name`.
    pub fn children(&self, name: &RecordName) -> &[RecordName] {
        self.children.get(name).map_or(&[], |v| v.as_slice())
    }

    /// Proven records that point to `name` (in the order they became proven).
    pub fn proven_children(&self, name: &RecordName) -> &[RecordName] {
        self.proven_children.get(name).map_or(&[], |v| v.as_slice())
    }

    /// Whether a proven record points to `name`.
    pub fn has_proven_child(&self, name: &RecordName) -> bool {
        !self.proven_children(name).is_empty()
    }

    /// Proven records in the order they became proven, as positions in [`Self::order`]:
    /// what anti-entropy compares since a sync (a record signed after it was accepted
    /// comes when it was signed, so a signature that reaches an old record travels). A
    /// record proven by a chain and signed later comes again at its signing, so a
    /// position may appear twice.
    pub fn proven_order(&self) -> &[u64] {
        &self.proven_order
    }

    /// Whether `name` was signed after a chain of signed descendants had proven it. A
    /// replica that holds it from before holds it unsigned, and anti-entropy does not ask
    /// for a record it holds proven, so a responder sends these unasked.
    pub fn signed_late(&self, name: &RecordName) -> bool {
        self.signed_late.contains(name)
    }

    /// Every record [`CapsuleDag::signed_late`] holds for, in no order.
    pub fn signed_late_names(&self) -> impl Iterator<Item = &RecordName> {
        self.signed_late.iter()
    }

    /// How many records were signed late.
    pub fn signed_late_count(&self) -> usize {
        self.signed_late.len()
    }

    /// Records in acceptance order.
    pub fn order(&self) -> &[RecordName] {
        &self.order
    }

    /// The Merkle log over accepted record names.
    pub fn log(&self) -> &MerkleLog {
        &self.log
    }

    /// Merkle leaf for a record name in the log.
    pub fn log_leaf(name: &RecordName) -> merkle::Digest {
        merkle::leaf_hash(name.hash().algo(), &name.hash().to_bytes())
    }

    /// Adds a checked record; returns false (changing nothing) if it was already present.
    pub fn insert(&mut self, name: RecordName, header: &RecordHeader, body: StoredBody) -> bool {
        self.insert_signed(name, header, body, None)
    }

    /// [`CapsuleDag::insert`] of a record that arrives with its writer signature `sig`
    /// (verified by the caller) in the same journal group: the record is signed from the
    /// start, so it is listed once in the proven order, not first as proven by a chain
    /// through records of its group and then again, as signed late
    /// ([`CapsuleDag::signed_late`]), for its own signature.
    pub(crate) fn insert_signed(
        &mut self,
        name: RecordName,
        header: &RecordHeader,
        body: StoredBody,
        mut sig: Option<WriterSignature>,
    ) -> bool {
        if self.nodes.contains_key(&name) {
            return false;
        }
        // A damaged record whose copy came back keeps the place it was journaled at, as a
        // replay (which then reads its header at that place) gives it, and the signature
        // journaled for it.
        let index = match self.damaged.remove(&name) {
            Some((i, saved)) => {
                sig = sig.or(saved);
                i
            }
            None => {
                let i = self.log.push(Self::log_leaf(&name));
                self.order.push(name);
                i
            }
        };
        let mut root = true;
        self.missing.remove(&name);
        for p in &header.backpointers {
            if self.nodes.contains_key(p) {
                root = false;
                self.heads.remove(p);
            } else {
                self.missing.insert(*p);
            }
            self.children.entry(*p).or_default().push(name);
        }
        // Children that arrived earlier (holes being filled) now have a physical pointer.
        let kids: Vec<RecordName> = self.children(&name).to_vec();
        for c in &kids {
            self.roots.remove(c);
        }
        let mut witness = Witness::Unknown;
        for c in &kids {
            if let Some(h) = self.nodes.get(c).and_then(|n| n.witness.hops())
                && witness.hops().is_none_or(|w| h + 1 < w)
            {
                witness = Witness::Next {
                    next: *c,
                    hops: h + 1,
                };
            }
        }
        if kids.is_empty() {
            self.heads.insert(name);
        }
        if root {
            self.roots.insert(name);
        }
        let encoded = header.encode();
        self.unproven += 1;
        let cost = unproven_cost(encoded.len(), header.backpointers.len(), body.subrecords());
        self.unproven_bytes += cost;
        if let Some(m) = &self.meter {
            m.fetch_add(cost, Ordering::Relaxed);
        }
        self.nodes.insert(
            name,
            Node {
                backpointers: header.backpointers.clone().into_boxed_slice(),
                witness: Witness::Unknown,
                index,
                body,
                header: encoded.into_boxed_slice(),
            },
        );
        if let Some(ws) = sig {
            self.signatures.insert(name, ws);
            self.set_witness(&name, Witness::Signed);
            self.propagate(name, 0);
        } else if let Some(h) = witness.hops() {
            self.set_witness(&name, witness);
            self.propagate(name, h);
        }
        true
    }

    /// Notes a record journaled at this place whose header could not be read back (see
    /// [`CapsuleDag::damaged`]): it takes its place in the log and the order, so every later
    /// record keeps its position, but it is not present.
    pub(crate) fn insert_damaged(&mut self, name: RecordName) {
        if self.nodes.contains_key(&name) || self.damaged.contains_key(&name) {
            return;
        }
        let index = self.log.push(Self::log_leaf(&name));
        self.order.push(name);
        self.damaged.insert(name, (index, None));
    }

    /// Keeps a signature the journal holds for a [`CapsuleDag::damaged`] record, to apply
    /// when its copy arrives; false when `name` is not damaged.
    pub(crate) fn note_damaged_signature(
        &mut self,
        name: &RecordName,
        sig: WriterSignature,
    ) -> bool {
        match self.damaged.get_mut(name) {
            Some((_, saved)) => {
                saved.get_or_insert(sig);
                true
            }
            None => false,
        }
    }

    /// Whether `name` is [`CapsuleDag::damaged`].
    pub fn is_damaged(&self, name: &RecordName) -> bool {
        self.damaged.contains_key(name)
    }

    /// Records journaled here that could not be read back when the capsule was loaded
    /// (their header or subrecord list missing or damaged), in no particular order. They
    /// are holes: reads and proofs of them, and of records whose only chain to a signature
    /// passes through them, fail; anti-entropy asks peers for them like any hole.
    pub fn damaged(&self) -> impl Iterator<Item = &RecordName> {
        self.damaged.keys()
    }

    /// Whether any record is [`CapsuleDag::damaged`].
    pub fn has_damage(&self) -> bool {
        !self.damaged.is_empty()
    }

    /// Notes that present record `name`'s stored body was found missing or damaged (see
    /// [`CapsuleDag::body_damaged`]); false when `name` is not present or already noted.
    pub(crate) fn note_body_damaged(&mut self, name: &RecordName) -> bool {
        self.nodes.contains_key(name) && self.body_damaged.insert(*name)
    }

    /// Clears [`CapsuleDag::note_body_damaged`] once a checked copy of the body is stored;
    /// false when `name` was not noted.
    pub(crate) fn clear_body_damaged(&mut self, name: &RecordName) -> bool {
        self.body_damaged.remove(name)
    }

    /// Present records whose body was found missing or failing its hash when read (since
    /// the capsule was loaded; a read, an export to a peer or `audit` finds them), sorted.
    /// Anti-entropy asks peers for them as it asks for holes, and a checked copy stores
    /// the body again.
    pub fn body_damaged(&self) -> impl Iterator<Item = &RecordName> {
        self.body_damaged.iter()
    }

    /// Whether `name`'s body is [`CapsuleDag::body_damaged`].
    pub fn is_body_damaged(&self, name: &RecordName) -> bool {
        self.body_damaged.contains(name)
    }

    /// What this replica asks its peers for: the holes a proven record points to and the
    /// proven records whose body is damaged, sorted (what the sync's quick check hashes
    /// and its shape lists name as missing).
    pub fn wanted(&self) -> Vec<RecordName> {
        let mut out: Vec<RecordName> = self
            .missing
            .iter()
            .filter(|m| self.has_proven_child(m))
            .copied()
            .collect();
        out.extend(self.body_damaged.iter().filter(|n| self.is_proven(n)));
        out.sort_unstable();
        out
    }

    /// Records a writer signature on a present record after checking it; returns false if
    /// the record was already signed.
    pub fn add_signature(&mut self, name: RecordName, ws: WriterSignature) -> Result<bool> {
        if !self.nodes.contains_key(&name) {
            return Err(Error::NotFound(format!(
                "record {name} is not in capsule {}",
                self.name
            )));
        }
        ws.verify(&self.meta, &name)?;
        Ok(self.insert_verified_signature(name, ws))
    }

    /// [`CapsuleDag::add_signature`] for a signature the caller has just verified; returns
    /// false if the record is absent or already signed.
    pub(crate) fn insert_verified_signature(
        &mut self,
        name: RecordName,
        ws: WriterSignature,
    ) -> bool {
        let Some(node) = self.nodes.get(&name) else {
            return false;
        };
        if self.signatures.contains_key(&name) {
            return false;
        }
        let (was_proven, index) = (node.witness != Witness::Unknown, node.index);
        self.signatures.insert(name, ws);
        self.set_witness(&name, Witness::Signed);
        if was_proven {
            // Already proven by a chain, it is not newly proven, yet its signature is news
            // to a replica that holds it unsigned: anti-entropy compares the records in
            // `proven_order` after each peer's cursor, so it goes there again (a replay
            // of the journal makes the same order). Without it, a signature acknowledged
            // by one replica never reached the others, and the quick check said in sync.
            self.proven_order.push(index);
            self.signed_late.insert(name);
        }
        self.propagate(name, 0);
        true
    }

    fn set_witness(&mut self, name: &RecordName, w: Witness) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        let newly_proven = n.witness == Witness::Unknown && w != Witness::Unknown;
        n.witness = w;
        if !newly_proven {
            return;
        }
        let n = &*n;
        self.unproven -= 1;
        let cost = n.unproven_cost();
        debug_assert!(self.unproven_bytes >= cost, "unproven bytes drifted");
        let cost = cost.min(self.unproven_bytes);
        self.unproven_bytes -= cost;
        if let Some(m) = &self.meter {
            m.fetch_sub(cost, Ordering::Relaxed);
        }
        self.proven_order.push(n.index);
        // Its parents are proven too (by the propagation this is part of) and no longer
        // heads of the proven part; it is one unless a proven child points to it.
        for p in n.backpointers.iter() {
            self.proven_heads.remove(p);
            self.proven_children.entry(*p).or_default().push(*name);
        }
        if !self.has_proven_child(name) {
            self.proven_heads.insert(*name);
        }
    }

    /// Pruned BFS down the backpointers from `from`, whose chain length is `hops`.
    fn propagate(&mut self, from: RecordName, hops: u32) {
        let mut queue = VecDeque::from([(from, hops)]);
        while let Some((x, h)) = queue.pop_front() {
            let Some(node) = self.nodes.get(&x) else {
                continue;
            };
            let parents = node.backpointers.clone();
            for p in parents.iter() {
                let better = match self.nodes.get(p) {
                    Some(pn) => pn.witness.hops().is_none_or(|w| h + 1 < w),
                    None => false,
                };
                if better {
                    self.set_witness(
                        p,
                        Witness::Next {
                            next: x,
                            hops: h + 1,
                        },
                    );
                    queue.push_back((*p, h + 1));
                }
            }
        }
    }

    /// The shortest known chain from `name` to a signed record (`name` first), following
    /// witnesses.
    pub fn chain_to_signature(&self, name: &RecordName) -> Result<Vec<RecordName>> {
        let mut chain = vec![*name];
        let mut cur = *name;
        loop {
            match self.witness(&cur) {
                None => return Err(Error::NotFound(format!("record {cur} is not present"))),
                Some(Witness::Signed) => return Ok(chain),
                Some(Witness::Unknown) => {
                    return Err(Error::NotFound(format!(
                        "record {name} has no proof yet: no signed record reaches it"
                    )));
                }
                Some(Witness::Next { next, .. }) => {
                    chain.push(next);
                    cur = next;
                }
            }
        }
    }

    /// A chain from `name` to a record for which `trusted` holds, shorter than the chain to
    /// a signature, by BFS over children; `None` when the signature chain is as short.
    pub fn chain_to_trusted(
        &self,
        name: &RecordName,
        trusted: impl Fn(&Hash) -> bool,
    ) -> Option<Vec<RecordName>> {
        if trusted(name.hash()) {
            return Some(vec![*name]);
        }
        // A record no signature reaches has no verified descendant either (a reader
        // trusts only names it verified back to a signature): nothing to search.
        let limit = self.witness(name)?.hops()?;
        let mut parent: HashMap<RecordName, RecordName> = HashMap::new();
        let mut queue = VecDeque::from([(*name, 0u32)]);
        while let Some((x, d)) = queue.pop_front() {
            if d + 1 >= limit {
                break;
            }
            for c in self.proven_children(&x) {
                // Only proven children: a path to a trusted record runs through proven
                // records alone, and a capsule's unsigned records (anyone may write them)
                // would otherwise make every proof walk all of them.
                if parent.contains_key(c) || c == name {
                    continue;
                }
                parent.insert(*c, x);
                if trusted(c.hash()) {
                    let mut chain = vec![*c];
                    let mut cur = *c;
                    while let Some(p) = parent.get(&cur) {
                        chain.push(*p);
                        cur = *p;
                    }
                    chain.reverse();
                    return Some(chain);
                }
                queue.push_back((*c, d + 1));
            }
        }
        None
    }
}
