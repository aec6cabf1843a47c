//! Tests of the link's state machine alone: commands, frames and ticks with the time passed in,
//! and the effects it answers with; no socket, no runtime clock.

use station_protocol::{ErrorCode, ItemResult, StationError, Value};
use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::link::doubts::Doubt;
use crate::link::guard::{Guarded, LeaseSnapshot, LeaseWatch, SendGuard};
use crate::link::info::{ChannelTable, StationInfo};

const TIMEOUT: Duration = Duration::from_secs(1);

/// The link's shared view the state machine reads and writes: the cache and the published info.
struct World {
    cache: ValueCache,
    info: PublishedInfo,
}

impl World {
    fn new() -> World {
        World::with_channels(&[])
    }

    fn with_channels(names: &[&str]) -> World {
        let channels = names.iter().map(|name| descriptor(name)).collect();
        let info = StationInfo {
            generation: 1,
            channels: Arc::new(ChannelTable::new(channels)),
            ..StationInfo::default()
        };
        World {
            cache: ValueCache::new(),
            info: PublishedInfo::new(info).0,
        }
    }
}

fn descriptor(name: &str) -> ChannelDescriptor {
    ChannelDescriptor {
        name: name.into(),
        alias: String::new(),
        net_name: String::new(),
        type_flags: 1,
        direction: station_protocol::Direction::Out,
        unit: String::new(),
        description: String::new(),
        group: String::new(),
        readable: true,
        writable: true,
        consuming: false,
        value_type: station_protocol::ValueType::Float,
        options: vec![],
    }
}

/// A link of generation 1 whose reads go out at once, at most `max_names` to a READ.
fn link(window: usize, max_names: usize) -> LinkState {
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names,
    };
    LinkState::new(
        1,
        window,
        (TIMEOUT, 4 * TIMEOUT),
        policy,
        Default::default(),
    )
}

type ReadAnswerRx = oneshot::Receiver<Result<Vec<ItemResult<Value>>, LinkError>>;
type ChangeAnswer = oneshot::Receiver<Result<Response, LinkError>>;

fn read(link: &mut LinkState, names: &[&str], now: Instant) -> ReadAnswerRx {
    let (reply, answer) = oneshot::channel();
    let command = Command::Read {
        names: names.iter().map(|name| (*name).to_owned()).collect(),
        caller: None,
        reply,
    };
    assert!(link.on_command(command, now).next().is_none());
    answer
}

fn write_request(name: &str, value: f64) -> Request {
    Request::Write {
        items: vec![(name.into(), Value::Float(value))],
    }
}

fn change(link: &mut LinkState, request: Request, guard: Option<SendGuard>) -> ChangeAnswer {
    let (reply, answer) = oneshot::channel();
    let command = Command::Change {
        request,
        guard,
        reply,
    };
    assert!(link.on_command(command, Instant::now()).next().is_none());
    answer
}

fn settle(link: &mut LinkState, scope: SettleScope, now: Instant) -> Vec<Effect> {
    let (reply, _answer) = oneshot::channel();
    link.on_command(Command::Settle { scope, reply }, now)
        .collect()
}

/// The effects of one `next_frame`, with every answer among them delivered.
fn next(link: &mut LinkState, world: &World, now: Instant) -> Vec<Effect> {
    delivered(link.next_frame(now, &world.cache, &world.info))
}

fn frame(link: &mut LinkState, world: &World, frame: RawFrame, now: Instant) -> Vec<Effect> {
    delivered(link.on_frame(frame, now, &world.cache))
}

fn delivered(effects: Effects<'_>) -> Vec<Effect> {
    effects.filter_map(Effect::deliver).collect()
}

/// The frames written among `effects`.
fn written(effects: &[Effect]) -> Vec<&RawFrame> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Write(frame) => Some(frame),
            _ => None,
        })
        .collect()
}

/// Every frame `next_frame` sends in one round, in order.
fn round(link: &mut LinkState, world: &World, now: Instant) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    loop {
        let effects = next(link, world, now);
        let sent: Vec<RawFrame> = written(&effects).into_iter().cloned().collect();
        if sent.is_empty() {
            return frames;
        }
        frames.extend(sent);
    }
}

