//! One gateway of the simulated lab: the station runtime that ships
//! (`StationRuntime::start_on`), with the simulation's seams passed in: the link over
//! in-memory pipes (`LinkTask::with_opener`), the lease store as this gateway sees it (one
//! view of the simulated store, for the control lease and the link-owner lease alike), the
//! audit trail written inline, a state file in the seed's temporary directory, and a process
//! id of its own for each run. The doors a client uses (acquire, renew, release, break, safe
//! stop, change) ask what the HTTP front end asks before it calls the core (`owns_link`,
//! `station_served`, a standby's refusal).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use station_core::audit::AuditLog;
use station_core::config::lab::StationSetup;
use station_core::config::{Config, SafeWrite};
use station_core::lease::control::{LeaseAnswer, SafeStopOutcome, SafeStopState};
use station_core::lease::standby::HaRole;
use station_core::lease::{Access, LeaseBackends, LeaseError};
use station_core::link::{StationOpener, StationStream};
use station_core::runtime::{LabShared, StationRuntime};
use station_core::station::{Change, ChangeOrigin, ChangeReport, ChangeWhat, FrontEnd};
use station_lease::LeaseStore;
use station_protocol::Value;
use station_simulator::SimulatorHandle;
use tokio_util::sync::CancellationToken;

use crate::naming::StationNames;
use crate::pipe::{LineControl, SimStream};

/// The channel every client writes and the safe state sets.
pub const SETPOINT: &str = "0.4.ESH10000662.VSET1";
/// The safe state's value of [`SETPOINT`].
pub const SAFE_VALUE: f64 = 0.0;
/// The lease backend every gateway is told it uses: one that others share (the simulated
/// store behind it is handed in, never opened).
const SHARED_BACKEND: &str = "sqlite:/simulated/leases.db";

/// The configuration every simulated gateway runs with, before its naming of the station
/// (`crate::naming`) is put in.
pub fn config() -> Config {
    let mut config = Config::default();
    config.station.url = StationNames::shared().url;
    config.station.request_timeout_ms = 1_000;
    config.lease.backend = SHARED_BACKEND.into();
    config.lease.safe_state = vec![SafeWrite {
        channel: SETPOINT.into(),
        value: SAFE_VALUE.to_string(),
    }];
    config.lease.link_owner_ttl_ms = 6_000;
    // The value history samples the station on its own clock and records wall time: off.
    config.history.enabled = false;
    config
}

/// A running gateway of the simulation.
pub struct SimGateway {
    pub index: usize,
    /// `gw0`, `gw1`...: the station's write log names each connection's gateway so.
    pub name: String,
    pub runtime: Arc<StationRuntime>,
    /// Owner of the station, or a standby until it takes over (the runtime's).
    pub ha: Arc<HaRole>,
    pub line: LineControl,
    /// Cancelled to stop it, or by the gateway itself when it can no longer prove it owns the
    /// station's link (the process then exits, and is started again): the runtime's.
    pub shutdown: CancellationToken,
    /// Cancelled when the process is gone (killed or stopped): what a client waits on then
    /// is answered as a dropped connection.
    pub gone: CancellationToken,
    /// Added to the fences its doors answer (`naming::OTHER_LEASE_FENCES` when its control
    /// lease is named otherwise: each lease is told by its fence).
    pub fence_base: u64,
}

/// What a gateway is started with.
pub struct GatewayStart {
    pub index: usize,
    /// How many times it was started before (a restart keeps its state file).
    pub incarnation: u32,
    pub standby: bool,
    pub store: Arc<dyn LeaseStore>,
    pub sim: SimulatorHandle,
    pub line: LineControl,
    /// Where its link-owner state file lives (kept across a restart).
    pub state_file: PathBuf,
    /// How its configuration names the station.
    pub names: StationNames,
}

/// Starts a gateway: `Err` when it cannot start now (its link-owner lease held by another).
pub async fn start(setup: GatewayStart) -> Result<SimGateway, String> {
    let mut config = config();
    setup.names.apply(&mut config, setup.standby);
    let fence_base = setup.names.fence_base();
    config.lease.link_owner_state = setup.state_file.to_string_lossy().into_owned();
    let name = format!("gw{}", setup.index);
    let (link_task, link) = StationRuntime::link_for(&config).map_err(|e| e.to_string())?;
    let link_task = link_task.with_opener(opener(&setup.sim, &setup.line, &name));
    let leases = LeaseBackends::with_store(SHARED_BACKEND, setup.store);
    let mut lab = LabShared::with(
        Arc::new(leases),
        AuditLog::memory_inline(),
        vec!["station".into()],
        format!("http://{name}.sim"),
    );
    lab.pid = 1000 * (setup.index as u32 + 1) + setup.incarnation;
    let station = StationSetup {
        id: "station".into(),
        config,
    };
    let runtime = StationRuntime::start_on(station, (link_task, link), &lab)
        .await
        .map_err(|e| e.to_string())?;
    Ok(SimGateway {
        index: setup.index,
        name,
        ha: runtime.ha.clone(),
        shutdown: runtime.shutdown.clone(),
        runtime,
        line: setup.line,
        gone: CancellationToken::new(),
        fence_base,
    })
}

/// Each connection of the link: a new pipe, its far end served by the simulated station.
fn opener(sim: &SimulatorHandle, line: &LineControl, name: &str) -> StationOpener {
    let (sim, line, name) = (sim.clone(), line.clone(), name.to_owned());
    Arc::new(move || {
        let (sim, line, name) = (sim.clone(), line.clone(), name.clone());
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let token = line.new_connection();
            sim.serve_stream_as(theirs, line.window(), &name);
            let stream: Box<dyn StationStream> = Box::new(SimStream::new(ours, token, line));
            Ok(stream)
        })
    })
}

