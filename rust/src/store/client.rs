//! One configured object-store client ([`Store`]), shared per store and options within a
//! process, and the few blocking operations the core needs: ranged reads, conditional puts,
//! listing, deletes. Error text names the URL and never a secret.

use super::config::{StoreConfig, OWN_KEYS};
use super::runtime::block_on;
use super::s3_uploads::{KeepClient, S3Uploads};
use crate::error::{Error, Result};
use crate::threads::PerProcess;
use futures::future::BoxFuture;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, GetOptions, GetRange, ObjectMeta, ObjectStore, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The clients of one store.
#[derive(Clone)]
pub(crate) struct Clients {
    pub inner: Arc<dyn ObjectStore>,
    /// The low-level multipart API (S3, GCS, Azure): lets us record upload ids so that uploads
    /// of a killed writer can be aborted later. `None` for memory://.
    pub multipart: Option<Arc<dyn MultipartStore>>,
    /// S3's listings of incomplete uploads and their parts (`gc`); `None` elsewhere.
    pub s3_uploads: Option<Arc<S3Uploads>>,
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
/// The stores of this process (a forked child starts with none, as a fresh process does: its
/// `memory://` namespace is empty, and the lock cannot be one a parent's thread held).
fn registry() -> &'static Mutex<HashMap<String, Arc<Store>>> {
    static R: PerProcess<Mutex<HashMap<String, Arc<Store>>>> = PerProcess::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The environment variables object-store builders read (`AWS_*`, `GOOGLE_*`, `AZURE_*`),
/// sorted: part of a client's identity in the registry.
fn store_environment() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            let k = k.to_ascii_uppercase();
            k.starts_with("AWS_") || k.starts_with("GOOGLE_") || k.starts_with("AZURE_")
        })
        .collect();
    v.sort();
    v
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
    pub(super) fn for_url(
        scheme: &str,
        authority: &str,
        opts: &BTreeMap<String, String>,
    ) -> Result<Arc<Store>> {
        let base = format!("{scheme}://{authority}");
        // The builders also read the environment (endpoint, region, credentials), so a client
        // is shared only while the variables it was built from are unchanged: a test or bench
        // that starts a second server and points AWS_ENDPOINT_URL at it reaches that server.
        // memory:// reads no environment and keeps one namespace per name.
        let env = if scheme == "memory" {
            Vec::new()
        } else {
            store_environment()
        };
        let reg_key = format!("{base}\n{opts:?}\n{env:?}");
        let mut reg = registry().lock().expect("store registry");
        if let Some(s) = reg.get(&reg_key) {
            return Ok(s.clone());
        }
        let config = StoreConfig::from_options(opts)?;
        let secrets = secret_values(opts);
        let retry = RetryConfig {
            max_retries: config.max_retries,
            retry_timeout: config.retry_timeout,
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                // object_store draws each wait uniformly from [init, previous x base]: with its
                // default base of 2 the expected wait barely grows (E = init/2 + previous), so
                // 12 retries of a throttled prefix (503 SlowDown) spanned only a few seconds
                // and a flat save of 8 writers gave up under load. With 3 each wait is 1.5x the
                // last on average ("decorrelated jitter" as AWS describes it): 5 retries wait
                // about 2 s in all, 12 under a minute, while the jitter keeps ranks apart.
                base: 3.0,
            },
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
                        s3_uploads: None,
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
                let (bucket, max_retries) = (authority.to_string(), config.max_retries);
                Box::new(move || {
                    // keep the HTTP client object_store builds, for the listings it lacks
                    let keep = KeepClient::default();
                    let s = b
                        .clone()
                        .with_http_connector(keep.clone())
                        .build()
                        .map_err(&build_err)?;
                    let s = Arc::new(s);
                    let s3_uploads = keep.take().and_then(|http| {
                        S3Uploads::new(&b, &bucket, s.clone(), http, max_retries).map(Arc::new)
                    });
                    Ok(Clients {
                        inner: s.clone(),
                        multipart: Some(s),
                        s3_uploads,
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
                        s3_uploads: None,
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
                        s3_uploads: None,
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

    pub(super) fn obj(&self, key: &str) -> Result<ObjPath> {
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

    /// A future fetching a whole object, for many reads in flight at once (the merge of N
    /// partial indexes: read one by one, 4,096 of them at 20 ms a request take 80 s).
    pub fn get_future(
        self: &Arc<Self>,
        key: &str,
    ) -> BoxFuture<'static, Result<(Vec<u8>, ObjectMeta)>> {
        let me = self.clone();
        let key = key.to_string();
        Box::pin(async move {
            let p = me.obj(&key)?;
            let inner = me.clients()?.inner.clone();
            async {
                let r = inner.get(&p).await?;
                let meta = r.meta.clone();
                let b = r.bytes().await?;
                Ok::<_, object_store::Error>((b.to_vec(), meta))
            }
            .await
            .map_err(|e| me.err(&key, "get", e))
        })
    }

    /// Delete many objects (missing ones are not an error) with the store's bulk request
    /// where it has one (S3's DeleteObjects takes 1,000 keys a request); elsewhere
    /// object_store sends up to 10 deletes at once. Returns the first error, after trying all.
    pub fn delete_many(&self, keys: &[String]) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        if keys.is_empty() {
            return Ok(());
        }
        let paths = keys
            .iter()
            .map(|k| self.obj(k))
            .collect::<Result<Vec<_>>>()?;
        let inner = &self.clients()?.inner;
        let results: Vec<object_store::Result<ObjPath>> = block_on(
            inner
                .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed())
                .into_stream()
                .collect::<Vec<_>>(),
        );
        for r in results {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err(&keys[0], "delete", e)),
            }
        }
        Ok(())
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
            let got = async {
                let r = inner.get_opts(&p, opts).await?;
                let size = r.meta.size;
                let b = r.bytes().await?;
                Ok::<_, object_store::Error>((b, size))
            }
            .await;
            let res = match got {
                Ok(res) => res,
                Err(e) => {
                    // A range past the end of a shortened object is refused by the store
                    // (416): say so as for any object of another length than the index
                    // records, naming its length (one HEAD, only on a failed read).
                    if !matches!(e, object_store::Error::NotFound { .. }) {
                        if let Ok(meta) = inner.head(&p).await {
                            if meta.size < hi {
                                return Err(Error::corrupt(
                                    &me.url_path(&key),
                                    meta.size,
                                    format!(
                                        "object is {} bytes but bytes up to offset {hi} are needed (truncated or replaced)",
                                        meta.size
                                    ),
                                ));
                            }
                        }
                    }
                    return Err(me.err(&key, "ranged read", e));
                }
            };
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
