//! Writing an index (FORMAT.md §3) whose entries arrive already in key order, record by record:
//! what the multi-writer merge does with the sorted partial indexes. Each record, key and aux
//! bytes are appended straight to their section's buffer and each block's crc is computed as
//! it fills, so nothing is held per entry (no `EntryMeta`, no key `String`, no sort).

use super::build::ShardRec;
use super::layout::{BlockRecord, EntryRecord, Footer, IndexHeader, ShardRecord};
use crate::error::{Error, Result};
use crate::format::*;

/// An index being written in key order; [`SortedIndexBuilder::finish`] returns its bytes.
pub(crate) struct SortedIndexBuilder {
    entries: Vec<u8>,
    keys: Vec<u8>,
    aux: Vec<u8>,
    blocks: Vec<u8>,
    n: usize,
    /// Where the open block's keys and aux bytes start in their blobs.
    block_key_lo: usize,
    block_aux_lo: usize,
    /// `keys[last_key..]` is the last key pushed (for the order check).
    last_key: Option<usize>,
}

impl SortedIndexBuilder {
    /// A builder with room for `entries` entries, `keys_len` key bytes and `aux_len` aux bytes
    /// (hints only: the buffers grow if the hints are short).
    pub fn with_capacity(entries: usize, keys_len: usize, aux_len: usize) -> Self {
        SortedIndexBuilder {
            entries: Vec::with_capacity(entries.saturating_mul(ENTRY_REC)),
            keys: Vec::with_capacity(keys_len),
            aux: Vec::with_capacity(aux_len),
            blocks: Vec::with_capacity(entries.div_ceil(BLOCK_ENTRIES) * BLOCK_REC),
            n: 0,
            block_key_lo: 0,
            block_aux_lo: 0,
            last_key: None,
        }
    }

    /// The last key pushed.
    fn last_key(&self) -> Option<&[u8]> {
        self.last_key.map(|k| &self.keys[k..])
    }

    /// Append one entry: `rec` as the index will store it except for `key_rel`, `key_len` and
    /// `aux_rel` (set here), its `key` and its `aux` bytes (dims unless inline, chunk table).
    /// The caller has validated the record (a view's `entry_raw` does); keys must come in
    /// strictly increasing order, which is checked: an out-of-order or repeated key is an
    /// error naming it.
    pub fn push(&mut self, mut rec: EntryRecord, key: &[u8], aux: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: length {} is outside 1..={MAX_KEY_LEN} bytes",
                String::from_utf8_lossy(key),
                key.len()
            )));
        }
        if self.last_key().is_some_and(|last| last >= key) {
            return Err(Error::InvalidArgument(format!(
                "key {:?} is not above the key before it (entries must come sorted, no repeats)",
                String::from_utf8_lossy(key)
            )));
        }
        rec.key_rel = u32::try_from(self.keys.len() - self.block_key_lo)
            .map_err(|_| Error::InvalidArgument("keys of one block exceed 4 GiB".into()))?;
        rec.aux_rel = u32::try_from(self.aux.len() - self.block_aux_lo).map_err(|_| {
            Error::InvalidArgument(format!(
                "entry {:?}: chunk table too large",
                String::from_utf8_lossy(key)
            ))
        })?;
        rec.key_len = key.len() as u16;
        let at = self.entries.len();
        self.entries.resize(at + ENTRY_REC, 0);
        rec.encode(&mut self.entries[at..]);
        self.last_key = Some(self.keys.len());
        self.keys.extend_from_slice(key);
        self.aux.extend_from_slice(aux);
        self.n += 1;
        if self.n.is_multiple_of(BLOCK_ENTRIES) {
            self.close_block();
        }
        Ok(())
    }

    /// Write the block record of the entries pushed since the last one (crc of the block's
    /// entry records, keys and aux bytes, in that order).
    fn close_block(&mut self) {
        let lo = (self.blocks.len() / BLOCK_REC) * BLOCK_ENTRIES;
        let mut c = crc(&self.entries[lo * ENTRY_REC..]);
        c = crc32c::crc32c_append(c, &self.keys[self.block_key_lo..]);
        c = crc32c::crc32c_append(c, &self.aux[self.block_aux_lo..]);
        let at = self.blocks.len();
        self.blocks.resize(at + BLOCK_REC, 0);
        BlockRecord {
            key_lo: self.block_key_lo as u64,
            aux_lo: self.block_aux_lo as u64,
            crc: c,
            reserved: 0,
        }
        .encode(&mut self.blocks[at..]);
        self.block_key_lo = self.keys.len();
        self.block_aux_lo = self.aux.len();
    }

    /// The index file: header, `shards`, the blocks, entries, keys and aux bytes pushed,
    /// `meta_json`, footer. Every entry's shard must be below `shards.len()`.
    pub fn finish(
        mut self,
        shards: &[ShardRec],
        chunk_bytes: u32,
        meta_json: &[u8],
    ) -> Result<Vec<u8>> {
        if !self.n.is_multiple_of(BLOCK_ENTRIES) {
            self.close_block();
        }
        for (i, r) in self.entries.chunks_exact(ENTRY_REC).enumerate() {
            if EntryRecord::decode(r).shard as usize >= shards.len() {
                return Err(Error::InvalidArgument(format!(
                    "entry {i}: shard out of range ({} shards)",
                    shards.len()
                )));
            }
        }
        let shards_off = INDEX_HEADER_LEN;
        let blocks_off = shards_off + shards.len() * SHARD_REC;
        let entries_off = blocks_off + self.blocks.len();
        let keys_off = entries_off + self.entries.len();
        let aux_off = keys_off + self.keys.len();
        let meta_off = aux_off + self.aux.len();
        let file_len = meta_off + meta_json.len() + INDEX_FOOTER_LEN;
        let mut out = Vec::with_capacity(file_len);
        out.resize(blocks_off, 0);
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
        out.extend_from_slice(&self.blocks);
        out.extend_from_slice(&self.entries);
        out.extend_from_slice(&self.keys);
        out.extend_from_slice(&self.aux);
        out.extend_from_slice(meta_json);
        out.resize(file_len, 0);
        let shards_crc = crc(&out[shards_off..blocks_off]);
        let blocks_crc = crc(&self.blocks);
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
            keys_len: self.keys.len() as u64,
            aux_off: aux_off as u64,
            aux_len: self.aux.len() as u64,
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
