//! A real headless Chromium driven over the DevTools protocol (a minimal WebSocket client), for
//! the tests of the status and lab pages that need real time and a real `EventSource`
//! (`--dump-dom` with a virtual time budget stands still while a stream is open). Without
//! Chromium the test fails saying so, never passes silently.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::within;

/// The flags every headless Chromium of the tests runs with.
pub const HEADLESS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
];

/// The Chromium binary; without one the test fails with this reason (never a silent pass: a
/// green run must mean the page was seen working).
pub fn chromium() -> String {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            std::process::Command::new(name)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect(
            "this test needs headless Chromium: none of chromium, chromium-browser, google-chrome runs here \
             (apt-get install chromium; bash tests/run-all.sh installs it when missing)",
        )
        .to_owned()
}

/// A headless Chromium with its DevTools connection, in a profile of its own.
pub struct Browser {
    pub devtools: DevTools,
    process: tokio::process::Child,
    profile: std::path::PathBuf,
}

impl Browser {
    /// Starts Chromium on `about:blank` in a fresh profile named after `name`.
    pub async fn launch(name: &str) -> Browser {
        Browser::launch_with(name, &[]).await
    }

    /// [`Browser::launch`] with `extra` flags (e.g. `--host-resolver-rules=...` to point a
    /// name at this machine, as a rebinding attack would).
    pub async fn launch_with(name: &str, extra: &[&str]) -> Browser {
        let profile = std::env::temp_dir().join(format!("sg-cdp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let mut process = tokio::process::Command::new(chromium())
            .args(HEADLESS)
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
        let mut stderr = BufReader::new(process.stderr.take().unwrap()).lines();
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
        Browser {
            devtools: DevTools::connect(&ws_url).await,
            process,
            profile,
        }
    }

    /// A new page of `width` × `height`; its session id.
    pub async fn new_page(&mut self, width: u32, height: u32) -> String {
        let target = self
            .devtools
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await["targetId"]
            .clone();
        let session = self
            .devtools
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        self.devtools
            .call(
                Some(&session),
                "Emulation.setDeviceMetricsOverride",
                json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
            )
            .await;
        session
    }

    pub async fn navigate(&mut self, session: &str, url: &str) {
        self.devtools
            .call(Some(session), "Page.navigate", json!({ "url": url }))
            .await;
    }

    /// Polls `expression` in the page every 50 ms until `done` accepts its value (returned);
    /// fails after `limit`, naming `what` and the last value seen.
    pub async fn until(
        &mut self,
        session: &str,
        limit: Duration,
        what: &str,
        expression: &str,
        done: impl Fn(&Json) -> bool,
    ) -> Json {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let value = self.devtools.evaluate(session, expression).await;
            if done(&value) {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "waited {limit:?} for {what}; last: {value}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Closes Chromium and removes its profile.
    pub async fn close(mut self) {
        let _ = self.devtools.call(None, "Browser.close", json!({})).await;
        let _ = within(
            Duration::from_secs(10),
            "Chromium to exit",
            self.process.wait(),
        )
        .await;
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One WebSocket connection to Chromium's DevTools endpoint, text frames only.
pub struct DevTools {
    stream: TcpStream,
    next_id: u64,
}

impl DevTools {
    pub async fn connect(ws_url: &str) -> DevTools {
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
    pub async fn call(&mut self, session: Option<&str>, method: &str, params: Json) -> Json {
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

    pub async fn evaluate(&mut self, session: &str, expression: &str) -> Json {
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
    pub async fn evaluate_awaited(&mut self, session: &str, expression: &str) -> Json {
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
}
