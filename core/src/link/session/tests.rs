//! Tests of the session's bookkeeping with `Instant`s passed in: ids, the window, replies, timeouts, fences, streams.

use super::*;
use station_protocol::{ErrorCode, StationError, Value};
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_secs(2);
/// The longest the station may take over a request: four timeouts, the default.
const MAX_PROCESSING: Duration = Duration::from_secs(8);

fn change(session: &mut Session, fence: Option<u64>, now: Instant) -> u32 {
    let (reply, _answer) = oneshot::channel();
    let id = session.take_id();
    let kind = InFlightKind::Change {
        reply,
        answers_for: Vec::new(),
    };
    session.track(id, Opcode::Write, fence, kind, now, Duration::ZERO);
    id
}

#[test]
fn ids_wrap_past_the_largest_skipping_zero_and_ids_still_in_flight() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    session.next_id = 1;
    let one = change(&mut session, None, now);
    assert_eq!(one, 1);
    session.next_id = u32::MAX;
    assert_eq!(session.take_id(), u32::MAX);
    assert_eq!(
        session.take_id(),
        2,
        "0 is skipped, and 1 is still in flight"
    );
}

#[test]
fn a_reply_answers_its_request_and_frees_its_slot() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    let id = change(&mut session, None, now);
    assert!(!session.has_room());
    let reply = session.verify_reply(id, Ok(Response::Write(vec![Ok(())])));
    assert!(matches!(reply, Reply::Answer(_, Response::Write(_))));
    assert!(session.has_room());
}

#[test]
fn an_error_answers_any_request() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let id = change(&mut session, None, Instant::now());
    let error = StationError::new(ErrorCode::Busy, "busy");
    let reply = session.verify_reply(id, Ok(Response::Error(error)));
    assert!(matches!(reply, Reply::Answer(_, Response::Error(_))));
}

#[test]
fn a_reply_of_the_wrong_kind_is_a_protocol_error() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let id = change(&mut session, None, Instant::now());
    let reply = session.verify_reply(id, Ok(Response::Read(vec![])));
    let Reply::Mismatch(_, error) = reply else {
        panic!("a READ reply to a WRITE was accepted")
    };
    assert_eq!(
        error,
        ProtocolError::UnexpectedReply {
            asked: Opcode::Write,
            answered: Opcode::ReadReply
        }
    );
    assert_eq!(error.to_string(), "unexpected ReadReply answer");
}

#[test]
fn a_read_answered_with_another_number_of_values_is_a_protocol_error() {
    use crate::link::read_queue::{CoalescePolicy, ReadQueue};
    let mut reads = ReadQueue::new(CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    });
    let now = Instant::now();
    let (reply, _answer) = oneshot::channel();
    reads.enqueue(vec!["a".into(), "b".into()], None, reply, now);
    let batch = reads.next_batch(now).expect("a READ of a and b");
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let id = session.take_id();
    session.track(
        id,
        Opcode::Read,
        None,
        InFlightKind::Read(batch),
        now,
        Duration::ZERO,
    );
    let reply = session.verify_reply(id, Ok(Response::Read(vec![Ok(Value::Bool(true))])));
    let Reply::Mismatch(_, error) = reply else {
        panic!("one value for two names was accepted")
    };
    assert_eq!(
        error.to_string(),
        "a READ of 2 names was answered with ReadReply"
    );
}

#[test]
fn an_unreadable_reply_is_a_protocol_error() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let id = change(&mut session, None, Instant::now());
    let reply = session.verify_reply(id, Err(PayloadError::Truncated("a status")));
    assert!(matches!(
        reply,
        Reply::Mismatch(_, ProtocolError::BadPayload(_))
    ));
    assert!(session.has_room());
}

#[test]
fn a_late_reply_after_a_timeout_is_dropped_and_counted() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    let id = change(&mut session, None, now);
    assert!(session.expired(now + TIMEOUT / 2).is_empty());
    assert_eq!(session.next_deadline(), Some(now + TIMEOUT));
    assert_eq!(session.expired(now + TIMEOUT).len(), 1);
    let reply = session.verify_reply(id, Ok(Response::Write(vec![Ok(())])));
    assert!(matches!(reply, Reply::Unknown));
    assert_eq!(session.late_replies(), 1);
    assert!(session.next_deadline().is_none());
}

