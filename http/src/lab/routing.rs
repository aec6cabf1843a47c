//! The lab's own service, what [`crate::server::serve`] answers with: what a browser may ask,
//! which station a request is for (by its path, `stations.rs`), the reserve of connections
//! kept for health checks and the lease, and the body's time limits; then the station's
//! endpoint table (`routes::handle`) or the lab's own paths ([`super::answer`]).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue};
use hyper::{Request, Response, Version};

use super::Stations;
use crate::body;
use crate::browser::{self, BrowserRules, RequestSite};
use crate::error::ApiError;
use crate::reply::{Body, error_response};
use crate::routes;
use crate::server::connections::{SlotKind, is_reserved_request};
use crate::server::idle::ConnectionUse;
use crate::server::{Answer, ConnectionInfo};
use crate::stations::StationRoute;

/// Every station of the gateway behind one listener, and what a browser may ask of it.
pub struct LabService {
    stations: Arc<Stations>,
    /// What a browser may ask: the host names, the sites, CORS (`[http]`).
    browser: BrowserRules,
}

impl LabService {
    pub fn new(stations: Arc<Stations>) -> LabService {
        let browser = BrowserRules::new(&stations.wide().http, stations.wide().tls.is_some());
        LabService { stations, browser }
    }
}

impl Answer for LabService {
    fn answer(
        &self,
        request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> impl Future<Output = Response<Body>> + Send {
        answer(self, request, connection)
    }
}

/// Answers one request: first what its browser may ask (a host name the gateway is not known
/// by is 421, on every path, before routing; a CORS preflight is answered here), then
/// [`answer_routed`]; a page of a listed origin may read the answer (CORS).
async fn answer(
    service: &LabService,
    request: Request<Incoming>,
    connection: &ConnectionInfo,
) -> Response<Body> {
    let browser = &service.browser;
    let (head, body) = request.into_parts();
    let answered_here = match browser.host_refusal(&head) {
        Some(refusal) => {
            let response = error_response(&refusal);
            service
                .stations
                .note_unrouted(&head, connection.peers.remote, response.status());
            Some(response)
        }
        None => browser.preflight(&head),
    };
    if let Some(response) = answered_here {
        // A reserved connection serves what the reserve is for, then closes.
        return if connection.kind == SlotKind::Reserved {
            closing(response, head.version < Version::HTTP_2, &connection.usage)
        } else {
            response
        };
    }
    let site = browser.site(&head);
    let cors = browser.cors_origin(&head);
    let mut response = answer_routed(service, connection, head, body, site).await;
    if let Some(origin) = cors {
        browser::allow_origin(&mut response, origin);
    }
    response
}

/// Answers one request within the body time limits; on a reserved connection only what the
/// reserve is for. A timed-out body and a reserved connection end the connection after the
/// answer (HTTP/1: `Connection: close`; HTTP/2: GOAWAY once no request is in progress).
async fn answer_routed(
    service: &LabService,
    connection: &ConnectionInfo,
    mut head: hyper::http::request::Parts,
    body: Incoming,
    site: RequestSite,
) -> Response<Body> {
    let stations = &service.stations;
    let ConnectionInfo {
        usage,
        peers,
        kind,
        limits,
    } = connection;
    let (peers, kind, limits) = (*peers, *kind, *limits);
    let wide = stations.wide();
    let http = &wide.http;
    let http1 = head.version < Version::HTTP_2;
    let reserved = kind == SlotKind::Reserved;
    // Which station the request is for: one station's paths are all its own (and also under
    // `/stations/{id}`), so its requests pass here without a copy.
    let index = match stations.paths().route(head.uri.path()) {
        StationRoute::Station { index, path } => {
            if let std::borrow::Cow::Owned(path) = path {
                let sent = crate::stations::SentPath(head.uri.path().to_owned());
                head.uri = with_path(&head.uri, &path);
                head.extensions.insert(sent);
            }
            Some(index)
        }
        StationRoute::Lab => None,
        route => {
            let error = ApiError::not_found(stations.paths().not_found(&route));
            let response = error_response(&error);
            stations.note_unrouted(&head, peers.remote, response.status());
            return if reserved {
                closing(response, http1, usage)
            } else {
                response
            };
        }
    };
    if reserved && !is_reserved_request(&http.path_prefix, &head.method, head.uri.path()) {
        wide.connections.refused.reserve_only.inc();
        let error = ApiError::overloaded(format!(
            "the gateway is at its connection limit ({} connections): only health checks and renewing or releasing a lease are served now; try again shortly",
            limits.max_connections
        ));
        return closing(error_response(&error), http1, usage);
    }
    let Some(index) = index else {
        let below = head
            .uri
            .path()
            .strip_prefix(stations.paths().prefix())
            .unwrap_or_default();
        let below = below.to_owned();
        let answered = Box::pin(super::answer(
            stations,
            &head,
            body,
            peers.remote,
            &below,
            site,
        ));
        let (response, timed_out) = body::with_body_limits(limits.body, answered).await;
        if timed_out.is_some() {
            wide.connections.timeouts.body.inc();
        }
        return if reserved || timed_out.is_some() {
            closing(response, http1, usage)
        } else {
            response
        };
    };
    let gateway = &stations.gateways()[index];
    // A body that timed out is logged by `handle`, which knows the request's redacted path.
    // Boxed where it is made: the request's future (0.9 KB) is then moved as a pointer, not
    // copied into the body limits' scope and again into `answer`'s own box.
    let handled = Box::pin(routes::handle(gateway, head, body, peers, site));
    let (response, timed_out) = body::with_body_limits(limits.body, handled).await;
    if timed_out.is_some() {
        wide.connections.timeouts.body.inc();
        return closing(response, http1, usage);
    }
    if reserved {
        return closing(response, http1, usage);
    }
    response
}

/// `uri` with its path replaced by `path` (the station's own path of a
/// `/stations/{id}/...` request), its query kept.
fn with_path(uri: &hyper::Uri, path: &str) -> hyper::Uri {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // A path cut from a valid one at a `/` is valid: only if it were not would the URI stay.
    match path_and_query.parse() {
        Ok(path_and_query) => parts.path_and_query = Some(path_and_query),
        Err(_) => return uri.clone(),
    }
    hyper::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// `response`, and the connection closes after it: HTTP/1 by `Connection: close`, HTTP/2
/// (which has no such header) by a GOAWAY once no request is in progress.
fn closing(mut response: Response<Body>, http1: bool, usage: &ConnectionUse) -> Response<Body> {
    if http1 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    } else {
        usage.close_when_idle();
    }
    response
}
