//! Single-file checkpoints (FORMAT.md §10): one file holding a complete shard and a complete
//! index, located by a 64-byte header and closed by a trailer. What `torch.save(sd, "m.pt")`
//! users expect: one path, one file.
//!
//! The shard and the index inside are byte for byte the files a prefix checkpoint has, so the
//! reader checks them with the same code ([`crate::reader::Reader::open`] recognises the file by
//! its magic). Writing streams the shard through the ordinary shard writer (one encode
//! pipeline, chunk-parallel), then appends the index and the trailer, writes the header, and
//! commits by one rename of a locked temp file: readers see the old file or the new one.

use crate::cancel;
use crate::commit::{
    create_locked_temp, parent_dir, random_token, remove_stale_temps, sync_dir_after_commit,
};
use crate::error::{Error, Result};
use crate::format::*;
use crate::index::build_index;
use crate::merge::meta_blob;
use crate::naming::{shard_name, temp_path};
use crate::shard::{EncodeOptions, Item, ShardSink, ShardWriter};
use crate::single_records::*;
use crate::writer::WriterOptions;
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The shard region of the temp file: appended through a clone of its descriptor (the
/// shard writer writes sequentially; the file offset is shared with the caller's handle).
struct RegionSink {
    file: File,
    path: PathBuf,
}

impl ShardSink for RegionSink {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        // (the shard writer splits large writes and checks for cancellation between pieces)
        self.file
            .write_all(data)
            .map_err(|e| Error::io(&self.path, "write", e))
    }

    fn publish(self: Box<Self>) -> Result<String> {
        Ok(shard_name(0, 1, None))
    }
}

/// Removes the temp file unless the save committed.
struct TempGuard<'a>(&'a Path, bool);

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_file(self.0);
        }
    }
}

/// Bytes of a single file being built in memory ([`encode_single`]).
struct VecSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl ShardSink for VecSink {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        self.0.lock().expect("not poisoned").extend_from_slice(data);
        Ok(())
    }

    fn publish(self: Box<Self>) -> Result<String> {
        Ok(shard_name(0, 1, None))
    }
}

/// The checks of a single-file save that come before any byte is written (`what` names the
/// destination in messages).
fn check_single(what: &str, items: &[Item<'_>], opts: &WriterOptions) -> Result<()> {
    if opts.world_size != 1 {
        return Err(Error::InvalidArgument(format!(
            "{what}: a single-file checkpoint has one writer (world_size {})",
            opts.world_size
        )));
    }
    if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&opts.chunk_bytes)
        || !opts.chunk_bytes.is_multiple_of(16)
    {
        return Err(Error::InvalidArgument(format!(
            "chunk_bytes {} out of range",
            opts.chunk_bytes
        )));
    }
    if opts.digest.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{what}: a single-file checkpoint records no strong digest manifest; save to a prefix (single_file=False) for one"
        )));
    }
    let mut seen = HashSet::with_capacity(items.len());
    for it in items {
        it.validate()?;
        if !seen.insert(it.key.as_str()) {
            return Err(Error::DuplicateKey {
                key: it.key.clone(),
                context: "given twice".into(),
            });
        }
    }
    Ok(())
}

