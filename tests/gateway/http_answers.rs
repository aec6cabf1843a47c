//! Every request answered, over raw sockets: a client that half-closes its side after a whole
//! request still gets its answer (plain and TLS), one that half-closes before its body is whole
//! has nothing done for it, a 405 names the methods its path has (`Allow`), an HTTP/1.1 request
//! without `Host` is 400 naming it, and an idle keep-alive connection outlives the header
//! timeout (`http.keep_alive_timeout_ms`) while a slow head is still cut at it.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// One answer as it came on the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head's lines after the status line.
    head: String,
    body: String,
}

impl Answer {
    /// The value of the header `name` (given in lower case).
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (named, value) = line.split_once(':')?;
            (named.to_lowercase() == name).then(|| value.trim())
        })
    }

    fn json(&self) -> Json {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {:?}", self.body))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one answer (head, and a body of its `Content-Length` unless it answers a HEAD) from
/// `stream` within 5 s; `None` when the stream ended before a whole one came.
async fn read_answer<S: AsyncRead + Unpin>(stream: &mut S, to_head: bool) -> Option<Answer> {
    let mut bytes = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = find(&bytes, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
                let length = head
                    .to_lowercase()
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|n| n.trim().parse::<usize>().ok())
                    .filter(|_| !to_head)
                    .unwrap_or(0);
                if bytes.len() >= end + 4 + length {
                    let status = head.split(' ').nth(1)?.parse().ok()?;
                    let body = String::from_utf8_lossy(&bytes[end + 4..end + 4 + length]);
                    let head = head.split_once("\r\n").map_or("", |(_, rest)| rest);
                    return Some(Answer {
                        status,
                        head: head.replace("\r\n", "\n"),
                        body: body.into_owned(),
                    });
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    };
    within(
        Duration::from_secs(5),
        "an answer or the end of the stream",
        read,
    )
    .await
}

/// Sends `request` on a new connection, half-closes (`shutdown(SHUT_WR)`) when `half_close`,
/// and reads the answer.
async fn exchange(to: SocketAddr, request: &[u8], half_close: bool) -> Option<Answer> {
    let mut stream = TcpStream::connect(to).await.unwrap();
    stream.write_all(request).await.unwrap();
    if half_close {
        stream.shutdown().await.unwrap();
    }
    read_answer(&mut stream, request.starts_with(b"HEAD ")).await
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const TAKE: &str = r#"{"Owner": "half-closed client", "TtlMs": 30000}"#;

/// The lease answered to a half-closed client is the live one: its id renews and releases it.
async fn the_id_holds_the_lease(rig: &Rig, answer: Option<Answer>) {
    let answer = answer.expect("no answer to a half-closed POST api/lease");
    assert_eq!(answer.status, 200, "{answer:?}");
    let id = answer.json()["leaseId"].as_str().unwrap().to_owned();
    let (status, view) = rig.get("lease").await;
    assert_eq!(status, 200);
    assert_eq!(view["owner"], json!("half-closed client"), "{view}");
    rig.release_lease(&id).await;
}

#[tokio::test]
async fn a_lease_request_whose_client_half_closed_after_it_is_answered() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    the_id_holds_the_lease(&rig, exchange(addr, &post("/api/lease", TAKE), true).await).await;
    // With `Connection: close` too, and a read that needs no body.
    let closing = format!(
        "POST /api/lease HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{TAKE}",
        TAKE.len()
    );
    the_id_holds_the_lease(&rig, exchange(addr, closing.as_bytes(), true).await).await;
    let read = exchange(
        addr,
        b"GET /api/capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        true,
    )
    .await;
    assert_eq!(read.map(|a| a.status), Some(200));
}

/// Waits (at most 5 s) until `count` requests wait in line for the control lease.
async fn in_line(rig: &Rig, count: usize, what: &str) {
    let lease = rig.gateway.gateway.lease.clone();
    until(Duration::from_secs(5), what, || {
        lease.waiting_in_line() == count
    })
    .await;
}

#[tokio::test]
async fn a_lease_request_waiting_in_line_leaves_it_when_its_client_closes() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    let id = rig.take_lease("holder").await;
    let waits = |owner: &str| {
        let body = format!(r#"{{"Owner": "{owner}", "TtlMs": 30000}}"#);
        post("/api/lease?waitMs=20000", &body)
    };
    // One waits and gives up (closes, as a client's own timeout does); one half-closes.
    let mut gone = TcpStream::connect(addr).await.unwrap();
    gone.write_all(&waits("gone")).await.unwrap();
    in_line(&rig, 1, "the first waiter in line").await;
    drop(gone);
    in_line(&rig, 0, "the closed waiter to leave the line").await;
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&waits("half-closed")).await.unwrap();
    in_line(&rig, 1, "the second waiter in line").await;
    half.shutdown().await.unwrap();
    // Out of line, and told so: a refusal naming the holder, nothing taken.
    let answer = read_answer(&mut half, false).await.expect("no answer");
    assert_eq!(answer.status, 409, "{answer:?}");
    assert!(answer.body.contains("holder"), "{answer:?}");
    in_line(&rig, 0, "the half-closed waiter to leave the line").await;
    rig.release_lease(&id).await;
    let (_, view) = rig.get("lease").await;
    assert_eq!(
        view["held"],
        json!(false),
        "taken for a client that left: {view}"
    );
}

