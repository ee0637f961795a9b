//! Where a checkpoint lives: a local path prefix (the mmap fast path of [`crate::reader`] and
//! [`crate::writer`]) or an object-store URL (`s3://`, `gs://`, `az://`, `memory://`), reached
//! through the `object_store` crate on a tokio runtime owned by this module.
//!
//! - [`Location::parse`] turns a user string plus `storage_options` into either;
//! - [`Store`] wraps one configured client (retries, timeouts, part size, concurrency) and
//!   offers the few blocking operations the core needs: ranged reads, conditional puts, listing,
//!   deletes and multipart uploads;
//! - [`upload`] streams a shard as a multipart upload, [`remote_reader`] reads lazily with
//!   ranged GETs, [`remote_commit`] is the commit protocol on a store without rename
//!   (FORMAT.md §8.2).
//!
//! Credentials come from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and from
//! `storage_options`; they are never part of an error message (see [`Store::redact`]).

pub use object_store;

pub mod remote_commit;
pub mod remote_reader;
pub mod upload;

use crate::error::{Error, Result};
use crate::threads::PerProcess;
use futures::future::BoxFuture;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, GetRange, ObjectMeta, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default bytes per multipart part / per ranged GET piece (see benches/bench_object_store.py).
pub const DEFAULT_PART_SIZE: usize = 16 << 20;
/// Default parts in flight per uploading shard, and ranged GETs in flight per read.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Reads of the same object closer than this are fetched as one ranged GET.
pub const COALESCE_GAP: u64 = 1 << 20;
/// Smallest part S3 accepts (all parts but the last).
const MIN_PART_SIZE: usize = 5 << 20;

/// The tokio runtime that drives every object-store request. Few threads: the work is I/O;
/// decoding and checksums run on rayon. One per process: a forked child builds its own (its
/// parent's threads are not there, [`crate::threads`]).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardpoint-io")
            .enable_all()
            .build()
            .expect("start the shardpoint I/O runtime")
    })
}

/// Run a future to completion from a plain (non-runtime) thread.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// Spawn a future on the I/O runtime.
pub(crate) fn spawn<F>(f: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(f)
}

/// Knobs of one store, from `storage_options` (our keys; the rest go to object_store).
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Bytes per multipart part and per ranged-GET piece of a large read.
    pub part_size: usize,
    /// Parts in flight per uploading shard; ranged GETs in flight per read.
    pub concurrency: usize,
    /// Retries of a failed request (with exponential backoff) before giving up.
    pub max_retries: usize,
    /// Give up retrying a request after this long.
    pub retry_timeout: Duration,
    /// Bytes of recently read ranges kept in memory (0 = no cache, the default).
    pub cache_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            max_retries: 5,
            retry_timeout: Duration::from_secs(60),
            cache_bytes: 0,
        }
    }
}

/// Option keys understood by shardpoint itself (everything else is object_store's).
const OWN_KEYS: &[&str] = &[
    "part_size",
    "concurrency",
    "max_retries",
    "retry_timeout",
    "cache_bytes",
];

fn parse_secs(v: &str) -> Option<Duration> {
    let v = v.trim();
    let v = v.strip_suffix('s').unwrap_or(v);
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

impl StoreConfig {
    fn from_options(opts: &BTreeMap<String, String>) -> Result<Self> {
        let mut c = StoreConfig::default();
        let bad =
            |k: &str, why: &str| Error::InvalidArgument(format!("storage option {k:?}: {why}"));
        for (k, v) in opts {
            let n = || {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| bad(k, "expected an integer"))
            };
            match k.as_str() {
                "part_size" => {
                    c.part_size = n()?;
                    if !(MIN_PART_SIZE..=(4usize << 30)).contains(&c.part_size) {
                        return Err(bad(k, "must be between 5 MiB and 4 GiB"));
                    }
                }
                "concurrency" => {
                    c.concurrency = n()?;
                    if !(1..=256).contains(&c.concurrency) {
                        return Err(bad(k, "must be in 1..=256"));
                    }
                }
                "max_retries" => c.max_retries = n()?,
                "retry_timeout" => {
                    c.retry_timeout = parse_secs(v).ok_or_else(|| bad(k, "expected seconds"))?
                }
                "cache_bytes" => c.cache_bytes = n()?,
                _ => {}
            }
        }
        Ok(c)
    }
}

