//! Applying a delta payload (FORMAT.md §11): an entry's raw bytes XORed into a caller's value
//! in place, chunk by chunk, with the crc32c of the result taken from each chunk while it is
//! in cache ([`crate::codec::xor::decode_chunk_xor`] does the decode and the XOR in one pass).

use super::Reader;
use crate::checksum::combine_crcs;
use crate::codec::xor::{decode_chunk_xor, xor_into};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use rayon::prelude::*;

thread_local! {
    /// Stored bytes of an uncompressed payload's piece (pread), reused across calls.
    static RAW_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Reader {
    /// XOR the raw bytes of each entry into its destination (exactly the entry's raw length;
    /// destinations must not overlap), in parallel over all chunks on this process's pool, and
    /// return the crc32c of each destination afterwards (the caller compares it with the value
    /// it expects: a damaged payload or a wrong destination shows there). The payload's own
    /// crc is not checked separately: the result's crc covers it. On an error some
    /// destinations may hold part of their XOR; applying the same entries again undoes it.
    pub fn xor_into_many(&self, entries: &[Entry<'_>], dsts: Vec<&mut [u8]>) -> Result<Vec<u32>> {
        if entries.len() != dsts.len() {
            return Err(Error::InvalidArgument(format!(
                "{} entries but {} destinations",
                entries.len(),
                dsts.len()
            )));
        }
        let cb = self.index.chunk_bytes() as usize;
        let mut jobs: Vec<(usize, usize, &mut [u8])> = Vec::new();
        for (i, (e, d)) in entries.iter().zip(dsts).enumerate() {
            if d.len() as u64 != e.raw_len {
                return Err(Error::InvalidArgument(format!(
                    "key {:?}: destination has {} bytes, the entry {}",
                    e.key,
                    d.len(),
                    e.raw_len
                )));
            }
            if e.codec != Codec::None {
                self.check_chunk_table(e)?;
            } else if e.stored_len != e.raw_len {
                return Err(Error::corrupt(
                    &self.shards[e.shard as usize].path,
                    e.offset,
                    format!(
                        "key {:?}: an uncompressed payload of {} bytes holds {} raw bytes",
                        e.key, e.stored_len, e.raw_len
                    ),
                ));
            }
            jobs.extend(
                d.chunks_mut(cb)
                    .enumerate()
                    .map(|(ci, piece)| (i, ci, piece)),
            );
        }
        let done: Vec<(usize, u32, usize)> = crate::threads::install(|| {
            jobs.into_par_iter()
                .map(|(i, ci, piece)| {
                    crate::cancel::check()?;
                    self.xor_piece(&entries[i], ci, cb, piece)?;
                    Ok((i, crate::checksum::crc(piece), piece.len()))
                })
                .collect::<Result<_>>()
        })?;
        let mut pieces: Vec<Vec<(u32, usize)>> = vec![Vec::new(); entries.len()];
        for (i, c, len) in done {
            pieces[i].push((c, len));
        }
        Ok(pieces.into_iter().map(combine_crcs).collect())
    }

    /// XOR piece `ci` (raw bytes `[ci * cb, ci * cb + piece.len())`) of entry `e` into `piece`.
    fn xor_piece(&self, e: &Entry<'_>, ci: usize, cb: usize, piece: &mut [u8]) -> Result<()> {
        let shard = &self.shards[e.shard as usize];
        if e.codec == Codec::None {
            // stored raw: the payload's bytes at the same offset
            return RAW_SCRATCH.with(|cell| {
                let mut buf = cell.borrow_mut();
                if buf.len() < piece.len() {
                    buf.resize(piece.len(), 0);
                }
                let buf = &mut buf[..piece.len()];
                shard.read_at(e.offset + (ci * cb) as u64, buf)?;
                xor_into(piece, buf);
                Ok(())
            });
        }
        self.read_chunk(e, ci, |stored, off, _crc| {
            decode_chunk_xor(e.codec, e.dtype, stored, piece, &shard.path, off)
        })
    }
}
