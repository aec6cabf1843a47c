//! Whether an HTTP connection is in use: requests in progress, idle since when, and when it
//! should close (idle too long, evicted to make room, or done after its one answer).
//!
//! A request is in progress from the moment hyper hands it to the service until its answer's
//! body is dropped (sent, or the stream reset): an event stream is in use for as long as it
//! runs. Between requests, and before the first, a connection is idle: HTTP/1 or HTTP/2, a
//! connection with no request in progress for `http.header_read_timeout_ms` is closed
//! ([`ConnectionUse::close_wanted`]), and at the connection limit an idle one is closed to
//! make room for a newcomer: of the address holding the most connections, the one idle the
//! longest ([`to_evict`], used by `connections`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// One connection's use, shared by its task, its requests and the connection limits.
#[derive(Debug)]
pub struct ConnectionUse {
    /// Times are kept as nanoseconds since this instant, so they fit an atomic.
    epoch: Instant,
    in_progress: AtomicUsize,
    /// A request has begun on it (a connection closed idle before any was: a header timeout).
    used: AtomicBool,
    /// A request on it was HTTP/2.
    http2: AtomicBool,
    /// When the last request ended (or the connection was accepted); read only while
    /// `in_progress` is 0.
    idle_since_nanos: AtomicU64,
    /// Closed by the limits to make room: its slot is already given back.
    evicted: AtomicBool,
    /// Close once no request is in progress (a reserved connection after its answer, an
    /// HTTP/2 connection whose body timed out).
    close_when_idle: AtomicBool,
    /// Wakes the connection's task on eviction and on `close_when_idle` coming due.
    wake: Notify,
}

/// Why a connection should close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseWanted {
    /// Idle for the whole limit.
    IdleTooLong,
    /// Evicted at the connection limit: its slot went to a newcomer.
    Evicted,
    /// Its answer given, nothing more is served on it.
    Done,
}

impl ConnectionUse {
    /// A connection accepted now, idle since `epoch` (which the limits share, so that idle
    /// times compare across connections).
    pub fn new(epoch: Instant) -> Arc<ConnectionUse> {
        Arc::new(ConnectionUse {
            epoch,
            in_progress: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            idle_since_nanos: AtomicU64::new(nanos_since(epoch, Instant::now())),
            evicted: AtomicBool::new(false),
            close_when_idle: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// A request begins; it ends when the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        self.used.store(true, Ordering::Relaxed);
        InProgress { of: self.clone() }
    }

    fn end(&self) {
        // The time first: it is read only once the count is seen at 0.
        self.idle_since_nanos
            .store(nanos_since(self.epoch, Instant::now()), Ordering::SeqCst);
        if self.in_progress.fetch_sub(1, Ordering::SeqCst) == 1
            && self.close_when_idle.load(Ordering::SeqCst)
        {
            self.wake.notify_one();
        }
    }

    /// Since when the connection has had no request in progress; `None` while one is.
    pub fn idle_since(&self) -> Option<Duration> {
        (self.in_progress.load(Ordering::SeqCst) == 0)
            .then(|| Duration::from_nanos(self.idle_since_nanos.load(Ordering::SeqCst)))
    }

    /// A request on the connection came over HTTP/2.
    pub fn saw_http2(&self) {
        self.http2.store(true, Ordering::Relaxed);
    }

    /// Whether a request on the connection came over HTTP/2.
    pub fn http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// Whether any request has begun on the connection.
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    pub fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::SeqCst)
    }

    /// Nothing more is served once the requests in progress are answered.
    pub fn close_when_idle(&self) {
        self.close_when_idle.store(true, Ordering::SeqCst);
        if self.in_progress() == 0 {
            self.wake.notify_one();
        }
    }

    /// Called by the limits, under their lock: whether this call evicted it (not before).
    pub(super) fn evict(&self) -> bool {
        let first = !self.evicted.swap(true, Ordering::SeqCst);
        if first {
            self.wake.notify_one();
        }
        first
    }

    pub fn evicted(&self) -> bool {
        self.evicted.load(Ordering::SeqCst)
    }

    /// Resolves when the connection should close: evicted, done, or idle for `limit`. A
    /// connection in use is looked at again a `limit` later (or when it ends, if it must
    /// close then), so an idle one closes exactly `limit` after its last request ended.
    pub async fn close_wanted(&self, limit: Duration) -> CloseWanted {
        loop {
            if self.evicted() {
                return CloseWanted::Evicted;
            }
            let now = Instant::now();
            let deadline = match self.idle_since() {
                Some(_) if self.close_when_idle.load(Ordering::SeqCst) => {
                    return CloseWanted::Done;
                }
                Some(since) => {
                    let deadline = self.epoch + since + limit;
                    if deadline <= now {
                        return CloseWanted::IdleTooLong;
                    }
                    deadline
                }
                None => now + limit,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.wake.notified() => {}
            }
        }
    }
}

