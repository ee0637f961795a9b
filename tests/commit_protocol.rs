//! Crash simulation of the commit protocol (FORMAT.md §8) and the multi-writer merge.
//!
//! A crash can stop a save between any two steps. For each step we leave the directory exactly
//! as a crash there would (temp files, published shards without an index, an index temp file)
//! and check: the previous checkpoint still reads back unchanged, and the next save removes
//! the leftovers.

use shardpoint_core::commit::{index_path, with_suffix};
use shardpoint_core::index::build_index;
use shardpoint_core::shard::{EncodeOptions, ShardWriter};
use shardpoint_core::{merge, save, CheckpointWriter, Error};

mod common;
use common::*;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn new_values() -> BTreeMap<String, Val> {
    let mut v = sample_values();
    v.insert(
        "new/only".into(),
        (DType::U8, Kind::Tensor, vec![2], vec![9, 9]),
    );
    v.remove("a/noise");
    v
}

#[test]
fn crash_at_every_step_keeps_the_previous_checkpoint() {
    if let Some(p) = std::env::var_os("SP_CRASH_PREFIX") {
        crash_child(Path::new(&p)); // we are the child process spawned below
    }
    let enc = EncodeOptions {
        codec: Codec::Zstd,
        level: 1,
        chunk_bytes: 4096,
    };
    for step in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let old = sample_values();
        save(&p, &items(&old), opts(Codec::Zstd, 1)).unwrap();
        let old_files = names(dir.path());
        // Simulate the new save crashing after `step` steps.
        let nv = new_values();
        let its = items(&nv);
        if step == 0 {
            // Killed while writing: a real crash in a child process (its temp-file lock dies
            // with it), leaving a half-written temp shard behind.
            let st = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "crash_at_every_step_keeps_the_previous_checkpoint",
                    "--nocapture",
                ])
                .env("SP_CRASH_PREFIX", &p)
                .status()
                .unwrap();
            assert!(!st.success(), "the child must die mid-write");
        } else {
            let mut w = ShardWriter::create(&p, 0, 1, 0xabc).unwrap();
            for it in &its {
                w.write_item(it, enc).unwrap();
            }
            {
                let (rec, ents) = w.finish(false).unwrap(); // published under a token name
                assert!(
                    rec.name.ends_with("0000000000000abc"),
                    "old shard name is taken: {}",
                    rec.name
                );
                if step >= 2 {
                    let bytes = build_index(&[rec], ents, 4096, b"{}").unwrap();
                    let tmp = with_suffix(&index_path(&p), ".tmp-00000000deadbeef");
                    std::fs::write(
                        &tmp,
                        &bytes[..if step == 2 {
                            bytes.len() / 2
                        } else {
                            bytes.len()
                        }],
                    )
                    .unwrap();
                }
            }
        }
        // The previous checkpoint is intact and unchanged.
        assert_eq!(read_all(&p).unwrap(), old, "step {step}");
        Reader::open(&p).unwrap().verify().unwrap();
        assert!(
            names(dir.path()).len() > old_files.len(),
            "step {step}: leftovers exist"
        );
        // The next save succeeds and cleans every leftover.
        save(&p, &items(&nv), opts(Codec::Zstd, 1)).unwrap();
        assert_eq!(read_all(&p).unwrap(), nv);
        let left = names(dir.path());
        assert_eq!(
            left.len(),
            2,
            "step {step}: only the index and one shard remain: {left:?}"
        );
    }
}

/// The crash child of `crash_at_every_step_keeps_the_previous_checkpoint`: writes part of a
/// shard, then dies without unwinding.
fn crash_child(p: &Path) -> ! {
    let enc = EncodeOptions {
        codec: Codec::Zstd,
        level: 1,
        chunk_bytes: 4096,
    };
    let nv = new_values();
    let mut w = ShardWriter::create(p, 0, 1, 0xabc).unwrap();
    for it in items(&nv).iter().take(3) {
        w.write_item(it, enc).unwrap();
    }
    std::process::abort();
}

#[test]
fn cleanup_spares_a_live_writers_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let slow = CheckpointWriter::new(&p, opts(Codec::None, 1)).unwrap();
    slow.add_parallel(&items(&sample_values())).unwrap();
    // Another save commits at the same prefix while `slow` is still writing.
    save(&p, &items(&new_values()), opts(Codec::None, 1)).unwrap();
    slow.commit()
        .expect("the live writer's temp shard survived the other commit's cleanup");
    assert_eq!(read_all(&p).unwrap(), sample_values());
}

