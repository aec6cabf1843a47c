//! A reader that reconnects to the event stream is never left silently wrong: with
//! `Last-Event-ID` (header or `lastEventId` query parameter) it gets every event it missed,
//! then the live stream, its subscriptions kept; when that cannot be (the replay buffer no
//! longer reaches back, the stream ended, the gateway restarted) it gets one `gap` event saying
//! why and which ids were lost, then a `snapshot` of its values, the lease and the link. A
//! reader that cannot keep up even with its values merged is closed with a last event saying
//! why, and a shutdown says so too (docs/events.md, "Ids, resume, gap and snapshot").

use crate::common;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use common::sse::{Event, SEQUENCE_SPAN, Sse};
use common::*;
use serde_json::{Value as Json, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(5);

async fn subscribe(rig: &Rig, stream: &str, channels: &[&str], interval_ms: u64) -> Result<String> {
    let (status, body) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": stream, "Channels": channels, "IntervalMs": interval_ms }),
        )
        .await;
    anyhow::ensure!(status == 200, "subscribe: {status} {body}");
    Ok(body["id"].as_str().context("no id")?.to_owned())
}

fn events_url(rig: &Rig) -> String {
    format!("{}/api/events", rig.gateway.base_url())
}

/// Opens the stream again as a reconnecting `EventSource` does: `Last-Event-ID: last`.
async fn reconnect(rig: &Rig, last: u64) -> Result<Sse> {
    let last = last.to_string();
    Sse::open_with_headers(&rig.http, &events_url(rig), &[("Last-Event-ID", &last)]).await
}

/// The next `count` events, each of them.
async fn next_events(sse: &mut Sse, count: usize) -> Result<Vec<Event>> {
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        got.push(sse.next(WAIT).await?.context("the stream ended")?);
    }
    Ok(got)
}

async fn renew(rig: &Rig, id: &str, channels: &[&str]) -> u16 {
    rig.send(
        reqwest::Method::PUT,
        &format!("subscriptions/{id}"),
        Some(json!({ "Channels": channels, "IntervalMs": 100 })),
    )
    .await
    .0
}

#[tokio::test]
async fn a_reader_reconnecting_with_last_event_id_gets_every_event_it_missed_then_the_live_stream()
-> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let stream = hello["streamId"].as_str().unwrap().to_owned();
    assert_eq!(hello["resumed"], false, "{hello}");
    let subscription = subscribe(&rig, &stream, &[VMON1], 100).await?;
    for _ in 0..3 {
        sse.next_named("values", WAIT).await?;
    }
    let last = sse.last_id;
    drop(sse);
    // While the reader is away its subscription lives on, and the lease changes hands.
    let (status, lease) = rig
        .post("lease", json!({ "Owner": "TAT 3", "TtlMs": 30000 }))
        .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(renew(&rig, &subscription, &[VMON1]).await, 200);

    let mut resumed = reconnect(&rig, last).await?;
    let hello = resumed.next(WAIT).await?.context("no hello")?;
    assert_eq!(hello.name, "hello");
    assert_eq!(hello.id, 0, "a resumed stream's hello has no id: {hello:?}");
    assert_eq!(hello.data["resumed"], true, "{}", hello.data);
    assert_eq!(hello.data["streamId"], stream.as_str());
    // Every event after the last one read, one id after the other: the lease event missed
    // and the values, of the same subscription, never subscribed again.
    let mut expected = last + 1;
    let mut lease_seen = false;
    let mut values_seen = 0;
    let deadline = Instant::now() + WAIT;
    while !(lease_seen && values_seen >= 3) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "lease {lease_seen}, values {values_seen}"
        );
        let event = resumed.next(WAIT).await?.context("the stream ended")?;
        assert_eq!(event.id, expected, "{event:?}");
        expected += 1;
        match event.name.as_str() {
            "lease" => {
                assert_eq!(event.data["held"], true, "{}", event.data);
                assert_eq!(event.data["owner"], "TAT 3", "{}", event.data);
                lease_seen = true;
            }
            "values" => {
                assert_eq!(event.data["subscription"], subscription.as_str());
                assert!(event.data["values"][VMON1].is_string(), "{}", event.data);
                values_seen += 1;
            }
            other => bail!("an unexpected {other} event: {}", event.data),
        }
    }
    assert_eq!(
        rig.gateway.gateway.events.stream_count(),
        1,
        "one stream, resumed"
    );
    Ok(())
}

