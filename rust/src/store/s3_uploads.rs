//! S3's ListMultipartUploads and ListParts, which object_store 0.12 does not offer: `gc` finds
//! the incomplete multipart uploads of killed writers with them (a save writes no marker, so
//! nothing else names such an upload). The requests go through the HTTP client object_store
//! built for the store (same TLS, proxy and timeout options) and are signed with its
//! credentials ([`AwsAuthorizer`]); the aborts themselves use object_store's
//! `abort_multipart`.
//!
//! Responses are hostile: bodies are read up to [`MAX_BODY`] bytes, pages up to
//! [`MAX_PAGES`], every field is checked, and errors name the URL; nothing panics.

use super::runtime::block_on;
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{
    HttpClient, HttpConnector, HttpRequest, HttpRequestBody, HttpResponse, ReqwestConnector,
};
use object_store::ClientOptions;
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest response body read (a page of 1,000 uploads is about 400 KiB).
pub const MAX_BODY: usize = 16 << 20;
/// Most pages followed in one listing (1,000 uploads or parts a page).
pub const MAX_PAGES: usize = 10_000;

/// An [`HttpConnector`] that builds object_store's usual reqwest client and keeps the last one
/// it built: the store's own client (built last by `AmazonS3Builder::build`), reused here.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeepClient(Arc<Mutex<Option<HttpClient>>>);

impl HttpConnector for KeepClient {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let c = ReqwestConnector::default().connect(options)?;
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(c.clone());
        }
        Ok(c)
    }
}

impl KeepClient {
    pub(crate) fn take(&self) -> Option<HttpClient> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }
}

/// One incomplete multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub key: String,
    pub id: String,
    pub initiated: DateTime<Utc>,
}

/// The S3 bucket of a store, for the two listings object_store lacks.
pub(crate) struct S3Uploads {
    s3: Arc<AmazonS3>,
    http: HttpClient,
    /// `https://s3.REGION.amazonaws.com/BUCKET`, `https://BUCKET.s3…` or `ENDPOINT/BUCKET`:
    /// the URL object keys are appended to (the rule of `AmazonS3Builder::build`).
    bucket_url: String,
    region: String,
    skip_signature: bool,
    request_payer: bool,
    max_retries: usize,
}

