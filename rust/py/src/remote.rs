//! Object-store URLs: `RemoteReader` (the same methods as `CheckpointReader`, values fetched
//! with ranged GETs) and the small object operations the Python layer needs (conditional
//! put/get of the manager's state object, listing, delete, gc). Bulk data never crosses into
//! Python here except as the decoded values handed out.

use crate::buffers::{bytes_of_mut, Store};
use crate::read::{info_tuples, EntryRecord, EntryValue};
use crate::{invalid, nogil};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use shardpoint_core::index::Entry;
use shardpoint_core::store::remote_reader::RemoteReader as CoreRemote;
use shardpoint_core::store::{parse_dir, remote_commit, Location, RemotePrefix};
use shardpoint_core::Error;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// Storage options from Python (`None` = environment only).
pub(crate) type Opts = Option<HashMap<String, String>>;

pub(crate) fn opts_map(o: &Opts) -> BTreeMap<String, String> {
    o.as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// Parse a prefix string (path, file:// or object-store URL).
pub(crate) fn location(py: Python<'_>, prefix: &str, o: &Opts) -> PyResult<Location> {
    let m = opts_map(o);
    nogil(py, || Location::parse(prefix, &m))
}

fn remote_prefix(py: Python<'_>, url: &str, o: &Opts) -> PyResult<RemotePrefix> {
    match location(py, url, o)? {
        Location::Remote(r) => Ok(r),
        Location::Local(_) => Err(invalid(py, format!("{url:?} is not an object-store URL"))),
    }
}

/// Whether a string names an object-store URL.
#[pyfunction]
pub(crate) fn is_remote(prefix: &str) -> bool {
    shardpoint_core::store::is_remote_url(prefix)
}

/// An open checkpoint in an object store.
#[pyclass(module = "shardpoint._core", frozen)]
pub(crate) struct RemoteReader {
    inner: Arc<CoreRemote>,
}

impl RemoteReader {
    fn entry(&self, py: Python<'_>, key: &str) -> PyResult<Entry<'_>> {
        self.inner.entry(key).map_err(|e| crate::to_py(py, e))
    }
}

#[pymethods]
impl RemoteReader {
    #[new]
    #[pyo3(signature = (url, storage_options=None))]
    fn new(py: Python<'_>, url: &str, storage_options: Opts) -> PyResult<Self> {
        let rp = remote_prefix(py, url, &storage_options)?;
        let r = nogil(py, || CoreRemote::open(&rp))?;
        Ok(RemoteReader { inner: Arc::new(r) })
    }

    fn __len__(&self) -> usize {
        self.inner.index().len()
    }

    /// All keys in order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = self.inner.index().keys().map_err(|e| crate::to_py(py, e))?;
        PyList::new(py, keys)
    }

    /// Keys starting with `prefix`, in order.
    fn keys_with_prefix<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Bound<'py, PyList>> {
        let idx = self.inner.index();
        let mut i = idx
            .lower_bound(prefix.as_bytes())
            .map_err(|e| crate::to_py(py, e))?;
        let mut out = Vec::new();
        while i < idx.len() {
            let e = idx.entry(i).map_err(|e| crate::to_py(py, e))?;
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
            .map_err(|e| crate::to_py(py, e))?
            .is_some())
    }

    /// What the index records about `key`.
    fn info(&self, py: Python<'_>, key: &str) -> PyResult<EntryRecord> {
        Ok(EntryRecord::of(&self.entry(py, key)?))
    }

    /// The records of many keys at once (`CheckpointReader.infos`).
    fn infos<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        info_tuples(py, keys, |k| self.entry(py, k))
    }

    /// One key's value: one ranged GET for an uncompressed value of
    /// up to one part; always crc-checked and always private memory (`verify` and `copy` are
    /// accepted for symmetry with `CheckpointReader`).
    #[pyo3(signature = (key, verify=false, copy=false))]
    fn get(&self, py: Python<'_>, key: &str, verify: bool, copy: bool) -> PyResult<EntryValue> {
        let _ = (verify, copy);
        let e = self.entry(py, key)?;
        let v = nogil(py, || self.inner.read(&e))?;
        EntryValue::new(py, &e, Store::Owned(v))
    }

    /// Like `get` for many keys: fetched together (coalesced, parallel) and decoded in parallel.
    #[pyo3(signature = (keys, verify=false, copy=false))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        verify: bool,
        copy: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let _ = (verify, copy);
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        let vals = nogil(py, || self.inner.read_many(&entries))?;
        let out = PyList::empty(py);
        for (e, v) in entries.iter().zip(vals) {
            out.append(EntryValue::new(py, e, Store::Owned(v))?)?;
        }
        Ok(out)
    }

    /// Check one value's crc32c (fetches the whole value once).
    fn verify_key(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        let e = self.entry(py, key)?;
        nogil(py, || self.inner.read(&e).map(|_| ()))
    }

    /// Decode many entries into caller-owned writable buffers (each exactly the entry's raw
    /// length). Every value is checked, whatever `verify` says (accepted for symmetry with
    /// `CheckpointReader`): bytes that crossed a network are checked as downloaded, and only
    /// that checked download reaches the buffer. Buffers must not overlap.
    #[pyo3(signature = (keys, outs, verify=true))]
    fn read_many_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        mut outs: Vec<PyBuffer<u8>>,
        verify: bool,
    ) -> PyResult<()> {
        let _ = verify;
        if keys.len() != outs.len() {
            return Err(invalid(
                py,
                format!("{} keys but {} output buffers", keys.len(), outs.len()),
            ));
        }
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(outs.len());
        for b in outs.iter_mut() {
            dsts.push(bytes_of_mut(py, b)?);
        }
        crate::read::refuse_overlaps(py, &keys, &dsts)?;
        nogil(py, || self.inner.read_many_into(&entries, &mut dsts))
    }

    /// Raw bytes [lo, hi) of an entry into a writable buffer. Compressed: only the chunks
    /// holding them are fetched (each checked). Uncompressed with `verify`: only the crc blocks
    /// holding them when the value has them (each checked), else the whole value once,
    /// checked, and the range cut from it; without `verify`, only the range (unchecked).
    #[pyo3(signature = (key, lo, hi, out, verify=true))]
    fn read_range(
        &self,
        py: Python<'_>,
        key: &str,
        lo: u64,
        hi: u64,
        mut out: PyBuffer<u8>,
        verify: bool,
    ) -> PyResult<()> {
        let e = self.entry(py, key)?;
        let dst = bytes_of_mut(py, &mut out)?;
        nogil(py, || self.inner.read_range(&e, lo, hi, dst, verify))
    }

    /// Raw bytes `[los[i], his[i])` of `keys[i]` into `outs[i]`, as `read_range` reads one,
    /// all downloads in one batched fetch (neighbours of a shard share a ranged GET).
    #[pyo3(signature = (keys, los, his, outs, verify=true))]
    fn read_ranges_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        los: Vec<u64>,
        his: Vec<u64>,
        mut outs: Vec<PyBuffer<u8>>,
        verify: bool,
    ) -> PyResult<()> {
        let (entries, mut dsts) =
            crate::read::range_args(py, &keys, &los, &his, &mut outs, |k| self.entry(py, k))?;
        nogil(py, || self.inner.read_ranges(&entries, &mut dsts, verify))
    }

    /// Check every checksum and invariant, fetching every byte.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        nogil(py, || self.inner.verify())
    }

    /// Re-hash every shard object against the digest manifest (as `CheckpointReader`'s).
    #[allow(clippy::type_complexity)]
    fn verify_strong(
        &self,
        py: Python<'_>,
    ) -> PyResult<Option<(String, String, usize, u64, Vec<(PathBuf, String)>)>> {
        let rep = nogil(py, || shardpoint_core::digest::verify_strong(&*self.inner))?;
        Ok(rep.map(|r| {
            (
                r.algorithm.name().to_string(),
                r.index_digest,
                r.files,
                r.bytes,
                r.mismatches.into_iter().map(|m| (m.path, m.what)).collect(),
            )
        }))
    }

    /// The metadata JSON text (crc checked).
    fn metadata_json(&self, py: Python<'_>) -> PyResult<String> {
        let b = self
            .inner
            .index()
            .metadata_bytes()
            .map_err(|e| crate::to_py(py, e))?;
        String::from_utf8(b.to_vec()).map_err(|_| {
            crate::to_py(
                py,
                Error::corrupt(self.inner.index().path(), 0, "metadata is not valid UTF-8"),
            )
        })
    }

    /// [(shard URL, size in bytes)]
    fn shard_files(&self) -> Vec<(String, u64)> {
        self.inner
            .shards()
            .iter()
            .map(|s| (s.url.to_string_lossy().into_owned(), s.file_len))
            .collect()
    }

    /// The index header's `format_version` (FORMAT.md §3, §3.1.1).
    fn format_version(&self) -> u32 {
        self.inner.index().format_version()
    }

    /// Size of the index object in bytes.
    fn index_size(&self) -> u64 {
        self.inner.index().file_len()
    }

    /// Raw bytes per chunk.
    fn chunk_bytes(&self) -> u32 {
        self.inner.index().chunk_bytes()
    }
}

