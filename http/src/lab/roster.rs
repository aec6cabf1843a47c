//! The roster: every station one gateway serves, in the configuration's order, each station's
//! [`Gateway`] and which path goes to which ([`StationPaths`]), what HTTP holds for the whole
//! gateway ([`GatewayWide`]), and how `GET /v1/stations` shows them.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::http::request::Parts;
use serde_json::{Value as Json, json};

use crate::gateway::Gateway;
use crate::ops;
use crate::stations::StationPaths;

/// What the HTTP front end holds for the whole gateway, whatever station a request is for:
/// read from the gateway-wide sections of the configuration (`[http]`, `[access]`,
/// `[events]`), never from one of its stations.
pub struct GatewayWide {
    /// `[http]`: limits, host names, sites, the path prefix.
    pub http: crate::config::HttpConfig,
    /// How many lab event streams may be open at once (`events.max_streams`).
    pub max_lab_streams: usize,
    /// Who may do what on the lab's own paths (`[access]`).
    pub access: crate::credentials::AccessControl,
    /// HTTPS, while `[http.tls]` names a certificate and key.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The HTTP connections' timeouts, refusals and evictions, and the lab's own access
    /// refusals, shared by every station's metrics.
    pub connections: crate::metrics::ConnectionCounters,
    pub started: std::time::Instant,
    /// Cancelled when the gateway shuts down; the lab's streams end with it.
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// Every station of the gateway, in the configuration's order, and which path goes to which.
pub struct Stations {
    gateways: Vec<Arc<Gateway>>,
    paths: StationPaths,
    /// What HTTP holds for the whole gateway.
    wide: GatewayWide,
    /// The lab's event stream: its events, numbered once for every reader.
    pub(super) lab_events: super::stream::LabEvents,
    /// The audit trail as the whole gateway writes it (its lines name no station).
    audit: crate::audit::AuditLog,
}

impl Stations {
    /// `gateways` in the order of the ids `paths` was made with; `audit` the trail they share,
    /// as the whole gateway writes it.
    pub fn new(
        gateways: Vec<Arc<Gateway>>,
        paths: StationPaths,
        wide: GatewayWide,
        audit: crate::audit::AuditLog,
    ) -> Stations {
        assert_eq!(
            gateways.len(),
            paths.ids().len(),
            "one gateway for each station id"
        );
        assert!(
            !gateways.is_empty(),
            "a gateway serves at least one station"
        );
        Stations {
            gateways,
            paths,
            wide,
            lab_events: super::stream::LabEvents::default(),
            audit,
        }
    }

    pub fn gateways(&self) -> &[Arc<Gateway>] {
        &self.gateways
    }

    pub fn paths(&self) -> &StationPaths {
        &self.paths
    }

    /// What HTTP holds for the whole gateway: settings, TLS, access control, connection
    /// counters.
    pub fn wide(&self) -> &GatewayWide {
        &self.wide
    }

    /// A request for a station's path that no station takes (`/stations/{unknown}/...`, or a
    /// station's path with several stations and no default): its line in the audit trail, as
    /// every `api/` request has one, naming no station.
    pub fn note_unrouted(&self, head: &Parts, peer: SocketAddr, status: hyper::StatusCode) {
        let path = crate::redact::loggable_path(head.uri.path());
        let line = crate::audit::RequestLine {
            at: std::time::SystemTime::now(),
            ip: Some(peer.ip()),
            method: head.method.as_str(),
            path: &path,
            status: Some(status.as_u16()),
            duration: None,
        };
        self.audit.note_with(|out| line.render_into(out, None));
    }

    /// A change of the lab's own (its safe stop) refused before it reached any station: its
    /// line in the audit trail, with its caller and the refusal, naming no station.
    pub fn note_refused_change(
        &self,
        head: &Parts,
        peer: SocketAddr,
        status: hyper::StatusCode,
        caller: Option<String>,
    ) {
        let path = crate::redact::loggable_path(head.uri.path());
        let line = crate::audit::RequestLine {
            at: std::time::SystemTime::now(),
            ip: Some(peer.ip()),
            method: head.method.as_str(),
            path: &path,
            status: Some(status.as_u16()),
            duration: None,
        };
        let fields = crate::audit::ChangeFields {
            caller,
            outcome: Some(crate::audit::Outcome::Refused),
            ..crate::audit::ChangeFields::default()
        };
        self.audit
            .note_with(|out| line.render_into(out, Some(&fields)));
    }

    /// The station of `id`.
    pub fn by_id(&self, id: &str) -> Option<&Arc<Gateway>> {
        let index = self.paths.ids().iter().position(|known| known == id)?;
        self.gateways.get(index)
    }
}

/// Every station as `GET /v1/stations` shows it.
pub fn station_views(stations: &Stations) -> Vec<Json> {
    let prefix = stations.paths.prefix();
    let default = stations.paths.default_index();
    stations
        .paths
        .ids()
        .iter()
        .zip(&stations.gateways)
        .enumerate()
        .map(|(index, (id, gateway))| {
            let info = gateway.link.info();
            let hello = info.hello.as_ref();
            let lease = gateway.lease.view();
            json!({
                "id": id,
                "path": format!("{prefix}/stations/{id}"),
                "default": default == Some(index),
                "connected": info.connected,
                "lastError": info.last_error,
                "ready": ops::readiness(gateway).is_ok(),
                "standby": gateway.ha.standing_by(),
                "name": hello.map(|h| h.station.clone()),
                "serial": hello.map(|h| h.serial.clone()),
                "holder": lease.owner,
                "expiresInMs": lease.expires_in_ms,
                "lockDelayMs": lease.lock_delay_ms,
                "lockDelayReason": lease.lock_delay_reason,
                "safeState": {
                    "channels": gateway
                        .config
                        .lease
                        .safe_state
                        .iter()
                        .map(|write| write.channel.as_str())
                        .collect::<Vec<_>>(),
                    "owed": lease.safe_state,
                },
                "leaseName": gateway.lease.name(),
                "accessRules": access_rules_view(gateway),
            })
        })
        .collect()
}

/// A station's access rules as `GET /v1/stations` shows them: the version in force and the
/// rules that name only stations this gateway does not serve; `null` without a rules file.
fn access_rules_view(gateway: &Gateway) -> Json {
    let rules = gateway.station.access_rules();
    if !rules.enabled() {
        return Json::Null;
    }
    json!({
        "version": rules.version(),
        "rulesForOtherStations": rules.unserved_said(),
    })
}
