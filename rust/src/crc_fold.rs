//! crc32c by carry-less multiplication (AVX-512 `vpclmulqdq`), chosen at run time, with the
//! `crc32c` crate (SSE4.2 `crc32` instruction, three streams) as the fallback.
//!
//! Why: a codec-3 load checks every decoded byte end to end, so the crc of the output was
//! ~13% of a warm default-codec `load_into` (issue 41); the `crc32` instruction peaks near
//! 8 bytes per cycle, while folding 256 bytes per step with 512-bit carry-less multiplies runs
//! ~2.5x faster on the same core (22 -> 56 GB/s on a 16 KiB block, the ungrouping block).
//!
//! The method (folding, as in Intel's "Fast CRC computation for generic polynomials using
//! PCLMULQDQ", derived here for the reflected crc32c): the message is read as 128-bit blocks;
//! the crc state is XORed into the first block; a block `X = H·x^64 + L` that has `D` more
//! bits after it contributes `X·x^D`, which is congruent mod P to
//! `H·(x^(64+D) mod P) + L·(x^D mod P)`, a 128-bit value added into the block `D` bits later.
//! In the reflected layout the low qword is `H`, and a carry-less product of two reflected
//! qwords is the reflected product times `x`, so the constants are `x^(63+D)` and `x^(D-1)`
//! mod P (computed at compile time from [`crate::crc_combine`]'s multiplication). The last
//! 128-bit block left is reduced by two `crc32` instructions from a zero state.
//!
//! What must stay true: both paths return the crc32c of the bytes (tests compare the folding
//! path with the crate on every length up to a few KiB, at odd offsets and states);
//! `SHARDPOINT_NO_SIMD=1` forces the crate, like the codec's other run-time copies.

/// Bytes below which the crate's loop is used (the folding path needs four 64-byte blocks).
const FOLD_MIN: usize = 256;

