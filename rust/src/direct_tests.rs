//! Tests of the cold-read engine (`direct.rs`).

use super::*;

/// Drop `path` from the page cache; whether every page left. Eviction is a hint (tmpfs keeps
/// its pages, a busy host may keep some): a test holds the engine to "read from the device"
/// only when it took.
fn evict(path: &std::path::Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path).unwrap();
    f.sync_all().unwrap(); // dirty pages are not dropped
                           // SAFETY: a hint on an open fd.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a read-only mapping of a file the test wrote and nobody changes meanwhile.
    let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    // SAFETY: sysconf reads a constant of the running kernel.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: `m` spans `len` bytes; `resident` holds one byte per page of them.
    let rc = unsafe { libc::mincore(m.as_ptr() as *mut libc::c_void, len, resident.as_mut_ptr()) };
    rc == 0 && resident.iter().all(|b| b & 1 == 0)
}

/// `paths` opened as the engine opens them.
fn open_all(paths: &[std::path::PathBuf], follow_cache: bool) -> Vec<DirectFile> {
    paths
        .iter()
        .map(|p| DirectFile {
            plain: PlainFile::open(p).unwrap(),
            direct: open_direct(p),
            follow_cache,
        })
        .collect()
}

#[test]
fn reads_every_kind_of_range_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    let n = (DIRECT_PIECE * 2 + 12345) as usize;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    let evicted = evict(&p);
    // congruent destinations (in place), unaligned ones (bounced), tiny and file-end ones
    let mut big = Aligned::new(n + 2 * DIRECT_ALIGN as usize).unwrap();
    let whole = big.bytes();
    let (a_off, a_len) = (100u64, DIRECT_PIECE as usize + 5000);
    let (b_off, b_len) = (a_off + a_len as u64 + 3, 3 << 20);
    let (c_off, c_len) = (n as u64 - 10, 10);
    let (first, _) = whole.split_at_mut(a_off as usize + a_len);
    let a = &mut first[a_off as usize..];
    let mut b = vec![0u8; b_len + 1];
    let mut c = vec![0u8; c_len];
    let stats = read_files_direct(
        std::slice::from_ref(&p),
        &[(0, a_off), (0, b_off), (0, c_off)],
        vec![a, &mut b[1..], &mut c[..]],
        4,
    )
    .unwrap();
    assert_eq!(&first[a_off as usize..], &data[a_off as usize..][..a_len]);
    assert_eq!(&b[1..], &data[b_off as usize..][..b_len]);
    assert_eq!(&c[..], &data[c_off as usize..]);
    let sum = stats.in_place + stats.bounced + stats.buffered;
    assert_eq!(sum, (a_len + b_len + c_len) as u64);
    if evicted && open_direct(&p).is_some() {
        // a cold file on a file system that takes O_DIRECT: both direct kinds were used
        assert!(
            stats.in_place >= DIRECT_PIECE && stats.bounced >= b_len as u64,
            "{stats:?}"
        );
    }
}

#[test]
fn a_range_past_the_end_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("short");
    std::fs::write(&p, [1u8; 100]).unwrap();
    let mut out = [0u8; 50];
    let err = read_files_direct(std::slice::from_ref(&p), &[(0, 60)], vec![&mut out[..]], 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("past the end") && err.contains("short"),
        "{err}"
    );
    let err = read_files_direct(std::slice::from_ref(&p), &[(3, 0)], vec![&mut out[..]], 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("file index 3"), "{err}");
}

#[test]
fn a_warm_file_is_read_from_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("warm");
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 13) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    let _ = std::fs::read(&p).unwrap(); // cached now
    let mut out = vec![0u8; data.len()];
    let stats =
        read_files_direct(std::slice::from_ref(&p), &[(0, 0)], vec![&mut out[..]], 2).unwrap();
    assert_eq!(out, data);
    assert_eq!(stats.buffered, data.len() as u64);
}

#[test]
fn huge_buffers_start_at_a_huge_page_boundary_and_are_whole_pages() {
    for want in [1, HUGE - 1, HUGE, (4 << 20) + 3] {
        let mut b = Aligned::huge(want).unwrap();
        assert!(b.addr().is_multiple_of(HUGE), "{want}");
        assert!(
            b.len() >= want && b.len().is_multiple_of(HUGE),
            "{want}: {}",
            b.len()
        );
        let bytes = b.bytes();
        assert!(bytes.iter().all(|&x| x == 0), "zeroed");
        // every byte is mapped and writable (the head and tail unmapped lie outside)
        bytes.fill(0xa5);
        assert!(b.as_slice().iter().all(|&x| x == 0xa5));
    }
}

