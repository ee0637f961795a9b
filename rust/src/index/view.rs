//! A zero-parse view over an index file's bytes (FORMAT.md §3): open checks header, footer,
//! sections and the shard table; lookups binary-search the entry table in place and verify
//! each block of 64 entries the first time it is touched. The bytes come from an
//! [`IndexSource`]: in memory, or read from the file page by page as lookups touch them, so
//! open costs the same whatever the key count.
//!
//! Where to look: this file opens the view and verifies its sections and blocks; `lookup` finds
//! keys (binary search, the global order check) and parses entries into [`Entry`].

pub(super) mod lookup;

use super::build::ShardRec;
use super::layout::{BlockRecord, EntryRecord, Footer, IndexHeader, ShardRecord};
use super::source::{zeroed_flags, IndexSource};
use crate::error::{Error, Result};
use crate::format::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

/// Room allowed before a section (and before the footer): alignment padding only, so less
/// than 8 bytes (FORMAT.md §3). Too little to hide an entry record (40 bytes) or a block
/// record (24).
const MAX_SECTION_GAP: u64 = 8;
/// A validated view over the bytes of an index file.
pub struct IndexView<B: IndexSource> {
    path: PathBuf,
    bytes: B,
    h: IndexHeader,
    shards: Vec<ShardRec>,
    /// Per block: 0 = not yet verified, 1 = verified.
    verified: Vec<AtomicU8>,
    /// 1 once the block table's crc was checked (at open for an in-memory index, at the
    /// first lookup for one read on demand).
    blocks_checked: AtomicU8,
    /// 1 once the boundary keys of all adjacent blocks were found in order.
    order_checked: AtomicU8,
}

