//! One station's runtime, and what the stations of one gateway share: where a station is
//! assembled, started and stopped.
//!
//! [`StationRuntime::start`] starts everything one station needs — its link, the station
//! service, the control lease and the station's duties ledger, the link-owner lease or a
//! standby's watch, the access rules and interlock watch, the audit trail, NumericResults,
//! configuration files and the value history — and owns their tasks; no front end is needed
//! (a simulation of the whole lab starts stations this way). [`LabShared`] is what every station
//! of one gateway shares: the lease backends, the registry of which station serves which
//! physical station, the audit trail, the connection counters and the shutdown.
//!
//! The front ends (HTTP, legacy) hold an `Arc<StationRuntime>` each and add tasks of their own
//! to it with [`StationRuntime::spawn`], which stop with the station's.
//!
//! A station stops in order ([`stop_stations`]): its tasks end, the changes still running end
//! with their audit lines, what is still at the station goes into its ledger while this
//! process still owns the link, and only then are the link-owner leases let go, so that a
//! standby taking over at once finds every change it must wait for.

mod error;
mod history;
mod lab;
mod ownership;
mod start;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::Config;
use crate::lease::{ControlLease, LeaseBackends, LeaseView};
use crate::link::LinkHandle;

pub use error::StationStartError;
pub use lab::LabShared;

/// The name of the span each station's tasks run in, in a gateway of several stations (its
/// field `id` names the station): the log keeps each line with its station by it.
pub const STATION_SPAN: &str = "station";

/// Everything one station needs, started and owned in one place. Front ends hold an `Arc` of it.
pub struct StationRuntime {
    pub config: Config,
    pub link: LinkHandle,
    /// The station service: every front end's way to the station (reads, writes, its info).
    pub station: crate::station::Station,
    pub started: Instant,
    /// Cancelled when the gateway shuts down; long-lived answers end with it.
    pub shutdown: CancellationToken,
    /// Every change of hands of the control lease (taken, released, ran out, broken).
    pub lease_events: broadcast::Sender<LeaseView>,
    /// The control lease: who may change the station.
    pub lease: Arc<ControlLease>,
    /// The lease backends: the configured one (the control lease's) and any named per call.
    pub leases: Arc<LeaseBackends>,
    /// Counters of every front end and of the lease, for `GET /metrics`.
    pub metrics: crate::metrics::Metrics,
    /// The audit trail: every request, and who changed what under which lease.
    pub audit: crate::audit::AuditLog,
    /// Station configuration files: the directory and what was loaded from it.
    pub config_files: crate::config_files::ConfigFiles,
    /// NumericResult acquisitions: one per channel at a time, and the last results.
    pub numeric: crate::numeric::NumericResults,
    /// Owner of the station, or a standby (`[ha] mode`) until it takes over.
    pub ha: Arc<crate::lease::standby::HaRole>,
    /// The link's own owner gate, when it has one (a shared lease backend, or a station of
    /// several): whether the link stands by on the station's identity.
    pub link_gate: Option<Arc<crate::link::OwnerGate>>,
    /// The value history (`[history]`), while enabled.
    pub history: Option<Arc<crate::history::recorder::History>>,
    /// The value history's archive, for times memory no longer holds (`[history] archive`).
    pub history_archive: Option<Arc<crate::history::archive::ArchiveReader>>,
    /// This station's id in a gateway of several (`None` alone): its log holds only its own
    /// lines.
    pub lab_station_id: Option<String>,
    /// The span this station's tasks run in, in a gateway of several ([`STATION_SPAN`],
    /// disabled alone): a line logged for one of its requests is logged in it too.
    pub log_span: tracing::Span,
    /// The station's tasks, and those its front ends added: they end on `shutdown`.
    tasks: Mutex<JoinSet<()>>,
    /// The tasks that keep the link-owner lease (or a standby's watch): they end last, on
    /// `release`, once what was still at the station is in its ledger.
    owner_tasks: Mutex<JoinSet<()>>,
    release: CancellationToken,
}

/// How long a stop waits for the changes still running, and for the ledger's record.
pub const DRAIN: Duration = Duration::from_secs(5);

impl StationRuntime {
    /// Does this process own this station's link now? Every door that acts on the station
    /// asks it first: a safe stop, a change (before the lease's admission) and a lease's end
    /// (release, break). `Err` names who serves the station: the gateway a standby stands by
    /// for, or the gateway or station of this lab its link stands by for.
    pub fn owns_link(&self) -> Result<(), crate::lease::link_custody::NotLinkOwner> {
        crate::lease::link_custody::owns_link(&self.ha, self.link_gate.as_deref())
    }

    /// Runs `task` in the station's span until the station stops (it must end on
    /// [`StationRuntime::shutdown`]); the stop waits for it.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let task = task.instrument(self.log_span.clone());
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .spawn(task);
    }

    /// Stops this station alone, in order (see [`stop_stations`]).
    pub async fn stop(self: &Arc<Self>) {
        stop_stations(std::slice::from_ref(self), DRAIN).await;
    }

    /// Ends every task of the station at once, its link-owner lease's too: nothing released,
    /// nothing recorded (as when the process is killed). The station's tasks hold its runtime,
    /// so a runtime neither stopped nor aborted lives on.
    pub fn abort(&self) {
        for tasks in [&self.tasks, &self.owner_tasks] {
            tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .abort_all();
        }
    }

    /// Waits until every task of the station ended (after `shutdown` was cancelled).
    async fn tasks_ended(&self) {
        let mut tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        while tasks.join_next().await.is_some() {}
    }

    /// Writes what is still at the station into its ledger, as an owner does only while it
    /// still owns the link.
    async fn record_duties(&self, drain: Duration) {
        let owned = self.link_gate.as_ref().is_none_or(|gate| {
            gate.owned_at(tokio::time::Instant::now()) && gate.standing_by().is_none()
        }) && self.ha.standing_by().is_none();
        self.lease.flush_ledger(owned, drain).await;
    }

    /// Waits until the link-owner lease is let go (or a standby's watch ended), once
    /// `release` is cancelled.
    async fn link_released(&self) {
        let mut owner_tasks = std::mem::take(
            &mut *self
                .owner_tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        while owner_tasks.join_next().await.is_some() {}
    }
}

/// Stops `stations` in order: their tasks end (their `shutdown` cancelled), the changes still
/// running end with the link (answered, or failed "may or may not have been applied"), each
/// with its audit line, within `drain`; then, while this process still owns each station's
/// link, what is still at the station goes into its ledger; only then are the link-owner
/// leases let go.
pub async fn stop_stations(stations: &[Arc<StationRuntime>], drain: Duration) {
    for station in stations {
        station.shutdown.cancel();
    }
    for station in stations {
        station.tasks_ended().await;
    }
    for station in stations {
        station.station.changes_ended(drain).await;
    }
    for station in stations {
        station.record_duties(drain).await;
    }
    for station in stations {
        station.release.cancel();
    }
    for station in stations {
        station.link_released().await;
    }
}
