//! The single-file layout's fixed records (FORMAT.md §10): header and trailer of a file that
//! holds one shard region and one index region (beside `format`, which holds the rest).

use crate::error::{Error, Result};
use crate::format::*;
use std::path::Path;

/// Single-file checkpoint magic (§10).
pub const SINGLE_MAGIC: &[u8; 8] = b"SPSINGLE";
/// Single-file trailer magic (§10).
pub const SINGLE_TRAILER_MAGIC: &[u8; 8] = b"SPSNGEND";
/// Single-file header length (§10).
pub const SINGLE_HEADER_LEN: usize = 64;
/// Offset of the single-file header's crc (§10).
pub const SINGLE_HEADER_CRC_AT: usize = 60;
/// Single-file trailer length (§10).
pub const SINGLE_TRAILER_LEN: usize = 16;
/// Where the shard region of a single file starts (§10): a page boundary, so payload
/// alignment inside the shard is alignment inside the file.
pub const SINGLE_SHARD_OFF: u64 = 4096;

/// The header of a single-file checkpoint (§10): where its one shard region and its index
/// region lie in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SingleHeader {
    pub file_len: u64,
    pub shard_off: u64,
    pub shard_len: u64,
    pub index_off: u64,
    pub index_len: u64,
}

impl SingleHeader {
    /// Encode into the 64-byte header; returns the bytes and their crc.
    pub fn encode(&self) -> ([u8; SINGLE_HEADER_LEN], u32) {
        let mut b = [0u8; SINGLE_HEADER_LEN];
        b[0..8].copy_from_slice(SINGLE_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SINGLE_HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.file_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.shard_off.to_le_bytes());
        b[32..40].copy_from_slice(&self.shard_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.index_off.to_le_bytes());
        b[48..56].copy_from_slice(&self.index_len.to_le_bytes());
        let c = crc(&b[..SINGLE_HEADER_CRC_AT]);
        b[SINGLE_HEADER_CRC_AT..].copy_from_slice(&c.to_le_bytes());
        (b, c)
    }

    /// The 16-byte trailer that closes a file whose header crc is `header_crc`.
    pub fn trailer(header_crc: u32) -> [u8; SINGLE_TRAILER_LEN] {
        let mut t = [0u8; SINGLE_TRAILER_LEN];
        t[0..8].copy_from_slice(SINGLE_TRAILER_MAGIC);
        t[8..12].copy_from_slice(&header_crc.to_le_bytes());
        t
    }

    /// Decode and check a header against the file's actual length and its trailer: magic,
    /// crc, version, lengths, and that header, shard region and index region lie in the file
    /// in that order without overlapping (every sum overflow-checked).
    pub fn decode(
        bytes: &[u8],
        trailer: &[u8],
        actual_len: u64,
        path: &Path,
    ) -> Result<SingleHeader> {
        let min = (SINGLE_SHARD_OFF + DATA_START) as usize + SINGLE_TRAILER_LEN;
        if bytes.len() < SINGLE_HEADER_LEN || (actual_len as usize) < min {
            return Err(Error::corrupt(
                path,
                0,
                format!("single-file checkpoint is {actual_len} bytes, shorter than the smallest valid one ({min})"),
            ));
        }
        let b = &bytes[..SINGLE_HEADER_LEN];
        let stored = check_preamble(
            b,
            path,
            SINGLE_MAGIC,
            SINGLE_HEADER_CRC_AT,
            "single-file checkpoint",
            "single-file header",
        )?;
        if le_u32(b, 12) as usize != SINGLE_HEADER_LEN || b[56..60].iter().any(|&x| x != 0) {
            return Err(Error::corrupt(
                path,
                12,
                "single-file header_len is not 64 or its reserved bytes are not zero",
            ));
        }
        let h = SingleHeader {
            file_len: le_u64(b, 16),
            shard_off: le_u64(b, 24),
            shard_len: le_u64(b, 32),
            index_off: le_u64(b, 40),
            index_len: le_u64(b, 48),
        };
        if h.file_len != actual_len {
            return Err(Error::corrupt(
                path,
                16,
                format!(
                    "file is {actual_len} bytes but its header records {} (truncated or extended)",
                    h.file_len
                ),
            ));
        }
        if trailer.len() != SINGLE_TRAILER_LEN
            || &trailer[0..8] != SINGLE_TRAILER_MAGIC
            || le_u32(trailer, 8) != stored
            || le_u32(trailer, 12) != 0
        {
            return Err(Error::corrupt(
                path,
                actual_len.saturating_sub(SINGLE_TRAILER_LEN as u64),
                "single-file trailer is missing or does not match the header (a torn or spliced file)",
            ));
        }
        let shard_end = h.shard_off.checked_add(h.shard_len);
        let index_end = h.index_off.checked_add(h.index_len);
        let body_end = actual_len - SINGLE_TRAILER_LEN as u64;
        let ok = h.shard_off == SINGLE_SHARD_OFF
            && h.shard_len >= DATA_START
            && h.index_off.is_multiple_of(ALIGN)
            && h.index_len >= (INDEX_HEADER_LEN + INDEX_FOOTER_LEN) as u64
            && shard_end.is_some_and(|e| e <= h.index_off)
            && index_end == Some(body_end);
        if !ok {
            return Err(Error::corrupt(
                path,
                24,
                format!(
                    "single-file regions out of bounds or overlapping: shard [{}, +{}), index [{}, +{}) in a {actual_len}-byte file (the shard must start at {SINGLE_SHARD_OFF}, the index at a multiple of {ALIGN} after it and end where the trailer starts)",
                    h.shard_off, h.shard_len, h.index_off, h.index_len
                ),
            ));
        }
        Ok(h)
    }
}
