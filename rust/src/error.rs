//! The one error type of the core crate. Every variant's message names the file, the key or the
//! offset involved, because "checksum mismatch" without a location is useless to someone holding
//! a 200 GB checkpoint.

use std::path::{Path, PathBuf};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the core. Mapped to Python exceptions once, in the binding.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the checkpoint does not exist.
    #[error("{}: not found{}", path.display(), hint_suffix(what))]
    NotFound { path: PathBuf, what: String },

    /// An I/O error other than "not found".
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The bytes on disk violate the format (bad magic, bounds, lengths, ordering, ...).
    #[error("{}: corrupt checkpoint at offset {offset}: {what}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },

    /// A crc32c does not match.
    #[error("{}: checksum mismatch at offset {offset} ({what}): stored {expected:#010x}, computed {actual:#010x}", path.display())]
    Checksum {
        path: PathBuf,
        offset: u64,
        what: String,
        expected: u32,
        actual: u32,
    },

    /// The file was written by a format version this library does not read.
    #[error("{}: format version {found} is not supported (this library reads versions up to {supported}); upgrade shardpoint", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// A key that is not in the checkpoint.
    #[error("key {key:?} is not in checkpoint {}", path.display())]
    MissingKey { path: PathBuf, key: String },

    /// The same key written twice.
    #[error("duplicate key {key:?}{}", hint_suffix(context))]
    DuplicateKey { key: String, context: String },

    /// A dtype tag or name this format does not know.
    #[error("unsupported dtype {0}")]
    UnsupportedDtype(String),

    /// A caller passed something invalid (a bad key, shape, argument combination...).
    #[error("{0}")]
    InvalidArgument(String),

    /// The call was cancelled through its cancellation token (`cancel::Token`, Ctrl-C in
    /// Python); a cancelled save committed nothing. Plain text, not a doc link: the error type
    /// sits below every other module and names none of them.
    #[error("cancelled")]
    Cancelled,
}

fn hint_suffix(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(" ({s})")
    }
}

impl Error {
    /// Wrap an `io::Error` for `path`, turning `NotFound` into [`Error::NotFound`].
    pub fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound {
                path: path.to_path_buf(),
                what: op.to_string(),
            }
        } else {
            Error::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        }
    }

    /// A format violation at `offset` of `path`.
    pub fn corrupt(path: &Path, offset: u64, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            what: what.into(),
        }
    }

    /// True for the variants that mean "the bytes on disk are bad".
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. } | Error::Checksum { .. } | Error::UnsupportedVersion { .. }
        )
    }
}
