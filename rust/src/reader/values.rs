//! One value's bytes: its stored payload (pread, in parallel pieces when large) and a raw range
//! of it, decoding only the chunks that overlap (first-axis slices).

use super::{Reader, READ_PIECE};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use rayon::prelude::*;

impl Reader {
    /// The stored payload bytes of an entry, read from the file (a copy).
    pub fn stored(&self, e: &Entry<'_>) -> Result<Vec<u8>> {
        let mut v = vec![0u8; e.stored_len as usize];
        self.read_stored(e, 0, &mut v)?;
        Ok(v)
    }

    /// Stored bytes `[rel, rel + out.len())` of an entry's payload into `out` (pread; large
    /// reads are split into pieces read in parallel). Bounds were checked against the shard's
    /// recorded length when the entry was looked up.
    pub fn read_stored(&self, e: &Entry<'_>, rel: u64, out: &mut [u8]) -> Result<()> {
        let shard = &self.shards[e.shard as usize];
        let base = e.offset + rel;
        if out.len() <= READ_PIECE {
            return shard.read_at(base, out);
        }
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            out.par_chunks_mut(READ_PIECE)
                .enumerate()
                .try_for_each(|(i, piece)| {
                    cancel.check()?;
                    shard.read_at(base + (i * READ_PIECE) as u64, piece)
                })
        })
    }

    /// Raw bytes `[lo, hi)` of the entry's data, decoding only the chunks that overlap.
    pub fn read_range(&self, e: &Entry<'_>, lo: u64, hi: u64, out: &mut [u8]) -> Result<()> {
        if lo > hi || hi > e.raw_len || out.len() as u64 != hi - lo {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: byte range [{lo}, {hi}) invalid for {} bytes",
                e.key, e.raw_len
            )));
        }
        if e.codec == Codec::None {
            return self.read_stored(e, lo, out);
        }
        if lo == hi {
            return Ok(());
        }
        self.check_chunk_table(e)?;
        let cb = self.index.chunk_bytes() as u64;
        let (c0, c1) = (lo / cb, (hi - 1) / cb);
        // Cut `out` into one disjoint `&mut` piece per overlapping chunk before going parallel,
        // so every thread writes only through the piece it owns.
        let mut pieces: Vec<(u64, &mut [u8])> = Vec::with_capacity((c1 - c0 + 1) as usize);
        let mut rest = out;
        for ci in c0..=c1 {
            let (a, b) = (lo.max(ci * cb), hi.min((ci + 1) * cb));
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut((b - a) as usize);
            pieces.push((ci, piece));
            rest = tail;
        }
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            pieces
                .into_par_iter()
                .try_for_each(|(ci, dst)| -> Result<()> {
                    cancel.check()?;
                    let raw_lo = ci * cb;
                    let raw_n = cb.min(e.raw_len - raw_lo) as usize;
                    let mut tmp = vec![0u8; raw_n];
                    self.decode_one(e, ci as usize, &mut tmp)?;
                    let from = (lo.max(raw_lo) - raw_lo) as usize;
                    dst.copy_from_slice(&tmp[from..from + dst.len()]);
                    Ok(())
                })
        })
    }
}

impl Reader {
    /// Check `bytes`, the raw bytes of blocks `first ..` of an uncompressed entry (whole
    /// blocks; the last may be the value's short tail), against its block crcs (§3.4).
    /// Returns the crcs computed.
    pub(super) fn check_blocks(
        &self,
        e: &Entry<'_>,
        first: usize,
        bytes: &[u8],
    ) -> Result<Vec<u32>> {
        e.check_blocks(first, bytes, &self.shards[e.shard as usize].path)
    }

    /// Raw bytes `[lo, hi)` of the entry, checked: an uncompressed value with crc blocks
    /// (§3.4) reads only the blocks holding the range and checks each; one without reads and
    /// checks the whole value once (its one crc covers all of it); a compressed value decodes
    /// the chunks holding the range, each checked.
    pub fn read_range_checked(
        &self,
        e: &Entry<'_>,
        lo: u64,
        hi: u64,
        out: &mut [u8],
    ) -> Result<()> {
        if e.codec != Codec::None || lo == hi {
            return self.read_range(e, lo, hi, out);
        }
        if e.block_log2 == 0 {
            return self.read_range_whole_crc(e, lo, hi, out);
        }
        if lo > hi || hi > e.raw_len || out.len() as u64 != hi - lo {
            return self.read_range(e, lo, hi, out); // its error
        }
        let b = 1u64 << e.block_log2;
        // The whole blocks inside [lo, hi) (the value's short last block counts as whole when
        // hi is the value's end) are read straight into `out` and checked there; the (at most
        // two) blocks cut by lo or hi are read whole into a buffer and checked.
        let in_lo = lo.div_ceil(b) * b;
        let in_hi = if hi == e.raw_len { hi } else { hi / b * b };
        if in_lo < in_hi {
            let dst = &mut out[(in_lo - lo) as usize..(in_hi - lo) as usize];
            self.read_stored(e, in_lo, dst)?;
            let dst = &*dst;
            let step = READ_PIECE.max(b as usize);
            let cancel = crate::cancel::current();
            crate::threads::install(|| {
                dst.par_chunks(step).enumerate().try_for_each(|(i, p)| {
                    cancel.check()?;
                    let first = (in_lo / b) as usize + i * (step / b as usize);
                    self.check_blocks(e, first, p).map(|_| ())
                })
            })?;
        }
        for (a, z) in [(lo, in_lo.min(hi)), (in_hi.max(in_lo).max(lo), hi)] {
            if a >= z {
                continue;
            }
            let blk = a / b;
            let (blo, bhi) = (blk * b, ((blk + 1) * b).min(e.raw_len));
            let mut tmp = vec![0u8; (bhi - blo) as usize];
            self.read_stored(e, blo, &mut tmp)?;
            self.check_blocks(e, blk as usize, &tmp)?;
            out[(a - lo) as usize..(z - lo) as usize]
                .copy_from_slice(&tmp[(a - blo) as usize..(z - blo) as usize]);
        }
        Ok(())
    }

    /// [`Self::read_range_checked`] of an uncompressed value without crc blocks: its one crc
    /// covers the whole value, so the range is read into `out` and the crc is taken over the
    /// bytes before it (read in pieces, bounded memory), `out` itself and the bytes after it.
    /// The bytes checked are the bytes returned: checking the whole value and then reading the
    /// range again read it twice, and a file changed in between gave unchecked bytes.
    fn read_range_whole_crc(&self, e: &Entry<'_>, lo: u64, hi: u64, out: &mut [u8]) -> Result<()> {
        self.read_range(e, lo, hi, out)?;
        let piece_crc = |from: u64, to: u64| -> Result<u32> {
            let mut acc = crate::checksum::crc(&[]);
            let mut buf = vec![0u8; READ_PIECE.min((to - from) as usize)];
            let mut at = from;
            while at < to {
                let n = READ_PIECE.min((to - at) as usize);
                self.read_stored(e, at, &mut buf[..n])?;
                acc = crate::crc_combine::combine(acc, crate::checksum::crc(&buf[..n]), n as u64);
                at += n as u64;
            }
            Ok(acc)
        };
        let before = piece_crc(0, lo)?;
        let mid = crate::crc_combine::combine(before, crate::checksum::crc(out), hi - lo);
        let actual = crate::crc_combine::combine(mid, piece_crc(hi, e.raw_len)?, e.raw_len - hi);
        self.expect_crc(e, actual)
    }
}
