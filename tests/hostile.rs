//! Hostile indexes and chunks at the Rust level (issue 7, part 4): valid files patched in one
//! field with every crc recomputed (`reseal_index`, shared with the fuzz targets), so that the
//! semantic checks of `IndexView`, `Reader` and `decode_chunk` must refuse them, with a
//! `Corrupt` error (not `Checksum`: the checksums are right), no panic, in bounded time.
//! The Python suite (tests/reliability/test_reliability_hostile.py) covers the same ground end to end,
//! plus memory bounds; this file pins the core's behaviour without the binding.

use shardpoint_core::format::Kind;
use shardpoint_core::{save, Error, Reader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::{items, opts, Val};

include!("../fuzz/fuzz_targets/logic.rs");

const CB: usize = 4096;

fn sample(dir: &Path) -> PathBuf {
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    let a: Vec<u8> = (0..3000u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    v.insert("a".into(), (DType::F32, Kind::Tensor, vec![3000], a));
    // three identical all-zero chunks: pointing one chunk record at another keeps every crc
    v.insert(
        "b".into(),
        (
            DType::F32,
            Kind::Tensor,
            vec![3 * CB as u64 / 4],
            vec![0; 3 * CB],
        ),
    );
    v.insert(
        "c".into(),
        (DType::U8, Kind::Str, vec![5], b"hello".to_vec()),
    );
    let p = dir.join("ck");
    save(&p, &items(&v), opts(Codec::Zstd, 1)).unwrap();
    p
}

fn idx(p: &Path) -> PathBuf {
    shardpoint_core::commit::index_path(p)
}

fn u64_at(b: &[u8], at: usize) -> usize {
    le_u64(b, at) as usize
}

/// Patch the index of `p` with `f`, then recompute every crc.
fn patch(p: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(idx(p)).unwrap();
    f(&mut b);
    reseal_index(&mut b);
    std::fs::write(idx(p), &b).unwrap();
}

/// Entry record offset of entry `i`.
fn rec(b: &[u8], i: usize) -> usize {
    u64_at(b, 56) + 40 * i
}

/// Open, touch every entry, read every entry, verify: the first error, or None.
fn exercise(p: &Path) -> Option<Error> {
    let t = Instant::now();
    let res = (|| -> Result<(), Error> {
        let r = Reader::open(p)?;
        let n = r.index().len();
        for i in 0..n {
            let e = r.index().entry(i)?;
            match r.index().find(e.key)? {
                Some(j) if j == i => {}
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "lookup of listed key {:?} (entry {i}) gave {other:?}",
                        e.key
                    )))
                }
            }
            let mut out = vec![0u8; e.raw_len as usize];
            r.read_into(&e, &mut out, true)?;
        }
        r.verify()
    })();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    res.err()
}

fn assert_corrupt(p: &Path, what: &str) {
    let e = exercise(p).unwrap_or_else(|| panic!("{what}: accepted"));
    assert!(
        matches!(e, Error::Corrupt { .. }),
        "{what}: expected Corrupt, got {e}"
    );
    assert!(
        e.to_string().contains(&p.display().to_string()),
        "{what}: no file named: {e}"
    );
}

#[test]
fn the_unpatched_sample_is_valid() {
    let d = tempfile::tempdir().unwrap();
    let p = sample(d.path());
    assert!(exercise(&p).is_none());
    let r = Reader::open(&p).unwrap();
    let e = r.entry("b").unwrap();
    assert_eq!((e.codec, e.nchunks()), (Codec::Zstd, 3));
}

#[test]
fn header_fields_lie() {
    // (field offset, width, value)
    let cases: [(usize, usize, u64); 8] = [
        (24, 8, 1 << 60),         // entry_count
        (24, 8, u64::MAX),        // entry_count
        (32, 4, u32::MAX as u64), // shard_count
        (72, 8, 1 << 62),         // keys_len
        (104, 8, u64::MAX - 8),   // meta_len: off + len wraps
        (64, 8, 200),             // keys_off inside the entry table
        (56, 8, 131),             // entries_off misaligned
        (36, 4, 4097),            // chunk_bytes
    ];
    for (at, w, v) in cases {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        patch(&p, |b| b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]));
        assert_corrupt(&p, &format!("header field at {at} = {v}"));
    }
}

