//! The gateway as a child process: spawned from its release binary, its bound addresses read
//! from its log on stderr, its CPU time and memory read from `/proc/PID`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A running `station-gateway` child.
pub struct GatewayProcess {
    child: Child,
    pub pid: u32,
    pub http_addr: SocketAddr,
    pub legacy_addr: Option<SocketAddr>,
    /// When the process was spawned.
    pub spawned: Instant,
}

impl GatewayProcess {
    /// Spawns `binary --station URL --http 127.0.0.1:0 --legacy 127.0.0.1:0` and waits (up to
    /// 20 s) until it logged the HTTP address it bound.
    pub async fn spawn(
        binary: &Path,
        station_url: &str,
        env: &[(String, String)],
    ) -> anyhow::Result<GatewayProcess> {
        GatewayProcess::spawn_with(binary, station_url, env, &[]).await
    }

    /// [`GatewayProcess::spawn`] with more arguments (e.g. `--config FILE`).
    pub async fn spawn_with(
        binary: &Path,
        station_url: &str,
        env: &[(String, String)],
        extra: &[&str],
    ) -> anyhow::Result<GatewayProcess> {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["--station", station_url]);
        args.extend(["--http", "127.0.0.1:0", "--legacy", "127.0.0.1:0"]);
        GatewayProcess::spawn_args(binary, env, &args, true).await
    }

    /// Spawns `binary ARGS` as they are (e.g. `--config FILE` alone, the stations and the
    /// HTTP address in the file) and waits (up to 20 s) until it logged the HTTP address it
    /// bound; with `wait_for_legacy`, a moment more for the legacy listener's line that follows it.
    pub async fn spawn_args(
        binary: &Path,
        env: &[(String, String)],
        args: &[&str],
        wait_for_legacy: bool,
    ) -> anyhow::Result<GatewayProcess> {
        let spawned = Instant::now();
        let mut child = Command::new(binary)
            .env("RUST_LOG", "info")
            .envs(env.iter().cloned())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("the gateway exited at once")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (found_tx, found_rx) = oneshot::channel();
        // Reads the log's start line by line for the addresses, then drains the rest in
        // blocks without looking at it, as every baseline's output is drained, so the harness
        // spends no more on the gateway's access lines than on a baseline's silence.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr);
            let mut legacy = None;
            let mut http = None;
            let mut line = String::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                line.clear();
                match lines.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if std::env::var_os("STATION_BENCH_GATEWAY_LOG").is_some() {
                    eprint!("[gateway] {line}");
                }
                if let Some(addr) = addr_after(&line, "legacy byte-protocol listener on ") {
                    legacy = Some(addr);
                }
                if http.is_none() {
                    http = addr_after(&line, "HTTP listening on http://");
                    if http.is_some() && wait_for_legacy {
                        // The legacy line follows the HTTP line; give it a moment.
                        line.clear();
                        let next = tokio::time::timeout(
                            Duration::from_millis(200),
                            lines.read_line(&mut line),
                        )
                        .await;
                        if let Ok(Ok(_)) = next
                            && let Some(addr) =
                                addr_after(&line, "legacy byte-protocol listener on ")
                        {
                            legacy = Some(addr);
                        }
                    }
                }
                if let Some(addr) = http {
                    let _ = found_tx.send((addr, legacy));
                    break;
                }
            }
            drain(lines).await;
        });
        let (http_addr, legacy_addr) = tokio::time::timeout(Duration::from_secs(20), found_rx)
            .await
            .context("the gateway did not log its HTTP address within 20 s")?
            .context("the gateway exited before it logged its HTTP address")?;
        Ok(GatewayProcess {
            child,
            pid,
            http_addr,
            legacy_addr,
            spawned,
        })
    }

    /// Resident memory now, in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        rss_of(self.pid)
    }

    /// Stops the gateway: SIGTERM, then a kill after 5 s.
    pub async fn stop(mut self) {
        // SAFETY: kill(2) with a pid we spawned and still own as a child (not yet reaped).
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// How the benchmark's gateway is started (binary, station, environment, configuration), so a
/// scenario can start a fresh one like it: the fan-out measures memory a stream from a gateway
/// that has served nothing before, whose heap holds no memory freed by earlier scenarios.
pub struct GatewayRecipe {
    pub binary: PathBuf,
    pub station_url: String,
    pub env: Vec<(String, String)>,
    /// The configuration file's text.
    pub config: String,
}

impl GatewayRecipe {
    /// A gateway started from the recipe, its configuration written to a file of its own for
    /// the start and removed once the gateway has read it.
    pub async fn spawn(&self) -> anyhow::Result<GatewayProcess> {
        static SPAWNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "station-bench-gateway-{}-{}.toml",
            std::process::id(),
            SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(&path, &self.config)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let arg = path.to_string_lossy().into_owned();
        let gateway = GatewayProcess::spawn_with(
            &self.binary,
            &self.station_url,
            &self.env,
            &["--config", &arg],
        )
        .await;
        let _ = std::fs::remove_file(&path);
        gateway
    }
}

/// The trivial hyper server (or the floor server) in a process of its own (this binary with
/// `--serve-trivial` or `--serve-floor`), so the cached read is compared with a server that
/// pays the same cross-process hops.
pub struct TrivialProcess {
    _child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
}

/// What a helper process (this binary in one of its hidden roles) prints when it is ready.
pub const TRIVIAL_READY: &str = "trivial server listening on http://";
pub const STATION_READY: &str = "station listening on ";
pub const STATION_CONTROL: &str = " control ";

impl TrivialProcess {
    pub async fn spawn(answer: &[u8]) -> anyhow::Result<TrivialProcess> {
        let answer = String::from_utf8_lossy(answer);
        TrivialProcess::spawn_with(&["--serve-trivial", &answer]).await
    }

    /// The floor server (`floor.rs`) of kind `floor`: a cached one answers `values/get` of
    /// `name` with `answer`; a forced one reads whatever it is asked from its station (and
    /// ignores both).
    pub async fn spawn_floor(
        name: &str,
        answer: &[u8],
        floor: crate::floor::Floor,
    ) -> anyhow::Result<TrivialProcess> {
        let answer = String::from_utf8_lossy(answer);
        TrivialProcess::spawn_with(&["--serve-floor", name, &answer, &floor.arg()]).await
    }

    async fn spawn_with(args: &[&str]) -> anyhow::Result<TrivialProcess> {
        let (child, line) = spawn_helper(args, TRIVIAL_READY).await?;
        let addr = addr_after(&line, TRIVIAL_READY).context("no address on the ready line")?;
        let pid = child.id().context("the server exited at once")?;
        Ok(TrivialProcess {
            _child: child,
            pid,
            addr,
        })
    }
}

/// The station simulator in a process of its own (this binary with `--serve-station`): a real
/// station is a device of its own, so direct clients and the gateway alike pay a hop to reach
/// it. Its counters are read over the simulator's control interface.
pub struct StationProcess {
    _child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
    control: SocketAddr,
}

impl StationProcess {
    pub async fn spawn() -> anyhow::Result<StationProcess> {
        let (child, line) = spawn_helper(&["--serve-station"], STATION_READY).await?;
        let pid = child.id().context("the station process exited at once")?;
        let addr = addr_after(&line, STATION_READY).context("no station address")?;
        let control = addr_after(&line, STATION_CONTROL).context("no control address")?;
        Ok(StationProcess {
            _child: child,
            pid,
            addr,
            control,
        })
    }

    /// Asks the station's control interface one question (`processing 1`, `status`, ...); the
    /// answer without `ok: `.
    pub async fn ask(&self, question: &str) -> anyhow::Result<String> {
        use tokio::io::AsyncWriteExt;
        let stream = tokio::net::TcpStream::connect(self.control).await?;
        let (read_half, mut write_half) = stream.into_split();
        write_half
            .write_all(format!("{question}\n").as_bytes())
            .await?;
        let mut answer = String::new();
        BufReader::new(read_half).read_line(&mut answer).await?;
        match answer.trim_end().strip_prefix("ok: ") {
            Some(rest) => Ok(rest.to_owned()),
            None => bail!("the station's control interface answered {question:?} with {answer:?}"),
        }
    }

    /// Hardware reads of `name` so far.
    pub async fn reads_of(&self, name: &str) -> anyhow::Result<u64> {
        let answer = self.ask(&format!("reads {name}")).await?;
        number_after(&answer, "reads ")
    }

    /// READ frames the station has answered so far.
    pub async fn read_frames(&self) -> anyhow::Result<u64> {
        let answer = self.ask("status").await?;
        number_after(&answer, "read frames ")
    }
}

fn number_after(text: &str, marker: &str) -> anyhow::Result<u64> {
    let rest = &text[text
        .find(marker)
        .with_context(|| format!("no {marker:?} in {text:?}"))?
        + marker.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .with_context(|| format!("no number after {marker:?} in {text:?}"))
}

/// Starts this binary with `args` and waits (up to 10 s) for the stderr line holding `ready`;
/// the rest of stderr is read and dropped so the child never blocks on a full pipe.
pub(crate) async fn spawn_helper(args: &[&str], ready: &str) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {args:?}"))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let find = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(ready) {
                return Some(line);
            }
        }
        None
    };
    let line = tokio::time::timeout(Duration::from_secs(10), find)
        .await
        .with_context(|| format!("{args:?} did not start within 10 s"))?
        .with_context(|| format!("{args:?} exited before it was ready"))?;
    tokio::spawn(drain(lines.into_inner()));
    Ok((child, line))
}

