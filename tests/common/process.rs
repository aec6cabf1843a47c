//! A gateway as a process of its own (the built `station-gateway` binary), for tests that
//! pause it (SIGSTOP), kill it (-9) or stop it (SIGTERM): its config written from the keys a
//! failover test sets (and its link-owner state file, if any), its HTTP address read from its
//! log; killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use station_gateway::Config;
use station_gateway::config::HaMode;
use station_gateway::lease::LeaseToken;

pub struct GatewayProcess {
    child: Child,
    pub base_url: String,
    dir: std::path::PathBuf,
    /// Its last log lines, for a failure's report.
    log: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// How many of a process's last log lines are kept.
const LOG_LINES: usize = 40;

/// `Some(x)` as a TOML line `key = x`, nothing for `None`.
fn optional(key: &str, value: Option<u64>) -> String {
    value.map(|v| format!("{key} = {v}\n")).unwrap_or_default()
}

/// A non-empty `value` as a TOML line `key = "value"`, nothing for an empty one.
fn optional_text(key: &str, value: &str) -> String {
    match value {
        "" => String::new(),
        value => format!("{key} = {value:?}\n"),
    }
}

impl GatewayProcess {
    /// Starts `station-gateway` with the station, lease and HA keys of `config` (HTTP on a
    /// free port of 127.0.0.1) and waits until it logs where it listens.
    pub fn start(config: &Config) -> Result<GatewayProcess> {
        let dir = std::env::temp_dir().join(format!(
            "sg-gateway-process-{}",
            &LeaseToken::random().as_str()[..12]
        ));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("gateway.toml");
        let station = &config.station;
        let lease = &config.lease;
        let toml = format!(
            "[station]\nurl = {:?}\nid = {:?}\nrequest_timeout_ms = {}\n{}\
             [http]\nlisten = \"127.0.0.1:0\"\n\
             [lease]\nbackend = {:?}\nname = {:?}\nlink_owner_ttl_ms = {}\n{}{}{}\
             [audit]\ndir = {:?}\n\
             [ha]\nmode = {:?}\n",
            station.url,
            station.id,
            station.request_timeout_ms,
            optional("max_processing_ms", station.max_processing_ms),
            lease.backend,
            lease.name,
            lease.link_owner_ttl_ms,
            optional("link_owner_lock_delay_ms", lease.link_owner_lock_delay_ms),
            optional("lock_delay_ms", lease.lock_delay_ms),
            optional_text("link_owner_state", &lease.link_owner_state),
            dir.join("audit").display().to_string(),
            match config.ha.mode {
                HaMode::Owner => "owner",
                HaMode::Standby => "standby",
            },
        );
        std::fs::write(&file, toml)?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_station-gateway"))
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("its log")?;
        let (found, address) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            let mut found = Some(found);
            // Read to the end, so that the process never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                {
                    let mut kept = kept.lock().unwrap();
                    if kept.len() == LOG_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line.clone());
                }
                if let Some(at) = line.find("HTTP listening on ")
                    && let Some(found) = found.take()
                {
                    let rest = &line[at + "HTTP listening on ".len()..];
                    let url = rest.split_whitespace().next().unwrap_or_default();
                    let _ = found.send(url.to_owned());
                }
            }
        });
        let base_url = match address.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(why) => {
                // Say why: how the process ended, if it did, and what it logged (every line
                // was kept before its log closed).
                let ended = match child.try_wait() {
                    Ok(Some(status)) => format!("it exited ({status})"),
                    Ok(None) => "it is still running".to_owned(),
                    Err(error) => format!("its state is unknown ({error})"),
                };
                let _ = child.kill();
                let lines = log
                    .lock()
                    .map(|kept| kept.iter().cloned().collect::<Vec<_>>().join("\n"))
                    .unwrap_or_default();
                anyhow::bail!(
                    "the gateway process did not log where it listens ({why}); {ended}; its log:\n{lines}"
                );
            }
        };
        Ok(GatewayProcess {
            child,
            base_url,
            dir,
            log,
        })
    }

    /// Its last log lines, one string.
    pub fn log_tail(&self) -> String {
        let kept = self.log.lock().unwrap();
        kept.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Sends `signal` (`-STOP`, `-CONT`, `-TERM`, `-KILL`).
    pub fn signal(&self, signal: &str) -> Result<()> {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()?;
        ensure!(sent.success(), "kill {signal}");
        Ok(())
    }

    /// Waits (at most `limit`) for the process to end by itself.
    pub async fn ended_within(&mut self, limit: Duration) -> Result<()> {
        let since = Instant::now();
        while self.child.try_wait()?.is_none() {
            ensure!(
                since.elapsed() < limit,
                "the gateway process did not end within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
