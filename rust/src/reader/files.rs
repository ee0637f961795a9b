//! The files an open checkpoint reads: each shard ([`ShardMap`]: pread for everything the core
//! reads, a copy-on-write mapping only for zero-copy views) and the index bytes ([`IndexBytes`]:
//! in memory when small, read on demand when large).

use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{IndexSource, LazyIndex};
use memmap2::{MmapMut, MmapOptions};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Indexes up to this size (about 1,000 keys) are read whole at open: one read is cheaper
/// than several. Larger ones are read page by page as lookups touch them ([`LazyIndex`]),
/// which keeps open O(1) in the key count; neither is mapped, so a file truncated under the
/// reader gives an error, never a SIGBUS.
const INDEX_IN_MEMORY_MAX: u64 = 64 << 10;

/// One shard file of an open checkpoint.
///
/// Everything the core itself reads from a shard (headers, payloads, chunks, verification) is
/// read with `pread`: a file truncated after open then gives a [`Error::Corrupt`] naming the
/// file and offset instead of a SIGBUS. Only the zero-copy views handed to Python use a
/// mapping ([`ShardMap::cow`]); its length is checked against the file's current size each time
/// a view is made.
pub struct ShardMap {
    pub path: PathBuf,
    pub(super) file: File,
    len: u64,
    /// Where the shard starts in `file`: 0 for a shard file, the shard region's offset in a
    /// single-file checkpoint (FORMAT.md §10). Every offset of the shard is relative to it.
    pub(super) base: u64,
    cow: OnceLock<std::result::Result<Arc<MmapMut>, String>>,
}

impl ShardMap {
    /// Shard bytes `[base, base + len)` of `file` (`base` 0 for a shard file), not yet checked:
    /// the opener checks the header against the index record ([`ShardMap::check_header`]).
    pub(super) fn new(path: PathBuf, file: File, len: u64, base: u64) -> ShardMap {
        ShardMap {
            path,
            file,
            len,
            base,
            cow: OnceLock::new(),
        }
    }

    /// The file's length as recorded in the index (and found at open).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the shard is empty (never true for a valid shard: it has a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's size now (another process may have truncated it since open).
    fn current_len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(&self.path, "stat shard", e))
    }

    pub(super) fn truncated(&self, need: u64) -> Error {
        let need = need + self.base;
        let now = self.current_len().unwrap_or(0);
        Error::corrupt(
            &self.path,
            now,
            format!(
                "file is now {now} bytes but bytes up to offset {need} are needed ({} when the checkpoint was opened): the file was truncated or rewritten in place after open",
                self.len + self.base
            ),
        )
    }

    /// Fill `buf` with the file's bytes at `off` (pread; never faults on a shortened file).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        match self.file.read_exact_at(buf, off + self.base) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(self.truncated(off + buf.len() as u64))
            }
            Err(e) => Err(Error::Io {
                path: self.path.clone(),
                op: "read shard",
                source: e,
            }),
        }
    }

    /// Read and check the shard header against its index record `rec` (shard `i`).
    pub(super) fn check_header(&self, i: usize, rec: &crate::index::ShardRec) -> Result<()> {
        let mut hdr = [0u8; SHARD_HEADER_LEN];
        let n = (self.len as usize).min(SHARD_HEADER_LEN);
        self.read_at(0, &mut hdr[..n])?;
        let (h, hcrc) = ShardHeader::decode(&hdr[..n], &self.path)?;
        if h.save_token != rec.save_token || hcrc != rec.header_crc {
            return Err(Error::corrupt(
                &self.path,
                self.base,
                format!(
                    "shard {i} belongs to another save (token/header crc differ from the index)"
                ),
            ));
        }
        Ok(())
    }

    /// Check that the file still has (at least) its recorded length. Called before every
    /// zero-copy view is handed out: a view of a mapping past the end of the file would fault.
    pub fn check_len(&self) -> Result<()> {
        if self.current_len()? < self.base + self.len {
            return Err(self.truncated(self.len));
        }
        Ok(())
    }

    /// A private copy-on-write mapping of the file's recorded length: writable memory whose
    /// writes never reach the file. Created on first use and shared by every array handed out
    /// from this shard. Fails (instead of mapping less) if the file is shorter than recorded.
    pub fn cow(&self) -> Result<Arc<MmapMut>> {
        self.check_len()?;
        self.cow
            .get_or_init(|| {
                // SAFETY: a private mapping of `len` bytes, checked above to exist in the file.
                // shardpoint never modifies a published file; a file truncated by someone else
                // later faults on access to views the user holds (the hazard every mmap reader
                // shares, documented in docs/RELIABILITY.md; `copy=True` avoids it).
                unsafe {
                    MmapOptions::new()
                        .offset(self.base)
                        .len(self.len as usize)
                        .map_copy(&self.file)
                }
                .map(Arc::new)
                .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| Error::Io {
                path: self.path.clone(),
                op: "mmap copy-on-write",
                source: std::io::Error::other(e),
            })
    }
}

/// The bytes of an index: read into memory (small) or read on demand (large).
pub enum IndexBytes {
    Mem(Vec<u8>),
    Lazy(LazyIndex),
}

impl IndexBytes {
    /// Index bytes `[base, base + len)` of `file`: read whole when small, else on demand
    /// (then `file` is kept open for the reads).
    pub(super) fn of(file: File, path: &Path, base: u64, len: u64) -> Result<IndexBytes> {
        use std::os::unix::fs::FileExt;
        if len <= INDEX_IN_MEMORY_MAX {
            let mut v = vec![0u8; len as usize];
            file.read_exact_at(&mut v, base)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Error::corrupt(
                        path,
                        base,
                        format!("index [{base}, +{len}) is shorter than the file's size said"),
                    ),
                    _ => Error::io(path, "read index", e),
                })?;
            return Ok(IndexBytes::Mem(v));
        }
        Ok(IndexBytes::Lazy(LazyIndex::new(file, path, base, len)?))
    }
}

impl IndexSource for IndexBytes {
    fn size(&self) -> u64 {
        match self {
            IndexBytes::Mem(v) => v.size(),
            IndexBytes::Lazy(l) => l.size(),
        }
    }

    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        match self {
            IndexBytes::Mem(v) => v.at(off, len),
            IndexBytes::Lazy(l) => l.at(off, len),
        }
    }

    fn resident(&self) -> bool {
        matches!(self, IndexBytes::Mem(_))
    }
}
