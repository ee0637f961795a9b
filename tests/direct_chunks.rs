//! Compressed values read by the cold-read engine (`Reader::read_many_into_direct`): exact
//! values from cold and warm files, prefix and single-file checkpoints, every depth; damage
//! and truncation named, never a hang (the engine's buffer pool is smaller than the load).

use shardpoint_core::format::{Codec, DType, Kind};
use shardpoint_core::{save, save_single, Error, Reader, WriterOptions};
use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

mod common;
use common::{flip_byte, items, Val};

/// Several values, some spanning many 4 MiB blocks: smooth floats (Huffman/zstd shrink them),
/// noise (stored raw inside a compressed value), and small ones.
fn values() -> BTreeMap<String, Val> {
    let mut m = BTreeMap::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let smooth = |n: usize, k: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((i as f32 * k).sin() * 0.05).to_le_bytes())
            .collect()
    };
    m.insert(
        "big/a".into(),
        (
            DType::F32,
            Kind::Tensor,
            vec![3 << 20],
            smooth(3 << 20, 1e-3),
        ),
    );
    m.insert(
        "big/b".into(),
        (DType::U8, Kind::Tensor, vec![6 << 20], noise(6 << 20)),
    );
    m.insert(
        "mid".into(),
        (
            DType::F32,
            Kind::Tensor,
            vec![300_001],
            smooth(300_001, 3e-2),
        ),
    );
    m.insert(
        "small".into(),
        (DType::I64, Kind::Tensor, vec![3], vec![7u8; 24]),
    );
    m.insert("empty".into(), (DType::F16, Kind::Tensor, vec![0], vec![]));
    m
}

/// The common writer options with chunks of 256 KiB (a value spans many chunks and blocks).
fn opts(codec: Codec) -> WriterOptions {
    WriterOptions {
        chunk_bytes: 256 << 10,
        ..common::opts(codec, 2)
    }
}

