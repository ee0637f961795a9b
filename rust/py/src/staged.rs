//! Asynchronous and incremental saves: parallel staging copies and the incremental save.

use crate::buffers::bytes_of;
use crate::nogil;
use crate::write::{options, to_items, RawItem};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Copy every `srcs[i]` into the writable buffer `dsts[i]` (same lengths) in parallel with the
/// GIL released; with `with_crc`, return each item's crc32c (else an empty list).
#[pyfunction]
#[pyo3(signature = (srcs, dsts, with_crc))]
pub(crate) fn stage_copy(
    py: Python<'_>,
    srcs: Vec<PyBuffer<u8>>,
    dsts: Vec<PyBuffer<u8>>,
    with_crc: bool,
) -> PyResult<Vec<u32>> {
    let src: Vec<&[u8]> = srcs.iter().map(bytes_of).collect::<PyResult<_>>()?;
    let mut dst: Vec<&mut [u8]> = Vec::with_capacity(dsts.len());
    for (i, d) in dsts.iter().enumerate() {
        if d.readonly() || !d.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "staging destination {i} is not a writable C-contiguous buffer"
            )));
        }
        // SAFETY: the PyBuffer pins the exporter's memory while `dsts` lives (to the end of
        // this call); the destinations are distinct staging buffers the caller owns, and the
        // writable flag was checked above.
        dst.push(unsafe { std::slice::from_raw_parts_mut(d.buf_ptr() as *mut u8, d.len_bytes()) });
    }
    let addrs: Vec<(usize, usize)> = dst.iter().map(|d| (d.as_ptr() as usize, d.len())).collect();
    if overlapping(addrs) {
        return Err(PyValueError::new_err("staging destinations overlap"));
    }
    nogil(py, || {
        shardpoint_core::staging::copy_with_crc(&src, &mut dst, with_crc)
    })
}

/// Whether any two non-empty (address, length) ranges overlap.
fn overlapping(mut r: Vec<(usize, usize)>) -> bool {
    r.retain(|&(_, n)| n > 0);
    r.sort_unstable();
    r.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
}

/// Save `items` at `prefix`, hard-linking the shards of checkpoint `base` whose values are all
/// unchanged (FORMAT.md §8.1). Returns (linked_shards, linked_bytes, written_shards,
/// written_bytes, base_problem).
#[pyfunction]
#[pyo3(signature = (prefix, items, crcs, base, codec, level, chunk_bytes, solo_bytes, durable, metadata_json, sections_json=String::new()))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn save_incremental(
    py: Python<'_>,
    prefix: PathBuf,
    items: Vec<RawItem>,
    crcs: Option<Vec<u32>>,
    base: Option<PathBuf>,
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    solo_bytes: u64,
    durable: bool,
    metadata_json: String,
    sections_json: String,
) -> PyResult<(u32, u64, u32, u64, Option<String>)> {
    let opts = options(
        codec,
        level,
        chunk_bytes,
        1,
        durable,
        0,
        1,
        metadata_json,
        String::new(),
        sections_json,
    )?;
    let its = to_items(&items)?;
    let r = nogil(py, || {
        shardpoint_core::save_incremental(
            &prefix,
            &its,
            crcs.as_deref(),
            base.as_deref(),
            solo_bytes,
            opts,
        )
    })?;
    Ok((
        r.linked_shards,
        r.linked_bytes,
        r.written_shards,
        r.written_bytes,
        r.base_problem,
    ))
}
