//! Bus transactions through the gateway: one bus's transactions in arrival order,
//! never retried, the lease rule over HTTP and the legacy listener, metrics, and a station
//! without BUS (501, `comm` left out of the capabilities).

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{Value as Json, json};
use station_protocol::bus::DEFAULT_RETRIES;
use station_protocol::{
    BusAction, BusRequest, ChannelDescriptor, Direction, ErrorCode, HelloReply, Request, Response,
    StationCodec, StationError, Value, ValueType,
};
use station_simulator::{ClientError, StationClient};
use tokio::net::TcpListener;
use tokio_util::codec::Framed;

use common::{MON_3V3, Rig, config_for, legacy_rig, rig, rig_on};

const I2C: &str = "0.ESH10000023.I2C09";
const UART: &str = "0.ESH10000023.UART01";

fn eeprom_write(data: &str) -> Json {
    json!({ "DeviceName": I2C, "Address": "50", "Action": "Send", "DataToSend": data })
}

/// Bus transactions the station applied, in order: (channel, bytes as hex).
fn bus_writes(rig: &Rig) -> Vec<(String, String)> {
    rig.sim
        .write_log()
        .into_iter()
        .filter(|w| w.channel.contains("I2C") || w.channel.contains("UART"))
        .map(|w| (w.channel, w.value.render()))
        .collect()
}

#[tokio::test]
async fn one_buss_transactions_go_out_in_arrival_order_and_other_buses_do_not_wait() {
    let rig = rig(|_| {}).await;
    // A UART receive that waits out its timeout holds the UART's queue for 600 ms.
    let slow = json!({
        "DeviceName": UART, "Action": "Receive", "BaudRate": 9600,
        "NumberOfBytesToReceive": 8, "TimeoutMs": 600,
    });
    let started = Instant::now();
    let first = rig.post("comm/uart", slow.clone());
    let second = async {
        // Arrives after the first (which is already waiting on the bus).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = rig
            .post(
                "comm/uart",
                json!({ "DeviceName": UART, "Action": "ClearBuffers", "BaudRate": 9600 }),
            )
            .await;
        (status, body, started.elapsed())
    };
    let other_bus = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = rig
            .post(
                "comm/i2c",
                json!({ "DeviceName": I2C, "Address": "00", "Action": "Scan" }),
            )
            .await;
        (status, body, started.elapsed())
    };
    let ((s1, b1), (s2, _, second_done), (s3, b3, scan_done)) =
        tokio::join!(first, second, other_bus);
    assert_eq!((s1, s2, s3), (200, 200, 200), "{b1} {b3}");
    assert_eq!(b1["numberOfBytesReceived"], 0, "{b1}");
    assert!(
        second_done >= Duration::from_millis(600),
        "the second UART transaction overtook the first: done after {second_done:?}"
    );
    assert!(
        scan_done < Duration::from_millis(550),
        "the I2C scan waited for the UART: done after {scan_done:?}"
    );
    assert_eq!(b3["received"], "4850");

    // Many transactions on one bus, sent at once, are applied in the order they arrived.
    let posts = (0..8u8).map(|i| {
        let rig = &rig;
        async move {
            tokio::time::sleep(Duration::from_millis(u64::from(i) * 15)).await;
            rig.post(
                "comm/i2c",
                eeprom_write(&format!("{:02X}{i:02X}", 0x70 + i)),
            )
            .await
        }
    });
    for (status, body) in futures::future::join_all(posts).await {
        assert_eq!(status, 200, "{body}");
    }
    let order: Vec<String> = bus_writes(&rig).into_iter().map(|(_, v)| v).collect();
    let expected: Vec<String> = (0..8u8)
        .map(|i| format!("{:02X}{i:02X}", 0x70 + i))
        .collect();
    assert_eq!(order, expected);
}