/// Whether a committed checkpoint exists at `prefix` (path or URL).
#[pyfunction]
#[pyo3(signature = (prefix, storage_options=None))]
pub(crate) fn exists(py: Python<'_>, prefix: &str, storage_options: Opts) -> PyResult<bool> {
    match location(py, prefix, &storage_options)? {
        Location::Local(p) => Ok(shardpoint_core::commit::index_path(&p).exists()),
        Location::Remote(rp) => nogil(py, || Ok(rp.store.head(&rp.key_of(".index"))?.is_some())),
    }
}

/// Read a whole object: (bytes, etag or None). NotFoundError if absent.
#[pyfunction]
#[pyo3(signature = (url, storage_options=None))]
pub(crate) fn object_get<'py>(
    py: Python<'py>,
    url: &str,
    storage_options: Opts,
) -> PyResult<(Bound<'py, PyBytes>, Option<String>)> {
    let rp = remote_prefix(py, url, &storage_options)?;
    let (b, meta) = nogil(py, || rp.store.get(&rp.key))?;
    Ok((PyBytes::new(py, &b), meta.e_tag))
}

/// Put a small object. `mode`: "overwrite", "create" (fails if it exists) or "update" (fails
/// unless its etag is still `etag`). Returns the new etag. A lost condition raises
/// CheckpointIOError whose message says another writer changed it first.
#[pyfunction]
#[pyo3(signature = (url, data, mode="overwrite", etag=None, storage_options=None))]
pub(crate) fn object_put(
    py: Python<'_>,
    url: &str,
    data: Vec<u8>,
    mode: &str,
    etag: Option<String>,
    storage_options: Opts,
) -> PyResult<Option<String>> {
    use shardpoint_core::store::object_store::{PutMode, UpdateVersion};
    let m = match mode {
        "overwrite" => PutMode::Overwrite,
        "create" => PutMode::Create,
        "update" => PutMode::Update(UpdateVersion {
            e_tag: etag,
            version: None,
        }),
        _ => return Err(invalid(py, format!("unknown put mode {mode:?}"))),
    };
    let rp = remote_prefix(py, url, &storage_options)?;
    nogil(py, || rp.store.put(&rp.key, data, m))
}

