//! One event stream on the wire: its queue ([`StreamSink`]), filled without ever waiting, where
//! a subscription's latest values win (`queue.rs`); the ids it gives events as its reader
//! takes them, and the last ones sent, kept for a reader that reconnects (`replay.rs`); and the
//! never-ending `text/event-stream` body ([`EventBody`]) that drains it, sends a ping comment
//! every [`PING_INTERVAL`], and ends itself when the stream is closed (after its last event,
//! saying why) or the gateway shuts down (after a last event saying so).
//!
//! A stream outlives its connection: when the body is dropped (the reader went away) the sink
//! stays, *detached*, its queue filling as before, until the reader resumes it with
//! `Last-Event-ID` (a new body *attached* to it: [`StreamSink::resume`]) or the registry ends it
//! after `events.resume_grace_ms`. An id is given when the reader takes an event, so the ids a
//! reader sees go up by one, whatever was merged before it took them.
//!
//! The queue holds only what is queued, under the sink's lock, with the reader's waker beside
//! it, rather than in a tokio channel (a channel keeps blocks of 32 slots and its own shared
//! state, about 2.6 KB a stream whatever it holds: BENCHMARKS.md, the fan-out's memory a
//! stream). An event that many streams send (a tick's `values` but for their subscription, a
//! `lease` event) is queued as a part shared by all of them, and sent as the stream's own head
//! (its id, its name, its subscription) and that shared tail: two frames.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame as HttpFrame};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Events;
use super::event_id::{EventId, SEQUENCE_SPAN};
use super::queue::{Offered, Overflow, Queued, StreamQueue};
use super::replay::{Replay, ReplayBuffer};
use super::values::{Values, values_event_head};

/// How often an idle stream sends a `:` comment; the contract asks for at least every 10 s.
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// The comment an idle stream sends.
pub const PING: &[u8] = b": ping\n\n";

/// How soon a browser's `EventSource` reconnects after its stream broke (the `retry:` field of
/// every `hello`): a second rather than its default three, so a blip costs the reader little.
/// Clients that do not know the field ignore it.
pub const RECONNECT_AFTER_MS: u64 = 1000;

/// The most a connection's socket holds that it has not sent yet. Past it a write waits (until
/// half of it went out), so the backlog of a reader that is slow (or of a network that is)
/// stays in its stream's queue, where a subscription's values merge and the reader gets the
/// newest, instead of in the kernel's send buffer, which grows to `net.ipv4.tcp_wmem`'s
/// largest (4 MB by default) of values as old as the time it takes to drain. What is in flight
/// is not limited, so neither is a reader that keeps up nor a large REST answer; a write that
/// waits makes progress once 2 KB went out, so a reader taking less than that in
/// `http.write_timeout_ms` (200 B/s by default) is closed as one that stopped reading.
pub const UNSENT_LIMIT: u32 = 4 * 1024;

/// Limits what `socket` holds unsent to [`UNSENT_LIMIT`] (`TCP_NOTSENT_LOWAT`, Linux); set on
/// every connection when it is accepted, as it cannot be known then which will carry a stream.
/// Elsewhere the kernel's own buffering stays.
pub fn limit_unsent(socket: &tokio::net::TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(error) = socket2::SockRef::from(socket).set_tcp_notsent_lowat(UNSENT_LIMIT) {
        tracing::debug!("cannot set TCP_NOTSENT_LOWAT: {error}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = socket;
}

/// What became of one event offered to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    Queued,
    /// Values merged into the subscription's values still waiting: the reader gets the newest.
    Merged,
    /// The queue held `events.stream_queue` events that are never dropped: the stream is now
    /// closing with a last event saying so, and the registry must end it.
    Overflow,
    /// The stream has closed (or is closing).
    Closed,
}

/// An event other than `values`: its name, and its data with the event's end (`data\n\n`),
/// shared by every stream it is sent to.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedEvent {
    pub name: &'static str,
    pub tail: Bytes,
}

