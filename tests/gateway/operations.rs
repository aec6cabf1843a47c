//! Operations against the simulator: health and readiness, metrics, access control with API
//! keys and HTTP Basic, TLS, the status page in headless Chromium, and JSON logs.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Role, User};
use tokio::net::TcpListener;

const READ_KEY: &str = "read-key-0123456789";
const CONTROL_KEY: &str = "control-key-0123456789";
const ADMIN_KEY: &str = "admin-key-0123456789";

/// The value of one metric line `NAME{LABELS} VALUE` (labels exactly as written).
fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

#[tokio::test]
async fn healthz_is_alive_and_readyz_follows_the_station_link() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig.get_text("/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rig.get_text("/readyz").await;
    assert_eq!(status, 200, "{body}");

    rig.sim.power_off().await.unwrap();
    rig.disconnected().await;
    let (status, body) = rig.get_text("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let body: Json = serde_json::from_str(&body).unwrap();
    let message = body["error"].as_str().unwrap();
    assert!(
        message.starts_with("not ready: the station link is down: "),
        "{message}"
    );
    // Alive all the same.
    let (status, _) = rig.get_text("/healthz").await;
    assert_eq!(status, 200);

    let generation = rig.gateway.link().info().generation;
    rig.sim.power_on().await.unwrap();
    rig.reconnected_after(generation).await;
    let (status, _) = rig.get_text("/readyz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn metrics_name_every_series_and_count_requests() {
    let rig = rig(|_| {}).await;
    let url = format!("{}/metrics", rig.gateway.base_url());
    let response = rig.http.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let before = response.text().await.unwrap();
    // Every series README.md names, each with its TYPE line.
    for name in [
        "station_gateway_http_requests_total",
        "station_gateway_http_request_duration_seconds",
        "station_gateway_link_requests_total",
        "station_gateway_link_request_duration_seconds",
        "station_gateway_link_connected",
        "station_gateway_legacy_connections_total",
        "station_gateway_legacy_refused_total",
        "station_gateway_access_refused_total",
        "station_gateway_link_timeouts_total",
        "station_gateway_link_crc_errors_total",
        "station_gateway_link_reconnects_total",
        "station_gateway_link_queue_depth",
        "station_gateway_cache_hits_total",
        "station_gateway_cache_misses_total",
        "station_gateway_lease_held",
        "station_gateway_lease_transitions_total",
        "station_gateway_lease_refused_total",
        "station_gateway_event_streams",
        "station_gateway_subscriptions",
        "station_gateway_legacy_clients",
    ] {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{before}"
        );
    }
    for line in before.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("station_gateway_"), "{line}");
    }

    // Reads: a forced read (link), a cached read twice (a miss, then a hit).
    let (status, _) = rig.read(MON_3V3).await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        let (status, _) = rig
            .post(
                "resources/values/get",
                json!({ "Names": [VMON1], "MaxAgeMs": 60_000 }),
            )
            .await;
        assert_eq!(status, 200);
    }
    let (status, _) = rig
        .post("resources/value/get", json!({ "Name": "NOPE" }))
        .await;
    assert_eq!(status, 404);
    // The lease: taken, then someone else gets 409 and 423.
    let (status, taken) = rig
        .post("lease", json!({ "Owner": "metrics test", "TtlMs": 10_000 }))
        .await;
    assert_eq!(status, 200, "{taken}");
    let (status, _) = rig.post("lease", json!({ "Owner": "other" })).await;
    assert_eq!(status, 409);
    let (status, _) = rig.write(VSET1, "10").await;
    assert_eq!(status, 423);

    let after = rig.get_text("/metrics").await.1;
    let series = |name: &str| metric(&after, name).unwrap_or_else(|| panic!("{name}:\n{after}"));
    assert_eq!(
        series(
            "station_gateway_http_requests_total{route=\"POST api/resources/value/get\",status=\"200\"}"
        ),
        1.0
    );
    assert_eq!(
        series(
            "station_gateway_http_requests_total{route=\"POST api/resources/value/get\",status=\"404\"}"
        ),
        1.0
    );
    assert_eq!(
        series(
            "station_gateway_http_request_duration_seconds_count{route=\"POST api/resources/values/get\"}"
        ),
        2.0
    );
    assert_eq!(
        series("station_gateway_http_requests_total{route=\"GET /metrics\",status=\"200\"}"),
        1.0
    );
    // This test is the only reader: exact deltas. The forced read and the cached read's miss
    // each cost one READ; the second cached read was a hit.
    let delta = |name: &str| series(name) - metric(&before, name).unwrap();
    assert_eq!(delta("station_gateway_cache_hits_total"), 1.0);
    assert_eq!(delta("station_gateway_cache_misses_total"), 1.0);
    assert_eq!(delta("station_gateway_link_requests_total"), 2.0);
    assert_eq!(
        delta("station_gateway_link_request_duration_seconds_count"),
        2.0
    );
    assert_eq!(series("station_gateway_lease_held"), 1.0);
    assert_eq!(
        series("station_gateway_lease_transitions_total{kind=\"taken\"}"),
        1.0
    );
    assert_eq!(
        series("station_gateway_lease_refused_total{status=\"409\"}"),
        1.0
    );
    assert_eq!(
        series("station_gateway_lease_refused_total{status=\"423\"}"),
        1.0
    );
    assert_eq!(series("station_gateway_link_connected"), 1.0);
}

