//! `shardpoint._core`: the thin PyO3 binding of shardpoint-core.
//!
//! It holds no format logic and knows nothing of numpy or torch: Python hands in buffers and
//! names, Rust hands back buffers. Long work runs with the GIL released through [`nogil`], and
//! core errors become the exception classes of `shardpoint.errors` in one place ([`to_py`]).

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use shardpoint_core::format::{Codec, DType, Kind};
use shardpoint_core::index::Entry;
use shardpoint_core::{CheckpointWriter, Error, Item, Reader, WriterOptions};
use std::os::raw::c_int;
use std::path::PathBuf;
use std::sync::Arc;

/// Map a core error to the matching `shardpoint.errors` class (the one place this happens).
fn to_py(py: Python<'_>, err: Error) -> PyErr {
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
fn nogil<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> shardpoint_core::Result<T> + Send,
) -> PyResult<T> {
    py.detach(f).map_err(|e| to_py(py, e))
}

fn parse_codec(name: &str) -> PyResult<Codec> {
    match name {
        "none" => Ok(Codec::None),
        "zstd" | "zstd-bytegroup" => Ok(Codec::ZstdByteGroup),
        "zstd-plain" => Ok(Codec::Zstd),
        _ => Err(PyValueError::new_err(format!(
            "unknown compression {name:?}; expected 'none', 'zstd' (byte-grouped for multi-byte dtypes) or 'zstd-plain'"
        ))),
    }
}

/// A buffer handed to Python: a region of a shard's copy-on-write mapping, or owned bytes.
enum Store {
    Mapped {
        map: Arc<memmap2::MmapMut>,
        off: usize,
        len: usize,
    },
    Owned(Vec<u8>),
}

/// Writable bytes exposed through the buffer protocol (numpy wraps them without a copy).
/// Writes to a mapped region go to private copy-on-write pages, never to the file.
#[pyclass(module = "shardpoint._core", frozen)]
struct Buffer {
    store: Store,
}

impl Buffer {
    fn ptr_len(&self) -> (*mut u8, usize) {
        match &self.store {
            Store::Mapped { map, off, len } => {
                (unsafe { (map.as_ptr() as *mut u8).add(*off) }, *len)
            }
            Store::Owned(v) => (v.as_ptr() as *mut u8, v.len()),
        }
    }
}

#[pymethods]
impl Buffer {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = slf.get().ptr_len();
        // SAFETY: `view` comes from the interpreter; the exporter (slf) is kept alive by the
        // view's reference, so `ptr` stays valid for the view's lifetime. The memory is
        // writable: private COW pages or our own Vec.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut std::ffi::c_void,
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.ptr_len().1
    }
}

/// A zeroed buffer of `n` bytes, or `MemoryError`: `n` comes from the file (a hostile index can
/// declare a 1 TiB tensor), so an allocation failure must not abort the interpreter. Large
/// zeroed allocations are lazily mapped pages, so nothing is touched before decoding.
fn alloc_zeroed(n: u64) -> PyResult<Vec<u8>> {
    use pyo3::exceptions::PyMemoryError;
    let n = usize::try_from(n).map_err(|_| PyMemoryError::new_err("entry too large"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n)
        .map_err(|_| PyMemoryError::new_err(format!("cannot allocate {n} bytes")))?;
    // SAFETY: non-zero size; on success the pointer owns `n` zeroed bytes from the global
    // allocator with exactly the layout a Vec<u8> of capacity n uses, so the Vec may own it.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(PyMemoryError::new_err(format!(
                "cannot allocate {n} bytes for a checkpoint entry"
            )));
        }
        Ok(Vec::from_raw_parts(ptr, n, n))
    }
}

/// Borrow a C-contiguous byte buffer's memory as a slice (for use with the GIL released).
fn bytes_of(buf: &PyBuffer<u8>) -> PyResult<&[u8]> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("buffer is not C-contiguous"));
    }
    // SAFETY: the PyBuffer keeps the exporter alive and its memory pinned until dropped; the
    // caller keeps it alive for as long as the slice is used. Concurrent mutation by another
    // Python thread is the caller's race, as with any buffer consumer.
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) })
}

