//! The lab's one event stream (`GET /v1/stations/events`): every station's changes of hands of
//! its control lease (`lease`) and its link going up or down (`connection`), each naming its
//! station, after a first `stations` event with every station as `GET /v1/stations` shows it.
//! A station's own stream (`/stations/{id}/api/events`) stays what it is; this one is for a
//! lab's dashboard.
//!
//! Every lab stream carries the same events, so they are numbered once, for the lab
//! ([`LabEvents`]: one relay task takes the stations' broadcasts, gives each event the lab's
//! next id, keeps the last [`KEPT`] for readers that reconnect, and fans it out on one
//! broadcast channel). An id is `EEEE 00000 QQQQQQQQQQ` (`events/event_id.rs`: the lab's epoch,
//! stream slot 0, the event's place in the lab's sequence); the `stations` event carries the id
//! of the last event it already reflects. A reader that reconnects with `Last-Event-ID` gets
//! `resumed` and every event it missed, or, when they are no longer kept or the gateway
//! restarted, a `gap` (why, and the ids lost) and a fresh `stations`. A reader that falls
//! [`KEPT`] events behind gets a last `closed` event saying so, then the end: nothing waits
//! for it, nothing of it is dropped silently.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::Response;
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value as Json, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ErrorKind};
use crate::events::event_id::{EventId, random_epoch};
use crate::events::replay::{Replay, ReplayBuffer};
use crate::events::resume::GapReason;
use crate::events::sse::{PING, PING_INTERVAL};
use crate::lease::LeaseView;
use crate::link::LinkEvent;
use crate::reply::Body;

use super::roster::Stations;

/// Events the lab keeps for readers that reconnect, and holds for a slow reader before it is
/// closed.
pub const KEPT: usize = 256;

/// The lab stream's slot in its ids (station streams have 1 to 99 999).
const LAB_SLOT: u32 = 0;

/// One event of the lab stream, as sent (without an id).
pub fn event_frame(name: &str, data: &Json) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A `lease` event of station `id`: its [`LeaseView`], with `station`.
pub fn lease_event(id: &str, view: &LeaseView) -> (&'static str, Json) {
    let mut data = serde_json::to_value(view).unwrap_or_else(|_| json!({}));
    if let Json::Object(fields) = &mut data {
        fields.insert("station".into(), Json::String(id.to_owned()));
    }
    ("lease", data)
}

/// A `connection` event of station `id`; `None` for the link's other events.
pub fn link_event(id: &str, event: &LinkEvent) -> Option<(&'static str, Json)> {
    match event {
        LinkEvent::Connection {
            connected,
            generation,
            last_error,
        } => Some((
            "connection",
            json!({
                "station": id,
                "isConnected": connected,
                "generation": generation,
                "lastError": last_error,
            }),
        )),
        LinkEvent::Configuration { .. } | LinkEvent::Notify(_) => None,
    }
}

/// The lab's events: numbered once, the last [`KEPT`] kept, fanned out to every lab stream.
pub struct LabEvents {
    epoch: u16,
    state: Mutex<LabState>,
    /// Each event as sent (with its id), to every open lab stream.
    sender: broadcast::Sender<Bytes>,
    /// Whether the relay task runs (it starts with the first lab stream).
    relay: OnceLock<()>,
    /// The lab streams open now, against the limit (`events.max_streams`).
    open: AtomicUsize,
}

struct LabState {
    /// The last events, each as sent with its id; its `next()` is the next event's sequence.
    kept: ReplayBuffer<Bytes>,
}

impl Default for LabEvents {
    fn default() -> LabEvents {
        LabEvents {
            epoch: random_epoch(),
            state: Mutex::new(LabState {
                kept: ReplayBuffer::new(1, KEPT),
            }),
            sender: broadcast::channel(KEPT).0,
            relay: OnceLock::new(),
            open: AtomicUsize::new(0),
        }
    }
}

impl LabEvents {
    fn state(&self) -> MutexGuard<'_, LabState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn id(&self, sequence: u64) -> EventId {
        EventId::new(self.epoch, LAB_SLOT, sequence)
    }

    /// Numbers one event, keeps it and sends it to every lab stream: under one lock, so that a
    /// stream opening takes what is kept and then every event after it, none twice.
    fn publish(&self, name: &str, data: &Json) {
        let mut state = self.state();
        let id = self.id(state.kept.next());
        let frame = Bytes::from(format!("id: {id}\nevent: {name}\ndata: {data}\n\n"));
        state.kept.push(frame.clone());
        let _ = self.sender.send(frame);
    }
}

