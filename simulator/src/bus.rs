//! The BUS operation on the simulated station (SPEC.md §6.11): one transaction on an I2C, UART
//! or SPI bus channel against the devices of `devices.rs`, and its answer on a connection with
//! the faults that reach it.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use station_protocol::bus::DEFAULT_RETRIES;
use station_protocol::{
    BusAction, BusRequest, ErrorCode, Parity, Response, StationError, UartLine, Value,
};
use tokio::time::Instant;

use crate::devices::{BusKind, BusSpec, DeviceSpec, Eeprom, SCAN_FIRST, SCAN_LAST, TempSensor};
use crate::server::{ConnectionId, Shared};
use crate::station::{AppliedWrite, Station};

/// A line setting this far from the device's baud rate still samples correctly.
const BAUD_TOLERANCE: f64 = 0.03;

/// One I2C device's state.
#[derive(Debug, Clone)]
enum I2cDevice {
    Eeprom(Eeprom),
    Temp(TempSensor),
}

/// One bus's state.
#[derive(Debug, Clone)]
enum BusState {
    I2c {
        retries: u8,
        devices: Vec<(u8, I2cDevice)>,
    },
    Uart {
        baud: u32,
    },
    Spi {
        adc: Option<(Vec<f64>, f64)>,
    },
}

/// Every bus of the station, by channel name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Buses {
    by_channel: HashMap<String, BusState>,
}

/// What one transaction did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BusOutcome {
    pub received: Bytes,
    /// How long the station waited on the bus before it could answer (a UART receive timeout).
    pub wait: Duration,
    /// The bytes it put on the bus, for the write log.
    pub applied: Option<AppliedWrite>,
}

impl Buses {
    pub(crate) fn new(specs: &[BusSpec]) -> Buses {
        let by_channel = specs
            .iter()
            .map(|spec| {
                let state = match &spec.kind {
                    BusKind::I2c { retries } => BusState::I2c {
                        retries: *retries,
                        devices: spec
                            .devices
                            .iter()
                            .filter_map(|device| match device {
                                DeviceSpec::Eeprom {
                                    address,
                                    contents,
                                    page,
                                } => Some((
                                    *address,
                                    I2cDevice::Eeprom(Eeprom {
                                        memory: contents.clone(),
                                        page: *page,
                                        pointer: 0,
                                    }),
                                )),
                                DeviceSpec::TempSensor { address, follows } => Some((
                                    *address,
                                    I2cDevice::Temp(TempSensor::new(follows.clone())),
                                )),
                                DeviceSpec::Adc { .. } => None,
                            })
                            .collect(),
                    },
                    BusKind::Uart { baud } => BusState::Uart { baud: *baud },
                    BusKind::Spi => BusState::Spi {
                        adc: spec.devices.iter().find_map(|device| match device {
                            DeviceSpec::Adc { inputs, vref } => Some((inputs.clone(), *vref)),
                            _ => None,
                        }),
                    },
                };
                (spec.channel.clone(), state)
            })
            .collect();
        Buses { by_channel }
    }
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
mod tests {
    use super::*;
    use crate::profile::Profile;
    use station_protocol::{FlowControl, UartBusType};

    const I2C: &str = "0.ESH10000023.I2C09";
    const UART: &str = "0.ESH10000023.UART01";
    const SPI: &str = "0.ESH10000023.SPI01";

    fn station() -> Station {
        Station::power_on(&Profile::default_station(), Instant::now())
    }

    fn bus(channel: &str, action: BusAction, address: u8, data: &[u8], receive: u16) -> BusRequest {
        BusRequest {
            channel: channel.into(),
            action,
            address,
            retries: DEFAULT_RETRIES,
            receive,
            data: Bytes::copy_from_slice(data),
            line: None,
        }
    }

    fn uart_line(baud: u32, termination: bool, timeout_ms: u32) -> Option<UartLine> {
        Some(UartLine {
            baud,
            bus_type: UartBusType::Rs232,
            flow_control: FlowControl::None,
            parity: Parity::None,
            use_termination: termination,
            termination_byte: b'\n',
            timeout_ms,
        })
    }

    fn run(station: &mut Station, request: &BusRequest) -> Result<BusOutcome, StationError> {
        transact(station, request, Instant::now())
    }

    fn received(station: &mut Station, request: &BusRequest) -> Vec<u8> {
        run(station, request).unwrap().received.to_vec()
    }

