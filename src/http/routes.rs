//! Routing and the REST contract's endpoints (../shared/contract.md), except the lease and
//! the event stream, which live in modules of their own.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value as Json, json};
use station_protocol::{ChannelDescriptor, ItemResult, Value};

use super::body::{JsonBody, read_body, value_text};
use super::lease::{LEASE_FENCE_HEADER, presented_lease_id, set_fence_header};
use super::ops::{self, Operation};
use super::{Body, error_response, json_bytes_response, json_response};
use crate::config::Role;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::lease::{Access, Admitted};
use crate::link::ChannelTable;
use crate::station::{
    ConsumingRule, Freshness, ItemError, ItemReading, ReadError, ReadPolicy, Reading, UnknownRule,
};

/// The REST API version this gateway serves.
pub const API_VERSION: &str = "1.0";

/// One endpoint of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Capabilities,
    ConnectionStatus,
    ResourceNames,
    ValueGet,
    ValueSet,
    ValuesGet,
    ValuesSet,
    Transact,
    Channels,
    ChannelLookup,
    Modules,
    ModulesLoaded,
    PhysicalSystem,
    ApplicationName,
    ApplicationIdentification,
    ApplicationStatus,
    Events,
    SubscriptionCreate,
    SubscriptionUpdate,
    SubscriptionDelete,
    /// `GET lease`: who holds it.
    LeaseStatus,
    /// `POST lease`: take (or re-take) it.
    LeaseAcquire,
    /// `DELETE lease`: the admin break.
    LeaseBreak,
    /// `PUT lease/{id}`.
    LeaseRenew,
    /// `DELETE lease/{id}`.
    LeaseRelease,
}

impl Route {
    /// The route for a method and a path below `api/`; `Err` says whether the path exists.
    pub fn find(method: &Method, path: &str) -> Result<Route, bool> {
        let route = match path {
            "capabilities" => Route::Capabilities,
            "connection/status" => Route::ConnectionStatus,
            "resources/names" => Route::ResourceNames,
            "resources/value/get" => Route::ValueGet,
            "resources/value/set" => Route::ValueSet,
            "resources/values/get" => Route::ValuesGet,
            "resources/values/set" => Route::ValuesSet,
            "resources/transact" => Route::Transact,
            "channels" => Route::Channels,
            "channels/channel" => Route::ChannelLookup,
            "modules" => Route::Modules,
            "modules/loaded" => Route::ModulesLoaded,
            "modules/physical-system" => Route::PhysicalSystem,
            "application/name" => Route::ApplicationName,
            "application/identification" => Route::ApplicationIdentification,
            "application/status" => Route::ApplicationStatus,
            "events" => Route::Events,
            "subscriptions" => Route::SubscriptionCreate,
            path if crate::events::http::subscription_id(path).is_some() => match *method {
                Method::DELETE => Route::SubscriptionDelete,
                _ => Route::SubscriptionUpdate,
            },
            "lease" => match *method {
                Method::POST => Route::LeaseAcquire,
                Method::DELETE => Route::LeaseBreak,
                _ => Route::LeaseStatus,
            },
            path if lease_id_in_path(path).is_some() => match *method {
                Method::DELETE => Route::LeaseRelease,
                _ => Route::LeaseRenew,
            },
            _ => return Err(false),
        };
        if *method == route.method() {
            Ok(route)
        } else {
            Err(true)
        }
    }

    pub fn method(self) -> Method {
        match self {
            Route::ValueGet
            | Route::ValueSet
            | Route::ValuesGet
            | Route::ValuesSet
            | Route::Transact
            | Route::ChannelLookup
            | Route::SubscriptionCreate
            | Route::LeaseAcquire => Method::POST,
            Route::SubscriptionUpdate | Route::LeaseRenew => Method::PUT,
            Route::SubscriptionDelete | Route::LeaseBreak | Route::LeaseRelease => Method::DELETE,
            _ => Method::GET,
        }
    }

