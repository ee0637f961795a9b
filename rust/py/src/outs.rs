//! Checks of the output buffers a call writes into: none may overlap another (two threads
//! writing them would race), and a ranged read's arguments come as many as its keys.

use crate::buffers::bytes_of_mut;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use shardpoint_core::index::Entry;

/// Writing two overlapping output buffers from two threads would be a data race: refuse.
pub(crate) fn refuse_overlaps(py: Python<'_>, keys: &[String], dsts: &[&mut [u8]]) -> PyResult<()> {
    check_disjoint(py, dsts, "keys", |i| format!("{:?}", keys[i]))
}

/// Refuse buffers that overlap: writing them from two threads would be a data race.
/// `name(i)` names buffer `i` (one of the `what`) in the error.
pub(crate) fn check_disjoint(
    py: Python<'_>,
    dsts: &[&mut [u8]],
    what: &str,
    name: impl Fn(usize) -> String,
) -> PyResult<()> {
    let mut spans: Vec<(usize, usize, usize)> = dsts
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.is_empty())
        .map(|(i, d)| (d.as_ptr() as usize, d.as_ptr() as usize + d.len(), i))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(crate::invalid(
                py,
                format!(
                    "output buffers of {what} {} and {} overlap",
                    name(w[0].2),
                    name(w[1].2)
                ),
            ));
        }
    }
    Ok(())
}

/// Entries, each with a raw byte range `[lo, hi)` of it.
pub(crate) type Ranges<'a> = Vec<(Entry<'a>, u64, u64)>;

/// The arguments of a `read_ranges_into`: entries with their ranges, and the output buffers
/// (checked to be as many as the keys, and not overlapping).
pub(crate) fn range_args<'a, 'b>(
    py: Python<'_>,
    keys: &[String],
    los: &[u64],
    his: &[u64],
    outs: &'b mut [PyBuffer<u8>],
    entry: impl Fn(&str) -> PyResult<Entry<'a>>,
) -> PyResult<(Ranges<'a>, Vec<&'b mut [u8]>)> {
    if keys.len() != los.len() || keys.len() != his.len() || keys.len() != outs.len() {
        return Err(crate::invalid(
            py,
            format!(
                "{} keys, {} starts, {} ends and {} output buffers",
                keys.len(),
                los.len(),
                his.len(),
                outs.len()
            ),
        ));
    }
    let mut entries = Vec::with_capacity(keys.len());
    for ((k, lo), hi) in keys.iter().zip(los).zip(his) {
        entries.push((entry(k)?, *lo, *hi));
    }
    let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(outs.len());
    for b in outs.iter_mut() {
        dsts.push(bytes_of_mut(py, b)?);
    }
    refuse_overlaps(py, keys, &dsts)?;
    Ok((entries, dsts))
}
