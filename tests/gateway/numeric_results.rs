//! Numeric results end to end: a long acquisition streams while forced reads of
//! another channel keep flowing on the same link, over TCP and over a paced serial line.

use crate::common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use serde_json::{Value as Json, json};
use station_gateway::Config;
use station_simulator::{Profile, Simulator};

const ADC_NR: &str = "0.8.ESH10000590.NumericResult";
const ADC01: &str = "0.8.ESH10000590.ADC01";
const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";

/// Runs `samples` of ADC01 while reading MON_3V3 from the hardware again and again; returns
/// the acquisition's answer and every read's latency during it.
async fn acquire_while_reading(rig: &Rig, samples: u32) -> (Json, Vec<Duration>) {
    let acquisition = rig.post(
        "numeric-results/acquire",
        json!({ "Channel": ADC_NR, "Target": ADC01, "Samples": samples }),
    );
    tokio::pin!(acquisition);
    let mut latencies = Vec::new();
    loop {
        let asked = Instant::now();
        tokio::select! {
            biased;
            (status, answer) = &mut acquisition => {
                assert_eq!(status, 200, "{answer}");
                return (answer, latencies);
            }
            (status, answer) = rig.read(MON_3V3) => {
                assert_eq!(status, 200, "a forced read during the acquisition: {answer}");
                latencies.push(asked.elapsed());
            }
        }
    }
}

fn samples_of(answer: &Json) -> Vec<f64> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(answer["samples"].as_str().expect("samples as base64"))
        .expect("valid base64");
    bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[tokio::test]
async fn a_100000_sample_acquisition_streams_while_forced_reads_of_another_channel_flow() {
    let rig = rig(|config: &mut Config| config.station.request_timeout_ms = 10_000).await;
    let started = Instant::now();
    let (answer, latencies) = acquire_while_reading(&rig, 100_000).await;
    let took = started.elapsed();
    let samples = samples_of(&answer);
    assert_eq!(samples.len(), 100_000);
    assert_eq!(answer["stats"]["count"], 100_000);
    assert_eq!(answer["sampleRate"], 50_000);
    let mean = answer["stats"]["mean"].as_f64().unwrap();
    assert!((mean - samples.iter().sum::<f64>() / 1e5).abs() < 1e-9);
    // 100 000 samples at 50 kHz are 2 s of station time: the acquisition cannot be faster.
    assert!(took >= Duration::from_millis(1_900), "{took:?}");
    // Without interleaving, the reads would wait the whole 2 s behind the acquisition.
    assert!(
        latencies.len() >= 10,
        "only {} reads got through",
        latencies.len()
    );
    let worst = latencies.iter().max().unwrap();
    assert!(
        *worst < Duration::from_millis(1_000),
        "a read waited {worst:?}"
    );
}

#[tokio::test]
async fn over_a_serial_line_reads_wait_about_one_data_frame_not_the_acquisition() {
    let (sim, path) = Simulator::start_pty(Profile::default_station(), Some(115_200))
        .await
        .unwrap();
    let mut config = Config::default();
    config.station.url = format!("serial://{}?baud=115200", path.display());
    config.http.listen = "127.0.0.1:0".into();
    config.station.request_timeout_ms = 10_000;
    let rig = rig_on(sim, config, false).await;
    // 4 000 samples: 32 KB, about 2.9 s on the line at 115 200 baud, in 128-sample frames of
    // about 91 ms each.
    let started = Instant::now();
    let (answer, latencies) = acquire_while_reading(&rig, 4_000).await;
    let took = started.elapsed();
    assert_eq!(samples_of(&answer).len(), 4_000);
    assert!(
        took >= Duration::from_millis(2_700),
        "faster than the line: {took:?}"
    );
    assert!(
        latencies.len() >= 5,
        "only {} reads got through",
        latencies.len()
    );
    let mut sorted = latencies.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(
        median < Duration::from_millis(400),
        "median read {median:?}: {sorted:?}"
    );
}

#[tokio::test]
async fn acquisitions_on_one_channel_take_turns_and_other_channels_overlap() {
    let rig = rig(|config: &mut Config| config.station.request_timeout_ms = 10_000).await;
    let one = json!({ "Channel": ADC_NR, "Target": ADC01, "Samples": 25_000 });
    let other =
        json!({ "Channel": "0.1.ESH10000158.NumericResult", "Target": MON_3V3, "Samples": 5_000 });
    let started = Instant::now();
    let (a, b, c) = tokio::join!(
        rig.post("numeric-results/acquire", one.clone()),
        rig.post("numeric-results/acquire", one),
        rig.post("numeric-results/acquire", other),
    );
    let took = started.elapsed();
    for (status, answer) in [&a, &b, &c] {
        assert_eq!(*status, 200, "{answer}");
    }
    // Two of 0.5 s on one channel run one after the other; the 0.5 s on another overlaps.
    assert!(took >= Duration::from_millis(950), "{took:?}");
    assert!(took < Duration::from_millis(5_000), "{took:?}");
}

#[tokio::test]
async fn a_measurement_is_an_event_and_the_status_page_shows_the_last_per_channel() {
    let rig = rig(|_: &mut Config| {}).await;
    let (mut events, _) = common::sse::Sse::open_hello(&rig).await.unwrap();
    let (status, meta) = rig
        .post(
            "numeric-results/measure",
            json!({ "ChannelNetName": ADC_NR, "TargetNetName": ADC01, "Samples": 300, "ReducedSet": true }),
        )
        .await;
    assert_eq!(status, 200, "{meta}");
    let event = events
        .next_named("numeric-result", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(event.data["channel"], ADC_NR);
    assert_eq!(event.data["target"], ADC01);
    assert_eq!(event.data["count"], 300);
    let (status, mean) = rig
        .get(&format!("numeric-results/result/mean?channel={ADC_NR}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(event.data["mean"], mean);
    assert!(event.data["stdev"].as_f64().unwrap() > 0.0);
    let (status, text) = rig.get_text("/status.json").await;
    assert_eq!(status, 200);
    let doc: Json = serde_json::from_str(&text).unwrap();
    let shown = doc["numericResults"].as_array().unwrap();
    assert_eq!(shown.len(), 1, "{text}");
    assert_eq!(shown[0]["channel"], ADC_NR);
    assert_eq!(shown[0]["count"], 300);
}
