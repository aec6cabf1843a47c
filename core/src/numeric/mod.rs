//! NumericResult acquisitions (`api/numeric-results/*`): finding a station's NumericResult
//! channels and their targets, checking an acquisition before it is sent (sample count, the
//! request timeout, the target), running one acquisition per channel at a time through the
//! station service, and keeping the last measurement of each channel. The statistics are the
//! pure [`stats`] module's.

pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use station_protocol::ChannelDescriptor;
use station_protocol::frame::{HEADER_LEN, TRAILER_LEN};
use station_protocol::sample::{DATA_HEADER_LEN, MAX_FRAME_SAMPLES, MAX_SAMPLES, SampleRequest};

use crate::error_kind::ErrorKind;
use crate::lease::Admitted;
use crate::link::{ChannelTable, LinkError, StationUrl};
use crate::station::{Change, ChangeOrigin, ChangeWhat, Station, StillRunning};
pub use stats::{Limits, Stats};

/// Why an acquisition could not be planned or run; its kind is [`NumericError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum NumericError {
    /// The request asks for what cannot be: a sample count, a target.
    #[error("{0}")]
    Invalid(String),
    /// No NumericResult channel of that name.
    #[error("{0}")]
    NoSuchSampler(String),
    /// The station answered something no acquisition can use.
    #[error("{0}")]
    StationAnswer(String),
    /// The station service answered another kind of change (a gateway bug).
    #[error("{0}")]
    Bug(String),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    StillRunning(#[from] StillRunning),
}

impl NumericError {
    /// Its kind: the request's fault a bad request, an unknown sampler not found, a sample rate
    /// no acquisition can use the station's failure, a bug internal; the link's and a change
    /// still running as everywhere else.
    pub fn kind(&self) -> ErrorKind {
        match self {
            NumericError::Invalid(_) => ErrorKind::BadRequest,
            NumericError::NoSuchSampler(_) => ErrorKind::NotFound,
            NumericError::StationAnswer(_) => ErrorKind::StationFailed,
            NumericError::Bug(_) => ErrorKind::Internal,
            NumericError::Link(error) => error.kind(),
            NumericError::StillRunning(error) => error.kind(),
        }
    }
}

/// The REST contract's NumericResult channel type flag.
pub const NUMERIC_RESULT_FLAG: u32 = 1 << 19;

/// Samples per data frame on a serial line: 1 047-byte frames (98 % samples), about 91 ms each
/// at 115 200 baud, so a request between them waits no longer than that.
pub const SERIAL_FRAME_SAMPLES: u16 = 128;

/// How the station is reached, for how long samples take on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Line {
    /// A network: the wire time of samples is negligible next to their sampling.
    Network,
    /// A serial line of this many bits per second (10 bits a byte).
    Serial { baud: u32 },
}

impl Line {
    pub fn of(url: &StationUrl) -> Line {
        match url {
            StationUrl::Tcp { .. } => Line::Network,
            StationUrl::Serial(settings) => Line::Serial {
                baud: settings.baud,
            },
        }
    }

    /// Samples per data frame the gateway asks for on this line at `rate` (0: as many as fit):
    /// at most what half of `request_timeout` holds, so that every frame, the first one too,
    /// comes well within the request timeout of the one before it, however long the whole
    /// acquisition (the link times a SAMPLE frame by frame, SPEC.md §6.12); on a serial line
    /// also at most [`SERIAL_FRAME_SAMPLES`].
    pub fn frame_samples(self, rate: f64, request_timeout: Duration) -> u16 {
        let per_sample = (1.0 / rate).max(self.seconds_per_sample());
        let fit = (request_timeout.as_secs_f64() / 2.0 / per_sample).floor();
        let most = match self {
            Line::Network => MAX_FRAME_SAMPLES as f64,
            Line::Serial { .. } => f64::from(SERIAL_FRAME_SAMPLES),
        };
        match self {
            Line::Network if fit >= most => 0,
            _ => fit.clamp(1.0, most) as u16,
        }
    }