#[tokio::test]
async fn a_transaction_whose_answer_is_lost_is_not_retried() {
    let rig = rig(|_| {}).await;
    rig.sim.corrupt_next_reply();
    let (status, body) = rig.post("comm/i2c", eeprom_write("6401")).await;
    assert!(status >= 500, "{status} {body}");
    // Applied once at the station, however the gateway heard of it.
    common::until(Duration::from_secs(5), "the station to apply it", || {
        !bus_writes(&rig).is_empty()
    })
    .await;
    assert_eq!(bus_writes(&rig), vec![(I2C.to_owned(), "6401".to_owned())]);
}

#[tokio::test]
async fn a_non_holder_gets_423_naming_the_holder_and_the_holder_goes_through() {
    let rig = rig(|_| {}).await;
    let lease = rig.take_lease("TAT station 3").await;
    let (status, body) = rig.post("comm/i2c", eeprom_write("6599")).await;
    assert_eq!(status, 423, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("TAT station 3"),
        "{body}"
    );
    assert!(
        bus_writes(&rig).is_empty(),
        "a refused transaction reached the station"
    );
    let response = rig
        .http
        .post(rig.url("comm/i2c"))
        .header("X-Lease-Id", &lease)
        .json(&eeprom_write("6542"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(bus_writes(&rig), vec![(I2C.to_owned(), "6542".to_owned())]);
    rig.release_lease(&lease).await;
}

fn legacy_bus(data: &[u8]) -> Request {
    Request::Bus(BusRequest {
        channel: I2C.into(),
        action: BusAction::Send,
        address: 0x50,
        retries: DEFAULT_RETRIES,
        receive: 0,
        data: Bytes::copy_from_slice(data),
        line: None,
    })
}

#[tokio::test]
async fn the_legacy_listener_forwards_bus_under_the_lease_rule() {
    let rig = legacy_rig(|_| {}).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    let scan = Request::Bus(BusRequest {
        channel: I2C.into(),
        action: BusAction::Scan,
        address: 0,
        retries: DEFAULT_RETRIES,
        receive: 0,
        data: Bytes::new(),
        line: None,
    });
    assert_eq!(
        client.request(scan).await.unwrap(),
        Response::Bus(Bytes::from_static(&[0x48, 0x50]))
    );
    let lease = rig.take_lease("TAT station 3").await;
    match client.request(legacy_bus(&[0x66, 0x01])).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(error.message.contains("TAT station 3"), "{error}");
        }
        other => panic!("a legacy BUS while the lease is held: {other:?}"),
    }
    assert!(bus_writes(&rig).is_empty());
    rig.release_lease(&lease).await;
    client.request(legacy_bus(&[0x66, 0x02])).await.unwrap();
    assert_eq!(bus_writes(&rig), vec![(I2C.to_owned(), "6602".to_owned())]);
}

