//! The gateway as a whole: how it starts, and how it stops.
//!
//! [`run`] is the entry point `main` uses; tests use [`start`] to get a [`GatewayHandle`]
//! with the bound addresses and the link.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info};

use crate::config::lab::Lab;
use crate::config::{Config, HaMode};
use crate::gateway::Gateway;
use crate::history::archive::ArchiveReader;
use crate::history::archive::writer::WriterSettings;
use crate::history::recorder::{ArchivedSample, History, Limits, WallClock};
use crate::http::lab::Stations;
use crate::lease::control::LeaseEndTiming;
use crate::lease::link_owner::{LinkOwnerError, LinkOwnership};
use crate::lease::owner_state::OwnerState;
use crate::lease::standby::{HaRole, Standby, owner_label};
use crate::lease::{BackendUrl, ControlLease, LeaseBackends};
use crate::link::{LinkHandle, LinkSettings, LinkTask, StationUrl};

/// How long shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// The sockets the gateway serves, bound by the caller (so `127.0.0.1:0` works in tests).
pub struct Listeners {
    pub http: TcpListener,
    pub legacy: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses `config` names; a failure names the listener and its own address.
    pub async fn bind(config: &Config) -> Result<Listeners, BindError> {
        let http_listener = if config.http.tls.enabled() {
            Listener::Https
        } else {
            Listener::Http
        };
        let http = bind_listener(http_listener, &config.http.listen).await?;
        let legacy = match config.legacy.listen.as_str() {
            "" => None,
            addr => Some(bind_listener(Listener::Legacy, addr).await?),
        };
        Ok(Listeners { http, legacy })
    }
}

/// The sockets of a gateway of one or several stations: one HTTP listener for them all, and
/// each station's legacy listener (in the lab's order; `None` where a station has none).
pub struct LabListeners {
    pub http: TcpListener,
    pub legacy: Vec<Option<TcpListener>>,
}

impl LabListeners {
    /// Binds the HTTP address (the gateway's, `http.listen`) and each station's legacy
    /// address; a failure names the listener, the station and the address.
    pub async fn bind(lab: &Lab) -> Result<LabListeners, BindError> {
        let Some(first) = lab.stations.first() else {
            return Err(BindError::new(
                Listener::Http,
                "",
                std::io::Error::other("the configuration names no station"),
            ));
        };
        let Listeners { http, legacy } = Listeners::bind(&first.config).await?;
        let mut listeners = LabListeners {
            http,
            legacy: vec![legacy],
        };
        for station in &lab.stations[1..] {
            listeners
                .legacy
                .push(match station.config.legacy.listen.as_str() {
                    "" => None,
                    addr => Some(
                        bind_listener(Listener::Legacy, addr)
                            .await
                            .map_err(|error| error.of_station(&station.id))?,
                    ),
                });
        }
        Ok(listeners)
    }
}

impl From<Listeners> for LabListeners {
    fn from(listeners: Listeners) -> LabListeners {
        LabListeners {
            http: listeners.http,
            legacy: vec![listeners.legacy],
        }
    }
}

async fn bind_listener(listener: Listener, addr: &str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError::new(listener, addr, source))
}

/// The sockets a gateway listens on, named as a start-up error names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Http,
    Https,
    Legacy,
    /// The embedded simulator's byte-protocol socket (`--simulator`).
    Simulator,
}

impl Listener {
    /// What the operator knows it as, and where its address comes from.
    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Listener::Http => ("the HTTP listener", "http.listen, --http"),
            Listener::Https => ("the HTTPS listener", "http.listen with [http.tls], --http"),
            Listener::Legacy => (
                "the legacy byte-protocol listener",
                "legacy.listen, --legacy",
            ),
            Listener::Simulator => ("the embedded simulator's listener", "--simulator-listen"),
        }
    }
}

/// A listening socket that could not be opened: which one, on which address, why, and what to
/// do about it.
#[derive(Debug, thiserror::Error)]
pub struct BindError {
    pub listener: Listener,
    pub addr: String,
    #[source]
    pub source: std::io::Error,
    /// The station whose listener it is, in a gateway of several.
    pub station: Option<String>,
}

impl BindError {
    pub fn new(listener: Listener, addr: impl Into<String>, source: std::io::Error) -> BindError {
        BindError {
            listener,
            addr: addr.into(),
            source,
            station: None,
        }
    }

