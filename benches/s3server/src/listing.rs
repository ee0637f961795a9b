//! ListObjectsV2 over a sorted map: prefix, delimiter (common prefixes), max-keys and
//! continuation. The continuation token names the last entry returned, marked as a key
//! (`k:`) or a common prefix (`p:`, whose keys are all skipped on resume).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::store::Obj;

/// One page of a listing.
pub struct Page {
    pub objects: Vec<(String, Arc<Obj>)>,
    pub prefixes: Vec<String>,
    /// The token of the next page, if the listing was cut at `max`.
    pub next: Option<String>,
}

/// Where a listing resumes: after a key, or after every key under a common prefix.
pub enum After<'a> {
    Start,
    Key(&'a str),
    Prefix(&'a str),
}

impl<'a> After<'a> {
    /// A continuation token (ours) or, without one, `start-after` (a key).
    pub fn parse(token: Option<&'a str>, start_after: Option<&'a str>) -> Option<Self> {
        match (token, start_after) {
            (Some(t), _) => {
                if let Some(k) = t.strip_prefix("k:") {
                    Some(After::Key(k))
                } else {
                    t.strip_prefix("p:").map(After::Prefix)
                }
            }
            (None, Some(k)) if !k.is_empty() => Some(After::Key(k)),
            _ => Some(After::Start),
        }
    }
}

pub fn list(
    objects: &BTreeMap<String, Arc<Obj>>,
    prefix: &str,
    delimiter: Option<&str>,
    after: After<'_>,
    max: usize,
) -> Page {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let (lower, mut skip) = match after {
        After::Start => (Bound::Included(prefix), None),
        After::Key(k) if k < prefix => (Bound::Included(prefix), None),
        After::Key(k) => (Bound::Excluded(k), None),
        After::Prefix(p) if p < prefix => (Bound::Included(prefix), None),
        After::Prefix(p) => (Bound::Excluded(p), Some(p.to_string())),
    };
    let mut page = Page {
        objects: Vec::new(),
        prefixes: Vec::new(),
        next: None,
    };
    let mut last: Option<String> = None;
    let mut count = 0;
    for (k, o) in objects.range::<str, _>((lower, Bound::Unbounded)) {
        if !k.starts_with(prefix) {
            break; // keys under a prefix are contiguous, and the range starts at or in them
        }
        if skip.as_deref().is_some_and(|s| k.starts_with(s)) {
            continue;
        }
        let group = delimiter.and_then(|d| {
            let rest = &k[prefix.len()..];
            rest.find(d).map(|i| &k[..prefix.len() + i + d.len()])
        });
        if count == max {
            page.next = last;
            break;
        }
        count += 1;
        if let Some(g) = group {
            page.prefixes.push(g.to_string());
            last = Some(format!("p:{g}"));
            skip = Some(g.to_string());
        } else {
            page.objects.push((k.clone(), o.clone()));
            last = Some(format!("k:{k}"));
        }
    }
    page
}

/// Percent-encoding of a key for `encoding-type=url` answers (what boto3 asks for and
/// decodes): unreserved characters and `/` as they are, every other byte as `%XX`.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::DataFile;
    use std::time::SystemTime;

    fn map(keys: &[&str]) -> BTreeMap<String, Arc<Obj>> {
        keys.iter()
            .map(|k| {
                let data = Arc::new(DataFile {
                    path: "/nonexistent/sp-s3server-test".into(),
                    size: 0,
                    digest: None,
                    etag: String::new(),
                });
                let o = Obj {
                    data,
                    modified: SystemTime::now(),
                    content_type: None,
                    metadata: None,
                };
                (k.to_string(), Arc::new(o))
            })
            .collect()
    }

    fn keys(p: &Page) -> Vec<&str> {
        p.objects.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn prefix_and_delimiter_group_keys() {
        let m = map(&["a", "d/1", "d/2", "d/e/3", "da", "e"]);
        let p = list(&m, "d", Some("/"), After::Start, 1000);
        assert_eq!(keys(&p), ["da"]);
        assert_eq!(p.prefixes, ["d/"]);
        let p = list(&m, "d/", Some("/"), After::Start, 1000);
        assert_eq!(keys(&p), ["d/1", "d/2"]);
        assert_eq!(p.prefixes, ["d/e/"]);
        assert!(p.next.is_none());
    }

    #[test]
    fn pages_resume_after_keys_and_prefixes() {
        let m = map(&["a", "b/1", "b/2", "c", "d/1", "e"]);
        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let after = After::parse(token.as_deref(), None).unwrap();
            let p = list(&m, "", Some("/"), after, 2);
            seen.extend(keys(&p).iter().map(|s| s.to_string()));
            seen.extend(p.prefixes.iter().cloned());
            match p.next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(seen, ["a", "b/", "c", "d/", "e"]);
    }

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(url_encode("a b/c+d%"), "a%20b/c%2Bd%25");
    }
}