    /// What the route needs of the control lease, enforced for every request in
    /// `route_and_answer`. Cached reads (`values/get` with `MaxAgeMs > 0`), the channel lookup,
    /// subscriptions and the lease endpoints change nothing and stay open.
    pub fn needs_lease(&self, body: &JsonBody) -> Access {
        match self {
            Route::ValueSet | Route::ValuesSet | Route::Transact => Access::Change,
            Route::ValueGet => Access::ForcedRead,
            Route::ValuesGet => match body.optional_u64("MaxAgeMs") {
                Ok(Some(max_age_ms)) if max_age_ms > 0 => Access::CachedRead,
                _ => Access::ForcedRead,
            },
            _ => Access::Open,
        }
    }
}

/// What a request is for: an operations endpoint (`/healthz`, `/metrics`, `/`, ...) or an API
/// route with its path below `api/`.
#[derive(Clone, Copy)]
enum Target<'p> {
    Operation(Operation),
    Api(Route, &'p str),
    /// `v1/leases/...`, `v1/semaphores/...` (`named_leases.rs`).
    NamedLeases,
}

/// The `{id}` of `lease/{id}`.
fn lease_id_in_path(path: &str) -> Option<&str> {
    path.strip_prefix("lease/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

/// Answers one request; never fails: every error becomes a JSON error answer.
pub async fn handle(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    // The API's own description, public like the contract it describes.
    let prefix = &gateway.config.http.path_prefix;
    if let Some(doc) = super::openapi::answer(prefix, request.method(), request.uri().path()) {
        return doc;
    }
    let started = Instant::now();
    let (method, uri) = (
        request.method().clone(),
        ops::access_log_enabled().then(|| request.uri().clone()),
    );
    let mut slot = ops::UNMATCHED_SLOT;
    let presented = presented_lease_id(request.headers()).map(str::to_owned);
    let mut response = match route_and_answer(&gateway, request, peer, &mut slot).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    // The holder's responses carry the fence its requests are admitted under.
    if let Some(fence) = gateway.lease.fence_of(presented.as_deref())
        && !response.headers().contains_key(LEASE_FENCE_HEADER)
    {
        set_fence_header(&mut response, fence);
    }
    ops::finish(
        &gateway,
        slot,
        &method,
        uri.as_ref(),
        peer,
        started,
        &mut response,
    );
    response
}

async fn route_and_answer(
    gateway: &Gateway,
    request: Request<Incoming>,
    peer: SocketAddr,
    slot: &mut usize,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let prefix = gateway.config.http.path_prefix.trim_end_matches('/');
    let below_prefix = path.strip_prefix(prefix);
    let below_api = below_prefix
        .and_then(|rest| rest.strip_prefix("/api/"))
        .map(|rest| rest.trim_end_matches('/'));
    // Health, readiness, metrics and the status page live beside api/, and so do named leases
    // and semaphores for lab scripts (`v1/leases`, `v1/semaphores`).
    let target = match (below_prefix.and_then(Operation::find), below_api) {
        (Some(operation), _) => Target::Operation(operation),
        _ if super::named_leases::is_named_lease_path(gateway, path) => Target::NamedLeases,
        (None, Some(below_api)) => Target::Api(
            Route::find(&parts.method, below_api).map_err(|exists| {
                if exists {
                    ApiError::new(
                        StatusCode::METHOD_NOT_ALLOWED,
                        format!("{} is not allowed on {path}", parts.method),
                    )
                } else {
                    ApiError::not_found(format!("no such endpoint: {} {path}", parts.method))
                }
            })?,
            below_api,
        ),
        (None, None) => {
            return Err(ApiError::not_found(format!(
                "no such endpoint: {} {path}",
                parts.method
            )));
        }
    };
    let needed = match target {
        Target::Operation(operation) => {
            *slot = operation.slot();
            operation.needed_role()
        }
        Target::Api(route, _) => {
            *slot = ops::route_slot(route);
            Some(super::access::needed_role(route))
        }
        Target::NamedLeases => {
            *slot = ops::NAMED_LEASES_SLOT;
            Some(match parts.method {
                Method::GET | Method::HEAD => Role::Read,
                _ => Role::Control,
            })
        }
    };
    // The one place access control is checked: before the body is read and before the lease
    // admission. 401 without valid credentials, 403 for a role too low.
    let granted = gateway.access.authorize(&parts.headers, needed)?;
    let (route, below_api) = match target {
        Target::Operation(operation) => return ops::answer(gateway, operation, &parts.method),
        Target::NamedLeases => {
            let request = Request::from_parts(parts, body);
            return Ok(super::named_leases::handle(gateway, request).await);
        }
        Target::Api(route, below_api) => (route, below_api),
    };
    let json = if matches!(route.method(), Method::POST | Method::PUT) {
        let bytes = read_body(body, gateway.config.http.max_body_bytes).await?;
        JsonBody::parse(&bytes)?
    } else {
        JsonBody::parse(b"")?
    };
    // The one place the control lease is enforced: 423 for a non-holder's changes and forced
    // reads, and for changes a send guard that fences them again at the link.
    let presented = presented_lease_id(&parts.headers);
    let admitted = gateway.lease.admit(route.needs_lease(&json), presented)?;
    let answer = match route {
        Route::Capabilities => capabilities(),
        Route::ConnectionStatus => {
            let info = gateway.station.info();
            json!({ "isConnected": info.connected, "lastError": info.last_error })
        }
        Route::ResourceNames => {
            let channels = known_channels(gateway)?;
            Json::Array(
                channels
                    .channels
                    .iter()
                    .map(|ch| Json::String(ch.name.clone()))
                    .collect(),
            )
        }
        Route::ValueGet => value_get(gateway, &json, peer).await?,
        Route::ValueSet => value_set(gateway, &json, &admitted).await?,
        Route::ValuesGet => {
            let answer = values_get(gateway, &json, &admitted, peer).await?;
            return Ok(json_bytes_response(StatusCode::OK, answer));
        }
        Route::ValuesSet => values_set(gateway, &json, &admitted).await?,
        Route::Transact => transact(gateway, &json, &admitted).await?,
        Route::Channels => {
            let channels = known_channels(gateway)?;
            Json::Array(
                channels
                    .channels
                    .iter()
                    .enumerate()
                    .map(|(i, ch)| channel_json(i, ch))
                    .collect(),
            )
        }
        Route::ChannelLookup => channel_lookup(gateway, &json)?,
        Route::Modules | Route::ModulesLoaded => modules(gateway)?,
        Route::PhysicalSystem => physical_system(gateway)?,
        Route::ApplicationName => Json::String(station_name(gateway)?),
        Route::ApplicationIdentification => {
            let info = gateway.station.info();
            let hello = info.hello.as_ref().ok_or_else(not_yet_connected)?;
            Json::String(format!(
                "{} (serial {}, firmware {}) through Station Gateway {}",
                hello.station,
                hello.serial,
                hello.firmware,
                env!("CARGO_PKG_VERSION")
            ))
        }
        Route::Events => return crate::events::http::open_stream(gateway),
        Route::SubscriptionCreate => crate::events::http::create(gateway, &json)?,
        Route::SubscriptionUpdate => {
            crate::events::http::update(gateway, subscription_id(below_api), &json)?
        }
        Route::SubscriptionDelete => {
            crate::events::http::delete(gateway, subscription_id(below_api))?
        }
        Route::LeaseStatus => super::lease::status(gateway),
        Route::LeaseAcquire => {
            return super::lease::acquire(gateway, &json, parts.uri.query(), presented).await;
        }
        Route::LeaseRenew => {
            let id = lease_id_in_path(below_api).unwrap_or_default();
            return super::lease::renew(gateway, id, &json).await;
        }
        Route::LeaseRelease => {
            super::lease::release(gateway, lease_id_in_path(below_api).unwrap_or_default()).await?
        }
        // An admin's credentials are the authority to break the lease; no bearer token needed.
        Route::LeaseBreak if granted == Some(Role::Admin) => {
            json!({ "broken": gateway.lease.break_lease(peer).await? })
        }
        Route::LeaseBreak => super::lease::break_lease(gateway, &parts.headers, peer).await?,
        Route::ApplicationStatus => {
            let info = gateway.station.info();
            Json::String(
                if info.connected {
                    "OK"
                } else if info.hello.is_some() {
                    "Error"
                } else {
                    "Unknown"
                }
                .into(),
            )
        }
    };
    Ok(json_response(StatusCode::OK, &answer))
}

fn capabilities() -> Json {
    json!({
        "apiVersion": API_VERSION,
        "webApiVersion": format!("station-gateway {}", env!("CARGO_PKG_VERSION")),
        "codecVersion": station_protocol::PROTOCOL_VERSION.to_string(),
        "features": ["resources", "channels", "modules", "maxAge", "events", "subscriptions", "lease"],
    })
}

/// The `{id}` of `subscriptions/{id}`; the route was chosen by that shape.
fn subscription_id(below_api: &str) -> &str {
    crate::events::http::subscription_id(below_api).unwrap_or_default()
}

fn not_yet_connected() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "station disconnected: the gateway has not reached the station yet",
    )
}

