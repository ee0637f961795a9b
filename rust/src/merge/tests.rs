//! The k-way merge of partial indexes: byte-identical to sorting the union and building it,
//! duplicates across partials named by rank, hostile partials refused naming the file.

use super::*;
use crate::format::{crc, le_u32, le_u64, Codec, DType, Kind, BLOCK_ENTRIES, BLOCK_REC};
use crate::index::{build_index, ChunkRec, EntryMeta};
use crate::naming::partial_index_path;

const WORLD_TOKEN: &str = "step-9";

fn shard(rank: u32, world: u32) -> ShardRec {
    ShardRec {
        file_len: 1 << 20,
        save_token: 0x5eed + rank as u64,
        header_crc: 0xabc0 + rank,
        name: format!(".data-{rank:05}-of-{world:05}"),
    }
}

/// Entry `key` in shard 0 of its partial: raw float32 vectors, 2-d raw tensors and
/// zstd-chunked tensors in turn (inline dims, dims in aux, dims + chunk table).
fn entry(key: &str, i: usize) -> EntryMeta {
    let (codec, dims, chunks) = match i % 3 {
        0 => (Codec::None, vec![4 + i as u64], vec![]),
        1 => (Codec::None, vec![2, 3 + i as u64], vec![]),
        _ => (
            Codec::Zstd,
            vec![3, 5],
            vec![ChunkRec {
                rel_offset: 0,
                stored_len: 20,
                crc: i as u32,
            }],
        ),
    };
    let raw: u64 = dims.iter().product::<u64>() * 4;
    EntryMeta {
        key: key.to_string(),
        dtype: DType::F32,
        codec,
        kind: Kind::Tensor,
        dims,
        shard: 0,
        crc: 0x1000 + i as u32,
        offset: 4096 + 64 * i as u64,
        stored_len: if codec == Codec::None { raw } else { 20 },
        chunks,
        block_log2: 0,
        block_crcs: Vec::new(),
    }
}

/// The partial index of `rank` holding `keys` (any order) in one shard.
fn partial(rank: u32, world: u32, keys: &[String]) -> Vec<u8> {
    let entries = keys.iter().enumerate().map(|(i, k)| entry(k, i)).collect();
    let meta = meta_blob(
        r#"{"step":9}"#,
        &partial_marker(rank, world, 40 + rank as u64, WORLD_TOKEN),
        "",
    );
    build_index(
        &[shard(rank, world)],
        entries,
        DEFAULT_CHUNK_BYTES,
        meta.as_bytes(),
    )
    .unwrap()
}

fn name(rank: u32) -> PathBuf {
    PathBuf::from(format!("ck.index.partial-{rank:05}"))
}

fn run(parts: &[Vec<u8>]) -> Result<Merged> {
    // a place of its own each time: no remembered order (the tests run in parallel)
    static CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    run_at(parts, &format!("merge-test-{n}"))
}

/// The merge of `parts` into the index at `at` (where its order is remembered).
fn run_at(parts: &[Vec<u8>], at: &str) -> Result<Merged> {
    merge_partials(parts.len() as u32, Some(WORLD_TOKEN), at, Vec::new(), |r| {
        Ok((name(r), parts[r as usize].clone()))
    })
}

/// What the merge must produce: the union of the partials' entries (shards renumbered)
/// sorted and built in one go, with the metadata the merge writes.
fn expected(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut shards = Vec::new();
    let mut entries = Vec::new();
    for (r, b) in parts.iter().enumerate() {
        let v = IndexView::open(b.as_slice(), &name(r as u32)).unwrap();
        let base = shards.len() as u32;
        shards.extend(v.shards().iter().cloned());
        for i in 0..v.len() {
            let mut e = v.entry(i).unwrap().to_meta();
            e.shard += base;
            entries.push(e);
        }
    }
    let meta = meta_blob(
        r#"{"step":9}"#,
        &format!(",\"writers\":{}", parts.len()),
        "",
    );
    build_index(&shards, entries, DEFAULT_CHUNK_BYTES, meta.as_bytes()).unwrap()
}

fn keys(prefix: &str, idx: impl Iterator<Item = usize>) -> Vec<String> {
    idx.map(|i| format!("{prefix}{i:04}")).collect()
}

