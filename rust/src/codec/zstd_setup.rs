//! The zstd setups of the chunk encoder (FORMAT.md §5 allows any zstd frame: these only
//! choose how it is produced, never what a reader must understand), one cached compressor per
//! setup and thread.

use super::planes;
use crate::error::{Error, Result};
use std::cell::RefCell;

thread_local! {
    static COMPRESSORS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
}

/// How a zstd frame is produced: a plain zstd `level`, or the entropy setup used for
/// byte-grouped planes at levels <= 1 (see [`plane_setup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setup {
    Level(i32),
    Entropy,
    /// Literals only, Huffman-coded: for the dense planes of XOR payloads ([`xor_plane_setup`]).
    Literals,
}

/// Byte-grouped planes are mostly "few distinct byte values, few long repeats" (float exponents):
/// an LZ search finds little and costs much, a Huffman pass gets near the entropy bound. At
/// levels <= 1 we therefore use the fastest match finder with a tiny hash table and long
/// minimum matches, with literal Huffman coding forced on. Measured on normal-distributed fp32
/// exponent planes: ratio 3.13 vs 2.65 and ~3.7x the speed of plain level 1.
pub(super) fn plane_setup(level: i32) -> Setup {
    if level <= 1 {
        Setup::Entropy
    } else {
        Setup::Level(level)
    }
}

/// Sampled nonzero bytes at or above this fraction (1/12) make an XOR payload plane "dense".
const DENSE_XOR_PLANE: (usize, usize) = (1, 12);

/// The setup for one plane of an XOR payload (a delta entry's `new ^ base`, FORMAT.md §11),
/// at levels <= 1, float dtypes. Such a plane is mostly zero bytes; a changed low mantissa
/// byte is close to random. Where the changes are sparse (the exponent plane of an RL step,
/// under 1 byte in 12 nonzero), matching the zero runs wins ([`Setup::Entropy`]); where they
/// are not (a low plane with 15-30% nonzero bytes), the match finder pays one sequence per
/// short zero run and gains little over Huffman-coding the bytes as literals. There
/// [`Setup::Literals`] skips ahead so fast that it finds almost no match: measured on the
/// MiniLM RL-like step's planes, 8-30% nonzero: about twice the speed, size within -4..+3%
/// (docs/DELTA.md). Either way the segment is an ordinary zstd frame: any reader decodes it.
/// The density is taken from a strided sample (at most 4096 bytes), so the choice is cheap
/// and deterministic.
pub(super) fn xor_plane_setup(plane: &[u8]) -> Setup {
    let step = (plane.len() / 4096).max(1);
    let (mut seen, mut nonzero) = (0usize, 0usize);
    for &b in plane.iter().step_by(step) {
        seen += 1;
        nonzero += (b != 0) as usize;
    }
    if seen > 0 && nonzero * DENSE_XOR_PLANE.1 >= seen * DENSE_XOR_PLANE.0 {
        Setup::Literals
    } else {
        Setup::Entropy
    }
}

fn with_compressor<T>(
    setup: Setup,
    f: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> T,
) -> Result<T> {
    use zstd::zstd_safe::{CParameter, ParamSwitch};
    COMPRESSORS.with(|cell| {
        let mut cs = cell.borrow_mut();
        let key = match setup {
            Setup::Level(l) => l,
            Setup::Entropy => i32::MIN,
            Setup::Literals => i32::MIN + 1,
        };
        let idx = match cs.iter().position(|(l, _)| *l == key) {
            Some(i) => i,
            None => {
                let err = |e: std::io::Error| {
                    Error::InvalidArgument(format!("zstd setup {setup:?}: {e}"))
                };
                let c = match setup {
                    Setup::Level(l) => zstd::bulk::Compressor::new(l).map_err(err)?,
                    Setup::Entropy => {
                        let mut c = zstd::bulk::Compressor::new(-5).map_err(err)?;
                        c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                            .map_err(err)?;
                        c.set_parameter(CParameter::MinMatch(7)).map_err(err)?;
                        c.set_parameter(CParameter::HashLog(6)).map_err(err)?;
                        c
                    }
                    Setup::Literals => {
                        // level -1000: the fast strategy with a target length of 1000, i.e. the
                        // match finder steps ~1000 bytes after each miss; Huffman coding of
                        // literals forced back on (negative levels turn it off)
                        let mut c = zstd::bulk::Compressor::new(-1000).map_err(err)?;
                        c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                            .map_err(err)?;
                        c.set_parameter(CParameter::MinMatch(7)).map_err(err)?;
                        c.set_parameter(CParameter::HashLog(6)).map_err(err)?;
                        c
                    }
                };
                cs.push((key, c));
                cs.len() - 1
            }
        };
        Ok(f(&mut cs[idx].1))
    })
}

