//! The fault matrix: each simulator fault at the moment it hurts most (mid-read, mid-write,
//! under load, across a restart, while subscriptions run, on the serial line), checking that
//! the gateway answers promptly and truthfully and that the write log agrees with what it said.
//! tests/gateway/link.rs has the single-fault basics; these extend them.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::Config;
use station_gateway::link::LinkStats;
use station_protocol::Value;
use station_simulator::{Profile, Simulator};

const ADC08: &str = "0.8.ESH10000590.ADC08";

/// Waits (polling the link's counters, not sleeping blindly) until `n` more frames were sent.
async fn frames_sent_beyond(rig: &Rig, before: u64, n: u64) {
    let stats = rig.gateway.link().stats().clone();
    until(Duration::from_secs(5), "the request to go out", || {
        LinkStats::get(&stats.frames_sent) >= before + n
    })
    .await;
}

fn frames_sent(rig: &Rig) -> u64 {
    LinkStats::get(&rig.gateway.link().stats().frames_sent)
}

fn spawn_post(rig: &Rig, path: &str, body: Json) -> tokio::task::JoinHandle<(u16, Json)> {
    let http = rig.http.clone();
    let url = rig.url(path);
    tokio::spawn(async move {
        let response = http.post(url).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Json::Null))
    })
}

fn error_text(body: &Json) -> &str {
    body["error"].as_str().unwrap_or("")
}

fn written(rig: &Rig, channel: &str, value: f64) -> bool {
    rig.sim
        .write_log()
        .iter()
        .any(|w| w.channel == channel && w.value == Value::Float(value))
}

#[tokio::test]
async fn a_drop_in_the_middle_of_a_read_fails_fast_and_never_serves_a_value() {
    let rig = rig(|c| c.station.request_timeout_ms = 3000).await;
    let generation = rig.gateway.link().info().generation;
    // The station has the READ and is about to answer when the link drops.
    rig.sim.set_reply_delay(Duration::from_millis(400));
    let before = frames_sent(&rig);
    let started = Instant::now();
    let read = spawn_post(&rig, "resources/value/get", json!({ "Name": MON_3V3 }));
    frames_sent_beyond(&rig, before, 1).await;
    rig.sim.drop_connections();
    let (status, body) = read.await.unwrap();
    assert!(
        status == 503 || status == 502,
        "a read cut off by a drop: {status} {body}"
    );
    assert!(!error_text(&body).is_empty(), "{body}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "not answered at once: {:?}",
        started.elapsed()
    );
    rig.sim.set_reply_delay(Duration::ZERO);
    rig.reconnected_after(generation).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
}

/// A write cut off after it was sent is 502 "may or may not", never 200, whether the station
/// applied it (reply delayed) or not (stalled); the write log says which happened.
#[tokio::test]
async fn a_drop_in_the_middle_of_a_write_is_502_whether_or_not_the_station_applied_it() {
    let rig = rig(|c| c.station.request_timeout_ms = 5000).await;
    for (case, applied) in [("reply delayed", true), ("stalled", false)] {
        let generation = rig.gateway.link().info().generation;
        let value = if applied { 111.0 } else { 222.0 };
        if applied {
            rig.sim.set_reply_delay(Duration::from_millis(500));
        } else {
            rig.sim.set_stall(true);
        }
        let before = frames_sent(&rig);
        let write = spawn_post(
            &rig,
            "resources/value/set",
            json!({ "Name": VSET1, "Value": value.to_string() }),
        );
        frames_sent_beyond(&rig, before, 1).await;
        // When the station will apply it, let it (the write log says when); a stalled station
        // never will, so the frame being on the wire is all there is to wait for.
        if applied {
            until(Duration::from_secs(2), "the write applied", || {
                written(&rig, VSET1, value)
            })
            .await;
        }
        rig.sim.drop_connections();
        let (status, body) = write.await.unwrap();
        assert_eq!(status, 502, "{case}: {body}");
        assert!(
            error_text(&body).contains("may or may not have been applied"),
            "{case}: {body}"
        );
        assert_eq!(written(&rig, VSET1, value), applied, "{case}: write log");
        rig.sim.set_reply_delay(Duration::ZERO);
        rig.sim.set_stall(false);
        rig.reconnected_after(generation).await;
    }
}

