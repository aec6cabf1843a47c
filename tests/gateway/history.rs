//! The value history over HTTP: samples recorded for channels read anyway and for the ones
//! `[history] channels` names, the gaps when the station drops, the query's parameters.

use crate::common;

use std::time::Duration;

use common::{MON_3V3, VMON1, rig, within};
use serde_json::Value as Json;

async fn history(rig: &common::Rig, query: &str) -> (u16, Json) {
    let response = rig
        .http
        .get(format!("{}/v1/history?{query}", rig.gateway.base_url()))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

/// Polls the history until `condition` holds of the answer (at most 10 s).
async fn history_until(
    rig: &common::Rig,
    query: &str,
    what: &str,
    condition: impl Fn(&Json) -> bool,
) -> Json {
    within(Duration::from_secs(10), what, async {
        loop {
            let (status, body) = history(rig, query).await;
            assert_eq!(status, 200, "{body}");
            if condition(&body) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// A time in an answer, as an instant: RFC 3339 text with its fraction trimmed ("…47.6Z" after
/// "…47.64Z") does not sort as text in time order.
fn instant(time: &Json) -> time::OffsetDateTime {
    let text = time
        .as_str()
        .unwrap_or_else(|| panic!("{time} is not a time"));
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"))
}

/// Reads `channel` once and waits until history has the sample; the query of its raw
/// samples over the last minute.
async fn read_and_recorded(rig: &common::Rig, channel: &str) -> String {
    let (status, body) = rig.read(channel).await;
    assert_eq!(status, 200, "{body}");
    let query = format!("channel={channel}&from=-1m&fn=raw");
    history_until(rig, &query, "the read's sample", |body| {
        !points(body).is_empty()
    })
    .await;
    query
}

fn points(body: &Json) -> &Vec<Json> {
    body["points"].as_array().unwrap()
}

#[tokio::test]
async fn a_configured_channel_is_read_by_itself_and_recorded_with_its_unit() {
    let rig = rig(|c| {
        c.history.channels = vec!["*.VMON1".into()];
        c.history.interval_ms = 20;
    })
    .await;
    let query = format!("channel={VMON1}&from=-1m&fn=raw");
    let body = history_until(&rig, &query, "five samples of VMON1", |body| {
        points(body).len() >= 5
    })
    .await;
    assert_eq!(body["channel"], VMON1);
    assert_eq!(body["unit"], "V");
    assert_eq!(body["fn"], "raw");
    assert!(body["gaps"].as_array().unwrap().is_empty(), "{body}");
    let times: Vec<time::OffsetDateTime> = points(&body).iter().map(|p| instant(&p["t"])).collect();
    assert!(
        times.windows(2).all(|pair| pair[0] <= pair[1]),
        "not in time order: {body}"
    );
    // Reduced: one bucket over the minute holds them all.
    let (status, one) = history(&rig, &format!("channel={VMON1}&from=-1m&points=1&fn=max")).await;
    assert_eq!(status, 200, "{one}");
    let point = &points(&one)[0];
    assert!(point["count"].as_u64().unwrap() >= 5, "{one}");
    assert_eq!(point["value"], point["max"]);
}

#[tokio::test]
async fn a_channel_someone_reads_is_recorded_and_the_station_dropping_is_a_gap() {
    let rig = rig(|_| {}).await;
    let query = read_and_recorded(&rig, MON_3V3).await;
    let generation = rig.gateway.link().info().generation;
    rig.sim.drop_connections();
    rig.reconnected_after(generation).await;
    // The status page's own reads are not running here: read once more, after the gap.
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    let body = history_until(&rig, &query, "the gap and the sample after it", |body| {
        points(body).len() >= 2 && !body["gaps"].as_array().unwrap().is_empty()
    })
    .await;
    let gap = &body["gaps"][0];
    assert_eq!(gap["why"], "station not reached", "{body}");
    let last = instant(&points(&body).last().unwrap()["t"]);
    assert!(instant(&gap["to"]) <= last, "{body}");
}

/// A READ the station refuses (the channel gone from it) is a sample of its own, a gap that
/// says "read error", never a value carried over.
#[tokio::test]
async fn a_read_the_station_refuses_is_recorded_as_a_read_error_gap() {
    let rig = rig(|_| {}).await;
    let query = read_and_recorded(&rig, MON_3V3).await;
    assert!(rig.sim.remove_channel(MON_3V3));
    let (status, body) = rig.read(MON_3V3).await;
    assert_ne!(status, 200, "a channel the station no longer has: {body}");
    let body = history_until(&rig, &query, "the read error", |body| {
        !body["gaps"].as_array().unwrap().is_empty()
    })
    .await;
    assert_eq!(body["gaps"][0]["why"], "read error", "{body}");
    assert_eq!(
        points(&body).len(),
        1,
        "no value after the refused read: {body}"
    );
}

#[tokio::test]
async fn bad_parameters_are_400_naming_them_and_an_unknown_channel_404() {
    let rig = rig(|_| {}).await;
    for (query, named) in [
        ("from=-1m", "channel"),
        ("channel=X&from=yesterday", "from"),
        ("channel=X&points=0", "points"),
        ("channel=X&fn=average", "fn"),
        ("channel=X&format=xml", "format"),
    ] {
        let (status, body) = history(&rig, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(named),
            "{query}: {body}"
        );
    }
    let (status, body) = history(&rig, "channel=NO_SUCH_CHANNEL").await;
    assert_eq!(status, 404, "{body}");
    // A known channel nobody read yet: an empty answer, not an error.
    let (status, body) = history(&rig, &format!("channel={VMON1}")).await;
    assert_eq!(status, 200, "{body}");
    assert!(points(&body).is_empty(), "{body}");
}

#[tokio::test]
async fn csv_has_a_header_and_a_line_a_point() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    let url = format!(
        "{}/v1/history?channel={MON_3V3}&from=-1m&fn=raw&format=csv",
        rig.gateway.base_url()
    );
    let response = rig.http.get(url).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let text = response.text().await.unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("t,value,min,max,count,gap"));
    assert!(lines.count() >= 1, "{text}");
}

#[tokio::test]
async fn metrics_count_the_samples_recorded_and_none_dropped() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    let (status, text) = rig.get_text("/metrics").await;
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("station_gateway_{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    };
    assert!(value("history_samples_recorded_total") >= 1.0);
    assert_eq!(value("history_samples_dropped_total"), 0.0);
    assert!(value("history_channels") >= 1.0);
    assert!(value("history_memory_bytes") > 0.0);
    // No archive configured: no lag to show.
    assert!(!text.contains("history_archive_lag_seconds"), "{text}");
}

#[tokio::test]
async fn a_subscribed_channel_is_recorded_at_the_subscriptions_pace() {
    let rig = rig(|c| c.history.interval_ms = 10).await;
    let (_sse, hello) = common::Sse::open_hello(&rig).await.unwrap();
    let body = serde_json::json!({
        "StreamId": hello["streamId"],
        "Channels": [VMON1],
        "IntervalMs": 100,
    });
    let (status, answer) = rig.post("subscriptions", body).await;
    assert_eq!(status, 200, "{answer}");
    let query = format!("channel={VMON1}&from=-1m&fn=raw");
    let body = history_until(
        &rig,
        &query,
        "five samples of the subscribed channel",
        |body| points(body).len() >= 5,
    )
    .await;
    assert!(body["gaps"].as_array().unwrap().is_empty(), "{body}");
}

#[tokio::test]
async fn buckets_of_a_minute_or_more_cover_whole_minutes_and_the_answer_says_so() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig.read(VMON1).await;
    assert_eq!(status, 200, "{body}");
    // 2 h in 10 buckets: 12 min each, from and to on whole minutes.
    let (status, body) = history(
        &rig,
        &format!("channel={VMON1}&from=2026-12-01T10:00:30.5Z&to=2026-12-01T12:00:10Z&points=10"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["from"], &body["to"]),
        (
            &Json::from("2026-12-01T10:00:00Z"),
            &Json::from("2026-12-01T12:01:00Z")
        )
    );
    // Under a minute a bucket, and raw: the range as asked.
    for query in [
        "from=2026-12-01T10:00:30.5Z&to=2026-12-01T10:05:00Z&points=10",
        "from=2026-12-01T10:00:30.5Z&to=2026-12-01T12:00:10Z&points=10&fn=raw",
    ] {
        let (status, body) = history(&rig, &format!("channel={VMON1}&{query}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["from"], "2026-12-01T10:00:30.5Z", "{query}");
    }
    // The value just read is in its whole minute's bucket.
    let (status, body) = history(&rig, &format!("channel={VMON1}&from=-1h&points=10")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(points(&body).len(), 1, "{body}");
    assert!(body["from"].as_str().unwrap().ends_with(":00Z"), "{body}");
}