/// The channel list, or 503 when the station has never been reached.
fn known_channels(gateway: &Gateway) -> Result<Arc<ChannelTable>, ApiError> {
    let info = gateway.station.reached().map_err(|not_reached| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, not_reached.to_string())
    })?;
    Ok(info.channels.clone())
}

fn station_name(gateway: &Gateway) -> Result<String, ApiError> {
    let info = gateway.station.info();
    Ok(info
        .hello
        .as_ref()
        .ok_or_else(not_yet_connected)?
        .station
        .clone())
}

/// Checks every name against the channel list; 404 names the first unknown one.
fn check_names<'a>(
    channels: &'a ChannelTable,
    names: &[String],
) -> Result<Vec<&'a ChannelDescriptor>, ApiError> {
    names
        .iter()
        .map(|name| {
            channels
                .get(name)
                .ok_or_else(|| ApiError::no_such_resource(name))
        })
        .collect()
}

/// A station value from request text, by the channel's type.
fn parse_value(channel: &ChannelDescriptor, text: &str) -> Result<Value, ApiError> {
    if !channel.writable {
        return Err(ApiError::bad_request(format!(
            "{} is read only",
            channel.name
        )));
    }
    Value::parse_as(channel.value_type, text, &channel.options)
        .map_err(|error| ApiError::bad_request(format!("bad value for {}: {error}", channel.name)))
}

