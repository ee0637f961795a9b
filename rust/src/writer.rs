//! Checkpoint writers: a streaming writer over several shards (threads write different shards
//! in parallel), a one-call parallel save, partial indexes of multi-process writers (`merge`).

use crate::commit::{commit_index, random_token, unlink_shards, write_atomic, PrefixLock};
use crate::digest::{manifest_extra, DigestAlgo, FileDigest};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::{build_index, EntryMeta, ShardRec};
use crate::merge::{meta_blob, partial_marker};
use crate::naming::{partial_suffix_in, shard_name_in, with_suffix};
use crate::shard::{EncodeOptions, Item, ShardWriter};
use crate::store::upload::RemoteSink;
use crate::store::{remote_commit, Location, RemotePrefix};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Options of a save.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    pub codec: Codec,
    pub level: i32,
    pub chunk_bytes: u32,
    /// Shards written by this writer.
    pub shards: u32,
    /// fsync shards, index and directory.
    pub durable: bool,
    /// This writer's rank and the number of writers (1 = commit directly).
    pub rank: u32,
    pub world_size: u32,
    /// User metadata JSON (an object), stored in the index.
    pub metadata_json: String,
    /// Library sections (FORMAT.md §7): a JSON object stored beside, never inside, the user
    /// metadata, so layers such as `shardpoint.torch` keep their bookkeeping out of the user's
    /// dict. Empty = none.
    pub sections_json: String,
    /// Multi-writer: an id shared by the writers of one save (e.g. the step), recorded in each
    /// partial index; `merge` refuses partials whose tokens differ (a stale partial of an
    /// earlier, crashed save). Empty = none given.
    pub merge_token: String,
    /// Record a strong digest of every shard file, computed while writing, in a manifest in
    /// the index metadata (FORMAT.md §7.1). `None` = no manifest.
    pub digest: Option<DigestAlgo>,
    /// Name shards in the hashed form `P/HH/data-…` (FORMAT.md §3.1.1): spreads a save's
    /// object keys over 256 prefixes an object store can partition apart. Off by default: it
    /// changes the names users see and needs index version 2.
    pub hashed_prefixes: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            codec: Codec::HuffByteGroup,
            level: crate::codec::DEFAULT_LEVEL,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            shards: 1,
            durable: true,
            rank: 0,
            world_size: 1,
            metadata_json: "{}".into(),
            sections_json: String::new(),
            merge_token: String::new(),
            digest: None,
            hashed_prefixes: false,
        }
    }
}

impl WriterOptions {
    fn validate(&self) -> Result<()> {
        if self.shards == 0 || self.shards > 65536 {
            return Err(Error::InvalidArgument(format!(
                "shards must be in 1..=65536, got {}",
                self.shards
            )));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not in 0..{}",
                self.rank, self.world_size
            )));
        }
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes)
            || !self.chunk_bytes.is_multiple_of(16)
        {
            return Err(Error::InvalidArgument(format!(
                "chunk_bytes {} out of range",
                self.chunk_bytes
            )));
        }
        if self.merge_token.len() > 128
            || !self
                .merge_token
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(&c))
        {
            return Err(Error::InvalidArgument(format!(
                "merge token {:?}: use at most 128 characters of [A-Za-z0-9_.:-]",
                self.merge_token
            )));
        }
        let global = (self.world_size as u64) * (self.shards as u64);
        if global > 99_999 {
            return Err(Error::InvalidArgument(
                "more than 99999 shards in one checkpoint".into(),
            ));
        }
        Ok(())
    }

    fn encode(&self) -> EncodeOptions {
        EncodeOptions {
            codec: self.codec,
            level: self.level,
            chunk_bytes: self.chunk_bytes,
        }
    }
}