#[tokio::test]
async fn metrics_show_event_streams_and_subscriptions() {
    let rig = rig(|_| {}).await;
    let (_stream, hello) = Sse::open_hello(&rig).await.unwrap();
    let (status, body) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": hello["streamId"], "Channels": [MON_3V3], "IntervalMs": 1000 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text = rig.get_text("/metrics").await.1;
    assert_eq!(metric(&text, "station_gateway_event_streams"), Some(1.0));
    assert_eq!(metric(&text, "station_gateway_subscriptions"), Some(1.0));
}

fn access_config(config: &mut station_gateway::Config) {
    config.access.keys = vec![
        ApiKey {
            key: READ_KEY.into(),
            role: Role::Read,
            name: String::new(),
        },
        ApiKey {
            key: CONTROL_KEY.into(),
            role: Role::Control,
            name: String::new(),
        },
        ApiKey {
            key: ADMIN_KEY.into(),
            role: Role::Admin,
            name: String::new(),
        },
    ];
    config.access.users = vec![
        User {
            name: "viewer".into(),
            password: "viewer-pass".into(),
            role: Role::Read,
        },
        User {
            name: "ops".into(),
            password: "ops-pass".into(),
            role: Role::Admin,
        },
    ];
}

/// How a request authenticates.
#[derive(Clone, Copy, Debug)]
enum Cred {
    None,
    Key(&'static str),
    Basic(&'static str, &'static str),
}

async fn call(
    rig: &Rig,
    method: reqwest::Method,
    path: &str,
    body: Json,
    cred: Cred,
) -> (u16, reqwest::header::HeaderMap, Json) {
    let mut request = rig
        .http
        .request(method, format!("{}{path}", rig.gateway.base_url()));
    if !body.is_null() {
        request = request.json(&body);
    }
    request = match cred {
        Cred::None => request,
        Cred::Key(key) => request.header("X-Api-Key", key),
        Cred::Basic(user, pass) => request.basic_auth(user, Some(pass)),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Json::Null),
    )
}

