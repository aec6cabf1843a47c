//! Unit tests of the read queue's rules, with the clock passed in: no sockets, no runtime.

use super::*;
use station_protocol::Value;
use tokio::sync::oneshot::error::TryRecvError;

type Answer = oneshot::Receiver<Result<Vec<ItemResult<Value>>, LinkError>>;

const QUIET: Duration = Duration::from_micros(300);
const MAX: Duration = Duration::from_micros(5000);

fn queue() -> ReadQueue {
    ReadQueue::new(CoalescePolicy {
        quiet: QUIET,
        max: MAX,
        max_names: 100,
    })
}

fn client(port: u16) -> Option<Caller> {
    Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

fn read(q: &mut ReadQueue, names: &[&str], caller: Option<Caller>, now: Instant) -> Answer {
    let (reply, answer) = oneshot::channel();
    let names = names.iter().map(|n| n.to_string()).collect();
    q.enqueue(names, caller, reply, now);
    answer
}

fn values(batch: &ReadBatch) -> ReadAnswer {
    ReadAnswer::Values(
        (0..batch.names.len())
            .map(|i| Ok(Value::Integer(i as i64)))
            .collect(),
    )
}

fn got(answer: &mut Answer) -> Vec<ItemResult<Value>> {
    match answer.try_recv() {
        Ok(Ok(results)) => results,
        other => panic!("expected values, got {other:?}"),
    }
}

fn waits(answer: &mut Answer) -> bool {
    matches!(answer.try_recv(), Err(TryRecvError::Empty))
}

#[test]
fn reads_not_yet_sent_are_merged_into_one_read_frame() {
    let mut q = queue();
    let t = Instant::now();
    let mut a = read(&mut q, &["a", "b"], None, t);
    let mut b = read(&mut q, &["b", "c"], None, t);
    let batch = q.next_batch(t).expect("a READ");
    assert_eq!(batch.names, ["a", "b", "c"]);
    assert!(q.next_batch(t).is_none(), "everything went in one READ");
    let answer = values(&batch);
    q.answered(batch, answer, t);
    assert_eq!(got(&mut a), [Ok(Value::Integer(0)), Ok(Value::Integer(1))]);
    assert_eq!(got(&mut b), [Ok(Value::Integer(1)), Ok(Value::Integer(2))]);
}

#[test]
fn an_empty_read_is_answered_at_once() {
    let mut q = queue();
    let mut a = read(&mut q, &[], None, Instant::now());
    assert!(got(&mut a).is_empty());
}

#[test]
fn a_reader_never_joins_a_read_already_on_the_wire_and_the_next_is_held_for_the_burst() {
    let mut q = queue();
    let t = Instant::now();
    let mut first = read(&mut q, &["a"], None, t);
    let on_wire = q.next_batch(t).expect("first READ");
    let mut second = read(&mut q, &["a"], None, t + QUIET / 3);
    assert!(q.next_batch(t + QUIET / 3).is_none(), "a is on the wire");
    let answer = values(&on_wire);
    q.answered(on_wire, answer, t + QUIET / 2);
    got(&mut first);
    assert!(
        waits(&mut second),
        "the second reader did not get the first READ's value"
    );
    // Held until no new reader came for `quiet` after the last one.
    let due = t + QUIET / 3 + QUIET;
    assert_eq!(q.next_release(true), Some(due));
    assert!(q.next_batch(due - Duration::from_micros(1)).is_none());
    let batch = q.next_batch(due).expect("the gathered READ");
    assert_eq!(batch.names, ["a"]);
}

#[test]
fn a_hold_ends_at_the_latest_max_after_it_began_however_many_readers_come() {
    let mut q = queue();
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], None, t);
    let _on_wire = q.next_batch(t).expect("first READ");
    let step = QUIET / 2;
    let mut now = t;
    let mut readers = Vec::new();
    while now < t + MAX * 2 {
        now += step;
        readers.push(read(&mut q, &["a"], None, now));
    }
    // The hold began with the second reader, at t + step.
    assert_eq!(q.next_release(true), None, "a is still on the wire");
    assert_eq!(
        q.held.get("a").map(|h| h.until),
        Some(t + step + MAX),
        "capped at max"
    );
}

