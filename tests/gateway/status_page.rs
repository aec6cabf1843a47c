//! The status page in a real headless Chromium, driven over the DevTools protocol (a minimal
//! WebSocket client below): trends that fill in real time while HV1 ramps, the set point on
//! its monitor's plot, the last configuration and the recent changes; a screenshot is kept
//! under `target/test-artifacts/status-page.png` for a person to look at.
//!
//! Real time, not `--virtual-time-budget`: virtual time stands still while the event stream
//! is open, which would put every sample of a trend at the same instant.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use common::*;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One WebSocket connection to Chromium's DevTools endpoint, text frames only.
pub(crate) struct DevTools {
    stream: TcpStream,
    next_id: u64,
}

impl DevTools {
    async fn connect(ws_url: &str) -> DevTools {
        let rest = ws_url.strip_prefix("ws://").expect("a ws:// URL");
        let (host, path) = rest.split_once('/').unwrap();
        let mut stream = TcpStream::connect(host).await.unwrap();
        let request = format!(
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(stream.read_u8().await.unwrap());
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "no WebSocket: {head}");
        DevTools { stream, next_id: 1 }
    }

    async fn send_text(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65_536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        // A client's frames are masked; a zero mask leaves the payload as it is.
        frame.extend_from_slice(&[0, 0, 0, 0]);
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame).await.unwrap();
    }

    async fn receive_text(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let first = self.stream.read_u8().await.unwrap();
            let second = self.stream.read_u8().await.unwrap();
            let len = match second & 0x7f {
                126 => u64::from(self.stream.read_u16().await.unwrap()),
                127 => self.stream.read_u64().await.unwrap(),
                n => u64::from(n),
            };
            let mut payload = vec![0; len as usize];
            self.stream.read_exact(&mut payload).await.unwrap();
            match first & 0x0f {
                0 | 1 => message.extend_from_slice(&payload),
                8 => panic!("Chromium closed the DevTools connection"),
                _ => continue, // ping, pong
            }
            if first & 0x80 != 0 {
                return String::from_utf8(message).unwrap();
            }
        }
    }

    /// One DevTools command (of a page's session when given); its result.
    pub(crate) async fn call(&mut self, session: Option<&str>, method: &str, params: Json) -> Json {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        self.send_text(&command.to_string()).await;
        loop {
            let message: Json = serde_json::from_str(&self.receive_text().await).unwrap();
            if message["id"] == json!(id) {
                assert!(message["error"].is_null(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    pub(crate) async fn evaluate(&mut self, session: &str, expression: &str) -> Json {
        let result = self
            .call(
                Some(session),
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        result["result"]["value"].clone()
    }

    /// The value of `expression` once the promise it makes has settled (a page's `fetch`).
    pub(crate) async fn evaluate_awaited(&mut self, session: &str, expression: &str) -> Json {
        let result = self
            .call(
                Some(session),
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// A new page (about:blank) of `width` x `height` pixels: its session.
    pub(crate) async fn new_page(&mut self, width: u32, height: u32) -> String {
        let target = self
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await["targetId"]
            .clone();
        let session = self
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        self.call(
            Some(&session),
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        session
    }
}

/// A headless Chromium driven over DevTools, in a profile of its own (removed when it is
/// dropped, the browser with it); fails with the reason when there is no Chromium (never a
/// silent pass).
pub(crate) struct Headless {
    browser: tokio::process::Child,
    pub(crate) devtools: DevTools,
    profile: std::path::PathBuf,
}

impl Headless {
    /// Starts Chromium with `extra` flags and connects to its DevTools endpoint.
    pub(crate) async fn start(extra: &[&str]) -> Headless {
        let chromium = crate::operations::chromium()
            .unwrap_or_else(|reason| panic!("this test needs headless Chromium: {reason}"));
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let profile = std::env::temp_dir().join(format!(
            "sg-cdp-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&profile);
        let mut browser = tokio::process::Command::new(chromium)
            .args(crate::operations::HEADLESS)
            .args(["--hide-scrollbars", "--remote-debugging-port=0"])
            .args(extra)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(browser.stderr.take().unwrap()).lines();
        let ws_url = within(
            Duration::from_secs(30),
            "Chromium's DevTools address",
            async {
                loop {
                    let line = stderr.next_line().await.unwrap().expect("Chromium exited");
                    if let Some(at) = line.find("ws://") {
                        return line[at..].trim().to_owned();
                    }
                }
            },
        )
        .await;
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
        let devtools = DevTools::connect(&ws_url).await;
        Headless {
            browser,
            devtools,
            profile,
        }
    }

    /// Closes the browser and waits (at most 10 s) for it to exit.
    pub(crate) async fn close(mut self) {
        let _ = self.devtools.call(None, "Browser.close", json!({})).await;
        let _ = within(
            Duration::from_secs(10),
            "Chromium to exit",
            self.browser.wait(),
        )
        .await;
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_plots_trends_and_recent_changes_in_headless_chromium() {
    let rig = rig(|c| {
        c.status_page.interval_ms = 200;
        // For the safe stop at the end: its second read back waits this long.
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        c.station.max_processing_ms = Some(30_000);
        // The value history records VMON1 before the page opens: its trend starts filled.
        c.history.channels = vec![VMON1.into()];
        c.history.interval_ms = 50;
    })
    .await;
    let mut headless = Headless::start(&[]).await;

    // HV1 ramps up under a lease (50 V/s) while the page watches; someone else is refused.
    let lease = rig.take_lease("bench 3 ramp test").await;
    for (name, value) in [(VSET1, "400"), (ON1, "True")] {
        let answer = rig
            .http
            .post(rig.url("resources/value/set"))
            .header("X-Lease-Id", &lease)
            .json(&json!({ "Name": name, "Value": value }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    let (status, _) = rig.write(VSET1, "2000").await;
    assert_eq!(status, 423);

    let devtools = &mut headless.devtools;
    let session = devtools.new_page(1400, 1100).await;
    let recorded = format!(
        "{}/v1/history?channel={VMON1}&from=-1m&fn=raw",
        rig.gateway.base_url()
    );
    within(Duration::from_secs(10), "VMON1 in the history", async {
        loop {
            let answer: Json = rig
                .http
                .get(&recorded)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if answer["points"].as_array().is_some_and(|p| p.len() >= 3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    devtools
        .call(
            Some(&session),
            "Page.navigate",
            json!({ "url": format!("{}/", rig.gateway.base_url()) }),
        )
        .await;
    // The trend of VMON1 fills as values arrive (every 200 ms): wait for 40 of them.
    let samples = format!(
        "Number(document.querySelector('polyline[data-channel=\"{VMON1}\"]')?.dataset.samples || 0)"
    );
    within(
        Duration::from_secs(60),
        "40 samples of VMON1 on its plot",
        async {
            loop {
                let n = devtools.evaluate(&session, &samples).await;
                if n.as_u64().unwrap_or(0) >= 40 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        },
    )
    .await;
    let dom = devtools
        .evaluate(&session, "document.documentElement.outerHTML")
        .await
        .as_str()
        .unwrap()
        .to_owned();
    let shot = devtools
        .call(
            Some(&session),
            "Page.captureScreenshot",
            json!({ "format": "png" }),
        )
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    // A safe stop: the safe state is written and read back right once; the page shows the
    // lease ending with its safe state waiting for the second read back.
    let stopped = rig
        .http
        .post(format!("{}/v1/safe-stop", rig.gateway.base_url()))
        .json(&json!({ "Reason": "status page test" }))
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 200);
    let shown = "document.getElementById('lease-state').textContent + ' | ' + \
                 document.getElementById('lease-safe-state').textContent";
    within(
        Duration::from_secs(10),
        "the safe state's read back on the status page",
        async {
            loop {
                let text = devtools.evaluate(&session, shown).await;
                let text = text.as_str().unwrap_or_default();
                if text.contains("read back right") {
                    assert!(
                        text.starts_with("safe state | after bench 3 ramp test's lease"),
                        "{text}"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    headless.close().await;
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let path = artifacts.join("status-page.png");
    std::fs::write(&path, &png).unwrap();
    println!("status page screenshot: {}", path.display());
    assert!(
        png.len() > 10_000,
        "a blank screenshot? {} bytes",
        png.len()
    );

    // The trend was filled from the history when the page opened.
    let from_history = plot_attribute(&dom, VMON1, "data-from-history");
    let state: String = dom
        .split("id=\"trend-state\"")
        .nth(1)
        .unwrap_or("")
        .chars()
        .take(120)
        .collect();
    assert!(
        from_history >= 1,
        "VMON1's trend took {from_history} points from the history: {state}"
    );
    // VMON1's plot carries VSET1 too, both with samples; VMON1 rose on the way to 400 V.
    let plot = dom
        .split("<div class=\"plot\"")
        .skip(1)
        .find(|card| card.contains(&format!("data-channel=\"{VMON1}\"")))
        .unwrap_or_else(|| panic!("no plot of {VMON1}:\n{dom}"));
    for series in [VSET1, VMON1] {
        assert!(
            plot.split("<polyline")
                .skip(1)
                .any(|l| l.contains(&format!("data-channel=\"{series}\""))),
            "no line of {series} on VMON1's plot:\n{plot}"
        );
    }
    assert!(
        dom.contains(&format!("data-channel=\"{MON_3V3}\"")),
        "{dom}"
    );
    assert!(dom.contains("id=\"last-config\">none<"), "{dom}");
    assert!(
        dom.contains("id=\"safe-stop\""),
        "no safe-stop button: {dom}"
    );
    // The recent changes: the holder's writes applied, with owner and fence; the refusal.
    let changes = dom
        .split("id=\"changes\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no changes table:\n{dom}"));
    assert!(changes.contains("bench 3 ramp test #1"), "{changes}");
    assert!(changes.contains("class=\"badge applied\""), "{changes}");
    assert!(changes.contains("class=\"badge refused\""), "{changes}");
    assert!(changes.contains("lease taken"), "{changes}");
    assert!(!dom.contains(&lease), "the lease id is on the page");
    // The safe stop ended the lease: nothing left to release.
}

/// A number attribute of the trend line of `channel` in the page's HTML.
fn plot_attribute(dom: &str, channel: &str, attribute: &str) -> u64 {
    dom.split("<polyline")
        .skip(1)
        .map(|line| line.split('>').next().unwrap_or(""))
        .find(|line| line.contains(&format!("data-channel=\"{channel}\"")))
        .and_then(|line| line.split(&format!("{attribute}=\"")).nth(1))
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
