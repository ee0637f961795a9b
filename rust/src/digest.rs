//! Strong digests of checkpoint files (FORMAT.md §7.1): the optional manifest a save records in
//! the index metadata, the hashers that compute it while the shard bytes are written, and the
//! strong verification that re-hashes every shard against it.
//!
//! What must stay true:
//! - a shard's digest covers every byte of the file exactly as written (header, padding,
//!   payloads), computed in the writer from the very bytes handed to `write(2)` or to the
//!   upload: no second pass over the data;
//! - the manifest lists each shard of the index once, by its name suffix, with the file's
//!   length; strong verification refuses a manifest that does not name exactly the index's
//!   shards (an attacker could otherwise drop a shard from it);
//! - the index cannot hold its own digest: verification returns the index's digest (the *root
//!   digest*, which covers every shard through the manifest) for the caller to compare with a
//!   value kept elsewhere (a log, a registry, a signature).

use crate::error::{Error, Result};
use crate::index::ShardRec;
use rayon::prelude::*;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Bytes hashed per read when re-hashing a file.
pub const HASH_PIECE: usize = 4 << 20;

/// A strong digest algorithm a manifest may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestAlgo {
    /// SHA-256 (FIPS 180-4): what `sha256sum` and most tools check.
    Sha256,
    /// BLAKE3 (256-bit output): about twice as fast here, `b3sum` checks it.
    Blake3,
}

impl DigestAlgo {
    /// The name stored in the manifest (`"sha256"`, `"blake3"`).
    pub fn name(self) -> &'static str {
        match self {
            DigestAlgo::Sha256 => "sha256",
            DigestAlgo::Blake3 => "blake3",
        }
    }

    /// Parse a manifest/option name.
    pub fn from_name(name: &str) -> Result<DigestAlgo> {
        match name {
            "sha256" => Ok(DigestAlgo::Sha256),
            "blake3" => Ok(DigestAlgo::Blake3),
            other => Err(Error::InvalidArgument(format!(
                "unknown digest algorithm {other:?} (use \"sha256\" or \"blake3\")"
            ))),
        }
    }

    /// A fresh hasher.
    pub fn hasher(self) -> FileHasher {
        match self {
            DigestAlgo::Sha256 => FileHasher::Sha256(<sha2::Sha256 as sha2::Digest>::new()),
            DigestAlgo::Blake3 => FileHasher::Blake3(Box::new(blake3::Hasher::new())),
        }
    }
}

/// An incremental hasher of one file.
pub enum FileHasher {
    Sha256(sha2::Sha256),
    Blake3(Box<blake3::Hasher>),
}

impl FileHasher {
    /// Feed the next bytes of the file.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            FileHasher::Sha256(h) => sha2::Digest::update(h, data),
            FileHasher::Blake3(h) => {
                h.update(data);
            }
        }
    }

    /// The digest as lowercase hex.
    pub fn finish_hex(self) -> String {
        match self {
            FileHasher::Sha256(h) => hex(&sha2::Digest::finalize(h)),
            FileHasher::Blake3(h) => hex(h.finalize().as_bytes()),
        }
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Digest of `bytes` in memory.
pub fn digest_bytes(algo: DigestAlgo, bytes: &[u8]) -> String {
    let mut h = algo.hasher();
    h.update(bytes);
    h.finish_hex()
}

/// One file of a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct FileDigest {
    /// The name suffix after `P` (as in the shard table).
    pub name: String,
    /// The file's exact length.
    pub len: u64,
    /// Lowercase hex digest of the whole file.
    pub digest: String,
}

/// The manifest recorded in the index metadata under `"digest"`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Manifest {
    pub algorithm: String,
    pub files: Vec<FileDigest>,
}

/// The metadata fields this module reads.
#[derive(Deserialize)]
struct MetaWithDigest {
    #[serde(default)]
    digest: Option<Manifest>,
}

