//! Hostile HTTP clients: slow headers, thousands of idle sockets against the connection limit,
//! oversized and chunked bodies, deeply nested JSON, invalid UTF-8, a 10 KB `X-Lease-Id`, and
//! the OpenAPI document at `/openapi.json`. Every answer must be a clear 4xx, never a 5xx.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends raw bytes on a fresh connection and returns the status line's code (0 if the server
/// closed without answering).
async fn raw(rig: &Rig, bytes: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(rig.gateway.http_addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if let Some(end) = find(&answer, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&answer[..end]).to_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|n| n.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if answer.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
            }
        }
    });
    read.await.expect("no answer within 5 s");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn post_raw(path: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /api/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

#[tokio::test]
async fn a_client_that_sends_half_a_header_and_stalls_is_disconnected() {
    let rig = rig(|c| c.http.header_read_timeout_ms = 300).await;
    let mut half = TcpStream::connect(rig.gateway.http_addr).await.unwrap();
    half.write_all(b"GET /api/capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let took = closed_within(&mut half, Duration::from_secs(3)).await;
    assert!(
        took >= Duration::from_millis(250),
        "closed too early: {took:?}"
    );
    // Counted as a header timeout (once the gateway's side has closed, just after ours saw it).
    common::within(
        Duration::from_secs(5),
        "the header timeout counted",
        async {
            loop {
                let (_, metrics) = rig.get_text("/metrics").await;
                if metrics.contains("station_gateway_http_timeouts_total{stage=\"headers\"} 1") {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    // A connection that sends nothing at all is let go the same way.
    let mut silent = TcpStream::connect(rig.gateway.http_addr).await.unwrap();
    closed_within(&mut silent, Duration::from_secs(3)).await;
    // Everyone else is served meanwhile.
    let (status, _) = rig.get("capabilities").await;
    assert_eq!(status, 200);
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn idle_sockets_past_the_connection_limit_make_room_and_do_not_exhaust_descriptors() {
    let limit = 50;
    let reserved = 16;
    let rig = rig(|c| {
        c.http.max_connections = limit;
        c.http.reserved_connections = reserved;
        // Every socket comes from 127.0.0.1: let it hold every slot (the per-address share is
        // tested in tests/gateway/http_timeouts.rs).
        c.http.max_connections_per_ip = limit + reserved;
        c.http.header_read_timeout_ms = 60_000;
    })
    .await;
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = rig.url("capabilities");
    assert_eq!(quick.get(&url).send().await.unwrap().status(), 200);
    let baseline = open_descriptors();

    // 2 000 idle sockets: the gateway holds `limit` of them at a time, each newcomer closing
    // the one idle the longest; the rest wait in the backlog.
    let mut idle = Vec::new();
    for _ in 0..2000 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            TcpStream::connect(rig.gateway.http_addr),
        )
        .await
        {
            Ok(Ok(stream)) => idle.push(stream),
            _ => break, // the backlog is full: the kernel stops completing handshakes
        }
    }
    assert!(idle.len() > limit * 2, "only {} sockets opened", idle.len());
    // Our side holds one descriptor per socket; the gateway's side at most `limit` and the
    // reserve more.
    let during = open_descriptors();
    assert!(
        during <= baseline + idle.len() + limit + reserved + 16,
        "{during} descriptors for {} sockets (baseline {baseline})",
        idle.len()
    );
    // At the limit a new request is still served: idle sockets make room for it, the longest
    // idle first (it waits for those ahead of it in the backlog).
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert_eq!(patient.get(&url).send().await.unwrap().status(), 200);
    assert!(rig.gateway.gateway.metrics.http_connections_evicted.get() > 0);
    let during = open_descriptors();
    assert!(
        during <= baseline + idle.len() + limit + reserved + 16,
        "{during} descriptors for {} sockets (baseline {baseline})",
        idle.len()
    );
    // And once the idle sockets close, new requests are answered at once.
    let opened = idle.len();
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(response) = quick.get(&url).send().await {
            assert_eq!(response.status(), 200);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never served after {opened} sockets closed"
        );
    }
    // The gateway let go of the descriptors it had taken.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_descriptors() > baseline + 8 {
        assert!(
            Instant::now() < deadline,
            "descriptors leaked: {} vs {baseline}",
            open_descriptors()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn oversized_bodies_are_413_with_or_without_a_length() {
    let rig = rig(|c| c.http.max_body_bytes = 1024).await;
    let big = format!(r#"{{"Name":"{}"}}"#, "x".repeat(4096));
    let (status, text) = raw(&rig, &post_raw("resources/value/get", "", big.as_bytes())).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("1024-byte limit"), "{text}");
    // Chunked, so the size is only known while reading.
    let mut chunked = b"POST /api/resources/value/get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..8 {
        chunked.extend_from_slice(format!("200\r\n{}\r\n", "y".repeat(0x200)).as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, text) = raw(&rig, &chunked).await;
    assert_eq!(status, 413, "{text}");
    // A declared length far over the limit is refused without waiting for the bytes.
    let (status, text) = raw(
        &rig,
        b"POST /api/resources/value/get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n{",
    )
    .await;
    assert_eq!(status, 413, "{text}");
}

#[tokio::test]
async fn a_body_in_pieces_is_read_whole() {
    // Chunked, the body comes as one piece a chunk: cut inside a name and inside the list.
    let rig = rig(|_| {}).await;
    let body =
        br#"{"Names": ["0.1.ESH10000158.MON_3V3", "0.1.ESH10000158.MON_3V3"], "MaxAgeMs": 0}"#;
    let mut chunked = b"POST /api/resources/values/get HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for piece in [&body[..5], &body[5..30], &body[30..31], &body[31..]] {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, text) = raw(&rig, &chunked).await;
    assert_eq!(status, 200, "{text}");
    let json: Json = serde_json::from_str(&text[text.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert!(
        json["resources"]["0.1.ESH10000158.MON_3V3"].is_string(),
        "{json}"
    );
}

#[tokio::test]
async fn deeply_nested_json_is_400_without_a_stack_overflow() {
    let rig = rig(|_| {}).await;
    for depth in [200, 10_000, 200_000] {
        for body in [
            "[".repeat(depth),
            format!(r#"{{"Name":{}}}"#, "[".repeat(depth)),
            format!(r#"{{"Resources":{}"#, r#"{"a":"#.repeat(depth)),
        ] {
            let (status, text) =
                raw(&rig, &post_raw("resources/values/set", "", body.as_bytes())).await;
            assert_eq!(status, 400, "depth {depth}: {text}");
        }
    }
    let (status, _) = rig.get("capabilities").await;
    assert_eq!(status, 200, "the gateway survived");
}

#[tokio::test]
async fn invalid_utf8_in_names_is_400() {
    let rig = rig(|_| {}).await;
    let bodies: [&[u8]; 4] = [
        b"{\"Name\":\"\xff\xfe\"}",
        b"{\"Names\":[\"0.1.ESH10000158.MON_3V3\",\"\xc3\x28\"]}",
        b"{\"Resources\":{\"\xed\xa0\x80\":\"1\"}}",
        b"{\"Na\xffme\":\"x\"}",
    ];
    for (i, body) in bodies.iter().enumerate() {
        for path in [
            "resources/value/get",
            "resources/values/get",
            "resources/values/set",
        ] {
            let (status, text) = raw(&rig, &post_raw(path, "", body)).await;
            assert!(status == 400, "body {i} on {path}: {status} {text}");
        }
    }
    // A lone surrogate escape is valid JSON but not a name the station has.
    let (status, body) = rig
        .post("resources/value/get", json!({ "Name": "\u{fffd}" }))
        .await;
    assert_eq!(status, 404, "{body}");
    // Non-UTF-8 in a path segment: no such subscription or lease, not a crash.
    for path in ["subscriptions/%FF%FE", "lease/%C3%28"] {
        let request =
            format!("DELETE /api/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let (status, text) = raw(&rig, request.as_bytes()).await;
        assert_eq!(status, 404, "{path}: {text}");
    }
}

#[tokio::test]
async fn a_ten_kilobyte_lease_id_gets_423_lease_ended() {
    let rig = rig(|_| {}).await;
    let huge = "L".repeat(10 * 1024);
    let write = json!({ "Name": VSET1, "Value": "1" });
    let response = rig
        .http
        .post(rig.url("resources/value/set"))
        .header("X-Lease-Id", &huge)
        .json(&write)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: Json = response.json().await.unwrap_or(Json::Null);
    // A lease id that is never the live one: "lease ended", whether or not anyone holds it.
    assert_eq!(status, 423, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    // With a lease held by someone else, the same: refused, and nothing was written.
    let (status, lease) = rig
        .post("lease", json!({ "Owner": "holder", "TtlMs": 30000 }))
        .await;
    assert_eq!(status, 200, "{lease}");
    let ids = [
        reqwest::header::HeaderValue::from_str(&huge).unwrap(),
        reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        reqwest::header::HeaderValue::from_static(" "),
    ];
    for id in ids {
        let response = rig
            .http
            .post(rig.url("resources/value/set"))
            .header("X-Lease-Id", id.clone())
            .json(&write)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 423, "{:.20?}", id);
    }
    for path in [format!("lease/{huge}"), format!("subscriptions/{huge}")] {
        let response = rig.http.delete(rig.url(&path)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 404);
    }
    assert!(rig.sim.write_log().is_empty());
}

#[tokio::test]
async fn the_openapi_document_is_served_and_lists_every_route() {
    let rig = rig(|_| {}).await;
    let response = rig
        .http
        .get(format!("{}/openapi.json", rig.gateway.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let doc: Json = response.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "capabilities",
        "connection/status",
        "resources/names",
        "resources/value/get",
        "resources/value/set",
        "resources/values/get",
        "resources/values/set",
        "resources/transact",
        "channels",
        "channels/channel",
        "modules",
        "modules/loaded",
        "modules/physical-system",
        "application/name",
        "application/identification",
        "application/status",
        "events",
        "subscriptions",
        "subscriptions/{id}",
        "lease",
        "lease/{leaseId}",
    ] {
        assert!(
            paths.contains_key(&format!("/api/{path}")),
            "{path} missing"
        );
    }
    for (path, methods) in [
        ("/v1/leases/{name}", ["get", "post", "put", "delete"]),
        ("/v1/semaphores/{name}", ["get", "post", "put", "delete"]),
    ] {
        for method in methods {
            assert!(
                doc["paths"][path][method].is_object(),
                "{method} {path} missing"
            );
        }
    }
}

/// README: errors are JSON `{"error": "...", "status": N}`: the body's `status` is the
/// answer's status, for every kind of refusal.
#[tokio::test]
async fn every_error_body_carries_its_own_status() {
    let rig = rig(|c| c.http.max_body_bytes = 1024).await;
    let cases: Vec<(u16, reqwest::Method, &str, Option<Json>)> = vec![
        (
            400,
            reqwest::Method::POST,
            "resources/value/get",
            Some(json!({ "Nme": MON_3V3 })),
        ),
        (
            404,
            reqwest::Method::POST,
            "resources/value/get",
            Some(json!({ "Name": "NOPE" })),
        ),
        (404, reqwest::Method::DELETE, "subscriptions/none", None),
        (
            409,
            reqwest::Method::POST,
            "lease",
            Some(json!({ "Owner": "other" })),
        ),
        (
            413,
            reqwest::Method::POST,
            "resources/value/get",
            Some(json!({ "Name": "x".repeat(4096) })),
        ),
        (
            423,
            reqwest::Method::POST,
            "resources/value/set",
            Some(json!({ "Name": VSET1, "Value": "1" })),
        ),
    ];
    for (expected, method, path, body) in cases {
        if expected == 409 {
            // From here on someone holds the control lease.
            let (status, lease) = rig
                .post("lease", json!({ "Owner": "holder", "TtlMs": 30000 }))
                .await;
            assert_eq!(status, 200, "{lease}");
        }
        let (status, answer) = rig.send(method.clone(), path, body).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert_eq!(
            answer["status"],
            json!(expected),
            "{method} {path}: {answer}"
        );
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{method} {path}: {answer}"
        );
    }
    // Outside api/ too: a named lease's refusal and an unknown route.
    let (status, answer) = rig
        .send(reqwest::Method::GET, "../v1/leases/bad name", None)
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["status"], json!(400), "{answer}");
    let (status, answer) = rig.send(reqwest::Method::GET, "no/such/route", None).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["status"], json!(404), "{answer}");
}