/// What went out but never reached the reader is sent again as it was, id and data; the query
/// parameter serves a client that cannot set headers.
#[tokio::test]
async fn events_sent_but_not_seen_come_again_as_they_were_by_the_query_parameter() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let hello_id = sse.last_id;
    subscribe(
        &rig,
        hello["streamId"].as_str().unwrap(),
        &[VMON1, MON_3V3],
        100,
    )
    .await?;
    let sent = next_events(&mut sse, 4).await?;
    drop(sse);
    // The reader says it saw hello only: the four after it come again.
    let url = format!("{}?lastEventId={hello_id}", events_url(&rig));
    let mut resumed = Sse::open_with_headers(&rig.http, &url, &[]).await?;
    assert_eq!(resumed.next(WAIT).await?.context("hello")?.name, "hello");
    let again = next_events(&mut resumed, 4).await?;
    for (first, second) in sent.iter().zip(&again) {
        assert_eq!(
            (first.id, &first.name, &first.data),
            (second.id, &second.name, &second.data)
        );
    }
    let next = resumed.next_named("values", WAIT).await?;
    assert!(next.id > sent[3].id);
    Ok(())
}

#[tokio::test]
async fn a_reader_behind_the_replay_buffer_gets_a_gap_naming_the_ids_lost_and_a_snapshot()
-> Result<()> {
    let rig = rig(|c| c.events.replay_events = 4).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let hello_id = sse.last_id;
    let stream = hello["streamId"].as_str().unwrap().to_owned();
    let subscription = subscribe(&rig, &stream, &[VMON1, MON_3V3], 100).await?;
    for _ in 0..8 {
        sse.next_named("values", WAIT).await?;
    }
    drop(sse);
    let mut resumed = reconnect(&rig, hello_id).await?;
    let got = next_events(&mut resumed, 3).await?;
    assert_eq!(got[0].name, "hello");
    assert_eq!(got[0].data["resumed"], true);
    assert_eq!(got[0].data["streamId"], stream.as_str());
    let gap = &got[1];
    assert_eq!(gap.name, "gap", "{got:?}");
    assert_eq!(gap.data["reason"], "buffer", "{}", gap.data);
    assert_eq!(gap.data["lastEventId"], hello_id.to_string());
    assert_eq!(gap.data["from"], (hello_id + 1).to_string());
    let to: u64 = gap.data["to"].as_str().context("to")?.parse()?;
    assert!(
        to >= hello_id + 8,
        "at least the 8 values events read: {}",
        gap.data
    );
    assert_eq!(gap.data["lost"], to - hello_id);
    assert_eq!(gap.data["subscriptions"], "kept");
    assert_eq!(gap.id, to + 1, "the gap's id follows the last one lost");
    let snapshot = &got[2];
    assert_eq!(snapshot.name, "snapshot");
    assert_eq!(snapshot.id, to + 2);
    let part = &snapshot.data["subscriptions"][0];
    assert_eq!(
        part["subscription"],
        subscription.as_str(),
        "{}",
        snapshot.data
    );
    for name in [VMON1, MON_3V3] {
        assert!(part["values"][name].is_string(), "{part}");
        assert_eq!(part["quality"][name], "good", "{part}");
        let age = part["ageMs"][name].as_f64().context("age")?;
        assert!((0.0..2_000.0).contains(&age), "{part}");
    }
    assert_eq!(snapshot.data["lease"]["held"], false, "{}", snapshot.data);
    assert_eq!(snapshot.data["connection"]["isConnected"], true);
    // Then the live stream, the same subscription.
    let next = resumed.next(WAIT).await?.context("values")?;
    assert_eq!(next.name, "values");
    assert_eq!(next.id, to + 3);
    assert_eq!(next.data["subscription"], subscription.as_str());
    Ok(())
}

