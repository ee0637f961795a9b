//! Writing an index (FORMAT.md §3) whose entries arrive already in key order, record by record:
//! what the multi-writer merge does with the sorted partial indexes. The caller declares the
//! index's shape up front (shard, entry, key and aux byte counts: the sums over the partials),
//! so every section's offset is known and each record, key and aux byte is written straight
//! to its place in the file's bytes; each block's crc is computed as it fills. Nothing is held
//! per entry (no `EntryMeta`, no key `String`, no sort) and the 21 MB index of a 4,096-rank
//! save is never copied from section buffers into a file buffer.

use super::build::ShardRec;
use super::layout::{BlockRecord, EntryRecord, Footer, IndexHeader, ShardRecord};
use crate::error::{Error, Result};
use crate::format::*;

// (`SortedIndexBuilder::place` and `seal_placed`: the entries of an unchanged layout's merge
// written at positions known in advance)
mod placed;

/// Where the entries of a merged index go: entry `i`'s key bytes start at `key_at[i]` in the
/// key blob and its aux bytes at `aux_at[i]` in the aux blob; the last element of each is
/// the blob's length (so each has one element more than there are entries).
#[derive(Clone, Copy)]
pub(crate) struct Slots<'a> {
    pub key_at: &'a [u32],
    pub aux_at: &'a [u32],
}

/// An index being written in key order; [`SortedIndexBuilder::finish`] returns its bytes.
pub(crate) struct SortedIndexBuilder {
    /// The file's bytes up to its metadata, zeroed where not yet written.
    out: Vec<u8>,
    /// The declared shape.
    shard_count: usize,
    entries: usize,
    keys_len: usize,
    aux_len: usize,
    /// Where the sections start in `out`.
    blocks_off: usize,
    entries_off: usize,
    keys_off: usize,
    aux_off: usize,
    /// Entries pushed, and bytes of keys and aux data written.
    n: usize,
    kpos: usize,
    apos: usize,
    /// Where the open block's keys and aux bytes start in their blobs.
    block_key_lo: usize,
    block_aux_lo: usize,
    /// The last key pushed, as (start in the key blob, length), for the order check.
    last_key: Option<(usize, usize)>,
    /// Entries written by `place` (placed.rs) rather than pushed.
    placed: usize,
}

fn too_large() -> Error {
    Error::InvalidArgument("index too large to build in memory".into())
}

impl SortedIndexBuilder {
    /// [`SortedIndexBuilder::with_shape_in`] a new buffer.
    #[cfg(test)]
    pub fn with_shape(
        shard_count: usize,
        entries: usize,
        keys_len: usize,
        aux_len: usize,
    ) -> Result<Self> {
        Self::with_shape_in(Vec::new(), shard_count, entries, keys_len, aux_len)
    }

    /// A builder for an index of exactly `entries` entries, `keys_len` key bytes and `aux_len`
    /// aux bytes referring to `shard_count` shards; pushing more, or finishing with fewer, is
    /// an error. It writes into `out` (what it held is discarded, its capacity reused): a
    /// merge hands in the buffer of the merge before it, whose pages are already mapped
    /// (merge/kept.rs). Every byte is zeroed here, so nothing of the old contents can reach
    /// the index (its gaps must be zero, FORMAT.md §3).
    pub fn with_shape_in(
        mut out: Vec<u8>,
        shard_count: usize,
        entries: usize,
        keys_len: usize,
        aux_len: usize,
    ) -> Result<Self> {
        let blocks_off = shard_count
            .checked_mul(SHARD_REC)
            .and_then(|s| s.checked_add(INDEX_HEADER_LEN))
            .ok_or_else(too_large)?;
        let entries_off = entries
            .div_ceil(BLOCK_ENTRIES)
            .checked_mul(BLOCK_REC)
            .and_then(|b| b.checked_add(blocks_off))
            .ok_or_else(too_large)?;
        let keys_off = entries
            .checked_mul(ENTRY_REC)
            .and_then(|e| e.checked_add(entries_off))
            .ok_or_else(too_large)?;
        let aux_off = keys_off.checked_add(keys_len).ok_or_else(too_large)?;
        let meta_off = aux_off.checked_add(aux_len).ok_or_else(too_large)?;
        out.clear();
        out.try_reserve_exact(meta_off).map_err(|_| too_large())?;
        // a fresh buffer is zeroed by the allocator (untouched pages cost nothing until
        // written); a reused one is zeroed here, over pages that are already mapped
        out.resize(meta_off, 0);
        Ok(SortedIndexBuilder {
            out,
            shard_count,
            entries,
            keys_len,
            aux_len,
            blocks_off,
            entries_off,
            keys_off,
            aux_off,
            n: 0,
            kpos: 0,
            apos: 0,
            block_key_lo: 0,
            block_aux_lo: 0,
            last_key: None,
            placed: 0,
        })
    }

