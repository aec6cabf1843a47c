//! `api/comm/i2c`, `api/comm/uart`, `api/comm/spi`: one bus transaction each, as the reference
//! clients send them (PascalCase keys bound in any case, bytes as hex in either case, `Address`
//! and `TerminationByte` as two hex digits), through the station service's bus queue; and
//! `api/comm/socket`, which a station behind the byte protocol does not offer (404 saying why).

use serde_json::{Value as Json, json};
use station_protocol::bus::{
    DEFAULT_RETRIES, MAX_BUS_RECEIVE, MAX_BUS_SEND, MAX_BUS_TIMEOUT_MS, MAX_I2C_ADDRESS,
};
use station_protocol::{
    BusAction, BusRequest, ErrorCode, FlowControl, Parity, UartBusType, UartLine,
};

use super::call::{Answer, Call, known_channels, ok};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::link::LinkError;
use crate::metrics::BusKind;
use crate::station::ChangeWhat;

/// `POST api/comm/i2c {DeviceName, Address, Action, DataToSend?, NumberOfBytesToReceive,
/// MaxRetries}`.
pub(super) async fn i2c(call: Call<'_>) -> Answer {
    transaction(&call, BusKind::I2c).await
}

/// `POST api/comm/uart {DeviceName, Action, BaudRate, BusType, FlowControl, Parity,
/// UseTerminationByte, TerminationByte, DataToSend?, NumberOfBytesToReceive, TimeoutMs}`.
pub(super) async fn uart(call: Call<'_>) -> Answer {
    transaction(&call, BusKind::Uart).await
}

/// `POST api/comm/spi {DeviceName, Action, DataToSend?, NumberOfBytesToReceive}`.
pub(super) async fn spi(call: Call<'_>) -> Answer {
    transaction(&call, BusKind::Spi).await
}

async fn transaction(call: &Call<'_>, kind: BusKind) -> Answer {
    let gateway = call.gateway;
    if !gateway.station.bus_supported() {
        return Err(unsupported(
            kind,
            "it answered an earlier one `unsupported`",
        ));
    }
    let request = parse(call, kind)?;
    let (device, action) = (request.channel.clone(), request.action);
    let sent = request.data.len();
    let metrics = &gateway.metrics.comm;
    let report = call.change(ChangeWhat::Bus(request)).await?;
    let result = report.answer.map(|answer| answer.bus().unwrap_or_default());
    metrics.observe(kind, action, result.as_ref().map(|r| (sent, r.len())).ok());
    let received = result.map_err(|error| match error {
        LinkError::Station(station) if station.code == ErrorCode::Unsupported => {
            unsupported(kind, &station.message)
        }
        LinkError::Station(station) => {
            let mut api = ApiError::from(station);
            if !api.message.contains(device.as_str()) {
                api.message = format!("{device}: {}", api.message);
            }
            api
        }
        other => ApiError::from(other),
    })?;
    ok(json!({
        "deviceName": device,
        "action": action.name(),
        "received": hex_upper(&received),
        "numberOfBytesReceived": received.len(),
    }))
}

fn unsupported(kind: BusKind, why: &str) -> ApiError {
    ApiError::not_implemented(format!(
        "{} transactions are not available: the station does not support bus transactions \
         (BUS); {why}",
        kind.label()
    ))
}

/// The bus request a body asks for, or a 400 naming the field at fault.
fn parse(call: &Call<'_>, kind: BusKind) -> Result<BusRequest, ApiError> {
    let body = &call.body;
    let device = body.string("DeviceName")?.to_owned();
    let channels = known_channels(call.gateway)?;
    let channel = channels
        .get(&device)
        .ok_or_else(|| ApiError::bad_request(format!("DeviceName: no such device: {device}")))?;
    if channel.type_flags & kind.type_flag() == 0 {
        return Err(ApiError::bad_request(format!(
            "DeviceName: {device} is not an {} bus",
            kind.label()
        )));
    }
    let action = action(body, kind)?;
    let data = match body.get("DataToSend") {
        None => Vec::new(),
        Some(value) => hex_field(value, "DataToSend")?,
    };
    if data.len() > MAX_BUS_SEND {
        return Err(ApiError::bad_request(format!(
            "DataToSend: {} bytes is more than the {MAX_BUS_SEND} one transaction sends",
            data.len()
        )));
    }
    let sends = matches!(action, BusAction::Send | BusAction::SendReceive);
    if sends && data.is_empty() {
        return Err(ApiError::bad_request(format!(
            "DataToSend is required for {}: the hex bytes to send, e.g. \"0010\"",
            action.name()
        )));
    }
    let receive = whole(body, "NumberOfBytesToReceive", 0)?;
    if receive > i64::from(MAX_BUS_RECEIVE) {
        return Err(ApiError::bad_request(format!(
            "NumberOfBytesToReceive: {receive} is more than the {MAX_BUS_RECEIVE} one \
             transaction receives"
        )));
    }
    let receive = u16::try_from(receive).map_err(|_| {
        ApiError::bad_request(format!(
            "NumberOfBytesToReceive must be 0 or more, not {receive}"
        ))
    })?;
    let mut request = BusRequest {
        channel: device,
        action,
        address: 0,
        retries: DEFAULT_RETRIES,
        receive,
        data: data.into(),
        line: None,
    };
    match kind {
        BusKind::I2c => {
            request.address = match body.get("Address") {
                None => 0,
                Some(value) => address(value)?,
            };
            let retries = whole(body, "MaxRetries", -1)?;
            request.retries = match retries {
                -1 => DEFAULT_RETRIES,
                0..=254 => retries as u8,
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "MaxRetries must be -1 (the station's default) or 0 to 254, not {retries}"
                    )));
                }
            };
        }
        BusKind::Uart => request.line = Some(uart_line(call)?),
        BusKind::Spi => {}
    }
    Ok(request)
}

