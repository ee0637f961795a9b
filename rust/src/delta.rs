//! Delta entries (FORMAT.md §11, docs/DELTA.md): the passes over a new value and its base that
//! a delta save or a weight-sync delta makes, in parallel and in one read of each.
//!
//! [`xor_stats_many`] gives, per (new, base) pair, what the writer's choice needs (the XOR's
//! changed elements and per-plane bound, the new value's nonzero elements) and the crc32c of
//! both values (the delta table's `crc` and `base_crc`), optionally writing the XOR out: one
//! pass per chunk, each chunk processed in cache-sized blocks so the crcs read bytes that the
//! counting loop has just brought in. The decode side (XOR a stored payload into a value) is
//! [`crate::reader::Reader::xor_into_many`].

use crate::checksum::{combine_crcs, crc};
use crate::codec::xor::{xor_count, XorCounts};
use crate::error::{Error, Result};
use rayon::prelude::*;

/// Bytes per parallel job: a chunk of the format's default size.
const JOB: usize = 1 << 20;
/// Bytes per block inside a job: counted, then crc'd while in L1/L2.
const BLOCK: usize = 64 << 10;

/// One (new, base) pair: equal lengths, words of `width` bytes (1, 2, 4 or 8; the length a
/// multiple of it), and where to write the XOR (`out`, same length) if wanted.
pub struct XorPair<'a> {
    pub new: &'a [u8],
    pub base: &'a [u8],
    pub width: usize,
    pub out: Option<&'a mut [u8]>,
}

/// One job of [`xor_stats_many`]: pair index, new and base chunk, width, XOR output (or empty).
type Job<'a> = (usize, &'a [u8], &'a [u8], usize, &'a mut [u8]);
/// Per pair, the (crc, length) pieces of the new and the base value.
type CrcPieces = (Vec<(u32, usize)>, Vec<(u32, usize)>);

/// What [`xor_stats_many`] returns per pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XorStats {
    pub counts: XorCounts,
    /// crc32c of the new value's bytes.
    pub crc_new: u32,
    /// crc32c of the base value's bytes.
    pub crc_base: u32,
}

fn check(i: usize, p: &XorPair<'_>) -> Result<()> {
    let bad = |m: String| Err(Error::InvalidArgument(format!("xor pair {i}: {m}")));
    if !matches!(p.width, 1 | 2 | 4 | 8) {
        return bad(format!("word width {} is not 1, 2, 4 or 8", p.width));
    }
    if p.new.len() != p.base.len() {
        return bad(format!(
            "{} new bytes against {} base bytes",
            p.new.len(),
            p.base.len()
        ));
    }
    if !p.new.len().is_multiple_of(p.width) {
        return bad(format!(
            "{} bytes is not a whole number of {}-byte words",
            p.new.len(),
            p.width
        ));
    }
    if p.out.as_ref().is_some_and(|o| o.len() != p.new.len()) {
        return bad("the XOR output has another length".into());
    }
    Ok(())
}

/// Statistics and crcs of every pair (see the module doc), on this process's pool; the XOR is
/// written to each pair's `out` when given.
pub fn xor_stats_many(pairs: Vec<XorPair<'_>>) -> Result<Vec<XorStats>> {
    for (i, p) in pairs.iter().enumerate() {
        check(i, p)?;
    }
    let n = pairs.len();
    // Jobs in pair order, chunk order: results come back in that order.
    let mut jobs: Vec<Job<'_>> = Vec::new();
    for (i, p) in pairs.into_iter().enumerate() {
        let mut outs: Vec<&mut [u8]> = match p.out {
            Some(o) => o.chunks_mut(JOB).collect(),
            None => Vec::new(),
        };
        outs.reverse();
        for (a, b) in p.new.chunks(JOB).zip(p.base.chunks(JOB)) {
            jobs.push((i, a, b, p.width, outs.pop().unwrap_or_default()));
        }
    }
    let done: Vec<(usize, XorCounts, u32, u32, usize)> = crate::threads::install(|| {
        jobs.into_par_iter()
            .map(|(i, a, b, w, out)| {
                crate::cancel::check()?;
                let (mut cn, mut cb) = (0u32, 0u32);
                let mut counts = XorCounts::default();
                let mut outs = out.chunks_mut(BLOCK);
                for (x, y) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
                    let o = outs.next().unwrap_or_default();
                    counts.add(&xor_count(w, x, y, o));
                    cn = crate::checksum::crc_append(cn, x);
                    cb = crate::checksum::crc_append(cb, y);
                }
                Ok((i, counts, cn, cb, a.len()))
            })
            .collect::<Result<_>>()
    })?;
    let mut stats = vec![XorStats::default(); n];
    let mut crcs: Vec<CrcPieces> = vec![Default::default(); n];
    for (i, c, cn, cb, len) in done {
        stats[i].counts.add(&c);
        crcs[i].0.push((cn, len));
        crcs[i].1.push((cb, len));
    }
    for (s, (cn, cb)) in stats.iter_mut().zip(crcs) {
        s.crc_new = combine_crcs(cn);
        s.crc_base = combine_crcs(cb);
    }
    Ok(stats)
}

