//! The merge's two big buffers, kept between the merges of one process (docs/SCALE.md, "Kept
//! buffers"): the bytes of the partial indexes read from local files (one arena, not a fresh
//! `Vec` per partial) and the merged index being built.
//!
//! Why: at 4,096 ranks × 100 tensors these are 20 MB and 21 MB. Allocated fresh for every
//! merge, each of their pages is faulted in and zeroed by the kernel on first touch (about
//! 10,000 faults per merge, and in a process with many threads glibc hands large
//! allocations out as fresh mappings every time): about half of an unchanged save's
//! coordinator CPU was that system time. Kept, the second and later merges write into memory
//! that is already mapped.
//!
//! What must stay true: nothing kept is ever read as data. The arena's stale bytes lie only
//! outside the ranges a merge has just filled from files (every range handed out is filled by
//! `read_exact` before any view is opened on it), and the index buffer is cleared and zeroed
//! by [`crate::index::SortedIndexBuilder::with_shape_in`] before it is written. A merge that
//! fails (a hostile partial) hands its arena back all the same (the next merge overwrites
//! whatever it left) and drops its index buffer (the next merge allocates one).
//!
//! Bounded: a buffer whose contents exceed [`KEEP_MAX`] is freed, not kept, so one huge
//! merge does not pin its memory for the life of the process (larger saves allocate per merge
//! as before); at most two buffers are kept. Two merges running at once each take what is
//! there (the other starts from empty buffers), and the larger buffer is what is kept.

use crate::error::{Error, Result};
use crate::index::IndexSource;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

/// The largest buffer kept (capacity), each of the two: 32 MiB, 64 MiB in all. Enough for a
/// 4,096 × 100 save (partials 20 MB, index 21 MB); larger saves allocate per merge as before.
pub(super) const KEEP_MAX: usize = 32 << 20;

struct Kept {
    arena: Vec<u8>,
    index: Vec<u8>,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    arena: Vec::new(),
    index: Vec::new(),
});

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    // a poisoned lock only guards spare memory, never read as data
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kept index buffer (empty if none): its capacity is what is reused.
pub(crate) fn take_index() -> Vec<u8> {
    std::mem::take(&mut kept().index)
}

/// Keep `buf` for the next merge's index, unless it holds more than [`KEEP_MAX`] bytes or a
/// larger one is already kept.
pub(super) fn keep_index(buf: Vec<u8>) {
    keep(buf, |k| &mut k.index);
}

/// Keep `buf` in the slot `slot` picks if it is larger than what is there and its contents
/// fit [`KEEP_MAX`] (spare capacity beyond that is given back to the allocator first: a
/// shrink, not a copy, for buffers this large).
fn keep(mut buf: Vec<u8>, slot: impl FnOnce(&mut Kept) -> &mut Vec<u8>) {
    if buf.len() > KEEP_MAX {
        return;
    }
    if buf.capacity() > KEEP_MAX {
        buf.shrink_to(KEEP_MAX);
    }
    let mut k = kept();
    let s = slot(&mut k);
    if buf.capacity() > s.capacity() {
        *s = buf;
    }
}

/// The buffer the partial indexes of one merge are read into, one after the other: each
/// partial goes into the next free bytes while it fits, and is validated right after its read
/// (while its bytes are still in cache; reading all of them first and validating afterwards
/// cost a cache miss per entry). The buffer is never reallocated during a merge (views borrow
/// it): a partial that does not fit gets a buffer of its own, and the arena grows afterwards,
/// for the next merge, to what this one needed.
pub(super) struct Arena {
    /// Its length is what is initialised (zeroed once, then overwritten by reads): a reused
    /// arena costs neither page faults nor zeroing.
    buf: Vec<u8>,
}

/// The bytes of one partial index: in the arena, or its own buffer when it did not fit.
pub(super) enum PartialBytes<'a> {
    Arena(&'a [u8]),
    Own(Vec<u8>),
}

impl IndexSource for PartialBytes<'_> {
    fn size(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn at(&self, off: u64, len: u64) -> Result<&[u8]> {
        // IndexView asks only for ranges inside `size()` (the IndexSource contract)
        Ok(&self.as_slice()[off as usize..(off + len) as usize])
    }
}

impl PartialBytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            PartialBytes::Arena(b) => b,
            PartialBytes::Own(v) => v,
        }
    }
}

/// Reads files into the free part of an [`Arena`]; see [`Arena::reader`].
pub(super) struct ArenaReader<'a> {
    rest: &'a mut [u8],
    /// Bytes of all the files read so far (what the arena should hold next time).
    needed: usize,
}

impl Arena {
    /// The kept arena (or a new, empty one).
    pub(super) fn take() -> Self {
        Arena {
            buf: std::mem::take(&mut kept().arena),
        }
    }