    /// The same error, naming the station whose listener it is.
    pub fn of_station(mut self, id: &str) -> BindError {
        self.station = Some(id.to_owned());
        self
    }
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, keys) = self.listener.describe();
        let (addr, source) = (&self.addr, &self.source);
        let hint = hint(source.kind());
        let of = match &self.station {
            Some(id) => format!(" of station {id}"),
            None => String::new(),
        };
        write!(
            f,
            "cannot open {name}{of} on {addr} ({keys}): {source}{hint}"
        )
    }
}

/// What to do next, for the causes an operator meets.
fn hint(kind: std::io::ErrorKind) -> &'static str {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::AddrInUse => {
            "; another program (another gateway?) serves there: stop it or choose another address"
        }
        ErrorKind::PermissionDenied => {
            "; a port below 1024 needs root or CAP_NET_BIND_SERVICE: choose a port above 1023"
        }
        ErrorKind::AddrNotAvailable => {
            "; no interface of this host has that address: 127.0.0.1 or 0.0.0.0 always work"
        }
        _ => "",
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot use the listening socket: {0}")]
    Listener(std::io::Error),
    #[error("lease.backend: {0}")]
    LeaseBackend(crate::lease::LeaseStoreError),
    #[error("cannot resume the control lease from lease.backend: {0}")]
    LeaseResume(crate::lease::LeaseError),
    #[error("{0}")]
    Tls(#[from] crate::http::tls::TlsError),
    #[error("http.threads: cannot start the threads serving HTTP connections: {0}")]
    ConnectionThreads(std::io::Error),
    #[error("audit.dir: cannot open the audit trail: {0}")]
    Audit(std::io::Error),
    #[error("{0}")]
    LinkOwner(#[from] LinkOwnerError),
    #[error("access.rules: {0}")]
    AccessRules(#[from] crate::access_rules::LoadError),
    #[error(
        "the gateway stopped by itself: it could no longer prove it owns the station's link (see the log)"
    )]
    LinkOwnerLost,
}

/// A running gateway: one station, or every station of a lab.
pub struct GatewayHandle {
    /// The default station's (the first station's when none is the default).
    pub gateway: Arc<Gateway>,
    /// Every station, and which path goes to which.
    pub stations: Arc<Stations>,
    /// Whether HTTP is served with TLS (`https://`).
    pub tls: bool,
    pub http_addr: SocketAddr,
    /// The legacy listener of `gateway`'s station.
    pub legacy_addr: Option<SocketAddr>,
    /// Each station's legacy listener, in the lab's order.
    pub legacy_addrs: Vec<Option<SocketAddr>>,
    tasks: JoinSet<()>,
    /// The tasks that keep each station's link-owner lease (and a standby's watch): they stop
    /// last, once what was still at each station is in its ledger.
    owner_tasks: JoinSet<()>,
    /// Stops `owner_tasks`: they release the link-owner leases.
    release: CancellationToken,
    /// The threads serving HTTP connections besides the gateway's own: they stop when the
    /// handle is dropped, after `stop` has drained the connections and the changes.
    _connection_threads: crate::http::threads::ConnectionThreads,
}

impl GatewayHandle {
    pub fn link(&self) -> &LinkHandle {
        &self.gateway.link
    }

    /// The station of `id`.
    pub fn station(&self, id: &str) -> Option<&Arc<Gateway>> {
        self.stations.by_id(id)
    }

    /// `http://ADDR` (`https://` with TLS), for clients in tests.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.http_addr)
    }

    /// Waits until the station link is up (of every station).
    pub async fn connected(&self) {
        for gateway in self.stations.gateways() {
            let mut info = gateway.link.watch_info();
            let _ = info.wait_for(|info| info.connected).await;
        }
    }

    /// Stops accepting, finishes requests in flight (up to a few seconds), ends streams; then,
    /// while it still owns each station's link, writes what is still at the station into its
    /// ledger, and only then lets the link-owner leases go: a standby that takes over at once
    /// finds every change it must wait for.
    pub async fn stop(mut self) {
        self.gateway.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        // Changes still running end with the link (answered, or failed "may or may not have
        // been applied"), each with its audit line.
        for gateway in self.stations.gateways() {
            gateway.station.changes_ended(DRAIN).await;
        }
        for gateway in self.stations.gateways() {
            let owned = gateway.link_gate.as_ref().is_none_or(|gate| {
                gate.owned_at(tokio::time::Instant::now()) && gate.standing_by().is_none()
            }) && gateway.ha.standing_by().is_none();
            gateway.lease.flush_ledger(owned, DRAIN).await;
        }
        self.release.cancel();
        while self.owner_tasks.join_next().await.is_some() {}
    }
}

