//! A commit's cleanup run off the committer's critical path (FORMAT.md §8.3, docs/SCALE.md).
//!
//! After a multi-writer merge replaces a checkpoint, its cleanup unlinks the replaced save's
//! shards and every consumed partial index: at 4,096 ranks, 8,000+ unlinks, seconds of system
//! time on some disks, all after the new `P.index` is already durable. [`spawn`] hands that
//! cleanup to a thread that **owns the prefix's commit lock** until it is done: every publish,
//! commit, `remove` and `gc` at `P` takes that lock, so the next save's writers wait for the
//! cleanup instead of racing it, and the set of files the cleanup may remove is exactly what
//! an inline cleanup would have removed. Readers are unaffected: the committed index names
//! none of the files being removed.
//!
//! Crash safety: a process that dies (or is killed) before its cleanup finished leaves
//! unreferenced files only; the next locked commit at `P` removes every file of `P` that its
//! index does not reference, and `gc` does the same, so nothing needs to remember the
//! interrupted cleanup. [`wait_all`] joins the pending cleanups (the Python package calls it
//! at interpreter exit, and users call it as `shardpoint.wait_for_cleanups()`).
//!
//! Fork: a child forked while a cleanup holds the lock would inherit the lock's open file
//! description and keep the prefix locked for its whole life (a data-loader worker forked
//! right after a save would block the next save for an epoch). A `pthread_atfork` child
//! handler closes the child's copies of those descriptors (the parent's lock stays held), and
//! [`wait_all`] in a child does not wait for threads that exist only in its parent.

use crate::commit::{cleanup, Orphans, PrefixLock};
use std::collections::HashSet;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, Once};
use std::thread::JoinHandle;

/// Lock descriptors held by running cleanups, closed in a forked child. A fixed table of
/// atomics: the fork child handler may touch nothing that another thread could hold locked.
const SLOTS: usize = 64;
static HELD_FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

/// The process whose threads are in [`PENDING`] (0: none yet); a forked child differs.
static SPAWNED_BY: AtomicU32 = AtomicU32::new(0);
static PENDING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

extern "C" fn close_held_in_child() {
    for slot in &HELD_FDS {
        let fd = slot.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: close(2) is async-signal-safe; the fd is the child's copy of a lock
            // descriptor its parent's cleanup thread owns (that thread does not exist here).
            unsafe {
                libc::close(fd);
            }
        }
    }
}

fn register_atfork() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only closes descriptors; failure (ENOMEM) leaves
        // fork behaviour as it was, which `spawn` accepts (it only narrows a window).
        unsafe {
            libc::pthread_atfork(None, None, Some(close_held_in_child));
        }
    });
}

/// Claim a slot for `fd`; None if all are taken (the caller then cleans up inline).
fn claim_slot(fd: RawFd) -> Option<usize> {
    HELD_FDS.iter().position(|s| {
        s.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })
}

/// Remove the files of `prefix` that the just-committed index (`keep`) does not reference and
/// `orphans` proves abandoned, on a thread that holds `lock` until it is done. Cleans up
/// inline instead (returning when done) where the lock is not really held (no `flock` here:
/// only a locked cleanup may run behind the next save's back), every fork slot is taken, or
/// the thread cannot be started.
pub fn spawn(prefix: PathBuf, keep: HashSet<String>, orphans: Orphans, lock: PrefixLock) {
    let slot = match (&orphans, lock.raw_fd().and_then(claim_slot)) {
        (Orphans::Locked | Orphans::Listed(_), Some(s)) => s,
        (_, claimed) => {
            if let Some(s) = claimed {
                HELD_FDS[s].store(-1, Ordering::SeqCst);
            }
            cleanup(&prefix, &keep, &orphans);
            drop(lock);
            return;
        }
    };
    register_atfork();
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    pending.retain(|h| !h.is_finished());
    SPAWNED_BY.store(std::process::id(), Ordering::SeqCst);
    let run = move || {
        crate::fault::point("cleanup.background");
        cleanup(&prefix, &keep, &orphans);
        HELD_FDS[slot].store(-1, Ordering::SeqCst);
        drop(lock);
    };
    // The closure is moved into the thread only if it starts; if spawning fails, run it here.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Box<dyn FnOnce() + Send>>(1);
    let spawned = std::thread::Builder::new()
        .name("shardpoint-cleanup".into())
        .spawn(move || {
            if let Ok(job) = rx.recv() {
                job()
            }
        });
    match spawned {
        Ok(h) => {
            let _ = tx.send(Box::new(run));
            pending.push(h);
        }
        Err(_) => {
            drop(pending);
            run();
        }
    }
}

/// Wait until every cleanup this process started has finished. In a forked child (whose
/// parent's cleanup threads do not exist here) it returns at once.
pub fn wait_all() {
    if SPAWNED_BY.load(Ordering::SeqCst) != std::process::id() {
        return;
    }
    let handles = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()));
    for h in handles {
        // A panicking cleanup left files a later commit or gc removes; nothing to report.
        let _ = h.join();
    }
}

/// How many cleanups are still running in this process (for tests and diagnostics).
pub fn pending() -> usize {
    if SPAWNED_BY.load(Ordering::SeqCst) != std::process::id() {
        return 0;
    }
    let pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    pending.iter().filter(|h| !h.is_finished()).count()
}
