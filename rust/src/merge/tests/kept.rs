//! The merge's kept buffers (merge/kept.rs): merges one after another in one process, of
//! other sizes and with a hostile partial between them, each give the bytes a merge from
//! nothing gives (here: sorting the union and building it in one go, `expected`).

use super::*;

/// Write `parts` as the partial indexes of `prefix`, merge them from the files and return the
/// committed index (or the merge's error).
fn merge_files(dir: &Path, name: &str, parts: &[Vec<u8>]) -> Result<Vec<u8>> {
    let prefix = dir.join(name);
    let world = parts.len() as u32;
    for (r, b) in parts.iter().enumerate() {
        std::fs::write(partial_index_path(&prefix, r as u32, world), b).unwrap();
    }
    merge(&prefix, world, false, Some(WORLD_TOKEN))?;
    Ok(std::fs::read(crate::naming::index_path(&prefix)).unwrap())
}

/// `world` partials of `per_rank(r)` interleaved keys each.
fn save(world: u32, per_rank: impl Fn(u32) -> usize) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| {
            let n = per_rank(r);
            partial(
                r,
                world,
                &keys("k.", (0..n).map(|i| i * world as usize + r as usize)),
            )
        })
        .collect()
}

#[test]
fn merges_of_other_sizes_one_after_another_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let saves = [
        save(6, |_| 90),  // sizes the arena from its first partial
        save(3, |_| 20),  // smaller: over the stale bytes of the first
        save(9, |_| 140), // larger than what is kept: grows (and the index buffer too)
        // a later partial far larger than the first (which sized an empty arena): read
        // into a buffer of its own when it does not fit
        save(4, |r| if r == 2 { 2000 } else { 5 }),
        save(6, |_| 90), // the first again, after all that
    ];
    for (i, parts) in saves.iter().enumerate() {
        let got = merge_files(dir.path(), &format!("ck{i}"), parts).unwrap();
        assert_eq!(got, expected(parts), "merge {i}");
        assert_eq!(
            got,
            run(parts).unwrap().index,
            "merge {i}: the in-memory merge's bytes"
        );
    }
}

#[test]
fn a_hostile_partial_after_a_good_merge_is_refused_and_poisons_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = save(5, |_| 70);
    assert_eq!(
        merge_files(dir.path(), "a", &good).unwrap(),
        expected(&good)
    );

    // rank 1's key blob with a flipped bit: refused naming its file
    let mut bad = save(5, |_| 70);
    let keys_off = le_u64(&bad[1], 64) as usize;
    bad[1][keys_off + 2] ^= 1;
    let err = merge_files(dir.path(), "b", &bad).unwrap_err().to_string();
    assert!(err.contains("b.index.part-00001-of-00005"), "{err}");
    // truncated: refused naming its file
    let mut short = save(5, |_| 70);
    let cut = short[3].len() - 9;
    short[3].truncate(cut);
    let err = merge_files(dir.path(), "c", &short)
        .unwrap_err()
        .to_string();
    assert!(err.contains("c.index.part-00003-of-00005"), "{err}");
    // a file that is not an index at all, as long as a real partial: refused
    let mut junk = save(5, |_| 70);
    junk[4] = vec![0x5a; junk[4].len()];
    let err = merge_files(dir.path(), "d", &junk).unwrap_err().to_string();
    assert!(err.contains("d.index.part-00004-of-00005"), "{err}");

    // the next merges, smaller and larger, over whatever the failed ones left
    for (i, parts) in [save(5, |_| 60), save(7, |_| 80)].iter().enumerate() {
        let got = merge_files(dir.path(), &format!("e{i}"), parts).unwrap();
        assert_eq!(got, expected(parts), "merge {i} after the refused ones");
    }
}
