//! Format v1 constants, tags and fixed-size records, named after docs/FORMAT.md.
//!
//! Everything here is pure: encoding to and decoding from byte slices. Decoders take hostile
//! bytes and return `Err` (never panic) on anything out of bounds.

use crate::error::{Error, Result};
use std::path::Path;

/// Format version written and read by this library.
pub const FORMAT_VERSION: u32 = 1;
/// The index `format_version` of an index that names a shard in the hashed form (§3.1.1):
/// a reader that only knows version 1 refuses it by its version instead of misreading it.
/// Shard files stay version 1; an index without hashed names stays version 1.
pub const INDEX_VERSION_HASHED: u32 = 2;

/// Shard file magic (§2).
pub const SHARD_MAGIC: &[u8; 8] = b"SPSHARD\0";
/// Shard header length (§2).
pub const SHARD_HEADER_LEN: usize = 64;
/// Offset of the shard header's crc (§2).
pub const SHARD_HEADER_CRC_AT: usize = 60;
/// First payload offset in a shard (§2).
pub const DATA_START: u64 = 4096;
/// Every payload starts at a multiple of this (§2).
pub const ALIGN: u64 = 64;
/// Payloads at least this large start at a page boundary (§2).
pub const PAGE_ALIGN_MIN: u64 = 65536;
/// Page size used for alignment (§2).
pub const PAGE: u64 = 4096;

/// Index file magic (§3).
pub const INDEX_MAGIC: &[u8; 8] = b"SPINDEX\0";
/// Index footer magic (§3).
pub const INDEX_FOOTER_MAGIC: &[u8; 8] = b"SPINDEND";
/// Index header length (§3).
pub const INDEX_HEADER_LEN: usize = 128;
/// Offset of the index header's crc (§3).
pub const INDEX_HEADER_CRC_AT: usize = 124;
/// Index footer length (§3).
pub const INDEX_FOOTER_LEN: usize = 16;
/// Shard record size (§3.1).
pub const SHARD_REC: usize = 64;
/// Longest shard name suffix (§3.1).
pub const SHARD_NAME_MAX: usize = 40;
/// Block record size (§3.2).
pub const BLOCK_REC: usize = 24;
/// Entries per block (§3.2).
pub const BLOCK_ENTRIES: usize = 64;
/// Entry record size (§3.3).
pub const ENTRY_REC: usize = 40;
/// Chunk record size (§3.3).
pub const CHUNK_REC: usize = 16;
/// Size of one crc of an uncompressed value's block crc table (§3.4).
pub const BLOCK_CRC_REC: usize = 4;
/// Accepted `crc_block_log2` of an entry record (§3.4): blocks of 4 KiB ..= 16 MiB.
pub const MIN_CRC_BLOCK_LOG2: u8 = 12;
/// Accepted `crc_block_log2` of an entry record (§3.4).
pub const MAX_CRC_BLOCK_LOG2: u8 = 24;
/// The block size writers use (§3.4): 16 KiB, so a checked row slice reads at most 32 KiB
/// more than its rows (one partial block at each end) while the table costs the index
/// 4 bytes per 16 KiB of uncompressed data (0.024%).
pub const CRC_BLOCK_LOG2: u8 = 14;
/// Largest ndim (§3.3).
pub const MAX_NDIM: usize = 64;
/// Longest key in bytes (§3.3).
pub const MAX_KEY_LEN: usize = u16::MAX as usize;
/// Default raw bytes per chunk.
pub const DEFAULT_CHUNK_BYTES: u32 = 1 << 20;
/// Accepted chunk_bytes range (§3).
pub const MIN_CHUNK_BYTES: u32 = 4096;
/// Accepted chunk_bytes range (§3).
pub const MAX_CHUNK_BYTES: u32 = 64 << 20;
/// Tensors smaller than this are never compressed: the gain is nil and zero-copy is kept.
pub const MIN_COMPRESS_BYTES: u64 = 4096;
/// A chunk is stored compressed only when it shrinks below this fraction (§5), as a ratio n/d.
pub const MAX_KEPT_RATIO: (u64, u64) = (95, 100);

/// The checksum every record and payload carries (crc32c); defined in [`crate::checksum`],
/// named here too because the format's records are what it checks.
pub use crate::checksum::{combine_crcs, crc};

