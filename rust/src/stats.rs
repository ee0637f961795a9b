//! Numerical health of tensors: per-tensor statistics and value differences, computed over raw
//! little-endian bytes of any stored dtype in one streaming pass.
//!
//! Everything is accumulated in f64. Each block of [`BLOCK`] elements is summed twice (mean,
//! then squared deviations from that mean: the stable two-pass method while the block is in
//! cache), and blocks, pieces and chunks are merged with Chan et al.'s pairwise update, so the
//! error does not grow with the tensor's length the way a naive running sum of squares does.
//!
//! Definitions (docs/INSPECT.md): `min`, `max`, `mean`, `std` (population) and `l2` are over
//! the *finite* elements; NaN, +Inf and -Inf are counted apart, so one Inf does not hide the
//! rest of the tensor. Complex values contribute their magnitude |z|; `float4_e2m1fn_x2` bytes
//! hold two elements each. 64-bit integers above 2^53 are rounded to the nearest f64.

use crate::error::{Error, Result};
use crate::format::DType;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Elements per two-pass block: small enough to stay in L1/L2 between the two passes.
const BLOCK: usize = 4096;
/// Bytes per parallel piece of an in-memory buffer (a multiple of every itemsize).
const PIECE: usize = 1 << 20;

/// Statistics of one tensor (or of part of one, before merging).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorStats {
    /// Elements seen.
    pub count: u64,
    /// Finite elements (those the moments are over).
    pub finite: u64,
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
    /// Elements equal to zero (+0 and -0).
    pub zeros: u64,
    /// Smallest / largest finite value; NaN when there is none.
    pub min: f64,
    pub max: f64,
    /// Mean of the finite values (0 when there is none).
    pub mean: f64,
    /// Sum of squared deviations from `mean` over the finite values.
    pub m2: f64,
}

impl Default for TensorStats {
    fn default() -> Self {
        TensorStats {
            count: 0,
            finite: 0,
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
            zeros: 0,
            min: f64::NAN,
            max: f64::NAN,
            mean: 0.0,
            m2: 0.0,
        }
    }
}

impl TensorStats {
    /// Population standard deviation of the finite values (NaN when there is none).
    pub fn std(&self) -> f64 {
        if self.finite == 0 {
            f64::NAN
        } else {
            (self.m2 / self.finite as f64).max(0.0).sqrt()
        }
    }

    /// L2 norm of the finite values: sqrt(sum x^2) = sqrt(m2 + n * mean^2), two non-negative
    /// terms, so no cancellation.
    pub fn l2(&self) -> f64 {
        (self.m2 + self.finite as f64 * self.mean * self.mean)
            .max(0.0)
            .sqrt()
    }

    /// Combine the statistics of two disjoint parts (Chan, Golub & LeVeque's pairwise update).
    pub fn merge(self, o: TensorStats) -> TensorStats {
        let n = self.finite + o.finite;
        let (mean, m2) = if o.finite == 0 {
            (self.mean, self.m2)
        } else if self.finite == 0 {
            (o.mean, o.m2)
        } else {
            let (na, nb) = (self.finite as f64, o.finite as f64);
            let delta = o.mean - self.mean;
            let mean = self.mean + delta * nb / n as f64;
            (mean, self.m2 + o.m2 + delta * delta * na * nb / n as f64)
        };
        TensorStats {
            count: self.count + o.count,
            finite: n,
            nan: self.nan + o.nan,
            pos_inf: self.pos_inf + o.pos_inf,
            neg_inf: self.neg_inf + o.neg_inf,
            zeros: self.zeros + o.zeros,
            min: fmin(self.min, o.min),
            max: fmax(self.max, o.max),
            mean,
            m2,
        }
    }
}

/// min/max where NaN means "none yet".
fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b < a {
        b
    } else {
        a
    }
}
fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a {
        b
    } else {
        a
    }
}

// --- element decoding -------------------------------------------------------------------------

/// Value of a small float format with `mbits` mantissa bits and exponent `bias`, from its
/// unsigned exponent field `e` and mantissa `m` (subnormal when `e == 0`). Specials are the
/// callers' business: each format spends its bit patterns differently.
fn minifloat(e: u32, m: u32, mbits: u32, bias: i32) -> f64 {
    let frac = m as f64 / (1u32 << mbits) as f64;
    if e == 0 {
        frac * 2f64.powi(1 - bias)
    } else {
        (1.0 + frac) * 2f64.powi(e as i32 - bias)
    }
}

fn signed(neg: bool, v: f64) -> f64 {
    if neg {
        -v
    } else {
        v
    }
}