#[tokio::test]
async fn a_request_whose_client_half_closed_before_its_body_was_whole_is_not_acted_on() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    // A declared length not reached, and a chunked body without its last chunk.
    let short = format!(
        "POST /api/lease HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        TAKE.len() + 10,
        TAKE
    );
    let unfinished = format!(
        "POST /api/lease HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{TAKE}\r\n",
        TAKE.len()
    );
    let set = format!(r#"{{"Name": "{VSET1}", "Value": "3"}}"#);
    let short_set = format!(
        "POST /api/resources/value/set HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{set}",
        set.len() + 1
    );
    for request in [short, unfinished, short_set] {
        // Answered, as a body cut short is: the client may still read.
        let answer = exchange(addr, request.as_bytes(), true).await;
        let answer = answer.unwrap_or_else(|| panic!("{request:?}: no answer"));
        assert_eq!(answer.status, 400, "{request:?}: {answer:?}");
        let message = answer.json()["error"].as_str().unwrap().to_owned();
        assert!(message.contains("body"), "{message}");
    }
    let (status, view) = rig.get("lease").await;
    assert_eq!(status, 200);
    assert_eq!(view["held"], json!(false), "{view}");
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
}

#[tokio::test]
async fn a_tls_client_that_half_closes_after_its_request_is_answered() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("sg-answers-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("gateway.crt"), dir.join("gateway.key"));
    std::fs::write(&cert_path, certified.cert.pem()).unwrap();
    std::fs::write(&key_path, certified.key_pair.serialize_pem()).unwrap();
    let rig = rig(|c| {
        c.http.tls.cert = cert_path.display().to_string();
        c.http.tls.key = key_path.display().to_string();
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(rig.gateway.http_addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(&post("/api/lease", TAKE)).await.unwrap();
    // close_notify, then the TCP write side shut.
    tls.shutdown().await.unwrap();
    let answer = read_answer(&mut tls, false).await;
    let _ = std::fs::remove_dir_all(&dir);
    let answer = answer.expect("no answer to a half-closed POST api/lease over TLS");
    assert_eq!(answer.status, 200, "{answer:?}");
    let id = answer.json()["leaseId"].as_str().unwrap().to_owned();
    let released = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
        .delete(format!(
            "https://localhost:{}/api/lease/{id}",
            rig.gateway.http_addr.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
}

#[tokio::test]
async fn a_405_names_the_methods_of_its_path_in_allow() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    for (request_line, allow) in [
        ("PUT /api/lease", "GET, POST, DELETE"),
        ("GET /api/lease/abc", "PUT, DELETE"),
        ("PATCH /api/subscriptions/s1", "PUT, DELETE"),
        ("HEAD /api/capabilities", "GET"),
        ("GET /api/resources/value/set", "POST"),
        ("POST /healthz", "GET, HEAD"),
        ("DELETE /metrics", "GET, HEAD"),
        ("GET /v1/safe-stop", "POST"),
        ("PATCH /v1/leases/job", "GET, POST, PUT, DELETE"),
    ] {
        let request =
            format!("{request_line} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n");
        let answer = exchange(addr, request.as_bytes(), false)
            .await
            .unwrap_or_else(|| panic!("{request_line}: no answer"));
        assert_eq!(answer.status, 405, "{request_line}: {answer:?}");
        assert_eq!(
            answer.header("allow"),
            Some(allow),
            "{request_line}: {answer:?}"
        );
    }
    // An answer that is not a 405 names no methods.
    let answer = exchange(
        addr,
        b"GET /api/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        false,
    )
    .await
    .unwrap();
    assert_eq!((answer.status, answer.header("allow")), (200, None));
}

#[tokio::test]
async fn an_http11_request_without_host_is_400_naming_the_header() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    for request in [
        "GET /api/lease HTTP/1.1\r\n\r\n".to_owned(),
        "GET /healthz HTTP/1.1\r\n\r\n".to_owned(),
        "GET /openapi.json HTTP/1.1\r\n\r\n".to_owned(),
        format!(
            "POST /api/lease HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{TAKE}",
            TAKE.len()
        ),
        // Two are as wrong as none.
        "GET /api/lease HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_owned(),
    ] {
        let answer = exchange(addr, request.as_bytes(), false)
            .await
            .unwrap_or_else(|| panic!("no answer to {request:?}"));
        assert_eq!(answer.status, 400, "{request:?}: {answer:?}");
        let message = answer.json()["error"].as_str().unwrap().to_owned();
        assert!(message.contains("Host"), "{message}");
    }
    // Nothing was taken by the POST without Host.
    assert_eq!(rig.get("lease").await.1["held"], json!(false));
    // HTTP/1.0 has no such rule.
    let answer = exchange(addr, b"GET /api/lease HTTP/1.0\r\n\r\n", false)
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// Sends `GET /healthz` on `stream` and reads its 200.
async fn healthz_on<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, what: &str) {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(stream, false)
        .await
        .unwrap_or_else(|| panic!("{what}: the connection was closed"));
    assert_eq!(answer.status, 200, "{what}: {answer:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_timeout() {
    // The keep-alive timeout at its default, 120 s (longer than accordionq2 5.28.1 keeps an idle
    // connection before it reopens one itself, 60 s: `accordionq2/_base.py`).
    let rig = rig(|c| c.http.header_read_timeout_ms = 200).await;
    let addr = rig.gateway.http_addr;
    let mut kept = TcpStream::connect(addr).await.unwrap();
    healthz_on(&mut kept, "the first request").await;
    // Idle for three header timeouts: the time between requests is the point here.
    tokio::time::sleep(Duration::from_millis(600)).await;
    healthz_on(&mut kept, "a request after 600 ms idle").await;

    // A head begun after an idle spell is still cut at the header timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let took = closed_within(&mut kept, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(150),
        "cut too early: {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "a slow head kept for {took:?}"
    );
    // A connection that never sends a request is closed at the header timeout too.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let took = closed_within(&mut silent, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(3),
        "a silent connection kept for {took:?}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_closes_after_the_keep_alive_timeout() {
    let rig = rig(|c| {
        c.http.header_read_timeout_ms = 30_000;
        c.http.keep_alive_timeout_ms = 300;
    })
    .await;
    let mut kept = TcpStream::connect(rig.gateway.http_addr).await.unwrap();
    healthz_on(&mut kept, "the first request").await;
    let took = closed_within(&mut kept, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(250),
        "closed too early: {took:?}"
    );
}
