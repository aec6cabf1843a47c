//! The legacy listener: 6.x byte-protocol clients connect here instead of to the station,
//! share the one station link, and are bound by the control lease like everyone else.
//!
//! Each client gets a reader (this task) and a writer task joined by a bounded queue of reply
//! frames: a client that does not read its replies fills its queue and is dropped, and never
//! slows the link or the other clients. Request ids need no table: every request is answered by
//! the task that asked the link, with the client's own id.
//!
//! Legacy clients never hold the control lease: while anyone does, their changes and consuming
//! reads get LOCKED and other reads come from the cache up to `legacy.read_max_age_ms` (misses
//! read from the hardware). Every change goes through `change`, one function for write,
//! transact, configure, reset and bus.
//!
//! A front end beside HTTP, on the station core only: it serves a station's
//! [`StationRuntime`](station_core::runtime::StationRuntime), whoever started it.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use station_protocol::{
    ErrorCode, HelloReply, ItemResult, PayloadError, RawFrame, Request, Response, StationCodec,
    StationError, Value,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub mod codes;

use station_core::lease::{Access, Admitted, LeaseError};
use station_core::link::{LinkError, LinkEvent};
use station_core::runtime::StationRuntime;
use station_core::station::{
    Change, ChangeAnswer, ChangeOrigin, ChangeWhat, ConsumingRule, Freshness, FrontEnd, ItemError,
    ReadPolicy, Step, StepAction, UnknownRule,
};

/// Serves legacy clients on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<StationRuntime>,
    shutdown: CancellationToken,
) {
    let limits = Arc::new(Semaphore::new(gateway.config.legacy.max_clients));
    let allowed: Vec<IpAddr> = gateway
        .config
        .legacy
        .allow
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    debug!("legacy accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if !allowed.is_empty() && !allowed.contains(&peer.ip()) {
            warn!(%peer, "legacy client refused: not on legacy.allow");
            gateway.metrics.legacy_refused.inc();
            continue;
        }
        let Ok(permit) = limits.clone().try_acquire_owned() else {
            warn!(%peer, "legacy client refused: {} clients already connected", gateway.config.legacy.max_clients);
            gateway.metrics.legacy_refused.inc();
            refuse_busy(stream).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            info!(%peer, "legacy client connected");
            gateway.metrics.legacy_connections.inc();
            gateway.metrics.legacy_clients.inc();
            let why = serve_client(stream, peer, gateway.clone(), shutdown).await;
            gateway.metrics.legacy_clients.dec();
            info!(%peer, "legacy client gone: {why}");
            drop(permit);
        });
    }
}

/// Tells a client over the connection limit why, then closes.
async fn refuse_busy(stream: TcpStream) {
    let mut writer = FramedWrite::new(stream, StationCodec::new());
    let error = StationError::new(
        ErrorCode::Busy,
        "the gateway has too many legacy clients; try again later",
    );
    if let Ok(frame) = Response::Error(error).to_frame(0) {
        let _ = tokio::time::timeout(Duration::from_millis(200), writer.send(frame)).await;
    }
}

/// Serves one client until it leaves, idles out, overflows or the gateway shuts down.
async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    gateway: Arc<StationRuntime>,
    shutdown: CancellationToken,
) -> String {
    let config = &gateway.config.legacy;
    let (read_half, write_half) = stream.into_split();
    let mut frames = FramedRead::new(read_half, StationCodec::new());
    let (replies, mut outbox) = mpsc::channel::<RawFrame>(config.output_frames);
    let client_gone = CancellationToken::new();
    let writer = {
        let client_gone = client_gone.clone();
        tokio::spawn(async move {
            let mut sink = FramedWrite::new(write_half, StationCodec::new());
            while let Some(frame) = outbox.recv().await {
                if sink.send(frame).await.is_err() {
                    break;
                }
            }
            client_gone.cancel();
        })
    };
    let mut notifications = gateway.station.subscribe_events();
    let in_flight = Arc::new(Semaphore::new(usize::from(config.window)));
    let idle = Duration::from_millis(config.idle_timeout_ms);
    let why = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break "the gateway is shutting down".to_owned(),
            _ = client_gone.cancelled() => break "the connection closed".to_owned(),
            event = notifications.recv() => {
                if let Ok(LinkEvent::Notify(notify)) = event
                    && let Ok(frame) = Response::Notify(notify).to_frame(0)
                    && replies.try_send(frame).is_err()
                {
                    break "it did not read its replies (output buffer full)".to_owned();
                }
            }
            frame = tokio::time::timeout(idle, frames.next()) => match frame {
                Err(_) => break format!("idle for {} s", idle.as_secs()),
                Ok(None) => break "the client closed the connection".to_owned(),
                Ok(Some(Err(error))) => break format!("read failed: {error}"),
                Ok(Some(Ok(frame))) => {
                    let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                        let busy = StationError::new(ErrorCode::Busy, format!(
                            "more than {} requests in flight; wait for answers", config.window));
                        if !queue_reply(&replies, frame.request_id, Response::Error(busy)) {
                            break "it did not read its replies (output buffer full)".to_owned();
                        }
                        continue;
                    };
                    let gateway = gateway.clone();
                    let replies = replies.clone();
                    let client_gone = client_gone.clone();
                    tokio::spawn(async move {
                        let request_id = frame.request_id;
                        let response = answer(&gateway, &frame, peer).await;
                        if !queue_reply(&replies, request_id, response) {
                            client_gone.cancel();
                        }
                        drop(permit);
                    });
                }
            },
        }
    };
    drop(replies);
    writer.abort();
    why
}

