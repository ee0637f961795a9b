// The logic of the fuzz targets, `include!`d by each cargo-fuzz target and by
// tests/fuzz_smoke.rs (which runs it on stable over the seed corpus plus deterministic
// mutations). Every function takes arbitrary bytes; a panic anywhere is a finding. Besides "no
// panic", each checks invariants a decoder must keep for whatever it accepts.

#[allow(unused_imports)]
use shardpoint_core::codec::{decode_chunk, decode_chunk_crc, effective_codec, encode_chunk_crc};
#[allow(unused_imports)]
use shardpoint_core::format::{
    crc, le_u32, le_u64, raw_len, Codec, DType, ShardHeader, ALL_DTYPES, BLOCK_ENTRIES, BLOCK_REC,
    DATA_START, ENTRY_REC, SHARD_HEADER_LEN,
};
#[allow(unused_imports)]
use shardpoint_core::index::IndexView;

/// Entries looked at per input: bounds the time of one execution on a huge entry_count.
#[allow(dead_code)]
const MAX_ENTRIES_TOUCHED: usize = 4096;

/// `IndexView::open` on arbitrary bytes, then every accessor: entries, keys, lookups (of keys
/// that are and are not there), prefix bounds, metadata, full verification.
#[allow(dead_code)]
pub fn fuzz_index(data: &[u8]) {
    let path = std::path::Path::new("fuzz.index");
    let Ok(v) = IndexView::open(data, path) else {
        return;
    };
    let n = v.len();
    assert!(
        n <= data.len() / ENTRY_REC,
        "entry count {n} cannot fit in {} bytes",
        data.len()
    );
    let version = le_u32(data, 8);
    for s in v.shards() {
        // a plain name (§3.1): no `/`; a hashed one (§3.1.1) only in a version 2 index, its
        // hex digits the hash of the name, exactly two `/`, never `..`
        match shardpoint_core::format::shard_name_version(s.name.as_bytes()) {
            Some(1) => assert!(!s.name.contains('/')),
            Some(2) => {
                assert_eq!(version, 2, "hashed name {:?} in a v{version} index", s.name);
                assert!(shardpoint_core::naming::valid_hashed_shard_name(s.name.as_bytes()));
                assert_eq!(s.name.matches('/').count(), 2);
                assert!(s.name.starts_with('/'));
            }
            other => panic!("accepted shard name {:?} ({other:?})", s.name),
        }
        assert!(!s.name.contains(".."));
    }
    let mut keys: Vec<(usize, Vec<u8>)> = Vec::new();
    for i in 0..n.min(MAX_ENTRIES_TOUCHED) {
        if let Ok(e) = v.entry(i) {
            assert_eq!(Some(e.raw_len), raw_len(&e.dims, e.dtype.itemsize()));
            assert!(e.offset >= DATA_START && e.offset % 64 == 0);
            let end = e
                .offset
                .checked_add(e.stored_len)
                .expect("checked by entry()");
            assert!(end <= v.shards()[e.shard as usize].file_len);
            assert!(!e.key.is_empty() && !e.key.contains('\0'));
            if e.codec == Codec::None {
                assert_eq!(e.stored_len, e.raw_len);
                assert_eq!(e.nchunks(), 0);
                // crc blocks (FORMAT.md §3.4): a count that follows from the value's length
                if e.block_log2 == 0 {
                    assert_eq!(e.nblocks(), 0);
                } else {
                    assert!((12..=24).contains(&e.block_log2));
                    assert_eq!(
                        e.nblocks() as u64,
                        e.raw_len.div_ceil(1u64 << e.block_log2)
                    );
                    let _ = e.block_crc_list();
                }
            } else {
                assert_eq!(e.block_log2, 0);
                assert_eq!(e.nblocks(), 0);
                assert!(e.stored_len <= e.raw_len);
                for c in 0..e.nchunks() {
                    let _ = e.chunk(c);
                }
            }
            keys.push((i, e.key.as_bytes().to_vec()));
        }
        let _ = v.key_bytes(i);
    }
    for (_, k) in keys.iter().take(64) {
        let key = std::str::from_utf8(k).expect("entry() returned a str");
        if let Ok(Some(j)) = v.find(key) {
            assert_eq!(
                v.key_bytes(j).ok(),
                Some(&k[..]),
                "find returned another key"
            );
        }
        let _ = v.lower_bound(k);
    }
    for probe in [&b""[..], b"a", b"\xff\xff", b"net/"] {
        if let Ok(i) = v.lower_bound(probe) {
            assert!(i <= n);
        }
    }
    let _ = v.find("missing/key");
    let _ = v.metadata_bytes();
    if v.verify_all().is_ok() {
        // A fully verified index is sorted: every key is found where it is listed.
        for (i, k) in keys.iter().take(64) {
            let key = std::str::from_utf8(k).expect("utf-8");
            assert_eq!(
                v.find(key).ok(),
                Some(Some(*i)),
                "verified index: {key:?} not found"
            );
        }
    }
}

