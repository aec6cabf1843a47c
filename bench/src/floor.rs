//! The floor server: the trivial hyper server plus the least any gateway must do to answer a
//! cached `values/get` with its access log on — parse the JSON body, look the names up, write
//! an access line — and nothing else (no lease, no access rules, no metrics, no routing table,
//! no time limits, the answer pre-rendered per name). What it costs above the trivial server is
//! a lower bound on what the gateway's cached read costs above it.
//!
//! Forced ([`Floor::Forced`]), it answers `value/get` by a READ of the asked name over the byte
//! protocol, on a station connection of its own for each HTTP connection (no coalescing, no
//! lease, no cache), with both lines: the least a forced read through any gateway costs.
//!
//! Streaming ([`Floor::Streams`]), it serves the event streams of the fan-out scenario: `GET
//! api/events` opens one (its `hello` first), `POST api/subscriptions` adds the subscription to
//! one ticker task per interval, which sends each of its subscriptions' `values` event,
//! rendered once, with its `id:` line, every `IntervalMs` (no cache, no deadband, no history,
//! no limits): what any gateway's stream costs at the least.
//!
//! Audited ([`Floor::Audited`]), it also writes the line the station's audit log has for every
//! request (`timestamp ip method path status duration`, the clients' `audit.md`), as
//! the gateway must: rendered in the request, handed to a writer thread of its own, which
//! writes its batches to `/dev/null` (the gateway keeps them in memory or in files; either
//! costs more).

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use station_simulator::StationClient;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What a `values/get` body asks; names borrowed from the body, as the cheapest parse does.
#[derive(Deserialize)]
struct ValuesGet<'a> {
    #[serde(rename = "Names", borrow)]
    names: Vec<&'a str>,
    #[serde(rename = "MaxAgeMs")]
    max_age_ms: Option<u64>,
}

/// One cached value: its answer, pre-rendered, and when it was read.
struct Cached {
    answer: Bytes,
    read_at: Instant,
}

/// Lines waiting for a writer thread, which writes them in batches (as the gateway's log and
/// audit writers do).
type Pending = Arc<Mutex<Vec<u8>>>;

/// What the floor server does for each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// A cached `values/get`, and an access line.
    Plain,
    /// A cached `values/get`, an access line and an audit line.
    Audited,
    /// A forced `value/get` from the station at this address, an access line and an audit
    /// line.
    Forced(SocketAddr),
    /// Event streams and their subscriptions (the fan-out scenario), an access line and an
    /// audit line for each request.
    Streams,
}

impl Floor {
    /// How it is named on the command line (`--serve-floor NAME ANSWER KIND`).
    pub fn arg(self) -> String {
        match self {
            Floor::Plain => "plain".to_owned(),
            Floor::Audited => "audited".to_owned(),
            Floor::Forced(station) => format!("forced:{station}"),
            Floor::Streams => "streams".to_owned(),
        }
    }
}

impl std::str::FromStr for Floor {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Floor> {
        match text {
            "plain" => Ok(Floor::Plain),
            "audited" => Ok(Floor::Audited),
            "streams" => Ok(Floor::Streams),
            other => match other.strip_prefix("forced:").map(str::parse) {
                Some(Ok(station)) => Ok(Floor::Forced(station)),
                _ => anyhow::bail!(
                    "a floor server is `plain`, `audited`, `streams` or `forced:STATION`, not {other:?}"
                ),
            },
        }
    }
}