/// Drop `paths` from the page cache (their dirty pages written first, so they go).
fn evict(paths: &[PathBuf]) {
    for p in paths {
        let f = std::fs::File::open(p).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a hint on an open fd.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// Whether every page of `paths` left the page cache. Eviction is a hint: tmpfs keeps its
/// pages, and a busy host may keep some, so the cold counters are checked only when it took.
fn evicted(paths: &[PathBuf]) -> bool {
    paths.iter().all(|p| {
        let f = std::fs::File::open(p).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        if len == 0 {
            return true;
        }
        // SAFETY: a read-only mapping of a file this test wrote and nobody changes meanwhile.
        let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        // SAFETY: sysconf reads a constant of the running kernel.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: `m` spans `len` bytes; `vec` holds one byte per page of them.
        let rc = unsafe { libc::mincore(m.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
        rc == 0 && vec.iter().all(|b| b & 1 == 0)
    })
}

fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn takes_o_direct(p: &Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .is_ok()
}

/// Read every value with the direct engine at `depth` (pieces all cached read from the cache);
/// the values and the stats.
fn read_direct(
    path: &Path,
    depth: usize,
) -> shardpoint_core::Result<(
    BTreeMap<String, Vec<u8>>,
    shardpoint_core::direct::DirectStats,
)> {
    read_direct_with(path, depth, true)
}

/// [`read_direct`], `follow_cache` as given.
fn read_direct_with(
    path: &Path,
    depth: usize,
    follow_cache: bool,
) -> shardpoint_core::Result<(
    BTreeMap<String, Vec<u8>>,
    shardpoint_core::direct::DirectStats,
)> {
    let r = Reader::open(path)?;
    let v = values();
    let es: Vec<_> = v.keys().map(|k| r.entry(k)).collect::<Result<_, _>>()?;
    let mut outs: Vec<Vec<u8>> = es
        .iter()
        .map(|e| vec![0xa5u8; e.raw_len as usize])
        .collect();
    let stats = r.read_many_into_direct(
        &es,
        outs.iter_mut().map(|o| &mut o[..]).collect(),
        true,
        depth,
        follow_cache,
    )?;
    Ok((v.keys().cloned().zip(outs).collect(), stats))
}

fn expect_equal(got: &BTreeMap<String, Vec<u8>>) {
    for (k, (_, _, _, want)) in values() {
        assert!(got[&k] == want, "value {k:?} differs");
    }
}

#[test]
fn cold_and_warm_reads_are_exact_at_every_depth() {
    for codec in [Codec::HuffByteGroup, Codec::ZstdByteGroup, Codec::None] {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        save(&p, &items(&values()), opts(codec)).unwrap();
        let files = files_of(dir.path());
        for depth in [1, 3, 8] {
            evict(&files);
            let was_evicted = evicted(&files);
            let (got, cold) = read_direct(&p, depth).unwrap();
            expect_equal(&got);
            if takes_o_direct(&files[0]) && was_evicted {
                assert!(
                    cold.in_place + cold.bounced > 8 << 20,
                    "{codec:?} depth {depth}: {cold:?}"
                );
            }
            // direct reads leave the page cache as it was: warm the files first
            for f in &files {
                std::fs::read(f).unwrap();
            }
            let (got, warm) = read_direct(&p, depth).unwrap();
            expect_equal(&got);
            assert_eq!(
                warm.in_place, 0,
                "a cached file is read from the cache: {warm:?}"
            );
            // unless the caller judged the load cold: then every piece from the device
            let (got, told) = read_direct_with(&p, depth, false).unwrap();
            expect_equal(&got);
            if takes_o_direct(&files[0]) {
                assert_eq!(told.buffered, 0, "{codec:?} depth {depth}: {told:?}");
                assert_eq!(told.in_place + told.bounced, warm.buffered + warm.bounced);
            }
        }
    }
}

#[test]
fn a_single_file_checkpoint_reads_at_its_region_offset() {
    for codec in [Codec::HuffByteGroup, Codec::None] {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("one.sp");
        save_single(&p, &items(&values()), &opts(codec), &|_| {}).unwrap();
        evict(std::slice::from_ref(&p));
        let (got, _) = read_direct(&p, 4).unwrap();
        expect_equal(&got);
    }
}

#[test]
fn a_damaged_chunk_is_named_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    save(&p, &items(&values()), opts(Codec::HuffByteGroup)).unwrap();
    let r = Reader::open(&p).unwrap();
    let e = r.entry("big/a").unwrap();
    let (shard, first) = (r.shards()[e.shard as usize].path.clone(), e.offset);
    drop(r);
    // A byte in the first chunk of the first big value: every later block still waits to be
    // read when the error comes, with depth 1 and a pool of 3 buffers.
    flip_byte(&shard, first + 100, 0x10);
    for depth in [1, 8] {
        evict(&files_of(dir.path()));
        let err = read_direct(&p, depth).unwrap_err();
        assert!(err.is_corruption(), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("big/a") && msg.contains(shard.to_str().unwrap()),
            "{msg}"
        );
    }
}

#[test]
fn a_shard_truncated_after_open_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    save(&p, &items(&values()), opts(Codec::HuffByteGroup)).unwrap();
    let r = Reader::open(&p).unwrap();
    let v = values();
    let es: Vec<_> = v.keys().map(|k| r.entry(k).unwrap()).collect();
    let biggest = es.iter().max_by_key(|e| e.stored_len).unwrap();
    let shard = r.shards()[biggest.shard as usize].path.clone();
    let cut = biggest.offset + biggest.stored_len / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(cut)
        .unwrap();
    evict(&files_of(dir.path()));
    let mut outs: Vec<Vec<u8>> = es.iter().map(|e| vec![0u8; e.raw_len as usize]).collect();
    let err = r
        .read_many_into_direct(
            &es,
            outs.iter_mut().map(|o| &mut o[..]).collect(),
            true,
            2,
            true,
        )
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn a_checkpoint_saved_again_under_an_open_reader_is_read_as_opened() {
    // Another save at the same prefix while this reader loads: the shard files the reader
    // opened are removed (the new ones carry a token); the direct reads still read the
    // opened files, by O_DIRECT, compressed or not, with crc checks or without.
    for (codec, verify) in [
        (Codec::HuffByteGroup, true),
        (Codec::None, true),
        (Codec::None, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        save(&p, &items(&values()), opts(codec)).unwrap();
        let r = Reader::open(&p).unwrap();
        evict(&files_of(dir.path())); // the files the reader has open, cold
        let mut other = values();
        for (_, _, _, b) in other.values_mut() {
            b.iter_mut().for_each(|x| *x = x.wrapping_add(1));
        }
        save(&p, &items(&other), opts(codec)).unwrap();
        let v = values();
        let es: Vec<_> = v.keys().map(|k| r.entry(k).unwrap()).collect();
        let mut outs: Vec<Vec<u8>> = es.iter().map(|e| vec![0u8; e.raw_len as usize]).collect();
        let dsts = outs.iter_mut().map(|o| &mut o[..]).collect();
        let st = r.read_many_into_direct(&es, dsts, verify, 4, true).unwrap();
        expect_equal(&v.keys().cloned().zip(outs).collect());
        // still read by O_DIRECT: through the open files, not their (now removed) paths
        if takes_o_direct(&files_of(dir.path())[0]) {
            assert!(st.in_place + st.bounced > 8 << 20, "{codec:?}: {st:?}");
        }
    }
}
