//! The remembered merge order (merge/order.rs): a save whose layout did not change merges in
//! the order of the last merge at its prefix, giving the bytes the heap gives; a changed
//! layout, a hostile partial or a bogus remembered order falls back to the heap, never to a
//! wrong index.

use super::*;
use crate::merge::order::{remember, MergeOrder};
use std::sync::Arc;

/// DCP's layout in small: rank r holds `t{j}@{r},0` for each tensor j, so the keys of all
/// ranks interleave. `save` varies what a new save changes (crcs, offsets, shard tokens).
fn dcp_partial(rank: u32, world: u32, tensors: usize, save: u32, extra: &[&str]) -> Vec<u8> {
    let mut keys: Vec<String> = (0..tensors).map(|j| format!("t{j:03}@{rank},0")).collect();
    keys.extend(extra.iter().map(|k| k.to_string()));
    let entries = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut e = entry(k, i);
            e.crc ^= save.wrapping_mul(0x9e37_79b9);
            e.offset += 64 * save as u64;
            e
        })
        .collect();
    let mut s = shard(rank, world);
    s.save_token ^= (save as u64) << 32;
    s.header_crc ^= save;
    s.file_len += 64 * (save as u64 + 1) * 64;
    let meta = meta_blob(
        r#"{"step":9}"#,
        &partial_marker(rank, world, 40 + rank as u64, WORLD_TOKEN),
        "",
    );
    build_index(&[s], entries, DEFAULT_CHUNK_BYTES, meta.as_bytes()).unwrap()
}

fn dcp_save(world: u32, save: u32) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| dcp_partial(r, world, 5, save, &[]))
        .collect()
}

/// A place of this test's own in the process-wide order cache.
fn place(test: &str) -> String {
    format!("order-test-{test}")
}

#[test]
fn an_unchanged_layout_merges_in_order_to_the_same_bytes() {
    let at = place("unchanged");
    let world = 64;
    let first = run_at(&dcp_save(world, 0), &at).unwrap();
    assert!(!first.in_order, "nothing remembered yet: the heap merges");
    let parts = dcp_save(world, 1);
    let again = run_at(&parts, &at).unwrap();
    assert!(again.in_order, "same keys: the remembered order is taken");
    assert_eq!(again.index, expected(&parts));
    assert_eq!(again.index, run(&parts).unwrap().index, "the heap's bytes");
    assert_ne!(again.index, first.index, "the values did change");
    assert_eq!(again.shards, run(&parts).unwrap().shards);
}

#[test]
fn a_changed_layout_falls_back_to_the_heap() {
    let world = 64;
    // (what changes, rank 17's extra keys, rank 17's tensor count)
    let cases: [(&str, &[&str], usize); 4] = [
        ("key added", &["t002@17,0a"], 5),
        ("key removed", &[], 4),
        ("key renamed out of place", &["zzz"], 4),
        ("key added at the end", &["t004@17,1"], 5),
    ];
    for (what, extra, tensors) in cases {
        let at = place(what);
        run_at(&dcp_save(world, 0), &at).unwrap();
        let mut parts = dcp_save(world, 1);
        parts[17] = dcp_partial(17, world, tensors, 1, extra);
        let m = run_at(&parts, &at).unwrap();
        assert!(!m.in_order, "{what}: the remembered order must not fit");
        assert_eq!(m.index, expected(&parts), "{what}");
        // and the heap's order is remembered in its place: the next such save fits
        let m = run_at(&parts, &at).unwrap();
        assert!(m.in_order, "{what}: the new layout is remembered");
        assert_eq!(m.index, expected(&parts), "{what}");
    }
}

#[test]
fn a_changed_size_keeps_the_order_and_records_the_new_size() {
    let at = place("size");
    let world = 8;
    run_at(&dcp_save(world, 0), &at).unwrap();
    let mut parts = dcp_save(world, 1);
    // rank 3's entries change size (the dims cycle moves by one): same keys, new records
    let keys: Vec<String> = (0..5).map(|j| format!("t{j:03}@3,0")).collect();
    let entries = keys
        .iter()
        .enumerate()
        .map(|(i, k)| entry(k, i + 3))
        .collect();
    let meta = meta_blob(
        r#"{"step":9}"#,
        &partial_marker(3, world, 43, WORLD_TOKEN),
        "",
    );
    parts[3] = build_index(
        &[shard(3, world)],
        entries,
        DEFAULT_CHUNK_BYTES,
        meta.as_bytes(),
    )
    .unwrap();
    let m = run_at(&parts, &at).unwrap();
    assert!(m.in_order);
    assert_eq!(m.index, expected(&parts));
}

#[test]
fn keys_swapped_between_ranks_with_the_same_counts_cannot_pass() {
    // Hostile: every partial keeps its entry count (so the remembered order "fits" at first
    // sight) but two ranks swap a key each: the order's keys are no longer increasing.
    let at = place("swap");
    let world = 16;
    run_at(&dcp_save(world, 0), &at).unwrap();
    let mut parts = dcp_save(world, 1);
    parts[2] = dcp_partial(2, world, 4, 1, &["t004@9,0"]);
    parts[9] = dcp_partial(9, world, 4, 1, &["t004@2,0"]);
    let m = run_at(&parts, &at).unwrap();
    assert!(!m.in_order);
    assert_eq!(m.index, expected(&parts));
}