fn opcodes(frames: &[RawFrame]) -> Vec<Opcode> {
    frames.iter().map(|frame| frame.kind().unwrap()).collect()
}

fn answer(response: Response, to: &RawFrame) -> RawFrame {
    response.to_frame(to.request_id).unwrap()
}

fn counts(effects: &[Effect]) -> Vec<Count> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Count(count) => Some(*count),
            _ => None,
        })
        .collect()
}

fn down(effects: &[Effect]) -> Option<&LinkDown> {
    effects.iter().find_map(|effect| match effect {
        Effect::Down(why) => Some(why),
        _ => None,
    })
}

#[tokio::test]
async fn a_read_goes_out_and_its_values_are_in_the_cache_when_its_reader_is_answered() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let mut answer_rx = read(&mut link, &["V1", "V2"], t0);
    let effects = next(&mut link, &world, t0);
    let sent = written(&effects);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        Request::from_frame(sent[0]).unwrap(),
        Request::Read {
            names: vec!["V1".into(), "V2".into()]
        }
    );
    assert_eq!(counts(&effects), [Count::ReadFrame { names: 2 }]);
    let read_frame = sent[0].clone();
    assert!(next(&mut link, &world, t0).is_empty(), "the round is over");
    assert!(
        answer_rx.try_recv().is_err(),
        "not answered before the station"
    );
    let refused = StationError::new(ErrorCode::UnknownChannel, "no such channel");
    let reply = Response::Read(vec![Ok(Value::Float(1.5)), Err(refused)]);
    let later = t0 + Duration::from_millis(5);
    let effects = frame(&mut link, &world, answer(reply, &read_frame), later);
    assert!(
        matches!(effects[..], [Effect::Latency(latency)] if latency == Duration::from_millis(5)),
        "{effects:?}"
    );
    let cached = world.cache.get("V1").expect("the value is cached");
    assert_eq!(cached.value, Value::Float(1.5));
    assert_eq!(cached.generation, 1);
    assert_eq!(
        cached.read_at,
        t0.into_std(),
        "aged from when the READ was sent"
    );
    assert!(world.cache.get("V2").is_none());
    let values = answer_rx.try_recv().unwrap().unwrap();
    assert_eq!(values[0], Ok(Value::Float(1.5)));
    assert!(values[1].is_err());
    assert_eq!(link.next_deadline(), None, "nothing left in flight");
}

#[tokio::test]
async fn reads_and_changes_take_turns_and_fill_the_window() {
    let world = World::new();
    let mut link = link(8, 1);
    let now = Instant::now();
    let _reads: Vec<_> = ["A", "B", "C"]
        .iter()
        .map(|name| read(&mut link, &[name], now))
        .collect();
    let _changes: Vec<_> = (0..2)
        .map(|i| change(&mut link, write_request("OUT", f64::from(i)), None))
        .collect();
    let frames = round(&mut link, &world, now);
    assert_eq!(
        opcodes(&frames),
        [
            Opcode::Read,
            Opcode::Write,
            Opcode::Read,
            Opcode::Write,
            Opcode::Read
        ]
    );
    let ids: Vec<u32> = frames.iter().map(|frame| frame.request_id).collect();
    assert!(ids.windows(2).all(|pair| pair[1] > pair[0]), "{ids:?}");
    assert_eq!(link.next_deadline(), Some(now + TIMEOUT));
}

#[tokio::test]
async fn a_full_window_sends_nothing_more_until_a_reply_makes_room() {
    let world = World::new();
    let mut link = link(1, 1);
    let now = Instant::now();
    let _a = read(&mut link, &["A"], now);
    let _b = read(&mut link, &["B"], now);
    let first = round(&mut link, &world, now);
    assert_eq!(first.len(), 1, "one request at a time");
    assert_eq!(link.next_release(), None, "no room: nothing is due");
    assert!(round(&mut link, &world, now).is_empty());
    let reply = Response::Read(vec![Ok(Value::Float(1.0))]);
    frame(&mut link, &world, answer(reply, &first[0]), now);
    let second = round(&mut link, &world, now);
    assert_eq!(
        Request::from_frame(&second[0]).unwrap(),
        Request::Read {
            names: vec!["B".into()]
        }
    );
}