fn first_item_error<T>(names: &[String], results: &[ItemResult<T>]) -> Result<(), ApiError> {
    for (name, result) in names.iter().zip(results) {
        if let Err(error) = result {
            let mut api = ApiError::from(error.clone());
            if !api.message.contains(name.as_str()) {
                api.message = format!("{name}: {}", api.message);
            }
            return Err(api);
        }
    }
    Ok(())
}

async fn value_get(gateway: &Gateway, body: &JsonBody, peer: SocketAddr) -> Result<Json, ApiError> {
    let name = body.string("Name")?.to_owned();
    let channels = known_channels(gateway)?;
    check_names(&channels, std::slice::from_ref(&name))?;
    let names = vec![name];
    let readings = gateway
        .station
        .read(&names, ReadPolicy::hardware(Some(peer)))
        .await
        .map_err(|error| ApiError::new(StatusCode::LOCKED, error.to_string()))?;
    let reading = first_reading_error(&names, readings)?.into_iter().next();
    let value = reading.map(|r| r.value.render()).unwrap_or_default();
    Ok(json!({ "value": value }))
}

/// The readings of a REST read, or its first failure: a link failure for the whole read, else
/// the first name the station refused (named in the message).
fn first_reading_error(
    names: &[String],
    readings: Vec<ItemReading>,
) -> Result<Vec<Reading>, ApiError> {
    if let Some(Err(ItemError::Link(error))) = readings
        .iter()
        .find(|reading| matches!(reading, Err(ItemError::Link(_))))
    {
        return Err(ApiError::from(error.clone()));
    }
    let mut values = Vec::with_capacity(readings.len());
    for (name, reading) in names.iter().zip(readings) {
        match reading {
            Ok(reading) => values.push(reading),
            Err(error) => {
                let mut api = match error {
                    ItemError::Station(station) => ApiError::from(station),
                    ItemError::Link(link) => ApiError::from(link),
                    other => ApiError::new(StatusCode::BAD_GATEWAY, other.to_string()),
                };
                if !api.message.contains(name.as_str()) {
                    api.message = format!("{name}: {}", api.message);
                }
                return Err(api);
            }
        }
    }
    Ok(values)
}

