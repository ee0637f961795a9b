//! `sp-s3server --root DIR [--host 127.0.0.1] [--port 0] [--access-key K --secret-key S]`:
//! an S3-compatible server over DIR for the benchmarks (benches/s3server.py starts it). It
//! prints `listening on http://HOST:PORT` once it accepts connections (port 0: a free one), then
//! `control on HOST:PORT` (the latency and request counts of `control.rs`), and stops on
//! SIGTERM or Ctrl-C. Requests must be signed (SigV4) with the given key pair
//! (default `testing` / `testing`, the tests' and benches' credentials); path-style only.

mod control;
mod files;
mod listing;
mod service;
mod store;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

struct Args {
    root: PathBuf,
    host: String,
    port: u16,
    access_key: String,
    secret_key: String,
}

fn usage(msg: &str) -> ! {
    eprintln!("sp-s3server: {msg}");
    eprintln!(
        "usage: sp-s3server --root DIR [--host H] [--port P] [--access-key K] [--secret-key S]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        root: PathBuf::new(),
        host: "127.0.0.1".into(),
        port: 0,
        access_key: "testing".into(),
        secret_key: "testing".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--root" => a.root = PathBuf::from(value()),
            "--host" => a.host = value(),
            "--port" => {
                let v = value();
                a.port = v
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("bad port {v:?}")))
            }
            "--access-key" => a.access_key = value(),
            "--secret-key" => a.secret_key = value(),
            _ => usage(&format!("unknown argument {flag:?}")),
        }
    }
    if a.root.as_os_str().is_empty() {
        usage("--root is required");
    }
    a
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = parse_args();
    let store = Arc::new(store::Store::new(args.root.clone())?);
    let control = Arc::new(control::Control::default());
    let s3 = {
        let server = service::Server {
            store,
            control: control.clone(),
        };
        let mut b = S3ServiceBuilder::new(server);
        b.set_auth(SimpleAuth::from_single(args.access_key, args.secret_key));
        b.build()
    };
    let listener = TcpListener::bind((args.host.as_str(), args.port)).await?;
    let addr = listener.local_addr()?;
    let control_listener = TcpListener::bind((args.host.as_str(), 0)).await?;
    let control_addr = control_listener.local_addr()?;
    tokio::spawn(control.serve(control_listener));
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        writeln!(out, "control on {control_addr}")?;
        out.flush()?;
    }
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let socket = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    eprintln!("sp-s3server: accept: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = ctrl_c.as_mut() => break,
        };
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(socket), s3.clone());
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    // connections in flight get a moment to finish, then the process ends regardless
    tokio::select! {
        () = graceful.shutdown() => {},
        () = tokio::time::sleep(std::time::Duration::from_secs(2)) => {},
    }
    Ok(())
}
