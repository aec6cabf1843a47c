//! One gateway of the simulated lab, assembled from the core's parts the way the gateway's
//! `server.rs` assembles a station (link task, link-owner lease or standby watch, control lease
//! with its station ledger, change runner, lease expiry), with the station reached through an
//! in-memory pipe and the lease store through the simulation's view of it. The doors a client
//! uses (acquire, renew, release, break, safe stop, change) ask what the HTTP front end asks
//! before it calls the core (`owns_link`, `station_served`).
//!
//! Kept in this one file so that it can give way to the core's own station assembly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use station_core::audit::AuditLog;
use station_core::config::{Config, HaMode, SafeWrite};
use station_core::lease::control::{LeaseAnswer, LeaseEndTiming, SafeStopOutcome, SafeStopState};
use station_core::lease::ledger::Adopter;
use station_core::lease::link_custody::owns_link;
use station_core::lease::link_owner::LinkOwnership;
use station_core::lease::owner_state::OwnerState;
use station_core::lease::standby::{HaRole, Standby, owner_label};
use station_core::lease::{Access, ControlLease, LeaseError};
use station_core::link::{
    LinkHandle, LinkSettings, LinkTask, OwnerGate, StationOpener, StationStream, StationUrl,
};
use station_core::station::Station;
use station_core::station::{Change, ChangeOrigin, ChangeReport, ChangeWhat, FrontEnd};
use station_lease::LeaseStore;
use station_protocol::Value;
use station_simulator::SimulatorHandle;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::pipe::{LineControl, SimStream};

/// The channel every client writes and the safe state sets.
pub const SETPOINT: &str = "0.4.ESH10000662.VSET1";
/// The safe state's value of [`SETPOINT`].
pub const SAFE_VALUE: f64 = 0.0;

/// The configuration every simulated gateway runs with.
pub fn config() -> Config {
    let mut config = Config::default();
    config.station.url = "tcp://station.sim:4000".into();
    config.station.request_timeout_ms = 1_000;
    config.lease.safe_state = vec![SafeWrite {
        channel: SETPOINT.into(),
        value: SAFE_VALUE.to_string(),
    }];
    config.lease.link_owner_ttl_ms = 6_000;
    config
}

/// A running gateway of the simulation.
pub struct SimGateway {
    pub index: usize,
    /// `gw0`, `gw1`...: the station's write log names each connection's gateway so.
    pub name: String,
    pub lease: Arc<ControlLease>,
    pub station: Station,
    pub link: LinkHandle,
    pub ha: Arc<HaRole>,
    pub gate: Option<Arc<OwnerGate>>,
    pub audit: AuditLog,
    pub line: LineControl,
    /// Cancelled to stop it, or by the gateway itself when it can no longer prove it owns the
    /// station's link (the process then exits, and is started again).
    pub shutdown: CancellationToken,
    release: CancellationToken,
    /// Cancelled when the process is gone (killed or stopped): what a client waits on then
    /// is answered as a dropped connection.
    pub gone: CancellationToken,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
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
}

