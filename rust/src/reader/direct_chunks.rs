//! A checkpoint's values read with `O_DIRECT`: the cold-read engine ([`crate::direct`]) for
//! the chunks of compressed values, decoded straight from the engine's buffers (below), and
//! for uncompressed values, read straight into their destinations (`direct_raw`).
//!
//! Why: a cold buffered load of a compressed value pays the page cache's fill (allocating
//! pages, the kernel's copy out of them) and a `pread` copy into the worker's scratch buffer
//! before the decoder runs: 30-40 % of the load's CPU on this project's 2-core VM. Here the
//! stored bytes arrive by DMA in a buffer the decoder reads in place: a cold default-codec load
//! cost 0.42-0.44 CPU-s/GB against 0.59-0.61 buffered (docs/SERVING.md, "Issue 41 (ninth
//! round)"). The weights iterator takes it for a large read of files mostly not in the page
//! cache (`direct="cold"`, its default), `load_into` for a cold compressed read.
//!
//! How: the chunks, in file order, are cut into blocks of whole chunks (up to [`BLOCK`] bytes
//! each, a lone larger chunk alone). `depth` reader threads read blocks in order, each into a
//! buffer out of a pool of `depth + 2` (so host memory stays bounded), with one `O_DIRECT` read
//! of the block's aligned extent, or a `pread` when the block is already cached (a warm load
//! keeps its speed) or the file system refuses `O_DIRECT`. The decoding workers take chunks in
//! file order, wait for their block, decode, and the last chunk of a block returns its buffer
//! to the pool. A reader takes a buffer and the next block index together, under one lock, so
//! the lowest block not yet read always gets the next free buffer: no deadlock however the
//! threads interleave.

use super::batched::check_outs;
use super::Reader;
use crate::direct::{
    align_down, align_up, direct_read, read_direct_crcs, reopen_direct, Aligned, DirectErr,
    DirectFile, DirectStats,
};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use crate::load::{looks_cached, PlainFile};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

/// Stored bytes per block (one direct read): large enough for the device to stream, small
/// enough that `depth + 2` buffers stay a few tens of MiB; a page short of 4 MiB at each end so
/// that a block's aligned extent fills two huge pages exactly ([`buffer_cap`]).
pub const BLOCK: u64 = (4 << 20) - 2 * crate::direct::DIRECT_ALIGN;
/// The first block's limit; each next one's doubles up to [`BLOCK`], and the last ones shrink
/// again. Why: the readers start `depth` reads at once and the device serves them side by
/// side, so a block lands only when about `depth` blocks' bytes have arrived. At a call's
/// start the decoders wait for the first one; at its end the last `depth` blocks land together
/// and are decoded with no read left to overlap. Small blocks at both ends keep the two
/// overlapped: a weights iterator reads a model in many 64 MiB calls, each paying both (on
/// this project's VM a call's first block landed after 14-16 ms and its decode ended 5-6 ms
/// after its last read; with the ramps 5 ms and about 1 ms, a call 24 ms instead of 30).
const FIRST_BLOCK: u64 = 256 << 10;

/// The stored-byte limit of block `k` when `rest` stored bytes of the call start at it, with
/// `depth` reads in flight (a lone larger chunk is a block alone).
fn block_limit(k: usize, rest: u64, depth: usize) -> u64 {
    let start = if k >= 8 {
        BLOCK
    } else {
        (FIRST_BLOCK << k).min(BLOCK)
    };
    let end = (rest / (2 * depth as u64)).max(FIRST_BLOCK);
    start.min(end)
}

/// Reads in flight by default.
pub const DEPTH: usize = 8;
/// Values further apart than this (other values lie between) start a new block: the gap
/// would be read for nothing.
const MAX_GAP: u64 = 64 << 10;
/// A chunk longer than this (a hostile or unusual chunk size) sends the call to the buffered
/// engine instead of sizing buffers to it.
const MAX_BUFFER: u64 = 256 << 20;

