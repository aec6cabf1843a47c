//! Unit tests of what becomes of a change ([`ChangeOutcome::of`]), of its bound and of its
//! audit line: no station, no runtime.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use station_protocol::{ErrorCode, StationError, Value};

use super::*;
use crate::link::{LinkDown, LinkError};

fn refused(message: &str) -> StationError {
    StationError::new(ErrorCode::BadValue, message)
}

fn write_of(names: &[&str]) -> ChangeWhat {
    ChangeWhat::Write(
        names
            .iter()
            .map(|name| ((*name).to_owned(), Value::Integer(1)))
            .collect(),
    )
}

fn steps_of(labels: &[&str]) -> ChangeWhat {
    ChangeWhat::Steps(
        labels
            .iter()
            .map(|label| Step {
                label: (*label).to_owned(),
                action: StepAction::Write {
                    name: (*label).to_owned(),
                    value: Value::Integer(1),
                },
            })
            .collect(),
    )
}

fn stepped(done: usize, stopped: Option<(usize, LinkError)>) -> Result<ChangeAnswer, LinkError> {
    Ok(ChangeAnswer::Stepped(StepsDone {
        done: vec![None; done],
        stopped,
    }))
}

#[test]
fn a_write_the_station_confirmed_item_by_item_is_applied() {
    let answer = Ok(ChangeAnswer::Written(vec![Ok(()), Ok(())]));
    assert_eq!(
        ChangeOutcome::of(&write_of(&["A", "B"]), &answer),
        ChangeOutcome::Applied
    );
}

#[test]
fn a_write_with_some_items_refused_is_partial_naming_each_side() {
    let answer = Ok(ChangeAnswer::Written(vec![
        Ok(()),
        Err(refused("too high")),
        Ok(()),
    ]));
    assert_eq!(
        ChangeOutcome::of(&write_of(&["A", "B", "C"]), &answer),
        ChangeOutcome::Partial {
            applied: vec!["A".into(), "C".into()],
            not_applied: vec!["B".into()],
            why: "B: too high".into(),
        }
    );
}

#[test]
fn a_write_with_every_item_refused_is_refused_with_every_reason() {
    let answer = Ok(ChangeAnswer::Written(vec![
        Err(refused("too high")),
        Err(refused("read only")),
    ]));
    assert_eq!(
        ChangeOutcome::of(&write_of(&["A", "B"]), &answer),
        ChangeOutcome::Refused {
            why: "A: too high; B: read only".into()
        }
    );
}

#[test]
fn a_change_sent_and_never_answered_is_unknown_and_one_never_sent_is_refused() {
    let what = write_of(&["A"]);
    let unanswered = Err(LinkError::WriteTimeout {
        timeout: Duration::from_secs(2),
        max_processing: Duration::from_secs(8),
    });
    assert!(matches!(
        ChangeOutcome::of(&what, &unanswered),
        ChangeOutcome::Unknown { why } if why.contains("may or may not have been applied")
    ));
    let down = Err(LinkError::Disconnected(LinkDown::Connecting));
    assert_eq!(
        ChangeOutcome::of(&what, &down),
        ChangeOutcome::Refused {
            why: "station disconnected: connecting".into()
        }
    );
    let said_no = Err(LinkError::Station(refused("no")));
    assert_eq!(ChangeOutcome::of(&what, &said_no).word(), Outcome::Refused);
    let bus_gave_up = Err(LinkError::Station(StationError::new(
        ErrorCode::BusTimeout,
        "the device did not answer",
    )));
    assert_eq!(
        ChangeOutcome::of(
            &ChangeWhat::Reset {
                requester: "x".into()
            },
            &bus_gave_up
        )
        .word(),
        Outcome::Unknown
    );
}

#[test]
fn steps_that_all_went_through_are_applied() {
    let what = steps_of(&["one", "two"]);
    assert_eq!(
        ChangeOutcome::of(&what, &stepped(2, None)),
        ChangeOutcome::Applied
    );
}

#[test]
fn steps_stopped_at_the_first_are_that_steps_outcome() {
    let what = steps_of(&["one", "two"]);
    let refused_first = stepped(0, Some((0, LinkError::Station(refused("no")))));
    assert_eq!(
        ChangeOutcome::of(&what, &refused_first),
        ChangeOutcome::Refused { why: "no".into() }
    );
    let unanswered_first = stepped(0, Some((0, LinkError::Timeout(Duration::from_secs(1)))));
    assert_eq!(
        ChangeOutcome::of(&what, &unanswered_first).word(),
        Outcome::Unknown
    );
}