fn action(body: &JsonBody, kind: BusKind) -> Result<BusAction, ApiError> {
    let allowed: &[BusAction] = match kind {
        BusKind::I2c => &[
            BusAction::Send,
            BusAction::Receive,
            BusAction::SendReceive,
            BusAction::Scan,
        ],
        BusKind::Uart => &[
            BusAction::Send,
            BusAction::Receive,
            BusAction::SendReceive,
            BusAction::ClearBuffers,
        ],
        BusKind::Spi => &[BusAction::Send, BusAction::Receive, BusAction::SendReceive],
    };
    let names = || {
        allowed
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // The .NET client's default; both clients always send it.
    let Some(value) = body.get("Action") else {
        return Ok(BusAction::Send);
    };
    let given = client_enum("Action", value, BUS_ACTIONS, &names())?;
    BusAction::parse(&given)
        .filter(|action| allowed.contains(action))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Action: {given:?} is not among the {} actions; use one of {}",
                kind.label(),
                names()
            ))
        })
}

/// A whole number field, `default` when absent.
fn whole(body: &JsonBody, name: &str, default: i64) -> Result<i64, ApiError> {
    match body.get(name) {
        None => Ok(default),
        Some(value) => value
            .as_i64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            })
            .ok_or_else(|| {
                ApiError::bad_request(format!("{name} must be a whole number, not {value}"))
            }),
    }
}

/// Bytes from a hex string: digits in either case, two a byte, nothing else.
fn hex_field(value: &Json, name: &str) -> Result<Vec<u8>, ApiError> {
    let text = value.as_str().ok_or_else(|| {
        ApiError::bad_request(format!(
            "{name} must be a string of hex digits, e.g. \"AABB\""
        ))
    })?;
    if let Some(bad) = text.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(format!(
            "{name} is not hex: {bad:?} is not a hex digit (give two digits a byte, e.g. \"AABB\")"
        )));
    }
    if text.len() % 2 != 0 {
        return Err(ApiError::bad_request(format!(
            "{name} has an odd number of hex digits ({}): give two digits a byte",
            text.len()
        )));
    }
    Ok((0..text.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect())
}

/// One byte given as two hex digits (`"50"`), or as a number.
fn byte_field(value: &Json, name: &str) -> Result<u8, ApiError> {
    if let Some(n) = value.as_u64() {
        return u8::try_from(n).map_err(|_| {
            ApiError::bad_request(format!("{name} must be one byte (00 to FF), not {n}"))
        });
    }
    let text = value.as_str().unwrap_or_default();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() || digits.len() > 2 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(format!(
            "{name} must be two hex digits, e.g. \"50\", not {value}"
        )));
    }
    u8::from_str_radix(digits, 16)
        .map_err(|_| ApiError::bad_request(format!("{name} must be two hex digits, not {value}")))
}

fn address(value: &Json) -> Result<u8, ApiError> {
    let address = byte_field(value, "Address")?;
    if address > MAX_I2C_ADDRESS {
        return Err(ApiError::bad_request(format!(
            "Address {address:02X} is above 7F, the highest 7-bit I2C address"
        )));
    }
    Ok(address)
}

/// The clients' enums by number (`WebApiClient/Models/Enums.cs`, whose numbers JSON carries
/// when a caller sends the enum's value; the Python client's `enums.py` lists the same names in
/// the same order), each from 0; `Undefined` is -1 in every one of them.
const BUS_ACTIONS: &[&str] = &[
    "Send",
    "Receive",
    "SendReceive",
    "Scan",
    "Break",
    "ClearBuffers",
    "Reconfigure",
];
const UART_BUS_TYPES: &[&str] = &["RS232", "RS422", "RS485"];
const FLOW_CONTROLS: &[&str] = &[
    "None",
    "XON_XOFF",
    "RTS_CTS",
    "RTS_CTS_AND_XON_XOFF",
    "DTR_DSR",
    "DTR_DSR_AND_XON_XOFF",
];
const PARITIES: &[&str] = &["Even", "Mark", "None", "Odd", "Space"];

