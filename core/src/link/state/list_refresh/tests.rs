//! The LIST refresh's decisions, without a connection: pages, inquiries, a NOTIFY meanwhile,
//! an unusable answer.

use station_protocol::{ChangeType, ChannelDescriptor, ConfigureReply, ErrorCode, Response};

use super::{ListRefresh, ListStep};
use crate::link::error::ProtocolError;
use crate::link::handshake::{INQUIRIES_AT_ONCE, InquiryAnswer};

fn channel(name: &str) -> ChannelDescriptor {
    ChannelDescriptor {
        name: name.into(),
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
    }
}

fn page(total: u32, names: &[&str]) -> Result<Response, ProtocolError> {
    Ok(Response::List {
        total,
        offset: 0,
        channels: names.iter().map(|name| channel(name)).collect(),
    })
}

fn configured(name: &str) -> InquiryAnswer {
    InquiryAnswer::Configured(Box::new(ConfigureReply {
        channel: channel(name),
        config: station_protocol::ChannelConfig {
            enabled: true,
            capability: station_protocol::Direction::In,
            type_capability: 1,
            device: String::new(),
            limits: None,
            details: Vec::new(),
        },
    }))
}

const CHANGED: ChangeType = ChangeType::Changed;

fn first_page() -> ListStep {
    ListStep::AskPage {
        change: CHANGED,
        channels: Vec::new(),
    }
}

#[test]
fn a_refresh_asks_every_page_then_every_configuration_then_publishes() {
    let mut refresh = ListRefresh::default();
    assert_eq!(refresh.on_notify(CHANGED), Some(first_page()));
    let next = refresh.on_page(CHANGED, Vec::new(), page(3, &["A", "B"]));
    assert_eq!(
        next,
        ListStep::AskPage {
            change: CHANGED,
            channels: vec![channel("A"), channel("B")],
        }
    );
    let ListStep::AskPage { channels, .. } = next else {
        unreachable!()
    };
    assert_eq!(
        refresh.on_page(CHANGED, channels, page(3, &["C"])),
        ListStep::Inquire
    );
    assert_eq!(refresh.next_inquiry(false), None, "no room, no inquiry");
    let asked: Vec<String> = std::iter::from_fn(|| refresh.next_inquiry(true)).collect();
    assert_eq!(asked, ["A", "B", "C"]);
    assert_eq!(refresh.idle(), None, "three inquiries in flight");
    assert_eq!(refresh.on_inquiry(Some(configured("A"))), None);
    assert_eq!(
        refresh.on_inquiry(Some(InquiryAnswer::NotConfigurable)),
        None
    );
    let Some(ListStep::Publish {
        change,
        channels,
        configs,
    }) = refresh.on_inquiry(None)
    else {
        panic!("the last inquiry ends the refresh");
    };
    assert_eq!(change, CHANGED);
    assert_eq!(channels.len(), 3);
    assert_eq!(configs.len(), 1);
    // Over: the next NOTIFY starts another.
    assert_eq!(refresh.on_notify(CHANGED), Some(first_page()));
}

#[test]
fn inquiries_go_a_few_at_a_time_and_an_unsupported_one_asks_no_more() {
    let names: Vec<String> = (0..INQUIRIES_AT_ONCE + 3)
        .map(|i| format!("C{i}"))
        .collect();
    let named: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut refresh = ListRefresh::default();
    refresh.on_notify(CHANGED);
    let total = u32::try_from(names.len()).unwrap();
    assert_eq!(
        refresh.on_page(CHANGED, Vec::new(), page(total, &named)),
        ListStep::Inquire
    );
    let asked = std::iter::from_fn(|| refresh.next_inquiry(true)).count();
    assert_eq!(asked, INQUIRIES_AT_ONCE);
    // The station has no CONFIGURE: the rest are not asked; it ends with the last in flight.
    assert_eq!(refresh.on_inquiry(Some(InquiryAnswer::Unsupported)), None);
    assert_eq!(refresh.next_inquiry(true), None);
    for _ in 1..INQUIRIES_AT_ONCE - 1 {
        assert_eq!(refresh.on_inquiry(None), None);
    }
    assert!(matches!(
        refresh.on_inquiry(None),
        Some(ListStep::Publish { configs, .. }) if configs.is_empty()
    ));
}

