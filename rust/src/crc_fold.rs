//! crc32c by folding with carry-less multiplies (the `crc-fast` crate), chosen at run time,
//! with the `crc32c` crate (SSE4.2 `crc32` instruction, three streams) as the fallback.
//!
//! Why: a codec-3 load checks every decoded byte end to end, so the crc of the output was
//! ~13% of a warm default-codec `load_into` (issue 41). The `crc32` instruction peaks near 8
//! bytes per cycle; folding 256 bytes per step with 512-bit carry-less multiplies (`crc-fast`
//! picks AVX-512 VPCLMULQDQ, AVX2/PCLMULQDQ or its table code by CPU at run time) ran 2.5x
//! faster on the same core here: 52 against 21 GB/s on a 16 KiB block, the ungrouping block.
//! A library, not our own folding loop: the constants and the SIMD dispatch are its to keep.
//!
//! What must stay true: both paths return the crc32c of the bytes (tests compare them on every
//! length up to a few KiB, at odd offsets and states); `SHARDPOINT_NO_SIMD=1` forces the
//! `crc32c` crate, like the codec's other run-time copies, so the baseline run tests it.

use crc_fast::{CrcAlgorithm, Digest};

/// Bytes below which the `crc32c` crate is used: the folding setup does not pay for itself on
/// a few hundred bytes, where the `crc32` instruction is already at its peak.
const FOLD_MIN: usize = 256;

/// Whether the folding path may run: `SHARDPOINT_NO_SIMD` is unset (or empty or `0`).
pub fn fold_enabled() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("SHARDPOINT_NO_SIMD").is_none_or(|v| v.is_empty() || v == "0")
    })
}

/// The crc32c of `prev`'s bytes followed by `data`, from `prev` (the crc of the bytes before;
/// 0 for none).
#[inline]
pub fn crc_append(prev: u32, data: &[u8]) -> u32 {
    if data.len() >= FOLD_MIN && fold_enabled() {
        return fold_append(prev, data);
    }
    crc32c::crc32c_append(prev, data)
}

/// `crc-fast`'s crc32c (its name: CRC-32/ISCSI) continued from `prev`: its state is the
/// register before the final inversion, so a finished crc re-enters inverted.
fn fold_append(prev: u32, data: &[u8]) -> u32 {
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!prev));
    d.update(data);
    d.finalize() as u32
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
                    // the library on every length, below FOLD_MIN too
                    assert_eq!(fold_append(prev, d), want, "fold, len {len} start {start}");
                }
            }
        }
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