fn nanos_since(epoch: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// A request in progress on its connection: ends when dropped (moved into the answer's body,
/// it lasts until the body is sent or abandoned).
#[derive(Debug)]
pub struct InProgress {
    of: Arc<ConnectionUse>,
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.of.end();
    }
}

/// An answer's body that keeps its request in progress until it is dropped.
pub struct CountedBody<B> {
    inner: B,
    _in_progress: InProgress,
}

impl<B> CountedBody<B> {
    pub fn new(inner: B, in_progress: InProgress) -> CountedBody<B> {
        CountedBody {
            inner,
            _in_progress: in_progress,
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One connection as [`to_evict`] weighs it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<K> {
    pub key: K,
    /// How many connections its client's address holds.
    pub of_its_address: usize,
    /// Since when it has had no request in progress; `None` while one is.
    pub idle_since: Option<Duration>,
}

/// Of `candidates`, the one to close when a newcomer needs its room: an idle one (never one
/// with a request in progress) of the address holding the most connections, and of those
/// the one idle the longest. So a flood from other addresses pays for itself: a client with
/// few connections (the lease holder renewing) is never the one evicted while a heavier
/// address has an idle one. Ties go to the first.
pub fn to_evict<K>(candidates: impl IntoIterator<Item = Candidate<K>>) -> Option<K> {
    candidates
        .into_iter()
        .filter(|candidate| candidate.idle_since.is_some())
        .fold(None, |best: Option<Candidate<K>>, candidate| match best {
            Some(best)
                if (best.of_its_address, std::cmp::Reverse(best.idle_since))
                    >= (
                        candidate.of_its_address,
                        std::cmp::Reverse(candidate.idle_since),
                    ) =>
            {
                Some(best)
            }
            _ => Some(candidate),
        })
        .map(|chosen| chosen.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heaviest_address_pays_its_longest_idle_first_and_a_connection_in_use_never() {
        let ms = Duration::from_millis;
        let candidate = |key, of_its_address, idle_since| Candidate {
            key,
            of_its_address,
            idle_since,
        };
        // One address: the longest idle.
        assert_eq!(
            to_evict([
                candidate(1, 4, Some(ms(30))),
                candidate(2, 4, None),
                candidate(3, 4, Some(ms(10))),
                candidate(4, 4, Some(ms(20))),
            ]),
            Some(3)
        );
        // The holder's one connection, idle for longest, stays: the flood's address pays.
        assert_eq!(
            to_evict([
                candidate(1, 1, Some(ms(1))),
                candidate(2, 16, Some(ms(50))),
                candidate(3, 16, Some(ms(40))),
                candidate(4, 3, Some(ms(5))),
            ]),
            Some(3)
        );
        // The heaviest address busy: the next heaviest's idle one.
        assert_eq!(
            to_evict([
                candidate(1, 9, None),
                candidate(2, 2, Some(ms(50))),
                candidate(3, 1, Some(ms(0))),
            ]),
            Some(2)
        );
        assert_eq!(
            to_evict([candidate(1, 1, None), candidate(2, 1, None)]),
            None::<i32>
        );
        assert_eq!(to_evict(Vec::<Candidate<u8>>::new()), None);
        assert_eq!(
            to_evict([candidate(1, 2, Some(ms(5))), candidate(2, 2, Some(ms(5)))]),
            Some(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_closes_a_limit_after_its_last_request_ended() {
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        let limit = Duration::from_secs(10);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let request = usage.begin();
        assert_eq!(usage.idle_since(), None);
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(async move { (usage.close_wanted(limit).await, Instant::now()) })
        };
        // In use for 25 s: never idle too long meanwhile.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(!watcher.is_finished());
        drop(request);
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(39));
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_and_a_last_answer_wake_the_connection_at_once() {
        let usage = ConnectionUse::new(Instant::now());
        let limit = Duration::from_secs(60);
        let started = Instant::now();
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(async move { usage.close_wanted(limit).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(usage.evict());
        assert!(!usage.evict(), "evicted twice");
        assert_eq!(watcher.await.unwrap(), CloseWanted::Evicted);
        assert_eq!(started.elapsed(), Duration::from_secs(1));

        let usage = ConnectionUse::new(Instant::now());
        let request = usage.begin();
        usage.close_when_idle();
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(async move { usage.close_wanted(limit).await })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !watcher.is_finished(),
            "closed with its request in progress"
        );
        drop(request);
        assert_eq!(watcher.await.unwrap(), CloseWanted::Done);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
