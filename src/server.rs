//! The gateway as a whole: how it starts, and how it stops.
//!
//! [`run`] is the entry point `main` uses; tests use [`start`] to get a [`GatewayHandle`]
//! with the bound addresses and the link.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::info;

use crate::config::Config;
use crate::config::lab::Lab;
use crate::gateway::Gateway;
use crate::http::lab::{GatewayWide, Stations};
use crate::link::LinkHandle;
use crate::runtime::{DRAIN, LabShared, StationRuntime, StationStartError, stop_stations};

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
    #[error(transparent)]
    Station(#[from] StationStartError),
    #[error("cannot use the listening socket: {0}")]
    Listener(std::io::Error),
    #[error("{0}")]
    Tls(#[from] crate::http::tls::TlsError),
    #[error("http.threads: cannot start the threads serving HTTP connections: {0}")]
    ConnectionThreads(std::io::Error),
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
    /// The front ends' accept loops (HTTP, each legacy listener).
    front_ends: JoinSet<()>,
    /// What the stations share; its shutdown stops everything.
    lab: LabShared,
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

    /// Stops accepting, finishes requests in flight (up to a few seconds), ends streams; then
    /// stops every station in order (`runtime::stop_stations`): while it still owns each
    /// station's link, it writes what is still at the station into its ledger, and only then
    /// lets the link-owner leases go: a standby that takes over at once finds every change it
    /// must wait for.
    pub async fn stop(mut self) {
        self.lab.shutdown.cancel();
        while self.front_ends.join_next().await.is_some() {}
        let runtimes: Vec<_> = self
            .stations
            .gateways()
            .iter()
            .map(|gateway| gateway.runtime.clone())
            .collect();
        stop_stations(&runtimes, DRAIN).await;
    }
}

impl Drop for GatewayHandle {
    /// A handle dropped without `stop` ends every task at once, nothing released (as after
    /// `kill -9`); after `stop` nothing is left to end.
    fn drop(&mut self) {
        self.front_ends.abort_all();
        for gateway in self.stations.gateways() {
            gateway.runtime.abort();
        }
    }
}

/// Starts the gateway's tasks on `listeners`: one station, as `config` describes it.
pub async fn start(listeners: Listeners, config: Config) -> Result<GatewayHandle, StartError> {
    start_lab(listeners.into(), Lab::single(config)).await
}

/// Starts every station of `lab` behind one HTTP listener: each station's runtime
/// (`StationRuntime::start`) with its HTTP front end and legacy listener; the lease backends,
/// the audit trail (each line naming its station when there are several) and the connection
/// threads shared.
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
    // The gateway-wide sections ([http], [audit], [access], [events], the lease backend) are
    // the same in every station's config.
    let wide = first.config.clone();
    // Certificate and key files are read now, not when the config was parsed.
    let tls = crate::http::tls::acceptor(&wide.http.tls)?;
    let http_addr = listeners.http.local_addr().map_err(StartError::Listener)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let shared = LabShared::open(&wide, lab.ids(), format!("{scheme}://{http_addr}"))
        .await?
        .with_endpoint_labels(crate::http::ops::metric_labels());
    let several = shared.several();
    let mut front_ends = JoinSet::new();
    let mut gateways = Vec::with_capacity(lab.stations.len());
    let mut legacy_addrs = Vec::with_capacity(lab.stations.len());
    let mut legacy = listeners.legacy.into_iter();
    for setup in lab.stations {
        let runtime = StationRuntime::start(setup, &shared).await?;
        let listener = legacy.next().flatten();
        legacy_addrs.push(match &listener {
            Some(listener) => Some(listener.local_addr().map_err(StartError::Listener)?),
            None => None,
        });
        if let Some(listener) = listener {
            front_ends.spawn(station_legacy::serve(
                listener,
                runtime.clone(),
                shared.shutdown.clone(),
            ));
        }
        gateways.push(Gateway::start(runtime, tls.clone()));
    }
    let paths = crate::http::stations::StationPaths::new(
        shared.served.clone(),
        lab.default_station.as_deref(),
        &wide.http.path_prefix,
    );
    let default = paths.default_index().unwrap_or(0);
    let gateway_wide = GatewayWide {
        http: wide.http.clone(),
        max_lab_streams: wide.events.max_streams,
        access: crate::credentials::AccessControl::new(&wide.access),
        tls: tls.clone(),
        connections: shared.connections.clone(),
        started: Instant::now(),
        shutdown: shared.shutdown.clone(),
    };
    let stations = Arc::new(Stations::new(
        gateways,
        paths,
        gateway_wide,
        shared.audit.clone(),
    ));
    let connection_threads =
        crate::http::threads::ConnectionThreads::start(wide.http.connection_threads())
            .map_err(StartError::ConnectionThreads)?;
    front_ends.spawn(crate::http::serve(
        crate::http::HttpListener {
            tcp: listeners.http,
            tls: tls.clone(),
            threads: connection_threads.placer(),
            counters: shared.connections.clone(),
        },
        Arc::new(crate::http::lab::LabService::new(stations.clone())),
        crate::http::ServeLimits::of(&wide.http),
        crate::http::Shutdown {
            signal: shared.shutdown.clone(),
            drain: DRAIN,
        },
    ));
    info!(%http_addr, "HTTP listening on {scheme}://{http_addr}");
    if several {
        info!(
            "serving {} stations: {}; each at {scheme}://{http_addr}{}/stations/ID/api/...",
            stations.gateways().len(),
            stations.paths().ids().join(", "),
            wide.http.path_prefix.trim_end_matches('/')
        );
    }
    if stations.wide().access.enabled() {
        info!(
            keys = wide.access.keys.len(),
            users = wide.access.users.len(),
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
        tls: tls.is_some(),
        legacy_addr: legacy_addrs[default],
        gateway: stations.gateways()[default].clone(),
        stations,
        http_addr,
        legacy_addrs,
        front_ends,
        lab: shared,
        _connection_threads: connection_threads,
    })
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
    let stopped_by_itself = handle.lab.shutdown.clone();
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