/// A reader of a channel whose READ is on the wire is held for company; once that READ is
/// answered, the held READ is due `quiet` after its reader came, and goes out then.
#[tokio::test]
async fn a_held_read_is_due_its_quiet_time_after_its_reader_came_and_goes_out_then() {
    const QUIET: Duration = Duration::from_millis(3);
    let world = World::new();
    let policy = CoalescePolicy {
        quiet: QUIET,
        max: Duration::from_millis(50),
        max_names: 10,
    };
    let mut link = LinkState::new(1, 4, (TIMEOUT, 4 * TIMEOUT), policy, Default::default());
    let t0 = Instant::now();
    let _first = read(&mut link, &["A"], t0);
    let on_wire = round(&mut link, &world, t0);
    assert_eq!(on_wire.len(), 1);
    let came = t0 + Duration::from_millis(1);
    let _second = read(&mut link, &["A"], came);
    assert!(round(&mut link, &world, came).is_empty(), "held");
    assert_eq!(link.next_release(), None, "A is still on the wire");
    let reply = Response::Read(vec![Ok(Value::Float(1.0))]);
    frame(&mut link, &world, answer(reply, &on_wire[0]), came);
    assert_eq!(link.next_release(), Some(came + QUIET));
    assert!(round(&mut link, &world, came + QUIET).len() == 1);
    assert_eq!(link.next_release(), None, "nothing held any more");
}

#[tokio::test]
async fn a_reply_for_nothing_in_flight_is_counted_late_and_answers_nobody() {
    let world = World::new();
    let mut link = link(4, 10);
    let now = Instant::now();
    let stray = Response::Ping { nonce: 9 }.to_frame(99).unwrap();
    let effects = frame(&mut link, &world, stray, now);
    assert_eq!(counts(&effects), [Count::LateReply]);
    assert_eq!(effects.len(), 1, "{effects:?}");
}

#[tokio::test]
async fn a_late_reply_after_a_timeout_reaches_nobody() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let mut answer_rx = read(&mut link, &["A"], t0);
    let sent = round(&mut link, &world, t0);
    let effects = delivered(link.on_tick(t0 + TIMEOUT));
    assert_eq!(counts(&effects), [Count::Timeout]);
    assert!(matches!(
        answer_rx.try_recv().unwrap(),
        Err(LinkError::Timeout(_))
    ));
    let reply = Response::Read(vec![Ok(Value::Float(1.0))]);
    let effects = frame(&mut link, &world, answer(reply, &sent[0]), t0 + TIMEOUT);
    assert_eq!(counts(&effects), [Count::LateReply]);
    assert!(world.cache.get("A").is_none(), "a late value is not cached");
}

#[tokio::test]
async fn a_notification_goes_to_the_subscribers() {
    let world = World::new();
    let mut link = link(4, 10);
    let notify = Notify::OutputTripped {
        channel: "OUT".into(),
        message: "IMON above ISET".into(),
    };
    let effects = frame(
        &mut link,
        &world,
        Response::Notify(notify.clone()).to_frame(0).unwrap(),
        Instant::now(),
    );
    assert!(
        matches!(&effects[..], [Effect::Notified(got)] if *got == notify),
        "{effects:?}"
    );
    // Anything else with request id 0 is dropped.
    let odd = Response::Ping { nonce: 1 }.to_frame(0).unwrap();
    assert!(frame(&mut link, &world, odd, Instant::now()).is_empty());
}

/// Sends a write of lease `fence` at `t0` and lets it time out unanswered; returns its frame.
fn a_write_in_doubt(
    link: &mut LinkState,
    world: &World,
    fence: u64,
    t0: Instant,
) -> (RawFrame, Vec<Effect>) {
    let mut answer_rx = change(
        link,
        write_request("OUT", 1.0),
        Some(SendGuard::passing(Some(fence))),
    );
    let sent = round(link, world, t0).remove(0);
    assert!(
        delivered(link.on_tick(t0 + TIMEOUT - Duration::from_millis(1))).is_empty(),
        "not yet"
    );
    let effects = delivered(link.on_tick(t0 + TIMEOUT));
    assert!(matches!(
        answer_rx.try_recv().unwrap(),
        Err(LinkError::WriteTimeout { .. })
    ));
    (sent, effects)
}

