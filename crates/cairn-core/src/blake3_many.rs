//! BLAKE3 of many independent messages at once, 16 SIMD lanes wide (AVX-512).
//!
//! The `blake3` crate hashes one message at a time; its SIMD lanes work on the chunks
//! (1 KiB pieces) of that message, so a 4 to 5 KiB POS-tree leaf keeps at most four lanes
//! busy and its last, partial chunk and its parent nodes run one compression at a time.
//! Here every compression of a whole batch of messages (each chunk, then each level of
//! parent nodes) is a *job*, and jobs from different messages fill the 16 lanes of one
//! AVX-512 pass. The result is plain BLAKE3 (the same tree, chunk counters, flags and
//! root): only the order of the work differs, and the tests compare every output with
//! `blake3::hash`.
//!
//! Without AVX-512 (checked at run time) [`hash_many`] falls back to `blake3::hash` per
//! message.

const IV: [u32; 8] = [
    0x6A09_E667,
    0xBB67_AE85,
    0x3C6E_F372,
    0xA54F_F53A,
    0x510E_527F,
    0x9B05_688C,
    0x1F83_D9AB,
    0x5BE0_CD19,
];

const CHUNK_LEN: usize = 1024;
const BLOCK_LEN: usize = 64;
const CHUNK_START: u8 = 1 << 0;
const CHUNK_END: u8 = 1 << 1;
const PARENT: u8 = 1 << 2;
const ROOT: u8 = 1 << 3;

/// One compression sequence: the blocks of `data` (a chunk of at most 1 KiB, or one
/// 64-byte parent block) chained from the IV.
#[derive(Clone, Copy)]
struct Job<'a> {
    data: &'a [u8],
    counter: u64,
    /// Flags on every block.
    flags: u8,
    /// Extra flags on the first block.
    first: u8,
    /// Extra flags on the last block.
    last: u8,
    /// Where the chaining value goes.
    dst: u32,
}

type Cv = [u32; 8];

/// BLAKE3 (unkeyed, 32-byte output) of each message, appended to `out` in order.
pub(crate) fn hash_many(msgs: &[&[u8]], out: &mut Vec<[u8; 32]>) {
    #[cfg(target_arch = "x86_64")]
    {
        if msgs.len() > 1
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            hash_many_jobs(msgs, out, &|jobs, cvs| {
                for g in jobs.chunks(16) {
                    // SAFETY: AVX-512F and AVX-512BW were detected above.
                    unsafe { x86::compress16(g, cvs) }
                }
            });
            return;
        }
    }
    out.extend(msgs.iter().map(|m| *blake3::hash(m).as_bytes()));
}

