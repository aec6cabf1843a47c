//! The connection's decisions without a connection: which queued change goes out and what a
//! reply comes to, with the send guard judged at times passed in.

use std::time::Duration;

use station_protocol::{
    ChangeType, ChannelConfig, ChannelDescriptor, ConfigureReply, Direction, ErrorCode, ItemResult,
    Opcode, PayloadError, Request, Response, StationError, Value, ValueType,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::*;
use crate::cache::ValueCache;
use crate::link::guard::{Guarded, LeaseSnapshot, LeaseWatch, SendMoment};
use crate::link::read_queue::{CoalescePolicy, ReadQueue};
use crate::link::session::FREE_FENCE;

type Answer = oneshot::Receiver<Result<Response, LinkError>>;

fn change(request: Request, guard: Option<SendGuard>) -> (Queued, Answer) {
    let (reply, answer) = oneshot::channel();
    let queued = Queued::Change {
        request,
        guard,
        reply,
    };
    (queued, answer)
}

fn write(names: &[&str]) -> Request {
    Request::Write {
        items: names
            .iter()
            .map(|name| ((*name).to_owned(), Value::Integer(1)))
            .collect(),
    }
}

/// The guard judged against `lease` at `now`, as the link judges it at the moment of sending.
fn judged_at<'a>(
    lease: &'a LeaseSnapshot,
    now: Instant,
) -> impl FnOnce(&SendGuard) -> Result<(), GuardRefusal> + 'a {
    move |guard| {
        guard.judge(&SendMoment {
            lease: Some(lease),
            values: &ValueCache::new(),
            generation: 1,
            now,
            values_now: std::time::Instant::now(),
        })
    }
}

fn known(name: &str) -> bool {
    name != "MADE_UP"
}

#[test]
fn a_change_goes_out_under_its_fence_and_makes_the_station_channels_it_writes_stale() {
    let now = Instant::now();
    let lease = LeaseSnapshot::Held {
        owner: "A".into(),
        fence: 7,
        until: now + Duration::from_secs(1),
    };
    let watch = LeaseWatch::new(lease.clone());
    let guard = SendGuard::lease(Some(7), Guarded::Change, watch);
    let (queued, _answer) = change(write(&["VSET1", "MADE_UP"]), Some(guard));
    match take(queued, judged_at(&lease, now), known) {
        Taken::Send {
            fence,
            stale,
            kind: InFlightKind::Change { answers_for, .. },
            ..
        } => {
            assert_eq!(fence, Some(7));
            assert_eq!(stale, ["VSET1"], "a made-up name gets no cache slot");
            assert!(answers_for.is_empty());
        }
        _ => panic!("a change its lease still admits is sent"),
    }
    // Admitted while nobody held the lease: counted under the free fence.
    let guard = SendGuard::lease(None, Guarded::Read, LeaseWatch::new(LeaseSnapshot::Free));
    let read = Request::Read {
        names: vec!["NR".into()],
    };
    let (queued, _answer) = change(read, Some(guard));
    match take(queued, judged_at(&LeaseSnapshot::Free, now), known) {
        Taken::Send {
            fence,
            stale,
            kind: InFlightKind::Change { answers_for, .. },
            ..
        } => {
            assert_eq!(fence, Some(FREE_FENCE));
            assert!(stale.is_empty());
            assert_eq!(answers_for, ["NR"], "a guarded READ answers for its names");
        }
        _ => panic!("a consuming read nobody's lease refuses is sent"),
    }
}

#[tokio::test]
async fn a_change_whose_lease_ended_at_the_moment_of_sending_is_refused_and_its_caller_told() {
    let now = Instant::now();
    let until = now + Duration::from_millis(10);
    let lease = LeaseSnapshot::Held {
        owner: "A".into(),
        fence: 7,
        until,
    };
    let guard = SendGuard::lease(Some(7), Guarded::Change, LeaseWatch::new(lease.clone()));
    let (queued, answer) = change(write(&["VSET1"]), Some(guard));
    // Judged at its deadline: ended, though nobody has settled it yet.
    let Taken::Refused { waiting, why } = take(queued, judged_at(&lease, until), known) else {
        panic!("a change of an ended lease is never sent");
    };
    assert!(matches!(
        why,
        LinkError::Refused(GuardRefusal::LeaseEnded { admitted: 7, .. })
    ));
    waiting.answer(why);
    assert!(matches!(
        answer.await.unwrap(),
        Err(LinkError::Refused(GuardRefusal::LeaseEnded { .. }))
    ));
}