/// Serves `answer` for `name` on 127.0.0.1 until the process ends; returns its address.
pub async fn start(name: String, answer: Bytes, floor: Floor) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut cache = HashMap::new();
    cache.insert(
        name,
        Cached {
            answer,
            read_at: Instant::now(),
        },
    );
    let cache = Arc::new(cache);
    let pending: Pending = Arc::default();
    std::thread::spawn({
        let pending = pending.clone();
        move || write_lines(&pending, std::io::stderr())
    });
    let audit: Option<Pending> = (floor != Floor::Plain).then(Arc::default);
    if let Some(audit) = &audit {
        let audit = audit.clone();
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        std::thread::spawn(move || write_lines(&audit, null));
    }
    let source = match floor {
        Floor::Forced(station) => Source::Station(station),
        Floor::Streams => Source::Streams(Arc::default()),
        Floor::Plain | Floor::Audited => Source::Cache(cache),
    };
    tokio::spawn(serve(listener, source, pending, audit));
    Ok(addr)
}

/// Where the answers come from.
enum Source {
    /// The cache, shared by every connection.
    Cache(Arc<HashMap<String, Cached>>),
    /// The station at this address, on a connection of its own for each HTTP connection.
    Station(SocketAddr),
    /// The open event streams, shared by every connection.
    Streams(Streams),
}

/// The open event streams and the tickers sending to them.
#[derive(Default)]
struct StreamsState {
    /// The open streams by id: where their subscriptions' events go.
    streams: Mutex<HashMap<String, mpsc::Sender<Bytes>>>,
    /// The subscriptions by interval in milliseconds, each interval's sent by a ticker task.
    tickers: Mutex<HashMap<u64, Ticked>>,
}

type Streams = Arc<StreamsState>;

/// The subscriptions of one interval.
type Ticked = Arc<Mutex<Vec<Subscription>>>;

/// One subscription: its stream, its event's payload, the stream's last event id.
struct Subscription {
    stream_id: String,
    events: mpsc::Sender<Bytes>,
    payload: String,
    sequence: u64,
}

/// A connection's way to its answers.
#[derive(Clone)]
enum Answers {
    Cache(Arc<HashMap<String, Cached>>),
    Station(Arc<tokio::sync::Mutex<StationClient<TcpStream>>>),
    Streams(Streams),
}

impl Source {
    async fn for_connection(&self) -> Option<Answers> {
        match self {
            Source::Cache(cache) => Some(Answers::Cache(cache.clone())),
            Source::Streams(streams) => Some(Answers::Streams(streams.clone())),
            Source::Station(station) => {
                let mut client = StationClient::connect(*station).await.ok()?;
                client.set_timeout(Duration::from_secs(2));
                client.hello("floor server").await.ok()?;
                Some(Answers::Station(Arc::new(tokio::sync::Mutex::new(client))))
            }
        }
    }
}

/// What a `value/get` body asks.
#[derive(Deserialize)]
struct ValueGet<'a> {
    #[serde(rename = "Name", borrow)]
    name: &'a str,
}