/// Why a door refused, in the words a client keeps.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// This gateway does not serve the station now (503 naming who does).
    NotLinkOwner(String),
    Lease(LeaseError),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotLinkOwner(why) => write!(f, "not the link owner: {why}"),
            Refusal::Lease(error) => write!(f, "{error}"),
        }
    }
}

impl SimGateway {
    fn owns_link(&self) -> Result<(), Refusal> {
        self.runtime
            .owns_link()
            .map_err(|e| Refusal::NotLinkOwner(e.to_string()))
    }

    /// Whether this gateway serves the station now: not a standby, and its link not standing
    /// by on the station's identity (what a client learns from a 503 naming the other).
    pub fn serves_the_station(&self) -> bool {
        self.ha.standing_by().is_none() && self.owns_link().is_ok()
    }

    /// `POST lease[?waitMs=N]`.
    pub async fn acquire(
        &self,
        owner: &str,
        ttl: Duration,
        presented: Option<&str>,
        wait: Duration,
    ) -> Result<LeaseAnswer, Refusal> {
        if let Some(why) = self.ha.standing_by() {
            return Err(Refusal::NotLinkOwner(why));
        }
        if wait.is_zero() && self.runtime.lease.station_served().is_none() {
            self.owns_link()?;
        }
        self.runtime
            .lease
            .acquire(owner.to_owned(), ttl, presented, wait)
            .await
            .map(|answer| self.told(answer))
            .map_err(|refused| match refused {
                // Asked when the lease would be granted, as HTTP answers it: 503 naming who
                // serves the station.
                LeaseError::NotLinkOwner(why) => Refusal::NotLinkOwner(why.to_string()),
                refused => Refusal::Lease(refused),
            })
    }

    /// `answer` with its fence as the clients' records keep it.
    fn told(&self, mut answer: LeaseAnswer) -> LeaseAnswer {
        answer.fence += self.fence_base;
        answer
    }

    /// `PUT lease/{id}`.
    pub async fn renew(&self, presented: &str) -> Result<LeaseAnswer, Refusal> {
        if let Some(why) = self.ha.standing_by() {
            return Err(Refusal::NotLinkOwner(why));
        }
        self.runtime
            .lease
            .renew(presented, None)
            .await
            .map(|answer| self.told(answer))
            .map_err(Refusal::Lease)
    }

    /// `DELETE lease/{id}`.
    pub async fn release(&self, presented: &str) -> Result<(), Refusal> {
        self.owns_link()?;
        self.runtime
            .lease
            .release(presented)
            .await
            .map_err(Refusal::Lease)
    }

    /// `DELETE api/lease` with the admin token.
    /// Answers whose lease it broke.
    pub async fn break_lease(&self) -> Result<Option<String>, Refusal> {
        self.owns_link()?;
        self.runtime
            .lease
            .break_lease(peer())
            .await
            .map(|broken| broken.owner)
            .map_err(Refusal::Lease)
    }

    /// `POST /v1/safe-stop`.
    pub async fn safe_stop(&self, by: &str) -> Result<SafeStopOutcome, Refusal> {
        // Hole put back (reintroduce-holes only): the door does not ask who owns the link, and
        // a press there is answered done whatever became of its safe state (both undone by
        // the same fix: before it, a standby answered 200 "safe-stopped" and reached nothing).
        let hole = station_core::holes::active("safe-stop-on-standby");
        let standing_by = self.owns_link().is_err();
        if !hole {
            self.owns_link()?;
        }
        let mut outcome = self
            .runtime
            .lease
            .safe_stop(by.to_owned(), "simulated press".into())
            .await
            .map_err(Refusal::Lease)?;
        if hole && standing_by {
            outcome.safe_state = SafeStopState::Confirmed;
        }
        if let Some((_, fence)) = &mut outcome.ended {
            *fence += self.fence_base;
        }
        Ok(outcome)
    }

    /// A write of [`SETPOINT`] under the lease `presented` (or none), admitted as the HTTP
    /// front end admits a change.
    pub async fn write(
        &self,
        value: f64,
        presented: Option<&str>,
    ) -> Result<Result<ChangeReport, String>, Refusal> {
        if let Some(why) = self.ha.standing_by() {
            return Err(Refusal::NotLinkOwner(why));
        }
        self.owns_link()?;
        let admitted = self
            .runtime
            .lease
            .admit(Access::Change, presented)
            .map_err(Refusal::Lease)?;
        let mut origin = ChangeOrigin::new(
            FrontEnd::Legacy { operation: "write" },
            peer(),
            std::time::Instant::now(),
        );
        origin.lease = self.runtime.lease.holder_of(presented);
        origin.asked = Some(format!("VSET1={value}"));
        let change = Change {
            what: ChangeWhat::Write(vec![(SETPOINT.into(), Value::Float(value))]),
            origin,
            admitted,
        };
        Ok(self
            .runtime
            .station
            .change(change)
            .await
            .map_err(|e| e.to_string()))
    }

    /// A `kill -9`: every task stops at once, nothing is released or recorded.
    pub fn kill(&self) {
        self.gone.cancel();
        self.runtime.abort();
        self.shutdown.cancel();
        self.line.cut();
    }

    /// A clean stop, as the gateway stops: changes end, what is still at the station goes
    /// into its ledger while the link is owned, then the link-owner lease goes.
    pub async fn stop(&self) {
        self.gone.cancel();
        self.runtime.stop().await;
    }
}

fn peer() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 40_000))
}
