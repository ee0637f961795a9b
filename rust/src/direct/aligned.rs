//! Page-aligned buffers for `O_DIRECT` reads: small pages faulted in on touch, or huge pages.

use crate::error::{Error, Result};

/// A zeroed, page-aligned buffer (what `O_DIRECT` reads into): an anonymous mapping of its own,
/// so only the pages a read touches are ever faulted in. Not `alloc_zeroed`: after glibc's
/// dynamic mmap threshold rises, an 8 MiB `calloc` comes from a thread's heap and is cleared
/// whole on every call, although in-place reads touch only a head and a tail block of it: one
/// 8 MiB clearing per worker per call cost a 1 GB load 260k page faults (docs/SERVING.md,
/// "Issue 41 (seventh round)").
pub(crate) struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the value (unmapped once, in `drop`); shared references only
// read it (`as_slice`), writes need `&mut`.
unsafe impl Send for Aligned {}
// SAFETY: as above.
unsafe impl Sync for Aligned {}

/// Bytes of a transparent huge page (x86-64 and arm64 with 4 KiB pages).
pub(crate) const HUGE: usize = 2 << 20;

impl Aligned {
    /// `len` bytes on small pages: only the pages a read touches are faulted in.
    pub(crate) fn new(len: usize) -> Result<Aligned> {
        let len = len.max(1);
        let ptr = map(len)?;
        Ok(Aligned { ptr, len })
    }

    /// `len` bytes starting at a huge-page boundary, asking the kernel for transparent huge
    /// pages (`MADV_HUGEPAGE`; a hint it may ignore). Why: the block layer gives a direct
    /// read one segment per physically contiguous run of its memory, so into small pages a
    /// 4 MiB read is 1024 segments, and on this project's VM (virtio) a device read costs per
    /// segment: `O_DIRECT` into small pages ran 0.90-0.92 GB/s, into huge pages 2.52-2.61 GB/s
    /// in the same run (buffered reads, whose page cache holds large folios, 1.3-1.9 GB/s;
    /// docs/SERVING.md, "Issue 41 (tenth round)"). A huge page is also faulted in at once
    /// (one fault and a 2 MiB clearing): for buffers used whole, as the engine's are.
    pub(crate) fn huge(len: usize) -> Result<Aligned> {
        let len = len.max(1).div_ceil(HUGE) * HUGE;
        // map a huge page more, then unmap the unaligned head and the tail beyond `len`
        let raw = map(len + HUGE)?;
        let lead = (HUGE - raw as usize % HUGE) % HUGE;
        // SAFETY: both ranges lie inside the mapping just made (`lead < HUGE`), and nothing
        // refers to them; the part kept is `[raw + lead, raw + lead + len)`.
        unsafe {
            if lead > 0 {
                libc::munmap(raw.cast(), lead);
            }
            libc::munmap(raw.add(lead + len).cast(), HUGE - lead);
        }
        // SAFETY: as above; the range kept.
        let ptr = unsafe { raw.add(lead) };
        // SAFETY: advice on a range this value owns; failure (no THP support) leaves small
        // pages, which are still correct.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Aligned { ptr, len })
    }

    /// Bytes mapped (a whole number of huge pages for [`Aligned::huge`]).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    #[cfg(test)]
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped by self, initialized (zero pages) by the kernel.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as `bytes`; no `&mut` can coexist with this borrow.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` or `huge` with this length, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A private anonymous mapping of `len` bytes (zeroed by the kernel on first touch).
fn map(len: usize) -> Result<*mut u8> {
    // SAFETY: a private anonymous mapping (no fd, no address hint); checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::InvalidArgument(format!(
            "cannot map a {len}-byte read buffer: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(ptr.cast())
}