/// Starts the gateway's tasks on `listeners`: one station, as `config` describes it.
pub async fn start(listeners: Listeners, config: Config) -> Result<GatewayHandle, StartError> {
    start_lab(listeners.into(), Lab::single(config)).await
}

/// What the stations of one gateway share: the lease backends, the audit trail, TLS, the
/// HTTP address others reach them at, and the shutdown.
struct Shared {
    leases: Arc<LeaseBackends>,
    /// With several stations: which serves which physical station, for a lease backend no
    /// other gateway shares (a shared one says it through each station's link-owner lease).
    identities: Option<Arc<crate::lease::lab_identities::LabIdentities>>,
    audit: crate::audit::AuditLog,
    tls: Option<crate::http::tls::TlsAcceptor>,
    http_addr: SocketAddr,
    shutdown: CancellationToken,
    /// Stops the link-owner tasks, after everything else (`GatewayHandle::stop`).
    release: CancellationToken,
}

/// Starts every station of `lab` behind one HTTP listener: each station its own link, value
/// cache, control lease, change runner, events, history and legacy listener; the lease
/// backends, the audit trail (each line naming its station when there are several) and the
/// connection threads shared.
pub async fn start_lab(listeners: LabListeners, lab: Lab) -> Result<GatewayHandle, StartError> {
    let Some(first) = lab.stations.first() else {
        return Err(crate::config::ConfigError::Invalid {
            key: "station",
            message: "the configuration names no station".into(),
        }
        .into());
    };
    for station in &lab.stations {
        station.config.validate()?;
    }
    crate::config::lab::check_apart(&lab.stations)?;
    // The gateway-wide sections ([http], [audit], [access], the lease backend) are the same in
    // every station's config: the first's are read.
    let host = first.config.clone();
    // Certificate and key files are read now, not when the config was parsed.
    let tls = crate::http::tls::acceptor(&host.http.tls)?;
    let http_addr = listeners.http.local_addr().map_err(StartError::Listener)?;
    let shared = Shared {
        leases: Arc::new(
            LeaseBackends::open(&host.lease.backend)
                .await
                .map_err(StartError::LeaseBackend)?,
        ),
        audit: crate::audit::AuditLog::open(&host.audit).map_err(StartError::Audit)?,
        identities: (lab.stations.len() > 1).then(crate::lease::lab_identities::LabIdentities::new),
        tls,
        http_addr,
        shutdown: CancellationToken::new(),
        release: CancellationToken::new(),
    };
    let several = lab.stations.len() > 1;
    let ids = lab.ids();
    let mut tasks = JoinSet::new();
    let mut owner_tasks = JoinSet::new();
    let mut gateways = Vec::with_capacity(lab.stations.len());
    let mut legacy_addrs = Vec::with_capacity(lab.stations.len());
    let mut legacy = listeners.legacy.into_iter();
    for setup in lab.stations {
        // With several stations every audit line names its station, and a rule naming
        // stations applies to those only.
        // ... and every task of it runs in a span naming it, so that each station's log
        // lines are its own (`api/application/log`; the human format shows `station{id=..}`).
        let (audit, station_id, span) = if several {
            (
                shared.audit.for_station(&setup.id),
                Some(setup.id.as_str()),
                tracing::error_span!(crate::logs::STATION_SPAN, id = setup.id.as_str()),
            )
        } else {
            (shared.audit.clone(), None, tracing::Span::none())
        };
        let named = StationNames {
            several: station_id,
            id: &setup.id,
            served: &ids,
        };
        let gateway = start_station(
            setup.config,
            named,
            audit,
            &shared,
            (&mut tasks, &mut owner_tasks),
        )
        .instrument(span)
        .await?;
        let listener = legacy.next().flatten();
        legacy_addrs.push(match &listener {
            Some(listener) => Some(listener.local_addr().map_err(StartError::Listener)?),
            None => None,
        });
        if let Some(listener) = listener {
            tasks.spawn(crate::legacy::serve(
                listener,
                gateway.clone(),
                shared.shutdown.clone(),
            ));
        }
        gateways.push(gateway);
    }
    let paths = crate::http::stations::StationPaths::new(
        ids,
        lab.default_station.as_deref(),
        &host.http.path_prefix,
    );
    let default = paths.default_index().unwrap_or(0);
    let stations = Arc::new(Stations::new(gateways, paths, shared.audit.clone()));
    let connection_threads =
        crate::http::threads::ConnectionThreads::start(host.http.connection_threads())
            .map_err(StartError::ConnectionThreads)?;
    tasks.spawn(crate::http::serve(
        listeners.http,
        crate::http::HttpService {
            stations: stations.clone(),
            threads: connection_threads.placer(),
        },
        crate::http::ServeLimits::of(&host.http),
        crate::http::Shutdown {
            signal: shared.shutdown.clone(),
            drain: DRAIN,
        },
    ));
    let scheme = if shared.tls.is_some() {
        "https"
    } else {
        "http"
    };
    info!(%http_addr, "HTTP listening on {scheme}://{http_addr}");
    if several {
        info!(
            "serving {} stations: {}; each at {scheme}://{http_addr}{}/stations/ID/api/...",
            stations.gateways().len(),
            stations.paths().ids().join(", "),
            host.http.path_prefix.trim_end_matches('/')
        );
    }
    let gateway = stations.gateways()[default].clone();
    if gateway.access.enabled() {
        info!(
            keys = host.access.keys.len(),
            users = host.access.users.len(),
            "access control on"
        );
    }
    for (id, addr) in stations.paths().ids().iter().zip(&legacy_addrs) {
        if let Some(addr) = addr {
            if several {
                info!(%addr, "legacy byte-protocol listener of station {id} on {addr}");
            } else {
                info!(%addr, "legacy byte-protocol listener on {addr}");
            }
        }
    }
    Ok(GatewayHandle {
        tls: shared.tls.is_some(),
        legacy_addr: legacy_addrs[default],
        gateway,
        stations,
        http_addr,
        legacy_addrs,
        tasks,
        owner_tasks,
        release: shared.release.clone(),
        _connection_threads: connection_threads,
    })
}

