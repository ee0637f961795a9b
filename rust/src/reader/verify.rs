//! Verification of a local checkpoint: the raw crc of a value (or of a zero-copy view of it),
//! every stored crc of one value, and everything at once (index blocks, key order, metadata,
//! payloads, chunks, zero gaps); and what strong (digest) verification reads.

use super::{Reader, READ_PIECE};
use crate::checksum::combine_block_crcs;
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

impl Reader {
    fn check_raw_crc(&self, e: &Entry<'_>, bytes: &[u8]) -> Result<()> {
        self.expect_crc(e, crate::checksum::par_crc(bytes))
    }

    /// `Ok` when `actual` is the entry's stored crc, else the checksum error naming its shard,
    /// offset and key.
    pub(super) fn expect_crc(&self, e: &Entry<'_>, actual: u32) -> Result<()> {
        if actual != e.crc {
            return Err(Error::Checksum {
                path: self.shards[e.shard as usize].path.clone(),
                offset: e.offset,
                what: format!("key {:?}", e.key),
                expected: e.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Check the raw crc of an uncompressed entry against `view`, its bytes as handed out
    /// (the zero-copy mapping): computing the crc there, in parallel pieces, is also the first
    /// touch of the pages the caller is about to read, so a checked load costs little more
    /// than an unchecked one that touches its data.
    pub fn verify_view(&self, e: &Entry<'_>, view: &[u8]) -> Result<()> {
        if e.codec != Codec::None || view.len() as u64 != e.stored_len {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: a view of {} bytes is not its uncompressed payload",
                e.key,
                view.len()
            )));
        }
        self.check_raw_crc(e, view)
    }

    /// Check an entry's stored crcs, reading it with pread in pieces (parallel for large
    /// payloads). Used by `verify`.
    pub fn verify_entry(&self, e: &Entry<'_>) -> Result<()> {
        crate::threads::install(|| self.verify_entry_in_pool(e))
    }

    fn verify_entry_in_pool(&self, e: &Entry<'_>) -> Result<()> {
        if e.codec == Codec::None {
            let shard = &self.shards[e.shard as usize];
            let n = e.stored_len as usize;
            let cancel = crate::cancel::current();
            // With crc blocks (§3.4) pieces are whole blocks and every block's crc is checked
            // too: a block table that disagrees with the data fails here, not in a later slice.
            let piece = if e.block_log2 == 0 {
                READ_PIECE
            } else {
                READ_PIECE.max(1 << e.block_log2)
            };
            let pieces: Vec<(u32, usize)> = (0..n.div_ceil(piece))
                .into_par_iter()
                .map(|i| {
                    cancel.check()?;
                    let lo = i * piece;
                    let len = piece.min(n - lo);
                    let mut buf = vec![0u8; len];
                    shard.read_at(e.offset + lo as u64, &mut buf)?;
                    if e.block_log2 == 0 {
                        return Ok((crc(&buf), len));
                    }
                    let first = lo >> e.block_log2;
                    let got = self.check_blocks(e, first, &buf)?;
                    Ok((combine_block_crcs(&got, len as u64, e.block_log2), len))
                })
                .collect::<Result<_>>()?;
            let actual = if pieces.is_empty() {
                crc(&[])
            } else {
                combine_crcs(pieces)
            };
            if actual != e.crc {
                return Err(Error::Checksum {
                    path: shard.path.clone(),
                    offset: e.offset,
                    what: format!("key {:?}", e.key),
                    expected: e.crc,
                    actual,
                });
            }
            Ok(())
        } else {
            let cancel = crate::cancel::current();
            (0..e.nchunks()).into_par_iter().try_for_each(|ci| {
                cancel.check()?;
                self.with_chunk(e, ci, |_, _| Ok(()))
            })
        }
    }

    /// Check everything: every index block, global key order, metadata, every payload and chunk
    /// crc, and that no two payloads overlap. Parallel over entries and pieces of large payloads.
    pub fn verify(&self) -> Result<()> {
        self.index.verify_all()?;
        let n = self.index.len();
        let mut ranges: Vec<(u32, u64, u64, usize)> = Vec::with_capacity(n);
        for i in 0..n {
            let e = self.index.entry(i)?;
            ranges.push((e.shard, e.offset, e.offset + e.stored_len, i));
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
                let e = self.index.entry(w[1].3)?;
                return Err(Error::corrupt(
                    &self.shards[e.shard as usize].path,
                    e.offset,
                    format!("payload of key {:?} overlaps another entry's", e.key),
                ));
            }
        }
        self.verify_gaps(&ranges)?;
        // Entries in parallel; inside, large raw payloads and chunk lists are split again
        // (rayon nests), so one huge tensor still uses every core.
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            (0..n).into_par_iter().try_for_each(|i| -> Result<()> {
                cancel.check()?;
                let _scope = cancel.enter();
                let e = self.index.entry(i)?;
                if e.codec != Codec::None {
                    self.check_chunk_table(&e)?;
                }
                self.verify_entry(&e)
            })
        })
    }

    /// Check that every shard byte outside the header and the payloads is zero (FORMAT.md §2),
    /// so that every byte of a shard is either checked by a crc or checked to be zero.
    /// `ranges` are the payloads `(shard, lo, hi, entry)`, sorted and non-overlapping.
    fn verify_gaps(&self, ranges: &[(u32, u64, u64, usize)]) -> Result<()> {
        let payloads: Vec<(u32, u64, u64)> = ranges.iter().map(|r| (r.0, r.1, r.2)).collect();
        let lens: Vec<u64> = self.shards.iter().map(|s| s.len()).collect();
        let mut pieces = Vec::new();
        for (s, lo, hi) in shard_gaps(&payloads, &lens) {
            let mut a = lo;
            while a < hi {
                let b = hi.min(a + READ_PIECE as u64);
                pieces.push((s, a, b));
                a = b;
            }
        }
        crate::threads::install(|| {
            pieces.into_par_iter().try_for_each(|(s, a, b)| {
                let shard = &self.shards[s as usize];
                let mut buf = vec![0u8; (b - a) as usize];
                shard.read_at(a, &mut buf)?;
                match first_nonzero(&buf) {
                None => Ok(()),
                Some(p) => Err(Error::corrupt(
                    &shard.path,
                    shard.base + a + p as u64,
                    "non-zero byte in the padding between payloads (FORMAT.md §2: gaps are zero)",
                )),
            }
            })
        })?;
        // A single-file checkpoint's own padding (offsets in the file, not in its shard),
        // read in bounded pieces (a hostile file may declare a huge gap).
        for &(lo, hi) in &self.container_gaps {
            use std::os::unix::fs::FileExt;
            let shard = &self.shards[0];
            let mut a = lo;
            while a < hi {
                let mut buf = vec![0u8; (hi - a).min(READ_PIECE as u64) as usize];
                shard
                    .file
                    .read_exact_at(&mut buf, a)
                    .map_err(|e| Error::io(&shard.path, "read single-file checkpoint", e))?;
                if let Some(p) = first_nonzero(&buf) {
                    return Err(Error::corrupt(
                        &shard.path,
                        a + p as u64,
                        "non-zero byte in the single-file checkpoint's padding (FORMAT.md §10)",
                    ));
                }
                a += buf.len() as u64;
            }
        }
        Ok(())
    }
}

/// What strong verification ([`crate::digest::verify_strong`]) reads of a local checkpoint.
impl crate::digest::ShardBytes for Reader {
    fn index_bytes(&self) -> Result<&[u8]> {
        self.index().bytes()
    }
    fn index_path(&self) -> &Path {
        self.index().path()
    }
    fn metadata(&self) -> Result<&[u8]> {
        self.index().metadata_bytes()
    }
    fn shard_recs(&self) -> &[crate::index::ShardRec] {
        self.index().shards()
    }
    fn shard_path(&self, i: usize) -> PathBuf {
        self.shards()[i].path.clone()
    }
    /// pread from the descriptor the reader opened: the same file its reads use.
    fn read_shard(&self, i: usize, off: u64, buf: &mut [u8]) -> Result<()> {
        self.shards()[i].read_at(off, buf)
    }
    fn grew(&self, i: usize) -> bool {
        let s = &self.shards()[i];
        let mut one = [0u8; 1];
        s.read_at(s.len(), &mut one).is_ok()
    }
}