    /// Seconds one sample takes on the wire, with its share of its frame's envelope.
    fn seconds_per_sample(self) -> f64 {
        match self {
            Line::Network => 0.0,
            Line::Serial { baud } => {
                let per_frame = f64::from(SERIAL_FRAME_SAMPLES);
                let overhead = (HEADER_LEN + DATA_HEADER_LEN + TRAILER_LEN) as f64 / per_frame;
                (8.0 + overhead) * 10.0 / f64::from(baud)
            }
        }
    }
}

/// How long `count` samples at `rate` take: sampling, or the line when it is slower.
pub fn expected_duration(count: u32, rate: f64, line: Line) -> Duration {
    let sampling = f64::from(count) / rate;
    let wire = f64::from(count) * line.seconds_per_sample();
    Duration::from_secs_f64(sampling.max(wire))
}

/// Checks a requested sample count: 1 to 100 000, and done within `max_operation`
/// (`station.max_operation_ms`); otherwise the refusal names the limit (and the largest count
/// that fits).
pub fn check_count(
    samples: i64,
    rate: f64,
    line: Line,
    max_operation: Duration,
) -> Result<u32, NumericError> {
    let count = u32::try_from(samples)
        .ok()
        .filter(|n| (1..=MAX_SAMPLES).contains(n))
        .ok_or_else(|| {
            NumericError::Invalid(format!("Samples must be 1 to {MAX_SAMPLES}; got {samples}"))
        })?;
    let took = expected_duration(count, rate, line);
    if took > max_operation {
        let per_sample = (1.0 / rate).max(line.seconds_per_sample());
        let fits =
            ((max_operation.as_secs_f64() / per_sample).floor() as u64).min(u64::from(MAX_SAMPLES));
        return Err(NumericError::Invalid(format!(
            "{count} samples at {rate} Hz take about {:.0} ms, longer than an operation of the \
             station may take (station.max_operation_ms = {} ms); at most {fits} samples fit",
            took.as_secs_f64() * 1000.0,
            max_operation.as_millis()
        )));
    }
    Ok(count)
}

/// The station's NumericResult channels, in list order.
pub fn samplers(table: &ChannelTable) -> Vec<&ChannelDescriptor> {
    table
        .channels
        .iter()
        .filter(|ch| ch.type_flags & NUMERIC_RESULT_FLAG != 0)
        .collect()
}

/// The NumericResult channel a client names: by any name the channel table resolves (its
/// name or net name, then its alias); 404 otherwise.
pub fn find_sampler<'t>(
    table: &'t ChannelTable,
    wanted: &str,
) -> Result<&'t ChannelDescriptor, NumericError> {
    table
        .get(wanted)
        .filter(|ch| ch.type_flags & NUMERIC_RESULT_FLAG != 0)
        .ok_or_else(|| {
            let all = samplers(table);
            let known: Vec<&str> = all.iter().map(|ch| ch.name.as_str()).collect();
            NumericError::NoSuchSampler(format!(
                "not found: no NumericResult channel {wanted:?}; the station has {}",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        })
}

/// The target a client names, by any name the channel table resolves, as the station names
/// it: one of the sampler's targets; 400 naming the sampler's targets otherwise.
pub fn find_target(
    table: &ChannelTable,
    sampler: &ChannelDescriptor,
    wanted: &str,
) -> Result<String, NumericError> {
    let candidates = [wanted, table.station_name(wanted)];
    candidates
        .into_iter()
        .find(|name| sampler.options.iter().any(|t| t == name))
        .map(str::to_owned)
        .ok_or_else(|| {
            NumericError::Invalid(format!(
                "{} cannot sample {wanted:?}; its targets are {}",
                sampler.name,
                sampler.options.join(", ")
            ))
        })
}

/// An acquisition checked and ready to be asked for.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The NumericResult channel's name.
    pub sampler: String,
    /// The target's name, one of the sampler's.
    pub target: String,
    pub count: u32,
    /// The sampler's rate, samples per second.
    pub rate: f64,
    pub line: Line,
    /// Samples per data frame to ask for ([`Line::frame_samples`]).
    pub frame_samples: u16,
}

/// One acquisition as the station delivered it.
#[derive(Debug, Clone)]
pub struct Acquisition {
    pub channel: String,
    pub target: String,
    pub unit: String,
    /// The rate the station really used, samples per second.
    pub rate: f64,
    /// When the first sample was taken (station clock).
    pub started: SystemTime,
    /// From asking to the last frame.
    pub duration: Duration,
    pub samples: Vec<f64>,
}

