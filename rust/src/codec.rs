//! Chunk codecs (FORMAT.md §5): zstd, zstd after the dtype-aware byte-grouping filter, and
//! byte grouping with order-0 Huffman coding of the exponent-carrying planes (codec 3, the
//! default for floats; [`huff_chunk`]).
//!
//! Invariants: `ungroup(group(x)) == x` for every dtype and length that is a multiple of the
//! group width; a compressed chunk is only accepted by the decoder if it decompresses to exactly
//! the expected raw length (the destination buffer is never grown: no decompression bombs).

use crate::error::{Error, Result};
use crate::format::{crc, Codec, DType, MAX_KEPT_RATIO};
use std::cell::RefCell;
use std::path::Path;

#[macro_use]
pub mod simd;
pub mod huff_chunk;
pub mod huffman;
pub mod planes;
pub mod pool;
pub mod xor;
pub mod zstd_rle;
mod zstd_setup;

pub use huff_chunk::Encoded;
pub use pool::BufPool;
use zstd_setup::{compress_into, plane_setup, xor_plane_setup, Setup};

/// Default zstd level. Level 1 beat 3 and 9 on byte-grouped floats in both ratio and speed.
pub const DEFAULT_LEVEL: i32 = 1;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Byte-group `src` into `dst` (same length): planes of equal significance, most significant
/// first, after rotating float sign bits to bit 0.
pub fn group(dtype: DType, src: &[u8], dst: &mut [u8]) {
    let w = dtype.group_width();
    debug_assert_eq!(src.len(), dst.len());
    debug_assert_eq!(src.len() % w, 0);
    let rot = dtype.rotates_sign();
    match w {
        2 if rot => group2::<true>(src, dst),
        2 => group2::<false>(src, dst),
        4 if rot => group4::<true>(src, dst),
        4 => group4::<false>(src, dst),
        8 if rot => group8::<true>(src, dst),
        8 => group8::<false>(src, dst),
        _ => dst.copy_from_slice(src),
    }
}

/// Inverse of [`group`].
pub fn ungroup(dtype: DType, src: &[u8], dst: &mut [u8]) {
    let w = dtype.group_width();
    debug_assert_eq!(src.len(), dst.len());
    if w < 2 || src.is_empty() {
        dst.copy_from_slice(src);
        return;
    }
    let n = src.len() / w;
    let planes: Vec<&[u8]> = src.chunks_exact(n.max(1)).take(w).collect();
    ungroup_planes(dtype, &planes, dst);
}

/// Interleave `planes` (plane 0 = most significant bytes) back into elements, rotating float
/// sign bits back. Planes may live anywhere (a raw plane is read straight from the mmap).
/// Cache-blocked one-pass interleaves ([`planes::ungroup`]), the same loops codec 3 uses.
pub fn ungroup_planes(dtype: DType, planes: &[&[u8]], dst: &mut [u8]) {
    let w = planes.len();
    assert!(matches!(w, 2 | 4 | 8), "group widths are 2, 4 or 8");
    let n = dst.len() / w;
    assert!(n * w == dst.len() && planes.iter().all(|p| p.len() >= n));
    planes::ungroup(w, dtype.rotates_sign(), planes, dst);
}

// Plane-major loops over native integers: each pass streams one output plane, which the
// compiler vectorizes (shift + narrow); the rotation is a const generic so it costs no branch.
// Loops over native integer slices (the chunk is reinterpreted in place when aligned, which
// numpy and Vec buffers are) so the compiler vectorizes them; the rotation is a const generic.
macro_rules! grouping {
    ($group:ident, $t:ty, $w:expr) => {
        fn $group<const ROT: bool>(src: &[u8], dst: &mut [u8]) {
            let n = src.len() / $w;
            // SAFETY: every bit pattern is a valid integer; align_to only yields aligned words.
            let (head, words, tail) = unsafe { src.align_to::<$t>() };
            let owned: Vec<$t>;
            let words: &[$t] = if head.is_empty() && tail.is_empty() {
                words
            } else {
                owned = src
                    .chunks_exact($w)
                    .map(|e| <$t>::from_ne_bytes(e.try_into().expect("w")))
                    .collect();
                &owned
            };
            for (p, plane) in dst[..n * $w].chunks_exact_mut(n.max(1)).enumerate() {
                let shift = 8 * ($w - 1 - p) as u32;
                for (o, &v) in plane.iter_mut().zip(words) {
                    let v = <$t>::from_le(v);
                    let v = if ROT { v.rotate_left(1) } else { v };
                    *o = (v >> shift) as u8;
                }
            }
        }
    };
}

