//! The event stream and subscriptions against the simulator: hello, values on the interval,
//! update, delete, expiry, link and configuration events, fan-out through one scheduler,
//! slow readers, consuming channels, closed streams, limits and shutdown.

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::*;
use serde_json::{Value as Json, json};
use station_gateway::lease::LeaseView;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IMON1: &str = "0.4.ESH10000662.IMON1";
const UART01: &str = "0.ESH10000023.UART01";
const I2C09: &str = "0.ESH10000023.I2C09";

async fn subscribe(rig: &Rig, stream: &str, channels: &[&str], interval_ms: u64) -> Result<String> {
    let body = json!({ "StreamId": stream, "Channels": channels, "IntervalMs": interval_ms });
    let (status, answer) = rig.post("subscriptions", body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["expiresInMs"].as_u64().is_some(), "{answer}");
    Ok(answer["id"].as_str().context("no id")?.to_owned())
}

fn stream_id(hello: &Json) -> String {
    hello["streamId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn hello_comes_first_and_capabilities_list_events_and_subscriptions() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (_sse, hello) = Sse::open_hello(&rig).await?;
    assert_eq!(hello["isConnected"], true);
    assert_eq!(hello["generation"], rig.gateway.link().info().generation);
    assert!(
        hello["apiVersion"].is_u64(),
        "the .NET client binds an int: {hello}"
    );
    assert_eq!(stream_id(&hello).len(), 32);
    let (_other, second) = Sse::open_hello(&rig).await?;
    assert_ne!(stream_id(&hello), stream_id(&second));
    let (_, capabilities) = rig.get("capabilities").await;
    let features = capabilities["features"].as_array().unwrap();
    assert!(features.contains(&json!("events")) && features.contains(&json!("subscriptions")));
    Ok(())
}

#[tokio::test]
async fn a_subscription_delivers_values_and_ages_about_every_interval_then_update_and_delete()
-> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribe(&rig, &stream_id(&hello), &[VMON1, IMON1], 200).await?;
    let mut arrivals = Vec::new();
    let mut last_id = sse.last_id;
    while arrivals.len() < 8 {
        let event = sse.next_named("values", Duration::from_secs(2)).await?;
        assert_eq!(event.id, last_id + 1, "no gaps for a reader that keeps up");
        last_id = event.id;
        arrivals.push(Instant::now());
        let data = &event.data;
        assert_eq!(data["subscription"], id.as_str());
        assert!(data["errors"].is_null(), "{data}");
        for name in [VMON1, IMON1] {
            assert!(data["values"][name].is_string(), "{data}");
            let age = data["ageMs"][name].as_f64().unwrap();
            assert!((0.0..250.0).contains(&age), "{data}");
        }
    }
    // The first event goes out at once; the rest about every 200 ms.
    let span = arrivals[7].duration_since(arrivals[1]);
    let mean = span / 6;
    assert!(
        mean >= Duration::from_millis(150) && mean <= Duration::from_millis(260),
        "mean spacing {mean:?}"
    );

    // Update: other channels (lower-case keys bind too), a new interval.
    let (status, answer) = rig
        .send(
            reqwest::Method::PUT,
            &format!("subscriptions/{id}"),
            Some(json!({ "channels": [MON_3V3], "intervalMs": 100 })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], id.as_str());
    let mut seen = 0;
    let started = Instant::now();
    while seen < 5 {
        let event = sse.next_named("values", Duration::from_secs(2)).await?;
        if event.data["values"].get(MON_3V3).is_some() {
            assert!(event.data["values"].get(VMON1).is_none(), "{}", event.data);
            seen += 1;
        }
    }
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "5 events at 100 ms took {:?}",
        started.elapsed()
    );

    // Delete: 200, then no more values; a second delete and a PUT are 404.
    let (status, _) = rig
        .send(
            reqwest::Method::DELETE,
            &format!("subscriptions/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let deleted = Instant::now();
    loop {
        match sse.next(Duration::from_millis(600)).await {
            Ok(Some(event)) if event.name == "values" => {
                assert!(
                    deleted.elapsed() < Duration::from_millis(150),
                    "values after delete"
                );
            }
            Ok(Some(_)) => {}
            Ok(None) => bail!("the stream ended"),
            Err(_) => break,
        }
    }
    let (status, body) = rig
        .send(
            reqwest::Method::DELETE,
            &format!("subscriptions/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = rig
        .send(
            reqwest::Method::PUT,
            &format!("subscriptions/{id}"),
            Some(json!({ "Channels": [VMON1], "IntervalMs": 100 })),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no such subscription"),
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn a_subscription_not_renewed_ends_and_a_renewed_one_lives_on() -> Result<()> {
    let rig = rig(|c| c.events.subscription_ttl_ms = 700).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let lapsing = subscribe(&rig, &stream, &[VMON1], 100).await?;
    let renewed = subscribe(&rig, &stream, &[IMON1], 100).await?;
    let started = Instant::now();
    let mut last_lapsing = started;
    let mut last_renewed = started;
    let mut next_renewal = started + Duration::from_millis(300);
    while started.elapsed() < Duration::from_millis(2000) {
        if Instant::now() >= next_renewal {
            let (status, body) = rig
                .send(
                    reqwest::Method::PUT,
                    &format!("subscriptions/{renewed}"),
                    Some(json!({ "Channels": [IMON1], "IntervalMs": 100 })),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["expiresInMs"], 700);
            next_renewal += Duration::from_millis(300);
        }
        let event = sse.next_named("values", Duration::from_secs(1)).await?;
        if event.data["subscription"] == lapsing.as_str() {
            last_lapsing = Instant::now();
        } else if event.data["subscription"] == renewed.as_str() {
            last_renewed = Instant::now();
        }
    }
    let lapsed_after = last_lapsing.duration_since(started);
    assert!(
        lapsed_after >= Duration::from_millis(500) && lapsed_after <= Duration::from_millis(900),
        "the unrenewed subscription's last values came {lapsed_after:?} after it started"
    );
    assert!(last_renewed.elapsed() < Duration::from_millis(300));
    let (status, _) = rig
        .send(
            reqwest::Method::PUT,
            &format!("subscriptions/{lapsing}"),
            Some(json!({ "Channels": [VMON1], "IntervalMs": 100 })),
        )
        .await;
    assert_eq!(status, 404);
    Ok(())
}

#[tokio::test]
async fn requests_out_of_bounds_get_clear_4xx_answers() -> Result<()> {
    let rig = rig(|c| {
        c.events.max_streams = 2;
        c.events.max_subscriptions_per_stream = 2;
        c.events.max_channels_per_subscription = 3;
    })
    .await;
    let (_sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let post = |body: Json| rig.post("subscriptions", body);

    for interval in [
        json!(0),
        json!(99),
        json!(60_001),
        json!(100.5),
        json!(-5),
        json!("x"),
    ] {
        let (status, body) =
            post(json!({ "StreamId": stream, "Channels": [VMON1], "IntervalMs": interval })).await;
        assert_eq!(status, 400, "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("IntervalMs must be 100 to 60000 ms, a whole number; got ")
                && error.ends_with(&interval.to_string()),
            "{body}"
        );
    }
    let (status, body) = post(
        json!({ "StreamId": stream, "Channels": [VMON1, "No.Such.Channel"], "IntervalMs": 100 }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("No.Such.Channel"),
        "{body}"
    );
    let (status, body) =
        post(json!({ "StreamId": "nope", "Channels": [VMON1], "IntervalMs": 100 })).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no such event stream"),
        "{body}"
    );
    let (status, body) =
        post(json!({ "StreamId": stream, "Channels": [], "IntervalMs": 100 })).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        post(json!({ "StreamId": stream, "Channels": "x", "IntervalMs": 100 })).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(json!({ "StreamId": stream, "Channels": [VMON1] })).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("IntervalMs"),
        "{body}"
    );
    let (status, body) =
        post(json!({ "StreamId": stream, "Channels": [VMON1, IMON1, MON_3V3, VSET1], "IntervalMs": 100 })).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("at most 3 channels"),
        "{body}"
    );
    let response = rig
        .http
        .post(rig.url("subscriptions"))
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await?;
    assert_eq!(response.status(), 400);

    subscribe(&rig, &stream, &[VMON1], 100).await?;
    subscribe(&rig, &stream, &[VMON1], 1000).await?;
    let (status, body) =
        post(json!({ "streamid": stream, "channels": [VMON1], "intervalms": 100 })).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("already has 2 subscriptions"),
        "{body}"
    );

    let _second = Sse::open(&rig).await?;
    let response = rig.http.get(rig.url("events")).send().await?;
    assert_eq!(response.status(), 429);
    let body: Json = response.json().await?;
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("events.max_streams"),
        "{body}"
    );

    let (status, _) = rig
        .send(reqwest::Method::GET, "subscriptions/abc", None)
        .await;
    assert_eq!(status, 405);
    Ok(())
}

#[tokio::test]
async fn consuming_channels_are_never_read_and_always_named_in_errors() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    subscribe(&rig, &stream_id(&hello), &[UART01, I2C09, VMON1], 100).await?;
    for _ in 0..5 {
        let data = sse.next_named("values", Duration::from_secs(2)).await?.data;
        assert!(data["values"][VMON1].is_string(), "{data}");
        for name in [UART01, I2C09] {
            assert!(data["values"].get(name).is_none(), "{data}");
            let why = data["errors"][name].as_str().unwrap();
            assert!(
                why.contains("consumes data") && why.contains(name),
                "{data}"
            );
        }
    }
    assert_eq!(rig.sim.reads_of(UART01), 0);
    assert_eq!(rig.sim.reads_of(I2C09), 0);
    Ok(())
}

#[tokio::test]
async fn a_failed_read_leaves_the_channel_out_and_names_it_in_errors() -> Result<()> {
    let rig = rig(|c| c.station.request_timeout_ms = 300).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    subscribe(&rig, &stream_id(&hello), &[VMON1], 100).await?;
    sse.next_named("values", Duration::from_secs(2)).await?;
    rig.sim.set_stall(true);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let data = sse.next_named("values", Duration::from_secs(2)).await?.data;
        if data["errors"].is_object() {
            assert!(data["values"].get(VMON1).is_none(), "{data}");
            assert!(data["errors"][VMON1].is_string(), "{data}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no errors while the station stalls"
        );
    }
    rig.sim.set_stall(false);
    Ok(())
}

#[tokio::test]
async fn connection_events_follow_a_drop_and_the_reconnect_with_the_next_generation() -> Result<()>
{
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let generation = hello["generation"].as_u64().unwrap();
    rig.sim.drop_connections();
    let down = sse
        .next_named("connection", Duration::from_secs(3))
        .await?
        .data;
    assert_eq!(down["isConnected"], false, "{down}");
    assert!(down["lastError"].is_string(), "{down}");
    let up = sse
        .next_named("connection", Duration::from_secs(5))
        .await?
        .data;
    assert_eq!(up["isConnected"], true, "{up}");
    assert_eq!(up["generation"].as_u64(), Some(generation + 1), "{up}");
    assert!(up["lastError"].is_null(), "{up}");
    Ok(())
}

#[tokio::test]
async fn a_configuration_event_follows_a_change_of_the_channel_list() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    assert!(rig.sim.remove_channel(MON_3V3));
    let event = sse
        .next_named("configuration", Duration::from_secs(3))
        .await?
        .data;
    assert_eq!(event["changeType"], "Removed", "{event}");
    assert_eq!(event["generation"], hello["generation"], "{event}");
    // The removed channel can no longer be subscribed to.
    let (status, body) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": stream_id(&hello), "Channels": [MON_3V3], "IntervalMs": 100 }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    Ok(())
}