/// Answers the PING among `effects`, at `now`.
fn pong(link: &mut LinkState, world: &World, effects: &[Effect], now: Instant) {
    let ping = written(effects)[0].clone();
    assert_eq!(ping.kind(), Some(Opcode::Ping));
    let pong = Response::Ping {
        nonce: u64::from(ping.request_id),
    };
    let effects = frame(link, world, answer(pong, &ping), now);
    assert!(matches!(effects[..], [Effect::Latency(_)]), "{effects:?}");
}

#[tokio::test]
async fn a_tick_past_a_changes_deadline_leaves_it_in_doubt_and_pings_the_station() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let (_, effects) = a_write_in_doubt(&mut link, &world, 3, t0);
    assert_eq!(counts(&effects), [Count::Timeout]);
    let ping = written(&effects);
    assert_eq!(opcodes(&[ping[0].clone()]), [Opcode::Ping]);
    assert!(down(&effects).is_none());
    assert!(link.doubts().holds(SettleScope::Fence(3)), "in doubt");
    assert!(!link.doubts().holds(SettleScope::Fence(4)));
    // Until the longest processing: the next deadline is its bound (after the PING's).
    assert_eq!(link.next_deadline(), Some(t0 + 2 * TIMEOUT));
    pong(&mut link, &world, &effects, t0 + TIMEOUT);
    assert_eq!(link.next_deadline(), Some(t0 + 4 * TIMEOUT));
}

#[tokio::test]
async fn a_late_answer_to_a_change_in_doubt_ends_its_doubt_and_answers_its_settle() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let (sent, _) = a_write_in_doubt(&mut link, &world, 3, t0);
    assert!(settle(&mut link, SettleScope::Fence(3), t0 + TIMEOUT).is_empty());
    let late = answer(Response::Write(vec![Ok(())]), &sent);
    let effects = link
        .on_frame(late, t0 + 2 * TIMEOUT, &world.cache)
        .collect::<Vec<_>>();
    let settled = effects.iter().find_map(|effect| match effect {
        Effect::Settled(_, settled) => Some(*settled),
        _ => None,
    });
    assert_eq!(settled, Some(Settled { lapsed_at: None }), "{effects:?}");
    assert!(!link.doubts().holds(SettleScope::Fence(3)));
}

#[tokio::test]
async fn a_change_in_doubt_a_settle_waits_for_resets_the_link_at_the_longest_processing() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let (_, effects) = a_write_in_doubt(&mut link, &world, 3, t0);
    pong(&mut link, &world, &effects, t0 + TIMEOUT);
    assert!(settle(&mut link, SettleScope::Fence(3), t0 + TIMEOUT).is_empty());
    // A settle of another fence is answered at once.
    assert!(matches!(
        settle(&mut link, SettleScope::Fence(4), t0 + TIMEOUT)[..],
        [Effect::Settled(_, Settled { lapsed_at: None })]
    ));
    let just_before = t0 + 4 * TIMEOUT - Duration::from_millis(1);
    let effects = delivered(link.on_tick(just_before));
    assert!(down(&effects).is_none(), "{effects:?}");
    let effects = delivered(link.on_tick(t0 + 4 * TIMEOUT));
    assert!(
        matches!(
            effects.last(),
            Some(Effect::Down(LinkDown::ChangeInDoubt { fence: 3, max_processing }))
                if *max_processing == 4 * TIMEOUT
        ),
        "{effects:?}"
    );
}

#[tokio::test]
async fn a_change_in_doubt_nobody_waits_for_leaves_doubt_at_the_longest_processing() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let (_, effects) = a_write_in_doubt(&mut link, &world, 3, t0);
    pong(&mut link, &world, &effects, t0 + TIMEOUT);
    let lapsed = t0 + 4 * TIMEOUT;
    let effects = delivered(link.on_tick(lapsed));
    assert!(down(&effects).is_none(), "{effects:?}");
    assert!(!link.doubts().holds(SettleScope::Fence(3)));
    assert!(matches!(
        settle(&mut link, SettleScope::Fence(3), lapsed)[..],
        [Effect::Settled(_, Settled { lapsed_at: Some(at) })] if at == lapsed
    ));
}

