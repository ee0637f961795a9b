//! The multi-writer merge (FORMAT.md §8, step 4) and the index metadata JSON it reads.
//!
//! Every writer of a multi-writer save publishes a *partial index* (same format as `P.index`)
//! whose metadata carries a `"partial"` marker. [`merge`] validates the partials of one save,
//! renumbers their shards, merges the sorted entry records and commits `P.index`; no payload
//! bytes are copied. The metadata blob is JSON we wrote ourselves, parsed here with serde_json
//! (the user's part is carried through verbatim as raw JSON).

use crate::commit::{cleanup, commit_without_cleanup, Orphans, PrefixLock};
use crate::digest::{manifest_extra, DigestAlgo, FileDigest, Manifest};
use crate::error::{Error, Result};
use crate::format::{DEFAULT_CHUNK_BYTES, FORMAT_VERSION};
use crate::index::{IndexSource, IndexView, ShardRec, SortedIndexBuilder};
use crate::naming::{partial_suffix_in, with_suffix};
use crate::store::{block_on, remote_commit, spawn, Location, MERGE_READS_IN_FLIGHT};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::cmp::Reverse;
use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) mod kept;
mod order;
use order::Partial;
pub use order::{forget_all as forget_merge_orders, stats as merge_order_stats};

/// The metadata blob stored in an index:
/// `{"format":V,"writer":"shardpoint X.Y.Z"<extra>[,"sections":"<JSON text>"],"user":<user>}`.
/// `extra` is empty or starts with a comma (`,"writers":N` after a merge, `,"partial":{...}`
/// in a partial index); the library's own sections (`sections_json`, empty for none) are
/// stored as a JSON *string* holding the sections object, apart from the user's metadata.
pub(crate) fn meta_blob(user_json: &str, extra: &str, sections_json: &str) -> String {
    let sections = if sections_json.is_empty() {
        String::new()
    } else {
        format!(",\"sections\":{}", json_string(sections_json))
    };
    format!(
        "{{\"format\":{FORMAT_VERSION},\"writer\":\"shardpoint {}\"{extra}{sections},\"user\":{user_json}}}",
        env!("CARGO_PKG_VERSION")
    )
}

/// `text` as a JSON string literal (control characters as `\u00XX`).
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `"partial"` marker of writer `rank` of `world_size` (`token`: this writer's random id;
/// `merge_token`: the id shared by the writers of one save, checked by [`merge`]).
pub(crate) fn partial_marker(rank: u32, world_size: u32, token: u64, merge_token: &str) -> String {
    format!(
        ",\"partial\":{{\"rank\":{rank},\"world_size\":{world_size},\"token\":\"{token:016x}\",\"merge_token\":\"{merge_token}\"}}"
    )
}

/// The fields of a stored metadata blob that the merge reads.
#[derive(Deserialize)]
struct StoredMeta<'a> {
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(default)]
    partial: Option<PartialMarker>,
    /// The library's sections object, as JSON text (see [`meta_blob`]).
    #[serde(default)]
    sections: Option<String>,
    /// The digest manifest of the partial's shards (FORMAT.md §7.1).
    #[serde(default)]
    digest: Option<Manifest>,
}

#[derive(Deserialize)]
struct PartialMarker {
    #[serde(default)]
    merge_token: String,
}

/// Merge the `world_size` partial indexes of `prefix` into `P.index` and commit it. No payload
/// bytes are copied. Duplicate keys across writers are an error naming both ranks; partials
/// whose merge tokens differ (from each other, or from `token` when given) are refused.
pub fn merge(prefix: &Path, world_size: u32, durable: bool, token: Option<&str>) -> Result<()> {
    merge_local(prefix, world_size, durable, token, false)
}

/// [`merge`]; with `background_cleanup`, the replaced checkpoint's files and the consumed
/// partial indexes are removed by a thread that holds the commit lock until it is done
/// ([`crate::background_cleanup`]): this returns once `P.index` is committed.
pub fn merge_local(
    prefix: &Path,
    world_size: u32,
    durable: bool,
    token: Option<&str>,
    background_cleanup: bool,
) -> Result<()> {
    merge_local_in(
        prefix,
        world_size,
        durable,
        token,
        background_cleanup,
        false,
    )
}