#[tokio::test]
async fn lease_changes_are_relayed_and_subscriptions_work_while_someone_else_holds_it() -> Result<()>
{
    let rig = rig(|_| {}).await;
    let (mut first, hello) = Sse::open_hello(&rig).await?;
    let (mut second, _) = Sse::open_hello(&rig).await?;
    let (status, lease) = rig
        .post("lease", json!({ "Owner": "TAT 3", "TtlMs": 30000 }))
        .await;
    assert_eq!(status, 200, "{lease}");
    for sse in [&mut first, &mut second] {
        let hello_id = sse.last_id;
        let event = sse.next_named("lease", Duration::from_secs(2)).await?;
        assert_eq!(event.id, hello_id + 1);
        assert_eq!(event.data["held"], true, "{}", event.data);
        assert_eq!(event.data["owner"], "TAT 3", "{}", event.data);
        assert!(event.data.get("leaseId").is_none(), "{}", event.data);
    }
    // Someone without the lease subscribes, renews and gets values.
    let id = subscribe(&rig, &stream_id(&hello), &[VMON1], 100).await?;
    let data = first
        .next_named("values", Duration::from_secs(2))
        .await?
        .data;
    assert!(data["values"][VMON1].is_string(), "{data}");
    let (status, body) = rig
        .send(
            reqwest::Method::PUT,
            &format!("subscriptions/{id}"),
            Some(json!({ "Channels": [VMON1], "IntervalMs": 200 })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let lease_id = lease["leaseId"].as_str().context("no leaseId")?;
    let (status, body) = rig
        .send(reqwest::Method::DELETE, &format!("lease/{lease_id}"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    for sse in [&mut first, &mut second] {
        let event = sse.next_named("lease", Duration::from_secs(2)).await?;
        assert_eq!(event.data["held"], false, "{}", event.data);
    }
    // The relay also passes on whatever the lease sends on its channel, as it is.
    let view = LeaseView {
        held: true,
        owner: Some("TAT 4".into()),
        expires_in_ms: 30_000,
        since: None,
        safe_state: None,
        ended: None,
        lock_delay_ms: None,
        lock_delay_reason: None,
    };
    rig.gateway.gateway.lease_events.send(view)?;
    let event = second.next_named("lease", Duration::from_secs(2)).await?;
    assert_eq!(
        event.data,
        json!({ "held": true, "owner": "TAT 4", "expiresInMs": 30000, "since": null })
    );
    Ok(())
}

/// 200 streams on the same 10 channels at 100 ms: the station sees about 10 reads per channel
/// per second, not 2 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_streams_on_the_same_channels_share_one_read_per_interval() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (_, names) = rig.get("resources/names").await;
    let channels: Vec<String> = names
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .filter(|name| {
            ["VMON", "IMON", "VSET", "ISET"]
                .iter()
                .any(|kind| name.contains(kind))
        })
        .take(10)
        .map(str::to_owned)
        .collect();
    assert_eq!(channels.len(), 10, "{names}");
    let channel_refs: Vec<&str> = channels.iter().map(String::as_str).collect();
    // How many values events each stream has had so far: the test's clock is the scheduler's
    // ticks, not the wall clock, so a loaded machine makes it slower, never wrong.
    let counts: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>> =
        std::sync::Arc::new((0..200).map(|_| Default::default()).collect());
    let count = |n: usize| counts[n].load(std::sync::atomic::Ordering::SeqCst);
    let mut readers = tokio::task::JoinSet::new();
    for n in 0..200 {
        let (mut sse, hello) = Sse::open_hello(&rig).await?;
        subscribe(&rig, &stream_id(&hello), &channel_refs, 100).await?;
        let counts = counts.clone();
        readers.spawn(async move {
            let mut last_id = sse.last_id;
            let mut gaps = 0;
            let mut clean = true;
            while let Ok(Some(event)) = sse.next(Duration::from_secs(10)).await {
                if event.id != last_id + 1 {
                    gaps += 1;
                }
                last_id = event.id;
                if event.name == "values" {
                    clean &= event.data["errors"].is_null();
                    counts[n].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
            (gaps, clean)
        });
    }
    // Every stream has had its first values: the window starts.
    until(
        Duration::from_secs(30),
        "a values event on every stream",
        || (0..200).all(|n| count(n) > 0),
    )
    .await;
    let events_before: Vec<u64> = (0..200).map(count).collect();
    let reads_before: Vec<u64> = channels.iter().map(|name| rig.sim.reads_of(name)).collect();
    let frames_before = rig.sim.read_frames();
    let window_start = Instant::now();
    // Twenty more ticks on the first stream (about 2 s on an idle machine).
    until(Duration::from_secs(60), "twenty more ticks", || {
        count(0) >= events_before[0] + 20
    })
    .await;
    let reads: Vec<u64> = channels
        .iter()
        .zip(&reads_before)
        .map(|(name, before)| rig.sim.reads_of(name) - before)
        .collect();
    let frames = rig.sim.read_frames() - frames_before;
    let window = window_start.elapsed();
    let fewest = (0..200).map(|n| count(n) - events_before[n]).min().unwrap();
    // A tick comes at most every 100 ms, however loaded the machine (a slow one only skips
    // ticks): the most ticks the window can have held.
    let most = window.as_millis() as u64 / 100 + 2;
    eprintln!(
        "window {window:?}: at most {most} ticks, {fewest} or more values events per stream; reads per channel {reads:?}; {frames} READ frames"
    );
    // Shared: each channel was read at most once per tick, not once per stream and tick (200
    // times as many); each tick's reads went out in one READ frame; and it was read again at
    // every tick or so, not served stale (a stream's events may lag behind, never lead).
    for (name, reads) in channels.iter().zip(&reads) {
        assert!(
            *reads <= most,
            "{name}: {reads} hardware reads in at most {most} ticks"
        );
        assert!(
            *reads * 3 >= fewest,
            "{name}: only {reads} hardware reads for {fewest} values events: stale values served"
        );
    }
    assert!(
        frames <= most,
        "{frames} READ frames in at most {most} ticks"
    );
    // Every stream kept being served, and saw no gap (nothing dropped) till the gateway stopped.
    rig.gateway.stop().await;
    while let Some(result) = within(
        Duration::from_secs(10),
        "the streams to end",
        readers.join_next(),
    )
    .await
    {
        let (gaps, clean) = result?;
        assert_eq!(gaps, 0, "a reader that keeps up sees no gaps");
        assert!(clean, "a values event named errors");
    }
    assert!(
        (0..200).all(|n| count(n) > events_before[n]),
        "a stream got no values during the window"
    );
    Ok(())
}

/// A reader that stops reading (a tiny receive window, never read) has its subscriptions'
/// values merged at the gateway (the latest value wins: one values event a subscription
/// waits, however long it is behind), without slowing the scheduler or anyone else; when it
/// reads again its ids go on without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_reader_stops_reading_does_not_delay_the_others() -> Result<()> {
    let rig = rig(|c| {
        c.events.stream_queue = 8;
        c.events.max_channels_per_subscription = 1000;
    })
    .await;
    let (_, names) = rig.get("resources/names").await;
    let all: Vec<String> = names
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .map(str::to_owned)
        .collect();

    // The stuck reader: a raw socket with a small receive buffer, read only for its hello.
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stuck = socket.connect(rig.gateway.http_addr).await?;
    stuck
        .write_all(
            b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n",
        )
        .await?;
    let mut head = vec![0u8; 4096];
    let mut got = 0;
    let stuck_id = loop {
        got += stuck.read(&mut head[got..]).await?;
        let text = String::from_utf8_lossy(&head[..got]).to_string();
        if let Some(at) = text.find("\"streamId\":\"")
            && let Some(id) = text[at + 12..]
                .split('"')
                .next()
                .filter(|id| id.len() == 32)
        {
            break id.to_owned();
        }
        if got == head.len() {
            bail!("no hello: {text}");
        }
    };
    let all_refs: Vec<&str> = all.iter().map(String::as_str).collect();
    for _ in 0..10 {
        subscribe(&rig, &stuck_id, &all_refs, 100).await?;
    }

    let (mut healthy, hello) = Sse::open_hello(&rig).await?;
    subscribe(&rig, &stream_id(&hello), &[VMON1], 100).await?;
    let started = Instant::now();
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    let mut count = 0;
    while started.elapsed() < Duration::from_secs(4) {
        healthy.next_named("values", Duration::from_secs(1)).await?;
        longest = longest.max(last.elapsed());
        last = Instant::now();
        count += 1;
    }
    assert!(count >= 30, "only {count} values events in 4 s");
    assert!(
        longest < Duration::from_millis(400),
        "the healthy stream waited {longest:?} for an event"
    );

    // The stuck stream fell behind: its values wait merged, one event a subscription.
    let events = &rig.gateway.gateway.events;
    assert_eq!(
        events.subscription_count(),
        11,
        "the stuck stream is not closed before the stuck limit"
    );
    let (queued, merged) = events
        .stream_queue(&stuck_id)
        .context("the stuck stream is open")?;
    assert!(
        (1..=10).contains(&queued),
        "{queued} waiting: at most one values event for each of its 10 subscriptions"
    );
    assert!(merged > 0, "nothing merged in 4 s of a stuck reader");
    // It reads again: every id after its hello's is there, each one more than the last.
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; 65536];
    let mut ids: Vec<u64> = Vec::new();
    let read_until = Instant::now() + Duration::from_secs(10);
    while ids.len() < 200 {
        let n = tokio::time::timeout(Duration::from_secs(2), stuck.read(&mut chunk)).await??;
        if n == 0 {
            bail!("the stuck stream ended");
        }
        buffer.extend_from_slice(&chunk[..n]);
        // Only whole lines: a read can end inside an id.
        let whole = buffer
            .iter()
            .rposition(|&byte| byte == b'\n')
            .map_or(0, |at| at + 1);
        let text = String::from_utf8_lossy(&buffer[..whole]);
        ids = text
            .lines()
            .filter_map(|line| line.strip_prefix("id: "))
            .filter_map(|id| id.parse::<u64>().ok())
            .collect();
        if Instant::now() > read_until {
            bail!("only {} events read again in 10 s", ids.len());
        }
    }
    if let Some(pair) = ids.windows(2).find(|pair| pair[1] != pair[0] + 1) {
        bail!("an id gap after the reader was stuck: {pair:?}");
    }
    Ok(())
}

/// With `events.resume_grace_ms = 0` a stream whose reader went away is not kept for it to
/// resume: its subscriptions end at once (with a grace, `event_resume.rs`).
#[tokio::test]
async fn without_a_resume_grace_a_closed_stream_ends_its_subscriptions_at_once() -> Result<()> {
    let rig = rig(|c| c.events.resume_grace_ms = 0).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribe(&rig, &stream_id(&hello), &[VMON1], 100).await?;
    sse.next_named("values", Duration::from_secs(2)).await?;
    assert_eq!(rig.gateway.gateway.events.stream_count(), 1);
    drop(sse);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, _) = rig
            .send(
                reqwest::Method::PUT,
                &format!("subscriptions/{id}"),
                Some(json!({ "Channels": [VMON1], "IntervalMs": 100 })),
            )
            .await;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the subscription outlived its stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rig.gateway.gateway.events.stream_count(), 0);
    assert_eq!(rig.gateway.gateway.events.subscription_count(), 0);
    Ok(())
}

#[tokio::test]
async fn an_idle_stream_gets_a_ping_comment_within_ten_seconds() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, _) = Sse::open_hello(&rig).await?;
    let started = Instant::now();
    while sse.pings == 0 {
        if let Ok(Some(event)) = sse.next(Duration::from_millis(200)).await {
            bail!("unexpected event {event:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no ping in 10 s"
        );
    }
    Ok(())
}

