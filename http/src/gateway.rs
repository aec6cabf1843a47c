//! A station as the HTTP front end serves it: the station's runtime (the core's, started by
//! `StationRuntime::start`), its event streams and who may do what over HTTP.

use std::sync::Arc;

use station_core::runtime::StationRuntime;

/// What every request handler of one station shares. It reads as the station's runtime
/// (`gateway.link`, `gateway.lease`, ...) plus what only HTTP has.
pub struct Gateway {
    /// Everything the station needs, whatever front end serves it.
    pub runtime: Arc<StationRuntime>,
    /// Open event streams and their subscriptions.
    pub events: Arc<crate::events::Events>,
    /// Who may do what over HTTP; off while no credentials are configured.
    pub access: crate::credentials::AccessControl,
    /// HTTPS, while `[http.tls]` names a certificate and key.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Gateway {
    /// The HTTP front end of `runtime`: its event streams, whose scheduler and relay run among
    /// the station's tasks, and its access control.
    pub fn start(
        runtime: Arc<StationRuntime>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Arc<Gateway> {
        let lease_view = {
            let lease = runtime.lease.clone();
            Box::new(move || lease.view())
        };
        let shutdown = runtime.shutdown.clone();
        let events = crate::events::Events::new(
            runtime.config.events.clone(),
            runtime.station.clone(),
            lease_view,
            shutdown.clone(),
        );
        let (link_events, lease_events) = (
            runtime.link.subscribe_events(),
            runtime.lease_events.subscribe(),
        );
        runtime.spawn(crate::events::scheduler::run(
            events.clone(),
            shutdown.clone(),
        ));
        runtime.spawn(crate::events::relay::run(
            events.clone(),
            link_events,
            lease_events,
            shutdown,
        ));
        Arc::new(Gateway {
            access: crate::credentials::AccessControl::new(&runtime.config.access),
            runtime,
            events,
            tls,
        })
    }
}

impl std::ops::Deref for Gateway {
    type Target = StationRuntime;

    fn deref(&self) -> &StationRuntime {
        &self.runtime
    }
}