#[test]
fn entry_fields_lie() {
    // (entry, field offset in the record, width, value)
    let cases: [(usize, usize, usize, u64); 9] = [
        (0, 24, 8, 1 << 40),       // offset past the shard
        (0, 24, 8, u64::MAX - 63), // offset + len wraps
        (0, 24, 8, 64),            // offset inside the shard header
        (0, 24, 8, 4096 + 8),      // misaligned
        (0, 32, 8, 1 << 30),       // stored_len past the end (and != raw)
        (0, 12, 4, 7),             // shard out of range
        (0, 6, 1, 99),             // dtype tag
        (0, 9, 1, 65),             // ndim
        (1, 32, 8, 1 << 20),       // compressed stored_len > raw_len
    ];
    for (i, at, w, v) in cases {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        patch(&p, |b| {
            let r = rec(b, i) + at;
            b[r..r + w].copy_from_slice(&v.to_le_bytes()[..w]);
        });
        assert_corrupt(&p, &format!("entry {i} field {at} = {v}"));
    }
}

#[test]
fn payloads_overlap_is_caught_by_verify() {
    let d = tempfile::tempdir().unwrap();
    let p = sample(d.path());
    let (a_off, a_first) = {
        let r = Reader::open(&p).unwrap();
        let e = r.entry("a").unwrap();
        (e.offset, r.stored(&e).unwrap()[..5].to_vec())
    };
    // "c" (5 bytes) moved onto "a"'s payload; its crc made right for those bytes
    patch(&p, |b| {
        let r = rec(b, 2);
        b[r + 24..r + 32].copy_from_slice(&a_off.to_le_bytes());
        b[r + 16..r + 20].copy_from_slice(&crc(&a_first).to_le_bytes());
    });
    assert_corrupt(&p, "overlapping payloads");
}