/// A measurement kept for `result/*`: its statistics, and its samples unless reduced.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub channel: String,
    pub target: String,
    pub unit: String,
    pub rate: f64,
    pub started: SystemTime,
    pub duration: Duration,
    pub stats: Stats,
    /// `None` after a reduced measurement: the samples were not kept.
    pub samples: Option<Vec<f64>>,
}

/// A channel's rate and default sample count, as learned on one connection.
#[derive(Debug, Clone, Copy)]
pub struct SamplerInfo {
    pub rate: f64,
    pub default_samples: Option<i64>,
    generation: u64,
}

/// Acquisitions in progress (one per channel at a time) and the last results.
#[derive(Debug, Default)]
pub struct NumericResults {
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    kept: Mutex<BTreeMap<String, Arc<Measurement>>>,
    /// The last result of every channel, measured or acquired, for the status page.
    latest: Mutex<BTreeMap<String, Arc<Measurement>>>,
    infos: Mutex<HashMap<String, SamplerInfo>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl NumericResults {
    /// A sampler's rate and default sample count: asked of the station once per connection.
    pub async fn info(
        &self,
        station: &Station,
        sampler: &ChannelDescriptor,
    ) -> Result<SamplerInfo, NumericError> {
        let generation = station.info().generation;
        if let Some(info) = lock(&self.infos).get(&sampler.name)
            && info.generation == generation
        {
            return Ok(*info);
        }
        let target = sampler.options.first().cloned().unwrap_or_default();
        let (end, default_samples) = station.sampler_info(&sampler.name, &target).await?;
        let info = SamplerInfo {
            rate: end.rate,
            default_samples,
            generation,
        };
        if !(info.rate.is_finite() && info.rate > 0.0) {
            return Err(NumericError::StationAnswer(format!(
                "the station gives {} a sample rate of {}",
                sampler.name, info.rate
            )));
        }
        lock(&self.infos).insert(sampler.name.clone(), info);
        Ok(info)
    }

    /// Runs one acquisition as `plan` says, after any other on the same channel.
    pub async fn acquire(
        &self,
        station: &Station,
        admitted: &Admitted,
        origin: ChangeOrigin,
        plan: Plan,
    ) -> Result<Acquisition, NumericError> {
        let Plan {
            sampler,
            target,
            count,
            rate,
            line,
            frame_samples,
        } = plan;
        let sampler = sampler.as_str();
        let target = target.as_str();
        let turn = lock(&self.turns)
            .entry(sampler.to_owned())
            .or_default()
            .clone();
        let _turn = turn.lock().await;
        let request = SampleRequest {
            channel: sampler.to_owned(),
            target: target.to_owned(),
            count,
            frame_samples,
        };
        let asked = std::time::Instant::now();
        let expected = expected_duration(count, rate, line);
        // A change like any other: run to its end by the station service, its audit line there.
        let change = Change {
            what: ChangeWhat::Sample { request, expected },
            origin,
            admitted: admitted.clone(),
        };
        let report = station.change(change).await?;
        let (samples, end) = report.answer?.sampled().ok_or_else(|| {
            NumericError::Bug(
                "the station service answered another kind of change than an acquisition (a gateway bug)"
                    .to_owned(),
            )
        })?;
        let started =
            UNIX_EPOCH + Duration::from_micros(u64::try_from(end.started_us).unwrap_or(0));
        Ok(Acquisition {
            channel: sampler.to_owned(),
            target: target.to_owned(),
            unit: end.unit,
            rate: end.rate,
            started,
            duration: asked.elapsed(),
            samples,
        })
    }

    /// Keeps `measurement` as its channel's result for `result/*` (when `keep`) and as its
    /// latest for the status page.
    pub fn record(&self, measurement: Measurement, keep: bool) -> Arc<Measurement> {
        let measurement = Arc::new(measurement);
        if keep {
            lock(&self.kept).insert(measurement.channel.clone(), measurement.clone());
        }
        lock(&self.latest).insert(measurement.channel.clone(), measurement.clone());
        measurement
    }

    /// The kept result of `channel` (by its full name).
    pub fn kept(&self, channel: &str) -> Option<Arc<Measurement>> {
        lock(&self.kept).get(channel).cloned()
    }

    /// The latest result of every channel, by name.
    pub fn latest(&self) -> Vec<Arc<Measurement>> {
        lock(&self.latest).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outside_1_to_100000_are_refused_naming_the_limit() {
        let t = Duration::from_secs(60);
        for bad in [0, -1, 100_001, i64::MAX] {
            let error = check_count(bad, 50_000.0, Line::Network, t).unwrap_err();
            assert!(matches!(error, NumericError::Invalid(_)), "{error:?}");
            assert!(error.to_string().contains("1 to 100000"), "{error}");
        }
        assert_eq!(
            check_count(100_000, 50_000.0, Line::Network, t).unwrap(),
            100_000
        );
    }

    /// The limit is `station.max_operation_ms`, not one request's timeout: 50 000 samples at
    /// 10 kHz (5 s) fit the default five minutes; 100 000 at 100 Hz (1 000 s) do not.
    #[test]
    fn a_count_is_limited_by_the_longest_operation_not_by_one_request() {
        let five_minutes = Duration::from_millis(crate::config::DEFAULT_MAX_OPERATION_MS);
        assert_eq!(
            check_count(50_000, 10_000.0, Line::Network, five_minutes).unwrap(),
            50_000
        );
        let error = check_count(100_000, 100.0, Line::Network, five_minutes).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("station.max_operation_ms = 300000 ms")
                && message.contains("at most 30000 samples fit"),
            "{message}"
        );
    }

    /// Every data frame, the first too, takes at most half a request timeout to gather (and to
    /// cross a serial line), whatever the rate: the link times a SAMPLE frame by frame.
    #[test]
    fn frames_are_sized_to_come_within_half_a_request_timeout() {
        let timeout = Duration::from_secs(2);
        for rate in [1.0, 10.0, 100.0, 1_000.0, 10_000.0, 50_000.0, 1_000_000.0] {
            for line in [
                Line::Network,
                Line::Serial { baud: 9_600 },
                Line::Serial { baud: 115_200 },
            ] {
                let asked = line.frame_samples(rate, timeout);
                let samples = match asked {
                    0 => MAX_FRAME_SAMPLES as u32,
                    n => u32::from(n),
                };
                let takes = expected_duration(samples, rate, line);
                assert!(
                    samples == 1 || takes <= timeout / 2,
                    "{rate} Hz on {line:?}: {samples} samples take {takes:?}"
                );
                if let Line::Serial { .. } = line {
                    assert!((1..=SERIAL_FRAME_SAMPLES).contains(&asked), "{asked}");
                }
            }
        }
        // Fast enough: as many as fit (network), the serial frame (115 200 baud).
        assert_eq!(Line::Network.frame_samples(50_000.0, timeout), 0);
        assert_eq!(Line::Network.frame_samples(1_000.0, timeout), 1_000);
        assert_eq!(
            Line::Serial { baud: 115_200 }.frame_samples(10_000.0, timeout),
            SERIAL_FRAME_SAMPLES
        );
    }

    #[test]
    fn a_count_too_long_for_the_timeout_is_refused_with_the_largest_that_fits() {
        let t = Duration::from_secs(2);
        let error = check_count(30_000, 10_000.0, Line::Network, t).unwrap_err();
        assert!(
            error.to_string().contains("at most 20000 samples fit"),
            "{}",
            error
        );
        assert!(check_count(20_000, 10_000.0, Line::Network, t).is_ok());
        // On a serial line the wire is slower than a 10 kHz converter: 1 000 samples take
        // about 0.7 s at 115 200 baud, so 2 s hold about 2 800.
        let serial = Line::Serial { baud: 115_200 };
        let error = check_count(10_000, 10_000.0, serial, t).unwrap_err();
        let fits: u32 = error
            .to_string()
            .rsplit("at most ")
            .next()
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!((2_700..2_900).contains(&fits), "{fits}");
        assert!(check_count(i64::from(fits), 10_000.0, serial, t).is_ok());
        assert!(check_count(i64::from(fits) + 1, 10_000.0, serial, t).is_err());
    }
}