/// [`merge_local`] of partial indexes named in the form the writers chose: `hashed`, at
/// `P/HH/index.part-…` (writers with `hashed_prefixes`, FORMAT.md §3.1.1), else at
/// `P.index.part-…`. Only that form is read; a partial missing there but present in the other
/// form is an error saying which option to pass.
pub fn merge_local_in(
    prefix: &Path,
    world_size: u32,
    durable: bool,
    token: Option<&str>,
    background_cleanup: bool,
    hashed: bool,
) -> Result<()> {
    if world_size == 0 {
        return Err(Error::InvalidArgument("world_size must be >= 1".into()));
    }
    let lock = PrefixLock::acquire(prefix)?;
    let at = prefix.to_string_lossy();
    // The partials are read into one arena kept between merges (merge/kept.rs), each
    // validated right after its read; the index is built in the kept index buffer. The arena
    // goes back to be kept whether the merge succeeded or not.
    let mut arena = kept::Arena::take();
    // an empty arena (the process's first merge) is sized from the first partial (a save's
    // partials are alike), with room to spare
    let first = with_suffix(prefix, &partial_suffix_in(0, world_size, hashed));
    let first = std::fs::metadata(first).map_or(0, |m| m.len());
    let first = usize::try_from(first).unwrap_or(usize::MAX);
    let mut reader = arena.reader(first.saturating_mul(world_size as usize + 1));
    let merged = merge_partials(world_size, token, &at, kept::take_index(), |rank| {
        let p = with_suffix(prefix, &partial_suffix_in(rank, world_size, hashed));
        let bytes = reader
            .read_file(&p, "read partial index (did every writer commit?)")
            .map_err(|e| {
                // the failure path only: say which option to pass when the other form is there
                let other = with_suffix(prefix, &partial_suffix_in(rank, world_size, !hashed));
                if !p.exists() && other.exists() {
                    let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
                    Error::io(&p, other_form_hint(hashed), gone)
                } else {
                    e
                }
            })?;
        Ok((p, bytes))
    });
    let needed = reader.needed();
    arena.give_back(needed);
    commit_merged(prefix, merged?, durable, lock, background_cleanup, None)
}

/// Commit the merged index `m` at local `prefix` (under `lock`), then remove what it made
/// unreferenced (the consumed partials, the replaced shards) now or, with
/// `background_cleanup`, on a thread that owns the lock until it is done. `listed`: `P`'s files
/// as listed under this lock before the commit (the in-memory merge's liveness check), which
/// the cleanup then uses instead of listing the directory a second time.
pub(crate) fn commit_merged(
    prefix: &Path,
    m: Merged,
    durable: bool,
    lock: PrefixLock,
    background_cleanup: bool,
    listed: Option<Vec<(String, PathBuf)>>,
) -> Result<()> {
    crate::fault::point("merge.read");
    let committed = commit_without_cleanup(prefix, &m.shards, Ok(&m.index), durable, &lock);
    kept::keep_index(m.index);
    let (keep, mut orphans) = committed?;
    if let (Orphans::Locked, Some(names)) = (&orphans, listed) {
        orphans = Orphans::Listed(names); // listed under this lock: not listed again
    }
    if background_cleanup {
        // the thread owns the lock until it is done (FORMAT.md §8.3)
        crate::background_cleanup::spawn(prefix.to_path_buf(), keep, orphans, lock);
    } else {
        cleanup(prefix, &keep, &orphans);
    }
    Ok(())
}

/// [`merge`] for a local prefix or an object-store URL (there the merged index is committed
/// conditionally, FORMAT.md §8.2, and the consumed partial indexes are deleted). The partial
/// indexes are read in parallel, [`MERGE_READS_IN_FLIGHT`] at a time.
pub fn merge_at(loc: &Location, world_size: u32, durable: bool, token: Option<&str>) -> Result<()> {
    merge_at_with(loc, world_size, durable, token, false)
}

/// [`merge_at`]; `background_cleanup` as in [`merge_local`] (a local prefix only: an object
/// store's cleanup is one bulk delete per 1,000 keys, made before this returns).
pub fn merge_at_with(
    loc: &Location,
    world_size: u32,
    durable: bool,
    token: Option<&str>,
    background_cleanup: bool,
) -> Result<()> {
    merge_at_in(loc, world_size, durable, token, background_cleanup, false)
}

