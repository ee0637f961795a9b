//! Where a checkpoint lives ([`Location`]): a local path, a `file://` URL, or a prefix inside
//! an object store ([`RemotePrefix`]); and store "directory" URLs for listing and gc.

use super::client::Store;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
