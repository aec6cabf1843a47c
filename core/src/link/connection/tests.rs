//! Tests of one connection's work through a duplex pipe, time paused: LIST refreshes, configuration changes, and changes in doubt at the end of a lease.

use futures::{FutureExt, StreamExt};
use station_protocol::{Notify, Opcode, Response, StationCodec};
use tokio_util::codec::Framed;

use super::*;
use crate::link::transport::StationStream;

fn shared() -> Shared {
    Shared {
        info: PublishedInfo::new(StationInfo::default()).0,
        events: broadcast::channel(16).0,
        cache: Arc::new(ValueCache::new()),
        stats: Arc::new(LinkStats::default()),
        restarted: Default::default(),
        owner: None,
        doubts: tokio::sync::watch::channel(Default::default()).0,
    }
}

/// Self-fencing: with the link-owner gate closed, nothing queued reaches the wire, and the
/// session ends saying why; with it open, the same frame goes out.
#[tokio::test(start_paused = true)]
async fn nothing_is_written_once_this_gateway_cannot_prove_it_owns_the_link() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let stream: Box<dyn StationStream> = Box::new(ours);
    let mut station = Framed::new(theirs, StationCodec::new());
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    };
    let mut c = Connection::new(
        Framed::new(stream, StationCodec::new()),
        1,
        4,
        (Duration::from_secs(2), Duration::from_secs(8)),
        policy,
        Default::default(),
    );
    let now = Instant::now();
    let gate = Arc::new(OwnerGate::new(now));
    gate.renewed(now, Duration::from_secs(10), Duration::from_secs(2));
    let mut shared = shared();
    shared.owner = Some(gate.clone());
    c.on_frame(&shared, configuration_changed())
        .expect("a NOTIFY is taken");
    c.dispatch(&shared)
        .await
        .expect("owned: the LIST is flushed");
    let list = tokio::time::timeout(Duration::from_secs(1), station.next())
        .await
        .expect("the LIST went out while owned");
    assert!(list.is_some());
    // Past its proof of ownership: the next frame is never written.
    tokio::time::advance(Duration::from_secs(8)).await;
    c.on_frame(&shared, configuration_changed())
        .expect("a NOTIFY is taken");
    let refused = c.dispatch(&shared).await;
    assert!(matches!(refused, Err(LinkDown::NotOwner)), "{refused:?}");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), station.next())
            .await
            .is_err(),
        "a frame reached the station after the gate closed"
    );
}

fn configuration_changed() -> RawFrame {
    let notify = Notify::ConfigurationChanged {
        change: ChangeType::Changed,
        message: "a module was swapped".into(),
    };
    Response::Notify(notify)
        .to_frame(0)
        .expect("a small NOTIFY fits in a frame")
}

/// (A LIST refresh whose reply could not be read once stayed "running" for the rest of
/// the connection, and no configuration change was picked up again.)
#[tokio::test(start_paused = true)]
async fn an_unreadable_list_reply_ends_the_refresh_so_the_next_change_starts_another() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let stream: Box<dyn StationStream> = Box::new(ours);
    let mut station = Framed::new(theirs, StationCodec::new());
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    };
    let timeout = Duration::from_secs(2);
    let mut c = Connection::new(
        Framed::new(stream, StationCodec::new()),
        1,
        4,
        (timeout, 4 * timeout),
        policy,
        Default::default(),
    );
    let shared = shared();
    for attempt in ["first", "second"] {
        c.on_frame(&shared, configuration_changed())
            .expect("a NOTIFY is taken");
        c.dispatch(&shared).await.expect("the LIST is flushed");
        let list = tokio::time::timeout(timeout, station.next())
            .await
            .unwrap_or_else(|_| panic!("no {attempt} LIST after a configuration change"))
            .expect("the link is open")
            .expect("a whole frame");
        assert_eq!(list.kind(), Some(Opcode::List));
        let unreadable = RawFrame::new(Opcode::ListReply, list.request_id, vec![0xFF]);
        c.on_frame(&shared, unreadable)
            .expect("an unreadable reply does not end the session");
    }
}