/// [`merge_at_with`] of partial indexes in the form the writers chose (`hashed`: at
/// `P/HH/index.part-…`, FORMAT.md §3.1.1; see [`merge_local_in`]).
pub fn merge_at_in(
    loc: &Location,
    world_size: u32,
    durable: bool,
    token: Option<&str>,
    background_cleanup: bool,
    hashed: bool,
) -> Result<()> {
    let rp = match loc {
        Location::Local(p) => {
            return merge_local_in(p, world_size, durable, token, background_cleanup, hashed)
        }
        Location::Remote(rp) => rp,
    };
    if world_size == 0 {
        return Err(Error::InvalidArgument("world_size must be >= 1".into()));
    }
    let seen = remote_commit::observe(rp)?;
    let suffixes: Vec<String> = (0..world_size)
        .map(|rank| partial_suffix_in(rank, world_size, hashed))
        .collect();
    // The partial indexes are fetched MERGE_READS_IN_FLIGHT at a time on the I/O runtime
    // (spawned, so they progress while this thread validates the ones already here) and
    // consumed in rank order: the merge's wall time is about N / MERGE_READS_IN_FLIGHT
    // round trips instead of N, and at most that many partials are held in memory unread.
    // (`map` is lazy: `buffered` spawns a read only when one of the 64 slots is free.)
    let mut reads = futures::stream::iter(
        suffixes
            .iter()
            .map(|s| spawn(rp.store.get_future(&rp.key_of(s)))),
    )
    .buffered(MERGE_READS_IN_FLIGHT);
    let at = rp.url_of("");
    // (the index is handed to the store, so no buffer is kept for it here)
    let m = merge_partials(
        world_size,
        token,
        &at.to_string_lossy(),
        Vec::new(),
        |rank| {
            let suffix = &suffixes[rank as usize];
            let got = block_on(reads.next()).ok_or_else(|| {
                Error::InvalidArgument(format!("no read for the partial index of rank {rank}"))
            })?;
            let got = got.map_err(|e| Error::Io {
                path: rp.url_of(suffix),
                op: "read partial index",
                source: std::io::Error::other(e.to_string()),
            })?;
            let (bytes, _) = got.map_err(|e| match e {
                Error::NotFound { path, .. } => {
                    // the failure path only: one more request, to say which option to pass
                    let other = rp.key_of(&partial_suffix_in(rank, world_size, !hashed));
                    let what = match rp.store.head(&other) {
                        Ok(Some(_)) => other_form_hint(hashed),
                        _ => "read partial index (did every writer commit?)",
                    };
                    Error::NotFound {
                        path,
                        what: what.into(),
                    }
                }
                e => e,
            })?;
            Ok((rp.url_of(suffix), bytes))
        },
    )?;
    drop(reads);
    crate::fault::point("merge.read");
    // The consumed partial indexes go in the same bulk delete as the replaced shards.
    remote_commit::commit_index_bytes(rp, seen, &m.shards, m.index, &suffixes)
}

/// What a merge says when a partial index is missing in the form it reads but present in the
/// other one: the writers' `hashed_prefixes` and the merge's differ.
fn other_form_hint(hashed: bool) -> &'static str {
    if hashed {
        "read partial index (the writers saved without hashed_prefixes: merge without it too)"
    } else {
        "read partial index (the writers saved with hashed_prefixes=True: pass it to the merge too)"
    }
}

/// The merged content of a multi-writer save, ready to commit: the shard table and the
/// serialized `P.index`.
#[derive(Debug)]
pub(crate) struct Merged {
    pub(crate) shards: Vec<ShardRec>,
    pub(crate) index: Vec<u8>,
    /// Whether the entries were copied in the order remembered from the last merge at the
    /// same place (else the heap merged them).
    #[cfg_attr(not(test), allow(dead_code))] // what the tests read
    in_order: bool,
}

