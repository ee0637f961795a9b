//! Order-0 canonical Huffman coding of byte planes (FORMAT.md §5.1), written for speed on the
//! exponent plane of float weights: code lengths limited to [`MAX_LEN`] bits so one 2048-entry
//! table lookup decodes a symbol, and [`STREAMS`] independent bit streams per plane so the
//! decoder's table lookups overlap (a single stream is bound by load latency, not throughput).
//!
//! Bit order: LSB first. Each stream is a little-endian bit string; symbol `i` of a stream
//! occupies the next `len` bits, least significant bit first, holding the bit-reversed canonical
//! code. So the decoder peeks the next [`MAX_LEN`] bits with one unaligned 64-bit load and a
//! mask, and the table index is those bits.
//!
//! Decoding is total on hostile input: every length and table is checked, reads never leave the
//! segment, the output is exactly the plane length, and a stream that would read past its end is
//! an error.

/// Longest code in bits (the decode table has `1 << MAX_LEN` entries).
pub const MAX_LEN: u32 = 11;

/// Independent bit streams per coded plane.
pub const STREAMS: usize = 8;
/// Bytes of the stream-size table: the sizes of streams `0 .. STREAMS - 1` (the last takes the
/// rest of the segment).
const SIZES_LEN: usize = 4 * (STREAMS - 1);
const TABLE: usize = 1 << MAX_LEN;
/// Table lookups per refill in the fast loop: a lane's word keeps 56 stream bits (under its
/// sentinel bit), enough for 5 lookups of at most 11 bits.
const PER_REFILL: usize = 5;
/// Stream bits a lane's word holds after a refill; the sentinel bit sits just above them.
const LANE_BITS: u32 = 56;
const _: () = assert!(PER_REFILL as u32 * MAX_LEN <= LANE_BITS);
/// Streams decoded in lockstep by the fast loop (a divisor of [`STREAMS`]).
const LANES: usize = 8;

multiversion! {
/// Byte histogram of `data`: eight interleaved tables, so that runs of equal bytes (the
/// exponent plane is dominated by a few values) spread over eight store-to-load chains instead
/// of serialising on one counter.
pub fn histogram(data: &[u8]) -> [u32; 256] {
    let mut h = [[0u32; 256]; 8];
    let mut it = data.chunks_exact(8);
    for c in &mut it {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        for (k, t) in h.iter_mut().enumerate() {
            t[((w >> (8 * k)) & 0xff) as usize] += 1;
        }
    }
    for &b in it.remainder() {
        h[0][b as usize] += 1;
    }
    let mut out = [0u32; 256];
    for (i, o) in out.iter_mut().enumerate() {
        *o = h.iter().map(|t| t[i]).sum();
    }
    out
}
}

/// Huffman code lengths (0 = symbol absent, else 1 ..= [`MAX_LEN`]) for `hist`, forming a
/// complete prefix code. Needs at least two distinct symbols (`None` otherwise).
pub fn code_lengths(hist: &[u32; 256]) -> Option<[u8; 256]> {
    let mut syms: Vec<(u64, usize)> = hist
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(s, &c)| (c as u64, s))
        .collect();
    if syms.len() < 2 {
        return None;
    }
    syms.sort_unstable();
    // Two-queue Huffman: leaves in ascending weight, internal nodes are created in ascending
    // weight too, so the two smallest are always at the fronts of the two queues.
    let m = syms.len();
    let mut weight: Vec<u64> = syms.iter().map(|&(c, _)| c).collect();
    let mut parent = vec![0usize; 2 * m - 1];
    let (mut leaf, mut node) = (0usize, m);
    weight.reserve(m - 1);
    for next in m..2 * m - 1 {
        let mut pick = || {
            if leaf < m && (node >= next || weight[leaf] <= weight[node]) {
                leaf += 1;
                leaf - 1
            } else {
                node += 1;
                node - 1
            }
        };
        let a = pick();
        let b = pick();
        weight.push(weight[a] + weight[b]);
        parent[a] = next;
        parent[b] = next;
    }
    // Depths: the root is the last node; parents always come after their children.
    let mut depth = vec![0u32; 2 * m - 1];
    for i in (0..2 * m - 2).rev() {
        depth[i] = depth[parent[i]] + 1;
    }
    let mut lens = [0u8; 256];
    for (i, &(_, s)) in syms.iter().enumerate() {
        lens[s] = depth[i].min(MAX_LEN) as u8;
    }
    let order: Vec<usize> = syms.iter().map(|&(_, s)| s).collect();
    limit_lengths(&mut lens, &order);
    Some(lens)
}

