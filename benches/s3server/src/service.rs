//! The S3 operations (the `s3s::S3` trait) over the [`Store`]: buckets, PutObject (with
//! `If-None-Match` / `If-Match`), GetObject (ranges), HeadObject, CopyObject, ListObjectsV2,
//! DeleteObject(s) and multipart uploads: what object_store's S3 client and boto3 send.

use std::sync::Arc;
use std::time::SystemTime;

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};

use crate::control::Control;
use crate::files::{self, base64};
use crate::listing::{self, url_encode, After};
use crate::store::{check_read, Obj, Store, Upload};

/// Most keys (or uploads) per listing page, as S3.
const MAX_KEYS: usize = 1000;

#[derive(Clone)]
pub struct Server {
    pub store: Arc<Store>,
    pub control: Arc<Control>,
}

fn etag(e: &str) -> ETag {
    ETag::Strong(e.to_string())
}

fn wants_url(enc: &Option<EncodingType>) -> bool {
    enc.as_ref()
        .is_some_and(|e| e.as_str() == EncodingType::URL)
}

impl Server {
    /// Write a body to a new file and make it the current version of `key` (preconditions
    /// checked when it is swapped in).
    #[allow(clippy::too_many_arguments)]
    async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: Option<StreamingBlob>,
        content_md5: Option<&str>,
        content_type: Option<String>,
        metadata: Option<Metadata>,
        if_none_match: Option<&ETagCondition>,
        if_match: Option<&ETagCondition>,
    ) -> S3Result<Arc<Obj>> {
        self.store.lock().bucket(bucket)?; // before taking the body: no bucket, no write
        let path = self.store.new_path();
        let data =
            files::write_body(body, path, content_md5.is_some(), self.store.new_etag()).await?;
        if let (Some(want), Some(got)) = (content_md5, &data.digest) {
            if want != base64(got) {
                return Err(s3_error!(
                    BadDigest,
                    "Content-MD5 of {key:?} does not match"
                ));
            }
        }
        let obj = Obj {
            data: Arc::new(data),
            modified: SystemTime::now(),
            content_type,
            metadata,
        };
        self.store.commit(bucket, key, obj, if_none_match, if_match)
    }
}

