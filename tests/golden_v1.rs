//! Golden checkpoints of format v1 (tests/golden/v1, made by tests/golden/gen_golden.py): the
//! Rust reader must keep opening them and return the same raw bytes (crc32c of every entry's
//! raw bytes, as recorded below and in tests/golden/expected_v1.json).
//!
//! `mixed`: zstd (byte-grouped) with 4 KiB chunks over two shards; `raw`: the same values,
//! uncompressed, one shard.

use shardpoint_core::{Codec, Error, Kind, Reader};
use std::path::PathBuf;

/// One golden entry: what the index records and the crc32c of its raw bytes. `codec`/`shard`
/// are those of the `mixed` checkpoint; in `raw` every entry is codec none in shard 0.
struct G {
    key: &'static str,
    kind: &'static str,
    dtype: &'static str,
    dims: &'static [u64],
    raw_len: u64,
    crc: u32,
    codec: &'static str,
    shard: u32,
}

#[rustfmt::skip]
const GOLDEN: &[G] = &[
    G { key: "complex/c128", kind: "tensor", dtype: "complex128", dims: &[3], raw_len: 48, crc: 0xbede3438, codec: "none", shard: 0 },
    G { key: "complex/c64", kind: "tensor", dtype: "complex64", dims: &[600], raw_len: 4800, crc: 0x0216648b, codec: "zstd-bytegroup", shard: 1 },
    G { key: "empty/f32", kind: "tensor", dtype: "float32", dims: &[0], raw_len: 0, crc: 0x00000000, codec: "none", shard: 1 },
    G { key: "empty/i32/2d", kind: "tensor", dtype: "int32", dims: &[3, 0], raw_len: 0, crc: 0x00000000, codec: "none", shard: 1 },
    G { key: "ints/i16", kind: "tensor", dtype: "int16", dims: &[2], raw_len: 4, crc: 0x4f28702e, codec: "none", shard: 1 },
    G { key: "ints/i32", kind: "tensor", dtype: "int32", dims: &[2, 1], raw_len: 8, crc: 0xd7e4e896, codec: "none", shard: 1 },
    G { key: "ints/i64/ramp", kind: "tensor", dtype: "int64", dims: &[1000], raw_len: 8000, crc: 0xe43be021, codec: "zstd-bytegroup", shard: 1 },
    G { key: "ints/i8", kind: "tensor", dtype: "int8", dims: &[5], raw_len: 5, crc: 0x3ffabb75, codec: "none", shard: 1 },
    G { key: "ints/u16", kind: "tensor", dtype: "uint16", dims: &[2500], raw_len: 5000, crc: 0x029fc258, codec: "zstd-bytegroup", shard: 0 },
    G { key: "ints/u32", kind: "tensor", dtype: "uint32", dims: &[2, 2], raw_len: 16, crc: 0x8470e9d9, codec: "none", shard: 1 },
    G { key: "ints/u64", kind: "tensor", dtype: "uint64", dims: &[3], raw_len: 24, crc: 0x3e336d46, codec: "none", shard: 1 },
    G { key: "ints/u8/noise", kind: "tensor", dtype: "uint8", dims: &[5000], raw_len: 5000, crc: 0x917cbcf6, codec: "none", shard: 0 },
    G { key: "mask/bool", kind: "tensor", dtype: "bool", dims: &[7], raw_len: 7, crc: 0x5952fd60, codec: "none", shard: 0 },
    G { key: "meta/bigint", kind: "int", dtype: "uint8", dims: &[32], raw_len: 32, crc: 0x8e4ee3b5, codec: "none", shard: 0 },
    G { key: "meta/blob", kind: "bytes", dtype: "uint8", dims: &[14], raw_len: 14, crc: 0x402a703b, codec: "none", shard: 0 },
    G { key: "meta/config", kind: "json", dtype: "uint8", dims: &[66], raw_len: 66, crc: 0x274c5e64, codec: "none", shard: 0 },
    G { key: "meta/flag", kind: "json", dtype: "uint8", dims: &[4], raw_len: 4, crc: 0x09087e7d, codec: "none", shard: 0 },
    G { key: "meta/lr", kind: "float", dtype: "uint8", dims: &[5], raw_len: 5, crc: 0x27fc9901, codec: "none", shard: 0 },
    G { key: "meta/name", kind: "str", dtype: "uint8", dims: &[17], raw_len: 17, crc: 0x21e35fbd, codec: "none", shard: 0 },
    G { key: "meta/nan", kind: "float", dtype: "uint8", dims: &[3], raw_len: 3, crc: 0xf1258151, codec: "none", shard: 0 },
    G { key: "meta/none", kind: "json", dtype: "uint8", dims: &[4], raw_len: 4, crc: 0x147e9acc, codec: "none", shard: 1 },
    G { key: "meta/step", kind: "int", dtype: "uint8", dims: &[4], raw_len: 4, crc: 0xf63af4ee, codec: "none", shard: 1 },
    G { key: "net/dense/bias", kind: "tensor", dtype: "float32", dims: &[80], raw_len: 320, crc: 0xeba43583, codec: "none", shard: 0 },
    G { key: "net/dense/kernel", kind: "tensor", dtype: "float32", dims: &[64, 80], raw_len: 20480, crc: 0x14ad5010, codec: "zstd-bytegroup", shard: 0 },
    G { key: "net/emb/bf16", kind: "tensor", dtype: "bfloat16", dims: &[100, 30], raw_len: 6000, crc: 0xe687310a, codec: "zstd-bytegroup", shard: 1 },
    G { key: "net/f16/3d", kind: "tensor", dtype: "float16", dims: &[4, 5, 6], raw_len: 240, crc: 0x83049dfd, codec: "none", shard: 1 },
    G { key: "net/f64/wave", kind: "tensor", dtype: "float64", dims: &[700], raw_len: 5600, crc: 0x7b3203f1, codec: "zstd-bytegroup", shard: 1 },
    G { key: "net/partly_noise", kind: "tensor", dtype: "float32", dims: &[3072], raw_len: 12288, crc: 0x8d132370, codec: "zstd-bytegroup", shard: 1 },
    G { key: "quant/e4m3", kind: "tensor", dtype: "float8_e4m3fn", dims: &[6000], raw_len: 6000, crc: 0x8f983167, codec: "zstd", shard: 0 },
    G { key: "quant/e5m2", kind: "tensor", dtype: "float8_e5m2", dims: &[7], raw_len: 7, crc: 0x74b7a2e0, codec: "none", shard: 1 },
    G { key: "scalar/bool", kind: "tensor", dtype: "bool", dims: &[], raw_len: 1, crc: 0xa016d052, codec: "none", shard: 0 },
    G { key: "scalar/f64", kind: "tensor", dtype: "float64", dims: &[], raw_len: 8, crc: 0x77025c60, codec: "none", shard: 1 },
    G { key: "scalar/i32", kind: "tensor", dtype: "int32", dims: &[], raw_len: 4, crc: 0x3bbaed8d, codec: "none", shard: 0 },
    G { key: "ключ/日本/ü", kind: "tensor", dtype: "float32", dims: &[2], raw_len: 8, crc: 0xdbb94a20, codec: "none", shard: 0 },
];

