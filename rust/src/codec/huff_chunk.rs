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
}

/// Entropy in bits per byte of a strided sample of plane `p` of `raw`, read straight from the
/// elements (so planes that will be stored raw can be grouped straight into the output).
fn sampled_plane_entropy(raw: &[u8], w: usize, rot: bool, p: usize) -> f64 {
    let n = raw.len() / w;
    let step = (n / 8192).max(1);
    let mut hist = [0u32; 256];
    let mut cnt = 0u32;
    let bits = 8 * w as u32;
    for e in (0..n).step_by(step) {
        let mut v = 0u64;
        for j in 0..w {
            v |= (raw[e * w + j] as u64) << (8 * j);
        }
        if rot {
            v = ((v << 1) | (v >> (bits - 1))) & (u64::MAX >> (64 - bits));
        }
        hist[((v >> (8 * (w - 1 - p))) & 0xff) as usize] += 1;
        cnt += 1;
    }
    let nf = cnt.max(1) as f64;
    hist.iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let q = c as f64 / nf;
            -q * q.log2()
        })
        .sum()
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
    let w = dtype.group_width();
    let rot = dtype.rotates_sign();
    let n = raw.len() / w;
    debug_assert!(w >= 2 && n * w == raw.len() && n > 0);
    // Which planes are worth trying: the most significant always, the others if a sample says
    // they are not random (for floats, only plane 0; fp16 also carries mantissa bits there).
    let try_code: Vec<bool> = (0..w)
        .map(|p| p == 0 || sampled_plane_entropy(raw, w, rot, p) <= RAW_BITS)
        .collect();
    let nraw = try_code.iter().filter(|&&t| !t).count();
    let hdr = 4 * w;
    let mut out = Vec::with_capacity(raw.len() + hdr + 64);
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
        let mut coded: Vec<u8> = Vec::new();
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
        if out.len() + coded.len() >= limit {
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
        let mut in_crcs: Vec<Option<u32>> = lens.iter().map(|&l| (l == n).then_some(0)).collect();
        let raw_crc = ungroup_crc(w, dtype.rotates_sign(), &planes, out, &mut in_crcs);
        let mut pieces = vec![(crc(&stored[..hdr]), hdr)];
        pieces.extend(in_crcs.iter().flatten().map(|&c| (c, n)));
        let coded_from = hdr + nraw * n;
        pieces.push((crc(&stored[coded_from..]), stored.len() - coded_from));
        Ok((raw_crc, combine_crcs(pieces)))
    })
}