    #[test]
    fn an_i2c_scan_finds_the_devices_of_the_profile_and_absent_addresses_nak() {
        let mut s = station();
        assert_eq!(
            received(&mut s, &bus(I2C, BusAction::Scan, 0, &[], 0)),
            vec![0x48, 0x50]
        );
        let mut absent = bus(I2C, BusAction::Receive, 0x51, &[], 1);
        let error = run(&mut s, &absent).unwrap_err();
        assert_eq!(error.code, ErrorCode::Nak);
        assert!(
            error.message.contains("0x51") && error.message.contains("4 attempts"),
            "{error}"
        );
        absent.retries = 0;
        assert!(
            run(&mut s, &absent)
                .unwrap_err()
                .message
                .contains("1 attempts")
        );
    }

    #[test]
    fn the_eeprom_holds_the_board_identity_and_reads_back_writes_with_wrap() {
        let mut s = station();
        let identity = received(&mut s, &bus(I2C, BusAction::SendReceive, 0x50, &[0], 11));
        assert_eq!(identity, b"ESH10000023");
        let write = bus(I2C, BusAction::Send, 0x50, &[0x20, 1, 2, 3, 4], 0);
        let outcome = run(&mut s, &write).unwrap();
        assert!(outcome.received.is_empty());
        assert_eq!(
            outcome.applied.unwrap().value,
            Value::Bytes(Bytes::from_static(&[0x20, 1, 2, 3, 4]))
        );
        assert_eq!(
            received(&mut s, &bus(I2C, BusAction::SendReceive, 0x50, &[0x20], 4)),
            vec![1, 2, 3, 4]
        );
        run(&mut s, &bus(I2C, BusAction::Send, 0x50, &[0xFF, 0xAB], 0)).unwrap();
        assert_eq!(
            received(&mut s, &bus(I2C, BusAction::SendReceive, 0x50, &[0xFE], 3)),
            vec![0xFF, 0xAB, b'E']
        );
        // A plain Receive continues from the pointer.
        assert_eq!(
            received(&mut s, &bus(I2C, BusAction::Receive, 0x50, &[], 1)),
            b"S"
        );
    }

    #[test]
    fn the_temperature_sensor_reads_the_cpu_temperature() {
        let mut s = station();
        let now = Instant::now();
        let register = received(&mut s, &bus(I2C, BusAction::SendReceive, 0x48, &[0], 2));
        let celsius = crate::devices::decode_celsius([register[0], register[1]]);
        let Value::Float(cpu) = s.read("TempRegulator.CPU_TEMP", now).unwrap() else {
            panic!("CPU_TEMP is a float");
        };
        assert!((celsius - cpu).abs() <= 0.5, "sensor {celsius}, CPU {cpu}");
        assert!((40.0..=50.0).contains(&celsius), "{celsius}");
    }

    #[test]
    fn the_spi_adc_answers_a_full_duplex_transfer() {
        let mut s = station();
        let answer = received(&mut s, &bus(SPI, BusAction::SendReceive, 0, &[1, 0, 0], 3));
        assert_eq!(answer, vec![0, 0x06, 0x72]);
        // Asking for the last two bytes of the transfer gives the conversion alone.
        assert_eq!(
            received(&mut s, &bus(SPI, BusAction::SendReceive, 0, &[0, 0, 0], 2)),
            vec![0x09, 0xC4]
        );
        assert_eq!(
            received(&mut s, &bus(SPI, BusAction::Receive, 0, &[], 3)),
            vec![0, 0x09, 0xC4]
        );
        assert!(received(&mut s, &bus(SPI, BusAction::Send, 0, &[3, 0, 0], 0)).is_empty());
        let scan = run(&mut s, &bus(SPI, BusAction::Scan, 0, &[], 0)).unwrap_err();
        assert_eq!(scan.code, ErrorCode::BadSettings);
    }

    #[test]
    fn the_uart_instrument_honours_the_termination_byte_and_the_timeout() {
        let mut s = station();
        let mut idn = bus(UART, BusAction::SendReceive, 0, b"*IDN?\n", 64);
        idn.line = uart_line(9600, true, 500);
        let outcome = run(&mut s, &idn).unwrap();
        assert_eq!(
            &outcome.received[..],
            b"Simulated Station,HV4,ESH10000662,6.4.2\n"
        );
        assert_eq!(
            outcome.wait,
            Duration::ZERO,
            "the termination byte ends the receive"
        );
        idn.line = uart_line(9600, false, 500);
        let outcome = run(&mut s, &idn).unwrap();
        assert_eq!(
            &outcome.received[..],
            b"Simulated Station,HV4,ESH10000662,6.4.2\n"
        );
        assert_eq!(
            outcome.wait,
            Duration::from_millis(500),
            "fewer than asked: the timeout"
        );
        // Two replies queued, taken one line at a time with the termination byte.
        let mut two = bus(UART, BusAction::Send, 0, b"*RST\n*RST\n", 0);
        two.line = uart_line(9600, true, 500);
        run(&mut s, &two).unwrap();
        let mut line = bus(UART, BusAction::Receive, 0, &[], 64);
        line.line = uart_line(9600, true, 500);
        assert_eq!(&run(&mut s, &line).unwrap().received[..], b"OK\n");
        let mut clear = bus(UART, BusAction::ClearBuffers, 0, &[], 0);
        clear.line = uart_line(9600, true, 500);
        run(&mut s, &clear).unwrap();
        let empty = run(&mut s, &line).unwrap();
        assert!(empty.received.is_empty());
        assert_eq!(empty.wait, Duration::from_millis(500));
    }