/// The value of every byte of a one-byte float dtype (float4: of one nibble, the low four bits).
fn byte_value(dt: DType, b: u8) -> f64 {
    let neg = b & 0x80 != 0;
    match dt {
        DType::F8E4M3FN => {
            let (e, m) = (((b >> 3) & 0xf) as u32, (b & 7) as u32);
            if e == 15 && m == 7 {
                return f64::NAN; // no infinities in e4m3fn
            }
            signed(neg, minifloat(e, m, 3, 7))
        }
        DType::F8E5M2 => {
            let (e, m) = (((b >> 2) & 0x1f) as u32, (b & 3) as u32);
            match (e, m) {
                (31, 0) => signed(neg, f64::INFINITY),
                (31, _) => f64::NAN,
                _ => signed(neg, minifloat(e, m, 2, 15)),
            }
        }
        // "fnuz": no infinities, no negative zero; the pattern of -0 is the only NaN.
        DType::F8E4M3FNUZ if b == 0x80 => f64::NAN,
        DType::F8E4M3FNUZ => signed(
            neg,
            minifloat(((b >> 3) & 0xf) as u32, (b & 7) as u32, 3, 8),
        ),
        DType::F8E5M2FNUZ if b == 0x80 => f64::NAN,
        DType::F8E5M2FNUZ => signed(
            neg,
            minifloat(((b >> 2) & 0x1f) as u32, (b & 3) as u32, 2, 16),
        ),
        // e8m0: a bare unsigned exponent, 0xff is NaN.
        DType::F8E8M0FNU if b == 0xff => f64::NAN,
        DType::F8E8M0FNU => 2f64.powi(b as i32 - 127),
        DType::F4E2M1FNX2 => {
            let n = b & 0xf;
            signed(
                n & 8 != 0,
                minifloat(((n >> 1) & 3) as u32, (n & 1) as u32, 1, 1),
            )
        }
        _ => f64::NAN,
    }
}

fn byte_table(dt: DType) -> &'static [f64; 256] {
    static TABLES: OnceLock<Vec<[f64; 256]>> = OnceLock::new();
    const ONE_BYTE: [DType; 6] = [
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::F8E4M3FNUZ,
        DType::F8E5M2FNUZ,
        DType::F8E8M0FNU,
        DType::F4E2M1FNX2,
    ];
    let tables = TABLES.get_or_init(|| {
        ONE_BYTE
            .iter()
            .map(|&d| std::array::from_fn(|b| byte_value(d, b as u8)))
            .collect()
    });
    let i = ONE_BYTE
        .iter()
        .position(|&d| d == dt)
        .expect("a one-byte float");
    &tables[i]
}

/// IEEE binary16 to f64 (exact).
fn f16_value(h: u16) -> f64 {
    let neg = h & 0x8000 != 0;
    let (e, m) = (((h >> 10) & 0x1f) as u32, (h & 0x3ff) as u32);
    match (e, m) {
        (31, 0) => signed(neg, f64::INFINITY),
        (31, _) => f64::NAN,
        _ => signed(neg, minifloat(e, m, 10, 15)),
    }
}

fn f16_table() -> &'static [f32] {
    // 256 KiB, built once: a lookup beats the branches of a bit-level conversion.
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| (0..=u16::MAX).map(|h| f16_value(h) as f32).collect())
}

/// Call `f` with every element of `bytes` (little-endian `dt`) as f64.
#[inline]
fn for_each_value(dt: DType, bytes: &[u8], mut f: impl FnMut(f64)) {
    macro_rules! each {
        ($n:literal, $conv:expr) => {
            for c in bytes.chunks_exact($n) {
                let a: [u8; $n] = c.try_into().expect("exact chunk");
                f($conv(a));
            }
        };
    }
    match dt {
        DType::Bool => bytes.iter().for_each(|&b| f((b != 0) as u8 as f64)),
        DType::U8 => bytes.iter().for_each(|&b| f(b as f64)),
        DType::I8 => bytes.iter().for_each(|&b| f(b as i8 as f64)),
        DType::I16 => each!(2, |a| i16::from_le_bytes(a) as f64),
        DType::U16 => each!(2, |a| u16::from_le_bytes(a) as f64),
        DType::I32 => each!(4, |a| i32::from_le_bytes(a) as f64),
        DType::U32 => each!(4, |a| u32::from_le_bytes(a) as f64),
        DType::I64 => each!(8, |a| i64::from_le_bytes(a) as f64),
        DType::U64 => each!(8, |a| u64::from_le_bytes(a) as f64),
        DType::F32 => each!(4, |a| f32::from_le_bytes(a) as f64),
        DType::F64 => each!(8, f64::from_le_bytes),
        DType::BF16 => each!(2, |a| f32::from_bits((u16::from_le_bytes(a) as u32) << 16)
            as f64),
        DType::F16 => {
            let t = f16_table();
            each!(2, |a| t[u16::from_le_bytes(a) as usize] as f64)
        }
        DType::C64 => each!(8, |a: [u8; 8]| {
            let re = f32::from_le_bytes(a[..4].try_into().expect("4")) as f64;
            let im = f32::from_le_bytes(a[4..].try_into().expect("4")) as f64;
            re.hypot(im)
        }),
        DType::C128 => each!(16, |a: [u8; 16]| {
            let re = f64::from_le_bytes(a[..8].try_into().expect("8"));
            let im = f64::from_le_bytes(a[8..].try_into().expect("8"));
            re.hypot(im)
        }),
        DType::F4E2M1FNX2 => {
            let t = byte_table(dt);
            bytes.iter().for_each(|&b| {
                f(t[(b & 0xf) as usize]);
                f(t[(b >> 4) as usize]);
            })
        }
        DType::F8E4M3FN
        | DType::F8E5M2
        | DType::F8E4M3FNUZ
        | DType::F8E5M2FNUZ
        | DType::F8E8M0FNU => {
            let t = byte_table(dt);
            bytes.iter().for_each(|&b| f(t[b as usize]))
        }
    }
}

