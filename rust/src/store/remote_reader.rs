//! Lazy reads of a checkpoint in an object store.
//!
//! - `open` is one GET of `P.index` (whatever the key count); shard headers are not fetched:
//!   every ranged GET returns the object's total size, checked against the index's record, and
//!   `verify` checks the headers.
//! - An uncompressed value is one ranged GET of exactly its bytes (split into parallel
//!   `part_size` pieces only when larger than one part); a compressed value fetches its chunks;
//!   a slice fetches only the chunks holding the rows.
//! - Many values (`read_many`) are planned together: ranges of one shard closer than
//!   [`COALESCE_GAP`] become one GET, large ones are split, and up to `concurrency` GETs run at
//!   once, each piece copied into its destination as it arrives.
//! - Every byte handed out is crc-checked, and it is the very download that was checked that
//!   reaches the caller: never a second, unchecked GET of the same bytes (a proxy or NIC that
//!   damages one response must raise, not return wrong values). A checked part of a value
//!   (`read_range(.., verify = true)`, `remote_reader/ranges.rs`) fetches only the chunks
//!   (compressed) or crc blocks (uncompressed, FORMAT.md §3.4) holding it and checks each; an
//!   uncompressed value without crc blocks has one crc for all its bytes, so a checked part of
//!   it fetches the whole value once, checks it and cuts the part out. Only
//!   `read_range(.., verify = false)` of an uncompressed value hands out unchecked bytes.
//! - A failed check drops the range cache: a damaged download is never served again.
//!
//! Verification (`verify`: the whole checkpoint, and what strong verification reads) is in
//! `remote_reader/verify.rs`.

mod ranges;
mod verify;

use super::{block_on, RemotePrefix, COALESCE_GAP};
use crate::codec::decode_chunk;
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{Entry, IndexView};
use futures::StreamExt;
use rayon::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Stored bytes fetched at once by `verify` and by the compressed part of `read_many_into`.
const VERIFY_BATCH: u64 = 1 << 30;
/// Tight coalescing (row ranges): a gap this small (a page of alignment padding) is always
/// downloaded with its neighbours...
const TIGHT_GAP: u64 = 4096;
/// ... a larger one only when it is at most 1/40 of the bytes wanted by the GET (2.5%).
const TIGHT_GAP_SHARE: u64 = 40;

/// One shard object of an open remote checkpoint.
pub struct RemoteShard {
    pub key: String,
    pub url: PathBuf,
    pub file_len: u64,
}

/// Recently fetched pieces, bounded by bytes (FIFO). Off unless `cache_bytes` > 0.
struct RangeCache {
    budget: usize,
    used: usize,
    map: HashMap<(u32, u64, u64), bytes::Bytes>,
    order: VecDeque<(u32, u64, u64)>,
}

impl RangeCache {
    fn put(&mut self, k: (u32, u64, u64), b: bytes::Bytes) {
        if b.len() > self.budget || self.map.contains_key(&k) {
            return;
        }
        while self.used + b.len() > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(ob) = self.map.remove(&old) {
                self.used -= ob.len();
            }
        }
        self.used += b.len();
        self.order.push_back(k);
        self.map.insert(k, b);
    }
}

/// An open checkpoint in an object store.
pub struct RemoteReader {
    prefix: RemotePrefix,
    index: IndexView<Vec<u8>>,
    shards: Vec<RemoteShard>,
    cache: Option<Mutex<RangeCache>>,
}

/// A byte range `[lo, hi)` of shard `shard`.
type Span = (u32, u64, u64);