/// One block: stored bytes `[lo, hi)` of one shard (shard offsets), read at once.
struct Block {
    shard: u32,
    lo: u64,
    hi: u64,
    /// Stored bytes of its chunks (the extent less any gaps between values).
    bytes: u64,
    /// Chunks of the block not yet decoded; the last one frees the buffer.
    left: AtomicUsize,
}

/// Buffers of [`buffer_cap`] bytes kept between calls: a weights iterator reads a model in
/// many batches, and fresh buffers would cost first-touch page faults on every one (the
/// kernel pins a direct read's pages, so each new page is faulted before the DMA).
static KEPT: Mutex<Vec<Aligned>> = Mutex::new(Vec::new());

/// Bytes of a block buffer: a block's aligned extent (at most `max(BLOCK, chunk)` stored bytes
/// plus a partial page at each end).
fn buffer_cap(cb: u64) -> u64 {
    align_up(BLOCK.max(cb)) + 2 * crate::direct::DIRECT_ALIGN
}

/// A buffer of `cap` bytes: a kept one when the size is the usual one, else a new mapping.
fn take_buffer(cap: u64) -> Result<Aligned> {
    if cap == buffer_cap(0) {
        if let Some(b) = KEPT.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(b);
        }
    }
    Aligned::huge(cap as usize)
}

/// Keep up to `DEPTH + 2` buffers of the usual size for the next call; unmap the rest.
fn give_back(bufs: Vec<Aligned>, cap: u64) {
    if cap != buffer_cap(0) {
        return;
    }
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    for b in bufs {
        if kept.len() < DEPTH + 2 {
            kept.push(b);
        }
    }
}

/// Shared state of the readers and the workers, under one lock.
struct State {
    free: Vec<Aligned>,
    /// Buffers not yet made (made on first need, so a small load maps little).
    unmade: usize,
    /// The next block a reader takes.
    next: usize,
    /// Per block: its buffer once read (taken back when the block is done).
    ready: Vec<Option<Aligned>>,
    failed: bool,
    stats: DirectStats,
}

