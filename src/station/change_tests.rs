//! Tests of the station service's changes (write, transact) and its `Debug`, against the
//! simulator: what mutation testing (RELIABILITY.md) found no unit test pinned.

use std::time::Duration;

use station_protocol::Value;
use station_simulator::{Profile, Simulator};
use tokio_util::sync::CancellationToken;

use super::Station;
use crate::lease::Admitted;

const VSET1: &str = "0.4.ESH10000662.VSET1";
const VSET2: &str = "0.4.ESH10000662.VSET2";
const ISET1: &str = "0.4.ESH10000662.ISET1";

fn link_settings(url: &str) -> crate::link::LinkSettings {
    crate::link::LinkSettings {
        url: crate::link::StationUrl::parse(url).unwrap(),
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(100),
        max_names_per_read: 64,
        coalesce_quiet: Duration::ZERO,
        coalesce_max: Duration::ZERO,
        queue_depth: 8,
        client_name: "station change test".into(),
    }
}

/// Nobody holds the lease: no fence, no send guard, nothing restricted to the cache.
fn open_admission() -> Admitted {
    Admitted {
        fence: None,
        guard: None,
        cache_only: None,
    }
}

#[test]
fn debug_names_the_service_and_nothing_of_its_link() {
    let (_task, link) = crate::link::LinkTask::new(link_settings("tcp://127.0.0.1:1"));
    assert_eq!(
        format!(
            "{:?}",
            Station::new(link, crate::audit::AuditLog::memory_only())
        ),
        "Station { .. }"
    );
}

#[tokio::test]
async fn write_and_transact_reach_the_station_and_answer_what_it_did() {
    let sim = Simulator::start(Profile::default_station(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("tcp://{}", sim.local_addr());
    let (task, link) = crate::link::LinkTask::new(link_settings(&url));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(task.run(shutdown.clone()));
    let station = Station::new(link, crate::audit::AuditLog::memory_only());
    let mut info = station.link.watch_info();
    tokio::time::timeout(Duration::from_secs(5), info.wait_for(|i| i.connected))
        .await
        .expect("the link never reached the simulator")
        .unwrap();
    let admitted = open_admission();

    let statuses = station
        .write(
            vec![
                (VSET1.to_owned(), Value::Float(100.0)),
                (ISET1.to_owned(), Value::Float(5.0)),
                ("NO.SUCH.CHANNEL".to_owned(), Value::Float(1.0)),
            ],
            &admitted,
        )
        .await
        .unwrap();
    assert_eq!(statuses.len(), 3, "one status per item: {statuses:?}");
    assert!(statuses[0].is_ok() && statuses[1].is_ok(), "{statuses:?}");
    assert!(statuses[2].is_err(), "{statuses:?}");
    let written: Vec<(String, Value)> = sim
        .write_log()
        .into_iter()
        .map(|record| (record.channel, record.value))
        .collect();
    assert_eq!(
        written,
        vec![
            (VSET1.to_owned(), Value::Float(100.0)),
            (ISET1.to_owned(), Value::Float(5.0)),
        ]
    );

    let read_back = station
        .transact(VSET2.to_owned(), Value::Float(250.0), &admitted)
        .await
        .unwrap();
    assert_eq!(read_back, Value::Float(250.0));
    let last = sim.write_log().pop().expect("the transact wrote nothing");
    assert_eq!(
        (last.channel.as_str(), last.value),
        (VSET2, Value::Float(250.0))
    );

    shutdown.cancel();
    running.await.unwrap();
}
