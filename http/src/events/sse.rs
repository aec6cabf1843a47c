//! One event stream on the wire: its bounded queue ([`StreamSink`]), filled without ever
//! waiting, and the never-ending `text/event-stream` body ([`EventBody`]) that drains it, sends
//! a ping comment every [`PING_INTERVAL`], and ends itself when the stream is closed or the
//! gateway shuts down.
//!
//! The queue is a `VecDeque` under the sink's lock, with the reader's waker beside it, rather
//! than a tokio channel: a channel keeps blocks of 32 slots (two of them once its tail has
//! moved on) and its own shared state, about 2.6 KB a stream whatever it holds, where the
//! deque holds only what is queued (issue 30: the fan-out's memory a stream). An event that
//! many streams send in one tick (a `values` event, but for its id and subscription) is queued
//! as its own head and a tail shared by all of them, sent as two frames.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Events;

/// How often an idle stream sends a `:` comment; the contract asks for at least every 10 s.
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// The comment an idle stream sends.
pub const PING: &[u8] = b": ping\n\n";

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
    /// The events not yet taken by the body, oldest first; never longer than the capacity.
    queue: VecDeque<QueuedEvent>,
    /// Since when the queue has been full (set by a dropped event).
    full_since: Option<Instant>,
    dropped: u64,
    /// Closed by the gateway ([`StreamSink::close`]): the body ends the next time it is polled.
    closed: bool,
    /// The body is gone (the client went away): nothing more is queued.
    reader_gone: bool,
    /// The body's task, waiting for an event or the close.
    reader: Option<Waker>,
}

/// The producers' side of one stream.
#[derive(Debug)]
pub struct StreamSink {
    pub id: Arc<str>,
    /// The most events the queue holds.
    capacity: usize,
    state: Mutex<SinkState>,
}

/// One queued event: its own text and, when it has one, the rest of it that other streams'
/// events share (the tail ends the event).
#[derive(Debug)]
pub struct QueuedEvent {
    pub own: Bytes,
    pub tail: Option<Bytes>,
}

impl QueuedEvent {
    /// The event's text in one piece.
    pub fn whole(self) -> Bytes {
        match self.tail {
            None => self.own,
            Some(tail) => [self.own, tail].concat().into(),
        }
    }
}

/// The body's side of one stream's queue; dropping it ends the queue.
#[derive(Debug)]
pub struct StreamReceiver {
    sink: Arc<StreamSink>,
}

