//! Building an index file (FORMAT.md §3) from entry metadata: the records writers produce and
//! merges carry, and their serialization with block crcs.

use super::layout::{BlockRecord, ChunkRecord, EntryRecord, Footer, IndexHeader, ShardRecord};
use crate::error::{Error, Result};
use crate::format::*;

/// One chunk of a compressed entry (§3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRec {
    pub rel_offset: u64,
    pub stored_len: u32,
    pub crc: u32,
}

/// Everything the index records about one entry; what writers produce and merges carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    pub key: String,
    pub dtype: DType,
    pub codec: Codec,
    pub kind: Kind,
    pub dims: Vec<u64>,
    pub shard: u32,
    /// crc32c of the raw bytes.
    pub crc: u32,
    pub offset: u64,
    pub stored_len: u64,
    pub chunks: Vec<ChunkRec>,
    /// Uncompressed values only: blocks of `1 << block_log2` bytes, each with its crc32c in
    /// `block_crcs` (§3.4), so a checked range reads only its blocks; 0 and empty: none.
    pub block_log2: u8,
    pub block_crcs: Vec<u32>,
}

/// One shard as recorded in the index (§3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRec {
    pub file_len: u64,
    pub save_token: u64,
    pub header_crc: u32,
    pub name: String,
}

impl EntryMeta {
    fn dims_inline(&self) -> bool {
        self.codec == Codec::None && self.dims.len() == 1
    }
    fn aux_len(&self) -> usize {
        let d = if self.dims_inline() {
            0
        } else {
            8 * self.dims.len()
        };
        d + CHUNK_REC * self.chunks.len() + BLOCK_CRC_REC * self.block_crcs.len()
    }
}

/// Check that a key is storable: 1..=65535 bytes of UTF-8 without NUL.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidArgument(format!(
            "key {key:?}: length {} is outside 1..={MAX_KEY_LEN} bytes",
            key.len()
        )));
    }
    if key.as_bytes().contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "key {key:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// A block crc table only on an uncompressed value, of a block size readers accept, with one
/// crc per block (§3.4): what a reader would refuse is never written.
fn check_block_table(e: &EntryMeta) -> Result<()> {
    if e.block_log2 == 0 && e.block_crcs.is_empty() {
        return Ok(());
    }
    let ok = e.codec == Codec::None
        && (MIN_CRC_BLOCK_LOG2..=MAX_CRC_BLOCK_LOG2).contains(&e.block_log2)
        && e.stored_len > 0
        && crc_block_count(e.stored_len, e.block_log2) == e.block_crcs.len() as u64;
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "entry {:?}: block crc table of {} crcs (log2 {}) does not fit a {}-byte {} value",
            e.key,
            e.block_crcs.len(),
            e.block_log2,
            e.stored_len,
            e.codec.name()
        )));
    }
    Ok(())
}