impl RemoteReader {
    /// Open: one GET of the index, then checks of header, footer, sections, shard and block
    /// tables (no per-entry work, no shard requests).
    pub fn open(prefix: &RemotePrefix) -> Result<Self> {
        let ikey = prefix.key_of(".index");
        let (bytes, _) = prefix.store.get(&ikey).map_err(|e| match e {
            Error::NotFound { path, .. } => Error::NotFound {
                path,
                what: "open checkpoint index".into(),
            },
            e => e,
        })?;
        let index = IndexView::open(bytes, &prefix.url_of(".index"))?;
        let shards = index
            .shards()
            .iter()
            .map(|rec| RemoteShard {
                key: prefix.key_of(&rec.name),
                url: prefix.url_of(&rec.name),
                file_len: rec.file_len,
            })
            .collect();
        let cb = prefix.store.config.cache_bytes;
        Ok(RemoteReader {
            prefix: prefix.clone(),
            index,
            shards,
            cache: (cb > 0).then(|| {
                Mutex::new(RangeCache {
                    budget: cb,
                    used: 0,
                    map: HashMap::new(),
                    order: VecDeque::new(),
                })
            }),
        })
    }

    /// The URL of `P`.
    pub fn url(&self) -> PathBuf {
        self.prefix.url_of("")
    }

    /// The index.
    pub fn index(&self) -> &IndexView<Vec<u8>> {
        &self.index
    }

    /// The shard objects.
    pub fn shards(&self) -> &[RemoteShard] {
        &self.shards
    }