#[tokio::test]
async fn a_ping_unanswered_in_time_ends_the_session() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let _ = a_write_in_doubt(&mut link, &world, 3, t0);
    let effects = delivered(link.on_tick(t0 + 2 * TIMEOUT));
    assert_eq!(counts(&effects), [Count::Timeout]);
    assert!(
        matches!(effects.last(), Some(Effect::Down(LinkDown::PingTimeout(t))) if *t == TIMEOUT),
        "{effects:?}"
    );
}

#[tokio::test]
async fn the_link_dropping_with_changes_in_flight_leaves_them_unknown_and_in_doubt() {
    let world = World::new();
    let mut link = link(2, 10);
    let now = Instant::now();
    let mut sent_rx = change(
        &mut link,
        write_request("OUT", 1.0),
        Some(SendGuard::passing(Some(5))),
    );
    let mut read_rx = read(&mut link, &["A"], now);
    let frames = round(&mut link, &world, now);
    assert_eq!(opcodes(&frames), [Opcode::Read, Opcode::Write]);
    let mut queued_rx = change(&mut link, write_request("OUT", 2.0), None);
    let mut queued_read_rx = read(&mut link, &["B"], now);
    let (settle_tx, mut settle_rx) = oneshot::channel();
    assert!(
        link.on_command(
            Command::Settle {
                scope: SettleScope::Fence(5),
                reply: settle_tx
            },
            now
        )
        .next()
        .is_none()
    );
    let effects = delivered(link.on_link_down(&LinkDown::Closed));
    assert!(effects.is_empty(), "{effects:?}");
    assert!(matches!(
        sent_rx.try_recv().unwrap(),
        Err(LinkError::OutcomeUnknown(_))
    ));
    for read_rx in [&mut read_rx, &mut queued_read_rx] {
        assert!(matches!(
            read_rx.try_recv().unwrap(),
            Err(LinkError::Disconnected(LinkDown::Closed))
        ));
    }
    assert!(matches!(
        queued_rx.try_recv().unwrap(),
        Err(LinkError::Disconnected(LinkDown::Closed))
    ));
    let (doubts, settling) = link.carried();
    assert!(doubts.holds(SettleScope::Fence(5)), "still at the station");
    assert_eq!(settling.len(), 1, "the settle goes on waiting");
    assert!(settle_rx.try_recv().is_err());
}

#[tokio::test]
async fn a_change_its_send_guard_refuses_is_answered_and_counted_never_sent() {
    let world = World::new();
    let mut link = link(4, 10);
    let now = Instant::now();
    let held = LeaseSnapshot::Held {
        owner: "B".into(),
        fence: 8,
        until: now + TIMEOUT,
    };
    let guard = SendGuard::lease(Some(7), Guarded::Change, LeaseWatch::new(held));
    let mut refused_rx = change(&mut link, write_request("OUT", 1.0), Some(guard));
    let mut passed_rx = change(&mut link, write_request("OUT", 2.0), None);
    let effects = next(&mut link, &world, now);
    assert_eq!(
        counts(&effects),
        [Count::RefusedByGuard, Count::ChangeFrame]
    );
    let sent = written(&effects);
    assert_eq!(
        Request::from_frame(sent[0]).unwrap(),
        write_request("OUT", 2.0),
        "the next change goes in its place"
    );
    assert!(matches!(
        refused_rx.try_recv().unwrap(),
        Err(LinkError::Refused(_))
    ));
    assert!(passed_rx.try_recv().is_err());
    assert!(!link.doubts().holds(SettleScope::Fence(7)));
}

#[tokio::test]
async fn a_change_whose_caller_gave_up_is_never_sent() {
    let world = World::new();
    let mut link = link(4, 10);
    drop(change(&mut link, write_request("OUT", 1.0), None));
    assert!(round(&mut link, &world, Instant::now()).is_empty());
}

