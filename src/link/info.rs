//! What the link publishes: the station's channel table, the [`StationInfo`] snapshot, the
//! [`LinkEvent`]s broadcast on changes and the [`LinkStats`] counters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use station_protocol::{
    ChangeType, ChannelConfig, ChannelDescriptor, ConfigureReply, HelloReply, ModuleInfo, Notify,
};

/// The station's channel list, indexed by name, with the configuration (CONFIGURE, SPEC.md
/// §6.13) of the channels the station has told it this connection.
#[derive(Debug, Default)]
pub struct ChannelTable {
    pub channels: Vec<ChannelDescriptor>,
    by_name: HashMap<String, usize>,
    configs: HashMap<String, ChannelConfig>,
}

impl ChannelTable {
    pub fn new(channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let by_name = channels
            .iter()
            .enumerate()
            .map(|(i, ch)| (ch.name.clone(), i))
            .collect();
        ChannelTable {
            channels,
            by_name,
            configs: HashMap::new(),
        }
    }

    /// A channel's configuration, once a CONFIGURE answer told it.
    pub fn config(&self, name: &str) -> Option<&ChannelConfig> {
        self.configs.get(name)
    }

    /// This table with the channel of a CONFIGURE answer replaced by what it says now.
    pub(super) fn configured(&self, reply: &ConfigureReply) -> ChannelTable {
        let mut channels = self.channels.clone();
        if let Some(position) = self.position(&reply.channel.name) {
            channels[position] = reply.channel.clone();
        }
        let mut table = ChannelTable::new(channels);
        table.configs = self.configs.clone();
        table
            .configs
            .insert(reply.channel.name.clone(), reply.config.clone());
        table
    }

    /// A new list (LIST after a configuration NOTIFY) keeping the configurations known of
    /// channels still in it.
    pub(super) fn relisted(&self, channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let mut table = ChannelTable::new(channels);
        table.configs = self
            .configs
            .iter()
            .filter(|(name, _)| table.by_name.contains_key(*name))
            .map(|(name, config)| (name.clone(), config.clone()))
            .collect();
        table
    }

    pub fn get(&self, name: &str) -> Option<&ChannelDescriptor> {
        self.by_name.get(name).map(|&i| &self.channels[i])
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
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
