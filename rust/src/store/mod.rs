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
//!
//! Where to look: `location` (what a user string names), `config` (the knobs and their
//! defaults), `client` ([`Store`]: the configured client and its blocking operations),
//! `runtime` (the tokio runtime requests run on).

pub use object_store;

mod client;
mod config;
mod location;
pub mod remote_commit;
pub mod remote_reader;
mod runtime;
pub mod s3_uploads;
pub mod upload;

pub use client::Store;
pub use config::{
    StoreConfig, COALESCE_GAP, DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, MERGE_READS_IN_FLIGHT,
};
pub use location::{is_remote_url, parse_dir, Location, RemotePrefix};
pub(crate) use runtime::{block_on, spawn};