impl Reader {
    /// [`Reader::read_many_into`] with every value read by the cold-read engine from this
    /// reader's open shard files: compressed values' chunks as in the module doc (each value
    /// checked end to end as there), uncompressed ones by [`crate::direct::read_direct`]
    /// straight into their buffers (crc checked after, with `verify`). Returns where the stored
    /// bytes came from (`in_place`: by `O_DIRECT` into place; `bounced`: by `O_DIRECT` through
    /// a bounce buffer; `buffered`: by `pread`). `follow_cache`: read the pieces whose pages
    /// are all cached with `pread` (`false`: everything by `O_DIRECT`, for a load already
    /// judged cold: see [`crate::direct::DirectFile::follow_cache`]).
    pub fn read_many_into_direct(
        &self,
        entries: &[Entry<'_>],
        dsts: Vec<&mut [u8]>,
        verify: bool,
        depth: usize,
        follow_cache: bool,
    ) -> Result<DirectStats> {
        check_outs(entries, &dsts)?;
        let (mut raw_e, mut raw_d, mut comp_e, mut comp_d) = (vec![], vec![], vec![], vec![]);
        for (e, d) in entries.iter().zip(dsts) {
            if e.codec == Codec::None {
                raw_e.push(e.clone());
                raw_d.push(d);
            } else {
                self.check_chunk_table(e)?;
                comp_e.push(e.clone());
                comp_d.push(d);
            }
        }
        let depth = depth.clamp(1, 64);
        let mut stats = DirectStats::default();
        if !raw_e.is_empty() {
            stats = self.direct_raw(&raw_e, raw_d, verify, depth, follow_cache)?;
        }
        let cb = self.index.chunk_bytes() as u64;
        if comp_e.is_empty() {
            return Ok(stats);
        }
        if buffer_cap(cb) > MAX_BUFFER {
            self.read_many_into(&comp_e, comp_d, true)?;
            return Ok(stats);
        }
        Ok(stats + self.direct_chunks(&comp_e, comp_d, depth, cb, follow_cache)?)
    }

    /// Uncompressed values by the cold-read engine ([`crate::direct::read_direct`]) from the
    /// shard files this reader opened (not their paths: a save at the same prefix since open
    /// removes them or puts other files there), then, with `verify`, each checked against its
    /// crc over the bytes landed.
    fn direct_raw(
        &self,
        entries: &[Entry<'_>],
        dsts: Vec<&mut [u8]>,
        verify: bool,
        depth: usize,
        follow_cache: bool,
    ) -> Result<DirectStats> {
        // the shards this call reads, each opened once (file index = place in `used`)
        let mut used: Vec<u32> = entries.iter().map(|e| e.shard).collect();
        used.sort_unstable();
        used.dedup();
        let mut files = Vec::with_capacity(used.len());
        for &i in &used {
            let s = &self.shards[i as usize];
            let file = s
                .file
                .try_clone()
                .map_err(|e| Error::io(&s.path, "open file", e))?;
            files.push(DirectFile {
                plain: PlainFile {
                    path: s.path.clone(),
                    file,
                    len: s.base + s.len(),
                },
                direct: reopen_direct(&s.file),
                follow_cache,
            });
        }
        let ranges: Vec<(usize, u64)> = entries
            .iter()
            .map(|e| {
                let fi = used
                    .binary_search(&e.shard)
                    .expect("every entry's shard is used");
                (fi, self.shards[e.shard as usize].base + e.offset)
            })
            .collect();
        // each value's crc computed by the engine's readers as its pieces land; each buffer is
        // the value's whole payload (`check_outs`: its raw length, which the index makes the
        // stored length of an uncompressed value)
        let (stats, crcs) = read_direct_crcs(&files, &ranges, dsts, depth, verify)?;
        for (e, crc) in entries.iter().zip(crcs) {
            self.expect_crc(e, crc)?;
        }
        Ok(stats)
    }

    fn direct_chunks(
        &self,
        entries: &[Entry<'_>],
        dsts: Vec<&mut [u8]>,
        depth: usize,
        cb: u64,
        follow_cache: bool,
    ) -> Result<DirectStats> {
        /// One chunk: its entry and index, where its stored bytes lie (shard, offset, length,
        /// recorded crc; checked by `chunk_loc`), and its destination.
        struct Item<'d> {
            entry: usize,
            chunk: usize,
            at: (u32, u64),
            stored: usize,
            crc: u32,
            dst: Mutex<Option<&'d mut [u8]>>,
        }
        let mut items: Vec<Item<'_>> = Vec::new();
        let mut of_entry: Vec<Vec<usize>> = Vec::with_capacity(entries.len());
        for (i, (e, out)) in entries.iter().zip(dsts).enumerate() {
            let mut mine = Vec::new();
            for (ci, o) in out.chunks_mut(cb as usize).enumerate() {
                let (off, stored, _, _, crc) = self.chunk_loc(e, ci)?;
                mine.push(items.len());
                items.push(Item {
                    entry: i,
                    chunk: ci,
                    at: (e.shard, off),
                    stored,
                    crc,
                    dst: Mutex::new(Some(o)),
                });
            }
            of_entry.push(mine);
        }
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_unstable_by_key(|&k| items[k].at);
        let mut blocks: Vec<Block> = Vec::new();
        let mut block_of = vec![0usize; order.len()];
        // stored bytes from the current block's start to the end of the call
        let mut rest: u64 = items.iter().map(|it| it.stored as u64).sum();
        let mut rest_at_block = rest;
        for (pos, &k) in order.iter().enumerate() {
            let (shard, off) = items[k].at;
            let end = off + items[k].stored as u64;
            let limit = block_limit(blocks.len().saturating_sub(1), rest_at_block, depth);
            match blocks.last_mut() {
                Some(b)
                    if b.shard == shard
                        && off >= b.hi
                        && off - b.hi <= MAX_GAP
                        && end - b.lo <= limit =>
                {
                    b.hi = end;
                    *b.left.get_mut() += 1;
                    b.bytes += end - off;
                }
                _ => {
                    rest_at_block = rest;
                    blocks.push(Block {
                        shard,
                        lo: off,
                        hi: end,
                        bytes: end - off,
                        left: AtomicUsize::new(1),
                    })
                }
            }
            rest -= items[k].stored as u64;
            block_of[pos] = blocks.len() - 1;
        }
        // the shards' own open files: a save at the same prefix since open may have removed
        // them or put other files at their paths
        // (only the shards this call reads: a checkpoint of many shards reads a few per call)
        let mut files: Vec<Option<std::fs::File>> = self.shards.iter().map(|_| None).collect();
        let mut opened = vec![false; self.shards.len()];
        for b in &blocks {
            let i = b.shard as usize;
            if !std::mem::replace(&mut opened[i], true) {
                files[i] = reopen_direct(&self.shards[i].file);
            }
        }
        let cap = buffer_cap(cb);
        let pool = depth + 2;
        let state = Mutex::new(State {
            free: Vec::new(),
            unmade: pool,
            next: 0,
            ready: (0..blocks.len()).map(|_| None).collect(),
            failed: false,
            stats: DirectStats::default(),
        });
        let changed = Condvar::new();
        let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
        let fail = || {
            lock().failed = true;
            changed.notify_all();
        };
        let cancel = crate::cancel::current();
        // The first error of a reader or a worker (the others stop on `failed` without one).
        let cause: Mutex<Option<Error>> = Mutex::new(None);
        let record = |e: Error| -> Error {
            let mut c = cause.lock().unwrap_or_else(|p| p.into_inner());
            if c.is_none() && !(matches!(e, Error::Cancelled) && lock().failed) {
                *c = Some(e);
            }
            drop(c);
            fail();
            Error::Cancelled
        };
        // A reader: a buffer and the next block (taken together), read, published.
        let reader = || -> Result<()> {
            loop {
                let (bi, mut buf) = {
                    let mut st = lock();
                    loop {
                        if st.failed || st.next >= blocks.len() {
                            return Ok(());
                        }
                        let got = match st.free.pop() {
                            Some(b) => b,
                            None if st.unmade > 0 => {
                                st.unmade -= 1;
                                take_buffer(cap)?
                            }
                            None => {
                                st = changed.wait(st).unwrap_or_else(|p| p.into_inner());
                                continue;
                            }
                        };
                        st.next += 1;
                        break (st.next - 1, got);
                    }
                };
                cancel.check()?;
                let b = &blocks[bi];
                let direct = files[b.shard as usize].as_ref();
                let how = self.read_block(b, direct, &mut buf, follow_cache)?;
                let mut st = lock();
                match how {
                    true => {
                        st.stats.in_place += b.bytes;
                        st.stats.requests += 1;
                    }
                    false => st.stats.buffered += b.bytes,
                }
                st.ready[bi] = Some(buf);
                drop(st);
                changed.notify_all();
            }
        };
        let crcs: Vec<OnceLock<(u32, usize)>> = (0..items.len()).map(|_| OnceLock::new()).collect();
        let worker = |pos: usize| -> Result<()> {
            cancel.check()?;
            let k = order[pos];
            let bi = block_of[pos];
            let b = &blocks[bi];
            let it = &items[k];
            let (e, off, n) = (&entries[it.entry], it.at.1, it.stored);
            let dst = it
                .dst
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each chunk is taken once");
            // Wait for the block; the decode runs outside the lock, on a shared borrow of the
            // buffer, which stays in `ready` until this block's last chunk is done.
            let base: *const u8 = {
                let mut st = lock();
                loop {
                    if let Some(buf) = &st.ready[bi] {
                        break buf.as_slice().as_ptr();
                    }
                    if st.failed {
                        return Err(Error::Cancelled);
                    }
                    st = changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let base_off = self.shards[b.shard as usize].base;
            let from = (off + base_off - align_down(b.lo + base_off)) as usize;
            // SAFETY: the buffer holds the block's aligned extent (read_block checked its
            // length), `from + n` lies inside it, and it is neither written nor freed until
            // `left` reaches zero below, after this borrow ends.
            let stored = unsafe { std::slice::from_raw_parts(base.add(from), n) };
            let got = match self.decode_stored_checked(e, it.chunk, stored, off, it.crc, dst) {
                Ok(c) => c,
                Err(err @ Error::Corrupt { .. }) => {
                    self.verify_entry(e)?;
                    return Err(err);
                }
                Err(err) => return Err(err),
            };
            let _ = crcs[k].set((got, dst.len()));
            if b.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                let mut st = lock();
                if let Some(buf) = st.ready[bi].take() {
                    st.free.push(buf);
                }
                drop(st);
                changed.notify_all();
            }
            Ok(())
        };
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..depth.min(blocks.len()))
                .filter_map(|_| {
                    std::thread::Builder::new()
                        .name("shardpoint-direct".into())
                        .spawn_scoped(s, || {
                            if let Err(e) = reader() {
                                record(e);
                            }
                        })
                        .ok()
                })
                .collect();
            // (no blocks: only empty compressed values, which our writers store uncompressed)
            if readers.is_empty() && !blocks.is_empty() {
                record(Error::InvalidArgument(
                    "cannot start a direct-read thread".into(),
                ));
            } else {
                let _ =
                    crate::load::for_each_ordered(order.len(), |pos| worker(pos).map_err(&record));
            }
            fail(); // readers waiting for a buffer after an error stop
            for h in readers {
                let _ = h.join();
            }
        });
        let mut st = state.into_inner().unwrap_or_else(|p| p.into_inner());
        give_back(std::mem::take(&mut st.free), cap);
        if let Some(e) = cause.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let crcs: Vec<(u32, usize)> = crcs
            .into_iter()
            .map(|c| c.into_inner().expect("every chunk was decoded"))
            .collect();
        self.check_whole(entries, &of_entry, &crcs, true)?;
        Ok(st.stats)
    }

