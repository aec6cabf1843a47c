//! The lab's safe stop: `POST /v1/safe-stop {"Reason": "..."}` on a gateway of several
//! stations presses every station's safe stop at once (each as `POST
//! /stations/{id}/v1/safe-stop` would: its lease ended, its safe state applied and read back,
//! its audit line naming the station). Whoever may press a station's may press the lab's
//! (role `control`; each station's access rules decide its own `safe_stop` right).
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
use crate::audit::{ChangeFields, Outcome, RequestLine};
use crate::body::{JsonBody, read_body};
use crate::config::Role;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::reply::{Body, json_response};
use crate::requests::safe_stop::SafeStopRequest;

/// What one station's stop came to: its answer, or why it was not stopped.
type StationStop = Result<Json, ApiError>;

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
    let host = stations.host();
    host.access.authorize(&head.headers, Some(Role::Control))?;
    let started = Instant::now();
    let bytes = read_body(body, host.config.http.max_body_bytes).await?;
    crate::body::media_type::check(
        &head.headers,
        crate::body::media_type::MediaType::Json,
        &bytes,
        "POST /v1/safe-stop",
    )?;
    let json = JsonBody::from_bytes(bytes)?;
    let reason = json.typed::<SafeStopRequest>()?.reason()?;
    let caller = host.access.caller(&head.headers);
    let by = caller
        .clone()
        .unwrap_or_else(|| format!("a client at {}", peer.ip()));
    let asked = crate::audit_trail::asked(&json);
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
            Ok(_) => (StatusCode::OK, Outcome::Applied),
            Err(error) => (error.status(), Outcome::of_error(error.kind)),
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

/// Every station's answer; 200 when every station stopped, else the status of the first that
/// did not, with every station's answer all the same.
fn answer(stations: &Stations, stops: Vec<StationStop>) -> Response<Body> {
    let mut failed: Option<StatusCode> = None;
    let each: Vec<Json> = stations
        .paths()
        .ids()
        .iter()
        .zip(stops)
        .map(|(id, stop)| match stop {
            Ok(mut answer) => {
                answer["station"] = json!(id);
                answer
            }
            Err(error) => {
                failed.get_or_insert(error.status());
                json!({ "station": id, "stopped": false, "error": error.message })
            }
        })
        .collect();
    let not_stopped: Vec<&str> = each
        .iter()
        .filter(|stop| stop["stopped"] != true)
        .filter_map(|stop| stop["station"].as_str())
        .collect();
    let message = if not_stopped.is_empty() {
        format!(
            "safe-stopped every station ({})",
            stations.paths().ids().join(", ")
        )
    } else {
        format!(
            "NOT safe-stopped: {} (see each station's error); the others are",
            not_stopped.join(", ")
        )
    };
    let mut response = json_response(&json!({
        "stopped": not_stopped.is_empty(),
        "stations": each,
        "message": message,
    }));
    if let Some(status) = failed {
        *response.status_mut() = status;
    }
    response
}
