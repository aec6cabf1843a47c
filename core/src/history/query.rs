//! A query's samples: the recent ones from memory, older ones from the archive — by minute
//! where the buckets are whole minutes — joined where memory starts so the answer does not
//! show the seam.

use super::archive::{ArchiveReader, ArchiveUnavailable};
use super::bucket::{Buckets, MinuteSummary};
use super::recorder::History;
use super::ring::Sample;

/// What a query found: samples (with the one before the range) and, from the archive, whole
/// minutes summed up (none inside memory's part, no sample inside them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    pub samples: Vec<Sample>,
    pub minutes: Vec<MinuteSummary>,
}

/// `channel`'s data for `buckets`' range: memory's, and the archive's for what memory no
/// longer holds (its per-minute summaries when `buckets.by_minute`); `None` when neither has
/// any.
pub async fn found(
    history: &History,
    archive: Option<&ArchiveReader>,
    channel: &str,
    buckets: &Buckets,
) -> Result<Option<Found>, ArchiveUnavailable> {
    if !buckets.by_minute {
        let samples = samples(history, archive, channel, buckets.from_ms, buckets.to_ms).await?;
        return Ok(samples.map(|samples| Found {
            samples,
            minutes: Vec::new(),
        }));
    }
    let (from_ms, to_ms) = (buckets.from_ms, buckets.to_ms);
    let memory = history.range(channel, from_ms, to_ms);
    let Some(archive) = archive else {
        return Ok(memory.map(|(samples, _)| Found {
            samples,
            minutes: Vec::new(),
        }));
    };
    let (memory, memory_from_ms) = match memory {
        Some((samples, oldest)) if oldest <= from_ms => {
            return Ok(Some(Found {
                samples,
                minutes: Vec::new(),
            }));
        }
        Some((samples, oldest)) => (Some(samples), oldest.min(to_ms)),
        None => (None, to_ms),
    };
    let (archived, minutes) = archive.by_minute(channel, from_ms, memory_from_ms).await?;
    let any = memory.is_some() || !archived.is_empty() || !minutes.is_empty();
    let samples = joined(archived, memory.unwrap_or_default(), memory_from_ms);
    Ok(any.then_some(Found { samples, minutes }))
}

/// The archive's samples before `memory_from_ms`, then memory's from it: one series in time
/// order.
pub fn joined(archived: Vec<Sample>, memory: Vec<Sample>, memory_from_ms: u64) -> Vec<Sample> {
    archived
        .into_iter()
        .filter(|sample| sample.t_ms < memory_from_ms)
        .chain(
            memory
                .into_iter()
                .filter(|sample| sample.t_ms >= memory_from_ms),
        )
        .collect()
}

/// `channel`'s samples in `[from_ms, to_ms)` with the one before; `None` when neither memory
/// nor the archive has any.
pub async fn samples(
    history: &History,
    archive: Option<&ArchiveReader>,
    channel: &str,
    from_ms: u64,
    to_ms: u64,
) -> Result<Option<Vec<Sample>>, ArchiveUnavailable> {
    let memory = history.range(channel, from_ms, to_ms);
    let Some(archive) = archive else {
        return Ok(memory.map(|(samples, _)| samples));
    };
    match memory {
        // Memory holds the whole range (and the sample before it).
        Some((samples, oldest)) if oldest <= from_ms => Ok(Some(samples)),
        Some((samples, oldest)) => {
            let archived = archive.range(channel, from_ms, oldest.min(to_ms)).await?;
            Ok(Some(joined(archived, samples, oldest)))
        }
        None => {
            let archived = archive.range(channel, from_ms, to_ms).await?;
            Ok((!archived.is_empty()).then_some(archived))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ring::SampleValue;

    fn n(t_ms: u64, v: f64) -> Sample {
        Sample {
            t_ms,
            value: SampleValue::Number(v),
        }
    }

    #[test]
    fn the_archive_gives_what_is_older_than_memory_and_memory_the_rest() {
        let archived = vec![n(1, 1.0), n(2, 2.0), n(3, 3.0)];
        let memory = vec![n(3, 3.0), n(4, 4.0)];
        assert_eq!(
            joined(archived, memory, 3),
            [n(1, 1.0), n(2, 2.0), n(3, 3.0), n(4, 4.0)]
        );
    }
}