/// Make clamped lengths a complete prefix code again: lengthen the rarest codes until the Kraft
/// sum fits, then shorten the most frequent of the longest codes while there is slack (the slack
/// is always a multiple of the longest code's share, so this ends exactly at a complete code).
/// `order` lists the present symbols by ascending count, so both steps walk it instead of
/// scanning all 256 symbols per step (this ran once per plane per chunk and showed in profiles).
fn limit_lengths(lens: &mut [u8; 256], order: &[usize]) {
    let full = 1u64 << MAX_LEN;
    let share = |l: u8| 1u64 << (MAX_LEN - l as u32);
    let mut kraft: u64 = order.iter().map(|&s| share(lens[s])).sum();
    // Over-full: the rarest symbol that can still grow grows by one bit (it stays the rarest
    // such symbol until it reaches MAX_LEN, so a cursor over `order` suffices).
    let mut i = 0;
    while kraft > full {
        while (lens[order[i]] as u32) >= MAX_LEN {
            i += 1; // an over-full code always has a code shorter than MAX_LEN
        }
        let s = order[i];
        kraft -= share(lens[s]) - share(lens[s] + 1);
        lens[s] += 1;
    }
    // Slack: the most frequent symbol among those with the longest length shrinks by one bit.
    while kraft < full {
        let longest = order.iter().map(|&s| lens[s]).max().expect("non-empty");
        if longest <= 1 {
            break; // cannot happen for >= 2 symbols; keeps the loop total
        }
        let s = *order
            .iter()
            .rev()
            .find(|&&s| lens[s] == longest)
            .expect("some symbol has the longest length");
        kraft += share(lens[s] - 1) - share(lens[s]);
        lens[s] -= 1;
    }
}

/// Total coded bits of a plane with histogram `hist` under `lens`.
pub fn coded_bits(hist: &[u32; 256], lens: &[u8; 256]) -> u64 {
    hist.iter()
        .zip(lens)
        .map(|(&c, &l)| c as u64 * l as u64)
        .sum()
}

/// Bytes of the table header for `lens`.
pub fn table_len(lens: &[u8; 256]) -> usize {
    let (lo, hi) = used_range(lens);
    2 + (hi - lo + 1).div_ceil(2)
}

fn used_range(lens: &[u8; 256]) -> (usize, usize) {
    let lo = lens.iter().position(|&l| l > 0).unwrap_or(0);
    let hi = lens.iter().rposition(|&l| l > 0).unwrap_or(0);
    (lo, hi)
}

/// Exact size of the coded segment of an `n`-byte plane: table, stream sizes, streams (each
/// stream rounded up to whole bytes, at most one byte lost per stream).
pub fn segment_len_bound(hist: &[u32; 256], lens: &[u8; 256]) -> usize {
    table_len(lens) + SIZES_LEN + (coded_bits(hist, lens) / 8) as usize + STREAMS
}