    /// Entry of `key`, or `MissingKey`.
    pub fn entry(&self, key: &str) -> Result<Entry<'_>> {
        match self.index.find(key)? {
            Some(i) => self.index.entry(i),
            None => Err(Error::MissingKey {
                path: self.prefix.url_of(".index"),
                key: key.to_string(),
            }),
        }
    }

    /// Fetch every span (coalesced, split, in parallel); returns their bytes in order.
    fn fetch(&self, spans: &[Span]) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = spans
            .iter()
            .map(|&(_, lo, hi)| vec![0u8; (hi - lo) as usize])
            .collect();
        let mut dsts: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.fetch_into(spans, &mut dsts)?;
        Ok(out)
    }

    /// Bytes `[lo, lo + out.len())` of shard `shard` (ranged GETs, split and in parallel; the
    /// object's size is checked against the shard record). Used by strong verification.
    pub fn read_shard_into(&self, shard: u32, lo: u64, out: &mut [u8]) -> Result<()> {
        let hi = lo + out.len() as u64;
        self.fetch_into(&[(shard, lo, hi)], &mut [out])
    }

    /// Fetch every span into `out[i]` (exactly the span's length), coalesced, split and in
    /// parallel, each piece copied to its place as it arrives.
    fn fetch_into(&self, spans: &[Span], out: &mut [&mut [u8]]) -> Result<()> {
        self.fetch_into_with(spans, out, false)
    }

    /// [`Self::fetch`] with tight coalescing: neighbours share a GET only when the gap between
    /// them is alignment padding (at most [`TIGHT_GAP`]) or at most 1/[`TIGHT_GAP_SHARE`] of
    /// the bytes the GET is for, so row ranges read about their own bytes and no more (a
    /// loading rank's cut values are not read whole through the 1 MiB rule).
    fn fetch_tight(&self, spans: &[Span]) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = spans
            .iter()
            .map(|&(_, lo, hi)| vec![0u8; (hi - lo) as usize])
            .collect();
        let mut dsts: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.fetch_into_with(spans, &mut dsts, true)?;
        Ok(out)
    }

    fn fetch_into_with(&self, spans: &[Span], out: &mut [&mut [u8]], tight: bool) -> Result<()> {
        debug_assert!(spans
            .iter()
            .zip(out.iter())
            .all(|(&(_, lo, hi), o)| o.len() as u64 == hi - lo));
        let store = &self.prefix.store;
        let ps = store.config.part_size as u64;
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by_key(|&i| (spans[i].0, spans[i].1));
        // Requests: (shard, lo, hi, spans inside); `useful`: bytes of the spans of the last.
        let mut reqs: Vec<(u32, u64, u64, Vec<usize>)> = Vec::new();
        let mut useful = 0u64;
        for i in order {
            let (s, lo, hi) = spans[i];
            if let Some(last) = reqs.last_mut() {
                let gap = lo.saturating_sub(last.2);
                let near = if tight {
                    gap <= TIGHT_GAP || gap * TIGHT_GAP_SHARE <= useful + (hi - lo)
                } else {
                    gap <= COALESCE_GAP
                };
                if last.0 == s && near && hi.max(last.2) - last.1 <= ps {
                    last.2 = last.2.max(hi);
                    last.3.push(i);
                    useful += hi - lo;
                    continue;
                }
            }
            reqs.push((s, lo, hi, vec![i]));
            useful = hi - lo;
        }
        // Pieces of at most one part each.
        let mut pieces: Vec<(Span, usize)> = Vec::new();
        for (ri, (s, lo, hi, _)) in reqs.iter().enumerate() {
            let mut a = *lo;
            while a < *hi {
                let b = (a + ps).min(*hi);
                pieces.push(((*s, a, b), ri));
                a = b;
            }
        }
        let mut place = |piece: Span, ri: usize, data: &[u8]| {
            let (_, a, b) = piece;
            for &si in &reqs[ri].3 {
                let (_, lo, hi) = spans[si];
                let (x, y) = (a.max(lo), b.min(hi));
                if x < y {
                    out[si][(x - lo) as usize..(y - lo) as usize]
                        .copy_from_slice(&data[(x - a) as usize..(y - a) as usize]);
                }
            }
        };
        let mut todo = Vec::new();
        for (piece, ri) in pieces {
            let hit = self
                .cache
                .as_ref()
                .and_then(|c| c.lock().expect("cache").map.get(&piece).cloned());
            match hit {
                Some(b) => place(piece, ri, &b),
                None => todo.push((piece, ri)),
            }
        }
        let futs = todo.iter().map(|&((s, a, b), _)| {
            let sh = &self.shards[s as usize];
            store.range_future(&sh.key, a, b)
        });
        let mut stream = futures::stream::iter(futs).buffered(store.config.concurrency);
        let mut k = 0;
        block_on(async {
            while let Some(r) = stream.next().await {
                let (bytes, size) = r?;
                let ((s, a, _), ri) = todo[k];
                k += 1;
                let sh = &self.shards[s as usize];
                if size != sh.file_len {
                    return Err(Error::corrupt(
                        &sh.url,
                        a,
                        format!(
                            "shard {s} is {size} bytes but the index records {} (truncated or replaced)",
                            sh.file_len
                        ),
                    ));
                }
                place(todo[k - 1].0, ri, &bytes);
                if let Some(c) = &self.cache {
                    c.lock().expect("cache").put(todo[k - 1].0, bytes);
                }
            }
            Ok(())
        })
    }

    /// Forget every cached piece (after a failed check: the damaged piece may be among them).
    fn drop_cache(&self) {
        if let Some(c) = &self.cache {
            let mut c = c.lock().expect("cache");
            c.map.clear();
            c.order.clear();
            c.used = 0;
        }
    }

    /// `r`, dropping the range cache first when it is an error.
    fn checked<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.drop_cache();
        }
        r
    }

    /// The stored span of an entry: all of it, or chunks `c0..=c1`.
    fn span_of(&self, e: &Entry<'_>, chunks: Option<(usize, usize)>) -> Span {
        match chunks {
            None => (e.shard, e.offset, e.offset + e.stored_len),
            Some((c0, c1)) => {
                let a = e.chunk(c0);
                let b = e.chunk(c1);
                (
                    e.shard,
                    e.offset + a.rel_offset,
                    e.offset + b.rel_offset + b.stored_len as u64,
                )
            }
        }
    }

    fn shard_url(&self, e: &Entry<'_>) -> &Path {
        &self.shards[e.shard as usize].url
    }

    /// Check the crc of an uncompressed entry's whole value `data` (as downloaded).
    fn check_raw(&self, e: &Entry<'_>, data: &[u8]) -> Result<()> {
        // With crc blocks (FORMAT.md §3.4) the one pass computes the block crcs, checks each
        // (so `verify` finds a block table that disagrees with the data) and combines them.
        let actual = if e.block_log2 == 0 || data.len() as u64 != e.raw_len {
            crate::checksum::par_crc(data)
        } else {
            let (blocks, whole) = crate::checksum::block_crcs(data, e.block_log2);
            if let Some(bi) = (0..blocks.len()).find(|&i| blocks[i] != e.block_crc(i)) {
                return Err(Error::Checksum {
                    path: self.shard_url(e).to_path_buf(),
                    offset: e.offset + ((bi as u64) << e.block_log2),
                    what: format!("key {:?} crc block {bi}", e.key),
                    expected: e.block_crc(bi),
                    actual: blocks[bi],
                });
            }
            whole
        };
        if actual != e.crc {
            return Err(Error::Checksum {
                path: self.shard_url(e).to_path_buf(),
                offset: e.offset,
                what: format!("key {:?}", e.key),
                expected: e.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Decode a compressed entry's whole payload `stored` into `out` (its raw length), every
    /// chunk crc-checked before decoding and the decoded bytes checked against the raw crc.
    fn decode_into(&self, e: &Entry<'_>, stored: &[u8], out: &mut [u8]) -> Result<()> {
        check_chunk_table(e, self.index.chunk_bytes(), self.shard_url(e))?;
        let cb = self.index.chunk_bytes() as usize;
        let crcs: Vec<(u32, usize)> = crate::threads::install(|| {
            out.par_chunks_mut(cb)
                .enumerate()
                .map(|(ci, o)| {
                    self.decode_one(e, ci, stored, 0, o)?;
                    Ok((crc(o), o.len()))
                })
                .collect::<Result<_>>()
        })?;
        let whole = combine_crcs(crcs);
        if whole != e.crc {
            return Err(Error::Checksum {
                path: self.shard_url(e).to_path_buf(),
                offset: e.offset,
                what: format!("key {:?} (decoded data)", e.key),
                expected: e.crc,
                actual: whole,
            });
        }
        Ok(())
    }

    /// Decode whole entries: `stored[i]` holds entry `i`'s payload. Returns raw bytes, all
    /// checked against their crcs.
    fn decode_whole(&self, es: &[Entry<'_>], stored: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        let r = crate::threads::install(|| {
            es.par_iter()
                .zip(stored.into_par_iter())
                .map(|(e, s)| {
                    if e.codec == Codec::None {
                        self.check_raw(e, &s)?;
                        return Ok(s);
                    }
                    let mut out = vec![0u8; e.raw_len as usize];
                    self.decode_into(e, &s, &mut out)?;
                    Ok(out)
                })
                .collect()
        });
        self.checked(r)
    }

    /// Decode chunk `ci` of `e` from `stored`, which starts at chunk-relative offset `base`.
    fn decode_one(
        &self,
        e: &Entry<'_>,
        ci: usize,
        stored: &[u8],
        base: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let c = e.chunk(ci);
        let lo = (c.rel_offset - base) as usize;
        let s = &stored[lo..lo + c.stored_len as usize];
        let off = e.offset + c.rel_offset;
        let actual = crc(s);
        if actual != c.crc {
            return Err(Error::Checksum {
                path: self.shard_url(e).to_path_buf(),
                offset: off,
                what: format!("key {:?} chunk {ci}", e.key),
                expected: c.crc,
                actual,
            });
        }
        decode_chunk(e.codec, e.dtype, s, out, self.shard_url(e), off)
    }

    /// Raw bytes of many entries, fetched together and checked.
    pub fn read_many(&self, es: &[Entry<'_>]) -> Result<Vec<Vec<u8>>> {
        let spans: Vec<Span> = es.iter().map(|e| self.span_of(e, None)).collect();
        let stored = self.fetch(&spans)?;
        self.decode_whole(es, stored)
    }

    /// Raw bytes of one entry.
    pub fn read(&self, e: &Entry<'_>) -> Result<Vec<u8>> {
        Ok(self.read_many(std::slice::from_ref(e))?.pop().expect("one"))
    }

    /// Raw bytes of many entries decoded straight into `outs[i]` (each exactly entry `i`'s raw
    /// length): uncompressed values are downloaded into their buffer and that download is
    /// checked; compressed ones are fetched (in batches of bounded size) and decoded, every
    /// chunk checked. On an error some buffers may hold new (or damaged) bytes.
    pub fn read_many_into(&self, es: &[Entry<'_>], outs: &mut [&mut [u8]]) -> Result<()> {
        if es.len() != outs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} entries but {} output buffers",
                es.len(),
                outs.len()
            )));
        }
        for (e, o) in es.iter().zip(outs.iter()) {
            if o.len() as u64 != e.raw_len {
                return Err(Error::InvalidArgument(format!(
                    "key {:?}: output buffer of {} bytes for a {}-byte value",
                    e.key,
                    o.len(),
                    e.raw_len
                )));
            }
        }
        let mut raw: Vec<(&Entry<'_>, &mut [u8])> = Vec::new();
        let mut packed: Vec<(&Entry<'_>, &mut [u8])> = Vec::new();
        for (e, o) in es.iter().zip(outs.iter_mut()) {
            if e.codec == Codec::None {
                raw.push((e, &mut **o));
            } else {
                packed.push((e, &mut **o));
            }
        }
        let spans: Vec<Span> = raw.iter().map(|(e, _)| self.span_of(e, None)).collect();
        let mut dsts: Vec<&mut [u8]> = raw.iter_mut().map(|(_, o)| &mut **o).collect();
        let r = self.fetch_into(&spans, &mut dsts).and_then(|()| {
            crate::threads::install(|| raw.par_iter().try_for_each(|(e, o)| self.check_raw(e, o)))
        });
        self.checked(r)?;
        // Compressed: stored bytes are temporary, so fetch them ~1 GiB at a time.
        let mut rest = packed.as_mut_slice();
        while !rest.is_empty() {
            let mut n = 0;
            let mut total = 0u64;
            while n < rest.len() && (n == 0 || total < VERIFY_BATCH) {
                total += rest[n].0.stored_len;
                n += 1;
            }
            let (batch, tail) = rest.split_at_mut(n);
            rest = tail;
            let spans: Vec<Span> = batch.iter().map(|(e, _)| self.span_of(e, None)).collect();
            let r = self.fetch(&spans).and_then(|stored| {
                crate::threads::install(|| {
                    batch
                        .par_iter_mut()
                        .zip(stored.par_iter())
                        .try_for_each(|((e, o), s)| self.decode_into(e, s, o))
                })
            });
            self.checked(r)?;
        }
        Ok(())
    }
}

/// Check a compressed entry's chunk table: contiguous from 0, each no longer than its raw
/// chunk, exactly filling the payload (FORMAT.md §3.3).
pub(super) fn check_chunk_table(e: &Entry<'_>, chunk_bytes: u32, url: &Path) -> Result<()> {
    let cb = chunk_bytes as u64;
    let mut pos = 0u64;
    for ci in 0..e.nchunks() {
        let c = e.chunk(ci);
        let raw_n = cb.min(e.raw_len - ci as u64 * cb);
        if c.rel_offset != pos || c.stored_len as u64 > raw_n {
            return Err(Error::corrupt(
                url,
                e.offset.saturating_add(c.rel_offset),
                format!(
                    "key {:?} chunk {ci}: record at {} (+{}) is not contiguous with the previous chunk or longer than its raw {raw_n} bytes",
                    e.key, c.rel_offset, c.stored_len
                ),
            ));
        }
        pos += c.stored_len as u64;
    }
    if pos != e.stored_len {
        return Err(Error::corrupt(
            url,
            e.offset + pos,
            format!(
                "key {:?}: chunks cover {pos} bytes of a {}-byte payload",
                e.key, e.stored_len
            ),
        ));
    }
    Ok(())
}
