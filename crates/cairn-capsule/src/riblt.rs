//! Rateless invertible Bloom lookup tables (Yang, Gilad, Alizadeh, "Practical Rateless Set
//! Reconciliation", SIGCOMM 2024): the set-reconciliation step of anti-entropy.
//!
//! One side streams *coded symbols* of its set; the other subtracts the coded symbols of
//! its own set at the same indices and peels the difference. About 1.35–1.7 coded symbols
//! per differing item suffice, whatever the sets' sizes, and the sender need not know the
//! difference in advance (rateless). Unlike DCS's Bloom filter, a successful decode is
//! complete: it lists every item of the symmetric difference, not most of them.
//!
//! Items are 32-byte digests (record names). Each coded symbol holds the XOR of its items,
//! the XOR of their 64-bit checksums (xxh3, which is not linear in XOR, so a pure symbol can
//! be recognised) and a count. Item `x` lands at index 0 and then at indices drawn by the
//! paper's mapping (density about `1/(1 + i/2)`), seeded by its checksum.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use crate::merkle::Digest;

/// One coded symbol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodedSymbol {
    /// XOR of the items mapped here.
    pub sum: Digest,
    /// XOR of their checksums.
    pub check: u64,
    /// Number of items mapped here (may go negative in a difference).
    pub count: i64,
}

impl CodedSymbol {
    fn apply(&mut self, item: &Digest, check: u64, sign: i64) {
        for (a, b) in self.sum.iter_mut().zip(item) {
            *a ^= b;
        }
        self.check ^= check;
        // Counts come from the peer: wrap rather than overflow (a wrapped count is no
        // longer ±1, so it is never peeled as an item).
        self.count = self.count.wrapping_add(sign);
    }

    fn is_zero(&self) -> bool {
        self.count == 0 && self.check == 0 && self.sum == [0; 32]
    }
}

/// The checksum of an item.
pub fn checksum(item: &Digest) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(item, 0x6361_6972_6e2d_7269)
}

/// The sequence of coded-symbol indices an item maps to.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    prng: u64,
    last: u64,
}

impl Mapping {
    fn new(check: u64) -> Self {
        Mapping {
            prng: check,
            last: 0,
        }
    }

    /// Advances to the next index (strictly greater than the current one).
    fn next_index(&mut self) -> u64 {
        let r = self.prng.wrapping_mul(0xda94_2042_e4dd_58b5);
        self.prng = r;
        let step = ((self.last as f64 + 1.5)
            * ((1u64 << 32) as f64 / ((r as f64) + 1.0).sqrt() - 1.0))
            .ceil();
        let step = if step.is_finite() && step >= 1.0 {
            step.min(u64::MAX as f64 / 2.0) as u64
        } else {
            1
        };
        self.last = self.last.saturating_add(step);
        self.last
    }
}

/// Produces coded symbols of a set, in index order, as many as asked.
pub struct Encoder {
    items: Vec<(Digest, u64)>,
    /// (next index, item position, mapping state)
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    maps: Vec<Mapping>,
    produced: u64,
}

impl Encoder {
    /// An encoder over `items` (duplicates are the caller's to avoid).
    pub fn new(items: impl IntoIterator<Item = Digest>) -> Self {
        let items: Vec<(Digest, u64)> = items.into_iter().map(|d| (d, checksum(&d))).collect();
        let maps: Vec<Mapping> = items.iter().map(|(_, c)| Mapping::new(*c)).collect();
        let heap = (0..items.len()).map(|i| Reverse((0u64, i))).collect();
        Encoder {
            items,
            heap,
            maps,
            produced: 0,
        }
    }

    /// Number of coded symbols produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// The next `n` coded symbols.
    pub fn next_symbols(&mut self, n: usize) -> Vec<CodedSymbol> {
        let start = self.produced;
        let end = start + n as u64;
        let mut out = vec![CodedSymbol::default(); n];
        while let Some(&Reverse((idx, i))) = self.heap.peek() {
            if idx >= end {
                break;
            }
            self.heap.pop();
            let (item, check) = self.items[i];
            out[(idx - start) as usize].apply(&item, check, 1);
            let next = self.maps[i].next_index();
            self.heap.push(Reverse((next, i)));
        }
        self.produced = end;
        out
    }
}

/// The outcome of decoding a difference.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Difference {
    /// Items only the remote side (the encoder of the received symbols) has.
    pub remote_only: Vec<Digest>,
    /// Items only the local side has.
    pub local_only: Vec<Digest>,
}

