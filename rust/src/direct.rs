//! Cold reads at the device's speed: byte ranges of plain files read with `O_DIRECT`, several
//! large reads in flight, straight into their destinations where the addresses allow.
//!
//! Why not the page cache ([`crate::load::read_files_into`]) for files that are not cached: a
//! buffered read of a cold file costs a page-cache allocation, the kernel's copy into the
//! caller's memory, and a queue depth of whatever the kernel's read-ahead keeps in flight. On
//! this project's machine (a virtio disk) a 1 GB file reads at 0.8 GB/s with `dd bs=16M`
//! (buffered, one stream) and 1.5 GB/s with `fio --direct=1 --iodepth=8 --bs=16M`: the device
//! wants many large requests at once, and a direct read is a DMA into the destination, no copy.
//!
//! How a range is read, piece by piece ([`DIRECT_PIECE`] bytes, cut at file offsets that are
//! multiples of the piece size, so interior pieces are aligned at both ends):
//! - a piece whose pages are all in the page cache is read with a plain `pread`
//!   (a copy from memory beats a trip to the device; a warm load keeps its speed), unless the
//!   caller turned that off for a load it judged cold ([`DirectFile::follow_cache`]);
//! - a piece whose destination address is congruent to its file offset modulo [`DIRECT_ALIGN`]
//!   (the caller placed it so: the weights iterator allocates each tensor that way) is read
//!   in place: its aligned interior with one `O_DIRECT` read, its partial first and last
//!   blocks through a 4 KiB bounce block;
//! - any other piece is read with `O_DIRECT` into the worker's aligned bounce buffer and copied
//!   out (one copy, as the page cache would cost, but at the device's queue depth).
//!
//! [`DIRECT_DEPTH`] workers (blocking in the device, not on the CPUs) take pieces in file order
//! from a shared cursor. A file system that refuses `O_DIRECT` (tmpfs before Linux 6.6, some
//! FUSE mounts), or a read it refuses with `EINVAL`, falls back to `pread` for that piece.
//! Every range is checked against its file's length before anything is read, and a file that
//! shrinks under the load gives an error naming the file and offset.

use crate::error::{Error, Result};
use crate::load::{looks_cached, PlainFile};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Alignment of `O_DIRECT` offsets, lengths and memory: the largest logical block size of
/// common devices (512 or 4096), and the page size.
pub const DIRECT_ALIGN: u64 = 4096;
/// Bytes per direct read: large enough that the device streams, small enough that
/// [`DIRECT_DEPTH`] of them spread a 64 MiB batch over every worker.
pub const DIRECT_PIECE: u64 = 8 << 20;
/// Reads in flight: what `fio` needs on a virtio disk or an NVMe drive to reach its sequential
/// rate (measured in docs/SERVING.md, "Cold reads").
pub const DIRECT_DEPTH: usize = 8;

/// Where the bytes of a [`read_files_direct`] call came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectStats {
    /// Read by DMA straight into the destination.
    pub in_place: u64,
    /// Read with `O_DIRECT` into a bounce buffer, then copied.
    pub bounced: u64,
    /// Read with `pread` (already cached, or `O_DIRECT` refused).
    pub buffered: u64,
}

impl std::ops::Add for DirectStats {
    type Output = DirectStats;

    fn add(self, o: DirectStats) -> DirectStats {
        DirectStats {
            in_place: self.in_place + o.in_place,
            bounced: self.bounced + o.bounced,
            buffered: self.buffered + o.buffered,
        }
    }
}

/// A zeroed, page-aligned buffer (what `O_DIRECT` reads into): an anonymous mapping of its own,
/// so only the pages a read touches are ever faulted in. Not `alloc_zeroed`: after glibc's
/// dynamic mmap threshold rises, an 8 MiB `calloc` comes from a thread's heap and is cleared
/// whole on every call, although in-place reads touch only a head and a tail block of it: one
/// 8 MiB clearing per worker per call cost a 1 GB load 260k page faults (docs/SERVING.md,
/// "Issue 41 (seventh round)").
pub(crate) struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the value (unmapped once, in `drop`); shared references only
// read it (`as_slice`), writes need `&mut`.
unsafe impl Send for Aligned {}
// SAFETY: as above.
unsafe impl Sync for Aligned {}