/// Write the shard region of `items` through `sink` (which follows the 4096-byte header
/// region) and return the container's header and everything after the shard region
/// (padding, index, trailer).
fn write_regions(
    sink: Box<dyn ShardSink>,
    items: &[Item<'_>],
    opts: &WriterOptions,
    token: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<([u8; SINGLE_HEADER_LEN], Vec<u8>)> {
    let mut w = ShardWriter::with_sink(sink, 0, 1, token);
    let refs: Vec<&Item<'_>> = items.iter().collect();
    let enc = EncodeOptions {
        codec: opts.codec,
        level: opts.level,
        chunk_bytes: opts.chunk_bytes,
    };
    w.write_items(&refs, enc, progress)?;
    w.seal(false)?;
    let (rec, entries) = w.publish(false)?;
    let meta = meta_blob(&opts.metadata_json, "", &opts.sections_json);
    let index = build_index(
        std::slice::from_ref(&rec),
        entries,
        opts.chunk_bytes,
        meta.as_bytes(),
    )?;
    let shard_end = SINGLE_SHARD_OFF + rec.file_len;
    let index_off = align_up(shard_end, ALIGN)
        .ok_or_else(|| Error::InvalidArgument("single file offset overflows".into()))?;
    let file_len = index_off + index.len() as u64 + SINGLE_TRAILER_LEN as u64;
    let (hdr, hcrc) = SingleHeader {
        file_len,
        shard_off: SINGLE_SHARD_OFF,
        shard_len: rec.file_len,
        index_off,
        index_len: index.len() as u64,
    }
    .encode();
    let mut tail = vec![0u8; (index_off - shard_end) as usize];
    tail.extend_from_slice(&index);
    tail.extend_from_slice(&SingleHeader::trailer(hcrc));
    Ok((hdr, tail))
}

/// The bytes of a single-file checkpoint (FORMAT.md §10) holding `items`, built in memory:
/// byte for byte what [`save_single`] writes (up to the save token), without a file. For
/// payloads sent over a wire (weight-sync deltas).
pub fn encode_single(items: &[Item<'_>], opts: &WriterOptions) -> Result<Vec<u8>> {
    check_single("single-file bytes", items, opts)?;
    let buf = std::sync::Arc::new(std::sync::Mutex::new(vec![0u8; SINGLE_SHARD_OFF as usize]));
    let (hdr, tail) = write_regions(
        Box::new(VecSink(buf.clone())),
        items,
        opts,
        random_token(),
        &|_| {},
    )?;
    let mut out = std::mem::take(&mut *buf.lock().expect("not poisoned"));
    out.extend_from_slice(&tail);
    out[..SINGLE_HEADER_LEN].copy_from_slice(&hdr);
    Ok(out)
}

/// Save `items` as a single-file checkpoint at `path` (FORMAT.md §10), atomically replacing
/// any file there. `opts.shards`, `rank`, `world_size` and `merge_token` do not apply (one
/// shard, one writer). `progress(bytes)` is called after each item is written. On any error,
/// or when cancelled, the temp file is removed and `path` is untouched.
pub fn save_single(
    path: &Path,
    items: &[Item<'_>],
    opts: &WriterOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    check_single(&path.display().to_string(), items, opts)?;
    if path.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{}: is a directory, not a single-file checkpoint path",
            path.display()
        )));
    }
    crate::commit::ensure_parent_dir(path, opts.durable)?;
    let token = random_token();
    let tmp = temp_path(path, token);
    // errors below name `path`, the user's file, not the temp name beside it
    // locked: a concurrent save's cleanup leaves it alone
    let mut file = create_locked_temp(&tmp, path, "create")?;
    let mut guard = TempGuard(&tmp, false);
    file.write_all(&[0u8; SINGLE_SHARD_OFF as usize])
        .map_err(|e| Error::io(path, "write", e))?;
    let sink = RegionSink {
        file: file.try_clone().map_err(|e| Error::io(path, "dup", e))?,
        path: path.to_path_buf(), // for messages: the user's file
    };
    let (hdr, tail) = write_regions(Box::new(sink), items, opts, token, progress)?;
    file.write_all(&tail)
        .map_err(|e| Error::io(path, "write index", e))?;
    {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&hdr, 0)
            .map_err(|e| Error::io(path, "write header", e))?;
    }
    cancel::check()?;
    if opts.durable {
        file.sync_all().map_err(|e| Error::io(path, "fsync", e))?;
    }
    // The last point where an interrupt still leaves `path` as it was.
    cancel::check()?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "rename into place", e))?;
    guard.1 = true;
    drop(file);
    if opts.durable {
        sync_dir_after_commit(&parent_dir(path))?;
    }
    remove_stale_temps(path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::Reader;

    fn items(data: &[u8]) -> Vec<Item<'_>> {
        vec![
            Item {
                key: "a".into(),
                dtype: DType::F32,
                kind: Kind::Tensor,
                dims: vec![(data.len() / 4) as u64],
                data,
                xor_base: None,
            },
            Item {
                key: "b".into(),
                dtype: DType::U8,
                kind: Kind::Tensor,
                dims: vec![3],
                data: &data[..3],
                xor_base: None,
            },
        ]
    }

    /// Rewrite the header of single-file bytes `b` through `f`, with valid crcs (the hostile
    /// case a crc alone does not catch).
    fn forge(b: &mut [u8], f: &dyn Fn(&mut SingleHeader)) {
        let n = b.len();
        let mut h = SingleHeader::decode(&b[..64], &b[n - 16..], n as u64, Path::new("x")).unwrap();
        f(&mut h);
        let (hdr, c) = h.encode();
        b[..64].copy_from_slice(&hdr);
        b[n - 16..].copy_from_slice(&SingleHeader::trailer(c));
    }

    #[test]
    fn round_trip_and_hostile_headers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        let data: Vec<u8> = (0..(1u32 << 20))
            .flat_map(|i| ((i % 97) as f32).to_le_bytes())
            .collect();
        let opts = WriterOptions::default();
        save_single(&p, &items(&data), &opts, &|_| {}).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("m.pt")]);
        let r = Reader::open(&p).unwrap();
        assert!(r.is_single_file());
        r.verify().unwrap();
        let e = r.entry("a").unwrap();
        let mut out = vec![0u8; e.raw_len as usize];
        r.read_into(&e, &mut out, true).unwrap();
        assert_eq!(out, data);
        let good = std::fs::read(&p).unwrap();
        let hostile = |mutate: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            mutate(&mut b);
            let q = dir.path().join("bad.pt");
            std::fs::write(&q, &b).unwrap();
            Reader::open(&q).err().map(|e| e.to_string())
        };
        // Truncated, extended.
        assert!(hostile(&|b| b.truncate(b.len() - 1))
            .unwrap()
            .contains("bad.pt"));
        assert!(hostile(&|b| b.push(0)).is_some());
        // Regions pointing elsewhere under a valid crc: overlap of index and shard, index off
        // the end, overflowing sums, odd offsets.
        for f in [
            &(|h: &mut SingleHeader| h.index_off -= 64) as &dyn Fn(&mut SingleHeader),
            &|h| h.shard_len += 4096,
            &|h| h.index_len = u64::MAX - 8,
            &|h| h.index_off = u64::MAX - 63,
            &|h| h.shard_off = 0,
            &|h| h.index_off += 1,
            &|h| h.shard_len -= 64,
        ] {
            let err = hostile(&|b| forge(b, f)).expect("hostile header accepted");
            assert!(err.contains("bad.pt"), "{err}");
        }
        // A flipped byte in the embedded index or in a payload.
        let idx_at = SingleHeader::decode(
            &good[..64],
            &good[good.len() - 16..],
            good.len() as u64,
            Path::new("x"),
        )
        .unwrap()
        .index_off as usize;
        assert!(hostile(&|b| b[idx_at + 130] ^= 1).is_some());
        let mut b = good.clone();
        b[SINGLE_SHARD_OFF as usize + DATA_START as usize + 5] ^= 1;
        let q = dir.path().join("flip.pt");
        std::fs::write(&q, &b).unwrap();
        assert!(Reader::open(&q).unwrap().verify().is_err());
    }

    #[test]
    fn in_memory_bytes_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(1u32 << 18))
            .flat_map(|i| ((i % 97) as f32).to_le_bytes())
            .collect();
        let b = encode_single(&items(&data), &WriterOptions::default()).unwrap();
        let p = dir.path().join("m.sp");
        std::fs::write(&p, &b).unwrap();
        let r = Reader::open(&p).unwrap();
        r.verify().unwrap();
        let e = r.entry("a").unwrap();
        let mut out = vec![0u8; e.raw_len as usize];
        r.read_into(&e, &mut out, true).unwrap();
        assert_eq!(out, data);
        let twice = [items(&data), items(&data)].concat();
        assert!(encode_single(&twice, &WriterOptions::default()).is_err());
    }

    #[test]
    fn cancelled_save_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        let data = vec![1u8; 1 << 20];
        save_single(&p, &items(&data), &WriterOptions::default(), &|_| {}).unwrap();
        let before = std::fs::read(&p).unwrap();
        let t = cancel::Token::new();
        t.cancel();
        let _s = t.enter();
        let data2 = vec![2u8; 1 << 20];
        assert!(matches!(
            save_single(&p, &items(&data2), &WriterOptions::default(), &|_| {}),
            Err(Error::Cancelled)
        ));
        assert_eq!(std::fs::read(&p).unwrap(), before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn cancelled_reads_and_verify_stop() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.sp");
        let data: Vec<u8> = (0..(1u32 << 20))
            .flat_map(|i| ((i % 97) as f32).to_le_bytes())
            .collect();
        save_single(&p, &items(&data), &WriterOptions::default(), &|_| {}).unwrap();
        let r = Reader::open(&p).unwrap();
        let e = r.entry("a").unwrap();
        assert_ne!(e.codec, Codec::None);
        let t = cancel::Token::new();
        let _s = t.enter();
        let mut out = vec![0u8; e.raw_len as usize];
        r.read_into(&e, &mut out, true).unwrap();
        t.cancel();
        assert!(matches!(
            r.read_into(&e, &mut out, true),
            Err(Error::Cancelled)
        ));
        assert!(matches!(r.verify(), Err(Error::Cancelled)));
    }
}