/// Delete an object (absent is fine).
#[pyfunction]
#[pyo3(signature = (url, storage_options=None))]
pub(crate) fn object_delete(py: Python<'_>, url: &str, storage_options: Opts) -> PyResult<()> {
    let rp = remote_prefix(py, url, &storage_options)?;
    nogil(py, || rp.store.delete(&rp.key))
}

/// Names directly inside "directory" `url` (objects and sub-directories, relative names;
/// directories end with "/").
#[pyfunction]
#[pyo3(signature = (url, storage_options=None))]
pub(crate) fn list_dir(py: Python<'_>, url: &str, storage_options: Opts) -> PyResult<Vec<String>> {
    let m = opts_map(&storage_options);
    let (store, dir) = nogil(py, || parse_dir(url, &m))?;
    let (objs, dirs) = nogil(py, || store.list_dir(&dir))?;
    let strip = |s: &str| -> String {
        let s = s.strip_prefix(&dir).unwrap_or(s);
        s.trim_start_matches('/').to_string()
    };
    let mut out: Vec<String> = objs.iter().map(|o| strip(o.location.as_ref())).collect();
    out.extend(dirs.iter().map(|d| format!("{}/", strip(d))));
    out.sort();
    Ok(out)
}

/// Clear what dead writers left under `url` (older than `older_than` s): their multipart
/// uploads (S3: listed), shards no index references, partial indexes.
#[pyfunction]
#[pyo3(signature = (url, older_than=3600.0, storage_options=None))]
pub(crate) fn gc(
    py: Python<'_>,
    url: &str,
    older_than: f64,
    storage_options: Opts,
) -> PyResult<usize> {
    let m = opts_map(&storage_options);
    let (store, dir) = nogil(py, || parse_dir(url, &m))?;
    nogil(py, || remote_commit::gc(&store, &dir, older_than))
}
