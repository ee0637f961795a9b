//! `shardpoint._core`: the thin PyO3 binding of shardpoint-core.
//!
//! It holds no format logic and knows nothing of numpy or torch: Python hands in buffers and
//! names, Rust hands back buffers. Long work runs with the GIL released through [`nogil`], and
//! core errors become the exception classes of `shardpoint.errors` in one place ([`to_py`]).

mod buffers;
mod checksum;
mod delta;
mod file_ranges;
mod outs;
mod pools;
mod read;
mod records;
mod remote;
mod rows;
mod st_header;
mod staged;
mod stats;
mod write;

use pyo3::exceptions::PySystemError;
use pyo3::prelude::*;
use shardpoint_core::format::Codec;
use shardpoint_core::Error;

/// The `shardpoint.errors` class of each core error (the one place this mapping lives).
fn class_name(err: &Error) -> &'static str {
    match err {
        Error::NotFound { .. } => "NotFoundError",
        Error::Io { .. } => "CheckpointIOError",
        Error::Corrupt { .. } => "CorruptCheckpointError",
        Error::Checksum { .. } => "ChecksumMismatchError",
        Error::UnsupportedVersion { .. } => "UnsupportedFormatError",
        Error::MissingKey { .. } => "MissingKeyError",
        Error::DuplicateKey { .. } => "DuplicateKeyError",
        Error::UnsupportedDtype(_) => "UnsupportedDTypeError",
        Error::InvalidArgument(_) => "InvalidArgumentError",
        // Not a shardpoint error: a cancelled call raises Python's own KeyboardInterrupt.
        Error::Cancelled => "KeyboardInterrupt",
    }
}

/// Every class name [`class_name`] can return (tests check that `shardpoint.errors` has each).
const ERROR_CLASSES: [&str; 9] = [
    "NotFoundError",
    "CheckpointIOError",
    "CorruptCheckpointError",
    "ChecksumMismatchError",
    "UnsupportedFormatError",
    "MissingKeyError",
    "DuplicateKeyError",
    "UnsupportedDTypeError",
    "InvalidArgumentError",
];

/// Map a core error to the matching `shardpoint.errors` class. Every error the binding raises
/// about checkpoint data or arguments goes through here. A class missing from
/// `shardpoint.errors` is a packaging bug and raises `SystemError` naming it (never a silent
/// fallback to a builtin class).
pub(crate) fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let cls = class_name(&err);
    let msg = err.to_string();
    if matches!(err, Error::Cancelled) {
        return pyo3::exceptions::PyKeyboardInterrupt::new_err(msg);
    }
    match py.import("shardpoint.errors").and_then(|m| m.getattr(cls)) {
        Ok(c) => match c.call1((msg,)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(e) => e,
        },
        Err(e) => PySystemError::new_err(format!(
            "shardpoint.errors.{cls} is missing ({e}); the compiled core and the Python package \
             are out of sync. The error was: {msg}"
        )),
    }
}

/// The exception class names the core's errors map to.
#[pyfunction]
fn error_class_names() -> Vec<&'static str> {
    ERROR_CLASSES.to_vec()
}

/// A binding-level argument error (a bad name or buffer), raised through [`to_py`].
pub(crate) fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    to_py(py, Error::InvalidArgument(msg.into()))
}

/// Run `f` with the GIL released and convert its error (polars' pattern: one helper).
pub(crate) fn nogil<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<T> {
    py.detach(f).map_err(|e| to_py(py, e))
}

/// A save's `digest` option: `None`/`""` = no manifest, else `"sha256"` or `"blake3"`.
pub(crate) fn parse_digest(
    py: Python<'_>,
    name: Option<&str>,
) -> PyResult<Option<shardpoint_core::DigestAlgo>> {
    match name {
        None | Some("") => Ok(None),
        Some(n) => shardpoint_core::DigestAlgo::from_name(n)
            .map(Some)
            .map_err(|e| to_py(py, e)),
    }
}

/// How often a cancellable call looks for a pending signal (Ctrl-C). The call then stops at
/// the core's next check (between chunks or pieces): well within half a second.
const SIGNAL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether the calling thread is the process's main thread: the only one on which Python runs
/// signal handlers (elsewhere a call cannot be interrupted by Ctrl-C, so it is not watched).
fn on_main_thread() -> bool {
    // SAFETY: plain syscalls without arguments.
    unsafe { libc::gettid() == libc::getpid() }
}

