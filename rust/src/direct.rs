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

mod aligned;
mod groups;
pub(crate) use aligned::Aligned;
use aligned::HUGE;

/// Alignment of `O_DIRECT` offsets, lengths and memory: the largest logical block size of
/// common devices (512 or 4096), and the page size.
pub const DIRECT_ALIGN: u64 = 4096;
/// Bytes per direct read: large enough that the device streams, small enough that
/// [`DIRECT_DEPTH`] of them spread a 64 MiB batch over every worker.
pub const DIRECT_PIECE: u64 = 8 << 20;
/// Groups of small values (`direct/groups.rs`) whose aligned extent is at most this are read
/// into a small-page buffer of this size; larger ones into the huge-page bounce buffer.
const SMALL_GROUP: u64 = 1 << 20;
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
    /// `O_DIRECT` requests made (each one device round trip).
    pub requests: u64,
}

impl std::ops::Add for DirectStats {
    type Output = DirectStats;

    fn add(self, o: DirectStats) -> DirectStats {
        DirectStats {
            in_place: self.in_place + o.in_place,
            bounced: self.bounced + o.bounced,
            buffered: self.buffered + o.buffered,
            requests: self.requests + o.requests,
        }
    }
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
    /// For groups of small values whose extent fits [`SMALL_GROUP`]: small pages, faulted in
    /// as touched, so that a model's few small values do not cost each worker the large
    /// bounce buffer.
    small: Option<Aligned>,
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
        let buffer = if align_up(end) - align_down(off) <= self.edge.len() as u64 {
            &mut self.edge
        } else {
            let len = self.bounce_len;
            made(&mut self.bounce, || Aligned::huge(len))?
        };
        let cap = buffer.len() as u64;
        let mut at = off;
        while at < end {
            let start = align_down(at);
            let stop = align_up(end).min(start + cap);
            let buf = &mut buffer.bytes()[..(stop - start) as usize];
            self.stats.requests += 1;
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
        self.stats.requests += 1;
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

    /// Small neighbouring pieces of file `fi` (`(offset, destination)`, in file order, their
    /// aligned extent within the bounce buffer): one read of the extent, then a copy each
    /// (see [`groups`]); from the page cache when it holds the extent and the file follows it.
    fn group(&mut self, fi: usize, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
        let files = self.files;
        let file = &files[fi];
        let lo = parts[0].0; // in file order
        let hi = parts.iter().map(|(o, d)| o + d.len() as u64).max();
        let hi = hi.unwrap_or(lo);
        let direct = match &file.direct {
            Some(d) if !(file.follow_cache && looks_cached(&file.plain.file, lo, hi - lo)) => d,
            _ => return self.each_buffered(fi, parts),
        };
        let (start, stop) = (align_down(lo), align_up(hi));
        self.stats.requests += 1;
        // small groups on small pages (faulted in as touched), the rest in the bounce buffer
        let len = self.bounce_len;
        let buffer = if stop - start <= SMALL_GROUP {
            made(&mut self.small, || Aligned::new(SMALL_GROUP as usize))?
        } else {
            made(&mut self.bounce, || Aligned::huge(len))?
        };
        let buf = &mut buffer.bytes()[..(stop - start) as usize];
        let got = match direct_read(direct, start, buf) {
            Ok(n) => n as u64,
            Err(DirectErr::Refused) => return self.each_buffered(fi, parts),
            Err(DirectErr::Io(e)) => return Err(Error::io(&file.plain.path, "read file", e)),
        };
        if start + got < hi {
            return Err(self.short(fi, start + got, hi - (start + got)));
        }
        for (off, dst) in parts.iter_mut() {
            let from = (*off - start) as usize;
            dst.copy_from_slice(&buf[from..from + dst.len()]);
        }
        self.stats.bounced += parts.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
        Ok(())
    }

    fn each_buffered(&mut self, fi: usize, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (off, dst) in parts.iter_mut() {
            self.buffered(fi, *off, dst)?;
        }
        Ok(())
    }

    fn buffered(&mut self, fi: usize, off: u64, dst: &mut [u8]) -> Result<()> {
        self.files[fi].plain.read_at(off, dst)?;
        self.stats.buffered += dst.len() as u64;
        Ok(())
    }
}

/// The buffer in `slot`, made by `make` on first need.
fn made(
    slot: &mut Option<Aligned>,
    make: impl FnOnce() -> Result<Aligned>,
) -> Result<&mut Aligned> {
    if slot.is_none() {
        *slot = Some(make()?);
    }
    Ok(slot.as_mut().expect("made above"))
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
    let whole: Vec<u64> = dsts.iter().map(|d| d.len() as u64).collect();
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
    // a huge page at least (what the buffer takes anyway), so that small values spread over
    // a file still group
    let bounce_len = (DIRECT_PIECE + 2 * DIRECT_ALIGN)
        .min((align_up(total) + 2 * DIRECT_ALIGN).max(HUGE as u64));
    let units = groups::groups(
        &items
            .iter()
            .map(|((fi, off), (d, len), _)| (*fi, *off, *len as u64, whole[*d]))
            .collect::<Vec<_>>(),
        bounce_len,
    );
    let workers = depth.clamp(1, 64).min(units.len().max(1));
    let cancel = crate::cancel::current();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_err: Mutex<Option<Error>> = Mutex::new(None);
    let sums: [AtomicU64; 4] = Default::default();
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
            let Some(unit) = units.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return Ok(());
            };
            let fi = items[unit.start].0 .0;
            let mut parts: Vec<(u64, &mut [u8])> = items[unit.clone()]
                .iter()
                .map(|((_, off), _, slot)| {
                    let dst = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                    (*off, dst.expect("each piece is taken once"))
                })
                .collect();
            match parts.as_mut_slice() {
                [(off, dst)] => w.piece(fi, *off, dst)?,
                many => w.group(fi, many)?,
            }
            for (i, (_, dst)) in unit.clone().zip(&parts) {
                if let Some(c) = piece_crcs.get(i) {
                    c.store(crate::checksum::crc(dst), Ordering::Relaxed);
                }
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
                small: None,
                stats: DirectStats::default(),
            },
            Err(e) => return Err(e),
        };
        let out = work(&mut w);
        sums[0].fetch_add(w.stats.in_place, Ordering::Relaxed);
        sums[1].fetch_add(w.stats.bounced, Ordering::Relaxed);
        sums[2].fetch_add(w.stats.buffered, Ordering::Relaxed);
        sums[3].fetch_add(w.stats.requests, Ordering::Relaxed);
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
        requests: sums[3].load(Ordering::Relaxed),
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