/// Validate and merge the partial indexes `load(rank)` returns (path for messages, bytes)
/// into the index that goes to `at` (the key of its order in the [`order`] cache), built in
/// `index_buf` (its capacity reused, its contents discarded; [`Merged::index`] is it).
///
/// Each partial is verified whole (header, crcs, every block, its keys strictly sorted), then
/// the sorted partials are merged k ways: a heap of one cursor per partial ordered by the
/// cursor's key (borrowed from the partial's bytes), each entry validated as a reader would
/// and its record, key and aux bytes copied straight into the merged index. Nothing is
/// allocated per entry and nothing is sorted; a key that two ranks wrote comes out of the
/// heap twice in a row and is refused naming both ranks.
///
/// The heap's output order (which rank each entry came from, its key and aux lengths) is
/// remembered for `at`; the next merge there places each partial's entries where that order
/// puts them as soon as the partial is read ([`order::Placing`]: the same validation, then
/// a strict order check on every key and a check that every place was written once, so
/// only a correct guess gets through) and falls back to the heap when the layout changed.
/// Either way the index is the same bytes.
pub(crate) fn merge_partials<B: IndexSource>(
    world_size: u32,
    token: Option<&str>,
    at: &str,
    mut index_buf: Vec<u8>,
    mut load: impl FnMut(u32) -> Result<(PathBuf, B)>,
) -> Result<Merged> {
    // A remembered order places each partial's entries right after its read (order.rs);
    // `guessed`: whether a remembered order was tried, and whether it fitted.
    let remembered = order::recall(at);
    let mut guessed = remembered.as_ref().map(|_| false);
    let mut placing = remembered.and_then(|o| {
        order::Placing::start(o, world_size as usize, std::mem::take(&mut index_buf))
    });
    let mut first_token: Option<String> = None;
    let mut shards: Vec<ShardRec> = Vec::new();
    let mut partials: Vec<Partial<B>> = Vec::with_capacity(world_size as usize);
    let mut chunk_bytes = None;
    let mut user_meta: Option<String> = None;
    let mut sections = String::new();
    // The merged manifest: kept only if every partial has one, all of one algorithm (a
    // manifest that left out some shards would make strong verification refuse the index).
    let mut digests: Option<(String, Vec<FileDigest>)> = None;
    let (mut n, mut keys_len, mut aux_len) = (0usize, 0u64, 0u64);
    for rank in 0..world_size {
        let (p, bytes) = load(rank)?;
        let view = IndexView::open(bytes, &p)?;
        view.verify_all()?;
        match chunk_bytes {
            None => chunk_bytes = Some(view.chunk_bytes()),
            Some(c) if c != view.chunk_bytes() => {
                return Err(Error::InvalidArgument(format!(
                    "{}: chunk_bytes differs between writers",
                    p.display()
                )))
            }
            _ => {}
        }
        let raw = view.metadata_bytes()?;
        let meta: StoredMeta<'_> = serde_json::from_slice(raw).map_err(|e| {
            Error::corrupt(
                &p,
                0,
                format!("partial index metadata is not valid JSON: {e}"),
            )
        })?;
        let mt = meta.partial.map(|m| m.merge_token).unwrap_or_default();
        if let Some(want) = token.or(first_token.as_deref()) {
            if mt != want {
                return Err(Error::InvalidArgument(format!(
                    "{}: partial index of rank {rank} has merge token {mt:?}, expected {want:?} (a stale partial of another save?)",
                    p.display()
                )));
            }
        }
        first_token.get_or_insert(mt);
        digests = match (rank, digests, meta.digest) {
            (0, _, Some(m)) => Some((m.algorithm, m.files)),
            (_, Some((algo, mut files)), Some(m)) if m.algorithm == algo => {
                files.extend(m.files);
                Some((algo, files))
            }
            _ => None,
        };
        if rank == 0 {
            // Keep rank 0's user metadata (verbatim) and library sections; the "partial"
            // marker is dropped.
            user_meta = meta.user.map(|u| u.get().to_string());
            sections = meta.sections.unwrap_or_default();
        }
        let shard_base = u32::try_from(shards.len())
            .ok()
            .filter(|b| b.checked_add(view.shards().len() as u32).is_some())
            .ok_or_else(|| Error::InvalidArgument("too many shards to merge".into()))?;
        shards.extend(view.shards().iter().cloned());
        let (k, a) = view.blob_lens();
        (n, keys_len, aux_len) = (n + view.len(), keys_len + k, aux_len + a);
        partials.push(Partial { view, shard_base });
        if let Some(pl) = placing.as_mut() {
            if pl.place(&partials[rank as usize]).is_err() {
                index_buf = placing
                    .take()
                    .map_or_else(Vec::new, order::Placing::into_buffer);
            }
        }
    }
    let builder = |buf: Vec<u8>| -> Result<SortedIndexBuilder> {
        let (k, a) = (usize::try_from(keys_len), usize::try_from(aux_len));
        let (k, a) = k.ok().zip(a.ok()).ok_or_else(|| {
            Error::InvalidArgument("partial indexes too large to merge in memory".into())
        })?;
        SortedIndexBuilder::with_shape_in(buf, shards.len(), n, k, a)
    };
    let placed = placing.and_then(|pl| match pl.seal(shards.len(), (n, keys_len, aux_len)) {
        Ok(out) => Some(out),
        Err(buf) => {
            index_buf = buf;
            None
        }
    });
    let out = match placed {
        Some(out) => {
            guessed = Some(true);
            out
        }
        None => {
            let mut out = builder(index_buf)?;
            match merge_sorted(&partials, &mut out, n) {
                Ok((ranks, key_lens, aux_lens)) => {
                    let w = partials.len();
                    match order::MergeOrder::new(&ranks, &key_lens, &aux_lens, w, shards.len()) {
                        Some(o) => order::remember(at, Arc::new(o)),
                        None => order::forget(at),
                    }
                }
                Err(e) => {
                    order::forget(at);
                    return Err(e);
                }
            }
            out
        }
    };
    if let Some(fitted) = guessed {
        order::count(fitted);
    }
    let user = user_meta.unwrap_or_else(|| "{}".to_string());
    let manifest = match digests.map(|(a, f)| (DigestAlgo::from_name(&a), f)) {
        Some((Ok(algo), files)) => manifest_extra(algo, &files),
        _ => String::new(),
    };
    let meta = meta_blob(
        &user,
        &format!(",\"writers\":{world_size}{manifest}"),
        &sections,
    );
    let index = out.finish(
        &shards,
        chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
        meta.as_bytes(),
    )?;
    Ok(Merged {
        shards,
        index,
        in_order: guessed == Some(true),
    })
}

