//! Integer attributes of many Python objects flattened into one buffer, at C speed: the
//! per-object step of a coordinator that handles thousands of ranks' plans (docs/SCALE.md;
//! for DCP's chunk metadata, each chunk's `offsets` then `sizes`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// Little-endian int64 rows, one per object of `objs`: the integers of each attribute in
/// `names` (each a tuple, or a tuple subclass, of ints) one after the other. None when an
/// attribute is not such a tuple or a row is not `width` integers long; a missing attribute
/// raises its `AttributeError`.
#[pyfunction]
pub(crate) fn int_attr_rows<'py>(
    py: Python<'py>,
    objs: &Bound<'py, PyList>,
    names: Vec<String>,
    width: usize,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let names: Vec<Bound<'py, PyString>> = names.iter().map(|n| PyString::intern(py, n)).collect();
    let mut out: Vec<u8> = Vec::with_capacity(objs.len().saturating_mul(width) * 8);
    for obj in objs.iter() {
        let mut got = 0usize;
        for name in &names {
            let value = obj.getattr(name)?;
            let Ok(tuple) = value.cast::<PyTuple>() else {
                return Ok(None);
            };
            for x in tuple.iter() {
                let Ok(i) = x.extract::<i64>() else {
                    return Ok(None);
                };
                out.extend_from_slice(&i.to_le_bytes());
                got += 1;
            }
        }
        if got != width {
            return Ok(None);
        }
    }
    Ok(Some(PyBytes::new(py, &out)))
}