#[test]
fn a_request_whose_caller_gave_up_is_never_sent() {
    let now = Instant::now();
    let (queued, answer) = change(write(&["VSET1"]), None);
    drop(answer);
    assert!(matches!(
        take(queued, judged_at(&LeaseSnapshot::Free, now), known),
        Taken::Abandoned
    ));
    let (parts, gone) = mpsc::unbounded_channel();
    drop(gone);
    let stream = Queued::Stream {
        request: Request::Ping { nonce: 1 },
        guard: None,
        parts,
    };
    assert!(matches!(
        take(stream, judged_at(&LeaseSnapshot::Free, now), known),
        Taken::Abandoned
    ));
    let (reply, answer) = oneshot::channel();
    drop(answer);
    let pass = Queued::Pass {
        request: Request::Ping { nonce: 2 },
        reply,
    };
    assert!(matches!(
        take(pass, judged_at(&LeaseSnapshot::Free, now), known),
        Taken::Abandoned
    ));
}

#[test]
fn a_passed_request_has_no_guard_and_no_fence() {
    let (reply, _answer) = oneshot::channel();
    let pass = Queued::Pass {
        request: write(&["VSET1"]),
        reply,
    };
    let refuse_all =
        |_: &SendGuard| -> Result<(), GuardRefusal> { Err(GuardRefusal::NoLeaseCheck) };
    match take(pass, refuse_all, known) {
        Taken::Send {
            fence,
            stale,
            kind: InFlightKind::Pass { .. },
            ..
        } => {
            assert_eq!(fence, None);
            assert!(stale.is_empty());
        }
        _ => panic!("a passed request is sent as it is"),
    }
}

fn answered(kind: InFlightKind, answer: Result<Response, ProtocolError>) -> ReplyPlan {
    plan_reply(kind, answer)
}

fn a_change(answers_for: &[&str]) -> (InFlightKind, Answer) {
    let (reply, answer) = oneshot::channel();
    let kind = InFlightKind::Change {
        reply,
        answers_for: answers_for.iter().map(|n| (*n).to_owned()).collect(),
    };
    (kind, answer)
}

#[test]
fn a_transact_or_guarded_read_answer_goes_into_the_cache_and_a_reset_notes_the_restart() {
    let (kind, _answer) = a_change(&["VSET1"]);
    let ReplyPlan::Answer {
        cache, restarted, ..
    } = answered(kind, Ok(Response::Transact(Value::Float(2.5))))
    else {
        panic!("a change's answer goes to its caller");
    };
    assert_eq!(cache, [("VSET1".to_owned(), Value::Float(2.5))]);
    assert!(!restarted);
    let (kind, _answer) = a_change(&["NR1", "NR2"]);
    let results: Vec<ItemResult<Value>> = vec![
        Ok(Value::Integer(4)),
        Err(StationError {
            code: ErrorCode::Busy,
            message: String::new(),
        }),
    ];
    let ReplyPlan::Answer { cache, .. } = answered(kind, Ok(Response::Read(results))) else {
        panic!("a guarded read's answer goes to its caller");
    };
    assert_eq!(
        cache,
        [("NR1".to_owned(), Value::Integer(4))],
        "only values"
    );
    let (kind, _answer) = a_change(&[]);
    let ReplyPlan::Answer {
        cache,
        restarted,
        answer,
        ..
    } = answered(kind, Ok(Response::Reset))
    else {
        panic!("a RESET's answer goes to its caller");
    };
    assert!(cache.is_empty());
    assert!(restarted);
    assert!(matches!(answer, Ok(Response::Reset)));
}

