//! What a benchmark needs around the S3 operations: a delay added to every request (a far-away
//! store: `latency SECONDS`) and request counts by kind since the last `reset` (`counts`: one
//! line of JSON), over a plain line protocol on a second port of 127.0.0.1. In the server, so
//! that thousands of requests a second are delayed and counted without a proxy's CPU (the
//! Python proxy of tests/s3_server.py was the bottleneck of a 4,096-rank merge).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Default)]
pub struct Control {
    latency_us: AtomicU64,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Control {
    /// Count one request of `kind` (the names of tests/s3_server.request_kind: GET, PUT, HEAD,
    /// LIST, DELETE, BULK_DELETE, MP_CREATE, MP_PART, MP_COMPLETE, MP_ABORT, COPY, BUCKET) and
    /// wait the configured latency.
    pub async fn enter(&self, kind: &'static str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
        let us = self.latency_us.load(Ordering::Relaxed);
        if us > 0 {
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
    }

    /// The answer to one command line.
    fn command(&self, line: &str) -> String {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("latency"), Some(v)) => match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s >= 0.0 => {
                    self.latency_us
                        .store((s * 1e6).round() as u64, Ordering::Relaxed);
                    "ok".into()
                }
                _ => format!("error: bad latency {v:?} (seconds, >= 0)"),
            },
            (Some("reset"), None) => {
                self.counts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                "ok".into()
            }
            (Some("counts"), None) => {
                let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
                let items: Vec<String> = c.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{{}}}", items.join(", "))
            }
            _ => format!("error: unknown command {line:?} (latency S, reset, counts)"),
        }
    }

    /// Answer command lines on `listener` until the process ends.
    pub async fn serve(self: std::sync::Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let (rd, mut wr) = socket.into_split();
                let mut lines = BufReader::new(rd).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut out = me.command(&line);
                    out.push('\n');
                    if wr.write_all(out.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_set_latency_and_count() {
        let c = Control::default();
        assert_eq!(c.command("latency 0.02"), "ok");
        assert_eq!(c.latency_us.load(Ordering::Relaxed), 20_000);
        assert!(c.command("latency -1").starts_with("error"));
        assert!(c.command("bogus").starts_with("error"));
        *c.counts.lock().unwrap().entry("GET").or_default() += 2;
        *c.counts.lock().unwrap().entry("PUT").or_default() += 1;
        assert_eq!(c.command("counts"), "{\"GET\": 2, \"PUT\": 1}");
        assert_eq!(c.command("reset"), "ok");
        assert_eq!(c.command("counts"), "{}");
    }
}
