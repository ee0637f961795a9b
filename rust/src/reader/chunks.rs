//! One chunk of a compressed value: where it lies (checked against the chunk table), its
//! stored bytes read into a per-thread scratch buffer, and its decode with crc checks.

use super::Reader;
use crate::codec::{decode_chunk, decode_chunk_crc, decode_chunk_raw_crc};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;

thread_local! {
    /// Per-thread buffer for a chunk's stored bytes (pread): reused, so steady-state reads
    /// allocate nothing and the buffer stays warm in cache.
    static CHUNK_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Reader {
    fn chunk_err(&self, e: &Entry<'_>, ci: usize, off: u64, what: String) -> Error {
        Error::corrupt(
            &self.shards[e.shard as usize].path,
            off,
            format!("key {:?} chunk {ci}: {what}", e.key),
        )
    }

    /// Check the chunk table of a compressed entry: records contiguous from 0, in order, each no
    /// longer than its raw chunk, together exactly filling the payload (FORMAT.md §3.3). Without
    /// this a hostile table could point many chunks at one stored frame.
    pub(super) fn check_chunk_table(&self, e: &Entry<'_>) -> Result<()> {
        let cb = self.index.chunk_bytes() as u64;
        let mut pos = 0u64;
        for ci in 0..e.nchunks() {
            let c = e.chunk(ci);
            let raw_n = cb.min(e.raw_len - ci as u64 * cb);
            if c.rel_offset != pos || c.stored_len as u64 > raw_n {
                return Err(self.chunk_err(e, ci, e.offset.saturating_add(c.rel_offset), format!("record at {} (+{}) is not contiguous with the previous chunk or longer than its raw {raw_n} bytes", c.rel_offset, c.stored_len)));
            }
            pos += c.stored_len as u64;
        }
        if pos != e.stored_len {
            return Err(self.chunk_err(
                e,
                e.nchunks(),
                e.offset + pos,
                format!(
                    "chunks cover {pos} bytes of a {}-byte payload",
                    e.stored_len
                ),
            ));
        }
        Ok(())
    }

    /// File offset, stored length, raw range and crc of chunk `ci`, validated.
    pub(super) fn chunk_loc(
        &self,
        e: &Entry<'_>,
        ci: usize,
    ) -> Result<(u64, usize, u64, u64, u32)> {
        let c = e.chunk(ci);
        let cb = self.index.chunk_bytes() as u64;
        let raw_lo = ci as u64 * cb;
        let raw_n = cb.min(e.raw_len - raw_lo);
        let off = e.offset.checked_add(c.rel_offset);
        let ok = off.is_some()
            && (c.stored_len as u64) <= raw_n
            && c.rel_offset
                .checked_add(c.stored_len as u64)
                .is_some_and(|end| end <= e.stored_len);
        if !ok {
            return Err(self.chunk_err(
                e,
                ci,
                e.offset,
                format!(
                    "record [{}, +{}) outside the payload or longer than its raw {raw_n} bytes",
                    c.rel_offset, c.stored_len
                ),
            ));
        }
        Ok((
            off.expect("checked"),
            c.stored_len as usize,
            raw_lo,
            raw_n,
            c.crc,
        ))
    }

    /// Read chunk `ci`'s stored bytes into the calling thread's scratch buffer and hand them
    /// to `f` with their file offset and recorded crc, unchecked: for decoders that compute
    /// the stored crc inside their own pass, or check the decoded bytes end to end
    /// ([`decode_chunk_raw_crc`]).
    pub(super) fn read_chunk<T>(
        &self,
        e: &Entry<'_>,
        ci: usize,
        f: impl FnOnce(&[u8], u64, u32) -> Result<T>,
    ) -> Result<T> {
        let (off, n, _, _, ccrc) = self.chunk_loc(e, ci)?;
        CHUNK_SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n {
                buf.resize(n, 0);
            }
            self.shards[e.shard as usize].read_at(off, &mut buf[..n])?;
            f(&buf[..n], off, ccrc)
        })
    }

    /// Read chunk `ci`'s stored bytes into the calling thread's scratch buffer, check its crc
    /// and hand them to `f`.
    pub(super) fn with_chunk<T>(
        &self,
        e: &Entry<'_>,
        ci: usize,
        f: impl FnOnce(&[u8], u64) -> Result<T>,
    ) -> Result<T> {
        let (off, n, _, _, ccrc) = self.chunk_loc(e, ci)?;
        CHUNK_SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n {
                buf.resize(n, 0);
            }
            self.shards[e.shard as usize].read_at(off, &mut buf[..n])?;
            let actual = crc(&buf[..n]);
            if actual != ccrc {
                return Err(Error::Checksum {
                    path: self.shards[e.shard as usize].path.clone(),
                    offset: off,
                    what: format!("key {:?} chunk {ci}", e.key),
                    expected: ccrc,
                    actual,
                });
            }
            f(&buf[..n], off)
        })
    }

    /// Decode chunk `ci` into `out` (its raw length), checking its stored crc.
    pub(super) fn decode_one(&self, e: &Entry<'_>, ci: usize, out: &mut [u8]) -> Result<()> {
        let path = &self.shards[e.shard as usize].path;
        self.with_chunk(e, ci, |stored, off| {
            decode_chunk(e.codec, e.dtype, stored, out, path, off)
        })
    }

    /// Decode chunk `ci` of a compressed entry into `o` (its raw length); returns the crc of
    /// the decoded bytes. Every chunk is decoded with the crc of its output computed inside
    /// the decoder (for codec 3 in the one ungrouping pass, while the data is in cache); the
    /// output crcs give the entry's raw crc, checked end to end by the caller. In a codec-3
    /// chunk, damaged stored bytes either fail the decoder or change the output, so their own
    /// crc is only read afterwards, to name the damaged chunk (one crc pass less per load);
    /// other codecs check the stored crc too.
    pub(super) fn decode_chunk_checked(
        &self,
        e: &Entry<'_>,
        ci: usize,
        o: &mut [u8],
    ) -> Result<u32> {
        self.read_chunk(e, ci, |stored, off, ccrc| {
            self.decode_stored_checked(e, ci, stored, off, ccrc, o)
        })
    }

    /// [`Reader::decode_chunk_checked`] on stored bytes already read (from file offset `off`,
    /// recorded crc `ccrc`): the direct engine reads them into its own buffers.
    pub(super) fn decode_stored_checked(
        &self,
        e: &Entry<'_>,
        ci: usize,
        stored: &[u8],
        off: u64,
        ccrc: u32,
        o: &mut [u8],
    ) -> Result<u32> {
        let path = &self.shards[e.shard as usize].path;
        if e.codec == Codec::HuffByteGroup && stored.len() != o.len() {
            // Every bit of a codec-3 chunk either shapes the output or is checked by the
            // decoder (lengths, tables, stream ends, zero padding), so the end-to-end check
            // covers its stored bytes.
            return decode_chunk_raw_crc(e.codec, e.dtype, stored, o, path, off);
        }
        // zstd frames have bits that do not shape the output: check the stored crc.
        let (r, s) = decode_chunk_crc(e.codec, e.dtype, stored, o, path, off)?;
        if s != ccrc {
            return Err(Error::Checksum {
                path: path.clone(),
                offset: off,
                what: format!("key {:?} chunk {ci}", e.key),
                expected: ccrc,
                actual: s,
            });
        }
        Ok(r)
    }
}