/// Element types (§4). The tag values are the on-disk encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    Bool = 1,
    I8 = 2,
    I16 = 3,
    I32 = 4,
    I64 = 5,
    U8 = 6,
    U16 = 7,
    U32 = 8,
    U64 = 9,
    F16 = 10,
    BF16 = 11,
    F32 = 12,
    F64 = 13,
    C64 = 14,
    C128 = 15,
    F8E4M3FN = 16,
    F8E5M2 = 17,
    F8E4M3FNUZ = 18,
    F8E5M2FNUZ = 19,
    F8E8M0FNU = 20,
    /// Two packed 4-bit floats per byte (torch's `float4_e2m1fn_x2`): the element is the byte.
    F4E2M1FNX2 = 21,
}

/// Every dtype, in tag order.
pub const ALL_DTYPES: [DType; 21] = [
    DType::Bool,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C64,
    DType::C128,
    DType::F8E4M3FN,
    DType::F8E5M2,
    DType::F8E4M3FNUZ,
    DType::F8E5M2FNUZ,
    DType::F8E8M0FNU,
    DType::F4E2M1FNX2,
];

impl DType {
    /// Decode an on-disk tag.
    pub fn from_tag(tag: u8) -> Option<DType> {
        ALL_DTYPES.iter().copied().find(|d| *d as u8 == tag)
    }

    /// The canonical name (numpy / ml_dtypes spelling).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::F8E8M0FNU => "float8_e8m0fnu",
            DType::F4E2M1FNX2 => "float4_e2m1fn_x2",
        }
    }

    /// Parse a canonical name.
    pub fn from_name(name: &str) -> Result<DType> {
        ALL_DTYPES
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::UnsupportedDtype(format!("{name:?}")))
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool
            | DType::I8
            | DType::U8
            | DType::F8E4M3FN
            | DType::F8E5M2
            | DType::F8E4M3FNUZ
            | DType::F8E5M2FNUZ
            | DType::F8E8M0FNU
            | DType::F4E2M1FNX2 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// Width of the unit the byte-grouping filter works on (§5): the element, or for complex
    /// types one component.
    pub fn group_width(self) -> usize {
        match self {
            DType::C64 => 4,
            DType::C128 => 8,
            d => d.itemsize(),
        }
    }

    /// Whether the byte-grouping filter rotates the sign bit out of the top byte (§5).
    pub fn rotates_sign(self) -> bool {
        matches!(
            self,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::C64 | DType::C128
        )
    }
}

/// Payload codecs (§5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Codec {
    None = 0,
    Zstd = 1,
    ZstdByteGroup = 2,
    /// Byte-grouped planes, each raw, constant or order-0 Huffman coded (§5.1).
    HuffByteGroup = 3,
}

impl Codec {
    /// Decode an on-disk tag.
    pub fn from_tag(tag: u8) -> Option<Codec> {
        match tag {
            0 => Some(Codec::None),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ZstdByteGroup),
            3 => Some(Codec::HuffByteGroup),
            _ => None,
        }
    }

    /// Name used in the Python API and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
            Codec::ZstdByteGroup => "zstd-bytegroup",
            Codec::HuffByteGroup => "bytegroup-huffman",
        }
    }
}

/// Entry kinds (§6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Tensor = 0,
    Bytes = 1,
    Str = 2,
    Int = 3,
    Float = 4,
    Json = 5,
    /// A declarative Python object tree (§6.1), built back from an allow-list of types.
    Object = 6,
}

/// The largest object entry (§6.1: JSON parsing costs memory proportional to its size). A
/// reader refuses a larger one from its index record, before reading or decompressing any of
/// it; a writer refuses to write one.
pub const MAX_OBJECT_BYTES: u64 = 64 << 20;

impl Kind {
    /// Decode an on-disk tag.
    pub fn from_tag(tag: u8) -> Option<Kind> {
        match tag {
            0 => Some(Kind::Tensor),
            1 => Some(Kind::Bytes),
            2 => Some(Kind::Str),
            3 => Some(Kind::Int),
            4 => Some(Kind::Float),
            5 => Some(Kind::Json),
            6 => Some(Kind::Object),
            _ => None,
        }
    }