#[test]
fn a_zero_max_never_holds() {
    let mut q = ReadQueue::new(CoalescePolicy {
        quiet: QUIET,
        max: Duration::ZERO,
        max_names: 100,
    });
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], None, t);
    let on_wire = q.next_batch(t).expect("first READ");
    let _reader = read(&mut q, &["a"], client(1), t);
    let answer = values(&on_wire);
    q.answered(on_wire, answer, t);
    assert!(
        q.next_batch(t).is_some(),
        "sent at once once a is off the wire"
    );
}

#[test]
fn readers_from_other_clients_just_after_an_answer_are_held_as_a_burst() {
    let mut q = queue();
    let t = Instant::now();
    let mut first = read(&mut q, &["a"], client(1), t);
    let batch = q.next_batch(t).expect("first READ");
    let answer = values(&batch);
    q.answered(batch, answer, t);
    got(&mut first);
    let later = t + QUIET / 2;
    let _reader = read(&mut q, &["a"], client(2), later);
    assert!(
        q.next_batch(later).is_none(),
        "another client's reader is held"
    );
    assert_eq!(q.next_release(true), Some(later + QUIET));
    assert!(q.next_batch(later + QUIET).is_some());
}

#[test]
fn a_clients_own_loop_is_never_held() {
    let mut q = queue();
    let mut now = Instant::now();
    for round in 0..10 {
        let mut answer = read(&mut q, &["a"], client(1), now);
        let batch = q
            .next_batch(now)
            .unwrap_or_else(|| panic!("round {round} was held"));
        let values = values(&batch);
        q.answered(batch, values, now);
        got(&mut answer);
        now += QUIET / 10;
    }
}

#[test]
fn clients_taking_turns_on_one_channel_are_never_held_once_each_was_answered() {
    let mut q = queue();
    let step = QUIET / 10;
    let mut now = Instant::now();
    // Both read together first: one READ, and each has been answered.
    let mut one = read(&mut q, &["a"], client(1), now);
    let mut two = read(&mut q, &["a"], client(2), now);
    let batch = q
        .next_batch(now)
        .expect("nothing on the wire: sent at once");
    let answer = values(&batch);
    q.answered(batch, answer, now);
    got(&mut one);
    got(&mut two);
    // Then each comes back a step after its own answer, while the other's READ is on the wire.
    now += step;
    let mut on_wire_answer = read(&mut q, &["a"], client(1), now);
    let mut on_wire = q
        .next_batch(now)
        .expect("nothing on the wire: sent at once");
    let mut back = 2;
    for round in 0..20 {
        now += step;
        let waiting_answer = read(&mut q, &["a"], client(back), now);
        assert!(
            q.next_batch(now).is_none(),
            "round {round}: a is on the wire"
        );
        assert_eq!(q.next_release(true), None, "round {round}: held");
        now += step;
        let values = values(&on_wire);
        q.answered(on_wire, values, now);
        got(&mut on_wire_answer);
        on_wire = q
            .next_batch(now)
            .unwrap_or_else(|| panic!("round {round}: the next READ was held"));
        on_wire_answer = waiting_answer;
        back = 3 - back;
    }
}

#[test]
fn new_clients_arriving_while_their_channel_is_on_the_wire_are_held_as_a_burst() {
    let mut q = queue();
    let t = Instant::now();
    let _first = read(&mut q, &["a"], client(1), t);
    let on_wire = q.next_batch(t).expect("first READ");
    let later = t + QUIET / 4;
    let _second = read(&mut q, &["a"], client(2), later);
    let _third = read(&mut q, &["a"], client(3), later);
    let answer = values(&on_wire);
    q.answered(on_wire, answer, later);
    assert!(q.next_batch(later).is_none(), "the burst's READ is held");
    assert_eq!(q.next_release(true), Some(later + QUIET));
    let batch = q.next_batch(later + QUIET).expect("the gathered READ");
    assert_eq!(batch.names, ["a"]);
}

