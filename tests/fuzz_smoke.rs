//! The fuzz targets of fuzz/ on stable Rust, without libFuzzer: each target runs over its seed
//! corpus (fuzz/corpus/<target>/) and a few thousand deterministic mutations of it (bit flips,
//! byte sets, interesting integers over aligned fields, truncation, extension, splices). Index
//! mutations are resealed (every crc recomputed) half of the time so they reach the semantic
//! checks rather than stopping at a checksum. A panic is a failure; so is a broken invariant
//! asserted by the target (fuzz/fuzz_targets/logic.rs).
//!
//! `FUZZ_SMOKE_ITERS` sets the mutations per target (default 20,000).

use std::path::Path;

include!("../fuzz/fuzz_targets/logic.rs");

/// xorshift64*: deterministic, seedable, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: [u64; 12] = [
    0,
    1,
    63,
    64,
    4095,
    4096,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    u64::MAX / 2,
    u64::MAX,
];

fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut b = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = b.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                b[i] = rng.next() as u8;
            }
            2 if len >= 8 => {
                // an interesting integer over an 8-byte-aligned field (most header fields)
                let at = rng.below(len / 8) * 8;
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let w = if rng.below(2) == 0 { 8 } else { 4 };
                let bytes = v.to_le_bytes();
                let end = (at + w).min(len);
                b[at..end].copy_from_slice(&bytes[..end - at]);
            }
            3 if len > 0 => b.truncate(rng.below(len)),
            4 => {
                let extra = 1 + rng.below(64);
                for _ in 0..extra {
                    b.push(rng.next() as u8);
                }
            }
            5 if len > 1 => {
                // duplicate a range over another (overlapping records, repeated keys)
                let a = rng.below(len);
                let n = 1 + rng.below((len - a).min(64));
                let dst = rng.below(len - n + 1);
                let chunk = b[a..a + n].to_vec();
                b[dst..dst + n].copy_from_slice(&chunk);
            }
            6 if !corpus.is_empty() && len > 0 => {
                // splice the tail of another seed
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len);
                let from = rng.below(other.len().max(1));
                b.truncate(cut);
                b.extend_from_slice(&other[from.min(other.len())..]);
            }
            _ if len > 0 => {
                let i = rng.below(len);
                b.remove(i);
            }
            _ => b.push(0),
        }
    }
    b
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let out: Vec<Vec<u8>> = names.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(
        out.len() >= 3,
        "{}: the seed corpus is missing",
        dir.display()
    );
    out
}

fn iters() -> usize {
    std::env::var("FUZZ_SMOKE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}

/// Run `f` over the seeds and `iters()` mutations; returns the number of executions.
fn smoke(target: &str, seed: u64, reseal: bool, f: fn(&[u8])) -> usize {
    let corpus = seeds(target);
    let mut rng = Rng(seed);
    let mut execs = 0;
    for s in &corpus {
        f(s);
        execs += 1;
    }
    for i in 0..iters() {
        let base = &corpus[i % corpus.len()];
        let mut m = mutate(&mut rng, base, &corpus);
        if reseal && rng.below(2) == 0 {
            reseal_index(&mut m);
        }
        let r = std::panic::catch_unwind(|| f(&m));
        if r.is_err() {
            let dump = std::env::temp_dir().join(format!("fuzz-smoke-{target}-{i}.bin"));
            std::fs::write(&dump, &m).unwrap();
            panic!(
                "{target}: mutation {i} panicked; input saved to {}",
                dump.display()
            );
        }
        execs += 1;
    }
    eprintln!("fuzz_smoke {target}: {execs} executions");
    execs
}

#[test]
fn index_target() {
    // The seeds must be accepted: otherwise the mutations explore nothing useful.
    for s in seeds("index") {
        IndexView::open(&s[..], Path::new("seed.index"))
            .unwrap()
            .verify_all()
            .unwrap();
    }
    assert!(smoke("index", 0x9E37_79B9_7F4A_7C15, true, fuzz_index) > iters());
}

#[test]
fn shard_header_target() {
    for s in seeds("shard_header") {
        ShardHeader::decode(&s, Path::new("seed")).unwrap();
    }
    assert!(
        smoke(
            "shard_header",
            0xD1B5_4A32_D192_ED03,
            false,
            fuzz_shard_header
        ) > iters()
    );
}

#[test]
fn chunk_target() {
    assert!(smoke("chunk", 0x8CB9_2BA7_2F3D_8DD7, false, fuzz_chunk) > iters());
}

#[test]
fn resealed_seeds_stay_valid() {
    // reseal_index of an unmodified index is the identity: it recomputes what is there.
    for s in seeds("index") {
        let mut m = s.clone();
        reseal_index(&mut m);
        assert_eq!(m, s);
    }
}