/// Peels `remote` coded symbols against the local set `local`. Returns `None` when these
/// symbols are not yet enough (ask for more).
pub fn decode(remote: &[CodedSymbol], local: &[Digest]) -> Option<Difference> {
    let n = remote.len();
    if n == 0 {
        return None;
    }
    let mut enc = Encoder::new(local.iter().copied());
    let mine = enc.next_symbols(n);
    let mut diff: Vec<CodedSymbol> = remote
        .iter()
        .zip(&mine)
        .map(|(r, m)| {
            let mut d = *r;
            d.apply(&m.sum, m.check, 0);
            d.count = d.count.wrapping_sub(m.count);
            d
        })
        .collect();
    let mut out = Difference::default();
    // Each index is queued at most once at a time, and each item is recovered at most
    // once: an honest difference never yields an item twice (peeling removes it from every
    // index it maps to), so hostile symbols that make an item reappear are refused at once
    // instead of being peeled back and forth. No difference found in `n` symbols holds more
    // than `n` items the remote side has and the local set's items.
    let mut queue: Vec<usize> = (0..n).collect();
    let mut queued = vec![true; n];
    let mut recovered: HashSet<Digest> = HashSet::new();
    let max_items = n.saturating_add(local.len());
    // Bound the work so hostile symbols cannot make peeling run long.
    let mut budget = 64 * n + 1024;
    while let Some(i) = queue.pop() {
        queued[i] = false;
        let c = diff[i];
        if (c.count != 1 && c.count != -1) || checksum(&c.sum) != c.check {
            continue;
        }
        if budget == 0 || recovered.len() >= max_items || !recovered.insert(c.sum) {
            return None;
        }
        budget -= 1;
        let item = c.sum;
        let sign = c.count;
        if sign == 1 {
            out.remote_only.push(item);
        } else {
            out.local_only.push(item);
        }
        let mut m = Mapping::new(c.check);
        let mut idx = 0u64;
        while (idx as usize) < n {
            let at = idx as usize;
            diff[at].apply(&item, c.check, -sign);
            if !queued[at] {
                queued[at] = true;
                queue.push(at);
            }
            idx = m.next_index();
        }
    }
    if diff.iter().all(CodedSymbol::is_zero) {
        Some(out)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::HashAlgo;

    fn item(i: u32) -> Digest {
        *HashAlgo::Blake3.digest(&i.to_le_bytes()).digest()
    }

    #[test]
    fn reconciles_with_few_symbols() {
        // Shared 5000 items; 40 only remote, 25 only local.
        let shared: Vec<Digest> = (0..5000).map(item).collect();
        let mut remote = shared.clone();
        remote.extend((10_000..10_040).map(item));
        let mut local = shared;
        local.extend((20_000..20_025).map(item));
        let mut enc = Encoder::new(remote.iter().copied());
        let mut syms = Vec::new();
        let diff = loop {
            syms.extend(enc.next_symbols(16));
            if let Some(d) = decode(&syms, &local) {
                break d;
            }
            assert!(syms.len() < 1000, "did not decode");
        };
        let mut r = diff.remote_only.clone();
        r.sort();
        let mut want: Vec<Digest> = (10_000..10_040).map(item).collect();
        want.sort();
        assert_eq!(r, want);
        assert_eq!(diff.local_only.len(), 25);
        // 65 differences need on the order of 1.35–1.7 × 65 symbols, not thousands.
        assert!(syms.len() <= 65 * 3, "{} symbols", syms.len());
    }

    /// Symbols that make one item reappear after it is peeled (the item at index 0 and
    /// minus it at its other indices) are refused at once, without peeling back and
    /// forth; and counts at the ends of the range do not overflow.
    #[test]
    fn hostile_symbols_are_refused_cheaply() {
        let x = item(7);
        let check = checksum(&x);
        // A whole batch: the old decoder peeled such symbols 33 million times and queued
        // hundreds of millions of indices.
        let n = 1 << 19;
        let mut syms = vec![CodedSymbol::default(); n];
        syms[0].apply(&x, check, 1);
        let mut m = Mapping::new(check);
        let mut idx = m.next_index();
        while (idx as usize) < n {
            syms[idx as usize].apply(&x, check, -1);
            idx = m.next_index();
        }
        let t = std::time::Instant::now();
        assert_eq!(decode(&syms, &[]), None);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        let mut extreme = vec![CodedSymbol::default(); 4];
        extreme[0].count = i64::MIN;
        extreme[1].count = i64::MAX;
        assert_eq!(decode(&extreme, &[item(1)]), None);
    }

    #[test]
    fn equal_sets_decode_empty_and_garbage_does_not() {
        let s: Vec<Digest> = (0..100).map(item).collect();
        let syms = Encoder::new(s.iter().copied()).next_symbols(4);
        assert_eq!(decode(&syms, &s), Some(Difference::default()));
        let mut bad = syms.clone();
        bad[0].sum[0] ^= 1;
        assert_eq!(decode(&bad, &s), None);
    }
}