/// Everything on the wire when the station stalls: each read of a channel of its own and the
/// write are answered 504 by the timeout, the write with "may or may not have been applied".
#[tokio::test]
async fn a_stall_answers_every_request_on_the_wire_504_and_then_resyncs() {
    let timeout_ms = 1000;
    let rig = rig(|c| c.station.request_timeout_ms = timeout_ms).await;
    let generation = rig.gateway.link().info().generation;
    rig.sim.set_stall(true);
    let before = frames_sent(&rig);
    let started = Instant::now();
    let reads: Vec<_> = [MON_3V3, VMON1, ADC08]
        .iter()
        .map(|name| spawn_post(&rig, "resources/value/get", json!({ "Name": name })))
        .collect();
    let write = spawn_post(
        &rig,
        "resources/value/set",
        json!({ "Name": VSET1, "Value": "333" }),
    );
    // At least the write and one READ went out (the reads may share one frame).
    frames_sent_beyond(&rig, before, 2).await;
    for read in reads {
        let (status, body) = read.await.unwrap();
        assert_eq!(status, 504, "{body}");
        assert!(
            error_text(&body).contains(&format!("did not answer within {timeout_ms} ms")),
            "{body}"
        );
    }
    let (status, body) = write.await.unwrap();
    assert_eq!(status, 504, "{body}");
    assert!(
        error_text(&body).contains("may or may not have been applied"),
        "{body}"
    );
    // A hang guard, not a speed test: answered by the timeout, not by anything later.
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(timeout_ms * 5),
        "answers took {waited:?}"
    );
    assert!(!written(&rig, VSET1, 333.0), "a stalled station applied");
    // The callers' own timeouts can answer them a moment before the link task sends its PING:
    // un-stalled that early, the station would answer the PING and the link would rightly
    // stay up. Wait for the link to give up on the stalled connection first.
    rig.disconnected().await;
    rig.sim.set_stall(false);
    rig.reconnected_after(generation).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
}

/// A read queued behind one of the same channel that is on the wire when the station stalls
/// goes out after the first timed out, racing the PING that decides the link is dead: it is
/// answered 504 (its own timeout) or 503 (the link gave up first), which one is not
/// determined, but never a value and never later than both timeouts.
#[tokio::test]
async fn a_read_queued_behind_a_stalled_one_gets_504_or_503_with_the_reason() {
    let timeout_ms = 400;
    let rig = rig(|c| c.station.request_timeout_ms = timeout_ms).await;
    let generation = rig.gateway.link().info().generation;
    rig.sim.set_stall(true);
    let before = frames_sent(&rig);
    let first = spawn_post(&rig, "resources/value/get", json!({ "Name": MON_3V3 }));
    frames_sent_beyond(&rig, before, 1).await;
    let queued = spawn_post(&rig, "resources/value/get", json!({ "Name": MON_3V3 }));
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 504, "{body}");
    let (status, body) = queued.await.unwrap();
    match status {
        504 => assert!(
            error_text(&body).contains(&format!("did not answer within {timeout_ms} ms")),
            "{body}"
        ),
        503 => assert!(error_text(&body).contains("stopped answering"), "{body}"),
        other => panic!("a read queued behind a stalled one: {other} {body}"),
    }
    rig.disconnected().await;
    rig.sim.set_stall(false);
    rig.reconnected_after(generation).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
}

/// A corrupted reply byte: the frame is dropped; a read fails cleanly or is retried, and no
/// 200 ever carries a wrong value; a write whose reply was lost is never reported as done.
#[tokio::test]
async fn corrupted_replies_never_become_wrong_values_or_false_successes() {
    let rig = rig(|c| c.station.request_timeout_ms = 300).await;
    let crc_errors = || LinkStats::get(&rig.gateway.link().stats().crc_errors);
    let mut failed = 0;
    for round in 0..8 {
        let before = crc_errors();
        rig.sim.corrupt_next_reply();
        let (status, body) = rig.read(MON_3V3).await;
        if status == 200 {
            let volts: f64 = body["value"].as_str().unwrap().parse().unwrap();
            assert!(
                (volts - 3.3).abs() < 0.1,
                "round {round}: wrong value {volts}"
            );
        } else {
            assert!([502, 503, 504].contains(&status), "{status} {body}");
            failed += 1;
        }
        // Wait for the corrupted frame to be seen (it may have been a reply to a PING).
        let deadline = Instant::now() + Duration::from_secs(3);
        while crc_errors() == before {
            // Something has to be answered for the corruption to fire.
            let _ = rig.read(MON_3V3).await;
            assert!(Instant::now() < deadline, "no corrupt frame was counted");
        }
        rig.connected().await;
    }
    assert!(failed > 0, "no read ever hit the corrupted reply");
    // A write whose reply is corrupted: applied on the station, but the gateway cannot know.
    // Only the write's reply: the PING the last round's timeout sent may still be answered
    // now, and corrupting its reply instead let the write through whole (CI saw a 200).
    rig.sim.corrupt_next_write_reply();
    let (status, body) = rig.write(VSET1, "444").await;
    assert_ne!(
        status, 200,
        "a write without a readable reply reported done: {body}"
    );
    assert!(
        error_text(&body).contains("may or may not have been applied"),
        "{status} {body}"
    );
    assert!(written(&rig, VSET1, 444.0), "the station did apply it");
}