grouping!(group2, u16, 2);
grouping!(group4, u32, 4);
grouping!(group8, u64, 8);

/// Which codec an entry actually uses: byte grouping only helps multi-byte elements, and
/// Huffman-coded planes only floats (integer planes compress by matching: zstd-bytegroup).
pub fn effective_codec(requested: Codec, dtype: DType) -> Codec {
    match requested {
        Codec::ZstdByteGroup | Codec::HuffByteGroup if dtype.group_width() < 2 => Codec::Zstd,
        Codec::HuffByteGroup if !dtype.rotates_sign() => Codec::ZstdByteGroup,
        c => c,
    }
}

/// The codec a writer uses for `dtype` when asked for `requested` at zstd `level`: like
/// [`effective_codec`], and a zstd level above [`DEFAULT_LEVEL`] asks for zstd's strength, so
/// floats then use zstd-bytegroup instead of the (level-less) Huffman codec.
pub fn choose_codec(requested: Codec, dtype: DType, level: i32) -> Codec {
    match effective_codec(requested, dtype) {
        Codec::HuffByteGroup if level > DEFAULT_LEVEL => Codec::ZstdByteGroup,
        c => c,
    }
}

/// Encode one raw chunk. Returns `None` when the chunk should be stored raw (it did not shrink
/// below 95%), else the stored bytes (FORMAT.md §5: a zstd frame, or for byte grouping one
/// segment per plane).
pub fn encode_chunk(codec: Codec, dtype: DType, level: i32, raw: &[u8]) -> Result<Option<Vec<u8>>> {
    encode_chunk_in(codec, dtype, level, raw, &mut None, false, Vec::new())
}

/// [`encode_chunk`] for a chunk of an XOR payload (`new ^ base` of a delta entry): the same
/// format, with each float plane's zstd setup chosen by its density ([`xor_plane_setup`]).
pub fn encode_xor_chunk(
    codec: Codec,
    dtype: DType,
    level: i32,
    raw: &[u8],
) -> Result<Option<Vec<u8>>> {
    encode_chunk_in(codec, dtype, level, raw, &mut None, true, Vec::new())
}

/// [`encode_chunk`], setting `raw_crc` to the crc32c of `raw` where the encoder reads it anyway
/// (zstd-bytegroup: inside the grouping pass, block by block while in cache). `xor`: `raw` is
/// an XOR payload ([`encode_xor_chunk`]). The output goes into `buf` (cleared first): a
/// recycled buffer keeps its pages mapped, where a fresh one per chunk paid page faults and
/// kernel zeroing on every chunk.
fn encode_chunk_in(
    codec: Codec,
    dtype: DType,
    level: i32,
    raw: &[u8],
    raw_crc: &mut Option<u32>,
    xor: bool,
    buf: Vec<u8>,
) -> Result<Option<Vec<u8>>> {
    if codec == Codec::None || raw.is_empty() {
        return Ok(None);
    }
    let limit = (raw.len() as u64 * MAX_KEPT_RATIO.0 / MAX_KEPT_RATIO.1) as usize;
    match codec {
        Codec::Zstd => {
            let mut out = buf;
            out.clear();
            Ok(compress_into(Setup::Level(level), raw, limit, false, &mut out)?.then_some(out))
        }
        Codec::ZstdByteGroup => SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < raw.len() {
                s.resize(raw.len(), 0);
            }
            let s = &mut s[..raw.len()]; // fully overwritten by grouping: no clearing needed
            let w = dtype.group_width();
            let n = raw.len() / w;
            if w >= 2 && n > 0 && raw.len() == n * w {
                let mut outs: Vec<planes::PlaneOut<'_>> = s
                    .chunks_exact_mut(n)
                    .map(|bytes| planes::PlaneOut { bytes, crc: None })
                    .collect();
                *raw_crc = Some(planes::group_crc(w, dtype.rotates_sign(), raw, &mut outs));
            } else {
                group(dtype, raw, s);
            }
            let mut out = buf;
            out.clear();
            out.reserve(raw.len() + 64);
            // Floats: entropy-oriented setup and skipping of random-looking planes. Integers:
            // the plain level (their planes compress by matching, not just by byte statistics).
            let float = dtype.rotates_sign();
            let setup = if float {
                plane_setup(level)
            } else {
                Setup::Level(level)
            };
            for plane in s.chunks_exact(n) {
                let setup = if xor && setup == Setup::Entropy {
                    xor_plane_setup(plane)
                } else {
                    setup
                };
                let at = out.len();
                out.extend_from_slice(&[0u8; 4]);
                let plane_limit = n - n / 64; // a plane must save at least ~1.5% to be compressed
                                              // a constant plane (all zero in most planes of a delta payload): its frame is
                                              // written directly, no zstd pass (codec/zstd_rle.rs)
                let rle = zstd_rle::constant_byte(plane)
                    .filter(|_| zstd_rle::rle_frame_len(n) < plane_limit);
                let len = if let Some(v) = rle {
                    zstd_rle::push_rle_frame(&mut out, v, n);
                    out.len() - at - 4
                } else if compress_into(setup, plane, plane_limit, float, &mut out)? {
                    out.len() - at - 4
                } else {
                    out.extend_from_slice(plane);
                    n
                };
                out[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
                if out.len() >= limit {
                    return Ok(None);
                }
            }
            Ok(Some(out))
        }),
        Codec::HuffByteGroup => Ok(huff_chunk::encode_in(dtype, raw, limit, Vec::new()).stored),
        Codec::None => Ok(None),
    }
}