#[test]
fn shape_product_overflows() {
    let d = tempfile::tempdir().unwrap();
    let p = sample(d.path());
    patch(&p, |b| {
        // "b" is zstd, so its dims are in the aux blob: dims[0] = 2^62 (x4 bytes overflows)
        let aux = u64_at(b, 80) + le_u32(b, rec(b, 1) + 20) as usize;
        b[aux..aux + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    });
    assert_corrupt(&p, "shape overflow");
}

#[test]
fn bad_keys() {
    for (what, key) in [
        ("invalid UTF-8", &b"\xff"[..]),
        ("NUL", b"\0"),
        ("overlong", b"\xc0"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        // "c" is the last key: replacing it by a byte >= 'c' keeps the order, so only the key
        // check can refuse it (NUL sorts first: then the order check fires, also Corrupt)
        patch(&p, |b| {
            let k = u64_at(b, 64) + 2;
            b[k] = key[0];
        });
        assert_corrupt(&p, what);
    }
}

#[test]
fn unsorted_keys_in_a_block() {
    let d = tempfile::tempdir().unwrap();
    let p = sample(d.path());
    patch(&p, |b| {
        let k = u64_at(b, 64);
        b.swap(k, k + 1); // "a","b" -> "b","a"
    });
    assert_corrupt(&p, "unsorted keys");
}

#[test]
fn unsorted_keys_across_blocks_never_answer_wrongly() {
    // 130 keys, 3 blocks; swapping the key bytes of blocks 0 and 1 keeps each block sorted
    // (so block verification passes) while the table as a whole is not. Lookups must then
    // either find every listed key or report corruption; never say "absent".
    let d = tempfile::tempdir().unwrap();
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    for i in 0..130u32 {
        v.insert(
            format!("k{i:04}"),
            (DType::U8, Kind::Tensor, vec![1], vec![i as u8]),
        );
    }
    let p = d.path().join("ck");
    save(&p, &items(&v), opts(Codec::None, 1)).unwrap();
    patch(&p, |b| {
        let k = u64_at(b, 64);
        let (blk0, blk1) = (k..k + 320, k + 320..k + 640);
        let tmp = b[blk0.clone()].to_vec();
        b.copy_within(blk1, blk0.start);
        b[k + 320..k + 640].copy_from_slice(&tmp);
    });
    assert_corrupt(&p, "keys unsorted across blocks");
}

#[test]
fn shard_names_that_escape() {
    for name in [
        &b"/../../etc/passwd"[..],
        b"/etc/passwd",
        b".data-00000-of-00001\0x",
        b"..",
    ] {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        patch(&p, |b| {
            let s = u64_at(b, 40);
            b[s + 24..s + 64].fill(0);
            b[s + 24..s + 24 + name.len()].copy_from_slice(name);
            b[s + 20..s + 24].copy_from_slice(&(name.len() as u32).to_le_bytes());
        });
        let e = Reader::open(&p)
            .err()
            .expect("escaping shard name accepted");
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("refusing shard name"), "{e}");
    }
}

#[test]
fn overlapping_chunk_records_are_refused_on_read() {
    // FORMAT.md §3.3: chunks are contiguous, in order, non-overlapping, "checked on every use".
    // Chunks 1 and 2 of "b" are pointed at chunk 0's bytes: all three decode to zeros, so every
    // crc still matches, and a reader that checks only bounds returns the data: one stored
    // frame then stands for any number of chunks (an amplification the format rules out).
    let d = tempfile::tempdir().unwrap();
    let p = sample(d.path());
    patch(&p, |b| {
        let aux = u64_at(b, 80) + le_u32(b, rec(b, 1) + 20) as usize + 8; // after dims
        let first = b[aux..aux + 16].to_vec();
        b[aux + 16..aux + 32].copy_from_slice(&first);
        b[aux + 32..aux + 48].copy_from_slice(&first);
    });
    let r = Reader::open(&p).unwrap();
    let e = r.entry("b").unwrap();
    let mut out = vec![0u8; e.raw_len as usize];
    let res = r.read_into(&e, &mut out, true);
    assert!(
        matches!(res, Err(Error::Corrupt { .. })),
        "overlapping chunk records read: {res:?}"
    );
}

/// `n` one-byte entries `k00000`, `k00001`, ...: above ~1,700 keys the index passes 64 KiB and
/// the reader reads it page by page on demand instead of whole at open.
fn many_keys(dir: &Path, n: u32) -> PathBuf {
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    for i in 0..n {
        v.insert(
            format!("k{i:05}"),
            (DType::U8, Kind::Tensor, vec![1], vec![i as u8]),
        );
    }
    let p = dir.join("many");
    save(&p, &items(&v), opts(Codec::None, 1)).unwrap();
    assert!(std::fs::metadata(idx(&p)).unwrap().len() > 64 << 10);
    p
}

#[test]
fn unsorted_keys_across_blocks_of_a_large_index_never_answer_wrongly() {
    // as above, on an index read on demand: a hit may be answered from the blocks the search
    // read, but "absent" only after the whole table was proven sorted
    let d = tempfile::tempdir().unwrap();
    let p = many_keys(d.path(), 3000);
    let mut b = std::fs::read(idx(&p)).unwrap();
    let k = u64_at(&b, 64);
    let (blk0, blk1) = (k..k + 384, k + 384..k + 768);
    let tmp = b[blk0.clone()].to_vec();
    b.copy_within(blk1, blk0.start);
    b[k + 384..k + 768].copy_from_slice(&tmp);
    reseal_index(&mut b);
    std::fs::write(idx(&p), &b).unwrap();
    let r = Reader::open(&p).unwrap();
    // k00000 now sits in block 1: the search (which expects it in block 0) misses, and the
    // miss proves the table unsorted instead of answering "absent"
    let e = r.index().find("k00000").unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("not sorted across blocks"), "{e}");
    assert_corrupt(&p, "keys unsorted across blocks of a large index");
}

#[test]
fn a_large_index_opens_without_reading_its_entries() {
    let d = tempfile::tempdir().unwrap();
    let p = many_keys(d.path(), 20_000);
    // damage an entry record of the last block, leave every crc as it was: open cannot see it
    // (it reads no entries), a lookup of a key elsewhere does not either, verify() does
    let mut b = std::fs::read(idx(&p)).unwrap();
    let at = rec(&b, 19_990) + 16;
    b[at] ^= 0xff;
    std::fs::write(idx(&p), &b).unwrap();
    let r = Reader::open(&p).unwrap();
    assert_eq!(r.index().len(), 20_000);
    let e = r.entry("k00100").unwrap();
    let mut out = [0u8; 1];
    r.read_into(&e, &mut out, true).unwrap();
    assert_eq!(out[0], 100);
    let err = r.entry("k19990").unwrap_err();
    assert!(matches!(err, Error::Checksum { .. }), "{err}");
    assert!(r.verify().is_err());
}

