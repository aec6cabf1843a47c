//! The audit trail against the simulator: change lines (caller, owner and fence, outcome) on
//! disk before the answer, lease events, the legacy port, `GET api/audit/log` and its role,
//! and a `kill -9` of the gateway process mid-burst that loses no answered write.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Role};
use station_protocol::Value;
use station_simulator::StationClient;

fn audit_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sg-audit-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The trail's two current files as one, in time order: the changes (`changes.log`) and the
/// other requests (`audit.log`).
fn file_lines(dir: &Path) -> Vec<String> {
    let read = |name: &str| -> Vec<String> {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let mut lines = read("audit.log");
    lines.extend(read("changes.log"));
    // A stable sort by the timestamp: each file's own order kept.
    lines.sort_by(|a, b| a.get(..23).cmp(&b.get(..23)));
    lines
}

/// POST with an optional lease id; status and JSON answer.
async fn post_as(rig: &Rig, lease: Option<&str>, path: &str, body: Json) -> (u16, Json) {
    let mut request = rig.http.post(rig.url(path)).json(&body);
    if let Some(lease) = lease {
        request = request.header("X-Lease-Id", lease);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

#[tokio::test]
async fn every_change_is_on_disk_before_its_answer_with_owner_fence_and_outcome() {
    let dir = audit_dir("changes");
    let rig = rig(|c| c.audit.dir = dir.to_string_lossy().into_owned()).await;
    let lease = rig.take_lease("bench 3 \"ramp\" test").await;
    let (status, answer) = post_as(
        &rig,
        Some(&lease),
        "resources/value/set",
        json!({ "Name": VSET1, "Value": "123.5" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Read straight from the file the moment the answer is here: the line is already there.
    let lines = file_lines(&dir);
    let write = lines
        .iter()
        .rfind(|l| l.contains("POST /api/resources/value/set 200 "))
        .unwrap_or_else(|| panic!("the answered write is not in the file yet: {lines:#?}"));
    assert!(
        write.contains(&format!(
            "caller=- owner=\"bench 3 \\\"ramp\\\" test\" fence=1 outcome=applied asked={VSET1}=123.5"
        )),
        "{write}"
    );
    assert!(write.starts_with("20"), "{write}");
    assert!(write.contains(" 127.0.0.1 POST "), "{write}");
    // The lease's own event, before its request's line.
    let taken = lines.iter().position(|l| l.contains(" LEASE taken "));
    let acquired = lines
        .iter()
        .position(|l| l.contains("POST /api/lease 200 "));
    assert!(
        taken.is_some() && taken < acquired,
        "taken then its request: {lines:#?}"
    );
    assert!(lines[acquired.unwrap()].contains("outcome=applied"));

    // Someone without the lease: refused (423), no lease named, nothing sent.
    let (status, _) = post_as(
        &rig,
        None,
        "resources/value/set",
        json!({ "Name": VSET1, "Value": "999" }),
    )
    .await;
    assert_eq!(status, 423);
    let lines = file_lines(&dir);
    let refused = lines.last().unwrap();
    assert!(
        refused.contains("POST /api/resources/value/set 423 "),
        "{refused}"
    );
    assert!(
        refused.ends_with(&format!(
            "caller=- owner=- fence=- outcome=refused asked={VSET1}=999"
        )),
        "{refused}"
    );
    // A list: the values it asked for.
    let (status, _) = post_as(
        &rig,
        Some(&lease),
        "resources/values/set",
        json!({ "Resources": { VSET1: 10, ON1: false } }),
    )
    .await;
    assert_eq!(status, 200);
    let list = file_lines(&dir).pop().unwrap();
    assert!(
        list.contains(&format!("{VSET1}=10")) && list.contains(&format!("{ON1}=False")),
        "{list}"
    );
    rig.release_lease(&lease).await;
    let lines = file_lines(&dir);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" LEASE released - - ") && l.contains("fence=1 outcome=applied")),
        "{lines:#?}"
    );
    // The release's path hides the lease id, and no line anywhere holds it.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("DELETE /api/lease/{id} 200 ")),
        "{lines:#?}"
    );
    assert!(lines.iter().all(|l| !l.contains(&lease)), "{lines:#?}");
    // Reads are in it too, as the clients document: the six fields only. (Counted in the
    // whole trail: the trail's times have milliseconds, and in the millisecond of the change
    // lines just written a request's line is merged before them, so it need not be last.)
    let lines_with = |whole: &Json, text: &str| -> Vec<String> {
        whole
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Json::as_str)
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    };
    let read = "POST /api/resources/value/get 200 ";
    let (_, before) = rig.get("audit/log?tail=0").await;
    let (status, _) = rig.read(VMON1).await;
    assert_eq!(status, 200);
    let (status, after) = rig.get("audit/log?tail=0").await;
    assert_eq!(status, 200);
    let (before, after) = (lines_with(&before, read), lines_with(&after, read));
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    assert!(after.iter().all(|l| !l.contains("outcome=")), "{after:?}");
    let (status, _) = rig.get("no/such/endpoint").await;
    assert_eq!(status, 404);
    let (_, whole) = rig.get("audit/log?tail=0").await;
    let not_found = lines_with(&whole, " GET /api/no/such/endpoint 404 ");
    assert_eq!(not_found.len(), 1, "{whole}");
    assert!(whole.as_array().unwrap().len() >= 8, "{whole}");
    let (status, bad) = rig.get("audit/log?tail=-3").await;
    assert_eq!(status, 400, "{bad}");
    // status.json shows the recent changes for the status page.
    let (_, status_json) = rig.get_text("/status.json").await;
    let status_json: Json = serde_json::from_str(&status_json).unwrap();
    let recent = status_json["audit"]["recentChanges"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|l| l.as_str().unwrap().contains("outcome=refused"))
    );
    assert_eq!(status_json["audit"]["onDisk"], true);
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn reading_needs_admin_and_callers_are_named_by_key_name() {
    let dir = audit_dir("roles");
    let key = |key: &str, role, name: &str| ApiKey {
        key: key.into(),
        role,
        name: name.into(),
    };
    let rig = rig(|c| {
        c.audit.dir = dir.to_string_lossy().into_owned();
        c.access.keys = vec![
            key("control-key-0123456789", Role::Control, "bench 3"),
            key("admin-key-0123456789", Role::Admin, ""),
        ];
    })
    .await;
    let get = |key: &'static str| {
        rig.http
            .get(rig.url("audit/log"))
            .header("X-Api-Key", key)
            .send()
    };
    assert_eq!(get("control-key-0123456789").await.unwrap().status(), 403);
    let write = rig
        .http
        .post(rig.url("resources/value/set"))
        .header("X-Api-Key", "control-key-0123456789")
        .json(&json!({ "Name": VSET1, "Value": "5" }))
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), 200);
    let answer = get("admin-key-0123456789").await.unwrap();
    assert_eq!(answer.status(), 200);
    let lines: Vec<String> = answer.json().await.unwrap();
    let write = lines
        .iter()
        .rfind(|l| l.contains("/api/resources/value/set 200"))
        .unwrap();
    assert!(
        write.contains("caller=\"bench 3\" owner=- fence=- outcome=applied"),
        "{write}"
    );
    // A change refused by access control is a refused change, its caller unknown.
    let forbidden = rig
        .http
        .post(rig.url("resources/value/set"))
        .json(&json!({ "Name": VSET1, "Value": "6" }))
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 401);
    let last = file_lines(&dir).pop().unwrap();
    assert!(
        last.contains(" 401 ") && last.contains("caller=- owner=- fence=- outcome=refused"),
        "{last}"
    );
    for line in file_lines(&dir) {
        assert!(
            !line.contains("key-0123456789"),
            "a key in the trail: {line}"
        );
    }
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn legacy_port_changes_are_in_the_trail() {
    let dir = audit_dir("legacy");
    let rig = legacy_rig(|c| c.audit.dir = dir.to_string_lossy().into_owned()).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.write_one(VSET1, Value::Float(42.0)).await.unwrap();
    let line = file_lines(&dir)
        .into_iter()
        .rfind(|l| l.contains(" LEGACY write "))
        .expect("the legacy write is in the trail");
    assert!(
        line.contains(&format!(
            "caller=legacy owner=- fence=- outcome=applied asked={VSET1}=42"
        )),
        "{line}"
    );
    // While someone holds the lease, a legacy write is refused, and says so in the trail.
    let lease = rig.take_lease("holder").await;
    assert!(client.write_one(VSET1, Value::Float(43.0)).await.is_err());
    let line = file_lines(&dir).pop().unwrap();
    assert!(
        line.contains(" LEGACY write - ") && line.contains("outcome=refused"),
        "{line}"
    );
    // A legacy bus transaction is a change too: refused while the lease is held, in the trail.
    let scan = station_protocol::Request::Bus(station_protocol::BusRequest {
        channel: "0.ESH10000023.I2C09".into(),
        action: station_protocol::BusAction::Scan,
        address: 0,
        retries: 0,
        receive: 0,
        data: Default::default(),
        line: None,
    });
    let refused = client.request(scan.clone()).await;
    assert!(format!("{refused:?}").contains("Locked"), "{refused:?}");
    let line = file_lines(&dir).pop().unwrap();
    assert!(
        line.contains(" LEGACY bus - ") && line.contains("outcome=refused"),
        "{line}"
    );
    rig.release_lease(&lease).await;
    // Once nobody holds it, the scan goes through and is in the trail as applied.
    let scanned = client.request(scan).await.unwrap();
    assert!(
        matches!(scanned, station_protocol::Response::Bus(_)),
        "{scanned:?}"
    );
    let line = file_lines(&dir)
        .into_iter()
        .rfind(|l| l.contains(" LEGACY bus "))
        .expect("the legacy bus transaction is in the trail");
    assert!(
        line.contains("outcome=applied") && line.contains("0.ESH10000023.I2C09"),
        "{line}"
    );
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write sent and then cut off by the link's drop: its outcome is unknown, and the trail
/// says so (never "applied", never "refused").
#[tokio::test]
async fn a_write_cut_off_after_it_was_sent_is_recorded_as_unknown() {
    use station_gateway::link::LinkStats;
    let dir = audit_dir("unknown");
    let rig = rig(|c| {
        c.audit.dir = dir.to_string_lossy().into_owned();
        c.station.request_timeout_ms = 5000;
    })
    .await;
    let stats = rig.gateway.link().stats().clone();
    let before = LinkStats::get(&stats.frames_sent);
    rig.sim.set_stall(true);
    let write = {
        let (http, url) = (rig.http.clone(), rig.url("resources/value/set"));
        tokio::spawn(async move {
            let body = json!({ "Name": VSET1, "Value": "77" });
            http.post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    until(Duration::from_secs(5), "the write to go out", || {
        LinkStats::get(&stats.frames_sent) > before
    })
    .await;
    rig.sim.drop_connections();
    assert_eq!(
        within(Duration::from_secs(10), "the answer", write)
            .await
            .unwrap(),
        502
    );
    let line = file_lines(&dir)
        .into_iter()
        .rfind(|l| l.contains("/api/resources/value/set 502 "))
        .expect("the cut-off write is in the trail");
    assert!(line.contains("outcome=unknown"), "{line}");
    rig.sim.set_stall(false);
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lease's own events: a break by an admin (with its address), an expiry and the safe
/// state after it, each named by owner and fence.
#[tokio::test]
async fn lease_breaks_expiries_and_safe_states_are_in_the_trail() {
    let dir = audit_dir("lease");
    let rig = rig(|c| {
        c.audit.dir = dir.to_string_lossy().into_owned();
        c.lease.admin_token = "admin-token-0123456789".into();
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: VSET1.into(),
            value: "0".into(),
        }];
        // The next lease right after the break (the lock-delay has its own test).
        c.lease.lock_delay_ms = Some(0);
    })
    .await;
    let broken_lease = rig.take_lease("to be broken").await;
    let broken = rig
        .http
        .delete(rig.url("lease"))
        .header("Authorization", "Bearer admin-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 200);
    let lines = file_lines(&dir);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" 127.0.0.1 LEASE broken - - ")
                && l.contains("owner=\"to be broken\" fence=1 outcome=applied")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("DELETE /api/lease 200 ") && l.contains("caller=\"admin token\"")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains(&broken_lease) && !l.contains("admin-token-0123"))
    );
    // A lease that runs out: expired, then the safe state.
    let (status, _) = rig
        .post("lease", json!({ "Owner": "runs out", "TtlMs": 1000 }))
        .await;
    assert_eq!(status, 200);
    until(
        Duration::from_secs(10),
        "the expiry and the safe state in the trail",
        || {
            file_lines(&dir)
                .iter()
                .any(|l| l.contains(" LEASE safe-state - - "))
        },
    )
    .await;
    let lines = file_lines(&dir);
    let expired = lines.iter().position(|l| {
        l.contains(" LEASE expired - - ") && l.contains("owner=\"runs out\" fence=2")
    });
    let safe = lines.iter().position(|l| {
        l.contains(" LEASE safe-state - - ") && l.contains("fence=2 outcome=applied")
    });
    assert!(expired.is_some() && expired < safe, "{lines:#?}");
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

// --- The crash test: a real gateway process, killed with SIGKILL mid-burst. ---

/// A binary of the workspace next to this test's, built if a narrower `cargo test` left it out.
fn workspace_bin(package: &str, name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", name])
            .status()
            .unwrap();
        assert!(status.success(), "cargo build {name}");
    }
    path
}

/// Reads lines of `child`'s stdout or stderr until one holds `marker`; the text after it.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, marker: &str, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("waited 30 s for {what}"));
        if let Some(at) = line.find(marker) {
            let rest = &line[at + marker.len()..];
            let end = rest.find(['"', ' ']).unwrap_or(rest.len());
            return rest[..end].to_owned();
        }
    }
}