#[test]
fn the_ping_does_not_count_against_the_window() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    let id = session.take_id();
    session.track(
        id,
        Opcode::Ping,
        None,
        InFlightKind::Ping,
        now,
        Duration::ZERO,
    );
    assert!(session.ping_outstanding());
    assert!(session.has_room());
    let reply = session.verify_reply(id, Ok(Response::Ping { nonce: 1 }));
    assert!(matches!(reply, Reply::Answer(..)));
    assert!(!session.ping_outstanding());
}

#[test]
fn changes_admitted_under_a_fence_are_known_to_be_in_flight_until_answered() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    let first = change(&mut session, Some(7), now);
    let second = change(&mut session, Some(7), now);
    change(&mut session, Some(8), now);
    change(&mut session, None, now);
    assert!(session.changes_at_the_station(SettleScope::Fence(7)));
    assert!(!session.changes_at_the_station(SettleScope::Fence(6)));
    session.verify_reply(first, Ok(Response::Write(vec![])));
    assert!(
        session.changes_at_the_station(SettleScope::Fence(7)),
        "one is still at the station"
    );
    session.verify_reply(second, Ok(Response::Write(vec![])));
    assert!(!session.changes_at_the_station(SettleScope::Fence(7)));
    assert!(session.changes_at_the_station(SettleScope::Fence(8)));
    session.expired(now + TIMEOUT);
    assert!(
        session.changes_at_the_station(SettleScope::Fence(8)) && session.in_doubt_under(8),
        "timed out, but the station may still apply it: in doubt"
    );
    session.expired(now + 2 * TIMEOUT);
    assert!(
        session.changes_at_the_station(SettleScope::Fence(8)),
        "a second timeout is no reason to take it as lost"
    );
    assert_eq!(session.next_deadline(), Some(now + MAX_PROCESSING));
    let nobody_waits = |_| false;
    assert_eq!(
        session.lapse_doubts(
            now + MAX_PROCESSING - Duration::from_millis(1),
            nobody_waits
        ),
        Lapse::Forgotten(vec![]),
        "still within the longest the station may take"
    );
    assert_eq!(
        session.lapse_doubts(now + MAX_PROCESSING, nobody_waits),
        Lapse::Forgotten(vec![8])
    );
    assert!(
        !session.changes_at_the_station(SettleScope::Fence(8)),
        "unanswered for the longest the station may take: it was carried out or never will be"
    );
    assert_eq!(session.next_deadline(), None);
    // The lease's end learns of it once, for its lock-delay.
    assert_eq!(session.take_lapsed(SettleScope::Fence(7)), None);
    assert_eq!(
        session.take_lapsed(SettleScope::Fence(8)),
        Some(now + MAX_PROCESSING),
        "lapsed at its bound"
    );
    assert_eq!(session.take_lapsed(SettleScope::Fence(8)), None);
}

#[test]
fn a_change_in_doubt_answered_late_leaves_nothing_lapsed() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    change(&mut session, Some(8), now);
    session.expired(now + TIMEOUT);
    assert!(session.in_doubt_under(8));
    session.verify_reply(1, Ok(Response::Write(vec![Ok(())])));
    assert!(!session.changes_at_the_station(SettleScope::Fence(8)));
    assert_eq!(
        session.lapse_doubts(now + MAX_PROCESSING, |_| true),
        Lapse::Forgotten(vec![])
    );
    assert_eq!(session.take_lapsed(SettleScope::Every), None);
}

