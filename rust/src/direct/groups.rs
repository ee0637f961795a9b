//! Which pieces of a cold read share one `O_DIRECT` read.
//!
//! Why: the engine reads a piece per device request, [`super::DIRECT_DEPTH`] in flight, so a
//! small value costs a whole round trip. 20,000 values of 2 KiB (40 MB) read cold at 0.08 GB/s
//! that way, against 0.39-0.48 buffered, where the kernel's read-ahead fetches many
//! neighbours per request (docs/SERVING.md, "Issue 41 (twentieth round)"). Small pieces that
//! lie close together in one file are read with one request over their extent into a bounce
//! buffer and copied out: a copy of a small value costs less than the request it saves.
//! Pieces of large values keep their own reads (in place where congruent, see the module doc
//! of `direct`), even their small first and last pieces: grouped, they would be copied, and
//! a group of them would need the worker's large bounce buffer (a weights iterator's model,
//! whose norms lie between large tensors, then held 8 more MiB per worker: peak RSS over the
//! model 256 -> 324 MB in `bench_serving`).

use std::ops::Range;

/// A piece of a value shorter than this may share one read with its neighbours in the file.
pub(crate) const SMALL_VALUE: u64 = 1 << 20;
/// A neighbour starting more than this past the group's end starts a new group: the gap
/// would be read for nothing (what the compressed route's blocks allow too).
pub(crate) const MAX_GAP: u64 = 64 << 10;

/// Cut `pieces` (`(file index, offset, length, length of the whole value)`, sorted by file
/// and offset) into groups, each a range of indices read with one request: a run of pieces of
/// small values of one file, each
/// starting within [`MAX_GAP`] of the group's end so far, whose aligned extent fits in `cap`
/// bytes; any other piece is a group alone.
pub(crate) fn groups(pieces: &[(usize, u64, u64, u64)], cap: u64) -> Vec<Range<usize>> {
    use super::{align_down, align_up};
    let mut out: Vec<Range<usize>> = Vec::new();
    // the open group: its first index, file, aligned start and end so far
    let mut open: Option<(usize, usize, u64, u64)> = None;
    for (i, &(fi, off, len, whole)) in pieces.iter().enumerate() {
        let end = off.saturating_add(len);
        let small = whole < SMALL_VALUE;
        if let Some((first, gfi, lo, hi)) = open {
            let joins = small
                && fi == gfi
                && off <= hi.saturating_add(MAX_GAP)
                && align_up(end.max(hi)) - lo <= cap;
            if joins {
                open = Some((first, gfi, lo, hi.max(end)));
                continue;
            }
            out.push(first..i);
            open = None;
        }
        if small && align_up(end) - align_down(off) <= cap {
            open = Some((i, fi, align_down(off), end));
        } else {
            out.push(i..i + 1);
        }
    }
    if let Some((first, ..)) = open {
        out.push(first..pieces.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_neighbours_of_one_file_share_a_read_and_large_ones_do_not() {
        let k = 1u64 << 10;
        let m = SMALL_VALUE;
        let pieces = [
            (0, 0, 2 * k, 2 * k),           // group A
            (0, 2 * k, 2 * k, 2 * k),       // A: adjacent
            (0, 4 * k + 100, 2 * k, 2 * k), // A: a small gap
            (0, 200 * k, 2 * k, 2 * k),     // B: past MAX_GAP
            (0, 202 * k, m, m),             // large: alone
            (0, 202 * k + m, 2 * k, 3 * m), // the small last piece of a large value: alone
            (0, 204 * k + m, 2 * k, 2 * k), // C
            (1, 206 * k + m, 2 * k, 2 * k), // D: another file
            (1, 208 * k + m, 2 * k, 2 * k), // D
        ];
        assert_eq!(
            groups(&pieces, 8 << 20),
            vec![0..3, 3..4, 4..5, 5..6, 6..7, 7..9]
        );
    }

    #[test]
    fn a_group_stops_where_its_aligned_extent_would_pass_the_buffer() {
        let pieces: Vec<_> = (0..10)
            .map(|i| (0usize, i * 4096 + 10, 4000u64, 4000u64))
            .collect();
        // each piece's aligned extent is one page, a neighbour adds one more
        let got = groups(&pieces, 3 * 4096);
        assert_eq!(got, vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(
            groups(&[(0, 0, 100, 100)], 0),
            vec![0..1],
            "alone where it cannot fit"
        );
    }

    #[test]
    fn overlapping_pieces_join_the_same_group() {
        // the same range read into two destinations, and one inside another
        let pieces = [
            (0, 0, 4096, 4096),
            (0, 0, 4096, 4096),
            (0, 100, 50, 50),
            (0, 8192, 10, 10),
        ];
        assert_eq!(groups(&pieces, 1 << 20), vec![0..4]);
    }
}