/// Counts one open stream until dropped.
struct Counted(Arc<Stations>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.lab_events.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The `Last-Event-ID` of a reconnecting reader: the header, else the query parameter
/// `lastEventId`; an empty one counts as none.
fn last_event_id(headers: &HeaderMap, query: Option<&str>) -> Result<Option<EventId>, ApiError> {
    let header = headers
        .get("last-event-id")
        .map(|value| value.to_str().unwrap_or("\u{fffd}").to_owned());
    let query = || {
        form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(key, _)| key == "lastEventId")
            .map(|(_, value)| value.into_owned())
    };
    match header.or_else(query) {
        Some(id) if !id.trim().is_empty() => EventId::parse(&id)
            .map(Some)
            .map_err(|bad| ApiError::new(ErrorKind::BadRequest, bad.to_string())),
        _ => Ok(None),
    }
}

/// Opens a lab stream (resumed when the request carries `Last-Event-ID`): 503 when
/// `events.max_streams` are open already.
pub fn open(
    stations: &Arc<Stations>,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let last_seen = last_event_id(headers, query)?;
    let wide = stations.wide();
    let lab = &stations.lab_events;
    let limit = wide.max_lab_streams;
    if lab.open.fetch_add(1, Ordering::Relaxed) >= limit {
        lab.open.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            format!("{limit} lab event streams are open (events.max_streams); close one first"),
        ));
    }
    let counted = Counted(stations.clone());
    let shutdown = wide.shutdown.clone();
    lab.relay.get_or_init(|| {
        // Subscribed now, so that nothing after this first stream opened is missed.
        let sources = stations
            .paths()
            .ids()
            .iter()
            .zip(stations.gateways())
            .map(|(id, gateway)| Source {
                id: id.clone(),
                lease: Some(gateway.lease_events.subscribe()),
                link: Some(gateway.link.subscribe_events()),
            })
            .collect();
        tokio::spawn(relay(stations.clone(), sources, shutdown.clone()));
    });
    let (first, receiver) = {
        let state = lab.state();
        // Taken under the lock the relay publishes under: the receiver gets every event after
        // what the first frames cover.
        let receiver = lab.sender.subscribe();
        (first_frames(stations, &state, last_seen), receiver)
    };
    let frames = futures::stream::unfold(
        Feed {
            first: first.into(),
            receiver,
            shutdown: Box::pin(shutdown.cancelled_owned()),
            ping: ping_interval(),
            ended: false,
            _counted: counted,
        },
        Feed::next,
    );
    let mut response = Response::new(Body::Streamed(BoxBody::new(StreamBody::new(frames))));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// What a lab stream starts with: a new one, `stations`; a resumed one, `resumed` and the
/// events its reader missed; else a `gap` saying why and a fresh `stations`.
fn first_frames(stations: &Stations, state: &LabState, last_seen: Option<EventId>) -> Vec<Bytes> {
    let lab = &stations.lab_events;
    let stations_frame = || {
        let reflects = lab.id(state.kept.next() - 1);
        let data = Json::Array(super::roster::station_views(stations));
        Bytes::from(format!("id: {reflects}\nevent: stations\ndata: {data}\n\n"))
    };
    let Some(seen) = last_seen else {
        return vec![stations_frame()];
    };
    let gap = |reason: GapReason, to: Option<u64>| {
        let data = gap_data(reason, seen, to.map(|to| lab.id(to)));
        vec![event_frame("gap", &data), stations_frame()]
    };
    if seen.epoch != lab.epoch {
        return gap(GapReason::Restart, None);
    }
    if seen.stream != LAB_SLOT {
        return gap(GapReason::Unknown, None);
    }
    match state.kept.after(seen.sequence) {
        Replay::Events(missed) => {
            let resumed = json!({ "lastEventId": seen.to_string(), "replayed": missed.len() });
            let mut frames = vec![event_frame("resumed", &resumed)];
            frames.extend(missed.into_iter().cloned());
            frames
        }
        Replay::Lost { to, .. } => gap(GapReason::Buffer, Some(to)),
        Replay::Unknown => gap(GapReason::Unknown, None),
    }
}

/// The lab stream's `gap` event: why, the id the reader sent, the ids lost (strings: they are
/// above what a JavaScript number holds exactly; `to` and `lost` when known).
fn gap_data(reason: GapReason, seen: EventId, to: Option<EventId>) -> Json {
    let message = match reason {
        GapReason::Restart => "the gateway restarted since that event; stations is the state now",
        GapReason::Buffer => {
            "the events after that one are no longer kept; stations is the state now"
        }
        GapReason::Ended | GapReason::Unknown => {
            "that id is not of an event of the lab stream; stations is the state now"
        }
    };
    json!({
        "reason": reason.label(),
        "message": message,
        "lastEventId": seen.to_string(),
        "from": EventId::of_number(seen.number().saturating_add(1)).to_string(),
        "to": to.map(|to| to.to_string()),
        "lost": to.map(|to| to.number().saturating_sub(seen.number())),
    })
}

fn ping_interval() -> tokio::time::Interval {
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping
}

/// One lab stream's frames: its first ones, then the lab's events as they come, a ping when
/// idle, a last `closed` event when its reader fell [`KEPT`] behind or the gateway shuts down.
struct Feed {
    first: std::collections::VecDeque<Bytes>,
    receiver: broadcast::Receiver<Bytes>,
    shutdown: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    ping: tokio::time::Interval,
    ended: bool,
    _counted: Counted,
}

