//! The commit protocol on an object store (FORMAT.md §8.2): no rename, so
//!
//! 1. shards are uploaded under names carrying the save token (never an existing object's
//!    name), each complete before the index is written;
//! 2. the index is the commit point, written by one conditional PUT: `PutMode::Create`
//!    (`If-None-Match: *`) when no checkpoint existed at `P` when the save started, else
//!    `PutMode::Update` (`If-Match: <etag seen at start>`). Of two concurrent writers of one
//!    prefix exactly one wins; the other gets a clear error and removes its shards;
//! 3. after the commit, the shards of the checkpoint it replaced (read from the index seen at
//!    the start, the exact version the condition replaced) and the consumed partial indexes
//!    are deleted in one bulk request. A save never LISTs nor HEADs (docs/SCALE.md: 512 ranks
//!    listing one prefix got 503s); the leftovers of killed writers (their multipart uploads,
//!    shards and partial indexes no index references) are `gc`'s work ([`gc`]), which lists.

use super::upload::UPLOAD_MARKER;
use super::{block_on, RemotePrefix, Store};
use crate::error::{Error, Result};
use crate::index::{build_index, EntryMeta, IndexView, ShardRec};
use crate::naming::{is_hashed_owned_suffix, is_partial_suffix, DATA_MARK, PARTIAL_MARK};
use object_store::{ObjectMeta, PutMode, UpdateVersion};
use std::collections::{HashMap, HashSet};

/// What a save saw at `P.index` when it started: the condition of its commit and the shards
/// its commit replaces.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The condition of the commit's PUT.
    pub mode: PutMode,
    /// Shard names (suffixes) of the checkpoint at `P` when the save started.
    pub replaced: Vec<String>,
}

