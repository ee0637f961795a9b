//! The bulk-load engine: many values read (and checked, and decoded) into caller-owned memory
//! at the speed of the slower of the device and the CPUs.
//!
//! Three parts, each answering one bound of a load:
//! - **read-ahead** ([`with_read_ahead`]): a helper thread asks the kernel to start reading the
//!   byte ranges a load needs (`posix_fadvise(WILLNEED)`, after `SEQUENTIAL`), in the order the
//!   workers take them and a bounded window ahead of them. On a cold file this keeps many large
//!   reads in flight on the device (its queue, not the two workers' blocking preads, sets the
//!   rate), and decoding overlaps reading. Pieces already in the page cache are skipped after a
//!   two-byte `preadv2(RWF_NOWAIT)` probe, so a warm load pays two syscalls per piece, not a walk
//!   of the page cache.
//! - **ordered work** ([`for_each_ordered`]): work items sorted by file offset are taken in
//!   that order by every worker (an atomic cursor, not rayon's halving, which would start the
//!   second worker in the middle of the file, away from the read-ahead); the first error stops
//!   the others.
//! - **fused read + crc** ([`crate::runs`]): uncompressed
//!   bytes are read straight into their destinations in cache-sized blocks, each crc'd right
//!   after it lands, so every byte crosses the memory bus once (the kernel's copy) instead of
//!   twice (copy, then a crc pass); values lying end to end are read as one run, one `preadv`
//!   per block filling each value's own buffer.
//!
//! Reads are `pread`, never mapping faults: a file truncated under the load gives an error
//! naming the file and offset (the caller's `read_at`), not a SIGBUS.

use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Bytes per read-ahead request.
pub const AHEAD_PIECE: u64 = 8 << 20;
/// How far the read-ahead may run ahead of the workers: enough to keep a fast device's queue
/// full for a while, small enough that pages read ahead are not evicted before they are used.
pub const AHEAD_WINDOW: u64 = 512 << 20;
/// Loads smaller than this get no helper thread (the kernel's own read-ahead is enough).
pub const AHEAD_MIN: u64 = 16 << 20;
/// Bytes per uncompressed work item and bytes read then crc'd at a time: defined with the
/// vectored runs ([`crate::runs`]), the lower module, so the two stay one choice.
pub use crate::runs::{FUSE_BLOCK, RAW_PIECE};

/// One byte range a load will read, in the order the workers will read it.
#[derive(Clone, Copy)]
pub struct Span<'a> {
    pub file: &'a File,
    pub offset: u64,
    pub len: u64,
}

/// What the workers report to the read-ahead thread.
pub struct Progress {
    done: AtomicU64,
    stop: AtomicBool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Bytes of the load consumed so far (the read-ahead window moves with it).
    pub fn consumed(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

/// Whether the page holding byte `off` is in the page cache (a one-byte non-blocking read).
/// Unknown (an old kernel without `RWF_NOWAIT`) counts as not cached.
pub(crate) fn cached(file: &File, off: u64) -> bool {
    let mut b = [0u8; 1];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: one iovec over a live one-byte buffer; the fd is open for the call.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off as i64, libc::RWF_NOWAIT) };
    n == 1
}

/// Whether `[off, off + len)` is in the page cache, by probing its two ends and one page in
/// every [`CACHED_PROBE_STRIDE`] between them (one-byte `RWF_NOWAIT` reads: [`cached`]).
///
/// Why not only the two ends (as before): a disk whose read-ahead is as large as a direct
/// piece (this project's VM: `read_ahead_kb` 8192 = [`crate::direct::DIRECT_PIECE`]) can leave
/// a piece's first and last pages cached by a read-ahead while pages between are not, and the
/// piece was then read with `pread`, starting the read-ahead of the next one (docs/SERVING.md,
/// fifteenth round). Why not every page (`mincore` over a mapping of the piece, or
/// `cachestat`): 170 and 40 us per 8 MiB piece measured, 4-16 % of a warm piece's copy; ten
/// probes cost about a microsecond each. A cold piece fails its first probe, as before.
pub(crate) fn looks_cached(file: &File, off: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let end = off + len - 1;
    if !(cached(file, off) && cached(file, end)) {
        return false;
    }
    let mut at = off - off % CACHED_PROBE_STRIDE + CACHED_PROBE_STRIDE;
    while at < end {
        if !cached(file, at) {
            return false;
        }
        at += CACHED_PROBE_STRIDE;
    }
    true
}