/// `values/get`: `{"resources": {name: value}, "ageMs": {name: age}}`, each name once, in the
/// order first asked. Written straight into bytes: this is the hot read path (every cached
/// read and every batch), and a `serde_json::Value` tree of two maps cost more than the rest
/// of the request.
async fn values_get(
    gateway: &Gateway,
    body: &JsonBody,
    admitted: &Admitted,
    peer: SocketAddr,
) -> Result<Vec<u8>, ApiError> {
    let names = body.string_list("Names")?;
    let max_age_ms = body.optional_u64("MaxAgeMs")?.unwrap_or(0);
    let channels = known_channels(gateway)?;
    check_names(&channels, &names)?;
    // With a maximum age, fresh cached values serve; while someone else holds the lease,
    // channels whose read consumes data come from the cache only, however old.
    let policy = ReadPolicy {
        freshness: if max_age_ms > 0 {
            Freshness::Within(std::time::Duration::from_millis(max_age_ms))
        } else {
            Freshness::Hardware
        },
        consuming: if max_age_ms > 0 && admitted.consuming_from_cache_only.is_some() {
            ConsumingRule::CachedOnly
        } else {
            ConsumingRule::Read
        },
        unknown: UnknownRule::AskStation,
        caller: Some(peer),
        cancel: None,
    };
    let readings = gateway.station.read(&names, policy).await.map_err(
        |ReadError::ConsumingNotCached(channel)| match admitted.refuse_consuming(&channel) {
            Some(refusal) => ApiError::from(refusal),
            None => ApiError::new(StatusCode::LOCKED, format!("{channel}: not cached")),
        },
    )?;
    let readings = first_reading_error(&names, readings)?;
    let mut values: HashMap<&str, (String, f64)> = HashMap::with_capacity(names.len());
    for (name, reading) in names.iter().zip(&readings) {
        values
            .entry(name.as_str())
            .or_insert_with(|| (reading.value.render(), reading.age_ms()));
    }
    let mut order: Vec<&str> = Vec::with_capacity(values.len());
    let mut listed: HashSet<&str> = HashSet::with_capacity(values.len());
    for name in &names {
        if values.contains_key(name.as_str()) && listed.insert(name) {
            order.push(name);
        }
    }
    let mut out = Vec::with_capacity(32 + order.len() * 64);
    out.extend_from_slice(b"{\"resources\":");
    write_object(&mut out, &order, |name| &values[name].0);
    out.extend_from_slice(b",\"ageMs\":");
    write_object(&mut out, &order, |name| &values[name].1);
    out.push(b'}');
    Ok(out)
}