#[tokio::test]
async fn a_change_too_large_for_a_frame_is_answered_and_the_next_goes() {
    let world = World::new();
    let mut link = link(4, 10);
    let huge = Request::Write {
        items: (0..20_000)
            .map(|i| (format!("CHANNEL{i}"), Value::Float(0.0)))
            .collect(),
    };
    let mut huge_rx = change(&mut link, huge, None);
    let _next = change(&mut link, write_request("OUT", 1.0), None);
    let frames = round(&mut link, &world, Instant::now());
    assert_eq!(opcodes(&frames), [Opcode::Write]);
    assert!(matches!(
        huge_rx.try_recv().unwrap(),
        Err(LinkError::TooLarge(_))
    ));
}

#[tokio::test]
async fn a_write_makes_the_station_channels_it_writes_stale_as_it_goes_out() {
    let world = World::with_channels(&["OUT"]);
    let read_at = std::time::Instant::now();
    world.cache.insert("OUT", Value::Float(0.0), read_at, 1);
    world.cache.insert("ELSE", Value::Float(0.0), read_at, 1);
    let mut link = link(4, 10);
    let _answer = change(&mut link, write_request("OUT", 1.0), None);
    assert!(world.cache.get("OUT").is_some(), "not before it goes out");
    round(&mut link, &world, Instant::now());
    assert!(world.cache.get("OUT").is_none(), "stale once sent");
    let _answer = change(&mut link, write_request("ELSE", 1.0), None);
    round(&mut link, &world, Instant::now());
    assert!(
        world.cache.get("ELSE").is_some(),
        "a name the station does not list gets no cache slot"
    );
}

#[tokio::test]
async fn a_transact_answer_goes_into_the_cache_and_a_reset_answer_notes_the_restart() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let transact = Request::Transact {
        name: "BUS".into(),
        value: Value::Float(1.0),
    };
    let mut transact_rx = change(&mut link, transact, None);
    let reset = Request::Reset(station_protocol::Reset {
        requester: "test".into(),
    });
    let mut reset_rx = change(&mut link, reset, None);
    let frames = round(&mut link, &world, t0);
    let effects = frame(
        &mut link,
        &world,
        answer(Response::Transact(Value::Float(2.0)), &frames[0]),
        t0,
    );
    assert!(matches!(effects[..], [Effect::Latency(_)]), "{effects:?}");
    assert_eq!(world.cache.get("BUS").unwrap().value, Value::Float(2.0));
    assert_eq!(
        transact_rx.try_recv().unwrap().unwrap(),
        Response::Transact(Value::Float(2.0))
    );
    let effects = frame(&mut link, &world, answer(Response::Reset, &frames[1]), t0);
    assert!(
        matches!(effects[..], [Effect::Latency(_), Effect::Restarted]),
        "{effects:?}"
    );
    assert_eq!(reset_rx.try_recv().unwrap().unwrap(), Response::Reset);
}

#[tokio::test]
async fn a_streamed_request_gets_every_part_and_its_end() {
    let world = World::new();
    let mut link = link(4, 10);
    let t0 = Instant::now();
    let (parts, mut parts_rx) = mpsc::unbounded_channel();
    let command = Command::Stream {
        request: Request::Ping { nonce: 1 },
        guard: None,
        parts,
    };
    assert!(link.on_command(command, t0).next().is_none());
    let sent = round(&mut link, &world, t0);
    assert_eq!(sent.len(), 1);
    let error = Response::Error(StationError::new(ErrorCode::Unsupported, "no"));
    frame(&mut link, &world, answer(error.clone(), &sent[0]), t0);
    assert_eq!(parts_rx.try_recv().unwrap().unwrap(), error);
    assert_eq!(link.next_deadline(), None);
}