#[test]
fn a_duplicate_key_is_named_by_the_heap_even_when_counts_fit() {
    let at = place("duplicate");
    let world = 8;
    run_at(&dcp_save(world, 0), &at).unwrap();
    let mut parts = dcp_save(world, 1);
    // rank 5 writes rank 4's t001 in place of its own: counts unchanged
    let keys = ["t000@5,0", "t001@4,0", "t002@5,0", "t003@5,0", "t004@5,0"];
    let entries = keys.iter().enumerate().map(|(i, k)| entry(k, i)).collect();
    let meta = meta_blob(
        r#"{"step":9}"#,
        &partial_marker(5, world, 45, WORLD_TOKEN),
        "",
    );
    parts[5] = build_index(
        &[shard(5, world)],
        entries,
        DEFAULT_CHUNK_BYTES,
        meta.as_bytes(),
    )
    .unwrap();
    match run_at(&parts, &at) {
        Err(Error::DuplicateKey { key, context }) => {
            assert_eq!(key, "t001@4,0");
            assert!(context.contains("rank 4 and rank 5"), "{context}");
        }
        other => panic!("expected a duplicate key error, got {other:?}"),
    }
}

#[test]
fn a_bogus_remembered_order_is_only_a_failed_guess() {
    // An order whose counts fit but whose sequence is wrong (reversed), and one naming a
    // rank too often: both fail part way, and the heap's bytes are committed.
    let world = 12;
    let parts = dcp_save(world, 1);
    let good = run(&parts).unwrap().index;
    let n = 5 * world as usize;
    let reversed: Vec<u32> = (0..n).map(|i| (i % world as usize) as u32).rev().collect();
    let mut skewed: Vec<u32> = (0..n).map(|i| (i % world as usize) as u32).collect();
    skewed[0] = 1; // rank 1 six times, rank 0 four: the counts no longer fit
                   // the lengths of the true order's entries: the bogus orders fit the index's shape
    let view = IndexView::open(good.clone(), Path::new("good")).unwrap();
    let entries: Vec<_> = (0..n).map(|i| view.entry_raw(i).unwrap()).collect();
    let key_lens: Vec<u32> = entries.iter().map(|e| e.key.len() as u32).collect();
    let aux_lens: Vec<u32> = entries.iter().map(|e| e.aux.len() as u32).collect();
    for (what, ranks) in [("reversed", reversed), ("skewed", skewed)] {
        let at = place(what);
        let o = MergeOrder::new(&ranks, &key_lens, &aux_lens, world as usize, world as usize);
        remember(&at, Arc::new(o.unwrap()));
        let m = run_at(&parts, &at).unwrap();
        assert!(!m.in_order, "{what}");
        assert_eq!(m.index, good, "{what}");
    }
}

#[test]
fn hostile_partials_are_refused_when_the_remembered_order_fits() {
    // Every partial keeps its entry count and key and aux lengths, so the remembered order
    // places them (no cheap test says "changed"): each is still refused naming its file.
    let world = 8;
    let at = place("hostile");
    let name_of = |r: u32| name(r).display().to_string();
    // an entry pointing past its partial's only shard, every crc recomputed
    let mut bad_shard = dcp_save(world, 1);
    let entries_off = le_u64(&bad_shard[3], 56) as usize;
    bad_shard[3][entries_off + 12..entries_off + 16].copy_from_slice(&1u32.to_le_bytes());
    reseal(&mut bad_shard[3]);
    // one flipped bit in a key
    let mut flipped = dcp_save(world, 1);
    let keys_off = le_u64(&flipped[5], 64) as usize;
    flipped[5][keys_off + 2] ^= 1;
    // two keys swapped inside rank 6's partial, crcs recomputed (same lengths: t000/t001)
    let mut swapped = dcp_save(world, 1);
    let keys_off = le_u64(&swapped[6], 64) as usize;
    let k = b"t000@6,0".len();
    let first = swapped[6][keys_off..keys_off + k].to_vec();
    swapped[6].copy_within(keys_off + k..keys_off + 2 * k, keys_off);
    swapped[6][keys_off + k..keys_off + 2 * k].copy_from_slice(&first);
    reseal(&mut swapped[6]);
    // a partial of another save (another merge token), same keys
    let mut foreign = dcp_save(world, 1);
    let meta = meta_blob(
        r#"{"step":9}"#,
        &partial_marker(2, world, 42, "step-10"),
        "",
    );
    let entries = (0..5).map(|j| entry(&format!("t{j:03}@2,0"), j)).collect();
    foreign[2] = build_index(
        &[shard(2, world)],
        entries,
        DEFAULT_CHUNK_BYTES,
        meta.as_bytes(),
    )
    .unwrap();
    let cases = [
        ("shard out of range", bad_shard, 3, "shard 1 out of range"),
        ("flipped bit", flipped, 5, "checksum"),
        ("keys swapped", swapped, 6, "not strictly sorted"),
        ("foreign partial", foreign, 2, "merge token"),
    ];
    for (what, parts, rank, says) in cases {
        run_at(&dcp_save(world, 0), &at).unwrap();
        let placed = run_at(&dcp_save(world, 2), &at).unwrap();
        assert!(
            placed.in_order,
            "{what}: the layout before it is remembered and placed"
        );
        let err = run_at(&parts, &at).unwrap_err().to_string();
        assert!(err.contains(&name_of(rank)), "{what}: {err}");
        assert!(err.to_lowercase().contains(says), "{what}: {err}");
    }
    // and a good save after all that merges to the right bytes
    let parts = dcp_save(world, 3);
    assert_eq!(run_at(&parts, &at).unwrap().index, expected(&parts));
}