#[test]
fn reader_of_old_checkpoint_survives_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let old = sample_values();
    save(&p, &items(&old), opts(Codec::None, 1)).unwrap();
    let r = Reader::open(&p).unwrap();
    let e = r.entry("a/smooth").unwrap();
    let before = r.stored(&e).unwrap();
    for _ in 0..3 {
        save(&p, &items(&new_values()), opts(Codec::None, 1)).unwrap();
    }
    // The old reader's mapping still shows the old bytes (files are never rewritten in place).
    assert_eq!(r.stored(&e).unwrap(), before);
    r.verify().unwrap();
    assert_eq!(read_all(&p).unwrap(), new_values());
}

#[test]
fn abandoned_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    {
        let w = CheckpointWriter::new(&p, opts(Codec::None, 2)).unwrap();
        w.add_parallel(&items(&sample_values())).unwrap();
    } // dropped without commit
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    assert!(matches!(Reader::open(&p), Err(Error::NotFound { .. })));
}

fn rank_opts(rank: u32, world: u32) -> WriterOptions {
    WriterOptions {
        rank,
        world_size: world,
        shards: 2,
        durable: false,
        chunk_bytes: 4096,
        codec: Codec::ZstdByteGroup,
        ..Default::default()
    }
}

#[test]
fn multi_writer_merge() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let all = sample_values();
    let world = 3u32;
    std::thread::scope(|s| {
        for rank in 0..world {
            let (p, all) = (&p, &all);
            s.spawn(move || {
                let mine: BTreeMap<String, Val> = all
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i as u32 % world == rank)
                    .map(|(_, (k, v))| (k.clone(), v.clone()))
                    .collect();
                let w = CheckpointWriter::new(p, rank_opts(rank, world)).unwrap();
                w.add_parallel(&items(&mine)).unwrap();
                w.commit().unwrap();
            });
        }
    });
    // Nothing visible before the merge.
    assert!(matches!(Reader::open(&p), Err(Error::NotFound { .. })));
    merge(&p, world, false, None).unwrap();
    assert_eq!(read_all(&p).unwrap(), all);
    let r = Reader::open(&p).unwrap();
    assert_eq!(r.shards().len(), 6);
    r.verify().unwrap();
    assert!(
        !names(dir.path()).iter().any(|n| n.contains(".part-")),
        "partials removed"
    );
}

#[test]
fn merge_refuses_duplicates_and_missing_writers() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let all = sample_values();
    for rank in 0..2 {
        let w = CheckpointWriter::new(&p, rank_opts(rank, 2)).unwrap();
        w.add_parallel(&items(&all)).unwrap();
        w.commit().unwrap();
    }
    let e = merge(&p, 2, false, None).unwrap_err().to_string();
    assert!(
        e.contains("duplicate key") && e.contains("rank 0 and rank 1"),
        "{e}"
    );
    let e = merge(&p, 3, false, None).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("part-00000-of-00003"), "{e}");
}

#[test]
fn merge_refuses_partials_of_different_saves() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let all = sample_values();
    let mut halves = [BTreeMap::new(), BTreeMap::new()];
    for (i, (k, v)) in all.iter().enumerate() {
        halves[i % 2].insert(k.clone(), v.clone());
    }
    // Save "step-1" crashed after both partials; save "step-2" only got rank 0's partial.
    for (rank, tok) in [(0u32, "step-1"), (1, "step-1"), (0, "step-2")] {
        let o = WriterOptions {
            merge_token: tok.into(),
            ..rank_opts(rank, 2)
        };
        let w = CheckpointWriter::new(&p, o).unwrap();
        w.add_parallel(&items(&halves[rank as usize])).unwrap();
        w.commit().unwrap();
    }
    let e = merge(&p, 2, false, None).unwrap_err().to_string();
    assert!(e.contains("merge token") && e.contains("rank 1"), "{e}");
    let e = merge(&p, 2, false, Some("step-3")).unwrap_err().to_string();
    assert!(e.contains("\"step-3\""), "{e}");
    assert!(Reader::open(&p).is_err(), "nothing was committed");
}

/// Several processes' worth of writers saving to one prefix at once: each save must commit
/// (a concurrent commit's cleanup once found a temp shard in the moment between its create
/// and its lock and unlinked it, failing that save with "not found"), and what is there at the
/// end is one whole save.
#[test]
fn concurrent_savers_of_one_prefix_all_commit() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ck");
    let sets = [sample_values(), new_values()];
    std::thread::scope(|s| {
        for t in 0..4 {
            let (p, vals) = (&p, &sets[t % 2]);
            s.spawn(move || {
                for i in 0..40 {
                    save(p, &items(vals), opts(Codec::Zstd, 2))
                        .unwrap_or_else(|e| panic!("writer {t}, save {i}: {e}"));
                }
            });
        }
    });
    let got = read_all(&p).unwrap();
    assert!(got == sets[0] || got == sets[1], "a mix of two saves");
}
