//! Building an index file (FORMAT.md §3) from entry metadata: the records writers produce and
//! merges carry, and their serialization with block crcs.

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
        d + CHUNK_REC * self.chunks.len()
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
        if !valid_shard_name(s.name.as_bytes()) || s.name.len() > SHARD_NAME_MAX {
            return Err(Error::InvalidArgument(format!(
                "invalid shard name {:?}",
                s.name
            )));
        }
        let r = &mut out[shards_off as usize + i * SHARD_REC..][..SHARD_REC];
        r[0..8].copy_from_slice(&s.file_len.to_le_bytes());
        r[8..16].copy_from_slice(&s.save_token.to_le_bytes());
        r[16..20].copy_from_slice(&s.header_crc.to_le_bytes());
        r[20..24].copy_from_slice(&(s.name.len() as u32).to_le_bytes());
        r[24..24 + s.name.len()].copy_from_slice(s.name.as_bytes());
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
            let r = &mut out[entries_off as usize + i * ENTRY_REC..][..ENTRY_REC];
            r[0..4].copy_from_slice(&key_rel.to_le_bytes());
            r[4..6].copy_from_slice(&(e.key.len() as u16).to_le_bytes());
            r[6] = e.dtype as u8;
            r[7] = e.codec as u8;
            r[8] = e.kind as u8;
            r[9] = u8::try_from(e.dims.len())
                .ok()
                .filter(|&d| d as usize <= MAX_NDIM)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("entry {:?}: ndim > {MAX_NDIM}", e.key))
                })?;
            r[12..16].copy_from_slice(&e.shard.to_le_bytes());
            r[16..20].copy_from_slice(&e.crc.to_le_bytes());
            r[20..24].copy_from_slice(&aux_rel.to_le_bytes());
            r[24..32].copy_from_slice(&e.offset.to_le_bytes());
            r[32..40].copy_from_slice(&e.stored_len.to_le_bytes());
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
                out[a..a + 8].copy_from_slice(&c.rel_offset.to_le_bytes());
                out[a + 8..a + 12].copy_from_slice(&c.stored_len.to_le_bytes());
                out[a + 12..a + 16].copy_from_slice(&c.crc.to_le_bytes());
                a += CHUNK_REC;
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
        let r = &mut out[blocks_off as usize + b * BLOCK_REC..][..BLOCK_REC];
        r[0..8].copy_from_slice(&key_lo.to_le_bytes());
        r[8..16].copy_from_slice(&aux_lo.to_le_bytes());
        r[16..20].copy_from_slice(&c.to_le_bytes());
    }
    out[meta_off as usize..(meta_off + meta_len) as usize].copy_from_slice(meta_json);
    let shards_crc = crc(&out[shards_off as usize..blocks_off as usize]);
    let blocks_crc = crc(&out[blocks_off as usize..entries_off as usize]);
    let meta_crc = crc(meta_json);
    {
        let h = &mut out[..INDEX_HEADER_LEN];
        h[0..8].copy_from_slice(INDEX_MAGIC);
        h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(INDEX_HEADER_LEN as u32).to_le_bytes());
        h[16..24].copy_from_slice(&file_len.to_le_bytes());
        h[24..32].copy_from_slice(&(n as u64).to_le_bytes());
        h[32..36].copy_from_slice(&(shards.len() as u32).to_le_bytes());
        h[36..40].copy_from_slice(&chunk_bytes.to_le_bytes());
        for (at, v) in [
            (40, shards_off),
            (48, blocks_off),
            (56, entries_off),
            (64, keys_off),
            (72, keys_len),
            (80, aux_off),
            (88, aux_len),
            (96, meta_off),
            (104, meta_len),
        ] {
            h[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        h[112..116].copy_from_slice(&shards_crc.to_le_bytes());
        h[116..120].copy_from_slice(&blocks_crc.to_le_bytes());
        h[120..124].copy_from_slice(&meta_crc.to_le_bytes());
    }
    let hc = crc(&out[..INDEX_HEADER_CRC_AT]);
    out[INDEX_HEADER_CRC_AT..INDEX_HEADER_LEN].copy_from_slice(&hc.to_le_bytes());
    let f = file_len as usize - INDEX_FOOTER_LEN;
    out[f..f + 8].copy_from_slice(INDEX_FOOTER_MAGIC);
    out[f + 8..f + 12].copy_from_slice(&hc.to_le_bytes());
    Ok(out)
}
