//! Delta kernels for `shardpoint.delta` (FORMAT.md §11): the statistics pass of a delta save
//! or weight-sync encode, crcs of many values, the in-memory single file a sync delta is sent
//! as, and the XOR of stored payloads into a receiver's values. All run with the GIL released
//! on the core's pool (`RAYON_NUM_THREADS` sets its size).

use crate::buffers::{bytes_of, bytes_of_mut};
use crate::read::{refuse_overlaps, CheckpointReader};
use crate::write::{to_items, RawItem};
use crate::{invalid, nogil, nogil_cancellable, parse_codec};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shardpoint_core::delta::{crc_many, stored_sizes, xor_stats_many, XorPair};
use shardpoint_core::WriterOptions;

/// Per pair: `(changed, planes, nonzero_new, crc_new, crc_base)`.
type StatsTuple = (u64, Vec<u64>, u64, u32, u32);

/// Statistics of `news[i] ^ bases[i]` read as little-endian words of `widths[i]` bytes (1, 2,
/// 4 or 8): changed words, per byte plane (least significant first) the words that changed
/// at that byte or above, nonzero words of the new value, and the crc32c of both values. The
/// XOR is written to `outs[i]` where given (a writable buffer of the same length).
#[pyfunction]
#[pyo3(signature = (news, bases, widths, outs=None))]
pub(crate) fn xor_stats(
    py: Python<'_>,
    news: Vec<PyBuffer<u8>>,
    bases: Vec<PyBuffer<u8>>,
    widths: Vec<usize>,
    outs: Option<Vec<Option<PyBuffer<u8>>>>,
) -> PyResult<Vec<StatsTuple>> {
    let n = news.len();
    let mut outs = outs.unwrap_or_else(|| (0..n).map(|_| None).collect());
    if bases.len() != n || widths.len() != n || outs.len() != n {
        return Err(invalid(py, "news, bases, widths and outs differ in length"));
    }
    let mut pairs = Vec::with_capacity(n);
    for (((a, b), &w), o) in news.iter().zip(&bases).zip(&widths).zip(outs.iter_mut()) {
        pairs.push(XorPair {
            new: bytes_of(py, a)?,
            base: bytes_of(py, b)?,
            width: w,
            out: match o {
                Some(o) => Some(bytes_of_mut(py, o)?),
                None => None,
            },
        });
    }
    let stats = nogil(py, || xor_stats_many(pairs))?;
    Ok(stats
        .iter()
        .zip(&widths)
        .map(|(s, &w)| {
            let c = &s.counts;
            (
                c.changed,
                c.planes[..w.min(8)].to_vec(),
                c.nonzero_new,
                s.crc_new,
                s.crc_base,
            )
        })
        .collect())
}

/// crc32c of each buffer, in parallel.
#[pyfunction]
pub(crate) fn crc32c_many(py: Python<'_>, bufs: Vec<PyBuffer<u8>>) -> PyResult<Vec<u32>> {
    let slices: Vec<&[u8]> = bufs
        .iter()
        .map(|b| bytes_of(py, b))
        .collect::<PyResult<_>>()?;
    nogil(py, || crc_many(&slices))
}

/// The bytes of a single-file checkpoint (FORMAT.md §10) of `items`, built in memory; item
/// `i` is stored as its value XOR `xor_bases[i]` where that is given (a delta payload).
#[pyfunction]
#[pyo3(signature = (items, *, codec, level, chunk_bytes, metadata_json, sections_json=String::new(), xor_bases=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_single<'py>(
    py: Python<'py>,
    items: Vec<RawItem>,
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    metadata_json: String,
    sections_json: String,
    xor_bases: Option<Vec<Option<PyBuffer<u8>>>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let opts = WriterOptions {
        codec: parse_codec(py, codec)?,
        level,
        chunk_bytes,
        metadata_json,
        sections_json,
        ..WriterOptions::default()
    };
    let its = to_items(py, &items, xor_bases.as_deref())?;
    let bytes = nogil_cancellable(py, || shardpoint_core::encode_single(&its, &opts))?;
    Ok(PyBytes::new(py, &bytes))
}

/// Stored bytes of each item under `codec`/`level`/`chunk_bytes` (item `i` as its value XOR
/// `xor_bases[i]` where given), encoded in memory and not kept: the real encoder's sizes for
/// a delta's choice near break-even, without writing a checkpoint.
#[pyfunction]
#[pyo3(signature = (items, *, codec, level, chunk_bytes, xor_bases=None))]
pub(crate) fn encoded_sizes(
    py: Python<'_>,
    items: Vec<RawItem>,
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    xor_bases: Option<Vec<Option<PyBuffer<u8>>>>,
) -> PyResult<Vec<u64>> {
    let opts = WriterOptions {
        codec: parse_codec(py, codec)?,
        level,
        chunk_bytes,
        ..WriterOptions::default()
    };
    let its = to_items(py, &items, xor_bases.as_deref())?;
    nogil_cancellable(py, || stored_sizes(&its, &opts))
}

/// XOR the raw bytes of `reader`'s entries `keys` into `outs` (writable buffers of each
/// entry's raw length, not overlapping), in place; returns each buffer's crc32c afterwards.
#[pyfunction]
pub(crate) fn xor_into(
    py: Python<'_>,
    reader: &CheckpointReader,
    keys: Vec<String>,
    mut outs: Vec<PyBuffer<u8>>,
) -> PyResult<Vec<u32>> {
    if keys.len() != outs.len() {
        return Err(invalid(
            py,
            format!("{} keys but {} output buffers", keys.len(), outs.len()),
        ));
    }
    let entries = keys
        .iter()
        .map(|k| reader.entry(py, k))
        .collect::<PyResult<Vec<_>>>()?;
    let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(outs.len());
    for b in outs.iter_mut() {
        dsts.push(bytes_of_mut(py, b)?);
    }
    refuse_overlaps(py, &keys, &dsts)?;
    let r = &reader.inner;
    nogil_cancellable(py, || r.xor_into_many(&entries, dsts))
}
