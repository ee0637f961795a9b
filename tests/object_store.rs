//! The object-store path of the core on `memory://` (no server needed): save, lazy reads,
//! slices, verify, multi-writer merge, the conditional commit and cleanup.

use shardpoint_core::format::{DType, Kind};
use shardpoint_core::store::remote_reader::RemoteReader;
use shardpoint_core::store::Location;
use shardpoint_core::{merge_at, save_at, CheckpointWriter, Error, Item, WriterOptions};
use std::collections::BTreeMap;

fn loc(url: &str) -> Location {
    Location::parse(url, &BTreeMap::new()).expect("parse")
}

fn remote(l: &Location) -> &shardpoint_core::store::RemotePrefix {
    match l {
        Location::Remote(r) => r,
        Location::Local(_) => panic!("expected a remote location"),
    }
}

fn f32s(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((i as u32).wrapping_mul(seed) % 1000) as f32 * 0.001).to_le_bytes())
        .collect()
}

fn item<'a>(key: &str, data: &'a [u8]) -> Item<'a> {
    Item {
        key: key.into(),
        dtype: DType::F32,
        kind: Kind::Tensor,
        dims: vec![(data.len() / 4) as u64],
        data,
        xor_base: None,
    }
}

#[test]
fn memory_round_trip_lazy_reads_and_verify() {
    let l = loc("memory://rt/dir/ckpt");
    let a = f32s(100_000, 7);
    let b = f32s(10, 3);
    let opts = WriterOptions {
        chunk_bytes: 16 << 10,
        shards: 2,
        ..Default::default()
    };
    save_at(&l, &[item("a", &a), item("b", &b)], opts).expect("save");
    let r = RemoteReader::open(remote(&l)).expect("open");
    assert_eq!(r.index().len(), 2);
    let e = r.entry("a").expect("entry");
    assert_eq!(r.read(&e).expect("read"), a);
    let mut out = vec![0u8; 4000];
    r.read_range(&e, 40_000, 44_000, &mut out, true)
        .expect("range");
    assert_eq!(out, a[40_000..44_000]);
    let es = vec![r.entry("a").unwrap(), r.entry("b").unwrap()];
    let vals = r.read_many(&es).expect("many");
    assert_eq!(vals[1], b);
    r.verify().expect("verify");
    assert!(matches!(r.entry("zz"), Err(Error::MissingKey { .. })));
}

