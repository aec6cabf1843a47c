//! Scenario 5, the fan-out: event streams of many subscriptions, the gateway's CPU and memory
//! a stream beside the stream floor; and [`EventStream`], the event-stream client the stream
//! scenarios share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Bench, CpuSpan, body, wait_until_serving};
use crate::http::{HttpConnection, find};
use crate::report::{Row, Verdict, megabytes, thousands};

impl Bench {
    /// 5. 1 000 event streams, 10 channels each at 100 ms: events per second, CPU, memory.
    pub async fn fanout(&self) -> Vec<Row> {
        let scenario = format!(
            "Event fan-out: {} streams × 10 channels @ 100 ms",
            self.fanout_streams
        );
        match self.fanout_inner().await {
            Ok((mut row, stream_cost)) => {
                row.scenario = scenario;
                vec![row, stream_cost]
            }
            Err(why) => vec![Row::not_measurable("5", scenario, format!("{why:#}"))],
        }
    }

    /// Row 5, and row 5c: the targets for a stream's cost, judged beside the stream floor.
    async fn fanout_inner(&self) -> anyhow::Result<(Row, Row)> {
        let streams = self.fanout_streams;
        let channels: Vec<String> = self.names.iter().take(10).cloned().collect();
        // The stream floor first, in a process of its own, under the same load: what any
        // gateway's streams cost at the least (the fan-out's cost targets are judged by it).
        let floor = crate::child::TrivialProcess::spawn_floor(
            &self.names[0],
            b"{}",
            crate::floor::Floor::Streams,
        )
        .await
        .context("cannot start the stream floor")?;
        let floor_run = fan_out(
            floor.addr,
            floor.pid,
            streams,
            &channels,
            self.fanout_window,
        )
        .await
        .context("the stream floor")?;
        drop(floor);
        // A fresh gateway, as the floor is fresh: one that served the earlier scenarios has
        // freed heap the streams would reuse, and its memory a stream would read low.
        let gateway = self
            .recipe
            .spawn()
            .await
            .context("cannot start a fresh gateway for the fan-out")?;
        wait_until_serving(&gateway, &self.names[0], Duration::from_secs(20)).await?;
        let run = fan_out(
            gateway.http_addr,
            gateway.pid,
            streams,
            &channels,
            self.fanout_window,
        )
        .await;
        gateway.stop().await;
        let run = run?;
        let expected = streams as f64 * 10.0;
        let mut row = Row::new("5", "");
        row.gateway = run.cell();
        row.baseline = format!(
            "expected {} events/s (1 per stream per 100 ms); stream floor: {}",
            thousands(expected),
            floor_run.cell()
        );
        row.ratio = format!(
            "{:.2}× expected events; {:.2}× the floor's CPU, {:.2}× its memory a stream",
            run.per_second / expected,
            run.cpu / floor_run.cpu.max(1e-9),
            run.per_stream() / floor_run.per_stream().max(1e-9)
        );
        row.target = "CPU ≤ 25 % of one core; RSS ≤ 80 MB".to_owned();
        row.verdict =
            Verdict::from_bool(run.cpu <= 25.0 && run.peak_rss <= 80_000_000 && run.failed == 0);
        row.notes.push(format!(
            "a fresh gateway (it served nothing before); {streams} streams opened and subscribed in {:.1} s; measured over {:.1} s; RSS before the streams {}; {} streams ended early",
            run.setup.as_secs_f64(),
            run.elapsed.as_secs_f64(),
            megabytes(run.rss_before),
            run.failed
        ));
        row.notes.push(format!(
            "stream floor (`floor.rs`: hyper's HTTP/1 connection, a queue a stream, one ticker task an interval, the event rendered once; run just before): RSS before the streams {}; {} streams ended early; the fan-out's cost targets: ≤ 8 % of a core, ≤ 20 KB a stream",
            megabytes(floor_run.rss_before),
            floor_run.failed
        ));
        let stream_cost = stream_own_cost(streams, &run, &floor_run);
        Ok((row, stream_cost))
    }
}

