//! The `sampling` scenario: a NumericResult acquisition of 100 000 samples through
//! the gateway, over TCP and over the serial pty at 115 200 baud, while another client reads a
//! different channel from the hardware in a loop. Reported: samples per second against the
//! limit (the station's sample rate on TCP; the wire, bytes × 10 / baud, on serial) and the
//! latency of those forced reads during the acquisition.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde_json::{Value as Json, json};
use station_simulator::SimulatorHandle;

use crate::child::{GatewayProcess, StationProcess};
use crate::http::HttpConnection;
use crate::report::{Row, Verdict, micros, thousands};

const SAMPLER: &str = "0.8.ESH10000590.NumericResult";
const TARGET: &str = "0.8.ESH10000590.ADC01";
const OTHER: &str = "0.1.ESH10000158.MON_3V3";
const RATE: f64 = 50_000.0;
const BAUD: u32 = 115_200;
/// Samples per data frame the gateway asks for on a serial line, and the frame's envelope.
const SERIAL_FRAME_SAMPLES: usize = 128;
const FRAME_OVERHEAD: usize = 12 + 7 + 4;

/// The gateway's config for the scenario: a request timeout long enough for 100 000 samples
/// over 115 200 baud (about 71 s).
fn config_file() -> anyhow::Result<std::path::PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "station-bench-sampling-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, "[station]\nrequest_timeout_ms = 150000\n")?;
    Ok(path)
}

struct Outcome {
    took: Duration,
    count: u64,
    reads: Histogram<u64>,
    idle_read_us: f64,
}

/// Idle forced-read latency first, then the acquisition with reads of another channel beside it.
async fn measure(gateway: &GatewayProcess, samples: u32) -> anyhow::Result<Outcome> {
    crate::scenarios::wait_until_serving(gateway, OTHER, Duration::from_secs(20)).await?;
    let read_body = Bytes::from(json!({ "Name": OTHER }).to_string());
    let mut reader = HttpConnection::open(gateway.http_addr).await?;
    let mut idle = Histogram::<u64>::new(3)?;
    for _ in 0..20 {
        let asked = Instant::now();
        reader.post("/api/resources/value/get", &read_body).await?;
        idle.record(asked.elapsed().as_micros() as u64)?;
    }
    let mut acquirer = HttpConnection::open(gateway.http_addr).await?;
    let acquire_body = Bytes::from(
        json!({ "Channel": SAMPLER, "Target": TARGET, "Samples": samples }).to_string(),
    );
    let started = Instant::now();
    let acquisition = acquirer.post("/api/numeric-results/acquire", &acquire_body);
    tokio::pin!(acquisition);
    let mut reads = Histogram::<u64>::new(3)?;
    let answer = loop {
        let asked = Instant::now();
        tokio::select! {
            biased;
            answer = &mut acquisition => break answer?,
            read = reader.post("/api/resources/value/get", &read_body) => {
                read?;
                reads.record(asked.elapsed().as_micros() as u64)?;
            }
        }
    };
    let took = started.elapsed();
    let doc: Json = serde_json::from_slice(&answer)?;
    let count = doc["stats"]["count"]
        .as_u64()
        .context("no stats.count in the answer")?;
    if count != u64::from(samples) {
        bail!("asked for {samples} samples, got {count}");
    }
    Ok(Outcome {
        took,
        count,
        reads,
        idle_read_us: idle.value_at_quantile(0.5) as f64,
    })
}

fn reads_cell(o: &Outcome) -> String {
    if o.reads.is_empty() {
        return "no forced read finished during the acquisition".to_owned();
    }
    format!(
        "{} forced reads of another channel during it: p50 {} · max {} (idle p50 {})",
        o.reads.len(),
        micros(o.reads.value_at_quantile(0.5) as f64),
        micros(o.reads.max() as f64),
        micros(o.idle_read_us)
    )
}

