//! `shardpoint._core`: the thin PyO3 binding of shardpoint-core.
//!
//! It holds no format logic and knows nothing of numpy or torch: Python hands in buffers and
//! names, Rust hands back buffers. Long work runs with the GIL released through [`nogil`], and
//! core errors become the exception classes of `shardpoint.errors` in one place ([`to_py`]).

mod buffers;
mod checksum;
mod read;
mod remote;
mod staged;
mod write;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardpoint_core::format::Codec;
use shardpoint_core::Error;

/// Map a core error to the matching `shardpoint.errors` class (the one place this happens).
pub(crate) fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let cls = match &err {
        Error::NotFound { .. } => "NotFoundError",
        Error::Io { .. } => "CheckpointIOError",
        Error::Corrupt { .. } => "CorruptCheckpointError",
        Error::Checksum { .. } => "ChecksumMismatchError",
        Error::UnsupportedVersion { .. } => "UnsupportedFormatError",
        Error::MissingKey { .. } => "MissingKeyError",
        Error::DuplicateKey { .. } => "DuplicateKeyError",
        Error::UnsupportedDtype(_) => "UnsupportedDTypeError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
    };
    let msg = err.to_string();
    match py.import("shardpoint.errors").and_then(|m| m.getattr(cls)) {
        Ok(c) => match c.call1((msg.clone(),)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(e) => e,
        },
        Err(_) => PyValueError::new_err(msg),
    }
}

/// Run `f` with the GIL released and convert its error (polars' pattern: one helper).
pub(crate) fn nogil<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<T> {
    py.detach(f).map_err(|e| to_py(py, e))
}

pub(crate) fn parse_codec(name: &str) -> PyResult<Codec> {
    match name {
        "none" => Ok(Codec::None),
        // The default: per dtype, the best codec (floats: bytegroup-huffman at levels <= 1;
        // other multi-byte dtypes: zstd-bytegroup; 1-byte dtypes: zstd).
        "zstd" | "bytegroup-huffman" => Ok(Codec::HuffByteGroup),
        "zstd-bytegroup" => Ok(Codec::ZstdByteGroup),
        "zstd-plain" => Ok(Codec::Zstd),
        _ => Err(PyValueError::new_err(format!(
            "unknown compression {name:?}; expected 'none', 'zstd' (the best codec per dtype), 'bytegroup-huffman', 'zstd-bytegroup' or 'zstd-plain'"
        ))),
    }
}

/// The names of the dtypes the format stores, in tag order.
#[pyfunction]
fn dtype_names() -> Vec<&'static str> {
    shardpoint_core::format::ALL_DTYPES
        .iter()
        .map(|d| d.name())
        .collect()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<read::CheckpointReader>()?;
    m.add_class::<write::Writer>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<remote::RemoteReader>()?;
    m.add_function(wrap_pyfunction!(remote::is_remote, m)?)?;
    m.add_function(wrap_pyfunction!(remote::exists, m)?)?;
    m.add_function(wrap_pyfunction!(remote::object_get, m)?)?;
    m.add_function(wrap_pyfunction!(remote::object_put, m)?)?;
    m.add_function(wrap_pyfunction!(remote::object_delete, m)?)?;
    m.add_function(wrap_pyfunction!(remote::list_dir, m)?)?;
    m.add_function(wrap_pyfunction!(remote::gc, m)?)?;
    m.add_function(wrap_pyfunction!(write::save, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(write::merge, m)?)?;
    m.add_function(wrap_pyfunction!(write::remove, m)?)?;
    m.add_function(wrap_pyfunction!(staged::stage_copy, m)?)?;
    m.add_function(wrap_pyfunction!(staged::save_incremental, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add("FORMAT_VERSION", shardpoint_core::format::FORMAT_VERSION)?;
    m.add(
        "DEFAULT_CHUNK_BYTES",
        shardpoint_core::format::DEFAULT_CHUNK_BYTES,
    )?;
    m.add("DEFAULT_LEVEL", shardpoint_core::codec::DEFAULT_LEVEL)?;
    Ok(())
}