/// Canonical codes (MSB-first values) of `lens`, returned bit-reversed for LSB-first streams.
fn canonical_reversed(lens: &[u8; 256]) -> [u16; 256] {
    let mut count = [0u32; MAX_LEN as usize + 1];
    for &l in lens.iter() {
        count[l as usize] += 1;
    }
    count[0] = 0;
    let mut next = [0u32; MAX_LEN as usize + 2];
    let mut code = 0u32;
    for l in 1..=MAX_LEN as usize {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    let mut out = [0u16; 256];
    for s in 0..256 {
        let l = lens[s] as u32;
        if l > 0 {
            let c = next[l as usize];
            next[l as usize] += 1;
            out[s] = (c.reverse_bits() >> (32 - l)) as u16;
        }
    }
    out
}

/// Append the coded segment of `plane` (FORMAT.md §5.1: table, stream sizes, streams) to `out`.
/// `lens` must come from [`code_lengths`] of this plane's histogram (every byte has a code).
pub fn encode(plane: &[u8], lens: &[u8; 256], out: &mut Vec<u8>) {
    let (lo, hi) = used_range(lens);
    out.push(lo as u8);
    out.push((hi - lo) as u8);
    for pair in lens[lo..=hi].chunks(2) {
        out.push(pair[0] | pair.get(1).map_or(0, |&h| h << 4));
    }
    let codes = canonical_reversed(lens);
    // One (code | len << 16) word per symbol: a single load per encoded byte.
    let mut table = [0u32; 256];
    for s in 0..256 {
        table[s] = codes[s] as u32 | (lens[s] as u32) << 16;
    }
    let sizes_at = out.len();
    out.resize(sizes_at + SIZES_LEN, 0);
    // Every stream is written at a fixed worst-case offset, two streams at a time with their
    // bit writers interleaved (two independent dependency chains keep the core busy where one
    // chain is bound by its shift/add latency), then the streams are packed together.
    let q = plane.len().div_ceil(STREAMS);
    let cap = stream_cap(q);
    let base = out.len();
    out.resize(base + STREAMS * cap, 0);
    let mut lens_out = [0usize; STREAMS];
    let parts: Vec<std::ops::Range<usize>> = split(plane.len(), q).collect();
    for pair in 0..STREAMS / 2 {
        let (a, b) = (2 * pair, 2 * pair + 1);
        let region = &mut out[base + a * cap..base + (a + 2) * cap];
        let (ra, rb) = region.split_at_mut(cap);
        let (la, lb) = encode_two(
            &plane[parts[a].clone()],
            &plane[parts[b].clone()],
            &table,
            ra,
            rb,
        );
        lens_out[a] = la;
        lens_out[b] = lb;
    }
    let mut at = base;
    for (i, &n) in lens_out.iter().enumerate() {
        out.copy_within(base + i * cap..base + i * cap + n, at);
        at += n;
        if i < STREAMS - 1 {
            out[sizes_at + 4 * i..sizes_at + 4 * i + 4].copy_from_slice(&(n as u32).to_le_bytes());
        }
    }
    out.truncate(at);
}

/// Worst-case bytes of a stream of `n` symbols ([`MAX_LEN`] bits each), plus 8 bytes of slack
/// for the writer's 64-bit stores.
fn stream_cap(n: usize) -> usize {
    (n * MAX_LEN as usize).div_ceil(8) + 8
}

/// The symbol ranges of the streams: `STREAMS` consecutive pieces of `q` symbols (the last ones
/// shorter or empty).
fn split(n: usize, q: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..STREAMS).map(move |i| (i * q).min(n)..((i + 1) * q).min(n))
}

/// Symbols coded between two stores of the bit writer's accumulator.
const PER_FLUSH: usize = 5;

/// An LSB-first bit writer over a byte region at least [`stream_cap`] of its symbols long.
/// It writes through a raw cursor: the region's capacity bound (checked once, in
/// [`encode_two`]) is what keeps every 8-byte store inside, so the hot loop carries no bounds
/// checks.
struct BitWriter<'a> {
    start: *mut u8,
    at: *mut u8,
    acc: u64,
    nb: u32,
    _region: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> BitWriter<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        let start = buf.as_mut_ptr();
        BitWriter {
            start,
            at: start,
            acc: 0,
            nb: 0,
            _region: std::marker::PhantomData,
        }
    }

    /// Append the codes of (up to) [`PER_FLUSH`] symbols: 5 × 11 bits plus < 8 pending bits
    /// fit the 64-bit accumulator. Then store the whole accumulator and keep the partial byte.
    #[inline(always)]
    fn put_group(&mut self, syms: &[u8], table: &[u32; 256]) {
        for &b in syms {
            let e = table[b as usize];
            self.acc |= ((e & 0xffff) as u64) << self.nb;
            self.nb += e >> 16;
        }
        self.flush();
    }

    #[inline(always)]
    fn flush(&mut self) {
        // SAFETY: `at` advanced by at most MAX_LEN bits per symbol written so far, and the
        // region holds stream_cap(symbols) = that bound + 8 bytes (checked in encode_two), so
        // the 8-byte store stays inside the region.
        unsafe { std::ptr::write_unaligned(self.at as *mut u64, self.acc.to_le()) };
        let bytes = (self.nb >> 3) as usize; // nb <= 62, so bytes <= 7 and the shift is < 64
                                             // SAFETY: as above, `at + bytes` stays inside the region.
        self.at = unsafe { self.at.add(bytes) };
        self.acc >>= bytes * 8;
        self.nb &= 7;
    }

    /// Bytes used, the last partial byte included.
    fn finish(mut self) -> usize {
        self.flush();
        // SAFETY: both pointers are in the same region, `at` not before `start`.
        let pos = unsafe { self.at.offset_from(self.start) } as usize;
        pos + (self.nb > 0) as usize
    }
}

