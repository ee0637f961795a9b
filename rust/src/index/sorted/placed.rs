//! Building a merged index whose shape is known entry by entry before its entries arrive: an
//! unchanged layout's merge (merge/order.rs) knows from the merge before it where every
//! entry goes (its position, and where its key and aux bytes start in their blobs), so the
//! entries are written partial by partial, each partial's bytes read front to back while
//! they are in cache, instead of in key order, which for DCP's keys jumps to another of the
//! thousands of partials at every entry (a cache and TLB miss or more per entry: most of the
//! merge's CPU in the harness, `perf`, docs/SCALE.md).
//!
//! Nothing about the slots is trusted. [`SortedIndexBuilder::place`] checks each entry's
//! key and aux lengths against its slot, its key's length bounds and its shard;
//! [`SortedIndexBuilder::seal_placed`] then walks the index in key order and checks what
//! `push` checks, strictly increasing keys, and that every slot was written exactly once.
//! So the bytes are the ones pushing the same entries in key order builds, or an error.

use super::{Slots, SortedIndexBuilder};
use crate::error::{Error, Result};
use crate::format::{BLOCK_ENTRIES, ENTRY_REC, MAX_KEY_LEN};
use crate::index::layout::EntryRecord;

fn stale(what: String) -> Error {
    Error::InvalidArgument(format!("placing merged entries: {what}"))
}

impl SortedIndexBuilder {
    /// Whether `slots` describe exactly this builder's declared shape: one start per entry
    /// plus the end, starting at 0 and ending at the declared key and aux lengths, every key
    /// non-empty (strictly increasing starts) and no aux range negative.
    pub(crate) fn check_slots(&self, slots: Slots<'_>) -> Result<()> {
        let (k, a) = (slots.key_at, slots.aux_at);
        let ok = k.len() == self.entries + 1
            && a.len() == self.entries + 1
            && k[0] == 0
            && a[0] == 0
            && k[self.entries] as usize == self.keys_len
            && a[self.entries] as usize == self.aux_len
            && k.windows(2).all(|w| w[0] < w[1])
            && a.windows(2).all(|w| w[0] <= w[1]);
        if ok && self.n == 0 {
            Ok(())
        } else {
            Err(stale("the slots do not fit the declared shape".into()))
        }
    }

    /// Write entry number `d` of the index (its position in key order): `rec` as
    /// [`SortedIndexBuilder::push`] takes it, `key` and `aux` at their slots, whose lengths
    /// they must have. `slots` were checked with [`SortedIndexBuilder::check_slots`].
    pub(crate) fn place(
        &mut self,
        d: usize,
        mut rec: EntryRecord,
        key: &[u8],
        aux: &[u8],
        slots: Slots<'_>,
    ) -> Result<()> {
        if d >= self.entries {
            return Err(stale(format!("entry {d} of {}", self.entries)));
        }
        let (k0, k1) = (slots.key_at[d] as usize, slots.key_at[d + 1] as usize);
        let (a0, a1) = (slots.aux_at[d] as usize, slots.aux_at[d + 1] as usize);
        if key.is_empty() || key.len() > MAX_KEY_LEN || key.len() != k1 - k0 || aux.len() != a1 - a0
        {
            return Err(stale(format!(
                "key {:?} or its aux bytes do not fit slot {d}",
                String::from_utf8_lossy(key)
            )));
        }
        if rec.shard as usize >= self.shard_count {
            return Err(Error::InvalidArgument(format!(
                "entry {:?}: shard {} out of range ({} shards)",
                String::from_utf8_lossy(key),
                rec.shard,
                self.shard_count
            )));
        }
        let blo = d - d % BLOCK_ENTRIES;
        // (fit u32: the slots are u32 and increasing)
        rec.key_rel = slots.key_at[d] - slots.key_at[blo];
        rec.aux_rel = slots.aux_at[d] - slots.aux_at[blo];
        rec.key_len = key.len() as u16;
        let at = self.entries_off + d * ENTRY_REC;
        rec.encode(&mut self.out[at..at + ENTRY_REC]);
        self.out[self.keys_off + k0..self.keys_off + k1].copy_from_slice(key);
        self.out[self.aux_off + a0..self.aux_off + a1].copy_from_slice(aux);
        self.placed += 1;
        Ok(())
    }

    /// After every entry was placed: check, in key order, that each slot was written (a
    /// record's key length is 0 until then, and every placed key is non-empty; with as many
    /// placements as entries, no slot was written twice) and that each key is strictly above
    /// the one before it, and close the blocks as `push` does. The builder is then where
    /// pushing the same entries in key order leaves it: [`SortedIndexBuilder::finish`] next.
    pub(crate) fn seal_placed(&mut self, slots: Slots<'_>) -> Result<()> {
        if self.placed != self.entries || self.n != 0 {
            return Err(stale(format!(
                "{} entries placed, {} declared",
                self.placed, self.entries
            )));
        }
        for d in 0..self.entries {
            let (k0, k1) = (slots.key_at[d] as usize, slots.key_at[d + 1] as usize);
            let at = self.entries_off + d * ENTRY_REC + EntryRecord::KEY_LEN;
            let len = u16::from_le_bytes([self.out[at], self.out[at + 1]]) as usize;
            if len != k1 - k0 {
                return Err(stale(format!("entry {d} was not placed")));
            }
            if d > 0 {
                let prev =
                    &self.out[self.keys_off + slots.key_at[d - 1] as usize..self.keys_off + k0];
                let key = &self.out[self.keys_off + k0..self.keys_off + k1];
                if prev >= key {
                    return Err(stale(format!(
                        "key {:?} is not above the key before it",
                        String::from_utf8_lossy(key)
                    )));
                }
            }
            self.n = d + 1;
            self.kpos = k1;
            self.apos = slots.aux_at[d + 1] as usize;
            if self.n.is_multiple_of(BLOCK_ENTRIES) {
                self.close_block();
            }
        }
        if self.entries > 0 {
            let last = slots.key_at[self.entries - 1] as usize;
            self.last_key = Some((last, self.keys_len - last));
        }
        Ok(())
    }
}
