//! What operators need beside the REST contract: `GET /healthz`, `GET /readyz`,
//! `GET /metrics` (Prometheus), the status page at `/` with its `status.json` (their rows,
//! paths and roles are in the route table, `api/mod.rs`), and what happens after every
//! request is answered: its metrics and its access log line.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Response, StatusCode};
use serde_json::{Value as Json, json};
use tracing::info;

use super::allow::Allowed;
use super::api::{self, Operation};
use super::reply::{Body, error_kind, json_response};
use crate::credentials::BASIC_CHALLENGE;
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::link::{ChannelTable, LinkStats};
use crate::metrics::{LinkCounts, Metrics, Snapshot};

/// The status page, served as it is; its script fetches `status.json` and opens the event
/// stream.
const STATUS_PAGE: &str = include_str!("status.html");

/// The gateway's metrics registry, with a slot for every route.
pub fn new_metrics() -> Metrics {
    Metrics::new(metric_labels())
}

/// The labels of the request counters: one for every route, in the endpoint table's order
/// (`LabShared::with_endpoint_labels`).
pub fn metric_labels() -> Vec<&'static str> {
    api::metric_labels()
}

/// Answers an operation.
pub fn answer(
    gateway: &Gateway,
    operation: Operation,
    method: &Method,
    viewer: &crate::access_rules::Who,
) -> Result<Response<Body>, ApiError> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            format!("{method} is not allowed here; use GET"),
            Allowed::GET_AND_HEAD,
        ));
    }
    Ok(match operation {
        Operation::Healthz => json_response(
            &json!({ "status": "alive", "uptimeSeconds": gateway.started.elapsed().as_secs() }),
        ),
        Operation::Readyz => json_response(&readiness(gateway)?),
        Operation::Metrics => text_response(
            "text/plain; version=0.0.4; charset=utf-8",
            snapshot(gateway).render(),
        ),
        Operation::StatusPage => text_response("text/html; charset=utf-8", STATUS_PAGE.to_owned()),
        Operation::StatusJson => json_response(&status_json(gateway, viewer)),
    })
}

/// Whether a station is ready to serve: its link up, no safe state owed, no lease ending,
/// and not a standby's. `Ok` is the answer of `GET /readyz`; `Err` says why not.
pub fn readiness(gateway: &Gateway) -> Result<Json, ApiError> {
    if let Some(standing_by) = gateway.ha.standing_by() {
        return Err(ApiError::standing_by(format!("not ready: {standing_by}")));
    }
    let info = gateway.link.info();
    if let Some(why) = gateway.lease.safe_state_pending() {
        return Err(ApiError::safe_state_pending(format!("not ready: {why}")));
    }
    if let Some(why) = gateway.lease.not_ready() {
        return Err(ApiError::lease_ending(format!("not ready: {why}")));
    }
    if info.connected {
        Ok(json!({ "ready": true, "generation": info.generation }))
    } else {
        let why = info.last_error.as_deref().unwrap_or("connecting");
        Err(ApiError::station_not_reached(format!(
            "not ready: the station link is down: {why}"
        )))
    }
}

pub fn text_response(content_type: &'static str, text: String) -> Response<Body> {
    let mut response = Response::new(Body::whole(text));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The link's counters as a scrape shows them.
fn link_counts(stats: &LinkStats) -> LinkCounts<'_> {
    LinkCounts {
        frames_sent: LinkStats::get(&stats.frames_sent),
        read_frames: LinkStats::get(&stats.read_frames),
        names_read: LinkStats::get(&stats.names_read),
        timeouts: LinkStats::get(&stats.timeouts),
        crc_errors: LinkStats::get(&stats.crc_errors),
        reconnects: LinkStats::get(&stats.reconnects),
        refused_by_guard: LinkStats::get(&stats.refused_by_guard),
        latency: &stats.latency,
    }
}

