//! The station link against the simulator: timeouts, drops, reconnects, single flight,
//! read merging, unknown write outcomes, corrupt replies and the serial path.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use station_gateway::Config;
use station_simulator::{Profile, Simulator};

#[tokio::test]
async fn a_stalled_station_gets_504_within_the_timeout_and_the_link_recovers() {
    let rig = rig(|c| c.station.request_timeout_ms = 300).await;
    let generation = rig.gateway.link().info().generation;
    rig.sim.set_stall(true);
    let started = Instant::now();
    let (status, body) = rig.read(MON_3V3).await;
    let waited = started.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("did not answer within 300 ms"),
        "{body}"
    );
    assert!(waited < Duration::from_millis(1000), "took {waited:?}");
    // The PING sent after the timeout goes unanswered too, so the link gives up on this
    // connection; once the station answers again it reconnects with the next generation.
    rig.disconnected().await;
    rig.sim.set_stall(false);
    rig.reconnected_after(generation).await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_dropped_station_gets_503_at_once_then_the_link_reconnects_with_a_new_generation() {
    // A long request timeout: "at once" means without waiting for it, however loaded the machine.
    let rig = rig(|c| c.station.request_timeout_ms = 20_000).await;
    let generation = rig.gateway.link().info().generation;
    rig.sim.power_off().await.unwrap();
    rig.disconnected().await;
    let started = Instant::now();
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("station disconnected: "),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?}: for the request timeout?",
        started.elapsed()
    );
    let (status, body) = rig.get("connection/status").await;
    assert_eq!(status, 200);
    assert_eq!(body["isConnected"], json!(false));
    assert!(body["lastError"].is_string());
    // The HTTP side keeps answering what it knows while the link is down.
    let (status, _) = rig.get("resources/names").await;
    assert_eq!(status, 200);

    rig.sim.power_on().await.unwrap();
    rig.reconnected_after(generation).await;
    assert_eq!(rig.gateway.link().info().generation, generation + 1);
    let (status, _) = rig.read(MON_3V3).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_hundred_concurrent_forced_reads_of_one_channel_cost_at_most_two_hardware_reads() {
    let rig = rig(|_| {}).await;
    rig.sim.set_processing_time(Duration::from_millis(20));
    let before = rig.sim.reads_of(MON_3V3);
    let reads = (0..100).map(|_| rig.read(MON_3V3));
    let answers = futures::future::join_all(reads).await;
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        let volts: f64 = body["value"].as_str().unwrap().parse().unwrap();
        assert!((volts - 3.3).abs() < 0.1, "{volts}");
    }
    let hardware_reads = rig.sim.reads_of(MON_3V3) - before;
    assert!(
        (1..=2).contains(&hardware_reads),
        "the station saw {hardware_reads} reads"
    );
}

#[tokio::test]
async fn concurrent_reads_of_fifty_channels_are_merged_into_few_read_frames() {
    let rig = rig(|_| {}).await;
    rig.sim.set_processing_time(Duration::from_millis(20));
    let names: Vec<String> = rig
        .gateway
        .link()
        .info()
        .channels
        .channels
        .iter()
        .filter(|ch| ch.readable && !ch.consuming)
        .take(50)
        .map(|ch| ch.name.clone())
        .collect();
    // The default station has 49 readable channels whose read consumes nothing.
    assert!(names.len() >= 45, "only {} channels", names.len());
    let frames_before = rig.sim.read_frames();
    let reads = names.iter().map(|name| rig.read(name));
    let answers = futures::future::join_all(reads).await;
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
    }
    let frames = rig.sim.read_frames() - frames_before;
    // The window is 8: the first few go out alone, everything that queued behind them shares frames.
    assert!(
        frames <= 20,
        "50 concurrent reads took {frames} READ frames"
    );
    let batches = rig.sim.read_batch_sizes();
    assert!(
        batches.iter().any(|&n| n > 1),
        "no READ carried more than one name: {batches:?}"
    );
}

