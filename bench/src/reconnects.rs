//! Scenario 5e, reconnects: a reader that goes away for 1 s, for 10 s, and one whose gateway
//! restarts, each reconnecting with the id of the last event it read: how many events it
//! missed (0, every one of them sent again), or the explicit `gap` and `snapshot` it got;
//! never silence.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value as Json, json};

use crate::event_reader::{RawEvents, opened, subscribe};
use crate::report::{Row, Verdict};
use crate::scenarios::{Bench, wait_until_serving};
use crate::slow_readers::channels;

/// How a reader that reconnected was served.
struct Reconnected {
    /// `hello` said the stream was resumed (same stream, subscriptions kept).
    resumed: bool,
    /// Ids skipped without a gap event: events missed silently.
    silently_missed: u64,
    /// The `gap` event, if one came: reason, lost.
    gap: Option<(String, Option<u64>)>,
    snapshot: bool,
    /// From the reconnection to its first values (subscribed again on a new stream).
    first_values_after: Duration,
}

/// Reads `reader`'s events for `read_for`; the id of the last event it read.
async fn read_for(events: &mut RawEvents, read_for: Duration) -> anyhow::Result<u64> {
    let until = Instant::now() + read_for;
    let mut last = 0;
    while Instant::now() < until {
        match tokio::time::timeout_at(until.into(), events.next()).await {
            Err(_) => break,
            Ok(next) => {
                let event = next?.context("the stream ended")?;
                if let Some(id) = event.id {
                    last = id;
                }
            }
        }
    }
    anyhow::ensure!(last != 0, "no event with an id in {read_for:?}");
    Ok(last)
}

/// Reconnects with `last` and reads until the first values: what it was told.
async fn reconnect(addr: SocketAddr, last: u64) -> anyhow::Result<(Reconnected, RawEvents)> {
    let started = Instant::now();
    let mut events = RawEvents::open(addr, None, 64 * 1024, Some(last)).await?;
    let mut seen = Reconnected {
        resumed: false,
        silently_missed: 0,
        gap: None,
        snapshot: false,
        first_values_after: Duration::ZERO,
    };
    let mut expected = last + 1;
    let mut new_stream = false;
    let mut stream_id = String::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .context("no event within 10 s of the reconnection")??
            .context("the stream ended")?;
        match event.name.as_str() {
            "hello" => {
                let data: Json = serde_json::from_str(&event.data)?;
                seen.resumed = data["resumed"] == json!(true);
                stream_id = data["streamId"].as_str().unwrap_or("").to_owned();
                if let Some(id) = event.id {
                    // A new stream: its ids start afresh.
                    new_stream = true;
                    expected = id + 1;
                }
                continue;
            }
            "gap" => {
                let data: Json = serde_json::from_str(&event.data)?;
                seen.gap = Some((
                    data["reason"].as_str().unwrap_or("").to_owned(),
                    data["lost"].as_u64(),
                ));
            }
            "snapshot" => {
                seen.snapshot = true;
                // A new stream (the old one ended, or the gateway restarted): subscribe again,
                // as a client told `subscriptions: "ended"` does.
                if new_stream {
                    subscribe(addr, &stream_id, &channels()).await?;
                }
            }
            _ => {}
        }
        if let Some(id) = event.id {
            if id > expected && seen.gap.is_none() {
                seen.silently_missed += id - expected;
            }
            expected = id + 1;
        }
        if event.name == "values" {
            seen.first_values_after = started.elapsed();
            break;
        }
    }
    Ok((seen, events))
}

fn describe(case: &str, seen: &Reconnected) -> String {
    match &seen.gap {
        None => format!(
            "{case}: resumed {}, {} events missed silently, first values {:.1} ms after reconnecting",
            if seen.resumed { "yes" } else { "NO" },
            seen.silently_missed,
            seen.first_values_after.as_secs_f64() * 1000.0
        ),
        Some((reason, lost)) => format!(
            "{case}: gap ({reason}{}) and {}, {} events missed silently, first values {:.1} ms after reconnecting",
            lost.map(|lost| format!(", {lost} events lost"))
                .unwrap_or_default(),
            if seen.snapshot {
                "a snapshot"
            } else {
                "NO snapshot"
            },
            seen.silently_missed,
            seen.first_values_after.as_secs_f64() * 1000.0
        ),
    }
}

/// Row 5e.
pub async fn reconnects(bench: &Bench) -> Row {
    let scenario = "Reconnects: after 1 s, 10 s and a gateway restart, with Last-Event-ID";
    match reconnects_inner(bench).await {
        Ok(mut row) => {
            row.scenario = scenario.to_owned();
            row
        }
        Err(why) => Row::not_measurable("5e", scenario, format!("{why:#}")),
    }
}

async fn reconnects_inner(bench: &Bench) -> anyhow::Result<Row> {
    let gateway = bench.recipe.spawn().await?;
    wait_until_serving(&gateway, &bench.names[0], Duration::from_secs(20)).await?;
    let addr = gateway.http_addr;
    let channels = channels();
    let (mut events, _) = opened(addr, &channels, None, 64 * 1024).await?;
    let mut cases = Vec::new();
    let mut last = read_for(&mut events, Duration::from_secs(2)).await?;
    for away in [Duration::from_secs(1), Duration::from_secs(10)] {
        drop(events);
        tokio::time::sleep(away).await;
        let (seen, mut again) = reconnect(addr, last)
            .await
            .with_context(|| format!("reconnecting after {away:?} with {last}"))?;
        cases.push((format!("away {} s", away.as_secs()), seen));
        last = read_for(&mut again, Duration::from_secs(2)).await?;
        events = again;
    }
    drop(events);
    // The gateway restarts (a new process on the same station, at a port of its own).
    gateway.stop().await;
    let restarted = bench.recipe.spawn().await?;
    wait_until_serving(&restarted, &bench.names[0], Duration::from_secs(20)).await?;
    let (seen, after) = reconnect(restarted.http_addr, last)
        .await
        .with_context(|| format!("reconnecting after a restart with {last}"))?;
    cases.push(("gateway restarted".to_owned(), seen));
    drop(after);
    restarted.stop().await;
    let never_silent = cases.iter().all(|(case, seen)| {
        seen.silently_missed == 0
            && (seen.gap.is_some() && seen.snapshot || seen.gap.is_none() && seen.resumed)
            && (case != "gateway restarted"
                || seen.gap.as_ref().is_some_and(|(r, _)| r == "restart"))
    });
    let mut row = Row::new("5e", "");
    row.gateway = cases
        .iter()
        .map(|(case, seen)| describe(case, seen))
        .collect::<Vec<_>>()
        .join("; ");
    row.baseline = "a reader with one subscription of 10 channels at 100 ms, reading for 2 s before each time away".to_owned();
    row.ratio = "—".to_owned();
    row.target = "events missed = 0, or an explicit gap and a snapshot; never silence".to_owned();
    row.verdict = Verdict::from_bool(never_silent);
    Ok(row)
}