impl StreamSink {
    pub fn new(id: Arc<str>, capacity: usize) -> (Arc<StreamSink>, StreamReceiver) {
        let sink = Arc::new(StreamSink {
            id,
            capacity: capacity.max(1),
            state: Mutex::new(SinkState {
                next_id: 1,
                queue: VecDeque::new(),
                full_since: None,
                dropped: 0,
                closed: false,
                reader_gone: false,
                reader: None,
            }),
        });
        let receiver = StreamReceiver { sink: sink.clone() };
        (sink, receiver)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues one event with the stream's next id; never waits.
    pub fn push(&self, event: &str, data: &str) -> Push {
        self.queue(|id| QueuedEvent {
            own: Bytes::from(format!("id: {id}\nevent: {event}\ndata: {data}\n\n")),
            tail: None,
        })
    }

    /// Queues one event whose data is `head` followed by `tail`, which ends the data and the
    /// event (`\n\n`) and is shared with other streams' events; never waits.
    pub fn push_with_tail(&self, event: &str, head: &str, tail: &Bytes) -> Push {
        self.queue(|id| QueuedEvent {
            own: Bytes::from(format!("id: {id}\nevent: {event}\ndata: {head}")),
            tail: Some(tail.clone()),
        })
    }

    /// Queues the event `make` writes with the stream's next id, unless the stream is closed
    /// or its queue full.
    fn queue(&self, make: impl FnOnce(u64) -> QueuedEvent) -> Push {
        // Ids are taken and events queued under one lock, so they reach the queue in order.
        let mut state = self.state();
        if state.closed || state.reader_gone {
            return Push::Closed;
        }
        let id = state.next_id;
        state.next_id += 1;
        if state.queue.len() >= self.capacity {
            state.dropped += 1;
            state.full_since.get_or_insert_with(Instant::now);
            return Push::Dropped;
        }
        state.queue.push_back(make(id));
        state.full_since = None;
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
        Push::Queued
    }

    /// How long the queue has been full without a break, if it is full now.
    pub fn stuck_for(&self, now: Instant) -> Option<Duration> {
        let mut state = self.state();
        if state.queue.len() < self.capacity {
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
        let mut state = self.state();
        state.closed = true;
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.state().closed
    }
}

impl StreamReceiver {
    /// The next event, or `None` once the stream is closed (queued events are not sent
    /// then); registers the task to be woken when neither is there yet.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<QueuedEvent>> {
        let mut state = self.sink.state();
        if state.closed {
            return Poll::Ready(None);
        }
        if let Some(event) = state.queue.pop_front() {
            return Poll::Ready(Some(event));
        }
        match &state.reader {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => state.reader = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next event in one piece, waiting for it; `None` once the stream is closed.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let event = std::future::poll_fn(|cx| self.poll_recv(cx)).await?;
        Some(event.whole())
    }

    /// The next event in one piece, if one is queued.
    pub fn try_recv(&mut self) -> Option<Bytes> {
        let event = self.sink.state().queue.pop_front()?;
        Some(event.whole())
    }
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        let mut state = self.sink.state();
        state.reader_gone = true;
        state.reader = None;
        // The events nobody will read, freed now rather than with the last handle on the sink.
        state.queue = VecDeque::new();
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
    pub receiver: StreamReceiver,
    pub guard: StreamGuard,
}

/// The response body of one stream: queued events and pings, until the stream closes or the
/// gateway shuts down.
pub struct EventBody {
    receiver: StreamReceiver,
    // Waited on across events, not made anew for each: a new wait registers with the token's
    // waiter list and leaves it again under its lock, and `shutdown` is one token shared by
    // every stream (about 7 % of the fan-out's CPU, issue 30).
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    ping: Interval,
    /// The shared tail of the event whose own part went out last.
    tail: Option<Bytes>,
    _guard: StreamGuard,
}

impl OpenedStream {
    /// The response body: queued events and pings until the stream closes or `shutdown`.
    pub fn into_body(self, shutdown: CancellationToken) -> BoxBody<Bytes, Infallible> {
        let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        EventBody {
            receiver: self.receiver,
            shutdown: Box::pin(shutdown.cancelled_owned()),
            ping,
            tail: None,
            _guard: self.guard,
        }
        .boxed()
    }
}

impl Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    /// In this order: the gateway's shutdown, the tail of an event half sent, the stream's
    /// close, the next event (which puts the ping off), the ping.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // Either end stays one when polled again: the token stays cancelled, the sink closed.
        let this = self.get_mut();
        if this.shutdown.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        if let Some(tail) = this.tail.take() {
            return Poll::Ready(Some(Ok(Frame::data(tail))));
        }
        match this.receiver.poll_recv(cx) {
            Poll::Ready(Some(event)) => {
                this.ping.reset();
                this.tail = event.tail;
                return Poll::Ready(Some(Ok(Frame::data(event.own))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        match this.ping.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(PING))))),
            Poll::Pending => Poll::Pending,
        }
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

    fn open(capacity: usize) -> OpenedStream {
        let (sink, receiver) = StreamSink::new("s".into(), capacity);
        OpenedStream {
            sink,
            receiver,
            guard: StreamGuard::new(Weak::new(), "s".into()),
        }
    }

    /// The body's next frame's bytes (`None`: it ended), failing rather than hanging.
    async fn next_frame(body: &mut BoxBody<Bytes, Infallible>) -> Option<Bytes> {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("a frame or the end within 10 s")?;
        Some(frame.unwrap().into_data().unwrap())
    }

