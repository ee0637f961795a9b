//! Reading a committed checkpoint: open (index header + shard headers only), lookups, zero-copy
//! views of raw payloads, chunk-parallel decompression, first-axis slices, and full verification.

use crate::codec::decode_chunk;
use crate::commit::{index_path, with_suffix};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{Entry, IndexView};
use memmap2::{Mmap, MmapMut, MmapOptions};
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Attempts at opening when a concurrent commit replaces the index under us.
const OPEN_RETRIES: usize = 5;

/// One mapped shard file.
pub struct ShardMap {
    pub path: PathBuf,
    file: File,
    map: Mmap,
    cow: OnceLock<std::result::Result<Arc<MmapMut>, String>>,
}

impl ShardMap {
    /// The whole file, read-only.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// A private copy-on-write mapping of the file: writable memory whose writes never reach the
    /// file. Created on first use and shared by every array handed out from this shard.
    pub fn cow(&self) -> Result<Arc<MmapMut>> {
        self.cow
            .get_or_init(|| {
                // SAFETY: a private mapping; the file is never modified by shardpoint once
                // published (files are only ever created and unlinked).
                unsafe { MmapOptions::new().map_copy(&self.file) }
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

/// An open checkpoint.
pub struct Reader {
    prefix: PathBuf,
    index: IndexView<Mmap>,
    shards: Vec<ShardMap>,
}

fn map_file(path: &Path, what: &'static str) -> Result<(File, Mmap)> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: a FIFO (or device) planted under a checkpoint name must not hang the open.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, what, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, "stat", e))?;
    if !meta.file_type().is_file() {
        return Err(Error::corrupt(path, 0, "not a regular file"));
    }
    let len = meta.len();
    if len == 0 {
        return Err(Error::corrupt(path, 0, "file is empty"));
    }
    // SAFETY: shardpoint never modifies a published file; a file truncated by someone else
    // while mapped would SIGBUS, the one hazard every mmap reader shares (safetensors too).
    let m = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, "mmap", e))?;
    Ok((f, m))
}

/// (device, inode) of a file: tells whether `P.index` was replaced between two looks.
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

impl Reader {
    /// Open checkpoint `prefix`: reads and checks the index header/footer, shard table, block
    /// table and every shard header. Never parses all entries.
    pub fn open(prefix: &Path) -> Result<Reader> {
        let ipath = index_path(prefix);
        let mut last_err = None;
        for _ in 0..OPEN_RETRIES {
            let mut opened = None;
            match Self::open_once(prefix, &mut opened) {
                Ok(r) => return Ok(r),
                // A shard vanished or belongs to another save: if the index we read has been
                // replaced meanwhile (a concurrent commit, whose cleanup removed the old shards
                // or whose new shards took the old names), retry against the new index.
                Err(e) => {
                    let now = std::fs::metadata(&ipath).ok().map(|m| file_id(&m));
                    if opened.is_some() && now.is_some() && now != opened {
                        last_err = Some(e);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(last_err.expect("loop ran"))
    }

    fn open_once(prefix: &Path, opened: &mut Option<(u64, u64)>) -> Result<Reader> {
        let ipath = index_path(prefix);
        let (f, imap) = map_file(&ipath, "open checkpoint index")?;
        *opened = f.metadata().ok().map(|m| file_id(&m));
        let index = IndexView::open(imap, &ipath)?;
        let mut shards = Vec::with_capacity(index.shards().len());
        for (i, rec) in index.shards().iter().enumerate() {
            let path = with_suffix(prefix, &rec.name);
            let (file, map) = map_file(&path, "open shard")?;
            if map.len() as u64 != rec.file_len {
                return Err(Error::corrupt(
                    &path,
                    map.len() as u64,
                    format!(
                        "shard {i} is {} bytes but the index records {} (truncated or replaced)",
                        map.len(),
                        rec.file_len
                    ),
                ));
            }
            let (h, hcrc) = ShardHeader::decode(&map, &path)?;
            if h.save_token != rec.save_token || hcrc != rec.header_crc {
                return Err(Error::corrupt(&path, 0, format!("shard {i} belongs to another save (token/header crc differ from the index)")));
            }
            shards.push(ShardMap {
                path,
                file,
                map,
                cow: OnceLock::new(),
            });
        }
        Ok(Reader {
            prefix: prefix.to_path_buf(),
            index,
            shards,
        })
    }

    /// The prefix this reader opened.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The index.
    pub fn index(&self) -> &IndexView<Mmap> {
        &self.index
    }

    /// The mapped shards.
    pub fn shards(&self) -> &[ShardMap] {
        &self.shards
    }

    /// Entry of `key`, or `MissingKey`.
    pub fn entry(&self, key: &str) -> Result<Entry<'_>> {
        match self.index.find(key)? {
            Some(i) => self.index.entry(i),
            None => Err(Error::MissingKey {
                path: index_path(&self.prefix),
                key: key.to_string(),
            }),
        }
    }

    /// The stored payload bytes of an entry.
    pub fn stored(&self, e: &Entry<'_>) -> &[u8] {
        // Bounds were checked against the shard's recorded (= actual) length in `entry`.
        &self.shards[e.shard as usize].bytes()
            [e.offset as usize..(e.offset + e.stored_len) as usize]
    }

    fn chunk_err(&self, e: &Entry<'_>, ci: usize, off: u64, what: String) -> Error {
        Error::corrupt(
            &self.shards[e.shard as usize].path,
            off,
            format!("key {:?} chunk {ci}: {what}", e.key),
        )
    }

    /// Check the chunk table of a compressed entry: records contiguous from 0, in order, each no
    /// longer than its raw chunk, together exactly filling the payload (FORMAT.md §3.3). Without
    /// this a hostile table could point many chunks at one stored frame.
    fn check_chunk_table(&self, e: &Entry<'_>) -> Result<()> {
        let cb = self.index.chunk_bytes() as u64;
        let mut pos = 0u64;
        for ci in 0..e.nchunks() {
            let c = e.chunk(ci);
            let raw_n = cb.min(e.raw_len - ci as u64 * cb);
            if c.rel_offset != pos || c.stored_len as u64 > raw_n {
                return Err(self.chunk_err(e, ci, e.offset.saturating_add(c.rel_offset), format!("record at {} (+{}) is not contiguous with the previous chunk or longer than its raw {raw_n} bytes", c.rel_offset, c.stored_len)));
            }
            pos += c.stored_len as u64;
        }
        if pos != e.stored_len {
            return Err(self.chunk_err(
                e,
                e.nchunks(),
                e.offset + pos,
                format!(
                    "chunks cover {pos} bytes of a {}-byte payload",
                    e.stored_len
                ),
            ));
        }
        Ok(())
    }

    /// Stored bytes and raw byte range of chunk `ci`, validated.
    fn chunk_bytes_of<'a>(&'a self, e: &Entry<'_>, ci: usize) -> Result<(&'a [u8], u64, u64, u32)> {
        let c = e.chunk(ci);
        let cb = self.index.chunk_bytes() as u64;
        let raw_lo = ci as u64 * cb;
        let raw_n = cb.min(e.raw_len - raw_lo);
        let off = e.offset.checked_add(c.rel_offset);
        let ok = off.is_some()
            && (c.stored_len as u64) <= raw_n
            && c.rel_offset
                .checked_add(c.stored_len as u64)
                .is_some_and(|end| end <= e.stored_len);
        if !ok {
            return Err(self.chunk_err(
                e,
                ci,
                e.offset,
                format!(
                    "record [{}, +{}) outside the payload or longer than its raw {raw_n} bytes",
                    c.rel_offset, c.stored_len
                ),
            ));
        }
        let off = off.expect("checked");
        let s = &self.shards[e.shard as usize].bytes()
            [off as usize..(off + c.stored_len as u64) as usize];
        Ok((s, raw_lo, raw_n, c.crc))
    }

    /// Decode chunk `ci` into `out` (its raw length), checking its stored crc.
    fn decode_one(&self, e: &Entry<'_>, ci: usize, out: &mut [u8]) -> Result<()> {
        let (stored, _, raw_n, ccrc) = self.chunk_bytes_of(e, ci)?;
        debug_assert_eq!(out.len() as u64, raw_n);
        let path = &self.shards[e.shard as usize].path;
        let off = e.offset + e.chunk(ci).rel_offset;
        let actual = crc(stored);
        if actual != ccrc {
            return Err(Error::Checksum {
                path: path.clone(),
                offset: off,
                what: format!("key {:?} chunk {ci}", e.key),
                expected: ccrc,
                actual,
            });
        }
        decode_chunk(e.codec, e.dtype, stored, out, path, off)
    }

    /// Read the whole entry into `out` (exactly `raw_len` bytes), decompressing chunks in
    /// parallel. Compressed entries are always checked end to end (chunk crcs and the raw crc);
    /// raw entries are checked when `verify`.
    pub fn read_into(&self, e: &Entry<'_>, out: &mut [u8], verify: bool) -> Result<()> {
        if out.len() as u64 != e.raw_len {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: output buffer has {} bytes, need {}",
                e.key,
                out.len(),
                e.raw_len
            )));
        }
        if e.codec == Codec::None {
            let s = self.stored(e);
            out.copy_from_slice(s);
            if verify {
                self.check_raw_crc(e, out)?;
            }
            return Ok(());
        }
        self.check_chunk_table(e)?;
        let cb = self.index.chunk_bytes() as usize;
        let crcs: Vec<(u32, usize)> = out
            .par_chunks_mut(cb)
            .enumerate()
            .map(|(ci, o)| {
                self.decode_one(e, ci, o)?;
                Ok((crc(o), o.len()))
            })
            .collect::<Result<_>>()?;
        let whole = combine_crcs(crcs);
        if whole != e.crc {
            return Err(Error::Checksum {
                path: self.shards[e.shard as usize].path.clone(),
                offset: e.offset,
                what: format!("key {:?} (decoded data)", e.key),
                expected: e.crc,
                actual: whole,
            });
        }
        Ok(())
    }

    fn check_raw_crc(&self, e: &Entry<'_>, bytes: &[u8]) -> Result<()> {
        let actual = crate::shard::par_crc(bytes);
        if actual != e.crc {
            return Err(Error::Checksum {
                path: self.shards[e.shard as usize].path.clone(),
                offset: e.offset,
                what: format!("key {:?}", e.key),
                expected: e.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Check the raw crc of an uncompressed entry in place (no copy).
    pub fn verify_entry(&self, e: &Entry<'_>) -> Result<()> {
        if e.codec == Codec::None {
            self.check_raw_crc(e, self.stored(e))
        } else {
            (0..e.nchunks()).into_par_iter().try_for_each(|ci| {
                let (stored, ..) = self.chunk_bytes_of(e, ci)?;
                let c = e.chunk(ci);
                let actual = crc(stored);
                if actual != c.crc {
                    return Err(Error::Checksum {
                        path: self.shards[e.shard as usize].path.clone(),
                        offset: e.offset + c.rel_offset,
                        what: format!("key {:?} chunk {ci}", e.key),
                        expected: c.crc,
                        actual,
                    });
                }
                Ok(())
            })
        }
    }

    /// Raw bytes `[lo, hi)` of the entry's data, decoding only the chunks that overlap.
    pub fn read_range(&self, e: &Entry<'_>, lo: u64, hi: u64, out: &mut [u8]) -> Result<()> {
        if lo > hi || hi > e.raw_len || out.len() as u64 != hi - lo {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: byte range [{lo}, {hi}) invalid for {} bytes",
                e.key, e.raw_len
            )));
        }
        if e.codec == Codec::None {
            out.copy_from_slice(&self.stored(e)[lo as usize..hi as usize]);
            return Ok(());
        }
        if lo == hi {
            return Ok(());
        }
        self.check_chunk_table(e)?;
        let cb = self.index.chunk_bytes() as u64;
        let (c0, c1) = (lo / cb, (hi - 1) / cb);
        (c0..=c1).into_par_iter().try_for_each(|ci| -> Result<()> {
            let raw_lo = ci * cb;
            let raw_n = cb.min(e.raw_len - raw_lo) as usize;
            let mut tmp = vec![0u8; raw_n];
            self.decode_one(e, ci as usize, &mut tmp)?;
            let a = lo.max(raw_lo);
            let b = hi.min(raw_lo + raw_n as u64);
            let dst = &out[(a - lo) as usize..(b - lo) as usize] as *const [u8] as *mut [u8];
            // SAFETY: chunks cover disjoint raw ranges, so the destination ranges are disjoint.
            unsafe { (*dst).copy_from_slice(&tmp[(a - raw_lo) as usize..(b - raw_lo) as usize]) };
            Ok(())
        })
    }

    /// Check everything: every index block, global key order, metadata, every payload and chunk
    /// crc, and that no two payloads overlap. Parallel over entries and pieces of large payloads.
    pub fn verify(&self) -> Result<()> {
        self.index.verify_all()?;
        let n = self.index.len();
        let mut ranges: Vec<(u32, u64, u64, usize)> = Vec::with_capacity(n);
        for i in 0..n {
            let e = self.index.entry(i)?;
            ranges.push((e.shard, e.offset, e.offset + e.stored_len, i));
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
                let e = self.index.entry(w[1].3)?;
                return Err(Error::corrupt(
                    &self.shards[e.shard as usize].path,
                    e.offset,
                    format!("payload of key {:?} overlaps another entry's", e.key),
                ));
            }
        }
        // Entries in parallel; inside, large raw payloads and chunk lists are split again
        // (rayon nests), so one huge tensor still uses every core.
        (0..n).into_par_iter().try_for_each(|i| -> Result<()> {
            let e = self.index.entry(i)?;
            if e.codec != Codec::None {
                self.check_chunk_table(&e)?;
            }
            self.verify_entry(&e)
        })
    }
}