async fn serve(listener: TcpListener, source: Source, pending: Pending, audit: Option<Pending>) {
    let source = Arc::new(source);
    while let Ok((stream, peer)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        let (source, pending, audit) = (source.clone(), pending.clone(), audit.clone());
        tokio::spawn(async move {
            let Some(answers) = source.for_connection().await else {
                return;
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (answers, pending, audit) = (answers.clone(), pending.clone(), audit.clone());
                async move {
                    let answer = respond(&answers, &pending, audit.as_ref(), peer, request);
                    Ok::<_, Infallible>(answer.await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Answers one request from `answers`, with its access line (and audit line).
async fn respond(
    answers: &Answers,
    pending: &Pending,
    audit: Option<&Pending>,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Response<FloorBody> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let body = whole_body(body).await;
    let (status, answer) = match answers {
        Answers::Cache(cache) => whole(from_cache(cache, &body)),
        Answers::Station(client) => whole(from_station(client, &body).await),
        Answers::Streams(streams) => match (&parts.method, parts.uri.path()) {
            (&Method::GET, "/api/events") => (StatusCode::OK, open_stream(streams)),
            (&Method::POST, "/api/subscriptions") => whole(subscribe(streams, &body)),
            _ => whole((StatusCode::NOT_FOUND, Bytes::from_static(b"{}"))),
        },
    };
    let answered = Answered {
        peer,
        method: parts.method.as_str(),
        path: parts.uri.path(),
        status,
        started,
    };
    answered.respond(answer, pending, audit)
}

/// A whole answer's body.
fn whole((status, answer): (StatusCode, Bytes)) -> (StatusCode, FloorBody) {
    (status, FloorBody::Whole(Some(answer)))
}

/// A cached `values/get`.
fn from_cache(cache: &HashMap<String, Cached>, body: &[u8]) -> (StatusCode, Bytes) {
    match serde_json::from_slice::<ValuesGet>(body) {
        Ok(asked) => {
            let max_age = Duration::from_millis(asked.max_age_ms.unwrap_or(0));
            match asked.names.first().and_then(|name| cache.get(*name)) {
                Some(cached) if cached.read_at.elapsed() <= max_age => {
                    (StatusCode::OK, cached.answer.clone())
                }
                _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"{}")),
            }
        }
        Err(_) => (StatusCode::BAD_REQUEST, Bytes::from_static(b"{}")),
    }
}

/// A forced `value/get`: one READ.
async fn from_station(
    client: &tokio::sync::Mutex<StationClient<TcpStream>>,
    body: &[u8],
) -> (StatusCode, Bytes) {
    let Ok(asked) = serde_json::from_slice::<ValueGet>(body) else {
        return (StatusCode::BAD_REQUEST, Bytes::from_static(b"{}"));
    };
    match client.lock().await.read(&[asked.name]).await {
        Ok(results) => match results.into_iter().next() {
            Some(Ok(value)) => {
                let mut out = b"{\"value\":".to_vec();
                let _ = serde_json::to_writer(&mut out, &value.render());
                out.push(b'}');
                (StatusCode::OK, Bytes::from(out))
            }
            _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"{}")),
        },
        Err(_) => (StatusCode::BAD_GATEWAY, Bytes::from_static(b"{}")),
    }
}

/// Where the next stream's and subscription's ids come from.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new id, 32 hex digits as the gateway's.
fn next_id() -> String {
    format!("{:032x}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// How many events a stream holds for a slow client (as the gateway's default).
const STREAM_QUEUE: usize = 64;

/// `GET api/events`: a new stream, its `hello` queued first.
fn open_stream(streams: &Streams) -> FloorBody {
    let id = next_id();
    let (events, queue) = mpsc::channel(STREAM_QUEUE);
    let hello = format!(
        "id: 1\nevent: hello\ndata: {{\"apiVersion\":1,\"generation\":1,\"isConnected\":true,\"streamId\":\"{id}\"}}\n\n"
    );
    let _ = events.try_send(Bytes::from(hello));
    lock(&streams.streams).insert(id, events);
    FloorBody::Events(queue)
}

/// What a `POST api/subscriptions` body asks.
#[derive(Deserialize)]
struct Subscribe<'a> {
    #[serde(rename = "StreamId", borrow)]
    stream_id: &'a str,
    #[serde(rename = "Channels", borrow)]
    channels: Vec<&'a str>,
    #[serde(rename = "IntervalMs")]
    interval_ms: u64,
}

/// `POST api/subscriptions`: the subscription's event rendered once (each value `"0"`, each
/// age 0.1 ms, the gateway's fields), sent by its interval's ticker every `IntervalMs`.
fn subscribe(streams: &Streams, body: &[u8]) -> (StatusCode, Bytes) {
    let Ok(asked) = serde_json::from_slice::<Subscribe>(body) else {
        return (StatusCode::BAD_REQUEST, Bytes::from_static(b"{}"));
    };
    let events = lock(&streams.streams).get(asked.stream_id).cloned();
    let Some(events) = events else {
        return (StatusCode::NOT_FOUND, Bytes::from_static(b"{}"));
    };
    let id = next_id();
    let ages: serde_json::Map<String, serde_json::Value> = asked
        .channels
        .iter()
        .map(|name| ((*name).to_owned(), serde_json::json!(0.1)))
        .collect();
    let values: serde_json::Map<String, serde_json::Value> = asked
        .channels
        .iter()
        .map(|name| ((*name).to_owned(), serde_json::json!("0")))
        .collect();
    let payload = serde_json::json!({
        "subscription": id, "ageMs": ages, "errors": null, "values": values,
    })
    .to_string();
    let interval_ms = asked.interval_ms.max(1);
    let subscription = Subscription {
        stream_id: asked.stream_id.to_owned(),
        events,
        payload,
        sequence: 1,
    };
    let mut tickers = lock(&streams.tickers);
    let ticked = tickers.entry(interval_ms).or_insert_with(|| {
        let ticked = Ticked::default();
        let every = Duration::from_millis(interval_ms);
        tokio::spawn(send_every(streams.clone(), ticked.clone(), every));
        ticked
    });
    lock(ticked).push(subscription);
    let answer = format!("{{\"expiresInMs\":60000,\"id\":\"{id}\"}}");
    (StatusCode::OK, Bytes::from(answer))
}

/// Sends each of `ticked`'s subscriptions its `values` event every `every`, and drops those
/// whose stream was closed (an event for a full queue is dropped, as the gateway drops it for
/// a slow client).
async fn send_every(streams: Streams, ticked: Ticked, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        lock(&ticked).retain_mut(|subscription| {
            subscription.sequence += 1;
            let event = values_event(subscription.sequence, &subscription.payload);
            match subscription.events.try_send(event) {
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    lock(&streams.streams).remove(&subscription.stream_id);
                    false
                }
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
            }
        });
    }
}

/// `id: SEQUENCE`, `event: values`, `data: PAYLOAD`.
fn values_event(sequence: u64, payload: &str) -> Bytes {
    let mut event = Vec::with_capacity(payload.len() + 40);
    event.extend_from_slice(b"id: ");
    event.extend_from_slice(itoa::Buffer::new().format(sequence).as_bytes());
    event.extend_from_slice(b"\nevent: values\ndata: ");
    event.extend_from_slice(payload.as_bytes());
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

/// The floor's locks are never held across a panic that matters: a poisoned one is used as is.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A floor answer's body: whole, or an event stream fed by its subscriptions' tasks.
pub enum FloorBody {
    Whole(Option<Bytes>),
    Events(mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for FloorBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FloorBody::Whole(answer) => Poll::Ready(answer.take().map(|b| Ok(Frame::data(b)))),
            FloorBody::Events(queue) => queue
                .poll_recv(context)
                .map(|event| event.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, FloorBody::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FloorBody::Whole(answer) => {
                SizeHint::with_exact(answer.as_ref().map_or(0, |b| b.len() as u64))
            }
            FloorBody::Events(_) => SizeHint::default(),
        }
    }
}

async fn whole_body(body: Incoming) -> Bytes {
    body.collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// A request answered: what its lines say.
struct Answered<'a> {
    peer: SocketAddr,
    method: &'a str,
    path: &'a str,
    status: StatusCode,
    started: Instant,
}

impl Answered<'_> {
    /// The answer (JSON, or an event stream), and its access line (and audit line).
    fn respond(
        &self,
        answer: FloorBody,
        pending: &Pending,
        audit: Option<&Pending>,
    ) -> Response<FloorBody> {
        let content_type = match answer {
            FloorBody::Whole(_) => "application/json; charset=utf-8",
            FloorBody::Events(_) => "text/event-stream; charset=utf-8",
        };
        let mut response = Response::new(answer);
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        self.access_line(pending);
        if let Some(audit) = audit {
            self.audit_line(audit);
        }
        response
    }

    /// `2026-12-02T05:38:47.123Z 127.0.0.1:40000 POST /api/resources/values/get 200 14us`.
    fn access_line(&self, pending: &Pending) {
        let mut line = Vec::with_capacity(128);
        push_millis(&mut line, b'T', b"Z ");
        push_peer(&mut line, self.peer);
        self.push_request(&mut line);
        let took = self.started.elapsed().as_micros();
        line.extend_from_slice(itoa::Buffer::new().format(took).as_bytes());
        line.extend_from_slice(b"us\n");
        hand_over(pending, &line);
    }

    /// `2026-12-02 05:38:47.123 127.0.0.1 POST /api/resources/values/get 200 0ms`: the
    /// station's audit line for a request that changed nothing (the gateway's has the same
    /// fields).
    fn audit_line(&self, pending: &Pending) {
        let mut line = Vec::with_capacity(128);
        push_millis(&mut line, b' ', b" ");
        let peer_start = line.len();
        push_peer(&mut line, self.peer);
        // The address without its port.
        if let Some(colon) = line[peer_start..].iter().rposition(|b| *b == b':') {
            line.truncate(peer_start + colon);
        }
        self.push_request(&mut line);
        let took = self.started.elapsed().as_millis();
        line.extend_from_slice(itoa::Buffer::new().format(took).as_bytes());
        line.extend_from_slice(b"ms\n");
        hand_over(pending, &line);
    }

    /// ` METHOD PATH STATUS `.
    fn push_request(&self, line: &mut Vec<u8>) {
        line.push(b' ');
        line.extend_from_slice(self.method.as_bytes());
        line.push(b' ');
        line.extend_from_slice(self.path.as_bytes());
        line.push(b' ');
        line.extend_from_slice(itoa::Buffer::new().format(self.status.as_u16()).as_bytes());
        line.push(b' ');
    }
}

/// Queues `line` for its writer thread.
fn hand_over(pending: &Pending, line: &[u8]) {
    lock(pending).extend_from_slice(line);
}

/// Appends now as `2026-12-02` `between` `05:38:47.123` `after`.
fn push_millis(line: &mut Vec<u8>, between: u8, after: &[u8]) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let start = line.len();
    push_second(line, since_epoch);
    line[start + 10] = between;
    let millis = since_epoch.subsec_millis();
    line.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
    ]);
    line.extend_from_slice(after);
}

