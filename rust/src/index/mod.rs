//! The index file (FORMAT.md §3): [`build`] serializes it, [`view`] reads it in place from an
//! [`IndexSource`] ([`source`]: in memory, or page by page from the file on demand).

mod build;
mod layout;
mod sorted;
mod source;
mod view;

pub use build::{build_index, check_key, ChunkRec, EntryMeta, ShardRec};
pub(crate) use sorted::{Slots, SortedIndexBuilder};
pub use source::{IndexSource, LazyIndex};
pub use view::lookup::Entry;
pub use view::IndexView;
