//! Runs of consecutive byte ranges read with vectored reads: one `preadv` fills the next
//! [`RUN_BLOCK`] bytes of a run straight into the separate destinations of the values lying
//! there (each tensor's own storage), and each destination's part is crc'd right after it
//! lands, while it is still in the core's cache.
//!
//! Why: a model's file lays its values end to end (safetensors: no gaps at all; our shards:
//! small alignment padding), and many of them are small (biases, norms). Read one value at a
//! time, a run of small values costs one syscall and one work item each; read as a run it
//! costs one syscall per [`RUN_BLOCK`] and one work item per [`RUN_MAX`]. Large values gain
//! nothing and lose nothing (their blocks are the same 256 KiB reads as before).
//!
//! Gaps between values inside a run (padding, or a value the caller did not ask for, up to
//! [`RUN_GAP`] bytes) are read into a per-thread scratch buffer and dropped: one read of a few
//! extra bytes beats a second syscall.
//!
//! Reads are `preadv` on a descriptor, never a mapping: a file shortened under the load gives
//! the caller's error naming the file and the offset, never a SIGBUS (docs/RELIABILITY.md).

use crate::error::Result;
use std::fs::File;
use std::os::unix::io::AsRawFd;

/// Bytes per uncompressed work item of a load (large values are split for parallelism).
pub const RAW_PIECE: usize = 4 << 20;
/// Bytes read then crc'd at a time: the block is still in the core's cache when the crc reads it.
pub const FUSE_BLOCK: usize = 256 << 10;
/// Bytes read (and then crc'd) per vectored read: one [`FUSE_BLOCK`].
pub const RUN_BLOCK: usize = FUSE_BLOCK;
/// The most bytes of values in one run (one work item): as one raw piece of a large value, so
/// the workers' items stay the same size whatever the values' sizes.
pub const RUN_MAX: u64 = RAW_PIECE as u64;
/// The largest gap between two values that still joins them into one run.
pub const RUN_GAP: u64 = 64 << 10;
/// The most iovecs per `preadv` (Linux's `IOV_MAX`).
const MAX_IOV: usize = 1024;

/// One value (or piece of one) of a run: where it lies in the file, and its destination.
pub struct Seg<'d> {
    pub offset: u64,
    pub dst: &'d mut [u8],
}

/// Why a run stopped short: the caller turns it into an error naming its file.
pub enum RunFailure {
    /// The file ended before byte `end` (the read started at `offset`).
    Short { offset: u64, end: u64 },
    /// The read failed.
    Io(std::io::Error),
}