/// Over TCP: the limit is the station's own rate.
pub async fn tcp(binary: &std::path::Path, env: &[(String, String)], samples: u32) -> Row {
    let scenario = format!(
        "Sampling over TCP: {} samples at 50 kHz, reads beside",
        thousands(f64::from(samples))
    );
    let result: anyhow::Result<Row> = async {
        let station = StationProcess::spawn().await?;
        let config = config_file()?;
        let url = format!("tcp://{}", station.addr);
        let config_arg = config.to_string_lossy().into_owned();
        let gateway =
            GatewayProcess::spawn_with(binary, &url, env, &["--config", &config_arg]).await?;
        let outcome = measure(&gateway, samples).await;
        gateway.stop().await;
        let _ = std::fs::remove_file(&config);
        let o = outcome?;
        let rate = o.count as f64 / o.took.as_secs_f64();
        let mut row = Row::new("12a", scenario.clone());
        row.gateway = format!(
            "{} samples/s ({:.2} s) · {}",
            thousands(rate),
            o.took.as_secs_f64(),
            reads_cell(&o)
        );
        row.baseline = format!("the station's rate: {} samples/s", thousands(RATE));
        row.ratio = format!("{:.2}× the station's rate", rate / RATE);
        row.target = "≥ 0.9× the station's rate".to_owned();
        row.verdict = Verdict::from_bool(rate >= 0.9 * RATE);
        Ok(row)
    }
    .await;
    result.unwrap_or_else(|why| Row::not_measurable("12a", scenario, format!("{why:#}")))
}

/// Over the serial pty at 115 200 baud: the limit is the wire.
pub async fn serial(
    simulator: &SimulatorHandle,
    binary: &std::path::Path,
    env: &[(String, String)],
    samples: u32,
) -> Row {
    let scenario = format!(
        "Sampling over serial 115 200 baud: {} samples, reads beside",
        thousands(f64::from(samples))
    );
    let result: anyhow::Result<Row> = async {
        let path = simulator.attach_pty(Some(BAUD))?;
        let url = format!("serial://{}?baud={BAUD}", path.to_str().context("pty path is not UTF-8")?);
        let config = config_file()?;
        let config_arg = config.to_string_lossy().into_owned();
        let gateway = GatewayProcess::spawn_with(binary, &url, env, &["--config", &config_arg]).await?;
        let outcome = measure(&gateway, samples).await;
        gateway.stop().await;
        let _ = std::fs::remove_file(&config);
        let o = outcome?;
        let rate = o.count as f64 / o.took.as_secs_f64();
        let wire_limit = f64::from(BAUD) / 10.0 / 8.0;
        let frame_bytes = SERIAL_FRAME_SAMPLES * 8 + FRAME_OVERHEAD;
        let frame_wire = frame_bytes as f64 * 10.0 / f64::from(BAUD);
        let mut row = Row::new("12b", scenario.clone());
        row.gateway = format!("{:.0} samples/s ({:.1} s) · {}", rate, o.took.as_secs_f64(), reads_cell(&o));
        row.baseline = format!(
            "wire limit {wire_limit:.0} samples/s (8 bytes × 10 bits / {BAUD} baud); one data frame ({frame_bytes} bytes) is {} on the wire",
            micros(frame_wire * 1e6)
        );
        let read_extra = (o.reads.value_at_quantile(0.5) as f64 - o.idle_read_us) / 1e6;
        row.ratio = format!(
            "{:.2}× the wire limit; reads wait p50 {} more than idle ({:.2}× one frame)",
            rate / wire_limit,
            micros(read_extra * 1e6),
            read_extra / frame_wire
        );
        row.target = "≥ 0.9× the wire limit; reads wait ≤ one data frame's wire time".to_owned();
        row.verdict = Verdict::from_bool(rate >= 0.9 * wire_limit && read_extra <= frame_wire);
        row.notes.push(
            "the gateway asks for 128-sample data frames on a serial line (SPEC.md §6.12); the simulator writes any other answer before the next data frame".to_owned(),
        );
        Ok(row)
    }
    .await;
    result.unwrap_or_else(|why| Row::not_measurable("12b", scenario, format!("{why:#}")))
}
