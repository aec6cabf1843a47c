//! The link as the gateway meets it: concurrency and request ids, malformed frames, every
//! fault control, and the serial path through a pseudo-terminal.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::SinkExt;
use station_protocol::{ErrorCode, RawFrame, Request, Response, Value};
use station_simulator::{ClientError, Profile, Simulator};
use tokio::net::TcpStream;

const SHORT: Duration = Duration::from_millis(300);

#[tokio::test]
async fn many_connections_are_served_at_once() {
    let sim = start_default().await;
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(client(&sim).await);
    }
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                for _ in 0..10 {
                    client.read_one(MON_3V3).await.unwrap();
                }
                client
            })
        })
        .collect();
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.unwrap());
    }
    assert_eq!(sim.connection_count(), 16);
    assert_eq!(sim.reads_of(MON_3V3), 160);
    drop(clients);
}

#[tokio::test]
async fn replies_go_out_of_order_matched_by_request_id() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    // UART01 has a 20 ms latency in the profile; PING has none.
    let slow = Request::Transact {
        name: UART01.into(),
        value: Value::String("*IDN?\n".into()),
    };
    send(&mut link, 10, &slow).await;
    send(&mut link, 11, &Request::Ping { nonce: 7 }).await;
    let (first_id, first) = next_reply(&mut link).await;
    let (second_id, second) = next_reply(&mut link).await;
    assert_eq!(first_id, 11);
    assert_eq!(first, Response::Ping { nonce: 7 });
    assert_eq!(second_id, 10);
    assert!(matches!(second, Response::Transact(Value::String(_))));
}

#[tokio::test]
async fn requests_beyond_the_window_are_answered_busy() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    let slow = Request::Read {
        names: vec![UART01.into()],
    };
    for id in 1..=9u32 {
        link.feed(slow.to_frame(id).unwrap()).await.unwrap();
    }
    SinkExt::<RawFrame>::flush(&mut link).await.unwrap();
    let mut busy = Vec::new();
    for _ in 0..9 {
        let (id, response) = next_reply(&mut link).await;
        if let Response::Error(error) = response {
            assert_eq!(error.code, ErrorCode::Busy);
            busy.push(id);
        }
    }
    assert_eq!(busy, [9]);
}

#[tokio::test]
async fn bad_frames_get_errors_and_the_connection_stays_up() {
    let sim = start_default().await;
    let mut link = raw_link(&sim).await;
    link.send(RawFrame {
        opcode: 0x55,
        request_id: 3,
        payload: Default::default(),
    })
    .await
    .unwrap();
    let (id, response) = next_reply(&mut link).await;
    assert_eq!(id, 3);
    assert!(matches!(response, Response::Error(e) if e.code == ErrorCode::Unsupported));

    link.send(RawFrame {
        opcode: 0x04,
        request_id: 4,
        payload: vec![0xFF].into(),
    })
    .await
    .unwrap();
    let (id, response) = next_reply(&mut link).await;
    assert_eq!(id, 4);
    assert!(matches!(response, Response::Error(e) if e.code == ErrorCode::Malformed));

    // A reply too large for one frame is an error, not a broken link.
    let names = vec!["X".to_owned(); 10_000];
    send(&mut link, 5, &Request::Read { names }).await;
    let (id, response) = next_reply(&mut link).await;
    assert_eq!(id, 5);
    assert!(matches!(response, Response::Error(e) if e.message.contains("fit")));

    send(&mut link, 6, &Request::Ping { nonce: 1 }).await;
    assert_eq!(
        next_reply(&mut link).await,
        (6, Response::Ping { nonce: 1 })
    );
}

#[tokio::test]
async fn drop_connections_closes_every_connection() {
    let sim = start_default().await;
    let mut a = client(&sim).await;
    let mut b = client(&sim).await;
    a.ping(1).await.unwrap();
    b.ping(1).await.unwrap();
    assert_eq!(sim.connection_count(), 2);
    sim.drop_connections();
    assert_eq!(sim.connection_count(), 0);
    assert!(a.ping(2).await.is_err());
    assert!(b.ping(2).await.is_err());
    let mut c = client(&sim).await;
    c.ping(3).await.unwrap();
}

#[tokio::test]
async fn a_stalled_station_reads_and_ignores_requests() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client.set_timeout(SHORT);
    sim.set_stall(true);
    assert!(matches!(client.ping(1).await, Err(ClientError::Timeout(_))));
    sim.set_stall(false);
    client.ping(2).await.unwrap();
}

#[tokio::test]
async fn a_corrupt_reply_fails_its_crc_and_the_next_one_is_fine() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client.set_timeout(SHORT);
    sim.corrupt_next_reply();
    assert!(matches!(client.ping(1).await, Err(ClientError::Timeout(_))));
    assert_eq!(client.codec_stats().crc_errors, 1);
    client.ping(2).await.unwrap();
}

