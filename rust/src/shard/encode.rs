//! The encoding pipeline of [`ShardWriter::write_items`]: the values' chunks (and the crcs of
//! values stored raw) are cut into batches, each batch encoded in parallel on the rayon pool
//! while the previous one is written in order, with padding and entry records at value
//! boundaries.

use super::{EncodeOptions, Item, ShardWriter};
use crate::checksum::par_crc;
use crate::codec::{choose_codec, encode_chunk_crc_in, encode_xor_chunk_crc_in, BufPool};
use crate::error::Result;
use crate::format::*;
use crate::index::{ChunkRec, EntryMeta};
use rayon::prelude::*;

/// Chunks compressed per parallel batch: bounds the memory a huge tensor needs while writing.
const CHUNKS_PER_BATCH: usize = 32;

/// One encoded chunk: stored bytes (None = raw), crc32c of the raw bytes, raw length, crc32c
/// of the stored bytes.
/// One unit of encoding work of [`ShardWriter::write_items`]: chunk `ci` of a compressed
/// value, or the crc of a value stored raw.
#[derive(Clone, Copy)]
enum Job {
    Chunk { item: usize, ci: usize },
    Raw { item: usize },
}

impl Job {
    /// Raw bytes this job covers (batch sizing).
    fn bytes(&self, items: &[&Item<'_>], cb: usize) -> usize {
        match *self {
            Job::Raw { item } => items[item].data.len(),
            Job::Chunk { item, ci } => (items[item].data.len() - ci * cb).min(cb),
        }
    }
}

/// A finished job: a chunk's stored bytes (`None` = stored raw), raw crc, raw length and
/// stored crc; or a raw value's crc. The last field holds the raw bytes when they are not the
/// item's `data` (an XOR item, [`Item::xor_base`]) and are stored raw.
enum Done {
    Chunk(Option<Vec<u8>>, u32, usize, u32, Option<Vec<u8>>),
    /// crc, the XOR payload if any, the block crcs (FORMAT.md §3.4; empty: none).
    Raw(u32, Option<Vec<u8>>, Vec<u32>),
}

thread_local! {
    /// The XOR of one chunk of an XOR item, encoded from here (cache-warm, reused).
    static XOR_CHUNK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `a ^ b` into a buffer from `pool`.
fn xor_owned(pool: &BufPool, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = pool.take(a.len());
    v.resize(a.len(), 0);
    crate::codec::xor::xor_to(&mut v, a, b);
    v
}

/// What [`ShardWriter::write_batch`] needs besides the batch: the values and their codecs,
/// the chunk size, the buffer pool and the progress callback.
#[derive(Clone, Copy)]
struct BatchCtx<'a, 'b> {
    items: &'a [&'a Item<'b>],
    codecs: &'a [Codec],
    cb: usize,
    pool: &'a BufPool,
    progress: &'a (dyn Fn(u64) + Sync),
}

/// Per-value bookkeeping while its chunks are written.
struct ItemState {
    nchunks: usize,
    offset: u64,
    raw_crc: Option<u32>,
    all_raw: bool,
    chunks: Vec<ChunkRec>,
}
impl ShardWriter {
    /// Write values in order, calling `progress(raw bytes)` after each. Compression and crcs
    /// run on the rayon pool as one pipeline across items: the chunks of consecutive values
    /// (and the crcs of values stored raw) are cut into batches of about
    /// [`CHUNKS_PER_BATCH`] chunks, batch k+1 is encoded in parallel while batch k is written
    /// (double buffering). Why across items: a model of many tensors of one chunk each would
    /// otherwise encode one chunk at a time and stop encoding while writing.
    pub fn write_items(
        &mut self,
        items: &[&Item<'_>],
        opts: EncodeOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let cb = opts.chunk_bytes as usize;
        let mut jobs: Vec<Job> = Vec::new();
        let mut states: Vec<ItemState> = Vec::with_capacity(items.len());
        let mut codecs: Vec<Codec> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            item.validate()?;
            let codec = if (item.data.len() as u64) < MIN_COMPRESS_BYTES {
                Codec::None
            } else {
                choose_codec(opts.codec, item.dtype, opts.level)
            };
            let nchunks = if codec == Codec::None {
                jobs.push(Job::Raw { item: i });
                0
            } else {
                let n = item.data.len().div_ceil(cb);
                jobs.extend((0..n).map(|ci| Job::Chunk { item: i, ci }));
                n
            };
            codecs.push(codec);
            states.push(ItemState {
                nchunks,
                offset: 0,
                raw_crc: None,
                all_raw: true,
                chunks: Vec::with_capacity(nchunks),
            });
        }
        // Batches of about CHUNKS_PER_BATCH chunks' worth of bytes (a raw value counts its
        // bytes, whose crc is its job).
        let mut batches: Vec<&[Job]> = Vec::new();
        let (mut from, mut bytes) = (0usize, 0usize);
        for (j, job) in jobs.iter().enumerate() {
            bytes += job.bytes(items, cb);
            if bytes >= cb * CHUNKS_PER_BATCH {
                batches.push(&jobs[from..=j]);
                (from, bytes) = (j + 1, 0);
            }
        }
        if from < jobs.len() {
            batches.push(&jobs[from..]);
        }
        let pool = self.pool.clone();
        let level = opts.level;
        self.cancel = crate::cancel::current();
        let cancel = self.cancel.clone();
        let encode = |batch: &[Job]| -> Vec<Result<Done>> {
            batch
                .par_iter()
                .map(|job| {
                    // Per job: once cancelled, the rest of the batch is skipped, so a call
                    // stops after the chunks already being encoded.
                    cancel.check()?;
                    match *job {
                        Job::Raw { item } => Ok(match items[item].xor_base {
                            None => {
                                let (blocks, c) = value_crcs(items[item].data);
                                Done::Raw(c, None, blocks)
                            }
                            Some(b) => {
                                let x = xor_owned(&pool, items[item].data, b);
                                // an XOR payload is read whole, against its base: no blocks
                                Done::Raw(par_crc(&x), Some(x), Vec::new())
                            }
                        }),
                        Job::Chunk { item, ci } => {
                            let it = items[item];
                            let range = ci * cb..((ci + 1) * cb).min(it.data.len());
                            let buf = pool.take(cb + 256);
                            let Some(base) = it.xor_base else {
                                let raw = &it.data[range];
                                let e =
                                    encode_chunk_crc_in(codecs[item], it.dtype, level, raw, buf)?;
                                return Ok(Done::Chunk(
                                    e.stored,
                                    e.raw_crc,
                                    raw.len(),
                                    e.stored_crc,
                                    None,
                                ));
                            };
                            // the chunk's XOR, computed into this thread's scratch and encoded
                            // from there: the XOR of the whole value never exists
                            let (a, b) = (&it.data[range.clone()], &base[range]);
                            XOR_CHUNK.with(|cell| {
                                let mut x = cell.borrow_mut();
                                x.resize(a.len(), 0); // (fully overwritten below)
                                crate::codec::xor::xor_to(&mut x, a, b);
                                let e = encode_xor_chunk_crc_in(
                                    codecs[item],
                                    it.dtype,
                                    level,
                                    &x,
                                    buf,
                                )?;
                                let raw = e.stored.is_none().then(|| {
                                    let mut v = pool.take(x.len());
                                    v.extend_from_slice(&x);
                                    v
                                });
                                Ok(Done::Chunk(e.stored, e.raw_crc, x.len(), e.stored_crc, raw))
                            })
                        }
                    }
                })
                .collect()
        };
        let ctx = BatchCtx {
            items,
            codecs: &codecs,
            cb,
            pool: &pool,
            progress,
        };
        self.cancel.check()?;
        crate::threads::install(|| {
            let mut pending = batches.first().map(|b| encode(b));
            for (k, batch) in batches.iter().enumerate() {
                self.cancel.check()?;
                let done = pending.take().expect("encoded ahead");
                let next = batches.get(k + 1);
                let (written, next_done) = rayon::join(
                    || self.write_batch(batch, done, &mut states, &ctx),
                    || next.map(|b| encode(b)),
                );
                written?;
                pending = next_done;
            }
            // test-only: a writer killed with part of its data written (crate::fault)
            crate::fault::point("shard.item");
            Ok(())
        })
    }

    /// Write one encoded batch in order: padding and entry records at value boundaries.
    fn write_batch(
        &mut self,
        batch: &[Job],
        done: Vec<Result<Done>>,
        states: &mut [ItemState],
        ctx: &BatchCtx<'_, '_>,
    ) -> Result<()> {
        let BatchCtx {
            items,
            codecs,
            cb,
            pool,
            progress,
        } = *ctx;
        for (job, d) in batch.iter().zip(done) {
            match (*job, d?) {
                (Job::Raw { item }, Done::Raw(c, xor, blocks)) => {
                    let data = xor.as_deref().unwrap_or(items[item].data);
                    self.pad_for(data.len() as u64)?;
                    let offset = self.pos;
                    self.append(data)?;
                    self.push_entry(
                        items[item],
                        Codec::None,
                        c,
                        offset,
                        data.len() as u64,
                        vec![],
                    );
                    self.set_blocks(blocks);
                    progress(data.len() as u64);
                    if let Some(x) = xor {
                        pool.give(x);
                    }
                }
                (Job::Chunk { item, ci }, Done::Chunk(stored, raw_c, n, stored_c, raw_copy)) => {
                    let it = items[item];
                    let st = &mut states[item];
                    if ci == 0 {
                        // Page alignment only serves zero-copy views of uncompressed payloads
                        // (FORMAT.md §2): a payload whose first chunk compressed is 64-byte
                        // aligned (saves ~2 KiB of padding per tensor); one whose first chunk
                        // is raw may end up all raw (uncompressed), so it is page aligned.
                        self.pad_for(if stored.is_some() {
                            0
                        } else {
                            it.data.len() as u64
                        })?;
                        st.offset = self.pos;
                    }
                    st.raw_crc = Some(match st.raw_crc {
                        None => raw_c,
                        Some(a) => crate::crc_combine::combine(a, raw_c, n as u64),
                    });
                    st.all_raw &= stored.is_none();
                    let bytes: &[u8] = match (stored.as_deref(), raw_copy.as_deref()) {
                        (Some(b), _) | (None, Some(b)) => b,
                        (None, None) => &it.data[ci * cb..ci * cb + n],
                    };
                    st.chunks.push(ChunkRec {
                        rel_offset: self.pos - st.offset,
                        stored_len: bytes.len() as u32,
                        crc: stored_c,
                    });
                    self.append(bytes)?;
                    for b in [stored, raw_copy].into_iter().flatten() {
                        pool.give(b);
                    }
                    if ci + 1 == st.nchunks {
                        let raw_crc = st.raw_crc.unwrap_or_else(|| crc(&[]));
                        let stored_len = self.pos - st.offset;
                        let chunks = std::mem::take(&mut st.chunks);
                        // Nothing compressed: the payload *is* the raw bytes, so record it as
                        // codec none and keep zero-copy reads.
                        let (codec, chunks) = if st.all_raw {
                            (Codec::None, Vec::new())
                        } else {
                            (codecs[item], chunks)
                        };
                        self.push_entry(it, codec, raw_crc, st.offset, stored_len, chunks);
                        if st.all_raw && it.xor_base.is_none() {
                            // an uncompressed value after all: give it its crc blocks (one
                            // more crc pass, only over incompressible data)
                            self.set_blocks(value_crcs(it.data).0);
                        }
                        progress(it.data.len() as u64);
                    }
                }
                _ => unreachable!("each job's result is of its own kind"),
            }
        }
        Ok(())
    }

    fn push_entry(
        &mut self,
        item: &Item<'_>,
        codec: Codec,
        c: u32,
        offset: u64,
        stored_len: u64,
        chunks: Vec<ChunkRec>,
    ) {
        self.bytes_written += stored_len;
        self.entries.push(EntryMeta {
            key: item.key.clone(),
            dtype: item.dtype,
            codec,
            kind: item.kind,
            dims: item.dims.clone(),
            shard: 0, // set by the index builder's caller
            crc: c,
            offset,
            stored_len,
            chunks,
            block_log2: 0,
            block_crcs: Vec::new(),
        });
    }

    /// Give the entry just pushed (uncompressed) its block crc table, if it has one.
    fn set_blocks(&mut self, blocks: Vec<u32>) {
        if blocks.is_empty() {
            return;
        }
        let e = self.entries.last_mut().expect("pushed just before");
        e.block_log2 = CRC_BLOCK_LOG2;
        e.block_crcs = blocks;
    }
}

/// The crc of an uncompressed value and, when it spans more than one block, its block crcs
/// (FORMAT.md §3.4; empty otherwise: a value of one block is read whole anyway).
fn value_crcs(data: &[u8]) -> (Vec<u32>, u32) {
    if data.len() as u64 <= 1u64 << CRC_BLOCK_LOG2 {
        return (Vec::new(), par_crc(data));
    }
    crate::checksum::block_crcs(data, CRC_BLOCK_LOG2)
}