/// Station restart: reconnect with generation + 1, a `configuration` event because the
/// channel list came back different, and the old generation's cached value never served as
/// fresh, even with a MaxAgeMs far longer than its age.
#[tokio::test]
async fn a_station_restart_bumps_the_generation_and_never_serves_old_values_as_fresh() {
    let rig = rig(|_| {}).await;
    let (mut events, hello) = Sse::open_hello(&rig).await.unwrap();
    let generation = hello["generation"].as_u64().unwrap();
    let (status, body) = rig.write(VSET1, "77").await;
    assert_eq!(status, 200, "{body}");
    let cached_read = json!({ "Names": [VSET1], "MaxAgeMs": 600000 });
    let (_, body) = rig.post("resources/values/get", cached_read.clone()).await;
    assert_eq!(body["resources"][VSET1], "77", "{body}");
    // The list now differs from the profile's, which the restart brings back.
    assert!(rig.sim.remove_channel(ADC08));
    let removed = events
        .next_named("configuration", Duration::from_secs(3))
        .await
        .unwrap()
        .data;
    assert_eq!(removed["changeType"], "Removed", "{removed}");

    rig.sim.restart();
    rig.reconnected_after(generation).await;
    assert_eq!(rig.gateway.link().info().generation, generation + 1);
    let changed = events
        .next_named("configuration", Duration::from_secs(3))
        .await
        .unwrap()
        .data;
    assert_eq!(changed["changeType"], "Changed", "{changed}");
    assert_eq!(changed["generation"], json!(generation + 1), "{changed}");
    let (status, body) = rig.post("resources/values/get", cached_read).await;
    assert_eq!(status, 200, "{body}");
    let value: f64 = body["resources"][VSET1].as_str().unwrap().parse().unwrap();
    assert_ne!(
        value, 77.0,
        "a value from before the restart was served: {body}"
    );
    // Its age is that of the new hardware read (its round trip), not of the old value.
    assert!(body["ageMs"][VSET1].as_f64().unwrap() < 500.0, "{body}");
    // The channel that came back can be read again.
    let (status, body) = rig.read(ADC08).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn subscriptions_keep_running_while_the_channel_list_changes_under_them() {
    let rig = rig(|_| {}).await;
    let (mut events, hello) = Sse::open_hello(&rig).await.unwrap();
    let stream = hello["streamId"].as_str().unwrap().to_owned();
    let (status, body) = rig
        .post(
            "subscriptions",
            json!({ "StreamId": stream, "Channels": [MON_3V3, ADC08], "IntervalMs": 100 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let first = events
        .next_named("values", Duration::from_secs(2))
        .await
        .unwrap()
        .data;
    assert!(first["values"][ADC08].is_string(), "{first}");
    assert!(rig.sim.remove_channel(ADC08));
    events
        .next_named("configuration", Duration::from_secs(3))
        .await
        .unwrap();
    // Within a few intervals the removed channel is an error and the other keeps coming.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let values = events
            .next_named("values", Duration::from_secs(2))
            .await
            .unwrap()
            .data;
        assert!(values["values"][MON_3V3].is_string(), "{values}");
        if values["values"][ADC08].is_null() {
            // docs/events.md: the channel stays in the subscription, named in `errors`.
            assert_eq!(
                values["errors"][ADC08],
                json!(format!("no such channel: {ADC08}")),
                "{values}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed channel kept its values"
        );
    }
    // The channel comes back: the same subscription serves it again.
    rig.sim.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let values = events
            .next_named("values", Duration::from_secs(3))
            .await
            .unwrap()
            .data;
        if values["values"][ADC08].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the channel never came back: {values}"
        );
    }
}

/// A symlink that names "the serial device", so the test can swap the pty behind it.
fn point(link: &Path, target: &Path) {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).unwrap();
}

#[tokio::test]
async fn a_serial_device_that_disappears_and_comes_back_is_reconnected() {
    let (sim, first) = Simulator::start_pty(Profile::default_station(), None)
        .await
        .unwrap();
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "gateway-faults-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let device = dir.join("ttyStation");
    point(&device, &first);
    let mut config = Config::default();
    config.station.url = format!("serial://{}?baud=115200", device.display());
    config.station.reconnect_max_ms = 200;
    config.station.request_timeout_ms = 500;
    config.http.listen = "127.0.0.1:0".into();
    let rig = rig_on(sim.clone(), config, false).await;
    let generation = rig.gateway.link().info().generation;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");

    // The device goes away (USB adapter pulled): the link goes down, requests fail at once.
    assert!(sim.detach_pty(&first));
    rig.disconnected().await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 503, "{body}");
    let (status, body) = rig.write(VSET1, "55").await;
    assert_eq!(status, 503, "{body}");

    // It comes back (as a new pty behind the same name): the link reconnects by itself.
    let second = sim.attach_pty(None).unwrap();
    point(&device, &second);
    rig.reconnected_after(generation).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rig.write(VSET1, "56").await;
    assert_eq!(status, 200, "{body}");
    let log = sim.write_log();
    assert!(!log.iter().any(|w| w.value == Value::Float(55.0)));
    assert!(
        log.iter()
            .any(|w| w.value == Value::Float(56.0) && w.peer == "pty")
    );
    rig.gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A READ answered after its caller got 504 finds no one: the reply is dropped, never handed
/// to another caller and never put in the cache (ARCHITECTURE.md, the life of a request, 4).
#[tokio::test]
async fn a_reply_after_its_504_is_dropped_never_served_or_cached() {
    // ADC08 takes the station 800 ms to read; everything else (the PING too) is quick, so the
    // link stays up and the late reply arrives on the same connection.
    let sim =
        station_with_slow_channels(|name| name == ADC08, Duration::from_millis(800), |_| {}).await;
    let config = config_for(&sim, |c| c.station.request_timeout_ms = 300);
    let rig = rig_on(sim, config, false).await;
    let generation = rig.gateway.link().info().generation;
    let (status, body) = rig.read(ADC08).await;
    assert_eq!(status, 504, "{body}");
    // The station answers anyway once its read is done (its counter says when) ...
    until(Duration::from_secs(5), "the station's late answer", || {
        rig.sim.reads_of(ADC08) == 1
    })
    .await;
    // ... and answers later requests after it on the same connection: once this one is
    // answered, the gateway has taken the late reply off the wire.
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    let volts: f64 = body["value"].as_str().unwrap().parse().unwrap();
    assert!(
        (volts - 3.3).abs() < 0.1,
        "another caller got the late reply: {body}"
    );
    assert_eq!(
        rig.gateway.link().info().generation,
        generation,
        "the link reconnected: the test proves nothing"
    );
    // Not cached: a read that takes a value of any age goes to the station again (and times
    // out again) instead of answering 200 from the late reply.
    let (status, body) = rig
        .post(
            "resources/values/get",
            json!({ "Names": [ADC08], "MaxAgeMs": 600_000 }),
        )
        .await;
    assert_ne!(status, 200, "the late reply was cached: {body}");
    assert_eq!(status, 504, "{body}");
    until(Duration::from_secs(5), "the second hardware read", || {
        rig.sim.reads_of(ADC08) == 2
    })
    .await;
}

/// README / ARCHITECTURE.md: reconnect "with back-off 100 ms doubling to 5 s". The defaults
/// are those; the rule itself, scaled down (50 ms doubling to 800 ms), against a station that
/// accepts and hangs up at once: each pause is at least its step (a loaded machine can only
/// make it longer), and past the maximum the pauses stop doubling.
#[tokio::test]
async fn reconnect_attempts_back_off_doubling_up_to_the_maximum() {
    let defaults = Config::default();
    assert_eq!(
        (
            defaults.station.reconnect_min_ms,
            defaults.station.reconnect_max_ms
        ),
        (100, 5000)
    );
    let station = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = Config::default();
    config.station.url = format!("tcp://{}", station.local_addr().unwrap());
    config.station.reconnect_min_ms = 50;
    config.station.reconnect_max_ms = 800;
    config.http.listen = "127.0.0.1:0".into();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = station_gateway::start(station_gateway::Listeners { http, legacy: None }, config)
        .await
        .unwrap();
    let mut attempts = Vec::new();
    within(
        Duration::from_secs(30),
        "eight connection attempts",
        async {
            while attempts.len() < 8 {
                let (stream, _) = station.accept().await.unwrap();
                attempts.push(Instant::now());
                drop(stream);
            }
        },
    )
    .await;
    let pauses: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    for (pause, step) in pauses.iter().zip([50, 100, 200, 400, 800, 800, 800]) {
        assert!(
            *pause >= Duration::from_millis(step),
            "a pause under its step of {step} ms: {pauses:?}"
        );
    }
    // Doubling on would make these 1.6 s and 3.2 s.
    for pause in &pauses[5..] {
        assert!(
            *pause < Duration::from_millis(1600),
            "the back-off kept doubling past its maximum: {pauses:?}"
        );
    }
    gateway.stop().await;
}
