//! The index file (FORMAT.md §3): [`build`] serializes it, [`view`] reads it in place.

mod build;
mod layout;
mod view;

pub use build::{build_index, check_key, ChunkRec, EntryMeta, ShardRec};
pub use view::{Entry, IndexView};