#[test]
fn a_change_in_doubt_whose_fence_is_waited_for_past_the_longest_processing_asks_for_a_reset() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let t0 = Instant::now();
    change(&mut session, Some(5), t0);
    let later = t0 + Duration::from_secs(1);
    change(&mut session, Some(6), later);
    session.expired(later + TIMEOUT);
    assert!(session.in_doubt_under(5) && session.in_doubt_under(6));
    let waited_for = |fence| fence == 6;
    assert_eq!(
        session.lapse_doubts(t0 + MAX_PROCESSING, waited_for),
        Lapse::Forgotten(vec![5]),
        "fence 5's change lapsed, but nobody waits for fence 5"
    );
    assert!(session.in_doubt_under(6));
    assert_eq!(session.next_deadline(), Some(later + MAX_PROCESSING));
    assert_eq!(
        session.lapse_doubts(later + MAX_PROCESSING, waited_for),
        Lapse::Reset { fence: 6 }
    );
    assert!(!session.changes_at_the_station(SettleScope::Fence(6)));
}

#[test]
fn a_sample_is_a_change_until_its_first_frame_and_data_after_it() {
    let mut session = Session::new(2, TIMEOUT, MAX_PROCESSING);
    let t0 = Instant::now();
    // Silent from the start: the station may still start it, a change in doubt.
    let (silent, _rx) = stream(&mut session, Some(8), t0);
    assert_eq!(session.expired(t0 + TIMEOUT).len(), 1);
    assert!(session.in_doubt_under(8));
    assert_eq!(
        session.lapse_doubts(t0 + MAX_PROCESSING, |_| true),
        Lapse::Reset { fence: 8 }
    );
    let _ = silent;
    // Started: its first frame ends its count under the lease; a lease's end waits no longer,
    // and should it fall silent after, nothing of it is in doubt.
    let (id, _rx) = stream(&mut session, Some(9), t0);
    assert!(session.changes_at_the_station(SettleScope::Fence(9)));
    let first_frame = t0 + Duration::from_secs(5);
    assert!(matches!(
        session.verify_reply_at(id, Ok(data(0, 1)), first_frame),
        Reply::Part(..)
    ));
    assert!(!session.changes_at_the_station(SettleScope::Fence(9)));
    assert_eq!(session.expired(first_frame + TIMEOUT).len(), 1);
    assert!(!session.in_doubt_under(9));
}

#[test]
fn the_longest_processing_is_never_shorter_than_the_request_timeout() {
    let mut session = Session::new(1, TIMEOUT, Duration::ZERO);
    let t0 = Instant::now();
    change(&mut session, Some(2), t0);
    session.expired(t0 + TIMEOUT);
    assert!(session.in_doubt_under(2));
    assert_eq!(session.next_deadline(), Some(t0 + TIMEOUT));
}

#[test]
fn a_timed_out_change_is_settled_by_its_late_answer_or_by_time_never_by_the_end_of_the_session() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let now = Instant::now();
    let late = change(&mut session, Some(3), now);
    let lost = change(&mut session, Some(4), now);
    change(&mut session, Some(FREE_FENCE), now);
    session.expired(now + TIMEOUT);
    assert!(session.changes_at_the_station(SettleScope::Fence(3)));
    assert!(session.changes_at_the_station(SettleScope::Fence(FREE_FENCE)));
    assert_ne!(
        session.take_id(),
        late,
        "an unsettled change's id is not reused"
    );
    assert!(matches!(
        session.verify_reply(late, Ok(Response::Write(vec![Ok(())]))),
        Reply::Unknown
    ));
    assert!(
        !session.changes_at_the_station(SettleScope::Fence(3)),
        "answered late: settled"
    );
    assert!(session.changes_at_the_station(SettleScope::Fence(4)));
    session.drain();
    let mut next = Session::new(4, TIMEOUT, MAX_PROCESSING).with_doubts(session.take_doubts());
    assert!(
        next.changes_at_the_station(SettleScope::Fence(4))
            && next.changes_at_the_station(SettleScope::Fence(FREE_FENCE)),
        "the connection ended, but a station on a serial line never sees that: still in doubt"
    );
    assert!(
        matches!(
            next.verify_reply(lost, Ok(Response::Write(vec![Ok(())]))),
            Reply::Unknown
        ) && next.changes_at_the_station(SettleScope::Fence(4)),
        "an answer with its id on the next connection is not its answer"
    );
    assert_eq!(next.next_deadline(), Some(now + MAX_PROCESSING));
    next.lapse_doubts(now + MAX_PROCESSING, |_| true);
    assert!(!next.changes_at_the_station(SettleScope::Every));
}

