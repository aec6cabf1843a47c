//! Tests of the station service's changes (write, transact) and its `Debug`, against the
//! simulator: what mutation testing (RELIABILITY.md) found no unit test pinned.

use std::time::{Duration, Instant};

use station_protocol::Value;
use station_simulator::{Profile, Simulator};
use tokio_util::sync::CancellationToken;

use super::{
    Change, ChangeAnswer, ChangeOrigin, ChangeOutcome, ChangeWhat, FrontEnd, Station, Step,
    StepAction, StillRunning,
};
use crate::lease::Admitted;
use crate::link::LinkError;

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

/// A station service on a link to a fresh simulator, connected; its audit trail in memory.
async fn connected_station() -> (
    Station,
    station_simulator::SimulatorHandle,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
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
    (station, sim, shutdown, running)
}

fn legacy_origin(operation: &'static str) -> ChangeOrigin {
    let peer = "127.0.0.1:4001".parse().unwrap();
    let mut origin = ChangeOrigin::new(FrontEnd::Legacy { operation }, peer, Instant::now());
    origin.asked = Some(operation.to_owned());
    origin
}

fn change(what: ChangeWhat, operation: &'static str) -> Change {
    Change {
        what,
        origin: legacy_origin(operation),
        admitted: open_admission(),
    }
}

/// A scan of the I2C bus `channel`.
fn bus_scan(channel: &str) -> station_protocol::BusRequest {
    station_protocol::BusRequest {
        channel: channel.into(),
        action: station_protocol::BusAction::Scan,
        address: 0,
        retries: station_protocol::bus::DEFAULT_RETRIES,
        receive: 0,
        data: bytes::Bytes::new(),
        line: None,
    }
}

/// The last change line the station service wrote.
fn last_line(station: &Station) -> String {
    station
        .changes
        .audit
        .recent_changes()
        .pop()
        .expect("no change line was written")
}

#[tokio::test]
async fn write_and_transact_reach_the_station_and_answer_what_it_did_each_with_its_line() {
    let (station, sim, shutdown, running) = connected_station().await;
    let what = ChangeWhat::Write(vec![
        (VSET1.to_owned(), Value::Float(100.0)),
        (ISET1.to_owned(), Value::Float(5.0)),
        ("NO.SUCH.CHANNEL".to_owned(), Value::Float(1.0)),
    ]);
    let origin = legacy_origin("write");
    assert!(!origin.line_taken());
    let report = station
        .change(Change {
            what,
            origin: origin.clone(),
            admitted: open_admission(),
        })
        .await
        .unwrap();
    assert!(origin.line_taken(), "the change took the line");
    let statuses = report.answer.unwrap().written().unwrap();
    assert_eq!(statuses.len(), 3, "one status per item: {statuses:?}");
    assert!(statuses[0].is_ok() && statuses[1].is_ok(), "{statuses:?}");
    assert!(statuses[2].is_err(), "{statuses:?}");
    assert!(matches!(report.outcome, ChangeOutcome::Partial { .. }));
    let line = last_line(&station);
    assert!(
        line.contains(" LEGACY write - ") && line.contains(" outcome=partial "),
        "{line}"
    );
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

    let what = ChangeWhat::Transact {
        name: VSET2.to_owned(),
        value: Value::Float(250.0),
    };
    let report = station.change(change(what, "transact")).await.unwrap();
    assert_eq!(report.outcome, ChangeOutcome::Applied);
    assert_eq!(
        report.answer.unwrap().transacted(),
        Some(Value::Float(250.0))
    );
    let last = sim.write_log().pop().expect("the transact wrote nothing");
    assert_eq!(
        (last.channel.as_str(), last.value),
        (VSET2, Value::Float(250.0))
    );
    assert!(
        last_line(&station).contains(" LEGACY transact - "),
        "{}",
        last_line(&station)
    );

    shutdown.cancel();
    running.await.unwrap();
}

