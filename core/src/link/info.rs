//! What the link publishes: the station's channel table, the [`StationInfo`] snapshot, the
//! [`LinkEvent`]s broadcast on changes and the [`LinkStats`] counters.
//!
//! [`StationInfo`] is replaced whole, never mutated, and kept twice: in a `watch` for whoever
//! waits for a change, and in an `ArcSwap` the read path looks at without writing shared memory.
//! Its channel table holds every channel's configuration from the handshake on; a
//! CONFIGURE answer replaces its channel at once, a configuration NOTIFY brings a LIST refresh
//! and the inquiries again before the new table and the `configuration` event. The table is
//! where names resolve for every front end ([`ChannelTable::get`]: station name or net name
//! first, then alias).

use arc_swap::ArcSwap;
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

use station_protocol::{
    ChangeType, ChannelConfig, ChannelDescriptor, ConfigureReply, Direction, HelloReply,
    ModuleInfo, Notify,
};

/// The [`StationInfo`] the link publishes, kept twice: in a `watch` for whoever waits for a
/// change, and in an [`ArcSwap`] for the requests that only look at it ([`InfoReader::now`]).
/// A look at a `watch` takes its lock and a clone of its `Arc` bumps its count: writes to
/// memory every worker thread shares, whose cache line then moves from core to core with
/// every request; a look at an `ArcSwap` writes nothing shared.
pub struct PublishedInfo {
    changes: watch::Sender<Arc<StationInfo>>,
    current: Arc<ArcSwap<StationInfo>>,
}

impl PublishedInfo {
    /// The link task's side, and the reader its handles clone.
    pub fn new(first: StationInfo) -> (PublishedInfo, InfoReader) {
        let first = Arc::new(first);
        let (changes, watched) = watch::channel(first.clone());
        let current = Arc::new(ArcSwap::new(first));
        let reader = InfoReader {
            watched,
            current: current.clone(),
        };
        (PublishedInfo { changes, current }, reader)
    }

    /// The snapshot published last.
    pub fn borrow(&self) -> watch::Ref<'_, Arc<StationInfo>> {
        self.changes.borrow()
    }

    /// Publishes `info`: readers see it first, then watchers are told.
    pub fn send_replace(&self, info: Arc<StationInfo>) {
        self.current.store(info.clone());
        self.changes.send_replace(info);
    }
}

/// The handles' side of [`PublishedInfo`].
#[derive(Clone)]
pub struct InfoReader {
    watched: watch::Receiver<Arc<StationInfo>>,
    current: Arc<ArcSwap<StationInfo>>,
}

impl InfoReader {
    /// The snapshot now, to look at without keeping it (held over an `.await` it would keep
    /// one of the thread's few fast slots: take [`InfoReader::full`] for that).
    pub fn now(&self) -> arc_swap::Guard<Arc<StationInfo>> {
        self.current.load()
    }

    /// The snapshot now, to keep.
    pub fn full(&self) -> Arc<StationInfo> {
        self.current.load_full()
    }

    /// A receiver that sees every new snapshot (as a clone of the first receiver: one that has
    /// seen none of them yet).
    pub fn watch(&self) -> watch::Receiver<Arc<StationInfo>> {
        self.watched.clone()
    }
}

/// The station's channel list, indexed by name, with the configuration (CONFIGURE, SPEC.md
/// §6.13) of the channels the station has told it this connection.
///
/// The one place names resolve for every front end ([`ChannelTable::get`]): a channel is
/// found by its station name or net name first, then by its alias (the clients' "NetName and
/// Alias are accepted interchangeably").
#[derive(Debug, Default)]
pub struct ChannelTable {
    pub channels: Vec<ChannelDescriptor>,
    /// Station names and net names (the clients' NetName), each to its channel's position.
    by_name: HashMap<String, usize>,
    /// Aliases, each to the first channel that has it; asked only after `by_name`.
    by_alias: HashMap<String, usize>,
    /// By station name.
    configs: HashMap<String, ChannelConfig>,
    /// Each channel's position among the channels of its device (the name up to its last
    /// dot), by position: the clients' `index`.
    device_index: Vec<usize>,
    /// The direction each channel had when the gateway first listed it since the station
    /// started, by station name: the clients' `defaultDirection` (the byte protocol does not
    /// carry the factory default; a channel configured before the gateway first saw it shows
    /// that direction as its default).
    first_directions: HashMap<String, Direction>,
}

