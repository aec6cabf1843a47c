//! What the gateway writes about its clients, and one credential rule: control characters a
//! client sends (a lease owner with a newline) are refused at the door and forge no log line in
//! either log format (the log escapes them too, for text that reaches it by another way),
//! lease ids never reach the access log on any path however it is spelled, and the admin
//! token breaks the lease whatever API key comes with it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Role};

/// The gateway binary with an embedded simulator, its stderr lines on a channel.
struct Binary {
    child: Child,
    lines: Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
    base: String,
}

impl Binary {
    fn start(format: &str) -> Binary {
        let mut child = Command::new(env!("CARGO_BIN_EXE_station-gateway"))
            .args([
                "--log-format",
                format,
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
        let mut binary = Binary {
            child,
            lines,
            seen: Vec::new(),
            base: String::new(),
        };
        let listening = binary.next("HTTP listening on http://");
        let addr = listening
            .rsplit("http://")
            .next()
            .unwrap()
            .trim_end_matches('"')
            .split(['"', ' '])
            .next()
            .unwrap()
            .to_owned();
        binary.base = format!("http://{addr}");
        binary
    }

    /// The next line containing `what`, within 30 s.
    fn next(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("no log line with {what:?} in time; seen: {:#?}", self.seen)
            });
            self.seen.push(line.clone());
            if line.contains(what) {
                return line;
            }
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ready(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = client.get(format!("{base}/readyz")).send().await
            && response.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "the binary never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn owner_with_a_newline_is_refused_and_forges_no_line(format: &str) {
    let mut binary = Binary::start(format);
    let client = reqwest::Client::new();
    ready(&client, &binary.base).await;
    // Refused at the door, naming the field: it takes no lease and reaches no log line.
    let refused = client
        .post(format!("{}/api/lease", binary.base))
        .json(&json!({ "Owner": "x\nINFO forged\r\u{1b}[2J", "TtlMs": 30000 }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400, "{format}");
    let answer: Json = refused.json().await.unwrap();
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("the field Owner holds the control character U+000A"),
        "{format}: {answer}"
    );
    // A lease taken and released after it: its lines come after everything the refusal wrote.
    let taken: Json = client
        .post(format!("{}/api/lease", binary.base))
        .json(&json!({ "Owner": "bench 3", "TtlMs": 30000 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = taken["leaseId"].as_str().unwrap().to_owned();
    let line = binary.next("control lease taken");
    assert!(line.contains("bench 3"), "{format}: {line}");
    client
        .delete(format!("{}/api/lease/{id}", binary.base))
        .send()
        .await
        .unwrap();
    binary.next("control lease released");
    let forged: Vec<&String> = binary
        .seen
        .iter()
        .filter(|l| {
            l.trim_start().starts_with("INFO forged")
                || l.contains('\u{1b}')
                || l.contains("forged")
        })
        .collect();
    assert!(
        forged.is_empty(),
        "{format}: forged lines {forged:#?} in {:#?}",
        binary.seen
    );
}

#[tokio::test]
async fn an_owner_with_a_newline_cannot_forge_a_human_log_line() {
    owner_with_a_newline_is_refused_and_forges_no_line("human").await;
}

#[tokio::test]
async fn an_owner_with_a_newline_cannot_forge_a_json_log_line() {
    owner_with_a_newline_is_refused_and_forges_no_line("json").await;
}

#[tokio::test]
async fn lease_ids_never_reach_the_access_log_however_the_path_is_spelled() {
    let mut binary = Binary::start("json");
    let client = reqwest::Client::new();
    ready(&client, &binary.base).await;
    let paths = [
        "/api/lease/SECRET-A",
        "/api/Lease/SECRET-B",
        "/API/LEASE/SECRET-C",
        "//api/lease/SECRET-D",
        "/api//lease/SECRET-E",
        "/api/lease//SECRET-F",
        "/api/leases/SECRET-G",
        "/api/lease/SECRET-H/extra",
        "/nope/lease/SECRET-I",
        "/api/le%61se/SECRET-J",
        "/api/lease?leaseId=SECRET-K",
        "/v1/leases/SECRET-L",
    ];
    for (n, path) in paths.iter().enumerate() {
        client
            .put(format!("{}{path}", binary.base))
            .header("X-Lease-Id", format!("SECRET-HEADER-{n}"))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
    }
    // One access line per request, in order; the last marks the end.
    client
        .get(format!("{}/healthz?done", binary.base))
        .send()
        .await
        .unwrap();
    binary.next("\"path\":\"/healthz\"");
    let access: Vec<&String> = binary
        .seen
        .iter()
        .filter(|l| l.contains("\"target\":\"access\""))
        .collect();
    let puts = access
        .iter()
        .filter(|l| l.contains("\"method\":\"PUT\""))
        .count();
    assert_eq!(puts, paths.len(), "{access:#?}");
    for line in &access {
        assert!(!line.contains("SECRET"), "{line}");
    }
    let logged: Vec<String> = access
        .iter()
        .map(|l| serde_json::from_str::<Json>(l).unwrap()["fields"]["path"].to_string())
        .collect();
    assert!(
        logged.contains(&"\"/api/Lease/{id}\"".to_owned()),
        "{logged:?}"
    );
    assert!(
        logged.contains(&"\"//api/lease/{id}\"".to_owned()),
        "{logged:?}"
    );
}

const CONTROL_KEY: &str = "control-key-0123456789";
const READ_KEY: &str = "read-key-0123456789";

#[tokio::test]
async fn the_admin_token_breaks_the_lease_whatever_key_comes_with_it() {
    let rig = rig(|config| {
        config.lease.admin_token = "let-me-in-please".into();
        // Taken again right after each break (the lock-delay has its own test).
        config.lease.lock_delay_ms = Some(0);
        config.access.keys = vec![
            ApiKey {
                key: CONTROL_KEY.into(),
                role: Role::Control,
                name: String::new(),
            },
            ApiKey {
                key: READ_KEY.into(),
                role: Role::Read,
                name: String::new(),
            },
        ];
    })
    .await;
    let base = rig.gateway.base_url();
    let take = || async {
        let answer = rig
            .http
            .post(format!("{base}/api/lease"))
            .header("X-Api-Key", CONTROL_KEY)
            .json(&json!({ "Owner": "TAT station 3" }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    };
    let break_with = |key: Option<&'static str>, token: &'static str| {
        let mut request = rig
            .http
            .delete(format!("{base}/api/lease"))
            .header("Authorization", format!("Bearer {token}"));
        if let Some(key) = key {
            request = request.header("X-Api-Key", key);
        }
        request.send()
    };
    for key in [
        Some(CONTROL_KEY),
        Some(READ_KEY),
        Some("not-a-key-0123456789"),
        None,
    ] {
        take().await;
        let answer = break_with(key, "let-me-in-please").await.unwrap();
        let status = answer.status().as_u16();
        let body: Json = answer.json().await.unwrap_or(Json::Null);
        assert_eq!(status, 200, "key {key:?}: {body}");
        assert_eq!(body["broken"]["owner"], json!("TAT station 3"), "{body}");
    }
    // A wrong token is no authority, with or without a key.
    take().await;
    assert_eq!(
        break_with(Some(CONTROL_KEY), "let-me-out")
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(break_with(None, "let-me-out").await.unwrap().status(), 401);
}