/// A streaming checkpoint writer. `add` may be called from several threads at once: each call
/// takes a free shard, so threads write different shards in parallel.
pub struct CheckpointWriter {
    prefix: PathBuf,
    opts: WriterOptions,
    token: u64,
    shards: Vec<Mutex<Option<ShardWriter>>>,
    keys: Mutex<HashSet<String>>,
    /// For an object-store prefix: where, and the condition of the index PUT (what `P.index`
    /// was when this save started; FORMAT.md §8.2).
    remote: Option<(RemotePrefix, remote_commit::Observed)>,
    /// Cancelled by [`CheckpointWriter::cancel`]: `add`s running on other threads stop at
    /// their next chunk (joined with each call's own token).
    stop: crate::cancel::Token,
}

impl CheckpointWriter {
    /// Start a save at `prefix`. Nothing at `prefix` changes until `commit`.
    pub fn new(prefix: &Path, opts: WriterOptions) -> Result<Self> {
        opts.validate()?;
        crate::commit::ensure_parent_dir(prefix, opts.durable)?;
        let token = random_token();
        let global = opts.world_size * opts.shards;
        let mut shards = Vec::with_capacity(opts.shards as usize);
        for j in 0..opts.shards {
            let s = opts.rank * opts.shards + j;
            let mut w = ShardWriter::create_in(prefix, s, global, token, opts.hashed_prefixes)?;
            w.set_digest(opts.digest);
            shards.push(Mutex::new(Some(w)));
        }
        Ok(CheckpointWriter {
            prefix: prefix.to_path_buf(),
            opts,
            token,
            shards,
            keys: Mutex::new(HashSet::new()),
            remote: None,
            stop: crate::cancel::Token::new(),
        })
    }

    /// Start a save at a local prefix or an object-store URL. Remote shards stream up as
    /// multipart uploads named with the save token; nothing at the prefix changes until
    /// `commit`.
    pub fn new_at(loc: &Location, opts: WriterOptions) -> Result<Self> {
        let rp = match loc {
            Location::Local(p) => return Self::new(p, opts),
            Location::Remote(rp) => rp,
        };
        opts.validate()?;
        let mode = if opts.world_size == 1 {
            remote_commit::observe(rp)?
        } else {
            // partial indexes: plain puts, nothing observed (the merge observes `P.index`)
            remote_commit::Observed {
                mode: object_store::PutMode::Overwrite,
                replaced: Vec::new(),
            }
        };
        let token = random_token();
        let global = opts.world_size * opts.shards;
        let mut shards = Vec::with_capacity(opts.shards as usize);
        for j in 0..opts.shards {
            let s = opts.rank * opts.shards + j;
            let name = shard_name_in(s, global, Some(token), opts.hashed_prefixes);
            let sink = RemoteSink::new(rp, name)?;
            let mut w = ShardWriter::with_sink(Box::new(sink), s, global, token);
            w.set_digest(opts.digest);
            shards.push(Mutex::new(Some(w)));
        }
        Ok(CheckpointWriter {
            prefix: rp.url_of(""),
            opts,
            token,
            shards,
            keys: Mutex::new(HashSet::new()),
            remote: Some((rp.clone(), mode)),
            stop: crate::cancel::Token::new(),
        })
    }

    /// The prefix being written.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Stop the `add`s running on other threads at their next chunk (they fail with
    /// [`Error::Cancelled`]); call [`CheckpointWriter::abort`] next. Takes no lock.
    pub fn cancel(&self) {
        self.stop.cancel();
    }

    /// Write one value now (streaming: it is on disk, or in the page cache, when this returns).
    pub fn add(&self, item: &Item<'_>) -> Result<()> {
        let _scope = crate::cancel::current().joined(&self.stop).enter();
        item.validate()?;
        if !self
            .keys
            .lock()
            .expect("keys lock")
            .insert(item.key.clone())
        {
            return Err(Error::DuplicateKey {
                key: item.key.clone(),
                context: "added twice to one writer".into(),
            });
        }
        let res = self.with_free_shard(|w| w.write_item(item, self.opts.encode()));
        if res.is_err() {
            self.keys.lock().expect("keys lock").remove(&item.key);
        }
        res
    }

