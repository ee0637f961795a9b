//! Thread pools of a chosen size for the bulk-load calls that take `threads=` (the weights
//! iterator's knob): one rayon pool per size, built on first use and kept, so a load of many
//! batches does not spawn threads per batch. `None` runs on rayon's global pool (one thread
//! per CPU), as every other call does.

use pyo3::prelude::*;
use rayon::ThreadPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Pools above this size are refused: more threads than this only add contention.
const MAX_THREADS: usize = 1024;

fn pool(py: Python<'_>, threads: usize) -> PyResult<Arc<ThreadPool>> {
    if threads == 0 || threads > MAX_THREADS {
        return Err(crate::invalid(
            py,
            format!("threads must be between 1 and {MAX_THREADS}, got {threads}"),
        ));
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Ok(p.clone());
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("shardpoint-load-{i}"))
        .build()
        .map_err(|e| crate::invalid(py, format!("cannot start {threads} threads: {e}")))?;
    let p = Arc::new(p);
    pools.insert(threads, p.clone());
    Ok(p)
}

/// Run `f` on a pool of `threads` threads (`None`: the global pool). The caller's cancel
/// token (Ctrl-C) is carried onto the pool thread that runs `f`.
pub(crate) fn on_threads<T: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<impl FnOnce() -> shardpoint_core::Result<T> + Send> {
    let p = threads.map(|n| pool(py, n)).transpose()?;
    Ok(move || match p {
        None => f(),
        Some(p) => {
            let token = shardpoint_core::cancel::current();
            p.install(move || {
                let _scope = token.enter();
                f()
            })
        }
    })
}