/// A reader away longer than `events.resume_grace_ms`: its stream and subscriptions end, and
/// its id then gets a new stream after a gap saying so.
#[tokio::test]
async fn a_stream_is_kept_for_the_grace_then_ended_and_its_id_gets_a_gap() -> Result<()> {
    let rig = rig(|c| c.events.resume_grace_ms = 300).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let subscription = subscribe(&rig, hello["streamId"].as_str().unwrap(), &[VMON1], 100).await?;
    sse.next_named("values", WAIT).await?;
    let last = sse.last_id;
    drop(sse);
    let gone = Instant::now();
    assert_eq!(
        renew(&rig, &subscription, &[VMON1]).await,
        200,
        "kept for the grace"
    );
    within(
        Duration::from_secs(5),
        "the grace to end the subscription",
        async {
            while renew(&rig, &subscription, &[VMON1]).await != 404 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(
        gone.elapsed() >= Duration::from_millis(300),
        "{:?}",
        gone.elapsed()
    );
    assert_eq!(rig.gateway.gateway.events.stream_count(), 0);
    let mut late = reconnect(&rig, last).await?;
    let got = next_events(&mut late, 3).await?;
    let names: Vec<&str> = got.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(names, ["hello", "gap", "snapshot"]);
    assert_eq!(got[0].data["resumed"], false);
    assert_ne!(got[0].data["streamId"], hello["streamId"]);
    assert_eq!(got[1].data["reason"], "ended", "{}", got[1].data);
    assert_eq!(got[1].data["subscriptions"], "ended");
    assert_eq!(got[2].data["subscriptions"], json!([]));
    Ok(())
}

/// After a gateway restart, an id of the gateway before: never silence, but a gap saying the
/// gateway restarted and a snapshot of the lease and the link.
#[tokio::test]
async fn after_a_gateway_restart_an_old_id_gets_a_gap_and_a_snapshot() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    subscribe(&rig, hello["streamId"].as_str().unwrap(), &[VMON1], 100).await?;
    sse.next_named("values", WAIT).await?;
    let last = sse.last_id;
    let Rig { sim, gateway, http } = rig;
    gateway.stop().await;
    let config = config_for(&sim, |_| {});
    let rig = rig_on(sim, config, false).await;
    drop(http);
    let mut after = reconnect(&rig, last).await?;
    let got = next_events(&mut after, 3).await?;
    let names: Vec<&str> = got.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(names, ["hello", "gap", "snapshot"]);
    assert_eq!(got[0].id % SEQUENCE_SPAN, 1, "a new stream");
    let gap = &got[1].data;
    assert_eq!(gap["reason"], "restart", "{gap}");
    assert_eq!(gap["lastEventId"], last.to_string());
    assert!(gap["to"].is_null() && gap["lost"].is_null(), "{gap}");
    assert_eq!(gap["subscriptions"], "ended");
    let snapshot = &got[2].data;
    assert_eq!(snapshot["lease"]["held"], false, "{snapshot}");
    assert_eq!(snapshot["connection"]["isConnected"], true, "{snapshot}");
    Ok(())
}

#[tokio::test]
async fn a_last_event_id_that_is_no_event_id_is_refused_with_400_naming_it() -> Result<()> {
    let rig = rig(|_| {}).await;
    for (header, query) in [(Some("not-an-id"), None), (None, Some("12x"))] {
        let mut request = rig.http.get(match query {
            Some(id) => format!("{}?lastEventId={id}", events_url(&rig)),
            None => events_url(&rig),
        });
        if let Some(id) = header {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await?;
        assert_eq!(response.status(), 400);
        let body: Json = response.json().await?;
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains("Last-Event-ID"), "{body}");
    }
    // An empty one is a reconnection without an id: a new stream.
    let sse = Sse::open_with_headers(&rig.http, &events_url(&rig), &[("Last-Event-ID", "")]).await;
    assert!(sse.is_ok());
    Ok(())
}

/// A reader stuck (a tiny receive window, not reading) whose queue then fills with events that
/// are never dropped (lease changes) is closed: when it reads again, its last event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_cannot_keep_up_is_closed_with_a_last_event_saying_why() -> Result<()> {
    let rig = rig(|c| {
        c.events.stream_queue = 2;
        c.events.max_channels_per_subscription = 1000;
    })
    .await;
    let (_, names) = rig.get("resources/names").await;
    let all: Vec<&str> = names
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .collect();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut stuck = socket.connect(rig.gateway.http_addr).await?;
    stuck
        .write_all(
            b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n",
        )
        .await?;
    let mut received = Vec::new();
    let mut chunk = vec![0u8; 65536];
    let stream_id = loop {
        let n = within(WAIT, "the hello", stuck.read(&mut chunk)).await?;
        received.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&received);
        if let Some(at) = text.find("\"streamId\":\"")
            && let Some(id) = text[at + 12..]
                .split('"')
                .next()
                .filter(|id| id.len() == 32)
        {
            break id.to_owned();
        }
    };
    for _ in 0..5 {
        subscribe(&rig, &stream_id, &all, 100).await?;
    }
    let events = &rig.gateway.gateway.events;
    // The kernel's buffers are full and values wait merged in the stream's queue.
    within(
        Duration::from_secs(20),
        "values merged for the stuck reader",
        async {
            while events
                .stream_queue(&stream_id)
                .is_none_or(|(_, merged)| merged == 0)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    // Lease changes are never dropped: three of them are one more than the queue holds.
    for _ in 0..2 {
        let (status, lease) = rig
            .post("lease", json!({ "Owner": "TAT 3", "TtlMs": 30000 }))
            .await;
        assert_eq!(status, 200, "{lease}");
        let id = lease["leaseId"].as_str().unwrap();
        rig.send(reqwest::Method::DELETE, &format!("lease/{id}"), None)
            .await;
    }
    within(WAIT, "the stream closed", async {
        while events.stream_queue(&stream_id).is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        events.subscription_count(),
        0,
        "its subscriptions ended with it"
    );
    // The reader reads again: what the kernel held, then the last event, then the body's end.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = String::from_utf8_lossy(&received);
        if let Some(at) = text.find("event: closed") {
            let rest = &text[at..];
            assert!(rest.contains("\"reason\":\"behind\""), "{rest}");
            assert!(rest.contains("events.stream_queue"), "{rest}");
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no closed event");
        let n = tokio::time::timeout(WAIT, stuck.read(&mut chunk)).await??;
        anyhow::ensure!(n > 0, "the connection ended without a closed event");
        received.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}
