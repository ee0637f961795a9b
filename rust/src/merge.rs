//! The multi-writer merge (FORMAT.md §8, step 4) and the index metadata JSON it reads.
//!
//! Every writer of a multi-writer save publishes a *partial index* (same format as `P.index`)
//! whose metadata carries a `"partial"` marker. [`merge`] validates the partials of one save,
//! renumbers their shards, merges the sorted entry records and commits `P.index`; no payload
//! bytes are copied. The metadata blob is JSON we wrote ourselves, parsed here with serde_json
//! (the user's part is carried through verbatim as raw JSON).

use crate::commit::{commit_index, PrefixLock};
use crate::digest::{manifest_extra, DigestAlgo, FileDigest, Manifest};
use crate::error::{Error, Result};
use crate::format::{DEFAULT_CHUNK_BYTES, FORMAT_VERSION};
use crate::index::{EntryMeta, IndexView, ShardRec};
use crate::naming::{partial_index_path, partial_suffix};
use crate::store::{block_on, remote_commit, spawn, Location, MERGE_READS_IN_FLIGHT};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::path::{Path, PathBuf};

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
    if world_size == 0 {
        return Err(Error::InvalidArgument("world_size must be >= 1".into()));
    }
    let lock = PrefixLock::acquire(prefix)?;
    let m = merge_partials(world_size, token, |rank| {
        let p = partial_index_path(prefix, rank, world_size);
        let bytes = std::fs::read(&p)
            .map_err(|e| Error::io(&p, "read partial index (did every writer commit?)", e))?;
        Ok((p, bytes))
    })?;
    crate::fault::point("merge.read");
    commit_index(
        prefix,
        &m.shards,
        m.entries,
        m.chunk_bytes,
        m.meta.as_bytes(),
        durable,
        &lock,
    )
}

/// [`merge`] for a local prefix or an object-store URL (there the merged index is committed
/// conditionally, FORMAT.md §8.2, and the consumed partial indexes are deleted). The partial
/// indexes are read in parallel, [`MERGE_READS_IN_FLIGHT`] at a time.
pub fn merge_at(loc: &Location, world_size: u32, durable: bool, token: Option<&str>) -> Result<()> {
    let rp = match loc {
        Location::Local(p) => return merge(p, world_size, durable, token),
        Location::Remote(rp) => rp,
    };
    if world_size == 0 {
        return Err(Error::InvalidArgument("world_size must be >= 1".into()));
    }
    let seen = remote_commit::observe(rp)?;
    let suffixes: Vec<String> = (0..world_size)
        .map(|rank| partial_suffix(rank, world_size))
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
    let m = merge_partials(world_size, token, |rank| {
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
            Error::NotFound { path, .. } => Error::NotFound {
                path,
                what: "read partial index (did every writer commit?)".into(),
            },
            e => e,
        })?;
        Ok((rp.url_of(suffix), bytes))
    })?;
    drop(reads);
    crate::fault::point("merge.read");
    // The consumed partial indexes go in the same bulk delete as the replaced shards.
    remote_commit::commit_index(
        rp,
        seen,
        &m.shards,
        m.entries,
        m.chunk_bytes,
        m.meta.as_bytes(),
        &suffixes,
    )
}

/// The merged content of a multi-writer save, ready to commit.
struct Merged {
    shards: Vec<ShardRec>,
    entries: Vec<EntryMeta>,
    chunk_bytes: u32,
    meta: String,
}

/// Validate and merge the partial indexes `load(rank)` returns (path for messages, bytes).
fn merge_partials(
    world_size: u32,
    token: Option<&str>,
    mut load: impl FnMut(u32) -> Result<(PathBuf, Vec<u8>)>,
) -> Result<Merged> {
    let mut first_token: Option<String> = None;
    let mut shards: Vec<ShardRec> = Vec::new();
    let mut entries: Vec<EntryMeta> = Vec::new();
    // The rank of each shard (by its index in `shards`), to name the ranks of a duplicate key.
    let mut shard_rank: Vec<u32> = Vec::new();
    let mut chunk_bytes = None;
    let mut user_meta: Option<String> = None;
    let mut sections = String::new();
    // The merged manifest: kept only if every partial has one, all of one algorithm (a
    // manifest that left out some shards would make strong verification refuse the index).
    let mut digests: Option<(String, Vec<FileDigest>)> = None;
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
        let base = shards.len() as u32;
        shards.extend(view.shards().iter().cloned());
        shard_rank.resize(shards.len(), rank);
        entries.reserve(view.len());
        for i in 0..view.len() {
            let mut e = view.entry(i)?.to_meta();
            e.shard += base;
            entries.push(e);
        }
    }
    // Duplicate keys across writers: found by sorting (build_index sorts the same vector again,
    // already sorted then, in one pass), not by a hash map of every key, which cost a key
    // clone and a hash per entry (a quarter of a 4,096-rank merge's CPU; docs/SCALE.md).
    entries.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    if let Some(w) = entries.windows(2).find(|w| w[0].key == w[1].key) {
        let rank_of = |e: &EntryMeta| shard_rank.get(e.shard as usize).copied().unwrap_or(0);
        let (a, b) = (rank_of(&w[0]), rank_of(&w[1]));
        return Err(Error::DuplicateKey {
            key: w[0].key.clone(),
            context: format!("written by rank {} and rank {}", a.min(b), a.max(b)),
        });
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
    Ok(Merged {
        shards,
        entries,
        chunk_bytes: chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
        meta,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_user_metadata_survive_the_metadata_json() {
        let sections = r#"{"t":{"aliases":{"a":1,"user":{"x":"q\"\\"}}},"n":"\u0001"}"#;
        let user = r#"{"a": 1, "user": 2}"#;
        let extra = partial_marker(1, 2, 7, "step-3");
        let blob = meta_blob(user, &extra, sections);
        let meta: StoredMeta<'_> = serde_json::from_str(&blob).unwrap();
        assert_eq!(meta.sections.as_deref(), Some(sections));
        assert_eq!(meta.user.map(|u| u.get()), Some(user)); // verbatim, spacing kept
        assert_eq!(meta.partial.unwrap().merge_token, "step-3");
        let plain_blob = meta_blob("{}", "", "");
        let plain: StoredMeta<'_> = serde_json::from_str(&plain_blob).unwrap();
        assert!(plain.sections.is_none() && plain.partial.is_none());
        assert_eq!(plain.user.map(|u| u.get()), Some("{}"));
    }
}