/// Queues a reply; false when the client's output buffer is full.
fn queue_reply(replies: &mpsc::Sender<RawFrame>, request_id: u32, response: Response) -> bool {
    let frame = response.to_frame(request_id).unwrap_or_else(|error| {
        let too_big = StationError::new(
            ErrorCode::Internal,
            format!("the answer does not fit in a frame: {error}"),
        );
        Response::Error(too_big)
            .to_frame(request_id)
            .expect("a short error always fits")
    });
    match replies.try_send(frame) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Closed(_)) => true,
        Err(mpsc::error::TrySendError::Full(_)) => false,
    }
}

/// The answer to one request frame, as the station would give it.
async fn answer(gateway: &StationRuntime, frame: &RawFrame, peer: SocketAddr) -> Response {
    let request = match Request::from_frame(frame) {
        Ok(request) => request,
        Err(PayloadError::UnknownOpcode(op) | PayloadError::NotARequest(op)) => {
            return Response::Error(StationError::new(
                ErrorCode::Unsupported,
                format!("opcode 0x{op:02X} is not a request this station answers"),
            ));
        }
        Err(error) => {
            return Response::Error(StationError::new(
                ErrorCode::Malformed,
                format!("malformed request: {error}"),
            ));
        }
    };
    let station = &gateway.station;
    let info = station.info();
    let connected = || -> Result<(), Response> {
        station.connected().map(drop).map_err(|not_reached| {
            Response::Error(StationError::new(
                ErrorCode::Internal,
                not_reached.to_string(),
            ))
        })
    };
    match request {
        // One answer per request here; acquisitions go through the REST numeric-results API.
        Request::Sample(_) => Response::Error(StationError::new(
            ErrorCode::Unsupported,
            "SAMPLE is not relayed to legacy clients; use the gateway's api/numeric-results",
        )),
        Request::Ping { nonce } => Response::Ping { nonce },
        Request::Hello(_) => match &info.hello {
            Some(hello) => Response::Hello(HelloReply {
                window: gateway.config.legacy.window,
                ..hello.clone()
            }),
            None => connected()
                .err()
                .unwrap_or_else(|| internal("the station has not said hello yet")),
        },
        Request::System => match info.hello {
            Some(_) => Response::System(info.modules.clone()),
            None => connected()
                .err()
                .unwrap_or_else(|| internal("the station has not been reached yet")),
        },
        Request::List { offset, limit } => {
            station_protocol::list_page(&info.channels.channels, offset, limit)
        }
        Request::Read { names } => {
            if let Err(error) = connected() {
                return error;
            }
            read(gateway, names, peer).await
        }
        // Changes: each translated to the station service's `Change`, which runs it to its
        // end and writes its audit line; its answer translated back.
        Request::Write { items } => {
            if let Err(error) = connected() {
                return error;
            }
            debug!(%peer, items = items.len(), "legacy write");
            let asked = asked_text(&items);
            change(gateway, peer, "write", ChangeWhat::Write(items), asked).await
        }
        Request::Configure(configure) => {
            if let Err(error) = connected() {
                return error;
            }
            if configure.settings.is_empty() {
                // Only asks: changes nothing, so no lease check and no audit line.
                return match station.channel_config(&configure.name).await {
                    Ok(reply) => Response::Configure(Box::new(reply)),
                    Err(error) => link_error(error),
                };
            }
            // An alias that would make one name mean two channels is refused here as for REST.
            let channel = info.channels.station_name(&configure.name).to_owned();
            let aliases = configure
                .settings
                .iter()
                .filter_map(|(key, value)| match value {
                    Value::String(alias) if key == "alias" => {
                        Some((channel.as_str(), alias.as_str()))
                    }
                    _ => None,
                });
            let clash =
                station_core::config_files::settings::check_aliases(&info.channels, aliases);
            let asked: Vec<(String, Value)> = configure
                .settings
                .iter()
                .map(|(key, value)| (format!("{}.{key}", configure.name), value.clone()))
                .collect();
            if let Err(why) = clash {
                // Refused before it is a change: in the audit trail as refused all the same.
                let front = FrontEnd::Legacy {
                    operation: "configure",
                };
                let mut origin = ChangeOrigin::new(front, peer, Instant::now());
                origin.caller = Some("legacy".into());
                origin.asked = Some(asked_text(&asked));
                gateway.station.record_refused(origin, &why).await;
                return Response::Error(StationError::new(ErrorCode::BadSettings, why));
            }
            let step = Step {
                label: format!("configure {}", configure.name),
                action: StepAction::Configure(configure),
            };
            let what = ChangeWhat::Steps(vec![step]);
            change(gateway, peer, "configure", what, asked_text(&asked)).await
        }
        Request::Transact { name, value } => {
            if let Err(error) = connected() {
                return error;
            }
            let asked = asked_text(&[(name.clone(), value.clone())]);
            let what = ChangeWhat::Transact { name, value };
            change(gateway, peer, "transact", what, asked).await
        }
        Request::Reset(reset) => {
            if let Err(error) = connected() {
                return error;
            }
            let requester = format!("{} (legacy client {peer})", reset.requester);
            let what = ChangeWhat::Reset { requester };
            change(gateway, peer, "reset", what, String::new()).await
        }
        // A bus transaction changes or consumes a device's state: a change.
        Request::Bus(bus) => {
            if let Err(error) = connected() {
                return error;
            }
            debug!(%peer, channel = %bus.channel, action = bus.action.name(), "legacy bus transaction");
            let asked = asked_text(&[(bus.channel.clone(), Value::Bytes(bus.data.clone()))]);
            change(gateway, peer, "bus", ChangeWhat::Bus(bus), asked).await
        }
    }
}