/// Encode one raw chunk and return its crcs as well (raw bytes and stored bytes). For codec 3
/// the crcs are computed inside the grouping pass, while the data is in cache.
pub fn encode_chunk_crc(codec: Codec, dtype: DType, level: i32, raw: &[u8]) -> Result<Encoded> {
    encode_chunk_crc_in(codec, dtype, level, raw, Vec::new())
}

/// [`encode_chunk_crc_in`] for a chunk of an XOR payload ([`encode_xor_chunk`]).
pub fn encode_xor_chunk_crc_in(
    codec: Codec,
    dtype: DType,
    level: i32,
    raw: &[u8],
    buf: Vec<u8>,
) -> Result<Encoded> {
    encode_crc_in(codec, dtype, level, raw, buf, true)
}

/// [`encode_chunk_crc`] writing codec 3's output into `buf` (cleared first; a recycled buffer
/// from a [`BufPool`] saves the page faults of fresh memory).
pub fn encode_chunk_crc_in(
    codec: Codec,
    dtype: DType,
    level: i32,
    raw: &[u8],
    buf: Vec<u8>,
) -> Result<Encoded> {
    encode_crc_in(codec, dtype, level, raw, buf, false)
}

fn encode_crc_in(
    codec: Codec,
    dtype: DType,
    level: i32,
    raw: &[u8],
    buf: Vec<u8>,
    xor: bool,
) -> Result<Encoded> {
    if codec == Codec::HuffByteGroup && !raw.is_empty() && dtype.group_width() >= 2 {
        let limit = (raw.len() as u64 * MAX_KEPT_RATIO.0 / MAX_KEPT_RATIO.1) as usize;
        return Ok(huff_chunk::encode_in(dtype, raw, limit, buf));
    }
    let mut fused = None;
    let stored = encode_chunk_in(codec, dtype, level, raw, &mut fused, xor, buf)?;
    let raw_crc = fused.unwrap_or_else(|| crc(raw));
    let stored_crc = stored.as_deref().map_or(raw_crc, crc);
    Ok(Encoded {
        stored,
        raw_crc,
        stored_crc,
    })
}

