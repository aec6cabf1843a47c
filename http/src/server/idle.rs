//! Whether an HTTP connection is in use: requests in progress, idle since when, and when it
//! should close (idle too long, evicted to make room, or done after its one answer).
//!
//! A request is in progress from the moment hyper hands it to the service until its answer's
//! body is dropped (sent, or the stream reset): an event stream is in use for as long as it
//! runs. Between requests, and before the first, a connection is idle. HTTP/1 or HTTP/2, one
//! that never had a request is closed once idle for `http.header_read_timeout_ms`, one that
//! had for `http.keep_alive_timeout_ms`, and on a kept HTTP/1 connection a request head that
//! began and did not come whole is cut at the header timeout too
//! ([`ConnectionUse::close_wanted`], [`IdleLimits`]). At the connection limit an idle one is
//! closed to make room for a newcomer: of the address holding the most connections, the one
//! idle the longest ([`to_evict`], used by `connections`).

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

/// How long a connection may be idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleLimits {
    /// `http.header_read_timeout_ms`: for a connection that never had a request, and for a
    /// request head begun on a kept one.
    pub head: Duration,
    /// `http.keep_alive_timeout_ms`: for a connection that has had a request.
    pub keep_alive: Duration,
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

    /// Resolves when the connection should close: evicted, done, or idle too long
    /// ([`CloseWanted::IdleTooLong`]): for `limits.head` if it never had a request, else for
    /// `limits.keep_alive`, exactly so long after its last request ended; or, on a kept HTTP/1
    /// connection, with a request head begun (`head_begun`: bytes came after the last answer)
    /// and not come whole at two looks in a row, a `limits.head` apart, so between one and two
    /// header timeouts after its first byte. A connection in use is looked at again the
    /// shorter limit later (or when it ends, if it must close then).
    ///
    /// Nothing of this is done on a request's way: the looks are timers of the connection's
    /// own, a header timeout apart, and `head_begun` is a flag the connection's I/O keeps.
    pub async fn close_wanted(
        &self,
        limits: IdleLimits,
        head_begun: impl Fn() -> bool,
    ) -> CloseWanted {
        // The idle time at which a begun head was last seen, if it was at the last look.
        let mut head_seen: Option<Duration> = None;
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
                    let kept = self.used();
                    let limit = if kept { limits.keep_alive } else { limits.head };
                    let deadline = self.epoch + since + limit;
                    if deadline <= now {
                        return CloseWanted::IdleTooLong;
                    }
                    if kept && !self.http2() && limits.head < limits.keep_alive {
                        // The same idle time: no request between the two looks.
                        if !head_begun() {
                            head_seen = None;
                        } else if head_seen == Some(since) {
                            return CloseWanted::IdleTooLong;
                        } else {
                            head_seen = Some(since);
                        }
                    }
                    // Looked at again no later than the shorter limit from now: a request may
                    // begin and end meanwhile, and the other limit count from its end.
                    deadline.min(now + limits.head.min(limits.keep_alive))
                }
                // Looked at again no later than the shorter limit after its end could be.
                None => now + limits.head.min(limits.keep_alive),
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

    /// A header timeout of 10 s and a keep-alive timeout of 60 s.
    const LIMITS: IdleLimits = IdleLimits {
        head: Duration::from_secs(10),
        keep_alive: Duration::from_secs(60),
    };

    /// Watches `usage` with [`LIMITS`] and `head_begun`: why it should close, and when.
    fn watch(
        usage: &Arc<ConnectionUse>,
        head_begun: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<(CloseWanted, Instant)> {
        let usage = usage.clone();
        tokio::spawn(async move {
            let why = usage
                .close_wanted(LIMITS, || head_begun.load(Ordering::SeqCst))
                .await;
            (why, Instant::now())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_closes_the_keep_alive_timeout_after_its_last_request_ended() {
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let request = usage.begin();
        assert_eq!(usage.idle_since(), None);
        let watcher = watch(&usage, Arc::new(AtomicBool::new(false)));
        // In use for 25 s: never idle too long meanwhile.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(!watcher.is_finished());
        drop(request);
        // Kept past the header timeout, many times over.
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(4 + 25 + 60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_timeout_shorter_than_the_header_timeout_is_kept_to() {
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        let request = usage.begin();
        let limits = IdleLimits {
            head: Duration::from_secs(60),
            keep_alive: Duration::from_secs(10),
        };
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(
                async move { (usage.close_wanted(limits, || false).await, Instant::now()) },
            )
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(request);
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(15));

        // Watched from before its first request, which comes and goes while the watcher
        // sleeps towards the header timeout: the keep-alive timeout from its end all the same.
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(
                async move { (usage.close_wanted(limits, || false).await, Instant::now()) },
            )
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let request = usage.begin();
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(request);
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_had_a_request_closes_at_the_header_timeout() {
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        let (why, at) = watch(&usage, Arc::new(AtomicBool::new(false)))
            .await
            .unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(10));
        // Bytes of a head that never comes whole change nothing: the header timeout still.
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        let (why, at) = watch(&usage, Arc::new(AtomicBool::new(true)))
            .await
            .unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_on_a_kept_connection_is_cut_between_one_and_two_header_timeouts() {
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        drop(usage.begin());
        let head_begun = Arc::new(AtomicBool::new(false));
        let watcher = watch(&usage, head_begun.clone());
        // Idle 25 s, then the first bytes of a head that never comes whole.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(!watcher.is_finished());
        head_begun.store(true, Ordering::SeqCst);
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        // Looked at every 10 s: seen begun at 30 s, still at 40 s.
        assert_eq!(at - epoch, Duration::from_secs(40));
        let begun_for = at - epoch - Duration::from_secs(25);
        assert!(begun_for >= LIMITS.head && begun_for < 2 * LIMITS.head);

        // A head that comes whole in time (a request begins) is not cut, nor is an HTTP/2
        // connection's traffic between requests.
        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        drop(usage.begin());
        let head_begun = Arc::new(AtomicBool::new(false));
        let watcher = watch(&usage, head_begun.clone());
        tokio::time::sleep(Duration::from_secs(25)).await;
        head_begun.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(9)).await;
        drop(usage.begin());
        head_begun.store(false, Ordering::SeqCst);
        let (why, at) = watcher.await.unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(34 + 60));

        let epoch = Instant::now();
        let usage = ConnectionUse::new(epoch);
        usage.saw_http2();
        drop(usage.begin());
        let (why, at) = watch(&usage, Arc::new(AtomicBool::new(true)))
            .await
            .unwrap();
        assert_eq!(why, CloseWanted::IdleTooLong);
        assert_eq!(at - epoch, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_and_a_last_answer_wake_the_connection_at_once() {
        let usage = ConnectionUse::new(Instant::now());
        let limits = IdleLimits {
            head: Duration::from_secs(60),
            keep_alive: Duration::from_secs(60),
        };
        let started = Instant::now();
        let watcher = {
            let usage = usage.clone();
            tokio::spawn(async move { usage.close_wanted(limits, || false).await })
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
            tokio::spawn(async move { usage.close_wanted(limits, || false).await })
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