/// Reads a child's output to its end in blocks and drops it: the one cheap way every process
/// the harness starts is drained (the child never blocks on a full pipe). With
/// `STATION_BENCH_GATEWAY_LOG` set the blocks are copied to this process's stderr instead.
async fn drain(mut output: impl tokio::io::AsyncRead + Unpin) {
    if std::env::var_os("STATION_BENCH_GATEWAY_LOG").is_some() {
        let _ = tokio::io::copy(&mut output, &mut tokio::io::stderr()).await;
    } else {
        let _ = tokio::io::copy(&mut output, &mut tokio::io::sink()).await;
    }
}

/// The socket address that follows `marker` on a log line.
fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// utime + stime of a process, from `/proc/PID/stat`.
pub fn cpu_time_of(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let after = &stat[stat.rfind(')').context("odd /proc stat")? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3 of stat(5), so utime (14) and stime (15) are 11 and 12 here.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / ticks,
    ))
}

/// VmRSS of a process, from `/proc/PID/status`, in bytes.
pub fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("VmRSS:") {
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse()?;
            return Ok(kb * 1024);
        }
    }
    bail!("no VmRSS in /proc/{pid}/status")
}

/// The release `station-gateway` binary: `--gateway PATH`, or built next to this binary (with
/// `cargo build --release -p station-gateway` first when run through cargo).
pub fn locate_binary(explicit: Option<PathBuf>, build: bool) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path);
    }
    if build && let Some(cargo) = std::env::var_os("CARGO") {
        eprintln!("building the release gateway: cargo build --release -p station-gateway");
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", "station-gateway", "--bin"])
            .arg("station-gateway")
            .status()
            .context("cannot run cargo")?;
        if !status.success() {
            // The work tree may be mid-edit; an older build still measures something.
            eprintln!(
                "warning: cargo build --release -p station-gateway failed; using the binary already built, if any"
            );
        }
    }
    let me = std::env::current_exe()?;
    let dir = me.parent().context("no directory")?;
    let path = dir.join("station-gateway");
    if !path.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p station-gateway` or pass --gateway PATH",
            path.display()
        );
    }
    Ok(path)
}

/// nginx with one worker answering every request with `return 200` and the same JSON bytes
/// (the outside reference for a cached read): `master_process off`, so the one process
/// serving is the one whose CPU is read, its access log written to a file as nginx does by
/// default. `None` when no `nginx` binary is installed.
pub struct NginxProcess {
    _child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
    _dir: TempDir,
}

/// A directory removed when dropped (nginx's prefix: configuration, logs, temp files).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where nginx is looked for.
const NGINX: &str = "/usr/sbin/nginx";

impl NginxProcess {
    pub fn available() -> bool {
        Path::new(NGINX).exists()
    }

    pub async fn spawn(answer: &[u8]) -> anyhow::Result<NginxProcess> {
        let answer = std::str::from_utf8(answer).context("the answer is not UTF-8")?;
        if answer.contains(['\'', '$', '\\']) {
            bail!("the answer cannot be written as an nginx string: {answer}");
        }
        let dir = std::env::temp_dir().join(format!(
            "station-bench-nginx-{}-{}",
            std::process::id(),
            NEXT_NGINX.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("logs"))?;
        let dir = TempDir(dir);
        // nginx cannot listen on port 0 and say which it got: a port the kernel just handed
        // out, released and given to nginx (loopback; nothing else here binds ports).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let config = format!(
            "worker_processes 1;\nmaster_process off;\ndaemon off;\nerror_log {dir}/logs/error.log;\n\
             pid {dir}/nginx.pid;\nevents {{ worker_connections 1024; }}\nhttp {{\n  \
             access_log {dir}/logs/access.log;\n  keepalive_requests 100000000;\n  \
             server {{\n    listen {addr};\n    location / {{\n      \
             default_type \"application/json; charset=utf-8\";\n      return 200 '{answer}';\n    }}\n  }}\n}}\n",
            dir = dir.0.display()
        );
        let conf = dir.0.join("nginx.conf");
        std::fs::write(&conf, config)?;
        let child = Command::new(NGINX)
            .arg("-p")
            .arg(&dir.0)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nginx")?;
        let pid = child.id().context("nginx exited at once")?;
        let started = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("nginx did not listen on {addr} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(NginxProcess {
            _child: child,
            pid,
            addr,
            _dir: dir,
        })
    }
}

static NEXT_NGINX: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The gateway child's configuration: `parts` (TOML documents: the harness's own settings, then
/// the caller's) merged table by table, a later part's key over an earlier one's, so that the
/// caller may set a key of a table the harness already has (`--gateway-toml '[http]'
/// --gateway-toml 'threads = 1'`) where two `[http]` headers would make the file invalid.
pub fn merged_config(parts: &[String]) -> anyhow::Result<String> {
    fn merge(into: &mut toml::Table, from: toml::Table) {
        for (key, value) in from {
            match (into.get_mut(&key), value) {
                (Some(toml::Value::Table(existing)), toml::Value::Table(more)) => {
                    merge(existing, more)
                }
                (_, value) => {
                    into.insert(key, value);
                }
            }
        }
    }
    let mut config = toml::Table::new();
    for part in parts {
        let table: toml::Table = toml::from_str(part)
            .with_context(|| format!("the gateway's configuration is not valid TOML: {part}"))?;
        merge(&mut config, table);
    }
    Ok(toml::to_string(&config)?)
}

#[cfg(test)]
mod tests {
    use super::merged_config;

    #[test]
    fn a_callers_settings_join_the_harness_tables_instead_of_repeating_them() {
        let merged = merged_config(&[
            "[http]\nmax_connections_per_ip = 4096\n".into(),
            "[http]\nthreads = 1\n[station]\ncoalesce_max_us = 0\n".into(),
            "[http]\nmax_connections_per_ip = 8\n".into(),
        ])
        .unwrap();
        let table: toml::Table = toml::from_str(&merged).unwrap();
        assert_eq!(table["http"]["threads"].as_integer(), Some(1));
        assert_eq!(
            table["http"]["max_connections_per_ip"].as_integer(),
            Some(8)
        );
        assert_eq!(table["station"]["coalesce_max_us"].as_integer(), Some(0));
        assert!(merged_config(&["[http".into()]).is_err());
    }
}