/// Appends `{"name": value, ...}` for `names`, in that order.
fn write_object<'v, T: serde::Serialize + ?Sized + 'v>(
    out: &mut Vec<u8>,
    names: &[&str],
    value_of: impl Fn(&str) -> &'v T,
) {
    out.push(b'{');
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json(out, *name);
        out.push(b':');
        write_json(out, value_of(name));
    }
    out.push(b'}');
}

/// Appends `value` as JSON. Only strings and numbers are written this way, and writing those
/// into a `Vec` cannot fail.
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(out, value);
}

/// The `Name` and `Value` of a body, the value read as that channel's type.
fn named_value(gateway: &Gateway, body: &JsonBody) -> Result<(String, Value), ApiError> {
    let name = body.string("Name")?.to_owned();
    let text = body.value_text("Value")?;
    let channels = known_channels(gateway)?;
    let channel = channels
        .get(&name)
        .ok_or_else(|| ApiError::no_such_resource(&name))?;
    let value = parse_value(channel, &text)?;
    Ok((name, value))
}

async fn value_set(
    gateway: &Gateway,
    body: &JsonBody,
    admitted: &Admitted,
) -> Result<Json, ApiError> {
    let (name, value) = named_value(gateway, body)?;
    let names = vec![name.clone()];
    let results = gateway.station.write(vec![(name, value)], admitted).await?;
    first_item_error(&names, &results)?;
    Ok(json!({}))
}

async fn values_set(
    gateway: &Gateway,
    body: &JsonBody,
    admitted: &Admitted,
) -> Result<Json, ApiError> {
    let resources = body.object("Resources")?;
    let channels = known_channels(gateway)?;
    let mut items = Vec::with_capacity(resources.len());
    for (name, raw) in resources {
        let channel = channels
            .get(name)
            .ok_or_else(|| ApiError::no_such_resource(name))?;
        let text = value_text(raw, &format!("Resources.{name}"))?;
        items.push((name.clone(), parse_value(channel, &text)?));
    }
    if items.is_empty() {
        return Ok(json!({}));
    }
    let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
    let results = gateway.station.write(items, admitted).await?;
    if results.iter().all(Result::is_ok) {
        return Ok(json!({}));
    }
    // Say exactly what was and was not applied: a POST is never half-applied silently.
    let mut failed = Vec::new();
    let mut applied = Vec::new();
    let mut status = StatusCode::BAD_REQUEST;
    for (name, result) in names.iter().zip(&results) {
        match result {
            Ok(()) => applied.push(name.as_str()),
            Err(error) => {
                if failed.is_empty() {
                    status = ApiError::from(error.clone()).status;
                }
                // The station's message usually names the channel already.
                if error.message.contains(name.as_str()) {
                    failed.push(error.message.clone());
                } else {
                    failed.push(format!("{name}: {}", error.message));
                }
            }
        }
    }
    let applied = if applied.is_empty() {
        "none".to_owned()
    } else {
        applied.join(", ")
    };
    Err(ApiError::new(
        status,
        format!("not applied: {}; applied: {applied}", failed.join("; ")),
    ))
}

async fn transact(
    gateway: &Gateway,
    body: &JsonBody,
    admitted: &Admitted,
) -> Result<Json, ApiError> {
    let (name, value) = named_value(gateway, body)?;
    let answer = gateway.station.transact(name, value, admitted).await?;
    Ok(json!({ "value": answer.render() }))
}

/// Names of the channel type flags, as the REST contract's `channelType` lists them.
const TYPE_FLAG_NAMES: &[(u32, &str)] = &[
    (1, "Analog"),
    (1 << 1, "Digital"),
    (1 << 2, "VirtualDigital"),
    (1 << 3, "Temperature"),
    (1 << 4, "Multiplexer"),
    (1 << 5, "Resistance"),
    (1 << 6, "Counter"),
    (1 << 7, "Frequency"),
    (1 << 8, "Actuator"),
    (1 << 10, "Register"),
    (1 << 11, "Current"),
    (1 << 12, "Ratiometric"),
    (1 << 13, "UART"),
    (1 << 14, "SPI"),
    (1 << 15, "I2C"),
    (1 << 16, "ByteStream"),
    (1 << 17, "Socket"),
    (1 << 24, "Instrument"),
];