    /// A reader filling the arena from its start. With an empty arena (the process's first
    /// merge) the arena is first sized for `expect` bytes; a merge that needs more than the
    /// arena holds reads the rest into buffers of their own.
    pub(super) fn reader(&mut self, expect: usize) -> ArenaReader<'_> {
        if self.buf.is_empty() && expect <= KEEP_MAX && self.buf.try_reserve_exact(expect).is_ok() {
            self.buf.resize(expect, 0);
        }
        ArenaReader {
            rest: &mut self.buf,
            needed: 0,
        }
    }

    /// Hand the buffer back for the next merge, grown to `needed` bytes (what the last
    /// reader read) if that is more and fits [`KEEP_MAX`]; see [`KEEP_MAX`].
    pub(super) fn give_back(mut self, needed: usize) {
        self.grow(needed);
        keep(self.buf, |k| &mut k.arena);
    }

    /// Grow to `needed` bytes if that is more and fits [`KEEP_MAX`] (else stay as is).
    fn grow(&mut self, needed: usize) {
        if needed > self.buf.len()
            && needed <= KEEP_MAX
            && self.buf.try_reserve_exact(needed - self.buf.len()).is_ok()
        {
            self.buf.resize(needed, 0);
        }
    }
}

impl<'a> ArenaReader<'a> {
    /// Bytes of all the files read so far.
    pub(super) fn needed(&self) -> usize {
        self.needed
    }

    /// Read the whole file at `path` (open, fstat, one read, close) into the next free bytes
    /// of the arena, or into a buffer of its own if they are too few. `what` says what
    /// failed, for the error.
    pub(super) fn read_file(
        &mut self,
        path: &Path,
        what: &'static str,
    ) -> Result<PartialBytes<'a>> {
        let mut f = File::open(path).map_err(|e| Error::io(path, what, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, what, e))?.len();
        let too_large = || {
            Error::InvalidArgument(format!(
                "{}: partial index of {len} bytes is too large to merge in memory",
                path.display()
            ))
        };
        let n = usize::try_from(len).map_err(|_| too_large())?;
        self.needed = self.needed.saturating_add(n);
        // a file truncated since its fstat is an error here; one that grew is read as it was
        // (its own header and crcs then judge it, as for any partial)
        if n <= self.rest.len() {
            let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(n);
            self.rest = tail;
            f.read_exact(head).map_err(|e| Error::io(path, what, e))?;
            return Ok(PartialBytes::Arena(head));
        }
        let mut own = Vec::new();
        own.try_reserve_exact(n).map_err(|_| too_large())?;
        own.resize(n, 0);
        f.read_exact(&mut own)
            .map_err(|e| Error::io(path, what, e))?;
        Ok(PartialBytes::Own(own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of the given sizes, each byte naming its file and position.
    fn files(dir: &Path, sizes: &[usize]) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        std::fs::create_dir_all(dir).unwrap();
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let p = dir.join(format!("f{i}"));
                let b: Vec<u8> = (0..n).map(|j| (i * 31 + j * 7) as u8 | 1).collect();
                std::fs::write(&p, &b).unwrap();
                (p, b)
            })
            .collect()
    }

    #[test]
    fn a_reused_arena_hands_out_exactly_each_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Arena { buf: Vec::new() };
        // a first merge that overflows the arena sized for it, a second (larger) that fits
        // the grown arena, a third (smaller) whose bytes lie over the stale bytes of both
        let rounds: [&[usize]; 3] = [&[5000, 1, 70_000, 0, 3], &[70_004, 5000], &[10, 2, 4096]];
        for (round, sizes) in rounds.into_iter().enumerate() {
            let fs = files(&dir.path().join(round.to_string()), sizes);
            let mut r = a.reader(6000);
            let got: Vec<_> = fs
                .iter()
                .map(|(p, _)| r.read_file(p, "read").unwrap())
                .collect();
            let needed = r.needed();
            assert_eq!(needed, sizes.iter().sum::<usize>());
            for ((_, want), b) in fs.iter().zip(&got) {
                assert_eq!(b.as_slice(), &want[..]);
            }
            let own = got
                .iter()
                .filter(|b| matches!(b, PartialBytes::Own(_)))
                .count();
            assert_eq!(
                own,
                [1, 0, 0][round],
                "round {round}: read into buffers of their own"
            );
            drop(got);
            a.grow(needed); // what give_back does before keeping it
            assert!(a.buf.len() >= needed);
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Arena { buf: Vec::new() };
        let mut r = a.reader(100);
        let missing = dir.path().join("gone");
        let err = r.read_file(&missing, "read partial index").err().unwrap();
        assert!(err.to_string().contains("gone"), "{err}");
    }

    #[test]
    fn only_buffers_up_to_the_bound_are_kept() {
        // Other tests' merges may take the kept buffer meanwhile, so only what they cannot
        // undo is asserted: a buffer beyond the bound is never what is kept.
        keep_index(Vec::with_capacity(KEEP_MAX + 4096));
        assert!(
            take_index().capacity() <= KEEP_MAX,
            "spare capacity given back"
        );
        keep_index(vec![0u8; KEEP_MAX + 1]);
        assert!(
            take_index().len() <= KEEP_MAX,
            "contents beyond the bound: not kept"
        );
    }
}
