//! Saving: the one-call parallel `save`, the streaming `Writer`, `merge` and `remove`.
//!
//! Options are keyword-only: a call reads as what it sets, never as ten positional values.

use crate::buffers::bytes_of;
use crate::remote::{location, Opts};
use crate::{invalid, nogil, nogil_cancellable, parse_codec, parse_digest, to_py};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shardpoint_core::format::{DType, Kind};
use shardpoint_core::{CheckpointWriter, Item, WriterOptions};

/// (key, dtype, kind, shape, buffer) tuples from Python → owned parts plus pinned buffers.
pub(crate) type RawItem = (String, String, String, Vec<u64>, PyBuffer<u8>);

/// `xor_bases[i]`, where given, makes item `i` an XOR item (its value XOR that buffer is
/// stored: a delta payload, FORMAT.md §11).
pub(crate) fn to_items<'a>(
    py: Python<'_>,
    raw: &'a [RawItem],
    xor_bases: Option<&'a [Option<PyBuffer<u8>>]>,
) -> PyResult<Vec<Item<'a>>> {
    if xor_bases.is_some_and(|x| x.len() != raw.len()) {
        return Err(invalid(py, "xor_bases must have one entry per item"));
    }
    raw.iter()
        .enumerate()
        .map(|(i, (k, d, kind, shape, buf))| {
            let xor_base = match xor_bases.and_then(|x| x[i].as_ref()) {
                Some(b) => Some(bytes_of(py, b)?),
                None => None,
            };
            Ok(Item {
                key: k.clone(),
                dtype: DType::from_name(d).map_err(|e| to_py(py, e))?,
                kind: Kind::from_name(kind).map_err(|e| to_py(py, e))?,
                dims: shape.clone(),
                data: bytes_of(py, buf)?,
                xor_base,
            })
        })
        .collect()
}

/// Save items in one call, `shards` threads writing in parallel with the GIL released.
/// `progress(nbytes)` (optional) is called after each item is written; it does not change
/// what is written (one algorithm with or without a progress bar). `single_file`: write one
/// file at `prefix` (FORMAT.md §10; `shards` is ignored). Ctrl-C stops the save (nothing is
/// committed) and raises `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (prefix, items, *, codec, level, chunk_bytes, shards, durable, metadata_json, sections_json=String::new(), storage_options=None, progress=None, digest=None, single_file=false, xor_bases=None, hashed_prefixes=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn save(
    py: Python<'_>,
    prefix: &str,
    items: Vec<RawItem>,
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    shards: u32,
    durable: bool,
    metadata_json: String,
    sections_json: String,
    storage_options: Opts,
    progress: Option<Py<PyAny>>,
    digest: Option<String>,
    single_file: bool,
    xor_bases: Option<Vec<Option<PyBuffer<u8>>>>,
    hashed_prefixes: bool,
) -> PyResult<()> {
    let loc = location(py, prefix, &storage_options)?;
    if single_file && !matches!(loc, shardpoint_core::Location::Local(_)) {
        return Err(invalid(
            py,
            format!("{prefix}: single-file checkpoints are written to local paths only"),
        ));
    }
    let opts = WriterOptions {
        digest: parse_digest(py, digest.as_deref())?,
        codec: parse_codec(py, codec)?,
        level,
        chunk_bytes,
        shards,
        durable,
        metadata_json,
        sections_json,
        hashed_prefixes,
        ..WriterOptions::default()
    };
    let its = to_items(py, &items, xor_bases.as_deref())?;
    let report = |n: u64| {
        if let Some(cb) = &progress {
            // From a writer thread: take the GIL for the call only. A failing callback cannot
            // stop a save half-way; its error is reported like any other unraisable one.
            Python::attach(|py| {
                if let Err(e) = cb.call1(py, (n,)) {
                    e.write_unraisable(py, Some(cb.bind(py)));
                }
            });
        }
    };
    nogil_cancellable(py, || match &loc {
        shardpoint_core::Location::Local(p) if single_file => {
            shardpoint_core::save_single(p, &its, &opts, &report)
        }
        _ => shardpoint_core::save_at_with_progress(&loc, &its, opts, &report),
    })
}

/// Whether `path` is a single-file checkpoint (by its magic bytes, FORMAT.md §10).
#[pyfunction]
pub(crate) fn is_single_file(py: Python<'_>, path: std::path::PathBuf) -> bool {
    py.detach(|| shardpoint_core::reader::is_single_file(&path))
}

/// Merge the partial indexes of a multi-writer save and commit `P.index`; with
/// `wait_cleanup=False`, a local prefix's replaced files are removed in the background.
/// `hashed_prefixes`: the writers saved with it, so their partial indexes are at
/// `P/HH/index.part-…` (FORMAT.md §3.1.1).
#[pyfunction]
#[pyo3(signature = (prefix, world_size, *, durable=true, token=None, storage_options=None, wait_cleanup=true, hashed_prefixes=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn merge(
    py: Python<'_>,
    prefix: &str,
    world_size: u32,
    durable: bool,
    token: Option<String>,
    storage_options: Opts,
    wait_cleanup: bool,
    hashed_prefixes: bool,
) -> PyResult<()> {
    let loc = location(py, prefix, &storage_options)?;
    nogil_cancellable(py, || {
        shardpoint_core::merge_at_in(
            &loc,
            world_size,
            durable,
            token.as_deref(),
            !wait_cleanup,
            hashed_prefixes,
        )
    })
}

