//! Writing one shard file: header, aligned payloads, chunked compression, crc32c.
//!
//! A shard is written under a temp name and only published (linked to its final name) by
//! `seal` + `publish`; dropping an unpublished writer removes the temp file.
//!
//! Where to look: this file holds the writer (create, the byte sink, padding, seal, publish) and
//! the value type [`Item`]; `encode` the pipeline that compresses and checksums the values'
//! chunks in parallel batches while the previous batch is written.

mod encode;

use crate::codec::BufPool;
use crate::commit::publish_shard;
use crate::digest::{DigestAlgo, FileHasher};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{EntryMeta, ShardRec};
use crate::naming::{final_of_temp, shard_name_in, temp_path, with_suffix};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Small payloads are gathered into a buffer of this size before a write syscall.
const WRITE_BUF: usize = 1 << 20;

/// How one value should be stored.
#[derive(Clone, Copy, Debug)]
pub struct EncodeOptions {
    pub codec: Codec,
    pub level: i32,
    pub chunk_bytes: u32,
}

/// One value to store (borrowed bytes: nothing is copied before it is written).
#[derive(Clone, Debug)]
pub struct Item<'a> {
    pub key: String,
    pub dtype: DType,
    pub kind: Kind,
    pub dims: Vec<u64>,
    pub data: &'a [u8],
    /// When set, the value stored is `data ^ xor_base` (same length), computed chunk by chunk
    /// as it is encoded: a delta payload (FORMAT.md §11) without the XOR ever held whole.
    pub xor_base: Option<&'a [u8]>,
}

impl Item<'_> {
    /// Check that `data` matches dtype × dims and the key is valid.
    pub fn validate(&self) -> Result<()> {
        crate::index::check_key(&self.key)?;
        if self.dims.len() > MAX_NDIM {
            return Err(Error::InvalidArgument(format!(
                "{:?}: ndim {} > {MAX_NDIM}",
                self.key,
                self.dims.len()
            )));
        }
        let want = raw_len(&self.dims, self.dtype.itemsize()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{:?}: shape {:?} overflows (a dimension or the byte size exceeds 2^63 - 1)",
                self.key, self.dims
            ))
        })?;
        if want != self.data.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "{:?}: {} bytes given, shape {:?} of {} needs {want}",
                self.key,
                self.data.len(),
                self.dims,
                self.dtype.name()
            )));
        }
        if self.xor_base.is_some_and(|b| b.len() != self.data.len()) {
            return Err(Error::InvalidArgument(format!(
                "{:?}: XOR base of another length than the value",
                self.key
            )));
        }
        if self.kind != Kind::Tensor && (self.dtype != DType::U8 || self.dims.len() != 1) {
            return Err(Error::InvalidArgument(format!(
                "{:?}: typed values are 1-d uint8",
                self.key
            )));
        }
        if self.kind == Kind::Object && want > MAX_OBJECT_BYTES {
            return Err(Error::InvalidArgument(format!(
                "{:?}: object entry of {want} bytes, over the {MAX_OBJECT_BYTES} allowed",
                self.key
            )));
        }
        Ok(())
    }
}

/// Where the bytes of a shard go when it does not live in a local file: an object-store
/// upload (`crate::store::upload`). Dropping an unpublished sink discards what it holds.
pub trait ShardSink: Send {
    /// Append bytes.
    fn write_all(&mut self, data: &[u8]) -> Result<()>;
    /// Make the shard visible under its final name; returns the name suffix after `P`.
    fn publish(self: Box<Self>) -> Result<String>;
}

/// A shard file being written.
pub struct ShardWriter {
    /// Set for a shard written to an object store (then `file` is `None`).
    sink: Option<Box<dyn ShardSink>>,
    prefix: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
    pos: u64,
    token: u64,
    header_crc: u32,
    index: u32,
    count: u32,
    /// Named in the hashed form (FORMAT.md §3.1.1); local shards only (a sink names itself).
    hashed: bool,
    entries: Vec<EntryMeta>,
    bytes_written: u64,
    /// Flushed and fsynced by [`ShardWriter::seal`]; the file stays open (and locked) until
    /// [`ShardWriter::publish`].
    sealed: bool,
    /// Output buffers of written chunks, reused by the encoder for the next ones.
    pool: std::sync::Arc<BufPool>,
    /// Strong digest of every byte written (`set_digest`), finished by `seal`.
    hasher: Option<FileHasher>,
    digest: Option<String>,
    /// The cancellation token of the call writing items (checked between batches and
    /// between pieces of large writes, which run on rayon threads).
    cancel: crate::cancel::Token,
}