#[tokio::test]
async fn access_control_answers_401_and_403_by_role_for_keys_and_basic() {
    let rig = rig(access_config).await;
    use reqwest::Method;
    let read = (
        Method::POST,
        "/api/resources/values/get",
        json!({ "Names": [MON_3V3], "MaxAgeMs": 1000 }),
    );
    let write = (
        Method::POST,
        "/api/resources/value/set",
        json!({ "Name": VSET1, "Value": "5" }),
    );

    // Nothing or wrong: 401, with the Basic challenge (users are configured).
    for cred in [
        Cred::None,
        Cred::Key("read-key-012345678X"),
        Cred::Basic("ops", "wrong"),
        Cred::Basic("nobody", "ops-pass"),
    ] {
        let (status, headers, body) =
            call(&rig, read.0.clone(), read.1, read.2.clone(), cred).await;
        assert_eq!(status, 401, "{cred:?}: {body}");
        assert_eq!(
            headers["www-authenticate"].to_str().unwrap(),
            "Basic realm=\"station-gateway\", charset=\"UTF-8\""
        );
        let message = body["error"].as_str().unwrap();
        assert!(message.contains("X-Api-Key"), "{message}");
        assert!(
            !message.contains("012345678X"),
            "the key sent is never echoed: {message}"
        );
    }

    // read: reads yes, writes 403.
    for cred in [Cred::Key(READ_KEY), Cred::Basic("viewer", "viewer-pass")] {
        let (status, _, body) = call(&rig, read.0.clone(), read.1, read.2.clone(), cred).await;
        assert_eq!(status, 200, "{cred:?}: {body}");
        let (status, headers, body) =
            call(&rig, write.0.clone(), write.1, write.2.clone(), cred).await;
        assert_eq!(status, 403, "{cred:?}: {body}");
        assert!(!headers.contains_key("www-authenticate"));
        assert!(
            body["error"].as_str().unwrap().contains("control"),
            "{body}"
        );
        let (status, _, _) = call(
            &rig,
            Method::POST,
            "/api/lease",
            json!({ "Owner": "x" }),
            cred,
        )
        .await;
        assert_eq!(status, 403);
        let (status, _, _) = call(&rig, Method::GET, "/api/lease", Json::Null, cred).await;
        assert_eq!(status, 200);
    }

    // control: writes and the lease, but not the break.
    let control = Cred::Key(CONTROL_KEY);
    let (status, _, body) = call(&rig, write.0.clone(), write.1, write.2.clone(), control).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, taken) = call(
        &rig,
        Method::POST,
        "/api/lease",
        json!({ "Owner": "tat 3", "TtlMs": 30_000 }),
        control,
    )
    .await;
    assert_eq!(status, 200, "{taken}");
    let (status, _, body) = call(&rig, Method::DELETE, "/api/lease", Json::Null, control).await;
    assert_eq!(status, 403, "{body}");

    // admin: the break, by key or by Basic user, without the lease's bearer token.
    let (status, _, body) = call(
        &rig,
        Method::DELETE,
        "/api/lease",
        Json::Null,
        Cred::Basic("ops", "ops-pass"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["broken"]["owner"], json!("tat 3"));
    let (status, _, body) = call(
        &rig,
        Method::DELETE,
        "/api/lease",
        Json::Null,
        Cred::Key(ADMIN_KEY),
    )
    .await;
    assert_eq!(status, 404, "nobody holds it now: {body}");

    // Named leases for lab scripts: reading who holds one needs read, taking one control.
    let (status, _, _) = call(
        &rig,
        Method::POST,
        "/v1/leases/bench-a",
        json!({ "ttlMs": 5000 }),
        Cred::None,
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, _) = call(
        &rig,
        Method::POST,
        "/v1/leases/bench-a",
        json!({ "ttlMs": 5000 }),
        Cred::Key(READ_KEY),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, body) = call(
        &rig,
        Method::POST,
        "/v1/leases/bench-a",
        json!({ "ttlMs": 5000 }),
        control,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        &rig,
        Method::GET,
        "/v1/leases/bench-a",
        Json::Null,
        Cred::Key(READ_KEY),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Always open: health and readiness. Metrics and the status page need read.
    for path in ["/healthz", "/readyz"] {
        let (status, _, _) = call(&rig, Method::GET, path, Json::Null, Cred::None).await;
        assert_eq!(status, 200, "{path}");
    }
    for path in ["/metrics", "/", "/status.json", "/api/events"] {
        let (status, _, _) = call(&rig, Method::GET, path, Json::Null, Cred::None).await;
        assert_eq!(status, 401, "{path}");
    }
    for path in ["/metrics", "/", "/status.json"] {
        let (status, _, _) = call(&rig, Method::GET, path, Json::Null, Cred::Key(READ_KEY)).await;
        assert_eq!(status, 200, "{path}");
    }
    let text = rig.get_text("/metrics").await;
    assert_eq!(text.0, 401);
    let (_, _, _) = (read, write, ());
    // Exactly the refusals above: 401 for the 4 bad credentials, the keyless v1 POST, the 4
    // paths and the last /metrics; 403 for the 2 read users' write and lease (4), the control
    // key's break and the read key's v1 POST.
    let metrics = &rig.gateway.gateway.metrics;
    assert_eq!(metrics.access_unauthenticated.get(), 10);
    assert_eq!(metrics.access_forbidden.get(), 6);
}

#[tokio::test]
async fn api_keys_alone_send_no_basic_challenge() {
    let rig = rig(|c| {
        c.access.keys = vec![ApiKey {
            key: CONTROL_KEY.into(),
            role: Role::Control,
            name: String::new(),
        }]
    })
    .await;
    let (status, headers, body) = call(
        &rig,
        reqwest::Method::GET,
        "/api/capabilities",
        Json::Null,
        Cred::None,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(!headers.contains_key("www-authenticate"));
    assert!(!body["error"].as_str().unwrap().contains("Basic"), "{body}");
    let (status, _, _) = call(
        &rig,
        reqwest::Method::GET,
        "/api/capabilities",
        Json::Null,
        Cred::Key(CONTROL_KEY),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn tls_round_trip_with_a_self_signed_certificate() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("sg-ops-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("gateway.crt"), dir.join("gateway.key"));
    std::fs::write(&cert_path, certified.cert.pem()).unwrap();
    std::fs::write(&key_path, certified.key_pair.serialize_pem()).unwrap();

    let sim = station_simulator::Simulator::start(
        station_simulator::Profile::default_station(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let config = config_for(&sim, |c| {
        c.http.tls.cert = cert_path.display().to_string();
        c.http.tls.key = key_path.display().to_string();
    });
    let gateway = start_gateway(config).await;
    assert!(gateway.base_url().starts_with("https://"));
    let port = gateway.http_addr.port();
    let trusted = reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(trusted)
        .resolve("localhost", gateway.http_addr)
        .build()
        .unwrap();
    let response = client
        .post(format!("https://localhost:{port}/api/resources/value/get"))
        .json(&json!({ "Name": MON_3V3 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Json = response.json().await.unwrap();
    let volts: f64 = body["value"].as_str().unwrap().parse().unwrap();
    assert!((volts - 3.3).abs() < 0.1, "{volts}");

    // Plain HTTP to the TLS port gets no answer; a client that does not trust the cert fails.
    let untrusting = reqwest::Client::builder()
        .use_rustls_tls()
        .resolve("localhost", gateway.http_addr)
        .build()
        .unwrap();
    assert!(
        untrusting
            .get(format!("https://localhost:{port}/healthz"))
            .send()
            .await
            .is_err()
    );
    gateway.stop().await;

    // A missing key file stops start-up with a message naming the key.
    let config = config_for(&sim, |c| {
        c.http.tls.cert = cert_path.display().to_string();
        c.http.tls.key = dir.join("missing.key").display().to_string();
    });
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = station_gateway::start(station_gateway::Listeners { http, legacy: None }, config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("http.tls.key"), "{error}");
    assert!(error.contains("missing.key"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Chromium binary; without one the status page test fails with this reason (never a
/// silent pass: a green run must mean the page was seen working).
pub(crate) fn chromium() -> Result<String, String> {
    const NAMES: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];
    NAMES
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "none of {} runs here: install Chromium (apt-get install chromium; \
                 bash tests/run-all.sh installs it when missing)",
                NAMES.join(", ")
            )
        })
}

/// The flags every headless Chromium of the tests runs with.
pub(crate) use crate::common::devtools::HEADLESS;

/// The DOM headless Chromium makes of `url` with `extra` flags (a virtual time budget, a
/// window size), in a profile of its own; fails with the reason when there is no Chromium,
/// when it fails, or when it takes over 60 s.
pub(crate) async fn dump_dom(url: &str, extra: &[&str]) -> String {
    let chromium =
        chromium().unwrap_or_else(|reason| panic!("this test needs headless Chromium: {reason}"));
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let profile = std::env::temp_dir().join(format!(
        "sg-chromium-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&profile).unwrap();
    let run = tokio::process::Command::new(chromium)
        .args(HEADLESS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("chromium did not finish within 60 s")
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_live_values_in_headless_chromium() {
    let rig = rig(|c| c.status_page.interval_ms = 200).await;
    // `?snapshot`: the page closes its event stream after the first values; with the stream
    // open, Chromium's virtual time would never run out and --dump-dom would never come.
    // 25 s: past the page's subscription renewal (20 s), which must not bring the stream
    // back after the snapshot closed it; at 1 280 px, where every table must fit its card.
    let dom = dump_dom(
        &format!("{}/?snapshot", rig.gateway.base_url()),
        &["--window-size=1280,900", "--virtual-time-budget=25000"],
    )
    .await;
    // The row for MON_3V3 got a live value from the event stream.
    let row = dom
        .split("<tr")
        .find(|row| row.contains(&format!("data-channel=\"{MON_3V3}\"")))
        .unwrap_or_else(|| panic!("no row for {MON_3V3}:\n{dom}"));
    assert!(row.contains("data-live=\"true\""), "no live value:\n{row}");
    let value: f64 = row
        .split("data-live=\"true\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or_else(|| panic!("no number in {row}"));
    assert!((value - 3.3).abs() < 0.1, "{value}");
    // No error banner after the snapshot, and every table fits its card.
    let badge = dom
        .split("id=\"values-state\"")
        .nth(1)
        .and_then(|rest| rest.split("</span>").next())
        .unwrap_or_else(|| panic!("no values badge:\n{dom}"));
    assert!(
        badge.contains(">snapshot"),
        "the values badge after 25 s: {badge}"
    );
    assert!(
        dom.contains("data-overflowing=\"\""),
        "a table wider than its card (or no layout report): {}",
        dom.split("data-overflowing=")
            .nth(1)
            .unwrap_or("none")
            .chars()
            .take(80)
            .collect::<String>()
    );
    assert!(
        dom.contains("no acquisitions yet"),
        "the empty numeric table says so"
    );
    // And what status.json gave: connected, the firmware, link statistics.
    assert!(dom.contains(">connected<"), "{dom}");
    let firmware = rig
        .gateway
        .link()
        .info()
        .hello
        .as_ref()
        .unwrap()
        .firmware
        .clone();
    assert!(dom.contains(&firmware), "{dom}");
    assert!(dom.contains("id=\"link-requests\">"), "{dom}");
}

#[test]
fn the_binary_logs_json_with_an_access_line_per_request() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_station-gateway"))
        .args([
            "--log-format",
            "json",
            "--simulator",
            "--http",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = |what: &str| -> Json {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no log line with {what} in time"));
            let parsed: Json = serde_json::from_str(&line)
                .unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
            if line.contains(what) {
                return parsed;
            }
        }
    };
    let listening = next("HTTP listening on http://");
    let message = listening["fields"]["message"].as_str().unwrap();
    let addr = message.rsplit("http://").next().unwrap().to_owned();
    assert_eq!(listening["level"], json!("INFO"));

    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    use std::io::{Read, Write};
    write!(
        stream,
        "PUT /api/lease/very-secret-lease-id HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: not-a-real-key\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");

    let access = next("\"target\":\"access\"");
    let fields = &access["fields"];
    assert_eq!(fields["method"], json!("PUT"));
    assert_eq!(fields["path"], json!("/api/lease/{id}"));
    assert_eq!(fields["status"], json!(404));
    assert!(fields["duration_ms"].as_f64().is_some(), "{access}");
    let text = access.to_string();
    assert!(!text.contains("very-secret-lease-id"), "{text}");
    assert!(!text.contains("not-a-real-key"), "{text}");

    let _ = child.kill();
    let _ = child.wait();
}

/// The metrics that count what went wrong or changed hands move with exactly the events that
/// should move them: link timeouts, CRC errors and reconnects; the lease released, expired
/// and broken.
#[tokio::test]
async fn metrics_count_timeouts_crc_errors_reconnects_and_every_lease_transition() {
    let rig = rig(|c| {
        c.station.request_timeout_ms = 300;
        c.lease.admin_token = "let-me-in".into();
    })
    .await;
    let series = |text: &str, name: &str| {
        metric(text, name).unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    let before = rig.get_text("/metrics").await.1;

    // A stalled station: the read times out, then the PING that checks the link; the link
    // reconnects once the station answers again.
    let generation = rig.gateway.link().info().generation;
    rig.sim.set_stall(true);
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 504, "{body}");
    rig.disconnected().await;
    rig.sim.set_stall(false);
    rig.reconnected_after(generation).await;
    // A corrupted reply: dropped by the codec and counted.
    let crc = || station_gateway::link::LinkStats::get(&rig.gateway.link().stats().crc_errors);
    rig.sim.corrupt_next_reply();
    let _ = rig.read(MON_3V3).await;
    until(
        Duration::from_secs(5),
        "the corrupt frame to be counted",
        || crc() == 1,
    )
    .await;
    rig.connected().await;

    // The lease: taken and released; taken and left to run out; taken and broken.
    let mut lease_events = rig.gateway.gateway.lease_events.subscribe();
    let (status, taken) = rig
        .post("lease", json!({ "Owner": "a", "TtlMs": 30_000 }))
        .await;
    assert_eq!(status, 200, "{taken}");
    let id = taken["leaseId"].as_str().unwrap();
    let (status, _) = rig
        .send(reqwest::Method::DELETE, &format!("lease/{id}"), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = rig
        .post("lease", json!({ "Owner": "b", "TtlMs": 1000 }))
        .await;
    assert_eq!(status, 200);
    loop {
        let view = within(
            Duration::from_secs(5),
            "b's lease to run out",
            lease_events.recv(),
        )
        .await
        .unwrap();
        if !view.held && lease_events.is_empty() {
            break;
        }
    }
    // After a lapse with every change answered the next lease is served at once.
    let (status, body) = rig
        .post("lease", json!({ "Owner": "c", "TtlMs": 30_000 }))
        .await;
    assert_eq!(status, 200, "{body}");
    let broken = rig
        .http
        .delete(rig.url("lease"))
        .header("Authorization", "Bearer let-me-in")
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 200);

    let after = rig.get_text("/metrics").await.1;
    let delta = |name: &str| series(&after, name) - series(&before, name);
    // Exact where this test is the only cause: the read's timeout and the PING's (the
    // corrupted reply's read may time out too, and then its PING is answered).
    let timeouts = delta("station_gateway_link_timeouts_total");
    assert!((2.0..=3.0).contains(&timeouts), "{timeouts} timeouts");
    assert_eq!(delta("station_gateway_link_reconnects_total"), 1.0);
    assert_eq!(delta("station_gateway_link_crc_errors_total"), 1.0);
    for (kind, count) in [
        ("taken", 3.0),
        ("released", 1.0),
        ("expired", 1.0),
        ("broken", 1.0),
    ] {
        assert_eq!(
            delta(&format!(
                "station_gateway_lease_transitions_total{{kind=\"{kind}\"}}"
            )),
            count,
            "{kind}"
        );
    }
    assert_eq!(series(&after, "station_gateway_lease_held"), 0.0);
}

/// One blocking HTTP/1.1 GET on a fresh connection: the status (0 if none came).
fn blocking_get(addr: &str, path: &str, headers: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// Runs the gateway binary with `args` and `rust_log`, makes the requests `drive` makes against
/// its address, stops it with SIGTERM and returns everything it logged.
fn run_binary_and_log(args: &[&str], rust_log: &str, drive: impl FnOnce(&str)) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_station-gateway"))
        .args([
            "--log-format",
            "json",
            "--simulator",
            "--http",
            "127.0.0.1:0",
        ])
        .args(args)
        .env("RUST_LOG", rust_log)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the gateway never said where it listens:\n{log}"));
        log.push_str(&line);
        log.push('\n');
        if let Some(addr) = line
            .split("HTTP listening on http://")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(str::to_owned)
        {
            break addr;
        }
    };
    // Ready: the station link is up.
    let deadline = Instant::now() + Duration::from_secs(30);
    while blocking_get(&addr, "/readyz", "") != 200 {
        assert!(Instant::now() < deadline, "never ready:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drive(&addr);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "no exit after SIGTERM:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap();
    log.extend(lines.try_iter().map(|line| line + "\n"));
    log
}

/// README: keys and passwords are never logged, and `RUST_LOG=info,access=off` drops the
/// access lines.
#[test]
fn basic_passwords_are_never_logged_and_access_off_drops_the_access_lines() {
    let dir = std::env::temp_dir().join(format!("sg-ops-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        "[access]\nusers = [{ name = \"ops\", password = \"right-horse-battery\", role = \"admin\" }]\n",
    )
    .unwrap();
    let config = config.display().to_string();
    // `ops:right-horse-battery` and `ops:wrong-staple-guess`, as Basic sends them.
    let right = "b3BzOnJpZ2h0LWhvcnNlLWJhdHRlcnk=";
    let wrong = "b3BzOndyb25nLXN0YXBsZS1ndWVzcw==";
    let drive = |addr: &str| {
        for (credentials, expected) in [(right, 200), (wrong, 401)] {
            let header = format!("Authorization: Basic {credentials}\r\n");
            let status = blocking_get(addr, "/api/capabilities", &header);
            assert_eq!(status, expected, "{credentials}");
        }
    };
    let secrets = ["right-horse-battery", "wrong-staple-guess", right, wrong];

    let with_access = run_binary_and_log(&["--config", &config], "debug", drive);
    let access_lines = with_access
        .lines()
        .filter(|l| l.contains("\"target\":\"access\"") && l.contains("/api/capabilities"))
        .count();
    assert_eq!(
        access_lines, 2,
        "one access line per request:\n{with_access}"
    );
    for secret in secrets {
        assert!(
            !with_access.contains(secret),
            "{secret} logged:\n{with_access}"
        );
    }

    let without = run_binary_and_log(&["--config", &config], "info,access=off", drive);
    assert!(
        !without.contains("\"target\":\"access\""),
        "access lines with access=off:\n{without}"
    );
    // The log kept flowing after the requests: the shutdown was logged.
    assert!(without.contains("shut"), "{without}");
    for secret in secrets {
        assert!(!without.contains(secret), "{secret} logged:\n{without}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request in flight when the gateway is told to stop gets a whole answer (here the link's
/// 503 saying the gateway is shutting down), not a cut connection; stop returns promptly;
/// then nothing is served.
#[tokio::test]
async fn a_request_in_flight_at_shutdown_gets_a_whole_answer() {
    let rig = rig(|c| c.station.request_timeout_ms = 10_000).await;
    rig.sim.set_reply_delay(Duration::from_secs(3));
    let stats = rig.gateway.link().stats().clone();
    let before = station_gateway::link::LinkStats::get(&stats.frames_sent);
    let in_flight = tokio::spawn({
        let http = rig.http.clone();
        let url = rig.url("resources/value/get");
        async move {
            let response = http
                .post(url)
                .json(&json!({ "Name": MON_3V3 }))
                .send()
                .await?;
            let status = response.status().as_u16();
            let body: Json = response.json().await?;
            reqwest::Result::Ok((status, body))
        }
    });
    until(Duration::from_secs(5), "the READ on the wire", || {
        station_gateway::link::LinkStats::get(&stats.frames_sent) > before
    })
    .await;
    let base = rig.gateway.base_url();
    let Rig { gateway, .. } = rig;
    within(
        Duration::from_secs(10),
        "the gateway to stop",
        gateway.stop(),
    )
    .await;
    let (status, body) = within(Duration::from_secs(5), "the answer", in_flight)
        .await
        .unwrap()
        .expect("the request in flight was cut off instead of answered");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("shutting down"),
        "{body}"
    );
    assert!(
        reqwest::get(format!("{base}/healthz")).await.is_err(),
        "served after stop"
    );
}

/// A batch write is checked whole before anything is sent: one value outside its
/// channel's limits (VSET2 3 000 V at most) is 400 naming it and its limits, and the station's
/// write log shows the other entry was not applied either. Before, the LED was written and the
/// answer was 400 all the same.
#[tokio::test]
async fn a_batch_write_with_one_value_out_of_range_sends_nothing() {
    let rig = rig(|_| {}).await;
    let led = "0.11.ESH10000355.A1";
    let vset2 = "0.4.ESH10000662.VSET2";
    rig.sim.clear_write_log();
    let (status, body) = rig
        .post(
            "resources/values/set",
            json!({ "Resources": { led: "Red", vset2: "999999", "0.4.ESH10000662.VSET3": "-1" } }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    for named in [
        vset2,
        "999999",
        "0.4.ESH10000662.VSET3",
        "-1",
        "0 to 3000 V",
        "nothing was sent",
    ] {
        assert!(message.contains(named), "{named} in {message}");
    }
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
    // Within its limits the same batch is written whole.
    let (status, body) = rig
        .post(
            "resources/values/set",
            json!({ "Resources": { led: "Red", vset2: "3000" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(rig.sim.write_log().len(), 2, "{:?}", rig.sim.write_log());
}