#[test]
fn memory_uncompressed_reads_into_buffers_and_ranges() {
    let l = loc("memory://raw/dir/ckpt");
    let a = f32s(50_000, 5);
    let b = f32s(7, 9);
    let opts = WriterOptions {
        codec: shardpoint_core::Codec::None,
        ..Default::default()
    };
    save_at(&l, &[item("a", &a), item("b", &b)], opts).expect("save");
    let r = RemoteReader::open(remote(&l)).expect("open");
    let es = vec![r.entry("a").unwrap(), r.entry("b").unwrap()];
    let (mut oa, mut ob) = (vec![0u8; a.len()], vec![0u8; b.len()]);
    r.read_many_into(&es, &mut [&mut oa[..], &mut ob[..]])
        .expect("into");
    assert_eq!((&oa, &ob), (&a, &b));
    // a checked part is cut from one checked download of the whole value; unchecked: the range
    for verify in [true, false] {
        let mut part = vec![0u8; 4000];
        r.read_range(&es[0], 40_000, 44_000, &mut part, verify)
            .expect("range");
        assert_eq!(part, a[40_000..44_000]);
    }
    let mut short = [0u8; 3];
    assert!(matches!(
        r.read_many_into(&es[1..], &mut [&mut short[..]]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn memory_conditional_commit_one_winner() {
    let l = loc("memory://race/ckpt");
    let x = f32s(8, 1);
    let w1 = CheckpointWriter::new_at(&l, WriterOptions::default()).unwrap();
    let w2 = CheckpointWriter::new_at(&l, WriterOptions::default()).unwrap();
    w1.add(&item("w1", &x)).unwrap();
    w2.add(&item("w2", &x)).unwrap();
    w1.commit().expect("first commit wins");
    let err = w2.commit().expect_err("second commit must lose");
    assert!(
        err.to_string().contains("another writer committed"),
        "{err}"
    );
    let r = RemoteReader::open(remote(&l)).unwrap();
    assert!(r.entry("w1").is_ok());
    // a later save (which saw the current index) replaces it and removes the old shards
    save_at(&l, &[item("w3", &x)], WriterOptions::default()).unwrap();
    let rp = remote(&l);
    let (dir, _) = rp.dir_and_base();
    let (objs, _) = rp.store.list_dir(dir).unwrap();
    let shards = objs
        .iter()
        .filter(|o| o.location.as_ref().contains(".data-"))
        .count();
    assert_eq!(shards, 1, "{objs:?}");
}

#[test]
fn memory_multi_writer_merge() {
    let l = loc("memory://mw/ckpt");
    let x = f32s(16, 5);
    for rank in 0..3 {
        let w = CheckpointWriter::new_at(
            &l,
            WriterOptions {
                rank,
                world_size: 3,
                merge_token: "t".into(),
                ..Default::default()
            },
        )
        .unwrap();
        w.add(&item(&format!("r{rank}"), &x)).unwrap();
        w.commit().unwrap();
    }
    merge_at(&l, 3, true, Some("t")).expect("merge");
    let r = RemoteReader::open(remote(&l)).unwrap();
    assert_eq!(r.index().len(), 3);
    assert_eq!(r.read(&r.entry("r2").unwrap()).unwrap(), x);
}

#[test]
fn bad_urls_are_refused() {
    let m = BTreeMap::new();
    assert!(Location::parse("s3://bucket/", &m).is_err());
    assert!(Location::parse("s3://user:pw@bucket/x", &m)
        .err()
        .is_some_and(|e| !e.to_string().contains("pw")));
    assert!(matches!(
        Location::parse("file:///tmp/x", &m),
        Ok(Location::Local(_))
    ));
}

#[test]
fn memory_hashed_partials_merge_and_gc_on_the_stores_clock() {
    use shardpoint_core::merge_at_in;
    use shardpoint_core::store::remote_commit::gc;
    let writer = |l: &Location, rank: u32, key: &str, x: &[u8]| {
        let opts = WriterOptions {
            rank,
            world_size: 2,
            merge_token: "t".into(),
            hashed_prefixes: true,
            ..Default::default()
        };
        let w = CheckpointWriter::new_at(l, opts).unwrap();
        w.add(&item(key, x)).unwrap();
        w.commit().unwrap();
    };
    let l = loc("memory://hashedparts/run/ckpt");
    let x = f32s(16, 7);
    for rank in 0..2 {
        writer(&l, rank, &format!("r{rank}"), &x);
    }
    let store = &remote(&l).store;
    let keys = || -> Vec<String> {
        let mut k: Vec<String> = store
            .list("run")
            .unwrap()
            .into_iter()
            .map(|m| m.location.to_string())
            .collect();
        k.sort();
        k
    };
    // the partial indexes spread under `P/HH/` like the shards (FORMAT.md §3.1.1)
    let parts: Vec<String> = keys()
        .into_iter()
        .filter(|k| k.contains("index.part"))
        .collect();
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(
        parts.iter().all(|k| k.starts_with("run/ckpt/")),
        "{parts:?}"
    );
    let err = merge_at(&l, 2, true, Some("t")).unwrap_err().to_string();
    assert!(err.contains("hashed_prefixes=True"), "{err}");
    merge_at_in(&l, 2, true, Some("t"), false, true).expect("merge");
    assert!(!keys().iter().any(|k| k.contains("index.part")));
    let kept = keys();
    // a dead save beside it: young on the store's clock (memory:// gives it through the
    // object gc writes and deletes), then removed when any age will do
    writer(&loc("memory://hashedparts/run/dead"), 0, "d", &x);
    assert_eq!(keys().len(), kept.len() + 2);
    assert_eq!(gc(store, "run", 3600.0).unwrap(), 0);
    assert_eq!(gc(store, "run", 0.0).unwrap(), 2);
    assert_eq!(keys(), kept); // no clock probe left behind
    let r = RemoteReader::open(remote(&l)).unwrap();
    assert_eq!(r.read(&r.entry("r1").unwrap()).unwrap(), x);
}