/// The clients of one store.
#[derive(Clone)]
pub(crate) struct Clients {
    pub inner: Arc<dyn ObjectStore>,
    /// The low-level multipart API (S3, GCS, Azure): lets us record upload ids so that uploads
    /// of a killed writer can be aborted later. `None` for memory://.
    pub multipart: Option<Arc<dyn MultipartStore>>,
}

/// Builds a store's [`Clients`].
type Connect = Box<dyn Fn() -> Result<Clients> + Send + Sync>;

/// One configured object-store client.
pub struct Store {
    /// `scheme://authority` (no credentials: those never appear in URLs we accept).
    base: String,
    /// The clients of this process. An HTTP client keeps pooled connections whose driver
    /// tasks live on the runtime of the process that opened them, so a forked child that
    /// inherits a `Store` connects anew ([`crate::threads`]); a `memory://` store hands the
    /// child its (copied) objects.
    clients: PerProcess<Clients>,
    connect: Connect,
    pub config: StoreConfig,
    /// Secret-looking values (from options and the environment) scrubbed from error text.
    secrets: Vec<String>,
}

/// A checkpoint prefix inside a store: `P` as an object path string (no leading slash).
#[derive(Clone)]
pub struct RemotePrefix {
    pub store: Arc<Store>,
    /// The object key prefix, e.g. `runs/ckpt-7`.
    pub key: String,
}

/// Where a checkpoint lives.
#[derive(Clone)]
pub enum Location {
    Local(PathBuf),
    Remote(RemotePrefix),
}

/// Whether `s` names an object-store URL (as opposed to a local path or `file://`).
pub fn is_remote_url(s: &str) -> bool {
    [
        "s3://",
        "s3a://",
        "gs://",
        "gcs://",
        "az://",
        "abfs://",
        "abfss://",
        "azure://",
        "memory://",
    ]
    .iter()
    .any(|p| s.starts_with(p))
}

/// The stores of this process (a forked child starts with none, as a fresh process does: its
/// `memory://` namespace is empty, and the lock cannot be one a parent's thread held).
fn registry() -> &'static Mutex<HashMap<String, Arc<Store>>> {
    static R: PerProcess<Mutex<HashMap<String, Arc<Store>>>> = PerProcess::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Values we must never print: option values whose key looks secret, and the same from the
/// environment.
fn secret_values(opts: &BTreeMap<String, String>) -> Vec<String> {
    let secretish = |k: &str| {
        let k = k.to_ascii_lowercase();
        [
            "secret",
            "token",
            "key",
            "password",
            "credential",
            "sas",
            "signature",
        ]
        .iter()
        .any(|w| k.contains(w))
    };
    let mut out: Vec<String> = opts
        .iter()
        .filter(|(k, _)| secretish(k))
        .map(|(_, v)| v.clone())
        .collect();
    for (k, v) in std::env::vars() {
        let ku = k.to_ascii_uppercase();
        if (ku.starts_with("AWS_") || ku.starts_with("AZURE_") || ku.starts_with("GOOGLE_"))
            && secretish(&k)
        {
            out.push(v);
        }
    }
    out.retain(|v| v.len() >= 4);
    out
}

