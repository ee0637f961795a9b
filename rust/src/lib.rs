//! shardpoint-core: the storage engine of shardpoint.
//!
//! A checkpoint is a path prefix `P` with shard files `P.data-*` holding 64-byte aligned,
//! optionally chunked and zstd-compressed payloads, and an index `P.index` whose atomic rename
//! commits the checkpoint. The byte-level spec is docs/FORMAT.md; module names follow it:
//!
//! - [`format`]: constants, tags, the shard header;
//! - [`checksum`]: crc32c of slices, of concatenations, of large buffers in parallel;
//! - [`naming`]: every file name of a checkpoint (index, partial, shard, temp);
//! - [`codec`]: byte grouping and zstd chunk codecs;
//! - [`index`]: building the index and the lazily verified view used for lookups;
//! - [`shard`]: writing one shard file;
//! - [`writer`]: multi-shard and multi-writer saves (one save path, optional progress);
//! - [`merge`]: the multi-writer merge of partial indexes and the index metadata JSON;
//! - [`load`]: the bulk-load engine (read-ahead, ordered work, fused read + crc);
//! - [`direct`]: cold reads of plain files with `O_DIRECT`, several in flight, in place;
//! - [`st_header`]: the checked fast path for a Hugging Face safetensors header;
//! - [`reader`]: open, lookup, zero-copy and decompressing reads, slices, verify;
//! - [`incremental`]: saves that hard-link unchanged shards of a base checkpoint;
//! - [`staging`]: parallel copy + crc32c into host buffers for asynchronous saves;
//! - [`commit`]: atomic publish, cleanup, removal;
//! - [`store`]: object-store URLs (`s3://`, `gs://`, `az://`, `memory://`): lazy ranged
//!   reads, streaming multipart uploads, the conditional-put commit;
//! - [`digest`]: optional strong digests (SHA-256, BLAKE3) of every file, computed while
//!   writing, recorded as a manifest in the index metadata, and strong verification;
//! - [`single`]: single-file checkpoints (index and shard in one file, FORMAT.md §10);
//! - [`cancel`]: cooperative cancellation of long calls (Ctrl-C);
//! - [`fault`]: test-only kill points (`SHARDPOINT_TEST_KILL_AT`);
//! - [`stats`]: numerical health (min/max/mean/std, NaN/Inf/zero counts, L2) and value
//!   differences of tensors of any dtype, streamed with the decode;
//! - [`threads`]: the thread pool every parallel pass runs on, and per-process state, so a
//!   forked child works as a fresh process does;
//! - [`error`]: the crate's one error type.

pub mod background_cleanup;
pub mod cancel;
pub mod checksum;
pub mod codec;
pub mod commit;
pub mod crc_combine;
pub mod crc_fold;
pub mod delta;
pub mod digest;
pub mod direct;
pub mod error;
pub mod fault;
pub mod format;
pub mod hashed_dirs;
pub mod incremental;
pub mod index;
pub mod load;
pub mod merge;
pub mod merge_memory;
pub mod naming;
pub mod reader;
pub mod runs;
pub mod shard;
pub mod single;
pub mod single_records;
pub mod st_header;
pub mod staging;
pub mod stats;
pub mod store;
pub mod threads;
pub mod writer;

pub use digest::DigestAlgo;
pub use error::{Error, Result};
pub use format::{Codec, DType, Kind};
pub use incremental::{save_incremental, IncrementalReport};
pub use merge::{
    forget_merge_orders, merge, merge_at, merge_at_in, merge_at_with, merge_local, merge_local_in,
    merge_order_stats,
};
pub use merge_memory::merge_in_memory;
pub use reader::Reader;
pub use shard::Item;
pub use single::{encode_single, save_single};
pub use store::Location;
pub use writer::{save, save_at, save_at_with_progress, CheckpointWriter, WriterOptions};
