//! The merge's order cache: like DCP's plan cache, the coordinator remembers the output order
//! of its last merge at each prefix (which rank each merged entry came from), so a save whose
//! layout did not change (every rank writes the same keys again) skips the k-way heap.
//!
//! Nothing here is trusted. A cached order is only a guess at the order; [`Placing`] writes
//! each partial's entries, as soon as the partial is read, to the places the order gives
//! them, each through the same validation as the heap merge (`entry_raw`), and then checks
//! in key order that every key is strictly above the one before it and that every place
//! was written exactly once (index/sorted/placed.rs). A strictly increasing
//! sequence holding every entry once is the one sorted merge there is, so the index it builds
//! is byte for byte the heap's; any mismatch (a rank's keys added, removed or renamed, a
//! duplicate, a different world size) fails the guess and the caller merges with the heap.
//! So a partial whose keys changed cannot produce a wrong index: it costs the fallback.

use crate::error::{Error, Result};
use crate::index::{IndexSource, IndexView, Slots, SortedIndexBuilder};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One validated partial index, kept until the merge has copied its entries. (Here, not in
/// `merge`, so that `merge` uses this module and this module uses nothing of `merge`.)
pub(super) struct Partial<B: IndexSource> {
    pub(super) view: IndexView<B>,
    /// Where this partial's shards start in the merged shard table.
    pub(super) shard_base: u32,
}

/// How many prefixes the process remembers an order for. An order costs 4 bytes per entry
/// (1.6 MB at 4,096 ranks x 100 tensors); a coordinator saves to one or a few prefixes.
const REMEMBERED: usize = 4;

/// The output order of one merge, in the form the next merge places entries with: per rank,
/// its entry count; for each entry, rank by rank, its position in the merged index; where
/// each merged entry's key and aux bytes start in the index's blobs; the shard count.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct MergeOrder {
    counts: Vec<u64>,
    /// `dest[base(r) + j]`: the merged position of rank `r`'s entry `j` (`base(r)`: the
    /// counts of the ranks before `r`).
    dest: Vec<u32>,
    /// In key order, where each entry's key (aux) bytes start, and the blob's length last.
    key_at: Vec<u32>,
    aux_at: Vec<u32>,
    shards: usize,
}

impl MergeOrder {
    /// The order of a merge of `world_size` partials into `shards` shards: merged entry `i`
    /// came from rank `ranks[i]` and has a key of `key_lens[i]` and `aux_lens[i]` aux bytes.
    /// `None` when it cannot be placed from (a rank out of range, lengths that disagree, or
    /// blobs of 4 GiB or more): then nothing is remembered and the next merge uses the heap.
    pub(super) fn new(
        ranks: &[u32],
        key_lens: &[u32],
        aux_lens: &[u32],
        world_size: usize,
        shards: usize,
    ) -> Option<Self> {
        let n = ranks.len();
        if key_lens.len() != n || aux_lens.len() != n || u32::try_from(n).is_err() {
            return None;
        }
        let mut counts = vec![0u64; world_size];
        for &r in ranks {
            *counts.get_mut(r as usize)? += 1;
        }
        let mut next: Vec<usize> = counts
            .iter()
            .scan(0usize, |at, &c| {
                let start = *at;
                *at += c as usize;
                Some(start)
            })
            .collect();
        let mut dest = vec![0u32; n];
        for (i, &r) in ranks.iter().enumerate() {
            dest[next[r as usize]] = i as u32;
            next[r as usize] += 1;
        }
        let starts = |lens: &[u32]| -> Option<Vec<u32>> {
            let mut v = Vec::with_capacity(n + 1);
            let mut at = 0u32;
            v.push(0);
            for &l in lens {
                at = at.checked_add(l)?;
                v.push(at);
            }
            Some(v)
        };
        Some(MergeOrder {
            counts,
            dest,
            key_at: starts(key_lens)?,
            aux_at: starts(aux_lens)?,
            shards,
        })
    }

    fn slots(&self) -> Slots<'_> {
        Slots {
            key_at: &self.key_at,
            aux_at: &self.aux_at,
        }
    }
}

/// A merge in a remembered order under way: each partial's entries are validated and
/// written to their places in the index as soon as the partial is read and verified, front
/// to back while its bytes are in cache (index/sorted/placed.rs). Any misfit ends it and
/// the caller merges with the heap, from a fresh builder, which reports what is wrong.
pub(super) struct Placing {
    order: Arc<MergeOrder>,
    out: SortedIndexBuilder,
    /// The next rank to place, and where its entries start in `order.dest`.
    rank: usize,
    next: usize,
}

