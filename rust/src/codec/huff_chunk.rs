//! Codec 3, `bytegroup-huffman` (FORMAT.md §5.1): byte-grouped planes, each stored raw, as a
//! constant, or order-0 Huffman coded. Only the exponent-carrying planes of floats have
//! entropy worth coding; the mantissa planes are stored raw, so for them the codec costs one
//! grouping pass, done block by block with the crcs fused in.
//!
//! Chunk layout (compressed form; a chunk as long as its raw bytes is stored raw, as for every
//! codec):
//!
//! ```text
//! 0     4k   seg_len[p], p = 0 .. k-1 (u32): n = plane stored raw, else a coded segment
//! 4k    …    the raw planes, in plane order, n bytes each
//! …     …    the coded segments, in plane order: mode byte 0 = constant (one value byte),
//!            1 = Huffman (huffman.rs layout)
//! ```
//!
//! Raw planes come first so the writer groups them straight into their final place in the
//! output, and the reader ungroups straight from the stored bytes.

use super::huffman;
use super::planes::{group_crc, ungroup_crc, PlaneOut};
use crate::format::{combine_crcs, crc, DType};
use std::cell::RefCell;

const MODE_CONST: u8 = 0;
const MODE_HUFF: u8 = 1;
/// A plane is coded only if that saves at least ~1.5% of it (else raw: a memcpy to decode).
fn worth(coded: usize, n: usize) -> bool {
    coded < n - n / 64
}

/// Sampled planes above this entropy (bits per byte) are stored raw without coding them.
const RAW_BITS: f64 = 7.5;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The coded segments of the chunk being encoded (kept between chunks: no page faults).
    static CODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Elements per sampled run, and runs per chunk, of [`sampled_entropies`]: 4096 elements in
/// 64 contiguous runs (cache-line friendly) estimate a random plane at ~7.95 bits per byte, well
/// above [`RAW_BITS`], for ~1% of a 1 MiB chunk's grouping cost.
const RUN: usize = 64;
const RUNS: usize = 64;

/// Entropy in bits per byte of a sample of every plane of `raw` but the first (which is always
/// coded), from one pass over a few contiguous runs of elements, read straight from the
/// elements so that planes that will be stored raw can be grouped straight into the output.
fn sampled_entropies(raw: &[u8], w: usize, rot: bool) -> [f64; 8] {
    let n = raw.len() / w;
    let mut hist = [[0u32; 256]; 8];
    let bits = 8 * w as u32;
    let mut count = 0u32;
    let runs = if n <= RUN * RUNS { 1 } else { RUNS };
    let run = if runs == 1 { n } else { RUN };
    for r in 0..runs {
        let first = if runs == 1 {
            0
        } else {
            r * (n - RUN) / (RUNS - 1)
        };
        for el in raw[first * w..(first + run) * w].chunks_exact(w) {
            let mut v = 0u64;
            for (j, &b) in el.iter().enumerate() {
                v |= (b as u64) << (8 * j);
            }
            if rot {
                v = ((v << 1) | (v >> (bits - 1))) & (u64::MAX >> (64 - bits));
            }
            for (p, h) in hist.iter_mut().enumerate().take(w).skip(1) {
                h[((v >> (8 * (w - 1 - p))) & 0xff) as usize] += 1;
            }
            count += 1;
        }
    }
    let nf = count.max(1) as f64;
    let mut out = [0f64; 8];
    for p in 1..w {
        out[p] = hist[p]
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let q = c as f64 / nf;
                -q * q.log2()
            })
            .sum();
    }
    out
}

/// An encoded chunk: stored bytes (`None` = store the chunk raw), crc32c of the raw bytes, and
/// crc32c of the stored bytes.
pub struct Encoded {
    pub stored: Option<Vec<u8>>,
    pub raw_crc: u32,
    pub stored_crc: u32,
}

/// Encode one raw chunk of `dtype` (group width >= 2); `limit` is the stored size at and above
/// which the chunk is stored raw.
pub fn encode(dtype: DType, raw: &[u8], limit: usize) -> Encoded {
    encode_in(dtype, raw, limit, Vec::new())
}

