//! Cache-blocked byte (un)grouping with the crc fused in (FORMAT.md §5 grouping rule).
//!
//! The grouping rule is the one of codec 2: plane `p` holds byte `k-1-p` (most significant
//! first) of every element, floats rotated left by one bit first. These loops work on blocks of
//! [`BLOCK`] elements so that the block being grouped or ungrouped is still in L1/L2 when its
//! crc32c is computed: one pass over memory instead of two. Inner loops index equal-length
//! slices of native integers so the compiler vectorises them (with AVX2 where the CPU has it:
//! [`super::simd`]).

/// Elements per block: 8192 × 4 bytes = 32 KiB for fp32 (L1-sized), 16 KiB for 16-bit types.
pub const BLOCK: usize = 8192;

/// Where one plane of a grouping goes, and whether its crc32c is wanted.
pub struct PlaneOut<'a> {
    pub bytes: &'a mut [u8],
    /// Running crc32c of the plane bytes written so far (`None`: not wanted).
    pub crc: Option<u32>,
}

macro_rules! group_block {
    ($name:ident, $t:ty, $w:expr) => {
        #[inline(always)]
        fn $name<const ROT: bool>(
            src: &[u8],
            planes: &mut [&mut [u8]],
            crcs: &mut [Option<u32>],
            at: usize,
        ) {
            let n = src.len() / $w;
            let mut dst: [&mut [u8]; $w] = Default::default();
            for (d, p) in dst.iter_mut().zip(planes.iter_mut()) {
                *d = &mut p[at..at + n];
            }
            // SAFETY: every bit pattern is a valid integer; align_to only yields aligned words.
            let (head, words, _) = unsafe { src.align_to::<$t>() };
            if head.is_empty() && words.len() == n {
                // Plane-major: one pass over the (L1-resident) block per plane, each a
                // shift-and-narrow over equal-length slices, which the compiler vectorises.
                let words = &words[..n];
                for (p, d) in dst.iter_mut().enumerate() {
                    let shift = 8 * ($w - 1 - p) as u32;
                    for (o, &v) in d.iter_mut().zip(words) {
                        let v = <$t>::from_le(v);
                        let v = if ROT { v.rotate_left(1) } else { v };
                        *o = (v >> shift) as u8;
                    }
                }
            } else {
                for (i, c) in src.chunks_exact($w).enumerate() {
                    let v = <$t>::from_le_bytes(c.try_into().expect("w bytes"));
                    let v = if ROT { v.rotate_left(1) } else { v };
                    for p in 0..$w {
                        dst[p][i] = (v >> (8 * ($w - 1 - p))) as u8;
                    }
                }
            }
            for (d, c) in dst.iter().zip(crcs.iter_mut()) {
                if let Some(c) = c.as_mut() {
                    *c = crate::checksum::crc_append(*c, d);
                }
            }
        }
    };
}

group_block!(group_block2, u16, 2);
group_block!(group_block4, u32, 4);
group_block!(group_block8, u64, 8);