#[test]
fn steps_stopped_midway_are_partial_naming_what_was_applied_and_what_not() {
    let what = steps_of(&["one", "two", "three", "four"]);
    let answer = stepped(2, Some((2, LinkError::Timeout(Duration::from_millis(300)))));
    assert_eq!(
        ChangeOutcome::of(&what, &answer),
        ChangeOutcome::Partial {
            applied: vec!["one".into(), "two".into()],
            not_applied: vec!["three".into(), "four".into()],
            why: "stopped at three: the station did not answer within 300 ms".into(),
        }
    );
}

#[test]
fn other_changes_the_station_answered_are_applied() {
    let reset = ChangeWhat::Reset {
        requester: "x".into(),
    };
    assert_eq!(
        ChangeOutcome::of(&reset, &Ok(ChangeAnswer::Reset)),
        ChangeOutcome::Applied
    );
    let transact = ChangeWhat::Transact {
        name: "A".into(),
        value: Value::Integer(1),
    };
    assert_eq!(
        ChangeOutcome::of(&transact, &Ok(ChangeAnswer::Transacted(Value::Integer(1)))),
        ChangeOutcome::Applied
    );
}

#[test]
fn the_bound_grows_with_the_steps_and_the_acquisitions_own_time() {
    let timeout = Duration::from_secs(1);
    let one = bound(&write_of(&["A"]), timeout);
    let after = READ_BACK_WAIT + crate::audit::RECORD_LIMIT;
    assert_eq!(one, Duration::from_secs(2) + after);
    assert_eq!(
        bound(&steps_of(&["a", "b", "c"]), timeout),
        Duration::from_secs(6) + after
    );
    assert_eq!(
        bound(&ChangeWhat::Steps(Vec::new()), timeout),
        one,
        "no steps wait as long as one"
    );
    let sample = ChangeWhat::Sample {
        request: SampleRequest {
            channel: "N".into(),
            target: "T".into(),
            count: 10,
            frame_samples: 10,
        },
        expected: Duration::from_secs(3),
    };
    assert_eq!(bound(&sample, timeout), one + Duration::from_secs(3));
    // A UART receive's own time, which the link adds to the request's; none without a line.
    let mut uart = BusRequest {
        channel: "UART01".into(),
        action: station_protocol::BusAction::Receive,
        address: 0,
        retries: 0,
        receive: 8,
        data: Bytes::new(),
        line: None,
    };
    assert_eq!(bound(&ChangeWhat::Bus(uart.clone()), timeout), one);
    uart.line = Some(station_protocol::UartLine {
        baud: 9600,
        bus_type: station_protocol::UartBusType::Rs232,
        flow_control: station_protocol::FlowControl::None,
        parity: station_protocol::Parity::None,
        use_termination: false,
        termination_byte: b'\n',
        timeout_ms: 2_000,
    });
    assert_eq!(
        bound(&ChangeWhat::Bus(uart), timeout),
        one + Duration::from_secs(2)
    );
}

fn http_origin() -> ChangeOrigin {
    let front = FrontEnd::Http {
        method: "POST".into(),
        path: "/api/channels/configure".into(),
    };
    let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let mut origin = ChangeOrigin::new(front, peer, Instant::now());
    origin.caller = Some("bench key".into());
    origin.lease = Some(("TAT 3".into(), 7));
    origin
}

#[test]
fn a_partial_changes_line_names_its_caller_lease_and_both_sides() {
    let origin = http_origin();
    let report = ChangeReport {
        answer: stepped(1, Some((1, LinkError::Timeout(Duration::from_millis(300))))),
        outcome: ChangeOutcome::Partial {
            applied: vec!["configure A".into()],
            not_applied: vec!["configure B".into(), "configure C".into()],
            why: "stopped at configure B: timed out".into(),
        },
    };
    let line = origin.line(&report.outcome, origin.status(&report));
    assert!(
        line.contains(" 127.0.0.1 POST /api/channels/configure 504 "),
        "{line}"
    );
    assert!(
        line.ends_with(
            " caller=\"bench key\" owner=\"TAT 3\" fence=7 outcome=partial applied=\"configure A\" not_applied=\"configure B; configure C\" why=\"stopped at configure B: timed out\""
        ),
        "{line}"
    );
}