    /// The buffer, for a new builder to reuse ([`SortedIndexBuilder::with_shape_in`]).
    pub fn into_buffer(self) -> Vec<u8> {
        self.out
    }

    /// The last key pushed.
    fn last_key(&self) -> Option<&[u8]> {
        self.last_key
            .map(|(k, len)| &self.out[self.keys_off + k..self.keys_off + k + len])
    }

    /// Append one entry: `rec` as the index will store it except for `key_rel`, `key_len` and
    /// `aux_rel` (set here), its `key` and its `aux` bytes (dims unless inline, chunk table).
    /// The caller has validated the record (a view's `entry_raw` does); keys must come in
    /// strictly increasing order, which is checked: an out-of-order or repeated key is an
    /// error naming it, as is a shard beyond the declared count or more than was declared.
    pub fn push(&mut self, mut rec: EntryRecord, key: &[u8], aux: &[u8]) -> Result<()> {
        let name = || String::from_utf8_lossy(key).into_owned();
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: length {} is outside 1..={MAX_KEY_LEN} bytes",
                name(),
                key.len()
            )));
        }
        if self.last_key().is_some_and(|last| last >= key) {
            return Err(Error::InvalidArgument(format!(
                "key {:?} is not above the key before it (entries must come sorted, no repeats)",
                name()
            )));
        }
        if rec.shard as usize >= self.shard_count {
            return Err(Error::InvalidArgument(format!(
                "entry {:?}: shard {} out of range ({} shards)",
                name(),
                rec.shard,
                self.shard_count
            )));
        }
        if self.n == self.entries
            || key.len() > self.keys_len - self.kpos
            || aux.len() > self.aux_len - self.apos
        {
            return Err(Error::InvalidArgument(format!(
                "entry {:?}: more entries, key or aux bytes than the index was built for",
                name()
            )));
        }
        rec.key_rel = u32::try_from(self.kpos - self.block_key_lo)
            .map_err(|_| Error::InvalidArgument("keys of one block exceed 4 GiB".into()))?;
        rec.aux_rel = u32::try_from(self.apos - self.block_aux_lo).map_err(|_| {
            Error::InvalidArgument(format!("entry {:?}: chunk table too large", name()))
        })?;
        rec.key_len = key.len() as u16;
        let at = self.entries_off + self.n * ENTRY_REC;
        rec.encode(&mut self.out[at..at + ENTRY_REC]);
        let k = self.keys_off + self.kpos;
        self.out[k..k + key.len()].copy_from_slice(key);
        let a = self.aux_off + self.apos;
        self.out[a..a + aux.len()].copy_from_slice(aux);
        self.last_key = Some((self.kpos, key.len()));
        self.kpos += key.len();
        self.apos += aux.len();
        self.n += 1;
        if self.n.is_multiple_of(BLOCK_ENTRIES) {
            self.close_block();
        }
        Ok(())
    }

    /// Write the block record of the entries pushed since the last one (crc of the block's
    /// entry records, keys and aux bytes, in that order).
    fn close_block(&mut self) {
        let b = (self.n - 1) / BLOCK_ENTRIES;
        let lo = b * BLOCK_ENTRIES;
        let o = &self.out;
        let mut c =
            crc(&o[self.entries_off + lo * ENTRY_REC..self.entries_off + self.n * ENTRY_REC]);
        c = crc32c::crc32c_append(
            c,
            &o[self.keys_off + self.block_key_lo..self.keys_off + self.kpos],
        );
        c = crc32c::crc32c_append(
            c,
            &o[self.aux_off + self.block_aux_lo..self.aux_off + self.apos],
        );
        let at = self.blocks_off + b * BLOCK_REC;
        BlockRecord {
            key_lo: self.block_key_lo as u64,
            aux_lo: self.block_aux_lo as u64,
            crc: c,
            reserved: 0,
        }
        .encode(&mut self.out[at..at + BLOCK_REC]);
        self.block_key_lo = self.kpos;
        self.block_aux_lo = self.apos;
    }

    /// The index file: header, `shards` (as many as declared), the blocks, entries, keys and
    /// aux bytes pushed (all that was declared), `meta_json`, footer.
    pub fn finish(
        mut self,
        shards: &[ShardRec],
        chunk_bytes: u32,
        meta_json: &[u8],
    ) -> Result<Vec<u8>> {
        if shards.len() != self.shard_count
            || self.n != self.entries
            || self.kpos != self.keys_len
            || self.apos != self.aux_len
        {
            return Err(Error::InvalidArgument(format!(
                "index built for {} shards, {} entries, {} key and {} aux bytes got {}, {}, {} and {}",
                self.shard_count,
                self.entries,
                self.keys_len,
                self.aux_len,
                shards.len(),
                self.n,
                self.kpos,
                self.apos
            )));
        }
        if !self.n.is_multiple_of(BLOCK_ENTRIES) {
            self.close_block();
        }
        let shards_off = INDEX_HEADER_LEN;
        let (blocks_off, entries_off, keys_off, aux_off) = (
            self.blocks_off,
            self.entries_off,
            self.keys_off,
            self.aux_off,
        );
        let meta_off = self.out.len();
        let file_len = meta_off + meta_json.len() + INDEX_FOOTER_LEN;
        let mut out = self.out;
        for (i, s) in shards.iter().enumerate() {
            if shard_name_version(s.name.as_bytes()).is_none() || s.name.len() > SHARD_NAME_MAX {
                return Err(Error::InvalidArgument(format!(
                    "invalid shard name {:?}",
                    s.name
                )));
            }
            ShardRecord {
                file_len: s.file_len,
                save_token: s.save_token,
                header_crc: s.header_crc,
                name_len: s.name.len() as u32,
            }
            .encode(
                s.name.as_bytes(),
                &mut out[shards_off + i * SHARD_REC..][..SHARD_REC],
            );
        }
        // exactly: a doubled 21 MB buffer would be too large to keep for the next merge
        out.try_reserve_exact(file_len - meta_off)
            .map_err(|_| too_large())?;
        out.extend_from_slice(meta_json);
        out.resize(file_len, 0);
        let shards_crc = crc(&out[shards_off..blocks_off]);
        let blocks_crc = crc(&out[blocks_off..entries_off]);
        out[IndexHeader::MAGIC..IndexHeader::MAGIC + 8].copy_from_slice(INDEX_MAGIC);
        IndexHeader {
            version: super::build::index_version(shards),
            header_len: INDEX_HEADER_LEN as u32,
            file_len: file_len as u64,
            entry_count: self.n as u64,
            shard_count: shards.len() as u32,
            chunk_bytes,
            shards_off: shards_off as u64,
            blocks_off: blocks_off as u64,
            entries_off: entries_off as u64,
            keys_off: keys_off as u64,
            keys_len: self.keys_len as u64,
            aux_off: aux_off as u64,
            aux_len: self.aux_len as u64,
            meta_off: meta_off as u64,
            meta_len: meta_json.len() as u64,
            shards_crc,
            blocks_crc,
            meta_crc: crc(meta_json),
        }
        .encode(&mut out[..INDEX_HEADER_LEN]);
        let hc = crc(&out[..IndexHeader::CRC]);
        out[IndexHeader::CRC..IndexHeader::CRC + 4].copy_from_slice(&hc.to_le_bytes());
        let f = file_len - INDEX_FOOTER_LEN;
        out[f + Footer::MAGIC..f + Footer::MAGIC + 8].copy_from_slice(INDEX_FOOTER_MAGIC);
        out[f + Footer::HEADER_CRC..f + Footer::HEADER_CRC + 4].copy_from_slice(&hc.to_le_bytes());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> EntryRecord {
        EntryRecord {
            key_rel: 0,
            key_len: 0,
            dtype: DType::U8 as u8,
            codec: Codec::None as u8,
            kind: Kind::Tensor as u8,
            ndim: 1,
            reserved: 0,
            shard: 0,
            crc: 0,
            aux_rel: 0,
            offset: DATA_START,
            stored_len: 4,
        }
    }

    fn shard() -> ShardRec {
        ShardRec {
            file_len: 1 << 20,
            save_token: 1,
            header_crc: 2,
            name: ".data-00000-of-00001".into(),
        }
    }

    #[test]
    fn the_declared_shape_is_held_to() {
        // more entries, key bytes or aux bytes than declared: refused at the push
        let mut b = SortedIndexBuilder::with_shape(1, 1, 2, 0).unwrap();
        b.push(rec(), b"ab", &[]).unwrap();
        let e = b.push(rec(), b"ac", &[]).unwrap_err().to_string();
        assert!(e.contains("\"ac\"") && e.contains("more entries"), "{e}");
        let mut b = SortedIndexBuilder::with_shape(1, 2, 3, 0).unwrap();
        b.push(rec(), b"ab", &[]).unwrap();
        assert!(
            b.push(rec(), b"ac", &[]).is_err(),
            "4 key bytes, 3 declared"
        );
        let mut b = SortedIndexBuilder::with_shape(1, 1, 1, 0).unwrap();
        assert!(
            b.push(rec(), b"a", &[1]).is_err(),
            "aux bytes, none declared"
        );
        // a shard beyond the declared count
        let mut b = SortedIndexBuilder::with_shape(1, 1, 1, 0).unwrap();
        let e = b
            .push(EntryRecord { shard: 1, ..rec() }, b"a", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard 1 out of range"), "{e}");
        // fewer than declared, or another shard count: refused at finish
        let mut b = SortedIndexBuilder::with_shape(1, 2, 2, 0).unwrap();
        b.push(rec(), b"a", &[]).unwrap();
        assert!(b.finish(&[shard()], DEFAULT_CHUNK_BYTES, b"{}").is_err());
        let mut b = SortedIndexBuilder::with_shape(2, 1, 1, 0).unwrap();
        b.push(rec(), b"a", &[]).unwrap();
        assert!(b.finish(&[shard()], DEFAULT_CHUNK_BYTES, b"{}").is_err());
        // and exactly the declared shape builds an index a view opens and verifies
        let mut b = SortedIndexBuilder::with_shape(1, 2, 2, 0).unwrap();
        b.push(rec(), b"a", &[]).unwrap();
        b.push(rec(), b"b", &[]).unwrap();
        let bytes = b.finish(&[shard()], DEFAULT_CHUNK_BYTES, b"{}").unwrap();
        let v = super::super::IndexView::open(bytes, std::path::Path::new("built")).unwrap();
        v.verify_all().unwrap();
        assert_eq!(v.len(), 2);
    }
}