#[test]
fn a_notify_during_a_refresh_starts_it_over_instead_of_publishing_old_pages() {
    let mut refresh = ListRefresh::default();
    refresh.on_notify(CHANGED);
    // While a page is on the wire: the next page answered starts over.
    assert_eq!(refresh.on_notify(ChangeType::Added), None);
    assert_eq!(
        refresh.on_page(CHANGED, Vec::new(), page(1, &["A"])),
        first_page()
    );
    assert_eq!(
        refresh.on_page(CHANGED, Vec::new(), page(1, &["A"])),
        ListStep::Inquire
    );
    assert_eq!(refresh.next_inquiry(true).as_deref(), Some("A"));
    // While an inquiry is in flight: it starts over once that one is in, not published.
    assert_eq!(refresh.on_notify(CHANGED), None);
    assert_eq!(
        refresh.on_inquiry(Some(configured("A"))),
        Some(first_page())
    );
}

#[test]
fn a_notify_while_inquiries_wait_for_room_starts_over_at_once() {
    let mut refresh = ListRefresh::default();
    refresh.on_notify(CHANGED);
    refresh.on_page(CHANGED, Vec::new(), page(1, &["A"]));
    assert_eq!(refresh.on_notify(CHANGED), Some(first_page()));
    assert_eq!(refresh.next_inquiry(true), None);
}

#[test]
fn an_unusable_or_missing_answer_ends_the_refresh_so_the_next_notify_starts_another() {
    let mut refresh = ListRefresh::default();
    refresh.on_notify(CHANGED);
    let unusable = refresh.on_page(
        CHANGED,
        Vec::new(),
        Err(ProtocolError::BadPayload(
            station_protocol::PayloadError::Truncated("a channel"),
        )),
    );
    assert!(matches!(&unusable, ListStep::GiveUp(why) if why.contains("unusable")));
    assert_eq!(refresh.on_notify(CHANGED), Some(first_page()));
    let refused = refresh.on_page(
        CHANGED,
        Vec::new(),
        Ok(Response::Error(station_protocol::StationError {
            code: ErrorCode::Busy,
            message: String::new(),
        })),
    );
    assert!(matches!(&refused, ListStep::GiveUp(why) if why.contains("answered LIST with")));
    refresh.on_notify(CHANGED);
    assert_eq!(
        refresh.on_page_timeout(),
        ListStep::GiveUp(
            "the station did not answer LIST in time; keeping the old channel list".into()
        )
    );
    refresh.on_notify(CHANGED);
    refresh.page_not_sent();
    assert_eq!(refresh.on_notify(CHANGED), Some(first_page()));
}

/// A refresh runs from the NOTIFY that starts it until it publishes, and not after a first
/// page that could not be sent.
#[test]
fn a_refresh_runs_from_its_notify_until_it_publishes_or_its_first_page_is_not_sent() {
    let mut refresh = ListRefresh::default();
    assert!(!refresh.is_running(), "none before a NOTIFY");
    refresh.on_notify(CHANGED);
    assert!(refresh.is_running());
    refresh.page_not_sent();
    assert!(!refresh.is_running(), "its first page never left");
    refresh.on_notify(CHANGED);
    assert_eq!(
        refresh.on_page(CHANGED, Vec::new(), page(1, &["A"])),
        ListStep::Inquire
    );
    assert!(refresh.is_running(), "inquiries still to come");
    assert_eq!(refresh.next_inquiry(true).as_deref(), Some("A"));
    assert!(matches!(
        refresh.on_inquiry(None),
        Some(ListStep::Publish { .. })
    ));
    assert!(!refresh.is_running(), "published");
}
