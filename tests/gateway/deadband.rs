//! Subscriptions that send what changed, against the simulator: an absolute deadband at its
//! edges, a heartbeat, per-channel options, percent deadbands and their ranges, a change of
//! status passing a deadband, a PUT that changes the filter, and bad options refused.

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::*;
use serde_json::{Value as Json, json};

/// Subscribes with `extra` fields merged into the body; the answer's status and body.
async fn subscribe_with(rig: &Rig, stream: &str, channels: &[&str], extra: Json) -> (u16, Json) {
    let mut body = json!({ "StreamId": stream, "Channels": channels, "IntervalMs": 100 });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    rig.post("subscriptions", body).await
}

async fn subscribed(rig: &Rig, stream: &str, channels: &[&str], extra: Json) -> Result<String> {
    let (status, answer) = subscribe_with(rig, stream, channels, extra).await;
    assert_eq!(status, 200, "{answer}");
    Ok(answer["id"].as_str().context("no id")?.to_owned())
}

fn stream_id(hello: &Json) -> String {
    hello["streamId"].as_str().unwrap().to_owned()
}

async fn set(rig: &Rig, name: &str, value: &str) {
    let (status, answer) = rig
        .post(
            "resources/value/set",
            json!({ "Name": name, "Value": value }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
}

/// The next `values` event of subscription `id`, passing over the others' (collected in
/// `others` when given).
async fn next_of(sse: &mut Sse, id: &str, within: Duration) -> Result<Json> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = sse.next_named("values", left).await?;
        if event.data["subscription"] == id {
            return Ok(event.data);
        }
        if Instant::now() > deadline {
            bail!("no values event of {id} within {within:?}");
        }
    }
}

/// Reads the stream until subscription `clock` (unfiltered) shows `name` = `value`; returns
/// every event of subscription `watched` seen on the way.
async fn until_clock_shows(
    sse: &mut Sse,
    clock: &str,
    watched: &str,
    name: &str,
    value: &str,
) -> Result<Vec<Json>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let data = sse.next_named("values", left).await?.data;
        if data["subscription"] == watched {
            seen.push(data);
        } else if data["subscription"] == clock && data["values"][name] == value {
            return Ok(seen);
        }
    }
}

#[tokio::test]
async fn an_absolute_deadband_sends_a_set_point_only_when_it_moves_by_more_than_the_band()
-> Result<()> {
    let rig = rig(|_| {}).await;
    set(&rig, VSET1, "100").await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let filtered = subscribed(
        &rig,
        &stream,
        &[VSET1],
        json!({ "Deadband": { "Absolute": 10 } }),
    )
    .await?;
    let first = next_of(&mut sse, &filtered, Duration::from_secs(2)).await?;
    assert_eq!(first["values"][VSET1], "100", "{first}");
    // An unfiltered subscription on the same grid: it proves each value was read in a tick.
    let clock = subscribed(&rig, &stream, &[VSET1], json!({})).await?;

    for (value, why) in [("105", "just below the band"), ("110", "exactly the band")] {
        set(&rig, VSET1, value).await;
        let seen = until_clock_shows(&mut sse, &clock, &filtered, VSET1, value).await?;
        assert!(seen.is_empty(), "{value} ({why}) went out: {seen:?}");
    }
    set(&rig, VSET1, "110.5").await;
    let mut seen = until_clock_shows(&mut sse, &clock, &filtered, VSET1, "110.5").await?;
    if seen.is_empty() {
        // The two subscriptions' events of one tick may come in either order.
        seen.push(next_of(&mut sse, &filtered, Duration::from_secs(1)).await?);
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["values"], json!({ VSET1: "110.5" }), "{seen:?}");
    assert!(seen[0]["ageMs"][VSET1].is_number(), "{seen:?}");

    // Below the band again, now counted from what was sent (110.5), not from the first value.
    set(&rig, VSET1, "119").await;
    let seen = until_clock_shows(&mut sse, &clock, &filtered, VSET1, "119").await?;
    assert!(seen.is_empty(), "{seen:?}");
    Ok(())
}

#[tokio::test]
async fn a_heartbeat_carries_an_unchanged_value_at_its_interval_and_no_more() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribed(
        &rig,
        &stream_id(&hello),
        &[VSET1],
        json!({ "Deadband": { "Absolute": 1000 }, "MaxIntervalMs": 400 }),
    )
    .await?;
    next_of(&mut sse, &id, Duration::from_secs(2)).await?;
    let mut arrivals = Vec::new();
    while arrivals.len() < 4 {
        let data = next_of(&mut sse, &id, Duration::from_secs(2)).await?;
        assert!(data["values"][VSET1].is_string(), "{data}");
        arrivals.push(Instant::now());
    }
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(300) && gap <= Duration::from_millis(900),
            "heartbeats {gap:?} apart; asked 400 ms at a 100 ms interval"
        );
    }
    Ok(())
}