multiversion! {
/// Encode two symbol streams into their regions (each [`stream_cap`] of its length) with the
/// two writers interleaved; returns the bytes each used.
fn encode_two(a: &[u8], b: &[u8], table: &[u32; 256], ra: &mut [u8], rb: &mut [u8]) -> (usize, usize) {
    // What keeps the writers' raw stores inside their regions (see BitWriter::flush).
    assert!(ra.len() >= stream_cap(a.len()) && rb.len() >= stream_cap(b.len()));
    let (mut wa, mut wb) = (BitWriter::new(ra), BitWriter::new(rb));
    let both = a.len().min(b.len()) / PER_FLUSH * PER_FLUSH;
    for (ca, cb) in a[..both].chunks_exact(PER_FLUSH).zip(b[..both].chunks_exact(PER_FLUSH)) {
        wa.put_group(ca, table);
        wb.put_group(cb, table);
    }
    for c in a[both..].chunks(PER_FLUSH) {
        wa.put_group(c, table);
    }
    for c in b[both..].chunks(PER_FLUSH) {
        wb.put_group(c, table);
    }
    (wa.finish(), wb.finish())
}
}

/// A decoding table: entry = symbol | length << 8, indexed by the next [`MAX_LEN`] bits.
struct DecodeTable([u16; TABLE]);

impl DecodeTable {
    /// Parse the table header at the start of `seg`; returns the table and the header length.
    fn read(seg: &[u8]) -> Result<(DecodeTable, usize), String> {
        let (&lo, &span) = match seg {
            [a, b, ..] => (a, b),
            _ => return Err("huffman segment shorter than its table header".into()),
        };
        let (lo, count) = (lo as usize, span as usize + 1);
        if lo + count > 256 {
            return Err(format!(
                "huffman table covers symbols {lo}..{} (past 255)",
                lo + count
            ));
        }
        let hdr = 2 + count.div_ceil(2);
        let nibbles = seg
            .get(2..hdr)
            .ok_or("huffman table past the segment end")?;
        let mut lens = [0u8; 256];
        for i in 0..count {
            let b = nibbles[i / 2];
            let l = if i % 2 == 0 { b & 15 } else { b >> 4 };
            if l as u32 > MAX_LEN {
                return Err(format!(
                    "huffman code length {l} > {MAX_LEN} for symbol {}",
                    lo + i
                ));
            }
            lens[lo + i] = l;
        }
        let kraft: u64 = lens
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_LEN - l as u32))
            .sum();
        if kraft != TABLE as u64 {
            return Err("huffman code lengths do not form a complete prefix code".into());
        }
        let codes = canonical_reversed(&lens);
        let mut t = [0u16; TABLE];
        for s in 0..256 {
            let l = lens[s] as usize;
            if l == 0 {
                continue;
            }
            let e = s as u16 | (l as u16) << 8;
            let mut i = codes[s] as usize;
            while i < TABLE {
                t[i] = e;
                i += 1 << l;
            }
        }
        Ok((DecodeTable(t), hdr))
    }
}

/// Load 8 bytes at `at` (zero past the end of `s`), as a little-endian word.
#[inline(always)]
fn load_padded(s: &[u8], at: usize) -> u64 {
    match s.get(at..at + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        None => {
            let mut b = [0u8; 8];
            if at < s.len() {
                b[..s.len() - at].copy_from_slice(&s[at..]);
            }
            u64::from_le_bytes(b)
        }
    }
}