/// Read `P.index` once (one GET, no HEAD): its version conditions the commit and its shard
/// list says what the commit replaces. An unreadable index is replaced without deleting
/// anything (`gc` finds its shards later).
pub fn observe(prefix: &RemotePrefix) -> Result<Observed> {
    let key = prefix.key_of(".index");
    let (bytes, meta) = match prefix.store.get(&key) {
        Ok(got) => got,
        Err(Error::NotFound { .. }) => {
            return Ok(Observed {
                mode: PutMode::Create,
                replaced: Vec::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let replaced = match IndexView::open(bytes, &prefix.url_of(".index")) {
        Ok(v) => v.shards().iter().map(|s| s.name.clone()).collect(),
        Err(_) => Vec::new(),
    };
    Ok(Observed {
        mode: PutMode::Update(UpdateVersion {
            e_tag: meta.e_tag,
            version: meta.version,
        }),
        replaced,
    })
}

/// Build and conditionally put `P.index`, then delete the shards it replaced and the
/// `consumed` objects (suffixes: a merge's partial indexes) in one bulk delete. On a lost race
/// the shards of this save are deleted and the error names the URL.
pub fn commit_index(
    prefix: &RemotePrefix,
    seen: Observed,
    shards: &[ShardRec],
    entries: Vec<EntryMeta>,
    chunk_bytes: u32,
    meta: &[u8],
    consumed: &[String],
) -> Result<()> {
    let bytes = build_index(shards, entries, chunk_bytes, meta)?;
    commit_index_bytes(prefix, seen, shards, bytes, consumed)
}

/// [`commit_index`] of an index already serialized.
pub fn commit_index_bytes(
    prefix: &RemotePrefix,
    seen: Observed,
    shards: &[ShardRec],
    bytes: Vec<u8>,
    consumed: &[String],
) -> Result<()> {
    let key = prefix.key_of(".index");
    if let Err(e) = prefix.store.put(&key, bytes, seen.mode) {
        if let Error::Io { source, .. } = &e {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                let ours = not_committed(prefix, shards);
                let _ = prefix.store.delete_many(&ours);
                return Err(Error::Io {
                    path: prefix.url_of(".index"),
                    op: "commit",
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "another writer committed a checkpoint at this prefix after this save \
                         started; this save was discarded",
                    ),
                });
            }
        }
        return Err(e);
    }
    crate::fault::point("commit.done");
    // The replaced shards are garbage now (the condition guarantees the commit replaced
    // exactly the version they belong to); best effort: `gc` finds what a failure leaves.
    let keep: HashSet<&str> = shards.iter().map(|s| s.name.as_str()).collect();
    let garbage: Vec<String> = seen
        .replaced
        .iter()
        .filter(|n| !keep.contains(n.as_str()))
        .cloned()
        .chain(consumed.iter().cloned())
        .map(|n| prefix.key_of(&n))
        .collect();
    let _ = prefix.store.delete_many(&garbage);
    Ok(())
}

/// The keys of this save's `shards` that the commit that won the race does not name, for the
/// loser to delete (one GET of the winner's index; nothing when it cannot be read: `gc` finds
/// them). The winner can name them: two coordinators merging the same save's partials commit
/// the same shards (FORMAT.md §8.4), and the loser must not delete the winner's checkpoint.
fn not_committed(prefix: &RemotePrefix, shards: &[ShardRec]) -> Vec<String> {
    let url = prefix.url_of(".index");
    let Ok(winner) = prefix
        .store
        .get(&prefix.key_of(".index"))
        .and_then(|(bytes, _)| IndexView::open(bytes, &url))
    else {
        return Vec::new();
    };
    let named: HashSet<&str> = winner.shards().iter().map(|s| s.name.as_str()).collect();
    shards
        .iter()
        .filter(|s| !named.contains(s.name.as_str()))
        .map(|s| prefix.key_of(&s.name))
        .collect()
}

/// Objects of `P` with their suffixes, and `P.index`'s metadata.
type Owned = (Vec<(String, ObjectMeta)>, Option<ObjectMeta>);

/// Objects of `P` (shards, partial indexes, upload markers; not `P.index`), with their
/// suffixes, and `P.index`'s metadata if present. One listing of `P`'s directory.
fn owned(prefix: &RemotePrefix) -> Result<Owned> {
    let (dir, base) = prefix.dir_and_base();
    let (objects, subdirs) = prefix.store.list_dir(dir)?;
    let mut out = Vec::new();
    let mut index = None;
    for m in objects {
        let name = m.location.filename().unwrap_or_default().to_string();
        if let Some(rest) = name.strip_prefix(base) {
            if rest == ".index" {
                index = Some(m);
            } else if rest.starts_with(DATA_MARK) || rest.starts_with(PARTIAL_MARK) {
                out.push((rest.to_string(), m));
            }
        }
    }
    // Hashed shards live under `P/HH/` (FORMAT.md §3.1.1): listed only when the listing
    // above shows `P/` (so a prefix without them costs no extra request).
    if subdirs
        .iter()
        .any(|d| d.trim_end_matches('/') == prefix.key_of(""))
    {
        for m in prefix.store.list(&prefix.key_of("/"))? {
            let key = m.location.to_string();
            if let Some(rest) = key.strip_prefix(&prefix.key_of("")) {
                let shard = rest.strip_suffix(UPLOAD_MARKER).unwrap_or(rest);
                if is_hashed_owned_suffix(shard) {
                    out.push((rest.to_string(), m));
                }
            }
        }
    }
    Ok((out, index))
}

/// The checkpoint prefix and the shard or partial-index suffix a listed key may belong to:
/// the plain form `P.data-…` / `P.index.part-…`, or the hashed form `P/HH/data-…` /
/// `P/HH/index.part-…` (FORMAT.md §3.1.1). `None` for any other key.
fn owner_of(key: &str) -> Option<(&str, &str)> {
    if let Some(i) = key.rfind(DATA_MARK).or_else(|| key.rfind(PARTIAL_MARK)) {
        return Some((&key[..i], &key[i..]));
    }
    // hashed: `P/HH/data-…` or `P/HH/index.part-…`
    let j = key.rfind("/data-").or_else(|| key.rfind("/index.part-"))?;
    let i = j.checked_sub(3)?;
    let suffix = key.get(i..)?;
    is_hashed_owned_suffix(suffix).then(|| (&key[..i], suffix))
}

/// For each upload marker among `objects`: abort the multipart upload it names and delete it.
/// Returns how many uploads were aborted.
pub fn abort_stale_uploads<'a>(
    store: &Store,
    objects: impl Iterator<Item = &'a ObjectMeta>,
) -> usize {
    let Ok(Some(mp)) = store.clients().map(|c| &c.multipart) else {
        return 0;
    };
    let mut n = 0;
    for m in objects {
        let key = m.location.to_string();
        let Some(target) = key.strip_suffix(UPLOAD_MARKER) else {
            continue;
        };
        let Ok((id, _)) = store.get(&key) else {
            continue;
        };
        let Ok(id) = String::from_utf8(id) else {
            continue;
        };
        let Ok(obj) = store.obj(target) else {
            continue;
        };
        // An id the store no longer knows (completed or aborted already) is fine too.
        match block_on(mp.abort_multipart(&obj, &id)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                n += 1;
                let _ = store.delete(&key);
            }
            Err(_) => {}
        }
    }
    n
}

