//! `threads=` of the bulk-load calls (the weights iterator's knob): at most that many workers of
//! the process's one pool ([`shardpoint_core::load::with_max_workers`]); no pool of its own, so
//! every parallel pass stays on the fork-safe pool of `shardpoint_core::threads`.

use pyo3::prelude::*;

/// Limits above this are refused (a typo, not a machine).
const MAX_THREADS: usize = 1024;

/// `f` wrapped so that the loads it starts use at most `threads` workers (`None`: all).
pub(crate) fn on_threads<T: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<impl FnOnce() -> shardpoint_core::Result<T> + Send> {
    if let Some(n) = threads {
        if n == 0 || n > MAX_THREADS {
            return Err(crate::invalid(
                py,
                format!("threads must be between 1 and {MAX_THREADS}, got {n}"),
            ));
        }
    }
    Ok(move || shardpoint_core::load::with_max_workers(threads, f))
}