/// 5c. The targets for the fan-out's cost: the share of a core and the memory a stream, judged
/// beside the stream floor under the same load.
pub(super) fn stream_own_cost(streams: usize, gateway: &FanOut, floor: &FanOut) -> Row {
    const CPU_PERCENT: f64 = 8.0;
    const KB_A_STREAM: f64 = 20.0;
    let mut row = Row::new(
        "5c",
        format!("Event fan-out: a stream's cost, {streams} streams"),
    );
    let kb = |run: &FanOut| run.per_stream() / 1000.0;
    row.gateway = format!(
        "CPU {:.0} % of one core · {:.1} KB a stream",
        gateway.cpu,
        kb(gateway)
    );
    row.baseline = format!(
        "stream floor (see 5): CPU {:.0} % of one core · {:.1} KB a stream",
        floor.cpu,
        kb(floor)
    );
    row.ratio = format!(
        "{:.2}× the floor's CPU; {:.2}× its memory a stream",
        gateway.cpu / floor.cpu.max(1e-9),
        gateway.per_stream() / floor.per_stream().max(1e-9)
    );
    row.target = format!("≤ {CPU_PERCENT:.0} % of one core; ≤ {KB_A_STREAM:.0} KB a stream");
    row.verdict = if gateway.failed > 0 || floor.failed > 0 {
        row.notes.push("streams ended early (see 5)".to_owned());
        Verdict::Missed
    } else {
        Verdict::beside_floor(&[
            (gateway.cpu <= CPU_PERCENT, floor.cpu <= CPU_PERCENT),
            (kb(gateway) <= KB_A_STREAM, kb(floor) <= KB_A_STREAM),
        ])
    };
    if row.verdict == Verdict::OutOfReach {
        row.notes.push(
            "out of reach: each part the gateway missed, the stream floor missed too under the same load (hyper's HTTP/1 connection, a queue a stream, one ticker task an interval, the event rendered once)".to_owned(),
        );
    }
    row
}

/// One fan-out run: `streams` event streams on `addr`, 10 channels each at 100 ms, the
/// server's process `pid` sampled.
pub(super) struct FanOut {
    pub(super) per_second: f64,
    pub(super) cpu: f64,
    pub(super) peak_rss: u64,
    pub(super) rss_before: u64,
    pub(super) streams: usize,
    pub(super) setup: Duration,
    pub(super) elapsed: Duration,
    pub(super) failed: usize,
}

impl FanOut {
    /// Resident memory a stream, in bytes: (peak − before) / streams.
    fn per_stream(&self) -> f64 {
        self.peak_rss.saturating_sub(self.rss_before) as f64 / self.streams.max(1) as f64
    }

    fn cell(&self) -> String {
        format!(
            "{} events/s · CPU {:.0} % of one core · RSS {} (peak) · {:.1} KB a stream",
            thousands(self.per_second),
            self.cpu,
            megabytes(self.peak_rss),
            self.per_stream() / 1000.0
        )
    }
}