/// Exact raw bytes of the typed values (FORMAT.md §6).
const TYPED: &[(&str, &[u8])] = &[
    ("meta/step", b"1234"),
    ("meta/bigint", b"-1267650600228229401496703205376"),
    ("meta/lr", b"0.001"),
    ("meta/nan", b"nan"),
    ("meta/flag", b"true"),
    ("meta/none", b"null"),
    ("meta/blob", b"\x00\x01\x02\xffshardpoint"),
    ("meta/name", "héllo wörld ✓".as_bytes()),
];

fn prefix(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/v1")
        .join(name)
}

fn read_all(r: &Reader, g: &G) -> Vec<u8> {
    let e = r
        .entry(g.key)
        .unwrap_or_else(|err| panic!("{}: {err}", g.key));
    let mut buf = vec![0u8; e.raw_len as usize];
    r.read_into(&e, &mut buf, true)
        .unwrap_or_else(|err| panic!("{}: {err}", g.key));
    buf
}

fn check(name: &str, mixed: bool) {
    let r = Reader::open(&prefix(name)).unwrap_or_else(|e| panic!("open {name}: {e}"));
    r.verify().unwrap();
    assert_eq!(r.index().len(), GOLDEN.len());
    assert_eq!(r.shards().len(), if mixed { 2 } else { 1 });
    assert_eq!(r.index().chunk_bytes(), if mixed { 4096 } else { 1 << 20 });
    // Keys come back sorted by their UTF-8 bytes.
    let keys: Vec<&[u8]> = (0..r.index().len())
        .map(|i| r.index().key_bytes(i).unwrap())
        .collect();
    let want: Vec<&[u8]> = GOLDEN.iter().map(|g| g.key.as_bytes()).collect();
    assert_eq!(keys, want);
    for g in GOLDEN {
        let e = r.entry(g.key).unwrap();
        assert_eq!(e.kind.name(), g.kind, "{}", g.key);
        assert_eq!(e.dtype.name(), g.dtype, "{}", g.key);
        assert_eq!(e.dims, g.dims, "{}", g.key);
        assert_eq!(e.raw_len, g.raw_len, "{}", g.key);
        assert_eq!(e.crc, g.crc, "{}", g.key);
        let (codec, shard) = if mixed {
            (g.codec, g.shard)
        } else {
            ("none", 0)
        };
        assert_eq!(e.codec.name(), codec, "{}", g.key);
        assert_eq!(e.shard, shard, "{}", g.key);
        if e.kind != Kind::Tensor {
            assert_eq!(e.dims.len(), 1, "{}", g.key);
        }
        let raw = read_all(&r, g);
        assert_eq!(raw.len() as u64, g.raw_len, "{}", g.key);
        assert_eq!(
            crc32c::crc32c(&raw),
            g.crc,
            "{}: crc32c of the raw bytes",
            g.key
        );
    }
    for (key, bytes) in TYPED {
        let g = GOLDEN.iter().find(|g| g.key == *key).unwrap();
        assert_eq!(read_all(&r, g), *bytes, "{key}");
    }
    // A first-axis slice of the (compressed, 5-chunk) kernel equals the same rows of the whole.
    let g = GOLDEN.iter().find(|g| g.key == "net/dense/kernel").unwrap();
    let whole = read_all(&r, g);
    let e = r.entry(g.key).unwrap();
    if mixed {
        assert_eq!(e.codec, Codec::ZstdByteGroup);
        assert_eq!(e.nchunks(), 5);
    }
    let row = 80 * 4;
    let mut part = vec![0u8; 30 * row];
    r.read_range(&e, 13 * row as u64, 43 * row as u64, &mut part)
        .unwrap();
    assert_eq!(part, whole[13 * row..43 * row]);
    // Metadata: the writer's fields plus the user's.
    let meta = std::str::from_utf8(r.index().metadata_bytes().unwrap()).unwrap();
    assert!(
        meta.starts_with("{\"format\":1,\"writer\":\"shardpoint "),
        "{meta}"
    );
    assert!(meta.contains("\"user\":{"), "{meta}");
    assert!(matches!(
        r.entry("no/such/key"),
        Err(Error::MissingKey { .. })
    ));
}

