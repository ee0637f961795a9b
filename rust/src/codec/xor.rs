//! XOR kernels of delta entries (FORMAT.md §11, docs/DELTA.md): the statistics of `new ^ base`
//! that the writer's choice reads, and the decode of a stored XOR chunk straight into the value
//! it applies to.
//!
//! Why here: a delta payload is an ordinary entry of the codecs of this module (zstd-bytegroup
//! for floats), so applying one is "decode a chunk" with the last step changed from *store the
//! interleaved planes* to *XOR them into the destination*. Doing it in that pass (while the
//! decoded planes are in cache) saves the scratch value, a second pass for the XOR and a third
//! for the crc of the result, which the caller takes from the chunk while it is still hot.
//!
//! Bit patterns only: elements are little-endian words of the given width, so NaN payloads,
//! `-0.0` and float8/float4 codes need no special case.

use super::{zstd_exact, Codec, DType, Error, Result, SCRATCH};
use std::cell::RefCell;
use std::path::Path;

thread_local! {
    /// Decoded bytes of a chunk whose codec has no fused XOR (zstd, codec 3): decoded here,
    /// then XORed into the destination.
    static XOR_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Statistics of the XOR of two equal-length byte strings read as little-endian words of one
/// width (1, 2, 4 or 8 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XorCounts {
    /// Words whose XOR is nonzero (the changed elements).
    pub changed: u64,
    /// `planes[j]`: words whose XOR is at least `1 << (8 j)`, i.e. that changed at byte `j`
    /// (least significant first) or above: a bound on byte plane `j`'s nonzero bytes
    /// (`planes[0] == changed`; entries at and past the width are 0).
    pub planes: [u64; 8],
    /// Nonzero words of `new`.
    pub nonzero_new: u64,
}

impl XorCounts {
    /// Add the counts of another piece.
    pub fn add(&mut self, o: &XorCounts) {
        self.changed += o.changed;
        self.nonzero_new += o.nonzero_new;
        for (a, b) in self.planes.iter_mut().zip(o.planes) {
            *a += b;
        }
    }
}

// One loop per width and per "write the XOR out or not" (a const, so no branch in the loop):
// equal-length slices of words, counters per element, which the compiler vectorises. Counts
// are u32 within a call: callers pass at most a chunk (far below 2^32 words).
macro_rules! count_words {
    ($name:ident, $t:ty, $w:expr) => {
        #[inline(always)]
        #[allow(clippy::reversed_empty_ranges)] // width 1: no plane above the first
        fn $name<const WRITE: bool>(new: &[u8], base: &[u8], out: &mut [u8]) -> XorCounts {
            let (mut changed, mut nz) = (0u32, 0u32);
            let mut planes = [0u32; $w];
            let mut tally = |a: $t, e: $t| {
                changed += (e != 0) as u32;
                nz += (a != 0) as u32;
                for (j, p) in planes.iter_mut().enumerate().skip(1) {
                    *p += ((e >> (8 * j as u32)) != 0) as u32;
                }
            };
            let word = |c: &[u8]| <$t>::from_le_bytes(c.try_into().expect("w bytes"));
            let pairs = new.chunks_exact($w).zip(base.chunks_exact($w));
            if WRITE {
                for ((a, b), o) in pairs.zip(out.chunks_exact_mut($w)) {
                    let (a, e) = (word(a), word(a) ^ word(b));
                    o.copy_from_slice(&e.to_le_bytes());
                    tally(a, e);
                }
            } else {
                for (a, b) in pairs {
                    let (a, e) = (word(a), word(a) ^ word(b));
                    tally(a, e);
                }
            }
            let mut c = XorCounts {
                changed: changed as u64,
                nonzero_new: nz as u64,
                ..XorCounts::default()
            };
            c.planes[0] = changed as u64;
            for j in 1..$w {
                c.planes[j] = planes[j] as u64;
            }
            c
        }
    };
}

count_words!(count1, u8, 1);
count_words!(count2, u16, 2);
count_words!(count4, u32, 4);
count_words!(count8, u64, 8);