    /// Read block `b`'s aligned extent into `buf`: with `O_DIRECT` when the file system takes
    /// it and (with `follow_cache`) not all its pages are in the page cache (`Ok(true)`), else
    /// with `pread`.
    fn read_block(
        &self,
        b: &Block,
        direct: Option<&std::fs::File>,
        buf: &mut Aligned,
        follow_cache: bool,
    ) -> Result<bool> {
        let shard = &self.shards[b.shard as usize];
        let (lo, hi) = (b.lo + shard.base, b.hi + shard.base);
        let start = align_down(lo);
        let want = (hi - start) as usize;
        let whole = align_up(hi) - start;
        let out = &mut buf.bytes()[..whole as usize];
        if let Some(d) = direct {
            if !(follow_cache && looks_cached(&shard.file, lo, hi - lo)) {
                match direct_read(d, start, out) {
                    Ok(got) if got >= want => return Ok(true),
                    Ok(_) => return Err(shard.truncated(b.hi)),
                    Err(DirectErr::Refused) => {}
                    Err(DirectErr::Io(e)) => {
                        return Err(Error::Io {
                            path: shard.path.clone(),
                            op: "read shard",
                            source: e,
                        })
                    }
                }
            }
        }
        shard.read_at(b.lo, &mut out[(lo - start) as usize..want])?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_ramp_up_from_the_first_and_down_to_the_last() {
        let big = 1u64 << 40; // far from the end of the call
        assert_eq!(block_limit(0, big, 8), FIRST_BLOCK);
        assert_eq!(block_limit(1, big, 8), 2 * FIRST_BLOCK);
        assert_eq!(block_limit(7, big, 8), BLOCK);
        assert_eq!(block_limit(100, big, 8), BLOCK);
        // the end of the call: a block at most 1/(2 depth) of what is left, never below the
        // first block's size
        assert_eq!(block_limit(100, 16 * (1 << 20), 8), 1 << 20);
        assert_eq!(block_limit(100, 1 << 20, 8), FIRST_BLOCK);
        assert_eq!(block_limit(100, 0, 1), FIRST_BLOCK);
    }
}