impl SharedEvent {
    pub fn new(name: &'static str, data: &str) -> SharedEvent {
        let mut tail = Vec::with_capacity(data.len() + 2);
        tail.extend_from_slice(data.as_bytes());
        tail.extend_from_slice(b"\n\n");
        SharedEvent {
            name,
            tail: Bytes::from(tail),
        }
    }

    /// A `hello`: its data, and how soon to reconnect ([`RECONNECT_AFTER_MS`]).
    pub fn hello(data: &str) -> SharedEvent {
        SharedEvent {
            name: "hello",
            tail: Bytes::from(format!("{data}\nretry: {RECONNECT_AFTER_MS}\n\n")),
        }
    }
}

/// Text ready for the wire: the stream's own part and, when it has one, the shared rest.
#[derive(Debug)]
pub struct Frame {
    pub own: Bytes,
    pub tail: Option<Bytes>,
}

impl Frame {
    /// The event's text in one piece.
    pub fn whole(self) -> Bytes {
        match self.tail {
            None => self.own,
            Some(tail) => [self.own, tail].concat().into(),
        }
    }
}

/// What the replay buffer keeps of an event sent: enough to write it again with its id.
#[derive(Debug)]
struct Sent {
    name: &'static str,
    /// A `values` event's subscription.
    subscription: Option<Arc<str>>,
    tail: Bytes,
}

impl Sent {
    fn frame(&self, id: EventId) -> Frame {
        let name = self.name;
        let own = match &self.subscription {
            Some(subscription) => format!(
                "id: {id}\nevent: {name}\ndata: {}",
                values_event_head(subscription)
            ),
            None => format!("id: {id}\nevent: {name}\ndata: "),
        };
        Frame {
            own: Bytes::from(own),
            tail: Some(self.tail.clone()),
        }
    }
}

/// How a stream is numbered and sized.
#[derive(Debug, Clone, Copy)]
pub struct StreamShape {
    pub epoch: u16,
    pub slot: u32,
    /// Events (not values) it holds for a slow reader (`events.stream_queue`).
    pub event_limit: usize,
    /// Events sent it keeps for a reader that reconnects (`events.replay_events`).
    pub replay: usize,
}

#[derive(Debug)]
struct SinkState {
    queue: StreamQueue<SharedEvent, Values>,
    /// The last events sent; its `next()` is the sequence of the next id.
    sent: ReplayBuffer<Sent>,
    /// The number of the body attached now (each attachment, the first included, a new one).
    attachment: u64,
    /// Whether a body is attached now.
    attached: bool,
    /// Since when no body has been attached.
    detached_since: Option<Instant>,
    /// The gateway is closing the stream: its last event is queued, nothing more is.
    closing: bool,
    /// The body ends the next time it is polled.
    ended: bool,
    /// What the attached body sends before the queue: a resumed stream's `hello` and the
    /// events its reader missed.
    prelude: VecDeque<Frame>,
    /// The attached body's task, waiting for an event or the close.
    reader: Option<Waker>,
}

/// The producers' side of one stream.
#[derive(Debug)]
pub struct StreamSink {
    /// The `streamId` of its `hello`.
    pub id: Arc<str>,
    shape: StreamShape,
    state: Mutex<SinkState>,
}

/// The body's side of one stream, for one attachment; dropping it detaches the stream.
#[derive(Debug)]
pub struct StreamReceiver {
    sink: Arc<StreamSink>,
    attachment: u64,
}

/// `Last-Event-ID` names an event this stream never sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotSent;

/// How a stream was resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// Every event missed is sent again (`count` of them), then what waits.
    Replayed { count: usize },
    /// The replay buffer no longer reached back: the sequences `from..=to` are lost, and a
    /// `gap` and a snapshot were queued in place of everything that waited.
    Lost { from: u64, to: u64 },
}