multiversion! {
/// [`XorCounts`] of `new ^ base` over words of `width` bytes, writing the XOR to `out` when it
/// is not empty. Lengths: `new`, `base` (and `out` when given) equal, a multiple of `width`.
pub fn xor_count(width: usize, new: &[u8], base: &[u8], out: &mut [u8]) -> XorCounts {
    debug_assert_eq!(new.len(), base.len());
    debug_assert!(out.is_empty() || out.len() == new.len());
    debug_assert_eq!(new.len() % width, 0);
    let w = !out.is_empty();
    match (width, w) {
        (2, false) => count2::<false>(new, base, out),
        (2, true) => count2::<true>(new, base, out),
        (4, false) => count4::<false>(new, base, out),
        (4, true) => count4::<true>(new, base, out),
        (8, false) => count8::<false>(new, base, out),
        (8, true) => count8::<true>(new, base, out),
        (_, false) => count1::<false>(new, base, out),
        (_, true) => count1::<true>(new, base, out),
    }
}
}

multiversion! {
/// `dst ^= src` (equal lengths), eight bytes a step.
pub fn xor_into(dst: &mut [u8], src: &[u8]) -> () {
    debug_assert_eq!(dst.len(), src.len());
    let mut d8 = dst.chunks_exact_mut(8);
    let mut s8 = src.chunks_exact(8);
    for (d, s) in (&mut d8).zip(&mut s8) {
        let v = u64::from_ne_bytes(d[..8].try_into().expect("8"))
            ^ u64::from_ne_bytes(s.try_into().expect("8"));
        d.copy_from_slice(&v.to_ne_bytes());
    }
    for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d ^= s;
    }
}
}

multiversion! {
/// `dst = a ^ b` (equal lengths), eight bytes a step: one pass, no copy first.
pub fn xor_to(dst: &mut [u8], a: &[u8], b: &[u8]) -> () {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    let mut d8 = dst.chunks_exact_mut(8);
    let (mut a8, mut b8) = (a.chunks_exact(8), b.chunks_exact(8));
    for ((d, x), y) in (&mut d8).zip(&mut a8).zip(&mut b8) {
        let v = u64::from_ne_bytes(x.try_into().expect("8"))
            ^ u64::from_ne_bytes(y.try_into().expect("8"));
        d.copy_from_slice(&v.to_ne_bytes());
    }
    for ((d, x), y) in d8.into_remainder().iter_mut().zip(a8.remainder()).zip(b8.remainder()) {
        *d = x ^ y;
    }
}
}

// The inverse of grouping (`super::ungroup_planes`) with the output XORed into `dst` instead
// of stored: one pass over the destination.
macro_rules! ungroup_xor {
    ($name:ident, $t:ty, $w:expr) => {
        #[inline(always)]
        fn $name<const ROT: bool>(p: [&[u8]; $w], dst: &mut [u8]) {
            let n = dst.len() / $w;
            let p: [&[u8]; $w] = std::array::from_fn(|k| &p[k][..n]);
            for (i, o) in dst.chunks_exact_mut($w).enumerate() {
                let mut v: $t = 0;
                for plane in &p {
                    v = (v << 8) | plane[i] as $t;
                }
                let v = if ROT { v.rotate_right(1) } else { v };
                let cur = <$t>::from_le_bytes((&*o).try_into().expect("w bytes"));
                o.copy_from_slice(&(cur ^ v).to_le_bytes());
            }
        }
    };
}

ungroup_xor!(ungroup_xor2, u16, 2);
ungroup_xor!(ungroup_xor4, u32, 4);
ungroup_xor!(ungroup_xor8, u64, 8);

multiversion! {
/// XOR the elements interleaved from `planes` (plane 0 = most significant bytes, as grouped
/// for `dtype`) into `dst`.
fn ungroup_planes_xor(dtype: DType, planes: &[&[u8]], dst: &mut [u8]) -> () {
    let rot = dtype.rotates_sign();
    match (planes, rot) {
        ([a, b], true) => ungroup_xor2::<true>([a, b], dst),
        ([a, b], false) => ungroup_xor2::<false>([a, b], dst),
        ([a, b, c, d], true) => ungroup_xor4::<true>([a, b, c, d], dst),
        ([a, b, c, d], false) => ungroup_xor4::<false>([a, b, c, d], dst),
        ([a, b, c, d, e, f, g, h], true) => ungroup_xor8::<true>([a, b, c, d, e, f, g, h], dst),
        ([a, b, c, d, e, f, g, h], false) => ungroup_xor8::<false>([a, b, c, d, e, f, g, h], dst),
        _ => unreachable!("group widths are 2, 4 or 8"),
    }
}
}

