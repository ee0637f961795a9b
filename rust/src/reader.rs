//! Reading a committed checkpoint: open (index header + shard headers only), lookups, zero-copy
//! views of raw payloads, chunk-parallel decompression, first-axis slices, and full verification.

use crate::codec::{decode_chunk, decode_chunk_crc, decode_chunk_raw_crc};
use crate::commit::{index_path, with_suffix};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{Entry, IndexSource, IndexView, LazyIndex};
use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

thread_local! {
    /// Per-thread buffer for decoded pieces streamed through [`Reader::fold_pieces`].
    static DECODE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per-thread buffer for a chunk's stored bytes (pread): reused, so steady-state reads
    /// allocate nothing and the buffer stays warm in cache.
    static CHUNK_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on the calling thread's decode buffer, grown to (at least) `len` bytes.
fn with_decode_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
    DECODE_SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        f(&mut buf[..len])
    })
}

/// Attempts at opening when a concurrent commit replaces the index under us.
const OPEN_RETRIES: usize = 5;
/// Indexes up to this size (about 1,000 keys) are read whole at open: one read is cheaper
/// than several. Larger ones are read page by page as lookups touch them ([`LazyIndex`]),
/// which keeps open O(1) in the key count; neither is mapped, so a file truncated under the
/// reader gives an error, never a SIGBUS.
const INDEX_IN_MEMORY_MAX: u64 = 64 << 10;
/// Piece size of parallel preads of large uncompressed payloads.
const READ_PIECE: usize = 8 << 20;

/// One shard file of an open checkpoint.
///
/// Everything the core itself reads from a shard (headers, payloads, chunks, verification) is
/// read with `pread`: a file truncated after open then gives a [`Error::Corrupt`] naming the
/// file and offset instead of a SIGBUS. Only the zero-copy views handed to Python use a
/// mapping ([`ShardMap::cow`]); its length is checked against the file's current size each time
/// a view is made.
pub struct ShardMap {
    pub path: PathBuf,
    file: File,
    len: u64,
    /// Where the shard starts in `file`: 0 for a shard file, the shard region's offset in a
    /// single-file checkpoint (FORMAT.md §10). Every offset of the shard is relative to it.
    base: u64,
    cow: OnceLock<std::result::Result<Arc<MmapMut>, String>>,
}

impl ShardMap {
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

    fn truncated(&self, need: u64) -> Error {
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
    fn check_header(&self, i: usize, rec: &crate::index::ShardRec) -> Result<()> {
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
    fn of(file: File, path: &Path, base: u64, len: u64) -> Result<IndexBytes> {
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
            let shard = ShardMap {
                path,
                file,
                len,
                base: 0,
                cow: OnceLock::new(),
            };
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
        let shard = ShardMap {
            path: path.to_path_buf(),
            file,
            len: h.shard_len,
            base: h.shard_off,
            cow: OnceLock::new(),
        };
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

    /// The stored payload bytes of an entry, read from the file (a copy).
    pub fn stored(&self, e: &Entry<'_>) -> Result<Vec<u8>> {
        let mut v = vec![0u8; e.stored_len as usize];
        self.read_stored(e, 0, &mut v)?;
        Ok(v)
    }

    /// Stored bytes `[rel, rel + out.len())` of an entry's payload into `out` (pread; large
    /// reads are split into pieces read in parallel). Bounds were checked against the shard's
    /// recorded length when the entry was looked up.
    pub fn read_stored(&self, e: &Entry<'_>, rel: u64, out: &mut [u8]) -> Result<()> {
        let shard = &self.shards[e.shard as usize];
        let base = e.offset + rel;
        if out.len() <= READ_PIECE {
            return shard.read_at(base, out);
        }
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            out.par_chunks_mut(READ_PIECE)
                .enumerate()
                .try_for_each(|(i, piece)| {
                    cancel.check()?;
                    shard.read_at(base + (i * READ_PIECE) as u64, piece)
                })
        })
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

    /// File offset, stored length, raw range and crc of chunk `ci`, validated.
    fn chunk_loc(&self, e: &Entry<'_>, ci: usize) -> Result<(u64, usize, u64, u64, u32)> {
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
        Ok((
            off.expect("checked"),
            c.stored_len as usize,
            raw_lo,
            raw_n,
            c.crc,
        ))
    }

    /// Read chunk `ci`'s stored bytes into the calling thread's scratch buffer and hand them
    /// to `f` with their file offset and recorded crc, unchecked: for decoders that compute
    /// the stored crc inside their own pass, or check the decoded bytes end to end
    /// ([`decode_chunk_raw_crc`]).
    fn read_chunk<T>(
        &self,
        e: &Entry<'_>,
        ci: usize,
        f: impl FnOnce(&[u8], u64, u32) -> Result<T>,
    ) -> Result<T> {
        let (off, n, _, _, ccrc) = self.chunk_loc(e, ci)?;
        CHUNK_SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n {
                buf.resize(n, 0);
            }
            self.shards[e.shard as usize].read_at(off, &mut buf[..n])?;
            f(&buf[..n], off, ccrc)
        })
    }

