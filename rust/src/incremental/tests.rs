//! Unit tests of `incremental` (beside it, out of the module's own file).

use super::*;
use crate::reader::Reader;

fn item<'a>(key: &str, data: &'a [u8]) -> Item<'a> {
    Item {
        key: key.into(),
        dtype: DType::F32,
        kind: Kind::Tensor,
        dims: vec![data.len() as u64 / 4],
        data,
        xor_base: None,
    }
}

fn read(prefix: &Path, key: &str) -> Vec<u8> {
    let r = Reader::open(prefix).unwrap();
    let e = r.entry(key).unwrap();
    let mut out = vec![0u8; raw_len(&e.to_meta().dims, 4).unwrap() as usize];
    r.read_into(&e, &mut out, true).unwrap();
    out
}

#[test]
fn unchanged_big_values_are_linked_and_survive_base_removal() {
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (dir.path().join("a"), dir.path().join("b"));
    let frozen: Vec<u8> = (0..(1u32 << 20))
        .flat_map(|i| (i % 977).to_le_bytes())
        .collect();
    let mut train = vec![1u8; 1 << 20];
    let opts = WriterOptions::default();
    let r1 = save_incremental(
        &p1,
        &[item("frozen", &frozen), item("train", &train)],
        None,
        None,
        1 << 20,
        opts.clone(),
    )
    .unwrap();
    assert_eq!((r1.linked_shards, r1.written_shards), (0, 2));
    train[5] = 9;
    let r2 = save_incremental(
        &p2,
        &[item("frozen", &frozen), item("train", &train)],
        None,
        Some(&p1),
        1 << 20,
        opts,
    )
    .unwrap();
    assert_eq!(r2.linked_shards, 1);
    assert_eq!(r2.linked_bytes, frozen.len() as u64);
    assert_eq!(r2.written_bytes, train.len() as u64);
    crate::commit::remove(&p1).unwrap();
    Reader::open(&p2).unwrap().verify().unwrap();
    assert_eq!(read(&p2, "frozen"), frozen);
    assert_eq!(read(&p2, "train"), train);
}

#[test]
fn wrong_crc_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = [0u8; 8];
    let e = save_incremental(
        &dir.path().join("a"),
        &[item("x", &d)],
        Some(&[1, 2]),
        None,
        1,
        WriterOptions::default(),
    );
    assert!(matches!(e, Err(Error::InvalidArgument(_))));
}
