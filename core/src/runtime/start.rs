//! [`StationRuntime::start`]: one station assembled and its tasks started.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use super::history::start_history;
use super::ownership::Custody;
use super::{LabShared, STATION_SPAN, StationRuntime, StationStartError};
use crate::config::Config;
use crate::config::lab::StationSetup;
use crate::lease::ControlLease;
use crate::lease::control::LeaseEndTiming;
use crate::lease::link_custody::LinkCustody;
use crate::link::{LinkHandle, LinkSettings, LinkTask, StationUrl};

impl StationRuntime {
    /// Starts the station `setup` describes, one of `lab`'s: its link (TCP or serial, as
    /// `station.url` says), the link-owner lease or a standby's watch, the control lease
    /// (resumed from the store), the access rules, the interlock watch, the history.
    pub async fn start(
        setup: StationSetup,
        lab: &LabShared,
    ) -> Result<Arc<StationRuntime>, StationStartError> {
        let link = StationRuntime::link_for(&setup.config)?;
        StationRuntime::start_on(setup, link, lab).await
    }

    /// Starts the station `setup` describes on a link made already (a simulated one, say):
    /// [`StationRuntime::start`] with `link` for the one `station.url` names.
    pub async fn start_on(
        setup: StationSetup,
        link: (LinkTask, LinkHandle),
        lab: &LabShared,
    ) -> Result<Arc<StationRuntime>, StationStartError> {
        // With several stations every task of it runs in a span naming it, so that each
        // station's log lines are its own (the human format shows `station{id=..}`).
        let span = match lab.several() {
            true => tracing::error_span!(STATION_SPAN, id = setup.id.as_str()),
            false => tracing::Span::none(),
        };
        assemble(setup, link, lab, span.clone())
            .instrument(span)
            .await
    }

    /// The link task and its handle for the station `config` names, as [`StationRuntime::start`]
    /// makes them (a simulation gives the task an opener of its own: `LinkTask::with_opener`).
    pub fn link_for(config: &Config) -> Result<(LinkTask, LinkHandle), StationStartError> {
        let url = StationUrl::parse(&config.station.url).map_err(|error| {
            crate::config::ConfigError::Invalid {
                key: "station.url",
                message: error.to_string(),
            }
        })?;
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
            client_name: format!("station-gateway {}", env!("CARGO_PKG_VERSION")),
        };
        Ok(LinkTask::with_max_processing(
            settings,
            config.max_processing(),
        ))
    }
}

/// Builds the station's parts and starts its tasks, in its span.
async fn assemble(
    setup: StationSetup,
    (link_task, link): (LinkTask, LinkHandle),
    lab: &LabShared,
    log_span: tracing::Span,
) -> Result<Arc<StationRuntime>, StationStartError> {
    let StationSetup { id, config } = setup;
    // With several stations every audit line names its station.
    let several = lab.several().then_some(id.as_str());
    let audit = match several {
        Some(id) => lab.audit.for_station(id),
        None => lab.audit.clone(),
    };
    // One gateway per station: with a backend others can reach, take the link-owner lease
    // before the link touches the station (or, a standby, watch it until it lapses).
    let custody = Custody::claim(&config, several, lab).await?;
    let (role, link_gate) = (custody.role(), custody.gate());
    let (lease_events, _) = broadcast::channel(64);
    let lease = ControlLease::new(
        lab.leases.default_store(),
        config.control_lease_name(),
        lease_events.clone(),
    )
    .with_end_timing(LeaseEndTiming {
        read_back_after: config.max_processing(),
        tolerance: config.lease.safe_state_tolerance,
        lock_delay: config.lock_delay(),
    })
    .with_safe_state(link.clone(), config.lease.safe_state.clone())
    .with_notices(crate::audit::lease_lines::lease_hook(audit.clone()))
    .with_link_custody(LinkCustody::new(role.clone(), link_gate.clone()));
    let lease = match custody.keeps_ledger() {
        true => lease.with_station_ledger(),
        false => lease,
    };
    // With a backend that outlives the process, the lease held before a restart is still held:
    // never start believing nobody holds it when the backend cannot say. (A standby resumes
    // it when it takes over.)
    if !custody.standing_by() {
        lease
            .resume()
            .await
            .map_err(StationStartError::LeaseResume)?;
    }
    let access_rules = if config.access.rules.is_empty() {
        crate::access_rules::AccessRules::off()
    } else {
        // Compiled for the station's id however many stations this gateway serves: a rule
        // naming only other stations is never in force here.
        crate::access_rules::AccessRules::load_for_station(
            std::path::Path::new(&config.access.rules),
            Some(&id),
            &lab.served,
        )?
    }
    .with_legacy_group(Some(&config.legacy.access_group));
    let station = crate::station::Station::new(link.clone(), audit.clone())
        .with_access_rules(access_rules.clone());
    let (history, archive) = start_history(&config.history, &link);
    let runtime = Arc::new(StationRuntime {
        config_files: crate::config_files::ConfigFiles::new(&config.config_files),
        link,
        station,
        started: Instant::now(),
        shutdown: lab.shutdown.clone(),
        lease_events,
        lease: Arc::new(lease),
        leases: lab.leases.clone(),
        metrics: crate::metrics::Metrics::sharing(lab.endpoint_labels.clone(), &lab.connections),
        audit,
        numeric: Default::default(),
        ha: role,
        link_gate: link_gate.clone(),
        history,
        history_archive: archive.as_ref().map(|(reader, ..)| reader.clone()),
        lab_station_id: several.map(str::to_owned),
        log_span,
        config,
        tasks: Mutex::new(JoinSet::new()),
        owner_tasks: Mutex::new(JoinSet::new()),
        release: lab.release.child_token(),
    });
    custody.keep(&runtime).await;
    // Self-fencing: the link sends only while the link-owner lease is provably this gateway's.
    let link_task = match link_gate {
        Some(gate) => link_task.with_owner_gate(gate),
        None => link_task,
    };
    let shutdown = runtime.shutdown.clone();
    runtime.spawn(link_task.run(shutdown.clone()));
    access_rules.spawn_reloader(shutdown.clone());
    runtime.spawn(crate::access_rules::report_unmatched(
        access_rules,
        runtime.link.watch_info(),
        shutdown.clone(),
    ));
    runtime.spawn(crate::station::watch_interlocks(
        runtime.station.clone(),
        shutdown.clone(),
    ));
    runtime.spawn(runtime.lease.clone().run_expiry(shutdown.clone()));
    if let (Some(history), Some((_, queue, settings))) = (&runtime.history, archive) {
        runtime.spawn(crate::history::archive::writer::run(
            history.clone(),
            queue,
            settings,
            shutdown.clone(),
        ));
    }
    if let Some(history) = &runtime.history {
        runtime.spawn(crate::history::task::run(
            history.clone(),
            runtime.station.clone(),
            runtime.link.watch_info(),
            runtime.config.history.clone(),
            shutdown,
        ));
    }
    Ok(runtime)
}

impl StationRuntime {
    /// Runs `task` in the station's span until `release` (after everything else, the
    /// ledger's record included).
    pub(super) fn spawn_owner_task(&self, task: impl Future<Output = ()> + Send + 'static) {
        let task = task.instrument(self.log_span.clone());
        self.owner_tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .spawn(task);
    }
}
