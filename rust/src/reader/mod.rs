//! Reading a committed checkpoint: open (index header + shard headers only), lookups, zero-copy
//! views of raw payloads, chunk-parallel decompression, first-axis slices, and full verification.
//!
//! Where to look:
//! - this file: [`Reader`], how a path is recognised and opened (prefix, `P.index`, single
//!   file), the accessors and key lookup;
//! - `files`: the files an open checkpoint reads ([`ShardMap`], [`IndexBytes`]);
//! - `chunks`: locating, reading and checking one chunk of a compressed value;
//! - `values`: one value's stored bytes and a raw range of it;
//! - `batched`: whole values into caller buffers (the bulk-load path) and streamed pieces;
//! - `direct_chunks`: compressed values read by the cold-read engine (`O_DIRECT`);
//! - `verify`: crc checks of values and of the whole checkpoint, and what strong (digest)
//!   verification reads.

mod batched;
mod chunks;
mod direct_chunks;
mod files;
mod values;
mod verify;
mod xor;

pub use files::{IndexBytes, ShardMap};

use crate::commit::{index_path, with_suffix};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{Entry, IndexView};
use crate::single_records::*;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Attempts at opening when a concurrent commit replaces the index under us.
const OPEN_RETRIES: usize = 5;
/// Piece size of parallel preads of large uncompressed payloads.
const READ_PIECE: usize = 8 << 20;

/// An open checkpoint.
pub struct Reader {
    prefix: PathBuf,
    /// The file holding the index: `P.index`, or the single file itself.
    index_file: PathBuf,
    index: IndexView<IndexBytes>,
    shards: Vec<ShardMap>,
    /// A single-file checkpoint's own padding, `[lo, hi)` in the file (FORMAT.md §10: after
    /// its header, between the shard and the index regions), checked to be zero by `verify`.
    container_gaps: Vec<(u64, u64)>,
}

/// What a path given to [`Reader::open`] names.
enum Named {
    /// A checkpoint prefix `P` (files `P.index`, `P.data-*`).
    Prefix(PathBuf),
    /// A single-file checkpoint (FORMAT.md §10).
    Single,
}

/// Recognise a path by content, never by name alone: a regular file starting with the
/// single-file magic is a single-file checkpoint; `P.index` (a file starting with the index
/// magic) means checkpoint `P`; anything else is a prefix.
fn classify(path: &Path) -> Named {
    use std::io::Read;
    let is_file = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    if is_file {
        let mut magic = [0u8; 8];
        let read = open_file(path, "open").and_then(|(mut f, _)| {
            f.read_exact(&mut magic)
                .map_err(|e| Error::io(path, "read", e))
        });
        if read.is_ok() {
            if &magic == SINGLE_MAGIC {
                return Named::Single;
            }
            if &magic == INDEX_MAGIC {
                let s = path.as_os_str().as_encoded_bytes();
                if let Some(stem) = s.strip_suffix(b".index") {
                    if !stem.is_empty() {
                        // SAFETY: cut at an ASCII suffix of bytes that came from an OsStr.
                        let os = unsafe { std::ffi::OsStr::from_encoded_bytes_unchecked(stem) };
                        return Named::Prefix(PathBuf::from(os));
                    }
                }
            }
        }
    }
    Named::Prefix(path.to_path_buf())
}

/// Whether `path` is a single-file checkpoint (by its first bytes).
pub fn is_single_file(path: &Path) -> bool {
    matches!(classify(path), Named::Single)
}

/// Open a regular, non-empty file for reading; returns it and its length.
fn open_file(path: &Path, what: &'static str) -> Result<(File, std::fs::Metadata)> {
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
    if meta.len() == 0 {
        return Err(Error::corrupt(path, 0, "file is empty"));
    }
    Ok((f, meta))
}

/// Open `P.index`: its bytes, and its (device, inode) as opened.
fn read_index(path: &Path) -> Result<((u64, u64), IndexBytes)> {
    let (f, meta) = open_file(path, "open checkpoint index")?;
    Ok((file_id(&meta), IndexBytes::of(f, path, 0, meta.len())?))
}

/// (device, inode) of a file: tells whether `P.index` was replaced between two looks.
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