/// The `,"digest":{...}` fragment of the index metadata (an `extra` of `meta_blob`).
pub fn manifest_extra(algo: DigestAlgo, files: &[FileDigest]) -> String {
    let list: Vec<String> = files
        .iter()
        .map(|f| {
            // Escaped although writers only put checked shard names and hex here: a merge
            // copies names out of partial indexes, which are input.
            format!(
                "{{\"name\":{},\"len\":{},\"digest\":{}}}",
                json_str(&f.name),
                f.len,
                json_str(&f.digest)
            )
        })
        .collect();
    format!(
        ",\"digest\":{{\"algorithm\":\"{}\",\"files\":[{}]}}",
        algo.name(),
        list.join(",")
    )
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// The manifest of an index's metadata JSON, if it has one.
pub fn parse_manifest(meta: &[u8], path: &Path) -> Result<Option<Manifest>> {
    let m: MetaWithDigest = serde_json::from_slice(meta).map_err(|e| {
        Error::corrupt(
            path,
            0,
            format!("metadata is not valid JSON or its digest manifest is malformed: {e}"),
        )
    })?;
    Ok(m.digest)
}

/// Hash the file at `path` (used for shards linked from a base checkpoint that recorded no
/// digest of this algorithm): returns its length and digest.
pub fn hash_path(algo: DigestAlgo, path: &Path) -> Result<(u64, String)> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, "open for digest", e))?;
    let mut h = algo.hasher();
    let mut buf = vec![0u8; HASH_PIECE];
    let mut len = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(path, "read for digest", e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, h.finish_hex()))
}

/// A shard whose bytes differ from the manifest.
#[derive(Clone, Debug)]
pub struct DigestMismatch {
    pub path: PathBuf,
    pub what: String,
}

/// What strong verification found.
#[derive(Clone, Debug)]
pub struct StrongReport {
    /// The manifest's algorithm.
    pub algorithm: DigestAlgo,
    /// Digest of the index file's bytes (the root digest: it covers the manifest, so every shard).
    pub index_digest: String,
    /// Files hashed and their total size.
    pub files: usize,
    pub bytes: u64,
    /// Shards whose length or digest differ from the manifest (empty = intact).
    pub mismatches: Vec<DigestMismatch>,
}

/// What strong verification reads: an open checkpoint, local or in an object store.
pub trait ShardBytes: Sync {
    /// The index file's bytes as read at open, its path, metadata (crc-checked), shard table.
    fn index_bytes(&self) -> Result<&[u8]>;
    fn index_path(&self) -> &Path;
    fn metadata(&self) -> Result<&[u8]>;
    fn shard_recs(&self) -> &[ShardRec];
    /// Path (or URL) of shard `i`, for messages.
    fn shard_path(&self, i: usize) -> PathBuf;
    /// Bytes `[off, off + buf.len())` of shard `i`.
    fn read_shard(&self, i: usize, off: u64, buf: &mut [u8]) -> Result<()>;
    /// Whether shard `i` now holds bytes past its recorded length.
    fn grew(&self, i: usize) -> bool;
    /// Bytes read per request.
    fn piece(&self) -> usize {
        HASH_PIECE
    }
}