impl Feed {
    async fn next(mut self) -> Option<(Result<Frame<Bytes>, Infallible>, Feed)> {
        if self.ended {
            return None;
        }
        if let Some(frame) = self.first.pop_front() {
            return Some((Ok(Frame::data(frame)), self));
        }
        let frame = tokio::select! {
            biased;
            _ = self.shutdown.as_mut() => {
                self.ended = true;
                closed_frame("shutdown", "the gateway is shutting down: reconnect with Last-Event-ID once it is back")
            }
            event = self.receiver.recv() => match event {
                Ok(frame) => {
                    self.ping.reset();
                    frame
                }
                Err(RecvError::Lagged(missed)) => {
                    self.ended = true;
                    tracing::info!("closed a lab event stream whose reader fell {KEPT} events behind");
                    closed_frame("behind", &format!(
                        "the reader fell {KEPT} events behind ({missed} not sent): reconnect with Last-Event-ID for a gap and a fresh stations event"
                    ))
                }
                Err(RecvError::Closed) => return None,
            },
            _ = self.ping.tick() => Bytes::from_static(PING),
        };
        Some((Ok(Frame::data(frame)), self))
    }
}

fn closed_frame(reason: &str, message: &str) -> Bytes {
    event_frame("closed", &json!({ "reason": reason, "message": message }))
}

/// The lab's relay: every station's lease and link events, numbered and published, until the
/// gateway shuts down.
async fn relay(stations: Arc<Stations>, mut sources: Vec<Source>, shutdown: CancellationToken) {
    loop {
        let next =
            futures::future::select_all(sources.iter_mut().map(|source| Box::pin(source.next())));
        let (name, data) = tokio::select! {
            _ = shutdown.cancelled() => return,
            ((name, data), ..) = next => (name, data),
        };
        stations.lab_events.publish(name, &data);
    }
}

/// One station's broadcasts; a source whose sender is gone is `None`.
struct Source {
    id: String,
    lease: Option<broadcast::Receiver<LeaseView>>,
    link: Option<broadcast::Receiver<LinkEvent>>,
}

impl Source {
    /// The next event of this station worth sending; pending forever once both sources ended.
    async fn next(&mut self) -> (&'static str, Json) {
        loop {
            tokio::select! {
                view = async { self.lease.as_mut().expect("guarded").recv().await }, if self.lease.is_some() => match view {
                    Ok(view) => return lease_event(&self.id, &view),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(station = %self.id, "the lab's relay fell {missed} lease events behind; they are lost");
                    }
                    Err(RecvError::Closed) => self.lease = None,
                },
                event = async { self.link.as_mut().expect("guarded").recv().await }, if self.link.is_some() => match event {
                    Ok(event) => if let Some(event) = link_event(&self.id, &event) {
                        return event;
                    },
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(station = %self.id, "the lab's relay fell {missed} link events behind; they are lost");
                    }
                    Err(RecvError::Closed) => self.link = None,
                },
                else => std::future::pending::<()>().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_names_its_station() {
        let (name, data) = lease_event("st2", &LeaseView::nobody());
        assert_eq!(name, "lease");
        assert_eq!(data["station"], "st2");
        assert_eq!(data["held"], false);
        let up = LinkEvent::Connection {
            connected: true,
            generation: 3,
            last_error: None,
        };
        let (name, data) = link_event("st1", &up).unwrap();
        let frame = event_frame(name, &data);
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            "event: connection\ndata: {\"generation\":3,\"isConnected\":true,\"lastError\":null,\"station\":\"st1\"}\n\n"
        );
    }

    #[test]
    fn the_lab_numbers_each_event_once_and_keeps_the_last_ones() {
        let lab = LabEvents::default();
        let mut receiver = lab.sender.subscribe();
        lab.publish("lease", &json!({ "n": 1 }));
        lab.publish("lease", &json!({ "n": 2 }));
        let first = receiver.try_recv().unwrap();
        let text = std::str::from_utf8(&first).unwrap();
        assert!(
            text.starts_with(&format!("id: {}\nevent: lease\n", lab.id(1))),
            "{text}"
        );
        assert_eq!(
            lab.state().kept.after(1),
            Replay::Events(vec![&receiver.try_recv().unwrap()])
        );
    }

    #[test]
    fn a_gap_names_the_ids_lost_as_strings() {
        let seen = EventId::new(2000, 0, 7);
        let data = gap_data(GapReason::Buffer, seen, Some(EventId::new(2000, 0, 300)));
        assert_eq!(data["reason"], "buffer");
        assert_eq!(data["from"], EventId::new(2000, 0, 8).to_string());
        assert_eq!(data["to"], EventId::new(2000, 0, 300).to_string());
        assert_eq!(data["lost"], 293);
        let data = gap_data(GapReason::Restart, seen, None);
        assert!(data["lost"].is_null(), "{data}");
    }
}
