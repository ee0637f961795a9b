//! Criterion benchmarks of the core's hot loops: byte grouping, chunk encode/decode per codec
//! and float dtype, crc32c. Run with `cargo bench -p shardpoint-core`; throughput is reported in
//! raw bytes/s. Each codec's ratio on the bench data is printed to stderr.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rayon::prelude::*;
use shardpoint_core::codec::{
    decode_chunk_crc, decode_chunk_raw_crc, encode_chunk_crc, group, ungroup,
};
use shardpoint_core::format::{crc, Codec, DType};
use std::hint::black_box;
use std::path::Path;

/// `n` weight-like values (a sum of uniforms, scaled like initialised weights), as f32.
fn weights(n: usize) -> Vec<f32> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            let mut s = 0.0f32;
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s += (x >> 40) as f32 / (1u64 << 24) as f32;
            }
            (s - 2.0) * 0.02
        })
        .collect()
}

/// 1 MiB of weights in `dtype` (fp32, or fp16/bf16 converted by bit manipulation).
fn chunk(dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => weights(1 << 18)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => weights(1 << 19)
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        DType::F16 => weights(1 << 19)
            .iter()
            .flat_map(|v| f32_to_f16(*v).to_le_bytes())
            .collect(),
        _ => unreachable!(),
    }
}

/// f32 -> IEEE half (round toward zero; normal and subnormal weights only).
fn f32_to_f16(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if exp <= 0 {
        if exp < -10 {
            return sign;
        }
        let m = (man | 0x80_0000) >> (14 - exp);
        return sign | m as u16;
    }
    sign | ((exp as u16) << 10) | (man >> 13) as u16
}

fn bench(c: &mut Criterion) {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let raw = chunk(dtype);
        let mut g = c.benchmark_group(format!("chunk_1MiB_{}", dtype.name()));
        g.throughput(Throughput::Bytes(raw.len() as u64));
        let mut tmp = vec![0u8; raw.len()];
        g.bench_function("group", |b| {
            b.iter(|| group(dtype, black_box(&raw), &mut tmp))
        });
        let grouped = tmp.clone();
        let mut back = vec![0u8; raw.len()];
        g.bench_function("ungroup", |b| {
            b.iter(|| ungroup(dtype, black_box(&grouped), &mut back))
        });
        g.bench_function("crc32c", |b| b.iter(|| crc(black_box(&raw))));
        for (name, codec) in [
            ("bytegroup-huffman", Codec::HuffByteGroup),
            ("zstd-bytegroup", Codec::ZstdByteGroup),
            ("zstd", Codec::Zstd),
        ] {
            let enc = encode_chunk_crc(codec, dtype, 1, &raw)
                .unwrap()
                .stored
                .unwrap_or_else(|| raw.clone());
            eprintln!(
                "{} {name}: ratio {:.4}",
                dtype.name(),
                raw.len() as f64 / enc.len() as f64
            );
            g.bench_function(format!("encode+crc_{name}"), |b| {
                b.iter(|| encode_chunk_crc(codec, dtype, 1, black_box(&raw)).unwrap())
            });
            let mut out = vec![0u8; raw.len()];
            g.bench_function(format!("decode+crc_{name}"), |b| {
                b.iter(|| {
                    decode_chunk_crc(
                        codec,
                        dtype,
                        black_box(&enc),
                        &mut out,
                        Path::new("bench"),
                        0,
                    )
                    .unwrap()
                })
            });
        }
        // What a load does per codec-3 chunk: decode with the raw crc only (reader/chunks.rs).
        let enc = encode_chunk_crc(Codec::HuffByteGroup, dtype, 1, &raw)
            .unwrap()
            .stored
            .unwrap();
        let mut out = vec![0u8; raw.len()];
        g.bench_function("decode+rawcrc_bytegroup-huffman", |b| {
            b.iter(|| {
                decode_chunk_raw_crc(
                    Codec::HuffByteGroup,
                    dtype,
                    black_box(&enc),
                    &mut out,
                    Path::new("bench"),
                    0,
                )
                .unwrap()
            })
        });
        g.finish();
    }
}

/// Codec 3 on 32 chunks at once on the rayon pool (RAYON_NUM_THREADS threads): the codec's
/// own multi-threaded speed, without the file write or read around it.
fn bench_parallel(c: &mut Criterion) {
    let threads = rayon::current_num_threads();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let one = chunk(dtype);
        let chunks: Vec<Vec<u8>> = (0..32).map(|_| one.clone()).collect();
        let mut g = c.benchmark_group(format!("parallel_32MiB_{}_{threads}threads", dtype.name()));
        g.throughput(Throughput::Bytes((one.len() * chunks.len()) as u64));
        g.sample_size(20);
        g.bench_function("encode+crc_bytegroup-huffman", |b| {
            b.iter(|| {
                chunks
                    .par_iter()
                    .map(|r| encode_chunk_crc(Codec::HuffByteGroup, dtype, 1, r).unwrap())
                    .count()
            })
        });
        let stored: Vec<Vec<u8>> = chunks
            .iter()
            .map(|r| {
                encode_chunk_crc(Codec::HuffByteGroup, dtype, 1, r)
                    .unwrap()
                    .stored
                    .unwrap()
            })
            .collect();
        let mut outs: Vec<Vec<u8>> = chunks.iter().map(|r| vec![0u8; r.len()]).collect();
        g.bench_function("decode+rawcrc_bytegroup-huffman", |b| {
            b.iter(|| {
                stored
                    .par_iter()
                    .zip(outs.par_iter_mut())
                    .map(|(s, o)| {
                        decode_chunk_raw_crc(Codec::HuffByteGroup, dtype, s, o, Path::new("b"), 0)
                            .unwrap()
                    })
                    .count()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench, bench_parallel);
criterion_main!(benches);
