//! Parts of values in an object store: byte ranges of many entries fetched together (tightly
//! coalesced) and checked by the chunks or crc blocks (FORMAT.md §3.4) they download.

use super::{check_chunk_table, RemoteReader, Span};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use rayon::prelude::*;

impl RemoteReader {
    /// Raw bytes `[lo, hi)` of the entry. Compressed: only the chunks holding them are fetched,
    /// each checked. Uncompressed, `verify`: with crc blocks (FORMAT.md §3.4) only the blocks
    /// holding the range, each checked; without, the whole value once, checked, and the range
    /// cut from that very download (its crc covers the whole value). Without `verify` only
    /// the range is fetched, unchecked.
    pub fn read_range(
        &self,
        e: &Entry<'_>,
        lo: u64,
        hi: u64,
        out: &mut [u8],
        verify: bool,
    ) -> Result<()> {
        self.read_ranges(&[(e.clone(), lo, hi)], &mut [out], verify)
    }

    /// Raw bytes `[lo, hi)` of many entries into `outs[i]`, as [`Self::read_range`] reads one,
    /// with every download in one batched fetch: neighbouring spans of a shard become one
    /// ranged GET (gaps up to the coalescing limit are downloaded and dropped).
    pub fn read_ranges(
        &self,
        items: &[(Entry<'_>, u64, u64)],
        outs: &mut [&mut [u8]],
        verify: bool,
    ) -> Result<()> {
        if items.len() != outs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} ranges but {} output buffers",
                items.len(),
                outs.len()
            )));
        }
        let mut spans: Vec<Span> = Vec::with_capacity(items.len());
        for ((e, lo, hi), o) in items.iter().zip(outs.iter()) {
            let (lo, hi) = (*lo, *hi);
            if lo > hi || hi > e.raw_len || o.len() as u64 != hi - lo {
                return Err(Error::InvalidArgument(format!(
                    "key {:?}: byte range [{lo}, {hi}) invalid for {} bytes",
                    e.key, e.raw_len
                )));
            }
            spans.push(self.range_span(e, lo, hi, verify)?);
        }
        let r = self.fetch_tight(&spans).and_then(|stored| {
            crate::threads::install(|| {
                items
                    .par_iter()
                    .zip(outs.par_iter_mut())
                    .zip(stored.par_iter().zip(spans.par_iter()))
                    .try_for_each(|(((e, lo, hi), o), (s, span))| {
                        self.cut_range(e, *lo, *hi, o, s, span.1 - e.offset, verify)
                    })
            })
        });
        self.checked(r)
    }

    /// What [`Self::read_ranges`] downloads for `[lo, hi)` of `e` (shard span).
    fn range_span(&self, e: &Entry<'_>, lo: u64, hi: u64, verify: bool) -> Result<Span> {
        if lo == hi {
            return Ok((e.shard, e.offset, e.offset));
        }
        if e.codec != Codec::None {
            check_chunk_table(e, self.index.chunk_bytes(), self.shard_url(e))?;
            let cb = self.index.chunk_bytes() as u64;
            return Ok(self.span_of(e, Some(((lo / cb) as usize, ((hi - 1) / cb) as usize))));
        }
        if !verify {
            return Ok((e.shard, e.offset + lo, e.offset + hi));
        }
        if e.block_log2 == 0 {
            return Ok(self.span_of(e, None));
        }
        let b = 1u64 << e.block_log2;
        let (a, z) = (lo / b * b, (hi.div_ceil(b) * b).min(e.raw_len));
        Ok((e.shard, e.offset + a, e.offset + z))
    }

    /// Check the downloaded `stored` (payload bytes from `rel`, as [`Self::range_span`] chose)
    /// and put raw bytes `[lo, hi)` of `e` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn cut_range(
        &self,
        e: &Entry<'_>,
        lo: u64,
        hi: u64,
        out: &mut [u8],
        stored: &[u8],
        rel: u64,
        verify: bool,
    ) -> Result<()> {
        if lo == hi {
            return Ok(());
        }
        if e.codec != Codec::None {
            return self.decode_range(e, lo, hi, out, stored);
        }
        if verify {
            if e.block_log2 == 0 {
                self.check_raw(e, stored)?;
            } else {
                let first = (rel >> e.block_log2) as usize;
                e.check_blocks(first, stored, self.shard_url(e))?;
            }
        }
        out.copy_from_slice(&stored[(lo - rel) as usize..(hi - rel) as usize]);
        Ok(())
    }

    /// Decode raw bytes `[lo, hi)` of a compressed entry from `stored`, the chunks covering
    /// them as downloaded, each chunk checked.
    fn decode_range(
        &self,
        e: &Entry<'_>,
        lo: u64,
        hi: u64,
        out: &mut [u8],
        stored: &[u8],
    ) -> Result<()> {
        let cb = self.index.chunk_bytes() as u64;
        let (c0, c1) = ((lo / cb) as usize, ((hi - 1) / cb) as usize);
        let base = e.chunk(c0).rel_offset;
        let parts: Vec<(u64, Vec<u8>)> = crate::threads::install(|| {
            (c0..=c1)
                .into_par_iter()
                .map(|ci| {
                    let raw_lo = ci as u64 * cb;
                    let raw_n = cb.min(e.raw_len - raw_lo) as usize;
                    let mut tmp = vec![0u8; raw_n];
                    self.decode_one(e, ci, stored, base, &mut tmp)?;
                    Ok((raw_lo, tmp))
                })
                .collect::<Result<_>>()
        })?;
        for (raw_lo, tmp) in parts {
            let a = lo.max(raw_lo);
            let b = hi.min(raw_lo + tmp.len() as u64);
            out[(a - lo) as usize..(b - lo) as usize]
                .copy_from_slice(&tmp[(a - raw_lo) as usize..(b - raw_lo) as usize]);
        }
        Ok(())
    }
}