/// The first 8 bytes of `key`, zero-padded, as a big-endian integer: the heap compares these
/// first. Integer order is the keys' byte order on those bytes (a shorter key pads with
/// zeros, so equal prefixes fall back to comparing the whole keys, which also orders
/// `"ab"` before `"ab\0"`). Keys of DCP's row-sharded tensors interleave across all ranks
/// (`t@0,0`, `t@1,0`, ... in every partial), so each entry costs about 2 log2(N) heap
/// comparisons; as integers rather than `memcmp` calls they stop dominating the merge.
fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// The k-way merge of the verified, sorted `partials` (index = rank, `n` entries in all) into
/// `out`; returns, for each merged entry in order, the rank it came from and its key and aux
/// lengths (what the next merge places by: order.rs).
fn merge_sorted<B: IndexSource>(
    partials: &[Partial<B>],
    out: &mut SortedIndexBuilder,
    n: usize,
) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let mut ranks: Vec<u32> = Vec::with_capacity(n);
    let (mut key_lens, mut aux_lens) = (Vec::with_capacity(n), Vec::with_capacity(n));
    // One cursor per non-empty partial: (its current key's prefix, the key, its rank),
    // smallest key on top; a tie between ranks comes out lower rank first, so equal keys pop
    // one after the other.
    let mut pos = vec![0usize; partials.len()];
    let mut heap: BinaryHeap<Reverse<(u64, &[u8], usize)>> =
        BinaryHeap::with_capacity(partials.len());
    for (r, p) in partials.iter().enumerate() {
        if !p.view.is_empty() {
            let key = p.view.key_bytes(0)?;
            heap.push(Reverse((key_prefix(key), key, r)));
        }
    }
    let mut prev: Option<(&[u8], usize)> = None;
    while let Some(mut top) = heap.peek_mut() {
        let Reverse((_, key, r)) = *top;
        if let Some((pk, pr)) = prev.filter(|(pk, _)| *pk == key) {
            return Err(Error::DuplicateKey {
                key: String::from_utf8_lossy(pk).into_owned(),
                context: format!("written by rank {} and rank {}", pr.min(r), pr.max(r)),
            });
        }
        let p = &partials[r];
        let e = p.view.entry_raw(pos[r])?;
        let mut rec = e.rec;
        // In range: entry_raw checked the shard against this partial's table.
        rec.shard += p.shard_base;
        out.push(rec, key, e.aux)?;
        ranks.push(r as u32);
        key_lens.push(key.len() as u32);
        aux_lens.push(e.aux.len() as u32);
        prev = Some((key, r));
        pos[r] += 1;
        if pos[r] < p.view.len() {
            let next = p.view.key_bytes(pos[r])?;
            *top = Reverse((key_prefix(next), next, r));
        } else {
            PeekMut::pop(top);
        }
    }
    Ok((ranks, key_lens, aux_lens))
}

#[cfg(test)]
mod tests;
