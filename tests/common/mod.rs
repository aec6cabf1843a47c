//! Shared test harness: one rig (a simulator and a gateway on ports the OS picks, with or
//! without the legacy listener), one HTTP helper, one event-stream reader ([`sse`]) and the
//! bounded waits every test uses.
#![allow(dead_code)]

pub mod backends;
pub mod cut_proxy;
pub mod devtools;
pub mod process;
pub mod proxy;
pub mod sse;

#[allow(unused_imports)]
pub use sse::{Event, Sse};

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value as Json, json};
use station_gateway::{Config, GatewayHandle, Listeners};
use station_simulator::{Profile, Simulator, SimulatorHandle};
use tokio::net::TcpListener;

/// Awaits `future` for at most `limit`; past that the test fails, naming `what` it waited for.
/// Every wait in a test goes through this (or a helper built on it), so a regression fails
/// the test instead of hanging CI.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("waited {limit:?} for {what}"),
    }
}

/// Polls `condition` every few milliseconds until it holds; fails after `limit`, naming `what`.
pub async fn until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    within(limit, what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Waits (at most 10 s) until the link's state satisfies `condition`.
pub async fn link_state(
    gateway: &GatewayHandle,
    what: &str,
    condition: impl FnMut(&std::sync::Arc<station_gateway::link::StationInfo>) -> bool,
) {
    let mut info = gateway.link().watch_info();
    within(Duration::from_secs(10), what, info.wait_for(condition))
        .await
        .expect("the link task ended");
}

/// Reads from `stream` until the peer closes it; returns how long that took. Fails after
/// `limit`. (Anything the peer sends first, e.g. a 408 answer, is skipped.)
pub async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), stream.read(&mut buf)).await {
            Err(_) => panic!("still open after {limit:?}"),
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

/// A simulator and a gateway connected to it.
pub struct Rig {
    pub sim: SimulatorHandle,
    pub gateway: GatewayHandle,
    pub http: reqwest::Client,
}

/// A config pointing at `sim`, with `tweak` applied.
pub fn config_for(sim: &SimulatorHandle, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::default();
    config.station.url = format!("tcp://{}", sim.local_addr());
    config.http.listen = "127.0.0.1:0".into();
    tweak(&mut config);
    config
}

/// Starts the default simulator and a gateway connected to it.
pub async fn rig(tweak: impl FnOnce(&mut Config)) -> Rig {
    let sim = default_simulator().await;
    let config = config_for(&sim, tweak);
    rig_on(sim, config, false).await
}

/// Starts the default simulator and a gateway with the legacy listener on.
pub async fn legacy_rig(tweak: impl FnOnce(&mut Config)) -> Rig {
    let sim = default_simulator().await;
    let config = config_for(&sim, tweak);
    rig_on(sim, config, true).await
}

/// The default station with every request touching a channel that `slow` picks taking
/// `latency` more, after `tweak` (e.g. a window of 1) has changed the rest of the profile.
pub async fn station_with_slow_channels(
    slow: impl Fn(&str) -> bool,
    latency: Duration,
    tweak: impl FnOnce(&mut Profile),
) -> SimulatorHandle {
    let mut profile = default_profile();
    let mut found = false;
    for spec in profile
        .channels
        .iter_mut()
        .filter(|spec| slow(&spec.descriptor.name))
    {
        spec.latency = latency;
        found = true;
    }
    assert!(found, "no channel of the default station was made slow");
    tweak(&mut profile);
    Simulator::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// The default station's profile with a serial of its own: tests on a shared lease backend run
/// at once, and a gateway serves a station by its identity (model and serial), so two tests'
/// simulators must not be "the same station".
pub fn default_profile() -> Profile {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut profile = Profile::default_station();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    profile.station.serial = format!("{}-T{}-{n}", profile.station.serial, std::process::id());
    profile
}

pub async fn default_simulator() -> SimulatorHandle {
    Simulator::start(default_profile(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A gateway with `config` (which points at `sim`, or at a pty of it), connected.
pub async fn rig_on(sim: SimulatorHandle, config: Config, legacy: bool) -> Rig {
    let gateway = start_gateway_with(config, legacy).await;
    Rig {
        sim,
        gateway,
        http: reqwest::Client::new(),
    }
}

pub async fn start_gateway(config: Config) -> GatewayHandle {
    start_gateway_with(config, false).await
}

async fn start_gateway_with(config: Config, legacy: bool) -> GatewayHandle {
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        legacy: match legacy {
            true => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            false => None,
        },
    };
    let gateway = station_gateway::start(listeners, config).await.unwrap();
    within(
        Duration::from_secs(10),
        "the gateway to connect",
        gateway.connected(),
    )
    .await;
    gateway
}

impl Rig {
    pub fn url(&self, path: &str) -> String {
        format!("{}/api/{path}", self.gateway.base_url())
    }

    /// Where the legacy listener is (a rig from [`legacy_rig`]).
    pub fn legacy(&self) -> SocketAddr {
        self.gateway
            .legacy_addr
            .expect("this rig has no legacy listener: use legacy_rig")
    }

    /// Any request below `api/`, with an optional JSON body: the status and the JSON answer
    /// (`Null` when the answer is not JSON).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Json>,
    ) -> (u16, Json) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Json::Null))
    }

    /// `GET` of a path from the gateway's root (`/metrics`, `/healthz`): status and text.
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.gateway.base_url()))
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.text().await.unwrap_or_default(),
        )
    }

    /// POSTs JSON and returns the status and the JSON answer.
    pub async fn post(&self, path: &str, body: Json) -> (u16, Json) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Json) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn read(&self, name: &str) -> (u16, Json) {
        self.post("resources/value/get", json!({ "Name": name }))
            .await
    }

    pub async fn write(&self, name: &str, value: &str) -> (u16, Json) {
        self.post(
            "resources/value/set",
            json!({ "Name": name, "Value": value }),
        )
        .await
    }

    /// Waits until the link has come up with a generation above `generation`.
    pub async fn reconnected_after(&self, generation: u64) {
        link_state(&self.gateway, "the link to reconnect", |i| {
            i.connected && i.generation > generation
        })
        .await;
    }

    /// Waits until the link is down.
    pub async fn disconnected(&self) {
        link_state(&self.gateway, "the link to go down", |i| !i.connected).await;
    }

    /// Waits until the link is up.
    pub async fn connected(&self) {
        link_state(&self.gateway, "the link to be up", |i| i.connected).await;
    }
}

