//! `api/capabilities`, `api/connection/status` and `api/application/...`: what the gateway and
//! the station say about themselves.

use serde_json::{Value as Json, json};

use super::call::{Answer, Call, not_yet_connected, ok};
use crate::api::API_VERSION;

/// `GET api/capabilities`.
pub(super) async fn capabilities(call: Call<'_>) -> Answer {
    let mut features = vec![
        "resources",
        "channels",
        "modules",
        "maxAge",
        "events",
        "subscriptions",
        "lease",
    ];
    // Bus transactions, until the station answers one `unsupported`.
    features.extend(call.gateway.station.bus_supported().then_some("comm"));
    ok(json!({
        "apiVersion": API_VERSION,
        "webApiVersion": format!("station-gateway {}", env!("CARGO_PKG_VERSION")),
        "codecVersion": station_protocol::PROTOCOL_VERSION.to_string(),
        "features": features,
    }))
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