/// What a station is called: its id in a gateway of several (in its published URL, its state
/// file, the lab's identities), its id whatever the count (the access rules are compiled for
/// it), and every station the gateway serves.
struct StationNames<'a> {
    several: Option<&'a str>,
    id: &'a str,
    served: &'a [String],
}

/// Starts one station's tasks (its link, link-owner lease or standby watch, control lease,
/// access rules, events, history) and returns its [`Gateway`].
async fn start_station(
    config: Config,
    named: StationNames<'_>,
    audit: crate::audit::AuditLog,
    shared: &Shared,
    (tasks, owner_tasks): (&mut JoinSet<()>, &mut JoinSet<()>),
) -> Result<Arc<Gateway>, StartError> {
    let station_id = named.several;
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
    let access = crate::credentials::AccessControl::new(&config.access);
    let shutdown = shared.shutdown.clone();
    let (link_task, link) = LinkTask::with_max_processing(settings, config.max_processing());
    let leases = shared.leases.clone();
    // One gateway per station: with a backend others can reach, take the link-owner lease
    // before the link touches the station (or, a standby, watch it until it lapses).
    let standby = config.ha.mode == HaMode::Standby;
    let (ownership, standing_by) = if BackendUrl::parse(leases.default_url())
        .map_err(StartError::LeaseBackend)?
        .is_shared()
    {
        let scheme = if shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let published = match config.ha.advertise_url.as_str() {
            "" => format!("{scheme}://{}", shared.http_addr),
            url => url.trim_end_matches('/').to_owned(),
        };
        // A station of several is reached at its own base URL: where a standby points its
        // clients, and what tells this station's leases from its neighbours'.
        let published = match station_id {
            Some(id) => format!("{published}/stations/{id}"),
            None => published,
        };
        let me = owner_label(std::process::id(), &published);
        let timing = config.link_owner_timing();
        let name = config.link_owner_key();
        // Each station of several its own state file (each is locked by its owner).
        let state_path = config
            .lease
            .link_owner_state_path()
            .map(|path| match station_id {
                Some(id) => crate::config::lab::station_file(&path, id),
                None => path,
            });
        let state = match state_path {
            Some(path) => Some(OwnerState::open(&path).map_err(LinkOwnerError::from)?),
            None => None,
        };
        if standby {
            let watch = Standby {
                store: leases.default_store(),
                name: LinkOwnership::name_for(&name),
                me,
                timing,
                state,
                gate: Arc::new(crate::link::OwnerGate::new(tokio::time::Instant::now())),
                role: Arc::new(HaRole::standby()),
                station_id: config.station_id(),
            };
            (None, Some(watch))
        } else {
            let claimed =
                LinkOwnership::claim(leases.default_store(), &name, me, timing, state).await?;
            (Some(claimed.with_station_id(config.station_id())), None)
        }
    } else {
        (None, None)
    };
    // Several stations on a backend only this process sees: the stations of this gateway
    // still never serve one physical station twice.
    let identity_gate = match (&ownership, &standing_by, &shared.identities) {
        (None, None, Some(identities)) => Some((
            identities.clone(),
            Arc::new(crate::link::OwnerGate::open_for_good(
                tokio::time::Instant::now(),
            )),
        )),
        _ => None,
    };
    // Someone else may read what the station is owed (a restart, a standby, another gateway,
    // another station of this one): its ledger is kept, and read when the link meets it.
    let ledger_kept = ownership.is_some() || standing_by.is_some() || identity_gate.is_some();
    let ha = match &standing_by {
        Some(watch) => watch.role.clone(),
        None => Arc::new(HaRole::owner()),
    };
    let (lease_events, _) = broadcast::channel(64);
    let lease = ControlLease::new(
        leases.default_store(),
        config.control_lease_name(),
        lease_events.clone(),
    )
    .with_end_timing(LeaseEndTiming {
        read_back_after: config.max_processing(),
        tolerance: config.lease.safe_state_tolerance,
        lock_delay: config.lock_delay(),
    })
    .with_safe_state(link.clone(), config.lease.safe_state.clone())
    .with_notices(crate::audit::lease_lines::lease_hook(audit.clone()));
    let lease = match ledger_kept {
        true => lease.with_station_ledger(),
        false => lease,
    };
    // With a backend that outlives the process, the lease held before a restart is still held:
    // never start believing nobody holds it when the backend cannot say. (A standby resumes
    // it when it takes over.)
    if standing_by.is_none() {
        lease.resume().await.map_err(StartError::LeaseResume)?;
    }
    let lease = Arc::new(lease);
    let adopter = adopter_of(&lease);
    let identity_gate = identity_gate.map(|(identities, gate)| {
        tasks.spawn(
            identities
                .serve(
                    station_id.unwrap_or_default().to_owned(),
                    gate.clone(),
                    Some(adopter.clone()),
                    shutdown.clone(),
                )
                .in_current_span(),
        );
        gate
    });
    let access_rules = if config.access.rules.is_empty() {
        crate::access_rules::AccessRules::off()
    } else {
        // Compiled for the station's id however many stations this gateway serves: a rule
        // naming only other stations is never in force here.
        crate::access_rules::AccessRules::load_for_station(
            std::path::Path::new(&config.access.rules),
            Some(named.id),
            named.served,
        )?
    }
    .with_legacy_group(Some(&config.legacy.access_group));
    let station = crate::station::Station::new(link.clone(), audit.clone())
        .with_access_rules(access_rules.clone());
    let (history, archive) = start_history(&config.history, &link);
    let lease_view = {
        let lease = lease.clone();
        Box::new(move || lease.view())
    };
    let events = crate::events::Events::new(
        config.events.clone(),
        station.clone(),
        lease_view,
        shutdown.clone(),
    );
    let (link_events, lease_receiver) = (link.subscribe_events(), lease_events.subscribe());
    let config_files_config = config.config_files.clone();
    // The gate the link checks (below), also asked by every door that acts on the station.
    let link_gate = match (&ownership, &standing_by) {
        (Some(ownership), _) => Some(ownership.gate()),
        (None, Some(watch)) => Some(watch.gate.clone()),
        (None, None) => identity_gate,
    };
    let gateway = Arc::new(Gateway {
        config,
        link,
        station,
        started: Instant::now(),
        shutdown: shutdown.clone(),
        lease_events,
        lease,
        leases,
        events,
        metrics: crate::http::ops::new_metrics(),
        access,
        audit,
        config_files: crate::config_files::ConfigFiles::new(&config_files_config),
        numeric: Default::default(),
        ha,
        link_gate: link_gate.clone(),
        history,
        history_archive: archive.as_ref().map(|(reader, ..)| reader.clone()),
        tls: shared.tls.clone(),
        lab_station_id: station_id.map(str::to_owned),
        log_span: tracing::Span::current(),
    });
    // Self-fencing: the link sends only while the link-owner lease is provably this gateway's.
    let link_task = match link_gate {
        Some(gate) => link_task.with_owner_gate(gate),
        None => link_task,
    };
    if let Some(ownership) = ownership {
        if ownership.taken_back() {
            gateway
                .lease
                .after_a_crash(gateway.config.max_processing())
                .await;
        }
        owner_tasks.spawn(
            ownership
                .with_adopter(adopter)
                .keep(shared.release.clone(), shutdown.clone())
                .in_current_span(),
        );
    }
    if let Some(watch) = standing_by {
        owner_tasks
            .spawn(stand_by(watch, gateway.clone(), shared.release.clone()).in_current_span());
    }
    tasks.spawn(link_task.run(shutdown.clone()).in_current_span());
    access_rules.spawn_reloader(shutdown.clone());
    tasks.spawn(
        crate::access_rules::report_unmatched(
            access_rules.clone(),
            gateway.link.watch_info(),
            shutdown.clone(),
        )
        .in_current_span(),
    );
    tasks.spawn(
        crate::station::watch_interlocks(gateway.station.clone(), shutdown.clone())
            .in_current_span(),
    );
    tasks.spawn(
        gateway
            .lease
            .clone()
            .run_expiry(shutdown.clone())
            .in_current_span(),
    );
    tasks.spawn(
        crate::events::scheduler::run(gateway.events.clone(), shutdown.clone()).in_current_span(),
    );
    if let (Some(history), Some((_, queue, settings))) = (&gateway.history, archive) {
        tasks.spawn(
            crate::history::archive::writer::run(
                history.clone(),
                queue,
                settings,
                shutdown.clone(),
            )
            .in_current_span(),
        );
    }
    if let Some(history) = &gateway.history {
        tasks.spawn(
            crate::history::task::run(
                history.clone(),
                gateway.station.clone(),
                gateway.link.watch_info(),
                gateway.config.history.clone(),
                shutdown.clone(),
            )
            .in_current_span(),
        );
    }
    tasks.spawn(
        crate::events::relay::run(
            gateway.events.clone(),
            link_events,
            lease_receiver,
            shutdown.clone(),
        )
        .in_current_span(),
    );
    Ok(gateway)
}