/// [`nogil`] for long calls (save, load, verify, merge): on the main thread the work runs on
/// a helper thread while this one, GIL released, wakes every [`SIGNAL_POLL`] to take the GIL
/// and run Python's signal handlers. When one raises (Ctrl-C: `KeyboardInterrupt`), the
/// call's [`cancel::Token`](shardpoint_core::cancel::Token) is cancelled, the core stops at
/// its next check (a save then commits nothing and removes its temp files), and the handler's
/// exception is raised. An exception raised by a handler after the work finished is raised
/// too (the work is done, e.g. the save committed): it is never swallowed.
pub(crate) fn nogil_cancellable<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<T> {
    if !on_main_thread() {
        return nogil(py, f);
    }
    let token = shardpoint_core::cancel::Token::new();
    let mut raised: Option<PyErr> = None;
    let res = py.detach(|| {
        std::thread::scope(|s| {
            let me = std::thread::current();
            let t = token.clone();
            let worker = s.spawn(move || {
                let _scope = t.enter();
                let r = f();
                me.unpark();
                r
            });
            while !worker.is_finished() {
                std::thread::park_timeout(SIGNAL_POLL);
                if raised.is_none() && !worker.is_finished() {
                    Python::attach(|py| {
                        if let Err(e) = py.check_signals() {
                            token.cancel();
                            raised = Some(e);
                        }
                    });
                }
            }
            match worker.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    });
    if let Some(e) = raised {
        return Err(e);
    }
    res.map_err(|e| to_py(py, e))
}

pub(crate) fn parse_codec(py: Python<'_>, name: &str) -> PyResult<Codec> {
    match name {
        "none" => Ok(Codec::None),
        // The default: per dtype, the best codec (floats: bytegroup-huffman at levels <= 1;
        // other multi-byte dtypes: zstd-bytegroup; 1-byte dtypes: zstd).
        "zstd" | "bytegroup-huffman" => Ok(Codec::HuffByteGroup),
        "zstd-bytegroup" => Ok(Codec::ZstdByteGroup),
        "zstd-plain" => Ok(Codec::Zstd),
        _ => Err(invalid(py, format!(
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
    m.add_class::<read::EntryRecord>()?;
    m.add_class::<read::EntryValue>()?;
    m.add_function(wrap_pyfunction!(write::save, m)?)?;
    m.add_function(wrap_pyfunction!(write::is_single_file, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(delta::xor_stats, m)?)?;
    m.add_function(wrap_pyfunction!(delta::crc32c_many, m)?)?;
    m.add_function(wrap_pyfunction!(delta::encode_single, m)?)?;
    m.add_function(wrap_pyfunction!(delta::xor_into, m)?)?;
    m.add_function(wrap_pyfunction!(delta::encoded_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::digest_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(file_ranges::read_file_ranges, m)?)?;
    m.add_function(wrap_pyfunction!(file_ranges::read_file_ranges_direct, m)?)?;
    m.add_function(wrap_pyfunction!(st_header::parse_safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(write::merge, m)?)?;
    m.add_function(wrap_pyfunction!(write::merge_in_memory, m)?)?;
    m.add_function(wrap_pyfunction!(write::wait_for_cleanups, m)?)?;
    m.add_function(wrap_pyfunction!(write::pending_cleanups, m)?)?;
    m.add_function(wrap_pyfunction!(write::merge_order_stats, m)?)?;
    m.add_function(wrap_pyfunction!(write::forget_merge_orders, m)?)?;
    m.add_function(wrap_pyfunction!(write::remove, m)?)?;
    m.add_function(wrap_pyfunction!(staged::stage_copy, m)?)?;
    m.add_function(wrap_pyfunction!(staged::save_incremental, m)?)?;
    m.add_function(wrap_pyfunction!(stats::stats_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(stats::diff_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(rows::int_attr_rows, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(error_class_names, m)?)?;
    m.add("FORMAT_VERSION", shardpoint_core::format::FORMAT_VERSION)?;
    m.add(
        "DEFAULT_CHUNK_BYTES",
        shardpoint_core::format::DEFAULT_CHUNK_BYTES,
    )?;
    m.add("DEFAULT_LEVEL", shardpoint_core::codec::DEFAULT_LEVEL)?;
    m.add(
        "MAX_OBJECT_BYTES",
        shardpoint_core::format::MAX_OBJECT_BYTES,
    )?;
    Ok(())
}