fn line_reader(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

struct Gateway {
    child: Child,
    url: String,
}

/// A child process killed when the test ends, passed or failed.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway_process(config: &Path) -> Gateway {
    let mut child = Command::new(env!("CARGO_BIN_EXE_station-gateway"))
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_reader(child.stderr.take().unwrap());
    let addr = wait_for_line(&lines, "HTTP listening on http://", "the gateway to listen");
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || while lines.recv().is_ok() {});
    Gateway {
        child,
        url: format!("http://{addr}"),
    }
}

/// One line to the simulator's control port; its one-line answer.
fn sim_control(addr: &str, command: &str) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    writeln!(stream, "{command}").unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_9_mid_burst_loses_no_answered_write_and_the_station_agrees() {
    // A standalone station-sim with its control port (its write log outlives the gateway).
    let mut sim = Command::new(workspace_bin("station-simulator", "station-sim"))
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sim_lines = line_reader(sim.stdout.take().unwrap());
    let sim = Killed(sim);
    let station = wait_for_line(&sim_lines, "listening ", "the simulator to listen");
    let control = wait_for_line(&sim_lines, "control ", "the simulator's control port");
    let dir = audit_dir("crash");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    let audit = dir.join("audit");
    std::fs::write(
        &config,
        format!(
            "[station]\nurl = \"tcp://{station}\"\n[http]\nlisten = \"127.0.0.1:0\"\n[audit]\ndir = \"{}\"\n",
            audit.display()
        ),
    )
    .unwrap();
    let mut gateway = start_gateway_process(&config);
    let http = reqwest::Client::new();
    // Wait until the gateway reached the station.
    let ready = format!("{}/readyz", gateway.url);
    within(
        Duration::from_secs(30),
        "the gateway to reach the station",
        async {
            loop {
                if let Ok(r) = http.get(&ready).send().await
                    && r.status() == 200
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;

    // A burst: 8 writers, each writing VSET1 with values of its own, until the gateway dies.
    let answered = Arc::new(std::sync::Mutex::new(BTreeSet::<String>::new()));
    let dead = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..8 {
        let (http, url) = (
            http.clone(),
            format!("{}/api/resources/value/set", gateway.url),
        );
        let (answered, dead) = (answered.clone(), dead.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..10_000 {
                let value = format!("{}.{writer}", 100 + n);
                let result = http
                    .post(&url)
                    .json(&json!({ "Name": VSET1, "Value": value }))
                    .send()
                    .await;
                match result {
                    Ok(r) if r.status() == 200 => {
                        answered.lock().unwrap().insert(value);
                    }
                    Ok(r) => panic!("a write was answered {}", r.status()),
                    Err(_) => {
                        assert!(
                            dead.load(Ordering::SeqCst),
                            "a write failed while the gateway lived"
                        );
                        return;
                    }
                }
            }
        }));
    }
    until(Duration::from_secs(60), "200 answered writes", || {
        answered.lock().unwrap().len() >= 200
    })
    .await;
    dead.store(true, Ordering::SeqCst);
    gateway.child.kill().unwrap(); // SIGKILL
    gateway.child.wait().unwrap();
    for writer in writers {
        within(Duration::from_secs(30), "the writers to stop", writer)
            .await
            .unwrap();
    }
    let answered = answered.lock().unwrap().clone();

    // Restarted on the same files: the trail names every answered write as applied.
    let gateway = start_gateway_process(&config);
    let lines: Vec<String> = http
        .get(format!("{}/api/audit/log?tail=0", gateway.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut in_trail = BTreeSet::new();
    for line in &lines {
        if line.contains("POST /api/resources/value/set 200 ") {
            assert!(line.contains("outcome=applied"), "{line}");
            let asked = line.rsplit_once(&format!("asked={VSET1}=")).unwrap().1;
            in_trail.insert(asked.to_owned());
        }
    }
    let missing: Vec<&String> = answered.difference(&in_trail).collect();
    let tenths = |value: &str| -> String {
        let number: f64 = value.trim().trim_matches('"').parse().unwrap_or(f64::NAN);
        format!("{number:.1}")
    };
    assert!(
        missing.is_empty(),
        "answered but not in the trail: {missing:?}"
    );
    // The station's write log agrees: every write the trail calls applied was applied, and
    // the station applied nothing beyond those but the few in flight at the kill (sent, not
    // yet answered: at most one per writer).
    let log = sim_control(&control, "writes");
    let applied: BTreeSet<String> = log
        .split("; ")
        .filter_map(|w| w.rsplit_once(&format!("{VSET1}=")))
        .map(|(_, value)| tenths(value))
        .collect();
    let in_trail: BTreeSet<String> = in_trail.iter().map(|v| tenths(v)).collect();
    let not_applied: Vec<&String> = in_trail.difference(&applied).collect();
    assert!(
        not_applied.is_empty(),
        "in the trail, not at the station: {not_applied:?}"
    );
    let unrecorded: Vec<&String> = applied.difference(&in_trail).collect();
    assert!(
        unrecorded.len() <= 8,
        "applied at the station without a line: {unrecorded:?}"
    );
    println!(
        "kill -9 after {} answered writes: {} in the trail, {} applied at the station, {} in flight at the kill",
        answered.len(),
        in_trail.len(),
        applied.len(),
        unrecorded.len()
    );
    drop((gateway, sim));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn reads_never_rotate_a_change_out_of_the_trail() {
    let dir = audit_dir("apart");
    // The smallest rotation: two 4 KiB files hold about 110 lines of reads.
    let rig = rig(|c| {
        c.audit.dir = dir.to_string_lossy().into_owned();
        c.audit.file_bytes = 4096;
        c.audit.files = 2;
    })
    .await;
    let (status, answer) = rig.write(VSET1, "321.5").await;
    assert_eq!(status, 200, "{answer}");
    // Ten times what the request files hold.
    for _ in 0..1200 {
        assert_eq!(rig.read(VMON1).await.0, 200);
    }
    let (status, whole) = rig.get("audit/log?tail=0").await;
    assert_eq!(status, 200);
    let whole: Vec<String> = serde_json::from_value(whole).unwrap();
    let change = whole
        .iter()
        .position(|l| l.contains("POST /api/resources/value/set 200 ") && l.contains("VSET1=321.5"))
        .unwrap_or_else(|| panic!("the change was rotated out by reads: {} lines", whole.len()));
    // Reads after it are served too, in time order, as one trail.
    assert!(
        whole[change + 1..]
            .iter()
            .any(|l| l.contains("POST /api/resources/value/get 200 ")),
        "{whole:#?}"
    );
    let mut stamps: Vec<&str> = whole.iter().map(|l| &l[..23]).collect();
    let in_order = stamps.clone();
    stamps.sort();
    assert_eq!(stamps, in_order, "the trail is not in time order");
    // The status page still shows it.
    let (_, status_json) = rig.get_text("/status.json").await;
    let status_json: Json = serde_json::from_str(&status_json).unwrap();
    let recent = status_json["audit"]["recentChanges"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|l| l.as_str().unwrap().contains("VSET1=321.5")),
        "{recent:?}"
    );
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn refused_bus_and_numeric_changes_say_what_was_asked() {
    let dir = audit_dir("asked");
    let rig = rig(|c| c.audit.dir = dir.to_string_lossy().into_owned()).await;
    // Someone else holds the lease: both are refused with 423 before any change.
    let lease = rig.take_lease("somebody else").await;
    let bus = json!({
        "DeviceName": "0.ESH10000023.I2C09", "Address": "50", "Action": "Send",
        "DataToSend": "6401",
    });
    assert_eq!(rig.post("comm/i2c", bus).await.0, 423);
    let numeric = json!({
        "Channel": "0.8.ESH10000590.NumericResult", "Target": "0.8.ESH10000590.ADC01",
        "Samples": 50,
    });
    assert_eq!(rig.post("numeric-results/acquire", numeric).await.0, 423);
    let lines = file_lines(&dir);
    let line_of = |path: &str| {
        lines
            .iter()
            .rfind(|l| l.contains(path))
            .unwrap_or_else(|| panic!("no line of {path}: {lines:#?}"))
            .clone()
    };
    let bus = line_of("POST /api/comm/i2c 423 ");
    assert!(bus.contains("outcome=refused"), "{bus}");
    assert!(
        bus.contains(" asked=")
            && bus.contains("device=0.ESH10000023.I2C09")
            && bus.contains("action=Send")
            && bus.contains("address=50")
            && bus.contains("data=6401"),
        "{bus}"
    );
    let numeric = line_of("POST /api/numeric-results/acquire 423 ");
    assert!(
        numeric.contains("outcome=refused")
            && numeric.contains("channel=0.8.ESH10000590.NumericResult")
            && numeric.contains("target=0.8.ESH10000590.ADC01")
            && numeric.contains("samples=50"),
        "{numeric}"
    );
    rig.release_lease(&lease).await;
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lease is judged before a change's body, and a body refused for a field still says
/// what it asked, as sent: a non-holder's bad value is a 423, the holder's the body's 400, each
/// line naming the value sent. A cached read with bad names is the reader's 400, not the lease's
/// 423 (a bad field beside a good `MaxAgeMs` does not make it a forced read); a bad `MaxAgeMs`
/// asks for nothing cached.
#[tokio::test]
async fn refused_bodies_say_what_they_asked_as_sent_after_the_lease_is_judged() {
    let dir = audit_dir("bad-bodies");
    let rig = rig(|c| c.audit.dir = dir.to_string_lossy().into_owned()).await;
    let lease = rig.take_lease("somebody else").await;
    let bad = json!({ "Name": VSET1, "Value": [1] });
    let (status, answer) = post_as(&rig, None, "resources/value/set", bad.clone()).await;
    assert_eq!(status, 423, "{answer}");
    let bad_names = json!({ "Names": 5, "MaxAgeMs": 60000 });
    let (status, answer) = post_as(&rig, None, "resources/values/get", bad_names).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"],
        "the field Names must be an array of strings"
    );
    let bad_age = json!({ "Names": [VSET1], "MaxAgeMs": "60000" });
    let (status, answer) = post_as(&rig, None, "resources/values/get", bad_age).await;
    assert_eq!(status, 423, "{answer}");
    let (status, answer) = post_as(&rig, Some(&lease), "resources/value/set", bad).await;
    assert_eq!(status, 400, "{answer}");
    let lines = file_lines(&dir);
    let line_of = |status: u16| {
        let marker = format!("POST /api/resources/value/set {status} ");
        lines
            .iter()
            .rfind(|l| l.contains(&marker))
            .unwrap_or_else(|| panic!("no line of {marker}: {lines:#?}"))
            .clone()
    };
    let asked = format!(" asked={VSET1}=[1]");
    let locked = line_of(423);
    assert!(
        locked.contains("owner=- fence=- outcome=refused") && locked.ends_with(&asked),
        "{locked}"
    );
    let refused = line_of(400);
    assert!(refused.ends_with(&asked), "{refused}");
    rig.release_lease(&lease).await;
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn configuration_file_uploads_and_deletes_are_changes_with_caller_lease_and_outcome() {
    let dir = audit_dir("files");
    let files = audit_dir("files-store");
    let rig = rig(|c| {
        c.audit.dir = dir.to_string_lossy().into_owned();
        c.config_files.dir = files.clone();
        c.access.keys = vec![ApiKey {
            key: "k-control-0123456789".into(),
            role: Role::Control,
            name: "bench key".into(),
        }];
    })
    .await;
    let with_key =
        |request: reqwest::RequestBuilder| request.header("X-Api-Key", "k-control-0123456789");
    let lease: Json = with_key(
        rig.http
            .post(format!("{}/api/lease", rig.gateway.base_url())),
    )
    .json(&json!({ "Owner": "bench 3", "TtlMs": 30000 }))
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let lease = lease["leaseId"].as_str().unwrap().to_owned();
    // A file of the station's configuration: saved, then downloaded.
    let saved = with_key(rig.http.post(rig.url("application/config/save")))
        .header("X-Lease-Id", &lease)
        .json(&json!({ "FileName": "saved.cfg" }))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 200);
    let data = with_key(
        rig.http
            .get(rig.url("application/config/download/saved.cfg")),
    )
    .send()
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let boundary = "audit-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"copy.cfg\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let uploaded = with_key(rig.http.post(rig.url("application/config/upload")))
        .header("X-Lease-Id", &lease)
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), 200);
    // A delete is a change too: without the lease id while the lease is held, 423.
    let not_holder = with_key(rig.http.delete(rig.url("application/config/copy.cfg")))
        .send()
        .await
        .unwrap();
    assert_eq!(not_holder.status(), 423);
    let deleted = with_key(rig.http.delete(rig.url("application/config/copy.cfg")))
        .header("X-Lease-Id", &lease)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let missing = with_key(rig.http.delete(rig.url("application/config/none.cfg")))
        .header("X-Lease-Id", &lease)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // Requests that changed nothing are written within a batch window: wait for the last.
    let line_of = async |marker: &str| {
        within(Duration::from_secs(5), marker, async {
            loop {
                if let Some(line) = file_lines(&dir).into_iter().rfind(|l| l.contains(marker)) {
                    return line;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    };
    let upload = line_of("POST /api/application/config/upload 200 ").await;
    assert!(
        upload.contains(
            "caller=\"bench key\" owner=\"bench 3\" fence=1 outcome=applied asked=file=copy.cfg"
        ),
        "{upload}"
    );
    let delete = line_of("DELETE /api/application/config/copy.cfg 204 ").await;
    assert!(
        delete.contains(
            "caller=\"bench key\" owner=\"bench 3\" fence=1 outcome=applied asked=file=copy.cfg"
        ),
        "{delete}"
    );
    let locked = line_of("DELETE /api/application/config/copy.cfg 423 ").await;
    assert!(
        locked.contains("owner=- fence=- outcome=refused asked=file=copy.cfg"),
        "{locked}"
    );
    let refused = line_of("DELETE /api/application/config/none.cfg 404 ").await;
    assert!(
        refused.contains("outcome=refused asked=file=none.cfg"),
        "{refused}"
    );
    // Both are changes: kept apart from reads.
    let changes = std::fs::read_to_string(dir.join("changes.log")).unwrap();
    assert!(
        changes.contains("/api/application/config/upload 200 "),
        "{changes}"
    );
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&files);
}
