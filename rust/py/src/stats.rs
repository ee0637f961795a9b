//! Numerical health for Python: statistics and value differences of tensors, computed by
//! `shardpoint_core::stats` with the GIL released (in place over the stored chunks for
//! checkpoint entries; over a caller's buffer for values read from other formats).

use crate::buffers::bytes_of;
use crate::to_py;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use shardpoint_core::stats::{par_diff_of, par_stats_of, DiffStats, TensorStats};
use shardpoint_core::DType;

/// (count, finite, nan, pos_inf, neg_inf, zeros, min, max, mean, std, l2)
pub(crate) type StatsTuple = (u64, u64, u64, u64, u64, u64, f64, f64, f64, f64, f64);

pub(crate) fn stats_tuple(s: &TensorStats) -> StatsTuple {
    (
        s.count,
        s.finite,
        s.nan,
        s.pos_inf,
        s.neg_inf,
        s.zeros,
        s.min,
        s.max,
        s.mean,
        s.std(),
        s.l2(),
    )
}

fn dtype(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name).map_err(|e| to_py(py, e))
}

/// Statistics of a C-contiguous buffer of little-endian `dtype` values (a format dtype name),
/// in parallel with the GIL released. Returns the tuple described by [`StatsTuple`].
#[pyfunction]
pub(crate) fn stats_buffer(
    py: Python<'_>,
    data: PyBuffer<u8>,
    dtype: &str,
) -> PyResult<StatsTuple> {
    let dt = self::dtype(py, dtype)?;
    let bytes = bytes_of(py, &data)?;
    let s = crate::nogil(py, || par_stats_of(dt, bytes))?;
    Ok(stats_tuple(&s))
}

/// Element-wise differences of two equally long buffers of `dtype` values, GIL released:
/// (count, changed, nonfinite_changed, sum (a-b)^2, sum a^2, max |a-b|), the last three over
/// positions finite on both sides (sum a^2 over finite a).
#[pyfunction]
pub(crate) fn diff_buffers(
    py: Python<'_>,
    a: PyBuffer<u8>,
    b: PyBuffer<u8>,
    dtype: &str,
) -> PyResult<(u64, u64, u64, f64, f64, f64)> {
    let dt = self::dtype(py, dtype)?;
    let (x, y) = (bytes_of(py, &a)?, bytes_of(py, &b)?);
    let d: DiffStats = crate::nogil(py, || par_diff_of(dt, x, y))?;
    Ok((
        d.count,
        d.changed,
        d.nonfinite_changed,
        d.diff_sq,
        d.a_sq,
        d.max_abs,
    ))
}