/// Everything `/metrics` shows, read from where it is kept.
pub fn snapshot(gateway: &Gateway) -> Snapshot<'_> {
    let info = gateway.link.info();
    Snapshot {
        metrics: &gateway.metrics,
        link: link_counts(gateway.link.stats()),
        link_connected: info.connected,
        link_generation: info.generation,
        link_queue_depth: gateway.link.queue_depth(),
        cache: gateway.link.cache().hits_and_misses(),
        cache_entries: gateway.link.cache().len(),
        lease_held: gateway.lease.view().held,
        safe_state_pending: gateway.lease.safe_state_pending().is_some(),
        standby: gateway.ha.standing_by().is_some(),
        lease: &gateway.lease.counters,
        event_streams: gateway.events.stream_count(),
        subscriptions: gateway.events.subscription_count(),
        history: gateway.history.as_deref().map(|history| history.counts()),
        uptime: gateway.started.elapsed(),
        access_rules_version: gateway.station.access_rules().version(),
        access_rule_refusals: gateway.station.access_rules().refusals(),
    }
}

/// The channels the status page shows: for each configured entry, the first channel whose
/// name is it or ends with `.` and it.
pub fn status_channels(configured: &[String], table: &ChannelTable) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for wanted in configured {
        let found = table.channels.iter().find(|ch| {
            ch.name == *wanted
                || ch
                    .name
                    .strip_suffix(wanted.as_str())
                    .is_some_and(|head| head.ends_with('.'))
        });
        if let Some(channel) = found
            && !chosen.contains(&channel.name)
        {
            chosen.push(channel.name.clone());
        }
    }
    chosen
}

/// One trend plot of the status page: its channels (an HV output's set point first, then its
/// monitor) under the monitor's short name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TrendPlot {
    pub title: String,
    /// The set point, when the channel is a monitor (`...VMON1`) that has one (`...VSET1`).
    #[serde(rename = "setPoint")]
    pub set_point: Option<String>,
    pub channel: String,
}

/// A plot for each chosen channel; a monitor `<prefix>XMON<n>` with a `<prefix>XSET<n>` in
/// the table gets its set point on the same plot. Returns the channels to subscribe (the
/// chosen ones with those set points before their monitors) and the plots.
pub fn trend_plots(chosen: &[String], table: &ChannelTable) -> (Vec<String>, Vec<TrendPlot>) {
    let mut channels = Vec::with_capacity(chosen.len() * 2);
    let mut plots = Vec::with_capacity(chosen.len());
    for name in chosen {
        let set_point = set_point_of(name).filter(|set| table.get(set).is_some());
        if let Some(set) = &set_point
            && !channels.contains(set)
        {
            channels.push(set.clone());
        }
        if !channels.contains(name) {
            channels.push(name.clone());
        }
        let title = name.rsplit('.').next().unwrap_or(name).to_owned();
        plots.push(TrendPlot {
            title,
            set_point,
            channel: name.clone(),
        });
    }
    (channels, plots)
}

/// `...VMON1` → `...VSET1`: `MON` after a letter and before the output's number.
fn set_point_of(monitor: &str) -> Option<String> {
    let digits = monitor.len() - monitor.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, number) = monitor.split_at(monitor.len() - digits);
    let quantity = head.strip_suffix("MON")?;
    if digits == 0 || !quantity.ends_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    Some(format!("{quantity}SET{number}"))
}

