//! RFC 6962 / RFC 9162 Merkle trees: the hashing, inclusion proofs and consistency proofs
//! that the per-capsule [`MerkleLog`] and subrecord trees ([`crate::proof::SubrecordProof`]) share.
//!
//! Hashing is domain-separated exactly as RFC 6962 §2.1: a leaf is `H(0x00 ‖ data)`, an
//! interior node `H(0x01 ‖ left ‖ right)`, the empty tree `H("")`, with `H` the capsule's
//! hash algorithm (BLAKE3 by default; with SHA-256 the roots match the RFC's published test
//! vectors, which the tests check). Record names and capsule chunks start with other bytes,
//! so no node can be mistaken for a record.
//!
//! The tree recursion is the RFC's: a tree of `n` leaves splits at the largest power of two
//! below `n`. [`MerkleLog`] keeps every complete, aligned subtree's hash (about `2n` digests),
//! so a root, an inclusion proof or a consistency proof costs `O(log n)` lookups plus at
//! most `O(log² n)` hashes for the ragged right edge. A multiproof ([`MerkleLog::multi_proof`],
//! [`multi_root`]) proves several leaves at once with the siblings their paths share sent
//! once.

use cairn_core::{Error, HashAlgo, Result};

/// A 32-byte digest inside a Merkle tree (the algorithm is the tree's).
pub type Digest = [u8; 32];

/// `H(0x00 ‖ data)`.
pub fn leaf_hash(algo: HashAlgo, data: &[u8]) -> Digest {
    *algo.digest_parts(&[&[0x00], data]).digest()
}

/// `H(0x01 ‖ left ‖ right)`.
pub fn node_hash(algo: HashAlgo, left: &Digest, right: &Digest) -> Digest {
    let mut buf = [0u8; 65];
    buf[0] = 0x01;
    buf[1..33].copy_from_slice(left);
    buf[33..].copy_from_slice(right);
    *algo.digest(&buf).digest()
}

/// The root of the empty tree, `H("")`.
pub fn empty_root(algo: HashAlgo) -> Digest {
    *algo.digest(&[]).digest()
}

/// The largest power of two strictly below `n` (`n >= 2`).
fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1u64 << (63 - (n - 1).leading_zeros())
}

/// MTH over already-hashed leaves, by the RFC recursion.
pub fn root_of(algo: HashAlgo, leaves: &[Digest]) -> Digest {
    match leaves.len() {
        0 => empty_root(algo),
        1 => leaves[0],
        n => {
            let k = split_point(n as u64) as usize;
            node_hash(
                algo,
                &root_of(algo, &leaves[..k]),
                &root_of(algo, &leaves[k..]),
            )
        }
    }
}

/// Checks an RFC 9162 §2.1.3.2 inclusion proof: leaf `leaf` at `index` in a tree of `size`
/// leaves whose root is `root`.
pub fn verify_inclusion(
    algo: HashAlgo,
    index: u64,
    size: u64,
    leaf: &Digest,
    path: &[Digest],
    root: &Digest,
) -> Result<()> {
    let computed = inclusion_walk(algo, index, size, leaf, path, |_| false)?;
    match computed {
        Walk::Root(r) if &r == root => Ok(()),
        _ => Err(Error::Rejected(format!(
            "inclusion proof for leaf {index} of {size} does not lead to the root"
        ))),
    }
}

/// Where an inclusion walk ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Walk {
    /// The whole path was consumed; this is the computed root.
    Root(Digest),
    /// The walk reached a node for which `stop` returned true (a cached, trusted node)
    /// after `steps` path elements.
    Stopped {
        /// The trusted node reached.
        node: Digest,
        /// Path elements consumed before it.
        steps: usize,
    },
}