#[test]
fn readers_without_a_client_connection_are_not_held_after_an_answer() {
    let mut q = queue();
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], client(1), t);
    let batch = q.next_batch(t).expect("first READ");
    let answer = values(&batch);
    q.answered(batch, answer, t);
    let _reader = read(&mut q, &["a"], None, t);
    assert!(q.next_batch(t).is_some());
}

#[test]
fn an_answer_older_than_quiet_starts_no_hold() {
    let mut q = queue();
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], client(1), t);
    let batch = q.next_batch(t).expect("first READ");
    let answer = values(&batch);
    q.answered(batch, answer, t);
    let _reader = read(&mut q, &["a"], client(2), t + QUIET);
    assert!(q.next_batch(t + QUIET).is_some());
}

#[test]
fn a_hold_that_ended_between_dispatch_and_the_wait_is_still_due() {
    let mut q = queue();
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], None, t);
    let on_wire = q.next_batch(t).expect("first READ");
    let mut held = read(&mut q, &["a"], None, t);
    let answer = values(&on_wire);
    q.answered(on_wire, answer, t);
    // Dispatch runs just before the hold ends and sends nothing ...
    assert!(q.next_batch(t + QUIET - Duration::from_micros(1)).is_none());
    // ... and by the time the task waits, the hold is over: it must still wake.
    let due = q.next_release(true).expect("the held READ is due");
    assert!(due <= t + QUIET);
    let batch = q.next_batch(t + QUIET).expect("sent, not forgotten");
    let answer = values(&batch);
    q.answered(batch, answer, t + QUIET);
    got(&mut held);
}

#[test]
fn no_release_is_due_while_the_window_is_full() {
    let mut q = queue();
    let t = Instant::now();
    let _reader = read(&mut q, &["a"], None, t);
    let on_wire = q.next_batch(t).expect("first READ");
    let _reader = read(&mut q, &["a"], None, t);
    let answer = values(&on_wire);
    q.answered(on_wire, answer, t);
    assert!(q.next_release(false).is_none());
    assert!(q.next_release(true).is_some());
}

#[test]
fn a_read_frame_keeps_to_max_names_and_the_rest_go_next() {
    let mut q = ReadQueue::new(CoalescePolicy {
        quiet: QUIET,
        max: MAX,
        max_names: 2,
    });
    let t = Instant::now();
    let mut answer = read(&mut q, &["a", "b", "c"], None, t);
    let first = q.next_batch(t).expect("first READ");
    let second = q.next_batch(t).expect("second READ");
    assert_eq!(first.names, ["a", "b"]);
    assert_eq!(second.names, ["c"]);
    for batch in [first, second] {
        let values = values(&batch);
        q.answered(batch, values, t);
    }
    assert_eq!(got(&mut answer).len(), 3);
}

#[test]
fn a_name_too_long_for_any_frame_is_answered_with_an_error_and_not_sent() {
    let mut q = queue();
    let long = "x".repeat(READ_PAYLOAD_BUDGET);
    let mut answer = read(&mut q, &[long.as_str()], None, Instant::now());
    assert!(q.next_batch(Instant::now()).is_none());
    let results = got(&mut answer);
    assert!(matches!(&results[0], Err(e) if e.code == ErrorCode::BadValue));
}

#[test]
fn a_reader_who_gave_up_is_not_read_for() {
    let mut q = queue();
    let t = Instant::now();
    let answer = read(&mut q, &["a"], None, t);
    drop(answer);
    assert!(q.next_batch(t).is_none());
}