/// The incomplete multipart uploads under `key_prefix` (S3's ListMultipartUploads; other
/// stores: none) and the store's clock, the `Date` of that listing (None: not S3, or the
/// response had none).
type UploadListing = (
    Vec<super::s3_uploads::Upload>,
    Option<chrono::DateTime<chrono::Utc>>,
);

fn list_uploads(store: &Store, key_prefix: &str) -> Result<UploadListing> {
    match store.clients()?.s3_uploads.clone() {
        Some(s3) => s3.list(key_prefix),
        None => Ok((Vec::new(), None)),
    }
}

/// Abort the incomplete multipart uploads of shards (keys with `.data-`) whose key starts
/// with `key_prefix`, found with S3's ListMultipartUploads (other stores: none found; a
/// save writes no marker, FORMAT.md §8.2), that no live writer can own: started at least
/// `older_than_s` ago and, if they have parts, whose newest part is that old too (a writer
/// uploading a large shard for longer than `older_than_s` is still live), on the store's
/// clock (the `Date` of its listing). Returns how many were aborted.
pub fn abort_dead_uploads(store: &Store, key_prefix: &str, older_than_s: f64) -> Result<usize> {
    let listing = list_uploads(store, key_prefix)?;
    abort_listed_uploads(store, listing, key_prefix, older_than_s)
}

/// [`abort_dead_uploads`] of a listing already made.
fn abort_listed_uploads(
    store: &Store,
    (uploads, store_now): UploadListing,
    key_prefix: &str,
    older_than_s: f64,
) -> Result<usize> {
    let clients = store.clients()?;
    let (Some(s3), Some(mp)) = (clients.s3_uploads.clone(), clients.multipart.clone()) else {
        return Ok(0);
    };
    let now = store_now.unwrap_or_else(chrono::Utc::now);
    let old = |t: chrono::DateTime<chrono::Utc>| {
        (now - t)
            .to_std()
            .map(|d| d.as_secs_f64() >= older_than_s)
            .unwrap_or(older_than_s <= 0.0)
    };
    let mut n = 0;
    for u in uploads {
        if !u.key[key_prefix.len()..].contains(DATA_MARK) || !old(u.initiated) {
            continue;
        }
        if older_than_s > 0.0 {
            match s3.newest_part(&u.key, &u.id) {
                Ok(Some(t)) if !old(t) => continue,
                Ok(_) => {}
                Err(Error::NotFound { .. }) => continue, // completed or aborted meanwhile
                // a store without ListParts: its start alone decides
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::Unsupported => {}
                Err(e) => return Err(e),
            }
        }
        let obj = store.obj(&u.key)?;
        match block_on(mp.abort_multipart(&obj, &u.id)) {
            Ok(()) => n += 1,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store.err(&u.key, "abort multipart upload", e)),
        }
    }
    Ok(n)
}

/// Delete checkpoint `P`: the index first (the checkpoint disappears at once), then the rest.
pub fn remove(prefix: &RemotePrefix) -> Result<()> {
    let key = prefix.key_of(".index");
    if prefix.store.head(&key)?.is_none() {
        return Err(Error::NotFound {
            path: prefix.url_of(".index"),
            what: "remove checkpoint index".into(),
        });
    }
    prefix.store.delete(&key)?;
    let (objs, _) = owned(prefix)?;
    abort_stale_uploads(&prefix.store, objs.iter().map(|(_, m)| m));
    for (name, _) in objs {
        if !name.ends_with(UPLOAD_MARKER) {
            prefix.store.delete(&prefix.key_of(&name))?;
        }
    }
    Ok(())
}

/// The name of the object [`store_clock`] writes under a gc's key prefix (then deletes).
pub const CLOCK_PROBE: &str = ".shardpoint-gc-clock.";