/// Bytes per write call of a large buffer: cancellation is checked between pieces.
const WRITE_PIECE: usize = 64 << 20;

impl ShardWriter {
    /// Create the temp file of shard `index` of `count` and write its header.
    pub fn create(prefix: &Path, index: u32, count: u32, token: u64) -> Result<Self> {
        Self::create_in(prefix, index, count, token, false)
    }

    /// [`ShardWriter::create`], naming the shard in the hashed form `P/HH/data-…` when
    /// `hashed` (FORMAT.md §3.1.1; its directories are created here).
    pub fn create_in(
        prefix: &Path,
        index: u32,
        count: u32,
        token: u64,
        hashed: bool,
    ) -> Result<Self> {
        let dest = with_suffix(prefix, &shard_name_in(index, count, None, hashed));
        let tmp = temp_path(&dest, token);
        // errors name the shard's final name (the user's prefix), not the temp name
        // Locked until the file is closed: tells a concurrent commit's cleanup that this temp
        // file is in use (a crashed writer's lock dies with it). Without flock support it is
        // not locked, and cleanup leaves temp files alone.
        let file = if hashed {
            // `P/` and `P/HH/`, their parents fsynced as they are created (a shard linked into
            // a directory that a crash loses would be lost with it). A concurrent commit's
            // cleanup removes empty `P/HH/` directories: created again and retried.
            let mut tries = 0;
            loop {
                crate::commit::ensure_parent_dir(&dest, true)?;
                match crate::commit::create_locked_temp(&tmp, &dest, "create shard") {
                    Err(e) if tries < 3 && !crate::commit::parent_dir(&dest).is_dir() => {
                        tries += 1;
                        let _ = e;
                    }
                    r => break r?,
                }
            }
        } else {
            crate::commit::create_locked_temp(&tmp, &dest, "create shard")?
        };
        let mut w = ShardWriter {
            sink: None,
            prefix: prefix.to_path_buf(),
            tmp,
            file: Some(file),
            buf: Vec::new(),
            pos: DATA_START,
            token,
            header_crc: 0,
            index,
            count,
            hashed,
            entries: Vec::new(),
            bytes_written: 0,
            sealed: false,
            pool: Default::default(),
            hasher: None,
            digest: None,
            cancel: Default::default(),
        };
        // From here on an error drops `w`, whose Drop removes the temp file.
        let (hdr, header_crc) = ShardHeader {
            save_token: token,
            shard_index: index,
            shard_count: count,
        }
        .encode();
        w.buf.reserve(WRITE_BUF);
        w.buf.extend_from_slice(&hdr);
        w.buf.resize(DATA_START as usize, 0);
        w.header_crc = header_crc;
        Ok(w)
    }

    /// A shard whose bytes go to `sink` (an object-store upload) instead of a local file.
    pub fn with_sink(sink: Box<dyn ShardSink>, index: u32, count: u32, token: u64) -> Self {
        let (hdr, header_crc) = ShardHeader {
            save_token: token,
            shard_index: index,
            shard_count: count,
        }
        .encode();
        let mut buf = Vec::with_capacity(WRITE_BUF);
        buf.extend_from_slice(&hdr);
        buf.resize(DATA_START as usize, 0);
        ShardWriter {
            sink: Some(sink),
            prefix: PathBuf::new(),
            tmp: PathBuf::new(),
            file: None,
            buf,
            pos: DATA_START,
            token,
            header_crc,
            index,
            count,
            hashed: false,
            entries: Vec::new(),
            bytes_written: 0,
            sealed: false,
            pool: Default::default(),
            hasher: None,
            digest: None,
            cancel: Default::default(),
        }
    }

    /// Hash every byte of this shard with `algo` as it is written (FORMAT.md §7.1). Call before
    /// the first value is written: the header is still in the write buffer until then.
    pub fn set_digest(&mut self, algo: Option<DigestAlgo>) {
        debug_assert!(self.pos == DATA_START && self.entries.is_empty());
        self.hasher = algo.map(DigestAlgo::hasher);
    }