#[tokio::test]
async fn transactions_are_counted_per_bus_and_action() {
    let rig = rig(|_| {}).await;
    let scan = json!({ "DeviceName": I2C, "Address": "00", "Action": "Scan" });
    assert_eq!(rig.post("comm/i2c", scan).await.0, 200);
    let nak = json!({ "DeviceName": I2C, "Address": "33", "Action": "Receive", "NumberOfBytesToReceive": 1 });
    assert_eq!(rig.post("comm/i2c", nak).await.0, 500);
    let (_, text) = rig.get_text("/metrics").await;
    for line in [
        "station_gateway_comm_transactions_total{bus=\"I2C\",action=\"Scan\",result=\"ok\"} 1",
        "station_gateway_comm_transactions_total{bus=\"I2C\",action=\"Receive\",result=\"error\"} 1",
        "station_gateway_comm_bytes_total{bus=\"I2C\",direction=\"received\"} 2",
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
}

/// A station from before BUS: HELLO, SYSTEM, LIST with one I2C channel, and `unsupported` for
/// every other request.
async fn old_station(listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut framed = Framed::new(stream, StationCodec::new());
            while let Some(Ok(frame)) = framed.next().await {
                let response = match Request::from_frame(&frame) {
                    Ok(Request::Hello(_)) => Response::Hello(HelloReply {
                        version: 1,
                        station: "old".into(),
                        firmware: "5.0".into(),
                        serial: "OLD1".into(),
                        window: 1,
                    }),
                    Ok(Request::System) => Response::System(vec![]),
                    Ok(Request::List { offset, .. }) => Response::List {
                        total: 1,
                        offset,
                        channels: if offset == 0 {
                            vec![ChannelDescriptor {
                                name: I2C.into(),
                                alias: String::new(),
                                net_name: String::new(),
                                type_flags: 32_768,
                                direction: Direction::InOut,
                                unit: String::new(),
                                description: String::new(),
                                group: String::new(),
                                readable: true,
                                writable: true,
                                consuming: true,
                                value_type: ValueType::Bytes,
                                options: vec![],
                            }]
                        } else {
                            vec![]
                        },
                    },
                    Ok(Request::Read { names }) => Response::Read(
                        names
                            .iter()
                            .map(|_| Ok(Value::Bytes(Bytes::new())))
                            .collect(),
                    ),
                    _ => Response::Error(StationError::new(
                        ErrorCode::Unsupported,
                        format!("opcode 0x{:02X} is not supported", frame.opcode),
                    )),
                };
                if framed
                    .send(response.to_frame(frame.request_id).unwrap())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
}

#[tokio::test]
async fn a_station_without_bus_gets_501_and_no_comm_capability() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(old_station(listener));
    let sim = common::default_simulator().await;
    let mut config = config_for(&sim, |_| {});
    config.station.url = format!("tcp://{addr}");
    let rig = rig_on(sim, config, false).await;
    let (_, caps) = rig.get("capabilities").await;
    assert!(
        caps["features"]
            .as_array()
            .unwrap()
            .contains(&json!("comm"))
    );
    let scan = json!({ "DeviceName": I2C, "Address": "00", "Action": "Scan" });
    let (status, body) = rig.post("comm/i2c", scan.clone()).await;
    assert_eq!(status, 501, "{body}");
    assert!(body["error"].as_str().unwrap().contains("BUS"), "{body}");
    let (_, caps) = rig.get("capabilities").await;
    assert!(
        !caps["features"]
            .as_array()
            .unwrap()
            .contains(&json!("comm")),
        "{caps}"
    );
    // And it is not asked again on this connection.
    let (status, _) = rig.post("comm/i2c", scan).await;
    assert_eq!(status, 501);
}

/// A UART receive carries its own deadline: with a request timeout of 300 ms, a `TimeoutMs` of
/// 1 000 is waited out and answered 200 with what came (nothing), not 400 for being longer than
/// the request timeout nor 504; the link adds the receive's time to the request's (and keeps a
/// receive it did not hear back from in doubt that much longer). Past
/// `station.max_operation_ms` it is 400 naming it.
#[tokio::test]
async fn a_uart_receive_longer_than_the_request_timeout_is_waited_out() {
    let rig = rig(|config| {
        config.station.request_timeout_ms = 300;
        config.station.max_processing_ms = Some(2_000);
        config.station.max_operation_ms = 1_500;
    })
    .await;
    let receive = |timeout_ms: u64| {
        json!({
            "DeviceName": UART, "Action": "Receive", "BaudRate": 9600,
            "NumberOfBytesToReceive": 8, "TimeoutMs": timeout_ms,
        })
    };
    let started = Instant::now();
    let (status, body) = rig.post("comm/uart", receive(1_000)).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["numberOfBytesReceived"], 0, "{body}");
    assert!(took >= Duration::from_millis(1_000), "{took:?}");
    // The link is still up and serving.
    assert_eq!(rig.read(MON_3V3).await.0, 200);
    let (status, body) = rig.post("comm/uart", receive(1_501)).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("0 to 1500") && message.contains("station.max_operation_ms"),
        "{message}"
    );
}
