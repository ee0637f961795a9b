//! Streaming a shard to an object store: bytes are cut into parts of `part_size` that are
//! uploaded while the writer keeps producing, at most `concurrency` parts in flight (bounded
//! memory: about `(concurrency + 1) × part_size` per shard). A shard smaller than one part is a
//! single PUT. Any error, or dropping the sink unpublished, aborts the upload.
//!
//! Kill safety: a multipart shard costs create + parts + complete, nothing more. A writer
//! killed mid-upload leaves an incomplete upload that `shardpoint gc` finds with S3's
//! ListMultipartUploads and aborts (see [`super::remote_commit::abort_dead_uploads`]).
//! Writers of the previous version recorded each upload id in a marker object
//! `<shard>.upload` (one more request per shard); `gc` and `remove` still abort what such a
//! marker names and delete it ([`UPLOAD_MARKER`]), no save writes one.

use super::{block_on, spawn, RemotePrefix, Store};
use crate::error::{Error, Result};
use crate::shard::ShardSink;
use object_store::multipart::PartId;
use object_store::path::Path as ObjPath;
use object_store::{MultipartUpload, PutMode, PutPayload};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Suffix of the marker object in which writers of the previous version recorded an
/// in-progress multipart upload (read and removed by `gc`, never written).
pub const UPLOAD_MARKER: &str = ".upload";

enum Upload {
    /// S3/GCS/Azure: explicit upload id, parts numbered by us.
    Low {
        id: String,
        parts: Vec<Option<PartId>>,
    },
    /// memory://: object_store's upload handle.
    High(Box<dyn MultipartUpload>),
}

/// One part upload in flight: its number and, for the low-level API, its id.
type PartTask = JoinHandle<Result<(usize, Option<PartId>)>>;

/// An object-store shard being uploaded.
pub struct RemoteSink {
    store: Arc<Store>,
    key: String,
    obj: ObjPath,
    name: String,
    buf: Vec<u8>,
    upload: Option<Upload>,
    inflight: Vec<PartTask>,
    next_part: usize,
    published: bool,
}

impl RemoteSink {
    /// Start shard `name` (the suffix after `P`) at `prefix`. Nothing is sent yet.
    pub fn new(prefix: &RemotePrefix, name: String) -> Result<Self> {
        let key = prefix.key_of(&name);
        let obj = prefix.store.obj(&key)?;
        Ok(RemoteSink {
            store: prefix.store.clone(),
            key,
            obj,
            name,
            buf: Vec::new(),
            upload: None,
            inflight: Vec::new(),
            next_part: 0,
            published: false,
        })
    }

    fn begin(&mut self) -> Result<()> {
        let store = &self.store;
        self.upload = Some(match &store.clients()?.multipart {
            Some(mp) => Upload::Low {
                id: block_on(mp.create_multipart(&self.obj))
                    .map_err(|e| store.err(&self.key, "start multipart upload", e))?,
                parts: Vec::new(),
            },
            None => Upload::High(
                block_on(store.clients()?.inner.put_multipart(&self.obj))
                    .map_err(|e| store.err(&self.key, "start multipart upload", e))?,
            ),
        });
        Ok(())
    }

    /// Wait for the oldest part in flight; record its id.
    fn wait_one(&mut self) -> Result<()> {
        let h = self.inflight.remove(0);
        let (idx, pid) = block_on(h).map_err(|e| Error::Io {
            path: self.store.url_path(&self.key),
            op: "upload part",
            source: std::io::Error::other(e.to_string()),
        })??;
        if let (Some(Upload::Low { parts, .. }), Some(pid)) = (self.upload.as_mut(), pid) {
            if parts.len() <= idx {
                parts.resize(idx + 1, None);
            }
            parts[idx] = Some(pid);
        }
        crate::fault::point("upload.part");
        Ok(())
    }