/// (key, dtype, kind, shape, buffer) tuples from Python → owned parts plus pinned buffers.
type RawItem = (String, String, String, Vec<u64>, PyBuffer<u8>);

fn to_items(raw: &[RawItem]) -> PyResult<Vec<Item<'_>>> {
    raw.iter()
        .map(|(k, d, kind, shape, buf)| {
            Ok(Item {
                key: k.clone(),
                dtype: DType::from_name(d).map_err(|e| PyValueError::new_err(e.to_string()))?,
                kind: Kind::from_name(kind).map_err(|e| PyValueError::new_err(e.to_string()))?,
                dims: shape.clone(),
                data: bytes_of(buf)?,
            })
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn options(
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    shards: u32,
    durable: bool,
    rank: u32,
    world_size: u32,
    metadata_json: String,
    merge_token: String,
) -> PyResult<WriterOptions> {
    Ok(WriterOptions {
        codec: parse_codec(codec)?,
        level,
        chunk_bytes,
        shards,
        durable,
        rank,
        world_size,
        metadata_json,
        merge_token,
    })
}

/// Save items in one call, `shards` threads writing in parallel with the GIL released.
#[pyfunction]
#[pyo3(signature = (prefix, items, codec, level, chunk_bytes, shards, durable, metadata_json))]
#[allow(clippy::too_many_arguments)]
fn save(
    py: Python<'_>,
    prefix: PathBuf,
    items: Vec<RawItem>,
    codec: &str,
    level: i32,
    chunk_bytes: u32,
    shards: u32,
    durable: bool,
    metadata_json: String,
) -> PyResult<()> {
    let opts = options(
        codec,
        level,
        chunk_bytes,
        shards,
        durable,
        0,
        1,
        metadata_json,
        String::new(),
    )?;
    let its = to_items(&items)?;
    nogil(py, || shardpoint_core::save(&prefix, &its, opts))
}

/// Merge the partial indexes of a multi-writer save and commit `P.index`.
#[pyfunction]
#[pyo3(signature = (prefix, world_size, durable=true, token=None))]
fn merge(
    py: Python<'_>,
    prefix: PathBuf,
    world_size: u32,
    durable: bool,
    token: Option<String>,
) -> PyResult<()> {
    nogil(py, || {
        shardpoint_core::merge(&prefix, world_size, durable, token.as_deref())
    })
}

/// Delete checkpoint `prefix` (index first).
#[pyfunction]
fn remove(py: Python<'_>, prefix: PathBuf) -> PyResult<()> {
    nogil(py, || shardpoint_core::commit::remove(&prefix))
}

/// Streaming writer; `add` may be called from several Python threads at once.
#[pyclass(module = "shardpoint._core", frozen)]
struct Writer {
    inner: CheckpointWriter,
}

#[pymethods]
impl Writer {
    #[new]
    #[pyo3(signature = (prefix, codec, level, chunk_bytes, shards, durable, rank, world_size, metadata_json, merge_token=String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        prefix: PathBuf,
        codec: &str,
        level: i32,
        chunk_bytes: u32,
        shards: u32,
        durable: bool,
        rank: u32,
        world_size: u32,
        metadata_json: String,
        merge_token: String,
    ) -> PyResult<Self> {
        let opts = options(
            codec,
            level,
            chunk_bytes,
            shards,
            durable,
            rank,
            world_size,
            metadata_json,
            merge_token,
        )?;
        let inner = nogil(py, || CheckpointWriter::new(&prefix, opts))?;
        Ok(Writer { inner })
    }

    /// Write one value now.
    fn add(
        &self,
        py: Python<'_>,
        key: String,
        dtype: String,
        kind: String,
        shape: Vec<u64>,
        data: PyBuffer<u8>,
    ) -> PyResult<()> {
        let raw = [(key, dtype, kind, shape, data)];
        let its = to_items(&raw)?;
        nogil(py, || self.inner.add(&its[0]))
    }

    /// Finish: commit `P.index` (one writer) or publish the partial index (several).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        nogil(py, || self.inner.commit())
    }

    /// Discard everything written.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| self.inner.abort())
    }
}

