//! The safetensors header fast path (`shardpoint_core::st_header`) for the Hugging Face reader.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A safetensors header (`blob`: the JSON after the 8-byte length; `data_len`: bytes of the
/// file's data area), when every check of `convert/hf_format.py` passes: `(tensors,
/// metadata)`, tensors as `(name, dtype, shape tuple, begin, end)` in the file's order,
/// metadata a dict. `None` when any check fails or the fast path does not take it: the caller
/// makes its own checks, which name the fault. Parsed with the GIL released.
#[pyfunction]
pub(crate) fn parse_safetensors_header<'py>(
    py: Python<'py>,
    blob: &[u8],
    data_len: u64,
) -> PyResult<Option<(Bound<'py, PyList>, Bound<'py, PyDict>)>> {
    let Some(h) = py.detach(|| shardpoint_core::st_header::parse(blob, data_len)) else {
        return Ok(None);
    };
    let tensors = PyList::empty(py);
    for t in h.tensors {
        let shape = PyTuple::new(py, t.shape)?;
        tensors.append((t.name, t.dtype, shape, t.begin, t.end))?;
    }
    let meta = PyDict::new(py);
    for (k, v) in h.metadata {
        meta.set_item(k, v)?;
    }
    Ok(Some((tensors, meta)))
}
