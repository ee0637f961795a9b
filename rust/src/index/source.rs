//! Where an index's bytes come from: memory (small indexes, read whole at open; remote indexes)
//! or the file itself, read in pages on first use ([`LazyIndex`]).
//!
//! Why pages on demand: reading a large index whole at open made open O(entries) (2.2 ms at a
//! million keys), and mapping it instead turns a file truncated under the reader into a SIGBUS.
//! A [`LazyIndex`] reads with `pread` only the pages a lookup touches, so open costs a header and
//! a footer read whatever the key count, and truncation is an ordinary error naming the file and
//! offset.

use crate::error::{Error, Result};
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Byte access to an index. Every range asked for lies inside `size()`: [`super::IndexView`]
/// checks the section bounds against the size at open, before it asks for anything else.
pub trait IndexSource {
    /// Length of the index in bytes.
    fn size(&self) -> u64;

    /// The bytes `[off, off + len)`.
    fn at(&self, off: u64, len: u64) -> Result<&[u8]>;

    /// Whether every byte is already in memory (then whole-table checks cost no I/O and are
    /// done at open, as they always were for small indexes).
    fn resident(&self) -> bool {
        true
    }
}

impl IndexSource for Vec<u8> {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        Ok(&self[off as usize..(off + len) as usize])
    }
}

impl IndexSource for &[u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        Ok(&self[off as usize..(off + len) as usize])
    }
}

/// `n` atomic flags, all 0, from zeroed memory: large counts cost no per-flag initialisation
/// (the allocator hands out zero pages), which keeps open O(1) in the key count.
pub(crate) fn zeroed_flags(n: usize) -> Vec<AtomicU8> {
    let mut v = std::mem::ManuallyDrop::new(vec![0u8; n]);
    // SAFETY: `AtomicU8` has the same size, alignment and bit validity as `u8` (std docs), so
    // a zeroed `Vec<u8>`'s allocation is a valid `Vec<AtomicU8>` of the same length and
    // capacity; the original vector is never dropped (ManuallyDrop), so the allocation has
    // exactly one owner.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<AtomicU8>(), v.len(), v.capacity()) }
}

/// Bytes read per page: one `pread` brings in at least this much (a block of 64 entry records
/// is 2,560 bytes; its keys and aux data are usually smaller).
const PAGE: u64 = 16 << 10;

/// An index read from its file page by page, on first use.
///
/// Invariants that make the shared buffer sound: a page is written exactly once, by the thread
/// holding `fill`, while its flag is 0; its flag is then set to 1 with `Release`; slices are
/// only ever made over pages whose flag was seen as 1 with `Acquire`. So no slice handed out
/// overlaps a write, and every slice sees the completed write.
pub struct LazyIndex {
    file: File,
    path: PathBuf,
    /// Where the index starts in `file` (0 for `P.index`; the index region of a single file).
    base: u64,
    len: u64,
    /// Points into `mem`; all access goes through it, under the invariants above.
    buf: NonNull<u8>,
    /// `len` bytes, left uninitialised: a page is only ever read after it was loaded, so
    /// nothing needs clearing (clearing made open O(len)), and the allocator may hand back
    /// memory it already has (a fresh mapping costs a page fault per 4 KiB on first touch).
    /// Freed through `buf` in Drop.
    mem: std::marker::PhantomData<Box<[MaybeUninit<u8>]>>,
    /// Per page: 1 once its bytes are in `buf`.
    loaded: Vec<AtomicU8>,
    fill: Mutex<()>,
}

// SAFETY: `buf` is the allocation of a `Box<[MaybeUninit<u8>]>` of `len` bytes owned by this
// value (freed in Drop), accessed only under the invariants above: writes
// are serialised by `fill` and never overlap a slice handed out.
unsafe impl Send for LazyIndex {}
// SAFETY: as above; `&LazyIndex` hands out only slices of loaded, never-again-written pages.
unsafe impl Sync for LazyIndex {}

impl LazyIndex {
    /// Index bytes `[base, base + len)` of `file` (`path` names it in errors). Reads nothing:
    /// the memory is reserved zeroed (untouched pages cost no memory) and filled on demand.
    pub fn new(file: File, path: &Path, base: u64, len: u64) -> Result<Self> {
        let size = usize::try_from(len).map_err(|_| {
            Error::corrupt(path, base, format!("index of {len} bytes is too large"))
        })?;
        // The size is the file's real size (fstat), not a number read from it; still, a failed
        // allocation is an error, not an abort.
        let mut v: Vec<MaybeUninit<u8>> = Vec::new();
        v.try_reserve_exact(size).map_err(|_| {
            Error::io(
                path,
                "reserve memory for the index",
                std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            )
        })?;
        // SAFETY: capacity >= size was reserved; MaybeUninit needs no initialisation.
        unsafe { v.set_len(size) };
        let raw = Box::into_raw(v.into_boxed_slice());
        let buf = NonNull::new(raw.cast::<u8>()).expect("a Box pointer is never null");
        Ok(LazyIndex {
            file,
            path: path.to_path_buf(),
            base,
            len,
            buf,
            mem: std::marker::PhantomData,
            loaded: zeroed_flags(len.div_ceil(PAGE) as usize),
            fill: Mutex::new(()),
        })
    }

    fn is_loaded(&self, page: usize) -> bool {
        self.loaded[page].load(Ordering::Acquire) == 1
    }