/// `NAME=VALUE,...` for a change's audit line.
fn asked_text(items: &[(String, Value)]) -> String {
    let asked: Vec<String> = items
        .iter()
        .map(|(name, value)| format!("{name}={}", value.render()))
        .collect();
    asked.join(",")
}

/// A legacy client's change (`operation`: write, transact, configure, reset, bus), translated
/// to the station service's [`Change`] and its report back to the station's answer. Legacy
/// clients never hold the lease: their changes go through only while nobody does; a refused
/// one is in the audit trail too.
async fn change(
    gateway: &StationRuntime,
    peer: SocketAddr,
    operation: &'static str,
    what: ChangeWhat,
    asked: String,
) -> Response {
    let mut origin = ChangeOrigin::new(FrontEnd::Legacy { operation }, peer, Instant::now());
    origin.caller = Some("legacy".into());
    origin.asked = Some(asked);
    // Asked first: does this process own the station's link now? If not, the answer names
    // who serves the station.
    if let Err(not_owner) = gateway.owns_link() {
        let message = not_owner.to_string();
        gateway.station.record_refused(origin, &message).await;
        return Response::Error(StationError::new(
            codes::legacy_code(not_owner.kind()),
            message,
        ));
    }
    let admitted = match legacy_policy(gateway, Access::Change) {
        LegacyPolicy::Locked(message) => {
            gateway.station.record_refused(origin, &message).await;
            return locked(message);
        }
        LegacyPolicy::Open(admitted) => admitted,
    };
    let change = Change {
        what,
        origin,
        admitted,
    };
    let report = match gateway.station.change(change).await {
        Ok(report) => report,
        Err(still_running) => return internal(&still_running.to_string()),
    };
    match report.answer {
        Ok(ChangeAnswer::Written(results)) => Response::Write(results),
        Ok(ChangeAnswer::Transacted(value)) => Response::Transact(value),
        Ok(ChangeAnswer::Bus(received)) => Response::Bus(received),
        Ok(ChangeAnswer::Reset) => Response::Reset,
        Ok(ChangeAnswer::Stepped(mut done)) => match (done.stopped, done.done.pop()) {
            (Some((_, error)), _) => link_error(error),
            (None, Some(Some(reply))) => Response::Configure(Box::new(reply)),
            (None, _) => internal("the station answered the configure with nothing"),
        },
        Ok(ChangeAnswer::Sampled { .. }) => internal("SAMPLE is not relayed to legacy clients"),
        Err(error) => link_error(error),
    }
}

