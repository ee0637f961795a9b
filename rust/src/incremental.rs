//! Incremental saves (FORMAT.md §8.1): a new checkpoint re-uses whole shard files of a base
//! checkpoint whose every value is unchanged, by hard-linking them under its own names.
//!
//! What must stay true:
//! - a shard is linked only when *every* entry in it matches a value being saved: same key,
//!   dtype, kind, shape and crc32c of the raw bytes (never an identity or counter alone);
//! - the result is an ordinary v1 checkpoint: each of its files is a name of `P`, so deleting
//!   the base (its names) never touches the new checkpoint, and a v1 reader reads it as is;
//! - a linked file is checked against the base's shard record (length, save token, header crc)
//!   before the index that references it is written; any doubt falls back to a full save.

use crate::checksum::par_crc;
use crate::commit::{commit_index, parent_dir, random_token, sync_dir, with_suffix, PrefixLock};
use crate::digest::{hash_path, manifest_extra, parse_manifest, DigestAlgo, FileDigest};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{EntryMeta, IndexView, ShardRec};
use crate::merge::meta_blob;
use crate::naming::shard_name_in;
use crate::shard::{Item, ShardWriter};
use crate::writer::{shard_digests, WriterOptions};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Small values are packed together into shards of about this many bytes.
const PACK_BYTES: u64 = 256 << 20;

/// What an incremental save did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncrementalReport {
    /// Shards hard-linked (or copied) from the base checkpoint.
    pub linked_shards: u32,
    /// Raw bytes of the values those shards hold (not written again).
    pub linked_bytes: u64,
    /// Raw bytes of the values written.
    pub written_bytes: u64,
    /// Shard files written.
    pub written_shards: u32,
    /// Why nothing could be re-used from the base, when it could not be read.
    pub base_problem: Option<String>,
}