#[async_trait::async_trait]
impl S3 for Server {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.control.enter("BUCKET").await;
        let name = req.input.bucket;
        let mut st = self.store.lock();
        // S3 in us-east-1 answers 200 to its owner re-creating a bucket
        let b = st.buckets.entry(name.clone()).or_default();
        b.created.get_or_insert_with(SystemTime::now);
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{name}")),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.control.enter("BUCKET").await;
        self.store.lock().bucket(&req.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.control.enter("BUCKET").await;
        let name = req.input.bucket;
        let mut st = self.store.lock();
        if !st.bucket(&name)?.objects.is_empty() {
            return Err(s3_error!(BucketNotEmpty, "bucket {name:?} is not empty"));
        }
        st.buckets.remove(&name);
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.control.enter("BUCKET").await;
        let st = self.store.lock();
        let buckets = st
            .buckets
            .iter()
            .map(|(name, b)| Bucket {
                name: Some(name.clone()),
                creation_date: b.created.map(Timestamp::from),
                bucket_region: None,
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.control.enter("PUT").await;
        let i = req.input;
        let obj = self
            .put(
                &i.bucket,
                &i.key,
                i.body,
                i.content_md5.as_deref(),
                i.content_type,
                i.metadata,
                i.if_none_match.as_ref(),
                i.if_match.as_ref(),
            )
            .await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&obj.data.etag)),
            size: Some(obj.data.size as i64),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.control.enter("GET").await;
        let i = req.input;
        let obj = self.store.lock().object(&i.bucket, &i.key)?;
        check_read(&obj, &i.key, i.if_match.as_ref(), i.if_none_match.as_ref())?;
        let size = obj.data.size;
        let (range, content_range) = match i.range {
            None => (0..size, None),
            Some(r) => {
                let rg = r.check(size)?;
                let cr = format!("bytes {}-{}/{size}", rg.start, rg.end - 1);
                (rg, Some(cr))
            }
        };
        // opened while `obj` holds the file: a later replace or delete cannot unlink it first
        let file = std::fs::File::open(&obj.data.path)
            .map_err(|e| s3_error!(InternalError, "open {:?}: {e}", i.key))?;
        let len = range.end - range.start;
        Ok(S3Response::new(GetObjectOutput {
            body: Some(files::read_stream(file, range)),
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&obj.data.etag)),
            last_modified: Some(Timestamp::from(obj.modified)),
            content_type: obj.content_type.clone(),
            metadata: obj.metadata.clone(),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.control.enter("HEAD").await;
        let i = req.input;
        let obj = self.store.lock().object(&i.bucket, &i.key)?;
        check_read(&obj, &i.key, i.if_match.as_ref(), i.if_none_match.as_ref())?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(obj.data.size as i64),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&obj.data.etag)),
            last_modified: Some(Timestamp::from(obj.modified)),
            content_type: obj.content_type.clone(),
            metadata: obj.metadata.clone(),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.control.enter("COPY").await;
        let i = req.input;
        let CopySource::Bucket { bucket, key, .. } = &i.copy_source else {
            return Err(s3_error!(NotImplemented, "copy from an access point"));
        };
        let src = self.store.lock().object(bucket, key)?;
        if let Some(cond) = &i.copy_source_if_match {
            check_read(&src, key, Some(cond), None)?;
        }
        // objects are immutable files: the copy shares the source's
        let replace = i
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let (content_type, metadata) = if replace {
            (i.content_type, i.metadata)
        } else {
            (src.content_type.clone(), src.metadata.clone())
        };
        let obj = Obj {
            data: src.data.clone(),
            modified: SystemTime::now(),
            content_type,
            metadata,
        };
        let obj = self.store.commit(&i.bucket, &i.key, obj, None, None)?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&obj.data.etag)),
                last_modified: Some(Timestamp::from(obj.modified)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.control.enter("LIST").await;
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = i
            .max_keys
            .map_or(MAX_KEYS, |m| m.clamp(0, MAX_KEYS as i32) as usize);
        let after = After::parse(i.continuation_token.as_deref(), i.start_after.as_deref())
            .ok_or_else(|| s3_error!(InvalidArgument, "not a continuation token of ours"))?;
        let page = {
            let st = self.store.lock();
            let b = st.bucket(&i.bucket)?;
            listing::list(&b.objects, &prefix, i.delimiter.as_deref(), after, max)
        };
        let url = wants_url(&i.encoding_type);
        let enc = |s: &str| if url { url_encode(s) } else { s.to_string() };
        let contents: Vec<Object> = page
            .objects
            .iter()
            .map(|(k, o)| Object {
                key: Some(enc(k)),
                size: Some(o.data.size as i64),
                e_tag: Some(etag(&o.data.etag)),
                last_modified: Some(Timestamp::from(o.modified)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                ..Default::default()
            })
            .collect();
        let prefixes: Vec<CommonPrefix> = page
            .prefixes
            .iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc(p)),
            })
            .collect();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix)),
            delimiter: i.delimiter.as_deref().map(enc),
            max_keys: Some(max as i32),
            key_count: Some((contents.len() + prefixes.len()) as i32),
            is_truncated: Some(page.next.is_some()),
            next_continuation_token: page.next,
            continuation_token: i.continuation_token,
            start_after: i.start_after.as_deref().map(enc),
            encoding_type: i.encoding_type,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.control.enter("DELETE").await;
        let i = req.input;
        let old = self
            .store
            .lock()
            .bucket_mut(&i.bucket)?
            .objects
            .remove(&i.key);
        drop(old); // outside the lock: may unlink a file
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.control.enter("BULK_DELETE").await;
        let i = req.input;
        let keys: Vec<String> = i.delete.objects.into_iter().map(|o| o.key).collect();
        let old: Vec<Option<Arc<Obj>>> = {
            let mut st = self.store.lock();
            let b = st.bucket_mut(&i.bucket)?;
            keys.iter().map(|k| b.objects.remove(k)).collect()
        };
        drop(old);
        let quiet = i.delete.quiet.unwrap_or(false);
        let deleted = if quiet {
            Vec::new()
        } else {
            keys.into_iter()
                .map(|k| DeletedObject {
                    key: Some(k),
                    ..Default::default()
                })
                .collect()
        };
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.control.enter("MP_CREATE").await;
        let i = req.input;
        let id = self.store.new_id();
        let mut st = self.store.lock();
        st.bucket(&i.bucket)?;
        st.uploads.insert(
            id.clone(),
            Upload {
                bucket: i.bucket.clone(),
                key: i.key.clone(),
                initiated: SystemTime::now(),
                content_type: i.content_type,
                metadata: i.metadata,
                parts: Default::default(),
            },
        );
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.control.enter("MP_PART").await;
        let i = req.input;
        if !(1..=10_000).contains(&i.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "part number {} not in 1..=10000",
                i.part_number
            ));
        }
        self.store.lock().upload(&i.upload_id, &i.bucket, &i.key)?;
        let (path, tag) = (self.store.new_path(), self.store.new_etag());
        let data = files::write_body(i.body, path, i.content_md5.is_some(), tag).await?;
        if let (Some(want), Some(got)) = (&i.content_md5, &data.digest) {
            if *want != base64(got) {
                return Err(s3_error!(
                    BadDigest,
                    "Content-MD5 of part {} does not match",
                    i.part_number
                ));
            }
        }
        let tag = data.etag.clone();
        let old = {
            let mut st = self.store.lock();
            // aborted while the part was written: the part's file goes with `data`
            st.upload(&i.upload_id, &i.bucket, &i.key)?;
            let u = st.uploads.get_mut(&i.upload_id).expect("checked above");
            u.parts.insert(i.part_number, Arc::new(data))
        };
        drop(old);
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&tag)),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.control.enter("MP_COMPLETE").await;
        let i = req.input;
        let listed = i.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if listed.is_empty() {
            return Err(s3_error!(MalformedXML, "no parts listed"));
        }
        let (parts, content_type, metadata) = {
            let st = self.store.lock();
            let u = st.upload(&i.upload_id, &i.bucket, &i.key)?;
            let mut parts = Vec::with_capacity(listed.len());
            let mut prev = 0;
            for p in &listed {
                let n = p.part_number.unwrap_or(0);
                if n <= prev {
                    return Err(s3_error!(InvalidPartOrder, "part {n} after part {prev}"));
                }
                prev = n;
                let have = u
                    .parts
                    .get(&n)
                    .ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?;
                if p.e_tag.as_ref().is_some_and(|e| e.value() != have.etag) {
                    return Err(s3_error!(InvalidPart, "part {n}: ETag differs"));
                }
                parts.push(have.clone());
            }
            (parts, u.content_type.clone(), u.metadata.clone())
        };
        let data = files::concat(parts, self.store.new_path(), self.store.new_etag()).await?;
        let obj = Obj {
            data: Arc::new(data),
            modified: SystemTime::now(),
            content_type,
            metadata,
        };
        let obj = {
            // the upload must still exist (not aborted or completed meanwhile): taken out here
            let upload = {
                let mut st = self.store.lock();
                st.upload(&i.upload_id, &i.bucket, &i.key)?;
                st.uploads.remove(&i.upload_id)
            };
            drop(upload);
            let (inm, im) = (i.if_none_match.as_ref(), i.if_match.as_ref());
            self.store.commit(&i.bucket, &i.key, obj, inm, im)?
        };
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            e_tag: Some(etag(&obj.data.etag)),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.control.enter("MP_ABORT").await;
        let i = req.input;
        let upload = {
            let mut st = self.store.lock();
            st.upload(&i.upload_id, &i.bucket, &i.key)?;
            st.uploads.remove(&i.upload_id)
        };
        drop(upload); // outside the lock: unlinks the parts
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.control.enter("LIST").await;
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let url = wants_url(&i.encoding_type);
        let mut found: Vec<(String, SystemTime, String)> = {
            let st = self.store.lock();
            st.bucket(&i.bucket)?;
            st.uploads
                .iter()
                .filter(|(_, u)| u.bucket == i.bucket && u.key.starts_with(&prefix))
                .map(|(id, u)| (u.key.clone(), u.initiated, id.clone()))
                .collect()
        };
        found.sort();
        // one page: a benchmark's store never holds over 1,000 uploads at once
        let uploads = found
            .into_iter()
            .map(|(key, initiated, id)| MultipartUpload {
                key: Some(if url { url_encode(&key) } else { key }),
                initiated: Some(Timestamp::from(initiated)),
                upload_id: Some(id),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            encoding_type: i.encoding_type,
            is_truncated: Some(false),
            uploads: Some(uploads),
            ..Default::default()
        }))
    }
}
