//! `merkle_proofs` target: `cairn_capsule::merkle`'s RFC 6962 / 9162 verifiers.
//!
//! Input:
//!
//! ```text
//! u8 flags   bit 0: algorithm (0 BLAKE3, 1 SHA-256) · bit 1: structured · bit 2:
//!            consistency instead of inclusion
//! raw:        u64 a, u64 b (little-endian), then 32-byte digests d0, d1, path… (missing
//!             bytes are zero; a partial last digest is dropped)
//!             inclusion: index a, size b, leaf d0, root d1, path;
//!             consistency: first a, second b, first root d0, second root d1, proof
//! structured: u16 a, u16 b (little-endian), then up to MAX_EDITS edits of 4 bytes
//!             `op x y v` (below) to a valid proof from a log of LOG_SIZE leaves:
//!             inclusion of leaf a % size in the tree of size = 1 + b % LOG_SIZE leaves, or
//!             consistency from first = a % (second + 1) to second = b % (LOG_SIZE + 1)
//! ```
//!
//! The valid proof is held as `index`/`size` (or `first`/`second`) and a list of digests:
//! slot 0 the leaf (or first root), slot 1 the root (or second root), slots 2… the path.
//! Edit ops (`op % 8`): 0 xor byte `y % 32` of slot `x` with `v` · 1 copy slot `x` to slot
//! `y` · 2 swap slots `x` and `y` · 3 remove path slot `x` · 4 insert a copy of slot `x` into
//! the path at `y` · 5 xor `index`/`first` with `v << 8·(x % 8)` · 6 the same for
//! `size`/`second` · 7 append a digest filled with `v` (slot numbers modulo the count).
//!
//! Checks: never a panic, with any sizes and paths (raw). Soundness (structured): when the
//! edited proof still verifies, and its root is the log's true root for its size (the
//! verifier trusts a `(size, root)` pair from a signed checkpoint, so only those claims can
//! be checked), the claim must be true and the proof must be the log's own: for inclusion,
//! the leaf is the log's leaf at that index and the path the log's audit path; for
//! consistency, the first root is the log's root at that size (any when `first` is 0, the
//! empty tree) and the proof the log's consistency proof. Unedited claims thus admit only
//! the original proof.

use std::sync::OnceLock;

use cairn_capsule::merkle::{self, Digest, MerkleLog, Walk, verify_consistency, verify_inclusion};
use cairn_core::HashAlgo;

/// Leaves in the structured target's log.
pub const LOG_SIZE: u64 = 600;
/// Most edits one structured input applies.
pub const MAX_EDITS: usize = 64;
/// Most digests a structured proof may grow to.
const MAX_SLOTS: usize = 80;

/// The log of [`LOG_SIZE`] leaves `H(0x00 ‖ i as u64 LE)`, built once per algorithm.
pub fn log(algo: HashAlgo) -> &'static MerkleLog {
    static LOGS: [OnceLock<MerkleLog>; 2] = [OnceLock::new(), OnceLock::new()];
    let i = usize::from(algo == HashAlgo::Sha256);
    LOGS[i].get_or_init(|| {
        let mut l = MerkleLog::new(algo);
        for k in 0..LOG_SIZE {
            l.push(merkle::leaf_hash(algo, &k.to_le_bytes()));
        }
        l
    })
}

fn algo_of(flags: u8) -> HashAlgo {
    if flags & 1 == 0 {
        HashAlgo::Blake3
    } else {
        HashAlgo::Sha256
    }
}

