//! File naming (FORMAT.md §1, §3.1, §8): every name a checkpoint `P` owns, made and recognised
//! in one place.
//!
//! - `P.index`: the committed index; `P.index.part-RRRRR-of-WWWWW`: a partial index of a
//!   multi-writer save; `P.lock`: the commit lock;
//! - `P.data-SSSSS-of-NNNNN`, optionally `.<16 hex token>`: shard files;
//! - `<final name>.tmp-<16 hex>`: a temp file being written (locked while in use).
//!
//! Names are suffixes appended to the prefix's last component, never joined as path elements.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Marks a shard name suffix (`.data-…`).
pub const DATA_MARK: &str = ".data-";
/// Marks a temp file (`….tmp-<token>`), anywhere in the suffix.
pub const TEMP_MARK: &str = ".tmp-";
/// The temp file of the index (`.index.tmp-<token>`).
pub const INDEX_TEMP_MARK: &str = ".index.tmp-";
/// A partial index of a multi-writer save (`.index.part-…`).
pub const PARTIAL_MARK: &str = ".index.part-";

/// `P` + `suffix` as a path (the suffix is appended to the last component, not joined).
pub fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The index path `P.index`.
pub fn index_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".index")
}

/// The commit lock path `P.lock` (held while a writer publishes, commits and cleans up).
pub fn lock_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".lock")
}

/// The partial index suffix of writer `rank` of `world` (`.index.part-RRRRR-of-WWWWW`).
pub fn partial_suffix(rank: u32, world: u32) -> String {
    format!("{PARTIAL_MARK}{rank:05}-of-{world:05}")
}

/// The partial index path of writer `rank` of `world`.
pub fn partial_index_path(prefix: &Path, rank: u32, world: u32) -> PathBuf {
    with_suffix(prefix, &partial_suffix(rank, world))
}

/// The temp file next to `dest` that becomes `dest` by one rename (or hard link).
pub fn temp_path(dest: &Path, token: u64) -> PathBuf {
    with_suffix(dest, &format!("{TEMP_MARK}{token:016x}"))
}

/// The final name of temp file `tmp` (what [`temp_path`] appended removed), for messages:
/// errors name the user's file, not the temp name beside it.
pub fn final_of_temp(tmp: &Path) -> PathBuf {
    let s = tmp.as_os_str().to_string_lossy();
    match s.rfind(TEMP_MARK) {
        Some(at) => PathBuf::from(&s[..at]),
        None => tmp.to_path_buf(),
    }
}

/// The shard name suffix for shard `s` of `n`, with an optional save token.
pub fn shard_name(s: u32, n: u32, token: Option<u64>) -> String {
    match token {
        None => format!("{DATA_MARK}{s:05}-of-{n:05}"),
        Some(t) => format!("{DATA_MARK}{s:05}-of-{n:05}.{t:016x}"),
    }
}

/// Check a shard name suffix read from an index (§3.1): `.data-NNNNN-of-NNNNN` with an
/// optional `.<16 hex>`. Anything else (a path separator, `..`) is refused before it is
/// joined to a directory.
pub fn valid_shard_name(name: &[u8]) -> bool {
    let base = b".data-00000-of-00000".len();
    if name.len() != base && name.len() != base + 17 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| name[r].iter().all(|c| c.is_ascii_digit());
    if &name[..6] != b".data-" || !digits(6..11) || &name[11..15] != b"-of-" || !digits(15..20) {
        return false;
    }
    if name.len() == base {
        return true;
    }
    name[20] == b'.'
        && name[21..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// Whether a file of `P` with this suffix belongs to the checkpoint's files (shards, their temp
/// files, index temp files, partial indexes): what cleanup and removal consider.
pub fn is_owned_suffix(suffix: &str) -> bool {
    suffix.starts_with(DATA_MARK)
        || suffix.starts_with(INDEX_TEMP_MARK)
        || suffix.starts_with(PARTIAL_MARK)
}

/// Whether a suffix names a temp file (which a live writer may still hold).
pub fn is_temp_suffix(suffix: &str) -> bool {
    suffix.contains(TEMP_MARK)
}