fn stale() -> Error {
    Error::InvalidArgument("the cached merge order does not fit".into())
}

impl Placing {
    /// Start placing a merge of `world_size` partials in `order`, building in `buf`.
    /// `None` when the order was made for another world size.
    pub(super) fn start(order: Arc<MergeOrder>, world_size: usize, buf: Vec<u8>) -> Option<Self> {
        if order.counts.len() != world_size {
            return None;
        }
        let n = order.dest.len();
        let (k, a) = (order.key_at[n] as usize, order.aux_at[n] as usize);
        let out = SortedIndexBuilder::with_shape_in(buf, order.shards, n, k, a).ok()?;
        out.check_slots(order.slots()).ok()?;
        Some(Placing {
            order,
            out,
            rank: 0,
            next: 0,
        })
    }

    /// Validate the entries of the next rank's partial `p` as the heap merge does
    /// (`entry_raw`) and write each to its place. An error means the order does not fit.
    pub(super) fn place<B: IndexSource>(&mut self, p: &Partial<B>) -> Result<()> {
        let Placing {
            order,
            out,
            rank,
            next,
        } = self;
        let len = p.view.len();
        if order.counts.get(*rank) != Some(&(len as u64)) {
            return Err(stale());
        }
        let dest = &order.dest[*next..*next + len];
        let slots = order.slots();
        for (j, &d) in dest.iter().enumerate() {
            let e = p.view.entry_raw(j)?;
            let mut rec = e.rec;
            // In range: entry_raw checked the shard against this partial's table.
            rec.shard += p.shard_base;
            out.place(d as usize, rec, e.key.as_bytes(), e.aux, slots)?;
        }
        *rank += 1;
        *next += len;
        Ok(())
    }

    /// After the last partial: the builder, every entry placed and checked in key order
    /// (`seal_placed`), when the merge's shape (`shards`, entries, key and aux bytes) is the
    /// order's; else the buffer back, for the heap.
    pub(super) fn seal(
        self,
        shards: usize,
        shape: (usize, u64, u64),
    ) -> std::result::Result<SortedIndexBuilder, Vec<u8>> {
        let Placing {
            order,
            mut out,
            rank,
            ..
        } = self;
        let n = order.dest.len();
        let fits = rank == order.counts.len()
            && shards == order.shards
            && shape == (n, order.key_at[n] as u64, order.aux_at[n] as u64);
        if fits && out.seal_placed(order.slots()).is_ok() {
            Ok(out)
        } else {
            Err(out.into_buffer())
        }
    }

    /// The builder's buffer, for the heap merge that replaces a failed placing.
    pub(super) fn into_buffer(self) -> Vec<u8> {
        self.out.into_buffer()
    }
}

/// The cache, most recent first: (where the merged index goes, its order).
static CACHE: Mutex<Vec<(String, Arc<MergeOrder>)>> = Mutex::new(Vec::new());

fn cache() -> std::sync::MutexGuard<'static, Vec<(String, Arc<MergeOrder>)>> {
    // a poisoned cache only holds guesses, each checked before use
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The order of the last merge at `at`, if this process made one.
pub(super) fn recall(at: &str) -> Option<Arc<MergeOrder>> {
    cache()
        .iter()
        .find(|(k, _)| k == at)
        .map(|(_, o)| Arc::clone(o))
}

/// Remember `order` as the last merge's at `at` (forgetting the least recent prefix beyond
/// [`REMEMBERED`]).
pub(super) fn remember(at: &str, order: Arc<MergeOrder>) {
    let mut c = cache();
    c.retain(|(k, _)| k != at);
    c.insert(0, (at.to_string(), order));
    c.truncate(REMEMBERED);
}

/// Forget the order remembered for `at` (a merge there failed).
pub(super) fn forget(at: &str) {
    cache().retain(|(k, _)| k != at);
}

/// Merges that took a remembered order, and remembered orders that did not fit (then the
/// heap merged): what tests and benchmarks read to see which path a merge took.
static IN_ORDER: AtomicU64 = AtomicU64::new(0);
static MISFITS: AtomicU64 = AtomicU64::new(0);

/// Count one try of a remembered order.
pub(super) fn count(fitted: bool) {
    if fitted { &IN_ORDER } else { &MISFITS }.fetch_add(1, Ordering::Relaxed);
}

/// (merges made in a remembered order, remembered orders that did not fit) in this process.
pub fn stats() -> (u64, u64) {
    (
        IN_ORDER.load(Ordering::Relaxed),
        MISFITS.load(Ordering::Relaxed),
    )
}

/// Forget every remembered order (the next merge at each prefix uses the heap).
pub fn forget_all() {
    cache().clear();
}