/// `merkle_proofs` (input format in the module documentation).
pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let algo = algo_of(flags);
    let consistency = flags & 4 != 0;
    if flags & 2 == 0 {
        run_raw(algo, consistency, rest);
    } else {
        run_structured(algo, consistency, rest);
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    for (i, x) in a.iter_mut().enumerate() {
        *x = b.get(off + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(a)
}

fn digest_at(b: &[u8], off: usize) -> Digest {
    let mut d = [0u8; 32];
    for (i, x) in d.iter_mut().enumerate() {
        *x = b.get(off + i).copied().unwrap_or(0);
    }
    d
}

fn run_raw(algo: HashAlgo, consistency: bool, b: &[u8]) {
    let (x, y) = (u64_at(b, 0), u64_at(b, 8));
    let (d0, d1) = (digest_at(b, 16), digest_at(b, 48));
    let path: Vec<Digest> = b
        .get(80..)
        .unwrap_or(&[])
        .chunks_exact(32)
        .map(|c| c.try_into().unwrap())
        .collect();
    if consistency {
        let _ = verify_consistency(algo, x, y, &d0, &d1, &path);
        return;
    }
    let ok = verify_inclusion(algo, x, y, &d0, &path, &d1).is_ok();
    let walk = merkle::inclusion_walk(algo, x, y, &d0, &path, |_| false);
    assert_eq!(
        ok,
        matches!(walk, Ok(Walk::Root(r)) if r == d1),
        "verify_inclusion disagrees with inclusion_walk"
    );
    // Stopping at the root digest, or at a path element, must not panic either.
    let stopped = merkle::inclusion_walk(algo, x, y, &d0, &path, |d| d == &d1);
    if let Ok(Walk::Stopped { steps, .. }) = stopped {
        assert!(steps <= path.len());
    }
    let nodes = merkle::inclusion_nodes(algo, x, y, &d0, &path);
    assert!(!nodes.is_empty() && nodes.len() <= path.len() + 1);
    assert_eq!(nodes[0], d0);
    if ok {
        assert_eq!(
            nodes.last(),
            Some(&d1),
            "inclusion_nodes does not end at the root"
        );
    }
}

/// A proof under edit: two numbers and digest slots (see the module documentation).
struct Edited {
    x: u64,
    y: u64,
    slots: Vec<Digest>,
}

impl Edited {
    fn apply(&mut self, edits: &[u8]) {
        for e in edits.chunks_exact(4).take(MAX_EDITS) {
            let (a, b, v) = (e[1] as usize, e[2] as usize, e[3]);
            let n = self.slots.len();
            match e[0] % 8 {
                0 => self.slots[a % n][b % 32] ^= v,
                1 => self.slots[b % n] = self.slots[a % n],
                2 => self.slots.swap(a % n, b % n),
                3 if n > 2 => {
                    self.slots.remove(2 + a % (n - 2));
                }
                4 if n < MAX_SLOTS => {
                    let d = self.slots[a % n];
                    self.slots.insert(2 + b % (n - 1), d);
                }
                5 => self.x ^= u64::from(v) << (8 * (a % 8)),
                6 => self.y ^= u64::from(v) << (8 * (a % 8)),
                7 if n < MAX_SLOTS => self.slots.push([v; 32]),
                _ => {}
            }
        }
    }
}

fn run_structured(algo: HashAlgo, consistency: bool, b: &[u8]) {
    let [a0, a1, b0, b1, edits @ ..] = b else {
        return;
    };
    let (a, b) = (
        u64::from(u16::from_le_bytes([*a0, *a1])),
        u64::from(u16::from_le_bytes([*b0, *b1])),
    );
    let log = log(algo);
    let root_at = |size: u64| log.root_at(size).ok();
    if consistency {
        let second = b % (LOG_SIZE + 1);
        let first = a % (second + 1);
        let proof = log.consistency_proof(first, second).unwrap();
        let (r1, r2) = (root_at(first).unwrap(), root_at(second).unwrap());
        verify_consistency(algo, first, second, &r1, &r2, &proof)
            .expect("the log's own consistency proof verifies");
        let mut p = Edited {
            x: first,
            y: second,
            slots: [r1, r2].into_iter().chain(proof).collect(),
        };
        p.apply(edits);
        let (f, s) = (p.x, p.y);
        let (r1, r2) = (p.slots[0], p.slots[1]);
        let proof = &p.slots[2..];
        if verify_consistency(algo, f, s, &r1, &r2, proof).is_ok() && root_at(s) == Some(r2) {
            assert!(f <= s, "verified consistency {f} -> {s}");
            assert!(
                f == 0 || root_at(f) == Some(r1),
                "FORGERY: consistency {f} -> {s} verified with a wrong first root"
            );
            assert_eq!(
                proof,
                &log.consistency_proof(f, s).unwrap()[..],
                "edited consistency proof {f} -> {s} verifies but is not the log's"
            );
        }
    } else {
        let size = 1 + b % LOG_SIZE;
        let index = a % size;
        let path = log.inclusion_proof(index, size).unwrap();
        let leaf = log.leaf(index).unwrap();
        let root = root_at(size).unwrap();
        verify_inclusion(algo, index, size, &leaf, &path, &root)
            .expect("the log's own inclusion proof verifies");
        let mut p = Edited {
            x: index,
            y: size,
            slots: [leaf, root].into_iter().chain(path).collect(),
        };
        p.apply(edits);
        let (i, s) = (p.x, p.y);
        let (leaf, root) = (p.slots[0], p.slots[1]);
        let path = &p.slots[2..];
        if verify_inclusion(algo, i, s, &leaf, path, &root).is_ok() && root_at(s) == Some(root) {
            assert!(i < s, "verified leaf {i} of {s}");
            assert_eq!(
                log.leaf(i),
                Some(leaf),
                "FORGERY: a leaf that is not the log's verified at {i} of {s}"
            );
            assert_eq!(
                path,
                &log.inclusion_proof(i, s).unwrap()[..],
                "edited inclusion proof of {i} in {s} verifies but is not the log's"
            );
        }
    }
}