    #[tokio::test]
    async fn a_waiting_body_is_woken_by_an_event_and_ended_by_the_close() {
        let opened = open(4);
        let sink = opened.sink.clone();
        let mut body = opened.into_body(CancellationToken::new());
        let waiting = tokio::spawn(async move {
            let first = next_frame(&mut body).await;
            (first, body)
        });
        tokio::task::yield_now().await;
        assert_eq!(sink.push("a", "1"), Push::Queued);
        let (first, mut body) = waiting.await.unwrap();
        assert_eq!(
            first.unwrap(),
            Bytes::from_static(b"id: 1\nevent: a\ndata: 1\n\n")
        );
        let waiting = tokio::spawn(async move { next_frame(&mut body).await });
        tokio::task::yield_now().await;
        sink.close();
        assert_eq!(waiting.await.unwrap(), None, "the close ends the body");
        assert_eq!(sink.push("b", "2"), Push::Closed);
    }

    #[tokio::test]
    async fn a_closed_stream_ends_before_its_queued_events_and_a_dropped_body_takes_no_more() {
        let opened = open(4);
        let sink = opened.sink.clone();
        let mut body = opened.into_body(CancellationToken::new());
        assert_eq!(sink.push("a", "1"), Push::Queued);
        sink.close();
        assert_eq!(next_frame(&mut body).await, None);
        assert_eq!(next_frame(&mut body).await, None, "and stays ended");

        let opened = open(4);
        let sink = opened.sink.clone();
        let body = opened.into_body(CancellationToken::new());
        assert_eq!(sink.push("a", "1"), Push::Queued);
        drop(body);
        assert_eq!(sink.push("b", "2"), Push::Closed, "the client went away");
        assert!(sink.state().queue.is_empty(), "its events are freed");
        assert!(!sink.is_closed(), "gone, not closed by the gateway");
    }

    #[tokio::test]
    async fn an_event_with_a_shared_tail_goes_out_whole_and_in_order() {
        let opened = open(2);
        let sink = opened.sink.clone();
        let mut body = opened.into_body(CancellationToken::new());
        let tail = Bytes::from_static(b"\"x\":1}\n\n");
        assert_eq!(
            sink.push_with_tail("values", "{\"s\":\"a\",", &tail),
            Push::Queued
        );
        assert_eq!(sink.push("hello", "{}"), Push::Queued);
        assert_eq!(
            sink.push_with_tail("values", "{}", &tail),
            Push::Dropped,
            "a tail takes no place of its own in the queue"
        );
        let mut sent = Vec::new();
        for _ in 0..3 {
            sent.extend_from_slice(&next_frame(&mut body).await.unwrap());
        }
        assert_eq!(
            sent,
            b"id: 1\nevent: values\ndata: {\"s\":\"a\",\"x\":1}\n\nid: 2\nevent: hello\ndata: {}\n\n"
        );
        // Dropped (id 3), then the queue had room again: a reader sees the gap.
        assert_eq!(sink.push_with_tail("values", "{", &tail), Push::Queued);
        let mut receiver_side = Vec::new();
        receiver_side.extend_from_slice(&next_frame(&mut body).await.unwrap());
        receiver_side.extend_from_slice(&next_frame(&mut body).await.unwrap());
        assert_eq!(receiver_side, b"id: 4\nevent: values\ndata: {\"x\":1}\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_body_pings_an_event_puts_the_ping_off_and_the_shutdown_ends_it() {
        let opened = open(4);
        let sink = opened.sink.clone();
        let shutdown = CancellationToken::new();
        let mut body = opened.into_body(shutdown.clone());
        let started = Instant::now();
        assert_eq!(
            next_frame(&mut body).await.unwrap(),
            Bytes::from_static(PING)
        );
        assert_eq!(started.elapsed(), PING_INTERVAL);

        tokio::time::advance(PING_INTERVAL / 2).await;
        assert_eq!(sink.push("a", "1"), Push::Queued);
        let event_at = Instant::now();
        assert!(next_frame(&mut body).await.unwrap().starts_with(b"id: 1\n"));
        assert_eq!(
            next_frame(&mut body).await.unwrap(),
            Bytes::from_static(PING)
        );
        assert_eq!(
            event_at.elapsed(),
            PING_INTERVAL,
            "a full interval after the event"
        );

        shutdown.cancel();
        assert_eq!(sink.push("b", "2"), Push::Queued);
        assert_eq!(
            next_frame(&mut body).await,
            None,
            "the shutdown comes first"
        );
    }
}