/// crc32c of each buffer, chunk-parallel on this process's pool.
pub fn crc_many(bufs: &[&[u8]]) -> Result<Vec<u32>> {
    let jobs: Vec<(usize, &[u8])> = bufs
        .iter()
        .enumerate()
        .flat_map(|(i, b)| b.chunks(JOB).map(move |c| (i, c)))
        .collect();
    let done: Vec<(usize, u32, usize)> = crate::threads::install(|| {
        jobs.into_par_iter()
            .map(|(i, c)| {
                crate::cancel::check()?;
                Ok((i, crc(c), c.len()))
            })
            .collect::<Result<_>>()
    })?;
    let mut pieces: Vec<Vec<(u32, usize)>> = vec![Vec::new(); bufs.len()];
    for (i, c, len) in done {
        pieces[i].push((c, len));
    }
    Ok(pieces.into_iter().map(combine_crcs).collect())
}

/// Stored bytes of each item as the writer would store it with `opts`' codec, level and chunk
/// size (an XOR item: its `data ^ xor_base`), without writing anything: the chunks are
/// encoded on this process's pool and only their lengths kept. What a delta's choice measures
/// near break-even (docs/DELTA.md): the real encoder's output, with no scratch checkpoint
/// written and read back. Entry padding is not counted.
pub fn stored_sizes(items: &[crate::Item<'_>], opts: &crate::WriterOptions) -> Result<Vec<u64>> {
    use crate::codec::{choose_codec, encode_chunk, encode_xor_chunk};
    use crate::format::{Codec, MIN_COMPRESS_BYTES};
    let cb = opts.chunk_bytes as usize;
    if cb == 0 {
        return Err(Error::InvalidArgument("chunk size 0".into()));
    }
    let mut sizes = vec![0u64; items.len()];
    // (item, chunk start, codec) of every chunk that is tried
    let mut jobs: Vec<(usize, usize, Codec)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        it.validate()?;
        let codec = if (it.data.len() as u64) < MIN_COMPRESS_BYTES {
            Codec::None
        } else {
            choose_codec(opts.codec, it.dtype, opts.level)
        };
        if codec == Codec::None {
            sizes[i] = it.data.len() as u64;
        } else {
            jobs.extend((0..it.data.len()).step_by(cb).map(|at| (i, at, codec)));
        }
    }
    let done: Vec<(usize, u64)> = crate::threads::install(|| {
        jobs.into_par_iter()
            .map(|(i, at, codec)| {
                crate::cancel::check()?;
                let it = &items[i];
                let range = at..(at + cb).min(it.data.len());
                let n = range.len();
                let stored = match it.xor_base {
                    None => encode_chunk(codec, it.dtype, opts.level, &it.data[range])?,
                    Some(b) => SIZE_SCRATCH.with(|cell| {
                        let mut x = cell.borrow_mut();
                        x.resize(n, 0); // (fully overwritten below)
                        crate::codec::xor::xor_to(&mut x, &it.data[range.clone()], &b[range]);
                        encode_xor_chunk(codec, it.dtype, opts.level, &x)
                    })?,
                };
                Ok((i, stored.map_or(n, |s| s.len()) as u64))
            })
            .collect::<Result<_>>()
    })?;
    for (i, n) in done {
        sizes[i] += n;
    }
    Ok(sizes)
}