/// Decode one stored chunk (as [`super::decode_chunk`] does, with the same checks) and XOR
/// the decoded bytes into `dst` (exactly the chunk's raw length). For zstd-bytegroup the
/// planes are XOR-interleaved straight into `dst`; other codecs decode into a scratch buffer
/// first. On an error `dst` may hold part of the XOR: callers re-apply the same chunk to
/// undo (XOR is its own inverse) or discard the value.
pub fn decode_chunk_xor(
    codec: Codec,
    dtype: DType,
    stored: &[u8],
    dst: &mut [u8],
    path: &Path,
    offset: u64,
) -> Result<()> {
    if stored.len() == dst.len() || codec == Codec::None {
        if stored.len() != dst.len() {
            return Err(Error::corrupt(
                path,
                offset,
                "raw chunk has the wrong length",
            ));
        }
        xor_into(dst, stored);
        return Ok(());
    }
    if codec != Codec::ZstdByteGroup {
        return XOR_SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < dst.len() {
                s.resize(dst.len(), 0);
            }
            let buf = &mut s[..dst.len()];
            super::decode_chunk(codec, dtype, stored, buf, path, offset)?;
            xor_into(dst, buf);
            Ok(())
        });
    }
    let w = dtype.group_width();
    if w < 2 || !dst.len().is_multiple_of(w) {
        return Err(Error::corrupt(
            path,
            offset,
            "byte-grouped chunk of a 1-byte dtype",
        ));
    }
    let n = dst.len() / w;
    // The segment table, bounds-checked as the plain decoder does (FORMAT.md §5).
    let mut segs = [(0usize, 0usize); 8];
    let mut pos = 0usize;
    let mut ncomp = 0usize;
    for (p, seg) in segs.iter_mut().enumerate().take(w) {
        let at = offset + pos as u64;
        let len = stored
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| {
                Error::corrupt(
                    path,
                    at,
                    format!("plane {p}: segment header past the chunk end"),
                )
            })?;
        pos += 4;
        if len > n || pos.checked_add(len).is_none_or(|e| e > stored.len()) {
            return Err(Error::corrupt(path, at, format!("plane {p}: segment of {len} bytes past the chunk end or longer than the plane ({n})")));
        }
        *seg = (pos, len);
        ncomp += (len != n) as usize;
        pos += len;
    }
    if pos != stored.len() {
        return Err(Error::corrupt(
            path,
            offset + pos as u64,
            "trailing bytes after the last plane",
        ));
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < ncomp * n {
            s.resize(ncomp * n, 0);
        }
        let mut dec = s.chunks_exact_mut(n.max(1));
        let mut planes: Vec<&[u8]> = Vec::with_capacity(w);
        for &(at, len) in &segs[..w] {
            if len != n {
                let buf = dec.next().expect("sized above");
                zstd_exact(&stored[at..at + len], buf, path, offset + at as u64)?;
                planes.push(buf);
            } else {
                planes.push(&stored[at..at + len]);
            }
        }
        ungroup_planes_xor(dtype, &planes, dst);
        Ok(())
    })
}

