//! Plain files' byte ranges read into caller-owned buffers: the bulk-load engine a Hugging
//! Face directory read in place uses (`read_file_ranges`), and its `O_DIRECT` variant.

use crate::buffers::bytes_of_mut;
use crate::nogil_cancellable;
use crate::outs::check_disjoint;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Read byte ranges of plain files into caller-owned writable buffers with the bulk-load
/// engine (read-ahead, parallel ordered preads, GIL released): `ranges[i] = (index into
/// paths, offset)`, `outs[i]` receives exactly its length. Ranges past a file's end raise
/// `CorruptCheckpointError` naming the file; buffers must not overlap. `threads`: read on a
/// pool of that many threads (default: one per CPU).
#[pyfunction]
#[pyo3(signature = (paths, ranges, outs, threads=None))]
pub(crate) fn read_file_ranges(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    ranges: Vec<(usize, u64)>,
    mut outs: Vec<PyBuffer<u8>>,
    threads: Option<usize>,
) -> PyResult<()> {
    let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(outs.len());
    for b in outs.iter_mut() {
        dsts.push(bytes_of_mut(py, b)?);
    }
    check_disjoint(py, &dsts, "ranges", |i| i.to_string())?;
    let work = crate::pools::on_threads(py, threads, || {
        shardpoint_core::load::read_files_into(&paths, &ranges, dsts)
    })?;
    nogil_cancellable(py, work)
}

/// `read_file_ranges` for cold files: pieces not in the page cache are read with `O_DIRECT`,
/// `depth` reads in flight, in place where a destination's address is congruent to its file
/// offset modulo 4096 and through a bounce buffer otherwise; cached pieces with `pread`
/// (`shardpoint_core::direct`); with `follow_cache=False` cached pieces too are read with
/// `O_DIRECT` (a load judged cold). Returns the bytes read in place, bounced, and from the
/// page cache.
#[pyfunction]
#[pyo3(signature = (paths, ranges, outs, depth=None, follow_cache=true))]
pub(crate) fn read_file_ranges_direct(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    ranges: Vec<(usize, u64)>,
    mut outs: Vec<PyBuffer<u8>>,
    depth: Option<usize>,
    follow_cache: bool,
) -> PyResult<(u64, u64, u64)> {
    let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(outs.len());
    for b in outs.iter_mut() {
        dsts.push(bytes_of_mut(py, b)?);
    }
    check_disjoint(py, &dsts, "ranges", |i| i.to_string())?;
    let depth = depth.unwrap_or(shardpoint_core::direct::DIRECT_DEPTH);
    let s = nogil_cancellable(py, || {
        shardpoint_core::direct::read_files_direct_with(&paths, &ranges, dsts, depth, follow_cache)
    })?;
    Ok((s.in_place, s.bounced, s.buffered))
}