/// An open checkpoint.
#[pyclass(module = "shardpoint._core", frozen)]
struct CheckpointReader {
    inner: Arc<Reader>,
}

fn entry_tuple<'py>(py: Python<'py>, e: &Entry<'_>) -> PyResult<Bound<'py, PyTuple>> {
    (e.dtype.name(), PyTuple::new(py, &e.dims)?, e.kind.name()).into_pyobject(py)
}

impl CheckpointReader {
    fn entry(&self, py: Python<'_>, key: &str) -> PyResult<Entry<'_>> {
        self.inner.entry(key).map_err(|e| to_py(py, e))
    }

    /// A zero-copy buffer for an uncompressed entry, or decoded owned bytes.
    fn buffer_for(&self, py: Python<'_>, e: &Entry<'_>, verify: bool) -> PyResult<Buffer> {
        if e.codec == Codec::None {
            if verify {
                nogil(py, || self.inner.verify_entry(e))?;
            }
            let map = self.inner.shards()[e.shard as usize]
                .cow()
                .map_err(|err| to_py(py, err))?;
            Ok(Buffer {
                store: Store::Mapped {
                    map,
                    off: e.offset as usize,
                    len: e.stored_len as usize,
                },
            })
        } else {
            let mut v = alloc_zeroed(e.raw_len)?;
            nogil(py, || self.inner.read_into(e, &mut v, true))?;
            Ok(Buffer {
                store: Store::Owned(v),
            })
        }
    }
}

#[pymethods]
impl CheckpointReader {
    #[new]
    fn new(py: Python<'_>, prefix: PathBuf) -> PyResult<Self> {
        let r = nogil(py, || Reader::open(&prefix))?;
        Ok(CheckpointReader { inner: Arc::new(r) })
    }

    fn __len__(&self) -> usize {
        self.inner.index().len()
    }

    /// All keys in order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let idx = self.inner.index();
        let mut out = Vec::with_capacity(idx.len());
        for i in 0..idx.len() {
            out.push(idx.entry(i).map_err(|e| to_py(py, e))?.key);
        }
        PyList::new(py, out)
    }