/// `status.json`: what the status page shows besides the live values.
/// The viewer's own rights by the access rules over the status page's channels (and the lease);
/// `rights: null` without a rules file (the role alone decides).
fn access_json(gateway: &Gateway, viewer: &crate::access_rules::Who, channels: &[String]) -> Json {
    use crate::rules::{Action, ChannelFacts};
    let Some(rules) = gateway.station.access_rules().current() else {
        return json!({ "rulesVersion": 0, "viewer": viewer.name, "rights": Json::Null });
    };
    let info = gateway.link.info();
    let principal = rules.principal(&viewer.subject());
    let shown = [
        Action::ReadCache,
        Action::ReadHardware,
        Action::Write,
        Action::Configure,
    ];
    let rights: serde_json::Map<String, Json> = channels
        .iter()
        .map(|name| {
            let facts = crate::station::channel_facts(&info.channels, name);
            let allowed: Vec<&str> = shown
                .iter()
                .filter(|action| rules.decide(&principal, &facts, **action, None).allowed)
                .map(|action| action.word())
                .collect();
            (name.clone(), json!(allowed))
        })
        .collect();
    let lease = rules.decide(&principal, &ChannelFacts::named(""), Action::Lease, None);
    let safe_stop = rules.decide(&principal, &ChannelFacts::named(""), Action::SafeStop, None);
    let unmatched: Vec<String> = crate::access_rules::unmatched(&rules, &info.channels)
        .iter()
        .map(ToString::to_string)
        .collect();
    json!({
        "rulesVersion": rules.version(),
        "viewer": viewer.name,
        "rights": rights,
        "lease": { "allowed": lease.allowed, "rule": &*lease.rule },
        "safeStop": { "allowed": safe_stop.allowed, "rule": &*safe_stop.rule },
        "unmatched": unmatched,
        "rulesForOtherStations": gateway.station.access_rules().unserved_said(),
    })
}

fn status_json(gateway: &Gateway, viewer: &crate::access_rules::Who) -> Json {
    let info = gateway.link.info();
    let stats: &LinkStats = gateway.link.stats();
    let hello = info.hello.as_ref();
    let chosen = status_channels(&gateway.config.status_page.channels, &info.channels);
    let (channels, plots) = trend_plots(&chosen, &info.channels);
    let units: serde_json::Map<String, Json> = channels
        .iter()
        .filter_map(|name| info.channels.get(name))
        .map(|ch| (ch.name.clone(), Json::String(ch.unit.clone())))
        .collect();
    let (hits, misses) = gateway.link.cache().hits_and_misses();
    json!({
        "gateway": {
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSeconds": gateway.started.elapsed().as_secs(),
        },
        "station": {
            "connected": info.connected,
            "generation": info.generation,
            "lastError": info.last_error,
            "name": hello.map(|h| h.station.clone()),
            "serial": hello.map(|h| h.serial.clone()),
            "firmware": hello.map(|h| h.firmware.clone()),
            "channelCount": info.channels.channels.len(),
        },
        "lease": gateway.lease.view(),
        "access": access_json(gateway, viewer, &channels),
        "lastConfiguration": gateway.config_files.last_loaded_json(),
        "link": {
            "requests": LinkStats::get(&stats.frames_sent),
            "readFrames": LinkStats::get(&stats.read_frames),
            "namesRead": LinkStats::get(&stats.names_read),
            "timeouts": LinkStats::get(&stats.timeouts),
            "crcErrors": LinkStats::get(&stats.crc_errors),
            "reconnects": LinkStats::get(&stats.reconnects),
            "queueDepth": gateway.link.queue_depth(),
            "meanLatencyMs": stats.latency.mean().map(|mean| mean.as_secs_f64() * 1000.0),
            "cacheHits": hits,
            "cacheMisses": misses,
        },
        "events": {
            "streams": gateway.events.stream_count(),
            "subscriptions": gateway.events.subscription_count(),
        },
        "numericResults": gateway.numeric.latest().iter().map(|m| json!({
            "channel": m.channel,
            "target": m.target,
            "unit": m.unit,
            "count": m.stats.count,
            "mean": m.stats.mean,
            "stdev": m.stats.stdev,
            "min": m.stats.min,
            "max": m.stats.max,
            "started": crate::lease::rfc3339(m.started),
        })).collect::<Vec<_>>(),
        "channels": channels,
        "plots": plots,
        "units": units,
        "audit": gateway.audit.status(),
        "intervalMs": gateway.config.status_page.interval_ms,
    })
}