impl StreamSink {
    /// A new stream, attached to its first body, whose first event is `hello` (as id 1 of the
    /// stream); events after it are queued behind.
    pub fn new(id: Arc<str>, shape: StreamShape) -> (Arc<StreamSink>, StreamReceiver) {
        let sink = Arc::new(StreamSink {
            id,
            shape,
            state: Mutex::new(SinkState {
                queue: StreamQueue::new(shape.event_limit),
                sent: ReplayBuffer::new(1, shape.replay),
                attachment: 1,
                attached: true,
                detached_since: None,
                closing: false,
                ended: false,
                prelude: VecDeque::new(),
                reader: None,
            }),
        });
        let receiver = StreamReceiver {
            sink: sink.clone(),
            attachment: 1,
        };
        (sink, receiver)
    }

    fn state(&self) -> MutexGuard<'_, SinkState> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The stream's slot in its events' ids.
    pub fn slot(&self) -> u32 {
        self.shape.slot
    }

    /// The id of the event with `sequence` in this stream.
    pub fn event_id(&self, sequence: u64) -> EventId {
        EventId::new(self.shape.epoch, self.shape.slot, sequence)
    }

    /// Queues an event with its data; never waits.
    pub fn push(&self, name: &'static str, data: &str) -> Push {
        self.push_shared(&SharedEvent::new(name, data))
    }

    /// Queues an event shared with other streams; never waits. Events are never dropped: past
    /// the queue's limit the stream closes with a last event saying why ([`Push::Overflow`]).
    pub fn push_shared(&self, event: &SharedEvent) -> Push {
        let now = Instant::now();
        let mut state = self.state();
        if state.closing || state.ended {
            return Push::Closed;
        }
        let pushed = match state.queue.push_event(event.clone(), now) {
            Ok(()) => Push::Queued,
            Err(Overflow) => {
                let limit = self.shape.event_limit;
                let last = closed_event(
                    "behind",
                    &format!(
                        "the reader fell {limit} events behind that are never dropped (lease, connection, configuration; events.stream_queue): reconnect with Last-Event-ID for a gap and a snapshot"
                    ),
                );
                close_with(&mut state, last, now);
                Push::Overflow
            }
        };
        wake(state);
        pushed
    }

    /// Offers a subscription's values; never waits. While its earlier values still wait they
    /// are merged: each channel's newest wins.
    pub fn push_values(&self, subscription: &Arc<str>, values: Values) -> Push {
        let now = Instant::now();
        let mut state = self.state();
        if state.closing || state.ended {
            return Push::Closed;
        }
        match state.queue.push_values(subscription, values, now) {
            Offered::Queued => {
                wake(state);
                Push::Queued
            }
            // The reader has yet to take the earlier values: it was woken for them.
            Offered::Merged => Push::Merged,
        }
    }

    /// Closes the stream with a last event (`closed`, with `reason` and `message`) in place of
    /// everything queued: its reader gets that event, then the end.
    pub fn close_saying(&self, reason: &str, message: &str) {
        let mut state = self.state();
        if state.closing || state.ended {
            return;
        }
        close_with(&mut state, closed_event(reason, message), Instant::now());
        wake(state);
    }

    /// Ends the stream at once: its body ends the next time it is polled, nothing more sent.
    pub fn close(&self) {
        let mut state = self.state();
        state.ended = true;
        state.queue.clear();
        state.prelude.clear();
        wake(state);
    }

    pub fn is_closed(&self) -> bool {
        let state = self.state();
        state.closing || state.ended
    }

    /// How long something has waited without the attached reader taking anything; `None`
    /// when nothing waits or no reader is attached.
    pub fn stuck_for(&self, now: Instant) -> Option<Duration> {
        let state = self.state();
        if !state.attached || state.closing || state.ended {
            return None;
        }
        state.queue.waiting_for(now)
    }

