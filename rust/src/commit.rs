//! The commit protocol (FORMAT.md §8): fsync, hard-link or rename into place, directory
//! fsync, cleanup of leftovers, removal. The file names themselves live in `naming`.
//!
//! What must stay true: no existing file is ever truncated or rewritten; `P.index` appears by
//! one atomic rename after everything it references is durable (when `durable`); cleanup only
//! unlinks files it can prove are orphaned. Writers of one prefix serialise their publish,
//! commit and cleanup steps on the prefix lock `P.lock` ([`PrefixLock`]); where the file system
//! has no `flock`, cleanup falls back to removing only the previous checkpoint's own shards.

use crate::error::{Error, Result};
use crate::index::{build_index, EntryMeta, IndexView, ShardRec};
use crate::naming::{is_owned_suffix, is_temp_suffix, temp_path};
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

// The names live in `naming`; re-exported here where callers have always found them.
pub use crate::naming::{index_path, lock_path, partial_index_path, with_suffix};

/// Whether a lock error means "this file system has no flock" (Lustre mounted noflock, some
/// FUSE and NFS setups) rather than a real failure.
pub fn lock_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::ENOLCK) | Some(libc::EINVAL)
    ) || e.kind() == std::io::ErrorKind::Unsupported
}

/// Take an exclusive advisory lock on a temp file we are writing (a hint to a concurrent
/// cleanup that the file is in use). Unsupported locks are ignored: cleanup then never deletes
/// temp files it cannot prove abandoned.
pub fn lock_temp(f: &File, path: &Path) -> Result<()> {
    match f.lock() {
        Ok(()) => Ok(()),
        Err(e) if lock_unsupported(&e) => Ok(()),
        Err(e) => Err(Error::io(path, "lock temp file", e)),
    }
}

/// Create the temp file `tmp` (it must not exist) and lock it ([`lock_temp`]) so that a
/// concurrent commit's cleanup never takes it for a crashed save's leftover. A cleanup may find
/// it in the moment between the create and the lock, still unlocked, and unlink it (holding its
/// own lock on it while it does, see [`claim_abandoned`]); so once locked, the path is checked
/// to still name this file, and if it does not the file is created again. Errors name
/// `user_path` (the user's file, not the temp name) and `what` was being done.
pub fn create_locked_temp(tmp: &Path, user_path: &Path, what: &'static str) -> Result<File> {
    create_locked_temp_with(tmp, user_path, what, &|_| {})
}

/// [`create_locked_temp`], calling `between(tmp)` after each create and before the lock (tests
/// put a concurrent cleanup there).
fn create_locked_temp_with(
    tmp: &Path,
    user_path: &Path,
    what: &'static str,
    between: &dyn Fn(&Path),
) -> Result<File> {
    const TRIES: usize = 16;
    for _ in 0..TRIES {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| Error::io(user_path, what, e))?;
        between(tmp);
        if let Err(e) = lock_temp(&f, tmp) {
            drop(f);
            let _ = fs::remove_file(tmp);
            return Err(e);
        }
        if still_named(&f, tmp) {
            return Ok(f);
        }
    }
    Err(Error::io(
        user_path,
        what,
        std::io::Error::other(format!(
            "its temporary file was removed by a concurrent cleanup {TRIES} times in a row"
        )),
    ))
}

/// Whether `path` still names the open file `f` (same device and inode).
fn still_named(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The per-prefix commit lock: an exclusive `flock` on `P.lock`, held while a writer publishes
/// its shards, commits the index and cleans up, and while `remove` deletes. The lock file is
/// created with mode 0666 minus the umask and is never rewritten; `remove` unlinks it while
/// holding it, so `acquire` re-checks after locking that the path still names the locked file.
/// The holder unlinks `P.lock` when it lets go, so no lock file outlives a commit.
pub struct PrefixLock {
    /// None where the file system does not support `flock` (degraded mode, see `cleanup`).
    file: Option<File>,
    path: PathBuf,
}

impl Drop for PrefixLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock (no lock file lingers beside the checkpoint);
        // a waiter that locked this inode sees the path gone and locks a fresh file.
        if let Some(f) = self.file.take() {
            let _ = fs::remove_file(&self.path);
            drop(f);
        }
    }
}

