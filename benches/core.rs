//! Criterion benchmarks of the core's hot loops: byte grouping, chunk encode/decode, crc32c.
//! Run with `cargo bench -p shardpoint-core`; throughput is reported in bytes/s.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardpoint_core::codec::{decode_chunk, encode_chunk, group, ungroup};
use shardpoint_core::format::{crc, Codec, DType};
use std::hint::black_box;
use std::path::Path;

/// 1 MiB of weight-like fp32 values (a sum of uniforms, scaled like initialised weights).
fn weights() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(1 << 20);
    for _ in 0..(1 << 18) {
        let mut s = 0.0f32;
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s += (x >> 40) as f32 / (1u64 << 24) as f32;
        }
        out.extend_from_slice(&((s - 2.0) * 0.02).to_le_bytes());
    }
    out
}

fn bench(c: &mut Criterion) {
    let raw = weights();
    let mut g = c.benchmark_group("chunk_1MiB_f32");
    g.throughput(Throughput::Bytes(raw.len() as u64));
    let mut tmp = vec![0u8; raw.len()];
    g.bench_function("group", |b| {
        b.iter(|| group(DType::F32, black_box(&raw), &mut tmp))
    });
    let grouped = tmp.clone();
    let mut back = vec![0u8; raw.len()];
    g.bench_function("ungroup", |b| {
        b.iter(|| ungroup(DType::F32, black_box(&grouped), &mut back))
    });
    g.bench_function("crc32c", |b| b.iter(|| crc(black_box(&raw))));
    for (name, codec) in [
        ("zstd-bytegroup", Codec::ZstdByteGroup),
        ("zstd", Codec::Zstd),
    ] {
        let enc = encode_chunk(codec, DType::F32, 1, &raw)
            .unwrap()
            .unwrap_or_else(|| raw.clone());
        eprintln!("{name}: ratio {:.3}", raw.len() as f64 / enc.len() as f64);
        g.bench_function(format!("encode_{name}"), |b| {
            b.iter(|| encode_chunk(codec, DType::F32, 1, black_box(&raw)).unwrap())
        });
        let mut out = vec![0u8; raw.len()];
        g.bench_function(format!("decode_{name}"), |b| {
            b.iter(|| {
                decode_chunk(
                    codec,
                    DType::F32,
                    black_box(&enc),
                    &mut out,
                    Path::new("bench"),
                    0,
                )
                .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