#[tokio::test]
async fn shutdown_ends_open_streams_promptly_saying_so_last() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    subscribe(&rig, &stream_id(&hello), &[VMON1], 100).await?;
    let (mut idle, _) = Sse::open_hello(&rig).await?;
    sse.next_named("values", Duration::from_secs(2)).await?;
    let Rig { gateway, .. } = rig;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), gateway.stop())
        .await
        .context("stop waited for the streams")?;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        started.elapsed()
    );
    // Each stream's last event says why it ends, so its reader knows to reconnect.
    for stream in [&mut sse, &mut idle] {
        let mut last = None;
        loop {
            match stream.next(Duration::from_secs(1)).await {
                Ok(Some(event)) => last = Some(event),
                Ok(None) => break,
                Err(error) => bail!("the stream did not end cleanly: {error:#}"),
            }
        }
        let last = last.context("no event before the end")?;
        assert_eq!(last.name, "closed", "{last:?}");
        assert_eq!(last.data["reason"], "shutdown", "{}", last.data);
    }
    Ok(())
}

/// docs/events.md: "A subscription sends a `values` event on its stream at once and then about
/// every `IntervalMs`" — with a 60 s interval the first must not wait for the grid's next tick.
#[tokio::test]
async fn the_first_values_event_comes_at_once_not_after_the_interval() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribe(&rig, &stream_id(&hello), &[MON_3V3], 60_000).await?;
    let first = sse.next_named("values", Duration::from_secs(10)).await?;
    assert_eq!(first.data["subscription"], id.as_str());
    assert!(first.data["values"][MON_3V3].is_string(), "{}", first.data);
    Ok(())
}