/// [`encode`] into `out` (cleared first; its capacity is reused).
pub fn encode_in(dtype: DType, raw: &[u8], limit: usize, mut out: Vec<u8>) -> Encoded {
    let w = dtype.group_width();
    let rot = dtype.rotates_sign();
    let n = raw.len() / w;
    debug_assert!(w >= 2 && n * w == raw.len() && n > 0);
    // Which planes are worth trying: the most significant always, the others if a sample says
    // they are not random (for floats, only plane 0; fp16 also carries mantissa bits there).
    let entropy = sampled_entropies(raw, w, rot);
    let try_code: Vec<bool> = (0..w).map(|p| p == 0 || entropy[p] <= RAW_BITS).collect();
    let nraw = try_code.iter().filter(|&&t| !t).count();
    let hdr = 4 * w;
    out.clear();
    out.reserve(raw.len() + hdr + 64);
    out.resize(hdr + nraw * n, 0);
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let ntry = w - nraw;
        if s.len() < ntry * n {
            s.resize(ntry * n, 0);
        }
        let (head, mut raw_region) = out.split_at_mut(hdr);
        let _ = head;
        let mut scratch: &mut [u8] = &mut s[..ntry * n];
        let mut planes: Vec<PlaneOut<'_>> = Vec::with_capacity(w);
        for &t in &try_code {
            let bytes = if t {
                let (a, b) = std::mem::take(&mut scratch).split_at_mut(n);
                scratch = b;
                a
            } else {
                let (a, b) = std::mem::take(&mut raw_region).split_at_mut(n);
                raw_region = b;
                a
            };
            planes.push(PlaneOut {
                bytes,
                crc: (!t).then_some(0),
            });
        }
        let raw_crc = group_crc(w, rot, raw, &mut planes);
        let mut plane_crcs: Vec<Option<u32>> = planes.iter().map(|p| p.crc).collect();
        drop(planes);
        // Code the candidate planes; a candidate that does not shrink becomes raw after all.
        let mut seg_lens = vec![n as u32; w];
        let mut coded = CODED.with(|c| std::mem::take(&mut *c.borrow_mut()));
        coded.clear();
        let mut cand = s[..ntry * n].chunks_exact(n);
        for p in 0..w {
            if !try_code[p] {
                continue;
            }
            let plane = cand.next().expect("one scratch plane per candidate");
            let hist = huffman::histogram(plane);
            let at = coded.len();
            let lens = huffman::code_lengths(&hist);
            match lens {
                None if worth(2, n) => coded.extend_from_slice(&[MODE_CONST, plane[0]]),
                Some(l) if worth(1 + huffman::segment_len_bound(&hist, &l), n) => {
                    coded.push(MODE_HUFF);
                    huffman::encode(plane, &l, &mut coded);
                }
                _ => {
                    // Raw after all: insert it among the raw planes, in plane order.
                    let before = (0..p).filter(|&q| seg_lens[q] as usize == n).count();
                    let pos = hdr + before * n;
                    out.splice(pos..pos, plane.iter().copied());
                    plane_crcs[p] = Some(crc(plane));
                    continue;
                }
            }
            seg_lens[p] = (coded.len() - at) as u32;
        }
        for (p, l) in seg_lens.iter().enumerate() {
            out[4 * p..4 * p + 4].copy_from_slice(&l.to_le_bytes());
        }
        let keep = |coded: Vec<u8>| CODED.with(|c| *c.borrow_mut() = coded);
        if out.len() + coded.len() >= limit {
            keep(coded);
            return Encoded {
                stored: None,
                raw_crc,
                stored_crc: raw_crc,
            };
        }
        // crc of the stored bytes from its pieces: header, raw planes (crc'd while grouped),
        // coded segments.
        let mut pieces = vec![(crc(&out[..hdr]), hdr)];
        for p in 0..w {
            if seg_lens[p] as usize == n {
                pieces.push((plane_crcs[p].expect("raw planes have a crc"), n));
            }
        }
        pieces.push((crc(&coded), coded.len()));
        out.extend_from_slice(&coded);
        keep(coded);
        Encoded {
            stored: Some(out),
            raw_crc,
            stored_crc: combine_crcs(pieces),
        }
    })
}

/// Decode a compressed chunk into `out`; returns the crc32c of `out` and of `stored`, both
/// computed inside the one ungrouping pass (raw planes are crc'd block by block as they are
/// read). Errors are messages for the caller to wrap with the chunk's file and offset.
pub fn decode(dtype: DType, stored: &[u8], out: &mut [u8]) -> Result<(u32, u32), String> {
    decode_with(dtype, stored, out, true).map(|(r, s)| (r, s.expect("asked for")))
}