/// Whether the folding path may run: the CPU has AVX-512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2,
/// and `SHARDPOINT_NO_SIMD` is unset (or empty or `0`).
pub fn fold_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| {
            std::env::var_os("SHARDPOINT_NO_SIMD").is_none_or(|v| v.is_empty() || v == "0")
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("vpclmulqdq")
                && std::is_x86_feature_detected!("pclmulqdq")
                && std::is_x86_feature_detected!("sse4.2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The crc32c of `prev`'s bytes followed by `data`, from `prev` (the crc of the bytes before;
/// 0 for none).
#[inline]
pub fn crc_append(prev: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FOLD_MIN && fold_enabled() {
        // SAFETY: fold_enabled() checked that this CPU has every feature the function is
        // compiled for; it needs data.len() >= FOLD_MIN, checked above.
        return unsafe { x86::crc_append_fold(prev, data) };
    }
    crc32c::crc32c_append(prev, data)
}

/// `x^n mod P` in the reflected representation (bit 31 holds the coefficient of x^0).
const fn xpow(n: u32) -> u32 {
    let mut r = 1u32 << 31; // x^0
    let mut i = 0;
    while i < n {
        r = crate::crc_combine::mul(r, 1 << 30); // · x
        i += 1;
    }
    r
}

/// Constants that move a 128-bit block `bytes` bytes further on: (for its low qword, `H`;
/// for its high qword, `L`), each a reflected degree-31 polynomial in the high half of a qword.
const fn fold_consts(bytes: u32) -> (u64, u64) {
    let d = 8 * bytes;
    ((xpow(d + 63) as u64) << 32, (xpow(d - 1) as u64) << 32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{fold_consts, FOLD_MIN};
    use std::arch::x86_64::*;

    const K256: (u64, u64) = fold_consts(256);
    const K192: (u64, u64) = fold_consts(192);
    const K128: (u64, u64) = fold_consts(128);
    const K64: (u64, u64) = fold_consts(64);
    const K48: (u64, u64) = fold_consts(48);
    const K32: (u64, u64) = fold_consts(32);
    const K16: (u64, u64) = fold_consts(16);

    #[inline(always)]
    unsafe fn k128(k: (u64, u64)) -> __m128i {
        _mm_set_epi64x(k.1 as i64, k.0 as i64)
    }

    #[inline(always)]
    unsafe fn k512(k: (u64, u64)) -> __m512i {
        _mm512_broadcast_i32x4(k128(k))
    }

    /// Each 128-bit lane of `x` moved on by `k`'s distance, added to `y`.
    #[inline(always)]
    unsafe fn fold512(x: __m512i, k: __m512i, y: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(x, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(x, k, 0x11);
        _mm512_ternarylogic_epi64(lo, hi, y, 0x96) // lo ^ hi ^ y
    }

    #[inline(always)]
    unsafe fn fold128(x: __m128i, k: __m128i, y: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128(x, k, 0x00);
        let hi = _mm_clmulepi64_si128(x, k, 0x11);
        _mm_xor_si128(_mm_xor_si128(lo, hi), y)
    }

    /// The folding crc (module doc): four 512-bit accumulators 256 bytes apart, folded into
    /// one 128-bit block, then the remaining whole 16-byte blocks, then the tail (< 16 bytes)
    /// by the crate.
    ///
    /// # Safety
    /// The CPU has AVX-512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2; `data.len() >= FOLD_MIN`.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(super) unsafe fn crc_append_fold(prev: u32, data: &[u8]) -> u32 {
        let len = data.len();
        assert!(len >= FOLD_MIN);
        let p = data.as_ptr();
        // SAFETY (every load below): `o + 64 <= len` (resp. `o + 16`), checked by the loops.
        let ld = |o: usize| unsafe { _mm512_loadu_si512(p.add(o).cast()) };
        // The state (inverted, as crc32c keeps it) enters as the first 32 message bits.
        let state = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!prev as i32));
        let mut x0 = _mm512_xor_si512(ld(0), state);
        let (mut x1, mut x2, mut x3) = (ld(64), ld(128), ld(192));
        let k = k512(K256);
        let mut off = FOLD_MIN;
        while off + 256 <= len {
            x0 = fold512(x0, k, ld(off));
            x1 = fold512(x1, k, ld(off + 64));
            x2 = fold512(x2, k, ld(off + 128));
            x3 = fold512(x3, k, ld(off + 192));
            off += 256;
        }
        // The four accumulators into the last one, then its four lanes into the last lane.
        let x = fold512(x0, k512(K192), x3);
        let x = fold512(x1, k512(K128), x);
        let x = fold512(x2, k512(K64), x);
        let mut y = fold128(
            _mm512_extracti32x4_epi32::<0>(x),
            k128(K48),
            _mm512_extracti32x4_epi32::<3>(x),
        );
        y = fold128(_mm512_extracti32x4_epi32::<1>(x), k128(K32), y);
        y = fold128(_mm512_extracti32x4_epi32::<2>(x), k128(K16), y);
        let k16 = k128(K16);
        while off + 16 <= len {
            y = fold128(y, k16, _mm_loadu_si128(p.add(off).cast()));
            off += 16;
        }
        // The last block's value times x^32 mod P is what the crc32 instruction computes
        // from a zero state.
        let s = _mm_crc32_u64(0, _mm_cvtsi128_si64(y) as u64);
        let s = _mm_crc32_u64(s, _mm_extract_epi64::<1>(y) as u64);
        crc32c::crc32c_append(!(s as u32), &data[off..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// Every length through a few folding steps, odd starts and two states: the folding path
    /// (where this CPU has it) and the dispatcher equal the crate.
    #[test]
    fn folding_matches_the_crate_on_every_length() {
        let data = bytes(70_000, 41);
        let lens = (0..1100).chain([4096, 16_383, 16_384, 65_536 + 7]);
        for len in lens {
            for start in [0usize, 1, 13] {
                let d = &data[start..start + len];
                for prev in [0u32, 0xdead_beef] {
                    let want = crc32c::crc32c_append(prev, d);
                    assert_eq!(crc_append(prev, d), want, "len {len} start {start}");
                    #[cfg(target_arch = "x86_64")]
                    if len >= FOLD_MIN
                        && std::is_x86_feature_detected!("avx512f")
                        && std::is_x86_feature_detected!("vpclmulqdq")
                    {
                        // SAFETY: the features were just detected; len >= FOLD_MIN.
                        let got = unsafe { x86::crc_append_fold(prev, d) };
                        assert_eq!(got, want, "fold, len {len} start {start}");
                    }
                }
            }
        }
    }

    #[test]
    fn constants_are_the_powers_of_x() {
        // x^(8·n) mod P appends n zero bytes: the constants are that operator's relatives.
        assert_eq!(xpow(8 * 100), crate::crc_combine::zeros_operator(100));
        assert_eq!(fold_consts(16).1 >> 32, xpow(127) as u64);
    }

    proptest! {
        #[test]
        fn appending_in_pieces_is_the_crc_of_the_whole(
            a in proptest::collection::vec(any::<u8>(), 0..2000),
            b in proptest::collection::vec(any::<u8>(), 0..2000),
        ) {
            let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(crc_append(crc_append(0, &a), &b), crc32c::crc32c(&whole));
        }
    }
}