/// A standby's life: watch the owner's link-owner lease until it lapses, take it, wait the
/// lock-delay (after a lapse), resume the control lease from the store (its holder keeps its id and fence; a safe state owed is
/// applied by the lease task once the link is up), and only then serve, announcing the
/// failover in the audit trail. From then on it owns the station like any owner.
async fn stand_by(watch: Standby, gateway: Arc<Gateway>, release: CancellationToken) {
    let shutdown = gateway.shutdown.clone();
    let (me, retry) = (watch.me.clone(), watch.timing.renew_every);
    let Some(taken) = watch.until_lapsed(&shutdown).await else {
        return;
    };
    // Renewals (and the station identity's verdict the link waits for, which reads the
    // station's ledger once the control lease is resumed) go on meanwhile.
    let gate = taken.ownership.gate();
    let taken_back = taken.ownership.taken_back();
    let keep = taken
        .ownership
        .with_adopter(adopter_of(&gateway.lease))
        .keep(release, shutdown.clone());
    tokio::pin!(keep);
    let resumed = async {
        // After a lapse, the lock-delay first: a holder's request still queued at a paused old
        // owner may yet change the control lease in the store; it is read after that. Until
        // then requests are answered as by a standby.
        let mut reopenings = gate.reopenings();
        while !gate.owned_at(tokio::time::Instant::now()) {
            if reopenings.changed().await.is_err() {
                break;
            }
        }
        // A standby that took its own lease back after a crash: what the crashed run had at
        // the station counts as in doubt, as at an owner's crash restart.
        if taken_back {
            gateway
                .lease
                .after_a_crash(gateway.config.max_processing())
                .await;
        }
        while let Err(why) = gateway.lease.resume().await {
            tracing::warn!(
                "taking over: cannot resume the control lease from lease.backend ({why}); trying again"
            );
            tokio::time::sleep(retry).await;
        }
    };
    tokio::select! {
        () = &mut keep => return,
        () = resumed => {}
    }
    let lease = gateway.lease.view();
    gateway
        .audit
        .note_change(crate::audit::lease_lines::failover_line(
            &me,
            taken.previous_owner.as_deref(),
            lease.owner.as_deref(),
            std::time::SystemTime::now(),
        ));
    gateway.ha.took_over();
    info!(
        previous = taken.previous_owner.as_deref().unwrap_or("unknown"),
        lapsed = taken.lapsed,
        "failover: this gateway owns the station now"
    );
    keep.await;
}