impl PrefixLock {
    /// Block until the lock of `prefix` is ours. Where locks are unsupported, returns an
    /// unheld lock (`held() == false`) instead of failing: the save goes on in degraded mode.
    pub fn acquire(prefix: &Path) -> Result<PrefixLock> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = lock_path(prefix);
        loop {
            let f = match fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => f,
                // Another user's lock file we may not write: flock works on a read-only fd.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    File::open(&path).map_err(|e| Error::io(&path, "open commit lock", e))?
                }
                Err(e) => return Err(Error::io(&path, "open commit lock", e)),
            };
            match f.lock() {
                Ok(()) => {}
                Err(e) if lock_unsupported(&e) => {
                    // No flock here: the file serves nothing, so leave none behind.
                    let _ = fs::remove_file(&path);
                    return Ok(PrefixLock { file: None, path });
                }
                Err(e) => return Err(Error::io(&path, "lock prefix for commit", e)),
            }
            if still_named(&f, &path) {
                return Ok(PrefixLock {
                    file: Some(f),
                    path,
                });
            }
            // `remove` unlinked the file we locked: lock the new one.
        }
    }

    /// Whether the lock is really held (false where the file system has no flock).
    pub fn held(&self) -> bool {
        self.file.is_some()
    }

    /// The locked descriptor (None where the lock is not really held).
    pub(crate) fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.file.as_ref().map(|f| f.as_raw_fd())
    }
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

/// Create the directory that will hold checkpoint `prefix` and its missing parents, as
/// TensorFlow's `Checkpoint.save` and Orbax do. With `durable`, the parent of each directory
/// created is fsynced, so the new directories survive a power loss with the checkpoint.
/// Errors name the directory (the user's path, never a temp file).
pub fn ensure_parent_dir(prefix: &Path, durable: bool) -> Result<()> {
    let dir = parent_dir(prefix);
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut cur = dir.as_path();
    while !cur.as_os_str().is_empty() && !cur.exists() {
        missing.push(cur.to_path_buf());
        match cur.parent() {
            Some(p) => cur = p,
            None => break,
        }
    }
    fs::create_dir_all(&dir).map_err(|e| Error::Io {
        path: dir.clone(),
        op: "create the checkpoint's directory",
        source: e,
    })?;
    if durable {
        for created in missing.iter().rev() {
            sync_dir_after_commit(&parent_dir(created))?;
        }
    }
    Ok(())
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
    replace_file(dest, bytes, durable)?;
    if durable {
        sync_dir_after_commit(&parent_dir(dest))?;
    }
    Ok(())
}

/// fsync the directory after `P.index` was renamed into place. An error here means the new
/// file is visible but may not survive a power loss; the message says so.
pub fn sync_dir_after_commit(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, "open directory for fsync", e))?;
    d.sync_all().map_err(|e| {
        Error::io(
            dir,
            "fsync directory after the rename (the new file is in place but may not survive a crash)",
            e,
        )
    })
}

