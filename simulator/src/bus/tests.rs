//! Tests of the BUS operation on the default station's buses (`bus.rs`).

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