multiversion! {
/// Decode a coded segment (exactly `seg`, as written by [`encode`]) into `dst`, whose length is
/// the plane length.
pub fn decode(seg: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let (table, hdr) = DecodeTable::read(seg)?;
    let sizes = seg
        .get(hdr..hdr + SIZES_LEN)
        .ok_or("huffman stream sizes past the segment end")?;
    let mut streams: [&[u8]; STREAMS] = [&[]; STREAMS];
    let mut at = hdr + SIZES_LEN;
    for (i, s) in streams.iter_mut().enumerate() {
        let len = if i < STREAMS - 1 {
            u32::from_le_bytes(sizes[4 * i..4 * i + 4].try_into().expect("4")) as usize
        } else {
            seg.len().saturating_sub(at)
        };
        *s = at
            .checked_add(len)
            .and_then(|end| seg.get(at..end))
            .ok_or_else(|| format!("huffman stream {i} of {len} bytes past the segment end"))?;
        at += len;
    }
    let n = dst.len();
    let q = n.div_ceil(STREAMS);
    let t = &table.0;
    let multi = MultiTable::build(t);
    let m = &multi.0;
    // Bit positions of the streams, and the output positions of their symbols.
    let mut pos = [0usize; STREAMS];
    let mut at = [0usize; STREAMS];
    let mut end = [0usize; STREAMS];
    for s in 0..STREAMS {
        at[s] = (s * q).min(n);
        end[s] = ((s + 1) * q).min(n);
    }
    // Fast loop: up to MULTI symbols per lookup, PER_REFILL lookups per 64-bit load. It runs
    // while every stream has 8 readable bytes at its bit position and room for a whole round
    // of output (PER_REFILL * MULTI symbols, plus the 8-byte store's overshoot) before its
    // piece ends, so no stream writes into its neighbour's piece. Bytes a store writes past
    // the symbols it decoded are overwritten by the next store or by the tail below.
    let out = dst.as_mut_ptr();
    'fast: loop {
        // How many rounds every stream can run before the next check: a round moves a
        // stream's next 8-byte load at most 7 bytes on (PER_REFILL * MAX_LEN <= 55 bits past
        // a bit offset under 8) and its output at most PER_REFILL * MULTI symbols. Checking
        // once per batch of rounds, not once per round, gave ~1.1x the symbols per CPU-second.
        let mut rounds = usize::MAX;
        for s in 0..STREAMS {
            let byte = pos[s] >> 3;
            if byte + 8 > streams[s].len() || at[s] + ROOM > end[s] {
                break 'fast;
            }
            let by_in = (streams[s].len() - 8 - byte) / 7 + 1;
            let by_out = (end[s] - ROOM - at[s]) / (PER_REFILL * MULTI) + 1;
            rounds = rounds.min(by_in).min(by_out);
        }
        for _ in 0..rounds {
            // SAFETY: `rounds` rounds keep every stream's loads inside it and its output
            // inside its piece (the bounds just computed); `out` is dst's start.
            unsafe { round(&streams, &mut pos, &mut at, out, m) };
        }
    }
    // Tail: each stream finishes alone, one symbol per lookup, with padded loads; then every
    // stream must have ended inside its bytes.
    for s in 0..STREAMS {
        let st = streams[s];
        let mut p = pos[s];
        for slot in dst[at[s]..end[s]].iter_mut() {
            let v = load_padded(st, p >> 3) >> (p & 7);
            let e = t[(v as usize) & (TABLE - 1)];
            *slot = e as u8;
            p += (e >> 8) as usize;
        }
        if p.div_ceil(8) != st.len() {
            return Err(format!(
                "huffman stream {s} decodes from {} bits but holds {} bytes",
                p,
                st.len()
            ));
        }
        // The encoder leaves the bits after the last code zero; checking them makes every bit
        // of a segment count (a reader may skip the stored crc: FORMAT.md §5.1).
        if p % 8 != 0 && st[st.len() - 1] >> (p % 8) != 0 {
            return Err(format!("huffman stream {s}: nonzero padding bits after its last code"));
        }
    }
    Ok(())
}
}