/// The store's "now" where no response the gc makes anyway says it (S3 answers its upload
/// listing with a `Date`; other stores make no such listing): the `LastModified` of an empty
/// object written for the purpose (PUT, HEAD, DELETE: three requests per gc, none in a save).
/// This machine's clock when the store does not take the write (e.g. no write permission).
fn store_clock(store: &Store, key_prefix: &str) -> std::time::SystemTime {
    let key = format!(
        "{key_prefix}{CLOCK_PROBE}{:016x}",
        crate::commit::random_token()
    );
    let t = store
        .put(&key, Vec::new(), PutMode::Overwrite)
        .and_then(|_| store.head(&key));
    let _ = store.delete(&key);
    match t {
        Ok(Some(m)) => m.last_modified.into(),
        _ => std::time::SystemTime::now(),
    }
}

/// `shardpoint gc`: under key prefix `dir` of `store`, clear what killed or failed writers
/// left, when older than `older_than_s` seconds: abort their incomplete multipart uploads
/// (S3: listed, [`abort_dead_uploads`]; and those the markers of previous-version writers
/// name, deleting the markers), and delete shards and partial indexes that no committed
/// index references (a checkpoint's own shards are never touched). One listing of `dir`, one
/// of its uploads (plus ListParts per upload started before `older_than_s`), one GET per
/// index found (and one per prefix whose index lies outside `dir`: a gc of `P/`), bulk
/// deletes. Returns the number of uploads aborted plus objects deleted. Ages are on the
/// store's clock where it tells it (FORMAT.md §8.2).
pub fn gc(store: &Store, dir: &str, older_than_s: f64) -> Result<usize> {
    let key_prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{}/", dir.trim_end_matches('/'))
    };
    // Ages are taken on the store's clock (FORMAT.md §8.2): `LastModified` is the store's, so
    // a client clock ahead of it would make a live writer's fresh objects look old. Both ways
    // of reading that clock happen before the listing below: an earlier "now" only makes
    // objects look younger.
    let uploads = list_uploads(store, &key_prefix)?;
    let now = match uploads.1 {
        Some(t) => t.into(),
        None => store_clock(store, &key_prefix),
    };
    let objs = store.list(dir)?;
    let is_old = |m: &ObjectMeta| {
        let t: std::time::SystemTime = m.last_modified.into();
        now.duration_since(t)
            .map(|d| d.as_secs_f64() >= older_than_s)
            .unwrap_or(older_than_s <= 0.0)
    };
    // uploads of writers of the previous format version, named by their markers
    let aborted = abort_stale_uploads(store, objs.iter().filter(|m| is_old(m)));
    let aborted = aborted + abort_listed_uploads(store, uploads, &key_prefix, older_than_s)?;
    // Checkpoint prefixes with a committed index, and the shards each references.
    let mut referenced: HashMap<String, Option<HashSet<String>>> = HashMap::new();
    // None: unreadable (its prefix is left alone); Err(NotFound): no index
    let index_names = |key: &str| -> Result<Option<HashSet<String>>> {
        let (bytes, _) = store.get(key)?;
        Ok(IndexView::open(bytes, &store.url_path(key))
            .ok()
            .map(|v| v.shards().iter().map(|s| s.name.clone()).collect()))
    };
    for m in &objs {
        let key = m.location.to_string();
        if let Some(p) = key.strip_suffix(".index") {
            referenced.insert(p.to_string(), index_names(&key).ok().flatten());
        }
    }
    let mut garbage = Vec::new();
    for m in objs.iter().filter(|m| is_old(m)) {
        let key = m.location.to_string();
        if key.ends_with(UPLOAD_MARKER) {
            continue; // handled above (kept when its upload could not be aborted)
        }
        let Some((p, suffix)) = owner_of(&key) else {
            continue;
        };
        let index = format!("{p}.index");
        if !referenced.contains_key(p) && !index.starts_with(&key_prefix) {
            // `P.index` lies outside the listing (a gc of `P/`, the hashed directories of
            // `P`, FORMAT.md §3.1.1): ask for it, once per such prefix, so that a committed
            // checkpoint's shards are never taken for orphans
            let names = match index_names(&index) {
                Ok(names) => names,
                Err(Error::NotFound { .. }) => Some(HashSet::new()),
                Err(_) => None,
            };
            referenced.insert(p.to_string(), names);
        }
        let orphan = match referenced.get(p) {
            // an unreadable index: leave its prefix alone
            Some(None) => false,
            Some(Some(names)) => is_partial_suffix(suffix) || !names.contains(suffix),
            None => true,
        };
        if orphan {
            garbage.push(key);
        }
    }
    let n = garbage.len();
    store.delete_many(&garbage)?;
    Ok(aborted + n)
}
