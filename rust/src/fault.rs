//! Test-only kill points: the process SIGKILLs itself at a named point of a save, so that
//! tests can prove what a rank or coordinator that dies *there* leaves behind (tests/scale,
//! docs/SCALE.md "A rank that dies mid-save").
//!
//! `SHARDPOINT_TEST_KILL_AT=<point>[:<n>]` arms the `n`-th (default first) arrival at
//! `<point>` in this process. Points:
//!
//! - `shard.item`: a value's bytes were written to a shard's temp file or upload (mid-data);
//! - `upload.part`: a part of a shard's multipart upload was uploaded (the writer waited for
//!   it), the upload is not completed;
//! - `writer.published`: a writer's shards are published (renamed / uploaded), its partial
//!   index or index is not written yet;
//! - `merge.read`: the coordinator read and merged every partial index, nothing committed;
//! - `commit.done`: the index is committed (renamed / put), the replaced shards and consumed
//!   partials are not deleted yet;
//! - `cleanup.background`: a background cleanup (`merge_local(.., true)`) started, holding
//!   the commit lock, nothing of it removed yet.
//!
//! `SHARDPOINT_TEST_DELAY_AT=<point>:<ms>` makes every arrival at `<point>` sleep `ms`
//! milliseconds instead (tests that must act while, say, a background cleanup holds the
//! commit lock).
//!
//! Read once; unset (always, outside tests) a point costs one atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms a kill point.
pub const KILL_AT_ENV: &str = "SHARDPOINT_TEST_KILL_AT";

struct Armed {
    point: String,
    nth: u64,
    seen: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let v = std::env::var(KILL_AT_ENV).ok()?;
            let (point, nth) = match v.split_once(':') {
                Some((p, n)) => (p.to_string(), n.parse().ok()?),
                None => (v, 1),
            };
            (!point.is_empty()).then_some(Armed {
                point,
                nth,
                seen: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// The environment variable that arms a delay point.
pub const DELAY_AT_ENV: &str = "SHARDPOINT_TEST_DELAY_AT";

fn delayed() -> Option<&'static (String, u64)> {
    static DELAYED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    DELAYED
        .get_or_init(|| {
            let v = std::env::var(DELAY_AT_ENV).ok()?;
            let (point, ms) = v.split_once(':')?;
            Some((point.to_string(), ms.parse().ok()?))
        })
        .as_ref()
}

/// Reach the kill point `name`: SIGKILL this process if it is the armed one (a kill, not an
/// exit: no destructor runs, no temp file is removed, no buffer is flushed); sleep if it is
/// the delayed one.
pub fn point(name: &str) {
    if let Some((p, ms)) = delayed() {
        if p == name {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
        }
    }
    let Some(a) = armed() else {
        return;
    };
    if a.point == name && a.seen.fetch_add(1, Ordering::SeqCst) + 1 == a.nth {
        eprintln!("shardpoint: {KILL_AT_ENV}={name}: killing this process");
        // SAFETY: kill(2) on our own pid; no memory is touched.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