    /// Name used in the Python API.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tensor => "tensor",
            Kind::Bytes => "bytes",
            Kind::Str => "str",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Json => "json",
            Kind::Object => "object",
        }
    }

    /// Parse a name.
    pub fn from_name(name: &str) -> Result<Kind> {
        [
            Kind::Tensor,
            Kind::Bytes,
            Kind::Str,
            Kind::Int,
            Kind::Float,
            Kind::Json,
            Kind::Object,
        ]
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| Error::InvalidArgument(format!("unknown entry kind {name:?}")))
    }
}

// ---- little-endian field access on hostile slices -------------------------------------------

/// Read a u16 at `at`; the caller has bounds-checked the record, so this only guards bugs.
#[inline]
pub fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Read a u32 at `at` of a record whose length was checked.
#[inline]
pub fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Read a u64 at `at` of a record whose length was checked.
#[inline]
pub fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Round `x` up to a multiple of `a` (a power of two), checked.
pub fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// Where a payload of `len` bytes may start at or after `pos` (§2).
pub fn payload_align(pos: u64, len: u64) -> Option<u64> {
    let a = if len >= PAGE_ALIGN_MIN { PAGE } else { ALIGN };
    align_up(pos, a)
}

/// `base[off .. off+len]` with overflow and bounds checks, reporting `what` against `path`.
pub fn slice_at<'a>(
    base: &'a [u8],
    off: u64,
    len: u64,
    path: &Path,
    what: &str,
) -> Result<&'a [u8]> {
    let end = off
        .checked_add(len)
        .ok_or_else(|| Error::corrupt(path, off, format!("{what}: offset + length overflows")))?;
    if end > base.len() as u64 {
        return Err(Error::corrupt(
            path,
            off,
            format!(
                "{what}: range [{off}, {end}) is past the end of the file ({} bytes)",
                base.len()
            ),
        ));
    }
    Ok(&base[off as usize..end as usize])
}

/// Largest dimension and byte size a shape may have: `isize::MAX` on 64-bit targets, the limit
/// of Rust slices and of numpy (`npy_intp`), which refuses larger dims even beside a zero.
pub const MAX_SHAPE_BYTES: u64 = i64::MAX as u64;

/// Product of dims times itemsize, or `None` when the shape cannot be represented: a dimension
/// above [`MAX_SHAPE_BYTES`], or the product of the *non-zero* dims times itemsize above it.
/// The product skips zeros on purpose: `[0, 2^64 - 1]` holds no bytes, yet no array library
/// can build it (numpy raises "array is too big"), so it is refused like an overflow.
pub fn raw_len(dims: &[u64], itemsize: usize) -> Option<u64> {
    let mut nonzero = itemsize as u64;
    let mut empty = false;
    for &d in dims {
        if d > MAX_SHAPE_BYTES {
            return None;
        }
        if d == 0 {
            empty = true;
        } else {
            nonzero = nonzero.checked_mul(d).filter(|&n| n <= MAX_SHAPE_BYTES)?;
        }
    }
    Some(if empty { 0 } else { nonzero })
}

/// The bytes of each shard that no payload uses and the header does not hold: the padding
/// after the header, the alignment gaps between payloads and anything after the last payload
/// (FORMAT.md §2: all zero). `payloads` are `(shard, lo, hi)` sorted and non-overlapping;
/// `shard_lens[s]` is shard `s`'s length. Returns `(shard, lo, hi)` ranges, in order.
pub fn shard_gaps(payloads: &[(u32, u64, u64)], shard_lens: &[u64]) -> Vec<(u32, u64, u64)> {
    let mut cur = vec![SHARD_HEADER_LEN as u64; shard_lens.len()];
    let mut gaps = Vec::new();
    let mut i = 0;
    for (s, &len) in shard_lens.iter().enumerate() {
        while i < payloads.len() && payloads[i].0 as usize == s {
            let (_, lo, hi) = payloads[i];
            if lo > cur[s] {
                gaps.push((s as u32, cur[s], lo));
            }
            cur[s] = cur[s].max(hi);
            i += 1;
        }
        if len > cur[s] {
            gaps.push((s as u32, cur[s], len));
        }
    }
    gaps
}

