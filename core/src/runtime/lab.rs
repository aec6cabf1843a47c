//! What every station of one gateway shares: the lab's own state, never borrowed from one of
//! its stations.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::StationStartError;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::lease::LeaseBackends;
use crate::lease::lab_identities::LabIdentities;
use crate::metrics::ConnectionCounters;

/// What the stations of one gateway share, and what each station's start reads of the lab.
pub struct LabShared {
    /// The lease backends: the configured one, and any a request names.
    pub leases: Arc<LeaseBackends>,
    /// With several stations: which serves which physical station, for a lease backend no
    /// other gateway shares (a shared one says it through each station's link-owner lease).
    pub identities: Option<Arc<LabIdentities>>,
    /// The audit trail as the whole gateway writes it; a station of several writes each line
    /// naming itself (`AuditLog::for_station`).
    pub audit: AuditLog,
    /// Where other gateways and clients reach this one (`http://ADDR`, `https://ADDR`): what
    /// its link-owner leases say, unless `[ha] advertise_url` says otherwise.
    pub published_url: String,
    /// The process id its link-owner leases name it by, beside `published_url`: this
    /// process's; a simulation of several gateways in one process gives each run its own.
    pub pid: u32,
    /// The id of every station the gateway serves, in the configuration's order.
    pub served: Vec<String>,
    /// The counters of the front ends' connections, the whole gateway's.
    pub connections: ConnectionCounters,
    /// The labels of the front end's request counters (its endpoints), for each station's
    /// `Metrics`.
    pub endpoint_labels: Vec<&'static str>,
    /// Cancelled when the gateway shuts down (or stops by itself: a station that can no
    /// longer prove it owns its link stops the whole gateway, so a standby takes over).
    pub shutdown: CancellationToken,
    /// Stops the link-owner tasks, after everything else ([`super::stop_stations`]).
    pub release: CancellationToken,
}

impl LabShared {
    /// Opens what the lab shares from `gateway`'s gateway-wide sections (`[lease] backend`,
    /// `[audit]`), for the stations `served`, reached at `published_url`.
    pub async fn open(
        gateway: &Config,
        served: Vec<String>,
        published_url: String,
    ) -> Result<LabShared, StationStartError> {
        let leases = LeaseBackends::open(&gateway.lease.backend)
            .await
            .map_err(StationStartError::LeaseBackend)?;
        let audit = AuditLog::open(&gateway.audit).map_err(StationStartError::Audit)?;
        Ok(LabShared::with(
            Arc::new(leases),
            audit,
            served,
            published_url,
        ))
    }

    /// The lab of `served` on lease backends and an audit trail already open (a test's, a
    /// simulation's memory store).
    pub fn with(
        leases: Arc<LeaseBackends>,
        audit: AuditLog,
        served: Vec<String>,
        published_url: String,
    ) -> LabShared {
        LabShared {
            identities: (served.len() > 1).then(LabIdentities::new),
            leases,
            audit,
            published_url,
            pid: std::process::id(),
            served,
            connections: ConnectionCounters::default(),
            endpoint_labels: Vec::new(),
            shutdown: CancellationToken::new(),
            release: CancellationToken::new(),
        }
    }

    /// The same, counting each station's requests under `labels` (its front end's endpoints).
    pub fn with_endpoint_labels(mut self, labels: Vec<&'static str>) -> LabShared {
        self.endpoint_labels = labels;
        self
    }

    /// Whether the gateway serves several stations (each names itself in its audit lines,
    /// its log lines, its published URL and its state file).
    pub fn several(&self) -> bool {
        self.served.len() > 1
    }
}
