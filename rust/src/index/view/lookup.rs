//! Lookups in an [`IndexView`]: the key of an entry, the binary search (each block it touches
//! verified), the once-per-view proof that the whole table is sorted, and entry `i` parsed and
//! validated into an [`Entry`].

use super::IndexView;
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::build::{ChunkRec, EntryMeta};
use crate::index::layout::{ChunkRecord, EntryRecord};
use crate::index::source::IndexSource;
use std::sync::atomic::Ordering;

/// A parsed, validated entry, borrowing the index bytes.
#[derive(Clone, Debug)]
pub struct Entry<'a> {
    pub index: usize,
    pub key: &'a str,
    pub dtype: DType,
    pub codec: Codec,
    pub kind: Kind,
    pub dims: Vec<u64>,
    pub shard: u32,
    pub crc: u32,
    pub offset: u64,
    pub stored_len: u64,
    pub raw_len: u64,
    /// The chunk records (`nchunks × 16` bytes); empty for codec none.
    pub chunk_table: &'a [u8],
    /// An uncompressed value's crc blocks (§3.4): `1 << block_log2` bytes each; 0 if none.
    pub block_log2: u8,
    /// Their crcs (`nblocks × 4` bytes); empty if none.
    pub block_crcs: &'a [u8],
}

impl Entry<'_> {
    /// Number of crc blocks (§3.4; 0 when the value has no block table).
    pub fn nblocks(&self) -> usize {
        self.block_crcs.len() / BLOCK_CRC_REC
    }

    /// The crc of block `i` (caller checks `i < nblocks()`).
    pub fn block_crc(&self, i: usize) -> u32 {
        le_u32(self.block_crcs, i * BLOCK_CRC_REC)
    }

    /// The block crcs, decoded.
    pub fn block_crc_list(&self) -> Vec<u32> {
        (0..self.nblocks()).map(|i| self.block_crc(i)).collect()
    }

    /// Check `bytes`, whole crc blocks of this uncompressed value from block `first` (the
    /// last may be the value's short tail), against the block crcs; `path` names the file
    /// they came from in an error. Returns the crcs computed.
    pub fn check_blocks(
        &self,
        first: usize,
        bytes: &[u8],
        path: &std::path::Path,
    ) -> Result<Vec<u32>> {
        let b = 1usize << self.block_log2;
        let mut got = Vec::with_capacity(bytes.len().div_ceil(b));
        for (i, blk) in bytes.chunks(b).enumerate() {
            let bi = first + i;
            let actual = crc(blk);
            if bi >= self.nblocks() {
                return Err(Error::InvalidArgument(format!(
                    "key {:?}: crc block {bi} of {} read",
                    self.key,
                    self.nblocks()
                )));
            }
            let expected = self.block_crc(bi);
            if actual != expected {
                return Err(Error::Checksum {
                    path: path.to_path_buf(),
                    offset: self.offset + (bi * b) as u64,
                    what: format!("key {:?} crc block {bi}", self.key),
                    expected,
                    actual,
                });
            }
            got.push(actual);
        }
        Ok(got)
    }

    /// Number of chunks (0 for codec none).
    pub fn nchunks(&self) -> usize {
        self.chunk_table.len() / CHUNK_REC
    }

    /// Chunk record `i` (caller checks `i < nchunks()`).
    pub fn chunk(&self, i: usize) -> ChunkRec {
        let (rel_offset, stored_len, crc) =
            ChunkRecord::decode(&self.chunk_table[i * CHUNK_REC..(i + 1) * CHUNK_REC]);
        ChunkRec {
            rel_offset,
            stored_len,
            crc,
        }
    }

    /// Owned metadata (used when merging partial indexes).
    pub fn to_meta(&self) -> EntryMeta {
        EntryMeta {
            key: self.key.to_string(),
            dtype: self.dtype,
            codec: self.codec,
            kind: self.kind,
            dims: self.dims.clone(),
            shard: self.shard,
            crc: self.crc,
            offset: self.offset,
            stored_len: self.stored_len,
            chunks: (0..self.nchunks()).map(|i| self.chunk(i)).collect(),
            block_log2: self.block_log2,
            block_crcs: self.block_crc_list(),
        }
    }
}
impl<B: IndexSource> IndexView<B> {
    /// The key bytes of entry `i` (verifying its block first).
    pub fn key_bytes(&self, i: usize) -> Result<&[u8]> {
        let blk = i / BLOCK_ENTRIES;
        self.ensure_block(blk)?;
        let ((klo, khi), _) = self.block_ranges(blk)?;
        self.key_bytes_unchecked(i, klo, khi)
    }