#[test]
fn golden_v1_mixed() {
    check("mixed", true);
}

#[test]
fn golden_v1_raw() {
    check("raw", false);
}

#[test]
fn golden_v1_raw_and_mixed_hold_the_same_bytes() {
    let a = Reader::open(&prefix("mixed")).unwrap();
    let b = Reader::open(&prefix("raw")).unwrap();
    for g in GOLDEN {
        assert_eq!(read_all(&a, g), read_all(&b, g), "{}", g.key);
    }
}

/// The golden checkpoint of crc blocks (tests/golden/crc_blocks_v1, FORMAT.md §3.4): two
/// uncompressed values with block tables (one with dims in aux, one inline), read whole and in
/// checked ranges at any alignment, and verified.
#[test]
fn golden_crc_blocks() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/crc_blocks_v1/ck");
    let r = Reader::open(&p).unwrap();
    r.verify().unwrap();
    let w: Vec<u8> = (0..12800u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let v: Vec<u8> = (0..5000i64)
        .flat_map(|i| (i * 3 - 7).to_le_bytes())
        .collect();
    for (key, raw, blocks) in [("w", &w, 4), ("v", &v, 3)] {
        let e = r.entry(key).unwrap();
        assert_eq!((e.block_log2, e.nblocks()), (14, blocks), "{key}");
        for (i, b) in raw.chunks(16384).enumerate() {
            assert_eq!(e.block_crc(i), crc32c::crc32c(b), "{key} block {i}");
        }
        let n = raw.len() as u64;
        for (lo, hi) in [(0, n), (1, 2), (16383, 16385), (100, n - 3), (n - 1, n)] {
            let mut out = vec![0u8; (hi - lo) as usize];
            r.read_range_checked(&e, lo, hi, &mut out).unwrap();
            assert_eq!(
                &out[..],
                &raw[lo as usize..hi as usize],
                "{key} [{lo}, {hi})"
            );
        }
    }
}

/// tests/golden/v2 (tests/golden/gen_golden_v2.py): v1's `mixed` saved with hashed shard names
/// (FORMAT.md §3.1.1), an index of format version 2. Same entries, codecs and shard numbers.
#[test]
fn golden_v2_hashed_reads_as_v1_mixed() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2/mixed");
    let r = Reader::open(&p).unwrap();
    r.verify().unwrap();
    assert_eq!(r.index().len(), GOLDEN.len());
    for g in GOLDEN {
        // codecs may differ: the default codec choice changed after v1's files were made
        let e = r.entry(g.key).unwrap();
        assert_eq!(e.kind.name(), g.kind, "{}", g.key);
        assert_eq!(e.dtype.name(), g.dtype, "{}", g.key);
        assert_eq!(e.dims, g.dims, "{}", g.key);
        assert_eq!(
            (e.raw_len, e.crc, e.shard),
            (g.raw_len, g.crc, g.shard),
            "{}",
            g.key
        );
        assert_eq!(crc32c::crc32c(&read_all(&r, g)), g.crc, "{}", g.key);
    }
    let idx = std::fs::read(shardpoint_core::commit::index_path(&p)).unwrap();
    assert_eq!(u32::from_le_bytes(idx[8..12].try_into().unwrap()), 2);
    let names: Vec<String> = r.index().shards().iter().map(|s| s.name.clone()).collect();
    let want: Vec<String> = (0..2)
        .map(|s| shardpoint_core::naming::hashed_shard_name(s, 2, None))
        .collect();
    assert_eq!(names, want);
    assert_eq!(names[0], "/cf/data-00000-of-00002"); // the hash, pinned
    let a = Reader::open(&prefix("mixed")).unwrap();
    for g in GOLDEN {
        assert_eq!(read_all(&a, g), read_all(&r, g), "{}", g.key);
    }
}