fn descriptors(names: &[&str]) -> Vec<ChannelDescriptor> {
    names
        .iter()
        .map(|name| ChannelDescriptor {
            name: (*name).into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: station_protocol::Direction::In,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming: false,
            value_type: station_protocol::ValueType::Float,
            options: vec![],
        })
        .collect()
}

fn list_reply(request_id: u32, names: &[&str]) -> RawFrame {
    let channels = descriptors(names);
    Response::List {
        total: channels.len() as u32,
        offset: 0,
        channels,
    }
    .to_frame(request_id)
    .expect("a small LIST fits")
}

/// (A configuration NOTIFY that came while a LIST refresh was running was dropped: the
/// refresh then published pages older than that change, and the change was never listed.)
#[tokio::test(start_paused = true)]
async fn a_change_notified_during_a_refresh_starts_it_over_instead_of_publishing_old_pages() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let stream: Box<dyn StationStream> = Box::new(ours);
    let mut station = Framed::new(theirs, StationCodec::new());
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    };
    let timeout = Duration::from_secs(2);
    let mut c = Connection::new(
        Framed::new(stream, StationCodec::new()),
        1,
        4,
        (timeout, 4 * timeout),
        policy,
        Default::default(),
    );
    let shared = shared();
    let mut events = shared.events.subscribe();
    c.on_frame(&shared, configuration_changed()).unwrap();
    c.dispatch(&shared).await.expect("flushed");
    let first = tokio::time::timeout(timeout, station.next())
        .await
        .expect("a LIST after the first change")
        .unwrap()
        .unwrap();
    assert_eq!(first.kind(), Some(Opcode::List));
    c.on_frame(&shared, configuration_changed()).unwrap();
    // The first LIST's answer may predate the second change: not published, asked again.
    c.on_frame(&shared, list_reply(first.request_id, &["old"]))
        .unwrap();
    assert!(shared.info.borrow().channels.channels.is_empty());
    c.dispatch(&shared).await.expect("flushed");
    let second = tokio::time::timeout(timeout, station.next())
        .await
        .expect("the refresh started over")
        .unwrap()
        .unwrap();
    assert_eq!(second.kind(), Some(Opcode::List));
    c.on_frame(&shared, list_reply(second.request_id, &["new"]))
        .unwrap();
    // Every listed channel's configuration is asked before the new table is published.
    assert!(shared.info.borrow().channels.channels.is_empty());
    c.dispatch(&shared).await.expect("flushed");
    let inquiry = tokio::time::timeout(timeout, station.next())
        .await
        .expect("a configuration inquiry of the listed channel")
        .unwrap()
        .unwrap();
    assert_eq!(inquiry.kind(), Some(Opcode::Configure));
    let configured = Response::Configure(Box::new(ConfigureReply {
        channel: descriptors(&["new"]).remove(0),
        config: station_protocol::ChannelConfig {
            enabled: true,
            capability: station_protocol::Direction::In,
            type_capability: 1,
            device: "dev".into(),
            limits: None,
            details: vec![("Gain".into(), station_protocol::Value::Float(2.0))],
        },
    }))
    .to_frame(inquiry.request_id)
    .unwrap();
    c.on_frame(&shared, configured).unwrap();
    assert_eq!(
        shared
            .info
            .borrow()
            .channels
            .config("new")
            .map(|c| c.device.clone()),
        Some("dev".to_owned())
    );
    let names: Vec<String> = shared
        .info
        .borrow()
        .channels
        .channels
        .iter()
        .map(|ch| ch.name.clone())
        .collect();
    assert_eq!(names, ["new"]);
    let notified = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|event| matches!(event, LinkEvent::Configuration { .. }))
        .count();
    assert_eq!(
        notified, 1,
        "one configuration event, for the list as it is now"
    );
}

