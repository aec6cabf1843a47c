//! The `station-gateway` binary's flags, run as a user runs them: what it refuses (with which
//! message and exit status), what it logs at start and at the end, and that the addresses it
//! says it serves answer.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use station_gateway::config::EXAMPLE_CONFIG;
use station_simulator::StationClient;

const START_TIMEOUT: Duration = Duration::from_secs(30);

fn gateway() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_station-gateway"));
    command
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        // A start-up error must stay one line for the operator even with backtraces on.
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null());
    command
}

/// Runs the gateway with `args` to its end (for the cases where it must refuse to start).
fn run_to_end(args: &[&str]) -> Output {
    let mut child = gateway()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("station-gateway starts");
    let deadline = Instant::now() + START_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("station-gateway {args:?} did not exit within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running gateway whose stderr (the log) is read line by line by a thread.
struct RunningGateway {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl RunningGateway {
    fn start(args: &[&str]) -> RunningGateway {
        let mut child = gateway()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("station-gateway starts");
        let (lines_tx, lines) = channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        RunningGateway {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next log line containing `what`, with the text after it; fails with the log so far.
    fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(at) = line.find(what) {
                        return line[at + what.len()..].trim().to_owned();
                    }
                }
                Err(_) => panic!(
                    "no log line with {what:?} within {START_TIMEOUT:?}; log:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The address right after `what` in the next line that has one there.
    fn wait_for_address(&mut self, what: &str) -> String {
        loop {
            let rest = self.wait_for(what);
            let word = rest.split_whitespace().next().unwrap_or_default();
            if word.parse::<std::net::SocketAddr>().is_ok() {
                return word.to_owned();
            }
        }
    }

    /// SIGTERM, then the exit status and the rest of the log.
    fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(killed.success());
        let deadline = Instant::now() + START_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("station-gateway did not stop within {START_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends with stderr; what it had not handed over yet is the rest.
        self.seen.extend(self.lines.iter());
        (status, std::mem::take(&mut self.seen))
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago: `--simulator-listen` asks for a fixed address, which is
/// the point of the flag.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Says HELLO over the byte protocol at `addr`; the station's name.
async fn hello(addr: &str) -> String {
    let mut client = StationClient::connect(addr.parse().unwrap())
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {addr}: {error}"));
    client.hello("tests/gateway/cli.rs").await.unwrap().station
}

#[test]
fn simulator_and_station_together_are_refused_naming_both_flags() {
    let output = run_to_end(&["--simulator", "--station", "tcp://127.0.0.1:1"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--simulator"), "{stderr}");
    assert!(stderr.contains("--station"), "{stderr}");
}

#[test]
fn simulator_flags_without_simulator_are_refused() {
    for flag in ["--simulator-listen", "--simulator-profile"] {
        let output = run_to_end(&[flag, "x"]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("--simulator"), "{flag}: {stderr}");
    }
}

#[tokio::test]
async fn simulator_listen_fixes_the_simulators_address_and_it_is_logged() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut gateway = RunningGateway::start(&[
        "--simulator",
        "--simulator-listen",
        &addr,
        "--http",
        "127.0.0.1:0",
    ]);
    assert_eq!(gateway.wait_for_address("simulator listening "), addr);
    gateway.wait_for("HTTP listening on http://");
    assert!(!hello(&addr).await.is_empty());
    let (status, log) = gateway.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
    assert!(
        log.iter()
            .any(|line| line.contains("station-gateway stopped")),
        "no 'station-gateway stopped' line; log:\n{}",
        log.join("\n")
    );
}

#[tokio::test]
async fn without_simulator_listen_the_simulator_takes_a_free_port_and_says_which() {
    let mut gateway = RunningGateway::start(&["--simulator", "--http", "127.0.0.1:0"]);
    let addr = gateway.wait_for_address("simulator listening ");
    assert!(!addr.ends_with(":0"), "{addr}");
    assert!(!hello(&addr).await.is_empty());
}

#[test]
fn a_bad_simulator_listen_address_is_named() {
    let output = run_to_end(&["--simulator", "--simulator-listen", "localhost"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--simulator-listen"), "{stderr}");
    assert!(stderr.contains("localhost"), "{stderr}");
}

#[tokio::test]
async fn legacy_serves_the_byte_protocol_on_the_logged_address() {
    let mut gateway = RunningGateway::start(&[
        "--simulator",
        "--http",
        "127.0.0.1:0",
        "--legacy",
        "127.0.0.1:0",
    ]);
    let addr = gateway.wait_for_address("legacy byte-protocol listener on ");
    // The legacy listener answers HELLO once the link is up, which only the log says (and
    // "station link up" is logged just before the link's state says so): ask until then.
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let mut client = StationClient::connect(addr.parse().unwrap()).await.unwrap();
        match client.hello("tests/gateway/cli.rs").await {
            Ok(hello) => {
                assert!(!hello.station.is_empty());
                break;
            }
            Err(error) if tokio::time::Instant::now() < deadline => {
                assert!(error.to_string().contains("disconnected"), "{error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("no HELLO through {addr} within {START_TIMEOUT:?}: {error}"),
        }
    }
}

#[test]
fn print_config_prints_the_example_config() {
    let output = run_to_end(&["--print-config"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), EXAMPLE_CONFIG);
}

#[tokio::test]
async fn simulator_profile_loads_a_profile_file() {
    let profile = concat!(env!("CARGO_MANIFEST_DIR"), "/config/station.toml");
    let mut gateway = RunningGateway::start(&[
        "--simulator",
        "--simulator-profile",
        profile,
        "--http",
        "127.0.0.1:0",
    ]);
    let addr = gateway.wait_for_address("simulator listening ");
    assert!(!hello(&addr).await.is_empty());
}

#[test]
fn a_missing_simulator_profile_is_one_line_naming_the_file() {
    let output = run_to_end(&["--simulator", "--simulator-profile", "no-such-profile.toml"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("no-such-profile.toml"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("station-gateway: "), "{stderr}");
}

#[test]
fn a_missing_config_file_is_one_line_naming_the_file() {
    let output = run_to_end(&["--config", "no-such-gateway.toml"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert_eq!(
        stderr.trim(),
        "station-gateway: cannot read config file no-such-gateway.toml: no such file"
    );
}

#[test]
fn simulator_says_it_overrides_the_config_files_station() {
    let path = std::env::temp_dir().join(format!("sg-cli-station-{}.toml", std::process::id()));
    std::fs::write(&path, "[station]\nurl = \"tcp://192.0.2.7:4000\"\n").unwrap();
    let mut gateway = RunningGateway::start(&[
        "--config",
        path.to_str().unwrap(),
        "--simulator",
        "--http",
        "127.0.0.1:0",
    ]);
    let warning = gateway.wait_for("--simulator: ");
    let _ = std::fs::remove_file(&path);
    assert!(warning.contains("tcp://192.0.2.7:4000"), "{warning}");
}

/// A file in the temporary directory, removed when dropped (also when the test fails).
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, contents: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("sg-cli-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A port on 127.0.0.1 this test holds, so that the gateway's bind of it fails.
fn busy_port() -> (std::net::TcpListener, String) {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap().to_string();
    (holder, addr)
}

/// The one line a gateway that could not start printed, checked to name `listener` and `addr`.
fn bind_error(args: &[&str], listener: &str, addr: &str) -> String {
    let output = run_to_end(args);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.starts_with("station-gateway: "))
        .unwrap_or_else(|| panic!("no 'station-gateway: ' line; stderr:\n{stderr}"));
    assert!(
        line.contains(listener),
        "does not name {listener:?}: {line}"
    );
    assert!(line.contains(addr), "does not name {addr}: {line}");
    assert!(line.contains("in use"), "does not say why: {line}");
    line.to_owned()
}

#[test]
fn a_busy_legacy_port_is_reported_as_the_legacy_listeners_address() {
    let (_holder, busy) = busy_port();
    let line = bind_error(
        &["--simulator", "--http", "127.0.0.1:0", "--legacy", &busy],
        "legacy",
        &busy,
    );
    assert!(
        !line.contains("127.0.0.1:0"),
        "names the HTTP address: {line}"
    );
    assert!(!line.contains("HTTP"), "names the HTTP listener: {line}");
}

#[test]
fn a_busy_http_port_is_reported_as_the_http_listeners_address() {
    let (_holder, busy) = busy_port();
    let line = bind_error(
        &["--simulator", "--http", &busy, "--legacy", "127.0.0.1:0"],
        "HTTP",
        &busy,
    );
    assert!(
        !line.contains("legacy"),
        "names the legacy listener: {line}"
    );
}

#[test]
fn a_busy_https_port_is_reported_as_the_https_listener() {
    let (_holder, busy) = busy_port();
    // The port is bound before the certificate is read: files that do not exist are fine.
    let config = TempFile::new(
        "tls.toml",
        "[http.tls]\ncert = \"no-such.crt\"\nkey = \"no-such.key\"\n",
    );
    bind_error(
        &["--simulator", "--config", config.path(), "--http", &busy],
        "HTTPS",
        &busy,
    );
}

#[test]
fn a_busy_simulator_port_is_reported_as_the_simulators_address() {
    let (_holder, busy) = busy_port();
    bind_error(
        &[
            "--simulator",
            "--simulator-listen",
            &busy,
            "--http",
            "127.0.0.1:0",
        ],
        "simulator",
        &busy,
    );
}

#[test]
fn a_gateway_without_a_station_says_where_its_link_goes_and_how_to_give_it_one() {
    let default_url = station_gateway::config::StationConfig::default().url;
    let mut gateway = RunningGateway::start(&["--http", "127.0.0.1:0"]);
    let notice = gateway.wait_for("no station given");
    assert!(notice.contains(&default_url), "{notice}");
    assert!(notice.contains("--simulator"), "{notice}");
    assert!(notice.contains("--station tcp://HOST:PORT"), "{notice}");
}

#[tokio::test]
async fn a_gateway_with_a_station_or_the_simulator_says_nothing_about_the_default() {
    for args in [
        &["--simulator", "--http", "127.0.0.1:0"][..],
        &["--station", "tcp://127.0.0.1:1", "--http", "127.0.0.1:0"][..],
    ] {
        let mut gateway = RunningGateway::start(args);
        gateway.wait_for("HTTP listening on http://");
        let (_, log) = gateway.terminate();
        assert!(
            !log.iter().any(|line| line.contains("no station given")),
            "{args:?}; log:\n{}",
            log.join("\n")
        );
    }
}

#[test]
fn help_shows_every_default() {
    let output = run_to_end(&["--help"]);
    let help = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let defaults = station_gateway::Config::default();
    for (flag, default) in [
        ("--config", "none".to_owned()),
        ("--station", defaults.station.url),
        ("--http", defaults.http.listen),
        ("--legacy", "off".to_owned()),
        ("--lease-backend", defaults.lease.backend),
        ("--simulator-listen", "a free port".to_owned()),
        ("--simulator-profile", "the built-in station".to_owned()),
        ("--api-key", "none".to_owned()),
        ("--log-format", "human".to_owned()),
    ] {
        // The flag's help runs from its line to the next flag's.
        let start = help
            .find(&format!("  {flag} "))
            .unwrap_or_else(|| panic!("no {flag} in --help:\n{help}"));
        let rest = &help[start + 2..];
        let end = rest.find("\n  -").unwrap_or(rest.len());
        let entry = &rest[..end];
        assert!(
            entry.contains(&format!("[default: {default}")),
            "{flag}: no [default: {default}...] in\n{entry}"
        );
    }
}

/// The README's first screen: what a newcomer reads before scrolling.
const FIRST_SCREEN_LINES: usize = 40;

/// The `sh` code blocks of the README's first screen, one string per block.
fn first_screen_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md is readable");
    let mut blocks = Vec::new();
    let mut block: Option<Vec<&str>> = None;
    for line in readme.lines().take(FIRST_SCREEN_LINES) {
        match (&mut block, line.trim_end()) {
            (None, "```sh") => block = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                block = None;
            }
            (Some(lines), line) => lines.push(line),
            (None, _) => {}
        }
    }
    blocks
}

/// A command line split into words as `sh` does for plain words and '...' quoting (all the
/// README's first screen uses).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut in_word) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, in_word) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(!quoted, "unbalanced quote in {line:?}");
    if in_word {
        words.push(word);
    }
    words
}

#[tokio::test]
async fn the_readmes_first_screen_runs_the_gateway_and_its_request_answers() {
    let commands = first_screen_commands();
    let [run, request, tests] = &commands[..] else {
        panic!(
            "the README's first screen should hold three sh blocks (run, one request, the tests): {commands:#?}"
        );
    };
    // 1. `cargo run --release -- ARGS` runs this binary with ARGS; a test cannot build a release
    // binary under the cargo that runs it, so it runs the same code's test build. The README's
    // address is the default one; the test takes a free port instead (the one flag added).
    let run = shell_words(run);
    assert_eq!(run[..4], ["cargo", "run", "--release", "--"], "{run:?}");
    let default_http = station_gateway::Config::default().http.listen;
    let mut args: Vec<&str> = run[4..].iter().map(String::as_str).collect();
    args.extend(["--http", "127.0.0.1:0"]);
    let mut gateway = RunningGateway::start(&args);
    let addr = gateway.wait_for_address("HTTP listening on http://");
    let client = reqwest::Client::new();
    let ready = format!("http://{addr}/readyz");
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        match client.get(&ready).send().await {
            Ok(answer) if answer.status() == 200 => break,
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("/readyz did not answer 200 within {START_TIMEOUT:?}: {other:?}"),
        }
    }
    // 2. The one request, as curl sends `--json` (a POST of the body as application/json, which
    // a JSON endpoint requires), to the address the gateway took.
    let request = shell_words(request);
    let [curl, url, data, body] = &request[..] else {
        panic!("expected `curl URL --json BODY`: {request:?}");
    };
    assert_eq!((curl.as_str(), data.as_str()), ("curl", "--json"));
    let url = url.replace(&default_http, &addr);
    assert!(
        url.contains(&addr),
        "{url} is not at the default address {default_http}"
    );
    let answer = client
        .post(&url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer: serde_json::Value = answer.json().await.unwrap();
    let value: f64 = answer["value"].as_str().unwrap().parse().unwrap();
    assert!((3.0..3.6).contains(&value), "{answer}");
    // 3. The test command is what CI runs, and a script bash can read.
    assert_eq!(tests.trim(), "bash tests/run-all.sh");
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|line| line.starts_with("bash tests/run-all.sh")),
        "{ci}"
    );
    let checked = Command::new("bash")
        .args([
            "-n",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/run-all.sh"),
        ])
        .status()
        .unwrap();
    assert!(checked.success());
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/run-all.sh")).unwrap();
    assert!(script.contains("'summary: %d passed, %d failed, %d skipped\\n'"));
}

#[tokio::test]
async fn simulator_n_starts_n_stations_each_at_its_own_path() {
    let mut gateway = RunningGateway::start(&["--simulator", "2", "--http", "127.0.0.1:0"]);
    let first = gateway.wait_for_address("simulator sim1 listening ");
    let second = gateway.wait_for_address("simulator sim2 listening ");
    assert_ne!(first, second);
    let http = gateway.wait_for("HTTP listening on http://");
    let base = format!("http://{}", http.split_whitespace().next().unwrap());
    let client = reqwest::Client::new();
    // Both stations come up, each its own simulated station (its own serial).
    let deadline = Instant::now() + START_TIMEOUT;
    let stations = loop {
        let stations: serde_json::Value = client
            .get(format!("{base}/v1/stations"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if stations
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["connected"] == true)
        {
            break stations;
        }
        assert!(Instant::now() < deadline, "not both connected: {stations}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stations[0]["id"], "sim1");
    assert_eq!(stations[1]["id"], "sim2");
    assert_ne!(stations[0]["serial"], stations[1]["serial"], "{stations}");
    for id in ["sim1", "sim2"] {
        let lease = client
            .get(format!("{base}/stations/{id}/api/lease"))
            .send()
            .await
            .unwrap();
        assert_eq!(lease.status(), 200, "{id}");
    }
    // Several stations and none the default: /api/... names them.
    let refused = client
        .get(format!("{base}/api/lease"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    assert!(refused.text().await.unwrap().contains("sim1, sim2"));
    let (status, log) = gateway.terminate();
    assert!(status.success(), "{status}; log:\n{}", log.join("\n"));
}

#[test]
fn simulator_flags_that_name_one_station_are_refused_with_several() {
    let output = run_to_end(&["--simulator", "0"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("--simulator 0"),
        "{}",
        text(&output.stderr)
    );
    let output = run_to_end(&["--simulator", "2", "--legacy", "127.0.0.1:0"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--legacy names one listener"), "{stderr}");
    let output = run_to_end(&["--simulator", "3", "--simulator-listen", "127.0.0.1:0"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--simulator-listen names one address"),
        "{stderr}"
    );
}

/// The README's lab check (`scripts/lab-check.sh`) passes: two station-sim processes behind
/// one gateway, two holders, a change that stays on its station, one station stopped with
/// SIGSTOP slowing nobody, and both in `/v1/stations` and `/metrics`.
#[test]
fn the_readmes_lab_check_passes() {
    let sim = crate::common::workspace_bin("station-simulator", "station-sim");
    let output = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lab-check.sh"))
        .env("GATEWAY_BIN", env!("CARGO_BIN_EXE_station-gateway"))
        .env("SIM_BIN", sim)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let stdout = text(&output.stdout);
    assert!(
        output.status.success() && stdout.ends_with("lab check passed\n"),
        "{}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
}