fn check_len(dt: DType, n: usize, what: &str) -> Result<()> {
    if !n.is_multiple_of(dt.itemsize()) {
        return Err(Error::InvalidArgument(format!(
            "{what}: {n} bytes is not a whole number of {} elements ({} bytes each)",
            dt.name(),
            dt.itemsize()
        )));
    }
    Ok(())
}

/// Statistics of one block: pass 1 counts, min/max and the sum; pass 2 the squared deviations.
fn block_stats(dt: DType, bytes: &[u8]) -> TensorStats {
    let mut s = TensorStats::default();
    let (mut sum, mut lo, mut hi) = (0.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for_each_value(dt, bytes, |x| {
        s.count += 1;
        if x.is_finite() {
            s.finite += 1;
            sum += x;
            lo = lo.min(x);
            hi = hi.max(x);
            s.zeros += (x == 0.0) as u64;
        } else if x.is_nan() {
            s.nan += 1;
        } else if x > 0.0 {
            s.pos_inf += 1;
        } else {
            s.neg_inf += 1;
        }
    });
    if s.finite == 0 {
        return s;
    }
    s.min = lo;
    s.max = hi;
    s.mean = sum / s.finite as f64;
    let mut m2 = 0.0f64;
    let mean = s.mean;
    for_each_value(dt, bytes, |x| {
        if x.is_finite() {
            m2 += (x - mean) * (x - mean);
        }
    });
    s.m2 = m2;
    s
}

/// Statistics of a buffer of little-endian `dt` values, on the calling thread.
pub fn stats_of(dt: DType, bytes: &[u8]) -> Result<TensorStats> {
    check_len(dt, bytes.len(), "stats")?;
    let step = BLOCK * dt.itemsize();
    Ok(bytes
        .chunks(step)
        .map(|b| block_stats(dt, b))
        .fold(TensorStats::default(), TensorStats::merge))
}

/// [`stats_of`] split over the rayon pool in pieces of ~1 MiB.
pub fn par_stats_of(dt: DType, bytes: &[u8]) -> Result<TensorStats> {
    check_len(dt, bytes.len(), "stats")?;
    crate::threads::install(|| {
        bytes
            .par_chunks(PIECE)
            .map(|p| stats_of(dt, p))
            .try_reduce(TensorStats::default, |a, b| Ok(a.merge(b)))
    })
}

/// Statistics of a stored tensor in one parallel pass: each chunk is decoded into a reused
/// per-thread buffer and folded at once (no copy of the whole value), and the decoded bytes
/// are checked against the entry's crc32c before anything is returned.
pub fn entry_stats(r: &crate::Reader, e: &crate::index::Entry<'_>) -> Result<TensorStats> {
    let dt = e.dtype;
    let parts = r.fold_pieces(e, |piece| stats_of(dt, piece))?;
    Ok(parts
        .into_iter()
        .fold(TensorStats::default(), TensorStats::merge))
}

// --- differences --------------------------------------------------------------------------------

/// How two tensors of one dtype and shape differ, element by element.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DiffStats {
    /// Elements compared.
    pub count: u64,
    /// Elements whose values differ (NaN facing NaN, or the same infinity, count as equal).
    pub changed: u64,
    /// Positions where the two sides differ in being NaN / infinite (a finite value became
    /// NaN or Inf, or the other way round): their difference is infinite.
    pub nonfinite_changed: u64,
    /// sum (a - b)^2 over positions finite on both sides.
    pub diff_sq: f64,
    /// sum a^2 over finite a (the reference norm of the relative change).
    pub a_sq: f64,
    /// Largest |a - b| over positions finite on both sides (0 when none).
    pub max_abs: f64,
}

