//! `station-lease hold` as a lab script runs it, against a simulator and a gateway started
//! here on 127.0.0.1:0, and directly on SQLite and PostgreSQL: the command's environment, its
//! changes going through with the lease while others get 423, the admin break ending the
//! command with exit 70 within one renewal interval, 75 after `--wait-ms`, the command's own
//! exit status, SIGINT reaching the command and the lease released afterwards.
//!
//! The binary belongs to the `station-lease` package, whose binaries `cargo test` of this crate
//! does not build: [`station_lease_bin`] builds it once per test run with the cargo running
//! the tests (quick when it is up to date) and takes its path from cargo's own answer.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value as Json, json};
use station_gateway::lease::{BackendUrl, Lease, LeaseStore, LeaseToken};
use tokio::process::{Child, Command};

use common::backends::Backend;
use common::{Rig, VSET1, rig, until, within};

const EXIT_LOST: i32 = 70;
const EXIT_NOT_HAD: i32 = 75;
/// How long a test waits for something that takes milliseconds.
const LIMIT: Duration = Duration::from_secs(20);

/// The `station-lease` binary, built for this test run.
fn station_lease_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| common::workspace_bin("station-lease", "station-lease"))
}

/// A directory of this test's own for the command's marker files.
struct Markers {
    dir: PathBuf,
}

