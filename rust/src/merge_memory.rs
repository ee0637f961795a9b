//! The merge from partial indexes already in memory (FORMAT.md §8, "in-memory merge"): a
//! coordinator that was handed every writer's partial index bytes (DCP gathers each rank's
//! write results on it anyway) merges them without reading the `N` partial files back, which
//! for thousands of ranks was most of an unchanged save's merge (an open, fstat, read and
//! close each). The bytes get the same validation as read ones (header, crcs, blocks, key
//! order, shard bounds, merge token): they crossed a network and are as hostile as a file.
//! The ranks still publish their partials, so a merge from the files, `gc` and the cleanup
//! of the consumed partials behave as before.
//!
//! What the bytes cannot say is whether the save they describe is still alive at `P`: a commit
//! at `P` ends every multi-writer save in progress there and removes its published partials
//! and shards (FORMAT.md §8). A merge from the files notices (a partial is gone); one from
//! memory must look, so before committing it checks, under the commit lock, that each rank's
//! published partial and shard is still there ([`still_alive`]).

use crate::commit::{owned_names, PrefixLock};
use crate::error::{Error, Result};
use crate::index::ShardRec;
use crate::merge::{commit_merged, kept, merge_partials};
use crate::naming::{index_path, partial_suffix_in, with_suffix};
use crate::store::{remote_commit, Location};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Merge the partial indexes `partials` (index = rank, `world_size = partials.len()`) of the
/// save at `loc` and commit `P.index`, as [`crate::merge::merge_at_in`] does with the ones it would
/// read (`hashed`: the writers' `hashed_prefixes`, which names the consumed partials and the
/// errors). An error names the partial as `<its path> (in memory)`.
pub fn merge_in_memory(
    loc: &Location,
    partials: &[&[u8]],
    durable: bool,
    token: Option<&str>,
    background_cleanup: bool,
    hashed: bool,
) -> Result<()> {
    let world_size = u32::try_from(partials.len())
        .ok()
        .filter(|&w| w >= 1)
        .ok_or_else(|| Error::InvalidArgument("merge needs 1 to 2^32-1 partial indexes".into()))?;
    match loc {
        Location::Local(prefix) => {
            let lock = PrefixLock::acquire(prefix)?;
            let at = prefix.to_string_lossy();
            let name = |rank| {
                in_memory(&with_suffix(
                    prefix,
                    &partial_suffix_in(rank, world_size, hashed),
                ))
            };
            let merged = merge_partials(world_size, token, &at, kept::take_index(), |rank| {
                Ok((name(rank), partials[rank as usize]))
            })?;
            let listed = still_alive(prefix, world_size, hashed, &merged.shards)?;
            // the cleanup removes from this listing (made under the lock) instead of listing again
            commit_merged(
                prefix,
                merged,
                durable,
                lock,
                background_cleanup,
                Some(listed),
            )
        }
        Location::Remote(rp) => {
            let seen = remote_commit::observe(rp)?;
            let suffixes: Vec<String> = (0..world_size)
                .map(|rank| partial_suffix_in(rank, world_size, hashed))
                .collect();
            let name = |rank: u32| in_memory(&rp.url_of(&suffixes[rank as usize]));
            let at = rp.url_of("");
            let m = merge_partials(
                world_size,
                token,
                &at.to_string_lossy(),
                Vec::new(),
                |rank| Ok((name(rank), partials[rank as usize])),
            )?;
            crate::fault::point("merge.read");
            // the ranks' published partials go in the same bulk delete as the replaced shards
            remote_commit::commit_index_bytes(rp, seen, &m.shards, m.index, &suffixes)
        }
    }
}

/// Whether the save of the merged `shards` is still alive at local `prefix` (call with the
/// commit lock held): every rank's partial index and every shard the merged index names are
/// still there. A commit at `P` since the ranks published (a second coordinator of the same
/// save, or another save's) removed them all: committing would name files that are gone and
/// remove the checkpoint that commit made, so this is an error naming the prefix, and
/// nothing is committed or removed. One listing of `P`'s directory (and of `P/HH/` for hashed
/// names), the one a cleanup makes: comparing each partial's bytes with the file cost an open
/// and a read per rank, more than the merge itself at thousands of ranks. What a listing cannot
/// tell: a third save's ranks republishing, after that commit, every name of this save; the
/// shards it would then name carry another save token, which opening the checkpoint detects
/// (FORMAT.md §3.2, shard records), so that race gives an error, never wrong values.
/// Returns the listing (`P`'s files: suffix, path), which the commit's cleanup reuses.
fn still_alive(
    prefix: &Path,
    world: u32,
    hashed: bool,
    shards: &[ShardRec],
) -> Result<Vec<(String, PathBuf)>> {
    let listed = owned_names(prefix)?;
    let present: HashSet<&str> = listed.iter().map(|(s, _)| s.as_str()).collect();
    let partials = (0..world).map(|rank| partial_suffix_in(rank, world, hashed));
    let gone = partials
        .chain(shards.iter().map(|s| s.name.clone()))
        .find(|name| !present.contains(name.as_str()));
    match gone {
        None => Ok(listed),
        Some(name) => Err(Error::Io {
            path: index_path(prefix),
            op: "commit",
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "another commit at this prefix ended this multi-writer save ({} is gone: a \
                     second coordinator merged it, or another save committed here); nothing \
                     was committed and the checkpoint at the prefix is unchanged",
                    with_suffix(prefix, &name).display()
                ),
            ),
        }),
    }
}

/// `path` as named in the errors of an in-memory merge.
fn in_memory(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(" (in memory)");
    PathBuf::from(s)
}