fn connection(stream: Box<dyn StationStream>, timeout: Duration) -> Connection {
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    };
    Connection::new(
        Framed::new(stream, StationCodec::new()),
        1,
        4,
        (timeout, 4 * timeout),
        policy,
        Default::default(),
    )
}

type Station = Framed<tokio::io::DuplexStream, StationCodec>;

/// Sends a write of lease `fence` that the station never answers, and times it out; the
/// station answers the PING that follows.
async fn a_write_in_doubt(
    c: &mut Connection,
    station: &mut Station,
    shared: &Shared,
    fence: u64,
    timeout: Duration,
) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    c.enqueue(Command::Change {
        request: Request::Write {
            items: vec![("ON1".into(), station_protocol::Value::Bool(true))],
        },
        guard: Some(SendGuard::passing(Some(fence))),
        reply,
    });
    c.dispatch(shared).await.expect("sent");
    tokio::time::advance(timeout).await;
    c.on_timeouts(shared).expect("a timeout alone ends nothing");
    let answered = answer.await.expect("answered");
    assert!(
        matches!(answered, Err(LinkError::WriteTimeout { .. })),
        "{answered:?}"
    );
    c.dispatch(shared).await.expect("the PING is flushed");
    loop {
        let frame = station.next().await.expect("open").expect("a frame");
        if let Ok(Request::Ping { nonce }) = Request::from_frame(&frame) {
            let pong = Response::Ping { nonce }.to_frame(frame.request_id).unwrap();
            c.on_frame(shared, pong).expect("the PING answered");
            return;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_settle_still_waiting_when_a_change_in_doubt_outlives_the_longest_processing_resets_the_link()
 {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let mut station = Framed::new(theirs, StationCodec::new());
    let timeout = Duration::from_secs(1);
    let mut c = connection(Box::new(ours), timeout);
    let shared = shared();
    a_write_in_doubt(&mut c, &mut station, &shared, 7, timeout).await;
    let (settle, mut settled) = tokio::sync::oneshot::channel();
    c.enqueue(Command::Settle {
        scope: SettleScope::Fence(7),
        reply: settle,
    });
    c.dispatch(&shared).await.unwrap();
    assert!(settled.try_recv().is_err(), "settled while in doubt");
    assert_eq!(c.next_deadline(), Some(Instant::now() + 3 * timeout));
    tokio::time::advance(3 * timeout).await;
    let reset = c.on_timeouts(&shared).expect_err("the link is reset");
    assert!(
        matches!(reset, LinkDown::ChangeInDoubt { fence: 7, .. }),
        "{reset}"
    );
    let lapsed_at = Instant::now();
    let (mut doubts, settling) = c.fail_everything(&reset);
    assert_eq!(
        settling.len(),
        1,
        "the settle goes back to the link task with the station's doubts"
    );
    assert!(!doubts.holds(SettleScope::Fence(7)), "no longer in doubt");
    assert_eq!(
        doubts.take_lapsed(SettleScope::Fence(7)),
        Some(lapsed_at),
        "the change in doubt was cut off, not answered"
    );
    drop(settled);
}

#[tokio::test(start_paused = true)]
async fn a_change_in_doubt_nobody_waits_for_leaves_doubt_at_the_longest_processing() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let mut station = Framed::new(theirs, StationCodec::new());
    let timeout = Duration::from_secs(1);
    let mut c = connection(Box::new(ours), timeout);
    let shared = shared();
    a_write_in_doubt(&mut c, &mut station, &shared, 7, timeout).await;
    tokio::time::advance(3 * timeout).await;
    c.on_timeouts(&shared)
        .expect("nobody waits for it: no reset");
    let (settle, settled) = tokio::sync::oneshot::channel();
    c.enqueue(Command::Settle {
        scope: SettleScope::Fence(7),
        reply: settle,
    });
    let settled = settled.await.expect("settled at once");
    assert!(settled.had_doubts(), "it left doubt unanswered");
    // Told once: the next settle of the fence has nothing left in doubt.
    let (settle, settled) = tokio::sync::oneshot::channel();
    c.enqueue(Command::Settle {
        scope: SettleScope::Fence(7),
        reply: settle,
    });
    assert!(!settled.await.unwrap().had_doubts());
}

/// A LIST refresh asks every listed channel's configuration (at most
/// `INQUIRIES_AT_ONCE` at a time) before it publishes; a NOTIFY meanwhile makes it start over
/// once the inquiries in flight are answered, and a station without CONFIGURE is asked no more.
#[tokio::test(start_paused = true)]
async fn a_refresh_asks_every_channels_configuration_and_starts_over_on_a_notify_meanwhile() {
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let stream: Box<dyn StationStream> = Box::new(ours);
    let mut station = Framed::new(theirs, StationCodec::new());
    let policy = CoalescePolicy {
        quiet: Duration::ZERO,
        max: Duration::ZERO,
        max_names: 10,
    };
    let timeout = Duration::from_secs(2);
    let mut c = Connection::new(
        Framed::new(stream, StationCodec::new()),
        1,
        16,
        (timeout, 4 * timeout),
        policy,
        Default::default(),
    );
    let shared = shared();
    let names: Vec<String> = (0..10).map(|i| format!("CH{i}")).collect();
    let listed: Vec<&str> = names.iter().map(String::as_str).collect();
    let next = async |station: &mut Framed<_, StationCodec>| {
        tokio::time::timeout(timeout, station.next())
            .await
            .expect("a frame from the gateway")
            .unwrap()
            .unwrap()
    };
    c.on_frame(&shared, configuration_changed()).unwrap();
    c.dispatch(&shared).await.unwrap();
    let list = next(&mut station).await;
    c.on_frame(&shared, list_reply(list.request_id, &listed))
        .unwrap();
    c.dispatch(&shared).await.unwrap();
    let mut inquiries = Vec::new();
    for _ in 0..crate::link::handshake::INQUIRIES_AT_ONCE {
        let frame = next(&mut station).await;
        assert_eq!(frame.kind(), Some(Opcode::Configure));
        inquiries.push(frame.request_id);
    }
    // No more than that at once, and nothing published yet.
    assert!(station.next().now_or_never().is_none());
    assert!(shared.info.borrow().channels.channels.is_empty());
    // A change meanwhile: the ones in flight are answered, none more is asked, LIST again.
    c.on_frame(&shared, configuration_changed()).unwrap();
    let not_configurable = |id: u32| {
        Response::Error(station_protocol::StationError::new(
            station_protocol::ErrorCode::UnknownChannel,
            "no configuration",
        ))
        .to_frame(id)
        .unwrap()
    };
    for id in inquiries {
        c.on_frame(&shared, not_configurable(id)).unwrap();
    }
    c.dispatch(&shared).await.unwrap();
    let again = next(&mut station).await;
    assert_eq!(again.kind(), Some(Opcode::List), "the refresh starts over");
    c.on_frame(&shared, list_reply(again.request_id, &listed))
        .unwrap();
    c.dispatch(&shared).await.unwrap();
    // A station without CONFIGURE: one `unsupported` and no more inquiries; then published.
    let first = next(&mut station).await;
    let unsupported = Response::Error(station_protocol::StationError::new(
        station_protocol::ErrorCode::Unsupported,
        "no CONFIGURE",
    ))
    .to_frame(first.request_id)
    .unwrap();
    c.on_frame(&shared, unsupported).unwrap();
    let mut rest = Vec::new();
    while let Some(Some(Ok(frame))) = station.next().now_or_never() {
        rest.push(frame.request_id);
    }
    for id in rest {
        c.on_frame(&shared, not_configurable(id)).unwrap();
    }
    c.dispatch(&shared).await.unwrap();
    assert!(
        station.next().now_or_never().is_none(),
        "asked again after unsupported"
    );
    assert_eq!(shared.info.borrow().channels.channels.len(), 10);
}