/// Walks an inclusion path from `leaf` upward, stopping early at the first node (the leaf
/// included) for which `stop` is true. [`inclusion_nodes`] lists the nodes it computes.
pub fn inclusion_walk(
    algo: HashAlgo,
    index: u64,
    size: u64,
    leaf: &Digest,
    path: &[Digest],
    stop: impl FnMut(&Digest) -> bool,
) -> Result<Walk> {
    walk_with(algo, index, size, leaf, path.len(), |i| path[i], stop)
}

/// [`inclusion_walk`] over a path of `len` elements that `sibling(i)` produces when the
/// walk reaches element `i` (never past the element it stops at).
fn walk_with(
    algo: HashAlgo,
    index: u64,
    size: u64,
    leaf: &Digest,
    len: usize,
    mut sibling: impl FnMut(usize) -> Digest,
    mut stop: impl FnMut(&Digest) -> bool,
) -> Result<Walk> {
    if index >= size {
        return Err(Error::Rejected(format!(
            "leaf index {index} is outside a tree of {size}"
        )));
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    if stop(&r) {
        return Ok(Walk::Stopped { node: r, steps: 0 });
    }
    for i in 0..len {
        if snode == 0 {
            return Err(Error::Rejected("inclusion proof is too long".into()));
        }
        let p = sibling(i);
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(algo, &p, &r);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            r = node_hash(algo, &r, &p);
        }
        fnode >>= 1;
        snode >>= 1;
        if stop(&r) {
            return Ok(Walk::Stopped {
                node: r,
                steps: i + 1,
            });
        }
    }
    if snode != 0 {
        return Err(Error::Rejected("inclusion proof is too short".into()));
    }
    Ok(Walk::Root(r))
}

/// Recomputes the root of a tree of `size` leaves from some of its leaves and a
/// multiproof (see [`MerkleLog::multi_proof`]): `leaves` are `(index, leaf hash)` pairs in
/// strictly increasing index order, `siblings` the hashes of the subtrees that hold none of
/// them, left to right. Every sibling must be used: a proof with one too many or too few
/// is rejected, as are indices out of order or outside the tree.
///
/// As with a single inclusion path, the root does not bind `size` by itself (leaves
/// proven only in a tree's left part give the same root for sizes that differ on the
/// right): check `size` against what the root was signed with.
pub fn multi_root(
    algo: HashAlgo,
    size: u64,
    leaves: &[(u64, Digest)],
    siblings: &[Digest],
) -> Result<Digest> {
    if leaves.is_empty() {
        return Err(Error::Rejected("multiproof proves no leaf".into()));
    }
    for w in leaves.windows(2) {
        if w[0].0 >= w[1].0 {
            return Err(Error::Rejected(
                "multiproof leaves are not in strictly increasing order".into(),
            ));
        }
    }
    if let Some(&(last, _)) = leaves.last()
        && last >= size
    {
        return Err(Error::Rejected(format!(
            "leaf index {last} is outside a tree of {size}"
        )));
    }
    let mut next = 0usize;
    let root = multi_walk(algo, 0, size, leaves, siblings, &mut next)?;
    if next != siblings.len() {
        return Err(Error::Rejected(format!(
            "multiproof has {} siblings, {next} used",
            siblings.len()
        )));
    }
    Ok(root)
}

/// The subtree hash of leaves `start..end` given the proven `leaves` inside it (sorted,
/// all within the range) and the siblings from `next` on.
fn multi_walk(
    algo: HashAlgo,
    start: u64,
    end: u64,
    leaves: &[(u64, Digest)],
    siblings: &[Digest],
    next: &mut usize,
) -> Result<Digest> {
    if leaves.is_empty() {
        let d = siblings
            .get(*next)
            .ok_or_else(|| Error::Rejected("multiproof is missing siblings".into()))?;
        *next += 1;
        return Ok(*d);
    }
    let n = end - start;
    if n == 1 {
        // The caller checked the order and the bounds: the one leaf here is `start`.
        return Ok(leaves[0].1);
    }
    let k = split_point(n);
    let split = leaves.partition_point(|(i, _)| *i < start + k);
    let left = multi_walk(algo, start, start + k, &leaves[..split], siblings, next)?;
    let right = multi_walk(algo, start + k, end, &leaves[split..], siblings, next)?;
    Ok(node_hash(algo, &left, &right))
}

