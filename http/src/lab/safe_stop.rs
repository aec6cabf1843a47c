//! The lab's safe stop: `POST /v1/safe-stop {"Reason": "..."}` on a gateway of several
//! stations presses every station's safe stop at once (each as `POST
//! /stations/{id}/v1/safe-stop` would: its lease ended, its safe state applied and read back,
//! its audit line naming the station). Whoever may press a station's may press the lab's
//! (role `control`; each station's access rules decide its own `safe_stop` right).
//!
//! The answer names every station's outcome, and is 200 only when every station's safe state
//! was confirmed in place (written and read back right, or read back right already). Otherwise
//! its status is that of what kept the stations short of it when they all share it (403 a
//! station's access rules refused the caller, 501 a station has no safe state configured, 503
//! a station's safe state is not confirmed yet, or a station this process does not own the
//! link of, its owner named), and 503 when they differ; each station's entry says its own.
//!
//! The stops run on a task of their own, started before anything is awaited: a client that
//! hangs up stops no station less.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value as Json, json};

use super::roster::Stations;
use crate::allow::Allowed;
use crate::api::safe_stop::Stopped;
use crate::audit::{ChangeFields, Outcome, RequestLine};
use crate::body::{JsonBody, read_body};
use crate::config::Role;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::reply::{Body, error_response_with, json_response};
use crate::requests::RequestBody;
use crate::requests::safe_stop::SafeStopRequest;

/// What one station's stop came to: its answer, or why it was not stopped at all.
type StationStop = Result<Stopped, ApiError>;

/// `POST /v1/safe-stop` of the lab.
pub async fn press(
    stations: &Arc<Stations>,
    head: &Parts,
    body: Incoming,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    if head.method != Method::POST {
        return Err(ApiError::method_not_allowed(
            format!("{} is not allowed on /v1/safe-stop; use POST", head.method),
            Allowed::NONE.with(&Method::POST),
        ));
    }
    let wide = stations.wide();
    wide.access.authorize(&head.headers, Some(Role::Control))?;
    let started = Instant::now();
    let bytes = read_body(body, wide.http.max_body_bytes).await?;
    crate::body::media_type::check(
        &head.headers,
        crate::body::media_type::MediaType::Json,
        &bytes,
        "POST /v1/safe-stop",
    )?;
    let request = JsonBody::from_bytes(bytes)?.typed::<SafeStopRequest>()?;
    let asked = request.asked();
    let reason = request.reason()?;
    let caller = wide.access.caller(&head.headers);
    let by = caller
        .clone()
        .unwrap_or_else(|| format!("a client at {}", peer.ip()));
    let press = Press {
        caller,
        by,
        reason,
        asked,
        peer,
        started,
    };
    let stops = {
        let stations = stations.clone();
        tokio::spawn(async move {
            let each = stations
                .gateways()
                .iter()
                .map(|gateway| press.stop(gateway))
                .collect::<Vec<_>>();
            futures::future::join_all(each).await
        })
    };
    let stops = stops
        .await
        .map_err(|_| ApiError::internal("the lab's safe stop ended before it answered"))?;
    Ok(answer(stations, stops))
}

/// Who pressed, why, and where from: the same for every station.
struct Press {
    caller: Option<String>,
    by: String,
    reason: String,
    asked: Option<String>,
    peer: SocketAddr,
    started: Instant,
}

impl Press {
    /// One station's stop, and its audit line (synced before the answer leaves).
    async fn stop(&self, gateway: &Arc<Gateway>) -> StationStop {
        let stopped = self.stop_unrecorded(gateway).await;
        let (status, outcome) = match &stopped {
            Ok(Stopped { short: None, .. }) => (StatusCode::OK, Outcome::Applied),
            Ok(Stopped {
                short: Some(error), ..
            })
            | Err(error) => (error.status(), Outcome::of_error(error.kind)),
        };
        let line = RequestLine {
            at: SystemTime::now(),
            ip: Some(self.peer.ip()),
            method: "POST",
            path: "/v1/safe-stop",
            status: Some(status.as_u16()),
            duration: Some(self.started.elapsed()),
        };
        let fields = ChangeFields {
            caller: self.caller.clone(),
            outcome: Some(outcome),
            asked: self.asked.clone(),
            ..ChangeFields::default()
        };
        if let Err(why) = gateway.audit.record(line.render(Some(&fields))).await {
            tracing::error!("{why}; the lab's safe stop is answered without this line");
        }
        stopped
    }

    async fn stop_unrecorded(&self, gateway: &Arc<Gateway>) -> StationStop {
        let who = crate::access_rules::Who {
            name: self.caller.clone(),
            address: Some(self.peer.ip()),
            group: None,
            holds_lease: false,
        };
        crate::api::safe_stop::stop(gateway, &who, &self.by, &self.reason).await
    }
}

/// Every station's answer, each naming its station (and, short of confirmed, its status and
/// error); 200 only when every station's safe state was confirmed in place, else the status
/// of [`lab_kind`].
fn answer(stations: &Stations, stops: Vec<StationStop>) -> Response<Body> {
    let mut short = Vec::new();
    let each: Vec<Json> = stations
        .paths()
        .ids()
        .iter()
        .zip(stops)
        .map(|(id, stop)| {
            let (mut entry, error) = match stop {
                Ok(Stopped {
                    answer,
                    short: None,
                }) => (answer, None),
                Ok(Stopped {
                    answer,
                    short: Some(error),
                }) => (answer, Some(error)),
                Err(error) => (json!({ "stopped": false }), Some(error)),
            };
            entry["station"] = json!(id);
            if let Some(error) = error {
                entry["status"] = json!(error.status().as_u16());
                entry["error"] = json!(error.message);
                short.push((id.as_str(), error.kind));
            }
            entry
        })
        .collect();
    let kinds: Vec<ErrorKind> = short.iter().map(|(_, kind)| *kind).collect();
    let body = |message: String| {
        json!({
            "stopped": short.is_empty(),
            "stations": each,
            "message": message,
        })
    };
    match lab_kind(&kinds) {
        None => json_response(&body(format!(
            "safe-stopped every station, each safe state confirmed ({})",
            stations.paths().ids().join(", ")
        ))),
        Some(kind) => {
            let named: Vec<&str> = short.iter().map(|(id, _)| *id).collect();
            let message = format!(
                "NOT safe-stopped: {} (see each station's error); the others are",
                named.join(", ")
            );
            error_response_with(&ApiError::new(kind, message.clone()), body(message))
        }
    }
}

/// The kind of the lab's answer from the kinds of the stations whose safe state was not
/// confirmed in place: `None` (200) when there are none; their kind when they all share one;
/// otherwise [`ErrorKind::SafeStatePending`] (503: not every station is confirmed safe, for
/// reasons each station's entry gives).
pub fn lab_kind(short: &[ErrorKind]) -> Option<ErrorKind> {
    let first = *short.first()?;
    Some(if short.iter().all(|kind| *kind == first) {
        first
    } else {
        ErrorKind::SafeStatePending
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_labs_press_is_200_only_when_no_station_fell_short() {
        assert_eq!(lab_kind(&[]), None);
        assert_eq!(
            lab_kind(&[ErrorKind::StandingBy, ErrorKind::StandingBy]),
            Some(ErrorKind::StandingBy)
        );
        assert_eq!(
            lab_kind(&[ErrorKind::AccessDenied]),
            Some(ErrorKind::AccessDenied)
        );
        assert_eq!(
            lab_kind(&[ErrorKind::NotOffered, ErrorKind::AccessDenied]),
            Some(ErrorKind::SafeStatePending)
        );
    }
}