#[test]
fn a_refused_read_answers_every_reader_with_the_stations_error() {
    let mut q = queue();
    let t = Instant::now();
    let mut a = read(&mut q, &["a", "b"], None, t);
    let batch = q.next_batch(t).expect("READ");
    let error = StationError::new(ErrorCode::Busy, "busy");
    q.answered(batch, ReadAnswer::Refused(error.clone()), t);
    assert_eq!(got(&mut a), [Err(error.clone()), Err(error)]);
}

#[test]
fn a_lost_read_fails_its_readers_and_frees_the_channel() {
    let mut q = queue();
    let t = Instant::now();
    let mut a = read(&mut q, &["a"], None, t);
    let batch = q.next_batch(t).expect("READ");
    q.lost(batch, LinkError::Timeout(Duration::from_secs(2)));
    assert!(matches!(a.try_recv(), Ok(Err(LinkError::Timeout(_)))));
    let _reader = read(&mut q, &["a"], None, t);
    assert!(q.next_batch(t + MAX).is_some(), "a is off the wire");
}

#[test]
fn the_end_of_a_session_fails_every_reader() {
    let mut q = queue();
    let t = Instant::now();
    let mut a = read(&mut q, &["a"], None, t);
    let _batch = q.next_batch(t);
    let mut b = read(&mut q, &["a"], None, t);
    q.fail_all(&LinkError::ShuttingDown);
    assert!(matches!(a.try_recv(), Ok(Err(LinkError::ShuttingDown))));
    assert!(matches!(b.try_recv(), Ok(Err(LinkError::ShuttingDown))));
    assert!(q.next_release(true).is_none());
}

#[test]
fn names_beyond_the_payload_budget_go_in_the_next_read() {
    let mut q = queue();
    let t = Instant::now();
    let long = |c: char| c.to_string().repeat(READ_PAYLOAD_BUDGET / 2);
    let (a, b) = (long('a'), long('b'));
    let _reader = read(&mut q, &[a.as_str(), b.as_str()], None, t);
    assert_eq!(q.next_batch(t).expect("first READ").names, [a]);
    assert_eq!(q.next_batch(t).expect("second READ").names, [b]);
}

#[test]
fn answers_older_than_quiet_count_for_nothing_though_forgotten_only_once_per_quiet() {
    let mut q = queue();
    let t = Instant::now();
    let answer_at = |q: &mut ReadQueue, name: &str, caller, now| {
        let mut reader = read(q, &[name], caller, now);
        let batch = q.next_batch(now).expect("a READ");
        let answer = values(&batch);
        q.answered(batch, answer, now);
        got(&mut reader);
    };
    // b answered at t (answers forgotten then), a answered at t + QUIET/2 (not again).
    answer_at(&mut q, "b", client(1), t);
    let a_at = t + QUIET / 2;
    answer_at(&mut q, "a", client(1), a_at);
    // Past quiet after b's answer, still kept: another client's reader of b goes at once.
    let late = t + QUIET + QUIET / 4;
    let _b = read(&mut q, &["b"], client(2), late);
    let batch = q
        .next_batch(late)
        .expect("b's answer is older than quiet: not held");
    assert_eq!(batch.names, ["b"]);
    // a's answer is within quiet: another client's reader of a is held as a burst.
    let _a = read(&mut q, &["a"], client(3), late);
    assert!(
        q.next_batch(late).is_none(),
        "a was answered to another client just now"
    );
    assert_eq!(q.next_release(true), Some(late + QUIET));
}