impl Markers {
    fn new() -> Markers {
        let dir = std::env::temp_dir().join(format!(
            "station-lease-hold-{}",
            &LeaseToken::random().as_str()[..16]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Markers { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    async fn appears(&self, name: &str) {
        let path = self.path(name);
        until(LIMIT, &format!("the command to write {name}"), || {
            path.exists()
        })
        .await;
    }
}

impl Drop for Markers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A shell script for the command: `$M` is the markers' directory. `wait_for_go` is a
/// bounded poll for the file `go` (20 s), so that a test that fails never leaves it running.
fn script(body: &str) -> String {
    format!("M={{dir}}\n{MARK}\n{body}")
}

/// `mark NAME TEXT...` writes a marker whole (to a temporary file, then renamed), so that the
/// test never reads one half written.
const MARK: &str = r#"mark() { name=$1; shift; printf '%s\n' "$*" > "$M/$name.tmp" && mv "$M/$name.tmp" "$M/$name"; }"#;

const WAIT_FOR_GO: &str =
    "i=0; while [ ! -e \"$M/go\" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done";

/// Starts `station-lease ARGS -- sh -c SCRIPT` with stderr piped.
fn start(markers: &Markers, args: &[&str], body: &str) -> Child {
    let script = script(body).replace("{dir}", &markers.dir.display().to_string());
    Command::new(station_lease_bin())
        .args(args)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("station-lease starts")
}

/// Waits for `station-lease` to end: its exit status and what it said on stderr.
async fn ended(child: Child) -> (i32, String) {
    let output = within(LIMIT, "station-lease to end", child.wait_with_output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let code = output
        .status
        .code()
        .unwrap_or_else(|| panic!("station-lease ended by a signal: {stderr}"));
    (code, stderr)
}

fn hold_control(rig: &Rig, ttl_ms: u64) -> Vec<String> {
    [
        "hold",
        "--gateway",
        &rig.gateway.base_url(),
        "--owner",
        "lab script",
        "--ttl-ms",
        &ttl_ms.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `station-lease status ARGS`: what it printed (it must succeed).
async fn station_lease_status(args: &[&str]) -> String {
    let output = within(
        LIMIT,
        "station-lease status",
        Command::new(station_lease_bin())
            .arg("status")
            .args(args)
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

async fn control_lease(rig: &Rig) -> Json {
    let (status, body) = rig.get("lease").await;
    assert_eq!(status, 200);
    body
}

#[tokio::test]
async fn the_command_sees_the_lease_and_its_changes_go_through_while_others_get_423() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let args = hold_control(&rig, 3000);
    // The command writes through the gateway with its lease id, as a lab script would.
    let body = format!(
        r#"mark env "$(env | grep '^STATION_')"
command -v curl > /dev/null || {{ mark write "no curl on PATH: the command needs it"; exit 1; }}
code=$(curl -s -o /dev/null -w '%{{http_code}}' -X POST -H 'Content-Type: application/json' \
  -H "X-Lease-Id: $STATION_LEASE_ID" -d '{{"Name": "{VSET1}", "Value": "7"}}' \
  "$STATION_GATEWAY_URL/api/resources/value/set")
mark write "$code"
{WAIT_FOR_GO}
exit 0"#
    );
    let child = start(&markers, &strs(&args), &body);
    markers.appears("write").await;
    let env: std::collections::HashMap<String, String> = markers
        .read("env")
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    assert_eq!(markers.read("write").trim(), "200", "the holder's write");
    assert_eq!(env["STATION_GATEWAY_URL"], rig.gateway.base_url());
    assert_eq!(env["STATION_LEASE_ID"].len(), 32, "{env:?}");
    let fence: u64 = env["STATION_LEASE_FENCE"].parse().unwrap();
    let expires_ms: u64 = env["STATION_LEASE_EXPIRES_MS"].parse().unwrap();
    assert!((1..=3000).contains(&expires_ms), "{env:?}");
    let status = station_lease_status(&["--gateway", &rig.gateway.base_url()]).await;
    assert!(
        status.starts_with("the control lease: held by lab script for another "),
        "{status}"
    );
    let lease = control_lease(&rig).await;
    assert_eq!(
        (lease["held"].clone(), lease["owner"].clone()),
        (json!(true), json!("lab script"))
    );
    // Another client is refused meanwhile, naming the holder.
    let (status, refused) = rig.write(VSET1, "8").await;
    assert_eq!(status, 423, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("lab script"),
        "{refused}"
    );
    // The holder's id gets the fence it was given back on its answers.
    let response = rig
        .http
        .post(rig.url("resources/value/set"))
        .header("X-Lease-Id", &env["STATION_LEASE_ID"])
        .json(&json!({ "Name": VSET1, "Value": "9" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-lease-fence"],
        fence.to_string().as_str()
    );
    std::fs::write(markers.path("go"), "").unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 0, "{stderr}");
    // Released when the command ended: anyone may change the station again.
    assert_eq!(control_lease(&rig).await["held"], json!(false));
    assert_eq!(rig.write(VSET1, "10").await.0, 200);
}

#[tokio::test]
async fn an_admin_break_signals_the_command_within_one_renewal_interval_and_exits_70() {
    const ADMIN_TOKEN: &str = "break-it-0123456789";
    let rig = rig(|config| config.lease.admin_token = ADMIN_TOKEN.into()).await;
    let markers = Markers::new();
    // TTL 3000 ms: renewed every 1000 ms. Had the renewal's 404 been missed, the lease would
    // be found lost only when it ran out, 2 to 3 s after the break.
    let interval = Duration::from_millis(1000);
    let args = hold_control(&rig, 3000);
    let body = r#"trap 'mark term term; exit 0' TERM
mark up up
i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 3"#;
    let child = start(&markers, &strs(&args), body);
    markers.appears("up").await;
    let output = Command::new(station_lease_bin())
        .args(["break", "--gateway", &rig.gateway.base_url()])
        .args(["--admin-token", ADMIN_TOKEN])
        .output()
        .await
        .unwrap();
    let broke_at = Instant::now();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.starts_with("station-lease: broke the control lease held by lab script"),
        "{said}"
    );
    let (code, stderr) = ended(child).await;
    let took = broke_at.elapsed();
    assert_eq!(code, EXIT_LOST, "{stderr}");
    assert_eq!(
        markers.read("term").trim(),
        "term",
        "the command got SIGTERM"
    );
    assert!(
        stderr.contains("station-lease: the lease is lost"),
        "{stderr}"
    );
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    // Within one renewal interval (and the command's own moment to end on SIGTERM).
    assert!(
        took < interval + Duration::from_millis(600),
        "the command ended {took:?} after the break; the interval is {interval:?}"
    );
    eprintln!(
        "admin break → station-lease exited 70 after {took:?} (renewal interval {interval:?})"
    );
}

#[tokio::test]
async fn a_safe_stop_while_the_command_runs_ends_it_with_exit_70() {
    // A safe state to apply, so that the press is answered 200 once it is read back.
    let rig = rig(|c| {
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: common::VSET1.into(),
            value: "0".into(),
        }]
    })
    .await;
    let markers = Markers::new();
    let body = r#"trap 'mark term term; exit 0' TERM
mark up up
i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 3"#;
    let child = start(&markers, &strs(&hold_control(&rig, 3000)), body);
    markers.appears("up").await;
    let stopped = rig
        .http
        .post(format!("{}/v1/safe-stop", rig.gateway.base_url()))
        .json(&json!({ "Reason": "smoke in rack 2" }))
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 200);
    let stopped_at = Instant::now();
    let (code, stderr) = ended(child).await;
    let took = stopped_at.elapsed();
    assert_eq!(code, EXIT_LOST, "{stderr}");
    assert_eq!(markers.read("term").trim(), "term");
    // Told by the next renewal (every 1000 ms), not found out when the lease ran out (2 to 3 s).
    assert!(stderr.contains("renewal refused (404"), "{stderr}");
    assert!(
        took < Duration::from_millis(1000 + 600),
        "ended {took:?} after the safe stop"
    );
}

#[tokio::test]
async fn a_gateway_that_stops_answering_ends_the_command_when_the_lease_runs_out_not_before() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let body = r#"trap 'mark term term; exit 0' TERM
mark up up
i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 3"#;
    // TTL 1500 ms, renewed every 500 ms: when the gateway goes, the lease was confirmed at
    // most 500 ms earlier, so it lasts another 1000 to 1500 ms as station-lease counts it.
    let child = start(&markers, &strs(&hold_control(&rig, 1500)), body);
    markers.appears("up").await;
    let Rig { sim, gateway, .. } = rig;
    within(LIMIT, "the gateway to stop", gateway.stop()).await;
    let stopped_at = Instant::now();
    let (code, stderr) = ended(child).await;
    let took = stopped_at.elapsed();
    assert_eq!(code, EXIT_LOST, "{stderr}");
    assert_eq!(markers.read("term").trim(), "term");
    assert!(stderr.contains("station-lease: renewal failed"), "{stderr}");
    assert!(stderr.contains("ran out"), "{stderr}");
    assert!(
        (Duration::from_millis(900)..Duration::from_millis(1500 + 600)).contains(&took),
        "the command ended {took:?} after the gateway stopped: {stderr}"
    );
    drop(sim);
}

#[tokio::test]
async fn a_lease_that_runs_out_during_wait_ms_is_had_and_the_command_runs() {
    // The wait for the other's lease (3.5 s) is longer than the lease asked for lasts (3 s),
    // so the grant's answer vouches for no time left at all; station-lease renews before it
    // runs the command. (Counting the lease from the acquisition's ask, it once said "lost"
    // at once.)
    let rig = rig(|_| {}).await;
    // Another station takes it for 3.5 s and never renews it: it ends no sooner than that
    // after it was asked for, and frees at once (nothing of it in doubt).
    let asked_at = Instant::now();
    let (status, taken) = rig
        .post(
            "lease",
            json!({ "Owner": "the other station", "TtlMs": 3500 }),
        )
        .await;
    assert_eq!(status, 200, "{taken}");
    let markers = Markers::new();
    let mut args = hold_control(&rig, 3000);
    args.extend(["--wait-ms".to_owned(), "15000".to_owned()]);
    let child = start(&markers, &strs(&args), r#"mark ran ran"#);
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(markers.read("ran").trim(), "ran");
    let waited = asked_at.elapsed();
    assert!(
        waited >= Duration::from_millis(3500),
        "had it after {waited:?}, before the other ran out"
    );
    assert_eq!(control_lease(&rig).await["held"], json!(false));
}

#[tokio::test]
async fn a_ttl_the_gateway_refuses_is_bad_usage_with_its_reason() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let child = start(&markers, &strs(&hold_control(&rig, 500)), r#"mark ran ran"#);
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.starts_with("station-lease: "), "{stderr}");
    assert!(stderr.contains("TtlMs must be 1000 to 600000"), "{stderr}");
    assert!(!markers.path("ran").exists());
}

#[tokio::test]
async fn a_held_lease_is_75_after_wait_ms_and_the_command_never_runs() {
    let rig = rig(|_| {}).await;
    let id = rig.take_lease("the other station").await;
    let markers = Markers::new();
    let mut args = hold_control(&rig, 3000);
    args.extend(["--wait-ms".to_owned(), "300".to_owned()]);
    let started = Instant::now();
    let child = start(&markers, &strs(&args), r#"mark ran ran"#);
    let (code, stderr) = ended(child).await;
    let took = started.elapsed();
    assert_eq!(code, EXIT_NOT_HAD, "{stderr}");
    assert!(took >= Duration::from_millis(300), "gave up after {took:?}");
    assert!(stderr.starts_with("station-lease: "), "{stderr}");
    assert!(stderr.contains("the other station"), "{stderr}");
    assert!(
        !markers.path("ran").exists(),
        "the command ran without the lease"
    );
    rig.release_lease(&id).await;
}

#[tokio::test]
async fn the_commands_exit_status_passes_through_and_the_lease_is_released() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let child = start(&markers, &strs(&hold_control(&rig, 3000)), "exit 42");
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 42, "{stderr}");
    assert_eq!(stderr, "", "nothing to say when all went well");
    assert_eq!(control_lease(&rig).await["held"], json!(false));
}

#[tokio::test]
async fn sigint_reaches_the_command_and_the_lease_is_released() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let body = r#"trap 'mark int int; exit 5' INT
mark up up
i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 3"#;
    let child = start(&markers, &strs(&hold_control(&rig, 3000)), body);
    markers.appears("up").await;
    assert_eq!(control_lease(&rig).await["held"], json!(true));
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGINT).unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(
        code, 5,
        "the command's own status after its INT trap: {stderr}"
    );
    assert_eq!(markers.read("int").trim(), "int");
    assert_eq!(control_lease(&rig).await["held"], json!(false));
}

#[tokio::test]
async fn a_named_lease_through_the_gateway_is_held_for_the_command_and_refused_to_others() {
    let rig = rig(|_| {}).await;
    let markers = Markers::new();
    let base = rig.gateway.base_url();
    let args = [
        "hold",
        "--gateway",
        &base,
        "--name",
        "dataset-42",
        "--owner",
        "importer",
        "--ttl-ms",
        "1500",
    ];
    let body = format!(
        r#"mark env "$STATION_LEASE_ID $STATION_LEASE_FENCE"
{WAIT_FOR_GO}"#
    );
    let child = start(&markers, &args, &body);
    markers.appears("env").await;
    let env = markers.read("env");
    let (token, fence) = env.trim().split_once(' ').unwrap();
    let url = format!("{base}/v1/leases/dataset-42");
    let other = rig
        .http
        .post(&url)
        .json(&json!({ "ttlMs": 1000, "owner": "someone else" }))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 409);
    // Past the TTL it is still held: renewed every 500 ms.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let status: Json = rig
        .http
        .get(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["owner"], "importer");
    assert_eq!(status["fence"].to_string(), fence);
    let said = station_lease_status(&["--gateway", &base, "--name", "dataset-42"]).await;
    assert!(
        said.starts_with(&format!(
            "lease dataset-42: held by importer (fence {fence}) for another "
        )),
        "{said}"
    );
    // The command's token is the lease's own: it renews it.
    let renewed = rig
        .http
        .put(&url)
        .header("X-Lease-Token", token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), 200);
    std::fs::write(markers.path("go"), "").unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 0, "{stderr}");
    let status: Json = rig
        .http
        .get(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["held"], false);
}

