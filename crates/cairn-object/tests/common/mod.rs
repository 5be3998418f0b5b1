//! Helpers shared by the object layer's test files.

/// Pseudo-random bytes (xorshift): content-defined chunking needs non-repeating input.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
