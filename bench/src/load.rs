//! A closed-loop load driver: N workers, each sending one request at a time, bounded in time
//! and in count, with latencies recorded in an HDR histogram; as fast as the server answers,
//! or paced to an offered rate ([`drive_paced`]).

use std::future::Future;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// One client that sends one request at a time.
pub trait Worker: Send + 'static {
    fn call(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// How long and how much to run.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Unrecorded warm-up before measuring.
    pub warmup: Duration,
    pub duration: Duration,
    /// Most requests one worker sends while measuring.
    pub max_per_worker: u64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub requests: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    pub histogram: Histogram<u64>,
}

impl Measured {
    pub fn empty() -> Measured {
        Measured {
            requests: 0,
            errors: 0,
            first_error: None,
            elapsed: Duration::ZERO,
            histogram: new_histogram(),
        }
    }

    /// Requests per second.
    pub fn throughput(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// A quantile of the latency, in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            return f64::NAN;
        }
        self.histogram.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn p50_us(&self) -> f64 {
        self.quantile_us(0.50)
    }

    pub fn p99_us(&self) -> f64 {
        self.quantile_us(0.99)
    }
}

/// Latencies in nanoseconds, 1 ns to 60 s, three significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs every worker concurrently (one tokio task each) for the warm-up, then measures.
/// A worker whose call fails stops; its error is counted and the first one kept.
pub async fn drive<W: Worker>(workers: Vec<W>, bounds: Bounds) -> Measured {
    drive_with(workers, bounds, None).await
}

/// [`drive`], the workers together offering `rate` requests a second: each sends its k-th
/// request at its k-th turn (its turns `workers / rate` apart, the workers' turns spread
/// evenly), or at once when the answer to its last came after that. Below the server's
/// saturation every server is offered the same load, so their CPU a request compares like for
/// like; at saturation the slower server's threads are also preempted by the load generator's
/// more often, which a saturated run charges to it.
pub async fn drive_paced<W: Worker>(workers: Vec<W>, bounds: Bounds, rate: f64) -> Measured {
    let turn = Duration::from_secs_f64(workers.len() as f64 / rate.max(1.0));
    drive_with(workers, bounds, Some(turn)).await
}

async fn drive_with<W: Worker>(
    workers: Vec<W>,
    bounds: Bounds,
    turn: Option<Duration>,
) -> Measured {
    let start = Instant::now();
    let count_of_workers = workers.len().max(1) as u32;
    let measure_from = start + bounds.warmup;
    let end = measure_from + bounds.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (at, mut worker) in workers.into_iter().enumerate() {
        // This worker's first turn, and the time between its turns, when paced.
        let turns = turn.map(|turn| (start + turn * at as u32 / count_of_workers, turn));
        tasks.spawn(async move {
            let mut histogram = new_histogram();
            let mut count = 0u64;
            let mut error = None;
            let mut next_turn = turns.map(|(first, _)| first);
            loop {
                if let (Some(due), Some((_, turn))) = (next_turn, turns) {
                    tokio::time::sleep_until(due.into()).await;
                    next_turn = Some(due + turn);
                }
                let sent = Instant::now();
                if sent >= end || count >= bounds.max_per_worker {
                    break;
                }
                let result = worker.call().await;
                let done = Instant::now();
                if let Err(why) = result {
                    error = Some(format!("{why:#}"));
                    break;
                }
                if sent >= measure_from && done <= end {
                    count += 1;
                    let _ = histogram.record((done - sent).as_nanos().max(1) as u64);
                }
            }
            (histogram, count, error)
        });
    }
    let mut measured = Measured::empty();
    while let Some(joined) = tasks.join_next().await {
        let Ok((histogram, count, error)) = joined else {
            measured.errors += 1;
            continue;
        };
        let _ = measured.histogram.add(&histogram);
        measured.requests += count;
        if let Some(error) = error {
            measured.errors += 1;
            measured.first_error.get_or_insert(error);
        }
    }
    let finished = Instant::now().min(end);
    measured.elapsed = finished.saturating_duration_since(measure_from);
    measured
}
