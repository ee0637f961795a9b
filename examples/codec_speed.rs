use shardpoint_core::codec::*;
use shardpoint_core::format::*;
use std::time::Instant;
fn main() {
    let n = 64 << 20;
    // pseudo normal floats * 0.02
    let mut x: u64 = 12345;
    let mut data = Vec::with_capacity(n);
    for _ in 0..n / 4 {
        let mut s = 0.0f32;
        for _ in 0..4 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; s += (x >> 40) as f32 / (1u64 << 24) as f32; }
        data.extend_from_slice(&(((s - 2.0) * 0.02) as f32).to_le_bytes());
    }
    let mut g = vec![0u8; n];
    let t = Instant::now(); for (a,b) in data.chunks(1<<20).zip(g.chunks_mut(1<<20)) { group(DType::F32, a, b); } println!("group {:.2} GB/s", n as f64 / t.elapsed().as_secs_f64() / 1e9);
    let mut b = vec![0u8; n];
    let t = Instant::now(); for (a,bb) in g.chunks(1<<20).zip(b.chunks_mut(1<<20)) { ungroup(DType::F32, a, bb); } println!("ungroup {:.2} GB/s", n as f64 / t.elapsed().as_secs_f64() / 1e9);
    assert_eq!(b, data);
    for lvl in [1, -1, 3] {
        let t = Instant::now();
        let mut tot = 0; let mut outs = vec![];
        for c in data.chunks(1 << 20) { let e = encode_chunk(Codec::ZstdByteGroup, DType::F32, lvl, c).unwrap(); tot += e.as_ref().map(|v| v.len()).unwrap_or(c.len()); outs.push(e); }
        let dt = t.elapsed().as_secs_f64();
        println!("lvl {lvl} encode {:.2} GB/s ratio {:.3}", n as f64 / dt / 1e9, n as f64 / tot as f64);
        let t = Instant::now();
        let mut out = vec![0u8; 1 << 20];
        for (c, e) in data.chunks(1 << 20).zip(&outs) { let s = e.as_deref().unwrap_or(c); decode_chunk(Codec::ZstdByteGroup, DType::F32, s, &mut out, std::path::Path::new("x"), 0).unwrap(); }
        println!("lvl {lvl} decode {:.2} GB/s", n as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let mut cp = vec![1u8; n]; let t = Instant::now(); cp.copy_from_slice(&data); println!("memcpy {:.2} GB/s {}", n as f64 / t.elapsed().as_secs_f64() / 1e9, cp[5]);
    let t = Instant::now(); for (a,b) in data.chunks(1<<20).zip(g.chunks_mut(1<<20)) { group(DType::F32, a, b); } println!("group again {:.2} GB/s", n as f64 / t.elapsed().as_secs_f64() / 1e9);
    let t = Instant::now(); let c = crc(&data); println!("crc {:.2} GB/s {c}", n as f64 / t.elapsed().as_secs_f64() / 1e9);
}
#[allow(dead_code)]
fn memcpy_speed() {}
