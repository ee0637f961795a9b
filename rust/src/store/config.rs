//! The knobs of one store ([`StoreConfig`]), read from `storage_options`, and their defaults.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// Default bytes per multipart part / per ranged GET piece (see benches/bench_object_store.py).
pub const DEFAULT_PART_SIZE: usize = 16 << 20;
/// Default parts in flight per uploading shard, and ranged GETs in flight per read.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Reads of the same object closer than this are fetched as one ranged GET.
pub const COALESCE_GAP: u64 = 1 << 20;
/// Partial indexes read at once by a merge from an object store. S3 serves 5,500 GETs a
/// second per prefix; 64 in flight at 20 ms a request is about 3,200/s, under that limit, and
/// takes a 4,096-rank merge's reads from 80 s (one by one) to about 1.3 s (docs/SCALE.md).
pub const MERGE_READS_IN_FLIGHT: usize = 64;
/// Smallest part S3 accepts (all parts but the last).
const MIN_PART_SIZE: usize = 5 << 20;
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
pub(super) const OWN_KEYS: &[&str] = &[
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
    pub(super) fn from_options(opts: &BTreeMap<String, String>) -> Result<Self> {
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