/// A READ: straight to the hardware, every name as asked, while nobody holds the lease (reads
/// of channels whose read consumes data under the admission's send guard, so one still queued
/// when a lease is granted is never sent); while someone does, from the cache up to
/// `legacy.read_max_age_ms`, misses read, and channels whose read consumes data refused with
/// LOCKED.
async fn read(gateway: &StationRuntime, names: Vec<String>, peer: SocketAddr) -> Response {
    let lease = legacy_policy(gateway, Access::ForcedRead);
    let (policy, locked_by) = match &lease {
        LegacyPolicy::Open(admitted) => (
            ReadPolicy::hardware(Some(peer), admitted.guard.as_ref()),
            None,
        ),
        LegacyPolicy::Locked(message) => {
            let max_age = Duration::from_millis(gateway.config.legacy.read_max_age_ms);
            let policy = ReadPolicy {
                freshness: Freshness::Within(max_age),
                consuming: ConsumingRule::Refuse,
                unknown: UnknownRule::AskStation,
                caller: Some(peer),
                cancel: None,
                guard: None,
                who: None,
            };
            (policy, Some(message.as_str()))
        }
    };
    let who = station_core::access_rules::Who {
        name: None,
        address: Some(peer.ip()),
        group: gateway
            .station
            .access_rules()
            .legacy_group()
            .map(str::to_owned),
        holds_lease: false,
    };
    let policy = ReadPolicy {
        who: Some(&who),
        ..policy
    };
    // This policy never refuses a read as a whole (only a cache-only one does), but for the
    // access rules.
    let readings = match gateway.station.read(&names, policy).await {
        Ok(readings) => readings,
        Err(station_core::station::ReadError::AccessDenied(refusal)) => {
            return link_error(LinkError::Refused(station_core::link::GuardRefusal::from(
                refusal,
            )));
        }
        Err(_) => return internal("the read was refused"),
    };
    let mut results: Vec<ItemResult<Value>> = Vec::with_capacity(readings.len());
    for (name, reading) in names.iter().zip(readings) {
        results.push(match reading {
            Ok(reading) => Ok(reading.value),
            Err(ItemError::Station(error)) => Err(error),
            Err(ItemError::Link(error)) => return link_error(error),
            Err(ItemError::Consuming) => Err(StationError::new(
                ErrorCode::Locked,
                format!(
                    "reading {name} consumes data, which only the lease holder may do: {}",
                    locked_by.unwrap_or("the lease is held")
                ),
            )),
            Err(error @ (ItemError::UnknownChannel | ItemError::Cancelled)) => Err(
                StationError::new(ErrorCode::Internal, format!("{name}: {error}")),
            ),
        });
    }
    Response::Read(results)
}

/// What the lease allows a legacy client right now.
enum LegacyPolicy {
    /// Nobody holds the lease: requests pass as on the station; changes carry the send guard
    /// of this admission.
    Open(Admitted),
    /// Someone holds it: the message names the holder and the time left.
    Locked(String),
}

/// Legacy clients never hold the lease (the byte protocol has no way to say so): they may
/// change the station (`access`: a change, or a forced read, whose guard covers channels whose
/// read consumes data) only while nobody holds it.
fn legacy_policy(gateway: &StationRuntime, access: Access) -> LegacyPolicy {
    match gateway.lease.admit(access, None) {
        Ok(admitted) if admitted.guard.is_some() => LegacyPolicy::Open(admitted),
        Ok(_) => LegacyPolicy::Locked("the control lease refused the change".into()),
        Err(error @ LeaseError::LockedBy { .. }) => LegacyPolicy::Locked(error.to_string()),
        Err(error) => LegacyPolicy::Locked(error.to_string()),
    }
}

fn locked(message: String) -> Response {
    Response::Error(StationError::new(ErrorCode::Locked, message))
}

fn internal(message: &str) -> Response {
    Response::Error(StationError::new(ErrorCode::Internal, message))
}

/// A link error as the station protocol's ERROR frame.
fn link_error(error: LinkError) -> Response {
    let code = match &error {
        LinkError::Station(station) => return Response::Error(station.clone()),
        other => codes::legacy_code(other.kind()),
    };
    Response::Error(StationError::new(code, error.to_string()))
}