thread_local! {
    /// Where gap bytes inside a run are read to (never looked at).
    static GAP_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Group items (sorted by file, then offset; `(file, offset, len)` each) into runs: index
/// ranges of consecutive items of one file, gaps at most [`RUN_GAP`], at most [`RUN_MAX`]
/// bytes of values each (an item larger than that is a run alone).
pub fn group<F: PartialEq>(items: &[(F, u64, u64)]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut bytes = 0u64;
    for (i, (f, off, len)) in items.iter().enumerate() {
        if let Some(last) = out.last_mut() {
            let (pf, poff, plen) = &items[i - 1];
            let end = poff + plen;
            if pf == f && *off >= end && off - end <= RUN_GAP && bytes + len <= RUN_MAX {
                last.end = i + 1;
                bytes += len;
                continue;
            }
        }
        out.push(i..i + 1);
        bytes = *len;
    }
    out
}

/// Read a run: `segs` (sorted by offset, not overlapping, gaps at most [`RUN_GAP`]) from
/// `file` at `base` + each offset, with one `preadv` per [`RUN_BLOCK`] (short reads resumed;
/// without `crc`, one per [`RUN_MAX`]).
/// Returns each segment's crc32c when `crc` (else zeros). On a failure some destinations may
/// hold new bytes; `fail` makes the error.
pub fn read_run(
    file: &File,
    base: u64,
    segs: &mut [Seg<'_>],
    crc: bool,
    fail: impl Fn(RunFailure) -> crate::error::Error,
) -> Result<Vec<u32>> {
    let mut crcs = vec![0u32; segs.len()];
    let Some(first) = segs.first() else {
        return Ok(crcs);
    };
    let widest_gap = segs
        .windows(2)
        .map(|w| {
            w[1].offset
                .saturating_sub(w[0].offset + w[0].dst.len() as u64)
        })
        .max()
        .unwrap_or(0);
    if widest_gap > RUN_GAP {
        return Err(crate::error::Error::InvalidArgument(format!(
            "a run's gap of {widest_gap} bytes is over {RUN_GAP}"
        )));
    }
    let mut at = first.offset; // file offset (less `base`) of the next byte to read
    let (mut si, mut so) = (0usize, 0usize); // the next segment, and how much of it is read
                                             // Without a crc there is nothing to keep in cache: a whole run per read.
    let block = if crc { RUN_BLOCK } else { RUN_MAX as usize };
    GAP_SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < RUN_GAP as usize {
            scratch.resize(RUN_GAP as usize, 0);
        }
        let gap_ptr = scratch.as_mut_ptr();
        // One block at a time: iovecs over the next RUN_BLOCK bytes (values and gaps), and the
        // parts of segments they fill (segment, start, len), to crc once the block is in.
        let mut iov: Vec<libc::iovec> = Vec::new();
        let mut parts: Vec<(usize, usize, usize)> = Vec::new();
        while si < segs.len() {
            iov.clear();
            parts.clear();
            let (mut ti, mut to, mut pos, mut want) = (si, so, at, 0usize);
            while ti < segs.len() && want < block && iov.len() + 2 <= MAX_IOV {
                let s = &mut segs[ti];
                if pos < s.offset {
                    let g = (s.offset - pos) as usize;
                    iov.push(libc::iovec {
                        iov_base: gap_ptr.cast(),
                        iov_len: g,
                    });
                    want += g;
                    pos = s.offset;
                }
                let n = (s.dst.len() - to).min(block.saturating_sub(want).max(1));
                if n > 0 {
                    iov.push(libc::iovec {
                        iov_base: s.dst[to..].as_mut_ptr().cast(),
                        iov_len: n,
                    });
                    parts.push((ti, to, n));
                }
                want += n;
                pos += n as u64;
                to += n;
                if to == s.dst.len() {
                    ti += 1;
                    to = 0;
                }
            }
            read_fully(file, base + at, &mut iov, want).map_err(|f| match f {
                RunFailure::Short { offset, .. } => fail(RunFailure::Short {
                    offset: offset - base,
                    end: at + want as u64,
                }),
                other => fail(other),
            })?;
            if crc {
                for &(k, from, n) in &parts {
                    crcs[k] = crate::checksum::crc_append(crcs[k], &segs[k].dst[from..from + n]);
                }
            }
            (si, so, at) = (ti, to, pos);
        }
        Ok(crcs)
    })
}

