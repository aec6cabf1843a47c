//! The `bus` scenario: an I2C SendReceive of 2 bytes (the EEPROM at 0x50) through
//! `POST api/comm/i2c` against the same BUS request straight to the station, one client; and
//! the same through a gateway on the simulator's 115 200 baud serial line, against the frames'
//! wire time plus the station's processing.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use serde_json::json;
use station_protocol::bus::DEFAULT_RETRIES;
use station_protocol::{BusAction, BusRequest, Request, Response, StationCodec};
use station_simulator::{SimulatorHandle, StationClient};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Encoder;

use crate::child::GatewayProcess;
use crate::load::{Bounds, Measured, Worker, drive};
use crate::report::{Row, Verdict, micros, rate_cell};
use crate::scenarios::{Bench, wait_until_serving};
use crate::workers::RestWorker;

const COMM_I2C: &str = "/api/comm/i2c";
const I2C: &str = "0.ESH10000023.I2C09";

/// The BUS request both paths make: point the EEPROM at byte 0 and read 2 bytes.
fn eeprom_read() -> BusRequest {
    BusRequest {
        channel: I2C.to_owned(),
        action: BusAction::SendReceive,
        address: 0x50,
        retries: DEFAULT_RETRIES,
        receive: 2,
        data: Bytes::from_static(&[0x00]),
        line: None,
    }
}

fn rest_body() -> Bytes {
    let body = json!({
        "DeviceName": I2C, "Address": "50", "Action": "SendReceive",
        "DataToSend": "00", "NumberOfBytesToReceive": 2, "MaxRetries": -1,
    });
    Bytes::from(serde_json::to_vec(&body).expect("JSON"))
}

/// BUS straight to a station, expecting the 2 bytes asked for.
struct DirectBusWorker<S> {
    client: StationClient<S>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Worker for DirectBusWorker<S> {
    async fn call(&mut self) -> anyhow::Result<()> {
        match self.client.request(Request::Bus(eeprom_read())).await? {
            Response::Bus(received) if received.len() == 2 => Ok(()),
            other => bail!("BUS answered {other:?}"),
        }
    }
}

fn errors_note(row: &mut Row, measured: &Measured, baseline: &Measured) {
    if measured.errors > 0 || baseline.errors > 0 {
        row.notes.push(format!(
            "errors: {} through the gateway, {} in the baseline",
            measured.errors, baseline.errors
        ));
    }
}

/// 9. One client, over TCP: p50 overhead of the gateway ≤ 100 µs.
pub async fn bus(bench: &Bench) -> Row {
    let scenario = "I2C SendReceive of 2 bytes (api/comm/i2c), 1 client";
    match bus_inner(bench, scenario).await {
        Ok(row) => row,
        Err(why) => Row::not_measurable("9", scenario, format!("{why:#}")),
    }
}

async fn bus_inner(bench: &Bench, scenario: &str) -> anyhow::Result<Row> {
    let mut row = Row::new("9", scenario);
    let mut client = StationClient::connect(bench.station.addr).await?;
    client.set_timeout(Duration::from_secs(2));
    client.hello("station-bench").await?;
    let baseline = drive(vec![DirectBusWorker { client }], bench.bounds).await;
    let worker = RestWorker::open(bench.gateway.http_addr, COMM_I2C, &rest_body()).await?;
    let measured = drive(vec![worker], bench.bounds).await;
    let overhead = measured.p50_us() - baseline.p50_us();
    row.gateway = rate_cell(&measured);
    row.baseline = format!("BUS straight to the station: {}", rate_cell(&baseline));
    row.ratio = format!("p50 +{}", micros(overhead));
    row.target = "p50 +≤ 100 µs".to_owned();
    row.verdict = Verdict::from_bool(overhead <= 100.0 && measured.errors == 0);
    errors_note(&mut row, &measured, &baseline);
    Ok(row)
}

/// 9b. One client over a 115 200 baud serial line: p50 ≤ 1.2 × wire time + processing.
pub async fn bus_serial(
    simulator: &SimulatorHandle,
    binary: &std::path::Path,
    bounds: Bounds,
    env: &[(String, String)],
) -> Row {
    let scenario = "Serial link 115 200 baud: I2C SendReceive of 2 bytes, 1 client";
    match bus_serial_inner(simulator, binary, bounds, env, scenario).await {
        Ok(row) => row,
        Err(why) => Row::not_measurable("9b", scenario, format!("{why:#}")),
    }
}

async fn bus_serial_inner(
    simulator: &SimulatorHandle,
    binary: &std::path::Path,
    bounds: Bounds,
    env: &[(String, String)],
    scenario: &str,
) -> anyhow::Result<Row> {
    const BAUD: u32 = 115_200;
    let mut row = Row::new("9b", scenario);
    let path = simulator.attach_pty(Some(BAUD))?;
    let path_text = path.to_str().context("pty path is not UTF-8")?.to_owned();
    let serial_bounds = Bounds {
        warmup: Duration::from_millis(200),
        duration: bounds.duration,
        max_per_worker: 2_000,
    };
    let port = tokio_serial::SerialStream::open(&tokio_serial::new(&path_text, BAUD))
        .context("cannot open the pty")?;
    let mut client = StationClient::new(port);
    client.set_timeout(Duration::from_secs(2));
    client.hello("station-bench").await?;
    let direct = drive(vec![DirectBusWorker { client }], serial_bounds).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Wire time of one transaction: request and reply frames, 10 bits a byte.
    let mut codec = StationCodec::new();
    let mut request = BytesMut::new();
    codec.encode(Request::Bus(eeprom_read()).to_frame(1)?, &mut request)?;
    let mut reply = BytesMut::new();
    let two = Bytes::from_static(&[0, 0]);
    codec.encode(Response::Bus(two).to_frame(1)?, &mut reply)?;
    let bytes = request.len() + reply.len();
    let wire = Duration::from_secs_f64(bytes as f64 * 10.0 / f64::from(BAUD));
    let processing = simulator.profile().station.processing;
    let floor = wire + processing;

    let url = format!("serial://{path_text}?baud={BAUD}");
    let gateway = GatewayProcess::spawn(binary, &url, env).await?;
    let outcome: anyhow::Result<Measured> = async {
        wait_until_serving(&gateway, "Engine.FirmwareRev", Duration::from_secs(15)).await?;
        let worker = RestWorker::open(gateway.http_addr, COMM_I2C, &rest_body()).await?;
        Ok(drive(vec![worker], serial_bounds).await)
    }
    .await;
    gateway.stop().await;
    let measured = outcome?;
    let r = measured.p50_us() / (floor.as_secs_f64() * 1e6);
    row.gateway = rate_cell(&measured);
    row.baseline = format!(
        "wire time {} ({bytes} bytes × 10 bits) + processing {} = {}; BUS direct over the pty: {}",
        micros(wire.as_secs_f64() * 1e6),
        micros(processing.as_secs_f64() * 1e6),
        micros(floor.as_secs_f64() * 1e6),
        rate_cell(&direct)
    );
    row.ratio = format!("p50 {r:.2}× wire + processing");
    row.target = "≤ 1.2× wire + processing".to_owned();
    row.verdict = Verdict::from_bool(r <= 1.2 && measured.errors == 0);
    row.notes.push(format!(
        "frames: request {} bytes, reply {} bytes",
        request.len(),
        reply.len()
    ));
    errors_note(&mut row, &measured, &direct);
    Ok(row)
}