    /// Keys starting with `prefix`, in order (binary search, then a walk).
    fn keys_with_prefix<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Bound<'py, PyList>> {
        let idx = self.inner.index();
        let mut i = idx
            .lower_bound(prefix.as_bytes())
            .map_err(|e| to_py(py, e))?;
        let mut out = Vec::new();
        while i < idx.len() {
            let e = idx.entry(i).map_err(|e| to_py(py, e))?;
            if !e.key.starts_with(prefix) {
                break;
            }
            out.push(e.key);
            i += 1;
        }
        PyList::new(py, out)
    }

    fn __contains__(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        Ok(self
            .inner
            .index()
            .find(key)
            .map_err(|e| to_py(py, e))?
            .is_some())
    }

    /// (dtype, shape, kind, codec, stored_len, raw_len, shard, offset, crc32c, nchunks)
    fn info<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyTuple>> {
        let e = self.entry(py, key)?;
        (
            e.dtype.name(),
            PyTuple::new(py, &e.dims)?,
            e.kind.name(),
            e.codec.name(),
            e.stored_len,
            e.raw_len,
            e.shard,
            e.offset,
            e.crc,
            e.nchunks(),
        )
            .into_pyobject(py)
    }

    /// (dtype, shape, kind, buffer) for one key.
    #[pyo3(signature = (key, verify=false))]
    fn get<'py>(&self, py: Python<'py>, key: &str, verify: bool) -> PyResult<Bound<'py, PyTuple>> {
        let e = self.entry(py, key)?;
        let b = self.buffer_for(py, &e, verify)?;
        let (d, s, k) = entry_tuple(py, &e)?.extract::<(String, Bound<'py, PyTuple>, String)>()?;
        (d, s, k, Bound::new(py, b)?).into_pyobject(py)
    }

    /// Like `get` for many keys; compressed entries are decoded in parallel.
    #[pyo3(signature = (keys, verify=false))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        verify: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        use rayon::prelude::*;
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        let reader = &self.inner;
        // Allocate first (fallibly, with the GIL: MemoryError on absurd sizes), then decode
        // every compressed entry in parallel with the GIL released.
        let mut decoded: Vec<Option<Vec<u8>>> = entries
            .iter()
            .map(|e| {
                if e.codec == Codec::None {
                    Ok(None)
                } else {
                    alloc_zeroed(e.raw_len).map(Some)
                }
            })
            .collect::<PyResult<_>>()?;
        nogil(py, || {
            entries
                .par_iter()
                .zip(decoded.par_iter_mut())
                .try_for_each(|(e, buf)| match buf {
                    Some(v) => reader.read_into(e, v, true),
                    None if verify => reader.verify_entry(e),
                    None => Ok(()),
                })
        })?;
        let out = PyList::empty(py);
        for (e, d) in entries.iter().zip(decoded) {
            let store = match d {
                Some(v) => Store::Owned(v),
                None => {
                    let map = reader.shards()[e.shard as usize]
                        .cow()
                        .map_err(|err| to_py(py, err))?;
                    Store::Mapped {
                        map,
                        off: e.offset as usize,
                        len: e.stored_len as usize,
                    }
                }
            };
            let t = (
                e.dtype.name(),
                PyTuple::new(py, &e.dims)?,
                e.kind.name(),
                Bound::new(py, Buffer { store })?,
            );
            out.append(t)?;
        }
        Ok(out)
    }

    /// Raw bytes [lo, hi) of an entry into a writable buffer, decoding only needed chunks.
    fn read_range(
        &self,
        py: Python<'_>,
        key: &str,
        lo: u64,
        hi: u64,
        out: PyBuffer<u8>,
    ) -> PyResult<()> {
        if out.readonly() {
            return Err(PyValueError::new_err("output buffer is read-only"));
        }
        let e = self.entry(py, key)?;
        let dst = bytes_of(&out)?;
        // SAFETY: checked writable and contiguous; `out` outlives the call.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr() as *mut u8, dst.len()) };
        nogil(py, || self.inner.read_range(&e, lo, hi, dst))
    }

    /// Check every checksum and invariant (parallel, GIL released).
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        nogil(py, || self.inner.verify())
    }

    /// The metadata JSON text (crc checked).
    fn metadata_json(&self, py: Python<'_>) -> PyResult<String> {
        let b = self
            .inner
            .index()
            .metadata_bytes()
            .map_err(|e| to_py(py, e))?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            to_py(
                py,
                Error::corrupt(self.inner.index().path(), 0, "metadata is not valid UTF-8"),
            )
        })
    }

    /// [(shard file path, size in bytes)]
    fn shard_files(&self) -> Vec<(PathBuf, u64)> {
        self.inner
            .shards()
            .iter()
            .map(|s| (s.path.clone(), s.bytes().len() as u64))
            .collect()
    }

    /// Size of the index file in bytes.
    fn index_size(&self) -> u64 {
        self.inner.index().file_len()
    }

    /// Raw bytes per chunk.
    fn chunk_bytes(&self) -> u32 {
        self.inner.index().chunk_bytes()
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
    m.add_class::<CheckpointReader>()?;
    m.add_class::<Writer>()?;
    m.add_class::<Buffer>()?;
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(remove, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add("FORMAT_VERSION", shardpoint_core::format::FORMAT_VERSION)?;
    m.add(
        "DEFAULT_CHUNK_BYTES",
        shardpoint_core::format::DEFAULT_CHUNK_BYTES,
    )?;
    m.add("DEFAULT_LEVEL", shardpoint_core::codec::DEFAULT_LEVEL)?;
    Ok(())
}
