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
use crate::error::ApiError;
use crate::http::body::JsonBody;
use crate::link::LinkError;
use crate::metrics::BusKind;
use crate::station::ChangeWhat;

/// A UART receive must end this long before the gateway stops waiting for the station.
const UART_TIMEOUT_MARGIN_MS: u64 = 500;

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
    let given = match value {
        Json::String(text) => text.clone(),
        // The numbers of the clients' BusActions enum.
        Json::Number(n) => match n.as_u64() {
            Some(1) => "Send".into(),
            Some(2) => "Receive".into(),
            Some(3) => "SendReceive".into(),
            Some(4) => "Scan".into(),
            Some(6) => "ClearBuffers".into(),
            _ => n.to_string(),
        },
        _ => {
            return Err(ApiError::bad_request(format!(
                "Action must be a string: one of {}",
                names()
            )));
        }
    };
    BusAction::parse(&given)
        .filter(|action| allowed.contains(action))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Action: {given:?} is not an {} action; use one of {}",
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

/// A line-setting enum field: its name in any case, `default` when absent.
fn setting<T: Copy>(
    body: &JsonBody,
    name: &str,
    default: T,
    parse: fn(&str) -> Option<T>,
    all: &[&str],
) -> Result<T, ApiError> {
    match body.get(name) {
        None => Ok(default),
        Some(value) => value.as_str().and_then(parse).ok_or_else(|| {
            ApiError::bad_request(format!("{name}: {value} is not one of {}", all.join(", ")))
        }),
    }
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
        &bus_names,
    )?;
    let flow_names: Vec<&str> = FlowControl::ALL.iter().map(|f| f.name()).collect();
    let flow_control = setting(
        body,
        "FlowControl",
        FlowControl::None,
        FlowControl::parse,
        &flow_names,
    )?;
    let parity_names: Vec<&str> = Parity::ALL.iter().map(|p| p.name()).collect();
    let parity = setting(body, "Parity", Parity::None, Parity::parse, &parity_names)?;
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
    let waits_ms = u64::try_from(call.gateway.link.request_timeout().as_millis()).unwrap_or(0);
    let most = waits_ms
        .saturating_sub(UART_TIMEOUT_MARGIN_MS)
        .min(u64::from(MAX_BUS_TIMEOUT_MS));
    let timeout_ms = u64::try_from(timeout)
        .ok()
        .filter(|t| *t <= most)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "TimeoutMs must be 0 to {most}, not {timeout}: the gateway waits {waits_ms} ms \
                 for the station (station.request_timeout_ms) and the receive must end \
                 {UART_TIMEOUT_MARGIN_MS} ms before"
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