    /// How long no reader has been attached; `None` while one is.
    pub fn detached_for(&self, now: Instant) -> Option<Duration> {
        self.state()
            .detached_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Whether the body of `attachment` is the one attached now (or the last one attached).
    pub fn is_attachment(&self, attachment: u64) -> bool {
        self.state().attachment == attachment
    }

    /// Values merged so far for a reader that was behind.
    pub fn merged(&self) -> u64 {
        self.state().queue.merged()
    }

    /// Items waiting now.
    pub fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Attaches a new body for a reader that saw the event `last_seen` (a sequence of this
    /// stream) last: it gets `hello` (the frame given, without an id: the events it follows
    /// keep their numbers), then every event sent after `last_seen` again; or, when they are
    /// no longer all kept, a `gap` and a snapshot (`lost` makes them, from the range lost) in
    /// place of them and of everything that waited; then what comes. A body still attached
    /// (a connection the gateway has not yet seen die) ends.
    pub fn resume(
        self: &Arc<StreamSink>,
        last_seen: u64,
        hello: Frame,
        lost: impl FnOnce(u64, u64) -> [SharedEvent; 2],
    ) -> Result<(StreamReceiver, Resumed), NotSent> {
        let now = Instant::now();
        let mut state = self.state();
        if state.closing || state.ended {
            return Err(NotSent);
        }
        let mut prelude = VecDeque::from([hello]);
        let resumed = match state.sent.after(last_seen) {
            Replay::Unknown => return Err(NotSent),
            Replay::Events(events) => {
                let count = events.len();
                for (n, sent) in events.into_iter().enumerate() {
                    prelude.push_back(sent.frame(self.event_id(last_seen + 1 + n as u64)));
                }
                Resumed::Replayed { count }
            }
            Replay::Lost { from, to } => {
                // The snapshot supersedes everything: a queued event older than it would show
                // the reader a state that is no longer so.
                state.queue.clear();
                state.sent.forget();
                for event in lost(from, to) {
                    state.queue.push_event_anyway(event, now);
                }
                Resumed::Lost { from, to }
            }
        };
        state.attachment += 1;
        state.attached = true;
        state.detached_since = None;
        state.prelude = prelude;
        let attachment = state.attachment;
        // The body attached before (if any) ends when woken.
        wake(state);
        Ok((
            StreamReceiver {
                sink: self.clone(),
                attachment,
            },
            resumed,
        ))
    }

    /// The last event of a body ending because the gateway shuts down, with the stream's next
    /// id; `None` when the stream has ended already or `attachment` is not attached.
    fn last_event(&self, attachment: u64, event: &SharedEvent) -> Option<Frame> {
        let mut state = self.state();
        if state.attachment != attachment || state.ended {
            return None;
        }
        state.ended = true;
        let sent = Sent {
            name: event.name,
            subscription: None,
            tail: event.tail.clone(),
        };
        let sequence = state.sent.next();
        Some(sent.frame(self.event_id(sequence)))
    }
}

/// The `closed` event: why the gateway closes the stream.
pub fn closed_event(reason: &str, message: &str) -> SharedEvent {
    let data = serde_json::json!({ "reason": reason, "message": message });
    SharedEvent::new("closed", &data.to_string())
}

/// Wakes the attached body's task, if it waits, once the lock is let go.
fn wake(mut state: MutexGuard<'_, SinkState>) {
    let reader = state.reader.take();
    drop(state);
    if let Some(reader) = reader {
        reader.wake();
    }
}

/// Replaces everything queued by `last`, after which the body ends.
fn close_with(state: &mut SinkState, last: SharedEvent, now: Instant) {
    state.queue.clear();
    state.queue.push_event_anyway(last, now);
    state.closing = true;
}

impl StreamReceiver {
    /// The next frame, or `None` once the stream has ended (or another body took it over);
    /// registers the task to be woken when neither is there yet.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        let mut state = self.sink.state();
        match self.take(&mut state, Instant::now()) {
            Taken::Frame(frame) => Poll::Ready(Some(frame)),
            Taken::End => Poll::Ready(None),
            Taken::Nothing => {
                match &state.reader {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => state.reader = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// Takes the next frame: the prelude's, else the queue's with the next id.
    fn take(&self, state: &mut SinkState, now: Instant) -> Taken {
        if state.attachment != self.attachment || state.ended {
            return Taken::End;
        }
        if let Some(frame) = state.prelude.pop_front() {
            return Taken::Frame(frame);
        }
        let Some(item) = state.queue.pop(now) else {
            return Taken::Nothing;
        };
        let sequence = state.sent.next();
        if sequence >= SEQUENCE_SPAN {
            // Ten billion events: this stream's ids are used up.
            state.ended = true;
            return Taken::End;
        }
        let sent = match item {
            Queued::Event(event) => Sent {
                name: event.name,
                subscription: None,
                tail: event.tail,
            },
            Queued::Values {
                subscription,
                values,
            } => Sent {
                name: "values",
                tail: values.tail_at(now),
                subscription: Some(subscription),
            },
        };
        let frame = sent.frame(self.sink.event_id(sequence));
        state.sent.push(sent);
        if state.closing && state.queue.is_empty() {
            state.ended = true;
        }
        Taken::Frame(frame)
    }

    /// The next event in one piece, waiting for it; `None` once the stream has ended.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let frame = std::future::poll_fn(|cx| self.poll_recv(cx)).await?;
        Some(frame.whole())
    }

    /// The next event in one piece, if one is there.
    pub fn try_recv(&mut self) -> Option<Bytes> {
        let mut state = self.sink.state();
        match self.take(&mut state, Instant::now()) {
            Taken::Frame(frame) => Some(frame.whole()),
            Taken::End | Taken::Nothing => None,
        }
    }
}

enum Taken {
    Frame(Frame),
    End,
    Nothing,
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        let mut state = self.sink.state();
        if state.attachment != self.attachment {
            return;
        }
        state.attached = false;
        state.detached_since = Some(Instant::now());
        state.reader = None;
        // Frames of this attachment only: a resumed reader gets its own.
        state.prelude.clear();
    }
}

/// Tells the registry when the body is dropped (the client went away, the stream was closed,
/// or the gateway stopped): the stream is detached, kept for a reader that resumes it, unless
/// a reader has resumed it already on another connection.
#[derive(Debug)]
pub struct StreamGuard {
    events: Weak<Events>,
    id: Arc<str>,
    /// The attachment of the body it guards.
    attachment: u64,
}

impl StreamGuard {
    pub fn new(events: Weak<Events>, receiver: &StreamReceiver) -> StreamGuard {
        StreamGuard {
            events,
            id: receiver.sink.id.clone(),
            attachment: receiver.attachment,
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(events) = self.events.upgrade() {
            events.detached(&self.id, self.attachment);
        }
    }
}

/// A stream just registered or resumed: what the HTTP handler turns into a response body.
pub struct OpenedStream {
    pub sink: Arc<StreamSink>,
    pub receiver: StreamReceiver,
    pub guard: StreamGuard,
}

/// The response body of one stream: its frames and pings, until the stream ends or the gateway
/// shuts down.
pub struct EventBody {
    receiver: StreamReceiver,
    // Waited on across events, not made anew for each: a new wait registers with the token's
    // waiter list and leaves it again under its lock, and `shutdown` is one token shared by
    // every stream (about 7 % of the fan-out's CPU: BENCHMARKS.md).
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Whether the body has said it ends because the gateway shuts down.
    said_shutdown: bool,
    ping: Interval,
    /// The shared tail of the event whose own part went out last.
    tail: Option<Bytes>,
    _guard: StreamGuard,
}

impl OpenedStream {
    /// The response body: frames and pings until the stream ends or `shutdown`.
    pub fn into_body(self, shutdown: CancellationToken) -> BoxBody<Bytes, Infallible> {
        let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        EventBody {
            receiver: self.receiver,
            shutdown: Box::pin(shutdown.cancelled_owned()),
            said_shutdown: false,
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

    /// In this order: the gateway's shutdown (a last `closed` event, then the end), the tail of
    /// an event half sent, the stream's end, the next event (which puts the ping off), the ping.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<HttpFrame<Bytes>, Infallible>>> {
        // Either end stays one when polled again: the token stays cancelled, the sink ended.
        let this = self.get_mut();
        if this.said_shutdown {
            return Poll::Ready(None);
        }
        if this.shutdown.as_mut().poll(cx).is_ready() {
            this.said_shutdown = true;
            let last = closed_event(
                "shutdown",
                "the gateway is shutting down: reconnect with Last-Event-ID once it is back",
            );
            // Half an event out: end it first, so the last one is read whole.
            let mut text = this
                .tail
                .take()
                .map(|tail| tail.to_vec())
                .unwrap_or_default();
            if let Some(frame) = this
                .receiver
                .sink
                .last_event(this.receiver.attachment, &last)
            {
                text.extend_from_slice(&frame.whole());
            }
            return Poll::Ready((!text.is_empty()).then(|| Ok(HttpFrame::data(text.into()))));
        }
        if let Some(tail) = this.tail.take() {
            return Poll::Ready(Some(Ok(HttpFrame::data(tail))));
        }
        match this.receiver.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                this.ping.reset();
                this.tail = frame.tail;
                return Poll::Ready(Some(Ok(HttpFrame::data(frame.own))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        match this.ping.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(HttpFrame::data(Bytes::from_static(PING))))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::values::{Outcome, TickValues};

    const SHAPE: StreamShape = StreamShape {
        epoch: 4000,
        slot: 7,
        event_limit: 4,
        replay: 8,
    };

    fn id(sequence: u64) -> String {
        EventId::new(4000, 7, sequence).to_string()
    }

    fn new_sink(shape: StreamShape) -> (Arc<StreamSink>, StreamReceiver) {
        StreamSink::new("s".into(), shape)
    }

    fn text(bytes: Bytes) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn values(x: i64) -> Values {
        Values::Tick(Arc::new(TickValues::new(
            Instant::now(),
            vec![(
                Arc::from("A"),
                Arc::new(Outcome::Value {
                    value: station_protocol::Value::Integer(x),
                    text: x.to_string(),
                    age_ms: 0.0,
                }),
            )]
            .into(),
        )))
    }

    #[tokio::test]
    async fn ids_are_given_as_the_reader_takes_events_so_merged_values_leave_no_gap() {
        let (sink, mut receiver) = new_sink(SHAPE);
        let subscription: Arc<str> = "sub".into();
        assert_eq!(sink.push("hello", "{}"), Push::Queued);
        assert_eq!(sink.push_values(&subscription, values(1)), Push::Queued);
        assert_eq!(sink.push_values(&subscription, values(2)), Push::Merged);
        assert_eq!(sink.push_values(&subscription, values(3)), Push::Merged);
        assert_eq!(
            text(receiver.recv().await.unwrap()),
            format!("id: {}\nevent: hello\ndata: {{}}\n\n", id(1))
        );
        let second = text(receiver.recv().await.unwrap());
        let prefix = format!("id: {}\nevent: values\ndata: ", id(2));
        assert!(second.starts_with(&prefix), "{second}");
        let data: serde_json::Value = serde_json::from_str(&second[prefix.len()..]).unwrap();
        assert_eq!(data["subscription"], "sub");
        assert_eq!(
            data["values"],
            serde_json::json!({ "A": "3" }),
            "the newest"
        );
        assert_eq!(sink.merged(), 2);
        assert!(receiver.try_recv().is_none());
    }

    #[tokio::test]
    async fn too_many_events_close_the_stream_with_a_last_event_saying_why() {
        let (sink, mut receiver) = new_sink(SHAPE);
        for _ in 0..4 {
            assert_eq!(sink.push("lease", "{}"), Push::Queued);
        }
        assert_eq!(sink.push("lease", "{}"), Push::Overflow);
        assert_eq!(sink.push("lease", "{}"), Push::Closed);
        assert_eq!(sink.push_values(&"s".into(), values(1)), Push::Closed);
        let last = text(receiver.recv().await.unwrap());
        assert!(
            last.starts_with(&format!("id: {}\nevent: closed\ndata: {{", id(1))),
            "{last}"
        );
        assert!(last.contains("\"reason\":\"behind\""), "{last}");
        assert!(last.contains("events.stream_queue"), "{last}");
        assert_eq!(receiver.recv().await, None, "then the end");
    }

    #[tokio::test]
    async fn a_reader_that_resumes_gets_what_it_missed_again_then_what_waits() {
        let (sink, mut receiver) = new_sink(SHAPE);
        for n in 0..3 {
            sink.push("lease", &format!("{{\"n\":{n}}}"));
        }
        let sent: Vec<String> = (0..3).map(|_| text(receiver.try_recv().unwrap())).collect();
        drop(receiver);
        assert!(sink.detached_for(Instant::now()).is_some());
        sink.push("connection", "{}");
        let hello = Frame {
            own: Bytes::from_static(b"event: hello\ndata: {}\n\n"),
            tail: None,
        };
        // The reader saw the first event only: the other two come again, byte for byte.
        let (mut resumed, how) = sink
            .resume(1, hello, |_, _| unreachable!("nothing lost"))
            .unwrap();
        assert_eq!(how, Resumed::Replayed { count: 2 });
        assert_eq!(sink.detached_for(Instant::now()), None);
        assert_eq!(
            text(resumed.try_recv().unwrap()),
            "event: hello\ndata: {}\n\n"
        );
        assert_eq!(text(resumed.try_recv().unwrap()), sent[1]);
        assert_eq!(text(resumed.try_recv().unwrap()), sent[2]);
        let next = text(resumed.try_recv().unwrap());
        assert!(
            next.starts_with(&format!("id: {}\nevent: connection", id(4))),
            "{next}"
        );
        assert!(resumed.try_recv().is_none());
    }

    #[tokio::test]
    async fn a_reader_behind_the_replay_buffer_gets_a_gap_and_a_snapshot_in_place_of_the_rest() {
        let shape = StreamShape { replay: 2, ..SHAPE };
        let (sink, mut receiver) = new_sink(shape);
        for _ in 0..5 {
            sink.push("lease", "{}");
            receiver.try_recv().unwrap();
        }
        sink.push("lease", "{\"old\":true}");
        let hello = Frame {
            own: Bytes::from_static(b"event: hello\ndata: {}\n\n"),
            tail: None,
        };
        let (mut resumed, how) = sink
            .resume(1, hello, |from, to| {
                [
                    SharedEvent::new("gap", &format!("{{\"from\":{from},\"to\":{to}}}")),
                    SharedEvent::new("snapshot", "{}"),
                ]
            })
            .unwrap();
        assert_eq!(how, Resumed::Lost { from: 2, to: 5 });
        // The old body ended: another took the stream over.
        assert!(receiver.try_recv().is_none());
        assert!(matches!(
            std::future::poll_fn(|cx| Poll::Ready(receiver.poll_recv(cx))).await,
            Poll::Ready(None)
        ));
        let frames: Vec<String> = std::iter::from_fn(|| resumed.try_recv())
            .map(text)
            .collect();
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(
            frames[1],
            format!(
                "id: {}\nevent: gap\ndata: {{\"from\":2,\"to\":5}}\n\n",
                id(6)
            )
        );
        assert!(frames[2].starts_with(&format!("id: {}\nevent: snapshot", id(7))));
        // The lease event queued before the snapshot is gone: the snapshot says what is so.
        assert!(!frames.iter().any(|frame| frame.contains("old")));
        // An id this stream never sent is not resumed.
        let hello = Frame {
            own: Bytes::new(),
            tail: None,
        };
        assert!(sink.resume(8, hello, |_, _| unreachable!()).is_err());
    }

    #[tokio::test]
    async fn the_wait_of_an_attached_reader_is_watched_a_detached_one_is_not() {
        let (sink, receiver) = new_sink(SHAPE);
        let t0 = Instant::now();
        sink.push("lease", "{}");
        assert!(sink.stuck_for(t0 + Duration::from_secs(31)).unwrap() >= Duration::from_secs(30));
        drop(receiver);
        assert_eq!(sink.stuck_for(t0 + Duration::from_secs(31)), None);
        assert!(sink.detached_for(t0 + Duration::from_secs(31)).is_some());
    }

    fn open(shape: StreamShape) -> OpenedStream {
        let (sink, receiver) = new_sink(shape);
        let guard = StreamGuard::new(Weak::new(), &receiver);
        OpenedStream {
            sink,
            receiver,
            guard,
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
        let opened = open(SHAPE);
        let sink = opened.sink.clone();
        let mut body = opened.into_body(CancellationToken::new());
        let waiting = tokio::spawn(async move {
            let mut first = next_frame(&mut body).await.unwrap().to_vec();
            first.extend_from_slice(&next_frame(&mut body).await.unwrap());
            (first, body)
        });
        tokio::task::yield_now().await;
        assert_eq!(sink.push("a", "1"), Push::Queued);
        let (first, mut body) = waiting.await.unwrap();
        assert_eq!(
            first,
            format!("id: {}\nevent: a\ndata: 1\n\n", id(1)).as_bytes()
        );
        let waiting = tokio::spawn(async move { next_frame(&mut body).await });
        tokio::task::yield_now().await;
        sink.close();
        assert_eq!(waiting.await.unwrap(), None, "the close ends the body");
        assert_eq!(sink.push("b", "2"), Push::Closed);
    }

    #[tokio::test]
    async fn a_stream_closed_saying_why_sends_that_last_and_then_ends() {
        let opened = open(SHAPE);
        let sink = opened.sink.clone();
        let mut body = opened.into_body(CancellationToken::new());
        assert_eq!(sink.push("a", "1"), Push::Queued);
        sink.close_saying("stuck", "no event taken for 30 s");
        let mut sent = Vec::new();
        while let Some(frame) = next_frame(&mut body).await {
            sent.extend_from_slice(&frame);
        }
        let sent = String::from_utf8(sent).unwrap();
        assert!(
            !sent.contains("event: a"),
            "what waited is replaced: {sent}"
        );
        assert!(sent.contains("event: closed\ndata: {\"message\":\"no event taken for 30 s\",\"reason\":\"stuck\"}"), "{sent}");
    }

    #[tokio::test]
    async fn a_dropped_body_detaches_the_stream_which_keeps_queueing() {
        let opened = open(SHAPE);
        let sink = opened.sink.clone();
        let body = opened.into_body(CancellationToken::new());
        assert_eq!(sink.push("a", "1"), Push::Queued);
        drop(body);
        assert_eq!(
            sink.push("b", "2"),
            Push::Queued,
            "kept for a reader that resumes"
        );
        assert_eq!(sink.queued(), 2);
        assert!(!sink.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_body_pings_an_event_puts_the_ping_off_and_the_shutdown_says_so_last() {
        let opened = open(SHAPE);
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
        assert!(next_frame(&mut body).await.unwrap().starts_with(b"id: "));
        assert_eq!(
            next_frame(&mut body).await.unwrap(),
            Bytes::from_static(b"1\n\n")
        );
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
        let last = text(next_frame(&mut body).await.unwrap());
        assert!(
            last.starts_with(&format!("id: {}\nevent: closed\n", id(2))),
            "the shutdown comes first, with the next id: {last}"
        );
        assert!(last.contains("\"reason\":\"shutdown\""), "{last}");
        assert_eq!(next_frame(&mut body).await, None);
    }
}