/// An enum field's name: given as text, or as the clients' number for it (`numbers`). `served`
/// lists what the gateway takes, for the error.
fn client_enum(
    field: &str,
    value: &Json,
    numbers: &[&str],
    served: &str,
) -> Result<String, ApiError> {
    match value {
        Json::String(text) => Ok(text.clone()),
        Json::Number(n) => match n.as_i64() {
            Some(-1) => Ok("Undefined".to_owned()),
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| numbers.get(i))
                .map(|name| (*name).to_owned())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{field}: {n} is not a number of the clients' enum (-1 to {}); use one of {served}",
                        numbers.len() - 1
                    ))
                }),
            None => Err(ApiError::bad_request(format!(
                "{field}: {n} is not a whole number; use one of {served}"
            ))),
        },
        _ => Err(ApiError::bad_request(format!(
            "{field} must be a name or the clients' number for it: one of {served}"
        ))),
    }
}

/// A line-setting enum field: its name in any case or the clients' number for it, `default`
/// when absent.
fn setting<T: Copy>(
    body: &JsonBody,
    name: &str,
    default: T,
    parse: fn(&str) -> Option<T>,
    (numbers, all): (&[&str], &[&str]),
) -> Result<T, ApiError> {
    let Some(value) = body.get(name) else {
        return Ok(default);
    };
    let served = all.join(", ");
    let given = client_enum(name, value, numbers, &served)?;
    parse(&given)
        .ok_or_else(|| ApiError::bad_request(format!("{name}: {given:?} is not one of {served}")))
}

fn uart_line(call: &Call<'_>) -> Result<UartLine, ApiError> {
    let body = &call.body;
    let baud = whole(body, "BaudRate", 9600)?;
    let baud = u32::try_from(baud).ok().filter(|b| *b > 0).ok_or_else(|| {
        ApiError::bad_request(format!("BaudRate must be above 0, e.g. 9600, not {baud}"))
    })?;
    let bus_names: Vec<&str> = UartBusType::ALL.iter().map(|b| b.name()).collect();
    let bus_type = setting(
        body,
        "BusType",
        UartBusType::Rs232,
        UartBusType::parse,
        (UART_BUS_TYPES, &bus_names),
    )?;
    let flow_names: Vec<&str> = FlowControl::ALL.iter().map(|f| f.name()).collect();
    let flow_control = setting(
        body,
        "FlowControl",
        FlowControl::None,
        FlowControl::parse,
        (FLOW_CONTROLS, &flow_names),
    )?;
    let parity_names: Vec<&str> = Parity::ALL.iter().map(|p| p.name()).collect();
    let parity = setting(
        body,
        "Parity",
        Parity::None,
        Parity::parse,
        (PARITIES, &parity_names),
    )?;
    let use_termination = match body.get("UseTerminationByte") {
        None => false,
        Some(value) => value.as_bool().ok_or_else(|| {
            ApiError::bad_request(format!(
                "UseTerminationByte must be true or false, not {value}"
            ))
        })?,
    };
    let termination_byte = match body.get("TerminationByte") {
        None => b'\n',
        Some(value) => byte_field(value, "TerminationByte")?,
    };
    let timeout = whole(body, "TimeoutMs", 1000)?;
    // The station takes the receive's own time on top of a request's; the transaction must
    // still be over within the longest the station may take over any request
    // (`station.max_processing_ms`), which the lease's end and the lock-delay count on.
    let link = &call.gateway.link;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let most = ms(link.max_processing())
        .saturating_sub(ms(link.request_timeout()))
        .min(u64::from(MAX_BUS_TIMEOUT_MS));
    let timeout_ms = u64::try_from(timeout)
        .ok()
        .filter(|t| *t <= most)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "TimeoutMs must be 0 to {most}, not {timeout}: a transaction must end within \
                 station.max_processing_ms ({} ms), and the station is given \
                 station.request_timeout_ms ({} ms) on top of the receive's own time",
                ms(link.max_processing()),
                ms(link.request_timeout())
            ))
        })?;
    Ok(UartLine {
        baud,
        bus_type,
        flow_control,
        parity,
        use_termination,
        termination_byte,
        timeout_ms: timeout_ms as u32,
    })
}

/// Bytes as upper-case hex, two digits a byte.
fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(hex_upper(&[0xAB, 0x01, 0xFF]), "AB01FF");
    }

    fn body(json: Json) -> JsonBody {
        JsonBody::parse(json.to_string().as_bytes()).unwrap()
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
}