/// Decode like [`decode`], returning only the crc32c of `out`: for readers that check the
/// decoded bytes end to end against the entry's crc and look at chunk crcs only to name the
/// damage (saves one crc pass over the stored bytes).
pub fn decode_raw_crc(dtype: DType, stored: &[u8], out: &mut [u8]) -> Result<u32, String> {
    decode_with(dtype, stored, out, false).map(|(r, _)| r)
}

fn decode_with(
    dtype: DType,
    stored: &[u8],
    out: &mut [u8],
    want_stored: bool,
) -> Result<(u32, Option<u32>), String> {
    let w = dtype.group_width();
    if w < 2 || !out.len().is_multiple_of(w) {
        return Err("bytegroup-huffman chunk of a 1-byte dtype".into());
    }
    let n = out.len() / w;
    let hdr = 4 * w;
    let lens: Vec<usize> = stored
        .get(..hdr)
        .ok_or("chunk shorter than its plane table")?
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize)
        .collect();
    let nraw = lens.iter().filter(|&&l| l == n).count();
    let mut coded_at = hdr + nraw * n;
    let mut total = coded_at;
    for (p, &l) in lens.iter().enumerate() {
        if l == 0 || l > n {
            return Err(format!(
                "plane {p}: segment of {l} bytes (plane of {n} bytes)"
            ));
        }
        if l != n {
            total += l;
        }
    }
    if total != stored.len() {
        return Err(format!(
            "planes total {total} bytes, chunk holds {}",
            stored.len()
        ));
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let ncoded = w - nraw;
        if s.len() < ncoded * n {
            s.resize(ncoded * n, 0);
        }
        let mut scratch = s[..ncoded * n].chunks_exact_mut(n.max(1));
        let mut planes: Vec<&[u8]> = Vec::with_capacity(w);
        let mut raw_at = hdr;
        for (p, &l) in lens.iter().enumerate() {
            if l == n {
                planes.push(&stored[raw_at..raw_at + n]);
                raw_at += n;
                continue;
            }
            let seg = &stored[coded_at..coded_at + l];
            coded_at += l;
            let buf = scratch.next().expect("sized above");
            match seg[0] {
                MODE_CONST if l == 2 => buf.fill(seg[1]),
                MODE_HUFF => {
                    huffman::decode(&seg[1..], buf).map_err(|e| format!("plane {p}: {e}"))?
                }
                m => return Err(format!("plane {p}: unknown segment mode {m} ({l} bytes)")),
            }
            planes.push(buf);
        }
        let mut in_crcs: Vec<Option<u32>> = lens
            .iter()
            .map(|&l| (want_stored && l == n).then_some(0))
            .collect();
        let raw_crc = ungroup_crc(w, dtype.rotates_sign(), &planes, out, &mut in_crcs);
        if !want_stored {
            return Ok((raw_crc, None));
        }
        let mut pieces = vec![(crc(&stored[..hdr]), hdr)];
        pieces.extend(in_crcs.iter().flatten().map(|&c| (c, n)));
        let coded_from = hdr + nraw * n;
        pieces.push((crc(&stored[coded_from..]), stored.len() - coded_from));
        Ok((raw_crc, Some(combine_crcs(pieces))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers skip the stored crc of codec-3 chunks because every stored bit either shapes
    /// the output or is checked by the decoder: flip each bit of a few chunks and check that
    /// the decoder fails or the decoded crc changes.
    #[test]
    fn every_bit_flip_is_caught_without_the_stored_crc() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for (dtype, w) in [(DType::F32, 4usize), (DType::BF16, 2), (DType::F16, 2)] {
            let n = 1024;
            let raw: Vec<u8> = (0..n)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05;
                    let b = v.to_bits().to_le_bytes();
                    if w == 4 {
                        b.to_vec()
                    } else {
                        b[2..].to_vec()
                    }
                })
                .collect();
            let enc = encode(dtype, &raw, raw.len());
            let stored = enc.stored.expect("weights compress");
            let mut out = vec![0u8; raw.len()];
            assert_eq!(decode_raw_crc(dtype, &stored, &mut out), Ok(enc.raw_crc));
            for bit in 0..stored.len() * 8 {
                let mut bad = stored.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                if let Ok(c) = decode_raw_crc(dtype, &bad, &mut out) {
                    assert_ne!(
                        c, enc.raw_crc,
                        "{dtype:?}: flip of bit {bit} went unnoticed"
                    );
                }
            }
        }
    }
}
