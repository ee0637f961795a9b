//! Reading: `CheckpointReader`, lookups, zero-copy and decoded values, ranges, verify.

use crate::buffers::{alloc_zeroed, arena_align, bytes_of_mut, Arena, Store, ARENA_MAX};
pub(crate) use crate::outs::{range_args, refuse_overlaps};
pub(crate) use crate::records::{info_tuples, EntryRecord, EntryValue};
use crate::{nogil, nogil_cancellable, to_py};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyList;
use shardpoint_core::format::Codec;
use shardpoint_core::index::Entry;
use shardpoint_core::{Error, Reader};
use std::path::PathBuf;
use std::sync::Arc;

/// Reads of at least this many bytes run watched for Ctrl-C ([`nogil_cancellable`]); smaller
/// ones finish in well under the poll interval and skip the helper thread.
const WATCH_MIN: u64 = 16 << 20;

/// An open checkpoint.
#[pyclass(module = "shardpoint._core", frozen)]
pub(crate) struct CheckpointReader {
    pub(crate) inner: Arc<Reader>,
}

impl CheckpointReader {
    pub(crate) fn entry(&self, py: Python<'_>, key: &str) -> PyResult<Entry<'_>> {
        self.inner.entry(key).map_err(|e| to_py(py, e))
    }

    /// A zero-copy buffer for an uncompressed entry (unless `copy`), or owned bytes read with
    /// pread and decoded. With `verify`, a zero-copy entry's crc is computed on the very
    /// mapping handed out (right after its length was checked against the file): the check is
    /// also the first touch of the pages the caller reads next, so it costs little more than
    /// the touch itself (the hazard of a file truncated later is that of any mapped view).
    fn store_for(
        &self,
        py: Python<'_>,
        e: &Entry<'_>,
        verify: bool,
        copy: bool,
    ) -> PyResult<Store> {
        if e.codec == Codec::None && !copy {
            let map = self.inner.shards()[e.shard as usize]
                .cow()
                .map_err(|err| to_py(py, err))?;
            if verify {
                // crc over the very mapping handed out: the check is the first touch.
                let view = &map[e.offset as usize..(e.offset + e.stored_len) as usize];
                if e.stored_len >= WATCH_MIN {
                    nogil_cancellable(py, || self.inner.verify_view(e, view))?;
                } else {
                    nogil(py, || self.inner.verify_view(e, view))?;
                }
            }
            Ok(Store::Mapped {
                map,
                off: e.offset as usize,
                len: e.stored_len as usize,
            })
        } else {
            let mut v = alloc_zeroed(e.raw_len)?;
            if e.raw_len >= WATCH_MIN {
                nogil_cancellable(py, || self.inner.read_into(e, &mut v, verify))?;
            } else {
                nogil(py, || self.inner.read_into(e, &mut v, verify))?;
            }
            Ok(Store::Owned(v))
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
        let keys = self.inner.index().keys().map_err(|e| to_py(py, e))?;
        PyList::new(py, keys)
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

    /// The index record of one key.
    fn info(&self, py: Python<'_>, key: &str) -> PyResult<EntryRecord> {
        Ok(EntryRecord::of(&self.entry(py, key)?))
    }

    /// The index records of many keys, each a tuple in `EntryInfo`'s field order (key
    /// first): one call for a whole plan, where an `info` per key cost ~3 us in Python.
    fn infos<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        info_tuples(py, keys, |k| self.entry(py, k))
    }

    /// The value of one key. `verify`: check the crc32c of uncompressed values too (compressed
    /// ones are always checked); `copy`: never hand out a mapping.
    #[pyo3(signature = (key, verify=false, copy=false))]
    fn get(&self, py: Python<'_>, key: &str, verify: bool, copy: bool) -> PyResult<EntryValue> {
        let e = self.entry(py, key)?;
        let store = self.store_for(py, &e, verify, copy)?;
        EntryValue::new(py, &e, store)
    }

    /// Like `get` for many keys; compressed entries are decoded in parallel.
    #[pyo3(signature = (keys, verify=false, copy=false))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        verify: bool,
        copy: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        use rayon::prelude::*;
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        let reader = &self.inner;
        // Allocate first (fallibly, with the GIL: MemoryError on absurd sizes), then decode
        // every compressed entry in parallel with the GIL released. Values below ARENA_MAX share
        // one arena (one allocation instead of one per value); bigger ones get their own.
        let owned = |e: &Entry<'_>| e.codec != Codec::None || copy;
        let mut slots: Vec<Option<(usize, usize)>> = Vec::with_capacity(entries.len());
        let mut arena_len = 0usize;
        for e in &entries {
            let small = owned(e) && e.raw_len > 0 && e.raw_len < ARENA_MAX as u64;
            slots.push(small.then(|| {
                let at = arena_align(arena_len);
                arena_len = at + e.raw_len as usize;
                (at, e.raw_len as usize)
            }));
        }
        let mut arena = alloc_zeroed(arena_len as u64)?;
        let mut decoded: Vec<Option<Vec<u8>>> = entries
            .iter()
            .zip(&slots)
            .map(|(e, slot)| {
                if owned(e) && slot.is_none() {
                    alloc_zeroed(e.raw_len).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<PyResult<_>>()?;
        // The mappings handed out for uncompressed entries; `verify` checks their crcs on
        // those very mappings, in parallel (the check is the pages' first touch). With `copy`
        // (io="pread") nothing is mapped: those entries are read into their own buffers.
        let maps = entries
            .iter()
            .map(|e| {
                (e.codec == Codec::None && !copy)
                    .then(|| reader.shards()[e.shard as usize].cow())
                    .transpose()
                    .map_err(|err| to_py(py, err))
            })
            .collect::<PyResult<Vec<_>>>()?;
        {
            // Every entry's output: its own buffer, its arena slot (disjoint, carved in
            // order), or none (a mapping).
            let mut rest: &mut [u8] = &mut arena;
            let mut cut = 0usize;
            let mut dsts: Vec<Option<&mut [u8]>> = Vec::with_capacity(entries.len());
            for (slot, own) in slots.iter().zip(decoded.iter_mut()) {
                dsts.push(match (slot, own) {
                    (Some((at, len)), _) => {
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - cut);
                        let (mine, tail) = tail.split_at_mut(*len);
                        rest = tail;
                        cut = at + len;
                        Some(mine)
                    }
                    (None, Some(v)) => Some(&mut v[..]),
                    (None, None) => None,
                });
            }
            nogil_cancellable(py, || {
                let cancel = shardpoint_core::cancel::current();
                shardpoint_core::threads::install(|| {
                    entries
                        .par_iter()
                        .zip(dsts.par_iter_mut())
                        .zip(maps.par_iter())
                        .try_for_each(|((e, dst), map)| {
                            cancel.check()?;
                            let _scope = cancel.enter();
                            match (dst, map) {
                                (Some(d), _) => {
                                    reader.read_into(e, d, verify || e.codec != Codec::None)
                                }
                                (None, Some(m)) if verify => reader.verify_view(
                                    e,
                                    &m[e.offset as usize..(e.offset + e.stored_len) as usize],
                                ),
                                _ => Ok(()),
                            }
                        })
                })
            })?;
        }
        let arena = Arc::new(Arena::new(arena));
        let out = PyList::empty(py);
        for (((e, d), map), slot) in entries.iter().zip(decoded).zip(maps).zip(slots) {
            let store = match (d, map) {
                _ if slot.is_some() => {
                    let (off, len) = slot.expect("checked");
                    Store::Shared {
                        arena: arena.clone(),
                        off,
                        len,
                    }
                }
                (Some(v), _) => Store::Owned(v),
                (None, Some(map)) => Store::Mapped {
                    map,
                    off: e.offset as usize,
                    len: e.stored_len as usize,
                },
                (None, None) => unreachable!("uncompressed entries have a mapping"),
            };
            out.append(EntryValue::new(py, e, store)?)?;
        }
        Ok(out)
    }

    /// Decode many entries into caller-owned writable buffers (each exactly the entry's raw
    /// length), in parallel with the GIL released: the load path that needs no fresh memory
    /// (no page faults, no kernel page clearing) and no second copy. Every value is checked
    /// (`verify` also checks uncompressed ones, as in `get_many`). Buffers must not overlap.
    /// `threads`: decode on a pool of that many threads (default: one per CPU).
    /// `direct`: read every value with the cold-read engine from the files this reader opened,
    /// that many reads in flight (`reader/direct_chunks.rs`; `follow_cache=False`: cached
    /// pieces too from the device), and return the stored bytes read in place, bounced, cached.
    #[pyo3(signature = (keys, outs, verify=true, threads=None, direct=None, follow_cache=true))]
    #[allow(clippy::too_many_arguments)] // pyo3 method: the keywords are Python's
    fn read_many_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        mut outs: Vec<PyBuffer<u8>>,
        verify: bool,
        threads: Option<usize>,
        direct: Option<usize>,
        follow_cache: bool,
    ) -> PyResult<Option<(u64, u64, u64)>> {
        if keys.len() != outs.len() {
            return Err(crate::invalid(
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
        refuse_overlaps(py, &keys, &dsts)?;
        let reader = &self.inner;
        let work = crate::pools::on_threads(py, threads, || match direct {
            None => reader.read_many_into(&entries, dsts, verify).map(|()| None),
            Some(d) => reader
                .read_many_into_direct(&entries, dsts, verify, d, follow_cache)
                .map(|s| Some((s.in_place, s.bounced, s.buffered))),
        })?;
        nogil_cancellable(py, work)
    }

    /// The first target not matching its entry (`None`: all do): `keys[i]` a storable key
    /// (`check_key`) of a tensor of dtype name `dtypes[i]` and shape `shapes[i]`. One call for
    /// all `load_into` targets, not one `info` per key; the caller words the error (re-checking
    /// key by key).
    fn first_mismatch(
        &self,
        keys: Vec<String>,
        dtypes: Vec<String>,
        shapes: Vec<Vec<u64>>,
    ) -> Option<usize> {
        if keys.len() != dtypes.len() || keys.len() != shapes.len() {
            return Some(keys.len().min(dtypes.len()).min(shapes.len()));
        }
        (0..keys.len()).find(|&i| {
            let key = &keys[i];
            let storable = !key.is_empty() && key.len() <= 65535 && !key.contains('\0');
            !storable
                || match self.inner.entry(key) {
                    Ok(e) => {
                        e.kind.name() != "tensor"
                            || e.dtype.name() != dtypes[i]
                            || e.dims[..] != shapes[i][..]
                    }
                    Err(_) => true,
                }
        })
    }

    /// Check that `outs[i]` holds exactly the uncompressed payload of `keys[i]` (its stored
    /// crc32c), in parallel with the GIL released: bytes another engine read into caller memory
    /// (the weights iterator's `O_DIRECT` reads). A compressed entry or a buffer of another
    /// length is refused; a mismatch raises the checksum error naming the shard and key.
    fn verify_views(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        outs: Vec<PyBuffer<u8>>,
    ) -> PyResult<()> {
        use rayon::prelude::*;
        if keys.len() != outs.len() {
            return Err(crate::invalid(
                py,
                format!("{} keys but {} buffers", keys.len(), outs.len()),
            ));
        }
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        let views: Vec<&[u8]> = outs
            .iter()
            .map(|b| crate::buffers::bytes_of(py, b))
            .collect::<PyResult<_>>()?;
        let reader = &self.inner;
        nogil_cancellable(py, || {
            shardpoint_core::threads::install(|| {
                entries
                    .par_iter()
                    .zip(views.par_iter())
                    .try_for_each(|(e, v)| reader.verify_view(e, v))
            })
        })
    }

    /// Raw bytes [lo, hi) of an entry into a writable buffer, decoding only needed chunks.
    /// `verify`: check uncompressed bytes too (only the crc blocks holding the range, when
    /// the value has them; else the whole value); compressed chunks are always checked.
    #[pyo3(signature = (key, lo, hi, out, verify=false))]
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
        // A range of an uncompressed value without crc blocks is checked against the whole
        // value's crc, so the work is bounded by the stored value, not the range: watch only
        // large ones (a helper thread per call costs ~60 us, ten times a small slice's work).
        let reader = &self.inner;
        let work = || {
            if verify {
                reader.read_range_checked(&e, lo, hi, dst)
            } else {
                reader.read_range(&e, lo, hi, dst)
            }
        };
        if e.stored_len.max(hi.saturating_sub(lo)) >= WATCH_MIN {
            nogil_cancellable(py, work)
        } else {
            nogil(py, work)
        }
    }

    /// Raw bytes `[los[i], his[i])` of `keys[i]` into `outs[i]` for every `i`, in parallel,
    /// as `read_range` reads one (GIL released). Buffers must not overlap.
    #[pyo3(signature = (keys, los, his, outs, verify=false))]
    fn read_ranges_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        los: Vec<u64>,
        his: Vec<u64>,
        mut outs: Vec<PyBuffer<u8>>,
        verify: bool,
    ) -> PyResult<()> {
        use rayon::prelude::*;
        let (entries, mut dsts) =
            range_args(py, &keys, &los, &his, &mut outs, |k| self.entry(py, k))?;
        let reader = &self.inner;
        nogil_cancellable(py, || {
            shardpoint_core::threads::install(|| {
                entries
                    .par_iter()
                    .zip(dsts.par_iter_mut())
                    .try_for_each(|((e, lo, hi), o)| {
                        if verify {
                            reader.read_range_checked(e, *lo, *hi, o)
                        } else {
                            reader.read_range(e, *lo, *hi, o)
                        }
                    })
            })
        })
    }

    /// Statistics of many tensor entries (`shardpoint_core::stats`): entries in parallel and,
    /// inside each, its chunks, every chunk decoded into a reused per-thread buffer and folded
    /// there (no copy of a whole value), every value's crc32c checked; GIL released. One
    /// [`crate::stats::StatsTuple`] per key, in order. Non-tensor entries are refused.
    fn stats(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<crate::stats::StatsTuple>> {
        use rayon::prelude::*;
        use shardpoint_core::format::Kind;
        let entries: Vec<Entry<'_>> = keys
            .iter()
            .map(|k| self.entry(py, k))
            .collect::<PyResult<_>>()?;
        if let Some(e) = entries.iter().find(|e| e.kind != Kind::Tensor) {
            return Err(crate::invalid(
                py,
                format!(
                    "key {:?} holds a {} value, not a tensor",
                    e.key,
                    e.kind.name()
                ),
            ));
        }
        let reader = &self.inner;
        let all = nogil(py, || {
            shardpoint_core::threads::install(|| {
                entries
                    .par_iter()
                    .map(|e| shardpoint_core::stats::entry_stats(reader, e))
                    .collect::<shardpoint_core::Result<Vec<_>>>()
            })
        })?;
        Ok(all.iter().map(crate::stats::stats_tuple).collect())
    }

    /// Check the crc32c(s) of one key's stored bytes (pread; GIL released).
    fn verify_key(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        let e = self.entry(py, key)?;
        nogil_cancellable(py, || self.inner.verify_entry(&e))
    }

    /// Check every checksum and invariant (parallel, GIL released).
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        nogil_cancellable(py, || self.inner.verify())
    }

    /// Re-hash every shard against the digest manifest of the index (GIL released). `None`
    /// when the checkpoint records no digest; else (algorithm, root digest of the index,
    /// files hashed, bytes, [(shard path, what differs)]).
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
            .map(|s| (s.path.clone(), s.len()))
            .collect()
    }

    /// Whether this is a single-file checkpoint (FORMAT.md §10).
    fn is_single_file(&self) -> bool {
        self.inner.is_single_file()
    }

    /// The file holding the index (`P.index`, or the single file).
    fn index_path(&self) -> PathBuf {
        self.inner.index_file().to_path_buf()
    }

    /// The index header's `format_version` (FORMAT.md §3, §3.1.1): 1, or 2 for an index
    /// naming hashed shards (what `shardpoint info` prints).
    fn format_version(&self) -> u32 {
        self.inner.index().format_version()
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