/// [`merge`] from the partial indexes' bytes (`partials[r]`: rank `r`'s, as its writer's
/// `commit_partial` returned them; `world_size = len(partials)`) instead of reading them back:
/// the same validation, commit and cleanup. The bytes objects are read in place (no copy).
#[pyfunction]
#[pyo3(signature = (prefix, partials, *, durable=true, token=None, storage_options=None, wait_cleanup=true, hashed_prefixes=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn merge_in_memory(
    py: Python<'_>,
    prefix: &str,
    partials: Vec<Bound<'_, PyBytes>>,
    durable: bool,
    token: Option<String>,
    storage_options: Opts,
    wait_cleanup: bool,
    hashed_prefixes: bool,
) -> PyResult<()> {
    let loc = location(py, prefix, &storage_options)?;
    // borrowed from the (immutable) bytes objects, which `partials` keeps alive
    let parts: Vec<&[u8]> = partials.iter().map(|b| b.as_bytes()).collect();
    nogil_cancellable(py, || {
        shardpoint_core::merge_in_memory(
            &loc,
            &parts,
            durable,
            token.as_deref(),
            !wait_cleanup,
            hashed_prefixes,
        )
    })
}

/// Wait for every background cleanup this process started (`merge(wait_cleanup=False)`).
#[pyfunction]
pub(crate) fn wait_for_cleanups(py: Python<'_>) {
    py.detach(shardpoint_core::background_cleanup::wait_all)
}

/// (merges made in the order remembered from the last merge at their prefix, remembered
/// orders that no longer fit and fell back to the heap) in this process (tests, benchmarks).
#[pyfunction]
pub(crate) fn merge_order_stats() -> (u64, u64) {
    shardpoint_core::merge_order_stats()
}

/// Forget every remembered merge order: the next merge at each prefix uses the heap.
#[pyfunction]
pub(crate) fn forget_merge_orders() {
    shardpoint_core::forget_merge_orders()
}

/// How many background cleanups of this process are still running.
#[pyfunction]
pub(crate) fn pending_cleanups() -> usize {
    shardpoint_core::background_cleanup::pending()
}

/// Delete checkpoint `prefix` (index first).
#[pyfunction]
#[pyo3(signature = (prefix, storage_options=None))]
pub(crate) fn remove(py: Python<'_>, prefix: &str, storage_options: Opts) -> PyResult<()> {
    match location(py, prefix, &storage_options)? {
        shardpoint_core::Location::Local(p) => nogil(py, || shardpoint_core::commit::remove(&p)),
        shardpoint_core::Location::Remote(rp) => {
            nogil(py, || shardpoint_core::store::remote_commit::remove(&rp))
        }
    }
}

/// Streaming writer; `add` may be called from several Python threads at once.
#[pyclass(module = "shardpoint._core", frozen)]
pub(crate) struct Writer {
    inner: CheckpointWriter,
}

#[pymethods]
impl Writer {
    #[new]
    #[pyo3(signature = (prefix, *, codec, level, chunk_bytes, shards, durable, rank, world_size, metadata_json, merge_token=String::new(), sections_json=String::new(), storage_options=None, digest=None, hashed_prefixes=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        prefix: &str,
        codec: &str,
        level: i32,
        chunk_bytes: u32,
        shards: u32,
        durable: bool,
        rank: u32,
        world_size: u32,
        metadata_json: String,
        merge_token: String,
        sections_json: String,
        storage_options: Opts,
        digest: Option<String>,
        hashed_prefixes: bool,
    ) -> PyResult<Self> {
        let loc = location(py, prefix, &storage_options)?;
        let opts = WriterOptions {
            codec: parse_codec(py, codec)?,
            level,
            chunk_bytes,
            shards,
            durable,
            rank,
            world_size,
            metadata_json,
            merge_token,
            sections_json,
            digest: parse_digest(py, digest.as_deref())?,
            hashed_prefixes,
        };
        let inner = nogil(py, || CheckpointWriter::new_at(&loc, opts))?;
        Ok(Writer { inner })
    }

    /// Write one value now (`xor_base`: store the value XOR this buffer, a delta payload).
    #[pyo3(signature = (key, dtype, kind, shape, data, xor_base=None))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        py: Python<'_>,
        key: String,
        dtype: String,
        kind: String,
        shape: Vec<u64>,
        data: PyBuffer<u8>,
        xor_base: Option<PyBuffer<u8>>,
    ) -> PyResult<()> {
        let raw = [(key, dtype, kind, shape, data)];
        let bases = [xor_base];
        let its = to_items(py, &raw, Some(&bases))?;
        nogil_cancellable(py, || self.inner.add(&its[0]))
    }

    /// Finish: commit `P.index` (one writer) or publish the partial index (several).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        nogil_cancellable(py, || self.inner.commit())
    }

    /// [`commit`](Self::commit), returning the bytes of the partial index it published
    /// (several writers; `None` for one), for a merge from memory (`merge_in_memory`).
    fn commit_partial<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let got = nogil_cancellable(py, || self.inner.commit_partial())?;
        Ok(got.map(|b| PyBytes::new(py, &b)))
    }

    /// Stop `add`s running on other threads at their next chunk (no lock taken); `abort`
    /// next.
    fn cancel(&self) {
        self.inner.cancel()
    }

    /// Discard everything written.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| self.inner.abort())
    }
}