#[test]
fn an_unreadable_answer_to_a_change_leaves_its_outcome_unknown_and_a_mismatch_is_a_protocol_error()
{
    let unreadable = ProtocolError::BadPayload(PayloadError::Truncated("a status"));
    let (kind, _answer) = a_change(&["VSET1"]);
    let ReplyPlan::Answer { answer, cache, .. } = answered(kind, Err(unreadable.clone())) else {
        panic!("its caller is told");
    };
    assert!(cache.is_empty());
    assert!(matches!(
        answer,
        Err(LinkError::OutcomeUnknown(OutcomeCause::Reply(_)))
    ));
    let mismatch = ProtocolError::UnexpectedReply {
        asked: Opcode::Write,
        answered: Opcode::ReadReply,
    };
    let (kind, _answer) = a_change(&[]);
    let ReplyPlan::Answer { answer, .. } = answered(kind, Err(mismatch.clone())) else {
        panic!("its caller is told");
    };
    assert!(matches!(answer, Err(LinkError::Protocol(_))));
    // A passed request's unreadable answer is a protocol error: nothing was changed by it.
    let (reply, _answer) = oneshot::channel();
    let ReplyPlan::Answer { answer, .. } = answered(InFlightKind::Pass { reply }, Err(unreadable))
    else {
        panic!("its caller is told");
    };
    assert!(matches!(
        answer,
        Err(LinkError::Protocol(ProtocolError::BadPayload(_)))
    ));
}

#[test]
fn a_read_answer_is_answered_refused_wrong_or_lost() {
    let mut reads = ReadQueue::new(CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    });
    let mut waiting = Vec::new();
    let mut batch = || {
        let (reply, answer) = oneshot::channel();
        waiting.push(answer);
        let now = Instant::now();
        reads.enqueue(vec![format!("VMON{}", waiting.len())], None, reply, now);
        reads.next_batch(now).expect("a read is due at once")
    };
    let plan = |batch, answer| match answered(InFlightKind::Read(batch), answer) {
        ReplyPlan::Read { outcome, .. } => outcome,
        _ => panic!("a READ's answer goes to its readers"),
    };
    let values = Ok(Response::Read(vec![Ok(Value::Float(1.0))]));
    assert!(matches!(
        plan(batch(), values),
        ReadOutcome::Answered(ReadAnswer::Values(_))
    ));
    let refused = Ok(Response::Error(StationError {
        code: ErrorCode::Busy,
        message: String::new(),
    }));
    assert!(matches!(
        plan(batch(), refused),
        ReadOutcome::Answered(ReadAnswer::Refused(_))
    ));
    assert!(matches!(
        plan(batch(), Ok(Response::Reset)),
        ReadOutcome::Wrong(LinkError::Protocol(ProtocolError::ReadMismatch {
            names: 1,
            ..
        }))
    ));
    let unreadable = ProtocolError::BadPayload(PayloadError::Truncated("a value"));
    assert!(matches!(
        plan(batch(), Err(unreadable)),
        ReadOutcome::Lost(_)
    ));
}

#[test]
fn a_list_refresh_reply_goes_to_the_refresh() {
    let page = answered(
        InFlightKind::ListPage {
            change: ChangeType::Added,
            channels: Vec::new(),
        },
        Ok(Response::Reset),
    );
    assert!(matches!(
        page,
        ReplyPlan::Page {
            change: ChangeType::Added,
            ..
        }
    ));
    let ReplyPlan::Inquiry { answer, warning } =
        answered(InFlightKind::ConfigInquiry, Ok(Response::Reset))
    else {
        panic!("an inquiry's answer goes to the refresh");
    };
    assert!(answer.is_none());
    assert_eq!(
        warning.as_deref(),
        Some("the station answered a configuration inquiry with ResetReply")
    );
    assert!(matches!(
        answered(InFlightKind::Ping, Ok(Response::Reset)),
        ReplyPlan::Nothing
    ));
}