    /// Read chunk `ci`'s stored bytes into the calling thread's scratch buffer, check its crc
    /// and hand them to `f`.
    fn with_chunk<T>(
        &self,
        e: &Entry<'_>,
        ci: usize,
        f: impl FnOnce(&[u8], u64) -> Result<T>,
    ) -> Result<T> {
        let (off, n, _, _, ccrc) = self.chunk_loc(e, ci)?;
        CHUNK_SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n {
                buf.resize(n, 0);
            }
            self.shards[e.shard as usize].read_at(off, &mut buf[..n])?;
            let actual = crc(&buf[..n]);
            if actual != ccrc {
                return Err(Error::Checksum {
                    path: self.shards[e.shard as usize].path.clone(),
                    offset: off,
                    what: format!("key {:?} chunk {ci}", e.key),
                    expected: ccrc,
                    actual,
                });
            }
            f(&buf[..n], off)
        })
    }

    /// Decode chunk `ci` into `out` (its raw length), checking its stored crc.
    fn decode_one(&self, e: &Entry<'_>, ci: usize, out: &mut [u8]) -> Result<()> {
        let path = &self.shards[e.shard as usize].path;
        self.with_chunk(e, ci, |stored, off| {
            decode_chunk(e.codec, e.dtype, stored, out, path, off)
        })
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
        self.read_many_into(std::slice::from_ref(e), vec![out], verify)
    }

    /// Decode chunk `ci` of a compressed entry into `o` (its raw length); returns the crc of
    /// the decoded bytes. Every chunk is decoded with the crc of its output computed inside
    /// the decoder (for codec 3 in the one ungrouping pass, while the data is in cache); the
    /// output crcs give the entry's raw crc, checked end to end by the caller. In a codec-3
    /// chunk, damaged stored bytes either fail the decoder or change the output, so their own
    /// crc is only read afterwards, to name the damaged chunk (one crc pass less per load);
    /// other codecs check the stored crc too.
    fn decode_chunk_checked(&self, e: &Entry<'_>, ci: usize, o: &mut [u8]) -> Result<u32> {
        let path = &self.shards[e.shard as usize].path;
        self.read_chunk(e, ci, |stored, off, ccrc| {
            if e.codec == Codec::HuffByteGroup && stored.len() != o.len() {
                // Every bit of a codec-3 chunk either shapes the output or is checked by the
                // decoder (lengths, tables, stream ends, zero padding), so the end-to-end check
                // covers its stored bytes.
                return decode_chunk_raw_crc(e.codec, e.dtype, stored, o, path, off);
            }
            // zstd frames have bits that do not shape the output: check the stored crc.
            let (r, s) = decode_chunk_crc(e.codec, e.dtype, stored, o, path, off)?;
            if s != ccrc {
                return Err(Error::Checksum {
                    path: path.clone(),
                    offset: off,
                    what: format!("key {:?} chunk {ci}", e.key),
                    expected: ccrc,
                    actual: s,
                });
            }
            Ok(r)
        })
    }

    /// Read many entries into caller-owned buffers (each exactly its entry's `raw_len`, none
    /// overlapping): the bulk-load path (see [`crate::load`]). Work items (pieces of
    /// uncompressed payloads, chunks of compressed ones) are taken in file order by every
    /// worker while a helper thread reads ahead of them; an uncompressed piece is read into
    /// its destination and crc'd in cache-sized blocks (`verify`), a chunk is decoded with its
    /// crc. Compressed entries are always checked end to end; uncompressed ones when `verify`.
    /// On an error some buffers may hold new bytes and others not.
    pub fn read_many_into(
        &self,
        entries: &[Entry<'_>],
        dsts: Vec<&mut [u8]>,
        verify: bool,
    ) -> Result<()> {
        use crate::load::{for_each_ordered, read_crc, with_read_ahead, Span, RAW_PIECE};
        if entries.len() != dsts.len() {
            return Err(Error::InvalidArgument(format!(
                "{} entries but {} output buffers",
                entries.len(),
                dsts.len()
            )));
        }
        let cb = self.index.chunk_bytes() as usize;
        // One work item per piece / chunk: (entry, file offset, stored len, chunk or usize::MAX
        // for a raw piece, destination).
        struct Item<'d> {
            entry: usize,
            at: (u32, u64),
            stored: u64,
            chunk: usize,
            dst: Mutex<Option<&'d mut [u8]>>,
        }
        let mut items: Vec<Item<'_>> = Vec::new();
        // Per entry: its items, in payload order (their crcs combine in that order).
        let mut of_entry: Vec<Vec<usize>> = Vec::with_capacity(entries.len());
        for (i, (e, out)) in entries.iter().zip(dsts).enumerate() {
            if out.len() as u64 != e.raw_len {
                return Err(Error::InvalidArgument(format!(
                    "key {:?}: output buffer has {} bytes, need {}",
                    e.key,
                    out.len(),
                    e.raw_len
                )));
            }
            let mut mine = Vec::new();
            if e.codec == Codec::None {
                for (k, piece) in out.chunks_mut(RAW_PIECE).enumerate() {
                    mine.push(items.len());
                    items.push(Item {
                        entry: i,
                        at: (e.shard, e.offset + (k * RAW_PIECE) as u64),
                        stored: piece.len() as u64,
                        chunk: usize::MAX,
                        dst: Mutex::new(Some(piece)),
                    });
                }
            } else {
                self.check_chunk_table(e)?;
                for (ci, o) in out.chunks_mut(cb).enumerate() {
                    let c = e.chunk(ci);
                    mine.push(items.len());
                    items.push(Item {
                        entry: i,
                        at: (e.shard, e.offset + c.rel_offset),
                        stored: c.stored_len as u64,
                        chunk: ci,
                        dst: Mutex::new(Some(o)),
                    });
                }
            }
            of_entry.push(mine);
        }
        // File order: the order the read-ahead reads and the workers take.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_unstable_by_key(|&k| items[k].at);
        let spans: Vec<Span<'_>> = order
            .iter()
            .map(|&k| Span {
                file: &self.shards[items[k].at.0 as usize].file,
                offset: items[k].at.1,
                len: items[k].stored,
            })
            .collect();
        let crcs: Vec<OnceLock<(u32, usize)>> = (0..items.len()).map(|_| OnceLock::new()).collect();
        // Ctrl-C (crate::cancel): checked between items, on the workers, against the caller's
        // token.
        let cancel = crate::cancel::current();
        with_read_ahead(&spans, |progress| {
            for_each_ordered(order.len(), |j| {
                cancel.check()?;
                let k = order[j];
                let it = &items[k];
                let e = &entries[it.entry];
                let dst = it
                    .dst
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .expect("each item is taken once");
                let shard = &self.shards[e.shard as usize];
                let c = if it.chunk == usize::MAX {
                    if verify {
                        read_crc(it.at.1, dst, |off, b| shard.read_at(off, b))?
                    } else {
                        shard.read_at(it.at.1, dst)?;
                        0
                    }
                } else {
                    match self.decode_chunk_checked(e, it.chunk, dst) {
                        Ok(c) => c,
                        // A decoder error on damaged bytes: the chunk crcs name the damage
                        // better.
                        Err(err @ Error::Corrupt { .. }) => {
                            self.verify_entry(e)?;
                            return Err(err);
                        }
                        Err(err) => return Err(err),
                    }
                };
                let _ = crcs[k].set((c, dst.len()));
                progress.consumed(it.stored);
                Ok(())
            })
        })?;
        for (i, e) in entries.iter().enumerate() {
            if e.codec == Codec::None && !verify {
                continue;
            }
            let whole = if of_entry[i].is_empty() {
                crc(&[])
            } else {
                combine_crcs(
                    of_entry[i]
                        .iter()
                        .map(|&k| *crcs[k].get().expect("all items ran")),
                )
            };
            if whole == e.crc {
                continue;
            }
            if e.codec != Codec::None {
                // Name the damaged chunk when its stored crc shows it.
                self.verify_entry(e)?;
            }
            return Err(Error::Checksum {
                path: self.shards[e.shard as usize].path.clone(),
                offset: e.offset,
                what: if e.codec == Codec::None {
                    format!("key {:?}", e.key)
                } else {
                    format!("key {:?} (decoded data)", e.key)
                },
                expected: e.crc,
                actual: whole,
            });
        }
        Ok(())
    }

    /// Stream an entry's raw bytes through `f` piece by piece, in parallel, each piece decoded
    /// (or read) into the calling thread's reusable buffer, never the whole value at once:
    /// the pass `stats` makes. Pieces are chunks (compressed) or 8 MiB reads (raw), so each is
    /// a whole number of elements. Every byte is checked end to end against the entry's raw
    /// crc32c before the results are returned: statistics of damaged data are never reported.
    pub fn fold_pieces<T: Send>(
        &self,
        e: &Entry<'_>,
        f: impl Fn(&[u8]) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let shard = &self.shards[e.shard as usize];
        let (pieces, crcs): (Vec<T>, Vec<(u32, usize)>) = crate::threads::install(|| {
            if e.codec == Codec::None {
                let n = e.stored_len as usize;
                (0..n.div_ceil(READ_PIECE))
                    .into_par_iter()
                    .map(|i| {
                        let lo = i * READ_PIECE;
                        let len = READ_PIECE.min(n - lo);
                        with_decode_scratch(len, |buf| {
                            shard.read_at(e.offset + lo as u64, buf)?;
                            Ok((f(buf)?, (crc(buf), len)))
                        })
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(|v| v.into_iter().unzip())
            } else {
                self.check_chunk_table(e)?;
                let cb = self.index.chunk_bytes() as u64;
                (0..e.nchunks())
                    .into_par_iter()
                    .map(|ci| {
                        let len = cb.min(e.raw_len - ci as u64 * cb) as usize;
                        with_decode_scratch(len, |buf| {
                            let c = self.decode_chunk_checked(e, ci, buf)?;
                            Ok((f(buf)?, (c, len)))
                        })
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(|v| v.into_iter().unzip())
            }
        })?;
        let whole = if crcs.is_empty() {
            crc(&[])
        } else {
            combine_crcs(crcs)
        };
        if whole != e.crc {
            self.verify_entry(e)?; // names the damaged chunk when its stored crc shows it
            return Err(Error::Checksum {
                path: shard.path.clone(),
                offset: e.offset,
                what: format!("key {:?} (decoded data)", e.key),
                expected: e.crc,
                actual: whole,
            });
        }
        Ok(pieces)
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

    /// Check the raw crc of an uncompressed entry against `view`, its bytes as handed out
    /// (the zero-copy mapping): computing the crc there, in parallel pieces, is also the first
    /// touch of the pages the caller is about to read, so a checked load costs little more
    /// than an unchecked one that touches its data.
    pub fn verify_view(&self, e: &Entry<'_>, view: &[u8]) -> Result<()> {
        if e.codec != Codec::None || view.len() as u64 != e.stored_len {
            return Err(Error::InvalidArgument(format!(
                "key {:?}: a view of {} bytes is not its uncompressed payload",
                e.key,
                view.len()
            )));
        }
        self.check_raw_crc(e, view)
    }

    /// Check an entry's stored crcs, reading it with pread in pieces (parallel for large
    /// payloads). Used by `verify`.
    pub fn verify_entry(&self, e: &Entry<'_>) -> Result<()> {
        crate::threads::install(|| self.verify_entry_in_pool(e))
    }

    fn verify_entry_in_pool(&self, e: &Entry<'_>) -> Result<()> {
        if e.codec == Codec::None {
            let shard = &self.shards[e.shard as usize];
            let n = e.stored_len as usize;
            let cancel = crate::cancel::current();
            let pieces: Vec<(u32, usize)> = (0..n.div_ceil(READ_PIECE))
                .into_par_iter()
                .map(|i| {
                    cancel.check()?;
                    let lo = i * READ_PIECE;
                    let len = READ_PIECE.min(n - lo);
                    let mut buf = vec![0u8; len];
                    shard.read_at(e.offset + lo as u64, &mut buf)?;
                    Ok((crc(&buf), len))
                })
                .collect::<Result<_>>()?;
            let actual = if pieces.is_empty() {
                crc(&[])
            } else {
                combine_crcs(pieces)
            };
            if actual != e.crc {
                return Err(Error::Checksum {
                    path: shard.path.clone(),
                    offset: e.offset,
                    what: format!("key {:?}", e.key),
                    expected: e.crc,
                    actual,
                });
            }
            Ok(())
        } else {
            let cancel = crate::cancel::current();
            (0..e.nchunks()).into_par_iter().try_for_each(|ci| {
                cancel.check()?;
                self.with_chunk(e, ci, |_, _| Ok(()))
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
            return self.read_stored(e, lo, out);
        }
        if lo == hi {
            return Ok(());
        }
        self.check_chunk_table(e)?;
        let cb = self.index.chunk_bytes() as u64;
        let (c0, c1) = (lo / cb, (hi - 1) / cb);
        // Cut `out` into one disjoint `&mut` piece per overlapping chunk before going parallel,
        // so every thread writes only through the piece it owns.
        let mut pieces: Vec<(u64, &mut [u8])> = Vec::with_capacity((c1 - c0 + 1) as usize);
        let mut rest = out;
        for ci in c0..=c1 {
            let (a, b) = (lo.max(ci * cb), hi.min((ci + 1) * cb));
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut((b - a) as usize);
            pieces.push((ci, piece));
            rest = tail;
        }
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            pieces
                .into_par_iter()
                .try_for_each(|(ci, dst)| -> Result<()> {
                    cancel.check()?;
                    let raw_lo = ci * cb;
                    let raw_n = cb.min(e.raw_len - raw_lo) as usize;
                    let mut tmp = vec![0u8; raw_n];
                    self.decode_one(e, ci as usize, &mut tmp)?;
                    let from = (lo.max(raw_lo) - raw_lo) as usize;
                    dst.copy_from_slice(&tmp[from..from + dst.len()]);
                    Ok(())
                })
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
        self.verify_gaps(&ranges)?;
        // Entries in parallel; inside, large raw payloads and chunk lists are split again
        // (rayon nests), so one huge tensor still uses every core.
        let cancel = crate::cancel::current();
        crate::threads::install(|| {
            (0..n).into_par_iter().try_for_each(|i| -> Result<()> {
                cancel.check()?;
                let _scope = cancel.enter();
                let e = self.index.entry(i)?;
                if e.codec != Codec::None {
                    self.check_chunk_table(&e)?;
                }
                self.verify_entry(&e)
            })
        })
    }

    /// Check that every shard byte outside the header and the payloads is zero (FORMAT.md §2),
    /// so that every byte of a shard is either checked by a crc or checked to be zero.
    /// `ranges` are the payloads `(shard, lo, hi, entry)`, sorted and non-overlapping.
    fn verify_gaps(&self, ranges: &[(u32, u64, u64, usize)]) -> Result<()> {
        let payloads: Vec<(u32, u64, u64)> = ranges.iter().map(|r| (r.0, r.1, r.2)).collect();
        let lens: Vec<u64> = self.shards.iter().map(|s| s.len()).collect();
        let mut pieces = Vec::new();
        for (s, lo, hi) in shard_gaps(&payloads, &lens) {
            let mut a = lo;
            while a < hi {
                let b = hi.min(a + READ_PIECE as u64);
                pieces.push((s, a, b));
                a = b;
            }
        }
        crate::threads::install(|| {
            pieces.into_par_iter().try_for_each(|(s, a, b)| {
                let shard = &self.shards[s as usize];
                let mut buf = vec![0u8; (b - a) as usize];
                shard.read_at(a, &mut buf)?;
                match first_nonzero(&buf) {
                None => Ok(()),
                Some(p) => Err(Error::corrupt(
                    &shard.path,
                    shard.base + a + p as u64,
                    "non-zero byte in the padding between payloads (FORMAT.md §2: gaps are zero)",
                )),
            }
            })
        })?;
        // A single-file checkpoint's own padding (offsets in the file, not in its shard),
        // read in bounded pieces (a hostile file may declare a huge gap).
        for &(lo, hi) in &self.container_gaps {
            use std::os::unix::fs::FileExt;
            let shard = &self.shards[0];
            let mut a = lo;
            while a < hi {
                let mut buf = vec![0u8; (hi - a).min(READ_PIECE as u64) as usize];
                shard
                    .file
                    .read_exact_at(&mut buf, a)
                    .map_err(|e| Error::io(&shard.path, "read single-file checkpoint", e))?;
                if let Some(p) = first_nonzero(&buf) {
                    return Err(Error::corrupt(
                        &shard.path,
                        a + p as u64,
                        "non-zero byte in the single-file checkpoint's padding (FORMAT.md §10)",
                    ));
                }
                a += buf.len() as u64;
            }
        }
        Ok(())
    }
}
