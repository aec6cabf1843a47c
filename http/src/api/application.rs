//! `api/capabilities`, `api/connection/status` and `api/application/...`: what the gateway and
//! the station say about themselves.

use serde_json::{Value as Json, json};
use station_protocol::ErrorCode;

use super::call::{Answer, Call, not_yet_connected, ok};
use crate::api_version::API_VERSION;
use crate::error::ApiError;
use crate::link::LinkError;
use crate::station::ChangeWhat;

/// `GET api/capabilities`.
pub(super) async fn capabilities(call: Call<'_>) -> Answer {
    let mut features = features();
    // Bus transactions, until the station answers one `unsupported`.
    if !call.gateway.station.bus_supported() {
        features.retain(|feature| *feature != "comm");
    }
    ok(json!({
        "apiVersion": API_VERSION,
        "webApiVersion": format!("station-gateway {}", env!("CARGO_PKG_VERSION")),
        "codecVersion": station_protocol::PROTOCOL_VERSION,
        "features": features,
    }))
}

/// What this gateway serves, from the endpoint table: the area (first path segment) of every
/// endpoint that is served (not an unserved row), and `maxAge` (cached reads of `resources/values/get`).
fn features() -> Vec<&'static str> {
    let mut features: Vec<&'static str> = Vec::new();
    for endpoint in super::endpoints().filter(|e| e.unserved.is_none()) {
        let area = endpoint.path.split('/').next().unwrap_or(endpoint.path);
        if !features.contains(&area) {
            features.push(area);
        }
        if endpoint.path == "resources/values/get" {
            features.push("maxAge");
        }
    }
    features
}

/// `GET api/connection/status`.
pub(super) async fn connection_status(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    ok(json!({ "isConnected": info.connected, "lastError": info.last_error }))
}

/// `GET api/application/name`: the station's name.
pub(super) async fn name(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    let hello = info.hello.as_ref().ok_or_else(not_yet_connected)?;
    ok(Json::String(hello.station.clone()))
}

/// `GET api/application/identification`.
pub(super) async fn identification(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    let hello = info.hello.as_ref().ok_or_else(not_yet_connected)?;
    ok(Json::String(format!(
        "{} (serial {}, firmware {}) through Station Gateway {}",
        hello.station,
        hello.serial,
        hello.firmware,
        env!("CARGO_PKG_VERSION")
    )))
}

/// `GET api/application/status`: `OK` while connected, `Error` after losing the station,
/// `Unknown` before ever reaching it.
pub(super) async fn status(call: Call<'_>) -> Answer {
    let info = call.gateway.station.info();
    let status = if info.connected {
        "OK"
    } else if info.hello.is_some() {
        "Error"
    } else {
        "Unknown"
    };
    ok(Json::String(status.into()))
}

/// Lines `GET api/application/log` returns without `tail`, as both clients default it
/// (`get_system_log(tail=100)` in `accordionq2/application.py` 5.28.1, `GetSystemLogAsync(int
/// tail = 100)` in the .NET client's `WebApiClient/Groups/ApplicationGroup.cs` at c57e05b).
const DEFAULT_TAIL: usize = 100;

/// `GET api/application/log?tail=N`: the gateway's own recent log lines, newest last; `tail=0`
/// all it keeps (`logs::RECENT_LINES`).
pub(super) async fn log(call: Call<'_>) -> Answer {
    let mut tail = DEFAULT_TAIL;
    for (key, value) in call
        .query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
    {
        if key.eq_ignore_ascii_case("tail") {
            tail = value.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "tail must be a whole number of lines (0 for all), not {value:?}"
                ))
            })?;
        }
    }
    // In a gateway of several stations, this station's lines only.
    ok(json!(crate::logs::recent_lines(
        call.gateway.lab_station_id.as_deref(),
        tail
    )))
}

/// `POST api/application/reset`: restarts the station's application through the link (RESET),
/// a change under the lease's send guard. The station drops its connections and comes back;
/// the link reconnects (generation + 1) and the event stream gets a `configuration` event. A
/// station that cannot restart its application (ERROR unsupported): 501.
pub(super) async fn reset(call: Call<'_>) -> Answer {
    call.gateway
        .station
        .connected()
        .map_err(|not_reached| ApiError::station_not_reached(not_reached.to_string()))?;
    let requester = format!("station-gateway for {}", call.peer);
    let report = call.change(ChangeWhat::Reset { requester }).await?;
    match report.answer {
        Ok(_) => {
            call.gateway.log_span.in_scope(
                || tracing::info!(peer = %call.peer, "the station's application was reset"),
            );
            ok(json!({}))
        }
        Err(LinkError::Station(error)) if error.code == ErrorCode::Unsupported => {
            Err(ApiError::not_implemented(format!(
                "the station cannot restart its application: {}",
                error.message
            )))
        }
        Err(error) => Err(error.into()),
    }
}