impl DiffStats {
    fn merge(self, o: DiffStats) -> DiffStats {
        DiffStats {
            count: self.count + o.count,
            changed: self.changed + o.changed,
            nonfinite_changed: self.nonfinite_changed + o.nonfinite_changed,
            diff_sq: self.diff_sq + o.diff_sq,
            a_sq: self.a_sq + o.a_sq,
            max_abs: self.max_abs.max(o.max_abs),
        }
    }
}

fn diff_piece(dt: DType, a: &[u8], b: &[u8]) -> DiffStats {
    let mut va = Vec::with_capacity(BLOCK);
    let mut out = DiffStats::default();
    let step = BLOCK * dt.itemsize();
    for (pa, pb) in a.chunks(step).zip(b.chunks(step)) {
        va.clear();
        for_each_value(dt, pa, |x| va.push(x));
        let mut s = DiffStats::default();
        let mut i = 0usize;
        for_each_value(dt, pb, |y| {
            let x = va[i];
            i += 1;
            s.count += 1;
            if x.is_finite() {
                s.a_sq += x * x;
            }
            if x.is_finite() && y.is_finite() {
                let d = (x - y).abs();
                s.changed += (d != 0.0) as u64;
                s.diff_sq += d * d;
                s.max_abs = s.max_abs.max(d);
            } else if !(x == y || (x.is_nan() && y.is_nan())) {
                s.changed += 1;
                s.nonfinite_changed += 1;
            }
        });
        out = out.merge(s);
    }
    out
}

/// Element-wise differences of two buffers of little-endian `dt` values (same length), in
/// parallel pieces.
pub fn par_diff_of(dt: DType, a: &[u8], b: &[u8]) -> Result<DiffStats> {
    check_len(dt, a.len(), "diff")?;
    if a.len() != b.len() {
        return Err(Error::InvalidArgument(format!(
            "diff: buffers of {} and {} bytes",
            a.len(),
            b.len()
        )));
    }
    Ok(crate::threads::install(|| {
        a.par_chunks(PIECE)
            .zip(b.par_chunks(PIECE))
            .map(|(x, y)| diff_piece(dt, x, y))
            .reduce(DiffStats::default, DiffStats::merge)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn moments_and_specials() {
        let b = f32s(&[
            1.0,
            2.0,
            3.0,
            4.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
        ]);
        let s = stats_of(DType::F32, &b).unwrap();
        assert_eq!(
            (s.count, s.finite, s.nan, s.pos_inf, s.neg_inf, s.zeros),
            (8, 5, 1, 1, 1, 1)
        );
        assert_eq!((s.min, s.max), (0.0, 4.0));
        assert!((s.mean - 2.0).abs() < 1e-15);
        assert!((s.std() - 2f64.sqrt()).abs() < 1e-12);
        assert!((s.l2() - 30f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn merge_matches_one_pass_and_is_stable() {
        // A large offset: the naive sum-of-squares formula loses every digit of the variance.
        let v: Vec<f64> = (0..100_003).map(|i| 1e9 + (i % 7) as f64).collect();
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let s = par_stats_of(DType::F64, &b).unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
        assert!(
            (s.std() - var.sqrt()).abs() < 1e-6,
            "{} vs {}",
            s.std(),
            var.sqrt()
        );
        assert_eq!(s.count, 100_003);
    }

    #[test]
    fn minifloats() {
        assert_eq!(byte_value(DType::F8E4M3FN, 0x7e), 448.0);
        assert!(byte_value(DType::F8E4M3FN, 0x7f).is_nan());
        assert_eq!(byte_value(DType::F8E5M2, 0x7c), f64::INFINITY);
        assert_eq!(byte_value(DType::F8E5M2, 0x7b), 57344.0);
        assert!(byte_value(DType::F8E4M3FNUZ, 0x80).is_nan());
        assert_eq!(byte_value(DType::F8E8M0FNU, 127), 1.0);
        assert_eq!(byte_value(DType::F4E2M1FNX2, 0x7), 6.0);
        assert_eq!(f16_value(0x3c00), 1.0);
        assert_eq!(f16_value(0x0001), 2f64.powi(-24));
    }

    #[test]
    fn diffs() {
        let a = f32s(&[1.0, 2.0, f32::NAN, 4.0]);
        let b = f32s(&[1.0, 2.5, f32::NAN, f32::INFINITY]);
        let d = par_diff_of(DType::F32, &a, &b).unwrap();
        assert_eq!((d.count, d.changed, d.nonfinite_changed), (4, 2, 1));
        assert_eq!(d.max_abs, 0.5);
        assert_eq!(d.a_sq, 21.0);
        assert!(par_diff_of(DType::F32, &a, &b[..4]).is_err());
        assert!(stats_of(DType::F32, &a[..3]).is_err());
    }
}
