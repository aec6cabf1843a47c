//! The value history's parts for one station: the recorder the value cache feeds, and with
//! `[history] archive` the archive's reader and its writer's queue.

use std::sync::Arc;

use crate::history::archive::ArchiveReader;
use crate::history::archive::writer::WriterSettings;
use crate::history::recorder::{ArchivedSample, History, Limits, WallClock};
use crate::link::LinkHandle;

/// The samples the archive's queue holds while the writer is busy (a COPY, a stalled
/// database until it times out): minutes at 1 000 samples/s.
const ARCHIVE_QUEUE: usize = 200_000;

/// The archive: its reader, the writer's queue and settings.
pub(super) type ArchiveParts = (
    Arc<ArchiveReader>,
    tokio::sync::mpsc::Receiver<ArchivedSample>,
    WriterSettings,
);

/// The value history's recorder, fed by the value cache, and with `[history] archive` its
/// archive's parts.
pub(super) fn start_history(
    config: &crate::config::HistoryConfig,
    link: &LinkHandle,
) -> (Option<Arc<History>>, Option<ArchiveParts>) {
    if !config.enabled {
        return (None, None);
    }
    let (queue, archive) = match config.archive.as_str() {
        "" => (None, None),
        url => {
            let (queue, receiver) = tokio::sync::mpsc::channel(ARCHIVE_QUEUE);
            let reader = Arc::new(ArchiveReader::new(url.into(), config.archive_table.clone()));
            let settings = WriterSettings {
                url: url.into(),
                table: config.archive_table.clone(),
                spool: config.spool.clone(),
                retention_days: config.retention_days,
            };
            (Some(queue), Some((reader, receiver, settings)))
        }
    };
    let history = Arc::new(History::new(
        Limits {
            samples_per_channel: config.samples_per_channel,
            max_channels: config.max_channels,
            min_spacing_ms: config.interval_ms,
        },
        WallClock::now(),
        queue,
    ));
    link.cache().observe(history.clone());
    (Some(history), archive)
}