    /// Send `data` as the next part (waiting first if `concurrency` parts are in flight).
    fn send_part(&mut self, data: Vec<u8>) -> Result<()> {
        if self.upload.is_none() {
            self.begin()?;
        }
        while self.inflight.len() >= self.store.config.concurrency {
            self.wait_one()?;
        }
        let idx = self.next_part;
        self.next_part += 1;
        let payload = PutPayload::from(data);
        let h = match self.upload.as_mut().expect("begun") {
            Upload::Low { id, .. } => {
                let mp = self
                    .store
                    .clients()?
                    .multipart
                    .clone()
                    .expect("low-level store");
                let (obj, id, store, key) = (
                    self.obj.clone(),
                    id.clone(),
                    self.store.clone(),
                    self.key.clone(),
                );
                spawn(async move {
                    mp.put_part(&obj, &id, idx, payload)
                        .await
                        .map(|p| (idx, Some(p)))
                        .map_err(|e| store.err(&key, "upload part", e))
                })
            }
            Upload::High(up) => {
                let fut = up.put_part(payload);
                let (store, key) = (self.store.clone(), self.key.clone());
                spawn(async move {
                    fut.await
                        .map(|()| (idx, None))
                        .map_err(|e| store.err(&key, "upload part", e))
                })
            }
        };
        self.inflight.push(h);
        Ok(())
    }

    /// Best effort: stop everything in flight and abort the upload.
    fn abort(&mut self) {
        for h in self.inflight.drain(..) {
            h.abort();
        }
        match self.upload.take() {
            Some(Upload::Low { id, .. }) => {
                if let Ok(Some(mp)) = self.store.clients().map(|c| &c.multipart) {
                    let _ = block_on(mp.abort_multipart(&self.obj, &id));
                }
            }
            Some(Upload::High(mut up)) => {
                let _ = block_on(up.abort());
            }
            None => {}
        }
    }
}

impl ShardSink for RemoteSink {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        let ps = self.store.config.part_size;
        let mut data = data;
        while !data.is_empty() {
            if self.buf.capacity() == 0 {
                self.buf.reserve_exact(ps);
            }
            let take = (ps - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() == ps {
                let part = std::mem::take(&mut self.buf);
                if let Err(e) = self.send_part(part) {
                    self.abort();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn publish(mut self: Box<Self>) -> Result<String> {
        // A completed upload is durable: nothing more to ask of the store.
        let res = (|| -> Result<()> {
            if self.upload.is_none() {
                let data = std::mem::take(&mut self.buf);
                self.store.put(&self.key, data, PutMode::Overwrite)?;
                return Ok(());
            }
            if !self.buf.is_empty() {
                let part = std::mem::take(&mut self.buf);
                self.send_part(part)?;
            }
            while !self.inflight.is_empty() {
                self.wait_one()?;
            }
            match self.upload.as_mut().expect("begun") {
                Upload::Low { id, parts } => {
                    let parts: Vec<PartId> = parts
                        .iter()
                        .cloned()
                        .collect::<Option<_>>()
                        .ok_or_else(|| Error::Io {
                            path: self.store.url_path(&self.key),
                            op: "complete multipart upload",
                            source: std::io::Error::other("a part id is missing"),
                        })?;
                    let mp = self
                        .store
                        .clients()?
                        .multipart
                        .clone()
                        .expect("low-level store");
                    block_on(mp.complete_multipart(&self.obj, id, parts))
                        .map_err(|e| self.store.err(&self.key, "complete multipart upload", e))?;
                }
                Upload::High(up) => {
                    block_on(up.complete())
                        .map_err(|e| self.store.err(&self.key, "complete multipart upload", e))?;
                }
            }
            Ok(())
        })();
        match res {
            Ok(()) => {
                self.upload = None;
                self.published = true;
                Ok(self.name.clone())
            }
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }
}

impl Drop for RemoteSink {
    fn drop(&mut self) {
        if !self.published {
            self.abort();
        }
    }
}