/// What reads the station's ledger and takes its duties over once the link met the station:
/// the control lease's [`ControlLease::adopt_station`].
fn adopter_of(lease: &Arc<ControlLease>) -> crate::lease::ledger::Adopter {
    let lease = lease.clone();
    Arc::new(move |identity: String| {
        let lease = lease.clone();
        Box::pin(async move { lease.adopt_station(&identity).await })
    })
}

/// The samples the archive's queue holds while the writer is busy (a COPY, a stalled
/// database until it times out): minutes at 1 000 samples/s.
const ARCHIVE_QUEUE: usize = 200_000;

/// The archive: its reader, the writer's queue and settings.
type ArchiveParts = (
    Arc<ArchiveReader>,
    tokio::sync::mpsc::Receiver<ArchivedSample>,
    WriterSettings,
);

/// The value history's recorder, fed by the value cache, and with `[history] archive` its
/// archive's parts.
fn start_history(
    config: &crate::config::HistoryConfig,
    link: &LinkHandle,
) -> (Option<Arc<History>>, Option<ArchiveParts>) {
    if !config.enabled {
        return (None, None);
    }
    let (queue, archive) = match config.archive.as_str() {
        "" => (None, None),
        url => {
            let (queue, receiver) = tokio::sync::mpsc::channel(ARCHIVE_QUEUE);
            let reader = Arc::new(ArchiveReader::new(url.into(), config.archive_table.clone()));
            let settings = WriterSettings {
                url: url.into(),
                table: config.archive_table.clone(),
                spool: config.spool.clone(),
                retention_days: config.retention_days,
            };
            (Some(queue), Some((reader, receiver, settings)))
        }
    };
    let history = Arc::new(History::new(
        Limits {
            samples_per_channel: config.samples_per_channel,
            max_channels: config.max_channels,
            min_spacing_ms: config.interval_ms,
        },
        WallClock::now(),
        queue,
    ));
    link.cache().observe(history.clone());
    (Some(history), archive)
}