/// Save `items` at `prefix`, re-using the shards of checkpoint `base` whose values are all
/// unchanged. `crcs` (one per item, crc32c of its bytes, e.g. computed while staging) spares
/// recomputing them. Values of `solo_bytes` or more get a shard of their own so a changed
/// value never forces an unchanged one to be rewritten; smaller ones are packed together.
pub fn save_incremental(
    prefix: &Path,
    items: &[Item<'_>],
    crcs: Option<&[u32]>,
    base: Option<&Path>,
    solo_bytes: u64,
    opts: WriterOptions,
) -> Result<IncrementalReport> {
    if opts.world_size != 1 {
        return Err(Error::InvalidArgument(
            "incremental saves have one writer".into(),
        ));
    }
    let mut seen = HashSet::with_capacity(items.len());
    for it in items {
        it.validate()?;
        if it.xor_base.is_some() {
            // its crc (what reuse is decided by) would be of `data`, not of what is stored
            return Err(Error::InvalidArgument(format!(
                "{:?}: XOR items are not saved incrementally",
                it.key
            )));
        }
        if !seen.insert(it.key.as_str()) {
            return Err(Error::DuplicateKey {
                key: it.key.clone(),
                context: "given twice".into(),
            });
        }
    }
    crate::commit::ensure_parent_dir(prefix, opts.durable)?;
    let crcs: Vec<u32> = match crcs {
        Some(c) if c.len() == items.len() => c.to_vec(),
        Some(c) => {
            return Err(Error::InvalidArgument(format!(
                "{} crcs given for {} items",
                c.len(),
                items.len()
            )))
        }
        None => crate::threads::install(|| items.par_iter().map(|it| par_crc(it.data)).collect()),
    };
    let mut report = IncrementalReport::default();
    let plan = match base {
        Some(b) => match plan_links(b, items, &crcs, opts.chunk_bytes) {
            Ok(p) => p,
            Err(e) => {
                report.base_problem = Some(e.to_string());
                LinkPlan::default()
            }
        },
        None => LinkPlan::default(),
    };
    let mut plan = plan;
    if let (Some(b), Some(algo)) = (base, opts.digest) {
        plan.base_digests = base_digests(b, algo);
    }
    match write_and_commit(prefix, items, &plan, solo_bytes, &opts, base, &mut report) {
        Err(LinkFailed(why)) if !plan.shards.is_empty() => {
            // The base changed under us (e.g. rotated away): save everything afresh.
            let mut full = IncrementalReport {
                base_problem: Some(why),
                ..Default::default()
            };
            write_and_commit(
                prefix,
                items,
                &LinkPlan::default(),
                solo_bytes,
                &opts,
                base,
                &mut full,
            )
            .map_err(|e| e.into_error())?;
            Ok(full)
        }
        Err(e) => Err(e.into_error()),
        Ok(()) => Ok(report),
    }
}

/// Base shards to link and their entries (shard ids still the base's).
#[derive(Default)]
struct LinkPlan {
    base_index_path: Option<std::path::PathBuf>,
    shards: Vec<(ShardRec, Vec<EntryMeta>)>,
    covered: HashSet<usize>,
    /// The base's recorded digests (by its shard names), when its manifest uses the
    /// algorithm of this save: linked shards take them instead of being hashed again.
    base_digests: HashMap<String, FileDigest>,
}

/// The digests a base checkpoint recorded with `algo`, by shard name (empty when it has none
/// or cannot be read: linked shards are then hashed).
fn base_digests(base: &Path, algo: DigestAlgo) -> HashMap<String, FileDigest> {
    let ip = crate::commit::index_path(base);
    let found = fs::read(&ip)
        .ok()
        .and_then(|bytes| IndexView::open(bytes, &ip).ok())
        .and_then(|v| {
            let meta = v.metadata_bytes().ok()?;
            parse_manifest(meta, &ip).ok().flatten()
        });
    match found {
        Some(m) if m.algorithm == algo.name() => {
            m.files.into_iter().map(|f| (f.name.clone(), f)).collect()
        }
        _ => HashMap::new(),
    }
}

/// Read the base index and pick the shards whose entries all match an item.
fn plan_links(base: &Path, items: &[Item<'_>], crcs: &[u32], chunk_bytes: u32) -> Result<LinkPlan> {
    let ip = crate::commit::index_path(base);
    let bytes = fs::read(&ip).map_err(|e| Error::io(&ip, "read base index", e))?;
    let view = IndexView::open(bytes, &ip)?;
    view.verify_all()?;
    let mut plan = LinkPlan {
        base_index_path: Some(ip.clone()),
        ..Default::default()
    };
    if view.chunk_bytes() != chunk_bytes {
        return Ok(plan); // chunk tables would not match this index's chunk size
    }
    let by_key: HashMap<&str, usize> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (it.key.as_str(), i))
        .collect();
    let nshards = view.shards().len();
    let mut ok = vec![true; nshards];
    let mut ents: Vec<Vec<(EntryMeta, usize)>> = vec![Vec::new(); nshards];
    for i in 0..view.len() {
        let e = view.entry(i)?.to_meta();
        let s = e.shard as usize;
        let hit = by_key.get(e.key.as_str()).copied().filter(|&j| {
            let it = &items[j];
            it.dtype == e.dtype && it.kind == e.kind && it.dims == e.dims && crcs[j] == e.crc
        });
        match hit {
            Some(j) => ents[s].push((e, j)),
            None => ok[s] = false,
        }
    }
    for (s, es) in ents.into_iter().enumerate() {
        if ok[s] && !es.is_empty() {
            plan.covered.extend(es.iter().map(|(_, j)| *j));
            plan.shards.push((
                view.shards()[s].clone(),
                es.into_iter().map(|(e, _)| e).collect(),
            ));
        }
    }
    Ok(plan)
}

/// Why a write failed: a link that could not be made (retry as a full save) or anything else.
enum WriteError {
    LinkFailed(String),
    Other(Error),
}
use WriteError::LinkFailed;

impl WriteError {
    fn into_error(self) -> Error {
        match self {
            WriteError::LinkFailed(why) => Error::InvalidArgument(why),
            WriteError::Other(e) => e,
        }
    }
}

impl From<Error> for WriteError {
    fn from(e: Error) -> Self {
        WriteError::Other(e)
    }
}

/// Group the items not covered by links into shards: big ones alone, small ones packed.
fn group_fresh(items: &[Item<'_>], covered: &HashSet<usize>, solo_bytes: u64) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut pack: Vec<usize> = Vec::new();
    let mut pack_bytes = 0u64;
    for (i, it) in items.iter().enumerate() {
        if covered.contains(&i) {
            continue;
        }
        let n = it.data.len() as u64;
        if n >= solo_bytes.max(1) {
            groups.push(vec![i]);
        } else {
            if pack_bytes + n > PACK_BYTES && !pack.is_empty() {
                groups.push(std::mem::take(&mut pack));
                pack_bytes = 0;
            }
            pack.push(i);
            pack_bytes += n;
        }
    }
    if !pack.is_empty() {
        groups.push(pack);
    }
    groups
}

fn write_and_commit(
    prefix: &Path,
    items: &[Item<'_>],
    plan: &LinkPlan,
    solo_bytes: u64,
    opts: &WriterOptions,
    base: Option<&Path>,
    report: &mut IncrementalReport,
) -> std::result::Result<(), WriteError> {
    let groups = group_fresh(items, &plan.covered, solo_bytes);
    let total = groups.len() + plan.shards.len();
    if total > 99_999 {
        return Err(Error::InvalidArgument(format!(
            "{total} shards would exceed the 99999 a checkpoint may have; raise solo_bytes"
        ))
        .into());
    }
    let total = total.max(1) as u32;
    let token = random_token();
    // Fresh shards are written and fsynced outside the commit lock (their temp files are
    // locked by their writers); links, publishing, the index and cleanup happen under it
    // (FORMAT.md §8), so a concurrent save at `P` never removes or half-sees them.
    let sealed = write_groups(prefix, items, &groups, total, token, opts)?;
    let lock = PrefixLock::acquire(prefix)?;
    let allow_plain = lock.held();
    // Links first: if the base vanished, nothing has been published yet.
    let mut linked_recs = Vec::with_capacity(plan.shards.len());
    let mut linked_digests: Vec<Option<String>> = Vec::with_capacity(plan.shards.len());
    let mut made: Vec<std::path::PathBuf> = Vec::new();
    let fresh_digests = shard_digests(&sealed);
    for (k, (rec, _)) in plan.shards.iter().enumerate() {
        let id = (groups.len() + k) as u32;
        let src = with_suffix(base.expect("a plan has a base"), &rec.name);
        let at = (id, total, token, opts.hashed_prefixes);
        match link_checked(prefix, &src, rec, at, allow_plain) {
            Ok((name, path)) => {
                if let Some(algo) = opts.digest {
                    // The base's digest of this very file when it recorded one (the link was
                    // checked against its shard record); else hash the linked file once.
                    let digest = match plan.base_digests.get(&rec.name) {
                        Some(fd) if fd.len == rec.file_len => Ok(fd.digest.clone()),
                        _ => hash_path(algo, &path).map(|(_, d)| d),
                    };
                    match digest {
                        Ok(d) => linked_digests.push(Some(d)),
                        Err(e) => {
                            let _ = fs::remove_file(&path);
                            for p in made {
                                let _ = fs::remove_file(p);
                            }
                            return Err(e.into());
                        }
                    }
                }
                made.push(path);
                linked_recs.push(ShardRec {
                    name,
                    ..rec.clone()
                });
            }
            Err(e) => {
                for p in made {
                    let _ = fs::remove_file(p);
                }
                return Err(LinkFailed(format!(
                    "could not re-use shard {} of the base checkpoint: {e}",
                    src.display()
                )));
            }
        }
    }
    let fresh = publish_groups(prefix, sealed, allow_plain);
    let (mut recs, mut entries) = match fresh {
        Ok(x) => x,
        Err(e) => {
            for p in made {
                let _ = fs::remove_file(p);
            }
            return Err(e.into());
        }
    };
    report.written_shards = recs.len() as u32;
    report.written_bytes = groups
        .iter()
        .flatten()
        .map(|&i| items[i].data.len() as u64)
        .sum();
    for (k, ((_, ents), rec)) in plan.shards.iter().zip(linked_recs).enumerate() {
        let id = (report.written_shards as usize + k) as u32;
        for e in ents {
            report.linked_bytes += raw_len(&e.dims, e.dtype.itemsize()).unwrap_or(0);
            entries.push(EntryMeta {
                shard: id,
                ..e.clone()
            });
        }
        recs.push(rec);
    }
    report.linked_shards = plan.shards.len() as u32;
    if opts.durable && !plan.shards.is_empty() {
        sync_dir(&parent_dir(prefix))?; // the links are durable before the index names them
        for d in crate::hashed_dirs::dirs_of(prefix, recs.iter().map(|r| r.name.as_str())) {
            sync_dir(&d)?; // links into `P/HH/` (FORMAT.md §3.1.1)
        }
    }
    let base_name = plan
        .base_index_path
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().trim_end_matches(".index").to_string())
        .unwrap_or_default();
    let extra = format!(
        ",\"incremental\":{{\"base\":{},\"linked_shards\":{},\"linked_bytes\":{}}}",
        json_str(&base_name),
        report.linked_shards,
        report.linked_bytes
    );
    let manifest = match opts.digest {
        None => String::new(),
        Some(algo) => {
            let digests = fresh_digests.into_iter().chain(linked_digests);
            let files: Vec<FileDigest> = recs
                .iter()
                .zip(digests)
                .map(|(r, d)| FileDigest {
                    name: r.name.clone(),
                    len: r.file_len,
                    digest: d.expect("every shard of a digested save has a digest"),
                })
                .collect();
            manifest_extra(algo, &files)
        }
    };
    let meta = meta_blob(
        &opts.metadata_json,
        &format!("{extra}{manifest}"),
        &opts.sections_json,
    );
    commit_index(
        prefix,
        &recs,
        entries,
        opts.chunk_bytes,
        meta.as_bytes(),
        opts.durable,
        &lock,
    )?;
    Ok(())
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Write and seal (fsync) the fresh groups, a bounded number of threads pulling groups in
/// turn. On error the writers are dropped, removing their temp files.
fn write_groups(
    prefix: &Path,
    items: &[Item<'_>],
    groups: &[Vec<usize>],
    total: u32,
    token: u64,
    opts: &WriterOptions,
) -> Result<Vec<ShardWriter>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
        .min(groups.len().max(1));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<ShardWriter>>> =
        Mutex::new((0..groups.len()).map(|_| None).collect());
    let enc = crate::shard::EncodeOptions {
        codec: opts.codec,
        level: opts.level,
        chunk_bytes: opts.chunk_bytes,
    };
    let hashed = opts.hashed_prefixes; // shards at `P/HH/` (FORMAT.md §3.1.1)
    std::thread::scope(|sc| -> Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| -> Result<()> {
                    loop {
                        let g = next.fetch_add(1, Ordering::Relaxed);
                        if g >= groups.len() {
                            return Ok(());
                        }
                        let mut w = ShardWriter::create_in(prefix, g as u32, total, token, hashed)?;
                        w.set_digest(opts.digest);
                        let its: Vec<&Item<'_>> = groups[g].iter().map(|&i| &items[i]).collect();
                        w.write_items(&its, enc, &|_| {})?;
                        w.seal(opts.durable)?;
                        done.lock().expect("results lock")[g] = Some(w);
                    }
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().expect("writer thread panicked"))
    })?;
    Ok(done
        .into_inner()
        .expect("results lock")
        .into_iter()
        .map(|w| w.expect("every group written"))
        .collect())
}

/// Publish sealed shards (commit lock held). If one fails, those already published are
/// unlinked again and the rest dropped (removing their temp files).
fn publish_groups(
    prefix: &Path,
    sealed: Vec<ShardWriter>,
    allow_plain: bool,
) -> Result<(Vec<ShardRec>, Vec<EntryMeta>)> {
    let mut recs: Vec<ShardRec> = Vec::with_capacity(sealed.len());
    let mut entries = Vec::new();
    for (g, w) in sealed.into_iter().enumerate() {
        match w.publish(allow_plain) {
            Ok((rec, ents)) => {
                recs.push(rec);
                entries.extend(ents.into_iter().map(|e| EntryMeta {
                    shard: g as u32,
                    ..e
                }));
            }
            Err(e) => {
                for r in &recs {
                    let _ = fs::remove_file(with_suffix(prefix, &r.name));
                }
                return Err(e);
            }
        }
    }
    Ok((recs, entries))
}

/// Give base shard `src` a name of `prefix` (hard link; a copy where links are impossible)
/// and check the file is the one the base index describes.
fn link_checked(
    prefix: &Path,
    src: &Path,
    rec: &ShardRec,
    (id, total, token, hashed): (u32, u32, u64, bool),
    allow_plain: bool,
) -> Result<(String, std::path::PathBuf)> {
    let mut last = None;
    let plain = shard_name_in(id, total, None, hashed);
    let tokened = shard_name_in(id, total, Some(token), hashed);
    crate::commit::ensure_parent_dir(&with_suffix(prefix, &plain), true)?; // `P/HH/` (§3.1.1)
                                                                           // Without the commit lock only never-reused token names are used (FORMAT.md §8).
    let names: &[&String] = if allow_plain {
        &[&plain, &tokened]
    } else {
        &[&tokened]
    };
    for &name in names {
        let name = name.clone();
        let dest = with_suffix(prefix, &name);
        match fs::hard_link(src, &dest) {
            Ok(()) => {
                if let Err(e) = check_shard_file(&dest, rec) {
                    let _ = fs::remove_file(&dest);
                    return Err(e);
                }
                return Ok((name, dest));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = Some(Error::io(&dest, "link base shard", e));
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(1) /* EPERM */
                    || e.raw_os_error() == Some(18) /* EXDEV */ =>
            {
                copy_shard(src, &dest, token)?;
                if let Err(e) = check_shard_file(&dest, rec) {
                    let _ = fs::remove_file(&dest);
                    return Err(e);
                }
                return Ok((name, dest));
            }
            Err(e) => return Err(Error::io(&dest, "link base shard", e)),
        }
    }
    Err(last.expect("two names tried"))
}

/// Copy a shard to `dest` through a temp name (never exposing a partial file), fsynced. The
/// temp file stays locked until it is in place (a concurrent cleanup leaves it alone).
fn copy_shard(src: &Path, dest: &Path, token: u64) -> Result<()> {
    let tmp = crate::naming::temp_path(dest, token);
    let mut out = crate::commit::create_locked_temp(&tmp, dest, "create copied shard")?;
    let res = (|| {
        let mut inp = File::open(src).map_err(|e| Error::io(src, "open base shard", e))?;
        std::io::copy(&mut inp, &mut out).map_err(|e| Error::io(src, "copy base shard", e))?;
        out.sync_all()
            .map_err(|e| Error::io(dest, "fsync copied shard", e))?;
        fs::hard_link(&tmp, dest)
            .or_else(|_| fs::rename(&tmp, dest))
            .map_err(|e| Error::io(dest, "publish copied shard", e))
    })();
    drop(out);
    let _ = fs::remove_file(&tmp);
    res
}

/// The shard file at `path` has the length, save token and header crc of `rec`.
fn check_shard_file(path: &Path, rec: &ShardRec) -> Result<()> {
    let mut f = File::open(path).map_err(|e| Error::io(path, "open linked shard", e))?;
    let len = f
        .metadata()
        .map_err(|e| Error::io(path, "stat linked shard", e))?
        .len();
    let mut hdr = [0u8; SHARD_HEADER_LEN];
    f.read_exact(&mut hdr)
        .map_err(|e| Error::io(path, "read linked shard header", e))?;
    let (h, hcrc) = ShardHeader::decode(&hdr, path)?;
    if len != rec.file_len || h.save_token != rec.save_token || hcrc != rec.header_crc {
        return Err(Error::corrupt(
            path,
            0,
            "base shard does not match the base index (replaced or truncated)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