thread_local! {
    /// The second the cached date prefix is for, and the prefix (`2026-12-02T05:38:47`).
    static SECOND: std::cell::RefCell<(u64, String)> = const {
        std::cell::RefCell::new((u64::MAX, String::new()))
    };
}

/// Appends the second of `since_epoch` as `2026-12-02T05:38:47`, formatted once a second per
/// thread.
fn push_second(line: &mut Vec<u8>, since_epoch: Duration) {
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != since_epoch.as_secs() {
            let at = time::OffsetDateTime::from_unix_timestamp(since_epoch.as_secs() as i64)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
            *cached = (
                since_epoch.as_secs(),
                format!(
                    "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                    at.year(),
                    at.month() as u8,
                    at.day(),
                    at.hour(),
                    at.minute(),
                    at.second()
                ),
            );
        }
        line.extend_from_slice(cached.1.as_bytes());
    });
}

/// `127.0.0.1:40000` without `core::fmt` (as the gateway writes it).
fn push_peer(line: &mut Vec<u8>, peer: SocketAddr) {
    match peer {
        SocketAddr::V4(v4) => {
            for (i, octet) in v4.ip().octets().iter().enumerate() {
                if i > 0 {
                    line.push(b'.');
                }
                line.extend_from_slice(itoa::Buffer::new().format(*octet).as_bytes());
            }
        }
        SocketAddr::V6(v6) => {
            let _ = write!(line, "[{}]", v6.ip());
        }
    }
    line.push(b':');
    line.extend_from_slice(itoa::Buffer::new().format(peer.port()).as_bytes());
}

