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
