//! The browser is a door too: a web page of another site (served from another port of
//! 127.0.0.1) that tries to change the station through a lab member's browser (HTML form posts,
//! `fetch` in `no-cors` mode with `text/plain`, a multipart upload) and a page whose name was
//! re-pointed at the gateway (DNS rebinding) change nothing, in a real headless Chromium, while
//! the gateway's own page and its safe-stop button keep working; the `Host` rule on raw HTTP/1.1
//! and HTTP/2, before any routing; changes refused by `Origin` and `Sec-Fetch-Site`; JSON
//! endpoints take JSON; CORS only for the origins `http.allowed_origins` lists.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::devtools::Browser;
use crate::common::*;

/// Serves `page` (HTML) at every path of a port of its own on 127.0.0.1, as another site
/// would; its origin (`http://127.0.0.1:PORT`).
async fn serve_page(page: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let page = Arc::new(page);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 2048];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    origin
}

/// The page of another site, given the gateway's address in its query (`?gateway=URL`): on
/// load it submits two `text/plain` forms shaped as JSON (a value and the safe stop) into
/// frames of its own, then sends `no-cors` fetches (a value as `text/plain`, a configuration
/// file as a multipart upload, the lease as `text/plain`), and sets its title to `done` once
/// every one has settled.
fn attacking_page() -> String {
    format!(
        r#"<!doctype html><html><head><title>loading</title></head><body>
<iframe name="value-frame"></iframe><iframe name="stop-frame"></iframe>
<form id="value-form" method="POST" enctype="text/plain" target="value-frame">
  <input name='{{"Name":"{VSET1}","Value":"111","Padding":"' value='"}}'>
</form>
<form id="stop-form" method="POST" enctype="text/plain" target="stop-frame">
  <input name='{{"Reason":"a page of another site' value='"}}'>
</form>
<script>
const gateway = new URLSearchParams(location.search).get("gateway");
document.getElementById("value-form").action = gateway + "/api/resources/value/set";
document.getElementById("stop-form").action = gateway + "/v1/safe-stop";
const loaded = (name) => new Promise((done) =>
  document.getElementsByName(name)[0].addEventListener("load", done, {{ once: true }}));
const send = (path, init) => fetch(gateway + path, {{ mode: "no-cors", method: "POST", ...init }})
  .then(() => "sent", (error) => "failed: " + error.message);
(async () => {{
  const valueFrame = loaded("value-frame");
  document.getElementById("value-form").submit();
  await valueFrame;
  const stopFrame = loaded("stop-frame");
  document.getElementById("stop-form").submit();
  await stopFrame;
  const sent = [];
  sent.push(await send("/api/resources/value/set", {{
    headers: {{ "Content-Type": "text/plain" }},
    body: JSON.stringify({{ Name: "{ON1}", Value: "True" }}),
  }}));
  const form = new FormData();
  form.append("file", new Blob(["format_version = 1\n"]), "planted.cfg");
  sent.push(await send("/api/application/config/upload", {{ body: form }}));
  sent.push(await send("/api/lease", {{
    headers: {{ "Content-Type": "text/plain" }},
    body: JSON.stringify({{ Owner: "a page of another site", TtlMs: 600000 }}),
  }}));
  document.title = "done: " + sent.join(", ");
}})();
</script></body></html>"#
    )
}