    /// Read every page of `[first, last]` not yet loaded, one `pread` per run of missing pages.
    fn load(&self, first: usize, last: usize) -> Result<()> {
        // A poisoned lock only means another reader's pread failed: the flags still say which
        // pages are complete.
        let _g = self.fill.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = first;
        while p <= last {
            if self.is_loaded(p) {
                p += 1;
                continue;
            }
            let mut q = p;
            while q < last && !self.is_loaded(q + 1) {
                q += 1;
            }
            let lo = p as u64 * PAGE;
            let hi = ((q as u64 + 1) * PAGE).min(self.len);
            // SAFETY: pages p..=q are not loaded, so no slice overlaps them, and only this
            // thread (holding `fill`) writes; the range lies inside the allocation.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    self.buf.as_ptr().add(lo as usize),
                    (hi - lo) as usize,
                )
            };
            self.file
                .read_exact_at(dst, self.base + lo)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Error::corrupt(
                        &self.path,
                        self.base + lo,
                        format!(
                            "index is shorter than when it was opened (truncated while open): \
                             bytes [{}, {}) are missing",
                            self.base + lo,
                            self.base + hi
                        ),
                    ),
                    _ => Error::io(&self.path, "read index", e),
                })?;
            for flag in &self.loaded[p..=q] {
                flag.store(1, Ordering::Release);
            }
            p = q + 1;
        }
        Ok(())
    }
}

impl Drop for LazyIndex {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(
            self.buf.as_ptr().cast::<MaybeUninit<u8>>(),
            self.len as usize,
        );
        // SAFETY: `buf`/`len` came from `Box::into_raw` of this very boxed slice in `new`; no
        // slice handed out outlives `&self`.
        drop(unsafe { Box::from_raw(raw) });
    }
}

impl IndexSource for LazyIndex {
    fn size(&self) -> u64 {
        self.len
    }

    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            // Unreachable through IndexView (sections are bounds-checked at open); an error,
            // not a panic, keeps a future caller's mistake from aborting the process.
            return Err(Error::corrupt(
                &self.path,
                self.base + off,
                format!("index range [{off}, +{len}) leaves the index"),
            ));
        }
        if len == 0 {
            return Ok(&[]);
        }
        let (first, last) = ((off / PAGE) as usize, ((off + len - 1) / PAGE) as usize);
        if !(first..=last).all(|p| self.is_loaded(p)) {
            self.load(first, last)?;
        }
        // SAFETY: every page of the range is loaded (written once, published with Release,
        // seen here with Acquire) and is never written again; the range is inside the buffer.
        Ok(
            unsafe {
                std::slice::from_raw_parts(self.buf.as_ptr().add(off as usize), len as usize)
            },
        )
    }

    fn resident(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("idx");
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        (d, p)
    }

    #[test]
    fn pages_load_on_demand_and_match_the_file() {
        let data: Vec<u8> = (0..(PAGE * 5 + 123)).map(|i| (i * 7 % 251) as u8).collect();
        let (_d, p) = file_with(&data);
        let lz = LazyIndex::new(File::open(&p).unwrap(), &p, 0, data.len() as u64).unwrap();
        assert!(!lz.is_loaded(0));
        // a range straddling pages 1..=2 loads just those
        let off = PAGE + 100;
        assert_eq!(
            lz.at(off, PAGE).unwrap(),
            &data[off as usize..(off + PAGE) as usize]
        );
        let flags: Vec<bool> = (0..6).map(|p| lz.is_loaded(p)).collect();
        assert_eq!(flags, [false, true, true, false, false, false]);
        // the whole thing, including the short last page
        assert_eq!(lz.at(0, data.len() as u64).unwrap(), &data[..]);
        assert!(lz.at(data.len() as u64, 1).is_err());
    }

    #[test]
    fn a_base_offset_reads_the_region() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let (_d, p) = file_with(&data);
        let lz = LazyIndex::new(File::open(&p).unwrap(), &p, 1000, 50_000).unwrap();
        assert_eq!(lz.at(10, 40_000).unwrap(), &data[1010..41_010]);
    }

    #[test]
    fn truncation_after_open_is_an_error_naming_file_and_offset() {
        let data = vec![5u8; (PAGE * 4) as usize];
        let (_d, p) = file_with(&data);
        let lz = LazyIndex::new(File::open(&p).unwrap(), &p, 0, data.len() as u64).unwrap();
        lz.at(0, 10).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(PAGE * 2)
            .unwrap();
        let e = lz.at(PAGE * 3, 10).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Corrupt { .. }), "{msg}");
        assert!(
            msg.contains(&p.display().to_string()) && msg.contains("truncated"),
            "{msg}"
        );
        // what was loaded before stays readable
        assert_eq!(lz.at(0, 10).unwrap(), &data[..10]);
    }

    #[test]
    fn concurrent_first_touches_all_see_the_bytes() {
        let data: Vec<u8> = (0..(PAGE * 64)).map(|i| (i % 241) as u8).collect();
        let (_d, p) = file_with(&data);
        let lz = LazyIndex::new(File::open(&p).unwrap(), &p, 0, data.len() as u64).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (lz, data) = (&lz, &data);
                s.spawn(move || {
                    for k in 0..64u64 {
                        let off = ((k * 7 + t * 13) % 64) * PAGE + t;
                        let len = 5000.min(data.len() as u64 - off);
                        assert_eq!(
                            lz.at(off, len).unwrap(),
                            &data[off as usize..(off + len) as usize]
                        );
                    }
                });
            }
        });
    }

    #[test]
    fn zeroed_flags_are_zero() {
        let v = zeroed_flags(100_000);
        assert_eq!(v.len(), 100_000);
        assert!(v.iter().all(|f| f.load(Ordering::Relaxed) == 0));
    }
}