/// `ShardHeader::decode` on arbitrary bytes: what it accepts re-encodes to the same bytes.
#[allow(dead_code)]
pub fn fuzz_shard_header(data: &[u8]) {
    let path = std::path::Path::new("fuzz.data-00000-of-00001");
    if let Ok((h, c)) = ShardHeader::decode(data, path) {
        let (b, c2) = h.encode();
        assert_eq!(c, c2);
        assert_eq!(&b[..], &data[..SHARD_HEADER_LEN]);
    }
}

/// `codec::decode_chunk` for every codec and dtype on arbitrary bytes (the first 4 bytes pick
/// codec, dtype and the expected raw length), plus an encode/decode round trip of the input.
#[allow(dead_code)]
pub fn fuzz_chunk(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let codec = [
        Codec::None,
        Codec::Zstd,
        Codec::ZstdByteGroup,
        Codec::HuffByteGroup,
    ][data[0] as usize % 4];
    let dtype = ALL_DTYPES[data[1] as usize % ALL_DTYPES.len()];
    // Raw lengths the reader can ask for: 1 ..= 64 KiB (chunks are never empty).
    let raw_n = 1 + (u16::from_le_bytes([data[2], data[3]]) as usize);
    let stored = &data[4..];
    let path = std::path::Path::new("fuzz.chunk");
    let mut out = vec![0u8; raw_n];
    if decode_chunk(codec, dtype, stored, &mut out, path, 0).is_ok() && stored.len() == raw_n {
        assert_eq!(
            &out[..],
            stored,
            "a chunk as long as its raw length is stored raw"
        );
    }
    // The crc-fused decoder agrees with the plain one and with crc32c of what it wrote.
    let mut out2 = vec![0u8; raw_n];
    let plain = decode_chunk(codec, dtype, stored, &mut out, path, 0);
    match decode_chunk_crc(codec, dtype, stored, &mut out2, path, 0) {
        Ok((c, sc)) => {
            assert!(plain.is_ok(), "fused decoder accepts what the plain one refuses");
            assert_eq!(out, out2, "fused and plain decoders disagree");
            assert_eq!(c, crc(&out2), "fused crc is not the output's crc");
            assert_eq!(sc, crc(stored), "fused stored crc is not the stored bytes' crc");
        }
        Err(_) => assert!(plain.is_err(), "fused decoder refuses what the plain one accepts"),
    }
    // Round trip: whatever the encoder produces, the decoder restores exactly.
    let w = dtype.itemsize();
    let raw = &stored[..stored.len() / w * w];
    if raw.is_empty() {
        return;
    }
    // Codec 3 is valid on every multi-byte dtype (the writer only picks it for floats).
    let c = match codec {
        Codec::HuffByteGroup if dtype.group_width() >= 2 => codec,
        _ => effective_codec(codec, dtype),
    };
    let enc = encode_chunk_crc(c, dtype, 1, raw).expect("encoding never fails on valid input");
    let st = enc.stored.unwrap_or_else(|| raw.to_vec());
    assert_eq!(enc.stored_crc, crc(&st), "stored crc");
    assert_eq!(enc.raw_crc, crc(raw), "raw crc");
    let mut back = vec![0u8; raw.len()];
    decode_chunk(c, dtype, &st, &mut back, path, 0).expect("own encoding decodes");
    assert_eq!(&back[..], raw);
}

