//! The lab's one event stream (`GET /v1/stations/events`): every station's changes of hands of
//! its control lease (`lease`) and its link going up or down (`connection`), each naming its
//! station, after a first `stations` event with every station as `GET /v1/stations` shows it.
//! A station's own stream (`/stations/{id}/api/events`) stays what it is; this one is for a
//! lab's dashboard.
//!
//! One task per open stream takes the stations' broadcasts and fills the stream's bounded
//! queue with `try_send` only: no station waits for a reader, and a reader that stops reading
//! until the queue is full has its stream closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::Response;
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::{Value as Json, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ErrorKind};
use crate::lease::LeaseView;
use crate::link::LinkEvent;
use crate::reply::Body;

use super::roster::Stations;

/// Events a lab stream holds for a slow reader before it is closed.
const QUEUE: usize = 256;
use crate::events::sse::{PING, PING_INTERVAL};

/// One event of the lab stream, as sent.
pub fn event_frame(name: &str, data: &Json) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A `lease` event of station `id`: its [`LeaseView`], with `station`.
pub fn lease_event(id: &str, view: &LeaseView) -> Bytes {
    let mut data = serde_json::to_value(view).unwrap_or_else(|_| json!({}));
    if let Json::Object(fields) = &mut data {
        fields.insert("station".into(), Json::String(id.to_owned()));
    }
    event_frame("lease", &data)
}

/// A `connection` event of station `id`; `None` for the link's other events.
pub fn link_event(id: &str, event: &LinkEvent) -> Option<Bytes> {
    match event {
        LinkEvent::Connection {
            connected,
            generation,
            last_error,
        } => Some(event_frame(
            "connection",
            &json!({
                "station": id,
                "isConnected": connected,
                "generation": generation,
                "lastError": last_error,
            }),
        )),
        LinkEvent::Configuration { .. } | LinkEvent::Notify(_) => None,
    }
}

/// The lab streams open now, against the limit (`events.max_streams`).
#[derive(Debug, Default)]
pub struct OpenStreams(AtomicUsize);

/// Counts one open stream until dropped.
struct Counted(Arc<Stations>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.lab_streams.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Opens a lab stream: 503 when `events.max_streams` are open already.
pub fn open(stations: &Arc<Stations>) -> Result<Response<Body>, ApiError> {
    let host = stations.host();
    let limit = host.config.events.max_streams;
    let open = &stations.lab_streams.0;
    if open.fetch_add(1, Ordering::Relaxed) >= limit {
        open.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            format!("{limit} lab event streams are open (events.max_streams); close one first"),
        ));
    }
    let counted = Counted(stations.clone());
    let (sender, receiver) = mpsc::channel::<Bytes>(QUEUE);
    let first = event_frame(
        "stations",
        &Json::Array(super::roster::station_views(stations)),
    );
    let _ = sender.try_send(first);
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
    tokio::spawn(forward(sources, sender, host.shutdown.clone(), counted));
    let frames = futures::stream::unfold(receiver, |mut receiver| async move {
        let frame = receiver.recv().await?;
        Some((Ok(Frame::data(frame)), receiver))
    });
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

/// One station's broadcasts; a source whose sender is gone is `None`.
struct Source {
    id: String,
    lease: Option<broadcast::Receiver<LeaseView>>,
    link: Option<broadcast::Receiver<LinkEvent>>,
}

impl Source {
    /// The next event of this station worth sending; pending forever once both sources ended.
    async fn next(&mut self) -> Bytes {
        loop {
            tokio::select! {
                view = async { self.lease.as_mut().expect("guarded").recv().await }, if self.lease.is_some() => match view {
                    Ok(view) => return lease_event(&self.id, &view),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => self.lease = None,
                },
                event = async { self.link.as_mut().expect("guarded").recv().await }, if self.link.is_some() => match event {
                    Ok(event) => if let Some(frame) = link_event(&self.id, &event) {
                        return frame;
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => self.link = None,
                },
                else => std::future::pending::<()>().await,
            }
        }
    }
}

/// Fills one stream's queue until its reader goes, it falls a whole queue behind, or the
/// gateway shuts down.
async fn forward(
    mut sources: Vec<Source>,
    sender: mpsc::Sender<Bytes>,
    shutdown: CancellationToken,
    _counted: Counted,
) {
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    loop {
        let next =
            futures::future::select_all(sources.iter_mut().map(|source| Box::pin(source.next())));
        let frame = tokio::select! {
            _ = shutdown.cancelled() => return,
            () = sender.closed() => return,
            _ = ping.tick() => Bytes::from_static(PING),
            (frame, ..) = next => frame,
        };
        match sender.try_send(frame) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::info!("closed a lab event stream whose reader fell {QUEUE} events behind");
                return;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_names_its_station() {
        let frame = lease_event("st2", &LeaseView::nobody());
        let text = std::str::from_utf8(&frame).unwrap();
        assert!(text.starts_with("event: lease\ndata: {"), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
        let data: Json =
            serde_json::from_str(text.trim_start_matches("event: lease\ndata: ").trim()).unwrap();
        assert_eq!(data["station"], "st2");
        assert_eq!(data["held"], false);
        let up = LinkEvent::Connection {
            connected: true,
            generation: 3,
            last_error: None,
        };
        let frame = link_event("st1", &up).unwrap();
        let text = std::str::from_utf8(&frame).unwrap();
        assert_eq!(
            text,
            "event: connection\ndata: {\"generation\":3,\"isConnected\":true,\"lastError\":null,\"station\":\"st1\"}\n\n"
        );
    }
}
