//! The history task: reads the channels `[history] channels` names every `interval_ms`
//! through the station service (cache first, so a channel someone else reads that often costs
//! no extra hardware read), and records the gaps the link's values cannot show: a read the
//! link could not make, and the station dropping (a "station not reached" sample for every
//! channel, at the moment the link went down).

use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::recorder::History;
use super::ring::SampleValue;
use crate::config::HistoryConfig;
use crate::link::{LinkError, StationInfo};
use crate::station::{ConsumingRule, Freshness, ItemError, ReadPolicy, Station, UnknownRule};

/// The patterns of `[history] channels` (validated with the config).
pub fn channel_patterns(patterns: &[String]) -> GlobSet {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        if let Ok(glob) = Glob::new(pattern) {
            builder.add(glob);
        }
    }
    builder.build().unwrap_or_else(|_| GlobSet::empty())
}

/// The station names in `info`'s channel table that `patterns` match, readable ones only and
/// never one whose read consumes data.
pub fn wanted_channels(info: &StationInfo, patterns: &GlobSet) -> Vec<String> {
    info.channels
        .channels
        .iter()
        .filter(|channel| channel.readable && !channel.consuming)
        .filter(|channel| patterns.is_match(&channel.name))
        .map(|channel| channel.name.clone())
        .collect()
}

/// The sample a failed item of the task's own read leaves (the station's own refusals were
/// recorded by the link already).
fn failure_sample(error: &ItemError) -> Option<SampleValue> {
    match error {
        ItemError::Link(LinkError::Disconnected(_)) => Some(SampleValue::NotReached),
        ItemError::Link(_) => Some(SampleValue::ReadError),
        ItemError::Station(_)
        | ItemError::Consuming
        | ItemError::UnknownChannel
        | ItemError::Cancelled => None,
    }
}

/// Runs until `shutdown`.
pub async fn run(
    history: Arc<History>,
    station: Station,
    mut info: watch::Receiver<Arc<StationInfo>>,
    config: HistoryConfig,
    shutdown: CancellationToken,
) {
    let interval = Duration::from_millis(config.interval_ms);
    let patterns = channel_patterns(&config.channels);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut connected = info.borrow().connected;
    let mut wanted = wanted_channels(&info.borrow(), &patterns);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = info.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = info.borrow_and_update().clone();
                if connected && !now.connected {
                    history.record_everywhere(history.clock().now_ms(), SampleValue::NotReached);
                }
                connected = now.connected;
                wanted = wanted_channels(&now, &patterns);
            }
            _ = tick.tick() => {
                if !connected || wanted.is_empty() {
                    continue;
                }
                read_once(&history, &station, &wanted, interval, &shutdown).await;
            }
        }
    }
}

async fn read_once(
    history: &History,
    station: &Station,
    names: &[String],
    interval: Duration,
    shutdown: &CancellationToken,
) {
    let policy = ReadPolicy {
        freshness: Freshness::Within(interval),
        consuming: ConsumingRule::Refuse,
        unknown: UnknownRule::Refuse,
        caller: None,
        cancel: Some(shutdown),
        guard: None,
        // The gateway's own reads for the history: never checked by the access rules.
        who: None,
    };
    let Ok(readings) = station.read(names, policy).await else {
        return;
    };
    let t_ms = history.clock().now_ms();
    for (name, reading) in names.iter().zip(readings) {
        // A value read from the hardware was recorded by the link as it came; one served
        // from the cache was recorded when it was read.
        if let Err(error) = reading
            && let Some(sample) = failure_sample(&error)
        {
            history.record(name, t_ms, sample);
        }
    }
}