thread_local! {
    /// The XOR of one chunk measured by [`stored_sizes`] (reused, cache-warm).
    static SIZE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_many_pairs_match_one_pass() {
        let new: Vec<u8> = (0..3 * JOB + 100).map(|i| (i * 31 % 253) as u8).collect();
        let mut base = new.clone();
        for i in (0..base.len()).step_by(997) {
            base[i] ^= 0x41;
        }
        let mut out = vec![0u8; new.len()];
        let empty: &[u8] = &[];
        let pairs = vec![
            XorPair {
                new: &new,
                base: &base,
                width: 4,
                out: Some(&mut out),
            },
            XorPair {
                new: empty,
                base: empty,
                width: 2,
                out: None,
            },
            XorPair {
                new: &new[..10],
                base: &base[..10],
                width: 1,
                out: None,
            },
        ];
        let s = xor_stats_many(pairs).unwrap();
        assert_eq!(s[0].counts, xor_count(4, &new, &base, &mut []));
        assert_eq!((s[0].crc_new, s[0].crc_base), (crc(&new), crc(&base)));
        let want: Vec<u8> = new.iter().zip(&base).map(|(a, b)| a ^ b).collect();
        assert_eq!(out, want);
        assert_eq!(s[1], XorStats::default());
        assert_eq!(s[2].counts.changed, 1);
        assert_eq!(
            crc_many(&[&new, empty, &base]).unwrap(),
            vec![crc(&new), 0, crc(&base)]
        );
    }

    #[test]
    fn xor_items_store_the_xor() {
        use crate::format::{DType, Kind};
        use crate::{reader::Reader, Item, WriterOptions};
        // a sparse XOR (compressed chunks), a random one (chunks stored raw), a small value
        // (stored whole, uncompressed) and an odd-length 1-byte one
        let n = 3 * JOB / 2;
        let base: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut sparse = base.clone();
        for i in (0..n).step_by(301) {
            sparse[i] ^= 0x5a;
        }
        let mut x = 1u64;
        let random: Vec<u8> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let item = |key: &str, d: DType, new: &'static [u8], b: &'static [u8]| Item {
            key: key.into(),
            dtype: d,
            kind: Kind::Tensor,
            dims: vec![(new.len() / d.itemsize()) as u64],
            data: new,
            xor_base: Some(b),
        };
        let (base, sparse, random) = (base.leak(), sparse.leak(), random.leak());
        let items = vec![
            item("sparse", DType::BF16, sparse, base),
            item("random", DType::F32, random, base),
            item("small", DType::F32, &sparse[..64], &base[..64]),
            item("odd", DType::U8, &sparse[..1001], &base[..1001]),
        ];
        let opts = WriterOptions {
            codec: crate::Codec::ZstdByteGroup,
            ..WriterOptions::default()
        };
        let bytes = crate::encode_single(&items, &opts).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.sp");
        std::fs::write(&p, &bytes).unwrap();
        let r = Reader::open(&p).unwrap();
        r.verify().unwrap();
        for it in &items {
            let e = r.entry(&it.key).unwrap();
            let want: Vec<u8> = it
                .data
                .iter()
                .zip(it.xor_base.unwrap())
                .map(|(a, b)| a ^ b)
                .collect();
            let mut got = vec![0u8; want.len()];
            r.read_into(&e, &mut got, true).unwrap();
            assert_eq!(got, want, "{}", it.key);
            // applying the payload to the base gives the new value, with its crc
            let mut target = it.xor_base.unwrap().to_vec();
            let c = r
                .xor_into_many(std::slice::from_ref(&e), vec![&mut target])
                .unwrap();
            assert_eq!(target, it.data, "{}", it.key);
            assert_eq!(c, vec![crc(it.data)]);
        }
        let bad = Item {
            xor_base: Some(&base[..10]),
            ..items[0].clone()
        };
        assert!(crate::encode_single(&[bad], &opts).is_err());
    }

    #[test]
    fn bad_pairs_are_refused() {
        let a = [0u8; 6];
        let b = [0u8; 4];
        for (p, what) in [
            (
                XorPair {
                    new: &a,
                    base: &b,
                    width: 1,
                    out: None,
                },
                "base bytes",
            ),
            (
                XorPair {
                    new: &a,
                    base: &a,
                    width: 4,
                    out: None,
                },
                "whole number",
            ),
            (
                XorPair {
                    new: &a,
                    base: &a,
                    width: 3,
                    out: None,
                },
                "width",
            ),
        ] {
            let e = xor_stats_many(vec![p]).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}