/// Runs the gateway until `shutdown` completes, then stops it gracefully.
pub async fn run(
    listeners: Listeners,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    run_lab(listeners.into(), Lab::single(config), shutdown).await
}

/// Runs every station of `lab` until `shutdown` completes, then stops them gracefully. A
/// station whose link-owner lease is lost stops the whole process (as one station's gateway
/// does), so that a standby takes the stations over.
pub async fn run_lab(
    listeners: LabListeners,
    lab: Lab,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let handle = start_lab(listeners, lab).await?;
    let stopped_by_itself = handle.gateway.shutdown.clone();
    tokio::select! {
        () = shutdown => {}
        () = stopped_by_itself.cancelled() => {
            handle.stop().await;
            return Err(StartError::LinkOwnerLost);
        }
    }
    info!("shutting down");
    handle.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_bind_error_names_its_listener_its_address_and_what_to_do() {
        let error = BindError::new(
            Listener::Legacy,
            "127.0.0.1:4001",
            Error::from(ErrorKind::AddrInUse),
        );
        let text = error.to_string();
        assert!(
            text.starts_with(
                "cannot open the legacy byte-protocol listener on 127.0.0.1:4001 \
                 (legacy.listen, --legacy): "
            ),
            "{text}"
        );
        assert!(
            text.ends_with("stop it or choose another address"),
            "{text}"
        );
    }

    #[test]
    fn every_listener_has_its_own_name() {
        let names: Vec<_> = [
            Listener::Http,
            Listener::Https,
            Listener::Legacy,
            Listener::Simulator,
        ]
        .map(|listener| listener.describe().0)
        .into();
        for (at, name) in names.iter().enumerate() {
            assert!(!names[at + 1..].contains(name), "{name} twice");
        }
    }
}
