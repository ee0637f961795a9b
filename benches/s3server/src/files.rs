//! The bytes on disk: every object and every multipart part is one immutable file under
//! `ROOT/data`, written once from a request body and removed when the last reference to it
//! goes (a replaced object stays readable to the GETs already streaming it). GETs stream a file
//! in large chunks read on the blocking pool.
//!
//! ETags are version tokens, not MD5s: each write gets a new one (unique within and across
//! runs: the server's start time and a counter), so it is a strong validator (it changes
//! whenever the bytes may have), which is all `If-Match` / `If-None-Match` and the clients
//! here need. An MD5 cost 1.5-2 s of CPU per GB of PUT on this machine (PUTs ran at 0.15-0.2
//! GB/s); it is computed only to check a `Content-MD5` the client sent.

use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use s3s::{s3_error, S3Result};

/// Bytes per read of a GET (and per write of a PUT): large reads keep the server off the
/// critical path of a 1 GB/s client (s3s-fs read 4 KiB at a time and topped out at 0.1 GB/s).
pub const CHUNK: usize = 4 << 20;
/// Reads of one GET in flight ahead of the socket.
const READ_AHEAD: usize = 2;

/// One immutable file of object (or part) bytes; dropping the last reference unlinks it.
#[derive(Debug)]
pub struct DataFile {
    pub path: PathBuf,
    pub size: u64,
    /// MD5 of the bytes, when the request sent a Content-MD5 to check.
    pub digest: Option<[u8; 16]>,
    /// The S3 ETag, unquoted: a version token (32 hex digits; + "-N" after a multipart upload
    /// of N parts, as S3 marks those).
    pub etag: String,
}

impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes a file being written unless it was completed (an aborted or failed request).
struct Unfinished(Option<PathBuf>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn io_err(what: &str, path: &Path, e: io::Error) -> s3s::S3Error {
    s3_error!(InternalError, "{what} {}: {e}", path.display())
}

/// Base64 (standard alphabet, padded) of bytes: the form of a Content-MD5 header.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Write a request body to a new file at `path`: the bytes are gathered into `CHUNK`-sized
/// batches, each written (and hashed, with `md5`) on the blocking pool (the async workers only
/// move buffers). `etag`: the new version's token.
pub async fn write_body(
    body: Option<StreamingBlob>,
    path: PathBuf,
    md5: bool,
    etag: String,
) -> S3Result<DataFile> {
    let guard = Unfinished(Some(path.clone()));
    let file = File::create(&path).map_err(|e| io_err("create", &path, e))?;
    let mut state = (file, md5.then(Md5::new), 0u64);
    let mut batch: Vec<Bytes> = Vec::new();
    let mut batch_len = 0usize;
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| s3_error!(IncompleteBody, "reading the request body: {e}"))?;
            batch_len += chunk.len();
            batch.push(chunk);
            if batch_len >= CHUNK {
                state = flush(state, std::mem::take(&mut batch), &path).await?;
                batch_len = 0;
            }
        }
    }
    let (file, md5, size) = flush(state, batch, &path).await?;
    drop(file);
    let mut guard = guard;
    guard.0 = None;
    Ok(DataFile {
        path,
        size,
        digest: md5.map(|m| m.finalize().into()),
        etag,
    })
}

type WriteState = (File, Option<Md5>, u64);

async fn flush(state: WriteState, batch: Vec<Bytes>, path: &Path) -> S3Result<WriteState> {
    if batch.is_empty() {
        return Ok(state);
    }
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let (mut file, mut md5, mut size) = state;
        for b in &batch {
            file.write_all(b).map_err(|e| io_err("write", &p, e))?;
            if let Some(m) = &mut md5 {
                m.update(b);
            }
            size += b.len() as u64;
        }
        Ok((file, md5, size))
    })
    .await
    .map_err(|e| s3_error!(InternalError, "writer task: {e}"))?
}

/// A new file at `path` holding `parts` one after another (the completion of a multipart
/// upload; `std::io::copy` between files is `copy_file_range` on Linux). `etag`: the new
/// version's token (S3's "-N" suffix added).
pub async fn concat(parts: Vec<Arc<DataFile>>, path: PathBuf, etag: String) -> S3Result<DataFile> {
    tokio::task::spawn_blocking(move || {
        let guard = Unfinished(Some(path.clone()));
        let mut out = File::create(&path).map_err(|e| io_err("create", &path, e))?;
        let mut size = 0;
        for p in &parts {
            let mut f = File::open(&p.path).map_err(|e| io_err("open", &p.path, e))?;
            size += io::copy(&mut f, &mut out).map_err(|e| io_err("copy into", &path, e))?;
        }
        let mut guard = guard;
        guard.0 = None;
        Ok(DataFile {
            path,
            size,
            digest: None,
            etag: format!("{etag}-{}", parts.len()),
        })
    })
    .await
    .map_err(|e| s3_error!(InternalError, "concat task: {e}"))?
}

/// The bytes `range` of an open file as a response body: `CHUNK`-sized `pread`s on the
/// blocking pool, `READ_AHEAD` of them in flight, sent in order.
pub fn read_stream(file: File, range: Range<u64>) -> StreamingBlob {
    let file = Arc::new(file);
    let end = range.end;
    let reads = futures::stream::iter(range.step_by(CHUNK)).map(move |off| {
        let f = file.clone();
        let n = (end - off).min(CHUNK as u64) as usize;
        async move {
            tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; n];
                f.read_exact_at(&mut buf, off)?;
                Ok(Bytes::from(buf))
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
        }
    });
    blob(reads.buffered(READ_AHEAD))
}

fn blob<S>(s: S) -> StreamingBlob
where
    S: Stream<Item = io::Result<Bytes>> + Send + Sync + 'static,
{
    StreamingBlob::wrap(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_values() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
