//! crc32c for Python callers that verify foreign formats (TensorBundle tables, tensors).

use crate::buffers::bytes_of;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// CRC-32C of a bytes-like object, continuing `crc` (0 to start), GIL released.
#[pyfunction]
#[pyo3(signature = (data, crc=0))]
pub(crate) fn crc32c(py: Python<'_>, data: PyBuffer<u8>, crc: u32) -> PyResult<u32> {
    let bytes = bytes_of(py, &data)?;
    Ok(py.detach(|| ::crc32c::crc32c_append(crc, bytes)))
}

/// Strong digest (`"sha256"` or `"blake3"`) of a bytes-like object as lowercase hex, GIL
/// released: the hasher the writer runs over shard bytes (benches, tests).
#[pyfunction]
pub(crate) fn digest_bytes(
    py: Python<'_>,
    algorithm: &str,
    data: PyBuffer<u8>,
) -> PyResult<String> {
    let algo = crate::parse_digest(py, Some(algorithm))?
        .ok_or_else(|| crate::invalid(py, "digest algorithm must not be empty"))?;
    let bytes = bytes_of(py, &data)?;
    Ok(py.detach(|| shardpoint_core::digest::digest_bytes(algo, bytes)))
}