/// Re-hash every shard of an open checkpoint against the manifest in its index. `Ok(None)`
/// when the checkpoint was saved without a digest. Shards are hashed in parallel.
pub fn verify_strong<R: ShardBytes>(r: &R) -> Result<Option<StrongReport>> {
    let ipath = r.index_path().to_path_buf();
    let Some(man) = parse_manifest(r.metadata()?, &ipath)? else {
        return Ok(None);
    };
    let algo = DigestAlgo::from_name(&man.algorithm).map_err(|_| {
        Error::corrupt(
            &ipath,
            0,
            format!(
                "digest manifest names unknown algorithm {:?}",
                man.algorithm
            ),
        )
    })?;
    let recs = r.shard_recs();
    if man.files.len() != recs.len() {
        return Err(Error::corrupt(
            &ipath,
            0,
            format!(
                "digest manifest lists {} files but the index has {} shards",
                man.files.len(),
                recs.len()
            ),
        ));
    }
    let mut mismatches = Vec::new();
    let mut plan = Vec::with_capacity(recs.len());
    for (i, rec) in recs.iter().enumerate() {
        let Some(fd) = man.files.iter().find(|f| f.name == rec.name) else {
            return Err(Error::corrupt(
                &ipath,
                0,
                format!("digest manifest does not list shard {:?}", rec.name),
            ));
        };
        if fd.len != rec.file_len {
            mismatches.push(DigestMismatch {
                path: r.shard_path(i),
                what: format!(
                    "manifest records {} bytes, the shard table {}",
                    fd.len, rec.file_len
                ),
            });
            continue;
        }
        plan.push((i, fd));
    }
    let found: Vec<Result<Option<DigestMismatch>>> = crate::threads::install(|| {
        plan.par_iter()
            .map(|&(i, fd)| {
                let len = recs[i].file_len;
                let piece = r.piece() as u64;
                let mut h = algo.hasher();
                let mut buf = vec![0u8; piece.min(len) as usize];
                let mut off = 0u64;
                while off < len {
                    let n = (len - off).min(piece) as usize;
                    r.read_shard(i, off, &mut buf[..n])?;
                    h.update(&buf[..n]);
                    off += n as u64;
                }
                // Bytes appended after the recorded end are a change too.
                if r.grew(i) {
                    return Ok(Some(DigestMismatch {
                        path: r.shard_path(i),
                        what: format!("file is longer than the {len} bytes recorded"),
                    }));
                }
                let got = h.finish_hex();
                Ok((got != fd.digest).then(|| DigestMismatch {
                    path: r.shard_path(i),
                    what: format!(
                        "{} of the file is {got}, the manifest records {}",
                        algo.name(),
                        fd.digest
                    ),
                }))
            })
            .collect()
    });
    for f in found {
        if let Some(m) = f? {
            mismatches.push(m);
        }
    }
    Ok(Some(StrongReport {
        algorithm: algo,
        index_digest: digest_bytes(algo, r.index_bytes()?),
        files: recs.len(),
        bytes: recs.iter().map(|s| s.file_len).sum(),
        mismatches,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::Reader;

    #[test]
    fn known_answers() {
        // FIPS 180-2 "abc" and the BLAKE3 reference vector of the empty input.
        assert_eq!(
            digest_bytes(DigestAlgo::Sha256, b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            digest_bytes(DigestAlgo::Blake3, b""),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn every_byte_of_a_shard_is_covered_even_padding_no_crc_covers() {
        use crate::format::{DType, Kind};
        use crate::shard::Item;
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("ck");
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let items = [Item {
            key: "w".into(),
            dtype: DType::U32,
            kind: Kind::Tensor,
            dims: vec![100_000],
            data: &data,
            xor_base: None,
        }];
        for algo in [DigestAlgo::Sha256, DigestAlgo::Blake3] {
            let opts = crate::WriterOptions {
                digest: Some(algo),
                durable: false,
                ..Default::default()
            };
            crate::save(&prefix, &items, opts).unwrap();
            let r = Reader::open(&prefix).unwrap();
            let rep = verify_strong(&r).unwrap().expect("a manifest was recorded");
            assert!(rep.mismatches.is_empty(), "{:?}", rep.mismatches);
            let index = std::fs::read(crate::naming::index_path(&prefix)).unwrap();
            assert_eq!(rep.index_digest, digest_bytes(algo, &index));
            let shard = r.shards()[0].path.clone();
            let (len, whole) = hash_path(algo, &shard).unwrap();
            assert_eq!(len, r.index().shards()[0].file_len);
            let man = parse_manifest(r.index().metadata_bytes().unwrap(), &shard)
                .unwrap()
                .unwrap();
            assert_eq!(man.files[0].digest, whole); // hashed while writing = hashed after
            drop(r);
            // A byte of the header's zero padding: no crc covers it, the digest does.
            let mut bytes = std::fs::read(&shard).unwrap();
            bytes[100] ^= 1;
            std::fs::write(&shard, &bytes).unwrap();
            let r = Reader::open(&prefix).unwrap();
            r.verify().ok(); // what crc verification says is not the point here
            let rep = verify_strong(&r).unwrap().unwrap();
            assert_eq!(rep.mismatches.len(), 1);
            assert_eq!(rep.mismatches[0].path, shard);
        }
    }

    #[test]
    fn manifest_round_trips_through_the_metadata_json() {
        let files = vec![FileDigest {
            name: ".data-00000-of-00001".into(),
            len: 4096,
            digest: "ab".repeat(32),
        }];
        let blob = crate::merge::meta_blob("{}", &manifest_extra(DigestAlgo::Blake3, &files), "");
        let m = parse_manifest(blob.as_bytes(), Path::new("x.index"))
            .unwrap()
            .unwrap();
        assert_eq!(m.algorithm, "blake3");
        assert_eq!(m.files, files);
        assert!(parse_manifest(b"{\"user\":{}}", Path::new("x"))
            .unwrap()
            .is_none());
    }
}