/// Writes the pending lines to `out` every millisecond, in one write a batch.
fn write_lines(pending: &Pending, mut out: impl Write) {
    let mut batch = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(1));
        std::mem::swap(&mut batch, &mut lock(pending));
        if !batch.is_empty() {
            let _ = out.write_all(&batch);
            batch.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(pending: &Pending) -> String {
        String::from_utf8(pending.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_access_and_audit_lines_have_the_gateways_fields() {
        let (access, audit): (Pending, Pending) = Default::default();
        let path = "/api/resources/values/get";
        let answered = Answered {
            peer: "127.0.0.1:40000".parse().unwrap(),
            method: "POST",
            path,
            status: StatusCode::OK,
            started: Instant::now(),
        };
        answered.access_line(&access);
        answered.audit_line(&audit);
        let access = written(&access);
        let audit = written(&audit);
        // 2026-12-02T05:38:47.123Z 127.0.0.1:40000 POST /api/resources/values/get 200 14us
        let fields: Vec<&str> = access.trim_end().split(' ').collect();
        assert_eq!(fields.len(), 6, "{access:?}");
        assert!(
            fields[0].len() == 24 && fields[0].as_bytes()[10] == b'T' && fields[0].ends_with('Z')
        );
        assert_eq!(fields[1..5], ["127.0.0.1:40000", "POST", path, "200"]);
        assert!(fields[5].ends_with("us"), "{access:?}");
        // 2026-12-02 05:38:47.123 127.0.0.1 POST /api/resources/values/get 200 0ms
        let fields: Vec<&str> = audit.trim_end().split(' ').collect();
        assert_eq!(fields.len(), 7, "{audit:?}");
        assert_eq!((fields[0].len(), fields[1].len()), (10, 12), "{audit:?}");
        assert_eq!(fields[2..6], ["127.0.0.1", "POST", path, "200"]);
        assert_eq!(fields[6], "0ms");
        assert!(audit.ends_with('\n') && access.ends_with('\n'));
    }

    #[tokio::test]
    async fn the_stream_floor_sends_each_subscription_its_values_at_its_interval() {
        let addr = start("unused".to_owned(), Bytes::new(), Floor::Streams)
            .await
            .unwrap();
        let channels = ["A.one", "B.two"];
        let subscription = serde_json::json!({ "Channels": channels, "IntervalMs": 20 });
        let (mut stream, ids) =
            crate::scenarios::fanout::EventStream::subscribed(addr, &[subscription])
                .await
                .unwrap();
        let started = Instant::now();
        for _ in 0..3 {
            let (kind, data) = stream.next_event().await.unwrap();
            assert_eq!(kind, "values");
            let data: serde_json::Value = serde_json::from_str(&data).unwrap();
            assert_eq!(data["subscription"], ids[0].as_str());
            for channel in channels {
                assert_eq!(data["values"][channel], "0", "{data}");
            }
        }
        // The first event goes at once, the next two an interval apart each.
        assert!(started.elapsed() >= Duration::from_millis(35));
    }

    #[tokio::test]
    async fn the_stream_floor_refuses_a_subscription_to_no_stream() {
        let streams = Streams::default();
        let body = br#"{"StreamId":"nope","Channels":["A"],"IntervalMs":100}"#;
        assert_eq!(subscribe(&streams, body).0, StatusCode::NOT_FOUND);
        assert_eq!(subscribe(&streams, b"{").0, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_floor_is_named_by_its_kind() {
        assert_eq!("plain".parse::<Floor>().unwrap(), Floor::Plain);
        assert_eq!("audited".parse::<Floor>().unwrap(), Floor::Audited);
        assert_eq!(
            Floor::Streams.arg().parse::<Floor>().unwrap(),
            Floor::Streams
        );
        assert!("both".parse::<Floor>().is_err());
        let forced = Floor::Forced("127.0.0.1:4000".parse().unwrap());
        assert_eq!(forced.arg().parse::<Floor>().unwrap(), forced);
        assert!("forced:nowhere".parse::<Floor>().is_err());
    }
}