#[test]
fn crcs_of_destinations_are_combined_from_their_pieces() {
    // destinations of several pieces, one cut mid-piece, the same range twice, an empty one,
    // from two files, listed out of file order: each crc is the crc of its bytes
    let dir = tempfile::tempdir().unwrap();
    let n = (DIRECT_PIECE * 3 + 777) as usize;
    let paths: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("f{i}"))).collect();
    let data: Vec<Vec<u8>> = (0..2u64)
        .map(|k| {
            (0..n as u64)
                .map(|i| ((i * (7 + k) + i / 4093) % 251) as u8)
                .collect()
        })
        .collect();
    for (p, d) in paths.iter().zip(&data) {
        std::fs::write(p, d).unwrap();
        evict(p); // values and crcs are checked either way
    }
    let ranges = [
        (1usize, 4096u64, 2 * DIRECT_PIECE as usize + 5),
        (0, 123, DIRECT_PIECE as usize),
        (0, 123, DIRECT_PIECE as usize),
        (1, 9, 0),
        (0, DIRECT_PIECE * 2 - 17, 40),
    ];
    let mut outs: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0u8; r.2]).collect();
    let files = open_all(&paths, true);
    let at: Vec<(usize, u64)> = ranges.iter().map(|r| (r.0, r.1)).collect();
    let dsts = outs.iter_mut().map(|o| &mut o[..]).collect();
    let (_, crcs) = read_direct_crcs(&files, &at, dsts, 3, true).unwrap();
    assert_eq!(crcs.len(), ranges.len());
    for ((r, out), c) in ranges.iter().zip(&outs).zip(&crcs) {
        let want = &data[r.0][r.1 as usize..][..r.2];
        assert_eq!(&out[..], want);
        assert_eq!(*c, crate::checksum::crc(want), "range {r:?}");
    }
    let dsts = outs.iter_mut().map(|o| &mut o[..]).collect();
    let (_, none) = read_direct_crcs(&files, &at, dsts, 3, false).unwrap();
    assert!(none.is_empty());
}

#[test]
fn a_cached_file_follows_the_cache_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("warm");
    let n = (DIRECT_PIECE + 8192) as usize;
    let data: Vec<u8> = (0..n).map(|i| (i * 13 % 241) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    File::open(&p).unwrap().sync_all().unwrap(); // written and clean: every page cached
    for follow in [true, false] {
        let mut out = Aligned::new(n).unwrap();
        let stats = read_files_direct_with(
            std::slice::from_ref(&p),
            &[(0, 0)],
            vec![&mut out.bytes()[..n]],
            2,
            follow,
        )
        .unwrap();
        assert_eq!(&out.bytes()[..n], &data[..]);
        if follow || open_direct(&p).is_none() {
            assert_eq!(stats.buffered, n as u64, "follow={follow} {stats:?}");
        } else {
            // judged cold by the caller: the device, even for cached pages (no read-ahead
            // cascade through the cache)
            assert_eq!(stats.buffered, 0, "{stats:?}");
            assert_eq!(stats.in_place + stats.bounced, n as u64);
        }
    }
}

#[test]
fn many_small_neighbours_are_read_together_exactly_with_their_crcs() {
    // 3,000 small values of two files, with gaps, duplicates and the small tail of a large
    // value cut at a piece boundary, listed out of file order
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("s{i}"))).collect();
    let n = (DIRECT_PIECE + (6 << 20)) as usize;
    let data: Vec<Vec<u8>> = (0..2u64)
        .map(|k| {
            (0..n as u64)
                .map(|i| ((i * (3 + k) + i / 509) % 253) as u8)
                .collect()
        })
        .collect();
    let mut cold = true;
    for (p, d) in paths.iter().zip(&data) {
        std::fs::write(p, d).unwrap();
        cold &= evict(p);
    }
    let mut ranges: Vec<(usize, u64, usize)> = (0..3000u64)
        .map(|i| {
            (
                (i % 2) as usize,
                1000 + i * 2100 + i % 7,
                (1 + i * 37 % 2048) as usize,
            )
        })
        .collect();
    ranges.push((0, 1000, 5)); // inside the first value
    ranges.push((1, 0, DIRECT_PIECE as usize + 300)); // a large value with a small tail piece
    ranges.reverse();
    let mut outs: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0u8; r.2]).collect();
    let files = open_all(&paths, false);
    let at: Vec<(usize, u64)> = ranges.iter().map(|r| (r.0, r.1)).collect();
    let dsts = outs.iter_mut().map(|o| &mut o[..]).collect();
    let (stats, crcs) = read_direct_crcs(&files, &at, dsts, 4, true).unwrap();
    for ((r, out), c) in ranges.iter().zip(&outs).zip(&crcs) {
        let want = &data[r.0][r.1 as usize..][..r.2];
        assert_eq!(&out[..], want, "range {r:?}");
        assert_eq!(*c, crate::checksum::crc(want), "range {r:?}");
    }
    let total: u64 = ranges.iter().map(|r| r.2 as u64).sum();
    assert_eq!(stats.in_place + stats.bounced + stats.buffered, total);
    if cold && files.iter().all(|f| f.direct.is_some()) {
        assert_eq!(stats.buffered, 0, "{stats:?}");
        // the small values lie in ~3 MiB of each file: a few reads of neighbours (each
        // within the bounce buffer), not one per value; the large value's two pieces
        assert!(stats.requests <= 16, "{stats:?}");
    }
}

#[test]
fn small_neighbours_of_a_file_cut_short_after_open_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("short");
    std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
    let files = open_all(std::slice::from_ref(&p), false);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(600_000)
        .unwrap();
    let at: Vec<(usize, u64)> = (0..100).map(|i| (0, i * 10_000)).collect();
    let mut outs = vec![[0u8; 100]; 100];
    let dsts = outs.iter_mut().map(|o| &mut o[..]).collect();
    let err = read_direct_crcs(&files, &at, dsts, 2, false).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("short") && msg.contains("truncated"), "{msg}");
}