#[tokio::test]
async fn steps_run_in_order_and_stop_at_the_first_the_station_refuses() {
    let (station, sim, shutdown, running) = connected_station().await;
    let write = |name: &str, value: f64| Step {
        label: format!("write {name}"),
        action: StepAction::Write {
            name: name.to_owned(),
            value: Value::Float(value),
        },
    };
    let configure = Step {
        label: format!("configure {VSET1}"),
        action: StepAction::Configure(station_protocol::Configure {
            name: VSET1.to_owned(),
            settings: vec![("unit".to_owned(), Value::String("kV".into()))],
        }),
    };
    let steps = vec![
        configure,
        write(VSET1, 10.0),
        write("NO.SUCH.CHANNEL", 1.0),
        write(ISET1, 2.0),
    ];
    let report = station
        .change(change(ChangeWhat::Steps(steps), "load"))
        .await
        .unwrap();
    let done = report.answer.clone().unwrap().stepped().unwrap();
    assert_eq!(done.done.len(), 2, "two steps carried out");
    assert!(done.done[0].is_some(), "a configure step keeps its answer");
    assert!(done.done[1].is_none());
    assert!(matches!(done.stopped, Some((2, _))), "{:?}", done.stopped);
    assert!(
        matches!(&report.outcome, ChangeOutcome::Partial { applied, not_applied, .. }
            if applied.len() == 2 && not_applied.len() == 2),
        "{:?}",
        report.outcome
    );
    let channels: Vec<String> = sim.write_log().into_iter().map(|w| w.channel).collect();
    assert_eq!(channels, [VSET1], "nothing after the refused step was sent");
    assert!(
        last_line(&station).contains(&format!("applied=\"configure {VSET1}; write {VSET1}\"")),
        "{}",
        last_line(&station)
    );
    shutdown.cancel();
    running.await.unwrap();
}

#[tokio::test]
async fn a_reset_and_a_bus_transaction_are_changes_with_their_answers() {
    let (station, sim, shutdown, running) = connected_station().await;
    let resets = sim.resets();
    let reset = ChangeWhat::Reset {
        requester: "change test".into(),
    };
    let report = station.change(change(reset, "reset")).await.unwrap();
    assert!(
        matches!(report.answer, Ok(ChangeAnswer::Reset)),
        "{:?}",
        report.answer
    );
    assert_eq!(sim.resets(), resets + 1);
    let mut info = station.link.watch_info();
    tokio::time::timeout(Duration::from_secs(5), info.wait_for(|i| i.connected))
        .await
        .expect("the link never came back after the reset")
        .unwrap();
    let scan = bus_scan("0.ESH10000023.I2C09");
    let report = station.change(change(ChangeWhat::Bus(scan), "bus")).await;
    let report = report.unwrap();
    assert!(report.answer.is_ok(), "{:?}", report.answer);
    assert!(
        !report.answer.unwrap().bus().unwrap().is_empty(),
        "the scan found devices"
    );
    assert!(last_line(&station).contains(" LEGACY bus - "));
    shutdown.cancel();
    running.await.unwrap();
}