/// Polls `expression` in the page of `session` until it is a string starting with `prefix`
/// (at most `limit`); that string.
async fn page_says(
    headless: &mut Browser,
    session: &str,
    expression: &str,
    prefix: &str,
    limit: Duration,
) -> String {
    within(
        limit,
        &format!("{expression} to start with {prefix:?}"),
        async {
            loop {
                let value = headless.devtools.evaluate(session, expression).await;
                if let Some(text) = value.as_str()
                    && text.starts_with(prefix)
                {
                    return text.to_owned();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await
}

async fn navigate(headless: &mut Browser, session: &str, url: &str) {
    let answer = headless
        .devtools
        .call(Some(session), "Page.navigate", json!({ "url": url }))
        .await;
    assert!(
        answer["errorText"].is_null(),
        "navigating to {url}: {answer}"
    );
}

/// Every line of the audit trail (the rig keeps it in memory).
async fn audit_lines(rig: &Rig) -> Vec<String> {
    let (status, lines) = rig.get("audit/log?tail=0").await;
    assert_eq!(status, 200, "{lines}");
    lines
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .map(str::to_owned)
        .collect()
}

/// A lab member's browser opens a page of another site while nobody holds the lease (the
/// gateway with its defaults: no access control). The page's forms and `no-cors` fetches, and
/// a page whose name was re-pointed at the gateway's address (Chromium's host resolver rules
/// stand in for the DNS answer that changed after the page loaded), change nothing: the
/// simulator's write log stays empty (a safe stop would have written the safe state), the
/// lease stays free, no configuration file appears, and every refusal is in the audit trail.
/// The gateway's own status page, reached by its own name, still safe-stops the station.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_changes_nothing_and_the_gateways_own_page_still_can_in_headless_chromium()
 {
    let files = std::env::temp_dir().join(format!("sg-browser-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&files);
    let rig = rig(|c| {
        c.config_files.dir = files.clone();
        c.status_page.interval_ms = 200;
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
    })
    .await;
    rig.sim.clear_write_log();
    let gateway = rig.gateway.base_url();
    let port = rig.gateway.http_addr.port();
    let elsewhere = serve_page(attacking_page()).await;
    let mut headless = Browser::launch_with(
        "other-sites",
        &["--host-resolver-rules=MAP rebind.evil.example 127.0.0.1"],
    )
    .await;

    // 1. Another site's page: forms and no-cors fetches.
    let page = headless.new_page(1000, 800).await;
    navigate(
        &mut headless,
        &page,
        &format!("{elsewhere}/?gateway={gateway}"),
    )
    .await;
    let done = page_says(
        &mut headless,
        &page,
        "document.title",
        "done",
        Duration::from_secs(30),
    )
    .await;
    // 2. A rebound name: the page's origin is rebind.evil.example at the gateway's port, so
    // to the browser the gateway is its own origin.
    let rebound = headless.new_page(1000, 800).await;
    navigate(
        &mut headless,
        &rebound,
        &format!("http://rebind.evil.example:{port}/"),
    )
    .await;
    page_says(
        &mut headless,
        &rebound,
        "location.origin + ' ' + document.readyState",
        &format!("http://rebind.evil.example:{port} complete"),
        Duration::from_secs(10),
    )
    .await;
    let statuses = headless
        .devtools
        .evaluate_awaited(
            &rebound,
            &format!(
                r#"(async () => {{
  const post = (path, body) => fetch(path, {{
    method: "POST", headers: {{ "Content-Type": "application/json" }}, body: JSON.stringify(body),
  }}).then((answer) => answer.status, (error) => "failed: " + error.message);
  return [
    await post("/api/resources/value/set", {{ Name: "{VSET1}", Value: "333" }}),
    await post("/api/lease", {{ Owner: "a rebound page", TtlMs: 600000 }}),
  ];
}})()"#
            ),
        )
        .await;

    let writes = rig.sim.write_log();
    let (_, lease) = rig.get("lease").await;
    let (_, files_listed) = rig.get("application/config/list").await;
    assert!(
        writes.is_empty(),
        "the station took changes from other sites' pages ({done}; rebound page: {statuses}): {:?}",
        writes
            .iter()
            .map(|w| format!("{}={:?}", w.channel, w.value))
            .collect::<Vec<_>>()
    );
    assert_eq!(lease["held"], false, "{lease}");
    assert_eq!(files_listed, json!([]), "a planted configuration file");
    assert_eq!(statuses, json!([421, 421]), "the rebound page's requests");
    // Each attempt refused before its handler, in the audit trail as a refusal.
    let lines = audit_lines(&rig).await;
    for (request, refused) in [
        ("POST /api/resources/value/set 403 ", 2),
        ("POST /v1/safe-stop 403 ", 1),
        ("POST /api/application/config/upload 403 ", 1),
        ("POST /api/lease 403 ", 1),
    ] {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(request)).collect();
        assert_eq!(found.len(), refused, "{request}: {lines:#?}");
        assert!(
            found.iter().all(|l| l.contains("outcome=refused")),
            "{found:?}"
        );
    }

    // 3. The gateway's own page, by its own name: its safe-stop button ends the lease a
    // holder has and writes the safe state.
    let holder = rig.take_lease("bench operator").await;
    let own = headless.new_page(1400, 1100).await;
    navigate(&mut headless, &own, &format!("{gateway}/")).await;
    page_says(
        &mut headless,
        &own,
        "document.readyState",
        "complete",
        Duration::from_secs(10),
    )
    .await;
    headless
        .devtools
        .evaluate(
            &own,
            "window.prompt = () => 'browser test'; window.confirm = () => true; \
             document.getElementById('safe-stop').click(); 'pressed'",
        )
        .await;
    let result = page_says(
        &mut headless,
        &own,
        "document.getElementById('safe-stop-result').textContent",
        "safe-stopped",
        Duration::from_secs(15),
    )
    .await;
    assert!(result.contains("browser test"), "{result}");
    let (_, lease) = rig.get("lease").await;
    assert_eq!(lease["held"], false, "the holder {holder}'s lease: {lease}");
    let writes = rig.sim.write_log();
    assert!(
        writes.iter().any(|w| w.channel == ON1),
        "no safe state written: {:?}",
        writes.iter().map(|w| &w.channel).collect::<Vec<_>>()
    );
    headless.close().await;
    let _ = std::fs::remove_dir_all(&files);
}

/// One HTTP/1.1 request on a fresh connection: the status and the body of the answer.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    within(
        Duration::from_secs(10),
        "the answer",
        stream.read_to_end(&mut answer),
    )
    .await
    .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `METHOD path` with `Host: host`, `extra` header lines and a JSON body, closing after.
fn request(method: &str, path: &str, host: &str, extra: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

const TAKE: &str = r#"{"Owner": "a rebound page", "TtlMs": 60000}"#;

/// A request naming a host the gateway is not known by (what a page on a rebound name sends)
/// is refused with 421 before any routing, on every path: the REST API, a station's path, the
/// status page and its JSON, metrics, health, the lab's paths, the API description, a path that
/// does not exist. The answer says which setting to change, and the lease is not taken.
#[tokio::test]
async fn a_host_the_gateway_is_not_known_by_is_refused_421_on_every_path_before_routing() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    let foreign = format!("rebind.evil.example:{}", addr.port());
    let json = "Content-Type: application/json\r\n";
    for (method, path, body) in [
        ("POST", "/api/lease", TAKE),
        ("GET", "/api/capabilities", ""),
        ("GET", "/stations/any/api/capabilities", ""),
        ("GET", "/", ""),
        ("GET", "/status.json", ""),
        ("GET", "/metrics", ""),
        ("GET", "/healthz", ""),
        ("GET", "/v1/stations", ""),
        ("POST", "/v1/safe-stop", r#"{"Reason": "rebound"}"#),
        ("GET", "/openapi.json", ""),
        ("GET", "/no/such/path", ""),
        ("OPTIONS", "/api/lease", ""),
    ] {
        let (status, answer) = exchange(addr, &request(method, path, &foreign, json, body)).await;
        assert_eq!(status, 421, "{method} {path}: {answer}");
        assert!(
            answer.contains("http.allowed_hosts") && answer.contains("rebind.evil.example"),
            "{method} {path}: {answer}"
        );
    }
    let (_, lease) = rig.get("lease").await;
    assert_eq!(lease["held"], false, "{lease}");
    assert!(rig.sim.write_log().is_empty());
    // The same request by the gateway's own names and by any address is served.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned();
    for host in [
        format!("127.0.0.1:{}", addr.port()),
        format!("localhost:{}", addr.port()),
        "LocalHost".to_owned(),
        format!("{hostname}:{}", addr.port()),
        format!("[::1]:{}", addr.port()),
        "192.0.2.7".to_owned(),
    ] {
        let (status, answer) =
            exchange(addr, &request("GET", "/api/capabilities", &host, "", "")).await;
        assert_eq!(status, 200, "Host: {host}: {answer}");
    }
    // An absolute request target names its host too.
    let (status, answer) = exchange(
        addr,
        &request(
            "GET",
            &format!("http://{foreign}/api/capabilities"),
            &format!("127.0.0.1:{}", addr.port()),
            "",
            "",
        ),
    )
    .await;
    assert_eq!(status, 421, "{answer}");
}

/// On HTTP/2 the host is the request's `:authority` (no `Host` header): one the gateway is
/// not known by is refused with 421, and the lease is not taken; its own is served.
#[tokio::test]
async fn an_http2_authority_the_gateway_is_not_known_by_is_refused_421() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let send = |authority: String, method: &str, path: &str, body: &'static str| {
        let client = client.clone();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{authority}{path}"))
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        async move {
            let mut client = client.ready().await.unwrap();
            let (answer, mut stream) = client.send_request(request, body.is_empty()).unwrap();
            if !body.is_empty() {
                stream
                    .send_data(bytes::Bytes::from_static(body.as_bytes()), true)
                    .unwrap();
            }
            let answer = within(Duration::from_secs(10), "the HTTP/2 answer", answer)
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let mut body = answer.into_body();
            let mut text = Vec::new();
            while let Some(piece) = body.data().await {
                text.extend_from_slice(&piece.unwrap());
            }
            (status, String::from_utf8_lossy(&text).into_owned())
        }
    };
    let foreign = format!("rebind.evil.example:{}", addr.port());
    for (method, path, body) in [
        ("POST", "/api/lease", TAKE),
        ("GET", "/api/capabilities", ""),
        ("GET", "/metrics", ""),
    ] {
        let (status, answer) = send(foreign.clone(), method, path, body).await;
        assert_eq!(status, 421, "{method} {path}: {answer}");
        assert!(answer.contains("http.allowed_hosts"), "{answer}");
    }
    let (_, lease) = rig.get("lease").await;
    assert_eq!(lease["held"], false, "{lease}");
    let (status, answer) = send(addr.to_string(), "GET", "/api/capabilities", "").await;
    assert_eq!(status, 200, "{answer}");
}

