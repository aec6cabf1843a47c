//! The lab: every station one gateway serves, and the whole gateway's own answers once it
//! serves several. [`Stations`] ([`roster`]) holds each station's gateway and which
//! path goes to which; [`answer`] serves the lab's paths: `GET /v1/stations` (each
//! station's link, lease and safe state), `/v1/stations/events` (the lab's one event stream,
//! [`stream`]), `POST /v1/safe-stop` (every station's safe stop at once, [`safe_stop`]),
//! `/metrics` (every station's series with a `station` label), `/healthz`, `/readyz` (which
//! stations are reached) and the lab's status page.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Response};
use serde_json::{Value as Json, json};

use crate::allow::Allowed;
use crate::browser::{RequestSite, cross_site_refusal};
use crate::config::Role;
use crate::error::ApiError;
use crate::metrics::lab::{GATEWAY_WIDE_FAMILIES, merge_expositions};
use crate::ops;
use crate::reply::{Body, error_response, json_response};

pub mod roster;
pub mod routing;
pub mod safe_stop;
pub mod stream;

pub use roster::{GatewayWide, Stations, station_views};
pub use routing::LabService;

/// The lab's status page: every station, its link and its lease, each linking to its own page.
const LAB_PAGE: &str = include_str!("lab.html");

/// Answers a request for one of the lab's own paths (`below`: its path below
/// `http.path_prefix`); never fails: every error is a JSON error answer.
pub async fn answer(
    stations: &Arc<Stations>,
    head: &Parts,
    body: Incoming,
    peer: SocketAddr,
    below: &str,
    site: RequestSite,
) -> Response<Body> {
    let answered = if below == "/v1/safe-stop" {
        if let Some(refusal) = crate::browser::malformed_host(head) {
            Err(refusal)
        } else if site == RequestSite::Elsewhere && head.method == Method::POST {
            // A page of another site presses no station's safe stop; the refusal is in the
            // trail as the press would have been.
            let refusal = cross_site_refusal(head, stations.wide().tls.is_some());
            let caller = stations.wide().access.caller(&head.headers);
            stations.note_refused_change(head, peer, refusal.status(), caller);
            Err(refusal)
        } else {
            safe_stop::press(stations, head, body, peer).await
        }
    } else {
        answer_or_refuse(stations, head, below)
    };
    match answered {
        Ok(response) => response,
        Err(error) => {
            let mut response = error_response(&error);
            // As for a station's request: counted, and challenged for Basic.
            ops::count_lab_access_refusal(
                &stations.wide().connections.lab_access_refused,
                &stations.wide().access,
                &mut response,
            );
            response
        }
    }
}

fn answer_or_refuse(
    stations: &Arc<Stations>,
    head: &Parts,
    below: &str,
) -> Result<Response<Body>, ApiError> {
    if let Some(refusal) = crate::browser::malformed_host(head) {
        return Err(refusal);
    }
    if head.method != Method::GET && head.method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            format!("{} is not allowed here; use GET", head.method),
            Allowed::GET_AND_HEAD,
        ));
    }
    // The API's description (a station's API, the same for every station) is public, as
    // a station's own is.
    if below == "/openapi.json"
        && let Some(document) = crate::openapi::answer("", &head.method, below)
    {
        return Ok(document);
    }
    let wide = stations.wide();
    // As a station's own: health and readiness open to all (load balancers, systemd), the
    // rest (who holds which lease, metrics, the page) to a reader.
    if !matches!(below, "/healthz" | "/readyz") {
        wide.access.authorize(&head.headers, Some(Role::Read))?;
    }
    Ok(match below {
        "/v1/stations" => json_response(&Json::Array(station_views(stations))),
        "/v1/stations/events" => stream::open(stations, &head.headers, head.uri.query())?,
        "/metrics" => ops::text_response(
            "text/plain; version=0.0.4; charset=utf-8",
            lab_metrics(stations),
        ),
        "/healthz" => json_response(&json!({
            "status": "alive",
            "uptimeSeconds": wide.started.elapsed().as_secs(),
            "stations": stations.gateways().len(),
        })),
        "/readyz" => return readiness(stations),
        _ => ops::text_response("text/html; charset=utf-8", LAB_PAGE.to_owned()),
    })
}

/// `GET /readyz` of the lab: 200 when every station is ready, else 503 naming each station
/// that is not, and why.
fn readiness(stations: &Stations) -> Result<Response<Body>, ApiError> {
    let mut not_ready = Vec::new();
    let mut ready = Vec::new();
    for (id, gateway) in stations.paths().ids().iter().zip(stations.gateways()) {
        match ops::readiness(gateway) {
            Ok(_) => ready.push(id.as_str()),
            Err(why) => not_ready.push(format!("{id}: {}", why.message)),
        }
    }
    if not_ready.is_empty() {
        return Ok(json_response(&json!({ "ready": true, "stations": ready })));
    }
    Err(ApiError::station_not_reached(format!(
        "not ready: {} of {} stations ({}); ready: {}",
        not_ready.len(),
        stations.gateways().len(),
        not_ready.join("; "),
        if ready.is_empty() {
            "none".to_owned()
        } else {
            ready.join(", ")
        }
    )))
}

/// Every station's `/metrics`, in one exposition with a `station` label on each station's
/// series; the process's own families (build, uptime, connections) once, unlabelled.
fn lab_metrics(stations: &Stations) -> String {
    let renders: Vec<String> = stations
        .gateways()
        .iter()
        .map(|gateway| ops::snapshot(gateway).render())
        .collect();
    let labelled: Vec<(&str, &str)> = stations
        .paths()
        .ids()
        .iter()
        .map(String::as_str)
        .zip(renders.iter().map(String::as_str))
        .collect();
    merge_expositions(&labelled, GATEWAY_WIDE_FAMILIES)
}