multiversion! {
/// Group `src` (elements of width `w`, rotated when `rot`) into `planes` (each `src.len() / w`
/// bytes), block by block, updating each wanted plane crc; returns the crc32c of `src`.
pub fn group_crc(w: usize, rot: bool, src: &[u8], planes: &mut [PlaneOut<'_>]) -> u32 {
    debug_assert_eq!(planes.len(), w);
    let mut crc = 0u32;
    let mut crcs: Vec<Option<u32>> = planes.iter().map(|p| p.crc).collect();
    let mut bytes: Vec<&mut [u8]> = planes.iter_mut().map(|p| &mut *p.bytes).collect();
    let (b, c) = (&mut bytes[..], &mut crcs[..]);
    for (i, block) in src.chunks(BLOCK * w).enumerate() {
        let at = i * BLOCK;
        match (w, rot) {
            (2, true) => group_block2::<true>(block, b, c, at),
            (2, false) => group_block2::<false>(block, b, c, at),
            (4, true) => group_block4::<true>(block, b, c, at),
            (4, false) => group_block4::<false>(block, b, c, at),
            (8, true) => group_block8::<true>(block, b, c, at),
            (8, false) => group_block8::<false>(block, b, c, at),
            _ => unreachable!("group widths are 2, 4 or 8"),
        }
        crc = crate::checksum::crc_append(crc, block);
    }
    drop(bytes);
    for (p, c) in planes.iter_mut().zip(crcs) {
        p.crc = c;
    }
    crc
}
}

/// Estimated Shannon entropy, in bits per byte, of a sample of `plane`. Planes above
/// [`INCOMPRESSIBLE_BITS`] cannot shrink below 95% and are stored raw without trying zstd,
/// which is what keeps compression fast on the random low mantissa bytes of float weights.
///
/// The sample is [`SAMPLE_RUNS`] evenly spaced runs of contiguous bytes (16 KiB in all), counted
/// into four histograms in turn. Why not every k-th byte: that touched a cache line per
/// sample, and one histogram made each count wait on the one before it whenever bytes repeat
/// (the zero bytes of an XOR payload plane): the loop was ~5% of a delta encode's CPU.
pub fn sample_entropy(plane: &[u8]) -> f64 {
    const RUN: usize = 256;
    let mut hist = [[0u32; 256]; 4];
    let mut count = |run: &[u8]| {
        let mut quads = run.chunks_exact(4);
        for q in &mut quads {
            hist[0][q[0] as usize] += 1;
            hist[1][q[1] as usize] += 1;
            hist[2][q[2] as usize] += 1;
            hist[3][q[3] as usize] += 1;
        }
        for &b in quads.remainder() {
            hist[0][b as usize] += 1;
        }
    };
    if plane.len() <= SAMPLE_RUNS * RUN {
        count(plane);
    } else {
        let step = (plane.len() - RUN) / (SAMPLE_RUNS - 1);
        for i in 0..SAMPLE_RUNS {
            count(&plane[i * step..i * step + RUN]);
        }
    }
    let n: u32 = hist.iter().flatten().sum();
    if n == 0 {
        return 0.0;
    }
    let nf = n as f64;
    (0..256)
        .map(|b| hist[0][b] + hist[1][b] + hist[2][b] + hist[3][b])
        .filter(|&c| c > 0)
        .map(|c| {
            let p = c as f64 / nf;
            -p * p.log2()
        })
        .sum()
}

/// Runs of [`sample_entropy`]'s sample (of 256 bytes each).
const SAMPLE_RUNS: usize = 64;

/// Above this estimated entropy (bits/byte) a plane is stored raw (8 × 0.95 = 7.6, minus a
/// margin for the sample's bias).
pub const INCOMPRESSIBLE_BITS: f64 = 7.5;

/// One pass over a block of 16-bit words: both plane bytes, the rotation and the store per
/// element, over equal-length slices, which the compiler vectorises (a byte interleave plus
/// shifts). It replaced three plane-major passes (set, or, rotate): 1.7x the bytes per
/// CPU-second on a 1 MiB bf16 chunk.
#[inline(always)]
fn interleave2<const ROT: bool>(src: &[&[u8]; 2], words: &mut [u16]) {
    let n = words.len();
    let (a, b) = (&src[0][..n], &src[1][..n]);
    for ((o, &x), &y) in words.iter_mut().zip(a).zip(b) {
        let v = (x as u16) << 8 | y as u16;
        *o = if ROT { v.rotate_right(1) } else { v }.to_le();
    }
}

/// [`interleave2`] for 32-bit words (four planes, one pass).
#[inline(always)]
fn interleave4<const ROT: bool>(src: &[&[u8]; 4], words: &mut [u32]) {
    let n = words.len();
    let (a, b, c, d) = (&src[0][..n], &src[1][..n], &src[2][..n], &src[3][..n]);
    for ((((o, &x), &y), &z), &u) in words.iter_mut().zip(a).zip(b).zip(c).zip(d) {
        let v = (x as u32) << 24 | (y as u32) << 16 | (z as u32) << 8 | u as u32;
        *o = if ROT { v.rotate_right(1) } else { v }.to_le();
    }
}

/// Plane-major interleave of 64-bit words: the first plane sets each word, the others are
/// or-ed in, one vectorised pass over the (L1-resident) block each; then the rotation (eight
/// zipped planes in one pass did not vectorise).
#[inline(always)]
fn interleave8<const ROT: bool>(src: &[&[u8]; 8], words: &mut [u64]) {
    for (o, &b) in words.iter_mut().zip(src[0]) {
        *o = (b as u64) << 56;
    }
    for (p, plane) in src.iter().enumerate().skip(1) {
        let shift = 8 * (7 - p) as u32;
        for (o, &b) in words.iter_mut().zip(*plane) {
            *o |= (b as u64) << shift;
        }
    }
    for o in words.iter_mut() {
        let v = if ROT { o.rotate_right(1) } else { *o };
        *o = v.to_le();
    }
}

macro_rules! ungroup_block {
    ($name:ident, $t:ty, $w:expr, $interleave:ident) => {
        #[inline(always)]
        fn $name<const ROT: bool>(planes: &[&[u8]], at: usize, dst: &mut [u8]) {
            let n = dst.len() / $w;
            let mut src: [&[u8]; $w] = [&[]; $w];
            for (s, p) in src.iter_mut().zip(planes) {
                *s = &p[at..at + n];
            }
            let word = |i: usize| {
                let mut v: $t = 0;
                for p in 0..$w {
                    v |= (src[p][i] as $t) << (8 * ($w - 1 - p));
                }
                if ROT {
                    v.rotate_right(1)
                } else {
                    v
                }
            };
            // SAFETY: every bit pattern is a valid integer; align_to_mut only yields aligned words.
            let (head, words, _) = unsafe { dst.align_to_mut::<$t>() };
            if head.is_empty() && words.len() == n {
                $interleave::<ROT>(&src, &mut words[..n]);
            } else {
                for (i, o) in dst.chunks_exact_mut($w).enumerate() {
                    o.copy_from_slice(&word(i).to_le_bytes());
                }
            }
        }
    };
}

ungroup_block!(ungroup_block2, u16, 2, interleave2);
ungroup_block!(ungroup_block4, u32, 4, interleave4);
ungroup_block!(ungroup_block8, u64, 8, interleave8);

/// One block of `ungroup`/`ungroup_crc`, by width and rotation (inlined into each of their
/// `multiversion!` copies, so every copy keeps its own vectorised loops).
#[inline(always)]
fn ungroup_block(w: usize, rot: bool, planes: &[&[u8]], at: usize, block: &mut [u8]) {
    match (w, rot) {
        (2, true) => ungroup_block2::<true>(planes, at, block),
        (2, false) => ungroup_block2::<false>(planes, at, block),
        (4, true) => ungroup_block4::<true>(planes, at, block),
        (4, false) => ungroup_block4::<false>(planes, at, block),
        (8, true) => ungroup_block8::<true>(planes, at, block),
        (8, false) => ungroup_block8::<false>(planes, at, block),
        _ => unreachable!("group widths are 2, 4 or 8"),
    }
}

multiversion! {
/// Interleave `planes` (each `dst.len() / w` bytes, most significant first) into `dst`, block by
/// block, the inverse of grouping without a crc: the zstd-bytegroup codec's decode, which was
/// a per-element loop of its own (the blocks' one-pass interleaves vectorise).
pub fn ungroup(w: usize, rot: bool, planes: &[&[u8]], dst: &mut [u8]) -> () {
    debug_assert_eq!(planes.len(), w);
    for (b, block) in dst.chunks_mut(BLOCK * w).enumerate() {
        let at = b * BLOCK;
        ungroup_block(w, rot, planes, at, block);
    }
}
}

multiversion! {
/// Interleave `planes` (each `dst.len() / w` bytes, most significant first) into `dst`, block by
/// block; returns the crc32c of `dst`, computed while each block is still in cache. Planes with
/// `Some` in `in_crcs` get their running crc32c updated too (the stored bytes they came from).
pub fn ungroup_crc(
    w: usize,
    rot: bool,
    planes: &[&[u8]],
    dst: &mut [u8],
    in_crcs: &mut [Option<u32>],
) -> u32 {
    debug_assert_eq!(planes.len(), w);
    let mut crc = 0u32;
    for (b, block) in dst.chunks_mut(BLOCK * w).enumerate() {
        let at = b * BLOCK;
        let len = block.len() / w;
        for (c, p) in in_crcs.iter_mut().zip(planes) {
            if let Some(c) = c.as_mut() {
                *c = crate::checksum::crc_append(*c, &p[at..at + len]);
            }
        }
        ungroup_block(w, rot, planes, at, block);
        crc = crate::checksum::crc_append(crc, block);
    }
    crc
}
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn blocked_matches_reference(bytes in proptest::collection::vec(any::<u8>(), 0..70_000), wi in 0usize..3, rot in any::<bool>()) {
            let w = [2usize, 4, 8][wi];
            let n = bytes.len() / w;
            let src = &bytes[..n * w];
            let mut store = vec![0u8; n * w];
            let mut planes: Vec<PlaneOut<'_>> = store
                .chunks_mut(n.max(1))
                .take(w)
                .map(|b| PlaneOut { bytes: b, crc: Some(0) })
                .collect();
            if n == 0 { planes.clear(); }
            if n > 0 {
                let c = group_crc(w, rot, src, &mut planes);
                prop_assert_eq!(c, crc32c::crc32c(src));
                for p in &planes {
                    prop_assert_eq!(p.crc.unwrap(), crc32c::crc32c(p.bytes));
                }
                // Reference: element e, plane p = byte (w-1-p) of the rotated element.
                for e in (0..n).step_by(97) {
                    let mut v = 0u64;
                    for j in 0..w { v |= (src[e * w + j] as u64) << (8 * j); }
                    let bits = 8 * w as u32;
                    if rot { v = ((v << 1) | (v >> (bits - 1))) & (u64::MAX >> (64 - bits)); }
                    for (p, plane) in planes.iter().enumerate() {
                        prop_assert_eq!(plane.bytes[e], (v >> (8 * (w - 1 - p))) as u8);
                    }
                }
                let views: Vec<&[u8]> = planes.iter().map(|p| &*p.bytes).collect();
                let mut back = vec![0u8; n * w];
                let mut ins = vec![Some(0u32); w];
                let c2 = ungroup_crc(w, rot, &views, &mut back, &mut ins);
                prop_assert_eq!(&back[..], src);
                prop_assert_eq!(c2, crc32c::crc32c(src));
                let mut plain = vec![0u8; n * w];
                ungroup(w, rot, &views, &mut plain);
                prop_assert_eq!(&plain[..], src);
                for (c, v) in ins.iter().zip(&views) {
                    prop_assert_eq!(c.unwrap(), crc32c::crc32c(v));
                }
            }
        }
    }

    #[test]
    fn sampled_entropy_tells_random_from_structured_planes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let random: Vec<u8> = (0..1 << 20).map(|_| (next() >> 24) as u8).collect();
        assert!(sample_entropy(&random) > INCOMPRESSIBLE_BITS);
        assert!(sample_entropy(&random[..10_001]) > INCOMPRESSIBLE_BITS); // under one sample
        assert_eq!(sample_entropy(&[]), 0.0);
        assert_eq!(sample_entropy(&vec![7u8; 1 << 20]), 0.0);
        let two: Vec<u8> = (0..1 << 20).map(|i| (i % 2) as u8 * 9).collect();
        assert!((sample_entropy(&two) - 1.0).abs() < 1e-9);
        // a sparse plane (about 1 byte in 10 random): far below the raw threshold
        let sparse: Vec<u8> = (0..1 << 20)
            .map(|_| {
                if next() % 10 == 0 {
                    (next() >> 24) as u8
                } else {
                    0
                }
            })
            .collect();
        let h = sample_entropy(&sparse);
        assert!((0.8..2.5).contains(&h), "{h}");
    }
}
