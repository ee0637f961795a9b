//! Staging for asynchronous saves: copy values into caller-owned host buffers in parallel,
//! computing each value's crc32c from the freshly written (cache-hot) destination piece.
//!
//! What must stay true: every destination byte equals its source byte when this returns, and
//! the crc of an item is crc32c of its whole source (pieces combined in order), so incremental
//! saves can compare it with the raw crc an index records (FORMAT.md §3.3).

use crate::error::{Error, Result};
use crate::format::{combine_crcs, crc};
use rayon::prelude::*;

/// Bytes copied per parallel task: small enough that the piece is still in L2 when its crc is
/// computed right after the copy, large enough that scheduling costs nothing.
const PIECE: usize = 512 << 10;

/// Copy `srcs[i]` into `dsts[i]` for every `i` (lengths must match), in parallel pieces. With
/// `with_crc`, also return the crc32c of every item (else an empty vector).
pub fn copy_with_crc(srcs: &[&[u8]], dsts: &mut [&mut [u8]], with_crc: bool) -> Result<Vec<u32>> {
    if srcs.len() != dsts.len() {
        return Err(Error::InvalidArgument(format!(
            "staging: {} sources but {} destinations",
            srcs.len(),
            dsts.len()
        )));
    }
    for (i, (s, d)) in srcs.iter().zip(dsts.iter()).enumerate() {
        if s.len() != d.len() {
            return Err(Error::InvalidArgument(format!(
                "staging item {i}: source is {} bytes, destination {}",
                s.len(),
                d.len()
            )));
        }
    }
    let mut pieces: Vec<(usize, &[u8], &mut [u8])> = Vec::new();
    for (i, (s, d)) in srcs.iter().zip(dsts.iter_mut()).enumerate() {
        for (sp, dp) in s.chunks(PIECE).zip(d.chunks_mut(PIECE)) {
            pieces.push((i, sp, dp));
        }
    }
    let crcs: Vec<(usize, u32, usize)> = crate::threads::install(|| {
        pieces
            .par_iter_mut()
            .map(|(i, s, d)| {
                d.copy_from_slice(s);
                let c = if with_crc { crc(d) } else { 0 };
                (*i, c, d.len())
            })
            .collect()
    });
    if !with_crc {
        return Ok(Vec::new());
    }
    let mut out = vec![crc(&[]); srcs.len()];
    let mut at = 0;
    while at < crcs.len() {
        let i = crcs[at].0;
        let mut end = at;
        while end < crcs.len() && crcs[end].0 == i {
            end += 1;
        }
        out[i] = combine_crcs(crcs[at..end].iter().map(|&(_, c, n)| (c, n)));
        at = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_crcs_match_whole_buffers() {
        let a: Vec<u8> = (0..(3 * PIECE + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let b: Vec<u8> = vec![7u8; 5];
        let e: Vec<u8> = Vec::new();
        let mut da = vec![0u8; a.len()];
        let mut db = vec![0u8; b.len()];
        let mut de: Vec<u8> = Vec::new();
        let crcs = {
            let mut dsts: Vec<&mut [u8]> = vec![&mut da, &mut db, &mut de];
            copy_with_crc(&[&a, &b, &e], &mut dsts, true).unwrap()
        };
        assert_eq!(da, a);
        assert_eq!(db, b);
        assert_eq!(crcs, vec![crc(&a), crc(&b), crc(&e)]);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut d = vec![0u8; 3];
        let mut dsts: Vec<&mut [u8]> = vec![&mut d];
        assert!(copy_with_crc(&[&[1u8, 2][..]], &mut dsts, false).is_err());
    }
}