impl Store {
    /// A client for `scheme://authority`, shared by every prefix of the same store and options
    /// (connection pool reuse). `memory://NAME` is one process-wide in-memory store per name.
    fn for_url(
        scheme: &str,
        authority: &str,
        opts: &BTreeMap<String, String>,
    ) -> Result<Arc<Store>> {
        let base = format!("{scheme}://{authority}");
        let reg_key = format!("{base}\n{opts:?}");
        let mut reg = registry().lock().expect("store registry");
        if let Some(s) = reg.get(&reg_key) {
            return Ok(s.clone());
        }
        let config = StoreConfig::from_options(opts)?;
        let secrets = secret_values(opts);
        let retry = RetryConfig {
            max_retries: config.max_retries,
            retry_timeout: config.retry_timeout,
            ..Default::default()
        };
        // Bounded per-request time, so a dead server is an error, not a hang (unless the
        // caller or the environment chose other values).
        let mut theirs: Vec<(String, String)> = opts
            .iter()
            .filter(|(k, _)| !OWN_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in [("timeout", "60s"), ("connect_timeout", "5s")] {
            let env_set = std::env::vars().any(|(e, _)| {
                let e = e.to_ascii_lowercase();
                e.ends_with(k)
                    && (e.starts_with("aws_")
                        || e.starts_with("google_")
                        || e.starts_with("azure_"))
            });
            if !env_set && !theirs.iter().any(|(o, _)| o == k) {
                theirs.insert(0, (k.to_string(), v.to_string()));
            }
        }
        let build_err = {
            let (base, secrets) = (base.clone(), secrets.clone());
            move |e: object_store::Error| {
                let mut msg = e.to_string();
                for s in &secrets {
                    msg = msg.replace(s.as_str(), "<redacted>");
                }
                Error::InvalidArgument(format!("{base}: cannot configure the object store: {msg}"))
            }
        };
        let url = format!("{base}/");
        // Each builder is configured here (bad options fail now) and kept: `connect` builds
        // the clients from it, now and again in a forked child.
        let connect: Connect = match scheme {
            "memory" => {
                let m: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
                Box::new(move || {
                    Ok(Clients {
                        inner: m.clone(),
                        multipart: None,
                    })
                })
            }
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url.clone())
                    .with_retry(retry.clone());
                for (k, v) in &theirs {
                    let key = k.parse().map_err(&build_err)?;
                    b = b.with_config(key, v.as_str());
                }
                Box::new(move || {
                    let s = Arc::new(b.clone().build().map_err(&build_err)?);
                    Ok(Clients {
                        inner: s.clone(),
                        multipart: Some(s),
                    })
                })
            }
            "gs" | "gcs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url.clone())
                    .with_retry(retry.clone());
                for (k, v) in &theirs {
                    let key = k.parse().map_err(&build_err)?;
                    b = b.with_config(key, v.as_str());
                }
                Box::new(move || {
                    let s = Arc::new(b.clone().build().map_err(&build_err)?);
                    Ok(Clients {
                        inner: s.clone(),
                        multipart: Some(s),
                    })
                })
            }
            "az" | "abfs" | "abfss" | "azure" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url.clone())
                    .with_retry(retry.clone());
                for (k, v) in &theirs {
                    let key = k.parse().map_err(&build_err)?;
                    b = b.with_config(key, v.as_str());
                }
                Box::new(move || {
                    let s = Arc::new(b.clone().build().map_err(&build_err)?);
                    Ok(Clients {
                        inner: s.clone(),
                        multipart: Some(s),
                    })
                })
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported URL scheme {other:?}"
                )))
            }
        };
        let s = Arc::new(Store {
            base,
            clients: PerProcess::new(),
            connect,
            config,
            secrets,
        });
        s.clients()?; // a store that cannot be built fails here, not at its first request
        reg.insert(reg_key, s.clone());
        Ok(s)
    }

    /// This process's clients (built on first use in a forked child).
    pub(crate) fn clients(&self) -> Result<&Clients> {
        self.clients.get_or_try_init(|| (self.connect)())
    }

    /// `scheme://authority/key`, for messages.
    pub fn url(&self, key: &str) -> String {
        format!("{}/{key}", self.base)
    }

    /// The URL of `key` as a path, the type the core's errors carry.
    pub fn url_path(&self, key: &str) -> PathBuf {
        PathBuf::from(self.url(key))
    }

    /// Remove secrets from a message.
    pub fn redact(&self, msg: String) -> String {
        let mut m = msg;
        for s in &self.secrets {
            m = m.replace(s.as_str(), "<redacted>");
        }
        m
    }

    /// Map an object_store error for `key` to the core's error (URL named, secrets removed).
    pub fn err(&self, key: &str, op: &'static str, e: object_store::Error) -> Error {
        let path = self.url_path(key);
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                path,
                what: op.to_string(),
            },
            other => {
                // object_store's Display includes the full chain (status, body, retries).
                let msg = self.redact(other.to_string());
                Error::Io {
                    path,
                    op,
                    source: std::io::Error::other(msg),
                }
            }
        }
    }

    fn obj(&self, key: &str) -> Result<ObjPath> {
        ObjPath::parse(key).map_err(|e| {
            Error::InvalidArgument(format!("{}: invalid object path: {e}", self.url(key)))
        })
    }

    /// Whole object.
    pub fn get(&self, key: &str) -> Result<(Vec<u8>, ObjectMeta)> {
        let p = self.obj(key)?;
        let inner = &self.clients()?.inner;
        block_on(async {
            let r = inner.get(&p).await?;
            let meta = r.meta.clone();
            let b = r.bytes().await?;
            Ok((b.to_vec(), meta))
        })
        .map_err(|e| self.err(key, "get", e))
    }

    /// Metadata of an object, `None` if it does not exist.
    pub fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        let p = self.obj(key)?;
        match block_on(self.clients()?.inner.head(&p)) {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(key, "head", e)),
        }
    }

    /// A future fetching bytes `[lo, hi)` of `key`, also returning the object's total size (so
    /// a replaced or truncated object is noticed without another request).
    pub fn range_future(
        self: &Arc<Self>,
        key: &str,
        lo: u64,
        hi: u64,
    ) -> BoxFuture<'static, Result<(bytes::Bytes, u64)>> {
        let me = self.clone();
        let key = key.to_string();
        Box::pin(async move {
            let p = me.obj(&key)?;
            let inner = me.clients()?.inner.clone();
            let opts = GetOptions {
                range: Some(GetRange::Bounded(lo..hi)),
                ..Default::default()
            };
            let res = async {
                let r = inner.get_opts(&p, opts).await?;
                let size = r.meta.size;
                let b = r.bytes().await?;
                Ok::<_, object_store::Error>((b, size))
            }
            .await
            .map_err(|e| me.err(&key, "ranged read", e))?;
            if res.0.len() as u64 != hi - lo {
                return Err(Error::corrupt(
                    &me.url_path(&key),
                    lo,
                    format!("asked for {} bytes, got {}", hi - lo, res.0.len()),
                ));
            }
            Ok(res)
        })
    }

    /// Put a whole object. `mode` Create fails with [`Error::Io`] (op "already exists") if it
    /// exists; Update fails if the object changed since `version` was read.
    pub fn put(&self, key: &str, data: Vec<u8>, mode: PutMode) -> Result<Option<String>> {
        let p = self.obj(key)?;
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match block_on(
            self.clients()?
                .inner
                .put_opts(&p, PutPayload::from(data), opts),
        ) {
            Ok(r) => Ok(r.e_tag),
            Err(e @ object_store::Error::AlreadyExists { .. })
            | Err(e @ object_store::Error::Precondition { .. }) => Err(Error::Io {
                path: self.url_path(key),
                op: "conditional put (another writer changed it first)",
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    self.redact(e.to_string()),
                ),
            }),
            Err(e) => Err(self.err(key, "put", e)),
        }
    }

    /// Delete an object (a missing one is not an error).
    pub fn delete(&self, key: &str) -> Result<()> {
        let p = self.obj(key)?;
        match block_on(self.clients()?.inner.delete(&p)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(key, "delete", e)),
        }
    }

    /// Every object whose key starts with `dir/` (recursively), or the whole store if `dir` is
    /// empty.
    pub fn list(&self, dir: &str) -> Result<Vec<ObjectMeta>> {
        use futures::TryStreamExt;
        let p = if dir.is_empty() {
            None
        } else {
            Some(self.obj(dir)?)
        };
        block_on(
            self.clients()?
                .inner
                .list(p.as_ref())
                .try_collect::<Vec<_>>(),
        )
        .map_err(|e| self.err(dir, "list", e))
    }

    /// Objects directly inside `dir` (one level) and the sub-"directories".
    pub fn list_dir(&self, dir: &str) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
        let p = if dir.is_empty() {
            None
        } else {
            Some(self.obj(dir)?)
        };
        let r = block_on(self.clients()?.inner.list_with_delimiter(p.as_ref()))
            .map_err(|e| self.err(dir, "list", e))?;
        Ok((
            r.objects,
            r.common_prefixes.iter().map(|p| p.to_string()).collect(),
        ))
    }
}

