//! The tokio runtime that drives every object-store request, one per process.

use crate::threads::PerProcess;

/// The tokio runtime that drives every object-store request. Few threads: the work is I/O;
/// decoding and checksums run on rayon. One per process: a forked child builds its own (its
/// parent's threads are not there, [`crate::threads`]).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardpoint-io")
            .enable_all()
            .build()
            .expect("start the shardpoint I/O runtime")
    })
}

/// Run a future to completion from a plain (non-runtime) thread.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// Spawn a future on the I/O runtime.
pub(crate) fn spawn<F>(f: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(f)
}