#[test]
fn a_change_still_unanswered_when_the_session_ends_is_in_doubt_until_the_longest_processing() {
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    let sent = Instant::now();
    change(&mut session, Some(6), sent);
    change(&mut session, None, sent);
    let drained = session.drain();
    assert_eq!(drained.len(), 2, "both answered by the end of the session");
    let mut next = Session::new(4, TIMEOUT, MAX_PROCESSING).with_doubts(session.take_doubts());
    assert!(next.changes_at_the_station(SettleScope::Fence(6)));
    assert!(
        !next.changes_at_the_station(SettleScope::Fence(FREE_FENCE)),
        "a request sent under no guard (a read) is no change"
    );
    assert_eq!(next.next_deadline(), Some(sent + MAX_PROCESSING));
    assert_eq!(
        next.lapse_doubts(sent + MAX_PROCESSING, |_| true),
        Lapse::Forgotten(vec![6]),
        "sent on a connection that ended: no reset of this one settles it"
    );
    assert_eq!(
        next.take_lapsed(SettleScope::Every),
        Some(sent + MAX_PROCESSING)
    );
}

#[test]
fn inherited_doubts_are_waited_for_until_their_instant() {
    let now = Instant::now();
    let mut session = Session::new(4, TIMEOUT, MAX_PROCESSING);
    session.inherit(vec![crate::link::Doubt {
        fence: 12,
        until: now + TIMEOUT,
    }]);
    assert!(session.changes_at_the_station(SettleScope::Every));
    assert!(!session.changes_at_the_station(SettleScope::Fence(11)));
    assert_eq!(session.next_deadline(), Some(now + TIMEOUT));
    session.lapse_doubts(now + TIMEOUT, |_| true);
    assert!(!session.changes_at_the_station(SettleScope::Every));
}

fn data(index: u32, n: usize) -> Response {
    Response::Sample(station_protocol::SamplePart::Data {
        index,
        samples: vec![1.0; n],
    })
}

fn stream(
    session: &mut Session,
    fence: Option<u64>,
    now: Instant,
) -> (u32, mpsc::UnboundedReceiver<Result<Response, LinkError>>) {
    let (parts, rx) = mpsc::unbounded_channel();
    let id = session.take_id();
    session.track(
        id,
        Opcode::Sample,
        fence,
        InFlightKind::Stream { parts },
        now,
        Duration::ZERO,
    );
    (id, rx)
}

#[test]
fn a_stream_frees_its_window_slot_with_its_first_frame_and_stays_in_flight_until_the_end() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let t0 = Instant::now();
    let (id, mut rx) = stream(&mut session, Some(3), t0);
    assert!(
        !session.has_room(),
        "before its first frame it holds the one slot"
    );
    for (i, at) in [(0u32, 1u64), (4, 2), (8, 3)] {
        let now = t0 + Duration::from_secs(at);
        let reply = session.verify_reply_at(id, Ok(data(i, 4)), now);
        let Reply::Part(parts, _) = reply else {
            panic!("a data frame is a part")
        };
        parts.send(Ok(data(i, 4))).expect("the caller listens");
        assert!(
            session.has_room(),
            "a streaming request leaves room for others"
        );
        assert_eq!(
            session.next_deadline(),
            Some(now + TIMEOUT),
            "the deadline counts from the last frame"
        );
        assert!(
            !session.changes_at_the_station(SettleScope::Fence(3)),
            "started: data from now on, no longer a change its lease's end waits for"
        );
    }
    assert_eq!(std::iter::from_fn(|| rx.try_recv().ok()).count(), 3);
    // Another request takes the slot while the samples stream.
    let other = change(&mut session, None, t0);
    assert!(!session.has_room());
    let end = Response::Sample(station_protocol::SamplePart::End(
        station_protocol::SampleEnd {
            count: 12,
            rate: 10.0,
            started_us: 0,
            unit: String::new(),
        },
    ));
    assert!(matches!(
        session.verify_reply(id, Ok(end)),
        Reply::Answer(_, Response::Sample(_))
    ));
    assert!(!session.changes_at_the_station(SettleScope::Fence(3)));
    assert!(!session.has_room(), "the end frame frees no slot twice");
    assert!(matches!(
        session.verify_reply(other, Ok(Response::Write(vec![Ok(())]))),
        Reply::Answer(..)
    ));
    assert!(session.has_room());
    assert!(
        matches!(session.verify_reply(id, Ok(data(12, 1))), Reply::Unknown),
        "nothing after the end"
    );
}