#[tokio::test]
async fn a_semaphore_through_the_gateway_lets_two_commands_run_and_the_third_waits_out_75() {
    let rig = rig(|_| {}).await;
    let base = rig.gateway.base_url();
    let args = |owner: &'static str| {
        vec![
            "hold",
            "--gateway",
            &base,
            "--name",
            "ramp",
            "--slots",
            "2",
            "--owner",
            owner,
            "--ttl-ms",
            "3000",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let body = format!("mark up \"$STATION_LEASE_FENCE\"\n{WAIT_FOR_GO}");
    let (first, second) = (Markers::new(), Markers::new());
    let one = start(&first, &strs(&args("rig-1")), &body);
    let two = start(&second, &strs(&args("rig-2")), &body);
    first.appears("up").await;
    second.appears("up").await;
    assert_ne!(
        first.read("up"),
        second.read("up"),
        "each slot has a fence of its own"
    );
    let said = station_lease_status(&["--gateway", &base, "--name", "ramp", "--slots", "2"]).await;
    assert!(
        said.starts_with("semaphore ramp (2 slots): 2 holders"),
        "{said}"
    );
    let third = Markers::new();
    let mut waiting = args("rig-3");
    waiting.extend(["--wait-ms".to_owned(), "100".to_owned()]);
    let (code, stderr) = ended(start(&third, &strs(&waiting), "mark ran ran")).await;
    assert_eq!(code, EXIT_NOT_HAD, "{stderr}");
    assert!(!third.path("ran").exists());
    for markers in [&first, &second] {
        std::fs::write(markers.path("go"), "").unwrap();
    }
    for child in [one, two] {
        let (code, stderr) = ended(child).await;
        assert_eq!(code, 0, "{stderr}");
    }
    let said = station_lease_status(&["--gateway", &base, "--name", "ramp", "--slots", "2"]).await;
    assert!(
        said.starts_with("semaphore ramp (2 slots): 0 holders"),
        "{said}"
    );
}

#[tokio::test]
async fn a_command_that_ignores_the_on_lost_signal_is_killed_after_grace_ms() {
    let backend = Backend::named("sqlite").await;
    let name = format!("grace-{}", &LeaseToken::random().as_str()[..12]);
    let store = BackendUrl::parse(&backend.url)
        .unwrap()
        .open()
        .await
        .unwrap();
    let markers = Markers::new();
    let args = [
        "hold",
        "--backend",
        &backend.url,
        "--name",
        &name,
        "--owner",
        "stubborn",
        "--ttl-ms",
        "1500",
        "--grace-ms",
        "300",
    ];
    let body = format!(
        r#"trap '' TERM
mark env "$STATION_LEASE_ID"
{WAIT_FOR_GO}"#
    );
    let child = start(&markers, &args, &body);
    markers.appears("env").await;
    let token = LeaseToken::from_text(markers.read("env").trim());
    assert!(
        store
            .release(&format!("lease:{name}"), &token)
            .await
            .unwrap()
    );
    let released_at = Instant::now();
    let (code, stderr) = ended(child).await;
    let took = released_at.elapsed();
    assert_eq!(code, EXIT_LOST, "{stderr}");
    assert!(stderr.contains("killing it (SIGKILL)"), "{stderr}");
    assert!(stderr.contains("was ended by signal 9"), "{stderr}");
    // The next renewal (within 500 ms) finds it gone; SIGKILL 300 ms after the SIGTERM.
    assert!(
        (Duration::from_millis(300)..Duration::from_millis(500 + 300 + 600)).contains(&took),
        "killed {took:?} after the lease ended"
    );
}

/// The same on a backend directly: the lease held for the command and refused to others, the
/// command's exit status, 75 when held, and 70 when the lease is ended under the command.
async fn directly_on(kind: &str) {
    let backend = Backend::named(kind).await;
    let name = format!("hold-{}", &LeaseToken::random().as_str()[..12]);
    let store = BackendUrl::parse(&backend.url)
        .unwrap()
        .open()
        .await
        .unwrap();
    let args = |ttl_ms: &'static str| {
        vec![
            "hold".to_owned(),
            "--backend".to_owned(),
            backend.url.clone(),
            "--name".to_owned(),
            name.clone(),
            "--owner".to_owned(),
            "lab script".to_owned(),
            "--ttl-ms".to_owned(),
            ttl_ms.to_owned(),
        ]
    };
    let markers = Markers::new();
    let body = format!(
        r#"trap 'mark term term; exit 0' TERM
mark env "$STATION_LEASE_ID $STATION_LEASE_FENCE"
{WAIT_FOR_GO}
exit 42"#
    );
    let child = start(&markers, &strs(&args("1500")), &body);
    markers.appears("env").await;
    let env = markers.read("env");
    let (token, fence) = env.trim().split_once(' ').unwrap();
    let other = Lease::exclusive(
        store.clone(),
        format!("lease:{name}"),
        Duration::from_secs(1),
    );
    match other.try_acquire().await.unwrap() {
        Err(holder) => {
            assert_eq!(holder.owner, "lab script");
            assert_eq!(holder.fence.to_string(), fence);
        }
        Ok(_) => panic!("{kind}: another client got the lease the command holds"),
    }
    // Held past its TTL: renewed every 500 ms.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let holders = store
        .current(&format!("lease:{name}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holders.token.as_str(), token);
    let said = station_lease_status(&["--backend", &backend.url, "--name", &name]).await;
    assert!(
        said.starts_with(&format!(
            "lease {name}: held by lab script (fence {fence}) for another "
        )),
        "{kind}: {said}"
    );
    // While it is held, another hold waits out --wait-ms and exits 75.
    let mut waiting = strs(&args("900"))
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    waiting.extend(["--wait-ms".to_owned(), "200".to_owned()]);
    let second = Markers::new();
    let (code, stderr) = ended(start(&second, &strs(&waiting), r#"mark ran ran"#)).await;
    assert_eq!(code, EXIT_NOT_HAD, "{kind}: {stderr}");
    assert!(stderr.contains("lab script"), "{stderr}");
    assert!(!second.path("ran").exists());
    std::fs::write(markers.path("go"), "").unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 42, "{kind}: {stderr}");
    assert!(
        store
            .current(&format!("lease:{name}"))
            .await
            .unwrap()
            .is_none(),
        "released"
    );

    // Ended under the command (released with its token elsewhere): SIGTERM, then 70.
    let lost = Markers::new();
    // TTL 3000 ms, renewed every 1000 ms: had the renewal's answer been missed, the lease would
    // be found lost only when it ran out, 2 to 3 s after the release.
    let child = start(&lost, &strs(&args("3000")), &body);
    lost.appears("env").await;
    let env = lost.read("env");
    let (token, _) = env.trim().split_once(' ').unwrap();
    let ended_at = Instant::now();
    assert!(
        store
            .release(&format!("lease:{name}"), &LeaseToken::from_text(token))
            .await
            .unwrap()
    );
    let (code, stderr) = ended(child).await;
    assert_eq!(code, EXIT_LOST, "{kind}: {stderr}");
    assert_eq!(lost.read("term").trim(), "term");
    assert!(
        ended_at.elapsed() < Duration::from_millis(1000 + 600),
        "{:?}",
        ended_at.elapsed()
    );
    // Nobody else was kept out meanwhile.
    let after = Lease::exclusive(store, format!("lease:{name}"), Duration::from_secs(1));
    assert!(after.try_acquire().await.unwrap().is_ok());
    after.release().await.unwrap();
}

#[tokio::test]
async fn directly_on_sqlite() {
    directly_on("sqlite").await;
}

#[tokio::test]
async fn directly_on_postgres() {
    directly_on("postgres").await;
}

#[tokio::test]
async fn directly_on_redis() {
    directly_on("redis").await;
}

/// Whether process `pid` is still running: it exists and is not a zombie (a process ended but
/// not yet reaped by its parent, or by init, which in a container may never reap it).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses, the state follows the last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// Whether process `pid` is stopped (by a signal, state `T`).
fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            == Some('T')
    })
}