/// After a request was answered: its metrics, the 401 challenge while Basic users are
/// configured, and the access log line (method, path with any lease id hidden, status, time;
/// never credentials, never a lease id).
pub fn finish(
    gateway: &Gateway,
    slot: usize,
    method: &Method,
    access_path: Option<&str>,
    peer: SocketAddr,
    started: Instant,
    response: &mut Response<Body>,
) {
    let elapsed = started.elapsed();
    let status = response.status();
    let metrics = &gateway.metrics;
    metrics.http.record(slot, status.as_u16(), elapsed);
    match error_kind(response) {
        Some(ErrorKind::Locked) => metrics.lease_refused_locked.inc(),
        Some(ErrorKind::Conflict) if Some(slot) == api::lease_acquire_slot() => {
            metrics.lease_refused_held.inc()
        }
        kind => count_access_refusal(gateway, kind, response),
    }
    if let Some(path) = access_path {
        access_log(method, path, peer, status, elapsed);
    }
}

/// An access control refusal answered: counted, and a 401 challenged while Basic users are
/// configured (a station's requests through [`finish`], the lab's own in `lab.rs`).
pub fn access_refusal(gateway: &Gateway, response: &mut Response<Body>) {
    count_access_refusal(gateway, error_kind(response), response);
}

/// [`access_refusal`] for a request to the lab's own paths, judged by `access` and counted in
/// the whole gateway's `refusals` (no station's).
pub fn count_lab_access_refusal(
    refusals: &crate::metrics::AccessRefusals,
    access: &crate::credentials::AccessControl,
    response: &mut Response<Body>,
) {
    let kind = error_kind(response);
    count_refusal(
        [&refusals.unauthenticated, &refusals.forbidden],
        access,
        kind,
        response,
    );
}

/// [`access_refusal`] with the answer's error kind already read.
fn count_access_refusal(gateway: &Gateway, kind: Option<ErrorKind>, response: &mut Response<Body>) {
    let metrics: &Metrics = &gateway.metrics;
    count_refusal(
        [&metrics.access_unauthenticated, &metrics.access_forbidden],
        &gateway.access,
        kind,
        response,
    );
}

/// Counts a refusal of `kind` in its counter (`[401, 403]`), with Basic's challenge when
/// `access` offers it.
fn count_refusal(
    [unauthenticated, forbidden]: [&crate::metrics::Counter; 2],
    access: &crate::credentials::AccessControl,
    kind: Option<ErrorKind>,
    response: &mut Response<Body>,
) {
    match kind {
        Some(ErrorKind::Unauthorized) => {
            unauthenticated.inc();
            if access.basic_enabled() {
                response
                    .headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static(BASIC_CHALLENGE));
            }
        }
        Some(ErrorKind::Forbidden) => forbidden.inc(),
        _ => {}
    }
}

/// Whether access log lines are wanted (`RUST_LOG=access=off` turns them off); when not, the
/// request entry keeps no copy of the URI.
pub fn access_log_enabled() -> bool {
    tracing::enabled!(target: "access", tracing::Level::INFO)
}