impl<B: IndexSource> IndexView<B> {
    /// Validate header, footer, section bounds and the shard table (and, for an index already
    /// in memory, the block table). Reads O(shards) bytes, never O(entries): the block table
    /// of an index read on demand is checked by the first lookup.
    pub fn open(bytes: B, path: &Path) -> Result<Self> {
        let p = path;
        let size = bytes.size();
        if size < (INDEX_HEADER_LEN + INDEX_FOOTER_LEN) as u64 {
            return Err(Error::corrupt(
                p,
                0,
                format!("index is {size} bytes, too short"),
            ));
        }
        let b = bytes.at(0, INDEX_HEADER_LEN as u64)?;
        if &b[IndexHeader::MAGIC..IndexHeader::MAGIC + 8] != INDEX_MAGIC {
            return Err(Error::corrupt(p, 0, "not a shardpoint index (bad magic)"));
        }
        let stored = le_u32(b, IndexHeader::CRC);
        let actual = crc(&b[..IndexHeader::CRC]);
        if stored != actual {
            return Err(Error::Checksum {
                path: p.to_path_buf(),
                offset: 0,
                what: "index header".into(),
                expected: stored,
                actual,
            });
        }
        let h = IndexHeader::decode(b);
        if h.version != FORMAT_VERSION && h.version != INDEX_VERSION_HASHED {
            return Err(Error::UnsupportedVersion {
                path: p.to_path_buf(),
                found: h.version,
                supported: INDEX_VERSION_HASHED,
            });
        }
        if h.header_len as usize != INDEX_HEADER_LEN {
            return Err(Error::corrupt(
                p,
                IndexHeader::HEADER_LEN as u64,
                "index header_len is not 128",
            ));
        }
        if h.file_len != size {
            return Err(Error::corrupt(
                p,
                IndexHeader::FILE_LEN as u64,
                format!(
                    "index records {} bytes but the file has {size} (truncated or extended)",
                    h.file_len,
                ),
            ));
        }
        let f = size - INDEX_FOOTER_LEN as u64;
        let fb = bytes.at(f, INDEX_FOOTER_LEN as u64)?;
        if &fb[Footer::MAGIC..Footer::MAGIC + 8] != INDEX_FOOTER_MAGIC
            || le_u32(fb, Footer::HEADER_CRC) != stored
            || le_u32(fb, Footer::RESERVED) != 0
        {
            return Err(Error::corrupt(
                p,
                f,
                "index footer does not match its header",
            ));
        }
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&h.chunk_bytes)
            || !h.chunk_bytes.is_multiple_of(16)
        {
            return Err(Error::corrupt(
                p,
                IndexHeader::CHUNK_BYTES as u64,
                format!("chunk_bytes {} out of range", h.chunk_bytes),
            ));
        }
        // Sections in order, inside [header, footer), each length computed with checks, with
        // no room between them for anything but alignment padding: a header that
        // understates the entry count (crcs recomputed) would leave the entries it hides in
        // such room, so it is refused here rather than read as a smaller checkpoint.
        let n = h.entry_count;
        let nblocks = n.div_ceil(BLOCK_ENTRIES as u64);
        let sec = [
            (
                "shard table",
                h.shards_off,
                (h.shard_count as u64).checked_mul(SHARD_REC as u64),
            ),
            (
                "block table",
                h.blocks_off,
                nblocks.checked_mul(BLOCK_REC as u64),
            ),
            (
                "entry table",
                h.entries_off,
                n.checked_mul(ENTRY_REC as u64),
            ),
            ("key blob", h.keys_off, Some(h.keys_len)),
            ("aux blob", h.aux_off, Some(h.aux_len)),
            ("metadata", h.meta_off, Some(h.meta_len)),
        ];
        let mut pos = INDEX_HEADER_LEN as u64;
        let limit = f;
        for (what, off, len) in sec {
            let len =
                len.ok_or_else(|| Error::corrupt(p, off, format!("{what}: size overflows")))?;
            let end = off.checked_add(len);
            match end {
                Some(end) if off >= pos && off - pos < MAX_SECTION_GAP && end <= limit => pos = end,
                _ => {
                    return Err(Error::corrupt(
                        p,
                        off,
                        format!(
                            "{what} [{off}, +{len}) overlaps another section, leaves the file, \
                             or leaves unexplained bytes before it"
                        ),
                    ))
                }
            }
        }
        if limit - pos >= MAX_SECTION_GAP {
            return Err(Error::corrupt(
                p,
                pos,
                format!(
                    "{} unexplained bytes between the metadata and the footer",
                    limit - pos
                ),
            ));
        }
        // Every key is 1 ..= 65535 bytes, and an empty index has no key or aux bytes: the
        // entry count must fit the blobs it describes.
        let keys_fit = n <= h.keys_len && h.keys_len <= n.saturating_mul(u16::MAX as u64);
        if !keys_fit || (n == 0 && h.aux_len != 0) {
            return Err(Error::corrupt(
                p,
                IndexHeader::ENTRY_COUNT as u64,
                format!(
                    "entry count {n} does not fit a key blob of {} bytes and an aux blob of {} \
                     (each key is 1 to 65535 bytes)",
                    h.keys_len, h.aux_len
                ),
            ));
        }
        for (what, off) in [
            ("shard table", h.shards_off),
            ("block table", h.blocks_off),
            ("entry table", h.entries_off),
        ] {
            if off % 8 != 0 {
                return Err(Error::corrupt(
                    p,
                    off,
                    format!("{what} is not 8-byte aligned"),
                ));
            }
        }
        let shard_bytes = bytes.at(h.shards_off, h.shard_count as u64 * SHARD_REC as u64)?;
        let sc = crc(shard_bytes);
        if sc != h.shards_crc {
            return Err(Error::Checksum {
                path: p.to_path_buf(),
                offset: h.shards_off,
                what: "shard table".into(),
                expected: h.shards_crc,
                actual: sc,
            });
        }
        let mut shards = Vec::with_capacity(h.shard_count as usize);
        for i in 0..h.shard_count as usize {
            let r = &shard_bytes[i * SHARD_REC..(i + 1) * SHARD_REC];
            let off = h.shards_off + (i * SHARD_REC) as u64;
            let rec = ShardRecord::decode(r);
            let name_len = rec.name_len as usize;
            if name_len == 0
                || name_len > SHARD_NAME_MAX
                || r[ShardRecord::NAME + name_len..].iter().any(|&c| c != 0)
            {
                return Err(Error::corrupt(
                    p,
                    off,
                    format!("shard record {i}: bad name length {name_len}"),
                ));
            }
            let name = &r[ShardRecord::NAME..ShardRecord::NAME + name_len];
            match shard_name_version(name) {
                Some(v) if v <= h.version => {}
                Some(v) => {
                    return Err(Error::corrupt(
                        p,
                        off,
                        format!(
                            "shard record {i}: hashed shard name {:?} in a version {} index \
                             (needs version {v}, FORMAT.md §3.1.1)",
                            String::from_utf8_lossy(name),
                            h.version
                        ),
                    ))
                }
                None => {
                    return Err(Error::corrupt(
                        p,
                        off,
                        format!(
                            "shard record {i}: refusing shard name {:?}",
                            String::from_utf8_lossy(name)
                        ),
                    ))
                }
            }
            shards.push(ShardRec {
                file_len: rec.file_len,
                save_token: rec.save_token,
                header_crc: rec.header_crc,
                name: String::from_utf8(name.to_vec()).expect("validated ASCII"),
            });
        }
        let view = IndexView {
            path: p.to_path_buf(),
            bytes,
            h,
            shards,
            verified: zeroed_flags(nblocks as usize),
            blocks_checked: AtomicU8::new(0),
            order_checked: AtomicU8::new(0),
        };
        if view.bytes.resident() {
            view.ensure_block_table()?;
        }
        Ok(view)
    }

    /// Bytes `[off, off + len)` of the index (inside a section checked at open).
    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        self.bytes.at(off, len)
    }

    /// The index file's bytes, whole (what a strong digest of the index covers).
    pub fn bytes(&self) -> Result<&[u8]> {
        self.at(0, self.h.file_len)
    }

    /// Check the block table's crc, once, before any block record is used.
    fn ensure_block_table(&self) -> Result<()> {
        if self.blocks_checked.load(Ordering::Acquire) == 1 {
            return Ok(());
        }
        let h = &self.h;
        let len = self.nblocks() as u64 * BLOCK_REC as u64;
        let bc = crc(self.at(h.blocks_off, len)?);
        if bc != h.blocks_crc {
            return Err(Error::Checksum {
                path: self.path.clone(),
                offset: h.blocks_off,
                what: "block table".into(),
                expected: h.blocks_crc,
                actual: bc,
            });
        }
        self.blocks_checked.store(1, Ordering::Release);
        Ok(())
    }

    /// Path of the index file (for error messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.h.entry_count as usize
    }

    /// True when the checkpoint has no entries.
    pub fn is_empty(&self) -> bool {
        self.h.entry_count == 0
    }

    /// The shard table.
    pub fn shards(&self) -> &[ShardRec] {
        &self.shards
    }

    /// Raw bytes per chunk of this checkpoint.
    pub fn chunk_bytes(&self) -> u32 {
        self.h.chunk_bytes
    }

    /// (key blob, aux blob) lengths in bytes.
    pub(crate) fn blob_lens(&self) -> (u64, u64) {
        (self.h.keys_len, self.h.aux_len)
    }

    /// The index's `format_version` (FORMAT.md §3: 1, or 2 when it names hashed shards).
    pub fn format_version(&self) -> u32 {
        self.h.version
    }

    /// Total size of the index file.
    pub fn file_len(&self) -> u64 {
        self.h.file_len
    }

    fn nblocks(&self) -> usize {
        self.verified.len()
    }

    /// (key range, aux range) of block `blk`, in blob-relative offsets, checked.
    fn block_ranges(&self, blk: usize) -> Result<((u64, u64), (u64, u64))> {
        self.ensure_block_table()?;
        let at = self.h.blocks_off + (blk * BLOCK_REC) as u64;
        let two = blk + 1 < self.nblocks();
        let recs = self.at(at, (BLOCK_REC * if two { 2 } else { 1 }) as u64)?;
        let rec = BlockRecord::decode(&recs[..BLOCK_REC]);
        let (klo, alo) = (rec.key_lo, rec.aux_lo);
        let (khi, ahi) = if two {
            let next = BlockRecord::decode(&recs[BLOCK_REC..]);
            (next.key_lo, next.aux_lo)
        } else {
            (self.h.keys_len, self.h.aux_len)
        };
        if klo > khi
            || khi > self.h.keys_len
            || alo > ahi
            || ahi > self.h.aux_len
            || rec.reserved != 0
            || (blk == 0 && (klo != 0 || alo != 0))
        {
            return Err(Error::corrupt(
                &self.path,
                at,
                format!("block {blk}: bad key/aux ranges"),
            ));
        }
        Ok(((klo, khi), (alo, ahi)))
    }

    /// Verify block `blk` (crc and in-block key order) unless already done.
    fn ensure_block(&self, blk: usize) -> Result<()> {
        if self.verified[blk].load(Ordering::Acquire) == 1 {
            return Ok(());
        }
        let ((klo, khi), (alo, ahi)) = self.block_ranges(blk)?;
        let lo = blk * BLOCK_ENTRIES;
        let hi = (lo + BLOCK_ENTRIES).min(self.len());
        let e0 = self.h.entries_off;
        let ent = self.at(e0 + (lo * ENTRY_REC) as u64, ((hi - lo) * ENTRY_REC) as u64)?;
        let keys = self.at(self.h.keys_off + klo, khi - klo)?;
        let aux = self.at(self.h.aux_off + alo, ahi - alo)?;
        let c = crc32c::crc32c_append(crc32c::crc32c_append(crc(ent), keys), aux);
        let at = self.h.blocks_off + (blk * BLOCK_REC) as u64;
        let stored = BlockRecord::decode(self.at(at, BLOCK_REC as u64)?).crc;
        if c != stored {
            return Err(Error::Checksum {
                path: self.path.clone(),
                offset: e0 + (lo * ENTRY_REC) as u64,
                what: format!("index block {blk} (entries {lo}..{hi})"),
                expected: stored,
                actual: c,
            });
        }
        let mut prev: Option<&[u8]> = None;
        for i in lo..hi {
            let k = self.key_bytes_unchecked(i, klo, khi)?;
            if prev.is_some_and(|p| p >= k) {
                return Err(Error::corrupt(
                    &self.path,
                    e0 + (i * ENTRY_REC) as u64,
                    format!("entry {i}: keys are not strictly sorted"),
                ));
            }
            prev = Some(k);
        }
        self.verified[blk].store(1, Ordering::Release);
        Ok(())
    }

    /// The key bytes of entry `i` within its block's key range `[klo, khi)`, its block not
    /// necessarily verified (the block check itself reads keys with it).
    fn key_bytes_unchecked(&self, i: usize, klo: u64, khi: u64) -> Result<&[u8]> {
        let rec = EntryRecord::decode(self.at(
            self.h.entries_off + (i * ENTRY_REC) as u64,
            ENTRY_REC as u64,
        )?);
        let start = klo + rec.key_rel as u64;
        let len = rec.key_len as u64;
        if len == 0 || start + len > khi {
            return Err(Error::corrupt(
                &self.path,
                self.h.entries_off + (i * ENTRY_REC) as u64,
                format!("entry {i}: key outside its block's key range"),
            ));
        }
        self.at(self.h.keys_off + start, len)
    }

    /// The metadata JSON bytes, crc-checked.
    pub fn metadata_bytes(&self) -> Result<&[u8]> {
        let m = self.at(self.h.meta_off, self.h.meta_len)?;
        let c = crc(m);
        if c != self.h.meta_crc {
            return Err(Error::Checksum {
                path: self.path.clone(),
                offset: self.h.meta_off,
                what: "metadata".into(),
                expected: self.h.meta_crc,
                actual: c,
            });
        }
        Ok(m)
    }

    /// Verify every block and the global key order.
    pub fn verify_all(&self) -> Result<()> {
        // One read of the whole index instead of page-by-page reads (index read on demand).
        self.bytes()?;
        self.ensure_block_table()?;
        for blk in 0..self.nblocks() {
            self.ensure_block(blk)?;
        }
        for blk in 1..self.nblocks() {
            let i = blk * BLOCK_ENTRIES;
            if self.key_bytes(i - 1)? >= self.key_bytes(i)? {
                return Err(Error::corrupt(
                    &self.path,
                    self.h.entries_off + (i * ENTRY_REC) as u64,
                    format!("entry {i}: keys are not sorted across blocks"),
                ));
            }
        }
        self.metadata_bytes()?;
        self.verify_section_gaps()
    }

    /// Check that the bytes between the index's sections (alignment padding, unused space
    /// after the shard records) are zero: every byte of the index is then either covered by a
    /// crc, checked field by field, or checked to be zero.
    fn verify_section_gaps(&self) -> Result<()> {
        let h = &self.h;
        let nblocks = h.entry_count.div_ceil(BLOCK_ENTRIES as u64);
        // (start, end) of every section, in file order (checked in order at open)
        let secs = [
            (
                h.shards_off,
                h.shards_off + h.shard_count as u64 * SHARD_REC as u64,
            ),
            (h.blocks_off, h.blocks_off + nblocks * BLOCK_REC as u64),
            (
                h.entries_off,
                h.entries_off + h.entry_count * ENTRY_REC as u64,
            ),
            (h.keys_off, h.keys_off + h.keys_len),
            (h.aux_off, h.aux_off + h.aux_len),
            (h.meta_off, h.meta_off + h.meta_len),
        ];
        let mut pos = INDEX_HEADER_LEN as u64;
        let footer = h.file_len - INDEX_FOOTER_LEN as u64;
        for (lo, hi) in secs.into_iter().chain([(footer, footer)]) {
            if let Some(p) = first_nonzero(self.at(pos, lo - pos)?) {
                return Err(Error::corrupt(
                    &self.path,
                    pos + p as u64,
                    "non-zero byte between index sections (padding must be zero)",
                ));
            }
            pos = hi;
        }
        Ok(())
    }
}
