#![allow(dead_code, unused_imports)]
// Shared helpers of the Rust integration tests (included with `mod common_rs;`-style `include!`).

pub use shardpoint_core::format::{Codec, DType, Kind};
pub use shardpoint_core::{Item, Reader, WriterOptions};
pub use std::collections::BTreeMap;
pub use std::path::Path;

/// An owned value to save: (dtype, kind, dims, bytes).
pub type Val = (DType, Kind, Vec<u64>, Vec<u8>);

pub fn items(vals: &BTreeMap<String, Val>) -> Vec<Item<'_>> {
    vals.iter()
        .map(|(k, (d, kind, dims, b))| Item {
            key: k.clone(),
            dtype: *d,
            kind: *kind,
            dims: dims.clone(),
            data: b,
            xor_base: None,
        })
        .collect()
}

pub fn opts(codec: Codec, shards: u32) -> WriterOptions {
    WriterOptions {
        codec,
        shards,
        durable: false,
        chunk_bytes: 4096,
        ..Default::default()
    }
}

/// Read every entry of a checkpoint back into owned values.
pub fn read_all(prefix: &Path) -> shardpoint_core::Result<BTreeMap<String, Val>> {
    let r = Reader::open(prefix)?;
    let mut out = BTreeMap::new();
    for i in 0..r.index().len() {
        let e = r.index().entry(i)?;
        let mut buf = vec![0u8; e.raw_len as usize];
        r.read_into(&e, &mut buf, true)?;
        out.insert(e.key.to_string(), (e.dtype, e.kind, e.dims.clone(), buf));
    }
    Ok(out)
}

/// A small mixed checkpoint: raw, compressible, incompressible, typed, empty and 0-d values.
pub fn sample_values() -> BTreeMap<String, Val> {
    let mut m = BTreeMap::new();
    let smooth: Vec<u8> = (0..1500u32)
        .flat_map(|i| ((i as f32 * 0.001).sin() * 0.02).to_le_bytes())
        .collect();
    let mut x = 7u64;
    let noise: Vec<u8> = (0..1200)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    m.insert(
        "a/smooth".to_string(),
        (DType::F32, Kind::Tensor, vec![100, 15], smooth),
    );
    m.insert(
        "a/noise".to_string(),
        (DType::U8, Kind::Tensor, vec![1200], noise),
    );
    m.insert(
        "b/small".to_string(),
        (
            DType::I64,
            Kind::Tensor,
            vec![3],
            vec![
                1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
            ],
        ),
    );
    m.insert(
        "b/scalar".to_string(),
        (
            DType::F64,
            Kind::Tensor,
            vec![],
            1.5f64.to_le_bytes().to_vec(),
        ),
    );
    m.insert(
        "b/empty".to_string(),
        (DType::F16, Kind::Tensor, vec![0, 4], vec![]),
    );
    m.insert(
        "c/text".to_string(),
        (DType::U8, Kind::Str, vec![5], b"hello".to_vec()),
    );
    m.insert(
        "c/zeros".to_string(),
        (DType::BF16, Kind::Tensor, vec![32, 80], vec![0u8; 5120]),
    );
    m
}

/// Flip bits `mask` of the byte at `at` of the file at `path`, in place.
pub fn flip_byte(path: &Path, at: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ mask], at).unwrap();
}
