//! Scenario 7: the forced read over a serial link (the simulator's pseudo-terminal, paced
//! both ways) beside the wire time of its frames.

use std::time::Duration;

use anyhow::Context;
use bytes::BytesMut;
use serde_json::json;
use station_protocol::{Request, Response, StationCodec};
use station_simulator::{SimulatorHandle, StationClient};
use tokio_util::codec::Encoder;

use super::{VALUE_GET, body, error_notes, ratio, rest_workers, wait_until_serving};
use crate::child::GatewayProcess;
use crate::load::{Bounds, Measured, drive};
use crate::report::{Row, Verdict, micros, rate_cell};
use crate::workers::DirectReadWorker;

/// Scenario 7: forced reads over a 115 200 baud serial line (the simulator's pty), against
/// the wire time of the frames plus the station's processing time.
pub async fn serial(
    simulator: &SimulatorHandle,
    binary: &std::path::Path,
    name: &str,
    bounds: Bounds,
    env: &[(String, String)],
) -> Row {
    let scenario = "Serial link 115 200 baud: forced read round trip, 1 client";
    match serial_inner(simulator, binary, name, bounds, env).await {
        Ok(row) => row,
        Err(why) => Row::not_measurable("7", scenario, format!("{why:#}")),
    }
}

async fn serial_inner(
    simulator: &SimulatorHandle,
    binary: &std::path::Path,
    name: &str,
    bounds: Bounds,
    env: &[(String, String)],
) -> anyhow::Result<Row> {
    const BAUD: u32 = 115_200;
    let mut row = Row::new(
        "7",
        "Serial link 115 200 baud: forced read round trip, 1 client",
    );
    let path = simulator.attach_pty(Some(BAUD))?;
    let path_text = path.to_str().context("pty path is not UTF-8")?.to_owned();
    let serial_bounds = Bounds {
        warmup: Duration::from_millis(200),
        duration: bounds.duration,
        max_per_worker: 2_000,
    };

    // Direct: the same READ straight over the pty, for reference.
    let port = tokio_serial::SerialStream::open(&tokio_serial::new(&path_text, BAUD))
        .context("cannot open the pty")?;
    let mut client = StationClient::new(port);
    client.set_timeout(Duration::from_secs(2));
    client.hello("station-bench").await?;
    let value = client.read_one(name).await?;
    let direct = drive(
        vec![DirectReadWorker {
            client,
            names: vec![name.to_owned()],
        }],
        serial_bounds,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Wire time of one forced read: request and reply frames, 10 bits a byte.
    let mut codec = StationCodec::new();
    let mut request = BytesMut::new();
    codec.encode(
        Request::Read {
            names: vec![name.to_owned()],
        }
        .to_frame(1)?,
        &mut request,
    )?;
    let mut reply = BytesMut::new();
    codec.encode(Response::Read(vec![Ok(value)]).to_frame(1)?, &mut reply)?;
    let bytes = request.len() + reply.len();
    let wire = Duration::from_secs_f64(bytes as f64 * 10.0 / f64::from(BAUD));
    let reply_wire = Duration::from_secs_f64(reply.len() as f64 * 10.0 / f64::from(BAUD));
    let processing = simulator.profile().station.processing;
    let floor = wire + processing;

    let url = format!("serial://{path_text}?baud={BAUD}");
    let gateway = GatewayProcess::spawn(binary, &url, env).await?;
    let outcome: anyhow::Result<Measured> = async {
        wait_until_serving(&gateway, name, Duration::from_secs(15)).await?;
        let workers = rest_workers(gateway.http_addr, 1, VALUE_GET, |_| {
            body(json!({ "Name": name }))
        })
        .await?;
        Ok(drive(workers, serial_bounds).await)
    }
    .await;
    gateway.stop().await;
    let measured = outcome?;
    let r = ratio(measured.p50_us(), floor.as_secs_f64() * 1e6);
    row.gateway = rate_cell(&measured);
    row.baseline = format!(
        "wire time {} ({bytes} bytes × 10 bits) + processing {} = {}; direct over the pty: {}",
        micros(wire.as_secs_f64() * 1e6),
        micros(processing.as_secs_f64() * 1e6),
        micros(floor.as_secs_f64() * 1e6),
        rate_cell(&direct)
    );
    row.ratio = format!("p50 {r:.2}× wire + processing");
    row.target = "≤ 1.2× wire + processing".to_owned();
    row.verdict = Verdict::from_bool(r <= 1.2 && measured.errors == 0);
    row.notes.push(format!(
        "frames: request {} bytes, reply {} bytes; the simulator paces both ways: a request is taken when its last byte has crossed the line, a reply handed over when its own has (reply wire time {})",
        request.len(),
        reply.len(),
        micros(reply_wire.as_secs_f64() * 1e6)
    ));
    error_notes(&mut row, &measured, &direct);
    Ok(row)
}