/// Append a zstd frame of `input` to `out` if it is smaller than `limit`; returns whether it was.
/// With `skip_random`, inputs whose sampled byte histogram looks random are not even tried
/// (right for float mantissa planes; wrong for structured integers, whose low bytes have flat
/// histograms yet compress well by matching, so integer planes are always tried).
pub(super) fn compress_into(
    setup: Setup,
    input: &[u8],
    limit: usize,
    skip_random: bool,
    out: &mut Vec<u8>,
) -> Result<bool> {
    if skip_random && planes::sample_entropy(input) > planes::INCOMPRESSIBLE_BITS {
        return Ok(false);
    }
    with_compressor(setup, |c| {
        // Straight into `out`'s tail, with room for exactly `limit` bytes: a frame that does
        // not fit is not worth it. (A scratch buffer per call was fresh memory each time: page
        // faults and kernel zeroing on every plane, then a copy.)
        let at = out.len();
        out.reserve_exact(limit);
        let mut tail = std::io::Cursor::new(&mut *out);
        tail.set_position(at as u64);
        match c.compress_to_buffer(input, &mut tail) {
            Ok(n) if n < limit => true,
            _ => {
                out.truncate(at);
                false
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_chunk, encode_chunk, encode_xor_chunk, Codec};
    use crate::format::DType;
    use std::path::Path;

    /// `n` bytes, about `per_mille` of them nonzero (pseudo-random values).
    fn sparse(n: usize, per_mille: u64, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (x >> 20) % 1000 < per_mille {
                    (x >> 8) as u8 | 1
                } else {
                    0
                }
            })
            .collect()
    }

    #[test]
    fn plane_density_picks_the_setup() {
        assert_eq!(xor_plane_setup(&[]), Setup::Entropy);
        assert_eq!(xor_plane_setup(&vec![0u8; 100_000]), Setup::Entropy);
        assert_eq!(xor_plane_setup(&sparse(100_000, 20, 1)), Setup::Entropy);
        assert_eq!(xor_plane_setup(&sparse(100_000, 60, 2)), Setup::Entropy);
        assert_eq!(xor_plane_setup(&sparse(100_000, 120, 3)), Setup::Literals);
        assert_eq!(xor_plane_setup(&sparse(100_000, 250, 4)), Setup::Literals);
        assert_eq!(xor_plane_setup(&sparse(7, 1000, 5)), Setup::Literals);
    }

    #[test]
    fn literal_frames_are_plain_zstd() {
        let plane = sparse(300_000, 200, 6);
        let mut out = vec![1u8, 2, 3]; // appended after what is there
        assert!(compress_into(Setup::Literals, &plane, plane.len(), true, &mut out).unwrap());
        assert_eq!(&out[..3], &[1, 2, 3]);
        let back = zstd::bulk::decompress(&out[3..], plane.len()).unwrap();
        assert_eq!(back, plane);
        // Huffman-coded literals: well below a byte per byte at 20% density
        assert!(out.len() - 3 < plane.len() / 3, "{}", out.len());
    }

    /// A bf16 XOR payload chunk: `hi_pm`/`lo_pm` per mille of the (rotated) high/low plane nonzero.
    fn bf16_xor(n: usize, hi_pm: u64, lo_pm: u64) -> Vec<u8> {
        let (hi, lo) = (sparse(n, hi_pm, 7), sparse(n, lo_pm, 8));
        hi.iter()
            .zip(&lo)
            .flat_map(|(&h, &l)| (((h as u16) << 8 | l as u16).rotate_right(1)).to_le_bytes())
            .collect()
    }

    #[test]
    fn xor_chunks_decode_exactly_and_only_dense_planes_change() {
        let d = DType::BF16;
        for (hi, lo, same) in [
            (2, 30, true),
            (2, 200, false),
            (300, 300, false),
            (0, 0, true),
        ] {
            let raw = bf16_xor(262_144, hi, lo);
            let x = encode_xor_chunk(Codec::ZstdByteGroup, d, 1, &raw)
                .unwrap()
                .unwrap();
            let plain = encode_chunk(Codec::ZstdByteGroup, d, 1, &raw)
                .unwrap()
                .unwrap();
            assert_eq!(x == plain, same, "{hi} {lo}");
            let mut back = vec![0u8; raw.len()];
            decode_chunk(Codec::ZstdByteGroup, d, &x, &mut back, Path::new("t"), 0).unwrap();
            assert_eq!(back, raw, "{hi} {lo}");
        }
        // integers and levels above 1 keep the plain setups
        let ints: Vec<u8> = sparse(400_000, 300, 9);
        for (d, level) in [(DType::I32, 1), (DType::BF16, 3)] {
            let x = encode_xor_chunk(Codec::ZstdByteGroup, d, level, &ints).unwrap();
            assert_eq!(
                x,
                encode_chunk(Codec::ZstdByteGroup, d, level, &ints).unwrap()
            );
        }
    }
}
