//! Unit tests of the bus bodies: hex, the clients' enum numbers, addresses, each refused in
//! the words the field reads gave (moved here from `api/comm.rs` with the checks; the helpers
//! below read the field as the handler's typed request does).

use serde::Deserialize;
use serde_json::{Value as Json, json};
use station_protocol::{BusAction, FlowControl, Parity, UartBusType};

use super::*;
use crate::body::JsonBody;

fn body(json: Json) -> JsonBody {
    JsonBody::parse(json.to_string().as_bytes()).unwrap()
}

/// The fields these tests read, typed as in [`BusTransactionRequest`].
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Fields {
    action: Option<ClientEnum>,
    bus_type: Option<ClientEnum>,
    flow_control: Option<ClientEnum>,
    parity: Option<ClientEnum>,
    data_to_send: Deferred<Option<HexBytes>>,
    address: Deferred<Option<BusByte>>,
}

/// `DataToSend` as the request reads it.
fn hex_field(value: &Json, name: &str) -> Result<Vec<u8>, ApiError> {
    assert_eq!(name, "DataToSend");
    let fields: Fields = body(json!({ "DataToSend": value })).typed()?;
    Ok(fields
        .data_to_send
        .checked()?
        .map(|HexBytes(data)| data)
        .unwrap_or_default())
}

/// `Action` of `kind` as the request reads it.
fn action(body: &JsonBody, kind: BusKind) -> Result<BusAction, ApiError> {
    bus_action(body.typed::<Fields>()?.action, kind)
}

/// A UART line setting as the request reads it.
fn setting<T: Copy>(
    body: &JsonBody,
    name: &str,
    default: T,
    parse: fn(&str) -> Option<T>,
    tables: (&[&str], &[&str]),
) -> Result<T, ApiError> {
    let fields: Fields = body.typed()?;
    let given = match name {
        "BusType" => fields.bus_type,
        "FlowControl" => fields.flow_control,
        "Parity" => fields.parity,
        other => panic!("{other} is not a line setting"),
    };
    super::setting(given, name, default, parse, tables)
}

/// An I2C `Address` as the request reads it.
fn address(value: &Json) -> Result<u8, ApiError> {
    let fields: Fields = body(json!({ "Address": value })).typed()?;
    let BusByte(address) = fields.address.checked()?.expect("an address was sent");
    i2c_address(address)
}

#[test]
fn hex_reads_either_case_and_names_the_field_when_wrong() {
    assert_eq!(
        hex_field(&json!("aaBB01"), "DataToSend").unwrap(),
        vec![0xAA, 0xBB, 1]
    );
    assert_eq!(
        hex_field(&json!(""), "DataToSend").unwrap(),
        Vec::<u8>::new()
    );
    let odd = hex_field(&json!("ABC"), "DataToSend").unwrap_err();
    assert!(
        odd.message.starts_with("DataToSend has an odd number"),
        "{}",
        odd.message
    );
    let bad = hex_field(&json!("ZZ"), "DataToSend").unwrap_err();
    assert!(
        bad.message.starts_with("DataToSend is not hex"),
        "{}",
        bad.message
    );
    assert!(hex_field(&json!(12), "DataToSend").is_err());
}

/// Every number of the clients' `BusActions` (-1 Undefined, 0 Send, 1 Receive,
/// 2 SendReceive, 3 Scan, 4 Break, 5 ClearBuffers, 6 Reconfigure): a number read as its
/// neighbour would turn a read into a write.
#[test]
fn each_number_of_the_clients_bus_actions_is_the_action_of_that_name() {
    let on = |kind: BusKind, n: i64| action(&body(json!({ "Action": n })), kind);
    assert_eq!(on(BusKind::I2c, 0).unwrap(), BusAction::Send);
    assert_eq!(on(BusKind::I2c, 1).unwrap(), BusAction::Receive);
    assert_eq!(on(BusKind::I2c, 2).unwrap(), BusAction::SendReceive);
    assert_eq!(on(BusKind::I2c, 3).unwrap(), BusAction::Scan);
    assert_eq!(on(BusKind::Uart, 5).unwrap(), BusAction::ClearBuffers);
    assert_eq!(on(BusKind::Spi, 1).unwrap(), BusAction::Receive);
    for (n, named) in [(-1, "Undefined"), (4, "Break"), (6, "Reconfigure")] {
        let refused = on(BusKind::Uart, n).unwrap_err();
        assert!(
            refused
                .message
                .contains(&format!("{named:?} is not among the UART actions")),
            "{n}: {}",
            refused.message
        );
    }
    let scan_on_spi = on(BusKind::Spi, 3).unwrap_err();
    assert!(
        scan_on_spi.message.contains("\"Scan\""),
        "{}",
        scan_on_spi.message
    );
    let beyond = on(BusKind::I2c, 7).unwrap_err();
    assert!(
        beyond
            .message
            .contains("7 is not a number of the clients' enum (-1 to 6)"),
        "{}",
        beyond.message
    );
    assert_eq!(
        action(&body(json!({ "Action": "sendreceive" })), BusKind::I2c).unwrap(),
        BusAction::SendReceive
    );
    assert_eq!(
        action(&body(json!({})), BusKind::I2c).unwrap(),
        BusAction::Send
    );
}