/// Recompute every crc of an index (block crcs, shard/block/metadata crcs, header crc and its
/// footer copy) so mutated bytes reach the semantic checks instead of stopping at a checksum.
/// Best effort: out-of-bounds layouts are left as they are.
#[allow(dead_code)]
pub fn reseal_index(b: &mut [u8]) {
    if b.len() < 144 {
        return;
    }
    let g = |b: &[u8], at: usize| le_u64(b, at);
    let (n, shard_count) = (g(b, 24), le_u32(b, 32) as u64);
    let (so, bo, eo, ko, kl, ao, al, mo, ml) = (
        g(b, 40),
        g(b, 48),
        g(b, 56),
        g(b, 64),
        g(b, 72),
        g(b, 80),
        g(b, 88),
        g(b, 96),
        g(b, 104),
    );
    let len = b.len() as u64;
    let fits = |off: u64, l: u64| off.checked_add(l).is_some_and(|e| e <= len);
    let nblocks = n.div_ceil(BLOCK_ENTRIES as u64);
    let sec_ok = n < len
        && fits(so, shard_count.saturating_mul(64))
        && fits(bo, nblocks.saturating_mul(BLOCK_REC as u64))
        && fits(eo, n.saturating_mul(ENTRY_REC as u64))
        && fits(ko, kl)
        && fits(ao, al)
        && fits(mo, ml);
    if sec_ok {
        for blk in 0..nblocks as usize {
            let at = bo as usize + blk * BLOCK_REC;
            let (klo, alo) = (g(b, at), g(b, at + 8));
            let (khi, ahi) = if blk + 1 < nblocks as usize {
                (g(b, at + BLOCK_REC), g(b, at + BLOCK_REC + 8))
            } else {
                (kl, al)
            };
            if klo > khi || khi > kl || alo > ahi || ahi > al {
                continue;
            }
            let lo = blk * BLOCK_ENTRIES;
            let hi = (lo + BLOCK_ENTRIES).min(n as usize);
            let e0 = eo as usize;
            let mut c = crc(&b[e0 + lo * ENTRY_REC..e0 + hi * ENTRY_REC]);
            c = crc32c::crc32c_append(c, &b[(ko + klo) as usize..(ko + khi) as usize]);
            c = crc32c::crc32c_append(c, &b[(ao + alo) as usize..(ao + ahi) as usize]);
            b[at + 16..at + 20].copy_from_slice(&c.to_le_bytes());
        }
        let sc = crc(&b[so as usize..(so + shard_count * 64) as usize]);
        let bc = crc(&b[bo as usize..(bo + nblocks * BLOCK_REC as u64) as usize]);
        let mc = crc(&b[mo as usize..(mo + ml) as usize]);
        b[112..116].copy_from_slice(&sc.to_le_bytes());
        b[116..120].copy_from_slice(&bc.to_le_bytes());
        b[120..124].copy_from_slice(&mc.to_le_bytes());
    }
    let hc = crc(&b[..124]);
    b[124..128].copy_from_slice(&hc.to_le_bytes());
    let f = b.len() - 16;
    b[f..f + 8].copy_from_slice(b"SPINDEND");
    b[f + 8..f + 12].copy_from_slice(&hc.to_le_bytes());
    b[f + 12..f + 16].copy_from_slice(&[0; 4]);
}
