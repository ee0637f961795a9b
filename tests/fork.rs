//! `fork()` after the crate's thread pools ran (issue 36): a forked child must work as a fresh
//! process does. `fork` copies only the calling thread, so a child that reached a pool built
//! by its parent (rayon's global pool, the object store's tokio runtime, an HTTP client's
//! connections) would wait forever for threads it does not have.
//!
//! The parent first runs every parallel path (saves, loads, verify, stats, strong digests,
//! `memory://` reads and writes) and rayon's global pool too, so that each pool exists at the
//! fork; the child then runs them all again under an alarm. Any call that reached a pool of
//! the parent (the global one included: a stray `par_iter` outside [`threads::install`])
//! hangs, the alarm kills the child, and the test fails naming the hang. One test in this
//! binary, so no other test thread holds a lock at the moment of the fork.

use rayon::prelude::*;
use shardpoint_core::format::{Codec, DType, Kind};
use shardpoint_core::store::remote_reader::RemoteReader;
use shardpoint_core::store::Location;
use shardpoint_core::{save, save_at, DigestAlgo, Item, Reader, WriterOptions};
use std::collections::BTreeMap;
use std::path::Path;

/// Seconds a child may take before it counts as hung (its work takes well under one).
const CHILD_LIMIT_S: u32 = 60;

fn values(seed: u32) -> Vec<(String, Vec<u8>)> {
    (0..6u32)
        .map(|k| {
            let n = 200_000 + 1000 * k as usize;
            let v: Vec<u8> = (0..n as u32)
                .flat_map(|i| ((i.wrapping_mul(seed + k) % 977) as f32 * 0.01).to_le_bytes())
                .collect();
            (format!("t{k}"), v)
        })
        .collect()
}

fn items(vals: &[(String, Vec<u8>)]) -> Vec<Item<'_>> {
    vals.iter()
        .map(|(k, v)| Item {
            key: k.clone(),
            dtype: DType::F32,
            kind: Kind::Tensor,
            dims: vec![(v.len() / 4) as u64],
            data: v,
            xor_base: None,
        })
        .collect()
}

fn opts(codec: Codec) -> WriterOptions {
    WriterOptions {
        codec,
        shards: 2,
        durable: false,
        chunk_bytes: 64 << 10,
        digest: Some(DigestAlgo::Blake3),
        ..Default::default()
    }
}

/// Save, read back (one at a time and in bulk), verify, stats and strong digests, locally and
/// on `memory://NAME`: every pool of the crate is used.
fn exercise(dir: &Path, name: &str, seed: u32) -> Result<(), String> {
    let s = |e: shardpoint_core::Error| format!("{name}: {e}");
    let vals = values(seed);
    for codec in [Codec::HuffByteGroup, Codec::ZstdByteGroup, Codec::None] {
        let p = dir.join(format!("{name}-{}", codec.name()));
        save(&p, &items(&vals), opts(codec)).map_err(s)?;
        let r = Reader::open(&p).map_err(s)?;
        let es: Vec<_> = vals
            .iter()
            .map(|(k, _)| r.entry(k))
            .collect::<Result<_, _>>()
            .map_err(s)?;
        let mut outs: Vec<Vec<u8>> = es.iter().map(|e| vec![0u8; e.raw_len as usize]).collect();
        r.read_many_into(&es, outs.iter_mut().map(|o| &mut o[..]).collect(), true)
            .map_err(s)?;
        for ((_, want), got) in vals.iter().zip(&outs) {
            if want != got {
                return Err(format!("{name}: a value read back differs"));
            }
        }
        // the cold-read engine's path for compressed values (its own reader threads and the
        // buffers it keeps between calls)
        let mut outs: Vec<Vec<u8>> = es.iter().map(|e| vec![0u8; e.raw_len as usize]).collect();
        r.read_many_into_direct(
            &es,
            outs.iter_mut().map(|o| &mut o[..]).collect(),
            true,
            4,
            true,
        )
        .map_err(s)?;
        if vals.iter().zip(&outs).any(|((_, want), got)| want != got) {
            return Err(format!(
                "{name}: a value read back by the direct engine differs"
            ));
        }
        let mut one = vec![0u8; es[0].raw_len as usize];
        r.read_into(&es[0], &mut one, true).map_err(s)?;
        let mut part = vec![0u8; 40_000];
        r.read_range(&es[1], 4_000, 44_000, &mut part).map_err(s)?;
        r.verify().map_err(s)?;
        shardpoint_core::stats::entry_stats(&r, &es[2]).map_err(s)?;
        let strong = shardpoint_core::digest::verify_strong(&r).map_err(s)?;
        if !strong.is_some_and(|rep| rep.mismatches.is_empty()) {
            return Err(format!("{name}: strong digests do not verify"));
        }
    }
    let url = format!("memory://{name}/ck");
    let loc = Location::parse(&url, &BTreeMap::new()).map_err(s)?;
    let mut o = opts(Codec::HuffByteGroup);
    o.digest = None;
    save_at(&loc, &items(&vals), o).map_err(s)?;
    read_remote(&loc, &vals, name)
}

fn read_remote(loc: &Location, vals: &[(String, Vec<u8>)], name: &str) -> Result<(), String> {
    let s = |e: shardpoint_core::Error| format!("{name}: {e}");
    let Location::Remote(rp) = loc else {
        return Err("not remote".into());
    };
    let r = RemoteReader::open(rp).map_err(s)?;
    let es: Vec<_> = vals
        .iter()
        .map(|(k, _)| r.entry(k))
        .collect::<Result<_, _>>()
        .map_err(s)?;
    let got = r.read_many(&es).map_err(s)?;
    if got.iter().zip(vals).any(|(g, (_, w))| g != w) {
        return Err(format!("{name}: a remote value read back differs"));
    }
    r.verify().map_err(s)
}

fn say(msg: &str) {
    // Not `eprintln!`: the test harness captures it through a lock the child may not own.
    let line = format!("{msg}\n");
    // SAFETY: writes a buffer we own to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Fork; run `f` in the child under an alarm; how the child ended.
fn in_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    // SAFETY: the child runs `f` and leaves with `_exit`, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain syscalls; the default SIGALRM action ends the child.
        unsafe { libc::alarm(CHILD_LIMIT_S) };
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(())) => 0,
            Ok(Err(msg)) => {
                say(&msg);
                1
            }
            Err(_) => 2,
        };
        // SAFETY: leave without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid");
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGALRM {
        return Err(format!(
            "the forked child hung (killed after {CHILD_LIMIT_S} s)"
        ));
    }
    Err(format!("the forked child failed (wait status {status:#x})"))
}

#[test]
fn a_forked_child_finishes_every_parallel_call() {
    let d = tempfile::tempdir().unwrap();
    // rayon's global pool, used by someone else in the process: it must not matter to us
    let n: u64 = (0..100_000u64).into_par_iter().sum();
    assert_eq!(n, 4_999_950_000);
    exercise(d.path(), "parent", 3).unwrap();
    let inherited = Location::parse("memory://parent/ck", &BTreeMap::new()).unwrap();
    let parent_vals = values(3);
    in_child(|| {
        exercise(d.path(), "child", 5)?;
        // a store the parent opened keeps working (its objects were copied with the memory)
        read_remote(&inherited, &parent_vals, "inherited")?;
        // and the child's own children too: the pools it built are its own
        in_child(|| exercise(d.path(), "grandchild", 7))
    })
    .unwrap();
    // the parent's pools still work after the fork
    exercise(d.path(), "parent-after", 11).unwrap();
}