pub const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";
pub const VSET1: &str = "0.4.ESH10000662.VSET1";
pub const VMON1: &str = "0.4.ESH10000662.VMON1";
pub const ON1: &str = "0.4.ESH10000662.ON1";

impl Rig {
    /// Takes the control lease over HTTP for `owner`; returns the lease id.
    pub async fn take_lease(&self, owner: &str) -> String {
        let response = self
            .http
            .post(format!("{}/api/lease", self.gateway.base_url()))
            .json(&json!({ "Owner": owner, "TtlMs": 30000 }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        body["leaseId"].as_str().unwrap().to_owned()
    }

    pub async fn release_lease(&self, id: &str) {
        let response = self
            .http
            .delete(format!("{}/api/lease/{id}", self.gateway.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
}

/// The binary `bin` of the workspace's package `package`, built with the cargo running the
/// tests (quick when it is up to date); its path from cargo's own answer. `cargo test` of
/// this crate builds no other package's binaries.
pub fn workspace_bin(package: &str, bin: &str) -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let mut build = std::process::Command::new(cargo);
    // Not the variables cargo sets for this test (CARGO_MANIFEST_DIR, CARGO_PKG_*, ...):
    // build scripts that read them would see them change and rebuild, here and in the
    // next `cargo test`, every time.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_TARGET_TMPDIR",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
            || [
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&&*name)
        {
            build.env_remove(&*name);
        }
    }
    let output = build
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            "--bin",
            bin,
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build -p {package} --bin {bin} failed: {}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Json>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == bin)
        .find_map(|message| message["executable"].as_str().map(std::path::PathBuf::from))
        .unwrap_or_else(|| panic!("cargo names the {bin} executable it built"))
}