#[tokio::test]
async fn which_error_a_request_gets_when_its_time_is_up_or_the_session_ends() {
    let timeout = Duration::from_secs(2);
    let longest = Duration::from_secs(8);
    // Unanswered in time: a change is in doubt, anything else timed out.
    let (kind, answer) = a_change(&["VSET1"]);
    let Expired::Answer(waiting, error) = expired(kind, timeout, longest) else {
        panic!("a change's caller is told");
    };
    waiting.answer(error);
    assert!(matches!(
        answer.await.unwrap(),
        Err(LinkError::WriteTimeout { timeout: t, max_processing: m }) if t == timeout && m == longest
    ));
    let (reply, answer) = oneshot::channel();
    let Expired::Answer(waiting, error) = expired(InFlightKind::Pass { reply }, timeout, longest)
    else {
        panic!("a passed request's caller is told");
    };
    waiting.answer(error);
    assert!(matches!(answer.await.unwrap(), Err(LinkError::Timeout(t)) if t == timeout));
    assert!(matches!(
        expired(InFlightKind::Ping, timeout, longest),
        Expired::Ping
    ));
    assert!(matches!(
        expired(InFlightKind::ConfigInquiry, timeout, longest),
        Expired::ConfigInquiry
    ));
    // The session ends: a change already sent may or may not have been applied; a request
    // not sent, or one that changes nothing, was not done.
    let why = LinkDown::PingTimeout(timeout);
    let (kind, answer) = a_change(&[]);
    let (waiting, error) = cut_off(kind, &why).expect("a change's caller is told");
    waiting.answer(error);
    assert!(matches!(
        answer.await.unwrap(),
        Err(LinkError::OutcomeUnknown(OutcomeCause::LinkDown(_)))
    ));
    let (parts, mut frames) = mpsc::unbounded_channel();
    let (waiting, error) =
        cut_off(InFlightKind::Stream { parts }, &why).expect("a stream's sink is told");
    waiting.answer(error);
    assert!(matches!(
        frames.recv().await,
        Some(Err(LinkError::Disconnected(_)))
    ));
    assert!(cut_off(InFlightKind::Ping, &why).is_none());
    let (queued, answer) = change(write(&["VSET1"]), None);
    let (waiting, error) = never_sent(queued, &why);
    waiting.answer(error);
    assert!(matches!(
        answer.await.unwrap(),
        Err(LinkError::Disconnected(_))
    ));
}

/// A TRANSACT answers for its channel (its answer goes into the cache) and makes that channel
/// stale until then, if the station's table knows it.
#[test]
fn a_transact_answers_for_its_channel_and_makes_it_stale_if_known() {
    let now = Instant::now();
    let transact = |name: &str| Request::Transact {
        name: name.into(),
        value: Value::Integer(1),
    };
    for (name, stale) in [("VSET1", vec!["VSET1"]), ("MADE_UP", vec![])] {
        let (queued, _answer) = change(transact(name), None);
        match take(queued, judged_at(&LeaseSnapshot::Free, now), known) {
            Taken::Send {
                stale: made_stale,
                kind: InFlightKind::Change { answers_for, .. },
                ..
            } => {
                assert_eq!(answers_for, [name], "{name}");
                assert_eq!(made_stale, stale, "{name}");
            }
            _ => panic!("an unguarded TRANSACT is sent"),
        }
    }
}

/// A CONFIGURE's answer carries the channel's configuration for the table, then goes to its
/// caller; other answers carry none.
#[test]
fn a_configure_answer_carries_the_channels_configuration_for_the_table() {
    let reply = ConfigureReply {
        channel: ChannelDescriptor {
            name: "VSET1".into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: Direction::Out,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: true,
            consuming: false,
            value_type: ValueType::Float,
            options: vec![],
        },
        config: ChannelConfig {
            enabled: true,
            capability: Direction::Out,
            type_capability: 1,
            device: String::new(),
            limits: None,
            details: Vec::new(),
        },
    };
    let (kind, _answer) = a_change(&[]);
    let ReplyPlan::Answer { configured, .. } =
        answered(kind, Ok(Response::Configure(Box::new(reply.clone()))))
    else {
        panic!("a CONFIGURE's answer goes to its caller");
    };
    assert_eq!(configured.as_deref(), Some(&reply));
    let (kind, _answer) = a_change(&[]);
    let ReplyPlan::Answer { configured, .. } = answered(kind, Ok(Response::Reset)) else {
        panic!("a RESET's answer goes to its caller");
    };
    assert!(configured.is_none());
}