#[tokio::test]
async fn a_write_whose_link_dies_after_sending_is_502_never_success() {
    let rig = rig(|c| c.station.request_timeout_ms = 5000).await;
    rig.sim.set_stall(true);
    let write = tokio::spawn({
        let http = rig.http.clone();
        let url = rig.url("resources/value/set");
        async move {
            let response = http
                .post(url)
                .json(&json!({ "Name": VSET1, "Value": "10" }))
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<serde_json::Value>().await.unwrap(),
            )
        }
    });
    // Wait until the WRITE is on the wire, then cut the link: once sent, its outcome is unknown
    // whether or not the station took it off the socket.
    let stats = rig.gateway.link().stats().clone();
    until(Duration::from_secs(5), "the WRITE on the wire", || {
        station_gateway::link::LinkStats::get(&stats.frames_sent) > 0
    })
    .await;
    rig.sim.drop_connections();
    let (status, body) = write.await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("may or may not have been applied"),
        "{body}"
    );
    rig.sim.set_stall(false);
}

#[tokio::test]
async fn a_corrupted_reply_is_dropped_never_served_as_a_value() {
    let rig = rig(|c| c.station.request_timeout_ms = 300).await;
    rig.sim.corrupt_next_reply();
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 504, "{body}");
    let stats = rig.gateway.link().stats().clone();
    let deadline = Instant::now() + Duration::from_secs(2);
    while station_gateway::link::LinkStats::get(&stats.crc_errors) == 0 {
        assert!(
            Instant::now() < deadline,
            "the corrupt frame was not counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The next read is answered properly (after the link resynchronised if it had to).
    rig.connected().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = rig.read(MON_3V3).await;
        if status == 200 {
            let volts: f64 = body["value"].as_str().unwrap().parse().unwrap();
            assert!((volts - 3.3).abs() < 0.1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never recovered: {status} {body}"
        );
    }
}

#[tokio::test]
async fn writes_reach_the_station_and_invalidate_the_cache() {
    let rig = rig(|_| {}).await;
    let (status, body) = rig
        .post(
            "resources/values/get",
            json!({ "Names": [VSET1], "MaxAgeMs": 60000 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rig.write(VSET1, "123.5").await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = rig
        .post(
            "resources/values/get",
            json!({ "Names": [VSET1], "MaxAgeMs": 60000 }),
        )
        .await;
    assert_eq!(
        body["resources"][VSET1],
        json!("123.5"),
        "a stale cached value survived the write"
    );
    let log = rig.sim.write_log();
    assert!(
        log.iter()
            .any(|w| w.channel == VSET1 && w.value == station_protocol::Value::Float(123.5))
    );
}

#[tokio::test]
async fn the_serial_link_works_over_a_pseudo_terminal() {
    let (sim, path) = Simulator::start_pty(Profile::default_station(), None)
        .await
        .unwrap();
    let mut config = Config::default();
    config.station.url = format!("serial://{}?baud=115200", path.display());
    config.http.listen = "127.0.0.1:0".into();
    let gateway = start_gateway(config).await;
    assert_eq!(gateway.link().info().hello.as_ref().unwrap().window, 1);
    let http = reqwest::Client::new();
    let answer: serde_json::Value = http
        .post(format!("{}/api/resources/value/get", gateway.base_url()))
        .json(&json!({ "Name": MON_3V3 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let volts: f64 = answer["value"].as_str().unwrap().parse().unwrap();
    assert!((volts - 3.3).abs() < 0.1, "{answer}");
    let status = http
        .post(format!("{}/api/resources/value/set", gateway.base_url()))
        .json(&json!({ "Name": VSET1, "Value": "42" }))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    assert!(
        sim.write_log()
            .iter()
            .any(|w| w.channel == VSET1 && w.peer == "pty")
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_of_forced_reads_spread_over_milliseconds_all_finish_and_cost_about_two_reads_each()
{
    // Readers that arrive while their channel is on the wire are held for the next READ;
    // every hold must end in a READ, however the arrivals and the answers interleave.
    // Timer-driven arrivals come in 1 ms clusters: a quiet time above that gathers them.
    let rig = rig(|c| {
        c.station.request_timeout_ms = 2000;
        c.station.coalesce_quiet_us = 1500;
    })
    .await;
    let link = rig.gateway.link().clone();
    let before = rig.sim.reads_of(MON_3V3);
    let rounds = 150;
    for round in 0..rounds {
        let mut readers = tokio::task::JoinSet::new();
        for i in 0..100u64 {
            let link = link.clone();
            readers.spawn(async move {
                // Spread the arrivals over about 3 ms, as HTTP clients' requests arrive.
                tokio::time::sleep(Duration::from_micros((i * 37 + round * 11) % 3000)).await;
                link.read(vec![MON_3V3.to_owned()]).await
            });
        }
        while let Some(answer) = readers.join_next().await {
            let results = answer
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(results[0].is_ok(), "round {round}: {:?}", results[0]);
        }
    }
    let per_round = (rig.sim.reads_of(MON_3V3) - before) as f64 / rounds as f64;
    assert!(
        per_round <= 3.0,
        "{per_round} hardware reads per burst of 100"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_from_other_clients_just_after_an_answer_are_gathered_but_a_loop_is_not_held() {
    // A long quiet time makes a hold plain to see.
    let rig = rig(|c| {
        c.station.coalesce_quiet_us = 200_000;
        c.station.coalesce_max_us = 1_000_000;
    })
    .await;
    let link = rig.gateway.link().clone();
    let client = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));

    // One client reading in a loop comes back just after each of its own answers: never held.
    let started = Instant::now();
    for _ in 0..10 {
        let results = link
            .read_for(client(1000), vec![MON_3V3.to_owned()])
            .await
            .unwrap();
        assert!(results[0].is_ok(), "{:?}", results[0]);
    }
    let looped = started.elapsed();
    assert!(
        looped < Duration::from_millis(1000),
        "10 reads in a loop took {looped:?}: they were held as if they were a burst"
    );

    // Ten other clients, 20 ms apart, the first just after client 1000's answer: a burst,
    // gathered into one READ (read one by one, they would cost ten).
    let before = rig.sim.reads_of(MON_3V3);
    link.read_for(client(1000), vec![MON_3V3.to_owned()])
        .await
        .unwrap();
    let mut readers = tokio::task::JoinSet::new();
    for i in 0..10u16 {
        let link = link.clone();
        readers.spawn(async move {
            tokio::time::sleep(Duration::from_millis(20 * u64::from(i))).await;
            link.read_for(client(2000 + i), vec![MON_3V3.to_owned()])
                .await
        });
    }
    while let Some(answer) = readers.join_next().await {
        let results = answer.unwrap().unwrap();
        assert!(results[0].is_ok(), "{:?}", results[0]);
    }
    assert_eq!(
        rig.sim.reads_of(MON_3V3) - before,
        2,
        "client 1000's READ and one for the ten others"
    );
}

/// Before the station has ever answered, a read of a name is refused with 503 saying the
/// station is not reached, never 404 "no such resource": the gateway does not know the names
/// yet, and a client should try again rather than give up on a channel.
#[tokio::test]
async fn reads_before_the_station_ever_answered_get_503_not_reached_not_404() {
    // A port with nothing listening: the link keeps trying to connect.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let mut config = Config::default();
    config.station.url = format!("tcp://{closed}");
    let listeners = station_gateway::Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        legacy: None,
    };
    let gateway = station_gateway::start(listeners, config).await.unwrap();
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}/api/resources/{path}", gateway.base_url());
    for (path, body) in [
        (
            "values/get",
            json!({ "Names": [MON_3V3], "MaxAgeMs": 600_000 }),
        ),
        ("values/get", json!({ "Names": [MON_3V3] })),
        ("value/get", json!({ "Name": MON_3V3 })),
    ] {
        let response = http.post(url(path)).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(status, 503, "{path} {body}: {answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .starts_with("station disconnected: "),
            "{path} {body}: {answer}"
        );
    }
}