    /// Check, once, that the last key of every block is below the first key of the next.
    /// With the in-block order checked when a block is verified, this makes the whole table
    /// sorted, so a binary search on a hostile (crc-consistent but unsorted) index cannot
    /// answer "absent" for a key that is there. Costs two key reads per block of 64 entries,
    /// paid by the first lookup, not by open.
    fn ensure_order(&self) -> Result<()> {
        if self.order_checked.load(Ordering::Acquire) == 1 {
            return Ok(());
        }
        // Every block's first and last key are read: bring the entry table and key blob in
        // with one read each rather than page by page.
        self.at(self.h.entries_off, self.h.entry_count * ENTRY_REC as u64)?;
        self.at(self.h.keys_off, self.h.keys_len)?;
        let mut prev_last: Option<&[u8]> = None;
        for blk in 0..self.nblocks() {
            let ((klo, khi), _) = self.block_ranges(blk)?;
            let lo = blk * BLOCK_ENTRIES;
            let hi = (lo + BLOCK_ENTRIES).min(self.len());
            let first = self.key_bytes_unchecked(lo, klo, khi)?;
            if prev_last.is_some_and(|p| p >= first) {
                return Err(Error::corrupt(
                    &self.path,
                    self.h.entries_off + (lo * ENTRY_REC) as u64,
                    format!(
                        "entry {lo}: keys are not sorted across blocks {} and {blk}",
                        blk - 1
                    ),
                ));
            }
            prev_last = Some(self.key_bytes_unchecked(hi - 1, klo, khi)?);
        }
        self.order_checked.store(1, Ordering::Release);
        Ok(())
    }

    /// Every key, in order. Proves the whole table sorted first (once), as lookups do: a
    /// listing of a crc-consistent index whose blocks are out of order is an error, never a
    /// list that disagrees with lookups.
    pub fn keys(&self) -> Result<Vec<&str>> {
        self.ensure_order()?;
        (0..self.len()).map(|i| Ok(self.entry(i)?.key)).collect()
    }

    /// First entry index whose key is `>= key`. Proves the whole table sorted first (once):
    /// callers walk on from the answer (prefix listings), which is only right in a sorted table.
    pub fn lower_bound(&self, key: &[u8]) -> Result<usize> {
        self.ensure_order()?;
        self.search(key)
    }

    /// Binary search, verifying each block it touches (O(log n) blocks read).
    fn search(&self, key: &[u8]) -> Result<usize> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.key_bytes(mid)? < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Entry index of `key`, if present.
    ///
    /// A hit is answered from the O(log n) blocks the search read (each verified). "Absent" is
    /// only answered once the whole table is proven sorted (checked once, by the first miss):
    /// a crc-consistent but unsorted hostile index cannot hide a key that is there, and a
    /// lookup that finds its key never pays for reading the whole index.
    pub fn find(&self, key: &str) -> Result<Option<usize>> {
        let i = self.search(key.as_bytes())?;
        if i < self.len() && self.key_bytes(i)? == key.as_bytes() {
            return Ok(Some(i));
        }
        self.ensure_order()?;
        Ok(None)
    }