/// `ungroup_planes` then XOR, the reference the fused loop is tested against.
#[cfg(test)]
fn ungroup_then_xor(dtype: DType, planes: &[&[u8]], dst: &mut [u8]) {
    let mut tmp = vec![0u8; dst.len()];
    super::ungroup_planes(dtype, planes, &mut tmp);
    xor_into(dst, &tmp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_chunk, group};
    use crate::format::ALL_DTYPES;
    use proptest::prelude::*;

    fn reference(width: usize, new: &[u8], base: &[u8]) -> XorCounts {
        let mut c = XorCounts::default();
        for (a, b) in new.chunks_exact(width).zip(base.chunks_exact(width)) {
            let mut x = [0u8; 8];
            let mut y = [0u8; 8];
            x[..width].copy_from_slice(a);
            y[..width].copy_from_slice(b);
            let (a, e) = (
                u64::from_le_bytes(x),
                u64::from_le_bytes(x) ^ u64::from_le_bytes(y),
            );
            c.changed += (e != 0) as u64;
            c.nonzero_new += (a != 0) as u64;
            for j in 0..width {
                c.planes[j] += (e >> (8 * j) != 0) as u64;
            }
        }
        c
    }

    proptest! {
        #[test]
        fn counts_match_the_reference(
            new in proptest::collection::vec(any::<u8>(), 0..600),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..40),
            wi in 0usize..4,
        ) {
            let width = [1, 2, 4, 8][wi];
            let n = new.len() / width * width;
            let new = &new[..n];
            let mut base = new.to_vec();
            for (at, v) in flips {
                if n > 0 {
                    base[at % n] ^= v;
                }
            }
            let mut out = vec![0u8; n];
            let got = xor_count(width, new, &base, &mut out);
            prop_assert_eq!(got, reference(width, new, &base));
            let want: Vec<u8> = new.iter().zip(&base).map(|(a, b)| a ^ b).collect();
            prop_assert_eq!(&out, &want);
            prop_assert_eq!(xor_count(width, new, &base, &mut []), got);
            let mut again = vec![1u8; n];
            xor_to(&mut again, new, &base);
            prop_assert_eq!(&again, &want);
        }

        #[test]
        fn decode_xor_is_decode_then_xor(
            seed in any::<u64>(), n in 0usize..5000, di in 0usize..ALL_DTYPES.len(),
            ci in 0usize..3, density in 0u32..4,
        ) {
            let d = ALL_DTYPES[di];
            let n = n / d.itemsize() * d.itemsize();
            // a sparse XOR (what delta payloads are), at a few densities
            let mut x = seed | 1;
            let raw: Vec<u8> = (0..n).map(|_| {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                if (x >> 40) % 16 < density as u64 * 4 { x as u8 } else { 0 }
            }).collect();
            let codec = crate::codec::effective_codec(
                [Codec::Zstd, Codec::ZstdByteGroup, Codec::HuffByteGroup][ci], d);
            let stored = encode_chunk(codec, d, 1, &raw).unwrap().unwrap_or_else(|| raw.clone());
            let target: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(37)).collect();
            let mut got = target.clone();
            decode_chunk_xor(codec, d, &stored, &mut got, Path::new("t"), 0).unwrap();
            let want: Vec<u8> = target.iter().zip(&raw).map(|(a, b)| a ^ b).collect();
            prop_assert_eq!(&got, &want);
            // applying twice restores the target
            decode_chunk_xor(codec, d, &stored, &mut got, Path::new("t"), 0).unwrap();
            prop_assert_eq!(got, target);
        }
    }

    #[test]
    fn fused_ungroup_matches_ungroup_then_xor() {
        for d in ALL_DTYPES {
            let w = d.group_width();
            if w < 2 {
                continue;
            }
            let raw: Vec<u8> = (0..w * 999).map(|i| (i * 7919 % 251) as u8).collect();
            let mut g = vec![0u8; raw.len()];
            group(d, &raw, &mut g);
            let planes: Vec<&[u8]> = g.chunks_exact(raw.len() / w).collect();
            let mut a: Vec<u8> = (0..raw.len()).map(|i| (i % 13) as u8).collect();
            let mut b = a.clone();
            ungroup_planes_xor(d, &planes, &mut a);
            ungroup_then_xor(d, &planes, &mut b);
            assert_eq!(a, b, "{d:?}");
        }
    }

    #[test]
    fn hostile_chunks_are_errors() {
        let raw: Vec<u8> = (0..4096u32)
            .flat_map(|i| ((i % 5) as u16).to_le_bytes())
            .collect();
        let stored = encode_chunk(Codec::ZstdByteGroup, DType::BF16, 1, &raw)
            .unwrap()
            .unwrap();
        let mut dst = vec![0u8; raw.len()];
        for cut in [0, 3, 5, stored.len() - 1] {
            let e = decode_chunk_xor(
                Codec::ZstdByteGroup,
                DType::BF16,
                &stored[..cut],
                &mut dst,
                Path::new("f"),
                7,
            );
            assert!(e.unwrap_err().to_string().contains('f'));
        }
        let mut bad = stored.clone();
        bad[0] = 0xff; // a segment longer than the plane
        assert!(decode_chunk_xor(
            Codec::ZstdByteGroup,
            DType::BF16,
            &bad,
            &mut dst,
            Path::new("f"),
            0
        )
        .is_err());
        let mut short = vec![0u8; raw.len() - 2];
        assert!(decode_chunk_xor(
            Codec::Zstd,
            DType::U8,
            &raw[..10],
            &mut short,
            Path::new("f"),
            0
        )
        .is_err());
        assert!(decode_chunk_xor(
            Codec::ZstdByteGroup,
            DType::U8,
            &stored,
            &mut dst,
            Path::new("f"),
            0
        )
        .is_err());
    }
}