#[test]
fn an_error_ends_a_stream_and_a_silent_stream_times_out_from_its_last_frame() {
    let mut session = Session::new(2, TIMEOUT, MAX_PROCESSING);
    let t0 = Instant::now();
    let (id, _rx) = stream(&mut session, None, t0);
    let error = StationError::new(ErrorCode::Busy, "busy");
    assert!(matches!(
        session.verify_reply(id, Ok(Response::Error(error))),
        Reply::Answer(..)
    ));
    assert_eq!(session.next_deadline(), None);
    let (id, _rx) = stream(&mut session, None, t0);
    let later = t0 + Duration::from_secs(1);
    assert!(matches!(
        session.verify_reply_at(id, Ok(data(0, 1)), later),
        Reply::Part(..)
    ));
    assert!(
        session.expired(t0 + TIMEOUT).is_empty(),
        "a frame came since it was sent"
    );
    assert_eq!(session.expired(later + TIMEOUT).len(), 1);
    assert!(session.has_room() && session.busy == 0);
}

#[test]
fn a_sample_frame_for_a_request_of_another_kind_is_a_mismatch() {
    let mut session = Session::new(1, TIMEOUT, MAX_PROCESSING);
    let id = change(&mut session, None, Instant::now());
    assert!(matches!(
        session.verify_reply(id, Ok(data(0, 1))),
        Reply::Mismatch(..)
    ));
}

/// A request with an allowance (a UART receive's own time) times out that much later, but a
/// change of it stays in doubt only until `max_processing` after it was sent, as every change.
#[test]
fn an_allowance_moves_the_deadline_and_the_end_of_doubt() {
    let mut session = Session::new(2, TIMEOUT, MAX_PROCESSING);
    let t0 = Instant::now();
    let (reply, _answer) = oneshot::channel();
    let id = session.take_id();
    let kind = InFlightKind::Change {
        reply,
        answers_for: Vec::new(),
    };
    let allowance = Duration::from_secs(3);
    session.track(id, Opcode::Bus, Some(4), kind, t0, allowance);
    assert_eq!(session.next_deadline(), Some(t0 + TIMEOUT + allowance));
    assert!(session.expired(t0 + TIMEOUT).is_empty());
    let expired = session.expired(t0 + TIMEOUT + allowance);
    assert_eq!(expired.len(), 1);
    assert!(session.in_doubt_under(4));
    assert_eq!(
        session.next_deadline(),
        Some(t0 + allowance + MAX_PROCESSING),
        "the station carries a receive out for its own time too"
    );
}

#[test]
fn only_a_uart_line_gives_a_request_an_allowance() {
    use station_protocol::{
        BusAction, BusRequest, FlowControl, Parity, Request, UartBusType, UartLine,
    };
    let mut bus = BusRequest {
        channel: "UART01".into(),
        action: BusAction::Receive,
        address: 0,
        retries: 0,
        receive: 8,
        data: bytes::Bytes::new(),
        line: None,
    };
    assert_eq!(allowance_of(&Request::Bus(bus.clone())), Duration::ZERO);
    bus.line = Some(UartLine {
        baud: 9600,
        bus_type: UartBusType::Rs232,
        flow_control: FlowControl::None,
        parity: Parity::None,
        use_termination: false,
        termination_byte: b'\n',
        timeout_ms: 1_500,
    });
    assert_eq!(
        allowance_of(&Request::Bus(bus)),
        Duration::from_millis(1_500)
    );
    assert_eq!(
        allowance_of(&Request::Read {
            names: vec!["a".into()]
        }),
        Duration::ZERO
    );
}
