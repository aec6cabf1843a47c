//! `station-cli` and `station-sim` end to end, as a person or a script would run them.

mod common;

use std::process::Output;

use common::*;
use station_protocol::Value;
use station_simulator::{Profile, Simulator};
use tokio::process::Command;

async fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_station-cli"))
        .args(args)
        .output()
        .await
        .expect("station-cli runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn the_cli_writes_reads_and_reports_station_errors() {
    let sim = start_default().await;
    let addr = sim.local_addr().to_string();
    let at = |rest: &[&'static str]| {
        let mut args = vec!["--connect".to_owned(), addr.clone()];
        args.extend(rest.iter().map(|s| (*s).to_owned()));
        args
    };
    let run = |args: Vec<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&refs).await
    };

    let output = run(at(&["hello"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("firmware: 6.4.2"));

    let output = run(at(&["write", VSET1, "500"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let output = run(at(&["write", ON1, "True"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let output = run(at(&["write", LED_A1, "red"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let output = run(at(&["read", VSET1, ON1, LED_A1, MON_3V3])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..3], ["500", "True", "Red"]);
    let volts: f64 = lines[3].parse().unwrap();
    assert!((3.28..=3.32).contains(&volts));

    let output = run(at(&["transact", UART01, "*IDN?\\n"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "Simulated Station,HV4,ESH10000662,6.4.2\n");

    let output = run(at(&["read", "No.Such.Channel"])).await;
    assert!(!output.status.success());
    assert_eq!(
        stderr(&output).trim(),
        "station-cli: no such channel: No.Such.Channel"
    );

    let output = run(at(&["write", VSET1, "3500"])).await;
    assert!(!output.status.success());
    assert_eq!(
        stderr(&output).trim(),
        "station-cli: 0.4.ESH10000662.VSET1: 3500 is outside 0 to 3000 V"
    );

    let output = run(at(&["list"])).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.lines().count(), sim.profile().channels.len());
    assert!(
        text.contains("0.4.ESH10000662.VSET1\tfloat\trw\tV\n"),
        "{text}"
    );

    // What the CLI wrote reached the station, and only that.
    let log = sim.write_log();
    let written: Vec<(&str, &Value)> = log.iter().map(|w| (w.channel.as_str(), &w.value)).collect();
    assert_eq!(written[0], (VSET1, &Value::Float(500.0)));
    assert_eq!(written[1], (ON1, &Value::Bool(true)));
    assert_eq!(written[2], (LED_A1, &Value::Enum("Red".into())));
    assert_eq!(written.len(), 4);
}

#[tokio::test]
async fn the_cli_speaks_over_a_serial_device() {
    let (_sim, path) = Simulator::start_pty(Profile::default_station(), None)
        .await
        .unwrap();
    let path = path.to_string_lossy().into_owned();
    let output = cli(&["--serial", &path, "read", MON_3V3]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let output = cli(&["--serial", &path, "hello"]).await;
    assert!(stdout(&output).contains("window: 1"), "{}", stdout(&output));
}

#[tokio::test]
async fn the_cli_fails_clearly_when_nobody_listens() {
    let sim = start_default().await;
    let addr = sim.local_addr().to_string();
    sim.set_refuse_connections(true).await.unwrap();
    let output = cli(&["--connect", &addr, "hello"]).await;
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("cannot connect"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn station_sim_refuses_a_bad_profile_naming_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("station-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("typo.toml");
    let text = station_simulator::profile::DEFAULT_PROFILE_TOML
        .replace("model = \"uptime\"", "model = \"uptme\"");
    let line = text.lines().position(|l| l.contains("uptme")).unwrap() + 1;
    std::fs::write(&bad, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_station-sim"))
        .args(["--listen", "127.0.0.1:0", "--profile"])
        .arg(&bad)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains(&bad.display().to_string()), "{message}");
    assert!(message.contains(&format!("line {line}")), "{message}");
    assert!(message.contains("channel.model"), "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}
