//! Whole values into caller-owned buffers: one value, or many in file order with read-ahead
//! (the bulk-load path of [`crate::load`]), and a value streamed piece by piece through a fold.

use super::{Reader, READ_PIECE};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::Entry;
use rayon::prelude::*;
use std::sync::{Mutex, OnceLock};

thread_local! {
    /// Per-thread buffer for decoded pieces streamed through [`Reader::fold_pieces`].
    static DECODE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output buffers for `entries`: one each, each exactly its entry's raw length.
pub(super) fn check_outs(entries: &[Entry<'_>], dsts: &[&mut [u8]]) -> Result<()> {
    if entries.len() != dsts.len() {
        return Err(Error::InvalidArgument(format!(
            "{} entries but {} output buffers",
            entries.len(),
            dsts.len()
        )));
    }
    match entries
        .iter()
        .zip(dsts)
        .find(|(e, d)| d.len() as u64 != e.raw_len)
    {
        Some((e, d)) => Err(Error::InvalidArgument(format!(
            "key {:?}: output buffer has {} bytes, need {}",
            e.key,
            d.len(),
            e.raw_len
        ))),
        None => Ok(()),
    }
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

impl Reader {
    /// Read the whole entry into `out` (exactly `raw_len` bytes), decompressing chunks in
    /// parallel. Compressed entries are always checked end to end (chunk crcs and the raw crc);
    /// raw entries are checked when `verify`.
    pub fn read_into(&self, e: &Entry<'_>, out: &mut [u8], verify: bool) -> Result<()> {
        self.read_many_into(std::slice::from_ref(e), vec![out], verify)
    }

    /// Read many entries into caller-owned buffers (each exactly its entry's `raw_len`, none
    /// overlapping): the bulk-load path (see [`crate::load`]). Work items (pieces of
    /// uncompressed payloads, chunks of compressed ones) are taken in file order by every
    /// worker while a helper thread reads ahead of them; uncompressed pieces lying end to end
    /// are read as runs (one `preadv` per cache-sized block fills several values' own
    /// buffers, each part crc'd while in cache when `verify`: [`crate::runs`]), a chunk is
    /// decoded with its crc. Compressed entries are always checked end to end; uncompressed ones when `verify`.
    /// On an error some buffers may hold new bytes and others not.
    pub fn read_many_into(
        &self,
        entries: &[Entry<'_>],
        dsts: Vec<&mut [u8]>,
        verify: bool,
    ) -> Result<()> {
        use crate::load::{for_each_ordered, with_read_ahead, Span, RAW_PIECE};
        check_outs(entries, &dsts)?;
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
        // Work units: runs of raw pieces lying end to end in one shard (one `preadv` per block
        // fills them all, crate::runs), and each compressed chunk alone.
        let keyed: Vec<((u32, usize), u64, u64)> = order
            .iter()
            .map(|&k| {
                let it = &items[k];
                let alone = if it.chunk == usize::MAX {
                    usize::MAX
                } else {
                    k
                };
                ((it.at.0, alone), it.at.1, it.stored)
            })
            .collect();
        let units = crate::runs::group(&keyed);
        let take = |k: usize| -> &mut [u8] {
            items[k]
                .dst
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each item is taken once")
        };
        // Ctrl-C (crate::cancel): checked between items, on the workers, against the caller's
        // token.
        let cancel = crate::cancel::current();
        with_read_ahead(&spans, |progress| {
            for_each_ordered(units.len(), |u| {
                cancel.check()?;
                let run = &order[units[u].clone()];
                let first = &items[run[0]];
                let e = &entries[first.entry];
                let shard = &self.shards[e.shard as usize];
                if first.chunk == usize::MAX {
                    let mut segs: Vec<crate::runs::Seg<'_>> = run
                        .iter()
                        .map(|&k| crate::runs::Seg {
                            offset: items[k].at.1,
                            dst: take(k),
                        })
                        .collect();
                    let got =
                        crate::runs::read_run(&shard.file, shard.base, &mut segs, verify, |f| {
                            match f {
                                crate::runs::RunFailure::Short { end, .. } => shard.truncated(end),
                                crate::runs::RunFailure::Io(source) => Error::Io {
                                    path: shard.path.clone(),
                                    op: "read shard",
                                    source,
                                },
                            }
                        })?;
                    for ((&k, s), c) in run.iter().zip(&segs).zip(got) {
                        let _ = crcs[k].set((c, s.dst.len()));
                        progress.consumed(items[k].stored);
                    }
                    return Ok(());
                }
                let k = run[0];
                let dst = take(k);
                let c = match self.decode_chunk_checked(e, first.chunk, dst) {
                    Ok(c) => c,
                    // A decoder error on damaged bytes: the chunk crcs name the damage
                    // better.
                    Err(err @ Error::Corrupt { .. }) => {
                        self.verify_entry(e)?;
                        return Err(err);
                    }
                    Err(err) => return Err(err),
                };
                let _ = crcs[k].set((c, dst.len()));
                progress.consumed(first.stored);
                Ok(())
            })
        })?;
        let crcs: Vec<(u32, usize)> = crcs
            .into_iter()
            .map(|c| c.into_inner().expect("all items ran"))
            .collect();
        self.check_whole(entries, &of_entry, &crcs, verify)
    }

    /// Check each entry's raw crc32c against the crcs of its items (`of_entry[i]`: the items
    /// of entry `i` in payload order, `crcs[k]`: item `k`'s crc and length); a compressed
    /// entry whose decoded bytes differ is verified chunk by chunk first, to name the damaged
    /// chunk. Uncompressed entries are checked only when `verify`.
    pub(super) fn check_whole(
        &self,
        entries: &[Entry<'_>],
        of_entry: &[Vec<usize>],
        crcs: &[(u32, usize)],
        verify: bool,
    ) -> Result<()> {
        for (i, e) in entries.iter().enumerate() {
            if e.codec == Codec::None && !verify {
                continue;
            }
            let whole = if of_entry[i].is_empty() {
                crc(&[])
            } else {
                combine_crcs(of_entry[i].iter().map(|&k| crcs[k]))
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
}
