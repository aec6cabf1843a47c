//! The floor server: the trivial hyper server plus the least any gateway must do to answer a
//! cached `values/get` with its access log on — parse the JSON body, look the names up, write
//! an access line — and nothing else (no lease, no access rules, no audit, no metrics, no
//! routing table, no time limits, the answer pre-rendered per name). What it costs above the
//! trivial server is a lower bound on what the gateway's cached read costs above it.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpListener;

/// What a `values/get` body asks; names borrowed from the body, as the cheapest parse does.
#[derive(Deserialize)]
struct ValuesGet<'a> {
    #[serde(rename = "Names", borrow)]
    names: Vec<&'a str>,
    #[serde(rename = "MaxAgeMs")]
    max_age_ms: Option<u64>,
}

/// One cached value: its answer, pre-rendered, and when it was read.
struct Cached {
    answer: Bytes,
    read_at: Instant,
}

/// Access lines waiting for the writer thread, which writes them in batches (as the gateway's
/// log writer does).
type Pending = Arc<Mutex<Vec<u8>>>;

/// Serves `answer` for `name` on 127.0.0.1 until the process ends; returns its address.
pub async fn start(name: String, answer: Bytes) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut cache = HashMap::new();
    cache.insert(
        name,
        Cached {
            answer,
            read_at: Instant::now(),
        },
    );
    let cache = Arc::new(cache);
    let pending: Pending = Arc::default();
    std::thread::spawn({
        let pending = pending.clone();
        move || write_access_lines(&pending)
    });
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (cache, pending) = (cache.clone(), pending.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (cache, pending) = (cache.clone(), pending.clone());
                    async move { Ok::<_, Infallible>(respond(&cache, &pending, peer, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn respond(
    cache: &HashMap<String, Cached>,
    pending: &Pending,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (status, answer) = match serde_json::from_slice::<ValuesGet>(&body) {
        Ok(asked) => {
            let max_age = Duration::from_millis(asked.max_age_ms.unwrap_or(0));
            match asked.names.first().and_then(|name| cache.get(*name)) {
                Some(cached) if cached.read_at.elapsed() <= max_age => {
                    (StatusCode::OK, cached.answer.clone())
                }
                _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"{}")),
            }
        }
        Err(_) => (StatusCode::BAD_REQUEST, Bytes::from_static(b"{}")),
    };
    let mut response = Response::new(Full::new(answer));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    access_line(
        pending,
        peer,
        parts.method.as_str(),
        parts.uri.path(),
        status,
        started,
    );
    response
}

thread_local! {
    /// The second the cached date prefix is for, and the prefix (`2026-12-02T05:38:47`).
    static SECOND: std::cell::RefCell<(u64, String)> = const {
        std::cell::RefCell::new((u64::MAX, String::new()))
    };
}

/// `2026-12-02T05:38:47.123Z 127.0.0.1:40000 POST /api/resources/values/get 200 14us`.
fn access_line(
    pending: &Pending,
    peer: SocketAddr,
    method: &str,
    path: &str,
    status: StatusCode,
    started: Instant,
) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut line = Vec::with_capacity(128);
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != since_epoch.as_secs() {
            let at = time::OffsetDateTime::from_unix_timestamp(since_epoch.as_secs() as i64)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
            *cached = (
                since_epoch.as_secs(),
                format!(
                    "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                    at.year(),
                    at.month() as u8,
                    at.day(),
                    at.hour(),
                    at.minute(),
                    at.second()
                ),
            );
        }
        line.extend_from_slice(cached.1.as_bytes());
    });
    let millis = since_epoch.subsec_millis();
    line.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
        b'Z',
        b' ',
    ]);
    push_peer(&mut line, peer);
    line.push(b' ');
    line.extend_from_slice(method.as_bytes());
    line.push(b' ');
    line.extend_from_slice(path.as_bytes());
    line.push(b' ');
    line.extend_from_slice(itoa::Buffer::new().format(status.as_u16()).as_bytes());
    line.push(b' ');
    line.extend_from_slice(
        itoa::Buffer::new()
            .format(started.elapsed().as_micros())
            .as_bytes(),
    );
    line.extend_from_slice(b"us\n");
    pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend_from_slice(&line);
}

/// `127.0.0.1:40000` without `core::fmt` (as the gateway writes it).
fn push_peer(line: &mut Vec<u8>, peer: SocketAddr) {
    match peer {
        SocketAddr::V4(v4) => {
            for (i, octet) in v4.ip().octets().iter().enumerate() {
                if i > 0 {
                    line.push(b'.');
                }
                line.extend_from_slice(itoa::Buffer::new().format(*octet).as_bytes());
            }
        }
        SocketAddr::V6(v6) => {
            let _ = write!(line, "[{}]", v6.ip());
        }
    }
    line.push(b':');
    line.extend_from_slice(itoa::Buffer::new().format(peer.port()).as_bytes());
}

/// Writes the pending access lines to stderr every millisecond, in one write a batch.
fn write_access_lines(pending: &Pending) {
    let mut batch = Vec::new();
    let mut stderr = std::io::stderr();
    loop {
        std::thread::sleep(Duration::from_millis(1));
        std::mem::swap(
            &mut batch,
            &mut pending.lock().unwrap_or_else(|p| p.into_inner()),
        );
        if !batch.is_empty() {
            let _ = stderr.write_all(&batch);
            batch.clear();
        }
    }
}
