//! The BUS operation on the simulated station (SPEC.md §6.11): one transaction on an I2C, UART
//! or SPI bus channel against the devices of `devices.rs`, and its answer on a connection with
//! the faults that reach it.

use std::time::Duration;

use bytes::Bytes;
use station_protocol::bus::DEFAULT_RETRIES;
use station_protocol::{
    BusAction, BusRequest, ErrorCode, Parity, Response, StationError, UartLine, Value,
};
use tokio::time::Instant;

use crate::buses::{BusState, I2cDevice};
use crate::devices::{SCAN_FIRST, SCAN_LAST};
use crate::shared::{ConnectionId, Shared};
use crate::station::{AppliedWrite, Station};

/// A line setting this far from the device's baud rate still samples correctly.
const BAUD_TOLERANCE: f64 = 0.03;

/// What one transaction did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BusOutcome {
    pub received: Bytes,
    /// How long the station waited on the bus before it could answer (a UART receive timeout).
    pub wait: Duration,
    /// The bytes it put on the bus, for the write log.
    pub applied: Option<AppliedWrite>,
}

fn bad_settings(message: String) -> StationError {
    StationError::new(ErrorCode::BadSettings, message)
}

/// Runs one transaction on `station` at `now`.
pub(crate) fn transact(
    station: &mut Station,
    request: &BusRequest,
    now: Instant,
) -> Result<BusOutcome, StationError> {
    request
        .check()
        .map_err(|why| StationError::new(ErrorCode::BadValue, why))?;
    let name = &request.channel;
    let mut buses = std::mem::take(&mut station.buses);
    let result = match buses.by_channel.get_mut(name) {
        None => Err(StationError::new(
            ErrorCode::UnknownChannel,
            format!("no bus channel named {name}"),
        )),
        Some(BusState::I2c { retries, devices }) => i2c(station, request, *retries, devices, now),
        Some(BusState::Spi { adc }) => spi(request, adc.as_ref()),
        Some(BusState::Uart { baud }) => uart(station, request, *baud),
    };
    station.buses = buses;
    let mut outcome = result?;
    if matches!(request.action, BusAction::Send | BusAction::SendReceive)
        && !request.data.is_empty()
    {
        outcome.applied = Some(AppliedWrite {
            channel: name.clone(),
            value: Value::Bytes(request.data.clone()),
        });
    }
    Ok(outcome)
}

fn done(received: Vec<u8>) -> Result<BusOutcome, StationError> {
    Ok(BusOutcome {
        received: Bytes::from(received),
        wait: Duration::ZERO,
        applied: None,
    })
}

fn i2c(
    station: &mut Station,
    request: &BusRequest,
    default_retries: u8,
    devices: &mut [(u8, I2cDevice)],
    now: Instant,
) -> Result<BusOutcome, StationError> {
    let name = &request.channel;
    if request.line.is_some() {
        return Err(bad_settings(format!(
            "{name} is an I2C bus: UART line settings do not apply"
        )));
    }
    let action = request.action;
    match action {
        BusAction::Scan => {
            let mut found: Vec<u8> = devices
                .iter()
                .map(|(address, _)| *address)
                .filter(|a| (SCAN_FIRST..=SCAN_LAST).contains(a))
                .collect();
            found.sort_unstable();
            return done(found);
        }
        BusAction::ClearBuffers => {
            return Err(bad_settings(format!(
                "{name} is an I2C bus: it has no buffers to clear (Send, Receive, SendReceive, Scan)"
            )));
        }
        BusAction::Send | BusAction::Receive | BusAction::SendReceive => {}
    }
    let address = request.address;
    let Some((_, device)) = devices.iter_mut().find(|(a, _)| *a == address) else {
        let retries = if request.retries == DEFAULT_RETRIES {
            default_retries
        } else {
            request.retries
        };
        return Err(StationError::new(
            ErrorCode::Nak,
            format!(
                "no device acknowledged address 0x{address:02X} on {name} ({} attempts)",
                u32::from(retries) + 1
            ),
        ));
    };
    let receive = usize::from(request.receive);
    let sends = action != BusAction::Receive;
    let receives = action != BusAction::Send;
    match device {
        I2cDevice::Eeprom(rom) => {
            if sends {
                rom.write(&request.data);
            }
            done(if receives {
                rom.read(receive)
            } else {
                Vec::new()
            })
        }
        I2cDevice::Temp(sensor) => {
            if sends {
                sensor.write(&request.data);
            }
            if !receives {
                return done(Vec::new());
            }
            let celsius = match station.read(&sensor.follows, now)? {
                Value::Float(x) => x,
                other => {
                    return Err(StationError::new(
                        ErrorCode::Internal,
                        format!("{} read as {other:?}, not a temperature", sensor.follows),
                    ));
                }
            };
            done(sensor.read(receive, celsius))
        }
    }
}