    /// The hex digest of the whole file, once sealed with a digest set.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// Write bytes to the file or the sink.
    fn write_out(&mut self, data: &[u8]) -> Result<()> {
        for piece in data.chunks(WRITE_PIECE) {
            self.cancel.check()?;
            // Every byte of the file passes here exactly once, in file order: the digest is
            // computed from the bytes handed to the file or upload, without reading them back.
            if let Some(h) = self.hasher.as_mut() {
                h.update(piece);
            }
            if let Some(sink) = self.sink.as_mut() {
                sink.write_all(piece)?;
                continue;
            }
            let f = self.file.as_mut().expect("open until finish");
            f.write_all(piece)
                .map_err(|e| Error::io(&final_of_temp(&self.tmp), "write shard", e))?;
        }
        Ok(())
    }

    /// Stored payload bytes written so far (a statistic; nothing balances on it: `add_parallel`
    /// plans shards by item size before writing).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn flush_buf(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            let buf = std::mem::take(&mut self.buf);
            let res = self.write_out(&buf);
            self.buf = buf;
            res?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Append bytes at the current position (buffered when small).
    fn append(&mut self, data: &[u8]) -> Result<()> {
        if self.buf.len() + data.len() <= WRITE_BUF {
            self.buf.extend_from_slice(data);
        } else {
            self.flush_buf()?;
            if data.len() >= WRITE_BUF {
                self.write_out(data)?;
            } else {
                self.buf.extend_from_slice(data);
            }
        }
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Pad with zeros to where a payload of `len` bytes starts.
    fn pad_for(&mut self, len: u64) -> Result<()> {
        let at = payload_align(self.pos, len)
            .ok_or_else(|| Error::InvalidArgument("shard offset overflows".into()))?;
        let pad = (at - self.pos) as usize;
        if pad > 0 {
            self.buf.resize(self.buf.len() + pad, 0);
            self.pos = at;
            if self.buf.len() >= WRITE_BUF {
                self.flush_buf()?;
            }
        }
        Ok(())
    }

    /// Write one value (see [`ShardWriter::write_items`]).
    pub fn write_item(&mut self, item: &Item<'_>, opts: EncodeOptions) -> Result<()> {
        self.write_items(&[item], opts, &|_| {})
    }

    /// Flush and fsync (if `durable`) the temp file. It stays open, and so locked, until
    /// `publish`: a concurrent commit's cleanup must not take it for a crashed save's leftover.
    /// On error the writer is dropped by its caller and the temp file removed.
    pub fn seal(&mut self, durable: bool) -> Result<()> {
        self.flush_buf()?;
        if let Some(h) = self.hasher.take() {
            self.digest = Some(h.finish_hex());
        }
        if durable && self.sink.is_none() {
            // (a completed upload is durable: nothing to sync for a sink)
            let f = self.file.as_ref().expect("open until publish");
            f.sync_all()
                .map_err(|e| Error::io(&final_of_temp(&self.tmp), "fsync shard", e))?;
        }
        self.sealed = true;
        Ok(())
    }

    /// `seal` then `publish` (no commit lock involved: for tools and tests that build a shard
    /// by hand; `CheckpointWriter` publishes under the lock).
    pub fn finish(mut self, durable: bool) -> Result<(ShardRec, Vec<EntryMeta>)> {
        self.seal(durable)?;
        self.publish(true)
    }

    /// Close and publish the sealed temp file under its final name (call with the commit lock
    /// held; `allow_plain`: see [`publish_shard`]). Returns the shard record and the entries
    /// written (their `shard` field still 0). On error the temp file is removed.
    pub fn publish(mut self, allow_plain: bool) -> Result<(ShardRec, Vec<EntryMeta>)> {
        if !self.sealed {
            return Err(Error::InvalidArgument(
                "shard published before it was sealed".into(),
            ));
        }
        if let Some(sink) = self.sink.take() {
            let name = sink.publish()?;
            let rec = ShardRec {
                file_len: self.pos,
                save_token: self.token,
                header_crc: self.header_crc,
                name,
            };
            return Ok((rec, std::mem::take(&mut self.entries)));
        }
        let plain = shard_name_in(self.index, self.count, None, self.hashed);
        let tokened = shard_name_in(self.index, self.count, Some(self.token), self.hashed);
        // Drop (which removes the temp file on error) still sees `file`, so keep it until
        // the link succeeded; the lock on it is released when it is closed.
        let name = publish_shard(&self.prefix, &self.tmp, &plain, &tokened, allow_plain)?;
        self.file.take();
        let rec = ShardRec {
            file_len: self.pos,
            save_token: self.token,
            header_crc: self.header_crc,
            name,
        };
        Ok((rec, std::mem::take(&mut self.entries)))
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // Unpublished (error or abandoned save): the temp file must not linger.
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