impl Reader {
    /// Open checkpoint `prefix`: reads and checks the index header/footer, shard table, block
    /// table and every shard header. Never parses all entries.
    ///
    /// `prefix` may also name a single-file checkpoint (FORMAT.md §10, recognised by its
    /// magic) or `P.index` itself (then `P` is opened).
    pub fn open(prefix: &Path) -> Result<Reader> {
        let prefix = match classify(prefix) {
            Named::Single => return Self::open_single(prefix),
            Named::Prefix(p) => p,
        };
        let prefix = prefix.as_path();
        let ipath = index_path(prefix);
        if !ipath.exists() && std::fs::metadata(prefix).is_ok_and(|m| m.is_file()) {
            // A file that is neither a single-file checkpoint nor beside a `P.index`: say what
            // it is not, rather than that `P.index` is missing.
            return Err(Error::corrupt(
                prefix,
                0,
                format!(
                    "not a shardpoint checkpoint: the file does not start with the single-file magic {:?} and {} does not exist",
                    String::from_utf8_lossy(SINGLE_MAGIC),
                    ipath.display()
                ),
            ));
        }
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
        let (id, ibytes) = read_index(&ipath)?;
        *opened = Some(id);
        let index = IndexView::open(ibytes, &ipath)?;
        let mut shards = Vec::with_capacity(index.shards().len());
        for (i, rec) in index.shards().iter().enumerate() {
            let path = with_suffix(prefix, &rec.name);
            let (file, meta) = open_file(&path, "open shard")?;
            let len = meta.len();
            if len != rec.file_len {
                return Err(Error::corrupt(
                    &path,
                    len,
                    format!(
                        "shard {i} is {len} bytes but the index records {} (truncated or replaced)",
                        rec.file_len
                    ),
                ));
            }
            let shard = ShardMap::new(path, file, len, 0);
            shard.check_header(i, rec)?;
            shards.push(shard);
        }
        Ok(Reader {
            prefix: prefix.to_path_buf(),
            index_file: ipath,
            index,
            shards,
            container_gaps: Vec::new(),
        })
    }

    /// Open a single-file checkpoint (FORMAT.md §10): its header and trailer locate the
    /// embedded index and shard, which are then checked exactly as separate files are. O(1)
    /// in the key count, like a prefix open.
    fn open_single(path: &Path) -> Result<Reader> {
        use std::os::unix::fs::FileExt;
        let (file, meta) = open_file(path, "open single-file checkpoint")?;
        let len = meta.len();
        let read = |off: u64, buf: &mut [u8]| {
            file.read_exact_at(buf, off)
                .map_err(|e| Error::io(path, "read single-file checkpoint", e))
        };
        let mut hdr = [0u8; SINGLE_HEADER_LEN];
        let mut trailer = [0u8; SINGLE_TRAILER_LEN];
        let n = (len as usize).min(SINGLE_HEADER_LEN);
        read(0, &mut hdr[..n])?;
        if len >= SINGLE_TRAILER_LEN as u64 {
            read(len - SINGLE_TRAILER_LEN as u64, &mut trailer)?;
        }
        let h = SingleHeader::decode(&hdr[..n], &trailer, len, path)?;
        let ifile = file
            .try_clone()
            .map_err(|e| Error::io(path, "duplicate descriptor", e))?;
        let ibytes = IndexBytes::of(ifile, path, h.index_off, h.index_len)?;
        let index = IndexView::open(ibytes, path)?;
        if index.shards().len() != 1 {
            return Err(Error::corrupt(
                path,
                h.index_off,
                format!(
                    "a single-file checkpoint's index must describe exactly one shard, found {}",
                    index.shards().len()
                ),
            ));
        }
        let rec = &index.shards()[0];
        if rec.file_len != h.shard_len {
            return Err(Error::corrupt(
                path,
                h.shard_off,
                format!(
                    "shard region is {} bytes but the embedded index records {}",
                    h.shard_len, rec.file_len
                ),
            ));
        }
        let shard = ShardMap::new(path.to_path_buf(), file, h.shard_len, h.shard_off);
        shard.check_header(0, rec)?;
        Ok(Reader {
            prefix: path.to_path_buf(),
            index_file: path.to_path_buf(),
            index,
            shards: vec![shard],
            container_gaps: vec![
                (SINGLE_HEADER_LEN as u64, h.shard_off),
                (h.shard_off + h.shard_len, h.index_off),
            ],
        })
    }

    /// The file holding the index (`P.index`, or the single file).
    pub fn index_file(&self) -> &Path {
        &self.index_file
    }

    /// Whether this is a single-file checkpoint.
    pub fn is_single_file(&self) -> bool {
        self.index_file == self.prefix
    }

    /// The prefix this reader opened.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The index.
    pub fn index(&self) -> &IndexView<IndexBytes> {
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
                path: self.index_file.clone(),
                key: key.to_string(),
            }),
        }
    }
}