#[test]
fn a_legacy_line_has_no_status_and_an_origin_is_taken_only_once_submitted() {
    let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let mut origin = ChangeOrigin::new(
        FrontEnd::Legacy { operation: "write" },
        peer,
        Instant::now(),
    );
    origin.asked = Some("A=1".into());
    let report = ChangeReport {
        answer: Ok(ChangeAnswer::Written(vec![Ok(())])),
        outcome: ChangeOutcome::Applied,
    };
    assert_eq!(origin.status(&report), None);
    let line = origin.line(&report.outcome, None);
    assert!(
        line.contains(" 127.0.0.1 LEGACY write - ") && line.ends_with(" outcome=applied asked=A=1"),
        "{line}"
    );
    let refused = ChangeOutcome::Unknown {
        why: "no answer".into(),
    };
    assert!(
        origin
            .line(&refused, None)
            .ends_with(" outcome=unknown asked=A=1 why=\"no answer\"")
    );
    assert!(!origin.line_taken());
    let clone = origin.clone();
    clone.line_taken.store(true, Ordering::Release);
    assert!(
        origin.line_taken(),
        "a clone shares whether the line was taken"
    );
}

#[test]
fn each_answer_gives_its_own_kind_and_none_of_another() {
    let end = SampleEnd {
        count: 1,
        rate: 10.0,
        started_us: 0,
        unit: "V".into(),
    };
    let sampled = ChangeAnswer::Sampled {
        samples: vec![1.0],
        end,
    };
    assert_eq!(sampled.clone().sampled().map(|(s, _)| s), Some(vec![1.0]));
    assert!(sampled.clone().written().is_none() && sampled.clone().bus().is_none());
    assert!(sampled.clone().transacted().is_none() && sampled.stepped().is_none());
    let written = ChangeAnswer::Written(vec![Ok(())]);
    assert!(written.clone().written().is_some() && written.sampled().is_none());
    assert!(ChangeAnswer::Bus(Bytes::from_static(b"x")).bus().is_some());
    assert!(ChangeAnswer::Reset.bus().is_none());
    assert!(
        ChangeAnswer::Transacted(Value::Integer(1))
            .transacted()
            .is_some()
    );
    assert!(
        ChangeAnswer::Stepped(StepsDone::default())
            .stepped()
            .is_some()
    );
}

fn table_of(channels: &[(&str, bool, bool)]) -> ChannelTable {
    ChannelTable::new(
        channels
            .iter()
            .map(
                |(name, readable, consuming)| station_protocol::ChannelDescriptor {
                    name: (*name).into(),
                    alias: format!("alias of {name}"),
                    net_name: String::new(),
                    type_flags: 1,
                    direction: station_protocol::Direction::Out,
                    unit: String::new(),
                    description: String::new(),
                    group: String::new(),
                    readable: *readable,
                    writable: true,
                    consuming: *consuming,
                    value_type: station_protocol::ValueType::Float,
                    options: Vec::new(),
                },
            )
            .collect(),
    )
}

#[test]
fn only_confirmed_writes_of_readable_channels_that_consume_nothing_are_read_back() {
    let table = table_of(&[
        ("V", true, false),
        ("W", true, false),
        ("UART", true, true),
        ("WO", false, false),
    ]);
    let what = write_of(&["V", "W", "UART", "WO", "V", "NOPE"]);
    let answer = Ok(ChangeAnswer::Written(vec![
        Ok(()),
        Err(refused("out of range")),
        Ok(()),
        Ok(()),
        Ok(()),
        Ok(()),
    ]));
    assert_eq!(confirmed_writes(&what, &answer, &table), ["V"]);
    // A write whose answer never came (or the link failed) reads nothing back.
    let lost = Err(LinkError::Disconnected(LinkDown::Closed));
    assert!(confirmed_writes(&what, &lost, &table).is_empty());
    // Steps: the writes carried out before the step that stopped them.
    let steps = steps_of(&["V", "W"]);
    let stopped = stepped(1, Some((1, LinkError::Station(refused("no")))));
    assert_eq!(confirmed_writes(&steps, &stopped, &table), ["V"]);
    assert_eq!(
        confirmed_writes(&steps, &stepped(2, None), &table),
        ["V", "W"]
    );
}