/// `write_atomic` without the directory fsync: temp file, fsync (if `durable`), rename over
/// `dest`. On any error the temp file is removed and `dest` is untouched.
pub fn replace_file(dest: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let tmp = temp_path(dest, random_token());
    // errors name `dest`, the user's file, not the temp name beside it
    let mut f = create_locked_temp(&tmp, dest, "create")?;
    let res = (|| {
        f.write_all(bytes)
            .map_err(|e| Error::io(dest, "write", e))?;
        if durable {
            f.sync_all().map_err(|e| Error::io(dest, "fsync", e))?;
        }
        // renamed while still open, so still locked: a cleanup never sees it unlocked
        fs::rename(&tmp, dest).map_err(|e| Error::io(dest, "rename into place", e))
    })();
    drop(f);
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Move a finished temp shard to its final name without replacing anything: link to the plain
/// name if free, else to the name carrying the save token. Returns the chosen suffix.
/// With `allow_plain == false` (no commit lock) only the tokened name is used, so shard names
/// are never reused and name-based cleanup cannot hit another save's file.
pub fn publish_shard(
    prefix: &Path,
    tmp: &Path,
    plain: &str,
    tokened: &str,
    allow_plain: bool,
) -> Result<String> {
    let names: &[&str] = if allow_plain {
        &[plain, tokened]
    } else {
        &[tokened]
    };
    for &name in names {
        let dest = with_suffix(prefix, name);
        match fs::hard_link(tmp, &dest) {
            Ok(()) => {
                fs::remove_file(tmp).map_err(|e| Error::io(tmp, "remove temp shard", e))?;
                if name.starts_with('/') {
                    // hashed form (FORMAT.md §3.1.1): the commit fsyncs `P`'s directory only,
                    // so the link in `P/HH/` is made durable here
                    sync_dir(&parent_dir(&dest))?;
                }
                return Ok(name.to_string());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported
                || e.raw_os_error() == Some(1) /* EPERM: no hard links here */ =>
            {
                if !dest.exists() {
                    fs::rename(tmp, &dest).map_err(|e| Error::io(&dest, "rename shard", e))?;
                    if name.starts_with('/') {
                        sync_dir(&parent_dir(&dest))?;
                    }
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
pub(crate) fn owned_names(prefix: &Path) -> Result<Vec<(String, PathBuf)>> {
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
            if is_owned_suffix(rest) {
                out.push((rest.to_string(), ent.path()));
            }
        }
    }
    crate::hashed_dirs::owned_names(prefix, &mut out);
    Ok(out)
}

/// Remove temp files `dest.tmp-<16 hex>` left by crashed saves of the single file `dest`
/// (FORMAT.md §10); temp files a live writer still holds locked stay. Best effort.
pub fn remove_stale_temps(dest: &Path) {
    let Some(base) = dest.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let Ok(rd) = fs::read_dir(parent_dir(dest)) else {
        return;
    };
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(tok) = name
            .strip_prefix(base.as_str())
            .and_then(|r| r.strip_prefix(crate::naming::TEMP_MARK))
        else {
            continue;
        };
        if tok.len() == 16 && tok.bytes().all(|c| c.is_ascii_hexdigit()) {
            remove_if_abandoned(&ent.path());
        }
    }
}

/// Take a temp file that no live writer holds: a live writer holds an exclusive advisory lock on
/// its temp files until it closes them (a killed writer's lock dies with it). Returns the file,
/// locked by us, to be held while the caller unlinks it: a writer that created it a moment ago
/// and locks it next then finds the path gone and starts over ([`create_locked_temp`]). None if
/// it is in use, already gone, or nothing can be proven (no flock support).
fn claim_abandoned(path: &Path) -> Option<File> {
    let f = File::open(path).ok()?;
    match f.try_lock() {
        Ok(()) => Some(f),
        Err(_) => None,
    }
}

/// Unlink the temp file at `path` if no live writer holds it ([`claim_abandoned`]), holding
/// its lock while unlinking. Best effort.
fn remove_if_abandoned(path: &Path) {
    if let Some(_held) = claim_abandoned(path) {
        let _ = fs::remove_file(path);
    }
}

/// What a commit's cleanup may remove besides the files the new index references.
pub enum Orphans {
    /// The commit lock is held: every publish and commit at `P` happens under it, so a shard
    /// no index references is a leftover of a crashed save (temp files still locked by their
    /// writer are kept). Partial indexes are removed: a commit ends every multi-writer save at
    /// `P` (a concurrent one's merge then fails, naming the missing partial; FORMAT.md §8).
    Locked,
    /// No lock (unsupported): only the shards of the checkpoint this commit replaced, named by
    /// the index read just before the commit and still carrying its save token, are provably
    /// orphaned. Anything else may belong to a concurrent writer and stays (a later locked
    /// commit, or `remove`, removes it).
    Unlocked { previous: Vec<ShardRec> },
    /// [`Orphans::Locked`] with `P`'s files as listed under this lock before the commit (the
    /// in-memory merge's liveness check), not listed again: shards and partials are published
    /// under the lock, so only a live writer's temp file can have appeared since.
    Listed(Vec<(String, PathBuf)>),
}

/// The shard records of the index currently at `prefix` (empty if none or unreadable).
pub fn current_shards(prefix: &Path) -> Vec<ShardRec> {
    fs::read(index_path(prefix))
        .ok()
        .and_then(|b| IndexView::open(b, &index_path(prefix)).ok())
        .map(|v| v.shards().to_vec())
        .unwrap_or_default()
}

/// Whether the file at `path` is a shard carrying `token` (guards name-based deletion in
/// unlocked mode against a newer file that reused the name).
fn shard_has_token(path: &Path, token: u64) -> bool {
    use std::io::Read;
    let mut b = [0u8; crate::format::SHARD_HEADER_LEN];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut b))
        .ok()
        .and_then(|_| crate::format::ShardHeader::decode(&b, path).ok())
        .is_some_and(|(h, _)| h.save_token == token)
}

/// After a commit: unlink the files of `P` that the new index (`keep`) does not reference and
/// that `orphans` proves abandoned. Best effort: failures here never fail a committed save.
pub fn cleanup(prefix: &Path, keep: &HashSet<String>, orphans: &Orphans) {
    match orphans {
        Orphans::Unlocked { previous } => {
            for rec in previous {
                if keep.contains(&rec.name) {
                    continue;
                }
                let p = with_suffix(prefix, &rec.name);
                if shard_has_token(&p, rec.save_token) {
                    let _ = fs::remove_file(p);
                }
            }
        }
        Orphans::Locked | Orphans::Listed(_) => {
            let fresh;
            let names = match orphans {
                Orphans::Listed(names) => names,
                _ => {
                    let Ok(n) = owned_names(prefix) else { return };
                    fresh = n;
                    &fresh
                }
            };
            for (suffix, path) in names {
                if keep.contains(suffix) {
                    continue;
                }
                if is_temp_suffix(suffix) {
                    remove_if_abandoned(path);
                } else {
                    let _ = fs::remove_file(path);
                }
            }
            // a writer creating its temp file in a directory removed here retries
            // (`ShardWriter::create_in`)
            crate::hashed_dirs::remove_empty(prefix);
        }
    }
}

/// Delete checkpoint `P`: the index first (the checkpoint disappears atomically), then the
/// rest, under the commit lock (so no concurrent commit at `P` is half-deleted).
pub fn remove(prefix: &Path) -> Result<()> {
    let lock = PrefixLock::acquire(prefix)?;
    let idx = index_path(prefix);
    fs::remove_file(&idx).map_err(|e| Error::io(&idx, "remove checkpoint index", e))?;
    for (suffix, path) in owned_names(prefix)? {
        if is_temp_suffix(&suffix) {
            // a temp a live writer holds is one that started after us: its save will commit
            remove_if_abandoned(&path);
        } else {
            let _ = fs::remove_file(path);
        }
    }
    crate::hashed_dirs::remove_empty(prefix);
    drop(lock);
    Ok(())
}

/// Unlink published shards that no index references (a commit that failed before its rename).
pub(crate) fn unlink_shards(prefix: &Path, recs: &[ShardRec]) {
    for r in recs {
        let _ = std::fs::remove_file(with_suffix(prefix, &r.name));
    }
}

/// Write `P.index` atomically for the given (published) shards and entries, fsync the
/// directory, then clean up what is provably orphaned. Call with `lock` acquired. If the index
/// cannot be written, the shards are unlinked again; if only the directory fsync fails, the
/// checkpoint is in place and the error says it may not survive a crash (nothing is cleaned).
#[allow(clippy::too_many_arguments)]
pub fn commit_index(
    prefix: &Path,
    shards: &[ShardRec],
    entries: Vec<EntryMeta>,
    chunk_bytes: u32,
    meta: &[u8],
    durable: bool,
    lock: &PrefixLock,
) -> Result<()> {
    let built = build_index(shards, entries, chunk_bytes, meta);
    commit_index_bytes(prefix, shards, built, durable, lock)
}

/// [`commit_index`] of an index already serialized (`built`; an error there is handled as a
/// failed build: this save's shards are unlinked and the error returned).
pub fn commit_index_bytes(
    prefix: &Path,
    shards: &[ShardRec],
    built: Result<Vec<u8>>,
    durable: bool,
    lock: &PrefixLock,
) -> Result<()> {
    let (bytes, failed) = match built {
        Ok(b) => (b, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let built = failed.map_or(Ok(bytes.as_slice()), Err);
    let (keep, orphans) = commit_without_cleanup(prefix, shards, built, durable, lock)?;
    cleanup(prefix, &keep, &orphans);
    Ok(())
}

/// The commit of [`commit_index_bytes`] up to its cleanup: returns the names the new index
/// references and what the cleanup may remove besides, for [`cleanup`] now or for a
/// background cleanup that takes the lock with it (`crate::background_cleanup`).
pub fn commit_without_cleanup(
    prefix: &Path,
    shards: &[ShardRec],
    built: Result<&[u8]>,
    durable: bool,
    lock: &PrefixLock,
) -> Result<(HashSet<String>, Orphans)> {
    let orphans = if lock.held() {
        Orphans::Locked
    } else {
        Orphans::Unlocked {
            previous: current_shards(prefix),
        }
    };
    let written = built.and_then(|bytes| replace_file(&index_path(prefix), bytes, durable));
    if let Err(e) = written {
        unlink_shards(prefix, shards);
        return Err(e);
    }
    if durable {
        // Before cleanup: unlinking the old shards must not become durable before the rename.
        sync_dir_after_commit(&parent_dir(prefix))?;
    }
    crate::fault::point("commit.done");
    let keep: HashSet<String> = shards.iter().map(|s| s.name.clone()).collect();
    Ok((keep, orphans))
}

#[cfg(test)]
mod tests;
