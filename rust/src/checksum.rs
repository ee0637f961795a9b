//! The checksum of the format (crc32c): of a slice, of a concatenation from its
//! pieces' crcs, and of a large buffer in parallel pieces. Below everything that writes, reads
//! or verifies bytes, so that readers need not reach into the shard writer for it.

use crate::threads;
use rayon::prelude::*;

/// Payloads larger than this get their crc computed in parallel pieces.
const PAR_CRC_MIN: usize = 8 << 20;

/// crc32c of a byte slice (folding with carry-less multiplies where the CPU has them:
/// [`crate::crc_fold`]).
#[inline]
pub fn crc(bytes: &[u8]) -> u32 {
    crate::crc_fold::crc_append(0, bytes)
}

/// crc32c of the bytes whose crc is `prev` followed by `bytes`.
#[inline]
pub fn crc_append(prev: u32, bytes: &[u8]) -> u32 {
    crate::crc_fold::crc_append(prev, bytes)
}

/// crc32c of a concatenation, from the crcs and lengths of its consecutive pieces.
pub fn combine_crcs(pieces: impl IntoIterator<Item = (u32, usize)>) -> u32 {
    pieces
        .into_iter()
        .fold(None, |acc: Option<u32>, (c, n)| {
            Some(acc.map_or(c, |a| crate::crc_combine::combine(a, c, n as u64)))
        })
        .unwrap_or_else(|| crc(&[]))
}

/// crc32c of `data`, in parallel pieces for large inputs.
pub fn par_crc(data: &[u8]) -> u32 {
    if data.len() < PAR_CRC_MIN {
        return crc(data);
    }
    const PIECE: usize = 4 << 20;
    let pieces: Vec<(u32, usize)> =
        threads::install(|| data.par_chunks(PIECE).map(|p| (crc(p), p.len())).collect());
    combine_crcs(pieces)
}

/// The crc32c of every `1 << log2`-byte block of `data` (the last may be shorter) and the
/// crc of the whole, combined from them (FORMAT.md §3.4): one pass over the bytes, as many
/// as [`par_crc`] makes, in parallel for large inputs.
pub fn block_crcs(data: &[u8], log2: u8) -> (Vec<u32>, u32) {
    let block = 1usize << log2;
    let blocks: Vec<u32> = if data.len() < PAR_CRC_MIN {
        data.chunks(block).map(crc).collect()
    } else {
        threads::install(|| data.par_chunks(block).map(crc).collect())
    };
    let whole = combine_block_crcs(&blocks, data.len() as u64, log2);
    (blocks, whole)
}

/// The crc of a whole value from its block crcs (`len` bytes, blocks of `1 << log2`).
pub fn combine_block_crcs(blocks: &[u32], len: u64, log2: u8) -> u32 {
    let block = 1u64 << log2;
    let full = crate::crc_combine::zeros_operator(block);
    let mut acc: Option<u32> = None;
    for (i, &c) in blocks.iter().enumerate() {
        let n = block.min(len - i as u64 * block);
        acc = Some(match acc {
            None => c,
            Some(a) if n == block => crate::crc_combine::combine_with(full, a, c),
            Some(a) => crate::crc_combine::combine(a, c, n),
        });
    }
    acc.unwrap_or_else(|| crc(&[]))
}
