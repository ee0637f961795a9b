//! The merge's order cache: like DCP's plan cache, the coordinator remembers the output order
//! of its last merge at each prefix (which rank each merged entry came from), so a save whose
//! layout did not change (every rank writes the same keys again) skips the k-way heap.
//!
//! Nothing here is trusted. A cached order is only a guess at the order; [`merge_in_order`]
//! copies the entries in that order through the same validation as the heap merge
//! (`entry_raw`) and the builder's check that every key is strictly above the one before it,
//! and the order must consume every entry of every partial exactly once. A strictly increasing
//! sequence holding every entry once is the one sorted merge there is, so the index it builds
//! is byte for byte the heap's; any mismatch (a rank's keys added, removed or renamed, a
//! duplicate, a different world size) fails the guess and the caller merges with the heap.
//! So a partial whose keys changed cannot produce a wrong index: it costs the fallback.

use crate::error::{Error, Result};
use crate::index::SortedIndexBuilder;
use crate::index::{IndexSource, IndexView};
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

/// The output order of one merge: per rank, its entry count, and for each merged entry, the
/// rank it came from.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct MergeOrder {
    counts: Vec<u64>,
    ranks: Vec<u32>,
}

impl MergeOrder {
    /// The order recorded while merging: `ranks[i]` is the rank of merged entry `i`.
    pub(super) fn new(ranks: Vec<u32>, world_size: usize) -> Self {
        let mut counts = vec![0u64; world_size];
        for &r in &ranks {
            counts[r as usize] += 1;
        }
        MergeOrder { counts, ranks }
    }

    /// Whether the partials have exactly the entry counts this order was made for (a cheap
    /// first test; the real one is the merge in order).
    pub(super) fn fits<B: IndexSource>(&self, partials: &[Partial<B>]) -> bool {
        self.counts.len() == partials.len()
            && self
                .counts
                .iter()
                .zip(partials)
                .all(|(&c, p)| c == p.view.len() as u64)
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

/// Copy the entries of `partials` into `out` in `order`, each validated as the heap merge
/// validates it. An error means the order does not fit these partials (or an entry is bad):
/// the caller then merges with the heap, from a fresh builder, which reports what is wrong.
pub(super) fn merge_in_order<B: IndexSource>(
    partials: &[Partial<B>],
    order: &MergeOrder,
    out: &mut SortedIndexBuilder,
) -> Result<()> {
    let stale = || Error::InvalidArgument("the cached merge order does not fit".into());
    if !order.fits(partials) {
        return Err(stale());
    }
    let mut pos = vec![0usize; partials.len()];
    for &r in &order.ranks {
        let r = r as usize;
        let p = partials.get(r).ok_or_else(stale)?;
        // out of range (the order names this rank too often) is an error here
        let e = p.view.entry_raw(pos[r])?;
        let mut rec = e.rec;
        rec.shard += p.shard_base;
        // checks that this key is strictly above the one before it
        out.push(rec, e.key.as_bytes(), e.aux)?;
        pos[r] += 1;
    }
    // every entry of every partial, once: the counts fit and no rank was taken too often
    if pos.iter().zip(partials).any(|(&i, p)| i != p.view.len()) {
        return Err(stale());
    }
    Ok(())
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
