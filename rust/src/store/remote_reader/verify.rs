//! Verification of a checkpoint in an object store: index blocks, key order, metadata, shard
//! headers, payload crcs and zero gaps, fetched in batches of bounded size; and what strong
//! (digest) verification reads of it.

use super::{RemoteReader, Span, VERIFY_BATCH};
use crate::error::{Error, Result};
use crate::format::*;
use std::path::{Path, PathBuf};

impl RemoteReader {
    /// Check everything: index blocks, key order, metadata, shard headers, that no payloads
    /// overlap, and every payload's crcs (fetched in batches of bounded size).
    pub fn verify(&self) -> Result<()> {
        self.index.verify_all()?;
        self.index.metadata_bytes()?;
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
                    self.shard_url(&e),
                    e.offset,
                    format!("payload of key {:?} overlaps another entry's", e.key),
                ));
            }
        }
        let heads: Vec<Span> = (0..self.shards.len() as u32)
            .map(|s| (s, 0, SHARD_HEADER_LEN as u64))
            .collect();
        for (i, h) in self.fetch(&heads)?.iter().enumerate() {
            let sh = &self.shards[i];
            let rec = &self.index.shards()[i];
            let (hdr, hcrc) = ShardHeader::decode(h, &sh.url)?;
            if hdr.save_token != rec.save_token || hcrc != rec.header_crc {
                return Err(Error::corrupt(
                    &sh.url,
                    0,
                    format!("shard {i} belongs to another save (token/header crc differ from the index)"),
                ));
            }
        }
        self.verify_gaps(&ranges)?;
        // Batches of ~1 GiB stored bytes keep memory bounded on huge checkpoints.
        let mut i = 0;
        while i < n {
            let mut es = Vec::new();
            let mut total = 0u64;
            while i < n && (es.is_empty() || total < VERIFY_BATCH) {
                let e = self.index.entry(i)?;
                total += e.stored_len;
                es.push(e);
                i += 1;
            }
            self.read_many(&es)?;
        }
        Ok(())
    }

    /// Check that every shard byte outside the header and the payloads is zero (FORMAT.md §2),
    /// fetching the gaps (coalesced, in batches of bounded size).
    fn verify_gaps(&self, ranges: &[(u32, u64, u64, usize)]) -> Result<()> {
        let payloads: Vec<Span> = ranges.iter().map(|r| (r.0, r.1, r.2)).collect();
        let lens: Vec<u64> = self.shards.iter().map(|s| s.file_len).collect();
        let mut pieces = Vec::new();
        for (s, lo, hi) in crate::format::shard_gaps(&payloads, &lens) {
            let mut a = lo;
            while a < hi {
                let b = hi.min(a + VERIFY_BATCH);
                pieces.push((s, a, b));
                a = b;
            }
        }
        let mut i = 0;
        while i < pieces.len() {
            let mut n = 0;
            let mut total = 0u64;
            while i + n < pieces.len() && (n == 0 || total < VERIFY_BATCH) {
                total += pieces[i + n].2 - pieces[i + n].1;
                n += 1;
            }
            let batch = &pieces[i..i + n];
            for ((s, a, _), got) in batch.iter().zip(self.fetch(batch)?) {
                if let Some(p) = crate::format::first_nonzero(&got) {
                    return Err(Error::corrupt(
                        &self.shards[*s as usize].url,
                        a + p as u64,
                        "non-zero byte in the padding between payloads (FORMAT.md §2: gaps are zero)",
                    ));
                }
            }
            i += n;
        }
        Ok(())
    }
}

/// What strong verification ([`crate::digest::verify_strong`]) reads of a checkpoint in a store.
impl crate::digest::ShardBytes for RemoteReader {
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
        self.shards()[i].url.clone()
    }
    fn read_shard(&self, i: usize, off: u64, buf: &mut [u8]) -> Result<()> {
        self.read_shard_into(i as u32, off, buf)
    }
    /// Every ranged GET checks the object's total size against the shard record.
    fn grew(&self, _i: usize) -> bool {
        false
    }
    /// Bigger requests: each is split into parallel ranged GETs by the reader.
    fn piece(&self) -> usize {
        4 * crate::digest::HASH_PIECE
    }
}
