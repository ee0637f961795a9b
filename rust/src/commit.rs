//! File naming and the commit protocol (FORMAT.md §1, §8): temp names, fsync, hard-link or
//! rename into place, directory fsync, cleanup of leftovers, removal.
//!
//! What must stay true: no existing file is ever truncated or rewritten; `P.index` appears by
//! one atomic rename after everything it references is durable (when `durable`).

use crate::error::{Error, Result};
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// The partial index path of writer `rank` of `world`.
pub fn partial_index_path(prefix: &Path, rank: u32, world: u32) -> PathBuf {
    with_suffix(prefix, &format!(".index.part-{rank:05}-of-{world:05}"))
}

/// A random 64-bit token (save ids, temp names).
pub fn random_token() -> u64 {
    let mut b = [0u8; 8];
    // getrandom only fails on exotic platforms; fall back to time+pid rather than abort a save.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return t ^ ((std::process::id() as u64) << 32);
    }
    u64::from_le_bytes(b)
}

/// The directory holding `prefix`'s files.
pub fn parent_dir(prefix: &Path) -> PathBuf {
    match prefix.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// fsync a directory so renames and links in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, "open directory for fsync", e))?;
    d.sync_all()
        .map_err(|e| Error::io(dir, "fsync directory", e))
}

/// Write `bytes` to a temp file next to `dest`, fsync it (if `durable`), rename it over `dest`
/// and fsync the directory. Atomic replace: readers see the old or the new file, never a mix.
pub fn write_atomic(dest: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let tmp = with_suffix(dest, &format!(".tmp-{:016x}", random_token()));
    let res = (|| {
        let mut f = File::create(&tmp).map_err(|e| Error::io(&tmp, "create", e))?;
        f.lock().map_err(|e| Error::io(&tmp, "lock temp file", e))?; // see `cleanup`
        f.write_all(bytes)
            .map_err(|e| Error::io(&tmp, "write", e))?;
        if durable {
            f.sync_all().map_err(|e| Error::io(&tmp, "fsync", e))?;
        }
        drop(f);
        fs::rename(&tmp, dest).map_err(|e| Error::io(dest, "rename into place", e))?;
        if durable {
            sync_dir(&parent_dir(dest))?;
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Move a finished temp shard to its final name without replacing anything: link to the plain
/// name if free, else to the name carrying the save token. Returns the chosen suffix.
pub fn publish_shard(prefix: &Path, tmp: &Path, plain: &str, tokened: &str) -> Result<String> {
    for name in [plain, tokened] {
        let dest = with_suffix(prefix, name);
        match fs::hard_link(tmp, &dest) {
            Ok(()) => {
                fs::remove_file(tmp).map_err(|e| Error::io(tmp, "remove temp shard", e))?;
                return Ok(name.to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported
                || e.raw_os_error() == Some(1) /* EPERM: no hard links here */ =>
            {
                if !dest.exists() {
                    fs::rename(tmp, &dest).map_err(|e| Error::io(&dest, "rename shard", e))?;
                    return Ok(name.to_string());
                }
            }
            Err(e) => return Err(Error::io(&dest, "link shard into place", e)),
        }
    }
    Err(Error::InvalidArgument(format!(
        "{}: both {plain} and {tokened} already exist",
        prefix.display()
    )))
}

/// The file names in `prefix`'s directory that belong to prefix `P` (shards, temps, partials).
fn owned_names(prefix: &Path) -> Result<Vec<(String, PathBuf)>> {
    let dir = parent_dir(prefix);
    let base = prefix
        .file_name()
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{}: prefix has no file name", prefix.display()))
        })?
        .to_string_lossy()
        .into_owned();
    let mut out = Vec::new();
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) => return Err(Error::io(&dir, "list directory", e)),
    };
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(&base) {
            if rest.starts_with(".data-")
                || rest.starts_with(".index.tmp-")
                || rest.starts_with(".index.part-")
            {
                out.push((rest.to_string(), ent.path()));
            }
        }
    }
    Ok(out)
}

/// Whether another live writer holds the temp file at `path` (writers keep an exclusive
/// advisory lock on their temp files until they close them; a killed writer's lock is gone).
fn temp_in_use(path: &Path) -> bool {
    match File::open(path) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// After a commit: unlink files of `P` that the new index does not reference (old shards,
/// leftovers of crashed saves), except temp files another writer is still writing. Best
/// effort: failures here never fail a committed save.
pub fn cleanup(prefix: &Path, keep: &HashSet<String>) {
    if let Ok(names) = owned_names(prefix) {
        for (suffix, path) in names {
            if keep.contains(&suffix) || (suffix.contains(".tmp-") && temp_in_use(&path)) {
                continue;
            }
            let _ = fs::remove_file(path);
        }
    }
}

/// Delete checkpoint `P`: the index first (the checkpoint disappears atomically), then the rest.
pub fn remove(prefix: &Path) -> Result<()> {
    let idx = index_path(prefix);
    fs::remove_file(&idx).map_err(|e| Error::io(&idx, "remove checkpoint index", e))?;
    for (_, path) in owned_names(prefix)? {
        let _ = fs::remove_file(path);
    }
    Ok(())
}