impl RemotePrefix {
    /// The object key of `P` + `suffix`.
    pub fn key_of(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.key)
    }

    /// The URL of `P` + `suffix`.
    pub fn url_of(&self, suffix: &str) -> PathBuf {
        self.store.url_path(&self.key_of(suffix))
    }

    /// The "directory" holding `P`'s objects and `P`'s last segment.
    pub fn dir_and_base(&self) -> (&str, &str) {
        match self.key.rfind('/') {
            Some(i) => (&self.key[..i], &self.key[i + 1..]),
            None => ("", &self.key),
        }
    }
}

impl Location {
    /// Parse a local path, a `file://` URL (local: the mmap path) or an object-store URL.
    /// `storage_options` configure remote stores (credentials, endpoint, and our knobs:
    /// `part_size`, `concurrency`, `max_retries`, `retry_timeout`, `cache_bytes`).
    pub fn parse(s: &str, storage_options: &BTreeMap<String, String>) -> Result<Location> {
        if let Some(rest) = s.strip_prefix("file://") {
            let path = url::Url::parse(s)
                .ok()
                .and_then(|u| u.to_file_path().ok())
                .unwrap_or_else(|| PathBuf::from(rest));
            return Ok(Location::Local(path));
        }
        if !is_remote_url(s) {
            return Ok(Location::Local(PathBuf::from(s)));
        }
        let (scheme, rest) = s.split_once("://").expect("checked");
        let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains('@') {
            return Err(Error::InvalidArgument(
                "credentials in URLs are not accepted; use storage_options or the environment"
                    .into(),
            ));
        }
        if authority.is_empty() && scheme != "memory" {
            return Err(Error::InvalidArgument(format!(
                "{scheme}://: missing bucket or container name"
            )));
        }
        if key.is_empty() || key.ends_with('/') {
            return Err(Error::InvalidArgument(format!(
                "{s:?} must name a checkpoint prefix inside the bucket, not a bucket or directory"
            )));
        }
        let store = Store::for_url(scheme, authority, storage_options)?;
        // Validate the key now so later errors are about I/O, not syntax.
        store.obj(key)?;
        Ok(Location::Remote(RemotePrefix {
            store,
            key: key.to_string(),
        }))
    }

    /// The local path, if local.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::Remote(_) => None,
        }
    }
}

/// Parse `s` as a store "directory" URL (`s3://bucket/dir/` or a prefix without a trailing
/// slash): the store and the key prefix, for listing and gc.
pub fn parse_dir(
    s: &str,
    storage_options: &BTreeMap<String, String>,
) -> Result<(Arc<Store>, String)> {
    let (scheme, rest) = s
        .split_once("://")
        .filter(|_| is_remote_url(s))
        .ok_or_else(|| Error::InvalidArgument(format!("{s:?} is not an object-store URL")))?;
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.contains('@') {
        return Err(Error::InvalidArgument(
            "credentials in URLs are not accepted; use storage_options or the environment".into(),
        ));
    }
    let store = Store::for_url(scheme, authority, storage_options)?;
    Ok((store, key.trim_end_matches('/').to_string()))
}