/// Serialize an index. `entries` is sorted here; duplicates are an error naming the key.
pub fn build_index(
    shards: &[ShardRec],
    mut entries: Vec<EntryMeta>,
    chunk_bytes: u32,
    meta_json: &[u8],
) -> Result<Vec<u8>> {
    entries.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    for w in entries.windows(2) {
        if w[0].key == w[1].key {
            return Err(Error::DuplicateKey {
                key: w[0].key.clone(),
                context: "written twice in one checkpoint".into(),
            });
        }
    }
    let n = entries.len();
    let nblocks = n.div_ceil(BLOCK_ENTRIES);
    let shards_off = INDEX_HEADER_LEN as u64;
    let blocks_off = shards_off + (shards.len() * SHARD_REC) as u64;
    let entries_off = blocks_off + (nblocks * BLOCK_REC) as u64;
    let keys_off = entries_off + (n * ENTRY_REC) as u64;
    let keys_len: u64 = entries.iter().map(|e| e.key.len() as u64).sum();
    let aux_off = keys_off + keys_len;
    let aux_len: u64 = entries.iter().map(|e| e.aux_len() as u64).sum();
    let meta_off = aux_off + aux_len;
    let meta_len = meta_json.len() as u64;
    let file_len = meta_off + meta_len + INDEX_FOOTER_LEN as u64;

    let mut out = vec![0u8; file_len as usize];
    // Shard table.
    for (i, s) in shards.iter().enumerate() {
        if shard_name_version(s.name.as_bytes()).is_none() || s.name.len() > SHARD_NAME_MAX {
            return Err(Error::InvalidArgument(format!(
                "invalid shard name {:?}",
                s.name
            )));
        }
        let r = &mut out[shards_off as usize + i * SHARD_REC..][..SHARD_REC];
        ShardRecord {
            file_len: s.file_len,
            save_token: s.save_token,
            header_crc: s.header_crc,
            name_len: s.name.len() as u32,
        }
        .encode(s.name.as_bytes(), r);
    }
    // Entries, keys, aux; blocks.
    let (mut kpos, mut apos) = (0u64, 0u64);
    for b in 0..nblocks {
        let (key_lo, aux_lo) = (kpos, apos);
        let lo = b * BLOCK_ENTRIES;
        let hi = (lo + BLOCK_ENTRIES).min(n);
        for (i, e) in entries[lo..hi].iter().enumerate().map(|(j, e)| (lo + j, e)) {
            check_key(&e.key)?;
            if e.shard as usize >= shards.len() {
                return Err(Error::InvalidArgument(format!(
                    "entry {:?}: shard out of range",
                    e.key
                )));
            }
            let key_rel = u32::try_from(kpos - key_lo)
                .map_err(|_| Error::InvalidArgument("keys of one block exceed 4 GiB".into()))?;
            let aux_rel = u32::try_from(apos - aux_lo).map_err(|_| {
                Error::InvalidArgument(format!("entry {:?}: chunk table too large", e.key))
            })?;
            let ndim = u8::try_from(e.dims.len())
                .ok()
                .filter(|&d| d as usize <= MAX_NDIM)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("entry {:?}: ndim > {MAX_NDIM}", e.key))
                })?;
            check_block_table(e)?;
            EntryRecord {
                key_rel,
                key_len: e.key.len() as u16,
                dtype: e.dtype as u8,
                codec: e.codec as u8,
                kind: e.kind as u8,
                ndim,
                reserved: e.block_log2 as u16,
                shard: e.shard,
                crc: e.crc,
                aux_rel,
                offset: e.offset,
                stored_len: e.stored_len,
            }
            .encode(&mut out[entries_off as usize + i * ENTRY_REC..][..ENTRY_REC]);
            let k = (keys_off + kpos) as usize;
            out[k..k + e.key.len()].copy_from_slice(e.key.as_bytes());
            kpos += e.key.len() as u64;
            let mut a = (aux_off + apos) as usize;
            if !e.dims_inline() {
                for d in &e.dims {
                    out[a..a + 8].copy_from_slice(&d.to_le_bytes());
                    a += 8;
                }
            }
            for c in &e.chunks {
                ChunkRecord::encode(
                    c.rel_offset,
                    c.stored_len,
                    c.crc,
                    &mut out[a..a + CHUNK_REC],
                );
                a += CHUNK_REC;
            }
            for c in &e.block_crcs {
                out[a..a + BLOCK_CRC_REC].copy_from_slice(&c.to_le_bytes());
                a += BLOCK_CRC_REC;
            }
            apos += e.aux_len() as u64;
        }
        let ent =
            &out[entries_off as usize + lo * ENTRY_REC..entries_off as usize + hi * ENTRY_REC];
        let mut c = crc(ent);
        c = crc32c::crc32c_append(
            c,
            &out[(keys_off + key_lo) as usize..(keys_off + kpos) as usize],
        );
        c = crc32c::crc32c_append(
            c,
            &out[(aux_off + aux_lo) as usize..(aux_off + apos) as usize],
        );
        BlockRecord {
            key_lo,
            aux_lo,
            crc: c,
            reserved: 0,
        }
        .encode(&mut out[blocks_off as usize + b * BLOCK_REC..][..BLOCK_REC]);
    }
    out[meta_off as usize..(meta_off + meta_len) as usize].copy_from_slice(meta_json);
    let shards_crc = crc(&out[shards_off as usize..blocks_off as usize]);
    let blocks_crc = crc(&out[blocks_off as usize..entries_off as usize]);
    let meta_crc = crc(meta_json);
    out[IndexHeader::MAGIC..IndexHeader::MAGIC + 8].copy_from_slice(INDEX_MAGIC);
    IndexHeader {
        version: index_version(shards),
        header_len: INDEX_HEADER_LEN as u32,
        file_len,
        entry_count: n as u64,
        shard_count: shards.len() as u32,
        chunk_bytes,
        shards_off,
        blocks_off,
        entries_off,
        keys_off,
        keys_len,
        aux_off,
        aux_len,
        meta_off,
        meta_len,
        shards_crc,
        blocks_crc,
        meta_crc,
    }
    .encode(&mut out[..INDEX_HEADER_LEN]);
    let hc = crc(&out[..IndexHeader::CRC]);
    out[IndexHeader::CRC..IndexHeader::CRC + 4].copy_from_slice(&hc.to_le_bytes());
    let f = file_len as usize - INDEX_FOOTER_LEN;
    out[f + Footer::MAGIC..f + Footer::MAGIC + 8].copy_from_slice(INDEX_FOOTER_MAGIC);
    out[f + Footer::HEADER_CRC..f + Footer::HEADER_CRC + 4].copy_from_slice(&hc.to_le_bytes());
    Ok(out)
}

/// The index `format_version` these shard names need: 2 when any is in the hashed form
/// (FORMAT.md §3.1.1), else 1, so a save without hashed names is byte-for-byte a v1 index.
pub fn index_version(shards: &[ShardRec]) -> u32 {
    shards
        .iter()
        .filter_map(|s| shard_name_version(s.name.as_bytes()))
        .max()
        .unwrap_or(FORMAT_VERSION)
}