#[tokio::test]
async fn a_change_refused_before_it_ran_has_its_line_too() {
    let station = Station::new(
        crate::link::LinkTask::new(link_settings("tcp://127.0.0.1:1")).1,
        crate::audit::AuditLog::memory_only(),
    );
    station
        .record_refused(legacy_origin("write"), "locked by TAT 3")
        .await;
    let line = last_line(&station);
    assert!(
        line.ends_with(" outcome=refused asked=write why=\"locked by TAT 3\""),
        "{line}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_stops_waiting_after_the_bound_and_the_change_goes_on_to_its_line() {
    // A link task that is never run, and the bus's lane held by an earlier transaction: the
    // change waits for its turn past its bound.
    let (_task, link) = crate::link::LinkTask::new(link_settings("tcp://127.0.0.1:1"));
    let station = Station::new(link, crate::audit::AuditLog::memory_only());
    let bus = "0.ESH10000023.I2C09";
    let lane = station.buses.lane(bus);
    let earlier = lane.lock().await;
    let scan = bus_scan(bus);
    let waited = station.change(change(ChangeWhat::Bus(scan), "bus")).await;
    assert!(
        matches!(&waited, Err(StillRunning(limit)) if *limit >= Duration::from_secs(4)),
        "{waited:?}"
    );
    assert!(station.changes.audit.recent_changes().is_empty());
    // Its turn comes; it ends (the link never answers) and its line says so.
    drop(earlier);
    assert_eq!(station.changes.changes.len(), 1, "the change still runs");
    station.changes_ended(Duration::from_secs(30)).await;
    assert_eq!(station.changes.changes.len(), 0, "and has ended");
    // (The trail's writer is a thread: with the clock paused, wait for it, not for time.)
    station.changes.audit.written().await;
    let line = last_line(&station);
    assert!(
        line.contains(" LEGACY bus - ") && line.contains(" outcome="),
        "{line}"
    );
}

const UART01: &str = "0.ESH10000023.UART01";
const ADC_NR: &str = "0.8.ESH10000590.NumericResult";
const ADC01: &str = "0.8.ESH10000590.ADC01";

#[tokio::test]
async fn a_read_that_consumes_data_goes_out_under_its_guard_or_not_at_all() {
    let (station, sim, shutdown, running) = connected_station().await;
    let guard = crate::link::SendGuard::passing(None);
    let policy = || {
        let mut policy = super::ReadPolicy::hardware(None, Some(&guard));
        policy.consuming = super::ConsumingRule::Read;
        policy
    };
    // A plain read with a guard at hand: one READ frame, no empty guarded one beside it.
    let frames = sim.read_frames();
    let plain = station.read(&[VSET1.to_owned()], policy()).await.unwrap();
    assert!(plain[0].is_ok(), "{plain:?}");
    assert_eq!(sim.read_frames(), frames + 1, "one READ for a plain read");
    // A consuming channel under the guard: read from the station, its value given.
    let consumed = station.read(&[UART01.to_owned()], policy()).await.unwrap();
    assert!(consumed[0].is_ok(), "{consumed:?}");
    assert_eq!(sim.reads_of(UART01), 1);
    // Without a guard it is never read.
    let mut unguarded = super::ReadPolicy::hardware(None, None);
    unguarded.consuming = super::ConsumingRule::Read;
    let refused = station.read(&[UART01.to_owned()], unguarded).await.unwrap();
    assert!(
        matches!(
            &refused[0],
            Err(super::ItemError::Consuming | super::ItemError::Link(LinkError::Refused(_)))
        ),
        "{refused:?}"
    );
    assert_eq!(
        sim.reads_of(UART01),
        1,
        "the unguarded read reached the station"
    );
    shutdown.cancel();
    running.await.unwrap();
}

#[test]
fn bus_transactions_are_supported_until_the_station_says_otherwise_on_this_connection() {
    let (_task, link) = crate::link::LinkTask::new(link_settings("tcp://127.0.0.1:1"));
    let station = Station::new(link, crate::audit::AuditLog::memory_only());
    assert!(station.bus_supported());
    let generation = station.info().generation;
    station.buses.unsupported_since(generation + 1);
    assert!(station.bus_supported(), "said on another connection");
    station.buses.unsupported_since(generation);
    assert!(!station.bus_supported());
}

#[tokio::test]
async fn a_sampler_says_its_rate_unit_and_default_count_without_acquiring() {
    let (station, _sim, shutdown, running) = connected_station().await;
    let (end, default) = station.sampler_info(ADC_NR, ADC01).await.unwrap();
    assert!(end.rate > 0.0, "{end:?}");
    assert!(
        matches!(default, Some(count) if count > 0),
        "the default sample count: {default:?}"
    );
    shutdown.cancel();
    running.await.unwrap();
}

/// A request served on a connection thread (`http::threads`) whose runtime stops while its
/// change waits for its turn: the change runs on the gateway's runtime, so it still goes out
/// and is answered, its line written. Spawned on the request's runtime, it would end with it,
/// unsent and unrecorded.
#[tokio::test]
async fn a_change_outlives_the_connection_thread_its_request_came_on() {
    let (station, _sim, shutdown, running) = connected_station().await;
    let bus = "0.ESH10000023.I2C09";
    let lane = station.buses.lane(bus);
    let earlier = lane.lock().await;
    let scan = bus_scan(bus);
    // The "connection thread": a runtime of its own, stopped (and dropped) on `stop`.
    let stop = CancellationToken::new();
    let thread = {
        let (station, stop) = (station.clone(), stop.clone());
        crate::gateway_runtime::on_a_thread_of_its_own(move || async move {
            tokio::select! {
                _ = station.change(change(ChangeWhat::Bus(scan), "bus")) => {}
                () = stop.cancelled() => {}
            }
        })
    };
    let submitted = tokio::time::timeout(Duration::from_secs(10), async {
        while station.changes.changes.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert!(submitted.await.is_ok(), "the change was never submitted");
    stop.cancel();
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    // The request's thread is gone; the change's turn comes.
    drop(earlier);
    station.changes_ended(Duration::from_secs(10)).await;
    assert_eq!(station.changes.changes.len(), 0, "the change has ended");
    station.changes.audit.written().await;
    let line = last_line(&station);
    assert!(
        line.contains(" LEGACY bus - ") && line.contains("outcome=applied"),
        "{line}"
    );
    shutdown.cancel();
    running.await.unwrap();
}

/// Access rules that refuse every change, or that let `VSET1` be written only while the door
/// interlock reads `True`.
fn rules(text: &str) -> crate::access_rules::AccessRules {
    crate::access_rules::AccessRules::from_rules(crate::rules::Rules::compile(text, 1).unwrap())
}

const DOOR: &str = station_simulator::SimulatorHandle::DOOR_CLOSED;

const VSET1_BEHIND_THE_DOOR: &str = r#"
default = "allow"
interlock_max_age_ms = 5000
interlock_poll_ms = 100

[channels.vset1]
names = ["0.4.ESH10000662.VSET1"]

[[rule]]
name = "vset1-only-with-the-door-closed"
channels = ["vset1"]
allow = ["write"]
interlock = { channel = "Interlock.DOOR_CLOSED", value = "True" }
"#;

/// The access rules decide a change before anything of it is sent: refused, it is audited as
/// refused by its rule and never reaches the station.
#[tokio::test]
async fn a_change_the_access_rules_refuse_is_never_sent() {
    let (station, sim, shutdown, running) = connected_station().await;
    let station = station.with_access_rules(rules("default = \"deny\"\n"));
    let report = station
        .change(change(
            ChangeWhat::Write(vec![(VSET1.into(), Value::Float(5.0))]),
            "write",
        ))
        .await
        .unwrap();
    assert!(
        matches!(&report.outcome, ChangeOutcome::Refused { why } if why.contains("default")),
        "{:?}",
        report.outcome
    );
    assert!(report.answer.is_err(), "{:?}", report.answer);
    assert!(
        sim.write_log().is_empty(),
        "refused, yet written: {:?}",
        sim.write_log()
    );
    shutdown.cancel();
    running.await.unwrap();
}

/// Admitted by a rule with an interlock, a change carries a send guard that judges the
/// interlock again right before sending: the door opened after admission refuses it.
#[tokio::test]
async fn an_interlocked_changes_admission_gives_it_a_guard_that_rechecks_the_interlock() {
    let (station, sim, shutdown, running) = connected_station().await;
    let station = station.with_access_rules(rules(VSET1_BEHIND_THE_DOOR));
    assert!(sim.set_input(DOOR, Value::Bool(true)));
    let what = ChangeWhat::Write(vec![(VSET1.into(), Value::Float(5.0))]);
    let (admitted, needed) = station
        .changes
        .admit(&what, &legacy_origin("write"), open_admission())
        .await
        .unwrap_or_else(|refusal| panic!("refused with the door closed: {refusal:?}"));
    assert_eq!(needed.len(), 1, "the door's interlock");
    let guard = admitted
        .guard
        .expect("an interlocked change is sent under a guard");
    let generation = station.link.info().generation;
    assert_eq!(guard.check(station.link.cache(), generation), Ok(()));
    assert!(sim.set_input(DOOR, Value::Bool(false)));
    station.link.read(vec![DOOR.into()]).await.unwrap();
    assert!(
        matches!(
            guard.check(station.link.cache(), generation),
            Err(crate::link::GuardRefusal::Interlock(_))
        ),
        "the door is open"
    );
    shutdown.cancel();
    running.await.unwrap();
}
