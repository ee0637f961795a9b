//! Process-wide state that survives `fork()`: the rayon pool every parallel pass runs on, and
//! [`PerProcess`], the cell that holds the object store's runtime and clients.
//!
//! Why: `fork()` copies the calling thread only. A pool built before the fork is, in the child,
//! a queue that no thread will ever serve: rayon's global pool (a static that cannot be
//! rebuilt) would make a child's first parallel call wait forever, and so would a tokio runtime
//! or an HTTP connection pool whose driver threads stayed in the parent, or a lock one of the
//! parent's other threads held at that instant. So nothing here is used across a fork: each
//! value remembers the process that built it, and a child that finds its parent's value builds
//! its own, exactly as a fresh process would. The parent's value is leaked in the child, never
//! dropped: dropping it would signal threads that do not exist and take locks that may be held
//! forever.
//!
//! Every parallel call of the crate goes through [`install`] (rayon then runs the closure's
//! `par_iter`s on this process's pool); none reaches rayon's global pool. `tests/fork.rs` forks
//! after using every pool and checks that the child's parallel calls finish.

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// Forks seen by this process's line: bumped in the child by a `pthread_atfork` handler. With
/// the pid it names "this process" even where a pid is reused (a grandchild can be given the
/// pid of a grandparent that has exited).
static FORKS: AtomicU64 = AtomicU64::new(0);
static HANDLER: AtomicBool = AtomicBool::new(false);

extern "C" fn count_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Who this process is: (pid, forks in its line). Different in a forked child.
fn me() -> (u32, u64) {
    // A flag, not a `Once`: a fork while another thread sat inside a `Once` would leave the
    // child blocked on it. Losing the race only means a caller runs before the handler exists,
    // and the pid still tells a child apart.
    if !HANDLER.load(Ordering::Acquire) && !HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain function that only touches an atomic (async-signal-safe).
        unsafe {
            libc::pthread_atfork(None, None, Some(count_fork_in_child));
        }
    }
    (std::process::id(), FORKS.load(Ordering::Acquire))
}

struct Slot<T> {
    owner: (u32, u64),
    value: T,
}

/// A lazily built value private to the process that built it: a forked child gets a fresh one
/// on first use (the parent's is leaked there, see the module doc). Lock-free, so a fork can
/// never leave it locked. References stay valid for the cell's life: a slot is freed only when
/// the cell is dropped in the process that built it.
pub struct PerProcess<T> {
    slot: AtomicPtr<Slot<T>>,
    _owns: PhantomData<Box<T>>,
}

// SAFETY: values are built and dropped by whichever thread uses or drops the cell (T: Send)
// and shared by reference between threads (T: Sync); the pointer is only swapped atomically.
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}
unsafe impl<T: Send> Send for PerProcess<T> {}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> PerProcess<T> {
    /// An empty cell (usable in a `static`).
    pub const fn new() -> Self {
        PerProcess {
            slot: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// This process's value, built by `init` on first use in each process. Two threads racing
    /// may both build one; one is kept and the other dropped.
    pub fn get_or_try_init<E>(&self, init: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        let me = me();
        let mut init = Some(init);
        let mut fresh: *mut Slot<T> = ptr::null_mut();
        loop {
            let cur = self.slot.load(Ordering::Acquire);
            // SAFETY: a non-null slot is a leaked Box that lives as long as the cell (see Drop).
            if let Some(s) = unsafe { cur.as_ref() } {
                if s.owner == me {
                    if !fresh.is_null() {
                        // SAFETY: another thread of this process was first; ours was never shared.
                        drop(unsafe { Box::from_raw(fresh) });
                    }
                    return Ok(&s.value);
                }
            }
            if let Some(f) = init.take() {
                fresh = Box::into_raw(Box::new(Slot {
                    owner: me,
                    value: f()?,
                }));
            }
            // A slot replaced here is a parent's: leaked on purpose.
            if self
                .slot
                .compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // SAFETY: `fresh` is now owned by the cell.
                return Ok(unsafe { &(*fresh).value });
            }
        }
    }

    /// [`Self::get_or_try_init`] for an `init` that cannot fail.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        match self.get_or_try_init(|| Ok::<T, std::convert::Infallible>(init())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let p = *self.slot.get_mut();
        if p.is_null() {
            return;
        }
        // SAFETY: the slot is owned by the cell, which nobody else can reach any more.
        let s = unsafe { Box::from_raw(p) };
        if s.owner != me() {
            std::mem::forget(s); // a parent's value: its threads and locks are not ours
        }
    }
}

static POOL: PerProcess<rayon::ThreadPool> = PerProcess::new();

/// This process's pool (rayon's defaults: `RAYON_NUM_THREADS`, else one thread per core).
pub fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("shardpoint-{i}"))
            .build()
            .expect("start shardpoint's thread pool")
    })
}

/// Run `op` on this process's pool: its `par_iter`s, `join`s and `current_num_threads` use
/// the pool. Inside the pool already (a nested call) it runs `op` right here.
pub fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    pool().install(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_keeps_one_value_per_process() {
        let c: PerProcess<Vec<u8>> = PerProcess::new();
        let a = c.get_or_init(|| vec![1]) as *const Vec<u8>;
        let b = c.get_or_init(|| vec![2]) as *const Vec<u8>;
        assert_eq!(a, b);
        assert_eq!(c.get_or_init(|| vec![3]), &vec![1]);
        let e: PerProcess<u8> = PerProcess::new();
        assert_eq!(e.get_or_try_init(|| Err::<u8, &str>("no")), Err("no"));
        assert_eq!(e.get_or_try_init(|| Ok::<u8, &str>(7)), Ok(&7));
    }

    #[test]
    fn install_runs_on_the_pool_and_nests_in_place() {
        use rayon::prelude::*;
        let (idx, inner, n) = install(|| {
            let idx = rayon::current_thread_index();
            let inner = install(rayon::current_thread_index);
            let n: u64 = (0..1000u64).into_par_iter().sum();
            (idx, inner, n)
        });
        assert!(idx.is_some());
        assert_eq!(idx, inner);
        assert_eq!(n, 499_500);
        assert_eq!(rayon::current_thread_index(), None);
    }
}