/// Offset of the first non-zero byte of `b`, if any (64 bytes at a time, an OR the compiler
/// vectorizes: gaps are checked at memory speed).
pub fn first_nonzero(b: &[u8]) -> Option<usize> {
    let mut blocks = b.chunks_exact(64);
    for (i, c) in (&mut blocks).enumerate() {
        if c.iter().fold(0u8, |a, &x| a | x) != 0 {
            return c.iter().position(|&x| x != 0).map(|p| 64 * i + p);
        }
    }
    let rest = blocks.remainder();
    let at = b.len() - rest.len();
    rest.iter().position(|&x| x != 0).map(|p| at + p)
}

/// Number of crc blocks of an uncompressed value of `raw_len` bytes (§3.4).
pub fn crc_block_count(raw_len: u64, log2: u8) -> u64 {
    raw_len.div_ceil(1u64 << log2)
}

/// Number of chunks of a raw payload.
pub fn chunk_count(raw_len: u64, chunk_bytes: u32) -> u64 {
    raw_len.div_ceil(chunk_bytes as u64)
}

// ---- shard header (§2) ----------------------------------------------------------------------

/// The decoded fields of a shard header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHeader {
    pub save_token: u64,
    pub shard_index: u32,
    pub shard_count: u32,
}

/// The checks every fixed header starts with, in this order (FORMAT.md §2): its magic (bytes
/// 0..8), the crc32c of everything before `crc_at` (stored at `crc_at`), then the format
/// version (bytes 8..12). The version is read only once the crc vouches for it, so a damaged
/// header is reported as damage, not as an unknown version. `b` is the whole header; returns
/// its stored (and checked) crc.
pub(crate) fn check_preamble(
    b: &[u8],
    path: &Path,
    magic: &[u8; 8],
    crc_at: usize,
    file_kind: &str,
    header_name: &str,
) -> Result<u32> {
    if &b[0..8] != magic {
        return Err(Error::corrupt(
            path,
            0,
            format!("not a shardpoint {file_kind} (bad magic)"),
        ));
    }
    let stored = le_u32(b, crc_at);
    let actual = crc(&b[..crc_at]);
    if stored != actual {
        return Err(Error::Checksum {
            path: path.to_path_buf(),
            offset: 0,
            what: header_name.into(),
            expected: stored,
            actual,
        });
    }
    let version = le_u32(b, 8);
    if version != FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(stored)
}

impl ShardHeader {
    /// Encode into the 64-byte header; returns the bytes and their crc.
    pub fn encode(&self) -> ([u8; SHARD_HEADER_LEN], u32) {
        let mut b = [0u8; SHARD_HEADER_LEN];
        b[0..8].copy_from_slice(SHARD_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SHARD_HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.save_token.to_le_bytes());
        b[24..28].copy_from_slice(&self.shard_index.to_le_bytes());
        b[28..32].copy_from_slice(&self.shard_count.to_le_bytes());
        let c = crc(&b[..SHARD_HEADER_CRC_AT]);
        b[SHARD_HEADER_CRC_AT..].copy_from_slice(&c.to_le_bytes());
        (b, c)
    }

    /// Decode and check a shard header; returns the header and its crc.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<(ShardHeader, u32)> {
        if bytes.len() < SHARD_HEADER_LEN {
            return Err(Error::corrupt(
                path,
                0,
                format!(
                    "shard file is {} bytes, shorter than its {SHARD_HEADER_LEN}-byte header",
                    bytes.len()
                ),
            ));
        }
        let b = &bytes[..SHARD_HEADER_LEN];
        let stored = check_preamble(
            b,
            path,
            SHARD_MAGIC,
            SHARD_HEADER_CRC_AT,
            "shard file",
            "shard header",
        )?;
        if le_u32(b, 12) as usize != SHARD_HEADER_LEN {
            return Err(Error::corrupt(path, 12, "shard header_len is not 64"));
        }
        if b[32..60].iter().any(|&x| x != 0) {
            return Err(Error::corrupt(
                path,
                32,
                "reserved shard header bytes are not zero",
            ));
        }
        Ok((
            ShardHeader {
                save_token: le_u64(b, 16),
                shard_index: le_u32(b, 24),
                shard_count: le_u32(b, 28),
            },
            stored,
        ))
    }
}

// Shard names are made and checked in `naming`; re-exported here for existing callers.
pub use crate::naming::{shard_name, shard_name_version, valid_shard_name};

#[cfg(test)]
mod tests;