/// The nodes an inclusion path computes, leaf first (the leaf, then each parent), for the
/// first `steps` elements of `path`. Only meaningful after the path verified.
pub fn inclusion_nodes(
    algo: HashAlgo,
    index: u64,
    size: u64,
    leaf: &Digest,
    path: &[Digest],
) -> Vec<Digest> {
    let mut out = vec![*leaf];
    let _ = inclusion_walk(algo, index, size, leaf, path, |d| {
        if out.last() != Some(d) {
            out.push(*d);
        }
        false
    });
    out
}

/// Checks an RFC 9162 §2.1.4.2 consistency proof between a tree of `first` leaves with root
/// `first_root` and a tree of `second` leaves with root `second_root`.
pub fn verify_consistency(
    algo: HashAlgo,
    first: u64,
    second: u64,
    first_root: &Digest,
    second_root: &Digest,
    proof: &[Digest],
) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::Rejected(format!(
            "consistency proof {first} → {second}: {why}"
        )))
    };
    if first > second {
        return bad("the first tree is larger than the second");
    }
    if first == second {
        return if proof.is_empty() && first_root == second_root {
            Ok(())
        } else {
            bad("equal sizes need an empty proof and equal roots")
        };
    }
    if first == 0 {
        // Every tree extends the empty tree; nothing to prove.
        return if proof.is_empty() && *first_root == empty_root(algo) {
            Ok(())
        } else {
            bad("a proof from the empty tree must be empty and start at the empty root")
        };
    }
    let mut path: Vec<Digest> = Vec::with_capacity(proof.len() + 1);
    if first.is_power_of_two() {
        path.push(*first_root);
    }
    path.extend_from_slice(proof);
    if path.is_empty() {
        return bad("empty proof");
    }
    let (mut fnode, mut snode) = (first - 1, second - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if snode == 0 {
            return bad("proof is too long");
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(algo, c, &fr);
            sr = node_hash(algo, c, &sr);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            sr = node_hash(algo, &sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return bad("proof is too short");
    }
    if &fr != first_root || &sr != second_root {
        return bad("roots do not match");
    }
    Ok(())
}

/// An append-only Merkle log (RFC 6962) with every complete aligned subtree cached.
#[derive(Clone, Debug)]
pub struct MerkleLog {
    algo: HashAlgo,
    /// `levels[k][i]` = hash of leaves `[i·2^k, (i+1)·2^k)`; `levels[0]` are the leaf hashes.
    levels: Vec<Vec<Digest>>,
}

impl MerkleLog {
    /// An empty log hashing with `algo`.
    pub fn new(algo: HashAlgo) -> Self {
        MerkleLog {
            algo,
            levels: vec![Vec::new()],
        }
    }

    /// The hash algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Number of leaves.
    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    /// Appends a leaf whose leaf hash (`H(0x00 ‖ data)`) is `leaf`; returns its index.
    pub fn push(&mut self, leaf: Digest) -> u64 {
        let index = self.size();
        self.levels[0].push(leaf);
        let mut level = 0;
        while self.levels[level].len().is_multiple_of(2) {
            let n = self.levels[level].len();
            let parent = node_hash(
                self.algo,
                &self.levels[level][n - 2],
                &self.levels[level][n - 1],
            );
            if self.levels.len() == level + 1 {
                self.levels.push(Vec::new());
            }
            self.levels[level + 1].push(parent);
            level += 1;
        }
        index
    }

    /// The leaf hash at `index`.
    pub fn leaf(&self, index: u64) -> Option<Digest> {
        self.levels[0].get(index as usize).copied()
    }

    /// MTH of leaves `[start, end)`, `start < end <= size`.
    fn subtree(&self, start: u64, end: u64) -> Digest {
        let n = end - start;
        if n.is_power_of_two() && start.is_multiple_of(n) {
            let k = n.trailing_zeros() as usize;
            return self.levels[k][(start >> k) as usize];
        }
        let k = split_point(n);
        node_hash(
            self.algo,
            &self.subtree(start, start + k),
            &self.subtree(start + k, end),
        )
    }

    /// The root of the log's first `size` leaves.
    pub fn root_at(&self, size: u64) -> Result<Digest> {
        if size > self.size() {
            return Err(Error::NotFound(format!(
                "log has {} leaves, not {size}",
                self.size()
            )));
        }
        Ok(if size == 0 {
            empty_root(self.algo)
        } else {
            self.subtree(0, size)
        })
    }

    /// The current root.
    pub fn root(&self) -> Digest {
        // size <= size always holds.
        self.root_at(self.size())
            .unwrap_or_else(|_| empty_root(self.algo))
    }

    /// The inclusion proof (audit path) of leaf `index` in the tree of the first `size`
    /// leaves.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Digest>> {
        if size > self.size() || index >= size {
            return Err(Error::NotFound(format!(
                "no leaf {index} in a tree of {size} (log has {})",
                self.size()
            )));
        }
        let mut out = Vec::new();
        self.path(index, 0, size, &mut out);
        Ok(out)
    }

    /// Walks leaf `index`'s inclusion path in the first `size` leaves up from `leaf` (its
    /// leaf hash) as [`inclusion_walk`] does, stopping at the first node for which `stop`
    /// is true, but computes each sibling only when the walk reaches it: a walk that stops
    /// low never hashes the right-edge subtrees near the top. Returns the siblings
    /// consumed (the proof's path, cut where the walk stopped) and how the walk ended.
    pub fn walk_inclusion(
        &self,
        index: u64,
        size: u64,
        leaf: &Digest,
        stop: impl FnMut(&Digest) -> bool,
    ) -> Result<(Vec<Digest>, Walk)> {
        if size > self.size() || index >= size {
            return Err(Error::NotFound(format!(
                "no leaf {index} in a tree of {size} (log has {})",
                self.size()
            )));
        }
        let mut ranges = Vec::new();
        Self::path_ranges(index, 0, size, &mut ranges);
        let mut used = Vec::with_capacity(ranges.len());
        let walk = walk_with(
            self.algo,
            index,
            size,
            leaf,
            ranges.len(),
            |i| {
                let d = self.subtree(ranges[i].0, ranges[i].1);
                used.push(d);
                d
            },
            stop,
        )?;
        Ok((used, walk))
    }

    /// A multiproof for the leaves at `indices` (strictly increasing) in the tree of the
    /// first `size` leaves: the hashes of the maximal subtrees that hold none of them, left
    /// to right. With the leaves, they give the root ([`multi_root`]); proving every leaf
    /// of a tree takes no sibling at all, and each sibling is shared by all the leaves
    /// beside it, where separate paths would repeat it.
    pub fn multi_proof(&self, indices: &[u64], size: u64) -> Result<Vec<Digest>> {
        if size > self.size() {
            return Err(Error::NotFound(format!(
                "no tree of {size} leaves (log has {})",
                self.size()
            )));
        }
        if indices.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(
                "multiproof indices must be strictly increasing",
            ));
        }
        if let Some(&last) = indices.last()
            && last >= size
        {
            return Err(Error::NotFound(format!(
                "no leaf {last} in a tree of {size}"
            )));
        }
        let mut out = Vec::new();
        self.multi_siblings(0, size, indices, &mut out);
        Ok(out)
    }

    fn multi_siblings(&self, start: u64, end: u64, indices: &[u64], out: &mut Vec<Digest>) {
        if indices.is_empty() {
            out.push(self.subtree(start, end));
            return;
        }
        let n = end - start;
        if n == 1 {
            return;
        }
        let k = split_point(n);
        let split = indices.partition_point(|i| *i < start + k);
        self.multi_siblings(start, start + k, &indices[..split], out);
        self.multi_siblings(start + k, end, &indices[split..], out);
    }

    /// The leaf ranges whose subtree hashes make up leaf `m`'s inclusion path in
    /// `start..end`, leaf level first.
    fn path_ranges(m: u64, start: u64, end: u64, out: &mut Vec<(u64, u64)>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = split_point(n);
        if m < k {
            Self::path_ranges(m, start, start + k, out);
            out.push((start + k, end));
        } else {
            Self::path_ranges(m - k, start + k, end, out);
            out.push((start, start + k));
        }
    }

    fn path(&self, m: u64, start: u64, end: u64, out: &mut Vec<Digest>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = split_point(n);
        if m < k {
            self.path(m, start, start + k, out);
            out.push(self.subtree(start + k, end));
        } else {
            self.path(m - k, start + k, end, out);
            out.push(self.subtree(start, start + k));
        }
    }

    /// The consistency proof from the tree of the first `first` leaves to the tree of the
    /// first `second` leaves.
    pub fn consistency_proof(&self, first: u64, second: u64) -> Result<Vec<Digest>> {
        if second > self.size() || first > second {
            return Err(Error::invalid(format!(
                "no consistency proof from {first} to {second} leaves (log has {})",
                self.size()
            )));
        }
        let mut out = Vec::new();
        if first > 0 && first < second {
            self.subproof(first, 0, second, true, &mut out);
        }
        Ok(out)
    }

    fn subproof(&self, m: u64, start: u64, end: u64, complete: bool, out: &mut Vec<Digest>) {
        let n = end - start;
        if m == n {
            if !complete {
                out.push(self.subtree(start, end));
            }
            return;
        }
        let k = split_point(n);
        if m <= k {
            self.subproof(m, start, start + k, complete, out);
            out.push(self.subtree(start + k, end));
        } else {
            self.subproof(m - k, start + k, end, false, out);
            out.push(self.subtree(start, start + k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT_LEAVES: [&str; 8] = [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ];
    // RFC 6962 reference roots for sizes 0..=8 (certificate-transparency test data).
    const CT_ROOTS: [&str; 9] = [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    fn ct_log() -> MerkleLog {
        let mut log = MerkleLog::new(HashAlgo::Sha256);
        for l in CT_LEAVES {
            log.push(leaf_hash(HashAlgo::Sha256, &hex::decode(l).unwrap()));
        }
        log
    }

    #[test]
    fn roots_match_rfc6962_vectors() {
        let log = ct_log();
        for (size, want) in CT_ROOTS.iter().enumerate() {
            assert_eq!(hex::encode(log.root_at(size as u64).unwrap()), *want);
            let leaves: Vec<Digest> = (0..size).map(|i| log.leaf(i as u64).unwrap()).collect();
            assert_eq!(hex::encode(root_of(HashAlgo::Sha256, &leaves)), *want);
        }
    }

    #[test]
    fn inclusion_proof_matches_rfc_vector() {
        let log = ct_log();
        let p = log.inclusion_proof(0, 8).unwrap();
        let want = [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ];
        assert_eq!(p.iter().map(hex::encode).collect::<Vec<_>>(), want);
    }

    /// Every inclusion and consistency proof in every tree up to 40 leaves verifies, and
    /// every single-bit or length change of a proof is refused.
    #[test]
    fn all_proofs_verify_and_tampering_fails() {
        for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
            let mut log = MerkleLog::new(algo);
            for i in 0..40u32 {
                log.push(leaf_hash(algo, &i.to_le_bytes()));
            }
            for size in 1..=40u64 {
                let root = log.root_at(size).unwrap();
                for index in 0..size {
                    let leaf = log.leaf(index).unwrap();
                    let path = log.inclusion_proof(index, size).unwrap();
                    verify_inclusion(algo, index, size, &leaf, &path, &root).unwrap();
                    if !path.is_empty() {
                        let mut bad = path.clone();
                        bad[0][3] ^= 1;
                        assert!(verify_inclusion(algo, index, size, &leaf, &bad, &root).is_err());
                        assert!(
                            verify_inclusion(algo, index, size, &leaf, &path[1..], &root).is_err()
                        );
                    }
                    let mut longer = path.clone();
                    longer.push(root);
                    assert!(verify_inclusion(algo, index, size, &leaf, &longer, &root).is_err());
                    if size > 1 {
                        let other = (index + 1) % size;
                        assert!(verify_inclusion(algo, other, size, &leaf, &path, &root).is_err());
                    }
                }
                for first in 0..=size {
                    let proof = log.consistency_proof(first, size).unwrap();
                    let r1 = log.root_at(first).unwrap();
                    verify_consistency(algo, first, size, &r1, &root, &proof).unwrap();
                    if !proof.is_empty() {
                        let mut bad = proof.clone();
                        let last = bad.len() - 1;
                        bad[last][0] ^= 0x80;
                        assert!(verify_consistency(algo, first, size, &r1, &root, &bad).is_err());
                        assert!(
                            verify_consistency(algo, first, size, &r1, &root, &proof[1..]).is_err()
                        );
                    }
                    if first > 0 && first < size {
                        let wrong = log.root_at(first - 1).unwrap();
                        assert!(
                            verify_consistency(algo, first, size, &wrong, &root, &proof).is_err()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn walk_stops_at_trusted_node() {
        let algo = HashAlgo::Blake3;
        let leaves: Vec<Digest> = (0..13u8).map(|i| leaf_hash(algo, &[i])).collect();
        let mut log = MerkleLog::new(algo);
        for l in &leaves {
            log.push(*l);
        }
        let path = log.inclusion_proof(5, 13).unwrap();
        let nodes = inclusion_nodes(algo, 5, 13, &leaves[5], &path);
        assert_eq!(nodes.len(), path.len() + 1);
        assert_eq!(*nodes.last().unwrap(), log.root());
        // A trusted node two levels up stops the walk after two steps.
        let trusted = nodes[2];
        let w = inclusion_walk(algo, 5, 13, &leaves[5], &path[..2], |d| *d == trusted).unwrap();
        assert_eq!(
            w,
            Walk::Stopped {
                node: trusted,
                steps: 2
            }
        );
    }

    /// The lazy walk gives exactly what the eager one gives over the full path: for every
    /// size, leaf and stopping node (none, the leaf, each node up to the root), the same
    /// end and exactly the path elements consumed.
    #[test]
    fn lazy_walk_matches_the_full_path_walk() {
        let algo = HashAlgo::Blake3;
        let mut log = MerkleLog::new(algo);
        for i in 0..70u32 {
            log.push(leaf_hash(algo, &i.to_le_bytes()));
        }
        for size in 1..=70u64 {
            for index in 0..size {
                let leaf = log.leaf(index).unwrap();
                let full = log.inclusion_proof(index, size).unwrap();
                let nodes = inclusion_nodes(algo, index, size, &leaf, &full);
                let mut stops: Vec<Option<Digest>> = vec![None];
                stops.extend(nodes.iter().copied().map(Some));
                for stop in stops {
                    let eager =
                        inclusion_walk(algo, index, size, &leaf, &full, |d| Some(*d) == stop)
                            .unwrap();
                    let (used, lazy) = log
                        .walk_inclusion(index, size, &leaf, |d| Some(*d) == stop)
                        .unwrap();
                    assert_eq!(lazy, eager, "size {size} index {index}");
                    let steps = match eager {
                        Walk::Stopped { steps, .. } => steps,
                        Walk::Root(r) => {
                            assert_eq!(r, log.root_at(size).unwrap());
                            full.len()
                        }
                    };
                    assert_eq!(used, full[..steps], "size {size} index {index}");
                }
            }
        }
        assert!(log.walk_inclusion(70, 70, &[0; 32], |_| false).is_err());
        assert!(log.walk_inclusion(0, 71, &[0; 32], |_| false).is_err());
    }

    /// Multiproofs against a model: for random subsets of random trees, the proof gives
    /// the tree's root, proving every leaf takes no sibling, and no proof takes more
    /// siblings than separate paths would; any sibling changed, dropped or added, and any
    /// leaf moved or changed, is refused or gives another root.
    mod multiproof {
        use super::*;
        use proptest::prelude::*;

        fn log_of(algo: HashAlgo, n: u64) -> MerkleLog {
            let mut log = MerkleLog::new(algo);
            for i in 0..n {
                log.push(leaf_hash(algo, &i.to_le_bytes()));
            }
            log
        }

        proptest! {
            #[test]
            fn multiproofs_give_the_root_and_tampering_fails(
                size in 1u64..300,
                picks in proptest::collection::vec(any::<u64>(), 1..40),
                flip in any::<usize>(),
            ) {
                let algo = HashAlgo::Blake3;
                let log = log_of(algo, size + 5);
                let mut idx: Vec<u64> = picks.iter().map(|p| p % size).collect();
                idx.sort_unstable();
                idx.dedup();
                let leaves: Vec<(u64, Digest)> =
                    idx.iter().map(|&i| (i, log.leaf(i).unwrap())).collect();
                let sib = log.multi_proof(&idx, size).unwrap();
                let root = log.root_at(size).unwrap();
                prop_assert_eq!(multi_root(algo, size, &leaves, &sib).unwrap(), root);
                let separate: usize =
                    idx.iter().map(|&i| log.inclusion_proof(i, size).unwrap().len()).sum();
                prop_assert!(sib.len() <= separate);
                // Tampering.
                if !sib.is_empty() {
                    let mut bad = sib.clone();
                    bad[flip % sib.len()][flip % 32] ^= 1 << (flip % 8);
                    prop_assert_ne!(multi_root(algo, size, &leaves, &bad).ok(), Some(root));
                    prop_assert!(multi_root(algo, size, &leaves, &sib[1..]).is_err());
                }
                let mut more = sib.clone();
                more.push([7; 32]);
                prop_assert!(multi_root(algo, size, &leaves, &more).is_err());
                let mut changed = leaves.clone();
                let j = flip % changed.len();
                changed[j].1[0] ^= 1;
                prop_assert_ne!(multi_root(algo, size, &changed, &sib).ok(), Some(root));
                // Move one leaf to an index not proven: refused or another root.
                if let Some(free) = (0..size).find(|i| !idx.contains(i)) {
                    let mut moved = leaves.clone();
                    moved[j].0 = free;
                    moved.sort_by_key(|l| l.0);
                    prop_assert_ne!(multi_root(algo, size, &moved, &sib).ok(), Some(root));
                }
            }
        }

        #[test]
        fn every_leaf_takes_no_sibling_and_bad_input_is_refused() {
            let algo = HashAlgo::Sha256;
            let log = log_of(algo, 1000);
            let all: Vec<u64> = (0..1000).collect();
            assert!(log.multi_proof(&all, 1000).unwrap().is_empty());
            let leaves: Vec<(u64, Digest)> =
                all.iter().map(|&i| (i, log.leaf(i).unwrap())).collect();
            assert_eq!(multi_root(algo, 1000, &leaves, &[]).unwrap(), log.root());
            assert!(log.multi_proof(&[3, 3], 10).is_err());
            assert!(log.multi_proof(&[5, 2], 10).is_err());
            assert!(log.multi_proof(&[10], 10).is_err());
            assert!(log.multi_proof(&[1], 1001).is_err());
            let two = [(5, leaves[5].1), (5, leaves[5].1)];
            assert!(multi_root(algo, 10, &two, &[]).is_err());
            assert!(multi_root(algo, 10, &[(10, leaves[0].1)], &[]).is_err());
            assert!(multi_root(algo, 10, &[], &[]).is_err());
        }
    }
}