/// One request's access line; `path` already redacted (`redact::loggable_path`). Rendered
/// straight into the log writer's batch where the logger allows ([`AccessLine::write_direct`]),
/// through `tracing` otherwise: the same line either way.
fn access_log(
    method: &Method,
    path: &str,
    peer: SocketAddr,
    status: StatusCode,
    elapsed: Duration,
) {
    let duration_ms = (elapsed.as_secs_f64() * 1e6).round() / 1000.0;
    let line = crate::logs::AccessLine {
        method: method.as_str(),
        path,
        status: status.as_u16(),
        duration_ms,
        peer,
    };
    if line.write_direct() {
        return;
    }
    info!(
        target: "access",
        method = %method,
        path = %path,
        status = status.as_u16(),
        duration_ms,
        peer = %peer,
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics labels of the operations and named leases are what they have always been,
    /// each at its row's slot; every route has a slot of its own.
    #[test]
    fn every_route_has_its_own_slot_in_table_order() {
        let metrics = new_metrics();
        assert_eq!(
            api::metric_labels()[..7],
            [
                "unmatched",
                "GET /healthz",
                "GET /readyz",
                "GET /metrics",
                "GET /",
                "GET /status.json",
                "v1/leases and v1/semaphores",
            ]
        );
        assert_eq!(metrics.http.slot_of("unmatched"), Some(api::UNMATCHED_SLOT));
        for (position, route) in api::ROUTES.iter().enumerate() {
            assert_eq!(
                metrics.http.slot_of(route.label()),
                Some(api::slot(position))
            );
        }
        assert_eq!(
            api::lease_acquire_slot(),
            metrics.http.slot_of("POST api/lease")
        );
        for (path, label) in [
            ("/healthz", "GET /healthz"),
            ("/readyz", "GET /readyz"),
            ("/metrics", "GET /metrics"),
            ("", "GET /"),
            ("/", "GET /"),
            ("/index.html", "GET /"),
            ("/status.json", "GET /status.json"),
        ] {
            let (position, route, _) = api::find_operation(path).unwrap();
            assert_eq!(route.label(), label);
            assert_eq!(metrics.http.slot_of(label), Some(api::slot(position)));
        }
        assert!(api::find_operation("/nope").is_none());
        let (position, _, _) = api::named_leases();
        assert_eq!(
            metrics.http.slot_of("v1/leases and v1/semaphores"),
            Some(api::slot(position))
        );
    }

    #[test]
    fn monitors_are_plotted_with_their_set_points() {
        use station_protocol::{ChannelDescriptor, Direction, ValueType};
        let channel = |name: &str| ChannelDescriptor {
            name: name.into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: Direction::In,
            unit: "V".into(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming: false,
            value_type: ValueType::Float,
            options: Vec::new(),
        };
        let table = ChannelTable::new(vec![
            channel("0.4.X.VSET1"),
            channel("0.4.X.VMON1"),
            channel("0.4.X.IMON1"),
            channel("0.4.X.VMON2"),
            channel("MON_3V3"),
        ]);
        let chosen = ["0.4.X.VMON1", "0.4.X.IMON1", "0.4.X.VMON2", "MON_3V3"].map(String::from);
        let (channels, plots) = trend_plots(&chosen, &table);
        assert_eq!(
            channels,
            [
                "0.4.X.VSET1",
                "0.4.X.VMON1",
                "0.4.X.IMON1",
                "0.4.X.VMON2",
                "MON_3V3"
            ]
        );
        assert_eq!(plots[0].set_point.as_deref(), Some("0.4.X.VSET1"));
        assert_eq!(plots[0].title, "VMON1");
        // No ISET1 in the table, no VSET2: plotted alone.
        assert_eq!(plots[1].set_point, None);
        assert_eq!(plots[2].set_point, None);
        assert_eq!(plots[3].set_point, None);
        assert_eq!(set_point_of("CPU_TEMP"), None);
        assert_eq!(set_point_of("MON1"), None);
        assert_eq!(set_point_of("X.IMON12").as_deref(), Some("X.ISET12"));
    }

    #[test]
    fn status_channels_match_whole_names_or_their_ends() {
        use station_protocol::{ChannelDescriptor, Direction, ValueType};
        let channel = |name: &str| ChannelDescriptor {
            name: name.into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: Direction::In,
            unit: "V".into(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming: false,
            value_type: ValueType::Float,
            options: Vec::new(),
        };
        let table = ChannelTable::new(vec![
            channel("0.4.X.VMON1"),
            channel("0.4.X.VMON10"),
            channel("0.4.X.XVMON1"),
            channel("CPU_TEMP"),
        ]);
        let configured = ["VMON1", "CPU_TEMP", "NOPE", "0.4.X.VMON10", "VMON1"].map(String::from);
        assert_eq!(
            status_channels(&configured, &table),
            ["0.4.X.VMON1", "CPU_TEMP", "0.4.X.VMON10"]
        );
    }
}
