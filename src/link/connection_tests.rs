//! Unit tests of one connection's work (`connection.rs`).

use futures::StreamExt;
use station_protocol::{Opcode, StationCodec};
use tokio_util::codec::Framed;

use super::*;
use crate::link::transport::StationStream;

fn shared() -> Shared {
    Shared {
        info: watch::channel(Arc::new(StationInfo::default())).0,
        events: broadcast::channel(16).0,
        cache: Arc::new(ValueCache::new()),
        stats: Arc::new(LinkStats::default()),
    }
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
        timeout,
        policy,
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
