//! The state of the store: buckets, their objects (a sorted map from key to an immutable
//! [`Obj`]) and the multipart uploads in progress, in memory behind one mutex that is never
//! held across an await or a disk write. Object bytes live in files (`files.rs`); a PUT
//! writes its file first and then swaps the map entry in one locked step, so a conditional
//! PUT (`If-None-Match: *`, `If-Match`) is atomic against every other writer. The map is not
//! persisted: the server is a benchmark's scratch store (ROOT/data is emptied at start).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use s3s::dto::{ETagCondition, Metadata};
use s3s::{s3_error, S3Result};

use crate::files::DataFile;

/// One version of an object: its bytes (possibly shared with a copy) and what came with them.
#[derive(Debug)]
pub struct Obj {
    pub data: Arc<DataFile>,
    pub modified: SystemTime,
    pub content_type: Option<String>,
    pub metadata: Option<Metadata>,
}

/// A multipart upload in progress.
pub struct Upload {
    pub bucket: String,
    pub key: String,
    pub initiated: SystemTime,
    pub content_type: Option<String>,
    pub metadata: Option<Metadata>,
    pub parts: BTreeMap<i32, Arc<DataFile>>,
}

#[derive(Default)]
pub struct Bucket {
    pub created: Option<SystemTime>,
    pub objects: BTreeMap<String, Arc<Obj>>,
}

#[derive(Default)]
pub struct State {
    pub buckets: BTreeMap<String, Bucket>,
    pub uploads: HashMap<String, Upload>,
}

impl State {
    pub fn bucket(&self, name: &str) -> S3Result<&Bucket> {
        self.buckets
            .get(name)
            .ok_or_else(|| s3_error!(NoSuchBucket, "no bucket {name:?}"))
    }

    pub fn bucket_mut(&mut self, name: &str) -> S3Result<&mut Bucket> {
        self.buckets
            .get_mut(name)
            .ok_or_else(|| s3_error!(NoSuchBucket, "no bucket {name:?}"))
    }

    /// The current version of `key` in `bucket`.
    pub fn object(&self, bucket: &str, key: &str) -> S3Result<Arc<Obj>> {
        self.bucket(bucket)?
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| s3_error!(NoSuchKey, "no object {key:?} in bucket {bucket:?}"))
    }

    pub fn upload(&self, id: &str, bucket: &str, key: &str) -> S3Result<&Upload> {
        match self.uploads.get(id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(s3_error!(NoSuchUpload, "no upload {id:?} of {key:?}")),
        }
    }
}

pub struct Store {
    data_dir: PathBuf,
    next_id: AtomicU64,
    /// Nanoseconds since the epoch at start: with a counter, ETags unique across runs.
    epoch: u64,
    state: Mutex<State>,
}

impl Store {
    /// A store keeping its files in `root/data` (emptied: objects of an earlier run are not
    /// in the map and would only take space).
    pub fn new(root: PathBuf) -> std::io::Result<Self> {
        let data_dir = root.join("data");
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        std::fs::create_dir_all(&data_dir)?;
        let epoch = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(Self {
            data_dir,
            next_id: AtomicU64::new(0),
            epoch,
            state: Mutex::new(State::default()),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // a panic while holding the lock leaves no half-made change (every change is one
        // map operation), so a poisoned lock is still consistent
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh path for a new data file.
    pub fn new_path(&self) -> PathBuf {
        self.data_dir.join(self.new_id())
    }

    /// A fresh id (data files, upload ids): a per-process counter, in hex.
    pub fn new_id(&self) -> String {
        format!("{:016x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// A fresh ETag (version token; `files.rs` says why not an MD5): the start time and a
    /// counter, 32 hex digits.
    pub fn new_etag(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:016x}", self.epoch)
    }

    /// Make `obj` the current version of `key` if the preconditions of the write hold against
    /// the current version (checked and swapped under the lock: atomic).
    pub fn commit(
        &self,
        bucket: &str,
        key: &str,
        obj: Obj,
        if_none_match: Option<&ETagCondition>,
        if_match: Option<&ETagCondition>,
    ) -> S3Result<Arc<Obj>> {
        let obj = Arc::new(obj);
        let old = {
            let mut st = self.lock();
            let b = st.bucket_mut(bucket)?;
            check_write(b.objects.get(key), key, if_none_match, if_match)?;
            b.objects.insert(key.to_string(), obj.clone())
        };
        drop(old); // outside the lock: may unlink a file
        Ok(obj)
    }
}

fn etag_matches(cond: &ETagCondition, current: &Obj) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == current.data.etag,
    }
}

/// S3's write preconditions: `If-None-Match` (`*`: the key must not exist) and `If-Match`
/// (the current ETag must be the one given; a missing key is `NoSuchKey`, as S3 answers).
pub fn check_write(
    current: Option<&Arc<Obj>>,
    key: &str,
    if_none_match: Option<&ETagCondition>,
    if_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if let (Some(cond), Some(cur)) = (if_none_match, current) {
        if etag_matches(cond, cur) {
            return Err(s3_error!(
                PreconditionFailed,
                "{key:?} exists (If-None-Match)"
            ));
        }
    }
    if let Some(cond) = if_match {
        match current {
            None => return Err(s3_error!(NoSuchKey, "{key:?} does not exist (If-Match)")),
            Some(cur) if !etag_matches(cond, cur) => {
                return Err(s3_error!(PreconditionFailed, "{key:?} changed (If-Match)"))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// S3's read preconditions: `If-Match` fails with 412, a matching `If-None-Match` is 304.
pub fn check_read(
    current: &Obj,
    key: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if let Some(cond) = if_match {
        if !etag_matches(cond, current) {
            return Err(s3_error!(
                PreconditionFailed,
                "{key:?}: ETag differs (If-Match)"
            ));
        }
    }
    if let Some(cond) = if_none_match {
        if etag_matches(cond, current) {
            return Err(s3_error!(NotModified));
        }
    }
    Ok(())
}