/// `"Analog, Current"` for the flags set.
pub fn type_flag_names(flags: u32) -> String {
    let names: Vec<&str> = TYPE_FLAG_NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "Undefined".into()
    } else {
        names.join(", ")
    }
}

/// The contract's channel object for one descriptor.
pub fn channel_json(position: usize, ch: &ChannelDescriptor) -> Json {
    let usage = if ch.consuming {
        "BusSignal"
    } else if ch.writable {
        "UserAllocatable"
    } else {
        "ReadOnlySystemControl"
    };
    let device = ch
        .name
        .rsplit_once('.')
        .map(|(device, _)| device)
        .unwrap_or("");
    json!({
        "channelIndex": position,
        "index": position,
        "enabled": true,
        "usage": usage,
        "deviceName": device,
        "channelType": type_flag_names(ch.type_flags),
        "channelTypeCapability": type_flag_names(ch.type_flags),
        "alias": ch.alias,
        "netName": ch.net_name,
        "groupName": ch.group,
        "capability": ch.direction.label(),
        "description": ch.description,
        "direction": ch.direction.label(),
        "directionChanged": false,
        "defaultDirection": ch.direction.label(),
        "unit": ch.unit,
        "isVirtual": false,
        "details": {
            "name": ch.name,
            "valueType": ch.value_type.name(),
            "readable": ch.readable,
            "writable": ch.writable,
            "readConsumesData": ch.consuming,
            "options": ch.options,
        },
    })
}

fn channel_lookup(gateway: &Gateway, body: &JsonBody) -> Result<Json, ApiError> {
    let channels = known_channels(gateway)?;
    let (field, wanted) = match (body.get("Alias"), body.get("NetName")) {
        (Some(_), _) => ("alias", body.string("Alias")?),
        (None, Some(_)) => ("net name", body.string("NetName")?),
        (None, None) => return Err(ApiError::bad_request("give the field Alias or NetName")),
    };
    let found = channels
        .channels
        .iter()
        .enumerate()
        .find(|(_, ch)| match field {
            "alias" => ch.alias == wanted,
            _ => ch.net_name == wanted,
        });
    match found {
        Some((position, ch)) => Ok(channel_json(position, ch)),
        None => Err(ApiError::not_found(format!(
            "no channel with the {field} {wanted:?}"
        ))),
    }
}

fn modules(gateway: &Gateway) -> Result<Json, ApiError> {
    let info = gateway.station.info();
    info.hello.as_ref().ok_or_else(not_yet_connected)?;
    Ok(Json::Array(
        info.modules
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "enabled": true,
                    "className": "StationModule",
                    "assemblyPath": "",
                    "namespace": "",
                    "imageName": m.product_id,
                    "initialData": {
                        "index": m.index,
                        "productID": m.product_id,
                        "revision": m.revision,
                        "serialNumber": m.serial,
                    },
                })
            })
            .collect(),
    ))
}

fn physical_system(gateway: &Gateway) -> Result<Json, ApiError> {
    let info = gateway.station.info();
    let hello = info.hello.as_ref().ok_or_else(not_yet_connected)?;
    let modules: Vec<Json> = info
        .modules
        .iter()
        .map(|m| {
            json!({
                "index": m.index,
                "name": m.name,
                "productID": m.product_id,
                "revision": m.revision,
                "serialNumber": m.serial,
            })
        })
        .collect();
    Ok(json!({
        "host": hello.station,
        "ethIpV4": "",
        "ethIpV6": "",
        "firmware": hello.firmware,
        "mac": "",
        "modules": modules,
        "networkInterfaces": {},
    }))
}