/// A process the command started in the background, SIGKILLed when the test ends so that a
/// failing test leaves nothing running.
struct Leftover(i32);

impl Leftover {
    fn of(markers: &Markers, name: &str) -> Leftover {
        let pid = markers.read(name).trim().parse().unwrap_or_else(|_| {
            panic!("{name} holds a pid: {:?}", markers.read(name));
        });
        Leftover(pid)
    }
}

impl Drop for Leftover {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// `station-lease hold` on a fresh SQLite lease (no gateway needed): its arguments, the store,
/// and the lease's key there.
async fn on_sqlite(
    backend: &Backend,
    extra: &[&str],
) -> (Vec<String>, std::sync::Arc<dyn LeaseStore>, String) {
    let name = format!("group-{}", &LeaseToken::random().as_str()[..12]);
    let store = BackendUrl::parse(&backend.url)
        .unwrap()
        .open()
        .await
        .unwrap();
    let mut args = [
        "hold",
        "--backend",
        &backend.url,
        "--name",
        &name,
        "--owner",
        "lab script",
        "--ttl-ms",
        "1500",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    (args, store, format!("lease:{name}"))
}

/// A background job of the command: `sleep 1000`, its pid in the marker `job`. Its output
/// goes to /dev/null: one that outlived station-lease would otherwise hold its stderr's pipe
/// open and the test would wait for that rather than fail on the job.
const BACKGROUND_JOB: &str = r#"sleep 1000 > /dev/null 2>&1 &
mark job $!"#;

#[tokio::test]
async fn a_lost_lease_ends_the_commands_background_jobs_too() {
    let backend = Backend::named("sqlite").await;
    let (args, store, key) = on_sqlite(&backend, &["--grace-ms", "2000"]).await;
    let markers = Markers::new();
    // A shell that waits for its background job: SIGTERM ends the shell, not the `sleep`.
    let body = format!(
        r#"{BACKGROUND_JOB}
mark env "$STATION_LEASE_ID"
wait"#
    );
    let child = start(&markers, &strs(&args), &body);
    markers.appears("env").await;
    let job = Leftover::of(&markers, "job");
    assert!(running(job.0), "the background job runs");
    let token = LeaseToken::from_text(markers.read("env").trim());
    assert!(store.release(&key, &token).await.unwrap());
    let (code, stderr) = ended(child).await;
    assert_eq!(code, EXIT_LOST, "{stderr}");
    // Gone by the time station-lease exited (it reaps what its command left): another holder
    // may have the lease from now on.
    assert!(
        !running(job.0),
        "the command's background job (pid {}) still runs after station-lease exited 70: {stderr}",
        job.0
    );
}

#[tokio::test]
async fn a_command_that_exits_leaves_no_background_job_running_once_the_lease_is_released() {
    let backend = Backend::named("sqlite").await;
    let (args, store, key) = on_sqlite(&backend, &["--grace-ms", "2000"]).await;
    let markers = Markers::new();
    // The job traps SIGTERM to say it got it, and is still running when the command exits.
    // The command exits only once the job says its trap is set (`job-up`): a SIGTERM before
    // that would end the job unheard, however fast the machine.
    let body = r#"sh -c 'trap "echo term > \"$0/job-term\"; exit 0" TERM; echo up > "$0/job-up"; i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done' "$M" > /dev/null 2>&1 &
mark job $!
i=0; while [ ! -e "$M/job-up" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 4"#;
    let child = start(&markers, &strs(&args), body);
    let (code, stderr) = ended(child).await;
    let job = Leftover::of(&markers, "job");
    assert_eq!(code, 4, "the command's own status: {stderr}");
    assert!(
        !running(job.0),
        "the command's background job (pid {}) still runs after the command exited and the lease was released",
        job.0
    );
    assert_eq!(markers.read("job-term").trim(), "term", "it got SIGTERM");
    assert!(
        stderr.contains("left processes of its group running"),
        "{stderr}"
    );
    assert!(store.current(&key).await.unwrap().is_none(), "released");
}

#[tokio::test]
async fn a_background_job_that_ignores_sigterm_is_killed_after_grace_ms_before_the_release() {
    let backend = Backend::named("sqlite").await;
    let (args, store, key) = on_sqlite(&backend, &["--grace-ms", "300"]).await;
    let markers = Markers::new();
    // As above: the command exits once the job ignores SIGTERM (`job-up`), so only SIGKILL
    // can end it.
    let body = r#"sh -c 'trap "" TERM; echo up > "$0/job-up"; i=0; while [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done' "$M" > /dev/null 2>&1 &
mark job $!
i=0; while [ ! -e "$M/job-up" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
exit 0"#;
    let started = Instant::now();
    let child = start(&markers, &strs(&args), body);
    let (code, stderr) = ended(child).await;
    let took = started.elapsed();
    let job = Leftover::of(&markers, "job");
    assert_eq!(code, 0, "{stderr}");
    assert!(!running(job.0), "the job (pid {}) still runs", job.0);
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    assert!(took >= Duration::from_millis(300), "ended after {took:?}");
    assert!(store.current(&key).await.unwrap().is_none(), "released");
}

#[tokio::test]
async fn sigterm_to_station_lease_reaches_the_commands_background_jobs() {
    let backend = Backend::named("sqlite").await;
    let (args, store, key) = on_sqlite(&backend, &[]).await;
    let markers = Markers::new();
    let body = format!(
        r#"trap 'mark term term; exit 6' TERM
{BACKGROUND_JOB}
mark up up
wait
exit 3"#
    );
    let child = start(&markers, &strs(&args), &body);
    markers.appears("up").await;
    let job = Leftover::of(&markers, "job");
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(
        code, 6,
        "the command's own status after its TERM trap: {stderr}"
    );
    assert_eq!(markers.read("term").trim(), "term");
    assert!(!running(job.0), "the job (pid {}) still runs", job.0);
    assert!(store.current(&key).await.unwrap().is_none(), "released");
}

/// A terminal (a pseudo-terminal) whose foreground job is `station-lease`, as when a lab
/// engineer types the command in a shell: its stdin and stdout are the terminal, its stderr is
/// piped to the test.
struct Terminal {
    master: std::fs::File,
}

impl Terminal {
    fn start(markers: &Markers, args: &[&str], body: &str) -> (Terminal, Child) {
        use std::os::fd::AsRawFd;
        let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
        let script = script(body).replace("{dir}", &markers.dir.display().to_string());
        let slave = std::fs::File::from(pty.slave);
        let mut command = Command::new(station_lease_bin());
        command
            .args(args)
            .args(["--", "sh", "-c", &script])
            .stdin(slave.try_clone().unwrap())
            .stdout(slave)
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: between fork and exec only setsid and ioctl, both async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                // A session of its own whose controlling terminal is the pty (stdin): its
                // process group is the terminal's foreground group, as a shell's job is.
                nix::unistd::setsid()?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("station-lease starts");
        let master = std::fs::File::from(pty.master);
        assert!(master.as_raw_fd() >= 0);
        (Terminal { master }, child)
    }

    /// Types `text` at the terminal.
    fn types(&mut self, text: &str) {
        use std::io::Write;
        self.master.write_all(text.as_bytes()).unwrap();
    }
}

#[tokio::test]
async fn at_a_terminal_ctrl_z_stops_the_command_it_reads_the_terminal_and_ctrl_c_ends_it_and_its_jobs()
 {
    let backend = Backend::named("sqlite").await;
    let (args, store, key) = on_sqlite(&backend, &["--grace-ms", "2000"]).await;
    let markers = Markers::new();
    // A non-interactive shell's background job ignores SIGINT: Ctrl-C ends the script, not the
    // job, which must still not outlive the command.
    let body = format!(
        r#"trap 'mark int int; exit 5' INT
{BACKGROUND_JOB}
mark up up
read answer
mark answer "$answer"
wait
exit 3"#
    );
    let (mut terminal, child) = Terminal::start(&markers, &strs(&args), &body);
    markers.appears("up").await;
    let job = Leftover::of(&markers, "job");
    let station_lease = i32::try_from(child.id().unwrap()).unwrap();
    // Ctrl-Z stops the command's group and station-lease with it; continued (as `fg` does),
    // it gives the terminal back to the command and continues it.
    terminal.types("\x1a");
    until(LIMIT, "Ctrl-Z to stop station-lease and the job", || {
        stopped(station_lease) && stopped(job.0)
    })
    .await;
    kill(Pid::from_raw(station_lease), Signal::SIGCONT).unwrap();
    until(LIMIT, "the job to be continued", || !stopped(job.0)).await;
    // The command can read the terminal (a background process group could not: SIGTTIN).
    terminal.types("probe connected\n");
    markers.appears("answer").await;
    assert_eq!(markers.read("answer").trim(), "probe connected");
    terminal.types("\x03");
    let (code, stderr) = ended(child).await;
    assert_eq!(
        code, 5,
        "the command's own status after its INT trap: {stderr}"
    );
    assert_eq!(markers.read("int").trim(), "int", "Ctrl-C reached it");
    assert!(!running(job.0), "the job (pid {}) still runs", job.0);
    assert!(store.current(&key).await.unwrap().is_none(), "released");
}

/// `hold --station ID` against a gateway of two stations: the lease is that station's, the
/// command's `STATION_GATEWAY_URL` is the station's base URL, and its change reaches that
/// station and no other.
#[tokio::test]
async fn hold_station_takes_that_stations_lease_and_the_command_changes_only_it() {
    use station_gateway::config::lab::{Lab, StationSetup};
    let sims = [
        common::default_simulator().await,
        common::default_simulator().await,
    ];
    let stations = ["st1", "st2"]
        .iter()
        .zip(&sims)
        .map(|(id, sim)| StationSetup {
            id: (*id).into(),
            config: common::config_for(sim, |config| {
                config.station.id = (*id).into();
                config.config_files.dir = std::env::temp_dir()
                    .join(format!("hold-lab-{}", std::process::id()))
                    .join(id);
            }),
        })
        .collect();
    let gateway = station_gateway::start_lab(
        station_gateway::LabListeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None, None],
        },
        Lab {
            stations,
            default_station: None,
        },
    )
    .await
    .unwrap();
    within(LIMIT, "both stations to connect", gateway.connected()).await;
    let base = gateway.base_url();
    let markers = Markers::new();
    let body = format!(
        r#"command -v curl > /dev/null || {{ mark write "no curl on PATH: the command needs it"; exit 1; }}
mark url "$STATION_GATEWAY_URL"
code=$(curl -s -o /dev/null -w '%{{http_code}}' -X POST -H 'Content-Type: application/json' \
  -H "X-Lease-Id: $STATION_LEASE_ID" -d '{{"Name": "{VSET1}", "Value": "9"}}' \
  "$STATION_GATEWAY_URL/api/resources/value/set")
mark write "$code"
{WAIT_FOR_GO}
exit 0"#
    );
    let args = [
        "hold",
        "--gateway",
        &base,
        "--station",
        "st2",
        "--owner",
        "lab script",
        "--ttl-ms",
        "3000",
    ];
    let child = start(&markers, &args, &body);
    markers.appears("write").await;
    assert_eq!(markers.read("write").trim(), "200", "the holder's write");
    assert_eq!(markers.read("url").trim(), format!("{base}/stations/st2"));
    let http = reqwest::Client::new();
    let lease = |id: &str| {
        let url = format!("{base}/stations/{id}/api/lease");
        let http = http.clone();
        async move {
            http.get(url)
                .send()
                .await
                .unwrap()
                .json::<Json>()
                .await
                .unwrap()
        }
    };
    assert_eq!(lease("st2").await["owner"], "lab script");
    assert_eq!(lease("st1").await["held"], false);
    std::fs::write(markers.path("go"), "").unwrap();
    let (code, stderr) = ended(child).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(sims[1].write_log().len(), 1);
    assert!(sims[0].write_log().is_empty());
    assert_eq!(
        lease("st2").await["held"],
        false,
        "released after the command"
    );
}
