//! One event stream on the wire: its bounded queue ([`StreamSink`]), filled without ever
//! waiting, and the never-ending `text/event-stream` body that drains it, sends a ping comment
//! every [`PING_INTERVAL`], and ends itself when the stream is closed or the gateway shuts down.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Events;

/// How often an idle stream sends a `:` comment; the contract asks for at least every 10 s.
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

const PING: &[u8] = b": ping\n\n";

/// What became of one event offered to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    Queued,
    /// The queue was full: the event is lost, its id used, so the reader sees a gap.
    Dropped,
    /// The stream has closed.
    Closed,
}

#[derive(Debug)]
struct SinkState {
    next_id: u64,
    /// Since when the queue has been full (set by a dropped event).
    full_since: Option<Instant>,
    dropped: u64,
}

/// The producers' side of one stream.
#[derive(Debug)]
pub struct StreamSink {
    pub id: Arc<str>,
    queue: mpsc::Sender<Bytes>,
    state: Mutex<SinkState>,
    closed: CancellationToken,
}

impl StreamSink {
    pub fn new(id: Arc<str>, capacity: usize) -> (Arc<StreamSink>, mpsc::Receiver<Bytes>) {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        let state = Mutex::new(SinkState {
            next_id: 1,
            full_since: None,
            dropped: 0,
        });
        (
            Arc::new(StreamSink {
                id,
                queue,
                state,
                closed: CancellationToken::new(),
            }),
            receiver,
        )
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues one event with the stream's next id; never waits.
    pub fn push(&self, event: &str, data: &str) -> Push {
        if self.closed.is_cancelled() {
            return Push::Closed;
        }
        // Ids are taken and events queued under one lock, so they reach the queue in order.
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        let frame = format!("id: {id}\nevent: {event}\ndata: {data}\n\n");
        match self.queue.try_send(Bytes::from(frame)) {
            Ok(()) => {
                state.full_since = None;
                Push::Queued
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                state.dropped += 1;
                state.full_since.get_or_insert_with(Instant::now);
                Push::Dropped
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Push::Closed,
        }
    }

    /// How long the queue has been full without a break, if it is full now.
    pub fn stuck_for(&self, now: Instant) -> Option<Duration> {
        let mut state = self.state();
        if self.queue.capacity() > 0 {
            state.full_since = None;
            return None;
        }
        state
            .full_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Events dropped so far because the reader was behind.
    pub fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Ends the stream: its body finishes the next time it is polled.
    pub fn close(&self) {
        self.closed.cancel();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }
}

/// Removes the stream from the registry (ending its subscriptions) when the body is dropped:
/// the client went away, the stream was closed, or the gateway stopped.
#[derive(Debug)]
pub struct StreamGuard {
    events: Weak<Events>,
    id: Arc<str>,
}

impl StreamGuard {
    pub fn new(events: Weak<Events>, id: Arc<str>) -> StreamGuard {
        StreamGuard { events, id }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(events) = self.events.upgrade() {
            events.close_stream(&self.id);
        }
    }
}

/// A stream just registered: what the HTTP handler turns into a response body.
pub struct OpenedStream {
    pub sink: Arc<StreamSink>,
    pub receiver: mpsc::Receiver<Bytes>,
    pub guard: StreamGuard,
}

struct BodyState {
    receiver: mpsc::Receiver<Bytes>,
    // Waited on across events, not made anew for each: a new wait registers with the token's
    // waiter list and leaves it again under its lock, and `shutdown` is one token shared by
    // every stream (about 7 % of the fan-out's CPU, issue 30).
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    ping: Interval,
    _guard: StreamGuard,
}

impl OpenedStream {
    /// The response body: queued events and pings until the stream closes or `shutdown`.
    pub fn into_body(self, shutdown: CancellationToken) -> BoxBody<Bytes, Infallible> {
        let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let state = BodyState {
            receiver: self.receiver,
            closed: Box::pin(self.sink.closed.clone().cancelled_owned()),
            shutdown: Box::pin(shutdown.cancelled_owned()),
            ping,
            _guard: self.guard,
        };
        let frames = futures::stream::unfold(state, |mut state| async move {
            let bytes = tokio::select! {
                biased;
                _ = state.shutdown.as_mut() => return None,
                _ = state.closed.as_mut() => return None,
                next = state.receiver.recv() => {
                    state.ping.reset();
                    next?
                }
                _ = state.ping.tick() => Bytes::from_static(PING),
            };
            Some((Ok::<_, Infallible>(Frame::data(bytes)), state))
        });
        StreamBody::new(frames).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ids_count_dropped_events_and_a_full_queue_reports_how_long() {
        let (sink, mut receiver) = StreamSink::new("s".into(), 2);
        assert_eq!(sink.push("a", "{}"), Push::Queued);
        assert_eq!(sink.push("b", "{}"), Push::Queued);
        assert_eq!(sink.push("c", "{}"), Push::Dropped);
        assert_eq!(sink.dropped(), 1);
        assert!(sink.stuck_for(Instant::now()).is_some());
        assert_eq!(
            receiver.recv().await.unwrap(),
            Bytes::from_static(b"id: 1\nevent: a\ndata: {}\n\n")
        );
        // Room again: no longer stuck, and the next event shows the gap (id 3 was dropped).
        assert!(sink.stuck_for(Instant::now()).is_none());
        assert_eq!(sink.push("d", "{}"), Push::Queued);
        assert_eq!(
            receiver.recv().await.unwrap(),
            Bytes::from_static(b"id: 2\nevent: b\ndata: {}\n\n")
        );
        assert_eq!(
            receiver.recv().await.unwrap(),
            Bytes::from_static(b"id: 4\nevent: d\ndata: {}\n\n")
        );
        sink.close();
        assert_eq!(sink.push("e", "{}"), Push::Closed);
    }
}
