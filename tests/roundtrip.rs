//! Property round trips: whatever is saved (any dtype, shape, codec, shard count, chunking) reads
//! back byte for byte, lookups agree with a sorted map, and verify() passes.

use proptest::prelude::*;
use shardpoint_core::format::{Codec, Kind, ALL_DTYPES};
use shardpoint_core::{save, Reader};

mod common;
use common::*;

fn value_strategy() -> impl Strategy<Value = Val> {
    (
        0usize..ALL_DTYPES.len(),
        proptest::collection::vec(0u64..6, 0..4),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(di, dims, seed, smooth)| {
            let d = ALL_DTYPES[di];
            let n = dims.iter().product::<u64>() as usize * d.itemsize();
            let mut x = seed | 1;
            let bytes = (0..n)
                .map(|i| {
                    if smooth {
                        (i / 7) as u8
                    } else {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    }
                })
                .collect();
            (d, Kind::Tensor, dims, bytes)
        })
}

fn big_value() -> impl Strategy<Value = Val> {
    // Large enough to span several 4 KiB chunks.
    (1u64..40, any::<u8>()).prop_map(|(rows, b)| {
        let bytes: Vec<u8> = (0..rows * 1024 * 4)
            .map(|i| {
                if i % 4 == 3 {
                    0x3c
                } else {
                    (i as u8).wrapping_mul(b)
                }
            })
            .collect();
        (
            shardpoint_core::DType::F32,
            Kind::Tensor,
            vec![rows, 1024],
            bytes,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn saved_values_read_back(
        small in proptest::collection::btree_map("[a-z/é\u{4e2d}]{1,12}", value_strategy(), 0..40),
        big in proptest::collection::btree_map("big/[0-9]{1,3}", big_value(), 0..3),
        codec in prop_oneof![
            Just(Codec::None),
            Just(Codec::Zstd),
            Just(Codec::ZstdByteGroup),
            Just(Codec::HuffByteGroup)
        ],
        shards in 1u32..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let mut vals = small;
        vals.extend(big);
        save(&p, &items(&vals), opts(codec, shards)).unwrap();
        let back = read_all(&p).unwrap();
        prop_assert_eq!(&back, &vals);
        let r = Reader::open(&p).unwrap();
        r.verify().unwrap();
        // Lookups and lower_bound agree with the sorted map.
        for k in vals.keys() {
            prop_assert!(r.index().find(k).unwrap().is_some());
        }
        prop_assert!(r.index().find("zzzz-not-there").unwrap().is_none());
        let keys: Vec<&String> = vals.keys().collect();
        for probe in ["", "a", "big/", "m", "\u{ffff}"] {
            let want = keys.iter().position(|k| k.as_bytes() >= probe.as_bytes()).unwrap_or(keys.len());
            prop_assert_eq!(r.index().lower_bound(probe.as_bytes()).unwrap(), want);
        }
    }

    #[test]
    fn ranges_read_only_what_they_cover(rows in 1u64..40, lo in 0u64..40, len in 0u64..40) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let mut vals = BTreeMap::new();
        let bytes: Vec<u8> = (0..rows * 4096).map(|i| (i % 251) as u8 / 8).collect();
        vals.insert("t".to_string(), (shardpoint_core::DType::F32, Kind::Tensor, vec![rows, 1024], bytes.clone()));
        save(&p, &items(&vals), opts(Codec::ZstdByteGroup, 1)).unwrap();
        let r = Reader::open(&p).unwrap();
        let e = r.entry("t").unwrap();
        let lo = (lo.min(rows)) * 4096;
        let hi = (lo + len * 4096).min(rows * 4096);
        let mut out = vec![0u8; (hi - lo) as usize];
        r.read_range(&e, lo, hi, &mut out).unwrap();
        prop_assert_eq!(&out[..], &bytes[lo as usize..hi as usize]);
    }

    /// Checked byte ranges of an uncompressed value with crc blocks (FORMAT.md §3.4) at any
    /// alignment: exact bytes, and whole blocks inside, partial blocks at the ends, a range
    /// inside one block and the value's short last block all come out right.
    #[test]
    fn checked_ranges_of_uncompressed_values(n in 1u64..200_000, a in 0u64..200_000, b in 0u64..200_000) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let bytes: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut vals = BTreeMap::new();
        vals.insert("t".to_string(), (shardpoint_core::DType::U8, Kind::Tensor, vec![n], bytes.clone()));
        save(&p, &items(&vals), opts(Codec::None, 1)).unwrap();
        let r = Reader::open(&p).unwrap();
        let e = r.entry("t").unwrap();
        prop_assert_eq!(e.nblocks() as u64, if n > 16384 { n.div_ceil(16384) } else { 0 });
        let (lo, hi) = (a.min(b).min(n), a.max(b).min(n));
        let mut out = vec![0u8; (hi - lo) as usize];
        r.read_range_checked(&e, lo, hi, &mut out).unwrap();
        prop_assert_eq!(&out[..], &bytes[lo as usize..hi as usize]);
    }
}

#[test]
fn duplicate_keys_and_bad_items_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let w = shardpoint_core::CheckpointWriter::new(&p, opts(Codec::None, 1)).unwrap();
    let data = [0u8; 4];
    let it = Item {
        key: "k".into(),
        dtype: shardpoint_core::DType::F32,
        kind: Kind::Tensor,
        dims: vec![1],
        data: &data,
        xor_base: None,
    };
    w.add(&it).unwrap();
    let err = w.add(&it).unwrap_err().to_string();
    assert!(err.contains("duplicate key \"k\""), "{err}");
    let bad = Item {
        dims: vec![2],
        ..it.clone()
    };
    let err = w
        .add(&Item {
            key: "k2".into(),
            ..bad
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs 8"), "{err}");
    let err = w
        .add(&Item {
            key: "".into(),
            ..it.clone()
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("length 0"), "{err}");
    w.commit().unwrap();
    assert_eq!(read_all(&p).unwrap().len(), 1);
}

#[test]
fn missing_checkpoint_and_key_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope");
    let err = Reader::open(&p).err().expect("no checkpoint there");
    assert!(matches!(err, shardpoint_core::Error::NotFound { .. }));
    assert!(err.to_string().contains("nope.index"), "{err}");
    let q = dir.path().join("ck");
    save(&q, &items(&sample_values()), opts(Codec::Zstd, 1)).unwrap();
    let err = Reader::open(&q)
        .unwrap()
        .entry("missing")
        .expect_err("missing key")
        .to_string();
    assert!(
        err.contains("\"missing\"") && err.contains("ck.index"),
        "{err}"
    );
}

#[test]
fn open_does_not_parse_entries() {
    // A corrupt entry block must not stop open (O(1) open); it is caught on first use.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let mut vals = BTreeMap::new();
    for i in 0..200 {
        vals.insert(
            format!("k{i:04}"),
            (
                shardpoint_core::DType::U8,
                Kind::Tensor,
                vec![1],
                vec![i as u8],
            ),
        );
    }
    save(&p, &items(&vals), opts(Codec::None, 1)).unwrap();
    let idx = dir.path().join("ck.index");
    let mut b = std::fs::read(&idx).unwrap();
    // Entry table starts after header (128), one shard record (64) and 4 block records (96).
    let entry_of_block_3 = 128 + 64 + 4 * 24 + (3 * 64 + 5) * 40 + 5; // not a block boundary
    b[entry_of_block_3] ^= 0xff;
    std::fs::write(&idx, &b).unwrap();
    let r = Reader::open(&p).expect("open reads only header, shard and block tables");
    assert_eq!(r.entry("k0001").unwrap().dims, vec![1]);
    let err = r
        .entry("k0197")
        .expect_err("block 3 is corrupt")
        .to_string();
    assert!(
        err.contains("checksum mismatch") && err.contains("index block 3"),
        "{err}"
    );
}
