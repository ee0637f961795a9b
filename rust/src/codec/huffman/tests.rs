//! Unit tests of `huffman` (beside it, out of the module's own file).

use super::*;
use proptest::prelude::*;

fn round_trip(plane: &[u8]) -> Option<Vec<u8>> {
    let lens = code_lengths(&histogram(plane))?;
    let mut seg = Vec::new();
    encode(plane, &lens, &mut seg);
    assert!(seg.len() <= segment_len_bound(&histogram(plane), &lens));
    let mut back = vec![0u8; plane.len()];
    decode(&seg, &mut back).unwrap();
    assert_eq!(back, plane);
    Some(seg)
}

proptest! {
    #[test]
    fn round_trips(bytes in proptest::collection::vec(0u8..24, 0..5000), sh in 0u32..8) {
        let plane: Vec<u8> = bytes.iter().map(|b| b.wrapping_shl(sh) ^ (b >> 2)).collect();
        round_trip(&plane);
    }

    #[test]
    fn lengths_are_complete_and_limited(counts in proptest::collection::vec(0u32..1_000_000, 2..256)) {
        let mut h = [0u32; 256];
        for (i, c) in counts.iter().enumerate() { h[i] = *c; }
        // Fibonacci-like weights force long codes that need limiting.
        h[0] = h[0].max(1);
        h[1] = h[1].max(1);
        if let Some(l) = code_lengths(&h) {
            let k: u64 = l.iter().filter(|&&x| x > 0).map(|&x| 1u64 << (MAX_LEN - x as u32)).sum();
            prop_assert_eq!(k, 1u64 << MAX_LEN);
            for s in 0..256 { prop_assert_eq!(l[s] > 0, h[s] > 0); }
        }
    }
}

#[test]
fn skewed_distribution_is_limited_to_max_len() {
    let mut h = [0u32; 256];
    let mut f = 1u32;
    for (i, x) in h.iter_mut().enumerate().take(30) {
        *x = f;
        f = f.saturating_mul(2).min(1 << 30);
        let _ = i;
    }
    let l = code_lengths(&h).unwrap();
    assert!(l.iter().all(|&x| (x as u32) <= MAX_LEN));
    assert_eq!(l[0], MAX_LEN as u8);
}

#[test]
fn coding_is_near_entropy() {
    // Geometric exponent-like distribution: coded size within 3% of the entropy bound.
    let mut plane = Vec::new();
    let mut x = 12345u64;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        plane.push(120 - (x.trailing_zeros() as u8).min(20));
    }
    let seg = round_trip(&plane).unwrap();
    let h = histogram(&plane);
    let n = plane.len() as f64;
    let ent: f64 = h
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| -(c as f64) * (c as f64 / n).log2())
        .sum::<f64>()
        / 8.0;
    assert!(
        (seg.len() as f64) < ent * 1.03 + 64.0,
        "{} vs {ent}",
        seg.len()
    );
}

#[test]
fn hostile_segments_error_without_panicking() {
    let plane: Vec<u8> = (0..1000u32).map(|i| (i % 7) as u8).collect();
    let lens = code_lengths(&histogram(&plane)).unwrap();
    let mut seg = Vec::new();
    encode(&plane, &lens, &mut seg);
    let mut out = vec![0u8; plane.len()];
    for cut in 0..seg.len() {
        let _ = decode(&seg[..cut], &mut out);
    }
    assert!(decode(&seg[..seg.len() - 1], &mut out).is_err());
    for i in 0..seg.len() {
        let mut b = seg.clone();
        b[i] ^= 0x5a;
        let _ = decode(&b, &mut out);
    }
    // An over-full table is refused.
    let mut b = seg.clone();
    b[2] = 0x11;
    b[3] = 0x11;
    assert!(decode(&b, &mut out).is_err());
}

/// The fast loop's extremes: runs of 11-bit codes (five lookups use 55 of a lane's 56 bits,
/// the sentinel just above them) and runs of 1-bit codes (four symbols per lookup, the 8-byte
/// store's overshoot at its largest), inside a plane long enough that most symbols go through
/// the fast loop; also cut to lengths near the stream pieces' ends.
#[test]
fn fast_loop_extremes_round_trip() {
    // Geometric symbols (symbol k with probability 2^-(k+1)): 0 gets a 1-bit code, the rare
    // ones (k >= 11) the longest. Runs of each extreme are spread over the streams.
    let mut plane = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for block in 0..40 {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            plane.push(x.trailing_zeros().min(40) as u8);
        }
        match block % 4 {
            0 => plane.extend((0..60).map(|i| 12 + (i % 6) as u8)), // longest codes
            2 => plane.extend(std::iter::repeat_n(0u8, 2000)),      // shortest code
            _ => {}
        }
    }
    let lens = code_lengths(&histogram(&plane)).unwrap();
    assert_eq!(lens[0], 1);
    // The runs stay rare (about 1 in 4000 symbols) so they keep the longest length.
    assert!(
        (12..18).all(|s| lens[s] as u32 == MAX_LEN),
        "{:?}",
        &lens[..24]
    );
    for cut in [
        plane.len(),
        plane.len() - 1,
        plane.len() - 29,
        40_001,
        8 * 28 + 3,
    ] {
        round_trip(&plane[plane.len() - cut..]);
    }
}