async fn fan_out(
    addr: std::net::SocketAddr,
    pid: u32,
    streams: usize,
    channels: &[String],
    window: Duration,
) -> anyhow::Result<FanOut> {
    let counting = Arc::new(AtomicBool::new(false));
    let events = Arc::new(AtomicU64::new(0));
    let subscribed = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let open_limit = Arc::new(tokio::sync::Semaphore::new(32));
    let rss_before = crate::child::rss_of(pid).unwrap_or(0);
    let mut tasks: tokio::task::JoinSet<anyhow::Result<()>> = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let channels = channels.to_vec();
        let (counting, events, subscribed, stop, open_limit) = (
            counting.clone(),
            events.clone(),
            subscribed.clone(),
            stop.clone(),
            open_limit.clone(),
        );
        tasks.spawn(async move {
            let permit = open_limit.acquire_owned().await?;
            let subscription = json!({ "Channels": channels, "IntervalMs": 100 });
            let (mut stream, _) = EventStream::subscribed(addr, &[subscription]).await?;
            drop(permit);
            subscribed.fetch_add(1, Ordering::Relaxed);
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    next = stream.next_event() => next?,
                };
                if next.0 == "values" && counting.load(Ordering::Relaxed) {
                    events.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    // Wait until every stream is subscribed, or one failed.
    let setup_started = Instant::now();
    while subscribed.load(Ordering::Relaxed) < streams as u64 {
        if let Some(Ok(Err(why))) = tasks.try_join_next() {
            stop.cancel();
            tasks.shutdown().await;
            return Err(why.context(format!(
                "event stream setup failed after {} of {streams} streams subscribed",
                subscribed.load(Ordering::Relaxed)
            )));
        }
        if setup_started.elapsed() > Duration::from_secs(60) {
            stop.cancel();
            tasks.shutdown().await;
            bail!(
                "only {} of {streams} streams subscribed within 60 s",
                subscribed.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let setup = setup_started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    counting.store(true, Ordering::Relaxed);
    let cpu = CpuSpan::of(pid);
    let started = Instant::now();
    let mut peak_rss = 0;
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_rss = peak_rss.max(crate::child::rss_of(pid).unwrap_or(0));
    }
    counting.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = cpu.percent();
    let delivered = events.load(Ordering::Relaxed);
    stop.cancel();
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        if !matches!(joined, Ok(Ok(()))) {
            failed += 1;
        }
    }
    Ok(FanOut {
        per_second: delivered as f64 / elapsed.as_secs_f64(),
        cpu,
        peak_rss,
        rss_before,
        streams,
        setup,
        elapsed,
        failed,
    })
}

/// One `text/event-stream` response, read event by event.
pub(crate) struct EventStream {
    body: hyper::body::Incoming,
    buffer: BytesMut,
    _connection: HttpConnection,
}

impl EventStream {
    /// A stream past its `hello`, with one subscription per body (its `StreamId` filled
    /// in); the stream and the subscriptions' ids.
    pub(crate) async fn subscribed(
        addr: std::net::SocketAddr,
        subscriptions: &[serde_json::Value],
    ) -> anyhow::Result<(EventStream, Vec<String>)> {
        let mut stream = EventStream::open(addr).await?;
        let (kind, data) = tokio::time::timeout(Duration::from_secs(5), stream.next_event())
            .await
            .context("no hello event within 5 s")??;
        if kind != "hello" {
            bail!("the first event is {kind:?}, not hello");
        }
        let data: serde_json::Value = serde_json::from_str(&data)?;
        let stream_id = data
            .get("streamId")
            .and_then(serde_json::Value::as_str)
            .context("hello has no streamId")?
            .to_owned();
        let mut control = HttpConnection::open(addr).await?;
        let mut ids = Vec::with_capacity(subscriptions.len());
        for subscription in subscriptions {
            let mut request = subscription.clone();
            request["StreamId"] = json!(stream_id);
            let answer = control.post("/api/subscriptions", &body(request)).await?;
            let answer: serde_json::Value =
                serde_json::from_slice(&answer).context("the subscription's answer is not JSON")?;
            let id = answer
                .get("id")
                .and_then(serde_json::Value::as_str)
                .with_context(|| format!("a subscription was not granted: {answer}"))?;
            ids.push(id.to_owned());
        }
        Ok((stream, ids))
    }

    async fn open(addr: std::net::SocketAddr) -> anyhow::Result<EventStream> {
        let mut connection = HttpConnection::open(addr).await?;
        let response = connection.send(Method::GET, "/api/events", None).await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let text = response.into_body().collect().await?.to_bytes();
            bail!(
                "GET api/events: HTTP {status}: {}",
                String::from_utf8_lossy(&text)
            );
        }
        Ok(EventStream {
            body: response.into_body(),
            buffer: BytesMut::new(),
            _connection: connection,
        })
    }

    /// The next event's name and data; comments (pings) are skipped.
    pub(crate) async fn next_event(&mut self) -> anyhow::Result<(String, String)> {
        loop {
            if let Some(end) = find(&self.buffer, b"\n\n") {
                let block = self.buffer.split_to(end + 2);
                let text = String::from_utf8_lossy(&block);
                let mut kind = String::new();
                let mut data = String::new();
                for line in text.lines() {
                    if let Some(rest) = line.strip_prefix("event:") {
                        kind = rest.trim().to_owned();
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        data.push_str(rest.trim_start());
                    }
                }
                if kind.is_empty() && data.is_empty() {
                    continue;
                }
                return Ok((kind, data));
            }
            let frame = self
                .body
                .frame()
                .await
                .context("the event stream ended")??;
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }
}