#[test]
fn with_nothing_waiting_no_read_is_due_and_ended_holds_are_forgotten() {
    let mut q = queue();
    let t = Instant::now();
    let mut first = read(&mut q, &["a"], None, t);
    let on_wire = q.next_batch(t).expect("first READ");
    let mut gone = read(&mut q, &["a"], None, t);
    assert!(
        q.next_batch(t).is_none(),
        "a is on the wire, the next is held"
    );
    drop(gone.try_recv());
    drop(gone);
    let answer = values(&on_wire);
    q.answered(on_wire, answer, t);
    got(&mut first);
    // The held reader gave up: its hold ends and nothing is read for it.
    assert!(q.next_batch(t + MAX).is_none());
    assert!(q.next_batch(t + MAX).is_none(), "nothing waits");
    assert_eq!(q.next_release(true), None, "no hold is left");
}

/// Answers every READ due at `now`, returning how many there were.
fn answer_all(q: &mut ReadQueue, now: Instant) -> usize {
    let mut sent = 0;
    while let Some(batch) = q.next_batch(now) {
        let answer = values(&batch);
        q.answered(batch, answer, now);
        sent += 1;
    }
    sent
}

/// Clients `1..=count` read `a` together at `t` and are answered by one READ.
fn answered_together(q: &mut ReadQueue, count: u16, t: Instant) {
    let mut first: Vec<Answer> = (1..=count).map(|c| read(q, &["a"], client(c), t)).collect();
    assert_eq!(answer_all(q, t), 1);
    first.iter_mut().for_each(|a| drop(got(a)));
}

#[test]
fn clients_slower_than_quiet_taking_turns_are_not_held_once_all_are_back() {
    let mut q = queue();
    let t = Instant::now();
    answered_together(&mut q, 4, t);
    // They come back later than quiet after their answer: the first goes out at once and is
    // answered; the next two (new by quiet, a answered to another client just now) are held.
    let back = t + QUIET * 2;
    let mut c1 = read(&mut q, &["a"], client(1), back);
    assert_eq!(answer_all(&mut q, back), 1);
    got(&mut c1);
    let _c2 = read(&mut q, &["a"], client(2), back + QUIET / 10);
    let _c3 = read(&mut q, &["a"], client(3), back + QUIET / 5);
    assert!(
        q.next_batch(back + QUIET / 5).is_none(),
        "1 and 4 are still to come"
    );
    let _c1 = read(&mut q, &["a"], client(1), back + QUIET / 4);
    assert!(
        q.next_batch(back + QUIET / 4).is_none(),
        "4 is still to come"
    );
    // The hold ends as the last of them is back, long before quiet.
    let last = back + QUIET / 3;
    let _c4 = read(&mut q, &["a"], client(4), last);
    let next = q.next_batch(last).expect("everyone is back: not held");
    assert_eq!(next.names, ["a"]);
}

#[test]
fn a_new_client_among_the_returning_ones_keeps_the_hold() {
    let mut q = queue();
    let t = Instant::now();
    answered_together(&mut q, 2, t);
    let back = t + QUIET * 2;
    let _c1 = read(&mut q, &["a"], client(1), back);
    let _on_wire = q.next_batch(back).expect("at once");
    let _new = read(&mut q, &["a"], client(9), back);
    let _c2 = read(&mut q, &["a"], client(2), back);
    assert!(
        q.next_batch(back).is_none(),
        "a new client: a burst may be under way"
    );
    assert!(q.next_batch(back + QUIET).is_none(), "a is on the wire");
}

#[test]
fn a_known_client_not_yet_back_keeps_the_hold_until_quiet() {
    let mut q = queue();
    let t = Instant::now();
    answered_together(&mut q, 3, t);
    let back = t + QUIET * 2;
    let _c1 = read(&mut q, &["a"], client(1), back);
    let held = q.next_batch(back).expect("at once");
    let _c2 = read(&mut q, &["a"], client(2), back);
    let answer = values(&held);
    q.answered(held, answer, back);
    assert!(
        q.next_batch(back).is_none(),
        "client 3 has not come back: held"
    );
    assert_eq!(q.next_release(true), Some(back + QUIET));
    assert!(q.next_batch(back + QUIET).is_some());
}