#[test]
fn k_way_merge_is_byte_identical_to_sorting_the_union() {
    // Interleaved key ranges, partials of several blocks (64 entries each) and of one entry.
    let world = 4;
    let parts: Vec<Vec<u8>> = (0..world)
        .map(|r| {
            let n = [150usize, 1, 70, 129][r as usize];
            partial(
                r,
                world,
                &keys("layer.", (0..n).map(|i| i * 4 + r as usize)),
            )
        })
        .collect();
    let m = run(&parts).unwrap();
    assert_eq!(m.shards.len(), 4);
    assert_eq!(m.index, expected(&parts));
    let v = IndexView::open(m.index.as_slice(), Path::new("merged")).unwrap();
    v.verify_all().unwrap();
    assert_eq!(v.len(), 150 + 1 + 70 + 129);
    // Rank 2's entries point at rank 2's shard, renumbered to 2.
    let i = v.find("layer.0002").unwrap().unwrap();
    assert_eq!(v.entry(i).unwrap().shard, 2);
    const { assert!(BLOCK_ENTRIES < 150) }; // rank 0 spans several blocks
}

#[test]
fn one_partial_and_empty_partials_merge() {
    let one = vec![partial(0, 1, &keys("w", 0..65))];
    let m = run(&one).unwrap();
    assert_eq!(m.index, expected(&one));

    let parts = vec![
        partial(0, 3, &[]),
        partial(1, 3, &keys("w", 0..3)),
        partial(2, 3, &[]),
    ];
    let m = run(&parts).unwrap();
    assert_eq!(m.index, expected(&parts));
    let v = IndexView::open(m.index.as_slice(), Path::new("merged")).unwrap();
    assert_eq!(v.len(), 3);
    assert_eq!(m.shards.len(), 3);

    let none: Vec<Vec<u8>> = (0..2).map(|r| partial(r, 2, &[])).collect();
    let m = run(&none).unwrap();
    let v = IndexView::open(m.index.as_slice(), Path::new("merged")).unwrap();
    v.verify_all().unwrap();
    assert!(v.is_empty());
    assert_eq!(m.index, expected(&none));
}

#[test]
fn a_key_written_by_two_ranks_names_both() {
    let parts = vec![
        partial(0, 3, &keys("a", 0..10)),
        partial(1, 3, &keys("b", 0..10)),
        partial(2, 3, &[keys("a", 7..8), keys("c", 0..2)].concat()),
    ];
    match run(&parts) {
        Err(Error::DuplicateKey { key, context }) => {
            assert_eq!(key, "a0007");
            assert_eq!(context, "written by rank 0 and rank 2");
        }
        other => panic!("expected a duplicate key error, got {:?}", other.err()),
    }
}

/// Recompute every crc of an index after its bytes were edited (a hostile writer's file).
fn reseal(b: &mut [u8]) {
    let entries_off = le_u64(b, 56) as usize;
    let keys_off = le_u64(b, 64) as usize;
    let aux_off = le_u64(b, 80) as usize;
    let (keys_len, aux_len) = (le_u64(b, 72) as usize, le_u64(b, 88) as usize);
    let blocks_off = le_u64(b, 48) as usize;
    let n = le_u64(b, 24) as usize;
    let nb = n.div_ceil(BLOCK_ENTRIES);
    for blk in 0..nb {
        let at = blocks_off + blk * BLOCK_REC;
        let (klo, alo) = (le_u64(b, at) as usize, le_u64(b, at + 8) as usize);
        let (khi, ahi) = if blk + 1 < nb {
            (
                le_u64(b, at + BLOCK_REC) as usize,
                le_u64(b, at + BLOCK_REC + 8) as usize,
            )
        } else {
            (keys_len, aux_len)
        };
        let lo = blk * BLOCK_ENTRIES;
        let hi = (lo + BLOCK_ENTRIES).min(n);
        let mut c = crc(&b[entries_off + lo * 40..entries_off + hi * 40]);
        c = crc32c::crc32c_append(c, &b[keys_off + klo..keys_off + khi]);
        c = crc32c::crc32c_append(c, &b[aux_off + alo..aux_off + ahi]);
        b[at + 16..at + 20].copy_from_slice(&c.to_le_bytes());
    }
    let bc = crc(&b[blocks_off..blocks_off + nb * BLOCK_REC]);
    b[116..120].copy_from_slice(&bc.to_le_bytes());
    let hc = crc(&b[..124]);
    b[124..128].copy_from_slice(&hc.to_le_bytes());
    let f = b.len() - 16;
    b[f + 8..f + 12].copy_from_slice(&hc.to_le_bytes());
    assert_eq!(le_u32(b, 124), hc);
}

