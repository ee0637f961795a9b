//! Buffers crossing the boundary: zero-copy views of shard mappings and owned decoded bytes
//! exported through the buffer protocol, fallible allocation, borrowing Python buffers.

use pyo3::buffer::PyBuffer;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::Arc;

/// A buffer handed to Python: a region of a shard's copy-on-write mapping, or owned bytes.
pub(crate) enum Store {
    Mapped {
        map: Arc<memmap2::MmapMut>,
        off: usize,
        len: usize,
    },
    Owned(Vec<u8>),
    /// A region of an arena shared by the small values of one batch load (see [`Arena`]).
    Shared {
        arena: Arc<Arena>,
        off: usize,
        len: usize,
    },
}

/// One allocation holding the decoded small values of a batch load, each at a 64-byte aligned
/// offset. Why: values below [`ARENA_MAX`] each got their own allocation (one allocator call
/// and one mapping per value, for a model of many small tensors); one arena is one call.
/// The arena is freed when the last array viewing it is; keeping one small value alive keeps
/// the batch's small values' memory (documented on `Reader.load`).
pub(crate) struct Arena {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the arena owns its allocation exclusively; the regions handed out are disjoint and
// written only through the buffer protocol, like any Python-owned buffer.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// Take ownership of a zeroed allocation (from [`alloc_zeroed`]).
    pub(crate) fn new(v: Vec<u8>) -> Arena {
        let mut v = std::mem::ManuallyDrop::new(v);
        debug_assert_eq!(v.len(), v.capacity());
        Arena {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: ptr/len/capacity are those of the Vec given to `new` (len == capacity).
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.len) });
    }
}

/// Round `n` up to the arena's slot alignment (64 bytes: every dtype, and a cache line).
pub(crate) fn arena_align(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// Writable bytes exposed through the buffer protocol (numpy wraps them without a copy).
/// Writes to a mapped region go to private copy-on-write pages, never to the file.
#[pyclass(module = "shardpoint._core", frozen)]
pub(crate) struct Buffer {
    pub(crate) store: Store,
}

impl Buffer {
    fn ptr_len(&self) -> (*mut u8, usize) {
        match &self.store {
            Store::Mapped { map, off, len } => {
                (unsafe { (map.as_ptr() as *mut u8).add(*off) }, *len)
            }
            Store::Owned(v) => (v.as_ptr() as *mut u8, v.len()),
            // SAFETY: off + len <= arena.len (set by the loader that carved the slots).
            Store::Shared { arena, off, len } => (unsafe { arena.ptr.add(*off) }, *len),
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

/// Borrow a writable, C-contiguous byte buffer's memory mutably (for use with the GIL
/// released). The slice comes from the buffer's raw pointer, never from a shared borrow.
pub(crate) fn bytes_of_mut<'b>(
    py: Python<'_>,
    buf: &'b mut PyBuffer<u8>,
) -> PyResult<&'b mut [u8]> {
    if buf.readonly() {
        return Err(crate::invalid(py, "output buffer is read-only"));
    }
    if !buf.is_c_contiguous() {
        return Err(crate::invalid(py, "output buffer is not C-contiguous"));
    }
    // SAFETY: the exporter said the memory is writable and contiguous; the PyBuffer pins it
    // until dropped and the `&mut` borrow of `buf` keeps this the only slice made from it here.
    // Concurrent mutation by another Python thread is the caller's race, as with any consumer.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut u8, buf.len_bytes()) })
}

/// Decoded values below this size share one arena per batch load; larger ones get their own
/// allocation.
///
/// No `MADV_HUGEPAGE` hint on fresh outputs (there was one, for outputs >= 8 MiB): a huge
/// page's first touch clears 2 MiB inside the decoding thread's page fault, and on the
/// reference VM (THP "madvise") that made `load_file` of 800 MB of zstd fp32 (50 values of
/// 16 MiB) take 1.24-3.10 s instead of 0.81-0.92 s with 4 KiB pages, and 1.73-2.85 s instead
/// of 0.91-0.95 s with torch imported (fresh process each, side by side; issue 25's notes).
/// Systems with THP "always" still get huge pages from the kernel.
pub(crate) const ARENA_MAX: usize = 8 << 20;

/// A zeroed buffer of `n` bytes, or `MemoryError`: `n` comes from the file (a hostile index can
/// declare a 1 TiB tensor), so an allocation failure must not abort the interpreter. Large
/// zeroed allocations are lazily mapped pages, so nothing is touched before decoding.
pub(crate) fn alloc_zeroed(n: u64) -> PyResult<Vec<u8>> {
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
pub(crate) fn bytes_of<'b>(py: Python<'_>, buf: &'b PyBuffer<u8>) -> PyResult<&'b [u8]> {
    if !buf.is_c_contiguous() {
        return Err(crate::invalid(py, "buffer is not C-contiguous"));
    }
    // SAFETY: the PyBuffer keeps the exporter alive and its memory pinned until dropped; the
    // caller keeps it alive for as long as the slice is used. Concurrent mutation by another
    // Python thread is the caller's race, as with any buffer consumer.
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) })
}