    #[test]
    fn a_wrong_baud_rate_gives_nothing_or_garbage() {
        let mut s = station();
        let mut idn = bus(UART, BusAction::SendReceive, 0, b"*IDN?\n", 16);
        idn.line = uart_line(115_200, true, 200);
        let outcome = run(&mut s, &idn).unwrap();
        assert!(
            outcome.received.is_empty(),
            "the instrument heard no command"
        );
        assert_eq!(outcome.wait, Duration::from_millis(200));
        // A reply already on the line reads as garbage at the wrong rate.
        idn.line = uart_line(9600, true, 200);
        idn.action = BusAction::Send;
        run(&mut s, &idn).unwrap();
        let mut read = bus(UART, BusAction::Receive, 0, &[], 4);
        read.line = uart_line(19_200, true, 200);
        let garbage = run(&mut s, &read).unwrap().received;
        assert_eq!(garbage.len(), 4);
        assert_ne!(&garbage[..], b"Simu");
    }

    #[test]
    fn bad_requests_are_refused_before_the_bus_is_touched() {
        let mut s = station();
        let over = bus(
            I2C,
            BusAction::Receive,
            0x50,
            &[],
            station_protocol::bus::MAX_BUS_RECEIVE + 1,
        );
        assert_eq!(run(&mut s, &over).unwrap_err().code, ErrorCode::BadValue);
        let high = bus(I2C, BusAction::Receive, 0x80, &[], 1);
        assert_eq!(run(&mut s, &high).unwrap_err().code, ErrorCode::BadValue);
        let nobus = bus("TempRegulator.CPU_TEMP", BusAction::Scan, 0, &[], 0);
        assert_eq!(
            run(&mut s, &nobus).unwrap_err().code,
            ErrorCode::UnknownChannel
        );
        let no_line = bus(UART, BusAction::Receive, 0, &[], 1);
        assert_eq!(
            run(&mut s, &no_line).unwrap_err().code,
            ErrorCode::BadSettings
        );
        let mut with_line = bus(I2C, BusAction::Scan, 0, &[], 0);
        with_line.line = uart_line(9600, false, 10);
        assert_eq!(
            run(&mut s, &with_line).unwrap_err().code,
            ErrorCode::BadSettings
        );
        let clear = bus(I2C, BusAction::ClearBuffers, 0x50, &[], 0);
        assert_eq!(
            run(&mut s, &clear).unwrap_err().code,
            ErrorCode::BadSettings
        );
    }

    #[test]
    fn a_profile_with_a_bad_bus_names_the_key() {
        let bad = |bus: &str| {
            let text = format!("{}\n{bus}", crate::profile::DEFAULT_PROFILE_TOML);
            match Profile::from_toml_str(&text, "t.toml") {
                Err(crate::profile::ProfileError::Invalid(invalid)) => invalid,
                other => panic!("accepted: {other:?}"),
            }
        };
        let error = bad("[[bus]]\nchannel = \"No.Such\"\nkind = \"i2c\"\n");
        assert_eq!(error.key, "bus.channel");
        let error = bad("[[bus]]\nchannel = \"TempRegulator.CPU_TEMP\"\nkind = \"spi\"\n");
        assert_eq!(error.key, "bus.kind");
        let text = "[station]\nname = \"S\"\nfirmware = \"1\"\nserial = \"X\"\n\n[[channel]]\nname = \"B.I2C\"\ntypes = [\"I2C\"]\ndirection = \"inout\"\naccess = \"rw\"\nvalue_type = \"bytes\"\nmodel = \"i2c\"\n\n[[bus]]\nchannel = \"B.I2C\"\nkind = \"i2c\"\n[[bus.device]]\nmodel = \"eeprom\"\naddress = 0x05\n";
        let error = match Profile::from_toml_str(text, "t.toml") {
            Err(crate::profile::ProfileError::Invalid(invalid)) => invalid,
            other => panic!("accepted: {other:?}"),
        };
        assert_eq!(error.key, "bus.device");
        assert!(error.message.contains("0x05"), "{error}");
    }
}
