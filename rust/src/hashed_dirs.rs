//! The hashed directories `P/HH/` of a checkpoint saved with hashed shard names (FORMAT.md
//! §3.1.1): which files there are `P`'s, and removing the directories once empty. Only
//! `std` and `naming`: `commit` (cleanup, `remove`) and `incremental` call it.

use crate::naming::is_hashed_owned_suffix;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The files of `P` under its hashed directories `P/HH/` (FORMAT.md §3.1.1): shards and their
/// temp files named `data-…`. Nothing else there is `P`'s (a user's own files stay).
pub fn owned_names(prefix: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(rd) = fs::read_dir(prefix) else {
        return; // no hashed shards (or `P` is not a directory)
    };
    for sub in rd.flatten() {
        let hh = sub.file_name().to_string_lossy().into_owned();
        if !is_hex2(&hh) {
            continue; // not a hashed directory: nothing of `P`'s in it
        }
        let Ok(files) = fs::read_dir(sub.path()) else {
            continue;
        };
        for ent in files.flatten() {
            let suffix = format!("/{hh}/{}", ent.file_name().to_string_lossy());
            if is_hashed_owned_suffix(&suffix) {
                out.push((suffix, ent.path()));
            }
        }
    }
}

/// Whether a directory name can be a hashed directory `HH` (two lowercase hex digits).
pub fn is_hex2(name: &str) -> bool {
    name.len() == 2
        && name
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Remove `P/HH/` and `P/` where they became empty (best effort; a directory holding
/// anything else, e.g. a live writer's temp file or a user's file, stays).
pub fn remove_empty(prefix: &Path) {
    let Ok(rd) = fs::read_dir(prefix) else {
        return;
    };
    for sub in rd.flatten() {
        if is_hex2(&sub.file_name().to_string_lossy()) {
            let _ = fs::remove_dir(sub.path());
        }
    }
    let _ = fs::remove_dir(prefix);
}

/// The hashed directories (`P/HH/`) that shards named `names` live in, each once: what a
/// durable save fsyncs after linking shards there (the commit fsyncs `P`'s directory only).
pub fn dirs_of<'a>(prefix: &Path, names: impl Iterator<Item = &'a str>) -> BTreeSet<PathBuf> {
    names
        .filter(|n| n.starts_with('/'))
        .filter_map(|n| {
            crate::naming::with_suffix(prefix, n)
                .parent()
                .map(Path::to_path_buf)
        })
        .collect()
}