/// Where a channel sits, as the clients' channel model gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelPlace {
    /// Its position in the station's list (`channelIndex`).
    pub position: usize,
    /// Its position among its device's channels (`index`).
    pub device_index: usize,
    /// Its direction when the gateway first listed it (`defaultDirection`).
    pub default_direction: Direction,
}

impl ChannelTable {
    pub fn new(channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let mut by_name = HashMap::with_capacity(channels.len());
        for (i, ch) in channels.iter().enumerate() {
            by_name.entry(ch.name.clone()).or_insert(i);
        }
        for (i, ch) in channels.iter().enumerate() {
            if !ch.net_name.is_empty() {
                by_name.entry(ch.net_name.clone()).or_insert(i);
            }
        }
        let mut by_alias = HashMap::new();
        for (i, ch) in channels.iter().enumerate() {
            if !ch.alias.is_empty() {
                by_alias.entry(ch.alias.clone()).or_insert(i);
            }
        }
        let mut per_device: HashMap<&str, usize> = HashMap::new();
        let device_index = channels
            .iter()
            .map(|ch| {
                let device = ch.name.rsplit_once('.').map_or("", |(device, _)| device);
                let next = per_device.entry(device).or_insert(0);
                *next += 1;
                *next - 1
            })
            .collect();
        let first_directions = channels
            .iter()
            .map(|ch| (ch.name.clone(), ch.direction))
            .collect();
        ChannelTable {
            channels,
            by_name,
            by_alias,
            configs: HashMap::new(),
            device_index,
            first_directions,
        }
    }

    /// Where the channel at `position` sits (`None` past the end).
    pub fn place(&self, position: usize) -> Option<ChannelPlace> {
        let channel = self.channels.get(position)?;
        Some(ChannelPlace {
            position,
            device_index: self.device_index[position],
            default_direction: self
                .first_directions
                .get(&channel.name)
                .copied()
                .unwrap_or(channel.direction),
        })
    }

    /// This table with the first directions `earlier` saw kept for the channels it knew (a
    /// new list or connection of a station that did not restart).
    pub(super) fn with_first_directions_of(mut self, earlier: &ChannelTable) -> ChannelTable {
        for (name, direction) in &earlier.first_directions {
            if let Some(first) = self.first_directions.get_mut(name) {
                *first = *direction;
            }
        }
        self
    }

    /// A channel's configuration (by any name [`get`](Self::get) resolves), once a CONFIGURE
    /// answer told it.
    pub fn config(&self, name: &str) -> Option<&ChannelConfig> {
        self.configs.get(self.station_name(name))
    }

    /// Whether the station has told this table every channel's configuration.
    pub fn all_configured(&self) -> bool {
        self.channels
            .iter()
            .all(|ch| self.configs.contains_key(&ch.name))
    }

    /// This table with the channel of a CONFIGURE answer replaced by what it says now.
    pub(super) fn configured(&self, reply: &ConfigureReply) -> ChannelTable {
        self.configured_all(std::slice::from_ref(reply))
    }

    /// This table with the channel of every CONFIGURE answer replaced by what it says now.
    pub(super) fn configured_all(&self, replies: &[ConfigureReply]) -> ChannelTable {
        let mut channels = self.channels.clone();
        for reply in replies {
            if let Some(&position) = self.by_station_name(&reply.channel.name) {
                channels[position] = reply.channel.clone();
            }
        }
        let mut table = ChannelTable::new(channels).with_first_directions_of(self);
        table.configs = self.configs.clone();
        for reply in replies {
            table
                .configs
                .insert(reply.channel.name.clone(), reply.config.clone());
        }
        table
    }