/// One round of [`decode`]'s fast loop: [`PER_REFILL`] lookups in every stream, writing the
/// symbols at `out + at[s]` and advancing `pos` and `at`.
///
/// # Safety
/// Every stream has 8 readable bytes at byte `pos[s] >> 3` (else this panics, it is not UB),
/// and `at[s] + ROOM <= end[s]` where `end[s]` is the end of stream `s`'s piece of the output
/// that `out` points to: the round's stores stay inside that piece.
#[inline(always)]
unsafe fn round(
    streams: &[&[u8]; STREAMS],
    pos: &mut [usize; STREAMS],
    at: &mut [usize; STREAMS],
    out: *mut u8,
    m: &[u64; TABLE],
) {
    // Streams in lockstep groups of LANES: each step does one lookup in every lane, so
    // the lanes' lookup -> shift -> lookup latency chains overlap instead of running one
    // after another.
    for g in (0..STREAMS).step_by(LANES) {
        // Each lane's word holds its next LANE_BITS stream bits under a sentinel bit: after
        // the lookups the sentinel's position tells the bits used (one lzcnt per refill
        // instead of a running sum per lookup: one register less per lane, where eight
        // lanes of state spilled to the stack).
        let mut v = [0u64; LANES];
        let mut o = [0usize; LANES];
        for k in 0..LANES {
            let (st, p) = (streams[g + k], pos[g + k]);
            let w = u64::from_le_bytes(st[p >> 3..(p >> 3) + 8].try_into().expect("8"));
            v[k] = ((w >> (p & 7)) & ((1u64 << LANE_BITS) - 1)) | (1u64 << LANE_BITS);
            o[k] = at[g + k];
        }
        for _ in 0..PER_REFILL {
            for k in 0..LANES {
                let e = m[(v[k] as usize) & (TABLE - 1)];
                // SAFETY: o + 8 <= at[s] + ROOM <= end[s] <= the output's length (the
                // caller's contract; each lookup advances o by at most MULTI).
                unsafe { std::ptr::write_unaligned(out.add(o[k]) as *mut u64, e.to_le()) };
                // The bits used sit at 48..52 and a 64-bit shift takes its count mod 64,
                // so the shift needs no field extraction; the symbol count is the top byte.
                v[k] >>= ((e >> 48) as u32) & 63;
                o[k] += (e >> 56) as usize;
            }
        }
        for k in 0..LANES {
            // The sentinel started at bit LANE_BITS and moved down by the bits used.
            pos[g + k] += (LANE_BITS - (63 - v[k].leading_zeros())) as usize;
        }
        at[g..g + LANES].copy_from_slice(&o);
    }
}

/// Most symbols one multi-symbol table entry holds.
const MULTI: usize = 4;
/// Output room the fast loop needs before a stream's piece ends for one round: its symbols
/// plus the last 8-byte store's overshoot.
const ROOM: usize = PER_REFILL * MULTI + 8;

/// A table decoding up to [`MULTI`] whole codes from the next [`MAX_LEN`] bits: entry =
/// symbols (bytes 0..4) | total bits << 48 | count << 56, stored whole (8 bytes) by the fast
/// loop. Short codes (float exponents average 2-3 bits) thus cost a quarter of the lookups
/// (a u32 entry of three symbols before; with the sentinel, 1.35x the symbols per CPU-second).
struct MultiTable([u64; TABLE]);

impl MultiTable {
    fn build(t: &[u16; TABLE]) -> MultiTable {
        let mut m = [0u64; TABLE];
        for (i, slot) in m.iter_mut().enumerate() {
            let (mut syms, mut count, mut bits) = (0u64, 0u64, 0u32);
            while (count as usize) < MULTI {
                let e = t[(i >> bits) & (TABLE - 1)];
                let l = (e >> 8) as u32;
                // Only bits inside the 11-bit window are known; a code must fit in them.
                if bits + l > MAX_LEN {
                    break;
                }
                syms |= ((e & 0xff) as u64) << (8 * count);
                count += 1;
                bits += l;
            }
            *slot = syms | (bits as u64) << 48 | count << 56;
        }
        MultiTable(m)
    }
}

#[cfg(test)]
mod tests;