#[tokio::test]
async fn channel_options_filter_one_channel_and_the_others_go_out_every_tick() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribed(
        &rig,
        &stream_id(&hello),
        &[VSET1, MON_3V3],
        json!({ "ChannelOptions": { VSET1: { "Deadband": { "Absolute": 1000 } } } }),
    )
    .await?;
    let first = next_of(&mut sse, &id, Duration::from_secs(2)).await?;
    assert!(first["values"][VSET1].is_string() && first["values"][MON_3V3].is_string());
    for _ in 0..3 {
        let data = next_of(&mut sse, &id, Duration::from_secs(1)).await?;
        let values = data["values"].as_object().unwrap();
        assert_eq!(values.len(), 1, "{data}");
        assert!(values.contains_key(MON_3V3), "{data}");
    }
    Ok(())
}

#[tokio::test]
async fn a_read_error_and_the_value_coming_back_pass_any_deadband() -> Result<()> {
    let rig = rig(|c| c.station.request_timeout_ms = 300).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribed(
        &rig,
        &stream_id(&hello),
        &[VMON1],
        json!({ "Deadband": { "Absolute": 1e9 } }),
    )
    .await?;
    next_of(&mut sse, &id, Duration::from_secs(2)).await?;
    rig.sim.set_stall(true);
    let error = next_of(&mut sse, &id, Duration::from_secs(3)).await?;
    assert!(error["errors"][VMON1].is_string(), "{error}");
    assert!(error["values"].get(VMON1).is_none(), "{error}");
    rig.sim.set_stall(false);
    // The same error again is no change; the value coming back is.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let data = next_of(&mut sse, &id, Duration::from_secs(10)).await?;
        if data["values"][VMON1].is_string() {
            break;
        }
        assert_ne!(
            data["errors"], error["errors"],
            "an unchanged error went out"
        );
        assert!(Instant::now() < deadline, "the value never came back");
    }
    Ok(())
}

#[tokio::test]
async fn a_put_that_changes_the_filter_starts_afresh() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let id = subscribed(
        &rig,
        &stream_id(&hello),
        &[VSET1],
        json!({ "Deadband": { "Absolute": 1000 } }),
    )
    .await?;
    next_of(&mut sse, &id, Duration::from_secs(2)).await?;
    assert!(
        next_of(&mut sse, &id, Duration::from_millis(500))
            .await
            .is_err(),
        "an unchanged set point went out through a deadband"
    );
    let (status, answer) = rig
        .send(
            reqwest::Method::PUT,
            &format!("subscriptions/{id}"),
            Some(json!({ "Channels": [VSET1], "IntervalMs": 100 })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let started = Instant::now();
    for _ in 0..4 {
        next_of(&mut sse, &id, Duration::from_secs(1)).await?;
    }
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "4 unfiltered events at 100 ms took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_percent_deadband_takes_the_configured_range_and_is_refused_without_one() -> Result<()> {
    let rig = rig(|c| {
        c.events
            .ranges
            .insert("0.4.ESH10000662.VMON*".into(), [0.0, 3000.0]);
    })
    .await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let percent = json!({ "Deadband": { "Percent": 1 } });
    let (status, answer) = subscribe_with(&rig, &stream, &[VMON1, MON_3V3], percent.clone()).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains(MON_3V3) && message.contains("[events] ranges"),
        "{answer}"
    );
    let id = subscribed(&rig, &stream, &[VMON1], percent).await?;
    next_of(&mut sse, &id, Duration::from_secs(2)).await?;
    Ok(())
}

#[tokio::test]
async fn bad_filter_options_are_400_naming_the_field() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (_sse, hello) = Sse::open_hello(&rig).await?;
    let stream = stream_id(&hello);
    let cases = [
        (json!({ "Deadband": { "Relative": 1 } }), "Deadband"),
        (json!({ "Deadband": 5 }), "Deadband"),
        (
            json!({ "Deadband": { "Absolute": 1, "Percent": 2 } }),
            "Deadband",
        ),
        (
            json!({ "Deadband": { "Absolute": "one" } }),
            "Deadband.Absolute",
        ),
        (
            json!({ "Deadband": { "Absolute": -1 } }),
            "Deadband.Absolute",
        ),
        (
            json!({ "Deadband": { "Percent": 101 } }),
            "Deadband.Percent",
        ),
        (json!({ "MaxIntervalMs": 50 }), "MaxIntervalMs"),
        (json!({ "MinIntervalMs": -5 }), "MinIntervalMs"),
        (
            json!({ "MinIntervalMs": 900, "MaxIntervalMs": 500 }),
            "MinIntervalMs (900)",
        ),
        (
            json!({ "ChannelOptions": { MON_3V3: { "Deadband": { "Absolute": 1 } } } }),
            "ChannelOptions names",
        ),
        (
            json!({ "ChannelOptions": { VSET1: { "MaxIntervalMs": 10 } } }),
            "ChannelOptions.0.4.ESH10000662.VSET1.MaxIntervalMs",
        ),
        (json!({ "ChannelOptions": [] }), "ChannelOptions"),
    ];
    for (extra, named) in cases {
        let (status, answer) = subscribe_with(&rig, &stream, &[VSET1], extra.clone()).await;
        assert_eq!(status, 400, "{extra} → {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(named),
            "{extra} → {message:?} names no {named}"
        );
    }
    assert_eq!(rig.gateway.gateway.events.subscription_count(), 0);
    Ok(())
}