/// Decode one stored chunk into `out` like [`decode_chunk`] and return the crc32c of `out` and
/// of `stored` (the caller compares them with the entry's and the chunk record's). For codec 3
/// both are computed inside the ungrouping pass, block by block while the data is in cache; for
/// the others the stored crc is a pass of its own.
pub fn decode_chunk_crc(
    codec: Codec,
    dtype: DType,
    stored: &[u8],
    out: &mut [u8],
    path: &Path,
    offset: u64,
) -> Result<(u32, u32)> {
    if codec == Codec::HuffByteGroup && stored.len() != out.len() {
        return huff_chunk::decode(dtype, stored, out).map_err(|m| Error::corrupt(path, offset, m));
    }
    let stored_crc = crc(stored);
    decode_chunk(codec, dtype, stored, out, path, offset)?;
    // A raw chunk's output is its stored bytes: one crc serves both.
    let raw_crc = if stored.len() == out.len() {
        stored_crc
    } else {
        crc(out)
    };
    Ok((raw_crc, stored_crc))
}

/// Decode one stored chunk into `out` like [`decode_chunk`] and return the crc32c of `out`
/// only. Readers that compare the decoded bytes with the entry's crc use this: a damaged
/// stored byte either fails the decoder or changes the output, so the end-to-end check
/// catches it, and the chunk crcs are read only to name the damaged chunk afterwards.
pub fn decode_chunk_raw_crc(
    codec: Codec,
    dtype: DType,
    stored: &[u8],
    out: &mut [u8],
    path: &Path,
    offset: u64,
) -> Result<u32> {
    if codec == Codec::HuffByteGroup && stored.len() != out.len() {
        return huff_chunk::decode_raw_crc(dtype, stored, out)
            .map_err(|m| Error::corrupt(path, offset, m));
    }
    decode_chunk(codec, dtype, stored, out, path, offset)?;
    Ok(crc(out))
}

fn zstd_exact(stored: &[u8], dst: &mut [u8], path: &Path, offset: u64) -> Result<()> {
    DECOMPRESSOR.with(|cell| {
        let mut d = cell.borrow_mut();
        if d.is_none() {
            *d =
                Some(zstd::bulk::Decompressor::new().map_err(|e| {
                    Error::corrupt(path, offset, format!("zstd decoder init: {e}"))
                })?);
        }
        let dec = d.as_mut().expect("initialised above");
        // The destination is never grown: a frame that decodes to more bytes is an error.
        let n = dec.decompress_to_buffer(stored, dst).map_err(|e| {
            Error::corrupt(
                path,
                offset,
                format!(
                    "zstd data does not decode into its {} raw bytes: {e}",
                    dst.len()
                ),
            )
        })?;
        if n != dst.len() {
            return Err(Error::corrupt(
                path,
                offset,
                format!("zstd data decoded to {n} bytes, expected {}", dst.len()),
            ));
        }
        Ok(())
    })
}

