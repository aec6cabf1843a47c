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
async fn the_pty_is_paced_as_a_slow_serial_line_both_ways() {
    const BAUD: u32 = 38_400;
    let (sim, path) = Simulator::start_pty(Profile::default_station(), Some(BAUD))
        .await
        .unwrap();
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), BAUD)).unwrap();
    let mut client = station_simulator::StationClient::new(port);
    client.set_timeout(Duration::from_secs(5));
    client.hello("paced").await.unwrap();
    // A READ of 20 names: about 550 request bytes and 300 reply bytes, 10 bits each.
    let names: Vec<String> = sim
        .profile()
        .channels
        .iter()
        .filter(|ch| ch.descriptor.readable && !ch.descriptor.consuming)
        .take(20)
        .map(|ch| ch.descriptor.name.clone())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let started = Instant::now();
    let results = client.read(&names).await.unwrap();
    let elapsed = started.elapsed();
    let frame_bytes = |frame: RawFrame| frame.to_bytes().unwrap().len();
    let request_bytes = frame_bytes(
        Request::Read {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
        .to_frame(2)
        .unwrap(),
    );
    let reply_bytes = frame_bytes(Response::Read(results).to_frame(2).unwrap());
    let line_time = |bytes: usize| Duration::from_secs_f64(bytes as f64 * 10.0 / f64::from(BAUD));
    // The request is taken only once its last byte has crossed the line, and the reply is
    // handed over only once its own has: the round trip is at least both.
    let both = line_time(request_bytes) + line_time(reply_bytes);
    assert!(
        elapsed >= both.mul_f64(0.95),
        "a READ of {request_bytes} request and {reply_bytes} reply bytes at {BAUD} baud took {elapsed:?}, less than the {both:?} the line needs"
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

/// A client that opens the serial device after another one closed it is served like the first,
/// and while it sends nothing the station stays idle. (The hang-up the first close left on the
/// master once made the simulator poll it for ever: a core spent on reads that would block,
/// and the station's timers and answers late by tens of milliseconds.)
#[test]
fn a_pty_opened_again_after_a_close_is_served_without_spinning() {
    let (path_tx, path_rx) = std::sync::mpsc::channel();
    let (measure_tx, measure_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel();
    let station = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (_sim, path) = Simulator::start_pty(Profile::default_station(), None)
                .await
                .unwrap();
            path_tx.send(path).unwrap();
            // Each message asks for this thread's CPU time so far (the whole station runs here).
            let mut measure_rx = measure_rx;
            while measure_rx.recv().await.is_some() {
                cpu_tx.send(thread_cpu_ticks()).unwrap();
            }
        });
    });
    let path = path_rx.recv().unwrap();
    let clients = tokio::runtime::Runtime::new().unwrap();
    clients.block_on(async {
        for round in 1..=3 {
            let port =
                tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 115_200))
                    .unwrap();
            let mut client = station_simulator::StationClient::new(port);
            client.set_timeout(Duration::from_secs(3));
            client
                .hello("reopening")
                .await
                .unwrap_or_else(|error| panic!("client {round}: HELLO: {error}"));
            for _ in 0..5 {
                client
                    .read_one(MON_3V3)
                    .await
                    .unwrap_or_else(|error| panic!("client {round}: READ: {error}"));
            }
            if round == 3 {
                // The third client holds the line open and sends nothing for a second.
                measure_tx.send(()).unwrap();
                let before = cpu_rx.recv().unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
                measure_tx.send(()).unwrap();
                let after = cpu_rx.recv().unwrap();
                let ticks_per_second = 100;
                assert!(
                    after - before < ticks_per_second / 4,
                    "the station used {} of {ticks_per_second} CPU ticks in a second with nothing to do",
                    after - before
                );
            }
        }
    });
    drop(measure_tx);
    station.join().unwrap();
}

/// The calling thread's CPU time (user + system) in clock ticks, from /proc.
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// SPEC.md §4 "A closed connection's requests": a request still being carried out when its
/// connection closes is abandoned, and the next connection's requests never find it landing
/// after them. Both writes take the same processing time and the first was sent first, so
/// were it carried out it would be in the write log before the second's answer.
#[tokio::test]
async fn a_request_still_in_progress_when_its_connection_closes_is_abandoned() {
    let sim = start_default().await;
    sim.set_processing_time(Duration::from_millis(300));
    let mut first = raw_link(&sim).await;
    let on = Request::Write {
        items: vec![(ON1.into(), Value::Bool(true))],
    };
    send(&mut first, 1, &on).await;
    drop(first);
    let mut second = raw_link(&sim).await;
    let off = Request::Write {
        items: vec![(ON1.into(), Value::Bool(false))],
    };
    send(&mut second, 1, &off).await;
    assert_eq!(
        next_reply(&mut second).await,
        (1, Response::Write(vec![Ok(())]))
    );
    let on1: Vec<Value> = sim
        .write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .map(|w| w.value)
        .collect();
    assert_eq!(
        on1,
        [Value::Bool(false)],
        "the closed connection's write was carried out after all"
    );
    assert_eq!(sim.requests_abandoned(), 1);
}

/// The faults `set_ignores_close` and `delay_next_write_to`: a station that breaks SPEC.md
/// §4 carries out a closed connection's request anyway, never answering it; the one write
/// made slow lands after the next connection's write, which takes its usual time.
#[tokio::test]
async fn a_station_that_ignores_the_close_carries_out_a_closed_connections_request_late() {
    let sim = start_default().await;
    sim.set_ignores_close(true);
    sim.delay_next_write_to(ON1, Duration::from_millis(600));
    let mut first = raw_link(&sim).await;
    let on = Request::Write {
        items: vec![(ON1.into(), Value::Bool(true))],
    };
    send(&mut first, 1, &on).await;
    drop(first);
    let mut second = raw_link(&sim).await;
    let off = Request::Write {
        items: vec![(ON1.into(), Value::Bool(false))],
    };
    send(&mut second, 1, &off).await;
    assert_eq!(
        next_reply(&mut second).await,
        (1, Response::Write(vec![Ok(())]))
    );
    let on1 = || -> Vec<Value> {
        sim.write_log()
            .into_iter()
            .filter(|w| w.channel == ON1)
            .map(|w| w.value)
            .collect()
    };
    assert_eq!(
        on1(),
        [Value::Bool(false)],
        "only one write took 600 ms more"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while on1().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        on1(),
        [Value::Bool(false), Value::Bool(true)],
        "the closed connection's write was not carried out late"
    );
    assert_eq!(sim.requests_abandoned(), 0);
}