/// The BLAKE3 tree of every message, computed level by level with all messages' jobs of a
/// level handed to `run` together.
fn hash_many_jobs(msgs: &[&[u8]], out: &mut Vec<[u8; 32]>, run: &dyn Fn(&[Job<'_>], &mut [Cv])) {
    // Level 0: every chunk of every message. `ranges[m]` is message m's nodes in `cvs`.
    let mut ranges: Vec<(u32, u32)> = Vec::with_capacity(msgs.len());
    let mut full = Vec::new();
    let mut partial = Vec::new();
    let mut n = 0u32;
    for m in msgs {
        let chunks = m.len().div_ceil(CHUNK_LEN).max(1);
        let root = if chunks == 1 { ROOT } else { 0 };
        ranges.push((n, chunks as u32));
        for (i, c) in m.chunks(CHUNK_LEN).enumerate() {
            let job = Job {
                data: c,
                counter: i as u64,
                flags: 0,
                first: CHUNK_START,
                last: CHUNK_END | root,
                dst: n + i as u32,
            };
            if c.len() == CHUNK_LEN {
                full.push(job);
            } else {
                partial.push(job);
            }
        }
        if m.is_empty() {
            partial.push(Job {
                data: m,
                counter: 0,
                flags: 0,
                first: CHUNK_START,
                last: CHUNK_END | ROOT,
                dst: n,
            });
        }
        n += chunks as u32;
    }
    // Short chunks grouped by length, so a pass of 16 lanes wastes few blocks.
    partial.sort_unstable_by_key(|j| std::cmp::Reverse(j.data.len().div_ceil(BLOCK_LEN)));
    full.extend(partial);
    let mut cvs = vec![[0u32; 8]; n as usize];
    run(&full, &mut cvs);

    // Parent levels: pair neighbours, carry an odd last node up unchanged. Pairing from the
    // left level by level gives BLAKE3's left-balanced tree.
    let mut blocks: Vec<[u8; 64]> = Vec::new();
    loop {
        blocks.clear();
        let mut next_len = 0u32;
        let mut pairs = Vec::new();
        for &(start, len) in &ranges {
            if len > 1 {
                for k in 0..len / 2 {
                    let l = &cvs[(start + 2 * k) as usize];
                    let r = &cvs[(start + 2 * k + 1) as usize];
                    let mut b = [0u8; 64];
                    for w in 0..8 {
                        b[4 * w..4 * w + 4].copy_from_slice(&l[w].to_le_bytes());
                        b[32 + 4 * w..36 + 4 * w].copy_from_slice(&r[w].to_le_bytes());
                    }
                    blocks.push(b);
                    pairs.push((len == 2, next_len + k));
                }
            }
            next_len += len.div_ceil(2);
        }
        if pairs.is_empty() {
            break;
        }
        let jobs: Vec<Job<'_>> = blocks
            .iter()
            .zip(&pairs)
            .map(|(b, &(root, dst))| Job {
                data: b,
                counter: 0,
                flags: PARENT | if root { ROOT } else { 0 },
                first: 0,
                last: 0,
                dst,
            })
            .collect();
        let mut next = vec![[0u32; 8]; next_len as usize];
        run(&jobs, &mut next);
        // Carry odd nodes and single (finished) nodes; fix up the ranges.
        let mut at = 0u32;
        for r in ranges.iter_mut() {
            let (start, len) = *r;
            let new_len = len.div_ceil(2);
            if len % 2 == 1 {
                next[(at + new_len - 1) as usize] = cvs[(start + len - 1) as usize];
            }
            *r = (at, new_len);
            at += new_len;
        }
        cvs = next;
    }
    out.extend(ranges.iter().map(|&(start, _)| {
        let mut h = [0u8; 32];
        for (w, word) in cvs[start as usize].iter().enumerate() {
            h[4 * w..4 * w + 4].copy_from_slice(&word.to_le_bytes());
        }
        h
    }));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BLOCK_LEN, Cv, IV, Job};

    const fn schedule() -> [[usize; 16]; 7] {
        const PERM: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
        let mut s = [[0usize; 16]; 7];
        let mut i = 0;
        while i < 16 {
            s[0][i] = i;
            i += 1;
        }
        let mut r = 1;
        while r < 7 {
            let mut i = 0;
            while i < 16 {
                s[r][i] = s[r - 1][PERM[i]];
                i += 1;
            }
            r += 1;
        }
        s
    }
    const SCHEDULE: [[usize; 16]; 7] = schedule();

    #[inline(always)]
    unsafe fn g(
        v: &mut [__m512i; 16],
        a: usize,
        b: usize,
        c: usize,
        d: usize,
        x: __m512i,
        y: __m512i,
    ) {
        unsafe {
            v[a] = _mm512_add_epi32(_mm512_add_epi32(v[a], v[b]), x);
            v[d] = _mm512_ror_epi32::<16>(_mm512_xor_si512(v[d], v[a]));
            v[c] = _mm512_add_epi32(v[c], v[d]);
            v[b] = _mm512_ror_epi32::<12>(_mm512_xor_si512(v[b], v[c]));
            v[a] = _mm512_add_epi32(_mm512_add_epi32(v[a], v[b]), y);
            v[d] = _mm512_ror_epi32::<8>(_mm512_xor_si512(v[d], v[a]));
            v[c] = _mm512_add_epi32(v[c], v[d]);
            v[b] = _mm512_ror_epi32::<7>(_mm512_xor_si512(v[b], v[c]));
        }
    }

    #[inline(always)]
    unsafe fn round(v: &mut [__m512i; 16], m: &[__m512i; 16], r: usize) {
        let s = &SCHEDULE[r];
        unsafe {
            g(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
            g(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
            g(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
            g(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
            g(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
            g(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
            g(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
            g(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
        }
    }

    /// Transposes 16 rows of 16 words: afterwards `x[w]` holds word `w` of every row.
    #[inline(always)]
    pub(super) unsafe fn transpose(x: &mut [__m512i; 16]) {
        unsafe {
            // Within 128-bit lanes: pairs of rows, 32-bit then 64-bit interleaves. After
            // this, q[g][k] holds, in its 128-bit lane j, word k + 4j of rows 4g..4g+4.
            let mut q = [[_mm512_setzero_si512(); 4]; 4];
            for (gi, qg) in q.iter_mut().enumerate() {
                let r = 4 * gi;
                let ab_lo = _mm512_unpacklo_epi32(x[r], x[r + 1]);
                let ab_hi = _mm512_unpackhi_epi32(x[r], x[r + 1]);
                let cd_lo = _mm512_unpacklo_epi32(x[r + 2], x[r + 3]);
                let cd_hi = _mm512_unpackhi_epi32(x[r + 2], x[r + 3]);
                qg[0] = _mm512_unpacklo_epi64(ab_lo, cd_lo);
                qg[1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);
                qg[2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
                qg[3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
            }
            for k in 0..4 {
                // 128-bit lanes 0, 2 (lo) and 1, 3 (hi) of row groups 0+1 and 2+3.
                let y_lo = _mm512_shuffle_i32x4::<0x88>(q[0][k], q[1][k]);
                let y_hi = _mm512_shuffle_i32x4::<0xdd>(q[0][k], q[1][k]);
                let z_lo = _mm512_shuffle_i32x4::<0x88>(q[2][k], q[3][k]);
                let z_hi = _mm512_shuffle_i32x4::<0xdd>(q[2][k], q[3][k]);
                x[k] = _mm512_shuffle_i32x4::<0x88>(y_lo, z_lo);
                x[k + 8] = _mm512_shuffle_i32x4::<0xdd>(y_lo, z_lo);
                x[k + 4] = _mm512_shuffle_i32x4::<0x88>(y_hi, z_hi);
                x[k + 12] = _mm512_shuffle_i32x4::<0xdd>(y_hi, z_hi);
            }
        }
    }

    /// Runs up to 16 jobs, one per lane, writing each chaining value to `cvs[job.dst]`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX-512BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn compress16(jobs: &[Job<'_>], cvs: &mut [Cv]) {
        debug_assert!(jobs.len() <= 16);
        let mut nblocks = [0usize; 16];
        let mut ctr_lo = [0u32; 16];
        let mut ctr_hi = [0u32; 16];
        for (i, j) in jobs.iter().enumerate() {
            nblocks[i] = j.data.len().div_ceil(BLOCK_LEN).max(1);
            ctr_lo[i] = j.counter as u32;
            ctr_hi[i] = (j.counter >> 32) as u32;
        }
        let max_blocks = nblocks.iter().copied().max().unwrap_or(0);
        // SAFETY (whole block): the target features are enabled on this function; every
        // load reads 64 bytes of a 16-word array or, masked, only bytes inside a job's data.
        unsafe {
            let ctr_lo = _mm512_loadu_si512(ctr_lo.as_ptr().cast());
            let ctr_hi = _mm512_loadu_si512(ctr_hi.as_ptr().cast());
            let mut cv = IV.map(|w| _mm512_set1_epi32(w as i32));
            for b in 0..max_blocks {
                let mut m = [_mm512_setzero_si512(); 16];
                let mut blen = [0u32; 16];
                let mut flags = [0u32; 16];
                let mut active: u16 = 0;
                for (i, j) in jobs.iter().enumerate() {
                    if b >= nblocks[i] {
                        continue;
                    }
                    active |= 1 << i;
                    let off = b * BLOCK_LEN;
                    let rem = j.data.len() - off;
                    let len = rem.min(BLOCK_LEN);
                    let mask = if len == BLOCK_LEN {
                        u64::MAX
                    } else {
                        (1u64 << len) - 1
                    };
                    if len > 0 {
                        m[i] = _mm512_maskz_loadu_epi8(mask, j.data.as_ptr().add(off).cast());
                    }
                    blen[i] = len as u32;
                    let mut f = j.flags;
                    if b == 0 {
                        f |= j.first;
                    }
                    if b + 1 == nblocks[i] {
                        f |= j.last;
                    }
                    flags[i] = f as u32;
                }
                transpose(&mut m);
                let mut v = [
                    cv[0],
                    cv[1],
                    cv[2],
                    cv[3],
                    cv[4],
                    cv[5],
                    cv[6],
                    cv[7],
                    _mm512_set1_epi32(IV[0] as i32),
                    _mm512_set1_epi32(IV[1] as i32),
                    _mm512_set1_epi32(IV[2] as i32),
                    _mm512_set1_epi32(IV[3] as i32),
                    ctr_lo,
                    ctr_hi,
                    _mm512_loadu_si512(blen.as_ptr().cast()),
                    _mm512_loadu_si512(flags.as_ptr().cast()),
                ];
                for r in 0..7 {
                    round(&mut v, &m, r);
                }
                for w in 0..8 {
                    let new = _mm512_xor_si512(v[w], v[w + 8]);
                    cv[w] = _mm512_mask_mov_epi32(cv[w], active, new);
                }
            }
            let mut words = [[0u32; 16]; 8];
            for w in 0..8 {
                _mm512_storeu_si512(words[w].as_mut_ptr().cast(), cv[w]);
            }
            for (i, j) in jobs.iter().enumerate() {
                let out = &mut cvs[j.dst as usize];
                for w in 0..8 {
                    out[w] = words[w][i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    fn check(lens: &[usize]) {
        let data: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| bytes(n, i as u64 + n as u64))
            .collect();
        let msgs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut out = Vec::new();
        hash_many(&msgs, &mut out);
        assert_eq!(out.len(), msgs.len());
        for (m, h) in msgs.iter().zip(&out) {
            assert_eq!(h, blake3::hash(m).as_bytes(), "length {}", m.len());
        }
    }

    #[test]
    fn matches_blake3_on_many_lengths() {
        let edges = [
            0usize,
            1,
            2,
            3,
            4,
            5,
            63,
            64,
            65,
            127,
            128,
            129,
            511,
            1023,
            1024,
            1025,
            1026,
            2047,
            2048,
            2049,
            3071,
            3072,
            3073,
            4095,
            4096,
            4097,
            4098,
            5000,
            7 * 1024 + 1,
            8192,
            8193,
            16 * 1024,
            16 * 1024 + 1,
            33 * 1024 + 17,
            100_000,
            262_145,
        ];
        check(&edges);
        for &n in &edges {
            check(&[n, n]);
        }
        let mixed: Vec<usize> = (0..200).map(|i| (i * 7919 + i * i * 13) % 40_000).collect();
        check(&mixed);
        let small: Vec<usize> = (0..1100).collect();
        check(&small);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn transpose_is_a_transpose() {
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn run() -> [[u32; 16]; 16] {
            let mut rows = [[0u32; 16]; 16];
            for (r, row) in rows.iter_mut().enumerate() {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = (r * 16 + c) as u32;
                }
            }
            // SAFETY: AVX-512F is enabled; each load and store covers one 16-word row.
            unsafe {
                let mut v = rows.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
                x86::transpose(&mut v);
                let mut out = [[0u32; 16]; 16];
                for (o, x) in out.iter_mut().zip(v) {
                    _mm512_storeu_si512(o.as_mut_ptr().cast(), x);
                }
                out
            }
        }
        // SAFETY: AVX-512F was detected above.
        let out = unsafe { run() };
        for (w, row) in out.iter().enumerate() {
            for (r, &x) in row.iter().enumerate() {
                assert_eq!(x, (r * 16 + w) as u32, "word {w} of row {r}");
            }
        }
    }

    #[test]
    #[ignore = "timing; run with --release -- --ignored --nocapture"]
    fn timing_5k_messages() {
        let data = bytes(64 << 20, 1);
        let lens = [4100usize, 5000, 3300, 6100, 4900, 4096, 5500, 4700];
        let mut msgs = Vec::new();
        let mut at = 0;
        for i in 0.. {
            let n = lens[i % lens.len()];
            if at + n > data.len() {
                break;
            }
            msgs.push(&data[at..at + n]);
            at += n;
        }
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            let mut x = 0u8;
            for m in &msgs {
                x ^= blake3::hash(m).as_bytes()[0];
            }
            let one = t0.elapsed().as_secs_f64();
            let t0 = std::time::Instant::now();
            let mut out = Vec::new();
            for batch in msgs.chunks(50) {
                out.clear();
                hash_many(batch, &mut out);
                x ^= out[0][0];
            }
            let many = t0.elapsed().as_secs_f64();
            let t0 = std::time::Instant::now();
            for m in &msgs {
                use sha2::Digest;
                x ^= sha2::Sha256::digest(m)[0];
            }
            let sha = t0.elapsed().as_secs_f64();
            println!(
                "blake3 one by one {:.0} MB/s, hash_many {:.0} MB/s, sha256 {:.0} MB/s ({x})",
                at as f64 / one / 1e6,
                at as f64 / many / 1e6,
                at as f64 / sha / 1e6
            );
        }
    }
}