    /// Run `f` on an idle shard writer; if all are busy, wait for shard 0 (no load balancing
    /// here: `add_parallel` is the path that plans shards by size).
    fn with_free_shard<T>(&self, f: impl FnOnce(&mut ShardWriter) -> Result<T>) -> Result<T> {
        for m in &self.shards {
            if let Ok(mut g) = m.try_lock() {
                let w = g
                    .as_mut()
                    .ok_or_else(|| Error::InvalidArgument("writer already committed".into()))?;
                return f(w);
            }
        }
        let m = &self.shards[0];
        let mut g = m.lock().expect("shard lock");
        let w = g
            .as_mut()
            .ok_or_else(|| Error::InvalidArgument("writer already committed".into()))?;
        f(w)
    }

    /// Write many values with one thread per shard (the items are balanced across shards by
    /// size first). Used by `save_file`.
    pub fn add_parallel(&self, items: &[Item<'_>]) -> Result<()> {
        self.add_parallel_with_progress(items, &|_| {})
    }

    /// [`add_parallel`](Self::add_parallel), calling `progress(bytes)` from the writing thread
    /// after each item is written (`bytes` = the item's raw length). The shard layout does not
    /// depend on `progress`: a progress bar never changes what is written.
    pub fn add_parallel_with_progress(
        &self,
        items: &[Item<'_>],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let _scope = crate::cancel::current().joined(&self.stop).enter();
        {
            let mut keys = self.keys.lock().expect("keys lock");
            for it in items {
                it.validate()?;
                if !keys.insert(it.key.clone()) {
                    return Err(Error::DuplicateKey {
                        key: it.key.clone(),
                        context: "given twice".into(),
                    });
                }
            }
        }
        let n = self.shards.len();
        // Longest-processing-time-first: biggest items to the least loaded shard.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(items[i].data.len()));
        let mut loads = vec![0u64; n];
        let mut plan: Vec<Vec<usize>> = vec![Vec::new(); n];
        for i in order {
            let s = (0..n).min_by_key(|&s| loads[s]).expect("n >= 1");
            loads[s] += items[i].data.len() as u64;
            plan[s].push(i);
        }
        for p in plan.iter_mut() {
            p.sort_unstable(); // keep the caller's order within a shard: sequential file layout
        }
        let enc = self.opts.encode();
        let cancel = crate::cancel::current();
        std::thread::scope(|sc| {
            let handles: Vec<_> = plan
                .iter()
                .zip(&self.shards)
                .filter(|(p, _)| !p.is_empty())
                .map(|(p, m)| {
                    let cancel = cancel.clone();
                    sc.spawn(move || -> Result<()> {
                        let _scope = cancel.enter();
                        let mut g = m.lock().expect("shard lock");
                        let w = g.as_mut().ok_or_else(|| {
                            Error::InvalidArgument("writer already committed".into())
                        })?;
                        let its: Vec<&Item<'_>> = p.iter().map(|&i| &items[i]).collect();
                        w.write_items(&its, enc, progress)
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().expect("writer thread panicked"))
        })
    }

    /// Seal the shards (flush and fsync; one thread per shard so the fsyncs overlap). On any
    /// error every temp shard is removed (the writers are dropped).
    fn seal_shards(&self) -> Result<Vec<ShardWriter>> {
        let writers: Vec<ShardWriter> = self
            .shards
            .iter()
            .map(|m| m.lock().expect("shard lock").take())
            .collect::<Option<_>>()
            .ok_or_else(|| Error::InvalidArgument("writer already committed".into()))?;
        let durable = self.opts.durable;
        let sealed: Vec<Result<ShardWriter>> = std::thread::scope(|sc| {
            let hs: Vec<_> = writers
                .into_iter()
                .map(|mut w| sc.spawn(move || w.seal(durable).map(|()| w)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("seal thread panicked"))
                .collect()
        });
        sealed.into_iter().collect()
    }

    /// Finish and make the result visible: with one writer, commit `P.index`; with several,
    /// publish this writer's partial index (the checkpoint appears after [`merge`]). Shards are
    /// fsynced, published, committed and cleaned up under the prefix's commit lock (FORMAT.md
    /// §8). On error nothing of this save is left behind.
    pub fn commit(&self) -> Result<()> {
        self.commit_partial().map(|_| ())
    }

    /// [`Writer::commit`], returning the partial index it published (`None` for one writer),
    /// which a coordinator can merge from memory ([`crate::merge_memory::merge_in_memory`]).
    pub fn commit_partial(&self) -> Result<Option<Vec<u8>>> {
        if let Err(e) = crate::cancel::check() {
            self.abort();
            return Err(e);
        }
        let sealed = self.seal_shards()?;
        // The last point where an interrupt leaves the prefix as it was (dropping the sealed
        // writers removes their temp files).
        crate::cancel::check()?;
        if let Some((rp, mode)) = &self.remote {
            return self.commit_remote(rp, mode.clone(), sealed);
        }
        let lock = PrefixLock::acquire(&self.prefix)?;
        let digests = shard_digests(&sealed);
        let (recs, entries) = publish_all(&self.prefix, sealed, lock.held())?;
        crate::fault::point("writer.published");
        let manifest = self.manifest(&recs, &digests);
        if self.opts.world_size == 1 {
            let meta = meta_blob(
                &self.opts.metadata_json,
                &manifest,
                &self.opts.sections_json,
            );
            commit_index(
                &self.prefix,
                &recs,
                entries,
                self.opts.chunk_bytes,
                meta.as_bytes(),
                self.opts.durable,
                &lock,
            )
            .map(|()| None)
        } else {
            let meta = self.partial_meta(&manifest);
            let res = build_index(&recs, entries, self.opts.chunk_bytes, meta.as_bytes()).and_then(
                |bytes| {
                    let o = &self.opts;
                    let suffix = partial_suffix_in(o.rank, o.world_size, o.hashed_prefixes);
                    let dest = with_suffix(&self.prefix, &suffix);
                    if o.hashed_prefixes {
                        // `P/HH/` of a hashed partial (§3.1.1); under the commit lock, so no
                        // cleanup removes it between here and the rename
                        crate::commit::ensure_parent_dir(&dest, o.durable)?;
                    }
                    write_atomic(&dest, &bytes, o.durable)?;
                    Ok(Some(bytes))
                },
            );
            if res.is_err() {
                unlink_shards(&self.prefix, &recs);
            }
            res
        }
    }

    /// The metadata of this writer's partial index (a multi-writer save); `manifest`: the
    /// digest manifest fragment of its shards (or "").
    fn partial_meta(&self, manifest: &str) -> String {
        let extra = partial_marker(
            self.opts.rank,
            self.opts.world_size,
            self.token,
            &self.opts.merge_token,
        );
        meta_blob(
            &self.opts.metadata_json,
            &format!("{extra}{manifest}"),
            &self.opts.sections_json,
        )
    }

    /// The `"digest"` manifest fragment for the published shards `recs` (their digests in
    /// the same order), or "" when this save records none.
    fn manifest(&self, recs: &[ShardRec], digests: &[Option<String>]) -> String {
        match self.opts.digest {
            None => String::new(),
            Some(algo) => {
                let files: Vec<FileDigest> = recs
                    .iter()
                    .zip(digests)
                    .map(|(r, d)| FileDigest {
                        name: r.name.clone(),
                        len: r.file_len,
                        digest: d.clone().expect("a digest was set on every shard"),
                    })
                    .collect();
                manifest_extra(algo, &files)
            }
        }
    }

    /// Complete the uploads, then commit the index conditionally (one writer) or put this
    /// writer's partial index (several). No commit lock: the conditional PUT is the arbiter.
    fn commit_remote(
        &self,
        rp: &RemotePrefix,
        mode: remote_commit::Observed,
        sealed: Vec<ShardWriter>,
    ) -> Result<Option<Vec<u8>>> {
        let digests = shard_digests(&sealed);
        let done: Vec<Result<(ShardRec, Vec<EntryMeta>)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = sealed
                .into_iter()
                .map(|w| sc.spawn(move || w.publish(false)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("upload thread panicked"))
                .collect()
        });
        let mut recs = Vec::new();
        let mut entries = Vec::new();
        let mut first_err = None;
        let mut kept = Vec::new();
        for (d, digest) in done.into_iter().zip(digests) {
            match d {
                Ok((rec, mut ents)) => {
                    kept.push(digest);
                    let id = recs.len() as u32;
                    for e in ents.iter_mut() {
                        e.shard = id;
                    }
                    recs.push(rec);
                    entries.append(&mut ents);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let manifest = self.manifest(&recs, &kept);
        if first_err.is_none() {
            crate::fault::point("writer.published");
        }
        let res = match first_err {
            Some(e) => Err(e),
            None if self.opts.world_size == 1 => {
                let meta = meta_blob(
                    &self.opts.metadata_json,
                    &manifest,
                    &self.opts.sections_json,
                );
                return remote_commit::commit_index(
                    rp,
                    mode,
                    &recs,
                    entries,
                    self.opts.chunk_bytes,
                    meta.as_bytes(),
                    &[],
                )
                .map(|()| None);
            }
            None => build_index(
                &recs,
                entries,
                self.opts.chunk_bytes,
                self.partial_meta(&manifest).as_bytes(),
            )
            .and_then(|bytes| {
                let o = &self.opts;
                let suffix = partial_suffix_in(o.rank, o.world_size, o.hashed_prefixes);
                // (a copy of ~5 KB per rank: the store takes its own)
                let key = rp.key_of(&suffix);
                let put = rp
                    .store
                    .put(&key, bytes.clone(), object_store::PutMode::Overwrite);
                put.map(|_| Some(bytes))
            }),
        };
        if res.is_err() {
            // Uploaded shards no index will reference.
            let ours: Vec<String> = recs.iter().map(|r| rp.key_of(&r.name)).collect();
            let _ = rp.store.delete_many(&ours);
        }
        res
    }

    /// Drop everything written (temp shards are removed).
    pub fn abort(&self) {
        for m in &self.shards {
            if let Ok(mut g) = m.lock() {
                g.take();
            }
        }
    }
}

/// The digests of sealed shards, in order (`None` where no digest was set).
pub(crate) fn shard_digests(sealed: &[ShardWriter]) -> Vec<Option<String>> {
    sealed
        .iter()
        .map(|w| w.digest().map(str::to_string))
        .collect()
}

/// Publish sealed shards under their final names (commit lock held) and number them. If one
/// fails, the ones already published are unlinked again (no index references them) and the
/// rest are dropped, removing their temp files.
fn publish_all(
    prefix: &Path,
    sealed: Vec<ShardWriter>,
    allow_plain: bool,
) -> Result<(Vec<ShardRec>, Vec<EntryMeta>)> {
    let mut recs = Vec::with_capacity(sealed.len());
    let mut entries = Vec::new();
    for w in sealed {
        match w.publish(allow_plain) {
            Ok((rec, mut ents)) => {
                let id = recs.len() as u32;
                for e in ents.iter_mut() {
                    e.shard = id;
                }
                recs.push(rec);
                entries.append(&mut ents);
            }
            Err(e) => {
                unlink_shards(prefix, &recs);
                return Err(e);
            }
        }
    }
    Ok((recs, entries))
}

/// Save `items` at a local `prefix` in one call: `opts.shards` threads write in parallel, then
/// commit. A local [`Location`] through [`save_at`]: one save algorithm for every caller.
pub fn save(prefix: &Path, items: &[Item<'_>], opts: WriterOptions) -> Result<()> {
    save_at(&Location::Local(prefix.to_path_buf()), items, opts)
}

/// Save `items` at a local prefix or an object-store URL in one call.
pub fn save_at(loc: &Location, items: &[Item<'_>], opts: WriterOptions) -> Result<()> {
    save_at_with_progress(loc, items, opts, &|_| {})
}

/// [`save_at`], reporting each written item's raw byte count to `progress` (from the writing
/// threads); the same algorithm and shard layout as without it, local or remote.
pub fn save_at_with_progress(
    loc: &Location,
    items: &[Item<'_>],
    opts: WriterOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let w = CheckpointWriter::new_at(loc, opts)?;
    w.add_parallel_with_progress(items, progress)?;
    crate::cancel::check()?;
    w.commit()
}