#[test]
fn hostile_partials_are_refused_naming_the_file() {
    let good = |r| partial(r, 3, &keys(&format!("r{r}."), 0..5));
    // Two keys swapped in place, every crc recomputed: only the order check can see it.
    let mut unsorted = good(1);
    let keys_off = le_u64(&unsorted, 64) as usize;
    let k = b"r1.0000".len();
    let (a, b) = (keys_off, keys_off + k);
    let first = unsorted[a..a + k].to_vec();
    unsorted.copy_within(b..b + k, a);
    unsorted[b..b + k].copy_from_slice(&first);
    reseal(&mut unsorted);
    let err = run(&[good(0), unsorted, good(2)]).unwrap_err().to_string();
    assert!(err.contains("ck.index.partial-00001"), "{err}");
    assert!(err.contains("not strictly sorted"), "{err}");

    // One flipped bit in rank 2's key blob: a checksum error naming rank 2's file.
    let mut flipped = good(2);
    let keys_off = le_u64(&flipped, 64) as usize;
    flipped[keys_off + 3] ^= 1;
    let err = run(&[good(0), good(1), flipped]).unwrap_err().to_string();
    assert!(err.contains("ck.index.partial-00002"), "{err}");

    // An entry pointing past its partial's only shard, crcs recomputed.
    let mut bad_shard = good(0);
    let entries_off = le_u64(&bad_shard, 56) as usize;
    bad_shard[entries_off + 12..entries_off + 16].copy_from_slice(&1u32.to_le_bytes());
    reseal(&mut bad_shard);
    let err = run(&[bad_shard, good(1), good(2)]).unwrap_err().to_string();
    assert!(err.contains("ck.index.partial-00000"), "{err}");
    assert!(err.contains("shard 1 out of range"), "{err}");

    // Truncated.
    let mut short = good(1);
    short.truncate(short.len() - 1);
    let err = run(&[good(0), short, good(2)]).unwrap_err().to_string();
    assert!(err.contains("ck.index.partial-00001"), "{err}");
}

#[test]
fn merged_index_survives_a_commit_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("ck");
    let parts: Vec<Vec<u8>> = (0..2)
        .map(|r| partial(r, 2, &keys("t", (0..40).map(|i| i * 2 + r as usize))))
        .collect();
    for (r, b) in parts.iter().enumerate() {
        std::fs::write(partial_index_path(&prefix, r as u32, 2), b).unwrap();
    }
    merge(&prefix, 2, false, Some(WORLD_TOKEN)).unwrap();
    let bytes = std::fs::read(crate::naming::index_path(&prefix)).unwrap();
    assert_eq!(bytes, expected(&parts));
}

#[test]
fn sections_and_user_metadata_survive_the_metadata_json() {
    let sections = r#"{"t":{"aliases":{"a":1,"user":{"x":"q\"\\"}}},"n":"\u0001"}"#;
    let user = r#"{"a": 1, "user": 2}"#;
    let extra = partial_marker(1, 2, 7, "step-3");
    let blob = meta_blob(user, &extra, sections);
    let meta: StoredMeta<'_> = serde_json::from_str(&blob).unwrap();
    assert_eq!(meta.sections.as_deref(), Some(sections));
    assert_eq!(meta.user.map(|u| u.get()), Some(user)); // verbatim, spacing kept
    assert_eq!(meta.partial.unwrap().merge_token, "step-3");
    let plain_blob = meta_blob("{}", "", "");
    let plain: StoredMeta<'_> = serde_json::from_str(&plain_blob).unwrap();
    assert!(plain.sections.is_none() && plain.partial.is_none());
    assert_eq!(plain.user.map(|u| u.get()), Some("{}"));
}

mod kept;
mod order;
