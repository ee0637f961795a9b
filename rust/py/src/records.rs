//! What a reader hands out about entries: their index records (one, or many at once as
//! tuples) and their values.

use crate::buffers::{Buffer, Store};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};
use shardpoint_core::index::Entry;

/// What the index records about one entry (`Reader.info`; `shardpoint.files.EntryInfo` adds
/// the key and keeps the public field names).
#[pyclass(module = "shardpoint._core", frozen, get_all)]
pub(crate) struct EntryRecord {
    /// Format dtype name (`float32`, `bfloat16`, ...).
    dtype: &'static str,
    shape: Vec<u64>,
    /// Value kind: `tensor`, `bytes`, `str`, `int`, `float`, `json`.
    kind: &'static str,
    codec: &'static str,
    /// Bytes stored in the shard, and bytes once decoded.
    stored_len: u64,
    raw_len: u64,
    shard: u32,
    offset: u64,
    /// crc32c of the raw (decoded) bytes.
    crc32c: u32,
    nchunks: u64,
    /// Crc blocks of an uncompressed value (FORMAT.md §3.4; 0: one crc for the whole value).
    crc_blocks: u64,
}

impl EntryRecord {
    pub(crate) fn of(e: &Entry<'_>) -> Self {
        EntryRecord {
            dtype: e.dtype.name(),
            shape: e.dims.to_vec(),
            kind: e.kind.name(),
            codec: e.codec.name(),
            stored_len: e.stored_len,
            raw_len: e.raw_len,
            shard: e.shard,
            offset: e.offset,
            crc32c: e.crc,
            nchunks: e.nchunks() as u64,
            crc_blocks: e.nblocks() as u64,
        }
    }
}

/// One value read from a checkpoint: how to interpret it, and its bytes.
#[pyclass(module = "shardpoint._core", frozen, get_all)]
pub(crate) struct EntryValue {
    dtype: &'static str,
    shape: Vec<u64>,
    kind: &'static str,
    /// The bytes (zero-copy from the shard mapping when stored uncompressed and not copied).
    buffer: Py<Buffer>,
}

impl EntryValue {
    pub(crate) fn new(py: Python<'_>, e: &Entry<'_>, store: Store) -> PyResult<Self> {
        Ok(EntryValue {
            dtype: e.dtype.name(),
            shape: e.dims.to_vec(),
            kind: e.kind.name(),
            buffer: Py::new(py, Buffer { store })?,
        })
    }
}

/// The records of `keys` as tuples in `EntryInfo`'s field order (key, dtype, shape, kind,
/// codec, stored bytes, raw bytes, shard, offset, crc32c, chunks, crc blocks); `entry` looks
/// one key up (a missing key raises as `info` does, naming it). Each tuple holds the caller's
/// own key object, and the names (dtype, kind, codec) are interned: nothing is made per key
/// that the caller already has.
pub(crate) fn info_tuples<'py, 'r>(
    py: Python<'py>,
    keys: &Bound<'py, PyList>,
    entry: impl Fn(&str) -> PyResult<Entry<'r>>,
) -> PyResult<Bound<'py, PyList>> {
    // the few distinct names of a checkpoint, each made once (by address: they are statics)
    let mut names: Vec<(&'static str, Bound<'py, PyString>)> = Vec::new();
    let mut name = |s: &'static str| -> Bound<'py, PyString> {
        if let Some((_, o)) = names.iter().find(|(n, _)| std::ptr::eq(*n, s)) {
            return o.clone();
        }
        let o = PyString::new(py, s);
        names.push((s, o.clone()));
        o
    };
    let out = PyList::empty(py);
    for key in keys.iter() {
        let e = entry(key.cast::<PyString>()?.to_str()?)?;
        let row = (
            &key,
            name(e.dtype.name()),
            PyTuple::new(py, e.dims.iter())?,
            name(e.kind.name()),
            name(e.codec.name()),
            e.stored_len,
            e.raw_len,
            e.shard,
            e.offset,
            e.crc,
            e.nchunks() as u64,
            e.nblocks() as u64,
        );
        out.append(row.into_pyobject(py)?)?;
    }
    Ok(out)
}