    /// A new list (LIST after a configuration NOTIFY) keeping the configurations known of
    /// channels still in it.
    pub(super) fn relisted(&self, channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let mut table = ChannelTable::new(channels).with_first_directions_of(self);
        table.configs = self
            .configs
            .iter()
            .filter(|(name, _)| table.by_station_name(name).is_some())
            .map(|(name, config)| (name.clone(), config.clone()))
            .collect();
        table
    }

    fn by_station_name(&self, name: &str) -> Option<&usize> {
        self.by_name
            .get(name)
            .filter(|&&i| self.channels[i].name == name)
    }

    /// The channel a client means by `name`: its station name or net name first, then its
    /// alias.
    pub fn get(&self, name: &str) -> Option<&ChannelDescriptor> {
        self.position(name).map(|i| &self.channels[i])
    }

    /// The position of the channel [`get`](Self::get) finds.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name
            .get(name)
            .or_else(|| self.by_alias.get(name))
            .copied()
    }

    /// The station's own name of the channel a client means by `name` (what goes on the wire
    /// and keys the value cache); `name` itself when no channel has it (the station answers
    /// with its own error).
    pub fn station_name<'a>(&'a self, name: &'a str) -> &'a str {
        match self.get(name) {
            Some(channel) => &channel.name,
            None => name,
        }
    }

    /// The other channel `alias` would make ambiguous as `channel`'s alias: one whose station
    /// name, net name or alias it is.
    pub fn alias_clash(&self, channel: &str, alias: &str) -> Option<&ChannelDescriptor> {
        if alias.is_empty() {
            return None;
        }
        self.channels.iter().find(|other| {
            other.name != channel
                && (other.name == alias || other.net_name == alias || other.alias == alias)
        })
    }
}

/// What the gateway knows of the station, replaced as a whole whenever it changes.
#[derive(Debug, Default)]
pub struct StationInfo {
    pub connected: bool,
    /// Goes up by one at every successful (re)connection.
    pub generation: u64,
    pub last_error: Option<String>,
    pub hello: Option<HelloReply>,
    pub modules: Vec<ModuleInfo>,
    /// Kept from the last connection while the link is down.
    pub channels: Arc<ChannelTable>,
}

/// Changes on the link, for the event stream and the legacy listener.
#[derive(Debug, Clone)]
pub enum LinkEvent {
    Connection {
        connected: bool,
        generation: u64,
        last_error: Option<String>,
    },
    Configuration {
        change: ChangeType,
        generation: u64,
    },
    /// Every NOTIFY from the station, as it came.
    Notify(Notify),
}

/// Counters of the link's work, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct LinkStats {
    pub frames_sent: AtomicU64,
    pub read_frames: AtomicU64,
    pub names_read: AtomicU64,
    pub timeouts: AtomicU64,
    pub reconnects: AtomicU64,
    pub crc_errors: AtomicU64,
    pub refused_by_guard: AtomicU64,
    /// Replies whose request id was not in flight (late after a timeout, or unknown): dropped.
    pub late_replies: AtomicU64,
    /// Time from sending a request frame to its answer.
    pub latency: crate::metrics::Histogram,
}