/// Bytes of a transparent huge page (x86-64 and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;

impl Aligned {
    /// `len` bytes on small pages: only the pages a read touches are faulted in.
    pub(crate) fn new(len: usize) -> Result<Aligned> {
        let len = len.max(1);
        let ptr = map(len)?;
        Ok(Aligned { ptr, len })
    }

    /// `len` bytes starting at a huge-page boundary, asking the kernel for transparent huge
    /// pages (`MADV_HUGEPAGE`; a hint it may ignore). Why: the block layer gives a direct
    /// read one segment per physically contiguous run of its memory, so into small pages a
    /// 4 MiB read is 1024 segments, and on this project's VM (virtio) a device read costs per
    /// segment: `O_DIRECT` into small pages ran 0.90-0.92 GB/s, into huge pages 2.52-2.61 GB/s
    /// in the same run (buffered reads, whose page cache holds large folios, 1.3-1.9 GB/s;
    /// docs/SERVING.md, "Issue 41 (tenth round)"). A huge page is also faulted in at once
    /// (one fault and a 2 MiB clearing): for buffers used whole, as the engine's are.
    pub(crate) fn huge(len: usize) -> Result<Aligned> {
        let len = len.max(1).div_ceil(HUGE) * HUGE;
        // map a huge page more, then unmap the unaligned head and the tail beyond `len`
        let raw = map(len + HUGE)?;
        let lead = (HUGE - raw as usize % HUGE) % HUGE;
        // SAFETY: both ranges lie inside the mapping just made (`lead < HUGE`), and nothing
        // refers to them; the part kept is `[raw + lead, raw + lead + len)`.
        unsafe {
            if lead > 0 {
                libc::munmap(raw.cast(), lead);
            }
            libc::munmap(raw.add(lead + len).cast(), HUGE - lead);
        }
        // SAFETY: as above; the range kept.
        let ptr = unsafe { raw.add(lead) };
        // SAFETY: advice on a range this value owns; failure (no THP support) leaves small
        // pages, which are still correct.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Aligned { ptr, len })
    }

    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped by self, initialized (zero pages) by the kernel.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as `bytes`; no `&mut` can coexist with this borrow.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` or `huge` with this length, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A private anonymous mapping of `len` bytes (zeroed by the kernel on first touch).
fn map(len: usize) -> Result<*mut u8> {
    // SAFETY: a private anonymous mapping (no fd, no address hint); checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::InvalidArgument(format!(
            "cannot map a {len}-byte read buffer: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(ptr.cast())
}

/// One file: the checked buffered handle and, where the file system allows, an `O_DIRECT` one.
pub(crate) struct DirectFile {
    pub(crate) plain: PlainFile,
    pub(crate) direct: Option<File>,
    /// Read a piece whose pages are all cached with `pread` (else every piece goes direct).
    /// Why a caller turns it off: a `pread` of cached pages that the kernel's read-ahead
    /// marked starts the read-ahead of the next pages, whose piece then looks cached too: on a
    /// disk whose read-ahead is as large as a piece, a file that was cold when the load began
    /// ends up read through the page cache, piece after piece (docs/SERVING.md, fifteenth
    /// round). A load that chose this engine because its files were cold (the weights
    /// iterator's `direct="cold"`, `load_into`'s cold read) reads the few cached pieces from
    /// the device too; `direct=True`, asked for whatever the cache holds, follows the cache.
    pub(crate) follow_cache: bool,
}

/// An `O_DIRECT` handle on the file `file` has open (through `/proc/self/fd`, so the same
/// inode even when the path now names another file: a checkpoint saved again at the same
/// prefix while a reader loads it); `None` where that cannot be opened.
pub(crate) fn reopen_direct(file: &File) -> Option<File> {
    use std::os::unix::io::AsRawFd;
    open_direct(std::path::Path::new(&format!(
        "/proc/self/fd/{}",
        file.as_raw_fd()
    )))
}

pub(crate) fn open_direct(path: &std::path::Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK)
        .open(path)
        .ok()
}

/// Why a direct read did not fill its buffer.
pub(crate) enum DirectErr {
    /// The kernel refused `O_DIRECT` for this request (alignment, file system): use `pread`.
    Refused,
    Io(std::io::Error),
}

/// `O_DIRECT` read of `buf` (aligned address and length) from aligned `off`, until it is full
/// or the file ends; returns the bytes read.
pub(crate) fn direct_read(
    file: &File,
    off: u64,
    buf: &mut [u8],
) -> std::result::Result<usize, DirectErr> {
    let mut got = 0usize;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Err(DirectErr::Refused),
            Err(e) => return Err(DirectErr::Io(e)),
        }
        // A short read that leaves the position unaligned ends the direct part (only at the
        // end of the file; a later read would be refused anyway).
        if !(got as u64).is_multiple_of(DIRECT_ALIGN) {
            break;
        }
    }
    Ok(got)
}

pub(crate) const fn align_down(x: u64) -> u64 {
    x / DIRECT_ALIGN * DIRECT_ALIGN
}

pub(crate) const fn align_up(x: u64) -> u64 {
    x.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
}

struct Worker<'f> {
    files: &'f [DirectFile],
    /// For the partial first and last blocks of in-place reads: one small page each time.
    edge: Aligned,
    /// For whole pieces read through a bounce buffer: made on first need, on huge pages
    /// (a direct read into small pages runs at a third of the rate; see [`Aligned::huge`]).
    bounce: Option<Aligned>,
    bounce_len: usize,
    stats: DirectStats,
}

impl Worker<'_> {
    fn short(&self, fi: usize, off: u64, want: u64) -> Error {
        let f = &self.files[fi].plain;
        Error::corrupt(
            &f.path,
            off,
            format!(
                "file ends before offset {} ({} bytes when opened): truncated while loading",
                off + want,
                f.len
            ),
        )
    }

    /// `dst` <- bytes [off, off + dst.len()) through the bounce buffer (aligned direct reads,
    /// then a copy). `Ok(false)`: the kernel refused `O_DIRECT`.
    fn bounced(&mut self, fi: usize, direct: &File, off: u64, dst: &mut [u8]) -> Result<bool> {
        let end = off + dst.len() as u64;
        let buffer = if align_up(end) - align_down(off) <= self.edge.len as u64 {
            &mut self.edge
        } else {
            if self.bounce.is_none() {
                self.bounce = Some(Aligned::huge(self.bounce_len)?);
            }
            self.bounce.as_mut().expect("made above")
        };
        let cap = buffer.len as u64;
        let mut at = off;
        while at < end {
            let start = align_down(at);
            let stop = align_up(end).min(start + cap);
            let buf = &mut buffer.bytes()[..(stop - start) as usize];
            let got = match direct_read(direct, start, buf) {
                Ok(n) => n as u64,
                Err(DirectErr::Refused) => return Ok(false),
                Err(DirectErr::Io(e)) => {
                    return Err(Error::io(&self.files[fi].plain.path, "read file", e))
                }
            };
            let upto = end.min(stop);
            if start + got < upto {
                return Err(self.short(fi, at, upto - at));
            }
            let from = (at - start) as usize;
            let n = (upto - at) as usize;
            let d = (at - off) as usize;
            dst[d..d + n].copy_from_slice(&buf[from..from + n]);
            at = upto;
        }
        self.stats.bounced += dst.len() as u64;
        Ok(true)
    }

    /// One piece: from the page cache, in place, or bounced (see the module doc).
    fn piece(&mut self, fi: usize, off: u64, dst: &mut [u8]) -> Result<()> {
        let len = dst.len() as u64;
        let file = &self.files[fi];
        let direct = match &file.direct {
            Some(d) if !(file.follow_cache && looks_cached(&file.plain.file, off, len)) => d,
            _ => return self.buffered(fi, off, dst),
        };
        let congruent = (dst.as_ptr() as u64) % DIRECT_ALIGN == off % DIRECT_ALIGN;
        let (lo, hi) = (align_up(off), align_down(off + len));
        if !congruent || hi <= lo {
            if !self.bounced(fi, direct, off, dst)? {
                return self.buffered(fi, off, dst);
            }
            return Ok(());
        }
        let (head, rest) = dst.split_at_mut((lo - off) as usize);
        let (mid, tail) = rest.split_at_mut((hi - lo) as usize);
        match direct_read(direct, lo, mid) {
            Ok(n) if n == mid.len() => {}
            Ok(n) => return Err(self.short(fi, lo + n as u64, (mid.len() - n) as u64)),
            Err(DirectErr::Refused) => return self.buffered(fi, off, dst),
            Err(DirectErr::Io(e)) => return Err(Error::io(&file.plain.path, "read file", e)),
        }
        self.stats.in_place += mid.len() as u64;
        for (at, part) in [(off, head), (hi, tail)] {
            if !part.is_empty() && !self.bounced(fi, direct, at, part)? {
                self.buffered(fi, at, part)?;
            }
        }
        Ok(())
    }

    fn buffered(&mut self, fi: usize, off: u64, dst: &mut [u8]) -> Result<()> {
        self.files[fi].plain.read_at(off, dst)?;
        self.stats.buffered += dst.len() as u64;
        Ok(())
    }
}

/// Read byte ranges of plain files (`(file index, offset)` + a destination of the range's
/// length each) into caller-owned, non-overlapping buffers: cold pieces with `O_DIRECT`,
/// `depth` reads in flight, cached pieces with `pread` (see the module doc). Every range is
/// checked against its file's length before anything is read. Returns where the bytes came
/// from.
pub fn read_files_direct(
    paths: &[std::path::PathBuf],
    ranges: &[(usize, u64)],
    dsts: Vec<&mut [u8]>,
    depth: usize,
) -> Result<DirectStats> {
    read_files_direct_with(paths, ranges, dsts, depth, true)
}

/// [`read_files_direct`]; with `follow_cache` false every piece is read with `O_DIRECT`, cached
/// or not (see [`DirectFile::follow_cache`]).
pub fn read_files_direct_with(
    paths: &[std::path::PathBuf],
    ranges: &[(usize, u64)],
    dsts: Vec<&mut [u8]>,
    depth: usize,
    follow_cache: bool,
) -> Result<DirectStats> {
    let files = paths
        .iter()
        .map(|p| {
            Ok(DirectFile {
                plain: PlainFile::open(p)?,
                direct: open_direct(p),
                follow_cache,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    read_direct(&files, ranges, dsts, depth)
}

/// [`read_files_direct`] on files already open: a reader's own shard files, so the bytes come
/// from the files it opened even when their paths now name others.
pub(crate) fn read_direct(
    files: &[DirectFile],
    ranges: &[(usize, u64)],
    dsts: Vec<&mut [u8]>,
    depth: usize,
) -> Result<DirectStats> {
    read_direct_crcs(files, ranges, dsts, depth, false).map(|(stats, _)| stats)
}

/// [`read_direct`], and with `crcs` each destination's crc32c (else none): each piece's is
/// computed by the worker that read it, right after it landed, while the other reads are in
/// flight, and combined per destination. Why: a checked load that computed them in a pass
/// after the last read waited for that pass with the device idle (our uncompressed shards
/// read direct 0.82x as fast as the same bytes in a Hugging Face file, which has no crc).
pub(crate) fn read_direct_crcs(
    files: &[DirectFile],
    ranges: &[(usize, u64)],
    dsts: Vec<&mut [u8]>,
    depth: usize,
    crcs: bool,
) -> Result<(DirectStats, Vec<u32>)> {
    let ndst = dsts.len();
    if ranges.len() != dsts.len() {
        return Err(Error::InvalidArgument(format!(
            "{} ranges but {} output buffers",
            ranges.len(),
            dsts.len()
        )));
    }
    // (file, offset), (destination, length), the piece of the destination
    type Item<'d> = ((usize, u64), (usize, usize), Mutex<Option<&'d mut [u8]>>);
    let mut items: Vec<Item<'_>> = Vec::new();
    let mut total = 0u64;
    for (d, (&(fi, off), dst)) in ranges.iter().zip(dsts).enumerate() {
        let f = files.get(fi).ok_or_else(|| {
            Error::InvalidArgument(format!("file index {fi} but {} files", files.len()))
        })?;
        let len = dst.len() as u64;
        if off.checked_add(len).is_none_or(|end| end > f.plain.len) {
            return Err(Error::corrupt(
                &f.plain.path,
                off,
                format!(
                    "range [{off}, +{len}) lies past the end of the {}-byte file",
                    f.plain.len
                ),
            ));
        }
        total += len;
        // cut at file offsets that are multiples of the piece size
        let mut rest = dst;
        let mut at = off;
        while !rest.is_empty() {
            let next = ((at / DIRECT_PIECE + 1) * DIRECT_PIECE).min(at + rest.len() as u64);
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut((next - at) as usize);
            items.push(((fi, at), (d, piece.len()), Mutex::new(Some(piece))));
            rest = tail;
            at = next;
        }
    }
    items.sort_unstable_by_key(|it| it.0);
    let workers = depth.clamp(1, 64).min(items.len().max(1));
    let bounce_len = (DIRECT_PIECE + 2 * DIRECT_ALIGN).min(align_up(total) + 2 * DIRECT_ALIGN);
    let cancel = crate::cancel::current();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    let sums = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let piece_crcs: Vec<AtomicU32> = if crcs {
        items.iter().map(|_| AtomicU32::new(0)).collect()
    } else {
        Vec::new()
    };
    let work = |w: &mut Worker<'_>| -> Result<()> {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            cancel.check()?;
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(((fi, off), _, slot)) = items.get(i) else {
                return Ok(());
            };
            let dst = slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each piece is taken once");
            w.piece(*fi, *off, &mut *dst)?;
            if let Some(c) = piece_crcs.get(i) {
                c.store(crate::checksum::crc(dst), Ordering::Relaxed);
            }
        }
    };
    let run = || {
        let mut w = match Aligned::new(2 * DIRECT_ALIGN as usize) {
            Ok(edge) => Worker {
                files,
                edge,
                bounce: None,
                bounce_len: bounce_len as usize,
                stats: DirectStats::default(),
            },
            Err(e) => return Err(e),
        };
        let out = work(&mut w);
        sums[0].fetch_add(w.stats.in_place, Ordering::Relaxed);
        sums[1].fetch_add(w.stats.bounced, Ordering::Relaxed);
        sums[2].fetch_add(w.stats.buffered, Ordering::Relaxed);
        out
    };
    let record = |r: Result<()>| {
        if let Err(e) = r {
            stop.store(true, Ordering::Relaxed);
            let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(e);
            }
        }
    };
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..workers)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("shardpoint-direct".into())
                    .spawn_scoped(s, || record(run()))
                    .ok()
            })
            .collect();
        record(run());
        for h in helpers {
            let _ = h.join();
        }
    });
    if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let stats = DirectStats {
        in_place: sums[0].load(Ordering::Relaxed),
        bounced: sums[1].load(Ordering::Relaxed),
        buffered: sums[2].load(Ordering::Relaxed),
    };
    if !crcs {
        return Ok((stats, Vec::new()));
    }
    // items are in file order, so each destination's pieces in the order they make it up
    let mut pieces: Vec<Vec<(u32, usize)>> = vec![Vec::new(); ndst];
    for ((_, (d, len), _), c) in items.iter().zip(&piece_crcs) {
        pieces[*d].push((c.load(Ordering::Relaxed), *len));
    }
    let whole = pieces.into_iter().map(crate::checksum::combine_crcs);
    Ok((stats, whole.collect()))
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
