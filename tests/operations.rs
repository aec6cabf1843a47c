//! Operations against the simulator: health and readiness, metrics, access control with API
//! keys and HTTP Basic, TLS, the status page in headless Chromium, and JSON logs.

mod common;

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

async fn get_text(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client.get(url).send().await.unwrap();
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

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
    let base = rig.gateway.base_url();
    let (status, body) = get_text(&rig.http, &format!("{base}/healthz")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = get_text(&rig.http, &format!("{base}/readyz")).await;
    assert_eq!(status, 200, "{body}");

    rig.sim.power_off().await.unwrap();
    let mut info = rig.gateway.link().watch_info();
    info.wait_for(|i| !i.connected).await.unwrap();
    let (status, body) = get_text(&rig.http, &format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{body}");
    let body: Json = serde_json::from_str(&body).unwrap();
    let message = body["error"].as_str().unwrap();
    assert!(
        message.starts_with("not ready: the station link is down: "),
        "{message}"
    );
    // Alive all the same.
    let (status, _) = get_text(&rig.http, &format!("{base}/healthz")).await;
    assert_eq!(status, 200);

    let generation = rig.gateway.link().info().generation;
    rig.sim.power_on().await.unwrap();
    rig.reconnected_after(generation).await;
    let (status, _) = get_text(&rig.http, &format!("{base}/readyz")).await;
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
    for name in [
        "station_gateway_http_requests_total",
        "station_gateway_http_request_duration_seconds",
        "station_gateway_link_requests_total",
        "station_gateway_link_request_duration_seconds_bucket",
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
            before.contains(&format!("# TYPE {name}")) || before.contains(name),
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

    let after = get_text(&rig.http, &url).await.1;
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
    assert!(series("station_gateway_cache_hits_total") >= 1.0);
    assert!(series("station_gateway_cache_misses_total") >= 1.0);
    assert!(
        series("station_gateway_link_requests_total")
            > metric(&before, "station_gateway_link_requests_total").unwrap()
    );
    assert!(series("station_gateway_link_request_duration_seconds_count") >= 2.0);
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
    let mut stream = rig.http.get(rig.url("events")).send().await.unwrap();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = seen.lines().find_map(|l| l.strip_prefix("data:")).unwrap();
    let hello: Json = serde_json::from_str(data.trim()).unwrap();
    let (status, body) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": hello["streamId"], "Channels": [MON_3V3], "IntervalMs": 1000 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text = get_text(&rig.http, &format!("{}/metrics", rig.gateway.base_url()))
        .await
        .1;
    assert_eq!(metric(&text, "station_gateway_event_streams"), Some(1.0));
    assert_eq!(metric(&text, "station_gateway_subscriptions"), Some(1.0));
}

fn access_config(config: &mut station_gateway::Config) {
    config.access.keys = vec![
        ApiKey {
            key: READ_KEY.into(),
            role: Role::Read,
        },
        ApiKey {
            key: CONTROL_KEY.into(),
            role: Role::Control,
        },
        ApiKey {
            key: ADMIN_KEY.into(),
            role: Role::Admin,
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
    let text = get_text(&rig.http, &format!("{}/metrics", rig.gateway.base_url())).await;
    assert_eq!(text.0, 401);
    let (_, _, _) = (read, write, ());
    let metrics = &rig.gateway.gateway.metrics;
    assert!(metrics.access_unauthenticated.get() >= 4);
    assert!(metrics.access_forbidden.get() >= 5);
}

#[tokio::test]
async fn api_keys_alone_send_no_basic_challenge() {
    let rig = rig(|c| {
        c.access.keys = vec![ApiKey {
            key: CONTROL_KEY.into(),
            role: Role::Control,
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
fn chromium() -> Result<String, String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_live_values_in_headless_chromium() {
    let chromium = chromium()
        .unwrap_or_else(|reason| panic!("the status page test needs headless Chromium: {reason}"));
    let rig = rig(|c| c.status_page.interval_ms = 200).await;
    let profile = std::env::temp_dir().join(format!("sg-chromium-{}", std::process::id()));
    std::fs::create_dir_all(&profile).unwrap();
    // `?snapshot`: the page closes its event stream after the first values; with the stream
    // open, Chromium's virtual time would never run out and --dump-dom would never come.
    let url = format!("{}/?snapshot", rig.gateway.base_url());
    let run = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=3000", "--dump-dom"])
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("chromium did not finish within 60 s")
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "chromium failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
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
        "PUT /api/lease/very-secret-lease-id HTTP/1.1\r\nHost: x\r\nX-Api-Key: not-a-real-key\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
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
