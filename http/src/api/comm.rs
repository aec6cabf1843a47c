//! `api/comm/i2c`, `api/comm/uart`, `api/comm/spi`: one bus transaction each, as the reference
//! clients send them (their body typed and checked in `requests/comm.rs`), through the station
//! service's bus queue; and
//! `api/comm/socket`, which a station behind the byte protocol does not offer (404 saying why).

use serde_json::json;
use station_protocol::{BusRequest, ErrorCode};

use super::call::{Answer, Call, known_channels, ok};
use crate::error::ApiError;
use crate::link::LinkError;
use crate::metrics::BusKind;
use crate::requests::comm::{BusTransactionRequest, LinkTimes};
use crate::station::ChangeWhat;

/// `POST api/comm/i2c {DeviceName, Address, Action, DataToSend?, NumberOfBytesToReceive,
/// MaxRetries}`.
pub(super) fn i2c(
    call: Call<'_>,
    asked: BusTransactionRequest,
) -> impl Future<Output = Answer> + Send + '_ {
    let request = bus_request(&call, asked, BusKind::I2c);
    transaction(call, request, BusKind::I2c)
}

/// `POST api/comm/uart {DeviceName, Action, BaudRate, BusType, FlowControl, Parity,
/// UseTerminationByte, TerminationByte, DataToSend?, NumberOfBytesToReceive, TimeoutMs}`.
pub(super) fn uart(
    call: Call<'_>,
    asked: BusTransactionRequest,
) -> impl Future<Output = Answer> + Send + '_ {
    let request = bus_request(&call, asked, BusKind::Uart);
    transaction(call, request, BusKind::Uart)
}

/// `POST api/comm/spi {DeviceName, Action, DataToSend?, NumberOfBytesToReceive}`.
pub(super) fn spi(
    call: Call<'_>,
    asked: BusTransactionRequest,
) -> impl Future<Output = Answer> + Send + '_ {
    let request = bus_request(&call, asked, BusKind::Spi);
    transaction(call, request, BusKind::Spi)
}

/// The bus request `asked` of `kind`, checked: before the transaction's future is made, which
/// then holds the smaller request, not the body as typed.
fn bus_request(
    call: &Call<'_>,
    asked: BusTransactionRequest,
    kind: BusKind,
) -> Result<BusRequest, ApiError> {
    let gateway = call.gateway;
    if !gateway.station.bus_supported() {
        return Err(unsupported(
            kind,
            "it answered an earlier one `unsupported`",
        ));
    }
    // Missing or not text: 400 before the station's channels are looked at.
    asked.device_name.value.check()?;
    let times = LinkTimes {
        max_operation: gateway.config.max_operation(),
    };
    asked.into_bus_request(&*known_channels(gateway)?, kind, times)
}

/// The bus transaction `request` (or its refusal) of `kind`.
async fn transaction(
    call: Call<'_>,
    request: Result<BusRequest, ApiError>,
    kind: BusKind,
) -> Answer {
    let gateway = call.gateway;
    let request = request?;
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

/// Bytes as upper-case hex, two digits a byte.
fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_bytes_are_upper_case_hex() {
        assert_eq!(hex_upper(&[0xAB, 0x01, 0xFF]), "AB01FF");
    }
}