/// The UART line's enums by the clients' numbers: `UartBusTypes` RS232 0, RS422 1,
/// RS485 2; `FlowControlTypes` None 0 to DTR_DSR_AND_XON_XOFF 5; `ParityTypes` Even 0,
/// Mark 1, None 2, Odd 3, Space 4.
#[test]
fn each_number_of_the_clients_uart_enums_is_the_setting_of_that_name() {
    let bus = |n: i64| {
        let names: Vec<&str> = UartBusType::ALL.iter().map(|b| b.name()).collect();
        setting(
            &body(json!({ "BusType": n })),
            "BusType",
            UartBusType::Rs232,
            UartBusType::parse,
            (UART_BUS_TYPES, &names),
        )
    };
    assert_eq!(bus(0).unwrap(), UartBusType::Rs232);
    assert_eq!(bus(1).unwrap(), UartBusType::Rs422);
    assert_eq!(bus(2).unwrap(), UartBusType::Rs485);
    assert!(bus(3).is_err() && bus(-1).is_err());
    let flow = |n: i64| {
        let names: Vec<&str> = FlowControl::ALL.iter().map(|f| f.name()).collect();
        setting(
            &body(json!({ "FlowControl": n })),
            "FlowControl",
            FlowControl::None,
            FlowControl::parse,
            (FLOW_CONTROLS, &names),
        )
    };
    assert_eq!(flow(0).unwrap(), FlowControl::None);
    assert_eq!(flow(1).unwrap(), FlowControl::XonXoff);
    assert_eq!(flow(2).unwrap(), FlowControl::RtsCts);
    assert_eq!(flow(3).unwrap(), FlowControl::RtsCtsAndXonXoff);
    assert_eq!(flow(4).unwrap(), FlowControl::DtrDsr);
    assert_eq!(flow(5).unwrap(), FlowControl::DtrDsrAndXonXoff);
    assert!(flow(6).is_err());
    let parity = |n: Json| {
        let names: Vec<&str> = Parity::ALL.iter().map(|p| p.name()).collect();
        setting(
            &body(json!({ "Parity": n })),
            "Parity",
            Parity::None,
            Parity::parse,
            (PARITIES, &names),
        )
    };
    assert_eq!(parity(json!(0)).unwrap(), Parity::Even);
    assert_eq!(parity(json!(1)).unwrap(), Parity::Mark);
    assert_eq!(parity(json!(2)).unwrap(), Parity::None);
    assert_eq!(parity(json!(3)).unwrap(), Parity::Odd);
    assert_eq!(parity(json!(4)).unwrap(), Parity::Space);
    assert_eq!(parity(json!("odd")).unwrap(), Parity::Odd);
    let bad = parity(json!(1.5)).unwrap_err();
    assert!(
        bad.message.contains("Parity: 1.5 is not a whole number"),
        "{}",
        bad.message
    );
}

#[test]
fn addresses_are_two_hex_digits_up_to_7f() {
    assert_eq!(address(&json!("50")).unwrap(), 0x50);
    assert_eq!(address(&json!("7f")).unwrap(), 0x7F);
    assert_eq!(address(&json!("0x48")).unwrap(), 0x48);
    assert_eq!(address(&json!(72)).unwrap(), 72);
    let high = address(&json!("80")).unwrap_err();
    assert!(
        high.message.contains("Address 80 is above 7F"),
        "{}",
        high.message
    );
    for bad in [
        json!("123"),
        json!("G1"),
        json!(""),
        json!(true),
        json!(300),
    ] {
        assert!(
            address(&bad).unwrap_err().message.contains("Address"),
            "{bad}"
        );
    }
}

/// The bus fields' own words, the field named first as the handler's reads named it.
#[test]
fn bus_fields_are_refused_naming_the_field_and_the_value_sent() {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Line {
        max_retries: Deferred<Option<BusWhole>>,
        termination_byte: Deferred<Option<BusByte>>,
        use_termination_byte: Deferred<Option<BusFlag>>,
    }
    let line = |sent: Json| body(sent).typed::<Line>().unwrap();
    let sent = line(json!({
        "maxRetries": "x",
        "TERMINATIONBYTE": 300,
        "UseTerminationByte": 1
    }));
    assert_eq!(
        sent.max_retries.checked().unwrap_err().message,
        "MaxRetries must be a whole number, not \"x\""
    );
    assert_eq!(
        sent.termination_byte.checked().unwrap_err().message,
        "TerminationByte must be one byte (00 to FF), not 300"
    );
    assert_eq!(
        sent.use_termination_byte.checked().unwrap_err().message,
        "UseTerminationByte must be true or false, not 1"
    );
    let sent =
        line(json!({"MaxRetries": 3.0, "TerminationByte": "0x0d", "UseTerminationByte": true}));
    assert_eq!(sent.max_retries.checked().unwrap(), Some(BusWhole(3)));
    assert_eq!(
        sent.termination_byte.checked().unwrap(),
        Some(BusByte(0x0D))
    );
    assert_eq!(
        sent.use_termination_byte.checked().unwrap(),
        Some(BusFlag(true))
    );
    let sent = line(json!({"MaxRetries": null, "TerminationByte": "G"}));
    assert_eq!(sent.max_retries.checked().unwrap(), None);
    assert_eq!(
        sent.termination_byte.checked().unwrap_err().message,
        "TerminationByte must be two hex digits, e.g. \"50\", not \"G\""
    );
}