/// Starts a gateway: `Err` when it cannot start now (its link-owner lease held by another).
pub async fn start(setup: GatewayStart) -> Result<SimGateway, String> {
    let mut config = config();
    if setup.standby {
        config.ha.mode = HaMode::Standby;
    }
    let name = format!("gw{}", setup.index);
    let url = StationUrl::parse(&config.station.url).map_err(|e| e.to_string())?;
    let settings = LinkSettings {
        url,
        request_timeout: config.request_timeout(),
        connect_timeout: Duration::from_millis(config.station.connect_timeout_ms),
        reconnect_min: Duration::from_millis(config.station.reconnect_min_ms),
        reconnect_max: Duration::from_millis(config.station.reconnect_max_ms),
        max_names_per_read: config.station.max_names_per_read,
        coalesce_quiet: Duration::from_micros(config.station.coalesce_quiet_us),
        coalesce_max: Duration::from_micros(config.station.coalesce_max_us),
        queue_depth: config.station.queue_depth,
        client_name: name.clone(),
    };
    let (link_task, link) = LinkTask::with_max_processing(settings, config.max_processing());
    let link_task = link_task.with_opener(opener(&setup.sim, &setup.line, &name));
    let audit = AuditLog::memory_inline();
    let shutdown = CancellationToken::new();
    let release = CancellationToken::new();
    let me = owner_label(
        1000 * (setup.index as u32 + 1) + setup.incarnation,
        &format!("http://{name}.sim"),
    );
    let timing = config.link_owner_timing();
    let key = config.link_owner_key();
    let state = OwnerState::open(&setup.state_file).map_err(|e| e.to_string())?;
    let (ownership, standing_by) = if setup.standby {
        let watch = Standby {
            store: setup.store.clone(),
            name: LinkOwnership::name_for(&key),
            me,
            timing,
            state: Some(state),
            gate: Arc::new(OwnerGate::new(tokio::time::Instant::now())),
            role: Arc::new(HaRole::standby()),
            station_id: config.station_id(),
        };
        (None, Some(watch))
    } else {
        let claimed = LinkOwnership::claim(setup.store.clone(), &key, me, timing, Some(state))
            .await
            .map_err(|e| e.to_string())?;
        (Some(claimed.with_station_id(config.station_id())), None)
    };
    let ha = match &standing_by {
        Some(watch) => watch.role.clone(),
        None => Arc::new(HaRole::owner()),
    };
    let (lease_events, _) = broadcast::channel(64);
    let lease = ControlLease::new(
        setup.store.clone(),
        config.control_lease_name(),
        lease_events,
    )
    .with_end_timing(LeaseEndTiming {
        read_back_after: config.max_processing(),
        tolerance: config.lease.safe_state_tolerance,
        lock_delay: config.lock_delay(),
    })
    .with_safe_state(link.clone(), config.lease.safe_state.clone())
    .with_notices(station_core::audit::lease_lines::lease_hook(audit.clone()))
    .with_station_ledger();
    if standing_by.is_none() {
        lease.resume().await.map_err(|e| e.to_string())?;
    }
    let lease = Arc::new(lease);
    let station = Station::new(link.clone(), audit.clone());
    let gate = match (&ownership, &standing_by) {
        (Some(ownership), _) => Some(ownership.gate()),
        (None, Some(watch)) => Some(watch.gate.clone()),
        (None, None) => None,
    };
    let link_task = match &gate {
        Some(gate) => link_task.with_owner_gate(gate.clone()),
        None => link_task,
    };
    let mut tasks = Vec::new();
    if let Some(ownership) = ownership {
        if ownership.taken_back() {
            lease.after_a_crash(config.max_processing()).await;
        }
        tasks.push(tokio::spawn(
            ownership
                .with_adopter(adopter_of(&lease))
                .keep(release.clone(), shutdown.clone()),
        ));
    }
    if let Some(watch) = standing_by {
        tasks.push(tokio::spawn(stand_by(
            watch,
            lease.clone(),
            audit.clone(),
            release.clone(),
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(link_task.run(shutdown.clone())));
    tasks.push(tokio::spawn(lease.clone().run_expiry(shutdown.clone())));
    Ok(SimGateway {
        index: setup.index,
        name,
        lease,
        station,
        link,
        ha,
        gate,
        audit,
        line: setup.line,
        shutdown,
        release,
        gone: CancellationToken::new(),
        tasks: std::sync::Mutex::new(tasks),
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

/// A standby's life, as the gateway's `stand_by`: watch the owner's link-owner lease until it
/// lapses, take it, wait its lock-delay, resume the control lease, then serve.
async fn stand_by(
    watch: Standby,
    lease: Arc<ControlLease>,
    audit: AuditLog,
    release: CancellationToken,
    shutdown: CancellationToken,
) {
    let role = watch.role.clone();
    let (me, retry) = (watch.me.clone(), watch.timing.renew_every);
    let Some(taken) = watch.until_lapsed(&shutdown).await else {
        return;
    };
    let gate = taken.ownership.gate();
    let taken_back = taken.ownership.taken_back();
    let keep = taken
        .ownership
        .with_adopter(adopter_of(&lease))
        .keep(release, shutdown.clone());
    tokio::pin!(keep);
    let resumed = async {
        let mut reopenings = gate.reopenings();
        while !gate.owned_at(tokio::time::Instant::now()) {
            if reopenings.changed().await.is_err() {
                break;
            }
        }
        if taken_back {
            lease.after_a_crash(config().max_processing()).await;
        }
        while lease.resume().await.is_err() {
            tokio::time::sleep(retry).await;
        }
    };
    tokio::select! {
        biased;
        () = &mut keep => return,
        () = resumed => {}
    }
    let view = lease.view();
    audit.note_change(station_core::audit::lease_lines::failover_line(
        &me,
        taken.previous_owner.as_deref(),
        view.owner.as_deref(),
        std::time::SystemTime::UNIX_EPOCH,
    ));
    role.took_over();
    keep.await;
}

fn adopter_of(lease: &Arc<ControlLease>) -> Adopter {
    let lease = lease.clone();
    Arc::new(move |identity: String| {
        let lease = lease.clone();
        Box::pin(async move { lease.adopt_station(&identity).await })
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
        owns_link(&self.ha, self.gate.as_deref()).map_err(|e| Refusal::NotLinkOwner(e.to_string()))
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
        if wait.is_zero() && self.lease.station_served().is_none() {
            self.owns_link()?;
        }
        self.lease
            .acquire(owner.to_owned(), ttl, presented, wait)
            .await
            .map_err(Refusal::Lease)
    }

    /// `PUT lease/{id}`.
    pub async fn renew(&self, presented: &str) -> Result<LeaseAnswer, Refusal> {
        if let Some(why) = self.ha.standing_by() {
            return Err(Refusal::NotLinkOwner(why));
        }
        self.lease
            .renew(presented, None)
            .await
            .map_err(Refusal::Lease)
    }

    /// `DELETE lease/{id}`.
    pub async fn release(&self, presented: &str) -> Result<(), Refusal> {
        self.owns_link()?;
        self.lease.release(presented).await.map_err(Refusal::Lease)
    }

    /// `DELETE api/lease` with the admin token.
    /// Answers whose lease it broke.
    pub async fn break_lease(&self) -> Result<Option<String>, Refusal> {
        self.owns_link()?;
        self.lease
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
            .lease
            .safe_stop(by.to_owned(), "simulated press".into())
            .await
            .map_err(Refusal::Lease)?;
        if hole && standing_by {
            outcome.safe_state = SafeStopState::Confirmed;
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
            .lease
            .admit(Access::Change, presented)
            .map_err(Refusal::Lease)?;
        let mut origin = ChangeOrigin::new(
            FrontEnd::Legacy { operation: "write" },
            peer(),
            std::time::Instant::now(),
        );
        origin.lease = self.lease.holder_of(presented);
        origin.asked = Some(format!("VSET1={value}"));
        let change = Change {
            what: ChangeWhat::Write(vec![(SETPOINT.into(), Value::Float(value))]),
            origin,
            admitted,
        };
        Ok(self.station.change(change).await.map_err(|e| e.to_string()))
    }

    /// A `kill -9`: every task stops at once, nothing is released or recorded.
    pub fn kill(&self) {
        self.gone.cancel();
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
        self.shutdown.cancel();
        self.line.cut();
    }

    /// A clean stop, as the gateway's handle stops: changes end, what is still at the
    /// station goes into its ledger while the link is owned, then the link-owner lease goes.
    pub async fn stop(&self) {
        self.gone.cancel();
        self.shutdown.cancel();
        self.station.changes_ended(Duration::from_secs(5)).await;
        let owned = self.gate.as_ref().is_none_or(|gate| {
            gate.owned_at(tokio::time::Instant::now()) && gate.standing_by().is_none()
        }) && self.ha.standing_by().is_none();
        self.lease.flush_ledger(owned, Duration::from_secs(5)).await;
        self.release.cancel();
        let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

fn peer() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 40_000))
}