    /// Parse and validate entry `i`.
    pub fn entry(&self, i: usize) -> Result<Entry<'_>> {
        let r = self.entry_raw(i)?;
        Ok(Entry {
            index: i,
            key: r.key,
            dtype: r.dtype,
            codec: r.codec,
            kind: r.kind,
            dims: r.dims().to_vec(),
            shard: r.rec.shard,
            crc: r.rec.crc,
            offset: r.rec.offset,
            stored_len: r.rec.stored_len,
            raw_len: r.raw_len,
            chunk_table: r.chunk_table,
            block_log2: r.block_log2,
            block_crcs: r.block_crcs,
        })
    }

    /// Entry `i` validated exactly as [`IndexView::entry`] does, without allocating: its
    /// record, key and aux bytes borrowed from the index (what the merge copies through).
    pub(crate) fn entry_raw(&self, i: usize) -> Result<RawEntry<'_>> {
        if i >= self.len() {
            return Err(Error::InvalidArgument(format!("entry {i} out of range")));
        }
        let blk = i / BLOCK_ENTRIES;
        self.ensure_block(blk)?;
        let ((klo, khi), (alo, ahi)) = self.block_ranges(blk)?;
        let rec_off = self.h.entries_off + (i * ENTRY_REC) as u64;
        let r = EntryRecord::decode(self.at(rec_off, ENTRY_REC as u64)?);
        let bad = |what: String| Error::corrupt(&self.path, rec_off, format!("entry {i}: {what}"));
        let key_b = self.key_bytes_unchecked(i, klo, khi)?;
        let key = std::str::from_utf8(key_b).map_err(|_| bad("key is not valid UTF-8".into()))?;
        if key_b.contains(&0) {
            return Err(bad(format!("key {key:?} contains NUL")));
        }
        let bad = |what: String| {
            Error::corrupt(&self.path, rec_off, format!("entry {i} ({key:?}): {what}"))
        };
        let dtype = DType::from_tag(r.dtype)
            .ok_or_else(|| bad(format!("unknown dtype tag {}", r.dtype)))?;
        let codec = Codec::from_tag(r.codec)
            .ok_or_else(|| bad(format!("unknown codec tag {}", r.codec)))?;
        let kind =
            Kind::from_tag(r.kind).ok_or_else(|| bad(format!("unknown kind tag {}", r.kind)))?;
        let ndim = r.ndim as usize;
        // Byte 10 is `crc_block_log2` (§3.4), byte 11 stays reserved.
        let block_log2 = (r.reserved & 0xff) as u8;
        if ndim > MAX_NDIM || r.reserved >> 8 != 0 {
            return Err(bad(format!(
                "ndim {ndim} > {MAX_NDIM} or reserved bytes set"
            )));
        }
        if block_log2 != 0
            && (codec != Codec::None
                || !(MIN_CRC_BLOCK_LOG2..=MAX_CRC_BLOCK_LOG2).contains(&block_log2))
        {
            return Err(bad(format!(
                "crc_block_log2 {block_log2} on a {} value (only uncompressed values have \
                 crc blocks, of 2^{MIN_CRC_BLOCK_LOG2} ..= 2^{MAX_CRC_BLOCK_LOG2} bytes)",
                codec.name()
            )));
        }
        let shard = r.shard;
        let srec = self
            .shards
            .get(shard as usize)
            .ok_or_else(|| bad(format!("shard {shard} out of range")))?;
        let (aux_rel, offset, stored_len) = (r.aux_rel as u64, r.offset, r.stored_len);
        let itemsize = dtype.itemsize();
        let mut a = alo
            .checked_add(aux_rel)
            .filter(|&a| a <= ahi)
            .ok_or_else(|| bad("aux offset outside its block".into()))?;
        let aux = |a: u64, len: u64| -> Result<&[u8]> {
            if a.checked_add(len).is_none_or(|e| e > ahi) {
                return Err(bad(format!("aux data [{a}, +{len}) outside its block")));
            }
            self.at(self.h.aux_off + a, len)
        };
        let aux_start = a;
        let mut dims_buf = [0u64; MAX_NDIM];
        if codec == Codec::None && ndim == 1 {
            if stored_len % itemsize as u64 != 0 {
                return Err(bad(format!(
                    "stored_len {stored_len} is not a multiple of itemsize {itemsize}"
                )));
            }
            dims_buf[0] = stored_len / itemsize as u64;
        } else {
            let d = aux(a, 8 * ndim as u64)?;
            a += 8 * ndim as u64;
            for (slot, c) in dims_buf.iter_mut().zip(d.chunks_exact(8)) {
                *slot = le_u64(c, 0);
            }
        }
        let dims = &dims_buf[..ndim];
        let raw_len = raw_len(dims, itemsize).ok_or_else(|| {
            bad(format!(
                "shape {dims:?} of {itemsize}-byte items overflows (a dimension or the byte \
                     size of its non-zero dimensions exceeds 2^63 - 1)"
            ))
        })?;
        if kind != Kind::Tensor && (dtype != DType::U8 || ndim != 1) {
            return Err(bad("typed entries must be 1-d uint8".into()));
        }
        if kind == Kind::Object && raw_len > MAX_OBJECT_BYTES {
            // Refused from the record: nothing of it is read or decompressed (§6.1).
            return Err(bad(format!(
                "object entry of {raw_len} bytes, over the {MAX_OBJECT_BYTES} bytes a reader accepts"
            )));
        }
        let chunk_table: &[u8] = if codec == Codec::None {
            if stored_len != raw_len {
                return Err(bad(format!(
                    "stored_len {stored_len} != raw length {raw_len}"
                )));
            }
            &[]
        } else {
            if stored_len > raw_len {
                return Err(bad(format!(
                    "compressed entry stores {stored_len} bytes, more than its raw {raw_len}"
                )));
            }
            let nch = chunk_count(raw_len, self.h.chunk_bytes);
            let len = nch
                .checked_mul(CHUNK_REC as u64)
                .ok_or_else(|| bad("chunk count overflows".into()))?;
            let t = aux(a, len)?;
            a += len;
            t
        };
        let block_crcs: &[u8] = if block_log2 == 0 {
            &[]
        } else {
            if raw_len == 0 {
                return Err(bad(format!(
                    "crc_block_log2 {block_log2} on an empty value"
                )));
            }
            // The count follows from the shape (never read from the file), and the table
            // must lie inside the block's aux range: nothing is allocated from it.
            let len = crc_block_count(raw_len, block_log2) * BLOCK_CRC_REC as u64;
            let t = aux(a, len)?;
            a += len;
            t
        };
        if offset < DATA_START
            || offset % ALIGN != 0
            || offset
                .checked_add(stored_len)
                .is_none_or(|e| e > srec.file_len)
        {
            return Err(bad(format!(
                "payload [{offset}, +{stored_len}) is misaligned or outside shard {shard} ({} bytes)",
                srec.file_len
            )));
        }
        let aux_bytes = self.at(self.h.aux_off + aux_start, a - aux_start)?;
        Ok(RawEntry {
            rec: r,
            key,
            dtype,
            codec,
            kind,
            dims_buf,
            raw_len,
            aux: aux_bytes,
            chunk_table,
            block_log2,
            block_crcs,
        })
    }
}

/// An entry validated by [`IndexView::entry_raw`], borrowing the index bytes: nothing on the
/// heap, so a merge of millions of entries allocates nothing per entry.
pub(crate) struct RawEntry<'a> {
    /// The record as stored (its key_rel/aux_rel are relative to its own block).
    pub rec: EntryRecord,
    pub key: &'a str,
    pub dtype: DType,
    pub codec: Codec,
    pub kind: Kind,
    dims_buf: [u64; MAX_NDIM],
    pub raw_len: u64,
    /// The entry's aux bytes (dims unless inline, then the chunk table), contiguous.
    pub aux: &'a [u8],
    /// The chunk records (empty for codec none).
    pub chunk_table: &'a [u8],
    /// `crc_block_log2` (0: none) and the block crcs (§3.4).
    pub block_log2: u8,
    pub block_crcs: &'a [u8],
}

impl RawEntry<'_> {
    /// The entry's shape.
    pub fn dims(&self) -> &[u64] {
        &self.dims_buf[..self.rec.ndim as usize]
    }
}