impl LinkStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use station_protocol::ValueType;

    use super::*;

    fn channel(name: &str, net_name: &str, alias: &str) -> ChannelDescriptor {
        ChannelDescriptor {
            name: name.into(),
            alias: alias.into(),
            net_name: net_name.into(),
            type_flags: 1,
            direction: Direction::In,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming: false,
            value_type: ValueType::Float,
            options: Vec::new(),
        }
    }

    /// `index` counts within the device (the name up to its last dot); the first direction a
    /// channel was listed with stays its default through a new list and a reconfiguration.
    #[test]
    fn a_channel_s_place_counts_within_its_device_and_keeps_its_first_direction() {
        let table = ChannelTable::new(vec![
            channel("0.1.A.X", "", ""),
            channel("0.4.B.Y", "", ""),
            channel("0.1.A.Z", "", ""),
            channel("0.4.B.W", "", ""),
        ]);
        let index = |table: &ChannelTable, i| table.place(i).unwrap().device_index;
        assert_eq!(
            (0..4).map(|i| index(&table, i)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        assert_eq!(table.place(2).unwrap().position, 2);
        assert!(table.place(4).is_none());
        let mut turned = channel("0.4.B.Y", "", "");
        turned.direction = Direction::Out;
        let reconfigured = table.configured_all(&[ConfigureReply {
            channel: turned.clone(),
            config: ChannelConfig {
                enabled: true,
                capability: Direction::InOut,
                type_capability: 1,
                device: "0.4.B".into(),
                limits: None,
                details: Vec::new(),
            },
        }]);
        let place = reconfigured.place(1).unwrap();
        assert_eq!(reconfigured.channels[1].direction, Direction::Out);
        assert_eq!(place.default_direction, Direction::In);
        let relisted = reconfigured.relisted(vec![channel("0.9.C.V", "", ""), turned]);
        assert_eq!(relisted.place(1).unwrap().default_direction, Direction::In);
        assert_eq!(relisted.place(1).unwrap().device_index, 0);
        // A table of a restarted station starts from what it lists.
        let mut out = channel("0.4.B.Y", "", "");
        out.direction = Direction::Out;
        let fresh = ChannelTable::new(vec![out]);
        assert_eq!(fresh.place(0).unwrap().default_direction, Direction::Out);
    }

    #[test]
    fn names_resolve_by_name_or_net_name_first_then_by_alias() {
        let table = ChannelTable::new(vec![
            channel("0.8.A", "NET_A", "B"),
            channel("0.8.B", "", "Bee"),
        ]);
        assert_eq!(table.station_name("0.8.A"), "0.8.A");
        assert_eq!(table.station_name("NET_A"), "0.8.A");
        assert_eq!(table.station_name("Bee"), "0.8.B");
        // "B" is only an alias: it names 0.8.A.
        assert_eq!(table.station_name("B"), "0.8.A");
        assert_eq!(table.station_name("nothing"), "nothing");
        assert!(table.get("nothing").is_none());
    }

    #[test]
    fn an_alias_that_is_another_channels_name_clashes() {
        let table = ChannelTable::new(vec![
            channel("0.8.A", "NET_A", "0.8.A"),
            channel("0.8.B", "0.8.B", "Bee"),
        ]);
        assert_eq!(table.alias_clash("0.8.A", "0.8.B").unwrap().name, "0.8.B");
        assert_eq!(table.alias_clash("0.8.A", "Bee").unwrap().name, "0.8.B");
        assert_eq!(table.alias_clash("0.8.B", "NET_A").unwrap().name, "0.8.A");
        // Its own name, or a new name, clashes with nothing.
        assert!(table.alias_clash("0.8.A", "0.8.A").is_none());
        assert!(table.alias_clash("0.8.A", "Fresh").is_none());
    }

    #[test]
    fn configurations_are_found_by_any_name_and_kept_by_station_name() {
        let table = ChannelTable::new(vec![channel("0.8.A", "NET_A", "Aye")]);
        let reply = ConfigureReply {
            channel: channel("0.8.A", "NET_A", "Renamed"),
            config: ChannelConfig {
                enabled: true,
                capability: Direction::In,
                type_capability: 1,
                device: "0.8".into(),
                limits: None,
                details: Vec::new(),
            },
        };
        let table = table.configured_all(&[reply]);
        assert!(table.all_configured());
        assert!(table.config("Renamed").is_some() && table.config("NET_A").is_some());
        assert!(table.get("Aye").is_none(), "the old alias is gone");
    }
}