/// `http.allowed_hosts` adds names (a subdomain pattern too); `["*"]` turns the check off for
/// a gateway behind a proxy that checks `Host` itself.
#[tokio::test]
async fn allowed_hosts_adds_names_and_a_star_turns_the_check_off() {
    let rig = rig(|c| {
        c.http.allowed_hosts = vec!["gw.lab.example".into(), "*.bench.example".into()];
    })
    .await;
    let addr = rig.gateway.http_addr;
    for (host, expected) in [
        ("gw.lab.example", 200),
        ("GW.Lab.Example.:5000", 200),
        ("hv3.bench.example", 200),
        ("bench.example", 421),
        ("evil.gw.lab.example", 421),
        ("localhost", 200),
    ] {
        let (status, answer) =
            exchange(addr, &request("GET", "/api/capabilities", host, "", "")).await;
        assert_eq!(status, expected, "Host: {host}: {answer}");
    }
    let open = super::common::rig(|c| c.http.allowed_hosts = vec!["*".into()]).await;
    let (status, answer) = exchange(
        open.gateway.http_addr,
        &request("GET", "/api/capabilities", "anything.example", "", ""),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

/// A change sent with an `Origin` other than the gateway's own, or marked
/// `Sec-Fetch-Site: cross-site`, is refused with 403 naming why and what to change, before its
/// handler; reads are not, nor requests that say neither (scripts, curl), nor a page of the
/// gateway's own origin.
#[tokio::test]
async fn a_change_from_another_origin_is_refused_403_and_reads_and_clients_are_not() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    let own = format!("127.0.0.1:{}", addr.port());
    let json = "Content-Type: application/json\r\n";
    let set = format!(r#"{{"Name": "{VSET1}", "Value": "12"}}"#);
    for extra in [
        "Origin: http://evil.example\r\n",
        "Origin: null\r\n",
        &format!("Origin: https://{own}\r\n"),
        &format!("Origin: http://127.0.0.1:{}\r\n", addr.port() + 1),
        "Sec-Fetch-Site: cross-site\r\n",
    ] {
        let headers = format!("{json}{extra}");
        for (path, body) in [
            ("/api/resources/value/set", set.as_str()),
            ("/api/lease", TAKE),
            ("/v1/safe-stop", r#"{"Reason": "x"}"#),
            ("/v1/leases/job-7", r#"{"ttlMs": 60000}"#),
        ] {
            let (status, answer) =
                exchange(addr, &request("POST", path, &own, &headers, body)).await;
            assert_eq!(status, 403, "{extra} {path}: {answer}");
            assert!(answer.contains("http.allowed_origins"), "{answer}");
        }
    }
    assert!(rig.sim.write_log().is_empty());
    // Reads from another origin are not changes.
    let read = format!(r#"{{"Names": ["{MON_3V3}"], "MaxAgeMs": 5000}}"#);
    let (status, answer) = exchange(
        addr,
        &request(
            "GET",
            "/api/capabilities",
            &own,
            "Origin: http://evil.example\r\n",
            "",
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = exchange(
        addr,
        &request(
            "POST",
            "/api/channels/channel",
            &own,
            &format!("{json}Origin: http://evil.example\r\n"),
            &format!(r#"{{"Alias": "{MON_3V3}"}}"#),
        ),
    )
    .await;
    assert_ne!(status, 403, "a channel's lookup changes nothing: {answer}");
    // The gateway's own pages, and clients that say nothing of where they come from.
    for extra in [
        format!("Origin: http://{own}\r\nSec-Fetch-Site: same-origin\r\n"),
        "Sec-Fetch-Site: same-site\r\n".to_owned(),
        String::new(),
    ] {
        let headers = format!("{json}{extra}");
        let (status, answer) = exchange(
            addr,
            &request("POST", "/api/resources/values/get", &own, &headers, &read),
        )
        .await;
        assert_eq!(status, 200, "{extra}: {answer}");
        let (status, answer) = exchange(
            addr,
            &request("POST", "/api/resources/value/set", &own, &headers, &set),
        )
        .await;
        assert_eq!(status, 200, "{extra}: {answer}");
    }
    // `localhost` without a port is the same origin as `localhost:80`.
    let (status, answer) = exchange(
        addr,
        &request(
            "POST",
            "/api/resources/value/set",
            "localhost:80",
            &format!("{json}Origin: http://localhost\r\n"),
            &set,
        ),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

/// JSON endpoints take JSON: a body sent as anything but `application/json` (parameters such
/// as a charset allowed) is 415 naming the type to send, before the lease or the handler; a
/// request without a body needs no type; the upload takes `multipart/form-data` only.
#[tokio::test]
async fn a_body_that_is_not_json_is_refused_415_on_json_endpoints() {
    let rig = rig(|_| {}).await;
    let addr = rig.gateway.http_addr;
    let own = format!("127.0.0.1:{}", addr.port());
    let set = format!(r#"{{"Name": "{VSET1}", "Value": "12"}}"#);
    for (path, body) in [
        ("/api/resources/value/set", set.as_str()),
        ("/api/resources/value/get", r#"{"Name": "x"}"#),
        ("/api/lease", TAKE),
        ("/api/channels/configure", "[]"),
        ("/v1/safe-stop", r#"{"Reason": "x"}"#),
        ("/v1/leases/job-7", r#"{"ttlMs": 60000}"#),
    ] {
        for content_type in [
            "Content-Type: text/plain\r\n",
            "Content-Type: application/x-www-form-urlencoded\r\n",
            "Content-Type: multipart/form-data; boundary=x\r\n",
            "",
        ] {
            let (status, answer) =
                exchange(addr, &request("POST", path, &own, content_type, body)).await;
            assert_eq!(status, 415, "{path} {content_type:?}: {answer}");
            assert!(answer.contains("application/json"), "{answer}");
        }
    }
    assert!(rig.sim.write_log().is_empty());
    let (_, lease) = rig.get("lease").await;
    assert_eq!(lease["held"], false, "{lease}");
    // JSON with parameters, in any case; a body-less request.
    for content_type in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/json ; charset=\"UTF-8\"",
    ] {
        let (status, answer) = exchange(
            addr,
            &request(
                "POST",
                "/api/resources/value/set",
                &own,
                &format!("Content-Type: {content_type}\r\n"),
                &set,
            ),
        )
        .await;
        assert_eq!(status, 200, "{content_type}: {answer}");
    }
    let (status, answer) = exchange(
        addr,
        &request("POST", "/api/application/reset", &own, "", ""),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = exchange(
        addr,
        &request(
            "POST",
            "/api/application/config/upload",
            &own,
            "Content-Type: application/json\r\n",
            "{}",
        ),
    )
    .await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer.contains("multipart/form-data"), "{answer}");
}

/// CORS is off unless `http.allowed_origins` lists an origin: a preflight from a listed origin
/// is answered with the methods and headers the API takes, its requests (changes too) carry
/// the matching `Access-Control-Allow-Origin`; any other origin's preflight is 403 without
/// it, and its changes are refused.
#[tokio::test]
async fn only_the_listed_origins_get_cors_with_a_preflight() {
    let dashboard = "http://dashboard.lab.example:8080";
    let rig = rig(|c| c.http.allowed_origins = vec![dashboard.into()]).await;
    let base = rig.gateway.base_url();
    let preflight = |origin: &str, method: &str, headers: &str| {
        rig.http
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/api/resources/value/set"),
            )
            .header("Origin", origin)
            .header("Access-Control-Request-Method", method)
            .header("Access-Control-Request-Headers", headers)
            .send()
    };
    let answer = preflight(dashboard, "POST", "content-type,x-lease-id")
        .await
        .unwrap();
    assert_eq!(answer.status(), 204);
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(header("access-control-allow-origin"), dashboard);
    assert_eq!(header("access-control-allow-credentials"), "true");
    for method in ["GET", "POST", "PUT", "DELETE"] {
        assert!(header("access-control-allow-methods").contains(method));
    }
    let allowed = header("access-control-allow-headers").to_ascii_lowercase();
    for name in [
        "x-lease-id",
        "x-api-key",
        "authorization",
        "content-type",
        "last-event-id",
    ] {
        assert!(allowed.contains(name), "{name}: {allowed}");
    }
    assert!(header("vary").to_ascii_lowercase().contains("origin"));
    // Another origin's preflight: refused, no CORS header.
    let refused = preflight("http://evil.example", "POST", "content-type")
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    let why: Json = refused.json().await.unwrap();
    assert!(
        why["error"]
            .as_str()
            .unwrap()
            .contains("http.allowed_origins"),
        "{why}"
    );
    // The dashboard's change goes through, with its CORS header; the other origin's does not.
    for (origin, expected) in [(dashboard, 200), ("http://evil.example", 403)] {
        let answer = rig
            .http
            .post(rig.url("resources/value/set"))
            .header("Origin", origin)
            .json(&json!({ "Name": VSET1, "Value": "7" }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), expected, "{origin}");
        let cors = answer.headers().get("access-control-allow-origin");
        assert_eq!(
            cors.map(|v| v.to_str().unwrap()),
            (expected == 200).then_some(dashboard),
            "{origin}"
        );
    }
    // Without a list, no origin gets CORS.
    let closed = super::common::rig(|_| {}).await;
    let answer = closed
        .http
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/api/lease", closed.gateway.base_url()),
        )
        .header("Origin", dashboard)
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    assert!(
        answer
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}