#[tokio::test]
async fn a_configuration_notify_starts_a_list_refresh_whose_end_is_published() {
    let world = World::new();
    let mut link = link(4, 10);
    let now = Instant::now();
    let notify = Response::Notify(Notify::ConfigurationChanged {
        change: ChangeType::Changed,
        message: "swapped".into(),
    })
    .to_frame(0)
    .unwrap();
    let effects = frame(&mut link, &world, notify.clone(), now);
    let list = written(&effects)[0].clone();
    assert_eq!(list.kind(), Some(Opcode::List));
    assert!(matches!(effects.last(), Some(Effect::Notified(_))));
    let listed = Response::List {
        total: 1,
        offset: 0,
        channels: vec![descriptor("NEW")],
    };
    // Every page is in: the configuration inquiries go out at once.
    let effects = frame(&mut link, &world, answer(listed, &list), now);
    let inquiry = written(&effects)[0].clone();
    assert_eq!(inquiry.kind(), Some(Opcode::Configure));
    let unsupported = Response::Error(StationError::new(ErrorCode::Unsupported, "no"));
    let effects = frame(&mut link, &world, answer(unsupported, &inquiry), now);
    assert!(
        matches!(&effects[..], [Effect::Latency(_), Effect::Relisted { change: ChangeType::Changed, channels, configs }]
            if channels.len() == 1 && configs.is_empty()),
        "{effects:?}"
    );
    // A page unanswered in time ends the refresh; the next NOTIFY starts another.
    let effects = frame(&mut link, &world, notify.clone(), now);
    assert_eq!(written(&effects).len(), 1);
    let effects = delivered(link.on_tick(now + TIMEOUT));
    assert!(down(&effects).is_none());
    let effects = frame(&mut link, &world, notify, now + TIMEOUT);
    assert_eq!(written(&effects)[0].kind(), Some(Opcode::List));
}

#[tokio::test]
async fn a_refresh_asks_configurations_in_the_room_the_callers_leave() {
    let world = World::new();
    let mut link = link(2, 1);
    let now = Instant::now();
    let notify = Response::Notify(Notify::ConfigurationChanged {
        change: ChangeType::Changed,
        message: String::new(),
    })
    .to_frame(0)
    .unwrap();
    let list = written(&frame(&mut link, &world, notify, now))[0].clone();
    let listed = Response::List {
        total: 3,
        offset: 0,
        channels: vec![descriptor("A"), descriptor("B"), descriptor("C")],
    };
    let _read = read(&mut link, &["X"], now);
    // Every page in: the inquiries take the room the page leaves, before the read waiting.
    let effects = frame(&mut link, &world, answer(listed, &list), now);
    let inquiries: Vec<RawFrame> = written(&effects).into_iter().cloned().collect();
    assert_eq!(opcodes(&inquiries), [Opcode::Configure, Opcode::Configure]);
    assert!(
        round(&mut link, &world, now).is_empty(),
        "the window is full"
    );
    let not_configurable = || Response::Error(StationError::new(ErrorCode::UnknownChannel, "no"));
    let effects = frame(
        &mut link,
        &world,
        answer(not_configurable(), &inquiries[0]),
        now,
    );
    assert!(written(&effects).is_empty(), "{effects:?}");
    assert_eq!(
        opcodes(&round(&mut link, &world, now)),
        [Opcode::Read],
        "the callers go first"
    );
    frame(
        &mut link,
        &world,
        answer(not_configurable(), &inquiries[1]),
        now,
    );
    assert_eq!(
        opcodes(&round(&mut link, &world, now)),
        [Opcode::Configure],
        "the room the callers leave goes to the last inquiry"
    );
}

#[tokio::test]
async fn inherited_doubts_hold_a_settle_until_their_instant() {
    let mut link = link(4, 10);
    let now = Instant::now();
    let until = now + TIMEOUT;
    let inherit = Command::Inherit {
        doubts: vec![Doubt { fence: 2, until }],
    };
    assert!(link.on_command(inherit, now).next().is_none());
    assert!(settle(&mut link, SettleScope::Fence(2), now).is_empty());
    assert_eq!(link.next_deadline(), Some(until));
    let effects = link.on_tick(until).collect::<Vec<_>>();
    assert!(
        matches!(effects[..], [Effect::Settled(_, Settled { lapsed_at: Some(at) })] if at == until),
        "{effects:?}"
    );
}

#[tokio::test]
async fn request_ids_go_on_from_where_the_handshake_left_them() {
    let world = World::new();
    let mut link = link(4, 10);
    link.ids_from(100);
    let now = Instant::now();
    let _a = read(&mut link, &["A"], now);
    let _change = change(&mut link, write_request("OUT", 1.0), None);
    let ids: Vec<u32> = round(&mut link, &world, now)
        .iter()
        .map(|frame| frame.request_id)
        .collect();
    assert_eq!(ids, [100, 101]);
}
