//! Asynchronous and incremental saves: parallel staging copies and the incremental save.

use crate::buffers::{bytes_of, bytes_of_mut};
use crate::write::{to_items, RawItem};
use crate::{invalid, nogil, nogil_cancellable, parse_codec};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use shardpoint_core::WriterOptions;
use std::path::PathBuf;

/// Copy every `srcs[i]` into the writable buffer `dsts[i]` (same lengths) in parallel with the
/// GIL released; with `with_crc`, return each item's crc32c (else an empty list).
#[pyfunction]
#[pyo3(signature = (srcs, dsts, with_crc))]
pub(crate) fn stage_copy(
    py: Python<'_>,
    srcs: Vec<PyBuffer<u8>>,
    mut dsts: Vec<PyBuffer<u8>>,
    with_crc: bool,
) -> PyResult<Vec<u32>> {
    let src: Vec<&[u8]> = srcs
        .iter()
        .map(|b| bytes_of(py, b))
        .collect::<PyResult<_>>()?;
    let mut dst: Vec<&mut [u8]> = Vec::with_capacity(dsts.len());
    for (i, d) in dsts.iter_mut().enumerate() {
        // Distinct PyBuffer objects may still export the same memory: checked just below.
        dst.push(bytes_of_mut(py, d).map_err(|_| {
            invalid(
                py,
                format!("staging destination {i} is not a writable C-contiguous buffer"),
            )
        })?);
    }
    let addrs: Vec<(usize, usize)> = dst.iter().map(|d| (d.as_ptr() as usize, d.len())).collect();
    if overlapping(addrs) {
        return Err(invalid(py, "staging destinations overlap"));
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
#[pyo3(signature = (prefix, items, *, crcs, base, codec, level, chunk_bytes, solo_bytes, durable, metadata_json, sections_json=String::new(), digest=None, hashed_prefixes=false))]
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
    digest: Option<String>,
    hashed_prefixes: bool,
) -> PyResult<(u32, u64, u32, u64, Option<String>)> {
    let opts = WriterOptions {
        digest: crate::parse_digest(py, digest.as_deref())?,
        codec: parse_codec(py, codec)?,
        level,
        chunk_bytes,
        shards: 1,
        durable,
        metadata_json,
        sections_json,
        hashed_prefixes,
        ..WriterOptions::default()
    };
    let its = to_items(py, &items, None)?;
    let r = nogil_cancellable(py, || {
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