/// Decode one stored chunk into `out` (exactly the chunk's raw length). `stored.len() ==
/// out.len()` means the chunk was stored raw. `path`/`offset` name the chunk in errors.
pub fn decode_chunk(
    codec: Codec,
    dtype: DType,
    stored: &[u8],
    out: &mut [u8],
    path: &Path,
    offset: u64,
) -> Result<()> {
    if stored.len() == out.len() || codec == Codec::None {
        if stored.len() != out.len() {
            return Err(Error::corrupt(
                path,
                offset,
                "raw chunk has the wrong length",
            ));
        }
        out.copy_from_slice(stored);
        return Ok(());
    }
    match codec {
        Codec::Zstd => zstd_exact(stored, out, path, offset),
        Codec::ZstdByteGroup => SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let w = dtype.group_width();
            if w < 2 || !out.len().is_multiple_of(w) {
                return Err(Error::corrupt(path, offset, "byte-grouped chunk of a 1-byte dtype"));
            }
            let n = out.len() / w;
            // Pass 1: parse and bounds-check the segments; decompress compressed planes into
            // scratch. Raw planes are used in place.
            let mut segs: [(usize, usize, bool); 8] = [(0, 0, false); 8];
            let mut pos = 0usize;
            let mut ncomp = 0usize;
            for (p, seg_slot) in segs.iter_mut().enumerate().take(w) {
                let seg_at = offset + pos as u64;
                let len = stored
                    .get(pos..pos + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .ok_or_else(|| Error::corrupt(path, seg_at, format!("plane {p}: segment header past the chunk end")))?;
                pos += 4;
                if len > n || pos.checked_add(len).is_none_or(|e| e > stored.len()) {
                    return Err(Error::corrupt(path, seg_at, format!("plane {p}: segment of {len} bytes past the chunk end or longer than the plane ({n})")));
                }
                *seg_slot = (pos, len, len != n);
                ncomp += (len != n) as usize;
                pos += len;
            }
            if pos != stored.len() {
                return Err(Error::corrupt(path, offset + pos as u64, "trailing bytes after the last plane"));
            }
            if s.len() < ncomp * n {
                s.resize(ncomp * n, 0);
            }
            let mut dec = s.chunks_exact_mut(n.max(1));
            let mut planes: Vec<&[u8]> = Vec::with_capacity(w);
            for &(at, len, compressed) in &segs[..w] {
                if compressed {
                    let buf = dec.next().expect("sized above");
                    zstd_exact(&stored[at..at + len], buf, path, offset + at as u64)?;
                    planes.push(buf);
                } else {
                    planes.push(&stored[at..at + len]);
                }
            }
            ungroup_planes(dtype, &planes, out);
            Ok(())
        }),
        Codec::HuffByteGroup => huff_chunk::decode(dtype, stored, out)
            .map(|_| ())
            .map_err(|m| Error::corrupt(path, offset, m)),
        Codec::None => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ALL_DTYPES;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn group_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..512), di in 0usize..ALL_DTYPES.len()) {
            let d = ALL_DTYPES[di];
            let n = bytes.len() / d.itemsize() * d.itemsize();
            let src = &bytes[..n];
            let mut g = vec![0u8; n];
            let mut back = vec![0u8; n];
            group(d, src, &mut g);
            ungroup(d, &g, &mut back);
            prop_assert_eq!(src, &back[..]);
        }

        #[test]
        fn chunk_round_trips(seed in any::<u64>(), n in 0usize..4096, di in 0usize..ALL_DTYPES.len(), ci in 0usize..3) {
            let d = ALL_DTYPES[di];
            let n = n / d.itemsize() * d.itemsize();
            // Low-entropy data so compression actually happens sometimes.
            let raw: Vec<u8> = (0..n).map(|i| ((i as u64).wrapping_mul(seed) >> 13) as u8 & 0x0f).collect();
            let requested = [Codec::Zstd, Codec::ZstdByteGroup, Codec::HuffByteGroup][ci];
            // Every codec a chunk can carry for this dtype, including codec 3 on integers.
            let codec = match requested {
                Codec::HuffByteGroup if d.group_width() >= 2 => Codec::HuffByteGroup,
                c => effective_codec(c, d),
            };
            let enc = encode_chunk_crc(codec, d, 1, &raw).unwrap();
            prop_assert_eq!(enc.raw_crc, crc(&raw));
            let stored = enc.stored.unwrap_or_else(|| raw.clone());
            prop_assert_eq!(enc.stored_crc, crc(&stored));
            let mut out = vec![0u8; n];
            let (c, sc) = decode_chunk_crc(codec, d, &stored, &mut out, Path::new("t"), 0).unwrap();
            prop_assert_eq!(&raw, &out);
            prop_assert_eq!(c, crc(&raw));
            prop_assert_eq!(sc, crc(&stored));
            let mut out2 = vec![0u8; n];
            decode_chunk(codec, d, &stored, &mut out2, Path::new("t"), 0).unwrap();
            prop_assert_eq!(raw, out2);
        }
    }

    #[test]
    fn sign_rotation_puts_bf16_exponent_in_one_byte() {
        // bf16 1.0 = 0x3f80: sign 0, exponent 0x7f. After rotl: 0x7f00 -> top byte 0x7f.
        let src = 0x3f80u16.to_le_bytes();
        let mut g = [0u8; 2];
        group(DType::BF16, &src, &mut g);
        assert_eq!(g, [0x7f, 0x00]);
        // -1.0 = 0xbf80 -> rotl = 0x7f01
        let src = 0xbf80u16.to_le_bytes();
        group(DType::BF16, &src, &mut g);
        assert_eq!(g, [0x7f, 0x01]);
    }

    #[test]
    fn bomb_is_refused() {
        let big = vec![0u8; 1 << 20];
        let frame = zstd::bulk::compress(&big, 1).unwrap();
        let mut out = vec![0u8; 4096];
        let err = decode_chunk(Codec::Zstd, DType::U8, &frame, &mut out, Path::new("f"), 99);
        assert!(err.is_err());
    }
}