/// Distance between the interior probes of [`looks_cached`]: a gap in the cache of this size or
/// more is always found.
pub(crate) const CACHED_PROBE_STRIDE: u64 = 1 << 20;

fn advise(file: &File, off: u64, len: u64, advice: libc::c_int) {
    // SAFETY: a hint on an open fd; failure only loses the hint.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), off as i64, len as i64, advice);
    }
}

/// Adjacent spans of one file (gaps under 64 KiB, as alignment padding leaves) merged, so a
/// model of many small values costs a few requests, not one per value.
fn coalesce<'a>(spans: &[Span<'a>]) -> Vec<Span<'a>> {
    let mut out: Vec<Span<'a>> = Vec::with_capacity(spans.len());
    for s in spans.iter().filter(|s| s.len > 0) {
        if let Some(last) = out.last_mut() {
            let end = last.offset + last.len;
            if std::ptr::eq(last.file, s.file) && s.offset >= end && s.offset - end < (64 << 10) {
                last.len = s.offset + s.len - last.offset;
                continue;
            }
        }
        out.push(*s);
    }
    out
}

fn read_ahead(spans: &[Span<'_>], progress: &Progress) {
    let spans = coalesce(spans);
    let mut hinted: Vec<*const File> = Vec::new();
    let mut issued = 0u64;
    for s in &spans {
        if !hinted.contains(&(s.file as *const File)) {
            hinted.push(s.file);
            // Doubles the kernel's own read-ahead for the workers' sequential preads.
            advise(s.file, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        }
        let end = s.offset + s.len;
        let mut off = s.offset;
        while off < end {
            while issued > progress.done.load(Ordering::Relaxed) + AHEAD_WINDOW {
                if progress.stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            if progress.stop.load(Ordering::Relaxed) {
                return;
            }
            let n = AHEAD_PIECE.min(end - off);
            if !(cached(s.file, off) && cached(s.file, off + n - 1)) {
                advise(s.file, off, n, libc::POSIX_FADV_WILLNEED);
            }
            issued += n;
            off += n;
        }
    }
}

/// Run `work` while a helper thread reads `spans` ahead of it (see the module doc). `work`
/// reports the bytes it consumed through the [`Progress`] it is given. Small loads run
/// without the helper.
pub fn with_read_ahead<T>(spans: &[Span<'_>], work: impl FnOnce(&Progress) -> T) -> T {
    let progress = Progress::new();
    let total: u64 = spans.iter().map(|s| s.len).sum();
    if total < AHEAD_MIN {
        return work(&progress);
    }
    std::thread::scope(|scope| {
        let p = &progress;
        let helper = std::thread::Builder::new()
            .name("shardpoint-readahead".into())
            .spawn_scoped(scope, move || read_ahead(spans, p));
        let out = work(&progress);
        progress.stop.store(true, Ordering::Relaxed);
        if let Ok(h) = helper {
            let _ = h.join();
        }
        out
    })
}

thread_local! {
    /// The most workers a load started on this thread may use ([`with_max_workers`]).
    static MAX_WORKERS: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Run `f` with the loads it starts on this thread using at most `n` workers of the process's
/// pool (`None`: all of them): the `threads=` knob of the weights iterator. A limit, not a pool
/// of its own: every parallel pass stays on the one fork-safe pool ([`crate::threads`]).
pub fn with_max_workers<T>(n: Option<usize>, f: impl FnOnce() -> T) -> T {
    let prev = MAX_WORKERS.with(|c| c.replace(n.unwrap_or(usize::MAX).max(1)));
    let out = f();
    MAX_WORKERS.with(|c| c.set(prev));
    out
}

/// Run `f(i)` for every item `0..n` on every thread of the current rayon pool (at most the
/// caller's [`with_max_workers`] limit), items taken in order from a shared cursor; the first
/// error stops the others and is returned.
pub fn for_each_ordered(n: usize, f: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    use rayon::prelude::*;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    let limit = MAX_WORKERS.with(|c| c.get());
    crate::threads::install(|| {
        let workers = rayon::current_num_threads().min(n).min(limit).max(1);
        (0..workers).into_par_iter().for_each(|_| loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            if let Err(e) = f(i) {
                stop.store(true, Ordering::Relaxed);
                let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(e);
                }
                return;
            }
        })
    });
    match first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Where a piece is read from: (file index, offset).
type FileAt = (usize, u64);
/// A destination taken exactly once by the worker that reads it.
type Slot<'d> = Mutex<Option<&'d mut [u8]>>;

/// One file of [`read_files_into`]: opened for reading, with its length at open.
pub(crate) struct PlainFile {
    pub(crate) path: std::path::PathBuf,
    pub(crate) file: File,
    pub(crate) len: u64,
}

impl PlainFile {
    pub(crate) fn open(path: &std::path::Path) -> Result<PlainFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: a FIFO planted under a shard name must not hang the open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io(path, "open file", e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
        if !meta.file_type().is_file() {
            return Err(Error::corrupt(path, 0, "not a regular file"));
        }
        Ok(PlainFile {
            path: path.to_path_buf(),
            file,
            len: meta.len(),
        })
    }

    pub(crate) fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        match self.file.read_exact_at(buf, off) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(self.short(off, off + buf.len() as u64))
            }
            Err(e) => Err(Error::io(&self.path, "read file", e)),
        }
    }

    /// The error for a read at `off` that needed bytes up to `end` and found the file's end.
    pub(crate) fn short(&self, off: u64, end: u64) -> Error {
        Error::corrupt(
            &self.path,
            off,
            format!(
                "file ends before offset {end} ({} bytes when opened): truncated while loading",
                self.len
            ),
        )
    }
}

/// Read byte ranges of plain files (`(file index, offset)` + a destination of the range's
/// length each) into caller-owned, non-overlapping buffers with the bulk-load engine
/// (read-ahead, ordered parallel vectored reads of runs of ranges: [`crate::runs`]): the load path of formats without checksums (a
/// Hugging Face safetensors directory opened in place). Every range is checked against its
/// file's length before anything is read.
pub fn read_files_into(
    paths: &[std::path::PathBuf],
    ranges: &[(usize, u64)],
    dsts: Vec<&mut [u8]>,
) -> Result<()> {
    if ranges.len() != dsts.len() {
        return Err(Error::InvalidArgument(format!(
            "{} ranges but {} output buffers",
            ranges.len(),
            dsts.len()
        )));
    }
    let files = paths
        .iter()
        .map(|p| PlainFile::open(p))
        .collect::<Result<Vec<_>>>()?;
    let mut items: Vec<(FileAt, Slot<'_>)> = Vec::new();
    for (&(fi, off), dst) in ranges.iter().zip(dsts) {
        let f = files.get(fi).ok_or_else(|| {
            Error::InvalidArgument(format!("file index {fi} but {} files", files.len()))
        })?;
        let end = off.checked_add(dst.len() as u64);
        if end.is_none_or(|end| end > f.len) {
            return Err(Error::corrupt(
                &f.path,
                off,
                format!(
                    "range [{off}, +{}) lies past the end of the {}-byte file",
                    dst.len(),
                    f.len
                ),
            ));
        }
        for (k, piece) in dst.chunks_mut(RAW_PIECE).enumerate() {
            items.push(((fi, off + (k * RAW_PIECE) as u64), Mutex::new(Some(piece))));
        }
    }
    items.sort_unstable_by_key(|it| it.0);
    let spans: Vec<Span<'_>> = items
        .iter()
        .map(|((fi, off), d)| Span {
            file: &files[*fi].file,
            offset: *off,
            len: d
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map_or(0, |d| d.len() as u64),
        })
        .collect();
    // Runs of ranges lying end to end (a safetensors file's tensors): one `preadv` fills
    // many destinations (crate::runs).
    let keyed: Vec<(usize, u64, u64)> = items
        .iter()
        .zip(&spans)
        .map(|(((fi, off), _), s)| (*fi, *off, s.len))
        .collect();
    let units = crate::runs::group(&keyed);
    let cancel = crate::cancel::current();
    with_read_ahead(&spans, |progress| {
        for_each_ordered(units.len(), |u| {
            cancel.check()?;
            let run = &items[units[u].clone()];
            let fi = run[0].0 .0;
            let f = &files[fi];
            let mut segs: Vec<crate::runs::Seg<'_>> = run
                .iter()
                .map(|((_, off), slot)| crate::runs::Seg {
                    offset: *off,
                    dst: slot
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .expect("each item is taken once"),
                })
                .collect();
            crate::runs::read_run(&f.file, 0, &mut segs, false, |e| match e {
                crate::runs::RunFailure::Short { offset, end } => f.short(offset, end),
                crate::runs::RunFailure::Io(e) => Error::io(&f.path, "read file", e),
            })?;
            progress.consumed(segs.iter().map(|s| s.dst.len() as u64).sum());
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    #[test]
    fn ordered_work_runs_every_item_once_and_stops_on_error() {
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for_each_ordered(1000, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        let ran = AtomicUsize::new(0);
        let err = for_each_ordered(100_000, |i| {
            ran.fetch_add(1, Ordering::Relaxed);
            if i == 5 {
                Err(Error::InvalidArgument("item 5".into()))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("item 5"));
        assert!(ran.load(Ordering::Relaxed) < 100_000);
    }

    #[test]
    fn max_workers_limits_the_threads_of_a_load() {
        let seen = Mutex::new(std::collections::HashSet::new());
        with_max_workers(Some(1), || {
            for_each_ordered(2000, |_| {
                seen.lock().unwrap().insert(std::thread::current().id());
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert_eq!(MAX_WORKERS.with(|c| c.get()), usize::MAX); // restored
    }

    #[test]
    fn read_files_into_reads_ranges_and_names_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(RAW_PIECE * 2 + 5000))
            .map(|i| (i % 253) as u8)
            .collect();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, &data).unwrap();
        std::fs::write(&b, &data[..100]).unwrap();
        let mut big = vec![0u8; RAW_PIECE * 2];
        let mut small = vec![0u8; 50];
        read_files_into(
            &[a.clone(), b.clone()],
            &[(0, 3000), (1, 50)],
            vec![&mut big[..], &mut small[..]],
        )
        .unwrap();
        assert_eq!(big, data[3000..3000 + RAW_PIECE * 2]);
        assert_eq!(small, data[50..100]);
        let err = read_files_into(std::slice::from_ref(&b), &[(0, 60)], vec![&mut small[..]])
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("past the end") && msg.contains("/b"), "{msg}");
    }

    #[test]
    fn a_range_counts_as_cached_only_when_every_probe_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let len = 4u64 << 20;
        std::fs::write(&p, vec![3u8; len as usize]).unwrap();
        let f = File::open(&p).unwrap();
        f.sync_all().unwrap();
        assert!(looks_cached(&f, 0, len) && looks_cached(&f, 5, 10) && looks_cached(&f, 0, 0));
        // drop the clean pages, then bring back only the two ends (no read-ahead)
        advise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
        advise(&f, 0, 0, libc::POSIX_FADV_RANDOM);
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 0).unwrap();
        f.read_exact_at(&mut b, len - 1).unwrap();
        assert!(cached(&f, 0) && cached(&f, len - 1));
        // a file system that keeps every page (tmpfs) leaves the whole range cached, and
        // then it is; one that dropped the middle is not taken for cached by its two ends
        let middle = cached(&f, len / 2);
        assert_eq!(looks_cached(&f, 0, len), middle);
        assert!(looks_cached(&f, 0, 10) && looks_cached(&f, len - 10, 10));
    }

    #[test]
    fn read_ahead_covers_a_file_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; (AHEAD_MIN + (3 << 20)) as usize])
            .unwrap();
        let f = File::open(&p).unwrap();
        let len = f.metadata().unwrap().len();
        let spans = [
            Span {
                file: &f,
                offset: 0,
                len: len / 2,
            },
            Span {
                file: &f,
                offset: len / 2 + 100,
                len: len / 2 - 100,
            },
        ];
        assert_eq!(coalesce(&spans).len(), 1);
        let got = with_read_ahead(&spans, |p| {
            p.consumed(len);
            42
        });
        assert_eq!(got, 42);
    }
}