#[test]
fn truncating_a_large_index_under_a_reader_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let p = many_keys(d.path(), 20_000);
    let r = Reader::open(&p).unwrap();
    assert!(r.entry("k00001").is_ok());
    let len = std::fs::metadata(idx(&p)).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(idx(&p))
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    // the last blocks' pages were never read: reading them now fails cleanly (a mapped index
    // would raise SIGBUS here)
    let e = r.entry("k19999").unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&idx(&p).display().to_string()) && msg.contains("truncated"),
        "{msg}"
    );
    // what was read before the truncation still answers
    assert!(r.entry("k00001").is_ok());
}

/// Issue 36: a header that understates the entry count (every crc recomputed) would list the
/// first entries only, so that the others vanish with no error. Open refuses it: the entries
/// hidden would sit in bytes no section explains, or the key blob would not fit the count.
#[test]
fn a_header_that_hides_entries_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    let small = sample(d.path());
    // (index, forged entry count): none left; the last block dropped (3000 = 46 blocks of 64
    // and one of 56), on an index read on demand; one entry less
    let large = many_keys(d.path(), 3000);
    for (p, n) in [(&small, 0u64), (&large, 0), (&large, 2944), (&large, 2999)] {
        let mut b = std::fs::read(idx(p)).unwrap();
        let orig = b.clone();
        b[24..32].copy_from_slice(&n.to_le_bytes());
        reseal_index(&mut b);
        std::fs::write(idx(p), &b).unwrap();
        match Reader::open(p) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains(&idx(p).display().to_string()), "{e}")
            }
            Err(e) => panic!("entry count {n}: expected Corrupt, got {e}"),
            Ok(r) => panic!("entry count {n}: opened, listing {} keys", r.index().len()),
        }
        std::fs::write(idx(p), &orig).unwrap();
        assert!(Reader::open(p).is_ok());
    }
}

#[test]
fn bytes_between_index_sections_beyond_alignment_are_refused_at_open() {
    // 8 zero bytes spliced in before the metadata (offsets fixed up, crcs recomputed): more
    // room than alignment needs, so open refuses it; 7 bytes is padding (verify checks zeros)
    for (gap, ok) in [(7usize, true), (8, false), (64, false)] {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        patch(&p, |b| {
            let meta_off = u64_at(b, 96);
            b.splice(meta_off..meta_off, std::iter::repeat_n(0u8, gap));
            let file_len = b.len() as u64;
            b[96..104].copy_from_slice(&((meta_off + gap) as u64).to_le_bytes());
            b[16..24].copy_from_slice(&file_len.to_le_bytes());
        });
        match exercise(&p) {
            None => assert!(ok, "a gap of {gap} bytes was accepted"),
            Some(e) => {
                assert!(!ok, "a gap of {gap} bytes: {e}");
                assert!(e.to_string().contains("unexplained bytes"), "{e}");
            }
        }
    }
}

#[test]
fn listing_keys_of_blocks_out_of_order_is_an_error() {
    // the 130-key index of `unsorted_keys_across_blocks_never_answer_wrongly`: each block
    // sorted, the table not; a listing raises as a lookup does
    let d = tempfile::tempdir().unwrap();
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    for i in 0..130u32 {
        v.insert(
            format!("k{i:04}"),
            (DType::U8, Kind::Tensor, vec![1], vec![i as u8]),
        );
    }
    let p = d.path().join("ck");
    save(&p, &items(&v), opts(Codec::None, 1)).unwrap();
    assert_eq!(Reader::open(&p).unwrap().index().keys().unwrap().len(), 130);
    patch(&p, |b| {
        let k = u64_at(b, 64);
        let tmp = b[k..k + 320].to_vec();
        b.copy_within(k + 320..k + 640, k);
        b[k + 320..k + 640].copy_from_slice(&tmp);
    });
    let r = Reader::open(&p).unwrap();
    let e = r.index().keys().unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("not sorted across blocks"), "{e}");
}

