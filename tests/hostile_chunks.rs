//! Hostile chunks at the Rust level (split from hostile.rs): stored chunk bytes that lie about
//! their size (decompression bombs), decoders fed into an empty destination, and a damaged codec-3
//! chunk that must be named by its chunk crc. Each must end in our error, never a panic.

use shardpoint_core::format::{DType, Kind};
use shardpoint_core::{save, Codec, Error, Reader};
use std::path::Path;

mod common;
use common::{flip_byte, items, opts, Val};

/// The chunk size the bomb's destination is given (any small size works).
const CB: usize = 4096;

#[test]
fn decompression_bombs_are_refused() {
    let path = Path::new("bomb");
    let frame = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
    for codec in [Codec::Zstd, Codec::ZstdByteGroup] {
        let mut stored = frame.clone();
        if codec == Codec::ZstdByteGroup {
            // plane 0 is the bomb; planes 1..4 are valid raw planes of n = 1024 bytes
            stored = (frame.len() as u32).to_le_bytes().to_vec();
            stored.extend_from_slice(&frame);
            for _ in 1..4 {
                stored.extend_from_slice(&1024u32.to_le_bytes());
                stored.extend_from_slice(&[0u8; 1024]);
            }
        }
        let mut out = vec![0u8; CB];
        let e = shardpoint_core::codec::decode_chunk(codec, DType::F32, &stored, &mut out, path, 7)
            .expect_err("bomb accepted");
        assert!(
            matches!(e, Error::Corrupt { offset, .. } if offset >= 7),
            "{e}"
        );
        assert!(e.to_string().contains("zstd"), "{e}");
    }
}

#[test]
fn decode_chunk_never_panics_on_an_empty_destination() {
    // Decoders take hostile bytes and return Err, never panic (format.rs, codec.rs docs).
    for codec in [
        Codec::None,
        Codec::Zstd,
        Codec::ZstdByteGroup,
        Codec::HuffByteGroup,
    ] {
        for dtype in [DType::U8, DType::F32, DType::C128] {
            let r = std::panic::catch_unwind(|| {
                let mut out: [u8; 0] = [];
                let _ = shardpoint_core::codec::decode_chunk(
                    codec,
                    dtype,
                    b"abcd",
                    &mut out,
                    Path::new("x"),
                    0,
                );
            });
            assert!(
                r.is_ok(),
                "decode_chunk({codec:?}, {dtype:?}) into 0 bytes panicked"
            );
        }
    }
}

#[test]
fn damaged_bytegroup_huffman_chunk_is_named() {
    // Codec 3 reads decode first and check the raw crc end to end; on failure the stored chunk
    // crcs name the damaged chunk and its offset.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let data: Vec<u8> = (0..8192u32)
        .flat_map(|i| ((i as f32 * 0.01).sin() * 0.02).to_le_bytes())
        .collect();
    let mut vals = std::collections::BTreeMap::new();
    let v: Val = (
        shardpoint_core::format::DType::F32,
        Kind::Tensor,
        vec![8192],
        data,
    );
    vals.insert("w".to_string(), v);
    save(
        &p,
        &items(&vals),
        opts(shardpoint_core::Codec::HuffByteGroup, 1),
    )
    .unwrap();
    let r = Reader::open(&p).unwrap();
    let e = r.entry("w").unwrap();
    assert_eq!(e.codec, shardpoint_core::Codec::HuffByteGroup);
    assert!(e.nchunks() > 2);
    let c = e.chunk(1);
    let at = e.offset + c.rel_offset + c.stored_len as u64 - 3; // inside the coded exponents
    let shard = r.shards()[e.shard as usize].path.clone();
    drop(e);
    drop(r);
    flip_byte(&shard, at, 0x10);
    let r = Reader::open(&p).unwrap();
    let e = r.entry("w").unwrap();
    let mut out = vec![0u8; e.raw_len as usize];
    match r.read_into(&e, &mut out, true) {
        Err(Error::Checksum { what, offset, .. }) => {
            assert!(what.contains("chunk 1"), "{what}");
            assert_eq!(offset, e.offset + e.chunk(1).rel_offset);
        }
        other => panic!("damaged chunk not named: {other:?}"),
    }
}