/// `preadv` until `want` bytes are in (a short read resumes where it stopped); the file's end
/// first is [`RunFailure::Short`] with the offset reached.
fn read_fully(
    file: &File,
    mut off: u64,
    iov: &mut [libc::iovec],
    want: usize,
) -> std::result::Result<(), RunFailure> {
    let mut got = 0usize;
    let mut first = 0usize;
    while got < want {
        let cnt = (iov.len() - first) as libc::c_int;
        // SAFETY: every iovec points into a live, exclusively borrowed destination (or the
        // thread's gap scratch) of at least its length; the fd is open for the call.
        let n = unsafe { libc::preadv(file.as_raw_fd(), iov[first..].as_ptr(), cnt, off as i64) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(RunFailure::Io(e));
        }
        if n == 0 {
            return Err(RunFailure::Short {
                offset: off,
                end: off + (want - got) as u64,
            });
        }
        let mut n = n as usize;
        got += n;
        off += n as u64;
        // Drop the iovecs the read filled, and trim the one it stopped inside.
        while n > 0 && first < iov.len() {
            let v = &mut iov[first];
            if n >= v.iov_len {
                n -= v.iov_len;
                first += 1;
            } else {
                // SAFETY: advancing within the same iovec's buffer, `n` < its length.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
                v.iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    fn fail(path: &'static str) -> impl Fn(RunFailure) -> Error {
        move |f| match f {
            RunFailure::Short { offset, end } => Error::corrupt(
                std::path::Path::new(path),
                offset,
                format!("file ends before {end}"),
            ),
            RunFailure::Io(e) => Error::io(std::path::Path::new(path), "read", e),
        }
    }

    #[test]
    fn groups_by_file_gap_and_size() {
        let big = RUN_MAX;
        let items = [
            (0, 0, 10),
            (0, 10, 20),               // contiguous
            (0, 30 + RUN_GAP, 5),      // gap exactly RUN_GAP: joins
            (0, 100 + 2 * RUN_GAP, 5), // gap too wide: new run
            (1, 0, 5),                 // other file: new run
            (1, 5, big),               // would pass RUN_MAX: new run
            (1, 5 + big, 1),           // the big one is full: new run
        ];
        let runs = group(&items);
        assert_eq!(runs, vec![0..3, 3..4, 4..5, 5..6, 6..7]);
        assert!(group::<u8>(&[]).is_empty());
    }

    #[test]
    fn a_run_fills_each_destination_across_block_boundaries_and_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let all = data(RUN_BLOCK * 3 + 12345);
        std::fs::write(&p, &all).unwrap();
        let f = File::open(&p).unwrap();
        // Values of 1 byte, a block and a bit (split across two reads), a gap, small ones.
        let layout: [(u64, usize); 6] = [
            (100, 1),
            (101, RUN_BLOCK + 7),
            (101 + RUN_BLOCK as u64 + 7 + 4000, 3),
            (101 + RUN_BLOCK as u64 + 7 + 4003, 0),
            (101 + RUN_BLOCK as u64 + 7 + 4003, 50_000),
            (
                101 + RUN_BLOCK as u64 + 7 + 4003 + 50_000 + 60_000,
                RUN_BLOCK,
            ),
        ];
        let mut bufs: Vec<Vec<u8>> = layout.iter().map(|&(_, n)| vec![0xEE; n]).collect();
        let mut segs: Vec<Seg<'_>> = layout
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(offset, _), b)| Seg { offset, dst: b })
            .collect();
        let crcs = read_run(&f, 0, &mut segs, true, fail("f")).unwrap();
        for (k, &(off, n)) in layout.iter().enumerate() {
            let want = &all[off as usize..off as usize + n];
            assert_eq!(bufs[k], want, "segment {k}");
            assert_eq!(crcs[k], crc32c::crc32c(want), "crc of segment {k}");
        }
        // The same run from a base offset (a single-file checkpoint's shard region).
        let mut b = vec![0u8; 1000];
        let mut segs = [Seg {
            offset: 10,
            dst: &mut b,
        }];
        read_run(&f, 500, &mut segs, false, fail("f")).unwrap();
        assert_eq!(b, all[510..1510]);
    }

    #[test]
    fn a_file_shorter_than_its_run_names_the_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let all = data(RUN_BLOCK + 1000);
        std::fs::write(&p, &all).unwrap();
        let f = File::open(&p).unwrap();
        let (mut a, mut b) = (vec![0u8; RUN_BLOCK], vec![0u8; 2000]);
        let mut segs = [
            Seg {
                offset: 0,
                dst: &mut a,
            },
            Seg {
                offset: RUN_BLOCK as u64,
                dst: &mut b,
            },
        ];
        let err = read_run(&f, 0, &mut segs, true, fail("/x/shard")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/x/shard") && msg.contains(&format!("{}", RUN_BLOCK + 1000)),
            "{msg}"
        );
        // A gap wider than a run allows is the caller's bug, refused before any read.
        let mut c = vec![0u8; 1];
        let mut d = vec![0u8; 1];
        let mut segs = [
            Seg {
                offset: 0,
                dst: &mut c,
            },
            Seg {
                offset: 2 + RUN_GAP,
                dst: &mut d,
            },
        ];
        assert!(read_run(&f, 0, &mut segs, false, fail("f")).is_err());
    }

    #[test]
    fn many_tiny_values_need_more_than_one_preadv_worth_of_iovecs() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let all = data(3 * MAX_IOV * 4);
        std::fs::write(&p, &all).unwrap();
        let f = File::open(&p).unwrap();
        // 3 * MAX_IOV values of 2 bytes, each followed by a 2-byte gap: 2 iovecs per value.
        let mut bufs: Vec<Vec<u8>> = (0..3 * MAX_IOV).map(|_| vec![0u8; 2]).collect();
        let mut segs: Vec<Seg<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| Seg {
                offset: 4 * i as u64,
                dst: b,
            })
            .collect();
        let crcs = read_run(&f, 0, &mut segs, true, fail("f")).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(b, &all[4 * i..4 * i + 2]);
            assert_eq!(crcs[i], crc32c::crc32c(b));
        }
    }
}
