//! The gateway's shared state: what every front end and task holds an `Arc` of. How it is
//! built, started and stopped is `server.rs`.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::lease::{ControlLease, LeaseBackends, LeaseView};
use crate::link::LinkHandle;

/// What every request handler shares.
pub struct Gateway {
    pub config: Config,
    pub link: LinkHandle,
    /// The station service: every front end's way to the station (reads, writes, its info).
    pub station: crate::station::Station,
    pub started: Instant,
    /// Cancelled when the gateway shuts down; long-lived responses end with it.
    pub shutdown: CancellationToken,
    /// Every change of hands of the control lease (taken, released, ran out, broken).
    pub lease_events: broadcast::Sender<LeaseView>,
    /// The control lease: who may change the station.
    pub lease: Arc<ControlLease>,
    /// The lease backends: the configured one (the control lease's) and any named per call.
    pub leases: Arc<LeaseBackends>,
    /// Open event streams and their subscriptions.
    pub events: Arc<crate::events::Events>,
    /// Counters and histograms for `GET /metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Who may do what over HTTP; off while no credentials are configured.
    pub access: crate::credentials::AccessControl,
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
    /// HTTPS, while `[http.tls]` names a certificate and key.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// This station's id in a gateway of several (`None` alone): its `api/application/log`
    /// holds only its own lines.
    pub lab_station_id: Option<String>,
    /// The span this station's tasks run in, in a gateway of several (`logs::STATION_SPAN`,
    /// disabled alone): a line logged for one of its requests is logged in it too.
    pub log_span: tracing::Span,
}

impl Gateway {
    /// Does this process own this station's link now? Every door that acts on the station
    /// asks it first: a safe stop (`api/safe_stop.rs`, for the station's press and the lab's),
    /// a change (`routes.rs` before the lease's admission, `legacy.rs`) and a lease's end
    /// (release, break). `Err` (503 on HTTP) names who serves the station: the gateway a
    /// standby stands by for, or the gateway or station of this lab its link stands by for.
    pub fn owns_link(&self) -> Result<(), crate::lease::link_custody::NotLinkOwner> {
        crate::lease::link_custody::owns_link(&self.ha, self.link_gate.as_deref())
    }
}