#[test]
fn an_object_entry_over_the_bound_is_refused_from_its_record() {
    // a 100-byte compressed object entry whose record claims 1 GiB: refused by the index
    // record, before any byte of it is read (nothing allocated for the claim)
    let d = tempfile::tempdir().unwrap();
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    v.insert(
        "o".into(),
        (DType::U8, Kind::Object, vec![8192], vec![b'a'; 8192]),
    );
    let p = d.path().join("ck");
    save(&p, &items(&v), opts(Codec::Zstd, 1)).unwrap();
    assert!(Reader::open(&p).unwrap().entry("o").is_ok());
    patch(&p, |b| {
        let aux = u64_at(b, 80);
        b[aux..aux + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
    });
    let e = Reader::open(&p).unwrap().entry("o").unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("over the 67108864 bytes"), "{e}");
    // and a writer refuses to write one
    let big = vec![b'a'; (64 << 20) + 1];
    let it = shardpoint_core::Item {
        key: "o".into(),
        dtype: DType::U8,
        kind: Kind::Object,
        dims: vec![big.len() as u64],
        data: &big,
        xor_base: None,
    };
    let err = save(&d.path().join("big"), &[it], opts(Codec::Zstd, 1)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

/// `sample`, saved with hashed shard names (FORMAT.md §3.1.1): a version 2 index.
fn hashed_sample(dir: &Path) -> PathBuf {
    let mut v = std::collections::BTreeMap::<String, Val>::new();
    v.insert(
        "a".into(),
        (DType::U8, Kind::Tensor, vec![16], (0..16).collect()),
    );
    let p = dir.join("ck");
    let o = shardpoint_core::WriterOptions {
        hashed_prefixes: true,
        shards: 2,
        ..opts(Codec::Zstd, 1)
    };
    save(&p, &items(&v), o).unwrap();
    p
}

/// Write `name` into shard record 0 (and, when given, `version` into the header), resealed.
fn patch_shard_name(p: &Path, name: &[u8], version: Option<u32>) {
    patch(p, |b| {
        let s = u64_at(b, 40);
        b[s + 24..s + 64].fill(0);
        b[s + 24..s + 24 + name.len()].copy_from_slice(name);
        b[s + 20..s + 24].copy_from_slice(&(name.len() as u32).to_le_bytes());
        if let Some(v) = version {
            b[8..12].copy_from_slice(&v.to_le_bytes());
        }
    });
}

#[test]
fn hashed_shard_names_need_version_2_and_the_exact_hash() {
    let d = tempfile::tempdir().unwrap();
    let p = hashed_sample(d.path());
    assert_eq!(le_u32(&std::fs::read(idx(&p)).unwrap(), 8), 2);
    assert!(exercise(&p).is_none());
    let good = Reader::open(&p).unwrap().index().shards()[0].name.clone();
    assert!(good.starts_with('/') && good.len() == 23, "{good}");
    let hh = &good[1..3];
    let flipped = format!("{:02x}", u8::from_str_radix(hh, 16).unwrap() ^ 0x10);
    let rest = &good[3..]; // "/data-00000-of-00002"
    let hostile: Vec<(String, &str)> = vec![
        (format!("/{flipped}{rest}"), "wrong hash"),
        (format!("/{}{rest}", hh.to_uppercase()), "uppercase"),
        (format!("/{hh}0{rest}"), "three hex digits"),
        (format!("/{}{rest}", &hh[..1]), "one hex digit"),
        (format!("/{hh}/..{rest}"), "`..`"),
        (format!("/..{rest}"), "`..` as the hash"),
        (format!("/{hh}/x{rest}"), "extra `/`"),
        (format!("{hh}{rest}"), "no leading `/`"),
        (format!("/{hh}{rest}.0123"), "short token"),
    ];
    for (name, what) in hostile {
        let d = tempfile::tempdir().unwrap();
        let p = hashed_sample(d.path());
        patch_shard_name(&p, name.as_bytes(), None);
        let e = Reader::open(&p)
            .err()
            .unwrap_or_else(|| panic!("{what} accepted"));
        assert!(matches!(e, Error::Corrupt { .. }), "{what}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&idx(&p).display().to_string()),
            "{what}: {msg}"
        );
        assert!(msg.contains("shard record 0"), "{what}: {msg}");
    }
    // the valid hashed name in a version 1 index: refused, naming the version it needs
    let d = tempfile::tempdir().unwrap();
    let p = hashed_sample(d.path());
    patch_shard_name(&p, good.as_bytes(), Some(1));
    let e = Reader::open(&p)
        .err()
        .expect("hashed name in a v1 index accepted");
    assert!(e.to_string().contains("needs version 2"), "{e}");
    // a version no reader knows
    let d = tempfile::tempdir().unwrap();
    let p = hashed_sample(d.path());
    patch_shard_name(&p, good.as_bytes(), Some(3));
    let e = Reader::open(&p).err().expect("version 3 accepted");
    assert!(
        matches!(e, Error::UnsupportedVersion { found: 3, .. }),
        "{e}"
    );
}
