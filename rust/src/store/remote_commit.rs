//! The commit protocol on an object store (FORMAT.md §8.2): no rename, so
//!
//! 1. shards are uploaded under names carrying the save token (never an existing object's
//!    name), each complete before the index is written;
//! 2. the index is the commit point, written by one conditional PUT: `PutMode::Create`
//!    (`If-None-Match: *`) when no checkpoint existed at `P` when the save started, else
//!    `PutMode::Update` (`If-Match: <etag seen at start>`). Of two concurrent writers of one
//!    prefix exactly one wins; the other gets a clear error and removes its shards;
//! 3. cleanup deletes objects of `P` the new index does not reference and that are older than
//!    the new index (a concurrent save that started after our commit keeps its objects), and
//!    aborts multipart uploads left by killed writers.

use super::upload::UPLOAD_MARKER;
use super::{block_on, RemotePrefix, Store};
use crate::error::{Error, Result};
use crate::index::{build_index, EntryMeta, ShardRec};
use crate::naming::{DATA_MARK, PARTIAL_MARK};
use object_store::{ObjectMeta, PutMode, UpdateVersion};
use std::collections::HashSet;

/// What a save saw at `P.index` when it started: the condition of its commit.
pub fn observe(prefix: &RemotePrefix) -> Result<PutMode> {
    Ok(match prefix.store.head(&prefix.key_of(".index"))? {
        None => PutMode::Create,
        Some(m) => PutMode::Update(UpdateVersion {
            e_tag: m.e_tag,
            version: m.version,
        }),
    })
}

/// Build and conditionally put `P.index`, then clean up. On a lost race the shards of this
/// save are deleted and the error names the URL.
pub fn commit_index(
    prefix: &RemotePrefix,
    mode: PutMode,
    shards: &[ShardRec],
    entries: Vec<EntryMeta>,
    chunk_bytes: u32,
    meta: &[u8],
) -> Result<()> {
    let bytes = build_index(shards, entries, chunk_bytes, meta)?;
    let key = prefix.key_of(".index");
    // The shards of the checkpoint this commit replaces are garbage once it succeeds (the
    // condition guarantees it replaces exactly that version), whatever their timestamps.
    let replaced = match &mode {
        PutMode::Update(_) => previous_shards(prefix),
        _ => Vec::new(),
    };
    if let Err(e) = prefix.store.put(&key, bytes, mode) {
        if let Error::Io { source, .. } = &e {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                for s in shards {
                    let _ = prefix.store.delete(&prefix.key_of(&s.name));
                }
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
    let keep: HashSet<String> = shards.iter().map(|s| s.name.clone()).collect();
    for name in replaced.iter().filter(|n| !keep.contains(*n)) {
        let _ = prefix.store.delete(&prefix.key_of(name));
    }
    cleanup(prefix, &keep);
    Ok(())
}

/// Shard names of the checkpoint currently at `P` (empty if unreadable: cleanup is best
/// effort and the time rule still applies).
fn previous_shards(prefix: &RemotePrefix) -> Vec<String> {
    let Ok((bytes, _)) = prefix.store.get(&prefix.key_of(".index")) else {
        return Vec::new();
    };
    match crate::index::IndexView::open(bytes, &prefix.url_of(".index")) {
        Ok(v) => v.shards().iter().map(|s| s.name.clone()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Objects of `P` with their suffixes, and `P.index`'s metadata.
type Owned = (Vec<(String, ObjectMeta)>, Option<ObjectMeta>);

/// Objects of `P` (shards, partial indexes, upload markers; not `P.index`), with their
/// suffixes, and `P.index`'s metadata if present. One listing of `P`'s directory.
fn owned(prefix: &RemotePrefix) -> Result<Owned> {
    let (dir, base) = prefix.dir_and_base();
    let (objects, _) = prefix.store.list_dir(dir)?;
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
    Ok((out, index))
}

/// After a commit: delete unreferenced objects of `P` older than the index, aborting the
/// uploads their markers name. Best effort: a committed save never fails here.
pub fn cleanup(prefix: &RemotePrefix, keep: &HashSet<String>) {
    let Ok((objs, Some(index))) = owned(prefix) else {
        return;
    };
    let stale: Vec<&(String, ObjectMeta)> = objs
        .iter()
        .filter(|(name, m)| !keep.contains(name) && m.last_modified < index.last_modified)
        .collect();
    abort_stale_uploads(&prefix.store, stale.iter().map(|(_, m)| m));
    for (name, _) in stale {
        if !name.ends_with(UPLOAD_MARKER) {
            let _ = prefix.store.delete(&prefix.key_of(name));
        }
    }
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

/// `shardpoint gc`: under key prefix `dir` of `store`, abort the multipart uploads of writers
/// that died (upload markers older than `older_than_s` seconds) and delete their markers.
/// Returns the number of uploads aborted.
pub fn gc(store: &Store, dir: &str, older_than_s: f64) -> Result<usize> {
    let now = std::time::SystemTime::now();
    let objs = store.list(dir)?;
    let old = objs.iter().filter(|m| {
        let t: std::time::SystemTime = m.last_modified.into();
        now.duration_since(t)
            .map(|d| d.as_secs_f64() >= older_than_s)
            .unwrap_or(older_than_s <= 0.0)
    });
    Ok(abort_stale_uploads(store, old))
}