impl S3Uploads {
    /// From the configured builder (before `build` consumed a clone of it) and what `build`
    /// made. `None` where the bucket URL is not one we can derive (S3 Express zonal buckets).
    pub(crate) fn new(
        b: &AmazonS3Builder,
        bucket: &str,
        s3: Arc<AmazonS3>,
        http: HttpClient,
        max_retries: usize,
    ) -> Option<Self> {
        let flag = |k: AmazonS3ConfigKey| {
            b.get_config_value(&k)
                .map(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on"))
                .unwrap_or(false)
        };
        if flag(AmazonS3ConfigKey::S3Express) {
            return None;
        }
        let region = b
            .get_config_value(&AmazonS3ConfigKey::Region)
            .unwrap_or_else(|| "us-east-1".to_string());
        let virtual_hosted = flag(AmazonS3ConfigKey::VirtualHostedStyleRequest);
        let bucket_url = match (
            b.get_config_value(&AmazonS3ConfigKey::Endpoint),
            virtual_hosted,
        ) {
            (Some(e), true) => e.trim_end_matches('/').to_string(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        Some(S3Uploads {
            s3,
            http,
            bucket_url,
            region,
            skip_signature: flag(AmazonS3ConfigKey::SkipSignature),
            request_payer: flag(AmazonS3ConfigKey::RequestPayer),
            max_retries,
        })
    }

    /// The URL of the bucket (`key` empty) or of `key`, with `query` (already encoded pairs).
    fn url(&self, key: &str, query: &[(&str, &str)]) -> Result<url::Url> {
        let mut u = url::Url::parse(&self.bucket_url).map_err(|e| {
            Error::InvalidArgument(format!("{}: invalid bucket URL: {e}", self.bucket_url))
        })?;
        if !key.is_empty() {
            let mut segs = u.path_segments_mut().map_err(|()| {
                Error::InvalidArgument(format!("{}: cannot address keys", self.bucket_url))
            })?;
            segs.pop_if_empty().extend(key.split('/'));
        }
        {
            let mut q = u.query_pairs_mut();
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        Ok(u)
    }

    fn io(&self, url: &url::Url, op: &'static str, msg: String) -> Error {
        Error::Io {
            path: url.as_str().split('?').next().unwrap_or_default().into(),
            op,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, msg),
        }
    }

    /// One signed GET, retried on 5xx, 429 and transport errors (as object_store's own
    /// requests are). Returns the body (at most [`MAX_BODY`] bytes) and the server's `Date`.
    async fn get(
        &self,
        url: &url::Url,
        op: &'static str,
    ) -> Result<(Vec<u8>, Option<DateTime<Utc>>)> {
        let mut delay = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            let last = tries > self.max_retries;
            match self.get_once(url, op).await {
                Ok(r) => return Ok(r),
                Err((true, _)) if !last => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err((_, e)) => return Err(e),
            }
        }
    }

    /// One try: `Err((retryable, error))`.
    async fn get_once(
        &self,
        url: &url::Url,
        op: &'static str,
    ) -> std::result::Result<(Vec<u8>, Option<DateTime<Utc>>), (bool, Error)> {
        let mut req: HttpRequest = http::Request::builder()
            .method(http::Method::GET)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| {
                (
                    false,
                    self.io(url, op, format!("cannot build the request: {e}")),
                )
            })?;
        if !self.skip_signature {
            let cred = self
                .s3
                .credentials()
                .get_credential()
                .await
                .map_err(|e| (true, self.io(url, op, format!("no credentials: {e}"))))?;
            AwsAuthorizer::new(&cred, "s3", &self.region)
                .with_request_payer(self.request_payer)
                .authorize(&mut req, None);
        }
        let resp: HttpResponse = self
            .http
            .execute(req)
            .await
            .map_err(|e| (true, self.io(url, op, format!("request failed: {e}"))))?;
        let status = resp.status();
        let date = resp
            .headers()
            .get(http::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| DateTime::parse_from_rfc2822(s).ok())
            .map(|d| d.with_timezone(&Utc));
        let mut body = Vec::new();
        let mut stream = resp.into_body().bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| (true, self.io(url, op, format!("reading the response: {e}"))))?;
            if body.len() + chunk.len() > MAX_BODY {
                return Err((
                    false,
                    self.io(url, op, format!("response larger than {MAX_BODY} bytes")),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        if status.as_u16() == 404 {
            // NoSuchUpload (completed or aborted since it was listed) or NoSuchBucket
            return Err((
                false,
                Error::NotFound {
                    path: url.as_str().split('?').next().unwrap_or_default().into(),
                    what: op.to_string(),
                },
            ));
        }
        if status.as_u16() == 501 {
            // a server without ListParts (S3-compatible ones): the caller decides without it
            return Err((
                false,
                Error::Io {
                    path: url.as_str().split('?').next().unwrap_or_default().into(),
                    op,
                    source: std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        format!("HTTP {status}: the server does not implement {op}"),
                    ),
                },
            ));
        }
        if !status.is_success() {
            let retry =
                status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408;
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err((retry, self.io(url, op, format!("HTTP {status}: {text}"))));
        }
        Ok((body, date))
    }

    /// Every incomplete multipart upload whose key starts with `prefix`, following the pages,
    /// and the store's clock at the first answer (its `Date` header), if it sent one.
    pub(crate) fn list(&self, prefix: &str) -> Result<(Vec<Upload>, Option<DateTime<Utc>>)> {
        block_on(async {
            let (mut out, mut now) = (Vec::new(), None);
            let (mut key_marker, mut id_marker) = (String::new(), String::new());
            for _ in 0..MAX_PAGES {
                let mut q = vec![("uploads", ""), ("prefix", prefix)];
                if !key_marker.is_empty() {
                    q.push(("key-marker", key_marker.as_str()));
                    q.push(("upload-id-marker", id_marker.as_str()));
                }
                let url = self.url("", &q)?;
                let op = "list multipart uploads";
                let (body, date) = self.get(&url, op).await?;
                now = now.or(date);
                let page = parse_uploads(&body).map_err(|m| self.io(&url, op, m))?;
                for u in page.uploads {
                    // a key outside the prefix asked for is not ours to touch
                    if u.key.starts_with(prefix) {
                        out.push(u);
                    }
                }
                match page.next {
                    None => return Ok((out, now)),
                    Some((k, i))
                        if (k.as_str(), i.as_str()) > (key_marker.as_str(), id_marker.as_str()) =>
                    {
                        (key_marker, id_marker) = (k, i);
                    }
                    Some(_) => {
                        return Err(self.io(
                            &url,
                            op,
                            "truncated listing without a later marker".into(),
                        ))
                    }
                }
            }
            Err(Error::Io {
                path: self.bucket_url.clone().into(),
                op: "list multipart uploads",
                source: std::io::Error::other(format!("more than {MAX_PAGES} pages")),
            })
        })
    }

    /// When the newest part of upload `id` of `key` was uploaded (`None`: no part yet).
    pub(crate) fn newest_part(&self, key: &str, id: &str) -> Result<Option<DateTime<Utc>>> {
        block_on(async {
            let mut newest: Option<DateTime<Utc>> = None;
            let mut marker = 0u32;
            for _ in 0..MAX_PAGES {
                let m = marker.to_string();
                let mut q = vec![("uploadId", id)];
                if marker > 0 {
                    q.push(("part-number-marker", m.as_str()));
                }
                let url = self.url(key, &q)?;
                let op = "list parts";
                let (body, _) = self.get(&url, op).await?;
                let page = parse_parts(&body).map_err(|m| self.io(&url, op, m))?;
                newest = newest.max(page.newest);
                match page.next {
                    None => return Ok(newest),
                    Some(n) if n > marker => marker = n,
                    Some(_) => {
                        return Err(self.io(
                            &url,
                            op,
                            "truncated listing without a later marker".into(),
                        ))
                    }
                }
            }
            Ok(newest)
        })
    }
}

/// A page of ListMultipartUploads: the uploads and, when truncated, the next markers.
#[derive(Debug)]
pub(crate) struct UploadsPage {
    pub uploads: Vec<Upload>,
    pub next: Option<(String, String)>,
}

/// A page of ListParts: the newest part's time and, when truncated, the next part marker.
#[derive(Debug)]
pub(crate) struct PartsPage {
    pub newest: Option<DateTime<Utc>>,
    pub next: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadsXml {
    #[serde(default)]
    is_truncated: Option<String>,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<UploadXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadXml {
    key: String,
    upload_id: String,
    initiated: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PartsXml {
    #[serde(default)]
    is_truncated: Option<String>,
    #[serde(default)]
    next_part_number_marker: Option<String>,
    #[serde(default, rename = "Part")]
    parts: Vec<PartXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PartXml {
    last_modified: String,
}

fn truthy(v: &Option<String>) -> std::result::Result<bool, String> {
    match v.as_deref().map(str::trim) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(o) => Err(format!("IsTruncated is {o:?}, not true or false")),
    }
}

fn time(s: &str, what: &str) -> std::result::Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|d| d.with_timezone(&Utc))
        .map_err(|e| format!("{what} {s:?} is not a timestamp: {e}"))
}

fn xml_text(body: &[u8]) -> std::result::Result<&str, String> {
    std::str::from_utf8(body).map_err(|e| format!("response is not UTF-8: {e}"))
}

/// Parse a ListMultipartUploads answer (the error says what is wrong, not where: the caller
/// names the URL).
pub(crate) fn parse_uploads(body: &[u8]) -> std::result::Result<UploadsPage, String> {
    let x: UploadsXml = quick_xml::de::from_str(xml_text(body)?)
        .map_err(|e| format!("unparseable ListMultipartUploads answer: {e}"))?;
    let mut uploads = Vec::with_capacity(x.uploads.len());
    for u in x.uploads {
        if u.key.is_empty() || u.upload_id.is_empty() {
            return Err("an upload without a key or an upload id".into());
        }
        let initiated = time(&u.initiated, "Initiated")?;
        uploads.push(Upload {
            key: u.key,
            id: u.upload_id,
            initiated,
        });
    }
    let next = if truthy(&x.is_truncated)? {
        match (x.next_key_marker, x.next_upload_id_marker) {
            (Some(k), i) if !k.is_empty() => Some((k, i.unwrap_or_default())),
            _ => return Err("truncated listing without NextKeyMarker".into()),
        }
    } else {
        None
    };
    Ok(UploadsPage { uploads, next })
}

/// Parse a ListParts answer.
pub(crate) fn parse_parts(body: &[u8]) -> std::result::Result<PartsPage, String> {
    let x: PartsXml = quick_xml::de::from_str(xml_text(body)?)
        .map_err(|e| format!("unparseable ListParts answer: {e}"))?;
    let mut newest = None;
    for p in &x.parts {
        newest = newest.max(Some(time(&p.last_modified, "LastModified")?));
    }
    let next = if truthy(&x.is_truncated)? {
        let m = x.next_part_number_marker.unwrap_or_default();
        Some(
            m.trim()
                .parse::<u32>()
                .map_err(|_| format!("NextPartNumberMarker {m:?} is not a part number"))?,
        )
    } else {
        None
    };
    Ok(PartsPage { newest, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>d/c.data-1</NextKeyMarker><NextUploadIdMarker>id2</NextUploadIdMarker>
  <Prefix>d/</Prefix><MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>d/c.data-0</Key><UploadId>id1</UploadId>
    <Initiator><ID>x</ID></Initiator><Initiated>2026-11-29T14:00:00.000Z</Initiated></Upload>
  <Upload><Key>d/c.data-1&amp;x</Key><UploadId>id2</UploadId>
    <StorageClass>STANDARD</StorageClass><Initiated>2026-11-29T14:00:01Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;

    #[test]
    fn parses_a_truncated_page() {
        let p = parse_uploads(PAGE.as_bytes()).unwrap();
        assert_eq!(p.uploads.len(), 2);
        assert_eq!(p.uploads[1].key, "d/c.data-1&x");
        assert_eq!(p.uploads[0].id, "id1");
        assert_eq!(
            p.uploads[0].initiated.to_rfc3339(),
            "2026-11-29T14:00:00+00:00"
        );
        assert_eq!(p.next, Some(("d/c.data-1".into(), "id2".into())));
    }

    #[test]
    fn an_empty_listing_is_no_upload() {
        let body = b"<ListMultipartUploadsResult><Bucket>b</Bucket>\
            <IsTruncated>false</IsTruncated></ListMultipartUploadsResult>";
        let p = parse_uploads(body).unwrap();
        assert!(p.uploads.is_empty() && p.next.is_none());
    }

    #[test]
    fn hostile_answers_are_errors() {
        for (body, says) in [
            (&b"\xff\xfe"[..], "UTF-8"),
            (b"<ListMultipartUploadsResult><Upload>", "unparseable"),
            (
                b"<R><Upload><Key>k</Key><UploadId>i</UploadId><Initiated>soon</Initiated></Upload></R>",
                "not a timestamp",
            ),
            (b"<R><IsTruncated>true</IsTruncated></R>", "NextKeyMarker"),
            (b"<R><IsTruncated>maybe</IsTruncated></R>", "IsTruncated"),
            (
                b"<R><Upload><Key></Key><UploadId>i</UploadId><Initiated>2026-01-01T00:00:00Z</Initiated></Upload></R>",
                "without a key",
            ),
        ] {
            let e = parse_uploads(body).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn parts_give_the_newest_time_and_the_next_marker() {
        let body = b"<ListPartsResult><IsTruncated>true</IsTruncated>\
            <NextPartNumberMarker>2</NextPartNumberMarker>\
            <Part><PartNumber>1</PartNumber><LastModified>2026-11-29T14:00:05.000Z</LastModified></Part>\
            <Part><PartNumber>2</PartNumber><LastModified>2026-11-29T14:00:03.000Z</LastModified></Part>\
            </ListPartsResult>";
        let p = parse_parts(body).unwrap();
        assert_eq!(p.newest.unwrap().to_rfc3339(), "2026-11-29T14:00:05+00:00");
        assert_eq!(p.next, Some(2));
        let none =
            parse_parts(b"<ListPartsResult><IsTruncated>false</IsTruncated></ListPartsResult>")
                .unwrap();
        assert!(none.newest.is_none() && none.next.is_none());
        let bad = parse_parts(
            b"<R><IsTruncated>true</IsTruncated><NextPartNumberMarker>x</NextPartNumberMarker></R>",
        );
        assert!(bad.unwrap_err().contains("part number"));
    }
}