#[tokio::test]
async fn replies_can_be_delayed() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    sim.set_reply_delay(Duration::from_millis(200));
    let started = Instant::now();
    client.ping(1).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    sim.set_reply_delay(Duration::ZERO);
    sim.set_processing_time(Duration::from_millis(100));
    let started = Instant::now();
    client.ping(2).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
}

#[tokio::test]
async fn a_station_that_goes_down_refuses_connections_until_it_comes_back() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client.write_one(VSET1, Value::Float(500.0)).await.unwrap();
    sim.power_off().await.unwrap();
    assert!(client.ping(1).await.is_err());
    assert!(TcpStream::connect(sim.local_addr()).await.is_err());
    assert!(TcpStream::connect(sim.local_addr()).await.is_err());
    sim.power_on().await.unwrap();
    let mut client = common::client(&sim).await;
    // A power cycle forgets the set points.
    assert_eq!(client.read_one(VSET1).await.unwrap(), Value::Float(0.0));
    // Refusing alone leaves open connections alone.
    sim.set_refuse_connections(true).await.unwrap();
    client.ping(2).await.unwrap();
    assert!(TcpStream::connect(sim.local_addr()).await.is_err());
    sim.set_refuse_connections(false).await.unwrap();
    common::client(&sim).await.ping(3).await.unwrap();
}

#[tokio::test]
async fn restart_drops_connections_and_resets_the_station() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client
        .write_one(LED_A1, Value::Enum("Red".into()))
        .await
        .unwrap();
    assert!(sim.remove_channel(VMON1));
    sim.restart();
    assert!(client.ping(1).await.is_err());
    let mut client = common::client(&sim).await;
    assert_eq!(
        client.read_one(LED_A1).await.unwrap(),
        Value::Enum("Black".into())
    );
    assert!(client.read_one(VMON1).await.is_ok());
    // The write log is history: it survives the power cycle.
    assert_eq!(sim.write_log().len(), 1);
}

#[tokio::test]
async fn a_client_drives_the_station_through_the_pty() {
    let (sim, path) = Simulator::start_pty(Profile::default_station(), None)
        .await
        .unwrap();
    // Open and close the slave several times: the simulator must survive each close.
    for round in 0..3u64 {
        let port =
            tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 115_200))
                .unwrap();
        let mut client = station_simulator::StationClient::new(port);
        client.set_timeout(Duration::from_secs(3));
        let hello = client.hello("pty test").await.unwrap();
        assert_eq!(hello.window, 1);
        let volts = match client.read_one(MON_3V3).await.unwrap() {
            Value::Float(x) => x,
            other => panic!("not a float: {other:?}"),
        };
        assert!((3.28..=3.32).contains(&volts), "{volts}");
        client
            .write_one(VSET1, Value::Float(100.0 + round as f64))
            .await
            .unwrap();
        let reply = client
            .transact(UART01, Value::String("*IDN?\n".into()))
            .await
            .unwrap();
        assert_eq!(
            reply,
            Value::String("Simulated Station,HV4,ESH10000662,6.4.2\n".into())
        );
    }
    let log = sim.write_log();
    assert_eq!(log.iter().filter(|w| w.channel == VSET1).count(), 3);
    assert!(log.iter().all(|w| w.peer == "pty"));
}

#[tokio::test]
async fn the_pty_can_be_paced_as_a_slow_serial_line() {
    let (_sim, path) = Simulator::start_pty(Profile::default_station(), Some(9600))
        .await
        .unwrap();
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 9600)).unwrap();
    let mut client = station_simulator::StationClient::new(port);
    let started = Instant::now();
    let hello = client.hello("paced").await.unwrap();
    // The HELLO reply is about 60 bytes: at 9600 baud (960 bytes/s) more than 50 ms.
    let reply_bytes = Response::Hello(hello)
        .to_frame(1)
        .unwrap()
        .to_bytes()
        .unwrap()
        .len();
    let line_time = Duration::from_secs_f64(reply_bytes as f64 * 10.0 / 9600.0);
    assert!(
        started.elapsed() >= line_time.mul_f64(0.9),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_detached_pty_disappears_and_a_new_one_can_be_attached() {
    let (sim, path) = Simulator::start_pty(Profile::default_station(), None)
        .await
        .unwrap();
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 115_200))
            .unwrap();
    let mut client = station_simulator::StationClient::new(port);
    client.set_timeout(Duration::from_secs(1));
    client.hello("before").await.unwrap();
    assert!(sim.detach_pty(&path));
    assert!(!sim.detach_pty(&path), "detached twice");
    // The line hangs up: the open client's next request fails, and the device goes away.
    assert!(client.read_one(MON_3V3).await.is_err());
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(2);
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still there",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A new pty serves the same station.
    let again = sim.attach_pty(None).unwrap();
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(again.to_string_lossy(), 115_200))
            .unwrap();
    let mut client = station_simulator::StationClient::new(port);
    client.set_timeout(Duration::from_secs(3));
    client.hello("after").await.unwrap();
    assert!(client.read_one(MON_3V3).await.is_ok());
}
