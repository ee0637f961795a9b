//! Byte layouts of the index's fixed-size records (FORMAT.md §3), each with named offsets and
//! its encode and decode side by side, so the writer ([`super::build`]) and the reader
//! ([`super::view`]) cannot disagree about where a field lives.
//!
//! Decoding here is only "which bytes are which field": every value read from disk is still
//! hostile, and the view checks ranges, tags and reserved bytes before using any of it.

use crate::format::{le_u16, le_u32, le_u64, BLOCK_REC, CHUNK_REC, ENTRY_REC, SHARD_REC};

fn put_u16(r: &mut [u8], at: usize, v: u16) {
    r[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(r: &mut [u8], at: usize, v: u32) {
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(r: &mut [u8], at: usize, v: u64) {
    r[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The index header (§3): 128 bytes, the crc of bytes `[0, 124)` at [`IndexHeader::CRC`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexHeader {
    pub version: u32,
    pub header_len: u32,
    pub file_len: u64,
    pub entry_count: u64,
    pub shard_count: u32,
    pub chunk_bytes: u32,
    pub shards_off: u64,
    pub blocks_off: u64,
    pub entries_off: u64,
    pub keys_off: u64,
    pub keys_len: u64,
    pub aux_off: u64,
    pub aux_len: u64,
    pub meta_off: u64,
    pub meta_len: u64,
    pub shards_crc: u32,
    pub blocks_crc: u32,
    pub meta_crc: u32,
}

impl IndexHeader {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HEADER_LEN: usize = 12;
    pub const FILE_LEN: usize = 16;
    pub const ENTRY_COUNT: usize = 24;
    pub const SHARD_COUNT: usize = 32;
    pub const CHUNK_BYTES: usize = 36;
    pub const SHARDS_OFF: usize = 40;
    pub const BLOCKS_OFF: usize = 48;
    pub const ENTRIES_OFF: usize = 56;
    pub const KEYS_OFF: usize = 64;
    pub const KEYS_LEN: usize = 72;
    pub const AUX_OFF: usize = 80;
    pub const AUX_LEN: usize = 88;
    pub const META_OFF: usize = 96;
    pub const META_LEN: usize = 104;
    pub const SHARDS_CRC: usize = 112;
    pub const BLOCKS_CRC: usize = 116;
    pub const META_CRC: usize = 120;
    pub const CRC: usize = 124;

    /// Write every field but the magic and the header crc into `h` (at least 124 bytes).
    pub fn encode(&self, h: &mut [u8]) {
        put_u32(h, Self::VERSION, self.version);
        put_u32(h, Self::HEADER_LEN, self.header_len);
        put_u64(h, Self::FILE_LEN, self.file_len);
        put_u64(h, Self::ENTRY_COUNT, self.entry_count);
        put_u32(h, Self::SHARD_COUNT, self.shard_count);
        put_u32(h, Self::CHUNK_BYTES, self.chunk_bytes);
        put_u64(h, Self::SHARDS_OFF, self.shards_off);
        put_u64(h, Self::BLOCKS_OFF, self.blocks_off);
        put_u64(h, Self::ENTRIES_OFF, self.entries_off);
        put_u64(h, Self::KEYS_OFF, self.keys_off);
        put_u64(h, Self::KEYS_LEN, self.keys_len);
        put_u64(h, Self::AUX_OFF, self.aux_off);
        put_u64(h, Self::AUX_LEN, self.aux_len);
        put_u64(h, Self::META_OFF, self.meta_off);
        put_u64(h, Self::META_LEN, self.meta_len);
        put_u32(h, Self::SHARDS_CRC, self.shards_crc);
        put_u32(h, Self::BLOCKS_CRC, self.blocks_crc);
        put_u32(h, Self::META_CRC, self.meta_crc);
    }

    /// The fields of `h` (at least 124 bytes), unchecked.
    pub fn decode(h: &[u8]) -> Self {
        IndexHeader {
            version: le_u32(h, Self::VERSION),
            header_len: le_u32(h, Self::HEADER_LEN),
            file_len: le_u64(h, Self::FILE_LEN),
            entry_count: le_u64(h, Self::ENTRY_COUNT),
            shard_count: le_u32(h, Self::SHARD_COUNT),
            chunk_bytes: le_u32(h, Self::CHUNK_BYTES),
            shards_off: le_u64(h, Self::SHARDS_OFF),
            blocks_off: le_u64(h, Self::BLOCKS_OFF),
            entries_off: le_u64(h, Self::ENTRIES_OFF),
            keys_off: le_u64(h, Self::KEYS_OFF),
            keys_len: le_u64(h, Self::KEYS_LEN),
            aux_off: le_u64(h, Self::AUX_OFF),
            aux_len: le_u64(h, Self::AUX_LEN),
            meta_off: le_u64(h, Self::META_OFF),
            meta_len: le_u64(h, Self::META_LEN),
            shards_crc: le_u32(h, Self::SHARDS_CRC),
            blocks_crc: le_u32(h, Self::BLOCKS_CRC),
            meta_crc: le_u32(h, Self::META_CRC),
        }
    }
}

/// The index footer (§3): magic, a copy of the header crc, 4 zero bytes.
pub(crate) struct Footer;

impl Footer {
    pub const MAGIC: usize = 0;
    pub const HEADER_CRC: usize = 8;
    pub const RESERVED: usize = 12;
}

/// A shard record (§3.1): 64 bytes, the name suffix zero-padded after [`ShardRecord::NAME`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShardRecord {
    pub file_len: u64,
    pub save_token: u64,
    pub header_crc: u32,
    pub name_len: u32,
}

impl ShardRecord {
    pub const FILE_LEN: usize = 0;
    pub const SAVE_TOKEN: usize = 8;
    pub const HEADER_CRC: usize = 16;
    pub const NAME_LEN: usize = 20;
    pub const NAME: usize = 24;

    /// Write the record with `name` into `r` (`SHARD_REC` zeroed bytes; the caller has
    /// checked that the name fits).
    pub fn encode(&self, name: &[u8], r: &mut [u8]) {
        debug_assert!(r.len() == SHARD_REC && Self::NAME + name.len() <= SHARD_REC);
        put_u64(r, Self::FILE_LEN, self.file_len);
        put_u64(r, Self::SAVE_TOKEN, self.save_token);
        put_u32(r, Self::HEADER_CRC, self.header_crc);
        put_u32(r, Self::NAME_LEN, self.name_len);
        r[Self::NAME..Self::NAME + name.len()].copy_from_slice(name);
    }

    /// The fixed fields of `r` (`SHARD_REC` bytes), unchecked; the name is
    /// `r[NAME..NAME + name_len]` once `name_len` is checked.
    pub fn decode(r: &[u8]) -> Self {
        ShardRecord {
            file_len: le_u64(r, Self::FILE_LEN),
            save_token: le_u64(r, Self::SAVE_TOKEN),
            header_crc: le_u32(r, Self::HEADER_CRC),
            name_len: le_u32(r, Self::NAME_LEN),
        }
    }
}

/// A block record (§3.2): where block `b`'s keys and aux data start in their blobs, and the
/// crc of its entries, keys and aux data; 4 reserved zero bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockRecord {
    pub key_lo: u64,
    pub aux_lo: u64,
    pub crc: u32,
    pub reserved: u32,
}

impl BlockRecord {
    pub const KEY_LO: usize = 0;
    pub const AUX_LO: usize = 8;
    pub const CRC: usize = 16;
    pub const RESERVED: usize = 20;

    pub fn encode(&self, r: &mut [u8]) {
        debug_assert_eq!(r.len(), BLOCK_REC);
        put_u64(r, Self::KEY_LO, self.key_lo);
        put_u64(r, Self::AUX_LO, self.aux_lo);
        put_u32(r, Self::CRC, self.crc);
        put_u32(r, Self::RESERVED, self.reserved);
    }

    pub fn decode(r: &[u8]) -> Self {
        BlockRecord {
            key_lo: le_u64(r, Self::KEY_LO),
            aux_lo: le_u64(r, Self::AUX_LO),
            crc: le_u32(r, Self::CRC),
            reserved: le_u32(r, Self::RESERVED),
        }
    }
}

/// An entry record (§3.3): 40 bytes. Tags are the on-disk enum tags (checked by the view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntryRecord {
    /// Key offset relative to the block's first key.
    pub key_rel: u32,
    pub key_len: u16,
    pub dtype: u8,
    pub codec: u8,
    pub kind: u8,
    pub ndim: u8,
    /// Two reserved bytes, zero.
    pub reserved: u16,
    pub shard: u32,
    pub crc: u32,
    /// Aux offset (dims, chunk table) relative to the block's first aux byte.
    pub aux_rel: u32,
    pub offset: u64,
    pub stored_len: u64,
}

impl EntryRecord {
    pub const KEY_REL: usize = 0;
    pub const KEY_LEN: usize = 4;
    pub const DTYPE: usize = 6;
    pub const CODEC: usize = 7;
    pub const KIND: usize = 8;
    pub const NDIM: usize = 9;
    pub const RESERVED: usize = 10;
    pub const SHARD: usize = 12;
    pub const CRC: usize = 16;
    pub const AUX_REL: usize = 20;
    pub const OFFSET: usize = 24;
    pub const STORED_LEN: usize = 32;

    pub fn encode(&self, r: &mut [u8]) {
        debug_assert_eq!(r.len(), ENTRY_REC);
        put_u32(r, Self::KEY_REL, self.key_rel);
        put_u16(r, Self::KEY_LEN, self.key_len);
        r[Self::DTYPE] = self.dtype;
        r[Self::CODEC] = self.codec;
        r[Self::KIND] = self.kind;
        r[Self::NDIM] = self.ndim;
        put_u16(r, Self::RESERVED, self.reserved);
        put_u32(r, Self::SHARD, self.shard);
        put_u32(r, Self::CRC, self.crc);
        put_u32(r, Self::AUX_REL, self.aux_rel);
        put_u64(r, Self::OFFSET, self.offset);
        put_u64(r, Self::STORED_LEN, self.stored_len);
    }

    pub fn decode(r: &[u8]) -> Self {
        EntryRecord {
            key_rel: le_u32(r, Self::KEY_REL),
            key_len: le_u16(r, Self::KEY_LEN),
            dtype: r[Self::DTYPE],
            codec: r[Self::CODEC],
            kind: r[Self::KIND],
            ndim: r[Self::NDIM],
            reserved: le_u16(r, Self::RESERVED),
            shard: le_u32(r, Self::SHARD),
            crc: le_u32(r, Self::CRC),
            aux_rel: le_u32(r, Self::AUX_REL),
            offset: le_u64(r, Self::OFFSET),
            stored_len: le_u64(r, Self::STORED_LEN),
        }
    }
}

/// A chunk record (§3.3), in an entry's aux data: where one compressed chunk lies relative to
/// the entry's offset, its stored length and the crc of its stored bytes.
pub(crate) struct ChunkRecord;

impl ChunkRecord {
    pub const REL_OFFSET: usize = 0;
    pub const STORED_LEN: usize = 8;
    pub const CRC: usize = 12;

    pub fn encode(rel_offset: u64, stored_len: u32, crc: u32, r: &mut [u8]) {
        debug_assert_eq!(r.len(), CHUNK_REC);
        put_u64(r, Self::REL_OFFSET, rel_offset);
        put_u32(r, Self::STORED_LEN, stored_len);
        put_u32(r, Self::CRC, crc);
    }

    /// (rel_offset, stored_len, crc) of `r`.
    pub fn decode(r: &[u8]) -> (u64, u32, u32) {
        (
            le_u64(r, Self::REL_OFFSET),
            le_u32(r, Self::STORED_LEN),
            le_u32(r, Self::CRC),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_fill_their_size() {
        let e = EntryRecord {
            key_rel: 1,
            key_len: 2,
            dtype: 3,
            codec: 4,
            kind: 5,
            ndim: 6,
            reserved: 0,
            shard: 7,
            crc: 8,
            aux_rel: 9,
            offset: 10,
            stored_len: 11,
        };
        let mut r = [0u8; ENTRY_REC];
        e.encode(&mut r);
        assert_eq!(EntryRecord::decode(&r), e);
        assert_eq!(EntryRecord::STORED_LEN + 8, ENTRY_REC);
        let b = BlockRecord {
            key_lo: 1,
            aux_lo: 2,
            crc: 3,
            reserved: 0,
        };
        let mut r = [0u8; BLOCK_REC];
        b.encode(&mut r);
        assert_eq!(BlockRecord::decode(&r), b);
        assert_eq!(BlockRecord::RESERVED + 4, BLOCK_REC);
        let mut r = [0u8; CHUNK_REC];
        ChunkRecord::encode(1, 2, 3, &mut r);
        assert_eq!(ChunkRecord::decode(&r), (1, 2, 3));
        assert_eq!(ChunkRecord::CRC + 4, CHUNK_REC);
        let h = IndexHeader {
            version: 1,
            file_len: 2,
            meta_crc: 3,
            ..IndexHeader::default()
        };
        let mut r = [0u8; crate::format::INDEX_HEADER_LEN];
        h.encode(&mut r);
        assert_eq!(IndexHeader::decode(&r), h);
        assert_eq!(IndexHeader::CRC, crate::format::INDEX_HEADER_CRC_AT);
    }
}