/// docs/events.md: `configuration` with `changeType: "Added"` when the station's NOTIFY says a
/// channel was added.
#[tokio::test]
async fn a_channel_added_on_the_station_gives_a_configuration_event_added() -> Result<()> {
    const ADC08: &str = "0.8.ESH10000590.ADC08";
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let spec = rig
        .sim
        .profile()
        .channels
        .iter()
        .find(|c| c.descriptor.name == ADC08)
        .cloned()
        .context("no ADC08 in the default profile")?;
    assert!(rig.sim.remove_channel(ADC08));
    let removed = sse
        .next_named("configuration", Duration::from_secs(5))
        .await?;
    assert_eq!(removed.data["changeType"], "Removed", "{}", removed.data);
    assert!(rig.sim.add_channel(spec));
    let added = sse
        .next_named("configuration", Duration::from_secs(5))
        .await?;
    assert_eq!(added.data["changeType"], "Added", "{}", added.data);
    assert_eq!(
        added.data["generation"], hello["generation"],
        "{}",
        added.data
    );
    Ok(())
}

/// docs/events.md: a stream closed because it is stuck ends its subscriptions with it. The
/// sweep that finds a stream full for 30 s closes it with `Events::close_stream` (unit test
/// `events::tests::a_stream_full_for_the_stuck_limit_is_closed_and_a_drained_one_is_not`);
/// here that close, on a live gateway: the subscriptions end and the body ends.
#[tokio::test]
async fn a_stream_closed_as_stuck_ends_its_subscriptions_and_its_body() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let first = subscribe(&rig, &stream, &[MON_3V3], 100).await?;
    let second = subscribe(&rig, &stream, &[VMON1], 100).await?;
    sse.next_named("values", Duration::from_secs(5)).await?;
    let events = &rig.gateway.gateway.events;
    assert_eq!(events.subscription_count(), 2);
    events.close_stream(&stream);
    assert_eq!(events.subscription_count(), 0);
    for id in [first, second] {
        let (status, body) = rig
            .send(
                reqwest::Method::PUT,
                &format!("subscriptions/{id}"),
                Some(json!({ "Channels": [MON_3V3], "IntervalMs": 100 })),
            )
            .await;
        assert_eq!(status, 404, "{body}");
    }
    within(
        Duration::from_secs(5),
        "the closed stream's body to end",
        async {
            while let Some(_event) = sse.next(Duration::from_secs(5)).await? {}
            anyhow::Ok(())
        },
    )
    .await?;
    Ok(())
}