fn spi(request: &BusRequest, adc: Option<&(Vec<f64>, f64)>) -> Result<BusOutcome, StationError> {
    let name = &request.channel;
    if request.line.is_some() {
        return Err(bad_settings(format!(
            "{name} is an SPI bus: UART line settings do not apply"
        )));
    }
    let receive = usize::from(request.receive);
    let length = match request.action {
        BusAction::Send => request.data.len(),
        BusAction::Receive => receive,
        BusAction::SendReceive => request.data.len().max(receive),
        BusAction::Scan | BusAction::ClearBuffers => {
            return Err(bad_settings(format!(
                "{name} is an SPI bus: {} is not an SPI action (Send, Receive, SendReceive)",
                request.action.name()
            )));
        }
    };
    let mut mosi = vec![0u8; length];
    if request.action != BusAction::Receive {
        mosi[..request.data.len()].copy_from_slice(&request.data);
    }
    // With no device selected the line floats high.
    let miso = match adc {
        Some((inputs, vref)) => crate::devices::adc_transfer(inputs, *vref, &mosi),
        None => vec![0xFF; length],
    };
    let keep = if request.action == BusAction::Send {
        0
    } else {
        receive
    };
    done(miso[length - keep..].to_vec())
}

/// Whether a UART's line settings sample what the device on the line sends.
fn line_matches(line: &UartLine, baud: u32) -> bool {
    let ratio = f64::from(line.baud) / f64::from(baud);
    (ratio - 1.0).abs() <= BAUD_TOLERANCE && line.parity == Parity::None
}

/// A byte sampled at the wrong line settings.
fn garbled(byte: u8) -> u8 {
    byte.rotate_left(3) ^ 0xA5
}

fn uart(
    station: &mut Station,
    request: &BusRequest,
    baud: u32,
) -> Result<BusOutcome, StationError> {
    let name = &request.channel;
    let Some(line) = &request.line else {
        return Err(bad_settings(format!(
            "{name} is a UART: a transaction needs its line settings"
        )));
    };
    if line.baud == 0 {
        return Err(bad_settings(format!("{name}: a baud rate of 0")));
    }
    let internal = || {
        StationError::new(
            ErrorCode::Internal,
            format!("{name}: channel state does not match its model"),
        )
    };
    let matches = line_matches(line, baud);
    let (pending_line, receive_buffer, replies, unknown) =
        station.uart_parts(name).ok_or_else(internal)?;
    let (sends, receives) = match request.action {
        BusAction::Send => (true, false),
        BusAction::Receive => (false, true),
        BusAction::SendReceive => (true, true),
        BusAction::ClearBuffers => {
            pending_line.clear();
            receive_buffer.clear();
            return done(Vec::new());
        }
        BusAction::Scan => {
            return Err(bad_settings(format!(
                "{name} is a UART: Scan is an I2C action (Send, Receive, SendReceive, ClearBuffers)"
            )));
        }
    };
    if sends {
        if matches {
            let text = String::from_utf8_lossy(&request.data);
            crate::station::uart_write(pending_line, receive_buffer, &text, replies, unknown);
        } else {
            // The instrument samples garbage: no command it knows, and no line end.
            pending_line.clear();
        }
    }
    if !receives || request.receive == 0 {
        return done(Vec::new());
    }
    let wanted = usize::from(request.receive);
    let available = receive_buffer.as_bytes();
    let mut take = wanted.min(available.len());
    let mut complete = take == wanted;
    if line.use_termination
        && matches
        && let Some(end) = available[..take]
            .iter()
            .position(|b| *b == line.termination_byte)
    {
        take = end + 1;
        complete = true;
    }
    while !receive_buffer.is_char_boundary(take) {
        take -= 1;
    }
    let taken: Vec<u8> = receive_buffer
        .drain(..take)
        .collect::<String>()
        .into_bytes();
    let received = if matches {
        taken
    } else {
        taken.into_iter().map(garbled).collect()
    };
    Ok(BusOutcome {
        received: Bytes::from(received),
        wait: if complete {
            Duration::ZERO
        } else {
            Duration::from_millis(u64::from(line.timeout_ms))
        },
        applied: None,
    })
}

/// Answers one BUS request on a connection: the transaction under the station's lock, the
/// bus's wait outside it, the write log, and the short-read fault.
pub(crate) async fn answer(
    shared: &Shared,
    request: &BusRequest,
    id: ConnectionId,
    peer: &str,
) -> Response {
    let result = transact(&mut shared.lock_station(), request, Instant::now());
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => return Response::Error(error),
    };
    if let Some(applied) = outcome.applied {
        shared.log_writes(vec![applied], id, peer);
    }
    let mut received = outcome.received;
    if let Some(limit) = shared.faults.bus_read_limit() {
        received.truncate(limit);
    }
    if !outcome.wait.is_zero() {
        tokio::time::sleep(outcome.wait).await;
    }
    shared.flush_notifies();
    Response::Bus(received)
}

#[cfg(test)]
mod tests;
